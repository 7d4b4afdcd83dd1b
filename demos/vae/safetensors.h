/* .safetensors reader and f32 writer for cw-vae: an 8-byte little-endian header length N,
 * N bytes of JSON ({name: {dtype, shape, data_offsets}, "__metadata__": {str: str}}),
 * then the data section. Every field is validated; errors name the key, offset or byte. */
#ifndef CWVAE_SAFETENSORS_H
#define CWVAE_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "convweave/convweave.h" /* cw_dtype_convert */

#ifdef __cplusplus
extern "C" {
#endif

#define ST_MAX_RANK 8
/* The JSON header may be at most this long (the reference implementation's cap). */
#define ST_MAX_HEADER_BYTES (100u * 1024u * 1024u)

typedef enum st_dtype { ST_F32 = 0, ST_F16 = 1, ST_BF16 = 2 } st_dtype;

typedef struct st_tensor {
    const char *name;            /* owned by the st_file */
    st_dtype dtype;
    int rank;                    /* 0 (scalar) .. ST_MAX_RANK */
    int64_t shape[ST_MAX_RANK];
    int64_t numel;               /* product of shape (1 for a scalar) */
    uint64_t begin, end;         /* data_offsets: [begin, end) relative to the data section */
    const uint8_t *data;         /* begin's address: little-endian, possibly unaligned */
} st_tensor;

typedef struct st_file st_file;

/* Name ("F32") and element size in bytes of a dtype. */
const char *st_dtype_name(st_dtype dt);
size_t st_dtype_size(st_dtype dt);

/* Opens and validates path (mmapped read-only; falls back to reading it whole).
 * Returns 0 and sets *out, or -1 with a message in err (which may be NULL) and *out = NULL. */
int st_open(st_file **out, const char *path, char *err, size_t errlen);
/* Same checks on len bytes in memory; the bytes are copied, buf may be freed after. */
int st_parse(st_file **out, const uint8_t *buf, size_t len, char *err, size_t errlen);
/* Frees everything; accepts NULL. Tensor pointers die with the file. */
void st_close(st_file *f);

/* Tensors in header order (not sorted by name or offset). */
size_t st_count(const st_file *f);
const st_tensor *st_at(const st_file *f, size_t i);
/* i such that st_at(f, i) == t, for t a tensor of f. */
size_t st_index(const st_file *f, const st_tensor *t);
/* The tensor called key, or NULL. */
const st_tensor *st_find(const st_file *f, const char *key);
/* "__metadata__" string for key, or NULL (also when the file has no metadata). */
const char *st_metadata(const st_file *f, const char *key);

/* Reads t's data into dst as n elements of dtype `as`, in host byte order; n must equal
 * t->numel. When `as` is t's dtype, dst gets the file's bits unchanged (an F16 weight used as
 * f16 is never widened to f32 and back); else they are converted with cw_dtype_convert:
 * widening to F32 is exact, narrowing rounds to nearest, ties to even. Returns 0, or -1
 * with a message. */
int st_read(const st_file *f, const st_tensor *t, st_dtype as, void *dst, size_t n, char *err, size_t errlen);
/* st_read as F32: dst holds n floats. */
int st_read_f32(const st_file *f, const st_tensor *t, float *dst, size_t n, char *err,
                size_t errlen);

/* Writes n tensors to path: names[i] with ranks[i] dims shapes[i]; data[i] holds the
 * tensor in dtypes[i]'s little-endian bytes (raw) or as floats (st_write, all F32).
 * metadata is NULL or a NULL-terminated list of key, value, key, value, ... strings.
 * The file is written to a temporary in the same directory and renamed over path, so an
 * existing path is only replaced by a complete file. Returns 0, or -1 with a message. */
int st_write(const char *path, int n, const char *const *names, const int64_t *const *shapes,
             const int *ranks, const float *const *data, char *err, size_t errlen);
int st_write_raw(const char *path, int n, const char *const *names, const st_dtype *dtypes,
                 const int64_t *const *shapes, const int *ranks, const void *const *data,
                 const char *const *metadata, char *err, size_t errlen);

/* Atomic file replacement shared by the safetensors, npy and PNG writers: begin opens
 * "<path>.tmp-XXXXXX" beside path; commit flushes, closes and renames it over path;
 * abort closes and removes it. Commit and abort always consume the handle. */
typedef struct st_atomic {
    FILE *fp;
    char *tmp;
    char *path;
} st_atomic;
int st_atomic_begin(st_atomic *a, const char *path, char *err, size_t errlen);
int st_atomic_commit(st_atomic *a, char *err, size_t errlen);
void st_atomic_abort(st_atomic *a);

#ifdef __cplusplus
}
#endif
/* Formats a message into err (when err and errlen are non-zero) and returns -1: the error
 * convention of every demos/vae file. */
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
int st_errf(char *err, size_t errlen, const char *fmt, ...);

#endif
