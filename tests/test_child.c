/* demos/vae/child.c, the fork runner of cw-vae, its --compare peer and the benches: the
 * shared area reaches the parent, exit codes and signals come back as they happened, peak RSS
 * is the child's own, the stop flag of a signal handler kills and reaps the child (or stops
 * the fork), and a program's stdout/stderr land on the given descriptors. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <signal.h>
#include <sys/time.h>
#include <unistd.h>

#include "child.h"
#include "testutil.h"

#define MIB ((int64_t)1 << 20)

typedef struct job {
    int *flag;    /* in the shared area */
    int code;     /* exit with it */
    int64_t touch; /* bytes to touch first */
    int sig;      /* raise it instead of exiting */
} job;

static int job_main(void *arg) {
    job *j = arg;
    *j->flag = 1;
    if (j->touch) {
        char *p = malloc((size_t)j->touch);
        if (!p) return 99;
        memset(p, 1, (size_t)j->touch);
        *j->flag = p[j->touch - 1]; /* so the memset is not optimized away */
        free(p);
    }
    if (j->sig) raise(j->sig);
    return j->code;
}

static int sleep_main(void *arg) {
    for (;;) pause();
    return 0;
}

static volatile sig_atomic_t g_stop;
static volatile pid_t g_pid;

/* As cw-vae's handler: set the flag, kill the running child. */
static void on_alarm(int sig) {
    g_stop = sig;
    pid_t c = g_pid;
    if (c > 0) kill(c, SIGKILL);
}

/* The whole of a small file, NUL-terminated. */
static void slurp(FILE *f, char *buf, size_t len) {
    rewind(f);
    size_t n = fread(buf, 1, len - 1, f);
    buf[n] = '\0';
}

int main(void) {
    child_area a;
    ASSERT_EQ_I(child_area_map(&a, 10, 4 * MIB), 0);
    ASSERT_TRUE(a.head && a.data);
    ASSERT_EQ_I((char *)a.data - (char *)a.head, 64);
    ASSERT_EQ_I(a.bytes, 64 + 4 * MIB);
    CHECK(((char *)a.data)[4 * MIB - 1] == 0);
    child_opts co = {0};
    child_status st;

    /* an exit code, and what the child wrote in the area */
    job j = {a.head, 7, 0, 0};
    child_call(&st, job_main, &j, &co);
    ASSERT_EQ_I(st.end, CHILD_EXITED);
    ASSERT_EQ_I(st.code, 7);
    ASSERT_EQ_I(st.wstatus, 7 << 8);
    ASSERT_EQ_I(*(int *)a.head, 1);

    /* peak RSS: the child's own, 64 MiB touched shows */
    int64_t small;
    j = (job){a.head, 0, 0, 0};
    child_call(&st, job_main, &j, &co);
    ASSERT_EQ_I(st.end, CHILD_EXITED);
    ASSERT_EQ_I(st.code, 0);
    small = st.peak_rss;
    CHECK(small > 0);
    j.touch = 64 * MIB;
    child_call(&st, job_main, &j, &co);
    ASSERT_EQ_I(st.code, 0);
    ASSERT_LE_I(64 * MIB, st.peak_rss);
    ASSERT_LE_I(small + 48 * MIB, st.peak_rss);

    /* a signal; with die_with_parent the child has SIGINT's default action even where the
     * parent ignores it */
    j = (job){a.head, 0, 0, SIGUSR1};
    child_call(&st, job_main, &j, &co);
    ASSERT_EQ_I(st.end, CHILD_KILLED);
    ASSERT_EQ_I(st.code, SIGUSR1);
    signal(SIGINT, SIG_IGN);
    j = (job){a.head, 5, 0, SIGINT};
    child_call(&st, job_main, &j, &co);
    ASSERT_EQ_I(st.end, CHILD_EXITED);
    ASSERT_EQ_I(st.code, 5);
    co.die_with_parent = 1;
    child_call(&st, job_main, &j, &co);
    ASSERT_EQ_I(st.end, CHILD_KILLED);
    ASSERT_EQ_I(st.code, SIGINT);
    signal(SIGINT, SIG_DFL);

    /* the stop flag: set before, no child runs; set by a handler while it runs (blocking wait
     * and spinner polling), the child is killed and reaped and the pid cleared */
    co = (child_opts){0};
    co.pid = &g_pid;
    co.stop = &g_stop;
    *(int *)a.head = 0;
    g_stop = SIGTERM;
    j = (job){a.head, 0, 0, 0};
    child_call(&st, job_main, &j, &co);
    ASSERT_EQ_I(st.end, CHILD_STOPPED);
    usleep(100 * 1000);
    ASSERT_EQ_I(*(int *)a.head, 0);
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_alarm;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGALRM, &sa, NULL); /* no SA_RESTART: wait4 returns EINTR */
    for (int spinner = 0; spinner <= 1; spinner++) {
        g_stop = 0;
        co.spinner = spinner;
        co.label = "test_child";
        struct itimerval it = {{0, 0}, {0, 200 * 1000}};
        setitimer(ITIMER_REAL, &it, NULL);
        child_call(&st, sleep_main, NULL, &co);
        ASSERT_EQ_I(st.end, CHILD_STOPPED);
        ASSERT_EQ_I(g_pid, 0);
        ASSERT_EQ_I(g_stop, SIGALRM);
    }
    g_stop = 0;
    child_area_unmap(&a);
    ASSERT_TRUE(a.head == NULL);
    child_area_unmap(&a);

    /* a program: its stdout and stderr on the descriptors, its exit code; one that cannot be
     * run exits with 127 and says why */
    FILE *fo = tmpfile(), *fe = tmpfile();
    ASSERT_TRUE(fo && fe);
    char buf[256];
    char *sh[] = {"/bin/sh", "-c", "echo out; echo err >&2; exit 3", NULL};
    co = (child_opts){0};
    child_exec(&st, sh, fileno(fo), fileno(fe), &co);
    ASSERT_EQ_I(st.end, CHILD_EXITED);
    ASSERT_EQ_I(st.code, 3);
    CHECK(st.peak_rss > 0);
    slurp(fo, buf, sizeof buf);
    CHECK(!strcmp(buf, "out\n"));
    slurp(fe, buf, sizeof buf);
    CHECK(!strcmp(buf, "err\n"));
    ASSERT_TRUE(ftruncate(fileno(fe), 0) == 0);
    rewind(fe);
    char *bad[] = {"/nonexistent/cw-child-test", NULL};
    child_exec(&st, bad, -1, fileno(fe), &co);
    ASSERT_EQ_I(st.end, CHILD_EXITED);
    ASSERT_EQ_I(st.code, 127);
    slurp(fe, buf, sizeof buf);
    CHECK(strstr(buf, "cannot run /nonexistent/cw-child-test: ") == buf);
    fclose(fo);
    fclose(fe);
    TEST_DONE();
}
