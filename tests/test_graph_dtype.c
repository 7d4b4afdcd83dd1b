/* Half-precision graphs in the scheduler (issue 13, its scheduler half): the element type
 * travels through graph, lowering, sizing, arenas, views and describe.
 * 1. A small graph (convs with fused GroupNorm + SiLU + upsample preps, an in-place residual
 *    epilogue, a per-channel scale) compiled in f32, f16 and bf16 with the same patching:
 *    every activation, patch buffer and band buffer of a half plan holds exactly half the
 *    f32 plan's bytes, every compute-internal temporary (workspaces, GroupNorm partials and
 *    scale/shift) the same bytes; the activation arena is exactly half; describe names the
 *    dtype and shows the halved bytes.
 * 2. The views the backend gets: a recording backend (the cpu backend's runtime, its op
 *    hooks replaced by recorders that run nothing) sees every conv, prep, add, statistics
 *    and channel view in the graph's dtype, and each activation view at exactly half the
 *    f32 plan's arena offset, op for op.
 * 3. Attention in a half graph: its q, k, v and output staged in f32 (prep conversions
 *    graph dtype -> f32 -> graph dtype); the GEMMs on f32.
 * 4. The SD decoder (demos/vae/vae_*.c) at a 16x16 latent in f16 and bf16: activation arena
 *    and every patch's prep and band buffer exactly half the f32 plan's.
 * 5. Mixed graphs are refused, naming the node and both dtypes; nothing is added.
 * 7. The planner sizes a half conv's patch and band buffers in its dtype: the least budget
 *    that fits (cw__planner_plan's min_avail, with cpu_direct's zero workspace) halves, and
 *    a budget that fits the half conv in P patches does not fit the f32 one.
 * 6. On the cpu backend's own hooks (a half plan compiled with them: its algorithms and
 *    workspaces are the half ones): the half plan's run gives an output near the f32 plan's
 *    (or, on a backend without half kernels, CW_ERR_UNSUPPORTED); never anything else.
 * For 1-5 the compile-time hooks (conv_algos, conv_prepare) answer a half problem as its
 * f32 twin: both plans then pick the same algorithms (the cpu backend lists oneDNN only for
 * f32 on AVX2, and its half GEMM needs more workspace), so buffers compare one for one. */
#include <cjson/cJSON.h>

#include "convweave/convweave.h"
#include "hb_check.h"
#include "scheduler/planner.h"
#include "scheduler/sched.h"
#include "testutil.h"
#include "vae.h"

static const cw__ops_i *g_real;
static cw__ops_i g_shim;

static cw__conv_problem as_f32(const cw__conv_problem *p) {
    cw__conv_problem q = *p;
    q.x.dtype = q.w.dtype = q.y.dtype = CW_F32;
    return q;
}

static cw_status shim_conv_algos(cw__backend *be, const cw__conv_problem *p, cw__conv_algo *out, int max, int *n) {
    cw__conv_problem q = as_f32(p);
    return g_real->conv_algos(be, &q, out, max, n);
}

static cw_status shim_conv_prepare(cw__backend *be, const cw__conv_problem *p, const cw__conv_algo *algo,
                                   int64_t ws_cap, cw__conv_algo *used) {
    cw__conv_problem q = as_f32(p);
    return g_real->conv_prepare(be, &q, algo, ws_cap, used);
}

/* ---- a recording backend: every op call's views, nothing run ---------------------------- */

enum { OP_CONV, OP_PREP, OP_ADD, OP_STATS, OP_FIN, OP_CHAN, OP_GEMM, OP_SOFTMAX };
typedef struct rec_view {
    cw_dtype dt;
    int rank;
    int64_t dims[CW_MAX_RANK];
    int64_t arena_off; /* byte offset in the plan's activation arena; -1 outside it */
} rec_view;
typedef struct rec_op {
    int kind;
    int n;
    rec_view v[3];
} rec_op;

static struct {
    const cw_plan *plan; /* whose arena offsets to record */
    rec_op *ops;
    int n, cap;
} g_rec;

static rec_view rv(const cw_tensor_desc *d, const void *data) {
    rec_view r;
    memset(&r, 0, sizeof r);
    r.dt = d->dtype;
    r.rank = d->rank;
    for (int i = 0; i < d->rank; i++) r.dims[i] = d->dims[i];
    const char *a = g_rec.plan->act_arena, *p = data;
    r.arena_off = a && p >= a && p < a + g_rec.plan->act_bytes ? (int64_t)(p - a) : -1;
    if (r.arena_off >= 0) /* the whole view lies in the arena */
        ASSERT_TRUE(r.arena_off + cw__desc_span_bytes(d) <= g_rec.plan->act_bytes);
    return r;
}

static void rec(int kind, int n, const rec_view *v) {
    if (g_rec.n == g_rec.cap) {
        g_rec.cap = g_rec.cap ? 2 * g_rec.cap : 256;
        g_rec.ops = realloc(g_rec.ops, (size_t)g_rec.cap * sizeof *g_rec.ops);
        ASSERT_TRUE(g_rec.ops);
    }
    rec_op *o = &g_rec.ops[g_rec.n++];
    memset(o, 0, sizeof *o);
    o->kind = kind;
    o->n = n;
    for (int i = 0; i < n; i++) o->v[i] = v[i];
}

static cw_status rec_conv(cw__backend *be, cw__stream *s, const cw__conv_problem *p, const cw__conv_algo *algo,
                          const void *x, const void *w, const void *b, void *y, void *ws, int64_t ws_bytes) {
    rec_view v[3] = {rv(&p->x, x), rv(&p->w, w), rv(&p->y, y)};
    rec(OP_CONV, 3, v);
    return CW_OK;
}
static cw_status rec_prep(cw__backend *be, cw__stream *s, const cw__prep_params *p) {
    rec_view v[2] = {rv(&p->src.d, p->src.data), rv(&p->dst.d, p->dst.data)};
    rec(OP_PREP, 2, v);
    return CW_OK;
}
static cw_status rec_add(cw__backend *be, cw__stream *s, const cw__view *d, const cw__view *a, const cw__view *b) {
    rec_view v[3] = {rv(&d->d, d->data), rv(&a->d, a->data), rv(&b->d, b->data)};
    rec(OP_ADD, 3, v);
    return CW_OK;
}
static cw_status rec_stats(cw__backend *be, cw__stream *s, const cw__view *x, int64_t groups, double *out) {
    rec_view v[1] = {rv(&x->d, x->data)};
    rec(OP_STATS, 1, v);
    return CW_OK;
}
static cw_status rec_fin(cw__backend *be, cw__stream *s, const double *parts, int64_t n_parts, int64_t n, int64_t c,
                         int64_t groups, const float *gamma, const float *beta, float eps, float *scale, float *shift) {
    rec(OP_FIN, 0, NULL);
    return CW_OK;
}
static cw_status rec_gop(cw__backend *be, cw__stream *s, const cw__op_args *a) {
    rec_view v[2] = {rv(&a->out.d, a->out.data), rv(&a->in[0].d, a->in[0].data)};
    rec(OP_CHAN, 2, v);
    return CW_OK;
}
static cw_status rec_gemm(cw__backend *be, cw__stream *s, const cw__gemm_params *p) {
    rec(OP_GEMM, 0, NULL);
    return CW_OK;
}
static cw_status rec_softmax(cw__backend *be, cw__stream *s, float *x, int64_t rows, int64_t cols, int64_t ld) {
    rec(OP_SOFTMAX, 0, NULL);
    return CW_OK;
}

static void use_table(cw_context *ctx, const cw__ops_i *t) { ctx->be->ops = t; }

/* ---- building graphs --------------------------------------------------------------------- */

typedef struct net {
    cw_context *ctx;
    cw_graph *g;
    cw_dtype dt;
    cw_tensor *t[48];
    int nt;
    cw_rng r;
} net;

/* A constant of dims, filled with scale * uniform(-1, 1) (+ offset) rounded to dt. */
static cw_node cst(net *n, cw_dtype dt, int rank, const int64_t *dims, float scale, float offset) {
    cw_tensor_desc d;
    ASSERT_OK(cw_tensor_desc_make(&d, dt, rank, dims));
    cw_tensor *t;
    ASSERT_OK_CTX(n->ctx, cw_tensor_create(&t, n->ctx, &d));
    int64_t k = cw_tensor_desc_numel(&d);
    float *f = malloc((size_t)k * 4);
    void *h = malloc((size_t)k * 4);
    for (int64_t i = 0; i < k; i++) f[i] = offset + scale * cw_rng_float(&n->r);
    ASSERT_OK(cw_dtype_convert(h, dt, f, CW_F32, k));
    ASSERT_OK_CTX(n->ctx, cw_tensor_upload(t, h, (size_t)k * cw_dtype_size(dt)));
    free(f), free(h);
    ASSERT_TRUE(n->nt < 48);
    n->t[n->nt++] = t;
    cw_node c;
    ASSERT_OK_CTX(n->ctx, cw_graph_constant(n->g, &c, "c", t));
    return c;
}

static cw_node conv(net *n, cw_node x, int64_t cin, int64_t cout, int k) {
    int64_t wd[4] = {cout, cin, k, k}, bd[1] = {cout};
    cw_node w = cst(n, n->dt, 4, wd, 1.0f / sqrtf((float)(cin * k * k)), 0.0f), b = cst(n, n->dt, 1, bd, 0.1f, 0.0f);
    cw_conv_params p = CW_CONV_PARAMS_INIT;
    p.pad_pre[0] = p.pad_pre[1] = p.pad_post[0] = p.pad_post[1] = (k - 1) / 2;
    cw_node y;
    ASSERT_OK_CTX(n->ctx, cw_graph_conv(n->g, &y, x, w, b, &p));
    return y;
}

static cw_node gn_silu(net *n, cw_node x, int64_t c) {
    int64_t d[1] = {c};
    cw_node gm = cst(n, CW_F32, 1, d, 0.1f, 1.0f), bt = cst(n, CW_F32, 1, d, 0.1f, 0.0f), y, z;
    ASSERT_OK_CTX(n->ctx, cw_graph_group_norm(n->g, &y, x, gm, bt, 4, 1e-5f));
    ASSERT_OK_CTX(n->ctx, cw_graph_silu(n->g, &z, y));
    return z;
}

/* x [1, 8, 32, 32] -> conv3x3 16 -> (attention block with residual) -> GN + SiLU + up2 ->
 * conv3x3 16 (+ up2 of its input, in place) -> channel scale -> conv3x3 4 [1, 4, 64, 64]. */
static void build_net(net *n, cw_context *ctx, cw_dtype dt, int attn) {
    memset(n, 0, sizeof *n);
    n->ctx = ctx;
    n->dt = dt;
    n->r.s = 0x13; /* the same values in every dtype */
    ASSERT_OK_CTX(ctx, cw_graph_create(&n->g, ctx));
    int64_t xd[4] = {1, 8, 32, 32}, c16[1] = {16};
    cw_tensor_desc d;
    ASSERT_OK(cw_tensor_desc_make(&d, dt, 4, xd));
    cw_node x, a, u, r, s, y;
    ASSERT_OK_CTX(ctx, cw_graph_input(n->g, &x, "x", &d));
    cw_node c1 = conv(n, x, 8, 16, 3);
    a = c1;
    if (attn) {
        cw_node q = conv(n, c1, 16, 16, 1), k = conv(n, c1, 16, 16, 1), v = conv(n, c1, 16, 16, 1), o;
        ASSERT_OK_CTX(ctx, cw_graph_attention(n->g, &o, q, k, v, 0.25f));
        ASSERT_OK_CTX(ctx, cw_graph_add(n->g, &a, o, c1));
    }
    ASSERT_OK_CTX(ctx, cw_graph_upsample2x(n->g, &u, gn_silu(n, a, 16)));
    cw_node c2 = conv(n, u, 16, 16, 3), skip;
    ASSERT_OK_CTX(ctx, cw_graph_upsample2x(n->g, &skip, a));
    ASSERT_OK_CTX(ctx, cw_graph_add(n->g, &r, c2, skip));
    ASSERT_OK_CTX(ctx, cw_graph_scale(n->g, &s, r, cst(n, CW_F32, 1, c16, 0.5f, 1.0f)));
    y = conv(n, s, 16, 4, 3);
    ASSERT_OK_CTX(ctx, cw_graph_output(n->g, y, "y"));
}

static void free_net(net *n) {
    cw_graph_destroy(n->g);
    for (int i = 0; i < n->nt; i++) cw_tensor_destroy(n->t[i]);
}

static cw_plan *compile_fixed(cw_context *ctx, cw_graph *g, int patches, int streams) {
    cw_compile_options o = CW_COMPILE_OPTIONS_INIT;
    o.policy = CW_PATCHES_FIXED;
    o.patches = patches;
    o.streams = streams;
    o.temp_budget = -1;
    cw_plan *p = NULL;
    ASSERT_OK_CTX(ctx, cw_graph_compile(g, &p, &o));
    return p;
}

/* ---- 1. bytes, buffer by buffer ---------------------------------------------------------- */

/* Bytes of p's buffers by role: activations, prep/band buffers (temporaries with a desc) and
 * compute-internal temporaries (no desc: workspaces, GroupNorm partials, scale/shift,
 * attention scores). */
typedef struct sizes {
    int64_t act, pbuf, internal;
} sizes;

static sizes plan_sizes(const cw_plan *p) {
    sizes z = {0, 0, 0};
    for (int b = 0; b < p->n_bufs; b++) {
        const cw__buf *bf = &p->bufs[b];
        if (bf->kind == CW__B_ACT) z.act += bf->bytes;
        else if (bf->kind == CW__B_TEMP && bf->d.rank > 0) z.pbuf += bf->bytes;
        else if (bf->kind == CW__B_TEMP) z.internal += bf->bytes;
    }
    return z;
}

/* The half plan h against the f32 plan f of the same graph and patching: buffer by buffer. */
static void check_halved(const cw_plan *f, const cw_plan *h, cw_dtype dt) {
    ASSERT_EQ_I(h->n_bufs, f->n_bufs);
    ASSERT_EQ_I(h->n_tasks, f->n_tasks);
    ASSERT_EQ_I(h->dtype, dt);
    ASSERT_EQ_I(f->dtype, CW_F32);
    int n_act = 0, n_pbuf = 0, n_int = 0;
    for (int b = 0; b < f->n_bufs; b++) {
        const cw__buf *a = &f->bufs[b], *c = &h->bufs[b];
        ASSERT_EQ_I(c->kind, a->kind);
        if (a->kind != CW__B_ACT && a->kind != CW__B_TEMP) continue;
        if (a->kind == CW__B_ACT || a->d.rank > 0) { /* the graph's dtype */
            ASSERT_EQ_I(a->d.dtype, CW_F32);
            ASSERT_EQ_I(c->d.dtype, dt);
            ASSERT_EQ_I(2 * c->bytes, a->bytes);
            n_act += a->kind == CW__B_ACT, n_pbuf += a->kind == CW__B_TEMP;
        } else { /* compute-internal: f32/double whatever the graph's dtype */
            ASSERT_EQ_I(c->bytes, a->bytes);
            n_int++;
        }
    }
    ASSERT_TRUE(n_act > 0 && n_pbuf > 0 && n_int > 0);
    ASSERT_EQ_I(2 * h->act_bytes, f->act_bytes);
    ASSERT_EQ_I(2 * h->act_live_peak, f->act_live_peak);
    for (int t = 0; t < f->n_tasks; t++)
        if (f->tasks[t].kind == CW__T_CONV) {
            const cw__conv_ext *fa = cw__conv_of(f, &f->tasks[t]), *ha = cw__conv_of(h, &h->tasks[t]);
            const cw__conv_problem *pa = &fa->prob, *pc = &ha->prob;
            ASSERT_TRUE(pc->x.dtype == dt && pc->w.dtype == dt && pc->y.dtype == dt);
            ASSERT_TRUE(pa->x.dtype == CW_F32 && pa->w.dtype == CW_F32 && pa->y.dtype == CW_F32);
            ASSERT_EQ_I(ha->algo.workspace, fa->algo.workspace);
        }
}

/* describe: the dtype, and per patch prep/band bytes and the arena exactly half. */
static void check_describe(const cw_plan *f, const cw_plan *h, const char *dtname) {
    char *sf = NULL, *sh = NULL;
    ASSERT_OK(cw_plan_describe(f, &sf, 1));
    ASSERT_OK(cw_plan_describe(h, &sh, 1));
    cJSON *jf = cJSON_Parse(sf), *jh = cJSON_Parse(sh);
    ASSERT_TRUE(jf && jh);
    ASSERT_TRUE(!strcmp(cJSON_GetObjectItem(jf, "dtype")->valuestring, "f32"));
    ASSERT_TRUE(!strcmp(cJSON_GetObjectItem(jh, "dtype")->valuestring, dtname));
    double af = cJSON_GetObjectItem(jf, "activations_peak")->valuedouble;
    double ah = cJSON_GetObjectItem(jh, "activations_peak")->valuedouble;
    ASSERT_TRUE(af > 0 && ah * 2 == af);
    cJSON *cf = cJSON_GetObjectItem(jf, "convs"), *ch = cJSON_GetObjectItem(jh, "convs");
    ASSERT_EQ_I(cJSON_GetArraySize(ch), cJSON_GetArraySize(cf));
    int64_t prep = 0, band = 0;
    for (int c = 0; c < cJSON_GetArraySize(cf); c++) {
        cJSON *pf = cJSON_GetObjectItem(cJSON_GetArrayItem(cf, c), "patch");
        cJSON *ph = cJSON_GetObjectItem(cJSON_GetArrayItem(ch, c), "patch");
        ASSERT_EQ_I(cJSON_GetArraySize(ph), cJSON_GetArraySize(pf));
        for (int j = 0; j < cJSON_GetArraySize(pf); j++) {
            cJSON *qf = cJSON_GetArrayItem(pf, j), *qh = cJSON_GetArrayItem(ph, j);
            double a = cJSON_GetObjectItem(qf, "prep_bytes")->valuedouble;
            double b = cJSON_GetObjectItem(qh, "prep_bytes")->valuedouble;
            double ya = cJSON_GetObjectItem(qf, "band_bytes")->valuedouble;
            double yb = cJSON_GetObjectItem(qh, "band_bytes")->valuedouble;
            CHECK(2 * b == a && 2 * yb == ya);
            CHECK(cJSON_GetObjectItem(qh, "workspace")->valuedouble == cJSON_GetObjectItem(qf, "workspace")->valuedouble);
            prep += (int64_t)a, band += (int64_t)ya;
        }
    }
    CHECK(prep > 0); /* the fused preps have buffers */
    cJSON_Delete(jf), cJSON_Delete(jh);
    cw_free(sf), cw_free(sh);
    ASSERT_OK(cw_plan_describe(h, &sh, 0));
    char want[32];
    snprintf(want, sizeof want, "dtype %s", dtname);
    CHECK(strstr(sh, want) != NULL && strstr(sh, "prep buffer") != NULL);
    cw_free(sh);
    fprintf(stderr, "  %s: activation arena %.0f KiB (f32 %.0f KiB); prep buffers %lld B, band buffers %lld B in f32\n",
            dtname, ah / 1024, af / 1024, (long long)prep, (long long)band);
}

/* ---- 2. the views the backend sees ------------------------------------------------------- */

static void record_run(cw_context *ctx, cw_plan *p, const cw__ops_i *rec_i, rec_op **ops, int *n) {
    g_rec.plan = p;
    g_rec.ops = NULL;
    g_rec.n = g_rec.cap = 0;
    cw_tensor *x, *y;
    ASSERT_OK_CTX(ctx, cw_tensor_create(&x, ctx, &p->in[0].d));
    ASSERT_OK_CTX(ctx, cw_tensor_create(&y, ctx, &p->out[0].d));
    use_table(ctx, rec_i);
    ASSERT_OK_CTX(ctx, cw_plan_run(p, &x, 1, &y, 1));
    use_table(ctx, &g_shim);
    cw_tensor_destroy(x), cw_tensor_destroy(y);
    *ops = g_rec.ops;
    *n = g_rec.n;
}

static void check_views(const rec_op *f, int nf, const rec_op *h, int nh, cw_dtype dt) {
    ASSERT_EQ_I(nh, nf);
    int n_arena = 0, kinds[8] = {0};
    for (int i = 0; i < nf; i++) {
        ASSERT_EQ_I(h[i].kind, f[i].kind);
        ASSERT_EQ_I(h[i].n, f[i].n);
        kinds[f[i].kind]++;
        for (int k = 0; k < f[i].n; k++) {
            const rec_view *a = &f[i].v[k], *b = &h[i].v[k];
            ASSERT_EQ_I(a->dt, CW_F32);
            ASSERT_EQ_I(b->dt, dt);
            ASSERT_EQ_I(b->rank, a->rank);
            for (int d = 0; d < a->rank; d++) ASSERT_EQ_I(b->dims[d], a->dims[d]);
            ASSERT_EQ_I(b->arena_off >= 0, a->arena_off >= 0);
            if (a->arena_off >= 0) ASSERT_EQ_I(2 * b->arena_off, a->arena_off);
            n_arena += a->arena_off >= 0;
        }
    }
    ASSERT_TRUE(kinds[OP_CONV] && kinds[OP_PREP] && kinds[OP_ADD] && kinds[OP_STATS] && kinds[OP_CHAN] && n_arena);
    fprintf(stderr, "  %d op calls (%d conv, %d prep, %d add, %d stats, %d channel): every view %s, %d activation "
            "views at half the f32 offset\n", nf, kinds[OP_CONV], kinds[OP_PREP], kinds[OP_ADD], kinds[OP_STATS],
            kinds[OP_CHAN], cw__dtype_name(dt), n_arena);
}

/* ---- 3. attention in a half graph -------------------------------------------------------- */

static void check_attention(cw_context *ctx, cw_plan *f, cw_plan *h, const cw__ops_i *rec_i, cw_dtype dt) {
    /* its staging: 4 f32 temporaries of C * T * 4 bytes for the one sample */
    int staging = 0;
    for (int b = 0; b < h->n_bufs; b++)
        if (h->bufs[b].kind == CW__B_TEMP && h->bufs[b].d.rank == 4 && h->bufs[b].d.dtype == CW_F32) {
            ASSERT_EQ_I(h->bufs[b].bytes, 16 * 32 * 32 * 4);
            staging++;
        }
    ASSERT_EQ_I(staging, 4);
    for (int t = 0; t < h->n_tasks; t++)
        if (h->tasks[t].kind == CW__T_ATTN) {
            const cw__task *k = &h->tasks[t];
            const int bs[4] = {k->u.attn.q.buf, k->u.attn.k.buf, k->u.attn.v.buf, k->u.attn.o.buf};
            for (int a = 0; a < 4; a++) ASSERT_TRUE(h->bufs[bs[a]].kind == CW__B_TEMP && h->bufs[bs[a]].d.dtype == CW_F32);
        }
    ASSERT_EQ_I(2 * h->act_bytes, f->act_bytes); /* staging is temporary, not activation */
    rec_op *ops;
    int n;
    record_run(ctx, h, rec_i, &ops, &n);
    int to32 = 0, from32 = 0, gemms = 0, i_first_gemm = -1, i_back = -1;
    for (int i = 0; i < n; i++) {
        if (ops[i].kind == OP_GEMM && gemms++ == 0) i_first_gemm = i;
        if (ops[i].kind != OP_PREP) continue;
        cw_dtype s = ops[i].v[0].dt, d = ops[i].v[1].dt;
        if (s == dt && d == CW_F32) to32++;
        else if (s == CW_F32 && d == dt) from32++, i_back = i;
        else ASSERT_TRUE(s == dt && d == dt);
    }
    ASSERT_EQ_I(to32, 3);
    ASSERT_EQ_I(from32, 1);
    ASSERT_TRUE(gemms >= 2 && i_first_gemm < i_back);
    free(ops);
    fprintf(stderr, "  attention: q, k, v -> f32 staging (3 preps), %d f32 GEMMs, output back to %s\n", gemms,
            cw__dtype_name(dt));
}

/* ---- 6. running on the cpu backend as it is ---------------------------------------------- */

static float *run_real(cw_context *ctx, cw_plan *p, const float *in32, cw_status *st) {
    const cw_tensor_desc *id = &p->in[0].d, *od = &p->out[0].d;
    int64_t ni = cw_tensor_desc_numel(id), no = cw_tensor_desc_numel(od);
    size_t es = cw_dtype_size(id->dtype);
    void *hi = malloc((size_t)ni * 4), *ho = malloc((size_t)no * 4);
    float *y = malloc((size_t)no * 4);
    ASSERT_OK(cw_dtype_convert(hi, id->dtype, in32, CW_F32, ni));
    cw_tensor *x, *t;
    ASSERT_OK_CTX(ctx, cw_tensor_create(&x, ctx, id));
    ASSERT_OK_CTX(ctx, cw_tensor_create(&t, ctx, od));
    ASSERT_OK_CTX(ctx, cw_tensor_upload(x, hi, (size_t)ni * es));
    *st = cw_plan_run(p, &x, 1, &t, 1);
    if (*st == CW_OK) {
        ASSERT_OK_CTX(ctx, cw_tensor_download(t, ho, (size_t)no * es));
        ASSERT_OK(cw_dtype_convert(y, CW_F32, ho, od->dtype, no));
    }
    cw_tensor_destroy(x), cw_tensor_destroy(t);
    free(hi), free(ho);
    return y;
}

/* f: the f32 plan; gh: the half graph, compiled here on the backend's own hooks. */
static void check_cpu_run(cw_context *ctx, cw_plan *f, cw_graph *gh, cw_dtype dt) {
    use_table(ctx, g_real);
    cw_plan *h = compile_fixed(ctx, gh, 4, 3);
    int64_t ni = cw_tensor_desc_numel(&f->in[0].d), no = cw_tensor_desc_numel(&f->out[0].d);
    float *in = malloc((size_t)ni * 4);
    cw_rng r = {7};
    for (int64_t i = 0; i < ni; i++) in[i] = cw_rng_float(&r);
    cw_status s32, sh;
    float *y32 = run_real(ctx, f, in, &s32), *yh = run_real(ctx, h, in, &sh);
    ASSERT_OK_CTX(ctx, s32);
    if (sh == CW_ERR_UNSUPPORTED) {
        const char *m = cw_context_get_last_error(ctx);
        fprintf(stderr, "  run on cpu: CW_ERR_UNSUPPORTED (%s)\n", m);
        CHECK(strstr(m, "cpu") != NULL);
    } else { /* the cpu backend has half kernels: near the f32 run (a loose sanity bound) */
        ASSERT_OK_CTX(ctx, sh);
        double m = 0, e = 0;
        for (int64_t i = 0; i < no; i++) {
            m = fmax(m, fabs(y32[i]));
            e = cw_err_max(e, fabs((double)yh[i] - y32[i]));
        }
        fprintf(stderr, "  run on cpu: max |%s - f32| = %.3g of %.3g\n", cw__dtype_name(dt), e, m);
        CHECK(e <= (dt == CW_F16 ? 2e-2 : 1e-1) * m);
    }
    /* the plan and the context stay usable after a refused run */
    free(y32);
    y32 = run_real(ctx, f, in, &s32);
    ASSERT_OK_CTX(ctx, s32);
    free(in), free(y32), free(yh);
    cw_plan_destroy(h);
    use_table(ctx, &g_shim);
}

/* ---- 3b. attention in a half graph, chunked under a budget --------------------------------- */

/* o = attention(x, x, x) of a [1, 16, 32, 32] half input with peaked softmax rows (scale 2),
 * against a double-precision reference of the stored input: unbudgeted (one chunk) and under
 * a 2 MiB budget that splits the 1024 query tokens into chunks of whole rows, each staged
 * through chunk-sized f32 buffers (q and output) beside whole f32 k and v; every
 * happens-before pair of the chunked plan ordered. */
static void test_attention_chunks(cw_context *ctx, cw_dtype dt) {
    enum { C = 16, S = 32, T = S * S };
    const int64_t dims[4] = {1, C, S, S};
    float *x = malloc(C * T * 4);
    cw_rng r = {0x5eed};
    for (int i = 0; i < C * T; i++) x[i] = 2.0f * cw_rng_float(&r) - 1.0f;
    void *hx = malloc(C * T * 2);
    ASSERT_OK(cw_dtype_convert(hx, dt, x, CW_F32, C * T));
    ASSERT_OK(cw_dtype_convert(x, CW_F32, hx, dt, C * T)); /* x as stored in dt */
    double *ref = malloc(C * T * sizeof *ref), *w = malloc(T * sizeof *w);
    for (int t = 0; t < T; t++) {
        double mx = -INFINITY, sum = 0;
        for (int s = 0; s < T; s++) {
            double a = 0;
            for (int c = 0; c < C; c++) a += (double)x[c * T + t] * x[c * T + s];
            w[s] = 2.0 * a;
            mx = fmax(mx, w[s]);
        }
        for (int s = 0; s < T; s++) sum += w[s] = exp(w[s] - mx);
        for (int c = 0; c < C; c++) {
            double o = 0;
            for (int s = 0; s < T; s++) o += x[c * T + s] * w[s];
            ref[c * T + t] = o / sum;
        }
    }
    cw_graph *g;
    ASSERT_OK_CTX(ctx, cw_graph_create(&g, ctx));
    cw_tensor_desc d;
    ASSERT_OK(cw_tensor_desc_make(&d, dt, 4, dims));
    cw_node in, o;
    ASSERT_OK_CTX(ctx, cw_graph_input(g, &in, "x", &d));
    ASSERT_OK_CTX(ctx, cw_graph_attention(g, &o, in, in, in, 2.0f));
    ASSERT_OK_CTX(ctx, cw_graph_output(g, o, "o"));
    const double u = dt == CW_F16 ? ldexp(1.0, -11) : ldexp(1.0, -8);
    for (int budgeted = 0; budgeted < 2; budgeted++) {
        cw_compile_options opt = CW_COMPILE_OPTIONS_INIT;
        opt.streams = 3;
        opt.temp_budget = budgeted ? 2 << 20 : -1;
        cw_plan *p = NULL;
        ASSERT_OK_CTX(ctx, cw_graph_compile(g, &p, &opt));
        int chunks = 0;
        for (int k = 0; k < p->n_tasks; k++) {
            const cw__task *tk = &p->tasks[k];
            if (tk->kind != CW__T_ATTN) continue;
            chunks++;
            const cw__buf *qb = &p->bufs[tk->u.attn.q.buf], *ob = &p->bufs[tk->u.attn.o.buf];
            ASSERT_TRUE(qb->kind == CW__B_TEMP && qb->d.dtype == CW_F32 && ob->kind == CW__B_TEMP);
            ASSERT_EQ_I(qb->d.dims[2] * S, tk->u.attn.t1 - tk->u.attn.t0); /* the chunk's rows */
        }
        ASSERT_TRUE(budgeted ? chunks >= 4 : chunks == 1);
        ASSERT_EQ_I(hb_check(p), 0);
        cw_status st;
        float *y = run_real(ctx, p, x, &st);
        ASSERT_OK_CTX(ctx, st);
        double e = 0, m = 0;
        for (int i = 0; i < C * T; i++) {
            m = fmax(m, fabs(ref[i]));
            e = cw_err_max(e, fabs((double)y[i] - ref[i]));
        }
        /* stored once in dt (u relative), after f32 GEMMs and softmax over 1024 tokens */
        fprintf(stderr, "attention %s, %d chunk(s): max |o - ref| = %.3g of %.3g\n", cw__dtype_name(dt), chunks, e, m);
        CHECK(e <= (u + 1e-4) * m);
        free(y);
        cw_plan_destroy(p);
    }
    cw_graph_destroy(g);
    free(x), free(hx), free(ref), free(w);
}

static void test_small(cw_context *ctx, const cw__ops_i *rec_i) {
    const cw_dtype dts[2] = {CW_F16, CW_BF16};
    for (int attn = 0; attn < 2; attn++) {
        net nf;
        build_net(&nf, ctx, CW_F32, attn);
        cw_plan *f = compile_fixed(ctx, nf.g, 4, 3);
        rec_op *of = NULL;
        int nof = 0;
        if (!attn) record_run(ctx, f, rec_i, &of, &nof);
        for (int k = 0; k < 2; k++) {
            fprintf(stderr, "small graph%s, %s:\n", attn ? " with attention" : "", cw__dtype_name(dts[k]));
            net nh;
            build_net(&nh, ctx, dts[k], attn);
            cw_plan *h = compile_fixed(ctx, nh.g, 4, 3);
            check_describe(f, h, cw__dtype_name(dts[k]));
            if (!attn) {
                check_halved(f, h, dts[k]);
                rec_op *oh;
                int noh;
                record_run(ctx, h, rec_i, &oh, &noh);
                check_views(of, nof, oh, noh, dts[k]);
                free(oh);
            } else {
                check_attention(ctx, f, h, rec_i, dts[k]);
            }
            check_cpu_run(ctx, f, nh.g, dts[k]);
            sizes zf = plan_sizes(f), zh = plan_sizes(h);
            fprintf(stderr, "  activations %lld / %lld B, prep+band %lld / %lld B, internal temporaries %lld / %lld B "
                    "(f32 / %s)\n", (long long)zf.act, (long long)zh.act, (long long)zf.pbuf, (long long)zh.pbuf,
                    (long long)zf.internal, (long long)zh.internal, cw__dtype_name(dts[k]));
            cw_plan_destroy(h);
            free_net(&nh);
        }
        free(of);
        cw_plan_destroy(f);
        free_net(&nf);
    }
}

/* ---- 4. the SD decoder ------------------------------------------------------------------- */

static void test_sd_decoder(cw_context *ctx) {
    char err[VAE_ERR_LEN];
    vae_config cfg;
    ASSERT_EQ_I(vae_preset(&cfg, "sd", err, sizeof err), 0);
    vae_weights *w;
    ASSERT_EQ_I(vae_weights_random(&w, 1, err, sizeof err), 0);
    const cw_dtype dts[3] = {CW_F32, CW_F16, CW_BF16};
    cw_plan *plans[3];
    vae_model *ms[3];
    for (int k = 0; k < 3; k++) {
        cw_status st = vae_build(&ms[k], ctx, &cfg, w, VAE_DECODER, 1, 16, 16, dts[k], 0, err, sizeof err);
        if (st != CW_OK) fprintf(stderr, "vae_build %s: %s\n", cw__dtype_name(dts[k]), err);
        ASSERT_OK(st);
        plans[k] = compile_fixed(ctx, ms[k]->graph, 2, 3);
    }
    for (int k = 1; k < 3; k++) {
        fprintf(stderr, "SD decoder 16x16 -> 128x128, %s:\n", cw__dtype_name(dts[k]));
        check_describe(plans[0], plans[k], cw__dtype_name(dts[k]));
        sizes zf = plan_sizes(plans[0]), zh = plan_sizes(plans[k]);
        ASSERT_EQ_I(2 * zh.act, zf.act);
        /* prep and band buffers halve; the attention's f32 staging (4 x 512 x 256 x 4 B) is
         * the one f32 temporary with a desc that the f32 plan lacks */
        ASSERT_EQ_I(2 * (zh.pbuf - 4 * 512 * 256 * 4), zf.pbuf);
        ASSERT_EQ_I(zh.internal, zf.internal);
        fprintf(stderr, "  activations %lld -> %lld B, prep+band buffers %lld -> %lld B (+ f32 attention staging)\n",
                (long long)zf.act, (long long)zh.act, (long long)zf.pbuf, (long long)zh.pbuf);
        /* weights: conv weights and biases halve, GroupNorm vectors stay f32 */
        cw_plan_stats sf, sh;
        ASSERT_OK(cw_plan_get_stats(plans[0], &sf));
        ASSERT_OK(cw_plan_get_stats(plans[k], &sh));
        CHECK(sh.weights_bytes < sf.weights_bytes && 2 * sh.weights_bytes > sf.weights_bytes);
    }
    for (int k = 0; k < 3; k++) {
        cw_plan_destroy(plans[k]);
        vae_model_destroy(ms[k]);
    }
    vae_weights_close(w);
}

/* ---- 5. mixed graphs --------------------------------------------------------------------- */

static cw_context *g_ctx;
static int g_cases;

#define REFUSED(g, call, ...)                                                                                 \
    do {                                                                                                      \
        int n0_ = (g)->n;                                                                                     \
        cw_status s_ = (call);                                                                                \
        const char *m_ = cw_context_get_last_error(g_ctx);                                                    \
        const char *want_[] = {__VA_ARGS__};                                                                  \
        int ok_ = s_ == CW_ERR_INVALID_ARG && (g)->n == n0_;                                                  \
        for (size_t i_ = 0; i_ < sizeof want_ / sizeof want_[0]; i_++) ok_ = ok_ && strstr(m_, want_[i_]);      \
        if (!ok_) {                                                                                           \
            fprintf(stderr, "%s:%d: %s -> %s \"%s\"\n", __FILE__, __LINE__, #call, cw_status_name(s_), m_);     \
            cw_test_failures++;                                                                               \
        }                                                                                                     \
        g_cases++;                                                                                            \
    } while (0)

static void test_mixed(cw_context *ctx) {
    g_ctx = ctx;
    net n;
    memset(&n, 0, sizeof n);
    n.ctx = ctx;
    n.r.s = 5;
    ASSERT_OK_CTX(ctx, cw_graph_create(&n.g, ctx));
    int64_t xd[4] = {1, 8, 8, 8}, wd[4] = {8, 8, 3, 3}, c8[1] = {8};
    cw_tensor_desc d32, d16, bad;
    ASSERT_OK(cw_tensor_desc_make(&d32, CW_F32, 4, xd));
    ASSERT_OK(cw_tensor_desc_make(&d16, CW_F16, 4, xd));
    bad = d32;
    bad.dtype = (cw_dtype)7;
    cw_node x, x2, y, w16, b16, w32, b32, a16, g16, g32, z;
    cw_conv_params p = CW_CONV_PARAMS_INIT;
    p.pad_pre[0] = p.pad_pre[1] = p.pad_post[0] = p.pad_post[1] = 1;
    /* the first input fixes the graph's dtype: f32 */
    ASSERT_OK_CTX(ctx, cw_graph_input(n.g, &x, "latent", &d32));
    REFUSED(n.g, cw_graph_input(n.g, &x2, "x16", &d16), "'x16'", "is f16", "the graph is f32", "input 'latent' (node 0)");
    REFUSED(n.g, cw_graph_input(n.g, &x2, "x7", &bad), "'x7'", "dtype 7 is not a cw_dtype");
    w16 = cst(&n, CW_F16, 4, wd, 0.1f, 0), b16 = cst(&n, CW_F16, 1, c8, 0.1f, 0);
    w32 = cst(&n, CW_F32, 4, wd, 0.1f, 0), b32 = cst(&n, CW_F32, 1, c8, 0.1f, 0);
    int iw16 = w16, ib16 = b16;
    char lw[64], lb[64];
    snprintf(lw, sizeof lw, "constant 'c' (node %d)", iw16);
    snprintf(lb, sizeof lb, "constant 'c' (node %d)", ib16);
    REFUSED(n.g, cw_graph_conv(n.g, &y, x, w16, b32, &p), "cw_graph_conv", "w, ", lw, "is f16", "the graph is f32",
            "input 'latent' (node 0)");
    REFUSED(n.g, cw_graph_conv(n.g, &y, x, w32, b16, &p), "cw_graph_conv", "b, ", lb, "is f16", "the graph is f32");
    ASSERT_OK_CTX(ctx, cw_graph_conv(n.g, &y, x, w32, b32, &p));
    /* a constant used as an activation */
    a16 = cst(&n, CW_F16, 4, xd, 1, 0);
    REFUSED(n.g, cw_graph_add(n.g, &z, y, a16), "cw_graph_add", "b, ", "is f16", "the graph is f32");
    REFUSED(n.g, cw_graph_add(n.g, &z, a16, y), "cw_graph_add", "a, ", "is f16", "the graph is f32");
    REFUSED(n.g, cw_graph_attention(n.g, &z, y, y, a16, 1.0f), "cw_graph_attention", "v, ", "is f16");
    REFUSED(n.g, cw_graph_silu(n.g, &z, a16), "cw_graph_silu", "x, ", "is f16");
    /* GroupNorm's gamma/beta and channel vectors: f32 in every graph */
    g16 = cst(&n, CW_F16, 1, c8, 0.1f, 1), g32 = cst(&n, CW_F32, 1, c8, 0.1f, 1);
    REFUSED(n.g, cw_graph_group_norm(n.g, &z, y, g16, g32, 4, 1e-5f), "gamma must be a contiguous f32 constant",
            "got f16 [8]");
    REFUSED(n.g, cw_graph_scale(n.g, &z, y, g16), "s must be a contiguous f32 constant", "got f16 [8]");
    ASSERT_OK_CTX(ctx, cw_graph_group_norm(n.g, &z, y, g32, g32, 4, 1e-5f));
    ASSERT_OK_CTX(ctx, cw_graph_output(n.g, z, "z"));
    free_net(&n);

    /* an f16 graph: f32 weights refused; its gamma/beta f32 accepted */
    memset(&n, 0, sizeof n);
    n.ctx = ctx;
    ASSERT_OK_CTX(ctx, cw_graph_create(&n.g, ctx));
    ASSERT_OK_CTX(ctx, cw_graph_input(n.g, &x, "z16", &d16));
    w32 = cst(&n, CW_F32, 4, wd, 0.1f, 0), w16 = cst(&n, CW_F16, 4, wd, 0.1f, 0);
    cw_node bb16 = cst(&n, CW_BF16, 1, c8, 0.1f, 0);
    g32 = cst(&n, CW_F32, 1, c8, 0.1f, 1);
    REFUSED(n.g, cw_graph_conv(n.g, &y, x, w32, CW_NODE_NONE, &p), "w, ", "is f32", "the graph is f16",
            "input 'z16' (node 0)");
    REFUSED(n.g, cw_graph_conv(n.g, &y, x, w16, bb16, &p), "b, ", "is bf16", "the graph is f16");
    ASSERT_OK_CTX(ctx, cw_graph_conv(n.g, &y, x, w16, CW_NODE_NONE, &p));
    ASSERT_OK_CTX(ctx, cw_graph_group_norm(n.g, &z, y, g32, g32, 4, 1e-5f));
    ASSERT_OK_CTX(ctx, cw_graph_output(n.g, z, "z"));
    ASSERT_EQ_I(n.g->dtype, CW_F16);
    /* cw_plan_run: a tensor of another dtype is refused naming both */
    cw_plan *pl = compile_fixed(ctx, n.g, 2, 2);
    cw_tensor *tx, *ty;
    ASSERT_OK_CTX(ctx, cw_tensor_create(&tx, ctx, &d32));
    ASSERT_OK_CTX(ctx, cw_tensor_create(&ty, ctx, &d16));
    cw_status st = cw_plan_run(pl, &tx, 1, &ty, 1);
    CHECK(st == CW_ERR_INVALID_ARG && strstr(cw_context_get_last_error(ctx), "is f32 [1, 8, 8, 8], the plan expects f16"));
    g_cases++;
    cw_tensor_destroy(tx), cw_tensor_destroy(ty);
    cw_plan_destroy(pl);
    free_net(&n);

    /* no input: the first operand that is used fixes the dtype */
    memset(&n, 0, sizeof n);
    n.ctx = ctx;
    ASSERT_OK_CTX(ctx, cw_graph_create(&n.g, ctx));
    cw_node c16 = cst(&n, CW_BF16, 4, xd, 1, 0);
    w32 = cst(&n, CW_F32, 4, wd, 0.1f, 0);
    REFUSED(n.g, cw_graph_conv(n.g, &y, c16, w32, CW_NODE_NONE, &p), "w, ", "is f32 but constant 'c' (node 0) is bf16");
    CHECK(n.g->dtype_node < 0); /* a refused call fixes nothing */
    ASSERT_OK_CTX(ctx, cw_graph_silu(n.g, &z, c16));
    ASSERT_EQ_I(n.g->dtype, CW_BF16);
    REFUSED(n.g, cw_graph_silu(n.g, &z, w32), "x, ", "is f32 but the graph is bf16", "constant 'c' (node 0)");
    free_net(&n);
    fprintf(stderr, "mixed graphs: %d refusals name the node and both dtypes\n", g_cases);
}

/* A half graph without the test's hooks: compiles (and runs) where the cpu backend has half
 * kernels; else the backend's CW_ERR_UNSUPPORTED, naming the dtype, at compile (conv_algos).
 * Without convs, a half graph compiles on any backend; its run is then refused or correct. */
static void test_real_backend(cw_context *ctx) {
    use_table(ctx, g_real);
    net n;
    build_net(&n, ctx, CW_F16, 0);
    cw_plan *p = NULL;
    cw_status st = cw_graph_compile(n.g, &p, NULL);
    CHECK(st == CW_OK || (st == CW_ERR_UNSUPPORTED && strstr(cw_context_get_last_error(ctx), "f16")));
    fprintf(stderr, "f16 graph on the cpu backend's own hooks: compile %s (%s)\n", cw_status_name(st),
            st == CW_OK ? "" : cw_context_get_last_error(ctx));
    cw_plan_destroy(p);
    free_net(&n);
    /* no conv: GroupNorm + SiLU + add in bf16 */
    memset(&n, 0, sizeof n);
    n.ctx = ctx;
    n.r.s = 3;
    ASSERT_OK_CTX(ctx, cw_graph_create(&n.g, ctx));
    int64_t xd[4] = {1, 8, 16, 16}, c8[1] = {8};
    cw_tensor_desc d;
    ASSERT_OK(cw_tensor_desc_make(&d, CW_BF16, 4, xd));
    cw_node x, y, z, g;
    ASSERT_OK_CTX(ctx, cw_graph_input(n.g, &x, "x", &d));
    g = cst(&n, CW_F32, 1, c8, 0.1f, 1);
    ASSERT_OK_CTX(ctx, cw_graph_group_norm(n.g, &y, x, g, g, 4, 1e-5f));
    ASSERT_OK_CTX(ctx, cw_graph_silu(n.g, &z, y));
    ASSERT_OK_CTX(ctx, cw_graph_add(n.g, &y, z, x));
    ASSERT_OK_CTX(ctx, cw_graph_output(n.g, y, "y"));
    ASSERT_OK_CTX(ctx, cw_graph_compile(n.g, &p, NULL));
    cw_tensor *tx, *ty;
    ASSERT_OK_CTX(ctx, cw_tensor_create(&tx, ctx, &d));
    ASSERT_OK_CTX(ctx, cw_tensor_create(&ty, ctx, &d));
    uint16_t *h = calloc((size_t)cw_tensor_desc_numel(&d), 2);
    ASSERT_OK_CTX(ctx, cw_tensor_upload(tx, h, (size_t)cw_tensor_desc_numel(&d) * 2));
    st = cw_plan_run(p, &tx, 1, &ty, 1);
    CHECK(st == CW_OK || st == CW_ERR_UNSUPPORTED);
    fprintf(stderr, "bf16 GroupNorm + SiLU + add on cpu: run %s (%s)\n", cw_status_name(st),
            st == CW_OK ? "" : cw_context_get_last_error(ctx));
    free(h);
    cw_tensor_destroy(tx), cw_tensor_destroy(ty);
    cw_plan_destroy(p);
    free_net(&n);
    use_table(ctx, &g_shim);
}

/* ---- 7. the planner's sizing ------------------------------------------------------------ */

static void test_planner(cw_context *ctx) {
    const cw_dtype dts[3] = {CW_F32, CW_F16, CW_BF16};
    int64_t xd[4] = {1, 16, 64, 64}, wd[4] = {16, 16, 3, 3}, mins[3];
    cw_conv_params p = CW_CONV_PARAMS_INIT;
    p.pad_pre[0] = p.pad_pre[1] = p.pad_post[0] = p.pad_post[1] = 1;
    cw__conv_problem full[3];
    for (int k = 0; k < 3; k++) {
        cw_tensor_desc x, w;
        ASSERT_OK(cw_tensor_desc_make(&x, dts[k], 4, xd));
        ASSERT_OK(cw_tensor_desc_make(&w, dts[k], 4, wd));
        cw__conv_problem_init(&full[k], &x, &w, 1, &x, &p);
        cw__conv_share sh = {.avail = 1, .heavy = 2, .n_pbufs = 4, .prep = 1, .p_min = 1, .ybuf = 1};
        cw__conv_plan cp;
        ASSERT_STATUS(cw__planner_plan(ctx->be, &full[k], &sh, &cp, &mins[k]), CW_ERR_BUDGET);
        cw__conv_plan_free(&cp);
    }
    /* one output row per band: 3 input rows (16 x 3 x 64 elements) in each of 4 prep buffers
     * and 1 row in each of 4 band buffers, no workspace */
    ASSERT_EQ_I(mins[0], 4 * (16 * 3 * 64 + 16 * 64) * 4);
    ASSERT_EQ_I(2 * mins[1], mins[0]);
    ASSERT_EQ_I(2 * mins[2], mins[0]);
    cw__conv_share sh = {.avail = mins[1], .heavy = 2, .n_pbufs = 4, .prep = 1, .p_min = 1, .ybuf = 1};
    cw__conv_plan cp;
    ASSERT_STATUS(cw__planner_plan(ctx->be, &full[0], &sh, &cp, NULL), CW_ERR_BUDGET);
    cw__conv_plan_free(&cp);
    ASSERT_OK(cw__planner_plan(ctx->be, &full[1], &sh, &cp, NULL));
    cw__conv_plan_free(&cp);
    fprintf(stderr, "planner: least budget %lld B in f32, %lld B in f16 and bf16\n", (long long)mins[0],
            (long long)mins[1]);
}

int main(void) {
    cw_context_config cfg = CW_CONTEXT_CONFIG_INIT;
    cfg.backend = CW_BACKEND_CPU;
    cfg.flags = CW_FLAG_POISON;
    cfg.log_level = CW_LOG_ERROR;
    cw_context *ctx;
    ASSERT_OK(cw_context_create(&ctx, &cfg));
    g_real = ctx->be->ops;
    g_shim = *g_real;
    g_shim.conv_algos = shim_conv_algos;
    if (g_real->conv_prepare) g_shim.conv_prepare = shim_conv_prepare;
    cw__ops_i rec_i = g_shim;
    rec_i.conv_forward = rec_conv, rec_i.prep = rec_prep, rec_i.add = rec_add, rec_i.gn_stats = rec_stats;
    rec_i.gn_finalize = rec_fin, rec_i.op = rec_gop, rec_i.gemm = rec_gemm, rec_i.softmax_rows = rec_softmax;
    use_table(ctx, &g_shim);
    test_mixed(ctx);
    test_planner(ctx);
    test_small(ctx, &rec_i);
    test_sd_decoder(ctx);
    test_real_backend(ctx);
    use_table(ctx, g_real);
    test_attention_chunks(ctx, CW_F16);
    test_attention_chunks(ctx, CW_BF16);
    cw_context_destroy(ctx);
    TEST_DONE();
}
