/* Memory reuse across streams is ordered: plans with 1-5 streams and 8 patches per conv
 * (activations big enough to be reused across layers) are checked with a happens-before
 * replay (tests/hb_check.h) for unordered tasks on shared memory, and run under chaos +
 * poison. The determinism contract (docs/determinism.md): every run of every stream count
 * gives the bits of the 1-stream plan with the same patches; the unscheduled plan (other
 * patches, other GEMM shapes) agrees within 1e-5 of the output's scale. Regression test
 * for activation buffers that the allocator ordered only on the allocating stream. The cpu
 * plans give the rows of each conv's input back as its patches pass them (drops.c): the
 * replay checks every access to those rows comes before the drop, and poison turns the
 * drops into NaN fills that a late reader would carry into the output. */
#include "convweave/convweave.h"
#include "hb_check.h"
#include "testutil.h"

static cw_context *ctx;
static cw_tensor *tensors[64];
static int n_tensors;
static cw_rng rng;

static cw_node konst(cw_graph *g, int rank, const int64_t *dims, float scale, float offset) {
    cw_tensor_desc d;
    ASSERT_OK(cw_tensor_desc_make(&d, CW_F32, rank, dims));
    int64_t n = cw_tensor_desc_numel(&d);
    float *h = malloc((size_t)n * sizeof *h);
    for (int64_t i = 0; i < n; i++) h[i] = offset + scale * cw_rng_float(&rng);
    cw_tensor *t;
    ASSERT_OK_CTX(ctx, cw_tensor_create(&t, ctx, &d));
    ASSERT_OK_CTX(ctx, cw_tensor_upload(t, h, (size_t)n * 4));
    free(h);
    tensors[n_tensors++] = t;
    cw_node c;
    ASSERT_OK_CTX(ctx, cw_graph_constant(g, &c, "c", t));
    return c;
}

static cw_node conv3(cw_graph *g, cw_node x, int64_t c) {
    int64_t wd[4] = {c, c, 3, 3};
    cw_conv_params p = CW_CONV_PARAMS_INIT;
    p.pad_pre[0] = p.pad_pre[1] = p.pad_post[0] = p.pad_post[1] = 1;
    cw_node y;
    ASSERT_OK_CTX(ctx, cw_graph_conv(g, &y, x, konst(g, 4, wd, 0.3f, 0.0f), konst(g, 1, &c, 0.1f, 0.0f), &p));
    return y;
}

int main(void) {
    const uint64_t seed = cw_test_seed(11);
    const int64_t C = 8, HW = 192, xd[4] = {1, C, HW, HW};
    int runs = cw_test_quick() ? 2 : 4, plans = 0;
    float *h1 = NULL; /* the 1-stream plan's output: every run must give its bits */
    double worst = 0;
    for (int streams = 1; streams <= 5; streams++) {
        rng.s = seed; /* the same weights and input for every stream count */
        cw_context_config cfg = CW_CONTEXT_CONFIG_INIT;
        cfg.backend = CW_BACKEND_CPU;
        cfg.threads = 2; /* tasks get 2 or 1 threads as the stream count changes */
        cfg.flags = CW_FLAG_POISON | CW_FLAG_CHAOS;
        cfg.chaos_seed = 100 + (uint64_t)streams;
        ASSERT_OK(cw_context_create(&ctx, &cfg));
        cw_graph *g;
        ASSERT_OK(cw_graph_create(&g, ctx));
        cw_tensor_desc d;
        ASSERT_OK(cw_tensor_desc_make(&d, CW_F32, 4, xd));
        /* conv -> GN+SiLU fused into conv -> conv -> conv: each activation is 1.1 MiB (the
         * allocator's large pool), so later layers reuse earlier layers' memory while
         * patches of one conv run on several heavy streams */
        cw_node x, a, h, y;
        ASSERT_OK_CTX(ctx, cw_graph_input(g, &x, "x", &d));
        a = conv3(g, x, C);
        ASSERT_OK_CTX(ctx, cw_graph_group_norm(g, &h, a, konst(g, 1, &C, 0.2f, 1.0f), konst(g, 1, &C, 0.2f, 0.0f), 4,
                                               1e-6f));
        ASSERT_OK_CTX(ctx, cw_graph_silu(g, &h, h));
        h = conv3(g, h, C);
        h = conv3(g, h, C);
        y = conv3(g, h, C);
        ASSERT_OK_CTX(ctx, cw_graph_output(g, y, "y"));
        cw_compile_options o = CW_COMPILE_OPTIONS_INIT, r = CW_COMPILE_OPTIONS_INIT;
        o.policy = CW_PATCHES_FIXED;
        o.patches = 8;
        o.streams = streams;
        o.temp_budget = -1;
        r.policy = CW_PATCHES_NONE;
        cw_plan *p, *pr;
        ASSERT_OK_CTX(ctx, cw_graph_compile(g, &p, &o));
        ASSERT_OK_CTX(ctx, cw_graph_compile(g, &pr, &r));
        ASSERT_TRUE(p->n_drops > 0);
        cw_tensor *in, *out, *ref;
        ASSERT_OK_CTX(ctx, cw_tensor_create(&in, ctx, &d));
        ASSERT_OK_CTX(ctx, cw_tensor_create(&out, ctx, &d));
        ASSERT_OK_CTX(ctx, cw_tensor_create(&ref, ctx, &d));
        size_t bytes = (size_t)cw_tensor_desc_numel(&d) * 4;
        float *hx = malloc(bytes), *hr = malloc(bytes), *ho = malloc(bytes);
        for (size_t i = 0; i < bytes / 4; i++) hx[i] = cw_rng_float(&rng);
        ASSERT_OK(cw_tensor_upload(in, hx, bytes));
        ASSERT_OK_CTX(ctx, cw_plan_run(pr, &in, 1, &ref, 1));
        ASSERT_OK(cw_tensor_download(ref, hr, bytes));
        for (int k = 0; k < runs; k++) {
            ASSERT_OK_CTX(ctx, cw_plan_run(p, &in, 1, &out, 1));
            ASSERT_OK(cw_tensor_download(out, ho, bytes));
            if (!h1) {
                h1 = malloc(bytes);
                memcpy(h1, ho, bytes);
            }
            if (memcmp(ho, h1, bytes) != 0) {
                fprintf(stderr, "streams %d run %d (CONVWEAVE_CHAOS_SEED=%d): output differs from the 1-stream plan's\n",
                        streams, k, 100 + streams);
                cw_test_failures++;
            }
            double md = cw_err_abs(ho, hr, (int64_t)(bytes / 4)), mr = 0;
            for (size_t e = 0; e < bytes / 4; e++) mr = fmax(mr, fabs((double)hr[e]));
            worst = cw_err_max(worst, md / mr);
            if (!(md <= 1e-5 * mr)) {
                fprintf(stderr, "streams %d run %d: max|diff| %.3g vs the unscheduled plan (scale %.3g)\n", streams, k,
                        md, mr);
                cw_test_failures++;
            }
            int hz = hb_check(p);
            if (hz) {
                fprintf(stderr, "streams %d run %d: %d unordered uses of shared memory\n", streams, k, hz);
                cw_test_failures++;
            }
        }
        plans++;
        free(hx), free(hr), free(ho);
        cw_tensor_destroy(in), cw_tensor_destroy(out), cw_tensor_destroy(ref);
        cw_plan_destroy(p), cw_plan_destroy(pr);
        cw_graph_destroy(g);
        for (int i = 0; i < n_tensors; i++) cw_tensor_destroy(tensors[i]);
        n_tensors = 0;
        cw_context_destroy(ctx);
    }
    free(h1);
    printf("%d plans (1-5 streams) x %d runs: happens-before replay, bits equal, max rel diff vs unscheduled %.3g\n",
           plans, runs, worst);
    TEST_DONE();
}
