/* A cpu conv problem's geometry (cw__cpu_geom, cpu.h): dims and strides in elements,
 * 2-D as 3-D with D = 1. Every cpu conv algorithm (conv_cpu.c, conv_direct.c,
 * conv_winograd.c) reads a problem through it. */
#include "backend/cpu/cpu.h"

/* Strides of d, or contiguous ones when d's are all zero. */
static void cv_strides(const cw_tensor_desc *d, int64_t *st) {
    int any = 0;
    for (int i = 0; i < d->rank; i++) any |= d->strides[i] != 0;
    if (any) {
        for (int i = 0; i < d->rank; i++) st[i] = d->strides[i];
        return;
    }
    int64_t s = 1;
    for (int i = d->rank - 1; i >= 0; i--) {
        st[i] = s;
        s *= d->dims[i];
    }
}

/* Expands a rank-(2+sp) desc's dims/strides to 5 slots (n, c, d, h, w). */
static void cv_expand(const cw_tensor_desc *d, int sp, int64_t *dims5, int64_t *st5) {
    int64_t st[CW_MAX_RANK];
    cv_strides(d, st);
    dims5[0] = d->dims[0], st5[0] = st[0];
    dims5[1] = d->dims[1], st5[1] = st[1];
    if (sp == 2) {
        dims5[2] = 1, st5[2] = 0;
        dims5[3] = d->dims[2], st5[3] = st[2];
        dims5[4] = d->dims[3], st5[4] = st[3];
    } else {
        for (int i = 2; i < 5; i++) dims5[i] = d->dims[i], st5[i] = st[i];
    }
}

void cw__cpu_geom_make(const cw__conv_problem *p, cw__cpu_geom *g) {
    int sp = p->spatial;
    int64_t xd[5], yd[5], wd[5];
    cv_expand(&p->x, sp, xd, g->xs);
    cv_expand(&p->y, sp, yd, g->ys);
    cv_expand(&p->w, sp, wd, g->wsd);
    g->n = xd[0];
    g->c = xd[1];
    g->k = yd[1];
    g->g = p->groups;
    g->cg = g->c / g->g;
    g->kg = g->k / g->g;
    for (int i = 0; i < 3; i++) {
        g->in[i] = xd[2 + i];
        g->out[i] = yd[2 + i];
        g->ks[i] = wd[2 + i];
    }
    if (sp == 2) {
        g->st[0] = g->dl[0] = 1;
        g->pp[0] = 0;
        for (int i = 0; i < 2; i++) {
            g->st[1 + i] = p->stride[i];
            g->dl[1 + i] = p->dilation[i];
            g->pp[1 + i] = p->pad_pre[i];
        }
    } else {
        for (int i = 0; i < 3; i++) {
            g->st[i] = p->stride[i];
            g->dl[i] = p->dilation[i];
            g->pp[i] = p->pad_pre[i];
        }
    }
    g->has_bias = p->has_bias;
    g->dt = p->x.dtype;
    g->es = cw_dtype_size(p->x.dtype);
}
