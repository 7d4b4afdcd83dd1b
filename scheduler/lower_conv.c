/* Lowering one conv unit: a conv with its fused prep chain (GroupNorm apply, SiLU,
 * upsample) and residual epilogue becomes per-patch prep, conv and epilogue tasks, with
 * its GroupNorm statistics; a recomputed conv's bands are recomputed inside each reader's
 * prep (nested where they read a recomputed conv themselves). */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "scheduler/lower.h"
#include "scheduler/planner.h"

/* Where a band conv's input rows come from: xbuf < 0: its own prep or recompute; else rows
 * of band buffer xbuf (first row xrow0 along H), written by task xtask: no prep. */
typedef struct cw__band_in {
    int xbuf, xtask;
    int64_t xrow0;
} cw__band_in;

/* While conv B emits one band's recompute of A and B's epilogue shortcut S reads a
 * recomputed x: the recompute of x nested in it also computes S's rows [o0, o1) of that band
 * from it, before A's GN/SiLU overwrite it, so that x is not computed a third time for S
 * (cw__emit_sc_band). band gets S's band buffer (-1 until computed), conv its conv task. */
typedef struct cw__sc_req {
    int x, S, B;
    int64_t o0, o1;
    int band, conv;
} cw__sc_req;

/* One conv unit being lowered: node i, its fused prep chain, its residual epilogue. */
typedef struct cw__conv_unit {
    int node, outn;          /* conv node; node whose buffer it writes (the ADD when fused) */
    int src, gn, silu, up;   /* the prep chain (cw__fusion_chain) */
    int unary;               /* its unary link, parameters ua, ub (cw__fusion_unary) */
    float ua, ub;
    int64_t up_d, off_d;     /* its upsampling along D (cw__fusion_dmap) */
    int pad;                 /* the chain's replicate pad node (cw__fusion_pad), -1 */
    int prep;                /* 1 when the chain is not empty */
    int other;               /* the residual operand, -1 without epilogue */
    int scale;               /* what each output band is multiplied by before the add, -1: none
                                (cw__fusion_epi_scale) */
    int inplace;             /* 1: the add's result is written into other's storage: each
                                patch's conv writes a band buffer, the epilogue adds it in */
    int pass1;               /* 1: a recomputed conv's first pass: each band goes to a band
                                buffer only for its GroupNorm statistics, then is dropped */
    int rec;                 /* the recomputed conv whose bands this conv's prep computes, -1 */
    cw__conv_plan cp;        /* the planner's bands and algorithm */
    int *ws, *pbuf, *prep_task; /* per patch: workspace and prep buffer, prep task (-1) */
    int *ybuf;               /* per patch (inplace, pass1): its output band buffer */
    const cw_tensor_desc *ydesc; /* a band conv's (NULL: its output band's) dims of that buffer,
                                    holding rows from yrow0 on */
    int64_t yrow0;
    int *war;                /* inplace: earlier tasks touching other's storage */
    int n_war;
    int rec_x;               /* 1: inplace, and other is the recomputed conv's own input: a
                                band's epilogue overwrites rows that later patches' recomputes
                                still read (cw__emit_patches orders them) */
    int *xr_task;            /* rec_x, per patch: the task of its recompute that reads other's
                                rows (its prep, or its conv without one), -1 before emitted */
    int64_t *xr_lo, *xr_hi;  /* rec_x, per patch: those rows of other */
    int sx;                  /* the epilogue shortcut S reads a recomputed x: each patch's S band is
                                computed inside its recompute, from the band of x computed there
                                for A (cw__sc_req) */
    int *sband, *sconv;      /* sx, per patch: that S band's buffer (-1: not computed) and conv */
    cw__sc_req *sc;          /* the shortcut band its recompute computes on the way (NULL: none) */
    cw__band_in in;          /* its input rows, when given (in.xbuf >= 0) */
    cw__conv_info *ci;
} cw__conv_unit;

/* Unit u for conv node i, writing its own result, without epilogue or given rows: its prep
 * chain from its conv's x (cw__fusion_chain, _dmap, _pad) and whether it is not empty. */
static void cw__unit_init(const cw__lower *L, int i, cw__conv_unit *u) {
    const int x = L->g->nodes[i].in[0];
    memset(u, 0, sizeof *u);
    u->node = u->outn = i;
    u->other = u->scale = u->rec = -1;
    u->in.xbuf = -1;
    cw__fusion_chain(L, x, &u->src, &u->gn, &u->silu, &u->up);
    cw__fusion_unary(L, x, &u->unary, &u->ua, &u->ub);
    cw__fusion_dmap(L, x, &u->up_d, &u->off_d);
    u->pad = cw__fusion_pad(L, x);
    u->prep = u->gn >= 0 || u->silu || u->unary || u->up > 1 || u->up_d > 1 || u->pad >= 0;
}

/* The axes conv unit u may be cut along (cw__conv_share.axes). D (time) only for 5-D convs,
 * and only where every reader of the patch's rows follows the axis: a recomputed conv's two
 * passes and the convs reading its bands (rec, pass1, rec_x) stay on H bands, their band
 * arithmetic (cw__rec_band, cw__rec_x_rows) being along H. cw_compile_options.patch_axis
 * forces one (H also where D is not possible); auto leaves both to the planner, except
 * under max_patch_rows (a cap on H rows) and CW_PATCHES_FIXED, which count H bands. */
static int cw__axes(const cw__lower *L, const cw__conv_unit *u, int rank) {
    const cw_compile_options *o = &L->p->opt;
    if (rank != 5 || u->rec >= 0 || u->pass1 || u->rec_x || u->pad >= 0 || u->up_d > 1 || L->none) return CW__AX_H;
    if (o->patch_axis == CW_PATCH_AXIS_D) return CW__AX_D;
    /* a distributed plan's bands follow one axis: H unless D is asked for (distribute.c) */
    if (o->patch_axis == CW_PATCH_AXIS_H || o->max_patch_rows > 0 || o->policy == CW_PATCHES_FIXED || o->comm)
        return CW__AX_H;
    return CW__AX_H | CW__AX_D;
}

/* The producer rows [*s0, *s1) that rows [a, b) (b > a) of a conv's input read through its
 * prep chain: the upsample by up, and a fused replicate pad (pad node, -1: none) whose
 * indices clamp into the h_up rows of the upsampled producer. */
static void cw__src_rows(const cw__lower *L, int pad, int64_t h_up, int64_t up, int64_t a, int64_t b, int64_t *s0,
                         int64_t *s1) {
    if (pad < 0) {
        *s0 = a / up, *s1 = (b - 1) / up + 1;
        return;
    }
    const int64_t ph = cw_pad_get(L->g->nodes[pad].param.i[1], 1);
    *s0 = cw_prep_src(a, 0, ph, h_up, up, 0);
    *s1 = cw_prep_src(b - 1, 0, ph, h_up, up, 0) + 1;
}

/* This conv's share of the budget (see cw__conv_share); h_out: output rows along the only
 * axis, or along H where the planner may choose. */
static cw__conv_share cw__share(const cw__lower *L, int prep, int ybuf, int64_t h_out, int axes) {
    const cw_compile_options *o = &L->p->opt;
    cw__conv_share sh;
    memset(&sh, 0, sizeof sh);
    sh.axes = axes;
    sh.avail = L->budget < 0 ? -1 : L->budget - CW__SMALL_RESERVE(L->budget);
    sh.heavy = L->heavy;
    /* H convs in flight plus H preps ahead (one stream: one of each) */
    sh.n_pbufs = L->heavy > 1 || L->light != 0 ? 2 * L->heavy : 1;
    sh.prep = prep;
    sh.ybuf = ybuf;
    sh.p_min = o->max_patch_rows > 0 ? (int)((h_out + o->max_patch_rows - 1) / o->max_patch_rows) : 1;
    /* distributed: a band per rank at least, so that every rank has its share of each conv */
    if (o->comm && o->policy != CW_PATCHES_FIXED) { /* a multiple of the ranks: a band per rank at
                                                        least, bands meeting where ranks do */
        int R = o->comm->n_ranks, m = (sh.p_min + R - 1) / R * R;
        sh.p_min = (int)(m < h_out ? m : h_out);
        sh.p_mult = R;
    }
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
    ci->axis = u->cp.axis;
    ci->out_rows = u->cp.bounds[P];
    ci->fused_prep = u->prep;
    ci->tasks = cw__malloc((size_t)P * sizeof(int));
    if (!ci->tasks) return cw__oom(L);
    u->ci = ci;
    cw__halo h;
    if (cw__patch_halo_ax(full, u->cp.axis, u->cp.bounds, P, u->prep ? 8.0 : 0.0, &h) == CW_OK) {
        ci->halo_pct = h.halo_pct;
        p->halo_flop += h.prep_flops_extra;
    }
    p->conv_gflop += cw__conv_flops(full) * 1e-9;
    return CW_OK;
}

/* A prep task's replicate padding (cw__prep_params.pad, up_h): pad node's pads before D, H
 * and W, its clamp into the up_h rows of the upsampled producer. */
static void cw__prep_pad(const cw__lower *L, cw__task *t, int pad, int64_t up_h) {
    for (int k = 0; k < 3; k++) t->u.prep.pad[k] = cw_pad_get(L->g->nodes[pad].param.i[1], k);
    t->u.prep.up_h = up_h;
}

/* The prep task of patch q: GN apply + SiLU + upsample of its input rows into a buffer. Along
 * D the upsample (of H and W only) maps frame f to frame f: the band's frames [a, b) of the
 * producer, every row, so the row map starts at 0 on both sides. A fused replicate pad or an
 * upsample along D (H bands only, cw__axes) maps each index into the upsampled producer. */
static cw_status cw__emit_prep(cw__lower *L, cw__conv_unit *u, int q) {
    const cw__patch *pt = &u->cp.patch[q];
    const int ax = u->cp.axis, along_h = ax == cw__hdim(&pt->prob.x);
    if (!u->prep || pt->b <= pt->a) return CW_OK;
    cw_tensor_desc bd = pt->prob.x;
    memset(bd.strides, 0, sizeof bd.strides);
    cw__desc_fill_strides(&bd);
    CW_TRY(cw__temp(L, cw__desc_bytes(&bd), &bd, &u->pbuf[q]));
    cw__task *t = NULL;
    int id = -1;
    CW_TRY(cw__new_task(L, CW__T_PREP, CW_STAGE_PREP, L->light, u->node, &t, &id));
    const int fup = along_h ? u->up : 1; /* the upsample factor along the axis */
    int64_t s0 = pt->a / fup, s1 = (pt->b - 1) / fup + 1;
    if (u->pad >= 0) { /* the band's padded rows, clamped into the upsampled producer */
        const int64_t up_h = L->g->nodes[u->src].desc.dims[ax] * u->up;
        cw__prep_pad(L, t, u->pad, up_h);
        cw__src_rows(L, u->pad, up_h, u->up, pt->a, pt->b, &s0, &s1);
    }
    t->u.prep.src = cw__band(L->nd[u->src].buf, &L->g->nodes[u->src].desc, ax, s0, s1);
    t->u.prep.dst = cw__whole(u->pbuf[q], &bd);
    t->u.prep.ss_buf = u->gn >= 0 ? L->nd[u->gn].gn_ss : -1;
    t->u.prep.silu = u->silu;
    t->u.prep.unary = u->unary, t->u.prep.ua = u->ua, t->u.prep.ub = u->ub;
    t->u.prep.up = u->up;
    t->u.prep.up_d = u->up_d, t->u.prep.off_d = u->off_d;
    t->u.prep.dst_row0 = along_h ? pt->a : 0;
    t->u.prep.src_row0 = along_h ? s0 : 0;
    t->flops = (double)cw__desc_numel(&bd) * 8.0;
    CW_TRY(cw__task_set_name(L->p, t, "prep%s%s%s%s%s%s L%d patch %d/%d", u->gn >= 0 ? " gn" : "",
             u->silu ? " silu" : "", u->unary ? " unary" : "", u->up > 1 ? " up2" : "", u->up_d > 1 ? " up_d" : "",
             u->pad >= 0 ? " pad" : "", u->node, q + 1, u->cp.patches));
    CW_TRY(cw__dep_band(L, id, u->src, ax, s0, s1));
    if (u->gn >= 0) CW_TRY(cw__dep(L, id, L->nd[u->gn].gn_fin));
    u->prep_task[q] = id;
    return CW_OK;
}

/* The conv task of patch j (after its workspace); *id gets it. */
static cw_status cw__emit_conv(cw__lower *L, cw__conv_unit *u, int j, int *id) {
    const cw_graph *g = L->g;
    const cw__node *n = &g->nodes[u->node];
    const cw_tensor_desc *xd = &g->nodes[n->in[0]].desc, *wd = &g->nodes[n->in[1]].desc;
    const cw__patch *pt = &u->cp.patch[j];
    const int ax = u->cp.axis;
    if (u->cp.ws > 0) CW_TRY(cw__temp(L, u->cp.ws, NULL, &u->ws[j]));
    int64_t y0 = u->ydesc ? u->yrow0 : pt->o0; /* the band buffer's first row */
    if (u->inplace || u->pass1) {
        cw_tensor_desc yb = u->ydesc ? *u->ydesc : pt->prob.y;
        memset(yb.strides, 0, sizeof yb.strides);
        cw__desc_fill_strides(&yb);
        CW_TRY(cw__temp(L, cw__desc_bytes(&yb), &yb, &u->ybuf[j]));
    }
    cw__task *t = NULL;
    int ext;
    CW_TRY(cw__conv_ext_new(L->p, &ext));
    CW_TRY(cw__new_task(L, CW__T_CONV, CW_STAGE_CONV, cw__next_heavy(L), u->node, &t, id));
    t->u.conv.ext = ext;
    cw__conv_ext *ce = cw__conv_of(L->p, t);
    ce->prob = pt->prob;
    ce->algo = u->cp.algo;
    ce->algo.workspace = u->cp.ws;
    if (u->in.xbuf >= 0) {
        t->u.conv.x = cw__band(u->in.xbuf, &L->p->bufs[u->in.xbuf].d, ax, pt->a - u->in.xrow0, pt->b - u->in.xrow0);
    } else if ((u->prep && pt->b > pt->a) || u->rec >= 0) {
        t->u.conv.x = cw__whole(u->pbuf[j], &L->p->bufs[u->pbuf[j]].d);
    } else {
        t->u.conv.x = cw__band(L->nd[u->src].buf, xd, ax, pt->a, pt->b > pt->a ? pt->b : pt->a);
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
    t->u.conv.y = u->inplace || u->pass1
                      ? cw__band(u->ybuf[j], &L->p->bufs[u->ybuf[j]].d, ax, pt->o0 - y0, pt->o1 - y0)
                      : cw__band(L->nd[u->outn].buf, &n->desc, ax, pt->o0, pt->o1);
    t->u.conv.ws_buf = u->ws[j];
    t->flops = cw__conv_flops(&pt->prob);
    CW_TRY(cw__task_set_name(L->p, t, "%s L%d patch %d/%d", n->name, u->node, j + 1, u->cp.patches));
    if (u->ci) u->ci->tasks[j] = *id;
    if (u->in.xbuf >= 0) return cw__dep(L, *id, u->in.xtask);
    if (u->prep_task[j] >= 0) return cw__dep(L, *id, u->prep_task[j]);
    if (pt->b > pt->a) return cw__dep_band(L, *id, u->src, ax, pt->a, pt->b);
    return CW_OK;
}

static cw_status cw__emit_band_conv(cw__lower *L, int b, int A, int64_t r0, int64_t r1, cw__band_in in,
                                    cw__sc_req *sc, const cw_tensor_desc *yd, int64_t yrow0, int *ybuf, int *conv,
                                    int *ptask, cw__patch *ap);
static cw_status cw__emit_sc_conv(cw__lower *L, int B, int S, int64_t o0, int64_t o1, cw__band_in in, int *sbuf,
                                  int *sconv);

/* Patch j's output band y (the conv's band buffer, or its rows of the add's result) times
 * u->scale's rows of the band, in place, after task *after (the conv); *after gets this task.
 * The binary kernels read each element before they write it, so the alias is exact. */
static cw_status cw__emit_scale(cw__lower *L, cw__conv_unit *u, int j, cw__vref y, int *after) {
    const cw_graph *g = L->g;
    const cw__patch *pt = &u->cp.patch[j];
    const int m = L->nd[u->node].epi_mul, ax = u->cp.axis;
    cw__task *t = NULL;
    int id = -1;
    CW_TRY(cw__new_task(L, CW__T_OP, CW_STAGE_EPILOGUE, L->light, m, &t, &id));
    t->u.op.code = CW_OP_BINARY;
    t->u.op.param = g->nodes[m].param;
    t->u.op.out = t->u.op.in[0] = y;
    t->u.op.in[1] = cw__band(L->nd[u->scale].buf, &g->nodes[u->scale].desc, ax, pt->o0, pt->o1);
    t->flops = (double)cw__desc_numel(&g->nodes[m].desc) * (double)(pt->o1 - pt->o0) / (double)u->ci->out_rows;
    CW_TRY(cw__task_set_name(L->p, t, "scale L%d patch %d/%d", m, j + 1, u->cp.patches));
    CW_TRY(cw__dep(L, id, *after));
    if (g->nodes[u->scale].kind != CW__N_CONST) CW_TRY(cw__dep_band(L, id, u->scale, ax, pt->o0, pt->o1));
    *after = id;
    return CW_OK;
}

/* The residual add of patch j after its conv task `conv`; *id gets it. Where the operand is
 * an epilogue shortcut S (nd[].rec_epi), S's rows [o0, o1) are computed first, into a band
 * buffer, from x's rows (S maps rows one to one) -- or, where x is recomputed, they were
 * computed in patch j's recompute (u->sband). */
static cw_status cw__emit_epilogue(cw__lower *L, cw__conv_unit *u, int j, int conv, int *id) {
    const cw_graph *g = L->g;
    const cw__node *n = &g->nodes[u->node];
    const cw__patch *pt = &u->cp.patch[j];
    const int ax = u->cp.axis, shortcut = L->nd[u->other].rec_epi;
    int addn = u->outn, sbuf = -1, sconv = -1;
    if (shortcut && u->sx && u->sband[j] >= 0)
        sbuf = u->sband[j], sconv = u->sconv[j];
    else if (shortcut)
        CW_TRY(cw__emit_sc_conv(L, u->node, u->other, pt->o0, pt->o1, (cw__band_in){-1, -1, 0}, &sbuf, &sconv));
    cw__task *e = NULL;
    const cw__vref dst = cw__band(L->nd[u->outn].buf, &n->desc, ax, pt->o0, pt->o1);
    if (u->scale >= 0) /* the conv's band: its band buffer, or the add's rows it wrote */
        CW_TRY(cw__emit_scale(L, u, j, u->inplace ? cw__whole(u->ybuf[j], &L->p->bufs[u->ybuf[j]].d) : dst, &conv));
    CW_TRY(cw__new_task(L, CW__T_ADD, CW_STAGE_EPILOGUE, L->light, addn, &e, id));
    e->u.add.dst = dst;
    cw__vref other = shortcut ? cw__whole(sbuf, &L->p->bufs[sbuf].d)
                              : cw__band(L->nd[u->other].buf, &g->nodes[u->other].desc, ax, pt->o0, pt->o1);
    if (u->inplace) { /* dst is other's (or x's) storage: other + band, written over it */
        e->u.add.a = shortcut ? other : e->u.add.dst;
        e->u.add.b = cw__whole(u->ybuf[j], &L->p->bufs[u->ybuf[j]].d);
        for (int k = 0; k < u->n_war; k++) CW_TRY(cw__dep(L, *id, u->war[k]));
        /* write after read: every recompute that reads these rows of other (its prep, on
         * this stream; or its conv, on a heavy one, where A has no prep). The light stream's
         * order implies it today (each recompute ends in a GN apply here that waits for its
         * conv, emitted before this add: cw__emit_patches); recorded so that sync.c orders
         * it whatever streams those tasks take. */
        for (int q = 0; u->rec_x && q < u->cp.patches; q++)
            if (u->xr_task[q] >= 0 && u->xr_lo[q] < pt->o1 && pt->o0 < u->xr_hi[q])
                CW_TRY(cw__dep(L, *id, u->xr_task[q]));
    } else {
        e->u.add.a = e->u.add.dst;
        e->u.add.b = other;
    }
    e->flops = (double)cw__desc_numel(&n->desc) * (double)(pt->o1 - pt->o0) / (double)u->ci->out_rows;
    CW_TRY(cw__task_set_name(L->p, e, "residual add%s%s L%d patch %d/%d", shortcut ? " + shortcut" : "",
             u->inplace ? " in place" : "", addn, j + 1, u->cp.patches));
    CW_TRY(cw__dep(L, *id, conv));
    if (shortcut) {
        CW_TRY(cw__dep(L, *id, sconv));
        return cw__release(L, sbuf);
    }
    return cw__dep_band(L, *id, u->other, ax, pt->o0, pt->o1);
}

/* Frees patch k's workspace, prep buffer and output band buffer. */
static cw_status cw__patch_release(cw__lower *L, cw__conv_unit *u, int k) {
    CW_TRY(cw__release(L, u->ws[k]));
    CW_TRY(cw__release(L, u->pbuf[k]));
    CW_TRY(cw__release(L, u->ybuf[k]));
    u->ws[k] = u->pbuf[k] = u->ybuf[k] = -1;
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

static cw_status cw__rec_algo(cw__lower *L, int b, int rec, const cw__conv_problem *pr, cw__conv_algo *algo);
static cw_status cw__rec_band_of(const cw__lower *L, const cw__conv_unit *u, const cw__patch *pt, cw__patch *ap);

/* What recomputed conv A's band for the tallest band of plan cp of unit u (A = u->rec) holds
 * beside u's own temporaries while it is computed: A's input rows and its workspace. */
static cw_status cw__rec_reserve(cw__lower *L, const cw__conv_unit *u, const cw__conv_plan *cp, int64_t *bytes) {
    int q = 0;
    for (int k = 1; k < cp->patches; k++)
        if (cp->patch[k].b - cp->patch[k].a > cp->patch[q].b - cp->patch[q].a) q = k;
    cw__patch ap;
    cw__conv_algo algo;
    CW_TRY(cw__rec_band_of(L, u, &cp->patch[q], &ap));
    CW_TRY(cw__rec_algo(L, u->node, u->rec, &ap.prob, &algo));
    *bytes = cw__alloc_round(cw__desc_bytes(&ap.prob.x)) + cw__alloc_round(algo.workspace);
    return CW_OK;
}

/* Unit u recomputing A, planned on its part of the share (cw__rec_split) into *cp: planned
 * again on the whole share less what A's band holds beside it (cw__rec_reserve, sized
 * again on the new plan's bands until it holds), that plan is taken where it is over 2x
 * faster (algorithm cost x bands), as cw__rec_algo does (at 4x) for A's bands. The dry run
 * is the check: where the plan does not fit, the budget search builds it again without
 * (budget.c). */
static cw_status cw__rec_whole(cw__lower *L, const cw__conv_unit *u, const cw__conv_problem *full,
                               const cw__conv_share *sh, int64_t whole, cw__conv_plan *cp) {
    cw__conv_share w = *sh;
    int64_t res = 0;
    CW_TRY(cw__rec_reserve(L, u, cp, &res));
    for (int k = 0; k < 3 && whole - res > sh->avail; k++) {
        cw__conv_plan alt;
        int64_t r2 = 0;
        w.avail = whole - res;
        cw_status st = cw__planner_plan(L->g->ctx->be, full, &w, &alt, NULL);
        if (st == CW_OK) st = cw__rec_reserve(L, u, &alt, &r2);
        if (st == CW_OK && r2 <= res && 2.0 * alt.algo.cost * alt.patches < cp->algo.cost * cp->patches) {
            cw__conv_plan_free(cp);
            *cp = alt;
            L->p->n_rec_whole++;
            return CW_OK;
        }
        cw__conv_plan_free(&alt);
        if (st != CW_OK && st != CW_ERR_BUDGET) return st;
        if (st != CW_OK || r2 <= res) return CW_OK;
        res = r2;
    }
    return CW_OK;
}

/* The algorithm for band problem pr of a recomputed conv: the first pass's if listed and its
 * workspace fits the recomputed conv's part of a heavy stream's share (cw__rec_split), else
 * the fastest that fits -- unless one that fits the whole share is over 4x as fast (the
 * band convs of a recompute run one after another on a heavy stream, each workspace given
 * back before the next: the dry run is the check, and a smaller sizing budget falls back) --
 * else the one with the least workspace. The list comes fastest first. */
static cw_status cw__rec_algo(cw__lower *L, int b, int rec, const cw__conv_problem *pr, cw__conv_algo *algo) {
    cw__backend *be = L->g->ctx->be;
    cw__conv_algo list[16];
    int n = 0;
    CW_TRY(cw__op_conv_algos(be, pr, list, 16, &n));
    if (n == 0) return cw__error(L->g->ctx, CW_ERR_UNSUPPORTED, "compile: no algorithm for a recomputed band");
    const int64_t avail = L->budget - CW__SMALL_RESERVE(L->budget);
    const int64_t cap = L->budget < 0 ? INT64_MAX : cw__rec_split(L, b, rec, avail, 1) / L->heavy;
    const int64_t whole = L->budget < 0 ? INT64_MAX : avail / L->heavy;
    int pick = -1, least = 0, big = -1;
    for (int k = 0; k < n; k++) {
        if (list[k].workspace < list[least].workspace) least = k;
        if (big < 0 && list[k].workspace <= whole) big = k;
        if (list[k].workspace > cap) continue;
        if (list[k].id == L->nd[rec].rec_algo.id) {
            pick = k;
            break;
        }
        if (pick < 0) pick = k;
    }
    if (big >= 0 && (pick < 0 || list[pick].cost > 4.0 * list[big].cost)) pick = big;
    *algo = list[pick >= 0 ? pick : least];
    return CW_OK;
}

/* Conv node A's patch for its output rows [r0, r1) (*ap). */
static cw_status cw__node_band(const cw__lower *L, int A, int64_t r0, int64_t r1, cw__patch *ap) {
    const cw_graph *g = L->g;
    const cw__node *na = &g->nodes[A];
    cw__conv_problem fa;
    cw__conv_problem_init(&fa, &g->nodes[na->in[0]].desc, &g->nodes[na->in[1]].desc, na->in[2] >= 0, &na->desc,
                          &na->conv);
    return cw__patch_make(&fa, r0, r1, ap);
}

/* Recomputed conv A's band for a patch pt of its consumer (unit u): A's output rows are the
 * rows pt reads, [pt->a, pt->b), through u's fused pad if any; *ap gets A's patch for them. */
static cw_status cw__rec_band_of(const cw__lower *L, const cw__conv_unit *u, const cw__patch *pt, cw__patch *ap) {
    int64_t r0, r1;
    cw__src_rows(L, u->pad, cw__node_rows(L->g, u->rec), 1, pt->a, pt->b, &r0, &r1);
    return cw__node_band(L, u->rec, r0, r1, ap);
}

/* The same for u's patch q. */
static cw_status cw__rec_band(const cw__lower *L, const cw__conv_unit *u, int q, cw__patch *ap) {
    return cw__rec_band_of(L, u, &u->cp.patch[q], ap);
}

static cw_status cw__emit_recompute(cw__lower *L, cw__conv_unit *u, int q);

/* Recomputed conv A's output rows [r0, r1), read by unit b, into a band buffer (*ybuf: of dims
 * yd where given, its row 0 A's row yrow0, else of the band's; *conv gets its conv task, *ptask
 * its prep task or -1, *ap its patch): a one-patch unit for A whose input rows come from A's
 * own prep, or -- where A reads a recomputed conv itself -- from that conv's band, recomputed
 * first (recursively), or from `in` (A has no prep). */
static cw_status cw__emit_band_conv(cw__lower *L, int b, int A, int64_t r0, int64_t r1, cw__band_in in,
                                    cw__sc_req *sc, const cw_tensor_desc *yd, int64_t yrow0, int *ybuf, int *conv,
                                    int *ptask, cw__patch *ap) {
    cw__conv_unit a;
    cw__unit_init(L, A, &a);
    int64_t bounds[2] = {r0, r1};
    int ws = -1, pbuf = -1;
    *ptask = -1;
    a.pass1 = 1; /* its conv writes a band buffer */
    a.rec = L->nd[A].rec_of;
    a.sc = sc;
    if (in.xbuf >= 0) { /* its rows as they are in in.xbuf: nothing to prep or recompute */
        if (a.prep) return cw__error(L->g->ctx, CW_ERR_INTERNAL, "compile: a band conv with a prep chain given its rows");
        a.rec = -1, a.in = in;
    }
    a.cp.patches = 1;
    a.cp.bounds = bounds;
    a.cp.patch = ap;
    a.ws = &ws, a.pbuf = &pbuf, a.ybuf = ybuf, a.prep_task = ptask;
    a.ydesc = yd, a.yrow0 = yrow0;
    CW_TRY(cw__node_band(L, A, r0, r1, ap));
    a.cp.axis = ap->axis; /* H: recomputes follow their reader's H bands */
    CW_TRY(cw__rec_algo(L, b, A, &ap->prob, &a.cp.algo));
    a.cp.ws = a.cp.algo.workspace;
    if (a.in.xbuf < 0) CW_TRY(a.rec >= 0 ? cw__emit_recompute(L, &a, 0) : cw__emit_prep(L, &a, 0));
    CW_TRY(cw__emit_conv(L, &a, 0, conv));
    CW_TRY(cw__release(L, ws));
    return cw__release(L, pbuf);
}

/* Epilogue shortcut S's rows [o0, o1) for conv B's add, from x's rows as `in` gives them,
 * into a band buffer (*sbuf, *sconv its conv task): S's only computation. */
static cw_status cw__emit_sc_conv(cw__lower *L, int B, int S, int64_t o0, int64_t o1, cw__band_in in, int *sbuf,
                                  int *sconv) {
    cw__patch sp;
    int ptask = -1;
    CW_TRY(cw__emit_band_conv(L, B, S, o0, o1, in, NULL, NULL, 0, sbuf, sconv, &ptask, &sp));
    L->p->conv_gflop += cw__conv_flops(&sp.prob) * 1e-9;
    return CW_OK;
}

/* Inside the recompute of a band of x (into buffer xbuf from row xrow0, written by xtask)
 * that request sc waits for: S's rows [sc->o0, sc->o1) from it, into a band buffer held until
 * B's epilogue (sc->band, sc->conv; *sconv the conv, for the write after read of whatever
 * overwrites xbuf next). Nothing where those rows are not all in it. */
static cw_status cw__emit_sc_band(cw__lower *L, cw__sc_req *sc, int xbuf, int xtask, int64_t xrow0, int *sconv) {
    const cw_tensor_desc *xd = &L->p->bufs[xbuf].d;
    *sconv = -1;
    if (sc->o1 <= sc->o0 || sc->o0 < xrow0 || sc->o1 > xrow0 + xd->dims[cw__hdim(xd)]) return CW_OK;
    CW_TRY(cw__emit_sc_conv(L, sc->B, sc->S, sc->o0, sc->o1, (cw__band_in){xbuf, xtask, xrow0}, &sc->band, &sc->conv));
    *sconv = sc->conv;
    return CW_OK;
}

/* A's rows [r0, r1) for patch q of unit u (A = u->rec), into a band buffer *ybuf (of dims yd
 * from A's row yrow0 where given: cw__emit_band_conv). */
static cw_status cw__emit_rec_conv(cw__lower *L, cw__conv_unit *u, int q, int64_t r0, int64_t r1,
                                   const cw_tensor_desc *yd, int64_t yrow0, int *ybuf, int *conv) {
    cw__patch ap;
    int ptask = -1;
    CW_TRY(cw__emit_band_conv(L, u->node, u->rec, r0, r1, (cw__band_in){-1, -1, 0}, u->sc, yd, yrow0, ybuf, conv,
                              &ptask, &ap));
    if (u->rec_x && ap.b > ap.a) u->xr_task[q] = ptask >= 0 ? ptask : *conv; /* what reads other's rows */
    L->p->recompute_flop += cw__conv_flops(&ap.prob);
    return CW_OK;
}

/* The prep task of u's patch q on A's recomputed rows [r0, r1) in src (src's row 0 is A's
 * row src_row0): u's GN apply, SiLU, unary op and pad into q's input rows from dst_row0 on,
 * dst (elems elements); after A's band conv (task id) and the GN's statistics. It becomes
 * q's prep task (*pid). */
static cw_status cw__emit_rec_prep(cw__lower *L, cw__conv_unit *u, int q, cw__vref src, cw__vref dst,
                                   int64_t src_row0, int64_t dst_row0, int64_t r0, int64_t r1, double elems, int id,
                                   int *pid) {
    cw__task *t = NULL;
    CW_TRY(cw__new_task(L, CW__T_PREP, CW_STAGE_PREP, L->light, u->node, &t, pid));
    t->u.prep.src = src;
    t->u.prep.dst = dst;
    t->u.prep.ss_buf = u->gn >= 0 ? L->nd[u->gn].gn_ss : -1;
    t->u.prep.silu = u->silu;
    t->u.prep.unary = u->unary, t->u.prep.ua = u->ua, t->u.prep.ub = u->ub;
    t->u.prep.up = 1;
    t->u.prep.dst_row0 = dst_row0;
    t->u.prep.src_row0 = src_row0;
    if (u->pad >= 0) cw__prep_pad(L, t, u->pad, cw__node_rows(L->g, u->rec));
    t->flops = elems * 8.0;
    CW_TRY(cw__task_set_name(L->p, t, "recompute L%d rows %" PRId64 "-%" PRId64 " + prep%s%s%s%s L%d patch %d/%d",
             u->rec, r0, r1, u->gn >= 0 ? " gn" : "", u->silu ? " silu" : "", u->unary ? " unary" : "",
             u->pad >= 0 ? " pad" : "", u->node, q + 1, u->cp.patches));
    CW_TRY(cw__dep(L, *pid, id));
    if (u->gn >= 0) CW_TRY(cw__dep(L, *pid, L->nd[u->gn].gn_fin));
    u->prep_task[q] = *pid;
    return CW_OK;
}

/* The ring: how many of patch q's first input rows patch q-1's prep buffer still holds,
 * prepped (its rows [pt->a, pv->b)); 0 where none, or where q's rows go through A's band
 * otherwise: an epilogue shortcut reads that band raw (A is the shortcut's x), a
 * distributed plan's patch q-1 may be another rank's. (A shortcut whose x is recomputed
 * inside A's band is computed there, from the band of x the new rows need, when its rows
 * lie in it: cw__emit_sc_band.) */
static int64_t cw__ring_rows(const cw__lower *L, const cw__conv_unit *u, int q) {
    if (q == 0 || (u->sc && u->sc->x == u->rec) || u->pbuf[q - 1] < 0 || L->p->opt.comm) return 0;
    const cw__patch *pv = &u->cp.patch[q - 1], *pt = &u->cp.patch[q];
    if (pv->b <= pv->a || pv->a > pt->a || pv->b <= pt->a || pv->b >= pt->b) return 0;
    return pv->b - pt->a;
}

/* Patch q's input rows by the ring (ov = cw__ring_rows): A's band for the rows after the
 * first ov recomputed and prepped into q's prep buffer (A's conv writing there directly
 * where no pad lies between), the first ov rows copied from patch q-1's prep buffer. Each
 * of A's rows is then recomputed once for the whole pass, not once per band that reads it. */
static cw_status cw__emit_ring(cw__lower *L, cw__conv_unit *u, int q, int64_t ov) {
    const cw__patch *pv = &u->cp.patch[q - 1], *pt = &u->cp.patch[q];
    const int ax = cw__hdim(&pt->prob.x), prepped = u->gn >= 0 || u->silu || u->unary || u->pad >= 0;
    const int64_t n = pt->b - pt->a, rows = cw__node_rows(L->g, u->rec);
    cw_tensor_desc bd = pt->prob.x;
    memset(bd.strides, 0, sizeof bd.strides);
    cw__desc_fill_strides(&bd);
    int64_t r0 = pv->b, r1 = pt->b; /* A's rows for q's input rows [pv->b, pt->b) */
    cw__src_rows(L, u->pad, rows, 1, pv->b, pt->b, &r0, &r1);
    int ybuf = -1, id = -1, cp = -1, pid = -1;
    CW_TRY(cw__emit_rec_conv(L, u, q, r0, r1, u->pad >= 0 ? NULL : &bd, pt->a, &ybuf, &id));
    if (u->pad >= 0) /* allocated where the old path does, after A's band conv */
        CW_TRY(cw__temp(L, cw__desc_bytes(&bd), &bd, &u->pbuf[q]));
    else
        u->pbuf[q] = ybuf;
    const int dst = u->pbuf[q], prev = u->pbuf[q - 1];
    cw__task *t = NULL;
    CW_TRY(cw__new_task(L, CW__T_PREP, CW_STAGE_PREP, L->light, u->node, &t, &cp));
    t->u.prep.src = cw__band(prev, &L->p->bufs[prev].d, ax, pt->a - pv->a, pv->b - pv->a);
    t->u.prep.dst = cw__band(dst, &bd, ax, 0, ov);
    t->u.prep.ss_buf = -1;
    t->u.prep.up = 1;
    t->flops = (double)cw__desc_numel(&bd) * (double)ov / (double)n;
    CW_TRY(cw__task_set_name(L->p, t, "ring copy L%d rows %" PRId64 "-%" PRId64 " L%d patch %d/%d", u->rec, pt->a,
                             pv->b, u->node, q + 1, u->cp.patches));
    CW_TRY(cw__dep(L, cp, u->prep_task[q - 1]));
    u->prep_task[q] = cp;
    if (!prepped) return cw__dep(L, cp, id); /* q's conv waits for both through the copy */
    const cw__vref tail = cw__band(dst, &bd, ax, ov, n); /* q's rows after the copied ones */
    CW_TRY(cw__emit_rec_prep(L, u, q, u->pad >= 0 ? cw__whole(ybuf, &L->p->bufs[ybuf].d) : tail, tail,
                             u->pad >= 0 ? r0 : pv->b, pv->b, r0, r1,
                             (double)cw__desc_numel(&bd) * (double)(n - ov) / (double)n, id, &pid));
    CW_TRY(cw__dep(L, pid, cp));
    return u->pad >= 0 ? cw__release(L, ybuf) : CW_OK; /* after its prep, in host order */
}

/* Patch q's input rows of a conv that reads a recomputed conv A, directly or through GN,
 * SiLU and a replicate pad: A's band for exactly those rows (cw__emit_rec_conv), then GN
 * apply + SiLU in place on it, the band buffer being q's prep buffer; or, through a pad, GN
 * apply + SiLU + the pad from it into q's prep buffer (A's band is dropped after). Exact: the
 * statistics are A's whole-tensor ones from its first pass. Where A is the x of an epilogue
 * shortcut S waiting for it (u->sc), S's band is computed from A's band first, before the
 * prep overwrites it (cw__emit_sc_band). Where patch q-1's rows overlap q's, the ring
 * (cw__emit_ring) recomputes only the rows after them. */
static cw_status cw__emit_recompute(cw__lower *L, cw__conv_unit *u, int q) {
    const cw__patch *pt = &u->cp.patch[q];
    const int64_t ov = cw__ring_rows(L, u, q);
    if (ov > 0) return cw__emit_ring(L, u, q, ov);
    int ybuf = -1, id = -1;
    cw__patch band;
    CW_TRY(cw__rec_band(L, u, q, &band));
    CW_TRY(cw__emit_rec_conv(L, u, q, band.o0, band.o1, NULL, 0, &ybuf, &id));
    u->pbuf[q] = ybuf;
    u->prep_task[q] = id;
    int sconv = -1;
    if (u->sc && u->rec == u->sc->x && u->sc->band < 0) CW_TRY(cw__emit_sc_band(L, u->sc, ybuf, id, band.o0, &sconv));
    if (u->gn < 0 && !u->silu && !u->unary && u->pad < 0) return CW_OK; /* read as it is */
    const cw__buf *bb = &L->p->bufs[ybuf];
    const cw_tensor_desc yd = bb->d;
    cw_tensor_desc bd = pt->prob.x; /* through a pad: q's padded input rows, in a buffer of their own */
    if (u->pad >= 0) {
        memset(bd.strides, 0, sizeof bd.strides);
        cw__desc_fill_strides(&bd);
        CW_TRY(cw__temp(L, cw__desc_bytes(&bd), &bd, &u->pbuf[q]));
    }
    int pid = -1;
    const cw__vref src = cw__whole(ybuf, &yd);
    CW_TRY(cw__emit_rec_prep(L, u, q, src, u->pad >= 0 ? cw__whole(u->pbuf[q], &bd) : src, band.o0, pt->a, band.o0,
                             band.o1, (double)cw__desc_numel(&bd), id, &pid));
    if (sconv >= 0) CW_TRY(cw__dep(L, pid, sconv)); /* write after S's read */
    if (u->pad >= 0) CW_TRY(cw__release(L, ybuf)); /* after its prep, in host order */
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
    const int apad = cw__fusion_pad(L, L->g->nodes[u->rec].in[0]);
    cw__fusion_chain(L, L->g->nodes[u->rec].in[0], &src, &gn, &silu, &up);
    const cw_tensor_desc *xd = &L->g->nodes[src].desc;
    for (int q = 0; q < P; q++) {
        cw__patch ap;
        CW_TRY(cw__rec_band(L, u, q, &ap));
        u->xr_task[q] = -1;
        if (ap.b > ap.a) /* as cw__emit_prep reads them */
            cw__src_rows(L, apad, xd->dims[cw__hdim(xd)] * up, up, ap.a, ap.b, &u->xr_lo[q], &u->xr_hi[q]);
        else
            u->xr_lo[q] = u->xr_hi[q] = ap.a / up;
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
    cw__sc_req sc = {-1, -1, -1, 0, 0, -1, -1};
    if (u->sx) sc.x = L->g->nodes[u->other].in[0], sc.S = u->other, sc.B = u->node;
    for (int j = 0; j < P; j++) {
        const cw__patch *pt = &u->cp.patch[j];
        while (next_prep < P && (next_prep < j + ahead || (u->rec_x && u->xr_lo[next_prep] < pt->o1))) {
            const int q = next_prep++;
            sc.o0 = u->cp.patch[q].o0, sc.o1 = u->cp.patch[q].o1, sc.band = sc.conv = -1;
            u->sc = u->sx ? &sc : NULL;
            CW_TRY(u->rec >= 0 ? cw__emit_recompute(L, u, q) : cw__emit_prep(L, u, q));
            if (u->sx) u->sband[q] = sc.band, u->sconv[q] = sc.conv;
            u->sc = NULL;
        }
        int id = -1, last;
        CW_TRY(cw__emit_conv(L, u, j, &id));
        last = id;
        if (u->other >= 0) CW_TRY(cw__emit_epilogue(L, u, j, id, &last));
        if (u->pass1) { /* only the band's statistics are kept */
            cw__vref band = cw__whole(u->ybuf[j], &L->p->bufs[u->ybuf[j]].d);
            CW_TRY(cw__gn_band_stats_at(L, u->outn, last, &band, pt->o0, pt->o1, j));
        } else {
            CW_TRY(cw__writer_band(L, u->outn, last, u->cp.axis, pt->o0, pt->o1));
            CW_TRY(cw__gn_band_stats(L, u->outn, last, u->cp.axis, pt->o0, pt->o1, j));
        }
        /* the conv H-1 patches back ran on the stream the next conv takes: free its
         * workspace and patch buffer now so the next conv reuses them in stream order. */
        if (j - H + 1 >= 0) CW_TRY(cw__patch_release(L, u, j - H + 1));
    }
    for (int k = 0; k < P; k++) CW_TRY(cw__patch_release(L, u, k)); /* the last H-1 patches' */
    return CW_OK;
}

cw_status cw__lower_conv(cw__lower *L, int i) {
    cw_graph *g = L->g;
    const cw__node *n = &g->nodes[i];
    cw__conv_unit u;
    cw__unit_init(L, i, &u);
    int addn = L->nd[i].epi_into;
    u.outn = addn >= 0 ? addn : i;
    u.other = cw__fusion_epi_other(L, i);
    u.scale = cw__fusion_epi_scale(L, i);
    const int tgt = cw__fusion_inplace_target(L, u.other); /* whose storage an in-place add takes */
    u.inplace = tgt >= 0 && L->nd[tgt].moved && L->nd[tgt].buf == L->nd[u.outn].buf;
    u.pass1 = L->nd[i].rec;
    u.rec = L->nd[i].rec_of;
    if (u.inplace && u.rec >= 0) {
        int asrc, ag, as, au;
        cw__fusion_chain(L, g->nodes[u.rec].in[0], &asrc, &ag, &as, &au);
        u.rec_x = asrc == tgt;
    }
    cw__conv_problem full;
    cw__conv_problem_init(&full, &g->nodes[n->in[0]].desc, &g->nodes[n->in[1]].desc, n->in[2] >= 0, &n->desc, &n->conv);
    const int axes = cw__axes(L, &u, n->desc.rank);
    int64_t h_out = n->desc.dims[axes == CW__AX_D ? CW__PATCH_DDIM : cw__hdim(&n->desc)];
    /* band buffers per patch: the conv's output band (in place, first pass), S's band */
    int ybufs = (u.inplace || u.pass1) + (u.other >= 0 && L->nd[u.other].rec_epi);
    u.sx = u.other >= 0 && L->nd[u.other].rec_epi && u.rec >= 0 && L->nd[g->nodes[u.other].in[0]].rec;
    cw__conv_share sh = cw__share(L, u.prep || u.rec >= 0, ybufs, h_out, axes);
    const int64_t whole = sh.avail;
    if (u.rec >= 0 && sh.avail > 0) sh.avail = cw__rec_split(L, i, u.rec, sh.avail, 0);
    if (u.rec_x && sh.n_pbufs < 2) sh.n_pbufs = 2; /* one stream: the next band's recompute is in flight too */
    cw_status st = cw__planner_plan(g->ctx->be, &full, &sh, &u.cp, NULL);
    if (st == CW_OK && L->rec_whole && u.rec >= 0 && whole > sh.avail)
        st = cw__rec_whole(L, &u, &full, &sh, whole, &u.cp);
    if (st == CW_OK && u.pass1) L->nd[i].rec_algo = u.cp.algo;
    if (st == CW_OK) {
        int P = u.cp.patches;
        u.ws = cw__malloc((size_t)P * sizeof *u.ws);
        u.pbuf = cw__malloc((size_t)P * sizeof *u.pbuf);
        u.ybuf = cw__malloc((size_t)P * sizeof *u.ybuf);
        u.prep_task = cw__malloc((size_t)P * sizeof *u.prep_task);
        if (u.sx) {
            u.sband = cw__malloc((size_t)P * sizeof *u.sband);
            u.sconv = cw__malloc((size_t)P * sizeof *u.sconv);
            if (!u.sband || !u.sconv) st = cw__oom(L);
        }
        if (!u.ws || !u.pbuf || !u.ybuf || !u.prep_task) st = cw__oom(L);
        for (int q = 0; q < P && st == CW_OK; q++) {
            u.ws[q] = u.pbuf[q] = u.ybuf[q] = u.prep_task[q] = -1;
            if (u.sx) u.sband[q] = u.sconv[q] = -1;
        }
    }
    if (st == CW_OK && u.rec_x) st = cw__rec_x_rows(L, &u);
    if (st == CW_OK && u.inplace) st = cw__touching(L, L->nd[tgt].buf, &u.war, &u.n_war);
    if (st == CW_OK && u.gn >= 0) st = cw__gn_ready(L, u.gn);
    if (st == CW_OK) st = cw__gn_begin(L, u.outn, u.cp.patches);
    if (st == CW_OK) st = cw__conv_record(L, &u, &full);
    if (st == CW_OK) st = cw__emit_patches(L, &u);
    cw__conv_plan_free(&u.cp);
    cw__free(u.ws), cw__free(u.pbuf), cw__free(u.ybuf), cw__free(u.prep_task), cw__free(u.war);
    cw__free(u.xr_task), cw__free(u.xr_lo), cw__free(u.xr_hi);
    cw__free(u.sband), cw__free(u.sconv);
    return st;
}
