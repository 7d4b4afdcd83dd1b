/* .npy (NumPy format v1.0 / 2.0 / 3.0) reader and f32 writer for cw-vae latents and
 * raw outputs. Reads little-endian '<f4', '<f2' and '<f8' into float; C order only.
 * Malformed headers give an error naming the byte offset. */
#ifndef CWVAE_NPY_H
#define CWVAE_NPY_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define NPY_MAX_RANK 8

typedef struct npy_array {
    int rank;
    int64_t shape[NPY_MAX_RANK];
    int64_t numel;
    char descr[8]; /* dtype as stored in the file: "<f4", "<f2" or "<f8" */
    float *data;   /* numel floats (malloc); release with npy_free */
} npy_array;

/* Reads path into *out (converted to float). Returns 0, or -1 with a message naming the
 * file and byte offset in err (which may be NULL); *out is then empty. */
int npy_read(const char *path, npy_array *out, char *err, size_t errlen);
/* Same from len bytes in memory. */
int npy_parse(const uint8_t *buf, size_t len, npy_array *out, char *err, size_t errlen);
/* Frees out->data and clears the struct; accepts NULL. */
void npy_free(npy_array *a);

/* Writes a C-order '<f4' array (format 1.0: rank <= 8 always fits its header) to a
 * temporary beside path and renames it over path. Returns 0, or -1 with a message. */
int npy_write_f32(const char *path, int rank, const int64_t *shape, const float *data, char *err,
                  size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
