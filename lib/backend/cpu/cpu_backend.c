/* The cpu backend's runtime: host memory as "device" memory, one worker thread per stream
 * draining a FIFO of closures, and events with CUDA's generation semantics. It is the
 * oracle for the cuda backend, so ordering is only what events guarantee (chaos mode). */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "backend/cpu/cpu.h"

#define CPU_ALIGN 64 /* bytes: cache line, and enough for any SIMD load */
/* Blocks from 1 MiB on (arenas, pools' segments) get pages of their own, unmapped when
 * freed: glibc serves blocks under its mmap threshold (which grows to 32 MiB after the
 * first such free) from the brk heap, and a freed arena there stays resident. Not under
 * AddressSanitizer, which checks heap blocks' bounds and returns their pages itself. */
#if defined(__SANITIZE_ADDRESS__)
#define CPU_MAP_MIN INT64_MAX
#else
#define CPU_MAP_MIN (INT64_C(1) << 20)
#endif

enum { ITEM_FN = 0, ITEM_RECORD = 1, ITEM_WAIT = 2 };

typedef struct cpu_item {
    struct cpu_item *next;      /* stream queue */
    int kind;
    void (*fn)(void *);
    void *arg;
    void (*fin)(void *);
    cw__event *ev;              /* RECORD / WAIT */
    uint64_t gen;               /* generation recorded / waited for */
    struct cpu_item *pend_next; /* RECORD: e's list of recordings not yet completed */
} cpu_item;

typedef struct cpu_backend cpu_backend;

struct cw__stream {
    cpu_backend *cb;
    int index;            /* creation order; seeds the chaos RNG */
    pthread_t thread;
    pthread_cond_t cv;    /* worker: an item arrived or stop was set */
    pthread_cond_t sync_cv; /* host: `done` advanced */
    cpu_item *head, *tail;
    int64_t enqueued, done; /* items; stream_synchronize waits for done >= enqueued-at-call */
    int stop;
    uint64_t rng;         /* chaos RNG; touched by the worker only */
};

struct cw__event {
    int64_t refs;        /* the handle + queued RECORD/WAIT items that name it */
    uint64_t recorded;   /* latest generation recorded; 0 = never */
    cpu_item *pending;   /* RECORD items queued but not yet run */
};

struct cpu_backend {
    cw__backend base;    /* must be first: cw__backend* <-> cpu_backend* */
    pthread_mutex_t mu;  /* guards every queue and every event */
    pthread_cond_t ev_cv; /* broadcast when any RECORD item completes */
    int chaos;
    uint64_t chaos_seed;
    int threads;
    int next_index;
    int live_streams;
    int unbounded;       /* no queue bound (wait_room_locked): a distributed run came */
    _Atomic int64_t host_syncs;
};

static cpu_backend *cb_of(cw__backend *be) { return (cpu_backend *)be; }

/* splitmix64: cheap, seedable, good enough to jitter timing. */
static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* ---- events (callers hold cb->mu) ---------------------------------------------------- */
static int gen_pending(const cw__event *e, uint64_t gen) {
    for (const cpu_item *it = e->pending; it; it = it->pend_next)
        if (it->gen == gen) return 1;
    return 0;
}

static void event_unref_locked(cw__event *e) {
    if (--e->refs == 0) {
        assert(e->pending == NULL);
        cw__free(e);
    }
}

/* ---- the worker ------------------------------------------------------------------------ */
static void chaos_delay(cw__stream *s) {
    uint64_t r = rng_next(&s->rng);
    if ((r & 3) == 0) return; /* a quarter of the items run at once: races need both orders */
    long us = (long)((r >> 8) % 201);
    struct timespec ts = {0, us * 1000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static void *worker_main(void *p) {
    cw__stream *s = p;
    cpu_backend *cb = s->cb;
    pthread_mutex_lock(&cb->mu);
    for (;;) {
        while (!s->head && !s->stop) pthread_cond_wait(&s->cv, &cb->mu);
        cpu_item *it = s->head;
        if (!it) break; /* stopped and drained */
        s->head = it->next;
        if (!s->head) s->tail = NULL;
        pthread_mutex_unlock(&cb->mu);

        if (cb->chaos) chaos_delay(s);
        if (it->kind == ITEM_FN) {
            it->fn(it->arg);
            if (it->fin) it->fin(it->arg);
        }

        pthread_mutex_lock(&cb->mu);
        if (it->kind == ITEM_RECORD) {
            cpu_item **pp = &it->ev->pending;
            while (*pp != it) pp = &(*pp)->pend_next;
            *pp = it->pend_next;
            pthread_cond_broadcast(&cb->ev_cv);
            event_unref_locked(it->ev);
        } else if (it->kind == ITEM_WAIT) {
            while (gen_pending(it->ev, it->gen)) pthread_cond_wait(&cb->ev_cv, &cb->mu);
            event_unref_locked(it->ev);
        }
        s->done++;
        pthread_cond_broadcast(&s->sync_cv);
        cw__free(it);
    }
    pthread_mutex_unlock(&cb->mu);
    return NULL;
}

/* Waits, holding cb->mu, while s has CPU_QUEUE_MAX items not yet done, as a CUDA launch
 * queue blocks the host when full: a run enqueues every task at once, and each queued
 * task's closure (a conv's is ~0.5 KiB) stayed allocated until its worker got to it, so a
 * plan of 10850 tasks (the SD decoder at a 32 MiB budget) added 7 MiB to the peak resident
 * set and left 20 MiB of freed heap behind. It cannot deadlock: a queued item waits only on
 * events recorded by items enqueued before it, which are already queued. Not counted as a
 * host synchronisation: no work the host asked for is waited on, only room in a queue. A
 * worker enqueuing onto its own stream does not wait. A communicator's send or receive
 * may block on another rank's host, which no queue here shows: before a distributed run
 * the scheduler unbounds the queues (cpu_unbound_queues), for good. */
static void wait_room_locked(cw__stream *s) {
    if (s->cb->unbounded || pthread_equal(pthread_self(), s->thread)) return;
    while (s->enqueued - s->done >= CPU_QUEUE_MAX) pthread_cond_wait(&s->sync_cv, &s->cb->mu);
}

/* Appends it to s's queue; caller holds cb->mu and made room (wait_room_locked). */
static void push_locked(cw__stream *s, cpu_item *it) {
    it->next = NULL;
    if (s->tail) s->tail->next = it;
    else s->head = it;
    s->tail = it;
    s->enqueued++;
    pthread_cond_signal(&s->cv);
}

cw_status cw__cpu_enqueue(cw__backend *be, cw__stream *s, void (*fn)(void *), void *arg, void (*fin)(void *)) {
    if (!s || !fn) {
        if (fin) fin(arg);
        return cw__error(be->ctx, CW_ERR_INVALID_ARG, "cpu enqueue: %s is NULL", !s ? "stream" : "function");
    }
    cpu_item *it = cw__calloc(1, sizeof *it);
    if (!it) {
        if (fin) fin(arg);
        return cw__error(be->ctx, CW_ERR_OUT_OF_MEMORY, "cpu enqueue: out of host memory for a queue item");
    }
    it->kind = ITEM_FN;
    it->fn = fn;
    it->arg = arg;
    it->fin = fin;
    cpu_backend *cb = cb_of(be);
    pthread_mutex_lock(&cb->mu);
    wait_room_locked(s);
    push_locked(s, it);
    pthread_mutex_unlock(&cb->mu);
    return CW_OK;
}

int cw__cpu_blas_threads(cw__backend *be) { return be->threads; }

/* ---- streams ------------------------------------------------------------------------- */
static cw_status cpu_stream_create(cw__backend *be, cw__stream **out) {
    cpu_backend *cb = cb_of(be);
    if (!out) return cw__error(be->ctx, CW_ERR_INVALID_ARG, "cpu stream_create: out is NULL");
    *out = NULL;
    cw__stream *s = cw__calloc(1, sizeof *s);
    if (!s) return cw__error(be->ctx, CW_ERR_OUT_OF_MEMORY, "cpu stream_create: out of host memory");
    s->cb = cb;
    if (pthread_cond_init(&s->cv, NULL) != 0) goto fail_cv;
    if (pthread_cond_init(&s->sync_cv, NULL) != 0) goto fail_sync;
    pthread_mutex_lock(&cb->mu);
    s->index = cb->next_index++;
    pthread_mutex_unlock(&cb->mu);
    /* Distinct per-stream sequences from one seed: mix the index in before the first draw. */
    s->rng = cb->chaos_seed ^ (0xD1B54A32D192ED03ull * (uint64_t)(s->index + 1));
    int rc = pthread_create(&s->thread, NULL, worker_main, s);
    if (rc != 0) {
        pthread_cond_destroy(&s->sync_cv);
        pthread_cond_destroy(&s->cv);
        cw__free(s);
        return cw__error(be->ctx, rc == EAGAIN ? CW_ERR_OUT_OF_MEMORY : CW_ERR_BACKEND,
                         "cpu stream_create: pthread_create failed (%s)", strerror(rc));
    }
    pthread_mutex_lock(&cb->mu);
    cb->live_streams++;
    pthread_mutex_unlock(&cb->mu);
    *out = s;
    return CW_OK;

fail_sync:
    pthread_cond_destroy(&s->cv);
fail_cv:
    cw__free(s);
    return cw__error(be->ctx, CW_ERR_BACKEND, "cpu stream_create: pthread_cond_init failed");
}

/* Drains whatever is still queued (the work was promised), then joins the worker. */
static void cpu_stream_destroy(cw__backend *be, cw__stream *s) {
    if (!s) return;
    cpu_backend *cb = cb_of(be);
    pthread_mutex_lock(&cb->mu);
    s->stop = 1;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&cb->mu);
    pthread_join(s->thread, NULL);
    pthread_mutex_lock(&cb->mu);
    cb->live_streams--;
    pthread_mutex_unlock(&cb->mu);
    pthread_cond_destroy(&s->sync_cv);
    pthread_cond_destroy(&s->cv);
    cw__free(s);
}

static cw_status cpu_stream_synchronize(cw__backend *be, cw__stream *s) {
    if (!s) return cw__error(be->ctx, CW_ERR_INVALID_ARG, "cpu stream_synchronize: stream is NULL");
    cpu_backend *cb = cb_of(be);
    atomic_fetch_add(&cb->host_syncs, 1);
    pthread_mutex_lock(&cb->mu);
    int64_t target = s->enqueued; /* work queued before this call, not after */
    while (s->done < target) pthread_cond_wait(&s->sync_cv, &cb->mu);
    pthread_mutex_unlock(&cb->mu);
    return CW_OK;
}

/* ---- events -------------------------------------------------------------------------- */
static cw_status cpu_event_create(cw__backend *be, cw__event **out) {
    if (!out) return cw__error(be->ctx, CW_ERR_INVALID_ARG, "cpu event_create: out is NULL");
    cw__event *e = cw__calloc(1, sizeof *e);
    *out = e;
    if (!e) return cw__error(be->ctx, CW_ERR_OUT_OF_MEMORY, "cpu event_create: out of host memory");
    e->refs = 1;
    return CW_OK;
}

/* Like cudaEventDestroy: legal with recordings or waits still queued; the memory lives
 * until the last queued item naming the event has run. */
static void cpu_event_destroy(cw__backend *be, cw__event *e) {
    if (!e) return;
    cpu_backend *cb = cb_of(be);
    pthread_mutex_lock(&cb->mu);
    event_unref_locked(e);
    pthread_mutex_unlock(&cb->mu);
}

static cw_status cpu_event_record(cw__backend *be, cw__event *e, cw__stream *s) {
    if (!e || !s)
        return cw__error(be->ctx, CW_ERR_INVALID_ARG, "cpu event_record: %s is NULL", !e ? "event" : "stream");
    cpu_item *it = cw__calloc(1, sizeof *it);
    if (!it) return cw__error(be->ctx, CW_ERR_OUT_OF_MEMORY, "cpu event_record: out of host memory");
    cpu_backend *cb = cb_of(be);
    it->kind = ITEM_RECORD;
    it->ev = e;
    pthread_mutex_lock(&cb->mu);
    wait_room_locked(s);
    it->gen = ++e->recorded; /* the generation is fixed now, at call time */
    e->refs++;
    it->pend_next = e->pending;
    e->pending = it;
    push_locked(s, it);
    pthread_mutex_unlock(&cb->mu);
    return CW_OK;
}

static cw_status cpu_stream_wait_event(cw__backend *be, cw__stream *s, cw__event *e) {
    if (!e || !s)
        return cw__error(be->ctx, CW_ERR_INVALID_ARG, "cpu stream_wait_event: %s is NULL", !e ? "event" : "stream");
    cpu_backend *cb = cb_of(be);
    pthread_mutex_lock(&cb->mu);
    uint64_t gen = e->recorded;
    pthread_mutex_unlock(&cb->mu);
    if (gen == 0) return CW_OK; /* never recorded: no-op, as in CUDA */
    cpu_item *it = cw__calloc(1, sizeof *it);
    if (!it) return cw__error(be->ctx, CW_ERR_OUT_OF_MEMORY, "cpu stream_wait_event: out of host memory");
    it->kind = ITEM_WAIT;
    it->ev = e;
    it->gen = gen;
    pthread_mutex_lock(&cb->mu);
    wait_room_locked(s); /* the generation waited for stays the one current at the call */
    e->refs++;
    push_locked(s, it);
    pthread_mutex_unlock(&cb->mu);
    return CW_OK;
}

static cw_status cpu_event_query(cw__backend *be, cw__event *e, int *done) {
    if (!e || !done)
        return cw__error(be->ctx, CW_ERR_INVALID_ARG, "cpu event_query: %s is NULL", !e ? "event" : "done");
    cpu_backend *cb = cb_of(be);
    pthread_mutex_lock(&cb->mu);
    *done = e->recorded == 0 || !gen_pending(e, e->recorded);
    pthread_mutex_unlock(&cb->mu);
    return CW_OK;
}

static cw_status cpu_event_synchronize(cw__backend *be, cw__event *e) {
    if (!e) return cw__error(be->ctx, CW_ERR_INVALID_ARG, "cpu event_synchronize: event is NULL");
    cpu_backend *cb = cb_of(be);
    atomic_fetch_add(&cb->host_syncs, 1);
    pthread_mutex_lock(&cb->mu);
    uint64_t gen = e->recorded;
    while (gen != 0 && gen_pending(e, gen)) pthread_cond_wait(&cb->ev_cv, &cb->mu);
    pthread_mutex_unlock(&cb->mu);
    return CW_OK;
}

static int64_t cpu_host_syncs(cw__backend *be) { return atomic_load(&cb_of(be)->host_syncs); }

static cw_status cpu_launch_host(cw__backend *be, cw__stream *s, cw__host_fn fn, void *arg) {
    return cw__cpu_enqueue(be, s, fn, arg, NULL);
}

static void cpu_unbound_queues(cw__backend *be) {
    cpu_backend *cb = cb_of(be);
    pthread_mutex_lock(&cb->mu);
    cb->unbounded = 1;
    pthread_mutex_unlock(&cb->mu);
}

/* ---- memory -------------------------------------------------------------------------- */
/* 64-byte aligned blocks carved from cw__malloc (so failures can be injected); the raw
 * pointer sits just below the aligned one. */
static cw_status cpu_dev_alloc(cw__backend *be, int64_t bytes, void **out) {
    if (!out) return cw__error(be->ctx, CW_ERR_INVALID_ARG, "cpu dev_alloc: out is NULL");
    *out = NULL;
    if (bytes < 0) return cw__error(be->ctx, CW_ERR_INVALID_ARG, "cpu dev_alloc: bytes = %" PRId64 " < 0", bytes);
    if (bytes == 0) return CW_OK; /* like cudaMalloc(0) */
    const size_t extra = CPU_ALIGN + sizeof(void *);
    if ((uint64_t)bytes > (uint64_t)(SIZE_MAX - extra))
        return cw__error(be->ctx, CW_ERR_OUT_OF_MEMORY, "cpu dev_alloc: %" PRId64 " bytes exceed the address space",
                         bytes);
    /* below p: the raw block's address (low bit set: mapped, then its length before it) */
    const int map = bytes >= CPU_MAP_MIN;
    const size_t len = map ? (size_t)bytes + CPU_ALIGN : (size_t)bytes + extra;
    char *raw = map ? cw__map(len) : cw__malloc(len);
    if (!raw)
        return cw__error(be->ctx, CW_ERR_OUT_OF_MEMORY, "cpu dev_alloc: out of host memory for %" PRId64 " bytes",
                         bytes);
    uintptr_t p = ((uintptr_t)raw + sizeof(void *) + CPU_ALIGN - 1) & ~(uintptr_t)(CPU_ALIGN - 1);
    uintptr_t tag = (uintptr_t)raw | (uintptr_t)map; /* both are at least 16-byte aligned */
    memcpy((char *)p - sizeof tag, &tag, sizeof tag);
    if (map) memcpy((char *)p - sizeof tag - sizeof len, &len, sizeof len);
    *out = (void *)p;
    return CW_OK;
}

static void cpu_dev_free(cw__backend *be, void *p) {
    if (!p) return;
    uintptr_t tag;
    memcpy(&tag, (char *)p - sizeof tag, sizeof tag);
    if (tag & 1) {
        size_t len;
        memcpy(&len, (char *)p - sizeof tag - sizeof len, sizeof len);
        cw__unmap((void *)(tag & ~(uintptr_t)1), len);
    } else {
        cw__free((void *)tag);
    }
}

static cw_status check_copy(cw__backend *be, const char *what, const void *dst, const void *src, int64_t bytes) {
    if (bytes < 0) return cw__error(be->ctx, CW_ERR_INVALID_ARG, "cpu %s: bytes = %" PRId64 " < 0", what, bytes);
    if (bytes > 0 && (!dst || !src))
        return cw__error(be->ctx, CW_ERR_INVALID_ARG, "cpu %s: %s is NULL with bytes = %" PRId64, what,
                         !dst ? "dst" : "src", bytes);
    return CW_OK;
}

/* Synchronous: used only at run boundaries, after the caller synchronised its streams. */
static cw_status cpu_upload(cw__backend *be, void *dst_dev, const void *src_host, int64_t bytes) {
    cw_status st = check_copy(be, "upload", dst_dev, src_host, bytes);
    if (st == CW_OK && bytes > 0) memcpy(dst_dev, src_host, (size_t)bytes);
    return st;
}

static cw_status cpu_download(cw__backend *be, void *dst_host, const void *src_dev, int64_t bytes) {
    cw_status st = check_copy(be, "download", dst_host, src_dev, bytes);
    if (st == CW_OK && bytes > 0) memcpy(dst_host, src_dev, (size_t)bytes);
    return st;
}

typedef struct copy_args {
    void *dst;
    const void *src;
    int64_t bytes;
} copy_args;

static void run_copy(void *p) {
    copy_args *a = p;
    memmove(a->dst, a->src, (size_t)a->bytes);
}

typedef struct discard_args {
    uintptr_t p, bytes, n, stride;
} discard_args;

/* madvise is advice: a failure leaves the pages */
static void run_discard(void *arg) {
    const discard_args *d = arg;
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    for (uintptr_t i = 0; i < d->n; i++) {
        const uintptr_t lo = d->p + i * d->stride, a = (lo + page - 1) / page * page, b = (lo + d->bytes) / page * page;
        if (b > a) (void)madvise((void *)a, b - a, MADV_DONTNEED);
    }
}

static cw_status cpu_discard(cw__backend *be, cw__stream *s, void *p, int64_t bytes, int64_t n, int64_t stride) {
    if (!p || bytes <= 0 || n <= 0 || stride < 0) return CW_OK;
    discard_args *d = cw__malloc(sizeof *d);
    if (!d) return cw__error(be->ctx, CW_ERR_OUT_OF_MEMORY, "cpu discard: out of host memory");
    *d = (discard_args){(uintptr_t)p, (uintptr_t)bytes, (uintptr_t)n, (uintptr_t)stride};
    return cw__cpu_enqueue(be, s, run_discard, d, cw__free);
}

static cw_status cpu_copy_async(cw__backend *be, cw__stream *s, void *dst, const void *src, int64_t bytes) {
    cw_status st = check_copy(be, "copy_async", dst, src, bytes);
    if (st != CW_OK || bytes == 0) return st;
    copy_args *a = cw__malloc(sizeof *a);
    if (!a) return cw__error(be->ctx, CW_ERR_OUT_OF_MEMORY, "cpu copy_async: out of host memory");
    a->dst = dst;
    a->src = src;
    a->bytes = bytes;
    return cw__cpu_enqueue(be, s, run_copy, a, cw__free);
}

typedef struct fill_args {
    uint32_t *p;
    uint32_t pattern;
    int64_t count;
} fill_args;

static void run_fill(void *p) {
    fill_args *a = p;
    for (int64_t i = 0; i < a->count; i++) a->p[i] = a->pattern;
}

static cw_status cpu_fill32_async(cw__backend *be, cw__stream *s, void *p, uint32_t pattern, int64_t count) {
    if (count < 0) return cw__error(be->ctx, CW_ERR_INVALID_ARG, "cpu fill32_async: count = %" PRId64 " < 0", count);
    if (count == 0) return CW_OK;
    if (!p || ((uintptr_t)p & 3u))
        return cw__error(be->ctx, CW_ERR_INVALID_ARG, "cpu fill32_async: pointer %p is NULL or not 4-byte aligned", p);
    fill_args *a = cw__malloc(sizeof *a);
    if (!a) return cw__error(be->ctx, CW_ERR_OUT_OF_MEMORY, "cpu fill32_async: out of host memory");
    a->p = p;
    a->pattern = pattern;
    a->count = count;
    return cw__cpu_enqueue(be, s, run_fill, a, cw__free);
}

/* ---- lifetime ------------------------------------------------------------------------ */
/* Streams and events belong to the caller, who destroys them first. If streams are still
 * alive their workers use cb->mu, so the backend is leaked rather than freed under them. */
/* cpu backends alive: the oneDNN plan cache is process-wide, and trimmed with the last. */
static _Atomic int g_backends;

static void cpu_empty_cache(cw__backend *be) { cw__cpu_dnnl_trim(); }

static void cpu_destroy(cw__backend *be) {
    if (!be) return;
    cpu_backend *cb = cb_of(be);
    pthread_mutex_lock(&cb->mu);
    int live = cb->live_streams;
    pthread_mutex_unlock(&cb->mu);
    if (live) {
        cw__log(be->ctx, CW_LOG_ERROR, "cpu backend destroyed with %d stream(s) alive; leaking it", live);
        return;
    }
    pthread_cond_destroy(&cb->ev_cv);
    pthread_mutex_destroy(&cb->mu);
    cw__free(cb);
    if (atomic_fetch_sub(&g_backends, 1) == 1) cw__cpu_dnnl_trim();
}

static const cw__runtime_i cpu_rt = {
    .name = "cpu",
    .caps = CW__CAP_HOST_STREAMS,
    .destroy = cpu_destroy,
    .empty_cache = cpu_empty_cache,
    .dev_alloc = cpu_dev_alloc,
    .dev_free = cpu_dev_free,
    .upload = cpu_upload,
    .download = cpu_download,
    .copy_async = cpu_copy_async,
    .fill32_async = cpu_fill32_async,
    .stream_create = cpu_stream_create,
    .stream_destroy = cpu_stream_destroy,
    .event_create = cpu_event_create,
    .event_destroy = cpu_event_destroy,
    .event_record = cpu_event_record,
    .stream_wait_event = cpu_stream_wait_event,
    .event_query = cpu_event_query,
    .event_synchronize = cpu_event_synchronize,
    .stream_synchronize = cpu_stream_synchronize,
    .host_syncs = cpu_host_syncs,
    .launch_host = cpu_launch_host,
    .discard = cpu_discard,
    .unbound_queues = cpu_unbound_queues,
};

cw_status cw__backend_cpu_create(cw_context *ctx, const cw_context_config *cfg, cw__backend **out) {
    if (!out) return cw__error(ctx, CW_ERR_INVALID_ARG, "cpu backend: out is NULL");
    *out = NULL;
    if (!cfg) return cw__error(ctx, CW_ERR_INVALID_ARG, "cpu backend: cfg is NULL");
    cpu_backend *cb = cw__calloc(1, sizeof *cb);
    if (!cb) return cw__error(ctx, CW_ERR_OUT_OF_MEMORY, "cpu backend: out of host memory");
    if (pthread_mutex_init(&cb->mu, NULL) != 0) goto fail_mu;
    if (pthread_cond_init(&cb->ev_cv, NULL) != 0) goto fail_cv;
    cb->base.rt = &cpu_rt;
    cb->base.ops = &cw__cpu_ops;
    cb->base.ctx = ctx;
    atomic_init(&cb->host_syncs, 0);

    cb->threads = cfg->threads;
    if (cb->threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        cb->threads = n > 0 ? (int)n : 1;
    }
    cb->base.threads = cb->threads;
    cb->base.costs_are_ns = 1; /* conv_cpu.c's cost model */
    cw__cpu_blas_single(); /* convweave splits GEMMs itself (par_cpu.c) */

    cb->chaos = (cfg->flags & CW_FLAG_CHAOS) != 0;
    cb->chaos_seed = cfg->chaos_seed;
    if (cb->chaos) {
        const char *env = getenv("CONVWEAVE_CHAOS_SEED");
        if (env && *env) {
            cb->chaos_seed = strtoull(env, NULL, 0);
            cw__log(ctx, CW_LOG_INFO, "cpu backend: chaos mode, seed %" PRIu64 " from CONVWEAVE_CHAOS_SEED",
                    cb->chaos_seed);
        } else {
            cw__log(ctx, CW_LOG_INFO, "cpu backend: chaos mode, seed %" PRIu64 " (CONVWEAVE_CHAOS_SEED=%" PRIu64
                    " reproduces it)", cb->chaos_seed, cb->chaos_seed);
        }
    }
    atomic_fetch_add(&g_backends, 1);
    *out = &cb->base;
    return CW_OK;

fail_cv:
    pthread_mutex_destroy(&cb->mu);
fail_mu:
    cw__free(cb);
    return cw__error(ctx, CW_ERR_BACKEND, "cpu backend: pthread mutex/cond init failed");
}
