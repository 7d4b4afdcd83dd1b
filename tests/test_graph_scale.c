/* cw_graph_scale, the worked example of docs/adding-an-op.md, through the graph API against
 * a double-precision reference: alone (4-D), feeding a patched 3x3 conv, and feeding a
 * GroupNorm + SiLU (5-D: its task emits the GroupNorm's statistics); unscheduled and
 * patched on 3 streams with chaos and poison; and the builder's argument checks. */
#include "graph_run.h"

enum { N = 2, C = 5, H = 9, W = 6, K = 4, G = 5 };

/* y0 = scale(x, s); y1 = conv3x3(y0, w) + b (padding 1). */
static void test_scale_conv(cw_context *ctx, cw_rng *r) {
    const int64_t xdims[4] = {N, C, H, W}, wdims[4] = {K, C, 3, 3}, cdim = C, kdim = K;
    const int64_t nx = N * C * H * W;
    cw_tensor *tx, *ts, *tw, *tb;
    float *x = rnd_stored(ctx, r, CW_F32, 4, xdims, 1.0f, 0.2f, &tx);
    float *s = rnd_stored(ctx, r, CW_F32, 1, &cdim, 1.5f, 0.0f, &ts);
    float *w = rnd_stored(ctx, r, CW_F32, 4, wdims, 0.3f, 0.0f, &tw);
    float *b = rnd_stored(ctx, r, CW_F32, 1, &kdim, 0.1f, 0.0f, &tb);
    cw_conv_params cp = CW_CONV_PARAMS_INIT;
    cp.pad_pre[0] = cp.pad_post[0] = cp.pad_pre[1] = cp.pad_post[1] = 1;

    /* reference: the float product is the correctly rounded double one (IEEE), so the
     * scaled input is exact; the conv accumulates C*9 products */
    float *xs = malloc((size_t)nx * 4);
    double *ref0 = malloc((size_t)nx * sizeof *ref0);
    for (int64_t i = 0; i < nx; i++) {
        int64_t c = (i / (H * W)) % C;
        ref0[i] = (double)x[i] * (double)s[c];
        xs[i] = (float)ref0[i];
    }
    cw_tensor_desc xd, wd, yd[2];
    ASSERT_OK(cw_tensor_desc_make(&xd, CW_F32, 4, xdims));
    ASSERT_OK(cw_tensor_desc_make(&wd, CW_F32, 4, wdims));
    yd[0] = xd;
    ASSERT_OK_CTX(ctx, cw_conv_output_desc(ctx, &yd[1], &xd, &wd, &cp));
    double *ref1 = malloc((size_t)cw_tensor_desc_numel(&yd[1]) * sizeof *ref1);
    cw_ref_conv(&xd, xs, &wd, w, b, &cp, &yd[1], ref1);

    cw_node in, y[2];
    cw_graph *g = graph_open(ctx, CW_F32, 4, xdims, &in);
    ASSERT_OK_CTX(ctx, cw_graph_scale(g, &y[0], in, constant(ctx, g, ts)));
    ASSERT_OK_CTX(ctx, cw_graph_conv(g, &y[1], y[0], constant(ctx, g, tw), constant(ctx, g, tb), &cp));
    double *refs[2] = {ref0, ref1};
    const double bound[2] = {FLT_EPSILON / 2, 8.0 * C * 9 * FLT_EPSILON};
    check_graph(ctx, g, tx, 2, y, yd, refs, bound);
    cw_tensor_destroy(tx), cw_tensor_destroy(ts), cw_tensor_destroy(tw), cw_tensor_destroy(tb);
    free(x), free(s), free(w), free(b), free(xs), free(ref0), free(ref1);
}

/* 5-D: y = silu(group_norm(scale(x, s))), the statistics taken from the scale's task. */
static void test_scale_gn_3d(cw_context *ctx, cw_rng *r) {
    enum { D = 3, C5 = 6, G5 = 3 };
    const int64_t xdims[5] = {1, C5, D, 7, 4}, cdim = C5;
    const int64_t per = D * 7 * 4, nx = C5 * per;
    cw_tensor *tx, *ts;
    float *x = rnd_stored(ctx, r, CW_F32, 5, xdims, 1.0f, 0.5f, &tx);
    float *s = rnd_stored(ctx, r, CW_F32, 1, &cdim, 2.0f, 0.0f, &ts);
    gn_silu gn;
    gn_silu_open(&gn, ctx, r, C5, G5);
    double *xs = malloc((size_t)nx * sizeof *xs), *ref = malloc((size_t)nx * sizeof *ref);
    for (int64_t i = 0; i < nx; i++) xs[i] = (double)x[i] * s[i / per];
    gn_silu_ref(&gn, xs, per, ref);
    cw_tensor_desc xd;
    ASSERT_OK(cw_tensor_desc_make(&xd, CW_F32, 5, xdims));
    cw_node in, h;
    cw_graph *g = graph_open(ctx, CW_F32, 5, xdims, &in);
    ASSERT_OK_CTX(ctx, cw_graph_scale(g, &h, in, constant(ctx, g, ts)));
    h = gn_silu_node(&gn, ctx, g, h);
    double *refs[1] = {ref};
    const double bound[1] = {64.0 * FLT_EPSILON}; /* normalise + SiLU in float: a few ulps */
    check_graph(ctx, g, tx, 1, &h, &xd, refs, bound);
    cw_tensor_destroy(tx), cw_tensor_destroy(ts);
    gn_silu_close(&gn);
    free(x), free(s), free(xs), free(ref);
}

static void test_badargs(cw_context *ctx) {
    const int64_t xdims[4] = {1, C, 4, 4}, vdims[1] = {C + 1}, cdim = C, mdims[2] = {C, C};
    cw_tensor *bad = upload(ctx, CW_F32, 1, vdims, NULL), *good = upload(ctx, CW_F32, 1, &cdim, NULL);
    cw_node x, out;
    cw_graph *g = graph_open(ctx, CW_F32, 4, xdims, &x);
    const cw_node m = input(ctx, g, "m", CW_F32, 2, mdims), vb = constant(ctx, g, bad), vg = constant(ctx, g, good);
    CHECK_REFUSED(ctx, cw_graph_scale(g, &out, x, vb), "cw_graph_scale: s must be");
    CHECK(out == CW_NODE_NONE);
    ASSERT_STATUS(cw_graph_scale(g, &out, x, x), CW_ERR_INVALID_ARG);  /* not a constant */
    ASSERT_STATUS(cw_graph_scale(g, &out, m, vg), CW_ERR_INVALID_ARG);  /* x of rank 2 */
    ASSERT_STATUS(cw_graph_scale(g, &out, x, 99), CW_ERR_INVALID_ARG);  /* not a node */
    ASSERT_STATUS(cw_graph_scale(g, NULL, x, vg), CW_ERR_INVALID_ARG);
    ASSERT_STATUS(cw_graph_scale(NULL, &out, x, vg), CW_ERR_INVALID_ARG);
    ASSERT_OK_CTX(ctx, cw_graph_scale(g, &out, x, vg));
    cw_graph_destroy(g);
    cw_tensor_destroy(bad), cw_tensor_destroy(good);
}

int main(void) {
    cw_rng r = {cw_test_seed(11)};
    cw_context *ctx = chaos_context();
    test_scale_conv(ctx, &r);
    test_scale_gn_3d(ctx, &r);
    test_badargs(ctx);
    cw_context_destroy(ctx);
    TEST_DONE();
}
