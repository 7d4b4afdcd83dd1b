/* cw-vae safetensors reader/writer: reading a tensor as its own dtype (the file's bits) or
 * converted to another (against independent references; the conversions themselves are
 * test_half's), round trips, every malformed-header case with its message, the regression
 * corpus, every truncation of valid files, random byte corruption. */
#include <dirent.h>
#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

#include "safetensors.h"
#include "half_ref.h"
#include "testfiles.h"
#include "testutil.h"

#define CHECK_SUBSTR(msg, sub)                                                                      \
    do {                                                                                            \
        if (!strstr((msg), (sub))) {                                                                \
            fprintf(stderr, "%s:%d: message \"%s\" lacks \"%s\"\n", __FILE__, __LINE__, (msg), (sub)); \
            cw_test_failures++;                                                                     \
        }                                                                                           \
    } while (0)

static uint32_t fbits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* ---- files ---- */

/* st_read as the tensor's own dtype hands back the file's bits: a signalling NaN stays
 * signalling, which a round trip through f32 would have made quiet; as another dtype, every
 * code is the reference rounding of its exact value. */
static void test_read_as(void) {
    char err[512];
    enum { N = 65536 };
    uint16_t *codes = malloc(N * 2), *got = malloc(N * 2);
    float *f = malloc(N * 4), *fg = malloc(N * 4);
    ASSERT_TRUE(codes && got && f && fg);
    for (int i = 0; i < N; i++) codes[i] = (uint16_t)i;
    for (int i = 0; i < N; i++) f[i] = ldexpf((float)(i % 2001) - 1000.0f, i % 61 - 40); /* wide range, ties */
    f[0] = NAN, f[1] = -INFINITY, f[2] = 65520.0f, f[3] = 1e-8f;
    const char *names[] = {"h", "b", "f"};
    st_dtype dts[] = {ST_F16, ST_BF16, ST_F32};
    int64_t sh[] = {N};
    const int64_t *shapes[] = {sh, sh, sh};
    int ranks[] = {1, 1, 1};
    const void *data[] = {codes, codes, f};
    const char *p = cw_test_path("read_as.safetensors");
    if (st_write_raw(p, 3, names, dts, shapes, ranks, data, NULL, err, sizeof err) != 0) {
        fprintf(stderr, "st_write_raw: %s\n", err);
        exit(1);
    }
    st_file *sf = NULL;
    ASSERT_EQ_I(st_open(&sf, p, err, sizeof err), 0);
    int bad = 0;
    /* own dtype: the bits, signalling NaNs included (0x7c01 through f32 comes back 0x7e01) */
    ASSERT_EQ_I(st_read(sf, st_find(sf, "h"), ST_F16, got, N, err, sizeof err), 0);
    bad += memcmp(got, codes, N * 2) != 0;
    uint16_t snan = 0x7c01, rt;
    float wide;
    ASSERT_OK(cw_dtype_convert(&wide, CW_F32, &snan, CW_F16, 1));
    ASSERT_OK(cw_dtype_convert(&rt, CW_F16, &wide, CW_F32, 1));
    CHECK(rt != snan && got[0x7c01] == 0x7c01);
    ASSERT_EQ_I(st_read(sf, st_find(sf, "b"), ST_BF16, got, N, err, sizeof err), 0);
    bad += memcmp(got, codes, N * 2) != 0;
    ASSERT_EQ_I(st_read(sf, st_find(sf, "f"), ST_F32, fg, N, err, sizeof err), 0);
    for (int i = 0; i < N; i++) bad += fbits(fg[i]) != fbits(f[i]);
    /* other dtypes: one rounding of the exact value */
    ASSERT_EQ_I(st_read(sf, st_find(sf, "h"), ST_BF16, got, N, err, sizeof err), 0);
    for (int i = 0; i < N; i++) {
        double v = ref_f16(codes[i]);
        if (isnan(v)) bad += (got[i] & 0x7f80) != 0x7f80 || !(got[i] & 0x7f);
        else bad += got[i] != ref_to_bf16(v);
    }
    ASSERT_EQ_I(st_read(sf, st_find(sf, "b"), ST_F16, got, N, err, sizeof err), 0);
    for (int i = 0; i < N; i++) {
        double v = ref_bf16(codes[i]);
        if (isnan(v)) bad += (got[i] & 0x7c00) != 0x7c00 || !(got[i] & 0x3ff);
        else bad += got[i] != ref_to_f16(v);
    }
    ASSERT_EQ_I(st_read(sf, st_find(sf, "f"), ST_F16, got, N, err, sizeof err), 0);
    for (int i = 1; i < N; i++) bad += got[i] != ref_round(f[i], ref_f16, 0x7bff, 65536.0, 0x7c00);
    CHECK((got[0] & 0x7c00) == 0x7c00 && (got[0] & 0x3ff)); /* NaN */
    CHECK(got[2] == 0x7c00);                                 /* 65520: the tie goes to inf */
    ASSERT_EQ_I(st_read(sf, st_find(sf, "h"), ST_F32, fg, N, err, sizeof err), 0);
    for (int i = 0; i < N; i++) {
        double v = ref_f16(codes[i]);
        bad += isnan(v) ? !isnan(fg[i]) : (double)fg[i] != v;
    }
    ASSERT_EQ_I(st_read(sf, st_find(sf, "h"), (st_dtype)9, got, N, err, sizeof err), -1);
    CHECK_SUBSTR(err, "unknown destination dtype 9");
    ASSERT_EQ_I(bad, 0);
    st_close(sf);
    free(codes), free(got), free(f), free(fg);
}

static void test_round_trip(cw_rng *r) {
    char err[512];
    enum { NA = 2 * 3 * 5, NB = 37, NC = 4 };
    float a[NA], b[NB], c[NC];
    uint16_t b16[NB], c16[NC];
    for (int i = 0; i < NA; i++) a[i] = cw_rng_float(r) * 100.0f;
    for (int i = 0; i < NB; i++) b[i] = cw_rng_float(r) * 70000.0f * (i % 3 ? 1e-6f : 1.0f); /* subnormals, inf */
    b[0] = 1e-8f; /* f16 subnormal */
    b[1] = NAN;
    b[2] = -INFINITY;
    for (int i = 0; i < NC; i++) c[i] = cw_rng_float(r) * 1e30f;
    ASSERT_OK(cw_dtype_convert(b16, CW_F16, b, CW_F32, NB));
    ASSERT_OK(cw_dtype_convert(c16, CW_BF16, c, CW_F32, NC));
    const char *names[] = {"decoder.conv_in.weight", "b \"quoted\\\" name", "c", "scalar", "empty"};
    st_dtype dts[] = {ST_F32, ST_F16, ST_BF16, ST_F32, ST_F16};
    int64_t sa[] = {2, 3, 5}, sb[] = {NB}, sc[] = {2, 2}, se[] = {3, 0};
    const int64_t *shapes[] = {sa, sb, sc, NULL, se};
    int ranks[] = {3, 1, 2, 0, 2};
    float scalar = 42.5f;
    const void *data[] = {a, b16, c16, &scalar, NULL};
    const char *meta[] = {"format", "pt", "note", "line\nbreak", NULL};
    const char *p = cw_test_path("rt.safetensors");
    if (st_write_raw(p, 5, names, dts, shapes, ranks, data, meta, err, sizeof err) != 0) {
        fprintf(stderr, "st_write_raw: %s\n", err);
        exit(1);
    }
    st_file *f = NULL;
    if (st_open(&f, p, err, sizeof err)) {
        fprintf(stderr, "st_open: %s\n", err);
        exit(1);
    }
    ASSERT_EQ_I(st_count(f), 5);
    ASSERT_TRUE(st_metadata(f, "format") && !strcmp(st_metadata(f, "format"), "pt"));
    ASSERT_TRUE(st_metadata(f, "note") && !strcmp(st_metadata(f, "note"), "line\nbreak"));
    ASSERT_TRUE(st_metadata(f, "missing") == NULL);
    for (int i = 0; i < 5; i++) {
        const st_tensor *t = st_at(f, (size_t)i);
        ASSERT_TRUE(t && !strcmp(t->name, names[i]));
        ASSERT_TRUE(st_find(f, names[i]) == t);
        ASSERT_EQ_I(t->dtype, dts[i]);
        ASSERT_EQ_I(t->rank, ranks[i]);
        for (int d = 0; d < ranks[i]; d++) ASSERT_EQ_I(t->shape[d], shapes[i][d]);
    }
    ASSERT_TRUE(st_find(f, "nope") == NULL);
    float out[64];
    ASSERT_EQ_I(st_read_f32(f, st_find(f, names[0]), out, NA, err, sizeof err), 0);
    for (int i = 0; i < NA; i++) CHECK(fbits(out[i]) == fbits(a[i]));
    ASSERT_EQ_I(st_read_f32(f, st_find(f, names[1]), out, NB, err, sizeof err), 0);
    for (int i = 0; i < NB; i++) {
        double want = ref_f16(ref_round(b[i], ref_f16, 0x7bff, 65536.0, 0x7c00));
        if (isnan(b[i])) CHECK(isnan(out[i]));
        else CHECK((double)out[i] == want);
    }
    ASSERT_EQ_I(st_read_f32(f, st_find(f, "c"), out, NC, err, sizeof err), 0);
    for (int i = 0; i < NC; i++) CHECK((double)out[i] == ref_bf16(ref_round(c[i], ref_bf16, 0x7f7f, ldexp(1.0, 128), 0x7f80)));
    ASSERT_EQ_I(st_read_f32(f, st_find(f, "scalar"), out, 1, err, sizeof err), 0);
    CHECK(out[0] == 42.5f);
    ASSERT_EQ_I(st_read_f32(f, st_find(f, "empty"), out, 0, err, sizeof err), 0);
    ASSERT_EQ_I(st_read_f32(f, st_find(f, "c"), out, 5, err, sizeof err), -1);
    CHECK_SUBSTR(err, "tensor 'c' has 4 elements, the destination holds 5");
    st_close(f);

    /* the data section starts 8-byte aligned, as the reference writer does */
    size_t len;
    uint8_t *bytes = cw_test_slurp(p, &len);
    ASSERT_TRUE(bytes != NULL);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = hl << 8 | bytes[i];
    CHECK((8 + hl) % 8 == 0);

    /* every truncation is an error with a message, never a crash */
    int trunc = 0;
    for (size_t n = 0; n < len; n++) {
        st_file *g = (st_file *)1;
        err[0] = 0;
        if (st_parse(&g, bytes, n, err, sizeof err) == 0) {
            fprintf(stderr, "truncation to %zu of %zu bytes parsed\n", n, len);
            cw_test_failures++;
            st_close(g);
        } else {
            CHECK(g == NULL && err[0]);
            trunc++;
        }
    }
    fprintf(stderr, "round trip ok; %d truncations rejected\n", trunc);

    /* random corruption: parses or fails cleanly (sanitizer builds check for crashes) */
    int iters = cw_test_quick() ? 2000 : 20000, ok = 0;
    uint8_t *mut = malloc(len);
    for (int it = 0; it < iters; it++) {
        memcpy(mut, bytes, len);
        int flips = (int)cw_rng_range(r, 1, 4);
        for (int k = 0; k < flips; k++) {
            size_t at = (size_t)cw_rng_range(r, 0, (int64_t)(8 + hl < len ? 8 + hl : len) - 1);
            mut[at] = (uint8_t)cw_rng_next(r);
        }
        st_file *g = NULL;
        if (st_parse(&g, mut, len, err, sizeof err) == 0) {
            ok++;
            for (size_t i = 0; i < st_count(g); i++) {
                const st_tensor *t = st_at(g, i);
                ASSERT_TRUE(t->end - t->begin == (uint64_t)t->numel * st_dtype_size(t->dtype));
                float *dst = malloc((size_t)t->numel * 4 + 4);
                ASSERT_EQ_I(st_read_f32(g, t, dst, (size_t)t->numel, err, sizeof err), 0);
                free(dst);
            }
            st_close(g);
        } else {
            CHECK(g == NULL && err[0]);
        }
    }
    fprintf(stderr, "%d header corruptions: %d still valid, the rest rejected cleanly\n", iters, ok);
    free(mut);
    free(bytes);

    /* the plain f32 writer */
    int64_t s2[] = {3, 10};
    const int64_t *sh2[] = {s2};
    int rk2[] = {2};
    const float *d2[] = {a};
    const char *n2[] = {"x"};
    ASSERT_EQ_I(st_write(cw_test_path("f32.safetensors"), 1, n2, sh2, rk2, d2, err, sizeof err), 0);
    ASSERT_EQ_I(st_open(&f, cw_test_path("f32.safetensors"), err, sizeof err), 0);
    ASSERT_EQ_I(st_read_f32(f, st_find(f, "x"), out, 30, err, sizeof err), 0);
    for (int i = 0; i < 30; i++) CHECK(fbits(out[i]) == fbits(a[i]));
    st_close(f);
}

/* Builds "<len><json><data>" in memory and parses it; returns the status, message in err. */
static int parse_hdr(const char *json, size_t datalen, char *err, size_t errlen) {
    size_t jl = strlen(json), len = 8 + jl + datalen;
    uint8_t *b = calloc(1, len);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)jl >> (8 * i));
    memcpy(b + 8, json, jl);
    st_file *f = (st_file *)1;
    err[0] = 0;
    int rc = st_parse(&f, b, len, err, errlen);
    if (rc == 0) st_close(f);
    else CHECK(f == NULL);
    free(b);
    return rc;
}

static void test_malformed(void) {
    char err[512];
    struct {
        const char *json;
        size_t datalen;
        const char *want;
    } cases[] = {
        {"{\"x\":{\"dtype\":\"F32\",\"shape\":[2],", 8, "header JSON is invalid at header byte"},
        {"[1,2]", 0, "not an object"},
        {"{}  x", 0, "unexpected byte 0x78 after the header JSON at file byte 12"},
        {"{\"w\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8, "tensor 'w': dtype 'I64' is not supported"},
        {"{\"w\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8, "tensor 'w': dtype 'F64'"},
        {"{\"w\":{\"dtype\":1,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "tensor 'w': \"dtype\" is not a string"},
        {"{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "tensor 'w': missing \"dtype\""},
        {"{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, "tensor 'w': missing \"shape\""},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "tensor 'w': missing \"data_offsets\""},
        {"{\"w\":3}", 0, "tensor 'w': entry is not a JSON object"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8,
         "tensor 'w': data_offsets end 16 is past the data section's 8 bytes"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,0]}}", 8, "tensor 'w': data_offsets [8, 0] begin > end"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", 8, "tensor 'w': data_offsets[0] = -4"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4.5]}}", 8, "tensor 'w': data_offsets[1] = 4.5"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 8, "tensor 'w': \"data_offsets\" is not an array of two"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,1e300]}}", 8, "tensor 'w': data_offsets[1] = 1.0000000000000001e+300"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
         12, "tensors 'a' [0, 8) and 'b' [4, 12) overlap"},
        {"{\"b\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[6,14]},"
         "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
         14, "tensors 'a' [0, 8) and 'b' [6, 14) overlap"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8,
         "tensor 'w': data_offsets [0, 8] span 8 bytes but 3 F32 elements need 12"},
        {"{\"w\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[0,4]}}", 8,
         "tensor 'w': data_offsets [0, 4] span 4 bytes but 4 BF16 elements need 8"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, "tensor 'w': shape[0] = -2 is not"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[1,2.5],\"data_offsets\":[0,8]}}", 8, "tensor 'w': shape[1] = 2.5 is not"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,8]}}", 8, "tensor 'w': shape[0] is not a number"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":2,\"data_offsets\":[0,8]}}", 8, "tensor 'w': \"shape\" is not an array"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, "tensor 'w': shape has 9 dims"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[1099511627776,1099511627776],\"data_offsets\":[0,8]}}", 8,
         "tensor 'w': shape product overflows 64 bits at shape[1]"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2147483648,2147483648],\"data_offsets\":[0,8]}}", 8,
         "tensor 'w': byte size of 4611686018427387904 elements overflows"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[1e20],\"data_offsets\":[0,8]}}", 8, "tensor 'w': shape[0] = 1e+20 is not"},
        {"{\"__metadata__\":{\"k\":1}}", 0, "\"__metadata__\" entry 'k' is not a string"},
        {"{\"__metadata__\":[\"pt\"]}", 0, "\"__metadata__\" is not a JSON object"},
        {"{\"__metadata__\":{},\"__metadata__\":{}}", 0, "\"__metadata__\" appears twice"},
        {"{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
         "\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
         8, "tensor 'x' appears twice"},
        {"{\"x\"#:1}", 0, "header JSON is invalid at header byte 4 (file byte 12)"},
        /* a key with a NUL inside is not the key before the NUL */
        {"{\"w\\u0000junk\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
         "escaped NUL (U+0000) at file byte 11"},
        /* the tensors tile the data section exactly, as the reference implementation requires */
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
         12, "tensor 'b' begins at data byte 8 (file byte"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8,
         "tensor 'w' begins at data byte 4 (file byte"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 22,
         "18 bytes follow the last tensor's data"},
        {"{}", 4, "4 bytes follow the last tensor's data"},
    };
    int n = (int)(sizeof cases / sizeof cases[0]);
    for (int i = 0; i < n; i++) {
        int rc = parse_hdr(cases[i].json, cases[i].datalen, err, sizeof err);
        if (rc == 0) {
            fprintf(stderr, "case %d parsed, expected \"%s\"\n", i, cases[i].want);
            cw_test_failures++;
            continue;
        }
        CHECK_SUBSTR(err, cases[i].want);
    }
    /* valid edge cases: metadata only, zero-size tensors sharing an offset, scalars,
     * unknown per-tensor fields ignored, padding spaces after the JSON */
    CHECK(parse_hdr("{\"__metadata__\":{\"format\":\"pt\"}}", 0, err, sizeof err) == 0);
    CHECK(parse_hdr("{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]},"
                    "\"b\":{\"dtype\":\"F32\",\"shape\":[3,0],\"data_offsets\":[4,4]},"
                    "\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4],\"extra\":1}}    ",
                    4, err, sizeof err) == 0);

    /* raw-length cases */
    uint8_t b[16] = {0};
    st_file *f = NULL;
    CHECK(st_parse(&f, b, 5, err, sizeof err) != 0);
    CHECK_SUBSTR(err, "file is 5 bytes, shorter than the 8-byte header length");
    b[0] = 100;
    CHECK(st_parse(&f, b, 16, err, sizeof err) != 0);
    CHECK_SUBSTR(err, "header length 100 (bytes 0-7) runs past the end of the file: only 8 bytes follow");
    memset(b, 0xff, 8);
    CHECK(st_parse(&f, b, 16, err, sizeof err) != 0);
    CHECK_SUBSTR(err, "header length 18446744073709551615 (bytes 0-7) runs past the end");
    memset(b, 0, 8);
    CHECK(st_parse(&f, b, 16, err, sizeof err) != 0);
    CHECK_SUBSTR(err, "header length 0 (bytes 0-7) is too small");

    /* files: the path leads the message */
    CHECK(st_open(&f, cw_test_path("does-not-exist.safetensors"), err, sizeof err) != 0);
    CHECK_SUBSTR(err, "does-not-exist.safetensors: cannot open");
    CHECK(st_open(&f, cw_test_tmpdir(""), err, sizeof err) != 0);
    CHECK_SUBSTR(err, "not a regular file");
    FILE *fp = fopen(cw_test_path("bad.safetensors"), "wb");
    fwrite("\x05\0\0\0\0\0\0\0{\"a\":", 1, 13, fp);
    fclose(fp);
    CHECK(st_open(&f, cw_test_path("bad.safetensors"), err, sizeof err) != 0);
    CHECK_SUBSTR(err, "bad.safetensors: header JSON is invalid");
    fprintf(stderr, "%d malformed headers rejected with the expected messages\n", n);
}

/* Every corpus file: valid_* parse and read, the others fail with a message. */
static void test_corpus(void) {
    char dir[1024], err[512];
    snprintf(dir, sizeof dir, "%s/tests/corpus/safetensors", CW_SOURCE_DIR);
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "cannot open corpus %s: %s\n", dir, strerror(errno));
        exit(1);
    }
    int files = 0, valid = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char p[2048];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        st_file *f = NULL;
        int expect_ok = !strncmp(e->d_name, "valid_", 6);
        err[0] = 0;
        int rc = st_open(&f, p, err, sizeof err);
        files++;
        if (expect_ok) {
            if (rc) {
                fprintf(stderr, "%s: %s\n", e->d_name, err);
                cw_test_failures++;
                continue;
            }
            valid++;
            for (size_t i = 0; i < st_count(f); i++) {
                const st_tensor *t = st_at(f, i);
                float *dst = malloc((size_t)t->numel * 4 + 4);
                CHECK(st_read_f32(f, t, dst, (size_t)t->numel, err, sizeof err) == 0);
                free(dst);
            }
            st_close(f);
        } else {
            if (rc == 0) {
                fprintf(stderr, "corpus file %s parsed but should fail\n", e->d_name);
                cw_test_failures++;
                st_close(f);
            } else {
                CHECK(f == NULL && strstr(err, e->d_name));
            }
        }
    }
    closedir(d);
    ASSERT_LE_I(30, files); /* the corpus is there */
    fprintf(stderr, "corpus: %d files, %d valid\n", files, valid);

    /* valid_mixed holds known values: check them exactly */
    snprintf(dir + strlen(dir), sizeof dir - strlen(dir), "/valid_mixed.safetensors");
    st_file *f = NULL;
    ASSERT_EQ_I(st_open(&f, dir, err, sizeof err), 0);
    float v[8];
    ASSERT_EQ_I(st_read_f32(f, st_find(f, "b"), v, 6, err, sizeof err), 0);
    CHECK(v[0] == 1.0f && v[1] == ldexpf(1.0f, -24) && v[2] == 65504.0f && v[3] == INFINITY && v[4] == -INFINITY &&
          isnan(v[5]));
    ASSERT_EQ_I(st_read_f32(f, st_find(f, "c"), v, 4, err, sizeof err), 0);
    CHECK(v[0] == 1.0f && v[1] == ldexpf(1.0f, -133) && v[2] == INFINITY && isnan(v[3]));
    ASSERT_EQ_I(st_read_f32(f, st_find(f, "a.weight"), v, 6, err, sizeof err), 0);
    CHECK(v[3] == 3.25f && signbit(v[4]));
    CHECK(st_metadata(f, "format") && !strcmp(st_metadata(f, "format"), "pt"));
    st_close(f);
}

/* The committed fixtures: F16 / BF16 copies equal the F32 weights rounded by PyTorch,
 * which our widening must reproduce through the reference rounding. */
static void test_fixtures(void) {
    char p32[1024], p16[1024], pb[1024], err[512];
    snprintf(p32, sizeof p32, "%s/tests/fixtures/tiny_vae.safetensors", CW_SOURCE_DIR);
    snprintf(p16, sizeof p16, "%s/tests/fixtures/tiny_vae_f16.safetensors", CW_SOURCE_DIR);
    snprintf(pb, sizeof pb, "%s/tests/fixtures/tiny_vae_bf16.safetensors", CW_SOURCE_DIR);
    st_file *a = NULL, *h = NULL, *bf = NULL;
    if (st_open(&a, p32, err, sizeof err) || st_open(&h, p16, err, sizeof err) || st_open(&bf, pb, err, sizeof err)) {
        fprintf(stderr, "fixtures: %s\n", err);
        exit(1);
    }
    ASSERT_EQ_I(st_count(a), st_count(h));
    ASSERT_EQ_I(st_count(a), st_count(bf));
    CHECK(st_find(a, "decoder.conv_in.weight") && st_find(a, "post_quant_conv.weight") &&
          st_find(a, "decoder.mid_block.attentions.0.to_q.weight"));
    int64_t total = 0, bad = 0;
    for (size_t i = 0; i < st_count(a); i++) {
        const st_tensor *t = st_at(a, i), *th = st_find(h, t->name), *tb = st_find(bf, t->name);
        ASSERT_TRUE(th && tb && t->dtype == ST_F32 && th->dtype == ST_F16 && tb->dtype == ST_BF16);
        ASSERT_EQ_I(th->numel, t->numel);
        size_t n = (size_t)t->numel;
        float *x = malloc(n * 4), *y = malloc(n * 4), *z = malloc(n * 4);
        ASSERT_EQ_I(st_read_f32(a, t, x, n, err, sizeof err), 0);
        ASSERT_EQ_I(st_read_f32(h, th, y, n, err, sizeof err), 0);
        ASSERT_EQ_I(st_read_f32(bf, tb, z, n, err, sizeof err), 0);
        for (size_t k = 0; k < n; k++) {
            double wh = ref_f16(ref_round(x[k], ref_f16, 0x7bff, 65536.0, 0x7c00));
            double wb = ref_bf16(ref_round(x[k], ref_bf16, 0x7f7f, ldexp(1.0, 128), 0x7f80));
            if ((double)y[k] != wh || (double)z[k] != wb) bad++;
        }
        /* the f32 file read as f16 / bf16 is the half files' bits read as themselves */
        uint16_t *u = malloc(n * 2 + 2), *v = malloc(n * 2 + 2);
        ASSERT_TRUE(u && v);
        ASSERT_EQ_I(st_read(a, t, ST_F16, u, n, err, sizeof err), 0);
        ASSERT_EQ_I(st_read(h, th, ST_F16, v, n, err, sizeof err), 0);
        bad += memcmp(u, v, n * 2) != 0;
        ASSERT_EQ_I(st_read(a, t, ST_BF16, u, n, err, sizeof err), 0);
        ASSERT_EQ_I(st_read(bf, tb, ST_BF16, v, n, err, sizeof err), 0);
        bad += memcmp(u, v, n * 2) != 0;
        free(u);
        free(v);
        total += (int64_t)n;
        free(x);
        free(y);
        free(z);
    }
    ASSERT_EQ_I(bad, 0);
    fprintf(stderr, "fixtures: %zu tensors, %lld values: F16/BF16 files match reference rounding\n", st_count(a),
            (long long)total);
    st_close(a);
    st_close(h);
    st_close(bf);
}

static void test_write_errors(void) {
    char err[512];
    float v[2] = {1, 2};
    int64_t s[] = {2};
    const int64_t *sh[] = {s};
    int rk[] = {1};
    const float *d[] = {v};
    const char *nm[] = {"x"};
    /* destination is a directory: the directory survives, no temporary is left */
    const char *dirp = cw_test_path("adir");
    ASSERT_EQ_I(mkdir(dirp, 0755), 0);
    CHECK(st_write(dirp, 1, nm, sh, rk, d, err, sizeof err) != 0);
    CHECK_SUBSTR(err, "adir: cannot replace it");
    struct stat sb;
    CHECK(stat(dirp, &sb) == 0 && S_ISDIR(sb.st_mode));
    CHECK(st_write(cw_test_path("no-such-dir/x.safetensors"), 1, nm, sh, rk, d, err, sizeof err) != 0);
    CHECK_SUBSTR(err, "no-such-dir/x.safetensors: cannot create a temporary file");
    const char *nm2[] = {"x", "x"};
    const int64_t *sh2[] = {s, s};
    int rk2[] = {1, 1};
    const float *d2[] = {v, v};
    CHECK(st_write(cw_test_path("dup.safetensors"), 2, nm2, sh2, rk2, d2, err, sizeof err) != 0);
    CHECK_SUBSTR(err, "tensor name 'x' given twice");
    int64_t neg[] = {-1};
    const int64_t *shn[] = {neg};
    CHECK(st_write(cw_test_path("neg.safetensors"), 1, nm, shn, rk, d, err, sizeof err) != 0);
    CHECK_SUBSTR(err, "tensor 'x': shape[0] = -1");
    DIR *dd = opendir(cw_test_tmpdir(""));
    struct dirent *e;
    while ((e = readdir(dd))) CHECK(!strstr(e->d_name, ".tmp-"));
    closedir(dd);
}

/* A mapped file truncated by another process while it is read (SIGBUS on its pages): a clean
 * error naming the file and the tensor, not a crash. */
static void test_truncated_while_mapped(void) {
    char err[512];
    static float big[1 << 16];
    int64_t s[] = {1 << 16};
    const int64_t *sh[] = {s};
    int rk[] = {1};
    const float *d[] = {big};
    const char *nm[] = {"big"};
    const char *p = cw_test_path("shrinks.safetensors");
    ASSERT_EQ_I(st_write(p, 1, nm, sh, rk, d, err, sizeof err), 0);
    st_file *f = NULL;
    ASSERT_EQ_I(st_open(&f, p, err, sizeof err), 0);
    ASSERT_EQ_I(truncate(p, 4096), 0);
    ASSERT_EQ_I(st_read_f32(f, st_find(f, "big"), big, (size_t)1 << 16, err, sizeof err), -1);
    CHECK_SUBSTR(err, "shrinks.safetensors: tensor 'big'");
    CHECK_SUBSTR(err, "truncated while being read");
    st_close(f);
}

int main(void) {
    cw_rng r = {cw_test_seed(20240611)};
    const char *tmpdir = cw_test_tmpdir("cw_test_st_");
    test_read_as();
    test_round_trip(&r);
    test_malformed();
    test_corpus();
    test_fixtures();
    test_write_errors();
    test_truncated_while_mapped();
    cw_test_rm_tree(tmpdir);
    TEST_DONE();
}
