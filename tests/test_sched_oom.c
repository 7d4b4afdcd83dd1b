/* Host-allocation failure sweep over the whole scheduler path: context, graph build,
 * compile (with its dry runs), run, stats, describe, trace. The n-th allocation fails for
 * n = 1, 2, ... until a pass completes untouched; every failure must be a clean status
 * (the ASan build checks that nothing leaks) and a later clean run must give the same
 * output as an untouched one. */
#include <string.h>

#include "convweave/convweave.h"
#include "core/core.h"
#include "testutil.h"

typedef struct {
    cw_context *ctx;
    cw_graph *g;
    cw_plan *plan;
    cw_tensor *t[16];
    int nt;
} env;

static void env_free(env *e) {
    cw_plan_destroy(e->plan);
    cw_graph_destroy(e->g);
    for (int i = 0; i < e->nt; i++) cw_tensor_destroy(e->t[i]);
    cw_context_destroy(e->ctx);
    memset(e, 0, sizeof *e);
}

static cw_status konst(env *e, int rank, const int64_t *dims, float v, cw_node *out) {
    cw_tensor_desc d;
    cw_status st = cw_tensor_desc_make(&d, CW_F32, rank, dims);
    if (st != CW_OK) return st;
    int64_t n = cw_tensor_desc_numel(&d);
    float *h = malloc((size_t)n * sizeof *h);
    for (int64_t i = 0; i < n; i++) h[i] = v * (float)((i * 7919) % 13 - 6) / 6.0f + (rank == 1 ? 1.0f : 0.0f);
    cw_tensor *t = NULL;
    if ((st = cw_tensor_create(&t, e->ctx, &d)) == CW_OK) {
        e->t[e->nt++] = t;
        st = cw_tensor_upload(t, h, (size_t)n * 4);
    }
    free(h);
    return st == CW_OK ? cw_graph_constant(e->g, out, "c", t) : st;
}

#define TRY(x)                             \
    do {                                   \
        if ((st = (x)) != CW_OK) return st; \
    } while (0)

/* GN+SiLU+conv, residual add, upsample+conv, attention: every lowering path. */
static cw_status pass(env *e, float *out, size_t out_bytes, const char *trace) {
    cw_status st;
    cw_context_config c = CW_CONTEXT_CONFIG_INIT;
    c.backend = CW_BACKEND_CPU;
    c.flags = CW_FLAG_POISON | CW_FLAG_TIMING;
    c.threads = 1;
    c.log_level = CW_LOG_ERROR;
    TRY(cw_context_create(&e->ctx, &c));
    TRY(cw_graph_create(&e->g, e->ctx));
    int64_t xd[4] = {1, 8, 12, 10}, w3[4] = {8, 8, 3, 3}, w1[4] = {8, 8, 1, 1}, c8 = 8;
    cw_tensor_desc d;
    TRY(cw_tensor_desc_make(&d, CW_F32, 4, xd));
    cw_node x, w, b, gm, bt, h, y, q, k, v, a;
    TRY(cw_graph_input(e->g, &x, "x", &d));
    TRY(konst(e, 1, &c8, 0.1f, &gm));
    TRY(konst(e, 1, &c8, 0.1f, &bt));
    TRY(cw_graph_group_norm(e->g, &h, x, gm, bt, 4, 1e-6f));
    TRY(cw_graph_silu(e->g, &h, h));
    TRY(konst(e, 4, w3, 0.2f, &w));
    TRY(konst(e, 1, &c8, 0.1f, &b));
    cw_conv_params p = CW_CONV_PARAMS_INIT;
    p.pad_pre[0] = p.pad_pre[1] = p.pad_post[0] = p.pad_post[1] = 1;
    TRY(cw_graph_conv(e->g, &h, h, w, b, &p));
    TRY(cw_graph_add(e->g, &y, x, h));
    cw_conv_params p1 = CW_CONV_PARAMS_INIT;
    TRY(konst(e, 4, w1, 0.3f, &w));
    TRY(cw_graph_conv(e->g, &q, y, w, CW_NODE_NONE, &p1));
    TRY(cw_graph_conv(e->g, &k, y, w, CW_NODE_NONE, &p1));
    TRY(cw_graph_conv(e->g, &v, y, w, CW_NODE_NONE, &p1));
    TRY(cw_graph_attention(e->g, &a, q, k, v, 0.35f));
    TRY(cw_graph_add(e->g, &y, y, a));
    TRY(cw_graph_upsample2x(e->g, &y, y));
    TRY(konst(e, 4, w3, 0.2f, &w));
    TRY(cw_graph_conv(e->g, &y, y, w, CW_NODE_NONE, &p));
    TRY(cw_graph_output(e->g, y, "y"));
    cw_compile_options o = CW_COMPILE_OPTIONS_INIT;
    o.policy = CW_PATCHES_FIXED;
    o.patches = 3;
    o.streams = 3;
    o.temp_budget = 1 << 20;
    TRY(cw_graph_compile(e->g, &e->plan, &o));
    cw_tensor *xt = NULL, *yt = NULL;
    TRY(cw_tensor_create(&xt, e->ctx, &d));
    e->t[e->nt++] = xt;
    cw_tensor_desc yd;
    TRY(cw_graph_get_node_desc(e->g, &yd, y));
    TRY(cw_tensor_create(&yt, e->ctx, &yd));
    e->t[e->nt++] = yt;
    float hx[8 * 12 * 10];
    for (int i = 0; i < 8 * 12 * 10; i++) hx[i] = (float)((i * 31) % 17 - 8) / 8.0f;
    TRY(cw_tensor_upload(xt, hx, sizeof hx));
    TRY(cw_plan_run(e->plan, &xt, 1, &yt, 1));
    char *s = NULL;
    TRY(cw_plan_describe(e->plan, &s, 1));
    cw_free(s);
    TRY(cw_plan_write_trace(e->plan, trace));
    return cw_tensor_download(yt, out, out_bytes);
}

int main(void) {
    char trace[512];
    snprintf(trace, sizeof trace, "%s/sched_oom_trace.json", CW_BINARY_DIR);
    static float ref[8 * 24 * 20], got[8 * 24 * 20];
    env e = {0};
    ASSERT_OK(pass(&e, ref, sizeof ref, trace));
    env_free(&e);
    int step = cw_test_quick() ? 7 : 1;
    int failures = 0, n;
    for (n = 1;; n += step) {
        cw__test_fail_after(n);
        memset(got, 0, sizeof got);
        int64_t before = cw__test_alloc_count();
        cw_status st = pass(&e, got, sizeof got, trace);
        int64_t used = cw__test_alloc_count() - before;
        cw__test_fail_after(0);
        env_free(&e);
        if (st == CW_OK) {
            if (used < n) break; /* the injected failure was never reached: done */
            /* the failing allocation was one whose failure is absorbed (e.g. a dry run's
             * retry): the result must still be right */
        } else {
            if (st != CW_ERR_OUT_OF_MEMORY) {
                fprintf(stderr, "allocation %d: unexpected status %s\n", n, cw_status_name(st));
                cw_test_failures++;
            }
            failures++;
            continue;
        }
        if (memcmp(got, ref, sizeof ref) != 0) {
            fprintf(stderr, "allocation %d failed but the pass reported success with a different output\n", n);
            cw_test_failures++;
        }
    }
    /* after all that, a clean pass still gives the same bits */
    ASSERT_OK(pass(&e, got, sizeof got, trace));
    env_free(&e);
    ASSERT_TRUE(memcmp(got, ref, sizeof ref) == 0);
    printf("sweep: %d allocation points, %d clean failures\n", n, failures);
    TEST_DONE();
}
