/* cuDNN convolution, running: the variant pack that executes a cached plan on a stream
 * (packing x and y through the workspace where needed), autotuning configs by timing them
 * on the device, and the cache's counters. */
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "backend/cuda/cudnn_conv.h"

/* Binds x, w, y (and b for a fused plan) and the workspace and runs the plan on s. Caller
 * holds c->mu. */
static cw_status cw__execute(cw__cudnn_conv *c, cudaStream_t s, cudnnBackendDescriptor_t plan, const void *x,
                             const void *w, const void *b, void *y, void *ws) {
    cw_context *ctx = c->ctx;
    cw_status st = CW_OK;
    cudnnBackendDescriptor_t vp = NULL;
    int64_t uids[4] = {CW__CUDNN_UID_X, CW__CUDNN_UID_W, CW__CUDNN_UID_Y, CW__CUDNN_UID_B};
    void *ptrs[4] = {(void *)(uintptr_t)x, (void *)(uintptr_t)w, y, (void *)(uintptr_t)b};
    int64_t n = b ? 4 : 3;
    CW__CUDNN_GOTO(ctx, st, done, cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp));
    CW__CUDNN_GOTO(ctx, st, done,
                   cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids));
    CW__CUDNN_GOTO(ctx, st, done,
                   cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs));
    CW__CUDNN_GOTO(ctx, st, done,
                   cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws));
    CW__CUDNN_GOTO(ctx, st, done, cudnnBackendFinalize(vp));
    CW__CUDNN_GOTO(ctx, st, done, cudnnSetStream(c->handle, s));
    CW__CUDNN_GOTO(ctx, st, done, cudnnBackendExecute(c->handle, plan, vp));
done:
    if (vp) cudnnBackendDestroyDescriptor(vp);
    return st;
}

cw_status cw__cudnn_conv_run(cw__cudnn_conv *c, cudaStream_t s, const cw__conv_problem *p, int id, const void *x,
                             const void *w, const void *b, void *y, void *ws, int64_t ws_bytes, int *bias_done) {
    cw_context *ctx = c->ctx;
    int64_t layout[3], actual[3] = {cw__cudnn_ptr_align(x), cw__cudnn_ptr_align(w), cw__cudnn_ptr_align(y)};
    const int64_t *align = layout;
    cw__cudnn_choice ch;
    cw__cudnn_entry *e = NULL;
    cw_status st;
    *bias_done = 0;
    if (!c->handle) return cw__error(ctx, CW_ERR_NO_DEVICE, "cudnn conv: no cuDNN handle (no device)");
    cw__cudnn_layout_align(p, layout);
    /* Pointers less aligned than the layout promised (a caller's odd view): use the list
     * built for the real alignment and its fastest config that fits the workspace. */
    if (actual[0] < layout[0] || actual[1] < layout[1] || actual[2] < layout[2]) {
        for (int i = 0; i < 3; i++) actual[i] = actual[i] < layout[i] ? actual[i] : layout[i];
        align = actual;
        id = -1;
    }
    /* Packed configs put their buffers at the start of ws: it must be 16-byte aligned; a
     * fused plan binds b, described as 16-byte aligned. */
    int allow_packed = cw__cudnn_ptr_align(ws) >= 16;
    int allow_fused = p->has_bias && b && cw__cudnn_ptr_align(b) >= 16;
    pthread_mutex_lock(&c->mu); /* the cache, and the handle's stream (shared state) */
    c->in_run = 1;
    st = cw__conv_plan_locked(c, p, align, id, ws_bytes, allow_packed, allow_fused, &ch, &e);
    c->in_run = 0;
    if (st != CW_OK) goto unlock;
    if (ch.substituted) {
        c->n_subst++;
        if (!e->warned)
            cw__log(ctx, CW_LOG_WARN, "cudnn conv: algorithm %d is not usable for a patch within %" PRId64
                    " workspace bytes; running algorithm %d instead (logged once per patch shape)", id, ws_bytes, ch.id);
        e->warned = 1;
    }
    if (ch.total_ws > 0 && !ws) {
        st = cw__error(ctx, CW_ERR_INTERNAL, "cudnn conv: algorithm %d needs %" PRId64 " workspace bytes, ws is NULL",
                       ch.id, ch.total_ws);
        goto unlock;
    }
    if (!ch.packed) {
        st = cw__execute(c, s, ch.plan, x, w, ch.fused ? b : NULL, y, ws);
        *bias_done = st == CW_OK && ch.fused;
    } else {
        /* x view -> contiguous copy, conv into a contiguous y, copy back into the y view
         * adding the bias on the way; all on s, so stream order keeps the steps apart. */
        char *base = ws;
        cw__view xv = {p->x, (void *)(uintptr_t)x}, xpv = {ch.xp, base};
        cw__view ypv = {ch.yp, base + ch.x_bytes}, yv = {p->y, y};
        void *ews = ch.engine_ws > 0 ? base + ch.x_bytes + ch.y_bytes : NULL;
        const void *bb = p->has_bias ? b : NULL;
        CW__CUDA_GOTO(ctx, st, unlock, cw__cu_copy_view(s, &xpv, &xv, NULL, CW_F32));
        if ((st = cw__execute(c, s, ch.plan, xpv.data, w, NULL, ypv.data, ews)) != CW_OK) goto unlock;
        CW__CUDA_GOTO(ctx, st, unlock, cw__cu_copy_view(s, &yv, &ypv, bb, p->w.dtype));
        *bias_done = bb != NULL;
    }
unlock:
    pthread_mutex_unlock(&c->mu);
    return st;
}

/* Autotune's host half, under c->mu: the plan of each of ids (exact ids; ch[i].plan is NULL
 * where ids[i] has none) and the times cached for them into ms. Returns how many still need
 * timing; *e is the problem's entry, *ws_max the largest workspace of the plans. */
static int cw__autotune_plans(cw__cudnn_conv *c, const cw__conv_problem *p, const int64_t align[3], const int *ids,
                              int n, float *ms, cw__cudnn_choice *ch, cw__cudnn_entry **e, int64_t *ws_max) {
    int todo = 0;
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < n; i++) {
        cw_status s1 = cw__conv_plan_locked(c, p, align, ids[i], INT64_MAX, 1, 1, &ch[i], e);
        if (s1 != CW_OK || ch[i].id != ids[i]) {
            ch[i].plan = NULL;
            continue;
        }
        for (int k = 0; k < (*e)->n; k++)
            if ((*e)->cfgs[k].id == ids[i] && (*e)->cfgs[k].tuned_ms != 0.0f) ms[i] = (*e)->cfgs[k].tuned_ms;
        if (ms[i] < 0.0f) todo++;
        if (ch[i].total_ws > *ws_max) *ws_max = ch[i].total_ws;
    }
    pthread_mutex_unlock(&c->mu);
    return todo;
}

/* Device scratch for timing p, zeroed so timing runs on finite data (garbage may hold NaNs
 * and denormals): bufs x, w, y, b, ws (ws_bytes), and the two timing events. What it made
 * before a failure is left for cw__autotune_release. */
static cw_status cw__autotune_scratch(cw_context *ctx, cudaStream_t s, const cw__conv_problem *p, int64_t ws_bytes,
                                      void *bufs[5], cudaEvent_t ev[2], int64_t *syncs) {
    const int64_t sizes[5] = {cw__desc_span_bytes(&p->x), cw__desc_span_bytes(&p->w), cw__desc_span_bytes(&p->y),
                              p->y.dims[1] * (int64_t)cw_dtype_size(p->w.dtype), ws_bytes};
    for (int i = 0; i < 5; i++) {
        if (sizes[i] <= 0) continue;
        (*syncs)++;
        CW__CUDA_CHECK(ctx, cudaMalloc(&bufs[i], (size_t)sizes[i]));
        CW__CUDA_CHECK(ctx, cudaMemsetAsync(bufs[i], 0, (size_t)sizes[i], s));
    }
    CW__CUDA_CHECK(ctx, cudaEventCreate(&ev[0]));
    CW__CUDA_CHECK(ctx, cudaEventCreate(&ev[1]));
    return CW_OK;
}

/* Times config id on the scratch: reps runs after a warm-up; the best time in *t_ms, or
 * -1 when the config cannot run here. Fails only on a CUDA error around the runs (then
 * *t_ms is left alone). */
static cw_status cw__autotune_time(cw__cudnn_conv *c, cudaStream_t s, const cw__conv_problem *p, int id, int reps,
                                   void *const bufs[5], int64_t ws_bytes, cudaEvent_t ev[2], int64_t *syncs,
                                   float *t_ms) {
    cw_context *ctx = c->ctx;
    float t_best = -1.0f;
    for (int r = 0; r <= reps; r++) { /* r = 0 warms up */
        int bias_done = 0;
        float t = 0.0f;
        CW__CUDA_CHECK(ctx, cudaEventRecord(ev[0], s));
        cw_status rs = cw__cudnn_conv_run(c, s, p, id, bufs[0], bufs[1], bufs[3], bufs[2], bufs[4], ws_bytes,
                                          &bias_done);
        if (rs == CW_OK && p->has_bias && !bias_done)
            CW__CUDA_CHECK(ctx, cw__cu_bias_add(s, &(cw__view){p->y, bufs[2]}, bufs[3], p->w.dtype));
        CW__CUDA_CHECK(ctx, cudaEventRecord(ev[1], s));
        (*syncs)++;
        CW__CUDA_CHECK(ctx, cudaEventSynchronize(ev[1]));
        if (rs != CW_OK) break; /* this engine cannot run here: not a candidate */
        CW__CUDA_CHECK(ctx, cudaEventElapsedTime(&t, ev[0], ev[1]));
        if (r > 0 && (t_best < 0.0f || t < t_best)) t_best = t;
    }
    *t_ms = t_best;
    return CW_OK;
}

/* Caches config id's time in e (< 0: it failed to run, so it is not timed again). */
static void cw__autotune_record(cw__cudnn_conv *c, cw__cudnn_entry *e, int id, float t_ms) {
    pthread_mutex_lock(&c->mu);
    for (int k = 0; e && k < e->n; k++)
        if (e->cfgs[k].id == id) e->cfgs[k].tuned_ms = t_ms < 0.0f ? -1.0f : t_ms;
    pthread_mutex_unlock(&c->mu);
}

/* Frees what cw__autotune_scratch made (each cudaFree may synchronise: counted) and clears
 * the CUDA error state. */
static void cw__autotune_release(void *bufs[5], cudaEvent_t ev[2], int64_t *syncs) {
    for (int i = 0; i < 2; i++)
        if (ev[i]) (void)cudaEventDestroy(ev[i]);
    for (int i = 0; i < 5; i++)
        if (bufs[i]) {
            (*syncs)++;
            (void)cudaFree(bufs[i]);
        }
    (void)cudaGetLastError();
}

cw_status cw__cudnn_conv_autotune(cw__cudnn_conv *c, cudaStream_t s, const cw__conv_problem *p, const int *ids,
                                  int n, int reps, float *ms, int *best, int64_t *syncs) {
    cw_context *ctx = c->ctx;
    cw_status st = CW_OK;
    int64_t align[3];
    void *bufs[5] = {0}; /* x, w, y, b, ws */
    cudaEvent_t ev[2] = {0};
    cw__cudnn_choice ch[CW__CUDNN_MAX_CFGS];
    cw__cudnn_entry *e = NULL;
    int64_t ws_max = 0;
    *best = -1;
    *syncs = 0;
    if (!c->handle) return cw__error(ctx, CW_ERR_NO_DEVICE, "cudnn conv: autotune needs a device");
    if (n < 1 || n > CW__CUDNN_MAX_CFGS || !ids || !ms)
        return cw__error(ctx, CW_ERR_INVALID_ARG, "cudnn conv: autotune of %d candidates", n);
    if (reps < 1) reps = 1;
    for (int i = 0; i < n; i++) ms[i] = -1.0f;
    if (cw__cudnn_empty_input(p)) { /* a fill: nothing to choose */
        *best = 0;
        return CW_OK;
    }
    cw__cudnn_layout_align(p, align);
    /* plans first (host only); cached times need no device work */
    if (cw__autotune_plans(c, p, align, ids, n, ms, ch, &e, &ws_max) > 0) {
        if ((st = cw__autotune_scratch(ctx, s, p, ws_max, bufs, ev, syncs)) != CW_OK) goto done;
        for (int i = 0; i < n; i++) {
            if (!ch[i].plan || ms[i] >= 0.0f) continue;
            if ((st = cw__autotune_time(c, s, p, ids[i], reps, bufs, ws_max, ev, syncs, &ms[i])) != CW_OK) goto done;
            cw__autotune_record(c, e, ids[i], ms[i]);
        }
    }
    for (int i = 0; i < n; i++)
        if (ms[i] >= 0.0f && (*best < 0 || ms[i] < ms[*best])) *best = i;
    if (*best < 0) st = cw__error(ctx, CW_ERR_UNSUPPORTED, "cudnn conv: autotune: none of %d candidates ran", n);
done:
    cw__autotune_release(bufs, ev, syncs);
    return st;
}

void cw__cudnn_conv_counters(cw__cudnn_conv *c, int64_t *problems, int64_t *plans, int64_t *hits,
                             int64_t *evicted) {
    pthread_mutex_lock(&c->mu);
    if (evicted) *evicted = c->n_evicted;
    if (problems) *problems = c->n_problems;
    if (plans) *plans = c->n_plans;
    if (hits) *hits = c->n_hits;
    pthread_mutex_unlock(&c->mu);
}

void cw__cudnn_conv_late(cw__cudnn_conv *c, int64_t *late_plans, int64_t *substitutions) {
    pthread_mutex_lock(&c->mu);
    if (late_plans) *late_plans = c->n_late;
    if (substitutions) *substitutions = c->n_subst;
    pthread_mutex_unlock(&c->mu);
}

