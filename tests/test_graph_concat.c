/* cw_graph_concat (torch.cat of two activations along channels or the outermost spatial
 * dim) against a double-precision reference: conv outputs joined along C, and along H (b
 * with fewer rows), feeding a patched conv (4-D, unscheduled and patched on 3 streams with
 * chaos and poison) in f32, f16 and bf16 graphs; 5-D tensors joined along T and C bit for
 * bit; the builder's argument checks; and the op's contract through cw__op_run (bits copied,
 * NaN payloads included, in every dtype, rank and dim). */
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

enum { N = 2, C = 3, K1 = 4, K2 = 2, K = 3, H = 10, W = 6 };



/* y0 = cat(conv1(x), conv2(x), dim); y1 = conv3(y0) (3x3) in a graph of dtype dt. dim 1:
 * conv1 gives K1 channels, conv2 K2 (both padding 1). dim 2: both give K1 channels, conv2
 * unpadded in H (H - 2 rows), so the cat has 2H - 2 rows and conv3's patches read across
 * the seam. The reference computes in double from x and the weights as stored in dt. */
static void test_conv_concat_conv(cw_context *ctx, cw_rng *r, cw_dtype dt, int dim) {
    const int64_t kb = dim == 1 ? K2 : K1, kc = dim == 1 ? K1 + K2 : K1;
    const int64_t xdims[4] = {N, C, H, W}, w1dims[4] = {K1, C, 3, 3}, w2dims[4] = {kb, C, 3, 3};
    const int64_t w3dims[4] = {K, kc, 3, 3}, k1dim = K1, kbdim = kb, kdim = K;
    const int64_t nx = N * C * H * W;
    float *x = rnd(r, nx, 1.0f, 0.0f), *w1 = rnd(r, K1 * C * 9, 0.3f, 0.0f), *w2 = rnd(r, kb * C * 9, 0.3f, 0.0f);
    float *w3 = rnd(r, K * kc * 9, 0.3f, 0.0f), *bias = rnd(r, K1 + K2, 0.1f, 0.0f);
    round_to(x, nx, dt), round_to(w1, K1 * C * 9, dt), round_to(w2, kb * C * 9, dt), round_to(w3, K * kc * 9, dt);
    round_to(bias, K1 + K2, dt);
    cw_tensor *tx = upload(ctx, dt, 4, xdims, x), *tw1 = upload(ctx, dt, 4, w1dims, w1);
    cw_tensor *tw2 = upload(ctx, dt, 4, w2dims, w2), *tw3 = upload(ctx, dt, 4, w3dims, w3);
    cw_tensor *tb1 = upload(ctx, dt, 1, &k1dim, bias), *tb2 = upload(ctx, dt, 1, &kbdim, bias + 1);
    cw_tensor *tb3 = upload(ctx, dt, 1, &kdim, bias + 2);
    cw_conv_params cp = CW_CONV_PARAMS_INIT, cp2;
    cp.pad_pre[0] = cp.pad_post[0] = cp.pad_pre[1] = cp.pad_post[1] = 1;
    cp2 = cp;
    if (dim == 2) cp2.pad_pre[0] = cp2.pad_post[0] = 0;

    cw_tensor_desc xd, w1d, w2d, w3d, c1d, c2d, catd, y1d;
    ASSERT_OK(cw_tensor_desc_make(&xd, CW_F32, 4, xdims));
    ASSERT_OK(cw_tensor_desc_make(&w1d, CW_F32, 4, w1dims));
    ASSERT_OK(cw_tensor_desc_make(&w2d, CW_F32, 4, w2dims));
    ASSERT_OK(cw_tensor_desc_make(&w3d, CW_F32, 4, w3dims));
    ASSERT_OK_CTX(ctx, cw_conv_output_desc(ctx, &c1d, &xd, &w1d, &cp));
    ASSERT_OK_CTX(ctx, cw_conv_output_desc(ctx, &c2d, &xd, &w2d, &cp2));
    int64_t cdims[4] = {N, c1d.dims[1], c1d.dims[2], W};
    cdims[dim] += c2d.dims[dim];
    ASSERT_OK(cw_tensor_desc_make(&catd, CW_F32, 4, cdims));
    ASSERT_OK_CTX(ctx, cw_conv_output_desc(ctx, &y1d, &catd, &w3d, &cp));
    const int64_t n1 = cw_tensor_desc_numel(&c1d), n2 = cw_tensor_desc_numel(&c2d), nc = n1 + n2;
    const int64_t ny = cw_tensor_desc_numel(&y1d);
    double *c1 = malloc((size_t)n1 * sizeof *c1), *c2 = malloc((size_t)n2 * sizeof *c2);
    double *ref0 = malloc((size_t)nc * sizeof *ref0), *ref1 = malloc((size_t)ny * sizeof *ref1);
    float *yf = malloc((size_t)nc * 4);
    cw_ref_conv(&xd, x, &w1d, w1, bias, &cp, &c1d, c1);
    cw_ref_conv(&xd, x, &w2d, w2, bias + 1, &cp2, &c2d, c2);
    /* per sample, a's block then b's (dim 1); per (sample, channel), a's rows then b's (dim 2) */
    const int64_t outer = dim == 1 ? N : N * K1, ablk = n1 / outer, bblk = n2 / outer;
    for (int64_t o = 0; o < outer; o++) {
        for (int64_t i = 0; i < ablk; i++) ref0[o * (ablk + bblk) + i] = c1[o * ablk + i];
        for (int64_t i = 0; i < bblk; i++) ref0[o * (ablk + bblk) + ablk + i] = c2[o * bblk + i];
    }
    for (int64_t i = 0; i < nc; i++) yf[i] = (float)ref0[i];
    cw_ref_conv(&catd, yf, &w3d, w3, bias + 2, &cp, &y1d, ref1);

    cw_tensor_desc yd[2];
    ASSERT_OK(cw_tensor_desc_make(&yd[0], dt, 4, cdims));
    ASSERT_OK(cw_tensor_desc_make(&yd[1], dt, 4, y1d.dims));
    cw_node in;
    cw_graph *g = graph_open(ctx, dt, 4, xdims, &in);
    cw_node h1, h2, y0, y1;
    ASSERT_OK_CTX(ctx, cw_graph_conv(g, &h1, in, constant(ctx, g, tw1), constant(ctx, g, tb1), &cp));
    ASSERT_OK_CTX(ctx, cw_graph_conv(g, &h2, in, constant(ctx, g, tw2), constant(ctx, g, tb2), &cp2));
    ASSERT_OK_CTX(ctx, cw_graph_concat(g, &y0, h1, h2, dim));
    ASSERT_OK_CTX(ctx, cw_graph_conv(g, &y1, y0, constant(ctx, g, tw3), constant(ctx, g, tb3), &cp));
    ASSERT_OK_CTX(ctx, cw_graph_output(g, y0, "cat"));
    ASSERT_OK_CTX(ctx, cw_graph_output(g, y1, "conv"));
    /* the cat is its inputs' values: a conv in float (C*9 products) stored in dt (u); conv3
     * adds kc*9 products of those */
    const double u = unit_roundoff(dt);
    const double bound[2] = {2.0 * u + 16.0 * (C * 9 + 8) * FLT_EPSILON,
                             8.0 * u + 16.0 * (C * 9 + kc * 9 + 8) * FLT_EPSILON};
    double *refs[2] = {ref0, ref1};
    fprintf(stderr, "conv -> concat along dim %d -> conv, %s\n", dim, cw__dtype_name(dt));
    run_graph(ctx, g, tx, 2, yd, refs, bound);
    cw_tensor_destroy(tx), cw_tensor_destroy(tw1), cw_tensor_destroy(tw2), cw_tensor_destroy(tw3);
    cw_tensor_destroy(tb1), cw_tensor_destroy(tb2), cw_tensor_destroy(tb3);
    free(x), free(w1), free(w2), free(w3), free(bias), free(c1), free(c2), free(ref0), free(ref1), free(yf);
}

/* 5-D in dtype dt: y0 = cat(x, square(x), T) and y1 = cat(relu(x), x, C): an input read
 * directly and through ops, joined along T and along C; exact (bound 0: the cat copies, and
 * the ops round once where the reference does). */
static void test_concat_5d(cw_context *ctx, cw_rng *r, cw_dtype dt) {
    enum { B = 2, CC = 3, T = 2, HH = 3, WW = 4, SP = HH * WW };
    const int64_t dims[5] = {B, CC, T, HH, WW}, n = B * CC * T * SP;
    const int64_t d0[5] = {B, CC, 2 * T, HH, WW}, d1[5] = {B, 2 * CC, T, HH, WW};
    float *x = rnd(r, n, 2.0f, 0.0f);
    round_to(x, n, dt);
    cw_tensor *tx = upload(ctx, dt, 5, dims, x);
    double *ref0 = malloc((size_t)2 * n * sizeof *ref0), *ref1 = malloc((size_t)2 * n * sizeof *ref1);
    for (int64_t bc = 0; bc < B * CC; bc++) /* along T: per (b, c), x's T slices then x^2's */
        for (int64_t i = 0; i < T * SP; i++) {
            float sq = x[bc * T * SP + i] * x[bc * T * SP + i];
            round_to(&sq, 1, dt);
            ref0[bc * 2 * T * SP + i] = x[bc * T * SP + i];
            ref0[bc * 2 * T * SP + T * SP + i] = sq;
        }
    for (int64_t b = 0; b < B; b++) /* along C: per b, relu(x)'s channels then x's */
        for (int64_t i = 0; i < CC * T * SP; i++) {
            const float v = x[b * CC * T * SP + i];
            ref1[b * 2 * CC * T * SP + i] = v < 0.0f ? 0.0f : v;
            ref1[b * 2 * CC * T * SP + CC * T * SP + i] = v;
        }
    cw_tensor_desc yd[2];
    ASSERT_OK(cw_tensor_desc_make(&yd[0], dt, 5, d0));
    ASSERT_OK(cw_tensor_desc_make(&yd[1], dt, 5, d1));
    cw_node in;
    cw_graph *g = graph_open(ctx, dt, 5, dims, &in);
    cw_node sq, rl, y0, y1;
    ASSERT_OK_CTX(ctx, cw_graph_unary(g, &sq, in, CW_UNARY_SQUARE, 0.0f, 0.0f));
    ASSERT_OK_CTX(ctx, cw_graph_unary(g, &rl, in, CW_UNARY_RELU, 0.0f, 0.0f));
    ASSERT_OK_CTX(ctx, cw_graph_concat(g, &y0, in, sq, 2));
    ASSERT_OK_CTX(ctx, cw_graph_concat(g, &y1, rl, in, 1));
    ASSERT_OK_CTX(ctx, cw_graph_output(g, y0, "cat_t"));
    ASSERT_OK_CTX(ctx, cw_graph_output(g, y1, "cat_c"));
    const double bound[2] = {0.0, 0.0};
    double *refs[2] = {ref0, ref1};
    fprintf(stderr, "5-D concat along T and C, %s\n", cw__dtype_name(dt));
    run_graph(ctx, g, tx, 2, yd, refs, bound);
    cw_tensor_destroy(tx);
    free(x), free(ref0), free(ref1);
}

static void test_badargs(cw_context *ctx) {
    const int64_t xdims[4] = {1, 2, 4, 4}, cdims[4] = {1, 3, 4, 4}, hdims[4] = {1, 2, 5, 4}, wdims[4] = {1, 2, 4, 3};
    const int64_t v5[5] = {1, 2, 1, 4, 4}, flat[2] = {2, 8};
    cw_node x, out;
    cw_graph *g = graph_open(ctx, CW_F32, 4, xdims, &x);
    const cw_node c3 = input(ctx, g, "c3", CW_F32, 4, cdims), h5 = input(ctx, g, "h5", CW_F32, 4, hdims);
    const cw_node w3 = input(ctx, g, "w3", CW_F32, 4, wdims), v = input(ctx, g, "v", CW_F32, 5, v5);
    const cw_node m = input(ctx, g, "m", CW_F32, 2, flat);
    cw_tensor *half = upload(ctx, CW_F16, 4, xdims, NULL);
    const cw_node h = constant(ctx, g, half); /* node 6, named in a message below */
    for (int dim = -1; dim <= 4; dim += 5) { /* -1, 4 */
        CHECK_REFUSED(ctx, cw_graph_concat(g, &out, x, x, dim), "cw_graph_concat: dim = ");
        CHECK(out == CW_NODE_NONE);
    }
    CHECK_REFUSED(ctx, cw_graph_concat(g, &out, x, x, 3),
                  "cw_graph_concat: dim = 3 must be 1 (channels) or 2 (T of a 5-D tensor, H of a 4-D one)");
    /* H differs, joining C */
    CHECK_REFUSED(ctx, cw_graph_concat(g, &out, x, h5, 1),
                  "cw_graph_concat: a [1, 2, 4, 4] and b [1, 2, 5, 4] must have equal dims but dims[1]");
    /* C differs, joining H */
    CHECK_REFUSED(ctx, cw_graph_concat(g, &out, x, c3, 2),
                  "cw_graph_concat: a [1, 2, 4, 4] and b [1, 3, 4, 4] must have equal dims but dims[2]");
    CHECK_REFUSED(ctx, cw_graph_concat(g, &out, x, w3, 2), "a [1, 2, 4, 4] and b [1, 2, 4, 3] must have equal dims");
    /* ranks differ */
    CHECK_REFUSED(ctx, cw_graph_concat(g, &out, x, v, 1),
                  "a [1, 2, 4, 4] and b [1, 2, 1, 4, 4] must have equal dims");
    CHECK_REFUSED(ctx, cw_graph_concat(g, &out, m, x, 1),
                  "cw_graph_concat: a must be [N, C, H, W] or [N, C, D, H, W], got [2, 8]");
    CHECK_REFUSED(ctx, cw_graph_concat(g, &out, x, h, 1),
                  "cw_graph_concat: b, constant 'c' (node 6), is f16 but the graph is f32");
    CHECK_REFUSED(ctx, cw_graph_concat(g, &out, x, 99, 1), "cw_graph_concat: b = 99 is not a node of this graph");
    CHECK_REFUSED(ctx, cw_graph_concat(g, &out, -3, x, 1), "cw_graph_concat: a = -3 is not a node of this graph");
    ASSERT_STATUS(cw_graph_concat(g, NULL, x, x, 1), CW_ERR_INVALID_ARG);
    ASSERT_STATUS(cw_graph_concat(NULL, &out, x, x, 1), CW_ERR_INVALID_ARG);
    cw_tensor_desc d;
    ASSERT_OK_CTX(ctx, cw_graph_concat(g, &out, x, c3, 1));
    ASSERT_OK_CTX(ctx, cw_graph_get_node_desc(g, &d, out));
    CHECK(d.rank == 4 && d.dims[1] == 5 && d.dims[2] == 4 && d.dims[3] == 4 && d.dtype == CW_F32);
    ASSERT_OK_CTX(ctx, cw_graph_concat(g, &out, x, h5, 2));
    ASSERT_OK_CTX(ctx, cw_graph_get_node_desc(g, &d, out));
    CHECK(d.rank == 4 && d.dims[1] == 2 && d.dims[2] == 9 && d.dims[3] == 4);
    ASSERT_OK_CTX(ctx, cw_graph_concat(g, &out, v, v, 2));
    ASSERT_OK_CTX(ctx, cw_graph_get_node_desc(g, &d, out));
    CHECK(d.rank == 5 && d.dims[2] == 2 && d.dims[3] == 4);
    cw_graph_destroy(g);
    cw_tensor_destroy(half);
}

/* The contract in front of the backends: distinct bit patterns (NaN payloads among them)
 * copied exactly in every dtype, rank and dim, and each violation refused by name. */
static void test_contract(void) {
    op_rig k;
    op_rig_open(&k);
    /* a: [2, 3, 2, 2, 5] (or 4-D [2, 3, 4, 5]), b: one fewer along dim; as 32-bit words */
    enum { NA = 2 * 3 * 4 * 5, NMAX = 3 * NA };
    uint32_t xa[NA], xb[NA], y[NMAX];
    for (int i = 0; i < NA; i++) xa[i] = 0x7fc00001u + 0x00010203u * (uint32_t)i, xb[i] = 0xffc00001u + 0x00020305u * (uint32_t)i;
    const cw_dtype dts[3] = {CW_F32, CW_F16, CW_BF16};
    for (int d = 0; d < 3; d++)
        for (int rank = 4; rank <= 5; rank++)
            for (int dim = 1; dim <= 2; dim++) {
                int64_t ad[5], bd[5], od[5];
                const int64_t a4[4] = {2, 3, 4, 5}, a5[5] = {2, 3, 2, 2, 5};
                for (int i = 0; i < rank; i++) ad[i] = bd[i] = od[i] = rank == 5 ? a5[i] : a4[i];
                bd[dim] -= 1, od[dim] = ad[dim] + bd[dim];
                cw__op_args a;
                memset(&a, 0, sizeof a);
                memset(y, 0, sizeof y);
                a.code = CW_OP_CONCAT;
                a.param.i[0] = dim;
                ASSERT_OK(cw_tensor_desc_make(&a.in[0].d, dts[d], rank, ad));
                ASSERT_OK(cw_tensor_desc_make(&a.in[1].d, dts[d], rank, bd));
                ASSERT_OK(cw_tensor_desc_make(&a.out.d, dts[d], rank, od));
                a.in[0].data = xa, a.in[1].data = xb, a.out.data = y;
                OP_RUN(&k, &a);
                /* blocks: outer = product of dims before dim; each a's block then b's */
                const size_t es = cw_dtype_size(dts[d]);
                int64_t outer = 1, inner = 1;
                for (int i = 0; i < dim; i++) outer *= ad[i];
                for (int i = dim + 1; i < rank; i++) inner *= ad[i];
                const int64_t ab = ad[dim] * inner, bb = bd[dim] * inner;
                int bad = 0;
                for (int64_t o = 0; o < outer; o++) {
                    bad |= memcmp((char *)y + (o * (ab + bb)) * es, (char *)xa + o * ab * es, (size_t)(ab * es)) != 0;
                    bad |= memcmp((char *)y + (o * (ab + bb) + ab) * es, (char *)xb + o * bb * es, (size_t)(bb * es)) != 0;
                }
                bad |= memcmp((char *)y + outer * (ab + bb) * es, "\0\0\0\0", 4) != 0; /* nothing past the end */
                if (bad) fprintf(stderr, "concat %s rank %d dim %d: bits differ\n", cw__dtype_name(dts[d]), rank, dim);
                CHECK(!bad);
            }

    cw__op_args a;
    memset(&a, 0, sizeof a);
    a.code = CW_OP_CONCAT;
    a.param.i[0] = 1;
    const int64_t ad[4] = {1, 2, 3, 4}, bd[4] = {1, 1, 3, 4}, od[4] = {1, 3, 3, 4};
    ASSERT_OK(cw_tensor_desc_make(&a.in[0].d, CW_F32, 4, ad));
    ASSERT_OK(cw_tensor_desc_make(&a.in[1].d, CW_F32, 4, bd));
    ASSERT_OK(cw_tensor_desc_make(&a.out.d, CW_F32, 4, od));
    a.in[0].data = xa, a.in[1].data = xb, a.out.data = y;
    ASSERT_OK(cw__op_run(k.be, k.s, &a));
    cw__op_args bad = a;
    bad.param.i[0] = 3; /* W is never a concat dim */
    OP_REFUSED(&k, &bad, "concat: in[0] [1, 2, 3, 4] and the parameters are outside");
    bad = a;
    bad.param.i[0] = 2; /* b's C differs from a's */
    OP_REFUSED(&k, &bad, "concat: in[0] [1, 2, 3, 4] and the parameters are outside");
    bad = a;
    bad.out.d.dims[1] = 2;
    OP_REFUSED(&k, &bad, "concat: out is [1, 2, 3, 4], the op makes [1, 3, 3, 4]");
    bad = a;
    bad.in[1].d.dtype = CW_F16;
    OP_REFUSED(&k, &bad, "concat: in[1] is f16, expected f32");
    ASSERT_OK(k.be->rt->stream_synchronize(k.be, k.s));
    op_rig_close(&k);
}

int main(void) {
    cw_rng r = {cw_test_seed(16)};
    cw_context *ctx = chaos_context();
    const cw_dtype dts[3] = {CW_F32, CW_F16, CW_BF16};
    for (int d = 0; d < 3; d++) {
        test_conv_concat_conv(ctx, &r, dts[d], 1);
        test_conv_concat_conv(ctx, &r, dts[d], 2);
        test_concat_5d(ctx, &r, dts[d]);
    }
    test_badargs(ctx);
    cw_context_destroy(ctx);
    test_contract();
    TEST_DONE();
}
