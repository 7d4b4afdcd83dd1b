/* convweave CUDA interop: run a context's work on the caller's CUDA streams, hand caller
 * device memory to the library, and split a plan across processes over NCCL. The context
 * calls are for contexts on the cuda backend (CW_ERR_UNSUPPORTED on a cpu context). Streams
 * and NCCL communicators are passed as void * (a cudaStream_t, an ncclComm_t), so this
 * header needs no CUDA or NCCL include path. */
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

/* ---------------------------------------------------------------------------------------
 * NCCL communicator (cw_comm over an ncclComm_t the caller made: ncclCommInitRank,
 * ncclCommInitAll, or torch's). Present in every build; without NCCL (CONVWEAVE_NCCL=OFF,
 * or nccl.h / libnccl not found) cw_comm_nccl_init returns CW_ERR_UNSUPPORTED. The library
 * does not link libnccl: the first cw_comm_nccl_init opens libnccl.so.2 by name (so the copy
 * already in the process, the one that made the ncclComm_t, is used), else the library
 * found at build time; CW_ERR_UNSUPPORTED, naming why, when neither loads.
 *
 * Transfers. One message is one strided view (a band of rows of an NCHW(D) tensor: N*C(*D)
 * runs of rows*W elements at a constant stride). NCCL moves contiguous buffers only, so the
 * message travels as the view's elements in row-major order of its dims, cut into pieces of
 * at most CW_COMM_NCCL_PIECE_BYTES (8 MiB): along the outermost dim whose inner block fits,
 * so both sides cut alike from dims alone, whatever each side's strides. A piece that is
 * contiguous in the caller's memory goes straight to ncclSend / ncclRecv; any other is
 * packed into (or unpacked from) a staging buffer by cudaMemcpy2DAsync on the same stream:
 * a band of an NCHW(D) tensor folds to one 2-D copy per piece, and the copy is bit-exact
 * (-0.0 and NaN payloads included). Chosen over one ncclSend per contiguous run in a group:
 * the two sides' runs differ when their strides differ (a rank's band plus halos is not the
 * sender's full tensor), N*C runs of a few KiB each are hundreds of tiny NCCL operations per
 * halo, and the staging stays bounded.
 * Staging memory: one buffer per call, min(message bytes, 8 MiB), taken with
 * cudaMallocAsync on the call's stream from the device's default memory pool and given back
 * with cudaFreeAsync on the same stream after the call's last piece, so it lives only while
 * that transfer is in flight and stream order keeps calls on several streams apart; none
 * for a message whose pieces are all contiguous on an enqueued call. It is outside the
 * plan's temporary budget: count up to 8 MiB per stream that runs transfers.
 *
 * Streams. stream != NULL: everything is enqueued on that cudaStream_t (the plan's comm
 * stream) and the call returns at once. stream NULL (cw_graph_compile's configuration check,
 * small host arrays): data is host memory (device memory works too); the call stages through
 * device memory on a stream of the communicator's own, waits for it, and gives up after
 * CW_COMM_NCCL_TIMEOUT_S seconds (then the ncclComm_t is likely stuck: its owner should
 * ncclCommAbort it). An enqueued transfer whose peer died shows up where the stream is waited
 * for; NCCL's asynchronous error (ncclCommGetAsyncError) is checked at every call.
 *
 * Tags: NCCL matches the point-to-point messages between two ranks in the order they are
 * posted, and every rank makes its calls in one global order (see "Across processes"), so
 * that order is the tags' order; a tag appears in error messages only.
 *
 * Rules: the calls of one communicator are serialised by a lock of its own (NCCL
 * communicators are not thread-safe); they set the communicator's CUDA device for their
 * duration and restore the caller's; they must not be made between ncclGroupStart and
 * ncclGroupEnd (a send's staging would be unpacked or freed before the deferred operation
 * runs). Errors of NCCL (ncclResult_t) and CUDA (cudaError_t) calls return CW_ERR_COMM; the
 * message (the call, NCCL's or CUDA's error string, ncclGetLastError's detail, peer, tag)
 * is kept by the communicator (cw_comm_nccl_get_last_error) and logged at warn to stderr. */
#define CW_COMM_NCCL_PIECE_BYTES ((int64_t)8 << 20)
#define CW_COMM_NCCL_TIMEOUT_S 600

/* Fills *out with a communicator for this process's rank of nccl_comm (an ncclComm_t as
 * void *, borrowed: the caller keeps it alive until cw_comm_nccl_destroy and destroys it
 * after). rank and n_ranks must match ncclCommUserRank and ncclCommCount. Allocates host
 * state, a CUDA stream on the communicator's device (for stream-NULL calls), and nothing
 * else; cw_comm_nccl_destroy frees them. On failure *out is zeroed (so destroying it is a
 * no-op) and the message goes to the log (there is no context). Returns CW_ERR_INVALID_ARG
 * for a NULL out or nccl_comm, n_ranks < 1, rank outside 0 .. n_ranks - 1, or a rank or
 * rank count that differs from nccl_comm's; CW_ERR_UNSUPPORTED when convweave was built
 * without NCCL or libnccl cannot be loaded; CW_ERR_COMM when NCCL or CUDA fails;
 * CW_ERR_OUT_OF_MEMORY. */
CW_API cw_status cw_comm_nccl_init(cw_comm *out, void *nccl_comm, int rank, int n_ranks);
/* Frees what cw_comm_nccl_init allocated and zeroes *comm; leaves the ncclComm_t alone.
 * Call it after every plan compiled with comm is destroyed. Accepts NULL and a zeroed
 * cw_comm; a cw_comm not filled by cw_comm_nccl_init is left untouched. */
CW_API void cw_comm_nccl_destroy(cw_comm *comm);
/* The message of comm's last failed call ("" when none, or comm is not an NCCL
 * communicator). The returned string is this thread's copy, valid until its next call. */
CW_API const char *cw_comm_nccl_get_last_error(const cw_comm *comm);

#ifdef __cplusplus
}
#endif
#endif /* CONVWEAVE_CUDA_H */
