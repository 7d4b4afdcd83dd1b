/* One single-threaded f32 GEMM on the shapes the cpu backend runs (Winograd's 16 products per
 * block of 128 tiles, im2col blocks, 1x1 convs): OpenBLAS's cblas_sgemm against
 * cw__cpu_gemm1 (oneDNN's dnnl_sgemm where convweave is built with oneDNN), best of 3.
 *
 *   bench_gemm                 prints OpenBLAS's core, one line per shape: GFLOP/s of each
 *   OPENBLAS_CORETYPE=SkylakeX bench_gemm    OpenBLAS on another kernel set
 *   ONEDNN_MAX_CPU_ISA=AVX2 bench_gemm       oneDNN limited to AVX2 */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "backend/cpu/cpu.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static float *fill(int64_t n) {
    float *p = malloc((size_t)n * sizeof *p);
    if (!p) {
        fprintf(stderr, "bench_gemm: out of memory\n");
        exit(1);
    }
    for (int64_t i = 0; i < n; i++) p[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    return p;
}

int main(void) {
    /* M x N x K: Winograd at 512/256/128 channels (K x 128 tiles x C), a 1x1 conv over 1024
     * pixels, an im2col block (K x 512 columns x 9 C), Winograd at 768 channels, a 1x1 conv 512 -> 256,
     * attention's two products for a 256-query chunk of 4096 tokens at 512 channels */
    static const int shapes[][3] = {{512, 128, 512}, {256, 128, 256}, {128, 128, 128},
                                    {128, 1024, 128}, {512, 512, 4608}, {128, 512, 1152},
                                    {768, 128, 768}, {256, 1024, 512}, {256, 4096, 512}, {256, 512, 4096}};
    cw__cpu_blas_single();
    printf("OpenBLAS core %s; cw__cpu_gemm1 through %s\n", openblas_get_corename(),
           cw__cpu_dnnl_compiled() ? "oneDNN's dnnl_sgemm" : "OpenBLAS");
    printf("%6s %6s %6s %12s %12s %8s\n", "M", "N", "K", "OpenBLAS GF/s", "gemm1 GF/s", "ratio");
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
        float *a = fill((int64_t)m * k), *b = fill((int64_t)k * n), *c = fill((int64_t)m * n);
        const double flop = 2.0 * m * n * k;
        const int reps = (int)(2e10 / flop) + 1;
        double best[2] = {1e30, 1e30};
        for (int t = 0; t < 3; t++) {
            double t0 = now();
            for (int r = 0; r < reps; r++)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a, k, b, n, 0.0f, c, n);
            double t1 = now();
            for (int r = 0; r < reps; r++) cw__cpu_gemm1(0, 0, m, n, k, 1.0f, a, k, b, n, 0.0f, c, n);
            double t2 = now();
            if (t1 - t0 < best[0]) best[0] = t1 - t0;
            if (t2 - t1 < best[1]) best[1] = t2 - t1;
        }
        printf("%6d %6d %6d %12.0f %12.0f %7.2fx\n", m, n, k, flop * reps / best[0] * 1e-9,
               flop * reps / best[1] * 1e-9, best[0] / best[1]);
        free(a), free(b), free(c);
    }
    return 0;
}
