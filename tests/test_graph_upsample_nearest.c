/* cw_graph_upsample_nearest (integer factors per D, H, W) against a double-precision
 * reference: between two convs, 2-D (factors (1, 2, 2) and (1, 3, 1)) and 3-D (the video
 * VAEs' (1, 2, 2), (2, 2, 2), (2, 1, 1)), unscheduled and patched on 3 streams with chaos and
 * poison, in f32, f16 and bf16 graphs; the builder's argument checks; and the op's contract
 * through cw__op_run (the source element's bits, in each dtype). */
#include "graph_run.h"

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
    int64_t xdims[5] = {N, C}, y0dims[5] = {N, K};
    for (int k = 0; k < sp; k++) {
        const int j = 3 - sp + k; /* which of D, H, W */
        xdims[2 + k] = dhw[j], y0dims[2 + k] = dhw[j] * f[j];
    }
    sandwich s;
    sandwich_open(&s, ctx, r, dt, rank, xdims, K, 0.0f);
    double *ref0 = malloc((size_t)numel(rank, y0dims) * sizeof *ref0);
    ref_up(s.c1, N * K, dhw, f, ref0);
    cw_node y0;
    ASSERT_OK_CTX(ctx, cw_graph_upsample_nearest(s.g, &y0, s.h, f));
    /* the upsample copies conv1's stored values: conv1's float error (C*kvol products) and
     * its store (u); conv2 adds K*kvol products of those */
    const double u = unit_roundoff(dt);
    const int64_t kvol = s.kvol;
    const double bound[2] = {u + 16.0 * (double)(C * kvol + 4) * FLT_EPSILON,
                             16.0 * u + 16.0 * (double)((C + K) * kvol + 4) * FLT_EPSILON};
    char label[64];
    snprintf(label, sizeof label, "upsample_nearest (%d, %d, %d)", (int)f[0], (int)f[1], (int)f[2]);
    sandwich_close(&s, y0, y0dims, ref0, bound, label);
    free(ref0);
}

static void test_badargs(cw_context *ctx) {
    const int64_t xdims[4] = {1, 2, 4, 4}, x5dims[5] = {1, 2, 2, 4, 4}, flat[2] = {2, 8};
    cw_node x, out;
    cw_graph *g = graph_open(ctx, CW_F32, 4, xdims, &x);
    const cw_node x5 = input(ctx, g, "x5", CW_F32, 5, x5dims), m = input(ctx, g, "m", CW_F32, 2, flat);
    const int64_t f122[3] = {1, 2, 2}, f222[3] = {2, 2, 2}, f0[3] = {1, 0, 2}, f9[3] = {1, 2, 9}, fneg[3] = {-1, 1, 1};
    CHECK_REFUSED(ctx, cw_graph_upsample_nearest(g, &out, x, NULL), "cw_graph_upsample_nearest: factors is NULL");
    CHECK(out == CW_NODE_NONE);
    CHECK_REFUSED(ctx, cw_graph_upsample_nearest(g, &out, x, f0),
                  "cw_graph_upsample_nearest: factors[1] (H) = 0 must be in 1..8");
    CHECK_REFUSED(ctx, cw_graph_upsample_nearest(g, &out, x5, f9),
                  "cw_graph_upsample_nearest: factors[2] (W) = 9 must be in 1..8");
    CHECK_REFUSED(ctx, cw_graph_upsample_nearest(g, &out, x5, fneg),
                  "cw_graph_upsample_nearest: factors[0] (D) = -1 must be in 1..8");
    CHECK_REFUSED(ctx, cw_graph_upsample_nearest(g, &out, x, f222),
                  "cw_graph_upsample_nearest: factors[0] (D) = 2 must be 1 for a 4-D x [1, 2, 4, 4]");
    CHECK_REFUSED(ctx, cw_graph_upsample_nearest(g, &out, m, f122),
                  "cw_graph_upsample_nearest: x must be [N, C, H, W] or [N, C, D, H, W]");
    CHECK_REFUSED(ctx, cw_graph_upsample_nearest(g, &out, 99, f122),
                  "cw_graph_upsample_nearest: x = 99 is not a node of this graph");
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
    op_rig k;
    op_rig_open(&k);
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
            OP_RUN(&k, &a);
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
    OP_REFUSED(&k, &bad, "upsample_nearest: in[0] [1, 2, 2, 3, 5] and the parameters are outside");
    bad = a, bad.param.i[2] = 9;
    OP_REFUSED(&k, &bad, "upsample_nearest: in[0] [1, 2, 2, 3, 5] and the parameters are outside");
    bad = a, bad.out.d.dims[4] = 5;
    OP_REFUSED(&k, &bad, "upsample_nearest: out is [1, 2, 4, 9, 5], the op makes [1, 2, 4, 9, 10] of in[0]");
    bad = a, bad.in[0].d.dtype = CW_F16;
    OP_REFUSED(&k, &bad, "upsample_nearest: in[0] is f16, expected bf16");
    op_rig_close(&k);
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
