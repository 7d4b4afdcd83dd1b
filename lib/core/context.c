/* The context: validates the config, picks the backend (auto: cuda where usable, else
 * cpu), owns the streams and the two allocators (budgeted temporaries, activations). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc/alloc.h"
#include "backend/backend.h"
#include "convweave/convweave_cuda.h"
#include "core/core.h"

static cw_status cw__config_check(const cw_context_config *c, char *msg, size_t n) {
    if (c->size != sizeof(cw_context_config) || c->version != CW_CONTEXT_CONFIG_VERSION) {
        snprintf(msg, n, "cw_context_config: size %zu / version %d, expected %zu / %d (use CW_CONTEXT_CONFIG_INIT)",
                 c->size, c->version, sizeof(cw_context_config), CW_CONTEXT_CONFIG_VERSION);
        return CW_ERR_INVALID_ARG;
    }
    if (c->backend != CW_BACKEND_AUTO && c->backend != CW_BACKEND_CPU && c->backend != CW_BACKEND_CUDA) {
        snprintf(msg, n, "cw_context_config.backend = %d is not a cw_backend_kind", (int)c->backend);
        return CW_ERR_INVALID_ARG;
    }
    if (c->streams < 1 || c->streams > CW__MAX_STREAMS) {
        snprintf(msg, n, "cw_context_config.streams = %d, must be in 1..%d", c->streams, CW__MAX_STREAMS);
        return CW_ERR_INVALID_ARG;
    }
    if (c->device < 0) {
        snprintf(msg, n, "cw_context_config.device = %d must be >= 0", c->device);
        return CW_ERR_INVALID_ARG;
    }
    if (c->log_level < CW_LOG_ERROR || c->log_level > CW_LOG_DEBUG) {
        snprintf(msg, n, "cw_context_config.log_level = %d is not a cw_log_level", (int)c->log_level);
        return CW_ERR_INVALID_ARG;
    }
    return CW_OK;
}

static cw_status cw__pick_backend(cw_context *ctx) {
    const cw_context_config *c = &ctx->cfg;
    if (c->backend == CW_BACKEND_CUDA || (c->backend == CW_BACKEND_AUTO && cw__backend_cuda_compiled())) {
        cw_status st = cw__backend_cuda_create(ctx, c, &ctx->be);
        if (st == CW_OK || c->backend == CW_BACKEND_CUDA || st == CW_ERR_OUT_OF_MEMORY) return st;
        cw__log(ctx, CW_LOG_INFO, "backend auto: cuda unavailable (%s), using cpu", cw_context_get_last_error(ctx));
        cw__error_clear(ctx);
    } else if (c->backend == CW_BACKEND_AUTO) {
        cw__log(ctx, CW_LOG_INFO, "backend auto: built without CUDA, using cpu");
    }
    return cw__backend_cpu_create(ctx, c, &ctx->be);
}

cw_status cw_context_create(cw_context **out, const cw_context_config *cfg) {
    static const cw_context_config dflt = CW_CONTEXT_CONFIG_INIT;
    char msg[CW__ERR_LEN];
    cw_status st;
    if (!out) return CW_ERR_INVALID_ARG;
    *out = NULL;
    if (!cfg) cfg = &dflt;
    if ((st = cw__config_check(cfg, msg, sizeof msg)) != CW_OK) {
        if (cfg->size == sizeof(cw_context_config) && cfg->log_fn)
            cfg->log_fn(cfg->log_user, CW_LOG_ERROR, msg);
        else
            fprintf(stderr, "convweave error: %s\n", msg);
        return st;
    }
    cw_context *ctx = cw__calloc(1, sizeof *ctx);
    if (!ctx) return CW_ERR_OUT_OF_MEMORY;
    ctx->cfg = *cfg;
    if (pthread_mutex_init(&ctx->mu, NULL) != 0) {
        cw__free(ctx);
        return CW_ERR_INTERNAL;
    }
    if (pthread_mutex_init(&ctx->err_mu, NULL) != 0) {
        pthread_mutex_destroy(&ctx->mu);
        cw__free(ctx);
        return CW_ERR_INTERNAL;
    }
    if ((st = cw__pick_backend(ctx)) != CW_OK) goto fail;
    uint32_t aflags = CW__ALLOC_DETERMINISTIC | ((cfg->flags & CW_FLAG_POISON) ? CW__ALLOC_POISON : 0);
    const cw__seg_source src = cw__context_seg_source(ctx);
    if ((st = cw__alloc_create(&ctx->temp, ctx, ctx->be, &src, cfg->temp_budget, aflags | CW__ALLOC_PREFER_REUSE)) !=
        CW_OK)
        goto fail;
    if ((st = cw__alloc_create(&ctx->act, ctx, ctx->be, &src, 0, aflags | CW__ALLOC_PREFER_REUSE)) != CW_OK) goto fail;
    *out = ctx;
    return CW_OK;
fail:
    const char *why = cw_context_get_last_error(ctx);
    if (why[0]) cw__log(ctx, CW_LOG_ERROR, "cw_context_create: %s", why);
    cw_context_destroy(ctx);
    return st;
}

void cw_context_destroy(cw_context *ctx) {
    if (!ctx) return;
    if (ctx->be) {
        for (int i = 0; i < CW__MAX_STREAMS; i++)
            if (ctx->streams[i]) ctx->be->rt->stream_synchronize(ctx->be, ctx->streams[i]);
    }
    cw__alloc_destroy(ctx->act);
    cw__alloc_destroy(ctx->temp);
    if (ctx->be) {
        for (int i = 0; i < CW__MAX_STREAMS; i++)
            if (ctx->streams[i]) ctx->be->rt->stream_destroy(ctx->be, ctx->streams[i]);
        ctx->be->rt->destroy(ctx->be);
    }
    pthread_mutex_destroy(&ctx->err_mu);
    pthread_mutex_destroy(&ctx->mu);
    cw__free(ctx);
}

const char *cw_context_get_backend_name(const cw_context *ctx) {
    return ctx && ctx->be ? ctx->be->rt->name : "none";
}

cw_status cw__context_stream(cw_context *ctx, int i, cw__stream **out) {
    if (i < 0 || i >= CW__MAX_STREAMS) return cw__error(ctx, CW_ERR_INVALID_ARG, "stream index %d out of range", i);
    pthread_mutex_lock(&ctx->mu);
    cw__stream *s = ctx->streams[i];
    pthread_mutex_unlock(&ctx->mu);
    if (s) {
        *out = s;
        return CW_OK;
    }
    /* create outside the lock: stream_create may take long (cuda: a GroupNorm scratch) */
    CW_TRY(ctx->be->rt->stream_create(ctx->be, &s));
    pthread_mutex_lock(&ctx->mu);
    cw__stream *won = ctx->streams[i];
    if (!won) ctx->streams[i] = s;
    pthread_mutex_unlock(&ctx->mu);
    if (won) ctx->be->rt->stream_destroy(ctx->be, s); /* another thread was first */
    *out = won ? won : s;
    return CW_OK;
}

cw_status cw_context_synchronize(cw_context *ctx) {
    if (!ctx) return CW_ERR_INVALID_ARG;
    for (int i = 0; i < CW__MAX_STREAMS; i++) {
        if (!ctx->streams[i]) continue;
        CW_TRY(ctx->be->rt->stream_synchronize(ctx->be, ctx->streams[i]));
    }
    return CW_OK;
}

cw_status cw_context_get_memory_stats(cw_context *ctx, cw_memory_stats *out) {
    if (!ctx || !out) return CW_ERR_INVALID_ARG;
    cw_memory_stats act;
    memset(out, 0, sizeof *out);
    cw__alloc_stats(ctx->temp, out);
    cw__alloc_stats(ctx->act, &act);
    out->activations_bytes_current = act.allocated_bytes_current;
    out->activations_bytes_peak = act.allocated_bytes_peak;
    return CW_OK;
}

void cw_context_reset_peak_stats(cw_context *ctx) {
    if (!ctx) return;
    cw__alloc_reset_peaks(ctx->temp);
    cw__alloc_reset_peaks(ctx->act);
}

int64_t cw_context_get_host_syncs(const cw_context *ctx) {
    return ctx && ctx->be ? ctx->be->rt->host_syncs(ctx->be) : 0;
}

/* ---- where the pools' segments come from -------------------------------------------------- */
/* The segment source the context's pools are given (cw__seg_source, alloc/alloc.h). */
static void ctx_user_allocator(void *self, cw_allocator *out) {
    cw_context *ctx = self;
    pthread_mutex_lock(&ctx->mu);
    *out = ctx->ualloc;
    pthread_mutex_unlock(&ctx->mu);
}

static cw_status ctx_idle_stream(void *self, cw__stream **out) { return cw__context_stream(self, 0, out); }

static void ctx_held(void *self, int64_t n, int64_t bytes) {
    cw_context *ctx = self;
    pthread_mutex_lock(&ctx->mu);
    ctx->segs_held += n;
    ctx->seg_bytes_held += bytes;
    pthread_mutex_unlock(&ctx->mu);
}

cw__seg_source cw__context_seg_source(cw_context *ctx) {
    cw__seg_source s = {ctx, ctx_user_allocator, ctx_idle_stream, ctx_held};
    return s;
}

/* Waits for the context's streams, then gives every cached segment of its pools back to the
 * allocator that gave it. */
static cw_status cw__context_release(cw_context *ctx) {
    cw_status st = cw_context_synchronize(ctx);
    if (st != CW_OK) return cw__error(ctx, st, "waiting for the context's streams failed (%s)", cw_status_name(st));
    CW_TRY(cw__alloc_release_cached(ctx->temp));
    return cw__alloc_release_cached(ctx->act);
}

cw_status cw_context_empty_cache(cw_context *ctx) {
    if (!ctx) return CW_ERR_INVALID_ARG;
    cw_status st = cw__context_release(ctx);
    if (st == CW_OK && ctx->be->rt->empty_cache) ctx->be->rt->empty_cache(ctx->be);
    return st;
}

cw_status cw_context_set_allocator(cw_context *ctx, const cw_allocator *a) {
    if (!ctx) return CW_ERR_INVALID_ARG;
    if (a && (a->size != sizeof *a || a->version != CW_ALLOCATOR_VERSION))
        return cw__error(ctx, CW_ERR_INVALID_ARG,
                         "cw_context_set_allocator: cw_allocator size %zu / version %d, expected %zu / %d (use "
                         "CW_ALLOCATOR_INIT)", a->size, a->version, sizeof *a, CW_ALLOCATOR_VERSION);
    if (a && (!a->alloc || !a->free))
        return cw__error(ctx, CW_ERR_INVALID_ARG,
                         "cw_context_set_allocator: alloc is %s and free is %s, both must be set (a NULL allocator "
                         "restores the backend's own)", a->alloc ? "set" : "NULL", a->free ? "set" : "NULL");
    CW_TRY(cw__context_release(ctx));
    pthread_mutex_lock(&ctx->mu);
    const int64_t n = ctx->segs_held, bytes = ctx->seg_bytes_held;
    if (n == 0) {
        memset(&ctx->ualloc, 0, sizeof ctx->ualloc);
        if (a) ctx->ualloc = *a;
    }
    pthread_mutex_unlock(&ctx->mu);
    if (n)
        return cw__error(ctx, CW_ERR_INVALID_ARG,
                         "cw_context_set_allocator: the context still holds %" PRId64 " segment(s) (%" PRId64
                         " bytes) of its current allocator after releasing its cache: live plans hold their "
                         "activation arenas (and plans compiled under a budget other than the context's their own "
                         "pools); destroy them first or set the allocator right after cw_context_create. The "
                         "allocator is unchanged", n, bytes);
    return CW_OK;
}

/* ---- convweave_cuda.h: the backend does the CUDA work through its stream_adopt and
 * device_index hooks; the context checks the arguments and owns the stream table. --------- */
static cw_status cw__cuda_ctx_check(cw_context *ctx, int index, const char *what) {
    if (!cw__backend_cuda_compiled())
        return cw__error(ctx, CW_ERR_UNSUPPORTED, "%s: convweave was built without CUDA", what);
    if (!ctx->be->rt->stream_adopt)
        return cw__error(ctx, CW_ERR_UNSUPPORTED, "%s: the context runs backend %s, not cuda", what, ctx->be->rt->name);
    if (index < 0 || index >= CW__MAX_STREAMS)
        return cw__error(ctx, CW_ERR_INVALID_ARG, "%s: stream index %d outside 0..%d", what, index,
                         CW__MAX_STREAMS - 1);
    return CW_OK;
}

cw_status cw_context_set_cuda_stream(cw_context *ctx, int index, void *cuda_stream) {
    if (!ctx) return CW_ERR_INVALID_ARG;
    CW_TRY(cw__cuda_ctx_check(ctx, index, "cw_context_set_cuda_stream"));
    pthread_mutex_lock(&ctx->mu);
    cw_status st = cw__stream_adopt(ctx->be, cuda_stream, &ctx->streams[index]);
    pthread_mutex_unlock(&ctx->mu);
    return st;
}

cw_status cw_context_get_cuda_stream(cw_context *ctx, int index, void **cuda_stream) {
    if (cuda_stream) *cuda_stream = NULL;
    if (!ctx) return CW_ERR_INVALID_ARG;
    CW_TRY(cw__cuda_ctx_check(ctx, index, "cw_context_get_cuda_stream"));
    if (!cuda_stream) return cw__error(ctx, CW_ERR_INVALID_ARG, "cw_context_get_cuda_stream: cuda_stream is NULL");
    cw__stream *s = NULL;
    CW_TRY(cw__context_stream(ctx, index, &s));
    *cuda_stream = cw__stream_handle(ctx->be, s);
    return CW_OK;
}

cw_status cw_context_get_cuda_device(const cw_context *ctx, int *device) {
    if (!ctx || !device) return CW_ERR_INVALID_ARG;
    return cw__device_index(ctx->be, device);
}
