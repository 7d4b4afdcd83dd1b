/* cw-vae's weight sources: a diffusers .safetensors file (keys looked up with their legacy
 * attention names, shapes checked, values converted to the model's dtype) or seeded random
 * weights, and what a file's shapes say the architecture is. */
#include "vae_internal.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


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

uint64_t vae__splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* uniform in [-1, 1) */
static double unit(uint64_t *s) { return (double)(vae__splitmix(s) >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0; }

static uint64_t fnv1a(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}

int vae__ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !memcmp(s + a - b, suffix, b);
}

static void random_fill(uint64_t seed, const char *key, int rank, const int64_t *shape, float *dst, int64_t n) {
    uint64_t s = seed ^ fnv1a(key);
    vae__splitmix(&s);
    /* the module name is the key without ".weight"/".bias": norms contain "norm" */
    const char *dot = strrchr(key, '.');
    size_t mlen = dot ? (size_t)(dot - key) : strlen(key);
    const char *mod = key;
    for (const char *p = key; p < key + mlen; p++)
        if (*p == '.') mod = p + 1;
    int is_norm = 0;
    for (const char *p = mod; p + 4 <= key + mlen; p++)
        if (!memcmp(p, "norm", 4)) is_norm = 1;
    int is_weight = vae__ends_with(key, ".weight");
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

void vae__shape_str(char *buf, size_t len, int rank, const int64_t *shape) {
    size_t o = 0;
    o += (size_t)snprintf(buf + o, len - o, "[");
    for (int i = 0; i < rank && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%" PRId64, i ? ", " : "", shape[i]);
    if (o < len) snprintf(buf + o, len - o, "]");
}

/* Legacy attention names of the current ones (old diffusers checkpoints). */
static const char *const attn_names[][2] = {
    {".to_q.", ".query."}, {".to_k.", ".key."}, {".to_v.", ".value."}, {".to_out.0.", ".proj_attn."}};

int vae__is_attn_key(const char *key) {
    for (size_t i = 0; i < sizeof(attn_names) / sizeof(attn_names[0]); i++)
        if (strstr(key, attn_names[i][0])) return 1;
    return 0;
}

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

int vae__lookup(vae_weights *w, const char *key, int rank, const int64_t *shape, const st_tensor **out,
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
        vae__shape_str(a, sizeof(a), t->rank, t->shape);
        vae__shape_str(b, sizeof(b), rank, shape);
        return st_errf(err, errlen, "weights: key '%s' has shape %s, expected %s", used, a, b);
    }
    w->used[st_index(w->st, t)] = 1;
    *out = t;
    return 0;
}

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
    if (vae__lookup(w, key, rank, shape, &t, err, errlen)) return -1;
    char msg[VAE_ERR_LEN];
    if (st_read(w->st, t, st_of(dt), dst, (size_t)n, msg, sizeof(msg)))
        return st_errf(err, errlen, "weights: key '%s': %s", key, msg);
    int64_t bad = w->allow_nonfinite ? -1 : vae_find_nonfinite_as(dst, dt, n);
    if (bad >= 0) {
        float v;
        cw_dtype_convert(&v, CW_F32, (const char *)dst + bad * (int64_t)cw_dtype_size(dt), dt, 1);
        vae__index_str(msg, sizeof(msg), v, bad, t->rank, t->shape);
        return st_errf(err, errlen, "weights: key '%s' has %s (--allow-nonfinite loads it anyway)", t->name, msg);
    }
    return 0;
}

int vae_weights_get(vae_weights *w, const char *key, int rank, const int64_t *shape, float *dst, char *err,
                    size_t errlen) {
    return vae_weights_get_as(w, key, rank, shape, CW_F32, dst, err, errlen);
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
