/* CW__ALLOC_DETERMINISTIC decides the same whatever the events' timing. The scheduler's
 * compile-time dry run (events complete at once) must predict the run (events still
 * pending): the same script of mallocs and frees on two streams, replayed once with every
 * event complete and once with none, must hand out the same addresses. Regression: the
 * allocator skipped the wait (and so the record of it) for a block whose free happened to
 * have completed, and a later choice between an "already waited" remainder and another
 * stream's better-fitting block then went the other way in the run: the plan exceeded the
 * budget the dry run had proved. */
#include "test_alloc_fake.h"

enum { KiB = 1024 };

static void script(int complete, uintptr_t out[3]) {
    cw_context *ctx = fk_context();
    fake_backend *f = fk_create(ctx, 0);
    cw__allocator *a = NULL;
    ASSERT_OK(cw__alloc_create(&a, ctx, &f->base, NULL, 0, CW__ALLOC_DETERMINISTIC | CW__ALLOC_PREFER_REUSE));
    cw__stream *s0 = &f->streams[0], *s1 = &f->streams[1];
    void *pa, *spacer, *pb, *spacer2, *filler, *q1, *q2;
    /* one 2 MiB small-pool segment, full: A and B are freed on s0, kept apart by live
     * spacers so they do not coalesce, and no never-used (ready) space is left */
    ASSERT_OK(cw__alloc_malloc(a, 1024 * KiB, s0, &pa));
    ASSERT_OK(cw__alloc_malloc(a, 64 * KiB, s0, &spacer));
    ASSERT_OK(cw__alloc_malloc(a, 256 * KiB, s0, &pb));
    ASSERT_OK(cw__alloc_malloc(a, 64 * KiB, s0, &spacer2));
    ASSERT_OK(cw__alloc_malloc(a, 640 * KiB, s0, &filler));
    ASSERT_EQ_I((int64_t)((uintptr_t)filler - (uintptr_t)pa), (int64_t)(1408 * KiB)); /* one segment */
    fk_use(s0);
    ASSERT_OK(cw__alloc_free(a, pa, s0));
    ASSERT_OK(cw__alloc_free(a, pb, s0));
    if (complete) fk_finish_all(f); /* the dry run's view: every event already complete */
    /* s1 takes half of A (a wait on A's free), then asks for 256 KiB: A's remainder, which
     * s1 is already ordered after, or B, which fits exactly but needs another wait */
    ASSERT_OK(cw__alloc_malloc(a, 512 * KiB, s1, &q1));
    ASSERT_OK(cw__alloc_malloc(a, 256 * KiB, s1, &q2));
    out[0] = (uintptr_t)q1, out[1] = (uintptr_t)q2, out[2] = (uintptr_t)pa;
    fk_use(s1);
    ASSERT_OK(cw__alloc_free(a, q1, s1));
    ASSERT_OK(cw__alloc_free(a, q2, s1));
    ASSERT_OK(cw__alloc_free(a, spacer, s0));
    ASSERT_OK(cw__alloc_free(a, spacer2, s0));
    ASSERT_OK(cw__alloc_free(a, filler, s0));
    fk_finish_all(f);
    cw__alloc_destroy(a);
    free(f);
    cw_context_destroy(ctx);
}

int main(void) {
    uintptr_t pending[3], done[3];
    script(0, pending);
    script(1, done);
    printf("events pending: q1 %#lx q2 %#lx; events complete: q1 %#lx q2 %#lx (A at %#lx)\n",
           (unsigned long)pending[0], (unsigned long)pending[1], (unsigned long)done[0], (unsigned long)done[1],
           (unsigned long)pending[2]);
    ASSERT_EQ_I((int64_t)pending[0], (int64_t)done[0]);
    ASSERT_EQ_I((int64_t)pending[1], (int64_t)done[1]);
    /* and the choice is the already-ordered remainder of A, not a new wait on B */
    ASSERT_EQ_I((int64_t)done[1], (int64_t)(pending[2] + 512 * KiB));
    TEST_DONE();
}
