/* The one walk over diffusers' AutoencoderKL architecture: it builds the graph (vae_build),
 * checks a file's keys and shapes (and that every key is consumed), counts the weights'
 * bytes and exports them, so these cannot disagree. */
#include "vae_internal.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the walk -------------------------------------------------------------------- */

void vae__fail_ctx(bld *b, cw_status st, const char *what) {
    b->st = st;
    st_errf(b->err, b->errlen, "%s: %s: %s", what, cw_status_name(st), b->m ? cw_context_get_last_error(b->m->ctx) : "");
}

static int grow(bld *b, size_t n) {
    if (n <= b->buf_cap) return 0;
    float *p = realloc(b->buf, n * sizeof(float));
    if (!p) return -1;
    b->buf = p;
    b->buf_cap = n;
    return 0;
}

static int export_grow(vae_export *x) {
    if (x->n < x->cap) return 0;
    int cap = x->cap ? 2 * x->cap : 64;
    char **nm = realloc(x->names, (size_t)cap * sizeof(*nm));
    if (nm) x->names = nm;
    float **d = realloc(x->data, (size_t)cap * sizeof(*d));
    if (d) x->data = d;
    int64_t(*sh)[4] = realloc(x->shapes, (size_t)cap * sizeof(*sh));
    if (sh) x->shapes = sh;
    int *r = realloc(x->ranks, (size_t)cap * sizeof(*r));
    if (r) x->ranks = r;
    if (!nm || !d || !sh || !r) return -1;
    x->cap = cap;
    return 0;
}

/* Export mode: reads weight `key` into b->exp; attention projections become diffusers'
 * Linear [C, C] (the graph's 1x1 convs read [C, C, 1, 1]). */
static void export_param(bld *b, const char *key, int rank, const int64_t *shape) {
    vae_export *x = b->exp;
    int64_t n = 1;
    for (int i = 0; i < rank; i++) n *= shape[i];
    char *name = strdup(key);
    float *data = malloc((size_t)n * sizeof(float));
    if (!name || !data || export_grow(x)) {
        b->st = CW_ERR_OUT_OF_MEMORY;
        st_errf(b->err, b->errlen, "out of memory exporting '%s'", key);
    } else if (vae_weights_get(b->w, key, rank, shape, data, b->err, b->errlen)) {
        b->st = CW_ERR_FORMAT;
    }
    if (b->st != CW_OK) {
        free(name);
        free(data);
        return;
    }
    int linear = vae__is_attn_key(key);
    x->names[x->n] = name;
    x->data[x->n] = data;
    x->ranks[x->n] = linear && rank == 4 && shape[2] == 1 && shape[3] == 1 ? 2 : rank;
    memcpy(x->shapes[x->n], shape, (size_t)rank * sizeof(int64_t));
    x->n++;
}

/* Weight `key` as a constant of dtype dt (the model's for conv weights and biases, f32 for
 * GroupNorm's gamma and beta). */
static cw_node param(bld *b, const char *key, int rank, const int64_t *shape, cw_dtype dt) {
    if (b->st != CW_OK) return CW_NODE_NONE;
    if (!b->m && b->exp) {
        export_param(b, key, rank, shape);
        return 0;
    }
    if (!b->m) { /* check or count mode */
        int64_t n = 1;
        for (int i = 0; i < rank; i++) n *= shape[i];
        b->count += n * (int64_t)sizeof(float);
        if (!b->w || !b->w->st) return 0;
        const st_tensor *t;
        if (vae__lookup(b->w, key, rank, shape, &t, b->err, b->errlen)) b->st = CW_ERR_FORMAT;
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
    if (vae_weights_get_as(b->w, key, rank, shape, dt, b->buf, b->err, b->errlen)) {
        b->st = CW_ERR_FORMAT;
        return CW_NODE_NONE;
    }
    cw_tensor_desc d;
    cw_status st = cw_tensor_desc_make(&d, dt, rank, shape);
    if (st != CW_OK) {
        vae__fail_ctx(b, st, key);
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
    st = cw_tensor_create(&t, m->ctx, &d);
    if (st != CW_OK) {
        vae__fail_ctx(b, st, key);
        return CW_NODE_NONE;
    }
    m->consts[m->n_consts++] = t;
    size_t bytes = (size_t)n * cw_dtype_size(dt);
    st = cw_tensor_upload(t, b->buf, bytes);
    if (st != CW_OK) {
        vae__fail_ctx(b, st, key);
        return CW_NODE_NONE;
    }
    m->weights_bytes += (int64_t)bytes;
    cw_node node = CW_NODE_NONE;
    st = cw_graph_constant(b->g, &node, key, t);
    if (st != CW_OK) vae__fail_ctx(b, st, key);
    return node;
}

/* Graph ops run only while no error is recorded and not in check mode; they never
 * return early, so the check walk still visits every later key. */
#define GRAPH_OP(b, what, call)                  \
    do {                                         \
        if ((b)->st == CW_OK && (b)->m) {        \
            cw_status st_ = (call);              \
            if (st_ != CW_OK) vae__fail_ctx((b), st_, (what)); \
        }                                        \
    } while (0)

/* dst = prefix + suffix; keys are short (< 100 chars), KEY_LEN bytes always suffice */
static void join(char *dst, const char *prefix, const char *suffix) {
    size_t a = strlen(prefix), b = strlen(suffix);
    if (a >= KEY_LEN) a = KEY_LEN - 1;
    if (a + b >= KEY_LEN) b = KEY_LEN - 1 - a;
    memmove(dst, prefix, a);
    memcpy(dst + a, suffix, b);
    dst[a + b] = '\0';
}

static cw_node conv_p(bld *b, cw_node x, const char *prefix, int64_t cin, int64_t cout, int k, const cw_conv_params *p) {
    char kw[KEY_LEN], kb[KEY_LEN];
    join(kw, prefix, ".weight");
    join(kb, prefix, ".bias");
    int64_t ws[4] = {cout, cin, k, k}, bs[1] = {cout};
    cw_node w = param(b, kw, 4, ws, b->m ? b->m->dtype : CW_F32);
    cw_node bias = param(b, kb, 1, bs, b->m ? b->m->dtype : CW_F32);
    cw_node y = CW_NODE_NONE;
    GRAPH_OP(b, prefix, cw_graph_conv(b->g, &y, x, w, bias, p));
    return y;
}

/* a "same" convolution: stride 1, padding (k - 1) / 2 on every side */
static cw_node conv(bld *b, cw_node x, const char *prefix, int64_t cin, int64_t cout, int k) {
    cw_conv_params p = CW_CONV_PARAMS_INIT;
    p.pad_pre[0] = p.pad_pre[1] = p.pad_post[0] = p.pad_post[1] = (k - 1) / 2;
    return conv_p(b, x, prefix, cin, cout, k, &p);
}

static cw_node group_norm(bld *b, cw_node x, const char *prefix, int64_t c) {
    char kw[KEY_LEN], kb[KEY_LEN];
    join(kw, prefix, ".weight");
    join(kb, prefix, ".bias");
    int64_t s[1] = {c};
    cw_node gamma = param(b, kw, 1, s, CW_F32);
    cw_node beta = param(b, kb, 1, s, CW_F32);
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

/* Records x as the output of block `name` for the non-finite diagnosis. */
static void stage(bld *b, cw_node x, const char *name) {
    if (!b->stages || !b->m || b->st != CW_OK || b->m->n_stages == (int)(sizeof(b->m->stage) / sizeof(b->m->stage[0])))
        return;
    vae_model *m = b->m;
    m->stage[m->n_stages] = x;
    snprintf(m->stage_name[m->n_stages], sizeof(m->stage_name[0]), "%s", name);
    m->n_stages++;
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
    cw_node y = add(b, sc, h, prefix);
    stage(b, y, prefix);
    return y;
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
    cw_node y = add(b, o, x, prefix);
    stage(b, y, prefix);
    return y;
}

static cw_node upsample(bld *b, cw_node x, const char *prefix, int64_t c) {
    cw_node y = CW_NODE_NONE;
    GRAPH_OP(b, prefix, cw_graph_upsample2x(b->g, &y, x));
    char k[KEY_LEN];
    join(k, prefix, ".conv");
    y = conv(b, y, k, c, c, 3);
    stage(b, y, prefix);
    return y;
}

/* diffusers Downsample2D of the encoder (padding 0): F.pad(x, (0, 1, 0, 1)) then a 3x3
 * stride-2 conv, i.e. no padding before and one row / column after. */
static cw_node downsample(bld *b, cw_node x, const char *prefix, int64_t c) {
    cw_conv_params p = CW_CONV_PARAMS_INIT;
    p.stride[0] = p.stride[1] = 2;
    p.pad_post[0] = p.pad_post[1] = 1;
    char k[KEY_LEN];
    join(k, prefix, ".conv");
    cw_node y = conv_p(b, x, k, c, c, 3, &p);
    stage(b, y, prefix);
    return y;
}

static cw_node mid_block(bld *b, cw_node x, const char *prefix, int64_t c) {
    char k[KEY_LEN];
    join(k, prefix, ".resnets.0");
    x = resnet(b, x, k, c, c);
    if (b->cfg->mid_attention) {
        join(k, prefix, ".attentions.0");
        x = attention(b, x, k, c);
    }
    join(k, prefix, ".resnets.1");
    return resnet(b, x, k, c, c);
}

/* The whole decode: [post_quant_conv], conv_in, mid block, up blocks, norm/act/conv_out. */
cw_node vae__decoder(bld *b, cw_node z) {
    const vae_config *c = b->cfg;
    int64_t top = c->block_out[c->n_blocks - 1];
    cw_node x = z;
    if (c->post_quant_conv) {
        x = conv(b, x, "post_quant_conv", c->latent_channels, c->latent_channels, 1);
        stage(b, x, "post_quant_conv");
    }
    x = conv(b, x, "decoder.conv_in", c->latent_channels, top, 3);
    stage(b, x, "decoder.conv_in");
    x = mid_block(b, x, "decoder.mid_block", top);
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
    x = conv(b, x, "decoder.conv_out", c->block_out[0], c->out_channels, 3);
    stage(b, x, "decoder.conv_out");
    return x;
}

/* The whole encode up to the Gaussian's moments: conv_in, down blocks (layers_per_block
 * ResNets each, a stride-2 conv after all but the last), mid block, norm/act/conv_out to
 * 2 * latent channels, [quant_conv]. */
cw_node vae__encoder(bld *b, cw_node img) {
    const vae_config *c = b->cfg;
    int64_t top = c->block_out[c->n_blocks - 1], lc2 = 2 * (int64_t)c->latent_channels;
    cw_node x = conv(b, img, "encoder.conv_in", c->in_channels, c->block_out[0], 3);
    stage(b, x, "encoder.conv_in");
    int64_t prev = c->block_out[0];
    for (int i = 0; i < c->n_blocks; i++) {
        int64_t out = c->block_out[i];
        char k[KEY_LEN];
        for (int j = 0; j < c->layers_per_block; j++) {
            snprintf(k, sizeof(k), "encoder.down_blocks.%d.resnets.%d", i, j);
            x = resnet(b, x, k, j == 0 ? prev : out, out);
        }
        if (i != c->n_blocks - 1) {
            snprintf(k, sizeof(k), "encoder.down_blocks.%d.downsamplers.0", i);
            x = downsample(b, x, k, out);
        }
        prev = out;
    }
    x = mid_block(b, x, "encoder.mid_block", top);
    x = group_norm(b, x, "encoder.conv_norm_out", top);
    x = silu(b, x, "encoder.conv_norm_out");
    x = conv(b, x, "encoder.conv_out", top, lc2, 3);
    stage(b, x, "encoder.conv_out");
    if (c->quant_conv) {
        x = conv(b, x, "quant_conv", lc2, lc2, 1);
        stage(b, x, "quant_conv");
    }
    return x;
}

int64_t vae_weights_bytes(const vae_config *cfg, int parts) {
    bld b = {0};
    b.cfg = cfg;
    if (parts & VAE_ENCODER) vae__encoder(&b, 0);
    if (parts & VAE_DECODER) vae__decoder(&b, 0);
    return b.count;
}

int vae_weights_export(vae_weights *w, const vae_config *cfg, int parts, const char *path, char *err, size_t errlen) {
    if (vae_weights_check(w, cfg, parts, err, errlen)) return -1;
    vae_export x = {0};
    bld b = {0};
    b.w = w;
    b.cfg = cfg;
    b.err = err;
    b.errlen = errlen;
    b.exp = &x;
    if (parts & VAE_ENCODER) vae__encoder(&b, 0);
    if (b.st == CW_OK && (parts & VAE_DECODER)) vae__decoder(&b, 0);
    int rc = -1;
    const int64_t **shapes = malloc((size_t)(x.n + 1) * sizeof(*shapes));
    if (!shapes) st_errf(err, errlen, "out of memory");
    if (b.st == CW_OK && shapes) {
        for (int i = 0; i < x.n; i++) shapes[i] = x.shapes[i];
        rc = st_write(path, x.n, (const char *const *)x.names, shapes, x.ranks, (const float *const *)x.data, err, errlen);
    }
    free(shapes);
    for (int i = 0; i < x.n; i++) free(x.names[i]), free(x.data[i]);
    free(x.names), free(x.data), free(x.shapes), free(x.ranks);
    return rc;
}

/* " (the file's shapes say: --channels 8,16 --layers 1 ...)" for the fields where the file
 * disagrees with cfg, or "" when it agrees or cannot tell. */
static void arch_hint(vae_weights *w, const vae_config *cfg, char *buf, size_t len) {
    buf[0] = '\0';
    vae_config x = *cfg;
    if (vae_weights_infer(w, &x, NULL, 0)) return;
    char s[256] = "";
    size_t o = 0;
#define HINT(...) o += (size_t)snprintf(s + o, o < sizeof(s) ? sizeof(s) - o : 0, __VA_ARGS__)
    int same = x.n_blocks == cfg->n_blocks;
    for (int i = 0; same && i < x.n_blocks; i++) same = x.block_out[i] == cfg->block_out[i];
    if (!same) {
        HINT(" --channels ");
        for (int i = 0; i < x.n_blocks; i++) HINT("%s%" PRId64, i ? "," : "", x.block_out[i]);
    }
    if (x.layers_per_block != cfg->layers_per_block) HINT(" --layers %d", x.layers_per_block);
    if (x.latent_channels != cfg->latent_channels) HINT(" --latent-channels %d", x.latent_channels);
    if (x.in_channels != cfg->in_channels) HINT(" --in-channels %d", x.in_channels);
    if (x.out_channels != cfg->out_channels) HINT(" --out-channels %d", x.out_channels);
    if (x.quant_conv != cfg->quant_conv) HINT(" --quant-conv %d", x.quant_conv);
    if (x.post_quant_conv != cfg->post_quant_conv) HINT(" --post-quant-conv %d", x.post_quant_conv);
    if (x.mid_attention != cfg->mid_attention) HINT(" --mid-attention %d", x.mid_attention);
#undef HINT
    if (s[0] && o < sizeof(s)) snprintf(buf, len, " (the file's shapes say:%s)", s);
}

int vae_weights_check(vae_weights *w, const vae_config *cfg, int parts, char *err, size_t errlen) {
    if (vae_config_validate(cfg, err, errlen)) return -1;
    if (!w->st) return 0;
    size_t n = st_count(w->st);
    memset(w->used, 0, n);
    parts |= vae_weights_parts(w);
    bld b = {0};
    b.w = w;
    b.cfg = cfg;
    b.err = err;
    b.errlen = errlen;
    if (parts & VAE_ENCODER) vae__encoder(&b, 0);
    if (b.st == CW_OK && (parts & VAE_DECODER)) vae__decoder(&b, 0);
    char hint[300];
    if (b.st != CW_OK) {
        arch_hint(w, cfg, hint, sizeof(hint));
        if (hint[0]) {
            char tmp[VAE_ERR_LEN];
            snprintf(tmp, sizeof(tmp), "%s", err);
            st_errf(err, errlen, "%s%s", tmp, hint);
        }
        return -1;
    }
    size_t first = n, extra = 0;
    for (size_t i = 0; i < n; i++)
        if (!w->used[i]) {
            if (first == n) first = i;
            else extra++;
        }
    if (first == n) return 0;
    arch_hint(w, cfg, hint, sizeof(hint));
    char more[48] = "";
    if (extra) snprintf(more, sizeof(more), " (and %zu more)", extra);
    return st_errf(err, errlen, "weights: key '%s'%s is not part of the %s model: weights of another "
                   "architecture%s", st_at(w->st, first)->name, more, cfg->name,
                   hint[0] ? hint : " (or of another model)");
}
