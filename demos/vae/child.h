/* Runs work in a forked child process and waits for it: a function, with an optional
 * MAP_SHARED area for what it reports back, or a program (fork + exec). The wait can show
 * elapsed time (and a task bar) on stderr and be stopped from a signal handler; it reports
 * how the child ended and its peak RSS. Shared by cw-vae, its --compare peer and the benches. */
#ifndef CWVAE_CHILD_H
#define CWVAE_CHILD_H
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* A zero-filled MAP_SHARED anonymous mapping, visible to the parent and the children it forks
 * afterwards: head_bytes for a result struct, then data_bytes at a 64-byte aligned offset. */
typedef struct child_area {
    void *head;   /* NULL when not mapped */
    void *data;
    size_t bytes; /* the whole mapping (set even when mapping it failed, for messages) */
} child_area;

/* Maps *a; returns 0, or -1 with errno set and a->head NULL. */
int child_area_map(child_area *a, size_t head_bytes, size_t data_bytes);
/* Unmaps *a and zeroes it; accepts an area that is not mapped. */
void child_area_unmap(child_area *a);

/* How to run and wait; zero-initialize, then set what is needed. */
typedef struct child_opts {
    int spinner;                       /* on stderr after 1 s: a spinner and the elapsed time */
    const char *label;                 /* the spinner's text */
    const volatile int64_t *done;      /* (optional) tasks done and in all, published by the */
    const volatile int64_t *total;     /* child in shared memory: a bar once *total > 0 */
    volatile pid_t *pid;               /* (optional) holds the child's pid while it runs, 0 after */
    volatile sig_atomic_t *stop;       /* (optional) once non-zero: no fork, or the child killed */
    int die_with_parent;               /* the child gets SIGKILL when the parent dies, and default
                                          SIGINT/SIGTERM/SIGHUP/SIGQUIT/SIGPIPE/SIGXFSZ actions */
} child_opts;

typedef enum child_end {
    CHILD_EXITED,  /* code: its exit status */
    CHILD_KILLED,  /* code: the signal that ended it */
    CHILD_STOPPED, /* *opts.stop was set: not started, or killed and reaped */
    CHILD_FAILED   /* fork or wait4 failed; err says which and why */
} child_end;

typedef struct child_status {
    child_end end;
    int code;
    int wstatus;      /* the raw status from wait4 (CHILD_EXITED, CHILD_KILLED), else 0 */
    int64_t peak_rss; /* ru_maxrss from wait4 in bytes (CHILD_EXITED, CHILD_KILLED), else 0 */
    char err[96];
} child_status;

/* Flushes stdout and stderr, forks, and exits the child with fn(arg) (stdio flushed); waits
 * for it as o says. With o->die_with_parent, a child that cannot arrange it exits with 1. */
void child_call(child_status *st, int (*fn)(void *arg), void *arg, const child_opts *o);

/* Flushes stdout and stderr, forks, and runs argv[0] (looked up in PATH) with argv, its
 * stdout and stderr on out_fd and err_fd (< 0: the parent's; closed in the child once moved
 * there); waits for it as o says. A child that cannot exec exits with 127 after "cannot run
 * ARGV0: REASON" on its stderr; one that cannot arrange o->die_with_parent or its stdout and
 * stderr exits with 127 silently. */
void child_exec(child_status *st, char *const *argv, int out_fd, int err_fd, const child_opts *o);
#endif
