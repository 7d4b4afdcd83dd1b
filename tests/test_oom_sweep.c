/* Host-allocation failure sweep (libuv's test-loop-oom): make the n-th allocation fail for
 * n = 1, 2, ... through context creation and the cpu backend's streams, events and queues,
 * until a run where no injected failure triggers. Each failure must be a clean
 * CW_ERR_OUT_OF_MEMORY that leaves nothing behind (ASan's leak check in CI). */
#include <signal.h>
#include <stdatomic.h>
#include <unistd.h>

#include "backend/cpu/cpu.h"
#include "testutil.h"

enum { NS = 3, NE = 3 };

static _Atomic int g_ran, g_fins, g_args; /* closures run / finalised / handed to enqueue */
static int g_own_failed;
static void item_count(void *p) { atomic_fetch_add(&g_ran, 1); }
static void fin_count(void *p) {
    atomic_fetch_add(&g_fins, 1);
    cw__free(p);
}

static void quiet_log(void *user, cw_log_level lvl, const char *msg) {}

/* The first failing call ends a run; returns its status (CW_OK when nothing failed). */
#define STEP(call)                                    \
    do {                                              \
        st = (call);                                  \
        if (st != CW_OK) goto done;                   \
    } while (0)

/* One pass through every allocating backend entry point. */
static cw_status backend_pass(cw__backend *be, cw_context *ctx) {
    cw__stream *s[NS] = {0};
    cw__event *e[NE] = {0};
    void *mem = NULL;
    cw_status st = CW_OK;
    for (int i = 0; i < NS; i++) STEP(be->rt->stream_create(be, &s[i]));
    for (int i = 0; i < NE; i++) STEP(be->rt->event_create(be, &e[i]));
    STEP(be->rt->dev_alloc(be, 4096, &mem));
    STEP(be->rt->fill32_async(be, s[0], mem, 0x7fc00000u, 512));
    STEP(be->rt->event_record(be, e[0], s[0]));
    STEP(be->rt->stream_wait_event(be, s[1], e[0]));
    STEP(be->rt->copy_async(be, s[1], (char *)mem + 2048, mem, 2048));
    STEP(be->rt->event_record(be, e[1], s[1]));
    STEP(be->rt->stream_wait_event(be, s[2], e[1]));
    {
        int *arg = cw__malloc(sizeof *arg);
        if (!arg) { /* the test's own allocation: no library message to check */
            st = CW_ERR_OUT_OF_MEMORY;
            g_own_failed = 1;
            goto done;
        }
        atomic_fetch_add(&g_args, 1);
        STEP(cw__cpu_enqueue(be, s[2], item_count, arg, fin_count)); /* fin frees arg either way */
    }
    STEP(be->rt->launch_host(be, s[2], item_count, NULL));
    STEP(be->rt->event_record(be, e[2], s[2]));
    STEP(be->rt->event_synchronize(be, e[2]));
    if (ctx) {
        cw__stream *cs;
        STEP(cw__context_stream(ctx, 0, &cs));
        STEP(be->rt->copy_async(be, cs, mem, (char *)mem + 2048, 64));
        STEP(be->rt->stream_synchronize(be, cs)); /* cs outlives this pass; mem does not */
    }
done:
    /* queued work still runs (stream_destroy drains), so freeing mem comes last */
    for (int i = 0; i < NE; i++) be->rt->event_destroy(be, e[i]);
    for (int i = 0; i < NS; i++) be->rt->stream_destroy(be, s[i]);
    be->rt->dev_free(be, mem);
    return st;
}

/* Runs one sweep of `pass`; returns the number of runs. */
static int sweep(const char *name, cw_status (*pass)(void)) {
    int64_t t0 = cw__now_ns();
    int failures = 0;
    for (int64_t n = 1;; n++) {
        ASSERT_LE_I(n, 100000); /* an allocation count that never stops growing is a bug */
        int64_t before = cw__test_alloc_count();
        int fins0 = atomic_load(&g_fins), args0 = atomic_load(&g_args), ran0 = atomic_load(&g_ran);
        cw__test_fail_after(n);
        cw_status st = pass();
        /* a closure handed to cw__cpu_enqueue is finalised exactly once, queued or not */
        ASSERT_EQ_I(atomic_load(&g_fins) - fins0, atomic_load(&g_args) - args0);
        int64_t made = cw__test_alloc_count() - before;
        cw__test_fail_after(0);
        if (made < n) { /* the n-th allocation never happened: a clean run */
            if (st != CW_OK) fprintf(stderr, "%s: run %" PRId64 " without injected failure returned %s\n", name, n, cw_status_name(st));
            ASSERT_STATUS(st, CW_OK);
            ASSERT_EQ_I(atomic_load(&g_ran) - ran0, 2); /* the enqueued closure and the host fn ran */
            fprintf(stderr, "%s: %" PRId64 " runs, %d injected failures, %" PRId64 " allocations in a clean run, %.2f s\n",
                    name, n, failures, made, (double)(cw__now_ns() - t0) * 1e-9);
            return (int)n;
        }
        if (st != CW_ERR_OUT_OF_MEMORY)
            fprintf(stderr, "%s: failing allocation #%" PRId64 " gave %s\n", name, n, cw_status_name(st));
        ASSERT_STATUS(st, CW_ERR_OUT_OF_MEMORY);
        failures++;
    }
}

static cw_status pass_backend(void) {
    cw_context_config cfg = CW_CONTEXT_CONFIG_INIT;
    cfg.backend = CW_BACKEND_CPU;
    cfg.flags = CW_FLAG_CHAOS; /* jitter must not change which allocations happen */
    cw__backend *be = NULL, *dry = NULL;
    cw_status st = cw__backend_cpu_create(NULL, &cfg, &be);
    if (st != CW_OK) {
        CHECK(be == NULL);
        return st;
    }
    st = cw__backend_dry_create(be, &dry);
    if (st == CW_OK) {
        st = backend_pass(be, NULL);
        dry->rt->destroy(dry);
    } else {
        CHECK(dry == NULL);
    }
    be->rt->destroy(be);
    return st;
}

static cw_status pass_context(void) {
    cw_context_config cfg = CW_CONTEXT_CONFIG_INIT;
    cfg.backend = CW_BACKEND_CPU;
    cfg.log_fn = quiet_log; /* every run logs its failure; keep the output readable */
    cfg.flags = CW_FLAG_POISON;
    cw_context *ctx = NULL;
    g_own_failed = 0;
    cw_status st = cw_context_create(&ctx, &cfg);
    if (st != CW_OK) {
        CHECK(ctx == NULL);
        return st;
    }
    st = backend_pass(ctx->be, ctx);
    if (st == CW_OK) ASSERT_TRUE(strlen(cw_context_get_last_error(ctx)) == 0);
    else if (!g_own_failed) CHECK(strlen(cw_context_get_last_error(ctx)) > 0); /* the failure says what it was */
    cw_context_destroy(ctx);
    return st;
}

/* A deadlock in the code under test fails fast instead of waiting for ctest's timeout. */
static void watchdog_fire(int sig) {
    static const char msg[] = "watchdog: test still running after 60 s (deadlock?)\n";
    (void)sig;
    if (write(2, msg, sizeof msg - 1) < 0) _exit(2);
    _exit(1);
}
static void watchdog_arm(void) {
    signal(SIGALRM, watchdog_fire);
    alarm(60);
}

int main(void) {
    watchdog_arm();
    int runs_be = sweep("cpu backend", pass_backend);
    int runs_ctx = sweep("context + cpu backend", pass_context);
    /* the sweep must have exercised something: backend, 3 streams, 3 events, 6 queue items... */
    ASSERT_LE_I(15, runs_be);
    ASSERT_LE_I(runs_be, runs_ctx);
    TEST_DONE();
}
