/* cw_graph_avg_pool2, the worked example of a new op in docs/adding-an-op.md, against a
 * double-precision reference: between two 3x3 convs (4-D, patched convs on 3 streams with
 * chaos and poison), in front of a GroupNorm + SiLU (5-D: its task emits the statistics),
 * in f16 and bf16 graphs; the builder's argument checks; and the op's contract as the checks
 * in front of the backends apply it (cw__op_run), naming what is wrong. */
#include "graph_run.h"

/* ref[.., h, w] = mean of x[.., 2h + {0,1}, 2w + {0,1}] in double; x's last two dims H, W. */
static void ref_pool(const double *x, int64_t outer, int64_t H, int64_t W, double *ref) {
    for (int64_t o = 0; o < outer; o++)
        for (int64_t h = 0; h < H / 2; h++)
            for (int64_t w = 0; w < W / 2; w++) {
                const double *p = x + (o * H + 2 * h) * W + 2 * w;
                ref[(o * (H / 2) + h) * (W / 2) + w] = (p[0] + p[1] + p[W] + p[W + 1]) / 4.0;
            }
}

/* y0 = avg_pool2(conv3x3(x)); y1 = conv3x3(y0) (padding 1): the pool reads every row of a
 * patched conv's output and feeds another. */
static void test_conv_pool_conv(cw_context *ctx, cw_rng *r) {
    enum { N = 2, C = 3, K = 4, H = 10, W = 6 };
    const int64_t xdims[4] = {N, C, H, W}, pdims[4] = {N, K, H / 2, W / 2};
    sandwich s;
    sandwich_open(&s, ctx, r, CW_F32, 4, xdims, K, 0.1f);
    /* reference in double all the way: conv1 in double, pooled, conv2 of the pooled values */
    double *ref0 = malloc((size_t)numel(4, pdims) * sizeof *ref0);
    ref_pool(s.c1, N * K, H, W, ref0);
    cw_node y0;
    ASSERT_OK_CTX(ctx, cw_graph_avg_pool2(s.g, &y0, s.h));
    /* conv1 in float (C*9 products, relative to its magnitude) then 3 additions and an exact
     * quarter; conv2 adds K*9 products of slightly perturbed inputs */
    const double bound[2] = {8.0 * (C * 9 + 3) * FLT_EPSILON, 8.0 * (C * 9 + K * 9 + 3) * FLT_EPSILON};
    sandwich_close(&s, y0, pdims, ref0, bound, "avg_pool2");
    free(ref0);
}

/* 5-D in graphs of dtype dt: y0 = avg_pool2(x) (per D slice), y1 = silu(group_norm(y0)),
 * the statistics taken from the pool's task. The reference starts from x as stored in dt. */
static void test_pool_gn_3d(cw_context *ctx, cw_rng *r, cw_dtype dt) {
    enum { C = 6, G = 3, D = 3, H = 8, W = 6 };
    const int64_t xdims[5] = {1, C, D, H, W}, ydims[5] = {1, C, D, H / 2, W / 2};
    const int64_t nx = C * D * H * W, ny = C * D * (H / 2) * (W / 2);
    cw_tensor *tx;
    float *x = rnd_stored(ctx, r, dt, 5, xdims, 1.0f, 0.5f, &tx);
    gn_silu gn;
    gn_silu_open(&gn, ctx, r, C, G);
    double *xr = malloc((size_t)nx * sizeof *xr), *ref0 = malloc((size_t)ny * sizeof *ref0);
    for (int64_t i = 0; i < nx; i++) xr[i] = x[i];
    ref_pool(xr, C * D, H, W, ref0);
    cw_node in, y0;
    cw_graph *g = graph_open(ctx, dt, 5, xdims, &in);
    ASSERT_OK_CTX(ctx, cw_graph_avg_pool2(g, &y0, in));
    /* the pool in f32 is a few ulps; the stored result rounds once more to dt's unit
     * roundoff, and the normalised output inherits about 4 of those (the pooled values round
     * before the GroupNorm reads them) */
    const double u = unit_roundoff(dt);
    const double bound[2] = {u + 8.0 * FLT_EPSILON, 8.0 * u + 64.0 * FLT_EPSILON};
    gn_silu_finish(&gn, ctx, g, tx, y0, dt, ydims, ref0, bound);
    cw_tensor_destroy(tx);
    free(x), free(xr), free(ref0);
}

static void test_badargs(cw_context *ctx) {
    const int64_t odd_h[4] = {1, 2, 5, 4}, odd_w[4] = {1, 2, 4, 3}, flat[2] = {2, 8};
    cw_node a, out;
    cw_graph *g = graph_open(ctx, CW_F32, 4, odd_h, &a);
    const cw_node b = input(ctx, g, "b", CW_F32, 4, odd_w), c = input(ctx, g, "c", CW_F32, 2, flat);
    CHECK_REFUSED(ctx, cw_graph_avg_pool2(g, &out, a), "cw_graph_avg_pool2: x [1, 2, 5, 4] must have even H and W");
    CHECK(out == CW_NODE_NONE);
    ASSERT_STATUS(cw_graph_avg_pool2(g, &out, b), CW_ERR_INVALID_ARG);
    CHECK_REFUSED(ctx, cw_graph_avg_pool2(g, &out, c), "cw_graph_avg_pool2: x must be [N, C, H, W]"); /* rank 2 */
    ASSERT_STATUS(cw_graph_avg_pool2(g, &out, 99), CW_ERR_INVALID_ARG); /* not a node */
    ASSERT_STATUS(cw_graph_avg_pool2(g, NULL, a), CW_ERR_INVALID_ARG);
    ASSERT_STATUS(cw_graph_avg_pool2(NULL, &out, a), CW_ERR_INVALID_ARG);
    cw_graph_destroy(g);
}

/* The op's contract in front of the backends: each violation refused with the name of what
 * is wrong, and a valid call runs (the cpu backend's loop against the reference). */
static void test_contract(void) {
    op_rig k;
    op_rig_open(&k);
    float x[2 * 4 * 6], y[2 * 2 * 3] = {0}, h16[4] = {0};
    for (int i = 0; i < 48; i++) x[i] = (float)(i * 7 % 11) - 3.0f;
    cw__op_args a;
    memset(&a, 0, sizeof a);
    a.code = CW_OP_AVG_POOL2;
    const int64_t xd[4] = {1, 2, 4, 6}, yd[4] = {1, 2, 2, 3};
    ASSERT_OK(cw_tensor_desc_make(&a.in[0].d, CW_F32, 4, xd));
    ASSERT_OK(cw_tensor_desc_make(&a.out.d, CW_F32, 4, yd));
    a.in[0].data = x, a.out.data = y;
    OP_RUN(&k, &a);
    double xr[48], ref[12];
    for (int i = 0; i < 48; i++) xr[i] = x[i];
    ref_pool(xr, 2, 4, 6, ref);
    for (int i = 0; i < 12; i++) CHECK(y[i] == (float)ref[i]); /* quarter-sums of small integers: exact */

    cw__op_args bad = a;
    bad.code = 77;
    OP_REFUSED(&k, &bad, "op: code 77 is not a CW_OP_* code");
    bad = a, bad.out.d.dims[3] = 4;
    OP_REFUSED(&k, &bad, "avg_pool2: out is [1, 2, 2, 4], the op makes [1, 2, 2, 3] of in[0]");
    bad = a, bad.in[0].d.dims[2] = 3;
    OP_REFUSED(&k, &bad, "avg_pool2: in[0] [1, 2, 3, 6] and the parameters are outside");
    bad = a, bad.in[0].d.dtype = CW_F16, bad.in[0].data = h16;
    OP_REFUSED(&k, &bad, "avg_pool2: in[0] is f16, expected f32");
    bad = a, bad.in[0].data = NULL;
    OP_REFUSED(&k, &bad, "avg_pool2: in[0]");
    bad = a; /* a per-channel op whose code is out of range, and one whose v is not f32 */
    bad.code = CW_OP_CHANNEL;
    bad.out.d = a.in[0].d, bad.out.data = x;
    const int64_t cdim = 2;
    ASSERT_OK(cw_tensor_desc_make(&bad.in[1].d, CW_F32, 1, &cdim));
    bad.in[1].data = h16;
    bad.param.i[0] = CW_CHANNEL_OP_COUNT;
    OP_REFUSED(&k, &bad, "channel: in[0] [1, 2, 4, 6] and the parameters are outside");
    bad.param.i[0] = CW_CHANNEL_SCALE, bad.in[1].d.dtype = CW_BF16;
    OP_REFUSED(&k, &bad, "channel: in[1] is bf16, expected f32");
    ASSERT_STATUS(cw__op_run(k.be, k.s, NULL), CW_ERR_INVALID_ARG);
    op_rig_close(&k);
}

int main(void) {
    cw_rng r = {cw_test_seed(12)};
    cw_context *ctx = chaos_context();
    test_conv_pool_conv(ctx, &r);
    test_pool_gn_3d(ctx, &r, CW_F32);
    test_pool_gn_3d(ctx, &r, CW_F16);
    test_pool_gn_3d(ctx, &r, CW_BF16);
    test_badargs(ctx);
    cw_context_destroy(ctx);
    test_contract();
    TEST_DONE();
}
