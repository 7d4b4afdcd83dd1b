/* A happens-before checker for plans (tests only): replays a plan's action list with
 * vector clocks — stream FIFO order, event waits of tasks, free joins, the allocator
 * ordering a temporary's stream after the frees of the memory it reuses, the waits the plan
 * records for an activation placed over freed ones (arena.c), and the allocation events
 * other streams wait on — and reports every pair of tasks that touch
 * overlapping memory (the addresses of the plan's last run) without being ordered. */
#ifndef CW_HB_CHECK_H
#define CW_HB_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "scheduler/sched.h"

#define HB_MS CW__MAX_STREAMS

static void hb_join(int64_t *dst, const int64_t *src, int S) {
    for (int q = 0; q < S; q++)
        if (src[q] > dst[q]) dst[q] = src[q];
}

/* Returns the number of unordered pairs (prints the first few). */
static int hb_check(const cw_plan *p) {
    const int S = p->n_streams, nb = p->n_bufs, nt = p->n_tasks;
    int64_t vc[HB_MS][HB_MS];
    memset(vc, 0, sizeof vc);
    int64_t(*tvc)[HB_MS] = calloc((size_t)nt + 1, sizeof *tvc); /* clock after each task */
    int64_t(*svc)[HB_MS] = calloc((size_t)nt + 1, sizeof *svc); /* clock at each task's start */
    int64_t(*fvc)[HB_MS] = calloc((size_t)nb + 1, sizeof *fvc); /* clock at each buffer's free */
    int64_t(*evc)[HB_MS] = calloc((size_t)p->n_events + 1, sizeof *evc);
    char *freed = calloc((size_t)nb + 1, 1);
    int bad = 0;
    for (int a = 0; a < p->n_acts; a++) {
        const cw__action *ac = &p->acts[a];
        int s = ac->kind == CW__A_TASK ? p->tasks[ac->id].stream : ac->stream;
        if (ac->kind == CW__A_TASK) {
            const cw__task *t = &p->tasks[ac->id];
            for (int w = 0; w < t->n_waits; w++) hb_join(vc[s], tvc[t->waits[w]], S);
            for (int w = 0; w < t->n_alloc_waits; w++) hb_join(vc[s], evc[t->alloc_waits[w]], S);
            memcpy(svc[ac->id], vc[s], sizeof vc[s]);
            vc[s][s]++;
            memcpy(tvc[ac->id], vc[s], sizeof vc[s]);
        } else if (ac->kind == CW__A_FREE) {
            for (int j = 0; j < ac->n_joins; j++) hb_join(vc[s], tvc[ac->joins[j]], S);
            memcpy(fvc[ac->id], vc[s], sizeof vc[s]);
            freed[ac->id] = 1;
            if (ac->event >= 0) memcpy(evc[ac->event], vc[s], sizeof vc[s]);
        } else if (p->bufs[ac->id].kind == CW__B_ACT) {
            /* an activation's arena place: only the waits the plan itself recorded */
            for (int w = 0; w < ac->n_waits; w++) hb_join(vc[s], evc[ac->waits[w]], S);
            if (ac->event >= 0) memcpy(evc[ac->event], vc[s], sizeof vc[s]);
        } else {
            const int b = ac->id;
            const char *lo = p->ptrs[b], *hi = lo + p->bufs[b].bytes;
            for (int o = 0; o < nb; o++) { /* the allocator's wait on the previous owner's free */
                if (o == b || !freed[o] || p->bufs[o].kind != p->bufs[b].kind) continue;
                const char *l2 = p->ptrs[o], *h2 = l2 + p->bufs[o].bytes;
                if (l2 < hi && lo < h2) hb_join(vc[s], fvc[o], S);
            }
            if (ac->event >= 0) memcpy(evc[ac->event], vc[s], sizeof vc[s]);
        }
    }
    for (int T = 0; T < nt; T++) {
        int ub[CW__TASK_MAX_BUFS], nu = cw__task_bufs(&p->tasks[T], ub);
        for (int i = 0; i < nu; i++) {
            int b = ub[i];
            if ((p->bufs[b].kind != CW__B_ACT && p->bufs[b].kind != CW__B_TEMP)) continue;
            const char *lo = p->ptrs[b], *hi = lo + p->bufs[b].bytes;
            for (int U = 0; U < T; U++) {
                int ob[CW__TASK_MAX_BUFS], no = cw__task_bufs(&p->tasks[U], ob);
                for (int j = 0; j < no; j++) {
                    int o = ob[j];
                    if (o >= b || p->bufs[o].kind != p->bufs[b].kind) continue;
                    const char *l2 = p->ptrs[o], *h2 = l2 + p->bufs[o].bytes;
                    if (!(l2 < hi && lo < h2)) continue;
                    int us = p->tasks[U].stream;
                    if (tvc[U][us] > svc[T][us]) {
                        if (bad < 5)
                            fprintf(stderr, "  hazard: task %d '%s' (stream %d, buffer %d) may overlap task %d '%s' "
                                            "(stream %d, buffer %d) in memory\n",
                                    T, p->tasks[T].name, p->tasks[T].stream, b, U, p->tasks[U].name, us, o);
                        bad++;
                    }
                }
            }
        }
    }
    free(tvc), free(svc), free(fvc), free(evc), free(freed);
    return bad;
}

#endif
