/* convweave — convolutions scheduled across streams under a hard temporary-memory cap.
 * This header is the whole public API. Every call that can fail returns a cw_status, and on
 * failure the context keeps a human-readable message (cw_context_get_last_error) naming the
 * argument, shape or offset. The calls that return something else cannot fail and say
 * "Infallible" with what they return for a NULL argument: the version and status strings,
 * destroy functions and cw_free (which accept NULL), and a few getters of values the
 * object always has (last error, backend name, host syncs, a tensor's desc and data,
 * cw_tensor_desc_numel, cw_dtype_size, cw_context_reset_peak_stats). Byte counts are
 * int64_t throughout; size_t appears only for sizes of C objects (config `size` fields,
 * cw_dtype_size). */
#ifndef CONVWEAVE_H
#define CONVWEAVE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define CW_API
#elif defined(__GNUC__)
#define CW_API __attribute__((visibility("default")))
#else
#define CW_API
#endif

#define CW_VERSION_MAJOR 0
#define CW_VERSION_MINOR 1
#define CW_VERSION_PATCH 0
#define CW_VERSION_NUMBER (CW_VERSION_MAJOR * 10000 + CW_VERSION_MINOR * 100 + CW_VERSION_PATCH)

/* Conventions. Constructors (cw_<object>_create, cw_tensor_wrap) take the new handle
 * first: cw_context_create(&ctx, cfg), cw_tensor_create(&t, ctx, desc). Every other call
 * takes the object it acts on first, then its out-parameters, then its inputs:
 * cw_graph_conv(g, &y, x, w, b, p), cw_graph_min_budget(g, &bytes, opt). One exception:
 * the context's stream slots are addressed right after the context, so the set/get pair
 * reads alike (convweave_cuda.h: cw_context_set_cuda_stream(ctx, index, s),
 * cw_context_get_cuda_stream(ctx, index, &s)). A call that reads a property of an object
 * is cw_<object>_get_<property> (cw_plan_get_stats). */

/* Returns CW_VERSION_NUMBER of the library actually loaded (may differ from the header).
 * Infallible, like every function up to cw_context_create. */
CW_API int cw_version(void);
/* Returns the version as a static string, e.g. "0.1.0". */
CW_API const char *cw_version_string(void);

/* ---------------------------------------------------------------------------------------
 * Status codes. Append-only: never renumber. */
#define CW_STATUS_MAP(XX)                                                          \
    XX(OK, 0, "success")                                                           \
    XX(ERR_INVALID_ARG, 1, "invalid argument")                                     \
    XX(ERR_UNSUPPORTED, 2, "unsupported")                                          \
    XX(ERR_BUDGET, 3, "temporary-memory budget too small")                         \
    XX(ERR_OUT_OF_MEMORY, 4, "out of memory")                                      \
    XX(ERR_BACKEND, 5, "backend error")                                            \
    XX(ERR_NO_DEVICE, 6, "no device")                                              \
    XX(ERR_IO, 7, "I/O error")                                                     \
    XX(ERR_FORMAT, 8, "malformed file")                                            \
    XX(ERR_INTERNAL, 9, "internal error")                                         \
    XX(ERR_COMM, 10, "communication between ranks failed")

typedef enum cw_status {
#define CW__STATUS_ENUM(name, val, str) CW_##name = val,
    CW_STATUS_MAP(CW__STATUS_ENUM)
#undef CW__STATUS_ENUM
    CW_STATUS_COUNT__
} cw_status;

/* Returns a static description of a status ("invalid argument"); "unknown status" else. */
CW_API const char *cw_status_string(cw_status s);
/* Returns the status's symbolic name ("CW_ERR_BUDGET"); "CW_UNKNOWN" else. */
CW_API const char *cw_status_name(cw_status s);

/* Parses a byte size, the one grammar of every budget the library's users take (cw-vae's
 * --budget and --memory, the Python package's budget=): a decimal number (digits with an
 * optional fraction and exponent: "256", "1.5", "1e9") then an optional unit, any case: B,
 * KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024); spaces may
 * surround the number and precede the unit. "unlimited" and "none" (any case) give -1.
 * Sets *out_bytes to the size rounded to whole bytes (>= 0) and returns CW_OK; anything
 * else (a sign, hex, inf, an unknown unit, 2^63 bytes or more, s NULL) returns
 * CW_ERR_INVALID_ARG and leaves *out_bytes unchanged. Locale-independent; no context. */
CW_API cw_status cw_parse_size(const char *s, int64_t *out_bytes);

/* ---------------------------------------------------------------------------------------
 * Logging. */
typedef enum cw_log_level {
    CW_LOG_ERROR = 0,
    CW_LOG_WARN = 1,
    CW_LOG_INFO = 2,
    CW_LOG_DEBUG = 3
} cw_log_level;

/* Called for each log line of at most `level` verbosity; msg has no trailing newline.
 * May be called from any thread the library runs; must be thread-safe. */
typedef void (*cw_log_fn)(void *user, cw_log_level level, const char *msg);

/* ---------------------------------------------------------------------------------------
 * Context: one backend, its streams, the budgeted temporary allocator. */
typedef struct cw_context cw_context;

typedef enum cw_backend_kind {
    CW_BACKEND_AUTO = 0, /* cuda where a device is usable, else cpu (with an info log line) */
    CW_BACKEND_CPU = 1,  /* worker threads as streams, OpenBLAS */
    CW_BACKEND_CUDA = 2  /* CUDA streams, cuDNN graph API; CW_ERR_NO_DEVICE without a GPU */
} cw_backend_kind;

enum {
    CW_FLAG_POISON = 1u << 0,     /* fill freed temporaries with NaN once free in stream order */
    CW_FLAG_CHAOS = 1u << 1,      /* cpu: seeded random delays before each queued item */
    CW_FLAG_NVTX = 1u << 2,       /* emit NVTX ranges (when compiled with NVTX) */
    CW_FLAG_TIMING = 1u << 3      /* record per-task times (trace, per-stage stats) */
};

#define CW_CONTEXT_CONFIG_VERSION 1
typedef struct cw_context_config {
    size_t size;              /* sizeof(cw_context_config) */
    int version;              /* CW_CONTEXT_CONFIG_VERSION */
    cw_backend_kind backend;  /* default CW_BACKEND_AUTO */
    int device;               /* CUDA device index; default 0 */
    int64_t temp_budget;      /* cap on temporary bytes (workspaces, patch buffers); <=0: unlimited */
    int streams;              /* default stream count for plans; >= 1; default 2 */
    uint32_t flags;           /* CW_FLAG_* */
    uint64_t chaos_seed;      /* seed for CW_FLAG_CHAOS; env CONVWEAVE_CHAOS_SEED overrides */
    int threads;              /* cpu: threads the ops use in total (<= 0: all cores); a plan gives
                                 each heavy stream's tasks threads / heavy streams. The cpu
                                 backend sets OpenBLAS to one thread (process-wide) and splits
                                 GEMMs itself, so results never depend on this count. */
    cw_log_fn log_fn;         /* NULL: stderr */
    void *log_user;
    cw_log_level log_level;   /* default CW_LOG_WARN */
} cw_context_config;

#define CW_CONTEXT_CONFIG_INIT                                                              \
    {                                                                                       \
        sizeof(cw_context_config), CW_CONTEXT_CONFIG_VERSION, CW_BACKEND_AUTO, 0, 0, 2, 0u, \
            0u, 0, NULL, NULL, CW_LOG_WARN                                                  \
    }

/* Creates a context. cfg may be NULL (defaults). Returns CW_ERR_INVALID_ARG for a config of
 * the wrong size/version or bad field, CW_ERR_NO_DEVICE for backend cuda without a usable
 * device, CW_ERR_OUT_OF_MEMORY. On failure *out is NULL; the message goes to the log. */
CW_API cw_status cw_context_create(cw_context **out, const cw_context_config *cfg);
/* Waits for all queued work, frees everything the context owns. Accepts NULL. */
CW_API void cw_context_destroy(cw_context *ctx);
/* The message of the last failed call on this context, from any thread ("" if none; ""
 * for NULL). Infallible. The context keeps one message, written and read under its lock;
 * the string returned is the calling thread's copy of it, valid until this thread calls
 * cw_context_get_last_error again. */
CW_API const char *cw_context_get_last_error(const cw_context *ctx);
/* Which backend the context runs ("cpu" or "cuda"). Infallible ("none" for NULL). */
CW_API const char *cw_context_get_backend_name(const cw_context *ctx);
/* Blocks until all work queued on the context's streams has finished. */
CW_API cw_status cw_context_synchronize(cw_context *ctx);

/* ---------------------------------------------------------------------------------------
 * Tensors (up to 5-D). Dims and strides in elements, outermost first. */
typedef enum cw_dtype { CW_F32 = 0, CW_F16 = 1, CW_BF16 = 2 } cw_dtype;

#define CW_MAX_RANK 5
typedef struct cw_tensor_desc {
    cw_dtype dtype;
    int rank;
    int64_t dims[CW_MAX_RANK];
    int64_t strides[CW_MAX_RANK]; /* all zero: contiguous (filled in by the library) */
} cw_tensor_desc;

/* Size of one element of dt in bytes (0 for an unknown dtype). Infallible. */
CW_API size_t cw_dtype_size(cw_dtype dt);
/* Converts n elements of host memory, src (of src_dtype) into dst (of dst_dtype), in host
 * byte order: f32 -> f16/bf16 rounds to nearest, ties to even (past the largest finite
 * value: inf; NaN stays a quiet NaN); f16/bf16 -> f32 is exact; f16 <-> bf16 goes through
 * an exact f32, so it rounds once; equal dtypes copy. dst and src must not overlap unless
 * the dtypes are equal. Returns CW_ERR_INVALID_ARG for an unknown dtype, n < 0, or a NULL
 * pointer with n > 0 (no context: there is no message). */
CW_API cw_status cw_dtype_convert(void *dst, cw_dtype dst_dtype, const void *src, cw_dtype src_dtype, int64_t n);
/* Fills d as a contiguous tensor of the given dims. Returns CW_ERR_INVALID_ARG for rank
 * outside 1..5 or a dim < 1. */
CW_API cw_status cw_tensor_desc_make(cw_tensor_desc *d, cw_dtype dt, int rank, const int64_t *dims);

typedef struct cw_tensor cw_tensor;
/* Allocates a device tensor (activations memory, not the temp budget). Contents undefined. */
CW_API cw_status cw_tensor_create(cw_tensor **out, cw_context *ctx, const cw_tensor_desc *desc);
/* Wraps caller device memory (host memory on the cpu backend); the caller keeps ownership
 * and must keep it alive while the tensor is used. */
CW_API cw_status cw_tensor_wrap(cw_tensor **out, cw_context *ctx, const cw_tensor_desc *desc, void *data);
/* Frees a tensor (and its memory if the library allocated it). Accepts NULL. */
CW_API void cw_tensor_destroy(cw_tensor *t);
/* The tensor's descriptor (dims and strides), owned by t. Infallible (NULL for NULL). */
CW_API const cw_tensor_desc *cw_tensor_get_desc(const cw_tensor *t);
/* Device pointer of the first element. Infallible (NULL for NULL). */
CW_API void *cw_tensor_get_data(const cw_tensor *t);
/* Copies `bytes` of host memory into a contiguous tensor (upload) or the tensor into host
 * memory (download), synchronously. bytes must equal the tensor's size (numel * element
 * size). Returns CW_ERR_INVALID_ARG for another byte count or a NULL host pointer,
 * CW_ERR_UNSUPPORTED for a strided view. */
CW_API cw_status cw_tensor_upload(cw_tensor *t, const void *host, int64_t bytes);
CW_API cw_status cw_tensor_download(const cw_tensor *t, void *host, int64_t bytes);
/* Number of elements of a descriptor. Infallible (0 for NULL). */
CW_API int64_t cw_tensor_desc_numel(const cw_tensor_desc *d);

/* ---------------------------------------------------------------------------------------
 * Temporary-memory statistics, named like torch.cuda.memory_stats(). */
typedef struct cw_memory_stats {
    int64_t budget;                 /* the cap; 0 = unlimited */
    int64_t reserved_bytes_current; /* bytes held from the device for temporaries */
    int64_t reserved_bytes_peak;
    int64_t allocated_bytes_current; /* bytes handed out and not yet freed */
    int64_t allocated_bytes_peak;
    int64_t num_allocs;             /* successful allocations */
    int64_t num_frees;
    int64_t cache_hits;             /* allocations served from a cached block */
    int64_t num_device_allocs;      /* segments taken from the device */
    int64_t num_device_frees;       /* segments given back */
    int64_t cross_stream_waits;     /* event waits inserted to reuse another stream's block */
    int64_t host_syncs;             /* host synchronisations the allocator had to make */
    int64_t budget_failures;        /* requests refused with CW_ERR_BUDGET */
    int64_t activations_bytes_current; /* tensors between graph stages */
    int64_t activations_bytes_peak;
} cw_memory_stats;

/* Fills *out with the context's temporary pool's statistics and the activation fields.
 * Returns CW_ERR_INVALID_ARG for a NULL argument. */
CW_API cw_status cw_context_get_memory_stats(cw_context *ctx, cw_memory_stats *out);
/* Resets the *_peak fields to the current values. Infallible (NULL: nothing). */
CW_API void cw_context_reset_peak_stats(cw_context *ctx);
/* Host synchronisations made by the backend since context creation (cpu: exact count).
 * Infallible (0 for NULL). */
CW_API int64_t cw_context_get_host_syncs(const cw_context *ctx);

/* ---------------------------------------------------------------------------------------
 * Where the context's memory comes from. Its caching allocators (temporaries under the
 * budget, and the activation arenas plans hold) take memory in segments and carve their
 * blocks from them; by default each segment comes from the backend (cudaMalloc; 64-byte
 * aligned host memory on cpu). A user allocator supplies the segments instead, e.g.
 * PyTorch's caching allocator (torch.cuda.caching_allocator_alloc), so that the library's
 * memory and the caller's come from one pool. It only supplies segments: the budget stays
 * the library's and stays hard (the allocator is never asked for more than temp_budget
 * bytes of temporaries in all), and cw_memory_stats counts its segments as
 * num_device_allocs / num_device_frees and reserved bytes. cw_tensor_create's memory and
 * the backends' own scratch (cuDNN, per-stream buffers) stay the backend's.
 *
 * alloc(user, bytes, stream) returns `bytes` bytes of device memory (host memory on cpu)
 * aligned to CW_ALLOCATOR_ALIGN bytes, or NULL when it has none. It is called when a pool
 * has no cached block that fits: at cw_graph_compile (a plan's temporary arena and its
 * activation arena), at the start of cw_plan_run when another plan's arena occupies the
 * shared pool or after cw_plan_release gave the plan's arenas back, and inside a run only in pools without a budget. `stream` is the library
 * stream in whose order the segment is first used: on cuda a cudaStream_t, on cpu an opaque
 * identifier of a worker stream (never dereference it). Outside a run it is the context's
 * stream 0 (the caller's stream where cw_context_set_cuda_stream set one); inside a run the
 * stream that needs the block. The memory must be usable by work enqueued on `stream` after
 * alloc returns (stream-ordered, as torch.cuda.caching_allocator_alloc and cudaMallocAsync
 * give it): the library orders its other streams after that point before they touch it
 * (every run's streams wait for stream 0 at its start; a segment taken inside a run carries
 * an event the other streams wait on).
 *
 * free(user, ptr, bytes, stream) gets back each segment exactly once, with alloc's bytes
 * and stream, after every use of it finished on the device (the library synchronised
 * first), so the memory may be reused at once on any stream. It is called when cached
 * segments are released: cw_context_empty_cache, cw_context_set_allocator, a pool making
 * room (a run's start replacing another plan's arena, a retry after alloc returned NULL),
 * cw_plan_destroy and cw_plan_release (its arenas), cw_context_destroy.
 *
 * Both run on the thread that made the convweave call, never on a stream's worker thread
 * or a CUDA callback, with the pool's lock held: they must not call convweave, and must be
 * thread-safe only if the caller uses one context from several threads at once. On cuda
 * they run with the calling thread's current device: allocate on the context's
 * (cw_context_get_cuda_device). alloc returning NULL fails the call that needed the memory
 * with CW_ERR_OUT_OF_MEMORY, as a device out of memory does (first releasing cached
 * segments and retrying), with a message naming the user allocator and the byte count; a
 * pointer not aligned to CW_ALLOCATOR_ALIGN goes straight back to free and the call fails
 * with CW_ERR_INVALID_ARG. Byte counts are int64_t like every other size here. */
typedef void *(*cw_alloc_fn)(void *user, int64_t bytes, void *stream);
typedef void (*cw_free_fn)(void *user, void *ptr, int64_t bytes, void *stream);

#define CW_ALLOCATOR_ALIGN 256
#define CW_ALLOCATOR_VERSION 1
typedef struct cw_allocator {
    size_t size;      /* sizeof(cw_allocator) */
    int version;      /* CW_ALLOCATOR_VERSION */
    cw_alloc_fn alloc;
    cw_free_fn free;
    void *user;       /* passed to both; the caller keeps what it points to alive */
} cw_allocator;

#define CW_ALLOCATOR_INIT { sizeof(cw_allocator), CW_ALLOCATOR_VERSION, NULL, NULL, NULL }

/* Makes a (copied; NULL: the backend's own) supply the segments of the context's pools
 * from now on. First waits for the context's streams and returns every cached segment to
 * the allocator that gave it. If segments are still held after that — a live plan's
 * activation arena, a plan with a temporary pool of its own (compiled under a budget other
 * than the context's), a run in progress — returns CW_ERR_INVALID_ARG naming how many and
 * their bytes, and changes nothing: set the allocator right after cw_context_create, or
 * destroy those plans first. On CW_OK no segment of the previous allocator is held, so its
 * state may be freed; plans that survive take their next arena from the new allocator.
 * Also CW_ERR_INVALID_ARG for an a of the wrong size or version, or with alloc or free NULL.
 * Must not run concurrently with other calls on ctx. */
CW_API cw_status cw_context_set_allocator(cw_context *ctx, const cw_allocator *a);
/* Waits for the context's streams and returns every cached segment of the context's pools
 * (blocks not in use) to the allocator that gave it, as torch.cuda.empty_cache does; plans
 * take their arena again at their next run (from the allocator then set). Plans with a pool
 * of their own keep their arena until destroyed, and every live plan keeps its activation
 * arena (in use, not cached): cw_plan_release gives a plan's back between runs. On cpu it
 * also drops the oneDNN kernels no live plan uses (they are process-wide; destroying the
 * last context drops them too) and returns freed heap to the OS where the C library can
 * (glibc: malloc_trim). */
CW_API cw_status cw_context_empty_cache(cw_context *ctx);

/* ---------------------------------------------------------------------------------------
 * Convolution parameters. Spatial dims: 2 (x: [N, C, H, W]) or 3 (x: [N, C, D, H, W]);
 * index 0 is the outermost spatial dim (D for 3-D, H for 2-D). */
#define CW_CONV_PARAMS_VERSION 1
typedef struct cw_conv_params {
    size_t size;
    int version;
    int spatial;          /* 2 or 3 */
    int64_t stride[3];
    int64_t dilation[3];
    int64_t pad_pre[3];   /* padding before (top/front/left) */
    int64_t pad_post[3];  /* padding after (bottom/back/right) */
    int64_t groups;
} cw_conv_params;

#define CW_CONV_PARAMS_INIT                                                                  \
    {                                                                                        \
        sizeof(cw_conv_params), CW_CONV_PARAMS_VERSION, 2, {1, 1, 1}, {1, 1, 1}, {0, 0, 0}, \
            {0, 0, 0}, 1                                                                     \
    }

/* ---------------------------------------------------------------------------------------
 * Graph API: build a forward pass, compile it under a budget into a plan, run the plan.
 *
 * Element type: a graph is f32, f16 or bf16 as a whole. Its inputs, its activations, and the
 * weights w and biases b of its convolutions all have that one dtype; the first input (or the
 * first constant used as an activation) fixes it, and a node of another dtype is refused with
 * CW_ERR_INVALID_ARG naming the node and both dtypes (there is no implicit cast). GroupNorm's
 * gamma and beta and the per-channel ops' vectors (cw_graph_scale's s, cw_graph_shift's v)
 * are f32 in graphs of every dtype. Inside a plan, activations, patch buffers and band
 * buffers take the graph's dtype; GroupNorm statistics stay double, its scale/shift and
 * attention's scores f32. */
typedef struct cw_graph cw_graph;
typedef struct cw_plan cw_plan;
typedef int32_t cw_node;
#define CW_NODE_NONE ((cw_node)-1)

CW_API cw_status cw_graph_create(cw_graph **out, cw_context *ctx);
/* Frees the graph; plans compiled from it stay valid. Accepts NULL. */
CW_API void cw_graph_destroy(cw_graph *g);
/* A runtime input bound at cw_plan_run; desc gives dtype and dims (strides ignored). Returns
 * CW_ERR_INVALID_ARG for a dtype other than the graph's (see "Element type" above). */
CW_API cw_status cw_graph_input(cw_graph *g, cw_node *out, const char *name, const cw_tensor_desc *desc);
/* A constant tensor (weights). Borrowed and only read: t must outlive every plan compiled
 * from g. */
CW_API cw_status cw_graph_constant(cw_graph *g, cw_node *out, const char *name, const cw_tensor *t);
/* y = conv(x, w) + b. x: [N, C, (D,) H, W], w: [K, C/groups, (kd,) kh, kw], b: [K] or
 * CW_NODE_NONE. */
CW_API cw_status cw_graph_conv(cw_graph *g, cw_node *out, cw_node x, cw_node w, cw_node b,
                               const cw_conv_params *p);
/* GroupNorm over (C/groups, spatial) per sample, exact statistics; gamma, beta: contiguous
 * f32 constants [C] in graphs of every dtype. */
CW_API cw_status cw_graph_group_norm(cw_graph *g, cw_node *out, cw_node x, cw_node gamma, cw_node beta,
                                     int64_t groups, float eps);
/* y = x * sigmoid(x). */
CW_API cw_status cw_graph_silu(cw_graph *g, cw_node *out, cw_node x);
/* y = a + b (same shape). */
CW_API cw_status cw_graph_add(cw_graph *g, cw_node *out, cw_node a, cw_node b);
/* y[n, c, ...] = x[n, c, ...] * s[c]: a per-channel scale. x: [N, C, H, W] or
 * [N, C, D, H, W]; s: a contiguous f32 constant (cw_graph_constant) of dims [C]. Returns
 * CW_ERR_INVALID_ARG (naming the argument) for any other s. */
CW_API cw_status cw_graph_scale(cw_graph *g, cw_node *out, cw_node x, cw_node s);
/* A 2x2 average pool with stride 2 over H and W (PyTorch's avg_pool2d(x, 2); a rank-5 x is
 * pooled per D slice, avg_pool3d with kernel (1, 2, 2)): y[.., h, w] is the mean of
 * x[.., 2h + {0, 1}, 2w + {0, 1}], in f32 for f16/bf16 graphs. x: [N, C, H, W] or
 * [N, C, D, H, W] with H and W even, else CW_ERR_INVALID_ARG naming x's dims. */
CW_API cw_status cw_graph_avg_pool2(cw_graph *g, cw_node *out, cw_node x);
/* Nearest-neighbour upsampling by 2 in H and W (not D). */
CW_API cw_status cw_graph_upsample2x(cw_graph *g, cw_node *out, cw_node x);
/* Single-head attention over the spatial positions: q, k, v: [N, C, H, W] (or 5-D),
 * y[n, :, t] = sum_s softmax_s(scale * q[n,:,t] . k[n,:,s]) v[n,:,s]. Computed in f32; in an
 * f16/bf16 graph each sample's q, k, v and output are staged in f32 temporaries (16 * C *
 * H * W bytes, from the temp budget). */
CW_API cw_status cw_graph_attention(cw_graph *g, cw_node *out, cw_node q, cw_node k, cw_node v, float scale);
/* The masks of cw_graph_attention_blocks. Append only: plans store the codes. */
typedef enum cw_attention_mask {
    CW_ATTENTION_BLOCK_CAUSAL = 0,  /* token t sees keys s with s / block <= t / block */
    CW_ATTENTION_BLOCK_DIAGONAL = 1 /* token t sees keys s with s / block == t / block */
} cw_attention_mask;
/* cw_graph_attention under a block mask, as if the scores of the keys a token does not see
 * were -inf. Tokens are the spatial positions flattened (D outermost), blocks runs of `block`
 * of them (the last may be shorter). BLOCK_CAUSAL is HunyuanVideo's mid-block attention
 * (block = H * W: each frame sees itself and the frames before it; block = 1: the causal
 * mask); BLOCK_DIAGONAL is attention within each block alone (block = H * W: per-frame
 * attention, frames folded into the batch, as Wan's). No mask is materialised: each query
 * chunk's rows are computed, softmaxed and summed only over the keys they see (the chunk's
 * FLOPs shrink accordingly). Returns CW_ERR_INVALID_ARG, naming the argument, for a mask
 * that is not a cw_attention_mask or a block outside 1..T (T = D * H * W tokens), and as
 * cw_graph_attention for the rest. */
CW_API cw_status cw_graph_attention_blocks(cw_graph *g, cw_node *out, cw_node q, cw_node k, cw_node v, float scale,
                                           int64_t block, cw_attention_mask mask);
/* Marks a node as the plan's next output (at most 4096): outputs are numbered from 0 in call order, and
 * cw_plan_run takes them in that order. name (may be NULL) names it in error messages. */
CW_API cw_status cw_graph_output(cw_graph *g, cw_node node, const char *name);
/* Donates input `input` (cw_graph_input order) to output `output` (cw_graph_output order):
 * cw_plan_run may then be given the input's tensor as that output too, and the plan writes the
 * output only after every read of the input, so the caller holds one tensor where it would
 * hold two (a streamed video VAE's caches: the new cache in the old one's storage). The
 * input's contents are lost once the run starts writing. A plan honours the donation where
 * it can order it: the output is read by nothing in the plan and is not computed from the
 * input itself (cw_plan_get_donor says whether it did; where not, the output needs a tensor
 * of its own, as without this call). output = -1 donates the input to no output: after its
 * last read in a run the backend may give its memory back (cpu: the whole pages inside it
 * return to the system, as the caller's peak allows; the contents are then undefined),
 * except in a run where it overlaps another input or an output. Returns
 * CW_ERR_INVALID_ARG, naming the argument, for an index out of range, an input or output
 * already donated, or shapes or dtypes that differ. */
CW_API cw_status cw_graph_donate(cw_graph *g, int input, int output);
/* Descriptor of a node's result (dims are known at build time). */
CW_API cw_status cw_graph_get_node_desc(const cw_graph *g, cw_tensor_desc *out, cw_node node);

/* The unary ops of cw_graph_unary. Append only: plans store the codes. */
typedef enum cw_unary_op {
    CW_UNARY_RELU = 0,  /* y = max(x, 0); NaN stays NaN (torch.relu) */
    CW_UNARY_TANH,      /* y = tanh(x) */
    CW_UNARY_SIGMOID,   /* y = 1 / (1 + e^-x) */
    CW_UNARY_GELU,      /* y = x / 2 * (1 + erf(x / sqrt(2))) (F.gelu's default) */
    CW_UNARY_GELU_TANH, /* y = x / 2 * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 x^3))) (approximate='tanh') */
    CW_UNARY_AFFINE,    /* y = a * x + b (a * x exact, within 1 ulp): mul, add, sub and rsub by scalars */
    CW_UNARY_CLAMP,     /* y = min(max(x, a), b): torch.clamp(x, a, b); NaN x gives NaN, a > b gives b;
                           -INFINITY or INFINITY leaves a side open */
    CW_UNARY_RSQRT,     /* y = 1 / sqrt(x) (torch.rsqrt): x < 0 gives NaN, +-0 gives +-inf */
    CW_UNARY_SQUARE,    /* y = x * x (torch.square, x.pow(2)) */
    CW_UNARY_POW        /* y = x^a (torch.pow(x, a) with a float exponent; C's pow: x < 0 with a
                           non-integer a gives NaN, x^0 = 1) */
} cw_unary_op;
/* y = op(x) elementwise, with the scalar parameters a and b where op uses them (ignored
 * otherwise). x: [N, C, H, W] or [N, C, D, H, W]; y has x's dims and dtype. In f16/bf16 graphs
 * each element is computed in f32 and rounded once on store (RSQRT and POW in double, so
 * they round once to within a last-place tie, the same on both backends). Returns CW_ERR_INVALID_ARG,
 * naming the argument, for an op that is not a cw_unary_op, a NaN a or b for
 * CW_UNARY_CLAMP, an x of another rank, another dtype than the graph's, or not a node. */
CW_API cw_status cw_graph_unary(cw_graph *g, cw_node *out, cw_node x, cw_unary_op op, float a, float b);

/* The binary ops of cw_graph_binary. Append only: plans store the codes. */
typedef enum cw_binary_op {
    CW_BINARY_MUL = 0, /* y = a * b */
    CW_BINARY_SUB,     /* y = a - b */
    CW_BINARY_DIV,     /* y = a / b (IEEE: x / 0 is +-inf, 0 / 0 NaN) */
    CW_BINARY_MAX,     /* y = max(a, b), NaN if either is (torch.maximum) */
    CW_BINARY_MIN      /* y = min(a, b), NaN if either is (torch.minimum) */
} cw_binary_op;
/* y = op(a, b) elementwise on two activations: b has a's dims, or a's dims with one
 * channel, broadcast over a's channels (a mask or a norm [N, 1, H, W] against
 * [N, C, H, W]: y[n, c, ...] = op(a[n, c, ...], b[n, 0, ...])). cw_graph_add is the sum of
 * equal shapes; cw_graph_scale and cw_graph_shift broadcast a per-channel vector. a:
 * [N, C, H, W] or [N, C, D, H, W] of the graph's dtype, b: the same or [N, 1, H, W] /
 * [N, 1, D, H, W]; y has a's dims. In f16/bf16 graphs each element is computed in f32 and
 * rounded once on store. Returns CW_ERR_INVALID_ARG, naming the argument, for an op that is
 * not a cw_binary_op, an a or b of another rank or dtype or not a node, and naming both
 * shapes when b's dims are neither a's nor a's with dims[1] = 1. */
CW_API cw_status cw_graph_binary(cw_graph *g, cw_node *out, cw_node a, cw_node b, cw_binary_op op);
/* y[n, c, ...] = x[n, c, ...] + v[c]: a per-channel shift (a bias broadcast as [C, 1, 1]).
 * x: [N, C, H, W] or [N, C, D, H, W]; v: a contiguous f32 constant (cw_graph_constant) of
 * dims [C] in graphs of every dtype; in f16/bf16 graphs the sum is taken in f32 and rounded
 * once on store. Returns CW_ERR_INVALID_ARG (naming the argument) for any other x or v. */
CW_API cw_status cw_graph_shift(cw_graph *g, cw_node *out, cw_node x, cw_node v);
/* Nearest-neighbour upsampling by integer factors (PyTorch's interpolate(mode='nearest')
 * with integer scale factors): y[n, c, d, h, w] = x[n, c, d / fd, h / fh, w / fw] (integer
 * division), with factors = {fd, fh, fw} for (D, H, W), each 1..8. x: [N, C, D, H, W], or
 * [N, C, H, W] with factors[0] == 1; y: x's dims with D, H, W multiplied by their factors, of
 * x's dtype (values copied exactly). The copy is its own task (cw_graph_upsample2x instead
 * fuses into the next conv's input preparation). Returns CW_ERR_INVALID_ARG, naming the
 * argument, for a NULL factors, a factor outside 1..8, factors[0] != 1 with a 4-D x, or an x
 * of another rank or dtype or not a node. */
CW_API cw_status cw_graph_upsample_nearest(cw_graph *g, cw_node *out, cw_node x, const int64_t factors[3]);

/* The reductions of cw_graph_reduce_channels. Append only: plans store the codes. */
typedef enum cw_reduce_op {
    CW_REDUCE_SUM = 0,    /* y = sum over c of x[c] (x.sum(1, keepdim=True)) */
    CW_REDUCE_MEAN,       /* y = the sum / C (x.mean(1, keepdim=True)) */
    CW_REDUCE_L2,         /* y = sqrt(sum over c of x[c]^2) (linalg.vector_norm(x, 2, [1], True)) */
    CW_REDUCE_MEAN_SQUARE /* y = sum over c of x[c]^2 / C (x.pow(2).mean(1, keepdim=True)) */
} cw_reduce_op;
/* y[n, 0, ...] = op over c of x[n, c, ...]: a reduction over the channels, keeping the dim
 * (Wan's RMS norm takes CW_REDUCE_L2, LTX's pixel norm CW_REDUCE_MEAN_SQUARE; broadcast the
 * result back with cw_graph_binary). x: [N, C, H, W] or [N, C, D, H, W] of the graph's dtype;
 * y: x's dims with dims[1] = 1, of x's dtype. Each element is accumulated in double over c
 * in ascending order (squares exact in double), then finished (/ C, sqrt) in double and
 * rounded once to the dtype: the result does not depend on threads, streams, patches or the
 * backend's launch shape. NaN in any channel gives NaN. Returns CW_ERR_INVALID_ARG, naming
 * the argument, for an op that is not a cw_reduce_op, or an x of another rank or dtype or
 * not a node. */
CW_API cw_status cw_graph_reduce_channels(cw_graph *g, cw_node *out, cw_node x, cw_reduce_op op);
/* y = a and b concatenated along dim (torch.cat([a, b], dim)): dim 1 joins channels, dim 2
 * the outermost spatial dim (T of [N, C, T, H, W], H of [N, C, H, W]). a, b: [N, C, H, W] or
 * [N, C, D, H, W] of the graph's dtype, equal but in dim; y: their dims with dims[dim] =
 * a's + b's, elements copied exactly (bits, NaN payloads included). Where a is x's first
 * frame (cw_graph_slice(x, 2, 0, 1)) upsampled by (1, fh, fw) (cw_graph_upsample2x or
 * cw_graph_upsample_nearest) and b x's other frames upsampled by (fd, fh, fw) -- the
 * upsamplers of HunyuanVideo and CogVideoX -- y is made as one nearest upsample of x with the
 * first frame kept once (the same elements), which a conv reading y does in its input
 * preparation: neither the cat nor the upsampled frames are stored. Returns
 * CW_ERR_INVALID_ARG, naming the argument, for a dim other than 1 or 2, an a or b of another
 * rank or dtype or not a node, and naming both shapes when they differ outside dim. */
CW_API cw_status cw_graph_concat(cw_graph *g, cw_node *out, cw_node a, cw_node b, int dim);
/* y = x.narrow(dim, start, length): the elements of x whose index in dim is start ..
 * start + length - 1, copied exactly (bits, NaN payloads included): torch's slice with step
 * 1 (x[:, :, 2:5]), and select kept as a dim of extent 1 (x[:, :, 3:4]). dim: 1 (C) to
 * rank - 1 (D, H, W of [N, C, D, H, W]; H, W of [N, C, H, W]). x: [N, C, H, W] or
 * [N, C, D, H, W] of the graph's dtype; y: x's dims with dims[dim] = length. The copy is its
 * own task on the light stream. Returns CW_ERR_INVALID_ARG, naming the argument and x's
 * dims, for a dim outside 1..rank - 1, a start < 0, a length < 1 or start + length past x's
 * extent in dim, and for an x of another rank or dtype or not a node. */
CW_API cw_status cw_graph_slice(cw_graph *g, cw_node *out, cw_node x, int dim, int64_t start, int64_t length);

/* How cw_graph_pad fills the border (F.pad's modes). Append only: plans store the codes. */
typedef enum cw_pad_mode {
    CW_PAD_CONSTANT = 0, /* every padded element is value (F.pad(mode='constant', value=value)) */
    CW_PAD_REPLICATE = 1 /* a padded element repeats the nearest edge element: the source index
                            clamped into x (F.pad(mode='replicate')) */
} cw_pad_mode;
/* y = x padded by pre[k] elements before and post[k] after along D, H, W (k = 0, 1, 2): F.pad
 * with (pre[2], post[2], pre[1], post[1], pre[0], post[0]) on [N, C, D, H, W]. x: [N, C, D, H,
 * W], or [N, C, H, W] with pre[0] = post[0] = 0; y: x's dims with pre[k] + post[k] added to D,
 * H, W, of x's dtype. y's interior is x's elements copied exactly (bits), and so is a
 * replicated border; a constant border is value rounded once to the graph's dtype (NaN and
 * infinities allowed). HunyuanVideo's causal conv pads with CW_PAD_REPLICATE, pre = {2, 1, 1},
 * post = {0, 1, 1}, then convolves unpadded. The copy is its own task on the light stream.
 * Returns CW_ERR_INVALID_ARG, naming the argument, for a NULL pre or post, a pad outside
 * 0..64, pre[0] or post[0] != 0 with a 4-D x, a mode that is not a cw_pad_mode, or an x of
 * another rank or dtype or not a node. */
CW_API cw_status cw_graph_pad(cw_graph *g, cw_node *out, cw_node x, const int64_t pre[3], const int64_t post[3],
                              cw_pad_mode mode, float value);
/* Depth to space by factors = {fd, fh, fw} (D, H, W), each 1..8, F = fd * fh * fw:
 *   y[n, c, d * fd + i, h * fh + j, w * fw + k] = x[n, c * F + (i * fh + j) * fw + k, d, h, w],
 * elements copied exactly (bits). x: [N, C * F, D, H, W], or [N, C * F, H, W] with fd = 1
 * (then exactly torch.pixel_shuffle(x, r) for fh = fw = r); y: [N, C, D * fd, H * fh, W * fw],
 * of x's dtype. The order is LTX-Video's upsampler's (diffusers' LTXVideoUpsampler3d:
 * reshape to [N, C, fd, fh, fw, D, H, W], permute(0, 1, 5, 2, 6, 3, 7, 4), flatten), checked
 * against it; the frames it then drops (the first fd - 1) are a cw_graph_slice. The copy is
 * its own task on the light stream. Returns CW_ERR_INVALID_ARG, naming the argument, for a
 * NULL factors, a factor outside 1..8, factors[0] != 1 with a 4-D x, an x whose channels F
 * does not divide, or an x of another rank or dtype or not a node. */
CW_API cw_status cw_graph_depth_to_space(cw_graph *g, cw_node *out, cw_node x, const int64_t factors[3]);
/* Space to depth, the inverse of cw_graph_depth_to_space with the same factors (each 1..8,
 * F = fd * fh * fw):
 *   y[n, c * F + (i * fh + j) * fw + k, d, h, w] = x[n, c, d * fd + i, h * fh + j, w * fw + k],
 * elements copied exactly (bits). x: [N, C, D, H, W] with D, H, W multiples of their factors,
 * or [N, C, H, W] with fd = 1 (then exactly torch.pixel_unshuffle(x, r) for fh = fw = r); y:
 * [N, C * F, D / fd, H / fh, W / fw], of x's dtype. This is the reshape-permute of LTX-Video's
 * downsampler (diffusers' LTXVideoDownsampler3d: unflatten D, H, W by the factors,
 * permute(0, 1, 3, 5, 7, 2, 4, 6), flatten(1, 4)) alone: that module also repeats its first
 * fd - 1 frames in front (a cw_graph_slice and cw_graph_concat) and averages groups of the
 * result's channels for its residual (not part of this op). Returns CW_ERR_INVALID_ARG, naming
 * the argument, for a NULL factors, a factor outside 1..8, factors[0] != 1 with a 4-D x, an x
 * whose D, H or W its factor does not divide, or an x of another rank or dtype or not a
 * node. */
CW_API cw_status cw_graph_space_to_depth(cw_graph *g, cw_node *out, cw_node x, const int64_t factors[3]);

typedef enum cw_patch_policy {
    CW_PATCHES_AUTO = 0,  /* smallest patch count whose fastest algorithm fits the budget */
    CW_PATCHES_FIXED = 1, /* `patches` bands per conv (capped at its output height) */
    CW_PATCHES_NONE = 2   /* unscheduled reference: one patch, no fusion, one stream */
} cw_patch_policy;

/* The axis a 5-D conv's patches cut (4-D convs are always cut along H). */
typedef enum cw_patch_axis {
    CW_PATCH_AXIS_AUTO = 0, /* per conv, from the budget: the axis whose patching fits with the
                               faster algorithm, then the one whose halos re-read fewer input
                               elements (D once the clip has more frames than rows, or where no
                               band of H rows fits); H under CW_PATCHES_FIXED or max_patch_rows */
    CW_PATCH_AXIS_H = 1,    /* bands of output rows (H), every frame in each */
    CW_PATCH_AXIS_D = 2     /* bands of output frames (D, time) with their exact halo frames
                               (causal padding included), every row in each */
} cw_patch_axis;

/* ---------------------------------------------------------------------------------------
 * Across processes. A plan compiled with a communicator (cw_compile_options.comm) is one
 * rank's share of the plan the same graph and options give without one: the planner makes
 * the single-process plan (under CW_PATCHES_AUTO each conv's patch count a multiple of
 * n_ranks, so that bands meet where ranks do; CW_PATCHES_FIXED's count as given; H bands
 * unless CW_PATCH_AXIS_D), then each rank keeps the tasks whose output rows fall in
 * its band of every tensor (rank r: rows [r*H/n, (r+1)*H/n) by each task's middle row), runs
 * the rest nowhere, and holds only the rows its tasks touch: its band plus halos. Where a
 * task reads rows another rank wrote (a halo, a GroupNorm's partial statistics, attention's
 * keys and values) the writer sends them and the reader receives them, as tasks on a
 * stream of their own ordered by events like every other task. Tasks whose output is not a
 * band of rows (one-patch convs, attention, GroupNorm finalisation, whole-tensor ops) run
 * on every rank. Every rank computes each element exactly as the single-process plan does
 * and merges GroupNorm partials in band order, so the result is bit-identical on any number
 * of ranks to the single-process plan with the same patches (CW_PATCHES_FIXED).
 *
 * convweave opens no connection itself: an implementation forwards each call to an
 * existing engine (torch.distributed from Python: convweave.dist; MPI: cw-vae --ranks;
 * NCCL: convweave_cuda.h). A call moves one message between this rank and `peer`: `d` and
 * `data` are a strided view of plan memory (the implementation packs it as it needs); `tag`
 * numbers the message in the plan, the same on both sides. Every rank makes its calls in
 * one global order, so blocking implementations cannot deadlock. `stream` is the backend's
 * native stream to enqueue on (cuda: a cudaStream_t), or NULL: then the call runs on the
 * host, in stream order, and returns once the message is sent or received (the cpu
 * backend; and cw_graph_compile's configuration check). A call returns CW_OK or an error
 * (CW_ERR_COMM): the run then returns that error and the rank's later calls are skipped. An
 * implementation must return within its own timeout when a peer fails or dies. */
#define CW_COMM_VERSION 1
typedef struct cw_comm {
    size_t size;
    int version;
    int rank;     /* this process, 0 .. n_ranks - 1 */
    int n_ranks;  /* 1..32 */
    void *user;
    cw_status (*send)(void *user, const cw_tensor_desc *d, const void *data, int peer, int64_t tag, void *stream);
    cw_status (*recv)(void *user, const cw_tensor_desc *d, void *data, int peer, int64_t tag, void *stream);
} cw_comm;

#define CW_COMPILE_OPTIONS_VERSION 5
/* cw_compile_options.memory_budget: choose the cap from the memory ladder (memory_auto_pct) */
#define CW_MEMORY_AUTO ((int64_t)-1)
typedef struct cw_compile_options {
    size_t size;
    int version;
    int64_t temp_budget;      /* 0: the context's budget; <0: unlimited */
    int streams;              /* 0: the context's stream count; 1 = in order; N: N-1 heavy + 1 light */
    cw_patch_policy policy;
    int patches;              /* for CW_PATCHES_FIXED */
    int fuse;                 /* fuse GroupNorm-apply + SiLU + upsample into conv prep; default 1 */
    int64_t max_patch_rows;   /* 0: no cap; else cap on output rows per patch (bounds prep buffers);
                                 frames per patch of 5-D convs under CW_PATCH_AXIS_D */
    /* 0: none. Else a cap on activations + temporaries, bytes (weights apart; what
     * cw_plan_stats.activations_peak + temp_predicted count): when the plan
     * would need more, the planner recomputes instead of storing the inner activation of
     * ResNet-style blocks (conv -> GroupNorm -> SiLU -> conv), largest first and only where
     * that lowers the total: a first pass takes that activation's GroupNorm statistics band
     * by band, a second recomputes each band with its halo and feeds the second conv
     * directly. A block whose residual is its own input writes its result into that input's
     * storage. Exact (the statistics are the same); costs the first conv's FLOPs again
     * (cw_plan_stats.recompute_gflop). Below that, a conv read by several convs (an
     * upsampler's output, read by a block's first conv and its shortcut) is recomputed by
     * each reader, nested inside the recompute of the first conv: its FLOPs paid 3-4 times
     * more. CW_MEMORY_AUTO: the plan of the memory ladder's least total within
     * memory_auto_pct (version 5). */
    int64_t memory_budget;
    /* (version 3) which axis a 5-D conv's patches cut; default CW_PATCH_AXIS_AUTO. A forced
     * D (time) does not apply to the convs of recomputed blocks (cw_compile_options
     * .memory_budget: their two passes and their readers stay on H bands) nor to the
     * unscheduled reference (one patch); cw_plan_describe names each conv's axis. */
    cw_patch_axis patch_axis;
    /* (version 4) NULL: one process. Else this rank's communicator (see "Across processes"
     * above), borrowed until the plan is destroyed. The budgets (temp_budget, memory_budget)
     * are checked against the single-process plan the ranks share out, so each rank holds at
     * most what they allow (less: its share of the activations); cw_graph_min_budget and
     * cw_graph_memory_ladder answer for that plan too. cw_graph_compile first checks that every
     * rank compiles the same graph (structure, shapes, weights' checksum) with the same
     * options and names what differs, on which rank (CW_ERR_INVALID_ARG on every rank). */
    const cw_comm *comm;
    /* (version 4) with comm: the rank whose outputs hold every row after a run (0 by
     * default); -1: each rank's outputs hold only its band (cw_plan_get_band). */
    int gather_rank;
    /* (version 5) with memory_budget = CW_MEMORY_AUTO: the plan of cw_graph_memory_ladder's
     * least total whose convs the backend estimates at most memory_auto_pct % slower than
     * those of its last point, the plan that stores everything (cw_memory_point
     * .conv_cost_ms); on a backend without a time model (conv_cost_ms -1: cuda, whose cuDNN
     * heuristics rank, not time), whose recompute costs at most memory_auto_pct % of that
     * plan's conv FLOPs. No point so cheap, or no fixed temporary budget (the ladder needs
     * one; nor CW_PATCHES_NONE): the plan that stores everything. One climb of the ladder
     * (as slow as cw_graph_memory_ladder), the chosen plan kept from it. Default 10; must be
     * >= 0. */
    double memory_auto_pct;
} cw_compile_options;

#define CW_COMPILE_OPTIONS_INIT \
    { sizeof(cw_compile_options), CW_COMPILE_OPTIONS_VERSION, 0, 0, CW_PATCHES_AUTO, 0, 1, 0, 0, CW_PATCH_AXIS_AUTO, \
      NULL, 0, 10.0 }

/* Lowers g into a plan of tasks on streams and simulates the run's temporary allocations
 * under opt's budget (opt NULL: CW_COMPILE_OPTIONS_INIT). If the plan cannot fit, returns
 * CW_ERR_BUDGET and names the smallest budget that would work in the context's message
 * (cw_graph_min_budget gives it as a number). On success *out is a plan the caller frees
 * with cw_plan_destroy; it borrows g's constants, not g. */
CW_API cw_status cw_graph_compile(cw_graph *g, cw_plan **out, const cw_compile_options *opt);
/* The smallest temp budget under which cw_graph_compile(g, opt) succeeds (opt's budget
 * ignored). For the smallest total (activations + temporaries, cw_compile_options
 * .memory_budget) see cw_graph_memory_ladder. */
CW_API cw_status cw_graph_min_budget(cw_graph *g, int64_t *out_bytes, const cw_compile_options *opt);

/* One plan cw_graph_compile can choose under a memory budget (cw_graph_memory_ladder). */
typedef struct cw_memory_point {
    int64_t total_bytes;       /* activations_bytes + temp_bytes (weights apart): the smallest
                                  cw_compile_options.memory_budget that compiles this plan */
    int64_t activations_bytes; /* its activation arena (cw_plan_stats.activations_peak) */
    int64_t temp_bytes;        /* its temporaries' predicted peak (cw_plan_stats.temp_predicted) */
    int n_recomputed;          /* blocks that recompute their inner activation (n_recomputed) */
    double recompute_gflop;    /* conv GFLOP per run those blocks pay again (recompute_gflop) */
    double conv_cost_ms;       /* the plan's cw_plan_stats.conv_cost_ms (-1: no time model) */
} cw_memory_point;

/* The memory ladder: the plans cw_graph_compile(g, opt) chooses between as
 * opt->memory_budget varies (opt's memory_budget ignored), least memory first. points[0]
 * .total_bytes is the smallest memory budget that compiles: one byte less gives
 * CW_ERR_BUDGET. Each next point holds more and recomputes less; the last recomputes
 * nothing. A memory budget from points[i].total_bytes up to points[i + 1].total_bytes - 1
 * (the last: any) compiles to point i's plan, and its runs keep temp_peak + activations_peak
 * within points[i].total_bytes. Writes the first min(n, max_points) points and sets *out_n
 * to n (1..129: one point per recompute step at most, and there are at most 2 * 65 - 1
 * steps); points may be NULL when max_points is 0. The points depend on the temporary
 * budget, so opt->temp_budget or the context's must be > 0 (unless opt->policy is
 * CW_PATCHES_NONE): else CW_ERR_INVALID_ARG naming both (a memory budget alone gives
 * temporaries an eighth of itself). CW_ERR_BUDGET when no plan fits the temporary budget
 * (the message names the smallest that does). Compiles a plan per recompute step: as slow
 * as a few cw_graph_compile calls. Runs nothing on the device. */
CW_API cw_status cw_graph_memory_ladder(cw_graph *g, cw_memory_point *points, int *out_n, int max_points,
                                        const cw_compile_options *opt);
/* Frees the plan and gives its arenas back. Accepts NULL. */
CW_API void cw_plan_destroy(cw_plan *p);
/* Gives back the memory a plan holds between runs: its activation arena and, where the
 * plan's temporaries come from a pool with no block in use (the context's, or the plan's
 * own under a budget of its own), that pool's cached segments, to the allocator that gave
 * them (cw_context_set_allocator's free, or the backend's). The plan stays valid: its next
 * cw_plan_run takes its arenas again (an allocation at the run's start, which can fail with
 * CW_ERR_OUT_OF_MEMORY). Compiled kernels stay with the plan (on cpu its oneDNN
 * primitives, held until cw_plan_destroy), so the next run makes none. Call it between runs, not during one on another thread; it waits
 * for the context's streams first. A no-op for a plan that holds nothing. Returns
 * CW_ERR_INVALID_ARG for a NULL plan. */
CW_API cw_status cw_plan_release(cw_plan *p);
/* Runs the plan: inputs in cw_graph_input order, outputs in cw_graph_output order, each
 * shaped as declared (outputs may be strided views). No output may overlap an input or
 * another output, except that an output may be the very tensor of the input donated to it
 * (cw_plan_get_donor). Enqueues everything on the context's streams and waits once at the
 * end; no host synchronisation in between (after cw_plan_release, the run first takes its
 * arenas again). */
CW_API cw_status cw_plan_run(cw_plan *p, cw_tensor *const *inputs, int n_inputs, cw_tensor *const *outputs,
                             int n_outputs);

/* Stage kinds indexing cw_plan_stats.stage_ms. */
enum { CW_STAGE_CONV = 0, CW_STAGE_PREP = 1, CW_STAGE_EPILOGUE = 2, CW_STAGE_STATS = 3,
       CW_STAGE_ATTENTION = 4, CW_STAGE_OTHER = 5, CW_STAGE_COUNT = 6 };
/* Most streams a plan uses (cw_compile_options.streams, cw_context_config.streams). */
#define CW_MAX_STREAMS 8

typedef struct cw_plan_stats {
    double wall_ms;             /* last run, host wall time */
    double stage_ms[CW_STAGE_COUNT];        /* summed task time per stage kind (CW_FLAG_TIMING) */
    double stream_busy_ms[CW_MAX_STREAMS];  /* summed task time per stream (CW_FLAG_TIMING) */
    int n_streams;
    int64_t n_tasks;
    int64_t n_events;           /* event records per run */
    int64_t n_patches;          /* conv patches */
    int64_t temp_peak;          /* peak temporary bytes in use during the last run */
    int64_t temp_predicted;     /* compile-time prediction of temp_peak */
    int64_t activations_peak;   /* peak bytes of tensors between stages */
    int64_t weights_bytes;      /* bytes of constants */
    int64_t total_peak;         /* max over the run of temp + activations + weights */
    int64_t host_syncs;         /* host synchronisations during the last run (excl. the final wait) */
    double conv_gflop;          /* useful conv GFLOP per run (no halo recompute) */
    double halo_overhead_pct;   /* recomputed conv FLOPs from halos, % */
    int64_t activations_live_peak; /* most activation bytes live at once (activations_peak is
                                      the arena holding them at fixed offsets) */
    int n_recomputed;           /* blocks whose inner activation is recomputed, not stored */
    double recompute_gflop;     /* conv GFLOP per run those blocks pay again */
    double conv_cost_ms;        /* the backend's estimate of the convs' time per run, recomputes
                                   and thin patches included: ms on one core (cpu's cost model,
                                   fitted per algorithm, within ~0.7-2x of each conv); -1 where
                                   the backend has no time model (cuda ranks its algorithms) */
} cw_plan_stats;

CW_API cw_status cw_plan_get_stats(const cw_plan *p, cw_plan_stats *out);
/* Progress of cw_plan_run: fn(user, done, total) after each finished task (done counts
 * from 1 to total in every run). It is called from a backend thread (cpu: the stream's
 * worker; cuda: the CUDA callback thread), must be quick and thread-safe, and must not
 * call convweave. On cuda each call is a host callback in the stream: use it for
 * long runs. fn NULL switches it off. Returns CW_ERR_INVALID_ARG for a NULL plan. */
typedef void (*cw_progress_fn)(void *user, int64_t done, int64_t total);
CW_API cw_status cw_plan_set_progress(cw_plan *p, cw_progress_fn fn, void *user);
/* The rows of output `output` this rank's runs write, along tensor dim *axis: [*r0, *r1).
 * The whole extent without a communicator and on the gather rank; else the rank's band
 * (empty where the rank writes none: r0 == r1). CW_ERR_INVALID_ARG for a bad index. */
CW_API cw_status cw_plan_get_band(const cw_plan *p, int output, int *axis, int64_t *r0, int64_t *r1);
/* *input = the input whose tensor output `output` may share in cw_plan_run (a donation the
 * plan honours, cw_graph_donate), or -1. Returns CW_ERR_INVALID_ARG for a NULL argument or an
 * output out of range. */
CW_API cw_status cw_plan_get_donor(const cw_plan *p, int output, int *input);
/* Describes the plan: its dtype, per conv its patches (output rows, input rows, pre/post
 * padding), algorithm, workspace and prep/band buffer bytes per patch, predicted peak temp,
 * activation arena, halo overhead, and the donations it holds (cw_graph_donate). Returns a
 * NUL-terminated string the caller frees with cw_free. json != 0: JSON, else text. */
CW_API cw_status cw_plan_describe(const cw_plan *p, char **out, int json);
/* Writes a Chrome trace (Perfetto-compatible) JSON of the last run: one track per stream
 * and a counter track of temp bytes in use. Needs CW_FLAG_TIMING on the context. */
CW_API cw_status cw_plan_write_trace(const cw_plan *p, const char *path);
/* Frees memory the library returned (strings from cw_plan_describe). Accepts NULL. */
CW_API void cw_free(void *ptr);

/* ---------------------------------------------------------------------------------------
 * One-call convolution: a one-node plan. y = conv(x, w) + b, b may be NULL.
 * x: [N, C, (D,) H, W], w: [K, C/groups, (kd,) kh, kw], y: [N, K, (Do,) Ho, Wo]; x and y may
 * be strided views; y must not overlap x. x, w, b and y share one dtype (f32, f16 or bf16;
 * a backend without that dtype returns CW_ERR_UNSUPPORTED). opt may be NULL (defaults: auto
 * patches under the context budget). Blocks until done. */
CW_API cw_status cw_conv_forward(cw_context *ctx, const cw_tensor *x, const cw_tensor *w, const cw_tensor *b,
                                 cw_tensor *y, const cw_conv_params *p, const cw_compile_options *opt);
/* Output descriptor (contiguous) of a convolution, validating every parameter. */
CW_API cw_status cw_conv_output_desc(cw_context *ctx, cw_tensor_desc *y, const cw_tensor_desc *x,
                                     const cw_tensor_desc *w, const cw_conv_params *p);

#ifdef __cplusplus
}
#endif
#endif /* CONVWEAVE_H */
