/* PNG input and output for cw-vae: maps 8-bit pixels to and from [1, C, H, W] f32 tensors
 * exactly as diffusers' VaeImageProcessor (preprocess / postprocess) does; writes atomically. */
#ifndef CWVAE_IMAGE_H
#define CWVAE_IMAGE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* diffusers' mapping of one value: v = clamp(x * 0.5 + 0.5, 0, 1) in f32, then
 * round(v * 255) with round-half-to-even (numpy's round). NaN maps to 0. */
uint8_t img_to_u8(float x);

/* Writes x, a contiguous [1, C, H, W] f32 tensor with C = 3 (RGB) or 1 (grey), as an
 * 8-bit PNG at path (a temporary beside it renamed over it, so an existing file is only
 * replaced by a complete image). Returns 0, or -1 with a message in err (may be NULL). */
int img_write_png(const char *path, const float *x, const int64_t dims[4], char *err, size_t errlen);

/* diffusers' preprocess of one value: 2 * (v / 255) - 1 in f32. */
float img_from_u8(uint8_t v);

/* Reads an 8-bit PNG (grey, RGB, palette; alpha is dropped as PIL's convert("RGB") does)
 * into *out, a malloc()ed [1, 3, H, W] f32 tensor in [-1, 1]; dims gets {1, 3, H, W}.
 * 16-bit PNGs are refused. Returns 0, or -1 with a message naming the file. */
int img_read_png(const char *path, float **out, int64_t dims[4], char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
