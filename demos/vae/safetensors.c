/* .safetensors reading: the cJSON header validated strictly as the reference implementation
 * does (messages name the key, offset or byte), a tensor read in its stored dtype or
 * converted (cw_dtype_convert), a mapping truncated under us an error. The writer is in
 * safetensors_write.c. Uses libc, cJSON and lib/core/dtype.c only (the fuzz target's set). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "safetensors.h"

#include <setjmp.h>
#include <signal.h>

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sys.h"

struct st_file {
    uint8_t *buf;          /* whole file */
    size_t len;
    int mapped;            /* buf is an mmap (else malloc) */
    const uint8_t *data;   /* data section: buf + 8 + N */
    uint64_t data_len;
    st_tensor *t;          /* header order */
    size_t n;
    const st_tensor **by_name; /* t sorted by name, for st_find */
    char **meta;           /* key, value, key, value ... */
    size_t nmeta;
    char *path;            /* st_open's path, for messages (NULL from st_parse) */
};

int st_errf(char *err, size_t errlen, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

const char *st_dtype_name(st_dtype dt) {
    switch (dt) {
    case ST_F32: return "F32";
    case ST_F16: return "F16";
    case ST_BF16: return "BF16";
    }
    return "?";
}

size_t st_dtype_size(st_dtype dt) {
    switch (dt) {
    case ST_F32: return 4;
    case ST_F16: return 2;
    case ST_BF16: return 2;
    }
    return 0;
}

static uint64_t le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* ---- header validation ---- */

#define ST_MAX_INT 9007199254740992.0 /* 2^53: JSON numbers past it lose integer precision */

/* A JSON value that is an integer in [0, 2^53]; describes it in what otherwise. */
static int json_uint(const cJSON *v, uint64_t *out, char *what, size_t whatlen) {
    if (!cJSON_IsNumber(v)) {
        snprintf(what, whatlen, "is not a number");
        return 0;
    }
    double d = v->valuedouble;
    if (!(d >= 0.0) || d > ST_MAX_INT || d != floor(d)) {
        snprintf(what, whatlen, "= %.17g is not a non-negative integer <= 2^53", d);
        return 0;
    }
    *out = (uint64_t)d;
    return 1;
}

static int cmp_offset(const void *a, const void *b) {
    const st_tensor *x = *(const st_tensor *const *)a, *y = *(const st_tensor *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

static int cmp_name(const void *a, const void *b) {
    return strcmp((*(const st_tensor *const *)a)->name, (*(const st_tensor *const *)b)->name);
}

static int parse_tensor(st_file *f, st_tensor *t, const cJSON *e, char *err, size_t errlen) {
    const char *k = t->name;
    char what[96];
    if (!cJSON_IsObject(e)) return st_errf(err, errlen, "tensor '%s': entry is not a JSON object", k);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!dt) return st_errf(err, errlen, "tensor '%s': missing \"dtype\"", k);
    if (!sh) return st_errf(err, errlen, "tensor '%s': missing \"shape\"", k);
    if (!off) return st_errf(err, errlen, "tensor '%s': missing \"data_offsets\"", k);

    if (!cJSON_IsString(dt) || !dt->valuestring)
        return st_errf(err, errlen, "tensor '%s': \"dtype\" is not a string", k);
    if (!strcmp(dt->valuestring, "F32")) t->dtype = ST_F32;
    else if (!strcmp(dt->valuestring, "F16")) t->dtype = ST_F16;
    else if (!strcmp(dt->valuestring, "BF16")) t->dtype = ST_BF16;
    else
        return st_errf(err, errlen, "tensor '%s': dtype '%.32s' is not supported (F32, F16, BF16)", k,
                      dt->valuestring);

    if (!cJSON_IsArray(sh)) return st_errf(err, errlen, "tensor '%s': \"shape\" is not an array", k);
    int rank = cJSON_GetArraySize(sh);
    if (rank > ST_MAX_RANK)
        return st_errf(err, errlen, "tensor '%s': shape has %d dims, more than %d", k, rank, ST_MAX_RANK);
    t->rank = rank;
    uint64_t numel = 1;
    int i = 0;
    for (const cJSON *d = sh->child; d; d = d->next, i++) {
        uint64_t v;
        if (!json_uint(d, &v, what, sizeof what))
            return st_errf(err, errlen, "tensor '%s': shape[%d] %s", k, i, what);
        if (v > (uint64_t)INT64_MAX) return st_errf(err, errlen, "tensor '%s': shape[%d] too large", k, i);
        t->shape[i] = (int64_t)v;
        /* the product must stay within int64 (and its byte size, checked below) */
        if (v && numel > (uint64_t)INT64_MAX / v)
            return st_errf(err, errlen, "tensor '%s': shape product overflows 64 bits at shape[%d]", k, i);
        numel *= v;
    }
    t->numel = (int64_t)numel;
    uint64_t es = st_dtype_size(t->dtype);
    if (numel > (uint64_t)INT64_MAX / es)
        return st_errf(err, errlen, "tensor '%s': byte size of %" PRIu64 " elements overflows", k, numel);
    uint64_t nbytes = numel * es;

    if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2)
        return st_errf(err, errlen, "tensor '%s': \"data_offsets\" is not an array of two integers", k);
    if (!json_uint(off->child, &t->begin, what, sizeof what))
        return st_errf(err, errlen, "tensor '%s': data_offsets[0] %s", k, what);
    if (!json_uint(off->child->next, &t->end, what, sizeof what))
        return st_errf(err, errlen, "tensor '%s': data_offsets[1] %s", k, what);
    if (t->begin > t->end)
        return st_errf(err, errlen, "tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] begin > end", k,
                      t->begin, t->end);
    if (t->end > f->data_len)
        return st_errf(err, errlen,
                      "tensor '%s': data_offsets end %" PRIu64 " is past the data section's %" PRIu64
                      " bytes (file byte %" PRIu64 " of %zu)",
                      k, t->end, f->data_len, (uint64_t)(f->data - f->buf) + t->end, f->len);
    if (t->end - t->begin != nbytes)
        return st_errf(err, errlen,
                      "tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] span %" PRIu64
                      " bytes but %" PRIu64 " %s elements need %" PRIu64,
                      k, t->begin, t->end, t->end - t->begin, numel, st_dtype_name(t->dtype), nbytes);
    t->data = f->data + t->begin;
    return 0;
}

static int parse_metadata(st_file *f, const cJSON *m, char *err, size_t errlen) {
    if (f->meta) return st_errf(err, errlen, "\"__metadata__\" appears twice");
    if (!cJSON_IsObject(m)) return st_errf(err, errlen, "\"__metadata__\" is not a JSON object");
    size_t n = (size_t)cJSON_GetArraySize(m);
    f->meta = calloc(2 * n + 1, sizeof(char *));
    if (!f->meta) return st_errf(err, errlen, "out of memory for %zu metadata entries", n);
    for (const cJSON *c = m->child; c; c = c->next) {
        if (!cJSON_IsString(c) || !c->valuestring)
            return st_errf(err, errlen, "\"__metadata__\" entry '%s' is not a string", c->string ? c->string : "");
        f->meta[2 * f->nmeta] = strdup(c->string ? c->string : "");
        f->meta[2 * f->nmeta + 1] = strdup(c->valuestring);
        f->nmeta++;
        if (!f->meta[2 * f->nmeta - 2] || !f->meta[2 * f->nmeta - 1])
            return st_errf(err, errlen, "out of memory for metadata");
    }
    return 0;
}

/* A NUL inside the header (raw, or the escape \u0000 in a string) would cut a key short in
 * C: "decoder.conv_in.bias\u0000junk" read as decoder.conv_in.bias. Returns 0 or -1 with the
 * file byte. */
static int header_nul(const uint8_t *js, uint64_t hl, char *err, size_t errlen) {
    int in_str = 0;
    for (uint64_t i = 0; i < hl; i++) {
        if (js[i] == 0) return st_errf(err, errlen, "header has a NUL byte at file byte %" PRIu64, i + 8);
        if (!in_str) {
            in_str = js[i] == '"';
            continue;
        }
        if (js[i] == '"') {
            in_str = 0;
        } else if (js[i] == '\\' && i + 1 < hl) {
            if (js[i + 1] == 'u' && i + 5 < hl && !memcmp(js + i + 2, "0000", 4))
                return st_errf(err, errlen, "header string has an escaped NUL (U+0000) at file byte %" PRIu64
                               ": a key with a NUL inside is refused", i + 8);
            i++; /* the escaped character */
        }
    }
    return 0;
}

/* The reference implementation's rule: sorted by offset, the tensors tile the data section
 * exactly: no overlap, no hole, nothing before the first or after the last (an appended ZIP,
 * trailing junk). Expects f->by_name sorted by (begin, end). */
static int check_tiling(const st_file *f, char *err, size_t errlen) {
    uint64_t at = 0, base = (uint64_t)(f->data - f->buf);
    for (size_t i = 0; i < f->n; i++) {
        const st_tensor *b = f->by_name[i];
        if (b->begin < at)
            return st_errf(err, errlen, "tensors '%s' [%" PRIu64 ", %" PRIu64 ") and '%s' [%" PRIu64 ", %" PRIu64
                           ") overlap", f->by_name[i - 1]->name, f->by_name[i - 1]->begin, f->by_name[i - 1]->end,
                           b->name, b->begin, b->end);
        if (b->begin > at)
            return st_errf(err, errlen, "tensor '%s' begins at data byte %" PRIu64 " (file byte %" PRIu64 "), %"
                           PRIu64 " bytes after %s: the data section has a hole (unused bytes at file bytes %"
                           PRIu64 "-%" PRIu64 ")", b->name, b->begin, base + b->begin, b->begin - at,
                           i ? "the previous tensor's end" : "the data section's start", base + at,
                           base + b->begin - 1);
        at = b->end;
    }
    if (at != f->data_len)
        return st_errf(err, errlen, "%" PRIu64 " bytes follow the last tensor's data (file bytes %" PRIu64 "-%" PRIu64
                       " of %zu): trailing bytes or an appended file are refused", f->data_len - at, base + at,
                       base + f->data_len - 1, f->len);
    return 0;
}

/* Validates f->buf / f->len and fills the tensor table. */
static int parse_buffer(st_file *f, char *err, size_t errlen) {
    if (f->len < 8)
        return st_errf(err, errlen, "file is %zu bytes, shorter than the 8-byte header length", f->len);
    uint64_t hl = le64(f->buf);
    if (hl > f->len - 8)
        return st_errf(err, errlen,
                      "header length %" PRIu64 " (bytes 0-7) runs past the end of the file: only %zu bytes follow",
                      hl, f->len - 8);
    if (hl > ST_MAX_HEADER_BYTES)
        return st_errf(err, errlen, "header length %" PRIu64 " (bytes 0-7) exceeds the %u-byte limit", hl,
                      ST_MAX_HEADER_BYTES);
    if (hl < 2) return st_errf(err, errlen, "header length %" PRIu64 " (bytes 0-7) is too small for JSON", hl);
    f->data = f->buf + 8 + hl;
    f->data_len = f->len - 8 - hl;

    if (header_nul(f->buf + 8, hl, err, errlen)) return -1;
    const char *js = (const char *)f->buf + 8, *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(js, (size_t)hl, &end, 0);
    if (!root) {
        size_t pos = end && end >= js ? (size_t)(end - js) : 0;
        return st_errf(err, errlen, "header JSON is invalid at header byte %zu (file byte %zu)", pos, pos + 8);
    }
    int rc = -1;
    /* only padding spaces (as the reference writer uses) may follow the JSON value */
    for (const char *p = end; p < js + hl; p++) {
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            st_errf(err, errlen, "unexpected byte 0x%02x after the header JSON at file byte %zu",
                   (unsigned char)*p, (size_t)(p - js) + 8);
            goto out;
        }
    }
    if (!cJSON_IsObject(root)) {
        st_errf(err, errlen, "header JSON is not an object");
        goto out;
    }
    size_t cap = (size_t)cJSON_GetArraySize(root);
    f->t = calloc(cap ? cap : 1, sizeof(st_tensor));
    f->by_name = calloc(cap ? cap : 1, sizeof(st_tensor *));
    if (!f->t || !f->by_name) {
        st_errf(err, errlen, "out of memory for %zu header entries", cap);
        goto out;
    }
    for (const cJSON *c = root->child; c; c = c->next) {
        const char *k = c->string ? c->string : "";
        if (!strcmp(k, "__metadata__")) {
            if (parse_metadata(f, c, err, errlen)) goto out;
            continue;
        }
        st_tensor *t = &f->t[f->n];
        t->name = strdup(k);
        if (!t->name) {
            st_errf(err, errlen, "out of memory for tensor names");
            goto out;
        }
        f->n++; /* counted now so st_close frees the name on error */
        if (parse_tensor(f, t, c, err, errlen)) goto out;
    }

    for (size_t i = 0; i < f->n; i++) f->by_name[i] = &f->t[i];
    /* sorted by (begin, end), the tensors must tile the data section */
    qsort(f->by_name, f->n, sizeof(st_tensor *), cmp_offset);
    if (check_tiling(f, err, errlen)) goto out;
    qsort(f->by_name, f->n, sizeof(st_tensor *), cmp_name);
    for (size_t i = 1; i < f->n; i++) {
        if (!strcmp(f->by_name[i - 1]->name, f->by_name[i]->name)) {
            st_errf(err, errlen, "tensor '%s' appears twice in the header", f->by_name[i]->name);
            goto out;
        }
    }
    rc = 0;
out:
    cJSON_Delete(root);
    return rc;
}

int st_parse(st_file **out, const uint8_t *buf, size_t len, char *err, size_t errlen) {
    *out = NULL;
    if (!buf && len) return st_errf(err, errlen, "NULL buffer of %zu bytes", len);
    st_file *f = calloc(1, sizeof *f);
    if (!f) return st_errf(err, errlen, "out of memory");
    f->buf = malloc(len ? len : 1);
    if (!f->buf) {
        free(f);
        return st_errf(err, errlen, "out of memory for %zu bytes", len);
    }
    if (len) memcpy(f->buf, buf, len);
    f->len = len;
    if (parse_buffer(f, err, errlen)) {
        st_close(f);
        return -1;
    }
    *out = f;
    return 0;
}

/* A mapped file truncated by another process while it is read raises SIGBUS on the first
 * page past its new end. guarded() runs fn with a SIGBUS handler that jumps back, so that
 * becomes an error naming the file. One guard at a time: cw-vae reads weights on one thread. */
static sigjmp_buf bus_jmp;
static volatile sig_atomic_t bus_armed;

static void on_sigbus(int sig) {
    if (bus_armed) siglongjmp(bus_jmp, 1);
    signal(sig, SIG_DFL);
    raise(sig);
}

/* fn(arg) with SIGBUS turned into -2 (not guarded when f is not a mapping). */
static int guarded(const st_file *f, int (*fn)(void *), void *arg) {
    if (!f->mapped) return fn(arg);
    struct sigaction sa, old;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_sigbus;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, &old);
    int rc = -2;
    if (sigsetjmp(bus_jmp, 1) == 0) {
        bus_armed = 1;
        rc = fn(arg);
    }
    bus_armed = 0;
    sigaction(SIGBUS, &old, NULL);
    return rc;
}

typedef struct parse_args {
    st_file *f;
    char *err;
    size_t errlen;
} parse_args;

static int parse_call(void *arg) {
    parse_args *p = arg;
    return parse_buffer(p->f, p->err, p->errlen);
}

/* Maps the file (or reads it whole where it cannot be mapped). */
static int load_file(st_file *f, int fd, const char *path, char *err, size_t errlen) {
    void *m = f->len ? mmap(NULL, f->len, PROT_READ, MAP_PRIVATE, fd, 0) : MAP_FAILED;
    if (m != MAP_FAILED) {
        f->buf = m;
        f->mapped = 1;
        return 0;
    }
    f->buf = malloc(f->len ? f->len : 1); /* no mmap (or an empty file): read it whole */
    size_t got = 0;
    while (f->buf && got < f->len) {
        ssize_t r = read(fd, f->buf + got, f->len - got);
        if (r <= 0) break;
        got += (size_t)r;
    }
    if (!f->buf || got != f->len) return st_errf(err, errlen, "%s: cannot read %zu bytes", path, f->len);
    return 0;
}

int st_open(st_file **out, const char *path, char *err, size_t errlen) {
    *out = NULL;
    struct stat sb;
    char msg[512];
    int fd = sys_open_regular(path, &sb, msg, sizeof(msg)); /* a FIFO is refused before any open */
    if (fd < 0) return st_errf(err, errlen, "%s", msg);
    st_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        free(f);
        close(fd);
        return st_errf(err, errlen, "%s: out of memory", path);
    }
    f->len = (size_t)sb.st_size;
    int rc = load_file(f, fd, path, err, errlen);
    close(fd);
    if (rc) {
        st_close(f);
        return -1;
    }
    parse_args pa = {f, msg, sizeof msg};
    rc = guarded(f, parse_call, &pa);
    if (rc == -2) snprintf(msg, sizeof(msg), "truncated while being read (SIGBUS in its header)");
    if (rc) {
        st_close(f);
        return st_errf(err, errlen, "%s: %s", path, msg);
    }
    *out = f;
    return 0;
}

void st_close(st_file *f) {
    if (!f) return;
    for (size_t i = 0; i < f->n; i++) free((void *)f->t[i].name);
    for (size_t i = 0; i < 2 * f->nmeta; i++) free(f->meta[i]);
    free(f->meta);
    free(f->t);
    free(f->by_name);
    if (f->mapped) munmap(f->buf, f->len);
    else free(f->buf);
    free(f->path);
    free(f);
}

size_t st_count(const st_file *f) { return f ? f->n : 0; }

const st_tensor *st_at(const st_file *f, size_t i) { return f && i < f->n ? &f->t[i] : NULL; }

size_t st_index(const st_file *f, const st_tensor *t) { return (size_t)(t - f->t); }

const st_tensor *st_find(const st_file *f, const char *key) {
    if (!f || !key) return NULL;
    size_t lo = 0, hi = f->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(f->by_name[mid]->name, key);
        if (c == 0) return f->by_name[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

const char *st_metadata(const st_file *f, const char *key) {
    if (!f || !key) return NULL;
    for (size_t i = 0; i < f->nmeta; i++)
        if (!strcmp(f->meta[2 * i], key)) return f->meta[2 * i + 1];
    return NULL;
}

static cw_dtype st_cw_dtype(st_dtype dt) { return dt == ST_F16 ? CW_F16 : dt == ST_BF16 ? CW_BF16 : CW_F32; }

typedef struct read_args {
    const st_tensor *t;
    st_dtype as;
    void *dst;
    size_t n;
    char *err;
    size_t errlen;
} read_args;

/* Copies (and converts) t's elements from the file's bytes. */
static int read_call(void *arg) {
    const read_args *r = arg;
    const st_tensor *t = r->t;
    st_dtype as = r->as;
    void *dst = r->dst;
    size_t n = r->n;
    char *err = r->err;
    size_t errlen = r->errlen;
    const size_t es = st_dtype_size(t->dtype), eo = st_dtype_size(as);
    const uint8_t *p = t->data;
    enum { CHUNK = 1024 };
    uint32_t tmp[CHUNK]; /* the file's elements in host byte order, before a conversion */
    for (size_t i = 0; i < n; i += CHUNK) {
        size_t m = n - i < CHUNK ? n - i : CHUNK;
        uint8_t *out = (uint8_t *)dst + i * eo;
        void *host = as == t->dtype ? (void *)out : (void *)tmp; /* same dtype: the file's bits */
        for (size_t k = 0; k < m; k++, p += es) {
            if (es == 4) {
                uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
                memcpy((uint8_t *)host + 4 * k, &u, 4);
            } else {
                uint16_t u = (uint16_t)(p[0] | p[1] << 8);
                memcpy((uint8_t *)host + 2 * k, &u, 2);
            }
        }
        if (as != t->dtype && cw_dtype_convert(out, st_cw_dtype(as), tmp, st_cw_dtype(t->dtype), (int64_t)m) != CW_OK)
            return st_errf(err, errlen, "tensor '%s': conversion failed", t->name);
    }
    return 0;
}

int st_read(const st_file *f, const st_tensor *t, st_dtype as, void *dst, size_t n, char *err, size_t errlen) {
    if (!f || !t) return st_errf(err, errlen, "st_read: NULL file or tensor");
    if (t < f->t || t >= f->t + f->n) return st_errf(err, errlen, "st_read: tensor is not from this file");
    if (st_dtype_size(as) == 0) return st_errf(err, errlen, "st_read: unknown destination dtype %d", (int)as);
    if ((uint64_t)n != (uint64_t)t->numel)
        return st_errf(err, errlen, "tensor '%s' has %" PRId64 " elements, the destination holds %zu", t->name,
                      t->numel, n);
    if (n && !dst) return st_errf(err, errlen, "tensor '%s': NULL destination", t->name);
    read_args ra = {t, as, dst, n, err, errlen};
    int rc = guarded(f, read_call, &ra);
    if (rc == -2)
        return st_errf(err, errlen, "%s: tensor '%s' (file bytes %" PRIu64 "-%" PRIu64 "): the file was truncated "
                       "while being read (SIGBUS)", f->path ? f->path : "(buffer)", t->name,
                       (uint64_t)(f->data - f->buf) + t->begin, (uint64_t)(f->data - f->buf) + t->end);
    return rc;
}

int st_read_f32(const st_file *f, const st_tensor *t, float *dst, size_t n, char *err, size_t errlen) {
    return st_read(f, t, ST_F32, dst, n, err, errlen);
}
