/* Private to the cuDNN convolution layer (cudnn_graph.c, cudnn_engines.c, cudnn_cache.c,
 * cudnn_run.c): the engine-config cache's types and the calls between those files. The
 * layer's interface to the rest of the backend is in cuda_internal.h. */
#ifndef CW_CUDNN_CONV_H
#define CW_CUDNN_CONV_H

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


/* cuDNN engines index tensors with 32-bit offsets: only a generic engine takes a tensor
 * whose strided span (or a stride) reaches 2^31 elements (measured with cuDNN 9.19 and an
 * H100 profile: f16 1024x1448^2 gets 26 engine configs, 1024x1449^2 one). A height patch
 * keeps its tensor's strides, so its span is nearly that of the whole tensor (C stride
 * H*W). For those problems the list also offers "packed" configs: x and y are copied
 * through contiguous patch-sized buffers at the start of the workspace (counted in the
 * workspace the planner budgets). */
#define CW__SPAN_LIMIT ((int64_t)1 << 31)

static inline int64_t cw__round256(int64_t b) { return (b + 255) / 256 * 256; }

/* Algorithm ids are stable across problems (the planner matches the full conv's list with
 * its patches' lists by id): the engine, whether it runs the bias-fused graph, whether its
 * knobs are the heuristics' first choice or its leanest (smallest workspace) listed choice,
 * and whether it runs packed. */
static inline int cw__cfg_id(int64_t engine, int fused, int lean, int packed) {
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

static inline int64_t cw__cfg_total_ws(const cw__cudnn_entry *e, const cw__cudnn_cfg *f) {
    return f->ws + (f->packed ? e->pack_bytes[0] + e->pack_bytes[1] : 0);
}

/* One heuristics result before selection. */
typedef struct cw__raw_cfg {
    cudnnBackendDescriptor_t cfg;
    int64_t ws, engine;
    uint64_t sig;
} cw__raw_cfg;

/* cudnn_graph.c: d with its strides filled in (all-zero strides: contiguous); a one-line
 * description of p for messages. */
cw_tensor_desc cw__filled(const cw_tensor_desc *d);
const char *cw__problem_str(const cw__conv_problem *p, char *buf, size_t n);

/* cudnn_engines.c: heuristics (mode A, then FALLBACK's configs not already listed) for one
 * graph into raw; whether p needs packed configs; the packed and bias-fused graphs'
 * configs; the picks of the three lists into e in their order; the configs not taken. */
void cw__heuristics_both(cw__cudnn_conv *c, const cw__cudnn_graph *g, cw_dtype dt, cw__raw_cfg *raw, int *n,
                         cw_status *sa, cw_status *sf);
int cw__needs_pack(const cw__conv_problem *p);
void cw__entry_pack(cw__cudnn_conv *c, cw__cudnn_entry *e, const cw__conv_problem *p, const int64_t align[3],
                    cw__raw_cfg *rawp, int *n_rawp);
void cw__entry_fused(cw__cudnn_conv *c, cw__cudnn_entry *e, const cw__conv_problem *p, const int64_t align[3],
                     cw__raw_cfg *rawf, int *n_rawf);
void cw__entry_order(cw__cudnn_entry *e, cw_dtype dt, cw__raw_cfg *rawp, int n_rawp, cw__raw_cfg *raw, int n_raw,
                     cw__raw_cfg *rawf, int n_rawf);
void cw__raw_free(cw__raw_cfg *raw, int n_raw);

/* cudnn_cache.c: the problem's entry (built on first use) and config id's plan, finalised
 * on first use, under c->mu (cw__cudnn_conv_plan without the lock). */
cw_status cw__entry_get(cw__cudnn_conv *c, const cw__conv_problem *p, const int64_t align[3], cw__cudnn_entry **out);
cw_status cw__conv_plan_locked(cw__cudnn_conv *c, const cw__conv_problem *p, const int64_t align[3], int id,
                                      int64_t ws_cap, int allow_packed, int allow_fused, cw__cudnn_choice *out,
                                      cw__cudnn_entry **entry);

#endif
