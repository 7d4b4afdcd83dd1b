/* Winograd F(2x2,3x3) convolution (CW__CPU_ALGO_WINOGRAD): each 2x2 output tile is
 * A^T [(G g G^T) . (B^T d B)] A over its 4x4 input tile d, so a 3x3 conv's 9 products per
 * output become 16 per 4 outputs (2.25x fewer). The 16 element-wise products, summed over
 * the input channels, are 16 GEMMs M_ij[K x T] = U_ij[K x C] V_ij[C x T] over a block of T
 * tiles; the transforms only add, subtract and halve. Error: docs/determinism.md.
 *
 * The output channels go in groups of Kb (cw__cpu_wino_kblock: all K, or in the grouped
 * variant CW__CPU_ALGO_WINOGRAD_KB half of K up to 128), each group through every block of T
 * tiles: the workspace holds one group's U (its weights transformed, every call) and one
 * block's V and M, so grouped it does not grow with K x C (a 512->512 conv: 9 MiB, not 24).
 * Each group transforms the input again (1/Kb of a GEMM's work per value; not when one block
 * holds every tile). Kb and T are functions of the shape and the variant only. A team of threads runs
 * the phases of each step (group, block) with barriers between them: input transform (split
 * over channels), the 16 GEMMs (split over ij, each one single-threaded cw__cpu_gemm1 call of
 * a fixed shape), output transform (split over the group's output channels, overlapping the
 * next step's weight and input transforms). Every value is computed by one thread in a fixed
 * order, so the bits never depend on the thread count.
 * x and y are strided views in f32, f16 or bf16 (converted on the transforms' loads and
 * stores); 3-D problems with a kernel depth of 1 are planes of 2-D ones. */
#include <cblas.h>
#include <limits.h>
#include <string.h>

#include "backend/cpu/cpu.h"

enum { WINO_SEG = 128 }; /* tiles per row segment a transform handles at once (stack rows) */

typedef struct wino_run {
    const cw__cpu_geom *g;
    const void *x, *w, *b;
    void *y;
    float *u, *v, *m;             /* [16][Kb][C], [16][C][nt], [16][Kb][nt] */
    int64_t tw, th, plane, tiles; /* tiles per row, tile rows, tiles per plane, all tiles */
    int64_t T, blocks;            /* tiles per block (the last may have fewer) */
    int64_t kb, groups;           /* output channels per group (the last may have fewer) */
} wino_run;

static inline void *at(const void *p, int64_t off, size_t es) { return (char *)p + off * (int64_t)es; }

int cw__cpu_wino_supported(const cw__cpu_geom *g) {
    if (g->g != 1 || g->ks[0] != 1 || g->ks[1] != 3 || g->ks[2] != 3) return 0;
    for (int i = 1; i < 3; i++)
        if (g->st[i] != 1 || g->dl[i] != 1) return 0;
    /* cblas takes int sizes (K, C, a block's tiles) */
    return g->c <= INT_MAX / 16 && g->k <= INT_MAX / 16 && g->out[2] <= INT_MAX / 2;
}

static int64_t tiles_of(const cw__cpu_geom *g) {
    return g->n * g->out[0] * ((g->out[1] + 1) / 2) * ((g->out[2] + 1) / 2);
}

/* Tiles per block: 128, or the problem's tiles when fewer. Each block's 16 GEMMs pack U
 * afresh (OpenBLAS has no packed-operand interface), so narrow blocks pay for it: on the
 * 2-core AVX2 machine (one thread, cw__cpu_conv_run on 16 rows, loaded: runs spread by
 * about 20 %) 512 channels ran 1.2-1.4x faster with 128 tiles than with 64; 256 and 512
 * tiles were within that spread of 128 at 32 to 512 channels, for up to 24 MiB more
 * workspace at 512. */
int64_t cw__cpu_wino_block(const cw__cpu_geom *g) {
    const int64_t all = tiles_of(g);
    return all < 128 ? (all > 0 ? all : 1) : 128;
}

/* Output channels per group: K, or fewer where one group's U_ij (Kb x C floats, the GEMMs'
 * A operand) would pass 1 MiB: the largest multiple of 64 that keeps it within, for the
 * workspace's sake. On the 2-core AVX-512 Intel Xeon, bench_conv_algos, 2 threads: 768->768
 * on 26 x 256 rows ran in 209 ms with all 768 per group and 214 ms with groups of 320, for
 * 48 against 23.5 MiB of workspace; 1024->1024 on 8 x 256 in 111 against 114 ms. (A first
 * measurement had all 768 per group at 57 GFLOP/s: cw__cpu_gemm1 then sent such an A to
 * OpenBLAS, which runs SSE3 kernels on that CPU, par_cpu.c.) 512->512 and below are one
 * group. Grouped (the variant CW__CPU_ALGO_WINOGRAD_KB): half of K up to 128.
 * Measured with bench_conv_algos, 512->512 (H x W 32x64, 13x128) and 256->256 (9x256),
 * groups of 512, 128 and 64 channels, twice each on the idle 2-core AVX-512 AMD machine: one
 * thread, groups of 128 ran at 0.87-1.0x the ungrouped time; two threads at 1.13-1.24x
 * (14.5-22.6 ms against 17.1-22.6 at 512 channels, 6.0-6.2 against 5.2-5.6 at 256); groups of
 * 64 at 1.4-1.6x. */
int64_t cw__cpu_wino_kblock(const cw__cpu_geom *g, int grouped) {
    if (!grouped) {
        const int64_t cap = (INT64_C(1) << 18) / (g->c > 0 ? g->c : 1) / 64 * 64;
        return g->k <= cap ? g->k : cap >= 64 ? cap : 64;
    }
    const int64_t half = (g->k + 1) / 2;
    return half < 128 ? half : 128;
}

int64_t cw__cpu_wino_workspace(const cw__cpu_geom *g, int grouped) {
    const int64_t T = cw__cpu_wino_block(g), kb = cw__cpu_wino_kblock(g, grouped);
    return 16 * (kb * g->c + T * (g->c + kb)) * (int64_t)sizeof(float);
}

/* ---- weights: U[ij][k][c] = (G g G^T)_ij, G = [1 0 0; .5 .5 .5; .5 -.5 .5; 0 0 1] ------ */

enum { WINO_WC = 64 }; /* input channels per weight-transform step (stack: 9 + 12 rows) */

/* o[0..3][e] = G (a, b, c)[e] for e in [0, n): a, (a + c + b) / 2, (a + c - b) / 2, c. */
static void g_apply(const float *a, const float *b, const float *c, float (*o)[WINO_WC], int64_t n) {
    for (int64_t e = 0; e < n; e++) {
        const float s = a[e] + c[e];
        o[0][e] = a[e];
        o[1][e] = (s + b[e]) * 0.5f;
        o[2][e] = (s - b[e]) * 0.5f;
        o[3][e] = c[e];
    }
}

/* Output channel k (row k - k0 of the group's U), input channels [c0, c0 + n): the 9 taps
 * tap-major, then G g G^T. */
static void weights_step(const wino_run *r, int64_t k0, int64_t k, int64_t c0, int64_t n) {
    const cw__cpu_geom *g = r->g;
    float w[9][WINO_WC], gw[3][4][WINO_WC], u[4][WINO_WC];
    for (int64_t e = 0; e < n; e++)
        for (int t = 0; t < 9; t++) {
            const int64_t off = k * g->wsd[0] + (c0 + e) * g->wsd[1] + (t / 3) * g->wsd[3] + (t % 3) * g->wsd[4];
            w[t][e] = g->dt == CW_F32 ? ((const float *)r->w)[off] : cw__cpu_load1(r->w, g->dt, off);
        }
    for (int j = 0; j < 3; j++) g_apply(w[j], w[3 + j], w[6 + j], gw[j], n); /* G g: kernel column j */
    for (int i = 0; i < 4; i++) {                                              /* (G g) G^T: row i */
        g_apply(gw[0][i], gw[1][i], gw[2][i], u, n);
        for (int j = 0; j < 4; j++)
            memcpy(r->u + ((4 * i + j) * r->kb + k - k0) * g->c + c0, u[j], (size_t)n * sizeof(float));
    }
}

/* Output channels [k0 + a, k0 + b) of the group starting at k0. */
CW_CPU_CLONES static void wino_weights(const wino_run *r, int64_t k0, int64_t a, int64_t b) {
    for (int64_t k = k0 + a; k < k0 + b; k++)
        for (int64_t c = 0; c < r->g->c; c += WINO_WC)
            weights_step(r, k0, k, c, r->g->c - c < WINO_WC ? r->g->c - c : WINO_WC);
}

/* ---- input: V[ij][c][t] = (B^T d B)_ij, B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1] -- */

/* A row segment: plane p (image n, output depth od), tile row tr, tiles [tc, tc + len) of
 * that row, which are tiles [t, t + len) of the block. */
typedef struct wino_seg {
    int64_t n, od, tr, tc, len, t;
} wino_seg;

/* The segment of the block starting at tile t0 + t (at most WINO_SEG tiles, within the
 * block's nt tiles and within one tile row). */
static wino_seg seg_at(const wino_run *r, int64_t t0, int64_t t, int64_t nt) {
    const int64_t q = t0 + t, p = q / r->plane, rem = q % r->plane;
    wino_seg s = {p / r->g->out[0], p % r->g->out[0], rem / r->tw, rem % r->tw, 0, t};
    s.len = r->tw - s.tc;
    if (s.len > nt - t) s.len = nt - t;
    if (s.len > WINO_SEG) s.len = WINO_SEG;
    return s;
}

/* dst[0, n) = x's row ih of channel c from input column iw0 on, zero outside the input. */
static void gather_row(const wino_run *r, const wino_seg *s, int64_t c, int64_t ih, int64_t iw0, int64_t n,
                       float *dst) {
    const cw__cpu_geom *g = r->g;
    const int64_t id = s->od * g->st[0] - g->pp[0];
    int64_t lo = iw0 < 0 ? -iw0 : 0, hi = g->in[2] - iw0 < n ? g->in[2] - iw0 : n;
    if (id < 0 || id >= g->in[0] || ih < 0 || ih >= g->in[1] || hi <= lo) {
        memset(dst, 0, (size_t)n * sizeof(float));
        return;
    }
    if (lo > 0) memset(dst, 0, (size_t)lo * sizeof(float));
    const int64_t off = s->n * g->xs[0] + c * g->xs[1] + id * g->xs[2] + ih * g->xs[3] + (iw0 + lo) * g->xs[4];
    cw__cpu_load_f32(dst + lo, at(r->x, off, g->es), g->dt, hi - lo, g->xs[4]);
    if (hi < n) memset(dst + hi, 0, (size_t)(n - hi) * sizeof(float));
}

/* Channel c of segment s into V (nt tiles per row of V). */
static void input_seg(const wino_run *r, const wino_seg *s, int64_t c, int64_t nt) {
    const cw__cpu_geom *g = r->g;
    const int64_t wn = 2 * s->len + 2, ih0 = 2 * s->tr - g->pp[1], iw0 = 2 * s->tc - g->pp[2];
    float d[4][2 * WINO_SEG + 2];
    for (int i = 0; i < 4; i++) gather_row(r, s, c, ih0 + i, iw0, wn, d[i]);
    for (int64_t e = 0; e < wn; e++) { /* B^T d, in place */
        const float d0 = d[0][e], d1 = d[1][e], d2 = d[2][e], d3 = d[3][e];
        d[0][e] = d0 - d2;
        d[1][e] = d1 + d2;
        d[2][e] = d2 - d1;
        d[3][e] = d1 - d3;
    }
    const int64_t cn = g->c * nt;
    for (int i = 0; i < 4; i++) { /* (B^T d) B */
        const float *a = d[i];
        float *v0 = r->v + 4 * i * cn + c * nt + s->t, *v1 = v0 + cn, *v2 = v1 + cn, *v3 = v2 + cn;
        for (int64_t j = 0; j < s->len; j++) {
            const float a0 = a[2 * j], a1 = a[2 * j + 1], a2 = a[2 * j + 2], a3 = a[2 * j + 3];
            v0[j] = a0 - a2;
            v1[j] = a1 + a2;
            v2[j] = a2 - a1;
            v3[j] = a1 - a3;
        }
    }
}

/* Channels [c0, c1) of the block's tiles [t0, t0 + nt). */
CW_CPU_CLONES static void wino_input(const wino_run *r, int64_t t0, int64_t nt, int64_t c0, int64_t c1) {
    for (int64_t t = 0; t < nt;) {
        const wino_seg s = seg_at(r, t0, t, nt);
        for (int64_t c = c0; c < c1; c++) input_seg(r, &s, c, nt);
        t += s.len;
    }
}

/* ---- output: y = A^T M A + b, A^T = [1 1 1 0; 0 1 -1 -1] --------------------------------- */

/* A^T M A for the segment's tiles of output channel k, plus the bias: o[r][e][j] is the
 * tile j's output (r, e). Plain arrays over j, so the compiler vectorises it. */
static void output_tiles(const float *m, int64_t kn, int64_t len, float bv, float (*o)[2][WINO_SEG]) {
    const float *m0 = m, *m1 = m0 + kn, *m2 = m1 + kn, *m3 = m2 + kn, *m4 = m3 + kn, *m5 = m4 + kn, *m6 = m5 + kn,
                *m7 = m6 + kn, *m8 = m7 + kn, *m9 = m8 + kn, *m10 = m9 + kn, *m11 = m10 + kn, *m12 = m11 + kn,
                *m13 = m12 + kn, *m14 = m13 + kn, *m15 = m14 + kn;
    for (int64_t j = 0; j < len; j++) {
        const float a00 = m0[j] + m1[j] + m2[j], a01 = m1[j] - m2[j] - m3[j]; /* M A, row by row */
        const float a10 = m4[j] + m5[j] + m6[j], a11 = m5[j] - m6[j] - m7[j];
        const float a20 = m8[j] + m9[j] + m10[j], a21 = m9[j] - m10[j] - m11[j];
        const float a30 = m12[j] + m13[j] + m14[j], a31 = m13[j] - m14[j] - m15[j];
        o[0][0][j] = a00 + a10 + a20 + bv; /* A^T (M A), then the bias */
        o[0][1][j] = a01 + a11 + a21 + bv;
        o[1][0][j] = a10 - a20 - a30 + bv;
        o[1][1][j] = a11 - a21 - a31 + bv;
    }
}

/* Output channel k (row k - k0 of the group's M) of segment s into y's view. */
static void output_seg(const wino_run *r, const wino_seg *s, int64_t k0, int64_t k, int64_t nt) {
    const cw__cpu_geom *g = r->g;
    float o[2][2][WINO_SEG], row[2 * WINO_SEG];
    output_tiles(r->m + (k - k0) * nt + s->t, r->kb * nt, s->len, g->has_bias ? cw__cpu_load1(r->b, g->dt, k) : 0.0f,
                 o);
    const int64_t ow = 2 * s->tc, wn = g->out[2] - ow < 2 * s->len ? g->out[2] - ow : 2 * s->len;
    for (int e = 0; e < 2 && 2 * s->tr + e < g->out[1]; e++) {
        const int64_t off = s->n * g->ys[0] + k * g->ys[1] + s->od * g->ys[2] + (2 * s->tr + e) * g->ys[3] + ow * g->ys[4];
        const int direct = g->dt == CW_F32 && g->ys[4] == 1; /* interleave straight into y's row */
        float *dst = direct ? (float *)r->y + off : row;
        const float *c0 = o[e][0], *c1 = o[e][1];
        for (int64_t j = 0; j < wn / 2; j++) {
            dst[2 * j] = c0[j];
            dst[2 * j + 1] = c1[j];
        }
        if (wn & 1) dst[wn - 1] = c0[wn / 2];
        if (!direct) cw__cpu_store_f32(at(r->y, off, g->es), g->dt, g->ys[4], row, wn);
    }
}

/* Output channels [k0 + a, k0 + b) of the group starting at k0, the block's tiles [t0, t0 + nt). */
CW_CPU_CLONES static void wino_output(const wino_run *r, int64_t t0, int64_t nt, int64_t k0, int64_t a, int64_t b) {
    for (int64_t t = 0; t < nt;) {
        const wino_seg s = seg_at(r, t0, t, nt);
        for (int64_t k = k0 + a; k < k0 + b; k++) output_seg(r, &s, k0, k, nt);
        t += s.len;
    }
}

/* ---- the 16 products and the team's phases ---------------------------------------------- */

/* M_ij = U_ij V_ij for ij in [i0, i1), block width nt, group of kn output channels:
 * single-threaded calls of a shape fixed by the problem. */
static void wino_gemms(const wino_run *r, int64_t kn, int64_t nt, int i0, int i1) {
    const cw__cpu_geom *g = r->g;
    const blasint K = (blasint)kn, C = (blasint)g->c, N = (blasint)nt;
    for (int ij = i0; ij < i1; ij++)
        cw__cpu_gemm1(0, 0, K, N, C, 1.0f, r->u + ij * r->kb * g->c, C, r->v + ij * g->c * nt, N, 0.0f,
                      r->m + ij * r->kb * nt, N);
}

static int64_t share(int64_t n, int rank, int members) { return n * rank / members; }

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* Steps run group by group, block by block. Before step s's GEMMs: its group's U (when the
 * group starts) and its block's V (unless one block holds every tile and V is still there). */
static void wino_prepare(const wino_run *r, int64_t s, int rank, int n) {
    const int64_t k0 = s / r->blocks * r->kb, b = s % r->blocks, t0 = b * r->T;
    if (b == 0) {
        const int64_t kn = min64(r->g->k - k0, r->kb);
        wino_weights(r, k0, share(kn, rank, n), share(kn, rank + 1, n));
    }
    if (s == 0 || r->blocks > 1)
        wino_input(r, t0, min64(r->tiles - t0, r->T), share(r->g->c, rank, n), share(r->g->c, rank + 1, n));
}

static void wino_team(void *arg, cw__cpu_team *t, int rank, int n) {
    const wino_run *r = arg;
    const int64_t steps = r->groups * r->blocks;
    wino_prepare(r, 0, rank, n);
    cw__cpu_team_barrier(t);
    for (int64_t s = 0; s < steps; s++) {
        const int64_t k0 = s / r->blocks * r->kb, kn = min64(r->g->k - k0, r->kb);
        const int64_t t0 = s % r->blocks * r->T, nt = min64(r->tiles - t0, r->T);
        wino_gemms(r, kn, nt, (int)share(16, rank, n), (int)share(16, rank + 1, n));
        cw__cpu_team_barrier(t);
        /* U and V are free again: the next step's transforms run beside this output's */
        wino_output(r, t0, nt, k0, share(kn, rank, n), share(kn, rank + 1, n));
        if (s + 1 < steps) wino_prepare(r, s + 1, rank, n);
        cw__cpu_team_barrier(t);
    }
}

void cw__cpu_wino_run(const cw__cpu_geom *g, const void *x, const void *w, const void *b, void *y, void *ws,
                      int grouped, int threads) {
    wino_run r = {g, x, w, b, y, NULL, NULL, NULL, 0, 0, 0, 0, 0, 0, 0, 0};
    r.tw = (g->out[2] + 1) / 2;
    r.th = (g->out[1] + 1) / 2;
    r.plane = r.tw * r.th;
    r.tiles = tiles_of(g);
    if (r.tiles == 0) return;
    r.T = cw__cpu_wino_block(g);
    r.blocks = (r.tiles + r.T - 1) / r.T;
    r.kb = cw__cpu_wino_kblock(g, grouped);
    r.groups = (g->k + r.kb - 1) / r.kb;
    r.u = ws;
    r.v = r.u + 16 * r.kb * g->c;
    r.m = r.v + 16 * g->c * r.T;
    cw__cpu_blas_single();
    /* a helper thread took 0.1-0.2 ms to start and join on the loaded 2-core machine, and
     * each step adds two barriers: no team under ~20 MFLOP (~0.25 ms of GEMMs) */
    const double flops = 32.0 * (double)r.tiles * (double)g->c * (double)g->k;
    cw__cpu_team_run(flops >= 2e7 ? threads : 1, wino_team, &r);
}
