/* What the cpu conv-algorithm tests (test_conv_dnnl.c, test_conv_winograd.c) share: a graph
 * of two 3x3 "same" convs C -> C with random constants, whether a plan's description names
 * an algorithm, and the determinism check of fixed-patch plans on 1-3 streams x 1-3 threads
 * per task under chaos + poison. Include once per test, after testutil.h. */
#ifndef CW_TEST_CONV_ALGO_RUN_H
#define CW_TEST_CONV_ALGO_RUN_H

#include <math.h>

#include "convweave/convweave.h"
#include "testutil.h"

static cw_context *ctx;
static cw_tensor *consts[16];
static float *const_host[16]; /* each constant's values, for references */
static int n_consts;
static cw_rng rng;

static cw_node konst(cw_graph *g, int rank, const int64_t *dims, float scale) {
    cw_tensor_desc d;
    ASSERT_OK(cw_tensor_desc_make(&d, CW_F32, rank, dims));
    int64_t n = cw_tensor_desc_numel(&d);
    float *h = malloc((size_t)n * sizeof *h);
    ASSERT_TRUE(h);
    for (int64_t i = 0; i < n; i++) h[i] = scale * cw_rng_float(&rng);
    cw_tensor *t;
    ASSERT_OK_CTX(ctx, cw_tensor_create(&t, ctx, &d));
    ASSERT_OK_CTX(ctx, cw_tensor_upload(t, h, (size_t)n * 4));
    const_host[n_consts] = h;
    consts[n_consts++] = t;
    cw_node c;
    ASSERT_OK_CTX(ctx, cw_graph_constant(g, &c, "c", t));
    return c;
}

static void free_consts(void) {
    for (int i = 0; i < n_consts; i++) cw_tensor_destroy(consts[i]), free(const_host[i]);
    n_consts = 0;
}

/* The graph's convs: kernel 3 along every spatial dim but D in 3-D, which is kd (1 or 3). */
typedef struct conv_graph_spec {
    int sp;      /* spatial dims: 2 or 3 */
    int64_t kd;  /* 3-D kernel depth */
    float wscale; /* weights uniform in [0, wscale) */
} conv_graph_spec;

static cw_conv_params conv_params(const conv_graph_spec *s) {
    cw_conv_params p = CW_CONV_PARAMS_INIT;
    p.spatial = s->sp;
    for (int i = 0; i < s->sp; i++) p.pad_pre[i] = p.pad_post[i] = 1;
    if (s->sp == 3) p.pad_pre[0] = p.pad_post[0] = s->kd / 2;
    return p;
}

/* conv C -> C, twice; consts[0..3] = w1, b1, w2, b2. x: [1, C, H, W] or [1, C, D, H, W]. */
static cw_graph *make_graph(const conv_graph_spec *s, const int64_t *xd, cw_tensor_desc *d) {
    cw_graph *g;
    ASSERT_OK(cw_graph_create(&g, ctx));
    ASSERT_OK(cw_tensor_desc_make(d, CW_F32, s->sp + 2, xd));
    cw_node x, h;
    ASSERT_OK_CTX(ctx, cw_graph_input(g, &x, "x", d));
    h = x;
    const int64_t c = xd[1];
    for (int l = 0; l < 2; l++) {
        int64_t wd[5] = {c, c, 3, 3, 3};
        if (s->sp == 3) wd[2] = s->kd;
        cw_conv_params p = conv_params(s);
        cw_node w = konst(g, s->sp + 2, wd, s->wscale), b = konst(g, 1, &c, 0.1f);
        ASSERT_OK_CTX(ctx, cw_graph_conv(g, &h, h, w, b, &p));
    }
    ASSERT_OK_CTX(ctx, cw_graph_output(g, h, "y"));
    return g;
}

static int describes(const cw_plan *p, const char *algo) {
    char *s = NULL;
    ASSERT_OK(cw_plan_describe(p, &s, 0));
    int yes = strstr(s, algo) != NULL;
    cw_free(s);
    return yes;
}

/* max|a - r| / max|r| (err_metric.h) */
static double max_rel_diff(const float *a, const double *r, size_t n) { return cw_err_rel_d(a, r, (int64_t)n); }

/* One fixed-patch plan (3 patches, algorithm `algo` in its description) on `streams` streams
 * and `threads` threads per task, under chaos + poison, run twice into out1 and out2. */
static void run_fixed(const conv_graph_spec *s, const int64_t *xd, const char *algo, int streams, int threads,
                      float *out1, float *out2, size_t n) {
    cw_context_config cfg = CW_CONTEXT_CONFIG_INIT;
    cfg.backend = CW_BACKEND_CPU;
    cfg.threads = threads * (streams > 1 ? streams - 1 : 1); /* per-task threads = `threads` */
    cfg.flags = CW_FLAG_POISON | CW_FLAG_CHAOS;
    cfg.chaos_seed = (uint64_t)(10 * streams + threads);
    ASSERT_OK(cw_context_create(&ctx, &cfg));
    cw_tensor_desc d;
    cw_graph *g = make_graph(s, xd, &d);
    cw_compile_options o = CW_COMPILE_OPTIONS_INIT;
    o.policy = CW_PATCHES_FIXED;
    o.patches = 3;
    o.streams = streams;
    o.temp_budget = -1;
    cw_plan *p;
    ASSERT_OK_CTX(ctx, cw_graph_compile(g, &p, &o));
    CHECK(describes(p, algo));
    cw_tensor *in, *out;
    ASSERT_OK_CTX(ctx, cw_tensor_create(&in, ctx, &d));
    ASSERT_OK_CTX(ctx, cw_tensor_create(&out, ctx, &d));
    ASSERT_TRUE((size_t)cw_tensor_desc_numel(&d) == n);
    float *hx = malloc(n * 4);
    ASSERT_TRUE(hx);
    for (size_t i = 0; i < n; i++) hx[i] = cw_rng_float(&rng);
    ASSERT_OK(cw_tensor_upload(in, hx, n * 4));
    for (int k = 0; k < 2; k++) {
        ASSERT_OK_CTX(ctx, cw_plan_run(p, &in, 1, &out, 1));
        ASSERT_OK(cw_tensor_download(out, k == 0 ? out1 : out2, n * 4));
    }
    free(hx);
    cw_tensor_destroy(in), cw_tensor_destroy(out);
    cw_plan_destroy(p);
    cw_graph_destroy(g);
    free_consts();
    cw_context_destroy(ctx);
}

/* Fixed patches on 1-3 streams and 1-3 threads per task, each plan run twice, same inputs:
 * every run gives the first plan's bits. */
static void check_streams_threads(const conv_graph_spec *s, const int64_t *xd, const char *algo) {
    const uint64_t seed = rng.s;
    size_t n = 1;
    for (int i = 0; i < s->sp + 2; i++) n *= (size_t)xd[i];
    float *first = malloc(n * 4), *a = malloc(n * 4), *b = malloc(n * 4);
    ASSERT_TRUE(first && a && b);
    int plans = 0;
    for (int streams = 1; streams <= 3; streams++)
        for (int threads = 1; threads <= 3; threads++) {
            rng.s = seed;
            run_fixed(s, xd, algo, streams, threads, plans == 0 ? first : a, b, n);
            if ((plans > 0 && memcmp(a, first, n * 4) != 0) || memcmp(b, first, n * 4) != 0) {
                fprintf(stderr, "%s: streams %d threads %d (CONVWEAVE_CHAOS_SEED=%d): bits differ from the first plan's\n",
                        algo, streams, threads, 10 * streams + threads);
                cw_test_failures++;
            }
            plans++;
        }
    free(first), free(a), free(b);
    fprintf(stderr, "%s: %d fixed-patch plans (1-3 streams x 1-3 threads per task) x 2 runs: identical bits\n", algo,
            plans);
}

#endif
