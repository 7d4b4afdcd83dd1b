/* libFuzzer target for the safetensors parser: any input must parse or fail cleanly, and
 * every tensor a successful parse reports must be readable and findable by name.
 * Build: CC=clang cmake -DCONVWEAVE_FUZZ=ON ...; run: fuzz_safetensors tests/corpus/safetensors */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    st_file *f = NULL;
    char err[256];
    if (st_parse(&f, data, size, err, sizeof err) != 0) {
        if (f || !err[0]) abort(); /* a failure must leave no file and say why */
        return 0;
    }
    for (size_t i = 0; i < st_count(f); i++) {
        const st_tensor *t = st_at(f, i);
        if (st_find(f, t->name) != t) abort();
        /* numel <= data bytes / 2, so the buffer is bounded by the input's size */
        float *dst = malloc((size_t)t->numel * sizeof(float) + 1);
        if (!dst) abort();
        if (st_read_f32(f, t, dst, (size_t)t->numel, err, sizeof err) != 0) abort();
        free(dst);
    }
    (void)st_metadata(f, "format");
    st_close(f);
    return 0;
}
