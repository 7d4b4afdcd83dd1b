/* cw_graph_unary (relu, tanh, sigmoid, gelu, gelu_tanh, affine, clamp, rsqrt, square, pow)
 * against a double-precision reference: every op between two 3x3 convs (4-D, unscheduled and
 * patched convs on 3 streams with chaos and poison; rsqrt and pow on sigmoid(conv) + 0.25, in
 * their domain) in f32, f16 and bf16 graphs, two ops in a row on a 5-D tensor, LTX's pixel
 * norm x * rsqrt(mean(x^2 over C) + eps) and a pow chain on 5-D tensors, every op fused
 * into a conv's prep after GroupNorm and SiLU and before an upsample, the builder's
 * argument checks, and the op's contract through cw__op_run (special values: NaN,
 * infinities, signed zeros). */
#include <float.h>
#include <math.h>
#include <string.h>

#include "alloc/alloc.h"
#include "backend/cpu/cpu.h"
#include "conv_ref.h"
#include "convweave/convweave.h"
#include "core/half.h"
#include "graph_run.h"
#include "kernels/kernels.h"
#include "testutil.h"

enum { N = 2, C = 3, K = 4, H = 10, W = 6 };

static const char *const op_names[] = {"relu",  "tanh",  "sigmoid", "gelu",   "gelu_tanh",
                                       "affine", "clamp", "rsqrt",   "square", "pow"};

/* x's values as stored in dtype dt (rounded once), written back into x as floats. */

/* The unit roundoff of dt. */

/* The op in double, as PyTorch defines it. */
static double ref_unary(int op, double x, double a, double b) {
    switch (op) {
    case CW_UNARY_RELU: return x < 0 ? 0 : x;
    case CW_UNARY_TANH: return tanh(x);
    case CW_UNARY_SIGMOID: return 1.0 / (1.0 + exp(-x));
    case CW_UNARY_GELU: return 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
    case CW_UNARY_GELU_TANH: return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
    case CW_UNARY_AFFINE: return a * x + b;
    case CW_UNARY_CLAMP: return x != x ? x : fmin(fmax(x, a), b);
    case CW_UNARY_RSQRT: return 1.0 / sqrt(x);
    case CW_UNARY_SQUARE: return x * x;
    case CW_UNARY_POW: return pow(x, a);
    default: return NAN;
    }
}

/* Scalars that make each op do something on values in about [-1.5, 1.5]. */
static void op_scalars(int op, float *a, float *b) {
    *a = op == CW_UNARY_AFFINE ? -1.5f : op == CW_UNARY_CLAMP ? -0.3f : op == CW_UNARY_POW ? 2.5f : 0.0f;
    *b = op == CW_UNARY_AFFINE ? 0.25f : op == CW_UNARY_CLAMP ? 0.4f : 0.0f;
}

/* Ops defined on positive x only (rsqrt, pow with a non-integer exponent): the graph test
 * feeds them sigmoid(h) + 0.25, in (0.25, 1.25). */
static int positive_only(int op) { return op == CW_UNARY_RSQRT || op == CW_UNARY_POW; }

/* The op's condition number |x f'(x) / f(x)| on the test's inputs (at most |a| = 1.5 for the
 * others): relative errors of its input are multiplied by it. */
static double op_cond(int op) { return op == CW_UNARY_RSQRT ? 0.5 : op == CW_UNARY_SQUARE ? 2.0 : op == CW_UNARY_POW ? 2.5 : 1.5; }

/* y0 = op(conv3x3(x)) (op(sigmoid(conv3x3(x)) + 0.25) for positive_only ops); y1 =
 * conv3x3(y0) (padding 1) in a graph of dtype dt: the op reads a patched conv's output and
 * feeds another. The reference starts from x, w and b as stored in dt and computes in
 * double, the op's input being conv1's exact result. */
static void test_conv_unary_conv(cw_context *ctx, cw_rng *r, cw_dtype dt, int op) {
    const int64_t xdims[4] = {N, C, H, W};
    float a, b;
    op_scalars(op, &a, &b);
    sandwich s;
    sandwich_open(&s, ctx, r, dt, 4, xdims, K, 0.0f);
    const int64_t n1 = cw_tensor_desc_numel(&s.c1d);
    double *ref0 = malloc((size_t)n1 * sizeof *ref0);
    for (int64_t i = 0; i < n1; i++) {
        const double v = positive_only(op) ? 1.0 / (1.0 + exp(-s.c1[i])) + 0.25 : s.c1[i];
        ref0[i] = ref_unary(op, v, a, b);
    }
    cw_node h = s.h, y0;
    if (positive_only(op)) {
        ASSERT_OK_CTX(ctx, cw_graph_unary(s.g, &h, h, CW_UNARY_SIGMOID, 0.0f, 0.0f));
        ASSERT_OK_CTX(ctx, cw_graph_unary(s.g, &h, h, CW_UNARY_AFFINE, 1.0f, 0.25f));
    }
    ASSERT_OK_CTX(ctx, cw_graph_unary(s.g, &y0, h, (cw_unary_op)op, a, b));
    /* conv1 in float (C*9 products), stored in dt (u; for positive_only ops two more stores,
     * 2u), the op's f32 math (a few ulps; its condition k = op_cond multiplies its input's
     * error) and the store (u); conv2 adds K*9 products of inputs perturbed by those */
    const double u = unit_roundoff(dt), k = op_cond(op) / 1.5;
    const double bound[2] = {4.0 * k * u + k * 16.0 * (C * 9 + 8) * FLT_EPSILON,
                             16.0 * k * u + k * 16.0 * (C * 9 + K * 9 + 8) * FLT_EPSILON};
    sandwich_close(&s, y0, s.c1d.dims, ref0, bound, op_names[op]);
    free(ref0);
}

/* The op fused into a conv's prep (scheduler/fusion.c's unary link): y = conv2(up2x(op(t)))
 * with t = silu(group_norm(conv1(x))) (2 groups), or t = sigmoid(conv1(x)) + 0.25 for the
 * positive_only ops (the sigmoid then a node of its own, the affine and the op links), y the
 * only output. The patched plan runs GN, SiLU, the op and the upsample in conv2's prep (its
 * live activations show it); the unscheduled one runs each as a node. Both against double. */
static void test_prep_unary(cw_context *ctx, cw_rng *r, cw_dtype dt, int op) {
    const int64_t xdims[4] = {N, C, H, W}, udims[4] = {N, K, 2 * H, 2 * W}, w2dims[4] = {K, K, 3, 3};
    float a, b;
    op_scalars(op, &a, &b);
    sandwich s;
    sandwich_open(&s, ctx, r, dt, 4, xdims, K, 0.0f);
    gn_silu t;
    gn_silu_open(&t, ctx, r, K, 2);
    const int64_t per = H * W, nu = N * K * 4 * per;
    double *v = malloc((size_t)N * K * per * sizeof *v), *y = malloc((size_t)nu * sizeof *y);
    float *uf = malloc((size_t)nu * sizeof *uf);
    if (positive_only(op)) {
        for (int64_t i = 0; i < N * K * per; i++) v[i] = 1.0 / (1.0 + exp(-s.c1[i])) + 0.25;
    } else {
        for (int64_t n = 0; n < N; n++) gn_silu_ref(&t, s.c1 + n * K * per, per, v + n * K * per);
    }
    for (int64_t i = 0; i < nu; i++) { /* nearest 2x of op(v) */
        const int64_t nc = i / (4 * per), hh = i / (2 * W) % (2 * H), ww = i % (2 * W);
        uf[i] = (float)ref_unary(op, v[nc * per + hh / 2 * W + ww / 2], a, b);
    }
    cw_tensor_desc ud, w2d, yd;
    ASSERT_OK(cw_tensor_desc_make(&ud, CW_F32, 4, udims));
    ASSERT_OK(cw_tensor_desc_make(&w2d, CW_F32, 4, w2dims));
    ASSERT_OK_CTX(ctx, cw_conv_output_desc(ctx, &yd, &ud, &w2d, &s.cp));
    cw_ref_conv(&ud, uf, &w2d, s.w2, s.bias, &s.cp, &yd, y);
    cw_node h = s.h, yn;
    if (positive_only(op)) {
        ASSERT_OK_CTX(ctx, cw_graph_unary(s.g, &h, h, CW_UNARY_SIGMOID, 0.0f, 0.0f));
        ASSERT_OK_CTX(ctx, cw_graph_unary(s.g, &h, h, CW_UNARY_AFFINE, 1.0f, 0.25f));
    } else {
        h = gn_silu_node(&t, ctx, s.g, h);
    }
    ASSERT_OK_CTX(ctx, cw_graph_unary(s.g, &h, h, (cw_unary_op)op, a, b));
    ASSERT_OK_CTX(ctx, cw_graph_upsample2x(s.g, &h, h));
    ASSERT_OK_CTX(ctx, cw_graph_conv(s.g, &yn, h, constant(ctx, s.g, s.tw2), constant(ctx, s.g, s.tb), &s.cp));
    ASSERT_OK_CTX(ctx, cw_graph_output(s.g, yn, "y"));
    cw_compile_options opt = CW_COMPILE_OPTIONS_INIT;
    opt.policy = CW_PATCHES_FIXED, opt.patches = 3, opt.streams = 3;
    cw_plan *p;
    cw_plan_stats st;
    ASSERT_OK_CTX(ctx, cw_graph_compile(s.g, &p, &opt));
    ASSERT_OK_CTX(ctx, cw_plan_get_stats(p, &st));
    /* one activation lives at a time: conv1's result (overwritten in place by the sigmoid
     * and the affine); the op's result and its upsample are never materialised (a lone op
     * after GN and SiLU would hold a second, as the GN and SiLU before it could not fuse) */
    CHECK(st.activations_live_peak == cw__alloc_round(N * K * per * (int64_t)cw_dtype_size(dt)));
    cw_plan_destroy(p);
    /* as test_conv_unary_conv's y1, with the GroupNorm's statistics and SiLU on the way (a
     * few more roundings of values of order 1) */
    const double u = unit_roundoff(dt), k = op_cond(op) / 1.5;
    const double bound = 32.0 * k * u + k * 32.0 * (C * 9 + K * 9 + 8) * FLT_EPSILON;
    cw_tensor_desc od;
    ASSERT_OK(cw_tensor_desc_make(&od, dt, 4, yd.dims));
    double *refs[1] = {y};
    fprintf(stderr, "conv -> %s -> %s -> up2x -> conv, %s\n", positive_only(op) ? "sigmoid, affine" : "gn, silu",
            op_names[op], cw__dtype_name(dt));
    run_graph(ctx, s.g, s.tx, 1, &od, refs, &bound);
    cw_tensor_destroy(s.tx), cw_tensor_destroy(s.tw1), cw_tensor_destroy(s.tw2), cw_tensor_destroy(s.tb);
    free(s.x), free(s.w1), free(s.w2), free(s.bias), free(s.c1);
    gn_silu_close(&t);
    free(v), free(y), free(uf);
}

/* 5-D in dtype dt: y0 = gelu(x), y1 = clamp(sigmoid(y0) * 2 - 1, -0.2, 0.3) (an op reading an
 * op, the affine in between). The reference rounds each stored intermediate to dt, as the
 * plan stores them. */
static void test_unary_5d(cw_context *ctx, cw_rng *r, cw_dtype dt) {
    const int64_t dims[5] = {2, 3, 3, 5, 4}, n = 2 * 3 * 3 * 5 * 4;
    float *x = rnd(r, n, 2.0f, 0.0f);
    round_to(x, n, dt);
    cw_tensor *tx = upload(ctx, dt, 5, dims, x);
    double *ref0 = malloc((size_t)n * sizeof *ref0), *ref1 = malloc((size_t)n * sizeof *ref1);
    for (int64_t i = 0; i < n; i++) {
        ref0[i] = ref_unary(CW_UNARY_GELU, x[i], 0, 0);
        float v = (float)ref0[i];
        round_to(&v, 1, dt);
        v = (float)ref_unary(CW_UNARY_SIGMOID, v, 0, 0);
        round_to(&v, 1, dt);
        v = (float)ref_unary(CW_UNARY_AFFINE, v, 2.0, -1.0);
        round_to(&v, 1, dt);
        ref1[i] = ref_unary(CW_UNARY_CLAMP, v, -0.2, 0.3);
    }
    cw_tensor_desc yd[2];
    ASSERT_OK(cw_tensor_desc_make(&yd[0], dt, 5, dims));
    yd[1] = yd[0];
    cw_node in, y0, y1;
    cw_graph *g = graph_open(ctx, dt, 5, dims, &in);
    ASSERT_OK_CTX(ctx, cw_graph_unary(g, &y0, in, CW_UNARY_GELU, 0.0f, 0.0f));
    ASSERT_OK_CTX(ctx, cw_graph_unary(g, &y1, y0, CW_UNARY_SIGMOID, 0.0f, 0.0f));
    ASSERT_OK_CTX(ctx, cw_graph_unary(g, &y1, y1, CW_UNARY_AFFINE, 2.0f, -1.0f));
    ASSERT_OK_CTX(ctx, cw_graph_unary(g, &y1, y1, CW_UNARY_CLAMP, -0.2f, 0.3f));
    ASSERT_OK_CTX(ctx, cw_graph_output(g, y0, "gelu"));
    ASSERT_OK_CTX(ctx, cw_graph_output(g, y1, "clamped"));
    /* each stored value is the f32 result (a few ulps) rounded once (u); the reference
     * rounds at the same places, so a rounding boundary may differ by one unit each */
    const double u = unit_roundoff(dt);
    const double bound[2] = {u + 16.0 * FLT_EPSILON, 8.0 * u + 64.0 * FLT_EPSILON};
    double *refs[2] = {ref0, ref1};
    run_graph(ctx, g, tx, 2, yd, refs, bound);
    cw_tensor_destroy(tx);
    free(x), free(ref0), free(ref1);
}

/* 5-D in dtype dt: LTX's pixel norm y0 = x * rsqrt(mean over C of x^2 + eps) (reduce,
 * affine, rsqrt, a broadcast multiply) and y1 = pow(square(x) + 0.5, -0.75). The reference
 * rounds each stored intermediate to dt, as the plan stores them. */
static void test_norm_pow_5d(cw_context *ctx, cw_rng *r, cw_dtype dt) {
    enum { NC = 6, SP = 3 * 5 * 4 };
    const int64_t dims[5] = {2, NC, 3, 5, 4}, n = 2 * NC * SP;
    const float eps = 1e-6f;
    float *x = rnd(r, n, 2.0f, 0.0f);
    round_to(x, n, dt);
    cw_tensor *tx = upload(ctx, dt, 5, dims, x);
    double *ref0 = malloc((size_t)n * sizeof *ref0), *ref1 = malloc((size_t)n * sizeof *ref1);
    for (int64_t i = 0; i < n; i++) {
        const int64_t b = i / (NC * SP), j = i % SP;
        double ms = 0.0;
        for (int c = 0; c < NC; c++) ms += (double)x[(b * NC + c) * SP + j] * x[(b * NC + c) * SP + j];
        float v = (float)(ms / NC);
        round_to(&v, 1, dt);
        v = (float)((double)v + eps);
        round_to(&v, 1, dt);
        v = (float)(1.0 / sqrt(v));
        round_to(&v, 1, dt);
        ref0[i] = (double)x[i] * v;
        float q = x[i] * x[i];
        round_to(&q, 1, dt);
        q = (float)((double)q + 0.5);
        round_to(&q, 1, dt);
        ref1[i] = pow(q, -0.75);
    }
    cw_tensor_desc yd[2];
    ASSERT_OK(cw_tensor_desc_make(&yd[0], dt, 5, dims));
    yd[1] = yd[0];
    cw_node in, ms, y0, q, y1;
    cw_graph *g = graph_open(ctx, dt, 5, dims, &in);
    ASSERT_OK_CTX(ctx, cw_graph_reduce_channels(g, &ms, in, CW_REDUCE_MEAN_SQUARE));
    ASSERT_OK_CTX(ctx, cw_graph_unary(g, &ms, ms, CW_UNARY_AFFINE, 1.0f, eps));
    ASSERT_OK_CTX(ctx, cw_graph_unary(g, &ms, ms, CW_UNARY_RSQRT, 0.0f, 0.0f));
    ASSERT_OK_CTX(ctx, cw_graph_binary(g, &y0, in, ms, CW_BINARY_MUL));
    ASSERT_OK_CTX(ctx, cw_graph_unary(g, &q, in, CW_UNARY_SQUARE, 0.0f, 0.0f));
    ASSERT_OK_CTX(ctx, cw_graph_unary(g, &q, q, CW_UNARY_AFFINE, 1.0f, 0.5f));
    ASSERT_OK_CTX(ctx, cw_graph_unary(g, &y1, q, CW_UNARY_POW, -0.75f, 0.0f));
    ASSERT_OK_CTX(ctx, cw_graph_output(g, y0, "pixel_norm"));
    ASSERT_OK_CTX(ctx, cw_graph_output(g, y1, "pow"));
    /* each stored value is its double result rounded once (u); the reference rounds at the
     * same places, so where a value lands near a rounding boundary the two may differ by a
     * unit, carried through the next op's condition (rsqrt 1/2, pow 3/4) */
    const double u = unit_roundoff(dt);
    const double bound[2] = {4.0 * u + 16.0 * FLT_EPSILON, 4.0 * u + 16.0 * FLT_EPSILON};
    double *refs[2] = {ref0, ref1};
    fprintf(stderr, "5-D pixel norm and pow, %s\n", cw__dtype_name(dt));
    run_graph(ctx, g, tx, 2, yd, refs, bound);
    cw_tensor_destroy(tx);
    free(x), free(ref0), free(ref1);
}

static void test_badargs(cw_context *ctx) {
    const int64_t xdims[4] = {1, 2, 4, 4}, flat[2] = {2, 8};
    cw_node x, out;
    cw_graph *g = graph_open(ctx, CW_F32, 4, xdims, &x);
    const cw_node m = input(ctx, g, "m", CW_F32, 2, flat);
    cw_tensor *half = upload(ctx, CW_F16, 4, xdims, NULL);
    const cw_node h = constant(ctx, g, half);
    CHECK_REFUSED(ctx, cw_graph_unary(g, &out, x, (cw_unary_op)10, 0.0f, 0.0f),
                  "cw_graph_unary: op = 10 is not a cw_unary_op (0..9)");
    CHECK(out == CW_NODE_NONE);
    CHECK_REFUSED(ctx, cw_graph_unary(g, &out, x, (cw_unary_op)-1, 0.0f, 0.0f),
                  "cw_graph_unary: op = -1 is not a cw_unary_op");
    CHECK_REFUSED(ctx, cw_graph_unary(g, &out, x, CW_UNARY_CLAMP, NAN, 1.0f),
                  "cw_graph_unary: CW_UNARY_CLAMP's bounds a = nan");
    CHECK_REFUSED(ctx, cw_graph_unary(g, &out, m, CW_UNARY_RELU, 0.0f, 0.0f),
                  "cw_graph_unary: x must be [N, C, H, W] or [N, C, D, H, W], got [2, 8]");
    CHECK_REFUSED(ctx, cw_graph_unary(g, &out, h, CW_UNARY_RELU, 0.0f, 0.0f),
                  "cw_graph_unary: x, constant 'c' (node 2), is f16 but the graph is f32");
    CHECK_REFUSED(ctx, cw_graph_unary(g, &out, 99, CW_UNARY_RELU, 0.0f, 0.0f),
                  "cw_graph_unary: x = 99 is not a node of this graph");
    ASSERT_STATUS(cw_graph_unary(g, NULL, x, CW_UNARY_RELU, 0.0f, 0.0f), CW_ERR_INVALID_ARG);
    ASSERT_STATUS(cw_graph_unary(NULL, &out, x, CW_UNARY_RELU, 0.0f, 0.0f), CW_ERR_INVALID_ARG);
    /* NaN scalars are fine where the op ignores them; infinite bounds open a side */
    ASSERT_OK_CTX(ctx, cw_graph_unary(g, &out, x, CW_UNARY_TANH, NAN, NAN));
    ASSERT_OK_CTX(ctx, cw_graph_unary(g, &out, x, CW_UNARY_CLAMP, -INFINITY, 6.0f));
    cw_tensor_desc od;
    ASSERT_OK_CTX(ctx, cw_graph_get_node_desc(g, &od, out));
    CHECK(od.rank == 4 && od.dims[1] == 2 && od.dims[3] == 4 && od.dtype == CW_F32);
    cw_graph_destroy(g);
    cw_tensor_destroy(half);
}

/* The contract in front of the backends: a valid call on special values against the
 * reference (relative error 64 ulps: the gelus' argument rounds in f32 and erfc and sigmoid
 * amplify that by up to |2z| ~ 7 at x = -3; exact where IEEE fixes the result), and each
 * violation refused by name. */
static void test_contract(void) {
    op_rig k;
    op_rig_open(&k);
    enum { E = 12 };
    const float x[E] = {NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 1.0f, -1.0f, 0.5f, -3.0f, 20.0f, -120.0f, 1e-30f};
    float y[E];
    const int64_t dims[4] = {1, 1, 3, 4};
    cw__op_args a;
    memset(&a, 0, sizeof a);
    a.code = CW_OP_UNARY;
    ASSERT_OK(cw_tensor_desc_make(&a.in[0].d, CW_F32, 4, dims));
    a.out.d = a.in[0].d;
    a.in[0].data = (void *)x, a.out.data = y;
    for (int op = 0; op < CW_UNARY_OP_COUNT; op++) {
        float pa, pb;
        op_scalars(op, &pa, &pb);
        a.param.i[0] = op, a.param.f[0] = pa, a.param.f[1] = pb;
        OP_RUN(&k, &a);
        for (int i = 0; i < E; i++) {
            const double ref = ref_unary(op, x[i], pa, pb);
            if (isnan(ref)) {
                CHECK(isnan(y[i]));
                continue;
            }
            const double err = fabs(y[i] - ref), tol = 64.0 * FLT_EPSILON * fabs(ref) + 1e-37;
            if (!(err <= tol) && !(isinf(ref) && y[i] == ref))
                fprintf(stderr, "%s(%g) = %.9g, reference %.9g\n", op_names[op], x[i], y[i], ref);
            CHECK(err <= tol || (isinf(ref) && y[i] == ref));
        }
    }
    CHECK(isnan(y[0])); /* clamp, the last op run: NaN propagates */
    /* exact results IEEE fixes */
    a.param.i[0] = CW_UNARY_RELU;
    OP_RUN(&k, &a);
    CHECK(isnan(y[0]) && y[1] == INFINITY && y[2] == 0.0f && y[5] == 1.0f && y[6] == 0.0f);
    a.param.i[0] = CW_UNARY_SIGMOID;
    OP_RUN(&k, &a);
    CHECK(y[1] == 1.0f && y[2] == 0.0f && y[3] == 0.5f && y[9] == 1.0f && y[10] == 0.0f);
    a.param.i[0] = CW_UNARY_CLAMP, a.param.f[0] = 2.0f, a.param.f[1] = 1.0f; /* a > b: b */
    OP_RUN(&k, &a);
    CHECK(isnan(y[0]) && y[1] == 1.0f && y[2] == 1.0f && y[8] == 1.0f);
    a.param.i[0] = CW_UNARY_RSQRT; /* torch.rsqrt: +-0 -> +-inf, x < 0 -> NaN, inf -> 0 */
    OP_RUN(&k, &a);
    CHECK(y[1] == 0.0f && isnan(y[2]) && y[3] == INFINITY && y[4] == -INFINITY && y[5] == 1.0f && isnan(y[6]));
    CHECK(y[11] == 1e15f); /* 1e-30f: the double quotient rounded once */
    a.param.i[0] = CW_UNARY_SQUARE; /* one IEEE product: bit for bit */
    OP_RUN(&k, &a);
    for (int i = 1; i < E; i++) CHECK(y[i] == x[i] * x[i]);
    a.param.i[0] = CW_UNARY_POW, a.param.f[0] = 2.0f; /* x^2 = x * x, bit for bit */
    OP_RUN(&k, &a);
    for (int i = 1; i < E; i++) CHECK(y[i] == x[i] * x[i]);
    a.param.f[0] = 0.0f; /* x^0 = 1, NaN included (C and torch.pow) */
    OP_RUN(&k, &a);
    for (int i = 0; i < E; i++) CHECK(y[i] == 1.0f);
    a.param.f[0] = 0.5f; /* negative x, non-integer exponent: NaN; inf^0.5 = inf */
    OP_RUN(&k, &a);
    CHECK(isnan(y[0]) && y[1] == INFINITY && isnan(y[6]) && y[5] == 1.0f && y[7] == (float)sqrt(0.5));

    cw__op_args bad = a;
    bad.param.i[0] = CW_UNARY_OP_COUNT;
    OP_REFUSED(&k, &bad, "unary: in[0] [1, 1, 3, 4] and the parameters are outside");
    bad = a;
    bad.out.d.dims[3] = 3;
    OP_REFUSED(&k, &bad, "unary: out is [1, 1, 3, 3], the op makes [1, 1, 3, 4] of in[0]");
    bad = a;
    bad.in[0].d.dtype = CW_BF16;
    OP_REFUSED(&k, &bad, "unary: in[0] is bf16, expected f32");
    bad = a;
    bad.out.data = NULL;
    OP_REFUSED(&k, &bad, "unary: out");
    op_rig_close(&k);
}

int main(void) {
    cw_rng r = {cw_test_seed(13)};
    cw_context *ctx = chaos_context();
    const cw_dtype dts[3] = {CW_F32, CW_F16, CW_BF16};
    for (int d = 0; d < 3; d++) {
        for (int op = 0; op < CW_UNARY_OP_COUNT; op++) test_conv_unary_conv(ctx, &r, dts[d], op);
        for (int op = 0; op < CW_UNARY_OP_COUNT; op++) test_prep_unary(ctx, &r, dts[d], op);
        test_unary_5d(ctx, &r, dts[d]);
        test_norm_pow_5d(ctx, &r, dts[d]);
    }
    test_badargs(ctx);
    cw_context_destroy(ctx);
    test_contract();
    TEST_DONE();
}
