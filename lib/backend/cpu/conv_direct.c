/* The DIRECT cpu convolution (no workspace): per output row tile, accumulate over kernel
 * taps in one fixed order, threads splitting output rows. An f16/bf16 tile's input rows
 * are converted into a stack buffer and its f32 accumulators rounded on the store. Its own
 * file because two callers use it: conv_cpu.c's algorithm list and conv_dnnl.c's fallback
 * for sub-bands oneDNN refuses. */
#include "backend/cpu/cpu.h"

static inline void *elem_at(const void *p, int64_t off, size_t es) { return (char *)p + off * (int64_t)es; }

/* ---- DIRECT --------------------------------------------------------------------------- */
enum { DIRECT_TW = 256, DIRECT_KB = 4, DIRECT_SPAN = 2048 }; /* W tile, output channels per pass, f32
                                                             * input columns converted per tile (floats) */

/* acc[0..n) += wv * src[i*sx] (sx = 1 is the vectorised common case). */
static inline void axpy_strided(float *restrict acc, const float *restrict src, int64_t n, int64_t sx, float wv) {
    if (sx == 1) {
        for (int64_t i = 0; i < n; i++) acc[i] += wv * src[i];
    } else {
        for (int64_t i = 0; i < n; i++) acc[i] += wv * src[i * sx];
    }
}

/* Output rows (od, oh) with od * Ho + oh in [row_lo, row_hi): threads split rows. Every
 * output element accumulates its taps in one fixed order (c, kd, kh, kw) in f32, whatever
 * the tiling. An f16/bf16 input row is converted per (c, kd, kh) and tile into span[]: the
 * columns every kw of the tile reads, or, where those exceed DIRECT_SPAN (large strides or
 * dilations), per kw into gat[]. */
static void conv_direct(const cw__cpu_geom *g, const void *x, const void *w, const void *b, void *y, int64_t row_lo,
                        int64_t row_hi) {
    const int64_t Ho = g->out[1], Wo = g->out[2];
    const int half = g->dt != CW_F32;
    const size_t es = g->es;
    float acc[DIRECT_KB][DIRECT_TW];
    float span[DIRECT_SPAN], gat[DIRECT_TW];
    for (int64_t n = 0; n < g->n; n++) {
        for (int64_t gi = 0; gi < g->g; gi++) {
            for (int64_t m0 = 0; m0 < g->kg; m0 += DIRECT_KB) {
                const int64_t nb = g->kg - m0 < DIRECT_KB ? g->kg - m0 : DIRECT_KB;
                const int64_t k0 = gi * g->kg + m0; /* first output channel of the block */
                for (int64_t row = row_lo; row < row_hi; row++) {
                    const int64_t od = row / Ho, oh = row % Ho;
                    for (int64_t t0 = 0; t0 < Wo; t0 += DIRECT_TW) {
                        const int64_t tw = Wo - t0 < DIRECT_TW ? Wo - t0 : DIRECT_TW;
                        for (int64_t j = 0; j < nb; j++) {
                            const float bv = g->has_bias ? cw__cpu_load1(b, g->dt, k0 + j) : 0.0f;
                            for (int64_t i = 0; i < tw; i++) acc[j][i] = bv;
                        }
                        /* input columns the tile reads over all kw: [iw0, iw1), clipped */
                        int64_t iw0 = t0 * g->st[2] - g->pp[2];
                        int64_t iw1 = (t0 + tw - 1) * g->st[2] - g->pp[2] + g->dl[2] * (g->ks[2] - 1) + 1;
                        if (iw0 < 0) iw0 = 0;
                        if (iw1 > g->in[2]) iw1 = g->in[2];
                        const int use_span = half && iw1 - iw0 <= DIRECT_SPAN;
                        for (int64_t c = 0; c < g->cg; c++) {
                            const int64_t xc = n * g->xs[0] + (gi * g->cg + c) * g->xs[1];
                            for (int64_t kd = 0; kd < g->ks[0]; kd++) {
                                const int64_t id = od * g->st[0] - g->pp[0] + kd * g->dl[0];
                                if (id < 0 || id >= g->in[0]) continue;
                                for (int64_t kh = 0; kh < g->ks[1]; kh++) {
                                    const int64_t ih = oh * g->st[1] - g->pp[1] + kh * g->dl[1];
                                    if (ih < 0 || ih >= g->in[1]) continue;
                                    const int64_t xrow = xc + id * g->xs[2] + ih * g->xs[3]; /* elements */
                                    if (use_span && iw1 > iw0)
                                        cw__cpu_load_f32(span, elem_at(x, xrow + iw0 * g->xs[4], es), g->dt, iw1 - iw0,
                                                         g->xs[4]);
                                    for (int64_t kw = 0; kw < g->ks[2]; kw++) {
                                        int64_t offw = kw * g->dl[2] - g->pp[2], lo, hi;
                                        cw__cpu_conv_range(offw, g->st[2], g->in[2], Wo, &lo, &hi);
                                        if (lo < t0) lo = t0;
                                        if (hi > t0 + tw) hi = t0 + tw;
                                        if (hi <= lo) continue;
                                        const int64_t first = lo * g->st[2] + offw; /* input column */
                                        const float *src;
                                        int64_t sx;
                                        if (!half) {
                                            src = (const float *)x + xrow + first * g->xs[4];
                                            sx = g->st[2] * g->xs[4];
                                        } else if (use_span) {
                                            src = span + (first - iw0);
                                            sx = g->st[2];
                                        } else {
                                            cw__cpu_load_f32(gat, elem_at(x, xrow + first * g->xs[4], es), g->dt,
                                                             hi - lo, g->st[2] * g->xs[4]);
                                            src = gat;
                                            sx = 1;
                                        }
                                        for (int64_t j = 0; j < nb; j++) {
                                            const int64_t wo = (k0 + j) * g->wsd[0] + c * g->wsd[1] + kd * g->wsd[2] +
                                                               kh * g->wsd[3] + kw * g->wsd[4];
                                            const float wv = half ? cw__cpu_load1(w, g->dt, wo) : ((const float *)w)[wo];
                                            axpy_strided(acc[j] + (lo - t0), src, hi - lo, sx, wv);
                                        }
                                    }
                                }
                            }
                        }
                        for (int64_t j = 0; j < nb; j++) {
                            const int64_t yo = n * g->ys[0] + (k0 + j) * g->ys[1] + od * g->ys[2] + oh * g->ys[3] +
                                               t0 * g->ys[4];
                            cw__cpu_store_f32(elem_at(y, yo, es), g->dt, g->ys[4], acc[j], tw);
                        }
                    }
                }
            }
        }
    }
}

typedef struct direct_arg {
    const cw__cpu_geom *g;
    const void *x, *w, *b;
    void *y;
} direct_arg;

static void direct_range(void *p, int64_t lo, int64_t hi) {
    direct_arg *a = p;
    conv_direct(a->g, a->x, a->w, a->b, a->y, lo, hi);
}

void cw__cpu_conv_direct(const cw__conv_problem *p, const void *x, const void *w, const void *b, void *y,
                         int threads) {
    cw__cpu_geom g;
    cw__cpu_geom_make(p, &g);
    direct_arg da = {&g, x, w, b, y};
    const int64_t rows = g.out[0] * g.out[1];
    const double macs = (double)g.n * (double)g.k * (double)(rows * g.out[2]) * (double)g.cg *
                        (double)(g.ks[0] * g.ks[1] * g.ks[2]);
    cw__cpu_parallel(macs >= 1e7 ? threads : 1, rows, direct_range, &da); /* ~1 ms of work and more */
}
