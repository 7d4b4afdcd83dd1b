/* AutoencoderKL configuration: presets, flags' parsers, validation and diffusers'
 * config.json / model folders. Uses libc and cJSON only, so the fuzz target can link it
 * alone; every key of a config.json is either understood or named in an error. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cjson/cJSON.h>
#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "safetensors.h"
#include "sys.h"
#include "vae.h"

static void preset_sd_like(vae_config *c, const char *name, int latent, int qc, double sf, double shift) {
    memset(c, 0, sizeof(*c));
    snprintf(c->name, sizeof(c->name), "%s", name);
    c->in_channels = 3;
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
    c->quant_conv = qc;
    c->post_quant_conv = qc;
    c->mid_attention = 1;
    c->force_upcast = 1; /* diffusers' default */
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
        errno = 0;
        long long x = strtoll(p, &end, 10);
        if (end == p || errno || x < 1 || x > (1 << 20))
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
    if (c->in_channels < 1 || c->in_channels > 4096)
        return st_errf(err, errlen, "in channels %d out of range [1, 4096]", c->in_channels);
    if (c->out_channels < 1 || c->out_channels > 4096)
        return st_errf(err, errlen, "out channels %d out of range [1, 4096]", c->out_channels);
    if (c->n_blocks < 1 || c->n_blocks > VAE_MAX_BLOCKS)
        return st_errf(err, errlen, "block count %d out of range [1, %d]", c->n_blocks, VAE_MAX_BLOCKS);
    if (c->layers_per_block < 0 || c->layers_per_block > 64)
        return st_errf(err, errlen, "layers per block %d out of range [0, 64]", c->layers_per_block);
    if (c->groups < 1) return st_errf(err, errlen, "norm groups %d < 1", c->groups);
    for (int i = 0; i < c->n_blocks; i++)
        if (c->block_out[i] < 1 || c->block_out[i] > (1 << 20) || c->block_out[i] % c->groups)
            return st_errf(err, errlen, "block channels %" PRId64 " (block %d) not a positive multiple of %d groups",
                           c->block_out[i], i, c->groups);
    if (!vae_scaling_factor_ok(c->scaling_factor) || !isfinite(c->shift_factor) || fabs(c->shift_factor) > FLT_MAX)
        return st_errf(err, errlen, "scaling factor %g must be in [%g, %g] and shift %g a finite float32",
                       c->scaling_factor, 1.0 / FLT_MAX, (double)FLT_MAX, c->shift_factor);
    if (!(c->eps > 0.0f) || !isfinite(c->eps)) return st_errf(err, errlen, "norm eps %g must be > 0", (double)c->eps);
    return 0;
}

int64_t vae_upscale(const vae_config *cfg) { return (int64_t)1 << (cfg->n_blocks - 1); }

/* ---- config.json ---------------------------------------------------------------------------- */

static int json_int(const cJSON *v, const char *path, const char *key, int64_t lo, int64_t hi, int64_t *out,
                    char *err, size_t errlen) {
    double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    if (!(d >= (double)lo && d <= (double)hi) || d != floor(d))
        return st_errf(err, errlen, "%s: '%s' must be an integer in [%" PRId64 ", %" PRId64 "]", path, key, lo, hi);
    *out = (int64_t)d;
    return 0;
}

static int json_bool(const cJSON *v, const char *path, const char *key, int *out, char *err, size_t errlen) {
    if (!cJSON_IsBool(v)) return st_errf(err, errlen, "%s: '%s' must be true or false", path, key);
    *out = cJSON_IsTrue(v) ? 1 : 0;
    return 0;
}

static int json_blocks(const cJSON *v, const char *path, const char *key, const char *want, int n, char *err,
                       size_t errlen) {
    if (!cJSON_IsArray(v)) return st_errf(err, errlen, "%s: '%s' must be a list of block types", path, key);
    int k = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, v) {
        if (!cJSON_IsString(e) || strcmp(e->valuestring, want))
            return st_errf(err, errlen, "%s: '%s'[%d] is %s%s%s; cw-vae implements only %s", path, key, k,
                           cJSON_IsString(e) ? "'" : "", cJSON_IsString(e) ? e->valuestring : "not a string",
                           cJSON_IsString(e) ? "'" : "", want);
        k++;
    }
    if (n >= 0 && k != n)
        return st_errf(err, errlen, "%s: '%s' has %d entries, block_out_channels %d", path, key, k, n);
    return 0;
}

/* diffusers' AutoencoderKL.__init__ defaults (0.42.1): what a config.json that omits a key
 * means, as diffusers fills it from the class's signature. */
static void class_defaults(vae_config *c) {
    memset(c, 0, sizeof(*c));
    c->in_channels = 3;
    c->out_channels = 3;
    c->n_blocks = 1;
    c->block_out[0] = 64;
    c->layers_per_block = 1;
    c->latent_channels = 4;
    c->groups = 32;
    c->eps = 1e-6f;
    c->scaling_factor = 0.18215;
    c->shift_factor = 0.0; /* None */
    c->force_upcast = 1;
    c->quant_conv = 1;
    c->post_quant_conv = 1;
    c->mid_attention = 1;
}

/* A latent scaling factor x a float32 latent must stay finite and non-zero: 1 / FLT_MAX
 * .. FLT_MAX (a subnormal or larger factor silently gives inf or 0). */
int vae_scaling_factor_ok(double s) { return isfinite(s) && s >= 1.0 / FLT_MAX && s <= FLT_MAX; }

/* _class_name, the ignored keys ('_' keys, sample_size: diffusers ignores them too) and the
 * keys that size the network (channels, blocks, layers, groups). Returns 0, -1 with a
 * message naming the key, or 1 when k is not one of them. */
static int parse_size_key(vae_config *c, const cJSON *it, const char *k, const char *path, char *err,
                          size_t errlen) {
    int64_t v = 0;
    if (!strcmp(k, "_class_name")) {
        if (!cJSON_IsString(it) || strcmp(it->valuestring, "AutoencoderKL")) {
            st_errf(err, errlen, "%s: '_class_name' is %s%s%s, cw-vae implements AutoencoderKL", path,
                    cJSON_IsString(it) ? "'" : "", cJSON_IsString(it) ? it->valuestring : "not a string",
                    cJSON_IsString(it) ? "'" : "");
            return -1;
        }
    } else if (k[0] == '_' || !strcmp(k, "sample_size")) {
        /* diffusers' private keys (_diffusers_version, _use_default_values, _name_or_path, ...)
         * and the sample size do not change the model: diffusers ignores them too */
    } else if (!strcmp(k, "in_channels")) {
        if (json_int(it, path, k, 1, 4096, &v, err, errlen)) return -1;
        c->in_channels = (int)v;
    } else if (!strcmp(k, "out_channels")) {
        if (json_int(it, path, k, 1, 4096, &v, err, errlen)) return -1;
        c->out_channels = (int)v;
    } else if (!strcmp(k, "latent_channels")) {
        if (json_int(it, path, k, 1, 4096, &v, err, errlen)) return -1;
        c->latent_channels = (int)v;
    } else if (!strcmp(k, "layers_per_block")) {
        if (json_int(it, path, k, 0, 64, &v, err, errlen)) return -1;
        c->layers_per_block = (int)v;
    } else if (!strcmp(k, "norm_num_groups")) {
        if (json_int(it, path, k, 1, 1 << 20, &v, err, errlen)) return -1;
        c->groups = (int)v;
    } else if (!strcmp(k, "block_out_channels")) {
        int n = cJSON_IsArray(it) ? cJSON_GetArraySize(it) : -1;
        if (n < 1 || n > VAE_MAX_BLOCKS) {
            st_errf(err, errlen, "%s: 'block_out_channels' must be a list of 1 to %d integers", path, VAE_MAX_BLOCKS);
            return -1;
        }
        int i = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, it) {
            char what[40];
            snprintf(what, sizeof(what), "block_out_channels[%d]", i);
            if (json_int(e, path, what, 1, 1 << 20, &c->block_out[i], err, errlen)) return -1;
            i++;
        }
        for (; i < VAE_MAX_BLOCKS; i++) c->block_out[i] = 0;
        c->n_blocks = n;
    } else {
        return 1;
    }
    return 0;
}

/* Every other key: block types, activation, scaling, switches; an unknown one is refused.
 * Returns 0, or -1 with a message naming the key. */
static int parse_other_key(vae_config *c, const cJSON *it, const char *k, const char *path, const cJSON **down,
                           const cJSON **up, char *err, size_t errlen) {
    if (!strcmp(k, "down_block_types")) {
        *down = it;
    } else if (!strcmp(k, "up_block_types")) {
        *up = it;
    } else if (!strcmp(k, "act_fn")) {
        if (!cJSON_IsString(it) || strcmp(it->valuestring, "silu")) {
            st_errf(err, errlen, "%s: 'act_fn' must be \"silu\" (the only activation cw-vae implements)", path);
            return -1;
        }
    } else if (!strcmp(k, "scaling_factor")) {
        if (!cJSON_IsNumber(it) || !vae_scaling_factor_ok(it->valuedouble)) {
            st_errf(err, errlen, "%s: 'scaling_factor' must be a number in [%g, %g] (a float32 latent times it "
                    "stays finite and non-zero)", path, 1.0 / FLT_MAX, (double)FLT_MAX);
            return -1;
        }
        c->scaling_factor = it->valuedouble;
    } else if (!strcmp(k, "shift_factor")) {
        if (cJSON_IsNull(it)) c->shift_factor = 0.0;
        else if (cJSON_IsNumber(it) && isfinite(it->valuedouble)) c->shift_factor = it->valuedouble;
        else {
            st_errf(err, errlen, "%s: 'shift_factor' must be a number or null", path);
            return -1;
        }
    } else if (!strcmp(k, "latents_mean") || !strcmp(k, "latents_std")) {
        if (cJSON_IsNull(it)) return 0;
        if (!cJSON_IsArray(it)) {
            st_errf(err, errlen, "%s: '%s' must be a list or null", path, k);
            return -1;
        }
        c->latents_stats = 1;
    } else if (!strcmp(k, "force_upcast")) {
        if (json_bool(it, path, k, &c->force_upcast, err, errlen)) return -1;
    } else if (!strcmp(k, "use_quant_conv")) {
        if (json_bool(it, path, k, &c->quant_conv, err, errlen)) return -1;
    } else if (!strcmp(k, "use_post_quant_conv")) {
        if (json_bool(it, path, k, &c->post_quant_conv, err, errlen)) return -1;
    } else if (!strcmp(k, "mid_block_add_attention")) {
        if (json_bool(it, path, k, &c->mid_attention, err, errlen)) return -1;
    } else {
        st_errf(err, errlen, "%s: unknown key '%s' (cw-vae does not know how it changes the model)", path, k);
        return -1;
    }

    return 0;
}

int vae_config_parse_json(vae_config *cfg, const char *text, size_t len, const char *path, char *err,
                          size_t errlen) {
    vae_config c;
    class_defaults(&c);
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!j) {
        size_t off = end && end >= text ? (size_t)(end - text) : 0;
        const char *e = cJSON_GetErrorPtr();
        if (e && e >= text && e <= text + len) off = (size_t)(e - text);
        return st_errf(err, errlen, "%s: invalid JSON near byte %zu", path, off);
    }
    int rc = -1;
    const cJSON *down = NULL, *up = NULL;
    if (!cJSON_IsObject(j)) {
        st_errf(err, errlen, "%s: not a JSON object", path);
        goto out;
    }
    if (cJSON_GetArraySize(j) > 64) {
        st_errf(err, errlen, "%s: %d keys, more than a model config has", path, cJSON_GetArraySize(j));
        goto out;
    }
    snprintf(c.name, sizeof(c.name), "config.json");
    const cJSON *it;
    cJSON_ArrayForEach(it, j) {
        const char *k = it->string;
        if (!k) continue;
        if (cJSON_GetObjectItemCaseSensitive(j, k) != it) {
            st_errf(err, errlen, "%s: key '%s' given twice", path, k);
            goto out;
        }
        int r = parse_size_key(&c, it, k, path, err, errlen);
        if (r < 0 || (r > 0 && parse_other_key(&c, it, k, path, &down, &up, err, errlen))) goto out;
    }
    if (down && json_blocks(down, path, "down_block_types", "DownEncoderBlock2D", c.n_blocks, err, errlen)) goto out;
    if (up && json_blocks(up, path, "up_block_types", "UpDecoderBlock2D", c.n_blocks, err, errlen)) goto out;
    if (vae_config_validate(&c, err, errlen)) {
        char tmp[VAE_ERR_LEN];
        snprintf(tmp, sizeof(tmp), "%s", err);
        st_errf(err, errlen, "%s: %s", path, tmp);
        goto out;
    }
    *cfg = c;
    rc = 0;
out:
    cJSON_Delete(j);
    return rc;
}

int vae_config_load(vae_config *cfg, const char *path, char *err, size_t errlen) {
    struct stat sb;
    char msg[320];
    int fd = sys_open_regular(path, &sb, msg, sizeof msg); /* a FIFO is refused before any open */
    if (fd < 0) return st_errf(err, errlen, "%s", msg);
    if (sb.st_size > (1 << 20)) {
        close(fd);
        return st_errf(err, errlen, "%s: larger than 1 MiB, not a model config", path);
    }
    char *buf = malloc((size_t)sb.st_size + 1);
    ssize_t n = buf ? read(fd, buf, (size_t)sb.st_size) : -1;
    close(fd);
    int rc;
    if (!buf) rc = st_errf(err, errlen, "%s: out of memory", path);
    else if (n != (ssize_t)sb.st_size) rc = st_errf(err, errlen, "%s: read error", path);
    else rc = vae_config_parse_json(cfg, buf, (size_t)n, path, err, errlen);
    free(buf);
    return rc;
}

static int is_file(const char *p) {
    struct stat s;
    return stat(p, &s) == 0 && S_ISREG(s.st_mode);
}

int vae_model_dir(const char *dir, char *config_path, char *weights_path, size_t pathlen, char *err, size_t errlen) {
    static const char *const sub[] = {"", "/vae"};
    static const char *const wnames[] = {"diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.fp16.safetensors"};
    struct stat s;
    if (stat(dir, &s) != 0) return st_errf(err, errlen, "--model %s: %s", dir, strerror(errno));
    if (!S_ISDIR(s.st_mode)) return st_errf(err, errlen, "--model %s: not a folder (give --weights FILE for a file)", dir);
    for (int i = 0; i < 2; i++) {
        if ((size_t)snprintf(config_path, pathlen, "%s%s/config.json", dir, sub[i]) >= pathlen)
            return st_errf(err, errlen, "--model %s: path too long", dir);
        if (!is_file(config_path)) continue;
        for (int k = 0; k < 2; k++) {
            if ((size_t)snprintf(weights_path, pathlen, "%s%s/%s", dir, sub[i], wnames[k]) >= pathlen)
                return st_errf(err, errlen, "--model %s: path too long", dir);
            if (is_file(weights_path)) return 0;
        }
        return st_errf(err, errlen, "--model %s: %s has no %s (nor %s) beside it", dir, config_path, wnames[0], wnames[1]);
    }
    return st_errf(err, errlen, "--model %s: no config.json in it nor in %s/vae (a diffusers AutoencoderKL folder)", dir,
                   dir);
}
