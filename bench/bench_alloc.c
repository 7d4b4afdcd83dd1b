/* Allocator benchmark: alloc+free throughput (same stream, cross stream) against plain
 * malloc/free, the cost of one cache hit, and the cache-hit rate of a patched convolution
 * loop's allocation pattern on 3 streams. cpu backend (real events); dry for comparison.
 * Usage: bench_alloc [iterations, default 200000] */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc/alloc.h"

#define MiB (INT64_C(1) << 20)
#define KiB (INT64_C(1) << 10)
#define BATCH 64

#define CHECK_OK(call)                                                                                  \
    do {                                                                                                \
        cw_status st_ = (call);                                                                         \
        if (st_ != CW_OK) {                                                                             \
            fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, cw_status_name(st_)); \
            exit(1);                                                                                    \
        }                                                                                               \
    } while (0)

static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Request sizes of the throughput loops: 256 B .. 4 MiB, log-uniform-ish, fixed seed. */
static int64_t g_sizes[1024];
static void make_sizes(void) {
    uint64_t r = 42;
    for (int i = 0; i < 1024; i++) {
        g_sizes[i] = (int64_t)256 << (rng_next(&r) % 15);
        g_sizes[i] += (int64_t)(rng_next(&r) % 256);
    }
}

/* The largest total of one batch: the cross-stream rows cap the allocator at twice this, so
 * blocks freed on B are reused on A (with event waits) instead of growing the cache. */
static int64_t max_batch_bytes(void) {
    int64_t m = 0;
    for (int i = 0; i < 1024; i += BATCH) {
        int64_t t = 0;
        for (int k = 0; k < BATCH; k++) t += cw__alloc_round(g_sizes[i + k]);
        if (t > m) m = t;
    }
    return m;
}

static double ns_since(int64_t t0) { return (double)(cw__now_ns() - t0); }

/* Plain malloc/free pairs per second (touching the first byte, as a user would). */
static double bench_malloc(int64_t iters) {
    int64_t t0 = cw__now_ns();
    volatile char sink = 0;
    for (int64_t i = 0; i < iters; i++) {
        char *p = malloc((size_t)g_sizes[i & 1023]);
        if (!p) exit(1);
        p[0] = (char)i;
        sink ^= p[0];
        free(p);
    }
    (void)sink;
    return (double)iters / (ns_since(t0) * 1e-9);
}

typedef struct result {
    double pairs_per_s;
    double malloc_ns, free_ns; /* per call, batched */
    cw_memory_stats st;
} result;

/* Batches of BATCH allocations on `as` then BATCH frees on `fs`: every malloc after the
 * warm-up is a cache hit. as != fs: each reuse crosses streams. */
static result bench_allocator(cw__backend *be, cw__stream *as, cw__stream *fs, int64_t budget, int64_t iters) {
    cw__allocator *a;
    CHECK_OK(cw__alloc_create(&a, NULL, be, NULL, budget, 0));
    void *p[BATCH];
    /* warm-up: populate the cache with every size */
    for (int i = 0; i < 1024; i += BATCH) {
        for (int k = 0; k < BATCH; k++) CHECK_OK(cw__alloc_malloc(a, g_sizes[i + k], as, &p[k]));
        for (int k = 0; k < BATCH; k++) CHECK_OK(cw__alloc_free(a, p[k], fs));
    }
    cw__alloc_reset_peaks(a);
    cw_memory_stats s0;
    memset(&s0, 0, sizeof s0);
    cw__alloc_stats(a, &s0);
    int64_t t_m = 0, t_f = 0, n = 0;
    for (int64_t it = 0; it < iters; it += BATCH) {
        int64_t t0 = cw__now_ns();
        for (int k = 0; k < BATCH; k++) CHECK_OK(cw__alloc_malloc(a, g_sizes[(it + k) & 1023], as, &p[k]));
        int64_t t1 = cw__now_ns();
        for (int k = 0; k < BATCH; k++) CHECK_OK(cw__alloc_free(a, p[k], fs));
        int64_t t2 = cw__now_ns();
        t_m += t1 - t0;
        t_f += t2 - t1;
        n += BATCH;
        /* let the streams drain now and then, as a real run's work would */
        if ((it / BATCH) % 64 == 63) {
            CHECK_OK(be->rt->stream_synchronize(be, as));
            CHECK_OK(be->rt->stream_synchronize(be, fs));
        }
    }
    result r;
    memset(&r, 0, sizeof r);
    cw__alloc_stats(a, &r.st);
    r.st.num_allocs -= s0.num_allocs;
    r.st.cache_hits -= s0.cache_hits;
    r.st.cross_stream_waits -= s0.cross_stream_waits;
    r.st.host_syncs -= s0.host_syncs;
    r.pairs_per_s = (double)n / ((double)(t_m + t_f) * 1e-9);
    r.malloc_ns = (double)t_m / (double)n;
    r.free_ns = (double)t_f / (double)n;
    CHECK_OK(be->rt->stream_synchronize(be, as));
    CHECK_OK(be->rt->stream_synchronize(be, fs));
    cw__alloc_destroy(a);
    return r;
}

static void print_result(const char *name, const result *r) {
    printf("%-34s %10.0f pairs/s   malloc %6.0f ns  free %6.0f ns   hits %5.1f%%  cross-stream waits %" PRId64
           "  host syncs %" PRId64 "\n",
           name, r->pairs_per_s, r->malloc_ns, r->free_ns,
           r->st.num_allocs ? 100.0 * (double)r->st.cache_hits / (double)r->st.num_allocs : 0.0,
           r->st.cross_stream_waits, r->st.host_syncs);
}

static int cmp_i64(const void *x, const void *y) {
    int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
    return (a > b) - (a < b);
}

/* The allocation pattern of a patched convolution loop: for each conv layer, each height
 * patch gets a patch buffer (light stream builds the input rows) and a workspace (heavy
 * stream runs the conv); both are freed on the heavy stream after the conv. Two heavy
 * streams alternate patches; the light stream is the third. Edge patches are smaller. */
typedef struct layer {
    int64_t patch_buf, workspace;
    int patches;
} layer;

static void bench_conv_pattern(cw__backend *be, cw__stream **s, int64_t budget, int passes) {
    static const layer layers[] = {
        {6 * MiB, 9 * MiB, 8},    {6 * MiB, 9 * MiB, 8},      /* 512 ch @ 128^2 */
        {12 * MiB, 18 * MiB, 16}, {12 * MiB, 18 * MiB, 16},   /* 512 ch @ 256^2 */
        {12 * MiB, 9 * MiB, 16},  {6 * MiB, 4 * MiB + 512 * KiB, 16}, /* 256 ch @ 512^2 */
        {6 * MiB, 2 * MiB, 32},   {3 * MiB, 1 * MiB, 32},     /* 128 ch @ 1024^2 */
        {96 * KiB, 300 * KiB, 32},                             /* conv_out: 3 channels */
    };
    const int n_layers = (int)(sizeof layers / sizeof layers[0]);
    cw__allocator *a;
    CHECK_OK(cw__alloc_create(&a, NULL, be, NULL, budget, 0));
    cw__event *ev[2];
    for (int i = 0; i < 2; i++) CHECK_OK(be->rt->event_create(be, &ev[i]));
    int64_t t_alloc = 0; /* ns inside allocator calls */
    enum { MAX_PAIRS = 1 << 16 };
    static int64_t pair_ns[MAX_PAIRS]; /* per patch: its two alloc+free pairs */
    int n_pairs = 0;
    for (int pass = 0; pass < passes; pass++) {
        for (int l = 0; l < n_layers; l++) {
            const layer *L = &layers[l];
            for (int p = 0; p < L->patches; p++) {
                int edge = p == 0 || p == L->patches - 1;
                int64_t pb = edge ? L->patch_buf * 9 / 10 : L->patch_buf;
                int64_t ws = edge ? L->workspace * 9 / 10 : L->workspace;
                cw__stream *heavy = s[p & 1], *light = s[2];
                void *buf, *w;
                int64_t c0 = cw__now_ns();
                CHECK_OK(cw__alloc_malloc(a, pb, light, &buf));
                int64_t c1 = cw__now_ns();
                /* light work builds buf; the heavy stream waits for it */
                CHECK_OK(be->rt->event_record(be, ev[p & 1], light));
                CHECK_OK(be->rt->stream_wait_event(be, heavy, ev[p & 1]));
                int64_t c2 = cw__now_ns();
                CHECK_OK(cw__alloc_malloc(a, ws, heavy, &w));
                CHECK_OK(cw__alloc_free(a, w, heavy));
                CHECK_OK(cw__alloc_free(a, buf, heavy));
                int64_t dt = (c1 - c0) + (cw__now_ns() - c2);
                t_alloc += dt;
                if (n_pairs < MAX_PAIRS) pair_ns[n_pairs++] = dt;
            }
        }
    }
    for (int i = 0; i < 3; i++) CHECK_OK(be->rt->stream_synchronize(be, s[i]));
    qsort(pair_ns, (size_t)n_pairs, sizeof pair_ns[0], cmp_i64);
    cw_memory_stats st;
    memset(&st, 0, sizeof st);
    cw__alloc_stats(a, &st);
    printf("conv pattern (%d passes, budget %" PRId64 " MiB): %" PRId64 " allocs, cache hits %.2f%%, "
           "cross-stream waits %" PRId64 ", host syncs %" PRId64 ", device allocs %" PRId64 ", peak reserved %.1f MiB, "
           "peak allocated %.1f MiB\n"
           "  time inside the allocator per alloc+free pair: mean %.0f ns, median %.0f ns, p99 %.0f ns\n",
           passes, budget / MiB, st.num_allocs, 100.0 * (double)st.cache_hits / (double)st.num_allocs,
           st.cross_stream_waits, st.host_syncs, st.num_device_allocs, (double)st.reserved_bytes_peak / (double)MiB,
           (double)st.allocated_bytes_peak / (double)MiB, (double)t_alloc / (double)st.num_allocs,
           (double)pair_ns[n_pairs / 2] / 2, (double)pair_ns[n_pairs * 99 / 100] / 2);
    for (int i = 0; i < 2; i++) be->rt->event_destroy(be, ev[i]);
    cw__alloc_destroy(a);
}

int main(int argc, char **argv) {
    int64_t iters = argc > 1 ? strtoll(argv[1], NULL, 10) : 200000;
    if (iters < BATCH) iters = BATCH;
    make_sizes();
    cw_context_config cfg = CW_CONTEXT_CONFIG_INIT;
    cw__backend *cpu, *dry;
    CHECK_OK(cw__backend_cpu_create(NULL, &cfg, &cpu));
    CHECK_OK(cw__backend_dry_create(cpu, &dry));
    cw__stream *s[3], *d[2];
    for (int i = 0; i < 3; i++) CHECK_OK(cpu->rt->stream_create(cpu, &s[i]));
    for (int i = 0; i < 2; i++) CHECK_OK(dry->rt->stream_create(dry, &d[i]));

    printf("bench_alloc: %" PRId64 " alloc+free pairs per row, sizes 256 B .. 4 MiB, batches of %d\n", iters, BATCH);
    printf("%-34s %10.0f pairs/s\n", "malloc/free (glibc)", bench_malloc(iters));
    result r = bench_allocator(cpu, s[0], s[0], 0, iters);
    print_result("cpu, same stream", &r);
    int64_t cap = 2 * max_batch_bytes() + 8 * MiB;
    printf("(cross-stream rows: budget %.1f MiB)\n", (double)cap / (double)MiB);
    r = bench_allocator(cpu, s[0], s[1], cap, iters);
    print_result("cpu, alloc on A, free on B", &r);
    r = bench_allocator(dry, d[0], d[0], 0, iters);
    print_result("dry (no event cost), same stream", &r);
    r = bench_allocator(dry, d[0], d[1], cap, iters);
    print_result("dry, alloc on A, free on B", &r);
    bench_conv_pattern(cpu, s, 96 * MiB, 20);
    bench_conv_pattern(cpu, s, 48 * MiB, 20);

    for (int i = 0; i < 3; i++) cpu->rt->stream_destroy(cpu, s[i]);
    dry->rt->destroy(dry);
    cpu->rt->destroy(cpu);
    return 0;
}
