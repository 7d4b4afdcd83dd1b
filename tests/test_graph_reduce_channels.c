/* cw_graph_reduce_channels (sum, mean, L2 norm, mean square over C, keeping the dim) against
 * a double-precision reference: every op between patched 3x3 convs (4-D, unscheduled and
 * patched on 3 streams with chaos and poison) in f32, f16 and bf16 graphs; Wan's RMS norm
 * (F.normalize over channels: L2, clamp_min, a broadcast divide) between convs; every op on
 * 5-D inputs and on one channel, where the result is the double sum rounded once; the
 * builder's argument checks; and the op's contract through cw__op_run, bit for bit against
 * a sum in double in ascending c (so independent of threads), NaN and infinities. */
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

enum { N = 2, C = 3, K = 5, H = 10, W = 6 };

static const char *const op_names[] = {"sum", "mean", "l2", "mean_square"};




static int squares(int op) { return op == CW_REDUCE_L2 || op == CW_REDUCE_MEAN_SQUARE; }

/* The reduction over nc values x[k * stride] in double, as PyTorch defines it. *abs_sum
 * (may be NULL) gets the sum of the terms' magnitudes: the scale of the rounding errors
 * its inputs carry. */
static double ref_reduce(int op, const double *x, int64_t nc, int64_t stride, double *abs_sum) {
    double s = 0.0, a = 0.0;
    for (int64_t k = 0; k < nc; k++) {
        const double v = x[k * stride], t = squares(op) ? v * v : v;
        s += t, a += fabs(t);
    }
    if (abs_sum) *abs_sum = a;
    switch (op) {
    case CW_REDUCE_MEAN: return s / (double)nc;
    case CW_REDUCE_L2: return sqrt(s);
    case CW_REDUCE_MEAN_SQUARE: return s / (double)nc;
    default: return s;
    }
}

/* y0 = reduce(conv1(x)) [N, 1, H, W]; y1 = conv2(y0) (3x3, padding 1, 1 -> K channels) in a
 * graph of dtype dt: the reduction reads a patched conv's output and feeds another. The
 * reference computes in double from x and the weights as stored in dt. */
static void test_conv_reduce_conv(cw_context *ctx, cw_rng *r, cw_dtype dt, int op) {
    const int64_t xdims[4] = {N, C, H, W}, w1dims[4] = {K, C, 3, 3}, w2dims[4] = {K, 1, 3, 3}, kdim = K;
    const int64_t nx = N * C * H * W;
    float *x = rnd(r, nx, 1.0f, 0.0f), *w1 = rnd(r, K * C * 9, 0.3f, 0.0f), *w2 = rnd(r, K * 9, 0.3f, 0.0f);
    float *bias = rnd(r, K, 0.1f, 0.0f);
    round_to(x, nx, dt), round_to(w1, K * C * 9, dt), round_to(w2, K * 9, dt), round_to(bias, K, dt);
    cw_tensor *tx = upload(ctx, dt, 4, xdims, x), *tw1 = upload(ctx, dt, 4, w1dims, w1);
    cw_tensor *tw2 = upload(ctx, dt, 4, w2dims, w2), *tb = upload(ctx, dt, 1, &kdim, bias);
    cw_conv_params cp = CW_CONV_PARAMS_INIT;
    cp.pad_pre[0] = cp.pad_post[0] = cp.pad_pre[1] = cp.pad_post[1] = 1;

    cw_tensor_desc xd, w1d, w2d, cd, rd0, y1d;
    ASSERT_OK(cw_tensor_desc_make(&xd, CW_F32, 4, xdims));
    ASSERT_OK(cw_tensor_desc_make(&w1d, CW_F32, 4, w1dims));
    ASSERT_OK(cw_tensor_desc_make(&w2d, CW_F32, 4, w2dims));
    ASSERT_OK_CTX(ctx, cw_conv_output_desc(ctx, &cd, &xd, &w1d, &cp));
    const int64_t rdims[4] = {cd.dims[0], 1, cd.dims[2], cd.dims[3]};
    ASSERT_OK(cw_tensor_desc_make(&rd0, CW_F32, 4, rdims));
    ASSERT_OK_CTX(ctx, cw_conv_output_desc(ctx, &y1d, &rd0, &w2d, &cp));
    const int64_t nc = cw_tensor_desc_numel(&cd), hw = cd.dims[2] * cd.dims[3], n0 = N * hw;
    const int64_t n1 = cw_tensor_desc_numel(&y1d);
    double *c1 = malloc((size_t)nc * sizeof *c1), *ref0 = malloc((size_t)n0 * sizeof *ref0);
    double *ref1 = malloc((size_t)n1 * sizeof *ref1);
    float *yf = malloc((size_t)n0 * 4);
    cw_ref_conv(&xd, x, &w1d, w1, bias, &cp, &cd, c1);
    double amax = 0.0, rmax = 0.0; /* the largest term magnitude sum, the largest result */
    for (int64_t n = 0; n < N; n++)
        for (int64_t j = 0; j < hw; j++) {
            double a;
            const int64_t i = n * hw + j;
            ref0[i] = ref_reduce(op, c1 + n * K * hw + j, K, hw, &a);
            yf[i] = (float)ref0[i];
            amax = fmax(amax, op == CW_REDUCE_MEAN || op == CW_REDUCE_MEAN_SQUARE ? a / K : a);
            rmax = fmax(rmax, fabs(ref0[i]));
        }
    cw_ref_conv(&rd0, yf, &w2d, w2, bias, &cp, &y1d, ref1);

    cw_tensor_desc yd[2];
    ASSERT_OK(cw_tensor_desc_make(&yd[0], dt, 4, rd0.dims));
    ASSERT_OK(cw_tensor_desc_make(&yd[1], dt, 4, y1d.dims));
    cw_node in;
    cw_graph *g = graph_open(ctx, dt, 4, xdims, &in);
    cw_node h1, y0, y1, b = constant(ctx, g, tb);
    ASSERT_OK_CTX(ctx, cw_graph_conv(g, &h1, in, constant(ctx, g, tw1), b, &cp));
    ASSERT_OK_CTX(ctx, cw_graph_reduce_channels(g, &y0, h1, (cw_reduce_op)op));
    ASSERT_OK_CTX(ctx, cw_graph_conv(g, &y1, y0, constant(ctx, g, tw2), b, &cp));
    ASSERT_OK_CTX(ctx, cw_graph_output(g, y0, "reduced"));
    ASSERT_OK_CTX(ctx, cw_graph_output(g, y1, "conv"));
    /* each of the K terms' inputs: a conv in float (C*9 products) stored in dt (u), squared
     * (2u); their errors add up to (2u + conv) times the terms' magnitude sum (amax), of the
     * result's scale rmax where nothing cancels (squares); the result stored in dt (u);
     * conv2 adds 9 products of those */
    const double u = unit_roundoff(dt), conv = 16.0 * (C * 9 + 8) * FLT_EPSILON;
    const double b0 = 2.0 * (2.0 * u + conv) * amax / rmax + 2.0 * u;
    const double bound[2] = {b0, 8.0 * b0 + 16.0 * (9 + 8) * FLT_EPSILON};
    double *refs[2] = {ref0, ref1};
    fprintf(stderr, "conv -> reduce %s -> conv, %s (terms' magnitude / result %.2f)\n", op_names[op],
            cw__dtype_name(dt), amax / rmax);
    run_graph(ctx, g, tx, 2, yd, refs, bound);
    cw_tensor_destroy(tx), cw_tensor_destroy(tw1), cw_tensor_destroy(tw2), cw_tensor_destroy(tb);
    free(x), free(w1), free(w2), free(bias), free(c1), free(ref0), free(ref1), free(yf);
}

/* Wan's RMS norm, F.normalize(h, dim=1) = h / clamp_min(||h||_2 over C, eps), between convs:
 * y0 = conv1(x) / clamp(reduce_l2(conv1(x)), eps, inf), y1 = conv2(y0) (3x3, K -> K). */
static void test_rms_norm(cw_context *ctx, cw_rng *r, cw_dtype dt) {
    const int64_t xdims[4] = {N, C, H, W}, w1dims[4] = {K, C, 3, 3}, w2dims[4] = {K, K, 3, 3}, kdim = K;
    const int64_t nx = N * C * H * W;
    const float eps = 1e-12f;
    float *x = rnd(r, nx, 1.0f, 0.0f), *w1 = rnd(r, K * C * 9, 0.3f, 0.0f), *w2 = rnd(r, K * K * 9, 0.3f, 0.0f);
    float *bias = rnd(r, K, 0.1f, 0.0f);
    round_to(x, nx, dt), round_to(w1, K * C * 9, dt), round_to(w2, K * K * 9, dt), round_to(bias, K, dt);
    cw_tensor *tx = upload(ctx, dt, 4, xdims, x), *tw1 = upload(ctx, dt, 4, w1dims, w1);
    cw_tensor *tw2 = upload(ctx, dt, 4, w2dims, w2), *tb = upload(ctx, dt, 1, &kdim, bias);
    cw_conv_params cp = CW_CONV_PARAMS_INIT;
    cp.pad_pre[0] = cp.pad_post[0] = cp.pad_pre[1] = cp.pad_post[1] = 1;
    cw_tensor_desc xd, w1d, w2d, cd;
    ASSERT_OK(cw_tensor_desc_make(&xd, CW_F32, 4, xdims));
    ASSERT_OK(cw_tensor_desc_make(&w1d, CW_F32, 4, w1dims));
    ASSERT_OK(cw_tensor_desc_make(&w2d, CW_F32, 4, w2dims));
    ASSERT_OK_CTX(ctx, cw_conv_output_desc(ctx, &cd, &xd, &w1d, &cp));
    const int64_t nc = cw_tensor_desc_numel(&cd), hw = cd.dims[2] * cd.dims[3];
    double *c1 = malloc((size_t)nc * sizeof *c1), *ref0 = malloc((size_t)nc * sizeof *ref0);
    double *ref1 = malloc((size_t)nc * sizeof *ref1);
    float *yf = malloc((size_t)nc * 4);
    cw_ref_conv(&xd, x, &w1d, w1, bias, &cp, &cd, c1);
    for (int64_t i = 0; i < nc; i++) {
        const int64_t n = i / (K * hw), j = i % hw;
        const double norm = fmax(ref_reduce(CW_REDUCE_L2, c1 + n * K * hw + j, K, hw, NULL), eps);
        ref0[i] = c1[i] / norm;
        yf[i] = (float)ref0[i];
    }
    cw_ref_conv(&cd, yf, &w2d, w2, bias, &cp, &cd, ref1);

    cw_tensor_desc yd[2];
    ASSERT_OK(cw_tensor_desc_make(&yd[0], dt, 4, cd.dims));
    yd[1] = yd[0];
    cw_node in;
    cw_graph *g = graph_open(ctx, dt, 4, xdims, &in);
    cw_node h1, nrm, y0, y1, b = constant(ctx, g, tb);
    ASSERT_OK_CTX(ctx, cw_graph_conv(g, &h1, in, constant(ctx, g, tw1), b, &cp));
    ASSERT_OK_CTX(ctx, cw_graph_reduce_channels(g, &nrm, h1, CW_REDUCE_L2));
    ASSERT_OK_CTX(ctx, cw_graph_unary(g, &nrm, nrm, CW_UNARY_CLAMP, eps, INFINITY));
    ASSERT_OK_CTX(ctx, cw_graph_binary(g, &y0, h1, nrm, CW_BINARY_DIV));
    ASSERT_OK_CTX(ctx, cw_graph_conv(g, &y1, y0, constant(ctx, g, tw2), b, &cp));
    ASSERT_OK_CTX(ctx, cw_graph_output(g, y0, "normalized"));
    ASSERT_OK_CTX(ctx, cw_graph_output(g, y1, "conv"));
    /* h: conv in float stored in dt (u); the norm: those squared (2u), summed, rooted (u),
     * stored (u); the quotient (u) stored: |y0| <= 1, so relative to its max ~ 1 */
    const double u = unit_roundoff(dt), conv = 16.0 * (C * 9 + 8) * FLT_EPSILON;
    const double bound[2] = {8.0 * u + 2.0 * conv, 64.0 * u + 2.0 * conv + 16.0 * (K * 9 + 8) * FLT_EPSILON};
    double *refs[2] = {ref0, ref1};
    fprintf(stderr, "conv -> rms norm (l2, clamp, broadcast div) -> conv, %s\n", cw__dtype_name(dt));
    run_graph(ctx, g, tx, 2, yd, refs, bound);
    cw_tensor_destroy(tx), cw_tensor_destroy(tw1), cw_tensor_destroy(tw2), cw_tensor_destroy(tb);
    free(x), free(w1), free(w2), free(bias), free(c1), free(ref0), free(ref1), free(yf);
}

/* Every op on a 5-D input of nc channels (7, or 1: the op of one element) read directly:
 * the inputs are exact in dt, so the result is the double reduction rounded once (u). The
 * two outputs are op and the next op of the same x. */
static void test_reduce_5d(cw_context *ctx, cw_rng *r, cw_dtype dt, int64_t nc) {
    const int64_t dims[5] = {2, nc, 3, 5, 4}, sp = 3 * 5 * 4, n = 2 * nc * sp, no = 2 * sp;
    float *x = rnd(r, n, 2.0f, 0.0f);
    round_to(x, n, dt);
    cw_tensor *tx = upload(ctx, dt, 5, dims, x);
    double *xd = malloc((size_t)n * sizeof *xd);
    for (int64_t i = 0; i < n; i++) xd[i] = x[i];
    for (int op = 0; op < CW_REDUCE_OP_COUNT; op++) {
        const int op2 = (op + 1) % CW_REDUCE_OP_COUNT;
        double *ref0 = malloc((size_t)no * sizeof *ref0), *ref1 = malloc((size_t)no * sizeof *ref1);
        for (int64_t b = 0; b < 2; b++)
            for (int64_t j = 0; j < sp; j++) {
                ref0[b * sp + j] = ref_reduce(op, xd + b * nc * sp + j, nc, sp, NULL);
                ref1[b * sp + j] = ref_reduce(op2, xd + b * nc * sp + j, nc, sp, NULL);
            }
        const int64_t ydims[5] = {2, 1, 3, 5, 4};
        cw_tensor_desc yd[2];
        ASSERT_OK(cw_tensor_desc_make(&yd[0], dt, 5, ydims));
        yd[1] = yd[0];
        cw_node in;
        cw_graph *g = graph_open(ctx, dt, 5, dims, &in);
        cw_node y0, y1;
        ASSERT_OK_CTX(ctx, cw_graph_reduce_channels(g, &y0, in, (cw_reduce_op)op));
        ASSERT_OK_CTX(ctx, cw_graph_reduce_channels(g, &y1, in, (cw_reduce_op)op2));
        ASSERT_OK_CTX(ctx, cw_graph_output(g, y0, "y0"));
        ASSERT_OK_CTX(ctx, cw_graph_output(g, y1, "y1"));
        const double bound[2] = {unit_roundoff(dt) * (1.0 + 1e-9), unit_roundoff(dt) * (1.0 + 1e-9)};
        double *refs[2] = {ref0, ref1};
        fprintf(stderr, "5-D reduce %s and %s over %d channels, %s\n", op_names[op], op_names[op2], (int)nc,
                cw__dtype_name(dt));
        run_graph(ctx, g, tx, 2, yd, refs, bound);
        free(ref0), free(ref1);
    }
    cw_tensor_destroy(tx);
    free(x), free(xd);
}

static void test_badargs(cw_context *ctx) {
    const int64_t xdims[4] = {1, 2, 4, 4}, flat[2] = {2, 8};
    cw_node x, out;
    cw_graph *g = graph_open(ctx, CW_F32, 4, xdims, &x);
    const cw_node m = input(ctx, g, "m", CW_F32, 2, flat);
    cw_tensor *half = upload(ctx, CW_F16, 4, xdims, NULL);
    const cw_node h = constant(ctx, g, half);
    CHECK_REFUSED(ctx, cw_graph_reduce_channels(g, &out, x, (cw_reduce_op)4),
                  "cw_graph_reduce_channels: op = 4 is not a cw_reduce_op (0..3)");
    CHECK(out == CW_NODE_NONE);
    CHECK_REFUSED(ctx, cw_graph_reduce_channels(g, &out, x, (cw_reduce_op)-1),
                  "cw_graph_reduce_channels: op = -1 is not a cw_reduce_op");
    CHECK_REFUSED(ctx, cw_graph_reduce_channels(g, &out, m, CW_REDUCE_SUM),
                  "cw_graph_reduce_channels: x must be [N, C, H, W] or [N, C, D, H, W], got [2, 8]");
    CHECK_REFUSED(ctx, cw_graph_reduce_channels(g, &out, h, CW_REDUCE_MEAN),
                  "cw_graph_reduce_channels: x, constant 'c' (node 2), is f16 but the graph is f32");
    CHECK_REFUSED(ctx, cw_graph_reduce_channels(g, &out, 99, CW_REDUCE_L2),
                  "cw_graph_reduce_channels: x = 99 is not a node of this graph");
    ASSERT_STATUS(cw_graph_reduce_channels(g, NULL, x, CW_REDUCE_L2), CW_ERR_INVALID_ARG);
    ASSERT_STATUS(cw_graph_reduce_channels(NULL, &out, x, CW_REDUCE_L2), CW_ERR_INVALID_ARG);
    ASSERT_OK_CTX(ctx, cw_graph_reduce_channels(g, &out, x, CW_REDUCE_MEAN_SQUARE));
    cw_tensor_desc d;
    ASSERT_OK_CTX(ctx, cw_graph_get_node_desc(g, &d, out));
    CHECK(d.rank == 4 && d.dims[0] == 1 && d.dims[1] == 1 && d.dims[2] == 4 && d.dims[3] == 4 && d.dtype == CW_F32);
    cw_graph_destroy(g);
    cw_tensor_destroy(half);
}

/* The contract in front of the backends: 67 channels whose sum depends on the order (terms
 * of 1e8 and 1 that cancel), bit for bit against the double sum in ascending c; NaN and
 * infinities; an f16 view; and each violation refused by name. */
static void test_contract(void) {
    op_rig k;
    op_rig_open(&k);
    enum { NC = 67, SP = 6 };
    float x[NC * SP], y[SP];
    cw_rng r = {99};
    for (int c = 0; c < NC; c++)
        for (int j = 0; j < SP; j++) {
            const float big = c % 3 == 0 ? 1e8f : c % 3 == 1 ? -1e8f : 1.0f;
            x[c * SP + j] = big * (1.0f + 0.25f * cw_rng_float(&r)) + (float)j;
        }
    x[5 * SP + 3] = NAN, x[7 * SP + 4] = INFINITY, x[9 * SP + 5] = -INFINITY;
    const int64_t xdims[4] = {1, NC, 2, 3}, ydims[4] = {1, 1, 2, 3};
    cw__op_args a;
    memset(&a, 0, sizeof a);
    a.code = CW_OP_REDUCE_CHANNELS;
    ASSERT_OK(cw_tensor_desc_make(&a.in[0].d, CW_F32, 4, xdims));
    ASSERT_OK(cw_tensor_desc_make(&a.out.d, CW_F32, 4, ydims));
    a.in[0].data = x, a.out.data = y;
    for (int op = 0; op < CW_REDUCE_OP_COUNT; op++) {
        a.param.i[0] = op;
        OP_RUN(&k, &a);
        for (int j = 0; j < SP; j++) {
            double acc = 0.0; /* ascending c, one double accumulator */
            for (int c = 0; c < NC; c++) acc += squares(op) ? (double)x[c * SP + j] * x[c * SP + j] : (double)x[c * SP + j];
            const float ref = op == CW_REDUCE_L2 ? (float)sqrt(acc) : squares(op) || op == CW_REDUCE_MEAN ? (float)(acc / NC)
                                                                                                          : (float)acc;
            const int ok = isnan(ref) ? isnan(y[j]) : memcmp(&ref, &y[j], 4) == 0;
            if (!ok) fprintf(stderr, "reduce %s at %d: %a, reference %a\n", op_names[op], j, y[j], ref);
            CHECK(ok);
        }
        CHECK(isnan(y[3])); /* NaN in one channel */
        CHECK(squares(op) ? y[4] == INFINITY && y[5] == INFINITY : y[4] == INFINITY && y[5] == -INFINITY);
    }
    /* f16 in and out: the sum of 3 exact halves, rounded once */
    uint16_t hx[3 * 2], hy[2];
    const float hv[6] = {1.0f, 2048.0f, 1.0f, -3.0f, 1.0f, 0.5f};
    for (int i = 0; i < 6; i++) hx[i] = cw__f32_to_f16(hv[i]);
    const int64_t hxd[4] = {1, 3, 1, 2}, hyd[4] = {1, 1, 1, 2};
    cw__op_args hf;
    memset(&hf, 0, sizeof hf);
    hf.code = CW_OP_REDUCE_CHANNELS;
    hf.param.i[0] = CW_REDUCE_SUM;
    ASSERT_OK(cw_tensor_desc_make(&hf.in[0].d, CW_F16, 4, hxd));
    ASSERT_OK(cw_tensor_desc_make(&hf.out.d, CW_F16, 4, hyd));
    hf.in[0].data = hx, hf.out.data = hy;
    OP_RUN(&k, &hf);
    /* 1 + 1 + 1 = 3 and 2048 - 3 + 0.5 = 2045.5 -> 2046 in f16 (ulp 1 above 1024: ties to even) */
    CHECK(cw__f16_to_f32(hy[0]) == 3.0f && cw__f16_to_f32(hy[1]) == 2046.0f);

    cw__op_args bad = a;
    bad.param.i[0] = CW_REDUCE_OP_COUNT;
    OP_REFUSED(&k, &bad, "reduce_channels: in[0] [1, 67, 2, 3] and the parameters are outside");
    bad = a;
    bad.out.d.dims[1] = 2;
    OP_REFUSED(&k, &bad, "reduce_channels: out is [1, 2, 2, 3], the op makes [1, 1, 2, 3]");
    bad = a;
    bad.in[0].d.dtype = CW_BF16;
    OP_REFUSED(&k, &bad, "reduce_channels: in[0] is bf16, expected f32");
    bad = a;
    bad.in[0].data = NULL;
    OP_REFUSED(&k, &bad, "reduce_channels: in[0]");
    op_rig_close(&k);
}

int main(void) {
    cw_rng r = {cw_test_seed(15)};
    cw_context *ctx = chaos_context();
    const cw_dtype dts[3] = {CW_F32, CW_F16, CW_BF16};
    for (int d = 0; d < 3; d++) {
        for (int op = 0; op < CW_REDUCE_OP_COUNT; op++) test_conv_reduce_conv(ctx, &r, dts[d], op);
        test_rms_norm(ctx, &r, dts[d]);
        test_reduce_5d(ctx, &r, dts[d], 7);
        test_reduce_5d(ctx, &r, dts[d], 1);
    }
    test_badargs(ctx);
    cw_context_destroy(ctx);
    test_contract();
    TEST_DONE();
}
