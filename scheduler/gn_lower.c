/* GroupNorm lowering. Statistics are exact: each band a producer writes gets a stats task
 * (count, mean, M2 per (n, group), in double) into a partial buffer; a finalize task merges
 * the partials in band order (Chan's formula) into per-channel scale/shift, which the
 * consumers' prep tasks apply. A producer that writes no bands gets one whole-tensor task. */
#include <inttypes.h>
#include <stdio.h>

#include "scheduler/lower.h"

static int64_t cw__gn_part_bytes(const cw__node *gn, int64_t parts) {
    return parts * gn->desc.dims[0] * gn->groups * 3 * (int64_t)sizeof(double);
}

/* GN node k reads node n and still takes statistics. */
static int cw__gn_reads(const cw__lower *L, int k, int n) {
    const cw__node *gn = &L->g->nodes[k];
    return gn->kind == CW__N_GN && gn->in[0] == n && L->nd[k].live && L->nd[k].gn_fin < 0;
}

cw_status cw__gn_band_stats(cw__lower *L, int n, int task, int ax, int64_t r0, int64_t r1, int part) {
    cw__vref x = cw__band(L->nd[n].buf, &L->g->nodes[n].desc, ax, r0, r1);
    return cw__gn_band_stats_at(L, n, task, &x, r0, r1, part);
}

cw_status cw__gn_band_stats_at(cw__lower *L, int n, int task, const cw__vref *x, int64_t r0, int64_t r1, int part) {
    cw_graph *g = L->g;
    for (int k = n + 1; k < g->n; k++) {
        cw__lnode *ln = &L->nd[k];
        if (!cw__gn_reads(L, k, n) || ln->gn_part < 0) continue;
        cw__task *t = NULL;
        int id = -1;
        CW_TRY(cw__new_task(L, CW__T_STATS, CW_STAGE_STATS, L->light, k, &t, &id));
        t->u.stats.x = *x;
        t->u.stats.groups = g->nodes[k].groups;
        t->u.stats.part_buf = ln->gn_part;
        t->u.stats.part_index = part;
        CW_TRY(cw__task_set_name(L->p, t, "gn stats L%d %s %" PRId64 "-%" PRId64, k,
                 x->rank == 5 && x->dims[2] < g->nodes[n].desc.dims[2] ? "frames" : "rows", r0, r1));
        if (ln->gn_stats_first < 0) ln->gn_stats_first = id;
        CW_TRY(cw__dep(L, id, task));
    }
    return CW_OK;
}

cw_status cw__gn_begin(cw__lower *L, int n, int parts) {
    cw_graph *g = L->g;
    for (int k = n + 1; k < g->n; k++) {
        cw__lnode *ln = &L->nd[k];
        if (!cw__gn_reads(L, k, n) || ln->gn_part >= 0) continue;
        CW_TRY(cw__temp(L, cw__gn_part_bytes(&g->nodes[k], parts), NULL, &ln->gn_part));
        ln->gn_nparts = parts;
    }
    return CW_OK;
}

/* gamma or beta (node v, dims [C]) as a 1-D view. */
static cw__vref cw__gn_vec(const cw__lower *L, int v, int64_t c) {
    cw__vref r = cw__whole(L->nd[v].buf, &L->g->nodes[v].desc);
    r.rank = 1;
    r.start[0] = 0;
    r.dims[0] = c;
    return r;
}

static cw_status cw__gn_finalize(cw__lower *L, int k) {
    cw_graph *g = L->g;
    const cw__node *gn = &g->nodes[k];
    cw__lnode *ln = &L->nd[k];
    int64_t n = gn->desc.dims[0], c = gn->desc.dims[1];
    CW_TRY(cw__temp(L, 2 * n * c * (int64_t)sizeof(float), NULL, &ln->gn_ss));
    cw__task *t = NULL;
    int id = -1;
    CW_TRY(cw__new_task(L, CW__T_FINALIZE, CW_STAGE_STATS, L->light, k, &t, &id));
    t->u.fin.part_buf = ln->gn_part;
    t->u.fin.n_parts = ln->gn_nparts;
    t->u.fin.n = n;
    t->u.fin.c = c;
    t->u.fin.groups = gn->groups;
    t->u.fin.gamma = cw__gn_vec(L, gn->in[1], c);
    t->u.fin.beta = cw__gn_vec(L, gn->in[2], c);
    t->u.fin.eps = gn->eps;
    t->u.fin.ss_buf = ln->gn_ss;
    CW_TRY(cw__task_set_name(L->p, t, "gn finalize L%d", k));
    for (int i = ln->gn_stats_first; i >= 0 && i < id; i++)
        if (L->p->tasks[i].kind == CW__T_STATS && L->p->tasks[i].node == k) CW_TRY(cw__dep(L, id, i));
    ln->gn_fin = id;
    return cw__release(L, ln->gn_part);
}

/* One whole-tensor stats task for GN node k whose producer emitted no band stats. */
static cw_status cw__gn_whole_stats(cw__lower *L, int k) {
    cw_graph *g = L->g;
    cw__lnode *ln = &L->nd[k];
    int x = g->nodes[k].in[0];
    CW_TRY(cw__temp(L, cw__gn_part_bytes(&g->nodes[k], 1), NULL, &ln->gn_part));
    ln->gn_nparts = 1;
    cw__task *t = NULL;
    int id = -1;
    CW_TRY(cw__new_task(L, CW__T_STATS, CW_STAGE_STATS, L->light, k, &t, &id));
    const cw_tensor_desc *d = &g->nodes[x].desc;
    t->u.stats.x = cw__whole(L->nd[x].buf, d);
    t->u.stats.groups = g->nodes[k].groups;
    t->u.stats.part_buf = ln->gn_part;
    t->u.stats.part_index = 0;
    CW_TRY(cw__task_set_name(L->p, t, "gn stats L%d", k));
    ln->gn_stats_first = id;
    return cw__dep_rows(L, id, x, 0, d->dims[cw__hdim(d)]);
}

cw_status cw__gn_ready(cw__lower *L, int k) {
    if (L->nd[k].gn_fin >= 0) return CW_OK;
    if (L->nd[k].gn_part < 0) CW_TRY(cw__gn_whole_stats(L, k));
    return cw__gn_finalize(L, k);
}
