/* PNG writer (libpng) for decoded images. The pixel mapping follows diffusers:
 * denormalize (x * 0.5 + 0.5).clamp(0, 1), then numpy's (v * 255).round().astype(uint8). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "image.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <png.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "safetensors.h" /* st_atomic */

uint8_t img_to_u8(float x) {
    /* two f32 roundings as in torch; x * 0.5f is exact, so a fused multiply-add agrees */
    float v = x * 0.5f;
    v = v + 0.5f;
    if (!(v >= 0.0f)) v = 0.0f; /* also NaN: numpy's NaN -> uint8 cast gives 0 on x86 */
    if (v > 1.0f) v = 1.0f;
    float s = v * 255.0f;
    return (uint8_t)nearbyintf(s); /* default rounding mode: half to even, as numpy */
}

typedef struct png_err {
    char msg[256];
} png_err;

static void on_png_error(png_structp png, png_const_charp msg) {
    png_err *e = png_get_error_ptr(png);
    int en = errno; /* libpng's "Write Error" comes from a failed fwrite: say why */
    snprintf(e->msg, sizeof e->msg, "%s%s%s%s", msg ? msg : "libpng error", en ? " (" : "", en ? strerror(en) : "",
             en ? ")" : "");
    png_longjmp(png, 1);
}

static void on_png_warning(png_structp png, png_const_charp msg) { (void)png, (void)msg; }

int img_write_png(const char *path, const float *x, const int64_t dims[4], char *err, size_t errlen) {
    if (!path || !x || !dims) return st_errf(err, errlen, "img_write_png: NULL path, data or dims");
    int64_t n = dims[0], c = dims[1], h = dims[2], w = dims[3];
    if (n != 1 || (c != 1 && c != 3) || h < 1 || w < 1 || h > PNG_UINT_31_MAX || w > PNG_UINT_31_MAX ||
        w > INT64_MAX / 3 / h)
        return st_errf(err, errlen,
                       "%s: image tensor [%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64
                       "] is not [1, 3 or 1, H, W] with 1 <= H, W < 2^31",
                       path, n, c, h, w);
    uint8_t *row = malloc((size_t)(w * c));
    if (!row) return st_errf(err, errlen, "%s: out of memory for a %" PRId64 "-pixel row", path, w);
    st_atomic a;
    if (st_atomic_begin(&a, path, err, errlen)) {
        free(row);
        return -1;
    }
    png_err perr = {{0}};
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, &perr, on_png_error, on_png_warning);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    if (!png || !info) {
        png_destroy_write_struct(&png, &info);
        st_atomic_abort(&a);
        free(row);
        return st_errf(err, errlen, "%s: cannot create the libpng writer", path);
    }
    errno = 0;
    if (setjmp(png_jmpbuf(png))) {
        png_destroy_write_struct(&png, &info);
        st_atomic_abort(&a);
        free(row);
        return st_errf(err, errlen, "%s: PNG write failed: %s", path, perr.msg);
    }
    png_init_io(png, a.fp);
    png_set_IHDR(png, info, (png_uint_32)w, (png_uint_32)h, 8, c == 3 ? PNG_COLOR_TYPE_RGB : PNG_COLOR_TYPE_GRAY,
                 PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    /* level 3: most of level 6's size at a fraction of its time on 4096^2 outputs */
    png_set_compression_level(png, 3);
    png_write_info(png, info);
    const size_t plane = (size_t)h * (size_t)w;
    for (int64_t y = 0; y < h; y++) {
        const float *src = x + (size_t)y * (size_t)w;
        for (int64_t i = 0; i < w; i++)
            for (int64_t ch = 0; ch < c; ch++) row[i * c + ch] = img_to_u8(src[(size_t)ch * plane + (size_t)i]);
        png_write_row(png, row);
    }
    png_write_end(png, NULL);
    png_destroy_write_struct(&png, &info);
    free(row);
    return st_atomic_commit(&a, err, errlen);
}

float img_from_u8(uint8_t v) {
    /* diffusers: np.array(img).astype(np.float32) / 255.0, then 2.0 * x - 1.0, in f32 */
    float x = (float)v / 255.0f;
    return 2.0f * x - 1.0f;
}

int img_read_png(const char *path, float **out, int64_t dims[4], char *err, size_t errlen) {
    *out = NULL;
    png_image im;
    memset(&im, 0, sizeof(im));
    im.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_file(&im, path))
        return st_errf(err, errlen, "%s: not a readable PNG: %s", path, im.message);
    if (im.format & PNG_FORMAT_FLAG_LINEAR) {
        png_image_free(&im);
        return st_errf(err, errlen, "%s: a 16-bit PNG; cw-vae reads 8-bit PNGs (as diffusers' PIL path does after "
                       "convert('RGB')): convert it first", path);
    }
    int64_t h = im.height, w = im.width;
    if (h < 1 || w < 1 || h > (1 << 20) || w > (1 << 20)) {
        png_image_free(&im);
        return st_errf(err, errlen, "%s: %" PRId64 "x%" PRId64 " pixels is out of range", path, w, h);
    }
    /* RGBA without compositing and then dropping alpha is PIL's convert("RGB") */
    im.format = PNG_FORMAT_RGBA;
    size_t bytes = (size_t)PNG_IMAGE_SIZE(im);
    uint8_t *px = malloc(bytes);
    float *x = malloc((size_t)(3 * h * w) * sizeof(float));
    if (!px || !x) {
        png_image_free(&im);
        free(px);
        free(x);
        return st_errf(err, errlen, "%s: out of memory for %" PRId64 "x%" PRId64 " pixels", path, w, h);
    }
    if (!png_image_finish_read(&im, NULL, px, 0, NULL)) {
        free(px);
        free(x);
        st_errf(err, errlen, "%s: PNG decode failed: %s", path, im.message);
        png_image_free(&im);
        return -1;
    }
    size_t plane = (size_t)(h * w);
    for (size_t i = 0; i < plane; i++)
        for (int c = 0; c < 3; c++) x[c * plane + i] = img_from_u8(px[4 * i + (size_t)c]);
    free(px);
    png_image_free(&im);
    dims[0] = 1;
    dims[1] = 3;
    dims[2] = h;
    dims[3] = w;
    *out = x;
    return 0;
}
