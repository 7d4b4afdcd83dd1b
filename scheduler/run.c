/* Running a plan: the host replays the action list — allocate from the budgeted
 * allocator, make the task's stream wait on the events of its cross-stream
 * dependencies, enqueue the operation, record its event, free in stream order — and
 * synchronises once at the end. The same replay against the dry backend is the
 * compile-time budget check. Also: compile entry points, stats, describe, trace. */
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "prof/nvtx.h"
#include "scheduler/patch.h"
#include "scheduler/sched.h"

void cw__plan_free(cw_plan *p) {
    if (!p) return;
    if (p->events) {
        for (int i = 0; i < p->n_events; i++)
            if (p->events[i]) p->ctx->be->i->event_destroy(p->ctx->be, p->events[i]);
    }
    if (p->own_temp) cw__alloc_destroy(p->temp);
    for (int i = 0; i < p->n_tasks; i++)
        cw__free(p->tasks[i].deps), cw__free(p->tasks[i].waits), cw__free(p->tasks[i].alloc_waits);
    for (int i = 0; i < p->n_acts; i++) cw__free(p->acts[i].joins);
    for (int i = 0; i < p->n_convs; i++) cw__free(p->convs[i].tasks);
    cw__free(p->tasks), cw__free(p->acts), cw__free(p->bufs), cw__free(p->convs);
    cw__free(p->in), cw__free(p->out), cw__free(p->events), cw__free(p->ptrs), cw__free(p->rdesc);
    cw__free(p->t0), cw__free(p->t1);
    cw__free(p);
}

void cw_plan_destroy(cw_plan *p) { cw__plan_free(p); }

/* ---- views ------------------------------------------------------------------------------- */
static cw__view cw__resolve(const cw_plan *p, const cw__vref *r) {
    cw__view v;
    memset(&v, 0, sizeof v);
    const cw_tensor_desc *bd = &p->rdesc[r->buf];
    v.d.dtype = CW_F32;
    v.d.rank = r->rank;
    int64_t off = 0;
    for (int i = 0; i < r->rank; i++) {
        v.d.dims[i] = r->dims[i];
        v.d.strides[i] = bd->strides[i];
        off += r->start[i] * bd->strides[i];
    }
    v.data = (char *)p->ptrs[r->buf] + off * 4;
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
    if (h->nvtx) cw__nvtx_push(t->name, t->stage + 1, t->stream);
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
    if (fn && !p->ctx->be->i->launch_host)
        return cw__error(p->ctx, CW_ERR_UNSUPPORTED, "cw_plan_set_progress: the %s backend has no host callbacks",
                         p->ctx->be->i->name);
    p->progress_fn = fn;
    p->progress_user = user;
    return CW_OK;
}

static cw_status cw__enqueue(cw_plan *p, cw__backend *be, cw__stream *s, const cw__task *t) {
    const cw__backend_i *i = be->i;
    switch (t->kind) {
    case CW__T_CONV: {
        cw__conv_problem pr = t->u.conv.prob;
        cw__view x = cw__resolve(p, &t->u.conv.x), w = cw__resolve(p, &t->u.conv.w), y = cw__resolve(p, &t->u.conv.y);
        pr.x = x.d, pr.w = w.d, pr.y = y.d;
        const void *b = t->u.conv.has_b ? p->ptrs[t->u.conv.b.buf] : NULL;
        void *ws = t->u.conv.ws_buf >= 0 ? p->ptrs[t->u.conv.ws_buf] : NULL;
        cw__conv_algo algo = t->u.conv.algo;
        algo.threads = t->threads;
        return i->conv_forward(be, s, &pr, &algo, x.data, w.data, b, y.data, ws, algo.workspace);
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
        pp.up = t->u.prep.up;
        pp.dst_row0 = t->u.prep.dst_row0;
        pp.src_row0 = t->u.prep.src_row0;
        return i->prep(be, s, &pp);
    }
    case CW__T_ADD: {
        cw__view d = cw__resolve(p, &t->u.add.dst), a = cw__resolve(p, &t->u.add.a), b = cw__resolve(p, &t->u.add.b);
        return i->add(be, s, &d, &a, &b);
    }
    case CW__T_STATS: {
        cw__view x = cw__resolve(p, &t->u.stats.x);
        int64_t per = x.d.dims[0] * t->u.stats.groups * 3;
        double *parts = (double *)p->ptrs[t->u.stats.part_buf] + t->u.stats.part_index * per;
        return i->gn_stats(be, s, &x, t->u.stats.groups, parts);
    }
    case CW__T_FINALIZE: {
        float *ss = p->ptrs[t->u.fin.ss_buf];
        cw__view gm = cw__resolve(p, &t->u.fin.gamma), bt = cw__resolve(p, &t->u.fin.beta);
        return i->gn_finalize(be, s, p->ptrs[t->u.fin.part_buf], t->u.fin.n_parts, t->u.fin.n, t->u.fin.c,
                              t->u.fin.groups, gm.data, bt.data, t->u.fin.eps, ss, ss + t->u.fin.n * t->u.fin.c);
    }
    case CW__T_ATTN: {
        const int64_t T = t->u.attn.T, C = t->u.attn.C, t0 = t->u.attn.t0, tc = t->u.attn.t1 - t->u.attn.t0;
        cw__view q = cw__resolve(p, &t->u.attn.q), k = cw__resolve(p, &t->u.attn.k);
        cw__view v = cw__resolve(p, &t->u.attn.v), o = cw__resolve(p, &t->u.attn.o);
        const cw__view *all[4] = {&q, &k, &v, &o};
        for (int a = 0; a < 4; a++)
            if (!cw__desc_is_contiguous(&all[a]->d))
                return cw__error(p->ctx, CW_ERR_UNSUPPORTED, "attention: operands must be contiguous tensors");
        int64_t off = t->u.attn.n * C * T;
        float *qp = (float *)q.data + off, *kp = (float *)k.data + off, *vp = (float *)v.data + off;
        float *op = (float *)o.data + off, *sp = p->ptrs[t->u.attn.s_buf];
        cw__gemm_params g1 = {1, 0, tc, T, C, t->u.attn.scale, 0.0f, qp + t0, T, kp, T, sp, T, t->threads};
        cw__gemm_params g2 = {0, 1, C, tc, T, 1.0f, 0.0f, vp, T, sp, T, op + t0, T, t->threads};
        cw_status st = i->gemm(be, s, &g1);
        if (st == CW_OK) st = i->softmax_rows(be, s, sp, tc, T, T);
        if (st == CW_OK) st = i->gemm(be, s, &g2);
        return st;
    }
    }
    return CW_ERR_INTERNAL;
}

cw_status cw__plan_execute(cw_plan *p, cw__backend *be, cw__allocator *temp, cw__allocator *act, int dry,
                           int64_t *peak_temp, int64_t *peak_allocated) {
    cw_context *ctx = p->ctx;
    cw__stream *streams[CW__MAX_STREAMS] = {0};
    cw__event **ev = NULL;
    cw__hostarg *ha = NULL;
    cw_status st = CW_OK;
    /* NVTX: the cpu backend's streams are threads, so a task's range is pushed on its
     * worker around the work; on a GPU backend the range wraps the enqueue on the host
     * (as Nsight Systems expects, correlated with the kernels it launches). */
    int nvtx = !dry && (ctx->cfg.flags & CW_FLAG_NVTX);
    int nvtx_worker = nvtx && be->i->launch_host && strcmp(be->i->name, "cpu") == 0;
    int timing = !dry && ((ctx->cfg.flags & CW_FLAG_TIMING) || nvtx_worker) && be->i->launch_host;
    if (dry) {
        for (int s = 0; s < p->n_streams && st == CW_OK; s++) st = be->i->stream_create(be, &streams[s]);
        ev = cw__calloc((size_t)p->n_events + 1, sizeof *ev);
        if (!ev) st = CW_ERR_OUT_OF_MEMORY;
        for (int e = 0; e < p->n_events && st == CW_OK; e++) st = be->i->event_create(be, &ev[e]);
    } else {
        for (int s = 0; s < p->n_streams && st == CW_OK; s++) st = cw__context_stream(ctx, s, &streams[s]);
        ev = p->events;
        if (timing) {
            ha = cw__malloc((size_t)p->n_tasks * sizeof *ha + 1);
            if (!ha) st = CW_ERR_OUT_OF_MEMORY;
            for (int k = 0; k < p->n_tasks && st == CW_OK; k++) ha[k] = (cw__hostarg){p, k, nvtx_worker};
        }
    }
    int64_t peak_total = 0;
    cw_memory_stats ms;
    /* Prime a capped pool with one segment of the whole budget: every temporary is then
     * carved from it (with event waits across streams), so the allocator never has to
     * give segments back to make room — which would synchronise the host mid-run. */
    cw__alloc_stats(temp, &ms);
    if (st == CW_OK && p->arena > 0 && ms.reserved_bytes_current == 0) {
        void *arena = NULL;
        st = cw__alloc_malloc(temp, p->arena, NULL, &arena);
        if (st == CW_OK) st = cw__alloc_free(temp, arena, NULL);
        cw__alloc_reset_peaks(temp); /* the priming block is not a use */
    }
    /* buffers allocated and not yet freed, so a failed run gives them back */
    char *live = cw__calloc((size_t)p->n_bufs + 1, 1);
    if (!live && st == CW_OK) st = CW_ERR_OUT_OF_MEMORY;
    for (int a = 0; a < p->n_acts && st == CW_OK; a++) {
        const cw__action *ac = &p->acts[a];
        if (ac->kind == CW__A_ALLOC) {
            const cw__buf *b = &p->bufs[ac->id];
            cw__allocator *al = b->kind == CW__B_TEMP ? temp : act;
            st = cw__alloc_malloc(al, b->bytes, streams[ac->stream], &p->ptrs[ac->id]);
            if (st != CW_OK) break;
            live[ac->id] = 1;
            if (ac->event >= 0 && (st = be->i->event_record(be, ev[ac->event], streams[ac->stream])) != CW_OK) break;
            cw_tensor_desc *d = &p->rdesc[ac->id];
            *d = b->d;
            memset(d->strides, 0, sizeof d->strides);
            cw__desc_fill_strides(d);
            if (!dry) {
                int64_t tot = p->weights_bytes;
                cw__alloc_stats(temp, &ms);
                tot += ms.reserved_bytes_current;
                cw__alloc_stats(act, &ms);
                tot += ms.reserved_bytes_current;
                if (tot > peak_total) peak_total = tot;
            }
        } else if (ac->kind == CW__A_FREE) {
            for (int j = 0; j < ac->n_joins && st == CW_OK; j++)
                st = be->i->stream_wait_event(be, streams[ac->stream], ev[p->tasks[ac->joins[j]].event]);
            if (st == CW_OK) {
                cw__allocator *al = p->bufs[ac->id].kind == CW__B_TEMP ? temp : act;
                st = cw__alloc_free(al, p->ptrs[ac->id], streams[ac->stream]);
                live[ac->id] = 0;
            }
        } else {
            const cw__task *t = &p->tasks[ac->id];
            cw__stream *s = streams[t->stream];
            for (int w = 0; w < t->n_waits && st == CW_OK; w++)
                st = be->i->stream_wait_event(be, s, ev[p->tasks[t->waits[w]].event]);
            for (int w = 0; w < t->n_alloc_waits && st == CW_OK; w++)
                st = be->i->stream_wait_event(be, s, ev[t->alloc_waits[w]]);
            if (st != CW_OK) break;
            if (timing) st = be->i->launch_host(be, s, cw__host_begin, &ha[ac->id]);
            if (nvtx && !nvtx_worker) cw__nvtx_push(t->name, t->stage + 1, t->stream);
            if (st == CW_OK && !dry) st = cw__enqueue(p, be, s, t);
            if (nvtx && !nvtx_worker) cw__nvtx_pop();
            if (st == CW_OK && timing) st = be->i->launch_host(be, s, cw__host_end, &ha[ac->id]);
            if (st == CW_OK && !dry && p->progress_fn) st = be->i->launch_host(be, s, cw__host_progress, p);
            if (st == CW_OK && t->event >= 0) st = be->i->event_record(be, ev[t->event], s);
        }
    }
    /* one wait at the end (also on failure: nothing may still run on freed memory) */
    for (int s = 0; s < p->n_streams; s++)
        if (streams[s]) {
            cw_status s2 = be->i->stream_synchronize(be, streams[s]);
            if (st == CW_OK) st = s2;
        }
    for (int b = 0; live && b < p->n_bufs; b++) /* streams are idle: free in host order */
        if (live[b]) cw__alloc_free(p->bufs[b].kind == CW__B_TEMP ? temp : act, p->ptrs[b], NULL);
    cw__free(live);
    if (dry) {
        for (int e = 0; ev && e < p->n_events; e++)
            if (ev[e]) be->i->event_destroy(be, ev[e]);
        cw__free(ev);
        for (int s = 0; s < p->n_streams; s++)
            if (streams[s]) be->i->stream_destroy(be, streams[s]);
    }
    cw__free(ha);
    cw__alloc_stats(temp, &ms);
    if (peak_temp) *peak_temp = ms.reserved_bytes_peak;
    if (peak_allocated) *peak_allocated = ms.allocated_bytes_peak;
    if (!dry) p->stats.total_peak = peak_total;
    return st;
}

/* Dry-runs the plan's allocation sequence under its budget. A plan whose allocations
 * would need a host synchronisation mid-run (the allocator releasing cached segments to
 * make room) does not fit either: CW_ERR_BUDGET. */
static cw_status cw__plan_simulate(cw_plan *p, int64_t *peak, int64_t *peak_allocated) {
    cw__backend *dry = NULL;
    cw__allocator *temp = NULL, *act = NULL;
    cw_status st = cw__backend_dry_create(p->ctx->be, &dry);
    if (st == CW_OK) st = cw__alloc_create(&temp, p->ctx, dry, p->budget, CW__ALLOC_DETERMINISTIC | CW__ALLOC_PREFER_REUSE);
    if (st == CW_OK) st = cw__alloc_create(&act, p->ctx, dry, 0, CW__ALLOC_DETERMINISTIC | CW__ALLOC_PREFER_REUSE);
    if (st == CW_OK) st = cw__plan_execute(p, dry, temp, act, 1, peak, peak_allocated);
    if (st == CW_OK && dry->i->host_syncs(dry) > p->n_streams)
        st = cw__error(p->ctx, CW_ERR_BUDGET, "compile: the plan would need a host synchronisation mid-run");
    cw__alloc_destroy(temp);
    cw__alloc_destroy(act);
    if (dry) dry->i->destroy(dry);
    return st;
}

static int64_t cw__opt_budget(const cw_context *ctx, const cw_compile_options *o) {
    if (o->policy == CW_PATCHES_NONE) return -1;
    int64_t b = o->temp_budget ? o->temp_budget : ctx->cfg.temp_budget;
    return b > 0 ? b : -1;
}

/* Builds under `budget`, shrinking the sizing budget until the dry run fits. fit_arena: also
 * size the run's arena (feasibility searches skip it: only the yes/no matters there). */
static cw_status cw__compile_at(cw_graph *g, const cw_compile_options *o, int64_t budget, int fit_arena, cw_plan **out) {
    int64_t sizing = budget;
    cw_status st = CW_OK;
    for (int attempt = 0; attempt < 16; attempt++) {
        cw_plan *p = NULL;
        st = cw__plan_build(g, o, sizing, &p);
        if (st != CW_OK) return st;
        p->budget = budget;
        p->ptrs = cw__calloc((size_t)p->n_bufs + 1, sizeof *p->ptrs);
        p->rdesc = cw__calloc((size_t)p->n_bufs + 1, sizeof *p->rdesc);
        if (!p->ptrs || !p->rdesc) {
            cw__plan_free(p);
            return cw__error(g->ctx, CW_ERR_OUT_OF_MEMORY, "compile: out of host memory");
        }
        for (int b = 0; b < p->n_bufs; b++) {
            const cw_tensor *t = p->bufs[b].t;
            p->rdesc[b] = t ? t->desc : p->bufs[b].d;
            p->ptrs[b] = t ? t->data : (void *)(uintptr_t)4096; /* externals: bound at run */
        }
        int64_t peak = 0, used = 0;
        p->arena = budget > 0 ? budget / 512 * 512 : 0;
        st = cw__plan_simulate(p, &peak, &used);
        /* The arena need not be the whole budget: shrink it towards the bytes the plan
         * actually has in use at once, as long as the dry run still fits (fragmentation
         * inside the arena can need a little more than that). */
        for (int64_t a = (used + 511) / 512 * 512; fit_arena && st == CW_OK && p->arena > 0 && a < p->arena;
             a += a / 8 + 512) {
            int64_t keep = p->arena, pk = 0;
            p->arena = a;
            if (cw__plan_simulate(p, &pk, NULL) == CW_OK) {
                peak = pk;
                break;
            }
            p->arena = keep;
        }
        if (st == CW_OK) {
            p->temp_predicted = peak;
            *out = p;
            return CW_OK;
        }
        cw__plan_free(p);
        if (st != CW_ERR_BUDGET || budget < 0) return st;
        sizing = sizing - sizing / 6 - 1;
        if (sizing <= 0) break;
    }
    return CW_ERR_BUDGET;
}

static cw_status cw__opt_check(cw_context *ctx, const cw_compile_options *o) {
    if (o->size != sizeof(cw_compile_options) || o->version != CW_COMPILE_OPTIONS_VERSION)
        return cw__error(ctx, CW_ERR_INVALID_ARG, "cw_compile_options: size %zu / version %d, expected %zu / %d",
                         o->size, o->version, sizeof(cw_compile_options), CW_COMPILE_OPTIONS_VERSION);
    if (o->streams < 0 || o->streams > CW__MAX_STREAMS)
        return cw__error(ctx, CW_ERR_INVALID_ARG, "cw_compile_options.streams = %d, must be 0..%d", o->streams,
                         CW__MAX_STREAMS);
    if (o->policy != CW_PATCHES_AUTO && o->policy != CW_PATCHES_FIXED && o->policy != CW_PATCHES_NONE)
        return cw__error(ctx, CW_ERR_INVALID_ARG, "cw_compile_options.policy = %d is not a cw_patch_policy", (int)o->policy);
    if (o->policy == CW_PATCHES_FIXED && o->patches < 1)
        return cw__error(ctx, CW_ERR_INVALID_ARG, "cw_compile_options.patches = %d, must be >= 1 for CW_PATCHES_FIXED",
                         o->patches);
    if (o->max_patch_rows < 0)
        return cw__error(ctx, CW_ERR_INVALID_ARG, "cw_compile_options.max_patch_rows = %" PRId64 " < 0", o->max_patch_rows);
    return CW_OK;
}

cw_status cw_graph_min_budget(cw_graph *g, const cw_compile_options *opt, int64_t *out_bytes) {
    static const cw_compile_options dflt = CW_COMPILE_OPTIONS_INIT;
    if (!g || !out_bytes) return CW_ERR_INVALID_ARG;
    if (!opt) opt = &dflt;
    cw_status st = cw__opt_check(g->ctx, opt);
    if (st != CW_OK) return st;
    if (g->n_outputs == 0) return cw__error(g->ctx, CW_ERR_INVALID_ARG, "cw_graph_min_budget: the graph has no outputs");
    /* upper bound: the peak of the plan with an unlimited budget */
    cw_plan *p = NULL;
    if ((st = cw__compile_at(g, opt, -1, 0, &p)) != CW_OK) return st;
    int64_t hi = p->temp_predicted, lo = 0;
    cw__plan_free(p);
    for (;;) { /* the unlimited plan's peak is not always feasible as a cap: grow to one that is */
        st = cw__compile_at(g, opt, hi, 0, &p);
        if (st == CW_OK) {
            cw__plan_free(p);
            break;
        }
        if (st != CW_ERR_BUDGET || hi > INT64_MAX / 4) return st;
        lo = hi;
        hi *= 2;
    }
    if (opt->policy == CW_PATCHES_NONE) {
        *out_bytes = hi;
        return CW_OK;
    }
    /* smallest budget that compiles: compile success is monotone enough in the budget
     * for a bisection to 1/256 of the range (then rounded up to 4 KiB). */
    int64_t step = hi / 256 > 4096 ? hi / 256 : 4096;
    while (hi - lo > step) {
        int64_t mid = lo + (hi - lo) / 2;
        st = cw__compile_at(g, opt, mid, 0, &p);
        if (st == CW_OK) {
            cw__plan_free(p);
            hi = mid;
        } else if (st == CW_ERR_BUDGET) {
            lo = mid;
        } else {
            return st;
        }
    }
    *out_bytes = (hi + 4095) / 4096 * 4096;
    g->ctx->err[0] = '\0';
    return CW_OK;
}

cw_status cw_graph_compile(cw_graph *g, cw_plan **out, const cw_compile_options *opt) {
    static const cw_compile_options dflt = CW_COMPILE_OPTIONS_INIT;
    if (!g || !out) return CW_ERR_INVALID_ARG;
    *out = NULL;
    if (!opt) opt = &dflt;
    cw_context *ctx = g->ctx;
    cw_status st = cw__opt_check(ctx, opt);
    if (st != CW_OK) return st;
    if (g->n_outputs == 0) return cw__error(ctx, CW_ERR_INVALID_ARG, "cw_graph_compile: the graph has no outputs");
    int64_t budget = cw__opt_budget(ctx, opt);
    cw_plan *p = NULL;
    st = cw__compile_at(g, opt, budget, 1, &p);
    if (st == CW_ERR_BUDGET) {
        int64_t need = -1;
        if (cw_graph_min_budget(g, opt, &need) != CW_OK) need = -1;
        return cw__error(ctx, CW_ERR_BUDGET,
                         "cw_graph_compile: budget %" PRId64 " bytes (%.1f MiB) is too small for this graph; the "
                         "smallest budget that works is %" PRId64 " bytes (%.1f MiB)",
                         budget, (double)budget / 1048576.0, need, (double)need / 1048576.0);
    }
    if (st != CW_OK) return st;
    uint32_t aflags = CW__ALLOC_DETERMINISTIC | CW__ALLOC_PREFER_REUSE |
                      ((ctx->cfg.flags & CW_FLAG_POISON) ? CW__ALLOC_POISON : 0);
    p->events = cw__calloc((size_t)p->n_events + 1, sizeof *p->events);
    p->t0 = cw__calloc((size_t)p->n_tasks + 1, sizeof *p->t0);
    p->t1 = cw__calloc((size_t)p->n_tasks + 1, sizeof *p->t1);
    if (!p->events || !p->t0 || !p->t1) st = cw__error(ctx, CW_ERR_OUT_OF_MEMORY, "compile: out of host memory");
    /* a plan under the context's budget shares the context's temporaries; others (the
     * unscheduled reference, explicit budgets) get their own capped allocator. */
    int64_t ctx_budget = ctx->cfg.temp_budget > 0 ? ctx->cfg.temp_budget : -1;
    if (st == CW_OK && budget == ctx_budget) p->temp = ctx->temp;
    else if (st == CW_OK && (st = cw__alloc_create(&p->temp, ctx, ctx->be, budget, aflags)) == CW_OK) p->own_temp = 1;
    for (int e = 0; e < p->n_events && st == CW_OK; e++) st = ctx->be->i->event_create(ctx->be, &p->events[e]);
    if (st != CW_OK) {
        cw__plan_free(p);
        return st;
    }
    p->stats.n_tasks = p->n_tasks;
    p->stats.n_events = p->n_events;
    p->stats.n_streams = p->n_streams;
    p->stats.temp_predicted = p->temp_predicted;
    p->stats.weights_bytes = p->weights_bytes;
    p->stats.conv_gflop = p->conv_gflop;
    p->stats.halo_overhead_pct = p->conv_gflop > 0 ? 100.0 * p->halo_flop * 1e-9 / p->conv_gflop : 0.0;
    for (int c = 0; c < p->n_convs; c++) p->stats.n_patches += p->convs[c].patches;
    *out = p;
    return CW_OK;
}

static int cw__dims_equal(const cw_tensor_desc *a, const cw_tensor_desc *b) {
    if (a->rank != b->rank || a->dtype != b->dtype) return 0;
    for (int i = 0; i < a->rank; i++)
        if (a->dims[i] != b->dims[i]) return 0;
    return 1;
}

cw_status cw_plan_run(cw_plan *p, cw_tensor *const *inputs, int n_inputs, cw_tensor *const *outputs, int n_outputs) {
    if (!p) return CW_ERR_INVALID_ARG;
    cw_context *ctx = p->ctx;
    char b1[96], b2[96];
    if (n_inputs != p->n_inputs || n_outputs != p->n_outputs || (n_inputs && !inputs) || (n_outputs && !outputs))
        return cw__error(ctx, CW_ERR_INVALID_ARG, "cw_plan_run: %d inputs and %d outputs given, the plan has %d and %d",
                         n_inputs, n_outputs, p->n_inputs, p->n_outputs);
    for (int i = 0; i < n_inputs; i++)
        if (!inputs[i] || !cw__dims_equal(&inputs[i]->desc, &p->in[i].d))
            return cw__error(ctx, CW_ERR_INVALID_ARG, "cw_plan_run: inputs[%d] ('%s') is %s, the plan expects f32 %s", i,
                             p->in[i].name, inputs[i] ? cw__dims_str(&inputs[i]->desc, b1, sizeof b1) : "NULL",
                             cw__dims_str(&p->in[i].d, b2, sizeof b2));
    for (int i = 0; i < n_outputs; i++) {
        if (!outputs[i] || !cw__dims_equal(&outputs[i]->desc, &p->out[i].d))
            return cw__error(ctx, CW_ERR_INVALID_ARG, "cw_plan_run: outputs[%d] ('%s') is %s, the plan expects f32 %s", i,
                             p->out[i].name, outputs[i] ? cw__dims_str(&outputs[i]->desc, b1, sizeof b1) : "NULL",
                             cw__dims_str(&p->out[i].d, b2, sizeof b2));
        for (int j = 0; j < n_inputs; j++)
            if (cw__views_overlap(&outputs[i]->desc, outputs[i]->data, &inputs[j]->desc, inputs[j]->data))
                return cw__error(ctx, CW_ERR_INVALID_ARG, "cw_plan_run: outputs[%d] overlaps inputs[%d]", i, j);
        for (int j = 0; j < i; j++)
            if (cw__views_overlap(&outputs[i]->desc, outputs[i]->data, &outputs[j]->desc, outputs[j]->data))
                return cw__error(ctx, CW_ERR_INVALID_ARG, "cw_plan_run: outputs[%d] overlaps outputs[%d]", i, j);
    }
    /* attention's GEMMs take contiguous [C, T] operands: check before anything is queued */
    for (int k = 0; k < p->n_tasks; k++) {
        const cw__task *t = &p->tasks[k];
        if (t->kind != CW__T_ATTN) continue;
        const int bs[4] = {t->u.attn.q.buf, t->u.attn.k.buf, t->u.attn.v.buf, t->u.attn.o.buf};
        for (int a = 0; a < 4; a++) {
            const cw__buf *bf = &p->bufs[bs[a]];
            const cw_tensor *u = bf->kind == CW__B_INPUT ? inputs[bf->ext] : bf->kind == CW__B_OUTPUT ? outputs[bf->ext] : NULL;
            if (u && !cw__desc_is_contiguous(&u->desc))
                return cw__error(ctx, CW_ERR_UNSUPPORTED, "cw_plan_run: %s[%d] feeds or receives an attention and must be "
                                 "contiguous", bf->kind == CW__B_INPUT ? "inputs" : "outputs", bf->ext);
        }
    }
    for (int b = 0; b < p->n_bufs; b++) {
        const cw__buf *bf = &p->bufs[b];
        const cw_tensor *t = bf->kind == CW__B_INPUT ? inputs[bf->ext] : bf->kind == CW__B_OUTPUT ? outputs[bf->ext] : NULL;
        if (t) {
            p->ptrs[b] = t->data;
            p->rdesc[b] = t->desc;
        }
    }
    cw_memory_stats before;
    cw__alloc_reset_peaks(p->temp);
    cw__alloc_reset_peaks(ctx->act);
    int64_t syncs0 = ctx->be->i->host_syncs(ctx->be);
    int64_t t0 = cw__now_ns();
    p->run_t0 = t0;
    for (int k = 0; k < p->n_tasks; k++) p->t0[k] = p->t1[k] = 0;
    atomic_store(&p->progress_done, 0);
    if (ctx->cfg.flags & CW_FLAG_NVTX) cw__nvtx_push("cw_plan_run", 0, 0);
    int64_t peak = 0;
    cw_status st = cw__plan_execute(p, ctx->be, p->temp, ctx->act, 0, &peak, NULL);
    if (ctx->cfg.flags & CW_FLAG_NVTX) cw__nvtx_pop();
    int64_t t1 = cw__now_ns();
    p->stats.host_syncs = ctx->be->i->host_syncs(ctx->be) - syncs0 - p->n_streams;
    /* Give cached temporaries and activations back after the run: memory is not held
     * between runs, and every run starts from the empty state the dry run simulated. */
    cw__alloc_release_cached(p->temp);
    cw__alloc_release_cached(ctx->act);
    cw__alloc_stats(ctx->act, &before);
    p->stats.wall_ms = (double)(t1 - t0) * 1e-6;
    p->stats.temp_peak = peak;
    p->stats.activations_peak = before.reserved_bytes_peak;
    memset(p->stats.stage_ms, 0, sizeof p->stats.stage_ms);
    memset(p->stats.stream_busy_ms, 0, sizeof p->stats.stream_busy_ms);
    for (int k = 0; k < p->n_tasks; k++) {
        if (!p->t0[k] || !p->t1[k]) continue;
        double ms = (double)(p->t1[k] - p->t0[k]) * 1e-6;
        p->stats.stage_ms[p->tasks[k].stage] += ms;
        if (p->tasks[k].stream < 8) p->stats.stream_busy_ms[p->tasks[k].stream] += ms;
    }
    p->ran = st == CW_OK;
    return st;
}

cw_status cw_plan_get_stats(const cw_plan *p, cw_plan_stats *out) {
    if (!p || !out) return CW_ERR_INVALID_ARG;
    *out = p->stats;
    return CW_OK;
}
