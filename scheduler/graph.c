/* The graph API: nodes appended in topological order (operands must exist), shapes
 * inferred and validated as each node is added so errors name the offending call. A graph
 * has one element type, f32, f16 or bf16, for its activations, conv weights and conv biases:
 * a node of another is refused, naming it and both types (no implicit casts; one type keeps
 * every buffer's size and every kernel's operands known from the graph alone). GroupNorm
 * gamma/beta and the per-channel ops' vectors are f32 in every graph: the backends read them
 * once per channel into f32 scale/shift and multipliers, so half storage would save a few
 * KiB and cost a conversion in each. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "kernels/kernels.h"
#include "scheduler/planner.h"
#include "scheduler/sched.h"

cw_status cw_graph_create(cw_graph **out, cw_context *ctx) {
    if (!out || !ctx) return CW_ERR_INVALID_ARG;
    *out = NULL;
    cw_graph *g = cw__calloc(1, sizeof *g);
    if (!g) return cw__error(ctx, CW_ERR_OUT_OF_MEMORY, "cw_graph_create: out of host memory");
    g->ctx = ctx;
    g->dtype_node = -1;
    *out = g;
    return CW_OK;
}

void cw_graph_destroy(cw_graph *g) {
    if (!g) return;
    cw__free(g->nodes);
    cw__free(g);
}

const cw__node *cw__graph_node(const cw_graph *g, cw_node id) {
    return (id >= 0 && id < g->n) ? &g->nodes[id] : NULL;
}

static cw_status cw__node_add(cw_graph *g, cw__nkind kind, const char *name, cw__node **out, cw_node *id) {
    if (g->n == g->cap) {
        int cap = g->cap ? g->cap * 2 : 64;
        cw__node *nn = cw__realloc(g->nodes, (size_t)cap * sizeof *nn);
        if (!nn) return cw__error(g->ctx, CW_ERR_OUT_OF_MEMORY, "graph: out of host memory");
        g->nodes = nn;
        g->cap = cap;
    }
    cw__node *n = &g->nodes[g->n];
    memset(n, 0, sizeof *n);
    n->kind = kind;
    for (int i = 0; i < 4; i++) n->in[i] = -1;
    snprintf(n->name, sizeof n->name, "%s", name ? name : "");
    n->index = -1;
    *out = n;
    *id = g->n++;
    return CW_OK;
}

static cw_status cw__operand(cw_graph *g, cw_node x, const char *call, const char *arg, const cw__node **out) {
    const cw__node *n = cw__graph_node(g, x);
    if (!n) return cw__error(g->ctx, CW_ERR_INVALID_ARG, "%s: %s = %d is not a node of this graph", call, arg, (int)x);
    *out = n;
    return CW_OK;
}

static void cw__use(cw_graph *g, cw_node x) {
    if (x >= 0) g->nodes[x].n_uses++;
}

/* "input 'latent' (node 0)", "constant 'w' (node 3)", "conv3x3 4->8 (node 5)". */
static const char *cw__node_label(const cw_graph *g, int id, char *buf, size_t n) {
    const cw__node *nd = &g->nodes[id];
    if (nd->kind == CW__N_INPUT || nd->kind == CW__N_CONST)
        snprintf(buf, n, "%s '%s' (node %d)", nd->kind == CW__N_INPUT ? "input" : "constant", nd->name, id);
    else
        snprintf(buf, n, "%s (node %d)", nd->name, id);
    return buf;
}

/* The node whose element type a call's operands must have: the one that fixed the graph's,
 * or, while none has, the call's first operand (fixed when the call succeeds). */
static int cw__dtype_ref(const cw_graph *g, int first) { return g->dtype_node >= 0 ? g->dtype_node : first; }

static void cw__dtype_fix(cw_graph *g, int first) {
    if (g->dtype_node >= 0) return;
    g->dtype_node = first;
    g->dtype = g->nodes[first].desc.dtype;
}

/* Operand `arg` (node id) of `call` has ref's element type, or the call fails naming both. */
static cw_status cw__dtype_check(cw_graph *g, int id, int ref, const char *call, const char *arg) {
    const cw_dtype dt = g->nodes[id].desc.dtype, want = g->nodes[ref].desc.dtype;
    if (dt == want) return CW_OK;
    char a[128], b[128];
    cw__node_label(g, id, a, sizeof a);
    cw__node_label(g, ref, b, sizeof b);
    if (ref == g->dtype_node)
        return cw__error(g->ctx, CW_ERR_INVALID_ARG, "%s: %s, %s, is %s but the graph is %s (since %s): a graph has one "
                         "element type for its activations, conv weights and biases", call, arg, a,
                         cw__dtype_name(dt), cw__dtype_name(want), b);
    return cw__error(g->ctx, CW_ERR_INVALID_ARG, "%s: %s, %s, is %s but %s is %s: a graph has one element type for its "
                     "activations, conv weights and biases", call, arg, a, cw__dtype_name(dt), b, cw__dtype_name(want));
}

cw_status cw_graph_input(cw_graph *g, cw_node *out, const char *name, const cw_tensor_desc *desc) {
    if (!g || !out || !desc) return CW_ERR_INVALID_ARG;
    *out = CW_NODE_NONE;
    if (cw_dtype_size(desc->dtype) == 0)
        return cw__error(g->ctx, CW_ERR_INVALID_ARG, "cw_graph_input '%s': dtype %d is not a cw_dtype",
                         name ? name : "", (int)desc->dtype);
    if (g->dtype_node >= 0 && desc->dtype != g->dtype) {
        char b[128];
        return cw__error(g->ctx, CW_ERR_INVALID_ARG, "cw_graph_input '%s': is %s but the graph is %s (since %s): a graph "
                         "has one element type for its activations, conv weights and biases", name ? name : "",
                         cw__dtype_name(desc->dtype), cw__dtype_name(g->dtype),
                         cw__node_label(g, g->dtype_node, b, sizeof b));
    }
    cw_tensor_desc d;
    if (cw_tensor_desc_make(&d, desc->dtype, desc->rank, desc->dims) != CW_OK)
        return cw__error(g->ctx, CW_ERR_INVALID_ARG, "cw_graph_input '%s': bad rank %d or dims", name ? name : "",
                         desc->rank);
    cw__node *n = NULL;
    CW_TRY(cw__node_add(g, CW__N_INPUT, name, &n, out));
    n->desc = d;
    n->index = g->n_inputs++;
    cw__dtype_fix(g, *out);
    return CW_OK;
}

cw_status cw_graph_constant(cw_graph *g, cw_node *out, const char *name, const cw_tensor *t) {
    if (!g || !out || !t) return CW_ERR_INVALID_ARG;
    *out = CW_NODE_NONE;
    if (t->ctx != g->ctx)
        return cw__error(g->ctx, CW_ERR_INVALID_ARG, "cw_graph_constant '%s': tensor belongs to another context",
                         name ? name : "");
    cw__node *n = NULL;
    CW_TRY(cw__node_add(g, CW__N_CONST, name, &n, out));
    n->desc = t->desc;
    n->t = t;
    return CW_OK;
}

cw_status cw_graph_conv(cw_graph *g, cw_node *out, cw_node x, cw_node w, cw_node b, const cw_conv_params *p) {
    if (!g || !out || !p) return CW_ERR_INVALID_ARG;
    *out = CW_NODE_NONE;
    const cw__node *nx = NULL, *nw = NULL, *nb = NULL;
    cw_status st;
    CW_TRY(cw__operand(g, x, "cw_graph_conv", "x", &nx));
    CW_TRY(cw__operand(g, w, "cw_graph_conv", "w", &nw));
    if (b != CW_NODE_NONE) CW_TRY(cw__operand(g, b, "cw_graph_conv", "b", &nb));
    if (nw->kind != CW__N_CONST || (nb && nb->kind != CW__N_CONST))
        return cw__error(g->ctx, CW_ERR_UNSUPPORTED, "cw_graph_conv: w and b must be constants (cw_graph_constant)");
    const int ref = cw__dtype_ref(g, x);
    CW_TRY(cw__dtype_check(g, x, ref, "cw_graph_conv", "x"));
    CW_TRY(cw__dtype_check(g, w, ref, "cw_graph_conv", "w"));
    if (nb) CW_TRY(cw__dtype_check(g, b, ref, "cw_graph_conv", "b"));
    cw_tensor_desc y;
    if ((st = cw__conv_validate(g->ctx, &nx->desc, &nw->desc, nb ? &nb->desc : NULL, NULL, p, &y)) != CW_OK)
        return st;
    if (nb && !cw__desc_is_contiguous(&nb->desc))
        return cw__error(g->ctx, CW_ERR_UNSUPPORTED, "cw_graph_conv: the bias b must be a contiguous tensor");
    /* nw/nx point into g->nodes, which cw__node_add may move */
    const cw_tensor_desc wd = nw->desc, xd = nx->desc;
    cw__node *n = NULL;
    CW_TRY(cw__node_add(g, CW__N_CONV, NULL, &n, out));
    n->desc = y;
    n->in[0] = x, n->in[1] = w, n->in[2] = b;
    n->conv = *p;
    snprintf(n->name, sizeof n->name, "conv%" PRId64 "x%" PRId64 " %" PRId64 "->%" PRId64, wd.dims[wd.rank - 2],
             wd.dims[wd.rank - 1], xd.dims[1], y.dims[1]);
    cw__use(g, x);
    cw__dtype_fix(g, x);
    return CW_OK;
}

static cw_status cw__check_vec(cw_graph *g, cw_node v, int64_t c, const char *call, const char *arg) {
    const cw__node *n = NULL;
    CW_TRY(cw__operand(g, v, call, arg, &n));
    if (n->kind != CW__N_CONST || n->desc.rank != 1 || n->desc.dims[0] != c || n->desc.dtype != CW_F32 ||
        !cw__desc_is_contiguous(&n->desc)) {
        char buf[96];
        return cw__error(g->ctx, CW_ERR_INVALID_ARG, "%s: %s must be a contiguous f32 constant of dims [%" PRId64
                         "] (f32 in graphs of every dtype), got %s%s %s", call, arg, c,
                         n->kind == CW__N_CONST ? "" : "a computed ", cw__dtype_name(n->desc.dtype),
                         cw__dims_str(&n->desc, buf, sizeof buf));
    }
    return CW_OK;
}

/* Activation operand `arg` of `call`: rank 4 or 5, and of the element type of node `ref`
 * (cw__dtype_ref; -1: x is the call's first operand). */
static cw_status cw__check_act(cw_graph *g, cw_node x, int ref, const char *call, const char *arg,
                               const cw__node **nx) {
    CW_TRY(cw__operand(g, x, call, arg, nx));
    if ((*nx)->desc.rank != 4 && (*nx)->desc.rank != 5) {
        char buf[96];
        return cw__error(g->ctx, CW_ERR_INVALID_ARG, "%s: %s must be [N, C, H, W] or [N, C, D, H, W], got %s", call,
                         arg, cw__dims_str(&(*nx)->desc, buf, sizeof buf));
    }
    return cw__dtype_check(g, x, ref >= 0 ? ref : cw__dtype_ref(g, x), call, arg);
}

cw_status cw_graph_group_norm(cw_graph *g, cw_node *out, cw_node x, cw_node gamma, cw_node beta, int64_t groups,
                              float eps) {
    if (!g || !out) return CW_ERR_INVALID_ARG;
    *out = CW_NODE_NONE;
    const cw__node *nx = NULL;
    CW_TRY(cw__check_act(g, x, -1, "cw_graph_group_norm", "x", &nx));
    int64_t c = nx->desc.dims[1];
    if (groups < 1 || c % groups != 0)
        return cw__error(g->ctx, CW_ERR_INVALID_ARG, "cw_graph_group_norm: groups = %" PRId64
                         " must divide channels C = %" PRId64, groups, c);
    if (!(eps > 0.0f)) return cw__error(g->ctx, CW_ERR_INVALID_ARG, "cw_graph_group_norm: eps = %g must be > 0", eps);
    CW_TRY(cw__check_vec(g, gamma, c, "cw_graph_group_norm", "gamma"));
    CW_TRY(cw__check_vec(g, beta, c, "cw_graph_group_norm", "beta"));
    cw__node *n = NULL;
    CW_TRY(cw__node_add(g, CW__N_GN, "group_norm", &n, out));
    n->desc = g->nodes[x].desc;
    n->in[0] = x, n->in[1] = gamma, n->in[2] = beta;
    n->groups = groups;
    n->eps = eps;
    cw__use(g, x);
    cw__dtype_fix(g, x);
    return CW_OK;
}

static cw_status cw__unary(cw_graph *g, cw_node *out, cw_node x, cw__nkind kind, const char *call) {
    if (!g || !out) return CW_ERR_INVALID_ARG;
    *out = CW_NODE_NONE;
    const cw__node *nx = NULL;
    CW_TRY(cw__check_act(g, x, -1, call, "x", &nx));
    cw_tensor_desc d = nx->desc;
    cw__node *n = NULL;
    CW_TRY(cw__node_add(g, kind, kind == CW__N_SILU ? "silu" : "upsample2x", &n, out));
    if (kind == CW__N_UP2) {
        d.dims[d.rank - 2] *= 2;
        d.dims[d.rank - 1] *= 2;
        memset(d.strides, 0, sizeof d.strides);
        cw__desc_fill_strides(&d);
    }
    n->desc = d;
    n->in[0] = x;
    cw__use(g, x);
    cw__dtype_fix(g, x);
    return CW_OK;
}

cw_status cw_graph_silu(cw_graph *g, cw_node *out, cw_node x) { return cw__unary(g, out, x, CW__N_SILU, "cw_graph_silu"); }
cw_status cw_graph_upsample2x(cw_graph *g, cw_node *out, cw_node x) {
    return cw__unary(g, out, x, CW__N_UP2, "cw_graph_upsample2x");
}

cw_status cw_graph_add(cw_graph *g, cw_node *out, cw_node a, cw_node b) {
    if (!g || !out) return CW_ERR_INVALID_ARG;
    *out = CW_NODE_NONE;
    const cw__node *na = NULL, *nb = NULL;
    CW_TRY(cw__check_act(g, a, -1, "cw_graph_add", "a", &na));
    CW_TRY(cw__check_act(g, b, cw__dtype_ref(g, a), "cw_graph_add", "b", &nb));
    if (!cw__same_dims(&na->desc, &nb->desc)) {
        char b1[96], b2[96];
        return cw__error(g->ctx, CW_ERR_INVALID_ARG, "cw_graph_add: a %s and b %s differ in shape",
                         cw__dims_str(&na->desc, b1, sizeof b1), cw__dims_str(&nb->desc, b2, sizeof b2));
    }
    cw__node *n = NULL;
    CW_TRY(cw__node_add(g, CW__N_ADD, "add", &n, out));
    n->desc = g->nodes[a].desc;
    n->in[0] = a, n->in[1] = b;
    cw__use(g, a);
    cw__dtype_fix(g, a);
    cw__use(g, b);
    return CW_OK;
}

/* A generic op (kernels/kernels.h: CW_OP_*) of the checked operands in[0..n_in): the node,
 * sized by the op's shape rule. Activation operands count as uses; in[0] is an activation
 * and fixes the graph's dtype if nothing did. */
static cw_status cw__op_node(cw_graph *g, cw_node *out, int code, const cw_op_param *pm, const cw_node *in,
                             const char *call, const char *name) {
    const cw_op_info info = cw_op_get_info(code);
    const cw_tensor_desc *ind[CW_OP_MAX_IN] = {NULL}; /* gcc cannot see that the rule reads only n_in */
    for (int k = 0; k < info.n_in; k++) ind[k] = &g->nodes[in[k]].desc;
    cw_tensor_desc d;
    if (!cw_op_out_dims(code, pm, ind, &d)) /* the builder checked what the rule needs */
        return cw__error(g->ctx, CW_ERR_INTERNAL, "%s: operands outside the %s op's shape rule", call, info.name);
    cw__node *n = NULL;
    CW_TRY(cw__node_add(g, CW__N_OP, name, &n, out));
    n->desc = d;
    n->op = code;
    n->param = *pm;
    for (int k = 0; k < info.n_in; k++) {
        n->in[k] = in[k];
        if (g->nodes[in[k]].kind != CW__N_CONST) cw__use(g, in[k]);
    }
    cw__dtype_fix(g, in[0]);
    return CW_OK;
}

/* A per-channel op (kernels/kernels.h: CW_CHANNEL_*) of activation x by the [C] constant v. */
static cw_status cw__channel(cw_graph *g, cw_node *out, cw_node x, cw_node v, int op, const char *call,
                             const char *arg, const char *name) {
    if (!g || !out) return CW_ERR_INVALID_ARG;
    *out = CW_NODE_NONE;
    const cw__node *nx = NULL;
    CW_TRY(cw__check_act(g, x, -1, call, "x", &nx));
    CW_TRY(cw__check_vec(g, v, nx->desc.dims[1], call, arg));
    cw_op_param pm = {{op}, {0}};
    const cw_node in[2] = {x, v};
    return cw__op_node(g, out, CW_OP_CHANNEL, &pm, in, call, name);
}

cw_status cw_graph_scale(cw_graph *g, cw_node *out, cw_node x, cw_node s) {
    return cw__channel(g, out, x, s, CW_CHANNEL_SCALE, "cw_graph_scale", "s", "scale");
}

cw_status cw_graph_avg_pool2(cw_graph *g, cw_node *out, cw_node x) {
    if (!g || !out) return CW_ERR_INVALID_ARG;
    *out = CW_NODE_NONE;
    const cw__node *nx = NULL;
    CW_TRY(cw__check_act(g, x, -1, "cw_graph_avg_pool2", "x", &nx));
    const cw_tensor_desc *d = &nx->desc;
    if (d->dims[d->rank - 2] % 2 || d->dims[d->rank - 1] % 2) {
        char buf[96];
        return cw__error(g->ctx, CW_ERR_INVALID_ARG, "cw_graph_avg_pool2: x %s must have even H and W",
                         cw__dims_str(d, buf, sizeof buf));
    }
    const cw_op_param pm = {{0}, {0}};
    return cw__op_node(g, out, CW_OP_AVG_POOL2, &pm, &x, "cw_graph_avg_pool2", "avg_pool2");
}

/* The attention node of cw_graph_attention (block 0) and cw_graph_attention_blocks; fn
 * names the caller in messages. */
static cw_status cw__attention(cw_graph *g, cw_node *out, cw_node q, cw_node k, cw_node v, float scale, int64_t block,
                               int mask, const char *fn) {
    if (!g || !out) return CW_ERR_INVALID_ARG;
    *out = CW_NODE_NONE;
    const cw__node *nq = NULL, *nk = NULL, *nv = NULL;
    CW_TRY(cw__check_act(g, q, -1, fn, "q", &nq));
    CW_TRY(cw__check_act(g, k, cw__dtype_ref(g, q), fn, "k", &nk));
    CW_TRY(cw__check_act(g, v, cw__dtype_ref(g, q), fn, "v", &nv));
    if (!cw__same_dims(&nq->desc, &nk->desc) || !cw__same_dims(&nq->desc, &nv->desc)) {
        char b1[96], b2[96], b3[96];
        return cw__error(g->ctx, CW_ERR_INVALID_ARG, "%s: q %s, k %s, v %s must have equal shapes", fn,
                         cw__dims_str(&nq->desc, b1, sizeof b1), cw__dims_str(&nk->desc, b2, sizeof b2),
                         cw__dims_str(&nv->desc, b3, sizeof b3));
    }
    if (!(scale > 0.0f)) return cw__error(g->ctx, CW_ERR_INVALID_ARG, "%s: scale = %g must be > 0", fn, scale);
    const int64_t T = cw__desc_numel(&nq->desc) / (nq->desc.dims[0] * nq->desc.dims[1]);
    if (block < 0 || block > T) {
        char b1[96];
        return cw__error(g->ctx, CW_ERR_INVALID_ARG, "%s: block = %" PRId64 " must be in 1..%" PRId64
                         " (the tokens of q %s)", fn, block, T, cw__dims_str(&nq->desc, b1, sizeof b1));
    }
    cw__node *n = NULL;
    CW_TRY(cw__node_add(g, CW__N_ATTN,
                        !block ? "attention" : mask == CW_ATTENTION_BLOCK_CAUSAL ? "block-causal attention"
                                                                                 : "block-diagonal attention",
                        &n, out));
    n->desc = g->nodes[q].desc;
    n->in[0] = q, n->in[1] = k, n->in[2] = v;
    n->scale = scale;
    n->block = block;
    n->mask = mask;
    cw__use(g, q);
    cw__dtype_fix(g, q);
    cw__use(g, k);
    cw__use(g, v);
    return CW_OK;
}

cw_status cw_graph_attention(cw_graph *g, cw_node *out, cw_node q, cw_node k, cw_node v, float scale) {
    return cw__attention(g, out, q, k, v, scale, 0, 0, "cw_graph_attention");
}

cw_status cw_graph_attention_blocks(cw_graph *g, cw_node *out, cw_node q, cw_node k, cw_node v, float scale,
                                    int64_t block, cw_attention_mask mask) {
    static const char fn[] = "cw_graph_attention_blocks";
    if (g && out && (block < 1 || (mask != CW_ATTENTION_BLOCK_CAUSAL && mask != CW_ATTENTION_BLOCK_DIAGONAL))) {
        *out = CW_NODE_NONE;
        if (block < 1) return cw__error(g->ctx, CW_ERR_INVALID_ARG, "%s: block = %" PRId64 " must be >= 1", fn, block);
        return cw__error(g->ctx, CW_ERR_INVALID_ARG, "%s: mask = %d is not a cw_attention_mask", fn, (int)mask);
    }
    return cw__attention(g, out, q, k, v, scale, block, (int)mask, fn);
}

cw_status cw_graph_output(cw_graph *g, cw_node node, const char *name) {
    if (!g) return CW_ERR_INVALID_ARG;
    const cw__node *n = NULL;
    CW_TRY(cw__operand(g, node, "cw_graph_output", "node", &n));
    if (n->kind == CW__N_INPUT || n->kind == CW__N_CONST)
        return cw__error(g->ctx, CW_ERR_UNSUPPORTED, "cw_graph_output: node %d is an input or constant, not computed",
                         (int)node);
    if (n->is_output) return cw__error(g->ctx, CW_ERR_INVALID_ARG, "cw_graph_output: node %d is already an output", (int)node);
    if (g->n_outputs == (int)(sizeof g->outputs / sizeof g->outputs[0]))
        return cw__error(g->ctx, CW_ERR_UNSUPPORTED, "cw_graph_output: at most %d outputs", CW__MAX_OUTPUTS);
    g->nodes[node].is_output = 1;
    g->nodes[node].index = g->n_outputs;
    if (name && name[0]) snprintf(g->nodes[node].oname, sizeof g->nodes[node].oname, "%s", name);
    g->outputs[g->n_outputs++] = node;
    return CW_OK;
}

cw_status cw_graph_donate(cw_graph *g, int input, int output) {
    static const char fn[] = "cw_graph_donate";
    if (!g) return CW_ERR_INVALID_ARG;
    if (input < 0 || input >= g->n_inputs)
        return cw__error(g->ctx, CW_ERR_INVALID_ARG, "%s: input = %d, the graph has %d inputs", fn, input, g->n_inputs);
    if (output < -1 || output >= g->n_outputs)
        return cw__error(g->ctx, CW_ERR_INVALID_ARG, "%s: output = %d, the graph has %d outputs (-1: none)", fn, output,
                         g->n_outputs);
    cw__node *in = NULL;
    for (int i = 0; i < g->n && !in; i++)
        if (g->nodes[i].kind == CW__N_INPUT && g->nodes[i].index == input) in = &g->nodes[i];
    if (!in) return cw__error(g->ctx, CW_ERR_INTERNAL, "%s: input %d has no node", fn, input);
    if (in->donor)
        return cw__error(g->ctx, CW_ERR_INVALID_ARG, "%s: input %d is already donated (to no output)", fn, input);
    for (int k = 0; k < g->n_outputs; k++)
        if (g->nodes[g->outputs[k]].donor == input + 1)
            return cw__error(g->ctx, CW_ERR_INVALID_ARG, "%s: input %d is already donated to output %d", fn, input, k);
    if (output < 0) {
        in->donor = 1;
        return CW_OK;
    }
    cw__node *o = &g->nodes[g->outputs[output]];
    if (o->donor) return cw__error(g->ctx, CW_ERR_INVALID_ARG, "%s: output %d already has input %d donated", fn, output,
                                   o->donor - 1);
    int same = in->desc.rank == o->desc.rank && in->desc.dtype == o->desc.dtype;
    for (int d = 0; same && d < o->desc.rank; d++) same = in->desc.dims[d] == o->desc.dims[d];
    if (!same) {
        char a[96], b[96];
        return cw__error(g->ctx, CW_ERR_INVALID_ARG,
                         "%s: input %d is %s %s, output %d is %s %s: a donation needs one shape and dtype", fn, input,
                         cw__dtype_name(in->desc.dtype), cw__dims_str(&in->desc, a, sizeof a), output,
                         cw__dtype_name(o->desc.dtype), cw__dims_str(&o->desc, b, sizeof b));
    }
    o->donor = input + 1;
    return CW_OK;
}

cw_status cw_graph_get_node_desc(const cw_graph *g, cw_tensor_desc *out, cw_node node) {
    if (!g || !out) return CW_ERR_INVALID_ARG;
    const cw__node *n = cw__graph_node(g, node);
    if (!n) return cw__error(g->ctx, CW_ERR_INVALID_ARG, "cw_graph_get_node_desc: %d is not a node", (int)node);
    *out = n->desc;
    return CW_OK;
}

cw_status cw_graph_unary(cw_graph *g, cw_node *out, cw_node x, cw_unary_op op, float a, float b) {
    if (!g || !out) return CW_ERR_INVALID_ARG;
    *out = CW_NODE_NONE;
    const cw__node *nx = NULL;
    cw_status st;
    if ((int)op < 0 || (int)op >= CW_UNARY_OP_COUNT)
        return cw__error(g->ctx, CW_ERR_INVALID_ARG, "cw_graph_unary: op = %d is not a cw_unary_op (0..%d)", (int)op,
                         CW_UNARY_OP_COUNT - 1);
    if (op == CW_UNARY_CLAMP && (a != a || b != b))
        return cw__error(g->ctx, CW_ERR_INVALID_ARG, "cw_graph_unary: CW_UNARY_CLAMP's bounds a = %g, b = %g must not "
                         "be NaN (-INFINITY or INFINITY leaves a side open)", a, b);
    if ((st = cw__check_act(g, x, -1, "cw_graph_unary", "x", &nx)) != CW_OK) return st;
    static const char *const names[CW_UNARY_OP_COUNT] = {"relu",  "tanh",  "sigmoid", "gelu", "gelu_tanh",
                                                         "affine", "clamp", "rsqrt",   "square", "pow"};
    const cw_op_param pm = {{op}, {a, b}};
    return cw__op_node(g, out, CW_OP_UNARY, &pm, &x, "cw_graph_unary", names[op]);
}

cw_status cw_graph_binary(cw_graph *g, cw_node *out, cw_node a, cw_node b, cw_binary_op op) {
    if (!g || !out) return CW_ERR_INVALID_ARG;
    *out = CW_NODE_NONE;
    const cw__node *na = NULL, *nb = NULL;
    cw_status st;
    if ((int)op < 0 || (int)op >= CW_BINARY_OP_COUNT)
        return cw__error(g->ctx, CW_ERR_INVALID_ARG, "cw_graph_binary: op = %d is not a cw_binary_op (0..%d)", (int)op,
                         CW_BINARY_OP_COUNT - 1);
    if ((st = cw__check_act(g, a, -1, "cw_graph_binary", "a", &na)) != CW_OK) return st;
    if ((st = cw__check_act(g, b, cw__dtype_ref(g, a), "cw_graph_binary", "b", &nb)) != CW_OK) return st;
    cw_tensor_desc bc = nb->desc; /* b as a's channels would make it: broadcasting over them */
    bc.dims[1] = bc.dims[1] == 1 ? na->desc.dims[1] : bc.dims[1];
    if (!cw__same_dims(&na->desc, &bc)) {
        char b1[96], b2[96];
        return cw__error(g->ctx, CW_ERR_INVALID_ARG,
                         "cw_graph_binary: a %s and b %s differ in shape (b must have a's dims, or 1 channel to "
                         "broadcast over a's)",
                         cw__dims_str(&na->desc, b1, sizeof b1), cw__dims_str(&nb->desc, b2, sizeof b2));
    }
    static const char *const names[CW_BINARY_OP_COUNT] = {"mul", "sub", "div", "max", "min"};
    const cw_op_param pm = {{op}, {0}};
    const cw_node in[2] = {a, b};
    return cw__op_node(g, out, CW_OP_BINARY, &pm, in, "cw_graph_binary", names[op]);
}

cw_status cw_graph_shift(cw_graph *g, cw_node *out, cw_node x, cw_node v) {
    return cw__channel(g, out, x, v, CW_CHANNEL_SHIFT, "cw_graph_shift", "v", "shift");
}

cw_status cw_graph_upsample_nearest(cw_graph *g, cw_node *out, cw_node x, const int64_t factors[3]) {
    if (!g || !out) return CW_ERR_INVALID_ARG;
    *out = CW_NODE_NONE;
    const cw__node *nx = NULL;
    cw_status st;
    if (!factors) return cw__error(g->ctx, CW_ERR_INVALID_ARG, "cw_graph_upsample_nearest: factors is NULL");
    if ((st = cw__check_act(g, x, -1, "cw_graph_upsample_nearest", "x", &nx)) != CW_OK) return st;
    static const char dim_names[3] = {'D', 'H', 'W'};
    for (int k = 0; k < 3; k++)
        if (factors[k] < 1 || factors[k] > CW_UPSAMPLE_MAX_FACTOR)
            return cw__error(g->ctx, CW_ERR_INVALID_ARG, "cw_graph_upsample_nearest: factors[%d] (%c) = %" PRId64
                             " must be in 1..%d", k, dim_names[k], factors[k], CW_UPSAMPLE_MAX_FACTOR);
    if (nx->desc.rank == 4 && factors[0] != 1) {
        char buf[96];
        return cw__error(g->ctx, CW_ERR_INVALID_ARG, "cw_graph_upsample_nearest: factors[0] (D) = %" PRId64
                         " must be 1 for a 4-D x %s", factors[0], cw__dims_str(&nx->desc, buf, sizeof buf));
    }
    const cw_op_param pm = {{factors[0], factors[1], factors[2]}, {0}};
    return cw__op_node(g, out, CW_OP_UPSAMPLE_NEAREST, &pm, &x, "cw_graph_upsample_nearest", "upsample_nearest");
}

cw_status cw_graph_reduce_channels(cw_graph *g, cw_node *out, cw_node x, cw_reduce_op op) {
    if (!g || !out) return CW_ERR_INVALID_ARG;
    *out = CW_NODE_NONE;
    const cw__node *nx = NULL;
    if ((int)op < 0 || (int)op >= CW_REDUCE_OP_COUNT)
        return cw__error(g->ctx, CW_ERR_INVALID_ARG, "cw_graph_reduce_channels: op = %d is not a cw_reduce_op (0..%d)",
                         (int)op, CW_REDUCE_OP_COUNT - 1);
    CW_TRY(cw__check_act(g, x, -1, "cw_graph_reduce_channels", "x", &nx));
    static const char *const names[CW_REDUCE_OP_COUNT] = {"reduce_sum", "reduce_mean", "reduce_l2",
                                                          "reduce_mean_square"};
    const cw_op_param pm = {{op}, {0}};
    return cw__op_node(g, out, CW_OP_REDUCE_CHANNELS, &pm, &x, "cw_graph_reduce_channels", names[op]);
}

/* Where node n is a nearest upsample (cw_graph_upsample2x, or cw_graph_upsample_nearest
 * without a frame offset) of frames [*start, *start + *len) of a 5-D x (cw_graph_slice along
 * D): x, with the factors in f; else -1. */
static int cw__up_of_frames(const cw_graph *g, int n, int64_t f[3], int64_t *start, int64_t *len) {
    const cw__node *u = &g->nodes[n];
    if (u->kind == CW__N_UP2) {
        f[0] = 1, f[1] = f[2] = 2;
    } else if (u->kind == CW__N_OP && u->op == CW_OP_UPSAMPLE_NEAREST && u->param.i[3] == 0) {
        for (int k = 0; k < 3; k++) f[k] = u->param.i[k];
    } else {
        return -1;
    }
    const cw__node *sl = &g->nodes[u->in[0]];
    if (sl->kind != CW__N_OP || sl->op != CW_OP_SLICE || sl->param.i[0] != 2 || sl->desc.rank != 5) return -1;
    *start = sl->param.i[1], *len = sl->param.i[2];
    return sl->in[0];
}

/* concat(a, b, 2) where a is x's first frame upsampled by (1, fh, fw) and b the rest of x's
 * frames upsampled by (fd, fh, fw) -- HunyuanVideo's and CogVideoX's upsamplers keep the
 * first frame once -- is x upsampled by (fd, fh, fw) less fd - 1 frames in front
 * (CW_OP_UPSAMPLE_NEAREST's offset): one node reading x, which a conv's prep can do, instead
 * of three copies. The same elements; a and b stay in the graph (computed only where
 * something else reads them). Returns 1 with *out set, 0 where the pattern does not hold. */
static int cw__concat_as_upsample(cw_graph *g, cw_node *out, cw_node a, cw_node b, cw_status *st) {
    int64_t fa[3], fb[3], sa, la, sb, lb;
    int xa = cw__up_of_frames(g, a, fa, &sa, &la), xb = cw__up_of_frames(g, b, fb, &sb, &lb);
    if (xa < 0 || xa != xb || sa != 0 || la != 1 || sb != 1 || lb != g->nodes[xa].desc.dims[2] - 1 || fa[0] != 1 ||
        fa[1] != fb[1] || fa[2] != fb[2])
        return 0;
    const cw_op_param pm = {{fb[0], fb[1], fb[2], fb[0] - 1}, {0}};
    const cw_node x = xa;
    *st = cw__op_node(g, out, CW_OP_UPSAMPLE_NEAREST, &pm, &x, "cw_graph_concat", "upsample_nearest_first");
    return 1;
}

cw_status cw_graph_concat(cw_graph *g, cw_node *out, cw_node a, cw_node b, int dim) {
    if (!g || !out) return CW_ERR_INVALID_ARG;
    *out = CW_NODE_NONE;
    const cw__node *na = NULL, *nb = NULL;
    if (dim != 1 && dim != 2)
        return cw__error(g->ctx, CW_ERR_INVALID_ARG,
                         "cw_graph_concat: dim = %d must be 1 (channels) or 2 (T of a 5-D tensor, H of a 4-D one)", dim);
    CW_TRY(cw__check_act(g, a, -1, "cw_graph_concat", "a", &na));
    CW_TRY(cw__check_act(g, b, cw__dtype_ref(g, a), "cw_graph_concat", "b", &nb));
    cw_tensor_desc bd = nb->desc; /* b with a's extent in dim: equal to a where the op fits */
    bd.dims[dim] = na->desc.dims[dim];
    if (!cw__same_dims(&na->desc, &bd)) {
        char b1[96], b2[96];
        return cw__error(g->ctx, CW_ERR_INVALID_ARG, "cw_graph_concat: a %s and b %s must have equal dims but dims[%d]",
                         cw__dims_str(&na->desc, b1, sizeof b1), cw__dims_str(&nb->desc, b2, sizeof b2), dim);
    }
    cw_status st = CW_OK;
    if (dim == 2 && cw__concat_as_upsample(g, out, a, b, &st)) return st;
    const cw_op_param pm = {{dim}, {0}};
    const cw_node in[2] = {a, b};
    return cw__op_node(g, out, CW_OP_CONCAT, &pm, in, "cw_graph_concat", "concat");
}

cw_status cw_graph_slice(cw_graph *g, cw_node *out, cw_node x, int dim, int64_t start, int64_t length) {
    if (!g || !out) return CW_ERR_INVALID_ARG;
    *out = CW_NODE_NONE;
    const cw__node *nx = NULL;
    char buf[96];
    CW_TRY(cw__check_act(g, x, -1, "cw_graph_slice", "x", &nx));
    const cw_tensor_desc *xd = &nx->desc;
    cw__dims_str(xd, buf, sizeof buf);
    if (dim < 1 || dim >= xd->rank)
        return cw__error(g->ctx, CW_ERR_INVALID_ARG, "cw_graph_slice: dim = %d must be in 1..%d for x %s (N, dim 0, "
                         "is never sliced)", dim, xd->rank - 1, buf);
    const int64_t ext = xd->dims[dim];
    if (start < 0 || start >= ext)
        return cw__error(g->ctx, CW_ERR_INVALID_ARG, "cw_graph_slice: start = %" PRId64 " must be in 0..%" PRId64
                         " for x %s along dim %d", start, ext - 1, buf, dim);
    if (length < 1 || length > ext - start)
        return cw__error(g->ctx, CW_ERR_INVALID_ARG, "cw_graph_slice: length = %" PRId64 " must be in 1..%" PRId64
                         " (start = %" PRId64 " + length must not pass x %s's extent %" PRId64 " along dim %d)",
                         length, ext - start, start, buf, ext, dim);
    const cw_op_param pm = {{dim, start, length}, {0}};
    return cw__op_node(g, out, CW_OP_SLICE, &pm, &x, "cw_graph_slice", "slice");
}

cw_status cw_graph_pad(cw_graph *g, cw_node *out, cw_node x, const int64_t pre[3], const int64_t post[3],
                       cw_pad_mode mode, float value) {
    if (!g || !out) return CW_ERR_INVALID_ARG;
    *out = CW_NODE_NONE;
    const cw__node *nx = NULL;
    if (!pre || !post)
        return cw__error(g->ctx, CW_ERR_INVALID_ARG, "cw_graph_pad: %s is NULL", !pre ? "pre" : "post");
    if ((int)mode < 0 || (int)mode >= CW_PAD_MODE_COUNT)
        return cw__error(g->ctx, CW_ERR_INVALID_ARG, "cw_graph_pad: mode = %d is not a cw_pad_mode (0..%d)", (int)mode,
                         CW_PAD_MODE_COUNT - 1);
    CW_TRY(cw__check_act(g, x, -1, "cw_graph_pad", "x", &nx));
    static const char dim_names[3] = {'D', 'H', 'W'};
    for (int k = 0; k < 6; k++) {
        const int64_t v = k < 3 ? pre[k] : post[k - 3];
        if (v < 0 || v > CW_PAD_MAX)
            return cw__error(g->ctx, CW_ERR_INVALID_ARG, "cw_graph_pad: %s[%d] (%c) = %" PRId64 " must be in 0..%d",
                             k < 3 ? "pre" : "post", k % 3, dim_names[k % 3], v, CW_PAD_MAX);
    }
    if (nx->desc.rank == 4 && (pre[0] || post[0])) {
        char buf[96];
        return cw__error(g->ctx, CW_ERR_INVALID_ARG, "cw_graph_pad: pre[0] = %" PRId64 " and post[0] = %" PRId64
                         " (D) must be 0 for a 4-D x %s", pre[0], post[0], cw__dims_str(&nx->desc, buf, sizeof buf));
    }
    const cw_op_param pm = {{mode, cw_pad_pack(pre), cw_pad_pack(post)}, {value}};
    return cw__op_node(g, out, CW_OP_PAD, &pm, &x, "cw_graph_pad", mode == CW_PAD_REPLICATE ? "pad_replicate" : "pad");
}

/* cw_graph_depth_to_space (d2s) and cw_graph_space_to_depth: one check of the factors and
 * of the dims they must divide, naming the call. */
static cw_status cw__shuffle(cw_graph *g, cw_node *out, cw_node x, const int64_t factors[3], int d2s) {
    const char *call = d2s ? "cw_graph_depth_to_space" : "cw_graph_space_to_depth";
    if (!g || !out) return CW_ERR_INVALID_ARG;
    *out = CW_NODE_NONE;
    const cw__node *nx = NULL;
    char buf[96];
    if (!factors) return cw__error(g->ctx, CW_ERR_INVALID_ARG, "%s: factors is NULL", call);
    CW_TRY(cw__check_act(g, x, -1, call, "x", &nx));
    const cw_tensor_desc *xd = &nx->desc;
    cw__dims_str(xd, buf, sizeof buf);
    static const char dim_names[3] = {'D', 'H', 'W'};
    int64_t f = 1;
    for (int k = 0; k < 3; k++) {
        if (factors[k] < 1 || factors[k] > CW_SHUFFLE_MAX_FACTOR)
            return cw__error(g->ctx, CW_ERR_INVALID_ARG, "%s: factors[%d] (%c) = %" PRId64 " must be in 1..%d", call, k,
                             dim_names[k], factors[k], CW_SHUFFLE_MAX_FACTOR);
        f *= factors[k];
    }
    if (xd->rank == 4 && factors[0] != 1)
        return cw__error(g->ctx, CW_ERR_INVALID_ARG, "%s: factors[0] (D) = %" PRId64 " must be 1 for a 4-D x %s", call,
                         factors[0], buf);
    if (d2s && xd->dims[1] % f)
        return cw__error(g->ctx, CW_ERR_INVALID_ARG, "%s: x %s's channels C = %" PRId64 " must be a multiple of "
                         "fd * fh * fw = %" PRId64, call, buf, xd->dims[1], f);
    for (int k = xd->rank == 5 ? 0 : 1; k < 3 && !d2s; k++) {
        const int64_t e = xd->dims[xd->rank - 3 + k];
        if (e % factors[k])
            return cw__error(g->ctx, CW_ERR_INVALID_ARG, "%s: x %s's %c = %" PRId64 " must be a multiple of "
                             "factors[%d] = %" PRId64, call, buf, dim_names[k], e, k, factors[k]);
    }
    const cw_op_param pm = {{factors[0], factors[1], factors[2]}, {0}};
    return cw__op_node(g, out, d2s ? CW_OP_DEPTH_TO_SPACE : CW_OP_SPACE_TO_DEPTH, &pm, &x, call,
                       d2s ? "depth_to_space" : "space_to_depth");
}

cw_status cw_graph_depth_to_space(cw_graph *g, cw_node *out, cw_node x, const int64_t factors[3]) {
    return cw__shuffle(g, out, x, factors, 1);
}

cw_status cw_graph_space_to_depth(cw_graph *g, cw_node *out, cw_node x, const int64_t factors[3]) {
    return cw__shuffle(g, out, x, factors, 0);
}
