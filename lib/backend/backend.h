/* The backend interface, in two tables of function pointers (ggml_backend_i): a runtime
 * (memory, streams, events) every backend fills, and operations only executing backends
 * fill, called through the checking cw__op_* functions (ops.c). Each hook is marked
 * required, or optional with the default its caller supplies. All work hooks are
 * asynchronous on the given stream unless they say otherwise. */
#ifndef CW_BACKEND_H
#define CW_BACKEND_H

#include "core/core.h"
#include "kernels/kernels.h"

/* A strided view of device memory: desc + pointer to element [0,...,0]. */
typedef struct cw__view {
    cw_tensor_desc d;
    void *data;
} cw__view;

/* One convolution as the backend sees it: x and y are (patch) views with their own
 * strides; pad_pre/pad_post are the patch's paddings. spatial = 2: NCHW, 3: NCDHW. */
typedef struct cw__conv_problem {
    cw_tensor_desc x, w, y;
    int has_bias;
    int spatial;
    int64_t stride[3], dilation[3], pad_pre[3], pad_post[3];
    int64_t groups;
} cw__conv_problem;

#define CW__ALGO_NAME_LEN 48
/* A convolution algorithm for one problem, as cuDNN's engine list presents it. */
typedef struct cw__conv_algo {
    int id;                 /* backend-specific; cpu: CW__CPU_ALGO_* */
    char name[CW__ALGO_NAME_LEN];
    int64_t workspace;      /* bytes of temporary memory it needs for this problem */
    double cost;            /* relative time estimate; lower is faster */
    int threads;            /* cpu: threads the call uses, fixed by the planner; 0: all the
                               backend's (device backends ignore it) */
    void *prepared;         /* conv_prepare's state for this task (cpu: its oneDNN plan),
                               owned by the task and dropped with conv_release; NULL: none */
} cw__conv_algo;

/* Fused light stage ("prep"): dst = act(src * scale[n,c] + shift[n,c]) with nearest
 * upsampling by `up` in H and W (and up_d, off_d in D). dst rows are rows [dst_row0,
 * dst_row0 + dst.H) of the upsampled tensor; src's first row is row src_row0 of the producer, so
 * dst[n,c,(d,)r,w] = f(src[n,c,(d,)(dst_row0 + r)/up - src_row0, w/up]).
 * With pad (replicate padding after the upsample, before D, H, W): dst is rows of the
 * padded tensor, and each index is first clamped into the upsampled tensor (cw_prep_src,
 * kernels.h): D into src's D, H into up_h rows, W into src's W * up.
 * scale/shift are device float arrays [N*C] or both NULL (no normalisation). src and dst
 * may differ in dtype (prep also converts: attention's f32 staging). */
typedef struct cw__prep_params {
    cw__view src, dst;
    const float *scale, *shift;
    int silu;
    int unary;       /* > 0: then cw_unary_elem(unary - 1, ., ua, ub) (a CW_UNARY_* op), after SiLU */
    float ua, ub;
    int up;
    int64_t dst_row0, src_row0;
    int64_t pad[3];  /* replicate padding before D, H, W (the padding after follows from dst) */
    int64_t up_h;    /* > 0: replicate padding on, up_h = the upsampled tensor's rows; 0: off */
    int64_t up_d, off_d; /* 5-D: frames upsampled by up_d (<= 1: not) less off_d in front
                            (cw_up_src_d); D is never cut, so dst frame z reads src frame
                            cw_up_src_d(z) (after the pad's clamp into cw_up_frames frames) */
} cw__prep_params;

/* A generic op (kernels/kernels.h: CW_OP_* and its contract): out from in[0..n_in) (the
 * op's arity) and the parameter block. out may alias in[0] exactly where dims match. */
typedef struct cw__op_args {
    int code;
    cw__view out;
    cw__view in[CW_OP_MAX_IN];
    cw_op_param param;
} cw__op_args;

/* Row-major GEMM: C = alpha * op(A) * op(B) + beta * C, op(A): M x K, op(B): K x N. */
typedef struct cw__gemm_params {
    int trans_a, trans_b;
    int64_t m, n, k;
    float alpha, beta;
    const float *a; int64_t lda;
    const float *b; int64_t ldb;
    float *c; int64_t ldc;
    int threads;            /* cpu: as cw__conv_algo.threads */
} cw__gemm_params;

typedef void (*cw__host_fn)(void *arg);
typedef struct cw__timer cw__timer; /* a backend's device timestamps (optional timer hooks) */

/* Capabilities a backend declares (cw__runtime_i.caps), so callers never test its name. */
enum {
    CW__CAP_HOST_STREAMS = 1u << 0 /* streams are host threads: per-task NVTX ranges are pushed
                                      on the worker around the work, not around the enqueue */
};

/* The runtime every backend implements — cpu, cuda, the dry backend the budget search
 * replays plans on, the tests' fakes: memory, streams, events, host callbacks, timers. */
typedef struct cw__runtime_i {
    const char *name;
    unsigned caps; /* CW__CAP_* */
    /* required: frees the backend after all its work finished. */
    void (*destroy)(cw__backend *be);

    /* -- memory -- */
    /* required: device memory; returns CW_ERR_OUT_OF_MEMORY when the device is full. */
    cw_status (*dev_alloc)(cw__backend *be, int64_t bytes, void **out);
    /* required */
    void (*dev_free)(cw__backend *be, void *p);
    /* required: synchronous copies between host and device (whole-run boundaries only). */
    cw_status (*upload)(cw__backend *be, void *dst_dev, const void *src_host, int64_t bytes);
    cw_status (*download)(cw__backend *be, void *dst_host, const void *src_dev, int64_t bytes);
    /* (optional) default: none (the scheduler never copies; tests order device work with
     * it): asynchronous device-to-device copy on s. */
    cw_status (*copy_async)(cw__backend *be, cw__stream *s, void *dst, const void *src, int64_t bytes);
    /* required: fills `count` 32-bit words at p with pattern, on s (poison mode, zeroing). */
    cw_status (*fill32_async)(cw__backend *be, cw__stream *s, void *p, uint32_t pattern, int64_t count);

    /* -- streams and events, with CUDA's semantics -- */
    cw_status (*stream_create)(cw__backend *be, cw__stream **out);   /* required */
    void (*stream_destroy)(cw__backend *be, cw__stream *s);         /* required; drains s */
    cw_status (*event_create)(cw__backend *be, cw__event **out);     /* required */
    void (*event_destroy)(cw__backend *be, cw__event *e);           /* required */
    /* required: e completes when all work queued on s before this call has finished. */
    cw_status (*event_record)(cw__backend *be, cw__event *e, cw__stream *s);
    /* required: work queued on s after this call waits for the recording of e current at
     * the time of this call; a never-recorded e is a no-op. */
    cw_status (*stream_wait_event)(cw__backend *be, cw__stream *s, cw__event *e);
    /* required: *done = 1 if e's last recording completed (or e never recorded). */
    cw_status (*event_query)(cw__backend *be, cw__event *e, int *done);
    /* required: host blocks until e's last recording completed; counts a host sync. */
    cw_status (*event_synchronize)(cw__backend *be, cw__event *e);
    /* required: host blocks until all work on s finished; counts a host sync. */
    cw_status (*stream_synchronize)(cw__backend *be, cw__stream *s);
    /* required: host synchronisations so far. */
    int64_t (*host_syncs)(cw__backend *be);
    /* (optional) default: none. Runs fn(arg) on the host in stream order (trace timing). */
    cw_status (*launch_host)(cw__backend *be, cw__stream *s, cw__host_fn fn, void *arg);
    /* (optional) default: none. The n ranges of `bytes` bytes at p, p + stride, ... are not
     * needed after the work queued on s: the backend may give their memory back (cpu: the
     * whole pages inside each return to the system; what they read afterwards is
     * undefined). A donated input with no output after its last read (cw_graph_donate), an
     * activation at its free, an activation's dead rows in each channel plane (drops.c). */
    cw_status (*discard)(cw__backend *be, cw__stream *s, void *p, int64_t bytes, int64_t n, int64_t stride);
    /* (optional) default: none. A run whose host functions may block on another process (a
     * communicator's calls) follows: a backend whose host waits for room in a full queue
     * (cpu) stops waiting from now on, so ranks blocked at different places cannot wait on
     * each other. Never fails. */
    void (*unbound_queues)(cw__backend *be);
    /* (optional) default: s itself (cw__stream_handle). The handle a user allocator
     * (cw_allocator) is given for s: cuda's cudaStream_t. Never fails, never synchronises. */
    void *(*stream_handle)(cw__backend *be, cw__stream *s);
    /* (optional) default: CW_ERR_UNSUPPORTED (cw__stream_adopt). Makes a stream run on a
     * caller's native stream `handle` (cuda: a cudaStream_t of the backend's device; NULL is
     * the legacy default stream), which it never destroys: *s NULL: a new stream object;
     * otherwise *s's queued work finishes first (a host sync), its own native stream is
     * destroyed if it owned it, and *s runs on handle from then on (allocators and plans
     * keep the object). The context calls it under its lock (cw_context_set_cuda_stream). */
    cw_status (*stream_adopt)(cw__backend *be, void *handle, cw__stream **s);
    /* (optional) default: CW_ERR_UNSUPPORTED (cw__device_index). The device index the
     * backend runs on (cw_context_get_cuda_device). */
    cw_status (*device_index)(cw__backend *be, int *out);

    /* -- device timestamps (a scheduler uses them when present) -- */
    /* (optional) default: none; traces then come from launch_host callbacks. Device
     * timestamps: timer_create makes n marks; timer_mark records mark k on s (asynchronous,
     * never synchronises); timer_read, once every stream holding marks has been
     * synchronised, writes ns[k] = time of mark k - time of mark 0 in ns (-1 for a mark not
     * recorded since the last read) and forgets the recordings. */
    cw_status (*timer_create)(cw__backend *be, int n, cw__timer **out);
    void (*timer_destroy)(cw__backend *be, cw__timer *t);
    cw_status (*timer_mark)(cw__backend *be, cw__timer *t, int k, cw__stream *s);
    cw_status (*timer_read)(cw__backend *be, cw__timer *t, int64_t *ns);

    /* (optional) default: none. Frees what the backend keeps between calls that nothing
     * live holds (cpu: oneDNN plans no plan uses) and returns freed memory to the OS where
     * it can (cw_context_empty_cache). Host only; never fails. */
    void (*empty_cache)(cw__backend *be);
} cw__runtime_i;

/* The operations only executing backends implement (cpu, cuda). Callers go through the
 * cw__op_* functions below, which check the arguments once (naming the bad one) and
 * then call the hook: a hook trusts its arguments and checks only what its backend
 * lacks (a dtype, a BLAS int range), answering CW_ERR_UNSUPPORTED. All asynchronous on
 * s; the params are copied at the call. */
typedef struct cw__ops_i {
    /* required: algorithms for p, fastest first, at most max; *n how many. */
    cw_status (*conv_algos)(cw__backend *be, const cw__conv_problem *p, cw__conv_algo *out, int max, int *n);
    /* required: y = conv(x, w) (+ b). ws holds at least algo->workspace bytes. */
    cw_status (*conv_forward)(cw__backend *be, cw__stream *s, const cw__conv_problem *p, const cw__conv_algo *algo,
                              const void *x, const void *w, const void *b, void *y, void *ws, int64_t ws_bytes);
    /* required: the fused prep stage (see cw__prep_params). */
    cw_status (*prep)(cw__backend *be, cw__stream *s, const cw__prep_params *p);
    /* required: GroupNorm partial statistics of x (a row band of the tensor): for each
     * (n, g), out[(n*G + g)*3 + {0,1,2}] = {count, mean, M2} in double (device memory). */
    cw_status (*gn_stats)(cw__backend *be, cw__stream *s, const cw__view *x, int64_t groups, double *out);
    /* required: merges n_parts partial arrays (each [N*G*3], consecutive in `parts`) in
     * index order (Chan's formula), then scale[n*C+c] = gamma[c] * rstd(n,g),
     * shift[n*C+c] = beta[c] - mean(n,g) * scale[n*C+c]. */
    cw_status (*gn_finalize)(cw__backend *be, cw__stream *s, const double *parts, int64_t n_parts, int64_t n,
                             int64_t c, int64_t groups, const float *gamma, const float *beta, float eps,
                             float *scale, float *shift);
    /* required: dst = a + b (views of equal dims; dst may alias a or b exactly). */
    cw_status (*add)(cw__backend *be, cw__stream *s, const cw__view *dst, const cw__view *a, const cw__view *b);
    /* required: the generic op a (see cw__op_args), every code of kernels/kernels.h. */
    cw_status (*op)(cw__backend *be, cw__stream *s, const cw__op_args *a);
    /* required */
    cw_status (*gemm)(cw__backend *be, cw__stream *s, const cw__gemm_params *p);
    /* required: row-wise softmax in place: rows x cols, row stride ld (floats). */
    cw_status (*softmax_rows)(cw__backend *be, cw__stream *s, float *x, int64_t rows, int64_t cols, int64_t ld);

    /* -- compile-time preparation (a scheduler uses them when present) -- */
    /* (optional) default: none; conv_forward prepares on first use, inside a run. Host only:
     * makes conv_forward(p, algo, ws of ws_cap bytes) need no further preparation (cuda:
     * finalises the cuDNN execution plan, which may compile and load kernels, a device-wide
     * synchronisation) and writes to *used the algorithm conv_forward will run: algo, or,
     * where algo cannot run p within ws_cap, the backend's substitute (id, name, workspace).
     * ws_cap < 0: unlimited. Call at compile time for every conv task. */
    cw_status (*conv_prepare)(cw__backend *be, const cw__conv_problem *p, const cw__conv_algo *algo, int64_t ws_cap,
                              cw__conv_algo *used);
    /* (optional) default: no tuning (the listed order stands). Times cands[0..n) on p once
     * per (problem, algorithm) (cached) and sets *best to the index of the fastest. Runs on
     * the device, synchronously, with scratch memory of its own: compile time only. */
    cw_status (*conv_autotune)(cw__backend *be, const cw__conv_problem *p, const cw__conv_algo *cands, int n,
                               int *best);
    /* (optional) default: none. Drops what conv_prepare left in used->prepared (non-NULL);
     * the owner (a compiled plan's task) calls it once, when it is destroyed. */
    void (*conv_release)(cw__backend *be, void *prepared);
} cw__ops_i;

struct cw__backend {
    const cw__runtime_i *rt;
    const cw__ops_i *ops; /* NULL: the backend runs no operations (dry, test fakes) */
    cw_context *ctx;   /* for error messages; may be NULL in tests */
    int threads;       /* host threads its ops may use in total (cpu); 0 on device backends */
    int costs_are_ns;  /* conv_algos' cost is a time model, estimated ns of one call on one
                          core (cpu); 0: only an order (cuda's heuristics rank) */
};

/* The handle of s a user allocator sees (the optional stream_handle hook, or s). */
static inline void *cw__stream_handle(cw__backend *be, cw__stream *s) {
    return be->rt->stream_handle ? be->rt->stream_handle(be, s) : (void *)s;
}

/* The optional stream_adopt and device_index hooks with their defaults. */
static inline cw_status cw__stream_adopt(cw__backend *be, void *handle, cw__stream **s) {
    return be->rt->stream_adopt ? be->rt->stream_adopt(be, handle, s) : CW_ERR_UNSUPPORTED;
}
static inline cw_status cw__device_index(cw__backend *be, int *out) {
    return be->rt->device_index ? be->rt->device_index(be, out) : CW_ERR_UNSUPPORTED;
}

/* ops.c: the operations as callers use them. Each checks its arguments once (naming the
 * bad one in the context's message; CW_ERR_INVALID_ARG), returns CW_OK without calling the
 * backend for empty work, answers CW_ERR_UNSUPPORTED for a backend without ops, and calls
 * the hook. The optional hooks get their documented defaults here. */
cw_status cw__op_conv_algos(cw__backend *be, const cw__conv_problem *p, cw__conv_algo *out, int max, int *n);
cw_status cw__op_conv_forward(cw__backend *be, cw__stream *s, const cw__conv_problem *p, const cw__conv_algo *algo,
                              const void *x, const void *w, const void *b, void *y, void *ws, int64_t ws_bytes);
cw_status cw__op_conv_prepare(cw__backend *be, const cw__conv_problem *p, const cw__conv_algo *algo, int64_t ws_cap,
                              cw__conv_algo *used);
cw_status cw__op_conv_autotune(cw__backend *be, const cw__conv_problem *p, const cw__conv_algo *cands, int n,
                               int *best);
void cw__op_conv_release(cw__backend *be, cw__conv_algo *algo);
cw_status cw__op_prep(cw__backend *be, cw__stream *s, const cw__prep_params *p);
cw_status cw__op_gn_stats(cw__backend *be, cw__stream *s, const cw__view *x, int64_t groups, double *out);
cw_status cw__op_gn_finalize(cw__backend *be, cw__stream *s, const double *parts, int64_t n_parts, int64_t n,
                             int64_t c, int64_t groups, const float *gamma, const float *beta, float eps,
                             float *scale, float *shift);
cw_status cw__op_add(cw__backend *be, cw__stream *s, const cw__view *dst, const cw__view *a, const cw__view *b);
cw_status cw__op_run(cw__backend *be, cw__stream *s, const cw__op_args *a);
cw_status cw__op_gemm(cw__backend *be, cw__stream *s, const cw__gemm_params *p);
cw_status cw__op_softmax_rows(cw__backend *be, cw__stream *s, float *x, int64_t rows, int64_t cols, int64_t ld);

/* Backend constructors. cfg is the context's config (threads, flags, chaos seed). */
cw_status cw__backend_cpu_create(cw_context *ctx, const cw_context_config *cfg, cw__backend **out);
/* Returns CW_ERR_NO_DEVICE (with a message) when there is no driver or device, or when
 * built without CUDA (then cw__backend_cuda_compiled() is 0). */
cw_status cw__backend_cuda_create(cw_context *ctx, const cw_context_config *cfg, cw__backend **out);
int cw__backend_cuda_compiled(void);

/* A backend that touches no memory and runs no ops: dev_alloc hands out distinct fake
 * addresses, events complete at once. The scheduler dry-runs plans on it to simulate their
 * allocation sequence exactly. `real` lends it its context. */
cw_status cw__backend_dry_create(cw__backend *real, cw__backend **out);

#endif
