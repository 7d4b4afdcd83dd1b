/* Lowering a graph into a plan, the driver: walks the graph in order and hands each unit
 * to its file (lower_conv.c, lower_attention.c, lower_elementwise.c). Each unit (a conv
 * with its fused prep chain and residual epilogue, an attention, a lone elementwise node)
 * becomes tasks on streams. Heavy tasks
 * (conv patches, attention chunks) go round-robin onto the heavy streams, light ones onto
 * the light stream; each buffer is freed after its last reader. The host-ordered action
 * list (alloc / task / free) is what cw_plan_run replays and the budget search simulates. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "scheduler/lower.h"
#include "scheduler/planner.h"

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
            CW_TRY(cw__new_buf(L, CW__B_INPUT, nd->index, &nd->desc, 0, &ln->buf));
            p->in[nd->index].d = nd->desc;
            snprintf(p->in[nd->index].name, sizeof p->in[nd->index].name, "%s", nd->name);
        } else if (nd->kind == CW__N_CONST && ln->live) {
            CW_TRY(cw__new_buf(L, CW__B_CONST, i, &nd->desc, 0, &ln->buf));
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
        /* a distributed plan's outputs are bands and gathers: no donations there */
        p->out[o].donor = on->donor && !p->opt.comm ? on->donor - 1 : -1;
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
            if (--L->nd[m].reads == 0) CW_TRY(cw__release_reads(L, L->nd[m].rec_rd, L->nd[m].rec_k));
            continue;
        }
        if (--L->nd[m].reads != 0 || nm->kind == CW__N_INPUT || nm->kind == CW__N_CONST || nm->is_output ||
            L->nd[m].moved || L->nd[m].buf < 0 || L->p->bufs[L->nd[m].buf].kind != CW__B_ACT)
            continue;
        /* a GN still to be finalized from m must take its stats first */
        for (int q = m + 1; q < g->n; q++)
            if (g->nodes[q].kind == CW__N_GN && g->nodes[q].in[0] == m && L->nd[q].gn_refs > 0)
                CW_TRY(cw__gn_ready(L, q));
        CW_TRY(cw__release(L, L->nd[m].buf));
    }
    if (rd[3] >= 0 && --L->nd[rd[3]].gn_refs == 0) CW_TRY(cw__release(L, L->nd[rd[3]].gn_ss));
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

/* Whether activation m's storage may take node i's result, read by unit u (reads rd[0, k)):
 * nothing after u reads m, it is not an output, it has i's rank and dtype and dims (fewer
 * channels in i where channels_le), and no GroupNorm but i itself still takes statistics
 * from it. */
static int cw__dying_operand(const cw__lower *L, int i, int m, const int rd[4], int k, int channels_le) {
    const cw_graph *g = L->g;
    const cw__node *n = &g->nodes[i], *nm = &g->nodes[m];
    const cw__lnode *lm = &L->nd[m];
    if (lm->buf < 0 || lm->moved || nm->is_output || L->p->bufs[lm->buf].kind != CW__B_ACT ||
        lm->reads != cw__reads_released(L, rd, k, m) || nm->desc.rank != n->desc.rank ||
        nm->desc.dtype != n->desc.dtype)
        return 0;
    for (int d = 0; d < n->desc.rank; d++)
        if (nm->desc.dims[d] != n->desc.dims[d] && !(channels_le && d == 1 && n->desc.dims[d] < nm->desc.dims[d]))
            return 0;
    for (int q = m + 1; q < g->n; q++) /* GroupNorm statistics still to be taken from m */
        if (q != i && g->nodes[q].kind == CW__N_GN && g->nodes[q].in[0] == m && L->nd[q].gn_refs > 0 &&
            L->nd[q].gn_fin < 0)
            return 0;
    return 1;
}

/* The node whose storage the result of ADD node i (whose conv epilogue is unit u) may take,
 * or -1: its residual operand, or where that is an epilogue shortcut (nd[].rec_epi) the
 * shortcut's input x (no fewer channels, fusion.c), when it dies here (cw__dying_operand) and
 * the conv does not read it directly (its halo rows would be overwritten under it). A conv
 * that recomputes conv A per band may take A's own input, which A's unit still holds (its
 * reads are released after this unit): the recomputes read it band by band, ordered before
 * each band's write (cw__emit_patches). The unscheduled reference keeps a buffer per node. */
static int cw__inplace_operand(const cw__lower *L, int i, int u) {
    const cw_graph *g = L->g;
    int other = cw__fusion_epi_other(L, u);
    int m = cw__fusion_inplace_target(L, other);
    if (L->none || m < 0) return -1;
    int rd[4], src, gn, silu, up;
    if (!cw__dying_operand(L, i, m, rd, cw__fusion_unit_reads(L, u, rd), m != other)) return -1;
    cw__fusion_chain(L, g->nodes[u].in[0], &src, &gn, &silu, &up);
    return src == m ? -1 : m;
}

/* The operand whose storage lone elementwise node i (an add; a per-channel, unary or binary
 * op; a GroupNorm apply or SiLU, a prep without upsampling) writes its result into, or -1: one
 * that dies here (cw__dying_operand; i's own statistics are taken before i's task, which
 * waits for them), whole (no head and tail). Both backends' kernels of these ops read each
 * element before they write it (ops_cpu.c, kernels.cu; a recomputed band's prep already runs
 * in place), so the exact alias is safe. Not in the unscheduled reference, which keeps a
 * buffer per node, nor in a distributed plan, whose ranks hold bands of buffers. */
static int cw__inplace_lone(const cw__lower *L, int i) {
    const cw__node *n = &L->g->nodes[i];
    int cand[2] = {n->in[0], -1}, rd[4];
    if (L->none || L->p->opt.comm || n->is_output) return -1;
    if (n->kind == CW__N_ADD || (n->kind == CW__N_OP && n->op == CW_OP_BINARY)) cand[1] = n->in[1];
    else if (n->kind != CW__N_GN && n->kind != CW__N_SILU &&
             (n->kind != CW__N_OP || (n->op != CW_OP_CHANNEL && n->op != CW_OP_UNARY)))
        return -1;
    int k = cw__fusion_unit_reads(L, i, rd);
    for (int c = 0; c < 2 && k >= 0; c++) {
        const int m = cand[c];
        if (m >= 0 && cw__dying_operand(L, i, m, rd, k, 0) && L->p->bufs[L->nd[m].buf].tail < 0 &&
            L->p->bufs[L->nd[m].buf].head < 0)
            return m;
    }
    return -1;
}

/* Bytes of node i's result that outlive it, or 0: where i is the input x of an epilogue
 * shortcut (fusion.c, rec_epi), the residual add's result takes x's storage and needs only
 * its first bytes (one batch: every channel plane of the result lies before the rest of x's).
 * x's buffer is then a head of that size and a tail, freed at the end of the block (the arena
 * places the tail right after the head). Not in a distributed plan, whose ranks hold rows of
 * a buffer, not a prefix. */
static int64_t cw__split_bytes(const cw__lower *L, int i) {
    const cw_graph *g = L->g;
    const cw_tensor_desc *d = &g->nodes[i].desc;
    if (L->p->opt.comm || d->rank < 4 || d->dims[0] != 1) return 0;
    for (int s = i + 1; s < g->n; s++) {
        if (!L->nd[s].rec_epi || g->nodes[s].in[0] != i) continue;
        for (int a = s + 1; a < g->n; a++)
            if (g->nodes[a].kind == CW__N_ADD && (g->nodes[a].in[0] == s || g->nodes[a].in[1] == s)) {
                int64_t hs = cw__desc_bytes(&g->nodes[a].desc);
                return hs < cw__desc_bytes(d) && cw__alloc_round(hs) == hs ? hs : 0;
            }
    }
    return 0;
}

/* A fresh activation buffer for node i (split in head and tail: cw__split_bytes). */
static cw_status cw__new_act(cw__lower *L, int i) {
    const cw__node *nd = &L->g->nodes[i];
    cw__lnode *ln = &L->nd[i];
    int64_t bytes = cw__desc_bytes(&nd->desc), hs = cw__split_bytes(L, i);
    CW_TRY(cw__new_buf(L, CW__B_ACT, -1, &nd->desc, hs > 0 ? hs : bytes, &ln->buf));
    CW_TRY(cw__act(L, CW__A_ALLOC, ln->buf, 0));
    if (hs == 0) return CW_OK;
    int t = -1;
    CW_TRY(cw__new_buf(L, CW__B_ACT, -1, NULL, bytes - hs, &t));
    L->p->bufs[t].head = ln->buf;
    L->p->bufs[ln->buf].tail = t;
    return cw__act(L, CW__A_ALLOC, t, 0);
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
        if (L->nd[u].rec_stats) CW_TRY(cw__lower_conv(L, u));
        else if (gn >= 0) CW_TRY(cw__gn_ready(L, gn));
        if (!L->nd[u].rec_stats) L->nd[u].rec_algo.id = -1;
        for (int a = 0; a < 4; a++) L->nd[u].rec_rd[a] = rd[a];
        L->nd[u].rec_k = k;
        return CW_OK;
    }
    int other = u != i ? cw__inplace_operand(L, i, u) : cw__inplace_lone(L, i);
    if (nd->is_output) {
        CW_TRY(cw__new_buf(L, CW__B_OUTPUT, nd->index, &nd->desc, 0, &ln->buf));
    } else if (other >= 0) {
        ln->buf = L->nd[other].buf; /* the result overwrites its dying operand */
        L->nd[other].moved = 1;
    } else {
        CW_TRY(cw__new_act(L, i));
    }
    L->nd[u].buf = ln->buf;
    cw__nkind kind = g->nodes[u].kind;
    if (kind == CW__N_CONV) CW_TRY(cw__lower_conv(L, u));
    else if (kind == CW__N_ATTN) CW_TRY(cw__lower_attention(L, u));
    else CW_TRY(cw__lower_elementwise(L, u));
    if (other >= 0) CW_TRY(cw__release_tail(L, ln->buf)); /* x's rest, past the add's result */
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
        ln->buf = ln->epi = ln->epi_into = ln->epi_mul = -1;
        ln->gn_part = ln->gn_ss = ln->gn_fin = ln->gn_nparts = ln->gn_stats_first = -1;
    }
    return CW_OK;
}

static void cw__lower_free(cw__lower *L) {
    for (int i = 0; L->nd && i < L->g->n; i++) cw__free(L->nd[i].wr);
    cw__free(L->nd);
}

/* ---- donated inputs (cw_graph_donate) ------------------------------------------------- */

/* The node of the input donated to output node i's output (-1: none), from inode (the
 * input nodes by position). */
static int cw__donor_node(const cw__lower *L, const int *inode, int i) {
    const cw__node *nd = &L->g->nodes[i];
    return nd->is_output && L->p->out[nd->index].donor >= 0 ? inode[L->p->out[nd->index].donor] : -1;
}

/* Whether output node i, whose donor input some unit still to come reads, is lowered later:
 * once its donor's last reader has been (cw__lower_graph), so that its writes come after
 * every read of the donor. Only a node nothing in the plan reads and that is its own unit
 * can wait; for any other the donation is dropped (its output takes a tensor of its own). */
static int cw__donor_wait(cw__lower *L, const int *inode, int i) {
    const cw__node *nd = &L->g->nodes[i];
    cw__lnode *ln = &L->nd[i];
    int in = cw__donor_node(L, inode, i);
    if (in < 0 || L->nd[in].reads == 0) return 0;
    if (!ln->live || ln->fused || ln->reads > 0 || (nd->kind == CW__N_ADD && ln->epi >= 0) ||
        (nd->kind == CW__N_CONV && (ln->epi_into >= 0 || ln->rec))) {
        L->p->out[nd->index].donor = -1;
        return 0;
    }
    return 1;
}

/* After lowering: each honoured donation's writes of the output wait for every read of its
 * input, on each stream the last task touching it (a stream runs its tasks in order). A
 * donation whose output is written before a read of the input in host order, or by a task
 * that also touches the input, is dropped: the plan is then correct with separate tensors,
 * and cw_plan_run refuses shared ones. */
static cw_status cw__donations(cw__lower *L, const int *inode) {
    cw_plan *p = L->p;
    int tb[CW__TASK_MAX_BUFS], last[CW_MAX_STREAMS];
    for (int o = 0; o < p->n_outputs; o++) {
        if (p->out[o].donor < 0) continue;
        int ib = L->nd[inode[p->out[o].donor]].buf, ob = L->nd[L->g->outputs[o]].buf;
        int first_w = p->n_tasks, last_r = -1;
        for (int s = 0; s < CW_MAX_STREAMS; s++) last[s] = -1;
        for (int k = 0; k < p->n_tasks; k++) {
            int r = 0, w = 0;
            for (int a = 0, n = cw__task_bufs(&p->tasks[k], tb); a < n; a++) r |= tb[a] == ib, w |= tb[a] == ob;
            if (r && w) first_w = -1;
            if (w && first_w == p->n_tasks) first_w = k;
            if (r) last_r = k;
        }
        if (first_w <= last_r) {
            p->out[o].donor = -1;
            continue;
        }
        for (int k = 0; k <= last_r; k++)
            for (int a = 0, n = cw__task_bufs(&p->tasks[k], tb); a < n; a++)
                if (tb[a] == ib) last[p->tasks[k].stream] = k;
        for (int k = first_w; k < p->n_tasks; k++) {
            int w = 0;
            for (int a = 0, n = cw__task_bufs(&p->tasks[k], tb); a < n; a++) w |= tb[a] == ob;
            for (int s = 0; w && s < CW_MAX_STREAMS; s++) CW_TRY(cw__dep(L, k, last[s]));
        }
    }
    return CW_OK;
}

/* Each input donated to no output: a DISCARD action right after the last task that touches
 * it in host order (cw__plan_sync then joins it with every stream that did). Found on the
 * finished action list, not at its last reader unit: a task of a later unit (GroupNorm
 * statistics taken when they are first needed) may still read it. */
static cw_status cw__discards(cw__lower *L, const int *inode) {
    cw_plan *p = L->p;
    int tb[CW__TASK_MAX_BUFS];
    for (int k = 0; k < L->g->n_inputs && !p->opt.comm; k++) {
        if (!L->g->nodes[inode[k]].donor) continue;
        int b = L->nd[inode[k]].buf, at = -1;
        for (int a = 0; a < p->n_acts; a++) {
            int n = p->acts[a].kind == CW__A_TASK ? cw__task_bufs(&p->tasks[p->acts[a].id], tb) : 0;
            for (int j = 0; j < n; j++)
                if (tb[j] == b) at = a;
        }
        if (at < 0) continue; /* never read */
        CW_TRY(cw__act(L, CW__A_DISCARD, b, 0));
        cw__action d = p->acts[p->n_acts - 1];
        memmove(&p->acts[at + 2], &p->acts[at + 1], (size_t)(p->n_acts - 2 - at) * sizeof *p->acts);
        p->acts[at + 1] = d;
    }
    return CW_OK;
}

/* Lowers every live node in graph order (an output with a donor after its donor's last
 * reader: cw__donor_wait), then frees the partials of GroupNorms nobody finalized, then
 * orders the donations, places the discards, and places events and frees (cw__plan_sync). */
static cw_status cw__lower_graph(cw__lower *L) {
    cw_graph *g = L->g;
    cw__mark_live(L);
    cw__fusion_analyse(L);
    cw__fusion_recompute(L);
    L->p->rec_nodes = cw__malloc((size_t)g->n * sizeof *L->p->rec_nodes + 1);
    if (!L->p->rec_nodes) return cw__oom(L);
    for (int i = 0; i < g->n; i++)
        if (L->nd[i].rec) L->p->rec_nodes[L->p->n_recomputed++] = i;
    CW_TRY(cw__bind_externals(L));
    int *wait = cw__malloc((size_t)g->n * sizeof *wait + 1), n_wait = 0;
    int *inode = cw__malloc((size_t)g->n_inputs * sizeof *inode + 1);
    cw_status st = wait && inode ? CW_OK : cw__oom(L);
    for (int i = 0; i < g->n && st == CW_OK; i++)
        if (g->nodes[i].kind == CW__N_INPUT) inode[g->nodes[i].index] = i;
    for (int i = 0; i < g->n && st == CW_OK; i++) {
        if (cw__donor_wait(L, inode, i)) {
            wait[n_wait++] = i;
            continue;
        }
        st = cw__lower_node(L, i);
        for (int k = 0; k < n_wait && st == CW_OK; k++) { /* the waiting outputs whose donor is now read */
            if (L->nd[cw__donor_node(L, inode, wait[k])].reads > 0) continue;
            st = cw__lower_node(L, wait[k]);
            wait[k--] = wait[--n_wait];
        }
    }
    for (int k = 0; k < n_wait && st == CW_OK; k++) st = cw__lower_node(L, wait[k]); /* not reached: inputs are read */
    for (int i = 0; i < g->n && st == CW_OK; i++)
        if (g->nodes[i].kind == CW__N_GN && L->nd[i].gn_part >= 0 && L->nd[i].gn_fin < 0)
            st = cw__release(L, L->nd[i].gn_part);
    if (st == CW_OK) st = cw__donations(L, inode);
    if (st == CW_OK) st = cw__discards(L, inode);
    cw__free(wait), cw__free(inode);
    CW_TRY(st);
    CW_TRY(cw__plan_drops(L->p));
    CW_TRY(cw__plan_sync(L->p));
    L->p->fork_event = L->p->n_events; /* the fork and the joins (execute.c) */
    L->p->n_events += L->p->n_streams;
    return cw__plan_place_activations(L->p);
}

cw_status cw__plan_build(cw_graph *g, const cw_compile_options *opt, int64_t budget, int64_t cap,
                         const unsigned char *rec_allow, int rec_whole, cw_plan **out) {
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
    L.rec_whole = rec_whole;
    if (st == CW_OK) st = cw__lower_graph(&L);
    cw__lower_free(&L);
    if (st != CW_OK) {
        cw__plan_free(p);
        return st;
    }
    *out = p;
    return CW_OK;
}
