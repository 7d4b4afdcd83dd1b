/* The public one-call convolution (a one-node plan): random 2-D and 3-D convs through
 * cw_conv_forward against the naive double reference, under budgets from the smallest
 * that works to unlimited and with 1-3 streams; strided output views; a 1-byte budget
 * falls back from a workspace algorithm to one that needs none; overlap and shape errors
 * are refused. */
#include <string.h>

#include "conv_ref.h"
#include "convweave/convweave.h"
#include "testutil.h"

static cw_tensor *make(cw_context *ctx, int rank, const int64_t *dims, cw_rng *r, float **host) {
    cw_tensor_desc d;
    ASSERT_OK(cw_tensor_desc_make(&d, CW_F32, rank, dims));
    int64_t n = cw_tensor_desc_numel(&d);
    float *h = malloc((size_t)n * sizeof *h);
    for (int64_t i = 0; i < n; i++) h[i] = cw_rng_float(r);
    cw_tensor *t;
    ASSERT_OK_CTX(ctx, cw_tensor_create(&t, ctx, &d));
    ASSERT_OK_CTX(ctx, cw_tensor_upload(t, h, (size_t)n * 4));
    *host = h;
    return t;
}

/* The compiled one-node plan's description for x, w (no bias) under temp budget `budget`. */
static char *describe(cw_context *ctx, cw_tensor *x, cw_tensor *w, const cw_conv_params *p, int64_t budget) {
    cw_graph *g;
    cw_node nx, nw, ny;
    ASSERT_OK(cw_graph_create(&g, ctx));
    ASSERT_OK_CTX(ctx, cw_graph_input(g, &nx, "x", cw_tensor_get_desc(x)));
    ASSERT_OK_CTX(ctx, cw_graph_constant(g, &nw, "w", w));
    ASSERT_OK_CTX(ctx, cw_graph_conv(g, &ny, nx, nw, CW_NODE_NONE, p));
    ASSERT_OK_CTX(ctx, cw_graph_output(g, ny, "y"));
    cw_compile_options o = CW_COMPILE_OPTIONS_INIT;
    o.temp_budget = budget;
    cw_plan *plan;
    ASSERT_OK_CTX(ctx, cw_graph_compile(g, &plan, &o));
    char *text = NULL;
    ASSERT_OK_CTX(ctx, cw_plan_describe(plan, &text, 0));
    cw_plan_destroy(plan);
    cw_graph_destroy(g);
    return text;
}

/* A 1-byte budget on a conv whose fastest algorithm needs workspace (3x3, 64 -> 64
 * channels: im2col or Winograd, megabytes of it): the workspace cannot fit, so the plan
 * must take the algorithm that needs none (cpu_direct) and still compute the conv. */
static void check_one_byte_budget(cw_context *ctx) {
    cw_rng r = {5};
    int64_t xd[4] = {1, 64, 24, 24}, wd[4] = {64, 64, 3, 3};
    float *hx, *hw;
    cw_tensor *x = make(ctx, 4, xd, &r, &hx), *w = make(ctx, 4, wd, &r, &hw);
    cw_conv_params p = CW_CONV_PARAMS_INIT;
    p.pad_pre[0] = p.pad_pre[1] = p.pad_post[0] = p.pad_post[1] = 1;
    char *fast = describe(ctx, x, w, &p, -1), *tiny = describe(ctx, x, w, &p, 1);
    fprintf(stderr, "unlimited:\n%s\n1-byte budget:\n%s\n", fast, tiny);
    ASSERT_TRUE(strstr(fast, "workspace 0 B") == NULL); /* the fastest needs workspace */
    ASSERT_TRUE(strstr(tiny, "algo cpu_direct") != NULL && strstr(tiny, "workspace 0 B") != NULL);
    cw_free(fast), cw_free(tiny);
    cw_tensor_desc yd;
    ASSERT_OK_CTX(ctx, cw_conv_output_desc(ctx, &yd, cw_tensor_get_desc(x), cw_tensor_get_desc(w), &p));
    int64_t yn = cw_tensor_desc_numel(&yd);
    double *ref = malloc((size_t)yn * sizeof *ref);
    float *out = malloc((size_t)yn * sizeof *out);
    cw_ref_conv(cw_tensor_get_desc(x), hx, cw_tensor_get_desc(w), hw, NULL, &p, &yd, ref);
    cw_tensor *y;
    ASSERT_OK_CTX(ctx, cw_tensor_create(&y, ctx, &yd));
    cw_compile_options o = CW_COMPILE_OPTIONS_INIT;
    o.temp_budget = 1;
    ASSERT_OK_CTX(ctx, cw_conv_forward(ctx, x, w, NULL, y, &p, &o));
    ASSERT_OK_CTX(ctx, cw_tensor_download(y, out, yn * 4));
    double e = cw_ref_rel_err(&yd, out, ref);
    fprintf(stderr, "1-byte budget: rel err %.3g vs the double reference\n", e);
    CHECK(e <= 1e-5);
    free(ref), free(out), free(hx), free(hw);
    cw_tensor_destroy(y), cw_tensor_destroy(x), cw_tensor_destroy(w);
}

int main(void) {
    cw_rng r = {cw_test_seed(77)};
    int cases = cw_test_quick() ? 12 : 60;
    cw_context_config cfg = CW_CONTEXT_CONFIG_INIT;
    cfg.backend = CW_BACKEND_CPU;
    cfg.flags = CW_FLAG_POISON;
    cw_context *ctx;
    ASSERT_OK(cw_context_create(&ctx, &cfg));
    int checked = 0;
    for (int c = 0; c < cases; c++) {
        int sp = cw_rng_range(&r, 0, 3) == 0 ? 3 : 2;
        int64_t groups = cw_rng_range(&r, 1, 2);
        int64_t cin = groups * cw_rng_range(&r, 1, 4), cout = groups * cw_rng_range(&r, 1, 4);
        cw_conv_params p = CW_CONV_PARAMS_INIT;
        p.spatial = sp;
        p.groups = groups;
        int64_t xd[5] = {cw_rng_range(&r, 1, 2), cin}, wd[5] = {cout, cin / groups};
        for (int i = 0; i < sp; i++) {
            int64_t k = cw_rng_range(&r, 1, sp == 3 ? 3 : 5);
            wd[2 + i] = k;
            p.stride[i] = cw_rng_range(&r, 1, 2);
            p.dilation[i] = cw_rng_range(&r, 1, 2);
            p.pad_pre[i] = cw_rng_range(&r, 0, 2);
            p.pad_post[i] = cw_rng_range(&r, 0, 2);
            xd[2 + i] = (k - 1) * p.dilation[i] + 1 + cw_rng_range(&r, 0, sp == 3 ? 6 : 24);
        }
        float *hx, *hw, *hb;
        cw_tensor *x = make(ctx, 2 + sp, xd, &r, &hx), *w = make(ctx, 2 + sp, wd, &r, &hw);
        cw_tensor *b = make(ctx, 1, &cout, &r, &hb);
        cw_tensor_desc yd;
        ASSERT_OK_CTX(ctx, cw_conv_output_desc(ctx, &yd, cw_tensor_get_desc(x), cw_tensor_get_desc(w), &p));
        /* y: a strided view (every other channel of a wider tensor) half the time */
        int strided = (int)cw_rng_range(&r, 0, 1);
        cw_tensor_desc big = yd;
        big.dims[1] *= 2;
        memset(big.strides, 0, sizeof big.strides);
        cw_tensor *ybig;
        ASSERT_OK_CTX(ctx, cw_tensor_create(&ybig, ctx, strided ? &big : &yd));
        cw_tensor_desc view = strided ? big : yd;
        if (strided) {
            int64_t bd[CW_MAX_RANK];
            memcpy(bd, big.dims, sizeof bd);
            ASSERT_OK(cw_tensor_desc_make(&big, CW_F32, big.rank, bd));
            view = yd;
            for (int i = 0; i < big.rank; i++) view.strides[i] = big.strides[i];
            view.strides[1] = big.strides[1] * 2;
        }
        cw_tensor *y;
        ASSERT_OK_CTX(ctx, cw_tensor_wrap(&y, ctx, &view, cw_tensor_get_data(ybig)));
        int64_t yn = cw_tensor_desc_numel(&yd);
        double *ref = malloc((size_t)yn * sizeof *ref);
        cw_ref_conv(cw_tensor_get_desc(x), hx, cw_tensor_get_desc(w), hw, hb, &p, &yd, ref);

        cw_compile_options o = CW_COMPILE_OPTIONS_INIT;
        o.streams = (int)cw_rng_range(&r, 1, 3);
        o.temp_budget = -1;
        int64_t span = cw_tensor_desc_numel(strided ? &big : &yd);
        float *out = malloc((size_t)span * sizeof *out);
        for (int trial = 0; trial < 3; trial++) {
            if (trial == 1) { /* the smallest budget the one-node plan accepts */
                cw_graph *g;
                cw_node nx, nw, nb, ny;
                ASSERT_OK(cw_graph_create(&g, ctx));
                ASSERT_OK_CTX(ctx, cw_graph_input(g, &nx, "x", cw_tensor_get_desc(x)));
                ASSERT_OK_CTX(ctx, cw_graph_constant(g, &nw, "w", w));
                ASSERT_OK_CTX(ctx, cw_graph_constant(g, &nb, "b", b));
                ASSERT_OK_CTX(ctx, cw_graph_conv(g, &ny, nx, nw, nb, &p));
                ASSERT_OK_CTX(ctx, cw_graph_output(g, ny, "y"));
                ASSERT_OK_CTX(ctx, cw_graph_min_budget(g, &o.temp_budget, &o));
                cw_graph_destroy(g);
            } else if (trial == 2) {
                o.temp_budget = o.temp_budget * 3;
            }
            ASSERT_OK_CTX(ctx, cw_conv_forward(ctx, x, w, b, y, &p, &o));
            ASSERT_OK(cw_tensor_download(ybig, out, (size_t)span * 4));
            double e = cw_ref_rel_err(&view, out, ref);
            if (!(e <= 1e-5)) {
                fprintf(stderr, "case %d trial %d (budget %lld, streams %d, strided %d): rel err %g\n", c, trial,
                        (long long)o.temp_budget, o.streams, strided, e);
                cw_test_failures++;
            }
            checked++;
        }
        /* output overlapping the input is refused */
        cw_tensor *alias;
        ASSERT_OK_CTX(ctx, cw_tensor_wrap(&alias, ctx, &yd, cw_tensor_get_data(x)));
        if (cw_tensor_desc_numel(&yd) > 0) {
            ASSERT_STATUS(cw_conv_forward(ctx, x, w, b, alias, &p, NULL), CW_ERR_INVALID_ARG);
            ASSERT_TRUE(strstr(cw_context_get_last_error(ctx), "overlap") != NULL);
        }
        cw_tensor_destroy(alias);
        free(out), free(ref), free(hx), free(hw), free(hb);
        cw_tensor_destroy(y), cw_tensor_destroy(ybig), cw_tensor_destroy(x), cw_tensor_destroy(w), cw_tensor_destroy(b);
    }
    /* wrong output shape names the field */
    {
        float *hx, *hw;
        int64_t xd[4] = {1, 4, 9, 9}, wd[4] = {4, 4, 3, 3}, bad[4] = {1, 4, 9, 9};
        cw_tensor *x = make(ctx, 4, xd, &r, &hx), *w = make(ctx, 4, wd, &r, &hw);
        float *hy;
        cw_tensor *y = make(ctx, 4, bad, &r, &hy);
        cw_conv_params p = CW_CONV_PARAMS_INIT;
        ASSERT_STATUS(cw_conv_forward(ctx, x, w, NULL, y, &p, NULL), CW_ERR_INVALID_ARG);
        fprintf(stderr, "expected error: %s\n", cw_context_get_last_error(ctx));
        ASSERT_TRUE(strstr(cw_context_get_last_error(ctx), "y.dims[2]=9, expected 7") != NULL);
        free(hx), free(hw), free(hy);
        cw_tensor_destroy(x), cw_tensor_destroy(w), cw_tensor_destroy(y);
    }
    check_one_byte_budget(ctx);
    printf("cw_conv_forward: %d runs checked against the double reference\n", checked);
    cw_context_destroy(ctx);
    TEST_DONE();
}
