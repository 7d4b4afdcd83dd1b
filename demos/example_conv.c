/* example_conv: the smallest use of convweave's public API. A 3x3 convolution over a
 * 1x32x256x256 input on the cpu backend under a 4 MiB temporary-memory budget, once with
 * the one-call API and once as a one-conv graph whose plan (row patches) is printed. */
#include <stdio.h>
#include <stdlib.h>

#include "convweave/convweave.h"

#define CHECK(call)                                                                            \
    do {                                                                                       \
        cw_status st_ = (call);                                                                \
        if (st_ != CW_OK) {                                                                    \
            fprintf(stderr, "%s failed: %s: %s\n", #call, cw_status_name(st_),                 \
                    ctx ? cw_context_get_last_error(ctx) : "");                                    \
            return 1;                                                                          \
        }                                                                                      \
    } while (0)

static void fill(float *p, size_t n, unsigned seed, float scale) {
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u; /* LCG: reproducible without any library */
        p[i] = scale * ((float)(seed >> 8) / 8388608.0f - 1.0f);
    }
}

int main(void) {
    cw_context *ctx = NULL;
    cw_context_config cfg = CW_CONTEXT_CONFIG_INIT;
    cfg.backend = CW_BACKEND_CPU;
    cfg.temp_budget = 4 << 20; /* 4 MiB for workspaces and patch buffers */
    cfg.streams = 2;
    CHECK(cw_context_create(&ctx, &cfg));

    const int64_t C = 32, K = 32, H = 256, W = 256;
    int64_t xd[4] = {1, C, H, W}, wd[4] = {K, C, 3, 3}, bd[1] = {K};
    cw_tensor_desc xdesc, wdesc, bdesc, ydesc;
    CHECK(cw_tensor_desc_make(&xdesc, CW_F32, 4, xd));
    CHECK(cw_tensor_desc_make(&wdesc, CW_F32, 4, wd));
    CHECK(cw_tensor_desc_make(&bdesc, CW_F32, 1, bd));
    cw_conv_params p = CW_CONV_PARAMS_INIT;
    p.pad_pre[0] = p.pad_pre[1] = p.pad_post[0] = p.pad_post[1] = 1; /* "same" 3x3 */
    CHECK(cw_conv_output_desc(ctx, &ydesc, &xdesc, &wdesc, &p));

    size_t nx = (size_t)cw_tensor_desc_numel(&xdesc), nw = (size_t)cw_tensor_desc_numel(&wdesc);
    size_t ny = (size_t)cw_tensor_desc_numel(&ydesc);
    float *hx = malloc(nx * sizeof(float)), *hw = malloc(nw * sizeof(float)), *hb = malloc((size_t)K * sizeof(float));
    float *hy1 = malloc(ny * sizeof(float)), *hy2 = malloc(ny * sizeof(float));
    if (!hx || !hw || !hb || !hy1 || !hy2) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    fill(hx, nx, 1, 1.0f);
    fill(hw, nw, 2, 0.1f); /* ~ sqrt(3 / fan_in), fan_in = 32 * 9: outputs stay O(1) */
    fill(hb, (size_t)K, 3, 0.1f);

    cw_tensor *x, *w, *b, *y;
    CHECK(cw_tensor_create(&x, ctx, &xdesc));
    CHECK(cw_tensor_create(&w, ctx, &wdesc));
    CHECK(cw_tensor_create(&b, ctx, &bdesc));
    CHECK(cw_tensor_create(&y, ctx, &ydesc));
    CHECK(cw_tensor_upload(x, hx, nx * sizeof(float)));
    CHECK(cw_tensor_upload(w, hw, nw * sizeof(float)));
    CHECK(cw_tensor_upload(b, hb, (size_t)K * sizeof(float)));

    /* 1. one call: planned under the context's budget, blocks until done */
    CHECK(cw_conv_forward(ctx, x, w, b, y, &p, NULL));
    CHECK(cw_tensor_download(y, hy1, ny * sizeof(float)));

    /* 2. the same conv as a graph, to see (and keep) its plan */
    cw_graph *g;
    cw_node in, wn, bn, out;
    CHECK(cw_graph_create(&g, ctx));
    CHECK(cw_graph_input(g, &in, "x", &xdesc));
    CHECK(cw_graph_constant(g, &wn, "w", w));
    CHECK(cw_graph_constant(g, &bn, "b", b));
    CHECK(cw_graph_conv(g, &out, in, wn, bn, &p));
    CHECK(cw_graph_output(g, out, "y"));
    cw_plan *plan;
    cw_compile_options opt = CW_COMPILE_OPTIONS_INIT; /* auto patches, the context's budget */
    CHECK(cw_graph_compile(g, &plan, &opt));
    char *text = NULL;
    CHECK(cw_plan_describe(plan, &text, 0));
    printf("%s\n", text);
    cw_free(text);
    CHECK(cw_plan_run(plan, &x, 1, &y, 1));
    CHECK(cw_tensor_download(y, hy2, ny * sizeof(float)));

    cw_plan_stats s;
    CHECK(cw_plan_get_stats(plan, &s));
    double sum = 0, asum = 0, diff = 0;
    for (size_t i = 0; i < ny; i++) {
        sum += hy2[i];
        asum += hy2[i] < 0 ? -(double)hy2[i] : hy2[i]; /* no libm: the example links only convweave */
        double d = (double)hy1[i] - (double)hy2[i];
        if (d < 0) d = -d;
        if (d > diff) diff = d;
    }
    printf("y: [1, %lld, %lld, %lld], checksum sum %.6f, sum|y| %.6f, max|one-call - graph| %g\n",
           (long long)ydesc.dims[1], (long long)ydesc.dims[2], (long long)ydesc.dims[3], sum, asum, diff);
    printf("%lld patches on %d streams, %.2f ms, %.3f GFLOP (+%.1f%% halo), temp peak %lld B (predicted %lld, "
           "budget %lld)\n",
           (long long)s.n_patches, s.n_streams, s.wall_ms, s.conv_gflop, s.halo_overhead_pct, (long long)s.temp_peak,
           (long long)s.temp_predicted, (long long)cfg.temp_budget);

    cw_plan_destroy(plan);
    cw_graph_destroy(g);
    cw_tensor_destroy(x);
    cw_tensor_destroy(w);
    cw_tensor_destroy(b);
    cw_tensor_destroy(y);
    cw_context_destroy(ctx);
    free(hx);
    free(hw);
    free(hb);
    free(hy1);
    free(hy2);
    return 0;
}
