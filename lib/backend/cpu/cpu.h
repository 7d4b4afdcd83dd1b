/* The cpu backend's internal pieces: the stream worker (cpu_backend.c) exposes a closure
 * queue; the operation files (conv_cpu.c, ops_cpu.c) implement the op hooks by enqueueing
 * closures that run the math on the stream's worker thread. */
#ifndef CW_CPU_H
#define CW_CPU_H

#include "backend/backend.h"

/* The hot elementwise loops (conv preps, Winograd's transforms, the generic ops) compiled
 * three times, for AVX-512 (x86-64-v4), AVX2 and the baseline (SSE2), one picked once per
 * process by the CPU (GCC's function multiversioning: an ifunc). Vector width changes no
 * bits here: the loops add, multiply and divide in the order the source gives, and C11 mode
 * (-std=c11) with -ffp-contract=off forbids fusing a multiply-add. Not under TSan: an
 * ifunc's resolver runs while the library is relocated, before TSan's runtime is up, and GCC
 * instruments it (every test crashed on load). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__) && \
    !defined(__SANITIZE_THREAD__)
#define CW_CPU_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define CW_CPU_CLONES
#endif

/* Enqueues fn(arg) on stream s; the worker calls fin(arg) after fn (fin may be NULL;
 * typically cw__free). On failure to enqueue, fin(arg) is called here and the status
 * returned. */
cw_status cw__cpu_enqueue(cw__backend *be, cw__stream *s, void (*fn)(void *), void *arg, void (*fin)(void *));
/* Threads the backend's ops may use in total (the context's `threads`, or all cores). */
int cw__cpu_blas_threads(cw__backend *be);

/* par_cpu.c: the backend's own parallelism. fn(arg, lo, hi) over [0, n) cut into `threads`
 * contiguous ranges (the caller runs the first); results must not depend on the cut. */
typedef void (*cw__range_fn)(void *arg, int64_t lo, int64_t hi);
void cw__cpu_parallel(int threads, int64_t n, cw__range_fn fn, void *arg);
/* A team: fn(arg, team, rank, n) on n threads at once (the caller is rank 0; n <= threads,
 * fewer when a helper thread cannot be started), all finished when cw__cpu_team_run
 * returns. Members split work by rank; results must not depend on n. */
typedef struct cw__cpu_team cw__cpu_team;
typedef void (*cw__team_fn)(void *arg, cw__cpu_team *t, int rank, int n);
void cw__cpu_team_run(int threads, cw__team_fn fn, void *arg);
/* Returns once every member of t has called it as often as the caller has. */
void cw__cpu_team_barrier(cw__cpu_team *t);
/* Sets OpenBLAS's process-wide thread count to 1 unless it already is. */
void cw__cpu_blas_single(void);
/* The block grid cw__cpu_sgemm cuts an m x n product into: a function of (m, n) only. */
void cw__cpu_gemm_blocks(int64_t m, int64_t n, int64_t *mb, int64_t *nb);
/* C = alpha op(A) op(B) + beta C as single-threaded GEMM calls (cw__cpu_gemm1) on the fixed
 * blocks, spread over `threads` threads: identical bits for every thread count. */
void cw__cpu_sgemm(const cw__gemm_params *p, int threads);
/* One row-major f32 GEMM on the calling thread alone: oneDNN's sgemm where convweave is built
 * with oneDNN, in calls whose A block has at most 2^18 floats and B block fewer (a cut by
 * shape alone: oneDNN allocates a copy of larger operands per call, par_cpu.c), else
 * OpenBLAS's. oneDNN's JIT
 * kernels follow the CPU's instruction set whatever OPENBLAS_CORETYPE says. On an AVX-512 host
 * (bench/RESULTS.md, "One GEMM") they ran 1.0-1.2x OpenBLAS's own AVX-512 kernels and
 * 1.6-2.1x the AVX2 ones OPENBLAS_CORETYPE=Haswell forces; on AVX2 the two are even. Bits
 * depend on the CPU and the shape, never on threads. */
void cw__cpu_gemm1(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                   int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc);

/* cvt_cpu.c: f32 <-> storage dtype rows, bit-exact with core/half.h (F16C where the CPU
 * has it). Element i of a strided row is at i * stride elements. */
void cw__cpu_load_f32(float *dst, const void *src, cw_dtype dt, int64_t n, int64_t stride);
void cw__cpu_store_f32(void *dst, cw_dtype dt, int64_t stride, const float *src, int64_t n);
/* Element i of p as f32; element i of p set to a quiet NaN. */
float cw__cpu_load1(const void *p, cw_dtype dt, int64_t i);
void cw__cpu_fill_nan(void *p, cw_dtype dt, int64_t i);
/* Tests: 1 makes the f16 rows use the scalar functions instead of F16C (process-wide). */
void cw__cpu_cvt_force_scalar(int on);

/* Items a stream holds queued or running before an enqueue onto it waits (cpu_backend.c,
 * wait_room_locked). Each conv task is milliseconds of work: 256 keep every worker fed. */
#define CPU_QUEUE_MAX 256

/* cpu conv algorithm ids (DNNL is listed only when built with oneDNN, WINOGRAD and its
 * grouped variant WINOGRAD_KB, with a smaller workspace, only for the problems
 * cw__cpu_wino_supported accepts) */
enum {
    CW__CPU_ALGO_GEMM = 0,
    CW__CPU_ALGO_DIRECT = 1,
    CW__CPU_ALGO_DNNL = 2,
    CW__CPU_ALGO_WINOGRAD = 3,
    CW__CPU_ALGO_WINOGRAD_KB = 4,
    CW__CPU_ALGO_COUNT
};
#define CW__CPU_IS_WINO(id) ((id) == CW__CPU_ALGO_WINOGRAD || (id) == CW__CPU_ALGO_WINOGRAD_KB)

/* conv_geom.c: a problem's geometry as the cpu algorithms read it. 2-D is 3-D with D = 1;
 * extents and strides are in elements, in (D, H, W) or (n/k, c, d, h, w) order. */
typedef struct cw__cpu_geom {
    int64_t n, c, k, g, cg, kg;       /* batch, in/out channels, groups, per-group C and K */
    int64_t in[3], out[3], ks[3];     /* D, H, W extents */
    int64_t st[3], dl[3], pp[3];      /* stride, dilation, pad_pre */
    int64_t xs[5], ys[5], wsd[5];     /* strides: n/k, c, d, h, w (d = 0 in 2-D) */
    int has_bias;
    cw_dtype dt;                      /* x, w, bias and y */
    size_t es;                        /* bytes per element */
} cw__cpu_geom;
void cw__cpu_geom_make(const cw__conv_problem *p, cw__cpu_geom *g);
/* Output positions o in [0, n_out) whose input index o*s + off lies in [0, n_in):
 * [*lo, *hi) (empty when *lo == *hi). */
static inline void cw__cpu_conv_range(int64_t off, int64_t s, int64_t n_in, int64_t n_out, int64_t *lo,
                                      int64_t *hi) {
    int64_t l = off >= 0 ? 0 : (-off + s - 1) / s;
    int64_t h = (n_in - 1 - off) >= 0 ? (n_in - 1 - off) / s + 1 : 0;
    if (l > n_out) l = n_out;
    if (h > n_out) h = n_out;
    if (h < l) h = l;
    *lo = l;
    *hi = h;
}

/* conv_direct.c: the DIRECT algorithm, synchronously on `threads` threads (the bits do not
 * depend on it); no workspace. conv_cpu.c runs it as an algorithm, conv_dnnl.c as the
 * fallback for sub-bands oneDNN refuses. */
void cw__cpu_conv_direct(const cw__conv_problem *p, const void *x, const void *w, const void *b, void *y,
                         int threads);

/* conv_cpu.c: the backend hooks, and the synchronous math they run (tests use it). */
cw_status cw__cpu_conv_algos(cw__backend *be, const cw__conv_problem *p, cw__conv_algo *out, int max, int *n);
cw_status cw__cpu_conv_forward(cw__backend *be, cw__stream *s, const cw__conv_problem *p, const cw__conv_algo *algo,
                               const void *x, const void *w, const void *b, void *y, void *ws, int64_t ws_bytes);
/* The conv_prepare hook: builds the oneDNN plan of a DNNL task at compile time; used->prepared
 * holds it until the conv_release hook. */
cw_status cw__cpu_conv_prepare(cw__backend *be, const cw__conv_problem *p, const cw__conv_algo *algo, int64_t ws_cap,
                               cw__conv_algo *used);
/* The conv_release hook: drops the hold conv_prepare put in prepared. */
void cw__cpu_conv_release(cw__backend *be, void *prepared);
/* Synchronous convolution (x, w, b, y of p's dtype: f32, f16 or bf16; f32 arithmetic) with
 * the given algorithm id on `threads` threads (the bits do not depend on it); ws >=
 * workspace bytes. */
void cw__cpu_conv_run(const cw__conv_problem *p, int algo, const void *x, const void *w, const void *b, void *y,
                      void *ws, int threads);
/* Workspace bytes of algorithm id for p; -1 when the algorithm cannot be planned for p
 * (DNNL: built without oneDNN, or oneDNN failed). */
int64_t cw__cpu_conv_workspace(const cw__conv_problem *p, int algo);

/* conv_winograd.c: Winograd F(2x2,3x3) for 3x3, stride 1, dilation 1, ungrouped convs (3-D
 * with a kernel depth of 1), any paddings and strided views, f32/f16/bf16 storage with f32
 * arithmetic. The output's tiles are cut into blocks of a size fixed by the shape; each
 * block's 16 products are single-threaded cw__cpu_gemm1 calls, so the bits never depend on the
 * thread count. */
int cw__cpu_wino_supported(const cw__cpu_geom *g);
/* Tiles per block and output channels per group (functions of the shape and of `grouped`,
 * CW__CPU_ALGO_WINOGRAD_KB, only), and the workspace bytes the run uses: one group's
 * transformed weights [16][Kb][C] plus one block's transformed input [16][C][T] and products
 * [16][Kb][T], f32. */
int64_t cw__cpu_wino_block(const cw__cpu_geom *g);
int64_t cw__cpu_wino_kblock(const cw__cpu_geom *g, int grouped);
int64_t cw__cpu_wino_workspace(const cw__cpu_geom *g, int grouped);
/* y = conv(x, w) + b on `threads` threads (bits independent of it); ws: the workspace. */
void cw__cpu_wino_run(const cw__cpu_geom *g, const void *x, const void *w, const void *b, void *y, void *ws,
                      int grouped, int threads);

/* conv_dnnl.c: oneDNN convolution on blocked layouts (CONVWEAVE_DNNL; stubs without). A
 * plan is one patch problem's sub-bands, primitives and workspace layout, made once, held
 * by the compiled plans whose tasks run it, and kept in a process-wide cache keyed by the
 * problem (not the data pointers) that holds at most 64 MiB of plans nothing else holds. */
typedef struct cw__dnnl_plan cw__dnnl_plan;
typedef struct cw__dnnl_info {
    int64_t workspace;   /* bytes the run uses: weights, sub-band buffers, scratchpads */
    int64_t moved_bytes; /* bytes reordered per run (weights + blocked inputs + outputs) */
    double flops;
    int subbands;
    char impl[32];       /* oneDNN's kernel for the bulk of the patch, e.g. "jit:avx2" */
} cw__dnnl_info;
/* 1 when built with oneDNN. */
int cw__cpu_dnnl_compiled(void);
/* cw__cpu_gemm1 through oneDNN's dnnl_sgemm, single-threaded: 1 when it ran, 0 when built
 * without oneDNN or oneDNN refused (the caller then runs OpenBLAS). */
int cw__cpu_dnnl_sgemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                       int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc);
/* The largest OpenMP max-threads value in effect on a thread when it created or ran a
 * oneDNN primitive (0 before any): 1 when every oneDNN call was single-threaded. */
int cw__cpu_dnnl_threads_seen(void);
/* Costs p without making a primitive (no JIT, nothing kept): fills info as
 * cw__cpu_dnnl_info would for p's plan and sets *listed to its return value. Fails as
 * cw__cpu_dnnl_plan_get does. */
cw_status cw__cpu_dnnl_cost(cw_context *ctx, const cw__conv_problem *p, cw__dnnl_info *info, int *listed);
/* What oneDNN has made in this process (tests): primitive descriptors (costing and
 * building), primitives, plans built with their primitives; built plans alive now, plans
 * in the cache, the bytes it charges for them and for those only it holds (at most
 * DN_CACHE_BYTES, 64 MiB); problems whose costing is kept (cw__cpu_dnnl_cost). */
typedef struct cw__dnnl_stats {
    int64_t pds, primitives, plans_built;
    int64_t live_plans, cache_plans, cache_bytes, idle_bytes;
    int64_t cost_entries;
} cw__dnnl_stats;
void cw__cpu_dnnl_stats(cw__dnnl_stats *s);
/* The plan for p, held until cw__cpu_dnnl_release. Fails on host OOM or an unexpected
 * oneDNN error; sub-bands oneDNN has no kernel for run cpu_direct inside the plan. */
cw_status cw__cpu_dnnl_plan_get(cw_context *ctx, const cw__conv_problem *p, cw__dnnl_plan **out);
void cw__cpu_dnnl_release(cw__dnnl_plan *pl);
/* Takes another hold on pl (released by cw__cpu_dnnl_release) and returns 1 when pl was
 * made for p's problem (same key); else 0 and nothing is held. */
int cw__cpu_dnnl_hold(cw__dnnl_plan *pl, const cw__conv_problem *p);
/* Drops the plans only the cache holds and the kept costings, empties oneDNN's primitive
 * cache and gives freed heap back to the OS (glibc: malloc_trim). Plans held elsewhere
 * stay. */
void cw__cpu_dnnl_trim(void);
/* Fills info; returns 1 when the plan is worth listing (a oneDNN kernel, not its
 * reference code, runs the bulk of the patch). */
int cw__cpu_dnnl_info(const cw__dnnl_plan *pl, cw__dnnl_info *info);
/* Runs plan pl for problem p (the one it was made for) on `threads` threads (the bits do
 * not depend on it); ws holds info.workspace bytes. On failure y's view is NaN and msg
 * names the call. */
cw_status cw__cpu_dnnl_run(const cw__dnnl_plan *pl, const cw__conv_problem *p, const void *x, const void *w,
                           const void *b, void *y, void *ws, int threads, char *msg, size_t msg_len);

/* ops_cpu.c: the backend's ops table (the hooks of the elementwise, reduction and
 * attention ops live there; the conv hooks above), and the synchronous math of its ops. */
extern const cw__ops_i cw__cpu_ops;
void cw__cpu_prep_run(const cw__prep_params *p);
void cw__cpu_gn_stats_run(const cw__view *x, int64_t groups, double *out);
void cw__cpu_gn_finalize_run(const double *parts, int64_t n_parts, int64_t n, int64_t c, int64_t groups,
                             const float *gamma, const float *beta, float eps, float *scale, float *shift);
void cw__cpu_add_run(const cw__view *dst, const cw__view *a, const cw__view *b);
/* The generic op a (kernels/kernels.h CW_OP_*), run on the calling thread. */
void cw__cpu_op_exec(const cw__op_args *a);
void cw__cpu_softmax_rows_run(float *x, int64_t rows, int64_t cols, int64_t ld);

#endif
