/* The NCCL communicator's public entry points (convweave_cuda.h): argument checks in front
 * of backend/cuda/comm_nccl.c, or CW_ERR_UNSUPPORTED in builds without NCCL; and the host
 * arithmetic that cuts a strided message into pieces and 2-D copies. */
#include <string.h>

#include "backend/comm_nccl.h"
#include "convweave/convweave_cuda.h"

cw_status cw_comm_nccl_init(cw_comm *out, void *nccl_comm, int rank, int n_ranks) {
    if (!out) return cw__error(NULL, CW_ERR_INVALID_ARG, "cw_comm_nccl_init: out is NULL");
    memset(out, 0, sizeof *out);
    if (!nccl_comm) return cw__error(NULL, CW_ERR_INVALID_ARG, "cw_comm_nccl_init: nccl_comm is NULL");
    if (n_ranks < 1) return cw__error(NULL, CW_ERR_INVALID_ARG, "cw_comm_nccl_init: n_ranks = %d, must be >= 1", n_ranks);
    if (rank < 0 || rank >= n_ranks)
        return cw__error(NULL, CW_ERR_INVALID_ARG, "cw_comm_nccl_init: rank = %d outside 0..%d", rank, n_ranks - 1);
#ifdef CW_HAVE_NCCL
    return cw__comm_nccl_init(out, nccl_comm, rank, n_ranks);
#else
    return cw__error(NULL, CW_ERR_UNSUPPORTED,
                     "cw_comm_nccl_init: convweave was built without NCCL (CONVWEAVE_NCCL=OFF, no cuda backend, or "
                     "nccl.h / libnccl not found)");
#endif
}

void cw_comm_nccl_destroy(cw_comm *comm) {
#ifdef CW_HAVE_NCCL
    if (comm && cw__comm_nccl_owns(comm)) cw__comm_nccl_destroy(comm);
#else
    (void)comm;
#endif
}

const char *cw_comm_nccl_get_last_error(const cw_comm *comm) {
#ifdef CW_HAVE_NCCL
    if (comm && cw__comm_nccl_owns(comm)) return cw__comm_nccl_last_error(comm);
#else
    (void)comm;
#endif
    return "";
}

/* ---- pieces and 2-D copies ---------------------------------------------------------- */
void cw__comm_pieces_plan(const cw_tensor_desc *d, int64_t cap, cw__comm_pieces *p) {
    int64_t es = (int64_t)cw_dtype_size(d->dtype), numel = 1;
    for (int i = 0; i < d->rank; i++) numel *= d->dims[i];
    memset(p, 0, sizeof *p);
    if (numel == 0) return;
    /* the outermost axis whose one index (its inner block) fits in a piece; the last
     * axis's inner block is one element, which always fits */
    int64_t inner = numel * es, outer = 1;
    int a = 0;
    for (; a < d->rank; a++) {
        inner /= d->dims[a];
        if (inner <= cap) break;
        outer *= d->dims[a];
    }
    if (a == d->rank) a = d->rank - 1; /* unreachable for cap >= es */
    int64_t step = cap / inner;
    if (step < 1) step = 1;
    if (step > d->dims[a]) step = d->dims[a];
    p->axis = a;
    p->step = step;
    p->per_outer = (d->dims[a] + step - 1) / step;
    p->count = outer * p->per_outer;
    p->max_bytes = step * inner;
}

void cw__comm_piece(const cw_tensor_desc *d, const cw__comm_pieces *p, int64_t i, cw_tensor_desc *sub,
                    int64_t *elem_off) {
    *sub = *d;
    int64_t o = i / p->per_outer, j = i % p->per_outer, off = 0;
    for (int q = p->axis - 1; q >= 0; q--) { /* unravel o over dims[0 .. axis), row-major */
        off += (o % d->dims[q]) * d->strides[q];
        o /= d->dims[q];
        sub->dims[q] = 1;
    }
    int64_t first = j * p->step, n = d->dims[p->axis] - first;
    sub->dims[p->axis] = n < p->step ? n : p->step;
    *elem_off = off + first * d->strides[p->axis];
}

void cw__comm_copy2d_plan(const cw_tensor_desc *d, size_t es, cw__comm_copy2d *c) {
    /* fold: drop dims of 1, merge a dim into its inner neighbour where it steps over it
     * exactly; levels then go outermost first, strides in bytes */
    int64_t dims[CW_MAX_RANK], strides[CW_MAX_RANK];
    int m = 0;
    for (int i = 0; i < d->rank; i++) {
        if (d->dims[i] == 1) continue;
        dims[m] = d->dims[i];
        strides[m] = d->strides[i] * (int64_t)es;
        m++;
    }
    for (int i = m - 2; i >= 0; i--) {
        if (strides[i] == dims[i + 1] * strides[i + 1]) {
            dims[i] *= dims[i + 1];
            strides[i] = strides[i + 1];
            for (int k = i + 1; k < m - 1; k++) {
                dims[k] = dims[k + 1];
                strides[k] = strides[k + 1];
            }
            m--;
        }
    }
    memset(c, 0, sizeof *c);
    int rows; /* index of the level the block's rows run along; -1: one row */
    if (m == 0) {
        c->width = (int64_t)es;
        rows = -1;
        m = 0;
    } else if (strides[m - 1] == (int64_t)es) {
        c->width = dims[m - 1] * (int64_t)es; /* a contiguous run of elements per row */
        rows = m - 2;
        m -= 1;
    } else {
        c->width = (int64_t)es; /* elements apart: one element per row */
        rows = m - 1;
    }
    if (rows >= 0) {
        c->height = dims[rows];
        c->pitch = strides[rows];
        m = rows;
    } else {
        c->height = 1;
        c->pitch = c->width;
    }
    c->n_outer = m;
    for (int i = 0; i < m; i++) {
        c->outer_dims[i] = dims[i];
        c->outer_strides[i] = strides[i];
    }
    c->contiguous = c->height == 1 && c->n_outer == 0;
}

int64_t cw__comm_copy2d_blocks(const cw__comm_copy2d *c) {
    int64_t n = 1;
    for (int i = 0; i < c->n_outer; i++) n *= c->outer_dims[i];
    return n;
}

int64_t cw__comm_copy2d_block(const cw__comm_copy2d *c, int64_t b) {
    int64_t off = 0;
    for (int i = c->n_outer - 1; i >= 0; i--) {
        off += (b % c->outer_dims[i]) * c->outer_strides[i];
        b /= c->outer_dims[i];
    }
    return off;
}
