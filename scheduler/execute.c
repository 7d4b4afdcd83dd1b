/* Running a plan: the host replays the action list — allocate from the budgeted allocator,
 * make the task's stream wait on the events of its cross-stream dependencies, enqueue the
 * operation, record its event, free in stream order — and synchronises once at the end.
 * The same replay against the dry backend, with no operations enqueued, is the budget
 * search's simulation (budget.c). */
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "kernels/kernels.h"
#include "prof/nvtx.h"
#include "scheduler/sched.h"

/* ---- views ------------------------------------------------------------------------------- */
/* A view of a buffer in the buffer's own dtype: the graph's for activations, patch and
 * band buffers and externals; f32 for the compute-internal temporaries (no desc). */
int64_t cw__vref_desc(const cw_tensor_desc *bd, const cw__vref *r, cw_tensor_desc *d) {
    memset(d, 0, sizeof *d);
    d->dtype = bd->dtype;
    d->rank = r->rank;
    int64_t off = 0;
    for (int i = 0; i < r->rank; i++) {
        d->dims[i] = r->dims[i];
        d->strides[i] = bd->strides[i];
        off += r->start[i] * bd->strides[i];
    }
    return off;
}

static cw__view cw__resolve(const cw_plan *p, const cw__vref *r) {
    cw__view v;
    memset(&v, 0, sizeof v);
    const cw_tensor_desc *bd = &p->rdesc[r->buf];
    const cw__buf *b = &p->bufs[r->buf];
    int64_t off = cw__vref_desc(bd, r, &v.d);
    if (b->row0) off -= b->row0 * bd->strides[b->ax]; /* a rank's rows of the tensor (distribute.c) */
    v.data = (char *)p->ptrs[r->buf] + off * (int64_t)cw_dtype_size(bd->dtype);
    return v;
}

/* ---- host callbacks for timing and NVTX (run in stream order on the backend) ---------- */
typedef struct cw__hostarg {
    cw_plan *p;
    int task;
    int nvtx; /* push/pop the task's NVTX range here, on the thread that runs the stream */
} cw__hostarg;

static void cw__host_begin(void *arg) {
    cw__hostarg *h = arg;
    const cw__task *t = &h->p->tasks[h->task];
    if (h->nvtx) cw__nvtx_push(cw__task_name(h->p, t), t->stage + 1, t->stream);
    if (h->p->t0) h->p->t0[h->task] = cw__now_ns();
}

static void cw__host_end(void *arg) {
    cw__hostarg *h = arg;
    if (h->p->t1) h->p->t1[h->task] = cw__now_ns();
    if (h->nvtx) cw__nvtx_pop();
}

static void cw__host_progress(void *arg) {
    cw_plan *p = arg;
    int64_t done = atomic_fetch_add(&p->progress_done, 1) + 1;
    p->progress_fn(p->progress_user, done, p->n_tasks);
}

cw_status cw_plan_set_progress(cw_plan *p, cw_progress_fn fn, void *user) {
    if (!p) return CW_ERR_INVALID_ARG;
    if (fn && !p->ctx->be->rt->launch_host)
        return cw__error(p->ctx, CW_ERR_UNSUPPORTED, "cw_plan_set_progress: the %s backend has no host callbacks",
                         p->ctx->be->rt->name);
    p->progress_fn = fn;
    p->progress_user = user;
    return CW_OK;
}

/* ---- enqueueing one task's operations ---------------------------------------------------- */
/* q or o of an attention chunk starting at token t0, as a [C, tokens] matrix: its leading
 * dimension and the chunk's first column. The whole sample ([1, C, ...]: column t0), a band
 * of its rows (a rank's share, distribute.c: t0 less the band's first token), or in a half
 * graph the chunk's own f32 copy ([C, tc]: column 0). Each channel's tokens must be
 * contiguous; returns 0 where they are not. */
static int cw__attn_matrix(const cw_plan *p, const cw__vref *r, const cw__view *v, int64_t C, int64_t t0, int64_t *ld,
                           int64_t *col) {
    if (v->d.dtype != CW_F32) return 0;
    if (p->bufs[r->buf].kind == CW__B_TEMP) {
        *ld = cw__desc_numel(&v->d) / C, *col = 0;
        return cw__desc_is_contiguous(&v->d);
    }
    int64_t first = 0, span = 1;
    for (int d = v->d.rank - 1; d >= 2; d--) {
        if (v->d.strides[d] != span) return 0;
        first += r->start[d] * span;
        span *= v->d.dims[d];
    }
    *ld = v->d.strides[1], *col = t0 - first;
    return v->d.dims[0] == 1 && v->d.dims[1] == C;
}

/* One attention query chunk of one sample: S = scale * Q^T K, row softmax, O = V S^T (two
 * f32 GEMMs). k, v: that sample's [1, C, ...] views, f32; q, o: the sample's too (or a band
 * of its rows), or the chunk's f32 copies (a half-precision graph's lowering stages them in
 * f32): cw__attn_matrix. */
static cw_status cw__enqueue_attention(cw_plan *p, cw__backend *be, cw__stream *s, const cw__task *t) {
    const int64_t T = t->u.attn.T, C = t->u.attn.C, t0 = t->u.attn.t0, tc = t->u.attn.t1 - t->u.attn.t0;
    cw__view q = cw__resolve(p, &t->u.attn.q), k = cw__resolve(p, &t->u.attn.k);
    cw__view v = cw__resolve(p, &t->u.attn.v), o = cw__resolve(p, &t->u.attn.o);
    int64_t ldq, ldo, q0, o0;
    if (!cw__desc_is_contiguous(&k.d) || !cw__desc_is_contiguous(&v.d) || k.d.dtype != CW_F32 || v.d.dtype != CW_F32 ||
        !cw__attn_matrix(p, &t->u.attn.q, &q, C, t0, &ldq, &q0) || !cw__attn_matrix(p, &t->u.attn.o, &o, C, t0, &ldo, &o0))
        return cw__error(p->ctx, CW_ERR_UNSUPPORTED, "attention: operands must be contiguous f32 tensors");
    float *qp = q.data, *kp = k.data, *vp = v.data, *op = o.data, *sp = p->ptrs[t->u.attn.s_buf];
    /* rows [r, e) of the chunk see keys [k0, k1): all of them, or under a block mask those of
     * their block (one range per block the chunk touches; cw__attn_keys) */
    cw_status st = CW_OK;
    for (int64_t r = t0, k0, k1, e; r < t0 + tc && st == CW_OK; r = e) {
        cw__attn_keys(t->u.attn.block, t->u.attn.mask, T, r, &k0, &k1, &e);
        if (e > t0 + tc) e = t0 + tc;
        const int64_t i = r - t0;
        cw__gemm_params g1 = {1, 0, e - r, k1 - k0, C, t->u.attn.scale, 0.0f, qp + q0 + i, ldq, kp + k0, T,
                              sp + i * T, T, t->threads};
        cw__gemm_params g2 = {0, 1, C, e - r, k1 - k0, 1.0f, 0.0f, vp + k0, T, sp + i * T, T, op + o0 + i, ldo,
                              t->threads};
        st = cw__op_gemm(be, s, &g1);
        if (st == CW_OK) st = cw__op_softmax_rows(be, s, sp + i * T, e - r, k1 - k0, T);
        if (st == CW_OK) st = cw__op_gemm(be, s, &g2);
    }
    return st;
}

/* A message to or from another rank (distribute.c). Where streams are host threads the
 * communicator's call runs there, in stream order, and blocks; else it enqueues on the
 * native stream. The first failure is kept for cw_plan_run; later calls are skipped. */
struct cw__comm_arg {
    cw_plan *p;
    const cw__task *t;
    cw__view v;
};

static void cw__comm_fail(cw_plan *p, const cw__task *t, cw_status st) {
    int ok = CW_OK;
    if (atomic_compare_exchange_strong(&p->comm_status, &ok, (int)st))
        snprintf(p->comm_msg, sizeof p->comm_msg, "rank %d: %s (message %" PRId64 ") failed: %s", p->opt.comm->rank,
                 cw__task_name(p, t), t->u.comm.tag, cw_status_name(st));
}

static cw_status cw__comm_call(cw_plan *p, const cw__task *t, cw__view *v, void *stream) {
    const cw_comm *c = p->opt.comm;
    if (t->kind == CW__T_SEND) return c->send(c->user, &v->d, v->data, t->u.comm.peer, t->u.comm.tag, stream);
    return c->recv(c->user, &v->d, v->data, t->u.comm.peer, t->u.comm.tag, stream);
}

static void cw__host_comm(void *arg) {
    struct cw__comm_arg *a = arg;
    if (atomic_load(&a->p->comm_status) != CW_OK) return;
    cw_status st = cw__comm_call(a->p, a->t, &a->v, NULL);
    if (st != CW_OK) cw__comm_fail(a->p, a->t, st == CW_ERR_COMM ? st : CW_ERR_COMM);
}

static cw_status cw__enqueue_comm(cw_plan *p, cw__backend *be, cw__stream *s, const cw__task *t) {
    struct cw__comm_arg *a = &p->comm_args[t - p->tasks];
    a->p = p, a->t = t, a->v = cw__resolve(p, &t->u.comm.v);
    if (be->rt->caps & CW__CAP_HOST_STREAMS) return be->rt->launch_host(be, s, cw__host_comm, a);
    cw_status st = cw__comm_call(p, t, &a->v, be->rt->stream_handle ? be->rt->stream_handle(be, s) : NULL);
    if (st != CW_OK) cw__comm_fail(p, t, st);
    return st;
}

static cw_status cw__enqueue(cw_plan *p, cw__backend *be, cw__stream *s, const cw__task *t) {
    switch (t->kind) {
    case CW__T_CONV: {
        const cw__conv_ext *ce = cw__conv_of(p, t);
        cw__conv_problem pr = ce->prob;
        cw__view x = cw__resolve(p, &t->u.conv.x), w = cw__resolve(p, &t->u.conv.w), y = cw__resolve(p, &t->u.conv.y);
        pr.x = x.d, pr.w = w.d, pr.y = y.d;
        const void *b = t->u.conv.has_b ? p->ptrs[t->u.conv.b.buf] : NULL;
        void *ws = t->u.conv.ws_buf >= 0 ? p->ptrs[t->u.conv.ws_buf] : NULL;
        cw__conv_algo algo = ce->algo;
        algo.threads = t->threads;
        return cw__op_conv_forward(be, s, &pr, &algo, x.data, w.data, b, y.data, ws, algo.workspace);
    }
    case CW__T_PREP: {
        cw__prep_params pp;
        memset(&pp, 0, sizeof pp);
        pp.src = cw__resolve(p, &t->u.prep.src);
        pp.dst = cw__resolve(p, &t->u.prep.dst);
        if (t->u.prep.ss_buf >= 0) {
            int64_t nc = pp.src.d.dims[0] * pp.src.d.dims[1];
            pp.scale = p->ptrs[t->u.prep.ss_buf];
            pp.shift = pp.scale + nc;
        }
        pp.silu = t->u.prep.silu;
        pp.unary = t->u.prep.unary, pp.ua = t->u.prep.ua, pp.ub = t->u.prep.ub;
        pp.up = t->u.prep.up;
        pp.dst_row0 = t->u.prep.dst_row0;
        pp.src_row0 = t->u.prep.src_row0;
        for (int k = 0; k < 3; k++) pp.pad[k] = t->u.prep.pad[k];
        pp.up_h = t->u.prep.up_h;
        pp.up_d = t->u.prep.up_d;
        pp.off_d = t->u.prep.off_d;
        return cw__op_prep(be, s, &pp);
    }
    case CW__T_ADD: {
        cw__view d = cw__resolve(p, &t->u.add.dst), a = cw__resolve(p, &t->u.add.a), b = cw__resolve(p, &t->u.add.b);
        return cw__op_add(be, s, &d, &a, &b);
    }
    case CW__T_STATS: {
        cw__view x = cw__resolve(p, &t->u.stats.x);
        int64_t per = x.d.dims[0] * t->u.stats.groups * 3;
        double *parts = (double *)p->ptrs[t->u.stats.part_buf] + t->u.stats.part_index * per;
        return cw__op_gn_stats(be, s, &x, t->u.stats.groups, parts);
    }
    case CW__T_FINALIZE: {
        float *ss = p->ptrs[t->u.fin.ss_buf];
        cw__view gm = cw__resolve(p, &t->u.fin.gamma), bt = cw__resolve(p, &t->u.fin.beta);
        return cw__op_gn_finalize(be, s, p->ptrs[t->u.fin.part_buf], t->u.fin.n_parts, t->u.fin.n, t->u.fin.c,
                              t->u.fin.groups, gm.data, bt.data, t->u.fin.eps, ss, ss + t->u.fin.n * t->u.fin.c);
    }
    case CW__T_ATTN: return cw__enqueue_attention(p, be, s, t);
    case CW__T_SEND:
    case CW__T_RECV: return cw__enqueue_comm(p, be, s, t);
    case CW__T_OP: {
        cw__op_args a;
        memset(&a, 0, sizeof a);
        a.code = t->u.op.code;
        a.out = cw__resolve(p, &t->u.op.out);
        for (int k = 0; k < cw_op_get_info(a.code).n_in; k++) a.in[k] = cw__resolve(p, &t->u.op.in[k]);
        a.param = t->u.op.param;
        return cw__op_run(be, s, &a);
    }
    }
    return CW_ERR_INTERNAL;
}


/* ---- the replay ------------------------------------------------------------------------- */

/* One replay of the action list. A run uses the context's streams and the plan's events and
 * enqueues the operations; a simulation (dry) makes its own streams and events on the dry
 * backend and enqueues nothing. */
typedef struct cw__exec {
    cw_plan *p;
    cw__backend *be;
    cw__allocator *temp; /* temporaries only: activations sit at fixed arena offsets */
    int dry;
    int nvtx, nvtx_worker, timing;
    cw__timer *timer;     /* device timestamps instead of host callbacks (p->timer) */
    cw__stream *streams[CW__MAX_STREAMS];
    cw__event **ev;
    cw__hostarg *ha;
    char *live;           /* per buffer: allocated and not yet freed (a failed run frees it) */
    int64_t peak_total;
} cw__exec;

/* NVTX: where the backend's streams are host threads, a task's range is pushed on its
 * worker around the work; on a GPU backend the range wraps the enqueue on the host (as
 * Nsight Systems expects, correlated with the kernels it launches). */
static cw_status cw__exec_open_run(cw__exec *x) {
    cw_plan *p = x->p;
    const cw__runtime_i *i = x->be->rt;
    cw_status st = CW_OK;
    x->nvtx = (p->ctx->cfg.flags & CW_FLAG_NVTX) != 0;
    x->nvtx_worker = x->nvtx && i->launch_host && (i->caps & CW__CAP_HOST_STREAMS);
    /* device timestamps where the backend has them: host callbacks would serialise the
     * schedule around every task */
    x->timer = p->timer;
    x->timing = ((p->ctx->cfg.flags & CW_FLAG_TIMING) || x->nvtx_worker) && i->launch_host && !x->timer;
    for (int s = 0; s < p->n_streams && st == CW_OK; s++) st = cw__context_stream(p->ctx, s, &x->streams[s]);
    if (p->opt.comm && i->unbound_queues) i->unbound_queues(x->be); /* ranks wait on each other */
    x->ev = p->events;
    if (x->timing && st == CW_OK) {
        x->ha = cw__malloc((size_t)p->n_tasks * sizeof *x->ha + 1);
        if (!x->ha) return CW_ERR_OUT_OF_MEMORY;
        for (int k = 0; k < p->n_tasks; k++) x->ha[k] = (cw__hostarg){p, k, x->nvtx_worker};
    }
    return st;
}

static cw_status cw__exec_open_dry(cw__exec *x) {
    cw_plan *p = x->p;
    cw__backend *be = x->be;
    cw_status st = CW_OK;
    for (int s = 0; s < p->n_streams && st == CW_OK; s++) st = be->rt->stream_create(be, &x->streams[s]);
    x->ev = cw__calloc((size_t)p->n_events + 1, sizeof *x->ev);
    if (!x->ev) return CW_ERR_OUT_OF_MEMORY;
    for (int e = 0; e < p->n_events && st == CW_OK; e++) st = be->rt->event_create(be, &x->ev[e]);
    return st;
}

static void cw__exec_close_dry(cw__exec *x) {
    cw__backend *be = x->be;
    for (int e = 0; x->ev && e < x->p->n_events; e++)
        if (x->ev[e]) be->rt->event_destroy(be, x->ev[e]);
    cw__free(x->ev);
    for (int s = 0; s < x->p->n_streams; s++)
        if (x->streams[s]) be->rt->stream_destroy(be, x->streams[s]);
}

/* Primes a capped pool with one segment, the arena: every temporary is then carved from it
 * (with event waits across streams), so the allocator never has to give segments back to
 * make room — which would synchronise the host mid-run. */
cw_status cw__plan_prime(cw_plan *p, cw__allocator *temp) {
    cw_memory_stats ms;
    cw__alloc_stats(temp, &ms);
    if (p->arena <= 0) return CW_OK;
    if (p->primed == temp && ms.reserved_bytes_current == p->arena_reserved && ms.allocated_bytes_current == 0)
        return CW_OK; /* still this plan's arena, from compile time or the last run */
    cw_status st = CW_OK;
    /* another plan's arena in a shared pool: this plan's run was simulated from its own */
    if (ms.reserved_bytes_current != 0) CW_TRY(cw__alloc_release_cached(temp));
    void *arena = NULL;
    st = cw__alloc_malloc(temp, p->arena, NULL, &arena);
    if (st == CW_OK) st = cw__alloc_free(temp, arena, NULL);
    cw__alloc_reset_peaks(temp); /* the priming block is not a use */
    cw__alloc_stats(temp, &ms);
    p->arena_reserved = ms.reserved_bytes_current; /* the arena as the pool rounded it */
    p->primed = temp;
    return st;
}

static cw_status cw__exec_prime(cw__exec *x) { return cw__plan_prime(x->p, x->temp); }

/* An activation's place in the plan's arena, after the frees of those whose bytes it reuses
 * (dry: a distinct fake address per offset). */
static cw_status cw__exec_place(cw__exec *x, const cw__action *ac) {
    cw_plan *p = x->p;
    cw_status st = CW_OK;
    for (int w = 0; w < ac->n_waits && st == CW_OK; w++)
        st = x->be->rt->stream_wait_event(x->be, x->streams[ac->stream], x->ev[ac->waits[w]]);
    char *base = x->dry ? (char *)(uintptr_t)0x10000 : (char *)p->act_arena;
    p->ptrs[ac->id] = base + p->bufs[ac->id].offset;
    return st;
}

static cw_status cw__exec_alloc(cw__exec *x, const cw__action *ac) {
    cw_plan *p = x->p;
    const cw__buf *b = &p->bufs[ac->id];
    cw_status st;
    if (b->kind == CW__B_ACT) {
        st = cw__exec_place(x, ac);
    } else {
        st = cw__alloc_malloc(x->temp, b->bytes, x->streams[ac->stream], &p->ptrs[ac->id]);
        if (st == CW_OK) x->live[ac->id] = 1;
    }
    CW_TRY(st);
    if (ac->event >= 0) CW_TRY(x->be->rt->event_record(x->be, x->ev[ac->event], x->streams[ac->stream]));
    cw_tensor_desc *d = &p->rdesc[ac->id];
    *d = b->d;
    memset(d->strides, 0, sizeof d->strides);
    cw__desc_fill_strides(d);
    if (!x->dry) { /* peak of temp + activations + weights */
        cw_memory_stats ms;
        int64_t tot = p->weights_bytes;
        cw__alloc_stats(x->temp, &ms);
        tot += ms.reserved_bytes_current + p->act_bytes;
        if (tot > x->peak_total) x->peak_total = tot;
    }
    return CW_OK;
}

/* A FREE, DISCARD or DROP first waits for the buffer's users on other streams (sync.c). */
static cw_status cw__exec_joins(cw__exec *x, const cw__action *ac) {
    for (int j = 0; j < ac->n_joins; j++)
        CW_TRY(x->be->rt->stream_wait_event(x->be, x->streams[ac->stream], x->ev[x->p->tasks[ac->joins[j]].event]));
    return CW_OK;
}

static cw_status cw__exec_free(cw__exec *x, const cw__action *ac) {
    cw_plan *p = x->p;
    cw_status st = CW_OK;
    CW_TRY(cw__exec_joins(x, ac));
    if (p->bufs[ac->id].kind != CW__B_ACT) {
        st = cw__alloc_free(x->temp, p->ptrs[ac->id], x->streams[ac->stream]);
        x->live[ac->id] = 0;
        return st;
    }
    /* an activation's bytes stay in the arena; poison them so a late reader sees NaN (the
     * pattern is NaN in every dtype; a 2-byte element's last word may reach into the block's
     * rounding, which is its own) */
    if (!x->dry && (p->ctx->cfg.flags & CW_FLAG_POISON))
        st = x->be->rt->fill32_async(x->be, x->streams[ac->stream], p->ptrs[ac->id], CW_POISON_NAN_BITS,
                                     (p->bufs[ac->id].bytes + 3) / 4);
    else if (!x->dry && x->be->rt->discard) /* its pages back: the next buffer there faults in only what it writes */
        st = x->be->rt->discard(x->be, x->streams[ac->stream], p->ptrs[ac->id], p->bufs[ac->id].bytes, 1, 0);
    if (st == CW_OK && ac->event >= 0) st = x->be->rt->event_record(x->be, x->ev[ac->event], x->streams[ac->stream]);
    return st;
}

/* A donated input's memory back to the backend after its last reader (joined as a free),
 * unless this run binds it as a strided view or overlapping another input or an output. */
static cw_status cw__exec_discard(cw__exec *x, const cw__action *ac) {
    cw_plan *p = x->p;
    const int b = ac->id;
    if (x->dry || !x->be->rt->discard || !cw__desc_is_contiguous(&p->rdesc[b])) return CW_OK;
    for (int o = 0; o < p->n_bufs; o++)
        if (o != b && (p->bufs[o].kind == CW__B_INPUT || p->bufs[o].kind == CW__B_OUTPUT) &&
            cw__views_overlap(&p->rdesc[b], p->ptrs[b], &p->rdesc[o], p->ptrs[o]))
            return CW_OK;
    CW_TRY(cw__exec_joins(x, ac));
    return x->be->rt->discard(x->be, x->streams[ac->stream], p->ptrs[b], cw__desc_bytes(&p->rdesc[b]), 1, 0);
}

/* Rows [0, r1) of an activation, dead (drops.c): their whole pages in every channel plane
 * go back (from row 0: the pages that straddled r0 went not with the last drop); poisoned
 * instead under CW_FLAG_POISON, rows [r0, r1), so that a late reader would see NaN. */
static cw_status cw__exec_drop(cw__exec *x, const cw__action *ac) {
    cw_plan *p = x->p;
    if (x->dry) return CW_OK;
    cw__stream *s = x->streams[ac->stream];
    CW_TRY(cw__exec_joins(x, ac));
    const cw_tensor_desc *d = &p->rdesc[ac->id]; /* compact: an activation */
    const cw__drop *dr = &p->drops[ac->drop];
    const int64_t es = (int64_t)cw_dtype_size(d->dtype), row = d->strides[dr->ax] * es;
    const int64_t plane = d->dims[dr->ax] * row, n = cw__desc_bytes(d) / plane;
    char *base = p->ptrs[ac->id];
    if (!(p->ctx->cfg.flags & CW_FLAG_POISON))
        return x->be->rt->discard(x->be, s, base, dr->r1 * row, n, plane);
    cw_status st = CW_OK;
    for (int64_t i = 0; i < n && st == CW_OK; i++)
        st = x->be->rt->fill32_async(x->be, s, base + i * plane + dr->r0 * row, CW_POISON_NAN_BITS,
                                     (dr->r1 - dr->r0) * row / 4);
    return st;
}

static cw_status cw__exec_task(cw__exec *x, int ti) {
    cw_plan *p = x->p;
    cw__backend *be = x->be;
    const cw__task *t = &p->tasks[ti];
    cw__stream *s = x->streams[t->stream];
    cw_status st = CW_OK;
    for (int w = 0; w < t->n_waits && st == CW_OK; w++)
        st = be->rt->stream_wait_event(be, s, x->ev[p->tasks[t->waits[w]].event]);
    for (int w = 0; w < t->n_alloc_waits && st == CW_OK; w++) st = be->rt->stream_wait_event(be, s, x->ev[t->alloc_waits[w]]);
    CW_TRY(st);
    if (x->timing) st = be->rt->launch_host(be, s, cw__host_begin, &x->ha[ti]);
    if (st == CW_OK && x->timer) st = be->rt->timer_mark(be, x->timer, 1 + 2 * ti, s);
    int nvtx_host = x->nvtx && !x->nvtx_worker;
    if (nvtx_host) cw__nvtx_push(cw__task_name(p, t), t->stage + 1, t->stream);
    if (st == CW_OK && !x->dry) st = cw__enqueue(p, be, s, t);
    if (nvtx_host) cw__nvtx_pop();
    if (st == CW_OK && x->timing) st = be->rt->launch_host(be, s, cw__host_end, &x->ha[ti]);
    if (st == CW_OK && x->timer) st = be->rt->timer_mark(be, x->timer, 2 + 2 * ti, s);
    if (st == CW_OK && !x->dry && p->progress_fn) st = be->rt->launch_host(be, s, cw__host_progress, p);
    if (st == CW_OK && t->event >= 0) st = be->rt->event_record(be, x->ev[t->event], s);
    return st;
}

/* One wait at the end (also on failure: nothing may still run on freed memory), then the
 * buffers a failed run left allocated go back in host order (the streams are idle). */
static cw_status cw__exec_drain(cw__exec *x, cw_status st) {
    for (int s = 0; s < x->p->n_streams; s++)
        if (x->streams[s]) {
            cw_status s2 = x->be->rt->stream_synchronize(x->be, x->streams[s]);
            if (st == CW_OK) st = s2;
        }
    for (int b = 0; x->live && b < x->p->n_bufs; b++)
        if (x->live[b]) cw__alloc_free(x->temp, x->p->ptrs[b], NULL);
    return st;
}

/* The run forks from stream 0 (the caller's stream where it set one: cuda interop): every
 * other stream first waits for what was queued there before the run, such as the caller
 * still writing an input. */
static cw_status cw__exec_fork(cw__exec *x) {
    cw_plan *p = x->p;
    const cw__runtime_i *i = x->be->rt;
    if (p->n_streams < 2) return CW_OK;
    cw__event *e = x->ev[p->fork_event];
    cw_status st = i->event_record(x->be, e, x->streams[0]);
    for (int s = 1; s < p->n_streams && st == CW_OK; s++) st = i->stream_wait_event(x->be, x->streams[s], e);
    return st;
}

/* ... and joins back into it: work the caller queues on stream 0 after the run comes after
 * all of the run, on every stream. */
static cw_status cw__exec_join(cw__exec *x) {
    cw_plan *p = x->p;
    const cw__runtime_i *i = x->be->rt;
    cw_status st = CW_OK;
    for (int s = 1; s < p->n_streams && st == CW_OK; s++) {
        cw__event *e = x->ev[p->fork_event + s];
        st = i->event_record(x->be, e, x->streams[s]);
        if (st == CW_OK) st = i->stream_wait_event(x->be, x->streams[0], e);
    }
    return st;
}

cw_status cw__plan_execute(cw_plan *p, cw__backend *be, cw__allocator *temp, int dry,
                           int64_t *peak_temp, int64_t *peak_allocated) {
    cw__exec x;
    memset(&x, 0, sizeof x);
    x.p = p, x.be = be, x.temp = temp, x.dry = dry;
    cw_status st = dry ? cw__exec_open_dry(&x) : cw__exec_open_run(&x);
    if (st == CW_OK) st = cw__exec_prime(&x);
    if (st == CW_OK) st = cw__exec_fork(&x);
    if (st == CW_OK && x.timer) st = be->rt->timer_mark(be, x.timer, 0, x.streams[0]);
    x.live = cw__calloc((size_t)p->n_bufs + 1, 1);
    if (!x.live && st == CW_OK) st = CW_ERR_OUT_OF_MEMORY;
    for (int a = 0; a < p->n_acts && st == CW_OK; a++) {
        const cw__action *ac = &p->acts[a];
        if (ac->kind == CW__A_ALLOC) st = cw__exec_alloc(&x, ac);
        else if (ac->kind == CW__A_FREE) st = cw__exec_free(&x, ac);
        else if (ac->kind == CW__A_DISCARD) st = cw__exec_discard(&x, ac);
        else if (ac->kind == CW__A_DROP) st = cw__exec_drop(&x, ac);
        else st = cw__exec_task(&x, ac->id);
    }
    if (st == CW_OK) st = cw__exec_join(&x);
    st = cw__exec_drain(&x, st);
    cw__free(x.live);
    if (dry) cw__exec_close_dry(&x);
    cw__free(x.ha);
    cw_memory_stats ms;
    cw__alloc_stats(temp, &ms);
    if (peak_temp) *peak_temp = ms.reserved_bytes_peak;
    if (peak_allocated) *peak_allocated = ms.allocated_bytes_peak;
    if (!dry) p->stats.total_peak = x.peak_total;
    return st;
}

/* ---- cw_plan_run ------------------------------------------------------------------------ */

static int cw__dims_equal(const cw_tensor_desc *a, const cw_tensor_desc *b) {
    if (a->rank != b->rank || a->dtype != b->dtype) return 0;
    for (int i = 0; i < a->rank; i++)
        if (a->dims[i] != b->dims[i]) return 0;
    return 1;
}

/* Whether a and b are one view: same data, dims and strides. */
static int cw__same_view(const cw_tensor *a, const cw_tensor *b) {
    if (a->data != b->data || !cw__dims_equal(&a->desc, &b->desc)) return 0;
    for (int d = 0; d < a->desc.rank; d++)
        if (a->desc.strides[d] != b->desc.strides[d]) return 0;
    return 1;
}

/* The tensors given to cw_plan_run: counts, shapes, no output overlapping another tensor
 * (but the input donated to it, as the same view). */
static cw_status cw__check_bindings(cw_plan *p, cw_tensor *const *inputs, int n_inputs, cw_tensor *const *outputs,
                                    int n_outputs) {
    cw_context *ctx = p->ctx;
    char b1[96], b2[96];
    if (n_inputs != p->n_inputs || n_outputs != p->n_outputs || (n_inputs && !inputs) || (n_outputs && !outputs))
        return cw__error(ctx, CW_ERR_INVALID_ARG, "cw_plan_run: %d inputs and %d outputs given, the plan has %d and %d",
                         n_inputs, n_outputs, p->n_inputs, p->n_outputs);
    for (int i = 0; i < n_inputs; i++)
        if (!inputs[i] || !cw__dims_equal(&inputs[i]->desc, &p->in[i].d))
            return cw__error(ctx, CW_ERR_INVALID_ARG, "cw_plan_run: inputs[%d] ('%s') is %s %s, the plan expects %s %s", i,
                             p->in[i].name, inputs[i] ? cw__dtype_name(inputs[i]->desc.dtype) : "",
                             inputs[i] ? cw__dims_str(&inputs[i]->desc, b1, sizeof b1) : "NULL",
                             cw__dtype_name(p->in[i].d.dtype), cw__dims_str(&p->in[i].d, b2, sizeof b2));
    for (int i = 0; i < n_outputs; i++) {
        if (!outputs[i] || !cw__dims_equal(&outputs[i]->desc, &p->out[i].d))
            return cw__error(ctx, CW_ERR_INVALID_ARG, "cw_plan_run: outputs[%d] ('%s') is %s %s, the plan expects %s %s",
                             i, p->out[i].name, outputs[i] ? cw__dtype_name(outputs[i]->desc.dtype) : "",
                             outputs[i] ? cw__dims_str(&outputs[i]->desc, b1, sizeof b1) : "NULL",
                             cw__dtype_name(p->out[i].d.dtype), cw__dims_str(&p->out[i].d, b2, sizeof b2));
        for (int j = 0; j < n_inputs; j++) {
            if (!cw__views_overlap(&outputs[i]->desc, outputs[i]->data, &inputs[j]->desc, inputs[j]->data)) continue;
            if (p->out[i].donor == j && cw__same_view(outputs[i], inputs[j])) continue; /* donated (cw_graph_donate) */
            const char *why = p->out[i].donor == j ? " (donated to it, but not the same view: same data, dims and "
                                                     "strides)" : "";
            return cw__error(ctx, CW_ERR_INVALID_ARG, "cw_plan_run: outputs[%d] overlaps inputs[%d]%s", i, j, why);
        }
        for (int j = 0; j < i; j++)
            if (cw__views_overlap(&outputs[i]->desc, outputs[i]->data, &outputs[j]->desc, outputs[j]->data))
                return cw__error(ctx, CW_ERR_INVALID_ARG, "cw_plan_run: outputs[%d] overlaps outputs[%d]", i, j);
    }
    return CW_OK;
}

/* The external tensor bound to buffer bf (NULL for the plan's own buffers). */
static const cw_tensor *cw__bound(const cw__buf *bf, cw_tensor *const *inputs, cw_tensor *const *outputs) {
    return bf->kind == CW__B_INPUT ? inputs[bf->ext] : bf->kind == CW__B_OUTPUT ? outputs[bf->ext] : NULL;
}

/* Attention's GEMMs take contiguous [C, T] operands: checked before anything is queued. */
static cw_status cw__check_attention_operands(cw_plan *p, cw_tensor *const *inputs, cw_tensor *const *outputs) {
    for (int k = 0; k < p->n_tasks; k++) {
        const cw__task *t = &p->tasks[k];
        if (t->kind != CW__T_ATTN) continue;
        const int bs[4] = {t->u.attn.q.buf, t->u.attn.k.buf, t->u.attn.v.buf, t->u.attn.o.buf};
        for (int a = 0; a < 4; a++) {
            const cw__buf *bf = &p->bufs[bs[a]];
            const cw_tensor *u = cw__bound(bf, inputs, outputs);
            if (u && !cw__desc_is_contiguous(&u->desc))
                return cw__error(p->ctx, CW_ERR_UNSUPPORTED, "cw_plan_run: %s[%d] feeds or receives an attention and must be "
                                 "contiguous", bf->kind == CW__B_INPUT ? "inputs" : "outputs", bf->ext);
        }
    }
    return CW_OK;
}

/* Per-stage and per-stream busy time from the task times (CW_FLAG_TIMING). */
static void cw__stage_times(cw_plan *p) {
    memset(p->stats.stage_ms, 0, sizeof p->stats.stage_ms);
    memset(p->stats.stream_busy_ms, 0, sizeof p->stats.stream_busy_ms);
    for (int k = 0; k < p->n_tasks; k++) {
        if (!p->t0[k] || !p->t1[k]) continue;
        double ms = (double)(p->t1[k] - p->t0[k]) * 1e-6;
        p->stats.stage_ms[p->tasks[k].stage] += ms;
        if (p->tasks[k].stream < CW_MAX_STREAMS) p->stats.stream_busy_ms[p->tasks[k].stream] += ms;
    }
}

/* Task times from the device timestamps, after the run's final wait: offsets from mark 0
 * (the fork) placed at the run's host start time. */
static cw_status cw__read_timer(cw_plan *p) {
    int64_t *ns = cw__malloc((size_t)(2 * p->n_tasks + 1) * sizeof *ns);
    if (!ns) return cw__error(p->ctx, CW_ERR_OUT_OF_MEMORY, "cw_plan_run: out of host memory for task times");
    cw_status st = p->ctx->be->rt->timer_read(p->ctx->be, p->timer, ns);
    for (int k = 0; k < p->n_tasks && st == CW_OK; k++)
        if (ns[1 + 2 * k] >= 0 && ns[2 + 2 * k] >= 0) {
            p->t0[k] = p->run_t0 + ns[1 + 2 * k];
            p->t1[k] = p->run_t0 + ns[2 + 2 * k] + 1; /* t0 and t1 nonzero: recorded */
        }
    cw__free(ns);
    return st;
}

cw_status cw_plan_run(cw_plan *p, cw_tensor *const *inputs, int n_inputs, cw_tensor *const *outputs, int n_outputs) {
    if (!p) return CW_ERR_INVALID_ARG;
    cw_context *ctx = p->ctx;
    cw_status st = cw__check_bindings(p, inputs, n_inputs, outputs, n_outputs);
    if (st == CW_OK) st = cw__check_attention_operands(p, inputs, outputs);
    if (st == CW_OK) st = cw__plan_acquire(p); /* after cw_plan_release */
    if (st == CW_OK && p->opt.comm && !p->comm_args) {
        p->comm_args = cw__calloc((size_t)p->n_tasks + 1, sizeof *p->comm_args);
        if (!p->comm_args) st = cw__error(ctx, CW_ERR_OUT_OF_MEMORY, "cw_plan_run: out of host memory");
    }
    CW_TRY(st);
    atomic_store(&p->comm_status, CW_OK);
    for (int b = 0; b < p->n_bufs; b++) {
        const cw_tensor *t = cw__bound(&p->bufs[b], inputs, outputs);
        if (t) {
            p->ptrs[b] = t->data;
            p->rdesc[b] = t->desc;
        }
    }
    cw__alloc_reset_peaks(p->temp);
    int64_t syncs0 = ctx->be->rt->host_syncs(ctx->be);
    int64_t t0 = cw__now_ns();
    p->run_t0 = t0;
    for (int k = 0; k < p->n_tasks; k++) p->t0[k] = p->t1[k] = 0;
    atomic_store(&p->progress_done, 0);
    if (ctx->cfg.flags & CW_FLAG_NVTX) cw__nvtx_push("cw_plan_run", 0, 0);
    int64_t peak = 0;
    st = cw__plan_execute(p, ctx->be, p->temp, 0, &peak, NULL);
    int cs = atomic_load(&p->comm_status);
    if (cs != CW_OK) st = cw__error(ctx, (cw_status)cs, "cw_plan_run: %s", p->comm_msg);
    if (ctx->cfg.flags & CW_FLAG_NVTX) cw__nvtx_pop();
    int64_t t1 = cw__now_ns();
    p->stats.host_syncs = ctx->be->rt->host_syncs(ctx->be) - syncs0 - p->n_streams;
    if (st == CW_OK && p->timer) st = cw__read_timer(p);
    /* The temporaries' arena stays for the next run (no device allocation or free inside
     * a run); the final wait completed every free, so the pool is again the one free arena
     * the dry run simulated from. */
    cw__alloc_forget_frees(p->temp);
    p->stats.wall_ms = (double)(t1 - t0) * 1e-6;
    p->stats.temp_peak = peak;
    cw__stage_times(p);
    p->ran = st == CW_OK;
    return st;
}
