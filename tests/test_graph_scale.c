/* cw_graph_scale, the worked example of docs/adding-an-op.md, through the graph API against
 * a double-precision reference: alone (4-D), feeding a patched 3x3 conv, and feeding a
 * GroupNorm + SiLU (5-D: its task emits the GroupNorm's statistics); unscheduled and
 * patched on 3 streams with chaos and poison; and the builder's argument checks. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "conv_ref.h"
#include "convweave/convweave.h"
#include "graph_run.h"
#include "testutil.h"

enum { N = 2, C = 5, H = 9, W = 6, K = 4, G = 5 };

/* y0 = scale(x, s); y1 = conv3x3(y0, w) + b (padding 1). */
static void test_scale_conv(cw_context *ctx, cw_rng *r) {
    const int64_t xdims[4] = {N, C, H, W}, wdims[4] = {K, C, 3, 3}, cdim = C, kdim = K;
    const int64_t nx = N * C * H * W;
    float *x = rnd(r, nx, 1.0f, 0.2f), *s = rnd(r, C, 1.5f, 0.0f), *w = rnd(r, K * C * 9, 0.3f, 0.0f);
    float *b = rnd(r, K, 0.1f, 0.0f);
    cw_tensor *tx = upload(ctx, CW_F32, 4, xdims, x), *ts = upload(ctx, CW_F32, 1, &cdim, s);
    cw_tensor *tw = upload(ctx, CW_F32, 4, wdims, w), *tb = upload(ctx, CW_F32, 1, &kdim, b);
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

    cw_graph *g;
    ASSERT_OK_CTX(ctx, cw_graph_create(&g, ctx));
    cw_node in, y0, y1;
    ASSERT_OK_CTX(ctx, cw_graph_input(g, &in, "x", &xd));
    ASSERT_OK_CTX(ctx, cw_graph_scale(g, &y0, in, constant(ctx, g, ts)));
    ASSERT_OK_CTX(ctx, cw_graph_conv(g, &y1, y0, constant(ctx, g, tw), constant(ctx, g, tb), &cp));
    ASSERT_OK_CTX(ctx, cw_graph_output(g, y0, "scaled"));
    ASSERT_OK_CTX(ctx, cw_graph_output(g, y1, "conv"));
    double *refs[2] = {ref0, ref1};
    const double bound[2] = {FLT_EPSILON / 2, 8.0 * C * 9 * FLT_EPSILON};
    run_and_check(ctx, g, CW_PATCHES_NONE, tx, 2, yd, refs, bound);
    run_and_check(ctx, g, CW_PATCHES_FIXED, tx, 2, yd, refs, bound);
    cw_graph_destroy(g);
    cw_tensor_destroy(tx), cw_tensor_destroy(ts), cw_tensor_destroy(tw), cw_tensor_destroy(tb);
    free(x), free(s), free(w), free(b), free(xs), free(ref0), free(ref1);
}

/* 5-D: y = silu(group_norm(scale(x, s))), the statistics taken from the scale's task. */
static void test_scale_gn_3d(cw_context *ctx, cw_rng *r) {
    enum { D = 3, C5 = 6, G5 = 3 };
    const int64_t xdims[5] = {1, C5, D, 7, 4}, cdim = C5;
    const int64_t per = D * 7 * 4, nx = C5 * per, cg = C5 / G5;
    float *x = rnd(r, nx, 1.0f, 0.5f), *s = rnd(r, C5, 2.0f, 0.0f), *gm = rnd(r, C5, 0.2f, 1.0f);
    float *bt = rnd(r, C5, 0.2f, 0.0f);
    cw_tensor *tx = upload(ctx, CW_F32, 5, xdims, x), *ts = upload(ctx, CW_F32, 1, &cdim, s);
    cw_tensor *tg = upload(ctx, CW_F32, 1, &cdim, gm), *tb = upload(ctx, CW_F32, 1, &cdim, bt);
    double *ref = malloc((size_t)nx * sizeof *ref);
    for (int64_t gi = 0; gi < G5; gi++) {
        double m = 0, q = 0;
        for (int64_t c = gi * cg; c < (gi + 1) * cg; c++)
            for (int64_t e = 0; e < per; e++) m += (double)x[c * per + e] * s[c];
        m /= (double)(cg * per);
        for (int64_t c = gi * cg; c < (gi + 1) * cg; c++)
            for (int64_t e = 0; e < per; e++) q += ((double)x[c * per + e] * s[c] - m) * ((double)x[c * per + e] * s[c] - m);
        double rs = 1.0 / sqrt(q / (double)(cg * per) + 1e-6);
        for (int64_t c = gi * cg; c < (gi + 1) * cg; c++)
            for (int64_t e = 0; e < per; e++) {
                double v = ((double)x[c * per + e] * s[c] - m) * rs * gm[c] + bt[c];
                ref[c * per + e] = v / (1.0 + exp(-v));
            }
    }
    cw_tensor_desc xd;
    ASSERT_OK(cw_tensor_desc_make(&xd, CW_F32, 5, xdims));
    cw_graph *g;
    ASSERT_OK_CTX(ctx, cw_graph_create(&g, ctx));
    cw_node in, h;
    ASSERT_OK_CTX(ctx, cw_graph_input(g, &in, "x", &xd));
    ASSERT_OK_CTX(ctx, cw_graph_scale(g, &h, in, constant(ctx, g, ts)));
    ASSERT_OK_CTX(ctx, cw_graph_group_norm(g, &h, h, constant(ctx, g, tg), constant(ctx, g, tb), G5, 1e-6f));
    ASSERT_OK_CTX(ctx, cw_graph_silu(g, &h, h));
    ASSERT_OK_CTX(ctx, cw_graph_output(g, h, "y"));
    double *refs[1] = {ref};
    const double bound[1] = {64.0 * FLT_EPSILON}; /* normalise + SiLU in float: a few ulps */
    run_and_check(ctx, g, CW_PATCHES_NONE, tx, 1, &xd, refs, bound);
    run_and_check(ctx, g, CW_PATCHES_FIXED, tx, 1, &xd, refs, bound);
    cw_graph_destroy(g);
    cw_tensor_destroy(tx), cw_tensor_destroy(ts), cw_tensor_destroy(tg), cw_tensor_destroy(tb);
    free(x), free(s), free(gm), free(bt), free(ref);
}

static void test_badargs(cw_context *ctx) {
    const int64_t xdims[4] = {1, C, 4, 4}, vdims[1] = {C + 1}, cdim = C, mdims[2] = {C, C};
    cw_tensor_desc xd, md;
    ASSERT_OK(cw_tensor_desc_make(&xd, CW_F32, 4, xdims));
    ASSERT_OK(cw_tensor_desc_make(&md, CW_F32, 2, mdims));
    cw_tensor *bad = upload(ctx, CW_F32, 1, vdims, NULL), *good = upload(ctx, CW_F32, 1, &cdim, NULL);
    cw_graph *g;
    ASSERT_OK_CTX(ctx, cw_graph_create(&g, ctx));
    cw_node x, m, out, vb, vg;
    ASSERT_OK_CTX(ctx, cw_graph_input(g, &x, "x", &xd));
    ASSERT_OK_CTX(ctx, cw_graph_input(g, &m, "m", &md));
    vb = constant(ctx, g, bad);
    vg = constant(ctx, g, good);
    ASSERT_STATUS(cw_graph_scale(g, &out, x, vb), CW_ERR_INVALID_ARG);
    CHECK(out == CW_NODE_NONE);
    CHECK(strstr(cw_context_get_last_error(ctx), "cw_graph_scale: s must be") != NULL);
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
