/* Convolution through the cuDNN 9 graph (backend) API: descriptors for one patch problem,
 * heuristics (mode A, then FALLBACK) into a per-problem engine-config list, execution plans
 * finalised on first use and cached, and the variant pack that runs one. Everything up to
 * the plan runs without a device (no handle; a device-properties descriptor stands in for
 * the GPU), which is how CI checks every patch shape. No legacy cudnnConvolutionForward. */
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_internal.h"

/* Like CW__CUDNN_GOTO, but for calls whose failure the caller recovers from (a heuristics
 * mode or an engine config cuDNN cannot serve): the reason goes to the debug log only, so
 * the context's last error keeps describing real failures. */
#define CW__CUDNN_QUIET(ctx, st, label, call)                                                       \
    do {                                                                                            \
        cudnnStatus_t cw_q_ = (call);                                                               \
        if (cw_q_ != CUDNN_STATUS_SUCCESS) {                                                        \
            char cw_why_[256];                                                                      \
            cudnnGetLastErrorString(cw_why_, sizeof cw_why_);                                       \
            cw__log((ctx), CW_LOG_DEBUG, "%s: %s (%s) at %s:%d", #call, cudnnGetErrorString(cw_q_), \
                    cw_why_, __FILE__, __LINE__);                                                   \
            (st) = cw__cudnn_status(cw_q_);                                                         \
            goto label;                                                                             \
        }                                                                                           \
    } while (0)

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
static const char *cw__problem_str(const cw__conv_problem *p, char *buf, size_t n) {
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
static cw_tensor_desc cw__filled(const cw_tensor_desc *d) {
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
    cw_status st;
    if ((st = cw__tensor_desc(ctx, &p->x, CW__CUDNN_UID_X, align[0], 0, &g->x)) != CW_OK) return st;
    if ((st = cw__tensor_desc(ctx, &p->w, CW__CUDNN_UID_W, align[1], 0, &g->w)) != CW_OK) return st;
    if ((st = cw__tensor_desc(ctx, &p->y, CW__CUDNN_UID_Y, align[2], 0, &g->y)) != CW_OK) return st;
    if (!fuse_bias) return CW_OK;
    cw_tensor_desc td = p->y, bd;
    td.dtype = CW_F32;
    memset(td.strides, 0, sizeof td.strides);
    memset(&bd, 0, sizeof bd);
    bd.rank = p->y.rank;
    bd.dtype = p->w.dtype;
    for (int i = 0; i < bd.rank; i++) bd.dims[i] = i == 1 ? p->y.dims[1] : 1;
    if ((st = cw__tensor_desc(ctx, &td, CW__CUDNN_UID_T, 16, 1, &g->t)) != CW_OK) return st;
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
    if ((st = cw__cudnn_problem_check(ctx, p)) != CW_OK) return st;
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

/* ---- the engine-config / plan cache ------------------------------------------------------ */

/* cuDNN engines index tensors with 32-bit offsets: only a generic engine takes a tensor
 * whose strided span (or a stride) reaches 2^31 elements (measured with cuDNN 9.19 and an
 * H100 profile: f16 1024x1448^2 gets 26 engine configs, 1024x1449^2 one). A height patch
 * keeps its tensor's strides, so its span is nearly that of the whole tensor (C stride
 * H*W). For those problems the list also offers "packed" configs: x and y are copied
 * through contiguous patch-sized buffers at the start of the workspace (counted in the
 * workspace the planner budgets). */
#define CW__SPAN_LIMIT ((int64_t)1 << 31)

static int64_t cw__round256(int64_t b) { return (b + 255) / 256 * 256; }

/* Algorithm ids are stable across problems (the planner matches the full conv's list with
 * its patches' lists by id): the engine, whether it runs the bias-fused graph, whether its
 * knobs are the heuristics' first choice or its leanest (smallest workspace) listed choice,
 * and whether it runs packed. */
static int cw__cfg_id(int64_t engine, int fused, int lean, int packed) {
    return (int)((engine << 3) | (fused << 2) | (lean << 1) | packed);
}

/* Canonical key: every field that changes the descriptors (dims, strides, paddings,
 * strides, dilations, dtype, alignments), zero-padded so memcmp compares it. */
typedef struct cw__cudnn_key {
    int32_t dtype, spatial, has_bias, pad_;
    int64_t dims[3][CW_MAX_RANK], strides[3][CW_MAX_RANK];
    int64_t stride[3], dilation[3], pad_pre[3], pad_post[3], groups;
    int64_t align[3];
} cw__cudnn_key;

typedef struct cw__cudnn_cfg {
    cudnnBackendDescriptor_t cfg;
    cudnnBackendDescriptor_t plan; /* finalised on first use */
    int64_t ws;                    /* cuDNN's workspace bytes (without packing buffers) */
    int64_t engine;                /* global engine index */
    int id, lean, packed, fused;
    int broken;                    /* plan finalisation failed or its workspace is < 0: never offered again */
    int late;                      /* its plan was finalised inside a run (logged once) */
    float tuned_ms;                /* autotune: best time (0 not timed, < 0 failed to run) */
} cw__cudnn_cfg;

typedef struct cw__cudnn_entry {
    cw__cudnn_key key;
    cw__cudnn_graph g;  /* the problem as given */
    cw__cudnn_graph gp; /* packed: x and y contiguous, 16-byte aligned (only when needed) */
    cw__cudnn_graph gf; /* bias fused (only for problems with a bias, when not packed) */
    int warned;         /* a substitution inside a run was logged */
    cw_tensor_desc xp, yp;
    int64_t pack_bytes[2]; /* rounded bytes of the packed x and y */
    int n;
    cw__cudnn_cfg cfgs[CW__CUDNN_MAX_CFGS];
    struct cw__cudnn_entry *next;
} cw__cudnn_entry;

struct cw__cudnn_conv {
    cw_context *ctx;
    cudnnHandle_t handle;
    cudnnBackendDescriptor_t devprop;
    pthread_mutex_t mu; /* guards the list, plans and the handle's stream */
    unsigned flags;     /* CW__CUDNN_* */
    int in_run;         /* set by cw__cudnn_conv_run while it looks up its plan */
    cw__cudnn_entry *head;
    int64_t n_problems, n_plans, n_hits, n_evicted, n_late, n_subst;
};

static int64_t cw__cfg_total_ws(const cw__cudnn_entry *e, const cw__cudnn_cfg *f) {
    return f->ws + (f->packed ? e->pack_bytes[0] + e->pack_bytes[1] : 0);
}

static void cw__make_key(const cw__conv_problem *p, const int64_t align[3], cw__cudnn_key *k) {
    memset(k, 0, sizeof *k);
    k->dtype = (int32_t)p->x.dtype;
    k->spatial = p->spatial;
    k->has_bias = p->has_bias != 0;
    const cw_tensor_desc *t[3] = {&p->x, &p->w, &p->y};
    for (int i = 0; i < 3; i++) {
        cw_tensor_desc d = cw__filled(t[i]);
        for (int j = 0; j < d.rank && j < CW_MAX_RANK; j++) {
            k->dims[i][j] = d.dims[j];
            k->strides[i][j] = d.strides[j];
        }
    }
    for (int j = 0; j < p->spatial && j < 3; j++) {
        k->stride[j] = p->stride[j];
        k->dilation[j] = p->dilation[j];
        k->pad_pre[j] = p->pad_pre[j];
        k->pad_post[j] = p->pad_post[j];
    }
    k->groups = p->groups;
    for (int i = 0; i < 3; i++) k->align[i] = align[i];
}

static uint64_t cw__fnv(uint64_t h, int64_t v) {
    for (int i = 0; i < 8; i++) {
        h ^= (uint64_t)(v >> (8 * i)) & 0xffu;
        h *= 1099511628211ull;
    }
    return h;
}

/* Engine index, numerical notes and a signature of the knob choices of one config. */
static cw_status cw__cfg_info(cw_context *ctx, cudnnBackendDescriptor_t cfg, int64_t *engine, int *notes,
                              uint64_t *sig) {
    cw_status st = CW_OK;
    cudnnBackendDescriptor_t eng = NULL, knobs[CUDNN_KNOB_TYPE_COUNTS];
    int nk = 0;
    int64_t cnt = 0;
    *notes = 0;
    CW__CUDNN_QUIET(ctx, st, done, cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &eng));
    CW__CUDNN_QUIET(ctx, st, done,
                   cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cnt,
                                            &eng));
    CW__CUDNN_QUIET(ctx, st, done,
                   cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &cnt, engine));
    cudnnBackendNumericalNote_t nn[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
    CW__CUDNN_QUIET(ctx, st, done,
                   cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                            CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &cnt, nn));
    for (int64_t i = 0; i < cnt && i < CUDNN_NUMERICAL_NOTE_TYPE_COUNT; i++) *notes |= 1 << (int)nn[i];

    for (; nk < CUDNN_KNOB_TYPE_COUNTS; nk++)
        CW__CUDNN_QUIET(ctx, st, done, cudnnBackendCreateDescriptor(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR, &knobs[nk]));
    CW__CUDNN_QUIET(ctx, st, done,
                   cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                            CUDNN_KNOB_TYPE_COUNTS, &cnt, knobs));
    /* Choices come in cuDNN's order; a sum of per-choice hashes does not depend on it. */
    uint64_t acc = 0;
    for (int64_t i = 0; i < cnt && i < CUDNN_KNOB_TYPE_COUNTS; i++) {
        cudnnBackendKnobType_t type;
        int64_t value = 0, c1 = 0;
        CW__CUDNN_QUIET(ctx, st, done,
                       cudnnBackendGetAttribute(knobs[i], CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE, 1,
                                                &c1, &type));
        CW__CUDNN_QUIET(ctx, st, done,
                       cudnnBackendGetAttribute(knobs[i], CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, CUDNN_TYPE_INT64, 1, &c1,
                                                &value));
        acc += cw__fnv(cw__fnv(14695981039346656037ull, (int64_t)type), value);
    }
    *sig = cw__fnv(cw__fnv(14695981039346656037ull, *engine), (int64_t)acc);
done:
    for (int i = 0; i < nk; i++) cudnnBackendDestroyDescriptor(knobs[i]);
    if (eng) cudnnBackendDestroyDescriptor(eng);
    return st;
}

/* Engines we never use: results must not depend on timing (nondeterministic engines use
 * atomics), f32 compute must stay f32 (no reduced-precision reductions, and for f32 data
 * no TF32 tensor cores or down-converted inputs), and f32 must stay within the 1e-5 the
 * cpu oracle allows (FFT and Winograd transforms typically lose ~1e-4 in f32). */
static int cw__cfg_rejected(int notes, cw_dtype dt, unsigned flags) {
    if (notes & (1 << CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC)) return 1;
    if (notes & (1 << CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION)) return 1;
    if (notes & (1 << CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS)) return 1;
    /* TF32 (opt-in): f32 data on tensor cores, 10-bit mantissa products */
    if (dt == CW_F32 && (flags & CW__CUDNN_TF32)) notes &= ~(1 << CUDNN_NUMERICAL_NOTE_TENSOR_CORE);
    if (dt == CW_F32 && (notes & ((1 << CUDNN_NUMERICAL_NOTE_TENSOR_CORE) | (1 << CUDNN_NUMERICAL_NOTE_FFT) |
                                  (1 << CUDNN_NUMERICAL_NOTE_WINOGRAD) | (1 << CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_4x4) |
                                  (1 << CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_6x6) |
                                  (1 << CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_13x13))))
        return 1;
    return 0;
}

/* One heuristics result before selection. */
typedef struct cw__raw_cfg {
    cudnnBackendDescriptor_t cfg;
    int64_t ws, engine;
    uint64_t sig;
} cw__raw_cfg;

/* Appends the configs of one heuristics mode for graph g to raw (skipping duplicates and
 * rejected engines). A mode cuDNN cannot serve returns its status; the caller decides. */
static cw_status cw__heuristics(cw__cudnn_conv *c, const cw__cudnn_graph *g, cw_dtype dt,
                                cudnnBackendHeurMode_t mode, cw__raw_cfg *raw, int *n_raw) {
    cw_context *ctx = c->ctx;
    cw_status st = CW_OK;
    cudnnBackendDescriptor_t heur = NULL, cfgs[CW__CUDNN_MAX_CFGS];
    int64_t count = 0, got = 0;
    int made = 0;
    CW__CUDNN_QUIET(ctx, st, done, cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heur));
    CW__CUDNN_QUIET(ctx, st, done,
                    cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH,
                                             CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g->graph));
    CW__CUDNN_QUIET(ctx, st, done,
                    cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode));
#if CUDNN_VERSION >= 90800
    if (c->devprop)
        CW__CUDNN_QUIET(ctx, st, done,
                        cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_DEVICEPROP,
                                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c->devprop));
#endif
    CW__CUDNN_QUIET(ctx, st, done, cudnnBackendFinalize(heur));
    CW__CUDNN_QUIET(ctx, st, done,
                    cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                                             &count, NULL));
    if (count <= 0) goto done;
    if (count > CW__CUDNN_MAX_CFGS) count = CW__CUDNN_MAX_CFGS;
    for (; made < count; made++)
        CW__CUDNN_QUIET(ctx, st, done,
                        cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cfgs[made]));
    CW__CUDNN_QUIET(ctx, st, done,
                    cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count,
                                             &got, cfgs));
    for (int64_t i = 0; i < got && i < count; i++) {
        int64_t engine = -1, ws = 0, k = 0;
        int notes = 0, dup = 0;
        uint64_t sig = 0;
        if (*n_raw >= CW__CUDNN_MAX_CFGS) break;
        /* A config cuDNN cannot describe is skipped, not fatal: the others may serve. */
        if (cw__cfg_info(ctx, cfgs[i], &engine, &notes, &sig) != CW_OK) continue;
        if (cw__cfg_rejected(notes, dt, c->flags)) continue;
        if (engine < 0 || engine >= (1 << 20)) continue; /* keeps the id encoding in range */
        /* a negative workspace means cuDNN cannot size it for this problem: unusable */
        if (cudnnBackendGetAttribute(cfgs[i], CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &k, &ws) !=
                CUDNN_STATUS_SUCCESS ||
            ws < 0)
            continue;
        for (int j = 0; j < *n_raw && !dup; j++) dup = raw[j].sig == sig;
        if (dup) continue;
        raw[*n_raw].cfg = cfgs[i];
        raw[*n_raw].ws = ws;
        raw[*n_raw].engine = engine;
        raw[*n_raw].sig = sig;
        (*n_raw)++;
        cfgs[i] = NULL; /* owned by raw now */
    }
done:
    for (int i = 0; i < made; i++)
        if (cfgs[i]) cudnnBackendDestroyDescriptor(cfgs[i]);
    if (heur) cudnnBackendDestroyDescriptor(heur);
    return st;
}

/* The configs of raw (one graph kind) to take, in order, into idx: lean = 0 each engine's
 * first config (heuristic order), lean = 1 each engine's smallest-workspace config where
 * it is smaller than the first. */
static int cw__picks(const cw__raw_cfg *raw, int n_raw, int lean, int *idx) {
    int n = 0;
    for (int i = 0; i < n_raw; i++) {
        int first = 1;
        for (int j = 0; j < i && first; j++) first = raw[j].engine != raw[i].engine;
        if (!first) continue; /* each engine once, at its best rank */
        int pick = i;
        if (lean) {
            for (int j = i + 1; j < n_raw; j++)
                if (raw[j].engine == raw[i].engine && raw[j].ws < raw[pick].ws) pick = j;
            if (pick == i) continue;
        }
        if (raw[pick].cfg) idx[n++] = pick;
    }
    return n;
}

/* Moves raw[pick] into e (the entry of raw is set to NULL). */
static void cw__take(cw__cudnn_entry *e, cw__raw_cfg *raw, int pick, int packed, int fused, int lean) {
    if (e->n >= CW__CUDNN_MAX_CFGS || !raw[pick].cfg) return;
    cw__cudnn_cfg *f = &e->cfgs[e->n++];
    memset(f, 0, sizeof *f);
    f->cfg = raw[pick].cfg;
    f->ws = raw[pick].ws;
    f->engine = raw[pick].engine;
    f->lean = lean;
    f->packed = packed;
    f->fused = fused;
    f->id = cw__cfg_id(f->engine, fused, lean, packed);
    raw[pick].cfg = NULL;
}

/* Takes the picks of two lists alternately, a's first (each list keeps its own order:
 * heuristics rank engines within one graph only). */
static void cw__interleave(cw__cudnn_entry *e, cw__raw_cfg *ra, int na, int fa, cw__raw_cfg *rb, int nb, int fb,
                           int lean) {
    int ia[CW__CUDNN_MAX_CFGS], ib[CW__CUDNN_MAX_CFGS];
    int ka = cw__picks(ra, na, lean, ia), kb = cw__picks(rb, nb, lean, ib);
    for (int i = 0; i < ka || i < kb; i++) {
        if (i < ka) cw__take(e, ra, ia[i], 0, fa, lean);
        if (i < kb) cw__take(e, rb, ib[i], 0, fb, lean);
    }
}

static void cw__entry_destroy(cw__cudnn_entry *e) {
    if (!e) return;
    for (int i = 0; i < e->n; i++) {
        if (e->cfgs[i].plan) cudnnBackendDestroyDescriptor(e->cfgs[i].plan);
        if (e->cfgs[i].cfg) cudnnBackendDestroyDescriptor(e->cfgs[i].cfg);
    }
    cw__cudnn_graph_destroy(&e->gf);
    cw__cudnn_graph_destroy(&e->gp);
    cw__cudnn_graph_destroy(&e->g);
    cw__free(e);
}

/* Planners probe many patch heights (one entry of ~0.2-0.3 MiB of cuDNN descriptors each)
 * and run few. Entries without a finalised plan are only lists: beyond CW__CUDNN_MAX_IDLE
 * of them the oldest goes. Entries with plans stay for the cache's life, since a plan may
 * be executing on the device (its kernels must stay loaded). Caller holds c->mu. */
#define CW__CUDNN_MAX_IDLE 128
static int cw__entry_has_plan(const cw__cudnn_entry *e) {
    for (int i = 0; i < e->n; i++)
        if (e->cfgs[i].plan) return 1;
    return 0;
}

static void cw__evict_idle(cw__cudnn_conv *c) {
    int idle = 0;
    cw__cudnn_entry **oldest = NULL;
    for (cw__cudnn_entry **pe = &c->head; *pe; pe = &(*pe)->next) {
        if (cw__entry_has_plan(*pe)) continue;
        idle++;
        oldest = pe; /* the list runs newest first */
    }
    if (idle < CW__CUDNN_MAX_IDLE || !oldest) return;
    cw__cudnn_entry *e = *oldest;
    *oldest = e->next;
    cw__entry_destroy(e);
    c->n_evicted++;
}

/* Heuristics (mode A, then FALLBACK's configs not already listed) for one graph. */
static void cw__heuristics_both(cw__cudnn_conv *c, const cw__cudnn_graph *g, cw_dtype dt, cw__raw_cfg *raw, int *n,
                                cw_status *sa, cw_status *sf) {
    *sa = cw__heuristics(c, g, dt, CUDNN_HEUR_MODE_A, raw, n);
    *sf = cw__heuristics(c, g, dt, CUDNN_HEUR_MODE_FALLBACK, raw, n);
}

/* The cached entry for key (counted as a hit), or NULL. Caller holds c->mu. */
static cw__cudnn_entry *cw__entry_find(cw__cudnn_conv *c, const cw__cudnn_key *key) {
    for (cw__cudnn_entry *e = c->head; e; e = e->next) {
        if (memcmp(&e->key, key, sizeof *key) == 0) {
            c->n_hits++;
            return e;
        }
    }
    return NULL;
}

/* 1 when x's or y's strided span reaches CW__SPAN_LIMIT elements (p validated). */
static int cw__needs_pack(const cw__conv_problem *p) {
    return cw__desc_span_bytes(&p->x) / (int64_t)cw_dtype_size(p->x.dtype) >= CW__SPAN_LIMIT ||
           cw__desc_span_bytes(&p->y) / (int64_t)cw_dtype_size(p->y.dtype) >= CW__SPAN_LIMIT;
}

/* e's packed layouts (x and y contiguous, 16-byte aligned) and their rounded bytes; the
 * packed graph's configs go to rawp. A patch too big to pack under 2^31 elements, or a
 * packed graph cuDNN cannot build or serve, keeps the direct configs only. */
static void cw__entry_pack(cw__cudnn_conv *c, cw__cudnn_entry *e, const cw__conv_problem *p, const int64_t align[3],
                           cw__raw_cfg *rawp, int *n_rawp) {
    const cw_dtype dt = p->x.dtype;
    cw__conv_problem pp = *p;
    int64_t pal[3] = {16, align[1], 16};
    cw_status spa, spf;
    memset(pp.x.strides, 0, sizeof pp.x.strides);
    memset(pp.y.strides, 0, sizeof pp.y.strides);
    cw__desc_fill_strides(&pp.x);
    cw__desc_fill_strides(&pp.y);
    e->xp = pp.x;
    e->yp = pp.y;
    e->pack_bytes[0] = cw__round256(cw__desc_numel(&pp.x) * (int64_t)cw_dtype_size(dt));
    e->pack_bytes[1] = cw__round256(cw__desc_numel(&pp.y) * (int64_t)cw_dtype_size(dt));
    if (cw__desc_numel(&pp.x) < CW__SPAN_LIMIT && cw__desc_numel(&pp.y) < CW__SPAN_LIMIT &&
        cw__cudnn_graph_build(c->ctx, &pp, pal, c->handle, 0, &e->gp) == CW_OK)
        cw__heuristics_both(c, &e->gp, dt, rawp, n_rawp, &spa, &spf);
}

/* The bias-fused graph's configs into rawf: a graph cuDNN cannot build or serve just lists
 * nothing. */
static void cw__entry_fused(cw__cudnn_conv *c, cw__cudnn_entry *e, const cw__conv_problem *p, const int64_t align[3],
                            cw__raw_cfg *rawf, int *n_rawf) {
    cw_status sba, sbf;
    if (cw__cudnn_graph_build(c->ctx, p, align, c->handle, 1, &e->gf) == CW_OK)
        cw__heuristics_both(c, &e->gf, p->x.dtype, rawf, n_rawf, &sba, &sbf);
    else
        cw__log(c->ctx, CW_LOG_DEBUG, "cudnn conv: no bias-fused graph: %s", cw_context_get_last_error(c->ctx));
}

/* Takes the picks of the packed (rawp), direct (raw) and bias-fused (rawf) lists into e.
 * Order: every engine at its best knobs (packed first: where packing is needed the direct
 * list holds only a generic engine; then bias-fused and unfused alternately, fused first
 * for f16/bf16, unfused first for f32), then the leaner knob choices in the same order. */
static void cw__entry_order(cw__cudnn_entry *e, cw_dtype dt, cw__raw_cfg *rawp, int n_rawp, cw__raw_cfg *raw,
                            int n_raw, cw__raw_cfg *rawf, int n_rawf) {
    for (int lean = 0; lean < 2; lean++) {
        int ip[CW__CUDNN_MAX_CFGS], kp = cw__picks(rawp, n_rawp, lean, ip);
        for (int i = 0; i < kp; i++) cw__take(e, rawp, ip[i], 1, 0, lean);
        if (dt != CW_F32) cw__interleave(e, rawf, n_rawf, 1, raw, n_raw, 0, lean);
        else cw__interleave(e, raw, n_raw, 0, rawf, n_rawf, 1, lean);
    }
}

/* Destroys the configs of raw that were not taken. */
static void cw__raw_free(cw__raw_cfg *raw, int n_raw) {
    for (int i = 0; i < n_raw; i++)
        if (raw[i].cfg) cudnnBackendDestroyDescriptor(raw[i].cfg);
}

/* The entry for (p, align), built (graphs + heuristics) on first use. Caller holds c->mu. */
static cw_status cw__entry_get(cw__cudnn_conv *c, const cw__conv_problem *p, const int64_t align[3],
                               cw__cudnn_entry **out) {
    cw_context *ctx = c->ctx;
    cw__cudnn_key key;
    cw_status st, sa = CW_OK, sf = CW_OK;
    cw__raw_cfg raw[CW__CUDNN_MAX_CFGS], rawp[CW__CUDNN_MAX_CFGS], rawf[CW__CUDNN_MAX_CFGS];
    int n_raw = 0, n_rawp = 0, n_rawf = 0;
    char desc[512];
    *out = NULL;
    if ((st = cw__cudnn_problem_check(ctx, p)) != CW_OK) return st;
    cw__make_key(p, align, &key);
    if ((*out = cw__entry_find(c, &key)) != NULL) return CW_OK;
    cw__cudnn_entry *e = cw__calloc(1, sizeof *e);
    if (!e) return cw__error(ctx, CW_ERR_OUT_OF_MEMORY, "cudnn conv: out of host memory for an engine list");
    e->key = key;
    if ((st = cw__cudnn_graph_build(ctx, p, align, c->handle, 0, &e->g)) != CW_OK) goto fail;
    const cw_dtype dt = p->x.dtype;
    const int need_pack = cw__needs_pack(p);
    if (need_pack) cw__entry_pack(c, e, p, align, rawp, &n_rawp);
    cw__heuristics_both(c, &e->g, dt, raw, &n_raw, &sa, &sf);
    if (p->has_bias && !need_pack && !(c->flags & CW__CUDNN_NO_FUSE)) cw__entry_fused(c, e, p, align, rawf, &n_rawf);
    cw__entry_order(e, dt, rawp, n_rawp, raw, n_raw, rawf, n_rawf);
    cw__raw_free(rawp, n_rawp);
    cw__raw_free(raw, n_raw);
    cw__raw_free(rawf, n_rawf);
    if (e->n == 0) {
        st = cw__error(ctx, CW_ERR_UNSUPPORTED,
                       "cudnn conv: no usable engine for %s (heuristics mode A: %s, fallback: %s; nondeterministic, "
                       "reduced-precision and, for f32, TF32 engines%s are excluded)",
                       cw__problem_str(p, desc, sizeof desc), cw_status_name(sa), cw_status_name(sf),
                       (c->flags & CW__CUDNN_TF32) ? " (allowed here: CW_FLAG_CUDA_TF32)" : "");
        goto fail;
    }
    cw__log(ctx, CW_LOG_DEBUG, "cudnn conv: %d engine configs (%d direct, %d packed, %d bias-fused candidates) for %s",
            e->n, n_raw, n_rawp, n_rawf, cw__problem_str(p, desc, sizeof desc));
    cw__evict_idle(c);
    e->next = c->head;
    c->head = e;
    c->n_problems++;
    *out = e;
    return CW_OK;
fail:
    cw__entry_destroy(e);
    return st;
}

cw_status cw__cudnn_conv_create(cw__cudnn_conv **out, cw_context *ctx, cudnnHandle_t handle,
                                cudnnBackendDescriptor_t devprop, unsigned flags) {
    *out = NULL;
    cw__cudnn_conv *c = cw__calloc(1, sizeof *c);
    if (!c) return cw__error(ctx, CW_ERR_OUT_OF_MEMORY, "cudnn conv: out of host memory");
    if (pthread_mutex_init(&c->mu, NULL) != 0) {
        cw__free(c);
        return cw__error(ctx, CW_ERR_INTERNAL, "cudnn conv: pthread_mutex_init failed");
    }
    c->ctx = ctx;
    c->handle = handle;
    c->devprop = devprop;
    c->flags = flags;
    *out = c;
    return CW_OK;
}

void cw__cudnn_conv_destroy(cw__cudnn_conv *c) {
    if (!c) return;
    while (c->head) {
        cw__cudnn_entry *e = c->head;
        c->head = e->next;
        cw__entry_destroy(e);
    }
    pthread_mutex_destroy(&c->mu);
    cw__free(c);
}

/* 1 when the problem's input has no rows (a patch reading only padding, scheduler/planner.h). */
int cw__cudnn_empty_input(const cw__conv_problem *p) {
    int empty = 0;
    for (int d = 2; d < p->x.rank && d < CW_MAX_RANK; d++) empty |= p->x.dims[d] < 1;
    return empty;
}

cw_status cw__cudnn_conv_algos(cw__cudnn_conv *c, const cw__conv_problem *p, cw__conv_algo *out, int max, int *n) {
    int64_t align[3];
    cw__cudnn_entry *e;
    *n = 0;
    if (max < 0 || (max > 0 && !out)) return cw__error(c->ctx, CW_ERR_INVALID_ARG, "cudnn conv: algos max = %d", max);
    if (!p) return cw__error(c->ctx, CW_ERR_INVALID_ARG, "cudnn conv: problem is NULL");
    if (cw__cudnn_empty_input(p) && p->spatial >= 2 && p->spatial <= 3) {
        /* No engine takes an empty tensor; the backend writes the bias alone. The planner
         * matches algorithm ids across a conv's bands, so list the ids of a 1-row stand-in
         * (one padding row made a real row: same output shape) at zero workspace. */
        cw__conv_problem q = *p;
        int hd = p->spatial, hp = p->spatial - 2;
        if (q.pad_pre[hp] + q.pad_post[hp] < 1)
            return cw__error(c->ctx, CW_ERR_INVALID_ARG, "cudnn conv: x has no rows and no padding to stand in");
        for (int d = 2; d < q.x.rank && d < CW_MAX_RANK; d++)
            if (q.x.dims[d] < 1) q.x.dims[d] = 1;
        if (q.x.dims[hd] == 1 && p->x.dims[hd] < 1) {
            if (q.pad_post[hp] > 0) q.pad_post[hp]--;
            else q.pad_pre[hp]--;
        }
        cw_status st = cw__cudnn_conv_algos(c, &q, out, max, n);
        for (int i = 0; st == CW_OK && i < *n; i++) out[i].workspace = 0;
        return st;
    }
    cw__cudnn_layout_align(p, align);
    pthread_mutex_lock(&c->mu);
    cw_status st = cw__entry_get(c, p, align, &e);
    if (st == CW_OK) {
        int k = 0;
        for (int i = 0; i < e->n && k < max; i++) {
            const cw__cudnn_cfg *f = &e->cfgs[i];
            if (f->broken) continue;
            cw__conv_algo *a = &out[k];
            memset(a, 0, sizeof *a);
            a->id = f->id;
            snprintf(a->name, sizeof a->name, "cudnn engine %" PRId64 "%s%s%s", f->engine, f->fused ? " fused" : "",
                     f->lean ? " lean" : "", f->packed ? " packed" : "");
            a->workspace = cw__cfg_total_ws(e, f);
            a->cost = (double)k; /* rank: heuristics order expected speed */
            k++;
        }
        *n = k;
    }
    pthread_mutex_unlock(&c->mu);
    return st;
}

/* Finalises cfg's plan once. Quiet: a config that cannot finalise is skipped by the caller,
 * so its reason goes to the debug log, not the context's last error. Caller holds c->mu. */
static cw_status cw__plan_finalize(cw__cudnn_conv *c, cw__cudnn_cfg *cfg) {
    cw_status st = CW_OK;
    cudnnBackendDescriptor_t plan = NULL;
    int64_t ws = 0, k = 0;
    if (cfg->plan) return CW_OK;
    CW__CUDNN_QUIET(c->ctx, st, fail, cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan));
    CW__CUDNN_QUIET(c->ctx, st, fail,
                    cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                             CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg->cfg));
    if (c->handle)
        CW__CUDNN_QUIET(c->ctx, st, fail,
                        cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1,
                                                 &c->handle));
#if CUDNN_VERSION >= 90800
    else if (c->devprop)
        CW__CUDNN_QUIET(c->ctx, st, fail,
                        cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_DEVICEPROP,
                                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c->devprop));
#endif
    CW__CUDNN_QUIET(c->ctx, st, fail, cudnnBackendFinalize(plan));
    CW__CUDNN_QUIET(c->ctx, st, fail,
                    cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &k,
                                             &ws));
    if (ws < 0) { /* cuDNN cannot size this engine's workspace here: unusable, not "0 bytes" */
        cw__log(c->ctx, CW_LOG_DEBUG, "cudnn conv: engine %" PRId64 " plan reports workspace %" PRId64 ": unusable",
                cfg->engine, ws);
        st = CW_ERR_UNSUPPORTED;
        goto fail;
    }
    if (ws > cfg->ws) cfg->ws = ws; /* the plan's figure is the one execution needs */
    cfg->plan = plan;
    c->n_plans++;
    if (c->in_run) {
        c->n_late++;
        if (!cfg->late)
            cw__log(c->ctx, CW_LOG_INFO, "cudnn conv: engine %" PRId64 " plan finalised inside a run (not prepared at "
                    "compile time)", cfg->engine);
        cfg->late = 1;
    }
    return CW_OK;
fail:
    if (plan) cudnnBackendDestroyDescriptor(plan);
    cw__log(c->ctx, CW_LOG_DEBUG, "cudnn conv: engine %" PRId64 " config does not finalise to a plan", cfg->engine);
    return st;
}

/* cw__cudnn_conv_plan with c->mu held. */
static cw_status cw__conv_plan_locked(cw__cudnn_conv *c, const cw__conv_problem *p, const int64_t align[3], int id,
                                      int64_t ws_cap, int allow_packed, int allow_fused, cw__cudnn_choice *out,
                                      cw__cudnn_entry **entry) {
    cw__cudnn_entry *e;
    int order[CW__CUDNN_MAX_CFGS], n_order = 0, want = -1;
    memset(out, 0, sizeof *out);
    out->id = -1;
    cw_status st = cw__entry_get(c, p, align, &e);
    if (st != CW_OK) return st;
    if (entry) *entry = e;
    /* The requested config first; then, in rank order, the first that fits ws_cap. */
    for (int i = 0; i < e->n; i++)
        if (e->cfgs[i].id == id) want = i;
    if (want >= 0) order[n_order++] = want;
    for (int i = 0; i < e->n; i++)
        if (i != want) order[n_order++] = i;
    for (int k = 0; k < n_order; k++) {
        cw__cudnn_cfg *f = &e->cfgs[order[k]];
        if (f->broken || (f->packed && !allow_packed) || (f->fused && !allow_fused) || cw__cfg_total_ws(e, f) > ws_cap)
            continue;
        if (cw__plan_finalize(c, f) != CW_OK) {
            f->broken = 1;
            continue;
        }
        if (cw__cfg_total_ws(e, f) > ws_cap) continue;
        out->plan = f->plan;
        out->id = f->id;
        out->packed = f->packed;
        out->fused = f->fused;
        out->substituted = id >= 0 && f->id != id;
        out->engine_ws = f->ws;
        out->total_ws = cw__cfg_total_ws(e, f);
        if (f->packed) {
            out->x_bytes = e->pack_bytes[0];
            out->y_bytes = e->pack_bytes[1];
            out->xp = e->xp;
            out->yp = e->yp;
        }
        return CW_OK;
    }
    char desc[512];
    return cw__error(c->ctx, CW_ERR_UNSUPPORTED,
                     "cudnn conv: no engine config of %d finalises with workspace <= %" PRId64 " bytes for %s", e->n,
                     ws_cap, cw__problem_str(p, desc, sizeof desc));
}

cw_status cw__cudnn_conv_plan(cw__cudnn_conv *c, const cw__conv_problem *p, const int64_t align[3], int id,
                              int64_t ws_cap, int allow_packed, int allow_fused, cw__cudnn_choice *out) {
    pthread_mutex_lock(&c->mu);
    cw_status st = cw__conv_plan_locked(c, p, align, id, ws_cap, allow_packed, allow_fused, out, NULL);
    pthread_mutex_unlock(&c->mu);
    return st;
}

cw_status cw__cudnn_conv_prepare(cw__cudnn_conv *c, const cw__conv_problem *p, int id, int64_t ws_cap,
                                 cw__cudnn_choice *out) {
    int64_t align[3];
    memset(out, 0, sizeof *out);
    out->id = -1;
    if (!p) return cw__error(c->ctx, CW_ERR_INVALID_ARG, "cudnn conv: problem is NULL");
    if (cw__cudnn_empty_input(p)) { /* a bias fill at run time: nothing to finalise */
        out->id = id;
        return CW_OK;
    }
    cw__cudnn_layout_align(p, align);
    return cw__cudnn_conv_plan(c, p, align, id, ws_cap < 0 ? INT64_MAX : ws_cap, 1, 1, out);
}

/* Binds x, w, y (and b for a fused plan) and the workspace and runs the plan on s. Caller
 * holds c->mu. */
static cw_status cw__execute(cw__cudnn_conv *c, cudaStream_t s, cudnnBackendDescriptor_t plan, const void *x,
                             const void *w, const void *b, void *y, void *ws) {
    cw_context *ctx = c->ctx;
    cw_status st = CW_OK;
    cudnnBackendDescriptor_t vp = NULL;
    int64_t uids[4] = {CW__CUDNN_UID_X, CW__CUDNN_UID_W, CW__CUDNN_UID_Y, CW__CUDNN_UID_B};
    void *ptrs[4] = {(void *)(uintptr_t)x, (void *)(uintptr_t)w, y, (void *)(uintptr_t)b};
    int64_t n = b ? 4 : 3;
    CW__CUDNN_GOTO(ctx, st, done, cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp));
    CW__CUDNN_GOTO(ctx, st, done,
                   cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids));
    CW__CUDNN_GOTO(ctx, st, done,
                   cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs));
    CW__CUDNN_GOTO(ctx, st, done,
                   cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws));
    CW__CUDNN_GOTO(ctx, st, done, cudnnBackendFinalize(vp));
    CW__CUDNN_GOTO(ctx, st, done, cudnnSetStream(c->handle, s));
    CW__CUDNN_GOTO(ctx, st, done, cudnnBackendExecute(c->handle, plan, vp));
done:
    if (vp) cudnnBackendDestroyDescriptor(vp);
    return st;
}

cw_status cw__cudnn_conv_run(cw__cudnn_conv *c, cudaStream_t s, const cw__conv_problem *p, int id, const void *x,
                             const void *w, const void *b, void *y, void *ws, int64_t ws_bytes, int *bias_done) {
    cw_context *ctx = c->ctx;
    int64_t layout[3], actual[3] = {cw__cudnn_ptr_align(x), cw__cudnn_ptr_align(w), cw__cudnn_ptr_align(y)};
    const int64_t *align = layout;
    cw__cudnn_choice ch;
    cw__cudnn_entry *e = NULL;
    cw_status st;
    *bias_done = 0;
    if (!c->handle) return cw__error(ctx, CW_ERR_NO_DEVICE, "cudnn conv: no cuDNN handle (no device)");
    cw__cudnn_layout_align(p, layout);
    /* Pointers less aligned than the layout promised (a caller's odd view): use the list
     * built for the real alignment and its fastest config that fits the workspace. */
    if (actual[0] < layout[0] || actual[1] < layout[1] || actual[2] < layout[2]) {
        for (int i = 0; i < 3; i++) actual[i] = actual[i] < layout[i] ? actual[i] : layout[i];
        align = actual;
        id = -1;
    }
    /* Packed configs put their buffers at the start of ws: it must be 16-byte aligned; a
     * fused plan binds b, described as 16-byte aligned. */
    int allow_packed = cw__cudnn_ptr_align(ws) >= 16;
    int allow_fused = p->has_bias && b && cw__cudnn_ptr_align(b) >= 16;
    pthread_mutex_lock(&c->mu); /* the cache, and the handle's stream (shared state) */
    c->in_run = 1;
    st = cw__conv_plan_locked(c, p, align, id, ws_bytes, allow_packed, allow_fused, &ch, &e);
    c->in_run = 0;
    if (st != CW_OK) goto unlock;
    if (ch.substituted) {
        c->n_subst++;
        if (!e->warned)
            cw__log(ctx, CW_LOG_WARN, "cudnn conv: algorithm %d is not usable for a patch within %" PRId64
                    " workspace bytes; running algorithm %d instead (logged once per patch shape)", id, ws_bytes, ch.id);
        e->warned = 1;
    }
    if (ch.total_ws > 0 && !ws) {
        st = cw__error(ctx, CW_ERR_INTERNAL, "cudnn conv: algorithm %d needs %" PRId64 " workspace bytes, ws is NULL",
                       ch.id, ch.total_ws);
        goto unlock;
    }
    if (!ch.packed) {
        st = cw__execute(c, s, ch.plan, x, w, ch.fused ? b : NULL, y, ws);
        *bias_done = st == CW_OK && ch.fused;
    } else {
        /* x view -> contiguous copy, conv into a contiguous y, copy back into the y view
         * adding the bias on the way; all on s, so stream order keeps the steps apart. */
        char *base = ws;
        cw__view xv = {p->x, (void *)(uintptr_t)x}, xpv = {ch.xp, base};
        cw__view ypv = {ch.yp, base + ch.x_bytes}, yv = {p->y, y};
        void *ews = ch.engine_ws > 0 ? base + ch.x_bytes + ch.y_bytes : NULL;
        const void *bb = p->has_bias ? b : NULL;
        CW__CUDA_GOTO(ctx, st, unlock, cw__cu_copy_view(s, &xpv, &xv, NULL, CW_F32));
        if ((st = cw__execute(c, s, ch.plan, xpv.data, w, NULL, ypv.data, ews)) != CW_OK) goto unlock;
        CW__CUDA_GOTO(ctx, st, unlock, cw__cu_copy_view(s, &yv, &ypv, bb, p->w.dtype));
        *bias_done = bb != NULL;
    }
unlock:
    pthread_mutex_unlock(&c->mu);
    return st;
}

/* Autotune's host half, under c->mu: the plan of each of ids (exact ids; ch[i].plan is NULL
 * where ids[i] has none) and the times cached for them into ms. Returns how many still need
 * timing; *e is the problem's entry, *ws_max the largest workspace of the plans. */
static int cw__autotune_plans(cw__cudnn_conv *c, const cw__conv_problem *p, const int64_t align[3], const int *ids,
                              int n, float *ms, cw__cudnn_choice *ch, cw__cudnn_entry **e, int64_t *ws_max) {
    int todo = 0;
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < n; i++) {
        cw_status s1 = cw__conv_plan_locked(c, p, align, ids[i], INT64_MAX, 1, 1, &ch[i], e);
        if (s1 != CW_OK || ch[i].id != ids[i]) {
            ch[i].plan = NULL;
            continue;
        }
        for (int k = 0; k < (*e)->n; k++)
            if ((*e)->cfgs[k].id == ids[i] && (*e)->cfgs[k].tuned_ms != 0.0f) ms[i] = (*e)->cfgs[k].tuned_ms;
        if (ms[i] < 0.0f) todo++;
        if (ch[i].total_ws > *ws_max) *ws_max = ch[i].total_ws;
    }
    pthread_mutex_unlock(&c->mu);
    return todo;
}

/* Device scratch for timing p, zeroed so timing runs on finite data (garbage may hold NaNs
 * and denormals): bufs x, w, y, b, ws (ws_bytes), and the two timing events. What it made
 * before a failure is left for cw__autotune_release. */
static cw_status cw__autotune_scratch(cw_context *ctx, cudaStream_t s, const cw__conv_problem *p, int64_t ws_bytes,
                                      void *bufs[5], cudaEvent_t ev[2], int64_t *syncs) {
    const int64_t sizes[5] = {cw__desc_span_bytes(&p->x), cw__desc_span_bytes(&p->w), cw__desc_span_bytes(&p->y),
                              p->y.dims[1] * (int64_t)cw_dtype_size(p->w.dtype), ws_bytes};
    for (int i = 0; i < 5; i++) {
        if (sizes[i] <= 0) continue;
        (*syncs)++;
        CW__CUDA_CHECK(ctx, cudaMalloc(&bufs[i], (size_t)sizes[i]));
        CW__CUDA_CHECK(ctx, cudaMemsetAsync(bufs[i], 0, (size_t)sizes[i], s));
    }
    CW__CUDA_CHECK(ctx, cudaEventCreate(&ev[0]));
    CW__CUDA_CHECK(ctx, cudaEventCreate(&ev[1]));
    return CW_OK;
}

/* Times config id on the scratch: reps runs after a warm-up; the best time in *t_ms, or
 * -1 when the config cannot run here. Fails only on a CUDA error around the runs (then
 * *t_ms is left alone). */
static cw_status cw__autotune_time(cw__cudnn_conv *c, cudaStream_t s, const cw__conv_problem *p, int id, int reps,
                                   void *const bufs[5], int64_t ws_bytes, cudaEvent_t ev[2], int64_t *syncs,
                                   float *t_ms) {
    cw_context *ctx = c->ctx;
    float t_best = -1.0f;
    for (int r = 0; r <= reps; r++) { /* r = 0 warms up */
        int bias_done = 0;
        float t = 0.0f;
        CW__CUDA_CHECK(ctx, cudaEventRecord(ev[0], s));
        cw_status rs = cw__cudnn_conv_run(c, s, p, id, bufs[0], bufs[1], bufs[3], bufs[2], bufs[4], ws_bytes,
                                          &bias_done);
        if (rs == CW_OK && p->has_bias && !bias_done)
            CW__CUDA_CHECK(ctx, cw__cu_bias_add(s, &(cw__view){p->y, bufs[2]}, bufs[3], p->w.dtype));
        CW__CUDA_CHECK(ctx, cudaEventRecord(ev[1], s));
        (*syncs)++;
        CW__CUDA_CHECK(ctx, cudaEventSynchronize(ev[1]));
        if (rs != CW_OK) break; /* this engine cannot run here: not a candidate */
        CW__CUDA_CHECK(ctx, cudaEventElapsedTime(&t, ev[0], ev[1]));
        if (r > 0 && (t_best < 0.0f || t < t_best)) t_best = t;
    }
    *t_ms = t_best;
    return CW_OK;
}

/* Caches config id's time in e (< 0: it failed to run, so it is not timed again). */
static void cw__autotune_record(cw__cudnn_conv *c, cw__cudnn_entry *e, int id, float t_ms) {
    pthread_mutex_lock(&c->mu);
    for (int k = 0; e && k < e->n; k++)
        if (e->cfgs[k].id == id) e->cfgs[k].tuned_ms = t_ms < 0.0f ? -1.0f : t_ms;
    pthread_mutex_unlock(&c->mu);
}

/* Frees what cw__autotune_scratch made (each cudaFree may synchronise: counted) and clears
 * the CUDA error state. */
static void cw__autotune_release(void *bufs[5], cudaEvent_t ev[2], int64_t *syncs) {
    for (int i = 0; i < 2; i++)
        if (ev[i]) (void)cudaEventDestroy(ev[i]);
    for (int i = 0; i < 5; i++)
        if (bufs[i]) {
            (*syncs)++;
            (void)cudaFree(bufs[i]);
        }
    (void)cudaGetLastError();
}

cw_status cw__cudnn_conv_autotune(cw__cudnn_conv *c, cudaStream_t s, const cw__conv_problem *p, const int *ids,
                                  int n, int reps, float *ms, int *best, int64_t *syncs) {
    cw_context *ctx = c->ctx;
    cw_status st = CW_OK;
    int64_t align[3];
    void *bufs[5] = {0}; /* x, w, y, b, ws */
    cudaEvent_t ev[2] = {0};
    cw__cudnn_choice ch[CW__CUDNN_MAX_CFGS];
    cw__cudnn_entry *e = NULL;
    int64_t ws_max = 0;
    *best = -1;
    *syncs = 0;
    if (!c->handle) return cw__error(ctx, CW_ERR_NO_DEVICE, "cudnn conv: autotune needs a device");
    if (n < 1 || n > CW__CUDNN_MAX_CFGS || !ids || !ms)
        return cw__error(ctx, CW_ERR_INVALID_ARG, "cudnn conv: autotune of %d candidates", n);
    if (reps < 1) reps = 1;
    for (int i = 0; i < n; i++) ms[i] = -1.0f;
    if (cw__cudnn_empty_input(p)) { /* a fill: nothing to choose */
        *best = 0;
        return CW_OK;
    }
    cw__cudnn_layout_align(p, align);
    /* plans first (host only); cached times need no device work */
    if (cw__autotune_plans(c, p, align, ids, n, ms, ch, &e, &ws_max) > 0) {
        if ((st = cw__autotune_scratch(ctx, s, p, ws_max, bufs, ev, syncs)) != CW_OK) goto done;
        for (int i = 0; i < n; i++) {
            if (!ch[i].plan || ms[i] >= 0.0f) continue;
            if ((st = cw__autotune_time(c, s, p, ids[i], reps, bufs, ws_max, ev, syncs, &ms[i])) != CW_OK) goto done;
            cw__autotune_record(c, e, ids[i], ms[i]);
        }
    }
    for (int i = 0; i < n; i++)
        if (ms[i] >= 0.0f && (*best < 0 || ms[i] < ms[*best])) *best = i;
    if (*best < 0) st = cw__error(ctx, CW_ERR_UNSUPPORTED, "cudnn conv: autotune: none of %d candidates ran", n);
done:
    cw__autotune_release(bufs, ev, syncs);
    return st;
}

void cw__cudnn_conv_counters(cw__cudnn_conv *c, int64_t *problems, int64_t *plans, int64_t *hits,
                             int64_t *evicted) {
    pthread_mutex_lock(&c->mu);
    if (evicted) *evicted = c->n_evicted;
    if (problems) *problems = c->n_problems;
    if (plans) *plans = c->n_plans;
    if (hits) *hits = c->n_hits;
    pthread_mutex_unlock(&c->mu);
}

void cw__cudnn_conv_late(cw__cudnn_conv *c, int64_t *late_plans, int64_t *substitutions) {
    pthread_mutex_lock(&c->mu);
    if (late_plans) *late_plans = c->n_late;
    if (substitutions) *substitutions = c->n_subst;
    pthread_mutex_unlock(&c->mu);
}
