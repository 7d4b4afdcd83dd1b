/* libFuzzer target for the .npy reader (latents, images): any input must parse or fail
 * cleanly, and a parse must hold exactly numel finite-or-not floats of a sane shape.
 * Build: CC=clang cmake -DCONVWEAVE_FUZZ=ON ...; run: fuzz_npy tests/corpus/npy */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "npy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    npy_array a;
    char err[256];
    err[0] = '\0';
    if (npy_parse(data, size, &a, err, sizeof err) != 0) {
        if (a.data || !err[0]) abort(); /* a failure must leave nothing and say why */
        return 0;
    }
    int64_t n = 1;
    if (a.rank < 0 || a.rank > NPY_MAX_RANK) abort();
    for (int i = 0; i < a.rank; i++) {
        if (a.shape[i] < 0) abort();
        n *= a.shape[i];
    }
    if (n != a.numel || (size_t)n > size) abort(); /* the data came from the input */
    volatile float sink = 0;
    for (int64_t i = 0; i < n; i++) sink += a.data[i]; /* every element is readable */
    (void)sink;
    npy_free(&a);
    return 0;
}
