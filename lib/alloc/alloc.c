/* Budgeted caching allocator: device segments split into 512-byte-granular blocks; free
 * blocks are cached (best fit, then lowest address) and reused in stream order through
 * events recorded at free time, never holding more than the budget from the device. The
 * segments come from the backend, or from a segment source (cw__seg_source: the context's
 * user allocator, cw_allocator). */
#include <assert.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "alloc/alloc.h"
#include "kernels/kernels.h"

#define GRAN 512                   /* bytes: block granularity and alignment within a segment */
#define SMALL_MAX (INT64_C(1) << 20) /* requests up to 1 MiB come from the small pool */
#define SMALL_SEG (INT64_C(2) << 20) /* small-pool segments are 2 MiB when the cap allows */
#define LARGE_GRAN (INT64_C(2) << 20) /* large segments are rounded up to 2 MiB when it fits */
#define MAX_REQUEST (INT64_C(1) << 62) /* larger requests cannot be rounded without overflow */
#define MAX_PENDING 8  /* streams whose frees a cached block can remember (CW__MAX_STREAMS) */
#define MAX_WAITED 4   /* streams remembered as already ordered after an event */
#define POISON_WORD CW_POISON_NAN_BITS /* lib/kernels: the same NaN every poison fill writes */
enum { POOL_SMALL = 0, POOL_LARGE = 1 };

/* An event recorded on `s` at a free, shared (refcounted) by every cached block carved
 * from the freed memory. It is never re-recorded while referenced, so "done" and
 * "waited" stay true for its one recording. */
typedef struct evref {
    cw__event *ev;
    cw__stream *s;
    uint64_t seq;      /* global record order: the later of two events on one stream wins */
    int refs;
    int done;          /* observed complete (query or synchronize) */
    int n_waited;
    cw__stream *waited[MAX_WAITED]; /* streams that already waited on this recording */
    struct evref *next; /* free pool link */
} evref;

typedef struct segment segment;

typedef struct block {
    uintptr_t addr;
    int64_t size;
    segment *seg;
    struct block *prev, *next; /* address neighbours within the segment */
    int allocated;
    int n_pend;                /* free blocks: frees not yet known to be complete */
    evref *pend[MAX_PENDING];  /* at most one per stream */
    struct block *cache_next;  /* struct cache link */
} block;

struct segment {
    void *ptr;
    int64_t size;
    cw_allocator src; /* the user allocator that gave it (alloc NULL: the backend) */
    void *stream;     /* the stream handle src.alloc was given, for src.free */
    int pool;
    int64_t n_live; /* allocated blocks */
    block *first;
    segment *prev, *next;
};

typedef struct pool {
    block **v; /* free blocks sorted by (size, addr) */
    int64_t n, cap;
} pool;

struct cw__allocator {
    cw_context *ctx;          /* error messages only */
    cw__backend *be;
    cw__seg_source src;       /* self NULL and hooks NULL: dev_alloc only */
    int has_src;
    int64_t budget; /* 0: unlimited */
    uint32_t flags;
    int skip_waits;
    pthread_mutex_t mu;
    pool pools[2];
    segment *segs;
    int64_t n_blocks;         /* block structs in segments */
    block *block_cache;       /* spare block structs, so the hot path does not cw__malloc */
    int64_t n_block_cache;
    evref *ev_pool;           /* events not referenced by any block, ready to re-record */
    uint64_t seq;
    int64_t user_null;        /* bytes the user allocator last refused in this request (0: none) */
    block **map;              /* allocated blocks by address: open addressing, linear probing */
    int64_t map_n;
    int map_bits;
    cw_memory_stats st;
};

int64_t cw__alloc_round(int64_t bytes) {
    if (bytes <= 0) return 0;
    if (bytes > MAX_REQUEST) return MAX_REQUEST;
    return (bytes + GRAN - 1) & ~(int64_t)(GRAN - 1);
}

/* ---- sorted free lists ------------------------------------------------------------- */
/* First index whose block is >= (size, addr). */
static int64_t pool_lower_bound(const pool *p, int64_t size, uintptr_t addr) {
    int64_t lo = 0, hi = p->n;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        const block *b = p->v[mid];
        if (b->size < size || (b->size == size && b->addr < addr)) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* Capacity is reserved on the malloc path (pool_reserve), so inserting never allocates. */
static void pool_insert(pool *p, block *b) {
    int64_t i = pool_lower_bound(p, b->size, b->addr);
    memmove(p->v + i + 1, p->v + i, (size_t)(p->n - i) * sizeof *p->v);
    p->v[i] = b;
    p->n++;
}

static void pool_remove(pool *p, block *b) {
    int64_t i = pool_lower_bound(p, b->size, b->addr);
    /* internal invariant: every free block is in its pool exactly once */
    assert(i < p->n && p->v[i] == b);
    if (i >= p->n || p->v[i] != b) return;
    memmove(p->v + i, p->v + i + 1, (size_t)(p->n - i - 1) * sizeof *p->v);
    p->n--;
}

static int pool_reserve(pool *p, int64_t need) {
    if (p->cap >= need) return 1;
    int64_t cap = p->cap ? p->cap : 64;
    while (cap < need) cap *= 2;
    block **v = cw__realloc(p->v, (size_t)cap * sizeof *v);
    if (!v) return 0;
    p->v = v;
    p->cap = cap;
    return 1;
}

/* ---- address map of allocated blocks --------------------------------------------------- */
static uint64_t map_home(const cw__allocator *a, uintptr_t addr) {
    return ((uint64_t)addr * 0x9E3779B97F4A7C15ull) >> (64 - a->map_bits);
}

static void map_put(block **m, int bits, uint64_t mask, block *b) {
    uint64_t i = ((uint64_t)b->addr * 0x9E3779B97F4A7C15ull) >> (64 - bits);
    while (m[i]) i = (i + 1) & mask;
    m[i] = b;
}

/* Keeps the load factor <= 1/2 for one more entry. */
static int map_reserve(cw__allocator *a) {
    int64_t cap = a->map ? (int64_t)1 << a->map_bits : 0;
    if ((a->map_n + 1) * 2 <= cap) return 1;
    int bits = a->map ? a->map_bits + 1 : 7;
    uint64_t ncap = (uint64_t)1 << bits;
    block **m = cw__calloc((size_t)ncap, sizeof *m);
    if (!m) return 0;
    for (int64_t i = 0; i < cap; i++)
        if (a->map[i]) map_put(m, bits, ncap - 1, a->map[i]);
    cw__free(a->map);
    a->map = m;
    a->map_bits = bits;
    return 1;
}

static block *map_find(const cw__allocator *a, uintptr_t addr, uint64_t *slot) {
    if (!a->map) return NULL;
    uint64_t mask = ((uint64_t)1 << a->map_bits) - 1;
    for (uint64_t i = map_home(a, addr); a->map[i]; i = (i + 1) & mask) {
        if (a->map[i]->addr == addr) {
            *slot = i;
            return a->map[i];
        }
    }
    return NULL;
}

/* Backward-shift deletion keeps probe chains intact without tombstones. */
static void map_remove_slot(cw__allocator *a, uint64_t i) {
    uint64_t mask = ((uint64_t)1 << a->map_bits) - 1;
    a->map[i] = NULL;
    for (uint64_t j = (i + 1) & mask; a->map[j]; j = (j + 1) & mask) {
        uint64_t k = map_home(a, a->map[j]->addr);
        /* a->map[j] may move to the hole i unless its home lies cyclically in (i, j] */
        int stays = (i <= j) ? (i < k && k <= j) : (i < k || k <= j);
        if (stays) continue;
        a->map[i] = a->map[j];
        a->map[j] = NULL;
        i = j;
    }
    a->map_n--;
}

/* ---- block structs and events ------------------------------------------------------ */
static int block_cache_reserve(cw__allocator *a, int64_t n) {
    while (a->n_block_cache < n) {
        block *b = cw__malloc(sizeof *b);
        if (!b) return 0;
        b->cache_next = a->block_cache;
        a->block_cache = b;
        a->n_block_cache++;
    }
    return 1;
}

static block *block_take(cw__allocator *a) {
    block *b = a->block_cache; /* reserved by the caller */
    a->block_cache = b->cache_next;
    a->n_block_cache--;
    memset(b, 0, sizeof *b);
    a->n_blocks++;
    return b;
}

static void block_give(cw__allocator *a, block *b) {
    b->cache_next = a->block_cache;
    a->block_cache = b;
    a->n_block_cache++;
    a->n_blocks--;
}

static void evref_unref(cw__allocator *a, evref *e) {
    if (--e->refs > 0) return;
    e->next = a->ev_pool;
    a->ev_pool = e;
}

static void pend_clear(cw__allocator *a, block *b) {
    for (int i = 0; i < b->n_pend; i++) evref_unref(a, b->pend[i]);
    b->n_pend = 0;
}

static int evref_waited(const evref *e, const cw__stream *s) {
    for (int i = 0; i < e->n_waited; i++)
        if (e->waited[i] == s) return 1;
    return 0;
}

/* A fresh evref recorded on s, or NULL when no event could be created or recorded. */
static evref *evref_record(cw__allocator *a, cw__stream *s) {
    evref *e = a->ev_pool;
    if (e) {
        a->ev_pool = e->next;
    } else {
        e = cw__calloc(1, sizeof *e);
        if (!e) return NULL;
        if (a->be->rt->event_create(a->be, &e->ev) != CW_OK) {
            cw__free(e);
            return NULL;
        }
    }
    if (a->be->rt->event_record(a->be, e->ev, s) != CW_OK) {
        e->next = a->ev_pool;
        a->ev_pool = e;
        return NULL;
    }
    e->s = s;
    e->seq = ++a->seq;
    e->refs = 1;
    e->done = 0;
    e->n_waited = 0;
    e->next = NULL;
    return e;
}

/* Merges src's pending frees into dst's (one per stream, the later wins). Returns 0 (and
 * changes nothing) when the union would not fit; the caller then keeps the blocks apart. */
static int pend_merge(cw__allocator *a, block *dst, const block *src) {
    evref *u[2 * MAX_PENDING];
    int n = 0;
    for (int i = 0; i < dst->n_pend; i++) u[n++] = dst->pend[i];
    int extra = 0;
    for (int i = 0; i < src->n_pend; i++) {
        int same = 0;
        for (int j = 0; j < dst->n_pend; j++) same |= dst->pend[j]->s == src->pend[i]->s;
        extra += !same;
    }
    if (dst->n_pend + extra > MAX_PENDING) return 0;
    for (int i = 0; i < src->n_pend; i++) {
        evref *e = src->pend[i];
        int j = 0;
        while (j < n && u[j]->s != e->s) j++;
        e->refs++;
        if (j == n) {
            u[n++] = e;
        } else if (e->seq > u[j]->seq) {
            evref_unref(a, u[j]);
            u[j] = e;
        } else {
            evref_unref(a, e);
        }
    }
    memcpy(dst->pend, u, (size_t)n * sizeof *u);
    dst->n_pend = n;
    return 1;
}

/* ---- stream order -------------------------------------------------------------------- */
/* 1 when b may be used on s with no wait: every pending free is on s itself, already
 * complete, or s already waited on it. s == NULL (host order) needs them all complete. */
static int block_ready(cw__allocator *a, block *b, cw__stream *s) {
    int det = (a->flags & CW__ALLOC_DETERMINISTIC) && s;
    for (int i = 0; i < b->n_pend; i++) {
        evref *e = b->pend[i];
        if (s && (e->s == s || evref_waited(e, s))) continue;
        if (det) return 0; /* completion is timing: deterministic mode never looks at it */
        if (e->done) continue;
        int done = 0;
        if (a->be->rt->event_query(a->be, e->ev, &done) != CW_OK || !done) return 0;
        e->done = 1;
    }
    return 1;
}

/* Orders s after every pending free of b: a stream wait per foreign event still running
 * (host order: a host synchronisation). Leaves b's pending list as it was. */
static cw_status block_order(cw__allocator *a, block *b, cw__stream *s) {
    /* deterministic mode waits even on an event that happens to have completed: whether it
     * has is timing, and a wait not made now would change later choices (block_ready), so
     * the compile-time dry run (whose events complete at once) would no longer predict the
     * run */
    const int det = (a->flags & CW__ALLOC_DETERMINISTIC) && s;
    for (int i = 0; i < b->n_pend; i++) {
        evref *e = b->pend[i];
        if ((e->done && !det) || (s && (e->s == s || evref_waited(e, s)))) continue;
        int done = 0;
        if (!det && a->be->rt->event_query(a->be, e->ev, &done) == CW_OK && done) {
            e->done = 1;
            continue;
        }
        cw_status st;
        if (!s) {
            a->st.host_syncs++;
            if ((st = a->be->rt->event_synchronize(a->be, e->ev)) != CW_OK)
                return cw__error(a->ctx, st, "allocator: event_synchronize failed (%s)", cw_status_name(st));
            e->done = 1;
            continue;
        }
        if (a->skip_waits) continue; /* test-only: the bug the cross-stream test must catch */
        if ((st = a->be->rt->stream_wait_event(a->be, s, e->ev)) != CW_OK)
            return cw__error(a->ctx, st, "allocator: stream_wait_event failed (%s)", cw_status_name(st));
        a->st.cross_stream_waits++;
        if (e->n_waited < MAX_WAITED) e->waited[e->n_waited++] = s;
    }
    return CW_OK;
}

/* ---- segments ------------------------------------------------------------------------ */
static int64_t largest_free(const cw__allocator *a) {
    int64_t m = 0;
    for (int p = 0; p < 2; p++)
        if (a->pools[p].n && a->pools[p].v[a->pools[p].n - 1]->size > m) m = a->pools[p].v[a->pools[p].n - 1]->size;
    return m;
}

/* ---- where segments come from ---------------------------------------------------------- */
static cw_allocator seg_source(const cw__allocator *a) {
    cw_allocator u;
    memset(&u, 0, sizeof u);
    if (a->has_src) a->src.user_allocator(a->src.self, &u);
    return u;
}

/* The source's count of held segments (cw_context_set_allocator refuses while any are). */
static void seg_count(const cw__allocator *a, int64_t n, int64_t bytes) {
    if (a->has_src) a->src.held(a->src.self, n, bytes);
}

/* Memory for g (g->size bytes), first used on s; outside a run (s NULL) the user allocator
 * is given stream 0, which every run's streams wait for at its start. CW_ERR_OUT_OF_MEMORY
 * (no message yet) when the device or the user allocator has none. */
static cw_status seg_obtain(cw__allocator *a, segment *g, cw__stream *s) {
    cw_status st;
    g->src = seg_source(a);
    if (!g->src.alloc) {
        st = a->be->rt->dev_alloc(a->be, g->size, &g->ptr);
        if (st == CW_OK && !g->ptr) st = CW_ERR_OUT_OF_MEMORY;
        if (st != CW_OK && st != CW_ERR_OUT_OF_MEMORY)
            return cw__error(a->ctx, st, "allocator: dev_alloc of %" PRId64 " bytes failed (%s)", g->size,
                             cw_status_name(st));
        return st;
    }
    if (!s) CW_TRY(a->src.idle_stream(a->src.self, &s));
    g->stream = cw__stream_handle(a->be, s);
    g->ptr = g->src.alloc(g->src.user, g->size, g->stream);
    if (!g->ptr) {
        a->user_null = g->size;
        return CW_ERR_OUT_OF_MEMORY;
    }
    if ((uintptr_t)g->ptr % CW_ALLOCATOR_ALIGN == 0) return CW_OK;
    void *p = g->ptr;
    g->src.free(g->src.user, p, g->size, g->stream);
    return cw__error(a->ctx, CW_ERR_INVALID_ARG,
                     "the user allocator (cw_context_set_allocator) returned %p for %" PRId64
                     " bytes, not aligned to CW_ALLOCATOR_ALIGN (%d bytes); it was given back", p, g->size,
                     CW_ALLOCATOR_ALIGN);
}

/* Gives g's memory back to where it came from. */
static void seg_return(cw__allocator *a, segment *g) {
    if (g->src.alloc) g->src.free(g->src.user, g->ptr, g->size, g->stream);
    else a->be->rt->dev_free(a->be, g->ptr);
}

/* A user allocator's segment taken inside a run is ready in s's order only: an event
 * recorded on s now, as if s had freed it, makes other streams wait before they use it
 * (block_order). Without an event, the host waits for s instead. */
static cw_status seg_order(cw__allocator *a, segment *g, cw__stream *s, evref **out) {
    *out = NULL;
    if (!g->src.alloc || !s) return CW_OK;
    if ((*out = evref_record(a, s)) != NULL) return CW_OK;
    a->st.host_syncs++;
    cw_status st = a->be->rt->stream_synchronize(a->be, s);
    if (st != CW_OK)
        return cw__error(a->ctx, st, "allocator: no event for a new segment and stream_synchronize failed (%s)",
                         cw_status_name(st));
    return CW_OK;
}

/* Makes g (its memory obtained) one free block of pool pi: *b. */
static void segment_link(cw__allocator *a, segment *g, int pi, evref *e, block **b) {
    g->pool = pi;
    g->next = a->segs;
    if (a->segs) a->segs->prev = g;
    a->segs = g;
    block *nb = block_take(a);
    nb->addr = (uintptr_t)g->ptr;
    nb->size = g->size;
    nb->seg = g;
    if (e) {
        nb->pend[0] = e;
        nb->n_pend = 1;
    }
    g->first = nb;
    pool_insert(&a->pools[pi], nb);
    a->st.reserved_bytes_current += g->size;
    if (a->st.reserved_bytes_current > a->st.reserved_bytes_peak)
        a->st.reserved_bytes_peak = a->st.reserved_bytes_current;
    a->st.num_device_allocs++;
    seg_count(a, 1, g->size);
    *b = nb;
}

/* Takes a segment of the preferred size for pool pi, or of exactly n bytes when only that
 * fits the cap, for use on s. *b = NULL without error when nothing fits (*oom: the device
 * or the user allocator said so). */
static cw_status segment_new(cw__allocator *a, int pi, int64_t n, cw__stream *s, block **b, int *oom) {
    *b = NULL;
    int64_t pref = pi == POOL_SMALL ? SMALL_SEG : (n + LARGE_GRAN - 1) / LARGE_GRAN * LARGE_GRAN;
    int64_t room = a->budget > 0 ? a->budget - a->st.reserved_bytes_current : INT64_MAX;
    int64_t sizes[2] = {pref, n};
    for (int k = 0; k < 2; k++) {
        int64_t sz = sizes[k];
        if (sz > room || (k == 1 && sz == pref)) continue;
        segment *g = cw__calloc(1, sizeof *g);
        if (!g) return cw__error(a->ctx, CW_ERR_OUT_OF_MEMORY, "allocator: out of host memory for a segment");
        g->size = sz;
        cw_status st = seg_obtain(a, g, s);
        if (st != CW_OK) {
            cw__free(g);
            if (st != CW_ERR_OUT_OF_MEMORY) return st;
            *oom = 1;
            continue; /* a smaller segment may still fit on the device */
        }
        evref *e;
        if ((st = seg_order(a, g, s, &e)) != CW_OK) {
            seg_return(a, g);
            cw__free(g);
            return st;
        }
        segment_link(a, g, pi, e, b);
        return CW_OK;
    }
    return CW_OK;
}

/* Bytes held in segments with no allocated block (what release could give back). */
static int64_t cached_segment_bytes(const cw__allocator *a) {
    int64_t t = 0;
    for (const segment *g = a->segs; g; g = g->next)
        if (g->n_live == 0) t += g->size;
    return t;
}

static void segment_free(cw__allocator *a, segment *g) {
    for (block *b = g->first, *nx; b; b = nx) {
        nx = b->next;
        if (!b->allocated) pool_remove(&a->pools[g->pool], b);
        pend_clear(a, b);
        block_give(a, b);
    }
    seg_return(a, g);
    seg_count(a, -1, -g->size);
    if (g->prev) g->prev->next = g->next;
    else a->segs = g->next;
    if (g->next) g->next->prev = g->prev;
    a->st.reserved_bytes_current -= g->size;
    a->st.num_device_frees++;
    cw__free(g);
}

/* Returns every segment with no allocated block to the device, first synchronising the
 * events of frees that may still be running on it (each counted as a host sync). */
static cw_status release_cached_locked(cw__allocator *a) {
    for (segment *g = a->segs, *nx; g; g = nx) {
        nx = g->next;
        if (g->n_live) continue;
        for (block *b = g->first; b; b = b->next) {
            for (int i = 0; i < b->n_pend; i++) {
                evref *e = b->pend[i];
                if (e->done) continue;
                a->st.host_syncs++;
                cw_status st = a->be->rt->event_synchronize(a->be, e->ev);
                if (st != CW_OK)
                    return cw__error(a->ctx, st, "allocator: event_synchronize failed while releasing (%s)",
                                     cw_status_name(st));
                e->done = 1;
            }
        }
        segment_free(a, g);
    }
    return CW_OK;
}

/* ---- public entry points ------------------------------------------------------------- */
cw_status cw__alloc_create(cw__allocator **out, cw_context *ctx, cw__backend *be, const cw__seg_source *src,
                           int64_t budget, uint32_t flags) {
    if (!out) return cw__error(ctx, CW_ERR_INVALID_ARG, "cw__alloc_create: out is NULL");
    *out = NULL;
    if (!be) return cw__error(ctx, CW_ERR_INVALID_ARG, "cw__alloc_create: backend is NULL");
    cw__allocator *a = cw__calloc(1, sizeof *a);
    if (!a) return cw__error(ctx, CW_ERR_OUT_OF_MEMORY, "cw__alloc_create: out of host memory");
    if (pthread_mutex_init(&a->mu, NULL) != 0) {
        cw__free(a);
        return cw__error(ctx, CW_ERR_INTERNAL, "cw__alloc_create: pthread_mutex_init failed");
    }
    a->ctx = ctx;
    a->be = be;
    if (src) {
        a->src = *src;
        a->has_src = 1;
    }
    a->budget = budget > 0 ? budget : 0;
    a->flags = flags;
    a->st.budget = a->budget;
    *out = a;
    return CW_OK;
}

void cw__alloc_destroy(cw__allocator *a) {
    if (!a) return;
    pthread_mutex_lock(&a->mu);
    if (a->st.allocated_bytes_current)
        cw__log(a->ctx, CW_LOG_WARN, "allocator destroyed with %" PRId64 " bytes still allocated; freeing them",
                a->st.allocated_bytes_current);
    while (a->segs) {
        segment *g = a->segs;
        for (block *b = g->first; b; b = b->next)
            for (int i = 0; i < b->n_pend; i++)
                if (!b->pend[i]->done) {
                    a->be->rt->event_synchronize(a->be, b->pend[i]->ev);
                    b->pend[i]->done = 1;
                }
        g->n_live = 0;
        segment_free(a, g);
    }
    while (a->ev_pool) {
        evref *e = a->ev_pool;
        a->ev_pool = e->next;
        a->be->rt->event_destroy(a->be, e->ev);
        cw__free(e);
    }
    while (a->block_cache) {
        block *b = a->block_cache;
        a->block_cache = b->cache_next;
        cw__free(b);
    }
    cw__free(a->pools[0].v);
    cw__free(a->pools[1].v);
    cw__free(a->map);
    pthread_mutex_unlock(&a->mu);
    pthread_mutex_destroy(&a->mu);
    cw__free(a);
}

/* Best fit, then lowest address, among pool pi's blocks of >= n bytes; with ready_only,
 * only blocks usable on s without waiting. */
static block *find_block(cw__allocator *a, int pi, int64_t n, cw__stream *s, int ready_only) {
    pool *p = &a->pools[pi];
    for (int64_t i = pool_lower_bound(p, n, 0); i < p->n; i++)
        if (!ready_only || block_ready(a, p->v[i], s)) return p->v[i];
    return NULL;
}

static cw_status fail_locked(cw__allocator *a, cw_status st, int64_t bytes, int64_t n, cw__stream *s) {
    if (st == CW_ERR_BUDGET) {
        a->st.budget_failures++;
        return cw__error(a->ctx, st,
                         "temp allocation of %" PRId64 " bytes (%" PRId64 " rounded) on stream %p exceeds the budget: "
                         "budget %" PRId64 " bytes, %" PRId64 " bytes in use, %" PRId64
                         " reserved, largest free block %" PRId64 " bytes",
                         bytes, n, (void *)s, a->budget, a->st.allocated_bytes_current,
                         a->st.reserved_bytes_current, largest_free(a));
    }
    char who[128] = "device";
    if (a->user_null)
        snprintf(who, sizeof who, "user allocator (cw_context_set_allocator) returned NULL for a segment of %" PRId64
                 " bytes:", a->user_null);
    return cw__error(a->ctx, st,
                     "%s out of memory for an allocation of %" PRId64 " bytes (%" PRId64 " rounded) on stream %p: "
                     "%" PRId64 " bytes in use, %" PRId64 " reserved, largest free block %" PRId64 " bytes",
                     who, bytes, n, (void *)s, a->st.allocated_bytes_current, a->st.reserved_bytes_current,
                     largest_free(a));
}

static cw_status malloc_locked(cw__allocator *a, int64_t bytes, cw__stream *s, void **out) {
    int64_t n = cw__alloc_round(bytes);
    if (a->budget > 0 && n > a->budget) return fail_locked(a, CW_ERR_BUDGET, bytes, n, s);
    if (bytes > MAX_REQUEST) return fail_locked(a, CW_ERR_OUT_OF_MEMORY, bytes, n, s);
    /* Everything that can fail on the host is reserved first, so later steps cannot. */
    if (!pool_reserve(&a->pools[0], a->n_blocks + 2) || !pool_reserve(&a->pools[1], a->n_blocks + 2) ||
        !map_reserve(a) || !block_cache_reserve(a, 2))
        return cw__error(a->ctx, CW_ERR_OUT_OF_MEMORY, "allocator: out of host memory for bookkeeping");

    int pi = n <= SMALL_MAX ? POOL_SMALL : POOL_LARGE;
    int oom = 0, hit = 1;
    a->user_null = 0;
    /* 1. a cached block that is already in order for s */
    block *b = find_block(a, pi, n, s, 1);
    /* 2. a new segment while the cap allows: better than making s wait on another stream
     * (unless the pool prefers reuse: then another stream's block with a wait first) */
    if (!b && (a->flags & CW__ALLOC_PREFER_REUSE)) b = find_block(a, pi, n, s, 0);
    if (!b && (a->flags & CW__ALLOC_PREFER_REUSE)) b = find_block(a, 1 - pi, n, s, 0);
    if (!b) {
        CW_TRY(segment_new(a, pi, n, s, &b, &oom));
        hit = !b;
    }
    /* 3. at the cap: another stream's block (own pool first), with an event wait */
    if (!b) b = find_block(a, pi, n, s, 0);
    if (!b) b = find_block(a, 1 - pi, n, s, 0);
    /* 4. give fully cached segments back (host sync) and retry, if that can make room */
    if (!b) {
        int64_t freeable = cached_segment_bytes(a);
        int helps = a->budget > 0 && !oom ? a->budget - a->st.reserved_bytes_current + freeable >= n : freeable > 0;
        if (helps) {
            CW_TRY(release_cached_locked(a));
            oom = 0;
            CW_TRY(segment_new(a, pi, n, s, &b, &oom));
            hit = 0;
        }
    }
    if (!b) return fail_locked(a, oom ? CW_ERR_OUT_OF_MEMORY : CW_ERR_BUDGET, bytes, n, s);

    CW_TRY(block_order(a, b, s));
    pool *p = &a->pools[b->seg->pool];
    pool_remove(p, b);
    if (b->size - n >= GRAN) {
        /* split: the rest stays cached, remembering the same pending frees */
        block *r = block_take(a);
        r->addr = b->addr + (uintptr_t)n;
        r->size = b->size - n;
        r->seg = b->seg;
        r->prev = b;
        r->next = b->next;
        if (b->next) b->next->prev = r;
        b->next = r;
        r->n_pend = b->n_pend;
        for (int i = 0; i < b->n_pend; i++) {
            r->pend[i] = b->pend[i];
            r->pend[i]->refs++;
        }
        b->size = n;
        pool_insert(p, r);
    }
    pend_clear(a, b);
    b->allocated = 1;
    b->seg->n_live++;
    map_put(a->map, a->map_bits, ((uint64_t)1 << a->map_bits) - 1, b);
    a->map_n++;

    a->st.num_allocs++;
    a->st.cache_hits += hit;
    a->st.allocated_bytes_current += b->size;
    if (a->st.allocated_bytes_current > a->st.allocated_bytes_peak)
        a->st.allocated_bytes_peak = a->st.allocated_bytes_current;
    *out = (void *)b->addr;
    return CW_OK;
}

cw_status cw__alloc_malloc(cw__allocator *a, int64_t bytes, cw__stream *s, void **out) {
    if (!out) return cw__error(a ? a->ctx : NULL, CW_ERR_INVALID_ARG, "cw__alloc_malloc: out is NULL");
    *out = NULL;
    if (!a) return cw__error(NULL, CW_ERR_INVALID_ARG, "cw__alloc_malloc: allocator is NULL");
    if (bytes < 0)
        return cw__error(a->ctx, CW_ERR_INVALID_ARG, "cw__alloc_malloc: bytes = %" PRId64 " < 0", bytes);
    if (bytes == 0) return CW_OK;
    pthread_mutex_lock(&a->mu);
    cw_status st = malloc_locked(a, bytes, s, out);
    pthread_mutex_unlock(&a->mu);
    return st;
}

/* Joins nb (b's free right neighbour, out of the pools) into b. */
static void join(cw__allocator *a, block *b, block *nb) {
    pend_clear(a, nb);
    b->size += nb->size;
    b->next = nb->next;
    if (nb->next) nb->next->prev = b;
    block_give(a, nb);
}

static cw_status free_locked(cw__allocator *a, void *ptr, cw__stream *s) {
    uint64_t slot;
    block *b = map_find(a, (uintptr_t)ptr, &slot);
    if (!b)
        return cw__error(a->ctx, CW_ERR_INVALID_ARG,
                         "cw__alloc_free: %p was not allocated by this allocator (or was already freed)", ptr);
    cw_status st = CW_OK, poison_st = CW_OK;
    evref *e = NULL;
    /* s == NULL is host order: the caller already finished every use, so there is nothing
     * to record (and no stream to poison on) */
    if (s) {
        if (a->flags & CW__ALLOC_POISON) {
            /* the fill runs on s after the block's last use, before the free event */
            poison_st = a->be->rt->fill32_async(a->be, s, ptr, POISON_WORD, b->size / 4);
            if (poison_st != CW_OK)
                cw__error(a->ctx, poison_st, "cw__alloc_free: poison fill of %p failed (%s)", ptr,
                          cw_status_name(poison_st));
        }
        e = evref_record(a, s);
        if (!e) {
            /* no event: wait for the stream on the host instead, so the block is safe */
            a->st.host_syncs++;
            if ((st = a->be->rt->stream_synchronize(a->be, s)) != CW_OK)
                return cw__error(a->ctx, st, "cw__alloc_free: no event for %p and stream_synchronize failed (%s)",
                                 ptr, cw_status_name(st));
        }
    }
    map_remove_slot(a, slot);
    b->allocated = 0;
    b->seg->n_live--;
    if (e) {
        b->pend[0] = e;
        b->n_pend = 1;
    }
    a->st.num_frees++;
    a->st.allocated_bytes_current -= b->size;

    /* Coalesce with free neighbours, unless their pending frees cannot be remembered
     * together (more streams than MAX_PENDING): then they stay separate blocks. */
    pool *p = &a->pools[b->seg->pool];
    block *prev = b->prev, *next = b->next;
    if (prev && !prev->allocated && pend_merge(a, prev, b)) {
        pool_remove(p, prev);
        join(a, prev, b);
        b = prev;
    }
    if (next && !next->allocated && pend_merge(a, b, next)) {
        pool_remove(p, next);
        join(a, b, next);
    }
    pool_insert(p, b);
    return poison_st;
}

cw_status cw__alloc_free(cw__allocator *a, void *p, cw__stream *s) {
    if (!a) return cw__error(NULL, CW_ERR_INVALID_ARG, "cw__alloc_free: allocator is NULL");
    if (!p) return CW_OK;
    pthread_mutex_lock(&a->mu);
    cw_status st = free_locked(a, p, s);
    pthread_mutex_unlock(&a->mu);
    return st;
}

cw_status cw__alloc_release_cached(cw__allocator *a) {
    if (!a) return cw__error(NULL, CW_ERR_INVALID_ARG, "cw__alloc_release_cached: allocator is NULL");
    pthread_mutex_lock(&a->mu);
    cw_status st = release_cached_locked(a);
    pthread_mutex_unlock(&a->mu);
    return st;
}

void cw__alloc_forget_frees(cw__allocator *a) {
    if (!a) return;
    pthread_mutex_lock(&a->mu);
    for (segment *g = a->segs; g; g = g->next)
        for (block *b = g->first; b; b = b->next)
            if (!b->allocated) pend_clear(a, b);
    pthread_mutex_unlock(&a->mu);
}

void cw__alloc_stats(const cw__allocator *a, cw_memory_stats *out) {
    if (!a || !out) return;
    cw__allocator *m = (cw__allocator *)a; /* the lock is not part of the logical state */
    pthread_mutex_lock(&m->mu);
    /* field by field: the activations fields belong to the caller and may be unset */
    const cw_memory_stats *s = &a->st;
    out->budget = s->budget;
    out->reserved_bytes_current = s->reserved_bytes_current;
    out->reserved_bytes_peak = s->reserved_bytes_peak;
    out->allocated_bytes_current = s->allocated_bytes_current;
    out->allocated_bytes_peak = s->allocated_bytes_peak;
    out->num_allocs = s->num_allocs;
    out->num_frees = s->num_frees;
    out->cache_hits = s->cache_hits;
    out->num_device_allocs = s->num_device_allocs;
    out->num_device_frees = s->num_device_frees;
    out->cross_stream_waits = s->cross_stream_waits;
    out->host_syncs = s->host_syncs;
    out->budget_failures = s->budget_failures;
    pthread_mutex_unlock(&m->mu);
}

void cw__alloc_reset_peaks(cw__allocator *a) {
    if (!a) return;
    pthread_mutex_lock(&a->mu);
    a->st.reserved_bytes_peak = a->st.reserved_bytes_current;
    a->st.allocated_bytes_peak = a->st.allocated_bytes_current;
    pthread_mutex_unlock(&a->mu);
}

void cw__alloc_test_skip_waits(cw__allocator *a, int skip) {
    if (!a) return;
    pthread_mutex_lock(&a->mu);
    a->skip_waits = skip != 0;
    pthread_mutex_unlock(&a->mu);
}
