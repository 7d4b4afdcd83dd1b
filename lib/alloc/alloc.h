/* Budgeted caching allocator: stream-ordered reuse of device blocks under a hard cap on
 * reserved bytes. Used for every temporary buffer (and, unbudgeted, for activations). */
#ifndef CW_ALLOC_H
#define CW_ALLOC_H

#include "backend/backend.h"

enum {
    CW__ALLOC_POISON = 1u << 0, /* fill freed blocks with NaN (CW_POISON_NAN_BITS) on their stream */
    /* Choices never depend on timing: a block freed on another stream counts as in order
     * for s only after s waited on its event, never because the event happens to have
     * completed. Then a replay of the same call sequence makes the same choices on any
     * backend (the scheduler's compile-time dry run predicts the run exactly). */
    CW__ALLOC_DETERMINISTIC = 1u << 1,
    /* Below the cap, reuse another stream's free block (with an event wait; either pool)
     * before taking a new segment: for unbudgeted pools (activations) that would otherwise
     * grow with every cross-stream free, and for plans' primed arenas. */
    CW__ALLOC_PREFER_REUSE = 1u << 2
};

/* Where a pool takes its segments besides its backend's dev_alloc, and whom it tells how
 * many it holds: the context implements it (core/context.c, cw__context_seg_source) for
 * the pools on its own backend; the allocator only calls these hooks, never the context.
 * Every hook is required. The allocator calls them under its own lock, so a hook never
 * calls back into an allocator. */
typedef struct cw__seg_source {
    void *self;
    /* The user allocator in force now (alloc NULL: take segments from dev_alloc). */
    void (*user_allocator)(void *self, cw_allocator *out);
    /* The stream a user allocator is given for a segment taken outside a run (stream 0,
     * which every run's streams wait for at its fork). */
    cw_status (*idle_stream)(void *self, cw__stream **out);
    /* n segments of `bytes` bytes in all were taken (n > 0) or given back (n < 0). */
    void (*held)(void *self, int64_t n, int64_t bytes);
} cw__seg_source;

/* core/context.c: the context's segment source (its user allocator, stream 0, its count of
 * held segments), for pools on ctx->be. */
cw__seg_source cw__context_seg_source(cw_context *ctx);

/* budget <= 0: unlimited. be is borrowed. ctx (may be NULL) receives error messages. src
 * (copied; NULL: dev_alloc only, nobody told) is where segments come from. */
cw_status cw__alloc_create(cw__allocator **out, cw_context *ctx, cw__backend *be, const cw__seg_source *src,
                           int64_t budget, uint32_t flags);
/* Synchronises outstanding free events, returns every segment to the device. Accepts NULL. */
void cw__alloc_destroy(cw__allocator *a);
/* A block of at least `bytes` usable on stream s (already ordered after any previous use
 * of the memory). At the cap: reuse other streams' free blocks with an event wait, then
 * release cached segments (host sync) and retry, then CW_ERR_BUDGET with a message naming
 * the request, the budget, bytes in use and the largest free block. bytes == 0 gives NULL. */
cw_status cw__alloc_malloc(cw__allocator *a, int64_t bytes, cw__stream *s, void **out);
/* Frees p after all work queued so far on s (the stream of its last use). s == NULL means
 * host order: the caller already finished every use (no event, no poison); likewise
 * malloc with s == NULL synchronises pending frees on the host. */
cw_status cw__alloc_free(cw__allocator *a, void *p, cw__stream *s);
/* The host has waited for every stream that used a: forgets every pending free (all are
 * complete), so what a does next no longer depends on which streams freed what. */
void cw__alloc_forget_frees(cw__allocator *a);
/* Returns cached free segments to the device (synchronising their events). */
cw_status cw__alloc_release_cached(cw__allocator *a);
/* Fills the temp fields of out (budget, reserved/allocated, counters). */
void cw__alloc_stats(const cw__allocator *a, cw_memory_stats *out);
void cw__alloc_reset_peaks(cw__allocator *a);
/* Rounded size a request of `bytes` occupies (for planners that predict usage). */
int64_t cw__alloc_round(int64_t bytes);
/* Test-only: 1 drops the cross-stream event wait (the cross-stream test must then fail). */
void cw__alloc_test_skip_waits(cw__allocator *a, int skip);

#endif
