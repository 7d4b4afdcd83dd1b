/* cw-vae --ranks N: one decode split across N local processes. The process the user started
 * stays the parent it always is (checks, staged outputs, signals, reports) and runs
 * `mpirun -n N cw-vae --rank-area AREA ARGS...` as its child; the ranks read the input from
 * AREA (a memfd this process shares through /proc/PID/fd), each writes its result there, and
 * rank 0, which gathers the output, writes the output there. Only the ranks use MPI. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#ifdef CW_VAE_MPI
#include "comm_mpi.h"
#endif

/* What one rank reports besides its run_result. */
typedef struct rank_extra {
    long long sent, recvd, bytes_sent, bytes_recvd; /* messages and payload bytes */
    int started;                                    /* the rank reached its run */
} rank_extra;

/* The area's head; the input (f32) and the output (f32) follow at in_off and out_off. */
typedef struct ranks_area {
    run_result rank[MAX_RANKS]; /* first: the area's head is rank 0's result (a child_area's head) */
    rank_extra extra[MAX_RANKS];
    int n_ranks, threads;
    int64_t n, h, w, in_numel, out_numel;
    size_t in_off, out_off, bytes;
} ranks_area;

static size_t align64(size_t x) { return (x + 63) & ~(size_t)63; }

/* ---- the parent: mpirun as the child ------------------------------------------------------------ */

/* mpirun's command line: $CW_VAE_MPIRUN (words split at spaces) or Open MPI's mpirun with the
 * flags this use needs (more ranks than cores, no binding: each rank runs threads; stdin
 * stays with cw-vae, not forwarded to rank 0). */
static int mpirun_argv(char **av, int max, char *buf, size_t buflen, int n, const char *exe, const char *area,
                       const opts *o, char *nbuf) {
    int k = 0;
    const char *env = getenv("CW_VAE_MPIRUN");
    if (env && *env) {
        snprintf(buf, buflen, "%s", env);
        for (char *t = strtok(buf, " \t"); t && k < max - 8; t = strtok(NULL, " \t")) av[k++] = t;
    } else {
        static char mpirun[] = "mpirun", over[] = "--oversubscribe", bind[] = "--bind-to", none[] = "none",
                    in[] = "--stdin";
        av[k++] = mpirun, av[k++] = over, av[k++] = bind, av[k++] = none, av[k++] = in, av[k++] = none;
    }
    static char dash_n[] = "-n", ra[] = "--rank-area";
    snprintf(nbuf, 16, "%d", n);
    av[k++] = dash_n;
    av[k++] = nbuf;
    av[k++] = (char *)exe;
    av[k++] = ra;
    av[k++] = (char *)area;
    for (int i = 1; i < o->argc && k < max - 1; i++) av[k++] = o->argv[i];
    av[k] = NULL;
    return k;
}

/* The memfd's text (mpirun's stderr), at most the last cap bytes, NUL-terminated; NULL if empty. */
static char *read_fd_tail(int fd, size_t cap) {
    struct stat sb;
    if (fstat(fd, &sb) != 0 || sb.st_size <= 0) return NULL;
    size_t n = (size_t)sb.st_size, from = n > cap ? n - cap : 0;
    char *t = malloc(n - from + 1);
    if (!t) return NULL;
    ssize_t got = pread(fd, t, n - from, (off_t)from);
    t[got > 0 ? got : 0] = '\0';
    return t;
}

static void print_rank_row(const char *label, const run_result *r, const rank_extra *x, double diff, int has_diff) {
    char a[32], b[32], c[32], d[32], e[32] = "-", s[64] = "-", rv[64] = "-", t[32];
    fmt_bytes(a, sizeof(a), r->stats.temp_peak);
    fmt_bytes(b, sizeof(b), r->stats.activations_peak);
    fmt_bytes(c, sizeof(c), r->stats.total_peak);
    fmt_bytes(d, sizeof(d), r->peak_rss);
    if (r->work_mem >= 0) fmt_bytes(e, sizeof(e), r->work_mem);
    if (x) {
        fmt_bytes(t, sizeof(t), x->bytes_sent);
        snprintf(s, sizeof(s), "%s/%lld", t, x->sent);
        fmt_bytes(t, sizeof(t), x->bytes_recvd);
        snprintf(rv, sizeof(rv), "%s/%lld", t, x->recvd);
    }
    char df[32] = "";
    if (has_diff) snprintf(df, sizeof(df), "%10.3g", diff);
    printf("%-16s %10.1f %11s %11s %11s %11s %11s %16s %16s %s\n", label, r->ms, a, b, c, d, e, s, rv, df);
}

static void print_ranks_table(const opts *o, const ranks_area *ar, const run_result *single, double diff) {
    int n = ar->n_ranks;
    printf("\n%d ranks (mpirun, %d thread%s each), %s backend; time = the decode on each rank (best of %d);\n"
           "peak temp/act/total from each rank's plan stats; peak RSS = the rank's ru_maxrss; work mem = its\n"
           "peak resident bytes during the decode minus those just before it; sent/received = payload bytes\n"
           "and messages (max over ranks: each column's largest)\n",
           n, ar->threads, ar->threads > 1 ? "s" : "", ar->rank[0].backend, o->repeat);
    printf("%-16s %10s %11s %11s %11s %11s %11s %16s %16s%s\n", "process", "time ms", "peak temp", "peak act",
           "peak total", "peak RSS", "work mem", "sent/msgs", "received/msgs", single ? "  max|diff|" : "");
    if (single) print_rank_row("1 process", single, NULL, 0, 0);
    run_result mx;
    memset(&mx, 0, sizeof(mx));
    rank_extra xs = {0, 0, 0, 0, 1};
    for (int r = 0; r < n; r++) {
        char label[32];
        snprintf(label, sizeof(label), "rank %d/%d", r, n);
        const run_result *rr = &ar->rank[r];
        print_rank_row(label, rr, &ar->extra[r], diff, single && r == 0);
        if (rr->ms > mx.ms) mx.ms = rr->ms;
        if (rr->stats.temp_peak > mx.stats.temp_peak) mx.stats.temp_peak = rr->stats.temp_peak;
        if (rr->stats.activations_peak > mx.stats.activations_peak) mx.stats.activations_peak = rr->stats.activations_peak;
        if (rr->stats.total_peak > mx.stats.total_peak) mx.stats.total_peak = rr->stats.total_peak;
        if (rr->peak_rss > mx.peak_rss) mx.peak_rss = rr->peak_rss;
        if (rr->work_mem > mx.work_mem) mx.work_mem = rr->work_mem;
        if (ar->extra[r].bytes_sent > xs.bytes_sent) xs.bytes_sent = ar->extra[r].bytes_sent;
        if (ar->extra[r].bytes_recvd > xs.bytes_recvd) xs.bytes_recvd = ar->extra[r].bytes_recvd;
        if (ar->extra[r].sent > xs.sent) xs.sent = ar->extra[r].sent;
        if (ar->extra[r].recvd > xs.recvd) xs.recvd = ar->extra[r].recvd;
    }
    print_rank_row("max over ranks", &mx, &xs, 0, 0);
    if (single) {
        printf("\n%d ranks / 1 process: time %.2fx, work mem (max rank) %.2fx, peak RSS (max rank) %.2fx; "
               "max|diff| %.3g%s\n",
               n, mx.ms / single->ms, single->work_mem > 0 ? (double)mx.work_mem / (double)single->work_mem : 0.0,
               (double)mx.peak_rss / (double)single->peak_rss, diff,
               diff == 0                   ? " (bit-identical)"
               : o->patches <= 0           ? " (--patches auto: the patches differ)"
                                           : "");
    }
}

/* The first rank that failed, or -1. */
static int failed_rank(const ranks_area *ar) {
    for (int r = 0; r < ar->n_ranks; r++)
        if (ar->rank[r].exit_code > 0) return r;
    return -1;
}

int run_ranks(const opts *o, const job *jb, child_area *final) {
    memset(final, 0, sizeof(*final));
    int n = o->ranks;
    child_area single = {0};
    if (o->compare_ranks) { /* the baseline: the same options in one process, as a plain run */
        run_cfg r;
        cfg_from_opts(&r, o);
        job j1 = *jb;
        j1.comm = NULL;
        int code = run_in_child(o, &r, &j1, "[1/2] one process", &single);
        if (code < 0) return -1;
        if (code != 0) {
            int ret = single.head ? report_failure(single.head) : code;
            child_area_unmap(&single);
            return ret;
        }
    }
    /* the input's elements: decode [n, latent, h, w], encode [n, in, h, w] */
    int64_t in_numel = jb->n * jb->h * jb->w * (o->part == VAE_DECODER ? o->cfg.latent_channels : o->cfg.in_channels);
    size_t in_off = align64(sizeof(ranks_area)), in_bytes = (size_t)in_numel * sizeof(float);
    if (o->patches > 0 && o->patches < n) /* the patches stay as given: some ranks run no patch of a conv */
        say("note: --patches %d < --ranks %d: some ranks get no patch of a conv and wait for the others' rows",
            o->patches, n);
    size_t out_off = align64(in_off + in_bytes), bytes = out_off + (size_t)jb->out_numel * sizeof(float);
    int fd = memfd_create("cw-vae-ranks", 0);
    if (fd < 0 || ftruncate(fd, (off_t)bytes) != 0) {
        say("--ranks: a shared area of %zu bytes: %s", bytes, strerror(errno));
        if (fd >= 0) close(fd);
        child_area_unmap(&single);
        return EXIT_RUN;
    }
    ranks_area *ar = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (ar == MAP_FAILED) {
        say("--ranks: mmap of %zu bytes: %s", bytes, strerror(errno));
        close(fd);
        child_area_unmap(&single);
        return EXIT_RUN;
    }
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    ar->n_ranks = n;
    ar->threads = o->threads > 0 ? o->threads : cpus / n > 1 ? (int)(cpus / n) : 1;
    ar->n = jb->n, ar->h = jb->h, ar->w = jb->w, ar->in_numel = in_numel, ar->out_numel = jb->out_numel;
    ar->in_off = in_off, ar->out_off = out_off, ar->bytes = bytes;
    for (int r = 0; r < n; r++) ar->rank[r].exit_code = -1;
    memcpy((char *)ar + in_off, jb->in, in_bytes);

    char exe[PATH_MAX], area[64], buf[1024], nbuf[16];
    ssize_t el = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (el <= 0) snprintf(exe, sizeof(exe), "%s", o->argv[0]);
    else exe[el] = '\0';
    snprintf(area, sizeof(area), "/proc/%ld/fd/%d", (long)getpid(), fd);
    char *av[512];
    mpirun_argv(av, 512, buf, sizeof(buf), n, exe, area, o, nbuf);
    if (geteuid() == 0) { /* Open MPI refuses root unless told twice */
        setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
        setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
    }
    int errfd = memfd_create("cw-vae-mpirun-stderr", 0);
    char label[64];
    snprintf(label, sizeof(label), "%sdecoding on %d ranks", o->compare_ranks ? "[2/2] " : "", n);
    child_opts co = {0};
    co.spinner = spinner_on(o);
    co.label = label;
    co.done = &ar->rank[0].tasks_done;
    co.total = &ar->rank[0].tasks_total;
    co.pid = &g_child;
    co.stop = &g_stop;
    co.die_with_parent = 1;
    child_status st;
    child_exec(&st, av, -1, errfd, &co);
    char *errtext = errfd >= 0 ? read_fd_tail(errfd, 8192) : NULL;
    if (errfd >= 0) close(errfd);
    close(fd);
    int ret = 0, bad = failed_rank(ar);
    if (st.end == CHILD_STOPPED) {
        ret = -1;
    } else if (st.end == CHILD_FAILED) {
        say("%s", st.err);
        ret = EXIT_RUN;
    } else if (bad >= 0) { /* a rank said why: its message, not mpirun's abort banner */
        run_result r = ar->rank[bad];
        char tmp[sizeof(r.err)];
        snprintf(tmp, sizeof(tmp), "%s", r.err);
        /* "rank %d/%d: " takes at most 30 bytes (two ints of up to 11 and 8 more): the message is
         * cut to leave room for it, and a bound GCC sees at -O0 too */
        snprintf(r.err, sizeof(r.err), "rank %d/%d: %.*s", bad, n, (int)sizeof(r.err) - 32, tmp);
        ret = report_failure(&r);
    } else if (st.end != CHILD_EXITED || st.code != 0) {
        if (errtext) fputs(errtext, stderr);
        if (st.end == CHILD_KILLED) say("%s -n %d: killed by signal %d (%s)", av[0], n, st.code, strsignal(st.code));
        else if (st.code == 127) say("%s: cannot run it (install openmpi-bin, or set CW_VAE_MPIRUN)", av[0]);
        else say("%s -n %d: exited with status %d before the ranks finished", av[0], n, st.code);
        ret = EXIT_RUN;
    } else {
        for (int r = 0; r < n && !ret; r++)
            if (ar->rank[r].exit_code != 0) {
                say("rank %d/%d did not finish its run (mpirun exited 0)", r, n);
                ret = EXIT_RUN;
            }
    }
    if (ret == 0 && errtext) fputs(errtext, stderr); /* the ranks' warnings */
    free(errtext);
    if (ret != 0) {
        munmap(ar, bytes);
        child_area_unmap(&single);
        return ret;
    }
    float *out = (float *)((char *)ar + out_off);
    const run_result *sres = single.head;
    double diff = sres ? max_abs_diff(out, single.data, jb->out_numel) : 0;
    if (!o->quiet || o->compare_ranks) print_ranks_table(o, ar, sres, diff);
    child_area_unmap(&single);
    final->head = ar;
    final->data = out;
    final->bytes = bytes;
    return 0;
}

/* ---- a rank ------------------------------------------------------------------------------------------ */

#ifdef CW_VAE_MPI
/* A rank's failure before its run: into its slot when there is one, else on stderr. */
static void rank_fail(ranks_area *ar, int r, const char *msg) {
    if (ar && r >= 0 && r < ar->n_ranks) {
        snprintf(ar->rank[r].err, sizeof(ar->rank[r].err), "%s", msg);
        ar->rank[r].exit_code = EXIT_RUN;
    } else {
        say("rank %d: %s", r, msg);
    }
    comm_mpi_abort(EXIT_RUN);
    _exit(EXIT_RUN);
}

void rank_main(opts *o) {
    char err[512];
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* mpirun gone: this rank too */
    if (comm_mpi_init(NULL, NULL, err, sizeof(err))) {
        say("%s", err);
        _exit(EXIT_RUN);
    }
    comm_mpi *c = NULL;
    cw_comm comm;
    if (comm_mpi_create(&c, &comm, o->comm_timeout, err, sizeof(err))) rank_fail(NULL, -1, err);
    int fd = open(o->rank_area, O_RDWR | O_CLOEXEC);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0 || (size_t)sb.st_size < sizeof(ranks_area)) {
        snprintf(err, sizeof(err), "--rank-area %s: %s", o->rank_area, fd < 0 ? strerror(errno) : "too small");
        rank_fail(NULL, comm.rank, err);
    }
    ranks_area *ar = mmap(NULL, (size_t)sb.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (ar == MAP_FAILED) rank_fail(NULL, comm.rank, "mmap of the rank area failed");
    if (ar->n_ranks != comm.n_ranks || ar->bytes != (size_t)sb.st_size) {
        snprintf(err, sizeof(err), "the area is for %d ranks, MPI_COMM_WORLD has %d", ar->n_ranks, comm.n_ranks);
        rank_fail(NULL, comm.rank, err);
    }
    int r = comm.rank;
    ar->extra[r].started = 1;
    if (o->backend == CW_BACKEND_AUTO) o->backend = CW_BACKEND_CPU;
    o->threads = ar->threads;
    float *out = r == 0 ? (float *)((char *)ar + ar->out_off) : calloc((size_t)ar->out_numel, sizeof(float));
    if (!out) rank_fail(ar, r, "out of memory for the output");
    job jb = {(const float *)((char *)ar + ar->in_off), ar->n, ar->h, ar->w, ar->out_numel, NULL, &comm};
    run_cfg rc;
    cfg_from_opts(&rc, o);
    rc.trace = 0;
    run_result *res = &ar->rank[r];
    res->exit_code = -1;
    int code = run_here(o, &rc, &jb, res, out);
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0) res->peak_rss = (int64_t)ru.ru_maxrss * 1024;
    comm_mpi_counts(c, &ar->extra[r].sent, &ar->extra[r].recvd, &ar->extra[r].bytes_sent, &ar->extra[r].bytes_recvd);
    if (code != 0) {
        const char *why = comm_mpi_last_error(c);
        size_t len = strlen(res->err);
        if (*why && len + 8 < sizeof(res->err)) snprintf(res->err + len, sizeof(res->err) - len, " (%s)", why);
        res->exit_code = code;
        comm_mpi_abort(code); /* the other ranks may wait for this one's messages: end them */
        _exit(code);
    }
    if (r != 0) free(out);
    comm_mpi_destroy(c);
    comm_mpi_finalize();
    munmap(ar, ar->bytes);
    exit(0);
}
#else
void rank_main(opts *o) {
    (void)o;
    say("--rank-area: this cw-vae was built without MPI");
    exit(EXIT_USAGE);
}
#endif
