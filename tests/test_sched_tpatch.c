/* Patches along time (D) as well as H for 5-D convs (video VAEs): a block like a video VAE's
 * (GroupNorm + SiLU fused into a causal 3x3x3 conv, pad 2/0 in T and 1/1 in H, W; residual
 * epilogue written in place; nearest upsample of H, W; a (1,3,3) conv; GroupNorm + SiLU into
 * a causal conv of stride 2 in T; a (3,1,1) conv of stride 2 in T without prep), T = 11. Run with
 * D patches forced, H patches forced and the axis chosen per conv, at several budgets and
 * 1-3 streams, each against a naive double-precision reference and against the unpatched
 * plan (CW_PATCHES_NONE). Then the frame bands' halo math on the causal conv, and a long
 * clip under a tight budget, where the planner picks D (printed: patches and halo, D vs H). */
#include <math.h>
#include <string.h>

#include "conv_ref.h"
#include "convweave/convweave.h"
#include "graph_run.h"
#include "err_metric.h"
#include "scheduler/planner.h"
#include "testutil.h"

enum { N = 1, C = 4, T = 11, H = 6, W = 5, G = 2, K2 = 6 };



static cw_tensor_desc desc5(int64_t n, int64_t c, int64_t d, int64_t h, int64_t w) {
    const int64_t dims[5] = {n, c, d, h, w};
    cw_tensor_desc x;
    ASSERT_OK(cw_tensor_desc_make(&x, CW_F32, 5, dims));
    return x;
}

/* out = silu(groupnorm(x)) of a contiguous [n, c, ...] tensor, statistics in double. */
static void ref_gn_silu(const float *x, int64_t n, int64_t c, int64_t per, int64_t groups, const float *gm,
                        const float *bt, float *out) {
    const int64_t cg = c / groups;
    for (int64_t b = 0; b < n; b++)
        for (int64_t g = 0; g < groups; g++) {
            const float *xg = x + (b * c + g * cg) * per;
            double m = 0, q = 0;
            for (int64_t e = 0; e < cg * per; e++) m += xg[e];
            m /= (double)(cg * per);
            for (int64_t e = 0; e < cg * per; e++) q += (xg[e] - m) * (xg[e] - m);
            double rs = 1.0 / sqrt(q / (double)(cg * per) + 1e-6);
            for (int64_t cc = g * cg; cc < (g + 1) * cg; cc++)
                for (int64_t e = 0; e < per; e++) {
                    double v = (x[(b * c + cc) * per + e] - m) * rs * gm[cc] + bt[cc];
                    out[(b * c + cc) * per + e] = (float)(v / (1.0 + exp(-v)));
                }
        }
}

static float *to_float(const double *d, int64_t n) {
    float *f = malloc((size_t)n * sizeof *f);
    for (int64_t i = 0; i < n; i++) f[i] = (float)d[i];
    return f;
}

/* 1 when every conv of the plan's JSON description names axis ax ("D" or "H"); *n_d gets
 * how many convs are cut along D. */
static int all_axes(const cw_plan *plan, const char *ax, int *n_d, int *n_convs) {
    char *js = NULL;
    ASSERT_OK(cw_plan_describe(plan, &js, 1));
    char want[32];
    snprintf(want, sizeof want, "\"axis\":\"%s\"", ax);
    int all = 1, nd = 0, nc = 0;
    for (const char *s = strstr(js, "\"axis\":"); s; s = strstr(s + 1, "\"axis\":")) {
        nc++;
        if (strncmp(s, want, strlen(want)) != 0) all = 0;
        if (strncmp(s, "\"axis\":\"D\"", 10) == 0) nd++;
    }
    cw_free(js);
    *n_d = nd;
    *n_convs = nc;
    return all;
}

/* The frame bands of the causal conv: exact halos, causal padding only on the first band,
 * none on interior sides, and the bands' input views cover what the full conv reads. */
static void test_frame_halos(void) {
    cw_tensor_desc x = desc5(1, C, T, H, W), w;
    const int64_t wd[5] = {C, C, 3, 3, 3};
    ASSERT_OK(cw_tensor_desc_make(&w, CW_F32, 5, wd));
    cw_conv_params p = CW_CONV_PARAMS_INIT;
    p.spatial = 3;
    p.pad_pre[0] = 2, p.pad_post[0] = 0;
    p.pad_pre[1] = p.pad_post[1] = p.pad_pre[2] = p.pad_post[2] = 1;
    for (int s = 1; s <= 2; s++) {
        p.stride[0] = s;
        cw_tensor_desc y;
        ASSERT_OK(cw_conv_output_desc(NULL, &y, &x, &w, &p));
        cw__conv_problem full;
        cw__conv_problem_init(&full, &x, &w, 0, &y, &p);
        const int64_t d_out = y.dims[2];
        int64_t bounds[5];
        cw__patch_bounds(d_out, 4, bounds);
        for (int j = 0; j < 4; j++) {
            cw__patch pt;
            ASSERT_OK(cw__patch_make_ax(&full, CW__PATCH_DDIM, bounds[j], bounds[j + 1], &pt));
            ASSERT_EQ_I(pt.axis, CW__PATCH_DDIM);
            ASSERT_EQ_I(pt.a, j == 0 ? 0 : bounds[j] * s - 2);
            ASSERT_EQ_I(pt.b, (bounds[j + 1] - 1) * s + 1);
            ASSERT_EQ_I(pt.pad_pre, j == 0 ? 2 : 0);
            ASSERT_EQ_I(pt.pad_post, 0);
            ASSERT_EQ_I(pt.prob.x.dims[2], pt.b - pt.a);
            ASSERT_EQ_I(pt.prob.x.dims[3], H); /* every row, unpadded in H except the conv's own */
            ASSERT_EQ_I(pt.prob.pad_pre[1], 1);
            ASSERT_EQ_I(pt.prob.y.dims[2], bounds[j + 1] - bounds[j]);
            ASSERT_EQ_I(pt.x_offset, pt.a * H * W);
            ASSERT_EQ_I(pt.y_offset, bounds[j] * H * W);
        }
        cw__halo h;
        ASSERT_OK(cw__patch_halo_ax(&full, CW__PATCH_DDIM, bounds, 4, 1.0, &h));
        ASSERT_EQ_I(h.extra_rows, 3 * (3 - s)); /* each inner cut re-reads 3 - s frames */
        ASSERT_TRUE(h.prep_flops_extra == (double)h.extra_rows * C * H * W);
    }
    /* D is no axis of a 4-D conv */
    cw_tensor_desc x4, w4;
    const int64_t x4d[4] = {1, C, H, W}, w4d[4] = {C, C, 3, 3};
    ASSERT_OK(cw_tensor_desc_make(&x4, CW_F32, 4, x4d));
    ASSERT_OK(cw_tensor_desc_make(&w4, CW_F32, 4, w4d));
    cw_conv_params p4 = CW_CONV_PARAMS_INIT;
    cw__conv_problem f4;
    cw_tensor_desc y4;
    ASSERT_OK(cw_conv_output_desc(NULL, &y4, &x4, &w4, &p4));
    cw__conv_problem_init(&f4, &x4, &w4, 0, &y4, &p4);
    cw__patch pt;
    ASSERT_STATUS(cw__patch_make_ax(&f4, CW__PATCH_DDIM + 5, 0, 1, &pt), CW_ERR_INVALID_ARG);
}

/* The video block against its reference and its unpatched plan:
 *   r0 = conv0(x)                                   (1,3,3), pad 1 in H, W
 *   h  = conv1(silu(gn1(r0)))                       causal 3x3x3: pad 2/0 in T, 1/1 in H, W
 *   r  = r0 + conv2(silu(gn2(h)))                   causal 3x3x3; r0 dies here: r takes its
 *                                                   storage (the in-place residual epilogue)
 *   c2 = conv3(upsample2x(r))                       (1,3,3), upsample of H, W only
 *   y1 = conv4(silu(gn3(c2)))                       causal 3x3x3, stride 2 in T
 *   y2 = conv5(c2)                                  (3,1,1), stride 2 in T, pad 1/1, no prep */
enum { NCONV = 6 };

static void test_block(cw_context *ctx) {
    cw_rng r = {cw_test_seed(24)};
    const cw_tensor_desc xd = desc5(N, C, T, H, W), ud = desc5(N, C, T, 2 * H, 2 * W);
    const int64_t n_x = N * C * T * H * W, n_u = 4 * n_x;
    const int64_t wdims[NCONV][5] = {{C, C, 1, 3, 3}, {C, C, 3, 3, 3}, {C, C, 3, 3, 3},
                                     {K2, C, 1, 3, 3}, {C, K2, 3, 3, 3}, {C, K2, 3, 1, 1}};
    const int64_t kout[NCONV] = {C, C, C, K2, C, C};
    const float wscale[NCONV] = {0.3f, 0.2f, 0.2f, 0.3f, 0.15f, 0.3f};
    float *x = rnd(&r, n_x, 1.0f, 0.3f), *wt[NCONV], *bs[NCONV], *gm[3], *bt[3];
    const int64_t gch[3] = {C, C, K2};
    for (int k = 0; k < 3; k++) gm[k] = rnd(&r, gch[k], 0.2f, 1.0f), bt[k] = rnd(&r, gch[k], 0.2f, 0.0f);
    cw_tensor_desc wdesc[NCONV];
    for (int k = 0; k < NCONV; k++) {
        ASSERT_OK(cw_tensor_desc_make(&wdesc[k], CW_F32, 5, wdims[k]));
        wt[k] = rnd(&r, cw_tensor_desc_numel(&wdesc[k]), wscale[k], 0.0f);
        bs[k] = rnd(&r, kout[k], 0.1f, 0.0f);
    }
    cw_conv_params pc[NCONV];
    for (int k = 0; k < NCONV; k++) {
        pc[k] = (cw_conv_params)CW_CONV_PARAMS_INIT;
        pc[k].spatial = 3;
        pc[k].pad_pre[1] = pc[k].pad_post[1] = pc[k].pad_pre[2] = pc[k].pad_post[2] = 1;
    }
    pc[1].pad_pre[0] = pc[2].pad_pre[0] = pc[4].pad_pre[0] = 2; /* causal in T: 2 before, 0 after */
    pc[4].stride[0] = 2;                                          /* causal downsample in T */
    pc[5].stride[0] = 2, pc[5].pad_pre[0] = pc[5].pad_post[0] = 1;
    pc[5].pad_pre[1] = pc[5].pad_post[1] = pc[5].pad_pre[2] = pc[5].pad_post[2] = 0;

    /* ---- reference: float activations between stages, each conv in double ---- */
    cw_tensor_desc c2d = desc5(N, K2, T, 2 * H, 2 * W), y1d, y2d;
    ASSERT_OK(cw_conv_output_desc(NULL, &y1d, &c2d, &wdesc[4], &pc[4]));
    ASSERT_OK(cw_conv_output_desc(NULL, &y2d, &c2d, &wdesc[5], &pc[5]));
    ASSERT_EQ_I(y1d.dims[2], (T + 1) / 2);
    ASSERT_EQ_I(y2d.dims[2], (T + 1) / 2);
    float *f1 = malloc((size_t)n_x * sizeof *f1), *f2 = malloc((size_t)n_x * sizeof *f2);
    float *u = malloc((size_t)n_u * sizeof *u);
    double *d1 = malloc((size_t)n_x * sizeof *d1);
    cw_ref_conv(&xd, x, &wdesc[0], wt[0], bs[0], &pc[0], &xd, d1);
    float *r0 = to_float(d1, n_x);
    ref_gn_silu(r0, N, C, T * H * W, G, gm[0], bt[0], f1);
    cw_ref_conv(&xd, f1, &wdesc[1], wt[1], bs[1], &pc[1], &xd, d1);
    float *hh = to_float(d1, n_x);
    ref_gn_silu(hh, N, C, T * H * W, G, gm[1], bt[1], f2);
    cw_ref_conv(&xd, f2, &wdesc[2], wt[2], bs[2], &pc[2], &xd, d1);
    for (int64_t ct = 0; ct < N * C * T; ct++) /* residual, then nearest upsample of H, W */
        for (int64_t yy = 0; yy < 2 * H; yy++)
            for (int64_t xx = 0; xx < 2 * W; xx++) {
                int64_t s = (ct * H + yy / 2) * W + xx / 2;
                u[(ct * 2 * H + yy) * 2 * W + xx] = (float)((double)r0[s] + d1[s]);
            }
    const int64_t n_c2 = cw_tensor_desc_numel(&c2d), n_y1 = cw_tensor_desc_numel(&y1d), n_y2 = cw_tensor_desc_numel(&y2d);
    double *c2 = malloc((size_t)n_c2 * sizeof *c2), *ref1 = malloc((size_t)n_y1 * sizeof *ref1),
           *ref2 = malloc((size_t)n_y2 * sizeof *ref2);
    cw_ref_conv(&ud, u, &wdesc[3], wt[3], bs[3], &pc[3], &c2d, c2);
    float *c2f = to_float(c2, n_c2), *h2 = malloc((size_t)n_c2 * sizeof *h2);
    ref_gn_silu(c2f, N, K2, T * 4 * H * W, G, gm[2], bt[2], h2);
    cw_ref_conv(&c2d, h2, &wdesc[4], wt[4], bs[4], &pc[4], &y1d, ref1);
    cw_ref_conv(&c2d, c2f, &wdesc[5], wt[5], bs[5], &pc[5], &y2d, ref2);

    /* ---- the graph ---- */
    cw_tensor *tgm[3], *tbt[3], *tw[NCONV], *tb[NCONV];
    for (int k = 0; k < 3; k++)
        tgm[k] = upload(ctx, CW_F32, 1, &gch[k], gm[k]), tbt[k] = upload(ctx, CW_F32, 1, &gch[k], bt[k]);
    for (int k = 0; k < NCONV; k++)
        tw[k] = upload(ctx, CW_F32, 5, wdims[k], wt[k]), tb[k] = upload(ctx, CW_F32, 1, &kout[k], bs[k]);
    const int64_t xdims[5] = {N, C, T, H, W};
    cw_tensor *tx = upload(ctx, CW_F32, 5, xdims, x), *ty[2];
    ASSERT_OK_CTX(ctx, cw_tensor_create(&ty[0], ctx, &y1d));
    ASSERT_OK_CTX(ctx, cw_tensor_create(&ty[1], ctx, &y2d));
    cw_graph *g;
    ASSERT_OK(cw_graph_create(&g, ctx));
    cw_node nx, ng[3], nbt[3], nw[NCONV], nb[NCONV], a, rn0, c2n, y1, y2;
    ASSERT_OK_CTX(ctx, cw_graph_input(g, &nx, "x", &xd));
    for (int k = 0; k < 3; k++) {
        ASSERT_OK_CTX(ctx, cw_graph_constant(g, &ng[k], "gamma", tgm[k]));
        ASSERT_OK_CTX(ctx, cw_graph_constant(g, &nbt[k], "beta", tbt[k]));
    }
    for (int k = 0; k < NCONV; k++) {
        ASSERT_OK_CTX(ctx, cw_graph_constant(g, &nw[k], "w", tw[k]));
        ASSERT_OK_CTX(ctx, cw_graph_constant(g, &nb[k], "b", tb[k]));
    }
    ASSERT_OK_CTX(ctx, cw_graph_conv(g, &rn0, nx, nw[0], nb[0], &pc[0]));
    ASSERT_OK_CTX(ctx, cw_graph_group_norm(g, &a, rn0, ng[0], nbt[0], G, 1e-6f));
    ASSERT_OK_CTX(ctx, cw_graph_silu(g, &a, a));
    ASSERT_OK_CTX(ctx, cw_graph_conv(g, &a, a, nw[1], nb[1], &pc[1]));
    ASSERT_OK_CTX(ctx, cw_graph_group_norm(g, &a, a, ng[1], nbt[1], G, 1e-6f));
    ASSERT_OK_CTX(ctx, cw_graph_silu(g, &a, a));
    ASSERT_OK_CTX(ctx, cw_graph_conv(g, &a, a, nw[2], nb[2], &pc[2]));
    ASSERT_OK_CTX(ctx, cw_graph_add(g, &a, rn0, a));
    ASSERT_OK_CTX(ctx, cw_graph_upsample2x(g, &a, a));
    ASSERT_OK_CTX(ctx, cw_graph_conv(g, &c2n, a, nw[3], nb[3], &pc[3]));
    ASSERT_OK_CTX(ctx, cw_graph_group_norm(g, &a, c2n, ng[2], nbt[2], G, 1e-6f));
    ASSERT_OK_CTX(ctx, cw_graph_silu(g, &a, a));
    ASSERT_OK_CTX(ctx, cw_graph_conv(g, &y1, a, nw[4], nb[4], &pc[4]));
    ASSERT_OK_CTX(ctx, cw_graph_conv(g, &y2, c2n, nw[5], nb[5], &pc[5]));
    ASSERT_OK_CTX(ctx, cw_graph_output(g, y1, "y1"));
    ASSERT_OK_CTX(ctx, cw_graph_output(g, y2, "y2"));

    const int64_t n_y[2] = {n_y1, n_y2};
    const double *refs[2] = {ref1, ref2};
    const cw_tensor_desc *yds[2] = {&y1d, &y2d};
    float *un[2], *out[2];
    for (int k = 0; k < 2; k++) {
        un[k] = malloc((size_t)n_y[k] * sizeof(float));
        out[k] = malloc((size_t)n_y[k] * sizeof(float));
    }
    /* the unpatched plan */
    cw_compile_options o = CW_COMPILE_OPTIONS_INIT;
    o.policy = CW_PATCHES_NONE;
    cw_plan *plan;
    ASSERT_OK_CTX(ctx, cw_graph_compile(g, &plan, &o));
    ASSERT_OK_CTX(ctx, cw_plan_run(plan, &tx, 1, ty, 2));
    for (int k = 0; k < 2; k++) {
        ASSERT_OK(cw_tensor_download(ty[k], un[k], (size_t)n_y[k] * 4));
        double e = cw_ref_rel_err(yds[k], un[k], refs[k]);
        if (!(e <= 1e-5)) {
            fprintf(stderr, "unpatched y%d: rel err vs reference %g\n", k + 1, e);
            cw_test_failures++;
        }
    }
    cw_plan_destroy(plan);

    static const char *axn[3] = {"auto", "H", "D"};
    int runs = 0, d_plans = 0, inplace_d = 0, mixed = 0;
    for (int ax = 0; ax < 3; ax++)
        for (int streams = 1; streams <= 3; streams++)
            for (int bi = 0; bi < 4; bi++) {
                o = (cw_compile_options)CW_COMPILE_OPTIONS_INIT;
                o.patch_axis = (cw_patch_axis)ax;
                o.streams = streams;
                int64_t minb = 0;
                if (bi <= 1) { /* the smallest budget for this axis and stream count, and 3x it */
                    ASSERT_OK_CTX(ctx, cw_graph_min_budget(g, &minb, &o));
                    o.temp_budget = bi == 0 ? minb : 3 * minb;
                } else { /* fixed patches: 4, and more than any conv has frames */
                    o.policy = CW_PATCHES_FIXED;
                    o.patches = bi == 2 ? 4 : 2 * T;
                    o.temp_budget = -1;
                }
                ASSERT_OK_CTX(ctx, cw_graph_compile(g, &plan, &o));
                ASSERT_OK_CTX(ctx, cw_plan_run(plan, &tx, 1, ty, 2));
                cw_plan_stats st;
                ASSERT_OK(cw_plan_get_stats(plan, &st));
                for (int k = 0; k < 2; k++) {
                    ASSERT_OK(cw_tensor_download(ty[k], out[k], (size_t)n_y[k] * 4));
                    double e = cw_ref_rel_err(yds[k], out[k], refs[k]), e_u = cw_err_rel(out[k], un[k], n_y[k]);
                    if (!(e <= 1e-5) || !(e_u <= 1e-5)) {
                        fprintf(stderr, "axis %s, streams %d, %s: y%d rel err %g vs reference, %g vs unpatched\n",
                                axn[ax], streams, bi <= 1 ? "budget" : "fixed", k + 1, e, e_u);
                        cw_test_failures++;
                    }
                }
                if (o.temp_budget > 0 && st.temp_peak > o.temp_budget) {
                    fprintf(stderr, "axis %s, streams %d: temp peak %lld > budget %lld\n", axn[ax], streams,
                            (long long)st.temp_peak, (long long)o.temp_budget);
                    cw_test_failures++;
                }
                ASSERT_EQ_I(st.host_syncs, 0);
                int nd = 0, nc = 0;
                if (ax != CW_PATCH_AXIS_AUTO && !all_axes(plan, ax == CW_PATCH_AXIS_D ? "D" : "H", &nd, &nc)) {
                    fprintf(stderr, "axis %s forced, but %d of %d convs cut along D\n", axn[ax], nd, nc);
                    cw_test_failures++;
                }
                if (ax == CW_PATCH_AXIS_AUTO) all_axes(plan, "D", &nd, &nc);
                mixed += nd > 0 && nd < nc;
                ASSERT_EQ_I(nc, NCONV);
                if (ax == CW_PATCH_AXIS_D && bi >= 2) /* 4 patches per conv, or one per output frame */
                    ASSERT_EQ_I(st.n_patches, bi == 2 ? 4 * NCONV : 4 * T + 2 * ((T + 1) / 2));
                if (ax == CW_PATCH_AXIS_D && bi == 0) ASSERT_TRUE(st.n_patches > NCONV);
                if (ax == CW_PATCH_AXIS_D) { /* r takes r0's storage: conv2 writes band buffers */
                    char *txt = NULL;
                    ASSERT_OK(cw_plan_describe(plan, &txt, 0));
                    inplace_d += strstr(txt, "band buffer") != NULL;
                    cw_free(txt);
                }
                d_plans += nd > 0;
                cw_plan_destroy(plan);
                runs++;
            }
    printf("video block (T=%d): %d plans checked against the reference and the unpatched plan, %d with D patches "
           "(%d of them with the in-place residual, %d with convs on both axes)\n",
           T, runs, d_plans, inplace_d, mixed);
    ASSERT_TRUE(inplace_d > 0);

    /* under a memory budget: the least-memory point of the ladder recomputes the blocks' inner
     * activations; those convs (both passes and their readers) stay on H bands, the others
     * keep the forced or chosen axis */
    for (int ax = 0; ax < 3; ax += 2) {
        o = (cw_compile_options)CW_COMPILE_OPTIONS_INIT;
        o.patch_axis = (cw_patch_axis)ax;
        o.streams = 2;
        int64_t minb = 0;
        ASSERT_OK_CTX(ctx, cw_graph_min_budget(g, &minb, &o));
        o.temp_budget = 2 * minb;
        cw_memory_point pts[8];
        int npts = 0;
        ASSERT_OK_CTX(ctx, cw_graph_memory_ladder(g, pts, &npts, 8, &o));
        o.memory_budget = pts[0].total_bytes;
        ASSERT_OK_CTX(ctx, cw_graph_compile(g, &plan, &o));
        ASSERT_OK_CTX(ctx, cw_plan_run(plan, &tx, 1, ty, 2));
        cw_plan_stats st;
        ASSERT_OK(cw_plan_get_stats(plan, &st));
        for (int k = 0; k < 2; k++) {
            ASSERT_OK(cw_tensor_download(ty[k], out[k], (size_t)n_y[k] * 4));
            double e = cw_ref_rel_err(yds[k], out[k], refs[k]), e_u = cw_err_rel(out[k], un[k], n_y[k]);
            if (!(e <= 1e-5) || !(e_u <= 1e-5)) {
                fprintf(stderr, "memory budget, axis %s: y%d rel err %g vs reference, %g vs unpatched\n", axn[ax],
                        k + 1, e, e_u);
                cw_test_failures++;
            }
        }
        int nd = 0, nc = 0;
        all_axes(plan, "D", &nd, &nc);
        printf("memory budget %lld B, axis %s: %d blocks recomputed, %d of %d conv units cut along D\n",
               (long long)o.memory_budget, axn[ax], st.n_recomputed, nd, nc);
        if (st.activations_peak + st.temp_peak > o.memory_budget) {
            fprintf(stderr, "memory budget, axis %s: %lld + %lld > %lld\n", axn[ax], (long long)st.activations_peak,
                    (long long)st.temp_peak, (long long)o.memory_budget);
            cw_test_failures++;
        }
        cw_plan_destroy(plan);
    }

    cw_graph_destroy(g);
    for (int k = 0; k < 3; k++) cw_tensor_destroy(tgm[k]), cw_tensor_destroy(tbt[k]), free(gm[k]), free(bt[k]);
    for (int k = 0; k < NCONV; k++) cw_tensor_destroy(tw[k]), cw_tensor_destroy(tb[k]), free(wt[k]), free(bs[k]);
    cw_tensor_destroy(tx), cw_tensor_destroy(ty[0]), cw_tensor_destroy(ty[1]);
    for (int k = 0; k < 2; k++) free(un[k]), free(out[k]);
    free(x), free(f1), free(f2), free(u), free(d1), free(r0), free(hh), free(c2), free(ref1), free(ref2), free(c2f);
    free(h2);
}

/* A long clip (many more frames than rows) under a tight budget: the planner cuts the causal
 * conv along D, with far less halo than H bands at the same budget need. */
static void test_long_clip(cw_context *ctx) {
    enum { LT = 48, LC = 8, LH = 8, LW = 8 };
    cw_rng r = {cw_test_seed(48)};
    const cw_tensor_desc xd = desc5(1, LC, LT, LH, LW);
    const int64_t n_x = cw_tensor_desc_numel(&xd), cdim = LC, wd[5] = {LC, LC, 3, 3, 3};
    float *x = rnd(&r, n_x, 1.0f, 0.1f), *gm = rnd(&r, LC, 0.2f, 1.0f), *bt = rnd(&r, LC, 0.2f, 0.0f);
    float *w = rnd(&r, LC * LC * 27, 0.1f, 0.0f), *h = malloc((size_t)n_x * sizeof *h);
    double *ref = malloc((size_t)n_x * sizeof *ref);
    cw_conv_params p = CW_CONV_PARAMS_INIT;
    p.spatial = 3;
    p.pad_pre[0] = 2;
    p.pad_pre[1] = p.pad_post[1] = p.pad_pre[2] = p.pad_post[2] = 1;
    cw_tensor_desc wdesc;
    ASSERT_OK(cw_tensor_desc_make(&wdesc, CW_F32, 5, wd));
    ref_gn_silu(x, 1, LC, LT * LH * LW, 2, gm, bt, h);
    cw_ref_conv(&xd, h, &wdesc, w, NULL, &p, &xd, ref);
    const int64_t xdims[5] = {1, LC, LT, LH, LW};
    cw_tensor *tx = upload(ctx, CW_F32, 5, xdims, x);
    cw_tensor *tg = upload(ctx, CW_F32, 1, &cdim, gm), *tb = upload(ctx, CW_F32, 1, &cdim, bt);
    cw_tensor *tw = upload(ctx, CW_F32, 5, wd, w), *ty;
    ASSERT_OK_CTX(ctx, cw_tensor_create(&ty, ctx, &xd));
    cw_graph *g;
    ASSERT_OK(cw_graph_create(&g, ctx));
    cw_node nx, ng, nb, nw, a;
    ASSERT_OK_CTX(ctx, cw_graph_input(g, &nx, "x", &xd));
    ASSERT_OK_CTX(ctx, cw_graph_constant(g, &ng, "gamma", tg));
    ASSERT_OK_CTX(ctx, cw_graph_constant(g, &nb, "beta", tb));
    ASSERT_OK_CTX(ctx, cw_graph_constant(g, &nw, "w", tw));
    ASSERT_OK_CTX(ctx, cw_graph_group_norm(g, &a, nx, ng, nb, 2, 1e-6f));
    ASSERT_OK_CTX(ctx, cw_graph_silu(g, &a, a));
    ASSERT_OK_CTX(ctx, cw_graph_conv(g, &a, a, nw, CW_NODE_NONE, &p));
    ASSERT_OK_CTX(ctx, cw_graph_output(g, a, "y"));
    /* the tight budget: the smallest that H bands fit (so both axes fit) */
    cw_compile_options o = CW_COMPILE_OPTIONS_INIT;
    o.streams = 2;
    o.patch_axis = CW_PATCH_AXIS_H;
    int64_t min_h = 0, min_d = 0, min_auto = 0;
    ASSERT_OK_CTX(ctx, cw_graph_min_budget(g, &min_h, &o));
    o.patch_axis = CW_PATCH_AXIS_D;
    ASSERT_OK_CTX(ctx, cw_graph_min_budget(g, &min_d, &o));
    o.patch_axis = CW_PATCH_AXIS_AUTO;
    ASSERT_OK_CTX(ctx, cw_graph_min_budget(g, &min_auto, &o));
    ASSERT_LE_I(min_auto, min_h);
    ASSERT_LE_I(min_auto, min_d);
    float *out = malloc((size_t)n_x * sizeof *out);
    static const char *axn[3] = {"auto", "H", "D"};
    int n_d[3] = {0, 0, 0};
    for (int ax = 0; ax < 3; ax++) {
        o.patch_axis = (cw_patch_axis)ax;
        o.temp_budget = min_h;
        cw_plan *plan;
        ASSERT_OK_CTX(ctx, cw_graph_compile(g, &plan, &o));
        ASSERT_OK_CTX(ctx, cw_plan_run(plan, &tx, 1, &ty, 1));
        ASSERT_OK(cw_tensor_download(ty, out, (size_t)n_x * 4));
        double e = cw_ref_rel_err(&xd, out, ref);
        if (!(e <= 1e-5)) {
            fprintf(stderr, "long clip, axis %s: rel err %g\n", axn[ax], e);
            cw_test_failures++;
        }
        cw_plan_stats st;
        ASSERT_OK(cw_plan_get_stats(plan, &st));
        int nc = 0;
        all_axes(plan, "D", &n_d[ax], &nc);
        printf("long clip [1,%d,%d,%d,%d], budget %lld B (H's smallest), axis %s: cut along %s, %lld patches, "
               "halo recompute %.2f%% of conv FLOPs\n",
               LC, LT, LH, LW, (long long)min_h, axn[ax], n_d[ax] ? "D" : "H", (long long)st.n_patches,
               st.halo_overhead_pct);
        cw_plan_destroy(plan);
    }
    printf("long clip smallest budgets: H %lld B, D %lld B, auto %lld B\n", (long long)min_h, (long long)min_d,
           (long long)min_auto);
    /* at H's smallest budget both axes fit: auto keeps the faster algorithm, then the smaller
     * halo (D here; which algorithms fit depends on the build, so this is printed, not
     * asserted). Below it only frame bands fit: auto must cut along D. */
    ASSERT_EQ_I(n_d[CW_PATCH_AXIS_H], 0);
    ASSERT_EQ_I(n_d[CW_PATCH_AXIS_D], 1);
    ASSERT_TRUE(min_d < min_h);
    o.temp_budget = (min_d + min_h) / 2;
    o.patch_axis = CW_PATCH_AXIS_H;
    cw_plan *plan = NULL;
    ASSERT_STATUS(cw_graph_compile(g, &plan, &o), CW_ERR_BUDGET);
    o.patch_axis = CW_PATCH_AXIS_AUTO;
    ASSERT_OK_CTX(ctx, cw_graph_compile(g, &plan, &o));
    ASSERT_OK_CTX(ctx, cw_plan_run(plan, &tx, 1, &ty, 1));
    ASSERT_OK(cw_tensor_download(ty, out, (size_t)n_x * 4));
    double e = cw_ref_rel_err(&xd, out, ref);
    if (!(e <= 1e-5)) {
        fprintf(stderr, "long clip, auto at %lld B: rel err %g\n", (long long)o.temp_budget, e);
        cw_test_failures++;
    }
    int nd = 0, nc = 0;
    cw_plan_stats st;
    ASSERT_OK(cw_plan_get_stats(plan, &st));
    ASSERT_TRUE(all_axes(plan, "D", &nd, &nc));
    printf("long clip, budget %lld B (below H's smallest): auto cuts along D, %lld patches, halo recompute %.2f%%\n",
           (long long)o.temp_budget, (long long)st.n_patches, st.halo_overhead_pct);
    cw_plan_destroy(plan);
    cw_graph_destroy(g);
    cw_tensor *all[] = {tx, tg, tb, tw, ty};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) cw_tensor_destroy(all[i]);
    free(x), free(gm), free(bt), free(w), free(h), free(ref), free(out);
}

int main(void) {
    test_frame_halos();
    cw_context_config cfg = CW_CONTEXT_CONFIG_INIT;
    cfg.backend = CW_BACKEND_CPU;
    cfg.flags = CW_FLAG_POISON;
    cw_context *ctx;
    ASSERT_OK(cw_context_create(&ctx, &cfg));
    test_block(ctx);
    /* again with random delays on every stream: a missing dependency between bands along
     * different axes (a D-band reader of H-band writers, or the reverse) shows */
    cw_context *chaos;
    cfg.flags = CW_FLAG_POISON | CW_FLAG_CHAOS;
    cfg.chaos_seed = cw_test_seed(24) + 1;
    ASSERT_OK(cw_context_create(&chaos, &cfg));
    test_block(chaos);
    cw_context_destroy(chaos);
    test_long_clip(ctx);
    /* an axis that is no cw_patch_axis */
    cw_compile_options o = CW_COMPILE_OPTIONS_INIT;
    o.patch_axis = (cw_patch_axis)7;
    int64_t b = 0;
    cw_graph *g;
    ASSERT_OK(cw_graph_create(&g, ctx));
    cw_tensor_desc xd = desc5(1, 2, 3, 4, 4);
    cw_node nx, ny;
    ASSERT_OK_CTX(ctx, cw_graph_input(g, &nx, "x", &xd));
    ASSERT_OK_CTX(ctx, cw_graph_silu(g, &ny, nx));
    ASSERT_OK_CTX(ctx, cw_graph_output(g, ny, "y"));
    ASSERT_STATUS(cw_graph_min_budget(g, &b, &o), CW_ERR_INVALID_ARG);
    cw_graph_destroy(g);
    cw_context_destroy(ctx);
    TEST_DONE();
}
