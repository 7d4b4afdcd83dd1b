/* Scheduler: random VAE-like graphs (ResNet blocks with GroupNorm, SiLU, 1x1 shortcuts,
 * upsample, attention) run scheduled vs a naive double-precision interpreter and vs the
 * unscheduled plan; bitwise identity across stream counts under chaos + poison; budget
 * sweep; no host sync mid-run; trace JSON shape. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conv_ref.h"
#include "convweave/convweave.h"
#include "testutil.h"

/* ---- a tiny graph IR mirrored in the test so the reference is independent ---------- */
enum { R_IN, R_CONV, R_GN, R_SILU, R_ADD, R_UP, R_ATTN };
typedef struct {
    int kind, a, b, c;
    int64_t dims[4];
    float *w, *bias, *gamma, *beta; /* owned */
    cw_tensor_desc wd;
    cw_conv_params p;
    int64_t groups;
    float scale;
} rnode;

typedef struct {
    rnode n[128];
    int count;
    int64_t c0, h0, w0;
    cw_rng rng;
} rgraph;

static float *rand_vec(cw_rng *r, int64_t n, float scale, float offset) {
    float *v = malloc((size_t)n * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = offset + scale * cw_rng_float(r);
    return v;
}

static int add_node(rgraph *g, int kind, int a, int b, int c) {
    rnode *n = &g->n[g->count];
    memset(n, 0, sizeof *n);
    n->kind = kind, n->a = a, n->b = b, n->c = c;
    if (a >= 0) memcpy(n->dims, g->n[a].dims, sizeof n->dims);
    return g->count++;
}

static int r_conv(rgraph *g, int x, int64_t k_out, int64_t ks) {
    int id = add_node(g, R_CONV, x, -1, -1);
    rnode *n = &g->n[id];
    int64_t c = g->n[x].dims[1];
    int64_t wdims[4] = {k_out, c, ks, ks};
    cw_tensor_desc_make(&n->wd, CW_F32, 4, wdims);
    n->w = rand_vec(&g->rng, k_out * c * ks * ks, 1.0f / sqrtf((float)(c * ks * ks)), 0.0f);
    n->bias = rand_vec(&g->rng, k_out, 0.1f, 0.0f);
    cw_conv_params p = CW_CONV_PARAMS_INIT;
    p.pad_pre[0] = p.pad_pre[1] = p.pad_post[0] = p.pad_post[1] = ks / 2;
    n->p = p;
    n->dims[1] = k_out;
    return id;
}

static int r_gn(rgraph *g, int x, int64_t groups) {
    int id = add_node(g, R_GN, x, -1, -1);
    rnode *n = &g->n[id];
    n->groups = groups;
    n->gamma = rand_vec(&g->rng, n->dims[1], 0.2f, 1.0f);
    n->beta = rand_vec(&g->rng, n->dims[1], 0.2f, 0.0f);
    return id;
}

static int r_resnet(rgraph *g, int x, int64_t cout, int64_t groups) {
    int64_t cin = g->n[x].dims[1];
    int h = add_node(g, R_SILU, r_gn(g, x, groups), -1, -1);
    h = r_conv(g, h, cout, 3);
    h = add_node(g, R_SILU, r_gn(g, h, groups), -1, -1);
    h = r_conv(g, h, cout, 3);
    int sc = cin != cout ? r_conv(g, x, cout, 1) : x;
    return add_node(g, R_ADD, sc, h, -1);
}

static int r_attn(rgraph *g, int x, int64_t groups) {
    int h = r_gn(g, x, groups);
    int64_t c = g->n[x].dims[1];
    int q = r_conv(g, h, c, 1), k = r_conv(g, h, c, 1), v = r_conv(g, h, c, 1);
    int a = add_node(g, R_ATTN, q, k, v);
    g->n[a].scale = 1.0f / sqrtf((float)c);
    int o = r_conv(g, a, c, 1);
    return add_node(g, R_ADD, o, x, -1);
}

/* A random decoder-like stack. */
static int build_random(rgraph *g, uint64_t seed) {
    memset(g, 0, sizeof *g);
    g->rng.s = seed;
    int64_t groups = cw_rng_range(&g->rng, 1, 2) * 2;
    g->c0 = groups * cw_rng_range(&g->rng, 1, 3);
    g->h0 = cw_rng_range(&g->rng, 5, 12);
    g->w0 = cw_rng_range(&g->rng, 4, 10);
    int x = add_node(g, R_IN, -1, -1, -1);
    g->n[x].dims[0] = 1, g->n[x].dims[1] = g->c0, g->n[x].dims[2] = g->h0, g->n[x].dims[3] = g->w0;
    int h = r_conv(g, x, g->c0 * 2, 3);
    int blocks = (int)cw_rng_range(&g->rng, 1, 3);
    for (int b = 0; b < blocks; b++) {
        int64_t cout = g->n[h].dims[1] + (cw_rng_range(&g->rng, 0, 1) ? groups : 0);
        h = r_resnet(g, h, cout, groups);
        if (b == 0 && cw_rng_range(&g->rng, 0, 1)) h = r_attn(g, h, groups);
        if (cw_rng_range(&g->rng, 0, 2) == 0) {
            h = add_node(g, R_UP, h, -1, -1);
            g->n[h].dims[2] *= 2, g->n[h].dims[3] *= 2;
            h = r_conv(g, h, g->n[h].dims[1], 3);
        }
    }
    h = add_node(g, R_SILU, r_gn(g, h, groups), -1, -1);
    return r_conv(g, h, 3, 3);
}

static void free_rgraph(rgraph *g) {
    for (int i = 0; i < g->count; i++) free(g->n[i].w), free(g->n[i].bias), free(g->n[i].gamma), free(g->n[i].beta);
}

static int64_t numel(const int64_t *d) { return d[0] * d[1] * d[2] * d[3]; }

/* ---- reference interpreter (double accumulation) ---------------------------------- */
static float **ref_run(rgraph *g, const float *input) {
    float **v = calloc((size_t)g->count, sizeof *v);
    for (int i = 0; i < g->count; i++) {
        rnode *n = &g->n[i];
        int64_t N = n->dims[0], C = n->dims[1], H = n->dims[2], W = n->dims[3], hw = H * W;
        float *o = malloc((size_t)numel(n->dims) * sizeof *o);
        v[i] = o;
        const float *a = n->a >= 0 ? v[n->a] : NULL;
        switch (n->kind) {
        case R_IN: memcpy(o, input, (size_t)numel(n->dims) * sizeof *o); break;
        case R_CONV: {
            cw_tensor_desc xd, yd;
            cw_tensor_desc_make(&xd, CW_F32, 4, g->n[n->a].dims);
            cw_tensor_desc_make(&yd, CW_F32, 4, n->dims);
            double *yr = malloc((size_t)numel(n->dims) * sizeof *yr);
            cw_ref_conv(&xd, a, &n->wd, n->w, n->bias, &n->p, &yd, yr);
            for (int64_t e = 0; e < numel(n->dims); e++) o[e] = (float)yr[e];
            free(yr);
            break;
        }
        case R_GN: {
            int64_t cg = C / n->groups;
            for (int64_t b = 0; b < N; b++)
                for (int64_t gi = 0; gi < n->groups; gi++) {
                    const float *s = a + (b * C + gi * cg) * hw;
                    double m = 0, q = 0;
                    for (int64_t e = 0; e < cg * hw; e++) m += s[e];
                    m /= (double)(cg * hw);
                    for (int64_t e = 0; e < cg * hw; e++) q += (s[e] - m) * (s[e] - m);
                    double rstd = 1.0 / sqrt(q / (double)(cg * hw) + 1e-6);
                    for (int64_t c = 0; c < cg; c++) {
                        int64_t ch = gi * cg + c;
                        for (int64_t e = 0; e < hw; e++) {
                            int64_t idx = (b * C + ch) * hw + e;
                            o[idx] = (float)((a[idx] - m) * rstd * n->gamma[ch] + n->beta[ch]);
                        }
                    }
                }
            break;
        }
        case R_SILU:
            for (int64_t e = 0; e < numel(n->dims); e++) o[e] = (float)((double)a[e] / (1.0 + exp(-(double)a[e])));
            break;
        case R_ADD:
            for (int64_t e = 0; e < numel(n->dims); e++) o[e] = a[e] + v[n->b][e];
            break;
        case R_UP: {
            int64_t h2 = g->n[n->a].dims[2], w2 = g->n[n->a].dims[3];
            for (int64_t bc = 0; bc < N * C; bc++)
                for (int64_t y = 0; y < H; y++)
                    for (int64_t x = 0; x < W; x++) o[(bc * H + y) * W + x] = a[(bc * h2 + y / 2) * w2 + x / 2];
            break;
        }
        case R_ATTN: {
            const float *q = a, *k = v[n->b], *vv = v[n->c];
            double *sc = malloc((size_t)hw * sizeof *sc);
            for (int64_t b = 0; b < N; b++)
                for (int64_t t = 0; t < hw; t++) {
                    double mx = -1e300, sum = 0;
                    for (int64_t s = 0; s < hw; s++) {
                        double d = 0;
                        for (int64_t c = 0; c < C; c++) d += (double)q[(b * C + c) * hw + t] * k[(b * C + c) * hw + s];
                        sc[s] = d * n->scale;
                        if (sc[s] > mx) mx = sc[s];
                    }
                    for (int64_t s = 0; s < hw; s++) sum += (sc[s] = exp(sc[s] - mx));
                    for (int64_t c = 0; c < C; c++) {
                        double acc = 0;
                        for (int64_t s = 0; s < hw; s++) acc += sc[s] / sum * vv[(b * C + c) * hw + s];
                        o[(b * C + c) * hw + t] = (float)acc;
                    }
                }
            free(sc);
            break;
        }
        }
    }
    return v;
}

/* ---- the same graph through the library ------------------------------------------ */
typedef struct {
    cw_context *ctx;
    cw_graph *g;
    cw_tensor **consts;
    int nconst;
    cw_node out;
    cw_tensor_desc in_d, out_d;
} lgraph;

static cw_node lconst(lgraph *L, const float *data, int rank, const int64_t *dims) {
    cw_tensor_desc d;
    cw_tensor_desc_make(&d, CW_F32, rank, dims);
    cw_tensor *t;
    ASSERT_OK_CTX(L->ctx, cw_tensor_create(&t, L->ctx, &d));
    ASSERT_OK_CTX(L->ctx, cw_tensor_upload(t, data, (size_t)cw_tensor_desc_numel(&d) * 4));
    L->consts[L->nconst++] = t;
    cw_node n;
    ASSERT_OK_CTX(L->ctx, cw_graph_constant(L->g, &n, "c", t));
    return n;
}

static void lbuild(lgraph *L, cw_context *ctx, rgraph *g, int out) {
    memset(L, 0, sizeof *L);
    L->ctx = ctx;
    L->consts = calloc(512, sizeof *L->consts);
    ASSERT_OK_CTX(ctx, cw_graph_create(&L->g, ctx));
    cw_node map[128];
    for (int i = 0; i < g->count; i++) {
        rnode *n = &g->n[i];
        switch (n->kind) {
        case R_IN:
            cw_tensor_desc_make(&L->in_d, CW_F32, 4, n->dims);
            ASSERT_OK_CTX(ctx, cw_graph_input(L->g, &map[i], "x", &L->in_d));
            break;
        case R_CONV: {
            cw_node w = lconst(L, n->w, 4, n->wd.dims);
            int64_t kd = n->dims[1];
            cw_node b = lconst(L, n->bias, 1, &kd);
            ASSERT_OK_CTX(ctx, cw_graph_conv(L->g, &map[i], map[n->a], w, b, &n->p));
            break;
        }
        case R_GN: {
            int64_t c = n->dims[1];
            cw_node gm = lconst(L, n->gamma, 1, &c), bt = lconst(L, n->beta, 1, &c);
            ASSERT_OK_CTX(ctx, cw_graph_group_norm(L->g, &map[i], map[n->a], gm, bt, n->groups, 1e-6f));
            break;
        }
        case R_SILU: ASSERT_OK_CTX(ctx, cw_graph_silu(L->g, &map[i], map[n->a])); break;
        case R_ADD: ASSERT_OK_CTX(ctx, cw_graph_add(L->g, &map[i], map[n->a], map[n->b])); break;
        case R_UP: ASSERT_OK_CTX(ctx, cw_graph_upsample2x(L->g, &map[i], map[n->a])); break;
        case R_ATTN: ASSERT_OK_CTX(ctx, cw_graph_attention(L->g, &map[i], map[n->a], map[n->b], map[n->c], n->scale)); break;
        }
    }
    L->out = map[out];
    ASSERT_OK_CTX(ctx, cw_graph_output(L->g, L->out, "y"));
    ASSERT_OK_CTX(ctx, cw_graph_get_node_desc(L->g, &L->out_d, L->out));
}

static void lfree(lgraph *L) {
    cw_graph_destroy(L->g);
    for (int i = 0; i < L->nconst; i++) cw_tensor_destroy(L->consts[i]);
    free(L->consts);
}

/* Compiles and runs; returns the output (malloc'd) and the stats. */
static float *lrun(lgraph *L, const float *input, const cw_compile_options *o, cw_plan_stats *stats) {
    cw_plan *plan;
    ASSERT_OK_CTX(L->ctx, cw_graph_compile(L->g, &plan, o));
    cw_tensor *x, *y;
    ASSERT_OK_CTX(L->ctx, cw_tensor_create(&x, L->ctx, &L->in_d));
    ASSERT_OK_CTX(L->ctx, cw_tensor_create(&y, L->ctx, &L->out_d));
    size_t ib = (size_t)cw_tensor_desc_numel(&L->in_d) * 4, ob = (size_t)cw_tensor_desc_numel(&L->out_d) * 4;
    ASSERT_OK_CTX(L->ctx, cw_tensor_upload(x, input, ib));
    ASSERT_OK_CTX(L->ctx, cw_plan_run(plan, &x, 1, &y, 1));
    float *out = malloc(ob);
    ASSERT_OK_CTX(L->ctx, cw_tensor_download(y, out, ob));
    if (stats) ASSERT_OK(cw_plan_get_stats(plan, stats));
    cw_tensor_destroy(x);
    cw_tensor_destroy(y);
    cw_plan_destroy(plan);
    return out;
}

static cw_context *make_ctx(uint32_t flags, uint64_t seed, int64_t budget) {
    cw_context_config c = CW_CONTEXT_CONFIG_INIT;
    c.backend = CW_BACKEND_CPU;
    c.flags = flags;
    c.chaos_seed = seed;
    c.temp_budget = budget;
    c.threads = 1;
    cw_context *ctx;
    ASSERT_OK(cw_context_create(&ctx, &c));
    return ctx;
}

/* The memory ladder's least point under temp budget `budget`, on 1-3 streams: within 1e-5 of
 * the unscheduled run and within its total, with no host sync mid-run. Returns the most
 * convs one of those plans recomputes. */
static int check_least(lgraph *L, const float *input, const float *unsched, int64_t on, int64_t budget, int gi) {
    int rec = 0;
    for (int s = 1; s <= 3; s++) {
        cw_compile_options o = CW_COMPILE_OPTIONS_INIT;
        o.temp_budget = budget;
        o.streams = s;
        cw_memory_point pt;
        int n = 0;
        cw_plan_stats st;
        ASSERT_OK_CTX(L->ctx, cw_graph_memory_ladder(L->g, &pt, &n, 1, &o));
        o.memory_budget = pt.total_bytes;
        float *y = lrun(L, input, &o, &st);
        double e = cw_err_rel(y, unsched, on);
        if (!(e <= 1e-5) || st.activations_peak + st.temp_predicted > pt.total_bytes || st.host_syncs != 0) {
            fprintf(stderr,
                    "graph %d streams %d, least memory %lld (%d recomputed): rel err %g, activations %lld + temp "
                    "%lld, %lld host syncs\n",
                    gi, s, (long long)pt.total_bytes, st.n_recomputed, e, (long long)st.activations_peak,
                    (long long)st.temp_predicted, (long long)st.host_syncs);
            cw_test_failures++;
        }
        if (st.n_recomputed > rec) rec = st.n_recomputed;
        free(y);
    }
    return rec;
}

int main(void) {
    uint64_t seed = cw_test_seed(20261121);
    int quick = cw_test_quick();
    int n_graphs = quick ? 6 : 24;
    int chaos_seeds = quick ? 20 : 200;

    /* 1. random graphs: scheduled (several budgets / streams, the least memory) vs reference
     * and unscheduled */
    int rec_convs = 0;
    for (int gi = 0; gi < n_graphs; gi++) {
        rgraph rg;
        int out = build_random(&rg, seed + (uint64_t)gi * 7919);
        cw_rng r = {seed ^ (uint64_t)gi};
        int64_t in_n = rg.c0 * rg.h0 * rg.w0;
        float *input = rand_vec(&r, in_n, 1.0f, 0.0f);
        float **ref = ref_run(&rg, input);
        cw_context *ctx = make_ctx(CW_FLAG_POISON, 0, 0);
        lgraph L;
        lbuild(&L, ctx, &rg, out);
        int64_t on = cw_tensor_desc_numel(&L.out_d);
        cw_compile_options o = CW_COMPILE_OPTIONS_INIT;
        o.policy = CW_PATCHES_NONE;
        cw_plan_stats st;
        float *unsched = lrun(&L, input, &o, &st);
        double e_ref = cw_err_rel(unsched, ref[out], on);
        if (!(e_ref <= 1e-4)) {
            fprintf(stderr, "graph %d: unscheduled vs reference rel err %g\n", gi, e_ref);
            cw_test_failures++;
        }
        int64_t minb = 0;
        o.policy = CW_PATCHES_AUTO;
        o.streams = 3;
        ASSERT_OK_CTX(ctx, cw_graph_min_budget(L.g, &minb, &o));
        int64_t budgets[4] = {minb, minb + minb / 2, minb * 4, -1};
        for (int bi = 0; bi < 4; bi++)
            for (int s = 1; s <= 3; s++) {
                o.streams = s;
                o.temp_budget = budgets[bi];
                float *y = lrun(&L, input, &o, &st);
                double e = cw_err_rel(y, unsched, on);
                if (!(e <= 1e-5)) {
                    fprintf(stderr, "graph %d budget %lld streams %d: scheduled vs unscheduled rel err %g\n", gi,
                            (long long)budgets[bi], s, e);
                    cw_test_failures++;
                }
                if (budgets[bi] > 0 && st.temp_peak > budgets[bi]) {
                    fprintf(stderr, "graph %d: temp peak %lld > budget %lld\n", gi, (long long)st.temp_peak,
                            (long long)budgets[bi]);
                    cw_test_failures++;
                }
                if (st.host_syncs != 0) {
                    fprintf(stderr, "graph %d budget %lld streams %d: %lld host syncs mid-run\n", gi,
                            (long long)budgets[bi], s, (long long)st.host_syncs);
                    cw_test_failures++;
                }
                free(y);
            }
        rec_convs += check_least(&L, input, unsched, on, minb * 4, gi);
        /* far below the minimum: a budget error naming a smallest budget that works */
        {
            o.temp_budget = 1024;
            cw_plan *plan = NULL;
            ASSERT_STATUS(cw_graph_compile(L.g, &plan, &o), CW_ERR_BUDGET);
            const char *msg = strstr(cw_context_get_last_error(ctx), "smallest budget that works is ");
            ASSERT_TRUE(msg != NULL);
            long long need = atoll(msg + strlen("smallest budget that works is "));
            ASSERT_EQ_I(need, minb);
            o.temp_budget = need;
            ASSERT_OK_CTX(ctx, cw_graph_compile(L.g, &plan, &o));
            cw_plan_destroy(plan);
        }
        free(unsched);
        free(input);
        for (int i = 0; i < rg.count; i++) free(ref[i]);
        free(ref);
        lfree(&L);
        cw_context_destroy(ctx);
        free_rgraph(&rg);
    }
    printf("random graphs: %d checked; at their least memory, %d convs recomputed\n", n_graphs, rec_convs);

    /* 2. fixed patch plan: bitwise identical for streams 1-4 under chaos + poison */
    {
        rgraph rg;
        int out = build_random(&rg, seed * 31 + 5);
        cw_rng r = {seed + 99};
        float *input = rand_vec(&r, rg.c0 * rg.h0 * rg.w0, 1.0f, 0.0f);
        float *base = NULL;
        int64_t on = 0;
        int mismatches = 0;
        for (int s = 1; s <= 4; s++)
            for (int cs = 0; cs < chaos_seeds; cs++) {
                cw_context *ctx = make_ctx(CW_FLAG_POISON | CW_FLAG_CHAOS, 1000 + (uint64_t)cs, 0);
                lgraph L;
                lbuild(&L, ctx, &rg, out);
                cw_compile_options o = CW_COMPILE_OPTIONS_INIT;
                o.policy = CW_PATCHES_FIXED;
                o.patches = 3;
                o.streams = s;
                o.temp_budget = -1;
                float *y = lrun(&L, input, &o, NULL);
                on = cw_tensor_desc_numel(&L.out_d);
                if (!base) {
                    base = y;
                } else {
                    if (memcmp(base, y, (size_t)on * 4) != 0) {
                        if (mismatches++ < 5)
                            fprintf(stderr, "streams %d chaos seed %d (CONVWEAVE_CHAOS_SEED=%d): output differs\n", s,
                                    1000 + cs, 1000 + cs);
                        cw_test_failures++;
                    }
                    free(y);
                }
                lfree(&L);
                cw_context_destroy(ctx);
            }
        printf("bitwise: %d runs (streams 1-4 x %d chaos seeds), %d mismatches\n", 4 * chaos_seeds, chaos_seeds,
               mismatches);
        free(base);
        free(input);
        free_rgraph(&rg);
    }

    /* 3. trace JSON: one track per stream and the temp counter */
    {
        rgraph rg;
        int out = build_random(&rg, seed + 3);
        cw_rng r = {seed + 4};
        float *input = rand_vec(&r, rg.c0 * rg.h0 * rg.w0, 1.0f, 0.0f);
        cw_context *ctx = make_ctx(CW_FLAG_TIMING | CW_FLAG_NVTX, 0, 0);
        lgraph L;
        lbuild(&L, ctx, &rg, out);
        cw_compile_options o = CW_COMPILE_OPTIONS_INIT;
        o.policy = CW_PATCHES_FIXED;
        o.patches = 2;
        o.streams = 3;
        o.temp_budget = -1;
        cw_plan *plan;
        ASSERT_OK_CTX(ctx, cw_graph_compile(L.g, &plan, &o));
        cw_tensor *x, *y;
        ASSERT_OK_CTX(ctx, cw_tensor_create(&x, ctx, &L.in_d));
        ASSERT_OK_CTX(ctx, cw_tensor_create(&y, ctx, &L.out_d));
        ASSERT_OK_CTX(ctx, cw_tensor_upload(x, input, (size_t)cw_tensor_desc_numel(&L.in_d) * 4));
        ASSERT_STATUS(cw_plan_write_trace(plan, "/nonexistent-dir/t.json"), CW_ERR_INVALID_ARG); /* not run yet */
        ASSERT_OK_CTX(ctx, cw_plan_run(plan, &x, 1, &y, 1));
        char path[256];
        snprintf(path, sizeof path, "%s/sched_trace.json", CW_BINARY_DIR);
        ASSERT_OK_CTX(ctx, cw_plan_write_trace(plan, path));
        ASSERT_STATUS(cw_plan_write_trace(plan, "/nonexistent-dir/t.json"), CW_ERR_IO);
        FILE *f = fopen(path, "rb");
        ASSERT_TRUE(f != NULL);
        fseek(f, 0, SEEK_END);
        long len = ftell(f);
        fseek(f, 0, SEEK_SET);
        char *txt = calloc((size_t)len + 1, 1);
        ASSERT_TRUE(fread(txt, 1, (size_t)len, f) == (size_t)len);
        fclose(f);
        cJSON *root = cJSON_Parse(txt);
        ASSERT_TRUE(root != NULL);
        cJSON *evs = cJSON_GetObjectItem(root, "traceEvents");
        ASSERT_TRUE(cJSON_IsArray(evs));
        int tracks = 0, counters = 0, tasks = 0, seen_tid[8] = {0};
        cJSON *e;
        cJSON_ArrayForEach(e, evs) {
            const char *ph = cJSON_GetStringValue(cJSON_GetObjectItem(e, "ph"));
            const char *name = cJSON_GetStringValue(cJSON_GetObjectItem(e, "name"));
            ASSERT_TRUE(ph && name);
            if (!strcmp(ph, "M") && !strcmp(name, "thread_name")) tracks++;
            if (!strcmp(ph, "C")) counters++;
            if (!strcmp(ph, "X")) {
                tasks++;
                int tid = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(e, "tid"));
                ASSERT_TRUE(tid >= 0 && tid < 3);
                seen_tid[tid] = 1;
            }
        }
        cw_plan_stats st;
        ASSERT_OK(cw_plan_get_stats(plan, &st));
        ASSERT_EQ_I(tracks, 3);
        ASSERT_EQ_I(tasks, st.n_tasks);
        ASSERT_TRUE(counters >= 2);
        ASSERT_TRUE(seen_tid[0] && seen_tid[2]);
        char *desc = NULL;
        ASSERT_OK(cw_plan_describe(plan, &desc, 1));
        cJSON *dj = cJSON_Parse(desc);
        ASSERT_TRUE(dj && cJSON_IsArray(cJSON_GetObjectItem(dj, "convs")));
        cJSON_Delete(dj);
        cw_free(desc);
        ASSERT_OK(cw_plan_describe(plan, &desc, 0));
        ASSERT_TRUE(strstr(desc, "patch 1/2") != NULL);
        cw_free(desc);
        cJSON_Delete(root);
        free(txt);
        cw_tensor_destroy(x);
        cw_tensor_destroy(y);
        cw_plan_destroy(plan);
        lfree(&L);
        cw_context_destroy(ctx);
        free(input);
        free_rgraph(&rg);
        printf("trace: %d tracks, %d tasks, %d counter samples\n", tracks, tasks, counters);
    }
    TEST_DONE();
}
