/* NVTX ranges in the "convweave" domain: one category per stage kind, one colour per
 * stream. Compiled to nothing without the nvtx3 headers. */
#ifndef CW_NVTX_H
#define CW_NVTX_H

#include <stdint.h>

/* Pushes a range named `name` on the calling thread. category: CW_STAGE_* + 1 (0: run). */
void cw__nvtx_push(const char *name, int category, int stream);
void cw__nvtx_pop(void);
/* The name of a stage kind (CW_STAGE_*: "conv", "prep", ...; "run" for -1): the NVTX
 * categories and the Chrome trace's "cat" use the same names. */
const char *cw__stage_name(int stage);
/* 1 when NVTX support was compiled in. */
int cw__nvtx_compiled(void);

#endif
