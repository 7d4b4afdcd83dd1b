/* The cuda backend's elementwise and reduction kernels: fills, bias, residual add, the
 * per-channel ops, view copies, the fused prep stage (GroupNorm apply + SiLU + nearest upsample), GroupNorm
 * statistics and their finalisation, row softmax. The per-element math is
 * lib/kernels/kernels.h, shared with the cpu backend; here is only indexing and the parallel
 * structure. Views that fold to rank 4 with 32-bit offsets (every patch of the VAE) take a
 * row kernel: one (n, c, h) row per thread group, row coordinates from 32-bit multiply-high
 * division once per row, columns contiguous and 16/8-byte vector loads where aligned. Other
 * views take a generic strided kernel. All reductions use fixed thread-to-element maps and
 * fixed merge orders (no atomics), so every launch gives bitwise the same result. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdio.h>

#include "backend/cuda/cuda_internal.h"
#include "kernels/kernels.h"

namespace {

constexpr int kThreads = 256;             /* every kernel below: __launch_bounds__(kThreads) */
constexpr int kLog2Threads = 8;
constexpr int64_t kMaxBlocks = 1 << 16;   /* grid-stride loops beyond this */
constexpr int kVec = 4;                   /* elements per vector access (16 B f32, 8 B f16/bf16) */
constexpr int64_t kStatsPerBlock = 16384; /* GroupNorm statistics: elements per block, target */
constexpr int64_t kStatsMinPerBlock = 2048;
constexpr int64_t kStatsBlocks = 1024;
constexpr int kSoftmaxWarpCols = 1024;    /* softmax: a warp per row up to this many columns */

static_assert(kThreads == 1 << kLog2Threads, "kThreads is a power of two");

/* ---- element types --------------------------------------------------------------------- */

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

/* kVec elements as one aligned access (the launcher checked the alignment). */
template <typename T> struct alignas(kVec * sizeof(T)) Pack {
    T v[kVec];
};

/* Runtime dtype loads for operands whose dtype is not the kernel's (bias, generic path). */
__device__ __forceinline__ float load_dt(const void *p, int64_t off, int dt) {
    switch (dt) {
    case CW_F16: return __half2float(static_cast<const __half *>(p)[off]);
    case CW_BF16: return __bfloat162float(static_cast<const __nv_bfloat16 *>(p)[off]);
    default: return static_cast<const float *>(p)[off];
    }
}

__device__ __forceinline__ void store_dt(void *p, int64_t off, int dt, float v) {
    switch (dt) {
    case CW_F16: static_cast<__half *>(p)[off] = __float2half_rn(v); break;
    case CW_BF16: static_cast<__nv_bfloat16 *>(p)[off] = __float2bfloat16_rn(v); break;
    default: static_cast<float *>(p)[off] = v; break;
    }
}

/* ---- 32-bit division by an invariant divisor (Granlund-Montgomery): x / d for x < 2^31
 * as a multiply-high, add and shift. Host and device so the host self-test checks it. */
struct FastDiv {
    uint32_t d, m, s;
};

FastDiv fastdiv_make(uint32_t d) {
    FastDiv f;
    uint32_t l = 0;
    while (l < 32 && ((uint64_t)1 << l) < d) l++;
    f.d = d;
    f.s = l;
    f.m = (uint32_t)((((uint64_t)1 << 32) * (((uint64_t)1 << l) - d)) / d + 1);
    return f;
}

__host__ __device__ __forceinline__ uint32_t fastdiv(const FastDiv &f, uint32_t x) {
#ifdef __CUDA_ARCH__
    uint32_t t = __umulhi(x, f.m);
#else
    uint32_t t = (uint32_t)(((uint64_t)x * f.m) >> 32);
#endif
    return (t + x) >> f.s; /* t <= x < 2^31: no overflow */
}

/* ---- rank-4 row geometry ----------------------------------------------------------------
 * A view folded to [N, C, H, W] with 32-bit element strides; rows are (n, c, h) in
 * row-major order. tw threads (a power of two) share a row, kThreads / tw rows per pass. */
struct V4 {
    int sn, sc, sh, sw;
};

struct Rows {
    int rows, C, H, W;
    FastDiv dH, dC;
    int log2_tw;
};

__device__ __forceinline__ void row_coords(const Rows &g, int row, int *n, int *c, int *h) {
    uint32_t nc = fastdiv(g.dH, (uint32_t)row);
    *h = row - (int)(nc * (uint32_t)g.H);
    uint32_t nn = fastdiv(g.dC, nc);
    *c = (int)(nc - nn * (uint32_t)g.C);
    *n = (int)nn;
}

__device__ __forceinline__ int row_off(const V4 &v, int n, int c, int h) { return n * v.sn + c * v.sc + h * v.sh; }

/* The loop over this thread's rows: row index in 64 bits only for the stride step. */
#define CW_ROWS_LOOP(g, row)                                                                                    \
    for (int64_t row##_ = (int64_t)blockIdx.x * (kThreads >> (g).log2_tw) + (threadIdx.x >> (g).log2_tw);     \
         row##_ < (g).rows; row##_ += (int64_t)gridDim.x * (kThreads >> (g).log2_tw))                          \
        for (int row = (int)row##_, row##_once = 1; row##_once; row##_once = 0)

/* Elementwise ops over equal-shape rank-4 views (one dtype T): */
enum { EW_FILL_BIAS = 0, EW_BIAS_ADD = 1, EW_ADD = 2, EW_COPY = 3, EW_COPY_BIAS = 4,
       EW_CHANNEL = 8 /* + a CW_CHANNEL_* code: d = cw_channel_elem(code, a, bias[c]) */ };

/* d = bias[c] (or 0 without bias) / d += bias[c] / d = a + b / d = a / d = a + bias[c] /
 * d = cw_channel_elem(op - EW_CHANNEL, a, bias[c]).
 * d may alias a or b exactly: each element is read before it is written, by one thread. */
template <typename T, int VEC>
__global__ void __launch_bounds__(kThreads)
    ew4_kernel(int op, Rows g, V4 vd, T *dp, V4 va, const T *ap, V4 vb, const T *bp, const void *bias,
               int bdt) {
    const int tw = 1 << g.log2_tw, lane = threadIdx.x & (tw - 1), nv = g.W / VEC;
    CW_ROWS_LOOP(g, row) {
        int n, c, h;
        row_coords(g, row, &n, &c, &h);
        const int od = row_off(vd, n, c, h), oa = row_off(va, n, c, h), ob = row_off(vb, n, c, h);
        const float bv = (bias && op != EW_ADD && op != EW_COPY) ? load_dt(bias, c, bdt) : 0.0f;
        for (int v = lane; v < nv; v += tw) {
            const int w = v * VEC;
            float x[VEC];
            if (op == EW_FILL_BIAS) {
                for (int j = 0; j < VEC; j++) x[j] = bv;
            } else {
                const T *src = op == EW_BIAS_ADD ? dp + od : ap + oa;
                const int sw = op == EW_BIAS_ADD ? vd.sw : va.sw;
                if (VEC > 1) {
                    Pack<T> pk = *reinterpret_cast<const Pack<T> *>(src + w);
                    for (int j = 0; j < VEC; j++) x[j] = to_f(pk.v[j]);
                } else {
                    x[0] = to_f(src[w * sw]);
                }
                if (op == EW_ADD) {
                    if (VEC > 1) {
                        Pack<T> pk = *reinterpret_cast<const Pack<T> *>(bp + ob + w);
                        for (int j = 0; j < VEC; j++) x[j] += to_f(pk.v[j]);
                    } else {
                        x[0] += to_f(bp[ob + w * vb.sw]);
                    }
                } else if (op >= EW_CHANNEL) {
                    for (int j = 0; j < VEC; j++) x[j] = cw_channel_elem(op - EW_CHANNEL, x[j], bv);
                } else if (op != EW_COPY) {
                    for (int j = 0; j < VEC; j++) x[j] += bv;
                }
            }
            if (VEC > 1) {
                Pack<T> pk;
                for (int j = 0; j < VEC; j++) pk.v[j] = from_f<T>(x[j]);
                *reinterpret_cast<Pack<T> *>(dp + od + w) = pk;
            } else {
                dp[od + w * vd.sw] = from_f<T>(x[0]);
            }
        }
    }
}

/* The prep's activation links (cw__prep_params): SiLU, then a unary op. */
struct PrepAct {
    int silu, unary;
    float a, b;
};

__device__ __forceinline__ float prep_act(float x, float sc, float sh, int has_norm, const PrepAct &act) {
    return cw_prep_unary(cw_prep_elem(x, sc, sh, has_norm, act.silu), act.unary, act.a, act.b);
}

static PrepAct prep_act_of(const cw__prep_params *p) { return PrepAct{p->silu, p->unary, p->ua, p->ub}; }

/* prep over rank-4 dst/src: dst[n,c,r,w] = f(src[n,c,(dst_row0 + r)/up - src_row0, w/up]).
 * The row map runs once per row (shared cw_up_src_index); columns divide by up in 32 bits. */
template <typename TD, typename TS, int VEC>
__global__ void __launch_bounds__(kThreads)
    prep4_kernel(Rows g, V4 vd, TD *__restrict__ dp, V4 vs, const TS *__restrict__ sp, const float *scale,
                 const float *shift, PrepAct act, int up, FastDiv dup, int64_t dst_row0, int64_t src_row0) {
    const int tw = 1 << g.log2_tw, lane = threadIdx.x & (tw - 1), nv = g.W / VEC;
    const int has_norm = scale != nullptr;
    CW_ROWS_LOOP(g, row) {
        int n, c, h;
        row_coords(g, row, &n, &c, &h);
        float sc = 1.0f, sh = 0.0f;
        if (has_norm) {
            sc = scale[n * g.C + c];
            sh = shift[n * g.C + c];
        }
        const int hs = (int)cw_up_src_index(h, dst_row0, src_row0, up);
        const TS *srow = sp + row_off(vs, n, c, hs);
        TD *drow = dp + row_off(vd, n, c, h);
        for (int v = lane; v < nv; v += tw) {
            const int w = v * VEC;
            float x[VEC];
            if (VEC > 1 && up == 1) { /* the launcher checked src's alignment for this case */
                Pack<TS> pk = *reinterpret_cast<const Pack<TS> *>(srow + w);
                for (int j = 0; j < VEC; j++) x[j] = to_f(pk.v[j]);
            } else {
                for (int j = 0; j < VEC; j++) x[j] = to_f(srow[(int)fastdiv(dup, (uint32_t)(w + j)) * vs.sw]);
            }
            for (int j = 0; j < VEC; j++) x[j] = prep_act(x[j], sc, sh, has_norm, act);
            if (VEC > 1) {
                Pack<TD> pk;
                for (int j = 0; j < VEC; j++) pk.v[j] = from_f<TD>(x[j]);
                *reinterpret_cast<Pack<TD> *>(drow + w) = pk;
            } else {
                drow[w * vd.sw] = from_f<TD>(x[0]);
            }
        }
    }
}

/* ---- generic strided views (any rank <= CW_MAX_RANK, 64-bit offsets) ---------------------
 * Passed as __grid_constant__ so indexing dims/strides by a loop variable reads the kernel
 * parameter space instead of copying the struct to local memory. */
struct View {
    int rank;
    int dtype;
    int64_t dims[CW_MAX_RANK];
    int64_t strides[CW_MAX_RANK];
    int64_t numel;
};

View make_view(const cw__view *v) {
    View r;
    r.rank = v->d.rank;
    r.dtype = (int)v->d.dtype;
    int zero = 1;
    for (int i = 0; i < CW_MAX_RANK; i++) {
        r.dims[i] = i < r.rank ? v->d.dims[i] : 1;
        r.strides[i] = i < r.rank ? v->d.strides[i] : 0;
        if (i < r.rank && r.strides[i] != 0) zero = 0;
    }
    if (zero) { /* all-zero strides mean contiguous (cw_tensor_desc convention) */
        int64_t s = 1;
        for (int i = r.rank - 1; i >= 0; i--) {
            r.strides[i] = s;
            s *= r.dims[i];
        }
    }
    r.numel = 1;
    for (int i = 0; i < r.rank; i++) r.numel *= r.dims[i];
    return r;
}

__device__ __forceinline__ int64_t coords(const View &v, int64_t i, int64_t *c) {
    int64_t off = 0;
    for (int d = v.rank - 1; d >= 0; d--) {
        int64_t q = i / v.dims[d];
        c[d] = i - q * v.dims[d];
        off += c[d] * v.strides[d];
        i = q;
    }
    return off;
}

__device__ __forceinline__ int64_t offset_of(const View &v, const int64_t *c) {
    int64_t off = 0;
    for (int d = 0; d < v.rank; d++) off += c[d] * v.strides[d];
    return off;
}

#define CW_GRID_STRIDE(i, n) \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

__global__ void __launch_bounds__(kThreads) fill32_kernel(uint32_t *p, uint32_t pattern, int64_t count) {
    CW_GRID_STRIDE(i, count) p[i] = pattern;
}

__global__ void __launch_bounds__(kThreads)
    ew_generic_kernel(int op, const __grid_constant__ View d, void *dp, const __grid_constant__ View a, const void *ap,
                      const __grid_constant__ View b, const void *bp, const void *bias, int bdt) {
    int64_t c[CW_MAX_RANK];
    CW_GRID_STRIDE(i, d.numel) {
        const int64_t od = coords(d, i, c);
        const float bv = (bias && op != EW_ADD && op != EW_COPY && d.rank > 1) ? load_dt(bias, c[1], bdt) : 0.0f;
        float v;
        switch (op) {
        case EW_FILL_BIAS: v = bv; break;
        case EW_BIAS_ADD: v = load_dt(dp, od, d.dtype) + bv; break;
        case EW_ADD: v = load_dt(ap, offset_of(a, c), a.dtype) + load_dt(bp, offset_of(b, c), b.dtype); break;
        case EW_COPY:
        case EW_COPY_BIAS: v = load_dt(ap, offset_of(a, c), a.dtype) + bv; break; /* bias 0 unless COPY_BIAS */
        default: v = cw_channel_elem(op - EW_CHANNEL, load_dt(ap, offset_of(a, c), a.dtype), bv); break;
        }
        store_dt(dp, od, d.dtype, v);
    }
}

/* CW_OP_AVG_POOL2: each output element from the 2x2 window of x under it, any strides and
 * dtype (one thread per output element). */
__global__ void __launch_bounds__(kThreads)
    avg_pool2_kernel(const __grid_constant__ View d, void *dp, const __grid_constant__ View x, const void *xp) {
    int64_t c[CW_MAX_RANK];
    const int hh = d.rank - 2, ww = d.rank - 1;
    const int64_t sh = x.strides[hh], sw = x.strides[ww];
    CW_GRID_STRIDE(i, d.numel) {
        const int64_t od = coords(d, i, c);
        c[hh] *= 2, c[ww] *= 2;
        const int64_t o = offset_of(x, c);
        const float v = cw_avg4(load_dt(xp, o, x.dtype), load_dt(xp, o + sw, x.dtype), load_dt(xp, o + sh, x.dtype),
                                load_dt(xp, o + sh + sw, x.dtype));
        store_dt(dp, od, d.dtype, v);
    }
}

__global__ void __launch_bounds__(kThreads)
    prep_generic_kernel(const __grid_constant__ View dst, void *dp, const __grid_constant__ View src, const void *sp,
                        const float *scale, const float *shift, PrepAct act, int64_t up, int64_t dst_row0,
                        int64_t src_row0, int64_t pad_d, int64_t pad_h, int64_t pad_w, int64_t up_h, int64_t up_d,
                        int64_t off_d) {
    int64_t c[CW_MAX_RANK];
    const int rr = dst.rank - 2, ww = dst.rank - 1;
    const int has_norm = scale != nullptr;
    CW_GRID_STRIDE(i, dst.numel) {
        int64_t od = coords(dst, i, c);
        float sc = 1.0f, sh = 0.0f;
        if (has_norm) {
            int64_t k = c[0] * dst.dims[1] + c[1];
            sc = scale[k];
            sh = shift[k];
        }
        if (up_h > 0) { /* replicate padding: clamped into the upsampled tensor */
            if (dst.rank == 5) c[2] = cw_prep_src_d(c[2], pad_d, src.dims[2], up_d, off_d);
            c[rr] = cw_prep_src(c[rr], dst_row0, pad_h, up_h, up, src_row0);
            c[ww] = cw_prep_src(c[ww], 0, pad_w, src.dims[ww] * up, up, 0);
        } else {
            if (dst.rank == 5) c[2] = cw_up_src_d(c[2], up_d, off_d);
            c[rr] = cw_up_src_index(c[rr], dst_row0, src_row0, up);
            c[ww] = cw_up_src_index(c[ww], 0, 0, up);
        }
        float x = load_dt(sp, offset_of(src, c), src.dtype);
        store_dt(dp, od, dst.dtype, prep_act(x, sc, sh, has_norm, act));
    }
}

/* ---- GroupNorm statistics ----------------------------------------------------------------
 * Each (n, g) is cut into `chunks` consecutive row ranges (rows = the group's cpg * H rows
 * of W elements); one block per (n, g, chunk). Each thread runs Welford over a fixed set
 * of the chunk's elements, the block merges them by a fixed pairwise tree of Chan merges,
 * and a second kernel merges the chunks of each (n, g) in chunk order. The partition
 * depends on the shape only, so results are bitwise reproducible. */
__device__ __forceinline__ void block_merge(cw_moments mo, double *s_cnt, double *s_mean, double *s_m2) {
    s_cnt[threadIdx.x] = mo.count;
    s_mean[threadIdx.x] = mo.mean;
    s_m2[threadIdx.x] = mo.m2;
    __syncthreads();
    for (int h = kThreads / 2; h > 0; h >>= 1) {
        if ((int)threadIdx.x < h) {
            cw_moments a = {s_cnt[threadIdx.x], s_mean[threadIdx.x], s_m2[threadIdx.x]};
            cw_moments_merge(&a, s_cnt[threadIdx.x + h], s_mean[threadIdx.x + h], s_m2[threadIdx.x + h]);
            s_cnt[threadIdx.x] = a.count;
            s_mean[threadIdx.x] = a.mean;
            s_m2[threadIdx.x] = a.m2;
        }
        __syncthreads();
    }
}

/* x folded to [N, C, H, W] (rank-4 geometry in g: rows/C/H unused; W and log2_tw used).
 * Block b: ng = b / chunks, chunk k = b % chunks, rows [k*rpc, min((k+1)*rpc, cpg*H)). */
template <typename T, int VEC>
__global__ void __launch_bounds__(kThreads)
    gn_stats4_kernel(Rows g, V4 vx, const T *__restrict__ xp, int ng_total, int groups, int cpg, int chunks, int rpc,
                     double *__restrict__ out) {
    __shared__ double s_cnt[kThreads], s_mean[kThreads], s_m2[kThreads];
    const int tw = 1 << g.log2_tw, lane = threadIdx.x & (tw - 1), nv = g.W / VEC;
    const int rows_per_pass = kThreads >> g.log2_tw;
    const int grows = cpg * g.H;
    for (int64_t b = blockIdx.x; b < (int64_t)ng_total * chunks; b += gridDim.x) {
        const int ng = (int)(b / chunks), k = (int)(b - (int64_t)ng * chunks);
        const int n = ng / groups, gi = ng - n * groups;
        const int r0 = k * rpc, r1 = min(r0 + rpc, grows);
        cw_moments mo;
        cw_moments_zero(&mo);
        for (int r = r0 + (int)(threadIdx.x >> g.log2_tw); r < r1; r += rows_per_pass) {
            const int ch = r / g.H, h = r - ch * g.H; /* once per row */
            const T *row = xp + row_off(vx, n, gi * cpg + ch, h);
            for (int v = lane; v < nv; v += tw) {
                if (VEC > 1) {
                    /* the VEC values' own moments (mean by a power-of-two scale, exact), then
                     * one Chan merge: one double division per VEC elements, not per element */
                    Pack<T> pk = *reinterpret_cast<const Pack<T> *>(row + v * VEC);
                    double x[VEC], mean = 0.0, m2 = 0.0;
                    for (int j = 0; j < VEC; j++) mean += x[j] = (double)to_f(pk.v[j]);
                    mean *= 1.0 / VEC;
                    for (int j = 0; j < VEC; j++) m2 += (x[j] - mean) * (x[j] - mean);
                    cw_moments_merge(&mo, (double)VEC, mean, m2);
                } else {
                    cw_moments_push(&mo, (double)to_f(row[v * vx.sw]));
                }
            }
        }
        block_merge(mo, s_cnt, s_mean, s_m2);
        if (threadIdx.x == 0) {
            double *o = out + b * 3;
            o[0] = s_cnt[0];
            o[1] = s_mean[0];
            o[2] = s_m2[0];
        }
        __syncthreads(); /* shared arrays are reused by the next block index */
    }
}

/* Any rank: one block per (n, g) (chunks = 1), elements j = tid, tid + blockDim, ... */
__global__ void __launch_bounds__(kThreads)
    gn_stats_generic_kernel(const __grid_constant__ View x, const void *xp, int64_t groups, double *out) {
    __shared__ double s_cnt[kThreads], s_mean[kThreads], s_m2[kThreads];
    const int64_t cpg = x.dims[1] / groups;
    int64_t spatial = 1;
    for (int d = 2; d < x.rank; d++) spatial *= x.dims[d];
    const int64_t m = cpg * spatial;
    for (int64_t ng = blockIdx.x; ng < x.dims[0] * groups; ng += gridDim.x) {
        const int64_t n = ng / groups, g = ng - n * groups;
        cw_moments mo;
        cw_moments_zero(&mo);
        for (int64_t j = threadIdx.x; j < m; j += blockDim.x) {
            int64_t c[CW_MAX_RANK];
            int64_t ch = j / spatial, s = j - ch * spatial;
            c[0] = n;
            c[1] = g * cpg + ch;
            for (int d = x.rank - 1; d >= 2; d--) {
                int64_t q = s / x.dims[d];
                c[d] = s - q * x.dims[d];
                s = q;
            }
            cw_moments_push(&mo, (double)load_dt(xp, offset_of(x, c), x.dtype));
        }
        block_merge(mo, s_cnt, s_mean, s_m2);
        if (threadIdx.x == 0) {
            out[ng * 3 + 0] = s_cnt[0];
            out[ng * 3 + 1] = s_mean[0];
            out[ng * 3 + 2] = s_m2[0];
        }
        __syncthreads();
    }
}

/* One thread per (n, g): merges its chunks' partials in chunk order. */
__global__ void __launch_bounds__(kThreads)
    gn_merge_chunks_kernel(const double *__restrict__ parts, int ng_total, int chunks, double *__restrict__ out) {
    for (int ng = blockIdx.x * kThreads + threadIdx.x; ng < ng_total; ng += gridDim.x * kThreads) {
        cw_moments m;
        cw_moments_zero(&m);
        const double *q = parts + (int64_t)ng * chunks * 3;
        for (int k = 0; k < chunks; k++) cw_moments_merge(&m, q[k * 3], q[k * 3 + 1], q[k * 3 + 2]);
        out[ng * 3 + 0] = m.count;
        out[ng * 3 + 1] = m.mean;
        out[ng * 3 + 2] = m.m2;
    }
}

/* One block per (n, g): thread 0 merges the n_parts partials in index order, every
 * thread then writes scale/shift for some channels of the group. */
__global__ void __launch_bounds__(kThreads)
    gn_finalize_kernel(const double *parts, int64_t n_parts, int64_t n, int64_t c, int64_t groups, const float *gamma,
                       const float *beta, float eps, float *scale, float *shift) {
    __shared__ cw_moments s_m;
    __shared__ double s_rstd;
    const int64_t ng_total = n * groups, cpg = c / groups;
    for (int64_t ng = blockIdx.x; ng < ng_total; ng += gridDim.x) {
        if (threadIdx.x == 0) {
            cw_moments m;
            cw_moments_zero(&m);
            for (int64_t p = 0; p < n_parts; p++) {
                const double *q = parts + (p * ng_total + ng) * 3;
                cw_moments_merge(&m, q[0], q[1], q[2]);
            }
            s_m = m;
            s_rstd = cw_gn_rstd(&m, (double)eps);
        }
        __syncthreads();
        const int64_t nn = ng / groups, g = ng - nn * groups;
        for (int64_t k = threadIdx.x; k < cpg; k += blockDim.x) {
            int64_t ch = g * cpg + k;
            cw_gn_scale_shift(&s_m, s_rstd, gamma ? gamma[ch] : 1.0f, beta ? beta[ch] : 0.0f, &scale[nn * c + ch],
                              &shift[nn * c + ch]);
        }
        __syncthreads();
    }
}

/* ---- row softmax ---------------------------------------------------------------------------
 * Lanes take columns lane, lane + L, ... (coalesced; kVec-wide where the rows are aligned).
 * Max and sum are combined by xor butterflies (every lane ends with the same bits) and, for
 * a block per row, then across warps in warp order. */
__device__ __forceinline__ float warp_max(float m) {
    for (int o = 16; o > 0; o >>= 1) m = cw_softmax_max2(m, __shfl_xor_sync(0xffffffffu, m, o));
    return m;
}
__device__ __forceinline__ double warp_sum(double s) {
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    return s;
}

/* Lane `lane` of `lanes` over one row: max, exp + sum, scale — the three passes of the
 * shared row helpers, with a combine step between them. */
template <int VEC, typename MaxAll, typename SumAll>
__device__ __forceinline__ void softmax_row(float *row, int cols, int lane, int lanes, MaxAll max_all, SumAll sum_all) {
    const int nv = cols / VEC;
    float m = -INFINITY;
    for (int v = lane; v < nv; v += lanes) {
        if constexpr (VEC == 4) {
            const float4 q = *reinterpret_cast<const float4 *>(row + v * 4);
            m = cw_softmax_max2(cw_softmax_max2(cw_softmax_max2(cw_softmax_max2(m, q.x), q.y), q.z), q.w);
        } else {
            m = cw_softmax_max2(m, row[v]);
        }
    }
    const float row_max = max_all(m);
    double s = 0.0;
    for (int v = lane; v < nv; v += lanes) {
        if constexpr (VEC == 4) {
            float4 q = *reinterpret_cast<const float4 *>(row + v * 4);
            q.x = cw_softmax_exp(q.x, row_max);
            q.y = cw_softmax_exp(q.y, row_max);
            q.z = cw_softmax_exp(q.z, row_max);
            q.w = cw_softmax_exp(q.w, row_max);
            s += ((double)q.x + (double)q.y) + ((double)q.z + (double)q.w);
            *reinterpret_cast<float4 *>(row + v * 4) = q;
        } else {
            const float e = cw_softmax_exp(row[v], row_max);
            row[v] = e;
            s += (double)e;
        }
    }
    const float inv = (float)(1.0 / sum_all(s));
    for (int v = lane; v < nv; v += lanes) {
        if constexpr (VEC == 4) {
            float4 q = *reinterpret_cast<const float4 *>(row + v * 4);
            q.x *= inv, q.y *= inv, q.z *= inv, q.w *= inv;
            *reinterpret_cast<float4 *>(row + v * 4) = q;
        } else {
            row[v] *= inv;
        }
    }
}

template <int VEC>
__global__ void __launch_bounds__(kThreads) softmax_warp_kernel(float *x, int rows, int cols, int64_t ld) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int64_t r = (int64_t)blockIdx.x * (kThreads / 32) + warp; r < rows; r += (int64_t)gridDim.x * (kThreads / 32))
        softmax_row<VEC>(x + r * ld, cols, lane, 32, warp_max, warp_sum);
}

template <int VEC>
__global__ void __launch_bounds__(kThreads) softmax_block_kernel(float *x, int rows, int cols, int64_t ld) {
    __shared__ float s_max[kThreads / 32];
    __shared__ double s_sum[kThreads / 32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    auto max_all = [&](float m) {
        m = warp_max(m);
        if (lane == 0) s_max[warp] = m;
        __syncthreads();
        float r = s_max[0];
        for (int k = 1; k < kThreads / 32; k++) r = cw_softmax_max2(r, s_max[k]);
        __syncthreads(); /* s_max is reused by the next row */
        return r;
    };
    auto sum_all = [&](double s) {
        s = warp_sum(s);
        if (lane == 0) s_sum[warp] = s;
        __syncthreads();
        double r = s_sum[0];
        for (int k = 1; k < kThreads / 32; k++) r += s_sum[k];
        __syncthreads();
        return r;
    };
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) softmax_row<VEC>(x + r * ld, cols, threadIdx.x, kThreads, max_all, sum_all);
}

/* ---- host side: folding views to rank 4 ---------------------------------------------------- */

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

unsigned blocks_for(int64_t n, int64_t per_block) {
    int64_t b = ceil_div(n, per_block);
    if (b < 1) b = 1;
    return (unsigned)(b < kMaxBlocks ? b : kMaxBlocks);
}

/* Filled strides of d (contiguous where all are zero). */
void filled(const cw_tensor_desc *d, int64_t *dims, int64_t *strides) {
    int zero = 1;
    for (int i = 0; i < d->rank; i++) zero &= d->strides[i] == 0;
    int64_t s = 1;
    for (int i = d->rank - 1; i >= 0; i--) {
        dims[i] = d->dims[i];
        strides[i] = zero ? s : d->strides[i];
        s *= d->dims[i];
    }
}

/* Folds n equal-dims views to [N, C, H, W]: ranks 1-3 get leading 1s (only when keep_c is 0:
 * dim 1 must stay the channel otherwise), rank 5 merges D into H where every view allows it
 * (or D is 1). 0 when that fails or an offset, the row count or a dim needs more than 31
 * bits, or a stride is negative. */
int fold4(const cw_tensor_desc *const *d, int n, int keep_c, int64_t dims4[4], V4 *out) {
    int64_t dims[CW__CU_MAX_VIEWS][CW_MAX_RANK] = {{0}}, st[CW__CU_MAX_VIEWS][CW_MAX_RANK] = {{0}};
    const int rank = d[0]->rank;
    if (n > CW__CU_MAX_VIEWS || rank < 1 || rank > 5 || (keep_c && rank < 4)) return 0;
    for (int v = 0; v < n; v++) {
        if (d[v]->rank != rank) return 0;
        filled(d[v], dims[v], st[v]);
        for (int i = 0; i < rank; i++)
            if (dims[v][i] != dims[0][i] || st[v][i] < 0) return 0;
    }
    int64_t s4[CW__CU_MAX_VIEWS][4] = {{0}};
    if (rank == 5) {
        int ok = 1;
        for (int v = 0; v < n; v++) ok &= dims[0][2] == 1 || st[v][2] == dims[0][3] * st[v][3];
        if (!ok) return 0;
        dims4[0] = dims[0][0], dims4[1] = dims[0][1], dims4[2] = dims[0][2] * dims[0][3], dims4[3] = dims[0][4];
        for (int v = 0; v < n; v++) s4[v][0] = st[v][0], s4[v][1] = st[v][1], s4[v][2] = st[v][3], s4[v][3] = st[v][4];
    } else {
        for (int i = 0; i < 4; i++) {
            int k = i - (4 - rank);
            dims4[i] = k >= 0 ? dims[0][k] : 1;
            for (int v = 0; v < n; v++) s4[v][i] = k >= 0 ? st[v][k] : 0;
        }
    }
    const int64_t lim = (int64_t)1 << 31;
    if (dims4[0] * dims4[1] * dims4[2] >= lim || dims4[3] >= lim) return 0;
    for (int v = 0; v < n; v++) {
        int64_t span = 1;
        for (int i = 0; i < 4; i++) {
            if (dims4[i] > 1) span += (dims4[i] - 1) * s4[v][i];
            if (s4[v][i] >= lim) return 0;
        }
        if (span >= lim) return 0;
        out[v].sn = dims4[0] > 1 ? (int)s4[v][0] : 0;
        out[v].sc = dims4[1] > 1 ? (int)s4[v][1] : 0;
        out[v].sh = dims4[2] > 1 ? (int)s4[v][2] : 0;
        out[v].sw = dims4[3] > 1 ? (int)s4[v][3] : 1;
    }
    return 1;
}

Rows make_rows(const int64_t dims4[4], int vec) {
    Rows g;
    g.rows = (int)(dims4[0] * dims4[1] * dims4[2]);
    g.C = (int)dims4[1];
    g.H = (int)dims4[2];
    g.W = (int)dims4[3];
    g.dH = fastdiv_make((uint32_t)g.H);
    g.dC = fastdiv_make((uint32_t)g.C);
    int nv = g.W / vec, l = 0;
    while (l < kLog2Threads && (1 << l) < nv) l++;
    g.log2_tw = l;
    return g;
}

/* kVec-wide access is possible: unit W stride, W and every other stride multiples of kVec,
 * the base aligned to kVec elements. */
int vec_ok(const V4 &v, const void *p, size_t es, int64_t w) {
    return v.sw == 1 && w % kVec == 0 && v.sn % kVec == 0 && v.sc % kVec == 0 && v.sh % kVec == 0 &&
           ((uintptr_t)p % (kVec * es)) == 0;
}

unsigned row_blocks(const Rows &g) { return blocks_for(g.rows, kThreads >> g.log2_tw); }

template <typename T>
cudaError_t ew4_launch(cudaStream_t s, int op, const int64_t dims4[4], const V4 *v, void *d, const void *a,
                       const void *b, const void *bias, int bdt, int vec) {
    Rows g = make_rows(dims4, vec);
    if (vec == kVec)
        ew4_kernel<T, kVec><<<row_blocks(g), kThreads, 0, s>>>(op, g, v[0], static_cast<T *>(d), v[1],
                                                                static_cast<const T *>(a), v[2],
                                                                static_cast<const T *>(b), bias, bdt);
    else
        ew4_kernel<T, 1><<<row_blocks(g), kThreads, 0, s>>>(op, g, v[0], static_cast<T *>(d), v[1],
                                                             static_cast<const T *>(a), v[2],
                                                             static_cast<const T *>(b), bias, bdt);
    return cudaGetLastError();
}

/* An elementwise op over up to three equal-dims views (nullptr where unused). */
cudaError_t ew_launch(cudaStream_t s, int op, const cw__view *d, const cw__view *a, const cw__view *b,
                      const void *bias, int bdt) {
    const cw_tensor_desc *ds[CW__CU_MAX_VIEWS] = {&d->d, a ? &a->d : &d->d, b ? &b->d : &d->d};
    const void *ps[CW__CU_MAX_VIEWS] = {d->data, a ? a->data : d->data, b ? b->data : d->data};
    int64_t dims4[4];
    V4 v[CW__CU_MAX_VIEWS];
    int same = 1;
    for (int i = 1; i < CW__CU_MAX_VIEWS; i++) same &= ds[i]->dtype == ds[0]->dtype;
    const int keep_c = bias != nullptr;
    if (same && fold4(ds, CW__CU_MAX_VIEWS, keep_c, dims4, v)) {
        if (dims4[0] * dims4[1] * dims4[2] * dims4[3] == 0) return cudaSuccess;
        const size_t es = cw_dtype_size(ds[0]->dtype);
        int vec = kVec;
        for (int i = 0; i < CW__CU_MAX_VIEWS; i++)
            if (!vec_ok(v[i], ps[i], es, dims4[3])) vec = 1;
        switch (ds[0]->dtype) {
        case CW_F16: return ew4_launch<__half>(s, op, dims4, v, d->data, ps[1], ps[2], bias, bdt, vec);
        case CW_BF16: return ew4_launch<__nv_bfloat16>(s, op, dims4, v, d->data, ps[1], ps[2], bias, bdt, vec);
        default: return ew4_launch<float>(s, op, dims4, v, d->data, ps[1], ps[2], bias, bdt, vec);
        }
    }
    View vd = make_view(d), va = make_view(a ? a : d), vb = make_view(b ? b : d);
    if (vd.numel <= 0) return cudaSuccess;
    ew_generic_kernel<<<blocks_for(vd.numel, kThreads), kThreads, 0, s>>>(op, vd, d->data, va, ps[1], vb, ps[2], bias,
                                                                         bdt);
    return cudaGetLastError();
}

template <typename TD, typename TS>
cudaError_t prep4_launch(cudaStream_t s, const cw__prep_params *p, const int64_t dd[4], const V4 &vd, const V4 &vs,
                         int vec) {
    Rows g = make_rows(dd, vec);
    FastDiv dup = fastdiv_make((uint32_t)p->up);
    TD *dp = static_cast<TD *>(p->dst.data);
    const TS *sp = static_cast<const TS *>(p->src.data);
    if (vec == kVec)
        prep4_kernel<TD, TS, kVec><<<row_blocks(g), kThreads, 0, s>>>(g, vd, dp, vs, sp, p->scale, p->shift,
                                                                       prep_act_of(p), p->up, dup, p->dst_row0,
                                                                       p->src_row0);
    else
        prep4_kernel<TD, TS, 1><<<row_blocks(g), kThreads, 0, s>>>(g, vd, dp, vs, sp, p->scale, p->shift,
                                                                    prep_act_of(p), p->up, dup, p->dst_row0,
                                                                    p->src_row0);
    return cudaGetLastError();
}

template <typename TD>
cudaError_t prep4_src(cudaStream_t s, const cw__prep_params *p, const int64_t dd[4], const V4 &vd, const V4 &vs,
                      int vec) {
    switch (p->src.d.dtype) {
    case CW_F16: return prep4_launch<TD, __half>(s, p, dd, vd, vs, vec);
    case CW_BF16: return prep4_launch<TD, __nv_bfloat16>(s, p, dd, vd, vs, vec);
    default: return prep4_launch<TD, float>(s, p, dd, vd, vs, vec);
    }
}

/* Geometry of the GroupNorm statistics launch (see gn_stats4_kernel). */
struct GnPlan {
    int chunks, rpc;
};

GnPlan gn_plan(int64_t n, int64_t groups, int64_t cpg, int64_t h, int64_t w, int64_t scratch_parts) {
    GnPlan gp;
    const int64_t grows = cpg * h, ng = n * groups;
    /* enough elements per block to amortise its merge, enough blocks to fill the device
     * (kStatsBlocks: ~8 per SM of an H100), never fewer elements than kStatsMinPerBlock */
    int64_t want = ceil_div(grows * w, kStatsPerBlock), fill = ceil_div(kStatsBlocks, ng);
    int64_t most = ceil_div(grows * w, kStatsMinPerBlock);
    if (fill > most) fill = most;
    if (fill > want) want = fill;
    int64_t cap = scratch_parts > 0 ? scratch_parts / ng : 1;
    if (want > cap) want = cap;
    if (want > grows) want = grows;
    if (want < 1) want = 1;
    gp.rpc = (int)ceil_div(grows, want);
    gp.chunks = (int)ceil_div(grows, gp.rpc); /* none empty */
    return gp;
}

template <typename T>
cudaError_t gn_stats4_launch(cudaStream_t s, const int64_t dims4[4], const V4 &v, const void *xp, int64_t groups,
                             double *out, double *scratch, int64_t scratch_parts, int vec) {
    Rows g = make_rows(dims4, vec);
    const int64_t cpg = dims4[1] / groups, ng = dims4[0] * groups;
    GnPlan gp = gn_plan(dims4[0], groups, cpg, dims4[2], dims4[3], scratch ? scratch_parts : 0);
    double *dst = gp.chunks > 1 ? scratch : out;
    const unsigned blocks = blocks_for(ng * gp.chunks, 1);
    const T *x = static_cast<const T *>(xp);
    if (vec == kVec)
        gn_stats4_kernel<T, kVec><<<blocks, kThreads, 0, s>>>(g, v, x, (int)ng, (int)groups, (int)cpg, gp.chunks, gp.rpc, dst);
    else
        gn_stats4_kernel<T, 1><<<blocks, kThreads, 0, s>>>(g, v, x, (int)ng, (int)groups, (int)cpg, gp.chunks, gp.rpc, dst);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess || gp.chunks == 1) return e;
    gn_merge_chunks_kernel<<<blocks_for(ng, kThreads), kThreads, 0, s>>>(scratch, (int)ng, gp.chunks, out);
    return cudaGetLastError();
}

/* ---- the elementwise generic ops (CW_OP_UNARY, CW_OP_BINARY) --------------------------- */

/* Strides of a row-major contiguous tensor: elements then index flat. */
int view_flat(const View &v) {
    int64_t s = 1;
    for (int i = v.rank - 1; i >= 0; i--) {
        if (v.dims[i] != 1 && v.strides[i] != s) return 0;
        s *= v.dims[i];
    }
    return 1;
}

/* CW_OP_UNARY: one thread per element, any strides and dtype (flat: every view contiguous,
 * no coordinates). d may alias x exactly: each element is read before it is written by one
 * thread. */
__global__ void __launch_bounds__(kThreads)
    unary_kernel(int op, float pa, float pb, int flat, const __grid_constant__ View d, void *dp,
                 const __grid_constant__ View x, const void *xp) {
    int64_t c[CW_MAX_RANK] = {0};
    CW_GRID_STRIDE(i, d.numel) {
        const int64_t od = flat ? i : coords(d, i, c);
        const int64_t ox = flat ? i : offset_of(x, c);
        store_dt(dp, od, d.dtype, cw_unary_elem(op, load_dt(xp, ox, x.dtype), pa, pb));
    }
}

/* CW_OP_BINARY: as unary_kernel, of two views of d's dims (y's channel stride 0 when it
 * broadcasts over d's channels). */
__global__ void __launch_bounds__(kThreads)
    binary_kernel(int op, int flat, const __grid_constant__ View d, void *dp, const __grid_constant__ View x,
                  const void *xp, const __grid_constant__ View y, const void *yp) {
    int64_t c[CW_MAX_RANK] = {0};
    CW_GRID_STRIDE(i, d.numel) {
        const int64_t od = flat ? i : coords(d, i, c);
        const int64_t ox = flat ? i : offset_of(x, c), oy = flat ? i : offset_of(y, c);
        store_dt(dp, od, d.dtype, cw_binary_elem(op, load_dt(xp, ox, x.dtype), load_dt(yp, oy, y.dtype)));
    }
}

/* CW_OP_UPSAMPLE_NEAREST: one thread per output element, its source element's bits copied
 * (T: a 2- or 4-byte word; nearest is exact in every dtype). f[0..2]: factors of the last
 * three dims (D, H, W; 4-D views: f[0] = 1 and dim rank - 3 is C, left as is). */
template <typename T>
__global__ void __launch_bounds__(kThreads)
    upsample_nearest_kernel(const __grid_constant__ View d, T *dp, const __grid_constant__ View x, const T *xp,
                            int64_t fd, int64_t fh, int64_t fw, int64_t off) {
    int64_t c[CW_MAX_RANK];
    const int r = d.rank;
    CW_GRID_STRIDE(i, d.numel) {
        const int64_t od = coords(d, i, c);
        if (r == 5) c[2] = cw_up_src_d(c[2], fd, off);
        c[r - 2] /= fh, c[r - 1] /= fw;
        dp[od] = xp[offset_of(x, c)];
    }
}

/* CW_OP_REDUCE_CHANNELS: one thread per output element (d: [N, 1, ...]), adding x's
 * channels in double in ascending order, as the cpu loop does: the same bits. Adjacent
 * threads read adjacent W elements of each channel. */
__global__ void __launch_bounds__(kThreads)
    reduce_channels_kernel(int op, const __grid_constant__ View d, void *dp, const __grid_constant__ View x,
                           const void *xp) {
    int64_t c[CW_MAX_RANK] = {0};
    const int sq = cw_reduce_squares(op);
    CW_GRID_STRIDE(i, d.numel) {
        const int64_t od = coords(d, i, c);
        double acc = 0.0;
        for (int64_t k = 0; k < x.dims[1]; k++) {
            c[1] = k;
            const double v = (double)load_dt(xp, offset_of(x, c), x.dtype);
            acc += sq ? v * v : v;
        }
        store_dt(dp, od, d.dtype, cw_reduce_finish(op, acc, x.dims[1]));
    }
}

/* CW_OP_CONCAT: one thread per output element, its bits copied from a, or from b where its
 * coordinate in dim is past a's extent (T: a 2- or 4-byte word). */
template <typename T>
__global__ void __launch_bounds__(kThreads)
    concat_kernel(const __grid_constant__ View d, T *dp, const __grid_constant__ View a, const T *ap,
                  const __grid_constant__ View b, const T *bp, int dim) {
    int64_t c[CW_MAX_RANK];
    CW_GRID_STRIDE(i, d.numel) {
        const int64_t od = coords(d, i, c);
        if (c[dim] < a.dims[dim]) {
            dp[od] = ap[offset_of(a, c)];
        } else {
            c[dim] -= a.dims[dim];
            dp[od] = bp[offset_of(b, c)];
        }
    }
}

/* CW_OP_SLICE: one thread per output element, its bits copied from x at the same
 * coordinates but start further along dim (T: a 2- or 4-byte word). */
template <typename T>
__global__ void __launch_bounds__(kThreads)
    slice_kernel(const __grid_constant__ View d, T *dp, const __grid_constant__ View x, const T *xp, int dim,
                 int64_t start) {
    int64_t c[CW_MAX_RANK];
    CW_GRID_STRIDE(i, d.numel) {
        const int64_t od = coords(d, i, c);
        c[dim] += start;
        dp[od] = xp[offset_of(x, c)];
    }
}

/* CW_OP_PAD: one thread per output element, its bits copied from x at cw_pad_src of its
 * D, H, W coordinates (4-D views: H, W), or the fill (bits of the dtype) where a source is
 * outside a constant pad. pre, post: the packed pads (cw_pad_pack). */
template <typename T>
__global__ void __launch_bounds__(kThreads)
    pad_kernel(const __grid_constant__ View d, T *dp, const __grid_constant__ View x, const T *xp, int mode,
               int64_t pre, T fill) {
    int64_t c[CW_MAX_RANK];
    const int r = d.rank;
    CW_GRID_STRIDE(i, d.numel) {
        const int64_t od = coords(d, i, c);
        int inside = 1;
        for (int k = r == 5 ? 0 : 1; k < 3; k++) {
            const int j = r - 3 + k;
            c[j] = cw_pad_src(c[j], cw_pad_get(pre, k), x.dims[j], mode);
            inside &= c[j] >= 0;
        }
        dp[od] = inside ? xp[offset_of(x, c)] : fill;
    }
}

/* CW_OP_DEPTH_TO_SPACE (d2s) and CW_OP_SPACE_TO_DEPTH: one thread per output element, its
 * bits copied from the source element the op's index map gives (kernels.h's contract; 4-D
 * views: fd = 1 and no D). T: a 2- or 4-byte word. */
template <typename T>
__global__ void __launch_bounds__(kThreads)
    shuffle_kernel(const __grid_constant__ View d, T *dp, const __grid_constant__ View x, const T *xp, int d2s,
                   int64_t fd, int64_t fh, int64_t fw) {
    int64_t c[CW_MAX_RANK];
    const int r = d.rank;
    const int64_t f = fd * fh * fw;
    CW_GRID_STRIDE(i, d.numel) {
        const int64_t od = coords(d, i, c);
        if (d2s) { /* sub = (i fh + j) fw + k of the output's (d fd + i, h fh + j, w fw + k) */
            int64_t sub = 0;
            if (r == 5) sub = c[2] % fd, c[2] /= fd;
            sub = sub * fh + c[r - 2] % fh, c[r - 2] /= fh;
            sub = sub * fw + c[r - 1] % fw, c[r - 1] /= fw;
            c[1] = c[1] * f + sub;
        } else { /* the output's channel c F + sub names (i, j, k) */
            const int64_t sub = c[1] % f;
            c[1] /= f;
            if (r == 5) c[2] = c[2] * fd + sub / (fh * fw);
            c[r - 2] = c[r - 2] * fh + sub / fw % fh;
            c[r - 1] = c[r - 1] * fw + sub % fw;
        }
        dp[od] = xp[offset_of(x, c)];
    }
}

} // namespace

extern "C" {

cudaError_t cw__cu_fill32(cudaStream_t s, void *p, uint32_t pattern, int64_t count) {
    if (count <= 0) return cudaSuccess;
    fill32_kernel<<<blocks_for(count, kThreads), kThreads, 0, s>>>(static_cast<uint32_t *>(p), pattern, count);
    return cudaGetLastError();
}

cudaError_t cw__cu_fill_bias(cudaStream_t s, const cw__view *y, const void *b, cw_dtype b_dtype) {
    return ew_launch(s, EW_FILL_BIAS, y, nullptr, nullptr, b, (int)b_dtype);
}

cudaError_t cw__cu_bias_add(cudaStream_t s, const cw__view *y, const void *b, cw_dtype b_dtype) {
    return ew_launch(s, EW_BIAS_ADD, y, nullptr, nullptr, b, (int)b_dtype);
}

cudaError_t cw__cu_add(cudaStream_t s, const cw__view *dst, const cw__view *a, const cw__view *b) {
    return ew_launch(s, EW_ADD, dst, a, b, nullptr, 0);
}

cudaError_t cw__cu_op(cudaStream_t s, const cw__op_args *a) {
    switch (a->code) {
    case CW_OP_CHANNEL:
        return ew_launch(s, EW_CHANNEL + (int)a->param.i[0], &a->out, &a->in[0], nullptr, a->in[1].data, (int)CW_F32);
    case CW_OP_AVG_POOL2: {
        View vd = make_view(&a->out), vx = make_view(&a->in[0]);
        avg_pool2_kernel<<<blocks_for(vd.numel, kThreads), kThreads, 0, s>>>(vd, a->out.data, vx, a->in[0].data);
        return cudaGetLastError();
    }
    case CW_OP_UNARY: {
        View vd = make_view(&a->out), vx = make_view(&a->in[0]);
        const int flat = view_flat(vd) && view_flat(vx);
        unary_kernel<<<blocks_for(vd.numel, kThreads), kThreads, 0, s>>>((int)a->param.i[0], a->param.f[0],
                                                                           a->param.f[1], flat, vd, a->out.data, vx,
                                                                           a->in[0].data);
        return cudaGetLastError();
    }
    case CW_OP_BINARY: {
        View vd = make_view(&a->out), vx = make_view(&a->in[0]), vy = make_view(&a->in[1]);
        if (cw_binary_bcast(&a->in[0].d, &a->in[1].d)) vy.strides[1] = 0; /* [N, 1, ...] over C */
        const int flat = view_flat(vd) && view_flat(vx) && view_flat(vy) && vy.numel == vd.numel;
        binary_kernel<<<blocks_for(vd.numel, kThreads), kThreads, 0, s>>>((int)a->param.i[0], flat, vd, a->out.data, vx,
                                                                            a->in[0].data, vy, a->in[1].data);
        return cudaGetLastError();
    }
    case CW_OP_UPSAMPLE_NEAREST: {
        View vd = make_view(&a->out), vx = make_view(&a->in[0]);
        const unsigned blocks = blocks_for(vd.numel, kThreads);
        const int64_t *f = a->param.i;
        if (cw_dtype_size(a->out.d.dtype) == 4)
            upsample_nearest_kernel<uint32_t><<<blocks, kThreads, 0, s>>>(
                vd, static_cast<uint32_t *>(a->out.data), vx, static_cast<const uint32_t *>(a->in[0].data), f[0], f[1],
                f[2], f[3]);
        else
            upsample_nearest_kernel<uint16_t><<<blocks, kThreads, 0, s>>>(
                vd, static_cast<uint16_t *>(a->out.data), vx, static_cast<const uint16_t *>(a->in[0].data), f[0], f[1],
                f[2], f[3]);
        return cudaGetLastError();
    }
    case CW_OP_REDUCE_CHANNELS: {
        View vd = make_view(&a->out), vx = make_view(&a->in[0]);
        reduce_channels_kernel<<<blocks_for(vd.numel, kThreads), kThreads, 0, s>>>((int)a->param.i[0], vd, a->out.data,
                                                                                    vx, a->in[0].data);
        return cudaGetLastError();
    }
    case CW_OP_CONCAT: {
        View vd = make_view(&a->out), va = make_view(&a->in[0]), vb = make_view(&a->in[1]);
        const unsigned blocks = blocks_for(vd.numel, kThreads);
        const int dim = (int)a->param.i[0];
        if (cw_dtype_size(a->out.d.dtype) == 4)
            concat_kernel<uint32_t><<<blocks, kThreads, 0, s>>>(
                vd, static_cast<uint32_t *>(a->out.data), va, static_cast<const uint32_t *>(a->in[0].data), vb,
                static_cast<const uint32_t *>(a->in[1].data), dim);
        else
            concat_kernel<uint16_t><<<blocks, kThreads, 0, s>>>(
                vd, static_cast<uint16_t *>(a->out.data), va, static_cast<const uint16_t *>(a->in[0].data), vb,
                static_cast<const uint16_t *>(a->in[1].data), dim);
        return cudaGetLastError();
    }
    case CW_OP_SLICE: {
        View vd = make_view(&a->out), vx = make_view(&a->in[0]);
        const unsigned blocks = blocks_for(vd.numel, kThreads);
        const int dim = (int)a->param.i[0];
        if (cw_dtype_size(a->out.d.dtype) == 4)
            slice_kernel<uint32_t><<<blocks, kThreads, 0, s>>>(vd, static_cast<uint32_t *>(a->out.data), vx,
                                                               static_cast<const uint32_t *>(a->in[0].data), dim,
                                                               a->param.i[1]);
        else
            slice_kernel<uint16_t><<<blocks, kThreads, 0, s>>>(vd, static_cast<uint16_t *>(a->out.data), vx,
                                                               static_cast<const uint16_t *>(a->in[0].data), dim,
                                                               a->param.i[1]);
        return cudaGetLastError();
    }
    case CW_OP_PAD: {
        View vd = make_view(&a->out), vx = make_view(&a->in[0]);
        const unsigned blocks = blocks_for(vd.numel, kThreads);
        const int mode = (int)a->param.i[0];
        const uint32_t fill = cw_pad_fill_bits(a->param.f[0], a->out.d.dtype);
        if (cw_dtype_size(a->out.d.dtype) == 4)
            pad_kernel<uint32_t><<<blocks, kThreads, 0, s>>>(vd, static_cast<uint32_t *>(a->out.data), vx,
                                                             static_cast<const uint32_t *>(a->in[0].data), mode,
                                                             a->param.i[1], fill);
        else
            pad_kernel<uint16_t><<<blocks, kThreads, 0, s>>>(vd, static_cast<uint16_t *>(a->out.data), vx,
                                                             static_cast<const uint16_t *>(a->in[0].data), mode,
                                                             a->param.i[1], static_cast<uint16_t>(fill));
        return cudaGetLastError();
    }
    case CW_OP_DEPTH_TO_SPACE:
    case CW_OP_SPACE_TO_DEPTH: {
        View vd = make_view(&a->out), vx = make_view(&a->in[0]);
        const unsigned blocks = blocks_for(vd.numel, kThreads);
        const int d2s = a->code == CW_OP_DEPTH_TO_SPACE;
        const int64_t *f = a->param.i;
        if (cw_dtype_size(a->out.d.dtype) == 4)
            shuffle_kernel<uint32_t><<<blocks, kThreads, 0, s>>>(vd, static_cast<uint32_t *>(a->out.data), vx,
                                                                 static_cast<const uint32_t *>(a->in[0].data), d2s,
                                                                 f[0], f[1], f[2]);
        else
            shuffle_kernel<uint16_t><<<blocks, kThreads, 0, s>>>(vd, static_cast<uint16_t *>(a->out.data), vx,
                                                                 static_cast<const uint16_t *>(a->in[0].data), d2s,
                                                                 f[0], f[1], f[2]);
        return cudaGetLastError();
    }
    default: return cudaErrorInvalidValue; /* cw__op_run admits only known codes */
    }
}

cudaError_t cw__cu_copy_view(cudaStream_t s, const cw__view *dst, const cw__view *src, const void *b,
                             cw_dtype b_dtype) {
    return ew_launch(s, b ? EW_COPY_BIAS : EW_COPY, dst, src, nullptr, b, (int)b_dtype);
}

cudaError_t cw__cu_prep(cudaStream_t s, const cw__prep_params *p) {
    const cw_tensor_desc *dd = &p->dst.d, *sd = &p->src.d;
    /* rank 4 (or rank 5 with D = 1): the row kernel */
    const int padded = p->up_h > 0;
    if ((dd->rank == 4 || (dd->rank == 5 && dd->dims[2] == 1 && p->up_d <= 1)) && sd->rank == dd->rank && p->up >= 1 &&
        !padded) {
        int64_t d4[4], s4[4];
        V4 vd, vs;
        const cw_tensor_desc *a[1] = {dd}, *b[1] = {sd};
        if (fold4(a, 1, 1, d4, &vd) && fold4(b, 1, 1, s4, &vs)) {
            if (d4[0] * d4[1] * d4[2] * d4[3] == 0) return cudaSuccess;
            int vec = vec_ok(vd, p->dst.data, cw_dtype_size(dd->dtype), d4[3]) ? kVec : 1;
            if (p->up == 1 && !vec_ok(vs, p->src.data, cw_dtype_size(sd->dtype), s4[3])) vec = 1;
            switch (dd->dtype) {
            case CW_F16: return prep4_src<__half>(s, p, d4, vd, vs, vec);
            case CW_BF16: return prep4_src<__nv_bfloat16>(s, p, d4, vd, vs, vec);
            default: return prep4_src<float>(s, p, d4, vd, vs, vec);
            }
        }
    }
    View d = make_view(&p->dst), src = make_view(&p->src);
    if (d.numel <= 0) return cudaSuccess;
    prep_generic_kernel<<<blocks_for(d.numel, kThreads), kThreads, 0, s>>>(d, p->dst.data, src, p->src.data, p->scale,
                                                                           p->shift, prep_act_of(p), (int64_t)p->up,
                                                                           p->dst_row0, p->src_row0, p->pad[0],
                                                                           p->pad[1], p->pad[2], p->up_h, p->up_d,
                                                                           p->off_d);
    return cudaGetLastError();
}

cudaError_t cw__cu_gn_stats(cudaStream_t s, const cw__view *x, int64_t groups, double *out, double *scratch,
                            int64_t scratch_parts) {
    int64_t d4[4];
    V4 v;
    const cw_tensor_desc *a[1] = {&x->d};
    if (x->d.rank >= 4 && fold4(a, 1, 1, d4, &v)) {
        if (d4[0] * d4[1] * d4[2] * d4[3] == 0) return cudaSuccess;
        int vec = vec_ok(v, x->data, cw_dtype_size(x->d.dtype), d4[3]) ? kVec : 1;
        switch (x->d.dtype) {
        case CW_F16: return gn_stats4_launch<__half>(s, d4, v, x->data, groups, out, scratch, scratch_parts, vec);
        case CW_BF16:
            return gn_stats4_launch<__nv_bfloat16>(s, d4, v, x->data, groups, out, scratch, scratch_parts, vec);
        default: return gn_stats4_launch<float>(s, d4, v, x->data, groups, out, scratch, scratch_parts, vec);
        }
    }
    View vx = make_view(x);
    int64_t ng = vx.dims[0] * groups;
    if (ng <= 0) return cudaSuccess;
    gn_stats_generic_kernel<<<blocks_for(ng, 1), kThreads, 0, s>>>(vx, x->data, groups, out);
    return cudaGetLastError();
}

cudaError_t cw__cu_gn_finalize(cudaStream_t s, const double *parts, int64_t n_parts, int64_t n, int64_t c,
                               int64_t groups, const float *gamma, const float *beta, float eps, float *scale,
                               float *shift) {
    int64_t ng = n * groups;
    if (ng <= 0) return cudaSuccess;
    gn_finalize_kernel<<<blocks_for(ng, 1), kThreads, 0, s>>>(parts, n_parts, n, c, groups, gamma, beta, eps, scale,
                                                              shift);
    return cudaGetLastError();
}

cudaError_t cw__cu_softmax_rows(cudaStream_t s, float *x, int64_t rows, int64_t cols, int64_t ld) {
    if (rows <= 0 || cols <= 0) return cudaSuccess;
    if (rows >= ((int64_t)1 << 31) || cols >= ((int64_t)1 << 31)) return cudaErrorInvalidValue;
    const int vec = (cols % kVec == 0 && ld % kVec == 0 && (uintptr_t)x % (kVec * sizeof(float)) == 0) ? kVec : 1;
    if (cols <= kSoftmaxWarpCols) {
        const unsigned blocks = blocks_for(rows, kThreads / 32);
        if (vec == kVec) softmax_warp_kernel<kVec><<<blocks, kThreads, 0, s>>>(x, (int)rows, (int)cols, ld);
        else softmax_warp_kernel<1><<<blocks, kThreads, 0, s>>>(x, (int)rows, (int)cols, ld);
    } else {
        const unsigned blocks = blocks_for(rows, 1);
        if (vec == kVec) softmax_block_kernel<kVec><<<blocks, kThreads, 0, s>>>(x, (int)rows, (int)cols, ld);
        else softmax_block_kernel<1><<<blocks, kThreads, 0, s>>>(x, (int)rows, (int)cols, ld);
    }
    return cudaGetLastError();
}

cudaError_t cw__cu_probe(void) {
    cudaFuncAttributes attr;
    cudaError_t e = cudaFuncGetAttributes(&attr, fill32_kernel);
    /* launch bounds: every kernel is compiled for kThreads; a device that cannot run that
     * many threads per block with this build's register use must not get these launches */
    if (e == cudaSuccess && attr.maxThreadsPerBlock < kThreads) return cudaErrorInvalidConfiguration;
    if (e == cudaSuccess) e = cudaFuncGetAttributes(&attr, gn_stats4_kernel<float, kVec>);
    if (e == cudaSuccess && attr.maxThreadsPerBlock < kThreads) return cudaErrorInvalidConfiguration;
    return e;
}

int cw__cu_gn_chunks(int64_t n, int64_t groups, int64_t cpg, int64_t h, int64_t w, int64_t scratch_parts,
                     int64_t *rows_per_chunk) {
    GnPlan gp = gn_plan(n, groups, cpg, h, w, scratch_parts);
    if (rows_per_chunk) *rows_per_chunk = gp.rpc;
    return gp.chunks;
}

int cw__cu_selftest_host(char *msg, size_t len) {
    /* 32-bit division by multiply-high: divisors 1..4099 and some large ones, against /. */
    uint32_t ds[] = {1, 2, 3, 5, 7, 10, 64, 96, 100, 127, 1000, 4095, 65537, 1u << 20, 2147483647u};
    uint32_t xs[] = {0, 1, 2, 3, 63, 64, 65, 1000, 4096, 65535, 1u << 24, 2147483646u, 2147483647u};
    for (uint32_t d = 1; d < 4100; d++) {
        FastDiv f = fastdiv_make(d);
        for (uint32_t x = 0; x < 3 * d + 7; x += 1 + d / 7)
            if (fastdiv(f, x) != x / d) return snprintf(msg, len, "fastdiv %u / %u", x, d), 1;
        for (uint32_t x : xs)
            if (x < 2147483648u && fastdiv(f, x) != x / d) return snprintf(msg, len, "fastdiv %u / %u", x, d), 1;
    }
    for (uint32_t d : ds) {
        FastDiv f = fastdiv_make(d);
        for (uint32_t x : xs)
            if (fastdiv(f, x) != x / d) return snprintf(msg, len, "fastdiv %u / %u", x, d), 1;
    }
    /* folding: a contiguous NCDHW view folds (D into H), a channel slice too, a 2^31 span not */
    cw_tensor_desc t;
    memset(&t, 0, sizeof t);
    t.rank = 5;
    t.dtype = CW_F32;
    const int64_t d5[5] = {2, 3, 4, 5, 6};
    for (int i = 0; i < 5; i++) t.dims[i] = d5[i];
    const cw_tensor_desc *one[1] = {&t};
    int64_t d4[4];
    V4 v;
    if (!fold4(one, 1, 1, d4, &v) || d4[2] != 20 || v.sh != 6 || v.sc != 120 || v.sn != 360)
        return snprintf(msg, len, "fold4 of a contiguous rank-5 view"), 1;
    t.rank = 4;
    const int64_t big[4] = {1, 512, 2048, 2048};
    for (int i = 0; i < 4; i++) t.dims[i] = big[i];
    if (fold4(one, 1, 1, d4, &v)) return snprintf(msg, len, "fold4 accepted a 2^31-element span"), 1;
    const int64_t pd[4] = {1, 128, 64, 1024}, ps[4] = {512 * 1024 * 1024LL / 1024 * 2, 1024 * 1024, 1024, 1};
    for (int i = 0; i < 4; i++) t.dims[i] = pd[i], t.strides[i] = ps[i];
    if (!fold4(one, 1, 1, d4, &v) || v.sc != 1024 * 1024 || v.sh != 1024 || v.sw != 1 || v.sn != 0)
        return snprintf(msg, len, "fold4 of a 64-row patch of a [1, 128, 1024, 1024] tensor"), 1;
    Rows g = make_rows(d4, kVec);
    if (g.rows != 128 * 64 || (1 << g.log2_tw) != 256) return snprintf(msg, len, "row geometry"), 1;
    /* the VAE's GroupNorm statistics at 1024^2 / 128 channels / 32 groups: many blocks */
    int64_t rpc = 0;
    int ch = cw__cu_gn_chunks(1, 32, 4, 1024, 1024, CW__CU_GN_SCRATCH_PARTS, &rpc);
    if (ch < 128 || rpc * ch < 4 * 1024 || rpc * (ch - 1) >= 4 * 1024)
        return snprintf(msg, len, "gn chunks %d x %lld rows", ch, (long long)rpc), 1;
    if (cw__cu_gn_chunks(1, 32, 4, 1024, 1024, 0, &rpc) != 1) return snprintf(msg, len, "gn chunks without scratch"), 1;
    return 0;
}

} // extern "C"
