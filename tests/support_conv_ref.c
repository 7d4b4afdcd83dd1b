/* Naive double-precision convolution reference (see conv_ref.h): the simplest loop nest
 * over every output element and every tap, so the library's algorithms have an
 * independent oracle. Shared by the conv tests and any other test that needs it. */
#include <math.h>
#include <string.h>

#include "conv_ref.h"
#include "err_metric.h"

int64_t cw_ref_offset(const cw_tensor_desc *d, const int64_t *idx) {
    int any = 0;
    for (int i = 0; i < d->rank; i++) any |= d->strides[i] != 0;
    int64_t off = 0, s = 1;
    for (int i = d->rank - 1; i >= 0; i--) {
        off += idx[i] * (any ? d->strides[i] : s);
        s *= d->dims[i];
    }
    return off;
}

void cw_ref_conv(const cw_tensor_desc *x, const float *xd, const cw_tensor_desc *w, const float *wd,
                 const float *bias, const cw_conv_params *p, const cw_tensor_desc *y, double *yd) {
    const int sp = p->spatial;
    const int64_t N = y->dims[0], K = y->dims[1], G = p->groups;
    const int64_t Cg = w->dims[1], Kg = K / G;
    /* 2-D as 3-D with one depth slice: index 0 = D, 1 = H, 2 = W */
    int64_t out[3] = {1, 1, 1}, in[3] = {1, 1, 1}, ks[3] = {1, 1, 1};
    int64_t st[3] = {1, 1, 1}, dl[3] = {1, 1, 1}, pp[3] = {0, 0, 0};
    for (int i = 0; i < sp; i++) {
        int j = 3 - sp + i;
        out[j] = y->dims[2 + i];
        in[j] = x->dims[2 + i];
        ks[j] = w->dims[2 + i];
        st[j] = p->stride[i];
        dl[j] = p->dilation[i];
        pp[j] = p->pad_pre[i];
    }
    /* strides with the 2-D case padded to 3 spatial slots (depth stride unused: od = 0) */
    int64_t xs[5] = {0}, wsd[5] = {0};
    {
        int64_t one[5] = {0};
        for (int i = 0; i < x->rank; i++) {
            one[i] = 1;
            xs[i + (sp == 2 && i >= 2)] = cw_ref_offset(x, one);
            one[i] = 0;
        }
        for (int i = 0; i < w->rank; i++) {
            one[i] = 1;
            wsd[i + (sp == 2 && i >= 2)] = cw_ref_offset(w, one);
            one[i] = 0;
        }
    }
    int64_t o = 0;
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++)
            for (int64_t od = 0; od < out[0]; od++)
                for (int64_t oh = 0; oh < out[1]; oh++)
                    for (int64_t ow = 0; ow < out[2]; ow++, o++) {
                        double acc = bias ? (double)bias[k] : 0.0;
                        int64_t g = k / Kg;
                        for (int64_t c = 0; c < Cg; c++)
                            for (int64_t a = 0; a < ks[0]; a++)
                                for (int64_t bb = 0; bb < ks[1]; bb++)
                                    for (int64_t e = 0; e < ks[2]; e++) {
                                        int64_t id = od * st[0] - pp[0] + a * dl[0];
                                        int64_t ih = oh * st[1] - pp[1] + bb * dl[1];
                                        int64_t iw = ow * st[2] - pp[2] + e * dl[2];
                                        if (id < 0 || id >= in[0] || ih < 0 || ih >= in[1] || iw < 0 || iw >= in[2])
                                            continue;
                                        int64_t xo = n * xs[0] + (g * Cg + c) * xs[1] + id * xs[2] + ih * xs[3] +
                                                     iw * xs[4];
                                        int64_t wo = k * wsd[0] + c * wsd[1] + a * wsd[2] + bb * wsd[3] + e * wsd[4];
                                        acc += (double)wd[wo] * (double)xd[xo];
                                    }
                        yd[o] = acc;
                    }
}

double cw_ref_rel_err(const cw_tensor_desc *y, const float *yv, const double *ref) {
    int64_t numel = 1;
    for (int i = 0; i < y->rank; i++) numel *= y->dims[i];
    double maxr = 0.0, maxd = 0.0;
    int64_t idx[5] = {0, 0, 0, 0, 0};
    for (int64_t o = 0; o < numel; o++) {
        double a = (double)yv[cw_ref_offset(y, idx)];
        double d = fabs(a - ref[o]);
        maxd = cw_err_max(maxd, d);
        if (fabs(ref[o]) > maxr) maxr = fabs(ref[o]);
        for (int i = y->rank - 1; i >= 0; i--) {
            if (++idx[i] < y->dims[i]) break;
            idx[i] = 0;
        }
    }
    return maxd / (maxr > 1e-30 ? maxr : 1e-30);
}
