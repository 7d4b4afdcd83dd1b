/* Distribution: one rank's share of a finished single-process plan (cw_compile_options.comm).
 *
 * Every rank builds the same single-process plan, then walks its action list with the same
 * bookkeeping, so all ranks agree on everything below without talking:
 * - who runs each task: the rank whose band holds the middle of the rows it writes (a band
 *   of rank r: rows [r*H/n, (r+1)*H/n)); a task writing only temporaries (a prep, a
 *   recomputed band) goes with the task that reads them; a task writing every row (a
 *   one-patch conv, a one-chunk attention, a GroupNorm finalisation, a whole-tensor op)
 *   runs everywhere; an attention's query chunk goes with its rows and gathers the keys and
 *   values it lacks;
 * - which ranks hold the current contents of each row of each buffer (a bit mask per row
 *   range): before a task reads rows its ranks lack, the lowest rank that wrote them sends them
 *   (a message: one range of rows, tagged by its place in that global order);
 * - a write leaves its rows current on the writers only (a write of part of a row, such as
 *   a channel slice, first brings the rows to the writers: it keeps the rest).
 * This rank keeps its own tasks and its ends of the messages (send and receive tasks on a
 * stream of their own), orders each against every task touching the same rows, and holds
 * each activation's rows it touches only. The plan's events, frees and arena placement are
 * then made again (sync.c, arena.c). */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "scheduler/lower.h"

typedef struct cw__seg {
    int64_t a, b;
    uint32_t mask;   /* ranks holding rows [a, b) as they are now */
    uint32_t wrote;  /* the ranks that wrote them (they send them: not a rank that received them) */
} cw__seg;

typedef struct cw__segs {
    cw__seg *s;
    int n, cap;
} cw__segs;

/* One buffer access of a task, in rows of the buffer's tracked axis (distribute's rows). */
typedef struct cw__acc {
    int buf;
    int64_t a, b;
    int write;     /* 0 read, 1 write of whole rows, 2 write of part of each row */
} cw__acc;

#define CW__MAX_ACC 8

typedef struct cw__dist {
    cw_plan *p;
    int R, me;
    uint32_t all;
    int *ax;        /* per buffer: the axis its rows are counted along; -1 whole, -2 untracked */
    int64_t *rows;  /* per buffer: rows along ax (1 for whole buffers, parts for partials) */
    int64_t *slot;  /* per buffer: f32 elements per row of a GroupNorm partials buffer, else 0 */
    cw__segs *cs;
    uint32_t *own;  /* per old task: the ranks that run it (0: not decided yet) */
    cw__acc (*acc)[CW__MAX_ACC];
    int *nacc;
    cw__task *nt;   /* the rank's tasks, in host order */
    int n_nt, cap_nt;
    cw__action *na;
    int n_na, cap_na;
    int64_t tag;
} cw__dist;

static cw_status cw__dist_oom(cw__dist *D) {
    return cw__error(D->p->ctx, CW_ERR_OUT_OF_MEMORY, "compile: out of host memory (distributing the plan)");
}

/* cw__grow (emit.c), its failure named as the distribution's. */
static cw_status cw__grow_arr(cw__dist *D, void **arr, int *cap, int need, size_t elem) {
    return cw__grow(arr, cap, need, elem) == CW_OK ? CW_OK : cw__dist_oom(D);
}

static int cw__lowest(uint32_t m) {
    int r = 0;
    while (!(m & 1u)) m >>= 1, r++;
    return r;
}

/* ---- accesses ------------------------------------------------------------------------- */

static int cw__acc_view(const cw__dist *D, cw__acc *a, const cw__vref *v, int write) {
    if (v->buf < 0 || D->ax[v->buf] == -2) return 0;
    const cw__buf *b = &D->p->bufs[v->buf];
    int ax = D->ax[v->buf];
    a->buf = v->buf;
    a->a = ax >= 0 ? v->start[ax] : 0;
    a->b = ax >= 0 ? v->start[ax] + v->dims[ax] : 1;
    a->write = write;
    if (write && b->d.rank > 0) { /* part of each row: another dim not whole */
        for (int d = 0; d < v->rank; d++)
            if (d != ax && (v->start[d] != 0 || v->dims[d] != b->d.dims[d])) a->write = 2;
        if (v->rank != b->d.rank) a->write = 2;
    }
    return 1;
}

static int cw__acc_whole(const cw__dist *D, cw__acc *a, int buf, int write) {
    if (buf < 0 || D->ax[buf] == -2) return 0;
    a->buf = buf, a->a = 0, a->b = D->rows[buf], a->write = write;
    return 1;
}

static int cw__acc_rows(const cw__dist *D, cw__acc *a, int buf, int64_t r0, int64_t r1, int write) {
    if (buf < 0 || D->ax[buf] == -2) return 0;
    a->buf = buf, a->a = r0, a->b = r1, a->write = write;
    return 1;
}

/* An attention chunk's queries or output: the rows holding its tokens [t0, t1) where v is
 * a sample's whole [1, C, H, W] (tokens h*W + w); a chunk's row cut in two is written in
 * part (its other tokens are another chunk's). Else v as it is (a chunk's own buffer). */
static int cw__attn_rows(const cw__dist *D, const cw__task *t, const cw__vref *v) {
    return v->rank == 4 && D->ax[v->buf] == 2 && D->slot[v->buf] == 0 && D->p->bufs[v->buf].kind != CW__B_TEMP &&
           v->start[2] == 0 && v->dims[2] * v->dims[3] == t->u.attn.T;
}

static int cw__acc_attn(const cw__dist *D, cw__acc *a, const cw__task *t, const cw__vref *v, int write) {
    if (!cw__acc_view(D, a, v, write)) return 0;
    const int64_t W = v->dims[3], t0 = t->u.attn.t0, t1 = t->u.attn.t1;
    int band = v->rank == 4 && D->ax[v->buf] == 2 && v->start[2] == t0 / W && v->dims[2] == (t1 - 1) / W + 1 - t0 / W;
    if (!cw__attn_rows(D, t, v) && !band) return 1;
    a->a = t0 / W;
    a->b = (t1 - 1) / W + 1;
    if (write && (t0 % W || t1 % W)) a->write = 2;
    return 1;
}

/* This rank's copy of an attention chunk reads and writes only its rows of q and o (the
 * keys and values stay whole): views of those rows, so the rank holds no others. */
static void cw__attn_narrow(const cw__dist *D, cw__task *k) {
    cw__vref *vs[2] = {&k->u.attn.q, &k->u.attn.o};
    for (int i = 0; i < 2; i++) {
        if (!cw__attn_rows(D, k, vs[i])) continue;
        const int64_t W = vs[i]->dims[3];
        vs[i]->start[2] = k->u.attn.t0 / W;
        vs[i]->dims[2] = (k->u.attn.t1 - 1) / W + 1 - k->u.attn.t0 / W;
    }
}

/* Task t's accesses (constants apart) into out; returns how many. */
static int cw__task_acc(const cw__dist *D, const cw__task *t, cw__acc *out) {
    int n = 0;
    switch (t->kind) {
    case CW__T_CONV:
        n += cw__acc_view(D, &out[n], &t->u.conv.x, 0);
        n += cw__acc_view(D, &out[n], &t->u.conv.y, 1);
        n += cw__acc_whole(D, &out[n], t->u.conv.ws_buf, 1);
        break;
    case CW__T_PREP:
        n += cw__acc_view(D, &out[n], &t->u.prep.src, 0);
        n += cw__acc_whole(D, &out[n], t->u.prep.ss_buf, 0);
        n += cw__acc_view(D, &out[n], &t->u.prep.dst, 1);
        break;
    case CW__T_ADD:
        n += cw__acc_view(D, &out[n], &t->u.add.a, 0);
        n += cw__acc_view(D, &out[n], &t->u.add.b, 0);
        n += cw__acc_view(D, &out[n], &t->u.add.dst, 1);
        break;
    case CW__T_STATS:
        n += cw__acc_view(D, &out[n], &t->u.stats.x, 0);
        n += cw__acc_rows(D, &out[n], t->u.stats.part_buf, t->u.stats.part_index, t->u.stats.part_index + 1, 1);
        break;
    case CW__T_FINALIZE:
        n += cw__acc_whole(D, &out[n], t->u.fin.part_buf, 0);
        n += cw__acc_whole(D, &out[n], t->u.fin.ss_buf, 1);
        break;
    case CW__T_OP:
        for (int k = 0; k < cw_op_get_info(t->u.op.code).n_in; k++) n += cw__acc_view(D, &out[n], &t->u.op.in[k], 0);
        n += cw__acc_view(D, &out[n], &t->u.op.out, 1);
        break;
    case CW__T_ATTN:
        n += cw__acc_attn(D, &out[n], t, &t->u.attn.q, 0);
        n += cw__acc_view(D, &out[n], &t->u.attn.k, 0);
        n += cw__acc_view(D, &out[n], &t->u.attn.v, 0);
        n += cw__acc_attn(D, &out[n], t, &t->u.attn.o, 1);
        n += cw__acc_whole(D, &out[n], t->u.attn.s_buf, 1);
        break;
    case CW__T_SEND:
    case CW__T_RECV: {
        const cw__vref *v = &t->u.comm.v;
        int ax = D->ax[v->buf];
        int64_t sl = D->slot[v->buf];
        int64_t a = sl > 0 ? v->start[0] / sl : ax >= 0 ? v->start[ax] : 0;
        int64_t b = sl > 0 ? (v->start[0] + v->dims[0]) / sl : ax >= 0 ? v->start[ax] + v->dims[ax] : 1;
        n += cw__acc_rows(D, &out[n], v->buf, a, b, t->kind == CW__T_RECV);
        break;
    }
    }
    return n;
}

/* ---- who runs what -------------------------------------------------------------------- */

static uint32_t cw__band_owner(const cw__dist *D, int64_t a, int64_t b, int64_t rows) {
    int64_t r = (a + b) * D->R / (2 * rows);
    if (r >= D->R) r = D->R - 1;
    return 1u << r;
}

/* A tracked band of a tensor (input, output or activation), not one of the plan's temporaries. */
static int cw__is_tensor(const cw__dist *D, int buf) {
    cw__bkind k = D->p->bufs[buf].kind;
    return D->ax[buf] >= 0 && D->slot[buf] == 0 && (k == CW__B_ACT || k == CW__B_OUTPUT || k == CW__B_INPUT);
}

static void cw__assign(cw__dist *D) {
    const cw_plan *p = D->p;
    const int nt = p->n_tasks;
    /* 1: tasks writing tensor rows; the whole extent (or attention, finalisation): everyone */
    for (int t = 0; t < nt; t++) {
        const cw__task *k = &p->tasks[t];
        D->own[t] = 0;
        if (k->kind == CW__T_FINALIZE) {
            D->own[t] = D->all;
            continue;
        }
        for (int i = 0; i < D->nacc[t] && !D->own[t]; i++) {
            const cw__acc *a = &D->acc[t][i];
            if (!a->write || !cw__is_tensor(D, a->buf)) continue;
            D->own[t] = a->b - a->a >= D->rows[a->buf] ? D->all : cw__band_owner(D, a->a, a->b, D->rows[a->buf]);
        }
    }
    /* 2: a task writing only temporaries goes with the next task reading one of them (in
     * reverse, so that chains of temporaries follow their last link) */
    for (int t = nt - 1; t >= 0; t--) {
        if (D->own[t]) continue;
        for (int i = 0; i < D->nacc[t] && !D->own[t]; i++) {
            const cw__acc *a = &D->acc[t][i];
            if (!a->write) continue;
            for (int u = t + 1; u < nt && !D->own[t]; u++) {
                int reads = 0, writes = 0;
                for (int j = 0; j < D->nacc[u]; j++)
                    if (D->acc[u][j].buf == a->buf) reads |= !D->acc[u][j].write, writes |= D->acc[u][j].write != 0;
                /* statistics feed a finalisation everyone runs, yet are taken by their band's rank */
                if (reads && D->own[u] && (D->own[u] != D->all || p->tasks[t].kind != CW__T_STATS))
                    D->own[t] = D->own[u];
                if (reads || writes) break; /* the next user decides, or nobody */
            }
        }
    }
    /* 3: the rest (statistics of a band feeding a finalisation everyone runs): the band they
     * read, or the writer of the temporary they read; else everyone */
    for (int t = 0; t < nt; t++) {
        if (D->own[t]) continue;
        for (int i = 0; i < D->nacc[t] && !D->own[t]; i++) {
            const cw__acc *a = &D->acc[t][i];
            if (a->write) continue;
            if (cw__is_tensor(D, a->buf)) {
                if (a->b - a->a < D->rows[a->buf]) D->own[t] = cw__band_owner(D, a->a, a->b, D->rows[a->buf]);
                continue;
            }
            for (int u = t - 1; u >= 0 && !D->own[t]; u--)
                for (int j = 0; j < D->nacc[u]; j++)
                    if (D->acc[u][j].buf == a->buf && D->acc[u][j].write) {
                        D->own[t] = D->own[u];
                        break;
                    }
        }
        if (!D->own[t]) D->own[t] = D->all;
    }
}

/* ---- the rank's plan -------------------------------------------------------------------- */

static cw_status cw__push_action(cw__dist *D, cw__akind kind, int id, int stream) {
    CW_TRY(cw__grow_arr(D, (void **)&D->na, &D->cap_na, D->n_na + 1, sizeof *D->na));
    cw__action *a = &D->na[D->n_na++];
    a->kind = kind, a->id = id, a->stream = stream, a->event = -1;
    return CW_OK;
}

static cw_status cw__push_task(cw__dist *D, const cw__task *t, int *id) {
    CW_TRY(cw__grow_arr(D, (void **)&D->nt, &D->cap_nt, D->n_nt + 1, sizeof *D->nt));
    *id = D->n_nt;
    D->nt[D->n_nt++] = *t;
    return cw__push_action(D, CW__A_TASK, *id, t->stream);
}

/* The view of rows [a, b) of buffer buf, in whole-tensor coordinates. */
static cw__vref cw__rows_view(const cw__dist *D, int buf, int64_t a, int64_t b) {
    const cw__buf *bf = &D->p->bufs[buf];
    int ax = D->ax[buf];
    cw__vref v;
    memset(&v, 0, sizeof v);
    v.buf = buf;
    v.rank = bf->d.rank;
    for (int d = 0; d < bf->d.rank; d++) v.dims[d] = bf->d.dims[d];
    if (ax >= 0 && D->slot[buf] == 0) {
        v.start[ax] = a, v.dims[ax] = b - a;
    } else if (D->slot[buf] > 0) {
        v.start[0] = a * D->slot[buf], v.dims[0] = (b - a) * D->slot[buf];
    }
    return v;
}

/* One message: rows [a, b) of buf from rank src to rank dst; this rank's end of it. */
static cw_status cw__message(cw__dist *D, int buf, int64_t a, int64_t b, int src, int dst) {
    int64_t tag = D->tag++;
    if (D->me != src && D->me != dst) return CW_OK;
    cw__task t;
    memset(&t, 0, sizeof t);
    t.kind = D->me == src ? CW__T_SEND : CW__T_RECV;
    t.stage = CW_STAGE_OTHER;
    t.stream = D->p->n_streams; /* the comm stream, once the plan has it */
    t.event = -1;
    t.node = -1;
    t.u.comm.v = cw__rows_view(D, buf, a, b);
    t.u.comm.peer = D->me == src ? dst : src;
    t.u.comm.tag = tag;
    CW_TRY(cw__task_set_name(D->p, &t, "%s rows %" PRId64 "..%" PRId64 " of buffer %d %s rank %d",
             t.kind == CW__T_SEND ? "send" : "recv", a, b, buf, t.kind == CW__T_SEND ? "to" : "from", t.u.comm.peer));
    int id;
    return cw__push_task(D, &t, &id);
}

/* Splits buf's segments so that one starts at x. */
static cw_status cw__split(cw__dist *D, int buf, int64_t x) {
    cw__segs *c = &D->cs[buf];
    for (int i = 0; i < c->n; i++) {
        cw__seg s = c->s[i];
        if (s.a == x) return CW_OK;
        if (s.a < x && x < s.b) {
            CW_TRY(cw__grow_arr(D, (void **)&c->s, &c->cap, c->n + 1, sizeof *c->s));
            memmove(&c->s[i + 2], &c->s[i + 1], (size_t)(c->n - i - 1) * sizeof *c->s);
            c->s[i].b = x;
            c->s[i + 1] = (cw__seg){x, s.b, s.mask, s.wrote};
            c->n++;
            return CW_OK;
        }
    }
    return CW_OK;
}

static cw_status cw__reset(cw__dist *D, int buf) {
    cw__segs *c = &D->cs[buf];
    CW_TRY(cw__grow_arr(D, (void **)&c->s, &c->cap, 1, sizeof *c->s));
    c->s[0] = (cw__seg){0, D->rows[buf], D->all, D->all}; /* nothing written yet: anyone's garbage will do */
    c->n = 1;
    return CW_OK;
}

/* Splits buf's segments at a and b: rows [a, b) are then whole segments. */
static cw_status cw__span(cw__dist *D, int buf, int64_t a, int64_t b) {
    CW_TRY(cw__split(D, buf, a));
    return cw__split(D, buf, b);
}

/* Brings rows [a, b) of buf to rank r where it lacks them (runs of one source: one message). */
static cw_status cw__ensure(cw__dist *D, int buf, int64_t a, int64_t b, int r) {
    if (a >= b) return CW_OK;
    CW_TRY(cw__span(D, buf, a, b));
    cw__segs *c = &D->cs[buf];
    int64_t m0 = 0, m1 = 0;
    int msrc = -1;
    for (int i = 0; i < c->n; i++) {
        cw__seg *s = &c->s[i];
        if (s->b <= a || s->a >= b || (s->mask >> r & 1u)) continue;
        int src = cw__lowest(s->mask & s->wrote ? s->mask & s->wrote : s->mask);
        if (msrc == src && m1 == s->a) {
            m1 = s->b;
        } else {
            if (msrc >= 0) CW_TRY(cw__message(D, buf, m0, m1, msrc, r));
            msrc = src, m0 = s->a, m1 = s->b;
        }
        s->mask |= 1u << r;
    }
    if (msrc >= 0) CW_TRY(cw__message(D, buf, m0, m1, msrc, r));
    return CW_OK;
}

static cw_status cw__written(cw__dist *D, int buf, int64_t a, int64_t b, uint32_t who) {
    if (a >= b) return CW_OK;
    CW_TRY(cw__span(D, buf, a, b));
    cw__segs *c = &D->cs[buf];
    for (int i = 0; i < c->n; i++)
        if (c->s[i].a >= a && c->s[i].b <= b) c->s[i].mask = c->s[i].wrote = who;
    return CW_OK;
}

/* Old task t in host order: the rows its ranks lack come first, then this rank's copy. */
static cw_status cw__walk_task(cw__dist *D, int t, int *map) {
    const uint32_t S = D->own[t];
    for (int i = 0; i < D->nacc[t]; i++) {
        const cw__acc *a = &D->acc[t][i];
        if (a->write == 1) continue;
        for (int r = 0; r < D->R; r++)
            if (S >> r & 1u) CW_TRY(cw__ensure(D, a->buf, a->a, a->b, r));
    }
    for (int i = 0; i < D->nacc[t]; i++) {
        const cw__acc *a = &D->acc[t][i];
        if (a->write) CW_TRY(cw__written(D, a->buf, a->a, a->b, S));
    }
    map[t] = -1;
    if (S >> D->me & 1u) {
        cw__task k = D->p->tasks[t];
        k.waits = k.alloc_waits = NULL, k.n_waits = k.n_alloc_waits = 0;
        k.event = -1;
        k.deps = NULL, k.n_deps = 0; /* remade below */
        if (k.kind == CW__T_ATTN) cw__attn_narrow(D, &k);
        CW_TRY(cw__push_task(D, &k, &map[t]));
    }
    return CW_OK;
}

/* Orders every task after the earlier ones touching rows it touches where either writes:
 * what the single plan ordered between kept tasks, and what the messages add. */
static cw_status cw__remake_deps(cw__dist *D) {
    cw_plan *p = D->p;
    int nb = p->n_bufs;
    /* per buffer, the accesses since its allocation: (task, access) */
    int *cnt = cw__calloc((size_t)nb + 1, sizeof *cnt), *cap = cw__calloc((size_t)nb + 1, sizeof *cap);
    int(**use)[2] = cw__calloc((size_t)nb + 1, sizeof *use);
    cw__acc(*acc)[CW__MAX_ACC] = cw__malloc(((size_t)D->n_nt + 1) * sizeof *acc);
    int *nacc = cw__calloc((size_t)D->n_nt + 1, sizeof *nacc);
    cw_status st = CW_OK;
    if (!cnt || !cap || !use || !acc || !nacc) st = cw__dist_oom(D);
    for (int k = 0; k < D->n_nt && st == CW_OK; k++) nacc[k] = cw__task_acc(D, &D->nt[k], acc[k]);
    for (int x = 0; x < D->n_na && st == CW_OK; x++) {
        const cw__action *ac = &D->na[x];
        if (ac->kind == CW__A_ALLOC) cnt[ac->id] = 0;
        if (ac->kind != CW__A_TASK) continue;
        int k = ac->id;
        cw__task *t = &D->nt[k];
        for (int i = 0; i < nacc[k] && st == CW_OK; i++) {
            const cw__acc *a = &acc[k][i];
            for (int j = 0; j < cnt[a->buf] && st == CW_OK; j++) {
                int u = use[a->buf][j][0];
                const cw__acc *b = &acc[u][use[a->buf][j][1]];
                if (u == k || !(a->write || b->write) || !(a->a < b->b && b->a < a->b)) continue;
                int *nd = cw__realloc(t->deps, (size_t)(t->n_deps + 1) * sizeof *nd);
                if (!nd) st = cw__dist_oom(D);
                else t->deps = nd, t->deps[t->n_deps++] = u;
            }
            if (st == CW_OK && cnt[a->buf] == cap[a->buf]) {
                int nc = cap[a->buf] ? 2 * cap[a->buf] : 16;
                void *nu = cw__realloc(use[a->buf], (size_t)nc * sizeof **use);
                if (!nu) st = cw__dist_oom(D);
                else use[a->buf] = nu, cap[a->buf] = nc;
            }
            if (st == CW_OK) use[a->buf][cnt[a->buf]][0] = k, use[a->buf][cnt[a->buf]][1] = i, cnt[a->buf]++;
        }
    }
    for (int b = 0; use && b < nb; b++) cw__free(use[b]);
    cw__free(cnt), cw__free(cap), cw__free(use), cw__free(acc), cw__free(nacc);
    return st;
}

/* Each activation holds the rows this rank touches; one it never touches is not allocated.
 * Outputs' bands (cw_plan_get_band) from the rows' holders after the run. */
static cw_status cw__shrink(cw__dist *D, cw__action **acts, int *n_acts) {
    cw_plan *p = D->p;
    int nb = p->n_bufs;
    int64_t *lo = cw__malloc((size_t)nb * sizeof *lo + 1), *hi = cw__malloc((size_t)nb * sizeof *hi + 1);
    if (!lo || !hi) {
        cw__free(lo), cw__free(hi);
        return cw__dist_oom(D);
    }
    for (int b = 0; b < nb; b++) lo[b] = INT64_MAX, hi[b] = -1;
    cw__acc a[CW__MAX_ACC];
    for (int k = 0; k < D->n_nt; k++)
        for (int i = 0, n = cw__task_acc(D, &D->nt[k], a); i < n; i++) {
            int b = a[i].buf;
            if (a[i].a < lo[b]) lo[b] = a[i].a;
            if (a[i].b > hi[b]) hi[b] = a[i].b;
        }
    int w = 0;
    for (int x = 0; x < *n_acts; x++) {
        cw__action *ac = &(*acts)[x];
        if (ac->kind != CW__A_TASK && hi[ac->id] < 0) continue; /* never touched here */
        (*acts)[w++] = *ac;
    }
    *n_acts = w;
    for (int b = 0; b < nb; b++) {
        cw__buf *bf = &p->bufs[b];
        if (bf->kind != CW__B_ACT || D->ax[b] < 0 || hi[b] < 0 || (lo[b] == 0 && hi[b] == D->rows[b])) continue;
        bf->ax = D->ax[b];
        bf->row0 = lo[b];
        bf->d.dims[bf->ax] = hi[b] - lo[b];
        memset(bf->d.strides, 0, sizeof bf->d.strides);
        cw__desc_fill_strides(&bf->d);
        bf->bytes = cw__desc_bytes(&bf->d);
    }
    cw__free(lo), cw__free(hi);
    return CW_OK;
}

/* Output o's whole extent along the axis a distributed plan bands it (distribute's rows). */
static void cw__whole_band(const cw_plan *p, int o, int64_t band[3]) {
    const cw_tensor_desc *d = &p->out[o].d;
    int ax = p->opt.patch_axis == CW_PATCH_AXIS_D && d->rank == 5 ? 2 : d->rank >= 2 ? d->rank - 2 : 0;
    band[0] = ax, band[1] = 0, band[2] = d->rank ? d->dims[ax] : 0;
}

static cw_status cw__output_bands(cw__dist *D) {
    cw_plan *p = D->p;
    p->bands = cw__malloc((size_t)(3 * p->n_outputs + 1) * sizeof *p->bands);
    if (!p->bands) return cw__dist_oom(D);
    for (int o = 0; o < p->n_outputs; o++) cw__whole_band(p, o, &p->bands[3 * o]);
    if (p->opt.gather_rank == D->me) return CW_OK;
    for (int b = 0; b < p->n_bufs; b++) {
        const cw__buf *bf = &p->bufs[b];
        if (bf->kind != CW__B_OUTPUT || bf->ext < 0 || bf->ext >= p->n_outputs || D->ax[b] < 0) continue;
        int64_t *band = &p->bands[3 * bf->ext];
        band[0] = D->ax[b], band[1] = band[2] = 0;
        const cw__segs *c = &D->cs[b];
        for (int i = 0; i < c->n; i++) {
            if (cw__lowest(c->s[i].mask) != D->me) continue;
            if (band[1] == band[2]) band[1] = c->s[i].a;
            band[2] = c->s[i].b;
        }
    }
    return CW_OK;
}

cw_status cw_plan_get_band(const cw_plan *p, int output, int *axis, int64_t *r0, int64_t *r1) {
    if (!p || !axis || !r0 || !r1) return CW_ERR_INVALID_ARG;
    if (output < 0 || output >= p->n_outputs)
        return cw__error(p->ctx, CW_ERR_INVALID_ARG, "cw_plan_get_band: output %d, the plan has %d", output, p->n_outputs);
    int64_t whole[3];
    const int64_t *b = p->bands ? &p->bands[3 * output] : whole;
    if (!p->bands) cw__whole_band(p, output, whole);
    *axis = (int)b[0], *r0 = b[1], *r1 = b[2];
    return CW_OK;
}

/* Axis and rows of every buffer; GroupNorm partials buffers count their bands as rows. */
static cw_status cw__dist_buffers(cw__dist *D) {
    cw_plan *p = D->p;
    for (int b = 0; b < p->n_bufs; b++) {
        cw__buf *bf = &p->bufs[b];
        D->slot[b] = 0;
        if (bf->kind == CW__B_CONST) {
            D->ax[b] = -2, D->rows[b] = 0;
        } else if (bf->kind != CW__B_TEMP && bf->d.rank >= 2) {
            D->ax[b] = p->opt.patch_axis == CW_PATCH_AXIS_D && bf->d.rank == 5 ? 2 : bf->d.rank - 2;
            D->rows[b] = bf->d.dims[D->ax[b]];
        } else {
            D->ax[b] = -1, D->rows[b] = 1;
            if (bf->d.rank == 0 && bf->kind == CW__B_TEMP) { /* a message's view needs a desc */
                int64_t n = bf->bytes / 4;
                if (cw_tensor_desc_make(&bf->d, CW_F32, 1, &n) != CW_OK) bf->d.rank = 0;
            }
        }
    }
    for (int t = 0; t < p->n_tasks; t++) {
        const cw__task *k = &p->tasks[t];
        if (k->kind != CW__T_FINALIZE) continue;
        int b = k->u.fin.part_buf;
        int64_t slot = k->u.fin.n * k->u.fin.groups * 3 * 2; /* doubles, counted in f32 */
        if (slot * 4 * k->u.fin.n_parts > p->bufs[b].bytes)
            return cw__error(p->ctx, CW_ERR_INTERNAL, "compile: GroupNorm partials buffer %d smaller than its parts", b);
        D->ax[b] = 0, D->rows[b] = k->u.fin.n_parts, D->slot[b] = slot;
    }
    return CW_OK;
}

static void cw__dist_free(cw__dist *D) {
    for (int b = 0; D->cs && b < D->p->n_bufs; b++) cw__free(D->cs[b].s);
    cw__free(D->ax), cw__free(D->rows), cw__free(D->slot), cw__free(D->cs), cw__free(D->own);
    cw__free(D->acc), cw__free(D->nacc);
    for (int k = 0; D->nt && k < D->n_nt; k++) cw__free(D->nt[k].deps);
    cw__free(D->nt), cw__free(D->na);
}

/* The walk: every rank's same bookkeeping, this rank's tasks and messages; the gather. */
static cw_status cw__dist_walk(cw__dist *D, int *map) {
    cw_plan *p = D->p;
    for (int x = 0; x < p->n_acts; x++) {
        const cw__action *ac = &p->acts[x];
        if (ac->kind == CW__A_TASK) {
            CW_TRY(cw__walk_task(D, ac->id, map));
            continue;
        }
        if (ac->kind == CW__A_ALLOC) CW_TRY(cw__reset(D, ac->id));
        CW_TRY(cw__push_action(D, ac->kind, ac->id, ac->stream));
    }
    int g = p->opt.gather_rank;
    for (int b = 0; g >= 0 && b < p->n_bufs; b++)
        if (p->bufs[b].kind == CW__B_OUTPUT && D->ax[b] != -2) CW_TRY(cw__ensure(D, b, 0, D->rows[b], g));
    return CW_OK;
}

cw_status cw__plan_distribute(cw_plan *p) {
    const cw_comm *cm = p->opt.comm;
    if (!cm || cm->n_ranks < 2) return CW_OK;
    cw__dist D;
    memset(&D, 0, sizeof D);
    D.p = p, D.R = cm->n_ranks, D.me = cm->rank;
    D.all = D.R >= 32 ? 0xffffffffu : (1u << D.R) - 1u;
    const int nb = p->n_bufs, nt = p->n_tasks;
    D.ax = cw__malloc((size_t)nb * sizeof *D.ax + 1);
    D.rows = cw__malloc((size_t)nb * sizeof *D.rows + 1);
    D.slot = cw__malloc((size_t)nb * sizeof *D.slot + 1);
    D.cs = cw__calloc((size_t)nb + 1, sizeof *D.cs);
    D.own = cw__calloc((size_t)nt + 1, sizeof *D.own);
    D.acc = cw__malloc(((size_t)nt + 1) * sizeof *D.acc);
    D.nacc = cw__calloc((size_t)nt + 1, sizeof *D.nacc);
    int *map = cw__malloc(((size_t)nt + 1) * sizeof *map);
    cw_status st = CW_OK;
    if (!D.ax || !D.rows || !D.slot || !D.cs || !D.own || !D.acc || !D.nacc || !map) st = cw__dist_oom(&D);
    if (st == CW_OK) st = cw__dist_buffers(&D);
    for (int b = 0; b < nb && st == CW_OK; b++) st = D.ax[b] == -2 ? CW_OK : cw__reset(&D, b);
    for (int t = 0; t < nt && st == CW_OK; t++) D.nacc[t] = cw__task_acc(&D, &p->tasks[t], D.acc[t]);
    if (st == CW_OK) cw__assign(&D);
    if (st == CW_OK) st = cw__dist_walk(&D, map);
    /* the single plan's orderings between the tasks this rank keeps, then the rows' */
    for (int t = 0; t < nt && st == CW_OK; t++) {
        if (map[t] < 0) continue;
        cw__task *k = &D.nt[map[t]];
        for (int d = 0; d < p->tasks[t].n_deps && st == CW_OK; d++) {
            int u = map[p->tasks[t].deps[d]];
            if (u < 0) continue;
            int *nd = cw__realloc(k->deps, (size_t)(k->n_deps + 1) * sizeof *nd);
            if (!nd) st = cw__dist_oom(&D);
            else k->deps = nd, k->deps[k->n_deps++] = u;
        }
    }
    if (st == CW_OK) st = cw__remake_deps(&D);
    if (st == CW_OK) st = cw__shrink(&D, &D.na, &D.n_na);
    if (st == CW_OK) {
        st = cw__output_bands(&D);
    }
    if (st == CW_OK) {
        /* the rank's plan replaces the single one */
        for (int t = 0; t < nt; t++) {
            cw__task *k = &p->tasks[t];
            cw__free(k->deps), cw__free(k->waits), cw__free(k->alloc_waits);
        }
        for (int x = 0; x < p->n_acts; x++) cw__free(p->acts[x].joins), cw__free(p->acts[x].waits);
        int nc = 0; /* cw_plan_describe: the convs and patches this rank runs */
        for (int c = 0; c < p->n_convs; c++) {
            cw__conv_info *ci = &p->convs[c];
            int k = 0;
            for (int j = 0; j < ci->patches; j++)
                if (map[ci->tasks[j]] >= 0) ci->tasks[k++] = map[ci->tasks[j]];
            ci->patches = k;
            if (k) p->convs[nc++] = *ci;
            else cw__free(ci->tasks);
        }
        p->n_convs = nc;
        cw__free(p->tasks), cw__free(p->acts);
        p->tasks = D.nt, p->n_tasks = p->cap_tasks = D.n_nt;
        p->acts = D.na, p->n_acts = p->cap_acts = D.n_na;
        D.nt = NULL, D.na = NULL, D.n_nt = 0;
        p->comm_stream = p->n_streams++;
        p->n_events = 0;
        st = cw__plan_sync(p);
    }
    if (st == CW_OK) {
        p->fork_event = p->n_events;
        p->n_events += p->n_streams;
        st = cw__plan_place_activations(p);
    }
    cw__free(map);
    cw__dist_free(&D);
    return st;
}

/* ---- the configuration check ------------------------------------------------------------ */

static uint64_t cw__fnv(uint64_t h, const void *data, size_t n) {
    const unsigned char *c = data;
    for (size_t i = 0; i < n; i++) h = (h ^ c[i]) * 1099511628211ull;
    return h;
}
#define CW__FNV0 14695981039346656037ull
#define CW__HASH(h, v) ((h) = cw__fnv((h), &(v), sizeof(v)))

/* A constant's bytes (its span), from the device where they are not host memory. */
static cw_status cw__hash_const(cw_context *ctx, const cw_tensor *t, uint64_t *h) {
    int64_t n = cw__desc_span_bytes(&t->desc);
    if (ctx->be->rt->caps & CW__CAP_HOST_STREAMS) {
        *h = cw__fnv(*h, t->data, (size_t)n);
        return CW_OK;
    }
    enum { CHUNK = 1 << 20 };
    unsigned char *buf = cw__malloc(CHUNK);
    if (!buf) return cw__error(ctx, CW_ERR_OUT_OF_MEMORY, "compile: out of host memory");
    cw_status st = CW_OK;
    for (int64_t o = 0; o < n && st == CW_OK; o += CHUNK) {
        int64_t k = n - o < CHUNK ? n - o : CHUNK;
        st = ctx->be->rt->download(ctx->be, buf, (const char *)t->data + o, k);
        if (st == CW_OK) *h = cw__fnv(*h, buf, (size_t)k);
    }
    cw__free(buf);
    return st;
}

enum { CW__CFG_GRAPH, CW__CFG_SHAPES, CW__CFG_OPTIONS, CW__CFG_WEIGHTS, CW__CFG_N };
static const char *const cw__cfg_names[CW__CFG_N] = {
    "graph (ops and their parameters)", "shapes (inputs, outputs and every node's)",
    "options (budgets, streams, patches, memory, axis, gather rank, rank count)", "weights (checksum of the constants)"};

static cw_status cw__config_hashes(cw_graph *g, const cw_compile_options *o, uint64_t h[CW__CFG_N]) {
    cw_context *ctx = g->ctx;
    for (int k = 0; k < CW__CFG_N; k++) h[k] = CW__FNV0;
    for (int i = 0; i < g->n; i++) {
        const cw__node *nd = &g->nodes[i];
        CW__HASH(h[0], nd->kind), CW__HASH(h[0], nd->in), CW__HASH(h[0], nd->groups), CW__HASH(h[0], nd->eps);
        CW__HASH(h[0], nd->scale), CW__HASH(h[0], nd->block), CW__HASH(h[0], nd->mask), CW__HASH(h[0], nd->op);
        CW__HASH(h[0], nd->index), CW__HASH(h[0], nd->is_output);
        h[0] = cw__fnv(h[0], &nd->conv, sizeof nd->conv);
        h[0] = cw__fnv(h[0], &nd->param, sizeof nd->param);
        CW__HASH(h[1], nd->desc.rank), CW__HASH(h[1], nd->desc.dtype);
        h[1] = cw__fnv(h[1], nd->desc.dims, (size_t)nd->desc.rank * sizeof nd->desc.dims[0]);
        if (nd->kind == CW__N_CONST && nd->t) CW_TRY(cw__hash_const(ctx, nd->t, &h[3]));
    }
    int64_t budget = o->temp_budget ? o->temp_budget : ctx->cfg.temp_budget;
    int streams = o->streams ? o->streams : ctx->cfg.streams;
    CW__HASH(h[2], budget), CW__HASH(h[2], streams), CW__HASH(h[2], o->policy), CW__HASH(h[2], o->patches);
    CW__HASH(h[2], o->fuse), CW__HASH(h[2], o->max_patch_rows), CW__HASH(h[2], o->memory_budget);
    CW__HASH(h[2], o->patch_axis), CW__HASH(h[2], o->gather_rank), CW__HASH(h[2], o->comm->n_ranks);
    return CW_OK;
}

/* 64-bit values travel as 16-bit pieces in f32 (exact whatever the transport does to floats). */
enum { CW__CFG_FLOATS = 4 * CW__CFG_N + 2 };
static void cw__cfg_pack(const uint64_t h[CW__CFG_N], int a, int b, float *f) {
    for (int k = 0; k < CW__CFG_N; k++)
        for (int j = 0; j < 4; j++) f[4 * k + j] = (float)((h[k] >> (16 * j)) & 0xffff);
    f[4 * CW__CFG_N] = (float)a, f[4 * CW__CFG_N + 1] = (float)b;
}
static void cw__cfg_unpack(const float *f, uint64_t h[CW__CFG_N], int *a, int *b) {
    for (int k = 0; k < CW__CFG_N; k++) {
        h[k] = 0;
        for (int j = 0; j < 4; j++) h[k] |= (uint64_t)f[4 * k + j] << (16 * j);
    }
    *a = (int)f[4 * CW__CFG_N], *b = (int)f[4 * CW__CFG_N + 1];
}

/* Every rank sends its hashes to rank 0, which compares them with its own and answers each
 * rank with the first difference (field, rank); compile-time messages have negative tags. */
cw_status cw__comm_check_config(cw_graph *g, const cw_compile_options *opt) {
    const cw_comm *c = opt->comm;
    cw_context *ctx = g->ctx;
    if (c->n_ranks < 2) return CW_OK;
    uint64_t mine[CW__CFG_N], theirs[CW__CFG_N];
    CW_TRY(cw__config_hashes(g, opt, mine));
    float f[CW__CFG_FLOATS];
    int64_t nf = CW__CFG_FLOATS;
    cw_tensor_desc d;
    CW_TRY(cw_tensor_desc_make(&d, CW_F32, 1, &nf));
    int field = -1, who = -1, a, b;
    (void)a, (void)b;
    cw_status st = CW_OK;
    if (c->rank == 0) {
        uint64_t first[CW__CFG_N];
        for (int r = 1; r < c->n_ranks; r++) {
            if ((st = c->recv(c->user, &d, f, r, -1 - r, NULL)) != CW_OK)
                return cw__error(ctx, CW_ERR_COMM, "cw_graph_compile: rank 0 could not receive rank %d's configuration "
                                 "(%s)", r, cw_status_name(st));
            cw__cfg_unpack(f, theirs, &a, &b);
            for (int k = 0; k < CW__CFG_N && field < 0; k++)
                if (theirs[k] != mine[k]) field = k, who = r, memcpy(first, theirs, sizeof first);
        }
        for (int r = 1; r < c->n_ranks; r++) {
            cw__cfg_pack(field >= 0 ? first : mine, field, who, f);
            if ((st = c->send(c->user, &d, f, r, -1 - c->n_ranks - r, NULL)) != CW_OK)
                return cw__error(ctx, CW_ERR_COMM, "cw_graph_compile: rank 0 could not answer rank %d (%s)", r,
                                 cw_status_name(st));
        }
    } else {
        cw__cfg_pack(mine, 0, c->rank, f);
        if ((st = c->send(c->user, &d, f, 0, -1 - c->rank, NULL)) != CW_OK)
            return cw__error(ctx, CW_ERR_COMM, "cw_graph_compile: rank %d could not send its configuration to rank 0 (%s)",
                             c->rank, cw_status_name(st));
        if ((st = c->recv(c->user, &d, f, 0, -1 - c->n_ranks - c->rank, NULL)) != CW_OK)
            return cw__error(ctx, CW_ERR_COMM, "cw_graph_compile: rank %d got no answer from rank 0 (%s)", c->rank,
                             cw_status_name(st));
        cw__cfg_unpack(f, theirs, &field, &who);
    }
    if (field < 0 || field >= CW__CFG_N) return CW_OK;
    return cw__error(ctx, CW_ERR_INVALID_ARG,
                     "cw_graph_compile: the ranks compile different plans: rank %d's %s differ from rank 0's (seen on "
                     "rank %d of %d)",
                     who, cw__cfg_names[field], c->rank, c->n_ranks);
}
