/* A user allocator (cw_context_set_allocator) on the cpu backend: a counting allocator that
 * really hands out memory, with guard bytes and poison, supplies every segment of the
 * context's pools. A conv and a small graph give the same bits with it as without; every
 * segment goes back exactly once; the budget holds; a NULL on the k-th call is a clean
 * CW_ERR_OUT_OF_MEMORY naming the allocator and the bytes, with nothing leaked (ASan); a
 * switch follows the documented rule; the hook runs only on the calling thread (TSan). */
#include <pthread.h>
#include <time.h>

#include "alloc/alloc.h"
#include "backend/backend.h"
#include "graph_run.h"

#define GUARD 64                 /* bytes checked on both sides of each segment */
#define GUARD_BYTE 0xA5
#define FRESH_WORD 0x7fc00001u   /* NaN: a read before the library's own write shows */
#define FREED_BYTE 0xDD          /* what a segment holds once given back (then freed) */

typedef struct seg {
    char *raw, *p; /* p: what alloc returned */
    int64_t bytes;
    void *stream;
} seg;

typedef struct hook {
    pthread_t thread;  /* the one thread the library may call it on */
    int64_t calls;     /* alloc calls, refused ones included */
    int64_t fail_at;   /* this alloc call (from 1) returns NULL; 0: none */
    int fail_on;       /* and, when set, every later call too */
    int64_t refused;   /* bytes of the last refused call */
    int misalign;      /* hand out a pointer 64 bytes past the aligned one */
    cw_context *ordered; /* set: stream-ordered, the memory's last owner still writes it on `stream` */
    int64_t allocs, frees, live, live_bytes, peak_bytes;
    int errors;        /* misuse seen: unknown or double free, wrong size or stream, guards, thread */
    seg *v;
    int n, cap;
} hook;

static void misuse(hook *h, const char *what, const void *p) {
    fprintf(stderr, "user allocator misuse: %s (%p)\n", what, p);
    h->errors++;
}

static void sleep_50ms(void *arg) {
    (void)arg;
    nanosleep(&(struct timespec){0, 50 * 1000 * 1000}, NULL);
}

static void *hook_alloc(void *user, int64_t bytes, void *stream) {
    hook *h = user;
    if (!pthread_equal(pthread_self(), h->thread)) misuse(h, "alloc on another thread", NULL);
    ++h->calls;
    if ((h->fail_at && (h->calls == h->fail_at || (h->fail_on && h->calls > h->fail_at))) || bytes <= 0) {
        h->refused = bytes;
        return NULL;
    }
    char *raw = malloc((size_t)bytes + 2 * GUARD + CW_ALLOCATOR_ALIGN);
    ASSERT_TRUE(raw != NULL);
    char *p = (char *)(((uintptr_t)raw + GUARD + CW_ALLOCATOR_ALIGN - 1) & ~(uintptr_t)(CW_ALLOCATOR_ALIGN - 1));
    memset(p - GUARD, GUARD_BYTE, GUARD);
    memset(p + bytes, GUARD_BYTE, GUARD);
    for (int64_t i = 0; i + 4 <= bytes; i += 4) memcpy(p + i, &(uint32_t){FRESH_WORD}, 4);
    if (h->ordered) { /* the previous owner is busy on `stream` for 50 ms, then writes NaN */
        cw__backend *be = h->ordered->be;
        ASSERT_OK(be->rt->launch_host(be, (cw__stream *)stream, sleep_50ms, NULL));
        ASSERT_OK(be->rt->fill32_async(be, (cw__stream *)stream, p, FRESH_WORD, bytes / 4));
    }
    if (h->misalign) p += 64;
    if (h->n == h->cap) {
        h->cap = h->cap ? 2 * h->cap : 16;
        h->v = realloc(h->v, (size_t)h->cap * sizeof *h->v);
        ASSERT_TRUE(h->v != NULL);
    }
    h->v[h->n++] = (seg){raw, p, bytes, stream};
    h->allocs++, h->live++, h->live_bytes += bytes;
    if (h->live_bytes > h->peak_bytes) h->peak_bytes = h->live_bytes;
    return p;
}

static void hook_free(void *user, void *ptr, int64_t bytes, void *stream) {
    hook *h = user;
    if (!pthread_equal(pthread_self(), h->thread)) misuse(h, "free on another thread", ptr);
    int i = 0;
    while (i < h->n && h->v[i].p != ptr) i++;
    if (i == h->n) {
        misuse(h, "free of a pointer not handed out (or freed twice)", ptr);
        return;
    }
    seg g = h->v[i];
    h->v[i] = h->v[--h->n];
    if (bytes != g.bytes || stream != g.stream) misuse(h, "free with another size or stream than alloc's", ptr);
    char *base = h->misalign ? g.p - 64 : g.p;
    for (int k = 0; k < GUARD; k++)
        if ((unsigned char)base[-1 - k] != GUARD_BYTE || (unsigned char)base[g.bytes + k] != GUARD_BYTE) {
            misuse(h, "guard bytes overwritten", ptr);
            break;
        }
    memset(base, FREED_BYTE, (size_t)g.bytes);
    free(g.raw);
    h->frees++, h->live--, h->live_bytes -= g.bytes;
}

static void hook_init(hook *h) {
    memset(h, 0, sizeof *h);
    h->thread = pthread_self();
}

static cw_allocator hook_allocator(hook *h) {
    cw_allocator a = CW_ALLOCATOR_INIT;
    a.alloc = hook_alloc;
    a.free = hook_free;
    a.user = h;
    return a;
}

/* Everything handed out came back exactly once, nothing was misused. */
static void hook_done(hook *h) {
    if (h->live) fprintf(stderr, "%lld segment(s) never given back\n", (long long)h->live);
    CHECK(h->errors == 0);
    CHECK(h->live == 0 && h->live_bytes == 0);
    CHECK(h->allocs == h->frees);
    free(h->v);
    h->v = NULL, h->n = h->cap = 0;
}

static void quiet(void *user, cw_log_level lvl, const char *msg) { (void)user, (void)lvl, (void)msg; }

/* A cpu context on 3 streams with chaos and poison; h (may be NULL) supplies its segments. */
static cw_context *context(int64_t budget, hook *h) {
    cw_context_config cfg = CW_CONTEXT_CONFIG_INIT;
    cfg.backend = CW_BACKEND_CPU;
    cfg.temp_budget = budget;
    cfg.streams = 3;
    cfg.threads = 2;
    cfg.flags = CW_FLAG_CHAOS | CW_FLAG_POISON;
    cfg.chaos_seed = 11;
    cfg.log_fn = quiet;
    cw_context *ctx;
    ASSERT_OK(cw_context_create(&ctx, &cfg));
    if (h) {
        cw_allocator a = hook_allocator(h);
        ASSERT_OK_CTX(ctx, cw_context_set_allocator(ctx, &a));
    }
    return ctx;
}

/* ---- a conv and a small graph ------------------------------------------------------------ */
enum { C0 = 8, C1 = 16, H0 = 12, W0 = 10, CO = 4, OUT_N = CO * 2 * H0 * 2 * W0 };

/* Host values: x -> conv 3x3 -> GroupNorm -> SiLU -> conv 3x3, + a 1x1 shortcut of x ->
 * upsample 2x -> attention -> conv 3x3. */
typedef struct net {
    float *x, *w1, *b1, *g1, *be1, *w2, *b2, *ws, *w3, *b3;
} net;

static net net_make(uint64_t seed) {
    cw_rng r = {seed};
    net n;
    n.x = rnd(&r, C0 * H0 * W0, 1.0f, 0.0f);
    n.w1 = rnd(&r, C1 * C0 * 9, 0.12f, 0.0f), n.b1 = rnd(&r, C1, 0.1f, 0.0f);
    n.g1 = rnd(&r, C1, 0.2f, 1.0f), n.be1 = rnd(&r, C1, 0.2f, 0.0f);
    n.w2 = rnd(&r, C1 * C1 * 9, 0.08f, 0.0f), n.b2 = rnd(&r, C1, 0.1f, 0.0f);
    n.ws = rnd(&r, C1 * C0, 0.3f, 0.0f);
    n.w3 = rnd(&r, CO * C1 * 9, 0.08f, 0.0f), n.b3 = rnd(&r, CO, 0.1f, 0.0f);
    return n;
}

static void net_free(net *n) {
    free(n->x), free(n->w1), free(n->b1), free(n->g1), free(n->be1);
    free(n->w2), free(n->b2), free(n->ws), free(n->w3), free(n->b3);
}

/* The graph on one context: its constants, the plan once compiled, input and output. */
typedef struct built {
    cw_context *ctx;
    cw_graph *g;
    cw_tensor *t[12];
    int nt;
    cw_plan *plan;
    cw_tensor *in, *out;
} built;

static cw_node weight(built *b, const float *h, int rank, int64_t d0, int64_t d1, int64_t k) {
    const int64_t dims[4] = {d0, d1, k, k};
    b->t[b->nt] = upload(b->ctx, CW_F32, rank, dims, h);
    return constant(b->ctx, b->g, b->t[b->nt++]);
}

static cw_node conv(built *b, cw_node x, cw_node w, cw_node bias, int64_t pad) {
    cw_conv_params p = CW_CONV_PARAMS_INIT;
    p.pad_pre[0] = p.pad_pre[1] = p.pad_post[0] = p.pad_post[1] = pad;
    cw_node y;
    ASSERT_OK_CTX(b->ctx, cw_graph_conv(b->g, &y, x, w, bias, &p));
    return y;
}

static void net_build(built *b, cw_context *ctx, const net *n) {
    memset(b, 0, sizeof *b);
    b->ctx = ctx;
    ASSERT_OK_CTX(ctx, cw_graph_create(&b->g, ctx));
    const int64_t xd[4] = {1, C0, H0, W0}, od[4] = {1, CO, 2 * H0, 2 * W0};
    cw_tensor_desc d;
    ASSERT_OK(cw_tensor_desc_make(&d, CW_F32, 4, xd));
    cw_node x, h, s, y;
    ASSERT_OK_CTX(ctx, cw_graph_input(b->g, &x, "x", &d));
    h = conv(b, x, weight(b, n->w1, 4, C1, C0, 3), weight(b, n->b1, 1, C1, 0, 0), 1);
    ASSERT_OK_CTX(ctx, cw_graph_group_norm(b->g, &h, h, weight(b, n->g1, 1, C1, 0, 0), weight(b, n->be1, 1, C1, 0, 0),
                                           4, 1e-5f));
    ASSERT_OK_CTX(ctx, cw_graph_silu(b->g, &h, h));
    h = conv(b, h, weight(b, n->w2, 4, C1, C1, 3), weight(b, n->b2, 1, C1, 0, 0), 1);
    s = conv(b, x, weight(b, n->ws, 4, C1, C0, 1), CW_NODE_NONE, 0);
    ASSERT_OK_CTX(ctx, cw_graph_add(b->g, &y, s, h));
    ASSERT_OK_CTX(ctx, cw_graph_upsample2x(b->g, &y, y));
    ASSERT_OK_CTX(ctx, cw_graph_attention(b->g, &y, y, y, y, 0.25f));
    y = conv(b, y, weight(b, n->w3, 4, CO, C1, 3), weight(b, n->b3, 1, CO, 0, 0), 1);
    ASSERT_OK_CTX(ctx, cw_graph_output(b->g, y, "y"));
    b->in = upload(ctx, CW_F32, 4, xd, n->x);
    b->out = upload(ctx, CW_F32, 4, od, NULL);
}

/* Compiles b on 3 streams under the context's budget. */
static cw_status net_compile(built *b) {
    cw_compile_options opt = CW_COMPILE_OPTIONS_INIT;
    opt.streams = 3;
    return cw_graph_compile(b->g, &b->plan, &opt);
}

static cw_status net_run(built *b, float *out) {
    cw_status st = cw_plan_run(b->plan, &b->in, 1, &b->out, 1);
    if (st == CW_OK) ASSERT_OK_CTX(b->ctx, cw_tensor_download(b->out, out, sizeof(float) * OUT_N));
    return st;
}

static void net_release(built *b) {
    cw_plan_destroy(b->plan);
    cw_graph_destroy(b->g);
    for (int i = 0; i < b->nt; i++) cw_tensor_destroy(b->t[i]);
    cw_tensor_destroy(b->in), cw_tensor_destroy(b->out);
    memset(b, 0, sizeof *b);
}

/* Builds, compiles and runs n on ctx into out; on failure msg gets the context's message. */
static cw_status net_once(cw_context *ctx, const net *n, float *out, char *msg, size_t len) {
    built b;
    net_build(&b, ctx, n);
    cw_status st = net_compile(&b);
    if (st == CW_OK) st = net_run(&b, out);
    if (st != CW_OK && msg) snprintf(msg, len, "%s", cw_context_get_last_error(ctx));
    net_release(&b);
    return st;
}

/* The graph's output on a plain context (no user allocator) of the given budget. */
static void net_reference(const net *n, int64_t budget, float *out) {
    cw_context *ctx = context(budget, NULL);
    char msg[CW__ERR_LEN];
    cw_status st = net_once(ctx, n, out, msg, sizeof msg);
    if (st != CW_OK) fprintf(stderr, "reference: %s: %s\n", cw_status_name(st), msg);
    ASSERT_TRUE(st == CW_OK);
    cw_context_destroy(ctx);
}

/* The smallest temporary budget the graph compiles under, on a plain context. */
static int64_t net_min_budget(const net *n) {
    cw_context *ctx = context(0, NULL);
    built b;
    net_build(&b, ctx, n);
    cw_compile_options opt = CW_COMPILE_OPTIONS_INIT;
    opt.streams = 3;
    int64_t m = 0;
    ASSERT_OK_CTX(ctx, cw_graph_min_budget(b.g, &m, &opt));
    net_release(&b);
    cw_context_destroy(ctx);
    return m;
}

/* One cw_conv_forward (x: [2, 16, 40, 36], w: [32, 16, 3, 3]) under opt budget `budget`
 * (0: the context's pool; else a pool of the call's own plan); y: its output. */
enum { XN = 2 * 16 * 40 * 36, WN = 32 * 16 * 9, YN = 2 * 32 * 40 * 36 };

static cw_status conv_once(cw_context *ctx, const float *xh, const float *wh, const float *bh, int64_t budget,
                           float *y) {
    const int64_t xd[4] = {2, 16, 40, 36}, wd[4] = {32, 16, 3, 3}, bd[1] = {32}, yd[4] = {2, 32, 40, 36};
    cw_tensor *x = upload(ctx, CW_F32, 4, xd, xh), *w = upload(ctx, CW_F32, 4, wd, wh);
    cw_tensor *b = upload(ctx, CW_F32, 1, bd, bh), *yt = upload(ctx, CW_F32, 4, yd, NULL);
    cw_conv_params p = CW_CONV_PARAMS_INIT;
    p.pad_pre[0] = p.pad_pre[1] = p.pad_post[0] = p.pad_post[1] = 1;
    cw_compile_options opt = CW_COMPILE_OPTIONS_INIT;
    opt.temp_budget = budget;
    opt.streams = 3;
    cw_status st = cw_conv_forward(ctx, x, w, b, yt, &p, &opt);
    if (st == CW_OK) ASSERT_OK_CTX(ctx, cw_tensor_download(yt, y, sizeof(float) * YN));
    cw_tensor_destroy(x), cw_tensor_destroy(w), cw_tensor_destroy(b), cw_tensor_destroy(yt);
    return st;
}

static int same_bits(const float *a, const float *b, int64_t n) { return memcmp(a, b, (size_t)n * sizeof *a) == 0; }

/* The conv gives the same bits with the hook as without, in the context's pool, in a pool
 * of the call's own and unbudgeted (segments taken inside the run); the hook's segments
 * are the stats' device allocations, all come back, and it never holds more than the
 * budget. */
static void test_conv(void) {
    cw_rng r = {3};
    float *x = rnd(&r, XN, 1.0f, 0.0f), *w = rnd(&r, WN, 0.1f, 0.0f), *bias = rnd(&r, 32, 0.1f, 0.0f);
    float *ref = malloc(sizeof(float) * YN), *y = malloc(sizeof(float) * YN);
    const int64_t budget = 160 << 10, budgets[3] = {0, 96 << 10, -1};
    for (int i = 0; i < 3; i++) {
        cw_context *plain = context(budget, NULL);
        ASSERT_OK_CTX(plain, conv_once(plain, x, w, bias, budgets[i], ref));
        cw_context_destroy(plain);
        hook h;
        hook_init(&h);
        cw_context *ctx = context(budget, &h);
        ASSERT_OK_CTX(ctx, conv_once(ctx, x, w, bias, budgets[i], y));
        CHECK(same_bits(ref, y, YN));
        CHECK(h.allocs > 0);
        cw_memory_stats ms;
        ASSERT_OK(cw_context_get_memory_stats(ctx, &ms));
        if (budgets[i] == 0) { /* the context's pool: its arena stays cached until emptied */
            ASSERT_EQ_I(ms.num_device_allocs, h.allocs);
            ASSERT_EQ_I(ms.reserved_bytes_current, h.live_bytes);
            ASSERT_OK_CTX(ctx, cw_context_empty_cache(ctx));
            ASSERT_OK(cw_context_get_memory_stats(ctx, &ms));
            ASSERT_EQ_I(ms.num_device_frees, h.frees);
            ASSERT_EQ_I(ms.reserved_bytes_current, 0);
        }
        ASSERT_EQ_I(h.live, 0); /* a pool of the call's own went back with its plan */
        if (budgets[i] != -1) ASSERT_LE_I(h.peak_bytes, budgets[i] ? budgets[i] : budget);
        cw_context_destroy(ctx);
        hook_done(&h);
    }
    free(x), free(w), free(bias), free(ref), free(y);
}

/* The budget stays hard with an allocator that never refuses: below the graph's least
 * budget compiling is CW_ERR_BUDGET having asked for nothing; at it, the allocator holds no
 * more than the budget besides the plan's activation arena. */
static void test_budget_cap(const net *n, int64_t least) {
    float ref[OUT_N], y[OUT_N];
    net_reference(n, least, ref);
    for (int b = 0; b < 2; b++) {
        hook h;
        hook_init(&h);
        cw_context *ctx = context(b ? least : least - 4096, &h);
        built bl;
        net_build(&bl, ctx, n);
        if (!b) {
            ASSERT_STATUS(net_compile(&bl), CW_ERR_BUDGET);
            ASSERT_EQ_I(h.allocs, 0);
        } else {
            ASSERT_OK_CTX(ctx, net_compile(&bl));
            cw_memory_stats ms;
            ASSERT_OK(cw_context_get_memory_stats(ctx, &ms));
            const int64_t act = h.live_bytes - ms.reserved_bytes_current; /* the activation arena */
            ASSERT_OK_CTX(ctx, net_run(&bl, y));
            CHECK(same_bits(ref, y, OUT_N));
            ASSERT_OK(cw_context_get_memory_stats(ctx, &ms));
            ASSERT_LE_I(ms.reserved_bytes_peak, least);
            ASSERT_LE_I(h.peak_bytes, least + act);
        }
        net_release(&bl);
        cw_context_destroy(ctx);
        hook_done(&h);
    }
}

/* The graph: same bits with the hook as without, under a budget and without one; the hook
 * holds at most the budget plus the plan's activation arena (one segment, 2 MiB-rounded). */
static void test_graph(const net *n, int64_t budget) {
    float ref[OUT_N], y[OUT_N];
    for (int b = 0; b < 2; b++) {
        const int64_t bud = b ? budget : 0;
        net_reference(n, bud, ref);
        hook h;
        hook_init(&h);
        cw_context *ctx = context(bud, &h);
        built bl;
        net_build(&bl, ctx, n);
        ASSERT_OK_CTX(ctx, net_compile(&bl));
        for (int run = 0; run < 2; run++) {
            ASSERT_OK_CTX(ctx, net_run(&bl, y));
            CHECK(same_bits(ref, y, OUT_N));
        }
        cw_plan_stats ps;
        ASSERT_OK(cw_plan_get_stats(bl.plan, &ps));
        const int64_t two_mib = INT64_C(2) << 20;
        const int64_t act = (ps.activations_peak + two_mib - 1) / two_mib * two_mib;
        if (bud) ASSERT_LE_I(h.peak_bytes, bud + (act > two_mib ? act : two_mib));
        net_release(&bl);
        ASSERT_OK_CTX(ctx, cw_context_empty_cache(ctx));
        ASSERT_EQ_I(h.live, 0);
        cw_context_destroy(ctx);
        hook_done(&h);
    }
}

/* The k-th alloc call (fail_on: and every later one) returns NULL, for k = 1, 2, ... until
 * a run that does not reach it: each failure is CW_ERR_OUT_OF_MEMORY naming the user
 * allocator and the bytes it refused (or the library recovers with a smaller segment); the
 * context then runs the graph again with the same bits; every segment comes back (and ASan
 * sees no leak). */
static void test_fail_sweep(const net *n, int64_t budget, int fail_on) {
    float ref[OUT_N], y[OUT_N];
    net_reference(n, budget, ref);
    int failures = 0;
    for (int64_t k = 1;; k++) {
        ASSERT_LE_I(k, 1000); /* a call count that keeps growing is a bug */
        hook h;
        hook_init(&h);
        h.fail_at = k;
        h.fail_on = fail_on;
        cw_context *ctx = context(budget, &h);
        char msg[CW__ERR_LEN] = "", want[128];
        cw_status st = net_once(ctx, n, y, msg, sizeof msg);
        const int reached = h.calls >= k;
        if (st != CW_OK) {
            snprintf(want, sizeof want, "user allocator (cw_context_set_allocator) returned NULL for a segment of %lld bytes",
                     (long long)h.refused);
            if (st != CW_ERR_OUT_OF_MEMORY || !strstr(msg, want))
                fprintf(stderr, "k = %lld: %s: '%s', expected CW_ERR_OUT_OF_MEMORY naming '%s'\n", (long long)k,
                        cw_status_name(st), msg, want);
            CHECK(st == CW_ERR_OUT_OF_MEMORY && strstr(msg, want));
            CHECK(reached);
            failures++;
            h.fail_at = 0;
            ASSERT_OK_CTX(ctx, net_once(ctx, n, y, NULL, 0));
        }
        CHECK(same_bits(ref, y, OUT_N));
        cw_context_destroy(ctx);
        hook_done(&h);
        if (!reached) break;
    }
    fprintf(stderr, "fail sweep, budget %lld, %s: %d refusals failed the call cleanly\n", (long long)budget,
            fail_on ? "from the k-th call on" : "the k-th call only", failures);
    CHECK(failures > 0);
}

/* A plan of one conv (x -> conv 3x3 -> y): no activations, so it holds no segment between
 * runs once the context's cache is emptied. */
static void conv_plan(built *b, cw_context *ctx, const net *n) {
    memset(b, 0, sizeof *b);
    b->ctx = ctx;
    ASSERT_OK_CTX(ctx, cw_graph_create(&b->g, ctx));
    const int64_t xd[4] = {1, C0, H0, W0}, yd[4] = {1, C1, H0, W0};
    cw_tensor_desc d;
    ASSERT_OK(cw_tensor_desc_make(&d, CW_F32, 4, xd));
    cw_node x;
    ASSERT_OK_CTX(ctx, cw_graph_input(b->g, &x, "x", &d));
    cw_node y = conv(b, x, weight(b, n->w1, 4, C1, C0, 3), weight(b, n->b1, 1, C1, 0, 0), 1);
    ASSERT_OK_CTX(ctx, cw_graph_output(b->g, y, "y"));
    b->in = upload(ctx, CW_F32, 4, xd, n->x);
    b->out = upload(ctx, CW_F32, 4, yd, NULL);
    ASSERT_OK_CTX(ctx, net_compile(b));
}

static void conv_plan_run(built *b, float *y) {
    ASSERT_OK_CTX(b->ctx, cw_plan_run(b->plan, &b->in, 1, &b->out, 1));
    ASSERT_OK_CTX(b->ctx, cw_tensor_download(b->out, y, sizeof(float) * C1 * H0 * W0));
}

/* Switching: refused while a live plan holds its activation arena (nothing changes: the
 * old allocator keeps serving); once nothing is held, every cached segment goes back to the
 * old allocator and the new one serves, also the surviving plan's next arena; NULL restores
 * the backend's own. */
static void test_switch(const net *n, int64_t budget) {
    float ref[OUT_N], y[OUT_N], cref[C1 * H0 * W0], cy[C1 * H0 * W0];
    net_reference(n, budget, ref);
    hook a, b;
    hook_init(&a), hook_init(&b);
    cw_context *ctx = context(budget, &a);
    const cw_allocator ab = hook_allocator(&b);
    built net_b, conv_b;
    conv_plan(&conv_b, ctx, n);
    conv_plan_run(&conv_b, cref);
    net_build(&net_b, ctx, n);
    ASSERT_OK_CTX(ctx, net_compile(&net_b));
    ASSERT_STATUS(cw_context_set_allocator(ctx, &ab), CW_ERR_INVALID_ARG);
    CHECK(strstr(cw_context_get_last_error(ctx), "still holds") != NULL);
    const int64_t a_allocs = a.allocs;
    ASSERT_OK_CTX(ctx, net_run(&net_b, y)); /* re-takes its temporary arena, from a */
    CHECK(same_bits(ref, y, OUT_N));
    CHECK(a.allocs > a_allocs && b.allocs == 0);
    net_release(&net_b);
    ASSERT_OK_CTX(ctx, cw_context_set_allocator(ctx, &ab));
    ASSERT_EQ_I(a.live, 0);
    const int64_t a_total = a.allocs;
    hook_done(&a); /* a's state may go now */
    conv_plan_run(&conv_b, cy);
    CHECK(same_bits(cref, cy, C1 * H0 * W0));
    ASSERT_OK_CTX(ctx, net_once(ctx, n, y, NULL, 0));
    CHECK(same_bits(ref, y, OUT_N));
    CHECK(b.allocs > 0 && a.allocs == a_total);
    ASSERT_OK_CTX(ctx, cw_context_set_allocator(ctx, NULL));
    ASSERT_EQ_I(b.live, 0);
    const int64_t b_total = b.allocs;
    conv_plan_run(&conv_b, cy);
    ASSERT_OK_CTX(ctx, net_once(ctx, n, y, NULL, 0));
    CHECK(same_bits(ref, y, OUT_N) && same_bits(cref, cy, C1 * H0 * W0));
    CHECK(b.allocs == b_total);
    net_release(&conv_b);
    cw_context_destroy(ctx);
    hook_done(&b);
}

/* The hook runs on the thread that makes the call: the main thread, then another thread
 * (the hook checks pthread_self(); TSan checks its unlocked counters). */
typedef struct job {
    const net *n;
    cw_context *ctx;
    hook *h;
    float *y;
    cw_status st;
} job;

static void *job_main(void *arg) {
    job *j = arg;
    j->h->thread = pthread_self(); /* from here on this thread makes the calls */
    j->st = net_once(j->ctx, j->n, j->y, NULL, 0);
    return NULL;
}

static void test_threads(const net *n, int64_t budget) {
    float ref[OUT_N], y[OUT_N];
    net_reference(n, budget, ref);
    for (int b = 0; b < 2; b++) {
        hook h;
        hook_init(&h);
        cw_context *ctx = context(b ? budget : 0, &h);
        ASSERT_OK_CTX(ctx, net_once(ctx, n, y, NULL, 0));
        const int64_t calls = h.calls;
        job j = {n, ctx, &h, y, CW_OK};
        pthread_t t;
        ASSERT_TRUE(pthread_create(&t, NULL, job_main, &j) == 0);
        ASSERT_TRUE(pthread_join(t, NULL) == 0);
        ASSERT_OK_CTX(ctx, j.st);
        if (b) CHECK(same_bits(ref, y, OUT_N));
        CHECK(h.calls > calls); /* the other thread did call it */
        h.thread = pthread_self();
        cw_context_destroy(ctx);
        hook_done(&h);
    }
}

/* A stream-ordered allocator: the memory's previous owner still writes NaN into it on the
 * stream alloc is given, 50 ms late. The library must order every other stream after that
 * point: runs fork from stream 0, and a segment taken inside a run (no budget) carries an
 * event. A missing wait shows as different bits (or a TSan race). */
static void test_stream_ordered(const net *n, int64_t budget) {
    float ref[OUT_N], y[OUT_N];
    for (int b = 0; b < 2; b++) {
        const int64_t bud = b ? budget : 0;
        net_reference(n, bud, ref);
        hook h;
        hook_init(&h);
        cw_context *ctx = context(bud, &h);
        h.ordered = ctx;
        for (int i = 0; i < 3; i++) {
            ASSERT_OK_CTX(ctx, net_once(ctx, n, y, NULL, 0));
            CHECK(same_bits(ref, y, OUT_N));
            ASSERT_OK_CTX(ctx, cw_context_empty_cache(ctx)); /* fresh segments every time */
        }
        cw_context_destroy(ctx);
        hook_done(&h);
    }
}

/* The same at the allocator alone: a segment is taken for stream 1 (its previous owner's
 * NaN lands there after 50 ms); stream 2 then gets a block of the same segment and writes
 * 1.0f into it. Without the event the new segment carries, stream 2's write lands first and
 * the NaN overwrites it. */
static void test_new_segment_event(void) {
    hook h;
    hook_init(&h);
    cw_context *ctx = context(0, &h);
    h.ordered = ctx;
    cw__backend *be = ctx->be;
    const cw__seg_source src = cw__context_seg_source(ctx);
    cw__allocator *a;
    ASSERT_OK_CTX(ctx, cw__alloc_create(&a, ctx, be, &src, 0, CW__ALLOC_DETERMINISTIC | CW__ALLOC_PREFER_REUSE));
    cw__stream *s1, *s2;
    ASSERT_OK_CTX(ctx, cw__context_stream(ctx, 1, &s1));
    ASSERT_OK_CTX(ctx, cw__context_stream(ctx, 2, &s2));
    void *p, *q;
    ASSERT_OK_CTX(ctx, cw__alloc_malloc(a, 4096, s1, &p));
    ASSERT_EQ_I(h.allocs, 1);
    ASSERT_OK_CTX(ctx, cw__alloc_malloc(a, 4096, s2, &q));
    ASSERT_EQ_I(h.allocs, 1); /* the same segment */
    ASSERT_OK_CTX(ctx, be->rt->fill32_async(be, s2, q, 0x3f800000u, 1024));
    ASSERT_OK_CTX(ctx, be->rt->stream_synchronize(be, s2));
    ASSERT_OK_CTX(ctx, be->rt->stream_synchronize(be, s1));
    float v[1024];
    memcpy(v, q, sizeof v);
    int bad = 0;
    for (int i = 0; i < 1024; i++) bad += v[i] != 1.0f;
    if (bad) fprintf(stderr, "%d of stream 2's words were overwritten by the segment's previous owner\n", bad);
    CHECK(bad == 0);
    ASSERT_OK_CTX(ctx, cw__alloc_free(a, p, NULL));
    ASSERT_OK_CTX(ctx, cw__alloc_free(a, q, NULL));
    cw__alloc_destroy(a);
    cw_context_destroy(ctx);
    hook_done(&h);
}

/* Bad arguments: a wrong size or version, a missing function, no context; a misaligned
 * pointer goes straight back and fails the call with CW_ERR_INVALID_ARG. */
static void test_bad_args(void) {
    hook h;
    hook_init(&h);
    cw_context *ctx = context(0, NULL);
    cw_allocator a = hook_allocator(&h);
    a.size--;
    ASSERT_STATUS(cw_context_set_allocator(ctx, &a), CW_ERR_INVALID_ARG);
    CHECK(strstr(cw_context_get_last_error(ctx), "CW_ALLOCATOR_INIT") != NULL);
    a = hook_allocator(&h);
    a.version = CW_ALLOCATOR_VERSION + 1;
    ASSERT_STATUS(cw_context_set_allocator(ctx, &a), CW_ERR_INVALID_ARG);
    a = hook_allocator(&h);
    a.free = NULL;
    ASSERT_STATUS(cw_context_set_allocator(ctx, &a), CW_ERR_INVALID_ARG);
    CHECK(strstr(cw_context_get_last_error(ctx), "free is NULL") != NULL);
    ASSERT_STATUS(cw_context_set_allocator(NULL, NULL), CW_ERR_INVALID_ARG);
    ASSERT_STATUS(cw_context_empty_cache(NULL), CW_ERR_INVALID_ARG);
    ASSERT_OK_CTX(ctx, cw_context_set_allocator(ctx, NULL)); /* the backend's own, again */

    h.misalign = 1;
    a = hook_allocator(&h);
    ASSERT_OK_CTX(ctx, cw_context_set_allocator(ctx, &a));
    cw_rng r = {9};
    float *x = rnd(&r, XN, 1.0f, 0.0f), *w = rnd(&r, WN, 0.1f, 0.0f), *y = malloc(sizeof(float) * YN);
    ASSERT_STATUS(conv_once(ctx, x, w, NULL, 0, y), CW_ERR_INVALID_ARG);
    CHECK(strstr(cw_context_get_last_error(ctx), "not aligned to CW_ALLOCATOR_ALIGN") != NULL);
    ASSERT_EQ_I(h.live, 0);
    CHECK(h.allocs == 1);
    cw_context_destroy(ctx);
    hook_done(&h);
    free(x), free(w), free(y);
}

int main(void) {
    net n = net_make(cw_test_seed(2024));
    const int64_t least = net_min_budget(&n), budget = 2 * least;
    fprintf(stderr, "graph budget %lld bytes (least %lld)\n", (long long)budget, (long long)least);
    test_bad_args();
    test_conv();
    test_budget_cap(&n, least);
    test_graph(&n, budget);
    test_switch(&n, budget);
    test_threads(&n, budget);
    test_stream_ordered(&n, budget);
    test_new_segment_event();
    for (int on = 0; on < 2; on++) {
        test_fail_sweep(&n, budget, on);
        if (on) test_fail_sweep(&n, 0, on); /* the k-th alone: a smaller segment always follows */
    }
    net_free(&n);
    TEST_DONE();
}
