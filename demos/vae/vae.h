/* diffusers' AutoencoderKL (Encoder + quant_conv, post_quant_conv + Decoder) described with
 * the public graph API: configuration (presets, a diffusers config.json), weight sources (a
 * diffusers .safetensors file or seeded random weights) and the graphs that compute
 * AutoencoderKL.encode(x) (the Gaussian's moments) and AutoencoderKL.decode(z). */
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
    int in_channels;                     /* image channels the encoder reads (3) */
    int latent_channels;                 /* z: [N, latent_channels, h, w] */
    int out_channels;                    /* image channels the decoder writes (3) */
    int n_blocks;                        /* len(block_out_channels) = number of up blocks */
    int64_t block_out[VAE_MAX_BLOCKS];   /* block_out_channels, encoder order (128,256,...) */
    int layers_per_block;                /* each up block has layers_per_block + 1 ResNets */
    int groups;                          /* norm_num_groups */
    float eps;                           /* GroupNorm eps (diffusers hard-codes 1e-6) */
    int quant_conv;                      /* 1: the encoder ends with a 1x1 conv 2L -> 2L */
    int post_quant_conv;                 /* 1: a 1x1 conv latent -> latent first */
    int mid_attention;                   /* mid_block_add_attention */
    int force_upcast;                    /* config's force_upcast (noted: diffusers runs it in f32) */
    int latents_stats;                   /* config has latents_mean/latents_std (not applied) */
    double scaling_factor;               /* --scaled-latent: z = z / scaling + shift */
    double shift_factor;
} vae_config;

/* Which halves of the autoencoder a walk, a check or a graph covers. */
enum { VAE_DECODER = 1, VAE_ENCODER = 2 };

/* Fills cfg with preset `name` (sd, sdxl, sd3, flux, tiny). Returns 0, or -1 with a
 * message naming the preset and the known ones. */
int vae_preset(vae_config *cfg, const char *name, char *err, size_t errlen);
/* Comma-separated list of preset names. */
const char *vae_preset_names(void);
/* Parses "128,256,512,512" into cfg->block_out / n_blocks. Returns 0 or -1 with a message. */
int vae_parse_channels(vae_config *cfg, const char *list, char *err, size_t errlen);
/* Checks that every field is usable (groups divide every channel count, ...). */
/* 1 when a float32 latent times s stays finite and non-zero (1 / FLT_MAX <= s <= FLT_MAX). */
int vae_scaling_factor_ok(double s);
int vae_config_validate(const vae_config *cfg, char *err, size_t errlen);
/* Reads a diffusers AutoencoderKL config.json (text of len bytes, `path` for messages) into
 * cfg; a key the file omits takes diffusers' AutoencoderKL class default (0.42.1: one block
 * of 64 channels, 1 layer, 4 latent channels, 32 groups, scaling 0.18215, ...), as diffusers
 * fills it; keys starting with '_' (_diffusers_version, _use_default_values, ...) and
 * sample_size are ignored. Keys read: block_out_channels, layers_per_block, norm_num_groups, latent_channels,
 * in/out_channels, scaling_factor, shift_factor, use_quant_conv, use_post_quant_conv,
 * mid_block_add_attention, force_upcast, act_fn, block types. A key that changes the
 * architecture in a way cw-vae does not implement, an unknown key, or a value of the wrong
 * type is an error naming the key. Returns 0 or -1 with a message. */
int vae_config_parse_json(vae_config *cfg, const char *text, size_t len, const char *path, char *err,
                          size_t errlen);
/* Resolves a diffusers model folder: DIR/config.json + DIR/diffusion_pytorch_model.safetensors,
 * or the same under DIR/vae/ (a pipeline's root). Fills the two paths (PATH_MAX bytes each).
 * Returns 0 or -1 with a message saying what was looked for. */
int vae_model_dir(const char *dir, char *config_path, char *weights_path, size_t pathlen, char *err,
                  size_t errlen);
/* Reads and parses a config.json file (vae_config_parse_json). */
int vae_config_load(vae_config *cfg, const char *path, char *err, size_t errlen);
/* Number of up blocks' upsamplers = n_blocks - 1: output size = latent size * 2^(n-1). */
int64_t vae_upscale(const vae_config *cfg);

/* ---- weight sources ------------------------------------------------------------------ */
typedef struct vae_weights vae_weights;

/* Opens a diffusers-format .safetensors file (keys encoder.*, quant_conv.*, decoder.*,
 * post_quant_conv.*; F32/F16/BF16). Returns 0, or -1 with the parser's message (key,
 * offset) in err. */
int vae_weights_open_file(vae_weights **out, const char *path, char *err, size_t errlen);
/* Deterministic random weights: every tensor is derived from (seed, key name) alone, so
 * the order of requests does not matter. Conv/linear weights are uniform with std
 * 1/sqrt(fan_in), biases uniform in [-0.05, 0.05], norm gamma uniform in 1 +- 0.1, beta
 * in +-0.1, which keeps activations O(1) through the whole decoder. */
int vae_weights_random(vae_weights **out, uint64_t seed, char *err, size_t errlen);
void vae_weights_close(vae_weights *w);
/* allow != 0: NaN/Inf in a weight is loaded as is (default: an error naming key and index). */
void vae_weights_allow_nonfinite(vae_weights *w, int allow);
/* VAE_ENCODER / VAE_DECODER bits for the halves the file holds keys of (0 for random). */
int vae_weights_parts(const vae_weights *w);

/* Reads tensor `key` into dst (numel(shape) floats) after checking its shape. Attention
 * keys also accept the legacy names (query, key, value, proj_attn) and Linear [C, C]
 * weights where [C, C, 1, 1] is expected. Returns 0, or -1 with a message naming the key
 * (missing) or the key and both shapes (mis-shaped). */
int vae_weights_get(vae_weights *w, const char *key, int rank, const int64_t *shape, float *dst,
                    char *err, size_t errlen);
/* vae_weights_get into dst as numel(shape) elements of dt: a file's F16/BF16 tensor read as
 * that same dtype keeps its bits (no round trip through f32); any other pair is converted
 * (cw_dtype_convert: widening exact, narrowing to nearest, ties to even); random weights are
 * drawn in f32 and rounded. Non-finite values are refused as vae_weights_get does. */
int vae_weights_get_as(vae_weights *w, const char *key, int rank, const int64_t *shape, cw_dtype dt, void *dst,
                       char *err, size_t errlen);
/* Checks, without reading data, every key of the halves in `parts` and of every half the
 * file holds keys of (presence and shape), then that the file has no other key: a key no
 * half of cfg consumes (another architecture's weights) is an error naming it and what the
 * file's shapes say the architecture is. Returns 0 or -1 with a one-line message. */
int vae_weights_check(vae_weights *w, const vae_config *cfg, int parts, char *err, size_t errlen);
/* Fills cfg's architecture from the shapes in a weights file where they pin it down
 * (channels, layers, latent channels, quant convs, attention); groups stay as they are.
 * Returns 0 or -1 when the file does not look like an AutoencoderKL. */
int vae_weights_infer(vae_weights *w, vae_config *cfg, char *err, size_t errlen);
/* Writes the weights of `parts` of cfg as cw-vae reads them (f32; legacy attention names as
 * diffusers' current ones, attention projections as Linear [C, C]) to a .safetensors file
 * diffusers' AutoencoderKL.load_state_dict takes: the peer of cw-vae --compare gets the
 * same weights, random ones included. Checks the keys first (vae_weights_check). Returns 0,
 * or -1 with a message naming the key or the file. */
int vae_weights_export(vae_weights *w, const vae_config *cfg, int parts, const char *path, char *err, size_t errlen);
/* Bytes of the weights of `parts` of cfg as f32. */
int64_t vae_weights_bytes(const vae_config *cfg, int parts);

/* ---- the graphs -------------------------------------------------------------------------- */
typedef struct vae_model {
    cw_context *ctx;
    cw_graph *graph;
    int part;                 /* VAE_DECODER or VAE_ENCODER */
    cw_node input, output;
    cw_tensor_desc in_desc;   /* decoder: [N, latent_channels, h, w]; encoder: [N, in_channels, H, W] */
    cw_tensor_desc out_desc;  /* decoder: [N, out_channels, h * upscale, w * upscale];
                                 encoder: [N, 2 * latent_channels, H / upscale, W / upscale] */
    int n_stages;             /* named checkpoints, for locating a first non-finite value */
    cw_node stage[64];
    char stage_name[64][48];
    cw_dtype dtype;
    int64_t weights_bytes;    /* bytes of all constant tensors */
    int n_consts, cap_consts;
    cw_tensor **consts;       /* owned weight tensors (borrowed by the graph and its plans) */
} vae_model;

/* Builds `part` (VAE_DECODER: latents [batch, L, in_h, in_w] -> images; VAE_ENCODER:
 * images [batch, in_channels, in_h, in_w] -> moments [batch, 2L, in_h/up, in_w/up], mean
 * first, then logvar) as one graph over the whole batch: loads every weight from w into a
 * constant tensor of dtype dt on ctx. stages != 0 also marks the output of every block as
 * a graph output after the main one (a diagnostic build, see vae_first_nonfinite_stage).
 * Conv weights and biases are dt (read without a round trip through f32 when the file
 * stores them as dt); GroupNorm gamma and beta are f32, as graphs of every dtype take them.
 * Returns CW_OK; CW_ERR_FORMAT/CW_ERR_INVALID_ARG for missing/mis-shaped/non-finite
 * weights or a bad config (message in err); other statuses come from the library (err
 * holds the context's message). *out is NULL on failure. */
cw_status vae_build(vae_model **out, cw_context *ctx, const vae_config *cfg, vae_weights *w, int part,
                    int64_t batch, int64_t in_h, int64_t in_w, cw_dtype dt, int stages, char *err,
                    size_t errlen);
/* Frees the graph and the weight tensors: destroy every plan compiled from it first. */
void vae_model_destroy(vae_model *m);
/* Compiles the model's graph (cw_graph_compile) with err holding the context's message. */
cw_status vae_compile(vae_model *m, const cw_compile_options *opt, cw_plan **plan, char *err, size_t errlen);
/* Runs plan on in (numel(in_desc) f32, host) and writes the f32 output (numel(out_desc),
 * host). Converts to/from the model's dtype. */
cw_status vae_run(vae_model *m, cw_plan *plan, const float *in, float *out, char *err, size_t errlen);
/* For a model built with stages: runs it unscheduled on `in` and names the first block
 * whose output holds a NaN or Inf (and where) in msg. Returns 0 found, 1 none, -1 error. */
int vae_first_nonfinite_stage(vae_model *m, const float *in, char *msg, size_t msglen);

/* ---- latents and images ----------------------------------------------------------------- */
/* Reads a tensor from .safetensors (exactly one tensor) or .npy (f32/f16/f64 little-endian),
 * shaped [C, h, w] or [N, C, h, w]. *out is malloc()ed (the caller free()s it); dims
 * gets {N, C, h, w}. `flag` names the option in messages. Returns 0, or -1 with a message. */
int vae_tensor_load(const char *flag, const char *path, float **out, int64_t dims[4], char *err, size_t errlen);
/* vae_tensor_load for --latent. */
int vae_latent_load(const char *path, float **out, int64_t dims[4], char *err, size_t errlen);
/* Index of the first NaN/Inf in x[0..n), or -1. */
int64_t vae_find_nonfinite(const float *x, int64_t n);
/* The same over n elements of dtype dt. */
int64_t vae_find_nonfinite_as(const void *x, cw_dtype dt, int64_t n);
/* "NaN at [n, c, y, x] (index i)" for flat index i of a tensor with dims (rank 1..8). */
void vae_index_str(char *buf, size_t len, const float *x, int64_t i, int rank, const int64_t *dims);
/* From moments [N, 2L, h, w] (mean, logvar) to z [N, L, h, w]: the mean (sample 0) or
 * mean + exp(0.5 * clamp(logvar, -30, 20)) * eps with eps seeded standard normal.
 * Returns 0, or -1 when out of memory. */
int vae_moments_to_latent(const float *moments, int64_t n, int64_t lc, int64_t hw, int sample, uint64_t seed,
                          float *z);
/* z = (z - shift_factor) * scaling_factor (what a pipeline does after encode). */
void vae_latent_scale(const vae_config *cfg, float *z, size_t n);
/* Seeded standard-normal latent of n floats. */
void vae_latent_random(float *dst, size_t n, uint64_t seed);
/* z = z / scaling_factor + shift_factor (undoes the pipeline's latent scaling). */
void vae_latent_unscale(const vae_config *cfg, float *z, size_t n);

#ifdef __cplusplus
}
#endif
#endif
