/* .safetensors writing: the header built from names, dtypes and shapes (data offsets tiling
 * the data section, 8-byte aligned), written through an atomic replacement (a temporary
 * beside the target, renamed on success) that npy.c and image.c share. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- atomic replacement ---- */

int st_atomic_begin(st_atomic *a, const char *path, char *err, size_t errlen) {
    memset(a, 0, sizeof *a);
    if (!path || !*path) return st_errf(err, errlen, "empty output path");
    size_t L = strlen(path);
    a->tmp = malloc(L + 16);
    a->path = strdup(path);
    if (!a->tmp || !a->path) {
        free(a->tmp);
        free(a->path);
        return st_errf(err, errlen, "%s: out of memory", path);
    }
    snprintf(a->tmp, L + 16, "%s.tmp-XXXXXX", path);
    int fd = mkstemp(a->tmp);
    if (fd < 0) {
        int e = errno;
        st_errf(err, errlen, "%s: cannot create a temporary file beside it: %s", path, strerror(e));
        free(a->tmp);
        free(a->path);
        memset(a, 0, sizeof *a);
        return -1;
    }
    (void)fchmod(fd, 0644); /* mkstemp makes 0600; outputs are ordinary files (best effort) */
    a->fp = fdopen(fd, "wb");
    if (!a->fp) {
        int e = errno;
        close(fd);
        unlink(a->tmp);
        st_errf(err, errlen, "%s: fdopen: %s", path, strerror(e));
        free(a->tmp);
        free(a->path);
        memset(a, 0, sizeof *a);
        return -1;
    }
    return 0;
}

void st_atomic_abort(st_atomic *a) {
    if (a->fp) fclose(a->fp);
    if (a->tmp) unlink(a->tmp);
    free(a->tmp);
    free(a->path);
    memset(a, 0, sizeof *a);
}

int st_atomic_commit(st_atomic *a, char *err, size_t errlen) {
    if (!a->fp) return st_errf(err, errlen, "st_atomic_commit: no open file");
    int e = 0;
    if (fflush(a->fp) != 0 || ferror(a->fp)) e = errno ? errno : EIO;
    /* the data must be on disk before the rename makes it the only copy */
    if (!e && fsync(fileno(a->fp)) != 0 && errno != EINVAL) e = errno;
    if (fclose(a->fp) != 0 && !e) e = errno ? errno : EIO;
    a->fp = NULL;
    if (e) {
        st_errf(err, errlen, "%s: writing %s failed: %s", a->path, a->tmp, strerror(e));
        st_atomic_abort(a);
        return -1;
    }
    if (rename(a->tmp, a->path) != 0) {
        e = errno;
        st_errf(err, errlen, "%s: cannot replace it with %s: %s", a->path, a->tmp, strerror(e));
        st_atomic_abort(a);
        return -1;
    }
    free(a->tmp);
    free(a->path);
    memset(a, 0, sizeof *a);
    return 0;
}

/* ---- writer ---- */

typedef struct sbuf {
    char *p;
    size_t n, cap;
    int oom;
} sbuf;

static void sb_put(sbuf *s, const char *str, size_t len) {
    if (s->oom) return;
    if (s->n + len + 1 > s->cap) {
        size_t cap = s->cap ? s->cap : 256;
        while (s->n + len + 1 > cap) cap *= 2;
        char *q = realloc(s->p, cap);
        if (!q) {
            s->oom = 1;
            return;
        }
        s->p = q;
        s->cap = cap;
    }
    memcpy(s->p + s->n, str, len);
    s->n += len;
    s->p[s->n] = 0;
}

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static void sb_fmt(sbuf *s, const char *fmt, ...) {
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (k > 0) sb_put(s, tmp, (size_t)k < sizeof tmp ? (size_t)k : sizeof tmp - 1);
}

static void sb_json_str(sbuf *s, const char *str) {
    sb_put(s, "\"", 1);
    for (const unsigned char *c = (const unsigned char *)str; *c; c++) {
        if (*c == '"' || *c == '\\') {
            char e[2] = {'\\', (char)*c};
            sb_put(s, e, 2);
        } else if (*c < 0x20) {
            sb_fmt(s, "\\u%04x", *c);
        } else {
            sb_put(s, (const char *)c, 1);
        }
    }
    sb_put(s, "\"", 1);
}

static int host_le(void) {
    uint16_t one = 1;
    uint8_t b;
    memcpy(&b, &one, 1);
    return b == 1;
}

/* One tensor's header entry into h (after its checks); *nbytes its data bytes. */
static int header_entry(sbuf *h, const char *path, int i, const char *const *names, st_dtype dt,
                        const int64_t *shape, int rank, const void *data, uint64_t off, uint64_t *nbytes,
                        char *err, size_t errlen) {
    if (!names[i] || !strcmp(names[i], "__metadata__"))
        return st_errf(err, errlen, "%s: tensor %d has no name or a reserved one", path, i);
    for (int j = 0; j < i; j++)
        if (!strcmp(names[i], names[j])) return st_errf(err, errlen, "%s: tensor name '%s' given twice", path, names[i]);
    if (st_dtype_size(dt) == 0) return st_errf(err, errlen, "%s: tensor '%s': unknown dtype %d", path, names[i], (int)dt);
    if (rank < 0 || rank > ST_MAX_RANK || (rank && !shape))
        return st_errf(err, errlen, "%s: tensor '%s': rank %d outside 0..%d", path, names[i], rank, ST_MAX_RANK);
    uint64_t numel = 1;
    for (int d = 0; d < rank; d++) {
        int64_t v = shape[d];
        if (v < 0 || (v && numel > (uint64_t)INT64_MAX / 8 / (uint64_t)v))
            return st_errf(err, errlen, "%s: tensor '%s': shape[%d] = %" PRId64 " is negative or too large", path,
                           names[i], d, v);
        numel *= (uint64_t)v;
    }
    if (numel && !data) return st_errf(err, errlen, "%s: tensor '%s': NULL data", path, names[i]);
    *nbytes = numel * st_dtype_size(dt);
    sb_json_str(h, names[i]);
    sb_fmt(h, ":{\"dtype\":\"%s\",\"shape\":[", st_dtype_name(dt));
    for (int d = 0; d < rank; d++) sb_fmt(h, d ? ",%" PRId64 : "%" PRId64, shape[d]);
    sb_fmt(h, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", off, off + *nbytes);
    return 0;
}

/* The header JSON: metadata, then every tensor in order, data offsets tiling the data
 * section; padded so the data starts 8-byte aligned. */
static int build_header(sbuf *h, const char *path, int n, const char *const *names, const st_dtype *dtypes,
                        const int64_t *const *shapes, const int *ranks, const void *const *data,
                        const char *const *metadata, uint64_t *nbytes, char *err, size_t errlen) {
    sb_put(h, "{", 1);
    int first = 1;
    if (metadata && metadata[0]) {
        sb_put(h, "\"__metadata__\":{", 16);
        for (int i = 0; metadata[i]; i += 2) {
            if (!metadata[i + 1]) return st_errf(err, errlen, "%s: metadata key '%s' has no value", path, metadata[i]);
            if (i) sb_put(h, ",", 1);
            sb_json_str(h, metadata[i]);
            sb_put(h, ":", 1);
            sb_json_str(h, metadata[i + 1]);
        }
        sb_put(h, "}", 1);
        first = 0;
    }
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        if (!first) sb_put(h, ",", 1);
        first = 0;
        if (header_entry(h, path, i, names, dtypes ? dtypes[i] : ST_F32, shapes[i], ranks[i], data[i], off,
                         &nbytes[i], err, errlen))
            return -1;
        off += nbytes[i];
    }
    sb_put(h, "}", 1);
    while ((8 + h->n) % 8) sb_put(h, " ", 1); /* data section starts 8-byte aligned */
    if (h->oom) return st_errf(err, errlen, "%s: out of memory for the header", path);
    return 0;
}

/* The length, the header and the data through an atomic replacement of path. */
static int write_file(const char *path, const sbuf *h, int n, const void *const *data, const uint64_t *nbytes,
                      int as_f32, char *err, size_t errlen) {
    st_atomic a;
    if (st_atomic_begin(&a, path, err, errlen)) return -1;
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)h->n >> (8 * i));
    int ok = fwrite(len8, 1, 8, a.fp) == 8 && fwrite(h->p, 1, h->n, a.fp) == h->n;
    for (int i = 0; ok && i < n; i++) {
        if (!nbytes[i]) continue; /* data may be NULL for an empty tensor */
        if (!as_f32 || host_le()) {
            ok = fwrite(data[i], 1, (size_t)nbytes[i], a.fp) == (size_t)nbytes[i];
        } else { /* big-endian host: store floats little-endian */
            const float *src = data[i];
            for (uint64_t e = 0; ok && e < nbytes[i] / 4; e++) {
                uint32_t u;
                memcpy(&u, &src[e], 4);
                uint8_t b[4] = {(uint8_t)u, (uint8_t)(u >> 8), (uint8_t)(u >> 16), (uint8_t)(u >> 24)};
                ok = fwrite(b, 1, 4, a.fp) == 4;
            }
        }
    }
    if (!ok) {
        st_errf(err, errlen, "%s: write failed: %s", path, strerror(errno));
        st_atomic_abort(&a);
        return -1;
    }
    return st_atomic_commit(&a, err, errlen);
}

static int write_tensors(const char *path, int n, const char *const *names, const st_dtype *dtypes,
                         const int64_t *const *shapes, const int *ranks, const void *const *data, int as_f32,
                         const char *const *metadata, char *err, size_t errlen) {
    if (n < 0) return st_errf(err, errlen, "%s: negative tensor count %d", path, n);
    if (n && (!names || !shapes || !ranks || !data))
        return st_errf(err, errlen, "%s: NULL names, shapes, ranks or data", path);
    uint64_t *nbytes = calloc((size_t)n + 1, sizeof(uint64_t));
    if (!nbytes) return st_errf(err, errlen, "%s: out of memory", path);
    sbuf h = {0};
    int rc = build_header(&h, path, n, names, dtypes, shapes, ranks, data, metadata, nbytes, err, errlen);
    if (rc == 0) rc = write_file(path, &h, n, data, nbytes, as_f32, err, errlen);
    free(h.p);
    free(nbytes);
    return rc;
}

int st_write(const char *path, int n, const char *const *names, const int64_t *const *shapes, const int *ranks,
             const float *const *data, char *err, size_t errlen) {
    return write_tensors(path, n, names, NULL, shapes, ranks, (const void *const *)data, 1, NULL, err, errlen);
}

int st_write_raw(const char *path, int n, const char *const *names, const st_dtype *dtypes,
                 const int64_t *const *shapes, const int *ranks, const void *const *data,
                 const char *const *metadata, char *err, size_t errlen) {
    return write_tensors(path, n, names, dtypes, shapes, ranks, data, 0, metadata, err, errlen);
}
