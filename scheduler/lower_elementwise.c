/* Lowering one lone elementwise node (an add, a generic op, or a GroupNorm apply / SiLU /
 * upsample not fused into a conv): one light-stream task over the whole tensor, then the
 * GroupNorm statistics of its result where a GroupNorm reads it. Where its result takes an
 * operand's storage (lower.c, cw__inplace_lone), the task waits for every earlier task that
 * touched that storage. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "scheduler/lower.h"
#include "scheduler/planner.h"

static cw_status cw__lower_lone(cw__lower *L, int i, const int *war, int n_war) {
    cw_graph *g = L->g;
    const cw__node *n = &g->nodes[i];
    const cw_tensor_desc *d = &n->desc;
    int64_t h = d->dims[cw__hdim(d)];
    cw__task *t = NULL;
    int id = -1;
    if (n->kind == CW__N_ADD) {
        CW_TRY(cw__new_task(L, CW__T_ADD, CW_STAGE_OTHER, L->light, i, &t, &id));
        t->u.add.dst = cw__whole(L->nd[i].buf, d);
        t->u.add.a = cw__whole(L->nd[n->in[0]].buf, d);
        t->u.add.b = cw__whole(L->nd[n->in[1]].buf, d);
        t->flops = (double)cw__desc_numel(d);
        CW_TRY(cw__task_set_name(L->p, t, "add L%d", i));
        CW_TRY(cw__dep_rows(L, id, n->in[0], 0, h));
        CW_TRY(cw__dep_rows(L, id, n->in[1], 0, h));
    } else if (n->kind == CW__N_OP) { /* one task over the whole tensors */
        const cw_op_info info = cw_op_get_info(n->op);
        CW_TRY(cw__new_task(L, CW__T_OP, CW_STAGE_OTHER, L->light, i, &t, &id));
        t->u.op.code = n->op;
        t->u.op.param = n->param;
        t->u.op.out = cw__whole(L->nd[i].buf, d);
        for (int k = 0; k < info.n_in; k++) {
            const int x = n->in[k];
            const cw_tensor_desc *xd = &g->nodes[x].desc;
            t->u.op.in[k] = cw__whole(L->nd[x].buf, xd);
            if (g->nodes[x].kind != CW__N_CONST) CW_TRY(cw__dep_rows(L, id, x, 0, xd->dims[cw__hdim(xd)]));
        }
        t->flops = (double)cw__desc_numel(d) * info.flops;
        CW_TRY(cw__task_set_name(L->p, t, "%s L%d", n->name, i));
    } else {
        int x = n->in[0];
        if (n->kind == CW__N_GN) CW_TRY(cw__gn_ready(L, i));
        CW_TRY(cw__new_task(L, CW__T_PREP, CW_STAGE_OTHER, L->light, i, &t, &id));
        t->u.prep.src = cw__whole(L->nd[x].buf, &g->nodes[x].desc);
        t->u.prep.dst = cw__whole(L->nd[i].buf, d);
        t->u.prep.ss_buf = n->kind == CW__N_GN ? L->nd[i].gn_ss : -1;
        t->u.prep.silu = n->kind == CW__N_SILU;
        t->u.prep.up = n->kind == CW__N_UP2 ? 2 : 1;
        t->flops = (double)cw__desc_numel(d) * 4.0;
        CW_TRY(cw__task_set_name(L->p, t, "%s L%d", n->name, i));
        CW_TRY(cw__dep_rows(L, id, x, 0, cw__node_rows(g, x)));
        if (n->kind == CW__N_GN) CW_TRY(cw__dep(L, id, L->nd[i].gn_fin));
    }
    for (int k = 0; k < n_war; k++) CW_TRY(cw__dep(L, id, war[k]));
    CW_TRY(cw__gn_begin(L, i, 1));
    CW_TRY(cw__writer(L, i, id, 0, h));
    return cw__gn_band_stats(L, i, id, cw__hdim(d), 0, h, 0);
}

cw_status cw__lower_elementwise(cw__lower *L, int i) {
    const cw__node *n = &L->g->nodes[i];
    int *war = NULL, n_war = 0;
    for (int a = 0; a < 3 && n->in[a] >= 0 && !war; a++)
        if (L->nd[n->in[a]].buf == L->nd[i].buf) CW_TRY(cw__touching(L, L->nd[i].buf, &war, &n_war));
    cw_status st = cw__lower_lone(L, i, war, n_war);
    cw__free(war);
    return st;
}
