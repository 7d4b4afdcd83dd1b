/* Row conversions between the storage dtypes (f32, f16, bf16) and the f32 the cpu kernels
 * compute in: the loads of im2col, prep, add, the per-channel ops and GroupNorm statistics,
 * and the stores of every epilogue. Bit-exact with core/half.h's scalar functions (ties to
 * even, NaN quieted), whatever the FPU's rounding mode or FTZ/DAZ flags: bf16 is integer
 * work the compiler vectorises; f16 uses the F16C instructions where the CPU has them
 * (vcvtph2ps is exact; vcvtps2ph with an immediate round-to-nearest-even ignores MXCSR's
 * rounding mode and does not flush subnormal results), else branch-free C for loads and
 * the scalar function for stores. */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "core/half.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CW_CVT_X86 1
#endif

/* ---- bf16: shifts and an add, vectorised by the compiler -------------------------------- */

static void bf16_load(float *restrict d, const uint16_t *restrict s, int64_t n) {
    for (int64_t i = 0; i < n; i++) d[i] = cw__u32_as_f32((uint32_t)s[i] << 16);
}

static void bf16_store(uint16_t *restrict d, const float *restrict s, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        uint32_t x = cw__f32_as_u32(s[i]);
        uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16, quiet = (x >> 16) | 0x40u;
        d[i] = (uint16_t)((x & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
    }
}

/* ---- f16 ------------------------------------------------------------------------------ */

/* Branch-free, so the compiler vectorises it: a normal f16 rebiases its exponent, a
 * subnormal is mant * 2^-24 (an exact product of normal floats: no FTZ/DAZ effect), inf
 * and NaN keep their payload unquieted, as cw__f16_to_f32 does. */
static void f16_load_scalar(float *restrict d, const uint16_t *restrict s, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const uint32_t h = s[i], sign = (h & 0x8000u) << 16, em = h & 0x7fffu, e = em >> 10;
        const uint32_t normal = (em << 13) + (112u << 23), infnan = (em << 13) | 0x7f800000u;
        const uint32_t sub = cw__f32_as_u32((float)(int32_t)(em & 0x3ffu) * 0x1p-24f);
        d[i] = cw__u32_as_f32(sign | (e == 0 ? sub : e == 31 ? infnan : normal));
    }
}

static void f16_store_scalar(uint16_t *restrict d, const float *restrict s, int64_t n) {
    for (int64_t i = 0; i < n; i++) d[i] = cw__f32_to_f16(s[i]);
}

#ifdef CW_CVT_X86
/* vcvtph2ps quiets a signalling NaN (cw__f16_to_f32 keeps it as it is): a block holding a
 * NaN is redone by the scalar function. */
__attribute__((target("avx,f16c"))) static void f16_load_f16c(float *restrict d, const uint16_t *restrict s,
                                                              int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i)));
        _mm256_storeu_ps(d + i, v);
        if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)))
            for (int k = 0; k < 8; k++) d[i + k] = cw__f16_to_f32(s[i + k]);
    }
    for (; i < n; i++) d[i] = cw__f16_to_f32(s[i]);
}

__attribute__((target("avx,f16c"))) static void f16_store_f16c(uint16_t *restrict d, const float *restrict s,
                                                               int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(d + i), _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) d[i] = cw__f32_to_f16(s[i]);
}

/* libgcc fills the CPU model before main; the answer never changes, so a racy first read
 * is harmless (every thread computes the same value). */
static int have_f16c(void) {
    static int cached = -1;
    int v = __atomic_load_n(&cached, __ATOMIC_RELAXED);
    if (v < 0) {
        __builtin_cpu_init();
        v = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
        __atomic_store_n(&cached, v, __ATOMIC_RELAXED);
    }
    return v;
}
#endif

static int g_force_scalar; /* tests and benchmarks: the portable rows instead of F16C */

void cw__cpu_cvt_force_scalar(int on) { __atomic_store_n(&g_force_scalar, on, __ATOMIC_RELAXED); }
static int force_scalar(void) { return __atomic_load_n(&g_force_scalar, __ATOMIC_RELAXED); }

static void f16_load(float *d, const uint16_t *s, int64_t n) {
#ifdef CW_CVT_X86
    if (!force_scalar() && have_f16c()) {
        f16_load_f16c(d, s, n);
        return;
    }
#endif
    f16_load_scalar(d, s, n);
}

static void f16_store(uint16_t *d, const float *s, int64_t n) {
#ifdef CW_CVT_X86
    if (!force_scalar() && have_f16c()) {
        f16_store_f16c(d, s, n);
        return;
    }
#endif
    f16_store_scalar(d, s, n);
}

/* ---- the row functions ---------------------------------------------------------------- */

enum { GATHER = 256 }; /* elements gathered from a strided row per conversion call */

void cw__cpu_load_f32(float *dst, const void *src, cw_dtype dt, int64_t n, int64_t stride) {
    if (dt == CW_F32) {
        const float *s = src;
        if (stride == 1) memcpy(dst, s, (size_t)n * sizeof(float));
        else
            for (int64_t i = 0; i < n; i++) dst[i] = s[i * stride];
        return;
    }
    const uint16_t *s = src;
    if (stride != 1) { /* gather into a small contiguous block, then convert it */
        uint16_t tmp[GATHER];
        for (int64_t i0 = 0; i0 < n; i0 += GATHER) {
            int64_t m = n - i0 < GATHER ? n - i0 : GATHER;
            for (int64_t i = 0; i < m; i++) tmp[i] = s[(i0 + i) * stride];
            if (dt == CW_BF16) bf16_load(dst + i0, tmp, m);
            else f16_load(dst + i0, tmp, m);
        }
        return;
    }
    if (dt == CW_BF16) bf16_load(dst, s, n);
    else f16_load(dst, s, n);
}

void cw__cpu_store_f32(void *dst, cw_dtype dt, int64_t stride, const float *src, int64_t n) {
    if (dt == CW_F32) {
        float *d = dst;
        if (stride == 1) memmove(d, src, (size_t)n * sizeof(float));
        else
            for (int64_t i = 0; i < n; i++) d[i * stride] = src[i];
        return;
    }
    uint16_t *d = dst;
    if (stride != 1) {
        uint16_t tmp[GATHER];
        for (int64_t i0 = 0; i0 < n; i0 += GATHER) {
            int64_t m = n - i0 < GATHER ? n - i0 : GATHER;
            if (dt == CW_BF16) bf16_store(tmp, src + i0, m);
            else f16_store(tmp, src + i0, m);
            for (int64_t i = 0; i < m; i++) d[(i0 + i) * stride] = tmp[i];
        }
        return;
    }
    if (dt == CW_BF16) bf16_store(d, src, n);
    else f16_store(d, src, n);
}

float cw__cpu_load1(const void *p, cw_dtype dt, int64_t i) {
    if (dt == CW_F32) return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    return dt == CW_BF16 ? cw__bf16_to_f32(h) : cw__f16_to_f32(h);
}

void cw__cpu_fill_nan(void *p, cw_dtype dt, int64_t i) {
    if (dt == CW_F32) ((float *)p)[i] = NAN;
    else ((uint16_t *)p)[i] = dt == CW_BF16 ? 0x7fc0u : 0x7e00u;
}
