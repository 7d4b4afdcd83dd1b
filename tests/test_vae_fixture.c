/* cw-vae end to end on the committed tiny diffusers fixtures (tests/fixtures/tiny_*): the
 * decode via vae_model.c (the CLI's code path) against diffusers' float64 output, scheduled runs
 * against the unscheduled reference, legacy key names, and bad-weight messages. */
#include <cjson/cJSON.h>
#include <unistd.h>

#include "convweave/convweave.h"
#include "image.h"
#include "npy.h"
#include "safetensors.h"
#include "testfiles.h"
#include "testutil.h"
#include "vae.h"

#define FIX CW_SOURCE_DIR "/tests/fixtures/"
/* a key of layers_per_block 2 (the fixture has 1): edit_extra_key adds it */
#define EXTRA_KEY "decoder.up_blocks.0.resnets.2.conv1.bias"

static cw_context *ctx;

static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    ASSERT_TRUE(f != NULL);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    ASSERT_TRUE(s && fread(s, 1, (size_t)n, f) == (size_t)n);
    s[n] = 0;
    fclose(f);
    return s;
}

/* The tiny preset must be exactly the fixture's architecture. */
static void check_preset_matches_config(void) {
    vae_config c;
    char err[VAE_ERR_LEN];
    ASSERT_EQ_I(vae_preset(&c, "tiny", err, sizeof(err)), 0);
    char *text = read_text(FIX "tiny_config.json");
    cJSON *j = cJSON_Parse(text);
    ASSERT_TRUE(j != NULL);
    cJSON *boc = cJSON_GetObjectItem(j, "block_out_channels");
    ASSERT_EQ_I(cJSON_GetArraySize(boc), c.n_blocks);
    for (int i = 0; i < c.n_blocks; i++) ASSERT_EQ_I(cJSON_GetArrayItem(boc, i)->valueint, c.block_out[i]);
    ASSERT_EQ_I(cJSON_GetObjectItem(j, "layers_per_block")->valueint, c.layers_per_block);
    ASSERT_EQ_I(cJSON_GetObjectItem(j, "norm_num_groups")->valueint, c.groups);
    ASSERT_EQ_I(cJSON_GetObjectItem(j, "latent_channels")->valueint, c.latent_channels);
    ASSERT_EQ_I(cJSON_GetObjectItem(j, "out_channels")->valueint, c.out_channels);
    CHECK(fabs(cJSON_GetObjectItem(j, "norm_eps")->valuedouble - c.eps) < 1e-12);
    CHECK(fabs(cJSON_GetObjectItem(j, "scaling_factor")->valuedouble - c.scaling_factor) < 1e-12);
    cJSON_Delete(j);
    free(text);
}

typedef struct decoded {
    float *y;
    int64_t n;
    cw_plan_stats stats;
} decoded;

/* Builds the tiny decoder from `weights` and decodes the fixture latent with opt. */
static cw_status decode_with(const char *weights, const float *z, const int64_t zd[4], const cw_compile_options *opt,
                             decoded *out, char *err, size_t errlen) {
    vae_config cfg;
    ASSERT_EQ_I(vae_preset(&cfg, "tiny", err, errlen), 0);
    vae_weights *w = NULL;
    if (vae_weights_open_file(&w, weights, err, errlen)) return CW_ERR_FORMAT;
    vae_model *m = NULL;
    cw_status st = vae_build(&m, ctx, &cfg, w, VAE_DECODER, 1, zd[2], zd[3], CW_F32, 0, err, errlen);
    vae_weights_close(w);
    if (st != CW_OK) return st;
    ASSERT_EQ_I(m->out_desc.rank, 4);
    ASSERT_EQ_I(m->out_desc.dims[1], 3);
    ASSERT_EQ_I(m->out_desc.dims[2], zd[2] * 8);
    ASSERT_EQ_I(m->out_desc.dims[3], zd[3] * 8);
    cw_plan *plan = NULL;
    st = vae_compile(m, opt, &plan, err, errlen);
    if (st == CW_OK) {
        out->n = cw_tensor_desc_numel(&m->out_desc);
        out->y = malloc((size_t)out->n * sizeof(float));
        ASSERT_TRUE(out->y != NULL);
        st = vae_run(m, plan, z, out->y, err, errlen);
        if (st == CW_OK) ASSERT_OK_CTX(ctx, cw_plan_get_stats(plan, &out->stats));
    }
    cw_plan_destroy(plan);
    vae_model_destroy(m);
    return st;
}

/* Rewrites the fixture weights into path with `edit` applied to each (name, shape). */
typedef void (*edit_fn)(char *name, size_t len, int64_t *shape, int *rank, int *drop);

static void rewrite_weights(const char *path, edit_fn edit) {
    char err[VAE_ERR_LEN];
    st_file *f = NULL;
    if (st_open(&f, FIX "tiny_vae.safetensors", err, sizeof(err))) {
        fprintf(stderr, "%s\n", err);
        exit(1);
    }
    size_t n = st_count(f);
    char **names = calloc(n + 1, sizeof(char *));
    int64_t **shapes = calloc(n + 1, sizeof(int64_t *));
    int *ranks = calloc(n + 1, sizeof(int));
    float **data = calloc(n + 1, sizeof(float *));
    ASSERT_TRUE(names && shapes && ranks && data);
    int k = 0;
    for (size_t i = 0; i < n; i++) {
        const st_tensor *t = st_at(f, i);
        char *name = malloc(256);
        int64_t *shape = calloc(ST_MAX_RANK, sizeof(int64_t));
        float *d = malloc((size_t)t->numel * sizeof(float));
        ASSERT_TRUE(name && shape && d);
        snprintf(name, 256, "%s", t->name);
        memcpy(shape, t->shape, sizeof(int64_t) * (size_t)t->rank);
        int rank = t->rank, drop = 0;
        ASSERT_EQ_I(st_read_f32(f, t, d, (size_t)t->numel, err, sizeof(err)), 0);
        edit(name, 256, shape, &rank, &drop);
        if (name[0] == '!') { /* edit_nan: restore the name, poison element 3 */
            name[0] = t->name[0];
            d[3] = NAN;
        }
        if (drop > 0) {
            free(name), free(shape), free(d);
            continue;
        }
        names[k] = name, shapes[k] = shape, ranks[k] = rank, data[k] = d;
        k++;
        if (drop < 0) { /* edit_extra_key: the same tensor again under EXTRA_KEY */
            names[k] = strdup(EXTRA_KEY), shapes[k] = malloc(ST_MAX_RANK * sizeof(int64_t)), ranks[k] = rank;
            data[k] = malloc((size_t)t->numel * sizeof(float));
            ASSERT_TRUE(names[k] && shapes[k] && data[k]);
            memcpy(shapes[k], shape, ST_MAX_RANK * sizeof(int64_t));
            memcpy(data[k], d, (size_t)t->numel * sizeof(float));
            k++;
        }
    }
    if (st_write(path, k, (const char *const *)names, (const int64_t *const *)shapes, ranks,
                 (const float *const *)data, err, sizeof(err))) {
        fprintf(stderr, "st_write %s: %s\n", path, err);
        exit(1);
    }
    for (int i = 0; i < k; i++) free(names[i]), free(shapes[i]), free(data[i]);
    free(names), free(shapes), free(ranks), free(data);
    st_close(f);
}

static int contains(const char *s, const char *sub) { return strstr(s, sub) != NULL; }

/* An extra key another architecture has: up block 0 with a third ResNet (layers_per_block 2). */
static void edit_extra_key(char *name, size_t len, int64_t *shape, int *rank, int *drop) {
    (void)rank, (void)shape, (void)len, (void)name;
    if (!strcmp(name, "decoder.up_blocks.0.resnets.1.conv1.bias")) *drop = -1; /* keep it, and a copy */
}

/* A NaN in one weight (the edit marks it by name; the value is set in rewrite_weights). */
static void edit_nan(char *name, size_t len, int64_t *shape, int *rank, int *drop) {
    (void)len, (void)shape, (void)rank, (void)drop;
    if (!strcmp(name, "decoder.conv_in.bias")) name[0] = '!';
}

/* The encoder against diffusers' moments of the committed images, unscheduled and
 * scheduled, as one batch of two. */
static void check_encoder(void) {
    char err[VAE_ERR_LEN];
    float *img[2];
    int64_t d[2][4];
    ASSERT_EQ_I(img_read_png(FIX "tiny_image0.png", &img[0], d[0], err, sizeof(err)), 0);
    ASSERT_EQ_I(img_read_png(FIX "tiny_image1.png", &img[1], d[1], err, sizeof(err)), 0);
    int64_t per = 3 * d[0][2] * d[0][3];
    float *x = malloc((size_t)(2 * per) * sizeof(float));
    ASSERT_TRUE(x != NULL);
    memcpy(x, img[0], (size_t)per * sizeof(float));
    memcpy(x + per, img[1], (size_t)per * sizeof(float));
    npy_array ref;
    ASSERT_EQ_I(npy_read(FIX "tiny_enc_moments.npy", &ref, err, sizeof(err)), 0);
    vae_config cfg;
    ASSERT_EQ_I(vae_preset(&cfg, "tiny", err, sizeof(err)), 0);
    vae_weights *w = NULL;
    ASSERT_EQ_I(vae_weights_open_file(&w, FIX "tiny_enc.safetensors", err, sizeof(err)), 0);
    vae_model *m = NULL;
    cw_status st = vae_build(&m, ctx, &cfg, w, VAE_ENCODER, 2, d[0][2], d[0][3], CW_F32, 0, err, sizeof(err));
    if (st != CW_OK) fprintf(stderr, "encoder build: %s\n", err);
    ASSERT_EQ_I(st, CW_OK);
    vae_weights_close(w);
    ASSERT_EQ_I(cw_tensor_desc_numel(&m->out_desc), ref.numel);
    float *y = malloc((size_t)ref.numel * sizeof(float));
    ASSERT_TRUE(y != NULL);
    for (int k = 0; k < 3; k++) {
        cw_compile_options o = CW_COMPILE_OPTIONS_INIT;
        if (k == 0) {
            o.policy = CW_PATCHES_NONE;
            o.streams = 1;
            o.temp_budget = -1;
        } else {
            o.streams = 1 + k;
            ASSERT_OK_CTX(ctx, cw_graph_min_budget(m->graph, &o.temp_budget, &o));
        }
        cw_plan *plan = NULL;
        ASSERT_EQ_I(vae_compile(m, &o, &plan, err, sizeof(err)), CW_OK);
        ASSERT_EQ_I(vae_run(m, plan, x, y, err, sizeof(err)), CW_OK);
        cw_plan_stats s;
        ASSERT_OK_CTX(ctx, cw_plan_get_stats(plan, &s));
        double e = cw_err_rel(y, ref.data, ref.numel);
        fprintf(stderr, "encoder (%s, %d streams, budget %lld, %lld patches) vs diffusers: rel err %.3g\n",
                k ? "scheduled" : "unscheduled", o.streams, (long long)o.temp_budget, (long long)s.n_patches, e);
        CHECK(e <= 1e-5);
        cw_plan_destroy(plan);
    }
    /* the mean is the first half of the moments; a sample is mean + std * eps */
    int64_t hw = d[0][2] / 8 * (d[0][3] / 8);
    float *z = malloc((size_t)(2 * 4 * hw) * sizeof(float)), *zs = malloc((size_t)(2 * 4 * hw) * sizeof(float));
    ASSERT_TRUE(z && zs);
    ASSERT_EQ_I(vae_moments_to_latent(y, 2, 4, hw, 0, 0, z), 0);
    CHECK(z[0] == y[0] && z[4 * hw] == y[8 * hw]);
    ASSERT_EQ_I(vae_moments_to_latent(y, 2, 4, hw, 1, 5, zs), 0);
    double dm = 0;
    for (int64_t i = 0; i < 8 * hw; i++) dm = fmax(dm, fabs((double)zs[i] - z[i]));
    CHECK(dm > 0 && dm < 10);
    free(z), free(zs), free(y), free(x), free(img[0]), free(img[1]);
    npy_free(&ref);
    vae_model_destroy(m);
}

/* diffusers' own config.json of the fixture model reads as the tiny preset; bad configs
 * name the key. */
static void check_config_json(void) {
    char err[VAE_ERR_LEN];
    vae_config c, t;
    ASSERT_EQ_I(vae_preset(&t, "tiny", err, sizeof(err)), 0);
    ASSERT_EQ_I(vae_preset(&c, "sd3", err, sizeof(err)), 0);
    int rc = vae_config_load(&c, FIX "tiny_model_config.json", err, sizeof(err));
    if (rc) fprintf(stderr, "config: %s\n", err);
    ASSERT_EQ_I(rc, 0);
    ASSERT_EQ_I(c.n_blocks, t.n_blocks);
    for (int i = 0; i < c.n_blocks; i++) ASSERT_EQ_I(c.block_out[i], t.block_out[i]);
    ASSERT_EQ_I(c.layers_per_block, t.layers_per_block);
    ASSERT_EQ_I(c.groups, t.groups);
    ASSERT_EQ_I(c.latent_channels, t.latent_channels);
    ASSERT_EQ_I(c.quant_conv, 1);
    ASSERT_EQ_I(c.post_quant_conv, 1);
    ASSERT_EQ_I(c.mid_attention, 1);
    CHECK(c.shift_factor == 0.0 && fabs(c.scaling_factor - 0.18215) < 1e-12);
    /* a genuine diffusers config: '_' keys ignored, every omitted key diffusers' AutoencoderKL
     * class default (0.42.1), not the preset it was read over */
    vae_config d;
    ASSERT_EQ_I(vae_preset(&d, "sd3", err, sizeof(err)), 0);
    const char *minimal = "{\"_class_name\": \"AutoencoderKL\", \"_use_default_values\": [\"shift_factor\"], "
                          "\"_diffusers_version\": \"0.21.0\", \"_private_knob\": 1}";
    rc = vae_config_parse_json(&d, minimal, strlen(minimal), "config.json", err, sizeof(err));
    if (rc) fprintf(stderr, "minimal config: %s\n", err);
    ASSERT_EQ_I(rc, 0);
    ASSERT_EQ_I(d.n_blocks, 1);
    ASSERT_EQ_I(d.block_out[0], 64);
    ASSERT_EQ_I(d.layers_per_block, 1);
    ASSERT_EQ_I(d.latent_channels, 4);
    ASSERT_EQ_I(d.in_channels, 3);
    ASSERT_EQ_I(d.out_channels, 3);
    ASSERT_EQ_I(d.groups, 32);
    ASSERT_EQ_I(d.quant_conv, 1);
    ASSERT_EQ_I(d.post_quant_conv, 1);
    ASSERT_EQ_I(d.mid_attention, 1);
    ASSERT_EQ_I(d.force_upcast, 1);
    CHECK(d.shift_factor == 0.0 && d.scaling_factor == 0.18215);
    static const char *const bad[][2] = {
        {"{\"norm_num_groups\": 3.5}", "norm_num_groups"},
        {"{\"scaling_factor\": 1e300}", "scaling_factor"},
        {"{\"scaling_factor\": 1e-320}", "scaling_factor"},
        {"{\"layers_per_block\": \"2\"}", "layers_per_block"},
        {"{\"up_block_types\": [\"UpDecoderBlock2D\", \"AttnUpDecoderBlock2D\", \"x\", \"y\"]}", "AttnUpDecoderBlock2D"},
        {"{\"_class_name\": \"AutoencoderTiny\"}", "AutoencoderTiny"},
        {"{\"use_quant_conv\": 1}", "use_quant_conv"},
        {"{\"new_knob\": 1}", "new_knob"},
        {"{\"latent_channels\": 4, \"latent_channels\": 16}", "twice"},
        {"{\"norm_num_groups\": 24}", "24"},
        {"{\"block_out_channels\": [128, 256", "byte"},
        {"[1]", "object"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        vae_config x = t;
        rc = vae_config_parse_json(&x, bad[i][0], strlen(bad[i][0]), "config.json", err, sizeof(err));
        fprintf(stderr, "bad config %zu: %s\n", i, err);
        CHECK(rc == -1 && contains(err, bad[i][1]) && contains(err, "config.json"));
        CHECK(!memcmp(&x, &t, sizeof(x))); /* untouched on failure */
    }
}

/* Legacy attention names; q/k/v/out weights as [C, C, 1, 1] convs. */
static void edit_legacy(char *name, size_t len, int64_t *shape, int *rank, int *drop) {
    static const char *const map[][2] = {
        {".to_q.", ".query."}, {".to_k.", ".key."}, {".to_v.", ".value."}, {".to_out.0.", ".proj_attn."}};
    for (int i = 0; i < 4; i++) {
        char *p = strstr(name, map[i][0]);
        if (!p) continue;
        char tmp[256];
        snprintf(tmp, sizeof(tmp), "%.*s%s%s", (int)(p - name), name, map[i][1], p + strlen(map[i][0]));
        snprintf(name, len, "%s", tmp);
        if (*rank == 2 && i != 1) { /* leave key's weight as Linear [C, C]: both forms */
            shape[2] = shape[3] = 1;
            *rank = 4;
        }
    }
    (void)drop;
}

static void edit_drop_key(char *name, size_t len, int64_t *shape, int *rank, int *drop) {
    (void)len, (void)shape, (void)rank;
    *drop = !strcmp(name, "decoder.up_blocks.2.resnets.1.conv2.bias");
}

/* a transposed shortcut: [16, 32, 1, 1] -> [32, 16, 1, 1] (same element count) */
static void edit_bad_shape(char *name, size_t len, int64_t *shape, int *rank, int *drop) {
    (void)len, (void)rank, (void)drop;
    if (!strcmp(name, "decoder.up_blocks.2.resnets.0.conv_shortcut.weight")) {
        int64_t t = shape[0];
        shape[0] = shape[1];
        shape[1] = t;
    }
}


/* Weights truncated by another process while cw-vae maps them (SIGBUS on the pages past the
 * new end): the weight read fails with a message naming the file and the key, no crash. */
static void check_truncated_weights(void) {
    char err[VAE_ERR_LEN];
    size_t len = 0;
    uint8_t *b = cw_test_slurp(FIX "tiny_vae.safetensors", &len);
    ASSERT_TRUE(b != NULL && len > 8192);
    const char *p = cw_test_path("shrinking_vae.safetensors");
    FILE *f = fopen(p, "wb");
    ASSERT_TRUE(f && fwrite(b, 1, len, f) == len && fclose(f) == 0);
    free(b);
    vae_weights *w = NULL;
    ASSERT_EQ_I(vae_weights_open_file(&w, p, err, sizeof(err)), 0);
    ASSERT_EQ_I(truncate(p, 4096), 0); /* the header stays; every tensor's pages are gone */
    int64_t shape[4] = {32, 32, 3, 3};
    float *dst = malloc(32 * 32 * 9 * sizeof(float));
    ASSERT_EQ_I(vae_weights_get(w, "decoder.up_blocks.0.resnets.0.conv1.weight", 4, shape, dst, err, sizeof(err)), -1);
    fprintf(stderr, "truncated weights: %s\n", err);
    CHECK(contains(err, "shrinking_vae.safetensors") && contains(err, "decoder.up_blocks.0.resnets.0.conv1.weight") &&
          contains(err, "truncated while being read"));
    free(dst);
    vae_weights_close(w);
}

int main(void) {
    uint64_t seed = cw_test_seed(20240611);
    char err[VAE_ERR_LEN];
    cw_context_config cc = CW_CONTEXT_CONFIG_INIT;
    cc.backend = CW_BACKEND_CPU;
    cc.threads = 2;
    ASSERT_OK(cw_context_create(&ctx, &cc));

    check_preset_matches_config();

    float *z = NULL;
    int64_t zd[4];
    if (vae_latent_load(FIX "tiny_latent.npy", &z, zd, err, sizeof(err))) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    ASSERT_EQ_I(zd[1], 4);
    npy_array ref;
    ASSERT_EQ_I(npy_read(FIX "tiny_out.npy", &ref, err, sizeof(err)), 0);

    /* 1. unscheduled reference vs diffusers (float64): relative error <= 1e-4 */
    cw_compile_options none = CW_COMPILE_OPTIONS_INIT;
    none.policy = CW_PATCHES_NONE;
    none.streams = 1;
    none.temp_budget = -1;
    decoded r = {0};
    cw_status st = decode_with(FIX "tiny_vae.safetensors", z, zd, &none, &r, err, sizeof(err));
    if (st != CW_OK) fprintf(stderr, "reference decode: %s\n", err);
    ASSERT_EQ_I(st, CW_OK);
    ASSERT_EQ_I(r.n, ref.numel);
    double e = cw_err_rel(r.y, ref.data, r.n);
    fprintf(stderr, "reference vs diffusers: rel err %.3g\n", e);
    CHECK(e <= 1e-4);

    /* 2. F16 / BF16 weight files against diffusers decoding the same rounded weights */
    static const char *const half[][2] = {{FIX "tiny_vae_f16.safetensors", FIX "tiny_out_f16w.npy"},
                                           {FIX "tiny_vae_bf16.safetensors", FIX "tiny_out_bf16w.npy"}};
    for (int i = 0; i < 2; i++) {
        npy_array hr;
        ASSERT_EQ_I(npy_read(half[i][1], &hr, err, sizeof(err)), 0);
        decoded h = {0};
        ASSERT_EQ_I(decode_with(half[i][0], z, zd, &none, &h, err, sizeof(err)), CW_OK);
        double eh = cw_err_rel(h.y, hr.data, h.n);
        fprintf(stderr, "%s: rel err %.3g\n", half[i][0], eh);
        CHECK(eh <= 1e-4);
        free(h.y);
        npy_free(&hr);
    }

    /* 3. scheduled runs (auto/fixed patches, small budgets, 2-3 streams) vs the reference */
    {
        vae_config cfg;
        vae_preset(&cfg, "tiny", err, sizeof(err));
        vae_weights *w = NULL;
        ASSERT_EQ_I(vae_weights_open_file(&w, FIX "tiny_vae.safetensors", err, sizeof(err)), 0);
        vae_model *m = NULL;
        ASSERT_EQ_I(vae_build(&m, ctx, &cfg, w, VAE_DECODER, 1, zd[2], zd[3], CW_F32, 0, err, sizeof(err)), CW_OK);
        vae_weights_close(w);
        cw_rng rng = {seed};
        for (int k = 0; k < 4; k++) {
            cw_compile_options o = CW_COMPILE_OPTIONS_INIT;
            o.streams = 2 + (int)cw_rng_range(&rng, 0, 1);
            o.policy = k < 2 ? CW_PATCHES_AUTO : CW_PATCHES_FIXED;
            o.patches = (int)cw_rng_range(&rng, 2, 6);
            int64_t minb = 0;
            ASSERT_OK_CTX(ctx, cw_graph_min_budget(m->graph, &minb, &o));
            /* k = 0: the smallest budget that works; else a little above it */
            o.temp_budget = k == 0 ? minb : minb + cw_rng_range(&rng, 0, minb);
            cw_plan *plan = NULL;
            st = vae_compile(m, &o, &plan, err, sizeof(err));
            if (st != CW_OK) fprintf(stderr, "compile (budget %lld): %s\n", (long long)o.temp_budget, err);
            ASSERT_EQ_I(st, CW_OK);
            float *y = malloc((size_t)r.n * sizeof(float));
            ASSERT_TRUE(y != NULL);
            st = vae_run(m, plan, z, y, err, sizeof(err));
            if (st != CW_OK) fprintf(stderr, "decode (budget %lld): %s\n", (long long)o.temp_budget, err);
            ASSERT_EQ_I(st, CW_OK);
            cw_plan_stats s;
            ASSERT_OK_CTX(ctx, cw_plan_get_stats(plan, &s));
            double es = cw_err_rel(y, r.y, r.n);
            fprintf(stderr, "scheduled: %s patches=%d, streams %d, budget %lld (min %lld): %lld conv patches, "
                            "temp peak %lld, rel diff vs reference %.3g\n",
                    o.policy == CW_PATCHES_AUTO ? "auto" : "fixed", o.patches, o.streams,
                    (long long)o.temp_budget, (long long)minb, (long long)s.n_patches, (long long)s.temp_peak, es);
            CHECK(es <= 1e-5);
            ASSERT_LE_I(s.temp_peak, o.temp_budget);
            /* a budget this small must actually split the convolutions */
            CHECK(s.n_patches > r.stats.n_patches);
            free(y);
            cw_plan_destroy(plan);
        }
        vae_model_destroy(m);
    }

    /* 4. legacy attention names (query/key/value/proj_attn) and [C, C, 1, 1] forms decode
     * to the same result */
    char path[512];
    snprintf(path, sizeof(path), "%s/vae_fixture_%d.safetensors", CW_BINARY_DIR, (int)getpid());
    rewrite_weights(path, edit_legacy);
    {
        decoded l = {0};
        st = decode_with(path, z, zd, &none, &l, err, sizeof(err));
        if (st != CW_OK) fprintf(stderr, "legacy names: %s\n", err);
        ASSERT_EQ_I(st, CW_OK);
        double el = cw_err_rel(l.y, r.y, r.n);
        fprintf(stderr, "legacy names vs current: rel diff %.3g\n", el);
        CHECK(el == 0.0);
        free(l.y);
    }

    /* 5. bad weights: one-line messages naming the key (and both shapes) */
    rewrite_weights(path, edit_drop_key);
    {
        decoded d = {0};
        st = decode_with(path, z, zd, &none, &d, err, sizeof(err));
        fprintf(stderr, "missing key: %s: %s\n", cw_status_name(st), err);
        CHECK(st == CW_ERR_FORMAT);
        CHECK(contains(err, "decoder.up_blocks.2.resnets.1.conv2.bias"));
        CHECK(contains(err, "missing"));
        CHECK(!contains(err, "\n"));
        CHECK(d.y == NULL);
    }
    rewrite_weights(path, edit_bad_shape);
    {
        decoded d = {0};
        st = decode_with(path, z, zd, &none, &d, err, sizeof(err));
        fprintf(stderr, "mis-shaped key: %s: %s\n", cw_status_name(st), err);
        CHECK(st == CW_ERR_FORMAT);
        CHECK(contains(err, "decoder.up_blocks.2.resnets.0.conv_shortcut.weight"));
        CHECK(contains(err, "[32, 16, 1, 1]")); /* in the file */
        CHECK(contains(err, "[16, 32, 1, 1]")); /* expected */
        CHECK(d.y == NULL);
    }
    /* a truncated file fails to open with a message, never a crash */
    {
        FILE *src = fopen(FIX "tiny_vae.safetensors", "rb");
        FILE *dst = fopen(path, "wb");
        ASSERT_TRUE(src && dst);
        char buf[4096];
        size_t total = 0, n;
        while ((n = fread(buf, 1, sizeof(buf), src)) > 0 && total < 100000) {
            fwrite(buf, 1, n, dst);
            total += n;
        }
        fclose(src);
        fclose(dst);
        vae_weights *w = NULL;
        int rc = vae_weights_open_file(&w, path, err, sizeof(err));
        fprintf(stderr, "truncated: %s\n", err);
        CHECK(rc == -1 && w == NULL);
        CHECK(contains(err, path));
    }
    /* 5b. a key no half of the model consumes (another architecture's weights): named, with
     * what the file's shapes say */
    rewrite_weights(path, edit_extra_key);
    {
        decoded d = {0};
        st = decode_with(path, z, zd, &none, &d, err, sizeof(err));
        fprintf(stderr, "extra key: %s: %s\n", cw_status_name(st), err);
        CHECK(st == CW_ERR_FORMAT);
        CHECK(contains(err, EXTRA_KEY) && contains(err, "not part of"));
        CHECK(d.y == NULL);
    }
    /* 5c. a NaN weight: named with its index, unless allowed */
    rewrite_weights(path, edit_nan);
    {
        decoded d = {0};
        st = decode_with(path, z, zd, &none, &d, err, sizeof(err));
        fprintf(stderr, "NaN weight: %s: %s\n", cw_status_name(st), err);
        CHECK(st == CW_ERR_FORMAT);
        CHECK(contains(err, "decoder.conv_in.bias") && contains(err, "NaN at [3]"));
        CHECK(d.y == NULL);
    }
    unlink(path);
    /* 5d. the tiny decoder file says its architecture: inferred from shapes alone */
    {
        vae_config c, t;
        vae_preset(&t, "tiny", err, sizeof(err));
        vae_preset(&c, "sd", err, sizeof(err));
        vae_weights *w = NULL;
        ASSERT_EQ_I(vae_weights_open_file(&w, FIX "tiny_vae.safetensors", err, sizeof(err)), 0);
        ASSERT_EQ_I(vae_weights_infer(w, &c, err, sizeof(err)), 0);
        c.groups = t.groups;
        CHECK(c.n_blocks == 4 && c.block_out[0] == 8 && c.block_out[3] == 32 && c.layers_per_block == 1);
        CHECK(vae_weights_check(w, &c, VAE_DECODER, err, sizeof(err)) == 0);
        /* the sd preset against it: the message says what the file is */
        vae_preset(&c, "sd", err, sizeof(err));
        CHECK(vae_weights_check(w, &c, VAE_DECODER, err, sizeof(err)) == -1);
        fprintf(stderr, "sd preset on tiny weights: %s\n", err);
        CHECK(contains(err, "--channels 8,16,32,32") && contains(err, "--layers 1"));
        vae_weights_close(w);
    }
    check_encoder();
    check_config_json();

    /* 6. random weights depend on (seed, key) only; configs other than the preset are rejected */
    {
        vae_weights *a = NULL, *b = NULL;
        ASSERT_EQ_I(vae_weights_random(&a, seed, err, sizeof(err)), 0);
        ASSERT_EQ_I(vae_weights_random(&b, seed, err, sizeof(err)), 0);
        int64_t s1[4] = {16, 32, 3, 3}, s2[1] = {32};
        float x1[16 * 32 * 9], x2[16 * 32 * 9], g1[32], g2[32];
        ASSERT_EQ_I(vae_weights_get(a, "decoder.conv_in.weight", 4, s1, x1, err, sizeof(err)), 0);
        ASSERT_EQ_I(vae_weights_get(a, "decoder.conv_norm_out.weight", 1, s2, g1, err, sizeof(err)), 0);
        ASSERT_EQ_I(vae_weights_get(b, "decoder.conv_norm_out.weight", 1, s2, g2, err, sizeof(err)), 0);
        ASSERT_EQ_I(vae_weights_get(b, "decoder.conv_in.weight", 4, s1, x2, err, sizeof(err)), 0);
        CHECK(!memcmp(x1, x2, sizeof(x1)) && !memcmp(g1, g2, sizeof(g1)));
        double ss = 0, mean = 0;
        for (int i = 0; i < 16 * 32 * 9; i++) ss += (double)x1[i] * x1[i];
        for (int i = 0; i < 32; i++) mean += g1[i] / 32.0;
        double std = sqrt(ss / (16 * 32 * 9)), want = 1.0 / sqrt(32 * 9);
        fprintf(stderr, "random conv std %.4f (want %.4f), gamma mean %.4f\n", std, want, mean);
        CHECK(fabs(std - want) < 0.1 * want);
        CHECK(fabs(mean - 1.0) < 0.05);
        vae_weights_close(a);
        vae_weights_close(b);

        vae_config c;
        vae_preset(&c, "sd", err, sizeof(err));
        c.groups = 24; /* 128 % 24 != 0 */
        CHECK(vae_config_validate(&c, err, sizeof(err)) == -1 && contains(err, "24"));
        CHECK(vae_preset(&c, "sd4", err, sizeof(err)) == -1 && contains(err, "sd4"));
        /* --scaled-latent: z / scaling + shift */
        ASSERT_EQ_I(vae_preset(&c, "sd3", err, sizeof(err)), 0);
        float zz[2] = {1.5305f, 0.0f};
        vae_latent_unscale(&c, zz, 2);
        CHECK(fabsf(zz[0] - (1.0f + 0.0609f)) < 1e-6f && fabsf(zz[1] - 0.0609f) < 1e-7f);
    }

    const char *tmpdir = cw_test_tmpdir("cw_test_vae_");
    check_truncated_weights();
    cw_test_rm_tree(tmpdir);

    free(r.y);
    free(z);
    npy_free(&ref);
    cw_context_destroy(ctx);
    TEST_DONE();
}
