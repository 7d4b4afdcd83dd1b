/* Rows given back while a tensor is still live. A conv that is an activation's last reader
 * walks it patch by patch; the rows its later patches no longer read are dead long before
 * the whole tensor is freed. On a backend whose memory is paged (cpu: the arena's pages are
 * the process's resident memory), giving their whole pages back lowers the resident peak
 * where a block's input dies while its output grows: the SD decoder's 512² stage holds its
 * 256-channel input at 256² (64 MiB) while its 128 MiB output is written, and its resident
 * memory then follows the live rows, not the sum of the two tensors.
 *
 * The pass runs on the finished host-ordered action list, before cw__plan_sync: for every
 * activation it finds, after each task touching it, the first row (along H) any later task
 * touches, and inserts a DROP of the rows before it once they add up to a step (cw__step).
 * cw__plan_sync joins a DROP like a FREE (every stream's earlier user of the buffer), so
 * every access to the rows happens before it; later tasks touch only rows after them. */
#include <string.h>

#include "scheduler/sched.h"

/* Rows go back in steps of 1 MiB, or a sixteenth of a smaller tensor, and at least a page per
 * channel plane: each DROP is a host call on a stream and one madvise per plane. */
static int64_t cw__step(int64_t bytes, int64_t planes) {
    int64_t s = bytes / 16 < (INT64_C(1) << 20) ? bytes / 16 : INT64_C(1) << 20;
    return s > planes * 4096 ? s : planes * 4096;
}

/* An activation whose rows can go: whole (no head and tail), at least 3-D, its rows along
 * H (dim rank - 2). */
static int cw__droppable(const cw__buf *b) {
    return b->kind == CW__B_ACT && b->head < 0 && b->tail < 0 && b->d.rank >= 3 && b->d.dims[b->d.rank - 2] > 1;
}

/* The first row of buffer b that task t touches: INT64_MAX if none; 0 where t reaches it
 * otherwise than through a view of its shape (a scale/shift or workspace buffer). */
static int64_t cw__first_row(const cw_plan *p, const cw__task *t, int b) {
    const cw__vref *v[CW__TASK_MAX_BUFS] = {0};
    int tb[CW__TASK_MAX_BUFS], nv = cw__task_views(t, v), nb = cw__task_bufs(t, tb), via = 0;
    const cw__buf *bf = &p->bufs[b];
    const int ax = bf->d.rank - 2;
    int64_t r = INT64_MAX;
    for (int k = 0; k < nv; k++) {
        if (v[k]->buf != b) continue;
        via = 1;
        int64_t s = v[k]->rank == bf->d.rank && v[k]->dims[ax] > 0 ? v[k]->start[ax] : 0;
        if (s < r) r = s;
    }
    for (int k = 0; k < nb && !via; k++)
        if (tb[k] == b) r = 0;
    return r;
}

cw_status cw__plan_drops(cw_plan *p) {
    const cw__runtime_i *rt = p->ctx->be->rt;
    if (p->opt.comm || p->opt.policy == CW_PATCHES_NONE || !rt->discard) return CW_OK;
    const int nb = p->n_bufs, na = p->n_acts;
    int64_t *next = cw__malloc((size_t)nb * sizeof *next + 1);     /* first row a later task touches */
    int64_t *dropped = cw__calloc((size_t)nb + 1, sizeof *dropped); /* rows given back so far */
    int64_t *dead = cw__malloc((size_t)p->n_tasks * CW__TASK_MAX_BUFS * sizeof *dead + 1);
    cw__action *acts = NULL;
    int n = 0, cap = 0;
    cw_status st = next && dropped && dead ? CW_OK : CW_ERR_OUT_OF_MEMORY;
    for (int b = 0; b < nb && st == CW_OK; b++) next[b] = INT64_MAX;
    /* backwards: after task k, the rows of each of its buffers that no later task touches */
    for (int a = na - 1; a >= 0 && st == CW_OK; a--) {
        if (p->acts[a].kind != CW__A_TASK) continue;
        const int k = p->acts[a].id;
        int tb[CW__TASK_MAX_BUFS], m = cw__task_bufs(&p->tasks[k], tb);
        for (int i = 0; i < m; i++) dead[(size_t)k * CW__TASK_MAX_BUFS + i] = next[tb[i]];
        for (int i = 0; i < m; i++) {
            int64_t r = cw__first_row(p, &p->tasks[k], tb[i]);
            if (r < next[tb[i]]) next[tb[i]] = r;
        }
    }
    /* forwards: the action list with a DROP after each task past which enough rows died */
    for (int a = 0; a < na && st == CW_OK; a++) {
        if (cw__grow((void **)&acts, &cap, n + 1 + CW__TASK_MAX_BUFS, sizeof *acts) != CW_OK) {
            st = CW_ERR_OUT_OF_MEMORY;
            break;
        }
        acts[n++] = p->acts[a];
        if (p->acts[a].kind != CW__A_TASK) continue;
        const int k = p->acts[a].id;
        int tb[CW__TASK_MAX_BUFS], m = cw__task_bufs(&p->tasks[k], tb);
        for (int i = 0; i < m; i++) {
            const int b = tb[i];
            const cw__buf *bf = &p->bufs[b];
            const int64_t d = dead[(size_t)k * CW__TASK_MAX_BUFS + i];
            if (!cw__droppable(bf) || d == INT64_MAX || d <= dropped[b]) continue;
            const int ax = bf->d.rank - 2;
            int64_t row = bf->d.dims[ax + 1] * (int64_t)cw_dtype_size(bf->d.dtype), planes = 1;
            for (int j = 0; j < ax; j++) planes *= bf->d.dims[j];
            if (d < bf->d.dims[ax] && (d - dropped[b]) * row * planes < cw__step(bf->bytes, planes)) continue;
            if (d > bf->d.dims[ax]) continue; /* not reached: views lie inside their buffer */
            if (cw__grow((void **)&p->drops, &p->cap_drops, p->n_drops + 1, sizeof *p->drops) != CW_OK) {
                st = CW_ERR_OUT_OF_MEMORY;
                break;
            }
            p->drops[p->n_drops] = (cw__drop){ax, dropped[b], d};
            cw__action *ac = &acts[n++];
            memset(ac, 0, sizeof *ac);
            ac->kind = CW__A_DROP, ac->id = b, ac->event = -1, ac->drop = p->n_drops++;
            dropped[b] = d;
        }
    }
    if (st == CW_OK) {
        cw__free(p->acts);
        p->acts = acts, p->n_acts = n, p->cap_acts = cap;
        acts = NULL;
    }
    cw__free(next), cw__free(dropped), cw__free(dead), cw__free(acts);
    return st == CW_OK ? CW_OK : cw__error(p->ctx, st, "compile: out of host memory");
}
