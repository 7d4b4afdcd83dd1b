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

/* Collects the activations' lifetimes in host order; returns how many. */
static int cw__lives(const cw_plan *p, cw__life *out, int *slot) {
    int n = 0;
    for (int b = 0; b < p->n_bufs; b++) slot[b] = -1;
    for (int a = 0; a < p->n_acts; a++) {
        const cw__action *ac = &p->acts[a];
        if (ac->kind == CW__A_TASK || p->bufs[ac->id].kind != CW__B_ACT) continue;
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
        if (ac->kind == CW__A_TASK || p->bufs[ac->id].kind != CW__B_ACT) continue;
        cur += (ac->kind == CW__A_ALLOC ? 1 : -1) * cw__alloc_round(p->bufs[ac->id].bytes);
        if (cur > peak) peak = cur;
    }
    return peak;
}

/* ALLOC of b waits for the free of every earlier activation sharing bytes with it that was
 * freed on another stream; such a free records an event. */
static cw_status cw__reuse_waits(cw_plan *p, const cw__life *lv, int n) {
    for (int k = 0; k < n; k++) {
        cw__action *al = &p->acts[lv[k].a0];
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
    int *slot = cw__malloc((size_t)p->n_bufs * sizeof *slot + 1);
    cw_status st = CW_OK;
    if (!lv || !placed || !scratch || !slot) {
        st = cw__error(p->ctx, CW_ERR_OUT_OF_MEMORY, "compile: out of host memory");
    } else {
        int n = cw__lives(p, lv, slot);
        cw__life *order = placed; /* sorted copy first, then the placed prefix grows in it */
        for (int k = 0; k < n; k++) order[k] = lv[k];
        qsort(order, (size_t)n, sizeof *order, cw__life_cmp);
        p->act_bytes = 0;
        for (int k = 0; k < n; k++) {
            cw__life l = order[k];
            int64_t off = cw__lowest_gap(p, order, k, &l, scratch);
            p->bufs[l.buf].offset = off;
            if (off + l.size > p->act_bytes) p->act_bytes = off + l.size;
        }
        p->act_live_peak = cw__live_peak(p);
        st = cw__reuse_waits(p, lv, n);
    }
    cw__free(lv), cw__free(placed), cw__free(scratch), cw__free(slot);
    return st;
}
