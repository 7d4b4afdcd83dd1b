/* cw_plan_release: between runs a released plan holds no memory (its activation arena and
 * its temporaries' cached segments go back to the allocator that gave them), its next run
 * takes them again and gives the same bits, and another live plan keeps its own arena. A
 * counting user allocator shows every segment coming back. */
#include "graph_run.h"

typedef struct counter {
    int64_t live, live_bytes, allocs, frees;
    int refuse; /* alloc returns NULL while set */
} counter;

static void *c_alloc(void *user, int64_t bytes, void *stream) {
    (void)stream;
    counter *c = user;
    if (c->refuse) return NULL;
    void *p = aligned_alloc(CW_ALLOCATOR_ALIGN, (size_t)((bytes + CW_ALLOCATOR_ALIGN - 1) & ~(int64_t)(CW_ALLOCATOR_ALIGN - 1)));
    if (p) c->live++, c->live_bytes += bytes, c->allocs++;
    return p;
}

static void c_free(void *user, void *ptr, int64_t bytes, void *stream) {
    (void)stream;
    counter *c = user;
    c->live--, c->live_bytes -= bytes, c->frees++;
    free(ptr);
}

/* x -> conv -> silu -> conv, + x: activations between the stages, temporaries inside. */
static cw_graph *make_graph(cw_context *ctx, cw_tensor *w, int64_t hw) {
    cw_graph *g;
    ASSERT_OK_CTX(ctx, cw_graph_create(&g, ctx));
    cw_tensor_desc xd;
    ASSERT_OK(cw_tensor_desc_make(&xd, CW_F32, 4, (int64_t[]){1, 8, hw, hw}));
    cw_node x, wn = constant(ctx, g, w), h, s, y;
    cw_conv_params cp = CW_CONV_PARAMS_INIT;
    cp.pad_pre[0] = cp.pad_pre[1] = cp.pad_post[0] = cp.pad_post[1] = 1;
    ASSERT_OK_CTX(ctx, cw_graph_input(g, &x, "x", &xd));
    ASSERT_OK_CTX(ctx, cw_graph_conv(g, &h, x, wn, CW_NODE_NONE, &cp));
    ASSERT_OK_CTX(ctx, cw_graph_silu(g, &s, h));
    ASSERT_OK_CTX(ctx, cw_graph_conv(g, &h, s, wn, CW_NODE_NONE, &cp));
    ASSERT_OK_CTX(ctx, cw_graph_add(g, &y, h, x));
    ASSERT_OK_CTX(ctx, cw_graph_output(g, y, "y"));
    return g;
}

static float *run(cw_context *ctx, cw_plan *p, cw_tensor *x, int64_t hw) {
    cw_tensor *y = upload(ctx, CW_F32, 4, (int64_t[]){1, 8, hw, hw}, NULL);
    ASSERT_OK_CTX(ctx, cw_plan_run(p, &x, 1, &y, 1));
    float *out = malloc((size_t)(8 * hw * hw) * sizeof *out);
    ASSERT_OK_CTX(ctx, cw_tensor_download(y, out, (size_t)(8 * hw * hw) * sizeof *out));
    cw_tensor_destroy(y);
    return out;
}

int main(void) {
    counter c = {0};
    cw_context_config cfg = CW_CONTEXT_CONFIG_INIT;
    cfg.backend = CW_BACKEND_CPU;
    cfg.temp_budget = 1 << 20;
    cfg.streams = 2;
    cfg.flags = CW_FLAG_POISON;
    cw_context *ctx;
    ASSERT_OK(cw_context_create(&ctx, &cfg));
    cw_allocator a = CW_ALLOCATOR_INIT;
    a.alloc = c_alloc, a.free = c_free, a.user = &c;
    ASSERT_OK_CTX(ctx, cw_context_set_allocator(ctx, &a));
    ASSERT_STATUS(cw_plan_release(NULL), CW_ERR_INVALID_ARG);

    cw_rng r = {11};
    const int64_t hw = 48;
    float *wv = rnd(&r, 8 * 8 * 9, 0.2f, -0.1f), *xv = rnd(&r, 8 * hw * hw, 2.0f, -1.0f);
    cw_tensor *w = upload(ctx, CW_F32, 4, (int64_t[]){8, 8, 3, 3}, wv);
    cw_tensor *x = upload(ctx, CW_F32, 4, (int64_t[]){1, 8, hw, hw}, xv);
    cw_graph *g = make_graph(ctx, w, hw), *g2 = make_graph(ctx, w, hw / 2);
    cw_compile_options opt = CW_COMPILE_OPTIONS_INIT;
    opt.streams = 2;
    cw_plan *p, *p2;
    ASSERT_OK_CTX(ctx, cw_graph_compile(g, &p, &opt));
    float *y0 = run(ctx, p, x, hw);
    cw_memory_stats ms;
    ASSERT_OK(cw_context_get_memory_stats(ctx, &ms));
    CHECK(ms.activations_bytes_current > 0);
    CHECK(ms.reserved_bytes_current > 0);
    CHECK(c.live > 0);

    /* released: nothing held, every segment back with the user allocator */
    ASSERT_OK_CTX(ctx, cw_plan_release(p));
    ASSERT_OK(cw_context_get_memory_stats(ctx, &ms));
    ASSERT_EQ_I(ms.activations_bytes_current, 0);
    ASSERT_EQ_I(ms.reserved_bytes_current, 0);
    ASSERT_EQ_I(c.live, 0);
    ASSERT_EQ_I(c.live_bytes, 0);
    ASSERT_OK_CTX(ctx, cw_plan_release(p)); /* twice: a no-op */

    /* the next run takes its arenas again and gives the same bits, as often as asked */
    for (int k = 0; k < 3; k++) {
        float *y1 = run(ctx, p, x, hw);
        CHECK(memcmp(y0, y1, (size_t)(8 * hw * hw) * sizeof *y0) == 0);
        free(y1);
        CHECK(c.live > 0);
        if (k < 2) ASSERT_OK_CTX(ctx, cw_plan_release(p));
    }

    /* a released plan whose arenas cannot be had again: a clean CW_ERR_OUT_OF_MEMORY naming
     * the allocator, nothing taken; the next run, with memory, gives the same bits */
    ASSERT_OK_CTX(ctx, cw_plan_release(p));
    ASSERT_EQ_I(c.live, 0);
    c.refuse = 1;
    cw_tensor *yf = upload(ctx, CW_F32, 4, (int64_t[]){1, 8, hw, hw}, NULL);
    ASSERT_STATUS(cw_plan_run(p, &x, 1, &yf, 1), CW_ERR_OUT_OF_MEMORY);
    CHECK(strstr(cw_context_get_last_error(ctx), "allocator") != NULL);
    ASSERT_EQ_I(c.live, 0);
    c.refuse = 0;
    cw_tensor_destroy(yf);
    float *y3 = run(ctx, p, x, hw);
    CHECK(memcmp(y0, y3, (size_t)(8 * hw * hw) * sizeof *y0) == 0);
    free(y3);

    /* a second plan on the same context: releasing it leaves p's activation arena in place */
    ASSERT_OK_CTX(ctx, cw_graph_compile(g2, &p2, &opt));
    cw_tensor *x2 = upload(ctx, CW_F32, 4, (int64_t[]){1, 8, hw / 2, hw / 2}, xv);
    free(run(ctx, p2, x2, hw / 2));
    cw_plan_stats s1;
    ASSERT_OK(cw_plan_get_stats(p, &s1));
    ASSERT_OK_CTX(ctx, cw_plan_release(p2));
    ASSERT_OK(cw_context_get_memory_stats(ctx, &ms));
    ASSERT_EQ_I(ms.activations_bytes_current, s1.activations_peak);
    ASSERT_OK_CTX(ctx, cw_plan_release(p));
    ASSERT_OK(cw_context_get_memory_stats(ctx, &ms));
    ASSERT_EQ_I(ms.activations_bytes_current, 0);
    ASSERT_EQ_I(c.live, 0);

    /* a released plan can be destroyed, and a destroyed context frees what the runs took */
    float *y2 = run(ctx, p, x, hw);
    CHECK(memcmp(y0, y2, (size_t)(8 * hw * hw) * sizeof *y0) == 0);
    free(y2);
    cw_plan_destroy(p2);
    cw_plan_destroy(p);
    cw_graph_destroy(g2);
    cw_graph_destroy(g);
    cw_tensor_destroy(x2);
    cw_tensor_destroy(x);
    cw_tensor_destroy(w);
    cw_context_destroy(ctx);
    ASSERT_EQ_I(c.live, 0);
    ASSERT_EQ_I(c.allocs, c.frees);
    free(y0), free(wv), free(xv);
    TEST_DONE();
}
