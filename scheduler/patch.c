/* The height-patch planner: exact halo math (DESIGN.md), balanced row bands, and the
 * choice of patch count + algorithm from a workspace cap. Patches are views into the
 * full tensors: only offsets, row counts and per-patch H paddings change. */
#include <limits.h>
#include <string.h>

#include "scheduler/patch.h"

#define PATCH_MAX_ALGOS 16

cw_status cw__patch_make(const cw__conv_problem *full, int64_t o0, int64_t o1, cw__patch *out) {
    if (!full || !out) return cw__error(NULL, CW_ERR_INVALID_ARG, "patch_make: %s is NULL", !full ? "full" : "out");
    if (full->spatial != 2 && full->spatial != 3)
        return cw__error(NULL, CW_ERR_INVALID_ARG, "patch_make: spatial=%d must be 2 or 3", full->spatial);
    const int hd = cw__patch_hdim(full), hp = cw__patch_hpar(full);
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

/* Workspace of algorithm `id` for a P-band plan: max over the first, last and most central
 * tallest band. -1 when some representative band does not list the algorithm. *rep gets
 * the algorithm as listed for the tallest band. */
static cw_status plan_ws(cw__backend *be, const cw__conv_problem *full, int P, int id, int64_t *ws_out,
                         cw__conv_algo *rep) {
    const int64_t h = full->y.dims[cw__patch_hdim(full)];
    const int64_t tall = (h + P - 1) / P;
    int central = P / 2;
    for (int dlt = 0; dlt < P; dlt++) {
        int c1 = P / 2 + dlt, c2 = P / 2 - dlt;
        if (c1 < P && band_lo(h, P, c1 + 1) - band_lo(h, P, c1) == tall) { central = c1; break; }
        if (c2 >= 0 && band_lo(h, P, c2 + 1) - band_lo(h, P, c2) == tall) { central = c2; break; }
    }
    int idx[3] = {central, 0, P - 1};
    int64_t ws = -1;
    for (int r = 0; r < 3; r++) {
        if (r > 0 && idx[r] == idx[0]) continue;
        cw__patch pt;
        cw_status st = cw__patch_make(full, band_lo(h, P, idx[r]), band_lo(h, P, idx[r] + 1), &pt);
        if (st != CW_OK) return st;
        cw__conv_algo lst[PATCH_MAX_ALGOS];
        int n = 0;
        st = be->i->conv_algos(be, &pt.prob, lst, PATCH_MAX_ALGOS, &n);
        if (st != CW_OK) return st;
        int found = -1;
        for (int j = 0; j < n; j++)
            if (lst[j].id == id) found = j;
        if (found < 0) {
            *ws_out = -1;
            return CW_OK;
        }
        if (r == 0 && rep) *rep = lst[found];
        if (lst[found].workspace > ws) ws = lst[found].workspace;
    }
    *ws_out = ws;
    if (rep) rep->workspace = ws;
    return CW_OK;
}

cw_status cw__patch_choose(cw__backend *be, const cw__conv_problem *full, int64_t ws_cap, int p_max, int *p_out,
                           cw__conv_algo *algo_out, int64_t *min_cap) {
    if (!be || !full || !p_out || !algo_out)
        return cw__error(be ? be->ctx : NULL, CW_ERR_INVALID_ARG, "patch_choose: %s is NULL",
                         !be ? "be" : !full ? "full" : !p_out ? "p_out" : "algo_out");
    if (full->spatial != 2 && full->spatial != 3)
        return cw__error(be->ctx, CW_ERR_INVALID_ARG, "patch_choose: spatial=%d must be 2 or 3", full->spatial);
    const int64_t h_out = full->y.dims[cw__patch_hdim(full)];
    if (h_out < 1) return cw__error(be->ctx, CW_ERR_INVALID_ARG, "patch_choose: output height %lld", (long long)h_out);
    int pmax = (p_max <= 0 || p_max > h_out) ? (h_out > INT_MAX ? INT_MAX : (int)h_out) : p_max;

    cw__conv_algo lst[PATCH_MAX_ALGOS];
    int n = 0;
    cw_status st = be->i->conv_algos(be, full, lst, PATCH_MAX_ALGOS, &n);
    if (st != CW_OK) return st;
    if (n == 0) return cw__error(be->ctx, CW_ERR_UNSUPPORTED, "patch_choose: the %s backend lists no algorithm", be->i->name);

    int64_t best = -1; /* smallest workspace seen over every algorithm and P */
    int best_p = 0;
    const char *best_name = "";
    for (int j = 0; j < n; j++) {
        for (int P = 1; P <= pmax; P++) {
            int64_t ws;
            cw__conv_algo rep;
            st = plan_ws(be, full, P, lst[j].id, &ws, &rep);
            if (st != CW_OK) return st;
            if (ws < 0) continue;
            if (best < 0 || ws < best) {
                best = ws;
                best_p = P;
                best_name = lst[j].name;
            }
            if (ws_cap < 0 || ws <= ws_cap) {
                *p_out = P;
                *algo_out = rep;
                if (min_cap) *min_cap = ws;
                return CW_OK;
            }
        }
    }
    if (min_cap) *min_cap = best;
    if (best < 0)
        return cw__error(be->ctx, CW_ERR_UNSUPPORTED, "patch_choose: no algorithm runs every patch of this conv");
    return cw__error(be->ctx, CW_ERR_BUDGET,
                     "conv: no patch count 1..%d fits a workspace cap of %lld bytes; the smallest cap that works is "
                     "%lld bytes (%s with %d patches)",
                     pmax, (long long)ws_cap, (long long)best, best_name, best_p);
}

double cw__conv_flops(const cw__conv_problem *p) {
    const int sp = p->spatial;
    double f = 2.0 * (double)p->y.dims[0] * (double)p->y.dims[1] * (double)(p->x.dims[1] / (p->groups > 0 ? p->groups : 1));
    for (int i = 0; i < sp; i++) f *= (double)p->y.dims[2 + i] * (double)p->w.dims[2 + i];
    return f;
}

cw_status cw__patch_halo(const cw__conv_problem *full, const int64_t *bounds, int p, double prep_flops_per_elem,
                         cw__halo *out) {
    if (!full || !bounds || !out || p < 1)
        return cw__error(NULL, CW_ERR_INVALID_ARG, "patch_halo: NULL argument or p=%d < 1", p);
    const int hd = cw__patch_hdim(full);
    const int64_t h_out = full->y.dims[hd];
    if (bounds[0] != 0 || bounds[p] != h_out)
        return cw__error(NULL, CW_ERR_INVALID_ARG, "patch_halo: bounds [%lld .. %lld] must span [0, %lld]",
                         (long long)bounds[0], (long long)bounds[p], (long long)h_out);
    memset(out, 0, sizeof *out);
    cw__patch pt;
    cw_status st = cw__patch_make(full, 0, h_out, &pt);
    if (st != CW_OK) return st;
    out->rows_needed = pt.b - pt.a;
    for (int i = 0; i < p; i++) {
        st = cw__patch_make(full, bounds[i], bounds[i + 1], &pt);
        if (st != CW_OK) return st;
        out->rows_read += pt.b - pt.a;
    }
    out->extra_rows = out->rows_read - out->rows_needed;
    out->extra_rows_pct = out->rows_needed > 0 ? 100.0 * (double)out->extra_rows / (double)out->rows_needed : 0.0;
    /* elements of one input row: N * C * [D] * W */
    double row_elems = (double)full->x.dims[0] * (double)full->x.dims[1] * (double)full->x.dims[hd + 1];
    if (full->spatial == 3) row_elems *= (double)full->x.dims[2];
    out->prep_flops_extra = (double)out->extra_rows * row_elems * prep_flops_per_elem;
    double f = cw__conv_flops(full);
    out->halo_pct = f > 0 ? 100.0 * out->prep_flops_extra / f : 0.0;
    return CW_OK;
}
