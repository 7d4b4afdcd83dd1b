/* Patches along H (rows) or, for 5-D convs, D (frames): the exact halo math of DESIGN.md and
 * the planner that picks a conv's patch axis, count and algorithm from its share of the
 * budget (planner.c, used by the lowering, the tests and bench_conv); and convolution
 * parameter validation (conv_check.c).
 * A patch is a view into the full input/output tensors: same strides, fewer rows. */
#ifndef CW_PLANNER_H
#define CW_PLANNER_H

#include "backend/backend.h"

/* One output row band [o0, o1) of a convolution along its patch axis `axis` (a tensor dim
 * index): H (the last-but-one dim: index 2 in NCHW, 3 in NCDHW) or, for a 5-D conv, D (time,
 * index 2 of NCDHW: a band of output frames). "Rows" below are rows along that axis. It
 * reads input rows [a, b); pad_pre/pad_post are its own paddings along the axis.
 * prob is the patch's problem: x dims with b-a rows, y dims with o1-o0 rows, the full
 * tensors' strides, the axis's paddings pad_pre/pad_post, everything else as the full
 * problem (an interior band has no padding on a side that has real rows; the first and
 * last keep the conv's pad_pre / pad_post, so causal padding in T stays exact).
 * x_offset / y_offset: element offsets of the view starts in the full x and y.
 *
 * Empty-input patches: when every row of the band reads only padding (possible when the
 * padding is larger than the kernel's reach, e.g. k=1, pad=3), a == b and prob.x has
 * 0 rows; its output is the bias (or 0). cw__cpu_conv_run handles such a problem; a
 * backend that rejects empty tensors (cuDNN) must lower it to a fill: see
 * cw__patch_is_empty. */
typedef struct cw__patch {
    int64_t o0, o1, a, b, pad_pre, pad_post;
    int axis;
    cw__conv_problem prob;
    int64_t x_offset, y_offset;
} cw__patch;

/* Index of H in the tensor dims (2 for 2-D, 3 for 3-D) and in the params arrays (0 / 1). */
static inline int cw__patch_hdim(const cw__conv_problem *p) { return p->spatial; }
static inline int cw__patch_hpar(const cw__conv_problem *p) { return p->spatial - 2; }
/* Index of D (time) in the tensor dims of a 5-D conv; its params index is axis - 2. */
#define CW__PATCH_DDIM 2

/* Axes the planner may cut a conv along (cw__conv_share.axes, a mask). */
#define CW__AX_H 1
#define CW__AX_D 2

/* Fills *out for output rows [o0, o1) of `full` (0 <= o0 < o1 <= H_out). Strides of the
 * full problem may be zero (contiguous); the patch gets them filled in. Returns
 * CW_ERR_INVALID_ARG for a row range outside the output. */
cw_status cw__patch_make(const cw__conv_problem *full, int64_t o0, int64_t o1, cw__patch *out);
/* The same along tensor dim `axis` (cw__patch_hdim(full), or CW__PATCH_DDIM of a 5-D conv);
 * CW_ERR_INVALID_ARG for another axis. cw__patch_make is this along H. */
cw_status cw__patch_make_ax(const cw__conv_problem *full, int axis, int64_t o0, int64_t o1, cw__patch *out);
/* 1 when the patch reads no input rows (its output is the bias, or zero). */
static inline int cw__patch_is_empty(const cw__patch *p) { return p->a >= p->b; }

/* p+1 balanced boundaries of h_out rows into p bands: bounds[i] = floor(i*h_out/p), so
 * band sizes differ by at most one and none is empty. Requires 1 <= p <= h_out (p > h_out
 * gives empty bands; p < 1 is treated as 1 and writes 2 entries). */
void cw__patch_bounds(int64_t h_out, int p, int64_t *bounds);

/* What one convolution may use, from the lowering: its share of the budget and how many of
 * its temporaries are in flight at once. */
typedef struct cw__conv_share {
    int64_t avail;  /* bytes for the workspaces and patch buffers in flight; < 0: unlimited */
    int heavy;      /* workspaces in flight (one per heavy stream), >= 1 */
    int n_pbufs;    /* patch buffers in flight (when prep), and output band buffers (when ybuf) */
    int prep;       /* 1: each patch reads a prep buffer holding its input rows */
    int p_min;      /* at least this many patches, >= 1 (max_patch_rows) */
    int p_max;      /* at most this many; 0: the output height */
    int p_fixed;    /* > 0: this many patches (clamped to p_min..H_out) whatever avail says */
    int single;     /* 1: one patch with the fastest algorithm (the unscheduled reference) */
    int ybuf;       /* output band buffers per patch, 0-2: its conv's output rows (the residual
                       epilogue adds them into the other operand's storage, in place), and an
                       epilogue shortcut's band (fusion.c, rec_epi) */
    int axes;       /* the axes it may cut along (CW__AX_H | CW__AX_D mask; 0: H). D only for a
                       5-D conv (else H); with both, cw__planner_plan picks one */
    int p_mult;     /* > 1: the count found is rounded up to a multiple of it (at most H_out):
                       a distributed plan's ranks (balanced bands then start at each rank's
                       band, so convs of one tensor agree on where ranks meet) */
} cw__conv_share;

/* A convolution's patching: P row bands, each a cw__patch (rows, input rows, halo
 * paddings, problem), all run with one algorithm (one id, so every band is the same
 * engine). ws, pbuf and ybuf are the largest workspace / prep buffer / output band buffer
 * over the bands, in bytes; algo.workspace == ws. */
typedef struct cw__conv_plan {
    int patches;
    int axis;         /* the tensor dim the bands cut (cw__patch.axis) */
    cw__conv_algo algo;
    int64_t ws, pbuf, ybuf;
    int64_t *bounds;  /* patches + 1 output row boundaries */
    cw__patch *patch; /* patches entries */
} cw__conv_plan;

/* The one planner (production and tests): picks the patch count and algorithm of `full`
 * under `share`, then cuts the bands (cw__patch_bounds, cw__patch_make).
 * - single, or avail < 0 without p_fixed: p_min patches (1 when single) with the fastest
 *   algorithm the backend lists for the full problem;
 * - else, for each algorithm in the backend's order for the full problem (fastest first),
 *   the smallest P in p_min..p_max whose bands fit:
 *     heavy * round(ws) + n_pbufs * round(pbuf) <= avail   (round: cw__alloc_round)
 *   (+ n_pbufs * round(ybuf) when each band writes an output band buffer)
 *   found by bisection (workspace and buffer shrink as P grows), probing the tallest band
 *   (ceil(H_out / P) rows) in the middle of the output, where no padding clips its input
 *   rows; the chosen P's ws and pbuf are the max over that band and the first and last.
 *   A slower algorithm is used only when no P fits a faster one.
 * The axis: H unless share->axes allows D (5-D convs). With D alone, the same search along D
 * (P up to D_out). With both (the lowering's auto), single / unlimited / p_fixed stay on H;
 * else each axis is planned as above and the plan with the faster algorithm wins, then the
 * one whose halo re-reads fewer input elements (cw__patch_halo's extra rows x the elements
 * of one row along that axis), H on a tie: so D wins once the clip has more frames than
 * rows (a band of r frames re-reads as many frames per cut as a band of r rows re-reads
 * rows, and a frame is H/D times a row), or where no H band fits at all (a long clip
 * whose single rows, each holding every frame, exceed the share).
 * When nothing fits: CW_ERR_BUDGET; *min_avail (may be NULL, then it is not computed)
 * gets the smallest avail that would fit, over every algorithm (and allowed axis) at
 * P = p_max.
 * Free *out with cw__conv_plan_free (also after a failure). */
cw_status cw__planner_plan(cw__backend *be, const cw__conv_problem *full, const cw__conv_share *share,
                           cw__conv_plan *out, int64_t *min_avail);
void cw__conv_plan_free(cw__conv_plan *plan);

/* Useful convolution FLOPs of a problem: 2 * N * K * prod(out spatial) * (C/groups) *
 * prod(kernel) (multiply and add counted separately; the bias add is not counted).
 * Padding taps are counted as work, as every dense conv library does. */
double cw__conv_flops(const cw__conv_problem *p);

/* Halo overhead of a patch plan. Each output row is computed exactly once, so patching
 * adds no convolution FLOPs. What is repeated is the *input side*: the rows two adjacent
 * patches both read (the halo) are read — and, when the input is produced on the fly by
 * a fused prep stage (GroupNorm apply + SiLU + upsample), prepared — once per patch.
 *   rows_read    = sum over patches of (b - a)
 *   rows_needed  = rows the unpatched conv reads (b - a of the single full patch)
 *   extra_rows   = rows_read - rows_needed (input rows read/prepared twice or more)
 *   extra_rows_pct = 100 * extra_rows / rows_needed (0 when rows_needed == 0)
 *   prep_flops_extra = extra_rows * (N * C * [D] * W) * prep_flops_per_elem: the prep
 *                      work recomputed on halo rows, for a prep of that cost per element.
 * halo_pct = 100 * prep_flops_extra / conv FLOPs of the full problem: the "recomputed
 * FLOPs from halos" in cw_plan_stats (0 when there is no prep stage). */
typedef struct cw__halo {
    int64_t rows_read, rows_needed, extra_rows;
    double extra_rows_pct;
    double prep_flops_extra;
    double halo_pct;
} cw__halo;
/* bounds: p+1 output row boundaries (cw__patch_bounds or any increasing split). */
cw_status cw__patch_halo(const cw__conv_problem *full, const int64_t *bounds, int p, double prep_flops_per_elem,
                         cw__halo *out);
/* The same for bands along tensor dim `axis` (cw__patch_make_ax); a row is then the
 * N * C * (the other spatial dims) elements of one index along that axis. */
cw_status cw__patch_halo_ax(const cw__conv_problem *full, int axis, const int64_t *bounds, int p,
                            double prep_flops_per_elem, cw__halo *out);

/* ---- conv_check.c: parameter validation ---- */

/* Validates a convolution: params size/version, spatial 2/3 vs rank 4/5, dtypes, dims
 * >= 1, groups vs channels, strides/dilations >= 1, paddings >= 0, kernel no larger than
 * the padded input, bias [K], and y's dims (y NULL: not checked). b may be NULL. Every
 * error is CW_ERR_INVALID_ARG with a message naming the field and values. On success
 * fills *y_expected_out (may be NULL) with the contiguous output descriptor. Aliasing of
 * data pointers is the caller's job (cw__views_overlap). */
cw_status cw__conv_validate(cw_context *ctx, const cw_tensor_desc *x, const cw_tensor_desc *w,
                            const cw_tensor_desc *b, const cw_tensor_desc *y, const cw_conv_params *p,
                            cw_tensor_desc *y_expected_out);
/* Builds the backend problem of a validated convolution (strides filled in). */
void cw__conv_problem_init(cw__conv_problem *out, const cw_tensor_desc *x, const cw_tensor_desc *w, int has_bias,
                           const cw_tensor_desc *y, const cw_conv_params *p);

#endif
