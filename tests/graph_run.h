/* Helpers of the graph-op tests (test_graph_scale, test_graph_avg_pool): tensors uploaded
 * from f32 host values in any dtype, constants, and a graph compiled unscheduled or patched
 * on 3 streams, run, and each output checked against a double-precision reference. */
#ifndef CW_TEST_GRAPH_RUN_H
#define CW_TEST_GRAPH_RUN_H

#include <stdio.h>
#include <stdlib.h>

#include "conv_ref.h"
#include "convweave/convweave.h"
#include "core/core.h"
#include "testutil.h"

/* n values o + s * u, u uniform from r. */
static inline float *rnd(cw_rng *r, int64_t n, float s, float o) {
    float *v = malloc((size_t)n * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = o + s * cw_rng_float(r);
    return v;
}

/* A tensor of dtype dt holding h (f32 host values, converted on upload); NULL h: no upload. */
static inline cw_tensor *upload(cw_context *ctx, cw_dtype dt, int rank, const int64_t *dims, const float *h) {
    cw_tensor_desc d;
    ASSERT_OK(cw_tensor_desc_make(&d, dt, rank, dims));
    cw_tensor *t;
    ASSERT_OK_CTX(ctx, cw_tensor_create(&t, ctx, &d));
    if (!h) return t;
    const int64_t n = cw_tensor_desc_numel(&d);
    const size_t bytes = (size_t)n * cw_dtype_size(dt);
    void *buf = malloc(bytes);
    ASSERT_OK(cw_dtype_convert(buf, dt, h, CW_F32, n));
    ASSERT_OK_CTX(ctx, cw_tensor_upload(t, buf, bytes));
    free(buf);
    return t;
}

static inline cw_node constant(cw_context *ctx, cw_graph *g, cw_tensor *t) {
    cw_node n;
    ASSERT_OK_CTX(ctx, cw_graph_constant(g, &n, "c", t));
    return n;
}

/* Compiles g (policy, 3 streams when patched), runs it on `in`, checks each output's
 * relative error against ref[o] within bound[o]. */
static inline void run_and_check(cw_context *ctx, cw_graph *g, cw_patch_policy policy, cw_tensor *in, int n_out,
                          const cw_tensor_desc *od, double *const *ref, const double *bound) {
    cw_compile_options opt = CW_COMPILE_OPTIONS_INIT;
    opt.policy = policy;
    opt.patches = 3;
    opt.streams = policy == CW_PATCHES_NONE ? 1 : 3;
    cw_plan *p;
    ASSERT_OK_CTX(ctx, cw_graph_compile(g, &p, &opt));
    cw_tensor *outs[2];
    for (int o = 0; o < n_out; o++) outs[o] = upload(ctx, od[o].dtype, od[o].rank, od[o].dims, NULL);
    ASSERT_OK_CTX(ctx, cw_plan_run(p, &in, 1, outs, n_out));
    for (int o = 0; o < n_out; o++) {
        const int64_t n = cw_tensor_desc_numel(&od[o]);
        const size_t es = cw_dtype_size(od[o].dtype);
        void *raw = malloc((size_t)n * es);
        float *y = malloc((size_t)n * 4);
        ASSERT_OK_CTX(ctx, cw_tensor_download(outs[o], raw, (size_t)n * es));
        ASSERT_OK(cw_dtype_convert(y, CW_F32, raw, od[o].dtype, n));
        cw_tensor_desc fd = od[o];
        fd.dtype = CW_F32;
        double err = cw_ref_rel_err(&fd, y, ref[o]);
        if (!(err <= bound[o]))
            fprintf(stderr, "%s policy %d output %d: relative error %g > bound %g\n", cw__dtype_name(od[o].dtype),
                    (int)policy, o, err, bound[o]);
        CHECK(err <= bound[o]);
        free(raw), free(y);
        cw_tensor_destroy(outs[o]);
    }
    cw_plan_destroy(p);
}

/* A cpu context with chaos (seed 7) and poison: the graph-op tests' scheduling stress. */
static inline cw_context *chaos_context(void) {
    cw_context_config cfg = CW_CONTEXT_CONFIG_INIT;
    cfg.backend = CW_BACKEND_CPU;
    cfg.flags = CW_FLAG_CHAOS | CW_FLAG_POISON;
    cfg.chaos_seed = 7;
    cw_context *ctx;
    ASSERT_OK(cw_context_create(&ctx, &cfg));
    return ctx;
}

#endif
