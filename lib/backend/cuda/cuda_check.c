/* The failure side of the check macros in cuda_check.h: status mapping and the message
 * "call failed: error name (string) at file:line" recorded as the context's last error. */
#include "backend/cuda/cuda_check.h"

cw_status cw__cuda_status(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return CW_OK;
    case cudaErrorMemoryAllocation: return CW_ERR_OUT_OF_MEMORY;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
    case cudaErrorDevicesUnavailable:
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice: return CW_ERR_NO_DEVICE;
    case cudaErrorInvalidValue: return CW_ERR_INVALID_ARG;
    default: return CW_ERR_BACKEND;
    }
}

cw_status cw__cudnn_status(cudnnStatus_t s) {
    if (s == CUDNN_STATUS_SUCCESS) return CW_OK;
    if (s == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED || s == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED)
        return CW_ERR_OUT_OF_MEMORY;
    /* cuDNN 9 statuses are grouped by thousands: 2xxx bad parameter, 3xxx not supported. */
    switch ((int)s / 1000) {
    case 2: return CW_ERR_INVALID_ARG;
    case 3: return CW_ERR_UNSUPPORTED;
    default: break;
    }
    if (s == CUDNN_STATUS_NOT_INITIALIZED) return CW_ERR_NO_DEVICE;
    return CW_ERR_BACKEND;
}

cw_status cw__cublas_status(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return CW_OK;
    case CUBLAS_STATUS_ALLOC_FAILED: return CW_ERR_OUT_OF_MEMORY;
    case CUBLAS_STATUS_INVALID_VALUE: return CW_ERR_INVALID_ARG;
    case CUBLAS_STATUS_NOT_SUPPORTED:
    case CUBLAS_STATUS_ARCH_MISMATCH: return CW_ERR_UNSUPPORTED;
    case CUBLAS_STATUS_NOT_INITIALIZED: return CW_ERR_NO_DEVICE;
    default: return CW_ERR_BACKEND;
    }
}

cw_status cw__cuda_fail(cw_context *ctx, cudaError_t e, const char *call, const char *file, int line) {
    /* Clears the thread's last error so later calls do not report it again (sticky errors,
     * a broken context, stay: every later call then fails and says so). */
    (void)cudaGetLastError();
    return cw__error(ctx, cw__cuda_status(e), "%s failed: %s (%s) at %s:%d", call, cudaGetErrorName(e),
                     cudaGetErrorString(e), file, line);
}

cw_status cw__cudnn_fail(cw_context *ctx, cudnnStatus_t s, const char *call, const char *file, int line) {
    char why[256];
    cudnnGetLastErrorString(why, sizeof why);
    (void)cudaGetLastError();
    return cw__error(ctx, cw__cudnn_status(s), "%s failed: %s (%s) at %s:%d", call, cudnnGetErrorString(s),
                     why[0] ? why : "no reason given", file, line);
}

cw_status cw__cublas_fail(cw_context *ctx, cublasStatus_t s, const char *call, const char *file, int line) {
    (void)cudaGetLastError();
    return cw__error(ctx, cw__cublas_status(s), "%s failed: %s (%s) at %s:%d", call, cublasGetStatusName(s),
                     cublasGetStatusString(s), file, line);
}
