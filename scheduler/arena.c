/* Activation memory, planned once at compile time. A plan's allocations and frees happen in
 * a fixed host order, so every activation's lifetime is known: each gets a fixed offset in
 * one arena the plan owns (greedy by size: the largest first, each at the lowest offset
 * free of every activation alive at the same time). A caching allocator cannot see the
 * future and fragments: 746 MiB reserved for 512 MiB in use at once in the SD decoder at
 * 512² before this. An activation that reuses bytes of one freed on another stream waits
 * for that free's event first, as the stream-ordered allocator did. */
#include <stdlib.h>

#include "scheduler/sched.h"

typedef struct cw__life {
    int buf;
    int64_t size;
    int a0, a1; /* its ALLOC and FREE action indices */
} cw__life;

static int cw__life_cmp(const void *x, const void *y) {
    const cw__life *a = x, *b = y;
    if (a->size != b->size) return a->size > b->size ? -1 : 1;
    return a->a0 - b->a0;
}

/* A placed block's byte range [lo, hi). */
typedef struct cw__span {
    int64_t lo, hi;
} cw__span;

static int cw__span_cmp(const void *x, const void *y) {
    const cw__span *a = x, *b = y;
    return a->lo < b->lo ? -1 : a->lo > b->lo;
}

/* Lowest offset of a block of l->size bytes clear of the placed lives overlapping l's. */
static int64_t cw__lowest_gap(const cw_plan *p, const cw__life *placed, int n, const cw__life *l, cw__span *scratch) {
    int m = 0;
    for (int k = 0; k < n; k++)
        if (placed[k].a0 < l->a1 && l->a0 < placed[k].a1) {
            int64_t lo = p->bufs[placed[k].buf].offset;
            scratch[m++] = (cw__span){lo, lo + placed[k].size};
        }
    qsort(scratch, (size_t)m, sizeof *scratch, cw__span_cmp);
    int64_t off = 0;
    for (int k = 0; k < m && off + l->size > scratch[k].lo; k++)
        if (scratch[k].hi > off) off = scratch[k].hi;
    return off;
}

/* Lowest offset for a head h and its tail t, placed right after it (cw__buf.tail), clear of
 * the placed lives overlapping either in time. */
static int64_t cw__lowest_pair(const cw_plan *p, const cw__life *placed, int n, const cw__life *h, const cw__life *t) {
    int64_t off = 0;
    for (int bumped = 1; bumped;) {
        bumped = 0;
        for (int k = 0; k < n; k++) {
            const cw__life *q = &placed[k];
            int64_t lo = p->bufs[q->buf].offset, hi = lo + q->size;
            if (q->a0 < h->a1 && h->a0 < q->a1 && lo < off + h->size && off < hi) {
                off = hi, bumped = 1;
            } else if (q->a0 < t->a1 && t->a0 < q->a1 && lo < off + h->size + t->size && off + h->size < hi) {
                off = hi - h->size, bumped = 1;
            }
        }
    }
    return off;
}

/* Collects the activations' lifetimes in host order; returns how many. */
static int cw__lives(const cw_plan *p, cw__life *out, int *slot) {
    int n = 0;
    for (int b = 0; b < p->n_bufs; b++) slot[b] = -1;
    for (int a = 0; a < p->n_acts; a++) {
        const cw__action *ac = &p->acts[a];
        if (ac->kind == CW__A_TASK || ac->kind == CW__A_DROP || p->bufs[ac->id].kind != CW__B_ACT) continue;
        if (ac->kind == CW__A_ALLOC) {
            slot[ac->id] = n;
            out[n++] = (cw__life){ac->id, cw__alloc_round(p->bufs[ac->id].bytes), a, p->n_acts};
        } else if (slot[ac->id] >= 0) {
            out[slot[ac->id]].a1 = a;
        }
    }
    return n;
}

/* The most bytes alive at once, in host order. */
static int64_t cw__live_peak(const cw_plan *p) {
    int64_t cur = 0, peak = 0;
    for (int a = 0; a < p->n_acts; a++) {
        const cw__action *ac = &p->acts[a];
        if (ac->kind == CW__A_TASK || ac->kind == CW__A_DROP || p->bufs[ac->id].kind != CW__B_ACT) continue;
        cur += (ac->kind == CW__A_ALLOC ? 1 : -1) * cw__alloc_round(p->bufs[ac->id].bytes);
        if (cur > peak) peak = cur;
    }
    return peak;
}

/* ALLOC of b waits for the free of every earlier activation sharing bytes with it that was
 * freed on another stream; such a free records an event. A tail's waits go to its head's
 * ALLOC (its bytes are written through the head, whose users that ALLOC orders). */
static cw_status cw__reuse_waits(cw_plan *p, const cw__life *lv, int n, const int *slot) {
    for (int k = 0; k < n; k++) {
        int hd = p->bufs[lv[k].buf].head;
        cw__action *al = &p->acts[hd >= 0 && slot[hd] >= 0 ? lv[slot[hd]].a0 : lv[k].a0];
        const cw__buf *bb = &p->bufs[lv[k].buf];
        for (int j = 0; j < n; j++) {
            const cw__buf *ba = &p->bufs[lv[j].buf];
            if (lv[j].a1 >= lv[k].a0 || ba->offset >= bb->offset + lv[k].size || bb->offset >= ba->offset + lv[j].size)
                continue;
            cw__action *fr = &p->acts[lv[j].a1];
            if (fr->stream == al->stream) continue; /* stream order already holds */
            if (fr->event < 0) fr->event = p->n_events++;
            int *w = cw__realloc(al->waits, (size_t)(al->n_waits + 1) * sizeof *w);
            if (!w) return cw__error(p->ctx, CW_ERR_OUT_OF_MEMORY, "compile: out of host memory");
            al->waits = w;
            al->waits[al->n_waits++] = fr->event;
        }
    }
    return CW_OK;
}

cw_status cw__plan_place_activations(cw_plan *p) {
    cw__life *lv = cw__malloc((size_t)p->n_bufs * sizeof *lv + 1);
    cw__life *placed = cw__malloc((size_t)p->n_bufs * sizeof *placed + 1);
    cw__span *scratch = cw__malloc((size_t)p->n_bufs * sizeof *scratch + 1);
    cw__life *scratch_lives = cw__malloc((size_t)p->n_bufs * sizeof *scratch_lives + 1);
    int *slot = cw__malloc((size_t)p->n_bufs * sizeof *slot + 1);
    cw_status st = CW_OK;
    if (!lv || !placed || !scratch || !scratch_lives || !slot) {
        st = cw__error(p->ctx, CW_ERR_OUT_OF_MEMORY, "compile: out of host memory");
    } else {
        int n = cw__lives(p, lv, slot);
        cw__life *order = scratch_lives; /* sorted by size, a head with its tail's */
        for (int k = 0; k < n; k++) {
            order[k] = lv[k];
            int t = p->bufs[lv[k].buf].tail;
            if (t >= 0 && slot[t] >= 0) order[k].size += lv[slot[t]].size;
        }
        qsort(order, (size_t)n, sizeof *order, cw__life_cmp);
        p->act_bytes = 0;
        int np = 0;
        for (int k = 0; k < n; k++) {
            const cw__buf *b = &p->bufs[order[k].buf];
            if (b->head >= 0 && slot[b->head] >= 0) continue; /* placed with its head */
            cw__life l = lv[slot[order[k].buf]];
            int64_t off, end;
            if (b->tail >= 0 && slot[b->tail] >= 0) {
                cw__life t = lv[slot[b->tail]];
                off = cw__lowest_pair(p, placed, np, &l, &t);
                p->bufs[t.buf].offset = off + l.size;
                placed[np++] = t;
                end = off + l.size + t.size;
            } else {
                off = cw__lowest_gap(p, placed, np, &l, scratch);
                end = off + l.size;
            }
            p->bufs[l.buf].offset = off;
            placed[np++] = l;
            if (end > p->act_bytes) p->act_bytes = end;
        }
        p->act_live_peak = cw__live_peak(p);
        st = cw__reuse_waits(p, lv, n, slot);
    }
    cw__free(lv), cw__free(placed), cw__free(scratch), cw__free(scratch_lives), cw__free(slot);
    return st;
}
