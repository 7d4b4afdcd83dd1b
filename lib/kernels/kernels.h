/* Per-element math shared by the cpu backend (C11) and the cuda kernels (nvcc, C++):
 * SiLU, GroupNorm apply/finalize, Chan/Welford moment merges, nearest-upsample indexing,
 * softmax pieces, the per-channel ops. Everything is `static inline CW_HD` so both
 * backends run the same code. */
#ifndef CW_KERNELS_H
#define CW_KERNELS_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "convweave/convweave.h"
#include "core/half.h"

#ifdef __CUDACC__
#define CW_HD __host__ __device__
#else
#define CW_HD
#endif

/* Bit pattern of the 32-bit words written into freed temporaries in poison mode: a quiet
 * NaN as an f32, and as each of its two halves read as an f16 (0x7fc0) or a bf16 (0x7fc0),
 * so a late reader sees NaN in every dtype. */
#define CW_POISON_NAN_BITS 0x7fc07fc0u

/* ---- exp ------------------------------------------------------------------------- */

#ifndef __CUDA_ARCH__
/* signed forms of core/half.h's bit casts: cw_exp_neg and cw_silu shift the sign in */
static inline float cw__bits_f32(int32_t i) { return cw__u32_as_f32((uint32_t)i); }
static inline int32_t cw__f32_bits(float f) { return (int32_t)cw__f32_as_u32(f); }
#endif

/* e^-a for a >= 0 (a = +inf gives 0, NaN stays NaN). Device code uses expf. The host
 * path is branch-free so cpu loops over it vectorise (glibc's expf is a call per
 * element): Cody-Waite reduction a = n ln2 - r, a degree-7 polynomial for e^r on
 * |r| <= ln2/2, and 2^n applied as two normal powers of two so results down to the
 * denormals come out right. Max error 1 ulp (glibc: 0.5) over the whole range. */
static inline CW_HD float cw_exp_neg(float a) {
#ifdef __CUDA_ARCH__
    return expf(-a);
#else
    const int32_t ai = cw__f32_bits(a);
    const int32_t lim = 0x42d00000; /* 104.0f: e^-104 rounds to 0 */
    /* the sign bit masked, so a NaN of either sign (x86's default NaN is negative) clamps
     * to lim instead of reaching the float-to-int conversion below (undefined for NaN) */
    const int32_t aa = ai & 0x7fffffff;
    float t = -cw__bits_f32(aa < lim ? aa : lim);
    float nf = (t * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round(t / ln2) */
    float r = t - nf * 0.693359375f;    /* ln2 split in two: the product is exact */
    r = r - nf * -2.12194440e-4f;
    float p = 1.9875691500e-4f;         /* Cephes expf coefficients */
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t n = (int32_t)nf;           /* in [-150, 0] */
    int32_t n1 = n / 2, n2 = n - n1;   /* each >= -75: both 2^n1 and 2^n2 are normal */
    float e = p * cw__bits_f32((n1 + 127) << 23) * cw__bits_f32((n2 + 127) << 23);
    /* NaN in, NaN out: a mask select, since a ternary lets gcc branch around the FP math
     * above, which it then may not if-convert (it could trap), and the loop stays scalar */
    int32_t nan = -(int32_t)((ai & 0x7fffffff) > 0x7f800000);
    return cw__bits_f32((ai & nan) | (cw__f32_bits(e) & ~nan));
#endif
}

/* ---- activations ---------------------------------------------------------------- */

/* silu(x) = x * sigmoid(x) = x / (1 + exp(-x)). exp is taken of -|x| only, so it never
 * overflows: large negative x gives a tiny (not -0 or NaN) result, large positive x gives
 * x. Non-finite inputs propagate as in PyTorch (silu(-inf) = NaN, silu(inf) = inf).
 * Max error ~3 ulp, as with glibc's expf. Branch-free on the host (vectorises). */
static inline CW_HD float cw_silu(float x) {
    float e = cw_exp_neg(fabsf(x)); /* in [0, 1] */
#ifdef __CUDA_ARCH__
    float num = x >= 0.0f ? 1.0f : e;
#else
    /* sigmoid's numerator: 1 for x >= 0, e for x < 0; a bit select, as an FP compare
     * would keep gcc from if-converting (and vectorising) the loop */
    int32_t neg = cw__f32_bits(x) >> 31; /* all ones when the sign bit is set */
    float num = cw__bits_f32((cw__f32_bits(e) & neg) | (0x3f800000 & ~neg));
#endif
    return x * (num / (1.0f + e));
}

/* GroupNorm apply with per-(n, c) scale/shift precomputed by cw_gn_scale_shift. nvcc may
 * contract this into one FMA; results then differ from the cpu by at most 1 ulp. */
static inline CW_HD float cw_gn_apply(float x, float scale, float shift) { return x * scale + shift; }

/* The fused prep per element: optional normalisation (has_norm), optional SiLU. */
static inline CW_HD float cw_prep_elem(float x, float scale, float shift, int has_norm, int silu) {
    if (has_norm) x = cw_gn_apply(x, scale, shift);
    return silu ? cw_silu(x) : x;
}

/* ---- per-channel ops: y[n, c, ...] = f(x[n, c, ...], v[c]) ------------------------- */

/* The per-channel ops (the generic op CW_OP_CHANNEL below, its code in param.i[0]): only
 * this switch knows what each computes, so a new per-channel op is one enum entry and one
 * case here (docs/adding-an-op.md). Append only: the codes are stored in plans. */
enum { CW_CHANNEL_SCALE = 0, /* y = x * v[c] (cw_graph_scale) */
       CW_CHANNEL_SHIFT,     /* y = x + v[c] (cw_graph_shift) */
       CW_CHANNEL_OP_COUNT };

static inline CW_HD float cw_channel_elem(int op, float x, float v) {
    switch (op) {
    case CW_CHANNEL_SCALE: return x * v;
    case CW_CHANNEL_SHIFT: return x + v;
    default: return x;
    }
}

/* ---- unary and binary elementwise ops (CW_OP_UNARY, CW_OP_BINARY) ------------------ */

/* Codes are the public cw_unary_op / cw_binary_op (append-only there); the counts bound
 * the shape rule's check of param.i[0]. */
#define CW_UNARY_OP_COUNT ((int)CW_UNARY_POW + 1)
#define CW_BINARY_OP_COUNT ((int)CW_BINARY_MIN + 1)
#define CW_UPSAMPLE_MAX_FACTOR 8 /* cw_graph_upsample_nearest's largest factor per dim */
#define CW_REDUCE_OP_COUNT ((int)CW_REDUCE_MEAN_SQUARE + 1)
#define CW_PAD_MODE_COUNT ((int)CW_PAD_REPLICATE + 1)
#define CW_PAD_MAX 64 /* cw_graph_pad's largest pad per side, in elements */
#define CW_SHUFFLE_MAX_FACTOR 8 /* cw_graph_depth_to_space / space_to_depth's largest factor */

/* CW_OP_PAD keeps its six pads (before and after, each of D, H, W) in two of the parameter
 * block's four integers, 16 bits per dim, D lowest: each is 0..CW_PAD_MAX, checked before
 * packing (a negative pad would spill into the next field). */
static inline CW_HD int64_t cw_pad_pack(const int64_t p[3]) { return p[0] | p[1] << 16 | p[2] << 32; }
static inline CW_HD int64_t cw_pad_get(int64_t packed, int k) { return (packed >> (16 * k)) & 0xffff; }

/* CW_OP_PAD's source index along one dim: output index o less the pad before, inside x's
 * extent n; outside it, clamped into 0..n-1 (CW_PAD_REPLICATE) or -1: the fill value
 * (CW_PAD_CONSTANT). */
static inline CW_HD int64_t cw_pad_src(int64_t o, int64_t pre, int64_t n, int mode) {
    const int64_t s = o - pre;
    if (s >= 0 && s < n) return s;
    if (mode == CW_PAD_REPLICATE) return s < 0 ? 0 : n - 1;
    return -1;
}

/* CW_OP_PAD's fill value f[0] as stored in dtype dt (rounded once to f16/bf16): its bits in
 * the low 16 or all 32 bits. Host code (the cuda launcher passes the bits to its kernel). */
static inline uint32_t cw_pad_fill_bits(float v, cw_dtype dt) {
    if (dt == CW_F16) return cw__f32_to_f16(v);
    if (dt == CW_BF16) return cw__f32_to_bf16(v);
    return cw__f32_as_u32(v);
}

/* 1 / (1 + e^-x) with exp taken of -|x| only (no overflow), as cw_silu. NaN propagates. */
static inline CW_HD float cw_sigmoid(float x) {
    const float e = cw_exp_neg(fabsf(x)); /* in [0, 1] */
    return (x >= 0.0f ? 1.0f : e) / (1.0f + e);
}

/* The unary ops as PyTorch defines them: relu and clamp propagate NaN (torch.relu,
 * torch.clamp), clamp with a > b gives b, gelu is the erf form (F.gelu's default) or the
 * tanh form (approximate='tanh'). rsqrt and pow are taken in double (sqrt is correctly
 * rounded, pow within 1 double ulp on glibc and cuda) and rounded once to float, so both
 * backends agree but where the double lands on a float midpoint (cuda's rsqrtf and powf
 * are 2 ulps). The gelus are written without PyTorch's cancellation in
 * 1 + erf(z) and 1 + tanh(z) for negative x (erfc(-z), and 2 sigmoid(2z)), so they stay
 * accurate to a few ulps where PyTorch's f32 loses digits. affine takes a * x exactly in
 * double (24 + 24 bits) and rounds the sum twice (to double, then to float: off from one
 * rounding only where the double lands on a float midpoint); the same expression on both
 * backends, and on the cpu it vectorises where fmaf is a libm call without -mfma. */
static inline CW_HD float cw_unary_elem(int op, float x, float a, float b) {
    switch (op) {
    case CW_UNARY_RELU: return x < 0.0f ? 0.0f : x;
    case CW_UNARY_TANH: return tanhf(x);
    case CW_UNARY_SIGMOID: return cw_sigmoid(x);
    case CW_UNARY_GELU: return 0.5f * x * erfcf(x * -0.70710678118654752f);
    case CW_UNARY_GELU_TANH: {
        const float k2 = 1.5957691216057308f; /* 2 sqrt(2 / pi) */
        return x * cw_sigmoid(k2 * (x + 0.044715f * x * x * x));
    }
    case CW_UNARY_AFFINE: return (float)((double)a * (double)x + (double)b);
    case CW_UNARY_CLAMP: {
        const float t = x < a ? a : x; /* NaN x: both compares false, x stays */
        return t > b ? b : t;
    }
    case CW_UNARY_RSQRT: return (float)(1.0 / sqrt((double)x));
    case CW_UNARY_SQUARE: return x * x;
    case CW_UNARY_POW: return (float)pow((double)x, (double)a);
    default: return x;
    }
}

/* The prep's unary link (cw__prep_params.unary): op unary - 1 with a, b; 0 leaves x. */
static inline CW_HD float cw_prep_unary(float x, int unary, float a, float b) {
    return unary > 0 ? cw_unary_elem(unary - 1, x, a, b) : x;
}

/* The binary ops; max and min propagate NaN from either side (torch.maximum/minimum). */
static inline CW_HD float cw_binary_elem(int op, float a, float b) {
    switch (op) {
    case CW_BINARY_MUL: return a * b;
    case CW_BINARY_SUB: return a - b;
    case CW_BINARY_DIV: return a / b;
    case CW_BINARY_MAX: return (a > b || a != a) ? a : b;
    case CW_BINARY_MIN: return (a < b || a != a) ? a : b;
    default: return a;
    }
}

/* ---- channel reductions (CW_OP_REDUCE_CHANNELS) ------------------------------------ */

/* A reduction's term of one channel's element, in double (a square of a float is exact). */
static inline CW_HD int cw_reduce_squares(int op) { return op == CW_REDUCE_L2 || op == CW_REDUCE_MEAN_SQUARE; }

/* The reduction of the terms' sum acc over c channels, in double, rounded once to float.
 * Both backends add the terms in double over c in ascending order, one accumulator per
 * output element, so the result is the same on every backend and thread count. */
static inline CW_HD float cw_reduce_finish(int op, double acc, int64_t c) {
    switch (op) {
    case CW_REDUCE_MEAN:
    case CW_REDUCE_MEAN_SQUARE: return (float)(acc / (double)c);
    case CW_REDUCE_L2: return (float)sqrt(acc);
    default: return (float)acc;
    }
}

/* ---- the generic ops: their contract (docs/adding-an-op.md) ------------------------- */

/* An op of the generic form writes one tensor, `out`, from n_in inputs and a small parameter
 * block. The graph builder records it as one node (scheduler/graph.c cw__op_node), the
 * scheduler lowers it to one task over the whole tensors on the light stream, cw__op_run
 * (backend/ops.c) checks the task's views against the contract below, and each backend
 * runs it by its code (cpu: ops_cpu.c cpu_op, which runs cw__cpu_op_exec on the
 * stream; cuda: kernels.cu cw__cu_op). Append
 * only: plans store the codes. */
typedef enum {
    CW_OP_CHANNEL = 0, /* out[n, c, ...] = cw_channel_elem(param.i[0], in0[n, c, ...], in1[c]) */
    CW_OP_AVG_POOL2,   /* out[.., h, w] = mean of in0[.., 2h + {0, 1}, 2w + {0, 1}] */
    CW_OP_UNARY,       /* out = cw_unary_elem(param.i[0], in0, param.f[0], param.f[1]) */
    CW_OP_BINARY,      /* out = cw_binary_elem(param.i[0], in0, in1), in1 of in0's dims or of
                          [N, 1, ...] (broadcast over in0's channels: cw_binary_bcast) */
    CW_OP_UPSAMPLE_NEAREST, /* out[.., d, h, w] = in0[.., (d + i[3]) / i[0], h / i[1], w / i[2]]:
                               i[3] (0..i[0] - 1) source frames dropped in front (cw_up_src_d) */
    CW_OP_REDUCE_CHANNELS,  /* out[n, 0, ...] = cw_reduce_finish(i[0], sum over c ascending of
                               in0[n, c, ...] (squared where cw_reduce_squares), C) */
    CW_OP_CONCAT,           /* out = in0 then in1 along dim i[0] (1 or 2), bits copied */
    CW_OP_SLICE,            /* out = in0.narrow(i[0], i[1], i[2]): dim 1..rank-1, start, length;
                               bits copied */
    CW_OP_PAD,              /* out[.., d, h, w] = in0[.., cw_pad_src(d), cw_pad_src(h), cw_pad_src(w)]
                               or f[0] where a source is -1: mode i[0] (cw_pad_mode), pads of
                               (D, H, W) before in i[1], after in i[2] (cw_pad_pack) */
    CW_OP_DEPTH_TO_SPACE,   /* out[n, c, d fd + i, h fh + j, w fw + k] =
                               in0[n, c F + (i fh + j) fw + k, d, h, w], factors (fd, fh, fw) in
                               i[0..2], F = fd fh fw; 4-D: fd = 1; bits copied */
    CW_OP_SPACE_TO_DEPTH,   /* its inverse: out[n, c F + (i fh + j) fw + k, d, h, w] =
                               in0[n, c, d fd + i, h fh + j, w fw + k] */
    CW_OP_COUNT
} cw_op_code;

enum { CW_OP_MAX_IN = 3 };

typedef struct cw_op_param {
    int64_t i[4];
    float f[4];
} cw_op_param;

typedef struct cw_op_info {
    const char *name;  /* the op in messages ("avg_pool2") */
    int n_in;          /* inputs it reads */
    unsigned f32_in;   /* bit k set: input k is f32 in graphs of every dtype (a [C] vector);
                          the other inputs have the output's dtype */
    double flops;      /* per output element (trace and describe) */
} cw_op_info;

/* The op's name, arity, input dtypes and cost; name NULL for an unknown code. */
static inline cw_op_info cw_op_get_info(int code) {
    cw_op_info r = {NULL, 0, 0u, 0.0};
    switch (code) {
    case CW_OP_CHANNEL: r.name = "channel", r.n_in = 2, r.f32_in = 1u << 1, r.flops = 1.0; break;
    case CW_OP_AVG_POOL2: r.name = "avg_pool2", r.n_in = 1, r.flops = 4.0; break;
    case CW_OP_UNARY: r.name = "unary", r.n_in = 1, r.flops = 4.0; break;
    case CW_OP_BINARY: r.name = "binary", r.n_in = 2, r.flops = 1.0; break;
    case CW_OP_UPSAMPLE_NEAREST: r.name = "upsample_nearest", r.n_in = 1, r.flops = 0.0; break;
    /* per output element: 2 per channel read; the table has no C, so 2 (an undercount) */
    case CW_OP_REDUCE_CHANNELS: r.name = "reduce_channels", r.n_in = 1, r.flops = 2.0; break;
    case CW_OP_CONCAT: r.name = "concat", r.n_in = 2, r.flops = 0.0; break;
    case CW_OP_SLICE: r.name = "slice", r.n_in = 1, r.flops = 0.0; break;
    case CW_OP_PAD: r.name = "pad", r.n_in = 1, r.flops = 0.0; break;
    case CW_OP_DEPTH_TO_SPACE: r.name = "depth_to_space", r.n_in = 1, r.flops = 0.0; break;
    case CW_OP_SPACE_TO_DEPTH: r.name = "space_to_depth", r.n_in = 1, r.flops = 0.0; break;
    default: break;
    }
    return r;
}

/* The op's shape rule: writes to *out the dims (rank and dims; no strides, dtype in[0]'s)
 * the op makes of in[0..n_in) under pm, and returns 1; returns 0 when the inputs or the
 * parameters do not fit the op. The graph builder sizes the node with it and cw__op_run
 * checks the views against it: one rule, in one place. */
static inline int cw_op_out_dims(int code, const cw_op_param *pm, const cw_tensor_desc *const *in,
                                 cw_tensor_desc *out) {
    const cw_tensor_desc *x = in[0];
    memset(out, 0, sizeof *out);
    out->dtype = x->dtype;
    out->rank = x->rank;
    for (int i = 0; i < x->rank; i++) out->dims[i] = x->dims[i];
    switch (code) {
    case CW_OP_CHANNEL:
        return x->rank >= 2 && x->rank <= 5 && in[1]->rank == 1 && in[1]->dims[0] == x->dims[1] && pm->i[0] >= 0 &&
               pm->i[0] < CW_CHANNEL_OP_COUNT;
    case CW_OP_AVG_POOL2: {
        if (x->rank != 4 && x->rank != 5) return 0;
        int h = x->rank - 2, w = x->rank - 1;
        if (x->dims[h] % 2 || x->dims[w] % 2) return 0;
        out->dims[h] = x->dims[h] / 2, out->dims[w] = x->dims[w] / 2;
        return 1;
    }
    case CW_OP_UNARY: return pm->i[0] >= 0 && pm->i[0] < CW_UNARY_OP_COUNT;
    case CW_OP_BINARY: {
        if (pm->i[0] < 0 || pm->i[0] >= CW_BINARY_OP_COUNT || in[1]->rank != x->rank) return 0;
        for (int i = 0; i < x->rank; i++)
            if (in[1]->dims[i] != x->dims[i] && !(i == 1 && in[1]->dims[1] == 1)) return 0;
        return 1;
    }
    case CW_OP_UPSAMPLE_NEAREST: { /* factors (D, H, W) in i[0..2], each 1..8; 4-D: i[0] = 1;
                                      D's offset i[3] in 0..i[0] - 1 */
        if (x->rank != 4 && x->rank != 5) return 0;
        for (int k = 0; k < 3; k++)
            if (pm->i[k] < 1 || pm->i[k] > CW_UPSAMPLE_MAX_FACTOR) return 0;
        if ((x->rank == 4 && pm->i[0] != 1) || pm->i[3] < 0 || pm->i[3] >= pm->i[0]) return 0;
        for (int k = x->rank == 5 ? 0 : 1; k < 3; k++) out->dims[x->rank - 3 + k] = x->dims[x->rank - 3 + k] * pm->i[k];
        if (x->rank == 5) out->dims[2] -= pm->i[3];
        return 1;
    }
    case CW_OP_REDUCE_CHANNELS: /* op in i[0]; C >= 1 */
        if (x->rank < 2 || x->dims[1] < 1 || pm->i[0] < 0 || pm->i[0] >= CW_REDUCE_OP_COUNT) return 0;
        out->dims[1] = 1;
        return 1;
    case CW_OP_CONCAT: { /* dim in i[0]: 1 or 2; in1 of in0's rank and dims but in dim */
        const int64_t d = pm->i[0];
        if ((d != 1 && d != 2) || x->rank < 3 || in[1]->rank != x->rank) return 0;
        for (int i = 0; i < x->rank; i++)
            if (i != d && in[1]->dims[i] != x->dims[i]) return 0;
        out->dims[d] = x->dims[d] + in[1]->dims[d];
        return 1;
    }
    case CW_OP_SLICE: { /* dim i[0] in 1..rank-1, start i[1] >= 0, length i[2] >= 1, within x */
        const int64_t d = pm->i[0], start = pm->i[1], len = pm->i[2];
        if ((x->rank != 4 && x->rank != 5) || d < 1 || d >= x->rank || start < 0 || len < 1 ||
            start > x->dims[d] - len)
            return 0;
        out->dims[d] = len;
        return 1;
    }
    case CW_OP_PAD: { /* mode i[0]; pads in i[1], i[2], each 0..CW_PAD_MAX; 4-D: D's are 0 */
        if ((x->rank != 4 && x->rank != 5) || pm->i[0] < 0 || pm->i[0] >= CW_PAD_MODE_COUNT) return 0;
        for (int k = 0; k < 3; k++) {
            const int64_t a = cw_pad_get(pm->i[1], k), b = cw_pad_get(pm->i[2], k);
            if (a > CW_PAD_MAX || b > CW_PAD_MAX || (x->rank == 4 && k == 0 && (a || b))) return 0;
            if (x->rank == 5 || k > 0) out->dims[x->rank - 3 + k] += a + b;
        }
        return (pm->i[1] >> 48) == 0 && (pm->i[2] >> 48) == 0; /* nothing outside the three fields */
    }
    case CW_OP_DEPTH_TO_SPACE:
    case CW_OP_SPACE_TO_DEPTH: { /* factors (D, H, W) in i[0..2], each 1..8; 4-D: i[0] = 1 */
        if (x->rank != 4 && x->rank != 5) return 0;
        int64_t f = 1;
        for (int k = 0; k < 3; k++) {
            if (pm->i[k] < 1 || pm->i[k] > CW_SHUFFLE_MAX_FACTOR) return 0;
            f *= pm->i[k];
        }
        if (x->rank == 4 && pm->i[0] != 1) return 0;
        const int d2s = code == CW_OP_DEPTH_TO_SPACE;
        if (d2s && x->dims[1] % f) return 0;
        out->dims[1] = d2s ? x->dims[1] / f : x->dims[1] * f;
        for (int k = x->rank == 5 ? 0 : 1; k < 3; k++) {
            const int j = x->rank - 3 + k;
            if (!d2s && x->dims[j] % pm->i[k]) return 0;
            out->dims[j] = d2s ? x->dims[j] * pm->i[k] : x->dims[j] / pm->i[k];
        }
        return 1;
    }
    default: return 0;
    }
}

/* CW_OP_BINARY reads in1 broadcast over in0's channels (in1 is [N, 1, ...], in0 has C > 1):
 * in1's channel stride is then 0. */
static inline int cw_binary_bcast(const cw_tensor_desc *in0, const cw_tensor_desc *in1) {
    return in1->rank >= 2 && in1->dims[1] == 1 && in0->dims[1] != 1;
}

/* CW_OP_AVG_POOL2's element: the mean of a 2x2 window, rows summed first (both backends). */
static inline CW_HD float cw_avg4(float a, float b, float c, float d) { return ((a + b) + (c + d)) * 0.25f; }

/* ---- nearest upsampling --------------------------------------------------------- */

/* Source index of destination index `dst` for nearest upsampling by the integer factor
 * up (PyTorch's 'nearest' with scale_factor = up: floor(dst / up)). dst_off is the
 * destination band's first row in the upsampled tensor, src_off the source band's
 * first row in the producer; returns the row inside the source band. */
static inline CW_HD int64_t cw_up_src_index(int64_t dst, int64_t dst_off, int64_t src_off, int64_t up) {
    return (dst + dst_off) / up - src_off;
}

/* Source frame of frame z for nearest upsampling along D by up_d (<= 1: none) with the first
 * off_d of the up_d copies of frame 0 dropped: (z + off_d) / up_d. off_d = up_d - 1 is
 * HunyuanVideo's and CogVideoX's upsampler (the first frame kept once, every later one
 * repeated: a cat of the upsampled first frame and rest), off_d = 0 plain nearest. The
 * upsampled tensor has up_d * D - off_d frames (cw_up_frames). */
static inline CW_HD int64_t cw_up_src_d(int64_t z, int64_t up_d, int64_t off_d) {
    return up_d > 1 ? (z + off_d) / up_d : z;
}
static inline CW_HD int64_t cw_up_frames(int64_t d, int64_t up_d, int64_t off_d) {
    return up_d > 1 ? d * up_d - off_d : d;
}

/* The prep's source index along one dim with replicate padding (cw__prep_params.pad): dst
 * index o (dst_off added: a band's first row) less the pad, clamped into the upsampled
 * tensor's n elements, then divided by up, less src_off (the band's first source row). */
static inline CW_HD int64_t cw_prep_src(int64_t o, int64_t dst_off, int64_t pad, int64_t n, int64_t up,
                                        int64_t src_off) {
    return cw_pad_src(o + dst_off, pad, n, CW_PAD_REPLICATE) / up - src_off;
}

/* The prep's source frame of dst frame z with replicate padding: z less the pad before D,
 * clamped into the d_up = cw_up_frames(ds, ...) frames of the upsampled producer, then mapped
 * to the producer's ds frames (cw_up_src_d). */
static inline CW_HD int64_t cw_prep_src_d(int64_t z, int64_t pad, int64_t ds, int64_t up_d, int64_t off_d) {
    return cw_up_src_d(cw_pad_src(z, pad, cw_up_frames(ds, up_d, off_d), CW_PAD_REPLICATE), up_d, off_d);
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

/* exp(x - max): the stable numerator; in [0, 1] for x <= max. */
static inline CW_HD float cw_softmax_exp(float x, float row_max) { return cw_exp_neg(row_max - x); }

/* Row maximum of n floats with stride 1 (n >= 1). */
static inline CW_HD float cw_softmax_row_max(const float *x, int64_t n) {
    float m = x[0];
    for (int64_t i = 1; i < n; i++) m = cw_softmax_max2(m, x[i]);
    return m;
}

/* x[i] <- exp(x[i] - row_max), returns the sum of the new values, accumulated in double
 * (rows are up to ~10^5 long; the sum is then right to float rounding) in four lanes in
 * a fixed order. The exp loop is separate so it vectorises. */
static inline CW_HD double cw_softmax_row_exp_sum(float *x, int64_t n, float row_max) {
    for (int64_t i = 0; i < n; i++) x[i] = cw_softmax_exp(x[i], row_max);
    double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += (double)x[i];
        s1 += (double)x[i + 1];
        s2 += (double)x[i + 2];
        s3 += (double)x[i + 3];
    }
    for (; i < n; i++) s0 += (double)x[i];
    return (s0 + s1) + (s2 + s3);
}

/* x[i] <- x[i] * inv_sum. */
static inline CW_HD void cw_softmax_row_scale(float *x, int64_t n, float inv_sum) {
    for (int64_t i = 0; i < n; i++) x[i] *= inv_sum;
}

#endif
