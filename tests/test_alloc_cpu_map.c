/* The cpu backend's large blocks: from 1 MiB on, dev_alloc maps pages of their own and
 * dev_free unmaps them, so a freed arena leaves the process (Linux: checked in
 * /proc/self/maps); smaller blocks come from the heap. Both go through the failure hook. */
#include <stdio.h>
#include <unistd.h>

#include "backend/cpu/cpu.h"
#include "core/core.h"
#include "testutil.h"

/* 1 when a mapping of /proc/self/maps starts at lo and spans at least n bytes; -1 when the
 * file cannot be read. */
static int mapped(uintptr_t lo, size_t n) {
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return -1;
    char line[512];
    int found = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long a, b;
        if (sscanf(line, "%lx-%lx", &a, &b) == 2 && a == lo && b - a >= n) found = 1;
    }
    fclose(f);
    return found;
}

int main(void) {
#if defined(__SANITIZE_ADDRESS__)
    fprintf(stderr, "AddressSanitizer build: dev_alloc keeps every block on the heap: skipped\n");
    return CW_TEST_SKIP;
#endif
    cw_context *ctx;
    cw_context_config cfg = CW_CONTEXT_CONFIG_INIT;
    cfg.backend = CW_BACKEND_CPU;
    ASSERT_OK(cw_context_create(&ctx, &cfg));
    cw__backend *be = ctx->be;
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const int64_t big = INT64_C(4) << 20;
    /* twice: glibc's malloc maps the first 4 MiB block itself, then raises its mmap
     * threshold past 4 MiB when it is freed and serves the next from the brk heap */
    for (int k = 0; k < 2; k++) {
        void *p = NULL;
        ASSERT_OK(be->rt->dev_alloc(be, big, &p));
        ASSERT_TRUE(p != NULL && (uintptr_t)p % 64 == 0);
        memset(p, 1, (size_t)big); /* all of it is ours */
        const uintptr_t base = (uintptr_t)p & ~(uintptr_t)(page - 1);
        const int m = mapped(base, (size_t)big);
        if (m < 0) {
            be->rt->dev_free(be, p);
            cw_context_destroy(ctx);
            fprintf(stderr, "no /proc/self/maps: skipped\n");
            return CW_TEST_SKIP;
        }
        ASSERT_EQ_I(m, 1);
        be->rt->dev_free(be, p);
        ASSERT_EQ_I(mapped(base, (size_t)big), 0); /* back to the OS */
    }

    void *q = NULL; /* a small block: from the heap, freed there */
    ASSERT_OK(be->rt->dev_alloc(be, 4096, &q));
    ASSERT_TRUE(q != NULL && (uintptr_t)q % 64 == 0);
    memset(q, 1, 4096);
    be->rt->dev_free(be, q);

    for (int k = 0; k < 2; k++) { /* the failure hook covers both */
        cw__test_fail_after(1);
        void *r = NULL;
        ASSERT_STATUS(be->rt->dev_alloc(be, k ? big : 4096, &r), CW_ERR_OUT_OF_MEMORY);
        ASSERT_TRUE(r == NULL);
        cw__test_fail_after(0);
    }
    cw_context_destroy(ctx);
    TEST_DONE();
}
