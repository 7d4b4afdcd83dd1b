/* Synchronisation: given the host-ordered action list, decides on which stream each buffer
 * is allocated and freed and which events order the streams — a task waits on the events
 * of its cross-stream dependencies (deduplicated per stream pair), a stream's first use of
 * a buffer allocated on another stream waits on an event recorded after the allocation,
 * and a free joins every other stream that used the buffer. */
#include <inttypes.h>
#include <string.h>

#include "scheduler/sched.h"

int cw__task_views(const cw__task *t, const cw__vref **v) {
    int n = 0;
    switch (t->kind) {
    case CW__T_CONV: v[n++] = &t->u.conv.x, v[n++] = &t->u.conv.y; break;
    case CW__T_PREP: v[n++] = &t->u.prep.src, v[n++] = &t->u.prep.dst; break;
    case CW__T_ADD: v[n++] = &t->u.add.dst, v[n++] = &t->u.add.a, v[n++] = &t->u.add.b; break;
    case CW__T_STATS: v[n++] = &t->u.stats.x; break;
    case CW__T_FINALIZE: break;
    case CW__T_OP:
        v[n++] = &t->u.op.out;
        for (int k = 0; k < cw_op_get_info(t->u.op.code).n_in; k++) v[n++] = &t->u.op.in[k];
        break;
    case CW__T_ATTN: v[n++] = &t->u.attn.q, v[n++] = &t->u.attn.k, v[n++] = &t->u.attn.v, v[n++] = &t->u.attn.o; break;
    case CW__T_SEND:
    case CW__T_RECV: v[n++] = &t->u.comm.v; break;
    }
    return n;
}

int cw__task_bufs(const cw__task *t, int *out) {
    const cw__vref *v[CW__TASK_MAX_BUFS] = {0};
    int b[CW__TASK_MAX_BUFS], n = 0, m = cw__task_views(t, v);
    for (int k = 0; k < m; k++) b[k] = v[k]->buf;
    switch (t->kind) { /* the buffers no view names */
    case CW__T_CONV: b[m++] = t->u.conv.ws_buf; break;
    case CW__T_PREP: b[m++] = t->u.prep.ss_buf; break;
    case CW__T_STATS: b[m++] = t->u.stats.part_buf; break;
    case CW__T_FINALIZE: b[m++] = t->u.fin.part_buf, b[m++] = t->u.fin.ss_buf; break;
    case CW__T_ATTN: b[m++] = t->u.attn.s_buf; break;
    default: break;
    }
    for (int i = 0; i < m; i++)
        if (b[i] >= 0) out[n++] = b[i];
    return n;
}

/* Working state of the pass; S streams, nb buffers. */
typedef struct cw__sync {
    cw_plan *p;
    int S;
    int *first;     /* per buffer: stream of its first user (-1) */
    int *lastu;     /* per buffer x stream: last task using it there (-1) */
    int *waited;    /* per stream x stream: latest task of the second the first waited for */
    int *alloc_act; /* per buffer: its ALLOC action (-1) */
    int *dstream;   /* per buffer: the stream of its DROPs (-1: none yet) */
    char *ordered;  /* per buffer x stream: the stream is ordered after the allocation */
} cw__sync;

static cw_status cw__sync_oom(cw__sync *y) {
    return cw__error(y->p->ctx, CW_ERR_OUT_OF_MEMORY, "compile: out of host memory");
}

/* Appends v to the int array *arr of *n entries. */
static cw_status cw__push(cw__sync *y, int **arr, int *n, int v) {
    int *na = cw__realloc(*arr, (size_t)(*n + 1) * sizeof *na);
    if (!na) return cw__sync_oom(y);
    *arr = na;
    na[(*n)++] = v;
    return CW_OK;
}

/* Task t (index ti) in host order: waits for the allocations of buffers it is the first on
 * its stream to use, and for its cross-stream dependencies. */
static cw_status cw__sync_task(cw__sync *y, int ti) {
    cw_plan *p = y->p;
    const int S = y->S;
    cw__task *t = &p->tasks[ti];
    int tb[CW__TASK_MAX_BUFS];
    int n = cw__task_bufs(t, tb);
    /* The allocator orders only the allocating stream after the memory's previous use;
     * every other stream that touches the buffer waits on an event recorded right after
     * the allocation, before its first use. */
    for (int k = 0; k < n; k++) {
        int b = tb[k];
        if (y->alloc_act[b] < 0 || y->ordered[(size_t)b * S + t->stream]) continue;
        cw__action *al = &p->acts[y->alloc_act[b]];
        int ev = al->event >= 0 ? al->event : p->n_events;
        CW_TRY(cw__push(y, &t->alloc_waits, &t->n_alloc_waits, ev));
        if (al->event < 0) al->event = p->n_events++;
        y->ordered[(size_t)b * S + t->stream] = 1;
    }
    for (int d = 0; d < t->n_deps; d++) {
        int dt = t->deps[d];
        int ds = p->tasks[dt].stream;
        if (ds == t->stream || y->waited[t->stream * S + ds] >= dt) continue;
        CW_TRY(cw__push(y, &t->waits, &t->n_waits, dt));
        y->waited[t->stream * S + ds] = dt;
        if (p->tasks[dt].event < 0) p->tasks[dt].event = p->n_events++;
    }
    for (int k = 0; k < n; k++) y->lastu[tb[k] * S + t->stream] = ti;
    return CW_OK;
}

/* A FREE (DISCARD, DROP) runs on the stream of the buffer's last user so far, after joining
 * the other users. A tail's users are its head's (tasks name the tensor's head, cw__buf.tail).
 * A buffer's DROPs and its FREE all run on its first DROP's stream: in that stream's order,
 * no drop's page discard can run after the free has let another tensor have the bytes. */
static cw_status cw__sync_free(cw__sync *y, cw__action *ac) {
    cw_plan *p = y->p;
    const int S = y->S;
    int b = p->bufs[ac->id].head >= 0 ? p->bufs[ac->id].head : ac->id, fs = 0, lt = -1;
    for (int s = 0; s < S; s++)
        if (y->lastu[b * S + s] > lt) lt = y->lastu[b * S + s], fs = s;
    if (y->dstream[b] >= 0) fs = y->dstream[b];
    else if (ac->kind == CW__A_DROP) y->dstream[b] = fs;
    ac->stream = fs;
    for (int s = 0; s < S; s++) {
        int u = y->lastu[b * S + s];
        if (s == fs || u < 0 || y->waited[fs * S + s] >= u) continue;
        CW_TRY(cw__push(y, &ac->joins, &ac->n_joins, u));
        y->waited[fs * S + s] = u;
        if (p->tasks[u].event < 0) p->tasks[u].event = p->n_events++;
    }
    return CW_OK;
}

/* Invariant: every allocated buffer is freed exactly once. */
static cw_status cw__sync_check(cw__sync *y) {
    cw_plan *p = y->p;
    int *count = y->first; /* reused */
    for (int b = 0; b < p->n_bufs; b++) count[b] = 0;
    for (int a = 0; a < p->n_acts; a++)
        if (p->acts[a].kind == CW__A_ALLOC) count[p->acts[a].id]++;
        else if (p->acts[a].kind == CW__A_FREE) count[p->acts[a].id]--;
    for (int b = 0; b < p->n_bufs; b++)
        if (count[b] != 0)
            return cw__error(p->ctx, CW_ERR_INTERNAL, "compile: buffer %d (kind %d, %" PRId64 " bytes) %s", b,
                             (int)p->bufs[b].kind, p->bufs[b].bytes, count[b] > 0 ? "never freed" : "freed twice");
    return CW_OK;
}

static cw_status cw__sync_pass(cw__sync *y) {
    cw_plan *p = y->p;
    const int S = y->S;
    int tb[CW__TASK_MAX_BUFS];
    for (int a = 0; a < p->n_acts; a++) {
        if (p->acts[a].kind != CW__A_TASK) continue;
        const cw__task *t = &p->tasks[p->acts[a].id];
        for (int k = 0, n = cw__task_bufs(t, tb); k < n; k++)
            if (y->first[tb[k]] < 0) y->first[tb[k]] = t->stream;
    }
    p->n_events = 0;
    for (int a = 0; a < p->n_acts; a++) {
        cw__action *ac = &p->acts[a];
        cw_status st = CW_OK;
        if (ac->kind == CW__A_ALLOC) {
            ac->stream = y->first[ac->id] >= 0 ? y->first[ac->id] : 0;
            y->alloc_act[ac->id] = a;
            for (int s = 0; s < S; s++) y->ordered[(size_t)ac->id * S + s] = s == ac->stream;
        } else if (ac->kind == CW__A_TASK) {
            st = cw__sync_task(y, ac->id);
        } else {
            st = cw__sync_free(y, ac);
        }
        CW_TRY(st);
    }
    return cw__sync_check(y);
}

cw_status cw__plan_sync(cw_plan *p) {
    const int S = p->n_streams, nb = p->n_bufs;
    cw__sync y = {p, S, NULL, NULL, NULL, NULL, NULL, NULL};
    y.first = cw__malloc((size_t)nb * sizeof *y.first + 1);
    y.lastu = cw__malloc((size_t)nb * (size_t)S * sizeof *y.lastu + 1);
    y.waited = cw__malloc((size_t)S * (size_t)S * sizeof *y.waited);
    y.alloc_act = cw__malloc((size_t)nb * sizeof *y.alloc_act + 1);
    y.ordered = cw__calloc((size_t)nb * (size_t)S + 1, 1);
    y.dstream = cw__malloc((size_t)nb * sizeof *y.dstream + 1);
    cw_status st;
    if (!y.first || !y.lastu || !y.waited || !y.alloc_act || !y.ordered || !y.dstream) {
        st = cw__sync_oom(&y);
    } else {
        for (int b = 0; b < nb; b++) y.first[b] = -1, y.alloc_act[b] = -1, y.dstream[b] = -1;
        for (int k = 0; k < nb * S; k++) y.lastu[k] = -1;
        for (int k = 0; k < S * S; k++) y.waited[k] = -1;
        st = cw__sync_pass(&y);
    }
    cw__free(y.first), cw__free(y.lastu), cw__free(y.waited), cw__free(y.alloc_act), cw__free(y.ordered);
    cw__free(y.dstream);
    return st;
}
