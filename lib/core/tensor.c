/* User-facing tensors: device memory the context allocates (outside the temp budget) or
 * caller memory it wraps; synchronous upload/download at run boundaries. */
#include <inttypes.h>
#include <string.h>

#include "backend/backend.h"
#include "core/core.h"

static cw_status cw__desc_check(cw_context *ctx, const cw_tensor_desc *d, const char *what) {
    if (!d) return cw__error(ctx, CW_ERR_INVALID_ARG, "%s: desc is NULL", what);
    if (d->rank < 1 || d->rank > CW_MAX_RANK)
        return cw__error(ctx, CW_ERR_INVALID_ARG, "%s: rank %d outside 1..%d", what, d->rank, CW_MAX_RANK);
    if (cw_dtype_size(d->dtype) == 0)
        return cw__error(ctx, CW_ERR_INVALID_ARG, "%s: dtype %d is not a cw_dtype", what, (int)d->dtype);
    for (int i = 0; i < d->rank; i++) {
        if (d->dims[i] < 1)
            return cw__error(ctx, CW_ERR_INVALID_ARG, "%s: dims[%d] = %" PRId64 " < 1", what, i, d->dims[i]);
        if (d->strides[i] < 0)
            return cw__error(ctx, CW_ERR_INVALID_ARG, "%s: strides[%d] = %" PRId64 " < 0", what, i, d->strides[i]);
    }
    return CW_OK;
}

static cw_status cw__tensor_new(cw_context *ctx, cw_tensor **out, const cw_tensor_desc *desc, const char *what) {
    if (!ctx || !out) return CW_ERR_INVALID_ARG;
    *out = NULL;
    CW_TRY(cw__desc_check(ctx, desc, what));
    cw_tensor *t = cw__calloc(1, sizeof *t);
    if (!t) return cw__error(ctx, CW_ERR_OUT_OF_MEMORY, "%s: out of host memory", what);
    t->ctx = ctx;
    t->desc = *desc;
    for (int i = t->desc.rank; i < CW_MAX_RANK; i++) t->desc.dims[i] = 0, t->desc.strides[i] = 0;
    cw__desc_fill_strides(&t->desc);
    *out = t;
    return CW_OK;
}

cw_status cw_tensor_create(cw_tensor **out, cw_context *ctx, const cw_tensor_desc *desc) {
    CW_TRY(cw__tensor_new(ctx, out, desc, "cw_tensor_create"));
    cw_tensor *t = *out;
    int64_t bytes = cw__desc_span_bytes(&t->desc);
    cw_status st = ctx->be->rt->dev_alloc(ctx->be, bytes, &t->data);
    if (st != CW_OK) {
        cw__free(t);
        *out = NULL;
        char buf[96];
        return cw__error(ctx, st, "cw_tensor_create: cannot allocate %" PRId64 " bytes for %s", bytes,
                         cw__dims_str(desc, buf, sizeof buf));
    }
    t->owned = 1;
    return CW_OK;
}

cw_status cw_tensor_wrap(cw_tensor **out, cw_context *ctx, const cw_tensor_desc *desc, void *data) {
    if (!data) return cw__error(ctx, CW_ERR_INVALID_ARG, "cw_tensor_wrap: data is NULL");
    CW_TRY(cw__tensor_new(ctx, out, desc, "cw_tensor_wrap"));
    (*out)->data = data;
    return CW_OK;
}

void cw_tensor_destroy(cw_tensor *t) {
    if (!t) return;
    if (t->owned && t->data) t->ctx->be->rt->dev_free(t->ctx->be, t->data);
    cw__free(t);
}

const cw_tensor_desc *cw_tensor_get_desc(const cw_tensor *t) { return t ? &t->desc : NULL; }
void *cw_tensor_get_data(const cw_tensor *t) { return t ? t->data : NULL; }

static cw_status cw__copy_check(const cw_tensor *t, int64_t bytes, const char *what) {
    if (!t) return CW_ERR_INVALID_ARG;
    if (!cw__desc_is_contiguous(&t->desc))
        return cw__error(t->ctx, CW_ERR_UNSUPPORTED, "%s: tensor is a strided view; only contiguous tensors", what);
    int64_t want = cw__desc_numel(&t->desc) * (int64_t)cw_dtype_size(t->desc.dtype);
    if (bytes != want)
        return cw__error(t->ctx, CW_ERR_INVALID_ARG, "%s: bytes = %" PRId64 ", tensor holds %" PRId64, what, bytes,
                         want);
    return CW_OK;
}

cw_status cw_tensor_upload(cw_tensor *t, const void *host, int64_t bytes) {
    CW_TRY(cw__copy_check(t, bytes, "cw_tensor_upload"));
    if (!host) return cw__error(t->ctx, CW_ERR_INVALID_ARG, "cw_tensor_upload: host is NULL");
    return t->ctx->be->rt->upload(t->ctx->be, t->data, host, bytes);
}

cw_status cw_tensor_download(const cw_tensor *t, void *host, int64_t bytes) {
    CW_TRY(cw__copy_check(t, bytes, "cw_tensor_download"));
    if (!host) return cw__error(t->ctx, CW_ERR_INVALID_ARG, "cw_tensor_download: host is NULL");
    return t->ctx->be->rt->download(t->ctx->be, host, t->data, bytes);
}
