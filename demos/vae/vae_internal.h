/* Internals shared by the vae_*.c files (not part of vae.h): the weight source's fields, the
 * architecture walk's state and the small helpers more than one of them needs. */
#ifndef CWVAE_VAE_INTERNAL_H
#define CWVAE_VAE_INTERNAL_H

#include "safetensors.h"
#include "vae.h"

struct vae_weights {
    st_file *st;            /* NULL: random */
    uint64_t seed;
    int allow_nonfinite;
    unsigned char *used;    /* per tensor (header order): consumed by the last check walk */
};

#define KEY_LEN 256

/* Export mode's tensors: every weight as cw-vae reads it, under diffusers' current names. */
typedef struct vae_export {
    int n, cap;
    char **names;
    float **data;
    int64_t (*shapes)[4];
    int *ranks;
} vae_export;

/* The walk over the architecture (vae_graph.c): with m it builds the graph, without it
 * checks keys and shapes (w set), counts bytes, or exports (exp set). */
typedef struct bld {
    vae_model *m;          /* NULL: check keys and shapes (w != NULL) or count bytes only */
    cw_graph *g;
    vae_weights *w;
    const vae_config *cfg;
    cw_status st;
    char *err;
    size_t errlen;
    float *buf;            /* staging for one weight (room for its elements as f32) */
    size_t buf_cap;
    int64_t count;         /* count mode: f32 bytes of the weights walked */
    int stages;            /* record block outputs in m->stage */
    vae_export *exp;       /* m NULL and exp set: export mode, every weight read into exp */
} bld;

/* Records st and "what: STATUS: the context's message" in b. */
void vae__fail_ctx(bld *b, cw_status st, const char *what);
/* The decoder from latent z / the encoder from image img; the node of the output. */
cw_node vae__decoder(bld *b, cw_node z);
cw_node vae__encoder(bld *b, cw_node img);

/* Weight `key` of w after checking its shape (legacy attention names too); marks it used. */
int vae__lookup(vae_weights *w, const char *key, int rank, const int64_t *shape, const st_tensor **out, char *err,
                size_t errlen);
/* 1 when key names an attention projection (to_q, to_k, to_v, to_out.0). */
int vae__is_attn_key(const char *key);

uint64_t vae__splitmix(uint64_t *s);
int vae__ends_with(const char *s, const char *suffix);
/* "[a, b, c]" */
void vae__shape_str(char *buf, size_t len, int rank, const int64_t *shape);
/* "NaN at [n, c, y, x] (flat index i)" for the value v at flat index i. */
void vae__index_str(char *buf, size_t len, float v, int64_t i, int rank, const int64_t *dims);

#endif
