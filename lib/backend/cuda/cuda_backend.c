/* The cuda backend's runtime on the CUDA runtime API (non-blocking streams, events,
 * cudaMalloc'd memory for the budgeted allocator, async copies), its creation, and the
 * hooks behind include/convweave/convweave_cuda.h (stream_adopt, device_index: the context
 * calls them, this file never calls the context); its ops are in cuda_ops.c. The library
 * links libcudart dynamically and calls nothing at load time, so it loads without a
 * driver; creation then reports no device. host_syncs counts every call that may stall
 * the device or the host: cudaMalloc, cudaFree, stream/event synchronisation, synchronous
 * copies, and cuDNN plans finalised inside a run. */
#include <inttypes.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_internal.h"
#include "convweave/convweave_cuda.h"
#include "kernels/kernels.h"

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

/* A user allocator (cw_allocator) is given the CUDA stream itself: the caller's stream
 * where cw_context_set_cuda_stream set one, which PyTorch's allocator knows. */
static void *cuda_stream_handle(cw__backend *be, cw__stream *s) {
    (void)be;
    return (void *)s->cs;
}

/* The stream_adopt hook (cw_context_set_cuda_stream, under the context's lock; errors go
 * through cw__error, which takes the context's error lock only). */
static cw_status cuda_stream_adopt(cw__backend *be, void *handle, cw__stream **sp) {
    cw__cuda *cb = cw__cb(be);
    cudaStream_t us = (cudaStream_t)handle;
    int sdev = -1;
    /* A stream of another device would fail at the first launch; say so now. */
    if (us) {
        cudaError_t e = cudaStreamGetDevice(us, &sdev);
        if (e != cudaSuccess) return cw__cuda_fail(be->ctx, e, "cudaStreamGetDevice(cuda_stream)", __FILE__, __LINE__);
        if (sdev != cb->device)
            return cw__error(be->ctx, CW_ERR_INVALID_ARG,
                             "cw_context_set_cuda_stream: cuda_stream belongs to device %d, the context to device %d",
                             sdev, cb->device);
    }
    cw__stream *s = *sp;
    if (!s) {
        s = cw__calloc(1, sizeof *s);
        if (!s) return cw__error(be->ctx, CW_ERR_OUT_OF_MEMORY, "cw_context_set_cuda_stream: out of host memory");
        s->cs = us;
        s->owned = 0;
        int prev = -1;
        if (cw__enter(cb, &prev) == CW_OK) {
            cw__stream_scratch(cb, s);
            cw__leave(cb, prev);
        }
        *sp = s;
        return CW_OK;
    }
    /* Replace the handle inside the existing stream object (the allocator and plans hold
     * the object): everything queued on the old stream finishes first, so stream order
     * carries over. */
    cw__sync_count(cb, 1);
    cudaError_t e = cudaStreamSynchronize(s->cs);
    if (e == cudaSuccess && s->owned) e = cudaStreamDestroy(s->cs);
    if (e != cudaSuccess) return cw__cuda_fail(be->ctx, e, "replacing the context's stream", __FILE__, __LINE__);
    s->cs = us;
    s->owned = 0;
    return CW_OK;
}

static cw_status cuda_device_index(cw__backend *be, int *out) {
    *out = cw__cb(be)->device;
    return CW_OK;
}

static const cw__runtime_i cw__cuda_rt = {
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
    .stream_handle = cuda_stream_handle,
    .stream_adopt = cuda_stream_adopt,
    .device_index = cuda_device_index,
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
    cb->base.rt = &cw__cuda_rt;
    cb->base.ops = &cw__cuda_ops;
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
