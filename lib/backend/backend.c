/* Backend selection glue: what exists when the library is built without CUDA. */
#include "backend/backend.h"

#ifndef CW_HAVE_CUDA
int cw__backend_cuda_compiled(void) { return 0; }

cw_status cw__backend_cuda_create(cw_context *ctx, const cw_context_config *cfg, cw__backend **out) {
    (void)cfg;
    *out = NULL;
    return cw__error(ctx, CW_ERR_NO_DEVICE, "backend cuda: convweave was built without CUDA (CONVWEAVE_CUDA=OFF)");
}
#endif
