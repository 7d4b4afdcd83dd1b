/* cuDNN graph-API descriptors of every patch of random convolutions, checked without a GPU:
 * tensor, convolution, forward-operation and operation-graph descriptors finalise (cuDNN
 * validates the shapes there), a wrong output shape is rejected, and — where cuDNN accepts
 * a device-properties descriptor (>= 9.8) — heuristics, the workspace-capped engine list and
 * execution-plan finalisation run for an H100 profile. Findings on a machine without a driver
 * (cuDNN 9.19): cudnnCreate fails (CUDNN_STATUS_NOT_INITIALIZED), the operation graph needs
 * no handle, heuristics without device properties return configs that cannot finalise. */
#include "testutil.h"

#ifndef CW_HAVE_CUDA
int main(void) {
    fprintf(stderr, "built without CUDA: nothing to check\n");
    return CW_TEST_SKIP;
}
#else

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include "backend/cuda/cuda_internal.h"
#include "scheduler/planner.h"

/* An H100 SXM's device properties (public specifications, as cudaGetDeviceProperties
 * reports them) in the JSON form cuDNN's device-properties descriptor reads. The key set
 * was found from cuDNN 9.19's own error messages; a profile serialised on a real GPU
 * (CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION) may replace it. */
static const char *h100_json =
    "{\"maxGridSize\":[2147483647,65535,65535],\"maxBlockSize\":[1024,1024,64],\"regsPerBlock\":65536,"
    "\"multiProcessorCount\":132,\"warpSize\":32,\"maxSharedMemoryPerBlock\":49152,"
    "\"maxSharedMemoryPerBlockOptin\":232448,\"reservedSharedMemoryPerBlock\":1024,\"maxRegistersPerSM\":65536,"
    "\"maxCtasPerSM\":32,\"maxThreadsPerBlock\":1024,\"maxThreadsPerSM\":2048,\"pciDeviceId\":0,\"isTccDriver\":0,"
    "\"supportCoopLaunch\":1,\"smClockRateKHz\":1980000,\"memClockRateKHz\":2619000,\"l2CacheSize\":52428800,"
    "\"deviceName\":\"NVIDIA H100 80GB HBM3\",\"deviceVer\":900,\"driverVer\":13000,"
    "\"totalGlobalMem\":85031714816,\"cudaDeviceId\":0}";

/* cuDNN 9.19's engines create cuBLASLt handles while finalising engine configs and, without
 * a device, never release them (the allocation is inside cublasLtCreate): a vendor leak of
 * a few KiB that LeakSanitizer would report in the ASan run. Only stacks through
 * libcublasLt are suppressed; the library's own allocations (cw__malloc) stay checked. */
const char *__lsan_default_suppressions(void);
__attribute__((visibility("default"))) const char *__lsan_default_suppressions(void) {
    return "leak:libcublasLt.so\nleak:libnvrtc.so\n";
}

/* cuDNN dlopens NVRTC for its runtime-compiled engines, which leaks a little and is then
 * unloaded, so LeakSanitizer cannot name it ("<unknown module>"). Pinning the library
 * (RTLD_NODELETE) keeps its name on those stacks for the suppression above. */
static void pin_nvrtc(void) {
    char name[64];
    snprintf(name, sizeof name, "libnvrtc.so.%d", CUDART_VERSION / 1000);
    (void)dlopen(name, RTLD_LAZY | RTLD_NODELETE);
}

typedef struct conv_case {
    cw__conv_problem full;
    int64_t h_out;
} conv_case;

/* A random valid convolution; x and y are strided views (channel slices of wider tensors,
 * padded rows) about half the time. */
static void random_case(cw_rng *r, conv_case *cc) {
    cw_tensor_desc x, w, y;
    cw_conv_params p = CW_CONV_PARAMS_INIT;
    int sp = cw_rng_range(r, 0, 3) == 0 ? 3 : 2;
    cw_dtype dt = (cw_dtype)cw_rng_range(r, 0, 2);
    int64_t g = cw_rng_range(r, 0, 2) == 0 ? cw_rng_range(r, 2, 4) : 1;
    int64_t c = g * cw_rng_range(r, 1, 4), k = g * cw_rng_range(r, 1, 4);
    int64_t n = cw_rng_range(r, 1, 2);
    int64_t xd[5], wd[5];
    p.spatial = sp;
    p.groups = g;
    xd[0] = n;
    xd[1] = c;
    wd[0] = k;
    wd[1] = c / g;
    for (int d = 0; d < sp; d++) {
        int64_t ks = cw_rng_range(r, 1, sp == 3 ? 3 : 5);
        p.stride[d] = cw_rng_range(r, 1, 3);
        p.dilation[d] = ks > 1 ? cw_rng_range(r, 1, 2) : 1;
        p.pad_pre[d] = cw_rng_range(r, 0, 3);
        p.pad_post[d] = cw_rng_range(r, 0, 3);
        int64_t ext = p.dilation[d] * (ks - 1) + 1;
        int64_t lo = ext - p.pad_pre[d] - p.pad_post[d];
        if (lo < 1) lo = 1;
        xd[2 + d] = cw_rng_range(r, lo, sp == 3 && d == 0 ? lo + 5 : lo + 20);
        wd[2 + d] = ks;
    }
    ASSERT_OK(cw_tensor_desc_make(&x, dt, sp + 2, xd));
    ASSERT_OK(cw_tensor_desc_make(&w, dt, sp + 2, wd));
    ASSERT_OK(cw__conv_validate(NULL, &x, &w, NULL, NULL, &p, &y));
    /* Strided views: x a channel slice of a tensor with more channels, y rows padded. */
    if (cw_rng_range(r, 0, 1)) {
        int64_t extra_c = cw_rng_range(r, 1, 3);
        int64_t s = 1;
        for (int d = x.rank - 1; d >= 0; d--) {
            x.strides[d] = s;
            s *= d == 1 ? x.dims[1] + extra_c : x.dims[d];
        }
    }
    if (cw_rng_range(r, 0, 1)) {
        int64_t pad_w = cw_rng_range(r, 1, 8);
        int64_t s = 1;
        for (int d = y.rank - 1; d >= 0; d--) {
            y.strides[d] = s;
            s *= d == y.rank - 1 ? y.dims[d] + pad_w : y.dims[d];
        }
    }
    cw__conv_problem_init(&cc->full, &x, &w, 0, &y, &p);
    cc->h_out = y.dims[y.rank - 2];
}

static int64_t g_graphs, g_rejected, g_empty, g_algo_problems, g_plans, g_d_bands;

/* Descriptors of one (non-empty) patch finalise; y one row short or one channel more is
 * rejected by cuDNN at the operation's finalize. */
static void check_patch(cw_context *ctx, const cw__conv_problem *pp) {
    int64_t align[3], engines = 0;
    cw__cudnn_graph g;
    cw__cudnn_layout_align(pp, align);
    cw_status st = cw__cudnn_graph_build(ctx, pp, align, NULL, 0, &g);
    if (st != CW_OK) fprintf(stderr, "graph build failed: %s\n", cw_context_get_last_error(ctx));
    ASSERT_EQ_I(st, CW_OK);
    ASSERT_OK_CTX(ctx, cw__cudnn_graph_engine_count(ctx, &g, &engines));
    ASSERT_TRUE(engines > 0);
    cw__cudnn_graph_destroy(&g);
    g_graphs++;

    int hd = pp->spatial; /* H in the tensor dims */
    for (int wrong = 0; wrong < 3; wrong++) {
        cw__conv_problem bad = *pp;
        if (wrong == 0) bad.y.dims[hd] += 1;
        if (wrong == 1 && bad.y.dims[hd + 1] > 1) bad.y.dims[hd + 1] -= 1;
        if (wrong == 1 && pp->y.dims[hd + 1] == 1) bad.y.dims[hd + 1] += 1;
        if (wrong == 2) bad.y.dims[1] += 1; /* channels: K must match w */
        st = cw__cudnn_graph_build(ctx, &bad, align, NULL, 0, &g);
        if (st == CW_OK) {
            fprintf(stderr, "cuDNN accepted a wrong output shape (case %d): y dims %lld %lld %lld\n", wrong,
                    (long long)bad.y.dims[1], (long long)bad.y.dims[hd], (long long)bad.y.dims[hd + 1]);
            cw__cudnn_graph_destroy(&g);
        }
        ASSERT_EQ_I(st, CW_ERR_INVALID_ARG);
        ASSERT_TRUE(strstr(cw_context_get_last_error(ctx), "cuDNN rejects") != NULL);
        g_rejected++;
    }
}

/* Engine list and plans for a patch under an H100 profile: configs fastest first with
 * their workspace, cached per problem, plans that finalise within a workspace cap. */
static void check_engines(cw__cudnn_conv *cc, cw_context *ctx, const cw__conv_problem *pp, int build_plans) {
    cw__conv_algo algos[CW__CUDNN_MAX_CFGS];
    int n = 0, n2 = 0;
    int64_t problems0, problems1, hits0, hits1, align[3];
    cw__cudnn_conv_counters(cc, &problems0, NULL, &hits0, NULL);
    cw_status st = cw__cudnn_conv_algos(cc, pp, algos, CW__CUDNN_MAX_CFGS, &n);
    if (st != CW_OK) fprintf(stderr, "conv_algos: %s\n", cw_context_get_last_error(ctx));
    ASSERT_EQ_I(st, CW_OK);
    ASSERT_TRUE(n >= 1);
    for (int i = 0; i < n; i++) {
        ASSERT_TRUE(algos[i].workspace >= 0);
        ASSERT_TRUE(strncmp(algos[i].name, "cudnn engine ", 13) == 0);
        if (i) ASSERT_TRUE(algos[i].cost > algos[i - 1].cost);
        for (int j = 0; j < i; j++) ASSERT_TRUE(algos[i].id != algos[j].id);
    }
    /* Second lookup: served from the cache, same list. */
    ASSERT_OK_CTX(ctx, cw__cudnn_conv_algos(cc, pp, algos + 0, CW__CUDNN_MAX_CFGS, &n2));
    cw__cudnn_conv_counters(cc, &problems1, NULL, &hits1, NULL);
    ASSERT_EQ_I(n2, n);
    /* Two lookups: the second always hits; the first hits when an equal patch came before. */
    ASSERT_EQ_I((problems1 - problems0) + (hits1 - hits0), 2);
    ASSERT_TRUE(hits1 >= hits0 + 1);
    g_algo_problems++;
    if (!build_plans) return;

    /* Plans: the smallest-workspace config under a cap equal to its workspace, and the
     * fastest under no cap. Every plan's workspace must respect the cap it was built for. */
    int64_t min_ws = algos[0].workspace;
    for (int i = 1; i < n; i++)
        if (algos[i].workspace < min_ws) min_ws = algos[i].workspace;
    cw__cudnn_layout_align(pp, align);
    int64_t caps[2] = {min_ws, INT64_MAX};
    for (int c = 0; c < 2; c++) {
        cw__cudnn_choice ch;
        st = cw__cudnn_conv_plan(cc, pp, align, c ? algos[0].id : -1, caps[c], 1, 1, &ch);
        if (st != CW_OK) fprintf(stderr, "conv_plan (cap %lld): %s\n", (long long)caps[c], cw_context_get_last_error(ctx));
        ASSERT_EQ_I(st, CW_OK);
        ASSERT_TRUE(ch.plan != NULL);
        ASSERT_LE_I(ch.total_ws, caps[c]);
        ASSERT_TRUE(ch.id >= 0);
        if (c) ASSERT_EQ_I(ch.id, algos[0].id); /* unless it failed to finalise: none did so far */
        g_plans++;
    }
    /* A cap below every config's workspace fails cleanly (when one exists). */
    if (min_ws > 0) {
        cw__cudnn_choice ch;
        ASSERT_EQ_I(cw__cudnn_conv_plan(cc, pp, align, -1, min_ws - 1, 1, 1, &ch), CW_ERR_UNSUPPORTED);
        ASSERT_TRUE(ch.plan == NULL && ch.id == -1);
    }
}

/* The algorithm list of one problem; counts packed and direct configs. */
static int list_algos(cw__cudnn_conv *cc, cw_context *ctx, const cw__conv_problem *p, cw__conv_algo *a, int *n_packed) {
    int n = 0;
    *n_packed = 0;
    ASSERT_OK_CTX(ctx, cw__cudnn_conv_algos(cc, p, a, CW__CUDNN_MAX_CFGS, &n));
    for (int i = 0; i < n; i++) *n_packed += strstr(a[i].name, "packed") != NULL;
    return n;
}

static void vae_conv(int64_t c, int64_t h, cw__conv_problem *full) {
    cw_tensor_desc x, w, y;
    cw_conv_params cp = CW_CONV_PARAMS_INIT;
    int64_t xd[4] = {1, c, h, h}, wd[4] = {c, c, 3, 3};
    cp.pad_pre[0] = cp.pad_pre[1] = cp.pad_post[0] = cp.pad_post[1] = 1;
    ASSERT_OK(cw_tensor_desc_make(&x, CW_F16, 4, xd));
    ASSERT_OK(cw_tensor_desc_make(&w, CW_F16, 4, wd));
    ASSERT_OK(cw__conv_validate(NULL, &x, &w, NULL, NULL, &cp, &y));
    cw__conv_problem_init(full, &x, &w, 1, &y, &cp);
}

/* VAE-sized convs at the limit of cuDNN's 32-bit offsets (f16, 3x3):
 * - 512x2048^2 (2^31 elements) unpatched: even a contiguous copy has 2^31 elements, so
 *   cuDNN offers its generic engine only (patching is what reaches the fast engines);
 * - a 64-row patch of it spans just under 2^31 once N's stride is canonical: direct
 *   configs beyond the generic engine, no packing;
 * - a patch of 256x4096^2 (2^32 elements) spans more: packed first, direct generic after;
 * both kinds finalise to plans. */
static void check_big_span(cw__cudnn_conv *cc, cw_context *ctx) {
    cw__conv_problem full;
    cw__conv_algo a[CW__CUDNN_MAX_CFGS];
    cw__patch pt;
    int n, n_packed;
    int64_t align[3];
    cw__cudnn_choice ch;

    vae_conv(512, 2048, &full);
    n = list_algos(cc, ctx, &full, a, &n_packed);
    fprintf(stderr, "512x2048^2 f16 unpatched: %d configs (%d packed); first %s, %.1f MiB\n", n, n_packed, a[0].name,
            (double)a[0].workspace / (1 << 20));
    /* 2^31 elements cannot be packed under the limit either: the generic engine alone. */
    ASSERT_EQ_I(n_packed, 0);
    ASSERT_TRUE(n >= 1);

    ASSERT_OK(cw__patch_make(&full, 640, 704, &pt));
    n = list_algos(cc, ctx, &pt.prob, a, &n_packed);
    fprintf(stderr, "512x2048^2 f16, 64-row patch: %d configs (%d packed); first %s, %.1f MiB\n", n, n_packed,
            a[0].name, (double)a[0].workspace / (1 << 20));
    ASSERT_EQ_I(n_packed, 0);
    ASSERT_TRUE(n >= 2 && strcmp(a[0].name, "cudnn engine 0") != 0);
    for (int i = 0; i < n; i++) fprintf(stderr, "  %-32s %8.1f MiB\n", a[i].name, (double)a[i].workspace / (1 << 20));

    vae_conv(256, 4096, &full);
    ASSERT_OK(cw__patch_make(&full, 1024, 1088, &pt));
    n = list_algos(cc, ctx, &pt.prob, a, &n_packed);
    fprintf(stderr, "256x4096^2 f16, 64-row patch: %d configs (%d packed); first %s, %.1f MiB\n", n, n_packed,
            a[0].name, (double)a[0].workspace / (1 << 20));
    ASSERT_TRUE(n_packed >= 2 && n > n_packed && strstr(a[0].name, "packed") != NULL);
    int64_t copies = (int64_t)(256 * 66 * 4096 + 256 * 64 * 4096) * 2;
    for (int i = 0; i < n; i++)
        if (strstr(a[i].name, "packed")) ASSERT_TRUE(a[i].workspace >= copies);
    cw__cudnn_layout_align(&pt.prob, align);
    ASSERT_OK_CTX(ctx, cw__cudnn_conv_plan(cc, &pt.prob, align, a[0].id, INT64_MAX, 1, 1, &ch));
    ASSERT_TRUE(ch.packed && ch.plan != NULL);
    ASSERT_EQ_I(ch.x_bytes, 256 * 66 * 4096 * 2);
    ASSERT_EQ_I(ch.y_bytes, 256 * 64 * 4096 * 2);
    ASSERT_EQ_I(ch.total_ws, ch.engine_ws + ch.x_bytes + ch.y_bytes);
    ASSERT_EQ_I(ch.xp.dims[2], 66);
    ASSERT_OK_CTX(ctx, cw__cudnn_conv_plan(cc, &pt.prob, align, a[0].id, INT64_MAX, 0, 1, &ch));
    ASSERT_TRUE(!ch.packed && ch.plan != NULL);
    g_plans += 2;
}

static void check_alignment(void) {
    /* f16 NCHW: rows of odd width move a patch start by 2 bytes, rows of 8 by 16 bytes. */
    cw__conv_problem p;
    cw_tensor_desc x, w, y;
    cw_conv_params cp = CW_CONV_PARAMS_INIT;
    int64_t xd[4] = {1, 4, 9, 7}, wd[4] = {4, 4, 3, 3}, align[3];
    cp.pad_pre[0] = cp.pad_pre[1] = cp.pad_post[0] = cp.pad_post[1] = 1;
    ASSERT_OK(cw_tensor_desc_make(&x, CW_F16, 4, xd));
    ASSERT_OK(cw_tensor_desc_make(&w, CW_F16, 4, wd));
    ASSERT_OK(cw__conv_validate(NULL, &x, &w, NULL, NULL, &cp, &y));
    cw__conv_problem_init(&p, &x, &w, 0, &y, &cp);
    cw__cudnn_layout_align(&p, align);
    ASSERT_EQ_I(align[0], 2);
    ASSERT_EQ_I(align[1], 16); /* w is never offset: its base is checked at run time */
    ASSERT_EQ_I(align[2], 2);
    xd[3] = 64;
    ASSERT_OK(cw_tensor_desc_make(&x, CW_F16, 4, xd));
    ASSERT_OK(cw__conv_validate(NULL, &x, &w, NULL, NULL, &cp, &y));
    cw__conv_problem_init(&p, &x, &w, 0, &y, &cp);
    cw__cudnn_layout_align(&p, align);
    ASSERT_EQ_I(align[0], 16);
    ASSERT_EQ_I(align[2], 16);
    ASSERT_EQ_I(cw__cudnn_ptr_align((void *)(uintptr_t)0x1000), 16);
    ASSERT_EQ_I(cw__cudnn_ptr_align((void *)(uintptr_t)0x1006), 2);
    /* channels-last f16 views (C stride 1, W stride C): a patch moves by H stride = W * C
     * elements, 16-byte aligned for C = 8 although the C stride alone gives 2 bytes */
    int64_t nd[4] = {1, 8, 9, 7};
    ASSERT_OK(cw_tensor_desc_make(&x, CW_F16, 4, nd));
    wd[0] = wd[1] = 8;
    ASSERT_OK(cw_tensor_desc_make(&w, CW_F16, 4, wd));
    ASSERT_OK(cw__conv_validate(NULL, &x, &w, NULL, NULL, &cp, &y));
    const int64_t xs[4] = {9 * 7 * 8, 1, 7 * 8, 8}, ys[4] = {9 * 7 * 8, 1, 7 * 8, 8};
    memcpy(x.strides, xs, sizeof xs);
    memcpy(y.strides, ys, sizeof ys);
    cw__conv_problem_init(&p, &x, &w, 0, &y, &cp);
    cw__cudnn_layout_align(&p, align);
    ASSERT_EQ_I(align[0], 16);
    ASSERT_EQ_I(align[2], 16);
    /* an NCDHW f32 patch: the D stride counts too (odd H*W keeps 4 bytes) */
    cw_conv_params c3 = CW_CONV_PARAMS_INIT;
    c3.spatial = 3;
    int64_t x5[5] = {1, 2, 3, 5, 7}, w5[5] = {2, 2, 1, 1, 1};
    ASSERT_OK(cw_tensor_desc_make(&x, CW_F32, 5, x5));
    ASSERT_OK(cw_tensor_desc_make(&w, CW_F32, 5, w5));
    ASSERT_OK(cw__conv_validate(NULL, &x, &w, NULL, NULL, &c3, &y));
    cw__conv_problem_init(&p, &x, &w, 0, &y, &c3);
    cw__cudnn_layout_align(&p, align);
    ASSERT_EQ_I(align[0], 4);
}

/* The kernels' host-side index math: 32-bit division by multiply-high, rank-4 folding, the
 * GroupNorm chunk plan (many blocks per (n, g) where scratch allows, one without). */
static void check_kernel_math(void) {
    char msg[128] = "";
    int bad = cw__cu_selftest_host(msg, sizeof msg);
    if (bad) fprintf(stderr, "kernel host self-test: %s\n", msg);
    ASSERT_EQ_I(bad, 0);
    int64_t rpc = 0;
    /* the SD decoder's 512-channel 128^2 GroupNorm (32 groups): N*G = 32 blocks before, now */
    int ch = cw__cu_gn_chunks(1, 32, 16, 128, 128, CW__CU_GN_SCRATCH_PARTS, &rpc);
    fprintf(stderr, "gn_stats [1, 512, 128, 128] / 32 groups: %d chunks of %lld rows per group, %d blocks\n", ch,
            (long long)rpc, 32 * ch);
    ASSERT_TRUE(32 * ch >= 4 * 132); /* at least 4 blocks per H100 SM */
}

/* Bias fused into the graph (conv -> virtual f32 t -> pointwise add of b -> y) finalises for
 * f32 / f16 / bf16 and a 3-D case; under the H100 profile an f16 conv with a bias lists fused
 * configs, and their plans finalise; without a bias none are listed. */
static void check_fused_bias(cw__cudnn_conv *cc, cw_context *ctx) {
    for (int k = 0; k < 4; k++) {
        cw__conv_problem p;
        cw_tensor_desc x, w, y;
        cw_conv_params cp = CW_CONV_PARAMS_INIT;
        cw_dtype dt = k == 1 ? CW_F16 : k == 2 ? CW_BF16 : CW_F32;
        int64_t xd[5] = {1, 16, 4, 24, 24}, wd[5] = {32, 16, 3, 3, 3};
        int rank = k == 3 ? 5 : 4;
        if (rank == 4) xd[2] = 24, wd[2] = 3;
        cp.spatial = rank - 2;
        for (int d = 0; d < rank - 2; d++) cp.pad_pre[d] = cp.pad_post[d] = 1;
        ASSERT_OK(cw_tensor_desc_make(&x, dt, rank, xd));
        ASSERT_OK(cw_tensor_desc_make(&w, dt, rank, wd));
        ASSERT_OK(cw__conv_validate(NULL, &x, &w, NULL, NULL, &cp, &y));
        cw__conv_problem_init(&p, &x, &w, 1, &y, &cp);
        int64_t align[3];
        cw__cudnn_graph g;
        cw__cudnn_layout_align(&p, align);
        ASSERT_OK_CTX(ctx, cw__cudnn_graph_build(ctx, &p, align, NULL, 1, &g));
        ASSERT_TRUE(g.add != NULL && g.t != NULL && g.b != NULL);
        cw__cudnn_graph_destroy(&g);
        if (!cc || k != 1) continue;
        cw__conv_algo a[CW__CUDNN_MAX_CFGS];
        int n = 0, n_fused = 0;
        ASSERT_OK_CTX(ctx, cw__cudnn_conv_algos(cc, &p, a, CW__CUDNN_MAX_CFGS, &n));
        for (int i = 0; i < n; i++) n_fused += strstr(a[i].name, " fused") != NULL;
        fprintf(stderr, "f16 conv with bias: %d configs, %d bias-fused; first %s\n", n, n_fused, a[0].name);
        ASSERT_TRUE(n_fused >= 1 && strstr(a[0].name, " fused") != NULL); /* f16: a fused one first */
        for (int i = 0; i < n; i++) {
            if (!strstr(a[i].name, " fused")) continue;
            cw__cudnn_choice ch;
            ASSERT_OK_CTX(ctx, cw__cudnn_conv_plan(cc, &p, align, a[i].id, INT64_MAX, 1, 1, &ch));
            ASSERT_TRUE(ch.fused && ch.plan != NULL && ch.id == a[i].id && !ch.substituted);
            /* fused configs not allowed (a bias pointer not 16-byte aligned): an unfused substitute */
            ASSERT_OK_CTX(ctx, cw__cudnn_conv_plan(cc, &p, align, a[i].id, INT64_MAX, 1, 0, &ch));
            ASSERT_TRUE(!ch.fused && ch.substituted);
            break;
        }
        p.has_bias = 0;
        ASSERT_OK_CTX(ctx, cw__cudnn_conv_algos(cc, &p, a, CW__CUDNN_MAX_CFGS, &n));
        for (int i = 0; i < n; i++) ASSERT_TRUE(strstr(a[i].name, " fused") == NULL);
    }
}

/* TF32 is opt-in: an f32 3x3 conv lists tensor-core engines only with CW__CUDNN_TF32. */
static void check_tf32(cudnnBackendDescriptor_t devprop, cw_context *ctx) {
    cw__cudnn_conv *plain = NULL, *tf32 = NULL;
    ASSERT_OK_CTX(ctx, cw__cudnn_conv_create(&plain, ctx, NULL, devprop, 0));
    ASSERT_OK_CTX(ctx, cw__cudnn_conv_create(&tf32, ctx, NULL, devprop, CW__CUDNN_TF32));
    cw__conv_problem p;
    cw_tensor_desc x, w, y;
    cw_conv_params cp = CW_CONV_PARAMS_INIT;
    int64_t xd[4] = {1, 128, 64, 256}, wd[4] = {128, 128, 3, 3};
    cp.pad_pre[0] = cp.pad_pre[1] = cp.pad_post[0] = cp.pad_post[1] = 1;
    ASSERT_OK(cw_tensor_desc_make(&x, CW_F32, 4, xd));
    ASSERT_OK(cw_tensor_desc_make(&w, CW_F32, 4, wd));
    ASSERT_OK(cw__conv_validate(NULL, &x, &w, NULL, NULL, &cp, &y));
    cw__conv_problem_init(&p, &x, &w, 0, &y, &cp);
    cw__conv_algo a[CW__CUDNN_MAX_CFGS], b[CW__CUDNN_MAX_CFGS];
    int na = 0, nb = 0, extra = 0;
    ASSERT_OK_CTX(ctx, cw__cudnn_conv_algos(plain, &p, a, CW__CUDNN_MAX_CFGS, &na));
    ASSERT_OK_CTX(ctx, cw__cudnn_conv_algos(tf32, &p, b, CW__CUDNN_MAX_CFGS, &nb));
    for (int i = 0; i < nb; i++) {
        int found = 0;
        for (int j = 0; j < na; j++) found |= a[j].id == b[i].id;
        extra += !found;
    }
    fprintf(stderr, "f32 [1, 128, 64, 256] 3x3: %d configs without TF32 (first %s), %d with (first %s), %d new\n", na,
            a[0].name, nb, b[0].name, extra);
    ASSERT_TRUE(extra >= 1);
    cw__cudnn_conv_destroy(plain);
    cw__cudnn_conv_destroy(tf32);
}

/* Compile-time preparation: a listed id gets its plan now (counted as a plan, not late); an
 * id that is not listed is substituted by the first config that fits, and says so. */
static void check_prepare(cw__cudnn_conv *cc, cw_context *ctx) {
    cw__conv_problem full;
    cw__conv_algo a[CW__CUDNN_MAX_CFGS];
    cw__patch pt;
    cw__cudnn_choice ch;
    int n = 0;
    vae_conv(128, 256, &full);
    ASSERT_OK(cw__patch_make(&full, 0, 64, &pt)); /* the top band: its own padding */
    ASSERT_OK_CTX(ctx, cw__cudnn_conv_algos(cc, &pt.prob, a, CW__CUDNN_MAX_CFGS, &n));
    int64_t plans0, plans1, late = -1, subst = -1;
    cw__cudnn_conv_counters(cc, NULL, &plans0, NULL, NULL);
    ASSERT_OK_CTX(ctx, cw__cudnn_conv_prepare(cc, &pt.prob, a[n - 1].id, -1, &ch));
    ASSERT_TRUE(ch.plan != NULL && ch.id == a[n - 1].id && !ch.substituted);
    ASSERT_OK_CTX(ctx, cw__cudnn_conv_prepare(cc, &pt.prob, a[n - 1].id, -1, &ch)); /* cached */
    cw__cudnn_conv_counters(cc, NULL, &plans1, NULL, NULL);
    ASSERT_EQ_I(plans1 - plans0, 1);
    ASSERT_OK_CTX(ctx, cw__cudnn_conv_prepare(cc, &pt.prob, (1 << 22) | 1, a[0].workspace, &ch));
    ASSERT_TRUE(ch.plan != NULL && ch.substituted && ch.total_ws <= a[0].workspace);
    cw__cudnn_conv_late(cc, &late, &subst);
    ASSERT_EQ_I(late, 0); /* nothing ran: every plan was prepared */
    ASSERT_EQ_I(subst, 0);
}

int main(void) {
    pin_nvrtc();
    uint64_t seed = cw_test_seed(20240611);
    cw_rng rng = {seed};
    int n_cases = cw_test_quick() ? 40 : 150;
    int plan_cases = cw_test_quick() ? 3 : 12;

    /* A cpu context only collects the error messages of the calls under test. */
    cw_context_config cfg = CW_CONTEXT_CONFIG_INIT;
    cfg.backend = CW_BACKEND_CPU;
    cfg.log_level = CW_LOG_ERROR;
    cw_context *ctx = NULL;
    ASSERT_OK(cw_context_create(&ctx, &cfg));

    int dev_count = 0;
    cudaError_t ce = cudaGetDeviceCount(&dev_count);
    (void)cudaGetLastError();
    int have_device = ce == cudaSuccess && dev_count > 0;
    fprintf(stderr, "cuDNN %zu; cudaGetDeviceCount: %s, %d device(s)\n", cudnnGetVersion(), cudaGetErrorName(ce),
            dev_count);
    if (!have_device) {
        /* Finding: no handle without a device; everything below works without one. */
        cudnnHandle_t h = NULL;
        cudnnStatus_t hs = cudnnCreate(&h);
        fprintf(stderr, "cudnnCreate without a device: %s\n", cudnnGetErrorString(hs));
        ASSERT_TRUE(hs != CUDNN_STATUS_SUCCESS);
    }

    check_alignment();
    check_kernel_math();

    cudnnBackendDescriptor_t devprop = NULL;
    cw__cudnn_conv *cc = NULL;
    cw_status dst = cw__cudnn_devprop_from_json(ctx, h100_json, &devprop);
    if (dst == CW_OK) {
        ASSERT_OK_CTX(ctx, cw__cudnn_conv_create(&cc, ctx, NULL, devprop, 0));
    } else {
        fprintf(stderr, "NOTE: this cuDNN does not take the H100 device-properties profile (%s); heuristics and plans "
                        "are not checked here\n", cw_context_get_last_error(ctx));
        CHECK(CUDNN_VERSION < 90800); /* 9.8+ must accept it: the profile is what CI relies on */
    }

    int64_t max_patches_seen = 0;
    for (int t = 0; t < n_cases; t++) {
        conv_case c;
        random_case(&rng, &c);
        int p_count = (int)cw_rng_range(&rng, 1, c.h_out < 4 ? c.h_out : 4);
        int64_t bounds[5];
        cw__patch_bounds(c.h_out, p_count, bounds);
        for (int i = 0; i < p_count; i++) {
            cw__patch pt;
            ASSERT_OK(cw__patch_make(&c.full, bounds[i], bounds[i + 1], &pt));
            if (cw__patch_is_empty(&pt)) {
                /* lowered to a bias fill by the backend: no descriptors, but it lists the
                 * ids of a 1-row stand-in at zero workspace, like its neighbours' */
                g_empty++;
                ASSERT_TRUE(cw__cudnn_empty_input(&pt.prob));
                if (cc) {
                    cw__conv_algo a[CW__CUDNN_MAX_CFGS];
                    int na = 0;
                    ASSERT_OK_CTX(ctx, cw__cudnn_conv_algos(cc, &pt.prob, a, CW__CUDNN_MAX_CFGS, &na));
                    ASSERT_TRUE(na >= 1);
                    for (int j = 0; j < na; j++) ASSERT_EQ_I(a[j].workspace, 0);
                }
                continue;
            }
            check_patch(ctx, &pt.prob);
            if (cc) check_engines(cc, ctx, &pt.prob, t < plan_cases && i == 0);
        }
        if (p_count > max_patches_seen) max_patches_seen = p_count;
        /* a 5-D conv's frame bands (patches along D, every row): views starting at a frame,
         * D paddings of their own */
        const int64_t d_out = c.full.y.dims[CW__PATCH_DDIM];
        const int pd = d_out < 3 ? (int)d_out : 3;
        cw__patch_bounds(d_out, pd, bounds);
        for (int i = 0; c.full.spatial == 3 && i < pd; i++) {
            cw__patch pt;
            ASSERT_OK(cw__patch_make_ax(&c.full, CW__PATCH_DDIM, bounds[i], bounds[i + 1], &pt));
            if (cw__patch_is_empty(&pt)) {
                ASSERT_TRUE(cw__cudnn_empty_input(&pt.prob));
                continue;
            }
            g_d_bands++;
            check_patch(ctx, &pt.prob);
        }
    }

    if (cc) check_big_span(cc, ctx);
    check_fused_bias(cc, ctx);
    if (cc) check_tf32(devprop, ctx);
    if (cc) check_prepare(cc, ctx);

    /* A deliberately wrong problem through the engine list too: the error names cuDNN's reason. */
    if (cc) {
        conv_case c;
        random_case(&rng, &c);
        c.full.y.dims[c.full.spatial] += 2;
        cw__conv_algo a[4];
        int n = -1;
        ASSERT_EQ_I(cw__cudnn_conv_algos(cc, &c.full, a, 4, &n), CW_ERR_INVALID_ARG);
        ASSERT_EQ_I(n, 0);
        fprintf(stderr, "wrong shape message: %s\n", cw_context_get_last_error(ctx));
    }

    int64_t problems = 0, plans = 0, hits = 0, evicted = 0;
    if (cc) cw__cudnn_conv_counters(cc, &problems, &plans, &hits, &evicted);
    fprintf(stderr,
            "%d convs: %lld patch graphs finalised, %lld wrong shapes rejected, %lld empty patches; engine lists for "
            "%lld patches (%lld listed, %lld cache hits, %lld plan-less lists evicted), %lld plans finalised (H100 "
            "profile)\n",
            n_cases, (long long)g_graphs, (long long)g_rejected, (long long)g_empty, (long long)g_algo_problems,
            (long long)problems, (long long)hits, (long long)evicted, (long long)plans);
    /* more than 128 plan-less lists were made: the oldest went */
    if (cc && problems - plans > 140) ASSERT_TRUE(evicted > 0);
    ASSERT_TRUE(g_graphs >= n_cases);
    fprintf(stderr, "%lld frame bands (patches along D) of 3-D convs checked\n", (long long)g_d_bands);
    ASSERT_TRUE(g_d_bands > 0);
    if (cc) ASSERT_TRUE(g_plans >= plan_cases);
    cw__cudnn_conv_destroy(cc);
    if (devprop) cudnnBackendDestroyDescriptor(devprop);
    cw_context_destroy(ctx);
    TEST_DONE();
}
#endif
