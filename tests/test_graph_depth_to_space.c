/* cw_graph_depth_to_space and cw_graph_space_to_depth (LTX-Video's up- and downsampler
 * shuffles; pixel_shuffle / pixel_unshuffle in 4-D) against a naive reference: between two
 * convs in 4-D and 5-D (unscheduled and patched on 3 streams with chaos and poison) in f32,
 * f16 and bf16 graphs; LTX's upsampler on an input (depth to space, then the first fd - 1
 * frames dropped) and the round trip, exact; the builders' argument checks; and the ops'
 * contract through cw__op_run (bits copied in every dtype, rank and factor set). */
#include "graph_run.h"

/* The two ops as one scatter over the low-resolution side: lo is [N, C * F, D, H, W] (rank 4:
 * no D, fd = 1), hi is [N, C, D fd, H fh, W fw]; each lo element's channel ch = c F + s, s =
 * (i fh + j) fw + k, pairs it with hi[n, c, d fd + i, h fh + j, w fw + k] (LTX's reshape to
 * [N, C, fd, fh, fw, D, H, W] and permute(0, 1, 5, 2, 6, 3, 7, 4), written as loops here). d2s:
 * hi from lo; else lo from hi. Elements of es bytes. */
static void ref_shuffle(void *lo, void *hi, int rank, const int64_t *lodims, const int64_t f[3], size_t es, int d2s) {
    const int64_t N = lodims[0], CF = lodims[1], D = rank == 5 ? lodims[2] : 1;
    const int64_t H = lodims[rank - 2], W = lodims[rank - 1];
    const int64_t fd = f[0], fh = f[1], fw = f[2], F = fd * fh * fw;
    for (int64_t n = 0; n < N; n++)
        for (int64_t ch = 0; ch < CF; ch++) {
            const int64_t c = ch / F, s = ch % F, i = s / (fh * fw), j = s / fw % fh, k = s % fw;
            for (int64_t d = 0; d < D; d++)
                for (int64_t h = 0; h < H; h++)
                    for (int64_t w = 0; w < W; w++) {
                        const int64_t li = (((n * CF + ch) * D + d) * H + h) * W + w;
                        const int64_t hz = d * fd + i, hy = h * fh + j, hw = w * fw + k;
                        const int64_t hidx = (((n * (CF / F) + c) * (D * fd) + hz) * (H * fh) + hy) * (W * fw) + hw;
                        char *pl = (char *)lo + li * (int64_t)es, *ph = (char *)hi + hidx * (int64_t)es;
                        if (d2s)
                            memcpy(ph, pl, es);
                        else
                            memcpy(pl, ph, es);
                    }
        }
}

/* dims of the other side: d2s: hi of lo dims; else lo of hi dims */
static void other_dims(int rank, const int64_t *in, const int64_t f[3], int d2s, int64_t *out) {
    const int64_t F = f[0] * f[1] * f[2];
    out[0] = in[0];
    out[1] = d2s ? in[1] / F : in[1] * F;
    for (int k = rank == 5 ? 0 : 1; k < 3; k++) {
        const int j = rank - 3 + k;
        out[j] = d2s ? in[j] * f[k] : in[j] / f[k];
    }
}

/* y0 = op(conv1(x)) (d2s: depth to space, else space to depth by f); y1 = conv2(y0) (K2
 * outputs, padding 1) in a graph of dtype dt; conv1 has K outputs. */
static void test_conv_shuffle_conv(cw_context *ctx, cw_rng *r, cw_dtype dt, int rank, const int64_t f[3], int d2s,
                                   int64_t K) {
    enum { N = 2, C = 3, K2 = 3 };
    const int64_t x4[4] = {N, C, 4, 6}, x5[5] = {N, C, 2, 4, 2};
    const int64_t *xdims = rank == 5 ? x5 : x4;
    sandwich s;
    sandwich_open(&s, ctx, r, dt, rank, xdims, K, 0.0f);
    int64_t y0dims[5], w2dims[5] = {K2, 0, 3, 3, 3};
    other_dims(rank, s.c1d.dims, f, d2s, y0dims);
    w2dims[1] = y0dims[1];
    const int64_t n0 = numel(rank, y0dims);
    double *ref0 = malloc((size_t)n0 * sizeof *ref0);
    if (d2s)
        ref_shuffle(s.c1, ref0, rank, s.c1d.dims, f, sizeof(double), 1);
    else
        ref_shuffle(ref0, s.c1, rank, y0dims, f, sizeof(double), 0);
    cw_node y[2];
    ASSERT_OK_CTX(ctx, (d2s ? cw_graph_depth_to_space : cw_graph_space_to_depth)(s.g, &y[0], s.h, f));
    cw_tensor *tw2;
    float *w2 = rnd_stored(ctx, r, dt, rank, w2dims, 0.3f, 0.0f, &tw2);
    ASSERT_OK_CTX(ctx, cw_graph_conv(s.g, &y[1], y[0], constant(ctx, s.g, tw2), CW_NODE_NONE, &s.cp));
    cw_tensor_desc y0d, w2d, y1d, yd[2];
    ASSERT_OK(cw_tensor_desc_make(&y0d, CW_F32, rank, y0dims));
    ASSERT_OK(cw_tensor_desc_make(&w2d, CW_F32, rank, w2dims));
    ASSERT_OK_CTX(ctx, cw_conv_output_desc(ctx, &y1d, &y0d, &w2d, &s.cp));
    float *yf = malloc((size_t)n0 * sizeof *yf);
    double *ref1 = malloc((size_t)cw_tensor_desc_numel(&y1d) * sizeof *ref1);
    for (int64_t i = 0; i < n0; i++) yf[i] = (float)ref0[i];
    cw_ref_conv(&y0d, yf, &w2d, w2, NULL, &s.cp, &y1d, ref1);
    ASSERT_OK(cw_tensor_desc_make(&yd[0], dt, rank, y0dims));
    ASSERT_OK(cw_tensor_desc_make(&yd[1], dt, rank, y1d.dims));
    /* the op copies conv1's stored values; conv2 adds y0's channels * kvol products */
    const double u = unit_roundoff(dt);
    const double bound[2] = {u + 16.0 * (double)(C * s.kvol + 4) * FLT_EPSILON,
                             16.0 * u + 16.0 * (double)((C + y0dims[1]) * s.kvol + 4) * FLT_EPSILON};
    double *refs[2] = {ref0, ref1};
    fprintf(stderr, "conv -> %s (%d, %d, %d) -> conv, %d-D, %s\n", d2s ? "depth_to_space" : "space_to_depth", (int)f[0],
            (int)f[1], (int)f[2], rank, cw__dtype_name(dt));
    check_graph(ctx, s.g, s.tx, 2, y, yd, refs, bound);
    cw_tensor_destroy(s.tx), cw_tensor_destroy(s.tw1), cw_tensor_destroy(s.tw2), cw_tensor_destroy(s.tb);
    cw_tensor_destroy(tw2);
    free(s.x), free(s.w1), free(s.w2), free(s.bias), free(s.c1), free(w2), free(yf), free(ref0), free(ref1);
}

/* LTX's upsampler on an input x [1, 16, 3, 2, 3] in dtype dt: y0 = depth_to_space(x, (2, 2, 2))
 * with its first frame dropped (cw_graph_slice); y1 = space_to_depth(depth_to_space(x)) = x.
 * Exact: bound 0. */
static void test_ltx_exact(cw_context *ctx, cw_rng *r, cw_dtype dt) {
    const int64_t dims[5] = {1, 16, 3, 2, 3}, f[3] = {2, 2, 2}, up[5] = {1, 2, 6, 4, 6}, d0[5] = {1, 2, 5, 4, 6};
    cw_tensor *tx;
    const int64_t n = numel(5, dims);
    float *x = rnd_stored(ctx, r, dt, 5, dims, 2.0f, -1.0f, &tx);
    double *xd = malloc((size_t)n * sizeof *xd), *hi = malloc((size_t)n * sizeof *hi);
    double *ref0 = malloc((size_t)numel(5, d0) * sizeof *ref0);
    for (int64_t i = 0; i < n; i++) xd[i] = x[i];
    ref_shuffle(xd, hi, 5, dims, f, sizeof(double), 1);
    for (int64_t c = 0; c < 2; c++) /* frames 1..5 of each channel */
        memcpy(ref0 + c * 5 * 24, hi + (c * 6 + 1) * 24, 5 * 24 * sizeof *ref0);
    cw_node in, u, y[2];
    cw_graph *g = graph_open(ctx, dt, 5, dims, &in);
    ASSERT_OK_CTX(ctx, cw_graph_depth_to_space(g, &u, in, f));
    ASSERT_OK_CTX(ctx, cw_graph_slice(g, &y[0], u, 2, f[0] - 1, up[2] - (f[0] - 1)));
    ASSERT_OK_CTX(ctx, cw_graph_space_to_depth(g, &y[1], u, f));
    cw_tensor_desc yd[2];
    ASSERT_OK(cw_tensor_desc_make(&yd[0], dt, 5, d0));
    ASSERT_OK(cw_tensor_desc_make(&yd[1], dt, 5, dims));
    double *refs[2] = {ref0, xd};
    const double bound[2] = {0.0, 0.0};
    fprintf(stderr, "LTX upsampler's depth_to_space + slice, and the round trip, %s\n", cw__dtype_name(dt));
    check_graph(ctx, g, tx, 2, y, yd, refs, bound);
    cw_tensor_destroy(tx);
    free(x), free(xd), free(hi), free(ref0);
}

static void test_badargs(cw_context *ctx) {
    const int64_t xdims[4] = {1, 12, 4, 6}, x5dims[5] = {1, 8, 2, 4, 6}, flat[2] = {2, 8};
    const int64_t f122[3] = {1, 2, 2}, f222[3] = {2, 2, 2}, f0[3] = {1, 0, 2}, f9[3] = {1, 1, 9};
    const int64_t f133[3] = {1, 3, 3}, f114[3] = {1, 1, 4}, f311[3] = {3, 1, 1}, f188[3] = {1, 8, 8};
    cw_node x, out;
    cw_graph *g = graph_open(ctx, CW_F32, 4, xdims, &x);
    const cw_node x5 = input(ctx, g, "x5", CW_F32, 5, x5dims), m = input(ctx, g, "m", CW_F32, 2, flat);
    cw_tensor *half = upload(ctx, CW_F16, 4, xdims, NULL);
    const cw_node h = constant(ctx, g, half);
    typedef cw_status (*op_fn)(cw_graph *, cw_node *, cw_node, const int64_t[3]);
    const op_fn ops[2] = {cw_graph_depth_to_space, cw_graph_space_to_depth};
    const char *const names[2] = {"cw_graph_depth_to_space", "cw_graph_space_to_depth"};
    char msg[160];
    for (int o = 0; o < 2; o++) {
        snprintf(msg, sizeof msg, "%s: factors is NULL", names[o]);
        CHECK_REFUSED(ctx, ops[o](g, &out, x, NULL), msg);
        CHECK(out == CW_NODE_NONE);
        snprintf(msg, sizeof msg, "%s: factors[1] (H) = 0 must be in 1..8", names[o]);
        CHECK_REFUSED(ctx, ops[o](g, &out, x, f0), msg);
        snprintf(msg, sizeof msg, "%s: factors[2] (W) = 9 must be in 1..8", names[o]);
        CHECK_REFUSED(ctx, ops[o](g, &out, x5, f9), msg);
        snprintf(msg, sizeof msg, "%s: factors[0] (D) = 2 must be 1 for a 4-D x [1, 12, 4, 6]", names[o]);
        CHECK_REFUSED(ctx, ops[o](g, &out, x, f222), msg);
        snprintf(msg, sizeof msg, "%s: x must be [N, C, H, W] or [N, C, D, H, W], got [2, 8]", names[o]);
        CHECK_REFUSED(ctx, ops[o](g, &out, m, f122), msg);
        snprintf(msg, sizeof msg, "%s: x, constant 'c'", names[o]);
        CHECK_REFUSED(ctx, ops[o](g, &out, h, f122), msg);
        snprintf(msg, sizeof msg, "%s: x = 99 is not a node of this graph", names[o]);
        CHECK_REFUSED(ctx, ops[o](g, &out, 99, f122), msg);
        ASSERT_STATUS(ops[o](g, NULL, x, f122), CW_ERR_INVALID_ARG);
        ASSERT_STATUS(ops[o](NULL, &out, x, f122), CW_ERR_INVALID_ARG);
    }
    CHECK_REFUSED(ctx, cw_graph_depth_to_space(g, &out, x, f188),
                  "cw_graph_depth_to_space: x [1, 12, 4, 6]'s channels C = 12 must be a multiple of fd * fh * fw = 64");
    CHECK_REFUSED(ctx, cw_graph_depth_to_space(g, &out, x5, f133),
                  "cw_graph_depth_to_space: x [1, 8, 2, 4, 6]'s channels C = 8 must be a multiple of fd * fh * fw = 9");
    CHECK_REFUSED(ctx, cw_graph_space_to_depth(g, &out, x, f133),
                  "cw_graph_space_to_depth: x [1, 12, 4, 6]'s H = 4 must be a multiple of factors[1] = 3");
    CHECK_REFUSED(ctx, cw_graph_space_to_depth(g, &out, x, f114),
                  "cw_graph_space_to_depth: x [1, 12, 4, 6]'s W = 6 must be a multiple of factors[2] = 4");
    CHECK_REFUSED(ctx, cw_graph_space_to_depth(g, &out, x5, f311),
                  "cw_graph_space_to_depth: x [1, 8, 2, 4, 6]'s D = 2 must be a multiple of factors[0] = 3");
    cw_tensor_desc d;
    ASSERT_OK_CTX(ctx, cw_graph_depth_to_space(g, &out, x, f122)); /* pixel_shuffle(x, 2) */
    ASSERT_OK_CTX(ctx, cw_graph_get_node_desc(g, &d, out));
    CHECK(d.rank == 4 && d.dims[1] == 3 && d.dims[2] == 8 && d.dims[3] == 12 && d.dtype == CW_F32);
    ASSERT_OK_CTX(ctx, cw_graph_space_to_depth(g, &out, x5, f222));
    ASSERT_OK_CTX(ctx, cw_graph_get_node_desc(g, &d, out));
    CHECK(d.rank == 5 && d.dims[1] == 64 && d.dims[2] == 1 && d.dims[3] == 2 && d.dims[4] == 3);
    ASSERT_OK_CTX(ctx, cw_graph_depth_to_space(g, &out, x5, f222));
    ASSERT_OK_CTX(ctx, cw_graph_get_node_desc(g, &d, out));
    CHECK(d.rank == 5 && d.dims[1] == 1 && d.dims[2] == 4 && d.dims[3] == 8 && d.dims[4] == 12);
    cw_graph_destroy(g);
    cw_tensor_destroy(half);
}

/* The contract in front of the backends: distinct bit patterns copied exactly by both ops in
 * every dtype, rank and factor set, and each violation refused by name. */
static void test_contract(void) {
    op_rig k;
    op_rig_open(&k);
    enum { NMAX = 2 * 16 * 2 * 3 * 2 * 8 }; /* the largest side below, in elements */
    static uint32_t lo[NMAX], hi[NMAX], y[NMAX + 1], want[NMAX];
    for (int i = 0; i < NMAX; i++)
        lo[i] = 0x7fc00001u + 0x00010203u * (uint32_t)i, hi[i] = 0xffc00001u + 0x00020305u * (uint32_t)i;
    const int64_t fs[6][3] = {{1, 1, 1}, {1, 2, 2}, {2, 2, 2}, {1, 3, 2}, {2, 1, 3}, {2, 2, 1}};
    const cw_dtype dts[3] = {CW_F32, CW_F16, CW_BF16};
    for (int di = 0; di < 3; di++)
        for (int rank = 4; rank <= 5; rank++)
            for (int fi = 0; fi < 6; fi++)
                for (int d2s = 0; d2s < 2; d2s++) {
                    const int64_t *f = fs[fi];
                    if (rank == 4 && f[0] != 1) continue;
                    /* the low-resolution side: [2, 2 F, 2, 3, 2] or [2, 2 F, 3, 2] */
                    const int64_t F = f[0] * f[1] * f[2];
                    const int64_t l5[5] = {2, 2 * F, 2, 3, 2}, l4[4] = {2, 2 * F, 3, 2};
                    const int64_t *ld = rank == 5 ? l5 : l4;
                    int64_t hd[5];
                    other_dims(rank, ld, f, 1, hd);
                    const size_t es = cw_dtype_size(dts[di]);
                    const int64_t n = numel(rank, ld);
                    ASSERT_TRUE(n * (int64_t)es <= NMAX * 4);
                    memset(want, 0, sizeof want);
                    if (d2s) /* in: lo's patterns; want: the high-resolution side made of them */
                        ref_shuffle(lo, want, rank, ld, f, es, 1);
                    else /* in: hi's patterns; want: the low-resolution side */
                        ref_shuffle(want, hi, rank, ld, f, es, 0);
                    cw__op_args a;
                    memset(&a, 0, sizeof a);
                    memset(y, 0, sizeof y);
                    a.code = d2s ? CW_OP_DEPTH_TO_SPACE : CW_OP_SPACE_TO_DEPTH;
                    a.param.i[0] = f[0], a.param.i[1] = f[1], a.param.i[2] = f[2];
                    ASSERT_OK(cw_tensor_desc_make(&a.in[0].d, dts[di], rank, d2s ? ld : hd));
                    ASSERT_OK(cw_tensor_desc_make(&a.out.d, dts[di], rank, d2s ? hd : ld));
                    a.in[0].data = d2s ? lo : hi, a.out.data = y;
                    OP_RUN(&k, &a);
                    const int bad = memcmp(y, want, (size_t)n * es) != 0 ||
                                    memcmp((char *)y + n * (int64_t)es, "\0\0\0\0", es) != 0;
                    if (bad)
                        fprintf(stderr, "%s %s rank %d factors (%d, %d, %d): bits differ\n",
                                d2s ? "depth_to_space" : "space_to_depth", cw__dtype_name(dts[di]), rank, (int)f[0],
                                (int)f[1], (int)f[2]);
                    CHECK(!bad);
                }

    cw__op_args a;
    memset(&a, 0, sizeof a);
    a.code = CW_OP_DEPTH_TO_SPACE;
    a.param.i[0] = 1, a.param.i[1] = 2, a.param.i[2] = 2;
    const int64_t ld[4] = {1, 8, 3, 2}, hd[4] = {1, 2, 6, 4};
    ASSERT_OK(cw_tensor_desc_make(&a.in[0].d, CW_F32, 4, ld));
    ASSERT_OK(cw_tensor_desc_make(&a.out.d, CW_F32, 4, hd));
    a.in[0].data = lo, a.out.data = hi;
    cw__op_args b = a;
    b.param.i[0] = 2; /* a D factor of a 4-D view */
    OP_REFUSED(&k, &b, "depth_to_space: in[0] [1, 8, 3, 2] and the parameters are outside the op's rule");
    b = a;
    b.param.i[2] = 9;
    OP_REFUSED(&k, &b, "depth_to_space: in[0] [1, 8, 3, 2] and the parameters are outside the op's rule");
    b = a;
    b.param.i[1] = 3; /* 6 does not divide 8 */
    OP_REFUSED(&k, &b, "depth_to_space: in[0] [1, 8, 3, 2] and the parameters are outside the op's rule");
    b = a;
    b.out.d.dims[1] = 1;
    OP_REFUSED(&k, &b, "depth_to_space: out is [1, 1, 6, 4], the op makes [1, 2, 6, 4] of in[0] [1, 8, 3, 2]");
    b = a;
    b.code = CW_OP_SPACE_TO_DEPTH; /* W = 2 is not a multiple of 4 */
    b.param.i[2] = 4;
    OP_REFUSED(&k, &b, "space_to_depth: in[0] [1, 8, 3, 2] and the parameters are outside the op's rule");
    b = a;
    b.code = CW_OP_SPACE_TO_DEPTH;
    b.param.i[1] = 3, b.param.i[2] = 1;
    OP_REFUSED(&k, &b, "space_to_depth: out is [1, 2, 6, 4], the op makes [1, 24, 1, 2] of in[0] [1, 8, 3, 2]");
    b = a;
    b.in[0].d.dtype = CW_F16;
    OP_REFUSED(&k, &b, "depth_to_space: in[0] is f16, expected f32");
    op_rig_close(&k);
}

int main(void) {
    cw_rng r = {cw_test_seed(31)};
    cw_context *ctx = chaos_context();
    const cw_dtype dts[3] = {CW_F32, CW_F16, CW_BF16};
    const int64_t f122[3] = {1, 2, 2}, f222[3] = {2, 2, 2}, f212[3] = {2, 1, 2}, f132[3] = {1, 3, 2};
    for (int d = 0; d < 3; d++) {
        test_conv_shuffle_conv(ctx, &r, dts[d], 4, f122, 1, 8);  /* pixel_shuffle(., 2) */
        test_conv_shuffle_conv(ctx, &r, dts[d], 4, f132, 1, 12);
        test_conv_shuffle_conv(ctx, &r, dts[d], 5, f222, 1, 8);  /* LTX's (2, 2, 2) */
        test_conv_shuffle_conv(ctx, &r, dts[d], 5, f212, 1, 4);
        test_conv_shuffle_conv(ctx, &r, dts[d], 4, f122, 0, 2);  /* pixel_unshuffle(., 2) */
        test_conv_shuffle_conv(ctx, &r, dts[d], 5, f222, 0, 2);
        test_conv_shuffle_conv(ctx, &r, dts[d], 5, f212, 0, 3);
        test_ltx_exact(ctx, &r, dts[d]);
    }
    test_badargs(ctx);
    cw_context_destroy(ctx);
    test_contract();
    TEST_DONE();
}
