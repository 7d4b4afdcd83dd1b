/* The budget search: cw_graph_compile lowers the graph, dry-runs the plan's allocation
 * sequence against the budget (execute.c on the dry backend) and lowers again with a
 * smaller sizing budget until it fits; cw_graph_min_budget bisects the budget for the
 * smallest that compiles; cw_graph_memory_ladder lists the plans a memory budget chooses
 * between (each recompute step's activations + temporaries). */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "scheduler/sched.h"

/* Dry-runs the plan's allocation sequence under its budget. A plan whose allocations
 * would need a host synchronisation mid-run (the allocator releasing cached segments to
 * make room) does not fit either: CW_ERR_BUDGET. */
static cw_status cw__plan_simulate(cw_plan *p, int64_t *peak, int64_t *peak_allocated, int64_t *segments) {
    cw__backend *dry = NULL;
    cw__allocator *temp = NULL;
    cw_status st = cw__backend_dry_create(p->ctx->be, &dry);
    if (st == CW_OK) st = cw__alloc_create(&temp, p->ctx, dry, NULL, p->budget, CW__ALLOC_DETERMINISTIC | CW__ALLOC_PREFER_REUSE);
    if (st == CW_OK) st = cw__plan_execute(p, dry, temp, 1, peak, peak_allocated);
    if (st == CW_OK && dry->rt->host_syncs(dry) > p->n_streams)
        st = cw__error(p->ctx, CW_ERR_BUDGET, "compile: the plan would need a host synchronisation mid-run");
    if (segments) { /* device segments the run takes: the arena, and any beyond it */
        cw_memory_stats ms;
        cw__alloc_stats(temp, &ms);
        *segments = ms.num_device_allocs;
    }
    cw__alloc_destroy(temp);
    if (dry) dry->rt->destroy(dry);
    return st;
}

static int64_t cw__opt_budget(const cw_context *ctx, const cw_compile_options *o) {
    if (o->policy == CW_PATCHES_NONE) return -1;
    int64_t b = o->temp_budget ? o->temp_budget : ctx->cfg.temp_budget;
    /* a memory budget without a temporary budget: temporaries get an eighth of it */
    if (b <= 0 && o->memory_budget > 0) b = o->memory_budget / 8;
    return b > 0 ? b : -1;
}

/* Per-buffer pointers and descriptors the replay fills; constants are bound now,
 * externals get a placeholder until cw_plan_run binds them. */
static cw_status cw__plan_bind_constants(cw_plan *p) {
    p->ptrs = cw__calloc((size_t)p->n_bufs + 1, sizeof *p->ptrs);
    p->rdesc = cw__calloc((size_t)p->n_bufs + 1, sizeof *p->rdesc);
    if (!p->ptrs || !p->rdesc) return cw__error(p->ctx, CW_ERR_OUT_OF_MEMORY, "compile: out of host memory");
    for (int b = 0; b < p->n_bufs; b++) {
        const cw_tensor *t = p->bufs[b].t;
        p->rdesc[b] = t ? t->desc : p->bufs[b].d;
        p->ptrs[b] = t ? t->data : (void *)(uintptr_t)4096; /* externals: bound at run */
    }
    return CW_OK;
}

/* The arena need not be the whole budget: shrinks it towards the bytes the plan actually
 * has in use at once, as long as the dry run still fits in it alone, with no segment beyond
 * it (fragmentation inside the arena can need a little more than the bytes in use). */
static void cw__fit_arena(cw_plan *p, int64_t used, int64_t *peak) {
    for (int64_t a = (used + 511) / 512 * 512; p->arena > 0 && a < p->arena; a += a / 8 + 512) {
        int64_t keep = p->arena, pk = 0;
        p->arena = a;
        int64_t segs = 0; /* the arena alone: a run then takes no device memory of its own */
        if (cw__plan_simulate(p, &pk, NULL, &segs) == CW_OK && segs <= 1) {
            *peak = pk;
            return;
        }
        p->arena = keep;
    }
}

/* Builds under `budget`, shrinking the sizing budget until the dry run fits. fit_arena: also
 * size the run's arena (feasibility searches skip it: only the yes/no matters there). */
static cw_status cw__compile_at(cw_graph *g, const cw_compile_options *o, int64_t budget, int fit_arena,
                                const unsigned char *rec_allow, cw_plan **out) {
    int64_t sizing = budget;
    cw_status st = CW_OK;
    int whole = 1;
    for (int attempt = 0; attempt < 17; attempt++) {
        cw_plan *p = NULL;
        CW_TRY(cw__plan_build(g, o, sizing, budget, rec_allow, whole, &p));
        p->budget = budget;
        if ((st = cw__plan_bind_constants(p)) != CW_OK) {
            cw__plan_free(p);
            return st;
        }
        int64_t peak = 0, used = 0;
        p->arena = budget > 0 ? budget / 512 * 512 : 0;
        st = cw__plan_simulate(p, &peak, &used, NULL);
        if (st == CW_OK && fit_arena) cw__fit_arena(p, used, &peak);
        if (st == CW_OK) {
            p->temp_predicted = peak;
            *out = p;
            return CW_OK;
        }
        const int again = whole && p->n_rec_whole > 0; /* the same sizing without them first */
        cw__plan_free(p);
        if (st != CW_ERR_BUDGET || budget < 0) return st;
        whole = 0;
        if (again) continue;
        sizing = sizing - sizing / 6 - 1;
        if (sizing <= 0) break;
    }
    return CW_ERR_BUDGET;
}

/* Activations + temporaries a compiled plan holds at its peak (weights apart): its
 * activation arena and its temporaries' predicted peak (cw_plan_stats.activations_peak +
 * temp_predicted). */
static int64_t cw__plan_memory(const cw_plan *p) { return p->act_bytes + p->temp_predicted; }

/* cw_plan_stats.conv_cost_ms: the chosen algorithms' costs summed over every conv task (each
 * patch, each recompute, each band of a thin patch's sub-bands as the backend costs it), in
 * ms; -1 where the backend's costs are an order, not a time (cw__backend.costs_are_ns). */
static double cw__plan_conv_cost(const cw_plan *p) {
    if (!p->ctx->be->costs_are_ns) return -1.0;
    double ns = 0.0;
    for (int k = 0; k < p->n_tasks; k++)
        if (p->tasks[k].kind == CW__T_CONV) ns += cw__conv_of(p, &p->tasks[k])->algo.cost;
    return ns * 1e-6;
}

/* The recompute steps the planner climbs under a memory budget, cheapest in FLOPs first:
 * rec_min[0] = 0 stores every activation; rec_min[k] recomputes the inner activation of the
 * ResNet-style blocks holding >= rec_min[k] bytes (each step adds the blocks of the next
 * smaller conv result). Returns the number of steps (at most CW__REC_STEPS). */
#define CW__REC_STEPS 65
static int cw__rec_steps(const cw_graph *g, int64_t rec_min[CW__REC_STEPS]) {
    int ns = 1;
    rec_min[0] = 0;
    for (int i = 0; i < g->n && ns < CW__REC_STEPS; i++) { /* every conv result's size, once */
        if (g->nodes[i].kind != CW__N_CONV) continue;
        int64_t b = cw__desc_bytes(&g->nodes[i].desc);
        int k = 1;
        while (k < ns && rec_min[k] != b) k++;
        if (k == ns) rec_min[ns++] = b;
    }
    for (int a = 1; a < ns; a++) /* descending */
        for (int b = a + 1; b < ns; b++)
            if (rec_min[b] > rec_min[a]) {
                int64_t t = rec_min[a];
                rec_min[a] = rec_min[b], rec_min[b] = t;
            }
    return ns;
}

/* The climb through the recompute steps: which convs each step lets the planner recompute.
 * It climbs the size steps twice: first allowing only convs with one reader (a ResNet
 * block's inner activation: its FLOPs paid once more), then any conv read only by convs (an
 * upsampler's output, read by the next block's conv1 and shortcut, each recomputing it, and
 * nested inside the recompute of conv1 itself: its FLOPs paid three or four times more). */
typedef struct cw__rec_climb {
    int64_t rec_min[CW__REC_STEPS];
    int ns;
    unsigned char level;  /* the step's allow value: 1 one reader, 2 any (lower.h, rec_allow) */
    unsigned char *allow; /* per graph node: may be recomputed (cw__plan_build) */
    int *fresh;           /* scratch: the convs a step allows first */
} cw__rec_climb;

/* Steps in the climb: the first pass's ns, then the second's ns - 1 (its step 0 stores
 * nothing new). */
static int cw__rec_nsteps(const cw__rec_climb *c) { return 2 * c->ns - 1; }

static cw_status cw__rec_climb_init(cw_graph *g, cw__rec_climb *c) {
    c->ns = cw__rec_steps(g, c->rec_min);
    c->allow = cw__calloc((size_t)g->n + 1, 1);
    c->fresh = cw__malloc(((size_t)g->n + 1) * sizeof *c->fresh);
    if (!c->allow || !c->fresh) return cw__error(g->ctx, CW_ERR_OUT_OF_MEMORY, "compile: out of host memory");
    return CW_OK;
}

static void cw__rec_climb_free(cw__rec_climb *c) { cw__free(c->allow), cw__free(c->fresh); }

static int cw__plan_recomputes(const cw_plan *p, int node) {
    for (int i = 0; i < p->n_recomputed; i++)
        if (p->rec_nodes[i] == node) return 1;
    return 0;
}

/* Stores fresh convs c->fresh[lo, hi) again: the plan replaces *p when it holds less
 * activations + temporaries, or as much at no more recompute FLOPs (*kept = 1), else they are
 * allowed again (*kept = 0). (Storing is not always cheaper: an epilogue shortcut whose x is
 * recomputed reads the band of x its block recomputes anyway, while stored it recomputes x
 * once more for itself; and recomputed, the activations it would hold are never resident
 * whole on a backend that gives dead rows back, drops.c.) */
static cw_status cw__rec_try_store(cw_graph *g, const cw_compile_options *o, int64_t budget, cw__rec_climb *c, int lo,
                                   int hi, cw_plan **p, int *kept) {
    for (int f = lo; f < hi; f++) c->allow[c->fresh[f]] = 0;
    cw_plan *q = NULL;
    cw_status st = cw__compile_at(g, o, budget, 1, c->allow, &q);
    *kept = st == CW_OK && (cw__plan_memory(q) < cw__plan_memory(*p) ||
                            (cw__plan_memory(q) == cw__plan_memory(*p) && q->recompute_flop <= (*p)->recompute_flop));
    if (*kept) {
        cw__plan_free(*p);
        *p = q;
        return CW_OK;
    }
    cw__plan_free(q);
    for (int f = lo; f < hi; f++) c->allow[c->fresh[f]] = c->level;
    return st == CW_ERR_BUDGET ? CW_OK : st;
}

/* Step k's plan (steps in order from 0: each builds on the last). It allows the convs whose
 * result holds >= rec_min[k] bytes on top of the earlier steps' choices; then the blocks it
 * newly recomputes are tried stored again (all at once, then each in graph order), and stay
 * stored when the plan then holds no more activations + temporaries. A block whose inner
 * activation is not alive at the plan's peak pays its FLOPs again and saves nothing (in the
 * SD decoder at 512², the two same-shape blocks beside the 256->128 one; often none of a
 * step's blocks, hence all at once first). CW_ERR_BUDGET: the step's temporaries do not fit
 * the temp budget (its convs stay allowed for the next steps). */
static cw_status cw__rec_step(cw_graph *g, const cw_compile_options *o, int64_t budget, cw__rec_climb *c, int s,
                              cw_plan **out) {
    *out = NULL;
    int nf = 0, k = s < c->ns ? s : s - c->ns + 1;
    c->level = s < c->ns ? 1 : 2;
    for (int i = 0; k > 0 && i < g->n; i++)
        if (g->nodes[i].kind == CW__N_CONV && c->allow[i] < c->level &&
            cw__desc_bytes(&g->nodes[i].desc) >= c->rec_min[k])
            c->allow[i] = c->level, c->fresh[nf++] = i;
    cw_plan *p = NULL;
    CW_TRY(cw__compile_at(g, o, budget, 1, c->allow, &p));
    cw_status st = CW_OK;
    int nr = 0, kept = 0; /* the fresh convs p recomputes, first in c->fresh */
    for (int f = 0; f < nf; f++)
        if (cw__plan_recomputes(p, c->fresh[f])) c->fresh[nr++] = c->fresh[f];
    if (nr > 1) st = cw__rec_try_store(g, o, budget, c, 0, nr, &p, &kept);
    for (int f = 0; f < nr && !kept && st == CW_OK; f++) {
        int one = 0;
        st = cw__rec_try_store(g, o, budget, c, f, f + 1, &p, &one);
    }
    if (st != CW_OK) {
        cw__plan_free(p);
        return st;
    }
    *out = p;
    return CW_OK;
}

/* Under opt->memory_budget: the first recompute step (cw__rec_step) whose plan fits.
 * CW_ERR_BUDGET names the least memory a step reached. */
static cw_status cw__compile_in_memory(cw_graph *g, const cw_compile_options *o, int64_t budget, cw_plan **out) {
    int64_t best = -1;
    cw__rec_climb c;
    cw_status st = cw__rec_climb_init(g, &c);
    for (int k = 0; st == CW_OK && k < cw__rec_nsteps(&c); k++) {
        cw_plan *p = NULL;
        st = cw__rec_step(g, o, budget, &c, k, &p);
        if (st == CW_ERR_BUDGET) { /* its temporaries do not fit the temp budget */
            st = CW_OK;
            continue;
        }
        if (st != CW_OK) break;
        int64_t m = cw__plan_memory(p);
        if (m <= o->memory_budget) {
            cw__rec_climb_free(&c);
            *out = p;
            return CW_OK;
        }
        if (best < 0 || m < best) best = m;
        cw__plan_free(p);
    }
    cw__rec_climb_free(&c);
    CW_TRY(st);
    if (best < 0)
        return cw__error(g->ctx, CW_ERR_BUDGET, "cw_graph_compile: no plan fits temp budget %" PRId64 " bytes", budget);
    return cw__error(g->ctx, CW_ERR_BUDGET,
                     "cw_graph_compile: memory budget %" PRId64 " bytes (%.1f MiB) is too small; with every "
                     "recomputable block recomputed the plan holds %" PRId64 " bytes (%.1f MiB) of activations and "
                     "temporaries, the smallest memory budget that works (cw_graph_memory_ladder)",
                     o->memory_budget, (double)o->memory_budget / 1048576.0, best, (double)best / 1048576.0);
}

/* The memory ladder's climb: the recompute steps' plans (cw__rec_step) in order, most memory
 * first; each that holds less than every step before it is a ladder point, handed to visit,
 * which returns 1 where it keeps the plan (else it is freed). Steps whose temporaries do not
 * fit the temp budget are passed over; *n_points: how many points there were. */
typedef int (*cw__ladder_visit)(void *arg, cw_plan *p);

static cw_status cw__ladder_climb(cw_graph *g, const cw_compile_options *o, int64_t budget, cw__ladder_visit visit,
                                  void *arg, int *n_points) {
    cw__rec_climb c;
    int64_t least = -1;
    *n_points = 0;
    cw_status st = cw__rec_climb_init(g, &c);
    for (int k = 0; st == CW_OK && k < cw__rec_nsteps(&c); k++) {
        cw_plan *p = NULL;
        st = cw__rec_step(g, o, budget, &c, k, &p);
        if (st == CW_ERR_BUDGET) {
            st = CW_OK;
            continue;
        }
        if (st != CW_OK) break;
        int64_t m = cw__plan_memory(p);
        int kept = 0;
        if (least < 0 || m < least) {
            least = m;
            (*n_points)++;
            kept = visit(arg, p);
        }
        if (!kept) cw__plan_free(p);
    }
    cw__rec_climb_free(&c);
    return st;
}

static void cw__memory_point_of(const cw_plan *p, cw_memory_point *q) {
    q->total_bytes = cw__plan_memory(p);
    q->activations_bytes = p->act_bytes;
    q->temp_bytes = p->temp_predicted;
    q->n_recomputed = p->n_recomputed;
    q->recompute_gflop = p->recompute_flop * 1e-9;
    q->conv_cost_ms = cw__plan_conv_cost(p);
}

int cw__memory_auto_accepts(const cw_memory_point *stored, double stored_gflop, const cw_memory_point *pt,
                            double pct) {
    if (stored->conv_cost_ms > 0) return pt->conv_cost_ms <= stored->conv_cost_ms * (1.0 + pct / 100.0);
    return pt->recompute_gflop <= stored_gflop * pct / 100.0;
}

/* memory_budget CW_MEMORY_AUTO: the ladder's first point (the plan that stores everything,
 * or the least recompute whose temporaries fit) is the reference and the choice until a
 * later point (less memory) is accepted. */
typedef struct cw__auto_pick {
    double pct;
    cw_memory_point stored;
    double stored_gflop;
    cw_plan *chosen;
} cw__auto_pick;

static int cw__auto_visit(void *arg, cw_plan *p) {
    cw__auto_pick *a = arg;
    cw_memory_point q;
    cw__memory_point_of(p, &q);
    if (a->chosen) {
        if (!cw__memory_auto_accepts(&a->stored, a->stored_gflop, &q, a->pct)) return 0;
        cw__plan_free(a->chosen);
    } else {
        a->stored = q, a->stored_gflop = p->conv_gflop;
    }
    a->chosen = p;
    return 1;
}

static cw_status cw__compile_auto(cw_graph *g, const cw_compile_options *o, int64_t budget, cw_plan **out) {
    cw__auto_pick a = {o->memory_auto_pct, {0}, 0.0, NULL};
    int n = 0;
    cw_status st = cw__ladder_climb(g, o, budget, cw__auto_visit, &a, &n);
    if (st == CW_OK && !a.chosen) st = CW_ERR_BUDGET; /* no step's temporaries fit */
    if (st != CW_OK) {
        cw__plan_free(a.chosen);
        return st;
    }
    *out = a.chosen;
    return CW_OK;
}

static cw_status cw__opt_check(cw_context *ctx, const cw_compile_options *o) {
    if (o->size != sizeof(cw_compile_options) || o->version != CW_COMPILE_OPTIONS_VERSION)
        return cw__error(ctx, CW_ERR_INVALID_ARG, "cw_compile_options: size %zu / version %d, expected %zu / %d",
                         o->size, o->version, sizeof(cw_compile_options), CW_COMPILE_OPTIONS_VERSION);
    if (o->streams < 0 || o->streams > CW__MAX_STREAMS)
        return cw__error(ctx, CW_ERR_INVALID_ARG, "cw_compile_options.streams = %d, must be 0..%d", o->streams,
                         CW__MAX_STREAMS);
    if (o->policy != CW_PATCHES_AUTO && o->policy != CW_PATCHES_FIXED && o->policy != CW_PATCHES_NONE)
        return cw__error(ctx, CW_ERR_INVALID_ARG, "cw_compile_options.policy = %d is not a cw_patch_policy", (int)o->policy);
    if (o->policy == CW_PATCHES_FIXED && o->patches < 1)
        return cw__error(ctx, CW_ERR_INVALID_ARG, "cw_compile_options.patches = %d, must be >= 1 for CW_PATCHES_FIXED",
                         o->patches);
    if (o->memory_budget < 0 && o->memory_budget != CW_MEMORY_AUTO)
        return cw__error(ctx, CW_ERR_INVALID_ARG, "cw_compile_options.memory_budget = %" PRId64 " < 0 (CW_MEMORY_AUTO "
                         "is -1)", o->memory_budget);
    if (!(o->memory_auto_pct >= 0.0 && o->memory_auto_pct <= 1e9))
        return cw__error(ctx, CW_ERR_INVALID_ARG, "cw_compile_options.memory_auto_pct = %g: must be a percentage >= 0",
                         o->memory_auto_pct);
    if (o->patch_axis != CW_PATCH_AXIS_AUTO && o->patch_axis != CW_PATCH_AXIS_H && o->patch_axis != CW_PATCH_AXIS_D)
        return cw__error(ctx, CW_ERR_INVALID_ARG, "cw_compile_options.patch_axis = %d is not a cw_patch_axis",
                         (int)o->patch_axis);
    if (o->max_patch_rows < 0)
        return cw__error(ctx, CW_ERR_INVALID_ARG, "cw_compile_options.max_patch_rows = %" PRId64 " < 0", o->max_patch_rows);
    const cw_comm *c = o->comm;
    if (!c) return CW_OK;
    if (c->size != sizeof(cw_comm) || c->version != CW_COMM_VERSION)
        return cw__error(ctx, CW_ERR_INVALID_ARG, "cw_compile_options.comm: size %zu / version %d, expected %zu / %d",
                         c->size, c->version, sizeof(cw_comm), CW_COMM_VERSION);
    if (c->n_ranks < 1 || c->n_ranks > 32 || c->rank < 0 || c->rank >= c->n_ranks)
        return cw__error(ctx, CW_ERR_INVALID_ARG, "cw_compile_options.comm: rank %d of n_ranks %d (n_ranks must be 1..32, "
                         "rank 0..n_ranks-1)", c->rank, c->n_ranks);
    if (!c->send || !c->recv)
        return cw__error(ctx, CW_ERR_INVALID_ARG, "cw_compile_options.comm: send and recv must both be set");
    if (o->gather_rank < -1 || o->gather_rank >= c->n_ranks)
        return cw__error(ctx, CW_ERR_INVALID_ARG, "cw_compile_options.gather_rank = %d, must be -1..%d", o->gather_rank,
                         c->n_ranks - 1);
    int streams = o->policy == CW_PATCHES_NONE ? 1 : (o->streams > 0 ? o->streams : ctx->cfg.streams);
    if (c->n_ranks > 1 && streams + 1 > CW__MAX_STREAMS)
        return cw__error(ctx, CW_ERR_INVALID_ARG, "cw_compile_options.streams = %d: a distributed plan adds a stream for "
                         "its messages, at most %d in all", streams, CW__MAX_STREAMS);
    return CW_OK;
}

/* This rank's share of the single-process plan p (distribute.c), simulated again under the
 * budget: it runs a subset of the temporaries in the same order. */
static cw_status cw__compile_distributed(cw_plan *p, int64_t budget) {
    CW_TRY(cw__plan_distribute(p));
    int64_t peak = 0, used = 0;
    p->arena = budget > 0 ? budget / 512 * 512 : 0;
    CW_TRY(cw__plan_simulate(p, &peak, &used, NULL));
    cw__fit_arena(p, used, &peak);
    p->temp_predicted = peak;
    return CW_OK;
}

/* A budget under which g compiles: the unlimited plan's peak, doubled until it is feasible
 * as a cap; *lo gets the largest budget seen failing (0 if none). */
static cw_status cw__feasible_budget(cw_graph *g, const cw_compile_options *opt, int64_t *hi, int64_t *lo) {
    cw_plan *p = NULL;
    CW_TRY(cw__compile_at(g, opt, -1, 0, NULL, &p));
    cw_status st = CW_OK;
    *hi = p->temp_predicted, *lo = 0;
    cw__plan_free(p);
    for (;;) {
        st = cw__compile_at(g, opt, *hi, 0, NULL, &p);
        if (st == CW_OK) {
            cw__plan_free(p);
            return CW_OK;
        }
        if (st != CW_ERR_BUDGET || *hi > INT64_MAX / 4) return st;
        *lo = *hi;
        *hi *= 2;
    }
}

/* cw_graph_min_budget, cw_graph_memory_ladder and cw_graph_compile: the last failed call's
 * message stays the context's when they succeed, not that of a candidate plan their search
 * built and refused (cw_context_get_last_error). */
static cw_status cw__min_budget(cw_graph *g, int64_t *out_bytes, const cw_compile_options *opt);
static cw_status cw__memory_ladder(cw_graph *g, cw_memory_point *points, int *out_n, int max_points,
                                   const cw_compile_options *opt);
static cw_status cw__compile(cw_graph *g, cw_plan **out, const cw_compile_options *opt);

cw_status cw_graph_min_budget(cw_graph *g, int64_t *out_bytes, const cw_compile_options *opt) {
    if (!g) return CW_ERR_INVALID_ARG;
    char last[CW__ERR_LEN];
    cw__error_save(g->ctx, last);
    cw_status st = cw__min_budget(g, out_bytes, opt);
    if (st == CW_OK) cw__error_restore(g->ctx, last);
    return st;
}

cw_status cw_graph_memory_ladder(cw_graph *g, cw_memory_point *points, int *out_n, int max_points,
                                 const cw_compile_options *opt) {
    if (!g) return CW_ERR_INVALID_ARG;
    char last[CW__ERR_LEN];
    cw__error_save(g->ctx, last);
    cw_status st = cw__memory_ladder(g, points, out_n, max_points, opt);
    if (st == CW_OK) cw__error_restore(g->ctx, last);
    return st;
}

cw_status cw_graph_compile(cw_graph *g, cw_plan **out, const cw_compile_options *opt) {
    if (!g || !out) return CW_ERR_INVALID_ARG;
    char last[CW__ERR_LEN];
    cw__error_save(g->ctx, last);
    cw_status st = cw__compile(g, out, opt);
    if (st == CW_OK) cw__error_restore(g->ctx, last);
    return st;
}

static cw_status cw__min_budget(cw_graph *g, int64_t *out_bytes, const cw_compile_options *opt) {
    static const cw_compile_options dflt = CW_COMPILE_OPTIONS_INIT;
    if (!out_bytes) return CW_ERR_INVALID_ARG;
    if (!opt) opt = &dflt;
    CW_TRY(cw__opt_check(g->ctx, opt));
    if (g->n_outputs == 0) return cw__error(g->ctx, CW_ERR_INVALID_ARG, "cw_graph_min_budget: the graph has no outputs");
    int64_t hi, lo;
    CW_TRY(cw__feasible_budget(g, opt, &hi, &lo));
    cw_status st = CW_OK;
    if (opt->policy == CW_PATCHES_NONE) {
        *out_bytes = hi;
        return CW_OK;
    }
    /* smallest budget that compiles: compile success is monotone enough in the budget
     * for a bisection to 1/4096 of the range (then rounded up to 4 KiB): the unlimited
     * plan's peak can be gigabytes, and a 1/256 step left answers tens of MiB high. */
    int64_t step = hi / 4096 > 4096 ? hi / 4096 : 4096;
    while (hi - lo > step) {
        int64_t mid = lo + (hi - lo) / 2;
        cw_plan *p = NULL;
        st = cw__compile_at(g, opt, mid, 0, NULL, &p);
        if (st == CW_OK) {
            cw__plan_free(p);
            hi = mid;
        } else if (st == CW_ERR_BUDGET) {
            lo = mid;
        } else {
            return st;
        }
    }
    *out_bytes = (hi + 4095) / 4096 * 4096;
    return CW_OK;
}

typedef struct cw__ladder_points {
    cw_memory_point pts[2 * CW__REC_STEPS];
    int n;
} cw__ladder_points;

static int cw__ladder_record(void *arg, cw_plan *p) {
    cw__ladder_points *l = arg;
    cw__memory_point_of(p, &l->pts[l->n++]);
    return 0;
}

static cw_status cw__memory_ladder(cw_graph *g, cw_memory_point *points, int *out_n, int max_points,
                                   const cw_compile_options *opt) {
    static const cw_compile_options dflt = CW_COMPILE_OPTIONS_INIT;
    if (!out_n) return cw__error(g->ctx, CW_ERR_INVALID_ARG, "cw_graph_memory_ladder: out_n is NULL");
    *out_n = 0;
    if (max_points < 0 || (max_points > 0 && !points))
        return cw__error(g->ctx, CW_ERR_INVALID_ARG,
                         "cw_graph_memory_ladder: max_points = %d with points %s: points must hold max_points >= 0 "
                         "entries",
                         max_points, points ? "set" : "NULL");
    if (!opt) opt = &dflt;
    CW_TRY(cw__opt_check(g->ctx, opt));
    if (g->n_outputs == 0)
        return cw__error(g->ctx, CW_ERR_INVALID_ARG, "cw_graph_memory_ladder: the graph has no outputs");
    cw_compile_options o = *opt;
    o.memory_budget = 0; /* the temporary budget alone, as cw_graph_compile resolves it */
    int64_t budget = cw__opt_budget(g->ctx, &o);
    if (o.policy != CW_PATCHES_NONE && budget <= 0)
        return cw__error(g->ctx, CW_ERR_INVALID_ARG,
                         "cw_graph_memory_ladder: opt->temp_budget = %" PRId64 " and the context's temp_budget = %" PRId64
                         ": set one > 0 (under a memory budget alone temporaries get an eighth of it, so no total is "
                         "fixed)",
                         opt->temp_budget, g->ctx->cfg.temp_budget);
    /* every step's plan, as cw__compile_in_memory builds it; a step is on the ladder when it
     * holds less than every step before it (cw_graph_compile takes the first that fits) */
    cw__ladder_points kept = {{{0}}, 0};
    int n = 0;
    CW_TRY(cw__ladder_climb(g, &o, budget, cw__ladder_record, &kept, &n));
    if (n == 0) {
        int64_t need = -1;
        if (cw_graph_min_budget(g, &need, &o) != CW_OK) need = -1;
        return cw__error(g->ctx, CW_ERR_BUDGET,
                         "cw_graph_memory_ladder: no plan fits temp budget %" PRId64 " bytes (%.1f MiB); the smallest "
                         "temp budget that works is %" PRId64 " bytes (%.1f MiB)",
                         budget, (double)budget / 1048576.0, need, (double)need / 1048576.0);
    }
    for (int i = 0; i < n && i < max_points; i++) points[i] = kept.pts[n - 1 - i]; /* least memory first */
    *out_n = n;
    return CW_OK;
}

/* What a compiled plan needs to run: events, timing slots, its temporary pool. A plan under
 * the context's budget shares the context's temporaries; others (the unscheduled
 * reference, explicit budgets) get their own capped allocator. */
static cw_status cw__plan_prepare_run(cw_plan *p, int64_t budget) {
    cw_context *ctx = p->ctx;
    cw_status st = CW_OK;
    uint32_t aflags = CW__ALLOC_DETERMINISTIC | CW__ALLOC_PREFER_REUSE |
                      ((ctx->cfg.flags & CW_FLAG_POISON) ? CW__ALLOC_POISON : 0);
    p->events = cw__calloc((size_t)p->n_events + 1, sizeof *p->events);
    p->t0 = cw__calloc((size_t)p->n_tasks + 1, sizeof *p->t0);
    p->t1 = cw__calloc((size_t)p->n_tasks + 1, sizeof *p->t1);
    if (!p->events || !p->t0 || !p->t1) return cw__error(ctx, CW_ERR_OUT_OF_MEMORY, "compile: out of host memory");
    int64_t ctx_budget = ctx->cfg.temp_budget > 0 ? ctx->cfg.temp_budget : -1;
    if (budget == ctx_budget) p->temp = ctx->temp;
    else {
        const cw__seg_source src = cw__context_seg_source(ctx);
        if ((st = cw__alloc_create(&p->temp, ctx, ctx->be, &src, budget, aflags)) == CW_OK) p->own_temp = 1;
    }
    for (int e = 0; e < p->n_events && st == CW_OK; e++) st = ctx->be->rt->event_create(ctx->be, &p->events[e]);
    /* traces from device timestamps where the backend has them */
    if (st == CW_OK && (ctx->cfg.flags & CW_FLAG_TIMING) && ctx->be->rt->timer_create)
        st = ctx->be->rt->timer_create(ctx->be, 2 * p->n_tasks + 1, &p->timer);
    /* streams and the temporaries' arena now, not in the first run */
    for (int s = 0; s < p->n_streams && st == CW_OK; s++) {
        cw__stream *unused;
        st = cw__context_stream(ctx, s, &unused);
    }
    if (st == CW_OK) st = cw__plan_prime(p, p->temp);
    /* the activation arena lives with the plan: no allocation inside cw_plan_run */
    if (st == CW_OK && p->act_bytes > 0) st = cw__alloc_malloc(ctx->act, p->act_bytes, NULL, &p->act_arena);
    return st;
}

/* The desc r has when the plan runs (cw__enqueue's): ACT and TEMP buffers are compact
 * where the run places them (cw__exec_alloc); externals and constants have their tensors'
 * strides (p->rdesc now; an external not yet bound: compact, as cw_tensor_create makes). */
static void cw__run_desc(const cw_plan *p, const cw__vref *r, cw_tensor_desc *d) {
    const cw__buf *b = &p->bufs[r->buf];
    cw_tensor_desc bd = b->kind == CW__B_ACT || b->kind == CW__B_TEMP ? b->d : p->rdesc[r->buf];
    if (b->kind == CW__B_ACT || b->kind == CW__B_TEMP) memset(bd.strides, 0, sizeof bd.strides);
    cw__desc_fill_strides(&bd); /* all zero: compact */
    cw__vref_desc(&bd, r, d);
}

/* Backends that build per-problem state (cuDNN execution plans, oneDNN primitives) do it
 * now, for the views the run will give each task, not in the first run; where a task's
 * algorithm cannot run its patch within the workspace the plan gives it, the backend's
 * substitute (within that workspace) takes its place. */
static cw_status cw__plan_prepare_convs(cw_plan *p) {
    cw__backend *be = p->ctx->be;
    for (int k = 0; k < p->n_tasks; k++) {
        cw__task *t = &p->tasks[k];
        if (t->kind != CW__T_CONV) continue;
        cw__conv_ext *ce = cw__conv_of(p, t);
        cw__conv_algo used;
        cw__conv_problem pr = ce->prob;
        cw__run_desc(p, &t->u.conv.x, &pr.x);
        cw__run_desc(p, &t->u.conv.w, &pr.w);
        cw__run_desc(p, &t->u.conv.y, &pr.y);
        CW_TRY(cw__op_conv_prepare(be, &pr, &ce->algo, ce->algo.workspace, &used));
        if (used.id != ce->algo.id && used.workspace <= ce->algo.workspace) {
            int64_t ws = ce->algo.workspace; /* the buffer the plan sized stays */
            ce->algo = used;
            ce->algo.workspace = ws;
        } else {
            ce->algo.prepared = used.prepared; /* the task holds it: cw__plan_free drops it */
        }
    }
    return CW_OK;
}

static void cw__plan_compile_stats(cw_plan *p) {
    p->stats.n_tasks = p->n_tasks;
    p->stats.n_events = p->n_events;
    p->stats.n_streams = p->n_streams;
    p->stats.temp_predicted = p->temp_predicted;
    p->stats.weights_bytes = p->weights_bytes;
    p->stats.conv_gflop = p->conv_gflop;
    p->stats.halo_overhead_pct = p->conv_gflop > 0 ? 100.0 * p->halo_flop * 1e-9 / p->conv_gflop : 0.0;
    p->stats.activations_live_peak = p->act_live_peak;
    p->stats.activations_peak = p->act_bytes;
    p->stats.n_recomputed = p->n_recomputed;
    p->stats.recompute_gflop = p->recompute_flop * 1e-9;
    p->stats.conv_cost_ms = cw__plan_conv_cost(p);
    for (int c = 0; c < p->n_convs; c++) p->stats.n_patches += p->convs[c].patches;
}

/* Gives a finished plan's arrays their exact sizes: they grew by doubling (cw__grow), so up
 * to half of each was zeroed capacity the plan would keep resident (4 MiB of tasks for the
 * SD decoder at 990 patches). A failed shrink keeps the larger array. */
static void cw__shrink(void **arr, int *cap, int n, size_t elem) {
    if (n <= 0 || n >= *cap) return;
    void *na = cw__realloc(*arr, (size_t)n * elem);
    if (na) *arr = na, *cap = n;
}

static void cw__plan_shrink(cw_plan *p) {
    cw__shrink((void **)&p->tasks, &p->cap_tasks, p->n_tasks, sizeof *p->tasks);
    cw__shrink((void **)&p->acts, &p->cap_acts, p->n_acts, sizeof *p->acts);
    cw__shrink((void **)&p->bufs, &p->cap_bufs, p->n_bufs, sizeof *p->bufs);
    cw__shrink((void **)&p->convs, &p->cap_convs, p->n_convs, sizeof *p->convs);
    cw__shrink((void **)&p->cexts, &p->cap_cexts, p->n_cexts, sizeof *p->cexts);
    cw__shrink((void **)&p->names, &p->cap_names, p->n_names, 1);
    cw__shrink((void **)&p->drops, &p->cap_drops, p->n_drops, sizeof *p->drops);
}

static cw_status cw__compile(cw_graph *g, cw_plan **out, const cw_compile_options *opt) {
    static const cw_compile_options dflt = CW_COMPILE_OPTIONS_INIT;
    *out = NULL;
    if (!opt) opt = &dflt;
    cw_context *ctx = g->ctx;
    CW_TRY(cw__opt_check(ctx, opt));
    if (g->n_outputs == 0) return cw__error(ctx, CW_ERR_INVALID_ARG, "cw_graph_compile: the graph has no outputs");
    int64_t budget = cw__opt_budget(ctx, opt);
    const int in_memory = opt->memory_budget > 0, auto_memory = opt->memory_budget == CW_MEMORY_AUTO && budget > 0;
    if (opt->comm && !auto_memory) CW_TRY(cw__comm_check_config(g, opt));
    cw_plan *p = NULL;
    cw_status st = in_memory     ? cw__compile_in_memory(g, opt, budget, &p)
                   : auto_memory ? cw__compile_auto(g, opt, budget, &p)
                                 : cw__compile_at(g, opt, budget, 1, NULL, &p);
    if (st == CW_OK && opt->comm && auto_memory) { /* the ranks' choices agree (their costs can differ by host) */
        cw_compile_options chosen = *opt;
        chosen.memory_budget = cw__plan_memory(p);
        if ((st = cw__comm_check_config(g, &chosen)) != CW_OK) {
            cw__plan_free(p);
            return st;
        }
    }
    if (st == CW_ERR_BUDGET && in_memory) return st; /* its message says why */
    if (st == CW_ERR_BUDGET) {
        int64_t need = -1;
        if (cw_graph_min_budget(g, &need, opt) != CW_OK) need = -1;
        return cw__error(ctx, CW_ERR_BUDGET,
                         "cw_graph_compile: budget %" PRId64 " bytes (%.1f MiB) is too small for this graph; the "
                         "smallest budget that works is %" PRId64 " bytes (%.1f MiB)",
                         budget, (double)budget / 1048576.0, need, (double)need / 1048576.0);
    }
    CW_TRY(st);
    if (opt->comm && (st = cw__compile_distributed(p, budget)) != CW_OK) {
        cw__plan_free(p);
        return st;
    }
    cw__plan_shrink(p);
    if ((st = cw__plan_prepare_run(p, budget)) != CW_OK || (st = cw__plan_prepare_convs(p)) != CW_OK) {
        cw__plan_free(p);
        return st;
    }
    cw__plan_compile_stats(p);
    /* the candidate plans the budget and memory searches built and dropped leave freed heap
     * that glibc would keep resident through every run (17 MiB for the SD decoder) */
    cw__host_trim();
    *out = p;
    return CW_OK;
}
