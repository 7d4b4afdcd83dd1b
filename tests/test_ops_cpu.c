/* The cpu backend's light ops (prep, GroupNorm stats/finalize, add, gemm, softmax) against
 * naive double-precision references on random strided shapes, the synchronous *_run
 * functions directly and the same ops through a real cpu backend's hooks and stream; and
 * prep (every pair of src/dst dtypes), GroupNorm statistics, add and the per-channel op in
 * f16 and bf16 storage, each element checked bit for bit against the scalar conversions of
 * core/half.h around the f32 math, and against the double reference within a bound derived
 * from the dtype's unit roundoff. */
#include <cblas.h>
#include <float.h>
#include <pthread.h>
#include <stdint.h>

#include "backend/cpu/cpu.h"
#include "core/half.h"
#include "kernels/kernels.h"
#include "testutil.h"

static cw_rng rng;

/* ---- strided buffers ------------------------------------------------------------------ */

/* A view over a padded allocation: random gaps after each dim, inner stride 1 or 2. The
 * whole allocation is pre-filled so writes outside the view can be detected. */
typedef struct sbuf {
    cw__view v;
    float *mem;
    int64_t len;
} sbuf;

static void sbuf_make(sbuf *b, int rank, const int64_t *dims, int strided) {
    memset(b, 0, sizeof *b);
    b->v.d.dtype = CW_F32;
    b->v.d.rank = rank;
    int64_t s = strided ? cw_rng_range(&rng, 1, 2) : 1;
    for (int i = rank - 1; i >= 0; i--) {
        b->v.d.dims[i] = dims[i];
        b->v.d.strides[i] = s;
        s = s * dims[i] + (strided ? cw_rng_range(&rng, 0, 3) : 0);
    }
    b->len = s;
    b->mem = malloc((size_t)s * sizeof(float));
    ASSERT_TRUE(b->mem != NULL);
    b->v.data = b->mem;
}

static void sbuf_fill(sbuf *b, float lo, float hi) {
    for (int64_t i = 0; i < b->len; i++) b->mem[i] = lo + (hi - lo) * 0.5f * (cw_rng_float(&rng) + 1.0f);
}

static void sbuf_free(sbuf *b) { free(b->mem); }

/* Offset in elements of a multi-index of the view. */
static int64_t voff(const cw__view *v, const int64_t *idx) {
    int64_t o = 0;
    for (int i = 0; i < v->d.rank; i++) o += idx[i] * v->d.strides[i];
    return o;
}

/* Marks which allocation slots a view covers (for the untouched-outside check). */
static unsigned char *covered(const sbuf *b, const cw__view *v) {
    unsigned char *m = calloc((size_t)b->len, 1);
    int64_t n = cw__desc_numel(&v->d), idx[CW_MAX_RANK] = {0};
    int64_t base = (const float *)v->data - b->mem;
    for (int64_t e = 0; e < n; e++) {
        m[base + voff(v, idx)] = 1;
        for (int i = v->d.rank - 1; i >= 0; i--) {
            if (++idx[i] < v->d.dims[i]) break;
            idx[i] = 0;
        }
    }
    return m;
}

static double silu_ref(double x) { return x / (1.0 + exp(-x)); }

static double close_tol(double ref, double rel, double abs_) { return rel * fabs(ref) + abs_; }

/* ---- silu ----------------------------------------------------------------------------- */

static void test_silu(void) {
    const float xs[] = {-FLT_MAX, -1e30f, -1000.0f, -104.0f, -88.8f, -87.0f, -30.0f, -5.0f, -1e-3f, -1e-30f, 0.0f,
                        1e-30f,   1e-3f,  0.5f,     5.0f,    30.0f,  88.8f,  1000.0f, 1e30f,  FLT_MAX};
    for (size_t i = 0; i < sizeof xs / sizeof xs[0]; i++) {
        float got = cw_silu(xs[i]);
        double ref = silu_ref((double)xs[i]);
        CHECK(isfinite(got));
        /* absolute floor: results below ~1e-38 are float denormals */
        if (!(fabs((double)got - ref) <= close_tol(ref, 2e-6, 1e-38))) {
            fprintf(stderr, "silu(%g) = %.9g, ref %.17g\n", (double)xs[i], (double)got, ref);
            cw_test_failures++;
        }
    }
    CHECK(isnan(cw_silu(NAN)));
    /* x86's default NaN has the sign bit set (what an overflow produces): NaN out, and no
     * float-to-int conversion of a NaN on the way (UBSan stops on that) */
    CHECK(isnan(cw_silu(-NAN)));
    CHECK(isnan(cw_exp_neg(-NAN)) && isnan(cw_exp_neg(NAN)));
    CHECK(cw_exp_neg(INFINITY) == 0.0f);
    CHECK(cw_silu(INFINITY) == INFINITY);
    uint32_t bits = CW_POISON_NAN_BITS;
    float f;
    memcpy(&f, &bits, sizeof f);
    CHECK(isnan(f));
    /* and NaN in each half read as f16 or bf16 (the buffers of half-precision plans) */
    CHECK(isnan(cw__f16_to_f32((uint16_t)bits)) && isnan(cw__f16_to_f32((uint16_t)(bits >> 16))));
    CHECK(isnan(cw__bf16_to_f32((uint16_t)bits)) && isnan(cw__bf16_to_f32((uint16_t)(bits >> 16))));
}

/* ---- prep ----------------------------------------------------------------------------- */

/* One random prep case; be != NULL: through the backend hook on stream st. */
static void prep_case(cw__backend *be, cw__stream *st, int iter) {
    int rank = cw_rng_range(&rng, 0, 3) ? 4 : 5;
    int64_t N = cw_rng_range(&rng, 1, 2), C = cw_rng_range(&rng, 1, 5);
    int64_t D = rank == 5 ? cw_rng_range(&rng, 1, 3) : 1;
    int64_t Hf = cw_rng_range(&rng, 1, 12), Ws = cw_rng_range(&rng, 1, 19);
    int64_t up = iter % 3 == 0 ? 1 : (iter % 3 == 1 ? 2 : cw_rng_range(&rng, 1, 4));
    int norm = cw_rng_range(&rng, 0, 1), silu = cw_rng_range(&rng, 0, 1);
    int strided = cw_rng_range(&rng, 0, 2) != 0;
    /* the producer tensor (full height) */
    int64_t fd[5] = {N, C, D, Hf, Ws};
    if (rank == 4) fd[2] = Hf, fd[3] = Ws;
    sbuf full;
    sbuf_make(&full, rank, fd, strided);
    sbuf_fill(&full, -4.0f, 4.0f);
    /* a destination band [r0, r0 + hd) of the upsampled tensor, often in the middle */
    int64_t Hup = Hf * up;
    int64_t r0 = cw_rng_range(&rng, 0, Hup - 1), hd = cw_rng_range(&rng, 1, Hup - r0);
    int64_t need0 = r0 / up, need1 = (r0 + hd - 1) / up + 1;
    int64_t s0 = cw_rng_range(&rng, 0, need0), s1 = cw_rng_range(&rng, need1, Hf);
    int64_t Wd = Ws * up - (up > 1 ? cw_rng_range(&rng, 0, up - 1) : 0);
    /* src: the band [s0, s1) of the producer, as a view with the producer's strides */
    cw__view src = full.v;
    src.d.dims[rank - 2] = s1 - s0;
    src.data = full.mem + s0 * full.v.d.strides[rank - 2];
    int64_t dd[5] = {N, C, D, hd, Wd};
    if (rank == 4) dd[2] = hd, dd[3] = Wd;
    sbuf dst;
    sbuf_make(&dst, rank, dd, cw_rng_range(&rng, 0, 1));
    const float sentinel = 12345.0f;
    for (int64_t i = 0; i < dst.len; i++) dst.mem[i] = sentinel;
    float *scale = NULL, *shift = NULL;
    if (norm) {
        scale = malloc((size_t)(N * C) * sizeof(float));
        shift = malloc((size_t)(N * C) * sizeof(float));
        for (int64_t i = 0; i < N * C; i++) {
            scale[i] = 2.0f * cw_rng_float(&rng);
            shift[i] = cw_rng_float(&rng);
        }
    }
    cw__prep_params p;
    memset(&p, 0, sizeof p);
    p.src = src;
    p.dst = dst.v;
    p.scale = scale;
    p.shift = shift;
    p.silu = silu;
    p.up = (int)up;
    p.dst_row0 = r0;
    p.src_row0 = s0;
    if (be) {
        ASSERT_OK(cw__op_prep(be, st, &p));
        ASSERT_OK(be->rt->stream_synchronize(be, st));
    } else {
        cw__cpu_prep_run(&p);
    }
    /* reference straight from the full producer tensor: row (r0 + r) / up, column w / up */
    int64_t bad = 0;
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++)
            for (int64_t z = 0; z < D; z++)
                for (int64_t r = 0; r < hd; r++)
                    for (int64_t w = 0; w < Wd; w++) {
                        int64_t si[5], di[5];
                        if (rank == 5) {
                            int64_t a[5] = {n, c, z, (r0 + r) / up, w / up}, b[5] = {n, c, z, r, w};
                            memcpy(si, a, sizeof a), memcpy(di, b, sizeof b);
                        } else {
                            int64_t a[4] = {n, c, (r0 + r) / up, w / up}, b[4] = {n, c, r, w};
                            memcpy(si, a, sizeof a), memcpy(di, b, sizeof b);
                        }
                        double x = full.mem[voff(&full.v, si)];
                        if (norm) x = x * scale[n * C + c] + shift[n * C + c];
                        if (silu) x = silu_ref(x);
                        double got = dst.mem[voff(&dst.v, di)];
                        if (!(fabs(got - x) <= close_tol(x, 2e-6, 2e-6))) {
                            if (bad++ < 5)
                                fprintf(stderr, "prep iter %d: [%lld,%lld,%lld,%lld,%lld] got %.9g ref %.9g\n", iter,
                                        (long long)n, (long long)c, (long long)z, (long long)r, (long long)w, got, x);
                        }
                    }
    /* nothing written outside the dst view */
    unsigned char *m = covered(&dst, &dst.v);
    for (int64_t i = 0; i < dst.len; i++)
        if (!m[i] && dst.mem[i] != sentinel) bad++;
    free(m);
    if (bad) {
        fprintf(stderr,
                "prep iter %d FAILED (%lld bad): rank %d N %lld C %lld D %lld Hf %lld Ws %lld up %lld norm %d silu %d "
                "r0 %lld hd %lld s0 %lld s1 %lld Wd %lld\n",
                iter, (long long)bad, rank, (long long)N, (long long)C, (long long)D, (long long)Hf, (long long)Ws,
                (long long)up, norm, silu, (long long)r0, (long long)hd, (long long)s0, (long long)s1,
                (long long)Wd);
        cw_test_failures++;
    }
    free(scale);
    free(shift);
    sbuf_free(&full);
    sbuf_free(&dst);
}

/* ---- GroupNorm ------------------------------------------------------------------------ */

typedef struct gn_ref {
    double mean, var;
    int64_t count;
} gn_ref;

/* Naive two-pass statistics in double over the whole (n, g). */
static void gn_reference(const sbuf *x, int64_t groups, gn_ref *out) {
    const cw__view *v = &x->v;
    int rank = v->d.rank;
    int64_t N = v->d.dims[0], C = v->d.dims[1], cpg = C / groups;
    int64_t rest = cw__desc_numel(&v->d) / (N * C); /* elements per (n, c) */
    for (int64_t n = 0; n < N; n++)
        for (int64_t g = 0; g < groups; g++) {
            double s = 0, s2 = 0;
            int64_t cnt = 0;
            for (int pass = 0; pass < 2; pass++) {
                double mean = pass ? s / (double)cnt : 0;
                for (int64_t c = g * cpg; c < (g + 1) * cpg; c++)
                    for (int64_t e = 0; e < rest; e++) {
                        int64_t idx[5] = {n, c, 0, 0, 0}, q = e;
                        for (int i = rank - 1; i >= 2; i--) {
                            idx[i] = q % v->d.dims[i];
                            q /= v->d.dims[i];
                        }
                        double val = ((const float *)v->data)[voff(v, idx)];
                        if (pass) {
                            s2 += (val - mean) * (val - mean);
                        } else {
                            s += val;
                            cnt++;
                        }
                    }
            }
            out[n * groups + g].count = cnt;
            out[n * groups + g].mean = s / (double)cnt;
            out[n * groups + g].var = s2 / (double)cnt;
        }
}

/* Random sorted cut points splitting [0, H) into P non-empty bands: bounds[0..P]. */
static void random_split(int64_t H, int64_t P, int64_t *bounds) {
    /* choose P-1 distinct cuts in 1..H-1 by a partial Fisher-Yates shuffle */
    ASSERT_TRUE(P >= 1 && P <= H);
    int64_t *pool = malloc((size_t)H * sizeof(int64_t));
    for (int64_t i = 0; i < H - 1; i++) pool[i] = i + 1;
    for (int64_t i = 0; i < P - 1 && i < H - 1; i++) {
        int64_t j = cw_rng_range(&rng, i, H - 2);
        int64_t t = pool[i];
        pool[i] = pool[j];
        pool[j] = t;
    }
    bounds[0] = 0;
    for (int64_t i = 0; i < P - 1; i++) bounds[i + 1] = pool[i];
    bounds[P] = H;
    for (int64_t i = 1; i < P; i++) /* insertion sort of the cuts */
        for (int64_t j = i; j > 1 && bounds[j - 1] > bounds[j]; j--) {
            int64_t t = bounds[j];
            bounds[j] = bounds[j - 1];
            bounds[j - 1] = t;
        }
    free(pool);
}

/* Partial stats of the bands given by bounds, each a row-band view of x. */
static void gn_partials(cw__backend *be, cw__stream *st, const sbuf *x, int64_t groups, const int64_t *bounds,
                        int64_t P, double *parts) {
    int rank = x->v.d.rank;
    int64_t NG3 = x->v.d.dims[0] * groups * 3;
    for (int64_t p = 0; p < P; p++) {
        cw__view band = x->v;
        band.d.dims[rank - 2] = bounds[p + 1] - bounds[p];
        band.data = (float *)x->v.data + bounds[p] * x->v.d.strides[rank - 2];
        if (be)
            ASSERT_OK(cw__op_gn_stats(be, st, &band, groups, parts + p * NG3));
        else
            cw__cpu_gn_stats_run(&band, groups, parts + p * NG3);
    }
}

static double max_rel_mean = 0, max_rel_var = 0, max_rel_ss = 0;

static void gn_case(int iter, int big) {
    int rank = cw_rng_range(&rng, 0, 2) ? 4 : 5;
    int64_t groups = big ? 32 : cw_rng_range(&rng, 1, 4);
    int64_t cpg = big ? 2 : cw_rng_range(&rng, 1, 4);
    int64_t N = big ? 1 : cw_rng_range(&rng, 1, 2), C = groups * cpg;
    int64_t D = rank == 5 ? cw_rng_range(&rng, 1, 3) : 1;
    int64_t H = big ? 96 : cw_rng_range(&rng, 1, 14), W = big ? 80 : cw_rng_range(&rng, 1, 17);
    int64_t dims[5] = {N, C, D, H, W};
    if (rank == 4) dims[2] = H, dims[3] = W;
    sbuf x;
    sbuf_make(&x, rank, dims, cw_rng_range(&rng, 0, 1));
    /* per-(n, g) offset and spread; small spread on a large offset stresses cancellation */
    {
        sbuf_fill(&x, -1.0f, 1.0f);
        int64_t rest = cw__desc_numel(&x.v.d) / (N * C);
        for (int64_t n = 0; n < N; n++)
            for (int64_t g = 0; g < groups; g++) {
                float off = 8.0f * cw_rng_float(&rng), spread = cw_rng_range(&rng, 0, 3) ? 2.0f : 0.01f;
                for (int64_t c = g * cpg; c < (g + 1) * cpg; c++)
                    for (int64_t e = 0; e < rest; e++) {
                        int64_t idx[5] = {n, c, 0, 0, 0}, q = e;
                        for (int i = rank - 1; i >= 2; i--) {
                            idx[i] = q % x.v.d.dims[i];
                            q /= x.v.d.dims[i];
                        }
                        float *px = x.mem + voff(&x.v, idx);
                        *px = off + spread * *px;
                    }
            }
    }
    gn_ref *ref = malloc((size_t)(N * groups) * sizeof(gn_ref));
    gn_reference(&x, groups, ref);
    float *gamma = malloc((size_t)C * sizeof(float)), *beta = malloc((size_t)C * sizeof(float));
    for (int64_t c = 0; c < C; c++) {
        gamma[c] = 1.0f + 0.5f * cw_rng_float(&rng);
        beta[c] = cw_rng_float(&rng);
    }
    const float eps = 1e-6f;
    int64_t NG3 = N * groups * 3;
    double *parts = malloc((size_t)(H * NG3) * sizeof(double));
    int64_t *bounds = malloc((size_t)(H + 1) * sizeof(int64_t));
    float *sc1 = malloc((size_t)(N * C) * sizeof(float)), *sh1 = malloc((size_t)(N * C) * sizeof(float));
    float *sc = malloc((size_t)(N * C) * sizeof(float)), *sh = malloc((size_t)(N * C) * sizeof(float));
    int64_t Pmax = big ? 8 : H, nonbitwise = 0;
    for (int64_t P = 1; P <= Pmax; P++) {
        random_split(H, P, bounds);
        gn_partials(NULL, NULL, &x, groups, bounds, P, parts);
        /* merged moments vs the naive two-pass reference */
        for (int64_t i = 0; i < N * groups; i++) {
            cw_moments m;
            cw_moments_zero(&m);
            for (int64_t p = 0; p < P; p++) {
                const double *q = parts + p * NG3 + i * 3;
                cw_moments_merge(&m, q[0], q[1], q[2]);
            }
            double sd = sqrt(ref[i].var);
            double em = fabs(m.mean - ref[i].mean) / fmax(fabs(ref[i].mean), sd);
            double ev = fabs(m.m2 / m.count - ref[i].var) / ref[i].var;
            if (ref[i].var == 0) ev = fabs(m.m2); /* constant group (W = 1, one element) */
            max_rel_mean = cw_err_max(max_rel_mean, em);
            max_rel_var = cw_err_max(max_rel_var, ev);
            if (m.count != (double)ref[i].count || !(em <= 1e-10) || !(ev <= 1e-10)) {
                fprintf(stderr, "gn iter %d P %lld (n,g) %lld: count %g/%lld mean %.17g/%.17g var %.17g/%.17g\n",
                        iter, (long long)P, (long long)i, m.count, (long long)ref[i].count, m.mean, ref[i].mean,
                        m.m2 / m.count, ref[i].var);
                cw_test_failures++;
            }
        }
        cw__cpu_gn_finalize_run(parts, P, N, C, groups, gamma, beta, eps, sc, sh);
        for (int64_t n = 0; n < N; n++)
            for (int64_t c = 0; c < C; c++) {
                const gn_ref *r = &ref[n * groups + c / cpg];
                double rs = 1.0 / sqrt(r->var + (double)eps);
                double s_ref = gamma[c] * rs, h_ref = beta[c] - r->mean * s_ref;
                double es = fabs(sc[n * C + c] - s_ref) / fabs(s_ref);
                /* shift relative to its terms: beta - mean*scale can cancel */
                double eh = fabs(sh[n * C + c] - h_ref) / (fabs(beta[c]) + fabs(r->mean * s_ref));
                max_rel_ss = cw_err_max(cw_err_max(max_rel_ss, es), eh);
                if (!(es <= 1e-6) || !(eh <= 1e-6)) {
                    fprintf(stderr, "gn iter %d P %lld n %lld c %lld: scale %.9g/%.9g shift %.9g/%.9g\n", iter,
                            (long long)P, (long long)n, (long long)c, (double)sc[n * C + c], s_ref,
                            (double)sh[n * C + c], h_ref);
                    cw_test_failures++;
                }
            }
        if (P == 1) {
            memcpy(sc1, sc, (size_t)(N * C) * sizeof(float));
            memcpy(sh1, sh, (size_t)(N * C) * sizeof(float));
        } else {
            /* every split gives the one-band scale/shift (to float rounding; mostly bitwise) */
            for (int64_t i = 0; i < N * C; i++) {
                if (sc[i] != sc1[i] || sh[i] != sh1[i]) nonbitwise++;
                double d1 = fabs((double)sc[i] - sc1[i]) / fabs((double)sc1[i]);
                double d2 = fabs((double)sh[i] - sh1[i]) / (fabs((double)sh1[i]) + fabs((double)sc1[i]) * 8.0);
                if (!(d1 <= 1e-6) || !(d2 <= 1e-6)) {
                    fprintf(stderr, "gn iter %d: split P %lld differs at %lld: %.9g/%.9g %.9g/%.9g\n", iter,
                            (long long)P, (long long)i, (double)sc[i], (double)sc1[i], (double)sh[i],
                            (double)sh1[i]);
                    cw_test_failures++;
                }
            }
        }
    }
    if (big) fprintf(stderr, "gn big case: %lld of %lld split scale/shift values not bitwise equal to P = 1\n",
                     (long long)nonbitwise, (long long)((Pmax - 1) * N * C));
    free(sc1), free(sh1), free(sc), free(sh), free(bounds), free(parts), free(gamma), free(beta), free(ref);
    sbuf_free(&x);
}

/* ---- add ------------------------------------------------------------------------------ */

static void add_case(cw__backend *be, cw__stream *st, int iter) {
    int rank = (int)cw_rng_range(&rng, 1, 5);
    int64_t dims[5];
    for (int i = 0; i < rank; i++) dims[i] = cw_rng_range(&rng, 1, rank > 3 ? 5 : 11);
    int alias = (int)cw_rng_range(&rng, 0, 2); /* 0: separate dst, 1: dst = a, 2: dst = b */
    int strided = iter % 4 != 0;               /* every 4th case all contiguous (fast path) */
    sbuf a, b, d;
    sbuf_make(&a, rank, dims, strided);
    sbuf_make(&b, rank, dims, strided);
    sbuf_make(&d, rank, dims, strided);
    sbuf_fill(&a, -100.0f, 100.0f);
    sbuf_fill(&b, -1.0f, 1.0f);
    const float sentinel = -777.0f;
    for (int64_t i = 0; i < d.len; i++) d.mem[i] = sentinel;
    float *a0 = malloc((size_t)a.len * sizeof(float)), *b0 = malloc((size_t)b.len * sizeof(float));
    memcpy(a0, a.mem, (size_t)a.len * sizeof(float));
    memcpy(b0, b.mem, (size_t)b.len * sizeof(float));
    const cw__view *dv = alias == 1 ? &a.v : alias == 2 ? &b.v : &d.v;
    if (be) {
        ASSERT_OK(cw__op_add(be, st, dv, &a.v, &b.v));
        ASSERT_OK(be->rt->stream_synchronize(be, st));
    } else {
        cw__cpu_add_run(dv, &a.v, &b.v);
    }
    const sbuf *db = alias == 1 ? &a : alias == 2 ? &b : &d;
    int64_t n = cw__desc_numel(&a.v.d), idx[5] = {0}, bad = 0;
    for (int64_t e = 0; e < n; e++) {
        /* float addition is correctly rounded: the double sum rounded once must match */
        float ref = (float)((double)a0[voff(&a.v, idx)] + (double)b0[voff(&b.v, idx)]);
        if (db->mem[voff(dv, idx)] != ref) bad++;
        for (int i = rank - 1; i >= 0; i--) {
            if (++idx[i] < dims[i]) break;
            idx[i] = 0;
        }
    }
    unsigned char *m = covered(db, dv);
    const float *orig = alias == 1 ? a0 : alias == 2 ? b0 : NULL;
    for (int64_t i = 0; i < db->len; i++)
        if (!m[i] && db->mem[i] != (orig ? orig[i] : sentinel)) bad++;
    free(m);
    if (bad) {
        fprintf(stderr, "add iter %d FAILED: rank %d alias %d strided %d: %lld bad\n", iter, rank, alias, strided,
                (long long)bad);
        cw_test_failures++;
    }
    free(a0), free(b0);
    sbuf_free(&a), sbuf_free(&b), sbuf_free(&d);
}

/* ---- gemm ----------------------------------------------------------------------------- */

/* C = alpha op(A) op(B) + beta C of these sizes (random operands, leading dimensions and
 * alpha/beta) against a double loop; on the host (be NULL) with threads threads and, where
 * split_check, 2 and 3 threads for the bits of 1. */
static void gemm_check(cw__backend *be, cw__stream *st, int iter, int ta, int tb, int64_t M, int64_t N, int64_t K,
                       int threads, int split_check, int64_t ldb_fixed) {
    int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
    int64_t lda = ac + cw_rng_range(&rng, 1, 5), ldb = bc + cw_rng_range(&rng, 1, 5), ldc = N + cw_rng_range(&rng, 1, 5);
    if (ldb_fixed) ldb = ldb_fixed;
    float *A = malloc((size_t)(ar * lda) * sizeof(float)), *B = malloc((size_t)(br * ldb) * sizeof(float));
    float *Cm = malloc((size_t)(M * ldc) * sizeof(float)), *C0 = malloc((size_t)(M * ldc) * sizeof(float));
    for (int64_t i = 0; i < ar * lda; i++) A[i] = cw_rng_float(&rng);
    for (int64_t i = 0; i < br * ldb; i++) B[i] = cw_rng_float(&rng);
    float alpha = 0.5f + cw_rng_float(&rng), beta = iter % 3 == 0 ? 0.0f : cw_rng_float(&rng);
    for (int64_t i = 0; i < M * ldc; i++) {
        int64_t col = i % ldc;
        /* beta = 0 must ignore C: poison it with NaN there (the padding keeps its value) */
        C0[i] = (beta == 0.0f && col < N) ? NAN : cw_rng_float(&rng);
    }
    memcpy(Cm, C0, (size_t)(M * ldc) * sizeof(float));
    cw__gemm_params p;
    memset(&p, 0, sizeof p);
    p.trans_a = ta, p.trans_b = tb, p.m = M, p.n = N, p.k = K, p.alpha = alpha, p.beta = beta;
    p.a = A, p.lda = lda, p.b = B, p.ldb = ldb, p.c = Cm, p.ldc = ldc;
    if (be) {
        ASSERT_OK(cw__op_gemm(be, st, &p));
        ASSERT_OK(be->rt->stream_synchronize(be, st));
    } else {
        cw__cpu_sgemm(&p, threads);
    }
    int64_t bad = 0;
    for (int64_t i = 0; i < M; i++) {
        for (int64_t j = 0; j < N; j++) {
            double s = 0, sabs = 0;
            for (int64_t l = 0; l < K; l++) {
                double av = ta ? A[l * lda + i] : A[i * lda + l];
                double bv = tb ? B[j * ldb + l] : B[l * ldb + j];
                s += av * bv;
                sabs += fabs(av * bv);
            }
            double cv = beta == 0.0f ? 0.0 : (double)C0[i * ldc + j];
            double ref = alpha * s + beta * cv;
            double tol = 1e-5 * (fabs(alpha) * sabs + fabs(beta * cv)) + 1e-30;
            if (!(fabs(Cm[i * ldc + j] - ref) <= tol)) bad++;
        }
        for (int64_t j = N; j < ldc; j++)
            if (memcmp(&Cm[i * ldc + j], &C0[i * ldc + j], sizeof(float)) != 0) bad++;
    }
    if (bad) {
        fprintf(stderr, "gemm iter %d FAILED: ta %d tb %d M %lld N %lld K %lld ld %lld/%lld/%lld beta %g: %lld bad\n",
                iter, ta, tb, (long long)M, (long long)N, (long long)K, (long long)lda, (long long)ldb,
                (long long)ldc, (double)beta, (long long)bad);
        cw_test_failures++;
    }
    if (!be && threads == 1 && split_check) {
        /* convweave owns the split (cw__cpu_gemm_blocks): 2 and 3 threads give the bits of 1 */
        float *C2 = malloc((size_t)(M * ldc) * sizeof(float));
        for (int t = 2; t <= 3; t++) {
            memcpy(C2, C0, (size_t)(M * ldc) * sizeof(float));
            p.c = C2;
            cw__cpu_sgemm(&p, t);
            if (memcmp(C2, Cm, (size_t)(M * ldc) * sizeof(float)) != 0) {
                fprintf(stderr, "gemm iter %d: 1 and %d threads give different bits\n", iter, t);
                cw_test_failures++;
            }
        }
        free(C2);
    }
    free(A), free(B), free(Cm), free(C0);
}

static void gemm_case(cw__backend *be, cw__stream *st, int iter, int ta, int tb, int64_t maxdim, int threads) {
    /* the big cases reach several column blocks (N > 1024) with a short K for the reference */
    int wide = maxdim >= 300 && iter % 10 == 0;
    int64_t M = cw_rng_range(&rng, 1, maxdim), N = cw_rng_range(&rng, 1, wide ? 6 * maxdim : maxdim),
            K = cw_rng_range(&rng, 1, wide ? 64 : maxdim);
    gemm_check(be, st, iter, ta, tb, M, N, K, threads, maxdim >= 64, 0);
}

/* cw__cpu_gemm1's cut (built with oneDNN): one call while A (M x K) stays within 2^18
 * floats and B (K x N) under, else row, column and k blocks accumulated in order; a B whose
 * leading dimension is a multiple of 1024 floats copied in column chunks from 64 rows on
 * (gemm_block); without oneDNN each is one OpenBLAS call. Every transpose, and beta both 0
 * and not. */
static void test_gemm1_blocks(void) {
    static const int64_t mnk[][4] = {
        {64, 511, 512, 0},   /* B 2^18 - 512 floats: one call */
        {64, 512, 512, 0},   /* B 2^18: column blocks of 496 */
        {513, 64, 511, 0},   /* A 2^18 - 1: one call */
        {514, 64, 511, 0},   /* A 2^18 + 510: row blocks of 512 */
        {40, 70, 4500, 0},   /* K > 4096: k blocks of 512, the last 404 */
        {250, 260, 1100, 0}, /* row and column blocks of 224 */
        {530, 9, 4097, 0},   /* all three */
        {96, 300, 200, 1024},  /* ldb 1024: B copied in chunks of 320 columns */
        {64, 1030, 40, 2048},  /* chunks of 1008 */
        {63, 200, 100, 1024},  /* 63 rows: not copied */
        {70, 150, 4500, 5120}, /* k blocks of 512 copied in chunks of 128 */
    };
    for (int c = 0; c < 11; c++)
        for (int t = 0; t < 4; t++) gemm_check(NULL, NULL, 1000 + 4 * c + t, t & 1, t >> 1, mnk[c][0], mnk[c][1],
                                               mnk[c][2], 1, 1, mnk[c][3]);
}

/* Concurrent gemm calls with different thread counts from host threads, and from two
 * backend streams: the results match the double reference and carry the bits of the same
 * call made alone (a thread share chosen from what else runs would change them on CPUs
 * whose BLAS kernels follow the split). */
typedef struct gemm_job {
    cw__gemm_params p;
    double *ref;
    float *solo;
    int threads, reps;
} gemm_job;

static void *gemm_thread(void *arg) {
    gemm_job *j = (gemm_job *)arg;
    for (int r = 0; r < j->reps; r++) cw__cpu_sgemm(&j->p, j->threads);
    return NULL;
}

static int64_t gemm_job_check(const gemm_job *j) {
    int64_t bad = 0;
    for (int64_t i = 0; i < j->p.m; i++)
        for (int64_t c = 0; c < j->p.n; c++) {
            double ref = j->ref[i * j->p.n + c], got = j->p.c[i * j->p.ldc + c];
            if (!(fabs(got - ref) <= 1e-5 * (double)j->p.k)) bad++;
            if (memcmp(&j->p.c[i * j->p.ldc + c], &j->solo[i * j->p.ldc + c], sizeof(float)) != 0) bad++;
        }
    return bad;
}

static void test_gemm_concurrent(cw__backend *be) {
    enum { J = 4 };
    gemm_job jobs[J];
    for (int t = 0; t < J; t++) {
        gemm_job *j = &jobs[t];
        int64_t M = 64 + 16 * t, N = 1100 + 50 * t, K = 40;
        memset(j, 0, sizeof *j);
        j->p.trans_a = t & 1, j->p.trans_b = t >> 1, j->p.m = M, j->p.n = N, j->p.k = K;
        j->p.alpha = 1.0f, j->p.beta = 0.0f; /* repeated runs give the same C */
        j->p.lda = (t & 1 ? M : K) + 3, j->p.ldb = (t >> 1 ? K : N) + 2, j->p.ldc = N + 1;
        float *A = malloc(sizeof(float) * (size_t)(K * j->p.lda + M * j->p.lda));
        float *B = malloc(sizeof(float) * (size_t)(K * j->p.ldb + N * j->p.ldb));
        for (int64_t i = 0; i < K * j->p.lda + M * j->p.lda; i++) A[i] = cw_rng_float(&rng);
        for (int64_t i = 0; i < K * j->p.ldb + N * j->p.ldb; i++) B[i] = cw_rng_float(&rng);
        j->p.a = A, j->p.b = B;
        j->p.c = calloc((size_t)(M * j->p.ldc), sizeof(float));
        j->ref = malloc(sizeof(double) * (size_t)(M * N));
        for (int64_t i = 0; i < M; i++)
            for (int64_t c = 0; c < N; c++) {
                double acc = 0;
                for (int64_t l = 0; l < K; l++)
                    acc += (double)(j->p.trans_a ? A[l * j->p.lda + i] : A[i * j->p.lda + l]) *
                           (double)(j->p.trans_b ? B[c * j->p.ldb + l] : B[l * j->p.ldb + c]);
                j->ref[i * N + c] = acc;
            }
        j->threads = 1 + (t & 1);
        j->reps = 6;
        j->solo = calloc((size_t)(M * j->p.ldc), sizeof(float));
        float *c = j->p.c;
        j->p.c = j->solo;
        cw__cpu_sgemm(&j->p, 1);
        j->p.c = c;
    }
    pthread_t th[J];
    for (int t = 0; t < J; t++) ASSERT_TRUE(pthread_create(&th[t], NULL, gemm_thread, &jobs[t]) == 0);
    for (int t = 0; t < J; t++) pthread_join(th[t], NULL);
    for (int t = 0; t < J; t++) {
        int64_t bad = gemm_job_check(&jobs[t]);
        if (bad) {
            fprintf(stderr, "concurrent gemm (host threads) job %d: %lld bad\n", t, (long long)bad);
            cw_test_failures++;
        }
        memset(jobs[t].p.c, 0, sizeof(float) * (size_t)(jobs[t].p.m * jobs[t].p.ldc));
    }
    cw__stream *s2[2];
    ASSERT_OK(be->rt->stream_create(be, &s2[0]));
    ASSERT_OK(be->rt->stream_create(be, &s2[1]));
    for (int r = 0; r < 3; r++)
        for (int t = 0; t < J; t++) ASSERT_OK(cw__op_gemm(be, s2[t & 1], &jobs[t].p));
    ASSERT_OK(be->rt->stream_synchronize(be, s2[0]));
    ASSERT_OK(be->rt->stream_synchronize(be, s2[1]));
    for (int t = 0; t < J; t++) {
        int64_t bad = gemm_job_check(&jobs[t]);
        if (bad) {
            fprintf(stderr, "concurrent gemm (two streams) job %d: %lld bad\n", t, (long long)bad);
            cw_test_failures++;
        }
        free((void *)jobs[t].p.a), free((void *)jobs[t].p.b), free(jobs[t].p.c), free(jobs[t].ref), free(jobs[t].solo);
    }
    be->rt->stream_destroy(be, s2[0]);
    be->rt->stream_destroy(be, s2[1]);
}

/* ---- softmax -------------------------------------------------------------------------- */

static void softmax_case(cw__backend *be, cw__stream *st, int iter) {
    int64_t rows = cw_rng_range(&rng, 1, 9), cols = cw_rng_range(&rng, 1, iter % 5 == 0 ? 3000 : 70);
    int64_t ld = cols + cw_rng_range(&rng, 0, 4);
    float *x = malloc((size_t)(rows * ld) * sizeof(float)), *x0 = malloc((size_t)(rows * ld) * sizeof(float));
    for (int64_t r = 0; r < rows; r++) {
        /* large offsets (+-1000) would overflow exp without the max subtraction */
        float off = (float)(cw_rng_range(&rng, -1, 1) * 1000), spread = (float)cw_rng_range(&rng, 1, 40);
        for (int64_t c = 0; c < ld; c++) x[r * ld + c] = c < cols ? off + spread * cw_rng_float(&rng) : -5.0f;
    }
    memcpy(x0, x, (size_t)(rows * ld) * sizeof(float));
    if (be) {
        ASSERT_OK(cw__op_softmax_rows(be, st, x, rows, cols, ld));
        ASSERT_OK(be->rt->stream_synchronize(be, st));
    } else {
        cw__cpu_softmax_rows_run(x, rows, cols, ld);
    }
    int64_t bad = 0;
    for (int64_t r = 0; r < rows; r++) {
        double mx = -INFINITY, sum = 0, got_sum = 0;
        for (int64_t c = 0; c < cols; c++) mx = fmax(mx, x0[r * ld + c]);
        for (int64_t c = 0; c < cols; c++) sum += exp((double)x0[r * ld + c] - mx);
        for (int64_t c = 0; c < cols; c++) {
            double ref = exp((double)x0[r * ld + c] - mx) / sum, got = x[r * ld + c];
            if (!isfinite(got) || !(fabs(got - ref) <= close_tol(ref, 1e-5, 1e-9))) bad++;
            got_sum += got;
        }
        if (!(fabs(got_sum - 1.0) <= 1e-5)) bad++;
        for (int64_t c = cols; c < ld; c++)
            if (x[r * ld + c] != -5.0f) bad++;
    }
    if (bad) {
        fprintf(stderr, "softmax iter %d FAILED: rows %lld cols %lld ld %lld: %lld bad\n", iter, (long long)rows,
                (long long)cols, (long long)ld, (long long)bad);
        cw_test_failures++;
    }
    free(x), free(x0);
}

/* ---- f16 / bf16 storage ------------------------------------------------------------------ */

/* Unit roundoff (half an ulp, relative) and half the smallest subnormal of each dtype: a
 * value rounded once to dt is within u*|v| + tiny of v. */
static double dt_u(cw_dtype dt) { return dt == CW_F32 ? ldexp(1, -24) : dt == CW_F16 ? ldexp(1, -11) : ldexp(1, -8); }
static double dt_tiny(cw_dtype dt) {
    return dt == CW_F32 ? ldexp(1, -150) : dt == CW_F16 ? ldexp(1, -25) : ldexp(1, -134);
}
static const char *dt_name(cw_dtype dt) { return dt == CW_F32 ? "f32" : dt == CW_F16 ? "f16" : "bf16"; }

/* The scalar reference conversions (core/half.h), as stored bits in a uint32_t. */
static uint32_t enc(cw_dtype dt, float f) {
    if (dt == CW_F16) return cw__f32_to_f16(f);
    if (dt == CW_BF16) return cw__f32_to_bf16(f);
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}
static float dec(cw_dtype dt, uint32_t b) {
    if (dt == CW_F16) return cw__f16_to_f32((uint16_t)b);
    if (dt == CW_BF16) return cw__bf16_to_f32((uint16_t)b);
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

/* A strided view (as sbuf) over storage of dtype dt; val[] mirrors the stored values as
 * f32 (exact: every f16/bf16 is an f32). */
typedef struct tbuf {
    cw__view v;
    void *mem;
    float *val;
    int64_t len;
    cw_dtype dt;
} tbuf;

static uint32_t tbits(const tbuf *b, int64_t i) {
    if (b->dt == CW_F32) return enc(CW_F32, ((const float *)b->mem)[i]);
    return ((const uint16_t *)b->mem)[i];
}
static void tset(tbuf *b, int64_t i, float f) {
    uint32_t e = enc(b->dt, f);
    if (b->dt == CW_F32) memcpy((float *)b->mem + i, &e, 4);
    else ((uint16_t *)b->mem)[i] = (uint16_t)e;
    b->val[i] = dec(b->dt, e);
}
static void tsync(tbuf *b) {
    for (int64_t i = 0; i < b->len; i++) b->val[i] = dec(b->dt, tbits(b, i));
}

static void tbuf_make(tbuf *b, cw_dtype dt, int rank, const int64_t *dims, int strided) {
    sbuf tmp;
    sbuf_make(&tmp, rank, dims, strided); /* the same random layout */
    memset(b, 0, sizeof *b);
    b->dt = dt;
    b->len = tmp.len;
    b->v = tmp.v;
    b->v.d.dtype = dt;
    b->mem = malloc((size_t)b->len * cw_dtype_size(dt));
    b->val = malloc((size_t)b->len * sizeof(float));
    ASSERT_TRUE(b->mem && b->val);
    b->v.data = b->mem;
    sbuf_free(&tmp);
}
static void tbuf_fill(tbuf *b, float lo, float hi) {
    for (int64_t i = 0; i < b->len; i++) tset(b, i, lo + (hi - lo) * 0.5f * (cw_rng_float(&rng) + 1.0f));
}
static void tbuf_free(tbuf *b) { free(b->mem), free(b->val); }
/* Element offset of view v's first element in b, and a view's element address. */
static int64_t tbase(const tbuf *b, const cw__view *v) {
    return ((const char *)v->data - (const char *)b->mem) / (int64_t)cw_dtype_size(b->dt);
}
static void *tat(const tbuf *b, int64_t off) { return (char *)b->mem + off * (int64_t)cw_dtype_size(b->dt); }

/* Every element of b outside view v still holds the bits it had (old[]). */
static int64_t touched_outside(const tbuf *b, const cw__view *v, const uint32_t *old) {
    int64_t bad = 0, n = cw__desc_numel(&v->d), idx[CW_MAX_RANK] = {0}, base = tbase(b, v);
    unsigned char *m = calloc((size_t)b->len, 1);
    for (int64_t e = 0; e < n; e++) {
        m[base + voff(v, idx)] = 1;
        for (int i = v->d.rank - 1; i >= 0; i--) {
            if (++idx[i] < v->d.dims[i]) break;
            idx[i] = 0;
        }
    }
    for (int64_t i = 0; i < b->len; i++)
        if (!m[i] && tbits(b, i) != old[i]) bad++;
    free(m);
    return bad;
}
static uint32_t *tsnap(const tbuf *b) {
    uint32_t *o = malloc((size_t)b->len * sizeof *o);
    for (int64_t i = 0; i < b->len; i++) o[i] = tbits(b, i);
    return o;
}

/* The row converters against the scalar functions: every f16 and bf16 pattern to f32, and
 * f32 patterns covering every f16/bf16 rounding case (all exponents, the mantissa bits at
 * and around each dtype's rounding point, NaNs, infinities, subnormals) to each, with
 * F16C and with the scalar rows, contiguous and strided. */
static void test_convert_rows(void) {
    enum { NH = 65536 };
    uint16_t *h = malloc(NH * 2 * sizeof *h), *o16 = malloc(NH * 2 * sizeof *o16);
    float *f = malloc(NH * 2 * sizeof *f);
    for (int i = 0; i < NH; i++) h[i] = (uint16_t)i;
    int64_t bad = 0;
    for (int sc = 0; sc < 2; sc++) {
        cw__cpu_cvt_force_scalar(sc);
        for (int d = 1; d <= 2; d++) {
            cw_dtype dt = d == 1 ? CW_F16 : CW_BF16;
            cw__cpu_load_f32(f, h, dt, NH, 1);
            for (int i = 0; i < NH; i++)
                if (enc(CW_F32, f[i]) != enc(CW_F32, dec(dt, h[i]))) bad++;
            /* f32 -> dt: 2^16 high halves x low halves around the rounding points */
            const uint32_t lows[] = {0, 1, 0x0fff, 0x1000, 0x1001, 0x1fff, 0x2000, 0x3000,
                                     0x7fff, 0x8000, 0x8001, 0xffff, 0x6000, 0xe000, 0x9000, 0x5555};
            for (size_t l = 0; l < sizeof lows / sizeof lows[0]; l++) {
                for (int i = 0; i < NH; i++) {
                    uint32_t u = ((uint32_t)i << 16) | lows[l];
                    memcpy(&f[i], &u, 4);
                }
                cw__cpu_store_f32(o16, dt, 1, f, NH);
                for (int i = 0; i < NH; i++)
                    if (o16[i] != enc(dt, f[i])) bad++;
                /* strided: every other element, from an odd count */
                cw__cpu_store_f32(o16, dt, 2, f, NH - 1);
                for (int i = 0; i < NH - 1; i++)
                    if (o16[2 * i] != enc(dt, f[i])) bad++;
            }
            for (int i = 0; i < NH - 3; i++) o16[2 * i] = (uint16_t)(i * 7919u);
            cw__cpu_load_f32(f, o16, dt, NH - 3, 2);
            for (int i = 0; i < NH - 3; i++)
                if (enc(CW_F32, f[i]) != enc(CW_F32, dec(dt, (uint16_t)(i * 7919u)))) bad++;
        }
    }
    cw__cpu_cvt_force_scalar(0);
    if (bad) {
        fprintf(stderr, "row converters: %lld elements differ from the scalar conversions\n", (long long)bad);
        cw_test_failures++;
    }
    free(h), free(o16), free(f);
}

/* prep from src dtype sdt to dst dtype ddt. */
static void prep_half_case(cw__backend *be, cw__stream *st, int iter, cw_dtype sdt, cw_dtype ddt) {
    int rank = cw_rng_range(&rng, 0, 3) ? 4 : 5;
    int64_t N = cw_rng_range(&rng, 1, 2), C = cw_rng_range(&rng, 1, 4);
    int64_t D = rank == 5 ? cw_rng_range(&rng, 1, 2) : 1;
    int64_t Hf = cw_rng_range(&rng, 1, 9), Ws = cw_rng_range(&rng, 1, iter % 7 == 0 ? 700 : 19);
    int64_t up = iter % 3 == 0 ? 1 : (iter % 3 == 1 ? 2 : cw_rng_range(&rng, 1, 4));
    /* 5-D: frames upsampled by up_d; first_once: frame 0 once (HunyuanVideo's upsampler) */
    int64_t up_d = rank == 5 ? cw_rng_range(&rng, 1, 3) : 1, first_once = up_d > 1 ? cw_rng_range(&rng, 0, 1) : 0;
    int64_t Dd = D * up_d - (first_once ? up_d - 1 : 0);
    int norm = cw_rng_range(&rng, 0, 1), silu = cw_rng_range(&rng, 0, 1);
    int64_t fd[5] = {N, C, D, Hf, Ws};
    if (rank == 4) fd[2] = Hf, fd[3] = Ws;
    tbuf full, dst;
    tbuf_make(&full, sdt, rank, fd, cw_rng_range(&rng, 0, 2) != 0);
    tbuf_fill(&full, -4.0f, 4.0f);
    int64_t Hup = Hf * up;
    int64_t r0 = cw_rng_range(&rng, 0, Hup - 1), hd = cw_rng_range(&rng, 1, Hup - r0);
    int64_t need0 = r0 / up, need1 = (r0 + hd - 1) / up + 1;
    int64_t s0 = cw_rng_range(&rng, 0, need0), s1 = cw_rng_range(&rng, need1, Hf);
    int64_t Wd = Ws * up - (up > 1 ? cw_rng_range(&rng, 0, up - 1) : 0);
    cw__view src = full.v;
    src.d.dims[rank - 2] = s1 - s0;
    src.data = tat(&full, s0 * full.v.d.strides[rank - 2]);
    int64_t dd[5] = {N, C, Dd, hd, Wd};
    if (rank == 4) dd[2] = hd, dd[3] = Wd;
    tbuf_make(&dst, ddt, rank, dd, cw_rng_range(&rng, 0, 1));
    for (int64_t i = 0; i < dst.len; i++) tset(&dst, i, 12345.0f);
    uint32_t *old = tsnap(&dst);
    float *scale = NULL, *shift = NULL;
    if (norm) {
        scale = malloc((size_t)(N * C) * sizeof(float));
        shift = malloc((size_t)(N * C) * sizeof(float));
        for (int64_t i = 0; i < N * C; i++) scale[i] = 2.0f * cw_rng_float(&rng), shift[i] = cw_rng_float(&rng);
    }
    cw__prep_params p;
    memset(&p, 0, sizeof p);
    p.src = src, p.dst = dst.v, p.scale = scale, p.shift = shift, p.silu = silu, p.up = (int)up;
    p.dst_row0 = r0, p.src_row0 = s0;
    p.up_d = up_d, p.off_d = first_once ? up_d - 1 : 0;
    if (be) {
        ASSERT_OK(cw__op_prep(be, st, &p));
        ASSERT_OK(be->rt->stream_synchronize(be, st));
    } else {
        cw__cpu_prep_run(&p);
    }
    tsync(&dst);
    int64_t bad = 0, inexact = 0;
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++)
            for (int64_t z = 0; z < Dd; z++)
                for (int64_t r = 0; r < hd; r++)
                    for (int64_t w = 0; w < Wd; w++) {
                        const int64_t zs = !first_once ? z / up_d : z == 0 ? 0 : 1 + (z - 1) / up_d;
                        int64_t si[5] = {n, c, zs, (r0 + r) / up, w / up}, di[5] = {n, c, z, r, w};
                        if (rank == 4) si[2] = si[3], si[3] = si[4], di[2] = di[3], di[3] = di[4];
                        float xf = full.val[voff(&full.v, si)];
                        const float scf = norm ? scale[n * C + c] : 1.0f, shf = norm ? shift[n * C + c] : 0.0f;
                        int64_t o = voff(&dst.v, di);
                        /* bits: the f32 math on the stored input, rounded once by half.h */
                        if (tbits(&dst, o) != enc(ddt, cw_prep_elem(xf, scf, shf, norm, silu))) inexact++;
                        double x = xf;
                        if (norm) x = x * scf + shf;
                        if (silu) x = silu_ref(x);
                        /* the f32 math's bound (as in prep_case), then one rounding to ddt */
                        double tol = close_tol(x, 2e-6, 2e-6) * (1 + dt_u(ddt)) + dt_u(ddt) * fabs(x) + dt_tiny(ddt);
                        if (!(fabs((double)dst.val[o] - x) <= tol)) {
                            if (bad++ < 3)
                                fprintf(stderr, "prep %s->%s iter %d: got %.9g ref %.9g\n", dt_name(sdt),
                                        dt_name(ddt), iter, (double)dst.val[o], x);
                        }
                    }
    bad += inexact + touched_outside(&dst, &dst.v, old);
    if (bad) {
        fprintf(stderr, "prep %s->%s iter %d FAILED (%lld bad, %lld not the scalar bits): up %lld W %lld\n",
                dt_name(sdt), dt_name(ddt), iter, (long long)bad, (long long)inexact, (long long)up, (long long)Wd);
        cw_test_failures++;
    }
    free(old), free(scale), free(shift);
    tbuf_free(&full), tbuf_free(&dst);
}

/* GroupNorm statistics of an f16/bf16 tensor: the bits of the statistics of the same
 * values stored as f32 with the same strides (the order is the f32 one), and within the
 * f32 case's bound of the naive double reference. */
static void gn_half_case(cw__backend *be, cw__stream *st, int iter, cw_dtype dt) {
    int rank = cw_rng_range(&rng, 0, 2) ? 4 : 5;
    int64_t groups = cw_rng_range(&rng, 1, 4), cpg = cw_rng_range(&rng, 1, 3);
    int64_t N = cw_rng_range(&rng, 1, 2), C = groups * cpg, D = rank == 5 ? cw_rng_range(&rng, 1, 2) : 1;
    int64_t H = cw_rng_range(&rng, 1, 9), W = cw_rng_range(&rng, 1, iter % 5 == 0 ? 1500 : 17);
    int64_t dims[5] = {N, C, D, H, W};
    if (rank == 4) dims[2] = H, dims[3] = W;
    tbuf x;
    tbuf_make(&x, dt, rank, dims, cw_rng_range(&rng, 0, 1));
    float off = 8.0f * cw_rng_float(&rng);
    for (int64_t i = 0; i < x.len; i++) tset(&x, i, off + 2.0f * cw_rng_float(&rng));
    sbuf xf; /* the same values and layout in f32 */
    xf.v = x.v, xf.v.d.dtype = CW_F32, xf.len = x.len, xf.mem = malloc((size_t)x.len * sizeof(float));
    memcpy(xf.mem, x.val, (size_t)x.len * sizeof(float));
    xf.v.data = xf.mem;
    const int64_t NG3 = N * groups * 3;
    double *ph = malloc((size_t)NG3 * sizeof(double)), *pf = malloc((size_t)NG3 * sizeof(double));
    if (be) {
        ASSERT_OK(cw__op_gn_stats(be, st, &x.v, groups, ph));
        ASSERT_OK(be->rt->stream_synchronize(be, st));
    } else {
        cw__cpu_gn_stats_run(&x.v, groups, ph);
    }
    cw__cpu_gn_stats_run(&xf.v, groups, pf);
    gn_ref *ref = malloc((size_t)(N * groups) * sizeof(gn_ref));
    gn_reference(&xf, groups, ref);
    int64_t bad = memcmp(ph, pf, (size_t)NG3 * sizeof(double)) != 0;
    for (int64_t i = 0; i < N * groups; i++) {
        double sd = sqrt(ref[i].var);
        double em = fabs(ph[i * 3 + 1] - ref[i].mean) / fmax(fabs(ref[i].mean), sd);
        double ev = ref[i].var == 0 ? fabs(ph[i * 3 + 2]) : fabs(ph[i * 3 + 2] / ph[i * 3] - ref[i].var) / ref[i].var;
        if (ph[i * 3] != (double)ref[i].count || !(em <= 1e-10) || !(ev <= 1e-10)) bad++;
    }
    if (bad) {
        fprintf(stderr, "gn_stats %s iter %d FAILED (%lld): W %lld\n", dt_name(dt), iter, (long long)bad,
                (long long)W);
        cw_test_failures++;
    }
    free(ph), free(pf), free(ref), free(xf.mem);
    tbuf_free(&x);
}

/* add (op 0) or the per-channel scale (op 1) in dt, dst aliasing an input or not. */
static void elem_half_case(cw__backend *be, cw__stream *st, int iter, cw_dtype dt, int op) {
    int rank = (int)cw_rng_range(&rng, op ? 2 : 1, 5);
    int64_t dims[5];
    for (int i = 0; i < rank; i++) dims[i] = cw_rng_range(&rng, 1, rank > 3 ? 5 : 11);
    if (iter % 9 == 0) dims[rank - 1] = cw_rng_range(&rng, 500, 1200); /* several tiles per row */
    int alias = (int)cw_rng_range(&rng, 0, op ? 1 : 2);
    int strided = iter % 4 != 0;
    tbuf a, b, d;
    tbuf_make(&a, dt, rank, dims, strided);
    tbuf_make(&b, dt, rank, dims, strided);
    tbuf_make(&d, dt, rank, dims, strided);
    tbuf_fill(&a, -100.0f, 100.0f);
    tbuf_fill(&b, -1.0f, 1.0f);
    for (int64_t i = 0; i < d.len; i++) tset(&d, i, -777.0f);
    float *a0 = malloc((size_t)a.len * sizeof(float)), *b0 = malloc((size_t)b.len * sizeof(float));
    memcpy(a0, a.val, (size_t)a.len * sizeof(float));
    memcpy(b0, b.val, (size_t)b.len * sizeof(float));
    int64_t C = rank >= 2 ? dims[1] : 1;
    float *v = malloc((size_t)C * sizeof(float));
    for (int64_t c = 0; c < C; c++) v[c] = 3.0f * cw_rng_float(&rng);
    tbuf *db = alias == 1 ? &a : alias == 2 ? &b : &d;
    uint32_t *old = tsnap(db);
    if (op == 0) {
        if (be) ASSERT_OK(cw__op_add(be, st, &db->v, &a.v, &b.v));
        else cw__cpu_add_run(&db->v, &a.v, &b.v);
    } else {
        cw__op_args oa;
        memset(&oa, 0, sizeof oa);
        oa.code = CW_OP_CHANNEL, oa.param.i[0] = CW_CHANNEL_SCALE;
        oa.out = db->v, oa.in[0] = a.v;
        oa.in[1].d.rank = 1, oa.in[1].d.dims[0] = C, oa.in[1].d.dtype = CW_F32, oa.in[1].data = v;
        if (be) ASSERT_OK(cw__op_run(be, st, &oa));
        else cw__cpu_op_exec(&oa);
    }
    if (be) ASSERT_OK(be->rt->stream_synchronize(be, st));
    tsync(db);
    int64_t n = cw__desc_numel(&a.v.d), idx[5] = {0}, bad = 0;
    for (int64_t e = 0; e < n; e++) {
        float av = a0[voff(&a.v, idx)], bv = b0[voff(&b.v, idx)];
        float f = op == 0 ? av + bv : cw_channel_elem(CW_CHANNEL_SCALE, av, v[idx[1]]);
        double ref = op == 0 ? (double)av + (double)bv : (double)av * (double)v[idx[1]];
        int64_t o = voff(&db->v, idx);
        /* one f32 rounding, then one rounding to dt */
        double tol = dt_u(CW_F32) * fabs(ref) * (1 + dt_u(dt)) + dt_u(dt) * fabs(ref) + dt_tiny(dt);
        if (tbits(db, o) != enc(dt, f) || !(fabs((double)db->val[o] - ref) <= tol)) bad++;
        for (int i = rank - 1; i >= 0; i--) {
            if (++idx[i] < dims[i]) break;
            idx[i] = 0;
        }
    }
    bad += touched_outside(db, &db->v, old);
    if (bad) {
        fprintf(stderr, "%s %s iter %d FAILED: rank %d alias %d strided %d: %lld bad\n", op ? "channel" : "add",
                dt_name(dt), iter, rank, alias, strided, (long long)bad);
        cw_test_failures++;
    }
    free(a0), free(b0), free(v), free(old);
    tbuf_free(&a), tbuf_free(&b), tbuf_free(&d);
}

/* Every half-precision case on the synchronous functions (be NULL) or the hooks. */
static int half_cases(cw__backend *be, cw__stream *st, int n) {
    static const cw_dtype dts[3] = {CW_F32, CW_F16, CW_BF16};
    int count = 0;
    for (int i = 0; i < n; i++) {
        for (int s = 0; s < 3; s++)
            for (int d = 0; d < 3; d++) {
                if (s == 0 && d == 0) continue; /* f32 -> f32: prep_case */
                prep_half_case(be, st, i, dts[s], dts[d]);
                count++;
            }
        for (int d = 1; d < 3; d++) {
            gn_half_case(be, st, i, dts[d]);
            elem_half_case(be, st, i, dts[d], 0);
            elem_half_case(be, st, i, dts[d], 1);
            count += 3;
        }
    }
    return count;
}

/* ---- through the backend: stream order of a chained GroupNorm, and bad arguments ------- */

static void backend_gn_chain(cw__backend *be, cw__stream *st) {
    /* stats of 3 bands -> finalize -> prep of the whole tensor, queued without syncs */
    int64_t N = 2, C = 8, G = 4, H = 9, W = 13, dims[4] = {N, C, H, W};
    sbuf x, y;
    sbuf_make(&x, 4, dims, 1);
    sbuf_fill(&x, -2.0f, 3.0f);
    sbuf_make(&y, 4, dims, 0);
    int64_t bounds[4] = {0, 2, 7, 9};
    double *parts = malloc((size_t)(3 * N * G * 3) * sizeof(double));
    float gamma[8], beta[8], *sc = malloc(sizeof(float) * N * C), *sh = malloc(sizeof(float) * N * C);
    for (int c = 0; c < 8; c++) gamma[c] = 1.0f + 0.1f * c, beta[c] = 0.05f * c - 0.2f;
    gn_partials(be, st, &x, G, bounds, 3, parts);
    ASSERT_OK(cw__op_gn_finalize(be, st, parts, 3, N, C, G, gamma, beta, 1e-5f, sc, sh));
    cw__prep_params p;
    memset(&p, 0, sizeof p);
    p.src = x.v, p.dst = y.v, p.scale = sc, p.shift = sh, p.silu = 1, p.up = 1;
    ASSERT_OK(cw__op_prep(be, st, &p));
    ASSERT_OK(be->rt->stream_synchronize(be, st));
    gn_ref ref[8];
    gn_reference(&x, G, ref);
    int64_t bad = 0;
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++) {
            const gn_ref *r = &ref[n * G + c / (C / G)];
            double rs = 1.0 / sqrt(r->var + 1e-5);
            for (int64_t h = 0; h < H; h++)
                for (int64_t w = 0; w < W; w++) {
                    int64_t i4[4] = {n, c, h, w};
                    double v = (x.mem[voff(&x.v, i4)] - r->mean) * rs * gamma[c] + beta[c];
                    v = silu_ref(v);
                    if (!(fabs(y.mem[voff(&y.v, i4)] - v) <= close_tol(v, 1e-5, 1e-5))) bad++;
                }
        }
    if (bad) {
        fprintf(stderr, "backend GroupNorm chain: %lld bad elements\n", (long long)bad);
        cw_test_failures++;
    }
    free(parts), free(sc), free(sh);
    sbuf_free(&x), sbuf_free(&y);
}

/* Refusals with the right status (with no context each is also logged to stderr). */
static void backend_bad_args(cw__backend *be, cw__stream *st) {
    int64_t dims[4] = {1, 4, 6, 5}, ddims[4] = {1, 4, 8, 10};
    sbuf x, y;
    sbuf_make(&x, 4, dims, 0);
    sbuf_make(&y, 4, ddims, 0);
    cw__prep_params p;
    memset(&p, 0, sizeof p);
    p.src = x.v, p.dst = y.v, p.up = 2;
    /* dst rows [4, 12) at up 2 need src rows [2, 6), the band starts at row 3: missing row 2 */
    p.dst_row0 = 4, p.src_row0 = 3;
    ASSERT_STATUS(cw__op_prep(be, st, &p), CW_ERR_INVALID_ARG);
    p.src_row0 = 2; /* a band of 4 rows starting at row 2 holds exactly rows [2, 6): ok */
    p.src.d.dims[2] = 4;
    ASSERT_OK(cw__op_prep(be, st, &p));
    p.src.d.dims[2] = 3; /* one row short */
    ASSERT_STATUS(cw__op_prep(be, st, &p), CW_ERR_INVALID_ARG);
    p.src.d.dims[2] = 4;
    p.dst.d.dims[3] = 11; /* W beyond src W * up */
    ASSERT_STATUS(cw__op_prep(be, st, &p), CW_ERR_INVALID_ARG);
    p.dst.d.dims[3] = 10;
    p.src.d.dtype = (cw_dtype)7;
    ASSERT_STATUS(cw__op_prep(be, st, &p), CW_ERR_INVALID_ARG);
    p.src.d.dtype = CW_F16; /* f16 -> f32: the cpu backend converts */
    ASSERT_OK(cw__op_prep(be, st, &p));
    p.src.d.dtype = CW_F32;
    p.up = 0;
    ASSERT_STATUS(cw__op_prep(be, st, &p), CW_ERR_INVALID_ARG);
    double out[12];
    ASSERT_STATUS(cw__op_gn_stats(be, st, &x.v, 3, out), CW_ERR_INVALID_ARG);
    cw__view xf16 = x.v;
    xf16.d.dtype = CW_BF16;
    ASSERT_OK(cw__op_gn_stats(be, st, &xf16, 2, out));
    ASSERT_STATUS(cw__op_add(be, st, &y.v, &x.v, &x.v), CW_ERR_INVALID_ARG);
    ASSERT_STATUS(cw__op_add(be, st, &x.v, &xf16, &x.v), CW_ERR_INVALID_ARG); /* mixed dtypes */
    ASSERT_OK(cw__op_add(be, st, &xf16, &xf16, &xf16));
    float a[6] = {0}, c[6] = {0};
    cw__gemm_params g;
    memset(&g, 0, sizeof g);
    g.m = 2, g.n = 3, g.k = 2, g.alpha = 1, g.a = a, g.lda = 1, g.b = a, g.ldb = 3, g.c = c, g.ldc = 3;
    ASSERT_STATUS(cw__op_gemm(be, st, &g), CW_ERR_INVALID_ARG); /* lda 1 < k 2 */
    g.lda = 2;
    g.trans_a = 1; /* A stored k x m: lda must be >= m = 2: ok */
    ASSERT_OK(cw__op_gemm(be, st, &g));
    ASSERT_STATUS(cw__op_softmax_rows(be, st, c, 2, 3, 2), CW_ERR_INVALID_ARG);
    ASSERT_STATUS(cw__op_gn_finalize(be, st, out, 1, 1, 4, 3, NULL, NULL, 1e-5f, c, c), CW_ERR_INVALID_ARG);
    ASSERT_OK(be->rt->stream_synchronize(be, st));
    sbuf_free(&x), sbuf_free(&y);
}

int main(void) {
    /* scripts/test.sh quotes this line: which BLAS kernels the pass ran on */
    printf("OpenBLAS core: %s (OPENBLAS_CORETYPE=%s)\n", openblas_get_corename(),
           getenv("OPENBLAS_CORETYPE") ? getenv("OPENBLAS_CORETYPE") : "unset");
    uint64_t seed = cw_test_seed(0x0b5c0de);
    rng.s = seed;
    int quick = cw_test_quick();

    test_silu();

    int n_prep = quick ? 200 : 2000;
    for (int i = 0; i < n_prep; i++) prep_case(NULL, NULL, i);

    int n_gn = quick ? 50 : 400;
    for (int i = 0; i < n_gn; i++) gn_case(i, 0);
    gn_case(n_gn, 1);
    fprintf(stderr, "gn: max relative error mean %.3g var %.3g scale/shift %.3g\n", max_rel_mean, max_rel_var,
            max_rel_ss);

    int n_add = quick ? 150 : 1000;
    for (int i = 0; i < n_add; i++) add_case(NULL, NULL, i);

    int n_gemm = quick ? 6 : 40;
    for (int i = 0; i < n_gemm; i++)
        for (int t = 0; t < 4; t++) {
            gemm_case(NULL, NULL, i, t & 1, t >> 1, 40, 1);
            if (i % 5 == 0) gemm_case(NULL, NULL, i, t & 1, t >> 1, 300, 1);
        }
    test_gemm1_blocks();

    int n_soft = quick ? 40 : 300;
    for (int i = 0; i < n_soft; i++) softmax_case(NULL, NULL, i);

    test_convert_rows();
    int n_half = half_cases(NULL, NULL, quick ? 20 : 150);

    /* the same ops through a real cpu backend and its stream worker */
    cw_context_config cfg = CW_CONTEXT_CONFIG_INIT;
    cfg.backend = CW_BACKEND_CPU;
    cfg.threads = 2;
    cw__backend *be = NULL;
    cw__stream *st = NULL;
    ASSERT_OK(cw__backend_cpu_create(NULL, &cfg, &be));
    ASSERT_OK(be->rt->stream_create(be, &st));
    for (int i = 0; i < 20; i++) prep_case(be, st, i);
    for (int i = 0; i < 20; i++) add_case(be, st, i);
    for (int t = 0; t < 4; t++) gemm_case(be, st, t, t & 1, t >> 1, 120, 0);
    for (int i = 0; i < 10; i++) softmax_case(be, st, i);
    backend_gn_chain(be, st);
    n_half += half_cases(be, st, 3);
    test_gemm_concurrent(be);
    backend_bad_args(be, st);
    be->rt->stream_destroy(be, st);
    be->rt->destroy(be);

    fprintf(stderr,
            "ops_cpu: prep %d, gn %d, add %d, gemm %d, softmax %d random cases, %d f16/bf16/mixed cases + backend hooks\n",
            n_prep, n_gn + 1, n_add, n_gemm * 4 + ((n_gemm + 4) / 5) * 4, n_soft, n_half);
    TEST_DONE();
}
