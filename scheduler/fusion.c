/* Fusion analysis: which GroupNorm / SiLU / unary op / upsample / replicate pad nodes are
 * absorbed into the prep stage of the convs that read them (a chain GN -> SiLU -> unary ->
 * upsample -> pad, each used only as a conv's x or by the next link), and which convs write
 * through a residual add as an epilogue. */
#include "scheduler/lower.h"

/* A replicate pad (CW_OP_PAD): a link of a conv's prep chain, after the upsample. */
static int cw__is_pad(const cw__node *n) {
    return n->kind == CW__N_OP && n->op == CW_OP_PAD && n->param.i[0] == CW_PAD_REPLICATE;
}

/* A nearest upsample the prep does: cw_graph_upsample2x, or cw_graph_upsample_nearest with
 * equal H and W factors of 1 or 2 and any factor and frame offset along D (cw_up_src_d). */
static int cw__is_up(const cw__node *n) {
    return n->kind == CW__N_UP2 || (n->kind == CW__N_OP && n->op == CW_OP_UPSAMPLE_NEAREST &&
                                    n->param.i[1] == n->param.i[2] && n->param.i[1] <= 2);
}

/* A unary op (CW_OP_UNARY: ReLU, an affine map, ...), the prep's unary link. */
static int cw__is_unary(const cw__node *n) { return n->kind == CW__N_OP && n->op == CW_OP_UNARY; }

/* Order of the links in a fusable chain: GN, SiLU, a unary op, upsample, a replicate pad. */
static int cw__chain_rank(const cw__node *n) {
    return n->kind == CW__N_GN     ? 0
           : n->kind == CW__N_SILU ? 1
           : cw__is_unary(n)       ? 2
           : cw__is_up(n)          ? 3
           : cw__is_pad(n)         ? 4
                                   : 5;
}

static int cw__fusable(const cw__node *n) {
    return n->kind == CW__N_GN || n->kind == CW__N_SILU || cw__is_unary(n) || cw__is_up(n) || cw__is_pad(n);
}

/* 1 when every live consumer of node i takes it as a conv's x or as the input of a later,
 * already fused link of the chain. */
static int cw__fuses(const cw__lower *L, int i) {
    const cw_graph *g = L->g;
    const cw__node *n = &g->nodes[i];
    for (int j = i + 1; j < g->n; j++) {
        const cw__node *c = &g->nodes[j];
        if (!L->nd[j].live) continue;
        for (int a = 0; a < 4; a++) {
            if (c->in[a] != i) continue;
            if (c->kind == CW__N_CONV && a == 0) continue;
            if (L->nd[j].fused && a == 0 && cw__chain_rank(c) > cw__chain_rank(n)) continue;
            return 0;
        }
    }
    return 1;
}

/* The conv whose result node m multiplies, where m may be the scale link of a residual
 * epilogue add(other, m) (cw__fusion_analyse), else -1: m is a binary mul used once, not an
 * output, of a conv of m's dims used only by m and of a tensor s other than the add's other
 * operand, materialised (not fused), so that each of the conv's output bands is scaled by
 * s's rows of that band before the add. s is m's dims or, as m's second operand, broadcast
 * over its channels (cw_graph_binary checked it); a conv of one channel broadcast over s's
 * is not taken (its band is smaller than the product's). */
static int cw__scaled_conv(const cw__lower *L, int m, int other) {
    const cw_graph *g = L->g;
    const cw__node *mn = &g->nodes[m];
    if (mn->kind != CW__N_OP || mn->op != CW_OP_BINARY || mn->param.i[0] != CW_BINARY_MUL || mn->n_uses != 1 ||
        mn->is_output || !L->nd[m].live || mn->in[0] == mn->in[1])
        return -1;
    for (int a = 0; a < 2; a++) {
        const int c = mn->in[a], s = mn->in[1 - a];
        const cw__node *cn = &g->nodes[c];
        if (cn->kind == CW__N_CONV && cn->n_uses == 1 && !cn->is_output && s != other && !L->nd[s].fused &&
            cw__same_dims(&cn->desc, &mn->desc))
            return c;
    }
    return -1;
}

void cw__fusion_analyse(cw__lower *L) {
    cw_graph *g = L->g;
    for (int i = 0; i < g->n; i++) L->nd[i].epi = L->nd[i].epi_into = L->nd[i].add_of = L->nd[i].epi_mul = -1;
    if (!L->fuse) return;
    for (int i = g->n - 1; i >= 0; i--) {
        const cw__node *n = &g->nodes[i];
        if (!cw__fusable(n) || n->is_output || !L->nd[i].live) continue;
        L->nd[i].fused = cw__fuses(L, i);
    }
    /* Residual epilogue: add(a, b) where one operand is a conv used only here (the second
     * first; cw__fusion_recompute may move it to the first, cw__rec_epilogue), or else the
     * conv's result times a tensor read row by row (cw__scaled_conv). */
    for (int i = 0; i < g->n; i++) {
        const cw__node *n = &g->nodes[i];
        if (n->kind != CW__N_ADD || n->in[0] == n->in[1] || !L->nd[i].live) continue;
        for (int a = 1; a >= 0; a--) {
            int c = n->in[a];
            const cw__node *cn = &g->nodes[c];
            if (cn->kind != CW__N_CONV || cn->n_uses != 1 || cn->is_output) continue;
            L->nd[c].add_of = i;
            if (L->nd[i].epi < 0) L->nd[i].epi = c, L->nd[c].epi_into = i;
        }
        for (int a = 1; a >= 0 && L->nd[i].epi < 0; a--) {
            const int m = n->in[a], c = cw__scaled_conv(L, m, n->in[1 - a]);
            if (c >= 0) L->nd[i].epi = L->nd[m].epi = c, L->nd[c].epi_into = i, L->nd[c].epi_mul = m;
        }
    }
}

int cw__fusion_epi_other(const cw__lower *L, int c) {
    const int addn = L->nd[c].epi_into, via = L->nd[c].epi_mul >= 0 ? L->nd[c].epi_mul : c;
    if (addn < 0) return -1;
    const cw__node *a = &L->g->nodes[addn];
    return a->in[0] == via ? a->in[1] : a->in[0];
}

int cw__fusion_epi_scale(const cw__lower *L, int c) {
    const int m = L->nd[c].epi_mul;
    if (m < 0) return -1;
    const cw__node *mn = &L->g->nodes[m];
    return mn->in[0] == c ? mn->in[1] : mn->in[0];
}

int cw__fusion_pad(const cw__lower *L, int x) { return L->nd[x].fused && cw__is_pad(&L->g->nodes[x]) ? x : -1; }

void cw__fusion_chain(const cw__lower *L, int x, int *src, int *gn, int *silu, int *up) {
    const cw_graph *g = L->g;
    *gn = -1, *silu = 0, *up = 1;
    while (L->nd[x].fused) {
        const cw__node *n = &g->nodes[x];
        if (cw__is_up(n)) *up = n->kind == CW__N_UP2 ? 2 : (int)n->param.i[1];
        else if (n->kind == CW__N_SILU) *silu = 1;
        else if (n->kind == CW__N_GN) *gn = x;
        x = n->in[0];
    }
    *src = x;
}

void cw__fusion_unary(const cw__lower *L, int x, int *unary, float *a, float *b) {
    *unary = 0, *a = *b = 0.0f;
    for (; L->nd[x].fused; x = L->g->nodes[x].in[0]) {
        const cw__node *n = &L->g->nodes[x];
        if (cw__is_unary(n)) *unary = (int)n->param.i[0] + 1, *a = n->param.f[0], *b = n->param.f[1];
    }
}

void cw__fusion_dmap(const cw__lower *L, int x, int64_t *up_d, int64_t *off_d) {
    *up_d = 1, *off_d = 0;
    for (; L->nd[x].fused; x = L->g->nodes[x].in[0]) {
        const cw__node *n = &L->g->nodes[x];
        if (n->kind == CW__N_OP && n->op == CW_OP_UPSAMPLE_NEAREST) *up_d = n->param.i[0], *off_d = n->param.i[3];
    }
}

int cw__fusion_unit_reads(const cw__lower *L, int i, int out[4]) {
    const cw__node *n = &L->g->nodes[i];
    int k = 0, gn = -1;
    if (n->kind == CW__N_CONV) {
        int src, silu, up;
        cw__fusion_chain(L, n->in[0], &src, &gn, &silu, &up);
        out[k++] = src;
        const int other = cw__fusion_epi_other(L, i), sc = cw__fusion_epi_scale(L, i);
        if (other >= 0 && other != src) out[k++] = other;
        if (sc >= 0 && sc != src && sc != other) out[k++] = sc;
    } else if (L->nd[i].epi >= 0) {
        return -1; /* part of its conv's unit: the add, or the product between them */
    } else if (n->kind == CW__N_ADD) {
        out[k++] = n->in[0];
        if (n->in[1] != n->in[0]) out[k++] = n->in[1];
    } else if (cw__fusable(n)) {
        if (L->nd[i].fused) return -1;
        out[k++] = n->in[0];
        if (n->kind == CW__N_GN) gn = i;
    } else if (n->kind == CW__N_INPUT || n->kind == CW__N_CONST) {
        return -1;
    } else { /* attention, per-channel ops: each operand once (constants are never freed) */
        for (int a = 0; a < 3 && n->in[a] >= 0; a++) {
            int dup = 0;
            for (int b = 0; b < k; b++) dup |= out[b] == n->in[a];
            if (!dup) out[k++] = n->in[a];
        }
    }
    out[3] = gn;
    return k;
}

/* B's conv reads every output band's input rows (stride and dilation 1 along H, paddings
 * within the kernel's reach): no band of a recompute pass is empty. */
static int cw__rec_consumer_ok(const cw_graph *g, const cw__node *b) {
    const cw_conv_params *c = &b->conv;
    int h = c->spatial - 2;                                   /* H in the params */
    int64_t k = g->nodes[b->in[1]].desc.dims[c->spatial];     /* kernel rows */
    return c->stride[h] == 1 && c->dilation[h] == 1 && c->pad_pre[h] <= k - 1 && c->pad_post[h] <= k - 1;
}

/* x, A's own input, dies at this block: an activation that no lowering unit reads but A's
 * (its prep) and b's (the residual operand, or the shortcut conv reading x), and whose
 * storage can hold the add's result: the add's shape and dtype, or (channels_le: the result
 * of a shortcut block) every dim but the channels equal and no more channels. Views keep
 * their buffer's strides, so the result's row r stays in x's row r of every channel plane.
 * The add's result may then be written into x's storage (cw__inplace_operand). */
static int cw__rec_x_dies(const cw__lower *L, int x, int addn, int a, int b, int channels_le) {
    const cw_graph *g = L->g;
    const cw__node *nx = &g->nodes[x], *nadd = &g->nodes[addn];
    if (nx->kind == CW__N_INPUT || nx->kind == CW__N_CONST || nx->is_output || L->nd[x].fused ||
        nx->desc.rank != nadd->desc.rank || nx->desc.dtype != nadd->desc.dtype)
        return 0;
    for (int d = 0; d < nx->desc.rank; d++)
        if (nx->desc.dims[d] != nadd->desc.dims[d] && !(channels_le && d == 1 && nadd->desc.dims[d] < nx->desc.dims[d]))
            return 0;
    int readers = 0;
    for (int i = x + 1; i < g->n; i++) {
        int rd[4];
        int k = L->nd[i].live ? cw__fusion_unit_reads(L, i, rd) : -1;
        for (int r = 0; r < k; r++) {
            if (rd[r] != x) continue;
            if (i != a && i != b) return 0;
            readers++;
        }
    }
    return readers == 2;
}

/* Walks node n's live readers (n is conv a or a fused link after it): each must take it as
 * a conv's x (a conv whose bands never come out empty, cw__rec_consumer_ok) or be a fused
 * GN/SiLU/unary/pad link whose own readers pass the same test; an upsample, an add, attention or
 * an output read of a's result needs it stored. Counts the conv readers in *convs (their
 * last in *last) and the GroupNorms on the way in *gns. Returns 1 when every reader passes. */
static int cw__rec_readers(const cw__lower *L, int n, int *convs, int *last, int *gns) {
    const cw_graph *g = L->g;
    if (g->nodes[n].is_output) return 0;
    for (int j = n + 1; j < g->n; j++) {
        const cw__node *c = &g->nodes[j];
        if (!L->nd[j].live) continue;
        for (int s = 0; s < 4; s++) {
            if (c->in[s] != n) continue;
            if (c->kind == CW__N_CONV && s == 0 && cw__rec_consumer_ok(g, c)) {
                (*convs)++, *last = j;
            } else if (L->nd[j].fused && s == 0 &&
                       (c->kind == CW__N_GN || c->kind == CW__N_SILU || cw__is_unary(c) || cw__is_pad(c))) {
                *gns += c->kind == CW__N_GN;
                if (!cw__rec_readers(L, j, convs, last, gns)) return 0;
            } else {
                return 0;
            }
        }
    }
    return 1;
}

/* Conv a may be recomputed: allowed, not written through an add, and read only by convs
 * (directly or through fused GN/SiLU links). Where its one reader B adds a's own input x as
 * its residual, recomputing saves a's result only if B's result then takes x's storage,
 * band by band, while later bands' recomputes still read x's rows (lower_conv.c orders those
 * reads before each band's write); without that, the add needs a buffer of its own beside
 * x and recomputing saves nothing. With several readers that case is not recomputed. */
static int cw__rec_candidate(const cw__lower *L, int a, int *gns) {
    const cw_graph *g = L->g;
    const cw__node *na = &g->nodes[a];
    int convs = 0, b = -1;
    *gns = 0;
    if (na->kind != CW__N_CONV || !L->nd[a].live || L->nd[a].epi_into >= 0 || !L->rec_allow[a] ||
        !cw__rec_readers(L, a, &convs, &b, gns) || convs == 0 || (convs > 1 && L->rec_allow[a] < 2))
        return 0;
    int asrc, ag, as, au;
    cw__fusion_chain(L, na->in[0], &asrc, &ag, &as, &au);
    for (int j = a + 1; j < g->n; j++) { /* the readers whose residual is x */
        int src, gn, silu, up, addn = L->nd[j].epi_into;
        if (g->nodes[j].kind != CW__N_CONV || !L->nd[j].live || addn < 0) continue;
        cw__fusion_chain(L, g->nodes[j].in[0], &src, &gn, &silu, &up);
        if (src != a || cw__fusion_epi_other(L, j) != asrc) continue;
        if (convs > 1 || !cw__rec_x_dies(L, asrc, addn, a, j, 0)) return 0;
    }
    return 1;
}

/* Conv b recomputes A per band and adds a shortcut conv S through its epilogue, where S
 * reads A's own input x (unfused) and maps each output row to the same input row (kernel 1,
 * stride 1, no padding along H), nothing but the add reads S, and x dies at this block with
 * room for the add's result (a ResNet block changing channels, 1x1 shortcut). Then S is
 * recomputed: each band of it is computed in b's epilogue from x's rows of that band, and
 * the add's result is written over x, band by band, after the later bands' recomputes of A
 * have read their halo rows (lower_conv.c). S costs no FLOPs twice, and neither its result
 * nor the add's needs storage of its own: the block holds x alone. */
static int cw__rec_shortcut(const cw__lower *L, int b, int addn, int S) {
    const cw_graph *g = L->g;
    const int A = L->nd[b].rec_of;
    const cw__node *ns = &g->nodes[S];
    if (ns->kind != CW__N_CONV || !L->nd[S].live || !L->rec_allow[S] || L->nd[S].rec || L->nd[S].add_of != addn ||
        ns->in[0] < 0 || L->nd[ns->in[0]].fused)
        return 0;
    int asrc, ag, as, au;
    cw__fusion_chain(L, g->nodes[A].in[0], &asrc, &ag, &as, &au);
    const cw_conv_params *c = &ns->conv;
    int h = c->spatial - 2;
    return asrc == ns->in[0] && g->nodes[ns->in[1]].desc.dims[c->spatial] == 1 && c->stride[h] == 1 &&
           c->pad_pre[h] == 0 && c->pad_post[h] == 0 && cw__rec_x_dies(L, asrc, addn, A, S, 1);
}

/* Conv b, recomputing A, adds a shortcut S (add_of): where cw__rec_shortcut holds, S is
 * recomputed in b's epilogue -- the epilogue moving to b where the add took S first
 * (add(conv2, shortcut): HunyuanVideo, CogVideoX, Wan; SD adds shortcut + conv2). Where it
 * does not, the epilogue stays where it is (stored, either order holds as much, but the
 * pages a cpu plan gives back differ: drops.c). */
static void cw__rec_epilogue(cw__lower *L, int b) {
    const cw_graph *g = L->g;
    const int addn = L->nd[b].add_of;
    if (addn < 0 || L->nd[addn].epi < 0) return;
    const int S = g->nodes[addn].in[0] == b ? g->nodes[addn].in[1] : g->nodes[addn].in[0];
    if (!cw__rec_shortcut(L, b, addn, S)) return;
    if (L->nd[addn].epi == S) L->nd[S].epi_into = -1, L->nd[addn].epi = b, L->nd[b].epi_into = addn;
    L->nd[S].rec = L->nd[S].rec_epi = 1;
}

void cw__fusion_recompute(cw__lower *L) {
    const cw_graph *g = L->g;
    for (int i = 0; i < g->n; i++) L->nd[i].rec = L->nd[i].rec_stats = L->nd[i].rec_epi = 0, L->nd[i].rec_of = -1;
    if (!L->fuse || L->none || !L->rec_allow) return;
    for (int a = 0; a < g->n; a++) {
        int gns = 0;
        if (!cw__rec_candidate(L, a, &gns)) continue;
        L->nd[a].rec = 1;
        L->nd[a].rec_stats = gns > 0;
    }
    for (int j = 0; j < g->n; j++) { /* every conv reading a recomputed one recomputes its bands */
        int src, gn, silu, up;
        if (g->nodes[j].kind != CW__N_CONV || !L->nd[j].live) continue;
        cw__fusion_chain(L, g->nodes[j].in[0], &src, &gn, &silu, &up);
        if (L->nd[src].rec) L->nd[j].rec_of = src;
    }
    for (int j = 0; j < g->n; j++) /* shortcuts computed band by band in their add's epilogue */
        if (g->nodes[j].kind == CW__N_CONV && L->nd[j].rec_of >= 0) cw__rec_epilogue(L, j);
}

int cw__fusion_inplace_target(const cw__lower *L, int other) {
    return other >= 0 && L->nd[other].rec_epi ? L->g->nodes[other].in[0] : other;
}
