/* The dry backend: a runtime with no memory, no work and no threads, and no operations. It
 * hands out distinct fake addresses so the scheduler can replay a plan's exact allocation
 * sequence and measure its peak (the plan chose its algorithms on the real backend). */
#include <stdatomic.h>

#include "backend/backend.h"

#define DRY_ALIGN 256            /* bytes, like cudaMalloc's alignment */
#define DRY_BASE (1ull << 40)    /* fake device addresses start here; never dereferenced */
#define DRY_HANDLE_BASE (1ull << 36) /* fake stream/event handles, below the memory range */

typedef struct dry_backend {
    cw__backend base;      /* must be first */
    _Atomic uint64_t next_addr;
    _Atomic uint64_t next_handle;
    _Atomic int64_t host_syncs;
} dry_backend;

static dry_backend *dry_of(cw__backend *be) { return (dry_backend *)be; }

static void dry_destroy(cw__backend *be) { cw__free(be); }

static cw_status dry_dev_alloc(cw__backend *be, int64_t bytes, void **out) {
    if (!out) return cw__error(be->ctx, CW_ERR_INVALID_ARG, "dry dev_alloc: out is NULL");
    *out = NULL;
    if (bytes < 0) return cw__error(be->ctx, CW_ERR_INVALID_ARG, "dry dev_alloc: bytes = %lld < 0", (long long)bytes);
    if (bytes == 0) return CW_OK; /* same answer as the real backends */
    uint64_t span = ((uint64_t)bytes + DRY_ALIGN - 1) & ~(uint64_t)(DRY_ALIGN - 1);
    /* Address ranges never overlap, so a plan that confuses two blocks is still caught. */
    *out = (void *)(uintptr_t)atomic_fetch_add(&dry_of(be)->next_addr, span);
    return CW_OK;
}

static void dry_dev_free(cw__backend *be, void *p) {}

static cw_status dry_copy(cw__backend *be, void *dst, const void *src, int64_t bytes) { return CW_OK; }
static cw_status dry_fill32_async(cw__backend *be, cw__stream *s, void *p, uint32_t pattern, int64_t count) {
    return CW_OK;
}

static void *dry_handle(cw__backend *be) {
    return (void *)(uintptr_t)atomic_fetch_add(&dry_of(be)->next_handle, 64);
}

static cw_status dry_stream_create(cw__backend *be, cw__stream **out) {
    if (!out) return cw__error(be->ctx, CW_ERR_INVALID_ARG, "dry stream_create: out is NULL");
    *out = dry_handle(be);
    return CW_OK;
}
static void dry_stream_destroy(cw__backend *be, cw__stream *s) {}
static cw_status dry_event_create(cw__backend *be, cw__event **out) {
    if (!out) return cw__error(be->ctx, CW_ERR_INVALID_ARG, "dry event_create: out is NULL");
    *out = dry_handle(be);
    return CW_OK;
}
static void dry_event_destroy(cw__backend *be, cw__event *e) {}
static cw_status dry_event_record(cw__backend *be, cw__event *e, cw__stream *s) { return CW_OK; }
static cw_status dry_stream_wait_event(cw__backend *be, cw__stream *s, cw__event *e) { return CW_OK; }
static cw_status dry_event_query(cw__backend *be, cw__event *e, int *done) {
    if (done) *done = 1;
    return CW_OK;
}
/* Synchronising returns at once but still counts, so a simulation can count host syncs. */
static cw_status dry_event_synchronize(cw__backend *be, cw__event *e) {
    atomic_fetch_add(&dry_of(be)->host_syncs, 1);
    return CW_OK;
}
static cw_status dry_stream_synchronize(cw__backend *be, cw__stream *s) {
    atomic_fetch_add(&dry_of(be)->host_syncs, 1);
    return CW_OK;
}
static int64_t dry_host_syncs(cw__backend *be) { return atomic_load(&dry_of(be)->host_syncs); }
static cw_status dry_launch_host(cw__backend *be, cw__stream *s, cw__host_fn fn, void *arg) { return CW_OK; }

static const cw__runtime_i dry_rt = {
    .name = "dry",
    .destroy = dry_destroy,
    .dev_alloc = dry_dev_alloc,
    .dev_free = dry_dev_free,
    .upload = dry_copy,
    .download = dry_copy,
    .fill32_async = dry_fill32_async,
    .stream_create = dry_stream_create,
    .stream_destroy = dry_stream_destroy,
    .event_create = dry_event_create,
    .event_destroy = dry_event_destroy,
    .event_record = dry_event_record,
    .stream_wait_event = dry_stream_wait_event,
    .event_query = dry_event_query,
    .event_synchronize = dry_event_synchronize,
    .stream_synchronize = dry_stream_synchronize,
    .host_syncs = dry_host_syncs,
    .launch_host = dry_launch_host,
};

cw_status cw__backend_dry_create(cw__backend *real, cw__backend **out) {
    cw_context *ctx = real ? real->ctx : NULL;
    if (!out) return cw__error(ctx, CW_ERR_INVALID_ARG, "dry backend: out is NULL");
    *out = NULL;
    if (!real) return cw__error(ctx, CW_ERR_INVALID_ARG, "dry backend: real backend is NULL");
    dry_backend *d = cw__calloc(1, sizeof *d);
    if (!d) return cw__error(ctx, CW_ERR_OUT_OF_MEMORY, "dry backend: out of host memory");
    d->base.rt = &dry_rt;
    d->base.ctx = ctx;
    atomic_init(&d->next_addr, DRY_BASE);
    atomic_init(&d->next_handle, DRY_HANDLE_BASE);
    atomic_init(&d->host_syncs, 0);
    *out = &d->base;
    return CW_OK;
}
