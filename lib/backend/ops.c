/* The checks in front of the backends' op hooks (the libuv pattern: uv_* checks, uv__*
 * trusts). The scheduler and the tests call cw__op_*; a check lives here once instead of
 * once per backend, where copies drift. */
#include "backend/backend.h"
#include "kernels/kernels.h"

static int cw__dtype_known(cw_dtype dt) { return dt == CW_F32 || dt == CW_F16 || dt == CW_BF16; }

cw_status cw__op_channel(cw__backend *be, cw__stream *s, const cw__channel_params *p) {
    cw_context *ctx = be->ctx;
    char b1[96], b2[96];
    if (!p) return cw__error(ctx, CW_ERR_INVALID_ARG, "channel op: params are NULL");
    if (p->op < 0 || p->op >= CW_CHANNEL_OP_COUNT)
        return cw__error(ctx, CW_ERR_INVALID_ARG, "channel op: op = %d is not a CW_CHANNEL_* code", p->op);
    const cw_tensor_desc *dd = &p->dst.d, *xd = &p->x.d;
    int same = dd->rank == xd->rank && dd->dtype == xd->dtype && dd->rank >= 2 && dd->rank <= CW_MAX_RANK &&
               cw__dtype_known(dd->dtype);
    for (int i = 0; same && i < dd->rank; i++) same = dd->dims[i] == xd->dims[i] && dd->dims[i] >= 0;
    if (!same)
        return cw__error(ctx, CW_ERR_INVALID_ARG,
                         "channel op: dst %s (dtype %d) and x %s (dtype %d) must have equal dims and dtype, rank 2..5",
                         cw__dims_str(dd, b1, sizeof b1), (int)dd->dtype, cw__dims_str(xd, b2, sizeof b2),
                         (int)xd->dtype);
    if (cw__desc_numel(dd) > 0 && (!p->dst.data || !p->x.data || !p->v))
        return cw__error(ctx, CW_ERR_INVALID_ARG, "channel op: dst, x and v must not be NULL");
    if (!be->i->channel_op)
        return cw__error(ctx, CW_ERR_UNSUPPORTED, "channel op: the %s backend runs no ops", be->i->name);
    return be->i->channel_op(be, s, p);
}
