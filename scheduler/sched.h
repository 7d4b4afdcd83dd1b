/* Internal structures of the scheduler: the graph as the user built it, and the plan it
 * lowers into — buffers, tasks on streams, and the host-ordered action list that
 * cw_plan_run replays (allocate, enqueue task with event waits, free). Which file does
 * what: docs/architecture.md. */
#ifndef CW_SCHED_H
#define CW_SCHED_H

#include "alloc/alloc.h"
#include "backend/backend.h"
#include "core/core.h"

/* CW__N_OP: a generic op (cw__node.op, a CW_OP_* code of kernels/kernels.h, and its
 * parameters): new ops of that form need no new kind (docs/adding-an-op.md). */
typedef enum { CW__N_INPUT, CW__N_CONST, CW__N_CONV, CW__N_GN, CW__N_SILU, CW__N_ADD, CW__N_UP2, CW__N_ATTN,
               CW__N_OP } cw__nkind;

typedef struct cw__node {
    cw__nkind kind;
    char name[64];       /* op name used in task names ("conv3x3 32->64") */
    char oname[64];      /* output name given to cw_graph_output */
    cw_tensor_desc desc; /* result, contiguous dims */
    int in[4];           /* operand nodes, -1 unused */
    cw_conv_params conv;
    int64_t groups;
    float eps, scale;
    int64_t block;       /* CW__N_ATTN: tokens per mask block (0: no mask), mask its cw_attention_mask */
    int mask;
    int op;              /* CW__N_OP: its CW_OP_* code and parameters */
    cw_op_param param;
    const cw_tensor *t;  /* constants */
    int index;           /* input / output position */
    int is_output;
    int donor;           /* output: 1 + the input donated to it (cw_graph_donate), 0 none;
                            input: 1 when donated with no output (its memory may go back) */
    int n_uses;
} cw__node;

/* The most outputs a graph marks (cw_graph_output): a video VAE's chunk step returns every
 * causal conv's cache (CogVideoX's: over 100). */
#define CW__MAX_OUTPUTS 4096

/* A graph has one element type (graph.c): its activations, conv weights and conv biases are
 * all `dtype`; dtype_node is the node that fixed it (-1 until one did). GroupNorm gamma and
 * beta and the per-channel ops' vectors are f32 in every graph. */
struct cw_graph {
    cw_context *ctx;
    cw__node *nodes;
    int n, cap;
    cw_dtype dtype;
    int dtype_node;
    int n_inputs;
    int outputs[CW__MAX_OUTPUTS];
    int n_outputs;
};

/* Buffers the plan refers to. External ones get their memory at run time. */
typedef enum { CW__B_INPUT, CW__B_OUTPUT, CW__B_CONST, CW__B_ACT, CW__B_TEMP } cw__bkind;

typedef struct cw__buf {
    cw__bkind kind;
    int ext;             /* input/output index, or node id of the constant */
    cw_tensor_desc d;    /* dims; strides are the run-time tensor's for externals */
    int64_t bytes;       /* for ACT/TEMP */
    int64_t offset;      /* ACT: byte offset in the plan's activation arena (arena.c) */
    int ax;              /* a rank's share of a distributed plan (distribute.c): d holds rows */
    int64_t row0;        /* [row0, row0 + d.dims[ax]) along dim ax of the whole tensor; views
                            keep whole-tensor coordinates (cw__resolve subtracts row0) */
    const cw_tensor *t;  /* for CONST */
    int tail, head;      /* ACT split in two (lower.c, cw__split_target): the head holds the
                            tensor's first `bytes`, its tail (another ACT buffer, -1: none)
                            the rest, placed right after it in the arena and freed earlier;
                            the tail's head (-1: none). Views of the tensor name the head. */
    int tail_freed;      /* lowering: the tail's FREE is emitted */
} cw__buf;

/* A view of a buffer: start index and extent per dim; strides resolved at run time. */
typedef struct cw__vref {
    int buf;
    int rank;
    int64_t start[CW_MAX_RANK];
    int64_t dims[CW_MAX_RANK];
} cw__vref;

/* CW__T_SEND / CW__T_RECV: rows of a buffer to / from another rank (distribute.c). */
typedef enum { CW__T_CONV, CW__T_PREP, CW__T_ADD, CW__T_STATS, CW__T_FINALIZE, CW__T_ATTN, CW__T_OP, CW__T_SEND,
               CW__T_RECV } cw__tkind;

/* A conv task's problem and algorithm (464 bytes), kept apart from its task record so that
 * the plan's other tasks (most of a patched plan's) do not carry them. */
typedef struct cw__conv_ext {
    cw__conv_problem prob; /* descs' strides filled at run time */
    cw__conv_algo algo;
} cw__conv_ext;

typedef struct cw__task {
    cw__tkind kind;
    int stage;           /* CW_STAGE_* */
    int stream;          /* plan stream index */
    int name;            /* its name's offset in the plan's name pool (cw__task_name) */
    int *deps;
    int n_deps;
    int event;           /* index into plan events, -1 if no cross-stream consumer */
    int *waits;          /* tasks whose events this one waits on (deduplicated) */
    int n_waits;
    int *alloc_waits;    /* events of allocations on other streams of buffers it is the
                            first on its stream to use */
    int n_alloc_waits;
    double flops;
    int threads;         /* cpu: threads its op uses, fixed at compile (bits never depend on it) */
    int node;
    union {
        struct {
            int ext;             /* its problem and algorithm: p->cexts[ext] (cw__conv_of) */
            cw__vref x, w, b, y;
            int has_b;
            int ws_buf;
        } conv;
        struct {
            cw__vref src, dst;
            int ss_buf;          /* scale/shift buffer (2*N*C floats), -1 none */
            int silu, up;
            int unary;           /* then a unary op (cw__prep_params.unary, ua, ub) */
            float ua, ub;
            int64_t dst_row0, src_row0;
            int64_t pad[3], up_h; /* replicate padding (cw__prep_params) */
            int64_t up_d, off_d;  /* upsampling along D (cw__prep_params) */
        } prep;
        struct {
            cw__vref dst, a, b;
        } add;
        struct {
            cw__vref x;
            int64_t groups;
            int part_buf;
            int64_t part_index;
        } stats;
        struct {
            int part_buf;
            int64_t n_parts, n, c, groups;
            cw__vref gamma, beta;
            float eps;
            int ss_buf;
        } fin;
        struct {
            int code;            /* CW_OP_* */
            cw__vref out, in[CW_OP_MAX_IN]; /* the op's arity of inputs */
            cw_op_param param;
        } op;
        struct {
            cw__vref q, k, v, o;
            int64_t n, t0, t1, T, C;
            int64_t block;   /* 0: no mask; else mask's blocks (cw__attn_keys) */
            int mask;
            int s_buf;
            float scale;
        } attn;
        struct {
            cw__vref v;      /* whole-tensor coordinates */
            int peer;
            int64_t tag;     /* the message's index in the plan, the same on both ranks */
        } comm;
    } u;
} cw__task;

/* DISCARD: a donated input with no output, after its last reader (cw_graph_donate): placed
 * and joined like a FREE, run as the backend's discard. DROP: rows of a live activation that
 * no later task touches (drops.c), placed and joined like a FREE, run as the backend's
 * discard of those rows' whole pages. */
typedef enum { CW__A_ALLOC, CW__A_FREE, CW__A_TASK, CW__A_DISCARD, CW__A_DROP } cw__akind;

/* A DROP's rows: [r0, r1) along dim ax of its activation (the rows before r0 went earlier). */
typedef struct cw__drop {
    int ax;
    int64_t r0, r1;
} cw__drop;

typedef struct cw__action {
    cw__akind kind;
    int id;              /* buffer or task */
    int stream;          /* ALLOC/FREE: stream */
    int event;           /* ALLOC: recorded after the allocation when other streams use the
                            buffer too (they wait on it before their first use); FREE of an
                            activation: recorded after it when a later activation on another
                            stream reuses its bytes; else -1 */
    int *joins;          /* FREE, DROP: tasks on other streams to wait for first */
    int n_joins;
    int drop;            /* DROP: its rows, p->drops[drop] */
    int *waits;          /* ALLOC of an activation: events of the frees of earlier activations
                            whose arena bytes it reuses (arena.c) */
    int n_waits;
} cw__action;

/* An input or output of the plan: its shape and the name the user gave it. */
typedef struct cw__port {
    cw_tensor_desc d;
    char name[64];
    int donor;           /* output: the input whose tensor it may share (cw_graph_donate), -1 */
} cw__port;

/* Describes one conv's patching for cw_plan_describe. */
typedef struct cw__conv_info {
    int node;
    int patches;
    int *tasks;          /* its conv task per patch */
    int axis;            /* the tensor dim its patches cut: H (rank - 2) or D (2, 5-D only) */
    int64_t out_rows;    /* its output's extent along that axis */
    int fused_prep;
    double halo_pct;
} cw__conv_info;

struct cw_plan {
    cw_context *ctx;
    cw_compile_options opt;
    cw_dtype dtype;        /* the graph's element type (f32 for a graph without activations) */
    int64_t budget;        /* <= 0 unlimited */
    int n_streams;         /* plan streams; heavy = max(1, n-1), light = n-1 (or 0) */
    cw__buf *bufs;
    int n_bufs, cap_bufs;
    cw__task *tasks;
    int n_tasks, cap_tasks;
    cw__conv_ext *cexts;   /* the conv tasks' problems and algorithms */
    int n_cexts, cap_cexts;
    char *names;           /* the tasks' names, each ended by a NUL; offset 0 is "" */
    int n_names, cap_names;
    cw__drop *drops;       /* the DROP actions' rows */
    int n_drops, cap_drops;
    cw__action *acts;
    int n_acts, cap_acts;
    int n_events;
    int n_inputs, n_outputs;
    cw__port *in, *out;     /* what cw_plan_run binds, by position */
    cw__conv_info *convs;
    int n_convs, cap_convs;
    int64_t weights_bytes;
    int64_t temp_predicted;
    int64_t arena;           /* bytes primed into the capped pool at run start (0: none) */
    int64_t arena_reserved;  /* the pool's reserved bytes once primed (its rounding included) */
    cw__allocator *primed;   /* the pool that arena_reserved describes */
    int fork_event;          /* events fork_event..+n_streams-1: the run's fork from stream 0
                                and each other stream's join back into it */
    int64_t act_bytes;       /* the activation arena: every activation at a fixed offset */
    int64_t act_live_peak;   /* the most activation bytes live at once (act_bytes >= it) */
    void *act_arena;         /* device memory of act_bytes, from compile to destroy or
                                cw_plan_release (NULL until the next run takes it again) */
    cw__timer *timer;        /* device timestamps for traces (backends with timer hooks,
                                CW_FLAG_TIMING): mark 0 at the fork, 1+2k / 2+2k around task k */
    double conv_gflop, halo_flop;
    double recompute_flop;   /* conv FLOPs of second passes over recomputed blocks */
    int n_rec_whole;         /* convs recomputing a band planned on the whole share (lower_conv.c) */
    int n_recomputed;
    int *rec_nodes;          /* the recomputed convs (each block's first conv), n_recomputed */
    /* run state */
    cw__allocator *temp;   /* the context's when the plan's budget is the context's */
    int own_temp;
    cw__event **events;
    void **ptrs;           /* per buffer, during a run */
    cw_tensor_desc *rdesc; /* per buffer run-time desc (strides) */
    int64_t *t0, *t1;      /* per task timestamps (ns) when timing */
    int64_t run_t0;
    cw_progress_fn progress_fn;
    void *progress_user;
    _Atomic int64_t progress_done;
    cw_plan_stats stats;
    int ran;
    /* distributed (opt.comm): the comm stream (n_streams - 1), each output's band on this
     * rank (3 per output: axis, r0, r1), and the run's first comm failure */
    int comm_stream;
    int64_t *bands;
    struct cw__comm_arg *comm_args; /* per task (cpu: the host call's view), during a run */
    _Atomic int comm_status;
    char comm_msg[256];
};

/* emit.c: grows *arr (zero-filled) to hold need elements of elem bytes. */
cw_status cw__grow(void **arr, int *cap, int need, size_t elem);
/* plan.c: names task t (printf-style) in the plan's name pool. */
cw_status cw__task_set_name(cw_plan *p, cw__task *t, const char *fmt, ...) CW__PRINTF(3, 4);
/* plan.c: a new conv problem-and-algorithm record, zeroed, in *out. */
cw_status cw__conv_ext_new(cw_plan *p, int *out);
static inline const char *cw__task_name(const cw_plan *p, const cw__task *t) {
    return p->names ? p->names + t->name : "";
}
static inline cw__conv_ext *cw__conv_of(const cw_plan *p, const cw__task *t) { return &p->cexts[t->u.conv.ext]; }

/* a and b have the same rank and dims. */
static inline int cw__same_dims(const cw_tensor_desc *a, const cw_tensor_desc *b) {
    if (a->rank != b->rank) return 0;
    for (int i = 0; i < a->rank; i++)
        if (a->dims[i] != b->dims[i]) return 0;
    return 1;
}

/* drops.c: inserts DROP actions into the host-ordered action list (before cw__plan_sync). */
cw_status cw__plan_drops(cw_plan *p);
/* arena.c: places every activation at a fixed offset of one arena (after cw__plan_sync). */
cw_status cw__plan_place_activations(cw_plan *p);
/* distribute.c: makes p, a finished single-process plan, this rank's share under
 * p->opt.comm (a no-op without one), then places its events, frees and activations again. */
cw_status cw__plan_distribute(cw_plan *p);
/* budget.c: whether memory_budget CW_MEMORY_AUTO with memory_auto_pct pct may take ladder
 * point pt over `stored`, the ladder's last point (its conv FLOPs stored_gflop): pt's
 * estimated conv time at most pct % above stored's, or where stored has no time
 * (conv_cost_ms <= 0), pt's recompute FLOPs at most pct % of stored_gflop. */
int cw__memory_auto_accepts(const cw_memory_point *stored, double stored_gflop, const cw_memory_point *pt,
                            double pct);
/* distribute.c: checks that every rank compiles g with the same options (compile time,
 * host calls); names what differs. */
cw_status cw__comm_check_config(cw_graph *g, const cw_compile_options *opt);
/* graph.c */
const cw__node *cw__graph_node(const cw_graph *g, cw_node id);
/* lower.c: lowers g into a plan sized under `budget` (< 0 unlimited) that must fit `cap`
 * (the plan's budget, >= budget; the budget search retries with smaller sizing budgets). */
/* rec_allow (per graph node, may be NULL: none): the convs that may be recomputed where only
 * convs read them (cw_compile_options.memory_budget, budget.c picks them): 1 where one conv
 * reads it (the first conv of a ResNet-style block), 2 also where several do (each then
 * recomputes it); the others are stored. rec_whole: a conv recomputing another's bands may
 * take a plan sized on the whole share where it is much faster (lower_conv.c cw__rec_whole). */
cw_status cw__plan_build(cw_graph *g, const cw_compile_options *opt, int64_t budget, int64_t cap,
                         const unsigned char *rec_allow, int rec_whole, cw_plan **out);
/* sync.c: the buffers task t touches (weights and biases excepted), into out, which holds
 * CW__TASK_MAX_BUFS; returns how many. */
#define CW__TASK_MAX_BUFS 5
int cw__task_bufs(const cw__task *t, int *out);
/* sync.c: the views task t reads or writes its buffers through (the buffers cw__task_bufs
 * lists but these do not, a workspace, scale/shift or partials, it reaches whole), into v,
 * which holds CW__TASK_MAX_BUFS; returns how many. */
int cw__task_views(const cw__task *t, const cw__vref **v);
/* sync.c: places allocations and frees on streams and the events between streams. */
cw_status cw__plan_sync(cw_plan *p);
/* execute.c: replays the action list on a backend; dry = allocation simulation only. */
cw_status cw__plan_execute(cw_plan *p, cw__backend *be, cw__allocator *temp, int dry,
                           int64_t *peak_temp, int64_t *peak_allocated);
/* plan.c */
void cw__plan_free(cw_plan *p);
/* plan.c: takes the activation arena again after cw_plan_release (a no-op while the plan
 * holds it). */
cw_status cw__plan_acquire(cw_plan *p);
/* execute.c: r's view of a buffer whose run-time desc is bd (dims r's, strides bd's) in *d;
 * returns the view's first element's offset in elements. */
int64_t cw__vref_desc(const cw_tensor_desc *bd, const cw__vref *r, cw_tensor_desc *d);
/* execute.c: primes temp with the plan's arena (one free segment) unless it already holds
 * exactly that. */
cw_status cw__plan_prime(cw_plan *p, cw__allocator *temp);

/* The keys [*k0, *k1) that query token r of an attention over T tokens sees (block 0: all;
 * else mask's, a cw_attention_mask), and *end: the first token after r that sees others. */
static inline void cw__attn_keys(int64_t block, int mask, int64_t T, int64_t r, int64_t *k0, int64_t *k1, int64_t *end) {
    *k0 = 0, *k1 = T, *end = T;
    if (block <= 0) return;
    *end = (r / block + 1) * block;
    if (*end > T) *end = T;
    *k1 = *end;
    if (mask == CW_ATTENTION_BLOCK_DIAGONAL) *k0 = r / block * block;
}

#endif
