/* Half-precision storage on the cpu backend (f32 arithmetic), one run each:
 *
 *   bench_half [--threads T] [--rows R]
 *       one conv 128 -> 128, k3, pad 1, 1024 x 1024, N = 1, in f32, f16 and bf16, through
 *       every algorithm the backend lists for its patches: the output cut into bands of R
 *       rows (default 32; what a budget makes of it), each band one cpu conv call on T
 *       threads (default 2). Prints ms and GFLOP/s per (dtype, algorithm), and the ratio
 *       to f32 on the same algorithm. cpu_direct (3-5 GFLOP/s here: minutes) only with
 *       --direct.
 *   bench_half --cvt
 *       the row converters (cvt_cpu.c): f16 with F16C and with the portable code, bf16,
 *       GB/s of f32 written (load) or read (store) over a 64 MiB row.
 *   bench_half --sbgemm LIBOPENBLAS
 *       OpenBLAS's bf16 GEMM (cblas_sbgemm, from a build with BUILD_BFLOAT16=1 given by
 *       path; the distribution's has none) against what the GEMM algorithm does instead:
 *       convert the bf16 column block to f32 and call cblas_sgemm, at one patch's GEMM
 *       shape (M = 128, N = 32 x 1024, K = 1152), one thread, both from that library.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "core/half.h"
#include "scheduler/planner.h"

static void *xmalloc(size_t n) {
    void *p = malloc(n);
    if (!p) {
        fprintf(stderr, "out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

/* n elements of dtype dt, deterministic values in [-0.5, 0.5) * scale. */
static void *rnd(int64_t n, cw_dtype dt, float scale) {
    void *p = xmalloc((size_t)n * cw_dtype_size(dt));
    for (int64_t i = 0; i < n; i++) {
        float f = ((float)((i * 2654435761u) % 1000) * 1e-3f - 0.5f) * scale;
        if (dt == CW_F32) ((float *)p)[i] = f;
        else ((uint16_t *)p)[i] = dt == CW_F16 ? cw__f32_to_f16(f) : cw__f32_to_bf16(f);
    }
    return p;
}

static double secs(int64_t t0) { return (double)(cw__now_ns() - t0) * 1e-9; }

static void bench_conv(int threads, int64_t band, int direct) {
    const int64_t C = 128, K = 128, H = 1024, W = 1024;
    const double flops = 2.0 * (double)K * (double)C * 9.0 * (double)(H * W);
    double f32_ms[CW__CPU_ALGO_COUNT] = {0};
    printf("conv %lld -> %lld, k3, %lld x %lld, N = 1: %.1f GFLOP per run; bands of %lld rows, %d threads\n",
           (long long)C, (long long)K, (long long)H, (long long)W, flops * 1e-9, (long long)band, threads);
    static const cw_dtype dts[3] = {CW_F32, CW_F16, CW_BF16};
    for (int d = 0; d < 3; d++) {
        const cw_dtype dt = dts[d];
        cw_tensor_desc x, w, y;
        int64_t xd[4] = {1, C, H, W}, wd[4] = {K, C, 3, 3};
        cw_conv_params cp = CW_CONV_PARAMS_INIT;
        cp.pad_pre[0] = cp.pad_pre[1] = cp.pad_post[0] = cp.pad_post[1] = 1;
        if (cw_tensor_desc_make(&x, dt, 4, xd) != CW_OK || cw_tensor_desc_make(&w, dt, 4, wd) != CW_OK ||
            cw_conv_output_desc(NULL, &y, &x, &w, &cp) != CW_OK) {
            fprintf(stderr, "bad shape\n");
            exit(1);
        }
        cw__conv_problem prob;
        cw__conv_problem_init(&prob, &x, &w, 1, &y, &cp);
        void *xb = rnd(C * H * W, dt, 1.0f), *wb = rnd(K * C * 9, dt, 0.1f), *bb = rnd(K, dt, 0.1f);
        void *yb = xmalloc((size_t)(K * H * W) * cw_dtype_size(dt));
        const int64_t P = (H + band - 1) / band;
        int64_t *bounds = xmalloc((size_t)(P + 1) * sizeof *bounds);
        cw__patch_bounds(H, P, bounds);
        cw__patch first;
        if (cw__patch_make(&prob, bounds[0], bounds[1], &first) != CW_OK) exit(1);
        cw__conv_algo al[CW__CPU_ALGO_COUNT];
        int na = 0;
        if (cw__cpu_conv_algos(NULL, &first.prob, al, CW__CPU_ALGO_COUNT, &na) != CW_OK) exit(1);
        for (int a = 0; a < na; a++) {
            if (al[a].id == CW__CPU_ALGO_DIRECT && !direct) {
                printf("  %-5s %-22s (skipped: --direct)\n", cw__dtype_name(dt), al[a].name);
                continue;
            }
            int64_t wsb = 0;
            for (int64_t i = 0; i < P; i++) { /* the largest band's workspace */
                cw__patch pt;
                if (cw__patch_make(&prob, bounds[i], bounds[i + 1], &pt) != CW_OK) exit(1);
                int64_t b = cw__cpu_conv_workspace(&pt.prob, al[a].id);
                if (b > wsb) wsb = b;
            }
            void *ws = wsb ? xmalloc((size_t)wsb) : NULL;
            if (ws) memset(ws, 0, (size_t)wsb); /* touch the pages before timing */
            int64_t t0 = cw__now_ns();
            for (int64_t i = 0; i < P; i++) {
                cw__patch pt;
                if (cw__patch_make(&prob, bounds[i], bounds[i + 1], &pt) != CW_OK) exit(1);
                cw__cpu_conv_run(&pt.prob, al[a].id, (const char *)xb + pt.x_offset * (int64_t)cw_dtype_size(dt), wb,
                                 bb, (char *)yb + pt.y_offset * (int64_t)cw_dtype_size(dt), ws, threads);
            }
            const double ms = secs(t0) * 1e3;
            free(ws);
            if (dt == CW_F32) f32_ms[al[a].id] = ms;
            char ratio[48] = "";
            if (dt != CW_F32 && f32_ms[al[a].id] > 0)
                snprintf(ratio, sizeof ratio, "  %.2fx f32's time", ms / f32_ms[al[a].id]);
            printf("  %-5s %-22s %9.1f ms %6.1f GFLOP/s  ws/band %7.1f MiB%s\n", cw__dtype_name(dt), al[a].name, ms,
                   flops / ms * 1e-6, (double)wsb / (1 << 20), ratio);
            fflush(stdout);
        }
        free(bounds), free(xb), free(wb), free(bb), free(yb);
    }
}

static void bench_cvt(void) {
    const int64_t n = INT64_C(16) << 20; /* 16 Mi elements: 64 MiB of f32 */
    float *f = xmalloc((size_t)n * sizeof *f);
    uint16_t *h = rnd(n, CW_F16, 8.0f), *b = rnd(n, CW_BF16, 8.0f);
    printf("row converters, %lld elements (best of 5):\n", (long long)n);
    for (int k = 0; k < 6; k++) {
        const char *names[6] = {"f16 -> f32, F16C", "f16 -> f32, portable", "bf16 -> f32",
                                "f32 -> f16, F16C", "f32 -> f16, portable", "f32 -> bf16"};
        cw__cpu_cvt_force_scalar(k == 1 || k == 4);
        double best = 1e30;
        for (int r = 0; r < 5; r++) {
            int64_t t0 = cw__now_ns();
            if (k < 3) cw__cpu_load_f32(f, k == 2 ? b : h, k == 2 ? CW_BF16 : CW_F16, n, 1);
            else cw__cpu_store_f32(k == 5 ? b : h, k == 5 ? CW_BF16 : CW_F16, 1, f, n);
            double s = secs(t0);
            if (s < best) best = s;
        }
        printf("  %-22s %7.2f ms  %6.2f G elements/s\n", names[k], best * 1e3, (double)n / best * 1e-9);
    }
    cw__cpu_cvt_force_scalar(0);
    free(f), free(h), free(b);
}

typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float *, int, const float *, int, float,
                         float *, int);
typedef void (*sbgemm_fn)(int, int, int, int, int, int, float, const uint16_t *, int, const uint16_t *, int, float,
                          float *, int);
typedef void (*setthreads_fn)(int);
typedef char *(*corename_fn)(void);

static void bench_sbgemm(const char *lib) {
    /* RTLD_DEEPBIND: the library's calls resolve inside it, not in the OpenBLAS convweave links */
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    if (!h) {
        fprintf(stderr, "dlopen %s: %s\n", lib, dlerror());
        exit(1);
    }
    sbgemm_fn sb = (sbgemm_fn)dlsym(h, "cblas_sbgemm");
    sgemm_fn sg = (sgemm_fn)dlsym(h, "cblas_sgemm");
    setthreads_fn st = (setthreads_fn)dlsym(h, "openblas_set_num_threads");
    corename_fn cn = (corename_fn)dlsym(h, "openblas_get_corename");
    if (!sb || !sg) {
        fprintf(stderr, "%s has no cblas_sbgemm (built without BUILD_BFLOAT16=1)\n", lib);
        exit(1);
    }
    if (st) st(1);
    const int M = 128, N = 32 * 1024, K = 1152; /* one 32-row band of the 128 -> 128 k3 1024^2 conv */
    uint16_t *a16 = rnd((int64_t)M * K, CW_BF16, 0.1f), *b16 = rnd((int64_t)K * N, CW_BF16, 1.0f);
    float *a32 = xmalloc((size_t)M * K * sizeof(float)), *b32 = xmalloc((size_t)K * N * sizeof(float));
    float *c = xmalloc((size_t)M * N * sizeof(float));
    const double flops = 2.0 * M * (double)N * K;
    printf("GEMM %d x %d x %d (one band's), 1 thread, OpenBLAS core %s (%s):\n", M, N, K, cn ? cn() : "?", lib);
    double best_sb = 1e30, best_cv = 1e30, best_cvt = 1e30;
    for (int r = 0; r < 3; r++) {
        int64_t t0 = cw__now_ns();
        sb(101, 111, 111, M, N, K, 1.0f, a16, K, b16, N, 0.0f, c, N); /* row major, no transposes */
        double s = secs(t0);
        if (s < best_sb) best_sb = s;
        t0 = cw__now_ns();
        cw__cpu_load_f32(a32, a16, CW_BF16, (int64_t)M * K, 1);
        cw__cpu_load_f32(b32, b16, CW_BF16, (int64_t)K * N, 1);
        double s_cvt = secs(t0);
        sg(101, 111, 111, M, N, K, 1.0f, a32, K, b32, N, 0.0f, c, N);
        s = secs(t0);
        if (s < best_cv) best_cv = s;
        if (s_cvt < best_cvt) best_cvt = s_cvt;
    }
    printf("  cblas_sbgemm (bf16 in, f32 out)       %9.1f ms %6.1f GFLOP/s\n", best_sb * 1e3, flops / best_sb * 1e-9);
    printf("  bf16 -> f32 + cblas_sgemm             %9.1f ms %6.1f GFLOP/s (conversion %.1f ms)\n", best_cv * 1e3,
           flops / best_cv * 1e-9, best_cvt * 1e3);
    printf("  sbgemm takes %.2fx the time of converting\n", best_sb / best_cv);
    free(a16), free(b16), free(a32), free(b32), free(c);
}

int main(int argc, char **argv) {
    int threads = 2, direct = 0;
    int64_t rows = 32;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            threads = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--rows") && i + 1 < argc) {
            rows = atoll(argv[++i]);
        } else if (!strcmp(argv[i], "--direct")) {
            direct = 1;
        } else if (!strcmp(argv[i], "--cvt")) {
            bench_cvt();
            return 0;
        } else if (!strcmp(argv[i], "--sbgemm") && i + 1 < argc) {
            bench_sbgemm(argv[++i]);
            return 0;
        } else {
            fprintf(stderr, "usage: %s [--threads T] [--rows R] [--direct] | --cvt | --sbgemm LIBOPENBLAS\n", argv[0]);
            return 2;
        }
    }
    if (threads < 1 || rows < 1) return 2;
    cw__cpu_blas_single();
    bench_conv(threads, rows, direct);
    return 0;
}
