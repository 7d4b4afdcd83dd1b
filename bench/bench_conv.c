/* Benchmark of one convolution on the cpu backend: unpatched (the fastest algorithm whose
 * workspace fits in memory) vs height-patched under temp budgets, with the planner and
 * cw__cpu_conv_run. Each measurement runs in a fresh child process so its peak RSS is its own.
 *
 *   bench_conv                       the full suite (32->32 k3/5/7 at 1024^2..4096^2,
 *                                    128->128 and 512->512 k3 at 256^2 and 1024^2)
 *   bench_conv --quick               small sizes only (256^2, 512^2), a few seconds
 *   bench_conv --ch 32 --k 3 --hw 1024 --budgets 64,256   filter the suite / set budgets (MiB)
 *   bench_conv --case 64,64,3,512    add a custom case C,K,k,H (H = W, N = 1)
 * Options: --threads T (BLAS threads, default all cores), --max-ws-mib M (largest unpatched
 * workspace tried; default half of MemAvailable), --max-seconds S (skip runs estimated longer). */
#include <cblas.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "backend/cpu/cpu.h"
#include "child.h"
#include "scheduler/planner.h"

#define MIB (1024.0 * 1024.0)

typedef struct bcase {
    int64_t c, k, ks, h;
} bcase;

static const bcase suite[] = {
    {32, 32, 3, 1024},  {32, 32, 5, 1024},  {32, 32, 7, 1024},  {32, 32, 3, 2048},   {32, 32, 5, 2048},
    {32, 32, 7, 2048},  {32, 32, 3, 4096},  {32, 32, 5, 4096},  {32, 32, 7, 4096},   {128, 128, 3, 256},
    {128, 128, 3, 1024}, {512, 512, 3, 256}, {512, 512, 3, 1024},
};
static const bcase quick_suite[] = {
    {32, 32, 3, 256}, {32, 32, 5, 256}, {32, 32, 7, 256}, {32, 32, 3, 512}, {128, 128, 3, 256},
};

static double now_s(void) { return (double)cw__now_ns() * 1e-9; }

static int64_t mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    int64_t kb = 0;
    if (!f) return (int64_t)8 << 30;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %" SCNd64 " kB", &kb) == 1) break;
    fclose(f);
    return kb * 1024;
}

static double peak_rss_mib(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss / 1024.0; /* ru_maxrss is in KiB on Linux */
}

/* sgemm GFLOP/s of an n x n x n product (best of reps). */
static double sgemm_gflops(int n, int reps) {
    float *a = malloc((size_t)n * n * 4), *b = malloc((size_t)n * n * 4), *c = malloc((size_t)n * n * 4);
    if (!a || !b || !c) return 0;
    for (int64_t i = 0; i < (int64_t)n * n; i++) a[i] = (float)(i % 7) * 0.1f, b[i] = (float)(i % 5) * 0.2f;
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t = now_s();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        t = now_s() - t;
        if (t < best) best = t;
    }
    free(a), free(b), free(c);
    return 2.0 * n * n * (double)n / best * 1e-9;
}

static void make_problem(const bcase *bc, cw__conv_problem *pr) {
    cw_conv_params p = CW_CONV_PARAMS_INIT;
    int64_t pad = bc->ks / 2;
    p.pad_pre[0] = p.pad_pre[1] = p.pad_post[0] = p.pad_post[1] = pad;
    cw_tensor_desc x, w, y;
    int64_t xd[4] = {1, bc->c, bc->h, bc->h}, wd[4] = {bc->k, bc->c, bc->ks, bc->ks};
    cw_tensor_desc_make(&x, CW_F32, 4, xd);
    cw_tensor_desc_make(&w, CW_F32, 4, wd);
    cw_conv_output_desc(NULL, &y, &x, &w, &p);
    cw__conv_problem_init(pr, &x, &w, 1, &y, &p);
}

/* only conv_algos: the planner needs nothing else */
static const cw__runtime_i algos_rt = {.name = "cpu"};
static cw__ops_i algos_ops;

/* Child: one measurement. budget < 0: unpatched (fastest algorithm with workspace <=
 * max_ws). Prints one machine-readable line. */
static int run_one(const bcase *bc, int64_t budget, int64_t max_ws, int threads, double max_seconds) {
    openblas_set_num_threads(threads);
    cw__conv_problem pr;
    make_problem(bc, &pr);
    cw__backend be = {&algos_rt, &algos_ops, NULL, threads, 1};
    int P = 1;
    cw__conv_algo algo;
    int64_t min_cap = 0;
    cw_status st;
    if (budget < 0) {
        cw__conv_algo lst[4];
        int n = 0;
        st = cw__cpu_conv_algos(&be, &pr, lst, 4, &n);
        int pick = -1;
        for (int i = 0; i < n && pick < 0; i++)
            if (lst[i].workspace <= max_ws) pick = i;
        if (st != CW_OK || pick < 0) {
            printf("RESULT skip no-algorithm\n");
            return 0;
        }
        algo = lst[pick];
    } else {
        /* the planner under a plain workspace cap: one heavy stream, no prep buffers */
        cw__conv_share sh = {budget, 1, 1, 0, 1, 0, 0, 0, 0, 0, 0};
        cw__conv_plan cp;
        st = cw__planner_plan(&be, &pr, &sh, &cp, &min_cap);
        if (st == CW_OK) P = cp.patches, algo = cp.algo;
        cw__conv_plan_free(&cp);
        if (st != CW_OK) {
            printf("RESULT skip budget-too-small min=%" PRId64 "\n", min_cap);
            return 0;
        }
    }
    double flops = cw__conv_flops(&pr);
    /* rough rates (GFLOP/s) to skip hopeless runs: direct is single-threaded */
    double est = flops * 1e-9 / (algo.id == CW__CPU_ALGO_DIRECT ? 8.0 : 40.0 * threads);
    if (est > max_seconds) {
        printf("RESULT skip est-%.0fs algo=%s ws=%" PRId64 "\n", est, algo.name, algo.workspace);
        return 0;
    }
    int64_t nx = pr.x.dims[0] * pr.x.dims[1] * pr.x.dims[2] * pr.x.dims[3];
    int64_t nw = pr.w.dims[0] * pr.w.dims[1] * pr.w.dims[2] * pr.w.dims[3];
    int64_t ny = pr.y.dims[0] * pr.y.dims[1] * pr.y.dims[2] * pr.y.dims[3];
    float *x = malloc((size_t)nx * 4), *w = malloc((size_t)nw * 4), *b = malloc((size_t)pr.y.dims[1] * 4);
    float *y = malloc((size_t)ny * 4);
    float *ws = algo.workspace ? malloc((size_t)algo.workspace) : NULL;
    if (!x || !w || !b || !y || (algo.workspace && !ws)) {
        printf("RESULT skip out-of-memory\n");
        return 0;
    }
    uint64_t s = 12345;
    for (int64_t i = 0; i < nx; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((s >> 40) & 0xffff) / 65536.0f - 0.5f;
    }
    for (int64_t i = 0; i < nw; i++) w[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    for (int64_t i = 0; i < pr.y.dims[1]; i++) b[i] = 0.01f * (float)i;
    int64_t *bounds = malloc((size_t)(P + 1) * sizeof(int64_t));
    cw__patch_bounds(pr.y.dims[2], P, bounds);
    /* touch y and ws once so page faults are not timed */
    memset(y, 0, (size_t)ny * 4);
    if (ws) memset(ws, 0, (size_t)algo.workspace);
    double best = 1e30;
    int reps = 0;
    double t_total = 0;
    do {
        double t = now_s();
        for (int i = 0; i < P; i++) {
            cw__patch pt;
            cw__patch_make(&pr, bounds[i], bounds[i + 1], &pt);
            cw__cpu_conv_run(&pt.prob, algo.id, x + pt.x_offset, w, b, y + pt.y_offset, ws, threads);
        }
        t = now_s() - t;
        t_total += t;
        if (t < best) best = t;
        reps++;
    } while (t_total < 1.0 && reps < 5);
    double sum = 0;
    for (int64_t i = 0; i < ny; i++) sum += (double)y[i];
    printf("RESULT ok P=%d algo=%s ws=%" PRId64 " rss_mib=%.1f time=%.4f gflops=%.2f reps=%d sum=%.9e\n", P, algo.name,
           algo.workspace, peak_rss_mib(), best, flops / best * 1e-9, reps, sum);
    free(x), free(w), free(b), free(y), free(ws), free(bounds);
    return 0;
}

/* Parent: runs argv0 --run ... in a child (a fresh process, so its peak RSS is its own) and
 * captures its RESULT line, or says why there is none. */
static void spawn(const char *self, const bcase *bc, int64_t budget, int64_t max_ws, int threads, double max_s,
                  char *out, size_t outn) {
    char a[6][64];
    snprintf(a[0], 64, "%" PRId64 ",%" PRId64 ",%" PRId64 ",%" PRId64, bc->c, bc->k, bc->ks, bc->h);
    snprintf(a[1], 64, "%" PRId64, budget);
    snprintf(a[2], 64, "%" PRId64, max_ws);
    snprintf(a[3], 64, "%d", threads);
    snprintf(a[4], 64, "%g", max_s);
    char *argv[] = {(char *)self, "--run", a[0], a[1], a[2], a[3], a[4], NULL};
    out[0] = 0;
    FILE *f = tmpfile(); /* the child's stdout */
    if (!f) {
        snprintf(out, outn, "failed (tmpfile: %s)", strerror(errno));
        return;
    }
    child_opts co = {0};
    child_status st;
    child_exec(&st, argv, fileno(f), -1, &co);
    char line[512];
    rewind(f);
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "RESULT ", 7) == 0) snprintf(out, outn, "%s", line + 7);
    fclose(f);
    size_t l = strlen(out);
    if (l && out[l - 1] == '\n') out[l - 1] = 0;
    if (out[0]) return;
    if (st.end == CHILD_FAILED) snprintf(out, outn, "failed (%s)", st.err);
    else snprintf(out, outn, "failed (status %d)", st.wstatus);
}

static int parse_list(const char *s, int64_t *v, int max) {
    int n = 0;
    while (*s && n < max) {
        v[n++] = strtoll(s, (char **)&s, 10);
        if (*s == ',') s++;
        else break;
    }
    return n;
}

static int in_list(int64_t x, const int64_t *v, int n) {
    if (n == 0) return 1;
    for (int i = 0; i < n; i++)
        if (v[i] == x) return 1;
    return 0;
}

int main(int argc, char **argv) {
    algos_ops.conv_algos = cw__cpu_conv_algos;
    int threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (argc >= 7 && strcmp(argv[1], "--run") == 0) {
        bcase bc;
        int64_t v[4];
        if (parse_list(argv[2], v, 4) != 4) return 2;
        bc.c = v[0], bc.k = v[1], bc.ks = v[2], bc.h = v[3];
        return run_one(&bc, strtoll(argv[3], NULL, 10), strtoll(argv[4], NULL, 10), atoi(argv[5]), atof(argv[6]));
    }
    int quick = 0, nch = 0, nk = 0, nhw = 0, nb = 2, ncustom = 0;
    int64_t chs[8], kss[8], hws[8], budgets[8] = {64, 256};
    bcase custom[8];
    int64_t max_ws = mem_available() / 2;
    double max_s = 900;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--quick")) quick = 1;
        else if (!strcmp(a, "--ch") && v) nch = parse_list(v, chs, 8), i++;
        else if (!strcmp(a, "--k") && v) nk = parse_list(v, kss, 8), i++;
        else if (!strcmp(a, "--hw") && v) nhw = parse_list(v, hws, 8), i++;
        else if (!strcmp(a, "--budgets") && v) nb = parse_list(v, budgets, 8), i++;
        else if (!strcmp(a, "--threads") && v) threads = atoi(v), i++;
        else if (!strcmp(a, "--max-ws-mib") && v) max_ws = (int64_t)(atof(v) * MIB), i++;
        else if (!strcmp(a, "--max-seconds") && v) max_s = atof(v), i++;
        else if (!strcmp(a, "--case") && v && ncustom < 8) {
            int64_t c[4];
            if (parse_list(v, c, 4) == 4) custom[ncustom++] = (bcase){c[0], c[1], c[2], c[3]};
            i++;
        } else {
            fprintf(stderr, "usage: %s [--quick] [--ch L] [--k L] [--hw L] [--budgets MiB,..] [--case C,K,k,H] "
                            "[--threads T] [--max-ws-mib M] [--max-seconds S]\n", argv[0]);
            return 2;
        }
    }
    openblas_set_num_threads(threads);
    int gn = quick ? 1024 : 2048;
    double g = sgemm_gflops(gn, 3);
    printf("# machine: %ld cores, %s (core %s), BLAS threads %d\n", sysconf(_SC_NPROCESSORS_ONLN),
           openblas_get_config(), openblas_get_corename(), threads);
    printf("# sgemm %dx%dx%d: %.1f GFLOP/s\n", gn, gn, gn, g);
    printf("# unpatched: fastest algorithm with workspace <= %.0f MiB; patched: cw__planner_plan under the budget\n",
           (double)max_ws / MIB);
    printf("# peak temp = workspace bytes (the only temporary); RSS = child's peak resident set\n");
    printf("%-22s %-10s %5s %-16s %12s %10s %10s %9s  %s\n", "conv (N=1, H=W)", "mode", "P", "algorithm",
           "peak temp MiB", "RSS MiB", "time s", "GFLOP/s", "checksum");

    const bcase *list = quick ? quick_suite : suite;
    int nlist = quick ? (int)(sizeof quick_suite / sizeof *quick_suite) : (int)(sizeof suite / sizeof *suite);
    bcase all[32];
    int n = 0;
    for (int i = 0; i < nlist; i++)
        if (in_list(list[i].c, chs, nch) && in_list(list[i].ks, kss, nk) && in_list(list[i].h, hws, nhw)) all[n++] = list[i];
    for (int i = 0; i < ncustom; i++) all[n++] = custom[i];

    for (int i = 0; i < n; i++) {
        char name[64];
        snprintf(name, sizeof name, "%" PRId64 "->%" PRId64 " k%" PRId64 " %" PRId64 "^2", all[i].c, all[i].k, all[i].ks,
                 all[i].h);
        double ref_sum = 0;
        int have_ref = 0;
        for (int m = -1; m < nb; m++) {
            int64_t budget = m < 0 ? -1 : (int64_t)(budgets[m] * MIB);
            char res[512], mode[32];
            snprintf(mode, sizeof mode, m < 0 ? "unpatched" : "%" PRId64 "MiB", m < 0 ? 0 : budgets[m]);
            spawn(argv[0], &all[i], budget, max_ws, threads, max_s, res, sizeof res);
            int P;
            char algo[64];
            int64_t ws;
            double rss, t, gf, sum;
            int reps;
            if (sscanf(res, "ok P=%d algo=%63s ws=%" SCNd64 " rss_mib=%lf time=%lf gflops=%lf reps=%d sum=%lf", &P, algo,
                       &ws, &rss, &t, &gf, &reps, &sum) == 8) {
                char chk[48];
                if (!have_ref) {
                    ref_sum = sum, have_ref = 1;
                    snprintf(chk, sizeof chk, "%.6e", sum);
                } else {
                    double rel = (sum - ref_sum) / (ref_sum != 0 ? ref_sum : 1);
                    snprintf(chk, sizeof chk, "rel diff %.1e", rel < 0 ? -rel : rel);
                }
                printf("%-22s %-10s %5d %-16s %12.1f %10.1f %10.3f %9.1f  %s\n", name, mode, P, algo, (double)ws / MIB, rss,
                       t, gf, chk);
            } else {
                printf("%-22s %-10s %s\n", name, mode, res);
            }
            fflush(stdout);
        }
    }
    return 0;
}
