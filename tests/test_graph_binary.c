/* cw_graph_binary (mul, sub, div, max, min of two activations of equal dims, or with b of
 * one channel broadcast over a's) against a double-precision reference: every op between
 * patched 3x3 convs (4-D, unscheduled and patched on 3 streams with chaos and poison), b of
 * a's dims and b of [N, 1, H, W], in f32, f16 and bf16 graphs; a 5-D chain that reads one
 * node as both operands and a 5-D mask [N, 1, D, H, W]; the builder's argument checks; and
 * the op's contract through cw__op_run (NaN from either side, division by zero, broadcast). */
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

enum { N = 2, C = 3, K = 4, H = 10, W = 6 };

static const char *const op_names[] = {"mul", "sub", "div", "max", "min"};

/* The op in double; max and min propagate NaN as torch.maximum / torch.minimum. */
static double ref_binary(int op, double a, double b) {
    switch (op) {
    case CW_BINARY_MUL: return a * b;
    case CW_BINARY_SUB: return a - b;
    case CW_BINARY_DIV: return a / b;
    case CW_BINARY_MAX: return a != a || b != b ? NAN : fmax(a, b);
    case CW_BINARY_MIN: return a != a || b != b ? NAN : fmin(a, b);
    default: return NAN;
    }
}

/* y0 = op(conv1(x), sigmoid(conv2(x)) + 0.5); y1 = conv3(y0) (3x3, padding 1) in a graph of
 * dtype dt: the op reads two patched convs' outputs (the second through two unary ops, so
 * division stays away from zero) and feeds a third. kb: conv2's output channels, K (b of
 * a's dims) or 1 (b [N, 1, H, W] broadcast over a's K channels). The reference computes in
 * double from x and the weights as stored in dt. */
static void test_conv_binary_conv(cw_context *ctx, cw_rng *r, cw_dtype dt, int op, int64_t kb) {
    const int64_t xdims[4] = {N, C, H, W}, wdims[4] = {K, C, 3, 3}, w2dims[4] = {kb, C, 3, 3};
    const int64_t w3dims[4] = {K, K, 3, 3}, kdim = K;
    const int64_t nx = N * C * H * W;
    float *x = rnd(r, nx, 1.0f, 0.0f), *w1 = rnd(r, K * C * 9, 0.3f, 0.0f), *w2 = rnd(r, kb * C * 9, 0.3f, 0.0f);
    float *w3 = rnd(r, K * K * 9, 0.3f, 0.0f), *bias = rnd(r, K, 0.1f, 0.0f);
    round_to(x, nx, dt), round_to(w1, K * C * 9, dt), round_to(w2, kb * C * 9, dt), round_to(w3, K * K * 9, dt);
    round_to(bias, K, dt);
    cw_tensor *tx = upload(ctx, dt, 4, xdims, x), *tw1 = upload(ctx, dt, 4, wdims, w1);
    cw_tensor *tw2 = upload(ctx, dt, 4, w2dims, w2), *tw3 = upload(ctx, dt, 4, w3dims, w3);
    cw_tensor *tb = upload(ctx, dt, 1, &kdim, bias), *tb2 = upload(ctx, dt, 1, &kb, bias);
    cw_conv_params cp = CW_CONV_PARAMS_INIT;
    cp.pad_pre[0] = cp.pad_post[0] = cp.pad_pre[1] = cp.pad_post[1] = 1;

    cw_tensor_desc xd, wd, w2d, w3d, cd, c2d, y1d;
    ASSERT_OK(cw_tensor_desc_make(&xd, CW_F32, 4, xdims));
    ASSERT_OK(cw_tensor_desc_make(&wd, CW_F32, 4, wdims));
    ASSERT_OK(cw_tensor_desc_make(&w2d, CW_F32, 4, w2dims));
    ASSERT_OK(cw_tensor_desc_make(&w3d, CW_F32, 4, w3dims));
    ASSERT_OK_CTX(ctx, cw_conv_output_desc(ctx, &cd, &xd, &wd, &cp));
    ASSERT_OK_CTX(ctx, cw_conv_output_desc(ctx, &c2d, &xd, &w2d, &cp));
    ASSERT_OK_CTX(ctx, cw_conv_output_desc(ctx, &y1d, &cd, &w3d, &cp));
    const int64_t n1 = cw_tensor_desc_numel(&cd), hw = cd.dims[2] * cd.dims[3];
    double *c1 = malloc((size_t)n1 * sizeof *c1), *c2 = malloc((size_t)n1 * sizeof *c2);
    double *ref0 = malloc((size_t)n1 * sizeof *ref0), *ref1 = malloc((size_t)n1 * sizeof *ref1);
    float *yf = malloc((size_t)n1 * 4);
    cw_ref_conv(&xd, x, &wd, w1, bias, &cp, &cd, c1);
    cw_ref_conv(&xd, x, &w2d, w2, bias, &cp, &c2d, c2);
    for (int64_t i = 0; i < n1; i++) {
        const int64_t n = i / (K * hw), k = i / hw % K, j = (n * kb + (kb == 1 ? 0 : k)) * hw + i % hw;
        ref0[i] = ref_binary(op, c1[i], 1.0 / (1.0 + exp(-c2[j])) + 0.5);
        yf[i] = (float)ref0[i];
    }
    cw_ref_conv(&cd, yf, &w3d, w3, bias, &cp, &y1d, ref1);

    cw_tensor_desc yd[2];
    ASSERT_OK(cw_tensor_desc_make(&yd[0], dt, 4, cd.dims));
    ASSERT_OK(cw_tensor_desc_make(&yd[1], dt, 4, y1d.dims));
    cw_node in;
    cw_graph *g = graph_open(ctx, dt, 4, xdims, &in);
    cw_node h1, h2, y0, y1, b = constant(ctx, g, tb);
    ASSERT_OK_CTX(ctx, cw_graph_conv(g, &h1, in, constant(ctx, g, tw1), b, &cp));
    ASSERT_OK_CTX(ctx, cw_graph_conv(g, &h2, in, constant(ctx, g, tw2), constant(ctx, g, tb2), &cp));
    ASSERT_OK_CTX(ctx, cw_graph_unary(g, &h2, h2, CW_UNARY_SIGMOID, 0.0f, 0.0f));
    ASSERT_OK_CTX(ctx, cw_graph_unary(g, &h2, h2, CW_UNARY_AFFINE, 1.0f, 0.5f));
    ASSERT_OK_CTX(ctx, cw_graph_binary(g, &y0, h1, h2, (cw_binary_op)op));
    ASSERT_OK_CTX(ctx, cw_graph_conv(g, &y1, y0, constant(ctx, g, tw3), b, &cp));
    ASSERT_OK_CTX(ctx, cw_graph_output(g, y0, "op"));
    ASSERT_OK_CTX(ctx, cw_graph_output(g, y1, "conv"));
    /* each operand: a conv in float (C*9 products) stored in dt (u), the second through two
     * more stores (2u); the op in f32 and its store (u); conv3 adds K*9 products of those */
    const double u = unit_roundoff(dt);
    const double bound[2] = {8.0 * u + 16.0 * (C * 9 + 8) * FLT_EPSILON,
                             32.0 * u + 16.0 * (C * 9 + K * 9 + 8) * FLT_EPSILON};
    double *refs[2] = {ref0, ref1};
    fprintf(stderr, "conv -> %s%s -> conv, %s\n", op_names[op], kb == 1 ? " (b broadcast over channels)" : "",
            cw__dtype_name(dt));
    run_graph(ctx, g, tx, 2, yd, refs, bound);
    cw_tensor_destroy(tx), cw_tensor_destroy(tw1), cw_tensor_destroy(tw2), cw_tensor_destroy(tw3);
    cw_tensor_destroy(tb), cw_tensor_destroy(tb2);
    free(x), free(w1), free(w2), free(w3), free(bias), free(c1), free(c2), free(ref0), free(ref1), free(yf);
}

/* 5-D in dtype dt: y0 = x * x (one node as both operands), t = tanh(x),
 * y1 = max(min((y0 - t) / (y0 + 1), x), t). The reference rounds each stored value to dt. */
static void test_binary_5d(cw_context *ctx, cw_rng *r, cw_dtype dt) {
    const int64_t dims[5] = {2, 3, 3, 5, 4}, n = 2 * 3 * 3 * 5 * 4;
    float *x = rnd(r, n, 2.0f, 0.0f);
    round_to(x, n, dt);
    cw_tensor *tx = upload(ctx, dt, 5, dims, x);
    double *ref0 = malloc((size_t)n * sizeof *ref0), *ref1 = malloc((size_t)n * sizeof *ref1);
    for (int64_t i = 0; i < n; i++) {
        const double xi = x[i];
        ref0[i] = xi * xi;
        const float y0 = rd((float)ref0[i], dt), t = rd((float)tanh(xi), dt);
        const float s = rd((float)((double)y0 - t), dt), d = rd((float)((double)y0 + 1.0), dt);
        const float q = rd((float)((double)s / d), dt);
        ref1[i] = fmax(rd(fminf(q, x[i]), dt), t);
    }
    cw_tensor_desc yd[2];
    ASSERT_OK(cw_tensor_desc_make(&yd[0], dt, 5, dims));
    yd[1] = yd[0];
    cw_node in, y0, t, s, d, y1;
    cw_graph *g = graph_open(ctx, dt, 5, dims, &in);
    ASSERT_OK_CTX(ctx, cw_graph_binary(g, &y0, in, in, CW_BINARY_MUL));
    ASSERT_OK_CTX(ctx, cw_graph_unary(g, &t, in, CW_UNARY_TANH, 0.0f, 0.0f));
    ASSERT_OK_CTX(ctx, cw_graph_binary(g, &s, y0, t, CW_BINARY_SUB));
    ASSERT_OK_CTX(ctx, cw_graph_unary(g, &d, y0, CW_UNARY_AFFINE, 1.0f, 1.0f));
    ASSERT_OK_CTX(ctx, cw_graph_binary(g, &y1, s, d, CW_BINARY_DIV));
    ASSERT_OK_CTX(ctx, cw_graph_binary(g, &y1, y1, in, CW_BINARY_MIN));
    ASSERT_OK_CTX(ctx, cw_graph_binary(g, &y1, y1, t, CW_BINARY_MAX));
    ASSERT_OK_CTX(ctx, cw_graph_output(g, y0, "square"));
    ASSERT_OK_CTX(ctx, cw_graph_output(g, y1, "y"));
    /* the square rounds once (u); the chain's reference rounds where the plan stores, so
     * they differ only where f32 and double land on two sides of a rounding boundary */
    const double u = unit_roundoff(dt);
    const double bound[2] = {u + 4.0 * FLT_EPSILON, 8.0 * u + 64.0 * FLT_EPSILON};
    double *refs[2] = {ref0, ref1};
    run_graph(ctx, g, tx, 2, yd, refs, bound);
    cw_tensor_destroy(tx);
    free(x), free(ref0), free(ref1);
}

/* 5-D in dtype dt with a mask of one channel: m = sigmoid(conv1x1x1(x)) [N, 1, D, H, W],
 * y0 = x * m, y1 = (x - m) / m, both broadcasting m over x's channels. The reference rounds
 * each stored value to dt; m's conv is computed in double. */
static void test_binary_5d_mask(cw_context *ctx, cw_rng *r, cw_dtype dt) {
    const int64_t dims[5] = {2, 3, 3, 5, 4}, mdims[5] = {2, 1, 3, 5, 4}, wdims[5] = {1, 3, 1, 1, 1};
    const int64_t n = 2 * 3 * 3 * 5 * 4, sp = 3 * 5 * 4;
    float *x = rnd(r, n, 2.0f, 0.0f), *w = rnd(r, 3, 1.0f, 0.0f);
    round_to(x, n, dt), round_to(w, 3, dt);
    cw_tensor *tx = upload(ctx, dt, 5, dims, x), *tw = upload(ctx, dt, 5, wdims, w);
    double *ref0 = malloc((size_t)n * sizeof *ref0), *ref1 = malloc((size_t)n * sizeof *ref1);
    for (int64_t i = 0; i < n; i++) {
        const int64_t b = i / (3 * sp), j = i % sp;
        double z = 0.0;
        for (int c = 0; c < 3; c++) z += (double)w[c] * x[(b * 3 + c) * sp + j];
        const double m = rd((float)(1.0 / (1.0 + exp(-z))), dt);
        ref0[i] = x[i] * m;
        ref1[i] = rd((float)(x[i] - m), dt) / m;
    }
    cw_tensor_desc yd[2];
    ASSERT_OK(cw_tensor_desc_make(&yd[0], dt, 5, dims));
    yd[1] = yd[0];
    cw_node in, m, y0, s, y1;
    cw_conv_params cp = CW_CONV_PARAMS_INIT;
    cp.spatial = 3;
    cw_graph *g = graph_open(ctx, dt, 5, dims, &in);
    ASSERT_OK_CTX(ctx, cw_graph_conv(g, &m, in, constant(ctx, g, tw), CW_NODE_NONE, &cp));
    ASSERT_OK_CTX(ctx, cw_graph_unary(g, &m, m, CW_UNARY_SIGMOID, 0.0f, 0.0f));
    cw_tensor_desc md;
    ASSERT_OK_CTX(ctx, cw_graph_get_node_desc(g, &md, m));
    CHECK(md.rank == 5 && md.dims[1] == 1 && md.dims[2] == mdims[2] && md.dims[4] == mdims[4]);
    ASSERT_OK_CTX(ctx, cw_graph_binary(g, &y0, in, m, CW_BINARY_MUL));
    ASSERT_OK_CTX(ctx, cw_graph_binary(g, &s, in, m, CW_BINARY_SUB));
    ASSERT_OK_CTX(ctx, cw_graph_binary(g, &y1, s, m, CW_BINARY_DIV));
    ASSERT_OK_CTX(ctx, cw_graph_output(g, y0, "masked"));
    ASSERT_OK_CTX(ctx, cw_graph_output(g, y1, "y"));
    /* m: a 3-term conv and a sigmoid rounded to dt (u, where the f32 conv and the double one
     * round m apart: one ulp of dt, u relative); each op one more rounding */
    const double u = unit_roundoff(dt);
    const double bound[2] = {4.0 * u + 64.0 * FLT_EPSILON, 16.0 * u + 64.0 * FLT_EPSILON};
    double *refs[2] = {ref0, ref1};
    fprintf(stderr, "5-D mask [2, 1, 3, 5, 4] over [2, 3, 3, 5, 4], %s\n", cw__dtype_name(dt));
    run_graph(ctx, g, tx, 2, yd, refs, bound);
    cw_tensor_destroy(tx), cw_tensor_destroy(tw);
    free(x), free(w), free(ref0), free(ref1);
}

static void test_badargs(cw_context *ctx) {
    const int64_t xdims[4] = {1, 2, 4, 4}, odims[4] = {1, 2, 4, 3}, flat[2] = {2, 8};
    const int64_t c1dims[4] = {1, 1, 4, 4}, c1wdims[4] = {1, 1, 4, 3}, x3dims[4] = {1, 3, 4, 4};
    cw_node x, out;
    cw_graph *g = graph_open(ctx, CW_F32, 4, xdims, &x);
    const cw_node o = input(ctx, g, "o", CW_F32, 4, odims), m = input(ctx, g, "m", CW_F32, 2, flat);
    cw_tensor *half = upload(ctx, CW_F16, 4, xdims, NULL);
    const cw_node h = constant(ctx, g, half); /* node 3, named in a message below */
    const cw_node c1 = input(ctx, g, "c1", CW_F32, 4, c1dims), c1w = input(ctx, g, "c1w", CW_F32, 4, c1wdims);
    const cw_node x3 = input(ctx, g, "x3", CW_F32, 4, x3dims);
    CHECK_REFUSED(ctx, cw_graph_binary(g, &out, x, x, (cw_binary_op)5),
                  "cw_graph_binary: op = 5 is not a cw_binary_op");
    CHECK(out == CW_NODE_NONE);
    CHECK_REFUSED(ctx, cw_graph_binary(g, &out, x, x, (cw_binary_op)-1),
                  "cw_graph_binary: op = -1 is not a cw_binary_op");
    CHECK_REFUSED(ctx, cw_graph_binary(g, &out, x, o, CW_BINARY_MUL),
                  "cw_graph_binary: a [1, 2, 4, 4] and b [1, 2, 4, 3] differ in shape");
    CHECK_REFUSED(ctx, cw_graph_binary(g, &out, x, c1w, CW_BINARY_MUL),
                  "cw_graph_binary: a [1, 2, 4, 4] and b [1, 1, 4, 3] differ in shape "
                  "(b must have a's dims, or 1 channel to broadcast over a's)");
    /* only b broadcasts */
    CHECK_REFUSED(ctx, cw_graph_binary(g, &out, c1, x, CW_BINARY_MUL),
                  "cw_graph_binary: a [1, 1, 4, 4] and b [1, 2, 4, 4] differ in shape");
    CHECK_REFUSED(ctx, cw_graph_binary(g, &out, x3, x, CW_BINARY_MUL),
                  "cw_graph_binary: a [1, 3, 4, 4] and b [1, 2, 4, 4] differ in shape");
    CHECK_REFUSED(ctx, cw_graph_binary(g, &out, x, m, CW_BINARY_SUB),
                  "cw_graph_binary: b must be [N, C, H, W] or [N, C, D, H, W], got [2, 8]");
    CHECK_REFUSED(ctx, cw_graph_binary(g, &out, m, x, CW_BINARY_SUB), "cw_graph_binary: a must be");
    CHECK_REFUSED(ctx, cw_graph_binary(g, &out, x, h, CW_BINARY_DIV),
                  "cw_graph_binary: b, constant 'c' (node 3), is f16 but the graph is f32");
    CHECK_REFUSED(ctx, cw_graph_binary(g, &out, x, 99, CW_BINARY_MAX),
                  "cw_graph_binary: b = 99 is not a node of this graph");
    CHECK_REFUSED(ctx, cw_graph_binary(g, &out, -5, x, CW_BINARY_MAX),
                  "cw_graph_binary: a = -5 is not a node of this graph");
    ASSERT_STATUS(cw_graph_binary(g, NULL, x, x, CW_BINARY_MIN), CW_ERR_INVALID_ARG);
    ASSERT_STATUS(cw_graph_binary(NULL, &out, x, x, CW_BINARY_MIN), CW_ERR_INVALID_ARG);
    ASSERT_OK_CTX(ctx, cw_graph_binary(g, &out, x, x, CW_BINARY_MIN));
    cw_tensor_desc d;
    ASSERT_OK_CTX(ctx, cw_graph_get_node_desc(g, &d, out));
    CHECK(d.rank == 4 && d.dims[3] == 4 && d.dtype == CW_F32);
    ASSERT_OK_CTX(ctx, cw_graph_binary(g, &out, x3, c1, CW_BINARY_DIV));
    ASSERT_OK_CTX(ctx, cw_graph_get_node_desc(g, &d, out));
    CHECK(d.rank == 4 && d.dims[1] == 3 && d.dims[3] == 4);
    ASSERT_OK_CTX(ctx, cw_graph_binary(g, &out, c1, c1, CW_BINARY_DIV)); /* C = 1 both: equal dims */
    cw_graph_destroy(g);
    cw_tensor_destroy(half);
}

/* The contract in front of the backends: a valid call on special values against the
 * reference (each op is one IEEE operation: bitwise), and each violation refused by name. */
static void test_contract(void) {
    op_rig k;
    op_rig_open(&k);
    enum { E = 10 };
    const float xa[E] = {NAN, 1.0f, NAN, 3.0f, -2.0f, 0.0f, 1.0f, -1.0f, INFINITY, 0.75f};
    const float xb[E] = {1.0f, NAN, NAN, 0.0f, 0.0f, 0.0f, -0.5f, 4.0f, 2.0f, -1.25f};
    float y[E];
    const int64_t dims[4] = {1, 1, 2, 5};
    cw__op_args a;
    memset(&a, 0, sizeof a);
    a.code = CW_OP_BINARY;
    ASSERT_OK(cw_tensor_desc_make(&a.in[0].d, CW_F32, 4, dims));
    a.in[1].d = a.out.d = a.in[0].d;
    a.in[0].data = (void *)xa, a.in[1].data = (void *)xb, a.out.data = y;
    for (int op = 0; op < CW_BINARY_OP_COUNT; op++) {
        a.param.i[0] = op;
        OP_RUN(&k, &a);
        for (int i = 0; i < E; i++) {
            const float ref = (float)ref_binary(op, xa[i], xb[i]);
            const int ok = isnan(ref) ? isnan(y[i]) : y[i] == ref;
            if (!ok) fprintf(stderr, "%s(%g, %g) = %g, reference %g\n", op_names[op], xa[i], xb[i], y[i], ref);
            CHECK(ok);
        }
    }
    /* max and min: NaN from either side (y = min, the last op run) */
    CHECK(isnan(y[0]) && isnan(y[1]) && isnan(y[2]) && y[3] == 0.0f && y[8] == 2.0f);

    /* b [1, 1, 2, 5] broadcast over a's 2 channels: a is xa then xb, out [1, 2, 2, 5] */
    float a2[2 * E], y2[2 * E];
    memcpy(a2, xa, sizeof xa), memcpy(a2 + E, xb, sizeof xb);
    cw__op_args bc = a;
    bc.in[0].d.dims[1] = bc.out.d.dims[1] = 2;
    bc.in[0].data = a2, bc.in[1].data = (void *)xb, bc.out.data = y2;
    for (int op = 0; op < CW_BINARY_OP_COUNT; op++) {
        bc.param.i[0] = op;
        OP_RUN(&k, &bc);
        for (int i = 0; i < 2 * E; i++) {
            const float ref = (float)ref_binary(op, a2[i], xb[i % E]);
            const int ok = isnan(ref) ? isnan(y2[i]) : y2[i] == ref;
            if (!ok) fprintf(stderr, "broadcast %s(%g, %g) = %g, reference %g\n", op_names[op], a2[i], xb[i % E], y2[i], ref);
            CHECK(ok);
        }
    }

    cw__op_args bad = bc;
    bad.in[1].d.dims[1] = 2, bad.in[0].d.dims[1] = bad.out.d.dims[1] = 3; /* b's 2 channels against a's 3 */
    OP_REFUSED(&k, &bad, "binary: in[0] [1, 3, 2, 5] and the parameters are outside");
    bad = bc;
    bad.out.d.dims[1] = 1; /* out takes a's channels, not b's */
    OP_REFUSED(&k, &bad, "binary: out is [1, 1, 2, 5], the op makes [1, 2, 2, 5]");
    bad = a;
    bad.param.i[0] = CW_BINARY_OP_COUNT;
    OP_REFUSED(&k, &bad, "binary: in[0] [1, 1, 2, 5] and the parameters are outside");
    bad = a;
    bad.in[1].d.dims[3] = 4;
    OP_REFUSED(&k, &bad, "binary: in[0] [1, 1, 2, 5] and the parameters are outside");
    bad = a;
    bad.in[1].d.dtype = CW_F16;
    OP_REFUSED(&k, &bad, "binary: in[1] is f16, expected f32");
    bad = a;
    bad.out.d.dims[2] = 1;
    OP_REFUSED(&k, &bad, "binary: out is [1, 1, 1, 5], the op makes [1, 1, 2, 5] of in[0]");
    bad = a;
    bad.in[1].data = NULL;
    OP_REFUSED(&k, &bad, "binary: in[1]");
    op_rig_close(&k);
}

int main(void) {
    cw_rng r = {cw_test_seed(14)};
    cw_context *ctx = chaos_context();
    const cw_dtype dts[3] = {CW_F32, CW_F16, CW_BF16};
    for (int d = 0; d < 3; d++) {
        for (int op = 0; op < CW_BINARY_OP_COUNT; op++) {
            test_conv_binary_conv(ctx, &r, dts[d], op, K);
            test_conv_binary_conv(ctx, &r, dts[d], op, 1);
        }
        test_binary_5d(ctx, &r, dts[d]);
        test_binary_5d_mask(ctx, &r, dts[d]);
    }
    test_badargs(ctx);
    cw_context_destroy(ctx);
    test_contract();
    TEST_DONE();
}
