/* cw-vae --compare's peer: diffusers' AutoencoderKL on the same config, weights and input,
 * in a child Python process (tools/diffusers_vae.py, built into cw-vae), measured as cw-vae
 * measures itself. */
#ifndef CWVAE_PEER_H
#define CWVAE_PEER_H
#include <signal.h>
#include <stdint.h>
#include <sys/types.h>

#include "vae.h"

typedef struct peer_job {
    const vae_config *cfg;
    int part;                 /* VAE_DECODER or VAE_ENCODER */
    const char *weights;      /* a .safetensors file, or NULL: cw-vae's random weights of seed */
    uint64_t seed;
    int allow_nonfinite;
    const float *in;          /* the input every convweave run got: [dims] f32 */
    int64_t dims[4];
    int64_t out_numel;        /* what cw-vae's graph outputs */
    int threads;              /* <= 0: all cores */
    int repeat;
    cw_dtype dtype;
    int spinner;              /* show elapsed time on stderr while it runs */
    const char *progress;     /* its label */
} peer_job;

typedef struct peer_result {
    int ran;                  /* 1: ms, work_mem, peak_rss, out hold the peer's run */
    int skipped;              /* 1: no Python with torch + diffusers (note says why) */
    char note[512];           /* not ran: why (one line) */
    char python[256];         /* the interpreter, as found */
    char versions[96];        /* "diffusers X, torch Y" */
    int threads;              /* torch's thread count */
    int encode;               /* 1: AutoencoderKL.encode ran, else decode */
    double ms;                /* fastest of repeat runs of the call alone */
    int64_t work_mem;         /* peak resident during the runs minus resident before, bytes */
    int64_t peak_rss;         /* ru_maxrss of the Python process, bytes */
    float *out;               /* out_numel floats (malloc) */
} peer_result;

/* Runs the peer: picks the interpreter (CONVWEAVE_PYTHON, else $CONVWEAVE_VENV/bin/python or
 * ~/.cache/convweave/venv/bin/python where executable, else python3), writes the config,
 * the weights (as vae_weights_export), the input and the script to a temporary folder, runs
 * it and reads its output. *child holds its pid while it runs, so a signal handler can kill
 * it; when *stop becomes non-zero, it is killed and reaped, the folder removed, and -1
 * returned. Else returns 0 with res filled: ran, or a note saying why it was skipped (no
 * interpreter that imports torch and diffusers) or failed. */
int peer_diffusers_run(const peer_job *job, peer_result *res, volatile pid_t *child, volatile sig_atomic_t *stop);
void peer_result_free(peer_result *res);
#endif
