/* What exists of the cuda backend when the library is built without CUDA: its
 * constructor, which says so. (Backend selection is cw__pick_backend in core/context.c.) */
#include "backend/backend.h"

#ifndef CW_HAVE_CUDA
int cw__backend_cuda_compiled(void) { return 0; }

cw_status cw__backend_cuda_create(cw_context *ctx, const cw_context_config *cfg, cw__backend **out) {
    (void)cfg;
    *out = NULL;
    return cw__error(ctx, CW_ERR_NO_DEVICE, "backend cuda: convweave was built without CUDA (CONVWEAVE_CUDA=OFF)");
}
#else
typedef int cw__backend_c_unused; /* ISO C: a translation unit is never empty */
#endif
