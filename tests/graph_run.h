/* The harness of the graph-op tests (test_graph_*.c): tensors uploaded from f32 host values
 * in any dtype, a graph run unscheduled and patched on 3 streams with chaos and poison and
 * each output checked against a double-precision reference, the conv -> op -> conv fixture
 * and GroupNorm + SiLU tail the ops run in, and a cpu backend for an op's cw__op_run contract.
 * A test file keeps its op's reference math, shapes, bounds and argument errors. */
#ifndef CW_TEST_GRAPH_RUN_H
#define CW_TEST_GRAPH_RUN_H

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "conv_ref.h"
#include "convweave/convweave.h"
#include "core/core.h"
#include "core/half.h"
#include "kernels/kernels.h"
#include "testutil.h"

/* The last error of ctx names msg (a substring); on failure prints both. */
#define CHECK_LAST_ERROR(ctx, msg)                                                                       \
    do {                                                                                                 \
        const char *cw_e_ = cw_context_get_last_error(ctx);                                              \
        if (strstr(cw_e_, (msg)) == NULL) {                                                              \
            fprintf(stderr, "%s:%d: last error \"%s\" lacks \"%s\"\n", __FILE__, __LINE__, cw_e_, (msg)); \
            cw_test_failures++;                                                                          \
        }                                                                                                \
    } while (0)

/* call is refused with CW_ERR_INVALID_ARG and ctx's last error names msg. */
#define CHECK_REFUSED(ctx, call, msg)                 \
    do {                                              \
        ASSERT_STATUS((call), CW_ERR_INVALID_ARG);    \
        CHECK_LAST_ERROR((ctx), (msg));               \
    } while (0)

/* v as stored in dtype dt (rounded once). */
static inline float rd(float v, cw_dtype dt) {
    if (dt == CW_F16) return cw__f16_to_f32(cw__f32_to_f16(v));
    if (dt == CW_BF16) return cw__bf16_to_f32(cw__f32_to_bf16(v));
    return v;
}

/* x's values as stored in dtype dt, written back into x as floats. */
static inline void round_to(float *x, int64_t n, cw_dtype dt) {
    for (int64_t i = 0; i < n; i++) x[i] = rd(x[i], dt);
}

/* The unit roundoff of dt: 2^-11 f16, 2^-8 bf16, 2^-24 f32. */
static inline double unit_roundoff(cw_dtype dt) {
    return dt == CW_F16 ? ldexp(1.0, -11) : dt == CW_BF16 ? ldexp(1.0, -8) : FLT_EPSILON / 2;
}

static inline int64_t numel(int rank, const int64_t *dims) {
    int64_t n = 1;
    for (int i = 0; i < rank; i++) n *= dims[i];
    return n;
}

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

/* Values o + s * u for a tensor of dims, as stored in dt (rounded), uploaded to *t in dt. */
static inline float *rnd_stored(cw_context *ctx, cw_rng *r, cw_dtype dt, int rank, const int64_t *dims, float s, float o,
                                cw_tensor **t) {
    const int64_t n = numel(rank, dims);
    float *v = rnd(r, n, s, o);
    round_to(v, n, dt);
    *t = upload(ctx, dt, rank, dims, v);
    return v;
}

/* An input of g named name, of dtype dt and dims. */
static inline cw_node input(cw_context *ctx, cw_graph *g, const char *name, cw_dtype dt, int rank, const int64_t *dims) {
    cw_tensor_desc d;
    ASSERT_OK(cw_tensor_desc_make(&d, dt, rank, dims));
    cw_node n;
    ASSERT_OK_CTX(ctx, cw_graph_input(g, &n, name, &d));
    return n;
}

/* A graph on ctx with one input "x" (*x) of dtype dt and dims. */
static inline cw_graph *graph_open(cw_context *ctx, cw_dtype dt, int rank, const int64_t *dims, cw_node *x) {
    cw_graph *g;
    ASSERT_OK_CTX(ctx, cw_graph_create(&g, ctx));
    *x = input(ctx, g, "x", dt, rank, dims);
    return g;
}

/* Downloads output o of a run (desc od) and checks its relative error against ref within
 * bound (the log names policy and o). */
static inline void check_output(cw_context *ctx, cw_tensor *t, const cw_tensor_desc *od, const double *ref,
                                double bound, int policy, int o) {
    const int64_t n = cw_tensor_desc_numel(od);
    const size_t es = cw_dtype_size(od->dtype);
    void *raw = malloc((size_t)n * es);
    float *y = malloc((size_t)n * 4);
    ASSERT_OK_CTX(ctx, cw_tensor_download(t, raw, (size_t)n * es));
    ASSERT_OK(cw_dtype_convert(y, CW_F32, raw, od->dtype, n));
    cw_tensor_desc fd = *od;
    fd.dtype = CW_F32;
    double err = cw_ref_rel_err(&fd, y, ref);
    if (!(err <= bound))
        fprintf(stderr, "%s policy %d output %d: relative error %g > bound %g\n", cw__dtype_name(od->dtype), policy, o,
                err, bound);
    CHECK(err <= bound);
    free(raw), free(y);
}

/* g compiled under policy: unscheduled on one stream, or `patches` patches on 3 streams. */
static inline cw_plan *compile_policy(cw_context *ctx, cw_graph *g, cw_patch_policy policy, int patches) {
    cw_compile_options opt = CW_COMPILE_OPTIONS_INIT;
    opt.policy = policy;
    opt.patches = patches;
    opt.streams = policy == CW_PATCHES_NONE ? 1 : 3;
    cw_plan *p;
    ASSERT_OK_CTX(ctx, cw_graph_compile(g, &p, &opt));
    return p;
}

/* Compiles g (policy, 3 streams when patched), runs it on `in`, checks each output's
 * relative error against ref[o] within bound[o]. */
static inline void run_and_check(cw_context *ctx, cw_graph *g, cw_patch_policy policy, cw_tensor *in, int n_out,
                          const cw_tensor_desc *od, double *const *ref, const double *bound) {
    cw_plan *p = compile_policy(ctx, g, policy, 3);
    cw_tensor *outs[2];
    for (int o = 0; o < n_out; o++) outs[o] = upload(ctx, od[o].dtype, od[o].rank, od[o].dims, NULL);
    ASSERT_OK_CTX(ctx, cw_plan_run(p, &in, 1, outs, n_out));
    for (int o = 0; o < n_out; o++) {
        check_output(ctx, outs[o], &od[o], ref[o], bound[o], (int)policy, o);
        cw_tensor_destroy(outs[o]);
    }
    cw_plan_destroy(p);
}

/* Runs g twice on `in` (the second run reuses the arena's stale contents), compiled as
 * compile_policy does with 4 patches, checks its n_out outputs (each of desc od) against
 * ref[o] within bound, and returns the plan's live activation peak
 * (cw_plan_stats.activations_live_peak). */
static inline int64_t run_twice_live_peak(cw_context *ctx, cw_graph *g, cw_tensor *in, cw_patch_policy policy,
                                          int n_out, const cw_tensor_desc *od, double *const *ref, double bound) {
    cw_plan *p = compile_policy(ctx, g, policy, 4);
    cw_tensor *out[2];
    for (int o = 0; o < n_out; o++) out[o] = upload(ctx, od->dtype, od->rank, od->dims, NULL);
    for (int rep = 0; rep < 2; rep++) {
        ASSERT_OK_CTX(ctx, cw_plan_run(p, &in, 1, out, n_out));
        for (int o = 0; o < n_out; o++) check_output(ctx, out[o], od, ref[o], bound, (int)policy, o);
    }
    cw_plan_stats st;
    ASSERT_OK_CTX(ctx, cw_plan_get_stats(p, &st));
    for (int o = 0; o < n_out; o++) cw_tensor_destroy(out[o]);
    cw_plan_destroy(p);
    return st.activations_live_peak;
}

/* Runs g on `in` unscheduled and patched on 3 streams (run_and_check each: output o against
 * ref[o] within bound[o]), then destroys g. */
static inline void run_graph(cw_context *ctx, cw_graph *g, cw_tensor *in, int n_out, const cw_tensor_desc *od,
                             double *const *ref, const double *bound) {
    run_and_check(ctx, g, CW_PATCHES_NONE, in, n_out, od, ref, bound);
    run_and_check(ctx, g, CW_PATCHES_FIXED, in, n_out, od, ref, bound);
    cw_graph_destroy(g);
}

/* Marks y[o] as g's outputs (each node's desc must be od[o]), runs g on `in` unscheduled and
 * patched on 3 streams, checks output o against ref[o] within bound[o], and destroys g. */
static inline void check_graph(cw_context *ctx, cw_graph *g, cw_tensor *in, int n_out, const cw_node *y,
                               const cw_tensor_desc *od, double *const *ref, const double *bound) {
    static const char *const names[2] = {"y0", "y1"};
    ASSERT_TRUE(n_out >= 1 && n_out <= 2);
    for (int o = 0; o < n_out; o++) {
        ASSERT_OK_CTX(ctx, cw_graph_output(g, y[o], names[o]));
        cw_tensor_desc got;
        ASSERT_OK_CTX(ctx, cw_graph_get_node_desc(g, &got, y[o]));
        CHECK(got.rank == od[o].rank && got.dtype == od[o].dtype &&
              memcmp(got.dims, od[o].dims, (size_t)got.rank * sizeof got.dims[0]) == 0);
    }
    run_graph(ctx, g, in, n_out, od, ref, bound);
}

/* conv -> op -> conv, the fixture each generic op is tested in: x [N, c, ...] drawn from r
 * (offset xo), conv1's weights [k, c, 3, ...], conv2's [k, k, 3, ...] and the bias [k] (padding
 * 1), all stored in dt; conv1 in double from the stored values (c1, desc c1d, f32); and a
 * graph x (in) -> conv1 (h) that the test extends with its op, then ends with sandwich_close. */
typedef struct {
    cw_context *ctx;
    cw_dtype dt;
    int rank;
    int64_t c, k, kvol; /* x's channels, the convs' outputs, a kernel's taps */
    float *x, *w1, *w2, *bias;
    cw_tensor *tx, *tw1, *tw2, *tb;
    cw_conv_params cp;
    cw_tensor_desc xd, c1d; /* f32 */
    double *c1;
    cw_graph *g;
    cw_node in, h;
} sandwich;

static inline void sandwich_open(sandwich *s, cw_context *ctx, cw_rng *r, cw_dtype dt, int rank, const int64_t *xdims,
                                 int64_t k, float xo) {
    memset(s, 0, sizeof *s);
    s->ctx = ctx, s->dt = dt, s->rank = rank, s->c = xdims[1], s->k = k, s->kvol = 1;
    int64_t w1dims[5] = {k, xdims[1]}, w2dims[5] = {k, k};
    const cw_conv_params cp = CW_CONV_PARAMS_INIT;
    s->cp = cp;
    s->cp.spatial = rank - 2;
    for (int i = 2; i < rank; i++) {
        w1dims[i] = w2dims[i] = 3, s->kvol *= 3;
        s->cp.pad_pre[i - 2] = s->cp.pad_post[i - 2] = 1;
    }
    s->x = rnd_stored(ctx, r, dt, rank, xdims, 1.0f, xo, &s->tx);
    s->w1 = rnd_stored(ctx, r, dt, rank, w1dims, 0.3f, 0.0f, &s->tw1);
    s->w2 = rnd_stored(ctx, r, dt, rank, w2dims, 0.3f, 0.0f, &s->tw2);
    s->bias = rnd_stored(ctx, r, dt, 1, &k, 0.1f, 0.0f, &s->tb);
    cw_tensor_desc w1d;
    ASSERT_OK(cw_tensor_desc_make(&s->xd, CW_F32, rank, xdims));
    ASSERT_OK(cw_tensor_desc_make(&w1d, CW_F32, rank, w1dims));
    ASSERT_OK_CTX(ctx, cw_conv_output_desc(ctx, &s->c1d, &s->xd, &w1d, &s->cp));
    s->c1 = malloc((size_t)cw_tensor_desc_numel(&s->c1d) * sizeof *s->c1);
    cw_ref_conv(&s->xd, s->x, &w1d, s->w1, s->bias, &s->cp, &s->c1d, s->c1);
    s->g = graph_open(ctx, dt, rank, xdims, &s->in);
    const cw_node w1 = constant(ctx, s->g, s->tw1), b = constant(ctx, s->g, s->tb);
    ASSERT_OK_CTX(ctx, cw_graph_conv(s->g, &s->h, s->in, w1, b, &s->cp));
}

/* Ends the fixture: y1 = conv2(y0); checks y0 (y0dims, in dt) against ref0 and y1 against
 * conv2 in double of ref0 as floats, within bound[0] and bound[1] (label names the op in the
 * log); frees what sandwich_open made. */
static inline void sandwich_close(sandwich *s, cw_node y0, const int64_t *y0dims, double *ref0,
                                  const double bound[2], const char *label) {
    cw_context *ctx = s->ctx;
    const int rank = s->rank;
    int64_t w2dims[5] = {s->k, s->k, 3, 3, 3};
    cw_tensor_desc y0d, w2d, y1d, yd[2];
    ASSERT_OK(cw_tensor_desc_make(&y0d, CW_F32, rank, y0dims));
    ASSERT_OK(cw_tensor_desc_make(&w2d, CW_F32, rank, w2dims));
    ASSERT_OK_CTX(ctx, cw_conv_output_desc(ctx, &y1d, &y0d, &w2d, &s->cp));
    const int64_t n0 = cw_tensor_desc_numel(&y0d);
    float *yf = malloc((size_t)n0 * sizeof *yf);
    double *ref1 = malloc((size_t)cw_tensor_desc_numel(&y1d) * sizeof *ref1);
    for (int64_t i = 0; i < n0; i++) yf[i] = (float)ref0[i];
    cw_ref_conv(&y0d, yf, &w2d, s->w2, s->bias, &s->cp, &y1d, ref1);
    cw_node y[2] = {y0, CW_NODE_NONE};
    ASSERT_OK_CTX(ctx, cw_graph_conv(s->g, &y[1], y0, constant(ctx, s->g, s->tw2), constant(ctx, s->g, s->tb), &s->cp));
    ASSERT_OK(cw_tensor_desc_make(&yd[0], s->dt, rank, y0dims));
    ASSERT_OK(cw_tensor_desc_make(&yd[1], s->dt, rank, y1d.dims));
    double *refs[2] = {ref0, ref1};
    fprintf(stderr, "conv -> %s -> conv, %d-D, %s\n", label, rank, cw__dtype_name(s->dt));
    check_graph(ctx, s->g, s->tx, 2, y, yd, refs, bound);
    cw_tensor_destroy(s->tx), cw_tensor_destroy(s->tw1), cw_tensor_destroy(s->tw2), cw_tensor_destroy(s->tb);
    free(s->x), free(s->w1), free(s->w2), free(s->bias), free(s->c1), free(yf), free(ref1);
}

/* GroupNorm (groups, eps 1e-6) then SiLU over c channels, gamma and beta f32 constants drawn
 * from r: the tail that takes its statistics from the op's task. */
typedef struct {
    int64_t c, groups;
    float *gm, *bt;
    cw_tensor *tg, *tb;
} gn_silu;

static inline void gn_silu_open(gn_silu *t, cw_context *ctx, cw_rng *r, int64_t c, int64_t groups) {
    t->c = c, t->groups = groups;
    t->gm = rnd_stored(ctx, r, CW_F32, 1, &c, 0.2f, 1.0f, &t->tg);
    t->bt = rnd_stored(ctx, r, CW_F32, 1, &c, 0.2f, 0.0f, &t->tb);
}

/* silu(group_norm(x)) in g. */
static inline cw_node gn_silu_node(const gn_silu *t, cw_context *ctx, cw_graph *g, cw_node x) {
    cw_node y;
    const cw_node gm = constant(ctx, g, t->tg), bt = constant(ctx, g, t->tb);
    ASSERT_OK_CTX(ctx, cw_graph_group_norm(g, &y, x, gm, bt, t->groups, 1e-6f));
    ASSERT_OK_CTX(ctx, cw_graph_silu(g, &y, y));
    return y;
}

/* y = silu(group_norm(x)) in double; x: [c, per] (one sample). */
static inline void gn_silu_ref(const gn_silu *t, const double *x, int64_t per, double *y) {
    const int64_t cg = t->c / t->groups;
    for (int64_t gi = 0; gi < t->groups; gi++) {
        double m = 0, q = 0;
        const int64_t e0 = gi * cg * per, e1 = (gi + 1) * cg * per;
        for (int64_t e = e0; e < e1; e++) m += x[e];
        m /= (double)(e1 - e0);
        for (int64_t e = e0; e < e1; e++) q += (x[e] - m) * (x[e] - m);
        const double rs = 1.0 / sqrt(q / (double)(e1 - e0) + 1e-6);
        for (int64_t e = e0; e < e1; e++) {
            const double v = (x[e] - m) * rs * t->gm[e / per] + t->bt[e / per];
            y[e] = v / (1.0 + exp(-v));
        }
    }
}

static inline void gn_silu_close(gn_silu *t) {
    cw_tensor_destroy(t->tg), cw_tensor_destroy(t->tb);
    free(t->gm), free(t->bt);
}

/* Ends a test of y0 = op(x) (one sample, y0dims in dt, reference ref0) feeding the tail:
 * checks y0 against ref0 and y1 = silu(group_norm(y0)) against the tail in double of ref0,
 * within bound[0] and bound[1] (check_graph, which destroys g); closes t. */
static inline void gn_silu_finish(gn_silu *t, cw_context *ctx, cw_graph *g, cw_tensor *in, cw_node y0, cw_dtype dt,
                                  const int64_t y0dims[5], double *ref0, const double bound[2]) {
    cw_tensor_desc yd[2];
    ASSERT_OK(cw_tensor_desc_make(&yd[0], dt, 5, y0dims));
    yd[1] = yd[0];
    const int64_t n = cw_tensor_desc_numel(&yd[0]);
    double *ref1 = malloc((size_t)n * sizeof *ref1);
    gn_silu_ref(t, ref0, n / t->c, ref1);
    const cw_node y[2] = {y0, gn_silu_node(t, ctx, g, y0)};
    double *refs[2] = {ref0, ref1};
    check_graph(ctx, g, in, 2, y, yd, refs, bound);
    gn_silu_close(t);
    free(ref1);
}

/* A cpu backend and a stream on a plain context, to call cw__op_run on directly: the op's
 * contract in front of the backends. */
typedef struct {
    cw_context *ctx;
    cw__backend *be;
    cw__stream *s;
} op_rig;

static inline void op_rig_open(op_rig *k) {
    cw_context_config cfg = CW_CONTEXT_CONFIG_INIT;
    ASSERT_OK(cw_context_create(&k->ctx, &cfg));
    k->be = NULL, k->s = NULL;
    ASSERT_OK(cw__backend_cpu_create(k->ctx, &cfg, &k->be));
    ASSERT_OK(k->be->rt->stream_create(k->be, &k->s));
}

static inline void op_rig_close(op_rig *k) {
    k->be->rt->stream_destroy(k->be, k->s);
    k->be->rt->destroy(k->be);
    cw_context_destroy(k->ctx);
}

/* Runs the op a on k's stream and waits for it. */
#define OP_RUN(k, a)                                                    \
    do {                                                                \
        ASSERT_OK(cw__op_run((k)->be, (k)->s, (a)));                    \
        ASSERT_OK((k)->be->rt->stream_synchronize((k)->be, (k)->s));    \
    } while (0)

/* cw__op_run refuses a with CW_ERR_INVALID_ARG, the message naming msg. */
#define OP_REFUSED(k, a, msg) CHECK_REFUSED((k)->ctx, cw__op_run((k)->be, (k)->s, (a)), msg)

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
