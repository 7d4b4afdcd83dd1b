/* Per-element math shared by the cpu backend (C11) and the cuda kernels (nvcc, C++):
 * SiLU, GroupNorm apply/finalize, Chan/Welford moment merges, nearest-upsample indexing,
 * softmax pieces. Everything is `static inline CW_HD` so both backends run the same code. */
#ifndef CW_KERNELS_H
#define CW_KERNELS_H

#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define CW_HD __host__ __device__
#else
#define CW_HD
#endif

/* Bit pattern of the quiet NaN written into freed temporaries in poison mode. */
#define CW_POISON_NAN_BITS 0x7fc00000u

/* ---- activations ---------------------------------------------------------------- */

/* silu(x) = x * sigmoid(x) = x / (1 + exp(-x)). exp is taken of -|x| only, so it never
 * overflows: large negative x gives a tiny (not -0 or NaN) result, large positive x gives
 * x. Non-finite inputs propagate as in PyTorch (silu(-inf) = NaN, silu(inf) = inf). */
static inline CW_HD float cw_silu(float x) {
    float e = expf(-fabsf(x));          /* in (0, 1] */
    float s = (x >= 0.0f ? 1.0f : e) / (1.0f + e);  /* sigmoid(x) */
    return x * s;
}

/* GroupNorm apply with per-(n, c) scale/shift precomputed by cw_gn_scale_shift. nvcc may
 * contract this into one FMA; results then differ from the cpu by at most 1 ulp. */
static inline CW_HD float cw_gn_apply(float x, float scale, float shift) { return x * scale + shift; }

/* The fused prep per element: optional normalisation (has_norm), optional SiLU. */
static inline CW_HD float cw_prep_elem(float x, float scale, float shift, int has_norm, int silu) {
    if (has_norm) x = cw_gn_apply(x, scale, shift);
    return silu ? cw_silu(x) : x;
}

/* ---- nearest upsampling --------------------------------------------------------- */

/* Source index of destination index `dst` for nearest upsampling by the integer factor
 * up (PyTorch's 'nearest' with scale_factor = up: floor(dst / up)). dst_off is the
 * destination band's first row in the upsampled tensor, src_off the source band's
 * first row in the producer; returns the row inside the source band. */
static inline CW_HD int64_t cw_up_src_index(int64_t dst, int64_t dst_off, int64_t src_off, int64_t up) {
    return (dst + dst_off) / up - src_off;
}

/* ---- moments (count, mean, M2) in double: Welford updates, Chan merges ---------- */

typedef struct cw_moments {
    double count;
    double mean;
    double m2; /* sum of squared deviations from mean */
} cw_moments;

static inline CW_HD void cw_moments_zero(cw_moments *m) {
    m->count = 0.0;
    m->mean = 0.0;
    m->m2 = 0.0;
}

/* Welford: adds one sample. */
static inline CW_HD void cw_moments_push(cw_moments *m, double x) {
    double d = x - m->mean;
    m->count += 1.0;
    m->mean += d / m->count;
    m->m2 += d * (x - m->mean);
}

/* Chan et al.: a <- a (+) b, with the between-part term delta^2 * na * nb / n. Exact
 * copies when one side is empty, so merging with empty partials changes nothing. The
 * order of merges is the caller's: a fixed order gives bitwise-reproducible results. */
static inline CW_HD void cw_moments_merge(cw_moments *a, double nb, double mean_b, double m2_b) {
    double na = a->count, n, delta;
    if (nb <= 0.0) return;
    if (na <= 0.0) {
        a->count = nb;
        a->mean = mean_b;
        a->m2 = m2_b;
        return;
    }
    n = na + nb;
    delta = mean_b - a->mean;
    a->mean += delta * (nb / n);
    a->m2 += m2_b + delta * delta * (na * nb / n);
    a->count = n;
}

/* Population variance (M2 / count, as torch.nn.functional.group_norm) and
 * rstd = 1 / sqrt(var + eps). A group with count 0 gets rstd of eps alone. */
static inline CW_HD double cw_gn_rstd(const cw_moments *m, double eps) {
    double var = m->count > 0.0 ? m->m2 / m->count : 0.0;
    if (var < 0.0) var = 0.0; /* guards rounding in M2 of a constant group */
    return 1.0 / sqrt(var + eps);
}

/* Per-channel scale/shift of one (n, c): scale = gamma * rstd, shift = beta - mean * scale,
 * computed in double and rounded once. gamma_c/beta_c: 1 and 0 for an affine-free norm. */
static inline CW_HD void cw_gn_scale_shift(const cw_moments *m, double rstd, float gamma_c, float beta_c,
                                           float *scale, float *shift) {
    double sc = (double)gamma_c * rstd;
    *scale = (float)sc;
    *shift = (float)((double)beta_c - m->mean * sc);
}

/* ---- softmax pieces ------------------------------------------------------------- */

/* Running max update that ignores nothing: a NaN in the row makes the max NaN
 * (the result then shows the NaN instead of hiding it). */
static inline CW_HD float cw_softmax_max2(float m, float x) { return (x > m || x != x) ? x : m; }

/* exp(x - max): the stable numerator; in (0, 1] for x <= max. */
static inline CW_HD float cw_softmax_exp(float x, float row_max) { return expf(x - row_max); }

/* Row maximum of n floats with stride 1 (n >= 1). */
static inline CW_HD float cw_softmax_row_max(const float *x, int64_t n) {
    float m = x[0];
    for (int64_t i = 1; i < n; i++) m = cw_softmax_max2(m, x[i]);
    return m;
}

/* x[i] <- exp(x[i] - row_max), returns the sum of the new values (accumulated in double:
 * rows are up to ~10^5 long and the sum is then correct to float rounding). */
static inline CW_HD double cw_softmax_row_exp_sum(float *x, int64_t n, float row_max) {
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) {
        float e = cw_softmax_exp(x[i], row_max);
        x[i] = e;
        s += (double)e;
    }
    return s;
}

/* x[i] <- x[i] * inv_sum. */
static inline CW_HD void cw_softmax_row_scale(float *x, int64_t n, float inv_sum) {
    for (int64_t i = 0; i < n; i++) x[i] *= inv_sum;
}

#endif
