/* The plan's building blocks: buffers, the host-ordered action list (allocate, run a task,
 * free), tasks with their dependencies, and row views of buffers. Every lowering file
 * builds the plan through these. */
#include <string.h>

#include "scheduler/lower.h"

cw_status cw__grow(void **arr, int *cap, int need, size_t elem) {
    if (need <= *cap) return CW_OK;
    int nc = *cap ? *cap * 2 : 64;
    while (nc < need) nc *= 2;
    void *na = cw__realloc(*arr, (size_t)nc * elem);
    if (!na) return CW_ERR_OUT_OF_MEMORY;
    memset((char *)na + (size_t)*cap * elem, 0, (size_t)(nc - *cap) * elem);
    *arr = na;
    *cap = nc;
    return CW_OK;
}

cw_status cw__oom(cw__lower *L) { return cw__error(L->g->ctx, CW_ERR_OUT_OF_MEMORY, "compile: out of host memory"); }

cw_status cw__new_buf(cw__lower *L, cw__bkind kind, int ext, const cw_tensor_desc *d, int64_t bytes, int *out) {
    cw_plan *p = L->p;
    if (cw__grow((void **)&p->bufs, &p->cap_bufs, p->n_bufs + 1, sizeof *p->bufs) != CW_OK) return cw__oom(L);
    cw__buf *b = &p->bufs[p->n_bufs];
    b->kind = kind;
    b->ext = ext;
    if (d) b->d = *d;
    b->bytes = bytes;
    b->tail = b->head = -1;
    *out = p->n_bufs++;
    return CW_OK;
}

cw_status cw__act(cw__lower *L, cw__akind kind, int id, int stream) {
    cw_plan *p = L->p;
    if (cw__grow((void **)&p->acts, &p->cap_acts, p->n_acts + 1, sizeof *p->acts) != CW_OK) return cw__oom(L);
    cw__action *a = &p->acts[p->n_acts++];
    a->kind = kind;
    a->id = id;
    a->stream = stream;
    a->event = -1;
    return CW_OK;
}

cw_status cw__temp(cw__lower *L, int64_t bytes, const cw_tensor_desc *d, int *out) {
    CW_TRY(cw__new_buf(L, CW__B_TEMP, -1, d, bytes, out));
    return cw__act(L, CW__A_ALLOC, *out, 0);
}

cw_status cw__release(cw__lower *L, int buf) {
    if (buf < 0) return CW_OK;
    CW_TRY(cw__release_tail(L, buf));
    return cw__act(L, CW__A_FREE, buf, 0);
}

cw_status cw__release_tail(cw__lower *L, int buf) {
    cw__buf *b = &L->p->bufs[buf];
    if (b->tail < 0 || b->tail_freed) return CW_OK;
    b->tail_freed = 1;
    return cw__act(L, CW__A_FREE, b->tail, 0);
}

cw_status cw__new_task(cw__lower *L, cw__tkind kind, int stage, int stream, int node, cw__task **out, int *id) {
    cw_plan *p = L->p;
    if (cw__grow((void **)&p->tasks, &p->cap_tasks, p->n_tasks + 1, sizeof *p->tasks) != CW_OK) return cw__oom(L);
    cw__task *t = &p->tasks[p->n_tasks];
    memset(t, 0, sizeof *t);
    t->kind = kind;
    t->stage = stage;
    t->stream = stream;
    t->node = node;
    t->threads = L->threads;
    t->event = -1;
    *id = p->n_tasks++;
    *out = t;
    return cw__act(L, CW__A_TASK, *id, stream);
}

cw_status cw__dep(cw__lower *L, int task, int dep) {
    if (dep < 0) return CW_OK;
    cw__task *t = &L->p->tasks[task];
    for (int i = 0; i < t->n_deps; i++)
        if (t->deps[i] == dep) return CW_OK;
    int *nd = cw__realloc(t->deps, (size_t)(t->n_deps + 1) * sizeof *nd);
    if (!nd) return cw__oom(L);
    t->deps = nd;
    t->deps[t->n_deps++] = dep;
    return CW_OK;
}

/* The reads are long done in practice, so the write-after-read deps cost no parallelism.
 * Only the last task touching b on each stream: a stream runs its tasks in host order, so
 * waiting for it waits for the earlier ones there (sync.c keeps one wait per stream pair
 * anyway; a distributed plan remakes its orders from row accesses). The whole list made
 * every in-place epilogue of a long residual chain depend on thousands of tasks, each
 * cw__dep a scan of those before it: cubic, most of a memory ladder's compile time. */
cw_status cw__touching(cw__lower *L, int b, int **out, int *n) {
    const cw_plan *p = L->p;
    *out = NULL;
    *n = 0;
    int *list = cw__malloc((size_t)p->n_streams * sizeof *list + 1), seen = 0;
    if (!list) return cw__oom(L);
    for (int t = p->n_tasks - 1; t >= 0 && *n < p->n_streams; t--) {
        const int s = p->tasks[t].stream;
        if (seen & (1 << s)) continue;
        int tb[CW__TASK_MAX_BUFS];
        for (int k = 0, m = cw__task_bufs(&p->tasks[t], tb); k < m; k++)
            if (tb[k] == b) {
                list[(*n)++] = t;
                seen |= 1 << s;
                break;
            }
    }
    *out = list;
    return CW_OK;
}

cw_status cw__dep_rows(cw__lower *L, int task, int n, int64_t r0, int64_t r1) {
    return cw__dep_band(L, task, n, cw__hdim(&L->g->nodes[n].desc), r0, r1);
}

cw_status cw__dep_band(cw__lower *L, int task, int n, int ax, int64_t r0, int64_t r1) {
    const cw__lnode *ln = &L->nd[n];
    if (r1 <= r0) return CW_OK;
    for (int i = 0; i < ln->n_wr; i++) {
        const cw__wr *w = &ln->wr[i];
        /* bands along different axes each span the other's whole extent: they meet */
        if (w->ax != ax ? w->r0 < w->r1 : w->r0 < r1 && r0 < w->r1) CW_TRY(cw__dep(L, task, w->task));
    }
    return CW_OK;
}

cw_status cw__writer(cw__lower *L, int n, int task, int64_t r0, int64_t r1) {
    return cw__writer_band(L, n, task, cw__hdim(&L->g->nodes[n].desc), r0, r1);
}

cw_status cw__writer_band(cw__lower *L, int n, int task, int ax, int64_t r0, int64_t r1) {
    cw__lnode *ln = &L->nd[n];
    if (cw__grow((void **)&ln->wr, &ln->cap_wr, ln->n_wr + 1, sizeof(cw__wr)) != CW_OK) return cw__oom(L);
    ln->wr[ln->n_wr++] = (cw__wr){task, ax, r0, r1};
    return CW_OK;
}

int cw__hdim(const cw_tensor_desc *d) { return d->rank >= 3 ? d->rank - 2 : 0; }

cw__vref cw__rows(int b, const cw_tensor_desc *d, int64_t r0, int64_t r1) { return cw__band(b, d, cw__hdim(d), r0, r1); }

cw__vref cw__band(int b, const cw_tensor_desc *d, int ax, int64_t r0, int64_t r1) {
    cw__vref v;
    memset(&v, 0, sizeof v);
    v.buf = b;
    v.rank = d->rank;
    for (int i = 0; i < d->rank; i++) v.dims[i] = d->dims[i];
    v.start[ax] = r0;
    v.dims[ax] = r1 - r0;
    return v;
}

cw__vref cw__whole(int b, const cw_tensor_desc *d) { return cw__rows(b, d, 0, d->dims[cw__hdim(d)]); }

int cw__next_heavy(cw__lower *L) {
    int s = L->rr;
    L->rr = (L->rr + 1) % L->heavy;
    return s;
}
