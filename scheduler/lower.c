/* Lowering a graph into a plan: each unit (a conv with its fused prep chain and residual
 * epilogue, an attention, a lone elementwise node) becomes tasks on streams. Heavy tasks
 * (conv patches, attention chunks) go round-robin onto the heavy streams, light ones onto
 * the light stream; each buffer is freed after its last reader. The host-ordered action
 * list (alloc / task / free) is what cw_plan_run replays and the budget search simulates. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "scheduler/lower.h"
#include "scheduler/planner.h"

/* Headroom for the small temporaries (GroupNorm partials and scale/shift) and allocator
 * rounding when sizing patches: 1/8 of the budget; the dry run is the real check. */
#define CW__SMALL_RESERVE(b) ((b) / 8)

/* ---- conv lowering ------------------------------------------------------------------- */

/* One conv unit being lowered: node i, its fused prep chain, its residual epilogue. */
typedef struct cw__conv_unit {
    int node, outn;          /* conv node; node whose buffer it writes (the ADD when fused) */
    int src, gn, silu, up;   /* the prep chain (cw__fusion_chain) */
    int prep;                /* 1 when the chain is not empty */
    int other;               /* the residual operand, -1 without epilogue */
    int inplace;             /* 1: the add's result is written into other's storage: each
                                patch's conv writes a band buffer, the epilogue adds it in */
    int pass1;               /* 1: a recomputed conv's first pass: each band goes to a band
                                buffer only for its GroupNorm statistics, then is dropped */
    int rec;                 /* the recomputed conv whose bands this conv's prep computes, -1 */
    cw__conv_plan cp;        /* the planner's bands and algorithm */
    int *ws, *pbuf, *prep_task; /* per patch: workspace and prep buffer, prep task (-1) */
    int *ybuf;               /* per patch (inplace): its output band buffer */
    int *war;                /* inplace: earlier tasks touching other's storage */
    int n_war;
    int rec_x;               /* 1: inplace, and other is the recomputed conv's own input: a
                                band's epilogue overwrites rows that later patches' recomputes
                                still read (cw__emit_patches orders them) */
    int *xr_task;            /* rec_x, per patch: the task of its recompute that reads other's
                                rows (its prep, or its conv without one), -1 before emitted */
    int64_t *xr_lo, *xr_hi;  /* rec_x, per patch: those rows of other */
    cw__conv_info *ci;
} cw__conv_unit;

/* This conv's share of the budget (see cw__conv_share). */
static cw__conv_share cw__share(const cw__lower *L, int prep, int ybuf, int64_t h_out) {
    const cw_compile_options *o = &L->p->opt;
    cw__conv_share sh;
    memset(&sh, 0, sizeof sh);
    sh.avail = L->budget < 0 ? -1 : L->budget - CW__SMALL_RESERVE(L->budget);
    sh.heavy = L->heavy;
    /* H convs in flight plus H preps ahead (one stream: one of each) */
    sh.n_pbufs = L->heavy > 1 || L->light != 0 ? 2 * L->heavy : 1;
    sh.prep = prep;
    sh.ybuf = ybuf;
    sh.p_min = o->max_patch_rows > 0 ? (int)((h_out + o->max_patch_rows - 1) / o->max_patch_rows) : 1;
    sh.p_fixed = o->policy == CW_PATCHES_FIXED ? o->patches : 0;
    sh.single = L->none;
    return sh;
}

/* Records the conv for cw_plan_describe and the plan's FLOP counts. */
static cw_status cw__conv_record(cw__lower *L, cw__conv_unit *u, const cw__conv_problem *full) {
    cw_plan *p = L->p;
    int P = u->cp.patches;
    if (cw__grow((void **)&p->convs, &p->cap_convs, p->n_convs + 1, sizeof *p->convs) != CW_OK) return cw__oom(L);
    cw__conv_info *ci = &p->convs[p->n_convs++];
    memset(ci, 0, sizeof *ci);
    ci->node = u->node;
    ci->patches = P;
    ci->h_out = u->cp.bounds[P];
    ci->fused_prep = u->prep;
    ci->tasks = cw__malloc((size_t)P * sizeof(int));
    if (!ci->tasks) return cw__oom(L);
    u->ci = ci;
    cw__halo h;
    if (cw__patch_halo(full, u->cp.bounds, P, u->prep ? 8.0 : 0.0, &h) == CW_OK) {
        ci->halo_pct = h.halo_pct;
        p->halo_flop += h.prep_flops_extra;
    }
    p->conv_gflop += cw__conv_flops(full) * 1e-9;
    return CW_OK;
}

/* The prep task of patch q: GN apply + SiLU + upsample of its input rows into a buffer. */
static cw_status cw__emit_prep(cw__lower *L, cw__conv_unit *u, int q) {
    const cw__patch *pt = &u->cp.patch[q];
    if (!u->prep || pt->b <= pt->a) return CW_OK;
    cw_tensor_desc bd = pt->prob.x;
    memset(bd.strides, 0, sizeof bd.strides);
    cw__desc_fill_strides(&bd);
    CW__TRY(cw__temp(L, cw__desc_bytes(&bd), &bd, &u->pbuf[q]));
    cw__task *t = NULL;
    int id = -1;
    CW__TRY(cw__new_task(L, CW__T_PREP, CW_STAGE_PREP, L->light, u->node, &t, &id));
    int64_t s0 = pt->a / u->up, s1 = (pt->b - 1) / u->up + 1;
    t->u.prep.src = cw__rows(L->nd[u->src].buf, &L->g->nodes[u->src].desc, s0, s1);
    t->u.prep.dst = cw__whole(u->pbuf[q], &bd);
    t->u.prep.ss_buf = u->gn >= 0 ? L->nd[u->gn].gn_ss : -1;
    t->u.prep.silu = u->silu;
    t->u.prep.up = u->up;
    t->u.prep.dst_row0 = pt->a;
    t->u.prep.src_row0 = s0;
    t->flops = (double)cw__desc_numel(&bd) * 8.0;
    snprintf(t->name, sizeof t->name, "prep%s%s%s L%d patch %d/%d", u->gn >= 0 ? " gn" : "", u->silu ? " silu" : "",
             u->up > 1 ? " up2" : "", u->node, q + 1, u->cp.patches);
    CW__TRY(cw__dep_rows(L, id, u->src, s0, s1));
    if (u->gn >= 0) CW__TRY(cw__dep(L, id, L->nd[u->gn].gn_fin));
    u->prep_task[q] = id;
    return CW_OK;
}

/* The conv task of patch j (after its workspace); *id gets it. */
static cw_status cw__emit_conv(cw__lower *L, cw__conv_unit *u, int j, int *id) {
    const cw_graph *g = L->g;
    const cw__node *n = &g->nodes[u->node];
    const cw_tensor_desc *xd = &g->nodes[n->in[0]].desc, *wd = &g->nodes[n->in[1]].desc;
    const cw__patch *pt = &u->cp.patch[j];
    if (u->cp.ws > 0) CW__TRY(cw__temp(L, u->cp.ws, NULL, &u->ws[j]));
    cw_tensor_desc yb = pt->prob.y;
    if (u->inplace || u->pass1) {
        memset(yb.strides, 0, sizeof yb.strides);
        cw__desc_fill_strides(&yb);
        CW__TRY(cw__temp(L, cw__desc_bytes(&yb), &yb, &u->ybuf[j]));
    }
    cw__task *t = NULL;
    CW__TRY(cw__new_task(L, CW__T_CONV, CW_STAGE_CONV, cw__next_heavy(L), u->node, &t, id));
    t->u.conv.prob = pt->prob;
    t->u.conv.algo = u->cp.algo;
    t->u.conv.algo.workspace = u->cp.ws;
    if ((u->prep && pt->b > pt->a) || u->rec >= 0) {
        t->u.conv.x = cw__whole(u->pbuf[j], &L->p->bufs[u->pbuf[j]].d);
    } else {
        t->u.conv.x = cw__rows(L->nd[u->src].buf, xd, pt->a, pt->b > pt->a ? pt->b : pt->a);
        if (u->prep) t->u.conv.x.buf = L->nd[u->src].buf; /* empty patch: no rows are read */
    }
    t->u.conv.w = cw__whole(L->nd[n->in[1]].buf, wd);
    t->u.conv.w.start[wd->rank - 2] = 0;
    t->u.conv.w.dims[wd->rank - 2] = wd->dims[wd->rank - 2];
    t->u.conv.has_b = n->in[2] >= 0;
    if (t->u.conv.has_b) {
        t->u.conv.b.buf = L->nd[n->in[2]].buf;
        t->u.conv.b.rank = 1;
        t->u.conv.b.dims[0] = wd->dims[0];
    }
    t->u.conv.y = u->inplace || u->pass1 ? cw__whole(u->ybuf[j], &yb)
                                         : cw__rows(L->nd[u->outn].buf, &n->desc, pt->o0, pt->o1);
    t->u.conv.ws_buf = u->ws[j];
    t->flops = cw__conv_flops(&pt->prob);
    snprintf(t->name, sizeof t->name, "%s L%d patch %d/%d", n->name, u->node, j + 1, u->cp.patches);
    if (u->ci) u->ci->tasks[j] = *id;
    if (u->prep_task[j] >= 0) return cw__dep(L, *id, u->prep_task[j]);
    if (pt->b > pt->a) return cw__dep_rows(L, *id, u->src, pt->a, pt->b);
    return CW_OK;
}

/* The residual add of patch j after its conv task `conv`; *id gets it. */
static cw_status cw__emit_epilogue(cw__lower *L, cw__conv_unit *u, int j, int conv, int *id) {
    const cw_graph *g = L->g;
    const cw__node *n = &g->nodes[u->node];
    const cw__patch *pt = &u->cp.patch[j];
    int addn = u->outn;
    cw__task *e = NULL;
    CW__TRY(cw__new_task(L, CW__T_ADD, CW_STAGE_EPILOGUE, L->light, addn, &e, id));
    e->u.add.dst = cw__rows(L->nd[u->outn].buf, &n->desc, pt->o0, pt->o1);
    if (u->inplace) { /* dst is other's storage: other + band, written over other */
        e->u.add.a = e->u.add.dst;
        e->u.add.b = cw__whole(u->ybuf[j], &L->p->bufs[u->ybuf[j]].d);
        for (int k = 0; k < u->n_war; k++) CW__TRY(cw__dep(L, *id, u->war[k]));
        /* write after read: every recompute that reads these rows of other (its prep, on
         * this stream; or its conv, on a heavy one, where A has no prep). The light stream's
         * order implies it today (each recompute ends in a GN apply here that waits for its
         * conv, emitted before this add: cw__emit_patches); recorded so that sync.c orders
         * it whatever streams those tasks take. */
        for (int q = 0; u->rec_x && q < u->cp.patches; q++)
            if (u->xr_task[q] >= 0 && u->xr_lo[q] < pt->o1 && pt->o0 < u->xr_hi[q])
                CW__TRY(cw__dep(L, *id, u->xr_task[q]));
    } else {
        e->u.add.a = e->u.add.dst;
        e->u.add.b = cw__rows(L->nd[u->other].buf, &g->nodes[u->other].desc, pt->o0, pt->o1);
    }
    e->flops = (double)cw__desc_numel(&n->desc) * (double)(pt->o1 - pt->o0) / (double)u->ci->h_out;
    snprintf(e->name, sizeof e->name, "residual add%s L%d patch %d/%d", u->inplace ? " in place" : "", addn, j + 1,
             u->cp.patches);
    CW__TRY(cw__dep(L, *id, conv));
    return cw__dep_rows(L, *id, u->other, pt->o0, pt->o1);
}

/* Frees patch k's workspace, prep buffer and output band buffer. */
static cw_status cw__patch_release(cw__lower *L, cw__conv_unit *u, int k) {
    CW__TRY(cw__release(L, u->ws[k]));
    CW__TRY(cw__release(L, u->pbuf[k]));
    CW__TRY(cw__release(L, u->ybuf[k]));
    u->ws[k] = u->pbuf[k] = u->ybuf[k] = -1;
    return CW_OK;
}

/* The tasks so far that touch buffer b: an in-place epilogue writing b waits for them
 * (write after read; the reads are long done in practice, so this costs no parallelism). */
static cw_status cw__touching(cw__lower *L, int b, int **out, int *n) {
    const cw_plan *p = L->p;
    *out = NULL;
    *n = 0;
    int *list = cw__malloc((size_t)p->n_tasks * sizeof *list + 1);
    if (!list) return cw__oom(L);
    for (int t = 0; t < p->n_tasks; t++) {
        int tb[CW__TASK_MAX_BUFS];
        for (int k = 0, m = cw__task_bufs(&p->tasks[t], tb); k < m; k++)
            if (tb[k] == b) {
                list[(*n)++] = t;
                break;
            }
    }
    *out = list;
    return CW_OK;
}

/* A second pass runs conv b on bands of recomputed conv a's output: both convs' temporaries
 * are in flight at once. Splits avail between them in proportion to their reduction lengths
 * (C/groups x kernel volume: im2col workspace per output row), a's share weighted 5/4 for its
 * halo rows. Returns b's share (which = 0) or a's (which = 1). */
static int64_t cw__rec_split(const cw__lower *L, int b, int a, int64_t avail, int which) {
    const cw_graph *g = L->g;
    double r[2];
    const int nodes[2] = {b, a};
    for (int k = 0; k < 2; k++) {
        const cw__node *n = &g->nodes[nodes[k]];
        const cw_tensor_desc *w = &g->nodes[n->in[1]].desc;
        r[k] = 1.0;
        for (int d = 1; d < w->rank; d++) r[k] *= (double)w->dims[d];
    }
    r[1] *= 1.25;
    return (int64_t)((double)avail * r[which] / (r[0] + r[1]));
}

/* The algorithm for band problem pr of a recomputed conv: the first pass's if listed and its
 * workspace fits the recomputed conv's part of a heavy stream's share (cw__rec_split),
 * else the fastest that fits, else the one with the least workspace. */
static cw_status cw__rec_algo(cw__lower *L, int b, int rec, const cw__conv_problem *pr, cw__conv_algo *algo) {
    cw__backend *be = L->g->ctx->be;
    cw__conv_algo list[16];
    int n = 0;
    CW__TRY(cw__op_conv_algos(be, pr, list, 16, &n));
    if (n == 0) return cw__error(L->g->ctx, CW_ERR_UNSUPPORTED, "compile: no algorithm for a recomputed band");
    int64_t cap = L->budget < 0 ? INT64_MAX
                                : cw__rec_split(L, b, rec, L->budget - CW__SMALL_RESERVE(L->budget), 1) /
                                      L->heavy;
    int pick = -1, least = 0;
    for (int k = 0; k < n; k++) {
        if (list[k].workspace < list[least].workspace) least = k;
        if (list[k].workspace > cap) continue;
        if (list[k].id == L->nd[rec].rec_algo.id) {
            pick = k;
            break;
        }
        if (pick < 0) pick = k;
    }
    *algo = list[pick >= 0 ? pick : least];
    return CW_OK;
}

/* Recomputed conv A's band for patch q of its consumer (unit u): A's output rows are the
 * rows q reads, [pt->a, pt->b); *ap gets A's patch for them. */
static cw_status cw__rec_band(const cw__lower *L, const cw__conv_unit *u, int q, cw__patch *ap) {
    const cw_graph *g = L->g;
    const cw__node *na = &g->nodes[u->rec];
    const cw__patch *pt = &u->cp.patch[q];
    cw__conv_problem fa;
    cw__conv_problem_init(&fa, &g->nodes[na->in[0]].desc, &g->nodes[na->in[1]].desc, na->in[2] >= 0, &na->desc,
                          &na->conv);
    return cw__patch_make(&fa, pt->a, pt->b, ap);
}

static cw_status cw__emit_recompute(cw__lower *L, cw__conv_unit *u, int q);

/* A's band for patch q of unit u, into a band buffer (*ybuf; *conv gets its conv task): a
 * one-patch unit for A whose input rows come from A's own prep, or -- where A reads a
 * recomputed conv itself -- from that conv's band, recomputed first (recursively). */
static cw_status cw__emit_rec_conv(cw__lower *L, cw__conv_unit *u, int q, int *ybuf, int *conv) {
    const int A = u->rec;
    const cw__node *na = &L->g->nodes[A];
    cw__conv_unit a;
    memset(&a, 0, sizeof a);
    int64_t bounds[2] = {u->cp.patch[q].a, u->cp.patch[q].b};
    cw__patch ap;
    int ws = -1, pbuf = -1, ptask = -1;
    a.node = a.outn = A;
    a.other = -1;
    a.pass1 = 1; /* its conv writes a band buffer */
    cw__fusion_chain(L, na->in[0], &a.src, &a.gn, &a.silu, &a.up);
    a.prep = a.gn >= 0 || a.silu || a.up > 1;
    a.rec = L->nd[A].rec_of;
    a.cp.patches = 1;
    a.cp.bounds = bounds;
    a.cp.patch = &ap;
    a.ws = &ws, a.pbuf = &pbuf, a.ybuf = ybuf, a.prep_task = &ptask;
    CW__TRY(cw__rec_band(L, u, q, &ap));
    CW__TRY(cw__rec_algo(L, u->node, A, &ap.prob, &a.cp.algo));
    a.cp.ws = a.cp.algo.workspace;
    CW__TRY(a.rec >= 0 ? cw__emit_recompute(L, &a, 0) : cw__emit_prep(L, &a, 0));
    CW__TRY(cw__emit_conv(L, &a, 0, conv));
    if (u->rec_x && ap.b > ap.a) u->xr_task[q] = ptask >= 0 ? ptask : *conv; /* what reads other's rows */
    L->p->recompute_flop += cw__conv_flops(&ap.prob);
    CW__TRY(cw__release(L, ws));
    return cw__release(L, pbuf);
}

/* Patch q's input rows of a conv that reads a recomputed conv A, directly or through GN
 * and/or SiLU: A's band for exactly those rows (cw__emit_rec_conv), then GN apply + SiLU in
 * place on it. The band buffer is q's prep buffer. Exact: the statistics are A's
 * whole-tensor ones from its first pass. */
static cw_status cw__emit_recompute(cw__lower *L, cw__conv_unit *u, int q) {
    const cw__patch *pt = &u->cp.patch[q];
    int ybuf = -1, id = -1;
    CW__TRY(cw__emit_rec_conv(L, u, q, &ybuf, &id));
    u->pbuf[q] = ybuf;
    u->prep_task[q] = id;
    if (u->gn < 0 && !u->silu) return CW_OK; /* read as it is */
    const cw__buf *bb = &L->p->bufs[ybuf];
    cw__task *t = NULL;
    int pid = -1;
    CW__TRY(cw__new_task(L, CW__T_PREP, CW_STAGE_PREP, L->light, u->node, &t, &pid));
    t->u.prep.src = cw__whole(ybuf, &bb->d);
    t->u.prep.dst = t->u.prep.src;
    t->u.prep.ss_buf = u->gn >= 0 ? L->nd[u->gn].gn_ss : -1;
    t->u.prep.silu = u->silu;
    t->u.prep.up = 1;
    t->u.prep.dst_row0 = t->u.prep.src_row0 = pt->a;
    t->flops = (double)cw__desc_numel(&bb->d) * 8.0;
    snprintf(t->name, sizeof t->name, "recompute L%d rows %" PRId64 "-%" PRId64 " + prep%s%s L%d patch %d/%d", u->rec,
             pt->a, pt->b, u->gn >= 0 ? " gn" : "", u->silu ? " silu" : "", u->node, q + 1, u->cp.patches);
    CW__TRY(cw__dep(L, pid, id));
    if (u->gn >= 0) CW__TRY(cw__dep(L, pid, L->nd[u->gn].gn_fin));
    u->prep_task[q] = pid;
    return CW_OK;
}

/* rec_x: the rows of other (A's own input) each patch's recompute reads; nondecreasing in
 * the patch, since the bands are. */
static cw_status cw__rec_x_rows(cw__lower *L, cw__conv_unit *u) {
    const int P = u->cp.patches;
    u->xr_task = cw__malloc((size_t)P * sizeof *u->xr_task);
    u->xr_lo = cw__malloc((size_t)P * sizeof *u->xr_lo);
    u->xr_hi = cw__malloc((size_t)P * sizeof *u->xr_hi);
    if (!u->xr_task || !u->xr_lo || !u->xr_hi) return cw__oom(L);
    int src, gn, silu, up;
    cw__fusion_chain(L, L->g->nodes[u->rec].in[0], &src, &gn, &silu, &up);
    for (int q = 0; q < P; q++) {
        cw__patch ap;
        CW__TRY(cw__rec_band(L, u, q, &ap));
        u->xr_task[q] = -1;
        u->xr_lo[q] = ap.a / up; /* as cw__emit_prep reads them */
        u->xr_hi[q] = ap.b > ap.a ? (ap.b - 1) / up + 1 : u->xr_lo[q];
    }
    return CW_OK;
}

/* Emits every patch: preps run ahead of their conv by `ahead` patches (double buffering),
 * then conv, epilogue, band statistics; temporaries are freed H patches later.
 * rec_x (B's result written over A's own input x, A recomputed per band): band j's epilogue
 * overwrites x's rows [o0, o1), which the recomputes of later patches still read (their
 * halo: patch j+1's starts halo rows above o1). So before band j's epilogue, every recompute
 * reading a row below o1 is emitted (host order) and the epilogue depends on those that
 * read its rows (cw__emit_epilogue): at least 2 recomputes in flight, more only where a
 * band is thinner than the halo. Each recompute holds its rows already prepped and
 * convolved in its band buffer, so those buffers are the halo ring: no copy of x's rows. */
static cw_status cw__emit_patches(cw__lower *L, cw__conv_unit *u) {
    const int P = u->cp.patches, H = L->heavy;
    const int ahead = u->prep || u->rec >= 0 ? (L->light != 0 ? L->heavy + 1 : 1) : 0;
    int next_prep = 0;
    for (int j = 0; j < P; j++) {
        const cw__patch *pt = &u->cp.patch[j];
        while (next_prep < P && (next_prep < j + ahead || (u->rec_x && u->xr_lo[next_prep] < pt->o1)))
            CW__TRY(u->rec >= 0 ? cw__emit_recompute(L, u, next_prep++) : cw__emit_prep(L, u, next_prep++));
        int id = -1, last;
        CW__TRY(cw__emit_conv(L, u, j, &id));
        last = id;
        if (u->other >= 0) CW__TRY(cw__emit_epilogue(L, u, j, id, &last));
        if (u->pass1) { /* only the band's statistics are kept */
            cw__vref band = cw__whole(u->ybuf[j], &L->p->bufs[u->ybuf[j]].d);
            CW__TRY(cw__gn_band_stats_at(L, u->outn, last, &band, pt->o0, pt->o1, j));
        } else {
            CW__TRY(cw__writer(L, u->outn, last, pt->o0, pt->o1));
            CW__TRY(cw__gn_band_stats(L, u->outn, last, pt->o0, pt->o1, j));
        }
        /* the conv H-1 patches back ran on the stream the next conv takes: free its
         * workspace and patch buffer now so the next conv reuses them in stream order. */
        if (j - H + 1 >= 0) CW__TRY(cw__patch_release(L, u, j - H + 1));
    }
    for (int k = 0; k < P; k++) CW__TRY(cw__patch_release(L, u, k)); /* the last H-1 patches' */
    return CW_OK;
}

static cw_status cw__lower_conv(cw__lower *L, int i) {
    cw_graph *g = L->g;
    const cw__node *n = &g->nodes[i];
    cw__conv_unit u;
    memset(&u, 0, sizeof u);
    u.node = i;
    int addn = L->nd[i].epi_into;
    u.outn = addn >= 0 ? addn : i;
    cw__fusion_chain(L, n->in[0], &u.src, &u.gn, &u.silu, &u.up);
    u.prep = u.gn >= 0 || u.silu || u.up > 1;
    const cw__node *an = addn >= 0 ? &g->nodes[addn] : NULL;
    u.other = an ? (an->in[0] == i ? an->in[1] : an->in[0]) : -1;
    u.inplace = u.other >= 0 && L->nd[u.other].moved;
    u.pass1 = L->nd[i].rec;
    u.rec = L->nd[i].rec_of;
    if (u.inplace && u.rec >= 0) {
        int asrc, ag, as, au;
        cw__fusion_chain(L, g->nodes[u.rec].in[0], &asrc, &ag, &as, &au);
        u.rec_x = asrc == u.other;
    }
    cw__conv_problem full;
    cw__conv_problem_init(&full, &g->nodes[n->in[0]].desc, &g->nodes[n->in[1]].desc, n->in[2] >= 0, &n->desc, &n->conv);
    int64_t h_out = n->desc.dims[cw__hdim(&n->desc)];
    cw__conv_share sh = cw__share(L, u.prep || u.rec >= 0, u.inplace || u.pass1, h_out);
    if (u.rec >= 0 && sh.avail > 0) sh.avail = cw__rec_split(L, i, u.rec, sh.avail, 0);
    if (u.rec_x && sh.n_pbufs < 2) sh.n_pbufs = 2; /* one stream: the next band's recompute is in flight too */
    cw_status st = cw__planner_plan(g->ctx->be, &full, &sh, &u.cp, NULL);
    if (st == CW_OK && u.pass1) L->nd[i].rec_algo = u.cp.algo;
    if (st == CW_OK) {
        int P = u.cp.patches;
        u.ws = cw__malloc((size_t)P * sizeof *u.ws);
        u.pbuf = cw__malloc((size_t)P * sizeof *u.pbuf);
        u.ybuf = cw__malloc((size_t)P * sizeof *u.ybuf);
        u.prep_task = cw__malloc((size_t)P * sizeof *u.prep_task);
        if (!u.ws || !u.pbuf || !u.ybuf || !u.prep_task) st = cw__oom(L);
        for (int q = 0; q < P && st == CW_OK; q++) u.ws[q] = u.pbuf[q] = u.ybuf[q] = u.prep_task[q] = -1;
    }
    if (st == CW_OK && u.rec_x) st = cw__rec_x_rows(L, &u);
    if (st == CW_OK && u.inplace) st = cw__touching(L, L->nd[u.other].buf, &u.war, &u.n_war);
    if (st == CW_OK && u.gn >= 0) st = cw__gn_ready(L, u.gn);
    if (st == CW_OK) st = cw__gn_begin(L, u.outn, u.cp.patches);
    if (st == CW_OK) st = cw__conv_record(L, &u, &full);
    if (st == CW_OK) st = cw__emit_patches(L, &u);
    cw__conv_plan_free(&u.cp);
    cw__free(u.ws), cw__free(u.pbuf), cw__free(u.ybuf), cw__free(u.prep_task), cw__free(u.war);
    cw__free(u.xr_task), cw__free(u.xr_lo), cw__free(u.xr_hi);
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
        t->u.add.dst = cw__whole(L->nd[i].buf, d);
        t->u.add.a = cw__whole(L->nd[n->in[0]].buf, d);
        t->u.add.b = cw__whole(L->nd[n->in[1]].buf, d);
        t->flops = (double)cw__desc_numel(d);
        snprintf(t->name, sizeof t->name, "add L%d", i);
        CW__TRY(cw__dep_rows(L, id, n->in[0], 0, h));
        CW__TRY(cw__dep_rows(L, id, n->in[1], 0, h));
    } else if (n->kind == CW__N_OP) { /* one task over the whole tensors */
        const cw_op_info info = cw_op_get_info(n->op);
        CW__TRY(cw__new_task(L, CW__T_OP, CW_STAGE_OTHER, L->light, i, &t, &id));
        t->u.op.code = n->op;
        t->u.op.param = n->param;
        t->u.op.out = cw__whole(L->nd[i].buf, d);
        for (int k = 0; k < info.n_in; k++) {
            const int x = n->in[k];
            const cw_tensor_desc *xd = &g->nodes[x].desc;
            t->u.op.in[k] = cw__whole(L->nd[x].buf, xd);
            if (g->nodes[x].kind != CW__N_CONST) CW__TRY(cw__dep_rows(L, id, x, 0, xd->dims[cw__hdim(xd)]));
        }
        t->flops = (double)cw__desc_numel(d) * info.flops;
        snprintf(t->name, sizeof t->name, "%s L%d", n->name, i);
    } else {
        int x = n->in[0];
        if (n->kind == CW__N_GN) CW__TRY(cw__gn_ready(L, i));
        CW__TRY(cw__new_task(L, CW__T_PREP, CW_STAGE_OTHER, L->light, i, &t, &id));
        t->u.prep.src = cw__whole(L->nd[x].buf, &g->nodes[x].desc);
        t->u.prep.dst = cw__whole(L->nd[i].buf, d);
        t->u.prep.ss_buf = n->kind == CW__N_GN ? L->nd[i].gn_ss : -1;
        t->u.prep.silu = n->kind == CW__N_SILU;
        t->u.prep.up = n->kind == CW__N_UP2 ? 2 : 1;
        t->flops = (double)cw__desc_numel(d) * 4.0;
        snprintf(t->name, sizeof t->name, "%s L%d", n->name, i);
        CW__TRY(cw__dep_rows(L, id, x, 0, g->nodes[x].desc.dims[cw__hdim(&g->nodes[x].desc)]));
        if (n->kind == CW__N_GN) CW__TRY(cw__dep(L, id, L->nd[i].gn_fin));
    }
    CW__TRY(cw__gn_begin(L, i, 1));
    CW__TRY(cw__writer(L, i, id, 0, h));
    return cw__gn_band_stats(L, i, id, 0, h, 0);
}

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
    CW__TRY(cw__new_task(L, CW__T_PREP, CW_STAGE_PREP, L->light, node, &t, id));
    t->u.prep.src = src;
    t->u.prep.dst = dst;
    t->u.prep.ss_buf = -1;
    t->u.prep.up = 1;
    int64_t e = 1;
    for (int k = 0; k < dst.rank; k++) e *= dst.dims[k];
    t->flops = (double)e;
    snprintf(t->name, sizeof t->name, "attention L%d n%" PRId64 " %s", node, n, what);
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
        CW__TRY(cw__temp(L, cw__desc_bytes(sd), sd, &kv[a]));
        CW__TRY(cw__emit_convert(L, i, opnd[1 + a], cw__whole(kv[a], sd), what[a], b, &cv[a]));
        CW__TRY(cw__dep_rows(L, cv[a], x, 0, g->nodes[x].desc.dims[cw__hdim(&g->nodes[x].desc)]));
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
        CW__TRY(cw__emit_convert(L, i, q, cw__whole(qb, &L->p->bufs[qb].d), "q to f32", b, &cq));
        CW__TRY(cw__dep_rows(L, cq, n->in[0], 0, g->nodes[n->in[0]].desc.dims[cw__hdim(&g->nodes[n->in[0]].desc)]));
    }
    cw__task *t = NULL;
    int id = -1;
    CW__TRY(cw__new_task(L, CW__T_ATTN, CW_STAGE_ATTENTION, cw__next_heavy(L), i, &t, &id));
    t->u.attn.q = half ? cw__whole(qb, &L->p->bufs[qb].d) : opnd[0];
    t->u.attn.k = opnd[1], t->u.attn.v = opnd[2];
    t->u.attn.o = half ? cw__whole(ob, &L->p->bufs[ob].d) : opnd[3];
    t->u.attn.n = b, t->u.attn.t0 = t0, t->u.attn.t1 = t1, t->u.attn.T = T, t->u.attn.C = d->dims[1];
    t->u.attn.s_buf = sb;
    t->u.attn.scale = n->scale;
    t->flops = 4.0 * (double)(t1 - t0) * (double)T * (double)d->dims[1];
    snprintf(t->name, sizeof t->name, "attention L%d n%" PRId64 " tokens %" PRId64 "-%" PRId64, i, b, t0, t1);
    if (half) {
        CW__TRY(cw__dep(L, id, cq));
        CW__TRY(cw__dep(L, id, cv[0]));
        CW__TRY(cw__dep(L, id, cv[1]));
        int oc = -1;
        CW__TRY(cw__emit_convert(L, i, cw__whole(ob, &L->p->bufs[ob].d), o, "output from f32", b, &oc));
        CW__TRY(cw__dep(L, oc, id));
        *out_task = oc;
        return cw__writer(L, i, oc, d->rank == 4 ? o.start[2] : 0, d->rank == 4 ? o.start[2] + o.dims[2] : h);
    }
    for (int a = 0; a < 3; a++)
        CW__TRY(cw__dep_rows(L, id, n->in[a], 0, g->nodes[n->in[a]].desc.dims[cw__hdim(&g->nodes[n->in[a]].desc)]));
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
static cw_status cw__lower_attention(cw__lower *L, int i) {
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
    CW__TRY(cw__attn_chunk(L, T, C, unit, half ? 2 * cw__alloc_round(cw__desc_bytes(&sd)) : 0, &tc));
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

/* ---- driver ----------------------------------------------------------------------------- */

/* Marks the nodes some output depends on (the others are not lowered). */
static void cw__mark_live(cw__lower *L) {
    const cw_graph *g = L->g;
    for (int o = 0; o < g->n_outputs; o++) L->nd[g->outputs[o]].live = 1;
    for (int i = g->n - 1; i >= 0; i--)
        for (int a = 0; a < 4 && L->nd[i].live; a++)
            if (g->nodes[i].in[a] >= 0) L->nd[g->nodes[i].in[a]].live = 1;
}

/* Buffers of inputs and constants, the plan's ports, and how often each node is read. */
static cw_status cw__bind_externals(cw__lower *L) {
    cw_graph *g = L->g;
    cw_plan *p = L->p;
    for (int i = 0; i < g->n; i++) {
        cw__node *nd = &g->nodes[i];
        cw__lnode *ln = &L->nd[i];
        if (nd->kind == CW__N_INPUT) {
            CW__TRY(cw__new_buf(L, CW__B_INPUT, nd->index, &nd->desc, 0, &ln->buf));
            p->in[nd->index].d = nd->desc;
            snprintf(p->in[nd->index].name, sizeof p->in[nd->index].name, "%s", nd->name);
        } else if (nd->kind == CW__N_CONST && ln->live) {
            CW__TRY(cw__new_buf(L, CW__B_CONST, i, &nd->desc, 0, &ln->buf));
            p->bufs[ln->buf].t = nd->t;
            p->weights_bytes += cw__desc_span_bytes(&nd->desc);
        }
        int rd[4];
        int k = ln->live ? cw__fusion_unit_reads(L, i, rd) : -1;
        for (int a = 0; a < k; a++) L->nd[rd[a]].reads++;
        if (k >= 0 && rd[3] >= 0) L->nd[rd[3]].gn_refs++;
    }
    for (int o = 0; o < g->n_outputs; o++) {
        const cw__node *on = &g->nodes[g->outputs[o]];
        p->out[o].d = on->desc;
        snprintf(p->out[o].name, sizeof p->out[o].name, "%s", on->oname);
    }
    return CW_OK;
}

/* After a unit: frees what it was the last to read, and the scale/shift of its GN. The
 * last reader of a recomputed conv releases what that conv's recomputes read. */
static cw_status cw__release_reads(cw__lower *L, const int rd[4], int k) {
    const cw_graph *g = L->g;
    for (int a = 0; a < k; a++) {
        int m = rd[a];
        const cw__node *nm = &g->nodes[m];
        if (L->nd[m].rec) {
            if (--L->nd[m].reads == 0) CW__TRY(cw__release_reads(L, L->nd[m].rec_rd, L->nd[m].rec_k));
            continue;
        }
        if (--L->nd[m].reads != 0 || nm->kind == CW__N_INPUT || nm->kind == CW__N_CONST || nm->is_output ||
            L->nd[m].moved || L->nd[m].buf < 0 || L->p->bufs[L->nd[m].buf].kind != CW__B_ACT)
            continue;
        /* a GN still to be finalized from m must take its stats first */
        for (int q = m + 1; q < g->n; q++)
            if (g->nodes[q].kind == CW__N_GN && g->nodes[q].in[0] == m && L->nd[q].gn_refs > 0)
                CW__TRY(cw__gn_ready(L, q));
        CW__TRY(cw__release(L, L->nd[m].buf));
    }
    if (rd[3] >= 0 && --L->nd[rd[3]].gn_refs == 0) CW__TRY(cw__release(L, L->nd[rd[3]].gn_ss));
    return CW_OK;
}

/* How many of node m's reads a unit reading rd[0, k) releases: its own, and those of the
 * recomputes it is the last reader of (cw__release_reads). */
static int cw__reads_released(const cw__lower *L, const int rd[4], int k, int m) {
    int n = 0;
    for (int a = 0; a < k; a++) {
        const cw__lnode *r = &L->nd[rd[a]];
        n += rd[a] == m;
        if (r->rec && r->reads == 1) n += cw__reads_released(L, r->rec_rd, r->rec_k, m);
    }
    return n;
}

/* The residual operand of ADD node i (whose conv epilogue is unit u) whose storage the
 * add's result may take, or -1. Legal when that operand is an activation of the same shape
 * that nothing after this unit reads, and the conv does not read it directly (its halo rows
 * would be overwritten under it). A conv that recomputes conv A per band may take A's own
 * input, which A's unit still holds (its reads are released after this unit): the recomputes
 * read it band by band, ordered before each band's write (cw__emit_patches). The
 * unscheduled reference keeps a buffer per node. */
static int cw__inplace_operand(const cw__lower *L, int i, int u) {
    const cw_graph *g = L->g;
    const cw__node *an = &g->nodes[i];
    int m = an->in[0] == u ? an->in[1] : an->in[0];
    const cw__node *nm = &g->nodes[m];
    const cw__lnode *lm = &L->nd[m];
    int rd[4];
    int reads = cw__reads_released(L, rd, cw__fusion_unit_reads(L, u, rd), m);
    if (L->none || m < 0 || lm->buf < 0 || lm->moved || lm->reads != reads || nm->is_output ||
        L->p->bufs[lm->buf].kind != CW__B_ACT || nm->desc.rank != an->desc.rank || nm->desc.dtype != an->desc.dtype)
        return -1;
    for (int d = 0; d < an->desc.rank; d++)
        if (nm->desc.dims[d] != an->desc.dims[d]) return -1;
    int src, gn, silu, up;
    cw__fusion_chain(L, g->nodes[u].in[0], &src, &gn, &silu, &up);
    if (src == m) return -1;
    for (int q = m + 1; q < g->n; q++) /* GroupNorm statistics still to be taken from m */
        if (g->nodes[q].kind == CW__N_GN && g->nodes[q].in[0] == m && L->nd[q].gn_refs > 0 && L->nd[q].gn_fin < 0)
            return -1;
    return m;
}

/* Lowers the unit at node i's position: its result buffer, its tasks, the frees after it. */
static cw_status cw__lower_node(cw__lower *L, int i) {
    const cw_graph *g = L->g;
    const cw__node *nd = &g->nodes[i];
    cw__lnode *ln = &L->nd[i];
    if (nd->kind == CW__N_INPUT || nd->kind == CW__N_CONST || ln->fused || !ln->live) return CW_OK;
    /* a conv with a residual epilogue is lowered at its ADD's position, where the residual
     * operand (which may come after the conv) already exists */
    if (nd->kind == CW__N_CONV && ln->epi_into >= 0) return CW_OK;
    int u = nd->kind == CW__N_ADD && ln->epi >= 0 ? ln->epi : i; /* the unit lowered */
    int rd[4];
    int k = cw__fusion_unit_reads(L, u, rd);
    if (k < 0) return CW_OK;
    if (g->nodes[u].kind == CW__N_CONV && L->nd[u].rec) {
        /* recomputed: no buffer; its first pass only takes statistics (none without a
         * GroupNorm reading it: its readers then make its input's scale/shift ready here),
         * and what it reads stays until its last reader's unit has run */
        int src, gn, silu, up;
        cw__fusion_chain(L, g->nodes[u].in[0], &src, &gn, &silu, &up);
        if (L->nd[u].rec_stats) CW__TRY(cw__lower_conv(L, u));
        else if (gn >= 0) CW__TRY(cw__gn_ready(L, gn));
        if (!L->nd[u].rec_stats) L->nd[u].rec_algo.id = -1;
        for (int a = 0; a < 4; a++) L->nd[u].rec_rd[a] = rd[a];
        L->nd[u].rec_k = k;
        return CW_OK;
    }
    int other = u != i ? cw__inplace_operand(L, i, u) : -1;
    if (nd->is_output) {
        CW__TRY(cw__new_buf(L, CW__B_OUTPUT, nd->index, &nd->desc, 0, &ln->buf));
    } else if (other >= 0) {
        ln->buf = L->nd[other].buf; /* the add's result overwrites its dying operand */
        L->nd[other].moved = 1;
    } else {
        CW__TRY(cw__new_buf(L, CW__B_ACT, -1, &nd->desc, cw__desc_bytes(&nd->desc), &ln->buf));
        CW__TRY(cw__act(L, CW__A_ALLOC, ln->buf, 0));
    }
    L->nd[u].buf = ln->buf;
    cw__nkind kind = g->nodes[u].kind;
    if (kind == CW__N_CONV) CW__TRY(cw__lower_conv(L, u));
    else if (kind == CW__N_ATTN) CW__TRY(cw__lower_attention(L, u));
    else CW__TRY(cw__lower_elementwise(L, u));
    return cw__release_reads(L, rd, k);
}

static cw_status cw__lower_init(cw__lower *L, cw_plan *p, cw_graph *g, int64_t budget) {
    memset(L, 0, sizeof *L);
    int none = p->opt.policy == CW_PATCHES_NONE;
    L->p = p;
    L->g = g;
    L->budget = budget;
    L->heavy = p->n_streams > 1 ? p->n_streams - 1 : 1;
    L->light = p->n_streams > 1 ? p->n_streams - 1 : 0;
    /* fixed here, never from what else runs: a conv or GEMM task on each heavy stream at
     * once fills the backend's threads without oversubscribing them */
    int bt = g->ctx->be->threads;
    L->threads = bt > 0 ? (bt / L->heavy > 0 ? bt / L->heavy : 1) : 0;
    L->fuse = !none && p->opt.fuse;
    L->none = none;
    L->nd = cw__calloc((size_t)g->n + 1, sizeof *L->nd);
    p->in = cw__calloc((size_t)g->n_inputs + 1, sizeof *p->in);
    p->out = cw__calloc((size_t)g->n_outputs + 1, sizeof *p->out);
    if (!L->nd || !p->in || !p->out) return cw__oom(L);
    for (int i = 0; i < g->n; i++) {
        cw__lnode *ln = &L->nd[i];
        ln->buf = ln->epi = ln->epi_into = -1;
        ln->gn_part = ln->gn_ss = ln->gn_fin = ln->gn_nparts = ln->gn_stats_first = -1;
    }
    return CW_OK;
}

static void cw__lower_free(cw__lower *L) {
    for (int i = 0; L->nd && i < L->g->n; i++) cw__free(L->nd[i].wr);
    cw__free(L->nd);
}

/* Lowers every live node in graph order, then frees the partials of GroupNorms nobody
 * finalized, then places events and frees (cw__plan_sync). */
static cw_status cw__lower_graph(cw__lower *L) {
    cw_graph *g = L->g;
    cw__mark_live(L);
    cw__fusion_analyse(L);
    cw__fusion_recompute(L);
    L->p->rec_nodes = cw__malloc((size_t)g->n * sizeof *L->p->rec_nodes + 1);
    if (!L->p->rec_nodes) return cw__oom(L);
    for (int i = 0; i < g->n; i++)
        if (L->nd[i].rec) L->p->rec_nodes[L->p->n_recomputed++] = i;
    CW__TRY(cw__bind_externals(L));
    for (int i = 0; i < g->n; i++) CW__TRY(cw__lower_node(L, i));
    for (int i = 0; i < g->n; i++)
        if (g->nodes[i].kind == CW__N_GN && L->nd[i].gn_part >= 0 && L->nd[i].gn_fin < 0)
            CW__TRY(cw__release(L, L->nd[i].gn_part));
    CW__TRY(cw__plan_sync(L->p));
    L->p->fork_event = L->p->n_events; /* the fork and the joins (execute.c) */
    L->p->n_events += L->p->n_streams;
    return cw__plan_place_activations(L->p);
}

cw_status cw__plan_build(cw_graph *g, const cw_compile_options *opt, int64_t budget, int64_t cap,
                         const unsigned char *rec_allow, cw_plan **out) {
    *out = NULL;
    cw_context *ctx = g->ctx;
    cw_plan *p = cw__calloc(1, sizeof *p);
    if (!p) return cw__error(ctx, CW_ERR_OUT_OF_MEMORY, "compile: out of host memory");
    p->ctx = ctx;
    p->opt = *opt;
    p->dtype = g->dtype_node >= 0 ? g->dtype : CW_F32;
    p->budget = cap;
    p->n_streams = opt->policy == CW_PATCHES_NONE ? 1 : (opt->streams > 0 ? opt->streams : ctx->cfg.streams);
    p->n_inputs = g->n_inputs;
    p->n_outputs = g->n_outputs;
    cw__lower L;
    cw_status st = cw__lower_init(&L, p, g, budget);
    L.rec_allow = rec_allow;
    if (st == CW_OK) st = cw__lower_graph(&L);
    cw__lower_free(&L);
    if (st != CW_OK) {
        cw__plan_free(p);
        return st;
    }
    *out = p;
    return CW_OK;
}
