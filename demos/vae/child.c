/* Fork runners: a function or a program in a child process, one wait loop for both (the
 * optional spinner and task bar, the stop flag a signal handler sets) and the child's peak
 * RSS from wait4. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "child.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int child_area_map(child_area *a, size_t head_bytes, size_t data_bytes) {
    size_t off = (head_bytes + 63) & ~(size_t)63;
    memset(a, 0, sizeof(*a));
    a->bytes = off + data_bytes;
    void *p = mmap(NULL, a->bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return -1;
    a->head = p;
    a->data = (char *)p + off;
    return 0;
}

void child_area_unmap(child_area *a) {
    if (a->head) munmap(a->head, a->bytes);
    memset(a, 0, sizeof(*a));
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int stopped(const child_opts *o) { return o->stop && *o->stop; }

/* In the child, right after fork: default signal actions and SIGKILL when the parent dies
 * (whatever kills it). 0, or -1 when that cannot be arranged or the parent is already gone. */
static int child_setup(const child_opts *o, pid_t parent) {
    if (!o->die_with_parent) return 0;
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE, SIGXFSZ};
    for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++) signal(sigs[i], SIG_DFL);
    return prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent ? -1 : 0;
}

static void show_progress(const child_opts *o, double el) {
    int64_t done = o->done ? *o->done : 0, total = o->total ? *o->total : 0;
    if (total > 0) { /* a bar over the tasks */
        char bar[31];
        int fill = (int)(30 * done / total);
        for (int i = 0; i < 30; i++) bar[i] = i < fill ? '#' : '.';
        bar[30] = '\0';
        fprintf(stderr, "\r[%s] %3d%% %s: %.1f s\033[K", bar, (int)(100 * done / total), o->label, el);
    } else {
        static const char spin[] = "|/-\\";
        fprintf(stderr, "\r%c %s: %.1f s\033[K", spin[(int)(el * 5) % 4], o->label, el);
    }
}

/* Reaps pid: polls every 100 ms while the spinner shows, else blocks (a signal handler's
 * EINTR then lets it see *o->stop and kill the child). */
static void wait_child(child_status *st, pid_t pid, const child_opts *o) {
    if (o->pid) *o->pid = pid;
    if (stopped(o)) kill(pid, SIGKILL); /* the signal came between fork and here */
    double t0 = now_s();
    int shown = 0, status = 0;
    struct rusage ru;
    memset(&ru, 0, sizeof(ru));
    for (;;) {
        pid_t r = wait4(pid, &status, o->spinner ? WNOHANG : 0, &ru);
        if (r == pid) break;
        if (r < 0 && errno != EINTR) {
            st->end = CHILD_FAILED;
            snprintf(st->err, sizeof(st->err), "wait4: %s", strerror(errno));
            break;
        }
        if (stopped(o)) { /* the handler killed the child (or the flag came first): reap it */
            kill(pid, SIGKILL);
            continue;
        }
        double el = now_s() - t0;
        if (r == 0 && el >= 1.0) {
            show_progress(o, el);
            shown = 1;
        }
        if (r == 0) {
            struct timespec ts = {0, 100 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    if (o->pid) *o->pid = 0;
    if (shown) fprintf(stderr, "\r\033[K");
    if (st->end == CHILD_FAILED) return;
    if (stopped(o)) {
        st->end = CHILD_STOPPED;
        return;
    }
    st->wstatus = status;
    st->peak_rss = (int64_t)ru.ru_maxrss * 1024; /* Linux: KiB */
    if (WIFSIGNALED(status)) {
        st->end = CHILD_KILLED;
        st->code = WTERMSIG(status);
    } else {
        st->end = CHILD_EXITED;
        st->code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
}

/* Forks after flushing stdio (so the child does not repeat buffered output); the parent's
 * pid, for child_setup, in *parent. -1 with st filled when stopped or fork failed. */
static pid_t fork_child(child_status *st, const child_opts *o, pid_t *parent) {
    memset(st, 0, sizeof(*st));
    fflush(stdout);
    fflush(stderr);
    *parent = getpid();
    if (stopped(o)) {
        st->end = CHILD_STOPPED;
        return -1;
    }
    pid_t pid = fork();
    if (pid < 0) {
        st->end = CHILD_FAILED;
        snprintf(st->err, sizeof(st->err), "fork: %s", strerror(errno));
    }
    return pid;
}

void child_call(child_status *st, int (*fn)(void *arg), void *arg, const child_opts *o) {
    pid_t parent;
    pid_t pid = fork_child(st, o, &parent);
    if (pid < 0) return;
    if (pid == 0) {
        if (child_setup(o, parent) != 0) _exit(1);
        int code = fn(arg);
        fflush(stdout);
        fflush(stderr);
        _exit(code);
    }
    wait_child(st, pid, o);
}

void child_exec(child_status *st, char *const *argv, int out_fd, int err_fd, const child_opts *o) {
    pid_t parent;
    pid_t pid = fork_child(st, o, &parent);
    if (pid < 0) return;
    if (pid == 0) {
        if (child_setup(o, parent) != 0) _exit(127);
        if ((out_fd >= 0 && dup2(out_fd, STDOUT_FILENO) < 0) || (err_fd >= 0 && dup2(err_fd, STDERR_FILENO) < 0))
            _exit(127);
        if (out_fd > STDERR_FILENO) close(out_fd);
        if (err_fd > STDERR_FILENO && err_fd != out_fd) close(err_fd);
        execvp(argv[0], argv);
        fprintf(stderr, "cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    wait_child(st, pid, o);
}
