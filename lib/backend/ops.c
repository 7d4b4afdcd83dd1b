/* The checks in front of the backends' op hooks (the libuv pattern: uv_* checks, uv__*
 * trusts). The scheduler and the tests call cw__op_*; a check lives here once instead of
 * once per backend, where copies drift. A hook checks only what its backend lacks. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>

#include "backend/backend.h"
#include "kernels/kernels.h"

static int dtype_known(cw_dtype dt) { return dt == CW_F32 || dt == CW_F16 || dt == CW_BF16; }

/* The backend runs ops at all; names the op otherwise. */
static cw_status has_ops(cw__backend *be, const char *op) {
    if (be->ops) return CW_OK;
    return cw__error(be->ctx, CW_ERR_UNSUPPORTED, "%s: the %s backend runs no operations", op, be->rt->name);
}

/* A descriptor an op reads or writes: rank in [rmin, rmax], dims >= 0, a known dtype. */
static cw_status check_desc(cw__backend *be, const char *op, const char *arg, const cw_tensor_desc *d, int rmin,
                            int rmax) {
    char b[96];
    if (d->rank < rmin || d->rank > rmax)
        return cw__error(be->ctx, CW_ERR_INVALID_ARG, "%s: %s has rank %d, expected %d..%d", op, arg, d->rank, rmin,
                         rmax);
    for (int i = 0; i < d->rank; i++)
        if (d->dims[i] < 0)
            return cw__error(be->ctx, CW_ERR_INVALID_ARG, "%s: %s has a negative dim %s", op, arg,
                             cw__dims_str(d, b, sizeof b));
    if (!dtype_known(d->dtype))
        return cw__error(be->ctx, CW_ERR_INVALID_ARG, "%s: %s has dtype %d, not a cw_dtype", op, arg, (int)d->dtype);
    return CW_OK;
}

/* check_desc, plus data that is not NULL unless the view is empty. */
static cw_status check_view(cw__backend *be, const char *op, const char *arg, const cw__view *v, int rmin, int rmax) {
    char b[96];
    if (!v) return cw__error(be->ctx, CW_ERR_INVALID_ARG, "%s: %s is NULL", op, arg);
    CW_TRY(check_desc(be, op, arg, &v->d, rmin, rmax));
    if (!v->data && cw__desc_numel(&v->d) > 0)
        return cw__error(be->ctx, CW_ERR_INVALID_ARG, "%s: %s %s has NULL data", op, arg, cw__dims_str(&v->d, b, sizeof b));
    return CW_OK;
}

static int same_dims(const cw_tensor_desc *a, const cw_tensor_desc *b) {
    if (a->rank != b->rank) return 0;
    for (int i = 0; i < a->rank; i++)
        if (a->dims[i] != b->dims[i]) return 0;
    return 1;
}

/* ---- convolution ------------------------------------------------------------------------ */

/* The problem's shape as the backends assume it: NC(D)HW x and y, KC/g(D)HW w of one dtype,
 * groups dividing C and K, strides and dilations >= 1, paddings >= 0. */
static cw_status check_problem(cw__backend *be, const char *op, const cw__conv_problem *p) {
    char b1[96], b2[96], b3[96];
    if (!p) return cw__error(be->ctx, CW_ERR_INVALID_ARG, "%s: problem is NULL", op);
    if (p->spatial != 2 && p->spatial != 3)
        return cw__error(be->ctx, CW_ERR_INVALID_ARG, "%s: spatial = %d, must be 2 or 3", op, p->spatial);
    int r = p->spatial + 2;
    CW_TRY(check_desc(be, op, "x", &p->x, r, r));
    CW_TRY(check_desc(be, op, "w", &p->w, r, r));
    CW_TRY(check_desc(be, op, "y", &p->y, r, r));
    if (p->w.dtype != p->x.dtype || p->y.dtype != p->x.dtype)
        return cw__error(be->ctx, CW_ERR_INVALID_ARG, "%s: x, w and y dtypes differ (%s, %s, %s)", op,
                         cw__dtype_name(p->x.dtype), cw__dtype_name(p->w.dtype), cw__dtype_name(p->y.dtype));
    if (p->groups < 1 || p->x.dims[1] % p->groups || p->y.dims[1] % p->groups || p->w.dims[0] != p->y.dims[1] ||
        p->w.dims[1] * p->groups != p->x.dims[1] || p->x.dims[0] != p->y.dims[0])
        return cw__error(be->ctx, CW_ERR_INVALID_ARG, "%s: groups = %" PRId64 " with x %s, w %s, y %s", op, p->groups,
                         cw__dims_str(&p->x, b1, sizeof b1), cw__dims_str(&p->w, b2, sizeof b2),
                         cw__dims_str(&p->y, b3, sizeof b3));
    for (int i = 0; i < p->spatial; i++)
        if (p->stride[i] < 1 || p->dilation[i] < 1 || p->pad_pre[i] < 0 || p->pad_post[i] < 0)
            return cw__error(be->ctx, CW_ERR_INVALID_ARG,
                             "%s: spatial dim %d has stride %" PRId64 ", dilation %" PRId64 ", padding %" PRId64
                             "/%" PRId64 " (need stride, dilation >= 1 and padding >= 0)",
                             op, i, p->stride[i], p->dilation[i], p->pad_pre[i], p->pad_post[i]);
    return CW_OK;
}

cw_status cw__op_conv_algos(cw__backend *be, const cw__conv_problem *p, cw__conv_algo *out, int max, int *n) {
    CW_TRY(check_problem(be, "conv_algos", p));
    if (!out || !n || max < 0)
        return cw__error(be->ctx, CW_ERR_INVALID_ARG, "conv_algos: out/n NULL or max = %d", max);
    CW_TRY(has_ops(be, "conv_algos"));
    return be->ops->conv_algos(be, p, out, max, n);
}

cw_status cw__op_conv_forward(cw__backend *be, cw__stream *s, const cw__conv_problem *p, const cw__conv_algo *algo,
                              const void *x, const void *w, const void *b, void *y, void *ws, int64_t ws_bytes) {
    CW_TRY(check_problem(be, "conv_forward", p));
    /* x may be NULL where the patch reads no input row (all its rows lie in the padding) */
    if (!algo || !w || !y || (p->has_bias && !b) || (!x && cw__desc_numel(&p->x) > 0))
        return cw__error(be->ctx, CW_ERR_INVALID_ARG, "conv_forward: %s is NULL",
                         !algo ? "algo" : !w ? "w" : !y ? "y" : !x ? "x" : "bias");
    if (ws_bytes < algo->workspace || (algo->workspace > 0 && !ws))
        return cw__error(be->ctx, CW_ERR_INVALID_ARG,
                         "conv_forward: workspace %" PRId64 " bytes at %p < %" PRId64 " needed by %s", ws_bytes, ws,
                         algo->workspace, algo->name);
    CW_TRY(has_ops(be, "conv_forward"));
    if (cw__desc_numel(&p->y) == 0) return CW_OK;
    return be->ops->conv_forward(be, s, p, algo, x, w, b, y, ws, ws_bytes);
}

cw_status cw__op_conv_prepare(cw__backend *be, const cw__conv_problem *p, const cw__conv_algo *algo, int64_t ws_cap,
                              cw__conv_algo *used) {
    CW_TRY(check_problem(be, "conv_prepare", p));
    if (!algo || !used) return cw__error(be->ctx, CW_ERR_INVALID_ARG, "conv_prepare: algo or used is NULL");
    CW_TRY(has_ops(be, "conv_prepare"));
    if (!be->ops->conv_prepare) { /* default: conv_forward prepares on first use */
        *used = *algo;
        return CW_OK;
    }
    return be->ops->conv_prepare(be, p, algo, ws_cap, used);
}

void cw__op_conv_release(cw__backend *be, cw__conv_algo *algo) {
    if (algo->prepared && be->ops && be->ops->conv_release) be->ops->conv_release(be, algo->prepared);
    algo->prepared = NULL;
}

cw_status cw__op_conv_autotune(cw__backend *be, const cw__conv_problem *p, const cw__conv_algo *cands, int n,
                               int *best) {
    CW_TRY(check_problem(be, "conv_autotune", p));
    if (!cands || n < 1 || !best)
        return cw__error(be->ctx, CW_ERR_INVALID_ARG, "conv_autotune: %d candidates at %p, best %p", n,
                         (const void *)cands, (void *)best);
    CW_TRY(has_ops(be, "conv_autotune"));
    if (!be->ops->conv_autotune) { /* default: the listed order stands */
        *best = 0;
        return CW_OK;
    }
    return be->ops->conv_autotune(be, p, cands, n, best);
}

/* ---- light stages ----------------------------------------------------------------------- */

cw_status cw__op_prep(cw__backend *be, cw__stream *s, const cw__prep_params *p) {
    const char *op = "prep";
    char b1[96], b2[96];
    if (!p) return cw__error(be->ctx, CW_ERR_INVALID_ARG, "prep: params are NULL");
    CW_TRY(check_view(be, op, "src", &p->src, 4, 5));
    CW_TRY(check_view(be, op, "dst", &p->dst, 4, 5));
    const cw_tensor_desc *sd = &p->src.d, *dd = &p->dst.d;
    int r = dd->rank;
    if (sd->rank != r)
        return cw__error(be->ctx, CW_ERR_INVALID_ARG, "prep: src %s and dst %s differ in rank",
                         cw__dims_str(sd, b1, sizeof b1), cw__dims_str(dd, b2, sizeof b2));
    if (p->up < 1) return cw__error(be->ctx, CW_ERR_INVALID_ARG, "prep: up = %d, must be >= 1", p->up);
    if (p->unary < 0 || p->unary > CW_UNARY_OP_COUNT)
        return cw__error(be->ctx, CW_ERR_INVALID_ARG,
                         "prep: unary = %d, must be 0 (none) or a CW_UNARY_* op + 1 (1..%d)", p->unary,
                         (int)CW_UNARY_OP_COUNT);
    if ((p->scale == NULL) != (p->shift == NULL))
        return cw__error(be->ctx, CW_ERR_INVALID_ARG, "prep: scale and shift must both be set or both NULL");
    if (p->dst_row0 < 0 || p->src_row0 < 0) /* the row map divides: truncation needs rows >= 0 */
        return cw__error(be->ctx, CW_ERR_INVALID_ARG, "prep: dst_row0 = %" PRId64 ", src_row0 = %" PRId64 "; must be >= 0",
                         p->dst_row0, p->src_row0);
    const int padded = p->up_h > 0;
    if (p->up_d < 0 || p->up_d > CW_UPSAMPLE_MAX_FACTOR || p->off_d < 0 || (p->off_d && p->off_d >= p->up_d) ||
        (r == 4 && (p->up_d > 1 || p->off_d)))
        return cw__error(be->ctx, CW_ERR_INVALID_ARG,
                         "prep: up_d = %" PRId64 ", off_d = %" PRId64 ": need up_d in 0..%d, off_d in 0..up_d - 1 "
                         "(both <= 1 and 0 for a 4-D dst)", p->up_d, p->off_d, CW_UPSAMPLE_MAX_FACTOR);
    if (sd->dims[0] != dd->dims[0] || sd->dims[1] != dd->dims[1] ||
        (r == 5 && cw_up_frames(sd->dims[2], p->up_d, p->off_d) != dd->dims[2] && !padded))
        return cw__error(be->ctx, CW_ERR_INVALID_ARG,
                         "prep: src %s and dst %s differ in N, C or D (upsampled by %" PRId64 " less %" PRId64 ")",
                         cw__dims_str(sd, b1, sizeof b1), cw__dims_str(dd, b2, sizeof b2), p->up_d > 1 ? p->up_d : 1,
                         p->off_d);
    for (int k = 0; k < 3; k++)
        if (p->pad[k] < 0 || p->pad[k] > CW_PAD_MAX || (k == 0 && r == 4 && p->pad[k]))
            return cw__error(be->ctx, CW_ERR_INVALID_ARG, "prep: pad[%d] = %" PRId64 " must be in 0..%d (0 for D of 4-D)",
                             k, p->pad[k], CW_PAD_MAX);
    if (p->up_h < 0 || (!padded && (p->pad[0] || p->pad[1] || p->pad[2])))
        return cw__error(be->ctx, CW_ERR_INVALID_ARG, "prep: up_h = %" PRId64 " with pads; padding needs up_h >= 1",
                         p->up_h);
    if (cw__desc_numel(dd) == 0) return has_ops(be, op);
    int64_t up = p->up, hd = dd->dims[r - 2], wd = dd->dims[r - 1];
    if (padded) { /* every index is clamped into the upsampled tensor: only the band's rows can miss */
        int64_t a = cw_prep_src(0, p->dst_row0, p->pad[1], p->up_h, up, p->src_row0);
        int64_t b = cw_prep_src(hd - 1, p->dst_row0, p->pad[1], p->up_h, up, p->src_row0);
        if (a < 0 || b >= sd->dims[r - 2])
            return cw__error(be->ctx, CW_ERR_INVALID_ARG,
                             "prep: padded dst rows [%" PRId64 ", %" PRId64 ") need src rows [%" PRId64 ", %" PRId64
                             ") of the band starting at row %" PRId64 ", but src %s has %" PRId64 " rows",
                             p->dst_row0, p->dst_row0 + hd, a, b + 1, p->src_row0, cw__dims_str(sd, b1, sizeof b1),
                             sd->dims[r - 2]);
        CW_TRY(has_ops(be, op));
        return be->ops->prep(be, s, p);
    }
    int64_t r_first = cw_up_src_index(0, p->dst_row0, p->src_row0, up);
    int64_t r_last = cw_up_src_index(hd - 1, p->dst_row0, p->src_row0, up);
    if (r_first < 0 || r_last >= sd->dims[r - 2])
        return cw__error(be->ctx, CW_ERR_INVALID_ARG,
                         "prep: dst rows [%" PRId64 ", %" PRId64 ") at up = %" PRId64 " need src rows [%" PRId64
                         ", %" PRId64 ") of the band starting at row %" PRId64 ", but src %s has %" PRId64 " rows",
                         p->dst_row0, p->dst_row0 + hd, up, r_first, r_last + 1, p->src_row0,
                         cw__dims_str(sd, b1, sizeof b1), sd->dims[r - 2]);
    if ((wd - 1) / up >= sd->dims[r - 1])
        return cw__error(be->ctx, CW_ERR_INVALID_ARG, "prep: dst W = %" PRId64 " at up = %" PRId64 " exceeds src W = %" PRId64,
                         wd, up, sd->dims[r - 1]);
    CW_TRY(has_ops(be, op));
    return be->ops->prep(be, s, p);
}

cw_status cw__op_gn_stats(cw__backend *be, cw__stream *s, const cw__view *x, int64_t groups, double *out) {
    char b[96];
    CW_TRY(check_view(be, "gn_stats", "x", x, 4, 5));
    if (groups < 1 || x->d.dims[1] % groups != 0)
        return cw__error(be->ctx, CW_ERR_INVALID_ARG, "gn_stats: groups = %" PRId64 " does not divide C of x %s", groups,
                         cw__dims_str(&x->d, b, sizeof b));
    if (!out) return cw__error(be->ctx, CW_ERR_INVALID_ARG, "gn_stats: out is NULL");
    CW_TRY(has_ops(be, "gn_stats"));
    return be->ops->gn_stats(be, s, x, groups, out);
}

cw_status cw__op_gn_finalize(cw__backend *be, cw__stream *s, const double *parts, int64_t n_parts, int64_t n,
                             int64_t c, int64_t groups, const float *gamma, const float *beta, float eps,
                             float *scale, float *shift) {
    if (n_parts < 1 || n < 0 || c < 1 || groups < 1 || c % groups != 0)
        return cw__error(be->ctx, CW_ERR_INVALID_ARG,
                         "gn_finalize: n_parts = %" PRId64 ", N = %" PRId64 ", C = %" PRId64 ", groups = %" PRId64
                         ": need n_parts >= 1, N >= 0 and groups dividing C",
                         n_parts, n, c, groups);
    if (!(eps >= 0.0f) || isinf(eps))
        return cw__error(be->ctx, CW_ERR_INVALID_ARG, "gn_finalize: eps = %g must be finite and >= 0", (double)eps);
    if (n > 0 && (!parts || !scale || !shift))
        return cw__error(be->ctx, CW_ERR_INVALID_ARG, "gn_finalize: parts, scale and shift must not be NULL");
    cw_status st = has_ops(be, "gn_finalize");
    if (st != CW_OK || n == 0) return st;
    return be->ops->gn_finalize(be, s, parts, n_parts, n, c, groups, gamma, beta, eps, scale, shift);
}

cw_status cw__op_add(cw__backend *be, cw__stream *s, const cw__view *dst, const cw__view *a, const cw__view *b) {
    char b1[96], b2[96];
    cw_status st;
    CW_TRY(check_view(be, "add", "dst", dst, 1, CW_MAX_RANK));
    CW_TRY(check_view(be, "add", "a", a, 1, CW_MAX_RANK));
    CW_TRY(check_view(be, "add", "b", b, 1, CW_MAX_RANK));
    const cw__view *in[2] = {a, b};
    for (int k = 0; k < 2; k++)
        if (!same_dims(&in[k]->d, &dst->d) || in[k]->d.dtype != dst->d.dtype)
            return cw__error(be->ctx, CW_ERR_INVALID_ARG, "add: %s %s (%s) and dst %s (%s) differ in shape or dtype",
                             k ? "b" : "a", cw__dims_str(&in[k]->d, b1, sizeof b1), cw__dtype_name(in[k]->d.dtype),
                             cw__dims_str(&dst->d, b2, sizeof b2), cw__dtype_name(dst->d.dtype));
    if ((st = has_ops(be, "add")) != CW_OK || cw__desc_numel(&dst->d) == 0) return st;
    return be->ops->add(be, s, dst, a, b);
}

/* ---- the generic ops ---------------------------------------------------------------------- */

/* The op's contract (kernels/kernels.h): a known code, valid views of the dtypes its info
 * names, and an output of the dims its shape rule makes of the inputs. */
cw_status cw__op_run(cw__backend *be, cw__stream *s, const cw__op_args *a) {
    char b1[96], b2[96], b3[96];
    cw_status st;
    if (!a) return cw__error(be->ctx, CW_ERR_INVALID_ARG, "op: args are NULL");
    const cw_op_info info = cw_op_get_info(a->code);
    if (!info.name) return cw__error(be->ctx, CW_ERR_INVALID_ARG, "op: code %d is not a CW_OP_* code", a->code);
    CW_TRY(check_view(be, info.name, "out", &a->out, 1, CW_MAX_RANK));
    const cw_tensor_desc *in[CW_OP_MAX_IN];
    for (int k = 0; k < info.n_in; k++) {
        char arg[16];
        snprintf(arg, sizeof arg, "in[%d]", k);
        CW_TRY(check_view(be, info.name, arg, &a->in[k], 1, CW_MAX_RANK));
        const cw_dtype want = info.f32_in >> k & 1u ? CW_F32 : a->out.d.dtype;
        if (a->in[k].d.dtype != want)
            return cw__error(be->ctx, CW_ERR_INVALID_ARG, "%s: %s is %s, expected %s (out is %s)", info.name, arg,
                             cw__dtype_name(a->in[k].d.dtype), cw__dtype_name(want), cw__dtype_name(a->out.d.dtype));
        in[k] = &a->in[k].d;
    }
    cw_tensor_desc want;
    if (!cw_op_out_dims(a->code, &a->param, in, &want))
        return cw__error(be->ctx, CW_ERR_INVALID_ARG, "%s: in[0] %s and the parameters are outside the op's rule",
                         info.name, cw__dims_str(in[0], b1, sizeof b1));
    if (!same_dims(&want, &a->out.d))
        return cw__error(be->ctx, CW_ERR_INVALID_ARG, "%s: out is %s, the op makes %s of in[0] %s", info.name,
                         cw__dims_str(&a->out.d, b1, sizeof b1), cw__dims_str(&want, b2, sizeof b2),
                         cw__dims_str(in[0], b3, sizeof b3));
    if ((st = has_ops(be, info.name)) != CW_OK || cw__desc_numel(&a->out.d) == 0) return st;
    return be->ops->op(be, s, a);
}

/* ---- attention's pieces ----------------------------------------------------------------- */

cw_status cw__op_gemm(cw__backend *be, cw__stream *s, const cw__gemm_params *p) {
    if (!p) return cw__error(be->ctx, CW_ERR_INVALID_ARG, "gemm: params are NULL");
    if (p->m < 0 || p->n < 0 || p->k < 0)
        return cw__error(be->ctx, CW_ERR_INVALID_ARG, "gemm: m = %" PRId64 ", n = %" PRId64 ", k = %" PRId64 " must be >= 0",
                         p->m, p->n, p->k);
    /* row-major: op(A) is m x k, so A is stored m x k (lda >= k) or k x m (lda >= m) */
    int64_t acols = p->trans_a ? p->m : p->k, bcols = p->trans_b ? p->k : p->n;
    int64_t need[3] = {acols > 1 ? acols : 1, bcols > 1 ? bcols : 1, p->n > 1 ? p->n : 1};
    int64_t have[3] = {p->lda, p->ldb, p->ldc};
    static const char *const names[3] = {"lda", "ldb", "ldc"};
    for (int i = 0; i < 3; i++)
        if (have[i] < need[i])
            return cw__error(be->ctx, CW_ERR_INVALID_ARG,
                             "gemm: %s = %" PRId64 " < %" PRId64 " (m = %" PRId64 ", n = %" PRId64 ", k = %" PRId64
                             ", trans_a = %d, trans_b = %d)",
                             names[i], have[i], need[i], p->m, p->n, p->k, p->trans_a, p->trans_b);
    if (p->m > 0 && p->n > 0 && (!p->c || (p->k > 0 && (!p->a || !p->b))))
        return cw__error(be->ctx, CW_ERR_INVALID_ARG, "gemm: a, b or c is NULL");
    cw_status st = has_ops(be, "gemm");
    if (st != CW_OK || p->m == 0 || p->n == 0) return st;
    return be->ops->gemm(be, s, p);
}

cw_status cw__op_softmax_rows(cw__backend *be, cw__stream *s, float *x, int64_t rows, int64_t cols, int64_t ld) {
    if (rows < 0 || cols < 1 || ld < cols)
        return cw__error(be->ctx, CW_ERR_INVALID_ARG,
                         "softmax_rows: rows = %" PRId64 ", cols = %" PRId64 ", ld = %" PRId64
                         ": need rows >= 0, cols >= 1, ld >= cols",
                         rows, cols, ld);
    if (rows > 0 && !x) return cw__error(be->ctx, CW_ERR_INVALID_ARG, "softmax_rows: x is NULL");
    cw_status st = has_ops(be, "softmax_rows");
    if (st != CW_OK || rows == 0) return st;
    return be->ops->softmax_rows(be, s, x, rows, cols, ld);
}
