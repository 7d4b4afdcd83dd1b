/* PNG writer and reader (libpng) for decoded and encoded images. The pixel mapping follows
 * diffusers: denormalize (x * 0.5 + 0.5).clamp(0, 1), then numpy's (v * 255).round(); reading
 * is PIL's convert("RGB") (colour-space chunks ignored), checked for size before decoding. */
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
#include <sys/stat.h>
#include <unistd.h>

#include "safetensors.h" /* st_atomic */
#include "sys.h"

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

/* PIL (diffusers' image loader) refuses images over 2 x Image.MAX_IMAGE_PIXELS pixels as a
 * decompression bomb; cw-vae refuses them before decoding too. */
#define PIL_BOMB_PIXELS (2 * (int64_t)89478485)

/* Chunks that say how to interpret colours: PIL (and so diffusers) ignores them and takes the
 * 8-bit samples as they are; libpng would apply gAMA. */
static const png_byte colour_chunks[] = "gAMA\0cHRM\0sRGB\0iCCP\0";

typedef struct png_in {
    png_structp png;
    png_infop info;
    uint8_t *volatile px;       /* decoded rows (set after setjmp: volatile) */
    png_bytep *volatile rows;
    int64_t h, w;
    int channels;
} png_in;

/* After png_read_info: the size checks (before any pixel is decoded) and the transforms to
 * 8-bit samples. Returns 0 or -1 with a message. */
static int png_setup(png_in *p, const char *path, char *err, size_t errlen) {
    png_uint_32 w, h;
    int depth, type;
    png_get_IHDR(p->png, p->info, &w, &h, &depth, &type, NULL, NULL, NULL);
    p->h = h, p->w = w;
    if (depth == 16)
        return st_errf(err, errlen, "%s: a 16-bit PNG; cw-vae reads 8-bit PNGs (as diffusers' PIL path does after "
                       "convert('RGB')): convert it first", path);
    if (p->h < 1 || p->w < 1 || p->h > (1 << 20) || p->w > (1 << 20))
        return st_errf(err, errlen, "%s: %" PRId64 "x%" PRId64 " pixels is out of range", path, p->w, p->h);
    if (p->h * p->w > PIL_BOMB_PIXELS)
        return st_errf(err, errlen, "%s: %" PRId64 "x%" PRId64 " is %" PRId64 " pixels, over the %" PRId64 " that "
                       "PIL (diffusers' loader) accepts: refused before decoding", path, p->w, p->h, p->h * p->w,
                       PIL_BOMB_PIXELS);
    double need = (double)p->h * (double)p->w * (4.0 + 3.0 * sizeof(float)); /* rows + the f32 tensor */
    if (need > (double)sys_memory_available() / 2)
        return st_errf(err, errlen, "%s: %" PRId64 "x%" PRId64 " pixels need %.0f MiB to decode, more than this "
                       "machine's free memory allows (ulimit -v included): refused before decoding", path, p->w,
                       p->h, need / 1048576.0);
    if (type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(p->png);
    if (type == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(p->png);
    png_set_interlace_handling(p->png);
    png_read_update_info(p->png, p->info);
    p->channels = png_get_channels(p->png, p->info);
    if (png_get_bit_depth(p->png, p->info) != 8 || p->channels < 1 || p->channels > 4)
        return st_errf(err, errlen, "%s: unsupported PNG layout (%d channels of %d bits)", path, p->channels,
                       png_get_bit_depth(p->png, p->info));
    return 0;
}

/* Decodes the rows into p->px. Returns 0 or -1 (out of memory). libpng errors longjmp. */
static int png_decode(png_in *p) {
    size_t rb = png_get_rowbytes(p->png, p->info);
    p->px = malloc(rb * (size_t)p->h);
    p->rows = malloc((size_t)p->h * sizeof(png_bytep));
    if (!p->px || !p->rows) return -1;
    for (int64_t y = 0; y < p->h; y++) p->rows[y] = p->px + (size_t)y * rb;
    png_read_image(p->png, p->rows);
    return 0;
}

int img_read_png(const char *path, float **out, int64_t dims[4], char *err, size_t errlen) {
    *out = NULL;
    struct stat sb;
    char msg[320];
    int fd = sys_open_regular(path, &sb, msg, sizeof msg); /* a FIFO is refused before any open */
    if (fd < 0) return st_errf(err, errlen, "%s", msg);
    FILE *fp = fdopen(fd, "rb");
    if (!fp) {
        close(fd);
        return st_errf(err, errlen, "%s: %s", path, strerror(errno));
    }
    png_err e = {""};
    png_in p = {0};
    int rc = -1;
    p.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &e, on_png_error, on_png_warning);
    p.info = p.png ? png_create_info_struct(p.png) : NULL;
    if (!p.info) {
        st_errf(err, errlen, "%s: out of memory", path);
    } else if (setjmp(png_jmpbuf(p.png))) {
        st_errf(err, errlen, "%s: not a readable PNG: %s", path, e.msg);
    } else {
        png_init_io(p.png, fp);
        png_set_keep_unknown_chunks(p.png, PNG_HANDLE_CHUNK_NEVER, colour_chunks, 4);
        png_read_info(p.png, p.info);
        if (png_setup(&p, path, err, errlen) == 0) {
            if (png_decode(&p)) st_errf(err, errlen, "%s: out of memory for %" PRId64 "x%" PRId64 " pixels", path, p.w, p.h);
            else rc = 0;
        }
    }
    float *x = rc == 0 ? malloc((size_t)(3 * p.h * p.w) * sizeof(float)) : NULL;
    if (rc == 0 && !x) rc = st_errf(err, errlen, "%s: out of memory for %" PRId64 "x%" PRId64 " pixels", path, p.w, p.h);
    if (rc == 0) {
        /* PIL's convert("RGB"): grey replicated, alpha dropped without compositing */
        size_t plane = (size_t)(p.h * p.w), ch = (size_t)p.channels;
        for (size_t i = 0; i < plane; i++)
            for (size_t c = 0; c < 3; c++) x[c * plane + i] = img_from_u8(p.px[ch * i + (ch >= 3 ? c : 0)]);
        dims[0] = 1, dims[1] = 3, dims[2] = p.h, dims[3] = p.w;
        *out = x;
    }
    png_destroy_read_struct(p.png ? &p.png : NULL, p.info ? &p.info : NULL, NULL);
    free(p.px);
    free(p.rows);
    fclose(fp);
    return rc;
}
