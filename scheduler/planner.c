/* The patch planner: exact halo math (DESIGN.md), balanced row bands along H (or, for 5-D
 * convs, frame bands along D), and the choice of axis, patch count + algorithm from a
 * workspace cap. Patches are views into the full tensors: only offsets, row counts and
 * per-patch paddings along the axis change. */
#include <inttypes.h>
#include <string.h>

#include "alloc/alloc.h"
#include "scheduler/planner.h"

#define PATCH_MAX_ALGOS 16

cw_status cw__patch_make(const cw__conv_problem *full, int64_t o0, int64_t o1, cw__patch *out) {
    if (!full || !out) return cw__error(NULL, CW_ERR_INVALID_ARG, "patch_make: %s is NULL", !full ? "full" : "out");
    return cw__patch_make_ax(full, cw__patch_hdim(full), o0, o1, out);
}

cw_status cw__patch_make_ax(const cw__conv_problem *full, int axis, int64_t o0, int64_t o1, cw__patch *out) {
    if (!full || !out) return cw__error(NULL, CW_ERR_INVALID_ARG, "patch_make: %s is NULL", !full ? "full" : "out");
    if (full->spatial != 2 && full->spatial != 3)
        return cw__error(NULL, CW_ERR_INVALID_ARG, "patch_make: spatial=%d must be 2 or 3", full->spatial);
    if (axis != cw__patch_hdim(full) && !(full->spatial == 3 && axis == CW__PATCH_DDIM))
        return cw__error(NULL, CW_ERR_INVALID_ARG, "patch_make: axis %d is neither H nor (5-D) D", axis);
    const int hd = axis, hp = axis - 2;
    const int64_t h_out = full->y.dims[hd], h_in = full->x.dims[hd];
    if (o0 < 0 || o1 <= o0 || o1 > h_out)
        return cw__error(NULL, CW_ERR_INVALID_ARG, "patch_make: output rows [%lld, %lld) not a non-empty range in [0, %lld)",
                         (long long)o0, (long long)o1, (long long)h_out);
    const int64_t s = full->stride[hp], d = full->dilation[hp], k = full->w.dims[hd], p = full->pad_pre[hp];
    const int64_t i0 = o0 * s - p;
    const int64_t i1 = (o1 - 1) * s - p + d * (k - 1) + 1;
    int64_t a = i0 > 0 ? i0 : 0;
    int64_t b = i1 < h_in ? i1 : h_in;
    int64_t pre, post;
    if (a < b) {
        pre = a - i0;
        post = i1 - b;
    } else {
        /* Every tap of the band lands in padding (i1 <= 0 or i0 >= H): no input rows. Any
         * split of the padded extent i1 - i0 gives the same output rows; keep it all in
         * pre so both paddings stay >= 0. */
        a = b = i0 <= 0 ? 0 : h_in;
        pre = i1 - i0;
        post = 0;
    }
    memset(out, 0, sizeof *out);
    out->o0 = o0;
    out->o1 = o1;
    out->axis = axis;
    out->a = a;
    out->b = b;
    out->pad_pre = pre;
    out->pad_post = post;
    out->prob = *full;
    cw__desc_fill_strides(&out->prob.x);
    cw__desc_fill_strides(&out->prob.w);
    cw__desc_fill_strides(&out->prob.y);
    out->prob.x.dims[hd] = b - a;
    out->prob.y.dims[hd] = o1 - o0;
    out->prob.pad_pre[hp] = pre;
    out->prob.pad_post[hp] = post;
    out->x_offset = a < b ? a * out->prob.x.strides[hd] : 0;
    out->y_offset = o0 * out->prob.y.strides[hd];
    return CW_OK;
}

void cw__patch_bounds(int64_t h_out, int p, int64_t *bounds) {
    if (p < 1) { /* outside the contract: one band, still p+1 = 2 defined entries */
        bounds[0] = 0;
        bounds[1] = h_out;
        return;
    }
    /* p > h_out (outside the contract) yields some empty bands, never out-of-range rows */
    for (int i = 0; i <= p; i++) bounds[i] = (int64_t)((__int128)i * h_out / p);
}

static int64_t band_lo(int64_t h, int p, int i) { return (int64_t)((__int128)i * h / p); }

/* ---- the planner ------------------------------------------------------------------------ */

/* Workspace of algorithm algo_id for problem pr as the backend lists it (-1: not listed);
 * *out (may be NULL) gets the listing. */
static cw_status algo_ws(cw__backend *be, const cw__conv_problem *pr, int algo_id, int64_t *ws, cw__conv_algo *out) {
    cw__conv_algo algos[PATCH_MAX_ALGOS];
    int n = 0;
    CW_TRY(cw__op_conv_algos(be, pr, algos, PATCH_MAX_ALGOS, &n));
    for (int i = 0; i < n; i++)
        if (algos[i].id == algo_id) {
            *ws = algos[i].workspace;
            if (out) *out = algos[i];
            return CW_OK;
        }
    *ws = -1;
    return CW_OK;
}

/* Bytes of a patch's prep buffer (its input rows, in x's dtype); 0 without prep. */
static int64_t pbuf_bytes(const cw__conv_problem *patch, int prep) { return prep ? cw__desc_bytes(&patch->x) : 0; }

/* Bytes of a patch's ybuf output band buffers (its output rows, in y's dtype); 0 when it
 * writes in place. */
static int64_t ybuf_bytes(const cw__conv_problem *patch, int ybuf) { return ybuf * cw__desc_bytes(&patch->y); }

/* Temporary bytes in flight for bands needing ws each, on `patch`'s rows. */
static int64_t share_temp(const cw__conv_share *sh, int64_t ws, const cw__conv_problem *patch) {
    return sh->heavy * cw__alloc_round(ws) + sh->n_pbufs * cw__alloc_round(pbuf_bytes(patch, sh->prep)) +
           sh->n_pbufs * sh->ybuf * cw__alloc_round(ybuf_bytes(patch, 1));
}

/* The tallest band of a P-band plan along ax, centred in the output. */
static cw_status centre_band(const cw__conv_problem *full, int ax, int64_t h_out, int P, cw__patch *pt) {
    int64_t rows = (h_out + P - 1) / P, o0 = h_out / 2 - rows / 2;
    return cw__patch_make_ax(full, ax, o0 < 0 ? 0 : o0, (o0 < 0 ? 0 : o0) + rows, pt);
}

/* Temp in flight of algorithm id with P bands (probed on the centre band); -1: not listed. */
static cw_status probe(cw__backend *be, const cw__conv_problem *full, const cw__conv_share *sh, int ax, int64_t h_out,
                       int P, int id, int64_t *temp) {
    cw__patch pt;
    int64_t ws;
    cw_status st = centre_band(full, ax, h_out, P, &pt);
    if (st == CW_OK) st = algo_ws(be, &pt.prob, id, &ws, NULL);
    if (st == CW_OK) *temp = ws < 0 ? -1 : share_temp(sh, ws, &pt.prob);
    return st;
}

/* ws, pbuf and algo of algorithm id with P bands: the max over the centre, first and last
 * tallest bands (a centred band may see fewer input rows than the first band's halo). */
static cw_status size_bands(cw__backend *be, const cw__conv_problem *full, const cw__conv_share *sh, int ax,
                            int64_t h_out, int P, int id, cw__conv_plan *out) {
    int64_t rows = (h_out + P - 1) / P;
    cw__patch pt;
    cw_status st = centre_band(full, ax, h_out, P, &pt);
    if (st == CW_OK) st = algo_ws(be, &pt.prob, id, &out->ws, &out->algo);
    CW_TRY(st);
    out->pbuf = pbuf_bytes(&pt.prob, sh->prep);
    out->ybuf = ybuf_bytes(&pt.prob, sh->ybuf > 0);
    for (int e = 0; e < 2; e++) {
        int64_t q0 = e ? h_out - rows : 0, wse;
        cw__patch pe;
        CW_TRY(cw__patch_make_ax(full, ax, q0, q0 + rows, &pe));
        CW_TRY(algo_ws(be, &pe.prob, id, &wse, NULL));
        if (wse > out->ws) out->ws = wse;
        int64_t pb = pbuf_bytes(&pe.prob, sh->prep), yb = ybuf_bytes(&pe.prob, sh->ybuf > 0);
        if (pb > out->pbuf) out->pbuf = pb;
        if (yb > out->ybuf) out->ybuf = yb;
    }
    out->algo.workspace = out->ws;
    return CW_OK;
}

/* Unlimited (or the reference): P bands with the fastest algorithm, sized on the first band. */
static cw_status plan_unlimited(cw__backend *be, const cw__conv_problem *full, const cw__conv_share *sh, int ax,
                                int64_t h_out, const cw__conv_algo *fastest, cw__conv_plan *out) {
    out->patches = sh->single ? 1 : sh->p_min;
    out->algo = *fastest;
    cw__patch pt; /* the first band: rows [0, floor(H_out / P)) */
    cw_status st = cw__patch_make_ax(full, ax, 0, band_lo(h_out, out->patches, 1), &pt);
    if (st == CW_OK) st = algo_ws(be, &pt.prob, fastest->id, &out->ws, &out->algo);
    out->pbuf = pbuf_bytes(&pt.prob, sh->prep);
    out->ybuf = ybuf_bytes(&pt.prob, sh->ybuf > 0);
    return st;
}

/* Smallest P in [lo, hi] whose temp fits avail for algorithm id (bisection); -1 if none. */
static cw_status smallest_fit(cw__backend *be, const cw__conv_problem *full, const cw__conv_share *sh, int ax,
                              int64_t h_out, int lo, int hi, int id, int64_t avail, int *best) {
    *best = -1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int64_t temp;
        CW_TRY(probe(be, full, sh, ax, h_out, mid, id, &temp));
        if (temp >= 0 && temp <= avail) *best = mid, hi = mid - 1;
        else lo = mid + 1;
    }
    return CW_OK;
}

/* Cuts the chosen P bands into out->bounds / out->patch. */
static cw_status cut_bands(const cw__conv_problem *full, int ax, int64_t h_out, cw__conv_plan *out) {
    int P = out->patches;
    out->axis = ax;
    out->bounds = cw__malloc((size_t)(P + 1) * sizeof *out->bounds);
    out->patch = cw__malloc((size_t)P * sizeof *out->patch);
    if (!out->bounds || !out->patch) return cw__error(NULL, CW_ERR_OUT_OF_MEMORY, "planner: out of host memory");
    cw__patch_bounds(h_out, P, out->bounds);
    cw_status st = CW_OK;
    for (int j = 0; j < P && st == CW_OK; j++)
        st = cw__patch_make_ax(full, ax, out->bounds[j], out->bounds[j + 1], &out->patch[j]);
    return st;
}

/* The smallest avail any algorithm fits at P = pmax (CW_ERR_BUDGET's hint). */
static cw_status min_share(cw__backend *be, const cw__conv_problem *full, const cw__conv_share *sh, int ax,
                           int64_t h_out, int pmax, const cw__conv_algo *algos, int na, int64_t *min_avail) {
    for (int a = 0; a < na; a++) {
        int64_t temp;
        CW_TRY(probe(be, full, sh, ax, h_out, pmax, algos[a].id, &temp));
        if (temp >= 0 && (*min_avail < 0 || temp < *min_avail)) *min_avail = temp;
    }
    return CW_OK;
}

/* The search of cw__planner_plan along one axis: the first algorithm (in the backend's
 * order) with a P that fits; *rank gets its index in that order, -1 when none fits (then
 * out is empty). */
static cw_status plan_axis(cw__backend *be, const cw__conv_problem *full, const cw__conv_share *sh, int ax,
                           const cw__conv_algo *algos, int na, cw__conv_plan *out, int *rank) {
    const int64_t h_out = full->y.dims[ax];
    int p_min = sh->p_min > h_out ? (int)h_out : sh->p_min;
    int pmax = sh->p_max > 0 && sh->p_max < h_out ? sh->p_max : (int)h_out;
    int64_t avail = sh->avail < 0 ? INT64_MAX : sh->avail;
    *rank = -1;
    for (int a = 0; a < na; a++) {
        int lo = p_min, hi = pmax, best = -1;
        if (sh->p_fixed > 0) lo = hi = (int)(sh->p_fixed < h_out ? (sh->p_fixed > p_min ? sh->p_fixed : p_min) : h_out);
        CW_TRY(smallest_fit(be, full, sh, ax, h_out, lo, hi, algos[a].id, avail, &best));
        if (best > 0 && sh->p_mult > 1 && sh->p_fixed <= 0 && best % sh->p_mult) /* more bands fit too */
            best = (int)((best / sh->p_mult + 1) * sh->p_mult < h_out ? (best / sh->p_mult + 1) * sh->p_mult : h_out);
        if (best > 0) {
            out->patches = best;
            *rank = a;
            CW_TRY(size_bands(be, full, sh, ax, h_out, best, algos[a].id, out));
            return cut_bands(full, ax, h_out, out);
        }
    }
    return CW_OK;
}

/* Input elements a plan's halos read again (cw__patch_halo_ax's extra rows x one row). */
static double halo_elems(const cw__conv_problem *full, const cw__conv_plan *cp) {
    cw__halo h;
    if (cw__patch_halo_ax(full, cp->axis, cp->bounds, cp->patches, 1.0, &h) != CW_OK) return 0.0;
    return h.prep_flops_extra; /* at 1 "flop" per element: the elements */
}

cw_status cw__planner_plan(cw__backend *be, const cw__conv_problem *full, const cw__conv_share *sh,
                           cw__conv_plan *out, int64_t *min_avail) {
    memset(out, 0, sizeof *out);
    const int hd = cw__patch_hdim(full);
    const int axes = full->spatial == 3 ? (sh->axes ? sh->axes : CW__AX_H) : CW__AX_H;
    int ax = axes == CW__AX_D ? CW__PATCH_DDIM : hd; /* the first (or only) axis tried */
    const int64_t h_out = full->y.dims[ax];
    cw__conv_algo algos[PATCH_MAX_ALGOS];
    int na = 0;
    CW_TRY(cw__op_conv_algos(be, full, algos, PATCH_MAX_ALGOS, &na));
    cw_status st = CW_OK;
    if (na == 0) return cw__error(be->ctx, CW_ERR_UNSUPPORTED, "planner: the backend has no algorithm for a conv");
    int p_min = sh->p_min > h_out ? (int)h_out : sh->p_min;
    int pmax = sh->p_max > 0 && sh->p_max < h_out ? sh->p_max : (int)h_out;
    if (sh->single || (sh->avail < 0 && sh->p_fixed <= 0)) {
        cw__conv_share one = *sh;
        one.p_min = p_min;
        st = plan_unlimited(be, full, &one, ax, h_out, &algos[0], out);
        return st == CW_OK ? cut_bands(full, ax, h_out, out) : st;
    }
    int rank = -1;
    CW_TRY(plan_axis(be, full, sh, ax, algos, na, out, &rank));
    if (axes == (CW__AX_H | CW__AX_D) && sh->p_fixed <= 0) { /* D too: keep the cheaper */
        cw__conv_plan d;
        int rd = -1;
        memset(&d, 0, sizeof d);
        st = plan_axis(be, full, sh, CW__PATCH_DDIM, algos, na, &d, &rd);
        if (st == CW_OK && rd >= 0 &&
            (rank < 0 || rd < rank || (rd == rank && halo_elems(full, &d) < halo_elems(full, out)))) {
            cw__conv_plan_free(out);
            *out = d;
            rank = rd;
        } else {
            cw__conv_plan_free(&d);
        }
        CW_TRY(st);
    }
    if (rank >= 0) return CW_OK;
    cw__conv_plan_free(out);
    if (!min_avail)
        return cw__error(be->ctx, CW_ERR_BUDGET, "planner: no patch count %d..%d fits a conv into %" PRId64 " bytes",
                         p_min, pmax, sh->avail);
    *min_avail = -1;
    CW_TRY(min_share(be, full, sh, ax, h_out, pmax, algos, na, min_avail));
    if (axes == (CW__AX_H | CW__AX_D)) {
        const int64_t d_out = full->y.dims[CW__PATCH_DDIM];
        const int dmax = sh->p_max > 0 && sh->p_max < d_out ? sh->p_max : (int)d_out;
        CW_TRY(min_share(be, full, sh, CW__PATCH_DDIM, d_out, dmax, algos, na, min_avail));
    }
    return cw__error(be->ctx, CW_ERR_BUDGET,
                     "planner: no patch count %d..%d fits a conv into %" PRId64 " bytes; the smallest share that "
                     "works is %" PRId64 " bytes",
                     p_min, pmax, sh->avail, *min_avail);
}

void cw__conv_plan_free(cw__conv_plan *plan) {
    if (!plan) return;
    cw__free(plan->bounds);
    cw__free(plan->patch);
    plan->bounds = NULL;
    plan->patch = NULL;
}

double cw__conv_flops(const cw__conv_problem *p) {
    const int sp = p->spatial;
    double f = 2.0 * (double)p->y.dims[0] * (double)p->y.dims[1] * (double)(p->x.dims[1] / (p->groups > 0 ? p->groups : 1));
    for (int i = 0; i < sp; i++) f *= (double)p->y.dims[2 + i] * (double)p->w.dims[2 + i];
    return f;
}

cw_status cw__patch_halo(const cw__conv_problem *full, const int64_t *bounds, int p, double prep_flops_per_elem,
                         cw__halo *out) {
    if (!full) return cw__error(NULL, CW_ERR_INVALID_ARG, "patch_halo: NULL argument or p=%d < 1", p);
    return cw__patch_halo_ax(full, cw__patch_hdim(full), bounds, p, prep_flops_per_elem, out);
}

cw_status cw__patch_halo_ax(const cw__conv_problem *full, int axis, const int64_t *bounds, int p,
                            double prep_flops_per_elem, cw__halo *out) {
    if (!full || !bounds || !out || p < 1)
        return cw__error(NULL, CW_ERR_INVALID_ARG, "patch_halo: NULL argument or p=%d < 1", p);
    const int hd = axis;
    const int64_t h_out = full->y.dims[hd];
    if (bounds[0] != 0 || bounds[p] != h_out)
        return cw__error(NULL, CW_ERR_INVALID_ARG, "patch_halo: bounds [%lld .. %lld] must span [0, %lld]",
                         (long long)bounds[0], (long long)bounds[p], (long long)h_out);
    memset(out, 0, sizeof *out);
    cw__patch pt;
    CW_TRY(cw__patch_make_ax(full, axis, 0, h_out, &pt));
    out->rows_needed = pt.b - pt.a;
    for (int i = 0; i < p; i++) {
        CW_TRY(cw__patch_make_ax(full, axis, bounds[i], bounds[i + 1], &pt));
        out->rows_read += pt.b - pt.a;
    }
    out->extra_rows = out->rows_read - out->rows_needed;
    out->extra_rows_pct = out->rows_needed > 0 ? 100.0 * (double)out->extra_rows / (double)out->rows_needed : 0.0;
    /* elements of one input row: N * C * the spatial dims other than the axis */
    double row_elems = (double)full->x.dims[0] * (double)full->x.dims[1];
    for (int i = 2; i < 2 + full->spatial; i++)
        if (i != hd) row_elems *= (double)full->x.dims[i];
    out->prep_flops_extra = (double)out->extra_rows * row_elems * prep_flops_per_elem;
    double f = cw__conv_flops(full);
    out->halo_pct = f > 0 ? 100.0 * out->prep_flops_extra / f : 0.0;
    return CW_OK;
}
