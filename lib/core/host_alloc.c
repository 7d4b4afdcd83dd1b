/* The host-allocation hook every library allocation goes through. Built twice (CMake):
 * plain for the libraries users link, and with CW_FAULT_INJECTION for the test library
 * (convweave_test), whose cw__test_fail_after makes a chosen allocation fail. So the
 * release hot path pays no atomic counter per allocation. */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#ifdef __GLIBC__
#include <malloc.h> /* malloc_trim */
#endif

#include "core/core.h"

#ifdef CW_FAULT_INJECTION
#include <stdatomic.h>

static _Atomic int64_t cw__alloc_calls;
static _Atomic int64_t cw__fail_at; /* absolute call number that fails; 0 = never */

void cw__test_fail_after(int64_t n) {
    atomic_store(&cw__fail_at, n > 0 ? atomic_load(&cw__alloc_calls) + n : 0);
}

int64_t cw__test_alloc_count(void) { return atomic_load(&cw__alloc_calls); }

static int cw__alloc_should_fail(void) {
    int64_t k = atomic_fetch_add(&cw__alloc_calls, 1) + 1;
    int64_t f = atomic_load(&cw__fail_at);
    return f != 0 && k == f;
}
#else
#define cw__alloc_should_fail() 0
#endif

void *cw__malloc(size_t n) { return cw__alloc_should_fail() ? NULL : malloc(n ? n : 1); }
void *cw__calloc(size_t count, size_t n) {
    return cw__alloc_should_fail() ? NULL : calloc(count ? count : 1, n ? n : 1);
}
void *cw__realloc(void *p, size_t n) { return cw__alloc_should_fail() ? NULL : realloc(p, n ? n : 1); }
void cw__free(void *p) { free(p); }
void *cw__map(size_t n) {
    if (cw__alloc_should_fail()) return NULL;
    void *p = mmap(NULL, n ? n : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}
void cw__unmap(void *p, size_t n) {
    if (p) munmap(p, n ? n : 1);
}
void cw__host_trim(void) {
#ifdef __GLIBC__
    malloc_trim(0); /* glibc's main arena keeps freed pages resident otherwise */
#endif
}
char *cw__strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = cw__malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}
