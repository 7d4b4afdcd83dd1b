/* A run forks from stream 0 and joins back into it. Stream 0 is the caller's stream where
 * the caller set one (cuda interop: PyTorch's current stream), and work the caller queued
 * there before the run may still be writing an input. Here, on the cpu backend (same event
 * rules), a host task on the context's stream 0 fills the input after a delay. A plan on
 * 2-4 streams, whose first convolutions run on the other streams, must read the filled
 * input. A task the caller queues on stream 0 after the run must see the finished output.
 * Without the fork, the conv patches read the input before it is written (checked by
 * mutation). */
#include <time.h>

#include "convweave/convweave.h"
#include "backend/backend.h"
#include "core/core.h"
#include "testutil.h"

enum { C = 4, HW = 64 };

typedef struct fill_job {
    float *dst;
    const float *src;
    int64_t n;
} fill_job;

static void late_fill(void *arg) {
    fill_job *j = arg;
    struct timespec ts = {0, 50 * 1000 * 1000}; /* 50 ms: the run is queued long before */
    nanosleep(&ts, NULL);
    memcpy(j->dst, j->src, (size_t)j->n * sizeof(float));
}

typedef struct snap_job {
    const float *src;
    float *dst;
    int64_t n;
} snap_job;

static void snapshot(void *arg) {
    snap_job *j = arg;
    memcpy(j->dst, j->src, (size_t)j->n * sizeof(float));
}

/* A context with cfg, a graph with input x [1, C, HW, HW] and constant w [C, C, 3, 3]
 * (tensor *tw, filled from hw). */
static void setup(const cw_context_config *cfg, const float *hw, cw_context **ctx, cw_graph **g, cw_tensor **tw,
                  cw_node *x, cw_node *w) {
    const int64_t xd[4] = {1, C, HW, HW}, wd[4] = {C, C, 3, 3};
    ASSERT_OK(cw_context_create(ctx, cfg));
    ASSERT_OK(cw_graph_create(g, *ctx));
    cw_tensor_desc d, dw;
    ASSERT_OK(cw_tensor_desc_make(&d, CW_F32, 4, xd));
    ASSERT_OK(cw_tensor_desc_make(&dw, CW_F32, 4, wd));
    ASSERT_OK(cw_tensor_create(tw, *ctx, &dw));
    ASSERT_OK(cw_tensor_upload(*tw, hw, (size_t)C * C * 9 * 4));
    ASSERT_OK_CTX(*ctx, cw_graph_input(*g, x, "x", &d));
    ASSERT_OK_CTX(*ctx, cw_graph_constant(*g, w, "w", *tw));
}

/* y = conv3x3(x, w), padding 1, no bias. */
static cw_node conv3(cw_context *ctx, cw_graph *g, cw_node x, cw_node w) {
    cw_conv_params p = CW_CONV_PARAMS_INIT;
    p.pad_pre[0] = p.pad_pre[1] = p.pad_post[0] = p.pad_post[1] = 1;
    cw_node y;
    ASSERT_OK_CTX(ctx, cw_graph_conv(g, &y, x, w, -1, &p));
    return y;
}

int main(void) {
    cw_rng rng = {cw_test_seed(5)};
    const int64_t xd[4] = {1, C, HW, HW}, n = C * HW * HW;
    float *hx = malloc(n * sizeof *hx), *hw = malloc(C * C * 9 * sizeof *hw), *ref = malloc(n * sizeof *ref);
    for (int64_t i = 0; i < n; i++) hx[i] = cw_rng_float(&rng);
    for (int64_t i = 0; i < C * C * 9; i++) hw[i] = cw_rng_float(&rng);
    int bad = 0;
    for (int streams = 1; streams <= 4; streams++) {
        cw_context_config cfg = CW_CONTEXT_CONFIG_INIT;
        cfg.backend = CW_BACKEND_CPU;
        cfg.threads = 1;
        cw_context *ctx;
        cw_graph *g;
        cw_tensor *tw, *tx, *ty;
        cw_node x, w;
        setup(&cfg, hw, &ctx, &g, &tw, &x, &w);
        ASSERT_OK_CTX(ctx, cw_graph_output(g, conv3(ctx, g, x, w), "y"));
        cw_tensor_desc d;
        ASSERT_OK(cw_tensor_desc_make(&d, CW_F32, 4, xd));
        cw_compile_options o = CW_COMPILE_OPTIONS_INIT;
        o.streams = streams;
        o.policy = CW_PATCHES_FIXED;
        o.patches = 4;
        o.temp_budget = -1;
        cw_plan *plan;
        ASSERT_OK_CTX(ctx, cw_graph_compile(g, &plan, &o));
        ASSERT_OK(cw_tensor_create(&tx, ctx, &d));
        ASSERT_OK(cw_tensor_create(&ty, ctx, &d));
        /* reference: the input written before the run */
        ASSERT_OK(cw_tensor_upload(tx, hx, (size_t)n * 4));
        ASSERT_OK_CTX(ctx, cw_plan_run(plan, &tx, 1, &ty, 1));
        ASSERT_OK(cw_tensor_download(ty, ref, (size_t)n * 4));
        /* now the input holds zeros and stream 0 fills it late; a snapshot after the run */
        float *zero = calloc((size_t)n, sizeof *zero), *snap = calloc((size_t)n, sizeof *snap);
        ASSERT_OK(cw_tensor_upload(tx, zero, (size_t)n * 4));
        ASSERT_OK(cw_tensor_upload(ty, zero, (size_t)n * 4));
        cw__stream *s0;
        ASSERT_OK(cw__context_stream(ctx, 0, &s0));
        fill_job fj = {cw_tensor_get_data(tx), hx, n};
        ASSERT_OK(ctx->be->rt->launch_host(ctx->be, s0, late_fill, &fj));
        ASSERT_OK_CTX(ctx, cw_plan_run(plan, &tx, 1, &ty, 1));
        snap_job sj = {cw_tensor_get_data(ty), snap, n};
        ASSERT_OK(ctx->be->rt->launch_host(ctx->be, s0, snapshot, &sj));
        ASSERT_OK(ctx->be->rt->stream_synchronize(ctx->be, s0));
        float *got = malloc((size_t)n * sizeof *got);
        ASSERT_OK(cw_tensor_download(ty, got, (size_t)n * 4));
        if (memcmp(got, ref, (size_t)n * 4) != 0 || memcmp(snap, ref, (size_t)n * 4) != 0) {
            fprintf(stderr, "streams %d: the run did not wait for stream 0's write of the input (or stream 0's "
                            "later work did not see the output)\n", streams);
            bad++;
        }
        free(zero), free(snap), free(got);
        cw_plan_destroy(plan);
        cw_tensor_destroy(tx), cw_tensor_destroy(ty), cw_tensor_destroy(tw);
        cw_graph_destroy(g);
        cw_context_destroy(ctx);
    }
    CHECK(bad == 0);
    printf("fork/join: 1-4 streams, input written late on stream 0: %d wrong\n", bad);

    /* Runs allocate and free no device memory: the streams, the temporaries' arena (here in
     * the context's pool, under the context's budget) and the activation arena all come at
     * compile time and stay until the plan is destroyed. */
    {
        cw_context_config cfg = CW_CONTEXT_CONFIG_INIT;
        cfg.backend = CW_BACKEND_CPU;
        cfg.temp_budget = 256 << 10;
        cfg.streams = 3;
        cw_context *ctx;
        cw_graph *g;
        cw_tensor *tw, *tx, *ty;
        cw_node x, w;
        setup(&cfg, hw, &ctx, &g, &tw, &x, &w);
        cw_node h = conv3(ctx, g, x, w);
        cw_tensor_desc d;
        ASSERT_OK(cw_tensor_desc_make(&d, CW_F32, 4, xd));
        /* GroupNorm + SiLU fused into the second conv's prep: patch buffers (temporaries) */
        const int64_t cd[1] = {C};
        float gb[2 * C];
        for (int i = 0; i < 2 * C; i++) gb[i] = i < C ? 1.0f : 0.0f;
        cw_tensor_desc dc;
        ASSERT_OK(cw_tensor_desc_make(&dc, CW_F32, 1, cd));
        cw_tensor *tg, *tb;
        ASSERT_OK(cw_tensor_create(&tg, ctx, &dc));
        ASSERT_OK(cw_tensor_create(&tb, ctx, &dc));
        ASSERT_OK(cw_tensor_upload(tg, gb, C * 4));
        ASSERT_OK(cw_tensor_upload(tb, gb + C, C * 4));
        cw_node ng, nb;
        ASSERT_OK_CTX(ctx, cw_graph_constant(g, &ng, "gamma", tg));
        ASSERT_OK_CTX(ctx, cw_graph_constant(g, &nb, "beta", tb));
        ASSERT_OK_CTX(ctx, cw_graph_group_norm(g, &h, h, ng, nb, 2, 1e-6f));
        ASSERT_OK_CTX(ctx, cw_graph_silu(g, &h, h));
        cw_node y = conv3(ctx, g, h, w); /* h: an activation */
        ASSERT_OK_CTX(ctx, cw_graph_output(g, y, "y"));
        cw_plan *plan;
        ASSERT_OK_CTX(ctx, cw_graph_compile(g, &plan, NULL));
        ASSERT_OK(cw_tensor_create(&tx, ctx, &d));
        ASSERT_OK(cw_tensor_create(&ty, ctx, &d));
        ASSERT_OK(cw_tensor_upload(tx, hx, (size_t)n * 4));
        cw_memory_stats m0, m1;
        ASSERT_OK(cw_context_get_memory_stats(ctx, &m0));
        float *y1 = malloc((size_t)n * 4), *y2 = malloc((size_t)n * 4);
        ASSERT_OK_CTX(ctx, cw_plan_run(plan, &tx, 1, &ty, 1));
        ASSERT_OK(cw_tensor_download(ty, y1, (size_t)n * 4));
        ASSERT_OK_CTX(ctx, cw_plan_run(plan, &tx, 1, &ty, 1));
        ASSERT_OK(cw_tensor_download(ty, y2, (size_t)n * 4));
        ASSERT_OK(cw_context_get_memory_stats(ctx, &m1));
        cw_plan_stats ps;
        ASSERT_OK(cw_plan_get_stats(plan, &ps));
        printf("two runs: %lld device allocations, %lld frees, %lld host syncs mid-run (temp arena %lld B, "
               "activations %lld B)\n", (long long)(m1.num_device_allocs - m0.num_device_allocs),
               (long long)(m1.num_device_frees - m0.num_device_frees), (long long)ps.host_syncs,
               (long long)m0.reserved_bytes_current, (long long)ps.activations_peak);
        CHECK(m1.num_device_allocs == m0.num_device_allocs && m1.num_device_frees == m0.num_device_frees);
        CHECK(m0.reserved_bytes_current > 0 && m1.reserved_bytes_current == m0.reserved_bytes_current);
        CHECK(ps.activations_peak > 0 && ps.host_syncs == 0);
        CHECK(memcmp(y1, y2, (size_t)n * 4) == 0); /* the kept arena changes nothing */
        free(y1), free(y2);
        cw_plan_destroy(plan);
        cw_tensor_destroy(tx), cw_tensor_destroy(ty), cw_tensor_destroy(tw), cw_tensor_destroy(tg),
            cw_tensor_destroy(tb);
        cw_graph_destroy(g);
        cw_context_destroy(ctx);
    }
    free(hx), free(hw), free(ref);
    TEST_DONE();
}
