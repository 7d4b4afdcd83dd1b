/* Property test of the cpu convolution: random 2-D/3-D convs (kernel 1-7, stride 1-3,
 * dilation 1-3, independent pads 0-3, groups incl. depthwise, strided x/y views) with every
 * algorithm (im2col+GEMM, direct, Winograd where it applies, and oneDNN when built with it)
 * against the naive double reference, and each cut into random height patches (views into
 * the same tensors, no copies) against the unpatched result; then as many shapes again that
 * Winograd F(2x2,3x3) takes (3x3, stride 1, dilation 1, groups 1; kernel depth 1 in 3-D),
 * which random parameters almost never give; in f32, then a few hundred in f16 and in bf16
 * storage (f32 arithmetic) with bounds derived from the dtype's unit roundoff. */
#include <cblas.h>

#include "backend/cpu/cpu.h"
#include "core/half.h"
#include "conv_ref.h"
#include "scheduler/planner.h"
#include "testutil.h"

#define TOL 1e-5
#define CANARY 0x7fc0beefu /* a NaN: written around views, must survive untouched */

typedef struct conv_case {
    cw_conv_params p;
    cw_tensor_desc x, w, b, y;  /* x, y may be strided views into xbuf / ybuf */
    int64_t x_off, y_off;       /* element offset of the view start in its buffer */
    int64_t x_len, y_len;       /* buffer lengths in elements */
    int x_strided, y_strided;   /* the view is not the whole contiguous buffer */
    int has_bias;
    int y_w_unit;               /* y's W stride is 1 (GEMM applies) */
} conv_case;

static int g_threads = 1;        /* threads cw__cpu_conv_run uses */
static cw_dtype g_dt = CW_F32;   /* x, w, bias and y of every case */

/* ---- storage in g_dt: bits, scalar reference conversions (core/half.h), canaries ------- */
static size_t es(void) { return cw_dtype_size(g_dt); }
static uint32_t raw(const void *buf, int64_t i) {
    if (g_dt == CW_F32) {
        uint32_t u;
        memcpy(&u, (const float *)buf + i, 4);
        return u;
    }
    return ((const uint16_t *)buf)[i];
}
static float dec(const void *buf, int64_t i) {
    uint32_t u = raw(buf, i);
    if (g_dt == CW_F16) return cw__f16_to_f32((uint16_t)u);
    if (g_dt == CW_BF16) return cw__bf16_to_f32((uint16_t)u);
    float f;
    memcpy(&f, &u, 4);
    return f;
}
/* Stores f rounded to g_dt at element i and returns the stored value. */
static float put(void *buf, int64_t i, float f) {
    if (g_dt == CW_F32) ((float *)buf)[i] = f;
    else ((uint16_t *)buf)[i] = g_dt == CW_F16 ? cw__f32_to_f16(f) : cw__f32_to_bf16(f);
    return dec(buf, i);
}
/* A NaN in each dtype: written around views, must survive untouched. */
static uint32_t canary_bits(void) { return g_dt == CW_F32 ? CANARY : g_dt == CW_F16 ? 0x7ebeu : 0x7fbeu; }
static int is_canary_at(const void *buf, int64_t i) { return raw(buf, i) == canary_bits(); }
static void *tmalloc(int64_t n) {
    void *p = malloc((size_t)(n > 0 ? n : 1) * es());
    ASSERT_TRUE(p);
    return p;
}
static void *telem(const void *buf, int64_t i) { return (char *)buf + i * (int64_t)es(); }
/* Random value in [-1, 1), stored in g_dt; magnitudes below 2^-10 pushed up so no f16 input
 * is subnormal (the relative input rounding bound then holds). Returns the stored value. */
static float rnd_put(cw_rng *r, void *buf, int64_t i, float *orig) {
    float f = cw_rng_float(r);
    if (g_dt != CW_F32 && fabsf(f) < 0x1p-10f) f = copysignf(0x1p-10f + fabsf(f), f);
    if (orig) *orig = f;
    return put(buf, i, f);
}

static void contiguous(cw_tensor_desc *d) {
    int64_t s = 1;
    for (int i = d->rank - 1; i >= 0; i--) {
        d->strides[i] = s;
        s *= d->dims[i];
    }
}

/* Makes `d` (dims set) a view inside a larger buffer: extra channels (offset ch0) and/or a
 * padded innermost row, or a W stride of 2. Returns the buffer length; *off the start. */
static int64_t make_view(cw_rng *r, cw_tensor_desc *d, int64_t *off, int allow_w2, int *w_unit, int *strided) {
    int kind = (int)cw_rng_range(r, 0, 9);
    int rank = d->rank;
    int64_t big[5];
    for (int i = 0; i < rank; i++) big[i] = d->dims[i];
    int64_t ch0 = 0, wmul = 1;
    *w_unit = 1;
    if (kind == 0 || kind == 1) { /* channel slice of a bigger tensor */
        int64_t extra = cw_rng_range(r, 1, 3);
        ch0 = cw_rng_range(r, 0, extra);
        big[1] += extra;
    } else if (kind == 2) { /* padded rows: H stride > W */
        big[rank - 1] += cw_rng_range(r, 1, 3);
    } else if (kind == 3 && allow_w2) { /* every other element along W */
        wmul = 2;
        big[rank - 1] = 2 * d->dims[rank - 1];
        *w_unit = d->dims[rank - 1] == 1;
    }
    int64_t s = 1;
    for (int i = rank - 1; i >= 0; i--) {
        d->strides[i] = s * (i == rank - 1 ? wmul : 1);
        s *= big[i];
    }
    *off = ch0 * d->strides[1];
    *strided = (kind <= 2) || (kind == 3 && allow_w2);
    return s;
}

/* 1 when Winograd F(2x2,3x3) applies to the case (the cpu backend must list it then). */
static int wino_eligible(const conv_case *cc) {
    const cw_conv_params *p = &cc->p;
    const int sp = p->spatial, h = sp - 2; /* H's index in the params */
    if (p->groups != 1 || (sp == 3 && cc->w.dims[2] != 1)) return 0;
    for (int i = h; i < sp; i++)
        if (cc->w.dims[2 + i] != 3 || p->stride[i] != 1 || p->dilation[i] != 1) return 0;
    return 1;
}

/* Random problem with a bounded reference cost; wino: one Winograd takes (H and W: kernel
 * 3, stride 1, dilation 1; D: kernel 1; groups 1; up to 8 channels in and out). */
static void gen_case_kind(cw_rng *r, conv_case *cc, int wino) {
    for (;;) {
        memset(cc, 0, sizeof *cc);
        cw_conv_params p = CW_CONV_PARAMS_INIT;
        p.spatial = cw_rng_range(r, 0, 9) < 3 ? 3 : 2;
        const int sp = p.spatial;
        int64_t N = cw_rng_range(r, 1, 2), G, Cg, Kg;
        int gk = (int)cw_rng_range(r, 0, 9);
        if (gk < 5) { /* plain */
            G = 1, Cg = cw_rng_range(r, 1, 6), Kg = cw_rng_range(r, 1, 6);
        } else if (gk < 7) { /* depthwise (channel multiplier 1 or 2) */
            G = cw_rng_range(r, 1, 6), Cg = 1, Kg = cw_rng_range(r, 1, 2);
        } else { /* grouped */
            G = cw_rng_range(r, 2, 3), Cg = cw_rng_range(r, 1, 3), Kg = cw_rng_range(r, 1, 3);
        }
        if (wino) G = 1, Cg = cw_rng_range(r, 1, 8), Kg = cw_rng_range(r, 1, 8);
        p.groups = G;
        int64_t in[3], ks[3], out[3];
        const int wide = cw_rng_range(r, 0, 19) == 0;
        double cost = (double)N * G * Kg * Cg;
        for (int i = 0; i < sp; i++) {
            int depth = sp == 3 && i == 0;
            ks[i] = cw_rng_range(r, 1, depth ? 4 : 7);
            p.stride[i] = cw_rng_range(r, 1, 3);
            p.dilation[i] = cw_rng_range(r, 1, 3);
            p.pad_pre[i] = cw_rng_range(r, 0, 3);
            p.pad_post[i] = cw_rng_range(r, 0, 3);
            if (wino) {
                ks[i] = depth ? 1 : 3;
                if (!depth) p.stride[i] = p.dilation[i] = 1;
            }
            int64_t eff = p.dilation[i] * (ks[i] - 1) + 1;
            int64_t lo = eff - p.pad_pre[i] - p.pad_post[i];
            if (lo < 1) lo = 1;
            in[i] = lo + cw_rng_range(r, 0, depth ? 2 : (i == sp - 2 ? 16 : 7)); /* taller H: more patch splits */
            if (wide && i == sp - 1) in[i] = lo + cw_rng_range(r, 200, 700); /* crosses direct's 256-wide tiles */
            out[i] = (in[i] + p.pad_pre[i] + p.pad_post[i] - eff) / p.stride[i] + 1;
            cost *= (double)out[i] * ks[i];
        }
        if (cost > 400000) continue;
        cw_tensor_desc *x = &cc->x, *w = &cc->w, *y = &cc->y;
        x->dtype = w->dtype = y->dtype = g_dt;
        x->rank = w->rank = y->rank = sp + 2;
        x->dims[0] = N, x->dims[1] = G * Cg;
        w->dims[0] = G * Kg, w->dims[1] = Cg;
        y->dims[0] = N, y->dims[1] = G * Kg;
        for (int i = 0; i < sp; i++) {
            x->dims[2 + i] = in[i];
            w->dims[2 + i] = ks[i];
            y->dims[2 + i] = out[i];
        }
        contiguous(w);
        int xu;
        cc->x_len = make_view(r, x, &cc->x_off, 1, &xu, &cc->x_strided);
        cc->y_len = make_view(r, y, &cc->y_off, 1, &cc->y_w_unit, &cc->y_strided);
        cc->has_bias = (int)cw_rng_range(r, 0, 1);
        cc->b.dtype = g_dt;
        cc->b.rank = 1;
        cc->b.dims[0] = G * Kg;
        cc->p = p;
        return;
    }
}

static void gen_case(cw_rng *r, conv_case *cc) { gen_case_kind(r, cc, 0); }

static int64_t numel(const cw_tensor_desc *d) {
    int64_t n = 1;
    for (int i = 0; i < d->rank; i++) n *= d->dims[i];
    return n;
}

/* Every element of buf outside the view y (at y_off) still holds the canary, every element
 * inside does not. */
static int check_canary(const conv_case *cc, const void *buf) {
    char *in = calloc((size_t)cc->y_len, 1);
    int64_t idx[5] = {0}, n = numel(&cc->y), bad = 0;
    for (int64_t o = 0; o < n; o++) {
        int64_t off = cc->y_off + cw_ref_offset(&cc->y, idx);
        in[off] = 1;
        if (is_canary_at(buf, off) || isnan(dec(buf, off))) bad++;
        for (int i = cc->y.rank - 1; i >= 0; i--) {
            if (++idx[i] < cc->y.dims[i]) break;
            idx[i] = 0;
        }
    }
    for (int64_t o = 0; o < cc->y_len; o++)
        if (!in[o] && !is_canary_at(buf, o)) bad++;
    free(in);
    return bad == 0;
}

static void fill_canary(void *buf, int64_t n) {
    uint32_t c = canary_bits();
    for (int64_t i = 0; i < n; i++) {
        if (g_dt == CW_F32) memcpy((float *)buf + i, &c, 4);
        else ((uint16_t *)buf)[i] = (uint16_t)c;
    }
}

/* buf's n elements as f32 (NaN canaries stay NaN). */
static void decode(const void *buf, int64_t n, float *out) {
    for (int64_t i = 0; i < n; i++) out[i] = dec(buf, i);
}

static void print_case(const conv_case *cc, int algo, int P) {
    char b1[96], b2[96], b3[96];
    const cw_conv_params *p = &cc->p;
    fprintf(stderr,
            "  case: x %s w %s y %s groups=%lld bias=%d algo=%d P=%d stride=[%lld %lld %lld] dil=[%lld %lld %lld] "
            "pre=[%lld %lld %lld] post=[%lld %lld %lld] y.strides[last]=%lld\n",
            cw__dims_str(&cc->x, b1, sizeof b1), cw__dims_str(&cc->w, b2, sizeof b2), cw__dims_str(&cc->y, b3, sizeof b3),
            (long long)p->groups, cc->has_bias, algo, P, (long long)p->stride[0], (long long)p->stride[1],
            (long long)p->stride[2], (long long)p->dilation[0], (long long)p->dilation[1], (long long)p->dilation[2],
            (long long)p->pad_pre[0], (long long)p->pad_pre[1], (long long)p->pad_pre[2], (long long)p->pad_post[0],
            (long long)p->pad_post[1], (long long)p->pad_post[2], (long long)cc->y.strides[cc->y.rank - 1]);
}

enum { NA = CW__CPU_ALGO_COUNT };
typedef struct stats {
    double macs;
    int64_t cases, runs[NA], patched_runs[NA], bitwise[NA], empty_patches, views, patches;
    int64_t dnnl_listed; /* cases where oneDNN was listed (a kernel, not only cpu_direct fallback) */
    double max_err[NA], max_patch_err[NA];
    double max_bound[NA];    /* largest |error| / derived bound of an unpatched element */
    double max_contract[NA]; /* the same against the contract's gamma(R+1) S bound */
} stats;

/* Workspace of exactly `bytes` followed by a canary tail: an algorithm that uses more than
 * it reports overwrites the tail (and ASan sees the exact-size block overrun). */
static float *ws_alloc(int64_t bytes) {
    if (bytes < 0) return NULL;
    char *p = malloc((size_t)bytes + 64);
    ASSERT_TRUE(p);
    memset(p + bytes, 0xA5, 64);
    return (float *)p;
}
static void ws_check_free(float *ws, int64_t bytes, int algo) {
    if (!ws) return;
    const unsigned char *t = (const unsigned char *)ws + bytes;
    for (int i = 0; i < 64; i++)
        if (t[i] != 0xA5) {
            fprintf(stderr, "algo %d wrote past its reported workspace of %lld bytes\n", algo, (long long)bytes);
            cw_test_failures++;
            break;
        }
    free(ws);
}

/* Winograd's scale S_w (docs/determinism.md): its f32 result for an output is within
 * gamma(C + 11) S_w of the exact value, where S_w sums the absolute values of every term
 * of A^T [(G g G^T) . (B^T d B)] A expanded: |b| + sum over c, kernel taps (kh, kw) and the
 * 4x4 tile's inputs (m, n) of P[a][kh][m] P[e][kw][n] |g| |d|, with
 * P[o][k][m] = sum_i |A^T[o][i]| |G[i][k]| |B^T[i][m]| and (a, e) the output's place in its
 * 2x2 tile. Tiles start on output rows of parity `par` (a patch's tiles start at its first
 * row) and on even columns. Computed here from the matrices, in double. */
static void wino_scale(const conv_case *cc, const float *ax, const float *aw, const float *ab, int par,
                       double *out) {
    static const double AT[2][4] = {{1, 1, 1, 0}, {0, 1, -1, -1}};
    static const double G[4][3] = {{1, 0, 0}, {.5, .5, .5}, {.5, -.5, .5}, {0, 0, 1}};
    static const double BT[4][4] = {{1, 0, -1, 0}, {0, 1, 1, 0}, {0, -1, 1, 0}, {0, 1, 0, -1}};
    double P[2][3][4] = {{{0}}};
    for (int o = 0; o < 2; o++)
        for (int k = 0; k < 3; k++)
            for (int m = 0; m < 4; m++)
                for (int i = 0; i < 4; i++) P[o][k][m] += fabs(AT[o][i]) * fabs(G[i][k]) * fabs(BT[i][m]);
    const int sp = cc->p.spatial, rk = cc->y.rank;
    const int64_t K = cc->y.dims[1], C = cc->x.dims[1], Hi = cc->x.dims[rk - 2], Wi = cc->x.dims[rk - 1];
    const int64_t ph = cc->p.pad_pre[sp - 2], pw = cc->p.pad_pre[sp - 1];
    int64_t xs[5] = {0}, one[5] = {0};
    for (int i = 0; i < rk; i++) one[i] = 1, xs[i] = cw_ref_offset(&cc->x, one), one[i] = 0;
    /* wp[k][c][a][e][m][q] = sum over taps of P[a][kh][m] P[e][kw][q] |g[k][c][kh][kw]| */
    double *wp = calloc((size_t)(K * C * 64), sizeof(double));
    ASSERT_TRUE(wp);
    for (int64_t k = 0; k < K; k++)
        for (int64_t c = 0; c < C; c++)
            for (int kh = 0; kh < 3; kh++)
                for (int kw = 0; kw < 3; kw++) {
                    int64_t wi[5] = {k, c, 0, 0, 0};
                    wi[rk - 2] = kh, wi[rk - 1] = kw;
                    const double g = aw[cw_ref_offset(&cc->w, wi)];
                    for (int ae = 0; ae < 4; ae++)
                        for (int mq = 0; mq < 16; mq++)
                            wp[(k * C + c) * 64 + ae * 16 + mq] += P[ae >> 1][kh][mq >> 2] * P[ae & 1][kw][mq & 3] * g;
                }
    int64_t idx[5] = {0};
    for (int64_t o = 0, n = numel(&cc->y); o < n; o++) {
        const int64_t k = idx[1], oh = idx[rk - 2], ow = idx[rk - 1], a = (oh - par) & 1, e = ow & 1;
        const int64_t id = sp == 3 ? idx[2] * cc->p.stride[0] - cc->p.pad_pre[0] : 0;
        double sum = ab ? ab[k] : 0.0;
        for (int64_t c = 0; c < C && (sp == 2 || (id >= 0 && id < cc->x.dims[2])); c++) {
            const int64_t xc = idx[0] * xs[0] + c * xs[1] + (sp == 3 ? id * xs[2] : 0);
            const double *wv = wp + (k * C + c) * 64 + (a * 2 + e) * 16;
            for (int m = 0; m < 4; m++)
                for (int q = 0; q < 4; q++) {
                    const int64_t ih = oh - a - ph + m, iw = ow - e - pw + q;
                    if (ih >= 0 && ih < Hi && iw >= 0 && iw < Wi) sum += wv[m * 4 + q] * ax[xc + ih * xs[rk - 2] + iw * xs[rk - 1]];
                }
        }
        out[o] = sum;
        for (int j = rk - 1; j >= 0; j--) {
            if (++idx[j] < cc->y.dims[j]) break;
            idx[j] = 0;
        }
    }
    free(wp);
}

/* An output's derived bounds: the contract's gamma(R+1) S for every algorithm but Winograd,
 * whose own is gamma(C + 11) S_w (S_w for tiles starting on even or odd rows). In f16/bf16
 * the rounding to the dtype is added: ud (|exact| + gamma S) + tiny. */
typedef struct bounds_of {
    double gamma, gamma_w, ud, tiny;
    const double *scale, *sw[2];
} bounds_of;

static double bound_at(const bounds_of *bo, int algo, int64_t o, int par, double exact) {
    const double e = CW__CPU_IS_WINO(algo) ? bo->gamma_w * bo->sw[par][o] : bo->gamma * bo->scale[o];
    return e + bo->ud * (fabs(exact) + e) + bo->tiny;
}

/* Runs one case through every algorithm, unpatched and patched. */
static void run_case(cw_rng *r, const conv_case *cc, stats *stt) {
    const int64_t nx = cc->x_len, nw = numel(&cc->w), nb = cc->b.dims[0], ny = numel(&cc->y);
    const int half = g_dt != CW_F32;
    /* storage in g_dt; xb/w/b hold the stored values as f32, xo/wo/bo the values before
     * rounding to g_dt */
    void *xt = tmalloc(nx), *wt = tmalloc(nw), *bt = tmalloc(nb), *y1 = tmalloc(cc->y_len), *y2 = tmalloc(cc->y_len);
    float *xb = malloc((size_t)nx * sizeof(float)), *w = malloc((size_t)nw * sizeof(float));
    float *b = malloc((size_t)nb * sizeof(float));
    float *xo = malloc((size_t)nx * sizeof(float)), *wo = malloc((size_t)nw * sizeof(float));
    float *bo = malloc((size_t)nb * sizeof(float));
    float *y1f = malloc((size_t)cc->y_len * sizeof(float)), *y2f = malloc((size_t)cc->y_len * sizeof(float));
    double *ref = malloc((size_t)ny * sizeof(double)), *ref_o = malloc((size_t)ny * sizeof(double));
    ASSERT_TRUE(xb && w && b && xo && wo && bo && y1f && y2f && ref && ref_o);
    for (int64_t i = 0; i < nx; i++) xb[i] = rnd_put(r, xt, i, &xo[i]);
    for (int64_t i = 0; i < nw; i++) w[i] = rnd_put(r, wt, i, &wo[i]);
    for (int64_t i = 0; i < nb; i++) b[i] = rnd_put(r, bt, i, &bo[i]);
    const float *x = xb + cc->x_off;
    const void *xv = telem(xt, cc->x_off), *bias = cc->has_bias ? bt : NULL;
    cw_ref_conv(&cc->x, x, &cc->w, w, cc->has_bias ? b : NULL, &cc->p, &cc->y, ref);
    if (half) cw_ref_conv(&cc->x, xo + cc->x_off, &cc->w, wo, cc->has_bias ? bo : NULL, &cc->p, &cc->y, ref_o);
    stt->macs += (double)ny * (double)(nw / cc->w.dims[0]);
    /* The contract's bound (docs/determinism.md): any f32 evaluation order of the R + 1
     * terms of an output (R = C/groups x kernel volume, plus the bias) is within
     * gamma(R+1) * S of the exact value, S = |b| + sum |w x|, gamma(n) = n u / (1 - n u),
     * u = 2^-24; two orders (two patchings) are within twice that of each other.
     * In f16/bf16 (unit roundoff ud: 2^-11, 2^-8) each output is then rounded once:
     * within ud * (|exact| + gamma S) + tiny (half the smallest subnormal) more. Against the
     * inputs before their rounding to the dtype (each within ud of its value, no subnormal
     * inputs) add (2 ud + ud^2) / (1 - ud)^2 * S. */
    double *scale = malloc((size_t)ny * sizeof(double));
    float *ax = malloc((size_t)nx * sizeof(float)), *aw = malloc((size_t)nw * sizeof(float)),
          *ab = malloc((size_t)nb * sizeof(float));
    ASSERT_TRUE(scale && ax && aw && ab);
    for (int64_t i = 0; i < nx; i++) ax[i] = fabsf(xb[i]);
    for (int64_t i = 0; i < nw; i++) aw[i] = fabsf(w[i]);
    for (int64_t i = 0; i < nb; i++) ab[i] = fabsf(b[i]);
    cw_ref_conv(&cc->x, ax + cc->x_off, &cc->w, aw, cc->has_bias ? ab : NULL, &cc->p, &cc->y, scale);
    const double nterms = (double)(nw / cc->w.dims[0]) + 1.0, u = ldexp(1.0, -24);
    const double gamma = nterms * u / (1.0 - nterms * u);
    const double ud = g_dt == CW_F16 ? ldexp(1.0, -11) : g_dt == CW_BF16 ? ldexp(1.0, -8) : 0.0;
    const double tiny = g_dt == CW_F16 ? ldexp(1.0, -25) : g_dt == CW_BF16 ? ldexp(1.0, -134) : 0.0;
    const double in_rel = (2 * ud + ud * ud) / ((1 - ud) * (1 - ud));
    const double nw_terms = (double)cc->x.dims[1] + 11.0; /* Winograd: C + 11 roundings per term */
    bounds_of bnd = {gamma, nw_terms * u / (1.0 - nw_terms * u), ud, tiny, scale, {NULL, NULL}};
    double *sw = NULL;
    if (wino_eligible(cc)) {
        sw = malloc(2 * (size_t)ny * sizeof(double));
        ASSERT_TRUE(sw);
        for (int par = 0; par < 2; par++) {
            wino_scale(cc, ax + cc->x_off, aw, cc->has_bias ? ab : NULL, par, sw + par * ny);
            bnd.sw[par] = sw + par * ny;
        }
    }
    free(ax), free(aw), free(ab);

    cw_tensor_desc yexp;
    ASSERT_OK(cw__conv_validate(NULL, &cc->x, &cc->w, cc->has_bias ? &cc->b : NULL, &cc->y, &cc->p, &yexp));
    cw__conv_problem prob;
    cw__conv_problem_init(&prob, &cc->x, &cc->w, cc->has_bias, &cc->y, &cc->p);

    cw__conv_algo algos[CW__CPU_ALGO_COUNT];
    int na = 0;
    ASSERT_OK(cw__cpu_conv_algos(NULL, &prob, algos, CW__CPU_ALGO_COUNT, &na));
    int has_gemm = 0, has_direct = 0, has_wino = 0, has_wino_kb = 0;
    for (int i = 0; i < na; i++) {
        has_gemm |= algos[i].id == CW__CPU_ALGO_GEMM;
        has_direct |= algos[i].id == CW__CPU_ALGO_DIRECT;
        has_wino |= algos[i].id == CW__CPU_ALGO_WINOGRAD;
        has_wino_kb |= algos[i].id == CW__CPU_ALGO_WINOGRAD_KB;
        stt->dnnl_listed += algos[i].id == CW__CPU_ALGO_DNNL;
        ASSERT_EQ_I(algos[i].workspace, cw__cpu_conv_workspace(&prob, algos[i].id));
    }
    CHECK(has_direct);
    /* GEMM is listed exactly when y's W stride is 1; in f16/bf16 always (y is written from
     * an f32 block) */
    CHECK(has_gemm == (half || cc->y_w_unit));
    CHECK(has_wino == wino_eligible(cc)); /* Winograd: exactly the shapes it takes */
    /* its grouped variant where it has a smaller workspace: K of 2 or more */
    CHECK(has_wino_kb == (wino_eligible(cc) && cc->w.dims[0] >= 2));

    const int hd = prob.spatial;
    const int64_t h_out = cc->y.dims[hd];
    for (int algo = 0; algo < CW__CPU_ALGO_COUNT; algo++) {
        if (algo == CW__CPU_ALGO_GEMM && !has_gemm) continue;
        if (algo == CW__CPU_ALGO_WINOGRAD && !has_wino) continue;
        if (algo == CW__CPU_ALGO_WINOGRAD_KB && !has_wino_kb) continue;
        /* oneDNN runs every problem, listed or not (sub-bands it has no kernel for run
         * cpu_direct inside its plan), so the random patches below all go through it */
        if (algo == CW__CPU_ALGO_DNNL && !cw__cpu_dnnl_compiled()) continue;
        int64_t wsb = cw__cpu_conv_workspace(&prob, algo);
        ASSERT_TRUE(wsb >= 0);
        float *ws = wsb ? ws_alloc(wsb) : NULL;
        fill_canary(y1, cc->y_len);
        cw__cpu_conv_run(&prob, algo, xv, wt, bias, telem(y1, cc->y_off), ws, g_threads);
        ws_check_free(ws, wsb, algo);
        decode(y1, cc->y_len, y1f);
        double e = cw_ref_rel_err(&cc->y, y1f + cc->y_off, ref);
        stt->runs[algo]++;
        stt->max_err[algo] = cw_err_max(stt->max_err[algo], e);
        int64_t over1 = 0;
        { /* element by element: the derived bounds (f32: ud = tiny = 0; half: also against
           * the inputs before their rounding to the dtype) */
            int64_t idx[5] = {0};
            for (int64_t o = 0; o < ny; o++) {
                double got = y1f[cc->y_off + cw_ref_offset(&cc->y, idx)];
                double t = bound_at(&bnd, algo, o, 0, ref[o]), tc = bound_at(&bnd, -1, o, 0, ref[o]);
                if (t > 0 && fabs(got - ref[o]) / t > stt->max_bound[algo]) stt->max_bound[algo] = fabs(got - ref[o]) / t;
                if (tc > 0 && fabs(got - ref[o]) / tc > stt->max_contract[algo])
                    stt->max_contract[algo] = fabs(got - ref[o]) / tc;
                if (!(fabs(got - ref[o]) <= t) || (half && !(fabs(got - ref_o[o]) <= t + in_rel * scale[o]))) over1++;
                for (int j = cc->y.rank - 1; j >= 0; j--) {
                    if (++idx[j] < cc->y.dims[j]) break;
                    idx[j] = 0;
                }
            }
        }
        if (over1 > 0 || (!half && !(e <= TOL))) {
            fprintf(stderr, "%s unpatched algo %d: rel err %.3g, %lld elements beyond the bound\n",
                    cw__dtype_name(g_dt), algo, e, (long long)over1);
            print_case(cc, algo, 1);
            cw_test_failures++;
        }
        if (!check_canary(cc, y1)) {
            fprintf(stderr, "unpatched algo %d wrote outside y's view or left holes\n", algo);
            print_case(cc, algo, 1);
            cw_test_failures++;
        }

        /* patched: P random bands, each a view into the same x and a fresh y buffer */
        int P = (int)cw_rng_range(r, 1, h_out);
        int64_t *bounds = malloc((size_t)(P + 1) * sizeof(int64_t));
        ASSERT_TRUE(bounds);
        cw__patch_bounds(h_out, P, bounds);
        fill_canary(y2, cc->y_len);
        int64_t rows = 0;
        for (int i = 0; i < P; i++) {
            cw__patch pt;
            ASSERT_OK(cw__patch_make(&prob, bounds[i], bounds[i + 1], &pt));
            CHECK(pt.pad_pre >= 0 && pt.pad_post >= 0 && pt.a <= pt.b && pt.b <= cc->x.dims[hd]);
            CHECK(pt.prob.y.dims[hd] == bounds[i + 1] - bounds[i]);
            rows += pt.o1 - pt.o0;
            stt->patches++;
            if (cw__patch_is_empty(&pt)) stt->empty_patches++;
            else CHECK(pt.a - pt.pad_pre == pt.o0 * cc->p.stride[hd - 2] - cc->p.pad_pre[hd - 2]);
            int64_t wsb2 = cw__cpu_conv_workspace(&pt.prob, algo);
            ASSERT_TRUE(wsb2 >= 0);
            float *ws2 = wsb2 ? ws_alloc(wsb2) : NULL;
            cw__cpu_conv_run(&pt.prob, algo, telem(xv, pt.x_offset), wt, bias, telem(y2, cc->y_off + pt.y_offset), ws2,
                             g_threads);
            ws_check_free(ws2, wsb2, algo);
        }
        CHECK(rows == h_out);
        decode(y2, cc->y_len, y2f);
        double e2 = cw_ref_rel_err(&cc->y, y2f + cc->y_off, ref);
        /* patched vs unpatched on the same algorithm: both strided views of equal layout */
        double maxd = 0, maxr = 0;
        int bitwise = 1;
        int64_t idx[5] = {0}, over = 0;
        for (int64_t o = 0, band = 0; o < ny; o++) {
            int64_t off = cc->y_off + cw_ref_offset(&cc->y, idx);
            double d = fabs((double)y2f[off] - (double)y1f[off]);
            if (isnan(d)) d = INFINITY;
            /* the patched element's bound: Winograd's tiles start on its band's first row */
            band = 0;
            while (bounds[band + 1] <= idx[hd]) band++;
            const double t1 = bound_at(&bnd, algo, o, 0, ref[o]), t2 = bound_at(&bnd, algo, o, (int)(bounds[band] & 1), ref[o]);
            if (!(d <= t1 + t2) || !(fabs((double)y2f[off] - ref[o]) <= t2)) over++;
            maxd = cw_err_max(maxd, d);
            if (fabs((double)y1f[off]) > maxr) maxr = fabs((double)y1f[off]);
            if (raw(y2, off) != raw(y1, off)) bitwise = 0;
            for (int j = cc->y.rank - 1; j >= 0; j--) {
                if (++idx[j] < cc->y.dims[j]) break;
                idx[j] = 0;
            }
        }
        free(bounds);
        double ep = maxd / (maxr > 1e-30 ? maxr : 1e-30);
        stt->patched_runs[algo]++;
        stt->bitwise[algo] += bitwise;
        if (ep > stt->max_patch_err[algo]) stt->max_patch_err[algo] = ep;
        if (over || (!half && (!(ep <= TOL) || !(e2 <= TOL))) || !check_canary(cc, y2)) {
            fprintf(stderr,
                    "%s patched algo %d P=%d: %lld elements beyond the derived bound; vs unpatched %.3g, vs reference "
                    "%.3g (tol %.0e) or canary\n",
                    cw__dtype_name(g_dt), algo, P, (long long)over, ep, e2, TOL);
            print_case(cc, algo, P);
            cw_test_failures++;
        }
    }
    if (cc->x_strided || cc->y_strided) stt->views++;
    free(xt), free(wt), free(bt), free(y1), free(y2), free(y1f), free(y2f);
    free(xb), free(w), free(b), free(xo), free(wo), free(bo), free(ref), free(ref_o), free(scale), free(sw);
}

/* The asynchronous hook: closures on a real cpu stream, results after synchronize, and
 * the hook's argument errors. */
static void test_forward_hook(cw_rng *r, int n_cases) {
    cw_context_config cfg = CW_CONTEXT_CONFIG_INIT;
    cfg.backend = CW_BACKEND_CPU;
    cw_context *ctx = NULL;
    ASSERT_OK(cw_context_create(&ctx, &cfg));
    cw__backend *be = ctx->be;
    cw__stream *s[2];
    ASSERT_OK_CTX(ctx, cw__context_stream(ctx, 0, &s[0]));
    ASSERT_OK_CTX(ctx, cw__context_stream(ctx, 1, &s[1]));
    double worst = 0;
    for (int t = 0; t < n_cases; t++) {
        conv_case cc;
        gen_case(r, &cc);
        const int64_t nx = cc.x_len, nw = numel(&cc.w), ny = numel(&cc.y);
        float *xb = malloc((size_t)nx * sizeof(float)), *w = malloc((size_t)nw * sizeof(float));
        float *b = malloc((size_t)cc.b.dims[0] * sizeof(float)), *yb = malloc((size_t)cc.y_len * sizeof(float));
        double *ref = malloc((size_t)ny * sizeof(double));
        for (int64_t i = 0; i < nx; i++) xb[i] = cw_rng_float(r);
        for (int64_t i = 0; i < nw; i++) w[i] = cw_rng_float(r);
        for (int64_t i = 0; i < cc.b.dims[0]; i++) b[i] = cw_rng_float(r);
        fill_canary(yb, cc.y_len); /* g_dt is f32 here */
        cw_ref_conv(&cc.x, xb + cc.x_off, &cc.w, w, cc.has_bias ? b : NULL, &cc.p, &cc.y, ref);
        cw__conv_problem prob;
        cw__conv_problem_init(&prob, &cc.x, &cc.w, cc.has_bias, &cc.y, &cc.p);
        cw__conv_algo al[4];
        int na;
        ASSERT_OK(cw__op_conv_algos(be, &prob, al, 4, &na));
        ASSERT_TRUE(na >= 1);
        const cw__conv_algo *a = &al[t % na];
        void *ws = a->workspace ? malloc((size_t)a->workspace) : NULL;
        ASSERT_OK(cw__op_conv_forward(be, s[t & 1], &prob, a, xb + cc.x_off, w, b, yb + cc.y_off, ws, a->workspace));
        ASSERT_OK(be->rt->stream_synchronize(be, s[t & 1]));
        double e = cw_ref_rel_err(&cc.y, yb + cc.y_off, ref);
        worst = cw_err_max(worst, e);
        if (!(e <= TOL) || !check_canary(&cc, yb)) {
            fprintf(stderr, "conv_forward hook (%s): rel err %.3g or canary\n", a->name, e);
            print_case(&cc, a->id, 1);
            cw_test_failures++;
        }
        /* workspace too small and an unsupported dtype are clean statuses, nothing queued */
        if (a->workspace > 0) {
            ASSERT_STATUS(cw__op_conv_forward(be, s[0], &prob, a, xb, w, b, yb, ws, a->workspace - 1),
                          CW_ERR_INVALID_ARG);
            CHECK(strstr(cw_context_get_last_error(ctx), "workspace") != NULL);
        }
        cw__conv_problem bad = prob;
        bad.x.dtype = bad.w.dtype = bad.y.dtype = (cw_dtype)5;
        ASSERT_STATUS(cw__op_conv_forward(be, s[0], &bad, a, xb, w, b, yb, ws, a->workspace), CW_ERR_INVALID_ARG);
        CHECK(strstr(cw_context_get_last_error(ctx), "dtype") != NULL);
        ASSERT_STATUS(cw__op_conv_algos(be, &bad, al, 4, &na), CW_ERR_INVALID_ARG);
        free(ws), free(xb), free(w), free(b), free(yb), free(ref);
    }
    /* two streams running convs at once (BLAS thread split): big enough to overlap */
    {
        conv_case cc;
        memset(&cc, 0, sizeof cc);
        cw_conv_params p = CW_CONV_PARAMS_INIT;
        p.pad_pre[0] = p.pad_pre[1] = p.pad_post[0] = p.pad_post[1] = 1;
        int64_t xd[4] = {1, 16, 48, 40}, wd[4] = {16, 16, 3, 3};
        ASSERT_OK(cw_tensor_desc_make(&cc.x, CW_F32, 4, xd));
        ASSERT_OK(cw_tensor_desc_make(&cc.w, CW_F32, 4, wd));
        ASSERT_OK(cw_conv_output_desc(NULL, &cc.y, &cc.x, &cc.w, &p));
        cw__conv_problem prob;
        cw__conv_problem_init(&prob, &cc.x, &cc.w, 0, &cc.y, &p);
        int64_t nx = numel(&cc.x), nw = numel(&cc.w), ny = numel(&cc.y);
        float *x = malloc((size_t)nx * 4), *w = malloc((size_t)nw * 4);
        float *ys[2] = {malloc((size_t)ny * 4), malloc((size_t)ny * 4)};
        double *ref = malloc((size_t)ny * sizeof(double));
        for (int64_t i = 0; i < nx; i++) x[i] = cw_rng_float(r);
        for (int64_t i = 0; i < nw; i++) w[i] = cw_rng_float(r);
        cw_ref_conv(&cc.x, x, &cc.w, w, NULL, &p, &cc.y, ref);
        cw__conv_algo a;
        a.id = CW__CPU_ALGO_GEMM;
        snprintf(a.name, sizeof a.name, "gemm");
        a.workspace = cw__cpu_conv_workspace(&prob, CW__CPU_ALGO_GEMM);
        void *wss[2] = {malloc((size_t)a.workspace), malloc((size_t)a.workspace)};
        for (int rep = 0; rep < 4; rep++)
            for (int k = 0; k < 2; k++)
                ASSERT_OK(cw__op_conv_forward(be, s[k], &prob, &a, x, w, NULL, ys[k], wss[k], a.workspace));
        ASSERT_OK(be->rt->stream_synchronize(be, s[0]));
        ASSERT_OK(be->rt->stream_synchronize(be, s[1]));
        for (int k = 0; k < 2; k++) CHECK(cw_ref_rel_err(&cc.y, ys[k], ref) <= TOL);
        free(x), free(w), free(ys[0]), free(ys[1]), free(ref), free(wss[0]), free(wss[1]);
    }
    fprintf(stderr, "conv_forward hook: %d cases on 2 streams, max rel err %.3g\n", n_cases, worst);
    cw_context_destroy(ctx);
}

/* f16/bf16 through the asynchronous hook on two streams: every listed algorithm gives the
 * bits of the synchronous run on one thread (the contract's "same plan, same bits"). */
static void test_forward_hook_half(cw_rng *r, int n_cases) {
    cw_context_config cfg = CW_CONTEXT_CONFIG_INIT;
    cfg.backend = CW_BACKEND_CPU;
    cfg.threads = 2;
    cw_context *ctx = NULL;
    ASSERT_OK(cw_context_create(&ctx, &cfg));
    cw__backend *be = ctx->be;
    cw__stream *s[2];
    ASSERT_OK_CTX(ctx, cw__context_stream(ctx, 0, &s[0]));
    ASSERT_OK_CTX(ctx, cw__context_stream(ctx, 1, &s[1]));
    int runs = 0;
    for (int t = 0; t < n_cases; t++) {
        conv_case cc;
        gen_case(r, &cc);
        const int64_t nx = cc.x_len, nw = numel(&cc.w), nb = cc.b.dims[0];
        void *x = tmalloc(nx), *w = tmalloc(nw), *b = tmalloc(nb), *y1 = tmalloc(cc.y_len), *y2 = tmalloc(cc.y_len);
        for (int64_t i = 0; i < nx; i++) rnd_put(r, x, i, NULL);
        for (int64_t i = 0; i < nw; i++) rnd_put(r, w, i, NULL);
        for (int64_t i = 0; i < nb; i++) rnd_put(r, b, i, NULL);
        cw__conv_problem prob;
        cw__conv_problem_init(&prob, &cc.x, &cc.w, cc.has_bias, &cc.y, &cc.p);
        cw__conv_algo al[4];
        int na;
        ASSERT_OK_CTX(ctx, cw__op_conv_algos(be, &prob, al, 4, &na));
        for (int k = 0; k < na; k++) {
            void *ws = al[k].workspace ? malloc((size_t)al[k].workspace) : NULL;
            fill_canary(y1, cc.y_len);
            fill_canary(y2, cc.y_len);
            al[k].threads = 2;
            ASSERT_OK_CTX(ctx, cw__op_conv_forward(be, s[t & 1], &prob, &al[k], telem(x, cc.x_off), w, b,
                                                   telem(y1, cc.y_off), ws, al[k].workspace));
            ASSERT_OK(be->rt->stream_synchronize(be, s[t & 1]));
            cw__cpu_conv_run(&prob, al[k].id, telem(x, cc.x_off), w, cc.has_bias ? b : NULL, telem(y2, cc.y_off), ws, 1);
            if (memcmp(y1, y2, (size_t)cc.y_len * es()) != 0 || !check_canary(&cc, y1)) {
                fprintf(stderr, "%s conv_forward hook (%s): bits differ from the synchronous run or canary\n",
                        cw__dtype_name(g_dt), al[k].name);
                print_case(&cc, al[k].id, 1);
                cw_test_failures++;
            }
            runs++;
            free(ws);
        }
        free(x), free(w), free(b), free(y1), free(y2);
    }
    fprintf(stderr, "%s conv_forward hook: %d cases, %d algorithm runs, bits of the synchronous run\n",
            cw__dtype_name(g_dt), n_cases, runs);
    cw_context_destroy(ctx);
}

/* Each algorithm on 1, 2 and 3 threads gives the same bits (threads only decide where the
 * fixed im2col rows, GEMM blocks, epilogue rows and direct rows run). */
static void check_thread_bits(const conv_case *cc, cw_rng *r) {
    cw__conv_problem prob;
    cw__conv_problem_init(&prob, &cc->x, &cc->w, cc->has_bias, &cc->y, &cc->p);
    const int64_t nx = cc->x_len, nw = numel(&cc->w), nb = cc->b.dims[0];
    void *x = tmalloc(nx), *w = tmalloc(nw), *b = tmalloc(nb), *y[3] = {tmalloc(cc->y_len), tmalloc(cc->y_len),
                                                                          tmalloc(cc->y_len)};
    for (int64_t i = 0; i < nx; i++) rnd_put(r, x, i, NULL);
    for (int64_t i = 0; i < nw; i++) rnd_put(r, w, i, NULL);
    for (int64_t i = 0; i < nb; i++) rnd_put(r, b, i, NULL);
    for (int algo = 0; algo < CW__CPU_ALGO_COUNT; algo++) {
        if (algo == CW__CPU_ALGO_DNNL && !cw__cpu_dnnl_compiled()) continue;
        if (algo == CW__CPU_ALGO_GEMM && g_dt == CW_F32 && !cc->y_w_unit) continue;
        if (CW__CPU_IS_WINO(algo) && !wino_eligible(cc)) continue;
        int64_t wsb = cw__cpu_conv_workspace(&prob, algo);
        void *ws = wsb > 0 ? malloc((size_t)wsb) : NULL;
        for (int t = 0; t < 3; t++) {
            fill_canary(y[t], cc->y_len);
            cw__cpu_conv_run(&prob, algo, telem(x, cc->x_off), w, cc->has_bias ? b : NULL, telem(y[t], cc->y_off), ws,
                             t + 1);
        }
        if (memcmp(y[0], y[1], (size_t)cc->y_len * es()) || memcmp(y[0], y[2], (size_t)cc->y_len * es())) {
            fprintf(stderr, "%s algo %d: 1, 2 and 3 threads give different bits\n", cw__dtype_name(g_dt), algo);
            print_case(cc, algo, 1);
            cw_test_failures++;
        }
        free(ws);
    }
    free(x), free(w), free(b), free(y[0]), free(y[1]), free(y[2]);
}

/* Convs big enough that im2col and direct split their loops across helper threads, and
 * that Winograd (shapes 0 and 3, the latter 3-D with kernel depth 1) runs a team over
 * several tile blocks. */
static void test_threaded(cw_rng *r) {
    g_threads = 2; /* im2col rows, GEMM blocks and direct rows split over 2 threads */
    const int64_t shapes[4][5] = {{1, 16, 70, 300, 0}, {2, 8, 6, 40, 50}, {1, 12, 33, 257, 0}, {1, 16, 3, 30, 64}};
    /* sanitizer builds: f16 and bf16 on shapes 2 and 3 only (their threading is f32's, plus conversions) */
    const int first = cw_test_quick() && g_dt != CW_F32 ? 2 : 0;
    for (int t = first; t < 4; t++) {
        conv_case cc;
        memset(&cc, 0, sizeof cc);
        cw_conv_params p = CW_CONV_PARAMS_INIT;
        p.spatial = shapes[t][4] ? 3 : 2;
        for (int i = 0; i < p.spatial; i++) p.pad_pre[i] = 1, p.pad_post[i] = (int64_t)t;
        if (t == 2) p.groups = 3, p.stride[1] = 2;
        int rank = p.spatial + 2;
        int64_t xd[5], wd[5] = {shapes[t][1], shapes[t][1] / p.groups, t == 3 ? 1 : 3, 3, 3};
        for (int i = 0; i < rank; i++) xd[i] = shapes[t][i];
        ASSERT_OK(cw_tensor_desc_make(&cc.x, g_dt, rank, xd));
        ASSERT_OK(cw_tensor_desc_make(&cc.w, g_dt, rank, wd));
        ASSERT_OK(cw_conv_output_desc(NULL, &cc.y, &cc.x, &cc.w, &p));
        cc.p = p;
        cc.has_bias = 1;
        cc.b.dtype = g_dt, cc.b.rank = 1, cc.b.dims[0] = wd[0];
        contiguous(&cc.x);
        cc.x_len = numel(&cc.x);
        int wu;
        cc.y_len = make_view(r, &cc.y, &cc.y_off, 0, &wu, &cc.y_strided);
        cc.y_w_unit = 1;
        stats st;
        memset(&st, 0, sizeof st);
        run_case(r, &cc, &st);
        check_thread_bits(&cc, r);
        fprintf(stderr,
                "%s threaded conv %d (%.1f M MACs): gemm rel err %.3g, direct %.3g, dnnl %.3g, winograd %s%.3g, "
                "grouped %.3g\n",
                cw__dtype_name(g_dt), t, st.macs * 1e-6, st.max_err[0], st.max_err[1], st.max_err[2],
                st.runs[CW__CPU_ALGO_WINOGRAD] ? "" : "(not listed) ", st.max_err[CW__CPU_ALGO_WINOGRAD],
                st.max_err[CW__CPU_ALGO_WINOGRAD_KB]);
        CHECK(st.runs[CW__CPU_ALGO_WINOGRAD] == wino_eligible(&cc));
        CHECK(st.runs[CW__CPU_ALGO_WINOGRAD_KB] == wino_eligible(&cc));
    }
}

/* 1x1, stride 1, unpadded: GEMM reads x in place (no column buffer) when x's and y's
 * spatial blocks are single runs; otherwise it falls back to im2col. */
static void test_1x1(cw_rng *r) {
    int n_zero = 0, n_cases = 0;
    for (int t = 0; t < 40; t++) {
        conv_case cc;
        memset(&cc, 0, sizeof cc);
        cw_conv_params p = CW_CONV_PARAMS_INIT;
        p.spatial = t % 4 == 3 ? 3 : 2;
        p.groups = cw_rng_range(r, 1, 3);
        const int rank = p.spatial + 2;
        int64_t xd[5] = {cw_rng_range(r, 1, 2), p.groups * cw_rng_range(r, 1, 5), 0, 0, 0};
        int64_t wd[5] = {p.groups * cw_rng_range(r, 1, 5), xd[1] / p.groups, 1, 1, 1};
        for (int i = 2; i < rank; i++) xd[i] = cw_rng_range(r, 1, 9);
        ASSERT_OK(cw_tensor_desc_make(&cc.x, CW_F32, rank, xd));
        ASSERT_OK(cw_tensor_desc_make(&cc.w, CW_F32, rank, wd));
        ASSERT_OK(cw_conv_output_desc(NULL, &cc.y, &cc.x, &cc.w, &p));
        cc.p = p;
        cc.has_bias = t & 1;
        cc.b.dtype = CW_F32, cc.b.rank = 1, cc.b.dims[0] = wd[0];
        int wu, kind = t % 3; /* 0: contiguous, 1: channel slices, 2: random views */
        if (kind == 0) {
            contiguous(&cc.x), contiguous(&cc.y);
            cc.x_len = numel(&cc.x), cc.y_len = numel(&cc.y);
        } else {
            cc.x_len = make_view(r, &cc.x, &cc.x_off, kind == 2, &wu, &cc.x_strided);
            cc.y_len = make_view(r, &cc.y, &cc.y_off, 0, &wu, &cc.y_strided);
        }
        cc.y_w_unit = 1;
        cw__conv_problem prob;
        cw__conv_problem_init(&prob, &cc.x, &cc.w, cc.has_bias, &cc.y, &cc.p);
        int64_t ws = cw__cpu_conv_workspace(&prob, CW__CPU_ALGO_GEMM);
        if (kind == 0) CHECK(ws == 0); /* contiguous 1x1: x is the GEMM's B matrix */
        n_zero += ws == 0;
        n_cases++;
        stats st;
        memset(&st, 0, sizeof st);
        run_case(r, &cc, &st);
    }
    fprintf(stderr, "1x1 convs: %d cases, %d read x in place (no workspace)\n", n_cases, n_zero);
}

/* n shapes Winograd takes, through every algorithm: all of them are within the contract's
 * element bound of the reference (run_case), and Winograd is listed for every one. */
static void test_winograd_cases(cw_rng *r, int n) {
    stats st;
    memset(&st, 0, sizeof st);
    int64_t t0 = cw__now_ns(), grouped = 0;
    for (int i = 0; i < n; i++) {
        conv_case cc;
        gen_case_kind(r, &cc, 1);
        CHECK(wino_eligible(&cc));
        run_case(r, &cc, &st);
        st.cases++;
        grouped += cc.w.dims[0] >= 2;
    }
    const int W = CW__CPU_ALGO_WINOGRAD, WK = CW__CPU_ALGO_WINOGRAD_KB;
    fprintf(stderr,
            "%s: %lld convs Winograd takes (%lld with strided views), %.2f s\n"
            "  winograd: %lld runs, max rel err %.3g, largest error / its bound gamma(C+11) S_w %.3g (/ the other "
            "algorithms' gamma(R+1) S: %.3g); patched %lld runs, max rel err vs unpatched %.3g\n"
            "  grouped:  %lld runs, max rel err %.3g, largest error / gamma(C+11) S_w %.3g; patched %lld runs, "
            "max rel err vs unpatched %.3g\n"
            "  direct:   %lld runs, max rel err %.3g, largest error / gamma(R+1) S %.3g\n",
            cw__dtype_name(g_dt), (long long)st.cases, (long long)st.views, (double)(cw__now_ns() - t0) * 1e-9,
            (long long)st.runs[W], st.max_err[W], st.max_bound[W], st.max_contract[W], (long long)st.patched_runs[W],
            st.max_patch_err[W], (long long)st.runs[WK], st.max_err[WK], st.max_bound[WK],
            (long long)st.patched_runs[WK], st.max_patch_err[WK], (long long)st.runs[CW__CPU_ALGO_DIRECT],
            st.max_err[CW__CPU_ALGO_DIRECT], st.max_bound[CW__CPU_ALGO_DIRECT]);
    CHECK(st.runs[W] == n && st.patched_runs[W] == n);
    CHECK(st.runs[WK] == grouped && st.patched_runs[WK] == grouped && grouped > n / 2);
    CHECK(st.bitwise[CW__CPU_ALGO_DIRECT] == st.patched_runs[CW__CPU_ALGO_DIRECT]);
}

int main(void) {
    cw_rng r = {cw_test_seed(0xC0FFEE11ull)};
    const int n_cases = 2000; /* ~0.2 s in Release, ~1 s under ASan: no need to shrink */
    stats st;
    memset(&st, 0, sizeof st);
    int64_t t0 = cw__now_ns();
    for (int i = 0; i < n_cases; i++) {
        conv_case cc;
        gen_case(&r, &cc);
        run_case(&r, &cc, &st);
        st.cases++;
    }
    fprintf(stderr,
            "%lld random convs (%lld with strided views, %.1f M reference MACs), %.2f s\n"
            "  gemm:   %lld runs, max rel err %.3g; patched %lld runs, max rel err vs unpatched %.3g, bitwise equal %lld\n"
            "  direct: %lld runs, max rel err %.3g; patched %lld runs, max rel err vs unpatched %.3g, bitwise equal %lld\n"
            "  dnnl:   %lld runs (oneDNN listed for %lld), max rel err %.3g; patched %lld runs, max rel err vs unpatched "
            "%.3g\n"
            "  %lld patches, %lld of them read no input rows (pure padding)\n",
            (long long)st.cases, (long long)st.views, st.macs * 1e-6, (double)(cw__now_ns() - t0) * 1e-9, (long long)st.runs[0],
            st.max_err[0], (long long)st.patched_runs[0], st.max_patch_err[0], (long long)st.bitwise[0],
            (long long)st.runs[1], st.max_err[1], (long long)st.patched_runs[1], st.max_patch_err[1],
            (long long)st.bitwise[1], (long long)st.runs[2], (long long)st.dnnl_listed, st.max_err[2],
            (long long)st.patched_runs[2], st.max_patch_err[2], (long long)st.patches, (long long)st.empty_patches);
    CHECK(st.runs[0] >= n_cases * 8 / 10);       /* GEMM skipped only for W-strided outputs */
    CHECK(st.runs[1] == n_cases);
    CHECK(st.empty_patches > 0);                 /* the pure-padding band case was exercised */
    CHECK(st.bitwise[1] == st.patched_runs[1]);  /* direct: same taps in the same order */
    if (cw__cpu_dnnl_compiled()) {
        CHECK(st.runs[2] == n_cases);
        CHECK(st.dnnl_listed >= n_cases / 2);    /* most random shapes get a oneDNN kernel */
    }
    test_winograd_cases(&r, cw_test_quick() ? 500 : n_cases); /* sanitizer builds: fewer */
    test_forward_hook(&r, 100);
    test_threaded(&r);
    test_1x1(&r);

    /* f16 and bf16 storage: every algorithm, random patchings, the derived bounds */
    for (int d = 0; d < 2; d++) {
        g_dt = d == 0 ? CW_F16 : CW_BF16;
        g_threads = 1;
        const int n_half = cw_test_quick() ? 100 : 300; /* sanitizer builds: fewer */
        memset(&st, 0, sizeof st);
        t0 = cw__now_ns();
        for (int i = 0; i < n_half; i++) {
            conv_case cc;
            gen_case(&r, &cc);
            run_case(&r, &cc, &st);
            st.cases++;
        }
        fprintf(stderr,
                "%s: %lld random convs, %.2f s; gemm %lld runs (max rel err %.3g), direct %lld (%.3g), dnnl %lld "
                "(listed %lld, %.3g); patched: gemm vs unpatched %.3g, direct bitwise equal %lld of %lld\n",
                cw__dtype_name(g_dt), (long long)st.cases, (double)(cw__now_ns() - t0) * 1e-9, (long long)st.runs[0],
                st.max_err[0], (long long)st.runs[1], st.max_err[1], (long long)st.runs[2], (long long)st.dnnl_listed,
                st.max_err[2], st.max_patch_err[0], (long long)st.bitwise[1], (long long)st.patched_runs[1]);
        CHECK(st.runs[0] == n_half); /* GEMM takes every half problem */
        CHECK(st.runs[1] == n_half);
        CHECK(st.bitwise[1] == st.patched_runs[1]);
        if (cw__cpu_dnnl_compiled()) CHECK(st.runs[2] == n_half);
        test_winograd_cases(&r, n_half);
        test_forward_hook_half(&r, 40);
        test_threaded(&r);
    }
    TEST_DONE();
}
