/* What a plan says about itself: the text/JSON description (patches, halos, algorithm
 * and workspace per patch, predicted peak temp), the Chrome trace of the last run, and
 * the one-call convolution built as a one-node plan. */
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "scheduler/patch.h"
#include "scheduler/sched.h"

static const char *const cw__stage_names[] = {"conv", "prep", "epilogue", "stats", "attention", "other"};

static cJSON *cw__describe_json(const cw_plan *p) {
    cJSON *root = cJSON_CreateObject();
    if (!root) return NULL;
    cJSON_AddNumberToObject(root, "streams", p->n_streams);
    cJSON_AddNumberToObject(root, "budget", (double)p->budget);
    cJSON_AddNumberToObject(root, "temp_predicted", (double)p->temp_predicted);
    cJSON_AddNumberToObject(root, "tasks", p->n_tasks);
    cJSON_AddNumberToObject(root, "events", p->n_events);
    cJSON_AddNumberToObject(root, "weights_bytes", (double)p->weights_bytes);
    cJSON_AddNumberToObject(root, "conv_gflop", p->conv_gflop);
    cJSON_AddNumberToObject(root, "halo_overhead_pct", p->stats.halo_overhead_pct);
    cJSON *convs = cJSON_AddArrayToObject(root, "convs");
    for (int c = 0; convs && c < p->n_convs; c++) {
        const cw__conv_info *ci = &p->convs[c];
        cJSON *o = cJSON_CreateObject();
        if (!o) break;
        cJSON_AddItemToArray(convs, o);
        cJSON_AddNumberToObject(o, "node", ci->node);
        cJSON_AddNumberToObject(o, "patches", ci->patches);
        cJSON_AddNumberToObject(o, "out_rows", (double)ci->h_out);
        cJSON_AddBoolToObject(o, "fused_prep", ci->fused_prep);
        cJSON_AddNumberToObject(o, "halo_pct", ci->halo_pct);
        cJSON *arr = cJSON_AddArrayToObject(o, "patch");
        for (int j = 0; arr && j < ci->patches; j++) {
            const cw__task *t = &p->tasks[ci->tasks[j]];
            const cw__conv_problem *pr = &t->u.conv.prob;
            int hd = pr->spatial, hp = pr->spatial - 2;
            cJSON *q = cJSON_CreateObject();
            if (!q) break;
            cJSON_AddItemToArray(arr, q);
            cJSON_AddStringToObject(q, "name", t->name);
            cJSON_AddNumberToObject(q, "out_row0", (double)t->u.conv.y.start[hd]);
            cJSON_AddNumberToObject(q, "out_rows", (double)t->u.conv.y.dims[hd]);
            cJSON_AddNumberToObject(q, "in_rows", (double)pr->x.dims[hd]);
            cJSON_AddNumberToObject(q, "pad_pre", (double)pr->pad_pre[hp]);
            cJSON_AddNumberToObject(q, "pad_post", (double)pr->pad_post[hp]);
            cJSON_AddStringToObject(q, "algo", t->u.conv.algo.name);
            cJSON_AddNumberToObject(q, "workspace", (double)t->u.conv.algo.workspace);
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

cw_status cw_plan_describe(const cw_plan *p, int json, char **out) {
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
    cw__sbf(&b, "plan: %d stream(s) (%d heavy + %d light), %d tasks, %d events, budget ", p->n_streams,
            p->n_streams > 1 ? p->n_streams - 1 : 1, p->n_streams > 1 ? 1 : 0, p->n_tasks, p->n_events);
    if (p->budget > 0) cw__sbf(&b, "%.2f MiB", (double)p->budget / 1048576.0);
    else cw__sbf(&b, "unlimited");
    cw__sbf(&b, ", predicted peak temp %.2f MiB, conv %.3f GFLOP, halo recompute %.3f%% FLOPs\n",
            (double)p->temp_predicted / 1048576.0, p->conv_gflop, p->stats.halo_overhead_pct);
    for (int c = 0; c < p->n_convs; c++) {
        const cw__conv_info *ci = &p->convs[c];
        const cw__task *t0 = &p->tasks[ci->tasks[0]];
        cw__sbf(&b, "  conv L%d %s: %" PRId64 " output rows in %d patch(es)%s, algo %s\n", ci->node, t0->name,
                ci->h_out, ci->patches, ci->fused_prep ? ", fused prep" : "", t0->u.conv.algo.name);
        for (int j = 0; j < ci->patches; j++) {
            const cw__task *t = &p->tasks[ci->tasks[j]];
            const cw__conv_problem *pr = &t->u.conv.prob;
            int hd = pr->spatial, hp = pr->spatial - 2;
            cw__sbf(&b, "    patch %d/%d: out rows [%" PRId64 ", %" PRId64 ") <- in rows %" PRId64
                        " pad %" PRId64 "/%" PRId64 ", workspace %" PRId64 " B, stream %d\n",
                    j + 1, ci->patches, t->u.conv.y.start[hd], t->u.conv.y.start[hd] + t->u.conv.y.dims[hd],
                    pr->x.dims[hd], pr->pad_pre[hp], pr->pad_post[hp], t->u.conv.algo.workspace, t->stream);
        }
    }
    if (b.oom) {
        cw__free(b.s);
        return cw__error(p->ctx, CW_ERR_OUT_OF_MEMORY, "cw_plan_describe: out of host memory");
    }
    *out = b.s;
    return CW_OK;
}

/* ---- Chrome trace ------------------------------------------------------------------- */
typedef struct cw__tev {
    int64_t t;
    int64_t delta;
} cw__tev;

static int cw__tev_cmp(const void *a, const void *b) {
    const cw__tev *x = a, *y = b;
    return (x->t > y->t) - (x->t < y->t);
}

cw_status cw_plan_write_trace(const cw_plan *p, const char *path) {
    if (!p || !path) return CW_ERR_INVALID_ARG;
    if (!p->ran) return cw__error(p->ctx, CW_ERR_INVALID_ARG, "cw_plan_write_trace: the plan has not run yet");
    int timed = 0;
    for (int k = 0; k < p->n_tasks; k++) timed += p->t1[k] != 0;
    if (!timed && p->n_tasks)
        return cw__error(p->ctx, CW_ERR_INVALID_ARG,
                         "cw_plan_write_trace: no task times recorded; create the context with CW_FLAG_TIMING");
    /* temp bytes live: each temporary from the start of its first user to the end of
     * its last user, in stream time. */
    int nb = p->n_bufs;
    int64_t *b0 = cw__malloc((size_t)nb * sizeof *b0 + 1), *b1 = cw__malloc((size_t)nb * sizeof *b1 + 1);
    cw__tev *ev = cw__malloc((size_t)nb * 2 * sizeof *ev + 1);
    FILE *f = NULL;
    cw_status st = CW_OK;
    if (!b0 || !b1 || !ev) {
        st = cw__error(p->ctx, CW_ERR_OUT_OF_MEMORY, "cw_plan_write_trace: out of host memory");
        goto done;
    }
    for (int b = 0; b < nb; b++) b0[b] = INT64_MAX, b1[b] = 0;
    for (int k = 0; k < p->n_tasks; k++) {
        const cw__task *t = &p->tasks[k];
        int bufs[CW__TASK_MAX_BUFS];
        int nb_t = cw__task_bufs(t, bufs);
        for (int a = 0; a < nb_t; a++) {
            int b = bufs[a];
            if (p->bufs[b].kind != CW__B_TEMP || !p->t0[k]) continue;
            if (p->t0[k] < b0[b]) b0[b] = p->t0[k];
            if (p->t1[k] > b1[b]) b1[b] = p->t1[k];
        }
    }
    int ne = 0;
    for (int b = 0; b < nb; b++) {
        if (p->bufs[b].kind != CW__B_TEMP || b1[b] == 0) continue;
        ev[ne++] = (cw__tev){b0[b], cw__alloc_round(p->bufs[b].bytes)};
        ev[ne++] = (cw__tev){b1[b], -cw__alloc_round(p->bufs[b].bytes)};
    }
    qsort(ev, (size_t)ne, sizeof *ev, cw__tev_cmp);
    f = fopen(path, "w");
    if (!f) {
        st = cw__error(p->ctx, CW_ERR_IO, "cw_plan_write_trace: cannot open '%s' for writing", path);
        goto done;
    }
    int64_t base = p->run_t0;
    fprintf(f, "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n");
    fprintf(f, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"args\":{\"name\":\"convweave %s\"}}",
            p->ctx->be->i->name);
    for (int s = 0; s < p->n_streams; s++)
        fprintf(f, ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":%d,\"args\":{\"name\":\"stream %d (%s)\"}}",
                s, s, p->n_streams > 1 && s == p->n_streams - 1 ? "light" : "heavy");
    for (int k = 0; k < p->n_tasks; k++) {
        const cw__task *t = &p->tasks[k];
        if (!p->t0[k]) continue;
        fprintf(f, ",\n{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":1,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,"
                   "\"args\":{\"task\":%d,\"mflop\":%.3f}}",
                t->name, cw__stage_names[t->stage], t->stream, (double)(p->t0[k] - base) * 1e-3,
                (double)(p->t1[k] - p->t0[k]) * 1e-3, k, t->flops * 1e-6);
    }
    int64_t live = 0;
    fprintf(f, ",\n{\"name\":\"temp bytes\",\"ph\":\"C\",\"pid\":1,\"ts\":0,\"args\":{\"bytes\":0}}");
    for (int e = 0; e < ne; e++) {
        live += ev[e].delta;
        if (e + 1 < ne && ev[e + 1].t == ev[e].t) continue;
        fprintf(f, ",\n{\"name\":\"temp bytes\",\"ph\":\"C\",\"pid\":1,\"ts\":%.3f,\"args\":{\"bytes\":%" PRId64 "}}",
                (double)(ev[e].t - base) * 1e-3, live);
    }
    fprintf(f, "\n]}\n");
    if (fclose(f) != 0) st = cw__error(p->ctx, CW_ERR_IO, "cw_plan_write_trace: writing '%s' failed", path);
done:
    cw__free(b0), cw__free(b1), cw__free(ev);
    return st;
}

/* ---- one-call convolution ------------------------------------------------------------ */
cw_status cw_conv_forward(cw_context *ctx, const cw_tensor *x, const cw_tensor *w, const cw_tensor *b, cw_tensor *y,
                          const cw_conv_params *p, const cw_compile_options *opt) {
    if (!ctx) return CW_ERR_INVALID_ARG;
    if (!x || !w || !y || !p)
        return cw__error(ctx, CW_ERR_INVALID_ARG, "cw_conv_forward: %s is NULL", !x ? "x" : !w ? "w" : !y ? "y" : "p");
    cw_status st = cw__conv_validate(ctx, &x->desc, &w->desc, b ? &b->desc : NULL, &y->desc, p, NULL);
    if (st != CW_OK) return st;
    if (cw__views_overlap(&x->desc, x->data, &y->desc, y->data))
        return cw__error(ctx, CW_ERR_INVALID_ARG, "cw_conv_forward: y overlaps x (in-place convolution is not supported)");
    if (x->desc.dtype != CW_F32 || w->desc.dtype != CW_F32 || y->desc.dtype != CW_F32)
        return cw__error(ctx, CW_ERR_UNSUPPORTED, "cw_conv_forward: only f32 is supported on this path");
    cw_graph *g = NULL;
    cw_plan *plan = NULL;
    cw_node nx, nw, nb = CW_NODE_NONE, ny;
    if ((st = cw_graph_create(&g, ctx)) != CW_OK) return st;
    if ((st = cw_graph_input(g, &nx, "x", &x->desc)) != CW_OK) goto done;
    if ((st = cw_graph_constant(g, &nw, "w", (cw_tensor *)w)) != CW_OK) goto done;
    if (b && (st = cw_graph_constant(g, &nb, "b", (cw_tensor *)b)) != CW_OK) goto done;
    if ((st = cw_graph_conv(g, &ny, nx, nw, nb, p)) != CW_OK) goto done;
    if ((st = cw_graph_output(g, ny, "y")) != CW_OK) goto done;
    if ((st = cw_graph_compile(g, &plan, opt)) != CW_OK) goto done;
    cw_tensor *in[1] = {(cw_tensor *)x};
    st = cw_plan_run(plan, in, 1, &y, 1);
done:
    cw_plan_destroy(plan);
    cw_graph_destroy(g);
    return st;
}
