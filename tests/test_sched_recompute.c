/* Memory-budgeted plans (cw_compile_options.memory_budget). The graph: conv_in 4->16, a
 * ResNet block 16->32 with a 1x1 shortcut, a ResNet block 32->32, conv_out 32->4. Each block
 * is GN -> SiLU -> conv -> GN -> SiLU -> conv plus the residual. Stored, the 16->32 block
 * holds its input, its inner activation and the shortcut's output at once: the peak. Under
 * a memory budget below that, the planner must recompute that block's inner activation (a
 * statistics pass, then each band again with its halo), and the 32->32 block's too (its
 * input and inner activation would be the next peak): that block's result is written into
 * its input's storage while later bands still read the input's halo rows.
 * Checks:
 * - the recompute is chosen and reported (blocks, extra GFLOP), and activations +
 *   temporaries fit the budget;
 * - the output agrees with the stored plan within 1e-5 of its scale (the statistics are
 *   exact; only summation order differs) and with a double-precision interpreter;
 * - every run of one recompute plan gives the same bits under chaos + poison;
 * - the happens-before replay finds no unordered use of shared memory;
 * - a budget below what recomputing reaches is CW_ERR_BUDGET, naming what it reaches;
 * - the memory ladder (cw_graph_memory_ladder) is exact: each point's total compiles to that
 *   point's plan, one byte below the next point's too, one byte below the first fails with
 *   CW_ERR_BUDGET, and each plan's run stays within its total; bad arguments are named.
 * Then chains of ResNet blocks built from a spec (chain_*):
 * - same-shape blocks (two with GN -> SiLU before conv A, one whose conv A reads the input
 *   directly, so a heavy stream reads the rows the epilogue overwrites): at the ladder's
 *   least total every block recomputes and writes its result into its input's storage, and
 *   one activation is live instead of two; with fixed patch counts 2, 5 and 32 (one-row
 *   bands, thinner than the halo) on 1-3 streams under chaos + poison, each run agrees with
 *   the stored plan of the same patching within 1e-5 of the output's scale and with the
 *   double interpreter, repeats its bits, gives the 1-stream plan's bits, and passes the
 *   happens-before replay (which also checks the write-after-read order of one buffer);
 * - a 32->16 block then two 16->16 blocks, as the SD decoder's last up block: its 1x1
 *   shortcut is computed in conv2's epilogue and the block's result written over its input;
 * - both chains again with every 3x3 conv reading a replicate pad (HunyuanVideo's), fused
 *   into its prep: the same live activations, recomputed through the pads;
 * - two 64-channel blocks at tight temp budgets: conv2, recomputing conv1, takes a GEMM over
 *   cpu_direct where the whole share less conv1's band fits it, within the budget, exact.
 * - memory_budget CW_MEMORY_AUTO compiles the ladder point the rule names (checked against
 *   the ladder with the rule written out here), for several percentages; the rule's FLOPs
 *   branch (a backend without a time model) on made-up points. */
#include "convweave/convweave.h"
#include "hb_check.h"
#include "scheduler/sched.h"
#include "testutil.h"

static cw_rng rng;

enum { G = 4, HW = 32, C0 = 4, C1 = 16, C2 = 32 };

typedef struct cv {
    int64_t cin, cout;
    int k;
    float *w, *b;
} cv;
typedef struct nrm {
    int64_t c;
    float *g, *b;
} nrm;
typedef struct blk {
    nrm n1, n2;
    cv c1, c2, sc; /* sc.w NULL: identity shortcut */
} blk;

static cv conv_in, conv_out;
static blk blocks[2];

static float *rvec(int64_t n, float scale, float off) {
    float *v = malloc((size_t)n * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = off + scale * cw_rng_float(&rng);
    return v;
}

static cv mkconv(int64_t cin, int64_t cout, int k) {
    cv c = {cin, cout, k, rvec(cout * cin * k * k, 1.0f / sqrtf((float)(cin * k * k)), 0.0f), rvec(cout, 0.2f, 0.0f)};
    return c;
}

static nrm mknorm(int64_t c) {
    nrm n = {c, rvec(c, 0.3f, 1.0f), rvec(c, 0.3f, 0.0f)};
    return n;
}

static void make_weights(void) {
    conv_in = mkconv(C0, C1, 3);
    int64_t ch[3] = {C1, C2, C2};
    for (int b = 0; b < 2; b++) {
        blk *k = &blocks[b];
        k->n1 = mknorm(ch[b]), k->c1 = mkconv(ch[b], ch[b + 1], 3);
        k->n2 = mknorm(ch[b + 1]), k->c2 = mkconv(ch[b + 1], ch[b + 1], 3);
        if (ch[b] != ch[b + 1]) k->sc = mkconv(ch[b], ch[b + 1], 1);
    }
    conv_out = mkconv(C2, C0, 3);
}

static void free_conv(cv *c) { free(c->w), free(c->b); }

/* ---- the graph ---- */
typedef struct gctx {
    cw_context *ctx;
    cw_graph *g;
    cw_tensor *t[64];
    int nt;
} gctx;

static cw_node konst(gctx *c, const float *v, int rank, const int64_t *dims) {
    cw_tensor_desc d;
    ASSERT_OK(cw_tensor_desc_make(&d, CW_F32, rank, dims));
    cw_tensor *t;
    ASSERT_OK_CTX(c->ctx, cw_tensor_create(&t, c->ctx, &d));
    ASSERT_OK(cw_tensor_upload(t, v, (size_t)cw_tensor_desc_numel(&d) * 4));
    c->t[c->nt++] = t;
    cw_node n;
    ASSERT_OK_CTX(c->ctx, cw_graph_constant(c->g, &n, "w", t));
    return n;
}

/* 1: convs wider than 1x1 read their input through a replicate pad (F.pad(mode='replicate'),
 * as HunyuanVideo's) and pad nothing themselves; the pad fuses into their prep, also where
 * they are recomputed or recompute (the chains run again with it). */
static int g_replicate;
/* 1: a block adds conv2 + shortcut (HunyuanVideo, CogVideoX, Wan) instead of shortcut + conv2
 * (diffusers' AutoencoderKL): the add's epilogue moves to conv2 where the shortcut goes into
 * it (fusion.c, cw__rec_epilogue), so the plans are the same. */
static int g_conv2_first;

static cw_node gconv(gctx *c, cw_node x, const cv *k) {
    int64_t wd[4] = {k->cout, k->cin, k->k, k->k};
    cw_conv_params p = CW_CONV_PARAMS_INIT;
    p.pad_pre[0] = p.pad_pre[1] = p.pad_post[0] = p.pad_post[1] = k->k / 2;
    if (g_replicate && k->k > 1) {
        const int64_t pp[3] = {0, k->k / 2, k->k / 2};
        ASSERT_OK_CTX(c->ctx, cw_graph_pad(c->g, &x, x, pp, pp, CW_PAD_REPLICATE, 0.0f));
        p.pad_pre[0] = p.pad_pre[1] = p.pad_post[0] = p.pad_post[1] = 0;
    }
    cw_node y;
    ASSERT_OK_CTX(c->ctx, cw_graph_conv(c->g, &y, x, konst(c, k->w, 4, wd), konst(c, k->b, 1, &k->cout), &p));
    return y;
}

static cw_node gn_silu(gctx *c, cw_node x, const nrm *n) {
    cw_node h;
    ASSERT_OK_CTX(c->ctx, cw_graph_group_norm(c->g, &h, x, konst(c, n->g, 1, &n->c), konst(c, n->b, 1, &n->c), G, 1e-6f));
    ASSERT_OK_CTX(c->ctx, cw_graph_silu(c->g, &h, h));
    return h;
}

static void build(gctx *c, uint64_t chaos, unsigned flags) {
    memset(c, 0, sizeof *c);
    cw_context_config cfg = CW_CONTEXT_CONFIG_INIT;
    cfg.backend = CW_BACKEND_CPU;
    cfg.threads = 2;
    cfg.flags = flags;
    cfg.chaos_seed = chaos;
    ASSERT_OK(cw_context_create(&c->ctx, &cfg));
    ASSERT_OK(cw_graph_create(&c->g, c->ctx));
    int64_t xd[4] = {1, C0, HW, HW};
    cw_tensor_desc d;
    ASSERT_OK(cw_tensor_desc_make(&d, CW_F32, 4, xd));
    cw_node x;
    ASSERT_OK_CTX(c->ctx, cw_graph_input(c->g, &x, "x", &d));
    x = gconv(c, x, &conv_in);
    for (int b = 0; b < 2; b++) {
        blk *k = &blocks[b];
        cw_node h = gconv(c, gn_silu(c, x, &k->n1), &k->c1);
        h = gconv(c, gn_silu(c, h, &k->n2), &k->c2);
        cw_node s = k->sc.w ? gconv(c, x, &k->sc) : x;
        ASSERT_OK_CTX(c->ctx, g_conv2_first ? cw_graph_add(c->g, &x, h, s) : cw_graph_add(c->g, &x, s, h));
    }
    x = gconv(c, x, &conv_out);
    ASSERT_OK_CTX(c->ctx, cw_graph_output(c->g, x, "y"));
}

static void unbuild(gctx *c) {
    cw_graph_destroy(c->g);
    for (int i = 0; i < c->nt; i++) cw_tensor_destroy(c->t[i]);
    cw_context_destroy(c->ctx);
}

static float *run(gctx *c, cw_plan *p, const float *in, int64_t *n_out) {
    int64_t xd[4] = {1, C0, HW, HW};
    cw_tensor_desc d;
    ASSERT_OK(cw_tensor_desc_make(&d, CW_F32, 4, xd));
    cw_tensor *tx, *ty;
    ASSERT_OK(cw_tensor_create(&tx, c->ctx, &d));
    ASSERT_OK(cw_tensor_create(&ty, c->ctx, &d));
    ASSERT_OK(cw_tensor_upload(tx, in, (size_t)cw_tensor_desc_numel(&d) * 4));
    ASSERT_OK_CTX(c->ctx, cw_plan_run(p, &tx, 1, &ty, 1));
    *n_out = cw_tensor_desc_numel(&d);
    float *out = malloc((size_t)*n_out * 4);
    ASSERT_OK(cw_tensor_download(ty, out, (size_t)*n_out * 4));
    cw_tensor_destroy(tx), cw_tensor_destroy(ty);
    return out;
}

/* ---- the double-precision interpreter ---- */
static void ref_gn_silu(const double *x, const nrm *n, double *y) {
    const int64_t hw = HW * HW, cg = n->c / G;
    for (int g = 0; g < G; g++) {
        double s = 0, s2 = 0, cnt = (double)(cg * hw);
        for (int64_t i = g * cg * hw; i < (g + 1) * cg * hw; i++) s += x[i];
        double m = s / cnt;
        for (int64_t i = g * cg * hw; i < (g + 1) * cg * hw; i++) s2 += (x[i] - m) * (x[i] - m);
        double rstd = 1.0 / sqrt(s2 / cnt + 1e-6);
        for (int64_t c = g * cg; c < (g + 1) * cg; c++)
            for (int64_t i = 0; i < hw; i++) {
                double v = (x[c * hw + i] - m) * rstd * n->g[c] + n->b[c];
                y[c * hw + i] = v / (1.0 + exp(-v));
            }
    }
}

static void ref_conv(const double *x, const cv *k, double *y) {
    const int p = k->k / 2;
    for (int64_t o = 0; o < k->cout; o++)
        for (int64_t r = 0; r < HW; r++)
            for (int64_t q = 0; q < HW; q++) {
                double s = k->b[o];
                for (int64_t c = 0; c < k->cin; c++)
                    for (int i = 0; i < k->k; i++)
                        for (int j = 0; j < k->k; j++) {
                            int64_t rr = r + i - p, qq = q + j - p;
                            if (g_replicate) { /* the edge row or column, repeated */
                                rr = rr < 0 ? 0 : rr >= HW ? HW - 1 : rr;
                                qq = qq < 0 ? 0 : qq >= HW ? HW - 1 : qq;
                            }
                            if (rr < 0 || rr >= HW || qq < 0 || qq >= HW) continue;
                            s += (double)k->w[((o * k->cin + c) * k->k + i) * k->k + j] * x[(c * HW + rr) * HW + qq];
                        }
                y[(o * HW + r) * HW + q] = s;
            }
}

static double *reference(const float *in) {
    const size_t big = sizeof(double) * C2 * HW * HW;
    double *x0 = malloc(big), *x = malloc(big), *t = malloc(big), *h = malloc(big), *s = malloc(big);
    for (int64_t i = 0; i < C0 * HW * HW; i++) x0[i] = in[i];
    ref_conv(x0, &conv_in, x);
    for (int b = 0; b < 2; b++) {
        blk *k = &blocks[b];
        ref_gn_silu(x, &k->n1, t);
        ref_conv(t, &k->c1, h);
        ref_gn_silu(h, &k->n2, t);
        ref_conv(t, &k->c2, h);
        if (k->sc.w) ref_conv(x, &k->sc, s);
        else memcpy(s, x, sizeof(double) * (size_t)(k->c1.cin * HW * HW));
        for (int64_t i = 0; i < k->c2.cout * HW * HW; i++) x[i] = s[i] + h[i];
    }
    ref_conv(x, &conv_out, x0);
    free(x), free(t), free(h), free(s);
    return x0;
}

static int64_t plan_memory(const cw_plan_stats *s) { return s->activations_peak + s->temp_predicted; }

#define CHECK_EQ_I(a, b)                                                                                         \
    do {                                                                                                         \
        long long cw_a_ = (long long)(a), cw_b_ = (long long)(b);                                                \
        if (cw_a_ != cw_b_) {                                                                                    \
            fprintf(stderr, "%s:%d: CHECK_EQ failed: %s = %lld, %s = %lld\n", __FILE__, __LINE__, #a, cw_a_, #b, \
                    cw_b_);                                                                                      \
            cw_test_failures++;                                                                                  \
        }                                                                                                        \
    } while (0)

/* ---- chains of ResNet blocks from a spec ---- */
typedef struct cblk {
    int prenorm; /* 1: GN -> SiLU before conv A; 0: conv A reads the block's input itself */
    nrm n1, n2;
    cv c1, c2, sc; /* sc.w NULL: identity shortcut */
} cblk;

typedef struct chain {
    cv in, out;
    int nb;
    cblk b[4];
} chain;

/* conv_in C0 -> ch[0], blocks ch[k] -> ch[k + 1], conv_out ch[nb] -> C0. */
static chain chain_make(const int64_t *ch, const int *prenorm, int nb) {
    chain c;
    memset(&c, 0, sizeof c);
    c.nb = nb;
    c.in = mkconv(C0, ch[0], 3);
    for (int k = 0; k < nb; k++) {
        cblk *b = &c.b[k];
        b->prenorm = prenorm[k];
        if (b->prenorm) b->n1 = mknorm(ch[k]);
        b->c1 = mkconv(ch[k], ch[k + 1], 3);
        b->n2 = mknorm(ch[k + 1]);
        b->c2 = mkconv(ch[k + 1], ch[k + 1], 3);
        if (ch[k] != ch[k + 1]) b->sc = mkconv(ch[k], ch[k + 1], 1);
    }
    c.out = mkconv(ch[nb], C0, 3);
    return c;
}

static void chain_free(chain *c) {
    free_conv(&c->in), free_conv(&c->out);
    for (int k = 0; k < c->nb; k++) {
        cblk *b = &c->b[k];
        if (b->prenorm) free(b->n1.g), free(b->n1.b);
        free(b->n2.g), free(b->n2.b);
        free_conv(&b->c1), free_conv(&b->c2);
        if (b->sc.w) free_conv(&b->sc);
    }
}

static void chain_build(gctx *c, const chain *ch, uint64_t chaos, unsigned flags) {
    memset(c, 0, sizeof *c);
    cw_context_config cfg = CW_CONTEXT_CONFIG_INIT;
    cfg.backend = CW_BACKEND_CPU;
    cfg.threads = 2;
    cfg.flags = flags;
    cfg.chaos_seed = chaos;
    ASSERT_OK(cw_context_create(&c->ctx, &cfg));
    ASSERT_OK(cw_graph_create(&c->g, c->ctx));
    int64_t xd[4] = {1, C0, HW, HW};
    cw_tensor_desc d;
    ASSERT_OK(cw_tensor_desc_make(&d, CW_F32, 4, xd));
    cw_node x;
    ASSERT_OK_CTX(c->ctx, cw_graph_input(c->g, &x, "x", &d));
    x = gconv(c, x, &ch->in);
    for (int k = 0; k < ch->nb; k++) {
        const cblk *b = &ch->b[k];
        cw_node h = gconv(c, b->prenorm ? gn_silu(c, x, &b->n1) : x, &b->c1);
        h = gconv(c, gn_silu(c, h, &b->n2), &b->c2);
        cw_node s = b->sc.w ? gconv(c, x, &b->sc) : x;
        ASSERT_OK_CTX(c->ctx, g_conv2_first ? cw_graph_add(c->g, &x, h, s) : cw_graph_add(c->g, &x, s, h));
    }
    x = gconv(c, x, &ch->out);
    ASSERT_OK_CTX(c->ctx, cw_graph_output(c->g, x, "y"));
}

static double *chain_reference(const chain *ch, const float *in) {
    const size_t big = sizeof(double) * 64 * HW * HW; /* up to 64 channels */
    double *x0 = malloc(big), *x = malloc(big), *t = malloc(big), *h = malloc(big), *s = malloc(big);
    for (int64_t i = 0; i < C0 * HW * HW; i++) x0[i] = in[i];
    ref_conv(x0, &ch->in, x);
    for (int k = 0; k < ch->nb; k++) {
        const cblk *b = &ch->b[k];
        if (b->prenorm) ref_gn_silu(x, &b->n1, t);
        ref_conv(b->prenorm ? t : x, &b->c1, h);
        ref_gn_silu(h, &b->n2, t);
        ref_conv(t, &b->c2, h);
        if (b->sc.w) ref_conv(x, &b->sc, s);
        else memcpy(s, x, sizeof(double) * (size_t)(b->c1.cin * HW * HW));
        for (int64_t i = 0; i < b->c2.cout * HW * HW; i++) x[i] = s[i] + h[i];
    }
    ref_conv(x, &ch->out, x0);
    free(x), free(t), free(h), free(s);
    return x0;
}

/* The ladder's least point for options o (whose memory_budget it ignores). */
static cw_memory_point least_point(gctx *c, const cw_compile_options *o) {
    cw_memory_point pt;
    int n = 0;
    ASSERT_OK_CTX(c->ctx, cw_graph_memory_ladder(c->g, &pt, &n, 1, o));
    ASSERT_TRUE(n >= 1);
    return pt;
}

/* What a chain's stored plan and its ladder's least plan must show (-1: not checked). */
typedef struct expect {
    int64_t stored_live;           /* stored plan: live activations peak */
    int least_rec;                 /* least plan: convs recomputed */
    int64_t least_live, least_act; /* least plan: live activations peak, activation arena */
    double rec_grow;               /* > 0: the least plan's recompute GFLOP at HW patches over
                                      that at the fewest patches run, at most */
} expect;

/* For patches 2, 5, HW and 1-3 streams, with chaos + poison: the stored plan and the ladder's
 * least plan show w; two runs of each least plan agree with the stored plan and the double
 * interpreter within 1e-5, and with the 1-stream least plan bit for bit. */
static void check_least_runs(const chain *cn, const float *in, const double *ref, const expect *w, const char *what) {
    static const int patches[3] = {2, 5, HW};
    static const int stream_counts[2][4] = {{1, 2, 3, 0}, {1, 3, 0, 0}}; /* full, quick; 0 ends */
    int runs = 0, bitwise = 0, rec = -1;
    const int quick = cw_test_quick(); /* sanitizer builds: patches 5 and HW, 1 and 3 streams */
    double worst_stored = 0, worst_ref = 0, rec_gflop[3] = {0, 0, 0};
    for (int pi = quick; pi < 3; pi++) {
        float *first = NULL; /* the 1-stream least plan's output for these patches */
        for (int si = 0; stream_counts[quick][si] > 0; si++) {
            const int streams = stream_counts[quick][si];
            gctx c;
            chain_build(&c, cn, 7000 + (uint64_t)(10 * pi + streams), CW_FLAG_CHAOS | CW_FLAG_POISON);
            cw_compile_options o = CW_COMPILE_OPTIONS_INIT;
            o.policy = CW_PATCHES_FIXED;
            o.patches = patches[pi];
            o.streams = streams;
            o.temp_budget = 16 << 20;
            cw_plan *ps = NULL, *pr = NULL;
            ASSERT_OK_CTX(c.ctx, cw_graph_compile(c.g, &ps, &o));
            cw_memory_point pt = least_point(&c, &o);
            o.memory_budget = pt.total_bytes;
            ASSERT_OK_CTX(c.ctx, cw_graph_compile(c.g, &pr, &o));
            cw_plan_stats ss, sr;
            ASSERT_OK(cw_plan_get_stats(ps, &ss));
            ASSERT_OK(cw_plan_get_stats(pr, &sr));
            CHECK_EQ_I(ss.n_recomputed, 0);
            CHECK_EQ_I(ss.activations_live_peak, w->stored_live);
            CHECK_EQ_I(sr.n_recomputed, w->least_rec);
            CHECK_EQ_I(sr.activations_live_peak, w->least_live);
            if (w->least_act >= 0) CHECK_EQ_I(sr.activations_peak, w->least_act);
            rec = sr.n_recomputed;
            rec_gflop[pi] = sr.recompute_gflop;
            char *txt = NULL; /* describe() names each recomputed conv on one line */
            ASSERT_OK(cw_plan_describe(pr, &txt, 0));
            const char *line = strstr(txt, "  recomputed (");
            int named = 0;
            for (const char *q = line; q && *q && *q != '\n'; q++) named += q[0] == ' ' && q[1] == 'L';
            CHECK_EQ_I(named, sr.n_recomputed);
            cw_free(txt);
            int64_t n;
            float *ys = run(&c, ps, in, &n);
            CHECK(hb_check(ps) == 0);
            for (int r = 0; r < 2; r++) {
                float *yr = run(&c, pr, in, &n);
                CHECK(hb_check(pr) == 0);
                double ds = cw_err_rel(yr, ys, n), dr = cw_err_rel_d(yr, ref, n);
                worst_stored = cw_err_max(worst_stored, ds);
                worst_ref = cw_err_max(worst_ref, dr);
                if (!(ds <= 1e-5) || !(dr <= 1e-5))
                    fprintf(stderr, "%s, patches %d, %d streams, run %d: vs stored %.3g, vs double %.3g\n", what,
                            patches[pi], streams, r, ds, dr);
                CHECK(ds <= 1e-5 && dr <= 1e-5);
                bitwise += memcmp(yr, ys, (size_t)n * 4) == 0;
                runs++;
                if (!first) {
                    first = yr;
                    continue;
                }
                if (memcmp(yr, first, (size_t)n * 4) != 0) {
                    fprintf(stderr, "%s, patches %d, %d streams, run %d: bits differ from the 1-stream plan's\n",
                            what, patches[pi], streams, r);
                    cw_test_failures++;
                }
                free(yr);
            }
            free(ys);
            cw_plan_destroy(ps), cw_plan_destroy(pr);
            unbuild(&c);
        }
        free(first);
    }
    /* the ring: each recomputed row once per pass, however thin the bands */
    if (w->rec_grow > 0 && !(rec_gflop[2] <= w->rec_grow * rec_gflop[quick])) {
        fprintf(stderr, "%s: recompute %.4f GFLOP at %d patches, %.4f at %d\n", what, rec_gflop[2], HW,
                rec_gflop[quick], patches[quick]);
        cw_test_failures++;
    }
    printf("%s%s: %d convs recomputed, live activations %" PRId64 " KiB instead of %" PRId64
           " KiB; %d runs (patches %s5, %d; %s streams; chaos + poison): vs stored <= %.3g (%d bitwise), vs "
           "double <= %.3g\n",
           what, g_replicate ? " (replicate pads)" : g_conv2_first ? " (conv2 + shortcut)" : "", rec,
           w->least_live / 1024, w->stored_live / 1024, runs, quick ? "" : "2, ", HW, quick ? "1 and 3" : "1-3",
           worst_stored, bitwise, worst_ref);
}

/* Same-shape blocks, each result written over its input while later bands' recomputes still
 * read the input's halo rows. */
static void check_same_shape_chain(void) {
    const int64_t ch[4] = {16, 16, 16, 16}, act = 16 * HW * HW * 4; /* one activation, bytes */
    const int pre[3] = {1, 1, 0};
    chain cn = chain_make(ch, pre, 3);
    float *in = rvec(C0 * HW * HW, 1.0f, 0.0f);
    double *ref = chain_reference(&cn, in);
    /* stored: a block's input and inner activation; least: the input, overwritten by the
     * result (conv_in's result is the first block's residual: stored) */
    const expect w = {2 * act, 3, act, act, 1.25}; /* 2.96 before the ring */
    check_least_runs(&cn, in, ref, &w, "same-shape chain");
    free(in), free(ref);
    chain_free(&cn);
}

/* 32->16 with a 1x1 shortcut, then two 16->16 blocks. conv_in's result x (32 channels) is
 * read by the first block's conv1 (through GN, SiLU) and by its shortcut, so the ladder's
 * first climb (convs with one reader) leaves it stored. Its best point recomputes the first
 * block's conv1 and computes the shortcut band by band in conv2's epilogue, the block's
 * result written over x (fusion.c, cw__rec_shortcut): x alone is live through the block (2 x
 * 16 channels), where storing the shortcut held x + shortcut + one more 16-channel tensor
 * (3 x 16). The result needs only x's first half: the rest (the arena tail) is freed after
 * the block, and the next blocks' inner activations take it, stored. The second climb
 * recomputes conv_in too, in conv1's first pass and nested in conv2's recompute of conv1,
 * and every block's inner activation; the shortcut stays in conv2's epilogue, each band of it
 * computed from the band of conv_in that recompute computes (not stored, and conv_in not
 * computed once more for it: 5 convs recomputed). The least total holds one 16-channel
 * activation, the blocks' results written in place. */
static void check_cross_block(void) {
    const int64_t ch[4] = {32, 16, 16, 16}, act = 16 * HW * HW * 4;
    const int pre[3] = {1, 1, 1};
    chain cn = chain_make(ch, pre, 3);
    float *in = rvec(C0 * HW * HW, 1.0f, 0.0f);
    double *ref = chain_reference(&cn, in);
    gctx c;
    chain_build(&c, &cn, 0, 0);
    cw_compile_options o = CW_COMPILE_OPTIONS_INIT;
    o.temp_budget = 128 << 10;
    cw_memory_point pts[8];
    int n = 0;
    ASSERT_OK_CTX(c.ctx, cw_graph_memory_ladder(c.g, pts, &n, 8, &o));
    /* which steps between are kept (each must hold less in all than every step before it)
     * follows the algorithms' workspaces, so the host's oneDNN kernels: asserted are the
     * ends, and a point holding x alone */
    int x_alone = 0;
    for (int i = 1; i + 1 < n; i++) x_alone |= pts[i].activations_bytes == 2 * act && pts[i].n_recomputed >= 2;
    CHECK(g_replicate || (n >= 3 && pts[0].n_recomputed >= 4 && pts[0].activations_bytes == act && x_alone &&
                          pts[n - 1].n_recomputed == 0 && pts[n - 1].activations_bytes == 4 * act));
    unbuild(&c);
    /* that point on 1-3 streams with chaos and poison: the tail's bytes are NaN from its free
     * on, and the next block's activations written there (a temp budget where 3 streams'
     * recomputes fit) */
    o.temp_budget = 192 << 10;
    for (int streams = 1; streams <= 3; streams++) {
        chain_build(&c, &cn, 300 + (uint64_t)streams, CW_FLAG_CHAOS | CW_FLAG_POISON);
        o.streams = streams;
        ASSERT_OK_CTX(c.ctx, cw_graph_memory_ladder(c.g, pts, &n, 8, &o));
        int k = n - 1; /* the point holding x alone: conv1 and the shortcut of the first block
                          recomputed (with replicate pads on 3 streams, the later blocks' conv1s too) */
        while (k >= 0 && pts[k].activations_bytes != 2 * act) k--;
        ASSERT_TRUE(k >= 0);
        o.memory_budget = pts[k].total_bytes;
        cw_plan *p = NULL;
        ASSERT_OK_CTX(c.ctx, cw_graph_compile(c.g, &p, &o));
        cw_plan_stats s;
        ASSERT_OK(cw_plan_get_stats(p, &s));
        CHECK(s.n_recomputed == pts[k].n_recomputed && s.n_recomputed >= 2);
        CHECK_EQ_I(s.activations_live_peak, 2 * act);
        for (int r = 0; r < 2; r++) {
            int64_t ny;
            float *y = run(&c, p, in, &ny);
            CHECK(hb_check(p) == 0);
            CHECK(cw_err_rel_d(y, ref, ny) <= 1e-5);
            free(y);
        }
        cw_plan_destroy(p);
        unbuild(&c);
    }
    /* stored: the first block's input (32 channels: 2 act), inner activation and shortcut.
     * Least: 5 convs recomputed, the shortcut's bands from conv_in's (the climb takes it at
     * equal memory for its fewer recompute FLOPs: with the ring in conv2's recompute of
     * conv1 too, cw__ring_rows; without, it stored the shortcut, 4) */
    const expect w = {4 * act, 5, act, -1, -1};
    check_least_runs(&cn, in, ref, &w, "32->16, 16->16, 16->16 across blocks");
    free(in), free(ref);
    chain_free(&cn);
}

/* Every point of the ladder: compiling at its total gives its plan (and one byte below the
 * next point's total too), the run stays within the total and agrees with the double
 * interpreter; one byte below the first point fails with CW_ERR_BUDGET. */
static void check_ladder(const double *ref, const float *in) {
    gctx c;
    build(&c, 0, 0);
    cw_compile_options o = CW_COMPILE_OPTIONS_INIT;
    o.temp_budget = 96 << 10;
    o.memory_budget = 12345; /* ignored by the ladder */
    int n = -1;
    ASSERT_OK_CTX(c.ctx, cw_graph_memory_ladder(c.g, NULL, &n, 0, &o));
    ASSERT_TRUE(n >= 2 && n <= 16);
    cw_memory_point pts[17];
    memset(pts, 0xab, sizeof pts);
    int n1 = -1;
    ASSERT_OK_CTX(c.ctx, cw_graph_memory_ladder(c.g, pts, &n1, 1, &o)); /* writes one point only */
    CHECK(n1 == n && pts[1].total_bytes == (int64_t)0xabababababababab);
    ASSERT_OK_CTX(c.ctx, cw_graph_memory_ladder(c.g, pts, &n1, 16, &o));
    CHECK(n1 == n);
    /* the plan compiled without a memory budget is the last point */
    o.memory_budget = 0;
    cw_plan *p = NULL;
    ASSERT_OK_CTX(c.ctx, cw_graph_compile(c.g, &p, &o));
    cw_plan_stats s;
    ASSERT_OK(cw_plan_get_stats(p, &s));
    CHECK(plan_memory(&s) == pts[n - 1].total_bytes && pts[n - 1].n_recomputed == 0 && s.n_recomputed == 0);
    cw_plan_destroy(p);
    CHECK(pts[0].n_recomputed >= 1 && pts[0].recompute_gflop > 0);
    for (int i = 0; i < n; i++) {
        const cw_memory_point *q = &pts[i];
        printf("ladder %d: total %" PRId64 " bytes = activations %" PRId64 " + temp %" PRId64 ", %d recomputed (+%.4f "
               "GFLOP)\n",
               i, q->total_bytes, q->activations_bytes, q->temp_bytes, q->n_recomputed, q->recompute_gflop);
        CHECK(q->total_bytes == q->activations_bytes + q->temp_bytes);
        if (i > 0) CHECK(q->total_bytes > pts[i - 1].total_bytes && q->recompute_gflop < pts[i - 1].recompute_gflop);
        int64_t at[2] = {q->total_bytes, i + 1 < n ? pts[i + 1].total_bytes - 1 : q->total_bytes + (1 << 20)};
        for (int k = 0; k < 2; k++) {
            o.memory_budget = at[k];
            ASSERT_OK_CTX(c.ctx, cw_graph_compile(c.g, &p, &o));
            ASSERT_OK(cw_plan_get_stats(p, &s));
            CHECK(s.activations_peak == q->activations_bytes && s.temp_predicted == q->temp_bytes);
            CHECK(s.n_recomputed == q->n_recomputed && s.recompute_gflop == q->recompute_gflop);
            int64_t ny;
            float *y = run(&c, p, in, &ny);
            ASSERT_OK(cw_plan_get_stats(p, &s));
            ASSERT_LE_I(s.temp_peak + s.activations_peak, q->total_bytes);
            ASSERT_LE_I(s.total_peak - s.weights_bytes, q->total_bytes);
            CHECK(cw_err_rel_d(y, ref, ny) <= 1e-5);
            free(y);
            cw_plan_destroy(p);
        }
    }
    /* CW_MEMORY_AUTO: the least total whose estimated conv time is within pct % of the last
     * point's (the cpu backend has a time model); pct 1e6 takes the least, 0 the last unless
     * a point is no dearer */
    CHECK(pts[n - 1].conv_cost_ms > 0);
    double pcts[2 + 2 * 16] = {0.0, 1e6};
    int np = 2;
    for (int i = 0; i + 1 < n; i++) { /* just above and just below each point's extra time */
        double x = 100.0 * (pts[i].conv_cost_ms / pts[n - 1].conv_cost_ms - 1.0);
        if (x > 0) pcts[np++] = x * (1 + 1e-9) + 1e-9, pcts[np++] = x * (1 - 1e-6);
    }
    int seen_mid = 0;
    for (int j = 0; j < np; j++) {
        int want = n - 1;
        for (int i = n - 2; i >= 0; i--)
            if (pts[i].conv_cost_ms <= pts[n - 1].conv_cost_ms * (1.0 + pcts[j] / 100.0)) want = i;
        o.memory_budget = CW_MEMORY_AUTO;
        o.memory_auto_pct = pcts[j];
        ASSERT_OK_CTX(c.ctx, cw_graph_compile(c.g, &p, &o));
        ASSERT_OK(cw_plan_get_stats(p, &s));
        printf("auto:%g: ladder point %d (%d recomputed)\n", pcts[j], want, s.n_recomputed);
        CHECK(s.activations_peak == pts[want].activations_bytes && s.temp_predicted == pts[want].temp_bytes);
        CHECK(s.n_recomputed == pts[want].n_recomputed && s.conv_cost_ms == pts[want].conv_cost_ms);
        int64_t ny;
        float *y = run(&c, p, in, &ny);
        CHECK(cw_err_rel_d(y, ref, ny) <= 1e-5);
        free(y);
        cw_plan_destroy(p);
        if (j == 1) CHECK(want == 0);
        seen_mid |= want > 0 && want < n - 1;
    }
    CHECK(n < 3 || seen_mid); /* a point between the ends was chosen */
    o.memory_auto_pct = -1.0;
    ASSERT_STATUS(cw_graph_compile(c.g, &p, &o), CW_ERR_INVALID_ARG);
    CHECK(strstr(cw_context_get_last_error(c.ctx), "memory_auto_pct") != NULL);
    o.memory_auto_pct = 10.0;
    o.memory_budget = -2;
    ASSERT_STATUS(cw_graph_compile(c.g, &p, &o), CW_ERR_INVALID_ARG);
    CHECK(strstr(cw_context_get_last_error(c.ctx), "memory_budget") != NULL);
    /* the rule on made-up points: more FLOPs but cheap convs (a 1x1 shortcut's) can cost less
     * time; without a time model (conv_cost_ms -1: cuda) the recompute FLOPs decide */
    const cw_memory_point stored = {40, 0, 0, 0, 0.0, 100.0}, cheap = {20, 0, 0, 1, 30.0, 105.0},
                          slow = {10, 0, 0, 2, 5.0, 150.0};
    CHECK(cw__memory_auto_accepts(&stored, 100.0, &cheap, 10.0));
    CHECK(!cw__memory_auto_accepts(&stored, 100.0, &cheap, 4.0));
    CHECK(!cw__memory_auto_accepts(&stored, 100.0, &slow, 25.0));
    CHECK(cw__memory_auto_accepts(&stored, 100.0, &slow, 50.0));
    cw_memory_point untimed = stored, cheap_u = cheap, slow_u = slow;
    untimed.conv_cost_ms = cheap_u.conv_cost_ms = slow_u.conv_cost_ms = -1.0;
    CHECK(!cw__memory_auto_accepts(&untimed, 100.0, &cheap_u, 10.0));
    CHECK(cw__memory_auto_accepts(&untimed, 100.0, &slow_u, 10.0));
    CHECK(cw__memory_auto_accepts(&untimed, 100.0, &cheap_u, 30.0));
    CHECK(!cw__memory_auto_accepts(&untimed, 100.0, &slow_u, 4.0));
    o.memory_budget = pts[0].total_bytes - 1;
    p = NULL;
    ASSERT_STATUS(cw_graph_compile(c.g, &p, &o), CW_ERR_BUDGET);
    CHECK(p == NULL);
    char want[64];
    snprintf(want, sizeof want, "holds %" PRId64 " bytes", pts[0].total_bytes);
    CHECK(strstr(cw_context_get_last_error(c.ctx), want) != NULL);

    /* bad arguments: a clean status and a message naming the argument */
    ASSERT_STATUS(cw_graph_memory_ladder(c.g, pts, NULL, 16, &o), CW_ERR_INVALID_ARG);
    CHECK(strstr(cw_context_get_last_error(c.ctx), "out_n") != NULL);
    ASSERT_STATUS(cw_graph_memory_ladder(c.g, NULL, &n1, 4, &o), CW_ERR_INVALID_ARG);
    CHECK(strstr(cw_context_get_last_error(c.ctx), "max_points") != NULL);
    ASSERT_STATUS(cw_graph_memory_ladder(c.g, pts, &n1, -1, &o), CW_ERR_INVALID_ARG);
    o.temp_budget = 0; /* nor does the context have one: no fixed ladder */
    ASSERT_STATUS(cw_graph_memory_ladder(c.g, pts, &n1, 16, &o), CW_ERR_INVALID_ARG);
    CHECK(strstr(cw_context_get_last_error(c.ctx), "temp_budget") != NULL && n1 == 0);
    o.temp_budget = 1024; /* no plan's temporaries fit */
    ASSERT_STATUS(cw_graph_memory_ladder(c.g, pts, &n1, 16, &o), CW_ERR_BUDGET);
    CHECK(strstr(cw_context_get_last_error(c.ctx), "smallest temp budget") != NULL);
    unbuild(&c);
}

/* Two 64-channel blocks at temp budgets where the least plan recomputes both blocks' conv1:
 * on its part of the share (cw__rec_split) conv2's bands fit only cpu_direct; on the whole
 * share less what conv1's band holds beside it they fit a GEMM over 2x faster (lower_conv.c
 * cw__rec_whole), and the dry run keeps that plan where the allocator can place it, building
 * again without where not (budget.c). At one budget of the range at least, no 64->64 conv
 * is left on cpu_direct (without cw__rec_whole every one of them leaves conv2 there); every
 * plan runs within its budget, agrees with the double interpreter and passes hb_check. */
static void check_whole_share(void) {
    const int64_t ch[3] = {64, 64, 64};
    const int pre[2] = {1, 1};
    chain cn = chain_make(ch, pre, 2);
    float *in = rvec(C0 * HW * HW, 1.0f, 0.0f);
    double *ref = chain_reference(&cn, in);
    int fast = 0, tried = 0;
    for (int64_t T = 210000; T <= 270000; T += 12000) {
        gctx c;
        chain_build(&c, &cn, 0, 0);
        cw_compile_options o = CW_COMPILE_OPTIONS_INIT;
        o.temp_budget = T;
        o.streams = 2;
        cw_memory_point pt = least_point(&c, &o);
        o.memory_budget = pt.total_bytes;
        cw_plan *p = NULL;
        ASSERT_OK_CTX(c.ctx, cw_graph_compile(c.g, &p, &o));
        cw_plan_stats s;
        ASSERT_OK(cw_plan_get_stats(p, &s));
        CHECK_EQ_I(s.n_recomputed, 2);
        char *txt = NULL;
        ASSERT_OK(cw_plan_describe(p, &txt, 0));
        int direct = 0;
        for (const char *l = strstr(txt, "64->64"); l; l = strstr(l + 1, "64->64")) {
            const char *e = strchr(l, '\n'), *d = strstr(l, "cpu_direct");
            direct += d && (!e || d < e);
        }
        cw_free(txt);
        fast += direct == 0, tried++;
        if (direct == 0) printf("  temp budget %" PRId64 ": no 64->64 conv on cpu_direct\n", T);
        int64_t n;
        float *y = run(&c, p, in, &n);
        CHECK(hb_check(p) == 0);
        ASSERT_OK(cw_plan_get_stats(p, &s));
        ASSERT_LE_I(s.temp_peak, T);
        ASSERT_LE_I(s.temp_peak + s.activations_peak, pt.total_bytes);
        const double e = cw_err_rel_d(y, ref, n);
        if (!(e <= 1e-5)) fprintf(stderr, "whole share, temp budget %" PRId64 ": vs double %.3g\n", T, e);
        CHECK(e <= 1e-5);
        free(y);
        cw_plan_destroy(p);
        unbuild(&c);
    }
    printf("64-channel blocks, least plans at %d temp budgets: %d with no 64->64 conv on cpu_direct\n", tried, fast);
    CHECK(fast >= 1);
    free(in), free(ref);
    chain_free(&cn);
}

int main(void) {
    rng.s = cw_test_seed(21);
    make_weights();
    float *in = rvec(C0 * HW * HW, 1.0f, 0.0f);
    double *ref = reference(in);
    int64_t n;

    /* 1. stored: every activation kept */
    gctx c;
    build(&c, 0, 0);
    cw_compile_options o = CW_COMPILE_OPTIONS_INIT;
    o.temp_budget = 96 << 10;
    cw_plan *ps;
    ASSERT_OK_CTX(c.ctx, cw_graph_compile(c.g, &ps, &o));
    cw_plan_stats ss;
    ASSERT_OK(cw_plan_get_stats(ps, &ss));
    CHECK(ss.n_recomputed == 0);
    float *ys = run(&c, ps, in, &n);
    double e_s = cw_err_rel_d(ys, ref, n);
    printf("stored: activations %.0f KiB (live peak %.0f KiB) + temp %.0f KiB; rel err vs double %.3g\n",
           ss.activations_peak / 1024.0, ss.activations_live_peak / 1024.0, ss.temp_predicted / 1024.0, e_s);
    CHECK(e_s <= 1e-5);

    /* 2. a memory budget under the stored plan's: the 16->32 block is recomputed */
    o.memory_budget = plan_memory(&ss) - 4096;
    cw_plan *pr = NULL;
    ASSERT_OK_CTX(c.ctx, cw_graph_compile(c.g, &pr, &o));
    cw_plan_stats sr;
    ASSERT_OK(cw_plan_get_stats(pr, &sr));
    CHECK(plan_memory(&sr) <= o.memory_budget);
    CHECK(sr.n_recomputed == 2 && sr.recompute_gflop > 0);
    CHECK(sr.activations_live_peak < ss.activations_live_peak);
    float *yr = run(&c, pr, in, &n);
    const double e_st = cw_err_rel(yr, ys, n);
    double e_r = cw_err_rel_d(yr, ref, n);
    printf("memory budget %.0f KiB: %d blocks recomputed (+%.4f GFLOP of %.4f), activations %.0f KiB (live peak %.0f "
           "KiB) + temp %.0f KiB; vs stored %.3g, vs double %.3g\n",
           o.memory_budget / 1024.0, sr.n_recomputed, sr.recompute_gflop, sr.conv_gflop, sr.activations_peak / 1024.0,
           sr.activations_live_peak / 1024.0, sr.temp_predicted / 1024.0, e_st, e_r);
    CHECK(e_st <= 1e-5 && e_r <= 1e-5);
    CHECK(hb_check(pr) == 0);
    int64_t reached = plan_memory(&sr);
    cw_plan_destroy(pr);

    /* 3. below what recomputing reaches: a budget error naming it */
    o.memory_budget = reached / 2;
    CHECK(cw_graph_compile(c.g, &pr, &o) == CW_ERR_BUDGET);
    CHECK(strstr(cw_context_get_last_error(c.ctx), "with every recomputable block recomputed") != NULL);
    /* a compile that succeeds after refusing candidate plans leaves the last failed call's message */
    char *failed = strdup(cw_context_get_last_error(c.ctx));
    ASSERT_TRUE(failed != NULL);
    o.memory_budget = reached;
    ASSERT_OK_CTX(c.ctx, cw_graph_compile(c.g, &pr, &o));
    if (strcmp(cw_context_get_last_error(c.ctx), failed) != 0) {
        fprintf(stderr, "a successful compile changed the last error to: %s\n", cw_context_get_last_error(c.ctx));
        cw_test_failures++;
    }
    free(failed);
    cw_plan_destroy(pr);
    cw_plan_destroy(ps);
    free(ys);
    unbuild(&c);

    /* 4. the memory ladder at the same temp budget: exact, and each run within its total */
    check_ladder(ref, in);

    /* 5. one recompute plan (2 streams) rebuilt under 4 chaos seeds (sanitizers: 2) with poison: the same bits */
    float *base = NULL;
    int mism = 0;
    const int seeds = cw_test_quick() ? 2 : 4; /* sanitizer builds: 2 */
    for (int cs = 0; cs < seeds; cs++) {
        build(&c, 300 + (uint64_t)cs, CW_FLAG_CHAOS | CW_FLAG_POISON);
        cw_compile_options f = CW_COMPILE_OPTIONS_INIT;
        f.temp_budget = 96 << 10;
        f.streams = 2; /* the plan of part 2: one heavy stream and the light one */
        f.memory_budget = reached;
        cw_plan *p = NULL;
        ASSERT_OK_CTX(c.ctx, cw_graph_compile(c.g, &p, &f));
        cw_plan_stats sf;
        ASSERT_OK(cw_plan_get_stats(p, &sf));
        CHECK(sf.n_recomputed == 2);
        for (int r = 0; r < 2; r++) {
            float *y = run(&c, p, in, &n);
            CHECK(hb_check(p) == 0);
            if (!base) {
                base = y;
            } else {
                if (memcmp(base, y, (size_t)n * 4) != 0) mism++;
                free(y);
            }
        }
        cw_plan_destroy(p);
        unbuild(&c);
    }
    CHECK(mism == 0);
    CHECK(cw_err_rel_d(base, ref, n) <= 1e-5);
    printf("recompute plan on 2 streams: %d chaos seeds x 2 runs with poison, %d mismatches\n", seeds, mism);

    /* 6, 7. chains */
    check_same_shape_chain();
    check_cross_block();
    /* 8. the chains again with replicate pads before their convs: the same plans' memory */
    g_replicate = 1;
    check_same_shape_chain();
    check_cross_block();
    g_replicate = 0;
    /* 9. the channel-changing chain with its adds' operands swapped: the same plans' memory */
    g_conv2_first = 1;
    check_cross_block();
    g_conv2_first = 0;
    /* 10. a recomputing conv planned on the whole share where that is much faster */
    check_whole_share();
    free(base), free(yr), free(in), free(ref);
    free_conv(&conv_in), free_conv(&conv_out);
    for (int b = 0; b < 2; b++) {
        blk *k = &blocks[b];
        free(k->n1.g), free(k->n1.b), free(k->n2.g), free(k->n2.b);
        free_conv(&k->c1), free_conv(&k->c2);
        if (k->sc.w) free_conv(&k->sc);
    }
    TEST_DONE();
}
