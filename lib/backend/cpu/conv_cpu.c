/* cpu convolution (NCHW / NCDHW, strided views, groups, dilation, asymmetric padding): the
 * algorithm list with its cost model (cw__cpu_conv_algos), the backend's conv hooks, and
 * GEMM = im2col/vol2col + sgemm (workspace: one column buffer per (n, group); a 1x1 conv
 * whose views are single runs reads x as the GEMM's B directly). The other algorithms live
 * in their own files: DIRECT conv_direct.c, Winograd conv_winograd.c, oneDNN conv_dnnl.c.
 *
 * x, w, bias and y are f32, f16 or bf16 (one dtype), the arithmetic is f32 throughout:
 * im2col converts x into the f32 column buffer, a half conv's weights are converted into
 * an f32 copy and sgemm writes an f32 output block whose epilogue adds the bias and rounds
 * once into y; all three are in the workspace (gemm_workspace).
 *
 * Threads: a conv call gets its thread count from the planner (fixed when the plan is
 * compiled: the backend's threads / heavy streams) and spreads im2col rows and GEMM blocks
 * (cw__cpu_sgemm: a split that depends on the shape only) over them. Each output element
 * is computed by one thread in a fixed order, so the bits never depend on the thread
 * count; helpers are made per call, only for loops of ~1 ms and more. */
#include <assert.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "backend/cpu/cpu.h"

/* ---- geometry: 2-D is treated as 3-D with D = 1 (cw__cpu_geom, cpu.h) ------------------- */
typedef cw__cpu_geom cv_geom;

/* Element off (in elements) of p, whose elements are es bytes. */
static inline void *elem_at(const void *p, int64_t off, size_t es) { return (char *)p + off * (int64_t)es; }

static int64_t align64(int64_t bytes) { return (bytes + 63) / 64 * 64; }

/* Elements of the longest suffix of (D, H, W) that is one unit-stride run; 0 when even W
 * is not unit-stride. *levels: how many dims the run spans (1 = W only). */
static int64_t cv_run(const int64_t *ext, const int64_t *st, int *levels) {
    int64_t len = 1;
    int lv = 0;
    for (int i = 2; i >= 0; i--) {
        if (ext[i] == 1 || st[2 + i] == len) {
            len *= ext[i];
            lv++;
        } else {
            break;
        }
    }
    *levels = lv;
    return lv == 0 ? 0 : len;
}

/* ---- GEMM (im2col + sgemm) ------------------------------------------------------------ */

enum { EPI_TILE = 256 }; /* f32 elements of an epilogue row chunk (stack) */

/* A 1x1, stride-1, unpadded conv whose x and y spatial blocks are single runs reads x
 * directly as the GEMM's B matrix: no column buffer. */
static int gemm_direct_b(const cv_geom *g) {
    if (g->dt != CW_F32) return 0; /* a half x is converted: the column buffer */
    for (int i = 0; i < 3; i++)
        if (g->ks[i] != 1 || g->st[i] != 1 || g->pp[i] != 0 || g->out[i] != g->in[i]) return 0;
    int lx, ly;
    int64_t P = g->out[0] * g->out[1] * g->out[2];
    if (cv_run(g->in, g->xs, &lx) != P || cv_run(g->out, g->ys, &ly) != P) return 0;
    if (g->cg > 1 && g->xs[1] < P) return 0; /* ldb */
    return 1;
}

/* 1 when the GEMM algorithm can write y and read w with these strides (f16/bf16: any,
 * since weights and output pass through f32 copies with their own layout). */
static int gemm_supported(const cv_geom *g) {
    if (g->dt != CW_F32) {
        int64_t R = g->cg * g->ks[0] * g->ks[1] * g->ks[2], P = g->out[0] * g->out[1] * g->out[2];
        return R <= INT_MAX && P <= INT_MAX && g->kg <= INT_MAX;
    }
    int lv;
    int64_t run = cv_run(g->out, g->ys, &lv);
    if (run == 0) return 0;                     /* y's W is not unit-stride */
    if (g->kg > 1 && g->ys[1] < run) return 0;  /* ldc < run */
    /* w [K, Cg, kd, kh, kw] must be a row-major matrix [K, R] with lda >= R. */
    int64_t e = 1;
    for (int i = 4; i >= 1; i--) {
        int64_t ext = i == 1 ? g->cg : g->ks[i - 2];
        if (ext != 1 && g->wsd[i] != e) return 0;
        e *= ext;
    }
    if (g->kg > 1 && g->wsd[0] < e) return 0;
    /* cblas takes int sizes and leading dimensions */
    int64_t P = g->out[0] * g->out[1] * g->out[2];
    if (P > INT_MAX || e > INT_MAX || g->kg > INT_MAX || g->wsd[0] > INT_MAX || g->ys[1] > INT_MAX ||
        g->xs[1] > INT_MAX)
        return 0;
    return 1;
}

/* Byte offsets of a half conv's f32 buffers in the GEMM workspace: the group's weights
 * [kg, R], its output block [kg, P], then the column buffer [R, P]. */
typedef struct gemm_ws {
    int64_t w32, out32, col, total;
} gemm_ws;

static gemm_ws gemm_layout(const cv_geom *g) {
    const int64_t R = g->cg * g->ks[0] * g->ks[1] * g->ks[2];
    const int64_t P = g->out[0] * g->out[1] * g->out[2];
    gemm_ws l = {0, 0, 0, 0};
    if (g->dt != CW_F32) {
        l.out32 = align64(g->kg * R * (int64_t)sizeof(float));
        l.col = l.out32 + align64(g->kg * P * (int64_t)sizeof(float));
    }
    l.total = gemm_direct_b(g) ? 0 : l.col + R * P * (int64_t)sizeof(float);
    return l;
}

static int64_t gemm_workspace(const cv_geom *g) { return gemm_layout(g).total; }

/* col[R, P] (f32) for image n, group gi: row r = (c, kd, kh, kw), column = (od, oh, ow);
 * rows [r_lo, r_hi) only (rows are independent, so threads split them). An f16/bf16 x is
 * converted on the copy. */
static void im2col(const cv_geom *g, const void *x, int64_t n, int64_t gi, float *col, int64_t r_lo, int64_t r_hi) {
    const int64_t Do = g->out[0], Ho = g->out[1], Wo = g->out[2];
    const int64_t P = Do * Ho * Wo;
    const int64_t kvol = g->ks[0] * g->ks[1] * g->ks[2];
    for (int64_t r = r_lo; r < r_hi; r++) {
        const int64_t c = r / kvol, kd = r / (g->ks[1] * g->ks[2]) % g->ks[0], kh = r / g->ks[2] % g->ks[1],
                      kw = r % g->ks[2];
        const int64_t xc = n * g->xs[0] + (gi * g->cg + c) * g->xs[1]; /* element offset */
        float *dst = col + r * P;
        int64_t offw = kw * g->dl[2] - g->pp[2], wlo, whi;
        cw__cpu_conv_range(offw, g->st[2], g->in[2], Wo, &wlo, &whi);
        for (int64_t od = 0; od < Do; od++) {
            int64_t id = od * g->st[0] - g->pp[0] + kd * g->dl[0];
            for (int64_t oh = 0; oh < Ho; oh++) {
                int64_t ih = oh * g->st[1] - g->pp[1] + kh * g->dl[1];
                float *row = dst + (od * Ho + oh) * Wo;
                if (id < 0 || id >= g->in[0] || ih < 0 || ih >= g->in[1]) {
                    memset(row, 0, (size_t)Wo * sizeof(float));
                    continue;
                }
                const int64_t src = xc + id * g->xs[2] + ih * g->xs[3];
                if (wlo > 0) memset(row, 0, (size_t)wlo * sizeof(float));
                if (whi > wlo) {
                    const int64_t sx = g->st[2] * g->xs[4];
                    const int64_t s0 = src + (offw + wlo * g->st[2]) * g->xs[4];
                    if (g->dt == CW_F32 && sx == 1)
                        memcpy(row + wlo, (const float *)x + s0, (size_t)(whi - wlo) * sizeof(float));
                    else
                        cw__cpu_load_f32(row + wlo, elem_at(x, s0, g->es), g->dt, whi - wlo, sx);
                }
                if (whi < Wo) memset(row + whi, 0, (size_t)(Wo - whi) * sizeof(float));
            }
        }
    }
}

typedef struct im2col_arg {
    const cv_geom *g;
    const void *x;
    int64_t n, gi;
    float *col;
} im2col_arg;

static void im2col_range(void *p, int64_t lo, int64_t hi) {
    im2col_arg *a = p;
    im2col(a->g, a->x, a->n, a->gi, a->col, lo, hi);
}

static void conv_gemm(const cv_geom *g, const float *x, const float *w, const float *b, float *y, void *ws_,
                      int threads) {
    float *ws = ws_;
    const int64_t Do = g->out[0], Ho = g->out[1], Wo = g->out[2];
    const int64_t P = Do * Ho * Wo;
    const int64_t R = g->cg * g->ks[0] * g->ks[1] * g->ks[2];
    int levels;
    const int64_t run = cv_run(g->out, g->ys, &levels);
    assert(run > 0);
    const int direct_b = gemm_direct_b(g);
    const int64_t lda = g->kg > 1 ? g->wsd[0] : R;
    const int64_t ldc = g->kg > 1 ? g->ys[1] : run;
    /* Runs: the outer (not collapsed) spatial dims are looped over. */
    const int64_t outer_d = levels >= 3 ? 1 : Do;
    const int64_t outer_h = levels >= 2 ? 1 : Ho;
    for (int64_t n = 0; n < g->n; n++) {
        for (int64_t gi = 0; gi < g->g; gi++) {
            const float *B;
            int64_t ldb;
            if (direct_b) {
                B = x + n * g->xs[0] + gi * g->cg * g->xs[1];
                ldb = g->cg > 1 ? g->xs[1] : P;
            } else {
                im2col_arg ia = {g, x, n, gi, ws};
                /* thread helpers only pay off for column buffers of ~1 MiB and more */
                cw__cpu_parallel(R * P >= (1 << 18) ? threads : 1, R, im2col_range, &ia);
                B = ws;
                ldb = P;
            }
            const float *A = w + gi * g->kg * g->wsd[0];
            float *yg = y + n * g->ys[0] + gi * g->kg * g->ys[1];
            for (int64_t od = 0; od < outer_d; od++) {
                for (int64_t oh = 0; oh < outer_h; oh++) {
                    /* column index of the run's first output position */
                    int64_t col0 = (od * Ho + oh) * Wo;
                    float *C = yg + od * g->ys[2] + oh * g->ys[3];
                    cw__gemm_params gp = {0, 0, g->kg, run, R, 1.0f, 0.0f, A, lda, B + col0, ldb, C, ldc, threads};
                    cw__cpu_sgemm(&gp, threads);
                    if (g->has_bias) {
                        for (int64_t m = 0; m < g->kg; m++) {
                            const float bv = b[gi * g->kg + m];
                            float *cr = C + m * g->ys[1];
                            for (int64_t j = 0; j < run; j++) cr[j] += bv;
                        }
                    }
                }
            }
        }
    }
}

/* ---- GEMM in f16/bf16: f32 weights and output block in the workspace -------------------- */

typedef struct half_epi_arg {
    const cv_geom *g;
    const float *out32; /* [kg, P] */
    const void *b;
    void *y;
    int64_t n, gi;
} half_epi_arg;

/* Output channels [lo, hi) of the group: bias added in f32, rounded once into y. */
static void half_epilogue(void *p, int64_t lo, int64_t hi) {
    const half_epi_arg *a = p;
    const cv_geom *g = a->g;
    const int64_t Do = g->out[0], Ho = g->out[1], Wo = g->out[2], P = Do * Ho * Wo;
    float row[EPI_TILE];
    for (int64_t m = lo; m < hi; m++) {
        const int64_t k = a->gi * g->kg + m;
        const float bv = g->has_bias ? cw__cpu_load1(a->b, g->dt, k) : 0.0f;
        for (int64_t od = 0; od < Do; od++)
            for (int64_t oh = 0; oh < Ho; oh++) {
                const float *src = a->out32 + m * P + (od * Ho + oh) * Wo;
                const int64_t yo = a->n * g->ys[0] + k * g->ys[1] + od * g->ys[2] + oh * g->ys[3];
                for (int64_t w0 = 0; w0 < Wo; w0 += EPI_TILE) {
                    const int64_t t = Wo - w0 < EPI_TILE ? Wo - w0 : EPI_TILE;
                    for (int64_t i = 0; i < t; i++) row[i] = src[w0 + i] + bv;
                    cw__cpu_store_f32(elem_at(a->y, yo + w0 * g->ys[4], g->es), g->dt, g->ys[4], row, t);
                }
            }
    }
}

/* The group's weights as a row-major f32 [kg, R] matrix. */
static void half_weights(const cv_geom *g, const void *w, float *w32, int64_t gi) {
    const int64_t R = g->cg * g->ks[0] * g->ks[1] * g->ks[2];
    for (int64_t m = 0; m < g->kg; m++)
        for (int64_t c = 0; c < g->cg; c++)
            for (int64_t kd = 0; kd < g->ks[0]; kd++)
                for (int64_t kh = 0; kh < g->ks[1]; kh++) {
                    const int64_t wo = (gi * g->kg + m) * g->wsd[0] + c * g->wsd[1] + kd * g->wsd[2] + kh * g->wsd[3];
                    float *dst = w32 + m * R + ((c * g->ks[0] + kd) * g->ks[1] + kh) * g->ks[2];
                    cw__cpu_load_f32(dst, elem_at(w, wo, g->es), g->dt, g->ks[2], g->wsd[4]);
                }
}

/* Per group: weights -> f32, then per image: im2col (converting x), one sgemm over all P
 * columns into the f32 block, and the epilogue into y (any strides). */
static void conv_gemm_half(const cv_geom *g, const void *x, const void *w, const void *b, void *y, void *ws,
                           int threads) {
    const int64_t P = g->out[0] * g->out[1] * g->out[2];
    const int64_t R = g->cg * g->ks[0] * g->ks[1] * g->ks[2];
    const gemm_ws l = gemm_layout(g);
    float *w32 = (float *)((char *)ws + l.w32), *out32 = (float *)((char *)ws + l.out32);
    float *col = (float *)((char *)ws + l.col);
    for (int64_t gi = 0; gi < g->g; gi++) {
        half_weights(g, w, w32, gi);
        for (int64_t n = 0; n < g->n; n++) {
            im2col_arg ia = {g, x, n, gi, col};
            cw__cpu_parallel(R * P >= (1 << 18) ? threads : 1, R, im2col_range, &ia);
            cw__gemm_params gp = {0, 0, g->kg, P, R, 1.0f, 0.0f, w32, R, col, P, out32, P, threads};
            cw__cpu_sgemm(&gp, threads);
            half_epi_arg ea = {g, out32, b, y, n, gi};
            cw__cpu_parallel(g->kg * P >= (1 << 18) ? threads : 1, g->kg, half_epilogue, &ea);
        }
    }
}

/* ---- entry points --------------------------------------------------------------------- */

/* DNNL: the plan's workspace (from its descriptors: no primitive is made). */
static int64_t dnnl_workspace(const cw__conv_problem *p) {
    cw__dnnl_info info;
    int listed;
    if (cw__cpu_dnnl_cost(NULL, p, &info, &listed) != CW_OK) return -1;
    return info.workspace;
}

int64_t cw__cpu_conv_workspace(const cw__conv_problem *p, int algo) {
    if (algo == CW__CPU_ALGO_DNNL) return dnnl_workspace(p);
    if (algo == CW__CPU_ALGO_DIRECT) return 0;
    cv_geom g;
    cw__cpu_geom_make(p, &g);
    if (CW__CPU_IS_WINO(algo))
        return cw__cpu_wino_supported(&g) ? cw__cpu_wino_workspace(&g, algo == CW__CPU_ALGO_WINOGRAD_KB) : -1;
    return gemm_workspace(&g);
}

/* threads: for im2col rows, GEMM blocks and direct rows. */
static void conv_run(const cw__conv_problem *p, int algo, const void *x, const void *w, const void *b, void *y,
                     void *ws, int threads) {
    if (algo == CW__CPU_ALGO_DNNL) {
        cw__dnnl_plan *pl;
        char msg[192] = "";
        cw_status st = cw__cpu_dnnl_plan_get(NULL, p, &pl);
        if (st == CW_OK) {
            st = cw__cpu_dnnl_run(pl, p, x, w, b, y, ws, threads, msg, sizeof msg);
            cw__cpu_dnnl_release(pl);
            if (st != CW_OK) cw__log(NULL, CW_LOG_ERROR, "%s", msg);
        }
        return;
    }
    cv_geom g;
    cw__cpu_geom_make(p, &g);
    if (algo == CW__CPU_ALGO_GEMM) {
        assert(gemm_supported(&g));
        if (g.dt == CW_F32) conv_gemm(&g, x, w, b, y, ws, threads);
        else conv_gemm_half(&g, x, w, b, y, ws, threads);
    } else if (CW__CPU_IS_WINO(algo)) {
        assert(cw__cpu_wino_supported(&g));
        cw__cpu_wino_run(&g, x, w, b, y, ws, algo == CW__CPU_ALGO_WINOGRAD_KB, threads);
    } else {
        cw__cpu_conv_direct(p, x, w, b, y, threads);
    }
}

void cw__cpu_conv_run(const cw__conv_problem *p, int algo, const void *x, const void *w, const void *b, void *y,
                      void *ws, int threads) {
    conv_run(p, algo, x, w, b, y, ws, threads);
}

/* Relative cost model, in estimated nanoseconds on one core, fitted to this backend on a
 * 2-core AVX-512 machine: sgemm ~60 GFLOP/s for >= 40 output channels per group, falling
 * to ~11 for one (a gemv); ~1 us per sgemm call; writing the column buffer ~0.3 ns per
 * element while it fits in cache (<= 16 MiB per image and group), ~2 ns beyond (DRAM
 * write + read back); direct ~14 GFLOP/s. Only the order of the list matters. */
static double cost_gemm(const cv_geom *g, double flops) {
    int lv;
    int64_t run = cv_run(g->out, g->ys, &lv);
    double calls = (double)g->n * (double)g->g * (double)(g->out[0] * g->out[1] * g->out[2] / (run > 0 ? run : 1));
    double eff = (double)(g->kg + 8) / 48.0;
    if (eff > 1.0) eff = 1.0;
    const int64_t R = g->cg * g->ks[0] * g->ks[1] * g->ks[2], P = g->out[0] * g->out[1] * g->out[2];
    int64_t ws = gemm_direct_b(g) ? 0 : R * P * (int64_t)sizeof(float);
    double per_elem = ws <= (INT64_C(16) << 20) ? 0.3 : 2.0;
    double col = (double)ws / sizeof(float) * (double)(g->n * g->g);
    /* f16/bf16: one sgemm per (n, group), plus converting the weights and writing the f32
     * output block back (~0.5 ns per element) */
    if (g->dt != CW_F32)
        return flops / (60.0 * eff) + (double)(g->n * g->g) * 1000.0 + col * per_elem +
               0.5 * (double)g->g * (double)g->kg * ((double)R + (double)g->n * (double)P);
    return flops / (60.0 * eff) + calls * 1000.0 + col * per_elem;
}

/* DIRECT (conv_direct.c): ~14 GFLOP/s (the AVX-512 fit above) plus ~1 us per call. */
static double cost_direct(double flops) { return flops / 14.0 + 1000.0; }

/* oneDNN, fitted to bench_conv_algos on this project's 2-core AVX2 development machine
 * (AMD EPYC, jit:avx2 kernels, one thread, 22 shapes, C and K 3..512, k 1..7, W 64..1024,
 * loaded machine): 3x3 convs ran at 31-76 GFLOP/s (about 48 GFLOP/s x sqrt(K/32), capped
 * at 48, times K/ceil8(K) for the output channels padded to blocks of 8), 1x1 at ~35,
 * depthwise at ~16; reorders ~0.1 ns per byte moved; ~10 us per sub-band. The fit is
 * within 0.7-2.0x of every measurement. The same run measured im2col+GEMM at 0.72x of
 * what cost_gemm (fitted on an AVX-512 machine) predicts, so the sum is scaled by 0.72
 * into cost_gemm's units: oneDNN then comes first for every 3x3/5x5/7x7 conv with K >= 8
 * (it measured 1.1-6x faster than im2col there), and cpu_gemm_1x1 (same speed, no
 * workspace) stays first for 1x1. cost_direct's 14 GFLOP/s was fitted on an AVX-512
 * machine; on the quiet AVX2 one direct ran K = 3 and depthwise convs at 11-13.6 GFLOP/s,
 * within 0.9-1.2x of oneDNN's times (bench/RESULTS.md, issue 17's refit), so direct, listed
 * first there, is within the model's error of the best and needs no workspace. (The
 * 3-5 GFLOP/s of the loaded fitting run above were the load's.) */
static double cost_dnnl(const cv_geom *g, const cw__dnnl_info *info) {
    double rate;
    if (g->cg == 1 && g->kg == 1) {
        rate = 16.0;
    } else if (g->ks[0] * g->ks[1] * g->ks[2] == 1) {
        rate = 35.0;
    } else {
        double kb = (double)((g->kg + 7) / 8 * 8);
        rate = 48.0 * sqrt(kb < 32.0 ? kb / 32.0 : 1.0) * (double)g->kg / kb;
    }
    return 0.72 * (info->flops / rate + 0.1 * (double)info->moved_bytes + 1e4 * (double)info->subbands);
}

/* Winograd F(2x2,3x3), fitted to bench_conv_algos (grid and --sd, one thread, each row the
 * best of 5 runs of best-of-3; load average 1.6-2.6 on the 2-core AVX2 machine, 25 shapes,
 * C 3..512, K 3..512, W 64..1024) by non-negative least squares on the relative error:
 *   ns = 32 tiles K (C + 8) / 82.5      the 16 GEMMs at 82.5 GFLOP/s, C + 8 for their
 *                                       per-call and packing overheads
 *      + 0.61 x 16 tiles (C + K)        the transforms: V and M written and read
 *      + 2.96 x 16 C K                  U made every call
 * (tiles: 2x2 output tiles). It is within 0.76-1.24x of every measurement (rms 10 %), and
 * within 0.78-1.20x of a second set of 5 runs (load average 3); it errs most for C <= 4
 * and K = 3. The same runs measured oneDNN at 0.92-1.46 (median 1.34, then 1.32) of what
 * cost_dnnl predicts, so the sum is scaled by 1.34 into cost_dnnl's units. Measured (ms,
 * Winograd vs oneDNN): 512->512 8x256 67.3 vs 102.8, 256->256 8x512 35.2 vs 51.0,
 * 128->128 8x1024 19.6 vs 26.3, 64->64 16x1024 12.3 vs 14.4, 32->32 32x1024 9.0 vs 7.8,
 * 16->16 3.6 vs 2.6, 8->8 1.6 vs 1.0, 3->32 3.8 vs 1.0, 128->3 16x1024 7.4 vs 7.9 (direct
 * 8.8). So `auto` picks Winograd for 3x3 convs from 64 channels on and oneDNN below; of the
 * 25 fitted shapes it picks the fastest algorithm for every one but 32->3 32x1024, where
 * it takes direct (4.0 ms) over Winograd (2.6-3.0 ms). f16/bf16 use the same cost: they
 * ran at 0.95-1.15x f32's time (bench_half), and their other algorithm, im2col, at 1.6-1.9x
 * Winograd's. bench/RESULTS.md has the tables. */
static double cost_wino(const cv_geom *g) {
    const double tiles = (double)g->n * (double)g->out[0] * (double)((g->out[1] + 1) / 2) * (double)((g->out[2] + 1) / 2);
    const double c = (double)g->c, k = (double)g->k;
    return 1.34 * (32.0 * tiles * k * (c + 8.0) / 82.5 + 0.61 * 16.0 * tiles * (c + k) + 2.96 * 16.0 * c * k);
}

cw_status cw__cpu_conv_algos(cw__backend *be, const cw__conv_problem *p, cw__conv_algo *out, int max, int *n) {
    cw_status st = CW_OK;
    cv_geom g;
    cw__cpu_geom_make(p, &g);
    double flops = 2.0 * (double)g.n * (double)g.k * (double)(g.out[0] * g.out[1] * g.out[2]) * (double)g.cg *
                   (double)(g.ks[0] * g.ks[1] * g.ks[2]);
    cw__conv_algo list[CW__CPU_ALGO_COUNT];
    int cnt = 0;
    if (cw__cpu_dnnl_compiled()) {
        /* costed from descriptors: primitives are made only for the patches a plan keeps
         * (cw__cpu_conv_prepare) */
        cw__dnnl_info info;
        int listed = 0;
        st = cw__cpu_dnnl_cost(be ? be->ctx : NULL, p, &info, &listed);
        if (st == CW_ERR_OUT_OF_MEMORY) return st;
        if (st == CW_OK) {
            if (listed) {
                cw__conv_algo *a = &list[cnt++];
                memset(a, 0, sizeof *a);
                a->id = CW__CPU_ALGO_DNNL;
                snprintf(a->name, sizeof a->name, "cpu_dnnl_%s", info.impl);
                a->workspace = info.workspace;
                a->cost = cost_dnnl(&g, &info);
            }
        } else {
            /* oneDNN failed unexpectedly for this shape: the other algorithms still run it */
            cw__log(be ? be->ctx : NULL, CW_LOG_DEBUG, "cpu conv_algos: oneDNN not listed for this conv");
        }
    }
    if (gemm_supported(&g)) {
        cw__conv_algo *a = &list[cnt++];
        memset(a, 0, sizeof *a);
        a->id = CW__CPU_ALGO_GEMM;
        snprintf(a->name, sizeof a->name, "%s", gemm_direct_b(&g) ? "cpu_gemm_1x1" : "cpu_im2col_gemm");
        a->workspace = gemm_workspace(&g);
        a->cost = cost_gemm(&g, flops);
    }
    if (cw__cpu_wino_supported(&g)) {
        cw__conv_algo *a = &list[cnt++];
        memset(a, 0, sizeof *a);
        a->id = CW__CPU_ALGO_WINOGRAD;
        snprintf(a->name, sizeof a->name, "%s", "cpu_winograd_2x3");
        a->workspace = cw__cpu_wino_workspace(&g, 0);
        a->cost = cost_wino(&g);
        /* the grouped variant: less workspace, at 1.2x the time (conv_winograd.c), so the
         * planner takes it only where the other does not fit */
        if (cw__cpu_wino_workspace(&g, 1) < a->workspace) {
            cw__conv_algo *k = &list[cnt++];
            *k = *a;
            k->id = CW__CPU_ALGO_WINOGRAD_KB;
            snprintf(k->name, sizeof k->name, "cpu_winograd_2x3_k%lld", (long long)cw__cpu_wino_kblock(&g, 1));
            k->workspace = cw__cpu_wino_workspace(&g, 1);
            k->cost = 1.2 * a->cost;
        }
    }
    {
        cw__conv_algo *a = &list[cnt++];
        memset(a, 0, sizeof *a);
        a->id = CW__CPU_ALGO_DIRECT;
        snprintf(a->name, sizeof a->name, "%s", "cpu_direct");
        a->workspace = 0;
        a->cost = cost_direct(flops);
    }
    for (int i = 1; i < cnt; i++) /* cheapest first; ties keep the order above */
        for (int j = i; j > 0 && list[j].cost < list[j - 1].cost; j--) {
            cw__conv_algo t = list[j];
            list[j] = list[j - 1];
            list[j - 1] = t;
        }
    int k = cnt < max ? cnt : max;
    for (int i = 0; i < k; i++) out[i] = list[i];
    *n = k;
    return CW_OK;
}

/* Compile time (the scheduler calls it for every conv task, with the views the run will
 * give it: the plan's key holds x's and y's strides): makes or finds the oneDNN plan of
 * each DNNL task, so no primitive is created inside a run. A plan whose workspace
 * exceeds ws_cap (the planner sizes it from the same problem, so only as a guard) is
 * replaced by cpu_direct, which needs none. */
cw_status cw__cpu_conv_prepare(cw__backend *be, const cw__conv_problem *p, const cw__conv_algo *algo, int64_t ws_cap,
                               cw__conv_algo *used) {
    *used = *algo;
    used->prepared = NULL;
    if (algo->id != CW__CPU_ALGO_DNNL) return CW_OK;
    cw__dnnl_plan *pl;
    CW_TRY(cw__cpu_dnnl_plan_get(be ? be->ctx : NULL, p, &pl));
    cw__dnnl_info info;
    cw__cpu_dnnl_info(pl, &info);
    used->prepared = pl; /* held by the task until cw__cpu_conv_release */
    if (ws_cap >= 0 && info.workspace > ws_cap) {
        cw__cpu_dnnl_release(pl);
        memset(used, 0, sizeof *used);
        used->id = CW__CPU_ALGO_DIRECT;
        snprintf(used->name, sizeof used->name, "%s", "cpu_direct");
        used->threads = algo->threads;
    }
    return CW_OK;
}

void cw__cpu_conv_release(cw__backend *be, void *prepared) { cw__cpu_dnnl_release(prepared); }

/* ---- the asynchronous hook ------------------------------------------------------------ */
typedef struct conv_job {
    cw__conv_problem prob;
    int algo;
    int threads;
    const void *x, *w, *b;
    void *y, *ws;
    cw__dnnl_plan *plan; /* DNNL: held from enqueue to the end of the job */
    cw_context *ctx;
} conv_job;

static void conv_job_run(void *arg) {
    conv_job *j = arg;
    if (j->plan) {
        char msg[192] = "";
        if (cw__cpu_dnnl_run(j->plan, &j->prob, j->x, j->w, j->b, j->y, j->ws, j->threads, msg, sizeof msg) != CW_OK)
            cw__log(j->ctx, CW_LOG_ERROR, "%s (the output holds NaN)", msg);
        return;
    }
    conv_run(&j->prob, j->algo, j->x, j->w, j->b, j->y, j->ws, j->threads);
}

static void conv_job_fin(void *arg) {
    conv_job *j = arg;
    cw__cpu_dnnl_release(j->plan);
    cw__free(j);
}

cw_status cw__cpu_conv_forward(cw__backend *be, cw__stream *s, const cw__conv_problem *p, const cw__conv_algo *algo,
                               const void *x, const void *w, const void *b, void *y, void *ws, int64_t ws_bytes) {
    cw_context *ctx = be->ctx;
    if (!algo || algo->id < 0 || algo->id >= CW__CPU_ALGO_COUNT)
        return cw__error(ctx, CW_ERR_INVALID_ARG, "cpu conv_forward: algo %d is not a cpu algorithm",
                         algo ? algo->id : -1);
    if (!x) /* ops.c lets an empty x be NULL; the cpu algorithms index it all the same */
        return cw__error(ctx, CW_ERR_INVALID_ARG, "cpu conv_forward: x is NULL");
    cv_geom g;
    cw__cpu_geom_make(p, &g);
    if (algo->id == CW__CPU_ALGO_GEMM && !gemm_supported(&g))
        return cw__error(ctx, CW_ERR_UNSUPPORTED,
                         "cpu conv_forward: cpu_im2col_gemm needs y's W stride 1 and contiguous weights");
    if (CW__CPU_IS_WINO(algo->id) && !cw__cpu_wino_supported(&g))
        return cw__error(ctx, CW_ERR_UNSUPPORTED,
                         "cpu conv_forward: cpu_winograd_2x3 needs a 3x3 kernel (depth 1), stride 1, dilation 1 "
                         "and groups 1");
    cw__dnnl_plan *plan = NULL;
    int64_t need = algo->id == CW__CPU_ALGO_GEMM       ? gemm_workspace(&g)
                   : CW__CPU_IS_WINO(algo->id) ? cw__cpu_wino_workspace(&g, algo->id == CW__CPU_ALGO_WINOGRAD_KB)
                                               : 0;
    if (algo->id == CW__CPU_ALGO_DNNL) {
        /* the task's own (cw__cpu_conv_prepare), else found in or added to the plan cache */
        if (!algo->prepared || !cw__cpu_dnnl_hold(algo->prepared, p)) CW_TRY(cw__cpu_dnnl_plan_get(ctx, p, &plan));
        else plan = algo->prepared;
        cw__dnnl_info info;
        cw__cpu_dnnl_info(plan, &info);
        need = info.workspace;
    }
    if (need > 0 && (!ws || ws_bytes < need)) {
        cw__cpu_dnnl_release(plan);
        return cw__error(ctx, CW_ERR_INVALID_ARG, "cpu conv_forward: workspace %lld bytes at %p < %lld needed by %s",
                         (long long)ws_bytes, ws, (long long)need, algo->name);
    }
    conv_job *j = cw__malloc(sizeof *j);
    if (!j) {
        cw__cpu_dnnl_release(plan);
        return cw__error(ctx, CW_ERR_OUT_OF_MEMORY, "cpu conv_forward: out of host memory for the closure");
    }
    j->prob = *p;
    j->algo = algo->id;
    j->threads = algo->threads > 0 ? algo->threads : cw__cpu_blas_threads(be);
    j->x = x;
    j->w = w;
    j->b = p->has_bias ? b : NULL;
    j->y = y;
    j->ws = ws;
    j->plan = plan;
    j->ctx = ctx;
    return cw__cpu_enqueue(be, s, conv_job_run, j, conv_job_fin);
}
