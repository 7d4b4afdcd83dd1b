/* The Chrome / Perfetto trace of a plan's last run (cw_plan_write_trace): one track per
 * stream, one slice per task from the recorded task times, and a counter of the temporary
 * bytes in use. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "prof/nvtx.h"
#include "scheduler/sched.h"

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
            p->ctx->be->rt->name);
    for (int s = 0; s < p->n_streams; s++)
        fprintf(f, ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":%d,\"args\":{\"name\":\"stream %d (%s)\"}}",
                s, s, p->n_streams > 1 && s == p->n_streams - 1 ? "light" : "heavy");
    for (int k = 0; k < p->n_tasks; k++) {
        const cw__task *t = &p->tasks[k];
        if (!p->t0[k]) continue;
        fprintf(f, ",\n{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":1,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,"
                   "\"args\":{\"task\":%d,\"mflop\":%.3f}}",
                cw__task_name(p, t), cw__stage_name(t->stage), t->stream, (double)(p->t0[k] - base) * 1e-3,
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
