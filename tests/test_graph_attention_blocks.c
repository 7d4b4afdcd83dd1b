/* cw_graph_attention_blocks: q, k, v from three convs of x, attention under a block-causal
 * mask (HunyuanVideo's frames: block = H * W; also block 1 and a block that does not divide
 * the tokens) and a block-diagonal one (Wan's per-frame attention), against a naive
 * double-precision attention whose masked scores are skipped.
 * Unscheduled, at an unlimited budget and at the smallest budget (query chunks that straddle
 * blocks) on 1 and 3 streams, in f32, f16 and bf16; the builder's argument checks. */
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <string.h>

#include "conv_ref.h"
#include "convweave/convweave.h"
#include "graph_run.h"
#include "testutil.h"

/* y = attention(q, k, v) per sample over T tokens, scores scale * q.k, keys s with
 * s / block <= t / block (causal) or s / block == t / block (diagonal). q, k, v, y: [N, C, T]
 * in double. */
static void ref_attention(int64_t N, int64_t C, int64_t T, double scale, int64_t block, int diag, const double *q,
                          const double *k, const double *v, double *y) {
    double *s = malloc((size_t)T * sizeof *s);
    for (int64_t n = 0; n < N; n++) {
        const double *qn = q + n * C * T, *kn = k + n * C * T, *vn = v + n * C * T;
        double *yn = y + n * C * T;
        for (int64_t t = 0; t < T; t++) {
            const int64_t K = (t / block + 1) * block < T ? (t / block + 1) * block : T;
            const int64_t J = diag ? t / block * block : 0;
            double m = -INFINITY, z = 0.0;
            for (int64_t j = J; j < K; j++) {
                double d = 0.0;
                for (int64_t c = 0; c < C; c++) d += qn[c * T + t] * kn[c * T + j];
                s[j] = scale * d;
                if (s[j] > m) m = s[j];
            }
            for (int64_t j = J; j < K; j++) z += (s[j] = exp(s[j] - m));
            for (int64_t c = 0; c < C; c++) {
                double a = 0.0;
                for (int64_t j = J; j < K; j++) a += s[j] * vn[c * T + j];
                yn[c * T + t] = a / z;
            }
        }
    }
    free(s);
}

/* Compiles g under opt's budget and streams, runs it on x and checks y against ref. */
static void run_case(cw_context *ctx, cw_graph *g, const cw_compile_options *opt, cw_tensor *x,
                     const cw_tensor_desc *yd, const double *ref, double bound, const char *what) {
    cw_plan *p;
    ASSERT_OK_CTX(ctx, cw_graph_compile(g, &p, opt));
    cw_tensor *y = upload(ctx, yd->dtype, yd->rank, yd->dims, NULL);
    ASSERT_OK_CTX(ctx, cw_plan_run(p, &x, 1, &y, 1));
    const int64_t n = cw_tensor_desc_numel(yd);
    const size_t es = cw_dtype_size(yd->dtype);
    void *raw = malloc((size_t)n * es);
    float *yf = malloc((size_t)n * sizeof *yf);
    ASSERT_OK_CTX(ctx, cw_tensor_download(y, raw, (size_t)n * es));
    ASSERT_OK(cw_dtype_convert(yf, CW_F32, raw, yd->dtype, n));
    cw_tensor_desc fd = *yd;
    fd.dtype = CW_F32;
    const double err = cw_ref_rel_err(&fd, yf, ref);
    if (!(err <= bound))
        fprintf(stderr, "%s %s: relative error %g > %g\n", what, cw__dtype_name(yd->dtype), err, bound);
    CHECK(err <= bound);
    free(raw), free(yf);
    cw_tensor_destroy(y);
    cw_plan_destroy(p);
}

/* x [dims] -> q, k, v (3x3 convs, padding 1, C -> C) -> attention under mask's blocks. */
static void test_blocks(cw_context *ctx, cw_rng *r, cw_dtype dt, int rank, const int64_t *dims, int64_t block,
                        cw_attention_mask mask) {
    const int64_t N = dims[0], C = dims[1];
    int64_t T = 1, wdims[5] = {C, C, 3, 3, 3};
    for (int i = 2; i < rank; i++) T *= dims[i];
    cw_conv_params cp = CW_CONV_PARAMS_INIT;
    cp.spatial = rank - 2;
    for (int i = 0; i < rank - 2; i++) cp.pad_pre[i] = cp.pad_post[i] = 1;
    cw_tensor *tx, *tw[3], *tb;
    float *x = rnd_stored(ctx, r, dt, rank, dims, 1.0f, 0.0f, &tx), *w[3], *b;
    for (int a = 0; a < 3; a++) w[a] = rnd_stored(ctx, r, dt, rank, wdims, 0.4f, 0.0f, &tw[a]);
    b = rnd_stored(ctx, r, dt, 1, &C, 0.1f, 0.0f, &tb);
    cw_tensor_desc xd, wd, yd;
    ASSERT_OK(cw_tensor_desc_make(&xd, CW_F32, rank, dims));
    ASSERT_OK(cw_tensor_desc_make(&wd, CW_F32, rank, wdims));
    const int64_t n = N * C * T;
    double *qkv[3], *ref = malloc((size_t)n * sizeof *ref);
    for (int a = 0; a < 3; a++) {
        qkv[a] = malloc((size_t)n * sizeof *qkv[a]);
        cw_ref_conv(&xd, x, &wd, w[a], b, &cp, &xd, qkv[a]);
        /* the graph stores q, k and v in dt: round the reference's operands the same way */
        for (int64_t i = 0; i < n; i++) qkv[a][i] = rd((float)qkv[a][i], dt);
    }
    const float scale = 1.0f / sqrtf((float)C);
    ref_attention(N, C, T, scale, block, mask == CW_ATTENTION_BLOCK_DIAGONAL, qkv[0], qkv[1], qkv[2], ref);

    cw_graph *g;
    cw_node in;
    g = graph_open(ctx, dt, rank, dims, &in);
    cw_node nodes[3], y;
    const cw_node bn = constant(ctx, g, tb);
    for (int a = 0; a < 3; a++) ASSERT_OK_CTX(ctx, cw_graph_conv(g, &nodes[a], in, constant(ctx, g, tw[a]), bn, &cp));
    ASSERT_OK_CTX(ctx, cw_graph_attention_blocks(g, &y, nodes[0], nodes[1], nodes[2], scale, block, mask));
    ASSERT_OK_CTX(ctx, cw_graph_output(g, y, "y"));
    ASSERT_OK(cw_tensor_desc_make(&yd, dt, rank, dims));
    /* f32: a few ulps of the softmax's sums; half: the output's rounding and the f32 sums */
    const double bound = dt == CW_F32 ? 1e-5 : 4 * unit_roundoff(dt);
    fprintf(stderr, "%s attention %d-D T %" PRId64 " block %" PRId64 " %s\n",
            mask == CW_ATTENTION_BLOCK_CAUSAL ? "block-causal" : "block-diagonal", rank, T, block, cw__dtype_name(dt));
    cw_compile_options opt = CW_COMPILE_OPTIONS_INIT;
    opt.policy = CW_PATCHES_NONE;
    run_case(ctx, g, &opt, tx, &yd, ref, bound, "unscheduled");
    for (int s = 1; s <= 3; s += 2) {
        opt = (cw_compile_options)CW_COMPILE_OPTIONS_INIT;
        opt.streams = s;
        opt.temp_budget = -1;
        run_case(ctx, g, &opt, tx, &yd, ref, bound, "unlimited");
        int64_t least = 0;
        ASSERT_OK_CTX(ctx, cw_graph_min_budget(g, &least, &opt));
        opt.temp_budget = least;
        run_case(ctx, g, &opt, tx, &yd, ref, bound, "least budget");
    }
    cw_graph_destroy(g);
    cw_tensor_destroy(tx), cw_tensor_destroy(tb);
    for (int a = 0; a < 3; a++) cw_tensor_destroy(tw[a]), free(w[a]), free(qkv[a]);
    free(x), free(b), free(ref);
}

static void test_badargs(cw_context *ctx) {
    const int64_t dims[5] = {1, 2, 2, 3, 4};
    const cw_attention_mask causal = CW_ATTENTION_BLOCK_CAUSAL;
    cw_node x, y;
    cw_graph *g = graph_open(ctx, CW_F32, 5, dims, &x);
    CHECK_REFUSED(ctx, cw_graph_attention_blocks(g, &y, x, x, x, 1.0f, 0, causal), "block = 0 must be >= 1");
    CHECK(y == CW_NODE_NONE);
    CHECK_REFUSED(ctx, cw_graph_attention_blocks(g, &y, x, x, x, 1.0f, 25, causal), "block = 25 must be in 1..24");
    CHECK_REFUSED(ctx, cw_graph_attention_blocks(g, &y, x, x, x, 1.0f, 4, (cw_attention_mask)2),
                  "mask = 2 is not a cw_attention_mask");
    CHECK_REFUSED(ctx, cw_graph_attention_blocks(g, &y, x, x, x, 0.0f, 4, causal), "scale = 0 must be > 0");
    CHECK_REFUSED(ctx, cw_graph_attention_blocks(g, &y, x, 99, x, 1.0f, 4, causal), "k");
    ASSERT_OK_CTX(ctx, cw_graph_attention_blocks(g, &y, x, x, x, 1.0f, 24, causal)); /* one block: no mask */
    cw_graph_destroy(g);
}

int main(void) {
    cw_rng r = {cw_test_seed(41)};
    cw_context *ctx = chaos_context();
    const int64_t video[5] = {2, 4, 3, 2, 3}, image[4] = {1, 5, 4, 5};
    const cw_attention_mask causal = CW_ATTENTION_BLOCK_CAUSAL, diag = CW_ATTENTION_BLOCK_DIAGONAL;
    static const cw_dtype dts[3] = {CW_F32, CW_F16, CW_BF16};
    for (int d = 0; d < 3; d++) {
        test_blocks(ctx, &r, dts[d], 5, video, 6, causal); /* HunyuanVideo: a frame of H * W tokens */
        test_blocks(ctx, &r, dts[d], 4, image, 1, causal); /* the causal mask */
        test_blocks(ctx, &r, dts[d], 5, video, 6, diag);   /* Wan: attention within each frame */
    }
    test_blocks(ctx, &r, CW_F32, 4, image, 7, causal);  /* blocks that do not divide T */
    test_blocks(ctx, &r, CW_F32, 4, image, 7, diag);
    test_blocks(ctx, &r, CW_F32, 5, video, 18, causal); /* one block: plain attention */
    test_blocks(ctx, &r, CW_F32, 4, image, 1, diag);    /* each token sees itself alone: y = v */
    test_badargs(ctx);
    cw_context_destroy(ctx);
    TEST_DONE();
}
