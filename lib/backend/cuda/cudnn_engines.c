/* cuDNN convolution, engine selection: heuristics (mode A, then FALLBACK) for a problem's
 * graphs (as given, packed, bias-fused) filtered to the engines we allow and ordered into
 * the problem's engine-config list, whose ids stay the same for every patch of a conv. */
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "backend/cuda/cudnn_conv.h"

static uint64_t cw__fnv(uint64_t h, int64_t v) {
    for (int i = 0; i < 8; i++) {
        h ^= (uint64_t)(v >> (8 * i)) & 0xffu;
        h *= 1099511628211ull;
    }
    return h;
}

/* Engine index, numerical notes and a signature of the knob choices of one config. */
static cw_status cw__cfg_info(cw_context *ctx, cudnnBackendDescriptor_t cfg, int64_t *engine, int *notes,
                              uint64_t *sig) {
    cw_status st = CW_OK;
    cudnnBackendDescriptor_t eng = NULL, knobs[CUDNN_KNOB_TYPE_COUNTS];
    int nk = 0;
    int64_t cnt = 0;
    *notes = 0;
    CW__CUDNN_QUIET(ctx, st, done, cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &eng));
    CW__CUDNN_QUIET(ctx, st, done,
                   cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cnt,
                                            &eng));
    CW__CUDNN_QUIET(ctx, st, done,
                   cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &cnt, engine));
    cudnnBackendNumericalNote_t nn[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
    CW__CUDNN_QUIET(ctx, st, done,
                   cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                            CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &cnt, nn));
    for (int64_t i = 0; i < cnt && i < CUDNN_NUMERICAL_NOTE_TYPE_COUNT; i++) *notes |= 1 << (int)nn[i];

    for (; nk < CUDNN_KNOB_TYPE_COUNTS; nk++)
        CW__CUDNN_QUIET(ctx, st, done, cudnnBackendCreateDescriptor(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR, &knobs[nk]));
    CW__CUDNN_QUIET(ctx, st, done,
                   cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                            CUDNN_KNOB_TYPE_COUNTS, &cnt, knobs));
    /* Choices come in cuDNN's order; a sum of per-choice hashes does not depend on it. */
    uint64_t acc = 0;
    for (int64_t i = 0; i < cnt && i < CUDNN_KNOB_TYPE_COUNTS; i++) {
        cudnnBackendKnobType_t type;
        int64_t value = 0, c1 = 0;
        CW__CUDNN_QUIET(ctx, st, done,
                       cudnnBackendGetAttribute(knobs[i], CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE, 1,
                                                &c1, &type));
        CW__CUDNN_QUIET(ctx, st, done,
                       cudnnBackendGetAttribute(knobs[i], CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, CUDNN_TYPE_INT64, 1, &c1,
                                                &value));
        acc += cw__fnv(cw__fnv(14695981039346656037ull, (int64_t)type), value);
    }
    *sig = cw__fnv(cw__fnv(14695981039346656037ull, *engine), (int64_t)acc);
done:
    for (int i = 0; i < nk; i++) cudnnBackendDestroyDescriptor(knobs[i]);
    if (eng) cudnnBackendDestroyDescriptor(eng);
    return st;
}

/* Engines we never use: results must not depend on timing (nondeterministic engines use
 * atomics), f32 compute must stay f32 (no reduced-precision reductions, and for f32 data
 * no TF32 tensor cores or down-converted inputs), and f32 must stay within the 1e-5 the
 * cpu oracle allows (FFT and Winograd transforms typically lose ~1e-4 in f32). */
static int cw__cfg_rejected(int notes, cw_dtype dt, unsigned flags) {
    if (notes & (1 << CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC)) return 1;
    if (notes & (1 << CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION)) return 1;
    if (notes & (1 << CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS)) return 1;
    /* TF32 (opt-in): f32 data on tensor cores, 10-bit mantissa products */
    if (dt == CW_F32 && (flags & CW__CUDNN_TF32)) notes &= ~(1 << CUDNN_NUMERICAL_NOTE_TENSOR_CORE);
    if (dt == CW_F32 && (notes & ((1 << CUDNN_NUMERICAL_NOTE_TENSOR_CORE) | (1 << CUDNN_NUMERICAL_NOTE_FFT) |
                                  (1 << CUDNN_NUMERICAL_NOTE_WINOGRAD) | (1 << CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_4x4) |
                                  (1 << CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_6x6) |
                                  (1 << CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_13x13))))
        return 1;
    return 0;
}

/* Appends the configs of one heuristics mode for graph g to raw (skipping duplicates and
 * rejected engines). A mode cuDNN cannot serve returns its status; the caller decides. */
static cw_status cw__heuristics(cw__cudnn_conv *c, const cw__cudnn_graph *g, cw_dtype dt,
                                cudnnBackendHeurMode_t mode, cw__raw_cfg *raw, int *n_raw) {
    cw_context *ctx = c->ctx;
    cw_status st = CW_OK;
    cudnnBackendDescriptor_t heur = NULL, cfgs[CW__CUDNN_MAX_CFGS];
    int64_t count = 0, got = 0;
    int made = 0;
    CW__CUDNN_QUIET(ctx, st, done, cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heur));
    CW__CUDNN_QUIET(ctx, st, done,
                    cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH,
                                             CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g->graph));
    CW__CUDNN_QUIET(ctx, st, done,
                    cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode));
#if CUDNN_VERSION >= 90800
    if (c->devprop)
        CW__CUDNN_QUIET(ctx, st, done,
                        cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_DEVICEPROP,
                                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c->devprop));
#endif
    CW__CUDNN_QUIET(ctx, st, done, cudnnBackendFinalize(heur));
    CW__CUDNN_QUIET(ctx, st, done,
                    cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                                             &count, NULL));
    if (count <= 0) goto done;
    if (count > CW__CUDNN_MAX_CFGS) count = CW__CUDNN_MAX_CFGS;
    for (; made < count; made++)
        CW__CUDNN_QUIET(ctx, st, done,
                        cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cfgs[made]));
    CW__CUDNN_QUIET(ctx, st, done,
                    cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count,
                                             &got, cfgs));
    for (int64_t i = 0; i < got && i < count; i++) {
        int64_t engine = -1, ws = 0, k = 0;
        int notes = 0, dup = 0;
        uint64_t sig = 0;
        if (*n_raw >= CW__CUDNN_MAX_CFGS) break;
        /* A config cuDNN cannot describe is skipped, not fatal: the others may serve. */
        if (cw__cfg_info(ctx, cfgs[i], &engine, &notes, &sig) != CW_OK) continue;
        if (cw__cfg_rejected(notes, dt, c->flags)) continue;
        if (engine < 0 || engine >= (1 << 20)) continue; /* keeps the id encoding in range */
        /* a negative workspace means cuDNN cannot size it for this problem: unusable */
        if (cudnnBackendGetAttribute(cfgs[i], CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &k, &ws) !=
                CUDNN_STATUS_SUCCESS ||
            ws < 0)
            continue;
        for (int j = 0; j < *n_raw && !dup; j++) dup = raw[j].sig == sig;
        if (dup) continue;
        raw[*n_raw].cfg = cfgs[i];
        raw[*n_raw].ws = ws;
        raw[*n_raw].engine = engine;
        raw[*n_raw].sig = sig;
        (*n_raw)++;
        cfgs[i] = NULL; /* owned by raw now */
    }
done:
    for (int i = 0; i < made; i++)
        if (cfgs[i]) cudnnBackendDestroyDescriptor(cfgs[i]);
    if (heur) cudnnBackendDestroyDescriptor(heur);
    return st;
}

/* The configs of raw (one graph kind) to take, in order, into idx: lean = 0 each engine's
 * first config (heuristic order), lean = 1 each engine's smallest-workspace config where
 * it is smaller than the first. */
static int cw__picks(const cw__raw_cfg *raw, int n_raw, int lean, int *idx) {
    int n = 0;
    for (int i = 0; i < n_raw; i++) {
        int first = 1;
        for (int j = 0; j < i && first; j++) first = raw[j].engine != raw[i].engine;
        if (!first) continue; /* each engine once, at its best rank */
        int pick = i;
        if (lean) {
            for (int j = i + 1; j < n_raw; j++)
                if (raw[j].engine == raw[i].engine && raw[j].ws < raw[pick].ws) pick = j;
            if (pick == i) continue;
        }
        if (raw[pick].cfg) idx[n++] = pick;
    }
    return n;
}

/* Moves raw[pick] into e (the entry of raw is set to NULL). */
static void cw__take(cw__cudnn_entry *e, cw__raw_cfg *raw, int pick, int packed, int fused, int lean) {
    if (e->n >= CW__CUDNN_MAX_CFGS || !raw[pick].cfg) return;
    cw__cudnn_cfg *f = &e->cfgs[e->n++];
    memset(f, 0, sizeof *f);
    f->cfg = raw[pick].cfg;
    f->ws = raw[pick].ws;
    f->engine = raw[pick].engine;
    f->lean = lean;
    f->packed = packed;
    f->fused = fused;
    f->id = cw__cfg_id(f->engine, fused, lean, packed);
    raw[pick].cfg = NULL;
}

/* Takes the picks of two lists alternately, a's first (each list keeps its own order:
 * heuristics rank engines within one graph only). */
static void cw__interleave(cw__cudnn_entry *e, cw__raw_cfg *ra, int na, int fa, cw__raw_cfg *rb, int nb, int fb,
                           int lean) {
    int ia[CW__CUDNN_MAX_CFGS], ib[CW__CUDNN_MAX_CFGS];
    int ka = cw__picks(ra, na, lean, ia), kb = cw__picks(rb, nb, lean, ib);
    for (int i = 0; i < ka || i < kb; i++) {
        if (i < ka) cw__take(e, ra, ia[i], 0, fa, lean);
        if (i < kb) cw__take(e, rb, ib[i], 0, fb, lean);
    }
}

/* Heuristics (mode A, then FALLBACK's configs not already listed) for one graph. */
void cw__heuristics_both(cw__cudnn_conv *c, const cw__cudnn_graph *g, cw_dtype dt, cw__raw_cfg *raw, int *n,
                                cw_status *sa, cw_status *sf) {
    *sa = cw__heuristics(c, g, dt, CUDNN_HEUR_MODE_A, raw, n);
    *sf = cw__heuristics(c, g, dt, CUDNN_HEUR_MODE_FALLBACK, raw, n);
}

/* 1 when x's or y's strided span reaches CW__SPAN_LIMIT elements (p validated). */
int cw__needs_pack(const cw__conv_problem *p) {
    return cw__desc_span_bytes(&p->x) / (int64_t)cw_dtype_size(p->x.dtype) >= CW__SPAN_LIMIT ||
           cw__desc_span_bytes(&p->y) / (int64_t)cw_dtype_size(p->y.dtype) >= CW__SPAN_LIMIT;
}

/* e's packed layouts (x and y contiguous, 16-byte aligned) and their rounded bytes; the
 * packed graph's configs go to rawp. A patch too big to pack under 2^31 elements, or a
 * packed graph cuDNN cannot build or serve, keeps the direct configs only. */
void cw__entry_pack(cw__cudnn_conv *c, cw__cudnn_entry *e, const cw__conv_problem *p, const int64_t align[3],
                           cw__raw_cfg *rawp, int *n_rawp) {
    const cw_dtype dt = p->x.dtype;
    cw__conv_problem pp = *p;
    int64_t pal[3] = {16, align[1], 16};
    cw_status spa, spf;
    memset(pp.x.strides, 0, sizeof pp.x.strides);
    memset(pp.y.strides, 0, sizeof pp.y.strides);
    cw__desc_fill_strides(&pp.x);
    cw__desc_fill_strides(&pp.y);
    e->xp = pp.x;
    e->yp = pp.y;
    e->pack_bytes[0] = cw__round256(cw__desc_numel(&pp.x) * (int64_t)cw_dtype_size(dt));
    e->pack_bytes[1] = cw__round256(cw__desc_numel(&pp.y) * (int64_t)cw_dtype_size(dt));
    if (cw__desc_numel(&pp.x) < CW__SPAN_LIMIT && cw__desc_numel(&pp.y) < CW__SPAN_LIMIT &&
        cw__cudnn_graph_build(c->ctx, &pp, pal, c->handle, 0, &e->gp) == CW_OK)
        cw__heuristics_both(c, &e->gp, dt, rawp, n_rawp, &spa, &spf);
}

/* The bias-fused graph's configs into rawf: a graph cuDNN cannot build or serve just lists
 * nothing. */
void cw__entry_fused(cw__cudnn_conv *c, cw__cudnn_entry *e, const cw__conv_problem *p, const int64_t align[3],
                            cw__raw_cfg *rawf, int *n_rawf) {
    cw_status sba, sbf;
    if (cw__cudnn_graph_build(c->ctx, p, align, c->handle, 1, &e->gf) == CW_OK)
        cw__heuristics_both(c, &e->gf, p->x.dtype, rawf, n_rawf, &sba, &sbf);
    else
        cw__log(c->ctx, CW_LOG_DEBUG, "cudnn conv: no bias-fused graph: %s", cw_context_get_last_error(c->ctx));
}

/* Takes the picks of the packed (rawp), direct (raw) and bias-fused (rawf) lists into e.
 * Order: every engine at its best knobs (packed first: where packing is needed the direct
 * list holds only a generic engine; then bias-fused and unfused alternately, fused first
 * for f16/bf16, unfused first for f32), then the leaner knob choices in the same order. */
void cw__entry_order(cw__cudnn_entry *e, cw_dtype dt, cw__raw_cfg *rawp, int n_rawp, cw__raw_cfg *raw,
                            int n_raw, cw__raw_cfg *rawf, int n_rawf) {
    for (int lean = 0; lean < 2; lean++) {
        int ip[CW__CUDNN_MAX_CFGS], kp = cw__picks(rawp, n_rawp, lean, ip);
        for (int i = 0; i < kp; i++) cw__take(e, rawp, ip[i], 1, 0, lean);
        if (dt != CW_F32) cw__interleave(e, rawf, n_rawf, 1, raw, n_raw, 0, lean);
        else cw__interleave(e, raw, n_raw, 0, rawf, n_rawf, 1, lean);
    }
}

/* Destroys the configs of raw that were not taken. */
void cw__raw_free(cw__raw_cfg *raw, int n_raw) {
    for (int i = 0; i < n_raw; i++)
        if (raw[i].cfg) cudnnBackendDestroyDescriptor(raw[i].cfg);
}

