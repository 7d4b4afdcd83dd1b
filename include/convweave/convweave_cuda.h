/* convweave CUDA interop: run a context's work on the caller's CUDA streams and hand
 * caller device memory to the library. Only for contexts on the cuda backend; every call
 * returns CW_ERR_UNSUPPORTED on a cpu context. Streams are passed as void * holding a
 * cudaStream_t, so this header needs no CUDA include path. */
#ifndef CONVWEAVE_CUDA_H
#define CONVWEAVE_CUDA_H

#include "convweave/convweave.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Context flags (cw_context_config.flags) for the cuda backend, beside CW_FLAG_*; a cpu
 * context ignores them.
 * - CW_FLAG_CUDA_TF32: f32 convolutions may use TF32 tensor-core engines and f32 GEMMs TF32
 *   tensor-core math. Several times faster on Ampere and Hopper for f32 data, at about 1e-3
 *   relative error instead of 1e-5 (TF32 keeps 10 mantissa bits of each product's inputs).
 *   Off by default: f32 then stays f32 end to end. Results stay deterministic either way.
 * - CW_FLAG_CUDA_AUTOTUNE: where the scheduler asks for it, time the fastest few engines
 *   that fit a convolution's workspace once at compile time (on scratch memory of their
 *   own) and keep the fastest, instead of cuDNN's heuristic order. Two compilations may
 *   then pick different engines (bitwise different results); one plan never changes. */
enum {
    CW_FLAG_CUDA_TF32 = 1u << 16,
    CW_FLAG_CUDA_AUTOTUNE = 1u << 17
};

/* Device memory: cw_tensor_wrap(&t, ctx, desc, ptr) wraps a pointer the caller allocated
 * (cudaMalloc, cudaMallocAsync, a pool, or managed memory) on the context's device; the
 * library neither frees nor copies it, and the caller keeps it alive while any plan or
 * call uses t. Any element-aligned pointer works; a 16-byte aligned one lets cuDNN choose
 * among more (faster) engines. Wrapped tensors may be strided views (desc strides). */

/* Makes the context's stream `index` (0 .. 7; plans run their first heavy stream, or
 * everything with streams = 1, on stream 0) enqueue on cuda_stream, a cudaStream_t of
 * the context's device (NULL is CUDA's legacy default stream). Work the context had
 * queued on its previous stream `index` is waited for first (a host synchronisation), so
 * call this once at setup. The caller keeps ownership of cuda_stream and must keep it
 * alive until the context is destroyed or the stream replaced. Library calls still wait
 * for their own work before returning (cw_plan_run waits once at its end); to order
 * caller work after the library's without that, enqueue it on the same stream.
 * Returns CW_ERR_INVALID_ARG for a stream of another device or an index out of range,
 * CW_ERR_UNSUPPORTED on a non-cuda context. */
CW_API cw_status cw_context_set_cuda_stream(cw_context *ctx, int index, void *cuda_stream);

/* The cudaStream_t (as void *) behind the context's stream `index`, created on first use.
 * Stays owned by the context (or by the caller who set it). Takes (ctx, index, stream) in
 * the order of cw_context_set_cuda_stream: a stream slot of the context is addressed
 * right after the context in both directions. Returns CW_ERR_INVALID_ARG for an index out
 * of range or a NULL cuda_stream, CW_ERR_UNSUPPORTED on a non-cuda context. */
CW_API cw_status cw_context_get_cuda_stream(cw_context *ctx, int index, void **cuda_stream);

/* The CUDA device index the context runs on. Returns CW_ERR_INVALID_ARG for a NULL
 * argument, CW_ERR_UNSUPPORTED on a non-cuda context. */
CW_API cw_status cw_context_get_cuda_device(const cw_context *ctx, int *device);

#ifdef __cplusplus
}
#endif
#endif /* CONVWEAVE_CUDA_H */
