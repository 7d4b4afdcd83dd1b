/* The AutoencoderKL decoder (diffusers' Decoder plus post_quant_conv) described with the
 * public graph API: configuration presets, weight sources (a diffusers .safetensors file or
 * seeded random weights) and the graph that computes AutoencoderKL.decode(z). */
#ifndef CWVAE_VAE_H
#define CWVAE_VAE_H

#include <stddef.h>
#include <stdint.h>

#include "convweave/convweave.h"

#ifdef __cplusplus
extern "C" {
#endif

#define VAE_MAX_BLOCKS 8
#define VAE_ERR_LEN 512

typedef struct vae_config {
    char name[16];
    int latent_channels;                 /* z: [N, latent_channels, h, w] */
    int out_channels;                    /* 3 */
    int n_blocks;                        /* len(block_out_channels) = number of up blocks */
    int64_t block_out[VAE_MAX_BLOCKS];   /* block_out_channels, encoder order (128,256,...) */
    int layers_per_block;                /* each up block has layers_per_block + 1 ResNets */
    int groups;                          /* norm_num_groups */
    float eps;                           /* GroupNorm eps (diffusers hard-codes 1e-6) */
    int post_quant_conv;                 /* 1: a 1x1 conv latent -> latent first */
    double scaling_factor;               /* --scaled-latent: z = z / scaling + shift */
    double shift_factor;
} vae_config;

/* Fills cfg with preset `name` (sd, sdxl, sd3, flux, tiny). Returns 0, or -1 with a
 * message naming the preset and the known ones. */
int vae_preset(vae_config *cfg, const char *name, char *err, size_t errlen);
/* Comma-separated list of preset names. */
const char *vae_preset_names(void);
/* Parses "128,256,512,512" into cfg->block_out / n_blocks. Returns 0 or -1 with a message. */
int vae_parse_channels(vae_config *cfg, const char *list, char *err, size_t errlen);
/* Checks that every field is usable (groups divide every channel count, ...). */
int vae_config_validate(const vae_config *cfg, char *err, size_t errlen);
/* Number of up blocks' upsamplers = n_blocks - 1: output size = latent size * 2^(n-1). */
int64_t vae_upscale(const vae_config *cfg);

/* ---- weight sources ------------------------------------------------------------------ */
typedef struct vae_weights vae_weights;

/* Opens a diffusers-format .safetensors file (keys decoder.* and post_quant_conv.*;
 * F32/F16/BF16). Returns 0, or -1 with the parser's message (key, offset) in err. */
int vae_weights_open_file(vae_weights **out, const char *path, char *err, size_t errlen);
/* Deterministic random weights: every tensor is derived from (seed, key name) alone, so
 * the order of requests does not matter. Conv/linear weights are uniform with std
 * 1/sqrt(fan_in), biases uniform in [-0.05, 0.05], norm gamma uniform in 1 +- 0.1, beta
 * in +-0.1, which keeps activations O(1) through the whole decoder. */
int vae_weights_random(vae_weights **out, uint64_t seed, char *err, size_t errlen);
void vae_weights_close(vae_weights *w);

/* Reads tensor `key` into dst (numel(shape) floats) after checking its shape. Attention
 * keys also accept the legacy names (query, key, value, proj_attn) and Linear [C, C]
 * weights where [C, C, 1, 1] is expected. Returns 0, or -1 with a message naming the key
 * (missing) or the key and both shapes (mis-shaped). */
int vae_weights_get(vae_weights *w, const char *key, int rank, const int64_t *shape, float *dst,
                    char *err, size_t errlen);
/* Checks every key the decoder of cfg needs (presence and shape) without reading data. */
int vae_weights_check(vae_weights *w, const vae_config *cfg, char *err, size_t errlen);

/* ---- the decoder graph ---------------------------------------------------------------- */
typedef struct vae_model {
    cw_context *ctx;
    cw_graph *graph;
    cw_node input, output;
    cw_tensor_desc in_desc;   /* [1, latent_channels, h, w] */
    cw_tensor_desc out_desc;  /* [1, 3, h * upscale, w * upscale] */
    cw_dtype dtype;
    int64_t weights_bytes;    /* bytes of all constant tensors */
    int n_consts, cap_consts;
    cw_tensor **consts;       /* owned weight tensors (borrowed by the graph and its plans) */
} vae_model;

/* Builds the decoder for latents of latent_h x latent_w: loads every weight from w into
 * a constant tensor of dtype dt on ctx and describes AutoencoderKL.decode with the graph
 * API. Returns CW_OK; CW_ERR_FORMAT/CW_ERR_INVALID_ARG for missing/mis-shaped weights or a
 * bad config (message in err); other statuses come from the library (err holds the
 * context's message). *out is NULL on failure. */
cw_status vae_build(vae_model **out, cw_context *ctx, const vae_config *cfg, vae_weights *w,
                    int64_t latent_h, int64_t latent_w, cw_dtype dt, char *err, size_t errlen);
/* Frees the graph and the weight tensors: destroy every plan compiled from it first. */
void vae_model_destroy(vae_model *m);
/* Compiles the model's graph (cw_graph_compile) with err holding the context's message. */
cw_status vae_compile(vae_model *m, const cw_compile_options *opt, cw_plan **plan, char *err, size_t errlen);
/* Runs plan on latent (numel(in_desc) f32, host) and writes the f32 output (numel(out_desc),
 * host). Converts to/from the model's dtype. */
cw_status vae_decode(vae_model *m, cw_plan *plan, const float *latent, float *out, char *err, size_t errlen);

/* ---- latents --------------------------------------------------------------------------- */
/* Reads a latent from .safetensors (exactly one tensor) or .npy (f32/f16 little-endian),
 * shaped [C, h, w] or [1, C, h, w]. *out is malloc()ed (the caller free()s it); dims
 * gets {1, C, h, w}. Returns 0, or -1 with a message. */
int vae_latent_load(const char *path, float **out, int64_t dims[4], char *err, size_t errlen);
/* Seeded standard-normal latent of n floats. */
void vae_latent_random(float *dst, size_t n, uint64_t seed);
/* z = z / scaling_factor + shift_factor (undoes the pipeline's latent scaling). */
void vae_latent_unscale(const vae_config *cfg, float *z, size_t n);

#ifdef __cplusplus
}
#endif
#endif
