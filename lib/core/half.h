/* Half-precision storage formats (IEEE binary16 "f16", bfloat16 "bf16") to and from f32,
 * bit-exactly and independent of the FPU's rounding mode and flush-to-zero setting: every
 * conversion is integer work on the bit patterns. Static inline so the cpu kernels can use
 * them per element; cw_dtype_convert (dtype.c) is the bulk host form the API offers. */
#ifndef CW_HALF_H
#define CW_HALF_H

#include <stdint.h>
#include <string.h>

static inline float cw__u32_as_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint32_t cw__f32_as_u32(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* Exact (every f16 is an f32): subnormals normalised, inf kept, NaN keeps its sign and
 * payload (in the top mantissa bits). */
static inline float cw__f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (exp == 0x1f) return cw__u32_as_f32(sign | 0x7f800000u | (mant << 13));
    if (exp == 0) {
        if (mant == 0) return cw__u32_as_f32(sign);
        /* subnormal mant * 2^-24: shift until the leading one is the implicit bit */
        int e = -1;
        do {
            e++;
            mant <<= 1;
        } while (!(mant & 0x400u));
        return cw__u32_as_f32(sign | ((uint32_t)(112 - e) << 23) | ((mant & 0x3ffu) << 13));
    }
    return cw__u32_as_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

/* Exact: bf16 is the top half of an f32. */
static inline float cw__bf16_to_f32(uint16_t b) { return cw__u32_as_f32((uint32_t)b << 16); }

/* Round to nearest, ties to even. |x| >= 65520 (the midpoint past the largest finite
 * f16, 65504) gives inf; results below 2^-14 are f16 subnormals, rounded once; NaN stays a
 * quiet NaN with its sign and top payload bits. */
static inline uint16_t cw__f32_to_f16(float f) {
    uint32_t x = cw__f32_as_u32(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) /* inf, or NaN made quiet */
        return (uint16_t)(sign | (ax > 0x7f800000u ? 0x7e00u | ((ax >> 13) & 0x3ffu) : 0x7c00u));
    if (ax >= 0x47800000u) return (uint16_t)(sign | 0x7c00u); /* >= 2^16: overflow */
    if (ax < 0x38800000u) {                                   /* below 2^-14: subnormal */
        if (ax < 0x33000000u) return sign;                    /* <= 2^-25 rounds to 0 */
        uint32_t e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - e, q = m >> shift, rem = m & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (q & 1u))) q++;
        return (uint16_t)(sign | q);
    }
    uint32_t bits = (((ax >> 23) - 112u) << 10) | ((ax >> 13) & 0x3ffu), rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (bits & 1u))) bits++; /* a carry may give inf */
    return (uint16_t)(sign | bits);
}

/* Round to nearest, ties to even (overflow gives inf; subnormals round like any value);
 * NaN stays a quiet NaN with its sign and top payload bits. */
static inline uint16_t cw__f32_to_bf16(float f) {
    uint32_t x = cw__f32_as_u32(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

#endif
