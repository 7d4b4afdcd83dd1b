/* libFuzzer target for diffusers config.json parsing: any input must parse into a valid
 * configuration or fail with a message, leaving the configuration untouched.
 * Build: CC=clang cmake -DCONVWEAVE_FUZZ=ON ...; run: fuzz_vae_config tests/corpus/config_json */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vae.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    vae_config c, before;
    char err[VAE_ERR_LEN];
    if (vae_preset(&c, "sd", err, sizeof err)) abort();
    before = c;
    err[0] = '\0';
    if (vae_config_parse_json(&c, (const char *)data, size, "config.json", err, sizeof err) != 0) {
        if (!err[0] || memcmp(&c, &before, sizeof c)) abort(); /* say why, change nothing */
        return 0;
    }
    if (vae_config_validate(&c, err, sizeof err) != 0) abort(); /* a parsed config is usable */
    (void)vae_upscale(&c);
    return 0;
}
