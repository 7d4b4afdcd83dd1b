/* Backend selection glue: what exists when the library is built without CUDA. */
#include "backend/backend.h"

#ifndef CW_HAVE_CUDA
#include "convweave/convweave_cuda.h"

int cw__backend_cuda_compiled(void) { return 0; }

cw_status cw_context_set_cuda_stream(cw_context *ctx, int index, void *s) {
    (void)index, (void)s;
    return ctx ? cw__error(ctx, CW_ERR_UNSUPPORTED, "cw_context_set_cuda_stream: convweave was built without CUDA")
               : CW_ERR_INVALID_ARG;
}

cw_status cw_context_get_cuda_stream(cw_context *ctx, void **s, int index) {
    (void)index;
    if (s) *s = NULL;
    return ctx ? cw__error(ctx, CW_ERR_UNSUPPORTED, "cw_context_get_cuda_stream: convweave was built without CUDA")
               : CW_ERR_INVALID_ARG;
}

cw_status cw_context_get_cuda_device(const cw_context *ctx, int *d) {
    (void)d;
    return ctx ? CW_ERR_UNSUPPORTED : CW_ERR_INVALID_ARG;
}

cw_status cw__backend_cuda_create(cw_context *ctx, const cw_context_config *cfg, cw__backend **out) {
    (void)cfg;
    *out = NULL;
    return cw__error(ctx, CW_ERR_NO_DEVICE, "backend cuda: convweave was built without CUDA (CONVWEAVE_CUDA=OFF)");
}
#endif
