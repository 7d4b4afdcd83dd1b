/* cw_graph_upsample_nearest (integer factors per D, H, W) against a double-precision
 * reference: between two convs, 2-D (factors (1, 2, 2) and (1, 3, 1)) and 3-D (the video
 * VAEs' (1, 2, 2), (2, 2, 2), (2, 1, 1)), unscheduled and patched on 3 streams with chaos and
 * poison, in f32, f16 and bf16 graphs; the builder's argument checks; and the op's contract
 * through cw__op_run (the source element's bits, in each dtype). */
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

static void round_to(float *x, int64_t n, cw_dtype dt) {
    for (int64_t i = 0; i < n; i++)
        if (dt == CW_F16) x[i] = cw__f16_to_f32(cw__f32_to_f16(x[i]));
        else if (dt == CW_BF16) x[i] = cw__bf16_to_f32(cw__f32_to_bf16(x[i]));
}

static double unit(cw_dtype dt) { return dt == CW_F16 ? ldexp(1.0, -11) : dt == CW_BF16 ? ldexp(1.0, -8) : FLT_EPSILON / 2; }

/* ref = nearest upsampling of x [outer, D, H, W] by f (D, H, W), in double. */
static void ref_up(const double *x, int64_t outer, const int64_t dhw[3], const int64_t f[3], double *ref) {
    const int64_t D = dhw[0] * f[0], H = dhw[1] * f[1], W = dhw[2] * f[2];
    for (int64_t o = 0; o < outer; o++)
        for (int64_t z = 0; z < D; z++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t w = 0; w < W; w++)
                    ref[((o * D + z) * H + h) * W + w] =
                        x[((o * dhw[0] + z / f[0]) * dhw[1] + h / f[1]) * dhw[2] + w / f[2]];
}

/* y0 = upsample_nearest(conv1(x), f); y1 = conv2(y0) (3x3 or 3x3x3, padding 1) in a graph of
 * dtype dt, 4-D (rank 4, f[0] = 1) or 5-D. */
static void test_conv_up_conv(cw_context *ctx, cw_rng *r, cw_dtype dt, int rank, const int64_t f[3]) {
    enum { N = 2, C = 3, K = 4 };
    const int sp = rank - 2;
    const int64_t dhw[3] = {rank == 5 ? 3 : 1, 5, 4};
    int64_t xdims[5] = {N, C}, w1dims[5] = {K, C}, w2dims[5] = {K, K}, y0dims[5] = {N, K}, kdim = K;
    int64_t kvol = 1, nx = N * C;
    for (int k = 0; k < sp; k++) {
        const int j = 3 - sp + k; /* which of D, H, W */
        xdims[2 + k] = dhw[j], y0dims[2 + k] = dhw[j] * f[j];
        w1dims[2 + k] = w2dims[2 + k] = 3;
        kvol *= 3, nx *= dhw[j];
    }
    float *x = rnd(r, nx, 1.0f, 0.0f), *w1 = rnd(r, K * C * kvol, 0.3f, 0.0f), *w2 = rnd(r, K * K * kvol, 0.3f, 0.0f);
    float *bias = rnd(r, K, 0.1f, 0.0f);
    round_to(x, nx, dt), round_to(w1, K * C * kvol, dt), round_to(w2, K * K * kvol, dt), round_to(bias, K, dt);
    cw_tensor *tx = upload(ctx, dt, rank, xdims, x), *tw1 = upload(ctx, dt, rank, w1dims, w1);
    cw_tensor *tw2 = upload(ctx, dt, rank, w2dims, w2), *tb = upload(ctx, dt, 1, &kdim, bias);
    cw_conv_params cp = CW_CONV_PARAMS_INIT;
    cp.spatial = sp;
    for (int k = 0; k < sp; k++) cp.pad_pre[k] = cp.pad_post[k] = 1;

    cw_tensor_desc xd, w1d, w2d, c1d, y0d, y1d;
    ASSERT_OK(cw_tensor_desc_make(&xd, CW_F32, rank, xdims));
    ASSERT_OK(cw_tensor_desc_make(&w1d, CW_F32, rank, w1dims));
    ASSERT_OK(cw_tensor_desc_make(&w2d, CW_F32, rank, w2dims));
    ASSERT_OK(cw_tensor_desc_make(&y0d, CW_F32, rank, y0dims));
    ASSERT_OK_CTX(ctx, cw_conv_output_desc(ctx, &c1d, &xd, &w1d, &cp));
    ASSERT_OK_CTX(ctx, cw_conv_output_desc(ctx, &y1d, &y0d, &w2d, &cp));
    const int64_t n1 = cw_tensor_desc_numel(&c1d), n0 = cw_tensor_desc_numel(&y0d);
    double *c1 = malloc((size_t)n1 * sizeof *c1), *ref0 = malloc((size_t)n0 * sizeof *ref0);
    double *ref1 = malloc((size_t)n0 * sizeof *ref1);
    float *yf = malloc((size_t)n0 * 4);
    cw_ref_conv(&xd, x, &w1d, w1, bias, &cp, &c1d, c1);
    ref_up(c1, N * K, dhw, f, ref0);
    for (int64_t i = 0; i < n0; i++) yf[i] = (float)ref0[i];
    cw_ref_conv(&y0d, yf, &w2d, w2, bias, &cp, &y1d, ref1);

    cw_tensor_desc xdt, yd[2];
    ASSERT_OK(cw_tensor_desc_make(&xdt, dt, rank, xdims));
    ASSERT_OK(cw_tensor_desc_make(&yd[0], dt, rank, y0dims));
    ASSERT_OK(cw_tensor_desc_make(&yd[1], dt, rank, y1d.dims));
    cw_graph *g;
    ASSERT_OK_CTX(ctx, cw_graph_create(&g, ctx));
    cw_node in, h, y0, y1;
    ASSERT_OK_CTX(ctx, cw_graph_input(g, &in, "x", &xdt));
    ASSERT_OK_CTX(ctx, cw_graph_conv(g, &h, in, constant(ctx, g, tw1), constant(ctx, g, tb), &cp));
    ASSERT_OK_CTX(ctx, cw_graph_upsample_nearest(g, &y0, h, f));
    ASSERT_OK_CTX(ctx, cw_graph_conv(g, &y1, y0, constant(ctx, g, tw2), constant(ctx, g, tb), &cp));
    ASSERT_OK_CTX(ctx, cw_graph_output(g, y0, "up"));
    ASSERT_OK_CTX(ctx, cw_graph_output(g, y1, "conv"));
    cw_tensor_desc got;
    ASSERT_OK_CTX(ctx, cw_graph_get_node_desc(g, &got, y0));
    CHECK(got.rank == rank && memcmp(got.dims, y0dims, (size_t)rank * sizeof y0dims[0]) == 0 && got.dtype == dt);
    /* the upsample copies conv1's stored values: conv1's float error (C*kvol products) and
     * its store (u); conv2 adds K*kvol products of those */
    const double u = unit(dt);
    const double bound[2] = {u + 16.0 * (double)(C * kvol + 4) * FLT_EPSILON,
                             16.0 * u + 16.0 * (double)((C + K) * kvol + 4) * FLT_EPSILON};
    double *refs[2] = {ref0, ref1};
    fprintf(stderr, "conv -> upsample_nearest (%d, %d, %d) -> conv, %d-D, %s\n", (int)f[0], (int)f[1], (int)f[2], rank,
            cw__dtype_name(dt));
    run_and_check(ctx, g, CW_PATCHES_NONE, tx, 2, yd, refs, bound);
    run_and_check(ctx, g, CW_PATCHES_FIXED, tx, 2, yd, refs, bound);
    cw_graph_destroy(g);
    cw_tensor_destroy(tx), cw_tensor_destroy(tw1), cw_tensor_destroy(tw2), cw_tensor_destroy(tb);
    free(x), free(w1), free(w2), free(bias), free(c1), free(ref0), free(ref1), free(yf);
}

static void test_badargs(cw_context *ctx) {
    const int64_t xdims[4] = {1, 2, 4, 4}, x5dims[5] = {1, 2, 2, 4, 4}, flat[2] = {2, 8};
    cw_tensor_desc xd, x5d, fd;
    ASSERT_OK(cw_tensor_desc_make(&xd, CW_F32, 4, xdims));
    ASSERT_OK(cw_tensor_desc_make(&x5d, CW_F32, 5, x5dims));
    ASSERT_OK(cw_tensor_desc_make(&fd, CW_F32, 2, flat));
    cw_graph *g;
    ASSERT_OK_CTX(ctx, cw_graph_create(&g, ctx));
    cw_node x, x5, m, out;
    ASSERT_OK_CTX(ctx, cw_graph_input(g, &x, "x", &xd));
    ASSERT_OK_CTX(ctx, cw_graph_input(g, &x5, "x5", &x5d));
    ASSERT_OK_CTX(ctx, cw_graph_input(g, &m, "m", &fd));
    const int64_t f122[3] = {1, 2, 2}, f222[3] = {2, 2, 2}, f0[3] = {1, 0, 2}, f9[3] = {1, 2, 9}, fneg[3] = {-1, 1, 1};
    ASSERT_STATUS(cw_graph_upsample_nearest(g, &out, x, NULL), CW_ERR_INVALID_ARG);
    CHECK(out == CW_NODE_NONE);
    CHECK(strstr(cw_context_get_last_error(ctx), "cw_graph_upsample_nearest: factors is NULL") != NULL);
    ASSERT_STATUS(cw_graph_upsample_nearest(g, &out, x, f0), CW_ERR_INVALID_ARG);
    CHECK(strstr(cw_context_get_last_error(ctx), "cw_graph_upsample_nearest: factors[1] (H) = 0 must be in 1..8") != NULL);
    ASSERT_STATUS(cw_graph_upsample_nearest(g, &out, x5, f9), CW_ERR_INVALID_ARG);
    CHECK(strstr(cw_context_get_last_error(ctx), "cw_graph_upsample_nearest: factors[2] (W) = 9 must be in 1..8") != NULL);
    ASSERT_STATUS(cw_graph_upsample_nearest(g, &out, x5, fneg), CW_ERR_INVALID_ARG);
    CHECK(strstr(cw_context_get_last_error(ctx), "cw_graph_upsample_nearest: factors[0] (D) = -1 must be in 1..8") != NULL);
    ASSERT_STATUS(cw_graph_upsample_nearest(g, &out, x, f222), CW_ERR_INVALID_ARG);
    CHECK(strstr(cw_context_get_last_error(ctx),
                 "cw_graph_upsample_nearest: factors[0] (D) = 2 must be 1 for a 4-D x [1, 2, 4, 4]") != NULL);
    ASSERT_STATUS(cw_graph_upsample_nearest(g, &out, m, f122), CW_ERR_INVALID_ARG);
    CHECK(strstr(cw_context_get_last_error(ctx), "cw_graph_upsample_nearest: x must be [N, C, H, W] or [N, C, D, H, W]") !=
          NULL);
    ASSERT_STATUS(cw_graph_upsample_nearest(g, &out, 99, f122), CW_ERR_INVALID_ARG);
    CHECK(strstr(cw_context_get_last_error(ctx), "cw_graph_upsample_nearest: x = 99 is not a node of this graph") != NULL);
    ASSERT_STATUS(cw_graph_upsample_nearest(g, NULL, x, f122), CW_ERR_INVALID_ARG);
    ASSERT_STATUS(cw_graph_upsample_nearest(NULL, &out, x, f122), CW_ERR_INVALID_ARG);
    ASSERT_OK_CTX(ctx, cw_graph_upsample_nearest(g, &out, x5, f222));
    cw_tensor_desc d;
    ASSERT_OK_CTX(ctx, cw_graph_get_node_desc(g, &d, out));
    CHECK(d.rank == 5 && d.dims[1] == 2 && d.dims[2] == 4 && d.dims[3] == 8 && d.dims[4] == 8);
    cw_graph_destroy(g);
}

/* The contract through cw__op_run: in each dtype the output holds the source element's bits
 * (a NaN's payload included), 4-D and 5-D; each violation refused by name. */
static void test_contract(void) {
    cw_context_config cfg = CW_CONTEXT_CONFIG_INIT;
    cw_context *ctx;
    ASSERT_OK(cw_context_create(&ctx, &cfg));
    cw__backend *be = NULL;
    ASSERT_OK(cw__backend_cpu_create(ctx, &cfg, &be));
    cw__stream *s = NULL;
    ASSERT_OK(be->rt->stream_create(be, &s));
    enum { NX = 2 * 2 * 3 * 5, NY = NX * 2 * 3 * 2 };
    uint32_t x[NX], y[NY];
    for (int i = 0; i < NX; i++) x[i] = 0x7fc00001u + 0x00010203u * (uint32_t)i; /* distinct, some NaN payloads */
    const cw_dtype dts[3] = {CW_F32, CW_F16, CW_BF16};
    const int64_t x5[5] = {1, 2, 2, 3, 5}, y5[5] = {1, 2, 4, 9, 10}, x4[4] = {2, 2, 3, 5}, y4[4] = {2, 2, 9, 10};
    cw__op_args a;
    for (int d = 0; d < 3; d++)
        for (int rank = 4; rank <= 5; rank++) {
            memset(&a, 0, sizeof a);
            memset(y, 0, sizeof y);
            a.code = CW_OP_UPSAMPLE_NEAREST;
            a.param.i[0] = rank == 5 ? 2 : 1, a.param.i[1] = 3, a.param.i[2] = 2;
            ASSERT_OK(cw_tensor_desc_make(&a.in[0].d, dts[d], rank, rank == 5 ? x5 : x4));
            ASSERT_OK(cw_tensor_desc_make(&a.out.d, dts[d], rank, rank == 5 ? y5 : y4));
            a.in[0].data = x, a.out.data = y;
            ASSERT_OK(cw__op_run(be, s, &a));
            ASSERT_OK(be->rt->stream_synchronize(be, s));
            const int64_t dhw[3] = {rank == 5 ? 2 : 1, 3, 5}, f[3] = {a.param.i[0], 3, 2};
            const int64_t outer = 4 / dhw[0], ny = cw_tensor_desc_numel(&a.out.d);
            int bad_bits = 0;
            for (int64_t o = 0; o < outer; o++)
                for (int64_t z = 0; z < dhw[0] * f[0]; z++)
                    for (int64_t h = 0; h < 9; h++)
                        for (int64_t w = 0; w < 10; w++) {
                            const int64_t oi = ((o * dhw[0] * f[0] + z) * 9 + h) * 10 + w;
                            const int64_t xi = ((o * dhw[0] + z / f[0]) * 3 + h / 3) * 5 + w / 2;
                            if (dts[d] == CW_F32) bad_bits += y[oi] != x[xi];
                            else bad_bits += ((const uint16_t *)y)[oi] != ((const uint16_t *)x)[xi];
                        }
            CHECK(bad_bits == 0 && ny == outer * dhw[0] * f[0] * 90);
        }
    cw__op_args bad = a; /* the last: 5-D bf16, factors (2, 3, 2) */
    bad.param.i[1] = 0;
    ASSERT_STATUS(cw__op_run(be, s, &bad), CW_ERR_INVALID_ARG);
    CHECK(strstr(cw_context_get_last_error(ctx), "upsample_nearest: in[0] [1, 2, 2, 3, 5] and the parameters are outside") !=
          NULL);
    bad = a;
    bad.param.i[2] = 9;
    ASSERT_STATUS(cw__op_run(be, s, &bad), CW_ERR_INVALID_ARG);
    CHECK(strstr(cw_context_get_last_error(ctx), "upsample_nearest: in[0] [1, 2, 2, 3, 5] and the parameters are outside") !=
          NULL);
    bad = a;
    bad.out.d.dims[4] = 5;
    ASSERT_STATUS(cw__op_run(be, s, &bad), CW_ERR_INVALID_ARG);
    CHECK(strstr(cw_context_get_last_error(ctx),
                 "upsample_nearest: out is [1, 2, 4, 9, 5], the op makes [1, 2, 4, 9, 10] of in[0]") != NULL);
    bad = a;
    bad.in[0].d.dtype = CW_F16;
    ASSERT_STATUS(cw__op_run(be, s, &bad), CW_ERR_INVALID_ARG);
    CHECK(strstr(cw_context_get_last_error(ctx), "upsample_nearest: in[0] is f16, expected bf16") != NULL);
    be->rt->stream_destroy(be, s);
    be->rt->destroy(be);
    cw_context_destroy(ctx);
}

int main(void) {
    cw_rng r = {cw_test_seed(16)};
    cw_context *ctx = chaos_context();
    const cw_dtype dts[3] = {CW_F32, CW_F16, CW_BF16};
    const int64_t f2d[2][3] = {{1, 2, 2}, {1, 3, 1}}, f3d[3][3] = {{1, 2, 2}, {2, 2, 2}, {2, 1, 1}};
    for (int d = 0; d < 3; d++) {
        for (int k = 0; k < 2; k++) test_conv_up_conv(ctx, &r, dts[d], 4, f2d[k]);
        for (int k = 0; k < 3; k++) test_conv_up_conv(ctx, &r, dts[d], 5, f3d[k]);
    }
    test_badargs(ctx);
    cw_context_destroy(ctx);
    test_contract();
    TEST_DONE();
}
