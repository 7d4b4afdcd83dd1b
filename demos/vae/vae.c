/* AutoencoderKL encoder and decoder as convweave graphs: weight sources (diffusers
 * .safetensors or seeded random) and the graph builders. One walk over the architecture
 * serves the up-front key/shape check (which also proves every key of the file is
 * consumed), the weight count and the build, so they cannot disagree. */
#include "vae.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "npy.h"
#include "safetensors.h"

/* ---- weight sources ------------------------------------------------------------------------ */

struct vae_weights {
    st_file *st;            /* NULL: random */
    uint64_t seed;
    int allow_nonfinite;
    unsigned char *used;    /* per tensor (header order): consumed by the last check walk */
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
    w->used = calloc(st_count(w->st) + 1, 1);
    if (!w->used) {
        vae_weights_close(w);
        return st_errf(err, errlen, "out of memory");
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
    free(w->used);
    free(w);
}

void vae_weights_allow_nonfinite(vae_weights *w, int allow) { w->allow_nonfinite = allow; }

static int starts_with(const char *s, const char *prefix) { return !strncmp(s, prefix, strlen(prefix)); }

static int key_part(const char *k) {
    if (starts_with(k, "encoder.") || starts_with(k, "quant_conv.")) return VAE_ENCODER;
    if (starts_with(k, "decoder.") || starts_with(k, "post_quant_conv.")) return VAE_DECODER;
    return 0;
}

int vae_weights_parts(const vae_weights *w) {
    int p = 0;
    for (size_t i = 0; w->st && i < st_count(w->st); i++) p |= key_part(st_at(w->st, i)->name);
    return p;
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
    w->used[st_index(w->st, t)] = 1;
    *out = t;
    return 0;
}

static void index_str(char *buf, size_t len, float v, int64_t i, int rank, const int64_t *dims);

static st_dtype st_of(cw_dtype dt) { return dt == CW_F16 ? ST_F16 : dt == CW_BF16 ? ST_BF16 : ST_F32; }

int vae_weights_get_as(vae_weights *w, const char *key, int rank, const int64_t *shape, cw_dtype dt, void *dst,
                       char *err, size_t errlen) {
    int64_t n = 1;
    for (int i = 0; i < rank; i++) n *= shape[i];
    if (cw_dtype_size(dt) == 0) return st_errf(err, errlen, "weights: key '%s': dtype %d is not a cw_dtype", key, (int)dt);
    if (!w->st) {
        if (dt == CW_F32) {
            random_fill(w->seed, key, rank, shape, dst, n);
            return 0;
        }
        float *f = malloc((size_t)(n ? n : 1) * sizeof(float));
        if (!f) return st_errf(err, errlen, "weights: key '%s': out of memory", key);
        random_fill(w->seed, key, rank, shape, f, n);
        cw_dtype_convert(dst, dt, f, CW_F32, n);
        free(f);
        return 0;
    }
    const st_tensor *t;
    if (lookup(w, key, rank, shape, &t, err, errlen)) return -1;
    char msg[VAE_ERR_LEN];
    if (st_read(w->st, t, st_of(dt), dst, (size_t)n, msg, sizeof(msg)))
        return st_errf(err, errlen, "weights: key '%s': %s", key, msg);
    int64_t bad = w->allow_nonfinite ? -1 : vae_find_nonfinite_as(dst, dt, n);
    if (bad >= 0) {
        float v;
        cw_dtype_convert(&v, CW_F32, (const char *)dst + bad * (int64_t)cw_dtype_size(dt), dt, 1);
        index_str(msg, sizeof(msg), v, bad, t->rank, t->shape);
        return st_errf(err, errlen, "weights: key '%s' has %s (--allow-nonfinite loads it anyway)", t->name, msg);
    }
    return 0;
}

int vae_weights_get(vae_weights *w, const char *key, int rank, const int64_t *shape, float *dst, char *err,
                    size_t errlen) {
    return vae_weights_get_as(w, key, rank, shape, CW_F32, dst, err, errlen);
}

/* ---- the graph builder -------------------------------------------------------------------- */

/* Export mode's tensors: every weight as cw-vae reads it, under diffusers' current names. */
typedef struct vae_export {
    int n, cap;
    char **names;
    float **data;
    int64_t (*shapes)[4];
    int *ranks;
} vae_export;

typedef struct bld {
    vae_model *m;          /* NULL: check keys and shapes (w != NULL) or count bytes only */
    cw_graph *g;
    vae_weights *w;
    const vae_config *cfg;
    cw_status st;
    char *err;
    size_t errlen;
    float *buf;            /* staging for one weight (room for its elements as f32) */
    size_t buf_cap;
    int64_t count;         /* count mode: f32 bytes of the weights walked */
    int stages;            /* record block outputs in m->stage */
    vae_export *exp;       /* m NULL and exp set: export mode, every weight read into exp */
} bld;

static void fail_ctx(bld *b, cw_status st, const char *what) {
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
    int linear = 0;
    for (size_t i = 0; i < sizeof(attn_names) / sizeof(attn_names[0]); i++) linear |= strstr(key, attn_names[i][0]) != NULL;
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
    if (vae_weights_get_as(b->w, key, rank, shape, dt, b->buf, b->err, b->errlen)) {
        b->st = CW_ERR_FORMAT;
        return CW_NODE_NONE;
    }
    cw_tensor_desc d;
    cw_status st = cw_tensor_desc_make(&d, dt, rank, shape);
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
    st = cw_tensor_create(&t, m->ctx, &d);
    if (st != CW_OK) {
        fail_ctx(b, st, key);
        return CW_NODE_NONE;
    }
    m->consts[m->n_consts++] = t;
    size_t bytes = (size_t)n * cw_dtype_size(dt);
    st = cw_tensor_upload(t, b->buf, bytes);
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
static cw_node decoder(bld *b, cw_node z) {
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
static cw_node encoder(bld *b, cw_node img) {
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
    if (parts & VAE_ENCODER) encoder(&b, 0);
    if (parts & VAE_DECODER) decoder(&b, 0);
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
    if (parts & VAE_ENCODER) encoder(&b, 0);
    if (b.st == CW_OK && (parts & VAE_DECODER)) decoder(&b, 0);
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

/* ---- what the weights say the architecture is ------------------------------------------------ */

static const st_tensor *find_rank(const st_file *f, const char *key, int rank) {
    const st_tensor *t = st_find(f, key);
    return t && t->rank == rank ? t : NULL;
}

int vae_weights_infer(vae_weights *w, vae_config *c, char *err, size_t errlen) {
    if (!w->st) return st_errf(err, errlen, "random weights");
    const st_file *f = w->st;
    int n_dec = 0, n_enc = 0, dec_layers = -1, enc_layers = -1, attn = 0;
    for (size_t i = 0; i < st_count(f); i++) {
        const char *k = st_at(f, i)->name;
        int a, r, used = 0;
        if (sscanf(k, "decoder.up_blocks.%d.%n", &a, &used) == 1 && used && a >= 0 && a < 64 && a + 1 > n_dec) n_dec = a + 1;
        used = 0;
        if (sscanf(k, "encoder.down_blocks.%d.%n", &a, &used) == 1 && used && a >= 0 && a < 64 && a + 1 > n_enc) n_enc = a + 1;
        used = 0;
        if (sscanf(k, "decoder.up_blocks.0.resnets.%d.%n", &r, &used) == 1 && used && r >= 0 && r < 256 && r > dec_layers)
            dec_layers = r;
        used = 0;
        if (sscanf(k, "encoder.down_blocks.0.resnets.%d.%n", &r, &used) == 1 && used && r >= 0 && r < 256 &&
            r + 1 > enc_layers)
            enc_layers = r + 1;
        if (strstr(k, ".mid_block.attentions.")) attn = 1;
    }
    vae_config x = *c;
    const st_tensor *t;
    char key[KEY_LEN];
    if (n_dec >= 1 && n_dec <= VAE_MAX_BLOCKS) {
        x.n_blocks = n_dec;
        for (int i = 0; i < n_dec; i++) {
            snprintf(key, sizeof(key), "decoder.up_blocks.%d.resnets.0.conv1.weight", i);
            if (!(t = find_rank(f, key, 4))) return st_errf(err, errlen, "no '%s'", key);
            x.block_out[n_dec - 1 - i] = t->shape[0];
        }
        if (dec_layers >= 0) x.layers_per_block = dec_layers;
        if ((t = find_rank(f, "decoder.conv_in.weight", 4))) x.latent_channels = (int)t->shape[1];
        if ((t = find_rank(f, "decoder.conv_out.weight", 4))) x.out_channels = (int)t->shape[0];
        x.post_quant_conv = st_find(f, "post_quant_conv.weight") != NULL;
    } else if (n_enc >= 1 && n_enc <= VAE_MAX_BLOCKS) {
        x.n_blocks = n_enc;
        for (int i = 0; i < n_enc; i++) {
            snprintf(key, sizeof(key), "encoder.down_blocks.%d.resnets.0.conv1.weight", i);
            if (!(t = find_rank(f, key, 4))) return st_errf(err, errlen, "no '%s'", key);
            x.block_out[i] = t->shape[0];
        }
        if (enc_layers >= 0) x.layers_per_block = enc_layers;
    } else {
        return st_errf(err, errlen, "no encoder.down_blocks.* or decoder.up_blocks.* keys");
    }
    for (int i = x.n_blocks; i < VAE_MAX_BLOCKS; i++) x.block_out[i] = 0;
    if ((t = find_rank(f, "encoder.conv_in.weight", 4))) x.in_channels = (int)t->shape[1];
    if ((t = find_rank(f, "encoder.conv_out.weight", 4)) && t->shape[0] % 2 == 0) x.latent_channels = (int)(t->shape[0] / 2);
    if (vae_weights_parts(w) & VAE_ENCODER) x.quant_conv = st_find(f, "quant_conv.weight") != NULL;
    x.mid_attention = attn;
    *c = x;
    return 0;
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
    if (parts & VAE_ENCODER) encoder(&b, 0);
    if (b.st == CW_OK && (parts & VAE_DECODER)) decoder(&b, 0);
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

/* ---- building and running ---------------------------------------------------------------------- */

cw_status vae_build(vae_model **out, cw_context *ctx, const vae_config *cfg, vae_weights *w, int part,
                    int64_t batch, int64_t in_h, int64_t in_w, cw_dtype dt, int stages, char *err, size_t errlen) {
    *out = NULL;
    if (vae_config_validate(cfg, err, errlen)) return CW_ERR_INVALID_ARG;
    if (part != VAE_DECODER && part != VAE_ENCODER) {
        st_errf(err, errlen, "vae_build: part %d is neither the encoder nor the decoder", part);
        return CW_ERR_INVALID_ARG;
    }
    if (batch < 1 || in_h < 1 || in_w < 1) {
        st_errf(err, errlen, "input %" PRId64 " x %" PRId64 "x%" PRId64 " must be positive", batch, in_h, in_w);
        return CW_ERR_INVALID_ARG;
    }
    int64_t up = vae_upscale(cfg);
    if (part == VAE_ENCODER && (in_h % up || in_w % up)) {
        st_errf(err, errlen, "image %" PRId64 "x%" PRId64 ": height and width must be multiples of %" PRId64, in_h,
                in_w, up);
        return CW_ERR_INVALID_ARG;
    }
    /* fail on a bad key before allocating anything */
    if (vae_weights_check(w, cfg, part, err, errlen)) return CW_ERR_FORMAT;
    vae_model *m = calloc(1, sizeof(*m));
    if (!m) {
        st_errf(err, errlen, "out of memory");
        return CW_ERR_OUT_OF_MEMORY;
    }
    m->ctx = ctx;
    m->dtype = dt;
    m->part = part;
    bld b = {0};
    b.m = m;
    b.w = w;
    b.cfg = cfg;
    b.err = err;
    b.errlen = errlen;
    b.stages = stages;
    cw_status st = cw_graph_create(&m->graph, ctx);
    if (st != CW_OK) {
        fail_ctx(&b, st, "cw_graph_create");
        goto fail;
    }
    b.g = m->graph;
    int64_t dims[4] = {batch, part == VAE_DECODER ? cfg->latent_channels : cfg->in_channels, in_h, in_w};
    st = cw_tensor_desc_make(&m->in_desc, dt, 4, dims);
    if (st == CW_OK) st = cw_graph_input(m->graph, &m->input, part == VAE_DECODER ? "latent" : "image", &m->in_desc);
    if (st != CW_OK) {
        fail_ctx(&b, st, "input");
        goto fail;
    }
    m->output = part == VAE_DECODER ? decoder(&b, m->input) : encoder(&b, m->input);
    if (b.st != CW_OK) goto fail;
    st = cw_graph_output(m->graph, m->output, part == VAE_DECODER ? "sample" : "moments");
    if (st == CW_OK) st = cw_graph_get_node_desc(m->graph, &m->out_desc, m->output);
    for (int i = 0; st == CW_OK && i < m->n_stages; i++)
        if (m->stage[i] != m->output) st = cw_graph_output(m->graph, m->stage[i], m->stage_name[i]);
    if (st != CW_OK) {
        fail_ctx(&b, st, "output");
        goto fail;
    }
    free(b.buf);
    *out = m;
    return CW_OK;
fail:
    free(b.buf);
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
    if (st != CW_OK) st_errf(err, errlen, "compile: %s", cw_context_get_last_error(m->ctx));
    return st;
}

/* Runs plan with ny outputs: ys[i] (host f32) receive outputs whose descs are yd[i]. */
static cw_status run_outputs(vae_model *m, cw_plan *plan, const float *in, int ny, const cw_tensor_desc *yd,
                             float *const *ys, char *err, size_t errlen) {
    cw_tensor *x = NULL, *y[65] = {0};
    int64_t nin = cw_tensor_desc_numel(&m->in_desc), nmax = nin;
    size_t es = cw_dtype_size(m->dtype);
    uint16_t *tmp = NULL;
    const char *what = "input tensor";
    cw_status st = cw_tensor_create(&x, m->ctx, &m->in_desc);
    what = "output tensor";
    for (int i = 0; st == CW_OK && i < ny; i++) {
        st = cw_tensor_create(&y[i], m->ctx, &yd[i]);
        if (cw_tensor_desc_numel(&yd[i]) > nmax) nmax = cw_tensor_desc_numel(&yd[i]);
    }
    if (st != CW_OK) goto done;
    what = "upload";
    if (m->dtype == CW_F32) {
        st = cw_tensor_upload(x, in, (size_t)nin * es);
    } else {
        tmp = malloc((size_t)nmax * sizeof(uint16_t));
        if (!tmp) {
            st = CW_ERR_OUT_OF_MEMORY;
            goto done;
        }
        st = cw_dtype_convert(tmp, m->dtype, in, CW_F32, nin); /* rounds to nearest, ties to even */
        if (st == CW_OK) st = cw_tensor_upload(x, tmp, (size_t)nin * es);
    }
    if (st != CW_OK) goto done;
    what = "run";
    st = cw_plan_run(plan, &x, 1, y, ny);
    if (st != CW_OK) goto done;
    what = "download";
    for (int i = 0; st == CW_OK && i < ny; i++) {
        int64_t n = cw_tensor_desc_numel(&yd[i]);
        if (m->dtype == CW_F32) {
            st = cw_tensor_download(y[i], ys[i], (size_t)n * es);
        } else {
            st = cw_tensor_download(y[i], tmp, (size_t)n * es);
            if (st == CW_OK) st = cw_dtype_convert(ys[i], CW_F32, tmp, m->dtype, n);
        }
    }
done:
    if (st != CW_OK) st_errf(err, errlen, "%s: %s: %s", what, cw_status_name(st), cw_context_get_last_error(m->ctx));
    free(tmp);
    cw_tensor_destroy(x);
    for (int i = 0; i < ny; i++) cw_tensor_destroy(y[i]);
    return st;
}

cw_status vae_run(vae_model *m, cw_plan *plan, const float *in, float *out, char *err, size_t errlen) {
    if (m->n_stages) {
        st_errf(err, errlen, "vae_run: a model built with stages has %d more outputs (vae_first_nonfinite_stage)",
                m->n_stages);
        return CW_ERR_INVALID_ARG;
    }
    return run_outputs(m, plan, in, 1, &m->out_desc, &out, err, errlen);
}

int vae_first_nonfinite_stage(vae_model *m, const float *in, char *msg, size_t msglen) {
    int ny = 1, rc = -1, at[64]; /* at[i]: the plan output of stage i (the main output is 0) */
    cw_tensor_desc yd[65];
    float *ys[65] = {0};
    cw_plan *plan = NULL;
    yd[0] = m->out_desc;
    for (int i = 0; i < m->n_stages; i++) {
        at[i] = m->stage[i] == m->output ? 0 : ny++;
        if (at[i] && cw_graph_get_node_desc(m->graph, &yd[at[i]], m->stage[i]) != CW_OK) goto out;
    }
    for (int i = 0; i < ny; i++)
        if (!(ys[i] = malloc((size_t)cw_tensor_desc_numel(&yd[i]) * sizeof(float)))) {
            st_errf(msg, msglen, "out of memory for the diagnosis");
            goto out;
        }
    cw_compile_options o = CW_COMPILE_OPTIONS_INIT;
    o.policy = CW_PATCHES_NONE;
    o.streams = 1;
    o.temp_budget = -1;
    if (vae_compile(m, &o, &plan, msg, msglen) != CW_OK) goto out;
    if (run_outputs(m, plan, in, ny, yd, ys, msg, msglen) != CW_OK) goto out;
    rc = 1;
    for (int i = 0; i < m->n_stages; i++) {
        int k = at[i];
        int64_t bad = vae_find_nonfinite(ys[k], cw_tensor_desc_numel(&yd[k]));
        if (bad < 0) continue;
        char where[128];
        vae_index_str(where, sizeof(where), ys[k], bad, yd[k].rank, yd[k].dims);
        st_errf(msg, msglen, "first in the output of %s (%s)", m->stage_name[i], where);
        rc = 0;
        break;
    }
out:
    cw_plan_destroy(plan);
    for (int i = 0; i < ny; i++) free(ys[i]);
    return rc;
}

/* ---- latents and images ------------------------------------------------------------------------ */

static int tensor_dims(const int64_t *shape, int rank, int64_t dims[4], const char *flag, const char *path, char *err,
                       size_t errlen) {
    if (rank == 3) {
        dims[0] = 1;
        memcpy(dims + 1, shape, 3 * sizeof(int64_t));
    } else if (rank == 4) {
        memcpy(dims, shape, 4 * sizeof(int64_t));
    } else {
        char s[128];
        shape_str(s, sizeof(s), rank, shape);
        return st_errf(err, errlen, "%s %s: shape %s, expected [C, h, w] or [N, C, h, w]", flag, path, s);
    }
    for (int i = 0; i < 4; i++)
        if (dims[i] < 1) return st_errf(err, errlen, "%s %s: empty dimension %d", flag, path, i);
    return 0;
}

int vae_tensor_load(const char *flag, const char *path, float **out, int64_t dims[4], char *err, size_t errlen) {
    *out = NULL;
    char msg[VAE_ERR_LEN];
    if (ends_with(path, ".npy")) {
        npy_array a;
        if (npy_read(path, &a, msg, sizeof(msg))) return st_errf(err, errlen, "%s %s: %s", flag, path, msg);
        if (tensor_dims(a.shape, a.rank, dims, flag, path, err, errlen)) {
            npy_free(&a);
            return -1;
        }
        *out = a.data; /* malloc'ed by npy_read: the caller free()s it */
        return 0;
    }
    st_file *f = NULL;
    if (st_open(&f, path, msg, sizeof(msg))) return st_errf(err, errlen, "%s %s: %s", flag, path, msg);
    if (st_count(f) != 1) {
        st_errf(err, errlen, "%s %s: %zu tensors, expected exactly one", flag, path, st_count(f));
        st_close(f);
        return -1;
    }
    const st_tensor *t = st_at(f, 0);
    if (tensor_dims(t->shape, t->rank, dims, flag, path, err, errlen)) {
        st_close(f);
        return -1;
    }
    float *d = malloc((size_t)t->numel * sizeof(float));
    if (!d) {
        st_close(f);
        return st_errf(err, errlen, "%s %s: out of memory", flag, path);
    }
    if (st_read_f32(f, t, d, (size_t)t->numel, msg, sizeof(msg))) {
        free(d);
        st_close(f);
        return st_errf(err, errlen, "%s %s: %s", flag, path, msg);
    }
    st_close(f);
    *out = d;
    return 0;
}

int vae_latent_load(const char *path, float **out, int64_t dims[4], char *err, size_t errlen) {
    return vae_tensor_load("--latent", path, out, dims, err, errlen);
}

int64_t vae_find_nonfinite(const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return i;
    return -1;
}

int64_t vae_find_nonfinite_as(const void *x, cw_dtype dt, int64_t n) {
    if (dt == CW_F32) return vae_find_nonfinite(x, n);
    const uint16_t *h = x, exp = dt == CW_F16 ? 0x7c00 : 0x7f80; /* all-ones exponent: inf or NaN */
    for (int64_t i = 0; i < n; i++)
        if ((h[i] & exp) == exp) return i;
    return -1;
}

void vae_index_str(char *buf, size_t len, const float *x, int64_t i, int rank, const int64_t *dims) {
    index_str(buf, len, x[i], i, rank, dims);
}

/* "NaN at [n, c, y, x] (flat index i)" for the value v at flat index i. */
static void index_str(char *buf, size_t len, float v, int64_t i, int rank, const int64_t *dims) {
    int64_t idx[8] = {0}, r = i;
    if (rank < 1 || rank > 8) rank = 1;
    for (int d = rank - 1; d >= 0; d--) {
        int64_t n = rank == 1 ? INT64_MAX : dims[d] > 0 ? dims[d] : 1;
        idx[d] = r % n;
        r /= n;
    }
    size_t o = (size_t)snprintf(buf, len, "%s at [", isnan(v) ? "NaN" : v > 0 ? "+Inf" : "-Inf");
    for (int d = 0; d < rank && o < len; d++) o += (size_t)snprintf(buf + o, len - o, "%s%" PRId64, d ? ", " : "", idx[d]);
    if (o < len) snprintf(buf + o, len - o, "] (flat index %" PRId64 ")", i);
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

void vae_latent_scale(const vae_config *cfg, float *z, size_t n) {
    for (size_t i = 0; i < n; i++) z[i] = (float)(((double)z[i] - cfg->shift_factor) * cfg->scaling_factor);
}

int vae_moments_to_latent(const float *moments, int64_t n, int64_t lc, int64_t hw, int sample, uint64_t seed,
                          float *z) {
    float *eps = NULL;
    if (sample) {
        eps = malloc((size_t)(n * lc * hw) * sizeof(float));
        if (!eps) return -1;
        vae_latent_random(eps, (size_t)(n * lc * hw), seed);
    }
    for (int64_t s = 0; s < n; s++)
        for (int64_t c = 0; c < lc; c++) {
            const float *mean = moments + (s * 2 * lc + c) * hw, *logvar = mean + lc * hw;
            float *dst = z + (s * lc + c) * hw;
            for (int64_t i = 0; i < hw; i++) {
                if (!eps) {
                    dst[i] = mean[i];
                    continue;
                }
                /* diffusers' DiagonalGaussianDistribution: clamp, std = exp(0.5 logvar) in f32 */
                float lv = logvar[i] < -30.0f ? -30.0f : logvar[i] > 20.0f ? 20.0f : logvar[i];
                dst[i] = mean[i] + expf(0.5f * lv) * eps[(s * lc + c) * hw + i];
            }
        }
    free(eps);
    return 0;
}
