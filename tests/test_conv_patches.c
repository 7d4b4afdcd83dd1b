/* The height-patch planner: hand-computed halo rows (stride, dilation, asymmetric and
 * oversized padding, 3-D), balanced bounds, halo overhead, and budget sweeps from the
 * smallest feasible workspace cap to unlimited (results vs the double reference). */
#include "backend/cpu/cpu.h"
#include "conv_ref.h"
#include "alloc/alloc.h"
#include "scheduler/planner.h"
#include "testutil.h"

#define TOL 1e-5

/* A 2-D (or 3-D) problem with contiguous tensors. */
static void make_problem(cw__conv_problem *pr, const cw_conv_params *p, int sp, const int64_t *xdims, const int64_t *wdims,
                         int has_bias) {
    cw_tensor_desc x, w, y;
    ASSERT_OK(cw_tensor_desc_make(&x, CW_F32, sp + 2, xdims));
    ASSERT_OK(cw_tensor_desc_make(&w, CW_F32, sp + 2, wdims));
    ASSERT_OK(cw_conv_output_desc(NULL, &y, &x, &w, p));
    cw__conv_problem_init(pr, &x, &w, has_bias, &y, p);
}

typedef struct expect {
    int64_t o0, o1, a, b, pre, post;
} expect;

static void check_patch(const cw__conv_problem *pr, expect e, int line) {
    cw__patch pt;
    ASSERT_OK(cw__patch_make(pr, e.o0, e.o1, &pt));
    int hd = pr->spatial, hp = pr->spatial - 2;
    if (pt.a != e.a || pt.b != e.b || pt.pad_pre != e.pre || pt.pad_post != e.post) {
        fprintf(stderr, "line %d: rows [%lld,%lld): got a=%lld b=%lld pre=%lld post=%lld, expected %lld %lld %lld %lld\n",
                line, (long long)e.o0, (long long)e.o1, (long long)pt.a, (long long)pt.b, (long long)pt.pad_pre,
                (long long)pt.pad_post, (long long)e.a, (long long)e.b, (long long)e.pre, (long long)e.post);
        cw_test_failures++;
    }
    CHECK(pt.prob.x.dims[hd] == e.b - e.a);
    CHECK(pt.prob.y.dims[hd] == e.o1 - e.o0);
    CHECK(pt.prob.pad_pre[hp] == e.pre && pt.prob.pad_post[hp] == e.post);
    CHECK(pt.prob.x.strides[hd] == pr->x.strides[hd] && pt.prob.y.strides[1] == pr->y.strides[1]);
    CHECK(pt.x_offset == (e.a < e.b ? e.a * pr->x.strides[hd] : 0));
    CHECK(pt.y_offset == e.o0 * pr->y.strides[hd]);
}
#define PATCH(pr, o0, o1, a, b, pre, post) check_patch(pr, (expect){o0, o1, a, b, pre, post}, __LINE__)

static void test_halo_math(void) {
    cw__conv_problem pr;
    {   /* 3x3, stride 1, pad 1/1, H = 8: H_out = 8 */
        cw_conv_params p = CW_CONV_PARAMS_INIT;
        p.pad_pre[0] = p.pad_post[0] = p.pad_pre[1] = p.pad_post[1] = 1;
        make_problem(&pr, &p, 2, (int64_t[]){1, 2, 8, 5}, (int64_t[]){3, 2, 3, 3}, 0);
        ASSERT_EQ_I(pr.y.dims[2], 8);
        PATCH(&pr, 0, 4, 0, 5, 1, 0); /* i0 = -1, i1 = 3 - 1 + 2 + 1 = 5 */
        PATCH(&pr, 4, 8, 3, 8, 0, 1); /* i0 = 3, i1 = 9 */
        PATCH(&pr, 2, 3, 1, 4, 0, 0);
        PATCH(&pr, 0, 8, 0, 8, 1, 1);
        cw__halo h;
        int64_t bounds[3];
        cw__patch_bounds(8, 2, bounds);
        ASSERT_OK(cw__patch_halo(&pr, bounds, 2, 0.0, &h));
        ASSERT_EQ_I(h.rows_read, 10);
        ASSERT_EQ_I(h.rows_needed, 8);
        ASSERT_EQ_I(h.extra_rows, 2);
        CHECK(fabs(h.extra_rows_pct - 25.0) < 1e-12);
        CHECK(h.halo_pct == 0.0);
        /* a prep of 4 FLOP/element recomputed on 2 rows of N*C*W = 10 elements */
        ASSERT_OK(cw__patch_halo(&pr, bounds, 2, 4.0, &h));
        CHECK(fabs(h.prep_flops_extra - 80.0) < 1e-9);
        double conv = 2.0 * 1 * 3 * 8 * 5 * 2 * 9;
        CHECK(fabs(cw__conv_flops(&pr) - conv) < 1e-9);
        CHECK(fabs(h.halo_pct - 100.0 * 80.0 / conv) < 1e-9);
    }
    {   /* stride 2, k = 3, pad 1/1, H = 9: H_out = (9 + 2 - 3) / 2 + 1 = 5 */
        cw_conv_params p = CW_CONV_PARAMS_INIT;
        p.stride[0] = p.stride[1] = 2;
        p.pad_pre[0] = p.pad_post[0] = p.pad_pre[1] = p.pad_post[1] = 1;
        make_problem(&pr, &p, 2, (int64_t[]){1, 1, 9, 9}, (int64_t[]){1, 1, 3, 3}, 0);
        ASSERT_EQ_I(pr.y.dims[2], 5);
        PATCH(&pr, 0, 2, 0, 4, 1, 0); /* i0 = -1, i1 = 2 - 1 + 3 = 4 */
        PATCH(&pr, 2, 5, 3, 9, 0, 1); /* i0 = 3, i1 = 8 - 1 + 3 = 10 -> clip 9 */
        PATCH(&pr, 1, 2, 1, 4, 0, 0); /* i0 = 1, i1 = 4 */
    }
    {   /* dilation 2, k = 3 (effective 5), pad 2/2, H = 10: H_out = 10 */
        cw_conv_params p = CW_CONV_PARAMS_INIT;
        p.dilation[0] = p.dilation[1] = 2;
        p.pad_pre[0] = p.pad_post[0] = p.pad_pre[1] = p.pad_post[1] = 2;
        make_problem(&pr, &p, 2, (int64_t[]){1, 1, 10, 6}, (int64_t[]){1, 1, 3, 3}, 0);
        ASSERT_EQ_I(pr.y.dims[2], 10);
        PATCH(&pr, 3, 6, 1, 8, 0, 0);  /* i0 = 1, i1 = 5 - 2 + 4 + 1 = 8 */
        PATCH(&pr, 7, 10, 5, 10, 0, 2); /* i0 = 5, i1 = 12 */
        PATCH(&pr, 0, 1, 0, 3, 2, 0);  /* i0 = -2, i1 = 3 */
    }
    {   /* asymmetric: pad_pre 0, pad_post 2, k = 3, H = 6: H_out = 6 */
        cw_conv_params p = CW_CONV_PARAMS_INIT;
        p.pad_post[0] = 2;
        make_problem(&pr, &p, 2, (int64_t[]){1, 1, 6, 4}, (int64_t[]){1, 1, 3, 3}, 0);
        ASSERT_EQ_I(pr.y.dims[2], 6);
        PATCH(&pr, 0, 1, 0, 3, 0, 0);
        PATCH(&pr, 5, 6, 5, 6, 0, 2); /* i0 = 5, i1 = 8 */
        PATCH(&pr, 3, 6, 3, 6, 0, 2);
    }
    {   /* padding beyond the kernel's reach: k = 1, pad_pre 3, H = 2: rows 0..2 read only
         * padding (an empty-input band), H_out = 5 */
        cw_conv_params p = CW_CONV_PARAMS_INIT;
        p.pad_pre[0] = 3;
        p.pad_post[0] = 1;
        make_problem(&pr, &p, 2, (int64_t[]){1, 1, 2, 3}, (int64_t[]){1, 1, 1, 1}, 1);
        ASSERT_EQ_I(pr.y.dims[2], 6);
        PATCH(&pr, 0, 3, 0, 0, 3, 0); /* i0 = -3, i1 = 0: empty, padding kept in pre */
        PATCH(&pr, 3, 5, 0, 2, 0, 0);
        PATCH(&pr, 5, 6, 2, 2, 1, 0); /* i0 = 2 = H: empty at the bottom */
        PATCH(&pr, 2, 4, 0, 1, 1, 0); /* i0 = -1, i1 = 1 */
        cw__patch pt;
        ASSERT_OK(cw__patch_make(&pr, 0, 3, &pt));
        CHECK(cw__patch_is_empty(&pt));
    }
    {   /* trailing input rows never read: k = 2, stride 3, H = 7: H_out = 2, rows 5, 6 unused */
        cw_conv_params p = CW_CONV_PARAMS_INIT;
        p.stride[0] = 3;
        make_problem(&pr, &p, 2, (int64_t[]){1, 1, 7, 3}, (int64_t[]){1, 1, 2, 1}, 0);
        ASSERT_EQ_I(pr.y.dims[2], 2);
        PATCH(&pr, 1, 2, 3, 5, 0, 0);
        PATCH(&pr, 0, 2, 0, 5, 0, 0);
    }
    {   /* 3-D: H is dim 3, params index 1; stride 2, pad 1/0 in H */
        cw_conv_params p = CW_CONV_PARAMS_INIT;
        p.spatial = 3;
        p.stride[1] = 2;
        p.pad_pre[1] = 1;
        p.pad_pre[0] = p.pad_post[0] = 1;
        make_problem(&pr, &p, 3, (int64_t[]){1, 2, 3, 8, 4}, (int64_t[]){2, 2, 3, 3, 1}, 0);
        ASSERT_EQ_I(pr.y.dims[3], 4); /* (8 + 1 - 3) / 2 + 1 */
        PATCH(&pr, 0, 1, 0, 2, 1, 0);
        PATCH(&pr, 1, 3, 1, 6, 0, 0); /* i0 = 1, i1 = 4 - 1 + 3 = 6 */
        PATCH(&pr, 3, 4, 5, 8, 0, 0); /* i0 = 5, i1 = 8 */
        CHECK(pr.x.strides[3] == 4 && pr.y.strides[3] == 4);
    }
    /* row ranges outside the output are rejected */
    cw__patch pt;
    ASSERT_STATUS(cw__patch_make(&pr, 2, 2, &pt), CW_ERR_INVALID_ARG);
    ASSERT_STATUS(cw__patch_make(&pr, 0, 5, &pt), CW_ERR_INVALID_ARG);
    ASSERT_STATUS(cw__patch_make(&pr, -1, 1, &pt), CW_ERR_INVALID_ARG);

    int64_t bd[6];
    cw__patch_bounds(10, 3, bd);
    CHECK(bd[0] == 0 && bd[1] == 3 && bd[2] == 6 && bd[3] == 10);
    cw__patch_bounds(5, 5, bd);
    for (int i = 0; i <= 5; i++) CHECK(bd[i] == i);
    for (int64_t h = 1; h < 200; h += 7)
        for (int p = 1; p <= h && p <= 40; p++) {
            int64_t b2[41];
            cw__patch_bounds(h, p, b2);
            CHECK(b2[0] == 0 && b2[p] == h);
            for (int i = 0; i < p; i++) {
                int64_t rows = b2[i + 1] - b2[i];
                CHECK(rows == h / p || rows == (h + p - 1) / p);
            }
        }
}

/* ---- budget sweeps ---------------------------------------------------------------------- */

/* A backend whose only algorithm is the cpu GEMM (so a small cap cannot fall back). */
static cw_status gemm_only_algos(cw__backend *be, const cw__conv_problem *p, cw__conv_algo *out, int max, int *n) {
    cw__conv_algo all[CW__CPU_ALGO_COUNT];
    int k = 0;
    cw_status st = cw__cpu_conv_algos(be, p, all, CW__CPU_ALGO_COUNT, &k);
    if (st != CW_OK) return st;
    *n = 0;
    for (int i = 0; i < k && *n < max; i++)
        if (all[i].id == CW__CPU_ALGO_GEMM) out[(*n)++] = all[i];
    return CW_OK;
}

static cw__runtime_i cpu_rt = {.name = "cpu-algos"}, gemm_rt = {.name = "gemm-only"};
static cw__ops_i cpu_ops, gemm_ops;

/* Runs the plan (P bands, algorithm id) with cw__cpu_conv_run on views; returns rel err. */
static double run_plan(const cw__conv_problem *pr, int P, int algo, const float *x, const float *w, const float *b,
                       float *y, const double *ref, int64_t *max_ws) {
    int64_t *bounds = malloc((size_t)(P + 1) * sizeof(int64_t));
    cw__patch_bounds(pr->y.dims[pr->spatial], P, bounds);
    *max_ws = 0;
    for (int i = 0; i < P; i++) {
        cw__patch pt;
        ASSERT_OK(cw__patch_make(pr, bounds[i], bounds[i + 1], &pt));
        int64_t ws = cw__cpu_conv_workspace(&pt.prob, algo);
        if (ws > *max_ws) *max_ws = ws;
        float *wsp = ws ? malloc((size_t)ws) : NULL;
        cw__cpu_conv_run(&pt.prob, algo, x + pt.x_offset, w, b, y + pt.y_offset, wsp, 1);
        free(wsp);
    }
    free(bounds);
    return cw_ref_rel_err(&pr->y, y, ref);
}

/* GEMM workspace of the tallest band of a P-band plan, computed independently. */
static int64_t gemm_ws_rows(const cw__conv_problem *pr, int64_t rows) {
    int64_t R = pr->x.dims[1] / pr->groups, P = rows;
    for (int i = 0; i < pr->spatial; i++) R *= pr->w.dims[2 + i];
    for (int i = 0; i < pr->spatial; i++)
        if (2 + i != pr->spatial) P *= pr->y.dims[2 + i];
    return R * P * 4;
}

/* The planner under a plain workspace cap: one heavy stream, no prep buffers, so a plan
 * fits when the rounded workspace (cw__alloc_round) of its tallest band is <= cap. */
static cw_status choose(cw__backend *be, const cw__conv_problem *pr, int64_t cap, int p_max, int *p_out,
                        cw__conv_algo *algo, int64_t *min_cap) {
    cw__conv_share sh = {cap, 1, 1, 0, 1, p_max, 0, 0, 0, 0, 0};
    cw__conv_plan cp;
    cw_status st = cw__planner_plan(be, pr, &sh, &cp, min_cap);
    if (st == CW_OK) {
        *p_out = cp.patches;
        *algo = cp.algo;
        CHECK(cp.bounds[0] == 0 && cp.bounds[cp.patches] == pr->y.dims[pr->spatial]);
        for (int j = 0; j < cp.patches; j++) CHECK(cp.patch[j].o0 == cp.bounds[j] && cp.patch[j].o1 == cp.bounds[j + 1]);
    }
    cw__conv_plan_free(&cp);
    return st;
}

static int64_t rnd(int64_t bytes) { return cw__alloc_round(bytes); }

static void sweep(cw_context *ctx, cw_rng *r, const char *name, int sp, const int64_t *xd, const int64_t *wd,
                  const cw_conv_params *p) {
    cw__conv_problem pr;
    make_problem(&pr, p, sp, xd, wd, 1);
    const int hd = sp;
    const int64_t h_out = pr.y.dims[hd];
    int64_t nx = 1, nw = 1, ny = 1;
    for (int i = 0; i < sp + 2; i++) nx *= pr.x.dims[i], nw *= pr.w.dims[i], ny *= pr.y.dims[i];
    float *x = malloc((size_t)nx * 4), *w = malloc((size_t)nw * 4), *b = malloc((size_t)pr.y.dims[1] * 4);
    float *y = malloc((size_t)ny * 4);
    double *ref = malloc((size_t)ny * sizeof(double));
    for (int64_t i = 0; i < nx; i++) x[i] = cw_rng_float(r);
    for (int64_t i = 0; i < nw; i++) w[i] = cw_rng_float(r);
    for (int64_t i = 0; i < pr.y.dims[1]; i++) b[i] = cw_rng_float(r);
    cw_ref_conv(&pr.x, x, &pr.w, w, b, p, &pr.y, ref);

    cw__backend be_cpu = {&cpu_rt, &cpu_ops, ctx, 1, 1}, be_gemm = {&gemm_rt, &gemm_ops, ctx, 1, 1};
    cw__conv_algo fastest[2];
    int nf;
    ASSERT_OK(cw__cpu_conv_algos(NULL, &pr, fastest, 2, &nf));
    const int64_t ws_min = gemm_ws_rows(&pr, 1), ws_full = gemm_ws_rows(&pr, h_out);
    int checked = 0;
    double worst = 0;

    /* caps: unlimited, then each plan's rounded workspace and one byte less, from P = 1 to
     * H_out, then below the minimum */
    for (int P = 0; P <= h_out + 1; P++) {
        for (int minus = 0; minus <= 1; minus++) {
            int64_t cap = P == 0 ? -1 : P <= h_out ? rnd(gemm_ws_rows(&pr, (h_out + P - 1) / P)) - minus : rnd(ws_min) - 1 - minus;
            int got_p = 0;
            cw__conv_algo al;
            int64_t mc = 0;
            ASSERT_OK_CTX(ctx, choose(&be_cpu, &pr, cap, 0, &got_p, &al, &mc));
            CHECK(cap < 0 || al.workspace <= cap);
            CHECK(got_p >= 1 && got_p <= h_out);
            if (cap < 0) {
                CHECK(got_p == 1 && al.id == fastest[0].id);
            } else if (fastest[0].id == CW__CPU_ALGO_GEMM && cap >= rnd(ws_min)) {
                /* the fast algorithm fits: the smallest P whose tallest band fits */
                CHECK(al.id == CW__CPU_ALGO_GEMM);
                CHECK(rnd(gemm_ws_rows(&pr, (h_out + got_p - 1) / got_p)) <= cap);
                if (got_p > 1) CHECK(rnd(gemm_ws_rows(&pr, (h_out + got_p - 2) / (got_p - 1))) > cap);
            } else if (fastest[0].id == CW__CPU_ALGO_GEMM) {
                CHECK(al.id == CW__CPU_ALGO_DIRECT && got_p == 1); /* no P fits GEMM: direct, no workspace */
            }
            int64_t used;
            double e = run_plan(&pr, got_p, al.id, x, w, b, y, ref, &used);
            /* GEMM's workspace follows the output rows, so the tallest band's is exact;
             * oneDNN's holds the band's input rows, fewer where padding clips them, so the
             * planner's unclipped probe is an upper bound */
            if (al.id == CW__CPU_ALGO_DNNL) CHECK(used <= al.workspace);
            else CHECK(used == al.workspace);
            CHECK(cap < 0 || used <= cap);
            worst = cw_err_max(worst, e);
            if (!(e <= TOL)) {
                fprintf(stderr, "%s: cap %lld -> P=%d %s: rel err %.3g\n", name, (long long)cap, got_p, al.name, e);
                cw_test_failures++;
            }
            checked++;

            /* the GEMM-only backend: below the one-row workspace nothing fits */
            got_p = 0;
            cw_status st = choose(&be_gemm, &pr, cap, 0, &got_p, &al, &mc);
            if (cap >= 0 && cap < rnd(ws_min)) {
                ASSERT_STATUS(st, CW_ERR_BUDGET);
                ASSERT_EQ_I(mc, rnd(ws_min));
                char num[32];
                snprintf(num, sizeof num, "%lld", (long long)rnd(ws_min));
                CHECK(strstr(cw_context_get_last_error(ctx), num) != NULL);
            } else {
                ASSERT_OK_CTX(ctx, st);
                CHECK(al.id == CW__CPU_ALGO_GEMM && (cap < 0 || al.workspace <= cap));
                CHECK(cap >= 0 || al.workspace == ws_full);
            }
        }
    }
    /* p_max caps the patch count: a cap that needs all H_out bands with p_max = 2 */
    if (h_out > 2) {
        int got_p;
        cw__conv_algo al;
        int64_t mc;
        const int64_t need2 = rnd(gemm_ws_rows(&pr, (h_out + 1) / 2));
        if (need2 > rnd(ws_min)) { /* at most 2 patches under the one-row cap */
            ASSERT_STATUS(choose(&be_gemm, &pr, rnd(ws_min), 2, &got_p, &al, &mc), CW_ERR_BUDGET);
            ASSERT_EQ_I(mc, need2);
        }
    }
    fprintf(stderr, "%s: x [%lld..] H_out=%lld, %d budgets from %lld B (1 row) to unlimited (%lld B), worst rel err %.3g\n",
            name, (long long)xd[0], (long long)h_out, checked, (long long)ws_min, (long long)ws_full, worst);
    free(x), free(w), free(b), free(y), free(ref);
}

int main(void) {
    cw_rng r = {cw_test_seed(0x9A7C4E5ull)};
    test_halo_math();

    cpu_ops.conv_algos = cw__cpu_conv_algos;
    gemm_ops.conv_algos = gemm_only_algos;
    cw_context_config cfg = CW_CONTEXT_CONFIG_INIT;
    cfg.backend = CW_BACKEND_CPU;
    cw_context *ctx;
    ASSERT_OK(cw_context_create(&ctx, &cfg));

    const int quick = cw_test_quick();
    {
        cw_conv_params p = CW_CONV_PARAMS_INIT;
        p.pad_pre[0] = p.pad_post[0] = p.pad_pre[1] = p.pad_post[1] = 1;
        sweep(ctx, &r, "3x3 same", 2, (int64_t[]){1, 8, quick ? 13 : 29, 17}, (int64_t[]){8, 8, 3, 3}, &p);
    }
    {
        cw_conv_params p = CW_CONV_PARAMS_INIT;
        p.stride[0] = 2, p.dilation[0] = 2, p.pad_pre[0] = 3, p.pad_post[0] = 0, p.pad_pre[1] = 2, p.pad_post[1] = 1;
        p.groups = 2;
        sweep(ctx, &r, "5x3 s2 d2 asym groups2", 2, (int64_t[]){2, 4, 23, 11}, (int64_t[]){6, 2, 5, 3}, &p);
    }
    {
        cw_conv_params p = CW_CONV_PARAMS_INIT;
        p.spatial = 3;
        for (int i = 0; i < 3; i++) p.pad_pre[i] = p.pad_post[i] = 1;
        sweep(ctx, &r, "3x3x3 same", 3, (int64_t[]){1, 4, 3, quick ? 9 : 15, 7}, (int64_t[]){4, 4, 3, 3, 3}, &p);
    }
    {   /* big padding: some bands read no input rows; their output is the bias */
        cw_conv_params p = CW_CONV_PARAMS_INIT;
        p.pad_pre[0] = 3, p.pad_post[0] = 2, p.pad_pre[1] = 1;
        sweep(ctx, &r, "1x1 oversized pad", 2, (int64_t[]){1, 8, 4, 5}, (int64_t[]){8, 8, 1, 1}, &p);
    }
    for (int ks = 1; ks <= 3; ks += 2) { /* the empty band's output is exactly the bias (1x1; 3x3 for Winograd) */
        cw_conv_params p = CW_CONV_PARAMS_INIT;
        p.pad_pre[0] = 2 + ks, p.pad_pre[1] = p.pad_post[1] = ks / 2;
        cw__conv_problem pr;
        make_problem(&pr, &p, 2, (int64_t[]){1, 2, 2, 3}, (int64_t[]){2, 2, ks, ks}, 1);
        float x[12], w[36], b[2] = {0.5f, -0.25f}, y[2 * 5 * 3];
        for (int i = 0; i < 12; i++) x[i] = (float)i;
        for (int i = 0; i < 36; i++) w[i] = (float)(i + 1);
        for (int algo = 0; algo < CW__CPU_ALGO_COUNT; algo++) {
            if (algo == CW__CPU_ALGO_DNNL && !cw__cpu_dnnl_compiled()) continue;
            for (int i = 0; i < 30; i++) y[i] = NAN;
            cw__patch pt;
            ASSERT_OK(cw__patch_make(&pr, 0, 3, &pt));
            ASSERT_TRUE(cw__patch_is_empty(&pt));
            int64_t ws = cw__cpu_conv_workspace(&pt.prob, algo);
            if (ws < 0) continue; /* not one this shape lists (Winograd: 3x3 only) */
            float *wsp = ws ? malloc((size_t)ws) : NULL;
            cw__cpu_conv_run(&pt.prob, algo, x + pt.x_offset, w, b, y + pt.y_offset, wsp, 1);
            free(wsp);
            for (int k = 0; k < 2; k++)
                for (int i = 0; i < 9; i++) CHECK(y[k * 15 + i] == b[k]);
            for (int k = 0; k < 2; k++)
                for (int i = 9; i < 15; i++) CHECK(isnan(y[k * 15 + i])); /* rows 3, 4 untouched */
        }
    }
    cw_context_destroy(ctx);
    TEST_DONE();
}
