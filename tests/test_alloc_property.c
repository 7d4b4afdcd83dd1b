/* Property test of the budgeted allocator: >= 100,000 seeded random alloc/free operations
 * on 3 streams over a fake backend. A shadow map proves live blocks never overlap, every
 * reuse is ordered after the memory's previous use (vector clocks), no segment is released
 * while in flight, reserved <= budget at every device allocation, failures are not
 * spurious, and every stat equals an independent count. */
#include "test_alloc_fake.h"

#define NS 3
#define MAX_LIVE 128
#define MAX_HIST 200000

typedef struct live {
    uintptr_t p;
    int64_t n;
    int sid;
    int64_t last_use; /* position of its last use on stream sid */
} live;

/* A past use of memory [p, p+n) on stream sid at position q, not yet known complete. */
typedef struct hist {
    uintptr_t p;
    int64_t n;
    int sid;
    int64_t q;
} hist;

static live g_live[MAX_LIVE];
static int g_nlive;
static hist g_hist[MAX_HIST];
static int g_nhist;
static fake_backend *g_f;
static int64_t g_budget; /* of the configuration being run */

static int overlaps(uintptr_t a, int64_t an, uintptr_t b, int64_t bn) {
    return a < b + (uintptr_t)bn && b < a + (uintptr_t)an;
}

static void hist_add(uintptr_t p, int64_t n, int sid, int64_t q) {
    ASSERT_TRUE(g_nhist < MAX_HIST);
    g_hist[g_nhist++] = (hist){p, n, sid, q};
}

static void hist_prune(void) {
    int k = 0;
    for (int i = 0; i < g_nhist; i++)
        if (g_f->streams[g_hist[i].sid].done < g_hist[i].q) g_hist[k++] = g_hist[i];
    g_nhist = k;
}

/* The allocator may only give a segment back when nothing queued still uses it. */
static void on_dev_free(void *user, uintptr_t addr, int64_t size) {
    for (int i = 0; i < g_nlive; i++)
        if (overlaps(addr, size, g_live[i].p, g_live[i].n)) {
            fprintf(stderr, "segment %#" PRIxPTR " released with a live block %#" PRIxPTR "\n", addr, g_live[i].p);
            exit(1);
        }
    int k = 0;
    for (int i = 0; i < g_nhist; i++) {
        hist *h = &g_hist[i];
        if (!overlaps(addr, size, h->p, h->n)) {
            g_hist[k++] = *h;
            continue;
        }
        if (g_f->streams[h->sid].done < h->q) {
            fprintf(stderr, "segment %#" PRIxPTR " released while stream %d still uses it (done %" PRId64
                    " < %" PRId64 ")\n", addr, h->sid, g_f->streams[h->sid].done, h->q);
            exit(1);
        }
    }
    g_nhist = k;
}

static int64_t round512(int64_t b) { return (b + 511) / 512 * 512; }

static int64_t rand_size(cw_rng *r) {
    int64_t u = cw_rng_range(r, 0, 99);
    if (u < 55) return cw_rng_range(r, 1, 64 << 10);
    if (u < 80) return cw_rng_range(r, (64 << 10) + 1, 1 << 20);
    if (u < 95) return cw_rng_range(r, (1 << 20) + 1, 6 << 20);
    if (u < 99) return cw_rng_range(r, (6 << 20) + 1, 20 << 20);
    return cw_rng_range(r, 20 << 20, 30 << 20); /* some exceed the budget outright */
}

typedef struct expect {
    int64_t allocs, frees, cur, peak, hits, budget_failures;
} expect;

static void check_stats(cw__allocator *a, const expect *e, int64_t op, int poison) {
    cw_memory_stats s;
    memset(&s, 0, sizeof s);
    cw__alloc_stats(a, &s);
    if (g_f->cap_violations) {
        fprintf(stderr, "op %" PRId64 ": dev_alloc went over the budget\n", op);
        exit(1);
    }
    ASSERT_EQ_I(s.budget, g_budget);
    ASSERT_LE_I(s.reserved_bytes_current, g_budget);
    ASSERT_LE_I(s.reserved_bytes_peak, g_budget);
    ASSERT_EQ_I(s.reserved_bytes_current, g_f->outstanding);
    ASSERT_EQ_I(s.reserved_bytes_peak, g_f->peak);
    ASSERT_EQ_I(s.allocated_bytes_current, e->cur);
    ASSERT_EQ_I(s.allocated_bytes_peak, e->peak);
    ASSERT_EQ_I(s.num_allocs, e->allocs);
    ASSERT_EQ_I(s.num_frees, e->frees);
    ASSERT_EQ_I(s.cache_hits, e->hits);
    ASSERT_EQ_I(s.num_device_allocs, g_f->n_dev_alloc);
    ASSERT_EQ_I(s.num_device_frees, g_f->n_dev_free);
    ASSERT_EQ_I(s.cross_stream_waits, g_f->n_waits);
    ASSERT_EQ_I(s.host_syncs, g_f->n_syncs);
    ASSERT_EQ_I(s.budget_failures, e->budget_failures);
    ASSERT_EQ_I(s.activations_bytes_current, 0); /* not the allocator's field: untouched */
    if (poison) ASSERT_EQ_I(g_f->n_fills, e->frees); /* one NaN fill per free, on its stream */
}

/* After CW_ERR_BUDGET for n bytes: no free gap of n bytes inside any segment (free
 * neighbours always coalesce with 3 streams), and no room for an n-byte segment even
 * after releasing every fully free segment. */
static void check_failure_genuine(int64_t n, int64_t op) {
    int64_t free_segs = 0;
    for (int si = 0; si < g_f->n_segs; si++) {
        fk_seg *g = &g_f->segs[si];
        uintptr_t lo = g->addr, end = g->addr + (uintptr_t)g->size;
        int any = 0;
        /* walk the live blocks of g in address order (selection by next start) */
        for (;;) {
            uintptr_t next = end;
            int64_t nn = 0;
            for (int i = 0; i < g_nlive; i++)
                if (g_live[i].p >= lo && g_live[i].p < next) {
                    next = g_live[i].p;
                    nn = g_live[i].n;
                }
            if ((int64_t)(next - lo) >= n) {
                fprintf(stderr, "op %" PRId64 ": budget failure for %" PRId64 " bytes with a free gap of %" PRId64
                        " bytes in segment %#" PRIxPTR "\n", op, n, (int64_t)(next - lo), g->addr);
                exit(1);
            }
            if (next == end) break;
            any = 1;
            lo = next + (uintptr_t)nn;
        }
        if (!any) free_segs += g->size;
    }
    if (g_budget - g_f->outstanding + free_segs >= n) {
        fprintf(stderr, "op %" PRId64 ": budget failure for %" PRId64 " bytes though release would make room\n",
                op, n);
        exit(1);
    }
}

static void run(cw_context *ctx, uint64_t seed, int64_t budget, int64_t n_ops, uint32_t flags) {
    cw_rng rng = {seed};
    g_budget = budget;
    g_nlive = g_nhist = 0;
    g_f = fk_create(ctx, g_budget);
    g_f->on_dev_free = on_dev_free;
    cw__allocator *a = NULL;
    ASSERT_OK(cw__alloc_create(&a, ctx, &g_f->base, NULL, g_budget, flags));
    expect e = {0};
    int64_t n_cross_frees = 0, n_releases = 0;

    for (int64_t op = 0; op < n_ops; op++) {
        /* streams make random progress; sometimes a stream stalls for a while */
        for (int i = 0; i < NS; i++)
            if (cw_rng_range(&rng, 0, 7) >= 3) fk_advance(g_f, &g_f->streams[i], cw_rng_range(&rng, 0, 3));
        hist_prune();

        int64_t u = cw_rng_range(&rng, 0, 999);
        int alloc_pct = e.cur > g_budget * 3 / 4 ? 30 : 60;
        if (u < 2) {
            int64_t before = g_f->n_dev_free;
            ASSERT_OK(cw__alloc_release_cached(a));
            n_releases += g_f->n_dev_free > before;
        } else if (u < 7) {
            cw__alloc_reset_peaks(a);
            e.peak = e.cur;
            g_f->peak = g_f->outstanding;
        } else if (g_nlive == 0 || (g_nlive < MAX_LIVE && cw_rng_range(&rng, 0, 99) < alloc_pct)) {
            int w = (int)cw_rng_range(&rng, 0, NS - 1);
            cw__stream *s = &g_f->streams[w];
            int64_t bytes = rand_size(&rng), n = round512(bytes);
            ASSERT_EQ_I(cw__alloc_round(bytes), n);
            int64_t dev_before = g_f->n_dev_alloc;
            void *p = NULL;
            cw_status st = cw__alloc_malloc(a, bytes, s, &p);
            if (st == CW_ERR_BUDGET) {
                ASSERT_TRUE(p == NULL);
                e.budget_failures++;
                if (n <= g_budget) check_failure_genuine(n, op);
                char want[64];
                snprintf(want, sizeof want, "%" PRId64 " bytes", bytes);
                ASSERT_TRUE(strstr(cw_context_get_last_error(ctx), want) != NULL);
            } else {
                ASSERT_OK_CTX(ctx, st);
                uintptr_t ip = (uintptr_t)p;
                int in_seg = 0;
                for (int si = 0; si < g_f->n_segs; si++) {
                    fk_seg *g = &g_f->segs[si];
                    if (ip >= g->addr && ip + (uintptr_t)n <= g->addr + (uintptr_t)g->size) {
                        in_seg = 1;
                        ASSERT_EQ_I((ip - g->addr) % 512, 0);
                    }
                }
                if (!in_seg) {
                    fprintf(stderr, "op %" PRId64 ": block %#" PRIxPTR " + %" PRId64 " is outside every segment\n",
                            op, ip, n);
                    exit(1);
                }
                for (int i = 0; i < g_nlive; i++)
                    if (overlaps(ip, n, g_live[i].p, g_live[i].n)) {
                        fprintf(stderr, "op %" PRId64 ": block %#" PRIxPTR " + %" PRId64 " overlaps live %#" PRIxPTR
                                " + %" PRId64 "\n", op, ip, n, g_live[i].p, g_live[i].n);
                        exit(1);
                    }
                /* every earlier use of this memory must be complete or ordered before s */
                for (int i = 0; i < g_nhist; i++) {
                    hist *h = &g_hist[i];
                    if (!overlaps(ip, n, h->p, h->n)) continue;
                    if (h->sid == w || s->vc[h->sid] >= h->q || g_f->streams[h->sid].done >= h->q) continue;
                    fprintf(stderr, "op %" PRId64 ": block %#" PRIxPTR " handed to stream %d while stream %d may still"
                            " use it (position %" PRId64 ", done %" PRId64 ", ordered to %" PRId64 ")\n", op, ip, w,
                            h->sid, h->q, g_f->streams[h->sid].done, s->vc[h->sid]);
                    exit(1);
                }
                g_live[g_nlive++] = (live){ip, n, w, fk_use(s)};
                e.allocs++;
                e.cur += n;
                if (e.cur > e.peak) e.peak = e.cur;
                e.hits += g_f->n_dev_alloc == dev_before;
            }
        } else {
            int idx = (int)cw_rng_range(&rng, 0, g_nlive - 1);
            live l = g_live[idx];
            cw__stream *t = &g_f->streams[l.sid], *fs = t;
            if (cw_rng_range(&rng, 0, 1)) l.last_use = fk_use(t);
            hist_add(l.p, l.n, l.sid, l.last_use);
            if (cw_rng_range(&rng, 0, 4) == 0) {
                /* freed on another stream that the caller ordered after the last use */
                int v = (int)((l.sid + cw_rng_range(&rng, 1, NS - 1)) % NS);
                fs = &g_f->streams[v];
                fk_user_order(g_f, fs, t);
                hist_add(l.p, l.n, v, fk_use(fs));
                n_cross_frees++;
            }
            ASSERT_OK_CTX(ctx, cw__alloc_free(a, (void *)l.p, fs));
            g_live[idx] = g_live[--g_nlive];
            e.frees++;
            e.cur -= l.n;
        }
        check_stats(a, &e, op, (flags & CW__ALLOC_POISON) != 0);
    }

    cw_memory_stats s;
    memset(&s, 0, sizeof s);
    cw__alloc_stats(a, &s);
    fprintf(stderr,
            "budget %" PRId64 " B, flags %u, %" PRId64 " ops: %" PRId64 " allocs (%" PRId64 " cache hits), %" PRId64 " frees (%" PRId64
            " on another stream), %" PRId64 " budget failures, %" PRId64 " cross-stream waits, %" PRId64
            " host syncs, %" PRId64 " device allocs / %" PRId64 " frees, %" PRId64 " explicit releases, peak reserved %"
            PRId64 " of %" PRId64 "\n",
            g_budget, flags, n_ops, s.num_allocs, s.cache_hits, s.num_frees, n_cross_frees, s.budget_failures, s.cross_stream_waits,
            s.host_syncs, s.num_device_allocs, s.num_device_frees, n_releases, s.reserved_bytes_peak, g_budget);
    /* the run must have exercised every path, or it proves little */
    ASSERT_TRUE(s.cache_hits > 0 && s.cache_hits < s.num_allocs);
    ASSERT_TRUE(s.cross_stream_waits > 0);
    ASSERT_TRUE(s.host_syncs > 0);
    ASSERT_TRUE(s.budget_failures > 0);
    ASSERT_TRUE(s.num_device_frees > 0);

    /* drain: free everything, release, and nothing is left on the device */
    while (g_nlive) {
        live l = g_live[--g_nlive];
        hist_add(l.p, l.n, l.sid, l.last_use);
        ASSERT_OK(cw__alloc_free(a, (void *)l.p, &g_f->streams[l.sid]));
    }
    ASSERT_OK(cw__alloc_release_cached(a));
    memset(&s, 0, sizeof s);
    cw__alloc_stats(a, &s);
    ASSERT_EQ_I(s.allocated_bytes_current, 0);
    ASSERT_EQ_I(s.reserved_bytes_current, 0);
    ASSERT_EQ_I(g_f->outstanding, 0);
    cw__alloc_destroy(a);
    ASSERT_EQ_I(g_f->n_events, 0); /* every event the allocator created was destroyed */
    free(g_f);
}

int main(void) {
    uint64_t seed = cw_test_seed(20240611);
    int quick = cw_test_quick();
    cw_context *ctx = fk_context();
    /* the main run (>= 100,000 operations), then a tight budget (exact-size segments,
     * cross-pool reuse) and a roomy one with poison on */
    run(ctx, seed, INT64_C(24) << 20, quick ? 30000 : 120000, 0);
    run(ctx, seed + 1, INT64_C(7) << 20, quick ? 10000 : 40000, 0);
    run(ctx, seed + 2, INT64_C(64) << 20, quick ? 10000 : 40000, CW__ALLOC_POISON);
    cw_context_destroy(ctx);
    TEST_DONE();
}
