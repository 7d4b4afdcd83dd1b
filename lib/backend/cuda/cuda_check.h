/* Check macros for CUDA runtime, cuDNN and cuBLAS calls (NCCL's CUDACHECK / CUDACHECKGOTO):
 * a failed call records `#call`, the library's error string and file:line as the context's
 * last error, clears the (non-sticky) CUDA error state and returns a status or jumps to a
 * cleanup label. Library code never exits or aborts on these. */
#ifndef CW_CUDA_CHECK_H
#define CW_CUDA_CHECK_H

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include "core/core.h"

/* The status a failure maps to: out-of-memory and no-device are told apart, bad
 * parameters (cuDNN rejecting a shape) are invalid arguments, the rest backend errors. */
cw_status cw__cuda_status(cudaError_t e);
cw_status cw__cudnn_status(cudnnStatus_t s);
cw_status cw__cublas_status(cublasStatus_t s);

/* Record the failure of `call` in ctx (may be NULL) and return the mapped status. The
 * cuDNN variant appends cudnnGetLastErrorString (the reason cuDNN gives). */
cw_status cw__cuda_fail(cw_context *ctx, cudaError_t e, const char *call, const char *file, int line);
cw_status cw__cudnn_fail(cw_context *ctx, cudnnStatus_t s, const char *call, const char *file, int line);
cw_status cw__cublas_fail(cw_context *ctx, cublasStatus_t s, const char *call, const char *file, int line);

#define CW__CUDA_CHECK(ctx, call)                                                  \
    do {                                                                           \
        cudaError_t cw_e_ = (call);                                                \
        if (cw_e_ != cudaSuccess) return cw__cuda_fail((ctx), cw_e_, #call, __FILE__, __LINE__); \
    } while (0)

#define CW__CUDA_GOTO(ctx, st, label, call)                                       \
    do {                                                                          \
        cudaError_t cw_e_ = (call);                                               \
        if (cw_e_ != cudaSuccess) {                                               \
            (st) = cw__cuda_fail((ctx), cw_e_, #call, __FILE__, __LINE__);        \
            goto label;                                                           \
        }                                                                         \
    } while (0)

#define CW__CUDNN_CHECK(ctx, call)                                                  \
    do {                                                                            \
        cudnnStatus_t cw_s_ = (call);                                               \
        if (cw_s_ != CUDNN_STATUS_SUCCESS) return cw__cudnn_fail((ctx), cw_s_, #call, __FILE__, __LINE__); \
    } while (0)

#define CW__CUDNN_GOTO(ctx, st, label, call)                                      \
    do {                                                                          \
        cudnnStatus_t cw_s_ = (call);                                             \
        if (cw_s_ != CUDNN_STATUS_SUCCESS) {                                      \
            (st) = cw__cudnn_fail((ctx), cw_s_, #call, __FILE__, __LINE__);       \
            goto label;                                                           \
        }                                                                         \
    } while (0)

#define CW__CUBLAS_CHECK(ctx, call)                                                  \
    do {                                                                             \
        cublasStatus_t cw_b_ = (call);                                               \
        if (cw_b_ != CUBLAS_STATUS_SUCCESS) return cw__cublas_fail((ctx), cw_b_, #call, __FILE__, __LINE__); \
    } while (0)

#define CW__CUBLAS_GOTO(ctx, st, label, call)                                     \
    do {                                                                          \
        cublasStatus_t cw_b_ = (call);                                            \
        if (cw_b_ != CUBLAS_STATUS_SUCCESS) {                                     \
            (st) = cw__cublas_fail((ctx), cw_b_, #call, __FILE__, __LINE__);      \
            goto label;                                                           \
        }                                                                         \
    } while (0)

#endif
