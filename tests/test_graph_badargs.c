/* Bad input to the graph and plan API: every case returns its status and a message that
 * names the argument or shape at fault; nothing is created on failure. */
#include <string.h>

#include "convweave/convweave.h"
#include "testutil.h"

static cw_context *ctx;

#define EXPECT(call, status, needle)                                                                \
    do {                                                                                            \
        cw_status s_ = (call);                                                                      \
        const char *m_ = cw_context_get_last_error(ctx);                                                \
        if (s_ != (status) || !strstr(m_, (needle))) {                                              \
            fprintf(stderr, "%s:%d: %s -> %s \"%s\"; expected %s with \"%s\"\n", __FILE__, __LINE__, \
                    #call, cw_status_name(s_), m_, cw_status_name(status), needle);                  \
            cw_test_failures++;                                                                     \
        }                                                                                           \
        cases++;                                                                                    \
    } while (0)

#include <stdatomic.h>
static _Atomic int64_t g_calls, g_max_done, g_total;
static void progress(void *user, int64_t done, int64_t total) {
    (void)user;
    atomic_fetch_add(&g_calls, 1);
    int64_t m = atomic_load(&g_max_done);
    while (done > m && !atomic_compare_exchange_weak(&g_max_done, &m, done)) {
    }
    atomic_store(&g_total, total);
}

static cw_tensor *tensor(int rank, const int64_t *dims) {
    cw_tensor_desc d;
    ASSERT_OK(cw_tensor_desc_make(&d, CW_F32, rank, dims));
    cw_tensor *t;
    ASSERT_OK_CTX(ctx, cw_tensor_create(&t, ctx, &d));
    return t;
}

int main(void) {
    int cases = 0;
    cw_context_config cfg = CW_CONTEXT_CONFIG_INIT;
    cfg.backend = CW_BACKEND_CPU;
    cfg.log_level = CW_LOG_ERROR;
    ASSERT_OK(cw_context_create(&ctx, &cfg));
    cw_graph *g;
    ASSERT_OK(cw_graph_create(&g, ctx));
    int64_t xd[4] = {1, 8, 16, 16}, x2d[4] = {1, 8, 8, 8}, wd[4] = {8, 8, 3, 3}, c8 = 8, c6 = 6;
    cw_tensor *w = tensor(4, wd), *v8 = tensor(1, &c8), *v6 = tensor(1, &c6);
    cw_tensor_desc d, d2;
    ASSERT_OK(cw_tensor_desc_make(&d, CW_F32, 4, xd));
    ASSERT_OK(cw_tensor_desc_make(&d2, CW_F32, 4, x2d));
    cw_node x, x2, nw, n8, n6, out = 0;
    ASSERT_OK_CTX(ctx, cw_graph_input(g, &x, "x", &d));
    ASSERT_OK_CTX(ctx, cw_graph_input(g, &x2, "x2", &d2));
    ASSERT_OK_CTX(ctx, cw_graph_constant(g, &nw, "w", w));
    ASSERT_OK_CTX(ctx, cw_graph_constant(g, &n8, "g8", v8));
    ASSERT_OK_CTX(ctx, cw_graph_constant(g, &n6, "g6", v6));
    cw_conv_params p = CW_CONV_PARAMS_INIT;

    EXPECT(cw_graph_conv(g, &out, 99, nw, CW_NODE_NONE, &p), CW_ERR_INVALID_ARG, "x = 99");
    ASSERT_EQ_I(out, CW_NODE_NONE);
    EXPECT(cw_graph_conv(g, &out, x, x2, CW_NODE_NONE, &p), CW_ERR_UNSUPPORTED, "constants");
    p.groups = 3;
    EXPECT(cw_graph_conv(g, &out, x, nw, CW_NODE_NONE, &p), CW_ERR_INVALID_ARG, "groups");
    p.groups = 1;
    p.stride[0] = 0;
    EXPECT(cw_graph_conv(g, &out, x, nw, CW_NODE_NONE, &p), CW_ERR_INVALID_ARG, "stride");
    p.stride[0] = 1;
    EXPECT(cw_graph_conv(g, &out, x, nw, n6, &p), CW_ERR_INVALID_ARG, "bias");
    EXPECT(cw_graph_group_norm(g, &out, x, n8, n8, 3, 1e-6f), CW_ERR_INVALID_ARG, "groups = 3");
    EXPECT(cw_graph_group_norm(g, &out, x, n6, n8, 4, 1e-6f), CW_ERR_INVALID_ARG, "gamma");
    EXPECT(cw_graph_group_norm(g, &out, x, n8, n8, 4, 0.0f), CW_ERR_INVALID_ARG, "eps");
    EXPECT(cw_graph_group_norm(g, &out, n8, n8, n8, 4, 1e-6f), CW_ERR_INVALID_ARG, "[N, C, H, W]");
    EXPECT(cw_graph_add(g, &out, x, x2), CW_ERR_INVALID_ARG, "[1, 8, 16, 16]");
    EXPECT(cw_graph_attention(g, &out, x, x, x2, 0.5f), CW_ERR_INVALID_ARG, "equal shapes");
    EXPECT(cw_graph_attention(g, &out, x, x, x, -1.0f), CW_ERR_INVALID_ARG, "scale");
    EXPECT(cw_graph_output(g, x, "y"), CW_ERR_UNSUPPORTED, "input or constant");
    cw_tensor *keep[2] = {NULL, NULL};
    cw_plan *plan = (cw_plan *)&plan;
    EXPECT(cw_graph_compile(g, &plan, NULL), CW_ERR_INVALID_ARG, "no outputs");
    int64_t mb = 0;
    EXPECT(cw_graph_min_budget(g, &mb, NULL), CW_ERR_INVALID_ARG, "no outputs");
    {   /* a strided bias is refused, not read as if contiguous */
        int64_t bd[1] = {16};
        cw_tensor *bb = tensor(1, bd);
        cw_tensor_desc sd;
        int64_t eight = 8;
        ASSERT_OK(cw_tensor_desc_make(&sd, CW_F32, 1, &eight));
        sd.strides[0] = 2;
        cw_tensor *sb;
        ASSERT_OK_CTX(ctx, cw_tensor_wrap(&sb, ctx, &sd, cw_tensor_get_data(bb)));
        cw_node nsb;
        ASSERT_OK_CTX(ctx, cw_graph_constant(g, &nsb, "strided bias", sb));
        EXPECT(cw_graph_conv(g, &out, x, nw, nsb, &p), CW_ERR_UNSUPPORTED, "contiguous");
        keep[0] = sb, keep[1] = bb; /* constants outlive the graph's plans */
    }
    ASSERT_TRUE(plan == NULL);

    cw_node s;
    ASSERT_OK_CTX(ctx, cw_graph_silu(g, &s, x));
    ASSERT_OK_CTX(ctx, cw_graph_output(g, s, "y"));
    EXPECT(cw_graph_output(g, s, "y"), CW_ERR_INVALID_ARG, "already an output");
    cw_compile_options o = CW_COMPILE_OPTIONS_INIT;
    o.size = 8;
    EXPECT(cw_graph_compile(g, &plan, &o), CW_ERR_INVALID_ARG, "cw_compile_options");
    o = (cw_compile_options)CW_COMPILE_OPTIONS_INIT;
    o.policy = CW_PATCHES_FIXED;
    EXPECT(cw_graph_compile(g, &plan, &o), CW_ERR_INVALID_ARG, "patches");
    o.patches = 2;
    o.streams = 99;
    EXPECT(cw_graph_compile(g, &plan, &o), CW_ERR_INVALID_ARG, "streams");
    o.streams = 2;
    ASSERT_OK_CTX(ctx, cw_graph_compile(g, &plan, &o));

    cw_tensor *tx = tensor(4, xd), *ty = tensor(4, xd), *small = tensor(4, x2d);
    cw_tensor *ins[2] = {tx, small};
    EXPECT(cw_plan_run(plan, ins, 1, &ty, 1), CW_ERR_INVALID_ARG, "the plan has 2");
    cw_tensor *ins2[2] = {small, small};
    EXPECT(cw_plan_run(plan, ins2, 2, &ty, 1), CW_ERR_INVALID_ARG, "inputs[0] ('x') is f32 [1, 8, 8, 8]");
    EXPECT(cw_plan_run(plan, ins, 2, &small, 1), CW_ERR_INVALID_ARG, "outputs[0] ('y') is f32 [1, 8, 8, 8]");
    EXPECT(cw_plan_run(plan, ins, 2, &tx, 1), CW_ERR_INVALID_ARG, "overlaps inputs[0]");
    EXPECT(cw_plan_write_trace(plan, "/tmp/never.json"), CW_ERR_INVALID_ARG, "not run");
    ASSERT_STATUS(cw_plan_set_progress(NULL, progress, NULL), CW_ERR_INVALID_ARG);
    ASSERT_OK(cw_plan_set_progress(plan, progress, NULL));
    ASSERT_OK_CTX(ctx, cw_plan_run(plan, ins, 2, &ty, 1));
    EXPECT(cw_plan_write_trace(plan, "/tmp/never.json"), CW_ERR_INVALID_ARG, "CW_FLAG_TIMING");
    cw_plan_stats st;
    ASSERT_OK(cw_plan_get_stats(plan, &st));
    ASSERT_EQ_I(atomic_load(&g_calls), st.n_tasks); /* progress: once per task, up to the total */
    ASSERT_EQ_I(atomic_load(&g_max_done), st.n_tasks);
    ASSERT_EQ_I(atomic_load(&g_total), st.n_tasks);
    ASSERT_OK(cw_plan_set_progress(plan, NULL, NULL));
    ASSERT_OK_CTX(ctx, cw_plan_run(plan, ins, 2, &ty, 1));
    ASSERT_EQ_I(atomic_load(&g_calls), st.n_tasks); /* switched off: no more calls */

    cw_plan_destroy(plan);
    cw_graph_destroy(g);

    /* outputs: up to 4096 (a video VAE's chunk step returns every conv's cache), then refused */
    ASSERT_OK(cw_graph_create(&g, ctx));
    ASSERT_OK_CTX(ctx, cw_graph_input(g, &x, "x", &d2));
    for (int k = 0; k < 4096; k++) {
        cw_node y;
        ASSERT_OK_CTX(ctx, cw_graph_silu(g, &y, x));
        ASSERT_OK_CTX(ctx, cw_graph_output(g, y, NULL));
    }
    cw_node extra;
    ASSERT_OK_CTX(ctx, cw_graph_silu(g, &extra, x));
    EXPECT(cw_graph_output(g, extra, "y"), CW_ERR_UNSUPPORTED, "at most 4096 outputs");
    cw_graph_destroy(g);

    cw_tensor *all[] = {w, v8, v6, tx, ty, small, keep[0], keep[1]};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) cw_tensor_destroy(all[i]);
    cw_context_destroy(ctx);
    printf("%d bad-argument cases checked\n", cases);
    TEST_DONE();
}
