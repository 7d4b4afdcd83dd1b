/* cw_graph_slice (x.narrow(dim, start, length)) against a naive reference: a conv output
 * sliced along H, W and T feeding a conv (4-D and 5-D, unscheduled and patched on 3 streams
 * with chaos and poison) in f32, f16 and bf16 graphs; an input sliced along C, T and W and
 * slices of slices, exact; the builder's argument checks; and the op's contract through
 * cw__op_run (bits copied, NaN payloads included, in every dtype, rank, dim and start). */
#include "graph_run.h"

/* y = x.narrow(dim, start, len) of x (rank, xd), elements of es bytes: out's elements in
 * order, each located in x by its coordinates, dim's shifted by start. */
static void ref_slice(const void *x, int rank, const int64_t *xd, int dim, int64_t start, int64_t len, size_t es,
                      void *y) {
    int64_t od[5], c[5];
    for (int i = 0; i < rank; i++) od[i] = xd[i];
    od[dim] = len;
    const int64_t n = numel(rank, od);
    for (int64_t e = 0; e < n; e++) {
        int64_t q = e, xi = 0;
        for (int i = rank - 1; i >= 0; i--) c[i] = q % od[i], q /= od[i];
        c[dim] += start;
        for (int i = 0; i < rank; i++) xi = xi * xd[i] + c[i];
        memcpy((char *)y + e * (int64_t)es, (const char *)x + xi * (int64_t)es, es);
    }
}

/* y0 = slice(conv1(x), dim, start, len); y1 = conv2(y0) in a graph of dtype dt: a spatial dim
 * (conv2 takes conv1's K channels), e.g. the frames LTX's upsampler drops after its
 * depth-to-space (dim 2, start = fd - 1). */
static void test_conv_slice_conv(cw_context *ctx, cw_rng *r, cw_dtype dt, int rank, int dim, int64_t start,
                                 int64_t len) {
    enum { N = 2, C = 3, K = 4 };
    const int64_t x4[4] = {N, C, 7, 6}, x5[5] = {N, C, 5, 4, 6};
    const int64_t *xdims = rank == 5 ? x5 : x4;
    sandwich s;
    sandwich_open(&s, ctx, r, dt, rank, xdims, K, 0.0f);
    int64_t y0dims[5];
    for (int i = 0; i < rank; i++) y0dims[i] = s.c1d.dims[i];
    y0dims[dim] = len;
    double *ref0 = malloc((size_t)numel(rank, y0dims) * sizeof *ref0);
    ref_slice(s.c1, rank, s.c1d.dims, dim, start, len, sizeof(double), ref0);
    cw_node y0;
    ASSERT_OK_CTX(ctx, cw_graph_slice(s.g, &y0, s.h, dim, start, len));
    /* the slice copies conv1's stored values; conv2 adds K*kvol products of those */
    const double u = unit_roundoff(dt);
    const int64_t kvol = s.kvol;
    const double bound[2] = {u + 16.0 * (double)(C * kvol + 4) * FLT_EPSILON,
                             16.0 * u + 16.0 * (double)((C + K) * kvol + 4) * FLT_EPSILON};
    char label[64];
    snprintf(label, sizeof label, "slice (dim %d, start %d, length %d)", dim, (int)start, (int)len);
    sandwich_close(&s, y0, y0dims, ref0, bound, label);
    free(ref0);
}

/* 5-D input x in dtype dt: y0 = x[:, 1:3] (channels), y1 = x[:, :, 1:][..., 2:3] (a slice of a
 * slice: frames then a select along W kept as extent 1). Exact: bound 0. */
static void test_slice_exact(cw_context *ctx, cw_rng *r, cw_dtype dt) {
    enum { B = 2, CC = 4, T = 3, HH = 3, WW = 5 };
    const int64_t dims[5] = {B, CC, T, HH, WW}, tdims[5] = {B, CC, T - 1, HH, WW};
    const int64_t d0[5] = {B, 2, T, HH, WW}, d1[5] = {B, CC, T - 1, HH, 1};
    cw_tensor *tx;
    float *x = rnd_stored(ctx, r, dt, 5, dims, 2.0f, -1.0f, &tx);
    double *xd = malloc((size_t)numel(5, dims) * sizeof *xd), *tmp = malloc((size_t)numel(5, tdims) * sizeof *tmp);
    double *ref0 = malloc((size_t)numel(5, d0) * sizeof *ref0), *ref1 = malloc((size_t)numel(5, d1) * sizeof *ref1);
    for (int64_t i = 0; i < numel(5, dims); i++) xd[i] = x[i];
    ref_slice(xd, 5, dims, 1, 1, 2, sizeof(double), ref0);
    ref_slice(xd, 5, dims, 2, 1, T - 1, sizeof(double), tmp);
    ref_slice(tmp, 5, tdims, 4, 2, 1, sizeof(double), ref1);
    cw_node in, t, y[2];
    cw_graph *g = graph_open(ctx, dt, 5, dims, &in);
    ASSERT_OK_CTX(ctx, cw_graph_slice(g, &y[0], in, 1, 1, 2));
    ASSERT_OK_CTX(ctx, cw_graph_slice(g, &t, in, 2, 1, T - 1));
    ASSERT_OK_CTX(ctx, cw_graph_slice(g, &y[1], t, 4, 2, 1));
    cw_tensor_desc yd[2];
    ASSERT_OK(cw_tensor_desc_make(&yd[0], dt, 5, d0));
    ASSERT_OK(cw_tensor_desc_make(&yd[1], dt, 5, d1));
    double *refs[2] = {ref0, ref1};
    const double bound[2] = {0.0, 0.0};
    fprintf(stderr, "5-D slices of an input along C, T then W, %s\n", cw__dtype_name(dt));
    check_graph(ctx, g, tx, 2, y, yd, refs, bound);
    cw_tensor_destroy(tx);
    free(x), free(xd), free(tmp), free(ref0), free(ref1);
}

static void test_badargs(cw_context *ctx) {
    const int64_t xdims[4] = {1, 2, 4, 5}, x5dims[5] = {1, 2, 3, 4, 5}, flat[2] = {2, 8};
    cw_node x, out;
    cw_graph *g = graph_open(ctx, CW_F32, 4, xdims, &x);
    const cw_node x5 = input(ctx, g, "x5", CW_F32, 5, x5dims), m = input(ctx, g, "m", CW_F32, 2, flat);
    cw_tensor *half = upload(ctx, CW_F16, 4, xdims, NULL);
    const cw_node h = constant(ctx, g, half);
    CHECK_REFUSED(ctx, cw_graph_slice(g, &out, x, 0, 0, 1),
                  "cw_graph_slice: dim = 0 must be in 1..3 for x [1, 2, 4, 5] (N, dim 0, is never sliced)");
    CHECK(out == CW_NODE_NONE);
    CHECK_REFUSED(ctx, cw_graph_slice(g, &out, x, 4, 0, 1),
                  "cw_graph_slice: dim = 4 must be in 1..3 for x [1, 2, 4, 5]");
    CHECK_REFUSED(ctx, cw_graph_slice(g, &out, x5, 5, 0, 1),
                  "cw_graph_slice: dim = 5 must be in 1..4 for x [1, 2, 3, 4, 5]");
    CHECK_REFUSED(ctx, cw_graph_slice(g, &out, x, -1, 0, 1), "cw_graph_slice: dim = -1 must be in 1..3");
    CHECK_REFUSED(ctx, cw_graph_slice(g, &out, x, 2, -1, 1),
                  "cw_graph_slice: start = -1 must be in 0..3 for x [1, 2, 4, 5] along dim 2");
    CHECK_REFUSED(ctx, cw_graph_slice(g, &out, x, 3, 5, 1),
                  "cw_graph_slice: start = 5 must be in 0..4 for x [1, 2, 4, 5] along dim 3");
    CHECK_REFUSED(ctx, cw_graph_slice(g, &out, x, 3, 1, 0),
                  "cw_graph_slice: length = 0 must be in 1..4 (start = 1 + length must not pass x [1, 2, 4, 5]'s "
                  "extent 5 along dim 3)");
    CHECK_REFUSED(ctx, cw_graph_slice(g, &out, x5, 2, 1, 3),
                  "cw_graph_slice: length = 3 must be in 1..2 (start = 1 + length must not pass x [1, 2, 3, 4, 5]'s "
                  "extent 3 along dim 2)");
    CHECK_REFUSED(ctx, cw_graph_slice(g, &out, x, 1, 0, INT64_MAX), "cw_graph_slice: length = 9223372036854775807");
    CHECK_REFUSED(ctx, cw_graph_slice(g, &out, x, 1, INT64_MAX, 1), "cw_graph_slice: start = 9223372036854775807");
    CHECK_REFUSED(ctx, cw_graph_slice(g, &out, m, 1, 0, 1),
                  "cw_graph_slice: x must be [N, C, H, W] or [N, C, D, H, W], got [2, 8]");
    CHECK_REFUSED(ctx, cw_graph_slice(g, &out, h, 1, 0, 1), "cw_graph_slice: x, constant 'c'");
    CHECK_REFUSED(ctx, cw_graph_slice(g, &out, 99, 1, 0, 1), "cw_graph_slice: x = 99 is not a node of this graph");
    ASSERT_STATUS(cw_graph_slice(g, NULL, x, 1, 0, 1), CW_ERR_INVALID_ARG);
    ASSERT_STATUS(cw_graph_slice(NULL, &out, x, 1, 0, 1), CW_ERR_INVALID_ARG);
    cw_tensor_desc d;
    ASSERT_OK_CTX(ctx, cw_graph_slice(g, &out, x, 3, 4, 1)); /* the last column */
    ASSERT_OK_CTX(ctx, cw_graph_get_node_desc(g, &d, out));
    CHECK(d.rank == 4 && d.dims[0] == 1 && d.dims[1] == 2 && d.dims[2] == 4 && d.dims[3] == 1 && d.dtype == CW_F32);
    ASSERT_OK_CTX(ctx, cw_graph_slice(g, &out, x5, 2, 0, 3)); /* all of it */
    ASSERT_OK_CTX(ctx, cw_graph_get_node_desc(g, &d, out));
    CHECK(d.rank == 5 && d.dims[2] == 3 && d.dims[3] == 4 && d.dims[4] == 5);
    cw_graph_destroy(g);
    cw_tensor_destroy(half);
}

/* The contract in front of the backends: distinct bit patterns (NaN payloads among them)
 * copied exactly in every dtype, rank, dim and start, and each violation refused by name. */
static void test_contract(void) {
    op_rig k;
    op_rig_open(&k);
    enum { NX = 2 * 3 * 4 * 5 * 3 };
    uint32_t x[NX], y[NX + 1], want[NX];
    for (int i = 0; i < NX; i++) x[i] = 0x7fc00001u + 0x00010203u * (uint32_t)i;
    const int64_t x4[4] = {2, 3, 4, 5}, x5[5] = {2, 3, 4, 5, 3};
    const cw_dtype dts[3] = {CW_F32, CW_F16, CW_BF16};
    for (int di = 0; di < 3; di++)
        for (int rank = 4; rank <= 5; rank++)
            for (int dim = 1; dim < rank; dim++) {
                const int64_t *xd = rank == 5 ? x5 : x4;
                for (int64_t start = 0; start < xd[dim]; start++)
                    for (int64_t len = 1; start + len <= xd[dim]; len++) {
                        int64_t od[5];
                        for (int i = 0; i < rank; i++) od[i] = xd[i];
                        od[dim] = len;
                        cw__op_args a;
                        memset(&a, 0, sizeof a);
                        memset(y, 0, sizeof y);
                        a.code = CW_OP_SLICE;
                        a.param.i[0] = dim, a.param.i[1] = start, a.param.i[2] = len;
                        ASSERT_OK(cw_tensor_desc_make(&a.in[0].d, dts[di], rank, xd));
                        ASSERT_OK(cw_tensor_desc_make(&a.out.d, dts[di], rank, od));
                        a.in[0].data = x, a.out.data = y;
                        OP_RUN(&k, &a);
                        const size_t es = cw_dtype_size(dts[di]);
                        const int64_t n = numel(rank, od);
                        ref_slice(x, rank, xd, dim, start, len, es, want);
                        const int bad = memcmp(y, want, (size_t)n * es) != 0 ||
                                        memcmp((char *)y + n * (int64_t)es, "\0\0\0\0", es) != 0;
                        if (bad)
                            fprintf(stderr, "slice %s rank %d dim %d start %d length %d: bits differ\n",
                                    cw__dtype_name(dts[di]), rank, dim, (int)start, (int)len);
                        CHECK(!bad);
                    }
            }

    /* a strided view in: x's [2, 3, 4, 5] as a view of [2, 3, 4, 10] (every other W) */
    cw__op_args a;
    memset(&a, 0, sizeof a);
    a.code = CW_OP_SLICE;
    a.param.i[0] = 2, a.param.i[1] = 1, a.param.i[2] = 2;
    const int64_t od[4] = {2, 3, 2, 5};
    ASSERT_OK(cw_tensor_desc_make(&a.in[0].d, CW_F32, 4, x4));
    ASSERT_OK(cw_tensor_desc_make(&a.out.d, CW_F32, 4, od));
    a.in[0].d.strides[0] = 120, a.in[0].d.strides[1] = 40, a.in[0].d.strides[2] = 10, a.in[0].d.strides[3] = 2;
    a.in[0].data = x, a.out.data = y;
    OP_RUN(&k, &a);
    int bad = 0;
    for (int n = 0; n < 2; n++)
        for (int c = 0; c < 3; c++)
            for (int h = 0; h < 2; h++)
                for (int w = 0; w < 5; w++)
                    bad |= y[((n * 3 + c) * 2 + h) * 5 + w] != x[n * 120 + c * 40 + (h + 1) * 10 + 2 * w];
    CHECK(!bad);
    a.in[0].d.strides[0] = a.in[0].d.strides[1] = a.in[0].d.strides[2] = a.in[0].d.strides[3] = 0;

    cw__op_args b = a;
    b.param.i[0] = 0; /* N is never sliced */
    OP_REFUSED(&k, &b, "slice: in[0] [2, 3, 4, 5] and the parameters are outside the op's rule");
    b = a;
    b.param.i[0] = 4;
    OP_REFUSED(&k, &b, "slice: in[0] [2, 3, 4, 5] and the parameters are outside the op's rule");
    b = a;
    b.param.i[1] = 3; /* 3 + 2 > 4 */
    OP_REFUSED(&k, &b, "slice: in[0] [2, 3, 4, 5] and the parameters are outside the op's rule");
    b = a;
    b.param.i[1] = -1;
    OP_REFUSED(&k, &b, "slice: in[0] [2, 3, 4, 5] and the parameters are outside the op's rule");
    b = a;
    b.param.i[2] = 0;
    OP_REFUSED(&k, &b, "slice: in[0] [2, 3, 4, 5] and the parameters are outside the op's rule");
    b = a;
    b.param.i[2] = 3;
    OP_REFUSED(&k, &b, "slice: out is [2, 3, 2, 5], the op makes [2, 3, 3, 5] of in[0] [2, 3, 4, 5]");
    b = a;
    b.in[0].d.dtype = CW_F16;
    OP_REFUSED(&k, &b, "slice: in[0] is f16, expected f32");
    op_rig_close(&k);
}

int main(void) {
    cw_rng r = {cw_test_seed(23)};
    cw_context *ctx = chaos_context();
    const cw_dtype dts[3] = {CW_F32, CW_F16, CW_BF16};
    for (int d = 0; d < 3; d++) {
        test_conv_slice_conv(ctx, &r, dts[d], 4, 2, 1, 3); /* H: rows 1..3 */
        test_conv_slice_conv(ctx, &r, dts[d], 4, 3, 2, 4); /* W: the last 4 columns */
        test_conv_slice_conv(ctx, &r, dts[d], 5, 2, 1, 4); /* T: the first frame dropped */
        test_conv_slice_conv(ctx, &r, dts[d], 5, 3, 0, 2); /* H: the top half */
        test_slice_exact(ctx, &r, dts[d]);
    }
    test_badargs(ctx);
    cw_context_destroy(ctx);
    test_contract();
    TEST_DONE();
}
