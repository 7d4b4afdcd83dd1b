/* Cross-stream reuse under chaos (cpu backend, >= 200 seeds): stream A writes a block
 * slowly and frees it; stream B, at the cap, is handed the same memory, writes its own
 * pattern and checks it later. A forgotten event wait lets A's late writes land in B's
 * data. The test proves its teeth: with cw__alloc_test_skip_waits some seed must fail. */
#include <stdatomic.h>
#include <time.h>

#include "alloc/alloc.h"
#include "backend/cpu/cpu.h"
#include "testutil.h"

#define BLOCK (INT64_C(64) << 10) /* bytes */

/* Relaxed atomics: the skip-waits run races on purpose, and must not trip TSan. */
typedef struct job {
    _Atomic uint32_t *p;
    int64_t words;
    uint32_t pattern;
    long sleep_before_us, sleep_after_us;
    int check;      /* 1: after sleeping, count words that lost the pattern */
    int64_t bad;    /* written by the worker, read after stream_synchronize */
} job;

static void sleep_us(long us) {
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

static void run_job(void *arg) {
    job *j = arg;
    sleep_us(j->sleep_before_us);
    for (int64_t i = 0; i < j->words; i++)
        atomic_store_explicit(&j->p[i], j->pattern ^ (uint32_t)i, memory_order_relaxed);
    if (!j->check) return;
    sleep_us(j->sleep_after_us);
    for (int64_t i = 0; i < j->words; i++)
        j->bad += atomic_load_explicit(&j->p[i], memory_order_relaxed) != (j->pattern ^ (uint32_t)i);
}

static job writer(void *p, int64_t bytes, uint32_t pattern) {
    job j = {(_Atomic uint32_t *)p, bytes / 4, pattern, 300, 0, 0, 0};
    return j;
}

static job checker(void *p, int64_t bytes, uint32_t pattern) {
    job j = {(_Atomic uint32_t *)p, bytes / 4, pattern, 0, 1500, 1, 0};
    return j;
}

static int64_t g_waits; /* cross-stream waits the allocator made (both scenarios) */

typedef struct rig {
    cw__backend *be;
    cw__stream *s[3];
} rig;

static void rig_open(rig *r, uint64_t seed) {
    cw_context_config cfg = CW_CONTEXT_CONFIG_INIT;
    cfg.backend = CW_BACKEND_CPU;
    cfg.flags = CW_FLAG_CHAOS;
    cfg.chaos_seed = seed;
    cfg.threads = 1;
    ASSERT_OK(cw__backend_cpu_create(NULL, &cfg, &r->be));
    for (int i = 0; i < 3; i++) ASSERT_OK(r->be->rt->stream_create(r->be, &r->s[i]));
}

static void rig_close(rig *r) {
    for (int i = 0; i < 3; i++) r->be->rt->stream_destroy(r->be, r->s[i]);
    r->be->rt->destroy(r->be);
}

static void sync_all(rig *r) {
    for (int i = 0; i < 3; i++) ASSERT_OK(r->be->rt->stream_synchronize(r->be, r->s[i]));
}

/* Scenario 1: one block, written late on A, reused by B. Returns the corrupted words. */
static int64_t scenario_simple(rig *r, int skip) {
    cw__stream *A = r->s[0], *B = r->s[1];
    cw__allocator *a;
    ASSERT_OK(cw__alloc_create(&a, NULL, r->be, NULL, BLOCK, 0));
    cw__alloc_test_skip_waits(a, skip);
    void *p, *q;
    ASSERT_OK(cw__alloc_malloc(a, BLOCK, A, &p));
    job ja = writer(p, BLOCK, 0xA0000000u);
    ASSERT_OK(cw__cpu_enqueue(r->be, A, run_job, &ja, NULL));
    ASSERT_OK(cw__alloc_free(a, p, A));
    ASSERT_OK(cw__alloc_malloc(a, BLOCK, B, &q));
    ASSERT_TRUE(q == p); /* the cap leaves no other memory */
    job jb = checker(q, BLOCK, 0xB0000000u);
    ASSERT_OK(cw__cpu_enqueue(r->be, B, run_job, &jb, NULL));
    ASSERT_OK(cw__alloc_free(a, q, B));
    sync_all(r);
    cw_memory_stats st = {0};
    cw__alloc_stats(a, &st);
    g_waits += st.cross_stream_waits;
    cw__alloc_destroy(a);
    return jb.bad;
}

/* Scenario 2: two halves of one segment written late on A and C are freed there and
 * coalesce; B gets the whole block and must wait for both streams. */
static int64_t scenario_merged(rig *r, int skip) {
    cw__stream *A = r->s[0], *B = r->s[1], *C = r->s[2];
    cw__allocator *a;
    ASSERT_OK(cw__alloc_create(&a, NULL, r->be, NULL, 2 * BLOCK, 0));
    void *whole, *p1, *p2, *q;
    ASSERT_OK(cw__alloc_malloc(a, 2 * BLOCK, A, &whole));
    ASSERT_OK(cw__alloc_free(a, whole, A));
    ASSERT_OK(cw__alloc_malloc(a, BLOCK, A, &p1));
    ASSERT_OK(cw__alloc_malloc(a, BLOCK, C, &p2)); /* waits on A's free: nothing written yet */
    ASSERT_TRUE((char *)p2 == (char *)p1 + BLOCK);
    cw__alloc_test_skip_waits(a, skip);
    job j1 = writer(p1, BLOCK, 0xA1000000u), j2 = writer(p2, BLOCK, 0xC2000000u);
    ASSERT_OK(cw__cpu_enqueue(r->be, A, run_job, &j1, NULL));
    ASSERT_OK(cw__cpu_enqueue(r->be, C, run_job, &j2, NULL));
    ASSERT_OK(cw__alloc_free(a, p1, A));
    ASSERT_OK(cw__alloc_free(a, p2, C));
    ASSERT_OK(cw__alloc_malloc(a, 2 * BLOCK, B, &q));
    ASSERT_TRUE(q == p1);
    job jb = checker(q, 2 * BLOCK, 0xB3000000u);
    ASSERT_OK(cw__cpu_enqueue(r->be, B, run_job, &jb, NULL));
    ASSERT_OK(cw__alloc_free(a, q, B));
    sync_all(r);
    cw_memory_stats st = {0};
    cw__alloc_stats(a, &st);
    g_waits += st.cross_stream_waits;
    cw__alloc_destroy(a);
    return jb.bad;
}

int main(void) {
    uint64_t seed0 = cw_test_seed(7100);
    int seeds = cw_test_quick() ? 64 : 200;
    int fail_on[2] = {0, 0}, fail_off[2] = {0, 0};
    for (int k = 0; k < seeds; k++) {
        uint64_t seed = seed0 + (uint64_t)k;
        rig r;
        rig_open(&r, seed);
        for (int skip = 0; skip <= 1; skip++) {
            int64_t b1 = scenario_simple(&r, skip);
            int64_t b2 = scenario_merged(&r, skip);
            int *f = skip ? fail_on : fail_off;
            f[0] += b1 != 0;
            f[1] += b2 != 0;
            if (!skip && (b1 || b2))
                fprintf(stderr, "chaos seed %" PRIu64 ": %" PRId64 " / %" PRId64 " words of B's data overwritten "
                        "with the waits on\n", seed, b1, b2);
        }
        rig_close(&r);
    }
    fprintf(stderr, "%d seeds: corrupted runs with waits: %d + %d; with waits skipped: %d + %d (%" PRId64
            " cross-stream waits made)\n", seeds, fail_off[0], fail_off[1], fail_on[0], fail_on[1], g_waits);
    ASSERT_EQ_I(fail_off[0], 0);
    ASSERT_EQ_I(fail_off[1], 0);
    /* teeth: the same test must catch the missing wait */
    ASSERT_TRUE(fail_on[0] > 0);
    ASSERT_TRUE(fail_on[1] > 0);
    TEST_DONE();
}
