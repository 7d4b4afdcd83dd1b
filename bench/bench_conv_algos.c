/* Per-algorithm timing of single cpu conv patches: every algorithm the cpu backend lists
 * for a shape, run alone on one thread (what the cost model in conv_cpu.c estimates), with
 * its predicted cost. This is the data the cost model is fitted to.
 *
 *   bench_conv_algos                   the fitting grid (C = K in 8..512, k 1/3, W 64..1024)
 *   bench_conv_algos --sd              the SD VAE decoder's 3x3 convs (4..512 channels, W 64..1024)
 *   bench_conv_algos --case C,K,k,H,W  one shape (N = 1, stride 1, "same" padding)
 *   --threads T                        threads per call (default 1)
 * Output: one line per (shape, algorithm): ms (best of 3), GFLOP/s, workspace, cost. */
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

static void run_shape(const shape *s, int threads) {
    cw__conv_problem p;
    memset(&p, 0, sizeof p);
    int64_t pad = s->ks / 2;
    p.spatial = 2;
    p.groups = s->groups;
    p.has_bias = 1;
    for (int i = 0; i < 3; i++) p.stride[i] = p.dilation[i] = 1;
    p.pad_pre[0] = p.pad_post[0] = p.pad_pre[1] = p.pad_post[1] = pad;
    int64_t xd[4] = {1, s->c, s->h, s->w}, wd[4] = {s->k, s->c / s->groups, s->ks, s->ks}, yd[4] = {1, s->k, s->h, s->w};
    if (cw_tensor_desc_make(&p.x, CW_F32, 4, xd) != CW_OK || cw_tensor_desc_make(&p.w, CW_F32, 4, wd) != CW_OK ||
        cw_tensor_desc_make(&p.y, CW_F32, 4, yd) != CW_OK) {
        fprintf(stderr, "bad shape\n");
        exit(1);
    }
    cw__conv_algo al[8];
    int na = 0;
    if (cw__cpu_conv_algos(NULL, &p, al, 8, &na) != CW_OK) {
        fprintf(stderr, "conv_algos failed\n");
        exit(1);
    }
    float *x = rnd(s->c * s->h * s->w), *w = rnd(s->k * (s->c / s->groups) * s->ks * s->ks), *b = rnd(s->k);
    float *y = rnd(s->k * s->h * s->w);
    double flops = 2.0 * (double)s->k * (double)(s->c / s->groups) * (double)(s->ks * s->ks) * (double)(s->h * s->w);
    for (int i = 0; i < na; i++) {
        float *ws = al[i].workspace ? malloc((size_t)al[i].workspace) : NULL;
        double best = 1e30;
        for (int r = 0; r < 3; r++) {
            int64_t t0 = cw__now_ns();
            cw__cpu_conv_run(&p, al[i].id, x, w, b, y, ws, threads);
            double ms = (double)(cw__now_ns() - t0) * 1e-6;
            if (ms < best) best = ms;
        }
        free(ws);
        printf("C=%-4lld K=%-4lld k=%lld g=%-3lld H=%-3lld W=%-5lld %-22s %9.3f ms %6.1f GFLOP/s  ws %8.2f MiB  cost %9.3f ms\n",
               (long long)s->c, (long long)s->k, (long long)s->ks, (long long)s->groups, (long long)s->h,
               (long long)s->w, al[i].name, best, flops / best * 1e-6, (double)al[i].workspace / (1 << 20),
               al[i].cost * 1e-6);
        fflush(stdout);
    }
    free(x), free(w), free(b), free(y);
}

int main(int argc, char **argv) {
    int threads = 1, ncase = 0, use_sd = 0;
    shape cases[16];
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--sd")) {
            use_sd = 1;
        } else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            threads = atoi(argv[++i]);
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
            fprintf(stderr, "usage: %s [--sd] [--case C,K,k,H,W[,groups]]... [--threads T]\n", argv[0]);
            return 2;
        }
    }
    cw__cpu_blas_single();
    if (use_sd)
        for (size_t i = 0; i < sizeof sd / sizeof sd[0]; i++) run_shape(&sd[i], threads);
    else if (ncase == 0)
        for (size_t i = 0; i < sizeof grid / sizeof grid[0]; i++) run_shape(&grid[i], threads);
    for (int i = 0; i < ncase; i++) run_shape(&cases[i], threads);
    return 0;
}
