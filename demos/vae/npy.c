/* .npy reading (a small parser for the Python-literal header dict, robust against
 * malformed input) and writing of C-order little-endian f32 arrays. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "npy.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "safetensors.h" /* atomic replacement; convweave.h for cw_dtype_convert */
#include "sys.h"

void npy_free(npy_array *a) {
    if (!a) return;
    free(a->data);
    memset(a, 0, sizeof *a);
}

/* Cursor over the header text; positions are file byte offsets. */
typedef struct hdr {
    const uint8_t *b;
    size_t pos, end;
    char *err;
    size_t errlen;
} hdr;

static void skip_ws(hdr *h) {
    while (h->pos < h->end && (h->b[h->pos] == ' ' || h->b[h->pos] == '\t' || h->b[h->pos] == '\n' ||
                               h->b[h->pos] == '\r'))
        h->pos++;
}

static int peek(const hdr *h) { return h->pos < h->end ? h->b[h->pos] : -1; }

static int expect(hdr *h, char c) {
    skip_ws(h);
    if (peek(h) != c) {
        if (peek(h) < 0) return st_errf(h->err, h->errlen, "npy header: expected '%c' at byte %zu, found its end", c, h->pos);
        return st_errf(h->err, h->errlen, "npy header: expected '%c' at byte %zu, found 0x%02x", c, h->pos,
                       (unsigned)peek(h));
    }
    h->pos++;
    return 0;
}

/* A quoted Python string without escapes, at most cap-1 bytes. */
static int parse_str(hdr *h, char *out, size_t cap) {
    skip_ws(h);
    int q = peek(h);
    if (q != '\'' && q != '"') return st_errf(h->err, h->errlen, "npy header: expected a quoted string at byte %zu", h->pos);
    size_t start = ++h->pos, n = 0;
    for (;;) {
        int c = peek(h);
        if (c < 0) return st_errf(h->err, h->errlen, "npy header: string opened at byte %zu is not closed", start - 1);
        h->pos++;
        if (c == q) break;
        if (c == '\\') return st_errf(h->err, h->errlen, "npy header: escape in string at byte %zu", h->pos - 1);
        if (n + 1 >= cap) return st_errf(h->err, h->errlen, "npy header: string at byte %zu is too long", start - 1);
        out[n++] = (char)c;
    }
    out[n] = 0;
    return 0;
}

static int parse_bool(hdr *h, int *out) {
    skip_ws(h);
    size_t at = h->pos;
    if (h->end - h->pos >= 4 && !memcmp(h->b + h->pos, "True", 4)) {
        h->pos += 4;
        *out = 1;
    } else if (h->end - h->pos >= 5 && !memcmp(h->b + h->pos, "False", 5)) {
        h->pos += 5;
        *out = 0;
    } else {
        return st_errf(h->err, h->errlen, "npy header: expected True or False at byte %zu", at);
    }
    return 0;
}

/* "(1, 4, 8, 8)", "(5,)", "()"; a trailing 'L' (Python 2 writers) is accepted. */
static int parse_shape(hdr *h, npy_array *a) {
    if (expect(h, '(')) return -1;
    a->rank = 0;
    for (;;) {
        skip_ws(h);
        if (peek(h) == ')') {
            h->pos++;
            return 0;
        }
        size_t at = h->pos;
        if (peek(h) < '0' || peek(h) > '9')
            return st_errf(h->err, h->errlen, "npy header: expected a non-negative integer dimension at byte %zu", at);
        int64_t v = 0;
        while (peek(h) >= '0' && peek(h) <= '9') {
            int dgt = peek(h) - '0';
            if (v > (INT64_MAX - dgt) / 10)
                return st_errf(h->err, h->errlen, "npy header: dimension at byte %zu overflows 64 bits", at);
            v = v * 10 + dgt;
            h->pos++;
        }
        if (peek(h) == 'L') h->pos++;
        if (a->rank == NPY_MAX_RANK)
            return st_errf(h->err, h->errlen, "npy header: more than %d dimensions at byte %zu", NPY_MAX_RANK, at);
        a->shape[a->rank++] = v;
        skip_ws(h);
        if (peek(h) == ',') {
            h->pos++;
        } else if (peek(h) != ')') {
            return st_errf(h->err, h->errlen, "npy header: expected ',' or ')' in shape at byte %zu", h->pos);
        }
    }
}

static int parse_dict(hdr *h, npy_array *a, int *fortran) {
    int have_descr = 0, have_fortran = 0, have_shape = 0;
    size_t dict_at = h->pos;
    if (expect(h, '{')) return -1;
    for (;;) {
        skip_ws(h);
        if (peek(h) == '}') {
            h->pos++;
            break;
        }
        char key[32];
        size_t key_at = h->pos;
        if (parse_str(h, key, sizeof key) || expect(h, ':')) return -1;
        if (!strcmp(key, "descr")) {
            if (have_descr++) return st_errf(h->err, h->errlen, "npy header: key 'descr' repeated at byte %zu", key_at);
            if (parse_str(h, a->descr, sizeof a->descr)) return -1;
        } else if (!strcmp(key, "fortran_order")) {
            if (have_fortran++)
                return st_errf(h->err, h->errlen, "npy header: key 'fortran_order' repeated at byte %zu", key_at);
            if (parse_bool(h, fortran)) return -1;
        } else if (!strcmp(key, "shape")) {
            if (have_shape++) return st_errf(h->err, h->errlen, "npy header: key 'shape' repeated at byte %zu", key_at);
            if (parse_shape(h, a)) return -1;
        } else {
            return st_errf(h->err, h->errlen, "npy header: unknown key '%s' at byte %zu", key, key_at);
        }
        skip_ws(h);
        if (peek(h) == ',') {
            h->pos++;
        } else if (peek(h) != '}') {
            return st_errf(h->err, h->errlen, "npy header: expected ',' or '}' at byte %zu", h->pos);
        }
    }
    if (!have_descr || !have_fortran || !have_shape)
        return st_errf(h->err, h->errlen, "npy header: dict at byte %zu lacks '%s'", dict_at,
                       !have_descr ? "descr" : !have_fortran ? "fortran_order" : "shape");
    skip_ws(h);
    if (h->pos != h->end)
        return st_errf(h->err, h->errlen, "npy header: unexpected byte 0x%02x after the dict at byte %zu",
                       h->b[h->pos], h->pos);
    return 0;
}

#define NPY_MAX_HEADER ((size_t)1 << 20) /* numpy writes a few hundred bytes; it reads 10000 */

/* Parses the header at buf (len bytes of a file of file_len bytes; the header must lie in
 * them) into a (shape, dtype, numel; no data) and checks the file's size against it, so a
 * file with junk after the data fails before any of it is read. *off: the data's first byte;
 * *es: the bytes of an element. */
static int parse_header(const uint8_t *buf, size_t len, uint64_t file_len, npy_array *a, size_t *off, size_t *es,
                        char *err, size_t errlen) {
    memset(a, 0, sizeof *a);
    if (len < 10 || memcmp(buf, "\x93NUMPY", 6) != 0)
        return st_errf(err, errlen, "not an npy file: bytes 0-5 are not the magic \\x93NUMPY");
    int major = buf[6], minor = buf[7];
    size_t start, hlen;
    if (major == 1) {
        hlen = (size_t)buf[8] | (size_t)buf[9] << 8;
        start = 10;
    } else if (major == 2 || major == 3) {
        if (len < 12) return st_errf(err, errlen, "npy: file ends inside the header length (bytes 8-11)");
        hlen = (size_t)buf[8] | (size_t)buf[9] << 8 | (size_t)buf[10] << 16 | (size_t)buf[11] << 24;
        start = 12;
    } else {
        return st_errf(err, errlen, "npy: format version %d.%d (byte 6) is not supported (1.0, 2.0, 3.0)", major, minor);
    }
    if (hlen > file_len - start)
        return st_errf(err, errlen, "npy: header length %zu (byte 8) runs past the end of the file (%" PRIu64 " bytes)",
                       hlen, file_len);
    if (hlen > len - start)
        return st_errf(err, errlen, "npy: header length %zu (byte 8) is over the %zu bytes cw-vae reads", hlen,
                       NPY_MAX_HEADER);
    hdr h = {buf, start, start + hlen, err, errlen};
    int fortran = 0;
    if (parse_dict(&h, a, &fortran)) return -1;
    if (fortran) return st_errf(err, errlen, "npy: fortran_order True is not supported (C order only)");
    if (!strcmp(a->descr, "<f4")) *es = 4;
    else if (!strcmp(a->descr, "<f2")) *es = 2;
    else if (!strcmp(a->descr, "<f8")) *es = 8;
    else return st_errf(err, errlen, "npy: dtype '%s' is not supported ('<f4', '<f2', '<f8')", a->descr);
    uint64_t numel = 1;
    for (int i = 0; i < a->rank; i++) {
        uint64_t v = (uint64_t)a->shape[i];
        if (v && numel > (uint64_t)INT64_MAX / 8 / v)
            return st_errf(err, errlen, "npy: shape product overflows at dim %d", i);
        numel *= v;
    }
    a->numel = (int64_t)numel;
    *off = start + hlen;
    uint64_t need = numel * *es;
    if (file_len - *off != need)
        return st_errf(err, errlen, "npy: data at byte %zu has %" PRIu64 " bytes, shape and dtype '%s' need %" PRIu64,
                       *off, file_len - *off, a->descr, need);
    return 0;
}

/* a->numel elements of es bytes at p into a->data (f32, malloc'ed). */
static int convert_data(const uint8_t *p, size_t es, npy_array *a, char *err, size_t errlen) {
    uint64_t numel = (uint64_t)a->numel;
    a->data = malloc(numel ? (size_t)numel * sizeof(float) : 1);
    if (!a->data) return st_errf(err, errlen, "npy: out of memory for %" PRIu64 " floats", numel);
    for (uint64_t i = 0; i < numel; i++, p += es) {
        if (es == 2) {
            uint16_t hb = (uint16_t)(p[0] | p[1] << 8);
            cw_dtype_convert(&a->data[i], CW_F32, &hb, CW_F16, 1);
        } else if (es == 4) {
            uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
            memcpy(&a->data[i], &u, 4);
        } else {
            uint64_t u = 0;
            for (int k = 7; k >= 0; k--) u = (u << 8) | p[k];
            double d;
            memcpy(&d, &u, 8);
            a->data[i] = (float)d;
        }
    }
    return 0;
}

int npy_parse(const uint8_t *buf, size_t len, npy_array *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    npy_array a;
    size_t off, es;
    if (parse_header(buf, len, len, &a, &off, &es, err, errlen) || convert_data(buf + off, es, &a, err, errlen))
        return -1;
    *out = a;
    return 0;
}

/* Reads exactly n bytes at the fd's position; 0, or -1 (short file or read error). */
static int read_full(int fd, uint8_t *buf, size_t n) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        got += (size_t)r;
    }
    return 0;
}

int npy_read(const char *path, npy_array *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    struct stat sb;
    char msg[512];
    int fd = sys_open_regular(path, &sb, msg, sizeof msg); /* a FIFO or /dev/zero: refused, not read */
    if (fd < 0) return st_errf(err, errlen, "%s", msg);
    uint64_t size = (uint64_t)sb.st_size;
    size_t head = size < NPY_MAX_HEADER + 12 ? (size_t)size : NPY_MAX_HEADER + 12;
    uint8_t *buf = malloc(head ? head : 1), *data = NULL;
    npy_array a = {0};
    size_t off = 0, es = 0;
    int rc = -1;
    if (!buf) snprintf(msg, sizeof msg, "out of memory");
    else if (read_full(fd, buf, head)) snprintf(msg, sizeof msg, "read error: %s", errno ? strerror(errno) : "short file");
    else if (parse_header(buf, head, size, &a, &off, &es, msg, sizeof msg) == 0) { /* the size is right */
        if ((int64_t)(size - off) > sys_memory_available() / 2)
            snprintf(msg, sizeof msg, "npy: %" PRIu64 " bytes of data, more than this machine's memory allows", size - off);
        else if (!(data = malloc(size - off ? (size_t)(size - off) : 1)))
            snprintf(msg, sizeof msg, "npy: out of memory for %" PRIu64 " bytes", size - off);
        else if (lseek(fd, (off_t)off, SEEK_SET) < 0 || read_full(fd, data, (size_t)(size - off)))
            snprintf(msg, sizeof msg, "read error at byte %zu: %s", off, errno ? strerror(errno) : "short file");
        else
            rc = convert_data(data, es, &a, msg, sizeof msg);
    }
    close(fd);
    free(buf);
    free(data);
    if (rc) {
        free(a.data);
        return st_errf(err, errlen, "%s: %s", path, msg);
    }
    *out = a;
    return 0;
}

int npy_write_f32(const char *path, int rank, const int64_t *shape, const float *data, char *err, size_t errlen) {
    if (rank < 0 || rank > NPY_MAX_RANK || (rank && !shape))
        return st_errf(err, errlen, "%s: rank %d outside 0..%d", path, rank, NPY_MAX_RANK);
    char dict[512];
    int k = snprintf(dict, sizeof dict, "{'descr': '<f4', 'fortran_order': False, 'shape': (");
    uint64_t numel = 1;
    for (int i = 0; i < rank; i++) {
        if (shape[i] < 0 || (shape[i] && numel > (uint64_t)INT64_MAX / 8 / (uint64_t)shape[i]))
            return st_errf(err, errlen, "%s: shape[%d] = %" PRId64 " is negative or too large", path, i, shape[i]);
        numel *= (uint64_t)shape[i];
        k += snprintf(dict + k, sizeof dict - (size_t)k, i ? ", %" PRId64 : "%" PRId64, shape[i]);
    }
    k += snprintf(dict + k, sizeof dict - (size_t)k, rank == 1 ? ",), }" : "), }");
    if (numel && !data) return st_errf(err, errlen, "%s: NULL data", path);
    /* numpy pads the header with spaces and a newline so data starts 64-byte aligned;
     * our dict (< 512 bytes) always fits a 1.0 header */
    size_t total = 10 + (size_t)k + 1;
    size_t pad = (64 - total % 64) % 64;
    size_t hlen = (size_t)k + pad + 1;
    uint8_t pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (uint8_t)hlen, (uint8_t)(hlen >> 8)};
    st_atomic a;
    if (st_atomic_begin(&a, path, err, errlen)) return -1;
    int ok = fwrite(pre, 1, 10, a.fp) == 10 && fwrite(dict, 1, (size_t)k, a.fp) == (size_t)k;
    for (size_t i = 0; ok && i < pad; i++) ok = fputc(' ', a.fp) != EOF;
    ok = ok && fputc('\n', a.fp) != EOF;
    uint8_t chunk[1 << 14]; /* little-endian bytes whatever the host order */
    for (uint64_t i = 0; ok && i < numel;) {
        size_t m = 0;
        for (; i < numel && m < sizeof chunk; i++, m += 4) {
            uint32_t u;
            memcpy(&u, &data[i], 4);
            chunk[m] = (uint8_t)u;
            chunk[m + 1] = (uint8_t)(u >> 8);
            chunk[m + 2] = (uint8_t)(u >> 16);
            chunk[m + 3] = (uint8_t)(u >> 24);
        }
        ok = fwrite(chunk, 1, m, a.fp) == m;
    }
    if (!ok) {
        st_errf(err, errlen, "%s: write failed: %s", path, strerror(errno));
        st_atomic_abort(&a);
        return -1;
    }
    return st_atomic_commit(&a, err, errlen);
}
