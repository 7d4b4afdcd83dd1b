/* cw-vae .npy reader/writer and PNG writer: round trips, numpy byte-compatibility, every
 * malformed header with its byte offset, the diffusers pixel mapping against diffusers'
 * own PNG, and atomic replacement (a failed write leaves the existing file intact). */
#include <dirent.h>
#include <errno.h>
#include <png.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "image.h"
#include "npy.h"
#include "safetensors.h"
#include "testfiles.h"
#include "testutil.h"

#define CHECK_SUBSTR(msg, sub)                                                                      \
    do {                                                                                            \
        if (!strstr((msg), (sub))) {                                                                \
            fprintf(stderr, "%s:%d: message \"%s\" lacks \"%s\"\n", __FILE__, __LINE__, (msg), (sub)); \
            cw_test_failures++;                                                                     \
        }                                                                                           \
    } while (0)

static void put_file(const char *path, const void *b, size_t n) {
    FILE *fp = fopen(path, "wb");
    ASSERT_TRUE(fp && fwrite(b, 1, n, fp) == n);
    fclose(fp);
}

static int same_file(const char *path, const void *b, size_t n) {
    size_t len;
    uint8_t *got = cw_test_slurp(path, &len);
    int same = got && len == n && !memcmp(got, b, n);
    free(got);
    return same;
}

static int leftover_temps(void) {
    int n = 0;
    DIR *d = opendir(cw_test_tmpdir(""));
    struct dirent *e;
    while ((e = readdir(d)))
        if (strstr(e->d_name, ".tmp-")) n++;
    closedir(d);
    return n;
}

/* ---- npy ---- */

/* A v1.0 npy blob with the given header dict (padded like numpy) and data bytes. */
static size_t make_npy(uint8_t *out, const char *dict, const void *data, size_t dlen) {
    size_t k = strlen(dict), total = 10 + k + 1, pad = (64 - total % 64) % 64, hl = k + pad + 1;
    memcpy(out, "\x93NUMPY\x01\x00", 8);
    out[8] = (uint8_t)hl;
    out[9] = (uint8_t)(hl >> 8);
    memcpy(out + 10, dict, k);
    memset(out + 10 + k, ' ', pad);
    out[10 + hl - 1] = '\n';
    if (dlen) memcpy(out + 10 + hl, data, dlen);
    return 10 + hl + dlen;
}

static void test_npy(cw_rng *r) {
    char err[512];
    npy_array a;
    /* round trips over ranks 0..4, including an empty array */
    int64_t shapes[][4] = {{1, 4, 8, 12}, {5}, {0}, {2, 0, 3}, {3, 7}};
    int ranks[] = {4, 1, 0, 3, 2};
    for (int s = 0; s < 5; s++) {
        int64_t numel = 1;
        for (int d = 0; d < ranks[s]; d++) numel *= shapes[s][d];
        float *x = malloc((size_t)numel * 4 + 4);
        for (int64_t i = 0; i < numel; i++) x[i] = cw_rng_float(r) * 10.0f;
        ASSERT_EQ_I(npy_write_f32(cw_test_path("rt.npy"), ranks[s], shapes[s], x, err, sizeof err), 0);
        size_t len;
        uint8_t *b = cw_test_slurp(cw_test_path("rt.npy"), &len);
        CHECK((len - (size_t)numel * 4) % 64 == 0); /* numpy's 64-byte data alignment */
        free(b);
        if (npy_read(cw_test_path("rt.npy"), &a, err, sizeof err)) {
            fprintf(stderr, "npy_read: %s\n", err);
            exit(1);
        }
        ASSERT_EQ_I(a.rank, ranks[s]);
        ASSERT_EQ_I(a.numel, numel);
        CHECK(!strcmp(a.descr, "<f4"));
        for (int d = 0; d < ranks[s]; d++) ASSERT_EQ_I(a.shape[d], shapes[s][d]);
        for (int64_t i = 0; i < numel; i++) CHECK(memcmp(&a.data[i], &x[i], 4) == 0);
        npy_free(&a);
        free(x);
    }

    /* byte-identical to numpy's own writer: re-write the fixture latent */
    char p[1024];
    snprintf(p, sizeof p, "%s/tests/fixtures/tiny_latent.npy", CW_SOURCE_DIR);
    if (npy_read(p, &a, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        exit(1);
    }
    ASSERT_EQ_I(a.rank, 4);
    ASSERT_EQ_I(a.shape[1], 4);
    ASSERT_EQ_I(npy_write_f32(cw_test_path("latent.npy"), a.rank, a.shape, a.data, err, sizeof err), 0);
    size_t l1, l2;
    uint8_t *b1 = cw_test_slurp(p, &l1), *b2 = cw_test_slurp(cw_test_path("latent.npy"), &l2);
    CHECK(l1 == l2 && !memcmp(b1, b2, l1));
    free(b1);
    free(b2);
    npy_free(&a);

    /* '<f2' and '<f8' are read and widened / narrowed to float */
    static uint8_t blob[4096];
    uint16_t h[4] = {0x3c00, 0x0001, 0xfc00, 0x7bff};
    size_t n = make_npy(blob, "{'descr': '<f2', 'fortran_order': False, 'shape': (2, 2), }", h, sizeof h);
    ASSERT_EQ_I(npy_parse(blob, n, &a, err, sizeof err), 0);
    CHECK(a.data[0] == 1.0f && a.data[1] == ldexpf(1.0f, -24) && a.data[2] == -INFINITY && a.data[3] == 65504.0f);
    npy_free(&a);
    double dd[3] = {0.1, -3.5, 1e300};
    n = make_npy(blob, "{\"descr\": \"<f8\", \"fortran_order\": False, \"shape\": (3L,)}", dd, sizeof dd);
    ASSERT_EQ_I(npy_parse(blob, n, &a, err, sizeof err), 0);
    CHECK(a.rank == 1 && a.data[0] == 0.1f && a.data[1] == -3.5f && a.data[2] == INFINITY);
    npy_free(&a);

    /* malformed headers: each error names what and where */
    float four[4] = {0};
    struct {
        const char *dict;
        size_t dlen;
        const char *want;
    } cases[] = {
        {"{'descr': '<f4', 'fortran_order': True, 'shape': (4,), }", 16, "fortran_order True is not supported"},
        {"{'descr': '>f4', 'fortran_order': False, 'shape': (4,), }", 16, "dtype '>f4' is not supported"},
        {"{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }", 16, "dtype '<i8' is not supported"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }", 12, "data at byte 128 has 12 bytes, shape and dtype '<f4' need 16"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }", 20, "has 20 bytes"},
        {"{'descr': '<f4', 'fortran_order': False, }", 0, "lacks 'shape'"},
        {"{'descr': '<f4', 'shape': (4,), }", 16, "lacks 'fortran_order'"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (4,), 'x': 1}", 16, "unknown key 'x' at byte 66"},
        {"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (4,)}", 16, "key 'descr' repeated at byte 27"},
        {"{'descr': '<f4', 'fortran_order': Nope, 'shape': (4,)}", 16, "expected True or False at byte 44"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (4, x)}", 16, "expected a non-negative integer dimension at byte 64"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (-4,)}", 16, "dimension at byte 61"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (4 4)}", 16, "expected ',' or ')' in shape at byte 63"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}", 16, "overflows 64 bits"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,1,1,1,1,1,1,1,1)}", 4, "more than 8 dimensions"},
        {"{'descr': '<f4, 'fortran_order': False, 'shape': (4,)}", 16, "expected ',' or '}' at byte 27"},
        {"{'descr' '<f4', 'fortran_order': False, 'shape': (4,)}", 16, "expected ':' at byte 19, found 0x27"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (4,)} junk", 16, "unexpected byte 0x6a after the dict at byte 66"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (4,) 'x'}", 16, "expected ',' or '}' at byte 65"},
        {"['descr', '<f4']", 16, "expected '{' at byte 10"},
        {"{'descr': '<\\f4', 'fortran_order': False, 'shape': (4,)}", 16, "escape in string at byte 22"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (4,), 'loooooooooooooooooooooooooooooooooooong': 1}", 16,
         "string at byte 66 is too long"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (4,", 16, "expected a non-negative integer dimension at byte"},
    };
    int nc = (int)(sizeof cases / sizeof cases[0]);
    for (int i = 0; i < nc; i++) {
        uint8_t data[32] = {0};
        memcpy(data, four, sizeof four);
        n = make_npy(blob, cases[i].dict, data, cases[i].dlen);
        err[0] = 0;
        if (npy_parse(blob, n, &a, err, sizeof err) == 0) {
            fprintf(stderr, "npy case %d parsed, expected \"%s\"\n", i, cases[i].want);
            cw_test_failures++;
            npy_free(&a);
            continue;
        }
        CHECK(a.data == NULL);
        CHECK_SUBSTR(err, cases[i].want);
    }
    CHECK(npy_parse((const uint8_t *)"\x93NUMPX\x01\x00\x00\x00", 10, &a, err, sizeof err) != 0);
    CHECK_SUBSTR(err, "bytes 0-5 are not the magic");
    CHECK(npy_parse((const uint8_t *)"\x93NUMPY\x09\x00\x00\x00", 10, &a, err, sizeof err) != 0);
    CHECK_SUBSTR(err, "format version 9.0 (byte 6) is not supported");
    CHECK(npy_parse((const uint8_t *)"\x93NUMPY\x01\x00\xff\x00{}", 12, &a, err, sizeof err) != 0);
    CHECK_SUBSTR(err, "header length 255 (byte 8) runs past the end of the file (12 bytes)");
    CHECK(npy_parse((const uint8_t *)"\x93NUMPY\x02\x00\x05\x00", 10, &a, err, sizeof err) != 0);
    CHECK_SUBSTR(err, "file ends inside the header length");
    CHECK(npy_read(cw_test_path("missing.npy"), &a, err, sizeof err) != 0);
    CHECK_SUBSTR(err, "missing.npy: cannot open");
    put_file(cw_test_path("bad.npy"), "\x93NUMPY\x01\x00\x02\x00{\n", 12);
    CHECK(npy_read(cw_test_path("bad.npy"), &a, err, sizeof err) != 0);
    CHECK_SUBSTR(err, "bad.npy: npy header: expected a quoted string at byte 12");

    /* version 2.0 header (4-byte length) */
    n = make_npy(blob, "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }", four, 16);
    static uint8_t v2[4096];
    memcpy(v2, "\x93NUMPY\x02\x00", 8);
    size_t hl = (size_t)blob[8] | (size_t)blob[9] << 8;
    v2[8] = (uint8_t)hl, v2[9] = (uint8_t)(hl >> 8), v2[10] = v2[11] = 0;
    memcpy(v2 + 12, blob + 10, n - 10);
    ASSERT_EQ_I(npy_parse(v2, n + 2, &a, err, sizeof err), 0);
    ASSERT_EQ_I(a.numel, 4);
    npy_free(&a);

    /* every truncation of a valid file fails cleanly */
    n = make_npy(blob, "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }", four, 16);
    int trunc = 0;
    for (size_t k = 0; k < n; k++) {
        if (npy_parse(blob, k, &a, err, sizeof err) == 0) {
            fprintf(stderr, "npy truncation to %zu bytes parsed\n", k);
            cw_test_failures++;
            npy_free(&a);
        } else {
            trunc++;
        }
    }
    /* random header corruption: parse or fail cleanly (sanitizer runs check memory) */
    int iters = cw_test_quick() ? 2000 : 20000, still = 0;
    static uint8_t mut[4096];
    for (int it = 0; it < iters; it++) {
        memcpy(mut, blob, n);
        for (int k = (int)cw_rng_range(r, 1, 3); k > 0; k--) mut[cw_rng_range(r, 0, 73)] = (uint8_t)cw_rng_next(r);
        if (npy_parse(mut, n, &a, err, sizeof err) == 0) {
            still++;
            npy_free(&a);
        }
    }
    fprintf(stderr, "npy: 5 round trips, numpy byte-identical, %d malformed headers, %d truncations, %d corruptions (%d still valid)\n",
            nc + 5, trunc, iters, still);
}

/* ---- PNG ---- */

static uint8_t *read_png(const char *path, int gray, uint32_t *w, uint32_t *h) {
    png_image img;
    memset(&img, 0, sizeof img);
    img.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_file(&img, path)) {
        fprintf(stderr, "%s: %s\n", path, img.message);
        return NULL;
    }
    img.format = gray ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
    uint8_t *buf = malloc(PNG_IMAGE_SIZE(img));
    if (!png_image_finish_read(&img, NULL, buf, 0, NULL)) {
        fprintf(stderr, "%s: %s\n", path, img.message);
        free(buf);
        return NULL;
    }
    *w = img.width;
    *h = img.height;
    return buf;
}

static void test_mapping(void) {
    /* diffusers: (x * 0.5 + 0.5).clamp(0, 1), then numpy's (v * 255).round(): half to even */
    CHECK(img_to_u8(-1.0f) == 0);
    CHECK(img_to_u8(1.0f) == 255);
    CHECK(img_to_u8(-7.0f) == 0);
    CHECK(img_to_u8(3.0f) == 255);
    CHECK(img_to_u8(0.0f) == 128); /* 127.5 rounds to even 128 */
    CHECK(img_to_u8(NAN) == 0);
    CHECK(img_to_u8(INFINITY) == 255);
    CHECK(img_to_u8(-INFINITY) == 0);
    /* inputs whose f32 chain gives v * 255 == k + 0.5 exactly: half to even decides */
    int ties = 0, bad = 0;
    for (int k = 0; k < 255; k++) {
        float x0 = ((float)(k + 0.5) / 255.0f - 0.5f) * 2.0f;
        for (int d = -64; d <= 64; d++) {
            float x = x0;
            for (int j = 0; j < (d < 0 ? -d : d); j++) x = nextafterf(x, d < 0 ? -2.0f : 2.0f);
            float v = x * 0.5f + 0.5f, sc = v * 255.0f;
            if (sc == (float)k + 0.5f) {
                ties++;
                if (img_to_u8(x) != (uint8_t)(k % 2 ? k + 1 : k)) bad++;
                break;
            }
        }
    }
    CHECK(ties > 100);
    ASSERT_EQ_I(bad, 0);
    fprintf(stderr, "mapping: %d exact ties rounded half to even\n", ties);
}

static void test_png(cw_rng *r) {
    char err[512];
    /* against diffusers' own postprocess + PIL of the fixture output: every byte equal */
    char p[1024], q[1024];
    snprintf(p, sizeof p, "%s/tests/fixtures/tiny_out.npy", CW_SOURCE_DIR);
    snprintf(q, sizeof q, "%s/tests/fixtures/tiny_out.png", CW_SOURCE_DIR);
    npy_array a;
    if (npy_read(p, &a, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        exit(1);
    }
    ASSERT_EQ_I(a.rank, 4);
    ASSERT_EQ_I(img_write_png(cw_test_path("tiny.png"), a.data, a.shape, err, sizeof err), 0);
    uint32_t w1, h1, w2, h2;
    uint8_t *mine = read_png(cw_test_path("tiny.png"), 0, &w1, &h1), *ref = read_png(q, 0, &w2, &h2);
    ASSERT_TRUE(mine && ref);
    ASSERT_EQ_I(w1, a.shape[3]);
    ASSERT_EQ_I(h1, a.shape[2]);
    ASSERT_EQ_I(w1, w2);
    ASSERT_EQ_I(h1, h2);
    int diff = 0, mid = 0;
    for (size_t i = 0; i < (size_t)w1 * h1 * 3; i++) {
        diff += mine[i] != ref[i];
        mid += ref[i] > 0 && ref[i] < 255;
    }
    ASSERT_EQ_I(diff, 0);
    CHECK(mid > (int)(w1 * h1)); /* the fixture is not all clamped */
    fprintf(stderr, "png: %ux%u RGB identical to diffusers' (%d unclamped samples)\n", w1, h1, mid);
    free(mine);
    free(ref);
    npy_free(&a);

    /* layout: planes -> interleaved RGB, rows top to bottom; and grey */
    for (int c = 1; c <= 3; c += 2) {
        int64_t dims[4] = {1, c, 17, 23};
        size_t nn = (size_t)(c * 17 * 23);
        float *x = malloc(nn * 4);
        for (size_t i = 0; i < nn; i++) x[i] = cw_rng_float(r) * 1.2f;
        ASSERT_EQ_I(img_write_png(cw_test_path("lay.png"), x, dims, err, sizeof err), 0);
        uint32_t w, h;
        uint8_t *px = read_png(cw_test_path("lay.png"), c == 1, &w, &h);
        ASSERT_TRUE(px && w == 23 && h == 17);
        int bad = 0;
        for (int ch = 0; ch < c; ch++)
            for (int y = 0; y < 17; y++)
                for (int xx = 0; xx < 23; xx++) {
                    float v = x[((size_t)ch * 17 + (size_t)y) * 23 + (size_t)xx];
                    /* double reference; values within 1e-4 of a rounding edge are skipped */
                    double s = fmin(fmax((double)v * 0.5 + 0.5, 0.0), 1.0) * 255.0;
                    if (fabs(s - floor(s) - 0.5) < 1e-4) continue;
                    if (px[((size_t)y * 23 + (size_t)xx) * (size_t)c + (size_t)ch] != (uint8_t)floor(s + 0.5)) bad++;
                }
        ASSERT_EQ_I(bad, 0);
        free(px);
        free(x);
    }

    /* bad shapes are named */
    float one = 0;
    int64_t bad_dims[4] = {1, 4, 2, 2};
    CHECK(img_write_png(cw_test_path("b.png"), &one, bad_dims, err, sizeof err) != 0);
    CHECK_SUBSTR(err, "image tensor [1, 4, 2, 2] is not [1, 3 or 1, H, W]");
    int64_t bad2[4] = {2, 3, 2, 2};
    CHECK(img_write_png(cw_test_path("b.png"), &one, bad2, err, sizeof err) != 0);
    CHECK_SUBSTR(err, "[2, 3, 2, 2]");
}

/* A failed write never touches the existing destination and leaves no temporary. */
static void test_atomic(cw_rng *r) {
    char err[512];
    const char orig[] = "ORIGINAL CONTENT";
    int64_t dims[4] = {1, 3, 64, 64};
    size_t nn = 3 * 64 * 64;
    float *x = malloc(nn * 4);
    for (size_t i = 0; i < nn; i++) x[i] = cw_rng_float(r); /* noise: the PNG is ~12 KiB */

    char png[512], npy[512], st[512], dir[512]; /* tpath's buffers rotate: keep copies */
    snprintf(png, sizeof png, "%s", cw_test_path("out.png"));
    snprintf(npy, sizeof npy, "%s", cw_test_path("out.npy"));
    snprintf(st, sizeof st, "%s", cw_test_path("out.safetensors"));
    snprintf(dir, sizeof dir, "%s", cw_test_path("outdir.png"));
    put_file(png, orig, sizeof orig);
    put_file(npy, orig, sizeof orig);
    put_file(st, orig, sizeof orig);

    /* 1. the file size limit makes the writes fail midway (EFBIG) */
    struct rlimit old, lim;
    ASSERT_EQ_I(getrlimit(RLIMIT_FSIZE, &old), 0);
    signal(SIGXFSZ, SIG_IGN);
    lim = old;
    lim.rlim_cur = 4096;
    ASSERT_EQ_I(setrlimit(RLIMIT_FSIZE, &lim), 0);
    int f1 = img_write_png(png, x, dims, err, sizeof err);
    if (f1) fprintf(stderr, "expected failure: %s\n", err);
    int f2 = npy_write_f32(npy, 4, dims, x, err, sizeof err);
    if (f2) fprintf(stderr, "expected failure: %s\n", err);
    const char *names[] = {"x"};
    const int64_t *shapes[] = {dims};
    int ranks[] = {4};
    const float *datas[] = {x};
    int f3 = st_write(st, 1, names, shapes, ranks, datas, err, sizeof err);
    if (f3) fprintf(stderr, "expected failure: %s\n", err);
    ASSERT_EQ_I(setrlimit(RLIMIT_FSIZE, &old), 0);
    CHECK(f1 != 0 && f2 != 0 && f3 != 0);
    CHECK(same_file(png, orig, sizeof orig));
    CHECK(same_file(npy, orig, sizeof orig));
    CHECK(same_file(st, orig, sizeof orig));
    ASSERT_EQ_I(leftover_temps(), 0);

    /* 2. invalid input fails before anything is written */
    int64_t bad[4] = {1, 2, 64, 64};
    CHECK(img_write_png(png, x, bad, err, sizeof err) != 0);
    CHECK(same_file(png, orig, sizeof orig));

    /* 3. the destination is a directory: it stays one */
    ASSERT_EQ_I(mkdir(dir, 0755), 0);
    CHECK(img_write_png(dir, x, dims, err, sizeof err) != 0);
    CHECK_SUBSTR(err, "outdir.png: cannot replace it");
    CHECK(npy_write_f32(dir, 4, dims, x, err, sizeof err) != 0);
    struct stat sb;
    CHECK(stat(dir, &sb) == 0 && S_ISDIR(sb.st_mode));
    ASSERT_EQ_I(leftover_temps(), 0);
    rmdir(dir);

    /* 4. a directory that does not exist */
    CHECK(img_write_png(cw_test_path("nodir/x.png"), x, dims, err, sizeof err) != 0);
    CHECK_SUBSTR(err, "nodir/x.png: cannot create a temporary file");

    /* 5. success replaces the file completely */
    if (img_write_png(png, x, dims, err, sizeof err)) {
        fprintf(stderr, "img_write_png: %s\n", err);
        exit(1);
    }
    uint32_t w, h;
    uint8_t *px = read_png(png, 0, &w, &h);
    ASSERT_TRUE(px && w == 64 && h == 64);
    CHECK(px[0] == img_to_u8(x[0]) && px[1] == img_to_u8(x[64 * 64]) && px[2] == img_to_u8(x[2 * 64 * 64]));
    free(px);
    ASSERT_EQ_I(npy_write_f32(npy, 4, dims, x, err, sizeof err), 0);
    npy_array a;
    ASSERT_EQ_I(npy_read(npy, &a, err, sizeof err), 0);
    CHECK(a.numel == (int64_t)nn && !memcmp(a.data, x, nn * 4));
    npy_free(&a);
    ASSERT_EQ_I(leftover_temps(), 0);
    free(x);
    fprintf(stderr, "atomic: failed writes (EFBIG, bad shape, directory, missing dir) left the originals intact\n");
}

int main(void) {
    cw_rng r = {cw_test_seed(777)};
    const char *tmpdir = cw_test_tmpdir("cw_test_npy_");
    test_npy(&r);
    test_mapping();
    test_png(&r);
    test_atomic(&r);
    cw_test_rm_tree(tmpdir);
    TEST_DONE();
}
