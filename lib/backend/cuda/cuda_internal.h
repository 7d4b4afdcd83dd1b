/* Internals of the cuda backend: its stream/event objects, the kernel launchers of
 * kernels.cu (C linkage, they return the launch's cudaError_t for the caller's check
 * macro), and the cuDNN graph-API convolution layer (cudnn_graph.c, cudnn_engines.c,
 * cudnn_cache.c, cudnn_run.c), whose descriptor and engine-list code runs without a
 * device (tests/test_cudnn_desc.c). */
#ifndef CW_CUDA_INTERNAL_H
#define CW_CUDA_INTERNAL_H

#include <cuda_runtime_api.h>
#include <cudnn.h>

#include "backend/backend.h"

#ifndef __CUDACC__
#include <pthread.h>
#include <stdatomic.h>

#include "backend/cuda/cuda_check.h"
#endif

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
 * validated shapes. Each returns cudaGetLastError() after its launch(es). Views that fold to
 * rank 4 with 32-bit offsets run row kernels (vector loads where aligned); others a generic
 * strided kernel. Every kernel is compiled with __launch_bounds__(256) and launched with 256
 * threads; grids are capped at 65536 blocks (grid-stride loops beyond). */
#define CW__CU_MAX_VIEWS 3
/* Doubles-triples of GroupNorm chunk partials one stream's scratch holds (24 B each): the
 * statistics of one launch are split into at most this many blocks in total. */
#define CW__CU_GN_SCRATCH_PARTS 8192
CW__CU_LOCAL cudaError_t cw__cu_fill32(cudaStream_t s, void *p, uint32_t pattern, int64_t count);
/* y[n, k, ...] = b[k] (b may be NULL: zero) over a strided view: the output of a patch whose
 * input rows are all padding, in one pass. b has dtype b_dtype. */
CW__CU_LOCAL cudaError_t cw__cu_fill_bias(cudaStream_t s, const cw__view *y, const void *b, cw_dtype b_dtype);
/* y[n, k, ...] += b[k]; b has dtype b_dtype. */
CW__CU_LOCAL cudaError_t cw__cu_bias_add(cudaStream_t s, const cw__view *y, const void *b, cw_dtype b_dtype);
CW__CU_LOCAL cudaError_t cw__cu_add(cudaStream_t s, const cw__view *dst, const cw__view *a, const cw__view *b);
/* The generic op a (checked by cw__op_run): a case per CW_OP_* code, next to its kernel
 * (the per-channel ops run the add's kernels with v as the bias). */
CW__CU_LOCAL cudaError_t cw__cu_op(cudaStream_t s, const cw__op_args *a);
/* dst = src (+ b[k] where b is not NULL) elementwise (equal dims, any strides and dtypes):
 * packing a patch, and unpacking it with the bias as the epilogue. */
CW__CU_LOCAL cudaError_t cw__cu_copy_view(cudaStream_t s, const cw__view *dst, const cw__view *src, const void *b,
                                          cw_dtype b_dtype);
CW__CU_LOCAL cudaError_t cw__cu_prep(cudaStream_t s, const cw__prep_params *p);
/* scratch (may be NULL): CW__CU_GN_SCRATCH_PARTS * 3 doubles of device memory owned by the
 * stream s (stream order keeps launches apart). With it, each (n, g) is split into many
 * chunks merged in chunk order by a second kernel; without it one block per (n, g). */
CW__CU_LOCAL cudaError_t cw__cu_gn_stats(cudaStream_t s, const cw__view *x, int64_t groups, double *out,
                                         double *scratch, int64_t scratch_parts);
CW__CU_LOCAL cudaError_t cw__cu_gn_finalize(cudaStream_t s, const double *parts, int64_t n_parts, int64_t n, int64_t c,
                               int64_t groups, const float *gamma, const float *beta, float eps, float *scale,
                               float *shift);
CW__CU_LOCAL cudaError_t cw__cu_softmax_rows(cudaStream_t s, float *x, int64_t rows, int64_t cols, int64_t ld);
/* cudaSuccess when this build's kernels have an image the current device can run with 256
 * threads per block (their launch bounds). */
CW__CU_LOCAL cudaError_t cw__cu_probe(void);
/* Host-only, for tests: the chunk count (and rows per chunk) gn_stats uses for a group of
 * cpg channels of h x w over n * groups groups with scratch_parts of scratch. */
CW__CU_LOCAL int cw__cu_gn_chunks(int64_t n, int64_t groups, int64_t cpg, int64_t h, int64_t w, int64_t scratch_parts,
                                  int64_t *rows_per_chunk);
/* Host-only self-test of the launchers' index math (32-bit division by multiply-high, the
 * rank-4 folding, the chunk plan): 0, or 1 with what failed in msg. */
CW__CU_LOCAL int cw__cu_selftest_host(char *msg, size_t len);

#ifdef __cplusplus
}
#endif

#ifndef __CUDACC__
/* ---- cuda_backend.c --------------------------------------------------------------------- */
struct cw__stream {
    cudaStream_t cs;
    int owned;          /* 0: a caller's stream (cw_context_set_cuda_stream), never destroyed here */
    double *gn_scratch; /* CW__CU_GN_SCRATCH_PARTS * 3 doubles for gn_stats chunks; may be NULL */
};
struct cw__event {
    cudaEvent_t ev;
};
/* Device timestamps for traces: n events created with timing, recorded by timer_mark. */
struct cw__timer {
    int n;
    cudaEvent_t *ev;
    unsigned char *recorded; /* marks recorded since the last timer_read */
};

/* ---- cudnn_*.c: convolution through the cuDNN 9 graph (backend) API --------------------
 * Tensor unique ids in every operation graph and variant pack. */
enum { CW__CUDNN_UID_X = 1, CW__CUDNN_UID_W = 2, CW__CUDNN_UID_Y = 3, CW__CUDNN_UID_B = 4, CW__CUDNN_UID_T = 5 };
/* At most this many engine configs are kept per problem (heuristics give ~10-40). */
#define CW__CUDNN_MAX_CFGS 64

/* The descriptors of one convolution: x, w, y tensors, the convolution, the forward
 * operation and the operation graph holding it. With the bias fused: the convolution writes
 * a virtual f32 tensor t (y's dims), a pointwise add of b ([1, K, 1, 1(, 1)], w's dtype)
 * writes y; otherwise b, t, pw and add are NULL. */
typedef struct cw__cudnn_graph {
    cudnnBackendDescriptor_t x, w, y, conv, op, graph;
    cudnnBackendDescriptor_t b, t, pw, add;
} cw__cudnn_graph;

/* Validates what cuDNN does not (dtypes equal and supported, ranks = spatial + 2, groups),
 * recording a message naming the field. */
cw_status cw__cudnn_problem_check(cw_context *ctx, const cw__conv_problem *p);
/* Byte alignment (1..16, a power of two) of x, w, y that p's layout guarantees when each
 * tensor's base is 16-byte aligned: a patch view starts at a row of its tensor, so its
 * pointer moves by a multiple of the H stride only (and, for 3-D, the D stride, in case
 * patches ever move along D); w is never offset. Channels-last views (C stride 1) keep 16
 * bytes where the row stride allows it. Pointers are checked against it at run time. */
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
                                cudnnHandle_t handle, int fuse_bias, cw__cudnn_graph *g);
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
/* flags: CW__CUDNN_TF32 lets f32 convolutions use TF32 tensor-core engines (opt-in: about
 * 1e-3 relative instead of 1e-5); CW__CUDNN_NO_FUSE never lists bias-fused configs. */
enum { CW__CUDNN_TF32 = 1, CW__CUDNN_NO_FUSE = 2 };
cw_status cw__cudnn_conv_create(cw__cudnn_conv **out, cw_context *ctx, cudnnHandle_t handle,
                                cudnnBackendDescriptor_t devprop, unsigned flags);
void cw__cudnn_conv_destroy(cw__cudnn_conv *c);
/* Engine configs for p (layout alignment), fastest first: heuristics mode A, then
 * FALLBACK's not already listed, without nondeterministic or reduced-precision engines
 * (and, for f32 data, without TF32 tensor-core engines unless CW__CUDNN_TF32). Each engine
 * appears once at its best-ranked knobs, then once more ("lean") where another of its
 * configs needs less workspace. Where p has a bias, configs of the graph with the bias
 * fused (a pointwise add after the convolution, so no separate pass over y; "fused" in the
 * name) alternate with the unfused ones, each in its own heuristic order, a fused one
 * first for f16/bf16 data (whose fused engines are the tensor-core ones), an unfused one
 * first for f32. Where x or y spans >= 2^31 elements (cuDNN's fast
 * engines use 32-bit offsets) "packed" variants come first: x and y copied through
 * contiguous buffers at the start of the workspace, which their workspace includes (the
 * bias is then added by the copy back). id encodes (engine, fused, lean, packed), so the
 * same id means the same engine for every patch of a conv; name "cudnn engine <global
 * index>[ fused][ lean][ packed]"; cost = rank. Engines whose workspace cuDNN reports as
 * negative are unusable and never listed. CW_ERR_UNSUPPORTED when cuDNN offers no engine. */
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
    int fused;                /* the plan adds the bias (variant pack binds it) */
    int substituted;          /* id is not the one asked for (not listed or not fitting) */
    int64_t engine_ws;        /* cuDNN's workspace bytes */
    int64_t total_ws;         /* engine_ws plus the packed copies */
    int64_t x_bytes, y_bytes; /* rounded bytes of the copies (packed only) */
    cw_tensor_desc xp, yp;    /* their contiguous descriptors (packed only) */
} cw__cudnn_choice;
/* The finalised execution plan for algorithm `id` of (p, align), built once and cached; if
 * that id is not listed for this problem, needs more than ws_cap bytes, or cannot be
 * finalised (or its plan reports a negative workspace: unusable), the first listed config
 * (rank order) that fits ws_cap is used instead and out->substituted says so.
 * allow_packed = 0 skips packed configs, allow_fused = 0 bias-fused ones. */
cw_status cw__cudnn_conv_plan(cw__cudnn_conv *c, const cw__conv_problem *p, const int64_t align[3], int id,
                              int64_t ws_cap, int allow_packed, int allow_fused, cw__cudnn_choice *out);
/* What cw__cudnn_conv_run will use for (p, id, ws_cap) with 16-byte aligned pointers: the
 * plan finalised now (host only, no device work; with a device-properties descriptor it
 * needs no device at all), so a run finalises nothing. The scheduler calls it through the
 * backend's conv_prepare hook at compile time for every patch task. */
cw_status cw__cudnn_conv_prepare(cw__cudnn_conv *c, const cw__conv_problem *p, int id, int64_t ws_cap,
                                 cw__cudnn_choice *out);
/* Runs y = conv(x, w) (+ b when *bias_done is set on return: a fused plan, or the packed
 * copy back) on stream s (needs the handle): picks the alignment key from the pointers, the
 * plan as above, packs if the config says so, binds the variant pack. A plan finalised here
 * (not prepared) or a substituted algorithm is logged at warn once per problem and counted
 * (cw__cudnn_conv_counters: late plans). */
cw_status cw__cudnn_conv_run(cw__cudnn_conv *c, cudaStream_t s, const cw__conv_problem *p, int id, const void *x,
                             const void *w, const void *b, void *y, void *ws, int64_t ws_bytes, int *bias_done);
/* Times candidate algorithms of p on the device (needs the handle): each id's plan (exact
 * id, no substitute) is run once to warm up and `reps` times timed with event pairs on
 * stream s, on scratch buffers of p's spans and the largest workspace allocated here with
 * cudaMalloc (and freed: call at compile time, never inside a run). Times are cached per
 * (problem, id); ms[i] gets the best time of ids[i] (< 0: it could not run), *best the index
 * of the fastest. *allocs counts the cudaMalloc/cudaFree/synchronising calls made. */
cw_status cw__cudnn_conv_autotune(cw__cudnn_conv *c, cudaStream_t s, const cw__conv_problem *p, const int *ids,
                                  int n, int reps, float *ms, int *best, int64_t *syncs);
/* Counters for tests: problems listed (cache misses), plans finalised, lookups served from
 * the cache, plan-less lists evicted (beyond 128 of them, oldest first). Any may be NULL. */
void cw__cudnn_conv_counters(cw__cudnn_conv *c, int64_t *problems, int64_t *plans, int64_t *hits,
                             int64_t *evicted);
/* Plans finalised inside cw__cudnn_conv_run (not prepared beforehand) and algorithm
 * substitutions made there: finalising may compile and load kernels (a device-wide
 * synchronisation), so the backend counts late plans as host synchronisations. */
void cw__cudnn_conv_late(cw__cudnn_conv *c, int64_t *late_plans, int64_t *substitutions);

/* ---- the backend object, shared by cuda_backend.c (runtime) and cuda_ops.c (ops) ------- */
typedef struct cw__cuda {
    cw__backend base;
    int device;
    unsigned event_flags;  /* cudaEventDisableTiming unless CW_FLAG_TIMING */
    cudnnHandle_t dnn;
    cublasHandle_t blas;
    pthread_mutex_t blas_mu; /* the cuBLAS handle's stream is shared state */
    int blas_mu_init;
    cudaStream_t copy;     /* synchronous uploads/downloads run here, then wait */
    cw__cudnn_conv *conv;
    int autotune;          /* CW_FLAG_CUDA_AUTOTUNE */
    _Atomic int64_t host_syncs;
} cw__cuda;

static inline void cw__sync_count(cw__cuda *cb, int64_t n) { atomic_fetch_add(&cb->host_syncs, n); }

static inline cw__cuda *cw__cb(cw__backend *be) { return (cw__cuda *)be; }

/* Hooks may be called from threads whose current device is another one (multi-GPU
 * callers): switch for the call and restore the caller's device afterwards. */
static inline cw_status cw__enter(cw__cuda *cb, int *prev) {
    CW__CUDA_CHECK(cb->base.ctx, cudaGetDevice(prev));
    if (*prev != cb->device) CW__CUDA_CHECK(cb->base.ctx, cudaSetDevice(cb->device));
    return CW_OK;
}

static inline void cw__leave(cw__cuda *cb, int prev) {
    if (prev != cb->device) (void)cudaSetDevice(prev);
}

#define CW__ENTER(cb)                                      \
    int cw_prev_dev_;                                      \
    do {                                                   \
        cw_status cw_es_ = cw__enter((cb), &cw_prev_dev_); \
        if (cw_es_ != CW_OK) return cw_es_;                \
    } while (0)
#define CW__LEAVE(cb, st) (cw__leave((cb), cw_prev_dev_), (st))

/* cuda_ops.c: the ops table. */
extern const cw__ops_i cw__cuda_ops;
#endif

#endif
