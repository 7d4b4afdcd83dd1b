/* AutoencoderKL decoder as a convweave graph: presets, weight sources (diffusers
 * .safetensors or seeded random) and the graph builder. One walk over the architecture
 * serves both the up-front key/shape check and the build, so they cannot disagree. */
#include "vae.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "npy.h"
#include "safetensors.h"

/* ---- presets ----------------------------------------------------------------------------- */

static void preset_sd_like(vae_config *c, const char *name, int latent, int pqc, double sf, double shift) {
    memset(c, 0, sizeof(*c));
    snprintf(c->name, sizeof(c->name), "%s", name);
    c->latent_channels = latent;
    c->out_channels = 3;
    c->n_blocks = 4;
    c->block_out[0] = 128;
    c->block_out[1] = 256;
    c->block_out[2] = 512;
    c->block_out[3] = 512;
    c->layers_per_block = 2;
    c->groups = 32;
    c->eps = 1e-6f;
    c->post_quant_conv = pqc;
    c->scaling_factor = sf;
    c->shift_factor = shift;
}

const char *vae_preset_names(void) { return "sd, sdxl, sd3, flux, tiny"; }

int vae_preset(vae_config *cfg, const char *name, char *err, size_t errlen) {
    if (!name) return st_errf(err, errlen, "--preset: missing name (known: %s)", vae_preset_names());
    if (!strcmp(name, "sd")) {
        preset_sd_like(cfg, "sd", 4, 1, 0.18215, 0.0);
    } else if (!strcmp(name, "sdxl")) {
        preset_sd_like(cfg, "sdxl", 4, 1, 0.13025, 0.0);
    } else if (!strcmp(name, "sd3")) {
        preset_sd_like(cfg, "sd3", 16, 0, 1.5305, 0.0609);
    } else if (!strcmp(name, "flux")) {
        preset_sd_like(cfg, "flux", 16, 0, 0.3611, 0.1159);
    } else if (!strcmp(name, "tiny")) {
        /* tests/fixtures/tiny_config.json (the test checks they agree) */
        preset_sd_like(cfg, "tiny", 4, 1, 0.18215, 0.0);
        cfg->block_out[0] = 8;
        cfg->block_out[1] = 16;
        cfg->block_out[2] = 32;
        cfg->block_out[3] = 32;
        cfg->layers_per_block = 1;
        cfg->groups = 4;
    } else {
        return st_errf(err, errlen, "--preset: unknown preset '%s' (known: %s)", name, vae_preset_names());
    }
    return 0;
}

int vae_parse_channels(vae_config *cfg, const char *list, char *err, size_t errlen) {
    int n = 0;
    const char *p = list;
    int64_t v[VAE_MAX_BLOCKS];
    if (!list || !*list) return st_errf(err, errlen, "--channels: empty list");
    for (;;) {
        char *end = NULL;
        long long x = strtoll(p, &end, 10);
        if (end == p || x < 1 || x > (1 << 20))
            return st_errf(err, errlen, "--channels: bad channel count at '%s' in '%s'", p, list);
        if (n == VAE_MAX_BLOCKS) return st_errf(err, errlen, "--channels: more than %d blocks in '%s'", VAE_MAX_BLOCKS, list);
        v[n++] = x;
        if (*end == '\0') break;
        if (*end != ',') return st_errf(err, errlen, "--channels: expected ',' at '%s' in '%s'", end, list);
        p = end + 1;
    }
    cfg->n_blocks = n;
    for (int i = 0; i < VAE_MAX_BLOCKS; i++) cfg->block_out[i] = i < n ? v[i] : 0;
    return 0;
}

int vae_config_validate(const vae_config *c, char *err, size_t errlen) {
    if (c->latent_channels < 1 || c->latent_channels > 4096)
        return st_errf(err, errlen, "latent channels %d out of range [1, 4096]", c->latent_channels);
    if (c->out_channels < 1) return st_errf(err, errlen, "out channels %d < 1", c->out_channels);
    if (c->n_blocks < 1 || c->n_blocks > VAE_MAX_BLOCKS)
        return st_errf(err, errlen, "block count %d out of range [1, %d]", c->n_blocks, VAE_MAX_BLOCKS);
    if (c->layers_per_block < 0 || c->layers_per_block > 64)
        return st_errf(err, errlen, "layers per block %d out of range [0, 64]", c->layers_per_block);
    if (c->groups < 1) return st_errf(err, errlen, "norm groups %d < 1", c->groups);
    for (int i = 0; i < c->n_blocks; i++)
        if (c->block_out[i] < 1 || c->block_out[i] % c->groups)
            return st_errf(err, errlen, "block channels %" PRId64 " (block %d) not a positive multiple of %d groups",
                        c->block_out[i], i, c->groups);
    if (!(c->scaling_factor > 0.0) || !isfinite(c->shift_factor))
        return st_errf(err, errlen, "scaling factor %g must be > 0 and shift %g finite", c->scaling_factor,
                    c->shift_factor);
    return 0;
}

int64_t vae_upscale(const vae_config *cfg) { return (int64_t)1 << (cfg->n_blocks - 1); }

/* ---- weight sources ------------------------------------------------------------------------ */

struct vae_weights {
    st_file *st;    /* NULL: random */
    uint64_t seed;
};

int vae_weights_open_file(vae_weights **out, const char *path, char *err, size_t errlen) {
    *out = NULL;
    vae_weights *w = calloc(1, sizeof(*w));
    if (!w) return st_errf(err, errlen, "out of memory");
    char msg[VAE_ERR_LEN];
    if (st_open(&w->st, path, msg, sizeof(msg)) != 0) {
        free(w);
        return st_errf(err, errlen, "--weights: %s", msg); /* msg names the file */
    }
    *out = w;
    return 0;
}

int vae_weights_random(vae_weights **out, uint64_t seed, char *err, size_t errlen) {
    *out = calloc(1, sizeof(**out));
    if (!*out) return st_errf(err, errlen, "out of memory");
    (*out)->seed = seed;
    return 0;
}

void vae_weights_close(vae_weights *w) {
    if (!w) return;
    st_close(w->st);
    free(w);
}

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* uniform in [-1, 1) */
static double unit(uint64_t *s) { return (double)(splitmix(s) >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0; }

static uint64_t fnv1a(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !memcmp(s + a - b, suffix, b);
}

static void random_fill(uint64_t seed, const char *key, int rank, const int64_t *shape, float *dst, int64_t n) {
    uint64_t s = seed ^ fnv1a(key);
    splitmix(&s);
    /* the module name is the key without ".weight"/".bias": norms contain "norm" */
    const char *dot = strrchr(key, '.');
    size_t mlen = dot ? (size_t)(dot - key) : strlen(key);
    const char *mod = key;
    for (const char *p = key; p < key + mlen; p++)
        if (*p == '.') mod = p + 1;
    int is_norm = 0;
    for (const char *p = mod; p + 4 <= key + mlen; p++)
        if (!memcmp(p, "norm", 4)) is_norm = 1;
    int is_weight = ends_with(key, ".weight");
    if (rank >= 2) {
        int64_t fan_in = 1;
        for (int i = 1; i < rank; i++) fan_in *= shape[i];
        double a = sqrt(3.0 / (double)fan_in); /* uniform [-a, a] has std 1/sqrt(fan_in) */
        for (int64_t i = 0; i < n; i++) dst[i] = (float)(a * unit(&s));
    } else if (is_norm && is_weight) {
        for (int64_t i = 0; i < n; i++) dst[i] = (float)(1.0 + 0.1 * unit(&s));
    } else {
        double a = is_norm ? 0.1 : 0.05;
        for (int64_t i = 0; i < n; i++) dst[i] = (float)(a * unit(&s));
    }
}

static void shape_str(char *buf, size_t len, int rank, const int64_t *shape) {
    size_t o = 0;
    o += (size_t)snprintf(buf + o, len - o, "[");
    for (int i = 0; i < rank && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%" PRId64, i ? ", " : "", shape[i]);
    if (o < len) snprintf(buf + o, len - o, "]");
}

/* Legacy attention names of the current ones (old diffusers checkpoints). */
static const char *const attn_names[][2] = {
    {".to_q.", ".query."}, {".to_k.", ".key."}, {".to_v.", ".value."}, {".to_out.0.", ".proj_attn."}};

static const st_tensor *find_key(const st_file *f, const char *key, int *is_attn, char *used, size_t usedlen) {
    *is_attn = 0;
    snprintf(used, usedlen, "%s", key);
    const st_tensor *t = st_find(f, key);
    for (size_t i = 0; i < sizeof(attn_names) / sizeof(attn_names[0]); i++) {
        const char *p = strstr(key, attn_names[i][0]);
        if (!p) continue;
        *is_attn = 1;
        if (t) break;
        snprintf(used, usedlen, "%.*s%s%s", (int)(p - key), key, attn_names[i][1], p + strlen(attn_names[i][0]));
        t = st_find(f, used);
        break;
    }
    return t;
}

static int lookup(vae_weights *w, const char *key, int rank, const int64_t *shape, const st_tensor **out,
                  char *err, size_t errlen) {
    int is_attn;
    char used[256];
    const st_tensor *t = find_key(w->st, key, &is_attn, used, sizeof(used));
    if (!t) {
        if (is_attn) return st_errf(err, errlen, "weights: missing key '%s' (nor its legacy name '%s')", key, used);
        return st_errf(err, errlen, "weights: missing key '%s'", key);
    }
    int ok = t->rank == rank;
    for (int i = 0; ok && i < rank; i++) ok = t->shape[i] == shape[i];
    /* Linear [C_out, C_in] is the 1x1 conv [C_out, C_in, 1, 1] */
    if (!ok && is_attn && rank == 4 && shape[2] == 1 && shape[3] == 1 && t->rank == 2)
        ok = t->shape[0] == shape[0] && t->shape[1] == shape[1];
    if (!ok) {
        char a[128], b[128];
        shape_str(a, sizeof(a), t->rank, t->shape);
        shape_str(b, sizeof(b), rank, shape);
        return st_errf(err, errlen, "weights: key '%s' has shape %s, expected %s", used, a, b);
    }
    *out = t;
    return 0;
}

int vae_weights_get(vae_weights *w, const char *key, int rank, const int64_t *shape, float *dst, char *err,
                    size_t errlen) {
    int64_t n = 1;
    for (int i = 0; i < rank; i++) n *= shape[i];
    if (!w->st) {
        random_fill(w->seed, key, rank, shape, dst, n);
        return 0;
    }
    const st_tensor *t;
    if (lookup(w, key, rank, shape, &t, err, errlen)) return -1;
    char msg[VAE_ERR_LEN];
    if (st_read_f32(w->st, t, dst, (size_t)n, msg, sizeof(msg)))
        return st_errf(err, errlen, "weights: key '%s': %s", key, msg);
    return 0;
}

/* ---- the graph builder -------------------------------------------------------------------- */

typedef struct bld {
    vae_model *m;          /* NULL: check keys and shapes only */
    cw_graph *g;
    vae_weights *w;
    const vae_config *cfg;
    cw_status st;
    char *err;
    size_t errlen;
    float *buf;            /* f32 staging for one weight */
    void *cvt;             /* dtype staging */
    size_t buf_cap;
} bld;

static void fail_ctx(bld *b, cw_status st, const char *what) {
    b->st = st;
    st_errf(b->err, b->errlen, "%s: %s: %s", what, cw_status_name(st), b->m ? cw_context_last_error(b->m->ctx) : "");
}

static int grow(bld *b, size_t n) {
    if (n <= b->buf_cap) return 0;
    float *p = realloc(b->buf, n * sizeof(float));
    if (!p) return -1;
    b->buf = p;
    void *q = realloc(b->cvt, n * sizeof(float));
    if (!q) return -1;
    b->cvt = q;
    b->buf_cap = n;
    return 0;
}

static cw_node param(bld *b, const char *key, int rank, const int64_t *shape) {
    if (b->st != CW_OK) return CW_NODE_NONE;
    if (!b->m) { /* check mode */
        if (!b->w->st) return 0;
        const st_tensor *t;
        if (lookup(b->w, key, rank, shape, &t, b->err, b->errlen)) b->st = CW_ERR_FORMAT;
        return 0;
    }
    vae_model *m = b->m;
    int64_t n = 1;
    for (int i = 0; i < rank; i++) n *= shape[i];
    if (grow(b, (size_t)n)) {
        b->st = CW_ERR_OUT_OF_MEMORY;
        st_errf(b->err, b->errlen, "out of memory loading '%s'", key);
        return CW_NODE_NONE;
    }
    if (vae_weights_get(b->w, key, rank, shape, b->buf, b->err, b->errlen)) {
        b->st = CW_ERR_FORMAT;
        return CW_NODE_NONE;
    }
    cw_tensor_desc d;
    cw_status st = cw_tensor_desc_make(&d, m->dtype, rank, shape);
    if (st != CW_OK) {
        fail_ctx(b, st, key);
        return CW_NODE_NONE;
    }
    if (m->n_consts == m->cap_consts) {
        int cap = m->cap_consts ? 2 * m->cap_consts : 64;
        cw_tensor **p = realloc(m->consts, (size_t)cap * sizeof(*p));
        if (!p) {
            b->st = CW_ERR_OUT_OF_MEMORY;
            st_errf(b->err, b->errlen, "out of memory");
            return CW_NODE_NONE;
        }
        m->consts = p;
        m->cap_consts = cap;
    }
    cw_tensor *t = NULL;
    st = cw_tensor_create(m->ctx, &t, &d);
    if (st != CW_OK) {
        fail_ctx(b, st, key);
        return CW_NODE_NONE;
    }
    m->consts[m->n_consts++] = t;
    const void *src = b->buf;
    size_t bytes = (size_t)n * sizeof(float);
    if (m->dtype != CW_F32) {
        uint16_t *h = b->cvt;
        for (int64_t i = 0; i < n; i++) h[i] = m->dtype == CW_F16 ? st_f32_to_f16(b->buf[i]) : st_f32_to_bf16(b->buf[i]);
        src = h;
        bytes = (size_t)n * 2;
    }
    st = cw_tensor_upload(t, src, bytes);
    if (st != CW_OK) {
        fail_ctx(b, st, key);
        return CW_NODE_NONE;
    }
    m->weights_bytes += (int64_t)bytes;
    cw_node node = CW_NODE_NONE;
    st = cw_graph_constant(b->g, &node, key, t);
    if (st != CW_OK) fail_ctx(b, st, key);
    return node;
}

/* Graph ops run only while no error is recorded and not in check mode; they never
 * return early, so the check walk still visits every later key. */
#define GRAPH_OP(b, what, call)                  \
    do {                                         \
        if ((b)->st == CW_OK && (b)->m) {        \
            cw_status st_ = (call);              \
            if (st_ != CW_OK) fail_ctx((b), st_, (what)); \
        }                                        \
    } while (0)

#define KEY_LEN 256
/* dst = prefix + suffix; keys are short (< 100 chars), KEY_LEN bytes always suffice */
static void join(char *dst, const char *prefix, const char *suffix) {
    size_t a = strlen(prefix), b = strlen(suffix);
    if (a >= KEY_LEN) a = KEY_LEN - 1;
    if (a + b >= KEY_LEN) b = KEY_LEN - 1 - a;
    memmove(dst, prefix, a);
    memcpy(dst + a, suffix, b);
    dst[a + b] = '\0';
}

static cw_node conv(bld *b, cw_node x, const char *prefix, int64_t cin, int64_t cout, int k) {
    char kw[KEY_LEN], kb[KEY_LEN];
    join(kw, prefix, ".weight");
    join(kb, prefix, ".bias");
    int64_t ws[4] = {cout, cin, k, k}, bs[1] = {cout};
    cw_node w = param(b, kw, 4, ws);
    cw_node bias = param(b, kb, 1, bs);
    cw_conv_params p = CW_CONV_PARAMS_INIT;
    p.pad_pre[0] = p.pad_pre[1] = p.pad_post[0] = p.pad_post[1] = (k - 1) / 2;
    cw_node y = CW_NODE_NONE;
    GRAPH_OP(b, prefix, cw_graph_conv(b->g, &y, x, w, bias, &p));
    return y;
}

static cw_node group_norm(bld *b, cw_node x, const char *prefix, int64_t c) {
    char kw[KEY_LEN], kb[KEY_LEN];
    join(kw, prefix, ".weight");
    join(kb, prefix, ".bias");
    int64_t s[1] = {c};
    cw_node gamma = param(b, kw, 1, s);
    cw_node beta = param(b, kb, 1, s);
    cw_node y = CW_NODE_NONE;
    GRAPH_OP(b, prefix, cw_graph_group_norm(b->g, &y, x, gamma, beta, b->cfg->groups, b->cfg->eps));
    return y;
}

static cw_node silu(bld *b, cw_node x, const char *what) {
    cw_node y = CW_NODE_NONE;
    GRAPH_OP(b, what, cw_graph_silu(b->g, &y, x));
    return y;
}

static cw_node add(bld *b, cw_node x, cw_node r, const char *what) {
    cw_node y = CW_NODE_NONE;
    GRAPH_OP(b, what, cw_graph_add(b->g, &y, x, r));
    return y;
}

/* diffusers ResnetBlock2D without time embedding:
 * h = conv2(silu(norm2(conv1(silu(norm1(x)))))); out = shortcut(x) + h. */
static cw_node resnet(bld *b, cw_node x, const char *prefix, int64_t cin, int64_t cout) {
    char k[KEY_LEN];
    join(k, prefix, ".norm1");
    cw_node h = group_norm(b, x, k, cin);
    h = silu(b, h, k);
    join(k, prefix, ".conv1");
    h = conv(b, h, k, cin, cout, 3);
    join(k, prefix, ".norm2");
    h = group_norm(b, h, k, cout);
    h = silu(b, h, k);
    join(k, prefix, ".conv2");
    h = conv(b, h, k, cout, cout, 3);
    cw_node sc = x;
    if (cin != cout) {
        join(k, prefix, ".conv_shortcut");
        sc = conv(b, x, k, cin, cout, 1);
    }
    return add(b, sc, h, prefix);
}

/* diffusers Attention as the VAE mid block builds it: one head of dim C, GroupNorm first,
 * q/k/v/out Linear layers over channels (1x1 convs here), scale 1/sqrt(C), residual. */
static cw_node attention(bld *b, cw_node x, const char *prefix, int64_t c) {
    char k[KEY_LEN];
    join(k, prefix, ".group_norm");
    cw_node h = group_norm(b, x, k, c);
    join(k, prefix, ".to_q");
    cw_node q = conv(b, h, k, c, c, 1);
    join(k, prefix, ".to_k");
    cw_node kk = conv(b, h, k, c, c, 1);
    join(k, prefix, ".to_v");
    cw_node v = conv(b, h, k, c, c, 1);
    cw_node o = CW_NODE_NONE;
    GRAPH_OP(b, prefix, cw_graph_attention(b->g, &o, q, kk, v, (float)(1.0 / sqrt((double)c))));
    join(k, prefix, ".to_out.0");
    o = conv(b, o, k, c, c, 1);
    return add(b, o, x, prefix);
}

static cw_node upsample(bld *b, cw_node x, const char *prefix, int64_t c) {
    cw_node y = CW_NODE_NONE;
    GRAPH_OP(b, prefix, cw_graph_upsample2x(b->g, &y, x));
    char k[KEY_LEN];
    join(k, prefix, ".conv");
    return conv(b, y, k, c, c, 3);
}

/* The whole decode: [post_quant_conv], conv_in, mid block, up blocks, norm/act/conv_out. */
static cw_node decoder(bld *b, cw_node z) {
    const vae_config *c = b->cfg;
    int64_t top = c->block_out[c->n_blocks - 1];
    cw_node x = z;
    if (c->post_quant_conv) x = conv(b, x, "post_quant_conv", c->latent_channels, c->latent_channels, 1);
    x = conv(b, x, "decoder.conv_in", c->latent_channels, top, 3);
    x = resnet(b, x, "decoder.mid_block.resnets.0", top, top);
    x = attention(b, x, "decoder.mid_block.attentions.0", top);
    x = resnet(b, x, "decoder.mid_block.resnets.1", top, top);
    int64_t prev = top;
    for (int i = 0; i < c->n_blocks; i++) {
        int64_t out = c->block_out[c->n_blocks - 1 - i];
        char k[KEY_LEN];
        for (int j = 0; j <= c->layers_per_block; j++) {
            snprintf(k, sizeof(k), "decoder.up_blocks.%d.resnets.%d", i, j);
            x = resnet(b, x, k, j == 0 ? prev : out, out);
        }
        if (i != c->n_blocks - 1) {
            snprintf(k, sizeof(k), "decoder.up_blocks.%d.upsamplers.0", i);
            x = upsample(b, x, k, out);
        }
        prev = out;
    }
    x = group_norm(b, x, "decoder.conv_norm_out", c->block_out[0]);
    x = silu(b, x, "decoder.conv_norm_out");
    return conv(b, x, "decoder.conv_out", c->block_out[0], c->out_channels, 3);
}

int vae_weights_check(vae_weights *w, const vae_config *cfg, char *err, size_t errlen) {
    if (vae_config_validate(cfg, err, errlen)) return -1;
    bld b = {0};
    b.w = w;
    b.cfg = cfg;
    b.err = err;
    b.errlen = errlen;
    decoder(&b, 0);
    return b.st == CW_OK ? 0 : -1;
}

cw_status vae_build(vae_model **out, cw_context *ctx, const vae_config *cfg, vae_weights *w, int64_t latent_h,
                    int64_t latent_w, cw_dtype dt, char *err, size_t errlen) {
    *out = NULL;
    if (vae_config_validate(cfg, err, errlen)) return CW_ERR_INVALID_ARG;
    if (latent_h < 1 || latent_w < 1) {
        st_errf(err, errlen, "latent size %" PRId64 "x%" PRId64 " must be positive", latent_h, latent_w);
        return CW_ERR_INVALID_ARG;
    }
    /* fail on a bad key before allocating anything */
    if (vae_weights_check(w, cfg, err, errlen)) return CW_ERR_FORMAT;
    vae_model *m = calloc(1, sizeof(*m));
    if (!m) {
        st_errf(err, errlen, "out of memory");
        return CW_ERR_OUT_OF_MEMORY;
    }
    m->ctx = ctx;
    m->dtype = dt;
    bld b = {0};
    b.m = m;
    b.w = w;
    b.cfg = cfg;
    b.err = err;
    b.errlen = errlen;
    cw_status st = cw_graph_create(&m->graph, ctx);
    if (st != CW_OK) {
        fail_ctx(&b, st, "cw_graph_create");
        goto fail;
    }
    b.g = m->graph;
    int64_t dims[4] = {1, cfg->latent_channels, latent_h, latent_w};
    st = cw_tensor_desc_make(&m->in_desc, dt, 4, dims);
    if (st == CW_OK) st = cw_graph_input(m->graph, &m->input, "latent", &m->in_desc);
    if (st != CW_OK) {
        fail_ctx(&b, st, "latent input");
        goto fail;
    }
    m->output = decoder(&b, m->input);
    if (b.st != CW_OK) goto fail;
    st = cw_graph_output(m->graph, m->output, "sample");
    if (st == CW_OK) st = cw_graph_node_desc(m->graph, m->output, &m->out_desc);
    if (st != CW_OK) {
        fail_ctx(&b, st, "output");
        goto fail;
    }
    free(b.buf);
    free(b.cvt);
    *out = m;
    return CW_OK;
fail:
    free(b.buf);
    free(b.cvt);
    vae_model_destroy(m);
    return b.st != CW_OK ? b.st : CW_ERR_INTERNAL;
}

void vae_model_destroy(vae_model *m) {
    if (!m) return;
    cw_graph_destroy(m->graph);
    for (int i = 0; i < m->n_consts; i++) cw_tensor_destroy(m->consts[i]);
    free(m->consts);
    free(m);
}

cw_status vae_compile(vae_model *m, const cw_compile_options *opt, cw_plan **plan, char *err, size_t errlen) {
    *plan = NULL;
    cw_status st = cw_graph_compile(m->graph, plan, opt);
    if (st != CW_OK) st_errf(err, errlen, "compile: %s", cw_context_last_error(m->ctx));
    return st;
}

cw_status vae_decode(vae_model *m, cw_plan *plan, const float *latent, float *out, char *err, size_t errlen) {
    cw_tensor *x = NULL, *y = NULL;
    int64_t nin = cw_tensor_desc_numel(&m->in_desc), nout = cw_tensor_desc_numel(&m->out_desc);
    size_t es = cw_dtype_size(m->dtype);
    uint16_t *tmp = NULL;
    const char *what = "input tensor";
    cw_status st = cw_tensor_create(m->ctx, &x, &m->in_desc);
    if (st != CW_OK) goto done;
    what = "output tensor";
    st = cw_tensor_create(m->ctx, &y, &m->out_desc);
    if (st != CW_OK) goto done;
    what = "upload";
    if (m->dtype == CW_F32) {
        st = cw_tensor_upload(x, latent, (size_t)nin * es);
    } else {
        tmp = malloc((size_t)(nin > nout ? nin : nout) * sizeof(uint16_t));
        if (!tmp) {
            st = CW_ERR_OUT_OF_MEMORY;
            goto done;
        }
        for (int64_t i = 0; i < nin; i++) tmp[i] = m->dtype == CW_F16 ? st_f32_to_f16(latent[i]) : st_f32_to_bf16(latent[i]);
        st = cw_tensor_upload(x, tmp, (size_t)nin * es);
    }
    if (st != CW_OK) goto done;
    what = "run";
    st = cw_plan_run(plan, &x, 1, &y, 1);
    if (st != CW_OK) goto done;
    what = "download";
    if (m->dtype == CW_F32) {
        st = cw_tensor_download(y, out, (size_t)nout * es);
    } else {
        st = cw_tensor_download(y, tmp, (size_t)nout * es);
        for (int64_t i = 0; st == CW_OK && i < nout; i++)
            out[i] = m->dtype == CW_F16 ? st_f16_to_f32(tmp[i]) : st_bf16_to_f32(tmp[i]);
    }
done:
    if (st != CW_OK) st_errf(err, errlen, "%s: %s: %s", what, cw_status_name(st), cw_context_last_error(m->ctx));
    free(tmp);
    cw_tensor_destroy(x);
    cw_tensor_destroy(y);
    return st;
}

/* ---- latents ------------------------------------------------------------------------------- */

static int latent_dims(const int64_t *shape, int rank, int64_t dims[4], const char *path, char *err, size_t errlen) {
    if (rank == 3) {
        dims[0] = 1;
        memcpy(dims + 1, shape, 3 * sizeof(int64_t));
    } else if (rank == 4 && shape[0] == 1) {
        memcpy(dims, shape, 4 * sizeof(int64_t));
    } else {
        char s[128];
        shape_str(s, sizeof(s), rank, shape);
        return st_errf(err, errlen, "--latent %s: shape %s, expected [C, h, w] or [1, C, h, w]", path, s);
    }
    for (int i = 0; i < 4; i++)
        if (dims[i] < 1) return st_errf(err, errlen, "--latent %s: empty dimension %d", path, i);
    return 0;
}

int vae_latent_load(const char *path, float **out, int64_t dims[4], char *err, size_t errlen) {
    *out = NULL;
    char msg[VAE_ERR_LEN];
    if (ends_with(path, ".npy")) {
        npy_array a;
        if (npy_read(path, &a, msg, sizeof(msg))) return st_errf(err, errlen, "--latent %s: %s", path, msg);
        if (latent_dims(a.shape, a.rank, dims, path, err, errlen)) {
            npy_free(&a);
            return -1;
        }
        *out = a.data; /* malloc'ed by npy_read: the caller free()s it */
        return 0;
    }
    st_file *f = NULL;
    if (st_open(&f, path, msg, sizeof(msg))) return st_errf(err, errlen, "--latent %s: %s", path, msg);
    if (st_count(f) != 1) {
        st_errf(err, errlen, "--latent %s: %zu tensors, expected exactly one", path, st_count(f));
        st_close(f);
        return -1;
    }
    const st_tensor *t = st_at(f, 0);
    if (latent_dims(t->shape, t->rank, dims, path, err, errlen)) {
        st_close(f);
        return -1;
    }
    float *d = malloc((size_t)t->numel * sizeof(float));
    if (!d) {
        st_close(f);
        return st_errf(err, errlen, "--latent %s: out of memory", path);
    }
    if (st_read_f32(f, t, d, (size_t)t->numel, msg, sizeof(msg))) {
        free(d);
        st_close(f);
        return st_errf(err, errlen, "--latent %s: %s", path, msg);
    }
    st_close(f);
    *out = d;
    return 0;
}

void vae_latent_random(float *dst, size_t n, uint64_t seed) {
    uint64_t s = seed ^ 0x6c6174656e74ull; /* "latent": a stream apart from the weights */
    for (size_t i = 0; i < n; i += 2) {
        /* Box-Muller; u1 in (0, 1] so log() is finite */
        double u1 = ((double)(splitmix(&s) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
        double u2 = (double)(splitmix(&s) >> 11) * (1.0 / 9007199254740992.0);
        double r = sqrt(-2.0 * log(u1));
        dst[i] = (float)(r * cos(2.0 * M_PI * u2));
        if (i + 1 < n) dst[i + 1] = (float)(r * sin(2.0 * M_PI * u2));
    }
}

void vae_latent_unscale(const vae_config *cfg, float *z, size_t n) {
    for (size_t i = 0; i < n; i++) z[i] = (float)((double)z[i] / cfg->scaling_factor + cfg->shift_factor);
}
