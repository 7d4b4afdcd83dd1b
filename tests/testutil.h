/* Tiny test harness: assertions that print both sides and the line, a seeded RNG, and
 * the skip code. Every test is a plain executable registered with ctest. */
#ifndef CW_TESTUTIL_H
#define CW_TESTUTIL_H

#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err_metric.h"

#define CW_TEST_SKIP 77

#if defined(__GNUC__)
__attribute__((unused))
#endif
static int cw_test_failures;

#define CHECK(cond)                                                                   \
    do {                                                                              \
        if (!(cond)) {                                                                \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
            cw_test_failures++;                                                       \
        }                                                                             \
    } while (0)

#define ASSERT_TRUE(cond)                                                                    \
    do {                                                                                     \
        if (!(cond)) {                                                                       \
            fprintf(stderr, "%s:%d: ASSERT failed: %s\n", __FILE__, __LINE__, #cond);        \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

#define ASSERT_EQ_I(a, b)                                                                             \
    do {                                                                                              \
        long long cw_a_ = (long long)(a), cw_b_ = (long long)(b);                                     \
        if (cw_a_ != cw_b_) {                                                                         \
            fprintf(stderr, "%s:%d: ASSERT_EQ failed: %s = %lld, %s = %lld\n", __FILE__, __LINE__, #a, \
                    cw_a_, #b, cw_b_);                                                                \
            exit(1);                                                                                  \
        }                                                                                             \
    } while (0)

#define ASSERT_LE_I(a, b)                                                                             \
    do {                                                                                              \
        long long cw_a_ = (long long)(a), cw_b_ = (long long)(b);                                     \
        if (!(cw_a_ <= cw_b_)) {                                                                      \
            fprintf(stderr, "%s:%d: ASSERT_LE failed: %s = %lld, %s = %lld\n", __FILE__, __LINE__, #a, \
                    cw_a_, #b, cw_b_);                                                                \
            exit(1);                                                                                  \
        }                                                                                             \
    } while (0)

/* Status check that prints the status name and the context's message. */
#define ASSERT_OK_CTX(ctx, call)                                                                     \
    do {                                                                                             \
        cw_status cw_s_ = (call);                                                                    \
        if (cw_s_ != CW_OK) {                                                                        \
            fprintf(stderr, "%s:%d: %s returned %s: %s\n", __FILE__, __LINE__, #call,               \
                    cw_status_name(cw_s_), (ctx) ? cw_context_get_last_error(ctx) : "");                \
            exit(1);                                                                                 \
        }                                                                                            \
    } while (0)
#define ASSERT_OK(call) ASSERT_OK_CTX((cw_context *)NULL, call)

#define ASSERT_STATUS(call, expect)                                                                   \
    do {                                                                                              \
        cw_status cw_s_ = (call);                                                                     \
        if (cw_s_ != (expect)) {                                                                      \
            fprintf(stderr, "%s:%d: %s returned %s, expected %s\n", __FILE__, __LINE__, #call,       \
                    cw_status_name(cw_s_), cw_status_name(expect));                                   \
            exit(1);                                                                                  \
        }                                                                                             \
    } while (0)

/* Ends main: prints a summary line and returns the exit code. */
#define TEST_DONE()                                                                 \
    do {                                                                            \
        if (cw_test_failures) {                                                     \
            fprintf(stderr, "%d check(s) failed\n", cw_test_failures);              \
            return 1;                                                               \
        }                                                                           \
        return 0;                                                                   \
    } while (0)

/* splitmix64: seeded, reproducible. */
typedef struct { uint64_t s; } cw_rng;
static inline uint64_t cw_rng_next(cw_rng *r) {
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
/* uniform integer in [lo, hi] */
static inline int64_t cw_rng_range(cw_rng *r, int64_t lo, int64_t hi) {
    return lo + (int64_t)(cw_rng_next(r) % (uint64_t)(hi - lo + 1));
}
/* uniform float in [-1, 1) */
static inline float cw_rng_float(cw_rng *r) {
    return (float)((double)(cw_rng_next(r) >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0);
}
/* Seed from env CW_TEST_SEED or the default; printed so a failure can be reproduced. */
static inline uint64_t cw_test_seed(uint64_t dflt) {
    const char *e = getenv("CW_TEST_SEED");
    uint64_t s = e ? strtoull(e, NULL, 0) : dflt;
    fprintf(stderr, "seed %" PRIu64 " (rerun with CW_TEST_SEED=%" PRIu64 ")\n", s, s);
    return s;
}
/* 1 when CW_TEST_QUICK is set (scripts/test.sh sets it for the sanitizer builds): tests
 * may use smaller (still meaningful) sizes. */
static inline int cw_test_quick(void) { return getenv("CW_TEST_QUICK") != NULL; }

#endif
