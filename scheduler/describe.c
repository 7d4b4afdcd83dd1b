/* What a plan says about itself (cw_plan_describe): its element type, per conv its patches
 * (axis: H rows or D frames; output rows, input rows, halo paddings), algorithm, workspace, prep and band buffer
 * bytes and stream, and the plan's predicted peak temp and activation arena, as text or
 * JSON. */
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "scheduler/sched.h"

/* The axis a conv's patches cut: "H" (rows), or "D" (frames of a 5-D conv). */
static const char *cw__axis_name(const cw_plan *p, const cw__conv_info *ci) {
    const cw__task *t = &p->tasks[ci->tasks[0]];
    return cw__conv_of(p, t)->prob.spatial == 3 && ci->axis == 2 ? "D" : "H";
}

/* Bytes of buffer b when it is a temporary (a conv's prep or band buffer), else 0. */
static int64_t cw__temp_bytes(const cw_plan *p, int b) {
    return b >= 0 && p->bufs[b].kind == CW__B_TEMP ? p->bufs[b].bytes : 0;
}

/* The input given back after its last read by discard action a (cw_graph_donate(.., -1)),
 * or -1. */
static int cw__discarded(const cw_plan *p, int a) {
    return p->acts[a].kind == CW__A_DISCARD ? p->bufs[p->acts[a].id].ext : -1;
}

static cJSON *cw__describe_json(const cw_plan *p) {
    cJSON *root = cJSON_CreateObject();
    if (!root) return NULL;
    cJSON *dn = cJSON_AddArrayToObject(root, "donations"); /* [output, input]: output in input's tensor */
    for (int o = 0; dn && o < p->n_outputs; o++) {
        const int v[2] = {o, p->out[o].donor};
        if (v[1] >= 0) cJSON_AddItemToArray(dn, cJSON_CreateIntArray(v, 2));
    }
    cJSON *dc = cJSON_AddArrayToObject(root, "discarded"); /* inputs given back after their last read */
    for (int a = 0; dc && a < p->n_acts; a++)
        if (cw__discarded(p, a) >= 0) cJSON_AddItemToArray(dc, cJSON_CreateNumber(cw__discarded(p, a)));
    cJSON_AddStringToObject(root, "dtype", cw__dtype_name(p->dtype));
    cJSON_AddNumberToObject(root, "streams", p->n_streams);
    cJSON_AddNumberToObject(root, "budget", (double)p->budget);
    cJSON_AddNumberToObject(root, "temp_predicted", (double)p->temp_predicted);
    cJSON_AddNumberToObject(root, "tasks", p->n_tasks);
    cJSON_AddNumberToObject(root, "events", p->n_events);
    cJSON_AddNumberToObject(root, "weights_bytes", (double)p->weights_bytes);
    cJSON_AddNumberToObject(root, "activations_peak", (double)p->act_bytes);
    cJSON_AddNumberToObject(root, "activations_live_peak", (double)p->act_live_peak);
    cJSON_AddNumberToObject(root, "conv_gflop", p->conv_gflop);
    cJSON_AddNumberToObject(root, "halo_overhead_pct", p->stats.halo_overhead_pct);
    cJSON_AddNumberToObject(root, "recompute_gflop", p->recompute_flop * 1e-9);
    cJSON_AddNumberToObject(root, "conv_cost_ms", p->stats.conv_cost_ms);
    cJSON *rn = cJSON_AddArrayToObject(root, "recomputed"); /* conv nodes whose results are recomputed */
    for (int i = 0; rn && i < p->n_recomputed; i++) cJSON_AddItemToArray(rn, cJSON_CreateNumber(p->rec_nodes[i]));
    cJSON *convs = cJSON_AddArrayToObject(root, "convs");
    for (int c = 0; convs && c < p->n_convs; c++) {
        const cw__conv_info *ci = &p->convs[c];
        cJSON *o = cJSON_CreateObject();
        if (!o) break;
        cJSON_AddItemToArray(convs, o);
        cJSON_AddNumberToObject(o, "node", ci->node);
        cJSON_AddNumberToObject(o, "patches", ci->patches);
        cJSON_AddStringToObject(o, "axis", cw__axis_name(p, ci));
        cJSON_AddNumberToObject(o, "out_rows", (double)ci->out_rows);
        cJSON_AddBoolToObject(o, "fused_prep", ci->fused_prep);
        cJSON_AddNumberToObject(o, "halo_pct", ci->halo_pct);
        cJSON *arr = cJSON_AddArrayToObject(o, "patch");
        for (int j = 0; arr && j < ci->patches; j++) {
            const cw__task *t = &p->tasks[ci->tasks[j]];
            const cw__conv_ext *ce = cw__conv_of(p, t);
            const cw__conv_problem *pr = &ce->prob;
            int hd = ci->axis, hp = ci->axis - 2;
            cJSON *q = cJSON_CreateObject();
            if (!q) break;
            cJSON_AddItemToArray(arr, q);
            cJSON_AddStringToObject(q, "name", cw__task_name(p, t));
            cJSON_AddNumberToObject(q, "out_row0", (double)t->u.conv.y.start[hd]);
            cJSON_AddNumberToObject(q, "out_rows", (double)t->u.conv.y.dims[hd]);
            cJSON_AddNumberToObject(q, "in_rows", (double)pr->x.dims[hd]);
            cJSON_AddNumberToObject(q, "pad_pre", (double)pr->pad_pre[hp]);
            cJSON_AddNumberToObject(q, "pad_post", (double)pr->pad_post[hp]);
            cJSON_AddStringToObject(q, "algo", ce->algo.name);
            cJSON_AddNumberToObject(q, "workspace", (double)ce->algo.workspace);
            cJSON_AddNumberToObject(q, "prep_bytes", (double)cw__temp_bytes(p, t->u.conv.x.buf));
            cJSON_AddNumberToObject(q, "band_bytes", (double)cw__temp_bytes(p, t->u.conv.y.buf));
            cJSON_AddNumberToObject(q, "stream", t->stream);
        }
    }
    return root;
}

typedef struct cw__sb {
    char *s;
    size_t n, cap;
    int oom;
} cw__sb;

static void cw__sbf(cw__sb *b, const char *fmt, ...) CW__PRINTF(2, 3);
static void cw__sbf(cw__sb *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->s ? b->s + b->n : NULL, b->s ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) return;
        if (b->s && b->n + (size_t)k < b->cap) {
            b->n += (size_t)k;
            return;
        }
        size_t nc = b->cap ? b->cap * 2 : 4096;
        while (nc < b->n + (size_t)k + 1) nc *= 2;
        char *ns = cw__realloc(b->s, nc);
        if (!ns) {
            b->oom = 1;
            return;
        }
        b->s = ns;
        b->cap = nc;
    }
}

cw_status cw_plan_describe(const cw_plan *p, char **out, int json) {
    if (!p || !out) return CW_ERR_INVALID_ARG;
    *out = NULL;
    if (json) {
        cJSON *root = cw__describe_json(p);
        char *s = root ? cJSON_PrintUnformatted(root) : NULL;
        cJSON_Delete(root);
        if (!s) return cw__error(p->ctx, CW_ERR_OUT_OF_MEMORY, "cw_plan_describe: out of host memory");
        *out = cw__strdup(s);
        cJSON_free(s);
        return *out ? CW_OK : cw__error(p->ctx, CW_ERR_OUT_OF_MEMORY, "cw_plan_describe: out of host memory");
    }
    cw__sb b = {0};
    cw__sbf(&b, "plan: %d stream(s) (%d heavy + %d light), %d tasks, %d events, dtype %s, budget ", p->n_streams,
            p->n_streams > 1 ? p->n_streams - 1 : 1, p->n_streams > 1 ? 1 : 0, p->n_tasks, p->n_events,
            cw__dtype_name(p->dtype));
    if (p->budget > 0) cw__sbf(&b, "%.2f MiB", (double)p->budget / 1048576.0);
    else cw__sbf(&b, "unlimited");
    cw__sbf(&b, ", predicted peak temp %.2f MiB, activations %.2f MiB, conv %.3f GFLOP, halo recompute %.3f%% FLOPs\n",
            (double)p->temp_predicted / 1048576.0, (double)p->act_bytes / 1048576.0, p->conv_gflop,
            p->stats.halo_overhead_pct);
    if (p->n_recomputed > 0) {
        cw__sbf(&b, "  recomputed (%.3f GFLOP paid again):", p->recompute_flop * 1e-9);
        for (int i = 0; i < p->n_recomputed; i++) cw__sbf(&b, " L%d", p->rec_nodes[i]);
        cw__sbf(&b, "\n");
    }
    if (p->opt.comm && p->opt.comm->n_ranks > 1) {
        int64_t n[2] = {0, 0}, bytes[2] = {0, 0};
        for (int k = 0; k < p->n_tasks; k++) {
            const cw__task *t = &p->tasks[k];
            if (t->kind != CW__T_SEND && t->kind != CW__T_RECV) continue;
            int r = t->kind == CW__T_RECV;
            cw_tensor_desc d;
            d = p->bufs[t->u.comm.v.buf].d;
            for (int i = 0; i < t->u.comm.v.rank; i++) d.dims[i] = t->u.comm.v.dims[i];
            n[r]++, bytes[r] += cw__desc_bytes(&d);
        }
        cw__sbf(&b, "rank %d of %d: its share of the single-process plan; sends %" PRId64 " messages (%.2f MiB), "
                    "receives %" PRId64 " (%.2f MiB) on stream %d\n",
                p->opt.comm->rank, p->opt.comm->n_ranks, n[0], (double)bytes[0] / 1048576.0, n[1],
                (double)bytes[1] / 1048576.0, p->comm_stream);
    }
    for (int o = 0; o < p->n_outputs; o++)
        if (p->out[o].donor >= 0)
            cw__sbf(&b, "  output %d ('%s') in the tensor of input %d ('%s'), donated\n", o, p->out[o].name,
                    p->out[o].donor, p->in[p->out[o].donor].name);
    for (int a = 0; a < p->n_acts; a++)
        if (cw__discarded(p, a) >= 0)
            cw__sbf(&b, "  input %d ('%s') given back after its last read, donated to no output\n", cw__discarded(p, a),
                    p->in[cw__discarded(p, a)].name);
    for (int c = 0; c < p->n_convs; c++) {
        const cw__conv_info *ci = &p->convs[c];
        const cw__task *t0 = &p->tasks[ci->tasks[0]];
        const char *ax = cw__axis_name(p, ci), *rows = ax[0] == 'D' ? "frames" : "rows";
        cw__sbf(&b, "  conv L%d %s: %" PRId64 " output %s (%s) in %d patch(es)%s, algo %s\n", ci->node, cw__task_name(p, t0),
                ci->out_rows, rows, ax, ci->patches, ci->fused_prep ? ", fused prep" : "", cw__conv_of(p, t0)->algo.name);
        for (int j = 0; j < ci->patches; j++) {
            const cw__task *t = &p->tasks[ci->tasks[j]];
            const cw__conv_ext *ce = cw__conv_of(p, t);
            const cw__conv_problem *pr = &ce->prob;
            int hd = ci->axis, hp = ci->axis - 2;
            int64_t pb = cw__temp_bytes(p, t->u.conv.x.buf), yb = cw__temp_bytes(p, t->u.conv.y.buf);
            cw__sbf(&b, "    patch %d/%d: out %s [%" PRId64 ", %" PRId64 ") <- in %s %" PRId64
                        " pad %" PRId64 "/%" PRId64 ", workspace %" PRId64 " B",
                    j + 1, ci->patches, rows, t->u.conv.y.start[hd], t->u.conv.y.start[hd] + t->u.conv.y.dims[hd],
                    rows, pr->x.dims[hd], pr->pad_pre[hp], pr->pad_post[hp], ce->algo.workspace);
            if (pb) cw__sbf(&b, ", prep buffer %" PRId64 " B", pb);
            if (yb) cw__sbf(&b, ", band buffer %" PRId64 " B", yb);
            cw__sbf(&b, ", stream %d\n", t->stream);
        }
    }
    if (b.oom) {
        cw__free(b.s);
        return cw__error(p->ctx, CW_ERR_OUT_OF_MEMORY, "cw_plan_describe: out of host memory");
    }
    *out = b.s;
    return CW_OK;
}
