/* The cuda backend: the backend function table on the CUDA runtime (non-blocking streams,
 * events, cudaMalloc'd memory for the budgeted allocator, async copies), cuBLAS for GEMM,
 * kernels.cu for elementwise work, cudnn_conv.c for convolution; plus the interop calls of
 * include/convweave/convweave_cuda.h. The library links libcudart dynamically and calls
 * nothing at load time, so it loads without a driver; creation then reports no device.
 * host_syncs counts every call that may stall the device or the host: cudaMalloc, cudaFree,
 * stream/event synchronisation, synchronous copies, and cuDNN plans finalised inside a run. */
#include <inttypes.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_internal.h"
#include "convweave/convweave_cuda.h"
#include "kernels/kernels.h"

typedef struct cw__cuda {
    cw__backend base;
    int device;
    unsigned event_flags;  /* cudaEventDisableTiming unless CW_FLAG_TIMING */
    cudnnHandle_t dnn;
    cublasHandle_t blas;
    pthread_mutex_t blas_mu; /* the cuBLAS handle's stream is shared state */
    int blas_mu_init;
    cudaStream_t copy;     /* synchronous uploads/downloads run here, then wait */
    cw__cudnn_conv *conv;
    int autotune;          /* CW_FLAG_CUDA_AUTOTUNE */
    _Atomic int64_t host_syncs;
} cw__cuda;

static void cw__sync_count(cw__cuda *cb, int64_t n) { atomic_fetch_add(&cb->host_syncs, n); }

static const cw__backend_i cw__cuda_iface;

static cw__cuda *cw__cb(cw__backend *be) { return (cw__cuda *)be; }

/* Hooks may be called from threads whose current device is another one (multi-GPU
 * callers): switch for the call and restore the caller's device afterwards. */
static cw_status cw__enter(cw__cuda *cb, int *prev) {
    CW__CUDA_CHECK(cb->base.ctx, cudaGetDevice(prev));
    if (*prev != cb->device) CW__CUDA_CHECK(cb->base.ctx, cudaSetDevice(cb->device));
    return CW_OK;
}

static void cw__leave(cw__cuda *cb, int prev) {
    if (prev != cb->device) (void)cudaSetDevice(prev);
}

#define CW__ENTER(cb)                                      \
    int cw_prev_dev_;                                      \
    do {                                                   \
        cw_status cw_es_ = cw__enter((cb), &cw_prev_dev_); \
        if (cw_es_ != CW_OK) return cw_es_;                \
    } while (0)
#define CW__LEAVE(cb, st) (cw__leave((cb), cw_prev_dev_), (st))

/* ---- memory ---------------------------------------------------------------------------- */

static cw_status cuda_dev_alloc(cw__backend *be, int64_t bytes, void **out) {
    cw__cuda *cb = cw__cb(be);
    *out = NULL;
    if (bytes < 0) return cw__error(be->ctx, CW_ERR_INVALID_ARG, "cuda dev_alloc: bytes = %" PRId64 " < 0", bytes);
    if (bytes == 0) return CW_OK;
    CW__ENTER(cb);
    cw__sync_count(cb, 1); /* cudaMalloc may synchronise the device */
    cudaError_t e = cudaMalloc(out, (size_t)bytes);
    cw_status st = CW_OK;
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* out-of-memory is not sticky: clear it */
        *out = NULL;
        size_t free_b = 0, total_b = 0;
        (void)cudaMemGetInfo(&free_b, &total_b);
        (void)cudaGetLastError();
        st = cw__error(be->ctx, cw__cuda_status(e),
                       "cudaMalloc(%" PRId64 " bytes) on device %d failed: %s (%s); %zu of %zu bytes free", bytes,
                       cb->device, cudaGetErrorName(e), cudaGetErrorString(e), free_b, total_b);
    }
    return CW__LEAVE(cb, st);
}

static void cuda_dev_free(cw__backend *be, void *p) {
    cw__cuda *cb = cw__cb(be);
    int prev;
    if (!p || cw__enter(cb, &prev) != CW_OK) return;
    cudaError_t e = cudaFree(p);
    /* cudaFree waits for the device: a host synchronisation. */
    cw__sync_count(cb, 1);
    if (e != cudaSuccess) cw__cuda_fail(be->ctx, e, "cudaFree(p)", __FILE__, __LINE__);
    cw__leave(cb, prev);
}

/* Synchronous by contract (run boundaries): the copy runs on the backend's own stream and
 * the host waits for it, so a pageable source is never read after we return (counted as a
 * host synchronisation). cudaMemcpyDefault: with unified addressing the direction comes
 * from the pointers, so pinned or managed memory works. */
static cw_status cuda_copy_sync(cw__backend *be, void *dst, const void *src, int64_t bytes, const char *what) {
    cw__cuda *cb = cw__cb(be);
    cw_status st = CW_OK;
    if (bytes < 0) return cw__error(be->ctx, CW_ERR_INVALID_ARG, "cuda %s: bytes = %" PRId64 " < 0", what, bytes);
    if (bytes == 0) return CW_OK;
    CW__ENTER(cb);
    CW__CUDA_GOTO(be->ctx, st, done, cudaMemcpyAsync(dst, src, (size_t)bytes, cudaMemcpyDefault, cb->copy));
    cw__sync_count(cb, 1);
    CW__CUDA_GOTO(be->ctx, st, done, cudaStreamSynchronize(cb->copy));
done:
    return CW__LEAVE(cb, st);
}

static cw_status cuda_upload(cw__backend *be, void *dst_dev, const void *src_host, int64_t bytes) {
    return cuda_copy_sync(be, dst_dev, src_host, bytes, "upload");
}

static cw_status cuda_download(cw__backend *be, void *dst_host, const void *src_dev, int64_t bytes) {
    return cuda_copy_sync(be, dst_host, src_dev, bytes, "download");
}

static cw_status cuda_copy_async(cw__backend *be, cw__stream *s, void *dst, const void *src, int64_t bytes) {
    cw__cuda *cb = cw__cb(be);
    cw_status st = CW_OK;
    if (bytes < 0) return cw__error(be->ctx, CW_ERR_INVALID_ARG, "cuda copy_async: bytes = %" PRId64 " < 0", bytes);
    if (bytes == 0) return CW_OK;
    CW__ENTER(cb);
    CW__CUDA_GOTO(be->ctx, st, done, cudaMemcpyAsync(dst, src, (size_t)bytes, cudaMemcpyDefault, s->cs));
done:
    return CW__LEAVE(cb, st);
}

static cw_status cuda_fill32_async(cw__backend *be, cw__stream *s, void *p, uint32_t pattern, int64_t count) {
    cw__cuda *cb = cw__cb(be);
    cw_status st = CW_OK;
    if (count < 0) return cw__error(be->ctx, CW_ERR_INVALID_ARG, "cuda fill32: count = %" PRId64 " < 0", count);
    CW__ENTER(cb);
    CW__CUDA_GOTO(be->ctx, st, done, cw__cu_fill32(s->cs, p, pattern, count));
done:
    return CW__LEAVE(cb, st);
}

/* ---- streams and events ------------------------------------------------------------------ */

/* Each stream owns a small scratch for GroupNorm statistics chunks (stream order keeps its
 * launches apart), allocated with the stream, outside runs: 192 KiB per stream, outside the
 * temp budget. Without it (allocation failed) gn_stats uses one block per group. */
static void cw__stream_scratch(cw__cuda *cb, cw__stream *s) {
    cw__sync_count(cb, 1);
    cudaError_t e = cudaMalloc((void **)&s->gn_scratch, (size_t)CW__CU_GN_SCRATCH_PARTS * 3 * sizeof(double));
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        s->gn_scratch = NULL;
        cw__log(cb->base.ctx, CW_LOG_DEBUG, "cuda stream: no GroupNorm scratch (%s): one block per group",
                cudaGetErrorName(e));
    }
}

static cw_status cuda_stream_create(cw__backend *be, cw__stream **out) {
    cw__cuda *cb = cw__cb(be);
    cw_status st = CW_OK;
    *out = NULL;
    CW__ENTER(cb);
    cw__stream *s = cw__calloc(1, sizeof *s);
    if (!s) return CW__LEAVE(cb, cw__error(be->ctx, CW_ERR_OUT_OF_MEMORY, "cuda stream_create: out of host memory"));
    /* Non-blocking: no implicit ordering with the legacy default stream (a caller's
     * cudaMemcpy elsewhere must not serialise our streams). */
    CW__CUDA_GOTO(be->ctx, st, done, cudaStreamCreateWithFlags(&s->cs, cudaStreamNonBlocking));
    s->owned = 1;
    cw__stream_scratch(cb, s);
    *out = s;
    s = NULL;
done:
    cw__free(s);
    return CW__LEAVE(cb, st);
}

static void cuda_stream_destroy(cw__backend *be, cw__stream *s) {
    if (!s) return;
    cw__cuda *cb = cw__cb(be);
    cw__sync_count(cb, 1);
    cudaError_t e = cudaStreamSynchronize(s->cs);
    if (e != cudaSuccess) cw__cuda_fail(be->ctx, e, "cudaStreamSynchronize(s->cs)", __FILE__, __LINE__);
    if (s->gn_scratch) {
        cw__sync_count(cb, 1);
        e = cudaFree(s->gn_scratch);
        if (e != cudaSuccess) cw__cuda_fail(be->ctx, e, "cudaFree(s->gn_scratch)", __FILE__, __LINE__);
    }
    if (s->owned) {
        e = cudaStreamDestroy(s->cs);
        if (e != cudaSuccess) cw__cuda_fail(be->ctx, e, "cudaStreamDestroy(s->cs)", __FILE__, __LINE__);
    }
    cw__free(s);
}

static cw_status cuda_event_create(cw__backend *be, cw__event **out) {
    cw__cuda *cb = cw__cb(be);
    cw_status st = CW_OK;
    *out = NULL;
    CW__ENTER(cb);
    cw__event *ev = cw__calloc(1, sizeof *ev);
    if (!ev) return CW__LEAVE(cb, cw__error(be->ctx, CW_ERR_OUT_OF_MEMORY, "cuda event_create: out of host memory"));
    CW__CUDA_GOTO(be->ctx, st, done, cudaEventCreateWithFlags(&ev->ev, cb->event_flags));
    *out = ev;
    ev = NULL;
done:
    cw__free(ev);
    return CW__LEAVE(cb, st);
}

static void cuda_event_destroy(cw__backend *be, cw__event *ev) {
    if (!ev) return;
    /* Legal while a recording is pending: CUDA releases the event once it completes. */
    cudaError_t e = cudaEventDestroy(ev->ev);
    if (e != cudaSuccess) cw__cuda_fail(be->ctx, e, "cudaEventDestroy(ev->ev)", __FILE__, __LINE__);
    cw__free(ev);
}

static cw_status cuda_event_record(cw__backend *be, cw__event *ev, cw__stream *s) {
    CW__CUDA_CHECK(be->ctx, cudaEventRecord(ev->ev, s->cs));
    return CW_OK;
}

static cw_status cuda_stream_wait_event(cw__backend *be, cw__stream *s, cw__event *ev) {
    CW__CUDA_CHECK(be->ctx, cudaStreamWaitEvent(s->cs, ev->ev, 0));
    return CW_OK;
}

static cw_status cuda_event_query(cw__backend *be, cw__event *ev, int *done) {
    cudaError_t e = cudaEventQuery(ev->ev);
    *done = 0;
    if (e == cudaSuccess) {
        *done = 1;
        return CW_OK;
    }
    if (e == cudaErrorNotReady) {
        /* CUDA also records "not ready" as the thread's last error: clear it, or the next
         * launcher's cudaGetLastError() reports it (non-sticky, so nothing real is lost) */
        (void)cudaGetLastError();
        return CW_OK;
    }
    return cw__cuda_fail(be->ctx, e, "cudaEventQuery(ev->ev)", __FILE__, __LINE__);
}

static cw_status cuda_event_synchronize(cw__backend *be, cw__event *ev) {
    cw__sync_count(cw__cb(be), 1);
    CW__CUDA_CHECK(be->ctx, cudaEventSynchronize(ev->ev));
    return CW_OK;
}

static cw_status cuda_stream_synchronize(cw__backend *be, cw__stream *s) {
    cw__sync_count(cw__cb(be), 1);
    CW__CUDA_CHECK(be->ctx, cudaStreamSynchronize(s->cs));
    return CW_OK;
}

/* The counter plus cuDNN plans finalised inside runs (each may load kernels: a sync). */
static int64_t cuda_host_syncs(cw__backend *be) {
    int64_t late = 0;
    cw__cudnn_conv_late(cw__cb(be)->conv, &late, NULL);
    return atomic_load(&cw__cb(be)->host_syncs) + late;
}

static cw_status cuda_launch_host(cw__backend *be, cw__stream *s, cw__host_fn fn, void *arg) {
    /* cw__host_fn and cudaHostFn_t are both void (*)(void *) (CUDART_CB is empty off Windows). */
    CW__CUDA_CHECK(be->ctx, cudaLaunchHostFunc(s->cs, fn, arg));
    return CW_OK;
}

/* ---- operations ---------------------------------------------------------------------------- */

static cw_status cuda_conv_algos(cw__backend *be, const cw__conv_problem *p, cw__conv_algo *out, int max, int *n) {
    cw__cuda *cb = cw__cb(be);
    CW__ENTER(cb);

    return CW__LEAVE(cb, cw__cudnn_conv_algos(cb->conv, p, out, max, n));
}

static cw_status cuda_conv_forward(cw__backend *be, cw__stream *s, const cw__conv_problem *p,
                                     const cw__conv_algo *algo, const void *x, const void *w, const void *b, void *y,
                                     void *ws, int64_t ws_bytes) {
    cw__cuda *cb = cw__cb(be);
    cw_status st = CW_OK;
    if (!p || !w || !y || (p->has_bias && !b))
        return cw__error(be->ctx, CW_ERR_INVALID_ARG, "cuda conv_forward: %s is NULL",
                         !p ? "problem" : !w ? "w" : !y ? "y" : "bias");
    /* A patch whose input rows all lie in the padding (scheduler/planner.h) has no input
     * view and cuDNN takes no empty tensor: its output is the bias alone. */
    int empty = cw__cudnn_empty_input(p);
    if (!empty && !x) return cw__error(be->ctx, CW_ERR_INVALID_ARG, "cuda conv_forward: x is NULL");
    cw__view yv = {p->y, y};
    const void *bias = p->has_bias ? b : NULL; /* a constant like w: w's dtype */
    int bias_done = 0;
    CW__ENTER(cb);
    if (empty) {
        CW__CUDA_GOTO(be->ctx, st, done, cw__cu_fill_bias(s->cs, &yv, bias, p->w.dtype));
        bias_done = 1;
    } else {
        /* a bias-fused plan or the packed copy back adds the bias; otherwise one pass here */
        st = cw__cudnn_conv_run(cb->conv, s->cs, p, algo ? algo->id : -1, x, w, bias, y, ws, ws_bytes, &bias_done);
        if (st != CW_OK) goto done;
    }
    if (bias && !bias_done) CW__CUDA_GOTO(be->ctx, st, done, cw__cu_bias_add(s->cs, &yv, bias, p->w.dtype));
done:
    return CW__LEAVE(cb, st);
}

static cw_status cuda_conv_prepare(cw__backend *be, const cw__conv_problem *p, const cw__conv_algo *algo,
                                   int64_t ws_cap, cw__conv_algo *used) {
    cw__cuda *cb = cw__cb(be);
    cw__cudnn_choice ch;
    if (!p || !algo || !used) return cw__error(be->ctx, CW_ERR_INVALID_ARG, "cuda conv_prepare: NULL argument");
    *used = *algo;
    CW__ENTER(cb);
    cw_status st = cw__cudnn_conv_prepare(cb->conv, p, algo->id, ws_cap, &ch);
    if (st == CW_OK && ch.id != algo->id) {
        /* the substitute conv_forward will run: its name and workspace from the list */
        cw__conv_algo lst[CW__CUDNN_MAX_CFGS];
        int n = 0;
        used->id = ch.id;
        used->workspace = ch.total_ws;
        snprintf(used->name, sizeof used->name, "cudnn algorithm %d", ch.id);
        if (cw__cudnn_conv_algos(cb->conv, p, lst, CW__CUDNN_MAX_CFGS, &n) == CW_OK)
            for (int i = 0; i < n; i++)
                if (lst[i].id == ch.id) *used = lst[i];
        used->workspace = ch.total_ws;
    } else if (st == CW_OK && !cw__cudnn_empty_input(p)) {
        used->workspace = ch.total_ws; /* the plan's own figure */
    }
    return CW__LEAVE(cb, st);
}

static cw_status cuda_conv_autotune(cw__backend *be, const cw__conv_problem *p, const cw__conv_algo *cands, int n,
                                    int *best) {
    cw__cuda *cb = cw__cb(be);
    int ids[CW__CUDNN_MAX_CFGS];
    float ms[CW__CUDNN_MAX_CFGS];
    int64_t syncs = 0;
    if (!p || !cands || !best || n < 1)
        return cw__error(be->ctx, CW_ERR_INVALID_ARG, "cuda conv_autotune: %d candidates", n);
    if (n > CW__CUDNN_MAX_CFGS) n = CW__CUDNN_MAX_CFGS;
    *best = 0;
    if (!cb->autotune || n == 1) return CW_OK; /* not asked for (CW_FLAG_CUDA_AUTOTUNE): keep the order */
    for (int i = 0; i < n; i++) ids[i] = cands[i].id;
    CW__ENTER(cb);
    cw_status st = cw__cudnn_conv_autotune(cb->conv, cb->copy, p, ids, n, 3, ms, best, &syncs);
    cw__sync_count(cb, syncs);
    if (st == CW_OK)
        for (int i = 0; i < n; i++)
            cw__log(be->ctx, CW_LOG_DEBUG, "cuda autotune: %s: %.3f ms%s", cands[i].name, (double)ms[i],
                    i == *best ? " (fastest)" : "");
    return CW__LEAVE(cb, st);
}

static int cw__dtype_ok(cw_dtype dt) { return dt == CW_F32 || dt == CW_F16 || dt == CW_BF16; }

static cw_status cw__view_check(cw_context *ctx, const cw__view *v, const char *what, const char *name) {
    if (!v || !v->data) return cw__error(ctx, CW_ERR_INVALID_ARG, "cuda %s: %s is NULL", what, name);
    if (v->d.rank < 1 || v->d.rank > CW_MAX_RANK || !cw__dtype_ok(v->d.dtype))
        return cw__error(ctx, CW_ERR_INVALID_ARG, "cuda %s: %s has rank %d, dtype %d", what, name, v->d.rank,
                         (int)v->d.dtype);
    for (int i = 0; i < v->d.rank; i++)
        if (v->d.dims[i] < 1)
            return cw__error(ctx, CW_ERR_INVALID_ARG, "cuda %s: %s dims[%d] = %" PRId64 " < 1", what, name, i,
                             v->d.dims[i]);
    return CW_OK;
}

static cw_status cuda_prep(cw__backend *be, cw__stream *s, const cw__prep_params *p) {
    cw__cuda *cb = cw__cb(be);
    cw_context *ctx = be->ctx;
    cw_status st;
    char b1[96], b2[96];
    if (!p) return cw__error(ctx, CW_ERR_INVALID_ARG, "cuda prep: params are NULL");
    if (p->dst_row0 < 0 || p->src_row0 < 0) /* the row map divides: truncation needs rows >= 0 */
        return cw__error(ctx, CW_ERR_INVALID_ARG, "cuda prep: dst_row0 %" PRId64 " / src_row0 %" PRId64 " < 0",
                         p->dst_row0, p->src_row0);
    if ((st = cw__view_check(ctx, &p->src, "prep", "src")) != CW_OK) return st;
    if ((st = cw__view_check(ctx, &p->dst, "prep", "dst")) != CW_OK) return st;
    const cw_tensor_desc *sd = &p->src.d, *dd = &p->dst.d;
    int r = dd->rank;
    if (r < 4 || sd->rank != r || p->up < 1 || !p->scale != !p->shift)
        return cw__error(ctx, CW_ERR_INVALID_ARG, "cuda prep: src %s, dst %s, up %d, scale %s, shift %s",
                         cw__dims_str(sd, b1, sizeof b1), cw__dims_str(dd, b2, sizeof b2), p->up,
                         p->scale ? "set" : "NULL", p->shift ? "set" : "NULL");
    /* dst W may be any width whose last column still has a source column (w / up < src W). */
    int bad = sd->dims[0] != dd->dims[0] || sd->dims[1] != dd->dims[1] || (dd->dims[r - 1] - 1) / p->up >= sd->dims[r - 1];
    if (r == 5) bad |= sd->dims[2] != dd->dims[2];
    int64_t first = cw_up_src_index(0, p->dst_row0, p->src_row0, p->up);
    int64_t last = cw_up_src_index(dd->dims[r - 2] - 1, p->dst_row0, p->src_row0, p->up);
    if (bad || first < 0 || last >= sd->dims[r - 2])
        return cw__error(ctx, CW_ERR_INVALID_ARG,
                         "cuda prep: dst %s rows from %" PRId64 " need src rows %" PRId64 "..%" PRId64
                         " of src %s starting at row %" PRId64 " (up %d)",
                         cw__dims_str(dd, b2, sizeof b2), p->dst_row0, first + p->src_row0, last + p->src_row0,
                         cw__dims_str(sd, b1, sizeof b1), p->src_row0, p->up);
    CW__ENTER(cb);
    CW__CUDA_GOTO(ctx, st, done, cw__cu_prep(s->cs, p));
done:
    return CW__LEAVE(cb, st);
}

static cw_status cuda_gn_stats(cw__backend *be, cw__stream *s, const cw__view *x, int64_t groups, double *out) {
    cw__cuda *cb = cw__cb(be);
    cw_status st;
    if ((st = cw__view_check(be->ctx, x, "gn_stats", "x")) != CW_OK) return st;
    if (x->d.rank < 3 || groups < 1 || x->d.dims[1] % groups != 0 || !out)
        return cw__error(be->ctx, CW_ERR_INVALID_ARG,
                         "cuda gn_stats: x rank %d with %" PRId64 " channels, groups %" PRId64 ", out %p", x->d.rank,
                         x->d.dims[1], groups, (void *)out);
    CW__ENTER(cb);
    CW__CUDA_GOTO(be->ctx, st, done,
                  cw__cu_gn_stats(s->cs, x, groups, out, s->gn_scratch, s->gn_scratch ? CW__CU_GN_SCRATCH_PARTS : 0));
done:
    return CW__LEAVE(cb, st);
}

static cw_status cuda_gn_finalize(cw__backend *be, cw__stream *s, const double *parts, int64_t n_parts, int64_t n,
                                    int64_t c, int64_t groups, const float *gamma, const float *beta, float eps,
                                    float *scale, float *shift) {
    cw__cuda *cb = cw__cb(be);
    cw_status st = CW_OK;
    if (n == 0) return CW_OK;
    if (!parts || n_parts < 1 || n < 0 || groups < 1 || c < 1 || c % groups != 0 || !scale || !shift || !(eps >= 0.0f) || !isfinite(eps))
        return cw__error(be->ctx, CW_ERR_INVALID_ARG,
                         "cuda gn_finalize: n_parts %" PRId64 ", n %" PRId64 ", c %" PRId64 ", groups %" PRId64
                         ", eps %g (need c divisible by groups, eps >= 0, non-NULL parts/scale/shift)",
                         n_parts, n, c, groups, (double)eps);
    CW__ENTER(cb);
    CW__CUDA_GOTO(be->ctx, st, done,
                  cw__cu_gn_finalize(s->cs, parts, n_parts, n, c, groups, gamma, beta, eps, scale, shift));
done:
    return CW__LEAVE(cb, st);
}

static cw_status cuda_add(cw__backend *be, cw__stream *s, const cw__view *dst, const cw__view *a, const cw__view *b) {
    cw__cuda *cb = cw__cb(be);
    cw_status st;
    if ((st = cw__view_check(be->ctx, dst, "add", "dst")) != CW_OK) return st;
    if ((st = cw__view_check(be->ctx, a, "add", "a")) != CW_OK) return st;
    if ((st = cw__view_check(be->ctx, b, "add", "b")) != CW_OK) return st;
    int same = a->d.rank == dst->d.rank && b->d.rank == dst->d.rank;
    for (int i = 0; same && i < dst->d.rank; i++) same = a->d.dims[i] == dst->d.dims[i] && b->d.dims[i] == dst->d.dims[i];
    if (!same) {
        char b1[96], b2[96], b3[96];
        return cw__error(be->ctx, CW_ERR_INVALID_ARG, "cuda add: dims differ: dst %s, a %s, b %s",
                         cw__dims_str(&dst->d, b1, sizeof b1), cw__dims_str(&a->d, b2, sizeof b2),
                         cw__dims_str(&b->d, b3, sizeof b3));
    }
    CW__ENTER(cb);
    CW__CUDA_GOTO(be->ctx, st, done, cw__cu_add(s->cs, dst, a, b));
done:
    return CW__LEAVE(cb, st);
}

/* p was checked by cw__op_channel. */
static cw_status cuda_channel_op(cw__backend *be, cw__stream *s, const cw__channel_params *p) {
    cw__cuda *cb = cw__cb(be);
    cw_status st = CW_OK;
    CW__ENTER(cb);
    CW__CUDA_GOTO(be->ctx, st, done, cw__cu_channel(s->cs, p));
done:
    return CW__LEAVE(cb, st);
}

/* Row-major C = alpha op(A) op(B) + beta C is column-major C^T = op(B)^T op(A)^T: the same
 * buffers with A and B swapped and m and n swapped. */
static cw_status cuda_gemm(cw__backend *be, cw__stream *s, const cw__gemm_params *p) {
    cw__cuda *cb = cw__cb(be);
    cw_status st = CW_OK;
    if (!p || p->m < 0 || p->n < 0 || p->k < 0 || (p->m && p->n && (!p->c || (p->k && (!p->a || !p->b)))) ||
        p->ldc < (p->n > 1 ? p->n : 1) || p->lda < ((p->trans_a ? p->m : p->k) > 1 ? (p->trans_a ? p->m : p->k) : 1) ||
        p->ldb < ((p->trans_b ? p->k : p->n) > 1 ? (p->trans_b ? p->k : p->n) : 1))
        return cw__error(be->ctx, CW_ERR_INVALID_ARG,
                         "cuda gemm: m %" PRId64 " n %" PRId64 " k %" PRId64 " lda %" PRId64 " ldb %" PRId64
                         " ldc %" PRId64 " trans_a %d trans_b %d (row-major leading dims too small or NULL pointer)",
                         p ? p->m : 0, p ? p->n : 0, p ? p->k : 0, p ? p->lda : 0, p ? p->ldb : 0, p ? p->ldc : 0,
                         p ? p->trans_a : 0, p ? p->trans_b : 0);
    if (p->m == 0 || p->n == 0) return CW_OK;
    CW__ENTER(cb);
    pthread_mutex_lock(&cb->blas_mu);
    CW__CUBLAS_GOTO(be->ctx, st, unlock, cublasSetStream(cb->blas, s->cs));
    /* No cuBLAS workspace: its default pool is outside the temp budget, and a fixed (empty)
     * workspace keeps the kernel choice, hence the bits, independent of the stream. Should
     * this cuBLAS refuse it, its default pool still gives correct results: log, go on. */
    cublasStatus_t ws_st = cublasSetWorkspace(cb->blas, NULL, 0);
    if (ws_st != CUBLAS_STATUS_SUCCESS)
        cw__log(be->ctx, CW_LOG_DEBUG, "cuda gemm: cublasSetWorkspace(NULL, 0): %s; using cuBLAS's default pool",
                cublasGetStatusString(ws_st));
    CW__CUBLAS_GOTO(be->ctx, st, unlock,
                    cublasSgemm_v2_64(cb->blas, p->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                      p->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, p->n, p->m, p->k, &p->alpha, p->b,
                                      p->ldb, p->a, p->lda, &p->beta, p->c, p->ldc));
unlock:
    pthread_mutex_unlock(&cb->blas_mu);
    return CW__LEAVE(cb, st);
}

static cw_status cuda_softmax_rows(cw__backend *be, cw__stream *s, float *x, int64_t rows, int64_t cols,
                                     int64_t ld) {
    cw__cuda *cb = cw__cb(be);
    cw_status st = CW_OK;
    if (!x || rows < 0 || cols < 1 || ld < cols)
        return cw__error(be->ctx, CW_ERR_INVALID_ARG,
                         "cuda softmax_rows: rows %" PRId64 ", cols %" PRId64 ", ld %" PRId64 " (need ld >= cols)",
                         rows, cols, ld);
    CW__ENTER(cb);
    CW__CUDA_GOTO(be->ctx, st, done, cw__cu_softmax_rows(s->cs, x, rows, cols, ld));
done:
    return CW__LEAVE(cb, st);
}

/* ---- device timestamps for traces ------------------------------------------------------- */

static void cuda_timer_destroy(cw__backend *be, cw__timer *t) {
    if (!t) return;
    for (int k = 0; t->ev && k < t->n; k++)
        if (t->ev[k]) (void)cudaEventDestroy(t->ev[k]);
    (void)cudaGetLastError();
    (void)be;
    cw__free(t->ev);
    cw__free(t->recorded);
    cw__free(t);
}

static cw_status cuda_timer_create(cw__backend *be, int n, cw__timer **out) {
    cw__cuda *cb = cw__cb(be);
    cw_status st = CW_OK;
    *out = NULL;
    if (n < 1) return cw__error(be->ctx, CW_ERR_INVALID_ARG, "cuda timer_create: n = %d", n);
    cw__timer *t = cw__calloc(1, sizeof *t);
    if (t) {
        t->ev = cw__calloc((size_t)n, sizeof *t->ev);
        t->recorded = cw__calloc((size_t)n, 1);
    }
    if (!t || !t->ev || !t->recorded) {
        cuda_timer_destroy(be, t);
        return cw__error(be->ctx, CW_ERR_OUT_OF_MEMORY, "cuda timer_create: out of host memory for %d marks", n);
    }
    t->n = n;
    CW__ENTER(cb);
    for (int k = 0; k < n; k++) CW__CUDA_GOTO(be->ctx, st, done, cudaEventCreateWithFlags(&t->ev[k], cudaEventDefault));
    *out = t;
    t = NULL;
done:
    cuda_timer_destroy(be, t);
    return CW__LEAVE(cb, st);
}

static cw_status cuda_timer_mark(cw__backend *be, cw__timer *t, int k, cw__stream *s) {
    if (!t || k < 0 || k >= t->n || !s)
        return cw__error(be->ctx, CW_ERR_INVALID_ARG, "cuda timer_mark: mark %d of %d", k, t ? t->n : 0);
    CW__CUDA_CHECK(be->ctx, cudaEventRecord(t->ev[k], s->cs));
    t->recorded[k] = 1;
    return CW_OK;
}

static cw_status cuda_timer_read(cw__backend *be, cw__timer *t, int64_t *ns) {
    cw_status st = CW_OK;
    if (!t || !ns) return cw__error(be->ctx, CW_ERR_INVALID_ARG, "cuda timer_read: NULL argument");
    if (!t->recorded[0]) return cw__error(be->ctx, CW_ERR_INVALID_ARG, "cuda timer_read: mark 0 was not recorded");
    for (int k = 0; k < t->n; k++) {
        float ms = 0.0f;
        ns[k] = -1;
        if (!t->recorded[k]) continue;
        cudaError_t e = cudaEventElapsedTime(&ms, t->ev[0], t->ev[k]);
        if (e != cudaSuccess && st == CW_OK) /* e.g. not ready: the streams were not synchronised */
            st = cw__cuda_fail(be->ctx, e, "cudaEventElapsedTime(mark 0, mark k)", __FILE__, __LINE__);
        if (e == cudaSuccess) ns[k] = (int64_t)((double)ms * 1e6);
    }
    memset(t->recorded, 0, (size_t)t->n);
    return st;
}

/* ---- lifetime ------------------------------------------------------------------------------ */

static void cuda_destroy(cw__backend *be) {
    cw__cuda *cb = cw__cb(be);
    if (!cb) return;
    int prev = -1;
    int entered = cw__enter(cb, &prev) == CW_OK;
    cw__cudnn_conv_destroy(cb->conv);
    if (cb->dnn) cudnnDestroy(cb->dnn);
    if (cb->blas) cublasDestroy(cb->blas);
    if (cb->copy) {
        (void)cudaStreamSynchronize(cb->copy);
        (void)cudaStreamDestroy(cb->copy);
    }
    if (cb->blas_mu_init) pthread_mutex_destroy(&cb->blas_mu);
    (void)cudaGetLastError();
    if (entered) cw__leave(cb, prev);
    cw__free(cb);
}

static const cw__backend_i cw__cuda_iface = {
    .name = "cuda",
    .destroy = cuda_destroy,
    .dev_alloc = cuda_dev_alloc,
    .dev_free = cuda_dev_free,
    .upload = cuda_upload,
    .download = cuda_download,
    .copy_async = cuda_copy_async,
    .fill32_async = cuda_fill32_async,
    .stream_create = cuda_stream_create,
    .stream_destroy = cuda_stream_destroy,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .stream_wait_event = cuda_stream_wait_event,
    .event_query = cuda_event_query,
    .event_synchronize = cuda_event_synchronize,
    .stream_synchronize = cuda_stream_synchronize,
    .host_syncs = cuda_host_syncs,
    .launch_host = cuda_launch_host,
    .conv_algos = cuda_conv_algos,
    .conv_forward = cuda_conv_forward,
    .prep = cuda_prep,
    .gn_stats = cuda_gn_stats,
    .gn_finalize = cuda_gn_finalize,
    .add = cuda_add,
    .channel_op = cuda_channel_op,
    .gemm = cuda_gemm,
    .softmax_rows = cuda_softmax_rows,
    .conv_prepare = cuda_conv_prepare,
    .conv_autotune = cuda_conv_autotune,
    .timer_create = cuda_timer_create,
    .timer_destroy = cuda_timer_destroy,
    .timer_mark = cuda_timer_mark,
    .timer_read = cuda_timer_read,
};

int cw__backend_cuda_compiled(void) { return 1; }

cw_status cw__backend_cuda_create(cw_context *ctx, const cw_context_config *cfg, cw__backend **out) {
    cw_status st = CW_OK;
    int count = 0, prev = -1, dev = cfg ? cfg->device : 0;
    cw__cuda *cb = NULL;
    *out = NULL;

    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return cw__error(ctx, CW_ERR_NO_DEVICE, "backend cuda: no usable CUDA device: cudaGetDeviceCount failed: %s (%s)",
                         cudaGetErrorString(e), cudaGetErrorName(e));
    }
    if (count < 1) return cw__error(ctx, CW_ERR_NO_DEVICE, "backend cuda: no CUDA device present");
    if (dev < 0 || dev >= count)
        return cw__error(ctx, CW_ERR_NO_DEVICE, "backend cuda: device %d requested, %d CUDA device(s) present", dev,
                         count);
    CW__CUDA_CHECK(ctx, cudaGetDevice(&prev));
    CW__CUDA_CHECK(ctx, cudaSetDevice(dev));

    struct cudaDeviceProp prop;
    CW__CUDA_GOTO(ctx, st, fail, cudaGetDeviceProperties(&prop, dev));
    e = cw__cu_probe();
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        st = cw__error(ctx, CW_ERR_NO_DEVICE,
                       "backend cuda: device %d (%s, compute capability %d.%d) cannot run this build's kernels: %s (%s)",
                       dev, prop.name, prop.major, prop.minor, cudaGetErrorString(e), cudaGetErrorName(e));
        goto fail;
    }
    if (cudnnGetVersion() / 10000 != CUDNN_MAJOR) {
        st = cw__error(ctx, CW_ERR_BACKEND, "backend cuda: built with cuDNN %d, loaded cuDNN %zu", CUDNN_VERSION,
                       cudnnGetVersion());
        goto fail;
    }

    cb = cw__calloc(1, sizeof *cb);
    if (!cb) {
        st = cw__error(ctx, CW_ERR_OUT_OF_MEMORY, "backend cuda: out of host memory");
        goto fail;
    }
    cb->base.i = &cw__cuda_iface;
    cb->base.ctx = ctx;
    cb->device = dev;
    cb->event_flags = (cfg && (cfg->flags & CW_FLAG_TIMING)) ? cudaEventDefault : cudaEventDisableTiming;
    atomic_init(&cb->host_syncs, 0);
    if (pthread_mutex_init(&cb->blas_mu, NULL) != 0) {
        st = cw__error(ctx, CW_ERR_INTERNAL, "backend cuda: pthread_mutex_init failed");
        goto fail;
    }
    cb->blas_mu_init = 1;
    CW__CUDA_GOTO(ctx, st, fail, cudaStreamCreateWithFlags(&cb->copy, cudaStreamNonBlocking));
    CW__CUDNN_GOTO(ctx, st, fail, cudnnCreate(&cb->dnn));
    CW__CUBLAS_GOTO(ctx, st, fail, cublasCreate(&cb->blas));
    /* Plain f32 GEMM (the cpu oracle compares at 1e-5) unless TF32 is asked for. */
    const int tf32 = cfg && (cfg->flags & CW_FLAG_CUDA_TF32);
    cb->autotune = cfg && (cfg->flags & CW_FLAG_CUDA_AUTOTUNE);
    CW__CUBLAS_GOTO(ctx, st, fail, cublasSetMathMode(cb->blas, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
    if ((st = cw__cudnn_conv_create(&cb->conv, ctx, cb->dnn, NULL, tf32 ? CW__CUDNN_TF32 : 0)) != CW_OK) goto fail;

    cw__log(ctx, CW_LOG_INFO,
            "backend cuda: device %d %s (compute capability %d.%d, %zu MiB), cuDNN %zu, events %s, TF32 %s, autotune %s",
            dev, prop.name, prop.major, prop.minor, prop.totalGlobalMem >> 20, cudnnGetVersion(),
            cb->event_flags == cudaEventDefault ? "timed" : "untimed", tf32 ? "on" : "off", cb->autotune ? "on" : "off");
    if (prev != dev) (void)cudaSetDevice(prev);
    *out = &cb->base;
    return CW_OK;
fail:
    if (cb) cuda_destroy(&cb->base);
    if (prev >= 0 && prev != dev) (void)cudaSetDevice(prev);
    return st;
}

/* ---- convweave_cuda.h ------------------------------------------------------------------ */

static cw_status cw__cuda_ctx_check(cw_context *ctx, int index, const char *what) {
    if (!ctx) return CW_ERR_INVALID_ARG;
    if (!ctx->be || ctx->be->i != &cw__cuda_iface)
        return cw__error(ctx, CW_ERR_UNSUPPORTED, "%s: the context runs backend %s, not cuda", what,
                         ctx->be ? ctx->be->i->name : "none");
    if (index < 0 || index >= CW__MAX_STREAMS)
        return cw__error(ctx, CW_ERR_INVALID_ARG, "%s: stream index %d outside 0..%d", what, index,
                         CW__MAX_STREAMS - 1);
    return CW_OK;
}

cw_status cw_context_set_cuda_stream(cw_context *ctx, int index, void *cuda_stream) {
    cw_status st = cw__cuda_ctx_check(ctx, index, "cw_context_set_cuda_stream");
    if (st != CW_OK) return st;
    cw__cuda *cb = cw__cb(ctx->be);
    cudaStream_t us = (cudaStream_t)cuda_stream;
    int sdev = -1;
    /* A stream of another device would fail at the first launch; say so now. */
    if (us) {
        cudaError_t e = cudaStreamGetDevice(us, &sdev);
        if (e != cudaSuccess) return cw__cuda_fail(ctx, e, "cudaStreamGetDevice(cuda_stream)", __FILE__, __LINE__);
        if (sdev != cb->device)
            return cw__error(ctx, CW_ERR_INVALID_ARG,
                             "cw_context_set_cuda_stream: cuda_stream belongs to device %d, the context to device %d",
                             sdev, cb->device);
    }
    pthread_mutex_lock(&ctx->mu);
    cw__stream *s = ctx->streams[index];
    if (!s) {
        s = cw__calloc(1, sizeof *s);
        if (!s) {
            pthread_mutex_unlock(&ctx->mu);
            return cw__error(ctx, CW_ERR_OUT_OF_MEMORY, "cw_context_set_cuda_stream: out of host memory");
        }
        s->cs = us;
        s->owned = 0;
        int prev = -1;
        if (cw__enter(cb, &prev) == CW_OK) {
            cw__stream_scratch(cb, s);
            cw__leave(cb, prev);
        }
        ctx->streams[index] = s;
        pthread_mutex_unlock(&ctx->mu);
        return CW_OK;
    }
    /* Replace the handle inside the existing stream object (the allocator and plans hold
     * the object): everything queued on the old stream finishes first, so stream order
     * carries over. */
    cw__sync_count(cb, 1);
    cudaError_t e = cudaStreamSynchronize(s->cs);
    if (e == cudaSuccess && s->owned) e = cudaStreamDestroy(s->cs);
    if (e == cudaSuccess) {
        s->cs = us;
        s->owned = 0;
    }
    pthread_mutex_unlock(&ctx->mu);
    if (e != cudaSuccess) return cw__cuda_fail(ctx, e, "replacing the context's stream", __FILE__, __LINE__);
    return CW_OK;
}

cw_status cw_context_get_cuda_stream(cw_context *ctx, void **cuda_stream, int index) {
    if (cuda_stream) *cuda_stream = NULL;
    cw_status st = cw__cuda_ctx_check(ctx, index, "cw_context_get_cuda_stream");
    if (st != CW_OK) return st;
    if (!cuda_stream) return cw__error(ctx, CW_ERR_INVALID_ARG, "cw_context_get_cuda_stream: cuda_stream is NULL");
    cw__stream *s;
    if ((st = cw__context_stream(ctx, index, &s)) != CW_OK) return st;
    *cuda_stream = (void *)s->cs;
    return CW_OK;
}

cw_status cw_context_get_cuda_device(const cw_context *ctx, int *device) {
    if (!ctx || !device) return CW_ERR_INVALID_ARG;
    if (!ctx->be || ctx->be->i != &cw__cuda_iface) return CW_ERR_UNSUPPORTED;
    *device = cw__cb(ctx->be)->device;
    return CW_OK;
}
