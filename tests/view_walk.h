/* Walking a strided view (tests only): the element offsets of a cw_tensor_desc's view in
 * row-major order of its dims, as the communicators' tests and test doubles pack them. */
#ifndef CW_VIEW_WALK_H
#define CW_VIEW_WALK_H

#include "convweave/convweave.h"

/* Element offsets of v (strides filled) in row-major order of its dims into out (numel(v)
 * entries); returns how many. */
static inline int64_t view_offsets(const cw_tensor_desc *v, int64_t *out) {
    int64_t n = cw_tensor_desc_numel(v), idx[CW_MAX_RANK] = {0};
    for (int64_t e = 0; e < n; e++) {
        int64_t off = 0;
        for (int q = 0; q < v->rank; q++) off += idx[q] * v->strides[q];
        out[e] = off;
        for (int q = v->rank - 1; q >= 0; q--) {
            if (++idx[q] < v->dims[q]) break;
            idx[q] = 0;
        }
    }
    return n;
}

#endif
