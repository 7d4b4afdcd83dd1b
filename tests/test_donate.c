/* cw_graph_donate: an input's storage taken by an output. The graph is a streamed video
 * VAE's causal conv step: h = conv(x); the new cache, frames [2, 4) of h, is made before the
 * conv that reads the old cache (cat(cache, h) along T, then a conv without padding in T), as
 * diffusers' Wan orders it. Against a double-precision reference, unscheduled, patched on 3
 * streams and under a small budget, with chaos and poison: the plan honours the donation, a
 * run with the cache tensor passed as the new cache's output gives the same bits as one with
 * separate tensors, and the cache then holds the new one. Donations a plan cannot order are
 * dropped (cw_plan_get_donor -1) and a shared tensor is then refused. An input donated to no
 * output gives its pages back after its last reader (and not while another input shares
 * them). The builder's argument checks. */
#include <float.h>
#include <math.h>
#include <string.h>
#include <sys/mman.h>

#include "conv_ref.h"
#include "convweave/convweave.h"
#include "graph_run.h"
#include "testutil.h"

enum { C = 3, T = 4, HH = 6, WW = 5, TC = 2 };

typedef struct {
    float *x, *cache, *w0, *w1;
    cw_tensor *tx, *tw0, *tw1;
    cw_tensor_desc xd, cd, w0d, w1d, hd, catd, yd;
    cw_conv_params p0, p1;
    double *yref, *nref, *zref; /* y, the new cache and conv(cache) */
} step;

static void step_open(step *s, cw_context *ctx, cw_rng *r) {
    memset(s, 0, sizeof *s);
    const int64_t xdims[5] = {1, C, T, HH, WW}, cdims[5] = {1, C, TC, HH, WW}, wdims[5] = {C, C, 3, 3, 3};
    const int64_t catdims[5] = {1, C, T + TC, HH, WW};
    s->x = rnd(r, C * T * HH * WW, 2.0f, -1.0f);
    s->cache = rnd(r, C * TC * HH * WW, 2.0f, -1.0f);
    s->w0 = rnd(r, C * C * 27, 0.4f, -0.2f), s->w1 = rnd(r, C * C * 27, 0.4f, -0.2f);
    s->tx = upload(ctx, CW_F32, 5, xdims, s->x);
    s->tw0 = upload(ctx, CW_F32, 5, wdims, s->w0), s->tw1 = upload(ctx, CW_F32, 5, wdims, s->w1);
    cw_conv_params cp = CW_CONV_PARAMS_INIT;
    cp.spatial = 3;
    for (int d = 0; d < 3; d++) cp.pad_pre[d] = cp.pad_post[d] = 1;
    s->p0 = s->p1 = cp;
    s->p1.pad_pre[0] = s->p1.pad_post[0] = 0; /* causal: the cache's frames are the padding */
    ASSERT_OK(cw_tensor_desc_make(&s->xd, CW_F32, 5, xdims));
    ASSERT_OK(cw_tensor_desc_make(&s->cd, CW_F32, 5, cdims));
    ASSERT_OK(cw_tensor_desc_make(&s->w0d, CW_F32, 5, wdims));
    ASSERT_OK(cw_tensor_desc_make(&s->w1d, CW_F32, 5, wdims));
    ASSERT_OK(cw_tensor_desc_make(&s->catd, CW_F32, 5, catdims));
    s->hd = s->xd;
    ASSERT_OK_CTX(ctx, cw_conv_output_desc(ctx, &s->yd, &s->catd, &s->w1d, &s->p1));
    CHECK(s->yd.dims[2] == T);
    /* the reference: h in double, stored as float; cat = (cache, h) per channel; y = conv(cat) */
    const int64_t sp = HH * WW, nh = C * T * sp;
    double *h = malloc((size_t)nh * sizeof *h);
    float *cat = malloc((size_t)C * (T + TC) * sp * sizeof *cat);
    cw_ref_conv(&s->xd, s->x, &s->w0d, s->w0, NULL, &s->p0, &s->hd, h);
    s->nref = malloc((size_t)C * TC * sp * sizeof *s->nref);
    for (int64_t c = 0; c < C; c++) {
        for (int64_t i = 0; i < TC * sp; i++) {
            cat[c * (T + TC) * sp + i] = s->cache[c * TC * sp + i];
            s->nref[c * TC * sp + i] = h[c * T * sp + (T - TC) * sp + i];
        }
        for (int64_t i = 0; i < T * sp; i++) cat[c * (T + TC) * sp + TC * sp + i] = (float)h[c * T * sp + i];
    }
    s->yref = malloc((size_t)cw_tensor_desc_numel(&s->yd) * sizeof *s->yref);
    cw_ref_conv(&s->catd, cat, &s->w1d, s->w1, NULL, &s->p1, &s->yd, s->yref);
    s->zref = malloc((size_t)C * TC * sp * sizeof *s->zref);
    cw_ref_conv(&s->cd, s->cache, &s->w0d, s->w0, NULL, &s->p0, &s->cd, s->zref);
    free(h), free(cat);
}

static void step_close(step *s) {
    cw_tensor_destroy(s->tx), cw_tensor_destroy(s->tw0), cw_tensor_destroy(s->tw1);
    free(s->x), free(s->cache), free(s->w0), free(s->w1), free(s->yref), free(s->nref), free(s->zref);
}

/* The step's graph: inputs x (0) and cache (1); outputs y (0) and the new cache (1), made
 * before the cat that reads the old one. new_from: 0 frames of h (the Wan order); 1 the
 * cache doubled (reads the cache itself: not donatable); 2 frames of h also read by a
 * conv whose result is output 2 (the new cache has a reader); 3 as 0, and output 2 a conv
 * of the cache itself, made after the new cache: its patches read the cache on the heavy
 * streams while the light stream makes the new cache, so only the donation's waits order
 * them. */
static cw_graph *step_graph(const step *s, cw_context *ctx, int new_from) {
    cw_graph *g;
    ASSERT_OK_CTX(ctx, cw_graph_create(&g, ctx));
    cw_node x = input(ctx, g, "x", CW_F32, 5, s->xd.dims), c = input(ctx, g, "cache", CW_F32, 5, s->cd.dims);
    cw_node h, nc, cat, y, z;
    ASSERT_OK_CTX(ctx, cw_graph_conv(g, &h, x, constant(ctx, g, s->tw0), CW_NODE_NONE, &s->p0));
    if (new_from == 1) ASSERT_OK_CTX(ctx, cw_graph_unary(g, &nc, c, CW_UNARY_AFFINE, 2.0f, 0.0f));
    else ASSERT_OK_CTX(ctx, cw_graph_slice(g, &nc, h, 2, T - TC, TC));
    ASSERT_OK_CTX(ctx, cw_graph_concat(g, &cat, c, h, 2));
    ASSERT_OK_CTX(ctx, cw_graph_conv(g, &y, cat, constant(ctx, g, s->tw1), CW_NODE_NONE, &s->p1));
    ASSERT_OK_CTX(ctx, cw_graph_output(g, y, "y"));
    ASSERT_OK_CTX(ctx, cw_graph_output(g, nc, "new cache"));
    if (new_from >= 2) {
        cw_node zx = new_from == 2 ? nc : c;
        ASSERT_OK_CTX(ctx, cw_graph_conv(g, &z, zx, constant(ctx, g, s->tw0), CW_NODE_NONE, &s->p0));
        ASSERT_OK_CTX(ctx, cw_graph_output(g, z, "z"));
    }
    ASSERT_OK_CTX(ctx, cw_graph_donate(g, 1, 1));
    return g;
}

static float *download(cw_context *ctx, cw_tensor *t) {
    const int64_t n = cw_tensor_desc_numel(cw_tensor_get_desc(t));
    float *v = malloc((size_t)n * sizeof *v);
    ASSERT_OK_CTX(ctx, cw_tensor_download(t, v, n * 4));
    return v;
}

/* Compiles the Wan-ordered step under opt and runs it twice: with separate tensors, then
 * with the cache tensor as the new cache's output. Both against the reference; the same bits. */
static void test_honoured(cw_context *ctx, const step *s, int variant, cw_patch_policy policy, int streams,
                          int64_t budget) {
    cw_graph *g = step_graph(s, ctx, variant);
    cw_compile_options opt = CW_COMPILE_OPTIONS_INIT;
    opt.policy = policy, opt.patches = 3, opt.streams = streams, opt.temp_budget = budget;
    cw_plan *p;
    ASSERT_OK_CTX(ctx, cw_graph_compile(g, &p, &opt));
    int donor = -2;
    ASSERT_OK_CTX(ctx, cw_plan_get_donor(p, 1, &donor));
    CHECK(donor == 1);
    ASSERT_OK_CTX(ctx, cw_plan_get_donor(p, 0, &donor));
    CHECK(donor == -1);
    char *text = NULL, *js = NULL;
    ASSERT_OK_CTX(ctx, cw_plan_describe(p, &text, 0));
    ASSERT_OK_CTX(ctx, cw_plan_describe(p, &js, 1));
    CHECK(strstr(text, "output 1 ('new cache') in the tensor of input 1 ('cache'), donated") != NULL);
    CHECK(strstr(js, "\"donations\":[[1,1]]") != NULL && strstr(js, "\"discarded\":[]") != NULL);
    cw_free(text), cw_free(js);
    fprintf(stderr, "donated cache, graph %d, policy %d, %d stream(s), budget %lld\n", variant, (int)policy, streams,
            (long long)budget);
    const int64_t ny = cw_tensor_desc_numel(&s->yd), nn = cw_tensor_desc_numel(&s->cd);
    const double bound = 16.0 * (C * 27 * 2 + 8) * FLT_EPSILON;
    const int n_out = variant == 3 ? 3 : 2;
    float *got[2][3] = {{NULL}};
    for (int shared = 0; shared < 2; shared++) {
        cw_tensor *tc = upload(ctx, CW_F32, 5, s->cd.dims, s->cache), *ty = upload(ctx, CW_F32, 5, s->yd.dims, NULL);
        cw_tensor *tn = shared ? tc : upload(ctx, CW_F32, 5, s->cd.dims, NULL);
        cw_tensor *tz = upload(ctx, CW_F32, 5, s->cd.dims, NULL);
        cw_tensor *ins[2] = {s->tx, tc}, *outs[3] = {ty, tn, tz};
        ASSERT_OK_CTX(ctx, cw_plan_run(p, ins, 2, outs, n_out));
        got[shared][0] = download(ctx, ty), got[shared][1] = download(ctx, tn), got[shared][2] = download(ctx, tz);
        double ey = cw_ref_rel_err(&s->yd, got[shared][0], s->yref);
        double en = cw_ref_rel_err(&s->cd, got[shared][1], s->nref);
        double ez = n_out == 3 ? cw_ref_rel_err(&s->cd, got[shared][2], s->zref) : 0.0;
        if (!(ey <= bound) || !(en <= bound) || !(ez <= bound))
            fprintf(stderr, "  shared %d: y error %g, new cache error %g, z error %g (bound %g)\n", shared, ey, en, ez,
                    bound);
        CHECK(ey <= bound && en <= bound && ez <= bound);
        if (!shared) cw_tensor_destroy(tn);
        cw_tensor_destroy(tc), cw_tensor_destroy(ty), cw_tensor_destroy(tz);
    }
    CHECK(memcmp(got[0][0], got[1][0], (size_t)ny * 4) == 0);
    CHECK(memcmp(got[0][1], got[1][1], (size_t)nn * 4) == 0);
    CHECK(n_out < 3 || memcmp(got[0][2], got[1][2], (size_t)nn * 4) == 0);
    for (int i = 0; i < 2; i++) free(got[i][0]), free(got[i][1]), free(got[i][2]);
    cw_plan_destroy(p);
    cw_graph_destroy(g);
}

/* Donations the plan cannot order are dropped, and sharing the tensor is then refused; the
 * plan still runs with separate tensors. */
static void test_dropped(cw_context *ctx, const step *s, int new_from) {
    cw_graph *g = step_graph(s, ctx, new_from);
    cw_compile_options opt = CW_COMPILE_OPTIONS_INIT;
    opt.policy = CW_PATCHES_FIXED, opt.patches = 2, opt.streams = 3;
    cw_plan *p;
    ASSERT_OK_CTX(ctx, cw_graph_compile(g, &p, &opt));
    int donor = -2;
    ASSERT_OK_CTX(ctx, cw_plan_get_donor(p, 1, &donor));
    CHECK(donor == -1);
    const int n_out = new_from == 2 ? 3 : 2;
    cw_tensor *tc = upload(ctx, CW_F32, 5, s->cd.dims, s->cache), *ty = upload(ctx, CW_F32, 5, s->yd.dims, NULL);
    cw_tensor *tz = upload(ctx, CW_F32, 5, s->cd.dims, NULL), *tn = upload(ctx, CW_F32, 5, s->cd.dims, NULL);
    cw_tensor *ins[2] = {s->tx, tc}, *outs[3] = {ty, tc, tz};
    CHECK_REFUSED(ctx, cw_plan_run(p, ins, 2, outs, n_out), "cw_plan_run: outputs[1] overlaps inputs[1]");
    float *before = download(ctx, tc);
    CHECK(memcmp(before, s->cache, (size_t)cw_tensor_desc_numel(&s->cd) * 4) == 0); /* untouched */
    outs[1] = tn;
    ASSERT_OK_CTX(ctx, cw_plan_run(p, ins, 2, outs, n_out));
    float *y = download(ctx, ty);
    const double e = cw_ref_rel_err(&s->yd, y, s->yref);
    CHECK(e <= 16.0 * (C * 27 * 2 + 8) * FLT_EPSILON);
    free(before), free(y);
    cw_tensor_destroy(tc), cw_tensor_destroy(ty), cw_tensor_destroy(tz), cw_tensor_destroy(tn);
    cw_plan_destroy(p);
    cw_graph_destroy(g);
}

/* An input donated to no output (cw_graph_donate(g, 1, -1)), read by a conv on the heavy
 * streams and then by a relu on the light one, where its pages go back (after joining the
 * conv's streams): every result right on 1-3 streams, and after the run its pages (private
 * anonymous memory, page-aligned) read zero. Bound to the same memory as the other input, it
 * is kept. */
static void test_discard(cw_context *ctx, cw_rng *r) {
    enum { KC = 4, KT = 2, KH = 32, KW = 32, NE = KC * KT * KH * KW };
    const int64_t dims[5] = {1, KC, KT, KH, KW}, wdims[5] = {KC, KC, 3, 3, 3};
    float *w = rnd(r, KC * KC * 27, 0.4f, -0.2f), *v = rnd(r, NE, 2.0f, -1.0f);
    cw_tensor *tw = upload(ctx, CW_F32, 5, wdims, w);
    cw_conv_params cp = CW_CONV_PARAMS_INIT;
    cp.spatial = 3;
    for (int d = 0; d < 3; d++) cp.pad_pre[d] = cp.pad_post[d] = 1;
    cw_tensor_desc d, wd;
    ASSERT_OK(cw_tensor_desc_make(&d, CW_F32, 5, dims));
    ASSERT_OK(cw_tensor_desc_make(&wd, CW_F32, 5, wdims));
    double *ref = malloc(NE * sizeof *ref);
    cw_ref_conv(&d, v, &wd, w, NULL, &cp, &d, ref);
    cw_graph *g;
    ASSERT_OK_CTX(ctx, cw_graph_create(&g, ctx));
    cw_node a = input(ctx, g, "a", CW_F32, 5, dims), c = input(ctx, g, "c", CW_F32, 5, dims), y, z, u;
    ASSERT_OK_CTX(ctx, cw_graph_conv(g, &y, c, constant(ctx, g, tw), CW_NODE_NONE, &cp));
    ASSERT_OK_CTX(ctx, cw_graph_unary(g, &u, c, CW_UNARY_RELU, 0.0f, 0.0f));
    ASSERT_OK_CTX(ctx, cw_graph_conv(g, &z, a, constant(ctx, g, tw), CW_NODE_NONE, &cp));
    ASSERT_OK_CTX(ctx, cw_graph_output(g, y, "y"));
    ASSERT_OK_CTX(ctx, cw_graph_output(g, z, "z"));
    ASSERT_OK_CTX(ctx, cw_graph_output(g, u, "u"));
    ASSERT_OK_CTX(ctx, cw_graph_donate(g, 1, -1));
    CHECK_REFUSED(ctx, cw_graph_donate(g, 1, -1), "cw_graph_donate: input 1 is already donated (to no output)");
    CHECK_REFUSED(ctx, cw_graph_donate(g, 1, 0), "cw_graph_donate: input 1 is already donated (to no output)");
    const size_t bytes = NE * sizeof(float);
    float *mem = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_TRUE(mem != MAP_FAILED);
    const double bound = 16.0 * (KC * 27 + 8) * FLT_EPSILON;
    for (int streams = 1; streams <= 3; streams++)
        for (int shared = 0; shared < 2; shared++) {
            cw_compile_options opt = CW_COMPILE_OPTIONS_INIT;
            opt.policy = streams == 1 ? CW_PATCHES_NONE : CW_PATCHES_FIXED, opt.patches = 3, opt.streams = streams;
            cw_plan *p;
            ASSERT_OK_CTX(ctx, cw_graph_compile(g, &p, &opt));
            char *text = NULL;
            ASSERT_OK_CTX(ctx, cw_plan_describe(p, &text, 0));
            CHECK(strstr(text, "input 1 ('c') given back after its last read, donated to no output") != NULL);
            cw_free(text);
            memcpy(mem, v, bytes);
            cw_tensor *tc, *ta = shared ? NULL : upload(ctx, CW_F32, 5, dims, v);
            ASSERT_OK_CTX(ctx, cw_tensor_wrap(&tc, ctx, &d, mem));
            cw_tensor *ty = upload(ctx, CW_F32, 5, dims, NULL), *tz = upload(ctx, CW_F32, 5, dims, NULL);
            cw_tensor *tu = upload(ctx, CW_F32, 5, dims, NULL);
            cw_tensor *ins[2] = {shared ? tc : ta, tc}, *outs[3] = {ty, tz, tu};
            ASSERT_OK_CTX(ctx, cw_plan_run(p, ins, 2, outs, 3));
            float *gy = download(ctx, ty), *gz = download(ctx, tz), *gu = download(ctx, tu);
            const double ey = cw_ref_rel_err(&d, gy, ref), ez = cw_ref_rel_err(&d, gz, ref);
            int zeros = 0, kept = memcmp(mem, v, bytes) == 0, relu = 1;
            for (int i = 0; i < NE; i++) zeros += mem[i] == 0.0f, relu &= gu[i] == (v[i] > 0.0f ? v[i] : 0.0f);
            CHECK(relu);
            fprintf(stderr, "discarded input, %d stream(s)%s: errors %g %g, %d of %d zero after\n", streams,
                    shared ? ", bound twice" : "", ey, ez, zeros, (int)NE);
            CHECK(ey <= bound && ez <= bound);
            CHECK(shared ? kept : zeros == NE);
            free(gy), free(gz), free(gu);
            cw_tensor_destroy(tc), cw_tensor_destroy(ty), cw_tensor_destroy(tz), cw_tensor_destroy(tu);
            if (ta) cw_tensor_destroy(ta);
            cw_plan_destroy(p);
        }
    munmap(mem, bytes);
    cw_graph_destroy(g);
    cw_tensor_destroy(tw);
    free(w), free(v), free(ref);
}

static void test_badargs(cw_context *ctx, const step *s) {
    cw_graph *g;
    ASSERT_OK_CTX(ctx, cw_graph_create(&g, ctx));
    cw_node x = input(ctx, g, "x", CW_F32, 5, s->xd.dims), c = input(ctx, g, "cache", CW_F32, 5, s->cd.dims);
    cw_node h, nc, m;
    ASSERT_OK_CTX(ctx, cw_graph_conv(g, &h, x, constant(ctx, g, s->tw0), CW_NODE_NONE, &s->p0));
    ASSERT_OK_CTX(ctx, cw_graph_slice(g, &nc, h, 2, 0, TC));
    ASSERT_OK_CTX(ctx, cw_graph_unary(g, &m, c, CW_UNARY_RELU, 0.0f, 0.0f));
    ASSERT_OK_CTX(ctx, cw_graph_output(g, h, "h"));
    ASSERT_OK_CTX(ctx, cw_graph_output(g, nc, "nc"));
    ASSERT_OK_CTX(ctx, cw_graph_output(g, m, "m"));
    CHECK_REFUSED(ctx, cw_graph_donate(g, 2, 1), "cw_graph_donate: input = 2, the graph has 2 inputs");
    CHECK_REFUSED(ctx, cw_graph_donate(g, -1, 1), "cw_graph_donate: input = -1");
    CHECK_REFUSED(ctx, cw_graph_donate(g, 1, 3), "cw_graph_donate: output = 3, the graph has 3 outputs");
    CHECK_REFUSED(ctx, cw_graph_donate(g, 0, 1),
                  "cw_graph_donate: input 0 is f32 [1, 3, 4, 6, 5], output 1 is f32 [1, 3, 2, 6, 5]: a donation needs "
                  "one shape and dtype");
    ASSERT_OK_CTX(ctx, cw_graph_donate(g, 1, 1));
    CHECK_REFUSED(ctx, cw_graph_donate(g, 1, 2), "cw_graph_donate: input 1 is already donated to output 1");
    CHECK_REFUSED(ctx, cw_graph_donate(g, 0, 1), "cw_graph_donate: output 1 already has input 1 donated");
    ASSERT_STATUS(cw_graph_donate(NULL, 0, 0), CW_ERR_INVALID_ARG);
    cw_plan *p;
    ASSERT_OK_CTX(ctx, cw_graph_compile(g, &p, NULL));
    int donor;
    ASSERT_STATUS(cw_plan_get_donor(p, 1, NULL), CW_ERR_INVALID_ARG);
    ASSERT_STATUS(cw_plan_get_donor(NULL, 1, &donor), CW_ERR_INVALID_ARG);
    CHECK_REFUSED(ctx, cw_plan_get_donor(p, 3, &donor), "cw_plan_get_donor: output 3, the plan has 3");
    /* donated, honoured, but passed as another view of the cache's memory: refused */
    ASSERT_OK_CTX(ctx, cw_plan_get_donor(p, 1, &donor));
    CHECK(donor == 1);
    cw_tensor *tc = upload(ctx, CW_F32, 5, s->cd.dims, s->cache), *th = upload(ctx, CW_F32, 5, s->xd.dims, NULL);
    cw_tensor *tm = upload(ctx, CW_F32, 5, s->cd.dims, NULL), *tv;
    cw_tensor_desc vd = s->cd;
    vd.strides[4] = 1, vd.strides[3] = WW, vd.strides[2] = HH * WW, vd.strides[1] = TC * HH * WW;
    vd.strides[0] = 2 * C * TC * HH * WW; /* the same elements, another stride of the unit batch dim */
    ASSERT_OK_CTX(ctx, cw_tensor_wrap(&tv, ctx, &vd, cw_tensor_get_data(tc)));
    cw_tensor *ins[2] = {s->tx, tc}, *outs[3] = {th, tv, tm};
    CHECK_REFUSED(ctx, cw_plan_run(p, ins, 2, outs, 3),
                  "cw_plan_run: outputs[1] overlaps inputs[1] (donated to it, but not the same view");
    cw_tensor_destroy(tc), cw_tensor_destroy(th), cw_tensor_destroy(tm), cw_tensor_destroy(tv);
    cw_plan_destroy(p);
    cw_graph_destroy(g);
}

int main(void) {
    cw_rng r = {cw_test_seed(2411)};
    cw_context *ctx = chaos_context();
    step s;
    step_open(&s, ctx, &r);
    for (int v = 0; v < 4; v += 3) {
        test_honoured(ctx, &s, v, CW_PATCHES_NONE, 1, 0);
        test_honoured(ctx, &s, v, CW_PATCHES_FIXED, 3, 0);
        test_honoured(ctx, &s, v, CW_PATCHES_FIXED, 2, 0);
        test_honoured(ctx, &s, v, CW_PATCHES_AUTO, 3, 64 << 10);
    }
    test_dropped(ctx, &s, 1);
    test_dropped(ctx, &s, 2);
    test_badargs(ctx, &s);
    test_discard(ctx, &r);
    step_close(&s);
    cw_context_destroy(ctx);
    TEST_DONE();
}
