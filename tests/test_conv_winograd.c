/* Winograd F(2x2,3x3) as a cpu patch algorithm (cpu_winograd_2x3).
 * 1. Budget: 2-D and 3-D (kernel depth 1) 3x3 conv graphs at 128 channels, where `auto`
 *    picks Winograd once its workspace (the transformed weights and one tile block's
 *    operands) fits, and 2-D at 256, where a budget too small for that workspace takes its
 *    grouped variant, compiled under budgets from the smallest that works to loose ones:
 *    the allocator never holds more temporary memory than the budget, and the output is
 *    within 1e-5 of the double reference's scale.
 * 2. Determinism (docs/determinism.md): a fixed-patch Winograd plan on 1-3 streams with
 *    1-3 threads per task, under chaos + poison, gives the first plan's bits on every run;
 *    one Winograd patch (pre/post padding, several tile blocks, a strided output view) run
 *    directly on 1-4 threads gives identical bits, in f32 and f16; 640 -> 600 channels run
 *    in groups of 384 (the GEMM operand's 1 MiB cap) against the double reference.
 * 3. The conv_forward hook refuses Winograd for a problem it does not apply to. */
#include "backend/cpu/cpu.h"
#include "conv_algo_run.h"
#include "conv_ref.h"

/* 3x3 convs, depth 1 in 3-D */
static conv_graph_spec spec(int sp) {
    conv_graph_spec g = {sp, 1, 0.05f};
    return g;
}

/* The graph's output in double: the reference conv twice (the middle rounded to f32). */
static double *reference(int sp, const cw_tensor_desc *d, const float *x) {
    const int64_t n = cw_tensor_desc_numel(d), c = d->dims[1];
    int64_t wd[5] = {c, c, 3, 3, 3};
    if (sp == 3) wd[2] = 1;
    cw_tensor_desc dw;
    ASSERT_OK(cw_tensor_desc_make(&dw, CW_F32, sp + 2, wd));
    const conv_graph_spec gs = spec(sp);
    cw_conv_params p = conv_params(&gs);
    double *mid = malloc((size_t)n * sizeof(double)), *out = malloc((size_t)n * sizeof(double));
    float *midf = malloc((size_t)n * sizeof(float));
    ASSERT_TRUE(mid && out && midf);
    cw_ref_conv(d, x, &dw, const_host[0], const_host[1], &p, d, mid);
    for (int64_t i = 0; i < n; i++) midf[i] = (float)mid[i];
    cw_ref_conv(d, midf, &dw, const_host[2], const_host[3], &p, d, out);
    free(mid), free(midf);
    return out;
}

/* Part 1: budgets from the minimum up; temp_peak never above the budget. grouped: some
 * budget leaves room for the grouped variant (cpu_winograd_2x3_kN) and not for the other. */
static void test_budget(int sp, const int64_t *xd, int grouped_expected) {
    cw_context_config cfg = CW_CONTEXT_CONFIG_INIT;
    cfg.backend = CW_BACKEND_CPU;
    cfg.threads = 2;
    ASSERT_OK(cw_context_create(&ctx, &cfg));
    cw_tensor_desc d;
    const conv_graph_spec gs = spec(sp);
    cw_graph *g = make_graph(&gs, xd, &d);
    cw_tensor *in, *out;
    ASSERT_OK_CTX(ctx, cw_tensor_create(&in, ctx, &d));
    ASSERT_OK_CTX(ctx, cw_tensor_create(&out, ctx, &d));
    const size_t n = (size_t)cw_tensor_desc_numel(&d), bytes = n * 4;
    float *hx = malloc(bytes), *ho = malloc(bytes);
    ASSERT_TRUE(hx && ho);
    for (size_t i = 0; i < n; i++) hx[i] = cw_rng_float(&rng);
    ASSERT_OK(cw_tensor_upload(in, hx, bytes));
    double *ref = reference(sp, &d, hx);

    cw_compile_options o = CW_COMPILE_OPTIONS_INIT;
    o.streams = 3;
    int64_t minb = 0;
    ASSERT_OK_CTX(ctx, cw_graph_min_budget(g, &minb, &o));
    const int64_t mib = 1 << 20;
    const int64_t budgets[9] = {minb, 1 * mib, 2 * mib, 3 * mib, 4 * mib, 6 * mib, 8 * mib, 16 * mib, 64 * mib};
    int n_wino = 0, last_wino = 0, n_grouped = 0;
    for (int b = 0; b < 9; b++) {
        /* sanitizer builds: the 256-channel case skips the 1-4 MiB budgets (each checked as the
         * others are; on the machines seen they plan what minb does, but nothing relies on it) */
        if (cw_test_quick() && grouped_expected && b >= 1 && b <= 4) continue;
        o.temp_budget = budgets[b];
        cw_plan *p;
        ASSERT_OK_CTX(ctx, cw_graph_compile(g, &p, &o));
        ASSERT_OK_CTX(ctx, cw_plan_run(p, &in, 1, &out, 1));
        ASSERT_OK(cw_tensor_download(out, ho, bytes));
        cw_plan_stats st;
        ASSERT_OK(cw_plan_get_stats(p, &st));
        last_wino = describes(p, "cpu_winograd_2x3");
        n_wino += last_wino;
        const int grouped = describes(p, "cpu_winograd_2x3_k");
        n_grouped += grouped;
        ASSERT_LE_I(st.temp_peak, budgets[b]);
        double e = max_rel_diff(ho, ref, n);
        fprintf(stderr, "%d-D budget %8.3f MiB: %lld patches, temp peak %8.3f MiB (predicted %8.3f), winograd %s, rel err %.3g\n",
                sp, (double)budgets[b] / mib, (long long)st.n_patches, (double)st.temp_peak / mib,
                (double)st.temp_predicted / mib, last_wino ? (grouped ? "grouped" : "yes") : "no", e);
        CHECK(e <= 1e-5);
        cw_plan_destroy(p);
    }
    CHECK(n_wino >= 2); /* Winograd is the fastest algorithm for these shapes once it fits */
    CHECK(last_wino);
    CHECK(!grouped_expected || n_grouped >= 1);
    free(hx), free(ho), free(ref);
    cw_tensor_destroy(in), cw_tensor_destroy(out);
    cw_graph_destroy(g);
    free_consts();
    cw_context_destroy(ctx);
}

/* Part 2a: fixed patches on 1-3 streams and 1-3 threads: every run gives the same bits. */
static void test_streams_threads(void) {
    const int64_t xd[4] = {1, 128, 40, 36};
    const conv_graph_spec gs = spec(2);
    check_streams_threads(&gs, xd, "cpu_winograd_2x3");
}

/* A 2-D 3x3 problem with bias, stride and dilation 1, padding 1 on every side; the caller
 * sets the descs. */
static cw__conv_problem problem_2d(void) {
    cw__conv_problem p;
    memset(&p, 0, sizeof p);
    p.spatial = 2;
    p.groups = 1;
    p.has_bias = 1;
    for (int i = 0; i < 3; i++) p.stride[i] = p.dilation[i] = 1;
    p.pad_pre[0] = p.pad_post[0] = p.pad_pre[1] = p.pad_post[1] = 1;
    return p;
}

/* Part 2b: one Winograd patch (pre/post padding, 9 tile blocks, y a view with a padded
 * row) on 1-4 threads, in f32 and f16. */
static void test_direct_threads(cw_dtype dt) {
    cw__conv_problem p = problem_2d();
    p.pad_pre[0] = 2, p.pad_post[0] = 0;
    const int64_t C = 40, K = 36, H = 45, W = 50, Ho = H + 2 - 2, ld = W + 3; /* y's row stride */
    int64_t xd[4] = {1, C, H, W}, wd[4] = {K, C, 3, 3}, yd[4] = {1, K, Ho, W};
    ASSERT_OK(cw_tensor_desc_make(&p.x, dt, 4, xd));
    ASSERT_OK(cw_tensor_desc_make(&p.w, dt, 4, wd));
    ASSERT_OK(cw_tensor_desc_make(&p.y, dt, 4, yd));
    p.y.strides[0] = K * Ho * ld, p.y.strides[1] = Ho * ld, p.y.strides[2] = ld, p.y.strides[3] = 1;
    const int64_t nx = C * H * W, nw = K * C * 9, ny = K * Ho * ld;
    const size_t es = cw_dtype_size(dt);
    char *x = malloc((size_t)nx * es), *w = malloc((size_t)nw * es), *b = malloc((size_t)K * es);
    char *y0 = calloc((size_t)ny, es), *y = calloc((size_t)ny, es);
    ASSERT_TRUE(x && w && b && y0 && y);
    float f;
    for (int64_t i = 0; i < nx; i++) f = cw_rng_float(&rng), cw_dtype_convert(x + i * es, dt, &f, CW_F32, 1);
    for (int64_t i = 0; i < nw; i++) f = cw_rng_float(&rng), cw_dtype_convert(w + i * es, dt, &f, CW_F32, 1);
    for (int64_t i = 0; i < K; i++) f = cw_rng_float(&rng), cw_dtype_convert(b + i * es, dt, &f, CW_F32, 1);
    /* the grouped variant: 2 groups of 18 output channels, each through the 5 tile blocks */
    const int algos[2] = {CW__CPU_ALGO_WINOGRAD, CW__CPU_ALGO_WINOGRAD_KB};
    const int64_t wsb = cw__cpu_conv_workspace(&p, algos[0]), wsk = cw__cpu_conv_workspace(&p, algos[1]);
    ASSERT_TRUE(wsb > 0 && wsk > 0 && wsk < wsb);
    float *ws = malloc((size_t)wsb), *yf = malloc((size_t)ny * sizeof(float)), *yg = malloc((size_t)ny * sizeof(float));
    ASSERT_TRUE(ws && yf && yg);
    for (int a = 0; a < 2; a++) {
        for (int t = 1; t <= 4; t++) {
            cw__cpu_conv_run(&p, algos[a], x, w, b, t == 1 ? y0 : y, ws, t);
            if (t > 1 && memcmp(y, y0, (size_t)ny * es) != 0) {
                fprintf(stderr, "%s Winograd patch (algo %d): %d threads give other bits than 1\n", cw__dtype_name(dt),
                        algos[a], t);
                cw_test_failures++;
            }
        }
        cw_dtype_convert(a ? yg : yf, CW_F32, y0, dt, (size_t)ny);
    }
    /* the two variants compute each value from the same transforms: equal within f32 GEMM
     * rounding (in a half dtype, one rounding of the output) */
    double worst = 0, scale = 0;
    for (int64_t i = 0; i < ny; i++) {
        scale = fmax(scale, fabs(yf[i]));
        worst = fmax(worst, fabs((double)yf[i] - yg[i]));
    }
    fprintf(stderr, "%s Winograd patch: grouped vs not, max |d| %.3g of max |y| %.3g\n", cw__dtype_name(dt), worst,
            scale);
    CHECK(worst <= (dt == CW_F32 ? 1e-5 : 1e-2) * scale);
    free(x), free(w), free(b), free(y0), free(y), free(ws), free(yf), free(yg);
}

/* Part 2c: 640 -> 600 channels, where one group of all 600 output channels would make a
 * 1.5 MiB GEMM operand (U_ij): the ungrouped variant takes them 384 at a time
 * (cw__cpu_wino_kblock) and its result stays within 1e-5 of the double reference's scale,
 * on 1 and 2 threads with the same bits. */
static void test_capped_groups(void) {
    cw__conv_problem p = problem_2d();
    const int64_t C = 640, K = 600, H = 6, W = 10;
    int64_t xd[4] = {1, C, H, W}, wd[4] = {K, C, 3, 3}, yd[4] = {1, K, H, W};
    ASSERT_OK(cw_tensor_desc_make(&p.x, CW_F32, 4, xd));
    ASSERT_OK(cw_tensor_desc_make(&p.w, CW_F32, 4, wd));
    ASSERT_OK(cw_tensor_desc_make(&p.y, CW_F32, 4, yd));
    cw__cpu_geom g;
    cw__cpu_geom_make(&p, &g);
    CHECK(cw__cpu_wino_kblock(&g, 0) == 384);
    const int64_t nx = C * H * W, nw = K * C * 9, ny = K * H * W;
    float *x = malloc((size_t)nx * 4), *w = malloc((size_t)nw * 4), *b = malloc((size_t)K * 4);
    float *y1 = malloc((size_t)ny * 4), *y2 = malloc((size_t)ny * 4);
    double *ref = malloc((size_t)ny * sizeof *ref);
    const int64_t wsb = cw__cpu_conv_workspace(&p, CW__CPU_ALGO_WINOGRAD);
    float *ws = malloc((size_t)wsb);
    ASSERT_TRUE(x && w && b && y1 && y2 && ref && ws);
    for (int64_t i = 0; i < nx; i++) x[i] = cw_rng_float(&rng);
    for (int64_t i = 0; i < nw; i++) w[i] = cw_rng_float(&rng) * 0.05f;
    for (int64_t i = 0; i < K; i++) b[i] = cw_rng_float(&rng);
    cw__cpu_conv_run(&p, CW__CPU_ALGO_WINOGRAD, x, w, b, y1, ws, 1);
    cw__cpu_conv_run(&p, CW__CPU_ALGO_WINOGRAD, x, w, b, y2, ws, 2);
    CHECK(memcmp(y1, y2, (size_t)ny * 4) == 0);
    cw_conv_params cp = CW_CONV_PARAMS_INIT;
    cp.pad_pre[0] = cp.pad_post[0] = cp.pad_pre[1] = cp.pad_post[1] = 1;
    cw_ref_conv(&p.x, x, &p.w, w, b, &cp, &p.y, ref);
    double worst = 0, scale = 0;
    for (int64_t i = 0; i < ny; i++) {
        scale = fmax(scale, fabs(ref[i]));
        worst = fmax(worst, fabs(y1[i] - ref[i]));
    }
    fprintf(stderr, "Winograd 640 -> 600 in groups of 384: max |d| %.3g of max |y| %.3g\n", worst, scale);
    CHECK(worst <= 1e-5 * scale);
    free(x), free(w), free(b), free(y1), free(y2), free(ref), free(ws);
}

/* Part 3: the hook refuses Winograd where it does not apply (a 5x5 kernel). */
static void test_refused(void) {
    cw_context_config cfg = CW_CONTEXT_CONFIG_INIT;
    cfg.backend = CW_BACKEND_CPU;
    ASSERT_OK(cw_context_create(&ctx, &cfg));
    cw__stream *s;
    ASSERT_OK_CTX(ctx, cw__context_stream(ctx, 0, &s));
    cw__conv_problem p;
    memset(&p, 0, sizeof p);
    p.spatial = 2;
    p.groups = 1;
    for (int i = 0; i < 3; i++) p.stride[i] = p.dilation[i] = 1;
    int64_t xd[4] = {1, 4, 8, 8}, wd[4] = {4, 4, 5, 5}, yd[4] = {1, 4, 4, 4};
    ASSERT_OK(cw_tensor_desc_make(&p.x, CW_F32, 4, xd));
    ASSERT_OK(cw_tensor_desc_make(&p.w, CW_F32, 4, wd));
    ASSERT_OK(cw_tensor_desc_make(&p.y, CW_F32, 4, yd));
    cw__conv_algo a;
    memset(&a, 0, sizeof a);
    a.id = CW__CPU_ALGO_WINOGRAD;
    snprintf(a.name, sizeof a.name, "cpu_winograd_2x3");
    float x[256] = {0}, w[400] = {0}, y[64] = {0}, ws[64];
    ASSERT_STATUS(cw__op_conv_forward(ctx->be, s, &p, &a, x, w, NULL, y, ws, sizeof ws), CW_ERR_UNSUPPORTED);
    CHECK(strstr(cw_context_get_last_error(ctx), "winograd") != NULL);
    CHECK(cw__cpu_conv_workspace(&p, CW__CPU_ALGO_WINOGRAD) < 0);
    cw_context_destroy(ctx);
}

int main(void) {
    rng.s = cw_test_seed(0x3163A77ull);
    const int64_t x2[4] = {1, 128, 32, 30}, x3[5] = {1, 128, 3, 20, 18}, xk[4] = {1, 256, 6, 256};
    test_budget(2, x2, 0);
    test_budget(3, x3, 0);
    /* 256 channels: the transformed weights alone are 4 MiB, half that in groups of 128 */
    test_budget(2, xk, 1);
    test_streams_threads();
    test_direct_threads(CW_F32);
    test_direct_threads(CW_F16);
    test_capped_groups();
    test_refused();
    TEST_DONE();
}
