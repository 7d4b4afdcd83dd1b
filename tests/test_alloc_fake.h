/* A test-local fake backend for the allocator tests: fake addresses, and streams modelled
 * as counters with vector clocks, so a test can prove every reuse was ordered after the
 * previous use (the allocator never dereferences memory). Events complete only when the
 * test advances the streams, or when the host synchronises. */
#ifndef CW_TEST_ALLOC_FAKE_H
#define CW_TEST_ALLOC_FAKE_H

#include "alloc/alloc.h"
#include "testutil.h"

#define FK_STREAMS 4
#define FK_MAX_SEGS 4096

/* A stream: work items at positions 1..queued, done of them finished. vc[i]: the position
 * on stream i that this stream's later work is known to run after (happens-before). */
struct cw__stream {
    int id;
    int64_t queued, done;
    int64_t vc[FK_STREAMS];
    /* wait items not yet passed: at position pos, needs done[i] >= req[i] for all i */
    int64_t wait_pos[4096];
    int64_t wait_req[4096][FK_STREAMS];
    int n_waits, first_wait;
};

struct cw__event {
    int sid;             /* -1: never recorded */
    int64_t target;
    int64_t vc[FK_STREAMS];
};

typedef struct fk_seg {
    uintptr_t addr;
    int64_t size;
} fk_seg;

typedef struct fake_backend {
    cw__backend base;
    cw__stream streams[FK_STREAMS];
    int64_t budget;           /* dev_alloc asserts outstanding bytes never exceed it (0: off) */
    int64_t outstanding, peak;
    int64_t n_dev_alloc, n_dev_free, n_waits, n_syncs, n_records, n_fills, n_events;
    int fail_dev_alloc;       /* >0: the next this-many dev_allocs fail with OOM */
    int fail_event_create;    /* >0: the next this-many event_creates fail */
    int64_t cap_violations;
    uintptr_t next_addr;
    fk_seg segs[FK_MAX_SEGS];
    int n_segs;
    /* called at dev_free with the segment, so a test can check nothing there is in flight */
    void (*on_dev_free)(void *user, uintptr_t addr, int64_t size);
    void *user;
} fake_backend;

static inline fake_backend *fk_of(cw__backend *be) { return (fake_backend *)be; }

/* Moves s's done forward by up to k items, stopping at a wait whose requirement is unmet. */
static inline void fk_advance(fake_backend *f, cw__stream *s, int64_t k) {
    while (k-- > 0 && s->done < s->queued) {
        int64_t next = s->done + 1;
        if (s->first_wait < s->n_waits && s->wait_pos[s->first_wait] == next) {
            for (int i = 0; i < FK_STREAMS; i++)
                if (f->streams[i].done < s->wait_req[s->first_wait][i]) return;
            s->first_wait++;
            if (s->first_wait == s->n_waits) s->first_wait = s->n_waits = 0;
        }
        s->done = next;
    }
}

/* Runs every stream until s has finished position target (waits refer to earlier
 * recordings, so this always terminates). */
static inline void fk_drain_until(fake_backend *f, cw__stream *s, int64_t target) {
    while (s->done < target) {
        int64_t before = 0, after = 0;
        for (int i = 0; i < FK_STREAMS; i++) before += f->streams[i].done;
        for (int i = 0; i < FK_STREAMS; i++) fk_advance(f, &f->streams[i], INT64_MAX);
        for (int i = 0; i < FK_STREAMS; i++) after += f->streams[i].done;
        ASSERT_TRUE(after > before); /* no progress would be a deadlock in the model */
    }
}

/* Appends a wait item on s that needs vc (adds happens-before edges). */
static inline void fk_push_wait(cw__stream *s, const int64_t *vc) {
    if (s->n_waits == 4096 && s->first_wait > 0) { /* compact the queue */
        int n = s->n_waits - s->first_wait;
        memmove(s->wait_pos, s->wait_pos + s->first_wait, (size_t)n * sizeof s->wait_pos[0]);
        memmove(s->wait_req, s->wait_req + s->first_wait, (size_t)n * sizeof s->wait_req[0]);
        s->first_wait = 0;
        s->n_waits = n;
    }
    ASSERT_TRUE(s->n_waits < 4096);
    s->wait_pos[s->n_waits] = ++s->queued;
    for (int i = 0; i < FK_STREAMS; i++) {
        s->wait_req[s->n_waits][i] = vc[i];
        if (vc[i] > s->vc[i]) s->vc[i] = vc[i];
    }
    s->n_waits++;
}

/* One unit of work on s (a kernel using a block); returns its position. */
static inline int64_t fk_use(cw__stream *s) { return ++s->queued; }

/* The user orders `later` after everything queued so far on `earlier` (an event + wait the
 * scheduler would make; not counted as an allocator wait). */
static inline void fk_user_order(fake_backend *f, cw__stream *later, cw__stream *earlier) {
    int64_t vc[FK_STREAMS];
    memcpy(vc, earlier->vc, sizeof vc);
    vc[earlier->id] = earlier->queued;
    fk_push_wait(later, vc);
}

static inline void fk_destroy(cw__backend *be) {}

static inline cw_status fk_dev_alloc(cw__backend *be, int64_t bytes, void **out) {
    fake_backend *f = fk_of(be);
    *out = NULL;
    if (f->fail_dev_alloc > 0) {
        f->fail_dev_alloc--;
        return CW_ERR_OUT_OF_MEMORY;
    }
    if (bytes <= 0 || bytes % 512 != 0) return CW_ERR_INVALID_ARG;
    if (f->budget > 0 && f->outstanding + bytes > f->budget) f->cap_violations++;
    ASSERT_TRUE(f->n_segs < FK_MAX_SEGS);
    f->segs[f->n_segs].addr = f->next_addr;
    f->segs[f->n_segs].size = bytes;
    f->n_segs++;
    *out = (void *)f->next_addr;
    /* a gap after every segment, so no bug can treat two segments as one range */
    f->next_addr += (uintptr_t)((bytes + 4095) / 4096 * 4096 + 4096);
    f->outstanding += bytes;
    if (f->outstanding > f->peak) f->peak = f->outstanding;
    f->n_dev_alloc++;
    return CW_OK;
}

static inline void fk_dev_free(cw__backend *be, void *p) {
    fake_backend *f = fk_of(be);
    for (int i = 0; i < f->n_segs; i++) {
        if (f->segs[i].addr == (uintptr_t)p) {
            if (f->on_dev_free) f->on_dev_free(f->user, f->segs[i].addr, f->segs[i].size);
            f->outstanding -= f->segs[i].size;
            f->segs[i] = f->segs[--f->n_segs];
            f->n_dev_free++;
            return;
        }
    }
    fprintf(stderr, "fake backend: dev_free of unknown pointer %p\n", p);
    exit(1);
}

static inline cw_status fk_copy(cw__backend *be, void *d, const void *s, int64_t n) { return CW_OK; }
static inline cw_status fk_fill32_async(cw__backend *be, cw__stream *s, void *p, uint32_t pattern, int64_t count) {
    fk_of(be)->n_fills++;
    fk_use(s);
    return CW_OK;
}
static inline cw_status fk_stream_create(cw__backend *be, cw__stream **out) { return CW_ERR_UNSUPPORTED; }
static inline void fk_stream_destroy(cw__backend *be, cw__stream *s) {}

static inline cw_status fk_event_create(cw__backend *be, cw__event **out) {
    fake_backend *f = fk_of(be);
    if (f->fail_event_create > 0) {
        f->fail_event_create--;
        return CW_ERR_OUT_OF_MEMORY;
    }
    cw__event *e = calloc(1, sizeof *e);
    ASSERT_TRUE(e != NULL);
    e->sid = -1;
    f->n_events++;
    *out = e;
    return CW_OK;
}
static inline void fk_event_destroy(cw__backend *be, cw__event *e) {
    fk_of(be)->n_events--;
    free(e);
}
static inline cw_status fk_event_record(cw__backend *be, cw__event *e, cw__stream *s) {
    fk_of(be)->n_records++;
    e->sid = s->id;
    e->target = ++s->queued;
    memcpy(e->vc, s->vc, sizeof e->vc);
    e->vc[s->id] = e->target;
    return CW_OK;
}
static inline cw_status fk_stream_wait_event(cw__backend *be, cw__stream *s, cw__event *e) {
    fk_of(be)->n_waits++;
    if (e->sid >= 0) fk_push_wait(s, e->vc);
    return CW_OK;
}
static inline cw_status fk_event_query(cw__backend *be, cw__event *e, int *done) {
    *done = e->sid < 0 || fk_of(be)->streams[e->sid].done >= e->target;
    return CW_OK;
}
static inline cw_status fk_event_synchronize(cw__backend *be, cw__event *e) {
    fake_backend *f = fk_of(be);
    f->n_syncs++;
    if (e->sid >= 0) fk_drain_until(f, &f->streams[e->sid], e->target);
    return CW_OK;
}
static inline cw_status fk_stream_synchronize(cw__backend *be, cw__stream *s) {
    fake_backend *f = fk_of(be);
    f->n_syncs++;
    fk_drain_until(f, s, s->queued);
    return CW_OK;
}
static inline int64_t fk_host_syncs(cw__backend *be) { return fk_of(be)->n_syncs; }

static const cw__runtime_i fk_rt = {
    .name = "fake",
    .destroy = fk_destroy,
    .dev_alloc = fk_dev_alloc,
    .dev_free = fk_dev_free,
    .upload = fk_copy,
    .download = fk_copy,
    .fill32_async = fk_fill32_async,
    .stream_create = fk_stream_create,
    .stream_destroy = fk_stream_destroy,
    .event_create = fk_event_create,
    .event_destroy = fk_event_destroy,
    .event_record = fk_event_record,
    .stream_wait_event = fk_stream_wait_event,
    .event_query = fk_event_query,
    .event_synchronize = fk_event_synchronize,
    .stream_synchronize = fk_stream_synchronize,
    .host_syncs = fk_host_syncs,
};

/* Heap-allocated (the stream wait queues are large). */
static inline fake_backend *fk_create(cw_context *ctx, int64_t budget) {
    fake_backend *f = calloc(1, sizeof *f);
    ASSERT_TRUE(f != NULL);
    f->base.rt = &fk_rt;
    f->base.ctx = ctx;
    f->budget = budget;
    f->next_addr = (uintptr_t)1 << 40;
    for (int i = 0; i < FK_STREAMS; i++) f->streams[i].id = i;
    return f;
}

/* Finishes all queued work (without counting a host sync). */
static inline void fk_finish_all(fake_backend *f) {
    for (int i = 0; i < FK_STREAMS; i++) fk_drain_until(f, &f->streams[i], f->streams[i].queued);
}

/* A context only for its error message (cpu backend; it never runs work here). */
static inline void fk_quiet_log(void *user, cw_log_level lvl, const char *msg) {}
static inline cw_context *fk_context(void) {
    cw_context_config cfg = CW_CONTEXT_CONFIG_INIT;
    cfg.backend = CW_BACKEND_CPU;
    cfg.log_fn = fk_quiet_log;
    cw_context *ctx = NULL;
    ASSERT_OK(cw_context_create(&ctx, &cfg));
    return ctx;
}

#endif
