/* Per-algorithm timing of single cpu conv patches: every algorithm the cpu backend lists
 * for a shape, run alone on one thread (what the cost model in conv_cpu.c estimates), with
 * its predicted cost. This is the data the cost model is fitted to.
 *
 *   bench_conv_algos                   the fitting grid (C = K in 8..512, k 1/3, W 64..1024)
 *   bench_conv_algos --sd              the SD VAE decoder's 3x3 convs (4..512 channels, W 64..1024)
 *   bench_conv_algos --case C,K,k,H,W  one shape (N = 1, stride 1, "same" padding)
 *   bench_conv_algos --case3 C,K,k,D,H,W   one 3-D shape (a k x k x k kernel over D frames)
 *   --threads T                        threads per call (default 1)
 *   --reps R                           runs per (shape, algorithm), the best reported (default 3)
 * Output: one line per (shape, algorithm): ms (best of R), GFLOP/s, workspace, cost, and for
 * oneDNN its sub-band count (a patch's single-threaded oneDNN calls). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"

typedef struct shape {
    int64_t c, k, ks, h, w, groups;
} shape;

static const shape grid[] = {
    {8, 8, 3, 32, 1024, 1},    {16, 16, 3, 32, 1024, 1},  {32, 32, 3, 32, 1024, 1},  {64, 64, 3, 16, 1024, 1},
    {128, 128, 3, 8, 1024, 1}, {256, 256, 3, 8, 512, 1},  {512, 512, 3, 8, 256, 1},  {32, 32, 3, 64, 256, 1},
    {128, 128, 3, 32, 256, 1}, {512, 512, 3, 16, 64, 1},  {32, 32, 1, 32, 1024, 1},  {128, 128, 1, 16, 1024, 1},
    {512, 512, 1, 16, 256, 1}, {3, 32, 3, 32, 1024, 1},   {32, 3, 3, 32, 1024, 1},   {128, 3, 3, 16, 1024, 1},
    {32, 32, 3, 32, 1024, 32}, {64, 64, 3, 16, 1024, 4},  {32, 32, 5, 32, 1024, 1},  {32, 32, 7, 32, 1024, 1},
    {256, 128, 1, 16, 512, 1}, {512, 256, 3, 8, 256, 1},
};

/* The SD decoder's 3x3 convs at its widths for 512^2 and 1024^2 images (conv_in, the
 * 512/256/128-channel ResNet and upsample convs, conv_out), a few rows each. */
static const shape sd[] = {
    {4, 512, 3, 32, 64, 1},     {4, 512, 3, 32, 128, 1},    {512, 512, 3, 32, 64, 1},   {512, 512, 3, 16, 128, 1},
    {512, 512, 3, 16, 256, 1},  {512, 512, 3, 8, 512, 1},   {512, 256, 3, 8, 512, 1},   {256, 256, 3, 8, 512, 1},
    {256, 256, 3, 8, 1024, 1},  {256, 128, 3, 8, 1024, 1},  {128, 128, 3, 8, 512, 1},   {128, 128, 3, 8, 1024, 1},
    {128, 3, 3, 16, 512, 1},    {128, 3, 3, 16, 1024, 1},
};

static float *rnd(int64_t n) {
    float *p = malloc((size_t)n * sizeof(float));
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    for (int64_t i = 0; i < n; i++) p[i] = (float)((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
    return p;
}

/* Times every algorithm on s; with d > 0 s is 3-D: a ks^3 kernel over d frames. */
static void run_shape(const shape *s, int64_t d, int threads, int reps) {
    cw__conv_problem p;
    memset(&p, 0, sizeof p);
    const int64_t pad = s->ks / 2, frames = d ? d : 1, kd = d ? s->ks : 1;
    const int sp = d ? 3 : 2;
    p.spatial = sp;
    p.groups = s->groups;
    p.has_bias = 1;
    for (int i = 0; i < 3; i++) p.stride[i] = p.dilation[i] = 1;
    for (int i = 0; i < sp; i++) p.pad_pre[i] = p.pad_post[i] = pad;
    int64_t xd[5] = {1, s->c, frames, s->h, s->w}, wd[5] = {s->k, s->c / s->groups, s->ks, s->ks, s->ks};
    int64_t yd[5] = {1, s->k, frames, s->h, s->w};
    if (!d) { /* 2-D: no frames */
        xd[2] = s->h, xd[3] = s->w, yd[2] = s->h, yd[3] = s->w;
    }
    if (cw_tensor_desc_make(&p.x, CW_F32, sp + 2, xd) != CW_OK ||
        cw_tensor_desc_make(&p.w, CW_F32, sp + 2, wd) != CW_OK ||
        cw_tensor_desc_make(&p.y, CW_F32, sp + 2, yd) != CW_OK) {
        fprintf(stderr, "bad shape\n");
        exit(1);
    }
    cw__conv_algo al[8];
    int na = 0;
    if (cw__cpu_conv_algos(NULL, &p, al, 8, &na) != CW_OK) {
        fprintf(stderr, "conv_algos failed\n");
        exit(1);
    }
    const int64_t hw = frames * s->h * s->w;
    float *x = rnd(s->c * hw), *w = rnd(s->k * (s->c / s->groups) * s->ks * s->ks * kd), *b = rnd(s->k);
    float *y = rnd(s->k * hw);
    double flops = 2.0 * (double)s->k * (double)(s->c / s->groups) * (double)(s->ks * s->ks * kd) * (double)hw;
    for (int i = 0; i < na; i++) {
        float *ws = al[i].workspace ? malloc((size_t)al[i].workspace) : NULL;
        cw__dnnl_info info = {0};
        int listed = 0;
        if (al[i].id == CW__CPU_ALGO_DNNL && cw__cpu_dnnl_cost(NULL, &p, &info, &listed) != CW_OK) info.subbands = 0;
        double best = 1e30;
        for (int r = 0; r < reps; r++) {
            int64_t t0 = cw__now_ns();
            cw__cpu_conv_run(&p, al[i].id, x, w, b, y, ws, threads);
            double ms = (double)(cw__now_ns() - t0) * 1e-6;
            if (ms < best) best = ms;
        }
        free(ws);
        printf("C=%-4lld K=%-4lld k=%lld g=%-3lld D=%-3lld H=%-3lld W=%-5lld %-22s %9.3f ms %6.1f GFLOP/s  ws %8.2f MiB  "
               "cost %9.3f ms",
               (long long)s->c, (long long)s->k, (long long)s->ks, (long long)s->groups, (long long)d,
               (long long)s->h, (long long)s->w, al[i].name, best, flops / best * 1e-6,
               (double)al[i].workspace / (1 << 20), al[i].cost * 1e-6);
        if (info.subbands) printf("  sub-bands %d", info.subbands);
        printf("\n");
        fflush(stdout);
    }
    free(x), free(w), free(b), free(y);
}

int main(int argc, char **argv) {
    int threads = 1, ncase = 0, use_sd = 0, reps = 3;
    shape cases[16];
    int64_t frames[16] = {0};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--sd")) {
            use_sd = 1;
        } else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            threads = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            reps = atoi(argv[++i]);
            if (reps < 1) reps = 1;
        } else if (!strcmp(argv[i], "--case3") && i + 1 < argc && ncase < 16) {
            long long v[6] = {0};
            if (sscanf(argv[++i], "%lld,%lld,%lld,%lld,%lld,%lld", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5]) != 6) {
                fprintf(stderr, "--case3 C,K,k,D,H,W\n");
                return 2;
            }
            frames[ncase] = v[3];
            cases[ncase++] = (shape){v[0], v[1], v[2], v[4], v[5], 1};
        } else if (!strcmp(argv[i], "--case") && i + 1 < argc && ncase < 16) {
            shape s = {0, 0, 0, 0, 0, 1};
            long long v[6] = {0, 0, 0, 0, 0, 1};
            int n = sscanf(argv[++i], "%lld,%lld,%lld,%lld,%lld,%lld", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5]);
            if (n < 5) {
                fprintf(stderr, "--case C,K,k,H,W[,groups]\n");
                return 2;
            }
            s.c = v[0], s.k = v[1], s.ks = v[2], s.h = v[3], s.w = v[4], s.groups = v[5];
            cases[ncase++] = s;
        } else {
            fprintf(stderr, "usage: %s [--sd] [--case C,K,k,H,W[,groups]]... [--case3 C,K,k,D,H,W]... [--threads T] "
                            "[--reps R]\n", argv[0]);
            return 2;
        }
    }
    cw__cpu_blas_single();
    if (use_sd)
        for (size_t i = 0; i < sizeof sd / sizeof sd[0]; i++) run_shape(&sd[i], 0, threads, reps);
    else if (ncase == 0)
        for (size_t i = 0; i < sizeof grid / sizeof grid[0]; i++) run_shape(&grid[i], 0, threads, reps);
    for (int i = 0; i < ncase; i++) run_shape(&cases[i], frames[i], threads, reps);
    return 0;
}
