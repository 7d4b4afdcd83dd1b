/* cw_graph_binary (mul, sub, div, max, min of two activations of equal dims) against a
 * double-precision reference: every op between patched 3x3 convs (4-D, unscheduled and
 * patched on 3 streams with chaos and poison) in f32, f16 and bf16 graphs; a 5-D chain that
 * reads one node as both operands; the builder's argument checks; and the op's contract
 * through cw__op_run (NaN from either side, division by zero). */
#include "graph_run.h"

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
 * division stays away from zero) and feeds a third. The reference computes in double from
 * x and the weights as stored in dt. */
static void test_conv_binary_conv(cw_context *ctx, cw_rng *r, cw_dtype dt, int op) {
    const int64_t xdims[4] = {N, C, H, W}, wdims[4] = {K, C, 3, 3};
    sandwich s;
    sandwich_open(&s, ctx, r, dt, 4, xdims, K, 0.0f);
    cw_tensor *tw;
    float *w = rnd_stored(ctx, r, dt, 4, wdims, 0.3f, 0.0f, &tw);
    cw_tensor_desc wd;
    ASSERT_OK(cw_tensor_desc_make(&wd, CW_F32, 4, wdims));
    const int64_t n1 = cw_tensor_desc_numel(&s.c1d);
    double *c2 = malloc((size_t)n1 * sizeof *c2), *ref0 = malloc((size_t)n1 * sizeof *ref0);
    cw_ref_conv(&s.xd, s.x, &wd, w, s.bias, &s.cp, &s.c1d, c2);
    for (int64_t i = 0; i < n1; i++) ref0[i] = ref_binary(op, s.c1[i], 1.0 / (1.0 + exp(-c2[i])) + 0.5);
    cw_node h2, y0;
    ASSERT_OK_CTX(ctx, cw_graph_conv(s.g, &h2, s.in, constant(ctx, s.g, tw), constant(ctx, s.g, s.tb), &s.cp));
    ASSERT_OK_CTX(ctx, cw_graph_unary(s.g, &h2, h2, CW_UNARY_SIGMOID, 0.0f, 0.0f));
    ASSERT_OK_CTX(ctx, cw_graph_unary(s.g, &h2, h2, CW_UNARY_AFFINE, 1.0f, 0.5f));
    ASSERT_OK_CTX(ctx, cw_graph_binary(s.g, &y0, s.h, h2, (cw_binary_op)op));
    /* each operand: a conv in float (C*9 products) stored in dt (u), the second through two
     * more stores (2u); the op in f32 and its store (u); conv3 adds K*9 products of those */
    const double u = unit_roundoff(dt);
    const double bound[2] = {8.0 * u + 16.0 * (C * 9 + 8) * FLT_EPSILON,
                             32.0 * u + 16.0 * (C * 9 + K * 9 + 8) * FLT_EPSILON};
    sandwich_close(&s, y0, s.c1d.dims, ref0, bound, op_names[op]);
    cw_tensor_destroy(tw);
    free(w), free(c2), free(ref0);
}

/* 5-D in dtype dt: y0 = x * x (one node as both operands), t = tanh(x),
 * y1 = max(min((y0 - t) / (y0 + 1), x), t). The reference rounds each stored value to dt. */
static void test_binary_5d(cw_context *ctx, cw_rng *r, cw_dtype dt) {
    const int64_t dims[5] = {2, 3, 3, 5, 4}, n = 2 * 3 * 3 * 5 * 4;
    cw_tensor *tx;
    float *x = rnd_stored(ctx, r, dt, 5, dims, 2.0f, 0.0f, &tx);
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
    cw_node in, y[2], t, s, d;
    cw_graph *g = graph_open(ctx, dt, 5, dims, &in);
    ASSERT_OK_CTX(ctx, cw_graph_binary(g, &y[0], in, in, CW_BINARY_MUL));
    ASSERT_OK_CTX(ctx, cw_graph_unary(g, &t, in, CW_UNARY_TANH, 0.0f, 0.0f));
    ASSERT_OK_CTX(ctx, cw_graph_binary(g, &s, y[0], t, CW_BINARY_SUB));
    ASSERT_OK_CTX(ctx, cw_graph_unary(g, &d, y[0], CW_UNARY_AFFINE, 1.0f, 1.0f));
    ASSERT_OK_CTX(ctx, cw_graph_binary(g, &y[1], s, d, CW_BINARY_DIV));
    ASSERT_OK_CTX(ctx, cw_graph_binary(g, &y[1], y[1], in, CW_BINARY_MIN));
    ASSERT_OK_CTX(ctx, cw_graph_binary(g, &y[1], y[1], t, CW_BINARY_MAX));
    /* the square rounds once (u); the chain's reference rounds where the plan stores, so
     * they differ only where f32 and double land on two sides of a rounding boundary */
    const double u = unit_roundoff(dt);
    const double bound[2] = {u + 4.0 * FLT_EPSILON, 8.0 * u + 64.0 * FLT_EPSILON};
    double *refs[2] = {ref0, ref1};
    check_graph(ctx, g, tx, 2, y, yd, refs, bound);
    cw_tensor_destroy(tx);
    free(x), free(ref0), free(ref1);
}

static void test_badargs(cw_context *ctx) {
    const int64_t xdims[4] = {1, 2, 4, 4}, odims[4] = {1, 2, 4, 3}, flat[2] = {2, 8};
    cw_tensor *half = upload(ctx, CW_F16, 4, xdims, NULL);
    cw_node x, out;
    cw_graph *g = graph_open(ctx, CW_F32, 4, xdims, &x);
    const cw_node o = input(ctx, g, "o", CW_F32, 4, odims), m = input(ctx, g, "m", CW_F32, 2, flat);
    const cw_node h = constant(ctx, g, half);
    CHECK_REFUSED(ctx, cw_graph_binary(g, &out, x, x, (cw_binary_op)5), "cw_graph_binary: op = 5 is not a cw_binary_op");
    CHECK(out == CW_NODE_NONE);
    CHECK_REFUSED(ctx, cw_graph_binary(g, &out, x, x, (cw_binary_op)-1), "cw_graph_binary: op = -1 is not a cw_binary_op");
    CHECK_REFUSED(ctx, cw_graph_binary(g, &out, x, o, CW_BINARY_MUL),
                  "cw_graph_binary: a [1, 2, 4, 4] and b [1, 2, 4, 3] differ in shape");
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

    cw__op_args bad = a;
    bad.param.i[0] = CW_BINARY_OP_COUNT;
    OP_REFUSED(&k, &bad, "binary: in[0] [1, 1, 2, 5] and the parameters are outside");
    bad = a, bad.in[1].d.dims[3] = 4;
    OP_REFUSED(&k, &bad, "binary: in[0] [1, 1, 2, 5] and the parameters are outside");
    bad = a, bad.in[1].d.dtype = CW_F16;
    OP_REFUSED(&k, &bad, "binary: in[1] is f16, expected f32");
    bad = a, bad.out.d.dims[2] = 1;
    OP_REFUSED(&k, &bad, "binary: out is [1, 1, 1, 5], the op makes [1, 1, 2, 5] of in[0]");
    bad = a, bad.in[1].data = NULL;
    OP_REFUSED(&k, &bad, "binary: in[1]");
    op_rig_close(&k);
}

int main(void) {
    cw_rng r = {cw_test_seed(14)};
    cw_context *ctx = chaos_context();
    const cw_dtype dts[3] = {CW_F32, CW_F16, CW_BF16};
    for (int d = 0; d < 3; d++) {
        for (int op = 0; op < CW_BINARY_OP_COUNT; op++) test_conv_binary_conv(ctx, &r, dts[d], op);
        test_binary_5d(ctx, &r, dts[d]);
    }
    test_badargs(ctx);
    cw_context_destroy(ctx);
    test_contract();
    TEST_DONE();
}
