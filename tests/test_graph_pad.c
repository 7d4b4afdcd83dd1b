/* cw_graph_pad (F.pad's constant and replicate modes over D, H, W) against a naive reference:
 * a conv output padded feeding a conv (HunyuanVideo's causal replicate pad (2, 1, 1) / (0, 1,
 * 1), constant pads in 4-D and 5-D; unscheduled and patched on 3 streams with chaos and
 * poison) in f32, f16 and bf16 graphs; an input padded wider than it is, exact; the
 * builder's argument checks; a replicate pad fused into the conv reading it (after GroupNorm,
 * SiLU and an upsample, HunyuanVideo's with the first frame apart among them); and the op's
 * contract through cw__op_run (bits copied, the fill as stored in each dtype, every mode and
 * rank). */
#include "graph_run.h"

/* y = F.pad of x (rank 4 or 5, xd) by pre/post over (D, H, W) (4-D: H, W; pre[0] = post[0] =
 * 0), elements of es bytes; fill: the es bytes of a constant pad. Each output element's
 * source clamped (replicate) or dropped (constant) per dim, written out here, not shared
 * with the library. */
static void ref_pad(const void *x, int rank, const int64_t *xd, const int64_t pre[3], const int64_t post[3], int mode,
                    const void *fill, size_t es, void *y) {
    int64_t od[5], c[5];
    for (int i = 0; i < rank; i++) od[i] = xd[i];
    for (int k = 3 - (rank - 2); k < 3; k++) od[rank - 3 + k] += pre[k] + post[k];
    const int64_t n = numel(rank, od);
    for (int64_t e = 0; e < n; e++) {
        int64_t q = e, xi = 0;
        int outside = 0;
        for (int i = rank - 1; i >= 0; i--) c[i] = q % od[i], q /= od[i];
        for (int k = 3 - (rank - 2); k < 3; k++) {
            const int j = rank - 3 + k;
            c[j] -= pre[k];
            if (c[j] < 0 || c[j] >= xd[j]) {
                outside = 1;
                c[j] = c[j] < 0 ? 0 : xd[j] - 1;
            }
        }
        for (int i = 0; i < rank; i++) xi = xi * xd[i] + c[i];
        const void *src = outside && mode == CW_PAD_CONSTANT ? fill : (const char *)x + xi * (int64_t)es;
        memcpy((char *)y + e * (int64_t)es, src, es);
    }
}

/* y0 = pad(conv1(x), pre, post, mode, value); y1 = conv2(y0) in a graph of dtype dt. */
static void test_conv_pad_conv(cw_context *ctx, cw_rng *r, cw_dtype dt, int rank, const int64_t pre[3],
                               const int64_t post[3], cw_pad_mode mode, float value) {
    enum { N = 2, C = 3, K = 4 };
    const int64_t x4[4] = {N, C, 5, 6}, x5[5] = {N, C, 3, 4, 5};
    const int64_t *xdims = rank == 5 ? x5 : x4;
    sandwich s;
    sandwich_open(&s, ctx, r, dt, rank, xdims, K, 0.0f);
    int64_t y0dims[5];
    for (int i = 0; i < rank; i++) y0dims[i] = s.c1d.dims[i];
    for (int k = 3 - (rank - 2); k < 3; k++) y0dims[rank - 3 + k] += pre[k] + post[k];
    double *ref0 = malloc((size_t)numel(rank, y0dims) * sizeof *ref0);
    const double fill = rd(value, dt);
    ref_pad(s.c1, rank, s.c1d.dims, pre, post, (int)mode, &fill, sizeof(double), ref0);
    cw_node y0;
    ASSERT_OK_CTX(ctx, cw_graph_pad(s.g, &y0, s.h, pre, post, mode, value));
    /* the pad copies conv1's stored values (and the fill as stored); conv2 adds K*kvol
     * products of those */
    const double u = unit_roundoff(dt);
    const int64_t kvol = s.kvol;
    const double bound[2] = {u + 16.0 * (double)(C * kvol + 4) * FLT_EPSILON,
                             16.0 * u + 16.0 * (double)((C + K) * kvol + 4) * FLT_EPSILON};
    char label[96];
    snprintf(label, sizeof label, "pad %s (%d, %d, %d) / (%d, %d, %d)",
             mode == CW_PAD_REPLICATE ? "replicate" : "constant", (int)pre[0], (int)pre[1], (int)pre[2], (int)post[0],
             (int)post[1], (int)post[2]);
    sandwich_close(&s, y0, y0dims, ref0, bound, label);
    free(ref0);
}

/* 5-D input x in dtype dt padded wider than it is in every dim: y0 replicate, y1 constant
 * 0.1 (as stored) of y0 (a pad of a pad). Exact: bound 0. */
static void test_pad_exact(cw_context *ctx, cw_rng *r, cw_dtype dt) {
    enum { B = 2, CC = 2, T = 2, HH = 3, WW = 2 };
    const int64_t dims[5] = {B, CC, T, HH, WW}, pre0[3] = {3, 0, 5}, post0[3] = {1, 4, 0};
    const int64_t pre1[3] = {0, 2, 1}, post1[3] = {1, 0, 3};
    const int64_t d0[5] = {B, CC, T + 4, HH + 4, WW + 5}, d1[5] = {B, CC, T + 5, HH + 6, WW + 9};
    cw_tensor *tx;
    float *x = rnd_stored(ctx, r, dt, 5, dims, 2.0f, -1.0f, &tx);
    double *xd = malloc((size_t)numel(5, dims) * sizeof *xd);
    double *ref0 = malloc((size_t)numel(5, d0) * sizeof *ref0), *ref1 = malloc((size_t)numel(5, d1) * sizeof *ref1);
    for (int64_t i = 0; i < numel(5, dims); i++) xd[i] = x[i];
    const double fill = rd(0.1f, dt);
    ref_pad(xd, 5, dims, pre0, post0, CW_PAD_REPLICATE, &fill, sizeof(double), ref0);
    ref_pad(ref0, 5, d0, pre1, post1, CW_PAD_CONSTANT, &fill, sizeof(double), ref1);
    cw_node in, y[2];
    cw_graph *g = graph_open(ctx, dt, 5, dims, &in);
    ASSERT_OK_CTX(ctx, cw_graph_pad(g, &y[0], in, pre0, post0, CW_PAD_REPLICATE, 7.0f)); /* value unused */
    ASSERT_OK_CTX(ctx, cw_graph_pad(g, &y[1], y[0], pre1, post1, CW_PAD_CONSTANT, 0.1f));
    cw_tensor_desc yd[2];
    ASSERT_OK(cw_tensor_desc_make(&yd[0], dt, 5, d0));
    ASSERT_OK(cw_tensor_desc_make(&yd[1], dt, 5, d1));
    double *refs[2] = {ref0, ref1};
    const double bound[2] = {0.0, 0.0};
    fprintf(stderr, "5-D input padded (replicate, then constant) past its extent, %s\n", cw__dtype_name(dt));
    check_graph(ctx, g, tx, 2, y, yd, refs, bound);
    cw_tensor_destroy(tx);
    free(x), free(xd), free(ref0), free(ref1);
}

/* A replicate pad read only by a conv fuses into the conv's prep (fusion.c): x -> conv1 ->
 * GroupNorm -> SiLU (-> nearest 2x; up 2: HunyuanVideo's upsampler, frame 0 upsampled in H
 * and W, the other frames in D, H and W, then cat: one upsample with a frame offset, fused too)
 * -> replicate pad -> conv2 (no padding of its own), N = 1.
 * The padded tensor, GroupNorm's and SiLU's outputs are never stored: the patched plan holds
 * less than the same plan with fusion off. Checked against the chain in double, unscheduled
 * (no fusion) and patched (3 patches, 3 streams; each edge patch's rows clamped) under chaos
 * and poison. */
static void test_fused_pad(cw_context *ctx, cw_rng *r, cw_dtype dt, int rank, const int64_t pre[3],
                           const int64_t post[3], int up) {
    enum { C = 3, K = 4, GROUPS = 2 };
    const int64_t x4[4] = {1, C, 7, 5}, x5[5] = {1, C, 3, 7, 5};
    sandwich s;
    sandwich_open(&s, ctx, r, dt, rank, rank == 5 ? x5 : x4, K, 0.0f);
    gn_silu t;
    gn_silu_open(&t, ctx, r, K, GROUPS);
    /* the chain in double: silu(gn(conv1)), upsampled, padded; conv2 of it as floats */
    const int64_t n1 = cw_tensor_desc_numel(&s.c1d), per = n1 / K;
    double *a = malloc((size_t)n1 * sizeof *a);
    gn_silu_ref(&t, s.c1, per, a);
    int64_t ud[5], pd[5];
    for (int i = 0; i < rank; i++) ud[i] = s.c1d.dims[i] * (up && i >= rank - 2 ? 2 : 1);
    if (up == 2) ud[2] = 2 * s.c1d.dims[2] - 1; /* frame 0 once, then every frame twice */
    double *u = malloc((size_t)numel(rank, ud) * sizeof *u);
    for (int64_t e = 0; e < numel(rank, ud); e++) { /* nearest 2x in H and W (and D) */
        int64_t q = e, c[5], src = 0;
        for (int i = rank - 1; i >= 0; i--) c[i] = q % ud[i], q /= ud[i];
        if (up == 2) c[2] = c[2] == 0 ? 0 : 1 + (c[2] - 1) / 2;
        for (int i = 0; i < rank; i++) src = src * s.c1d.dims[i] + (up && i >= rank - 2 ? c[i] / 2 : c[i]);
        u[e] = a[src];
    }
    for (int i = 0; i < rank; i++) pd[i] = ud[i];
    for (int k = 3 - (rank - 2); k < 3; k++) pd[rank - 3 + k] += pre[k] + post[k];
    const int64_t np = numel(rank, pd);
    double *padded = malloc((size_t)np * sizeof *padded);
    ref_pad(u, rank, ud, pre, post, CW_PAD_REPLICATE, NULL, sizeof(double), padded);
    float *pf = malloc((size_t)np * sizeof *pf);
    for (int64_t i = 0; i < np; i++) pf[i] = (float)padded[i];
    cw_conv_params cp0 = s.cp;
    for (int i = 0; i < 3; i++) cp0.pad_pre[i] = cp0.pad_post[i] = 0;
    int64_t w2dims[5] = {K, K, 3, 3, 3};
    cw_tensor_desc pdd, w2d, yd, ydt;
    ASSERT_OK(cw_tensor_desc_make(&pdd, CW_F32, rank, pd));
    ASSERT_OK(cw_tensor_desc_make(&w2d, CW_F32, rank, w2dims));
    ASSERT_OK_CTX(ctx, cw_conv_output_desc(ctx, &yd, &pdd, &w2d, &cp0));
    double *ref = malloc((size_t)cw_tensor_desc_numel(&yd) * sizeof *ref);
    cw_ref_conv(&pdd, pf, &w2d, s.w2, s.bias, &cp0, &yd, ref);
    /* the graph */
    cw_node h = gn_silu_node(&t, ctx, s.g, s.h), y;
    if (up == 1) ASSERT_OK_CTX(ctx, cw_graph_upsample2x(s.g, &h, h));
    if (up == 2) { /* HunyuanVideo's upsampler: the first frame and the rest apart, then a cat */
        const int64_t T = s.c1d.dims[2], f222[3] = {2, 2, 2};
        cw_node first, rest;
        ASSERT_OK_CTX(ctx, cw_graph_slice(s.g, &first, h, 2, 0, 1));
        ASSERT_OK_CTX(ctx, cw_graph_upsample2x(s.g, &first, first));
        ASSERT_OK_CTX(ctx, cw_graph_slice(s.g, &rest, h, 2, 1, T - 1));
        ASSERT_OK_CTX(ctx, cw_graph_upsample_nearest(s.g, &rest, rest, f222));
        ASSERT_OK_CTX(ctx, cw_graph_concat(s.g, &h, first, rest, 2));
    }
    ASSERT_OK_CTX(ctx, cw_graph_pad(s.g, &h, h, pre, post, CW_PAD_REPLICATE, 0.0f));
    ASSERT_OK_CTX(ctx, cw_graph_conv(s.g, &y, h, constant(ctx, s.g, s.tw2), constant(ctx, s.g, s.tb), &cp0));
    ASSERT_OK_CTX(ctx, cw_graph_output(s.g, y, "y"));
    /* fused: the padded tensor (and GroupNorm's, SiLU's, the upsample's outputs) never stored */
    int64_t act[2];
    for (int f = 0; f < 2; f++) {
        cw_compile_options o = CW_COMPILE_OPTIONS_INIT;
        o.policy = CW_PATCHES_FIXED, o.patches = 3, o.streams = 3, o.fuse = f;
        cw_plan *p = NULL;
        ASSERT_OK_CTX(ctx, cw_graph_compile(s.g, &p, &o));
        cw_plan_stats st;
        ASSERT_OK(cw_plan_get_stats(p, &st));
        act[f] = st.activations_peak;
        cw_plan_destroy(p);
    }
    const int64_t c1_bytes = n1 * (int64_t)cw_dtype_size(dt);
    const char *ups = up == 2 ? " -> first frame | rest up (1|2, 2, 2) -> cat" : up ? " -> up2" : "";
    fprintf(stderr, "conv -> gn -> silu%s -> pad replicate (%d, %d, %d) / (%d, %d, %d) -> conv, %d-D, %s: activations "
            "%" PRId64 " B fused, %" PRId64 " B not\n", ups, (int)pre[0], (int)pre[1], (int)pre[2],
            (int)post[0], (int)post[1], (int)post[2], rank, cw__dtype_name(dt), act[1], act[0]);
    CHECK(act[1] < act[0] && act[1] <= 2 * c1_bytes);
    ASSERT_OK(cw_tensor_desc_make(&ydt, dt, rank, yd.dims));
    const double bound = 64.0 * unit_roundoff(dt) + 1e-5;
    double *refs[1] = {ref};
    run_graph(ctx, s.g, s.tx, 1, &ydt, refs, &bound);
    gn_silu_close(&t);
    cw_tensor_destroy(s.tx), cw_tensor_destroy(s.tw1), cw_tensor_destroy(s.tw2), cw_tensor_destroy(s.tb);
    free(s.x), free(s.w1), free(s.w2), free(s.bias), free(s.c1);
    free(a), free(u), free(padded), free(pf), free(ref);
}

static void test_badargs(cw_context *ctx) {
    const int64_t xdims[4] = {1, 2, 4, 5}, x5dims[5] = {1, 2, 3, 4, 5}, flat[2] = {2, 8};
    const int64_t z[3] = {0, 0, 0}, p1[3] = {0, 1, 1}, hy[3] = {2, 1, 1}, neg[3] = {0, 1, -1}, big[3] = {0, 65, 0};
    const int64_t negd[3] = {-2, 0, 0}, max[3] = {0, 64, 64};
    cw_node x, out;
    cw_graph *g = graph_open(ctx, CW_F32, 4, xdims, &x);
    const cw_node x5 = input(ctx, g, "x5", CW_F32, 5, x5dims), m = input(ctx, g, "m", CW_F32, 2, flat);
    cw_tensor *half = upload(ctx, CW_F16, 4, xdims, NULL);
    const cw_node h = constant(ctx, g, half);
    CHECK_REFUSED(ctx, cw_graph_pad(g, &out, x, NULL, p1, CW_PAD_CONSTANT, 0.0f), "cw_graph_pad: pre is NULL");
    CHECK(out == CW_NODE_NONE);
    CHECK_REFUSED(ctx, cw_graph_pad(g, &out, x, p1, NULL, CW_PAD_CONSTANT, 0.0f), "cw_graph_pad: post is NULL");
    CHECK_REFUSED(ctx, cw_graph_pad(g, &out, x, p1, p1, (cw_pad_mode)2, 0.0f),
                  "cw_graph_pad: mode = 2 is not a cw_pad_mode (0..1)");
    CHECK_REFUSED(ctx, cw_graph_pad(g, &out, x, p1, p1, (cw_pad_mode)-1, 0.0f),
                  "cw_graph_pad: mode = -1 is not a cw_pad_mode (0..1)");
    CHECK_REFUSED(ctx, cw_graph_pad(g, &out, x, neg, p1, CW_PAD_CONSTANT, 0.0f),
                  "cw_graph_pad: pre[2] (W) = -1 must be in 0..64");
    CHECK_REFUSED(ctx, cw_graph_pad(g, &out, x5, z, neg, CW_PAD_REPLICATE, 0.0f),
                  "cw_graph_pad: post[2] (W) = -1 must be in 0..64");
    CHECK_REFUSED(ctx, cw_graph_pad(g, &out, x5, negd, z, CW_PAD_REPLICATE, 0.0f),
                  "cw_graph_pad: pre[0] (D) = -2 must be in 0..64");
    CHECK_REFUSED(ctx, cw_graph_pad(g, &out, x5, z, big, CW_PAD_REPLICATE, 0.0f),
                  "cw_graph_pad: post[1] (H) = 65 must be in 0..64");
    CHECK_REFUSED(ctx, cw_graph_pad(g, &out, x, hy, p1, CW_PAD_REPLICATE, 0.0f),
                  "cw_graph_pad: pre[0] = 2 and post[0] = 0 (D) must be 0 for a 4-D x [1, 2, 4, 5]");
    CHECK_REFUSED(ctx, cw_graph_pad(g, &out, m, p1, p1, CW_PAD_CONSTANT, 0.0f),
                  "cw_graph_pad: x must be [N, C, H, W] or [N, C, D, H, W], got [2, 8]");
    CHECK_REFUSED(ctx, cw_graph_pad(g, &out, h, p1, p1, CW_PAD_CONSTANT, 0.0f), "cw_graph_pad: x, constant 'c'");
    CHECK_REFUSED(ctx, cw_graph_pad(g, &out, 99, p1, p1, CW_PAD_CONSTANT, 0.0f),
                  "cw_graph_pad: x = 99 is not a node of this graph");
    ASSERT_STATUS(cw_graph_pad(g, NULL, x, p1, p1, CW_PAD_CONSTANT, 0.0f), CW_ERR_INVALID_ARG);
    ASSERT_STATUS(cw_graph_pad(NULL, &out, x, p1, p1, CW_PAD_CONSTANT, 0.0f), CW_ERR_INVALID_ARG);
    cw_tensor_desc d;
    ASSERT_OK_CTX(ctx, cw_graph_pad(g, &out, x5, hy, p1, CW_PAD_REPLICATE, 0.0f)); /* HunyuanVideo's */
    ASSERT_OK_CTX(ctx, cw_graph_get_node_desc(g, &d, out));
    CHECK(d.rank == 5 && d.dims[1] == 2 && d.dims[2] == 5 && d.dims[3] == 6 && d.dims[4] == 7 && d.dtype == CW_F32);
    ASSERT_OK_CTX(ctx, cw_graph_pad(g, &out, x, z, max, CW_PAD_CONSTANT, NAN)); /* NaN fills are F.pad's too */
    ASSERT_OK_CTX(ctx, cw_graph_get_node_desc(g, &d, out));
    CHECK(d.rank == 4 && d.dims[2] == 68 && d.dims[3] == 69);
    ASSERT_OK_CTX(ctx, cw_graph_pad(g, &out, x, z, z, CW_PAD_CONSTANT, 0.0f));
    ASSERT_OK_CTX(ctx, cw_graph_get_node_desc(g, &d, out));
    CHECK(d.rank == 4 && d.dims[2] == 4 && d.dims[3] == 5);
    cw_graph_destroy(g);
    cw_tensor_destroy(half);
}

/* The contract in front of the backends: distinct bit patterns (NaN payloads among them)
 * copied exactly, the fill -2.5 as stored in each dtype, in every dtype, rank and mode, and
 * each violation refused by name. */
static void test_contract(void) {
    op_rig k;
    op_rig_open(&k);
    enum { NX = 2 * 3 * 2 * 3 * 4, NY = 4096 };
    static uint32_t x[NX], y[NY + 1], want[NY];
    for (int i = 0; i < NX; i++) x[i] = 0x7fc00001u + 0x00010203u * (uint32_t)i;
    const int64_t x4[4] = {2, 3, 3, 4}, x5[5] = {2, 3, 2, 3, 4};
    const int64_t pads[4][2][3] = {{{0, 0, 0}, {0, 0, 0}},
                                   {{0, 1, 1}, {0, 1, 1}},
                                   {{2, 1, 0}, {0, 3, 5}},
                                   {{1, 4, 2}, {3, 0, 6}}};
    const cw_dtype dts[3] = {CW_F32, CW_F16, CW_BF16};
    const uint32_t fills[3] = {0xc0200000u, 0xc100u, 0xc020u}; /* -2.5 in f32, f16, bf16 */
    for (int di = 0; di < 3; di++)
        for (int rank = 4; rank <= 5; rank++)
            for (int mode = 0; mode < 2; mode++)
                for (int pi = 0; pi < 4; pi++) {
                    const int64_t *xd = rank == 5 ? x5 : x4;
                    int64_t pre[3], post[3], od[5];
                    memcpy(pre, pads[pi][0], sizeof pre), memcpy(post, pads[pi][1], sizeof post);
                    if (rank == 4) pre[0] = post[0] = 0;
                    for (int i = 0; i < rank; i++) od[i] = xd[i];
                    for (int j = 3 - (rank - 2); j < 3; j++) od[rank - 3 + j] += pre[j] + post[j];
                    const size_t es = cw_dtype_size(dts[di]);
                    const int64_t n = numel(rank, od);
                    ASSERT_TRUE(n <= NY);
                    cw__op_args a;
                    memset(&a, 0, sizeof a);
                    memset(y, 0, sizeof y);
                    a.code = CW_OP_PAD;
                    a.param.i[0] = mode, a.param.i[1] = cw_pad_pack(pre), a.param.i[2] = cw_pad_pack(post);
                    a.param.f[0] = -2.5f;
                    ASSERT_OK(cw_tensor_desc_make(&a.in[0].d, dts[di], rank, xd));
                    ASSERT_OK(cw_tensor_desc_make(&a.out.d, dts[di], rank, od));
                    a.in[0].data = x, a.out.data = y;
                    OP_RUN(&k, &a);
                    const uint16_t f16 = (uint16_t)fills[di];
                    ref_pad(x, rank, xd, pre, post, mode, es == 4 ? (const void *)&fills[di] : (const void *)&f16, es,
                            want);
                    const int bad = memcmp(y, want, (size_t)n * es) != 0 ||
                                    memcmp((char *)y + n * (int64_t)es, "\0\0\0\0", es) != 0;
                    if (bad)
                        fprintf(stderr, "pad %s rank %d mode %d pads %d: bits differ\n", cw__dtype_name(dts[di]), rank,
                                mode, pi);
                    CHECK(!bad);
                }

    /* a strided out: [2, 3, 3, 6] written into every other W element of [2, 3, 3, 12] */
    cw__op_args a;
    memset(&a, 0, sizeof a);
    memset(y, 0, sizeof y);
    const int64_t pre[3] = {0, 0, 1}, post[3] = {0, 0, 1}, od[4] = {2, 3, 3, 6};
    a.code = CW_OP_PAD;
    a.param.i[0] = CW_PAD_REPLICATE, a.param.i[1] = cw_pad_pack(pre), a.param.i[2] = cw_pad_pack(post);
    ASSERT_OK(cw_tensor_desc_make(&a.in[0].d, CW_F32, 4, x4));
    ASSERT_OK(cw_tensor_desc_make(&a.out.d, CW_F32, 4, od));
    a.out.d.strides[0] = 108, a.out.d.strides[1] = 36, a.out.d.strides[2] = 12, a.out.d.strides[3] = 2;
    a.in[0].data = x, a.out.data = y;
    OP_RUN(&k, &a);
    ref_pad(x, 4, x4, pre, post, CW_PAD_REPLICATE, NULL, 4, want);
    int bad = 0;
    for (int i = 0; i < 2 * 3 * 3 * 6; i++) bad |= y[2 * i] != want[i] || y[2 * i + 1] != 0;
    CHECK(!bad);
    a.out.d.strides[0] = a.out.d.strides[1] = a.out.d.strides[2] = a.out.d.strides[3] = 0;

    cw__op_args b = a;
    b.param.i[0] = 2;
    OP_REFUSED(&k, &b, "pad: in[0] [2, 3, 3, 4] and the parameters are outside the op's rule");
    b = a;
    const int64_t d1[3] = {1, 0, 1};
    b.param.i[1] = cw_pad_pack(d1); /* a D pad of a 4-D view */
    OP_REFUSED(&k, &b, "pad: in[0] [2, 3, 3, 4] and the parameters are outside the op's rule");
    b = a;
    const int64_t w65[3] = {0, 0, 65};
    b.param.i[2] = cw_pad_pack(w65);
    OP_REFUSED(&k, &b, "pad: in[0] [2, 3, 3, 4] and the parameters are outside the op's rule");
    b = a;
    b.param.i[1] = -1; /* a negative pad spills into every field */
    OP_REFUSED(&k, &b, "pad: in[0] [2, 3, 3, 4] and the parameters are outside the op's rule");
    b = a;
    b.param.i[1] = (int64_t)1 << 48;
    OP_REFUSED(&k, &b, "pad: in[0] [2, 3, 3, 4] and the parameters are outside the op's rule");
    b = a;
    b.out.d.dims[3] = 5;
    OP_REFUSED(&k, &b, "pad: out is [2, 3, 3, 5], the op makes [2, 3, 3, 6] of in[0] [2, 3, 3, 4]");
    b = a;
    b.in[0].d.dtype = CW_BF16;
    OP_REFUSED(&k, &b, "pad: in[0] is bf16, expected f32");
    op_rig_close(&k);
}

int main(void) {
    cw_rng r = {cw_test_seed(29)};
    cw_context *ctx = chaos_context();
    const cw_dtype dts[3] = {CW_F32, CW_F16, CW_BF16};
    const int64_t hy_pre[3] = {2, 1, 1}, hy_post[3] = {0, 1, 1}; /* HunyuanVideo's causal conv */
    const int64_t c4_pre[3] = {0, 1, 2}, c4_post[3] = {0, 3, 0}, c5_pre[3] = {0, 0, 1}, c5_post[3] = {1, 2, 0};
    for (int d = 0; d < 3; d++) {
        test_conv_pad_conv(ctx, &r, dts[d], 5, hy_pre, hy_post, CW_PAD_REPLICATE, 0.0f);
        test_conv_pad_conv(ctx, &r, dts[d], 4, c4_pre, c4_post, CW_PAD_CONSTANT, 0.3f);
        test_conv_pad_conv(ctx, &r, dts[d], 5, c5_pre, c5_post, CW_PAD_CONSTANT, 0.0f);
        test_conv_pad_conv(ctx, &r, dts[d], 4, c4_post, c4_pre, CW_PAD_REPLICATE, 0.0f);
        test_pad_exact(ctx, &r, dts[d]);
    }
    const int64_t z[3] = {0, 0, 0}, p11[3] = {0, 1, 1}, p12[3] = {0, 1, 2}, p21[3] = {0, 2, 1};
    for (int d = 0; d < 3; d += 2) { /* f32, bf16 */
        test_fused_pad(ctx, &r, dts[d], 5, hy_pre, hy_post, 0);
        test_fused_pad(ctx, &r, dts[d], 4, p11, p11, 0);
        test_fused_pad(ctx, &r, dts[d], 4, p12, p21, 1);
        test_fused_pad(ctx, &r, dts[d], 5, z, p11, 1);
        test_fused_pad(ctx, &r, dts[d], 5, hy_pre, hy_post, 2);
    }
    test_badargs(ctx);
    cw_context_destroy(ctx);
    test_contract();
    TEST_DONE();
}
