/* Lowering one attention node: per sample, K and V staged (in f32 for half graphs), then
 * query chunks sized to the budget, each a heavy task computing scores, softmax and the
 * output rows of its chunk. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "scheduler/lower.h"
#include "scheduler/planner.h"

/* Sample n of buffer b whose dims are d (all rows): the [1, C, ...] operand of an attention. */
static cw__vref cw__sample(int b, const cw_tensor_desc *d, int64_t n) {
    cw__vref r = cw__whole(b, d);
    r.start[0] = n;
    r.dims[0] = 1;
    return r;
}

/* A dtype conversion of one sample between an activation and an f32 staging buffer: a prep
 * task with no normalisation, activation or upsampling (its src and dst dtypes differ). */
static cw_status cw__emit_convert(cw__lower *L, int node, cw__vref src, cw__vref dst, const char *what, int64_t n,
                                  int *id) {
    cw__task *t = NULL;
    CW_TRY(cw__new_task(L, CW__T_PREP, CW_STAGE_PREP, L->light, node, &t, id));
    t->u.prep.src = src;
    t->u.prep.dst = dst;
    t->u.prep.ss_buf = -1;
    t->u.prep.up = 1;
    int64_t e = 1;
    for (int k = 0; k < dst.rank; k++) e *= dst.dims[k];
    t->flops = (double)e;
    CW_TRY(cw__task_set_name(L->p, t, "attention L%d n%" PRId64 " %s", node, n, what));
    return CW_OK;
}

/* Query tokens per attention chunk (*tc, of T): as many as leave each heavy stream its f32
 * scores (T * 4 bytes per query token) and, in a half graph, its f32 q and output chunks
 * (8 * C bytes per token) inside the sizing budget beside `kv` bytes of whole f32 k and v,
 * balanced over the chunks; all T without a budget. Chunks are multiples of `unit` tokens
 * (whole rows of the view in a half graph, so they convert as views). Where not even one
 * unit fits the sizing budget, the smallest chunk, and the dry run decides (the budget
 * search retries at smaller sizing budgets, which shrink the convs' share too); where it
 * cannot fit the plan's budget either, CW_ERR_BUDGET naming what it needs. */
static cw_status cw__attn_chunk(const cw__lower *L, int64_t T, int64_t C, int64_t unit, int64_t kv, int64_t *tc) {
    *tc = T;
    if (L->none || L->budget < 0) return CW_OK;
    const int64_t per = L->heavy * (T * 4 + (kv > 0 ? 8 * C : 0)) + 4096; /* bytes per chunk token */
    int64_t c = (L->budget - CW__SMALL_RESERVE(L->budget) - kv) / per / unit * unit;
    const int64_t cap = L->p->budget; /* >= L->budget >= 0 here */
    if (c < unit && kv + unit * per > cap - CW__SMALL_RESERVE(cap)) {
        if (kv > 0)
            return cw__error(L->g->ctx, CW_ERR_BUDGET, "compile: attention over %" PRId64 " tokens needs at least %"
                             PRId64 " bytes per heavy stream for a chunk of %" PRId64 " tokens (f32 scores, q and "
                             "output) beside %" PRId64 " bytes of f32 k and v; budget %" PRId64, T, unit * per, unit,
                             kv, cap);
        return cw__error(L->g->ctx, CW_ERR_BUDGET, "compile: attention over %" PRId64 " tokens needs at least %" PRId64
                         " bytes of score buffer per heavy stream; budget %" PRId64, T, T * 4, cap);
    }
    if (c < unit) c = unit;
    if (c > T) c = T;
    const int64_t nch = (T + c - 1) / c; /* balanced chunks of whole units */
    *tc = ((T + nch - 1) / nch + unit - 1) / unit * unit;
    return CW_OK;
}

/* The attention's operands for one sample b: q, k, v and o views of the graph's buffers
 * (f32 graph), or, in a half graph, k and v converted whole into f32 staging buffers kv[0..1]
 * (tasks cv[0..1]; q and o are staged per chunk). */
static cw_status cw__attn_stage_kv(cw__lower *L, int i, int64_t b, const cw_tensor_desc *sd, int half,
                                   cw__vref opnd[4], int kv[2], int cv[2]) {
    const cw_graph *g = L->g;
    const cw__node *n = &g->nodes[i];
    for (int a = 0; a < 3; a++) opnd[a] = cw__sample(L->nd[n->in[a]].buf, &g->nodes[n->in[a]].desc, b);
    opnd[3] = cw__sample(L->nd[i].buf, &n->desc, b);
    static const char *const what[2] = {"k to f32", "v to f32"};
    for (int a = 0; half && a < 2; a++) {
        const int x = n->in[1 + a];
        CW_TRY(cw__temp(L, cw__desc_bytes(sd), sd, &kv[a]));
        CW_TRY(cw__emit_convert(L, i, opnd[1 + a], cw__whole(kv[a], sd), what[a], b, &cv[a]));
        CW_TRY(cw__dep_rows(L, cv[a], x, 0, cw__node_rows(g, x)));
        opnd[1 + a] = cw__whole(kv[a], sd);
    }
    return CW_OK;
}

/* One query chunk [t0, t1) of sample b on the next heavy stream, its scores in sb. In a half
 * graph its q rows are converted into the f32 buffer qb first and its output, written into
 * the f32 buffer ob, converted back into the graph's rows after it (*out_task: the task
 * that writes the graph's output; cv: the k and v conversions). */
static cw_status cw__attn_chunk_tasks(cw__lower *L, int i, int64_t b, int64_t t0, int64_t t1, int64_t unit, int half,
                                      const cw__vref opnd[4], const int cv[2], int sb, int qb, int ob, int *out_task) {
    const cw_graph *g = L->g;
    const cw__node *n = &g->nodes[i];
    const cw_tensor_desc *d = &n->desc;
    const int64_t T = cw__desc_numel(d) / (d->dims[0] * d->dims[1]), h = d->dims[cw__hdim(d)];
    cw__vref q = opnd[0], o = opnd[3];
    int cq = -1;
    if (half) { /* the chunk's rows (dim 2) of q and o, and their f32 copies */
        q.start[2] = o.start[2] = t0 / unit;
        q.dims[2] = o.dims[2] = (t1 - t0) / unit;
        CW_TRY(cw__emit_convert(L, i, q, cw__whole(qb, &L->p->bufs[qb].d), "q to f32", b, &cq));
        CW_TRY(cw__dep_rows(L, cq, n->in[0], 0, cw__node_rows(g, n->in[0])));
    }
    cw__task *t = NULL;
    int id = -1;
    CW_TRY(cw__new_task(L, CW__T_ATTN, CW_STAGE_ATTENTION, cw__next_heavy(L), i, &t, &id));
    t->u.attn.q = half ? cw__whole(qb, &L->p->bufs[qb].d) : opnd[0];
    t->u.attn.k = opnd[1], t->u.attn.v = opnd[2];
    t->u.attn.o = half ? cw__whole(ob, &L->p->bufs[ob].d) : opnd[3];
    t->u.attn.n = b, t->u.attn.t0 = t0, t->u.attn.t1 = t1, t->u.attn.T = T, t->u.attn.C = d->dims[1];
    t->u.attn.s_buf = sb;
    t->u.attn.scale = n->scale;
    t->u.attn.block = n->block;
    t->u.attn.mask = n->mask;
    double keys = 0.0; /* score entries computed */
    for (int64_t r = t0, k0, k1, e; r < t1; r = e < t1 ? e : t1) {
        cw__attn_keys(n->block, n->mask, T, r, &k0, &k1, &e);
        keys += (double)((e < t1 ? e : t1) - r) * (double)(k1 - k0);
    }
    t->flops = 4.0 * keys * (double)d->dims[1];
    CW_TRY(cw__task_set_name(L->p, t, "attention L%d n%" PRId64 " tokens %" PRId64 "-%" PRId64, i, b, t0, t1));
    if (half) {
        CW_TRY(cw__dep(L, id, cq));
        CW_TRY(cw__dep(L, id, cv[0]));
        CW_TRY(cw__dep(L, id, cv[1]));
        int oc = -1;
        CW_TRY(cw__emit_convert(L, i, cw__whole(ob, &L->p->bufs[ob].d), o, "output from f32", b, &oc));
        CW_TRY(cw__dep(L, oc, id));
        *out_task = oc;
        return cw__writer(L, i, oc, d->rank == 4 ? o.start[2] : 0, d->rank == 4 ? o.start[2] + o.dims[2] : h);
    }
    for (int a = 0; a < 3; a++)
        CW_TRY(cw__dep_rows(L, id, n->in[a], 0, cw__node_rows(g, n->in[a])));
    const int64_t W = d->dims[d->rank - 1];
    const int64_t r0 = d->rank == 4 ? t0 / W : 0, r1 = d->rank == 4 ? (t1 - 1) / W + 1 : h;
    *out_task = id;
    return cw__writer(L, i, id, r0, r1 > h ? h : r1);
}

/* Attention in query chunks: S = scale * Q^T K (f32 scores, a budgeted temporary per
 * chunk), row softmax, O = V S^T, both GEMMs in f32. In an f16/bf16 graph each sample's k
 * and v are converted whole into f32 staging buffers (8 * C * T bytes), and each chunk's q
 * rows and output rows through f32 buffers of the chunk's size (the GEMM hook takes f32).
 * Each heavy stream keeps one chunk's buffers in flight. */
cw_status cw__lower_attention(cw__lower *L, int i) {
    cw_graph *g = L->g;
    const cw_tensor_desc *d = &g->nodes[i].desc;
    int64_t N = d->dims[0], C = d->dims[1], T = 1;
    for (int k = 2; k < d->rank; k++) T *= d->dims[k];
    const int half = d->dtype != CW_F32;
    const int64_t unit = half ? T / d->dims[2] : 1; /* tokens per index of dim 2 */
    cw_tensor_desc sd = *d; /* one sample in f32: k's and v's staging */
    sd.dims[0] = 1;
    sd.dtype = CW_F32;
    memset(sd.strides, 0, sizeof sd.strides);
    cw__desc_fill_strides(&sd);
    int64_t tc = T;
    CW_TRY(cw__attn_chunk(L, T, C, unit, half ? 2 * cw__alloc_round(cw__desc_bytes(&sd)) : 0, &tc));
    const int per = (int)((T + tc - 1) / tc), H = L->heavy;
    int *sb = cw__malloc((size_t)per * (size_t)N * 3 * sizeof *sb); /* per chunk: scores, q, output */
    if (!sb) return cw__oom(L);
    cw_status st = CW_OK;
    int c = 0;
    for (int64_t b = 0; b < N && st == CW_OK; b++) {
        int kv[2] = {-1, -1}, cv[2] = {-1, -1};
        cw__vref opnd[4];
        st = cw__attn_stage_kv(L, i, b, &sd, half, opnd, kv, cv);
        for (int64_t t0 = 0; t0 < T && st == CW_OK; t0 += tc, c++) {
            const int64_t t1 = t0 + tc < T ? t0 + tc : T;
            int *bufs = &sb[3 * c], last = -1;
            bufs[0] = bufs[1] = bufs[2] = -1;
            cw_tensor_desc cd = sd; /* the chunk's q or output rows in f32 */
            cd.dims[2] = (t1 - t0) / unit;
            memset(cd.strides, 0, sizeof cd.strides);
            cw__desc_fill_strides(&cd);
            st = cw__temp(L, (t1 - t0) * T * 4, NULL, &bufs[0]); /* f32 scores */
            if (st == CW_OK && half) st = cw__temp(L, cw__desc_bytes(&cd), &cd, &bufs[1]);
            if (st == CW_OK && half) st = cw__temp(L, cw__desc_bytes(&cd), &cd, &bufs[2]);
            if (st == CW_OK)
                st = cw__attn_chunk_tasks(L, i, b, t0, t1, unit, half, opnd, cv, bufs[0], bufs[1], bufs[2], &last);
            for (int k = 0; k < 3 && st == CW_OK && c - H + 1 >= 0; k++) st = cw__release(L, sb[3 * (c - H + 1) + k]);
        }
        for (int a = 0; a < 2 && st == CW_OK; a++) st = cw__release(L, kv[a]);
    }
    for (int k = 3 * (c - H + 1 < 0 ? 0 : c - H + 1); k < 3 * c && st == CW_OK; k++) st = cw__release(L, sb[k]);
    cw__free(sb);
    return st;
}
