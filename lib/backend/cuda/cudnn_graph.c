/* cuDNN convolution, graph building: the descriptors of one patch problem (tensors with
 * the view's dims and strides, the convolution with per-patch paddings, the operation
 * graph, optionally with a fused bias add) and the checks in front of them. Runs without a
 * device (tests/test_cudnn_desc.c). No legacy cudnnConvolutionForward. */
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "backend/cuda/cudnn_conv.h"

static cudnnDataType_t cw__cudnn_dtype(cw_dtype dt) {
    switch (dt) {
    case CW_F16: return CUDNN_DATA_HALF;
    case CW_BF16: return CUDNN_DATA_BFLOAT16;
    default: return CUDNN_DATA_FLOAT;
    }
}

/* Appends "[v0, v1, ...]" (count values) at buf + k; returns the new k, which may pass n
 * on truncation (snprintf's count), so callers stop appending at k >= n. */
static size_t cw__ints_append(char *buf, size_t k, size_t n, const int64_t *v, int count) {
    if (k < n) k += (size_t)snprintf(buf + k, n - k, "[");
    for (int d = 0; d < count && k < n; d++) k += (size_t)snprintf(buf + k, n - k, "%s%" PRId64, d ? ", " : "", v[d]);
    if (k < n) k += (size_t)snprintf(buf + k, n - k, "]");
    return k;
}

/* "x [1, 8, 10, 12]/[960, 120, 12, 1] w [...] y [...] stride [1, 1] dil [1, 1] pad_pre [1, 1]
 * pad_post [1, 1] groups 1"; dims from cw__dims_str, the rest in the same bracket form. */
const char *cw__problem_str(const cw__conv_problem *p, char *buf, size_t n) {
    const cw_tensor_desc *t[3] = {&p->x, &p->w, &p->y};
    const char *nm[3] = {"x", "w", "y"};
    size_t k = 0;
    buf[0] = '\0';
    for (int i = 0; i < 3 && k < n; i++) {
        k += (size_t)snprintf(buf + k, n - k, "%s%s ", i ? " " : "", nm[i]);
        if (k >= n) break;
        k += strlen(cw__dims_str(t[i], buf + k, n - k));
        if (k < n) k += (size_t)snprintf(buf + k, n - k, "/");
        k = cw__ints_append(buf, k, n, t[i]->strides, t[i]->rank);
    }
    int sp = p->spatial == 3 ? 3 : 2;
    const int64_t *arr[4] = {p->stride, p->dilation, p->pad_pre, p->pad_post};
    const char *an[4] = {" stride ", " dil ", " pad_pre ", " pad_post "};
    for (int a = 0; a < 4 && k < n; a++) {
        k += (size_t)snprintf(buf + k, n - k, "%s", an[a]);
        k = cw__ints_append(buf, k, n, arr[a], sp);
    }
    if (k < n) snprintf(buf + k, n - k, " groups %" PRId64, p->groups);
    return buf;
}

/* Strides filled in where the caller left them zero (contiguous). */
cw_tensor_desc cw__filled(const cw_tensor_desc *d) {
    cw_tensor_desc t = *d;
    cw__desc_fill_strides(&t);
    return t;
}

/* The strides given to cuDNN: filled in, and a dim of size 1 gets the span of the dims
 * inside it (its stride never addresses anything). A height patch of a [1, 512, 2048,
 * 2048] tensor keeps N stride 2^31, which alone sends cuDNN to its one generic engine (its
 * fast engines use 32-bit offsets); the patch itself spans less. */
static cw_tensor_desc cw__canon(const cw_tensor_desc *d) {
    cw_tensor_desc t = cw__filled(d);
    int64_t inner = 1; /* span of dims k+1.. */
    for (int k = t.rank - 1; k >= 0; k--) {
        if (t.dims[k] == 1 && t.strides[k] > inner) t.strides[k] = inner;
        inner += (t.dims[k] - 1) * t.strides[k];
    }
    return t;
}

cw_status cw__cudnn_problem_check(cw_context *ctx, const cw__conv_problem *p) {
    if (!p) return cw__error(ctx, CW_ERR_INVALID_ARG, "cudnn conv: problem is NULL");
    if (p->spatial != 2 && p->spatial != 3)
        return cw__error(ctx, CW_ERR_INVALID_ARG, "cudnn conv: spatial = %d, must be 2 or 3", p->spatial);
    const cw_tensor_desc *t[3] = {&p->x, &p->w, &p->y};
    const char *nm[3] = {"x", "w", "y"};
    for (int i = 0; i < 3; i++) {
        if (t[i]->rank != p->spatial + 2)
            return cw__error(ctx, CW_ERR_INVALID_ARG, "cudnn conv: %s has rank %d, a %d-D convolution needs %d", nm[i],
                             t[i]->rank, p->spatial, p->spatial + 2);
        if (t[i]->dtype != CW_F32 && t[i]->dtype != CW_F16 && t[i]->dtype != CW_BF16)
            return cw__error(ctx, CW_ERR_INVALID_ARG, "cudnn conv: %s dtype %d is not a cw_dtype", nm[i], (int)t[i]->dtype);
        for (int d = 0; d < t[i]->rank; d++)
            if (t[i]->dims[d] < 1)
                return cw__error(ctx, CW_ERR_INVALID_ARG, "cudnn conv: %s dims[%d] = %" PRId64 " < 1", nm[i], d,
                                 t[i]->dims[d]);
    }
    if (p->x.dtype != p->w.dtype || p->x.dtype != p->y.dtype)
        return cw__error(ctx, CW_ERR_UNSUPPORTED, "cudnn conv: dtypes x %d, w %d, y %d differ; one dtype per conv",
                         (int)p->x.dtype, (int)p->w.dtype, (int)p->y.dtype);
    if (p->groups < 1 || p->x.dims[1] != p->w.dims[1] * p->groups)
        return cw__error(ctx, CW_ERR_INVALID_ARG,
                         "cudnn conv: groups = %" PRId64 " with x channels %" PRId64 " and w dims[1] = %" PRId64
                         " (need x channels = w dims[1] * groups)",
                         p->groups, p->x.dims[1], p->w.dims[1]);
    for (int d = 0; d < p->spatial; d++) {
        if (p->stride[d] < 1 || p->dilation[d] < 1 || p->pad_pre[d] < 0 || p->pad_post[d] < 0)
            return cw__error(ctx, CW_ERR_INVALID_ARG,
                             "cudnn conv: spatial dim %d has stride %" PRId64 ", dilation %" PRId64 ", pad_pre %" PRId64
                             ", pad_post %" PRId64 " (need stride, dilation >= 1, paddings >= 0)",
                             d, p->stride[d], p->dilation[d], p->pad_pre[d], p->pad_post[d]);
    }
    return CW_OK;
}

static int64_t cw__lowbit16(uint64_t v) {
    if (v == 0) return 16;
    uint64_t b = v & (~v + 1);
    return b >= 16 ? 16 : (int64_t)b;
}

int64_t cw__cudnn_ptr_align(const void *ptr) { return cw__lowbit16((uint64_t)(uintptr_t)ptr); }

void cw__cudnn_layout_align(const cw__conv_problem *p, int64_t align[3]) {
    const cw_tensor_desc *t[2] = {&p->x, &p->y};
    for (int i = 0; i < 2; i++) {
        cw_tensor_desc d = cw__filled(t[i]);
        uint64_t es = (uint64_t)cw_dtype_size(d.dtype);
        int64_t a = 16;
        /* H is dims[rank - 2]; for 3-D also D (dims[2]) */
        for (int k = p->spatial == 3 ? 2 : d.rank - 2; k >= 2 && k <= d.rank - 2; k++) {
            int64_t b = cw__lowbit16(es * (uint64_t)d.strides[k]);
            if (b < a) a = b;
        }
        align[i == 0 ? 0 : 2] = a;
    }
    align[1] = 16;
}

static cw_status cw__tensor_desc(cw_context *ctx, const cw_tensor_desc *td, int64_t uid, int64_t align,
                                 int is_virtual, cudnnBackendDescriptor_t *out) {
    cw_status st = CW_OK;
    cw_tensor_desc d = cw__canon(td);
    cudnnDataType_t dt = cw__cudnn_dtype(d.dtype);
    bool virt = is_virtual != 0;
    cudnnBackendDescriptor_t t = NULL;
    *out = NULL;
    CW__CUDNN_CHECK(ctx, cudnnBackendCreateDescriptor(CUDNN_BACKEND_TENSOR_DESCRIPTOR, &t));
    CW__CUDNN_GOTO(ctx, st, fail, cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt));
    CW__CUDNN_GOTO(ctx, st, fail,
                   cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, d.rank, d.dims));
    CW__CUDNN_GOTO(ctx, st, fail,
                   cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, d.rank, d.strides));
    CW__CUDNN_GOTO(ctx, st, fail, cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid));
    CW__CUDNN_GOTO(ctx, st, fail,
                   cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align));
    if (virt)
        CW__CUDNN_GOTO(ctx, st, fail,
                       cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt));
    CW__CUDNN_GOTO(ctx, st, fail, cudnnBackendFinalize(t));
    *out = t;
    return CW_OK;
fail:
    cudnnBackendDestroyDescriptor(t);
    return st;
}

void cw__cudnn_graph_destroy(cw__cudnn_graph *g) {
    if (!g) return;
    /* Destroy users before what they reference. */
    cudnnBackendDescriptor_t *all[10] = {&g->graph, &g->add, &g->pw, &g->op, &g->conv, &g->t, &g->b, &g->y, &g->w, &g->x};
    for (int i = 0; i < 10; i++) {
        if (*all[i]) cudnnBackendDestroyDescriptor(*all[i]);
        *all[i] = NULL;
    }
}

/* g's tensors: x, w, y and, for a bias-fused graph, t (the convolution's f32 result,
 * virtual, y's dims) and b ([1, K, 1, ...]). */
static cw_status cw__graph_tensors(cw_context *ctx, const cw__conv_problem *p, const int64_t align[3], int fuse_bias,
                                   cw__cudnn_graph *g) {
    CW_TRY(cw__tensor_desc(ctx, &p->x, CW__CUDNN_UID_X, align[0], 0, &g->x));
    CW_TRY(cw__tensor_desc(ctx, &p->w, CW__CUDNN_UID_W, align[1], 0, &g->w));
    CW_TRY(cw__tensor_desc(ctx, &p->y, CW__CUDNN_UID_Y, align[2], 0, &g->y));
    if (!fuse_bias) return CW_OK;
    cw_tensor_desc td = p->y, bd;
    td.dtype = CW_F32;
    memset(td.strides, 0, sizeof td.strides);
    memset(&bd, 0, sizeof bd);
    bd.rank = p->y.rank;
    bd.dtype = p->w.dtype;
    for (int i = 0; i < bd.rank; i++) bd.dims[i] = i == 1 ? p->y.dims[1] : 1;
    CW_TRY(cw__tensor_desc(ctx, &td, CW__CUDNN_UID_T, 16, 1, &g->t));
    return cw__tensor_desc(ctx, &bd, CW__CUDNN_UID_B, 16, 0, &g->b);
}

/* g->conv: p's cross-correlation, accumulating in f32 for every data type. */
static cw_status cw__graph_conv(cw_context *ctx, const cw__conv_problem *p, cw__cudnn_graph *g) {
    int64_t sp = p->spatial;
    cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
    CW__CUDNN_CHECK(ctx, cudnnBackendCreateDescriptor(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, &g->conv));
    CW__CUDNN_CHECK(ctx,
                    cudnnBackendSetAttribute(g->conv, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &sp));
    CW__CUDNN_CHECK(ctx,
                    cudnnBackendSetAttribute(g->conv, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1,
                                             &comp));
    CW__CUDNN_CHECK(ctx,
                    cudnnBackendSetAttribute(g->conv, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1,
                                             &mode));
    CW__CUDNN_CHECK(ctx,
                    cudnnBackendSetAttribute(g->conv, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, sp,
                                             p->pad_pre));
    CW__CUDNN_CHECK(ctx,
                    cudnnBackendSetAttribute(g->conv, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, sp,
                                             p->pad_post));
    CW__CUDNN_CHECK(ctx,
                    cudnnBackendSetAttribute(g->conv, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, sp,
                                             p->dilation));
    CW__CUDNN_CHECK(ctx,
                    cudnnBackendSetAttribute(g->conv, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, sp,
                                             p->stride));
    CW__CUDNN_CHECK(ctx, cudnnBackendFinalize(g->conv));
    return CW_OK;
}

/* g->op: y = conv(x, w), or t = conv(x, w) when the bias add follows. cuDNN validates the
 * shapes when it finalises (output size against input, kernel, paddings, strides,
 * dilations; channels against groups): a rejection names the problem. */
static cw_status cw__graph_conv_op(cw_context *ctx, const cw__conv_problem *p, int fuse_bias, cw__cudnn_graph *g) {
    float alpha = 1.0f, beta = 0.0f;
    CW__CUDNN_CHECK(ctx, cudnnBackendCreateDescriptor(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR, &g->op));
    CW__CUDNN_CHECK(ctx,
                    cudnnBackendSetAttribute(g->op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
                                             CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g->x));
    CW__CUDNN_CHECK(ctx,
                    cudnnBackendSetAttribute(g->op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
                                             CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g->w));
    CW__CUDNN_CHECK(ctx,
                    cudnnBackendSetAttribute(g->op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
                                             CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, fuse_bias ? &g->t : &g->y));
    CW__CUDNN_CHECK(ctx,
                    cudnnBackendSetAttribute(g->op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
                                             CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g->conv));
    CW__CUDNN_CHECK(ctx,
                    cudnnBackendSetAttribute(g->op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_TYPE_FLOAT, 1,
                                             &alpha));
    CW__CUDNN_CHECK(ctx,
                    cudnnBackendSetAttribute(g->op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, CUDNN_TYPE_FLOAT, 1,
                                             &beta));
    cudnnStatus_t s = cudnnBackendFinalize(g->op);
    if (s == CUDNN_STATUS_SUCCESS) return CW_OK;
    char why[256], desc[512];
    cudnnGetLastErrorString(why, sizeof why);
    return cw__error(ctx, cw__cudnn_status(s), "cudnn conv: cuDNN rejects %s: %s (%s)",
                     cw__problem_str(p, desc, sizeof desc), cudnnGetErrorString(s), why);
}

/* g->pw and g->add: y = t + b, in f32. */
static cw_status cw__graph_bias_add(cw_context *ctx, cw__cudnn_graph *g) {
    cudnnPointwiseMode_t mode_add = CUDNN_POINTWISE_ADD;
    cudnnDataType_t prec = CUDNN_DATA_FLOAT;
    CW__CUDNN_CHECK(ctx, cudnnBackendCreateDescriptor(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, &g->pw));
    CW__CUDNN_CHECK(ctx,
                    cudnnBackendSetAttribute(g->pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1,
                                             &mode_add));
    CW__CUDNN_CHECK(ctx,
                    cudnnBackendSetAttribute(g->pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec));
    CW__CUDNN_CHECK(ctx, cudnnBackendFinalize(g->pw));
    CW__CUDNN_CHECK(ctx, cudnnBackendCreateDescriptor(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, &g->add));
    CW__CUDNN_CHECK(ctx,
                    cudnnBackendSetAttribute(g->add, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR,
                                             CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g->pw));
    CW__CUDNN_CHECK(ctx,
                    cudnnBackendSetAttribute(g->add, CUDNN_ATTR_OPERATION_POINTWISE_XDESC,
                                             CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g->t));
    CW__CUDNN_CHECK(ctx,
                    cudnnBackendSetAttribute(g->add, CUDNN_ATTR_OPERATION_POINTWISE_BDESC,
                                             CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g->b));
    CW__CUDNN_CHECK(ctx,
                    cudnnBackendSetAttribute(g->add, CUDNN_ATTR_OPERATION_POINTWISE_YDESC,
                                             CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g->y));
    CW__CUDNN_CHECK(ctx, cudnnBackendFinalize(g->add));
    return CW_OK;
}

/* g->graph: the forward op, and the bias add when fused. */
static cw_status cw__graph_ops(cw_context *ctx, cudnnHandle_t handle, int fuse_bias, cw__cudnn_graph *g) {
    cudnnBackendDescriptor_t ops[2] = {g->op, g->add};
    CW__CUDNN_CHECK(ctx, cudnnBackendCreateDescriptor(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, &g->graph));
    CW__CUDNN_CHECK(ctx,
                    cudnnBackendSetAttribute(g->graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                             fuse_bias ? 2 : 1, ops));
    /* Not needed to finalise (cuDNN >= 9 works without it); kept where a device exists
     * because it ties the graph to the handle's device as cudnn-frontend does. */
    if (handle)
        CW__CUDNN_CHECK(ctx,
                        cudnnBackendSetAttribute(g->graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1,
                                                 &handle));
    CW__CUDNN_CHECK(ctx, cudnnBackendFinalize(g->graph));
    return CW_OK;
}

/* Each step fills its part of g; on a failure everything made so far is destroyed here. */
cw_status cw__cudnn_graph_build(cw_context *ctx, const cw__conv_problem *p, const int64_t align[3],
                                cudnnHandle_t handle, int fuse_bias, cw__cudnn_graph *g) {
    cw_status st;
    memset(g, 0, sizeof *g);
    CW_TRY(cw__cudnn_problem_check(ctx, p));
    if ((st = cw__graph_tensors(ctx, p, align, fuse_bias, g)) != CW_OK) goto fail;
    if ((st = cw__graph_conv(ctx, p, g)) != CW_OK) goto fail;
    if ((st = cw__graph_conv_op(ctx, p, fuse_bias, g)) != CW_OK) goto fail;
    if (fuse_bias && (st = cw__graph_bias_add(ctx, g)) != CW_OK) goto fail;
    if ((st = cw__graph_ops(ctx, handle, fuse_bias, g)) != CW_OK) goto fail;
    return CW_OK;
fail:
    cw__cudnn_graph_destroy(g);
    return st;
}

cw_status cw__cudnn_graph_engine_count(cw_context *ctx, const cw__cudnn_graph *g, int64_t *out) {
    int64_t n = 0;
    *out = 0;
    CW__CUDNN_CHECK(ctx, cudnnBackendGetAttribute(g->graph, CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT,
                                                  CUDNN_TYPE_INT64, 1, &n, out));
    return CW_OK;
}

cw_status cw__cudnn_devprop_from_json(cw_context *ctx, const char *json, cudnnBackendDescriptor_t *out) {
    *out = NULL;
#if CUDNN_VERSION >= 90800
    cw_status st = CW_OK;
    cudnnBackendDescriptor_t d = NULL;
    if (!json) return cw__error(ctx, CW_ERR_INVALID_ARG, "cudnn devprop: json is NULL");
    CW__CUDNN_CHECK(ctx, cudnnBackendCreateDescriptor(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR, &d));
    CW__CUDNN_GOTO(ctx, st, fail,
                   cudnnBackendSetAttribute(d, CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR,
                                            (int64_t)strlen(json), json));
    CW__CUDNN_GOTO(ctx, st, fail, cudnnBackendFinalize(d));
    *out = d;
    return CW_OK;
fail:
    cudnnBackendDestroyDescriptor(d);
    return st;
#else
    (void)json;
    return cw__error(ctx, CW_ERR_UNSUPPORTED, "cudnn devprop: needs cuDNN >= 9.8, built with %d", CUDNN_VERSION);
#endif
}

