/* What oneDNN's plans hold between calls (CONVWEAVE_DNNL; skips with 77 without it).
 * 1. Compiling costs candidate patch heights from primitive descriptors only: the
 *    primitives made at compile time are those of the patches the plan runs (at most one
 *    plan per patch), not one set per candidate the planner weighed. */
#include "backend/cpu/cpu.h"
#include "conv_algo_run.h"

static cw__dnnl_stats stats_now(void) {
    cw__dnnl_stats s;
    cw__cpu_dnnl_stats(&s);
    return s;
}

/* Part 1: a 2-stream compile under a tight budget builds at most one plan per patch. */
static void test_compile_builds_only_kept(void) {
    cw_context_config cfg = CW_CONTEXT_CONFIG_INIT;
    cfg.backend = CW_BACKEND_CPU;
    cfg.threads = 1;
    ASSERT_OK(cw_context_create(&ctx, &cfg));
    const conv_graph_spec gs = {2, 3, 0.2f};
    const int64_t xd[4] = {1, 32, 96, 80};
    cw_tensor_desc d;
    cw_graph *g = make_graph(&gs, xd, &d);
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

int main(void) {
    if (!cw__cpu_dnnl_compiled()) {
        fprintf(stderr, "built without oneDNN (CONVWEAVE_DNNL=OFF): skipped\n");
        return CW_TEST_SKIP;
    }
    (void)check_streams_threads, (void)max_rel_diff; /* conv_algo_run.h's, unused here */
    rng.s = cw_test_seed(0xCAC4Eull);
    test_compile_builds_only_kept();
    TEST_DONE();
}
