/* Allocator cases: stream-order policy, fragmentation (release-and-retry), budget errors
 * and their message, device and host allocation failures, poison mode, host-order (NULL)
 * streams, the context's temp allocator, and concurrent use from several host threads. */
#include <pthread.h>

#include "kernels/kernels.h"
#include "test_alloc_fake.h"

#define MiB (INT64_C(1) << 20)
#define KiB (INT64_C(1) << 10)

static cw_memory_stats stats_of(cw__allocator *a) {
    cw_memory_stats s;
    memset(&s, 0, sizeof s);
    cw__alloc_stats(a, &s);
    return s;
}

static void expect_contains(const char *msg, const char *want) {
    if (!strstr(msg, want)) {
        fprintf(stderr, "message \"%s\" lacks \"%s\"\n", msg, want);
        exit(1);
    }
}

static void test_round(void) {
    ASSERT_EQ_I(cw__alloc_round(0), 0);
    ASSERT_EQ_I(cw__alloc_round(-5), 0);
    ASSERT_EQ_I(cw__alloc_round(1), 512);
    ASSERT_EQ_I(cw__alloc_round(512), 512);
    ASSERT_EQ_I(cw__alloc_round(513), 1024);
    ASSERT_EQ_I(cw__alloc_round(3 * MiB + 1), 3 * MiB + 512);
}

/* Same stream: at once. Other stream below the cap: fresh memory rather than a wait. At the
 * cap: the same memory with a wait. After the free completed: the same memory, no wait. */
static void test_stream_policy(cw_context *ctx) {
    fake_backend *f = fk_create(ctx, 2 * MiB);
    cw__stream *s0 = &f->streams[0], *s1 = &f->streams[1];
    cw__allocator *a;
    ASSERT_OK(cw__alloc_create(&a, ctx, &f->base, NULL, 2 * MiB, 0));
    void *p, *q, *r;
    ASSERT_OK(cw__alloc_malloc(a, 700 * KiB, s0, &p));
    fk_use(s0);
    ASSERT_OK(cw__alloc_free(a, p, s0));
    ASSERT_OK(cw__alloc_malloc(a, 700 * KiB, s0, &q));
    ASSERT_TRUE(q == p);
    cw_memory_stats s = stats_of(a);
    ASSERT_EQ_I(s.cache_hits, 1);
    ASSERT_EQ_I(s.cross_stream_waits, 0);
    ASSERT_EQ_I(s.num_device_allocs, 1);
    ASSERT_OK(cw__alloc_free(a, q, s0));
    /* s1, with room in the same segment but the free still pending on s0: the free part of
     * the segment is one coalesced block with s0's pending free, so s1 waits */
    ASSERT_OK(cw__alloc_malloc(a, 700 * KiB, s1, &r));
    ASSERT_TRUE(r == p);
    s = stats_of(a);
    ASSERT_EQ_I(s.cross_stream_waits, 1);
    ASSERT_EQ_I(f->n_waits, 1);
    ASSERT_EQ_I(s.num_device_allocs, 1); /* 2 MiB segment = the budget: no room for another */
    ASSERT_OK(cw__alloc_free(a, r, s1));
    /* the free on s1 completes: s0 takes it with no wait */
    fk_finish_all(f);
    ASSERT_OK(cw__alloc_malloc(a, 700 * KiB, s0, &q));
    ASSERT_TRUE(q == p);
    ASSERT_EQ_I(stats_of(a).cross_stream_waits, 1);
    ASSERT_OK(cw__alloc_free(a, q, s0));
    cw__alloc_destroy(a);
    free(f);

    /* below the cap, another stream gets a fresh segment instead of waiting */
    f = fk_create(ctx, 0);
    ASSERT_OK(cw__alloc_create(&a, ctx, &f->base, NULL, 0, 0));
    ASSERT_OK(cw__alloc_malloc(a, 3 * MiB, &f->streams[0], &p));
    ASSERT_OK(cw__alloc_free(a, p, &f->streams[0]));
    ASSERT_OK(cw__alloc_malloc(a, 3 * MiB, &f->streams[1], &q));
    ASSERT_TRUE(q != p);
    s = stats_of(a);
    ASSERT_EQ_I(s.cross_stream_waits, 0);
    ASSERT_EQ_I(s.num_device_allocs, 2);
    ASSERT_EQ_I(s.budget, 0);
    ASSERT_OK(cw__alloc_free(a, q, &f->streams[1]));
    cw__alloc_destroy(a);
    ASSERT_EQ_I(f->outstanding, 0);
    ASSERT_EQ_I(f->n_events, 0);
    free(f);
}

/* Best fit, then lowest address. */
static void test_choice_order(cw_context *ctx) {
    fake_backend *f = fk_create(ctx, 0);
    cw__stream *s = &f->streams[0];
    cw__allocator *a;
    ASSERT_OK(cw__alloc_create(&a, ctx, &f->base, NULL, 0, 0));
    void *b[6];
    int64_t sz[6] = {64 * KiB, 8 * KiB, 128 * KiB, 8 * KiB, 64 * KiB, 8 * KiB};
    for (int i = 0; i < 6; i++) ASSERT_OK(cw__alloc_malloc(a, sz[i], s, &b[i]));
    for (int i = 1; i < 6; i++) ASSERT_TRUE((char *)b[i] == (char *)b[i - 1] + sz[i - 1]);
    /* free the 64, 128 and 64 KiB blocks (separated by live 8 KiB ones) */
    ASSERT_OK(cw__alloc_free(a, b[4], s));
    ASSERT_OK(cw__alloc_free(a, b[2], s));
    ASSERT_OK(cw__alloc_free(a, b[0], s));
    void *p;
    ASSERT_OK(cw__alloc_malloc(a, 60 * KiB, s, &p));
    ASSERT_TRUE(p == b[0]); /* two 64 KiB fits: the lower address */
    ASSERT_OK(cw__alloc_malloc(a, 100 * KiB, s, &p));
    ASSERT_TRUE(p == b[2]); /* only the 128 KiB block fits */
    cw__alloc_destroy(a); /* live blocks: warns, still returns every segment */
    ASSERT_EQ_I(f->outstanding, 0);
    free(f);
}

/* A sequence that exceeds the cap without release-and-retry (cpu backend). */
static void test_fragmentation(cw_context *ctx) {
    cw_context_config cfg = CW_CONTEXT_CONFIG_INIT;
    cw__backend *be;
    ASSERT_OK(cw__backend_cpu_create(NULL, &cfg, &be));
    cw__stream *A, *B;
    ASSERT_OK(be->rt->stream_create(be, &A));
    ASSERT_OK(be->rt->stream_create(be, &B));
    cw__allocator *a;
    ASSERT_OK(cw__alloc_create(&a, ctx, be, NULL, 6 * MiB, 0));
    /* six 1 MiB requests fill three 2 MiB small-pool segments: the whole budget */
    void *p[6], *big;
    for (int i = 0; i < 6; i++) ASSERT_OK(cw__alloc_malloc(a, MiB, i % 2 ? B : A, &p[i]));
    cw_memory_stats s = stats_of(a);
    ASSERT_EQ_I(s.reserved_bytes_current, 6 * MiB);
    ASSERT_EQ_I(s.num_device_allocs, 3);
    /* keep one segment half used: releasing cannot make room for 5 MiB, so that fails
     * without any host synchronisation */
    for (int i = 0; i < 5; i++) ASSERT_OK(cw__alloc_free(a, p[i], i % 2 ? B : A));
    int64_t syncs0 = be->rt->host_syncs(be);
    ASSERT_STATUS(cw__alloc_malloc(a, 5 * MiB, A, &big), CW_ERR_BUDGET);
    s = stats_of(a);
    ASSERT_EQ_I(s.host_syncs, 0);
    ASSERT_EQ_I(s.num_device_frees, 0);
    ASSERT_EQ_I(s.budget_failures, 1);
    /* 4 MiB: no free block that large and no room, but two whole cached segments: the
     * allocator releases them (synchronising their free events) and retries */
    ASSERT_OK(cw__alloc_malloc(a, 4 * MiB, B, &big));
    s = stats_of(a);
    ASSERT_TRUE(s.host_syncs > 0);
    ASSERT_EQ_I(be->rt->host_syncs(be) - syncs0, s.host_syncs); /* each one a real backend sync */
    ASSERT_EQ_I(s.num_device_frees, 2);
    ASSERT_EQ_I(s.reserved_bytes_current, 6 * MiB);
    ASSERT_LE_I(s.reserved_bytes_peak, 6 * MiB);
    ASSERT_EQ_I(s.allocated_bytes_current, 5 * MiB);
    ASSERT_EQ_I(s.budget_failures, 1);
    ASSERT_OK(cw__alloc_free(a, big, B));
    ASSERT_OK(cw__alloc_free(a, p[5], B));
    /* explicit release returns everything */
    ASSERT_OK(cw__alloc_release_cached(a));
    ASSERT_EQ_I(stats_of(a).reserved_bytes_current, 0);
    cw__alloc_destroy(a);
    be->rt->stream_destroy(be, A);
    be->rt->stream_destroy(be, B);
    be->rt->destroy(be);
}

/* Requests over the budget fail cleanly, with a message naming the request, the budget,
 * the bytes in use and the largest free block; the allocator stays usable. Runs on the
 * context's own temp allocator, created through the public API. */
static void test_budget_errors(void) {
    cw_context_config cfg = CW_CONTEXT_CONFIG_INIT;
    cfg.backend = CW_BACKEND_CPU;
    cfg.temp_budget = 4 * MiB;
    cfg.log_fn = fk_quiet_log;
    cw_context *ctx;
    ASSERT_OK(cw_context_create(&ctx, &cfg));
    cw__stream *s;
    ASSERT_OK(cw__context_stream(ctx, 0, &s));
    cw__allocator *a = ctx->temp;
    void *p, *q;
    ASSERT_STATUS(cw__alloc_malloc(a, 5 * MiB, s, &q), CW_ERR_BUDGET);
    ASSERT_TRUE(q == NULL);
    const char *msg = cw_context_get_last_error(ctx);
    expect_contains(msg, "5242880 bytes");
    expect_contains(msg, "budget 4194304 bytes");
    expect_contains(msg, "0 bytes in use");
    expect_contains(msg, "largest free block 0 bytes");

    ASSERT_OK(cw__alloc_malloc(a, MiB, s, &p)); /* 2 MiB segment, 1 MiB free in it */
    ASSERT_STATUS(cw__alloc_malloc(a, 3 * MiB, s, &q), CW_ERR_BUDGET);
    msg = cw_context_get_last_error(ctx);
    expect_contains(msg, "3145728 bytes");
    expect_contains(msg, "budget 4194304 bytes");
    expect_contains(msg, "1048576 bytes in use");
    expect_contains(msg, "largest free block 1048576 bytes");

    cw_memory_stats ms;
    ASSERT_OK(cw_context_get_memory_stats(ctx, &ms));
    ASSERT_EQ_I(ms.budget, 4 * MiB);
    ASSERT_EQ_I(ms.budget_failures, 2);
    ASSERT_EQ_I(ms.allocated_bytes_current, MiB);
    ASSERT_EQ_I(ms.reserved_bytes_current, 2 * MiB);
    ASSERT_EQ_I(ms.num_allocs, 1);

    /* still usable: 2 MiB fits next to the small segment */
    ASSERT_OK(cw__alloc_malloc(a, 2 * MiB, s, &q));
    ASSERT_OK(cw__alloc_free(a, q, s));
    ASSERT_OK(cw__alloc_free(a, p, s));

    /* bad arguments */
    ASSERT_STATUS(cw__alloc_malloc(a, -1, s, &q), CW_ERR_INVALID_ARG);
    expect_contains(cw_context_get_last_error(ctx), "-1");
    ASSERT_OK(cw__alloc_malloc(a, 0, s, &q));
    ASSERT_TRUE(q == NULL);
    ASSERT_OK(cw__alloc_free(a, NULL, s));
    ASSERT_STATUS(cw__alloc_free(a, p, s), CW_ERR_INVALID_ARG); /* double free */
    ASSERT_STATUS(cw__alloc_free(a, (char *)q + 4096, s), CW_ERR_INVALID_ARG);
    ASSERT_STATUS(cw__alloc_malloc(a, INT64_MAX, s, &q), CW_ERR_BUDGET);

    /* peaks reset to the current values */
    ASSERT_OK(cw_context_get_memory_stats(ctx, &ms));
    ASSERT_EQ_I(ms.allocated_bytes_peak, 3 * MiB);
    cw_context_reset_peak_stats(ctx);
    ASSERT_OK(cw_context_get_memory_stats(ctx, &ms));
    ASSERT_EQ_I(ms.allocated_bytes_peak, 0);
    ASSERT_EQ_I(ms.reserved_bytes_peak, ms.reserved_bytes_current);
    cw_context_destroy(ctx);
}

/* dev_alloc failures: a clean status, nothing leaked, the allocator still usable. */
static void test_device_failure(cw_context *ctx) {
    fake_backend *f = fk_create(ctx, 0);
    cw__stream *s = &f->streams[0];
    cw__allocator *a;
    ASSERT_OK(cw__alloc_create(&a, ctx, &f->base, NULL, 0, 0));
    void *p, *q;
    /* the preferred segment and the exact-size one both fail, nothing is cached: a clean
     * OOM that names the request, with no stats touched and nothing held */
    f->fail_dev_alloc = 2;
    ASSERT_STATUS(cw__alloc_malloc(a, 3 * MiB, s, &q), CW_ERR_OUT_OF_MEMORY);
    ASSERT_TRUE(q == NULL);
    expect_contains(cw_context_get_last_error(ctx), "3145728 bytes");
    cw_memory_stats after = stats_of(a);
    ASSERT_EQ_I(after.num_allocs, 0);
    ASSERT_EQ_I(after.allocated_bytes_current, 0);
    ASSERT_EQ_I(after.reserved_bytes_current, 0);
    ASSERT_EQ_I(after.budget_failures, 0);
    ASSERT_EQ_I(f->outstanding, 0);
    /* only the preferred 2 MiB segment fails: the exact-size one serves the request */
    f->fail_dev_alloc = 1;
    ASSERT_OK(cw__alloc_malloc(a, 100 * KiB, s, &p));
    ASSERT_EQ_I(stats_of(a).reserved_bytes_current, 100 * KiB);
    ASSERT_OK(cw__alloc_free(a, p, s));
    /* both fail again, but a whole segment is cached: the allocator releases it (a host
     * sync of its pending free event) and retries */
    f->fail_dev_alloc = 2;
    ASSERT_OK(cw__alloc_malloc(a, 3 * MiB, s, &q));
    after = stats_of(a);
    ASSERT_EQ_I(after.num_device_frees, 1);
    ASSERT_EQ_I(after.host_syncs, 1);
    ASSERT_EQ_I(after.reserved_bytes_current, 4 * MiB);
    ASSERT_EQ_I(after.reserved_bytes_current, f->outstanding);
    /* event creation fails at a free: the allocator synchronises the stream instead, and
     * the block is then free for every stream at once */
    fk_use(s);
    cw__allocator *b;
    ASSERT_OK(cw__alloc_create(&b, ctx, &f->base, NULL, 0, 0)); /* fresh: its event pool is empty */
    ASSERT_OK(cw__alloc_malloc(b, 64 * KiB, s, &p));
    fk_use(s);
    f->fail_event_create = 1;
    int64_t syncs = f->n_syncs;
    ASSERT_OK(cw__alloc_free(b, p, s));
    ASSERT_EQ_I(f->n_syncs, syncs + 1);
    ASSERT_EQ_I(f->streams[0].done, f->streams[0].queued);
    ASSERT_EQ_I(stats_of(b).host_syncs, 1);
    ASSERT_OK(cw__alloc_malloc(b, 64 * KiB, &f->streams[1], &p));
    ASSERT_EQ_I(stats_of(b).cross_stream_waits, 0);
    ASSERT_OK(cw__alloc_free(b, p, &f->streams[1]));
    cw__alloc_destroy(b);
    ASSERT_OK(cw__alloc_free(a, q, s));
    cw__alloc_destroy(a);
    ASSERT_EQ_I(f->outstanding, 0);
    ASSERT_EQ_I(f->n_events, 0);
    free(f);
}

/* One run of allocations across pools and streams, frees (events), a release. Returns 1
 * when a host-allocation failure surfaced (always as a clean CW_ERR_OUT_OF_MEMORY). */
static int sweep_run(cw_context *ctx, cw__backend *be, cw__stream *A, cw__stream *B) {
    cw__allocator *a = NULL;
    cw_status st = cw__alloc_create(&a, ctx, be, NULL, 16 * MiB, 0);
    if (st != CW_OK) {
        ASSERT_EQ_I(st, CW_ERR_OUT_OF_MEMORY);
        ASSERT_TRUE(a == NULL);
        return 1;
    }
    int failed = 0;
    void *p[4] = {0};
    int64_t sz[4] = {100 * KiB, 3 * MiB, 700 * KiB, 3 * MiB};
    for (int i = 0; i < 4 && !failed; i++) {
        st = cw__alloc_malloc(a, sz[i], i % 2 ? B : A, &p[i]);
        if (st != CW_OK) {
            ASSERT_EQ_I(st, CW_ERR_OUT_OF_MEMORY);
            ASSERT_TRUE(p[i] == NULL);
            failed = 1;
        }
    }
    for (int i = 0; i < 4; i++)
        if (p[i]) ASSERT_OK(cw__alloc_free(a, p[i], i % 2 ? A : B)); /* frees fall back, never fail */
    void *q = NULL;
    st = cw__alloc_malloc(a, 100 * KiB, B, &q); /* reuses the blocks freed on B */
    if (st != CW_OK) {
        ASSERT_EQ_I(st, CW_ERR_OUT_OF_MEMORY);
        failed = 1;
    } else {
        ASSERT_OK(cw__alloc_free(a, q, B));
    }
    st = cw__alloc_release_cached(a);
    ASSERT_EQ_I(st, CW_OK);
    cw__test_fail_after(0);
    cw_memory_stats s = stats_of(a);
    ASSERT_EQ_I(s.allocated_bytes_current, 0);
    ASSERT_EQ_I(s.num_allocs, s.num_frees);
    ASSERT_EQ_I(s.reserved_bytes_current, 0);
    /* usable after the failure */
    ASSERT_OK(cw__alloc_malloc(a, 3 * MiB, A, &q));
    ASSERT_OK(cw__alloc_free(a, q, A));
    cw__alloc_destroy(a);
    return failed;
}

/* Host-allocation failure sweep (cpu backend, whose dev_alloc, events and queue items all
 * go through cw__malloc): fail the k-th allocation for every k of a clean run. */
static void test_host_failure_sweep(cw_context *ctx) {
    cw_context_config cfg = CW_CONTEXT_CONFIG_INIT;
    cw__backend *be;
    ASSERT_OK(cw__backend_cpu_create(ctx, &cfg, &be)); /* ctx: its injected failures log quietly */
    cw__stream *A, *B;
    ASSERT_OK(be->rt->stream_create(be, &A));
    ASSERT_OK(be->rt->stream_create(be, &B));
    int64_t c0 = cw__test_alloc_count();
    ASSERT_EQ_I(sweep_run(ctx, be, A, B), 0);
    int64_t calls = cw__test_alloc_count() - c0;
    int failures = 0;
    for (int64_t k = 1; k <= calls; k++) {
        ASSERT_OK(be->rt->stream_synchronize(be, A)); /* settle: no worker frees mid-count */
        ASSERT_OK(be->rt->stream_synchronize(be, B));
        cw__test_fail_after(k);
        failures += sweep_run(ctx, be, A, B);
        cw__test_fail_after(0);
    }
    fprintf(stderr, "host failure sweep: %" PRId64 " allocation points, %d surfaced as CW_ERR_OUT_OF_MEMORY\n",
            calls, failures);
    ASSERT_TRUE(failures > 0);
    be->rt->stream_destroy(be, A);
    be->rt->stream_destroy(be, B);
    be->rt->destroy(be);
}

/* Poison: once free in stream order, the block reads as NaN words. */
static void test_poison(void) {
    cw_context_config cfg = CW_CONTEXT_CONFIG_INIT;
    cw__backend *be;
    ASSERT_OK(cw__backend_cpu_create(NULL, &cfg, &be));
    cw__stream *A;
    ASSERT_OK(be->rt->stream_create(be, &A));
    cw__allocator *a;
    ASSERT_OK(cw__alloc_create(&a, NULL, be, NULL, 0, CW__ALLOC_POISON));
    void *p;
    ASSERT_OK(cw__alloc_malloc(a, 10000, A, &p));
    ASSERT_OK(be->rt->fill32_async(be, A, p, 0x3f800000u, 10000 / 4)); /* 1.0f */
    ASSERT_OK(cw__alloc_free(a, p, A));
    ASSERT_OK(be->rt->stream_synchronize(be, A));
    const uint32_t *w = p; /* still cached, so still ours to read */
    for (int64_t i = 0; i < cw__alloc_round(10000) / 4; i++) ASSERT_EQ_I(w[i], CW_POISON_NAN_BITS);
    float f;
    memcpy(&f, w, sizeof f);
    ASSERT_TRUE(isnan(f));
    cw__alloc_destroy(a);
    be->rt->stream_destroy(be, A);
    be->rt->destroy(be);
}

/* NULL stream = host order: a NULL free records nothing; a NULL malloc synchronises. */
static void test_host_order(cw_context *ctx) {
    fake_backend *f = fk_create(ctx, 2 * MiB);
    cw__stream *s0 = &f->streams[0];
    cw__allocator *a;
    ASSERT_OK(cw__alloc_create(&a, ctx, &f->base, NULL, 2 * MiB, 0));
    void *p, *q;
    ASSERT_OK(cw__alloc_malloc(a, MiB, s0, &p));
    int64_t pos = fk_use(s0);
    ASSERT_OK(cw__alloc_free(a, p, s0));
    ASSERT_OK(cw__alloc_malloc(a, 2 * MiB, NULL, &q)); /* whole segment: must wait on s0 */
    ASSERT_TRUE(q == p);
    ASSERT_TRUE(f->streams[0].done >= pos);
    ASSERT_EQ_I(stats_of(a).host_syncs, 1);
    ASSERT_EQ_I(f->n_syncs, 1);
    int64_t records = f->n_records;
    ASSERT_OK(cw__alloc_free(a, q, NULL));
    ASSERT_EQ_I(f->n_records, records);
    ASSERT_OK(cw__alloc_malloc(a, 2 * MiB, &f->streams[2], &q));
    ASSERT_EQ_I(stats_of(a).cross_stream_waits, 0);
    ASSERT_OK(cw__alloc_free(a, q, &f->streams[2]));
    cw__alloc_destroy(a);
    ASSERT_EQ_I(f->outstanding, 0);
    free(f);
}

/* Several host threads at once (dry backend): the mutex keeps the books straight. */
typedef struct thr_arg {
    cw__allocator *a;
    cw__stream *s;
    uint64_t seed;
    int iters;
} thr_arg;

static void *thr_main(void *p) {
    thr_arg *t = p;
    cw_rng r = {t->seed};
    void *held[8] = {0};
    for (int i = 0; i < t->iters; i++) {
        int k = (int)cw_rng_range(&r, 0, 7);
        if (held[k]) {
            ASSERT_OK(cw__alloc_free(t->a, held[k], t->s));
            held[k] = NULL;
        } else {
            cw_status st = cw__alloc_malloc(t->a, cw_rng_range(&r, 1, 3 * MiB), t->s, &held[k]);
            ASSERT_TRUE(st == CW_OK || st == CW_ERR_BUDGET);
        }
    }
    for (int k = 0; k < 8; k++)
        if (held[k]) ASSERT_OK(cw__alloc_free(t->a, held[k], t->s));
    return NULL;
}

static void test_threads(cw_context *ctx, uint64_t seed) {
    cw_context_config cfg = CW_CONTEXT_CONFIG_INIT;
    cw__backend *cpu, *dry;
    ASSERT_OK(cw__backend_cpu_create(NULL, &cfg, &cpu));
    ASSERT_OK(cw__backend_dry_create(cpu, &dry));
    cw__allocator *a;
    ASSERT_OK(cw__alloc_create(&a, ctx, dry, NULL, 32 * MiB, 0));
    enum { NT = 3 };
    pthread_t th[NT];
    thr_arg args[NT];
    for (int i = 0; i < NT; i++) {
        ASSERT_OK(dry->rt->stream_create(dry, &args[i].s));
        args[i].a = a;
        args[i].seed = seed + (uint64_t)i;
        args[i].iters = cw_test_quick() ? 5000 : 20000;
        ASSERT_TRUE(pthread_create(&th[i], NULL, thr_main, &args[i]) == 0);
    }
    for (int i = 0; i < NT; i++) pthread_join(th[i], NULL);
    cw_memory_stats s = stats_of(a);
    ASSERT_EQ_I(s.allocated_bytes_current, 0);
    ASSERT_EQ_I(s.num_allocs, s.num_frees);
    ASSERT_LE_I(s.reserved_bytes_peak, 32 * MiB);
    cw__alloc_destroy(a);
    dry->rt->destroy(dry);
    cpu->rt->destroy(cpu);
}

int main(void) {
    uint64_t seed = cw_test_seed(99);
    cw_context *ctx = fk_context();
    test_round();
    test_stream_policy(ctx);
    test_choice_order(ctx);
    test_fragmentation(ctx);
    test_budget_errors();
    test_device_failure(ctx);
    test_host_failure_sweep(ctx);
    test_poison();
    test_host_order(ctx);
    test_threads(ctx, seed);
    cw_context_destroy(ctx);
    TEST_DONE();
}
