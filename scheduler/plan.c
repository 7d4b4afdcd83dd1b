/* The plan object's lifetime and its statistics; compiling it is budget.c's job, running
 * it execute.c's. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "scheduler/sched.h"

void cw__plan_free(cw_plan *p) {
    if (!p) return;
    if (p->events) {
        for (int i = 0; i < p->n_events; i++)
            if (p->events[i]) p->ctx->be->rt->event_destroy(p->ctx->be, p->events[i]);
    }
    if (p->own_temp) cw__alloc_destroy(p->temp);
    else if (p->temp) cw__alloc_release_cached(p->temp); /* its arena in the context's pool */
    if (p->timer) p->ctx->be->rt->timer_destroy(p->ctx->be, p->timer);
    /* every record, whether or not a task still names it (a distributed plan's rank keeps
     * some of the single plan's conv tasks; their records stay in p->cexts) */
    for (int i = 0; i < p->n_cexts; i++) cw__op_conv_release(p->ctx->be, &p->cexts[i].algo);
    for (int i = 0; i < p->n_tasks; i++)
        cw__free(p->tasks[i].deps), cw__free(p->tasks[i].waits), cw__free(p->tasks[i].alloc_waits);
    for (int i = 0; i < p->n_acts; i++) cw__free(p->acts[i].joins), cw__free(p->acts[i].waits);
    if (p->act_arena) { /* through the context's activation pool: cw_context_get_memory_stats sees it */
        cw__alloc_free(p->ctx->act, p->act_arena, NULL);
        cw__alloc_release_cached(p->ctx->act);
    }
    for (int i = 0; i < p->n_convs; i++) cw__free(p->convs[i].tasks);
    cw__free(p->tasks), cw__free(p->acts), cw__free(p->bufs), cw__free(p->convs);
    cw__free(p->cexts), cw__free(p->names), cw__free(p->drops);
    cw__free(p->in), cw__free(p->out), cw__free(p->events), cw__free(p->ptrs), cw__free(p->rdesc);
    cw__free(p->t0), cw__free(p->t1), cw__free(p->rec_nodes), cw__free(p->bands), cw__free(p->comm_args);
    cw__free(p);
}

/* Names are stored once in a pool (a plan's 10850 tasks for the SD decoder at its least
 * memory carried 128 bytes each for names of 20-60). */
cw_status cw__task_set_name(cw_plan *p, cw__task *t, const char *fmt, ...) {
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    int len = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (len < 0) len = 0;
    if (len >= (int)sizeof buf) len = (int)sizeof buf - 1; /* cut, as the 128-byte field did */
    int at = p->n_names ? p->n_names : 1; /* offset 0: "" */
    if (cw__grow((void **)&p->names, &p->cap_names, at + len + 1, 1) != CW_OK)
        return cw__error(p->ctx, CW_ERR_OUT_OF_MEMORY, "compile: out of host memory");
    memcpy(p->names + at, buf, (size_t)len + 1);
    p->n_names = at + len + 1;
    t->name = at;
    return CW_OK;
}

cw_status cw__conv_ext_new(cw_plan *p, int *out) {
    if (cw__grow((void **)&p->cexts, &p->cap_cexts, p->n_cexts + 1, sizeof *p->cexts) != CW_OK)
        return cw__error(p->ctx, CW_ERR_OUT_OF_MEMORY, "compile: out of host memory");
    memset(&p->cexts[p->n_cexts], 0, sizeof *p->cexts);
    *out = p->n_cexts++;
    return CW_OK;
}

void cw_plan_destroy(cw_plan *p) { cw__plan_free(p); }

/* The activation arena goes back through the context's activation pool, which then returns
 * its free segments (other live plans' arenas are in use, so they stay). The temporaries'
 * pool is released only while none of its blocks is in use: a shared pool's cached
 * segments belong to no plan in particular, and the next run re-primes its own arena. */
cw_status cw_plan_release(cw_plan *p) {
    if (!p) return CW_ERR_INVALID_ARG;
    cw_context *ctx = p->ctx;
    cw_status st = cw_context_synchronize(ctx);
    if (st != CW_OK) return cw__error(ctx, st, "cw_plan_release: waiting for the context's streams failed (%s)",
                                      cw_status_name(st));
    if (p->act_arena) {
        if ((st = cw__alloc_free(ctx->act, p->act_arena, NULL)) != CW_OK) return st;
        p->act_arena = NULL;
        if ((st = cw__alloc_release_cached(ctx->act)) != CW_OK) return st;
    }
    cw_memory_stats ms;
    cw__alloc_stats(p->temp, &ms);
    if (ms.reserved_bytes_current > 0 && ms.allocated_bytes_current == 0) {
        if ((st = cw__alloc_release_cached(p->temp)) != CW_OK) return st;
        p->primed = NULL;
    }
    return CW_OK;
}

cw_status cw__plan_acquire(cw_plan *p) {
    if (p->act_bytes <= 0 || p->act_arena) return CW_OK;
    return cw__alloc_malloc(p->ctx->act, p->act_bytes, NULL, &p->act_arena);
}

cw_status cw_plan_get_donor(const cw_plan *p, int output, int *input) {
    if (!p || !input) return CW_ERR_INVALID_ARG;
    if (output < 0 || output >= p->n_outputs)
        return cw__error(p->ctx, CW_ERR_INVALID_ARG, "cw_plan_get_donor: output %d, the plan has %d", output,
                         p->n_outputs);
    *input = p->out[output].donor;
    return CW_OK;
}

cw_status cw_plan_get_stats(const cw_plan *p, cw_plan_stats *out) {
    if (!p || !out) return CW_ERR_INVALID_ARG;
    *out = p->stats;
    return CW_OK;
}
