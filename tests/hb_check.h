/* A happens-before checker for plans (tests only): replays a plan's action list with
 * vector clocks — stream FIFO order, event waits of tasks, free joins, the allocator
 * ordering a temporary's stream after the frees of the memory it reuses, the waits the plan
 * records for an activation placed over freed ones (arena.c), and the allocation events
 * other streams wait on — and reports every pair of tasks that touch
 * overlapping memory (the addresses of the plan's last run) without being ordered:
 * - two buffers whose memory overlaps (reuse of freed memory), whatever the tasks do;
 * - one buffer, where one task writes elements the other reads or writes (the views' boxes
 *   overlap): a data dependency, or a write in place after a read (a residual add written
 *   over its operand while other tasks still read its rows). Attention chunks write
 *   disjoint token ranges of one output, compared as such. */
#ifndef CW_HB_CHECK_H
#define CW_HB_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "scheduler/sched.h"

#define HB_MS CW__MAX_STREAMS

/* Set to 1 where a test provokes hazards on purpose: then they are counted, not printed. */
#if defined(__GNUC__)
__attribute__((unused))
#endif
static int hb_quiet;

static void hb_join(int64_t *dst, const int64_t *src, int S) {
    for (int q = 0; q < S; q++)
        if (src[q] > dst[q]) dst[q] = src[q];
}

/* One buffer access of a task: a view (whole: every element), read or written. */
typedef struct hb_acc {
    int buf, write, whole;
    cw__vref v;
    int attn;          /* an attention chunk's output: tokens [t0, t1) of sample n */
    int64_t n, t0, t1;
} hb_acc;

static int hb_view(hb_acc *a, const cw__vref *v, int write) {
    if (v->buf < 0) return 0;
    memset(a, 0, sizeof *a);
    a->buf = v->buf, a->write = write, a->v = *v;
    return 1;
}

static int hb_whole(hb_acc *a, int buf, int write) {
    if (buf < 0) return 0;
    memset(a, 0, sizeof *a);
    a->buf = buf, a->write = write, a->whole = 1;
    return 1;
}

/* Task t's accesses into out (at most 8); returns how many. */
static int hb_accesses(const cw__task *t, hb_acc *out) {
    int n = 0;
    switch (t->kind) {
    case CW__T_CONV:
        n += hb_view(&out[n], &t->u.conv.x, 0);
        n += hb_view(&out[n], &t->u.conv.y, 1);
        n += hb_whole(&out[n], t->u.conv.ws_buf, 1);
        break;
    case CW__T_PREP:
        n += hb_view(&out[n], &t->u.prep.src, 0);
        n += hb_view(&out[n], &t->u.prep.dst, 1);
        n += hb_whole(&out[n], t->u.prep.ss_buf, 0);
        break;
    case CW__T_ADD:
        n += hb_view(&out[n], &t->u.add.dst, 1);
        n += hb_view(&out[n], &t->u.add.a, 0);
        n += hb_view(&out[n], &t->u.add.b, 0);
        break;
    case CW__T_STATS:
        n += hb_view(&out[n], &t->u.stats.x, 0);
        if (hb_whole(&out[n], t->u.stats.part_buf, 1)) { /* its band's slot: N x groups x 3 doubles */
            hb_acc *a = &out[n++];
            int64_t per = 2 * t->u.stats.x.dims[0] * t->u.stats.groups * 3; /* in f32, as messages count it */
            a->whole = 0, a->v.buf = t->u.stats.part_buf, a->v.rank = 1;
            a->v.start[0] = t->u.stats.part_index * per, a->v.dims[0] = per;
        }
        break;
    case CW__T_FINALIZE:
        n += hb_whole(&out[n], t->u.fin.part_buf, 0);
        n += hb_whole(&out[n], t->u.fin.ss_buf, 1);
        break;
    case CW__T_OP:
        n += hb_view(&out[n], &t->u.op.out, 1);
        for (int k = 0; k < cw_op_get_info(t->u.op.code).n_in; k++) n += hb_view(&out[n], &t->u.op.in[k], 0);
        break;
    case CW__T_ATTN:
        n += hb_view(&out[n], &t->u.attn.q, 0);
        n += hb_view(&out[n], &t->u.attn.k, 0);
        n += hb_view(&out[n], &t->u.attn.v, 0);
        if (hb_view(&out[n], &t->u.attn.o, 1)) {
            hb_acc *a = &out[n++];
            a->attn = 1, a->n = t->u.attn.n, a->t0 = t->u.attn.t0, a->t1 = t->u.attn.t1;
            /* its rows, as the lowering records the chunk's writer (rank 4: tokens are h*W+w);
             * a chunk's own f32 output buffer (half graphs) is written whole */
            int64_t tokens = 1;
            for (int d = 2; d < a->v.rank; d++) tokens *= a->v.dims[d];
            if (tokens != t->u.attn.T) a->attn = 0;
            else if (a->v.rank == 4) {
                int64_t W = a->v.dims[3];
                a->v.start[2] += a->t0 / W;
                a->v.dims[2] = (a->t1 - 1) / W + 1 - a->t0 / W;
            }
        }
        n += hb_whole(&out[n], t->u.attn.s_buf, 1);
        break;
    case CW__T_SEND: n += hb_view(&out[n], &t->u.comm.v, 0); break;
    case CW__T_RECV: n += hb_view(&out[n], &t->u.comm.v, 1); break;
    }
    return n;
}

/* The two accesses of one buffer touch a common element. */
static int hb_overlap(const hb_acc *a, const hb_acc *b) {
    if (a->attn && b->attn) return a->n == b->n && a->t0 < b->t1 && b->t0 < a->t1;
    if (a->whole || b->whole || a->v.rank != b->v.rank) return 1;
    for (int d = 0; d < a->v.rank; d++)
        if (!(a->v.start[d] < b->v.start[d] + b->v.dims[d] && b->v.start[d] < a->v.start[d] + a->v.dims[d])) return 0;
    return 1;
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
    int64_t(*dvc)[HB_MS] = calloc((size_t)p->n_acts + 1, sizeof *dvc); /* clock at each DROP */
    int *tpos = calloc((size_t)nt + 1, sizeof *tpos);                  /* each task's action */
    int bad = 0;
    for (int a = 0; a < p->n_acts; a++) {
        const cw__action *ac = &p->acts[a];
        int s = ac->kind == CW__A_TASK ? p->tasks[ac->id].stream : ac->stream;
        if (ac->kind == CW__A_TASK) {
            const cw__task *t = &p->tasks[ac->id];
            tpos[ac->id] = a;
            for (int w = 0; w < t->n_waits; w++) hb_join(vc[s], tvc[t->waits[w]], S);
            for (int w = 0; w < t->n_alloc_waits; w++) hb_join(vc[s], evc[t->alloc_waits[w]], S);
            memcpy(svc[ac->id], vc[s], sizeof vc[s]);
            vc[s][s]++;
            memcpy(tvc[ac->id], vc[s], sizeof vc[s]);
        } else if (ac->kind == CW__A_DROP) { /* work on its stream, like a task */
            for (int j = 0; j < ac->n_joins; j++) hb_join(vc[s], tvc[ac->joins[j]], S);
            vc[s][s]++;
            memcpy(dvc[a], vc[s], sizeof vc[s]);
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
                        if (bad < 5 && !hb_quiet)
                            fprintf(stderr, "  hazard: task %d '%s' (stream %d, buffer %d) may overlap task %d '%s' "
                                            "(stream %d, buffer %d) in memory\n",
                                    T, cw__task_name(p, &p->tasks[T]), p->tasks[T].stream, b, U, cw__task_name(p, &p->tasks[U]), us, o);
                        bad++;
                    }
                }
            }
        }
    }
    /* one buffer: a write and any other access of a common element, in host order U < T */
    int *cnt = calloc((size_t)nb + 1, sizeof *cnt), *at = calloc((size_t)nb + 1, sizeof *at);
    int(*use)[2] = malloc(((size_t)nt * 8 + 1) * sizeof *use); /* (task, access) per buffer */
    hb_acc(*acc)[8] = malloc(((size_t)nt + 1) * sizeof *acc);
    int *nacc = calloc((size_t)nt + 1, sizeof *nacc);
    for (int T = 0; T < nt; T++) {
        nacc[T] = hb_accesses(&p->tasks[T], acc[T]);
        for (int i = 0; i < nacc[T]; i++) cnt[acc[T][i].buf]++;
    }
    for (int b = 0, o = 0; b < nb; b++) at[b] = o, o += cnt[b], cnt[b] = 0;
    for (int T = 0; T < nt; T++) /* per buffer, in task (host) order */
        for (int i = 0; i < nacc[T]; i++) {
            int b = acc[T][i].buf;
            use[at[b] + cnt[b]][0] = T, use[at[b] + cnt[b]][1] = i;
            cnt[b]++;
        }
    for (int b = 0; b < nb; b++) {
        cw__bkind k = p->bufs[b].kind;
        if (k != CW__B_ACT && k != CW__B_TEMP && k != CW__B_OUTPUT) continue;
        for (int x = 0; x < cnt[b]; x++)
            for (int y = x + 1; y < cnt[b]; y++) {
                int U = use[at[b] + x][0], T = use[at[b] + y][0];
                const hb_acc *au = &acc[U][use[at[b] + x][1]], *at2 = &acc[T][use[at[b] + y][1]];
                if (U == T || !(au->write || at2->write) || !hb_overlap(au, at2)) continue;
                int us = p->tasks[U].stream;
                if (tvc[U][us] <= svc[T][us]) continue;
                if (bad < 5 && !hb_quiet)
                    fprintf(stderr, "  hazard: task %d '%s' (stream %d) %s buffer %d where task %d '%s' (stream %d) %s "
                                    "it, unordered\n",
                            T, cw__task_name(p, &p->tasks[T]), p->tasks[T].stream, at2->write ? "writes" : "reads", b, U,
                            cw__task_name(p, &p->tasks[U]), us, au->write ? "wrote" : "read");
                bad++;
            }
    }
    /* a DROP of rows [r0, r1): every access to them comes before it in host order and
     * happens before it; and a later task on another activation sharing the buffer's bytes
     * (after its free) starts after it, so that its pages are not given back under it */
    for (int a = 0; a < p->n_acts; a++) {
        const cw__action *ac = &p->acts[a];
        if (ac->kind != CW__A_DROP) continue;
        const cw__drop *dr = &p->drops[ac->drop];
        hb_acc rows;
        memset(&rows, 0, sizeof rows);
        rows.buf = ac->id, rows.v.buf = ac->id, rows.v.rank = p->bufs[ac->id].d.rank;
        for (int d = 0; d < rows.v.rank; d++) rows.v.dims[d] = p->bufs[ac->id].d.dims[d];
        rows.v.start[dr->ax] = dr->r0, rows.v.dims[dr->ax] = dr->r1 - dr->r0;
        for (int x = 0; x < cnt[ac->id]; x++) {
            int T = use[at[ac->id] + x][0];
            const hb_acc *au = &acc[T][use[at[ac->id] + x][1]];
            if (!hb_overlap(au, &rows)) continue;
            int ts = p->tasks[T].stream;
            if (tpos[T] < a && tvc[T][ts] <= dvc[a][ts]) continue;
            if (bad < 5 && !hb_quiet)
                fprintf(stderr, "  hazard: task %d '%s' (stream %d) touches rows %lld..%lld of buffer %d %s their drop\n",
                        T, cw__task_name(p, &p->tasks[T]), ts, (long long)dr->r0, (long long)dr->r1, ac->id,
                        tpos[T] > a ? "after" : "unordered with");
            bad++;
        }
        const int ds = ac->stream;
        if (!freed[ac->id] || fvc[ac->id][ds] < dvc[a][ds]) { /* its free comes after it */
            if (bad < 5 && !hb_quiet)
                fprintf(stderr, "  hazard: buffer %d's free (or none) is unordered with the drop of its rows %lld..%lld\n",
                        ac->id, (long long)dr->r0, (long long)dr->r1);
            bad++;
        }
        const char *lo = p->ptrs[ac->id], *hi = lo + p->bufs[ac->id].bytes;
        for (int T = 0; T < nt; T++) {
            if (tpos[T] < a) continue;
            int ob[CW__TASK_MAX_BUFS], no = cw__task_bufs(&p->tasks[T], ob);
            for (int j = 0; j < no; j++) {
                const int o = ob[j];
                if (o == ac->id || p->bufs[o].kind != CW__B_ACT) continue;
                const char *l2 = p->ptrs[o], *h2 = l2 + p->bufs[o].bytes;
                if (!(l2 < hi && lo < h2) || dvc[a][ds] <= svc[T][ds]) continue;
                if (bad < 5 && !hb_quiet)
                    fprintf(stderr, "  hazard: task %d '%s' (stream %d, buffer %d) may run before the drop of "
                                    "buffer %d's rows in the same memory (stream %d)\n",
                            T, cw__task_name(p, &p->tasks[T]), p->tasks[T].stream, o, ac->id, ds);
                bad++;
            }
        }
    }
    free(cnt), free(at), free(use), free(acc), free(nacc);
    free(tvc), free(svc), free(fvc), free(evc), free(freed), free(dvc), free(tpos);
    return bad;
}

#endif
