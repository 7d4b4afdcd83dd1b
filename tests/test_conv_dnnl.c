/* oneDNN as a cpu patch algorithm (CONVWEAVE_DNNL; skips with 77 when built without it).
 * 1. Budget: 2-D and 3-D conv graphs compiled under budgets from the smallest that works
 *    to loose ones pick cpu_dnnl_* where it is fastest, and the allocator never holds more
 *    temporary memory than the budget, with oneDNN's blocked inputs/outputs, reordered
 *    weights and scratchpads all counted (they are the algorithm's workspace). Results
 *    stay within 1e-5 of the unscheduled plan's scale.
 * 2. Determinism (docs/determinism.md): a fixed-patch plan on 1-3 streams with 1-3 threads
 *    per task, under chaos + poison, gives the bits of the first plan on every run; and a
 *    oneDNN patch run directly on 1-4 threads gives identical bits. A split of oneDNN's work
 *    that followed the thread count would fail this on any CPU whose kernels' bits follow
 *    the split. */
#include "backend/cpu/cpu.h"
#include "conv_algo_run.h"
#include "conv_ref.h"

/* 3x3x3 in 3-D */
static conv_graph_spec spec(int sp) {
    conv_graph_spec g = {sp, 3, 0.2f};
    return g;
}

/* Part 1: budgets from the minimum up; temp_peak never above the budget. */
static void test_budget(int sp, const int64_t *xd) {
    cw_context_config cfg = CW_CONTEXT_CONFIG_INIT;
    cfg.backend = CW_BACKEND_CPU;
    cfg.threads = 2;
    ASSERT_OK(cw_context_create(&ctx, &cfg));
    cw_tensor_desc d;
    const conv_graph_spec gs = spec(sp);
    cw_graph *g = make_graph(&gs, xd, &d);
    cw_compile_options r = CW_COMPILE_OPTIONS_INIT;
    r.policy = CW_PATCHES_NONE;
    cw_plan *pr;
    ASSERT_OK_CTX(ctx, cw_graph_compile(g, &pr, &r));
    cw_tensor *in, *out, *ref;
    ASSERT_OK_CTX(ctx, cw_tensor_create(&in, ctx, &d));
    ASSERT_OK_CTX(ctx, cw_tensor_create(&out, ctx, &d));
    ASSERT_OK_CTX(ctx, cw_tensor_create(&ref, ctx, &d));
    const size_t n = (size_t)cw_tensor_desc_numel(&d), bytes = n * 4;
    float *hx = malloc(bytes), *hr = malloc(bytes), *ho = malloc(bytes);
    ASSERT_TRUE(hx && hr && ho);
    for (size_t i = 0; i < n; i++) hx[i] = cw_rng_float(&rng);
    ASSERT_OK(cw_tensor_upload(in, hx, bytes));
    ASSERT_OK_CTX(ctx, cw_plan_run(pr, &in, 1, &ref, 1));
    ASSERT_OK(cw_tensor_download(ref, hr, bytes));
    double *hrd = malloc(n * sizeof *hrd); /* the unscheduled plan's output, to compare against */
    ASSERT_TRUE(hrd);
    for (size_t i = 0; i < n; i++) hrd[i] = hr[i];

    cw_compile_options o = CW_COMPILE_OPTIONS_INIT;
    o.streams = 3;
    int64_t minb = 0;
    ASSERT_OK_CTX(ctx, cw_graph_min_budget(g, &minb, &o));
    /* the allocator rounds large blocks to MiB: oneDNN's workspace starts to fit at a few MiB */
    const int64_t mib = 1 << 20;
    const int64_t budgets[9] = {minb, 1 * mib, 2 * mib, 3 * mib, 4 * mib, 5 * mib, 6 * mib, 8 * mib, 64 * mib};
    int n_dnnl = 0;
    for (int b = 0; b < 9; b++) {
        o.temp_budget = budgets[b];
        cw_plan *p;
        ASSERT_OK_CTX(ctx, cw_graph_compile(g, &p, &o));
        ASSERT_OK_CTX(ctx, cw_plan_run(p, &in, 1, &out, 1));
        ASSERT_OK(cw_tensor_download(out, ho, bytes));
        cw_plan_stats st;
        ASSERT_OK(cw_plan_get_stats(p, &st));
        int dn = describes(p, "cpu_dnnl");
        n_dnnl += dn;
        ASSERT_LE_I(st.temp_peak, budgets[b]);
        double e = max_rel_diff(ho, hrd, n);
        fprintf(stderr, "%d-D budget %8.3f MiB: %lld patches, temp peak %8.3f MiB (predicted %8.3f), dnnl %s, rel diff %.3g\n",
                sp, (double)budgets[b] / (1 << 20), (long long)st.n_patches, (double)st.temp_peak / (1 << 20),
                (double)st.temp_predicted / (1 << 20), dn ? "yes" : "no", e);
        CHECK(e <= 1e-5);
        cw_plan_destroy(p);
    }
    CHECK(n_dnnl >= 2); /* oneDNN is the fastest algorithm for these shapes once it fits */
    free(hx), free(hr), free(ho), free(hrd);
    cw_tensor_destroy(in), cw_tensor_destroy(out), cw_tensor_destroy(ref);
    cw_plan_destroy(pr);
    cw_graph_destroy(g);
    free_consts();
    cw_context_destroy(ctx);
}

/* Part 2a: fixed patches on 1-3 streams and 1-3 threads: every run gives the same bits. */
static void test_streams_threads(void) {
    const int64_t xd[4] = {1, 32, 80, 72};
    const conv_graph_spec gs = spec(2);
    check_streams_threads(&gs, xd, "cpu_dnnl");
}

/* Part 2b: one oneDNN patch (3x3(x3), padding 1 on every side, several sub-bands) on 1-4
 * threads: the same bits on each, within 1e-5 of the double reference. min_subs: the
 * sub-bands it must have (a 3-D patch one row tall is cut along D: both threads). */
static void test_direct_threads(int sp, const int64_t *xd, int min_subs, int even) {
    cw__conv_problem p;
    memset(&p, 0, sizeof p);
    p.spatial = sp;
    p.groups = 1;
    p.has_bias = 1;
    cw_conv_params cp = CW_CONV_PARAMS_INIT;
    cp.spatial = sp;
    for (int i = 0; i < 3; i++) {
        p.stride[i] = p.dilation[i] = 1, p.pad_pre[i] = p.pad_post[i] = 1;
        cp.pad_pre[i] = cp.pad_post[i] = 1;
    }
    int64_t wd[5] = {xd[1], xd[1], 3, 3, 3};
    ASSERT_OK(cw_tensor_desc_make(&p.x, CW_F32, sp + 2, xd));
    ASSERT_OK(cw_tensor_desc_make(&p.w, CW_F32, sp + 2, wd));
    ASSERT_OK(cw_tensor_desc_make(&p.y, CW_F32, sp + 2, xd));
    cw_context_config cfg = CW_CONTEXT_CONFIG_INIT;
    cfg.backend = CW_BACKEND_CPU;
    ASSERT_OK(cw_context_create(&ctx, &cfg));
    cw__dnnl_info info;
    int listed = 0;
    ASSERT_OK_CTX(ctx, cw__cpu_dnnl_cost(ctx, &p, &info, &listed));
    if (info.subbands < min_subs || (even && info.subbands % 2)) {
        fprintf(stderr, "%d-D oneDNN patch of %lld rows: %d sub-bands, want >= %d%s\n", sp, (long long)xd[sp],
                info.subbands, min_subs, even ? " and even" : "");
        cw_test_failures++;
    }
    const int64_t nx = cw_tensor_desc_numel(&p.x), nw = cw_tensor_desc_numel(&p.w);
    float *x = malloc((size_t)nx * 4), *w = malloc((size_t)nw * 4), *b = malloc((size_t)wd[0] * 4);
    float *y0 = malloc((size_t)nx * 4), *y = malloc((size_t)nx * 4);
    double *ref = malloc((size_t)nx * sizeof *ref);
    ASSERT_TRUE(x && w && b && y0 && y && ref);
    for (int64_t i = 0; i < nx; i++) x[i] = cw_rng_float(&rng);
    for (int64_t i = 0; i < nw; i++) w[i] = cw_rng_float(&rng);
    for (int64_t i = 0; i < wd[0]; i++) b[i] = cw_rng_float(&rng);
    int64_t wsb = cw__cpu_conv_workspace(&p, CW__CPU_ALGO_DNNL);
    ASSERT_TRUE(wsb > 0);
    float *ws = malloc((size_t)wsb);
    ASSERT_TRUE(ws);
    for (int t = 1; t <= 4; t++) {
        float *dst = t == 1 ? y0 : y;
        cw__cpu_conv_run(&p, CW__CPU_ALGO_DNNL, x, w, b, dst, ws, t);
        if (t > 1 && memcmp(y, y0, (size_t)nx * 4) != 0) {
            fprintf(stderr, "%d-D oneDNN patch: %d threads give other bits than 1\n", sp, t);
            cw_test_failures++;
        }
    }
    cw_ref_conv(&p.x, x, &p.w, w, b, &cp, &p.y, ref);
    const double e = cw_ref_rel_err(&p.y, y0, ref);
    if (!(e <= 1e-5)) {
        fprintf(stderr, "%d-D oneDNN patch of %lld rows: relative error %.3g against the reference\n", sp,
                (long long)xd[sp], e);
        cw_test_failures++;
    }
    free(x), free(w), free(b), free(y0), free(y), free(ref), free(ws);
    cw_context_destroy(ctx);
    ctx = NULL;
}

int main(void) {
    if (!cw__cpu_dnnl_compiled()) {
        fprintf(stderr, "built without oneDNN (CONVWEAVE_DNNL=OFF): skipped\n");
        return CW_TEST_SKIP;
    }
    rng.s = cw_test_seed(0xD11Full);
    const int64_t x2[4] = {1, 32, 96, 80}, x3[5] = {1, 16, 6, 40, 36};
    test_budget(2, x2);
    test_budget(3, x3);
    test_streams_threads();
    const int64_t d2[4] = {1, 24, 61, 50}, d3[5] = {1, 16, 5, 37, 30}, thin[5] = {1, 64, 16, 1, 48};
    test_direct_threads(2, d2, 2, 0);
    test_direct_threads(3, d3, 2, 0);
    test_direct_threads(3, thin, 2, 0);
    /* an odd number of row sub-bands (5 one-row ones; 3 in 2-D) is cut in a grid along D
     * (W in 2-D), so that 2 threads end together: 10 and 6 sub-bands */
    const int64_t odd3[5] = {1, 64, 17, 5, 40}, odd2[4] = {1, 128, 3, 64};
    test_direct_threads(3, odd3, 10, 1);
    test_direct_threads(2, odd2, 6, 1);
    /* ctest runs this with OMP_NUM_THREADS=4: a oneDNN call that kept the OpenMP default
     * (a split that follows the thread count) shows here on any CPU, even where oneDNN's
     * kernels give the same bits for every split (this AVX2 host's jit:avx2 do) */
    ASSERT_EQ_I(cw__cpu_dnnl_threads_seen(), 1);
    TEST_DONE();
}
