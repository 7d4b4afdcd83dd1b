/* The scheduler on 5-D tensors (a Conv3d VAE block): GroupNorm + SiLU fused into a 3x3x3
 * conv's prep, residual epilogue, nearest upsample of H and W, a (1,3,3) conv. Patches run
 * along H. Scheduled (auto patches at the smallest budget and above, 1-3 streams; fixed
 * patches) against a naive double-precision reference and against the unscheduled plan. */
#include <math.h>
#include <string.h>

#include "conv_ref.h"
#include "convweave/convweave.h"
#include "graph_run.h"
#include "testutil.h"

enum { N = 1, C = 4, D = 3, H = 10, W = 8, G = 2, K2 = 6 };



int main(void) {
    cw_rng r = {cw_test_seed(3)};
    const int64_t xdims[5] = {N, C, D, H, W}, w1d[5] = {C, C, 3, 3, 3}, w2d[5] = {K2, C, 1, 3, 3};
    const int64_t cdim = C, kdim = K2, n_x = N * C * D * H * W;
    float *x = rnd(&r, n_x, 1.0f, 0.3f), *gm = rnd(&r, C, 0.2f, 1.0f), *bt = rnd(&r, C, 0.2f, 0.0f);
    float *w1 = rnd(&r, C * C * 27, 0.2f, 0.0f), *b1 = rnd(&r, C, 0.1f, 0.0f);
    float *w2 = rnd(&r, K2 * C * 9, 0.3f, 0.0f), *b2 = rnd(&r, K2, 0.1f, 0.0f);
    cw_conv_params p1 = CW_CONV_PARAMS_INIT, p2 = CW_CONV_PARAMS_INIT;
    p1.spatial = p2.spatial = 3;
    for (int i = 0; i < 3; i++) p1.pad_pre[i] = p1.pad_post[i] = 1;
    p2.pad_pre[1] = p2.pad_post[1] = p2.pad_pre[2] = p2.pad_post[2] = 1;

    /* ---- reference, double accumulation ---- */
    float *h = malloc((size_t)n_x * sizeof *h);
    const int64_t per = D * H * W, cg = C / G;
    for (int64_t g = 0; g < G; g++) {
        double m = 0, q = 0;
        for (int64_t e = 0; e < cg * per; e++) m += x[g * cg * per + e];
        m /= (double)(cg * per);
        for (int64_t e = 0; e < cg * per; e++) q += (x[g * cg * per + e] - m) * (x[g * cg * per + e] - m);
        double rs = 1.0 / sqrt(q / (double)(cg * per) + 1e-6);
        for (int64_t c = g * cg; c < (g + 1) * cg; c++)
            for (int64_t e = 0; e < per; e++) {
                double v = (x[c * per + e] - m) * rs * gm[c] + bt[c];
                h[c * per + e] = (float)(v / (1.0 + exp(-v)));
            }
    }
    cw_tensor_desc xd, w1desc, w2desc, ud, yd;
    ASSERT_OK(cw_tensor_desc_make(&xd, CW_F32, 5, xdims));
    ASSERT_OK(cw_tensor_desc_make(&w1desc, CW_F32, 5, w1d));
    ASSERT_OK(cw_tensor_desc_make(&w2desc, CW_F32, 5, w2d));
    double *c1 = malloc((size_t)n_x * sizeof *c1);
    cw_ref_conv(&xd, h, &w1desc, w1, b1, &p1, &xd, c1);
    int64_t udims[5] = {N, C, D, 2 * H, 2 * W}, ydims[5] = {N, K2, D, 2 * H, 2 * W};
    ASSERT_OK(cw_tensor_desc_make(&ud, CW_F32, 5, udims));
    ASSERT_OK(cw_tensor_desc_make(&yd, CW_F32, 5, ydims));
    float *u = malloc((size_t)cw_tensor_desc_numel(&ud) * sizeof *u);
    for (int64_t cd = 0; cd < C * D; cd++)
        for (int64_t y = 0; y < 2 * H; y++)
            for (int64_t xx = 0; xx < 2 * W; xx++) {
                int64_t s = (cd * H + y / 2) * W + xx / 2;
                u[(cd * 2 * H + y) * 2 * W + xx] = (float)((double)x[s] + c1[s]);
            }
    int64_t n_y = cw_tensor_desc_numel(&yd);
    double *ref = malloc((size_t)n_y * sizeof *ref);
    cw_ref_conv(&ud, u, &w2desc, w2, b2, &p2, &yd, ref);

    /* ---- the graph ---- */
    cw_context_config cfg = CW_CONTEXT_CONFIG_INIT;
    cfg.backend = CW_BACKEND_CPU;
    cfg.flags = CW_FLAG_POISON;
    cw_context *ctx;
    ASSERT_OK(cw_context_create(&ctx, &cfg));
    cw_tensor *tg = upload(ctx, CW_F32, 1, &cdim, gm), *tb = upload(ctx, CW_F32, 1, &cdim, bt);
    cw_tensor *tw1 = upload(ctx, CW_F32, 5, w1d, w1), *tb1 = upload(ctx, CW_F32, 1, &cdim, b1);
    cw_tensor *tw2 = upload(ctx, CW_F32, 5, w2d, w2), *tb2 = upload(ctx, CW_F32, 1, &kdim, b2);
    cw_tensor *tx = upload(ctx, CW_F32, 5, xdims, x), *ty;
    ASSERT_OK_CTX(ctx, cw_tensor_create(&ty, ctx, &yd));
    cw_graph *g;
    ASSERT_OK(cw_graph_create(&g, ctx));
    cw_node nx, ng, nb, nw1, nb1, nw2, nb2, a;
    ASSERT_OK_CTX(ctx, cw_graph_input(g, &nx, "x", &xd));
    ASSERT_OK_CTX(ctx, cw_graph_constant(g, &ng, "gamma", tg));
    ASSERT_OK_CTX(ctx, cw_graph_constant(g, &nb, "beta", tb));
    ASSERT_OK_CTX(ctx, cw_graph_constant(g, &nw1, "w1", tw1));
    ASSERT_OK_CTX(ctx, cw_graph_constant(g, &nb1, "b1", tb1));
    ASSERT_OK_CTX(ctx, cw_graph_constant(g, &nw2, "w2", tw2));
    ASSERT_OK_CTX(ctx, cw_graph_constant(g, &nb2, "b2", tb2));
    ASSERT_OK_CTX(ctx, cw_graph_group_norm(g, &a, nx, ng, nb, G, 1e-6f));
    ASSERT_OK_CTX(ctx, cw_graph_silu(g, &a, a));
    ASSERT_OK_CTX(ctx, cw_graph_conv(g, &a, a, nw1, nb1, &p1));
    ASSERT_OK_CTX(ctx, cw_graph_add(g, &a, nx, a));
    ASSERT_OK_CTX(ctx, cw_graph_upsample2x(g, &a, a));
    ASSERT_OK_CTX(ctx, cw_graph_conv(g, &a, a, nw2, nb2, &p2));
    ASSERT_OK_CTX(ctx, cw_graph_output(g, a, "y"));

    float *out = malloc((size_t)n_y * sizeof *out), *unsched = malloc((size_t)n_y * sizeof *unsched);
    cw_compile_options o = CW_COMPILE_OPTIONS_INIT;
    o.policy = CW_PATCHES_NONE;
    int64_t minb = 0;
    int runs = 0;
    for (int cfgi = 0; cfgi < 9; cfgi++) {
        if (cfgi >= 1 && cfgi <= 6) { /* the smallest budget for this stream count, and 4x it */
            o.policy = CW_PATCHES_AUTO;
            o.streams = 1 + (cfgi - 1) % 3;
            ASSERT_OK_CTX(ctx, cw_graph_min_budget(g, &minb, &o));
            o.temp_budget = cfgi <= 3 ? minb : 4 * minb;
        } else if (cfgi >= 7) {
            o.policy = CW_PATCHES_FIXED;
            o.patches = cfgi == 7 ? 3 : 7;
            o.streams = 3;
            o.temp_budget = -1;
        }
        cw_plan *plan;
        ASSERT_OK_CTX(ctx, cw_graph_compile(g, &plan, &o));
        ASSERT_OK_CTX(ctx, cw_plan_run(plan, &tx, 1, &ty, 1));
        cw_plan_stats st;
        ASSERT_OK(cw_plan_get_stats(plan, &st));
        ASSERT_OK(cw_tensor_download(ty, cfgi == 0 ? unsched : out, (size_t)n_y * 4));
        double e = cw_ref_rel_err(&yd, cfgi == 0 ? unsched : out, ref);
        if (!(e <= 1e-5)) {
            fprintf(stderr, "config %d (policy %d, streams %d, budget %lld): rel err vs reference %g\n", cfgi,
                    (int)o.policy, o.streams, (long long)o.temp_budget, e);
            cw_test_failures++;
        }
        if (cfgi > 0) {
            const double e_u = cw_err_rel(out, unsched, n_y);
            if (!(e_u <= 1e-5)) {
                fprintf(stderr, "config %d: scheduled vs unscheduled rel err %g\n", cfgi, e_u);
                cw_test_failures++;
            }
            if (o.temp_budget > 0 && st.temp_peak > o.temp_budget) {
                fprintf(stderr, "config %d: temp peak %lld > budget %lld\n", cfgi, (long long)st.temp_peak,
                        (long long)o.temp_budget);
                cw_test_failures++;
            }
            ASSERT_EQ_I(st.host_syncs, 0);
            if (cfgi >= 7) ASSERT_TRUE(st.n_patches >= 2 * o.patches); /* both convs patched along H */
        }
        cw_plan_destroy(plan);
        runs++;
    }
    printf("3-D graph: %d plans checked (smallest budget %lld bytes)\n", runs, (long long)minb);
    cw_graph_destroy(g);
    cw_tensor *all[] = {tg, tb, tw1, tb1, tw2, tb2, tx, ty};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) cw_tensor_destroy(all[i]);
    cw_context_destroy(ctx);
    free(x), free(gm), free(bt), free(w1), free(b1), free(w2), free(b2), free(h), free(c1), free(u), free(ref);
    free(out), free(unsched);
    TEST_DONE();
}
