/* Convolution parameter validation shared by the graph builder and the one-call API, and
 * the public cw_conv_output_desc. Every rejection is CW_ERR_INVALID_ARG with a message
 * that names the field, its value and the shapes involved. */
#include <stdio.h>
#include <string.h>

#include "scheduler/planner.h"

#define DIM_MAX (INT64_C(1) << 40) /* elements; far beyond any real tensor, keeps math exact */

static int dt_known(cw_dtype dt) { return dt == CW_F32 || dt == CW_F16 || dt == CW_BF16; }

/* Checks a descriptor's rank, dims and strides; name is "x", "w", "b" or "y". */
static cw_status check_desc(cw_context *ctx, const cw_tensor_desc *d, const char *name, int out) {
    char s[96];
    if (d->rank < 1 || d->rank > CW_MAX_RANK)
        return cw__error(ctx, CW_ERR_INVALID_ARG, "conv: %s.rank=%d is outside 1..%d", name, d->rank, CW_MAX_RANK);
    if (!dt_known(d->dtype))
        return cw__error(ctx, CW_ERR_INVALID_ARG, "conv: %s.dtype=%d is not a cw_dtype", name, (int)d->dtype);
    int64_t numel = 1;
    for (int i = 0; i < d->rank; i++) {
        if (d->dims[i] < 1 || d->dims[i] > DIM_MAX)
            return cw__error(ctx, CW_ERR_INVALID_ARG, "conv: %s.dims[%d]=%lld is outside 1..2^40 (%s: %s)", name, i,
                             (long long)d->dims[i], name, cw__dims_str(d, s, sizeof s));
        if (__builtin_mul_overflow(numel, d->dims[i], &numel) || numel > (INT64_C(1) << 60))
            return cw__error(ctx, CW_ERR_INVALID_ARG, "conv: %s has too many elements (%s: %s)", name, name,
                             cw__dims_str(d, s, sizeof s));
    }
    int any = 0;
    for (int i = 0; i < d->rank; i++) any |= d->strides[i] != 0;
    if (any) {
        for (int i = 0; i < d->rank; i++) {
            if (d->strides[i] < 0 || d->strides[i] > (INT64_C(1) << 60))
                return cw__error(ctx, CW_ERR_INVALID_ARG, "conv: %s.strides[%d]=%lld is negative or too large", name,
                                 i, (long long)d->strides[i]);
            /* A zero stride broadcasts: fine to read, but output elements would alias. */
            if (out && d->strides[i] == 0 && d->dims[i] > 1)
                return cw__error(ctx, CW_ERR_INVALID_ARG,
                                 "conv: %s.strides[%d]=0 with %s.dims[%d]=%lld would make output elements alias",
                                 name, i, name, i, (long long)d->dims[i]);
        }
    }
    return CW_OK;
}

/* Spatial dim i: stride, dilation, paddings in range and the kernel within the padded
 * input; *out gets the output extent. */
static cw_status check_spatial(cw_context *ctx, const cw_tensor_desc *x, const cw_tensor_desc *w,
                               const cw_conv_params *p, int i, int64_t *out) {
    const int64_t s = p->stride[i], d = p->dilation[i], pre = p->pad_pre[i], post = p->pad_post[i];
    const int64_t in = x->dims[2 + i], k = w->dims[2 + i];
    if (s < 1 || s > DIM_MAX)
        return cw__error(ctx, CW_ERR_INVALID_ARG, "conv: params.stride[%d]=%lld must be in 1..2^40", i, (long long)s);
    if (d < 1 || d > DIM_MAX)
        return cw__error(ctx, CW_ERR_INVALID_ARG, "conv: params.dilation[%d]=%lld must be in 1..2^40", i,
                         (long long)d);
    if (pre < 0 || pre > DIM_MAX)
        return cw__error(ctx, CW_ERR_INVALID_ARG, "conv: params.pad_pre[%d]=%lld must be in 0..2^40", i,
                         (long long)pre);
    if (post < 0 || post > DIM_MAX)
        return cw__error(ctx, CW_ERR_INVALID_ARG, "conv: params.pad_post[%d]=%lld must be in 0..2^40", i,
                         (long long)post);
    int64_t eff; /* d*(k-1)+1 <= 2^80 may overflow: check */
    if (__builtin_mul_overflow(d, k - 1, &eff) || eff > (INT64_C(1) << 62))
        return cw__error(ctx, CW_ERR_INVALID_ARG, "conv: kernel w.dims[%d]=%lld with dilation[%d]=%lld is too large",
                         2 + i, (long long)k, i, (long long)d);
    eff += 1;
    const int64_t padded = in + pre + post;
    if (eff > padded)
        return cw__error(ctx, CW_ERR_INVALID_ARG,
                         "conv: effective kernel %lld (w.dims[%d]=%lld, dilation[%d]=%lld) exceeds the padded input "
                         "%lld (x.dims[%d]=%lld + pad_pre[%d]=%lld + pad_post[%d]=%lld)",
                         (long long)eff, 2 + i, (long long)k, i, (long long)d, (long long)padded, 2 + i,
                         (long long)in, i, (long long)pre, i, (long long)post);
    *out = (padded - eff) / s + 1;
    return CW_OK;
}

/* y: a valid descriptor of x's dtype and exactly the expected output dims yo. */
static cw_status check_y(cw_context *ctx, const cw_tensor_desc *x, const cw_tensor_desc *w, const cw_tensor_desc *y,
                         const cw_tensor_desc *yo) {
    char xs[96], ws[96], ys[96];
    const int rank = yo->rank;
    CW_TRY(check_desc(ctx, y, "y", 1));
    if (y->dtype != x->dtype)
        return cw__error(ctx, CW_ERR_INVALID_ARG, "conv: y.dtype=%s differs from x.dtype=%s", cw__dtype_name(y->dtype),
                         cw__dtype_name(x->dtype));
    if (y->rank != rank)
        return cw__error(ctx, CW_ERR_INVALID_ARG, "conv: y.rank=%d, expected %d (y: %s)", y->rank, rank,
                         cw__dims_str(y, ys, sizeof ys));
    for (int i = 0; i < rank; i++) {
        if (y->dims[i] != yo->dims[i]) {
            char es[96];
            return cw__error(ctx, CW_ERR_INVALID_ARG,
                             "conv: y.dims[%d]=%lld, expected %lld: y %s does not match the output %s of x %s, w %s",
                             i, (long long)y->dims[i], (long long)yo->dims[i], cw__dims_str(y, ys, sizeof ys),
                             cw__dims_str(yo, es, sizeof es), cw__dims_str(x, xs, sizeof xs),
                             cw__dims_str(w, ws, sizeof ws));
        }
    }
    return CW_OK;
}

cw_status cw__conv_validate(cw_context *ctx, const cw_tensor_desc *x, const cw_tensor_desc *w,
                            const cw_tensor_desc *b, const cw_tensor_desc *y, const cw_conv_params *p,
                            cw_tensor_desc *y_expected_out) {
    char xs[96], ws[96], ys[96];
    if (!p) return cw__error(ctx, CW_ERR_INVALID_ARG, "conv: params is NULL");
    if (!x || !w) return cw__error(ctx, CW_ERR_INVALID_ARG, "conv: %s descriptor is NULL", !x ? "x" : "w");
    if (p->size != sizeof(cw_conv_params))
        return cw__error(ctx, CW_ERR_INVALID_ARG,
                         "conv: params.size=%zu, expected %zu (initialise with CW_CONV_PARAMS_INIT)", p->size,
                         sizeof(cw_conv_params));
    if (p->version != CW_CONV_PARAMS_VERSION)
        return cw__error(ctx, CW_ERR_INVALID_ARG, "conv: params.version=%d, expected %d", p->version,
                         CW_CONV_PARAMS_VERSION);
    if (p->spatial != 2 && p->spatial != 3)
        return cw__error(ctx, CW_ERR_INVALID_ARG, "conv: params.spatial=%d must be 2 or 3", p->spatial);
    const int sp = p->spatial, rank = sp + 2;
    CW_TRY(check_desc(ctx, x, "x", 0));
    CW_TRY(check_desc(ctx, w, "w", 0));
    if (x->rank != rank)
        return cw__error(ctx, CW_ERR_INVALID_ARG, "conv: x.rank=%d but params.spatial=%d needs rank %d (x: %s)", x->rank,
                         sp, rank, cw__dims_str(x, xs, sizeof xs));
    if (w->rank != rank)
        return cw__error(ctx, CW_ERR_INVALID_ARG, "conv: w.rank=%d but params.spatial=%d needs rank %d (w: %s)", w->rank,
                         sp, rank, cw__dims_str(w, ws, sizeof ws));
    if (w->dtype != x->dtype)
        return cw__error(ctx, CW_ERR_INVALID_ARG, "conv: w.dtype=%s differs from x.dtype=%s", cw__dtype_name(w->dtype),
                         cw__dtype_name(x->dtype));
    cw__dims_str(x, xs, sizeof xs);
    cw__dims_str(w, ws, sizeof ws);

    const int64_t C = x->dims[1], K = w->dims[0], G = p->groups;
    if (G < 1) return cw__error(ctx, CW_ERR_INVALID_ARG, "conv: params.groups=%lld must be >= 1", (long long)G);
    if (C % G)
        return cw__error(ctx, CW_ERR_INVALID_ARG, "conv: groups=%lld does not divide input channels C=%lld (x: %s)",
                         (long long)G, (long long)C, xs);
    if (K % G)
        return cw__error(ctx, CW_ERR_INVALID_ARG, "conv: groups=%lld does not divide output channels K=%lld (w: %s)",
                         (long long)G, (long long)K, ws);
    if (w->dims[1] * G != C)
        return cw__error(ctx, CW_ERR_INVALID_ARG,
                         "conv: w.dims[1]=%lld * groups=%lld != input channels C=%lld (x: %s, w: %s)",
                         (long long)w->dims[1], (long long)G, (long long)C, xs, ws);

    cw_tensor_desc yo;
    memset(&yo, 0, sizeof yo);
    yo.dtype = x->dtype;
    yo.rank = rank;
    yo.dims[0] = x->dims[0];
    yo.dims[1] = K;
    for (int i = 0; i < sp; i++)
        CW_TRY(check_spatial(ctx, x, w, p, i, &yo.dims[2 + i]));

    if (b) {
        CW_TRY(check_desc(ctx, b, "b", 0));
        if (b->dtype != x->dtype)
            return cw__error(ctx, CW_ERR_INVALID_ARG, "conv: b.dtype=%s differs from x.dtype=%s", cw__dtype_name(b->dtype),
                             cw__dtype_name(x->dtype));
        if (b->rank != 1 || b->dims[0] != K)
            return cw__error(ctx, CW_ERR_INVALID_ARG, "conv: bias b.dims %s must be [K] = [%lld] (w: %s)",
                             cw__dims_str(b, ys, sizeof ys), (long long)K, ws);
    }
    if (y) CW_TRY(check_y(ctx, x, w, y, &yo));
    if (y_expected_out) *y_expected_out = yo;
    return CW_OK;
}

CW_API cw_status cw_conv_output_desc(cw_context *ctx, cw_tensor_desc *y, const cw_tensor_desc *x,
                                     const cw_tensor_desc *w, const cw_conv_params *p) {
    if (!y) return cw__error(ctx, CW_ERR_INVALID_ARG, "cw_conv_output_desc: y (output) is NULL");
    return cw__conv_validate(ctx, x, w, NULL, NULL, p, y);
}

void cw__conv_problem_init(cw__conv_problem *out, const cw_tensor_desc *x, const cw_tensor_desc *w, int has_bias,
                           const cw_tensor_desc *y, const cw_conv_params *p) {
    memset(out, 0, sizeof *out);
    out->x = *x;
    out->w = *w;
    out->y = *y;
    cw__desc_fill_strides(&out->x);
    cw__desc_fill_strides(&out->w);
    cw__desc_fill_strides(&out->y);
    out->has_bias = has_bias;
    out->spatial = p->spatial;
    for (int i = 0; i < 3; i++) {
        const int in = i < p->spatial;
        out->stride[i] = in ? p->stride[i] : 1;
        out->dilation[i] = in ? p->dilation[i] : 1;
        out->pad_pre[i] = in ? p->pad_pre[i] : 0;
        out->pad_post[i] = in ? p->pad_post[i] : 0;
    }
    out->groups = p->groups;
}
