/* oneDNN convolution as a cpu algorithm (CW__CPU_ALGO_DNNL; built with CONVWEAVE_DNNL).
 * A patch is cut into row sub-bands whose boundaries depend on its shape only; each
 * sub-band's input rows are reordered from the strided NCHW view into oneDNN's blocked
 * layout (nChw8c on AVX2) in the workspace, convolved with its own pre/post padding, and
 * reordered into the output view. Every oneDNN call runs single-threaded (the calling
 * thread's OpenMP ICV set to 1) and threads only decide which sub-band runs where, so the
 * bits never depend on the thread count (docs/determinism.md), as for the GEMM blocks.
 *
 * The workspace holds the reordered weights, every sub-band's blocked input and output,
 * and one user-mode scratchpad per thread slot: all from the budget. Listing and costing
 * the algorithm makes primitive descriptors only (layouts, scratchpad sizes, kernel name:
 * no JIT); primitives are made when a compiled plan prepares a patch that runs oneDNN. The
 * plan's task holds them until the plan is destroyed; a process-wide cache keyed by the
 * patch problem shares them between plans and keeps at most DN_CACHE_BYTES of those no
 * plan holds. cw_context_empty_cache and the last context's destroy drop those, empty
 * oneDNN's own primitive cache and trim the heap (cw__cpu_dnnl_trim).
 *
 * f16/bf16 problems ask oneDNN for a convolution in that dtype (x, w, bias, y alike); where
 * it has no kernel (AVX2 hosts: none at all, oneDNN 2.6) every sub-band falls back to
 * cpu_direct and cw__cpu_dnnl_info does not list the algorithm. */
#include <stdio.h>
#include <string.h>

#include "backend/cpu/cpu.h"

#ifndef CW_HAVE_DNNL

int cw__cpu_dnnl_compiled(void) { return 0; }
int cw__cpu_dnnl_sgemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                       int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
    return 0;
}
int cw__cpu_dnnl_threads_seen(void) { return 0; }
void cw__cpu_dnnl_stats(cw__dnnl_stats *s) { memset(s, 0, sizeof *s); }
cw_status cw__cpu_dnnl_cost(cw_context *ctx, const cw__conv_problem *p, cw__dnnl_info *info, int *listed) {
    memset(info, 0, sizeof *info);
    *listed = 0;
    return cw__error(ctx, CW_ERR_UNSUPPORTED, "cpu dnnl: convweave was built without oneDNN (CONVWEAVE_DNNL=OFF)");
}
cw_status cw__cpu_dnnl_plan_get(cw_context *ctx, const cw__conv_problem *p, cw__dnnl_plan **out) {
    *out = NULL;
    return cw__error(ctx, CW_ERR_UNSUPPORTED, "cpu dnnl: convweave was built without oneDNN (CONVWEAVE_DNNL=OFF)");
}
void cw__cpu_dnnl_release(cw__dnnl_plan *pl) {}
int cw__cpu_dnnl_hold(cw__dnnl_plan *pl, const cw__conv_problem *p) { return 0; }
void cw__cpu_dnnl_trim(void) {}
int cw__cpu_dnnl_info(const cw__dnnl_plan *pl, cw__dnnl_info *info) {
    memset(info, 0, sizeof *info);
    return 0;
}
cw_status cw__cpu_dnnl_run(const cw__dnnl_plan *pl, const cw__conv_problem *p, const void *x, const void *w,
                           const void *b, void *y, void *ws, int threads, char *msg, size_t msg_len) {
    snprintf(msg, msg_len, "cpu dnnl: built without oneDNN");
    return CW_ERR_UNSUPPORTED;
}

#else

#include <math.h>
#include <omp.h>
#include <stdatomic.h>

#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_debug.h>

#define DN_ALIGN 64       /* bytes: every workspace region starts on a cache line */
#define DN_MAX_SUB 64     /* sub-bands per patch */
#define DN_MAX_CLASS 16   /* distinct sub-band shapes per patch: (first, interior, last)^2 */
#define DN_SLOTS 16       /* scratchpad slots = cw__cpu_parallel's thread cap */
/* Bytes of plans the cache keeps that nothing else holds (least recently used evicted
 * beyond it). A plan is charged its descriptors (~8 KiB, and ~7 KiB per sub-band class) plus
 * DN_PRIM_BYTES per primitive: measured 16-96 KiB of heap and JIT pages per primitive
 * (AVX2, C 32-256, W 64-1024; most at large W), ~0.6 MiB per plan for the tiny VAE at
 * 1024^2, so the charge bounds the real bytes from above for those shapes. Plans a
 * compiled plan or a queued job holds are never evicted: they are that plan's memory. */
#define DN_CACHE_BYTES (INT64_C(64) << 20)
#define DN_PRIM_BYTES (INT64_C(96) << 10)
#define DN_KEY_LEN 48

/* One distinct sub-band shape: its extent along the plan's cut dims (f: the second, when
 * the patch is cut in a grid), its conv primitive and the two reorders around it. */
typedef struct dn_class {
    int64_t in_rows, out_rows, pre, post;
    int64_t in_f, out_f, pre_f, post_f;
    int fallback;                   /* oneDNN refused it or it reads no input: cpu_direct */
    dnnl_primitive_t conv, rin, rout;
    dnnl_memory_desc_t src_user, src, dst, dst_user, scratch, rin_scratch, rout_scratch;
    int64_t src_bytes, dst_bytes, scratch_bytes;
    char impl[32];
} dn_class;

typedef struct dn_sub {
    int64_t r0, r1, a;              /* output rows [r0, r1); first input row a (clipped) */
    int64_t f0, f1, fa;             /* the same along the second cut dim (0, its extent, 0: none) */
    int cls;
    int64_t src_off, dst_off;       /* workspace byte offsets of its blocked buffers */
} dn_sub;

struct cw__dnnl_plan {
    int64_t key[DN_KEY_LEN];
    uint64_t hash;
    struct cw__dnnl_plan *prev, *next; /* cache LRU list */
    int refs;                          /* the cache's + each holder's; guarded by cache_mu */
    int in_cache;                      /* on the LRU list; guarded by cache_mu */
    int built;                         /* its primitives made (else descriptors only) */
    int64_t bytes;                     /* what the cache charges for it (DN_CACHE_BYTES) */
    int hd;                            /* the dim its sub-bands cut (split_dim): H, or D */
    int fd, nf;                        /* the second dim cut (grid_cut; 0: none) and its pieces */
    dnnl_data_type_t dt;               /* x, w, bias and y */
    size_t es;                         /* bytes per element */
    int64_t xs_h, ys_h;                /* x's and y's strides along hd, elements */
    int64_t xs_f, ys_f;                /* ... and along fd */
    int nsub, ncls, nslot, main_cls;
    dn_sub sub[DN_MAX_SUB];
    dn_class *cls;                     /* ncls of them */
    dnnl_primitive_t rw;               /* weights reorder (NULL when every sub-band falls back) */
    dnnl_memory_desc_t w_user, w, bias, w_scratch;
    int has_bias;
    int64_t w_off, w_bytes, scratch_off, slot_bytes, ws;
    double flops;
};

/* ---- engine, OpenMP ICV, cache ------------------------------------------------------- */
static pthread_once_t eng_once = PTHREAD_ONCE_INIT;
static dnnl_engine_t g_eng;
static dnnl_status_t g_eng_st = dnnl_runtime_error;

static void eng_init(void) { g_eng_st = dnnl_engine_create(&g_eng, dnnl_cpu, 0); }

/* oneDNN's OpenMP runtime reads the calling thread's max-threads ICV when a primitive is
 * created (its blocking) and run (its split): 1 on every thread that calls it. */
static int omp_single(void) {
    int old = omp_get_max_threads();
    if (old != 1) omp_set_num_threads(1);
    return old;
}
static void omp_restore(int old) {
    if (old != 1) omp_set_num_threads(old);
}

/* The largest max-threads ICV oneDNN could have seen (tests assert 1): one atomic per
 * primitive creation or sub-band. */
static _Atomic int g_threads_seen;
static void note_threads(void) {
    int n = omp_get_max_threads(), seen = atomic_load(&g_threads_seen);
    while (n > seen && !atomic_compare_exchange_weak(&g_threads_seen, &seen, n)) {
    }
}
int cw__cpu_dnnl_threads_seen(void) { return atomic_load(&g_threads_seen); }

/* What oneDNN made (cw__cpu_dnnl_stats): primitive descriptors, primitives, built plans,
 * built plans alive. */
static _Atomic int64_t g_pds, g_prims, g_built, g_live;

static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
static cw__dnnl_plan *cache_head, *cache_tail;
static int cache_n;
static int64_t cache_bytes, idle_bytes; /* of the plans on the list; of those only it holds */

int cw__cpu_dnnl_compiled(void) { return 1; }

int cw__cpu_dnnl_sgemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                       int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
    int old = omp_single();
    note_threads();
    dnnl_status_t st =
        dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    omp_restore(old);
    return st == dnnl_success;
}

static void plan_destroy(cw__dnnl_plan *pl) {
    if (!pl) return;
    if (pl->built) atomic_fetch_sub(&g_live, 1);
    for (int c = 0; c < pl->ncls; c++) {
        if (pl->cls[c].conv) dnnl_primitive_destroy(pl->cls[c].conv);
        if (pl->cls[c].rin) dnnl_primitive_destroy(pl->cls[c].rin);
        if (pl->cls[c].rout) dnnl_primitive_destroy(pl->cls[c].rout);
    }
    if (pl->rw) dnnl_primitive_destroy(pl->rw);
    cw__free(pl->cls);
    cw__free(pl);
}

/* Takes q off the LRU list (cache_mu held). */
static void cache_unlink(cw__dnnl_plan *q) {
    if (q->prev) q->prev->next = q->next;
    else cache_head = q->next;
    if (q->next) q->next->prev = q->prev;
    else cache_tail = q->prev;
    q->prev = q->next = NULL;
    q->in_cache = 0;
    cache_n--;
    cache_bytes -= q->bytes;
}

/* Evicts plans only the cache holds, least recently used first, until their bytes are at
 * most cap (cache_mu held); returns them chained by next, to destroy outside the lock. */
static cw__dnnl_plan *cache_evict_idle(int64_t cap) {
    cw__dnnl_plan *dead = NULL, *q = cache_tail;
    while (q && idle_bytes > cap) {
        cw__dnnl_plan *prev = q->prev;
        if (q->refs == 1) {
            cache_unlink(q);
            idle_bytes -= q->bytes;
            q->refs = 0;
            q->next = dead;
            dead = q;
        }
        q = prev;
    }
    return dead;
}

static void destroy_chain(cw__dnnl_plan *q) {
    while (q) {
        cw__dnnl_plan *next = q->next;
        plan_destroy(q);
        q = next;
    }
}

void cw__cpu_dnnl_release(cw__dnnl_plan *pl) {
    if (!pl) return;
    cw__dnnl_plan *dead = NULL;
    pthread_mutex_lock(&cache_mu);
    int last = --pl->refs == 0;
    if (pl->refs == 1 && pl->in_cache) { /* the cache's alone now */
        idle_bytes += pl->bytes;
        dead = cache_evict_idle(DN_CACHE_BYTES);
    }
    pthread_mutex_unlock(&cache_mu);
    destroy_chain(dead);
    if (last) plan_destroy(pl);
}

static void cost_drop(void);

void cw__cpu_dnnl_trim(void) {
    pthread_mutex_lock(&cache_mu);
    cw__dnnl_plan *dead = cache_evict_idle(0);
    pthread_mutex_unlock(&cache_mu);
    cost_drop();
    destroy_chain(dead);
    /* oneDNN keeps every primitive it made in its own cache (1024 by default): empty it */
    int cap = 0;
    if (dnnl_get_primitive_cache_capacity(&cap) == dnnl_success && cap > 0) {
        dnnl_set_primitive_cache_capacity(0);
        dnnl_set_primitive_cache_capacity(cap);
    }
    cw__host_trim();
}

/* ---- the key: everything but the data pointers ----------------------------------------- */
static void full_strides(const cw_tensor_desc *d, int64_t *st) {
    int any = 0;
    for (int i = 0; i < d->rank; i++) any |= d->strides[i] != 0;
    int64_t s = 1;
    for (int i = d->rank - 1; i >= 0; i--) {
        st[i] = any ? d->strides[i] : s;
        s *= d->dims[i];
    }
}

static void make_key(const cw__conv_problem *p, int64_t *k) {
    memset(k, 0, DN_KEY_LEN * sizeof *k);
    int n = 0;
    k[n++] = p->spatial * 16 + (int64_t)p->x.dtype; /* both small: one slot */
    k[n++] = p->groups;
    k[n++] = p->has_bias;
    const cw_tensor_desc *t[3] = {&p->x, &p->w, &p->y};
    for (int i = 0; i < 3; i++) {
        int64_t st[CW_MAX_RANK];
        full_strides(t[i], st);
        for (int j = 0; j < 5; j++) k[n + j] = j < t[i]->rank ? t[i]->dims[j] : 0;
        for (int j = 0; j < 5; j++) k[n + 5 + j] = j < t[i]->rank ? st[j] : 0;
        n += 10;
    }
    for (int j = 0; j < 3; j++) {
        k[n++] = p->stride[j];
        k[n++] = p->dilation[j];
        k[n++] = p->pad_pre[j];
        k[n++] = p->pad_post[j];
    }
}

static uint64_t key_hash(const int64_t *k) {
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < DN_KEY_LEN; i++) h = (h ^ (uint64_t)k[i]) * 1099511628211ull;
    return h;
}

int cw__cpu_dnnl_hold(cw__dnnl_plan *pl, const cw__conv_problem *p) {
    int64_t key[DN_KEY_LEN];
    make_key(p, key);
    if (memcmp(pl->key, key, sizeof key) != 0) return 0;
    pthread_mutex_lock(&cache_mu);
    if (pl->refs == 1 && pl->in_cache) idle_bytes -= pl->bytes;
    pl->refs++;
    pthread_mutex_unlock(&cache_mu);
    return 1;
}

/* ---- sub-bands: a function of the patch's shape only ----------------------------------- */
/* Sub-bands of ~8 MFLOP at least (~0.2 ms on one core, so oneDNN's per-call cost stays
 * under 1 %), at most DN_MAX_SUB: enough to spread over 16 threads. Each sub-band reorders
 * its halo input rows again (in_row_bytes each): at most 4 halo rows of output per halo
 * row (input read twice under ~25 %), fewer where the conv's work per row dwarfs the copy
 * -- at cost_dnnl's ~0.1 ns per byte moved (read and written: 0.2) against ~48 GFLOP/s,
 * the copy stays under 5 % of the sub-band's time from halo x in_row_bytes x 192 /
 * flops_per_row rows on. A 3x3x3 conv of 256 channels in two-row patches (HunyuanVideo
 * 64^2, 17 frames) then runs two one-row sub-bands, one per thread, not one sub-band on one
 * thread while the other waits (8 rows at least before). Frames (a D split, split_dim)
 * keep the 4 x halo minimum: each sub-band's blocked input holds its halo frames again, and
 * that is workspace the planner's share pays for. In one-frame sub-bands a two-row patch
 * of HunyuanVideo's 128-channel conv needed 9.3 MiB, not 6.4, and the planner fell to
 * cpu_direct under its share. */
static int sub_count(int64_t rows, int64_t halo, double flops_per_row, double in_row_bytes, int frames) {
    const double cap = 4.0 * (double)halo; /* the input read twice under ~25 % */
    const double by_copy =
        flops_per_row > 0 && !frames ? ceil((double)halo * in_row_bytes * 192.0 / flops_per_row) : cap;
    int64_t min_rows = (int64_t)fmax(1.0, fmin(cap, by_copy));
    int64_t by_flops = flops_per_row > 0 ? (int64_t)ceil(8e6 / flops_per_row) : rows;
    if (by_flops > min_rows) min_rows = by_flops;
    int64_t n = rows / (min_rows > 0 ? min_rows : 1);
    if (n > DN_MAX_SUB) n = DN_MAX_SUB;
    if (n < 1) n = 1;
    return (int)n;
}

/* Runs a oneDNN call; on failure records it in ctx's error as st and jumps to the
 * function's fail label (every user has ctx, st and fail). */
#define DN_TRY(call, what)                                                                              \
    do {                                                                                                \
        dnnl_status_t s_ = (call);                                                                      \
        if (s_ != dnnl_success) {                                                                       \
            st = cw__error(ctx, CW_ERR_BACKEND, "cpu dnnl: %s: %s failed: %s", what, #call, dnnl_status2str(s_)); \
            goto fail;                                                                                  \
        }                                                                                               \
    } while (0)

static int64_t align_up(int64_t v) { return (v + DN_ALIGN - 1) / DN_ALIGN * DN_ALIGN; }

static dnnl_data_type_t dn_dtype(cw_dtype dt) { return dt == CW_F16 ? dnnl_f16 : dt == CW_BF16 ? dnnl_bf16 : dnnl_f32; }

/* x's or y's view as oneDNN sees it, with the extent along hd replaced by rows and, when
 * fd is not 0, the extent along fd by frames. */
static dnnl_status_t view_md(dnnl_memory_desc_t *md, const cw_tensor_desc *d, int hd, int64_t rows, int fd,
                             int64_t frames) {
    dnnl_dims_t dims, st;
    int64_t sts[CW_MAX_RANK];
    full_strides(d, sts);
    for (int i = 0; i < d->rank; i++) dims[i] = d->dims[i], st[i] = sts[i];
    dims[hd] = rows;
    if (fd) dims[fd] = frames;
    return dnnl_memory_desc_init_by_strides(md, d->rank, dims, dn_dtype(d->dtype), st);
}

/* Makes a primitive from pd (its JIT code and buffers: heap and mappings) and counts it. */
static dnnl_status_t prim_create(dnnl_primitive_t *out, const_dnnl_primitive_desc_t pd) {
    dnnl_status_t s = dnnl_primitive_create(out, pd);
    if (s == dnnl_success) atomic_fetch_add(&g_prims, 1);
    return s;
}

/* The reorder from -> to: its scratchpad's layout, and with build its primitive. */
static dnnl_status_t make_reorder(dnnl_primitive_t *out, const dnnl_memory_desc_t *from, const dnnl_memory_desc_t *to,
                                  const_dnnl_primitive_attr_t attr, dnnl_memory_desc_t *scratch, int build) {
    dnnl_primitive_desc_t pd;
    dnnl_status_t s = dnnl_reorder_primitive_desc_create(&pd, from, g_eng, to, g_eng, attr);
    if (s != dnnl_success) return s;
    atomic_fetch_add(&g_pds, 1);
    *scratch = *dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    s = build ? prim_create(out, pd) : dnnl_success;
    dnnl_primitive_desc_destroy(pd);
    return s;
}

static int64_t md_bytes(const dnnl_memory_desc_t *md) { return (int64_t)dnnl_memory_desc_get_size(md); }

/* Makes class c's conv primitive. wfix: the weights layout every class shares (NULL: any,
 * and *w_chosen gets what oneDNN chose). dnnl_unimplemented: oneDNN has no kernel, and the
 * class falls back. */
static dnnl_status_t class_conv(const cw__conv_problem *p, int hd, int fd, dn_class *c, const dnnl_memory_desc_t *wfix,
                                dnnl_memory_desc_t *w_chosen, const_dnnl_primitive_attr_t attr, int build) {
    const int sp = p->spatial, rank = sp + 2;
    dnnl_dims_t sd, dd, wd, bd, strd, dil, pl, pr;
    for (int i = 0; i < rank; i++) sd[i] = p->x.dims[i], dd[i] = p->y.dims[i];
    sd[hd] = c->in_rows;
    dd[hd] = c->out_rows;
    const int64_t G = p->groups;
    int wr = 0;
    if (G > 1) wd[wr++] = G;
    wd[wr++] = p->w.dims[0] / G;
    for (int i = 1; i < rank; i++) wd[wr++] = p->w.dims[i];
    bd[0] = p->y.dims[1];
    for (int i = 0; i < sp; i++) {
        strd[i] = p->stride[i];
        dil[i] = p->dilation[i] - 1; /* oneDNN counts dilation from 0 */
        pl[i] = p->pad_pre[i];
        pr[i] = p->pad_post[i];
    }
    pl[hd - 2] = c->pre;
    pr[hd - 2] = c->post;
    if (fd) {
        sd[fd] = c->in_f;
        dd[fd] = c->out_f;
        pl[fd - 2] = c->pre_f;
        pr[fd - 2] = c->post_f;
    }
    dnnl_memory_desc_t smd, wmd, bmd, dmd;
    dnnl_status_t s;
    const dnnl_data_type_t dt = dn_dtype(p->x.dtype);
    if ((s = dnnl_memory_desc_init_by_tag(&smd, rank, sd, dt, dnnl_format_tag_any)) != dnnl_success) return s;
    if ((s = dnnl_memory_desc_init_by_tag(&dmd, rank, dd, dt, dnnl_format_tag_any)) != dnnl_success) return s;
    if (wfix) wmd = *wfix;
    else if ((s = dnnl_memory_desc_init_by_tag(&wmd, wr, wd, dt, dnnl_format_tag_any)) != dnnl_success) return s;
    if ((s = dnnl_memory_desc_init_by_tag(&bmd, 1, bd, dt, dnnl_x)) != dnnl_success) return s;
    dnnl_convolution_desc_t cd;
    s = dnnl_dilated_convolution_forward_desc_init(&cd, dnnl_forward_inference, dnnl_convolution_direct, &smd, &wmd,
                                                   p->has_bias ? &bmd : NULL, &dmd, strd, dil, pl, pr);
    if (s != dnnl_success) return s;
    dnnl_primitive_desc_t pd;
    if ((s = dnnl_primitive_desc_create(&pd, &cd, attr, g_eng, NULL)) != dnnl_success) return s;
    atomic_fetch_add(&g_pds, 1);
    const char *impl = "";
    dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
    snprintf(c->impl, sizeof c->impl, "%s", impl);
    /* bf16 on a native-bf16 ISA (the kernels named *_bf16, an Intel Xeon host): oneDNN 2.6's
     * brgconv there crashed in test_conv_property (a NULL read inside the kernel) on several
     * random shapes, among them a 3-D conv of kernel depth 1 padded past it and a 7-wide
     * kernel over 6 columns. The class falls back to cpu_direct; elsewhere bf16 runs oneDNN's
     * emulating kernels, which ran every case. */
    if (p->x.dtype == CW_BF16 && strstr(impl, "_bf16")) {
        dnnl_primitive_desc_destroy(pd);
        return dnnl_unimplemented;
    }
    c->src = *dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0);
    c->dst = *dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0);
    c->scratch = *dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    if (w_chosen) *w_chosen = *dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    s = build ? prim_create(&c->conv, pd) : dnnl_success;
    dnnl_primitive_desc_destroy(pd);
    return s;
}

/* Fills in how the plan sees x and y: the dim its sub-bands cut, dtype, element size and
 * the strides along that dim. */
static void plan_views(const cw__conv_problem *p, int hd, int fd, int nf, cw__dnnl_plan *pl) {
    pl->hd = hd;
    pl->fd = fd;
    pl->nf = fd ? nf : 1;
    pl->dt = dn_dtype(p->x.dtype);
    pl->es = cw_dtype_size(p->x.dtype);
    pl->has_bias = p->has_bias;
    int64_t xst[CW_MAX_RANK], yst[CW_MAX_RANK];
    full_strides(&p->x, xst);
    full_strides(&p->y, yst);
    pl->xs_h = xst[hd];
    pl->ys_h = yst[hd];
    pl->xs_f = fd ? xst[fd] : 0;
    pl->ys_f = fd ? yst[fd] : 0;
}

/* Returns the FLOPs (multiply and add counted as 2) of one output row of p along dim hd. */
static double row_flops(const cw__conv_problem *p, int hd) {
    double per_row = 2.0 * (double)p->y.dims[0] * (double)p->y.dims[1] * (double)p->w.dims[1];
    for (int i = 2; i < p->spatial + 2; i++) per_row *= (double)p->w.dims[i] * (double)(i == hd ? 1 : p->y.dims[i]);
    return per_row;
}

/* How many sub-bands cutting p along dim hd gives (sub_count on that dim's halo). */
static int axis_subs(const cw__conv_problem *p, int hd) {
    const int64_t s = p->stride[hd - 2], eff = p->dilation[hd - 2] * (p->w.dims[hd] - 1) + 1;
    double in_row = (double)cw_dtype_size(p->x.dtype); /* bytes of one input row along hd */
    for (int i = 0; i < p->x.rank; i++) in_row *= i == hd ? 1.0 : (double)p->x.dims[i];
    const int64_t rows = p->y.dims[hd];
    return rows > 0 ? sub_count(rows, eff > s ? eff - s : 0, row_flops(p, hd), in_row, hd < p->spatial) : 0;
}

/* The dim a patch's sub-bands cut: H, or for a 3-D patch D where D gives more sub-bands.
 * A patch of one or two rows (a deep recompute's, HunyuanVideo's 3x3x3 convs at 44 MiB)
 * otherwise ran as one sub-band on one thread while the other waited; its frames split
 * across threads as rows do. A function of the shape alone, so the bits do not follow
 * the thread count (docs/determinism.md). */
static int split_dim(const cw__conv_problem *p) {
    const int h = p->spatial; /* H is dim 2 of NCHW, dim 3 of NCDHW */
    return p->spatial == 3 && axis_subs(p, h - 1) > axis_subs(p, h) ? h - 1 : h;
}

/* The second dim a patch's sub-bands cut, in nf pieces (*nf 1 and 0 returned: none). An odd
 * number n of sub-bands leaves threads idle at the patch's end: 5 one-row sub-bands take
 * 3 rounds on 2 threads, where 4 take 2, and one takes a thread while the others wait
 * (HunyuanVideo 64^2's 256->256 3x3x3 over 17 frames x 5 rows, 2 threads: 110-117 GFLOP/s,
 * 127-134 cut in 10). Such a count under DN_SLOTS is doubled by halving the patch along its other
 * outer dim (D beside H, H beside D, W in 2-D) where each half keeps its 8 MFLOP and 4 x
 * halo outputs (sub_count's cap). The halves' inputs both hold the halo, workspace the
 * planner's share pays for: halving 5 frames (9 input frames for 7) pushed HunyuanVideo's
 * 512-channel 16^2 patches at 44 MiB out of oneDNN into cpu_direct, 1.1x -> 1.9x its time;
 * 17 frames take 21 for 19. A function of the shape alone, like the count. */
static int grid_cut(const cw__conv_problem *p, int hd, int n, int *nf) {
    *nf = 1;
    const int sp = p->spatial;
    const int fd = sp == 3 ? (hd == 3 ? 2 : 3) : sp == 2 ? 3 : 0;
    if (!fd || n % 2 == 0 || n >= DN_SLOTS) return 0;
    const int64_t len = p->y.dims[fd], s = p->stride[fd - 2];
    const int64_t eff = p->dilation[fd - 2] * (p->w.dims[fd] - 1) + 1, halo = eff > s ? eff - s : 0;
    const double flops = row_flops(p, hd) * (double)p->y.dims[hd];
    if (len / 2 < (halo > 0 ? 4 * halo : 1) || flops / (2.0 * n) < 8e6) return 0;
    *nf = 2;
    return fd;
}

/* Returns the index of the class with c's shape in pl, or pl->ncls when there is none. */
static int find_class(const cw__dnnl_plan *pl, const dn_class *c) {
    int k = 0;
    while (k < pl->ncls && !(pl->cls[k].in_rows == c->in_rows && pl->cls[k].out_rows == c->out_rows &&
                             pl->cls[k].pre == c->pre && pl->cls[k].post == c->post &&
                             pl->cls[k].in_f == c->in_f && pl->cls[k].out_f == c->out_f &&
                             pl->cls[k].pre_f == c->pre_f && pl->cls[k].post_f == c->post_f))
        k++;
    return k;
}

/* Piece j of n along dim d of p: output [*o0, *o1), first input *a (clipped to x), input
 * extent *in, and the padding before and after it (DESIGN.md's halo formula). */
static void cut_piece(const cw__conv_problem *p, int d, int64_t j, int64_t n, int64_t *o0, int64_t *o1, int64_t *a,
                      int64_t *in, int64_t *pre, int64_t *post) {
    const int64_t len = p->y.dims[d], x_len = p->x.dims[d];
    const int64_t s = p->stride[d - 2], pad = p->pad_pre[d - 2];
    const int64_t eff = p->dilation[d - 2] * (p->w.dims[d] - 1) + 1;
    *o0 = len * j / n;
    *o1 = len * (j + 1) / n;
    const int64_t i0 = *o0 * s - pad, i1 = (*o1 - 1) * s - pad + eff;
    int64_t lo = i0 > 0 ? i0 : 0, hi = i1 < x_len ? i1 : x_len;
    if (hi < lo) hi = lo;
    *a = lo;
    *in = hi - lo;
    *pre = lo - i0;
    *post = i1 - hi;
}

/* Cuts the patch's output rows along pl->hd into pl->nsub sub-bands -- along pl->fd too
 * when the patch is cut in a grid, rows outer -- and gives each the class of its shape.
 * Fails only when the shapes outnumber DN_MAX_CLASS or host memory runs out. */
static cw_status plan_subbands(cw_context *ctx, const cw__conv_problem *p, cw__dnnl_plan *pl) {
    const int nh = axis_subs(p, pl->hd), nf = pl->nf;
    pl->nsub = nh * nf;
    pl->ncls = 0;
    if (pl->nsub > DN_MAX_SUB)
        return cw__error(ctx, CW_ERR_BACKEND, "cpu dnnl: %d sub-bands in one patch (at most %d)", pl->nsub,
                         DN_MAX_SUB);
    if (!pl->cls && !(pl->cls = cw__calloc(DN_MAX_CLASS, sizeof *pl->cls)))
        return cw__error(ctx, CW_ERR_OUT_OF_MEMORY, "cpu dnnl: out of host memory for a plan's sub-bands");
    for (int j = 0; j < pl->nsub; j++) {
        dn_sub *sb = &pl->sub[j];
        dn_class c;
        memset(&c, 0, sizeof c);
        cut_piece(p, pl->hd, j / nf, nh, &sb->r0, &sb->r1, &sb->a, &c.in_rows, &c.pre, &c.post);
        c.out_rows = sb->r1 - sb->r0;
        sb->f0 = sb->fa = 0;
        sb->f1 = pl->fd ? p->y.dims[pl->fd] : 0;
        if (pl->fd) {
            cut_piece(p, pl->fd, j % nf, nf, &sb->f0, &sb->f1, &sb->fa, &c.in_f, &c.pre_f, &c.post_f);
            c.out_f = sb->f1 - sb->f0;
        }
        int k = find_class(pl, &c);
        if (k == pl->ncls) {
            if (pl->ncls == DN_MAX_CLASS)
                return cw__error(ctx, CW_ERR_BACKEND, "cpu dnnl: more than %d sub-band shapes in one patch",
                                 DN_MAX_CLASS);
            pl->cls[pl->ncls++] = c;
        }
        sb->cls = k;
    }
    dn_class *fit = pl->ncls ? cw__realloc(pl->cls, (size_t)pl->ncls * sizeof *pl->cls) : NULL;
    if (fit) pl->cls = fit; /* a plan lives on in the cache: only the classes it has */
    return CW_OK;
}

/* Makes class c's convolution and the reorders around it, and sizes its buffers. wfix is
 * the shared weights layout: taken as given when *have_w, else chosen here (and *have_w
 * set). A class oneDNN refuses (no kernel, or arguments it rejects) or one that reads
 * no input falls back to cpu_direct. */
static cw_status class_make(cw_context *ctx, const cw__conv_problem *p, int hd, int fd, dn_class *c,
                            const_dnnl_primitive_attr_t attr, dnnl_memory_desc_t *wfix, int *have_w, int build) {
    cw_status st = CW_OK;
    if (c->in_rows == 0 || (fd && c->in_f == 0)) { /* pure padding: bias only */
        c->fallback = 1;
        return CW_OK;
    }
    dnnl_status_t s = class_conv(p, hd, fd, c, *have_w ? wfix : NULL, *have_w ? NULL : wfix, attr, build);
    if (s == dnnl_unimplemented || s == dnnl_invalid_arguments) {
        c->fallback = 1;
        if (c->conv) dnnl_primitive_destroy(c->conv), c->conv = NULL;
        return CW_OK;
    }
    DN_TRY(s, "convolution primitive");
    *have_w = 1;
    DN_TRY(view_md(&c->src_user, &p->x, hd, c->in_rows, fd, c->in_f), "input view");
    DN_TRY(view_md(&c->dst_user, &p->y, hd, c->out_rows, fd, c->out_f), "output view");
    DN_TRY(make_reorder(&c->rin, &c->src_user, &c->src, attr, &c->rin_scratch, build), "input reorder");
    DN_TRY(make_reorder(&c->rout, &c->dst, &c->dst_user, attr, &c->rout_scratch, build), "output reorder");
    c->src_bytes = align_up(md_bytes(&c->src));
    c->dst_bytes = align_up(md_bytes(&c->dst));
    int64_t sc = md_bytes(&c->scratch);
    if (md_bytes(&c->rin_scratch) > sc) sc = md_bytes(&c->rin_scratch);
    if (md_bytes(&c->rout_scratch) > sc) sc = md_bytes(&c->rout_scratch);
    c->scratch_bytes = align_up(sc);
fail:
    return st;
}

/* Makes every class, the main class first: it picks the weights layout (*wfix) and the
 * others take it as given. *have_w stays 0 when every class falls back. */
static cw_status plan_classes(cw_context *ctx, const cw__conv_problem *p, cw__dnnl_plan *pl,
                              const_dnnl_primitive_attr_t attr, dnnl_memory_desc_t *wfix, int *have_w, int build) {
    for (int pass = 0; pass < 2; pass++) {
        for (int k = 0; k < pl->ncls; k++) {
            if ((pass == 0) != (k == pl->main_cls)) continue;
            CW_TRY(class_make(ctx, p, pl->hd, pl->fd, &pl->cls[k], attr, wfix, have_w, build));
        }
    }
    return CW_OK;
}

/* Makes the weights reorder: the user's [K, C/G, k...] (as [G, K/G, C/G, k...] when
 * grouped) into wfix; and the bias's memory desc. */
static cw_status plan_weights(cw_context *ctx, const cw__conv_problem *p, cw__dnnl_plan *pl,
                              const_dnnl_primitive_attr_t attr, const dnnl_memory_desc_t *wfix, int build) {
    cw_status st = CW_OK;
    dnnl_dims_t wd, ws;
    int64_t wst[CW_MAX_RANK];
    full_strides(&p->w, wst);
    const int64_t G = p->groups;
    int wr = 0;
    if (G > 1) wd[wr] = G, ws[wr] = wst[0] * (p->w.dims[0] / G), wr++;
    wd[wr] = p->w.dims[0] / G, ws[wr] = wst[0], wr++;
    for (int i = 1; i < p->spatial + 2; i++) wd[wr] = p->w.dims[i], ws[wr] = wst[i], wr++;
    DN_TRY(dnnl_memory_desc_init_by_strides(&pl->w_user, wr, wd, pl->dt, ws), "weights view");
    pl->w = *wfix;
    DN_TRY(make_reorder(&pl->rw, &pl->w_user, &pl->w, attr, &pl->w_scratch, build), "weights reorder");
    dnnl_dims_t bd = {p->y.dims[1]};
    DN_TRY(dnnl_memory_desc_init_by_tag(&pl->bias, 1, bd, pl->dt, dnnl_x), "bias");
fail:
    return st;
}

/* Lays out the workspace: weights | each sub-band's blocked input and output | one
 * scratchpad slot per thread, every region on a DN_ALIGN-byte boundary. */
static void plan_workspace(cw__dnnl_plan *pl) {
    int64_t off = 0, slot = align_up(md_bytes(&pl->w_scratch));
    pl->w_off = off;
    pl->w_bytes = align_up(md_bytes(&pl->w));
    off += pl->w_bytes;
    for (int j = 0; j < pl->nsub; j++) {
        dn_class *c = &pl->cls[pl->sub[j].cls];
        if (c->fallback) continue;
        pl->sub[j].src_off = off;
        off += c->src_bytes;
        pl->sub[j].dst_off = off;
        off += c->dst_bytes;
        if (c->scratch_bytes > slot) slot = c->scratch_bytes;
    }
    pl->slot_bytes = slot;
    pl->nslot = pl->nsub < DN_SLOTS ? pl->nsub : DN_SLOTS;
    pl->scratch_off = off;
    off += slot * pl->nslot;
    pl->ws = off;
}

/* Builds the plan for p (no cache): with build its primitives, without only their
 * descriptors (layouts, scratchpads, kernel names: what cw__cpu_dnnl_info reads; such a
 * plan cannot run). Errors are host OOM or oneDNN failures other than "no kernel for this
 * shape" (which makes sub-bands fall back to cpu_direct). Every descriptor and primitive
 * is created with the calling thread's OpenMP ICV at 1 (see omp_single). */
static cw_status plan_make(cw_context *ctx, const cw__conv_problem *p, int build, cw__dnnl_plan **out) {
    cw_status st = CW_OK;
    dnnl_primitive_attr_t attr = NULL;
    cw__dnnl_plan *pl = cw__calloc(1, sizeof *pl);
    if (!pl) return cw__error(ctx, CW_ERR_OUT_OF_MEMORY, "cpu dnnl: out of host memory for a plan");
    const int omp_old = omp_single();
    note_threads();
    pthread_once(&eng_once, eng_init);
    if (g_eng_st != dnnl_success) {
        st = cw__error(ctx, CW_ERR_BACKEND, "cpu dnnl: dnnl_engine_create(cpu) failed: %s", dnnl_status2str(g_eng_st));
        goto fail;
    }
    DN_TRY(dnnl_primitive_attr_create(&attr), "attributes");
    DN_TRY(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user), "attributes");

    const int hd = split_dim(p);
    int nf = 1;
    const int fd = grid_cut(p, hd, axis_subs(p, hd), &nf);
    plan_views(p, hd, fd, nf, pl);
    pl->flops = row_flops(p, pl->hd) * (double)p->y.dims[pl->hd];
    if ((st = plan_subbands(ctx, p, pl)) != CW_OK) goto fail;
    if (pl->nsub == 0) goto done;
    pl->main_cls = pl->sub[pl->nsub / 2].cls;

    dnnl_memory_desc_t wfix;
    memset(&wfix, 0, sizeof wfix);
    int have_w = 0;
    if ((st = plan_classes(ctx, p, pl, attr, &wfix, &have_w, build)) != CW_OK) goto fail;
    if (!have_w) goto done; /* every sub-band falls back: no workspace */
    if ((st = plan_weights(ctx, p, pl, attr, &wfix, build)) != CW_OK) goto fail;
    plan_workspace(pl);

done:
    dnnl_primitive_attr_destroy(attr);
    omp_restore(omp_old);
    *out = pl;
    return CW_OK;
fail:
    if (attr) dnnl_primitive_attr_destroy(attr);
    omp_restore(omp_old);
    plan_destroy(pl);
    *out = NULL;
    return st;
}

cw_status cw__cpu_dnnl_plan_get(cw_context *ctx, const cw__conv_problem *p, cw__dnnl_plan **out) {
    *out = NULL;
    int64_t key[DN_KEY_LEN];
    make_key(p, key);
    uint64_t h = key_hash(key);
    pthread_mutex_lock(&cache_mu);
    for (cw__dnnl_plan *q = cache_head; q; q = q->next) {
        if (q->hash != h || memcmp(q->key, key, sizeof key) != 0) continue;
        if (q != cache_head) { /* most recently used first */
            q->prev->next = q->next;
            if (q->next) q->next->prev = q->prev;
            else cache_tail = q->prev;
            q->prev = NULL;
            q->next = cache_head;
            cache_head->prev = q;
            cache_head = q;
        }
        if (q->refs == 1) idle_bytes -= q->bytes;
        q->refs++;
        pthread_mutex_unlock(&cache_mu);
        *out = q;
        return CW_OK;
    }
    pthread_mutex_unlock(&cache_mu);

    /* made outside the lock (JIT takes ~0.3 ms a primitive); a racing maker of the same
     * key only adds a duplicate that ages out */
    cw__dnnl_plan *pl;
    CW_TRY(plan_make(ctx, p, 1, &pl));
    pl->built = 1;
    atomic_fetch_add(&g_built, 1);
    atomic_fetch_add(&g_live, 1);
    int nprims = pl->rw != NULL;
    for (int c = 0; c < pl->ncls; c++)
        nprims += (pl->cls[c].conv != NULL) + (pl->cls[c].rin != NULL) + (pl->cls[c].rout != NULL);
    pl->bytes = (int64_t)(sizeof *pl + (size_t)pl->ncls * sizeof *pl->cls) + nprims * DN_PRIM_BYTES;
    memcpy(pl->key, key, sizeof key);
    pl->hash = h;
    pl->refs = 2; /* the cache's and the caller's */
    pl->in_cache = 1;
    pthread_mutex_lock(&cache_mu);
    pl->next = cache_head;
    if (cache_head) cache_head->prev = pl;
    cache_head = pl;
    if (!cache_tail) cache_tail = pl;
    cache_n++;
    cache_bytes += pl->bytes;
    pthread_mutex_unlock(&cache_mu);
    *out = pl;
    return CW_OK;
}

/* ---- costs: what a descriptor-only plan says, per problem key --------------------------- */
/* The memory ladder builds a plan per recompute step and the budget search several per step,
 * each costing every patch again: for the SD decoder at 512^2, 102 plans of ~150 patches, a
 * few hundred distinct problems. Each costing makes oneDNN primitive descriptors (~0.25 ms);
 * uncached they took 3.5 s of a 13.5 s first decode. At most DN_COST_CAP entries (~460 B
 * each) are kept: the whole table goes when it is full, and with cw__cpu_dnnl_trim. */
#define DN_COST_CAP 2048
#define DN_COST_BUCKETS 512
typedef struct dn_cost {
    struct dn_cost *next;
    uint64_t hash;
    int64_t key[DN_KEY_LEN];
    cw__dnnl_info info;
    int listed;
} dn_cost;
static pthread_mutex_t cost_mu = PTHREAD_MUTEX_INITIALIZER;
static dn_cost *cost_bucket[DN_COST_BUCKETS];
static int cost_n;

static dn_cost *cost_find(const int64_t *key, uint64_t h) { /* under cost_mu */
    for (dn_cost *c = cost_bucket[h % DN_COST_BUCKETS]; c; c = c->next)
        if (c->hash == h && memcmp(c->key, key, sizeof c->key) == 0) return c;
    return NULL;
}

static void cost_clear(void) { /* under cost_mu */
    for (int b = 0; b < DN_COST_BUCKETS; b++)
        for (dn_cost *c = cost_bucket[b], *nx; c; c = nx) nx = c->next, cw__free(c);
    memset(cost_bucket, 0, sizeof cost_bucket);
    cost_n = 0;
}

static void cost_drop(void) {
    pthread_mutex_lock(&cost_mu);
    cost_clear();
    pthread_mutex_unlock(&cost_mu);
}

cw_status cw__cpu_dnnl_cost(cw_context *ctx, const cw__conv_problem *p, cw__dnnl_info *info, int *listed) {
    int64_t key[DN_KEY_LEN];
    make_key(p, key);
    const uint64_t h = key_hash(key);
    pthread_mutex_lock(&cost_mu);
    const dn_cost *hit = cost_find(key, h);
    if (hit) *info = hit->info, *listed = hit->listed;
    pthread_mutex_unlock(&cost_mu);
    if (hit) return CW_OK;
    cw__dnnl_plan *pl;
    memset(info, 0, sizeof *info);
    *listed = 0;
    CW_TRY(plan_make(ctx, p, 0, &pl));
    *listed = cw__cpu_dnnl_info(pl, info);
    plan_destroy(pl);
    dn_cost *c = cw__malloc(sizeof *c); /* none: the next costing makes it again */
    if (!c) return CW_OK;
    c->hash = h, c->info = *info, c->listed = *listed;
    memcpy(c->key, key, sizeof key);
    pthread_mutex_lock(&cost_mu);
    if (cost_find(key, h)) { /* a racing costing of the same problem got there first */
        cw__free(c);
    } else {
        if (cost_n >= DN_COST_CAP) cost_clear();
        c->next = cost_bucket[h % DN_COST_BUCKETS];
        cost_bucket[h % DN_COST_BUCKETS] = c;
        cost_n++;
    }
    pthread_mutex_unlock(&cost_mu);
    return CW_OK;
}

void cw__cpu_dnnl_stats(cw__dnnl_stats *s) {
    memset(s, 0, sizeof *s);
    s->pds = atomic_load(&g_pds);
    s->primitives = atomic_load(&g_prims);
    s->plans_built = atomic_load(&g_built);
    s->live_plans = atomic_load(&g_live);
    pthread_mutex_lock(&cache_mu);
    s->cache_plans = cache_n;
    s->cache_bytes = cache_bytes;
    s->idle_bytes = idle_bytes;
    pthread_mutex_unlock(&cache_mu);
    pthread_mutex_lock(&cost_mu);
    s->cost_entries = cost_n;
    pthread_mutex_unlock(&cost_mu);
}

int cw__cpu_dnnl_info(const cw__dnnl_plan *pl, cw__dnnl_info *info) {
    memset(info, 0, sizeof *info);
    info->workspace = pl->ws;
    info->flops = pl->flops;
    info->subbands = pl->nsub;
    if (pl->nsub == 0) return 0;
    const dn_class *c = &pl->cls[pl->main_cls];
    if (c->fallback) return 0;
    snprintf(info->impl, sizeof info->impl, "%s", c->impl);
    info->moved_bytes = pl->ws - pl->slot_bytes * pl->nslot; /* reordered weights, inputs, outputs */
    return strncmp(c->impl, "ref", 3) != 0; /* listed when a real kernel runs the bulk */
}

/* ---- running --------------------------------------------------------------------------- */
typedef struct run_arg {
    const cw__dnnl_plan *pl;
    const cw__conv_problem *p;
    const char *x, *w, *b; /* elements of pl->es bytes */
    char *y;
    char *ws;
    _Atomic int next_slot;
    _Atomic int failed;
    char msg[160];
} run_arg;

static void run_fail(run_arg *r, const char *what, dnnl_status_t s) {
    int expect = 0;
    if (atomic_compare_exchange_strong(&r->failed, &expect, 1))
        snprintf(r->msg, sizeof r->msg, "cpu dnnl: %s failed: %s", what, dnnl_status2str(s));
}

static dnnl_status_t exec(dnnl_primitive_t prim, dnnl_stream_t strm, int n, const dnnl_exec_arg_t *args) {
    dnnl_status_t s = dnnl_primitive_execute(prim, strm, n, args);
    return s == dnnl_success ? dnnl_stream_wait(strm) : s;
}

/* Where sub-band sb's input view starts in x, and its output view in y. */
static const char *sub_x(const run_arg *r, const dn_sub *sb) {
    return r->x + (sb->a * r->pl->xs_h + sb->fa * r->pl->xs_f) * (int64_t)r->pl->es;
}
static char *sub_y(const run_arg *r, const dn_sub *sb) {
    return r->y + (sb->r0 * r->pl->ys_h + sb->f0 * r->pl->ys_f) * (int64_t)r->pl->es;
}

/* Sub-band j on this thread: reorder in, convolve, reorder out; or cpu_direct. */
static dnnl_status_t run_sub(run_arg *r, int j, dnnl_stream_t strm, char *scratch, const char **what) {
    const cw__dnnl_plan *pl = r->pl;
    const dn_sub *sb = &pl->sub[j];
    const dn_class *c = &pl->cls[sb->cls];
    if (c->fallback) {
        cw__conv_problem q = *r->p;
        const int hd = pl->hd;
        int64_t st[CW_MAX_RANK];
        full_strides(&r->p->x, st);
        memcpy(q.x.strides, st, sizeof st);
        full_strides(&r->p->y, st);
        memcpy(q.y.strides, st, sizeof st);
        full_strides(&r->p->w, st);
        memcpy(q.w.strides, st, sizeof st);
        q.x.dims[hd] = c->in_rows;
        q.y.dims[hd] = c->out_rows;
        q.pad_pre[hd - 2] = c->pre;
        q.pad_post[hd - 2] = c->post;
        if (pl->fd) {
            q.x.dims[pl->fd] = c->in_f;
            q.y.dims[pl->fd] = c->out_f;
            q.pad_pre[pl->fd - 2] = c->pre_f;
            q.pad_post[pl->fd - 2] = c->post_f;
        }
        cw__cpu_conv_direct(&q, sub_x(r, sb), r->w, r->b, sub_y(r, sb), 1);
        return dnnl_success;
    }
    /* m: user input, blocked input, weights, bias, blocked output, user output, and one
     * scratchpad memory per primitive, all on this thread's slot (used one after another) */
    dnnl_memory_t m[9] = {0};
    dnnl_status_t s = dnnl_success;
    const struct {
        const dnnl_memory_desc_t *md;
        void *h;
    } mk[9] = {{&c->src_user, (void *)sub_x(r, sb)},
               {&c->src, r->ws + sb->src_off},
               {&pl->w, r->ws + pl->w_off},
               {&pl->bias, (void *)r->b},
               {&c->dst, r->ws + sb->dst_off},
               {&c->dst_user, sub_y(r, sb)},
               {&c->rin_scratch, scratch},
               {&c->scratch, scratch},
               {&c->rout_scratch, scratch}};
    *what = "dnnl_memory_create";
    for (int i = 0; i < 9 && s == dnnl_success; i++) s = dnnl_memory_create(&m[i], mk[i].md, g_eng, mk[i].h);
    if (s == dnnl_success) {
        dnnl_exec_arg_t a[3] = {{DNNL_ARG_FROM, m[0]}, {DNNL_ARG_TO, m[1]}, {DNNL_ARG_SCRATCHPAD, m[6]}};
        *what = "input reorder";
        s = exec(c->rin, strm, 3, a);
    }
    if (s == dnnl_success) {
        dnnl_exec_arg_t a[5] = {{DNNL_ARG_SRC, m[1]}, {DNNL_ARG_WEIGHTS, m[2]}, {DNNL_ARG_DST, m[4]},
                                {DNNL_ARG_SCRATCHPAD, m[7]}, {DNNL_ARG_BIAS, m[3]}};
        *what = "convolution";
        s = exec(c->conv, strm, pl->has_bias ? 5 : 4, a);
    }
    if (s == dnnl_success) {
        dnnl_exec_arg_t a[3] = {{DNNL_ARG_FROM, m[4]}, {DNNL_ARG_TO, m[5]}, {DNNL_ARG_SCRATCHPAD, m[8]}};
        *what = "output reorder";
        s = exec(c->rout, strm, 3, a);
    }
    for (int i = 0; i < 9; i++)
        if (m[i]) dnnl_memory_destroy(m[i]);
    return s;
}

static void run_range(void *arg, int64_t lo, int64_t hi) {
    run_arg *r = arg;
    const int omp_old = omp_single();
    note_threads();
    int slot = atomic_fetch_add(&r->next_slot, 1); /* < nslot: threads <= nslot */
    char *scratch = r->ws ? r->ws + r->pl->scratch_off + (int64_t)slot * r->pl->slot_bytes : NULL;
    dnnl_stream_t strm = NULL;
    dnnl_status_t s = dnnl_stream_create(&strm, g_eng, dnnl_stream_default_flags);
    if (s != dnnl_success) {
        run_fail(r, "dnnl_stream_create", s);
    } else {
        for (int64_t j = lo; j < hi && !atomic_load(&r->failed); j++) {
            const char *what = "";
            s = run_sub(r, (int)j, strm, scratch, &what);
            if (s != dnnl_success) run_fail(r, what, s);
        }
        dnnl_stream_destroy(strm);
    }
    omp_restore(omp_old);
}

/* y's view filled with NaN: a failed run must not look like a result. */
static void poison_view(const cw_tensor_desc *d, void *y) {
    int64_t st[CW_MAX_RANK], idx[CW_MAX_RANK] = {0}, n = 1;
    full_strides(d, st);
    for (int i = 0; i < d->rank; i++) n *= d->dims[i];
    for (int64_t o = 0; o < n; o++) {
        int64_t off = 0;
        for (int i = 0; i < d->rank; i++) off += idx[i] * st[i];
        cw__cpu_fill_nan(y, d->dtype, off);
        for (int i = d->rank - 1; i >= 0; i--) {
            if (++idx[i] < d->dims[i]) break;
            idx[i] = 0;
        }
    }
}

cw_status cw__cpu_dnnl_run(const cw__dnnl_plan *pl, const cw__conv_problem *p, const void *x, const void *w,
                           const void *b, void *y, void *ws, int threads, char *msg, size_t msg_len) {
    if (pl->nsub == 0) return CW_OK;
    run_arg r = {pl, p, x, w, b, y, ws, 0, 0, ""};
    if (pl->rw) { /* weights into the shared blocked layout, on this thread */
        const int omp_old = omp_single();
        note_threads();
        dnnl_stream_t strm = NULL;
        dnnl_memory_t mu = NULL, mb = NULL, msc = NULL;
        dnnl_status_t s = dnnl_stream_create(&strm, g_eng, dnnl_stream_default_flags);
        if (s == dnnl_success) s = dnnl_memory_create(&mu, &pl->w_user, g_eng, (void *)w);
        if (s == dnnl_success) s = dnnl_memory_create(&mb, &pl->w, g_eng, (char *)ws + pl->w_off);
        if (s == dnnl_success) s = dnnl_memory_create(&msc, &pl->w_scratch, g_eng, (char *)ws + pl->scratch_off);
        if (s == dnnl_success) {
            dnnl_exec_arg_t a[3] = {{DNNL_ARG_FROM, mu}, {DNNL_ARG_TO, mb}, {DNNL_ARG_SCRATCHPAD, msc}};
            s = exec(pl->rw, strm, 3, a);
        }
        if (msc) dnnl_memory_destroy(msc);
        if (mb) dnnl_memory_destroy(mb);
        if (mu) dnnl_memory_destroy(mu);
        if (strm) dnnl_stream_destroy(strm);
        omp_restore(omp_old);
        if (s != dnnl_success) run_fail(&r, "weights reorder", s);
    }
    if (!atomic_load(&r.failed)) {
        int t = threads < pl->nslot ? threads : pl->nslot;
        /* helper threads cost ~50 us to start: not for patches under ~4 MFLOP */
        if (pl->flops < 4e6) t = 1;
        cw__cpu_parallel(t, pl->nsub, run_range, &r);
    }
    if (atomic_load(&r.failed)) {
        poison_view(&p->y, y);
        snprintf(msg, msg_len, "%s", r.msg);
        return CW_ERR_BACKEND;
    }
    return CW_OK;
}

#endif
