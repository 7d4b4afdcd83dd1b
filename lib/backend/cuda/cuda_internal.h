/* Internals of the cuda backend: its stream/event objects, the kernel launchers of
 * kernels.cu (C linkage, they return the launch's cudaError_t for the caller's check
 * macro), and the cuDNN graph-API convolution layer of cudnn_conv.c, whose descriptor
 * and engine-list code runs without a device (tests/test_cudnn_desc.c). */
#ifndef CW_CUDA_INTERNAL_H
#define CW_CUDA_INTERNAL_H

#include <cuda_runtime_api.h>
#include <cudnn.h>

#include "backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* nvcc does not get the C visibility preset: keep the launchers out of the shared
 * library's exports explicitly. */
#if defined(__GNUC__)
#define CW__CU_LOCAL __attribute__((visibility("hidden")))
#else
#define CW__CU_LOCAL
#endif

/* ---- kernels.cu ------------------------------------------------------------------------
 * Views may be any dtype (f32/f16/bf16; math in f32, statistics in double); the caller has
 * validated shapes. Each returns cudaGetLastError() after its launch(es). */
CW__CU_LOCAL cudaError_t cw__cu_fill32(cudaStream_t s, void *p, uint32_t pattern, int64_t count);
/* y[n, k, ...] = 0 over a strided view (patches whose input rows are all padding). */
CW__CU_LOCAL cudaError_t cw__cu_zero_view(cudaStream_t s, const cw__view *y);
/* y[n, k, ...] += b[k]; b has dtype b_dtype. */
CW__CU_LOCAL cudaError_t cw__cu_bias_add(cudaStream_t s, const cw__view *y, const void *b, cw_dtype b_dtype);
CW__CU_LOCAL cudaError_t cw__cu_add(cudaStream_t s, const cw__view *dst, const cw__view *a, const cw__view *b);
/* dst = src elementwise (equal dims, any strides and dtypes): packing a patch. */
CW__CU_LOCAL cudaError_t cw__cu_copy_view(cudaStream_t s, const cw__view *dst, const cw__view *src);
CW__CU_LOCAL cudaError_t cw__cu_prep(cudaStream_t s, const cw__prep_params *p);
CW__CU_LOCAL cudaError_t cw__cu_gn_stats(cudaStream_t s, const cw__view *x, int64_t groups, double *out);
CW__CU_LOCAL cudaError_t cw__cu_gn_finalize(cudaStream_t s, const double *parts, int64_t n_parts, int64_t n, int64_t c,
                               int64_t groups, const float *gamma, const float *beta, float eps, float *scale,
                               float *shift);
CW__CU_LOCAL cudaError_t cw__cu_softmax_rows(cudaStream_t s, float *x, int64_t rows, int64_t cols, int64_t ld);
/* cudaSuccess when this build's kernels have an image the current device can run. */
CW__CU_LOCAL cudaError_t cw__cu_probe(void);

#ifdef __cplusplus
}
#endif

#ifndef __CUDACC__
/* ---- cuda_backend.c --------------------------------------------------------------------- */
struct cw__stream {
    cudaStream_t cs;
    int owned; /* 0: a caller's stream (cw_context_set_cuda_stream), never destroyed here */
};
struct cw__event {
    cudaEvent_t ev;
};

/* ---- cudnn_conv.c: convolution through the cuDNN 9 graph (backend) API --------------------
 * Tensor unique ids in every operation graph and variant pack. */
enum { CW__CUDNN_UID_X = 1, CW__CUDNN_UID_W = 2, CW__CUDNN_UID_Y = 3 };
/* At most this many engine configs are kept per problem (heuristics give ~10-40). */
#define CW__CUDNN_MAX_CFGS 64

/* The descriptors of one convolution: x, w, y tensors, the convolution, the forward
 * operation and the operation graph holding it. */
typedef struct cw__cudnn_graph {
    cudnnBackendDescriptor_t x, w, y, conv, op, graph;
} cw__cudnn_graph;

/* Validates what cuDNN does not (dtypes equal and supported, ranks = spatial + 2, groups),
 * recording a message naming the field. */
cw_status cw__cudnn_problem_check(cw_context *ctx, const cw__conv_problem *p);
/* Byte alignment (1..16, a power of two) of x, w, y that p's layout guarantees when each
 * tensor's base is 16-byte aligned: a patch view starts at a row of its tensor, so its
 * pointer moves by multiples of the outer strides (innermost index always 0). */
void cw__cudnn_layout_align(const cw__conv_problem *p, int64_t align[3]);
/* Largest power of two <= 16 dividing ptr. */
int64_t cw__cudnn_ptr_align(const void *ptr);
/* Builds and finalises the x, w, y tensor descriptors (dims and strides of p's views,
 * byte alignments align[0..2], unique ids above), the convolution descriptor (per-patch
 * pre/post paddings, strides, dilations, cross-correlation, f32 compute; groups through
 * w's channel dim), the forward operation and the operation graph. Needs no device and
 * no handle: handle may be NULL (it is attached to the graph when given). cuDNN validates
 * the shapes at the operation's finalize: a wrong y shape gives CW_ERR_INVALID_ARG with
 * cuDNN's reason in the message. On failure everything built is destroyed. */
cw_status cw__cudnn_graph_build(cw_context *ctx, const cw__conv_problem *p, const int64_t align[3],
                                cudnnHandle_t handle, cw__cudnn_graph *g);
void cw__cudnn_graph_destroy(cw__cudnn_graph *g);
/* Number of engines cuDNN has for a finalised graph (CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT). */
cw_status cw__cudnn_graph_engine_count(cw_context *ctx, const cw__cudnn_graph *g, int64_t *out);

/* A device-properties descriptor from its JSON form (cuDNN >= 9.8): lets heuristics and
 * execution-plan finalisation run without a device (deviceless AOT compilation). */
cw_status cw__cudnn_devprop_from_json(cw_context *ctx, const char *json, cudnnBackendDescriptor_t *out);

/* The per-backend engine/plan cache. handle (may be NULL without a device) is attached to
 * graphs and plans; devprop (may be NULL) is used for heuristics and plans instead of
 * the current device. Both stay owned by the caller. */
typedef struct cw__cudnn_conv cw__cudnn_conv;
cw_status cw__cudnn_conv_create(cw__cudnn_conv **out, cw_context *ctx, cudnnHandle_t handle,
                                cudnnBackendDescriptor_t devprop);
void cw__cudnn_conv_destroy(cw__cudnn_conv *c);
/* Engine configs for p (layout alignment), fastest first: heuristics mode A, then
 * FALLBACK's not already listed, without nondeterministic or reduced-precision engines
 * (and, for f32 data, without TF32 tensor-core engines). Each engine appears once at its
 * best-ranked knobs, then once more ("lean") where another of its configs needs less
 * workspace. Where x or y spans >= 2^31 elements (cuDNN's fast engines use 32-bit
 * offsets) "packed" variants come first: x and y copied through contiguous buffers at the
 * start of the workspace, which their workspace includes. id encodes (engine, lean,
 * packed), so the same id means the same engine for every patch of a conv; name "cudnn
 * engine <global index>[ lean][ packed]"; cost = rank. CW_ERR_UNSUPPORTED when cuDNN
 * offers no engine. */
cw_status cw__cudnn_conv_algos(cw__cudnn_conv *c, const cw__conv_problem *p, cw__conv_algo *out, int max, int *n);
/* 1 when x has no rows (a patch that reads only padding: its output is the bias). Such a
 * problem lists the algorithms of a 1-row stand-in with the same output shape, at zero
 * workspace, so ids match the conv's other bands. */
int cw__cudnn_empty_input(const cw__conv_problem *p);

/* What cw__cudnn_conv_plan picked. The plan stays owned by the cache. */
typedef struct cw__cudnn_choice {
    cudnnBackendDescriptor_t plan;
    int id;                   /* the algorithm id used */
    int packed;               /* x, y pass through contiguous copies at the start of ws */
    int64_t engine_ws;        /* cuDNN's workspace bytes */
    int64_t total_ws;         /* engine_ws plus the packed copies */
    int64_t x_bytes, y_bytes; /* rounded bytes of the copies (packed only) */
    cw_tensor_desc xp, yp;    /* their contiguous descriptors (packed only) */
} cw__cudnn_choice;
/* The finalised execution plan for algorithm `id` of (p, align), built once and cached; if
 * that id is not listed for this problem, needs more than ws_cap bytes, or cannot be
 * finalised, the first listed config (rank order) that fits ws_cap is used instead.
 * allow_packed = 0 skips packed configs. */
cw_status cw__cudnn_conv_plan(cw__cudnn_conv *c, const cw__conv_problem *p, const int64_t align[3], int id,
                              int64_t ws_cap, int allow_packed, cw__cudnn_choice *out);
/* Runs y = conv(x, w) on stream s (needs the handle): picks the alignment key from the
 * pointers, the plan as above, packs if the config says so, binds the variant pack. */
cw_status cw__cudnn_conv_run(cw__cudnn_conv *c, cudaStream_t s, const cw__conv_problem *p, int id, const void *x,
                             const void *w, void *y, void *ws, int64_t ws_bytes);
/* Counters for tests: problems listed (cache misses), plans finalised, lookups served from
 * the cache, plan-less lists evicted (beyond 128 of them, oldest first). Any may be NULL. */
void cw__cudnn_conv_counters(cw__cudnn_conv *c, int64_t *problems, int64_t *plans, int64_t *hits,
                             int64_t *evicted);
#endif

#endif
