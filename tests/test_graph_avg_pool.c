/* cw_graph_avg_pool2, the worked example of a new op in docs/adding-an-op.md, against a
 * double-precision reference: between two 3x3 convs (4-D, patched convs on 3 streams with
 * chaos and poison), in front of a GroupNorm + SiLU (5-D: its task emits the statistics),
 * in f16 and bf16 graphs; the builder's argument checks; and the op's contract as the checks
 * in front of the backends apply it (cw__op_run), naming what is wrong. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "conv_ref.h"
#include "convweave/convweave.h"
#include "core/half.h"
#include "graph_run.h"
#include "testutil.h"

/* x's values as stored in dtype dt (rounded once), written back into x as floats. */
static void round_to(float *x, int64_t n, cw_dtype dt) {
    for (int64_t i = 0; i < n; i++)
        if (dt == CW_F16) x[i] = cw__f16_to_f32(cw__f32_to_f16(x[i]));
        else if (dt == CW_BF16) x[i] = cw__bf16_to_f32(cw__f32_to_bf16(x[i]));
}

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
    const int64_t xdims[4] = {N, C, H, W}, w1dims[4] = {K, C, 3, 3}, w2dims[4] = {K, K, 3, 3}, kdim = K;
    float *x = rnd(r, N * C * H * W, 1.0f, 0.1f), *w1 = rnd(r, K * C * 9, 0.3f, 0.0f);
    float *w2 = rnd(r, K * K * 9, 0.3f, 0.0f), *b = rnd(r, K, 0.1f, 0.0f);
    cw_tensor *tx = upload(ctx, CW_F32, 4, xdims, x), *tw1 = upload(ctx, CW_F32, 4, w1dims, w1);
    cw_tensor *tw2 = upload(ctx, CW_F32, 4, w2dims, w2), *tb = upload(ctx, CW_F32, 1, &kdim, b);
    cw_conv_params cp = CW_CONV_PARAMS_INIT;
    cp.pad_pre[0] = cp.pad_post[0] = cp.pad_pre[1] = cp.pad_post[1] = 1;

    /* reference in double all the way: conv1 in double, pooled, conv2 of the pooled values */
    cw_tensor_desc xd, w1d, w2d, c1d, yd[2];
    ASSERT_OK(cw_tensor_desc_make(&xd, CW_F32, 4, xdims));
    ASSERT_OK(cw_tensor_desc_make(&w1d, CW_F32, 4, w1dims));
    ASSERT_OK(cw_tensor_desc_make(&w2d, CW_F32, 4, w2dims));
    ASSERT_OK_CTX(ctx, cw_conv_output_desc(ctx, &c1d, &xd, &w1d, &cp));
    const int64_t n1 = cw_tensor_desc_numel(&c1d), np = n1 / 4;
    double *c1 = malloc((size_t)n1 * sizeof *c1), *ref0 = malloc((size_t)np * sizeof *ref0);
    cw_ref_conv(&xd, x, &w1d, w1, b, &cp, &c1d, c1);
    float *pf = malloc((size_t)np * 4);
    ref_pool(c1, N * K, H, W, ref0);
    for (int64_t i = 0; i < np; i++) pf[i] = (float)ref0[i];
    const int64_t pdims[4] = {N, K, H / 2, W / 2};
    ASSERT_OK(cw_tensor_desc_make(&yd[0], CW_F32, 4, pdims));
    ASSERT_OK_CTX(ctx, cw_conv_output_desc(ctx, &yd[1], &yd[0], &w2d, &cp));
    double *ref1 = malloc((size_t)cw_tensor_desc_numel(&yd[1]) * sizeof *ref1);
    cw_ref_conv(&yd[0], pf, &w2d, w2, b, &cp, &yd[1], ref1);

    cw_graph *g;
    ASSERT_OK_CTX(ctx, cw_graph_create(&g, ctx));
    cw_node in, h, y0, y1;
    ASSERT_OK_CTX(ctx, cw_graph_input(g, &in, "x", &xd));
    ASSERT_OK_CTX(ctx, cw_graph_conv(g, &h, in, constant(ctx, g, tw1), constant(ctx, g, tb), &cp));
    ASSERT_OK_CTX(ctx, cw_graph_avg_pool2(g, &y0, h));
    ASSERT_OK_CTX(ctx, cw_graph_conv(g, &y1, y0, constant(ctx, g, tw2), constant(ctx, g, tb), &cp));
    ASSERT_OK_CTX(ctx, cw_graph_output(g, y0, "pooled"));
    ASSERT_OK_CTX(ctx, cw_graph_output(g, y1, "conv"));
    double *refs[2] = {ref0, ref1};
    /* conv1 in float (C*9 products, relative to its magnitude) then 3 additions and an exact
     * quarter; conv2 adds K*9 products of slightly perturbed inputs */
    const double bound[2] = {8.0 * (C * 9 + 3) * FLT_EPSILON, 8.0 * (C * 9 + K * 9 + 3) * FLT_EPSILON};
    run_and_check(ctx, g, CW_PATCHES_NONE, tx, 2, yd, refs, bound);
    run_and_check(ctx, g, CW_PATCHES_FIXED, tx, 2, yd, refs, bound);
    cw_graph_destroy(g);
    cw_tensor_destroy(tx), cw_tensor_destroy(tw1), cw_tensor_destroy(tw2), cw_tensor_destroy(tb);
    free(x), free(w1), free(w2), free(b), free(c1), free(ref0), free(pf), free(ref1);
}

/* 5-D in graphs of dtype dt: y0 = avg_pool2(x) (per D slice), y1 = silu(group_norm(y0)),
 * the statistics taken from the pool's task. The reference starts from x as stored in dt. */
static void test_pool_gn_3d(cw_context *ctx, cw_rng *r, cw_dtype dt) {
    enum { C = 6, G = 3, D = 3, H = 8, W = 6 };
    const int64_t xdims[5] = {1, C, D, H, W}, ydims[5] = {1, C, D, H / 2, W / 2}, cdim = C;
    const int64_t nx = C * D * H * W, per = D * (H / 2) * (W / 2), ny = C * per, cg = C / G;
    float *x = rnd(r, nx, 1.0f, 0.5f), *gm = rnd(r, C, 0.2f, 1.0f), *bt = rnd(r, C, 0.2f, 0.0f);
    round_to(x, nx, dt);
    cw_tensor *tx = upload(ctx, dt, 5, xdims, x), *tg = upload(ctx, CW_F32, 1, &cdim, gm);
    cw_tensor *tb = upload(ctx, CW_F32, 1, &cdim, bt);
    double *xr = malloc((size_t)nx * sizeof *xr), *ref0 = malloc((size_t)ny * sizeof *ref0);
    double *ref1 = malloc((size_t)ny * sizeof *ref1);
    for (int64_t i = 0; i < nx; i++) xr[i] = x[i];
    ref_pool(xr, C * D, H, W, ref0);
    for (int64_t gi = 0; gi < G; gi++) {
        double m = 0, q = 0;
        const int64_t e0 = gi * cg * per, e1 = (gi + 1) * cg * per;
        for (int64_t e = e0; e < e1; e++) m += ref0[e];
        m /= (double)(e1 - e0);
        for (int64_t e = e0; e < e1; e++) q += (ref0[e] - m) * (ref0[e] - m);
        const double rs = 1.0 / sqrt(q / (double)(e1 - e0) + 1e-6);
        for (int64_t e = e0; e < e1; e++) {
            const int64_t c = e / per;
            const double v = (ref0[e] - m) * rs * gm[c] + bt[c];
            ref1[e] = v / (1.0 + exp(-v));
        }
    }
    cw_tensor_desc xd, yd[2];
    ASSERT_OK(cw_tensor_desc_make(&xd, dt, 5, xdims));
    ASSERT_OK(cw_tensor_desc_make(&yd[0], dt, 5, ydims));
    yd[1] = yd[0];
    cw_graph *g;
    ASSERT_OK_CTX(ctx, cw_graph_create(&g, ctx));
    cw_node in, y0, y1;
    ASSERT_OK_CTX(ctx, cw_graph_input(g, &in, "x", &xd));
    ASSERT_OK_CTX(ctx, cw_graph_avg_pool2(g, &y0, in));
    ASSERT_OK_CTX(ctx, cw_graph_group_norm(g, &y1, y0, constant(ctx, g, tg), constant(ctx, g, tb), G, 1e-6f));
    ASSERT_OK_CTX(ctx, cw_graph_silu(g, &y1, y1));
    ASSERT_OK_CTX(ctx, cw_graph_output(g, y0, "pooled"));
    ASSERT_OK_CTX(ctx, cw_graph_output(g, y1, "y"));
    /* the pool in f32 is a few ulps; the stored result rounds once more to dt's unit
     * roundoff (2^-11 f16, 2^-8 bf16), and the normalised output inherits about 4 of those
     * (the pooled values round before the GroupNorm reads them) */
    const double u = dt == CW_F16 ? ldexp(1.0, -11) : dt == CW_BF16 ? ldexp(1.0, -8) : FLT_EPSILON / 2;
    const double bound[2] = {u + 8.0 * FLT_EPSILON, 8.0 * u + 64.0 * FLT_EPSILON};
    double *refs[2] = {ref0, ref1};
    run_and_check(ctx, g, CW_PATCHES_NONE, tx, 2, yd, refs, bound);
    run_and_check(ctx, g, CW_PATCHES_FIXED, tx, 2, yd, refs, bound);
    cw_graph_destroy(g);
    cw_tensor_destroy(tx), cw_tensor_destroy(tg), cw_tensor_destroy(tb);
    free(x), free(xr), free(gm), free(bt), free(ref0), free(ref1);
}

static void test_badargs(cw_context *ctx) {
    const int64_t odd_h[4] = {1, 2, 5, 4}, odd_w[4] = {1, 2, 4, 3}, flat[2] = {2, 8};
    cw_tensor_desc dh, dw, df;
    ASSERT_OK(cw_tensor_desc_make(&dh, CW_F32, 4, odd_h));
    ASSERT_OK(cw_tensor_desc_make(&dw, CW_F32, 4, odd_w));
    ASSERT_OK(cw_tensor_desc_make(&df, CW_F32, 2, flat));
    cw_graph *g;
    ASSERT_OK_CTX(ctx, cw_graph_create(&g, ctx));
    cw_node a, b, c, out;
    ASSERT_OK_CTX(ctx, cw_graph_input(g, &a, "a", &dh));
    ASSERT_OK_CTX(ctx, cw_graph_input(g, &b, "b", &dw));
    ASSERT_OK_CTX(ctx, cw_graph_input(g, &c, "c", &df));
    ASSERT_STATUS(cw_graph_avg_pool2(g, &out, a), CW_ERR_INVALID_ARG);
    CHECK(out == CW_NODE_NONE);
    CHECK(strstr(cw_context_get_last_error(ctx), "cw_graph_avg_pool2: x [1, 2, 5, 4] must have even H and W") != NULL);
    ASSERT_STATUS(cw_graph_avg_pool2(g, &out, b), CW_ERR_INVALID_ARG);
    ASSERT_STATUS(cw_graph_avg_pool2(g, &out, c), CW_ERR_INVALID_ARG); /* rank 2 */
    CHECK(strstr(cw_context_get_last_error(ctx), "cw_graph_avg_pool2: x must be [N, C, H, W]") != NULL);
    ASSERT_STATUS(cw_graph_avg_pool2(g, &out, 99), CW_ERR_INVALID_ARG); /* not a node */
    ASSERT_STATUS(cw_graph_avg_pool2(g, NULL, a), CW_ERR_INVALID_ARG);
    ASSERT_STATUS(cw_graph_avg_pool2(NULL, &out, a), CW_ERR_INVALID_ARG);
    cw_graph_destroy(g);
}

/* The op's contract in front of the backends: each violation refused with the name of what
 * is wrong, and a valid call runs (the cpu backend's loop against the reference). */
static void test_contract(void) {
    cw_context_config cfg = CW_CONTEXT_CONFIG_INIT;
    cw_context *ctx;
    ASSERT_OK(cw_context_create(&ctx, &cfg));
    cw__backend *be = NULL;
    ASSERT_OK(cw__backend_cpu_create(ctx, &cfg, &be));
    cw__stream *s = NULL;
    ASSERT_OK(be->rt->stream_create(be, &s));
    float x[2 * 4 * 6], y[2 * 2 * 3] = {0}, h16[4] = {0};
    for (int i = 0; i < 48; i++) x[i] = (float)(i * 7 % 11) - 3.0f;
    cw__op_args a;
    memset(&a, 0, sizeof a);
    a.code = CW_OP_AVG_POOL2;
    const int64_t xd[4] = {1, 2, 4, 6}, yd[4] = {1, 2, 2, 3};
    ASSERT_OK(cw_tensor_desc_make(&a.in[0].d, CW_F32, 4, xd));
    ASSERT_OK(cw_tensor_desc_make(&a.out.d, CW_F32, 4, yd));
    a.in[0].data = x, a.out.data = y;
    ASSERT_OK(cw__op_run(be, s, &a));
    ASSERT_OK(be->rt->stream_synchronize(be, s));
    double xr[48], ref[12];
    for (int i = 0; i < 48; i++) xr[i] = x[i];
    ref_pool(xr, 2, 4, 6, ref);
    for (int i = 0; i < 12; i++) CHECK(y[i] == (float)ref[i]); /* quarter-sums of small integers: exact */

    cw__op_args bad = a;
    bad.code = 77;
    ASSERT_STATUS(cw__op_run(be, s, &bad), CW_ERR_INVALID_ARG);
    CHECK(strstr(cw_context_get_last_error(ctx), "op: code 77 is not a CW_OP_* code") != NULL);
    bad = a;
    bad.out.d.dims[3] = 4;
    ASSERT_STATUS(cw__op_run(be, s, &bad), CW_ERR_INVALID_ARG);
    CHECK(strstr(cw_context_get_last_error(ctx), "avg_pool2: out is [1, 2, 2, 4], the op makes [1, 2, 2, 3] of in[0]") !=
          NULL);
    bad = a;
    bad.in[0].d.dims[2] = 3;
    ASSERT_STATUS(cw__op_run(be, s, &bad), CW_ERR_INVALID_ARG);
    CHECK(strstr(cw_context_get_last_error(ctx), "avg_pool2: in[0] [1, 2, 3, 6] and the parameters are outside") != NULL);
    bad = a;
    bad.in[0].d.dtype = CW_F16, bad.in[0].data = h16;
    ASSERT_STATUS(cw__op_run(be, s, &bad), CW_ERR_INVALID_ARG);
    CHECK(strstr(cw_context_get_last_error(ctx), "avg_pool2: in[0] is f16, expected f32") != NULL);
    bad = a;
    bad.in[0].data = NULL;
    ASSERT_STATUS(cw__op_run(be, s, &bad), CW_ERR_INVALID_ARG);
    CHECK(strstr(cw_context_get_last_error(ctx), "avg_pool2: in[0]") != NULL);
    bad = a; /* a per-channel op whose code is out of range, and one whose v is not f32 */
    bad.code = CW_OP_CHANNEL;
    bad.out.d = a.in[0].d, bad.out.data = x;
    const int64_t cdim = 2;
    ASSERT_OK(cw_tensor_desc_make(&bad.in[1].d, CW_F32, 1, &cdim));
    bad.in[1].data = h16;
    bad.param.i[0] = CW_CHANNEL_OP_COUNT;
    ASSERT_STATUS(cw__op_run(be, s, &bad), CW_ERR_INVALID_ARG);
    CHECK(strstr(cw_context_get_last_error(ctx), "channel: in[0] [1, 2, 4, 6] and the parameters are outside") != NULL);
    bad.param.i[0] = CW_CHANNEL_SCALE, bad.in[1].d.dtype = CW_BF16;
    ASSERT_STATUS(cw__op_run(be, s, &bad), CW_ERR_INVALID_ARG);
    CHECK(strstr(cw_context_get_last_error(ctx), "channel: in[1] is bf16, expected f32") != NULL);
    ASSERT_STATUS(cw__op_run(be, s, NULL), CW_ERR_INVALID_ARG);
    be->rt->stream_destroy(be, s);
    be->rt->destroy(be);
    cw_context_destroy(ctx);
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
