/* Half-precision conversions (lib/core/half.h, cw_dtype_convert) against two independent
 * references: plain double arithmetic on the formats' definitions, and the compiler's own
 * _Float16 where it has one. Exhaustive over every f16 and bf16 code for half -> f32 and
 * the round trip; every f16 rounding tie and its neighbours, every bf16 tie pattern, hand
 * checked values (NaN, inf, overflow, subnormals, ties to even) and random bits for
 * f32 -> half. */
#include "convweave/convweave.h"
#include "core/half.h"
#include "half_ref.h"
#include "testutil.h"

static uint32_t fbits(float f) { return cw__f32_as_u32(f); }
static float bitsf(uint32_t u) { return cw__u32_as_f32(u); }

static int is_f16_nan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff); }
static int is_bf16_nan(uint16_t b) { return (b & 0x7f80) == 0x7f80 && (b & 0x7f); }

/* f32 -> half of x against the reference; NaN must give a quiet NaN of x's sign. */
static int check_round(float x, int bf16) {
    uint16_t got = bf16 ? cw__f32_to_bf16(x) : cw__f32_to_f16(x);
    if (isnan(x)) {
        int ok = bf16 ? is_bf16_nan(got) && (got & 0x40) : is_f16_nan(got) && (got & 0x200);
        return ok && (got >> 15) == (fbits(x) >> 31);
    }
    uint16_t want = bf16 ? ref_to_bf16(x) : ref_to_f16(x);
    if (got != want) {
        fprintf(stderr, "f32 %.9g (0x%08x) -> %s 0x%04x, want 0x%04x\n", x, fbits(x), bf16 ? "bf16" : "f16", got,
                want);
        return 0;
    }
#if defined(__FLT16_MAX__)
    if (!bf16) { /* the compiler's conversion rounds the same way */
        _Float16 hf = (_Float16)x;
        uint16_t hb;
        memcpy(&hb, &hf, 2);
        if (hb != got) {
            fprintf(stderr, "f32 %.9g -> f16 0x%04x, _Float16 says 0x%04x\n", x, got, hb);
            return 0;
        }
    }
#endif
    return 1;
}

/* Every f16 and bf16 code to f32: the exact value (signed zeros, subnormals, inf), NaN with
 * sign and payload; and back to the same code (NaN: a NaN of the same sign). */
static void test_half_to_f32(void) {
    int bad = 0;
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t h = (uint16_t)i;
        float f = cw__f16_to_f32(h);
        double ref = ref_f16(h);
        if (isnan(ref)) {
            if (!isnan(f) || (fbits(f) >> 31) != (h >> 15u) || ((fbits(f) >> 13) & 1023u) != (h & 1023u)) bad++;
            uint16_t back = cw__f32_to_f16(f);
            if (!is_f16_nan(back) || (back >> 15) != (h >> 15)) bad++;
        } else {
            if ((double)f != ref || !signbit(f) != !signbit(ref)) {
                if (bad++ < 5) fprintf(stderr, "f16 0x%04x -> %.9g, want %.9g\n", h, f, ref);
            }
            if (cw__f32_to_f16(f) != h && bad++ < 5) fprintf(stderr, "f16 0x%04x does not round-trip\n", h);
        }
#if defined(__FLT16_MAX__)
        _Float16 hf;
        memcpy(&hf, &h, 2);
        if (!isnan(ref) && fbits((float)hf) != fbits(f)) bad++;
#endif
        float b = cw__bf16_to_f32(h);
        double rb = ref_bf16(h);
        if (isnan(rb)) {
            if (!isnan(b) || fbits(b) != (uint32_t)h << 16) bad++;
            uint16_t back = cw__f32_to_bf16(b);
            if (!is_bf16_nan(back) || (back >> 15) != (h >> 15)) bad++;
        } else {
            if ((double)b != rb || !signbit(b) != !signbit(rb)) {
                if (bad++ < 5) fprintf(stderr, "bf16 0x%04x -> %.9g, want %.9g\n", h, b, rb);
            }
            if (cw__f32_to_bf16(b) != h && bad++ < 5) fprintf(stderr, "bf16 0x%04x does not round-trip\n", h);
        }
    }
    ASSERT_EQ_I(bad, 0);
}

/* Values worked out by hand from the formats (not from either reference). */
static void test_known_values(void) {
    static const struct {
        uint32_t f32;
        uint16_t f16, bf16;
    } k[] = {
        {0x3f800000u, 0x3c00, 0x3f80}, /* 1 */
        {0xbf800000u, 0xbc00, 0xbf80}, /* -1 */
        {0x00000000u, 0x0000, 0x0000}, /* +0 */
        {0x80000000u, 0x8000, 0x8000}, /* -0 */
        {0x477fe000u, 0x7bff, 0x4780}, /* 65504, the largest f16; bf16: 65536 is nearer than 65280 */
        {0x477fefffu, 0x7bff, 0x4780}, /* just below 65520: still 65504 */
        {0x477ff000u, 0x7c00, 0x4780}, /* 65520: the tie past 65504 goes to inf (even) */
        {0x47800000u, 0x7c00, 0x4780}, /* 65536 */
        {0x7f7fffffu, 0x7c00, 0x7f80}, /* FLT_MAX: inf in both */
        {0x7f7f7fffu, 0x7c00, 0x7f7f}, /* below bf16's inf midpoint: its largest finite */
        {0x7f800000u, 0x7c00, 0x7f80}, /* inf */
        {0xff800000u, 0xfc00, 0xff80}, /* -inf */
        {0x38800000u, 0x0400, 0x3880}, /* 2^-14, the smallest normal f16 */
        {0x33800000u, 0x0001, 0x3380}, /* 2^-24, the smallest subnormal f16 */
        {0x33000000u, 0x0000, 0x3300}, /* 2^-25: ties 0 / 2^-24 -> even 0 */
        {0x33000001u, 0x0001, 0x3300}, /* just above: 2^-24 */
        {0x33c00000u, 0x0002, 0x33c0}, /* 3 * 2^-25: ties 1 / 2 (x 2^-24) -> even 2 */
        {0x34200000u, 0x0002, 0x3420}, /* 5 * 2^-25: ties 2 / 3 -> even 2 */
        {0x387fc000u, 0x03ff, 0x3880}, /* the largest f16 subnormal; bf16: rounds up to 2^-14 */
        {0x3f801000u, 0x3c00, 0x3f80}, /* 1 + 2^-11: ties 1 / 1 + 2^-10 -> even 1 */
        {0x3f803000u, 0x3c02, 0x3f80}, /* 1 + 3 * 2^-11: ties -> even 0x3c02 */
        {0x3f808000u, 0x3c04, 0x3f80}, /* 1 + 2^-8: bf16 ties 1 / 1 + 2^-7 -> even 1 */
        {0x3f818000u, 0x3c0c, 0x3f82}, /* 1 + 3 * 2^-8: bf16 ties -> even 0x3f82 */
        {0x3f808001u, 0x3c04, 0x3f81}, /* just above the bf16 tie: up */
        {0x00008000u, 0x0000, 0x0000}, /* f32 subnormal: bf16 ties 0 / 0x0001 -> even 0 */
        {0x00018000u, 0x0000, 0x0002}, /* ties 1 / 2 -> even 2 */
        {0x00000001u, 0x0000, 0x0000}, /* the smallest f32 */
        {0x40490fdbu, 0x4248, 0x4049}, /* pi */
    };
    int bad = 0;
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        float x = bitsf(k[i].f32);
        uint16_t h = cw__f32_to_f16(x), b = cw__f32_to_bf16(x);
        if (h != k[i].f16 || b != k[i].bf16) {
            fprintf(stderr, "f32 0x%08x -> f16 0x%04x bf16 0x%04x, want 0x%04x 0x%04x\n", k[i].f32, h, b, k[i].f16,
                    k[i].bf16);
            bad++;
        }
        bad += !check_round(x, 0) + !check_round(x, 1); /* the references agree */
    }
    /* NaN in: a quiet NaN out, sign kept, signalling NaNs too */
    const uint32_t nans[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu, 0x7fa00000u};
    for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) bad += !check_round(bitsf(nans[i]), 0) + !check_round(bitsf(nans[i]), 1);
    ASSERT_EQ_I(fbits(cw__f16_to_f32(0x7bff)), 0x477fe000u);
    ASSERT_EQ_I(fbits(cw__f16_to_f32(0x0001)), 0x33800000u);
    ASSERT_EQ_I(fbits(cw__f16_to_f32(0x8000)), 0x80000000u);
    ASSERT_EQ_I(fbits(cw__bf16_to_f32(0x0001)), 0x00010000u); /* bf16 subnormal */
    ASSERT_EQ_I(bad, 0);
}

/* f32 -> f16 at every tie between two f16 codes (and the two f32 values beside it), for
 * both signs; f32 -> bf16 at every tie pattern of every high half; random bits. */
static void test_f32_to_half(cw_rng *r) {
    int bad = 0;
    int64_t n = 0;
    for (uint32_t i = 0; i < 0x7c00; i++) {
        double mid = (ref_f16((uint16_t)i) + (i == 0x7bff ? 65536.0 : ref_f16((uint16_t)(i + 1)))) / 2;
        float m = (float)mid; /* exact: f16 midpoints have 12 significant bits */
        float cand[3] = {nextafterf(m, -INFINITY), m, nextafterf(m, INFINITY)};
        for (int k = 0; k < 3; k++)
            for (int sgn = 0; sgn < 2; sgn++, n++) bad += !check_round(sgn ? -cand[k] : cand[k], 0);
    }
    const uint32_t lows[] = {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu};
    for (uint32_t hi = 0; hi < 0x10000u; hi++)
        for (size_t k = 0; k < sizeof lows / sizeof lows[0]; k++, n++) bad += !check_round(bitsf(hi << 16 | lows[k]), 1);
    int iters = cw_test_quick() ? 200000 : 2000000;
    for (int i = 0; i < iters; i++, n++) {
        uint32_t u = (uint32_t)cw_rng_next(r);
        if (i & 1) u = (u & 0x807fffffu) | ((uint32_t)cw_rng_range(r, 96, 150) << 23); /* near f16's range */
        bad += !check_round(bitsf(u), 0) + !check_round(bitsf(u), 1);
        if (bad > 10) break;
    }
    ASSERT_EQ_I(bad, 0);
    fprintf(stderr, "f32 -> half: %" PRId64 " roundings exact\n", n);
}

/* cw_dtype_convert: every pair agrees with the scalar helpers on every code; f16 <-> bf16
 * rounds the exact value once; arguments checked. */
static void test_convert(cw_rng *r) {
    enum { N = 65536 };
    uint16_t *codes = malloc(N * 2), *h = malloc(N * 2), *h2 = malloc(N * 2);
    float *f = malloc(N * 4), *f2 = malloc(N * 4);
    ASSERT_TRUE(codes && h && h2 && f && f2);
    for (int i = 0; i < N; i++) codes[i] = (uint16_t)i;
    int bad = 0;
    const cw_dtype halves[2] = {CW_F16, CW_BF16};
    for (int k = 0; k < 2; k++) {
        cw_dtype dt = halves[k];
        ASSERT_OK(cw_dtype_convert(f, CW_F32, codes, dt, N));
        for (int i = 0; i < N; i++) {
            float want = dt == CW_F16 ? cw__f16_to_f32(codes[i]) : cw__bf16_to_f32(codes[i]);
            if (fbits(f[i]) != fbits(want)) bad++;
        }
        for (int i = 0; i < N; i++) f2[i] = bitsf((uint32_t)cw_rng_next(r));
        ASSERT_OK(cw_dtype_convert(h, dt, f2, CW_F32, N));
        for (int i = 0; i < N; i++) {
            uint16_t want = dt == CW_F16 ? cw__f32_to_f16(f2[i]) : cw__f32_to_bf16(f2[i]);
            if (h[i] != want) bad++;
        }
        /* to the other half type: the exact value rounded once */
        cw_dtype other = halves[1 - k];
        ASSERT_OK(cw_dtype_convert(h2, other, codes, dt, N));
        for (int i = 0; i < N; i++) {
            double v = dt == CW_F16 ? ref_f16(codes[i]) : ref_bf16(codes[i]);
            if (isnan(v)) {
                if (!(other == CW_F16 ? is_f16_nan(h2[i]) : is_bf16_nan(h2[i]))) bad++;
                continue;
            }
            uint16_t want = other == CW_F16 ? ref_to_f16(v) : ref_to_bf16(v);
            if (h2[i] != want && bad++ < 5) fprintf(stderr, "0x%04x -> 0x%04x, want 0x%04x\n", codes[i], h2[i], want);
        }
        ASSERT_OK(cw_dtype_convert(h2, dt, codes, dt, N)); /* same dtype: a copy */
        if (memcmp(h2, codes, N * 2)) bad++;
    }
    ASSERT_EQ_I(bad, 0);
    ASSERT_STATUS(cw_dtype_convert(h, (cw_dtype)7, f, CW_F32, 1), CW_ERR_INVALID_ARG);
    ASSERT_STATUS(cw_dtype_convert(h, CW_F16, f, (cw_dtype)-1, 1), CW_ERR_INVALID_ARG);
    ASSERT_STATUS(cw_dtype_convert(h, CW_F16, f, CW_F32, -1), CW_ERR_INVALID_ARG);
    ASSERT_STATUS(cw_dtype_convert(NULL, CW_F16, f, CW_F32, 1), CW_ERR_INVALID_ARG);
    ASSERT_STATUS(cw_dtype_convert(h, CW_F16, NULL, CW_F32, 1), CW_ERR_INVALID_ARG);
    ASSERT_OK(cw_dtype_convert(NULL, CW_F16, NULL, CW_F32, 0));
    free(codes), free(h), free(h2), free(f), free(f2);
}

int main(void) {
    cw_rng r = {cw_test_seed(13)};
    test_half_to_f32();
    test_known_values();
    test_f32_to_half(&r);
    test_convert(&r);
    fprintf(stderr, "half: 65536 f16 + 65536 bf16 codes exact and round-tripping\n");
    TEST_DONE();
}
