/* Internals of the NCCL communicator (convweave_cuda.h, cw_comm_nccl_*): comm.c checks the
 * public arguments, backend/cuda/comm_nccl.c (built with NCCL only) does the rest. The piece
 * and copy plans are plain host arithmetic, exposed here so tests check them without a
 * device. */
#ifndef CW_BACKEND_COMM_NCCL_H
#define CW_BACKEND_COMM_NCCL_H

#include "core/core.h"

#ifdef CW_HAVE_NCCL
/* Arguments checked by cw_comm_nccl_init (out, nccl_comm non-NULL; 0 <= rank < n_ranks). */
cw_status cw__comm_nccl_init(cw_comm *out, void *nccl_comm, int rank, int n_ranks);
/* 1 when comm was filled by cw__comm_nccl_init. */
int cw__comm_nccl_owns(const cw_comm *comm);
void cw__comm_nccl_destroy(cw_comm *comm);
const char *cw__comm_nccl_last_error(const cw_comm *comm);
/* Opens libnccl and resolves what the transfers call, once per process (no device needed):
 * "" when that worked, else why not. */
const char *cw__comm_nccl_load(void);
/* Test hook: the piece size of comm's later calls (both ranks must agree), bytes >= 16. */
void cw__comm_nccl_set_piece_bytes(cw_comm *comm, int64_t bytes);
#endif

/* How a message (the view d, its elements in row-major order of d's dims) is cut into
 * pieces of at most cap bytes, from dims and dtype alone: dims[axis] is cut into runs of
 * `step` indices, for each index of dims[0 .. axis). */
typedef struct cw__comm_pieces {
    int axis;
    int64_t step;
    int64_t per_outer; /* pieces per index of dims[0 .. axis): ceil(dims[axis] / step) */
    int64_t count;     /* pieces in all; 0 for an empty view */
    int64_t max_bytes; /* bytes of the largest piece (<= cap) */
} cw__comm_pieces;

/* d: rank 1..CW_MAX_RANK, dims >= 0, a dtype of non-zero size; cap >= that size. */
void cw__comm_pieces_plan(const cw_tensor_desc *d, int64_t cap, cw__comm_pieces *p);
/* Piece i (0 <= i < p->count) of d (strides filled) as a view: *sub has d's strides and
 * narrowed dims; *elem_off is its first element's offset from d's, in elements. */
void cw__comm_piece(const cw_tensor_desc *d, const cw__comm_pieces *p, int64_t i, cw_tensor_desc *sub,
                    int64_t *elem_off);

/* A view (strides filled, elements of es bytes) as 2-D copies: for each index of the
 * outer levels (n_outer of them, at most CW_MAX_RANK - 1), one block of `height` rows of
 * `width` bytes, `pitch` bytes apart, whose first byte is the outer levels' offset. Rows
 * of successive blocks follow each other in row-major order of the view's dims. */
typedef struct cw__comm_copy2d {
    int64_t width, height, pitch; /* bytes, rows, bytes */
    int n_outer;
    int64_t outer_dims[CW_MAX_RANK], outer_strides[CW_MAX_RANK]; /* strides in bytes */
    int contiguous; /* one block of one row: the view is contiguous */
} cw__comm_copy2d;

void cw__comm_copy2d_plan(const cw_tensor_desc *d, size_t es, cw__comm_copy2d *c);
/* Byte offset of block b (0 <= b < prod(outer_dims)). */
int64_t cw__comm_copy2d_block(const cw__comm_copy2d *c, int64_t b);
/* Blocks in all: prod(outer_dims). */
int64_t cw__comm_copy2d_blocks(const cw__comm_copy2d *c);

#endif
