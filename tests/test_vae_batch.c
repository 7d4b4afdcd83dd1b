/* Batches through one plan: a decoder (and encoder) graph over [N, C, h, w] must give, per
 * sample, what the same graph gives for that sample alone, under the unscheduled run and
 * under small budgets with several streams (GroupNorm statistics are per (n, group)). */
#include <unistd.h>

#include "convweave/convweave.h"
#include "testutil.h"
#include "vae.h"

static cw_context *ctx;

static float *run(vae_model *m, const cw_compile_options *o, const float *in) {
    char err[VAE_ERR_LEN];
    cw_plan *plan = NULL;
    cw_status st = vae_compile(m, o, &plan, err, sizeof(err));
    if (st != CW_OK) fprintf(stderr, "compile: %s\n", err);
    ASSERT_EQ_I(st, CW_OK);
    float *y = malloc((size_t)cw_tensor_desc_numel(&m->out_desc) * sizeof(float));
    ASSERT_TRUE(y != NULL);
    st = vae_run(m, plan, in, y, err, sizeof(err));
    if (st != CW_OK) fprintf(stderr, "run: %s\n", err);
    ASSERT_EQ_I(st, CW_OK);
    cw_plan_destroy(plan);
    return y;
}

static void check_part(int part, int64_t batch, int64_t h, int64_t w, uint64_t seed) {
    char err[VAE_ERR_LEN];
    vae_config cfg;
    ASSERT_EQ_I(vae_preset(&cfg, "tiny", err, sizeof(err)), 0);
    vae_weights *wt = NULL;
    ASSERT_EQ_I(vae_weights_random(&wt, seed, err, sizeof(err)), 0);
    vae_model *mb = NULL, *m1 = NULL;
    cw_status st = vae_build(&mb, ctx, &cfg, wt, part, batch, h, w, CW_F32, 0, err, sizeof(err));
    if (st != CW_OK) fprintf(stderr, "build: %s\n", err);
    ASSERT_EQ_I(st, CW_OK);
    ASSERT_EQ_I(vae_build(&m1, ctx, &cfg, wt, part, 1, h, w, CW_F32, 0, err, sizeof(err)), CW_OK);
    ASSERT_EQ_I(mb->out_desc.dims[0], batch);
    int64_t nin1 = cw_tensor_desc_numel(&m1->in_desc), nout1 = cw_tensor_desc_numel(&m1->out_desc);
    float *x = malloc((size_t)(nin1 * batch) * sizeof(float));
    ASSERT_TRUE(x != NULL);
    vae_latent_random(x, (size_t)(nin1 * batch), seed + 7);
    /* samples of different scales, so statistics mixed across samples would show */
    for (int64_t s = 0; s < batch; s++)
        for (int64_t i = 0; i < nin1; i++) x[s * nin1 + i] = x[s * nin1 + i] * (float)(1 + 2 * s) + (float)s;

    cw_compile_options none = CW_COMPILE_OPTIONS_INIT;
    none.policy = CW_PATCHES_NONE;
    none.streams = 1;
    none.temp_budget = -1;
    float *yb = run(mb, &none, x);
    double worst = 0, scale = 0;
    for (int64_t s = 0; s < batch; s++) {
        float *y1 = run(m1, &none, x + s * nin1);
        double d = cw_err_abs(yb + s * nout1, y1, nout1);
        for (int64_t i = 0; i < nout1; i++) scale = fmax(scale, fabs((double)y1[i]));
        worst = cw_err_max(worst, d);
        free(y1);
    }
    fprintf(stderr, "%s batch %lld, %lldx%lld: unscheduled batch vs per sample max|diff| %.3g (scale %.3g)\n",
            part == VAE_DECODER ? "decoder" : "encoder", (long long)batch, (long long)h, (long long)w, worst, scale);
    CHECK(worst <= 1e-5 * scale);
    for (int k = 0; k < 3; k++) {
        cw_compile_options o = CW_COMPILE_OPTIONS_INIT;
        o.streams = 2 + k;
        o.policy = k == 2 ? CW_PATCHES_FIXED : CW_PATCHES_AUTO;
        o.patches = 3;
        int64_t minb = 0;
        ASSERT_OK_CTX(ctx, cw_graph_min_budget(mb->graph, &minb, &o));
        o.temp_budget = minb + k * minb / 2;
        float *ys = run(mb, &o, x);
        double d = cw_err_abs(ys, yb, nout1 * batch);
        fprintf(stderr, "  streams %d, %s, budget %lld: vs unscheduled batch max|diff| %.3g\n", o.streams,
                o.policy == CW_PATCHES_AUTO ? "auto" : "3 patches", (long long)o.temp_budget, d);
        CHECK(d <= 1e-5 * scale);
        free(ys);
    }
    free(yb);
    free(x);
    vae_model_destroy(mb);
    vae_model_destroy(m1);
    vae_weights_close(wt);
}

int main(void) {
    uint64_t seed = cw_test_seed(7100);
    cw_context_config cc = CW_CONTEXT_CONFIG_INIT;
    cc.backend = CW_BACKEND_CPU;
    cc.threads = 2;
    ASSERT_OK(cw_context_create(&ctx, &cc));
    check_part(VAE_DECODER, 3, 4, 6, seed);
    check_part(VAE_ENCODER, 2, 32, 40, seed);
    cw_context_destroy(ctx);
    TEST_DONE();
}
