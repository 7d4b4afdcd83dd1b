/* The cpu backend's light operations: fused GroupNorm-apply + SiLU + nearest upsample
 * ("prep"), GroupNorm statistics and finalize, add, the per-channel ops, GEMM and row
 * softmax. Each hook (its arguments checked by ops.c) copies its parameters into a closure
 * and enqueues it on the stream's worker; the *_run functions hold the math (per-element
 * pieces from kernels/kernels.h).
 *
 * Views may be f32, f16 or bf16 (GEMM and softmax: f32 only); the math is f32 (GroupNorm
 * statistics: double) on tiles of TILE elements converted on load and rounded once on
 * store (cvt_cpu.c), in stack buffers: no op allocates. An f16/bf16 result is the f32
 * path's result on the converted inputs, rounded to the dtype. */
#include <limits.h>
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "kernels/kernels.h"

enum { TILE = 512 }; /* f32 elements of a conversion tile (a multiple of 4: row_moments) */

/* Element off (in elements) of p, whose elements are es bytes. */
static inline void *elem_at(const void *p, int64_t off, size_t es) { return (char *)p + off * (int64_t)es; }

/* ---- views ---------------------------------------------------------------------------- */

/* A 4-D NCHW or 5-D NCDHW view as [N, C, D, H, W] (D = 1, stride 0 for 4-D). */
typedef struct ncdhw {
    int64_t dim[5];
    int64_t st[5];
} ncdhw;

static void view_ncdhw(const cw__view *v, ncdhw *o) {
    cw_tensor_desc d = v->d;
    cw__desc_fill_strides(&d);
    if (d.rank == 5) {
        for (int i = 0; i < 5; i++) {
            o->dim[i] = d.dims[i];
            o->st[i] = d.strides[i];
        }
    } else {
        o->dim[0] = d.dims[0], o->st[0] = d.strides[0];
        o->dim[1] = d.dims[1], o->st[1] = d.strides[1];
        o->dim[2] = 1, o->st[2] = 0;
        o->dim[3] = d.dims[2], o->st[3] = d.strides[2];
        o->dim[4] = d.dims[3], o->st[4] = d.strides[3];
    }
}

/* Any rank 1..5 as 5 dims, left-padded with size-1 dims. */
static void view_pad5(const cw__view *v, int64_t dim[5], int64_t st[5]) {
    cw_tensor_desc d = v->d;
    cw__desc_fill_strides(&d);
    int pad = 5 - d.rank;
    for (int i = 0; i < 5; i++) {
        dim[i] = i < pad ? 1 : d.dims[i - pad];
        st[i] = i < pad ? 0 : d.strides[i - pad];
    }
}

/* Copies p into a fresh closure and enqueues fn on s (the worker frees it). */
static cw_status enqueue_copy(cw__backend *be, cw__stream *s, const char *op, void (*fn)(void *), const void *p,
                              size_t bytes) {
    void *c = cw__malloc(bytes);
    if (!c) return cw__error(be->ctx, CW_ERR_OUT_OF_MEMORY, "%s: no host memory for a %zu-byte closure", op, bytes);
    memcpy(c, p, bytes);
    return cw__cpu_enqueue(be, s, fn, c, cw__free);
}

/* ---- prep: GroupNorm apply + SiLU + nearest upsample ------------------------------------ */

/* One destination row from one source row. The flags are passed as constants by the
 * caller's switch, so each combination compiles into its own straight loop. */
static inline void prep_row(float *dst, int64_t dsw, const float *src, int64_t ssw, int64_t wd, int64_t up,
                            float sc, float sh, int norm, int silu) {
    if (dsw == 1 && ssw == 1) {
        if (up == 1) {
            for (int64_t w = 0; w < wd; w++) dst[w] = cw_prep_elem(src[w], sc, sh, norm, silu);
        } else if (up == 2) {
            int64_t half = wd >> 1;
            for (int64_t w = 0; w < half; w++) {
                float v = cw_prep_elem(src[w], sc, sh, norm, silu);
                dst[2 * w] = v;
                dst[2 * w + 1] = v;
            }
            if (wd & 1) dst[wd - 1] = cw_prep_elem(src[half], sc, sh, norm, silu);
        } else {
            int64_t full = wd / up, w = 0;
            for (int64_t s = 0; s < full; s++) {
                float v = cw_prep_elem(src[s], sc, sh, norm, silu);
                for (int64_t k = 0; k < up; k++) dst[w++] = v;
            }
            if (w < wd) {
                float v = cw_prep_elem(src[full], sc, sh, norm, silu);
                for (; w < wd; w++) dst[w] = v;
            }
        }
        return;
    }
    /* strided W: rare (transposed views); walk source index and its repeat counter. */
    int64_t s = 0, k = 0;
    float v = wd > 0 ? cw_prep_elem(src[0], sc, sh, norm, silu) : 0.0f;
    for (int64_t w = 0; w < wd; w++) {
        if (k == up) {
            k = 0;
            s++;
            v = cw_prep_elem(src[s * ssw], sc, sh, norm, silu);
        }
        dst[w * dsw] = v;
        k++;
    }
}

/* One destination row from one source row in any dtypes: the source elements the row
 * reads are converted tile by tile, transformed once each (mode, then p's unary link), and
 * repeated `up` times on the way out (rounded once to dst's dtype before the repeat). */
CW_CPU_CLONES static void prep_row_any(void *dst, cw_dtype ddt, int64_t dsw, const void *src, cw_dtype sdt,
                                       int64_t ssw, int64_t wd, int64_t up, float sc, float sh, int mode,
                                       const cw__prep_params *p) {
    const size_t des = cw_dtype_size(ddt), ses = cw_dtype_size(sdt);
    const int64_t ns = (wd + up - 1) / up; /* source elements read */
    float buf[TILE];
    uint16_t hb[TILE];
    for (int64_t s0 = 0; s0 < ns; s0 += TILE) {
        const int64_t m = ns - s0 < TILE ? ns - s0 : TILE;
        cw__cpu_load_f32(buf, elem_at(src, s0 * ssw, ses), sdt, m, ssw);
        switch (mode) {
        case 0: break;
        case 1: for (int64_t i = 0; i < m; i++) buf[i] = cw_prep_elem(buf[i], sc, sh, 0, 1); break;
        case 2: for (int64_t i = 0; i < m; i++) buf[i] = cw_prep_elem(buf[i], sc, sh, 1, 0); break;
        default: for (int64_t i = 0; i < m; i++) buf[i] = cw_prep_elem(buf[i], sc, sh, 1, 1); break;
        }
        if (p->unary)
            for (int64_t i = 0; i < m; i++) buf[i] = cw_prep_unary(buf[i], p->unary, p->ua, p->ub);
        const int64_t d0 = s0 * up, d1 = (s0 + m) * up < wd ? (s0 + m) * up : wd;
        if (up == 1) {
            cw__cpu_store_f32(elem_at(dst, d0 * dsw, des), ddt, dsw, buf, m);
            continue;
        }
        if (ddt == CW_F32) {
            float *o = (float *)dst;
            for (int64_t i = 0, d = d0; i < m; i++)
                for (int64_t k = 0; k < up && d < d1; k++, d++) o[d * dsw] = buf[i];
        } else {
            cw__cpu_store_f32(hb, ddt, 1, buf, m);
            uint16_t *o = (uint16_t *)dst;
            for (int64_t i = 0, d = d0; i < m; i++)
                for (int64_t k = 0; k < up && d < d1; k++, d++) o[d * dsw] = hb[i];
        }
    }
}

/* Replicates a row's edge elements into its padding: columns [0, pre) take column pre,
 * columns [pre + n, wd) take column pre + n - 1 (es-byte elements, dsw apart). */
static void pad_row_edges(char *row, int64_t dsw, size_t es, int64_t pre, int64_t n, int64_t wd) {
    const int64_t step = dsw * (int64_t)es;
    for (int64_t w = 0; w < pre; w++) memcpy(row + w * step, row + pre * step, es);
    for (int64_t w = pre + n; w < wd; w++) memcpy(row + w * step, row + (pre + n - 1) * step, es);
}

/* prep with replicate padding (p->pad): each dst index is clamped into the upsampled tensor
 * (cw_prep_src); a row's interior W is the unpadded prep of its source row, then its edges
 * are copied out into the padding. */
CW_CPU_CLONES static void prep_run_padded(const cw__prep_params *p, const ncdhw *s, const ncdhw *d) {
    const cw_dtype sdt = p->src.d.dtype, ddt = p->dst.d.dtype;
    const size_t ses = cw_dtype_size(sdt), des = cw_dtype_size(ddt);
    const int64_t N = d->dim[0], C = d->dim[1], D = d->dim[2], H = d->dim[3], W = d->dim[4];
    const int64_t up = p->up, Wup = s->dim[4] * up;
    const int64_t pw = p->pad[2] < W ? p->pad[2] : W, wn = W - pw < Wup ? W - pw : Wup;
    const int norm = p->scale != NULL;
    const int mode = norm * 2 + (p->silu ? 1 : 0);
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++) {
            const float sc = norm ? p->scale[n * C + c] : 1.0f;
            const float sh = norm ? p->shift[n * C + c] : 0.0f;
            for (int64_t z = 0; z < D; z++) {
                const int64_t zs = cw_prep_src_d(z, p->pad[0], s->dim[2], p->up_d, p->off_d);
                const char *sp = elem_at(p->src.data, n * s->st[0] + c * s->st[1] + zs * s->st[2], ses);
                char *dp = elem_at(p->dst.data, n * d->st[0] + c * d->st[1] + z * d->st[2], des);
                for (int64_t r = 0; r < H; r++) {
                    const int64_t sr = cw_prep_src(r, p->dst_row0, p->pad[1], p->up_h, up, p->src_row0);
                    char *drow = dp + r * d->st[3] * (int64_t)des;
                    prep_row_any(drow + pw * d->st[4] * (int64_t)des, ddt, d->st[4],
                                 sp + sr * s->st[3] * (int64_t)ses, sdt, s->st[4], wn, up, sc, sh, mode, p);
                    pad_row_edges(drow, d->st[4], des, pw, wn, W);
                }
            }
        }
}

CW_CPU_CLONES void cw__cpu_prep_run(const cw__prep_params *p) {
    ncdhw s, d;
    view_ncdhw(&p->src, &s);
    view_ncdhw(&p->dst, &d);
    if (p->up_h > 0) {
        prep_run_padded(p, &s, &d);
        return;
    }
    const cw_dtype sdt = p->src.d.dtype, ddt = p->dst.d.dtype;
    const size_t ses = cw_dtype_size(sdt), des = cw_dtype_size(ddt);
    const int all_f32 = sdt == CW_F32 && ddt == CW_F32;
    const int64_t N = d.dim[0], C = d.dim[1], D = d.dim[2], H = d.dim[3], W = d.dim[4];
    const int64_t up = p->up;
    const int norm = p->scale != NULL;
    const int mode = norm * 2 + (p->silu ? 1 : 0);
    for (int64_t n = 0; n < N; n++) {
        for (int64_t c = 0; c < C; c++) {
            const float sc = norm ? p->scale[n * C + c] : 1.0f;
            const float sh = norm ? p->shift[n * C + c] : 0.0f;
            for (int64_t z = 0; z < D; z++) {
                const int64_t zs = cw_up_src_d(z, p->up_d, p->off_d);
                const char *sp = elem_at(p->src.data, n * s.st[0] + c * s.st[1] + zs * s.st[2], ses);
                char *dp = elem_at(p->dst.data, n * d.st[0] + c * d.st[1] + z * d.st[2], des);
                int64_t prev_sr = -1;
                char *prev_row = NULL;
                for (int64_t r = 0; r < H; r++) {
                    int64_t sr = cw_up_src_index(r, p->dst_row0, p->src_row0, up);
                    char *drow = dp + r * d.st[3] * (int64_t)des;
                    const char *srow = sp + sr * s.st[3] * (int64_t)ses;
                    if (sr == prev_sr && d.st[4] == 1) {
                        /* upsampled rows repeat: copy the row just computed */
                        memcpy(drow, prev_row, (size_t)W * des);
                        continue;
                    }
                    if (!all_f32) {
                        prep_row_any(drow, ddt, d.st[4], srow, sdt, s.st[4], W, up, sc, sh, mode, p);
                    } else {
                        float *df = (float *)drow;
                        const float *sf = (const float *)srow;
                        switch (mode) {
                        case 0: prep_row(df, d.st[4], sf, s.st[4], W, up, sc, sh, 0, 0); break;
                        case 1: prep_row(df, d.st[4], sf, s.st[4], W, up, sc, sh, 0, 1); break;
                        case 2: prep_row(df, d.st[4], sf, s.st[4], W, up, sc, sh, 1, 0); break;
                        default: prep_row(df, d.st[4], sf, s.st[4], W, up, sc, sh, 1, 1); break;
                        }
                        if (p->unary) /* the unary link over the row just written (repeats included) */
                            for (int64_t w = 0; w < W; w++)
                                df[w * d.st[4]] = cw_prep_unary(df[w * d.st[4]], p->unary, p->ua, p->ub);
                    }
                    prev_sr = sr;
                    prev_row = drow;
                }
            }
        }
    }
}

static void prep_fn(void *arg) { cw__cpu_prep_run((const cw__prep_params *)arg); }

/* p was checked by cw__op_prep. */
static cw_status cpu_prep(cw__backend *be, cw__stream *s, const cw__prep_params *p) {
    cw__prep_params c = *p;
    cw__desc_fill_strides(&c.src.d);
    cw__desc_fill_strides(&c.dst.d);
    return enqueue_copy(be, s, "prep", prep_fn, &c, sizeof c);
}

/* ---- GroupNorm statistics --------------------------------------------------------------- */

/* Sums of x[0..m) (d = 0) or of (x[i] - mu)^2 (d = 1) into a[0..3]: four accumulators
 * (four = 1, unit stride) break the add chain so the loop pipelines, element i going to
 * a[i % 4] and a tail of m % 4 to a[0]; one (four = 0) for strided rows. A row fed in
 * chunks whose lengths are multiples of 4 gets the bits of the whole row at once. */
static inline void moments_acc(const float *x, int64_t m, int64_t s, int four, int sq, double mu, double a[4]) {
    int64_t i = 0;
    if (four) {
        for (; i + 4 <= m; i += 4) {
            if (sq) {
                double d0 = (double)x[i] - mu, d1 = (double)x[i + 1] - mu;
                double d2 = (double)x[i + 2] - mu, d3 = (double)x[i + 3] - mu;
                a[0] += d0 * d0;
                a[1] += d1 * d1;
                a[2] += d2 * d2;
                a[3] += d3 * d3;
            } else {
                a[0] += (double)x[i];
                a[1] += (double)x[i + 1];
                a[2] += (double)x[i + 2];
                a[3] += (double)x[i + 3];
            }
        }
    }
    for (; i < m; i++) {
        double v = (double)x[i * s];
        if (sq) {
            double d0 = v - mu;
            a[0] += d0 * d0;
        } else {
            a[0] += v;
        }
    }
}

/* Exact (two-pass, in double) mean and M2 of one row of n >= 1 elements of dtype dt with
 * stride s. The order is fixed, so results are reproducible, and an f16/bf16 row (converted
 * in TILE chunks, twice) gives the bits of the same values stored as f32. */
static void row_moments(const void *x, cw_dtype dt, int64_t n, int64_t s, double *mean, double *m2) {
    const int four = s == 1;
    double mu = 0.0;
    for (int sq = 0; sq < 2; sq++) {
        double a[4] = {0, 0, 0, 0};
        if (dt == CW_F32) {
            moments_acc((const float *)x, n, s, four, sq, mu, a);
        } else {
            float buf[TILE];
            for (int64_t i0 = 0; i0 < n; i0 += TILE) {
                const int64_t m = n - i0 < TILE ? n - i0 : TILE;
                cw__cpu_load_f32(buf, (const uint16_t *)x + i0 * s, dt, m, s);
                moments_acc(buf, m, 1, four, sq, mu, a);
            }
        }
        if (sq) *m2 = (a[0] + a[1]) + (a[2] + a[3]);
        else mu = ((a[0] + a[1]) + (a[2] + a[3])) / (double)n;
    }
    *mean = mu;
}

void cw__cpu_gn_stats_run(const cw__view *x, int64_t groups, double *out) {
    ncdhw v;
    view_ncdhw(x, &v);
    const cw_dtype dt = x->d.dtype;
    const size_t es = cw_dtype_size(dt);
    const int64_t N = v.dim[0], C = v.dim[1], D = v.dim[2], H = v.dim[3], W = v.dim[4];
    const int64_t cpg = C / groups;
    for (int64_t n = 0; n < N; n++) {
        for (int64_t g = 0; g < groups; g++) {
            /* exact per-row moments merged row by row (Chan): rows stay in L1 for the
             * second pass, and the merge is as exact as one two-pass over the group. */
            cw_moments m;
            cw_moments_zero(&m);
            if (W > 0) {
                for (int64_t c = g * cpg; c < (g + 1) * cpg; c++) {
                    for (int64_t z = 0; z < D; z++) {
                        const int64_t base = n * v.st[0] + c * v.st[1] + z * v.st[2];
                        for (int64_t r = 0; r < H; r++) {
                            double mu, m2;
                            row_moments(elem_at(x->data, base + r * v.st[3], es), dt, W, v.st[4], &mu, &m2);
                            cw_moments_merge(&m, (double)W, mu, m2);
                        }
                    }
                }
            }
            double *o = out + (n * groups + g) * 3;
            o[0] = m.count;
            o[1] = m.mean;
            o[2] = m.m2;
        }
    }
}

typedef struct gn_stats_closure {
    cw__view x;
    int64_t groups;
    double *out;
} gn_stats_closure;

static void gn_stats_fn(void *arg) {
    gn_stats_closure *c = (gn_stats_closure *)arg;
    cw__cpu_gn_stats_run(&c->x, c->groups, c->out);
}

/* Checked by cw__op_gn_stats. */
static cw_status cpu_gn_stats(cw__backend *be, cw__stream *s, const cw__view *x, int64_t groups, double *out) {
    gn_stats_closure c;
    c.x = *x;
    cw__desc_fill_strides(&c.x.d);
    c.groups = groups;
    c.out = out;
    return enqueue_copy(be, s, "gn_stats", gn_stats_fn, &c, sizeof c);
}

/* ---- GroupNorm finalize --------------------------------------------------------------- */

void cw__cpu_gn_finalize_run(const double *parts, int64_t n_parts, int64_t n, int64_t c, int64_t groups,
                             const float *gamma, const float *beta, float eps, float *scale, float *shift) {
    const int64_t cpg = c / groups, stride = n * groups * 3;
    for (int64_t i = 0; i < n; i++) {
        for (int64_t g = 0; g < groups; g++) {
            cw_moments m;
            cw_moments_zero(&m);
            for (int64_t p = 0; p < n_parts; p++) { /* index order: reproducible */
                const double *q = parts + p * stride + (i * groups + g) * 3;
                cw_moments_merge(&m, q[0], q[1], q[2]);
            }
            const double rstd = cw_gn_rstd(&m, (double)eps);
            for (int64_t ch = g * cpg; ch < (g + 1) * cpg; ch++) {
                cw_gn_scale_shift(&m, rstd, gamma ? gamma[ch] : 1.0f, beta ? beta[ch] : 0.0f, &scale[i * c + ch],
                                  &shift[i * c + ch]);
            }
        }
    }
}

typedef struct gn_finalize_closure {
    const double *parts;
    int64_t n_parts, n, c, groups;
    const float *gamma, *beta;
    float eps;
    float *scale, *shift;
} gn_finalize_closure;

static void gn_finalize_fn(void *arg) {
    gn_finalize_closure *k = (gn_finalize_closure *)arg;
    cw__cpu_gn_finalize_run(k->parts, k->n_parts, k->n, k->c, k->groups, k->gamma, k->beta, k->eps, k->scale,
                            k->shift);
}

/* Checked by cw__op_gn_finalize; gamma/beta may be NULL (affine-free: 1 and 0). */
static cw_status cpu_gn_finalize(cw__backend *be, cw__stream *s, const double *parts, int64_t n_parts, int64_t n,
                              int64_t c, int64_t groups, const float *gamma, const float *beta, float eps,
                              float *scale, float *shift) {
    gn_finalize_closure k;
    k.parts = parts;
    k.n_parts = n_parts;
    k.n = n;
    k.c = c;
    k.groups = groups;
    k.gamma = gamma;
    k.beta = beta;
    k.eps = eps;
    k.scale = scale;
    k.shift = shift;
    return enqueue_copy(be, s, "gn_finalize", gn_finalize_fn, &k, sizeof k);
}

/* ---- add ------------------------------------------------------------------------------ */

/* dst row = a row + b row, W elements with strides sy, sa, sb, in dtype dt != f32: TILE
 * chunks of a and b are converted before any of the chunk is stored, so an exact alias
 * of dst with a or b is fine. */
static void add_row_half(void *y, int64_t sy, const void *pa, int64_t sa, const void *pb, int64_t sb, int64_t W,
                         cw_dtype dt) {
    float fa[TILE], fb[TILE];
    for (int64_t w0 = 0; w0 < W; w0 += TILE) {
        const int64_t m = W - w0 < TILE ? W - w0 : TILE;
        cw__cpu_load_f32(fa, (const uint16_t *)pa + w0 * sa, dt, m, sa);
        cw__cpu_load_f32(fb, (const uint16_t *)pb + w0 * sb, dt, m, sb);
        for (int64_t i = 0; i < m; i++) fa[i] += fb[i];
        cw__cpu_store_f32((uint16_t *)y + w0 * sy, dt, sy, fa, m);
    }
}

/* Elementwise with plain indexed loads and stores, so an exact alias of dst with a or b
 * is fine (each element is read before it is written). */
CW_CPU_CLONES void cw__cpu_add_run(const cw__view *dst, const cw__view *a, const cw__view *b) {
    const cw_dtype dt = dst->d.dtype;
    const size_t es = cw_dtype_size(dt);
    float *y = (float *)dst->data;
    const float *pa = (const float *)a->data, *pb = (const float *)b->data;
    cw_tensor_desc dd = dst->d, da = a->d, db = b->d;
    cw__desc_fill_strides(&dd);
    cw__desc_fill_strides(&da);
    cw__desc_fill_strides(&db);
    if (cw__desc_is_contiguous(&dd) && cw__desc_is_contiguous(&da) && cw__desc_is_contiguous(&db)) {
        int64_t n = cw__desc_numel(&dd);
        if (dt != CW_F32) add_row_half(y, 1, pa, 1, pb, 1, n, dt);
        else
            for (int64_t i = 0; i < n; i++) y[i] = pa[i] + pb[i];
        return;
    }
    int64_t dim[5], sy[5], sa[5], sb[5], tmp[5];
    view_pad5(dst, dim, sy);
    view_pad5(a, tmp, sa);
    view_pad5(b, tmp, sb);
    const int64_t W = dim[4];
    for (int64_t i0 = 0; i0 < dim[0]; i0++)
        for (int64_t i1 = 0; i1 < dim[1]; i1++)
            for (int64_t i2 = 0; i2 < dim[2]; i2++)
                for (int64_t i3 = 0; i3 < dim[3]; i3++) {
                    const int64_t oy = i0 * sy[0] + i1 * sy[1] + i2 * sy[2] + i3 * sy[3];
                    const int64_t oa = i0 * sa[0] + i1 * sa[1] + i2 * sa[2] + i3 * sa[3];
                    const int64_t ob = i0 * sb[0] + i1 * sb[1] + i2 * sb[2] + i3 * sb[3];
                    if (dt != CW_F32) {
                        add_row_half(elem_at(y, oy, es), sy[4], elem_at(pa, oa, es), sa[4], elem_at(pb, ob, es),
                                     sb[4], W, dt);
                        continue;
                    }
                    float *yr = y + oy;
                    const float *ar = pa + oa, *br = pb + ob;
                    if (sy[4] == 1 && sa[4] == 1 && sb[4] == 1) {
                        for (int64_t w = 0; w < W; w++) yr[w] = ar[w] + br[w];
                    } else {
                        for (int64_t w = 0; w < W; w++) yr[w * sy[4]] = ar[w * sa[4]] + br[w * sb[4]];
                    }
                }
}

typedef struct add_closure {
    cw__view dst, a, b;
} add_closure;

static void add_fn(void *arg) {
    add_closure *k = (add_closure *)arg;
    cw__cpu_add_run(&k->dst, &k->a, &k->b);
}

/* Checked by cw__op_add. */
static cw_status cpu_add(cw__backend *be, cw__stream *s, const cw__view *dst, const cw__view *a, const cw__view *b) {
    add_closure k;
    k.dst = *dst;
    k.a = *a;
    k.b = *b;
    cw__desc_fill_strides(&k.dst.d);
    cw__desc_fill_strides(&k.a.d);
    cw__desc_fill_strides(&k.b.d);
    return enqueue_copy(be, s, "add", add_fn, &k, sizeof k);
}

/* ---- per-channel ops ------------------------------------------------------------------ */

/* A rank 2..5 view as [N, C, a, b, W]: size-1 dims inserted after C. */
static void view_nc5(const cw__view *v, int64_t dim[5], int64_t st[5]) {
    cw_tensor_desc d = v->d;
    cw__desc_fill_strides(&d);
    int pad = 5 - d.rank;
    for (int i = 0; i < 5; i++) {
        int j = i < 2 ? i : i - pad; /* the view's dim; an inserted one has j < 2 */
        int ins = i >= 2 && j < 2;
        dim[i] = ins ? 1 : d.dims[j];
        st[i] = ins ? 0 : d.strides[j];
    }
}

/* The per-channel op, out[n, c, ...] = cw_channel_elem(code, x[n, c, ...], v[c]). Plain
 * indexed loads and stores, so out may alias x exactly (f16/bf16: a TILE chunk is converted
 * before any of it is stored). */
CW_CPU_CLONES static void channel_run(const cw__op_args *a) {
    int64_t dim[5], sd[5], sx[5], tmp[5];
    view_nc5(&a->out, dim, sd);
    view_nc5(&a->in[0], tmp, sx);
    const cw_dtype dt = a->out.d.dtype;
    const size_t es = cw_dtype_size(dt);
    float *y = (float *)a->out.data;
    const float *px = (const float *)a->in[0].data, *pv = (const float *)a->in[1].data;
    const int op = (int)a->param.i[0];
    float buf[TILE];
    for (int64_t n = 0; n < dim[0]; n++)
        for (int64_t c = 0; c < dim[1]; c++) {
            const float v = pv[c];
            for (int64_t i2 = 0; i2 < dim[2]; i2++)
                for (int64_t i3 = 0; i3 < dim[3]; i3++) {
                    const int64_t oy = n * sd[0] + c * sd[1] + i2 * sd[2] + i3 * sd[3];
                    const int64_t ox = n * sx[0] + c * sx[1] + i2 * sx[2] + i3 * sx[3];
                    if (dt != CW_F32) {
                        for (int64_t w0 = 0; w0 < dim[4]; w0 += TILE) {
                            const int64_t m = dim[4] - w0 < TILE ? dim[4] - w0 : TILE;
                            cw__cpu_load_f32(buf, elem_at(px, ox + w0 * sx[4], es), dt, m, sx[4]);
                            for (int64_t i = 0; i < m; i++) buf[i] = cw_channel_elem(op, buf[i], v);
                            cw__cpu_store_f32(elem_at(y, oy + w0 * sd[4], es), dt, sd[4], buf, m);
                        }
                        continue;
                    }
                    float *yr = y + oy;
                    const float *xr = px + ox;
                    if (sd[4] == 1 && sx[4] == 1) {
                        for (int64_t w = 0; w < dim[4]; w++) yr[w] = cw_channel_elem(op, xr[w], v);
                    } else {
                        for (int64_t w = 0; w < dim[4]; w++) yr[w * sd[4]] = cw_channel_elem(op, xr[w * sx[4]], v);
                    }
                }
        }
}

/* The 2x2 average pool over H and W: each output row from two input rows, loaded as f32
 * (converted from f16/bf16 on load) in tiles and rounded once on store. */
static void avg_pool2_run(const cw__op_args *a) {
    int64_t dim[5], sd[5], sx[5], xdim[5];
    view_nc5(&a->out, dim, sd);
    view_nc5(&a->in[0], xdim, sx);
    const cw_dtype dt = a->out.d.dtype;
    const size_t es = cw_dtype_size(dt);
    float r0[2 * (TILE / 2)], r1[2 * (TILE / 2)], o[TILE / 2];
    for (int64_t n = 0; n < dim[0]; n++)
        for (int64_t c = 0; c < dim[1]; c++)
            for (int64_t i2 = 0; i2 < dim[2]; i2++)
                for (int64_t h = 0; h < dim[3]; h++) {
                    const int64_t oy = n * sd[0] + c * sd[1] + i2 * sd[2] + h * sd[3];
                    const int64_t ox = n * sx[0] + c * sx[1] + i2 * sx[2] + 2 * h * sx[3];
                    for (int64_t w0 = 0; w0 < dim[4]; w0 += TILE / 2) {
                        const int64_t m = dim[4] - w0 < TILE / 2 ? dim[4] - w0 : TILE / 2;
                        cw__cpu_load_f32(r0, elem_at(a->in[0].data, ox + 2 * w0 * sx[4], es), dt, 2 * m, sx[4]);
                        cw__cpu_load_f32(r1, elem_at(a->in[0].data, ox + sx[3] + 2 * w0 * sx[4], es), dt, 2 * m, sx[4]);
                        for (int64_t w = 0; w < m; w++) o[w] = cw_avg4(r0[2 * w], r0[2 * w + 1], r1[2 * w], r1[2 * w + 1]);
                        cw__cpu_store_f32(elem_at(a->out.data, oy + w0 * sd[4], es), dt, sd[4], o, m);
                    }
                }
}

/* cw_unary_elem over a tile, the op's switch outside the loop so each loop vectorises
 * where its math does. */
static void unary_tile(int op, float *x, int64_t m, float a, float b) {
    switch (op) {
    case CW_UNARY_RELU: for (int64_t i = 0; i < m; i++) x[i] = cw_unary_elem(CW_UNARY_RELU, x[i], a, b); break;
    case CW_UNARY_SIGMOID: for (int64_t i = 0; i < m; i++) x[i] = cw_unary_elem(CW_UNARY_SIGMOID, x[i], a, b); break;
    case CW_UNARY_GELU_TANH:
        for (int64_t i = 0; i < m; i++) x[i] = cw_unary_elem(CW_UNARY_GELU_TANH, x[i], a, b);
        break;
    case CW_UNARY_AFFINE: for (int64_t i = 0; i < m; i++) x[i] = cw_unary_elem(CW_UNARY_AFFINE, x[i], a, b); break;
    case CW_UNARY_CLAMP: for (int64_t i = 0; i < m; i++) x[i] = cw_unary_elem(CW_UNARY_CLAMP, x[i], a, b); break;
    case CW_UNARY_RSQRT: for (int64_t i = 0; i < m; i++) x[i] = cw_unary_elem(CW_UNARY_RSQRT, x[i], a, b); break;
    case CW_UNARY_SQUARE: for (int64_t i = 0; i < m; i++) x[i] = cw_unary_elem(CW_UNARY_SQUARE, x[i], a, b); break;
    default: for (int64_t i = 0; i < m; i++) x[i] = cw_unary_elem(op, x[i], a, b); break;
    }
}

/* cw_binary_elem over a tile (x <- op(x, y)), the op's switch outside the loop. */
static void binary_tile(int op, float *x, const float *y, int64_t m) {
    switch (op) {
    case CW_BINARY_MUL: for (int64_t i = 0; i < m; i++) x[i] = cw_binary_elem(CW_BINARY_MUL, x[i], y[i]); break;
    case CW_BINARY_SUB: for (int64_t i = 0; i < m; i++) x[i] = cw_binary_elem(CW_BINARY_SUB, x[i], y[i]); break;
    case CW_BINARY_DIV: for (int64_t i = 0; i < m; i++) x[i] = cw_binary_elem(CW_BINARY_DIV, x[i], y[i]); break;
    default: for (int64_t i = 0; i < m; i++) x[i] = cw_binary_elem(op, x[i], y[i]); break;
    }
}

/* An elementwise op of in[0] (and in[1] for CW_OP_BINARY) into out, equal dims (in[1] may
 * be [N, 1, ...], read with channel stride 0): rows of W in TILE chunks converted to f32 on
 * load, computed, rounded once on store. Every chunk is loaded before any of it is stored,
 * so out may alias an input exactly. */
CW_CPU_CLONES static void map_run(const cw__op_args *a) {
    int64_t dim[5], sd[5], sx[5], sy[5], tmp[5];
    const int binary = a->code == CW_OP_BINARY;
    view_pad5(&a->out, dim, sd);
    view_pad5(&a->in[0], tmp, sx);
    if (binary) {
        view_pad5(&a->in[1], tmp, sy);
        if (cw_binary_bcast(&a->in[0].d, &a->in[1].d)) sy[5 - a->in[1].d.rank + 1] = 0;
    }
    const cw_dtype dt = a->out.d.dtype;
    const size_t es = cw_dtype_size(dt);
    const int op = (int)a->param.i[0];
    const float pa = a->param.f[0], pb = a->param.f[1];
    float fx[TILE], fy[TILE];
    for (int64_t i0 = 0; i0 < dim[0]; i0++)
        for (int64_t i1 = 0; i1 < dim[1]; i1++)
            for (int64_t i2 = 0; i2 < dim[2]; i2++)
                for (int64_t i3 = 0; i3 < dim[3]; i3++) {
                    const int64_t od = i0 * sd[0] + i1 * sd[1] + i2 * sd[2] + i3 * sd[3];
                    const int64_t ox = i0 * sx[0] + i1 * sx[1] + i2 * sx[2] + i3 * sx[3];
                    const int64_t oy = binary ? i0 * sy[0] + i1 * sy[1] + i2 * sy[2] + i3 * sy[3] : 0;
                    for (int64_t w0 = 0; w0 < dim[4]; w0 += TILE) {
                        const int64_t m = dim[4] - w0 < TILE ? dim[4] - w0 : TILE;
                        cw__cpu_load_f32(fx, elem_at(a->in[0].data, ox + w0 * sx[4], es), dt, m, sx[4]);
                        if (binary) {
                            cw__cpu_load_f32(fy, elem_at(a->in[1].data, oy + w0 * sy[4], es), dt, m, sy[4]);
                            binary_tile(op, fx, fy, m);
                        } else {
                            unary_tile(op, fx, m, pa, pb);
                        }
                        cw__cpu_store_f32(elem_at(a->out.data, od + w0 * sd[4], es), dt, sd[4], fx, m);
                    }
                }
}

/* One output row of nearest upsampling along W by fw from its source row (wd = fw * its
 * width), elements of es bytes (2 or 4) copied as bits: nearest is exact in every dtype. */
static void up_row(char *d, int64_t dsw, const char *x, int64_t xsw, int64_t wd, int64_t fw, size_t es) {
    if (es == 4) {
        uint32_t *o = (uint32_t *)d;
        const uint32_t *i = (const uint32_t *)x;
        for (int64_t s = 0, w = 0; w < wd; s++)
            for (int64_t k = 0; k < fw; k++, w++) o[w * dsw] = i[s * xsw];
    } else {
        uint16_t *o = (uint16_t *)d;
        const uint16_t *i = (const uint16_t *)x;
        for (int64_t s = 0, w = 0; w < wd; s++)
            for (int64_t k = 0; k < fw; k++, w++) o[w * dsw] = i[s * xsw];
    }
}

/* Nearest upsampling by (fd, fh, fw): each output row from its source row, and an output
 * row whose source row is the previous one's copied from it (contiguous rows). */
static void upsample_nearest_run(const cw__op_args *a) {
    ncdhw d, x;
    view_ncdhw(&a->out, &d);
    view_ncdhw(&a->in[0], &x);
    const size_t es = cw_dtype_size(a->out.d.dtype);
    const int64_t fd = a->param.i[0], fh = a->param.i[1], fw = a->param.i[2], off = a->param.i[3];
    char *dp = a->out.data;
    const char *xp = a->in[0].data;
    for (int64_t n = 0; n < d.dim[0]; n++)
        for (int64_t c = 0; c < d.dim[1]; c++)
            for (int64_t z = 0; z < d.dim[2]; z++) {
                const char *xs = xp + (n * x.st[0] + c * x.st[1] + cw_up_src_d(z, fd, off) * x.st[2]) * (int64_t)es;
                char *ds = dp + (n * d.st[0] + c * d.st[1] + z * d.st[2]) * (int64_t)es;
                for (int64_t h = 0; h < d.dim[3]; h++) {
                    char *drow = ds + h * d.st[3] * (int64_t)es;
                    if (h % fh && d.st[4] == 1) { /* the row above has the same source row */
                        memcpy(drow, drow - d.st[3] * (int64_t)es, (size_t)d.dim[4] * es);
                        continue;
                    }
                    up_row(drow, d.st[4], xs + (h / fh) * x.st[3] * (int64_t)es, x.st[4], d.dim[4], fw, es);
                }
            }
}

/* The channel reduction: per output row of W, a TILE chunk of double accumulators, each
 * channel's chunk converted to f32 and added (squared) in ascending c, then finished and
 * rounded once on store. One accumulator per output element in a fixed order: the result
 * is the cuda kernel's, on any thread count. */
static void reduce_channels_run(const cw__op_args *a) {
    ncdhw d, x;
    view_ncdhw(&a->out, &d);
    view_ncdhw(&a->in[0], &x);
    const cw_dtype dt = a->out.d.dtype;
    const size_t es = cw_dtype_size(dt);
    const int op = (int)a->param.i[0], sq = cw_reduce_squares(op);
    const int64_t nc = x.dim[1];
    double acc[TILE];
    float f[TILE];
    for (int64_t n = 0; n < d.dim[0]; n++)
        for (int64_t z = 0; z < d.dim[2]; z++)
            for (int64_t h = 0; h < d.dim[3]; h++) {
                const int64_t od = n * d.st[0] + z * d.st[2] + h * d.st[3];
                const int64_t ox = n * x.st[0] + z * x.st[2] + h * x.st[3];
                for (int64_t w0 = 0; w0 < d.dim[4]; w0 += TILE) {
                    const int64_t m = d.dim[4] - w0 < TILE ? d.dim[4] - w0 : TILE;
                    for (int64_t i = 0; i < m; i++) acc[i] = 0.0;
                    for (int64_t c = 0; c < nc; c++) {
                        cw__cpu_load_f32(f, elem_at(a->in[0].data, ox + c * x.st[1] + w0 * x.st[4], es), dt, m, x.st[4]);
                        if (sq)
                            for (int64_t i = 0; i < m; i++) acc[i] += (double)f[i] * (double)f[i];
                        else
                            for (int64_t i = 0; i < m; i++) acc[i] += (double)f[i];
                    }
                    for (int64_t i = 0; i < m; i++) f[i] = cw_reduce_finish(op, acc[i], nc);
                    cw__cpu_store_f32(elem_at(a->out.data, od + w0 * d.st[4], es), dt, d.st[4], f, m);
                }
            }
}

/* Concatenation along dim 1 or 2 (never W): each input's rows of W copied as bits into
 * out, in[1]'s shifted by in[0]'s extent in dim. */
static void concat_run(const cw__op_args *a) {
    int64_t dim[5], sd[5];
    view_pad5(&a->out, dim, sd);
    const size_t es = cw_dtype_size(a->out.d.dtype);
    const int p = (int)a->param.i[0] + 5 - a->out.d.rank; /* dim among the 5 padded dims, <= 3 */
    int64_t shift = 0;
    for (int k = 0; k < 2; k++) {
        int64_t xd[5], sx[5];
        view_pad5(&a->in[k], xd, sx);
        const char *xp = a->in[k].data;
        char *dp = a->out.data;
        for (int64_t i0 = 0; i0 < xd[0]; i0++)
            for (int64_t i1 = 0; i1 < xd[1]; i1++)
                for (int64_t i2 = 0; i2 < xd[2]; i2++)
                    for (int64_t i3 = 0; i3 < xd[3]; i3++) {
                        int64_t c[4] = {i0, i1, i2, i3};
                        const int64_t ox = i0 * sx[0] + i1 * sx[1] + i2 * sx[2] + i3 * sx[3];
                        c[p] += shift;
                        const int64_t od = c[0] * sd[0] + c[1] * sd[1] + c[2] * sd[2] + c[3] * sd[3];
                        if (sd[4] == 1 && sx[4] == 1)
                            memcpy(dp + od * (int64_t)es, xp + ox * (int64_t)es, (size_t)xd[4] * es);
                        else
                            up_row(dp + od * (int64_t)es, sd[4], xp + ox * (int64_t)es, sx[4], xd[4], 1, es);
                    }
        shift = xd[p];
    }
}

/* Copies the 5-D (padded) view dim/sd at dp from xp, read with strides sx: rows of W as
 * bits of es bytes (memcpy where both rows are contiguous). */
static void copy_bits5(char *dp, const int64_t dim[5], const int64_t sd[5], const char *xp, const int64_t sx[5],
                       size_t es) {
    for (int64_t i0 = 0; i0 < dim[0]; i0++)
        for (int64_t i1 = 0; i1 < dim[1]; i1++)
            for (int64_t i2 = 0; i2 < dim[2]; i2++)
                for (int64_t i3 = 0; i3 < dim[3]; i3++) {
                    char *d = dp + (i0 * sd[0] + i1 * sd[1] + i2 * sd[2] + i3 * sd[3]) * (int64_t)es;
                    const char *x = xp + (i0 * sx[0] + i1 * sx[1] + i2 * sx[2] + i3 * sx[3]) * (int64_t)es;
                    if (sd[4] == 1 && sx[4] == 1)
                        memcpy(d, x, (size_t)dim[4] * es);
                    else
                        up_row(d, sd[4], x, sx[4], dim[4], 1, es);
                }
}

/* The slice: in[0] read from its element start along dim, with its strides, over out's dims. */
static void slice_run(const cw__op_args *a) {
    int64_t dim[5], sd[5], xd[5], sx[5];
    view_pad5(&a->out, dim, sd);
    view_pad5(&a->in[0], xd, sx);
    const size_t es = cw_dtype_size(a->out.d.dtype);
    const int p = (int)a->param.i[0] + 5 - a->out.d.rank; /* dim among the 5 padded dims */
    copy_bits5(a->out.data, dim, sd, (const char *)a->in[0].data + a->param.i[1] * sx[p] * (int64_t)es, sx, es);
}

/* n elements of es bytes at d (stride sd), each set to the es bytes at v. */
static void set_row(char *d, int64_t sd, int64_t n, const void *v, size_t es) {
    for (int64_t i = 0; i < n; i++) memcpy(d + i * sd * (int64_t)es, v, es);
}

/* The pad: per output row, its source row (cw_pad_src of D and H), or the fill where either
 * is outside a constant pad; along W the border before and after, each of the fill or the
 * row's first or last element, and the row itself copied as bits between. */
static void pad_run(const cw__op_args *a) {
    ncdhw d, x;
    view_ncdhw(&a->out, &d);
    view_ncdhw(&a->in[0], &x);
    const cw_dtype dt = a->out.d.dtype;
    const size_t es = cw_dtype_size(dt);
    const int mode = (int)a->param.i[0];
    const int64_t pz = cw_pad_get(a->param.i[1], 0), ph = cw_pad_get(a->param.i[1], 1);
    const int64_t pw = cw_pad_get(a->param.i[1], 2), qw = cw_pad_get(a->param.i[2], 2);
    const uint32_t fill32 = cw_pad_fill_bits(a->param.f[0], dt);
    const uint16_t fill16 = (uint16_t)fill32;
    const void *fill = es == 4 ? (const void *)&fill32 : (const void *)&fill16;
    const int64_t xw = x.dim[4];
    for (int64_t n = 0; n < d.dim[0]; n++)
        for (int64_t c = 0; c < d.dim[1]; c++)
            for (int64_t z = 0; z < d.dim[2]; z++)
                for (int64_t h = 0; h < d.dim[3]; h++) {
                    char *dr = elem_at(a->out.data, n * d.st[0] + c * d.st[1] + z * d.st[2] + h * d.st[3], es);
                    const int64_t sz = cw_pad_src(z, pz, x.dim[2], mode), sh = cw_pad_src(h, ph, x.dim[3], mode);
                    if (sz < 0 || sh < 0) {
                        set_row(dr, d.st[4], d.dim[4], fill, es);
                        continue;
                    }
                    const int64_t ox = n * x.st[0] + c * x.st[1] + sz * x.st[2] + sh * x.st[3];
                    const char *xr = elem_at(a->in[0].data, ox, es);
                    const int rep = mode == CW_PAD_REPLICATE;
                    set_row(dr, d.st[4], pw, rep ? xr : fill, es);
                    char *dm = dr + pw * d.st[4] * (int64_t)es;
                    if (d.st[4] == 1 && x.st[4] == 1)
                        memcpy(dm, xr, (size_t)xw * es);
                    else
                        up_row(dm, d.st[4], xr, x.st[4], xw, 1, es);
                    set_row(dm + xw * d.st[4] * (int64_t)es, d.st[4], qw,
                            rep ? xr + (xw - 1) * x.st[4] * (int64_t)es : fill, es);
                }
}

/* One output row of depth to space along W: o[(s fw + k) sd] = x[k cs + s ws] for s < xw,
 * k < fw (cs: the channel stride, the source's k-th channel), bits of es bytes. */
static void d2s_row(char *d, int64_t sd, const char *x, int64_t xw, int64_t fw, int64_t cs, int64_t ws, size_t es) {
    if (es == 4) {
        uint32_t *o = (uint32_t *)d;
        const uint32_t *i = (const uint32_t *)x;
        for (int64_t s = 0; s < xw; s++)
            for (int64_t k = 0; k < fw; k++) o[(s * fw + k) * sd] = i[k * cs + s * ws];
    } else {
        uint16_t *o = (uint16_t *)d;
        const uint16_t *i = (const uint16_t *)x;
        for (int64_t s = 0; s < xw; s++)
            for (int64_t k = 0; k < fw; k++) o[(s * fw + k) * sd] = i[k * cs + s * ws];
    }
}

/* Depth to space (d2s) or space to depth, per output row of W. d2s: output row (c, z, y)
 * reads channels c F + ((z % fd) fh + y % fh) fw + 0..fw-1 at (z / fd, y / fh), interleaved
 * along W. Space to depth: output row (c, z, y) reads input row (c / F, z fd + i, y fh + j)
 * from element k with stride fw, where c % F = (i fh + j) fw + k. */
static void shuffle_run(const cw__op_args *a, int d2s) {
    ncdhw d, x;
    view_ncdhw(&a->out, &d);
    view_ncdhw(&a->in[0], &x);
    const size_t es = cw_dtype_size(a->out.d.dtype);
    const int64_t fd = a->param.i[0], fh = a->param.i[1], fw = a->param.i[2], f = fd * fh * fw;
    for (int64_t n = 0; n < d.dim[0]; n++)
        for (int64_t c = 0; c < d.dim[1]; c++)
            for (int64_t z = 0; z < d.dim[2]; z++)
                for (int64_t y = 0; y < d.dim[3]; y++) {
                    char *dr = elem_at(a->out.data, n * d.st[0] + c * d.st[1] + z * d.st[2] + y * d.st[3], es);
                    if (d2s) {
                        const int64_t xc = c * f + ((z % fd) * fh + y % fh) * fw;
                        const int64_t ox = n * x.st[0] + xc * x.st[1] + (z / fd) * x.st[2] + (y / fh) * x.st[3];
                        d2s_row(dr, d.st[4], elem_at(a->in[0].data, ox, es), x.dim[4], fw, x.st[1], x.st[4], es);
                    } else {
                        const int64_t r = c % f, i = r / (fh * fw), j = r / fw % fh, k = r % fw;
                        const int64_t ox = n * x.st[0] + (c / f) * x.st[1] + (z * fd + i) * x.st[2] +
                                           (y * fh + j) * x.st[3] + k * x.st[4];
                        up_row(dr, d.st[4], elem_at(a->in[0].data, ox, es), x.st[4] * fw, d.dim[4], 1, es);
                    }
                }
}

void cw__cpu_op_exec(const cw__op_args *a) {
    switch (a->code) {
    case CW_OP_CHANNEL: channel_run(a); break;
    case CW_OP_AVG_POOL2: avg_pool2_run(a); break;
    case CW_OP_UNARY: map_run(a); break;
    case CW_OP_BINARY: map_run(a); break;
    case CW_OP_UPSAMPLE_NEAREST: upsample_nearest_run(a); break;
    case CW_OP_REDUCE_CHANNELS: reduce_channels_run(a); break;
    case CW_OP_CONCAT: concat_run(a); break;
    case CW_OP_SLICE: slice_run(a); break;
    case CW_OP_PAD: pad_run(a); break;
    case CW_OP_DEPTH_TO_SPACE: shuffle_run(a, 1); break;
    case CW_OP_SPACE_TO_DEPTH: shuffle_run(a, 0); break;
    default: break; /* cw__op_run admits only known codes */
    }
}

static void op_fn(void *arg) { cw__cpu_op_exec((const cw__op_args *)arg); }

/* a was checked by cw__op_run. */
static cw_status cpu_op(cw__backend *be, cw__stream *s, const cw__op_args *a) {
    return enqueue_copy(be, s, cw_op_get_info(a->code).name, op_fn, a, sizeof *a);
}

/* ---- GEMM ----------------------------------------------------------------------------- */

typedef struct gemm_closure {
    cw__gemm_params p;
    cw__backend *be;
} gemm_closure;

static void gemm_fn(void *arg) {
    gemm_closure *k = (gemm_closure *)arg;
    cw__cpu_sgemm(&k->p, k->p.threads > 0 ? k->p.threads : cw__cpu_blas_threads(k->be));
}

/* Checked by cw__op_gemm, but for OpenBLAS's int sizes. */
static cw_status cpu_gemm(cw__backend *be, cw__stream *s, const cw__gemm_params *p) {
    int64_t big = p->m > p->n ? p->m : p->n;
    big = big > p->k ? big : p->k;
    int64_t ld[3] = {p->lda, p->ldb, p->ldc};
    for (int i = 0; i < 3; i++) big = big > ld[i] ? big : ld[i];
    if (big > INT_MAX)
        return cw__error(be->ctx, CW_ERR_UNSUPPORTED, "gemm: a size or leading dimension (%lld) exceeds BLAS int",
                         (long long)big);
    gemm_closure k;
    k.p = *p;
    k.be = be;
    return enqueue_copy(be, s, "gemm", gemm_fn, &k, sizeof k);
}

/* ---- softmax -------------------------------------------------------------------------- */

CW_CPU_CLONES void cw__cpu_softmax_rows_run(float *x, int64_t rows, int64_t cols, int64_t ld) {
    for (int64_t r = 0; r < rows; r++) {
        float *row = x + r * ld;
        float mx = cw_softmax_row_max(row, cols);
        double sum = cw_softmax_row_exp_sum(row, cols, mx);
        cw_softmax_row_scale(row, cols, (float)(1.0 / sum));
    }
}

typedef struct softmax_closure {
    float *x;
    int64_t rows, cols, ld;
} softmax_closure;

static void softmax_fn(void *arg) {
    softmax_closure *k = (softmax_closure *)arg;
    cw__cpu_softmax_rows_run(k->x, k->rows, k->cols, k->ld);
}

/* Checked by cw__op_softmax_rows. */
static cw_status cpu_softmax_rows(cw__backend *be, cw__stream *s, float *x, int64_t rows, int64_t cols, int64_t ld) {
    softmax_closure k;
    k.x = x;
    k.rows = rows;
    k.cols = cols;
    k.ld = ld;
    return enqueue_copy(be, s, "softmax_rows", softmax_fn, &k, sizeof k);
}

/* ---- the cpu backend's ops table -------------------------------------------------------- */

const cw__ops_i cw__cpu_ops = {
    .conv_algos = cw__cpu_conv_algos,
    .conv_forward = cw__cpu_conv_forward,
    .conv_prepare = cw__cpu_conv_prepare,
    .conv_release = cw__cpu_conv_release,
    .prep = cpu_prep,
    .gn_stats = cpu_gn_stats,
    .gn_finalize = cpu_gn_finalize,
    .add = cpu_add,
    .op = cpu_op,
    .gemm = cpu_gemm,
    .softmax_rows = cpu_softmax_rows,
};
