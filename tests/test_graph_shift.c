/* cw_graph_shift, y = x + v[c] (the per-channel family's second member), against a
 * double-precision reference: between two 3x3 convs (4-D, unscheduled and patched on 3
 * streams with chaos and poison) and in front of a GroupNorm + SiLU (5-D: its task emits the
 * statistics), in f32, f16 and bf16 graphs; the builder's argument checks; and the op's
 * contract through cw__op_run. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "conv_ref.h"
#include "convweave/convweave.h"
#include "core/half.h"
#include "graph_run.h"
#include "kernels/kernels.h"
#include "testutil.h"

enum { N = 2, C = 5, H = 9, W = 6, K = 4 };

static void round_to(float *x, int64_t n, cw_dtype dt) {
    for (int64_t i = 0; i < n; i++)
        if (dt == CW_F16) x[i] = cw__f16_to_f32(cw__f32_to_f16(x[i]));
        else if (dt == CW_BF16) x[i] = cw__bf16_to_f32(cw__f32_to_bf16(x[i]));
}

static double unit(cw_dtype dt) { return dt == CW_F16 ? ldexp(1.0, -11) : dt == CW_BF16 ? ldexp(1.0, -8) : FLT_EPSILON / 2; }

/* y0 = shift(conv1(x), v); y1 = conv2(y0) (3x3, padding 1) in a graph of dtype dt; v f32. */
static void test_conv_shift_conv(cw_context *ctx, cw_rng *r, cw_dtype dt) {
    const int64_t xdims[4] = {N, C, H, W}, w1dims[4] = {K, C, 3, 3}, w2dims[4] = {K, K, 3, 3}, kdim = K;
    const int64_t nx = N * C * H * W;
    float *x = rnd(r, nx, 1.0f, 0.0f), *w1 = rnd(r, K * C * 9, 0.3f, 0.0f), *w2 = rnd(r, K * K * 9, 0.3f, 0.0f);
    float *bias = rnd(r, K, 0.1f, 0.0f), *v = rnd(r, K, 1.0f, 0.0f);
    round_to(x, nx, dt), round_to(w1, K * C * 9, dt), round_to(w2, K * K * 9, dt), round_to(bias, K, dt);
    cw_tensor *tx = upload(ctx, dt, 4, xdims, x), *tw1 = upload(ctx, dt, 4, w1dims, w1);
    cw_tensor *tw2 = upload(ctx, dt, 4, w2dims, w2), *tb = upload(ctx, dt, 1, &kdim, bias);
    cw_tensor *tv = upload(ctx, CW_F32, 1, &kdim, v);
    cw_conv_params cp = CW_CONV_PARAMS_INIT;
    cp.pad_pre[0] = cp.pad_post[0] = cp.pad_pre[1] = cp.pad_post[1] = 1;

    cw_tensor_desc xd, w1d, w2d, c1d, y1d;
    ASSERT_OK(cw_tensor_desc_make(&xd, CW_F32, 4, xdims));
    ASSERT_OK(cw_tensor_desc_make(&w1d, CW_F32, 4, w1dims));
    ASSERT_OK(cw_tensor_desc_make(&w2d, CW_F32, 4, w2dims));
    ASSERT_OK_CTX(ctx, cw_conv_output_desc(ctx, &c1d, &xd, &w1d, &cp));
    ASSERT_OK_CTX(ctx, cw_conv_output_desc(ctx, &y1d, &c1d, &w2d, &cp));
    const int64_t n1 = cw_tensor_desc_numel(&c1d), per = H * W;
    double *c1 = malloc((size_t)n1 * sizeof *c1), *ref0 = malloc((size_t)n1 * sizeof *ref0);
    double *ref1 = malloc((size_t)n1 * sizeof *ref1);
    float *yf = malloc((size_t)n1 * 4);
    cw_ref_conv(&xd, x, &w1d, w1, bias, &cp, &c1d, c1);
    for (int64_t i = 0; i < n1; i++) ref0[i] = c1[i] + v[(i / per) % K], yf[i] = (float)ref0[i];
    cw_ref_conv(&c1d, yf, &w2d, w2, bias, &cp, &y1d, ref1);

    cw_tensor_desc xdt, yd[2];
    ASSERT_OK(cw_tensor_desc_make(&xdt, dt, 4, xdims));
    ASSERT_OK(cw_tensor_desc_make(&yd[0], dt, 4, c1d.dims));
    ASSERT_OK(cw_tensor_desc_make(&yd[1], dt, 4, y1d.dims));
    cw_graph *g;
    ASSERT_OK_CTX(ctx, cw_graph_create(&g, ctx));
    cw_node in, h, y0, y1;
    ASSERT_OK_CTX(ctx, cw_graph_input(g, &in, "x", &xdt));
    ASSERT_OK_CTX(ctx, cw_graph_conv(g, &h, in, constant(ctx, g, tw1), constant(ctx, g, tb), &cp));
    ASSERT_OK_CTX(ctx, cw_graph_shift(g, &y0, h, constant(ctx, g, tv)));
    ASSERT_OK_CTX(ctx, cw_graph_conv(g, &y1, y0, constant(ctx, g, tw2), constant(ctx, g, tb), &cp));
    ASSERT_OK_CTX(ctx, cw_graph_output(g, y0, "shifted"));
    ASSERT_OK_CTX(ctx, cw_graph_output(g, y1, "conv"));
    /* conv1 in float (C*9 products) stored in dt (u), the sum and its store (u); conv2 adds
     * K*9 products of those */
    const double u = unit(dt);
    const double bound[2] = {4.0 * u + 16.0 * (C * 9 + 4) * FLT_EPSILON,
                             16.0 * u + 16.0 * (C * 9 + K * 9 + 4) * FLT_EPSILON};
    double *refs[2] = {ref0, ref1};
    run_and_check(ctx, g, CW_PATCHES_NONE, tx, 2, yd, refs, bound);
    run_and_check(ctx, g, CW_PATCHES_FIXED, tx, 2, yd, refs, bound);
    cw_graph_destroy(g);
    cw_tensor_destroy(tx), cw_tensor_destroy(tw1), cw_tensor_destroy(tw2), cw_tensor_destroy(tb);
    cw_tensor_destroy(tv);
    free(x), free(w1), free(w2), free(bias), free(v), free(c1), free(ref0), free(ref1), free(yf);
}

/* 5-D in dtype dt: y0 = shift(x, v), y1 = silu(group_norm(y0)), the statistics taken from
 * the shift's task. The reference starts from x as stored in dt. */
static void test_shift_gn_3d(cw_context *ctx, cw_rng *r, cw_dtype dt) {
    enum { D = 3, C5 = 6, G5 = 3, H5 = 7, W5 = 4 };
    const int64_t xdims[5] = {1, C5, D, H5, W5}, cdim = C5;
    const int64_t per = D * H5 * W5, nx = C5 * per, cg = C5 / G5;
    float *x = rnd(r, nx, 1.0f, 0.5f), *v = rnd(r, C5, 2.0f, 0.0f), *gm = rnd(r, C5, 0.2f, 1.0f);
    float *bt = rnd(r, C5, 0.2f, 0.0f);
    round_to(x, nx, dt);
    cw_tensor *tx = upload(ctx, dt, 5, xdims, x), *tv = upload(ctx, CW_F32, 1, &cdim, v);
    cw_tensor *tg = upload(ctx, CW_F32, 1, &cdim, gm), *tb = upload(ctx, CW_F32, 1, &cdim, bt);
    double *ref0 = malloc((size_t)nx * sizeof *ref0), *ref1 = malloc((size_t)nx * sizeof *ref1);
    for (int64_t i = 0; i < nx; i++) ref0[i] = (double)x[i] + v[i / per];
    for (int64_t gi = 0; gi < G5; gi++) {
        double m = 0, q = 0;
        const int64_t e0 = gi * cg * per, e1 = (gi + 1) * cg * per;
        for (int64_t e = e0; e < e1; e++) m += ref0[e];
        m /= (double)(e1 - e0);
        for (int64_t e = e0; e < e1; e++) q += (ref0[e] - m) * (ref0[e] - m);
        const double rs = 1.0 / sqrt(q / (double)(e1 - e0) + 1e-6);
        for (int64_t e = e0; e < e1; e++) {
            const double t = (ref0[e] - m) * rs * gm[e / per] + bt[e / per];
            ref1[e] = t / (1.0 + exp(-t));
        }
    }
    cw_tensor_desc yd[2];
    ASSERT_OK(cw_tensor_desc_make(&yd[0], dt, 5, xdims));
    yd[1] = yd[0];
    cw_graph *g;
    ASSERT_OK_CTX(ctx, cw_graph_create(&g, ctx));
    cw_node in, y0, y1;
    ASSERT_OK_CTX(ctx, cw_graph_input(g, &in, "x", &yd[0]));
    ASSERT_OK_CTX(ctx, cw_graph_shift(g, &y0, in, constant(ctx, g, tv)));
    ASSERT_OK_CTX(ctx, cw_graph_group_norm(g, &y1, y0, constant(ctx, g, tg), constant(ctx, g, tb), G5, 1e-6f));
    ASSERT_OK_CTX(ctx, cw_graph_silu(g, &y1, y1));
    ASSERT_OK_CTX(ctx, cw_graph_output(g, y0, "shifted"));
    ASSERT_OK_CTX(ctx, cw_graph_output(g, y1, "y"));
    /* the sum rounds once (u); the normalised output inherits several of those (the shifted
     * values round before the GroupNorm reads them) and its own f32 math */
    const double u = unit(dt);
    const double bound[2] = {u + 4.0 * FLT_EPSILON, 8.0 * u + 64.0 * FLT_EPSILON};
    double *refs[2] = {ref0, ref1};
    run_and_check(ctx, g, CW_PATCHES_NONE, tx, 2, yd, refs, bound);
    run_and_check(ctx, g, CW_PATCHES_FIXED, tx, 2, yd, refs, bound);
    cw_graph_destroy(g);
    cw_tensor_destroy(tx), cw_tensor_destroy(tv), cw_tensor_destroy(tg), cw_tensor_destroy(tb);
    free(x), free(v), free(gm), free(bt), free(ref0), free(ref1);
}

static void test_badargs(cw_context *ctx) {
    const int64_t xdims[4] = {1, C, 4, 4}, vdims[1] = {C + 1}, cdim = C, mdims[2] = {C, C};
    cw_tensor_desc xd, md;
    ASSERT_OK(cw_tensor_desc_make(&xd, CW_F32, 4, xdims));
    ASSERT_OK(cw_tensor_desc_make(&md, CW_F32, 2, mdims));
    cw_tensor *bad = upload(ctx, CW_F32, 1, vdims, NULL), *good = upload(ctx, CW_F32, 1, &cdim, NULL);
    cw_tensor *half = upload(ctx, CW_F16, 1, &cdim, NULL);
    cw_graph *g;
    ASSERT_OK_CTX(ctx, cw_graph_create(&g, ctx));
    cw_node x, m, out, vb, vg, vh;
    ASSERT_OK_CTX(ctx, cw_graph_input(g, &x, "x", &xd));
    ASSERT_OK_CTX(ctx, cw_graph_input(g, &m, "m", &md));
    vb = constant(ctx, g, bad);
    vg = constant(ctx, g, good);
    vh = constant(ctx, g, half);
    ASSERT_STATUS(cw_graph_shift(g, &out, x, vb), CW_ERR_INVALID_ARG);
    CHECK(out == CW_NODE_NONE);
    CHECK(strstr(cw_context_get_last_error(ctx),
                 "cw_graph_shift: v must be a contiguous f32 constant of dims [5] (f32 in graphs of every dtype), got "
                 "f32 [6]") != NULL);
    ASSERT_STATUS(cw_graph_shift(g, &out, x, vh), CW_ERR_INVALID_ARG);
    CHECK(strstr(cw_context_get_last_error(ctx), "cw_graph_shift: v must be a contiguous f32 constant") != NULL);
    ASSERT_STATUS(cw_graph_shift(g, &out, x, x), CW_ERR_INVALID_ARG); /* not a constant */
    CHECK(strstr(cw_context_get_last_error(ctx), "cw_graph_shift: v must be") != NULL);
    ASSERT_STATUS(cw_graph_shift(g, &out, m, vg), CW_ERR_INVALID_ARG); /* x of rank 2 */
    CHECK(strstr(cw_context_get_last_error(ctx), "cw_graph_shift: x must be [N, C, H, W]") != NULL);
    ASSERT_STATUS(cw_graph_shift(g, &out, x, 99), CW_ERR_INVALID_ARG); /* not a node */
    CHECK(strstr(cw_context_get_last_error(ctx), "cw_graph_shift: v = 99 is not a node of this graph") != NULL);
    ASSERT_STATUS(cw_graph_shift(g, NULL, x, vg), CW_ERR_INVALID_ARG);
    ASSERT_STATUS(cw_graph_shift(NULL, &out, x, vg), CW_ERR_INVALID_ARG);
    ASSERT_OK_CTX(ctx, cw_graph_shift(g, &out, x, vg));
    cw_graph_destroy(g);
    cw_tensor_destroy(bad), cw_tensor_destroy(good), cw_tensor_destroy(half);
}

/* The contract through cw__op_run: a valid shift (exact sums of small integers), an x
 * whose C is not v's, v in a half dtype. */
static void test_contract(void) {
    cw_context_config cfg = CW_CONTEXT_CONFIG_INIT;
    cw_context *ctx;
    ASSERT_OK(cw_context_create(&ctx, &cfg));
    cw__backend *be = NULL;
    ASSERT_OK(cw__backend_cpu_create(ctx, &cfg, &be));
    cw__stream *s = NULL;
    ASSERT_OK(be->rt->stream_create(be, &s));
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
    ASSERT_OK(cw__op_run(be, s, &a));
    ASSERT_OK(be->rt->stream_synchronize(be, s));
    for (int i = 0; i < 24; i++) CHECK(y[i] == x[i] + v[(i / 4) % 3]);
    cw__op_args bad = a;
    bad.in[1].d.dims[0] = 2;
    ASSERT_STATUS(cw__op_run(be, s, &bad), CW_ERR_INVALID_ARG);
    CHECK(strstr(cw_context_get_last_error(ctx), "channel: in[0] [2, 3, 2, 2] and the parameters are outside") != NULL);
    bad = a;
    bad.in[1].d.dtype = CW_F16;
    ASSERT_STATUS(cw__op_run(be, s, &bad), CW_ERR_INVALID_ARG);
    CHECK(strstr(cw_context_get_last_error(ctx), "channel: in[1] is f16, expected f32") != NULL);
    be->rt->stream_destroy(be, s);
    be->rt->destroy(be);
    cw_context_destroy(ctx);
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
