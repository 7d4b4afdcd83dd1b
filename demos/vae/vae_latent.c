/* Latents and images as tensors: loading [N, C, h, w] from .npy or .safetensors, the
 * pipeline's latent scaling, seeded random latents, sampling the encoder's Gaussian and
 * finding (and naming) a non-finite value. */
#include "vae_internal.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "npy.h"

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
        vae__shape_str(s, sizeof(s), rank, shape);
        return st_errf(err, errlen, "%s %s: shape %s, expected [C, h, w] or [N, C, h, w]", flag, path, s);
    }
    for (int i = 0; i < 4; i++)
        if (dims[i] < 1) return st_errf(err, errlen, "%s %s: empty dimension %d", flag, path, i);
    return 0;
}

/* "FLAG PATH: reason" from a reader's message, which may already begin with "PATH: ". */
static int file_err(char *err, size_t errlen, const char *flag, const char *path, const char *msg) {
    size_t n = strlen(path);
    if (!strncmp(msg, path, n) && msg[n] == ':') return st_errf(err, errlen, "%s %s", flag, msg);
    return st_errf(err, errlen, "%s %s: %s", flag, path, msg);
}

int vae_tensor_load(const char *flag, const char *path, float **out, int64_t dims[4], char *err, size_t errlen) {
    *out = NULL;
    char msg[VAE_ERR_LEN];
    if (vae__ends_with(path, ".npy")) {
        npy_array a;
        if (npy_read(path, &a, msg, sizeof(msg))) return file_err(err, errlen, flag, path, msg);
        if (tensor_dims(a.shape, a.rank, dims, flag, path, err, errlen)) {
            npy_free(&a);
            return -1;
        }
        *out = a.data; /* malloc'ed by npy_read: the caller free()s it */
        return 0;
    }
    st_file *f = NULL;
    if (st_open(&f, path, msg, sizeof(msg))) return file_err(err, errlen, flag, path, msg);
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
    vae__index_str(buf, len, x[i], i, rank, dims);
}

/* "NaN at [n, c, y, x] (flat index i)" for the value v at flat index i. */
void vae__index_str(char *buf, size_t len, float v, int64_t i, int rank, const int64_t *dims) {
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
        double u1 = ((double)(vae__splitmix(&s) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
        double u2 = (double)(vae__splitmix(&s) >> 11) * (1.0 / 9007199254740992.0);
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
