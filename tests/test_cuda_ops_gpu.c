/* Every backend op on cuda against the cpu backend (the oracle): convolutions of random
 * shapes run patch by patch as the scheduler does (2-D and 3-D, groups, strides, dilations,
 * asymmetric paddings, strided views, empty-input patches), the fused prep stage, GroupNorm
 * statistics and finalisation, residual add (aliased too), the generic copy ops (slice,
 * pad, depth/space shuffles, nearest upsampling: bit for bit), GEMM, row softmax, fills,
 * copies, events and host callbacks; f32, f16 and bf16 data. Relative error = max |cuda -
 * cpu| / max |cpu|: <= 1e-5 for f32, <= 2e-3 for f16; bf16 keeps 8 significant bits, so one
 * rounding of the output alone costs up to 2^-8 and its bound is 2e-3 + 2^-8. Inputs are
 * multiples of 1/256 in [-1, 1], exact in every dtype, so the cpu (f32 only) sees the same
 * numbers (GroupNorm's shifted inputs are rounded to the dtype on both sides first).
 * Exits 77 without a CUDA device. CW_CUDA_OPS_SELFTEST=1 runs the harness with a second cpu
 * context in place of cuda (f32 only), to check the test itself. */
#include "testutil.h"

#include <dlfcn.h>
#ifdef CW_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "backend/backend.h"
#include "scheduler/planner.h"

/* Vendor libraries (driver, runtime, cuDNN, cuBLAS) keep process-lifetime allocations that
 * LeakSanitizer reports in ASan builds; suppress stacks through them only. (CUDA under ASan
 * also needs ASAN_OPTIONS=protect_shadow_gap=0 on a GPU machine.) */
const char *__lsan_default_suppressions(void);
__attribute__((visibility("default"))) const char *__lsan_default_suppressions(void) {
    return "leak:libcuda.so\nleak:libcudart.so\nleak:libcudnn\nleak:libcublas\nleak:libnvrtc.so\n";
}

/* cuDNN dlopens NVRTC (runtime-compiled engines) and unloads it, hiding its leaks' module
 * name from the suppression above: pin it. Only in CUDA builds. */
static void pin_nvrtc(void) {
#ifdef CW_HAVE_CUDA
    char name[64];
    snprintf(name, sizeof name, "libnvrtc.so.%d", CUDART_VERSION / 1000);
    (void)dlopen(name, RTLD_LAZY | RTLD_NODELETE);
#endif
}

typedef struct side {
    cw_context *ctx;
    cw__backend *be;
    cw__stream *s, *s2;
} side;

static side g_cpu, g_dev;
static int g_selftest;
static double g_worst[3];
static int64_t g_cases;

static void side_open(side *sd, cw_backend_kind kind) {
    cw_context_config cfg = CW_CONTEXT_CONFIG_INIT;
    cfg.backend = kind;
    cfg.log_level = CW_LOG_ERROR;
    cw_status st = cw_context_create(&sd->ctx, &cfg);
    if (st == CW_ERR_NO_DEVICE) {
        fprintf(stderr, "no CUDA device: skipping\n");
        exit(CW_TEST_SKIP);
    }
    ASSERT_OK(st);
    sd->be = sd->ctx->be;
    ASSERT_OK_CTX(sd->ctx, cw__context_stream(sd->ctx, 0, &sd->s));
    ASSERT_OK_CTX(sd->ctx, cw__context_stream(sd->ctx, 1, &sd->s2));
}

static void *dalloc(side *sd, int64_t bytes) {
    void *p = NULL;
    ASSERT_OK_CTX(sd->ctx, sd->be->rt->dev_alloc(sd->be, bytes > 0 ? bytes : 4, &p));
    return p;
}
static void dput(side *sd, void *d, const void *h, int64_t bytes) {
    ASSERT_OK_CTX(sd->ctx, sd->be->rt->upload(sd->be, d, h, bytes));
}
static void dget(side *sd, void *h, const void *d, int64_t bytes) {
    ASSERT_OK_CTX(sd->ctx, sd->be->rt->download(sd->be, h, d, bytes));
}
static void dsync(side *sd) {
    ASSERT_OK_CTX(sd->ctx, sd->be->rt->stream_synchronize(sd->be, sd->s));
    ASSERT_OK_CTX(sd->ctx, sd->be->rt->stream_synchronize(sd->be, sd->s2));
}
static void dfree(side *sd, void *p) { sd->be->rt->dev_free(sd->be, p); }

/* ---- dtypes: exact conversions of the test values, f32 <-> f16 / bf16 bits ---------------- */

static float h2f(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, bits;
    if (e == 0) {
        float v = ldexpf((float)m, -24);
        return sign ? -v : v;
    }
    if (e == 31) bits = sign | 0x7f800000u | (m << 13);
    else bits = sign | ((e + 112) << 23) | (m << 13);
    float f;
    memcpy(&f, &bits, 4);
    return f;
}
/* Round to nearest even (normal range and zero suffice for the test values). */
static uint16_t f2h(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    int32_t e = (int32_t)((x >> 23) & 0xff) - 127 + 15;
    uint32_t m = x & 0x7fffff;
    if ((x & 0x7fffffff) == 0) return (uint16_t)sign;
    if (e <= 0 || e >= 31) {
        fprintf(stderr, "f2h: %g outside the test's f16 range\n", (double)f);
        exit(1);
    }
    uint32_t h = sign | ((uint32_t)e << 10) | (m >> 13), rem = m & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
    return (uint16_t)h;
}
static float b2f(uint16_t b) {
    uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}
static uint16_t f2b(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t r = x + 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(r >> 16);
}

static float get_el(const void *buf, int64_t i, cw_dtype dt) {
    if (dt == CW_F16) return h2f(((const uint16_t *)buf)[i]);
    if (dt == CW_BF16) return b2f(((const uint16_t *)buf)[i]);
    return ((const float *)buf)[i];
}
static void set_el(void *buf, int64_t i, cw_dtype dt, float v) {
    if (dt == CW_F16) ((uint16_t *)buf)[i] = f2h(v);
    else if (dt == CW_BF16) ((uint16_t *)buf)[i] = f2b(v);
    else ((float *)buf)[i] = v;
}

/* An f32 host array converted to dtype (new buffer, cw-free'd by the caller with free). */
static void *to_dtype(const float *src, int64_t n, cw_dtype dt) {
    size_t es = cw_dtype_size(dt);
    void *out = malloc((size_t)(n > 0 ? n : 1) * es);
    ASSERT_TRUE(out != NULL);
    for (int64_t i = 0; i < n; i++) set_el(out, i, dt, src[i]);
    return out;
}

/* v as dtype dt holds it (round to nearest even), back in f32. */
static float round_to(float v, cw_dtype dt) {
    uint16_t h;
    if (dt == CW_F32) return v;
    set_el(&h, 0, dt, v);
    return get_el(&h, 0, dt);
}

static float rnd_val(cw_rng *r) { return (float)cw_rng_range(r, -256, 256) / 256.0f; }
static float *rnd_array(cw_rng *r, int64_t n) {
    float *a = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    ASSERT_TRUE(a != NULL);
    for (int64_t i = 0; i < n; i++) a[i] = rnd_val(r);
    return a;
}

static int64_t span_elems(const cw_tensor_desc *d) {
    cw_tensor_desc t = *d;
    cw__desc_fill_strides(&t);
    int64_t m = 0;
    for (int i = 0; i < t.rank; i++) m += (t.dims[i] - 1) * t.strides[i];
    return m + 1;
}

/* The elements of a strided view (row-major over its dims) as f32. */
static float *gather(const cw_tensor_desc *d, const void *base, int64_t *n_out) {
    cw_tensor_desc t = *d;
    cw__desc_fill_strides(&t);
    int64_t n = cw__desc_numel(&t);
    float *o = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    ASSERT_TRUE(o != NULL);
    for (int64_t i = 0; i < n; i++) {
        int64_t rem = i, off = 0;
        for (int k = t.rank - 1; k >= 0; k--) {
            off += (rem % t.dims[k]) * t.strides[k];
            rem /= t.dims[k];
        }
        o[i] = get_el(base, off, t.dtype);
    }
    *n_out = n;
    return o;
}

static double tol_of(cw_dtype dt) {
    return dt == CW_F32 ? 1e-5 : dt == CW_F16 ? 2e-3 : 2e-3 + 1.0 / 256.0;
}

/* Relative error of got against ref; asserts it is within dt's bound and finite. */
static void compare(const char *what, const float *ref, const float *got, int64_t n, cw_dtype dt) {
    double mx = 0.0, err = 0.0;
    int64_t worst = 0;
    for (int64_t i = 0; i < n; i++) {
        if (fabs(ref[i]) > mx) mx = fabs(ref[i]);
        double d = fabs((double)ref[i] - (double)got[i]);
        if (!(d <= err)) { /* NaN counts as worst (err_metric.h) */
            err = cw_err_max(err, d);
            worst = i;
        }
    }
    double rel = err / (mx > 1e-30 ? mx : 1e-30);
    if (rel > g_worst[dt]) g_worst[dt] = rel;
    g_cases++;
    if (!(rel <= tol_of(dt))) {
        fprintf(stderr, "%s (dtype %d): relative error %.3g > %.3g at element %lld: cpu %.9g, cuda %.9g (max |cpu| %g)\n",
                what, (int)dt, rel, tol_of(dt), (long long)worst, (double)ref[worst], (double)got[worst], mx);
        exit(1);
    }
}

static cw_dtype pick_dtype(cw_rng *r) { return g_selftest ? CW_F32 : (cw_dtype)cw_rng_range(r, 0, 2); }

/* ---- convolution --------------------------------------------------------------------------- */

static void random_conv(cw_rng *r, cw_dtype dt, cw__conv_problem *out, int64_t *x_span, int64_t *y_span) {
    cw_tensor_desc x, w, y;
    cw_conv_params p = CW_CONV_PARAMS_INIT;
    int sp = cw_rng_range(r, 0, 3) == 0 ? 3 : 2;
    int64_t g = cw_rng_range(r, 0, 2) == 0 ? cw_rng_range(r, 2, 4) : 1;
    int64_t c = g * cw_rng_range(r, 1, 6), k = g * cw_rng_range(r, 1, 6);
    int64_t xd[5] = {cw_rng_range(r, 1, 2), c}, wd[5] = {k, c / g};
    p.spatial = sp;
    p.groups = g;
    for (int d = 0; d < sp; d++) {
        int64_t ks = cw_rng_range(r, 1, sp == 3 ? 3 : 5);
        p.stride[d] = cw_rng_range(r, 1, 3);
        p.dilation[d] = ks > 1 ? cw_rng_range(r, 1, 2) : 1;
        p.pad_pre[d] = cw_rng_range(r, 0, 3);
        p.pad_post[d] = cw_rng_range(r, 0, 3);
        int64_t lo = p.dilation[d] * (ks - 1) + 1 - p.pad_pre[d] - p.pad_post[d];
        if (lo < 1) lo = 1;
        xd[2 + d] = cw_rng_range(r, lo, sp == 3 && d == 0 ? lo + 4 : lo + 24);
        wd[2 + d] = ks;
    }
    ASSERT_OK(cw_tensor_desc_make(&x, dt, sp + 2, xd));
    ASSERT_OK(cw_tensor_desc_make(&w, dt, sp + 2, wd));
    ASSERT_OK(cw__conv_validate(NULL, &x, &w, NULL, NULL, &p, &y));
    if (cw_rng_range(r, 0, 1)) { /* x: channel slice of a wider tensor */
        int64_t s = 1, extra = cw_rng_range(r, 1, 3);
        for (int d = x.rank - 1; d >= 0; d--) {
            x.strides[d] = s;
            s *= d == 1 ? x.dims[1] + extra : x.dims[d];
        }
    }
    if (cw_rng_range(r, 0, 1)) { /* y: rows with padding */
        int64_t s = 1, extra = cw_rng_range(r, 1, 9);
        for (int d = y.rank - 1; d >= 0; d--) {
            y.strides[d] = s;
            s *= d == y.rank - 1 ? y.dims[d] + extra : y.dims[d];
        }
    }
    cw__conv_problem_init(out, &x, &w, 1, &y, &p);
    *x_span = span_elems(&out->x);
    *y_span = span_elems(&out->y);
}

/* Runs p on side sd patch by patch (P bands), with algorithm `pick` of each patch's list
 * (0: fastest, 1: smallest workspace). Buffers are in p's dtype. */
static void conv_patched(side *sd, const cw__conv_problem *p, int P, int pick, const void *x, const void *w,
                         const void *b, void *y) {
    int64_t h_out = p->y.dims[p->spatial], bounds[65];
    size_t es = cw_dtype_size(p->x.dtype);
    if (P > h_out) P = (int)h_out;
    ASSERT_TRUE(P >= 1 && P <= 64);
    cw__patch_bounds(h_out, P, bounds);
    for (int i = 0; i < P; i++) {
        cw__patch pt;
        cw__conv_algo algos[64];
        int n = 0, a = 0;
        ASSERT_OK(cw__patch_make(p, bounds[i], bounds[i + 1], &pt));
        /* empty-input patches too: cuda lists a fill for them, cpu its own algorithms */
        ASSERT_OK_CTX(sd->ctx, cw__op_conv_algos(sd->be, &pt.prob, algos, 64, &n));
        ASSERT_TRUE(n >= 1);
        for (int j = 1; pick && j < n; j++)
            if (algos[j].workspace < algos[a].workspace) a = j;
        int64_t wsb = algos[a].workspace;
        void *ws = wsb > 0 ? dalloc(sd, wsb) : NULL;
        const char *xp = (const char *)x + pt.x_offset * (int64_t)es;
        char *yp = (char *)y + pt.y_offset * (int64_t)es;
        ASSERT_OK_CTX(sd->ctx, cw__op_conv_forward(sd->be, sd->s, &pt.prob, &algos[a], xp, w, b, yp, ws, wsb));
        dsync(sd); /* the workspace is freed right after */
        if (ws) dfree(sd, ws);
    }
}

static void test_conv(cw_rng *r, int cases) {
    for (int t = 0; t < cases; t++) {
        cw_dtype dt = pick_dtype(r);
        cw__conv_problem p, p32;
        int64_t xs, ys;
        random_conv(r, dt, &p, &xs, &ys);
        p32 = p;
        p32.x.dtype = p32.w.dtype = p32.y.dtype = CW_F32;
        int64_t wn = cw__desc_numel(&p.w), kn = p.w.dims[0];
        float *hx = rnd_array(r, xs), *hw = rnd_array(r, wn), *hb = rnd_array(r, kn);
        size_t es = cw_dtype_size(dt);
        /* cpu: the whole conv in f32, one patch */
        void *cx = dalloc(&g_cpu, xs * 4), *cwt = dalloc(&g_cpu, wn * 4), *cb = dalloc(&g_cpu, kn * 4);
        void *cy = dalloc(&g_cpu, ys * 4);
        dput(&g_cpu, cx, hx, xs * 4);
        dput(&g_cpu, cwt, hw, wn * 4);
        dput(&g_cpu, cb, hb, kn * 4);
        conv_patched(&g_cpu, &p32, 1, 0, cx, cwt, cb, cy);
        float *hy = malloc((size_t)ys * 4);
        dget(&g_cpu, hy, cy, ys * 4);
        int64_t n_ref;
        float *ref = gather(&p32.y, hy, &n_ref);
        /* device: dtype buffers, P bands, fastest or smallest-workspace engine per patch */
        void *tx = to_dtype(hx, xs, dt), *tw = to_dtype(hw, wn, dt), *tb = to_dtype(hb, kn, dt);
        void *gx = dalloc(&g_dev, xs * (int64_t)es), *gw = dalloc(&g_dev, wn * (int64_t)es),
             *gb = dalloc(&g_dev, kn * (int64_t)es), *gy = dalloc(&g_dev, ys * (int64_t)es);
        dput(&g_dev, gx, tx, xs * (int64_t)es);
        dput(&g_dev, gw, tw, wn * (int64_t)es);
        dput(&g_dev, gb, tb, kn * (int64_t)es);
        int P = (int)cw_rng_range(r, 1, 4), pick = (int)cw_rng_range(r, 0, 1);
        ASSERT_OK_CTX(g_dev.ctx, g_dev.be->rt->fill32_async(g_dev.be, g_dev.s, gy, 0x7fc00000u, ys * (int64_t)es / 4));
        dsync(&g_dev);
        conv_patched(&g_dev, &p, P, pick, gx, gw, gb, gy);
        void *ty = malloc((size_t)ys * es);
        dget(&g_dev, ty, gy, ys * (int64_t)es);
        int64_t n_got;
        float *got = gather(&p.y, ty, &n_got);
        ASSERT_EQ_I(n_got, n_ref);
        char what[96];
        snprintf(what, sizeof what, "conv case %d (%d-D, %d patches, %s engine)", t, p.spatial, P,
                 pick ? "smallest-workspace" : "fastest");
        compare(what, ref, got, n_ref, dt);
        free(hx), free(hw), free(hb), free(hy), free(ref), free(tx), free(tw), free(tb), free(ty), free(got);
        dfree(&g_cpu, cx), dfree(&g_cpu, cwt), dfree(&g_cpu, cb), dfree(&g_cpu, cy);
        dfree(&g_dev, gx), dfree(&g_dev, gw), dfree(&g_dev, gb), dfree(&g_dev, gy);
    }
}

/* A conv whose top and bottom patches read only padding (k = 1, pad 3): their output is the bias. */
static void test_conv_empty_patches(cw_rng *r) {
    cw_tensor_desc x, w, y;
    cw_conv_params cp = CW_CONV_PARAMS_INIT;
    int64_t xd[4] = {1, 3, 4, 5}, wd[4] = {2, 3, 1, 1};
    cp.pad_pre[0] = cp.pad_post[0] = 3;
    ASSERT_OK(cw_tensor_desc_make(&x, CW_F32, 4, xd));
    ASSERT_OK(cw_tensor_desc_make(&w, CW_F32, 4, wd));
    ASSERT_OK(cw__conv_validate(NULL, &x, &w, NULL, NULL, &cp, &y));
    cw__conv_problem p;
    cw__conv_problem_init(&p, &x, &w, 1, &y, &cp);
    int64_t xn = cw__desc_numel(&x), wn = 6, yn = cw__desc_numel(&y);
    float *hx = rnd_array(r, xn), *hw = rnd_array(r, wn), hb[2] = {0.5f, -0.25f};
    side *sides[2] = {&g_cpu, &g_dev};
    float *out[2];
    for (int s = 0; s < 2; s++) {
        void *dx = dalloc(sides[s], xn * 4), *dw = dalloc(sides[s], wn * 4), *db = dalloc(sides[s], 8),
             *dy = dalloc(sides[s], yn * 4);
        dput(sides[s], dx, hx, xn * 4);
        dput(sides[s], dw, hw, wn * 4);
        dput(sides[s], db, hb, 8);
        conv_patched(sides[s], &p, s ? (int)y.dims[2] : 1, 0, dx, dw, db, dy);
        out[s] = malloc((size_t)yn * 4);
        dget(sides[s], out[s], dy, yn * 4);
        dfree(sides[s], dx), dfree(sides[s], dw), dfree(sides[s], db), dfree(sides[s], dy);
    }
    compare("conv with empty-input patches", out[0], out[1], yn, CW_F32);
    ASSERT_TRUE(out[1][0] == 0.5f); /* row 0 of channel 0 reads only padding: bias */
    free(hx), free(hw), free(out[0]), free(out[1]);
}

/* A patch of a tensor spanning more than 2^31 elements ([2, 128, 2920, 2920] f16, 4.4 GB):
 * cuDNN's fast engines take it only packed (copied through contiguous buffers in the
 * workspace). The packed run is compared with the generic direct engine on the same patch
 * and with a double-precision reference at sampled outputs. x is a 16 MiB random block
 * tiled over the tensor, so the reference knows every input. Skipped (with a note) when
 * the device lacks the ~14 GB it needs. */
static void test_conv_packed_big(cw_rng *r) {
    if (g_selftest) return;
    const int64_t N = 2, C = 128, H = 2920, W = 2920, blk = (int64_t)8 << 20; /* elements per tile */
    cw_tensor_desc x, w, y;
    cw_conv_params cp = CW_CONV_PARAMS_INIT;
    int64_t xd[4] = {N, C, H, W}, wd[4] = {C, C, 3, 3};
    cp.pad_pre[0] = cp.pad_pre[1] = cp.pad_post[0] = cp.pad_post[1] = 1;
    ASSERT_OK(cw_tensor_desc_make(&x, CW_F16, 4, xd));
    ASSERT_OK(cw_tensor_desc_make(&w, CW_F16, 4, wd));
    ASSERT_OK(cw__conv_validate(NULL, &x, &w, NULL, NULL, &cp, &y));
    cw__conv_problem full;
    cw__conv_problem_init(&full, &x, &w, 0, &y, &cp);
    int64_t n = cw__desc_numel(&x), bytes = n * 2;
    cw__backend *be = g_dev.be;
    void *gx = NULL, *gy1 = NULL, *gy2 = NULL;
    if (be->rt->dev_alloc(be, bytes, &gx) != CW_OK || be->rt->dev_alloc(be, bytes, &gy1) != CW_OK ||
        be->rt->dev_alloc(be, bytes, &gy2) != CW_OK) {
        fprintf(stderr, "NOTE: packed-conv check skipped: cannot allocate 3 x %.1f GB on the device\n", bytes / 1e9);
        if (gx) dfree(&g_dev, gx);
        if (gy1) dfree(&g_dev, gy1);
        return;
    }
    float *hblk = rnd_array(r, blk), *hw = rnd_array(r, C * C * 9);
    void *tblk = to_dtype(hblk, blk, CW_F16), *tw = to_dtype(hw, C * C * 9, CW_F16);
    dput(&g_dev, gx, tblk, blk * 2);
    for (int64_t off = blk; off < n; off += blk) /* tile the block on the device */
        ASSERT_OK_CTX(g_dev.ctx, be->rt->copy_async(be, g_dev.s, (char *)gx + off * 2, gx, (n - off < blk ? n - off : blk) * 2));
    void *gw = dalloc(&g_dev, C * C * 9 * 2);
    dput(&g_dev, gw, tw, C * C * 9 * 2);
    dsync(&g_dev);

    cw__patch pt;
    ASSERT_OK(cw__patch_make(&full, 1000, 1032, &pt)); /* 32 output rows */
    cw__conv_algo algos[64];
    int na = 0, ip = -1, id = -1;
    ASSERT_OK_CTX(g_dev.ctx, cw__op_conv_algos(be, &pt.prob, algos, 64, &na));
    for (int i = 0; i < na; i++) {
        if (ip < 0 && strstr(algos[i].name, "packed")) ip = i;
        if (id < 0 && !strstr(algos[i].name, "packed")) id = i;
    }
    fprintf(stderr, "big patch: %d algorithms, packed '%s' (%.1f MiB), direct '%s'\n", na, ip >= 0 ? algos[ip].name : "-",
            ip >= 0 ? algos[ip].workspace / 1048576.0 : 0.0, id >= 0 ? algos[id].name : "-");
    ASSERT_TRUE(ip == 0 && id > 0);
    void *ys[2] = {gy1, gy2};
    int pick[2] = {ip, id};
    for (int k = 0; k < 2; k++) {
        int64_t wsb = algos[pick[k]].workspace;
        void *ws = wsb > 0 ? dalloc(&g_dev, wsb) : NULL;
        ASSERT_OK_CTX(g_dev.ctx, cw__op_conv_forward(be, g_dev.s, &pt.prob, &algos[pick[k]], (char *)gx + pt.x_offset * 2,
                                                     gw, NULL, (char *)ys[k] + pt.y_offset * 2, ws, wsb));
        dsync(&g_dev);
        if (ws) dfree(&g_dev, ws);
    }
    /* the patch's rows of every (n, k) plane, from both outputs */
    int64_t rows = 32, plane = rows * W;
    uint16_t *o1 = malloc((size_t)(N * C * plane) * 2), *o2 = malloc((size_t)(N * C * plane) * 2);
    for (int64_t nk = 0; nk < N * C; nk++) {
        int64_t off = (nk * H + 1000) * W;
        dget(&g_dev, o1 + nk * plane, (char *)gy1 + off * 2, plane * 2);
        dget(&g_dev, o2 + nk * plane, (char *)gy2 + off * 2, plane * 2);
    }
    float *f1 = malloc((size_t)(N * C * plane) * 4), *f2 = malloc((size_t)(N * C * plane) * 4);
    for (int64_t i = 0; i < N * C * plane; i++) f1[i] = h2f(o1[i]), f2[i] = h2f(o2[i]);
    compare("big patch: packed vs generic direct engine", f2, f1, N * C * plane, CW_F16);
    /* sampled double-precision reference */
    enum { S = 300 };
    float ref[S], got[S];
    for (int sidx = 0; sidx < S; sidx++) {
        int64_t nn = cw_rng_range(r, 0, N - 1), kk = cw_rng_range(r, 0, C - 1), rr = cw_rng_range(r, 0, rows - 1);
        int64_t cc = sidx < 20 ? (sidx % 2 ? W - 1 : 0) : cw_rng_range(r, 0, W - 1); /* borders too */
        double acc = 0.0;
        for (int64_t c = 0; c < C; c++)
            for (int64_t i = 0; i < 3; i++)
                for (int64_t j = 0; j < 3; j++) {
                    int64_t hi = 1000 + rr + i - 1, wj = cc + j - 1;
                    if (hi < 0 || hi >= H || wj < 0 || wj >= W) continue;
                    int64_t xi = ((nn * C + c) * H + hi) * W + wj;
                    acc += (double)hblk[xi % blk] * (double)hw[(kk * C + c) * 9 + i * 3 + j];
                }
        ref[sidx] = (float)acc;
        got[sidx] = f1[(nn * C + kk) * plane + rr * W + cc];
    }
    compare("big patch: packed vs double reference", ref, got, S, CW_F16);
    free(hblk), free(hw), free(tblk), free(tw), free(o1), free(o2), free(f1), free(f2);
    dfree(&g_dev, gx), dfree(&g_dev, gy1), dfree(&g_dev, gy2), dfree(&g_dev, gw);
}

/* ---- prep ---------------------------------------------------------------------------------- */

static void test_prep(cw_rng *r, int cases) {
    for (int t = 0; t < cases; t++) {
        cw_dtype dt = pick_dtype(r);
        int rank = cw_rng_range(r, 0, 3) == 0 ? 5 : 4;
        int64_t up = cw_rng_range(r, 1, 2), N = cw_rng_range(r, 1, 2), C = cw_rng_range(r, 1, 6);
        int64_t D = rank == 5 ? cw_rng_range(r, 1, 3) : 1, Hs = cw_rng_range(r, 2, 20), W = cw_rng_range(r, 1, 20);
        int64_t s0 = cw_rng_range(r, 0, Hs - 1), s1 = cw_rng_range(r, s0 + 1, Hs);
        int64_t d0 = cw_rng_range(r, s0 * up, s1 * up - 1), d1 = cw_rng_range(r, d0 + 1, s1 * up);
        /* 5-D: frames upsampled by up_d, the first frame kept once in half of those */
        int64_t up_d = rank == 5 ? cw_rng_range(r, 1, 2) : 1, off_d = up_d > 1 ? cw_rng_range(r, 0, 1) : 0;
        int64_t Wd = W * up - (up > 1 ? cw_rng_range(r, 0, 1) : 0), Dd = cw_up_frames(D, up_d, off_d);
        /* a third of the cases with replicate padding after the upsample (a fused pad): dst is
         * rows [d0, d1) of the padded tensor, src the rows they clamp to */
        int64_t pad[3] = {0, 0, 0}, up_h = 0;
        if (cw_rng_range(r, 0, 2) == 0) {
            int64_t post[3];
            for (int j = 0; j < 3; j++)
                pad[j] = rank == 4 && j == 0 ? 0 : cw_rng_range(r, 0, 2),
                post[j] = rank == 4 && j == 0 ? 0 : cw_rng_range(r, 0, 2);
            up_h = Hs * up;
            d0 = cw_rng_range(r, 0, up_h + pad[1] + post[1] - 1), d1 = cw_rng_range(r, d0 + 1, up_h + pad[1] + post[1]);
            s0 = cw_prep_src(d0, 0, pad[1], up_h, up, 0), s1 = cw_prep_src(d1 - 1, 0, pad[1], up_h, up, 0) + 1;
            Wd = W * up + pad[2] + post[2], Dd = cw_up_frames(D, up_d, off_d) + pad[0] + post[0];
        }
        int norm = (int)cw_rng_range(r, 0, 1), silu = (int)cw_rng_range(r, 0, 1);
        int64_t fd[5], dd[5];
        int k = 0;
        fd[k] = N, dd[k++] = N;
        fd[k] = C, dd[k++] = C;
        if (rank == 5) fd[k] = D, dd[k++] = Dd;
        fd[k] = Hs, dd[k++] = d1 - d0;
        fd[k] = W, dd[k++] = Wd;
        cw_tensor_desc full, band, dst;
        ASSERT_OK(cw_tensor_desc_make(&full, dt, rank, fd));
        band = full;
        band.dims[rank - 2] = s1 - s0;
        ASSERT_OK(cw_tensor_desc_make(&dst, dt, rank, dd));
        int64_t fn = cw__desc_numel(&full), dn = cw__desc_numel(&dst);
        float *hsrc = rnd_array(r, fn), *hsc = rnd_array(r, N * C), *hsh = rnd_array(r, N * C);
        for (int64_t i = 0; i < N * C; i++) hsc[i] *= 4.0f; /* scales up to 4: SiLU sees both tails */
        side *sides[2] = {&g_cpu, &g_dev};
        float *res[2];
        for (int s = 0; s < 2; s++) {
            cw_dtype sdt = s ? dt : CW_F32;
            size_t es = cw_dtype_size(sdt);
            void *hs = to_dtype(hsrc, fn, sdt);
            void *dsrc = dalloc(sides[s], fn * (int64_t)es), *ddst = dalloc(sides[s], dn * (int64_t)es);
            float *dsc = dalloc(sides[s], N * C * 4), *dsh = dalloc(sides[s], N * C * 4);
            dput(sides[s], dsrc, hs, fn * (int64_t)es);
            dput(sides[s], dsc, hsc, N * C * 4);
            dput(sides[s], dsh, hsh, N * C * 4);
            cw__prep_params pp;
            memset(&pp, 0, sizeof pp);
            pp.src.d = band;
            pp.src.d.dtype = sdt;
            pp.src.data = (char *)dsrc + s0 * full.strides[rank - 2] * (int64_t)es;
            pp.dst.d = dst;
            pp.dst.d.dtype = sdt;
            pp.dst.data = ddst;
            pp.scale = norm ? dsc : NULL;
            pp.shift = norm ? dsh : NULL;
            pp.silu = silu;
            pp.up = (int)up;
            pp.dst_row0 = d0;
            pp.src_row0 = s0;
            for (int j = 0; j < 3; j++) pp.pad[j] = pad[j];
            pp.up_h = up_h;
            pp.up_d = up_d, pp.off_d = off_d;
            ASSERT_OK_CTX(sides[s]->ctx, cw__op_prep(sides[s]->be, sides[s]->s, &pp));
            dsync(sides[s]);
            void *hd = malloc((size_t)dn * es);
            dget(sides[s], hd, ddst, dn * (int64_t)es);
            res[s] = malloc((size_t)dn * 4);
            for (int64_t i = 0; i < dn; i++) res[s][i] = get_el(hd, i, sdt);
            free(hs), free(hd);
            dfree(sides[s], dsrc), dfree(sides[s], ddst), dfree(sides[s], dsc), dfree(sides[s], dsh);
        }
        compare("prep", res[0], res[1], dn, dt);
        free(hsrc), free(hsc), free(hsh), free(res[0]), free(res[1]);
    }
}

/* ---- GroupNorm ----------------------------------------------------------------------------- */

static void test_gn(cw_rng *r, int cases) {
    for (int t = 0; t < cases; t++) {
        cw_dtype dt = pick_dtype(r);
        int rank = cw_rng_range(r, 0, 3) == 0 ? 5 : 4;
        int64_t G = cw_rng_range(r, 1, 4), N = cw_rng_range(r, 1, 3), C = G * cw_rng_range(r, 1, 4);
        int64_t fd[5] = {N, C, 0, 0, 0}, H = cw_rng_range(r, 2, 40);
        int k = 2;
        if (rank == 5) fd[k++] = cw_rng_range(r, 1, 3);
        fd[k++] = H;
        fd[k++] = cw_rng_range(r, 1, 70);
        cw_tensor_desc full;
        ASSERT_OK(cw_tensor_desc_make(&full, dt, rank, fd));
        int64_t fn = cw__desc_numel(&full), nparts = cw_rng_range(r, 1, H < 4 ? H : 4), bounds[5];
        cw__patch_bounds(H, (int)nparts, bounds);
        float *hx = rnd_array(r, fn);
        /* non-zero mean; 3k/256 + 1/2 needs up to 10 significant bits, more than bf16 keeps:
         * both sides get the values rounded to dt, so the cpu's statistics are those of the
         * very numbers the device reads and the 1e-9 bound below holds for every dtype */
        for (int64_t i = 0; i < fn; i++) hx[i] = round_to(hx[i] * 3.0f + 0.5f, dt);
        float *gamma = rnd_array(r, C), *beta = rnd_array(r, C);
        int affine = (int)cw_rng_range(r, 0, 1);
        side *sides[2] = {&g_cpu, &g_dev};
        double *stats[2];
        float *ss[2];
        for (int s = 0; s < 2; s++) {
            cw_dtype sdt = s ? dt : CW_F32;
            size_t es = cw_dtype_size(sdt);
            void *hs = to_dtype(hx, fn, sdt);
            void *dx = dalloc(sides[s], fn * (int64_t)es);
            double *dparts = dalloc(sides[s], nparts * N * G * 3 * 8);
            float *dg = dalloc(sides[s], C * 4), *db = dalloc(sides[s], C * 4), *dsc = dalloc(sides[s], N * C * 8);
            dput(sides[s], dx, hs, fn * (int64_t)es);
            dput(sides[s], dg, gamma, C * 4);
            dput(sides[s], db, beta, C * 4);
            /* statistics of each row band, on alternating streams, then one finalize */
            for (int64_t pi = 0; pi < nparts; pi++) {
                cw__view v;
                v.d = full;
                v.d.dtype = sdt;
                v.d.dims[rank - 2] = bounds[pi + 1] - bounds[pi];
                v.data = (char *)dx + bounds[pi] * full.strides[rank - 2] * (int64_t)es;
                cw__stream *st = pi % 2 ? sides[s]->s2 : sides[s]->s;
                ASSERT_OK_CTX(sides[s]->ctx, cw__op_gn_stats(sides[s]->be, st, &v, G, dparts + pi * N * G * 3));
            }
            dsync(sides[s]);
            ASSERT_OK_CTX(sides[s]->ctx, cw__op_gn_finalize(sides[s]->be, sides[s]->s, dparts, nparts, N, C, G,
                                                                     affine ? dg : NULL, affine ? db : NULL, 1e-5f,
                                                                     dsc, dsc + N * C));
            dsync(sides[s]);
            stats[s] = malloc((size_t)(nparts * N * G * 3) * 8);
            dget(sides[s], stats[s], dparts, nparts * N * G * 3 * 8);
            ss[s] = malloc((size_t)(2 * N * C) * 4);
            dget(sides[s], ss[s], dsc, 2 * N * C * 4);
            free(hs);
            dfree(sides[s], dx), dfree(sides[s], dparts), dfree(sides[s], dg), dfree(sides[s], db), dfree(sides[s], dsc);
        }
        /* statistics in double: counts exact, mean and M2 to summation-order rounding */
        for (int64_t i = 0; i < nparts * N * G; i++) {
            ASSERT_TRUE(stats[0][i * 3] == stats[1][i * 3]);
            double sd = sqrt(stats[0][i * 3 + 2] / stats[0][i * 3]) + fabs(stats[0][i * 3 + 1]);
            if (!(fabs(stats[0][i * 3 + 1] - stats[1][i * 3 + 1]) <= 1e-9 * sd &&
                  fabs(stats[0][i * 3 + 2] - stats[1][i * 3 + 2]) <= 1e-9 * stats[0][i * 3 + 2] + 1e-12)) {
                fprintf(stderr, "gn_stats part %lld: cpu {%.17g, %.17g, %.17g} cuda {%.17g, %.17g, %.17g}\n",
                        (long long)i, stats[0][i * 3], stats[0][i * 3 + 1], stats[0][i * 3 + 2], stats[1][i * 3],
                        stats[1][i * 3 + 1], stats[1][i * 3 + 2]);
                exit(1);
            }
        }
        compare("gn_finalize scale/shift", ss[0], ss[1], 2 * N * C, CW_F32);
        free(hx), free(gamma), free(beta), free(stats[0]), free(stats[1]), free(ss[0]), free(ss[1]);
    }
}

/* gn_finalize on hand-made partials, empty ones included (merging them changes nothing). */
static void test_gn_finalize_parts(cw_rng *r) {
    int64_t P = 5, N = 2, G = 3, C = 6;
    double parts[5 * 2 * 3 * 3];
    for (int64_t i = 0; i < P * N * G; i++) {
        double cnt = cw_rng_range(r, 0, 3) == 0 ? 0.0 : (double)cw_rng_range(r, 1, 500);
        parts[i * 3] = cnt;
        parts[i * 3 + 1] = cnt > 0 ? rnd_val(r) * 3.0 : 0.0;
        parts[i * 3 + 2] = cnt > 0 ? cnt * (0.1 + fabs(rnd_val(r))) : 0.0;
    }
    side *sides[2] = {&g_cpu, &g_dev};
    float *res[2];
    for (int s = 0; s < 2; s++) {
        double *dp = dalloc(sides[s], (int64_t)sizeof parts);
        float *out = dalloc(sides[s], 2 * N * C * 4);
        dput(sides[s], dp, parts, (int64_t)sizeof parts);
        ASSERT_OK_CTX(sides[s]->ctx, cw__op_gn_finalize(sides[s]->be, sides[s]->s, dp, P, N, C, G, NULL, NULL,
                                                                 1e-6f, out, out + N * C));
        dsync(sides[s]);
        res[s] = malloc((size_t)(2 * N * C) * 4);
        dget(sides[s], res[s], out, 2 * N * C * 4);
        dfree(sides[s], dp), dfree(sides[s], out);
    }
    compare("gn_finalize of hand-made partials", res[0], res[1], 2 * N * C, CW_F32);
    free(res[0]), free(res[1]);
}

/* ---- add, gemm, softmax -------------------------------------------------------------------- */

static void test_add(cw_rng *r, int cases) {
    for (int t = 0; t < cases; t++) {
        cw_dtype dt = pick_dtype(r);
        int rank = (int)cw_rng_range(r, 1, 5), alias = (int)cw_rng_range(r, 0, 2); /* 1: dst = a, 2: dst = b */
        int64_t dims[5];
        for (int i = 0; i < rank; i++) dims[i] = cw_rng_range(r, 1, rank > 3 ? 6 : 20);
        cw_tensor_desc d;
        ASSERT_OK(cw_tensor_desc_make(&d, dt, rank, dims));
        /* a: rows padded (strided view); b and dst contiguous */
        cw_tensor_desc da = d;
        int64_t s = 1;
        for (int i = rank - 1; i >= 0; i--) {
            da.strides[i] = s;
            s *= i == rank - 1 ? dims[i] + 3 : dims[i];
        }
        int64_t n = cw__desc_numel(&d), an = span_elems(&da);
        float *ha = rnd_array(r, an), *hb = rnd_array(r, n);
        side *sides[2] = {&g_cpu, &g_dev};
        float *res[2];
        for (int si = 0; si < 2; si++) {
            cw_dtype sdt = si ? dt : CW_F32;
            size_t es = cw_dtype_size(sdt);
            void *ta = to_dtype(ha, an, sdt), *tb = to_dtype(hb, n, sdt);
            void *ga = dalloc(sides[si], an * (int64_t)es), *gb = dalloc(sides[si], n * (int64_t)es),
                 *gd = dalloc(sides[si], n * (int64_t)es);
            dput(sides[si], ga, ta, an * (int64_t)es);
            dput(sides[si], gb, tb, n * (int64_t)es);
            cw__view va = {da, ga}, vb = {d, gb}, vd = {d, gd};
            va.d.dtype = vb.d.dtype = vd.d.dtype = sdt;
            if (alias == 1) vd = va;
            if (alias == 2) vd = vb;
            ASSERT_OK_CTX(sides[si]->ctx, cw__op_add(sides[si]->be, sides[si]->s, &vd, &va, &vb));
            dsync(sides[si]);
            void *hd = malloc((size_t)span_elems(&vd.d) * es);
            dget(sides[si], hd, vd.data, span_elems(&vd.d) * (int64_t)es);
            int64_t cnt;
            res[si] = gather(&vd.d, hd, &cnt);
            ASSERT_EQ_I(cnt, n);
            free(ta), free(tb), free(hd);
            dfree(sides[si], ga), dfree(sides[si], gb), dfree(sides[si], gd);
        }
        compare(alias ? "add (aliased)" : "add", res[0], res[1], n, dt);
        free(ha), free(hb), free(res[0]), free(res[1]);
    }
}

/* The generic copy ops (slice, pad, depth to space, space to depth, nearest upsampling) with
 * random parameters on a strided input (rows padded) of random bit patterns, NaN payloads
 * among them: the device's output must be the cpu's bit for bit, in every dtype. */
static void test_copy_ops(cw_rng *r, int cases) {
    static const char *const names[5] = {"slice", "pad", "depth_to_space", "space_to_depth", "upsample_nearest"};
    for (int t = 0; t < cases; t++) {
        const cw_dtype dt = pick_dtype(r);
        const int op = (int)cw_rng_range(r, 0, 4), rank = (int)cw_rng_range(r, 4, 5);
        cw__op_args a;
        memset(&a, 0, sizeof a);
        int64_t dims[5], f[3] = {1, 1, 1};
        for (int i = 0; i < rank; i++) dims[i] = cw_rng_range(r, 1, rank == 5 ? 5 : 9);
        if (op >= 2) /* the shuffles' and upsampling's factors */
            for (int k = rank == 5 ? 0 : 1; k < 3; k++) f[k] = cw_rng_range(r, 1, 3);
        switch (op) {
        case 0: {
            const int dim = (int)cw_rng_range(r, 1, rank - 1);
            const int64_t start = cw_rng_range(r, 0, dims[dim] - 1);
            a.code = CW_OP_SLICE;
            a.param.i[0] = dim, a.param.i[1] = start, a.param.i[2] = cw_rng_range(r, 1, dims[dim] - start);
            break;
        }
        case 1: {
            int64_t pre[3] = {0, 0, 0}, post[3] = {0, 0, 0};
            for (int k = rank == 5 ? 0 : 1; k < 3; k++) pre[k] = cw_rng_range(r, 0, 3), post[k] = cw_rng_range(r, 0, 3);
            a.code = CW_OP_PAD;
            a.param.i[0] = cw_rng_range(r, 0, 1), a.param.i[1] = cw_pad_pack(pre), a.param.i[2] = cw_pad_pack(post);
            a.param.f[0] = cw_rng_range(r, 0, 3) ? cw_rng_float(r) : NAN;
            break;
        }
        case 2: a.code = CW_OP_DEPTH_TO_SPACE, dims[1] *= f[0] * f[1] * f[2]; break;
        case 3:
            a.code = CW_OP_SPACE_TO_DEPTH;
            for (int k = rank == 5 ? 0 : 1; k < 3; k++) dims[rank - 3 + k] *= f[k];
            break;
        default: a.code = CW_OP_UPSAMPLE_NEAREST; break;
        }
        if (op >= 2) a.param.i[0] = f[0], a.param.i[1] = f[1], a.param.i[2] = f[2];
        cw_tensor_desc xd, od;
        ASSERT_OK(cw_tensor_desc_make(&xd, dt, rank, dims));
        int64_t s = 1; /* x: rows padded by 2 elements (a strided view) */
        for (int i = rank - 1; i >= 0; i--) {
            xd.strides[i] = s;
            s *= i == rank - 1 ? dims[i] + 2 : dims[i];
        }
        const cw_tensor_desc *ins[CW_OP_MAX_IN] = {&xd};
        ASSERT_TRUE(cw_op_out_dims(a.code, &a.param, ins, &od));
        const size_t es = cw_dtype_size(dt);
        const int64_t xn = span_elems(&xd), on = cw__desc_numel(&od);
        uint16_t *hx = malloc((size_t)xn * 4);
        for (int64_t i = 0; i < 2 * xn; i++) hx[i] = (uint16_t)cw_rng_next(r);
        side *sides[2] = {&g_cpu, &g_dev};
        void *out[2];
        for (int si = 0; si < 2; si++) {
            void *gx = dalloc(sides[si], xn * (int64_t)es), *gy = dalloc(sides[si], on * (int64_t)es);
            dput(sides[si], gx, hx, xn * (int64_t)es);
            a.in[0].d = xd, a.in[0].data = gx, a.out.d = od, a.out.data = gy;
            ASSERT_OK_CTX(sides[si]->ctx, cw__op_run(sides[si]->be, sides[si]->s, &a));
            dsync(sides[si]);
            out[si] = malloc((size_t)on * es);
            dget(sides[si], out[si], gy, on * (int64_t)es);
            dfree(sides[si], gx), dfree(sides[si], gy);
        }
        if (memcmp(out[0], out[1], (size_t)on * es) != 0) {
            fprintf(stderr, "%s %s rank %d: device bits differ from the cpu's\n", names[op], cw__dtype_name(dt), rank);
            cw_test_failures++;
        }
        g_cases++;
        free(hx), free(out[0]), free(out[1]);
    }
}

static void test_gemm(cw_rng *r, int cases) {
    for (int t = 0; t < cases; t++) {
        cw__gemm_params p;
        memset(&p, 0, sizeof p);
        p.trans_a = (int)cw_rng_range(r, 0, 1);
        p.trans_b = (int)cw_rng_range(r, 0, 1);
        p.m = cw_rng_range(r, 1, 70);
        p.n = cw_rng_range(r, 1, 70);
        p.k = cw_rng_range(r, 1, 300);
        p.alpha = (float)cw_rng_range(r, 1, 8) / 4.0f;
        p.beta = (float)cw_rng_range(r, 0, 2) / 2.0f;
        int64_t ar = p.trans_a ? p.k : p.m, ac = p.trans_a ? p.m : p.k;
        int64_t br = p.trans_b ? p.n : p.k, bc = p.trans_b ? p.k : p.n;
        p.lda = ac + cw_rng_range(r, 0, 3);
        p.ldb = bc + cw_rng_range(r, 0, 3);
        p.ldc = p.n + cw_rng_range(r, 0, 3);
        int64_t an = ar * p.lda, bn = br * p.ldb, cn = p.m * p.ldc;
        float *ha = rnd_array(r, an), *hb = rnd_array(r, bn), *hc = rnd_array(r, cn);
        side *sides[2] = {&g_cpu, &g_dev};
        float *res[2];
        for (int s = 0; s < 2; s++) {
            float *ga = dalloc(sides[s], an * 4), *gb = dalloc(sides[s], bn * 4), *gc = dalloc(sides[s], cn * 4);
            dput(sides[s], ga, ha, an * 4);
            dput(sides[s], gb, hb, bn * 4);
            dput(sides[s], gc, hc, cn * 4);
            cw__gemm_params q = p;
            q.a = ga;
            q.b = gb;
            q.c = gc;
            ASSERT_OK_CTX(sides[s]->ctx, cw__op_gemm(sides[s]->be, sides[s]->s, &q));
            dsync(sides[s]);
            res[s] = malloc((size_t)cn * 4);
            dget(sides[s], res[s], gc, cn * 4);
            dfree(sides[s], ga), dfree(sides[s], gb), dfree(sides[s], gc);
        }
        compare("gemm", res[0], res[1], cn, CW_F32); /* padding columns too: must stay untouched */
        free(ha), free(hb), free(hc), free(res[0]), free(res[1]);
    }
}

static void test_softmax(cw_rng *r, int cases) {
    for (int t = 0; t < cases; t++) {
        int64_t rows = cw_rng_range(r, 1, 40), cols = cw_rng_range(r, 1, t == 0 ? 5000 : 700);
        int64_t ld = cols + cw_rng_range(r, 0, 5), n = rows * ld;
        float *h = rnd_array(r, n);
        for (int64_t i = 0; i < n; i++) h[i] *= 20.0f; /* logits up to +-20 */
        side *sides[2] = {&g_cpu, &g_dev};
        float *res[2];
        for (int s = 0; s < 2; s++) {
            float *g = dalloc(sides[s], n * 4);
            dput(sides[s], g, h, n * 4);
            ASSERT_OK_CTX(sides[s]->ctx, cw__op_softmax_rows(sides[s]->be, sides[s]->s, g, rows, cols, ld));
            dsync(sides[s]);
            res[s] = malloc((size_t)n * 4);
            dget(sides[s], res[s], g, n * 4);
            dfree(sides[s], g);
        }
        compare("softmax_rows", res[0], res[1], n, CW_F32);
        free(h), free(res[0]), free(res[1]);
    }
}

/* ---- memory, streams, events --------------------------------------------------------------- */

typedef struct host_mark {
    int order[4];
    int n;
} host_mark;
static host_mark g_mark;
static void mark_fn(void *arg) { g_mark.order[g_mark.n++] = (int)(intptr_t)arg; }

static void test_streams(void) {
    side *sd = &g_dev;
    cw__backend *be = sd->be;
    int64_t words = 1 << 20;
    uint32_t *a = dalloc(sd, words * 4), *b = dalloc(sd, words * 4);
    cw__event *ev = NULL;
    ASSERT_OK_CTX(sd->ctx, be->rt->event_create(be, &ev));
    int done = 0;
    /* a never-recorded event is complete, and waiting on it is a no-op */
    ASSERT_OK_CTX(sd->ctx, be->rt->event_query(be, ev, &done));
    ASSERT_EQ_I(done, 1);
    ASSERT_OK_CTX(sd->ctx, be->rt->stream_wait_event(be, sd->s2, ev));
    /* fill on s, copy on s2 after the event: the copy sees the fill */
    ASSERT_OK_CTX(sd->ctx, be->rt->fill32_async(be, sd->s, a, 0xdeadbeefu, words));
    ASSERT_OK_CTX(sd->ctx, be->rt->event_record(be, ev, sd->s));
    ASSERT_OK_CTX(sd->ctx, be->rt->stream_wait_event(be, sd->s2, ev));
    ASSERT_OK_CTX(sd->ctx, be->rt->copy_async(be, sd->s2, b, a, words * 4));
    g_mark.n = 0;
    if (be->rt->launch_host) {
        ASSERT_OK_CTX(sd->ctx, be->rt->launch_host(be, sd->s2, mark_fn, (void *)(intptr_t)1));
        ASSERT_OK_CTX(sd->ctx, be->rt->launch_host(be, sd->s2, mark_fn, (void *)(intptr_t)2));
    }
    int64_t syncs0 = be->rt->host_syncs(be);
    ASSERT_OK_CTX(sd->ctx, be->rt->event_synchronize(be, ev));
    ASSERT_OK_CTX(sd->ctx, be->rt->stream_synchronize(be, sd->s2));
    ASSERT_EQ_I(be->rt->host_syncs(be) - syncs0, 2);
    ASSERT_OK_CTX(sd->ctx, be->rt->event_query(be, ev, &done));
    ASSERT_EQ_I(done, 1);
    if (be->rt->launch_host) {
        ASSERT_EQ_I(g_mark.n, 2);
        ASSERT_EQ_I(g_mark.order[0], 1);
        ASSERT_EQ_I(g_mark.order[1], 2);
    }
    uint32_t *h = malloc((size_t)words * 4);
    dget(sd, h, b, words * 4);
    for (int64_t i = 0; i < words; i++)
        if (h[i] != 0xdeadbeefu) {
            fprintf(stderr, "copy after event: word %lld = %#x\n", (long long)i, h[i]);
            exit(1);
        }
    be->rt->event_destroy(be, ev);
    free(h);
    /* cudaMalloc and cudaFree count as host synchronisations (they may stall the device) */
    if (!g_selftest) {
        int64_t s0 = be->rt->host_syncs(be);
        void *t = dalloc(sd, 4096);
        dfree(sd, t);
        ASSERT_EQ_I(be->rt->host_syncs(be) - s0, 2);
    }
    /* device timestamps from event pairs: marks in stream order, relative to mark 0 */
    if (be->rt->timer_create) {
        cw__timer *tm = NULL;
        int64_t ns[4];
        cw__event *ev2 = NULL;
        ASSERT_OK_CTX(sd->ctx, be->rt->event_create(be, &ev2));
        ASSERT_OK_CTX(sd->ctx, be->rt->timer_create(be, 4, &tm));
        ASSERT_OK_CTX(sd->ctx, be->rt->timer_mark(be, tm, 0, sd->s));
        ASSERT_OK_CTX(sd->ctx, be->rt->fill32_async(be, sd->s, a, 0u, words));
        ASSERT_OK_CTX(sd->ctx, be->rt->timer_mark(be, tm, 1, sd->s));
        ASSERT_OK_CTX(sd->ctx, be->rt->event_record(be, ev2, sd->s));
        ASSERT_OK_CTX(sd->ctx, be->rt->stream_wait_event(be, sd->s2, ev2));
        ASSERT_OK_CTX(sd->ctx, be->rt->copy_async(be, sd->s2, b, a, words * 4));
        ASSERT_OK_CTX(sd->ctx, be->rt->timer_mark(be, tm, 2, sd->s2));
        dsync(sd);
        ASSERT_OK_CTX(sd->ctx, be->rt->timer_read(be, tm, ns));
        ASSERT_EQ_I(ns[0], 0);
        ASSERT_TRUE(ns[1] >= 0 && ns[2] >= ns[1]);
        ASSERT_EQ_I(ns[3], -1); /* never recorded */
        ASSERT_EQ_I(be->rt->timer_read(be, tm, ns), CW_ERR_INVALID_ARG); /* recordings forgotten */
        be->rt->timer_destroy(be, tm);
        be->rt->event_destroy(be, ev2);
    }
    dfree(sd, a), dfree(sd, b);
    /* out of device memory is a clean status, and the next allocation works */
    if (!g_selftest) {
        void *huge = NULL;
        ASSERT_EQ_I(be->rt->dev_alloc(be, (int64_t)1 << 50, &huge), CW_ERR_OUT_OF_MEMORY);
        ASSERT_TRUE(huge == NULL);
        ASSERT_TRUE(strstr(cw_context_get_last_error(sd->ctx), "cudaMalloc") != NULL);
        void *ok = dalloc(sd, 1 << 20);
        dfree(sd, ok);
    }
}

/* ---- interop: a caller's CUDA stream as the context's stream 0 ------------------------------ */

#ifdef CW_HAVE_CUDA
#include "convweave/convweave_cuda.h"

static void test_interop(cw_rng *r) {
    if (g_selftest) return;
    cudaStream_t mine = NULL;
    ASSERT_TRUE(cudaStreamCreateWithFlags(&mine, cudaStreamNonBlocking) == cudaSuccess);
    int dev = -1;
    ASSERT_OK_CTX(g_dev.ctx, cw_context_get_cuda_device(g_dev.ctx, &dev));
    ASSERT_EQ_I(dev, 0);
    /* stream 0 already exists (the test made it): its work is drained and the handle swapped */
    ASSERT_OK_CTX(g_dev.ctx, cw_context_set_cuda_stream(g_dev.ctx, 0, mine));
    void *got = NULL;
    ASSERT_OK_CTX(g_dev.ctx, cw_context_get_cuda_stream(g_dev.ctx, 0, &got));
    ASSERT_TRUE(got == (void *)mine);
    ASSERT_EQ_I(cw_context_set_cuda_stream(g_dev.ctx, CW__MAX_STREAMS, mine), CW_ERR_INVALID_ARG);
    /* the library's work now runs on the caller's stream: a fill on stream 0, then the
     * caller synchronises its own stream and reads the result */
    int64_t words = 4096;
    uint32_t *d = dalloc(&g_dev, words * 4), *h = malloc((size_t)words * 4);
    ASSERT_OK_CTX(g_dev.ctx, g_dev.be->rt->fill32_async(g_dev.be, g_dev.s, d, 0x12345678u, words));
    ASSERT_TRUE(cudaStreamSynchronize(mine) == cudaSuccess);
    ASSERT_TRUE(cudaMemcpy(h, d, (size_t)words * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
    for (int64_t i = 0; i < words; i++) ASSERT_TRUE(h[i] == 0x12345678u);
    free(h);
    dfree(&g_dev, d);
    test_conv(r, 5); /* convs on the swapped stream still match the cpu */
    /* the context never destroys the caller's stream: after the test's context is gone
     * (main), the stream is still valid; here it is checked by a query */
    ASSERT_TRUE(cudaStreamQuery(mine) == cudaSuccess);
}
#else
static void test_interop(cw_rng *r) { (void)r; }
#endif

/* ---- the public one-call conv, patched under a budget, cuda against cpu -------------------- */

static void test_public_conv(cw_rng *r) {
    cw_tensor_desc xd, wd, yd, bd;
    int64_t xdims[4] = {1, 8, 37, 29}, wdims[4] = {6, 8, 3, 3}, bdims[1] = {6};
    cw_conv_params cp = CW_CONV_PARAMS_INIT;
    cp.pad_pre[0] = cp.pad_pre[1] = 1;
    cp.pad_post[0] = 2;
    cp.pad_post[1] = 1;
    ASSERT_OK(cw_tensor_desc_make(&xd, CW_F32, 4, xdims));
    ASSERT_OK(cw_tensor_desc_make(&wd, CW_F32, 4, wdims));
    ASSERT_OK(cw_tensor_desc_make(&bd, CW_F32, 1, bdims));
    ASSERT_OK_CTX(g_cpu.ctx, cw_conv_output_desc(g_cpu.ctx, &yd, &xd, &wd, &cp));
    int64_t xn = cw__desc_numel(&xd), wn = cw__desc_numel(&wd), yn = cw__desc_numel(&yd);
    float *hx = rnd_array(r, xn), *hw = rnd_array(r, wn), *hb = rnd_array(r, 6);
    float *out[2];
    side *sides[2] = {&g_cpu, &g_dev};
    for (int s = 0; s < 2; s++) {
        cw_context *c = sides[s]->ctx;
        cw_tensor *x, *w, *b, *y;
        ASSERT_OK_CTX(c, cw_tensor_create(&x, c, &xd));
        ASSERT_OK_CTX(c, cw_tensor_create(&w, c, &wd));
        ASSERT_OK_CTX(c, cw_tensor_create(&b, c, &bd));
        ASSERT_OK_CTX(c, cw_tensor_create(&y, c, &yd));
        ASSERT_OK_CTX(c, cw_tensor_upload(x, hx, (size_t)xn * 4));
        ASSERT_OK_CTX(c, cw_tensor_upload(w, hw, (size_t)wn * 4));
        ASSERT_OK_CTX(c, cw_tensor_upload(b, hb, 24));
        cw_compile_options opt = CW_COMPILE_OPTIONS_INIT;
        opt.policy = s ? CW_PATCHES_FIXED : CW_PATCHES_NONE;
        opt.patches = 5;
        ASSERT_OK_CTX(c, cw_conv_forward(c, x, w, b, y, &cp, &opt));
        out[s] = malloc((size_t)yn * 4);
        ASSERT_OK_CTX(c, cw_tensor_download(y, out[s], (size_t)yn * 4));
        cw_tensor_destroy(x), cw_tensor_destroy(w), cw_tensor_destroy(b), cw_tensor_destroy(y);
    }
    compare("cw_conv_forward, 5 patches", out[0], out[1], yn, CW_F32);
    free(hx), free(hw), free(hb), free(out[0]), free(out[1]);
}

int main(void) {
    pin_nvrtc();
    g_selftest = getenv("CW_CUDA_OPS_SELFTEST") != NULL;
    side_open(&g_dev, g_selftest ? CW_BACKEND_CPU : CW_BACKEND_CUDA);
    side_open(&g_cpu, CW_BACKEND_CPU);
    if (g_selftest) fprintf(stderr, "SELFTEST: the device side is a second cpu context (f32 only)\n");
    fprintf(stderr, "device backend: %s\n", cw_context_get_backend_name(g_dev.ctx));
    cw_rng rng = {cw_test_seed(7177)};
    int quick = cw_test_quick();

    test_streams();
    test_conv(&rng, quick ? 40 : 150);
    test_conv_empty_patches(&rng);
    test_conv_packed_big(&rng);
    test_prep(&rng, quick ? 30 : 100);
    test_gn(&rng, quick ? 20 : 60);
    test_gn_finalize_parts(&rng);
    test_add(&rng, quick ? 30 : 100);
    test_copy_ops(&rng, quick ? 40 : 200);
    test_gemm(&rng, quick ? 20 : 60);
    test_softmax(&rng, quick ? 10 : 30);
    test_public_conv(&rng);
    test_interop(&rng);

    fprintf(stderr, "%lld comparisons; worst relative error f32 %.3g, f16 %.3g, bf16 %.3g\n", (long long)g_cases,
            g_worst[CW_F32], g_worst[CW_F16], g_worst[CW_BF16]);
    cw_context_destroy(g_dev.ctx);
    cw_context_destroy(g_cpu.ctx);
    TEST_DONE();
}
