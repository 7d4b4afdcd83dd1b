/* cuDNN convolution, the engine-config / plan cache: one entry per canonical problem key
 * (graphs + ordered engine configs), idle entries evicted, execution plans finalised on
 * first use and kept; the algorithm list and compile-time preparation read it. */
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "backend/cuda/cudnn_conv.h"

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

/* The entry for (p, align), built (graphs + heuristics) on first use. Caller holds c->mu. */
cw_status cw__entry_get(cw__cudnn_conv *c, const cw__conv_problem *p, const int64_t align[3],
                               cw__cudnn_entry **out) {
    cw_context *ctx = c->ctx;
    cw__cudnn_key key;
    cw_status st, sa = CW_OK, sf = CW_OK;
    cw__raw_cfg raw[CW__CUDNN_MAX_CFGS], rawp[CW__CUDNN_MAX_CFGS], rawf[CW__CUDNN_MAX_CFGS];
    int n_raw = 0, n_rawp = 0, n_rawf = 0;
    char desc[512];
    *out = NULL;
    CW_TRY(cw__cudnn_problem_check(ctx, p));
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
cw_status cw__conv_plan_locked(cw__cudnn_conv *c, const cw__conv_problem *p, const int64_t align[3], int id,
                                      int64_t ws_cap, int allow_packed, int allow_fused, cw__cudnn_choice *out,
                                      cw__cudnn_entry **entry) {
    cw__cudnn_entry *e;
    int order[CW__CUDNN_MAX_CFGS], n_order = 0, want = -1;
    memset(out, 0, sizeof *out);
    out->id = -1;
    CW_TRY(cw__entry_get(c, p, align, &e));
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

