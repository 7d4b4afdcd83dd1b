/* cw_graph_shift, y = x + v[c] (the per-channel family's second member), against a
 * double-precision reference: between two 3x3 convs (4-D, unscheduled and patched on 3
 * streams with chaos and poison) and in front of a GroupNorm + SiLU (5-D: its task emits the
 * statistics), in f32, f16 and bf16 graphs; the builder's argument checks; and the op's
 * contract through cw__op_run. */
#include "graph_run.h"

enum { N = 2, C = 5, H = 9, W = 6, K = 4 };

/* y0 = shift(conv1(x), v); y1 = conv2(y0) (3x3, padding 1) in a graph of dtype dt; v f32. */
static void test_conv_shift_conv(cw_context *ctx, cw_rng *r, cw_dtype dt) {
    const int64_t xdims[4] = {N, C, H, W}, kdim = K;
    sandwich s;
    sandwich_open(&s, ctx, r, dt, 4, xdims, K, 0.0f);
    cw_tensor *tv;
    float *v = rnd_stored(ctx, r, CW_F32, 1, &kdim, 1.0f, 0.0f, &tv);
    const int64_t n1 = cw_tensor_desc_numel(&s.c1d), per = H * W;
    double *ref0 = malloc((size_t)n1 * sizeof *ref0);
    for (int64_t i = 0; i < n1; i++) ref0[i] = s.c1[i] + v[(i / per) % K];
    cw_node y0;
    ASSERT_OK_CTX(ctx, cw_graph_shift(s.g, &y0, s.h, constant(ctx, s.g, tv)));
    /* conv1 in float (C*9 products) stored in dt (u), the sum and its store (u); conv2 adds
     * K*9 products of those */
    const double u = unit_roundoff(dt);
    const double bound[2] = {4.0 * u + 16.0 * (C * 9 + 4) * FLT_EPSILON,
                             16.0 * u + 16.0 * (C * 9 + K * 9 + 4) * FLT_EPSILON};
    sandwich_close(&s, y0, s.c1d.dims, ref0, bound, "shift");
    cw_tensor_destroy(tv);
    free(v), free(ref0);
}

/* 5-D in dtype dt: y0 = shift(x, v), y1 = silu(group_norm(y0)), the statistics taken from
 * the shift's task. The reference starts from x as stored in dt. */
static void test_shift_gn_3d(cw_context *ctx, cw_rng *r, cw_dtype dt) {
    enum { D = 3, C5 = 6, G5 = 3, H5 = 7, W5 = 4 };
    const int64_t xdims[5] = {1, C5, D, H5, W5}, cdim = C5;
    const int64_t per = D * H5 * W5, nx = C5 * per;
    cw_tensor *tx, *tv;
    float *x = rnd_stored(ctx, r, dt, 5, xdims, 1.0f, 0.5f, &tx);
    float *v = rnd_stored(ctx, r, CW_F32, 1, &cdim, 2.0f, 0.0f, &tv);
    gn_silu gn;
    gn_silu_open(&gn, ctx, r, C5, G5);
    double *ref0 = malloc((size_t)nx * sizeof *ref0);
    for (int64_t i = 0; i < nx; i++) ref0[i] = (double)x[i] + v[i / per];
    cw_node in, y0;
    cw_graph *g = graph_open(ctx, dt, 5, xdims, &in);
    ASSERT_OK_CTX(ctx, cw_graph_shift(g, &y0, in, constant(ctx, g, tv)));
    /* the sum rounds once (u); the normalised output inherits several of those (the shifted
     * values round before the GroupNorm reads them) and its own f32 math */
    const double u = unit_roundoff(dt);
    const double bound[2] = {u + 4.0 * FLT_EPSILON, 8.0 * u + 64.0 * FLT_EPSILON};
    gn_silu_finish(&gn, ctx, g, tx, y0, dt, xdims, ref0, bound);
    cw_tensor_destroy(tx), cw_tensor_destroy(tv);
    free(x), free(v), free(ref0);
}

static void test_badargs(cw_context *ctx) {
    const int64_t xdims[4] = {1, C, 4, 4}, vdims[1] = {C + 1}, cdim = C, mdims[2] = {C, C};
    cw_tensor *bad = upload(ctx, CW_F32, 1, vdims, NULL), *good = upload(ctx, CW_F32, 1, &cdim, NULL);
    cw_tensor *half = upload(ctx, CW_F16, 1, &cdim, NULL);
    cw_node x, out;
    cw_graph *g = graph_open(ctx, CW_F32, 4, xdims, &x);
    const cw_node m = input(ctx, g, "m", CW_F32, 2, mdims);
    const cw_node vb = constant(ctx, g, bad), vg = constant(ctx, g, good), vh = constant(ctx, g, half);
    CHECK_REFUSED(ctx, cw_graph_shift(g, &out, x, vb),
                  "cw_graph_shift: v must be a contiguous f32 constant of dims [5] (f32 in graphs of every dtype), got "
                  "f32 [6]");
    CHECK(out == CW_NODE_NONE);
    CHECK_REFUSED(ctx, cw_graph_shift(g, &out, x, vh), "cw_graph_shift: v must be a contiguous f32 constant");
    /* v not a constant, x of rank 2, v not a node */
    CHECK_REFUSED(ctx, cw_graph_shift(g, &out, x, x), "cw_graph_shift: v must be");
    CHECK_REFUSED(ctx, cw_graph_shift(g, &out, m, vg), "cw_graph_shift: x must be [N, C, H, W]");
    CHECK_REFUSED(ctx, cw_graph_shift(g, &out, x, 99), "cw_graph_shift: v = 99 is not a node of this graph");
    ASSERT_STATUS(cw_graph_shift(g, NULL, x, vg), CW_ERR_INVALID_ARG);
    ASSERT_STATUS(cw_graph_shift(NULL, &out, x, vg), CW_ERR_INVALID_ARG);
    ASSERT_OK_CTX(ctx, cw_graph_shift(g, &out, x, vg));
    cw_graph_destroy(g);
    cw_tensor_destroy(bad), cw_tensor_destroy(good), cw_tensor_destroy(half);
}

/* The contract through cw__op_run: a valid shift (exact sums of small integers), an x
 * whose C is not v's, v in a half dtype. */
static void test_contract(void) {
    op_rig k;
    op_rig_open(&k);
    float x[2 * 3 * 4], y[2 * 3 * 4], v[3] = {1.0f, -2.0f, 0.5f};
    for (int i = 0; i < 24; i++) x[i] = (float)(i * 7 % 11) - 3.0f;
    cw__op_args a;
    memset(&a, 0, sizeof a);
    a.code = CW_OP_CHANNEL;
    a.param.i[0] = CW_CHANNEL_SHIFT;
    const int64_t xd[4] = {2, 3, 2, 2}, cdim = 3;
    ASSERT_OK(cw_tensor_desc_make(&a.in[0].d, CW_F32, 4, xd));
    ASSERT_OK(cw_tensor_desc_make(&a.in[1].d, CW_F32, 1, &cdim));
    a.out.d = a.in[0].d;
    a.in[0].data = x, a.in[1].data = v, a.out.data = y;
    OP_RUN(&k, &a);
    for (int i = 0; i < 24; i++) CHECK(y[i] == x[i] + v[(i / 4) % 3]);
    cw__op_args bad = a;
    bad.in[1].d.dims[0] = 2;
    OP_REFUSED(&k, &bad, "channel: in[0] [2, 3, 2, 2] and the parameters are outside");
    bad = a, bad.in[1].d.dtype = CW_F16;
    OP_REFUSED(&k, &bad, "channel: in[1] is f16, expected f32");
    op_rig_close(&k);
}

int main(void) {
    cw_rng r = {cw_test_seed(15)};
    cw_context *ctx = chaos_context();
    const cw_dtype dts[3] = {CW_F32, CW_F16, CW_BF16};
    for (int d = 0; d < 3; d++) {
        test_conv_shift_conv(ctx, &r, dts[d]);
        test_shift_gn_3d(ctx, &r, dts[d]);
    }
    test_badargs(ctx);
    cw_context_destroy(ctx);
    test_contract();
    TEST_DONE();
}
