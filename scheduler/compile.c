/* Lowering a graph into a plan: GroupNorm/SiLU/upsample chains fuse into each conv
 * patch's prep task, residual adds into the conv's epilogue, GroupNorm statistics are
 * taken per finished output band and merged in band order. Heavy tasks (conv patches,
 * attention chunks) go round-robin onto heavy streams, light ones onto the light stream;
 * the host-ordered action list (alloc / task / free) is what cw_plan_run replays and what
 * the compile-time dry run simulates against the budget. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "scheduler/patch.h"
#include "scheduler/sched.h"

/* Headroom for the small temporaries (GroupNorm partials and scale/shift) and allocator
 * rounding when sizing patches: 1/8 of the budget; the dry run is the real check. */
#define CW__SMALL_RESERVE(b) ((b) / 8)

typedef struct cw__wr {
    int task;
    int64_t r0, r1;
} cw__wr;

typedef struct cw__lower {
    cw_plan *p;
    cw_graph *g;
    int64_t budget;     /* for sizing; < 0 unlimited */
    int heavy, light;   /* heavy stream count, light stream index */
    int threads;        /* per task: the backend's threads / heavy streams (0: n/a) */
    int rr;             /* round-robin heavy stream */
    int fuse, none;
    int *buf;           /* per node: buffer of its result, -1 fused */
    int *fused;         /* per node: 1 if absorbed into consumers' prep */
    char *live;         /* per node: 1 if an output depends on it */
    int *epi;           /* per ADD node: the conv fused into it, -1 */
    int *epi_into;      /* per CONV node: the ADD it writes into, -1 */
    int *reads;         /* per node: lowering units still to read it */
    int *gn_refs;       /* per GN node: units still to use its scale/shift */
    int *gn_part, *gn_ss, *gn_fin, *gn_nparts; /* per GN node */
    int *gn_stats_first; /* per GN node: first stats task index, -1 */
    cw__wr **wr;
    int *n_wr, *cap_wr;
} cw__lower;

/* ---- growable arrays ---------------------------------------------------------------- */
static cw_status cw__grow(void **arr, int *cap, int need, size_t elem) {
    if (need <= *cap) return CW_OK;
    int nc = *cap ? *cap * 2 : 64;
    while (nc < need) nc *= 2;
    void *na = cw__realloc(*arr, (size_t)nc * elem);
    if (!na) return CW_ERR_OUT_OF_MEMORY;
    memset((char *)na + (size_t)*cap * elem, 0, (size_t)(nc - *cap) * elem);
    *arr = na;
    *cap = nc;
    return CW_OK;
}

#define CW__TRY(x)                          \
    do {                                    \
        cw_status cw_st_ = (x);             \
        if (cw_st_ != CW_OK) return cw_st_; \
    } while (0)

static cw_status cw__oom(cw__lower *L) { return cw__error(L->g->ctx, CW_ERR_OUT_OF_MEMORY, "compile: out of host memory"); }

static cw_status cw__new_buf(cw__lower *L, cw__bkind kind, int ext, const cw_tensor_desc *d, int64_t bytes, int *out) {
    cw_plan *p = L->p;
    if (cw__grow((void **)&p->bufs, &p->cap_bufs, p->n_bufs + 1, sizeof *p->bufs) != CW_OK) return cw__oom(L);
    cw__buf *b = &p->bufs[p->n_bufs];
    b->kind = kind;
    b->ext = ext;
    if (d) b->d = *d;
    b->bytes = bytes;
    *out = p->n_bufs++;
    return CW_OK;
}

static cw_status cw__act(cw__lower *L, cw__akind kind, int id, int stream) {
    cw_plan *p = L->p;
    if (cw__grow((void **)&p->acts, &p->cap_acts, p->n_acts + 1, sizeof *p->acts) != CW_OK) return cw__oom(L);
    cw__action *a = &p->acts[p->n_acts++];
    a->kind = kind;
    a->id = id;
    a->stream = stream;
    a->event = -1;
    return CW_OK;
}

/* A temporary of `bytes` (allocated now in host order). */
static cw_status cw__temp(cw__lower *L, int64_t bytes, const cw_tensor_desc *d, int *out) {
    CW__TRY(cw__new_buf(L, CW__B_TEMP, -1, d, bytes, out));
    return cw__act(L, CW__A_ALLOC, *out, 0);
}

static cw_status cw__release(cw__lower *L, int buf) {
    if (buf < 0) return CW_OK;
    return cw__act(L, CW__A_FREE, buf, 0);
}

static cw_status cw__new_task(cw__lower *L, cw__tkind kind, int stage, int stream, int node, cw__task **out, int *id) {
    cw_plan *p = L->p;
    if (cw__grow((void **)&p->tasks, &p->cap_tasks, p->n_tasks + 1, sizeof *p->tasks) != CW_OK) return cw__oom(L);
    cw__task *t = &p->tasks[p->n_tasks];
    memset(t, 0, sizeof *t);
    t->kind = kind;
    t->stage = stage;
    t->stream = stream;
    t->node = node;
    t->threads = L->threads;
    t->event = -1;
    *id = p->n_tasks++;
    *out = t;
    return cw__act(L, CW__A_TASK, *id, stream);
}

static cw_status cw__dep(cw__lower *L, int task, int dep) {
    if (dep < 0) return CW_OK;
    cw__task *t = &L->p->tasks[task];
    for (int i = 0; i < t->n_deps; i++)
        if (t->deps[i] == dep) return CW_OK;
    int *nd = cw__realloc(t->deps, (size_t)(t->n_deps + 1) * sizeof *nd);
    if (!nd) return cw__oom(L);
    t->deps = nd;
    t->deps[t->n_deps++] = dep;
    return CW_OK;
}

/* Depends on every writer of node n's rows [r0, r1). */
static cw_status cw__dep_rows(cw__lower *L, int task, int n, int64_t r0, int64_t r1) {
    for (int i = 0; i < L->n_wr[n]; i++) {
        const cw__wr *w = &L->wr[n][i];
        if (w->r0 < r1 && r0 < w->r1) CW__TRY(cw__dep(L, task, w->task));
    }
    return CW_OK;
}

static cw_status cw__writer(cw__lower *L, int n, int task, int64_t r0, int64_t r1) {
    if (cw__grow((void **)&L->wr[n], &L->cap_wr[n], L->n_wr[n] + 1, sizeof(cw__wr)) != CW_OK) return cw__oom(L);
    L->wr[n][L->n_wr[n]++] = (cw__wr){task, r0, r1};
    return CW_OK;
}

/* H of an activation (rank 4/5); 0 for the 1-D constants (biases, GroupNorm gamma/beta). */
static int cw__hdim(const cw_tensor_desc *d) { return d->rank >= 3 ? d->rank - 2 : 0; }

/* View of rows [r0, r1) (along H) of buffer b whose dims are d. */
static cw__vref cw__rows(int b, const cw_tensor_desc *d, int64_t r0, int64_t r1) {
    cw__vref v;
    memset(&v, 0, sizeof v);
    v.buf = b;
    v.rank = d->rank;
    for (int i = 0; i < d->rank; i++) v.dims[i] = d->dims[i];
    v.start[cw__hdim(d)] = r0;
    v.dims[cw__hdim(d)] = r1 - r0;
    return v;
}

static cw__vref cw__whole(int b, const cw_tensor_desc *d) { return cw__rows(b, d, 0, d->dims[cw__hdim(d)]); }

static int cw__next_heavy(cw__lower *L) {
    int s = L->rr;
    L->rr = (L->rr + 1) % L->heavy;
    return s;
}

/* ---- GroupNorm statistics -------------------------------------------------------------- */
static int64_t cw__gn_part_bytes(const cw__node *gn, int64_t parts) {
    return parts * gn->desc.dims[0] * gn->groups * 3 * (int64_t)sizeof(double);
}

/* Emits per-band stats for every GN consuming node n, for the band written by `task`. */
static cw_status cw__gn_band_stats(cw__lower *L, int n, int task, int64_t r0, int64_t r1, int part) {
    cw_graph *g = L->g;
    for (int k = n + 1; k < g->n; k++) {
        const cw__node *gn = &g->nodes[k];
        if (gn->kind != CW__N_GN || gn->in[0] != n || !L->live[k] || L->gn_part[k] < 0 || L->gn_fin[k] >= 0) continue;
        cw__task *t = NULL;
        int id = -1;
        CW__TRY(cw__new_task(L, CW__T_STATS, CW_STAGE_STATS, L->light, k, &t, &id));
        t->u.stats.x = cw__rows(L->buf[n], &g->nodes[n].desc, r0, r1);
        t->u.stats.groups = gn->groups;
        t->u.stats.part_buf = L->gn_part[k];
        t->u.stats.part_index = part;
        snprintf(t->name, sizeof t->name, "gn stats L%d rows %" PRId64 "-%" PRId64, k, r0, r1);
        if (L->gn_stats_first[k] < 0) L->gn_stats_first[k] = id;
        CW__TRY(cw__dep(L, id, task));
    }
    return CW_OK;
}

/* Before a producer of node n emits `parts` bands: partial buffers for its GN consumers. */
static cw_status cw__gn_begin(cw__lower *L, int n, int parts) {
    cw_graph *g = L->g;
    for (int k = n + 1; k < g->n; k++) {
        const cw__node *gn = &g->nodes[k];
        if (gn->kind != CW__N_GN || gn->in[0] != n || !L->live[k] || L->gn_fin[k] >= 0 || L->gn_part[k] >= 0) continue;
        CW__TRY(cw__temp(L, cw__gn_part_bytes(gn, parts), NULL, &L->gn_part[k]));
        L->gn_nparts[k] = parts;
    }
    return CW_OK;
}

static cw_status cw__gn_finalize(cw__lower *L, int k) {
    cw_graph *g = L->g;
    const cw__node *gn = &g->nodes[k];
    int64_t n = gn->desc.dims[0], c = gn->desc.dims[1];
    CW__TRY(cw__temp(L, 2 * n * c * (int64_t)sizeof(float), NULL, &L->gn_ss[k]));
    cw__task *t = NULL;
    int id = -1;
    CW__TRY(cw__new_task(L, CW__T_FINALIZE, CW_STAGE_STATS, L->light, k, &t, &id));
    t->u.fin.part_buf = L->gn_part[k];
    t->u.fin.n_parts = L->gn_nparts[k];
    t->u.fin.n = n;
    t->u.fin.c = c;
    t->u.fin.groups = gn->groups;
    t->u.fin.gamma = cw__whole(L->buf[gn->in[1]], &g->nodes[gn->in[1]].desc);
    t->u.fin.beta = cw__whole(L->buf[gn->in[2]], &g->nodes[gn->in[2]].desc);
    t->u.fin.gamma.rank = t->u.fin.beta.rank = 1;
    t->u.fin.gamma.start[0] = t->u.fin.beta.start[0] = 0;
    t->u.fin.gamma.dims[0] = t->u.fin.beta.dims[0] = c;
    t->u.fin.eps = gn->eps;
    t->u.fin.ss_buf = L->gn_ss[k];
    snprintf(t->name, sizeof t->name, "gn finalize L%d", k);
    for (int i = L->gn_stats_first[k]; i >= 0 && i < id; i++)
        if (L->p->tasks[i].kind == CW__T_STATS && L->p->tasks[i].node == k) CW__TRY(cw__dep(L, id, i));
    L->gn_fin[k] = id;
    return cw__release(L, L->gn_part[k]);
}

/* Makes GN node k's scale/shift available: finalize (after stats of every band). If the
 * producer did not emit band stats (inputs, unbanded producers), one whole-tensor stats
 * task first. */
static cw_status cw__gn_ready(cw__lower *L, int k) {
    if (L->gn_fin[k] >= 0) return CW_OK;
    cw_graph *g = L->g;
    int x = g->nodes[k].in[0];
    if (L->gn_part[k] < 0) {
        CW__TRY(cw__temp(L, cw__gn_part_bytes(&g->nodes[k], 1), NULL, &L->gn_part[k]));
        L->gn_nparts[k] = 1;
        cw__task *t = NULL;
        int id = -1;
        CW__TRY(cw__new_task(L, CW__T_STATS, CW_STAGE_STATS, L->light, k, &t, &id));
        const cw_tensor_desc *d = &g->nodes[x].desc;
        t->u.stats.x = cw__whole(L->buf[x], d);
        t->u.stats.groups = g->nodes[k].groups;
        t->u.stats.part_buf = L->gn_part[k];
        t->u.stats.part_index = 0;
        snprintf(t->name, sizeof t->name, "gn stats L%d", k);
        L->gn_stats_first[k] = id;
        CW__TRY(cw__dep_rows(L, id, x, 0, d->dims[cw__hdim(d)]));
    }
    return cw__gn_finalize(L, k);
}

/* ---- fusion analysis ------------------------------------------------------------------ */
static int cw__chain_rank(cw__nkind k) { return k == CW__N_GN ? 0 : k == CW__N_SILU ? 1 : k == CW__N_UP2 ? 2 : 3; }

static void cw__analyse(cw__lower *L) {
    cw_graph *g = L->g;
    for (int i = 0; i < g->n; i++) L->epi[i] = L->epi_into[i] = -1;
    if (!L->fuse) return;
    for (int i = g->n - 1; i >= 0; i--) {
        const cw__node *n = &g->nodes[i];
        if ((n->kind != CW__N_GN && n->kind != CW__N_SILU && n->kind != CW__N_UP2) || n->is_output || !L->live[i])
            continue;
        int ok = 1;
        for (int j = i + 1; j < g->n && ok; j++) {
            const cw__node *c = &g->nodes[j];
            if (!L->live[j]) continue;
            for (int a = 0; a < 4; a++) {
                if (c->in[a] != i) continue;
                if (c->kind == CW__N_CONV && a == 0) continue;
                if (L->fused[j] && a == 0 && cw__chain_rank(c->kind) > cw__chain_rank(n->kind)) continue;
                ok = 0;
            }
        }
        L->fused[i] = ok;
    }
    /* Residual epilogue: add(a, b) where one operand is a conv used only here. */
    for (int i = 0; i < g->n; i++) {
        const cw__node *n = &g->nodes[i];
        if (n->kind != CW__N_ADD || n->in[0] == n->in[1]) continue;
        for (int a = 1; a >= 0; a--) {
            int c = n->in[a];
            const cw__node *cn = &g->nodes[c];
            if (cn->kind == CW__N_CONV && cn->n_uses == 1 && !cn->is_output && L->epi_into[c] < 0 && L->live[i]) {
                L->epi[i] = c;
                L->epi_into[c] = i;
                break;
            }
        }
    }
}

/* Follows a conv's x through fused nodes: src (materialized), gn node, silu, up. */
static void cw__chain(cw__lower *L, int x, int *src, int *gn, int *silu, int *up) {
    const cw_graph *g = L->g;
    *gn = -1, *silu = 0, *up = 1;
    while (L->fused[x]) {
        const cw__node *n = &g->nodes[x];
        if (n->kind == CW__N_UP2) *up = 2;
        else if (n->kind == CW__N_SILU) *silu = 1;
        else if (n->kind == CW__N_GN) *gn = x;
        x = n->in[0];
    }
    *src = x;
}

/* Materialized nodes a lowering unit reads (for freeing after the last reader). */
static int cw__unit_reads(cw__lower *L, int i, int *out, int *gns) {
    const cw__node *n = &L->g->nodes[i];
    int k = 0, ng = 0;
    if (n->kind == CW__N_CONV) {
        int src, gn, silu, up;
        cw__chain(L, n->in[0], &src, &gn, &silu, &up);
        out[k++] = src;
        if (gn >= 0) gns[ng++] = gn;
        if (L->epi_into[i] >= 0) {
            const cw__node *a = &L->g->nodes[L->epi_into[i]];
            int other = a->in[0] == i ? a->in[1] : a->in[0];
            if (other != src) out[k++] = other;
        }
    } else if (n->kind == CW__N_ADD) {
        if (L->epi[i] >= 0) return -1; /* part of its conv's unit */
        out[k++] = n->in[0];
        if (n->in[1] != n->in[0]) out[k++] = n->in[1];
    } else if (n->kind == CW__N_GN || n->kind == CW__N_SILU || n->kind == CW__N_UP2) {
        if (L->fused[i]) return -1;
        out[k++] = n->in[0];
        if (n->kind == CW__N_GN) gns[ng++] = i;
    } else if (n->kind == CW__N_ATTN) {
        for (int a = 0; a < 3; a++) {
            int dup = 0;
            for (int b = 0; b < k; b++) dup |= out[b] == n->in[a];
            if (!dup) out[k++] = n->in[a];
        }
    } else {
        return -1;
    }
    out[3] = ng ? gns[0] : -1;
    return k;
}

/* ---- conv lowering ------------------------------------------------------------------- */
static cw_status cw__algo_ws(cw__backend *be, const cw__conv_problem *pr, int algo_id, int64_t *ws, cw__conv_algo *out) {
    cw__conv_algo algos[16];
    int n = 0;
    CW__TRY(be->i->conv_algos(be, pr, algos, 16, &n));
    for (int i = 0; i < n; i++)
        if (algos[i].id == algo_id) {
            *ws = algos[i].workspace;
            if (out) *out = algos[i];
            return CW_OK;
        }
    *ws = -1;
    return CW_OK;
}

typedef struct cw__sizing {
    int p;
    cw__conv_algo algo;
    int64_t ws, pbuf;
} cw__sizing;

static int64_t cw__pbuf_bytes(const cw__conv_problem *tall, int prep) {
    if (!prep) return 0;
    int64_t e = 1;
    for (int i = 0; i < tall->x.rank; i++) e *= tall->x.dims[i];
    return e * 4;
}

/* Temp the conv needs in flight with P patches: H workspaces and the patch buffers of the
 * H convs in flight plus H preps ahead (one stream: one of each). */
static int64_t cw__conv_temp(const cw__lower *L, int64_t ws, int64_t pbuf) {
    int64_t nb = L->heavy > 1 || L->light != 0 ? 2 * L->heavy : 1;
    return L->heavy * cw__alloc_round(ws) + nb * cw__alloc_round(pbuf);
}

static cw_status cw__size_conv(cw__lower *L, const cw__conv_problem *full, int prep, int64_t h_out, cw__sizing *out) {
    cw__backend *be = L->g->ctx->be;
    cw__conv_algo algos[16];
    int na = 0;
    CW__TRY(be->i->conv_algos(be, full, algos, 16, &na));
    if (na == 0) return cw__error(L->g->ctx, CW_ERR_UNSUPPORTED, "compile: backend has no algorithm for a conv");
    int p_min = 1;
    if (L->p->opt.max_patch_rows > 0) p_min = (int)((h_out + L->p->opt.max_patch_rows - 1) / L->p->opt.max_patch_rows);
    if (p_min > h_out) p_min = (int)h_out;
    if (L->none || (L->budget < 0 && L->p->opt.policy != CW_PATCHES_FIXED)) {
        out->p = L->none ? 1 : p_min;
        out->algo = algos[0];
        int64_t b[2];
        cw__patch pt;
        cw__patch_bounds(h_out, out->p, b);
        CW__TRY(cw__patch_make(full, 0, b[1], &pt));
        CW__TRY(cw__algo_ws(be, &pt.prob, algos[0].id, &out->ws, &out->algo));
        out->pbuf = cw__pbuf_bytes(&pt.prob, prep);
        return CW_OK;
    }
    int64_t avail = L->budget < 0 ? INT64_MAX : L->budget - CW__SMALL_RESERVE(L->budget);
    int fixed = L->p->opt.policy == CW_PATCHES_FIXED;
    for (int a = 0; a < na; a++) {
        /* smallest P whose tallest patch (ceil(h_out / P) rows, probed in the middle of the
         * output, where no padding clips its input rows) fits: bisection, since workspace
         * and patch buffer shrink as P grows */
        int lo = p_min, hi = (int)h_out, best = -1;
        if (fixed) lo = hi = (int)(L->p->opt.patches < h_out ? (L->p->opt.patches > p_min ? L->p->opt.patches : p_min) : h_out);
        while (lo <= hi) {
            int mid = lo + (hi - lo) / 2;
            int64_t rows = (h_out + mid - 1) / mid;
            cw__patch pt;
            CW__TRY(cw__patch_make(full, h_out / 2 - rows / 2 < 0 ? 0 : h_out / 2 - rows / 2,
                                   h_out / 2 - rows / 2 + rows, &pt));
            int64_t ws;
            CW__TRY(cw__algo_ws(be, &pt.prob, algos[a].id, &ws, NULL));
            int fits = ws >= 0 && cw__conv_temp(L, ws, cw__pbuf_bytes(&pt.prob, prep)) <= avail;
            if (fits) best = mid, hi = mid - 1;
            else lo = mid + 1;
        }
        if (best > 0) {
            out->p = best;
            int64_t rows = (h_out + best - 1) / best, o0 = h_out / 2 - rows / 2;
            cw__patch pt;
            CW__TRY(cw__patch_make(full, o0 < 0 ? 0 : o0, (o0 < 0 ? 0 : o0) + rows, &pt));
            CW__TRY(cw__algo_ws(be, &pt.prob, algos[a].id, &out->ws, &out->algo));
            /* patch_make of a centred band may see fewer rows than the first band's halo;
             * take the max workspace and buffer over first, centre and last bands. */
            int64_t bnd[2];
            for (int e = 0; e < 2; e++) {
                int64_t q0 = e ? h_out - rows : 0;
                cw__patch pe;
                CW__TRY(cw__patch_make(full, q0, q0 + rows, &pe));
                int64_t wse;
                CW__TRY(cw__algo_ws(be, &pe.prob, algos[a].id, &wse, NULL));
                if (wse > out->ws) out->ws = wse;
                bnd[e] = cw__pbuf_bytes(&pe.prob, prep);
            }
            out->pbuf = cw__pbuf_bytes(&pt.prob, prep);
            if (bnd[0] > out->pbuf) out->pbuf = bnd[0];
            if (bnd[1] > out->pbuf) out->pbuf = bnd[1];
            out->algo.workspace = out->ws;
            return CW_OK;
        }
    }
    return cw__error(L->g->ctx, CW_ERR_BUDGET, "compile: no patch count fits a conv into budget %" PRId64 " bytes",
                     L->budget);
}

typedef struct cw__pending {
    int ws, pbuf;
} cw__pending;

static cw_status cw__lower_conv(cw__lower *L, int i) {
    cw_graph *g = L->g;
    cw_plan *p = L->p;
    const cw__node *n = &g->nodes[i];
    int addn = L->epi_into[i];
    int outn = addn >= 0 ? addn : i;
    int src, gn, silu, up;
    cw__chain(L, n->in[0], &src, &gn, &silu, &up);
    int prep = gn >= 0 || silu || up > 1;
    const cw_tensor_desc *xd = &g->nodes[n->in[0]].desc;
    const cw_tensor_desc *wd = &g->nodes[n->in[1]].desc;
    cw__conv_problem full;
    cw__conv_problem_init(&full, xd, wd, n->in[2] >= 0, &n->desc, &n->conv);
    int hd = cw__hdim(&n->desc);
    int64_t h_out = n->desc.dims[hd];
    cw__sizing sz;
    memset(&sz, 0, sizeof sz);
    CW__TRY(cw__size_conv(L, &full, prep, h_out, &sz));
    int P = sz.p;
    int64_t *bounds = cw__malloc((size_t)(P + 1) * sizeof *bounds);
    cw__patch *pts = cw__malloc((size_t)P * sizeof *pts);
    cw__pending *pend = cw__malloc((size_t)P * sizeof *pend);
    int *prep_task = cw__malloc((size_t)P * sizeof *prep_task);
    if (!bounds || !pts || !pend || !prep_task) {
        cw__free(bounds), cw__free(pts), cw__free(pend), cw__free(prep_task);
        return cw__oom(L);
    }
    cw_status st = CW_OK;
    cw__patch_bounds(h_out, P, bounds);
    for (int j = 0; j < P && st == CW_OK; j++) st = cw__patch_make(&full, bounds[j], bounds[j + 1], &pts[j]);
    if (gn >= 0 && st == CW_OK) st = cw__gn_ready(L, gn);
    if (st == CW_OK) st = cw__gn_begin(L, outn, P);
    /* record the conv for cw_plan_describe */
    if (st == CW_OK && cw__grow((void **)&p->convs, &p->cap_convs, p->n_convs + 1, sizeof *p->convs) != CW_OK)
        st = cw__oom(L);
    cw__conv_info *ci = NULL;
    if (st == CW_OK) {
        ci = &p->convs[p->n_convs++];
        memset(ci, 0, sizeof *ci);
        ci->node = i;
        ci->patches = P;
        ci->h_out = h_out;
        ci->fused_prep = prep;
        ci->tasks = cw__malloc((size_t)P * sizeof(int));
        if (!ci->tasks) st = cw__oom(L);
        cw__halo h;
        if (st == CW_OK && cw__patch_halo(&full, bounds, P, prep ? 8.0 : 0.0, &h) == CW_OK) {
            ci->halo_pct = h.halo_pct;
            p->halo_flop += h.prep_flops_extra;
        }
        p->conv_gflop += cw__conv_flops(&full) * 1e-9;
    }
    for (int q = 0; q < P; q++) pend[q].ws = pend[q].pbuf = -1, prep_task[q] = -1;
    int L_ahead = prep ? (L->light != 0 ? L->heavy + 1 : 1) : 0;
    int H = L->heavy;
    int next_prep = 0;
    const cw__node *an = addn >= 0 ? &g->nodes[addn] : NULL;
    int other = an ? (an->in[0] == i ? an->in[1] : an->in[0]) : -1;
    const cw_tensor_desc *sd = &g->nodes[src].desc;
    for (int j = 0; j < P && st == CW_OK; j++) {
        /* preps run ahead of their conv by L_ahead patches (double buffering) */
        while (st == CW_OK && next_prep < P && next_prep < j + L_ahead) {
            int q = next_prep++;
            const cw__patch *pt = &pts[q];
            if (!prep || pt->b <= pt->a) continue;
            cw_tensor_desc bd = pt->prob.x;
            memset(bd.strides, 0, sizeof bd.strides);
            cw__desc_fill_strides(&bd);
            if ((st = cw__temp(L, cw__desc_numel(&bd) * 4, &bd, &pend[q].pbuf)) != CW_OK) break;
            cw__task *t = NULL;
            int id = -1;
            if ((st = cw__new_task(L, CW__T_PREP, CW_STAGE_PREP, L->light, i, &t, &id)) != CW_OK) break;
            int64_t s0 = pt->a / up, s1 = (pt->b - 1) / up + 1;
            t->u.prep.src = cw__rows(L->buf[src], sd, s0, s1);
            t->u.prep.dst = cw__whole(pend[q].pbuf, &bd);
            t->u.prep.ss_buf = gn >= 0 ? L->gn_ss[gn] : -1;
            t->u.prep.silu = silu;
            t->u.prep.up = up;
            t->u.prep.dst_row0 = pt->a;
            t->u.prep.src_row0 = s0;
            t->flops = (double)cw__desc_numel(&bd) * 8.0;
            snprintf(t->name, sizeof t->name, "prep%s%s%s L%d patch %d/%d", gn >= 0 ? " gn" : "", silu ? " silu" : "",
                     up > 1 ? " up2" : "", i, q + 1, P);
            if ((st = cw__dep_rows(L, id, src, s0, s1)) != CW_OK) break;
            if (gn >= 0) st = cw__dep(L, id, L->gn_fin[gn]);
            prep_task[q] = id;
        }
        if (st != CW_OK) break;
        const cw__patch *pt = &pts[j];
        cw__task *t = NULL;
        int id = -1;
        if (sz.ws > 0 && (st = cw__temp(L, sz.ws, NULL, &pend[j].ws)) != CW_OK) break;
        int hs = cw__next_heavy(L);
        if ((st = cw__new_task(L, CW__T_CONV, CW_STAGE_CONV, hs, i, &t, &id)) != CW_OK) break;
        t->u.conv.prob = pt->prob;
        t->u.conv.algo = sz.algo;
        t->u.conv.algo.workspace = sz.ws;
        if (prep && pt->b > pt->a) {
            t->u.conv.x = cw__whole(pend[j].pbuf, &p->bufs[pend[j].pbuf].d);
        } else {
            t->u.conv.x = cw__rows(L->buf[src], xd, pt->a, pt->b > pt->a ? pt->b : pt->a);
            if (prep) t->u.conv.x.buf = L->buf[src]; /* empty patch: no rows are read */
        }
        t->u.conv.w = cw__whole(L->buf[n->in[1]], wd);
        t->u.conv.w.start[wd->rank - 2] = 0;
        t->u.conv.w.dims[wd->rank - 2] = wd->dims[wd->rank - 2];
        t->u.conv.has_b = n->in[2] >= 0;
        if (t->u.conv.has_b) {
            t->u.conv.b.buf = L->buf[n->in[2]];
            t->u.conv.b.rank = 1;
            t->u.conv.b.dims[0] = wd->dims[0];
        }
        t->u.conv.y = cw__rows(L->buf[outn], &n->desc, pt->o0, pt->o1);
        t->u.conv.ws_buf = pend[j].ws;
        t->flops = cw__conv_flops(&pt->prob);
        snprintf(t->name, sizeof t->name, "%s L%d patch %d/%d", n->name, i, j + 1, P);
        ci->tasks[j] = id;
        if (prep_task[j] >= 0) st = cw__dep(L, id, prep_task[j]);
        else if (pt->b > pt->a) st = cw__dep_rows(L, id, src, pt->a, pt->b);
        if (st != CW_OK) break;
        int last = id;
        if (an) {
            cw__task *e = NULL;
            int eid = -1;
            if ((st = cw__new_task(L, CW__T_ADD, CW_STAGE_EPILOGUE, L->light, addn, &e, &eid)) != CW_OK) break;
            e->u.add.dst = cw__rows(L->buf[outn], &n->desc, pt->o0, pt->o1);
            e->u.add.a = e->u.add.dst;
            e->u.add.b = cw__rows(L->buf[other], &g->nodes[other].desc, pt->o0, pt->o1);
            e->flops = (double)cw__desc_numel(&n->desc) * (double)(pt->o1 - pt->o0) / (double)h_out;
            snprintf(e->name, sizeof e->name, "residual add L%d patch %d/%d", addn, j + 1, P);
            if ((st = cw__dep(L, eid, id)) != CW_OK) break;
            if ((st = cw__dep_rows(L, eid, other, pt->o0, pt->o1)) != CW_OK) break;
            last = eid;
        }
        if ((st = cw__writer(L, outn, last, pt->o0, pt->o1)) != CW_OK) break;
        if ((st = cw__gn_band_stats(L, outn, last, pt->o0, pt->o1, j)) != CW_OK) break;
        /* the conv H-1 patches back ran on the stream the next conv takes: free its
         * workspace and patch buffer now so the next conv reuses them in stream order. */
        if (j - H + 1 >= 0) {
            int k = j - H + 1;
            if ((st = cw__release(L, pend[k].ws)) != CW_OK) break;
            if ((st = cw__release(L, pend[k].pbuf)) != CW_OK) break;
            pend[k].ws = pend[k].pbuf = -1;
        }
    }
    for (int k = 0; k < P && st == CW_OK; k++) { /* the last H-1 convs' temporaries */
        if ((st = cw__release(L, pend[k].ws)) == CW_OK) st = cw__release(L, pend[k].pbuf);
    }
    cw__free(bounds), cw__free(pts), cw__free(pend), cw__free(prep_task);
    return st;
}

/* ---- other nodes ---------------------------------------------------------------------- */
static cw_status cw__lower_elementwise(cw__lower *L, int i) {
    cw_graph *g = L->g;
    const cw__node *n = &g->nodes[i];
    const cw_tensor_desc *d = &n->desc;
    int64_t h = d->dims[cw__hdim(d)];
    cw__task *t = NULL;
    int id = -1;
    if (n->kind == CW__N_ADD) {
        CW__TRY(cw__new_task(L, CW__T_ADD, CW_STAGE_OTHER, L->light, i, &t, &id));
        t->u.add.dst = cw__whole(L->buf[i], d);
        t->u.add.a = cw__whole(L->buf[n->in[0]], d);
        t->u.add.b = cw__whole(L->buf[n->in[1]], d);
        t->flops = (double)cw__desc_numel(d);
        snprintf(t->name, sizeof t->name, "add L%d", i);
        CW__TRY(cw__dep_rows(L, id, n->in[0], 0, h));
        CW__TRY(cw__dep_rows(L, id, n->in[1], 0, h));
    } else {
        int x = n->in[0];
        if (n->kind == CW__N_GN) CW__TRY(cw__gn_ready(L, i));
        CW__TRY(cw__new_task(L, CW__T_PREP, CW_STAGE_OTHER, L->light, i, &t, &id));
        t->u.prep.src = cw__whole(L->buf[x], &g->nodes[x].desc);
        t->u.prep.dst = cw__whole(L->buf[i], d);
        t->u.prep.ss_buf = n->kind == CW__N_GN ? L->gn_ss[i] : -1;
        t->u.prep.silu = n->kind == CW__N_SILU;
        t->u.prep.up = n->kind == CW__N_UP2 ? 2 : 1;
        t->flops = (double)cw__desc_numel(d) * 4.0;
        snprintf(t->name, sizeof t->name, "%s L%d", n->name, i);
        CW__TRY(cw__dep_rows(L, id, x, 0, g->nodes[x].desc.dims[cw__hdim(&g->nodes[x].desc)]));
        if (n->kind == CW__N_GN) CW__TRY(cw__dep(L, id, L->gn_fin[i]));
    }
    CW__TRY(cw__gn_begin(L, i, 1));
    CW__TRY(cw__writer(L, i, id, 0, h));
    return cw__gn_band_stats(L, i, id, 0, h, 0);
}

static cw_status cw__lower_attention(cw__lower *L, int i) {
    cw_graph *g = L->g;
    const cw__node *n = &g->nodes[i];
    const cw_tensor_desc *d = &n->desc;
    int hd = cw__hdim(d);
    int64_t N = d->dims[0], C = d->dims[1], T = 1, W = d->dims[d->rank - 1];
    for (int k = 2; k < d->rank; k++) T *= d->dims[k];
    int64_t tc = T;
    if (!L->none && L->budget >= 0) {
        int64_t avail = L->budget - CW__SMALL_RESERVE(L->budget);
        tc = avail / (L->heavy * T * 4 + 4096);
        if (tc > T) tc = T;
        if (tc < 1)
            return cw__error(g->ctx, CW_ERR_BUDGET, "compile: attention over %" PRId64 " tokens needs at least %" PRId64
                             " bytes of score buffer per heavy stream; budget %" PRId64, T, T * 4, L->budget);
        /* balanced chunks */
        int64_t nch = (T + tc - 1) / tc;
        tc = (T + nch - 1) / nch;
    }
    int64_t h = d->dims[hd];
    int nchunks = (int)((T + tc - 1) / tc) * (int)N;
    int *sb = cw__malloc((size_t)nchunks * sizeof *sb);
    if (!sb) return cw__oom(L);
    cw_status st = CW_OK;
    int c = 0, H = L->heavy;
    for (int64_t b = 0; b < N && st == CW_OK; b++) {
        for (int64_t t0 = 0; t0 < T && st == CW_OK; t0 += tc, c++) {
            int64_t t1 = t0 + tc < T ? t0 + tc : T;
            if ((st = cw__temp(L, (t1 - t0) * T * 4, NULL, &sb[c])) != CW_OK) break;
            cw__task *t = NULL;
            int id = -1;
            if ((st = cw__new_task(L, CW__T_ATTN, CW_STAGE_ATTENTION, cw__next_heavy(L), i, &t, &id)) != CW_OK) break;
            t->u.attn.q = cw__whole(L->buf[n->in[0]], d);
            t->u.attn.k = cw__whole(L->buf[n->in[1]], d);
            t->u.attn.v = cw__whole(L->buf[n->in[2]], d);
            t->u.attn.o = cw__whole(L->buf[i], d);
            t->u.attn.n = b, t->u.attn.t0 = t0, t->u.attn.t1 = t1, t->u.attn.T = T, t->u.attn.C = C;
            t->u.attn.s_buf = sb[c];
            t->u.attn.scale = n->scale;
            t->flops = 4.0 * (double)(t1 - t0) * (double)T * (double)C;
            snprintf(t->name, sizeof t->name, "attention L%d n%" PRId64 " tokens %" PRId64 "-%" PRId64, i, b, t0, t1);
            for (int a = 0; a < 3 && st == CW_OK; a++) st = cw__dep_rows(L, id, n->in[a], 0, g->nodes[n->in[a]].desc.dims[hd]);
            int64_t r0 = d->rank == 4 ? t0 / W : 0, r1 = d->rank == 4 ? (t1 - 1) / W + 1 : h;
            if (st == CW_OK) st = cw__writer(L, i, id, r0, r1 > h ? h : r1);
            if (st == CW_OK && c - H + 1 >= 0) st = cw__release(L, sb[c - H + 1]);
        }
    }
    for (int k = c - H + 1 < 0 ? 0 : c - H + 1; k < c && st == CW_OK; k++) st = cw__release(L, sb[k]);
    cw__free(sb);
    return st;
}

/* ---- driver ----------------------------------------------------------------------------- */
static void cw__lower_free(cw__lower *L) {
    if (L->wr)
        for (int i = 0; i < L->g->n; i++) cw__free(L->wr[i]);
    cw__free(L->wr), cw__free(L->n_wr), cw__free(L->cap_wr);
    cw__free(L->buf), cw__free(L->fused), cw__free(L->live), cw__free(L->epi), cw__free(L->epi_into), cw__free(L->reads);
    cw__free(L->gn_refs), cw__free(L->gn_part), cw__free(L->gn_ss), cw__free(L->gn_fin), cw__free(L->gn_nparts);
    cw__free(L->gn_stats_first);
}

int cw__task_bufs(const cw__task *t, int *out) {
    int n = 0;
    int b[CW__TASK_MAX_BUFS] = {-1, -1, -1, -1, -1};
    switch (t->kind) {
    case CW__T_CONV: b[0] = t->u.conv.x.buf, b[1] = t->u.conv.y.buf, b[2] = t->u.conv.ws_buf; break;
    case CW__T_PREP: b[0] = t->u.prep.src.buf, b[1] = t->u.prep.dst.buf, b[2] = t->u.prep.ss_buf; break;
    case CW__T_ADD: b[0] = t->u.add.dst.buf, b[1] = t->u.add.a.buf, b[2] = t->u.add.b.buf; break;
    case CW__T_STATS: b[0] = t->u.stats.x.buf, b[1] = t->u.stats.part_buf; break;
    case CW__T_FINALIZE: b[0] = t->u.fin.part_buf, b[1] = t->u.fin.ss_buf; break;
    case CW__T_ATTN:
        b[0] = t->u.attn.q.buf, b[1] = t->u.attn.k.buf, b[2] = t->u.attn.v.buf, b[3] = t->u.attn.o.buf;
        b[4] = t->u.attn.s_buf;
        break;
    }
    for (int i = 0; i < CW__TASK_MAX_BUFS; i++)
        if (b[i] >= 0) out[n++] = b[i];
    return n;
}

/* Final pass: allocation streams, event waits (deduplicated per stream pair), free joins. */
static cw_status cw__finish(cw__lower *L) {
    cw_plan *p = L->p;
    int S = p->n_streams;
    int nb = p->n_bufs;
    int *first = cw__malloc((size_t)nb * sizeof *first);
    int *lastu = cw__malloc((size_t)nb * (size_t)S * sizeof *lastu);
    int *waited = cw__malloc((size_t)S * (size_t)S * sizeof *waited);
    int *alloc_act = cw__malloc((size_t)nb * sizeof *alloc_act + 1);
    char *ordered = cw__calloc((size_t)nb * (size_t)S + 1, 1); /* stream ordered after b's alloc */
    cw_status st = CW_OK;
    if (!first || !lastu || !waited || !alloc_act || !ordered) {
        st = cw__oom(L);
        goto done;
    }
    for (int b = 0; b < nb; b++) first[b] = -1, alloc_act[b] = -1;
    for (int k = 0; k < nb * S; k++) lastu[k] = -1;
    for (int k = 0; k < S * S; k++) waited[k] = -1;
    int tb[CW__TASK_MAX_BUFS];
    for (int a = 0; a < p->n_acts; a++) {
        if (p->acts[a].kind != CW__A_TASK) continue;
        const cw__task *t = &p->tasks[p->acts[a].id];
        for (int k = 0, n = cw__task_bufs(t, tb); k < n; k++)
            if (first[tb[k]] < 0) first[tb[k]] = t->stream;
    }
    p->n_events = 0;
    for (int a = 0; a < p->n_acts && st == CW_OK; a++) {
        cw__action *ac = &p->acts[a];
        if (ac->kind == CW__A_ALLOC) {
            ac->stream = first[ac->id] >= 0 ? first[ac->id] : 0;
            alloc_act[ac->id] = a;
            for (int s = 0; s < S; s++) ordered[(size_t)ac->id * S + s] = s == ac->stream;
        } else if (ac->kind == CW__A_TASK) {
            int ti = ac->id;
            cw__task *t = &p->tasks[ti];
            int n = cw__task_bufs(t, tb);
            /* The allocator orders only the allocating stream after the memory's previous
             * use; every other stream that touches the buffer waits on an event recorded
             * right after the allocation, before its first use. */
            for (int k = 0; k < n && st == CW_OK; k++) {
                int b = tb[k];
                if (alloc_act[b] < 0 || ordered[(size_t)b * S + t->stream]) continue;
                cw__action *al = &p->acts[alloc_act[b]];
                int *nw = cw__realloc(t->alloc_waits, (size_t)(t->n_alloc_waits + 1) * sizeof *nw);
                if (!nw) {
                    st = cw__oom(L);
                    break;
                }
                if (al->event < 0) al->event = p->n_events++;
                t->alloc_waits = nw;
                t->alloc_waits[t->n_alloc_waits++] = al->event;
                ordered[(size_t)b * S + t->stream] = 1;
            }
            for (int d = 0; d < t->n_deps && st == CW_OK; d++) {
                int dt = t->deps[d];
                int ds = p->tasks[dt].stream;
                if (ds == t->stream || waited[t->stream * S + ds] >= dt) continue;
                int *nw = cw__realloc(t->waits, (size_t)(t->n_waits + 1) * sizeof *nw);
                if (!nw) {
                    st = cw__oom(L);
                    break;
                }
                t->waits = nw;
                t->waits[t->n_waits++] = dt;
                waited[t->stream * S + ds] = dt;
                if (p->tasks[dt].event < 0) p->tasks[dt].event = p->n_events++;
            }
            for (int k = 0; k < n; k++) lastu[tb[k] * S + t->stream] = ti;
        } else { /* FREE: on the stream of the last user, after joining the others */
            int b = ac->id, fs = 0, lt = -1;
            for (int s = 0; s < S; s++)
                if (lastu[b * S + s] > lt) lt = lastu[b * S + s], fs = s;
            ac->stream = fs;
            for (int s = 0; s < S && st == CW_OK; s++) {
                int u = lastu[b * S + s];
                if (s == fs || u < 0 || waited[fs * S + s] >= u) continue;
                int *nj = cw__realloc(ac->joins, (size_t)(ac->n_joins + 1) * sizeof *nj);
                if (!nj) {
                    st = cw__oom(L);
                    break;
                }
                ac->joins = nj;
                ac->joins[ac->n_joins++] = u;
                waited[fs * S + s] = u;
                if (p->tasks[u].event < 0) p->tasks[u].event = p->n_events++;
            }
        }
    }
    /* invariant: every allocated buffer is freed exactly once */
    for (int b = 0; b < nb; b++) first[b] = 0;
    for (int a = 0; a < p->n_acts; a++)
        if (p->acts[a].kind == CW__A_ALLOC) first[p->acts[a].id]++;
        else if (p->acts[a].kind == CW__A_FREE) first[p->acts[a].id]--;
    for (int b = 0; b < nb && st == CW_OK; b++)
        if (first[b] != 0)
            st = cw__error(L->g->ctx, CW_ERR_INTERNAL, "compile: buffer %d (kind %d, %" PRId64 " bytes) %s", b,
                           (int)p->bufs[b].kind, p->bufs[b].bytes, first[b] > 0 ? "never freed" : "freed twice");
done:
    cw__free(first), cw__free(lastu), cw__free(waited), cw__free(alloc_act), cw__free(ordered);
    return st;
}

cw_status cw__plan_build(cw_graph *g, const cw_compile_options *opt, int64_t budget, cw_plan **out) {
    *out = NULL;
    cw_context *ctx = g->ctx;
    cw_plan *p = cw__calloc(1, sizeof *p);
    if (!p) return cw__error(ctx, CW_ERR_OUT_OF_MEMORY, "compile: out of host memory");
    p->ctx = ctx;
    p->opt = *opt;
    p->budget = budget;
    int none = opt->policy == CW_PATCHES_NONE;
    int streams = none ? 1 : (opt->streams > 0 ? opt->streams : ctx->cfg.streams);
    p->n_streams = streams;
    cw__lower L;
    memset(&L, 0, sizeof L);
    L.p = p;
    L.g = g;
    L.budget = budget;
    L.heavy = streams > 1 ? streams - 1 : 1;
    L.light = streams > 1 ? streams - 1 : 0;
    /* fixed here, never from what else runs: a conv or GEMM task on each heavy stream at
     * once fills the backend's threads without oversubscribing them */
    L.threads = ctx->be->threads > 0 ? (ctx->be->threads / L.heavy > 0 ? ctx->be->threads / L.heavy : 1) : 0;
    L.fuse = !none && opt->fuse;
    L.none = none;
    size_t n = (size_t)g->n;
    cw_status st = CW_OK;
#define CW__ARR(f)                                           \
    if (!(L.f = cw__malloc(n * sizeof *L.f + 1))) st = CW_ERR_OUT_OF_MEMORY; \
    else for (size_t q = 0; q < n; q++) L.f[q] = -1
    CW__ARR(buf);
    CW__ARR(epi);
    CW__ARR(epi_into);
    CW__ARR(gn_part);
    CW__ARR(gn_ss);
    CW__ARR(gn_fin);
    CW__ARR(gn_nparts);
    CW__ARR(gn_stats_first);
#undef CW__ARR
    L.fused = cw__calloc(n + 1, sizeof *L.fused);
    L.live = cw__calloc(n + 1, 1);
    L.reads = cw__calloc(n + 1, sizeof *L.reads);
    L.gn_refs = cw__calloc(n + 1, sizeof *L.gn_refs);
    L.wr = cw__calloc(n + 1, sizeof *L.wr);
    L.n_wr = cw__calloc(n + 1, sizeof *L.n_wr);
    L.cap_wr = cw__calloc(n + 1, sizeof *L.cap_wr);
    p->n_inputs = g->n_inputs;
    p->n_outputs = g->n_outputs;
    p->in = cw__calloc((size_t)g->n_inputs + 1, sizeof *p->in);
    p->out = cw__calloc((size_t)g->n_outputs + 1, sizeof *p->out);
    if (st != CW_OK || !L.fused || !L.live || !L.reads || !L.gn_refs || !L.wr || !L.n_wr || !L.cap_wr || !p->in ||
        !p->out) {
        st = cw__oom(&L);
        goto fail;
    }
    /* dead nodes (no output depends on them) are not lowered */
    for (int o = 0; o < g->n_outputs; o++) L.live[g->outputs[o]] = 1;
    for (int i = g->n - 1; i >= 0; i--)
        for (int a = 0; a < 4 && L.live[i]; a++)
            if (g->nodes[i].in[a] >= 0) L.live[g->nodes[i].in[a]] = 1;
    cw__analyse(&L);
    /* buffers of materialized nodes; read counts */
    for (int i = 0; i < g->n && st == CW_OK; i++) {
        cw__node *nd = &g->nodes[i];
        if (nd->kind == CW__N_INPUT) {
            st = cw__new_buf(&L, CW__B_INPUT, nd->index, &nd->desc, 0, &L.buf[i]);
            p->in[nd->index].d = nd->desc;
            snprintf(p->in[nd->index].name, sizeof p->in[nd->index].name, "%s", nd->name);
        } else if (nd->kind == CW__N_CONST && L.live[i]) {
            if ((st = cw__new_buf(&L, CW__B_CONST, i, &nd->desc, 0, &L.buf[i])) == CW_OK) p->bufs[L.buf[i]].t = nd->t;
            p->weights_bytes += cw__desc_span_bytes(&nd->desc);
        }
        int rd[4], gns[4];
        int k = L.live[i] ? cw__unit_reads(&L, i, rd, gns) : -1;
        for (int a = 0; a < k; a++) L.reads[rd[a]]++;
        if (k >= 0 && rd[3] >= 0) L.gn_refs[rd[3]]++;
    }
    for (int o = 0; o < g->n_outputs; o++) {
        const cw__node *on = &g->nodes[g->outputs[o]];
        p->out[o].d = on->desc;
        snprintf(p->out[o].name, sizeof p->out[o].name, "%s", on->oname);
    }
    for (int i = 0; i < g->n && st == CW_OK; i++) {
        const cw__node *nd = &g->nodes[i];
        if (nd->kind == CW__N_INPUT || nd->kind == CW__N_CONST || L.fused[i] || !L.live[i]) continue;
        /* a conv with a residual epilogue is lowered at its ADD's position, where the
         * residual operand (which may come after the conv) already exists */
        if (nd->kind == CW__N_CONV && L.epi_into[i] >= 0) continue;
        int u = nd->kind == CW__N_ADD && L.epi[i] >= 0 ? L.epi[i] : i; /* the unit lowered */
        const cw__node *un = &g->nodes[u];
        int rd[4], gns[4];
        int k = cw__unit_reads(&L, u, rd, gns);
        if (k < 0) continue;
        if (nd->is_output) {
            st = cw__new_buf(&L, CW__B_OUTPUT, nd->index, &nd->desc, 0, &L.buf[i]);
        } else if ((st = cw__new_buf(&L, CW__B_ACT, -1, &nd->desc, cw__desc_numel(&nd->desc) * 4, &L.buf[i])) == CW_OK) {
            st = cw__act(&L, CW__A_ALLOC, L.buf[i], 0);
        }
        if (st != CW_OK) break;
        L.buf[u] = L.buf[i];
        if (un->kind == CW__N_CONV) st = cw__lower_conv(&L, u);
        else if (un->kind == CW__N_ATTN) st = cw__lower_attention(&L, u);
        else st = cw__lower_elementwise(&L, u);
        /* free what this unit was the last to read */
        for (int a = 0; a < k && st == CW_OK; a++) {
            int m = rd[a];
            if (--L.reads[m] == 0 && g->nodes[m].kind != CW__N_INPUT && g->nodes[m].kind != CW__N_CONST &&
                !g->nodes[m].is_output && p->bufs[L.buf[m]].kind == CW__B_ACT) {
                /* a GN still to be finalized from m must take its stats first */
                for (int q = m + 1; q < g->n && st == CW_OK; q++)
                    if (g->nodes[q].kind == CW__N_GN && g->nodes[q].in[0] == m && L.gn_refs[q] > 0)
                        st = cw__gn_ready(&L, q);
                if (st == CW_OK) st = cw__release(&L, L.buf[m]);
            }
        }
        if (st == CW_OK && rd[3] >= 0 && --L.gn_refs[rd[3]] == 0) st = cw__release(&L, L.gn_ss[rd[3]]);
    }
    /* outputs nobody read still need their GN partials freed etc.: any never-finalized
     * partial buffers are released here */
    for (int i = 0; i < g->n && st == CW_OK; i++)
        if (g->nodes[i].kind == CW__N_GN && L.gn_part[i] >= 0 && L.gn_fin[i] < 0) st = cw__release(&L, L.gn_part[i]);
    if (st == CW_OK) st = cw__finish(&L);
    if (st != CW_OK) goto fail;
    cw__lower_free(&L);
    *out = p;
    return CW_OK;
fail:
    cw__lower_free(&L);
    cw__plan_free(p);
    return st;
}
