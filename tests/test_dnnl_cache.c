/* What oneDNN's plans hold between calls (CONVWEAVE_DNNL; skips with 77 without it).
 * 1. Compiling costs candidate patch heights from primitive descriptors only: the
 *    primitives made at compile time are those of the patches the plan runs (at most one
 *    plan per patch), not one set per candidate the planner weighed.
 * 2. A run makes no primitive: the patches are prepared with the views the run gives them
 *    (a conv fed by a fused GroupNorm + SiLU + upsampling stage reads that stage's compact
 *    buffer, not the activation's view).
 * 3. A compiled plan holds the oneDNN plans its tasks run until it is destroyed:
 *    cw_context_empty_cache drops only what nothing holds, and the plan still runs without
 *    making a primitive; cw_plan_release (which gives back the plan's arenas) keeps them,
 *    and the released plan runs again to the same bits without making a primitive; once
 *    it is destroyed, empty_cache drops its plans too.
 * 4. The cache keeps at most DN_CACHE_BYTES (64 MiB, as it charges them) of plans nothing
 *    else holds, and destroying the last context empties it.
 * 5. A problem is costed once: compiling the same graph again (as the memory ladder does for
 *    every step) makes no descriptor and gives the same plan; cw_context_empty_cache drops
 *    the kept costings, and the next compile costs afresh, to the same plan. */
#include "backend/cpu/cpu.h"
#include "conv_algo_run.h"

static cw__dnnl_stats stats_now(void) {
    cw__dnnl_stats s;
    cw__cpu_dnnl_stats(&s);
    return s;
}

/* The tests' context: cpu, one thread. */
static void open_cpu1(void) {
    cw_context_config cfg = CW_CONTEXT_CONFIG_INIT;
    cfg.backend = CW_BACKEND_CPU;
    cfg.threads = 1;
    ASSERT_OK(cw_context_create(&ctx, &cfg));
}

/* The context (open_cpu1) and the conv chain of parts 1 and 5 on an input of dims xd. */
static cw_graph *open_chain(const int64_t *xd, cw_tensor_desc *d) {
    open_cpu1();
    const conv_graph_spec gs = {2, 3, 0.2f};
    return make_graph(&gs, xd, d);
}

/* Part 1: a 2-stream compile under a tight budget builds at most one plan per patch. */
static void test_compile_builds_only_kept(void) {
    const int64_t xd[4] = {1, 32, 96, 80};
    cw_tensor_desc d;
    cw_graph *g = open_chain(xd, &d);
    cw_compile_options o = CW_COMPILE_OPTIONS_INIT;
    o.streams = 2;
    o.temp_budget = 2 << 20;
    const cw__dnnl_stats s0 = stats_now();
    cw_plan *p;
    ASSERT_OK_CTX(ctx, cw_graph_compile(g, &p, &o));
    const cw__dnnl_stats s1 = stats_now();
    cw_plan_stats ps;
    ASSERT_OK(cw_plan_get_stats(p, &ps));
    const int dn = describes(p, "cpu_dnnl");
    fprintf(stderr, "compile: %lld patches (dnnl %s); %lld descriptors, %lld primitives, %lld plans built\n",
            (long long)ps.n_patches, dn ? "yes" : "no", (long long)(s1.pds - s0.pds),
            (long long)(s1.primitives - s0.primitives), (long long)(s1.plans_built - s0.plans_built));
    CHECK(dn);
    CHECK(s1.pds - s0.pds > 0);
    ASSERT_LE_I(s1.plans_built - s0.plans_built, ps.n_patches);
    cw_plan_destroy(p);
    cw_graph_destroy(g);
    free_consts();
    cw_context_destroy(ctx);
}

/* conv -> GroupNorm -> SiLU -> upsample x2 -> conv; x: [1, 32, H, W]. */
static cw_graph *prep_graph(const int64_t *xd, cw_tensor_desc *d) {
    cw_graph *g;
    ASSERT_OK(cw_graph_create(&g, ctx));
    ASSERT_OK(cw_tensor_desc_make(d, CW_F32, 4, xd));
    const int64_t c = xd[1], wd[4] = {c, c, 3, 3};
    cw_conv_params cp = CW_CONV_PARAMS_INIT;
    cp.spatial = 2;
    cp.pad_pre[0] = cp.pad_pre[1] = cp.pad_post[0] = cp.pad_post[1] = 1;
    cw_node h;
    ASSERT_OK_CTX(ctx, cw_graph_input(g, &h, "x", d));
    ASSERT_OK_CTX(ctx, cw_graph_conv(g, &h, h, konst(g, 4, wd, 0.1f), konst(g, 1, &c, 0.1f), &cp));
    ASSERT_OK_CTX(ctx, cw_graph_group_norm(g, &h, h, konst(g, 1, &c, 1.0f), konst(g, 1, &c, 0.1f), 8, 1e-6f));
    ASSERT_OK_CTX(ctx, cw_graph_silu(g, &h, h));
    ASSERT_OK_CTX(ctx, cw_graph_upsample2x(g, &h, h));
    ASSERT_OK_CTX(ctx, cw_graph_conv(g, &h, h, konst(g, 4, wd, 0.1f), konst(g, 1, &c, 0.1f), &cp));
    ASSERT_OK_CTX(ctx, cw_graph_output(g, h, "y"));
    return g;
}

/* Part 2: compile, then run twice: neither run makes a primitive. */
static void test_run_makes_none(void) {
    open_cpu1();
    const int64_t xd[4] = {1, 32, 48, 40};
    cw_tensor_desc d, dy;
    cw_graph *g = prep_graph(xd, &d);
    cw_compile_options o = CW_COMPILE_OPTIONS_INIT;
    o.streams = 2;
    o.temp_budget = 4 << 20;
    cw_plan *p;
    ASSERT_OK_CTX(ctx, cw_graph_compile(g, &p, &o));
    CHECK(describes(p, "cpu_dnnl"));
    const int64_t yd[4] = {1, 32, 96, 80};
    ASSERT_OK(cw_tensor_desc_make(&dy, CW_F32, 4, yd));
    cw_tensor *in, *out;
    ASSERT_OK_CTX(ctx, cw_tensor_create(&in, ctx, &d));
    ASSERT_OK_CTX(ctx, cw_tensor_create(&out, ctx, &dy));
    const size_t n = (size_t)cw_tensor_desc_numel(&d);
    float *hx = malloc(n * 4);
    ASSERT_TRUE(hx);
    for (size_t i = 0; i < n; i++) hx[i] = cw_rng_float(&rng);
    ASSERT_OK(cw_tensor_upload(in, hx, n * 4));
    for (int r = 0; r < 2; r++) {
        const cw__dnnl_stats s0 = stats_now();
        ASSERT_OK_CTX(ctx, cw_plan_run(p, &in, 1, &out, 1));
        const cw__dnnl_stats s1 = stats_now();
        fprintf(stderr, "run %d: %lld primitives, %lld plans built\n", r, (long long)(s1.primitives - s0.primitives),
                (long long)(s1.plans_built - s0.plans_built));
        ASSERT_EQ_I(s1.primitives - s0.primitives, 0);
    }
    free(hx);
    cw_tensor_destroy(in), cw_tensor_destroy(out);
    cw_plan_destroy(p);
    cw_graph_destroy(g);
    free_consts();
    cw_context_destroy(ctx);
}

/* Part 3: a plan's holds across cw_context_empty_cache. */
static void test_plan_holds(void) {
    open_cpu1();
    const int64_t xd[4] = {1, 32, 40, 48};
    cw_tensor_desc d;
    cw_graph *g = prep_graph(xd, &d);
    cw_compile_options o = CW_COMPILE_OPTIONS_INIT;
    o.streams = 2;
    o.temp_budget = 4 << 20;
    ASSERT_OK_CTX(ctx, cw_context_empty_cache(ctx));
    const cw__dnnl_stats s0 = stats_now();
    cw_plan *p;
    ASSERT_OK_CTX(ctx, cw_graph_compile(g, &p, &o));
    CHECK(describes(p, "cpu_dnnl"));
    ASSERT_OK_CTX(ctx, cw_context_empty_cache(ctx));
    const cw__dnnl_stats s1 = stats_now();
    fprintf(stderr, "holds: %lld plans alive before compile, %lld after it and empty_cache (%lld in the cache, "
            "%lld idle bytes)\n", (long long)s0.live_plans, (long long)s1.live_plans, (long long)s1.cache_plans,
            (long long)s1.idle_bytes);
    CHECK(s1.live_plans > s0.live_plans);
    ASSERT_EQ_I(s1.idle_bytes, 0);
    const int64_t yd[4] = {1, 32, 80, 96};
    cw_tensor_desc dy;
    ASSERT_OK(cw_tensor_desc_make(&dy, CW_F32, 4, yd));
    cw_tensor *in, *out;
    ASSERT_OK_CTX(ctx, cw_tensor_create(&in, ctx, &d));
    ASSERT_OK_CTX(ctx, cw_tensor_create(&out, ctx, &dy));
    const size_t n = (size_t)cw_tensor_desc_numel(&d);
    float *hx = malloc(n * 4);
    ASSERT_TRUE(hx);
    for (size_t i = 0; i < n; i++) hx[i] = cw_rng_float(&rng);
    ASSERT_OK(cw_tensor_upload(in, hx, n * 4));
    ASSERT_OK_CTX(ctx, cw_plan_run(p, &in, 1, &out, 1));
    const cw__dnnl_stats s2 = stats_now();
    ASSERT_EQ_I(s2.primitives - s1.primitives, 0);
    /* cw_plan_release gives back the plan's arenas, not its oneDNN plans: they stay held
     * (empty_cache keeps them too), and the released plan runs again, to the same bits,
     * without making a primitive */
    const size_t ny = (size_t)cw_tensor_desc_numel(&dy);
    float *y1 = malloc(ny * 4), *y2 = malloc(ny * 4);
    ASSERT_TRUE(y1 && y2);
    ASSERT_OK(cw_tensor_download(out, y1, (int64_t)(ny * 4)));
    ASSERT_OK_CTX(ctx, cw_plan_release(p));
    ASSERT_OK_CTX(ctx, cw_context_empty_cache(ctx));
    const cw__dnnl_stats s2r = stats_now();
    ASSERT_EQ_I(s2r.live_plans, s1.live_plans);
    ASSERT_OK_CTX(ctx, cw_plan_run(p, &in, 1, &out, 1));
    const cw__dnnl_stats s2b = stats_now();
    fprintf(stderr, "after cw_plan_release: %lld plans alive (%lld before), the run made %lld primitives\n",
            (long long)s2r.live_plans, (long long)s1.live_plans, (long long)(s2b.primitives - s2r.primitives));
    ASSERT_EQ_I(s2b.primitives - s2r.primitives, 0);
    ASSERT_EQ_I(s2b.plans_built - s2r.plans_built, 0);
    ASSERT_OK(cw_tensor_download(out, y2, (int64_t)(ny * 4)));
    CHECK(memcmp(y1, y2, ny * 4) == 0);
    free(y1), free(y2);
    cw_plan_destroy(p);
    ASSERT_OK_CTX(ctx, cw_context_empty_cache(ctx));
    const cw__dnnl_stats s3 = stats_now();
    ASSERT_EQ_I(s3.live_plans, s0.live_plans);
    ASSERT_EQ_I(s3.idle_bytes, 0);
    free(hx);
    cw_tensor_destroy(in), cw_tensor_destroy(out);
    cw_graph_destroy(g);
    free_consts();
    cw_context_destroy(ctx);
}

/* Part 4: 240 distinct small patches, each made and let go: the cache keeps <= 64 MiB. */
static void test_cache_bound(void) {
    cw_context_config cfg = CW_CONTEXT_CONFIG_INIT;
    cfg.backend = CW_BACKEND_CPU;
    ASSERT_OK(cw_context_create(&ctx, &cfg));
    cw__conv_problem p;
    memset(&p, 0, sizeof p);
    p.spatial = 2;
    p.groups = 1;
    p.has_bias = 1;
    for (int i = 0; i < 3; i++) p.stride[i] = p.dilation[i] = 1, p.pad_pre[i] = p.pad_post[i] = 1;
    const int64_t wd[4] = {8, 8, 3, 3};
    ASSERT_OK(cw_tensor_desc_make(&p.w, CW_F32, 4, wd));
    int64_t most = 0;
    for (int k = 0; k < 240; k++) {
        const int64_t xd[4] = {1, 8, 4 + k, 16};
        ASSERT_OK(cw_tensor_desc_make(&p.x, CW_F32, 4, xd));
        ASSERT_OK(cw_tensor_desc_make(&p.y, CW_F32, 4, xd));
        cw__dnnl_plan *pl;
        ASSERT_OK_CTX(ctx, cw__cpu_dnnl_plan_get(ctx, &p, &pl));
        cw__cpu_dnnl_release(pl);
        const cw__dnnl_stats s = stats_now();
        if (s.idle_bytes > most) most = s.idle_bytes;
    }
    const cw__dnnl_stats s = stats_now();
    fprintf(stderr, "cache: %lld plans, %.1f MiB charged (most idle %.1f MiB), %lld plans alive\n",
            (long long)s.cache_plans, (double)s.cache_bytes / (1 << 20), (double)most / (1 << 20),
            (long long)s.live_plans);
    ASSERT_LE_I(most, INT64_C(64) << 20);
    CHECK(s.cache_plans < 240); /* 240 of these are charged ~0.4 MiB each: some were evicted */
    ASSERT_EQ_I(s.live_plans, s.cache_plans); /* evicted ones were destroyed */
    cw_context_destroy(ctx); /* the last context: the cache is emptied */
    ctx = NULL;
    const cw__dnnl_stats e = stats_now();
    ASSERT_EQ_I(e.cache_plans, 0);
    ASSERT_EQ_I(e.live_plans, 0);
}

/* Part 5: costings are kept per problem, dropped by cw_context_empty_cache. */
static void test_costs_kept(void) {
    const int64_t xd[4] = {1, 32, 80, 64};
    cw_tensor_desc d;
    cw_graph *g = open_chain(xd, &d);
    cw_compile_options o = CW_COMPILE_OPTIONS_INIT;
    o.temp_budget = 1 << 20;
    char *text[3] = {0};
    int64_t made[3], kept[3];
    for (int i = 0; i < 3; i++) {
        if (i == 2) ASSERT_OK(cw_context_empty_cache(ctx));
        const cw__dnnl_stats s0 = stats_now();
        if (i == 2) CHECK(s0.cost_entries == 0);
        cw_plan *p;
        ASSERT_OK_CTX(ctx, cw_graph_compile(g, &p, &o));
        const cw__dnnl_stats s1 = stats_now();
        made[i] = s1.pds - s0.pds, kept[i] = s1.cost_entries;
        ASSERT_OK(cw_plan_describe(p, &text[i], 0));
        cw_plan_destroy(p);
    }
    fprintf(stderr, "costs kept: descriptors made %lld, %lld, after empty_cache %lld; %lld problems kept\n",
            (long long)made[0], (long long)made[1], (long long)made[2], (long long)kept[0]);
    CHECK(made[0] > 0 && kept[0] > 0 && kept[0] <= 2048);
    CHECK(made[1] == 0 && kept[1] == kept[0]);
    CHECK(made[2] > 0);
    CHECK(strcmp(text[0], text[1]) == 0 && strcmp(text[0], text[2]) == 0);
    for (int i = 0; i < 3; i++) cw_free(text[i]);
    cw_graph_destroy(g);
    free_consts();
    cw_context_destroy(ctx);
}

int main(void) {
    if (!cw__cpu_dnnl_compiled()) {
        fprintf(stderr, "built without oneDNN (CONVWEAVE_DNNL=OFF): skipped\n");
        return CW_TEST_SKIP;
    }
    (void)check_streams_threads, (void)max_rel_diff; /* conv_algo_run.h's, unused here */
    rng.s = cw_test_seed(0xCAC4Eull);
    test_compile_builds_only_kept();
    test_run_makes_none();
    test_plan_holds();
    test_cache_bound();
    test_costs_kept();
    TEST_DONE();
}
