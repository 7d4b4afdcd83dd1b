/* A conv's result times a tensor, added to a residual, as the conv's epilogue (fusion.c,
 * cw__scaled_conv; lower_conv.c, cw__emit_scale): o = tanh(conv_o(x)) (not a conv itself,
 * whose own epilogue the add would be); m = sigmoid(conv_m(x)) of
 * kb channels (1: a mask broadcast over K, or K); f = conv_f(x); y = o + f * m (the mul's
 * operands in either order); z = conv_z(y). Each patch of f is scaled by m's rows of its
 * band and added into o's storage, so f and f * m are never whole: the patched plan's live
 * activations are o and m alone, where a buffer per node holds o, m, f, f * m and y. With y
 * also an output it comes back whole (the epilogue writes the output tensor). With f of one
 * channel broadcast over m's K (y = o + m * f) the product is larger than f's bands: no
 * epilogue then, the ops run whole, and the values still match. Checked
 * against a double-precision reference, unscheduled and patched on 3 streams with chaos and
 * poison, twice per plan (the arena's stale contents), in f32, f16 and bf16. */
#include <math.h>
#include <stdlib.h>

#include "conv_ref.h"
#include "convweave/convweave.h"
#include "graph_run.h"
#include "testutil.h"

enum { N = 1, C = 3, K = 8, H = 16, W = 8 };

typedef struct {
    cw_tensor *tx, *tw[4], *tb;
    float *x, *w[4], *bias;
    int64_t kb;    /* m's channels: 1 or K */
    int64_t kf;    /* f's channels: K, or 1 (broadcast over m's K: kb == K, mul(m, f)) */
    int m_first;   /* the graph's mul is mul(m, f), not mul(f, m) */
} weights;

static const int64_t xdims[4] = {N, C, H, W}, ydims[4] = {N, K, H, W};

static void wdims(const weights *s, int i, int64_t d[4]) {
    d[0] = i == 1 ? s->kb : i == 2 ? s->kf : K, d[1] = i == 3 ? K : C, d[2] = d[3] = i == 1 ? 1 : 3;
}

static void weights_make(weights *s, cw_context *ctx, cw_rng *r, cw_dtype dt) {
    const int64_t k = K;
    s->x = rnd_stored(ctx, r, dt, 4, xdims, 1.0f, 0.0f, &s->tx);
    for (int i = 0; i < 4; i++) {
        int64_t d[4];
        wdims(s, i, d);
        s->w[i] = rnd_stored(ctx, r, dt, 4, d, 0.3f, 0.0f, &s->tw[i]);
    }
    s->bias = rnd_stored(ctx, r, dt, 1, &k, 0.1f, 0.0f, &s->tb);
}

static void weights_free(weights *s) {
    cw_tensor_destroy(s->tx), cw_tensor_destroy(s->tb), free(s->x), free(s->bias);
    for (int i = 0; i < 4; i++) cw_tensor_destroy(s->tw[i]), free(s->w[i]);
}

static cw_conv_params params(int k) {
    cw_conv_params cp = CW_CONV_PARAMS_INIT;
    cp.pad_pre[0] = cp.pad_post[0] = cp.pad_pre[1] = cp.pad_post[1] = k / 2;
    return cp;
}

/* y and z in double from the stored values (each conv's input rounded to f32; o and m
 * rounded to dt, as the plan stores them). */
static void reference(const weights *s, cw_dtype dt, double *y, double *z) {
    cw_tensor_desc xd, yd, md, fd, wd[4];
    const int64_t mdims[4] = {N, s->kb, H, W}, fdims[4] = {N, s->kf, H, W}, n = N * K * H * W, hw = H * W;
    ASSERT_OK(cw_tensor_desc_make(&xd, CW_F32, 4, xdims));
    ASSERT_OK(cw_tensor_desc_make(&yd, CW_F32, 4, ydims));
    ASSERT_OK(cw_tensor_desc_make(&md, CW_F32, 4, mdims));
    ASSERT_OK(cw_tensor_desc_make(&fd, CW_F32, 4, fdims));
    for (int i = 0; i < 4; i++) {
        int64_t d[4];
        wdims(s, i, d);
        ASSERT_OK(cw_tensor_desc_make(&wd[i], CW_F32, 4, d));
    }
    double *o = malloc((size_t)n * sizeof *o), *m = malloc((size_t)(N * s->kb * hw) * sizeof *m);
    double *f = malloc((size_t)(N * s->kf * hw) * sizeof *f);
    float *yf = malloc((size_t)n * sizeof *yf);
    const cw_conv_params c3 = params(3), c1 = params(1);
    cw_ref_conv(&xd, s->x, &wd[0], s->w[0], s->bias, &c3, &yd, o);
    cw_ref_conv(&xd, s->x, &wd[1], s->w[1], s->kb == K ? s->bias : NULL, &c1, &md, m);
    cw_ref_conv(&xd, s->x, &wd[2], s->w[2], s->kf == K ? s->bias : NULL, &c3, &fd, f);
    for (int64_t i = 0; i < N * s->kb * hw; i++) m[i] = rd((float)(1.0 / (1.0 + exp(-m[i]))), dt);
    for (int64_t i = 0; i < n; i++) o[i] = rd((float)tanh(o[i]), dt);
    for (int64_t i = 0; i < n; i++) {
        const int64_t b = i / (K * hw), k = i / hw % K, j = (b * s->kb + (s->kb == 1 ? 0 : k)) * hw + i % hw;
        const int64_t jf = (b * s->kf + (s->kf == 1 ? 0 : k)) * hw + i % hw;
        y[i] = o[i] + f[jf] * m[j];
        yf[i] = (float)y[i];
    }
    cw_ref_conv(&yd, yf, &wd[3], s->w[3], s->bias, &c3, &yd, z);
    free(o), free(m), free(f), free(yf);
}

/* The graph above; with keep, y is an output too. */
static cw_graph *build(cw_context *ctx, const weights *s, cw_dtype dt, int keep) {
    const cw_conv_params c3 = params(3), c1 = params(1);
    cw_node x, o, m, f, fm, y, z;
    cw_graph *g = graph_open(ctx, dt, 4, xdims, &x);
    const cw_node bias = constant(ctx, g, s->tb);
    ASSERT_OK_CTX(ctx, cw_graph_conv(g, &o, x, constant(ctx, g, s->tw[0]), bias, &c3));
    ASSERT_OK_CTX(ctx, cw_graph_unary(g, &o, o, CW_UNARY_TANH, 0.0f, 0.0f));
    ASSERT_OK_CTX(ctx, cw_graph_conv(g, &m, x, constant(ctx, g, s->tw[1]), s->kb == K ? bias : CW_NODE_NONE, &c1));
    ASSERT_OK_CTX(ctx, cw_graph_unary(g, &m, m, CW_UNARY_SIGMOID, 0.0f, 0.0f));
    ASSERT_OK_CTX(ctx, cw_graph_conv(g, &f, x, constant(ctx, g, s->tw[2]), s->kf == K ? bias : CW_NODE_NONE, &c3));
    if ((s->m_first && s->kb == K) || s->kf == 1) ASSERT_OK_CTX(ctx, cw_graph_binary(g, &fm, m, f, CW_BINARY_MUL));
    else ASSERT_OK_CTX(ctx, cw_graph_binary(g, &fm, f, m, CW_BINARY_MUL));
    ASSERT_OK_CTX(ctx, s->m_first ? cw_graph_add(g, &y, fm, o) : cw_graph_add(g, &y, o, fm));
    ASSERT_OK_CTX(ctx, cw_graph_conv(g, &z, y, constant(ctx, g, s->tw[3]), bias, &c3));
    ASSERT_OK_CTX(ctx, cw_graph_output(g, z, "z"));
    if (keep) ASSERT_OK_CTX(ctx, cw_graph_output(g, y, "y"));
    return g;
}

/* Bytes of an activation as the plan's arena holds it (rounded up to 512). */
static int64_t held(int64_t bytes) { return (bytes + 511) / 512 * 512; }

static void test_scaled(cw_context *ctx, cw_rng *r, cw_dtype dt, int64_t kb, int m_first, int64_t kf) {
    const int64_t n = N * K * H * W, es = (int64_t)cw_dtype_size(dt);
    const int64_t bytes = held(n * es), mbytes = held(N * kb * H * W * es);
    weights s = {.kb = kb, .m_first = m_first, .kf = kf};
    weights_make(&s, ctx, r, dt);
    double *y = malloc((size_t)n * sizeof *y), *z = malloc((size_t)n * sizeof *z);
    double *const ref[2] = {z, y};
    reference(&s, dt, y, z);
    const double bound = dt == CW_F32 ? 1e-5 : 64 * unit_roundoff(dt);
    cw_tensor_desc yd;
    ASSERT_OK(cw_tensor_desc_make(&yd, dt, 4, ydims));
    for (int keep = 0; keep < 2; keep++) {
        cw_graph *g = build(ctx, &s, dt, keep);
        const int64_t ref_peak = run_twice_live_peak(ctx, g, s.tx, CW_PATCHES_NONE, 1 + keep, &yd, ref, bound);
        const int64_t peak = run_twice_live_peak(ctx, g, s.tx, CW_PATCHES_FIXED, 1 + keep, &yd, ref, bound);
        fprintf(stderr, "%s m of %lld channel(s), f of %lld%s keep %d: live activations %lld bytes patched, %lld "
                        "unscheduled (a tensor %lld)\n",
                cw__dtype_name(dt), (long long)kb, (long long)kf, m_first ? ", mul(m, f) first in the add" : "", keep,
                (long long)peak, (long long)ref_peak, (long long)bytes);
        if (kf == 1) { /* no epilogue: o and m whole at once, f beside them */
            CHECK(peak >= 2 * bytes);
        } else { /* unscheduled: o, m, f and f * m at once at least; patched: o (y in its
                  * storage, or with keep y in the output tensor) and m */
            CHECK(ref_peak >= 3 * bytes + mbytes);
            CHECK(peak == bytes + mbytes);
        }
        cw_graph_destroy(g);
    }
    free(y), free(z);
    weights_free(&s);
}

int main(void) {
    cw_rng r = {cw_test_seed(43)};
    cw_context *ctx = chaos_context();
    const cw_dtype dts[3] = {CW_F32, CW_F16, CW_BF16};
    for (int i = 0; i < 3; i++)
        for (int v = 0; v < 5; v++) /* v 4: f of one channel, broadcast over m's K */
            test_scaled(ctx, &r, dts[i], v & 1 || v == 4 ? K : 1, v >> 1 & 1, v == 4 ? 1 : K);
    cw_context_destroy(ctx);
    TEST_DONE();
}
