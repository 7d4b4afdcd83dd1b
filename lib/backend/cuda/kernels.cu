/* The cuda backend's elementwise and reduction kernels: fill, bias, residual add, the fused
 * prep stage (GroupNorm apply + SiLU + nearest upsample), GroupNorm statistics and their
 * finalisation, row softmax. The per-element math is lib/kernels/kernels.h, shared with the
 * cpu backend; here is only indexing over strided views and the parallel structure. All
 * reductions use fixed thread-to-element maps and fixed tree orders (no atomics), so every
 * launch gives bitwise the same result. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>

#include "backend/cuda/cuda_internal.h"
#include "kernels/kernels.h"

namespace {

constexpr int kThreads = 256;
constexpr int kRedThreads = 512; /* GroupNorm statistics: one block per (n, group) */
constexpr int64_t kMaxBlocks = 65536;

/* A view's shape and strides in elements, passed by value to kernels. */
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

/* Element offset of linear (row-major over v's dims) index i; coordinates into c. */
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

/* Loads and stores convert through f32; the dtype switch is uniform across a launch. */
__device__ __forceinline__ float load(const void *p, int64_t off, int dt) {
    switch (dt) {
    case CW_F16: return __half2float(static_cast<const __half *>(p)[off]);
    case CW_BF16: return __bfloat162float(static_cast<const __nv_bfloat16 *>(p)[off]);
    default: return static_cast<const float *>(p)[off];
    }
}

__device__ __forceinline__ void store(void *p, int64_t off, int dt, float v) {
    switch (dt) {
    case CW_F16: static_cast<__half *>(p)[off] = __float2half_rn(v); break;
    case CW_BF16: static_cast<__nv_bfloat16 *>(p)[off] = __float2bfloat16_rn(v); break;
    default: static_cast<float *>(p)[off] = v; break;
    }
}

unsigned blocks_for(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    if (b < 1) b = 1;
    return (unsigned)(b < kMaxBlocks ? b : kMaxBlocks);
}

#define CW_GRID_STRIDE(i, n) \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

__global__ void fill32_kernel(uint32_t *p, uint32_t pattern, int64_t count) {
    CW_GRID_STRIDE(i, count) p[i] = pattern;
}

__global__ void zero_kernel(View y, void *yp) {
    int64_t c[CW_MAX_RANK];
    CW_GRID_STRIDE(i, y.numel) store(yp, coords(y, i, c), y.dtype, 0.0f);
}

__global__ void bias_kernel(View y, void *yp, const void *b, int bdt) {
    int64_t c[CW_MAX_RANK];
    CW_GRID_STRIDE(i, y.numel) {
        int64_t off = coords(y, i, c);
        store(yp, off, y.dtype, load(yp, off, y.dtype) + load(b, c[1], bdt));
    }
}

/* dst may alias a or b exactly: each element is read before it is written, by one thread. */
__global__ void add_kernel(View d, void *dp, View a, const void *ap, View b, const void *bp) {
    int64_t c[CW_MAX_RANK];
    CW_GRID_STRIDE(i, d.numel) {
        int64_t od = coords(d, i, c);
        float v = load(ap, offset_of(a, c), a.dtype) + load(bp, offset_of(b, c), b.dtype);
        store(dp, od, d.dtype, v);
    }
}

__global__ void copy_kernel(View d, void *dp, View src, const void *sp) {
    int64_t c[CW_MAX_RANK];
    CW_GRID_STRIDE(i, d.numel) {
        int64_t od = coords(d, i, c);
        store(dp, od, d.dtype, load(sp, offset_of(src, c), src.dtype));
    }
}

/* cw__prep_params: dst[n,c,(d,)r,w] = f(src[n,c,(d,)(dst_row0 + r)/up - src_row0, w/up]). */
__global__ void prep_kernel(View dst, void *dp, View src, const void *sp, const float *scale, const float *shift,
                            int silu, int64_t up, int64_t dst_row0, int64_t src_row0) {
    int64_t c[CW_MAX_RANK];
    const int rr = dst.rank - 2, ww = dst.rank - 1;
    const int64_t nc_c = dst.dims[1];
    const int has_norm = scale != nullptr;
    CW_GRID_STRIDE(i, dst.numel) {
        int64_t od = coords(dst, i, c);
        float sc = 1.0f, sh = 0.0f;
        if (has_norm) {
            int64_t k = c[0] * nc_c + c[1];
            sc = scale[k];
            sh = shift[k];
        }
        c[rr] = cw_up_src_index(c[rr], dst_row0, src_row0, up);
        c[ww] = cw_up_src_index(c[ww], 0, 0, up);
        float x = load(sp, offset_of(src, c), src.dtype);
        store(dp, od, dst.dtype, cw_prep_elem(x, sc, sh, has_norm, silu));
    }
}

/* Moments of one (n, g) per block: each thread runs Welford over the elements
 * j = tid, tid + blockDim, ... of the group (channel-major, then spatial), then a fixed
 * pairwise tree of Chan merges. out[(n*G + g)*3 + {0,1,2}] = {count, mean, M2}. */
__global__ void gn_stats_kernel(View x, const void *xp, int64_t groups, double *out) {
    __shared__ double s_cnt[kRedThreads], s_mean[kRedThreads], s_m2[kRedThreads];
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
            cw_moments_push(&mo, (double)load(xp, offset_of(x, c), x.dtype));
        }
        s_cnt[threadIdx.x] = mo.count;
        s_mean[threadIdx.x] = mo.mean;
        s_m2[threadIdx.x] = mo.m2;
        __syncthreads();
        for (int h = blockDim.x / 2; h > 0; h >>= 1) {
            if ((int)threadIdx.x < h) {
                cw_moments a = {s_cnt[threadIdx.x], s_mean[threadIdx.x], s_m2[threadIdx.x]};
                cw_moments_merge(&a, s_cnt[threadIdx.x + h], s_mean[threadIdx.x + h], s_m2[threadIdx.x + h]);
                s_cnt[threadIdx.x] = a.count;
                s_mean[threadIdx.x] = a.mean;
                s_m2[threadIdx.x] = a.m2;
            }
            __syncthreads();
        }
        if (threadIdx.x == 0) {
            out[ng * 3 + 0] = s_cnt[0];
            out[ng * 3 + 1] = s_mean[0];
            out[ng * 3 + 2] = s_m2[0];
        }
        __syncthreads(); /* shared arrays are reused by the next (n, g) */
    }
}

/* One block per (n, g): thread 0 merges the n_parts partials in index order, every
 * thread then writes scale/shift for some channels of the group. */
__global__ void gn_finalize_kernel(const double *parts, int64_t n_parts, int64_t n, int64_t c, int64_t groups,
                                   const float *gamma, const float *beta, float eps, float *scale, float *shift) {
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

/* One block per row; thread t owns the contiguous slice [t*len, (t+1)*len) and applies the
 * shared row helpers to it; max and sum are combined by fixed trees. */
__global__ void softmax_rows_kernel(float *x, int64_t rows, int64_t cols, int64_t ld) {
    __shared__ float s_max[kThreads];
    __shared__ double s_sum[kThreads];
    const int64_t len = (cols + blockDim.x - 1) / blockDim.x;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        float *row = x + r * ld;
        int64_t b = (int64_t)threadIdx.x * len, e = b + len < cols ? b + len : cols;
        int64_t cnt = e > b ? e - b : 0;
        s_max[threadIdx.x] = cnt ? cw_softmax_row_max(row + b, cnt) : -INFINITY;
        __syncthreads();
        for (int h = blockDim.x / 2; h > 0; h >>= 1) {
            if ((int)threadIdx.x < h) s_max[threadIdx.x] = cw_softmax_max2(s_max[threadIdx.x], s_max[threadIdx.x + h]);
            __syncthreads();
        }
        const float row_max = s_max[0];
        s_sum[threadIdx.x] = cnt ? cw_softmax_row_exp_sum(row + b, cnt, row_max) : 0.0;
        __syncthreads();
        for (int h = blockDim.x / 2; h > 0; h >>= 1) {
            if ((int)threadIdx.x < h) s_sum[threadIdx.x] += s_sum[threadIdx.x + h];
            __syncthreads();
        }
        const float inv = (float)(1.0 / s_sum[0]);
        if (cnt) cw_softmax_row_scale(row + b, cnt, inv);
        __syncthreads(); /* s_max / s_sum are reused by the next row */
    }
}

} // namespace

extern "C" {

cudaError_t cw__cu_fill32(cudaStream_t s, void *p, uint32_t pattern, int64_t count) {
    if (count <= 0) return cudaSuccess;
    fill32_kernel<<<blocks_for(count, kThreads), kThreads, 0, s>>>(static_cast<uint32_t *>(p), pattern, count);
    return cudaGetLastError();
}

cudaError_t cw__cu_zero_view(cudaStream_t s, const cw__view *y) {
    View v = make_view(y);
    if (v.numel <= 0) return cudaSuccess;
    zero_kernel<<<blocks_for(v.numel, kThreads), kThreads, 0, s>>>(v, y->data);
    return cudaGetLastError();
}

cudaError_t cw__cu_bias_add(cudaStream_t s, const cw__view *y, const void *b, cw_dtype b_dtype) {
    View v = make_view(y);
    if (v.numel <= 0) return cudaSuccess;
    bias_kernel<<<blocks_for(v.numel, kThreads), kThreads, 0, s>>>(v, y->data, b, (int)b_dtype);
    return cudaGetLastError();
}

cudaError_t cw__cu_add(cudaStream_t s, const cw__view *dst, const cw__view *a, const cw__view *b) {
    View d = make_view(dst), va = make_view(a), vb = make_view(b);
    if (d.numel <= 0) return cudaSuccess;
    add_kernel<<<blocks_for(d.numel, kThreads), kThreads, 0, s>>>(d, dst->data, va, a->data, vb, b->data);
    return cudaGetLastError();
}

cudaError_t cw__cu_copy_view(cudaStream_t s, const cw__view *dst, const cw__view *src) {
    View d = make_view(dst), v = make_view(src);
    if (d.numel <= 0) return cudaSuccess;
    copy_kernel<<<blocks_for(d.numel, kThreads), kThreads, 0, s>>>(d, dst->data, v, src->data);
    return cudaGetLastError();
}

cudaError_t cw__cu_prep(cudaStream_t s, const cw__prep_params *p) {
    View d = make_view(&p->dst), src = make_view(&p->src);
    if (d.numel <= 0) return cudaSuccess;
    prep_kernel<<<blocks_for(d.numel, kThreads), kThreads, 0, s>>>(d, p->dst.data, src, p->src.data, p->scale,
                                                                    p->shift, p->silu, (int64_t)p->up, p->dst_row0,
                                                                    p->src_row0);
    return cudaGetLastError();
}

cudaError_t cw__cu_gn_stats(cudaStream_t s, const cw__view *x, int64_t groups, double *out) {
    View v = make_view(x);
    int64_t ng = v.dims[0] * groups;
    if (ng <= 0) return cudaSuccess;
    gn_stats_kernel<<<(unsigned)(ng < kMaxBlocks ? ng : kMaxBlocks), kRedThreads, 0, s>>>(v, x->data, groups, out);
    return cudaGetLastError();
}

cudaError_t cw__cu_gn_finalize(cudaStream_t s, const double *parts, int64_t n_parts, int64_t n, int64_t c,
                               int64_t groups, const float *gamma, const float *beta, float eps, float *scale,
                               float *shift) {
    int64_t ng = n * groups;
    if (ng <= 0) return cudaSuccess;
    gn_finalize_kernel<<<(unsigned)(ng < kMaxBlocks ? ng : kMaxBlocks), 128, 0, s>>>(parts, n_parts, n, c, groups,
                                                                                  gamma, beta, eps, scale, shift);
    return cudaGetLastError();
}

cudaError_t cw__cu_softmax_rows(cudaStream_t s, float *x, int64_t rows, int64_t cols, int64_t ld) {
    if (rows <= 0 || cols <= 0) return cudaSuccess;
    softmax_rows_kernel<<<(unsigned)(rows < kMaxBlocks ? rows : kMaxBlocks), kThreads, 0, s>>>(x, rows, cols, ld);
    return cudaGetLastError();
}

cudaError_t cw__cu_probe(void) {
    cudaFuncAttributes attr;
    return cudaFuncGetAttributes(&attr, fill32_kernel);
}

} // extern "C"
