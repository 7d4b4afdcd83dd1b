/* Independent references for the half-precision formats (IEEE binary16 "f16", bfloat16
 * "bf16"): plain double arithmetic on the formats' definitions, and nearest-code rounding by
 * search. Shared by test_half (the library's conversions) and test_safetensors (the reader's
 * dtype conversions). */
#ifndef CW_TEST_HALF_REF_H
#define CW_TEST_HALF_REF_H

#include <math.h>
#include <stdint.h>

/* ---- references: double arithmetic on the format definitions ---- */

static inline double ref_f16(uint16_t h) {
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v;
    if (e == 31) v = m ? NAN : INFINITY;
    else if (e == 0) v = ldexp((double)m, -24);
    else v = ldexp((double)(1024 + m), e - 25);
    return s ? -v : v;
}

static inline double ref_bf16(uint16_t b) {
    int s = b >> 15, e = (b >> 7) & 255, m = b & 127;
    double v;
    if (e == 255) v = m ? NAN : INFINITY;
    else if (e == 0) v = ldexp((double)m, -133);
    else v = ldexp((double)(128 + m), e - 134);
    return s ? -v : v;
}

/* Nearest code by binary search over the positive codes (monotonic), ties to the even
 * code; past the largest finite code the next "value" is where inf starts for rounding
 * (2^16 for f16, 2^128 for bf16). NaN: 0xffff (callers compare NaN-ness only). */
static inline uint16_t ref_round(double x, double (*val)(uint16_t), uint16_t maxfin, double beyond, uint16_t inf) {
    uint16_t sign = signbit(x) ? 0x8000 : 0;
    double a = fabs(x);
    if (isnan(x)) return 0xffff;
    if (a >= beyond) return sign | inf;
    uint16_t lo = 0, hi = maxfin;
    while (lo < hi) { /* largest code with val <= a */
        uint16_t mid = (uint16_t)((lo + hi + 1) / 2);
        if (val(mid) <= a) lo = mid;
        else hi = (uint16_t)(mid - 1);
    }
    double v0 = val(lo), v1 = lo == maxfin ? beyond : val((uint16_t)(lo + 1));
    uint16_t c = lo;
    if (a - v0 > v1 - a || (a - v0 == v1 - a && (lo & 1))) c = (uint16_t)(lo + 1);
    if (c > maxfin) return sign | inf;
    return sign | c;
}

static inline uint16_t ref_to_f16(double x) { return ref_round(x, ref_f16, 0x7bff, 65536.0, 0x7c00); }
static inline uint16_t ref_to_bf16(double x) { return ref_round(x, ref_bf16, 0x7f7f, ldexp(1.0, 128), 0x7f80); }

#endif
