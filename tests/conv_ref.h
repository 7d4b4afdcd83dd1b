/* Naive double-precision convolution reference for tests (independent of the library's
 * conv code): public descriptors and params in, a contiguous double output out.
 * Linked into every test (tests/support_conv_ref.c). */
#ifndef CW_CONV_REF_H
#define CW_CONV_REF_H

#include "convweave/convweave.h"

/* yd[n, k, (od,) oh, ow] (contiguous over y's dims) = sum over c in k's group and taps of
 * w * x (zero outside the input) + b[k]. x and w may be strided views (strides in elements,
 * all zero = contiguous); bias may be NULL. Only y's dims are used. */
void cw_ref_conv(const cw_tensor_desc *x, const float *xd, const cw_tensor_desc *w, const float *wd,
                 const float *bias, const cw_conv_params *p, const cw_tensor_desc *y, double *yd);

/* Relative error of a strided float view against the contiguous reference over y's dims:
 * max|a - r| / max(max|r|, 1e-30). NaN in a gives +inf. */
double cw_ref_rel_err(const cw_tensor_desc *y, const float *yv, const double *ref);

/* Element offset of multi-index idx in a view (strides all zero = contiguous). */
int64_t cw_ref_offset(const cw_tensor_desc *d, const int64_t *idx);

#endif
