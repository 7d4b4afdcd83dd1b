/* One plan split across ranks (cw_compile_options.comm, scheduler/distribute.c), ranks as
 * threads of this process, each with its own cpu context (chaos and poison on: a missing
 * order between a message and a task corrupts the result):
 * 1. the tiny SD-config decoder on 1, 2, 3 and 4 ranks gives the same bits as the
 *    single-process plan with the same patches, gathered on rank 0 and as bands
 *    (cw_plan_get_band); every rank's plan passes the happens-before checker with its
 *    messages on it, and holds fewer activation bytes than the single plan; so does a
 *    video-style 5-D block (conv3d, GroupNorm over frames, residual) banded along time (D)
 *    and along rows (H);
 * 2. a dropped order (a task's wait on a receive removed) is caught by the checker;
 * 3. ranks compiling different shapes, options or weights fail on every rank, naming it;
 * 4. a rank whose messages fail makes every rank's run fail within the timeout, no hang.
 * The communicator here is a test double (a mailbox between threads); the real ones sit on
 * torch.distributed (python/tests/test_dist.py) and MPI (cw-vae --ranks). */
#include <errno.h>
#include <pthread.h>
#include <time.h>

#include "convweave/convweave.h"
#include "graph_run.h"
#include "hb_check.h"
#include "scheduler/sched.h"
#include "testutil.h"
#include "vae.h"
#include "view_walk.h"

/* ---- the mailbox ---------------------------------------------------------------------------- */

typedef struct msg {
    int src, dst;
    int64_t tag;
    size_t n;
    unsigned char *data;
    struct msg *next;
} msg;

typedef struct hub {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    msg *head;
    int64_t sent_bytes[8];
} hub;

typedef struct rank_comm {
    hub *h;
    int rank;
    int fail_after;  /* fail every call after this many (-1: never) */
    int calls;
    double timeout_s;
} rank_comm;

/* Copies the strided view d/data to or from the contiguous bytes at c. */
static void copy_view(const cw_tensor_desc *d, unsigned char *data, unsigned char *c, int pack) {
    size_t es = cw_dtype_size(d->dtype);
    int64_t *off = malloc(((size_t)cw_tensor_desc_numel(d) + 1) * sizeof *off);
    for (int64_t k = 0, n = view_offsets(d, off); k < n; k++) {
        if (pack) memcpy(c + (size_t)k * es, data + (size_t)off[k] * es, es);
        else memcpy(data + (size_t)off[k] * es, c + (size_t)k * es, es);
    }
    free(off);
}

static size_t view_bytes(const cw_tensor_desc *d) {
    size_t n = cw_dtype_size(d->dtype);
    for (int i = 0; i < d->rank; i++) n *= (size_t)d->dims[i];
    return n;
}

static int rc_fails(rank_comm *c) { return c->fail_after >= 0 && c->calls++ >= c->fail_after; }

static cw_status mb_send(void *user, const cw_tensor_desc *d, const void *data, int peer, int64_t tag, void *stream) {
    rank_comm *c = user;
    if (stream || rc_fails(c)) return CW_ERR_COMM;
    msg *m = calloc(1, sizeof *m);
    m->src = c->rank, m->dst = peer, m->tag = tag, m->n = view_bytes(d);
    m->data = malloc(m->n + 1);
    copy_view(d, (unsigned char *)data, m->data, 1);
    pthread_mutex_lock(&c->h->mu);
    m->next = c->h->head;
    c->h->head = m;
    c->h->sent_bytes[c->rank] += (int64_t)m->n;
    pthread_cond_broadcast(&c->h->cv);
    pthread_mutex_unlock(&c->h->mu);
    return CW_OK;
}

static cw_status mb_recv(void *user, const cw_tensor_desc *d, void *data, int peer, int64_t tag, void *stream) {
    rank_comm *c = user;
    if (stream || rc_fails(c)) return CW_ERR_COMM;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += (time_t)c->timeout_s;
    pthread_mutex_lock(&c->h->mu);
    for (;;) {
        for (msg **pp = &c->h->head; *pp; pp = &(*pp)->next) {
            msg *m = *pp;
            if (m->src != peer || m->dst != c->rank || m->tag != tag) continue;
            *pp = m->next;
            pthread_mutex_unlock(&c->h->mu);
            cw_status st = m->n == view_bytes(d) ? CW_OK : CW_ERR_COMM;
            if (st == CW_OK) copy_view(d, data, m->data, 0);
            free(m->data), free(m);
            return st;
        }
        if (pthread_cond_timedwait(&c->h->cv, &c->h->mu, &until) == ETIMEDOUT) {
            pthread_mutex_unlock(&c->h->mu);
            return CW_ERR_COMM;
        }
    }
}

static void hub_clear(hub *h) {
    while (h->head) {
        msg *m = h->head;
        h->head = m->next;
        free(m->data), free(m);
    }
    memset(h->sent_bytes, 0, sizeof h->sent_bytes);
}

/* ---- one rank ------------------------------------------------------------------------------ */

typedef struct rank_job {
    int rank, n_ranks, gather_rank, patches;
    int64_t lat;        /* latent rows and columns */
    uint64_t seed;      /* weights */
    int64_t budget;     /* temp budget (-1 unlimited, -2 the least that compiles) */
    int fail_after;
    int video;          /* 0: the tiny decoder; else the 5-D block, patch axis video (1 H, 2 D) */
    hub *h;
    const float *in;
    /* results */
    cw_status compile_st, run_st;
    char msg[512];
    float *out;
    int64_t out_n;
    int axis;
    int64_t r0, r1;
    int hazards;
    int64_t act_bytes;
    int attn_tasks;     /* attention chunks this rank runs */
    double run_s;
    int dropped;        /* after the run: hazards with one receive's wait removed (-1: none tried) */
} rank_job;

static cw_context *make_ctx(uint64_t seed) {
    cw_context_config cfg = CW_CONTEXT_CONFIG_INIT;
    cfg.backend = CW_BACKEND_CPU;
    cfg.threads = 1;
    cfg.flags = CW_FLAG_CHAOS | CW_FLAG_POISON;
    cfg.chaos_seed = seed;
    cw_context *ctx;
    ASSERT_OK(cw_context_create(&ctx, &cfg));
    return ctx;
}

/* 2. The checker sees the messages: with a task's wait on a receive removed, it reports
 * the hazard (the last run's addresses). Returns the hazards found, -1 when no task waits
 * on a receive across streams. */
static int drop_a_wait(cw_plan *p) {
    int tried = -1;
    for (int k = 0; k < p->n_tasks; k++) {
        cw__task *t = &p->tasks[k];
        if (t->kind != CW__T_CONV && t->kind != CW__T_PREP) continue;
        for (int i = 0; i < t->n_waits; i++) {
            if (p->tasks[t->waits[i]].kind != CW__T_RECV) continue;
            int keep = t->waits[i];
            t->waits[i] = t->waits[--t->n_waits];
            int bad = hb_check(p);
            t->waits[t->n_waits++] = keep;
            if (bad > 0) return bad; /* else another path orders them still: try the next */
            tried = 0;
        }
    }
    return tried;
}

/* The 5-D block: x [1, 8, 9, 12, 12] -> a = conv3d(x) (16 ch), y = conv3d(silu(gn(a))) + a;
 * weights from seed. Runs it as one rank of j (or alone) and keeps the output in j. */
static void run_block5(rank_job *j, cw_context *ctx, const cw_compile_options *o) {
    cw_rng r = {j->seed};
    const int64_t xd[5] = {1, 8, 9, 12, 12}, w1d[5] = {16, 8, 3, 3, 3}, w2d[5] = {16, 16, 3, 3, 3}, bd = 16;
    cw_node x, a, y, w1, w2, b1, b2;
    cw_graph *g = graph_open(ctx, CW_F32, 5, xd, &x);
    cw_tensor *tw1, *tw2, *tb1, *tb2;
    free(rnd_stored(ctx, &r, CW_F32, 5, w1d, 0.2f, 0.0f, &tw1));
    free(rnd_stored(ctx, &r, CW_F32, 5, w2d, 0.1f, 0.0f, &tw2));
    free(rnd_stored(ctx, &r, CW_F32, 1, &bd, 0.1f, 0.0f, &tb1));
    free(rnd_stored(ctx, &r, CW_F32, 1, &bd, 0.1f, 0.0f, &tb2));
    w1 = constant(ctx, g, tw1), w2 = constant(ctx, g, tw2), b1 = constant(ctx, g, tb1), b2 = constant(ctx, g, tb2);
    cw_conv_params cp = CW_CONV_PARAMS_INIT;
    cp.spatial = 3;
    for (int d = 0; d < 3; d++) cp.pad_pre[d] = cp.pad_post[d] = 1;
    ASSERT_OK_CTX(ctx, cw_graph_conv(g, &a, x, w1, b1, &cp));
    gn_silu t;
    gn_silu_open(&t, ctx, &r, 16, 4);
    ASSERT_OK_CTX(ctx, cw_graph_conv(g, &y, gn_silu_node(&t, ctx, g, a), w2, b2, &cp));
    ASSERT_OK_CTX(ctx, cw_graph_add(g, &y, y, a));
    ASSERT_OK_CTX(ctx, cw_graph_output(g, y, "y"));
    cw_plan *p = NULL;
    j->compile_st = cw_graph_compile(g, &p, o);
    if (j->compile_st != CW_OK) {
        snprintf(j->msg, sizeof j->msg, "%s", cw_context_get_last_error(ctx));
    } else {
        cw_tensor_desc od;
        ASSERT_OK_CTX(ctx, cw_graph_get_node_desc(g, &od, y));
        j->out_n = cw_tensor_desc_numel(&od);
        j->out = malloc((size_t)j->out_n * sizeof *j->out);
        for (int64_t k = 0; k < j->out_n; k++) j->out[k] = -7.0f;
        cw_tensor *ti = upload(ctx, CW_F32, 5, xd, j->in), *to;
        ASSERT_OK_CTX(ctx, cw_tensor_wrap(&to, ctx, &od, j->out));
        j->run_st = cw_plan_run(p, &ti, 1, &to, 1);
        if (j->run_st != CW_OK) snprintf(j->msg, sizeof j->msg, "%s", cw_context_get_last_error(ctx));
        ASSERT_OK(cw_plan_get_band(p, 0, &j->axis, &j->r0, &j->r1));
        if (j->run_st == CW_OK) j->hazards = hb_check(p);
        j->dropped = j->run_st == CW_OK && j->n_ranks > 1 ? drop_a_wait(p) : -1;
        cw_plan_stats st;
        ASSERT_OK(cw_plan_get_stats(p, &st));
        j->act_bytes = st.activations_peak;
        cw_tensor_destroy(ti), cw_tensor_destroy(to);
    }
    cw_plan_destroy(p);
    cw_graph_destroy(g);
    gn_silu_close(&t);
    cw_tensor_destroy(tw1), cw_tensor_destroy(tw2), cw_tensor_destroy(tb1), cw_tensor_destroy(tb2);
}

static void *rank_main(void *arg) {
    rank_job *j = arg;
    char err[VAE_ERR_LEN];
    cw_context *ctx = make_ctx(7 + (uint64_t)j->rank);
    rank_comm rc = {j->h, j->rank, j->fail_after, 0, 3.0};
    cw_comm comm = {sizeof comm, CW_COMM_VERSION, j->rank, j->n_ranks, &rc, mb_send, mb_recv};
    cw_compile_options o = CW_COMPILE_OPTIONS_INIT;
    o.policy = CW_PATCHES_FIXED;
    o.patches = j->patches, o.streams = 3, o.temp_budget = j->budget, o.gather_rank = j->gather_rank;
    o.comm = j->n_ranks > 0 ? &comm : NULL;
    if (j->video) {
        o.patch_axis = j->video == 2 ? CW_PATCH_AXIS_D : CW_PATCH_AXIS_H;
        o.policy = j->video == 2 ? CW_PATCHES_AUTO : CW_PATCHES_FIXED; /* FIXED counts H bands */
        o.max_patch_rows = j->video == 2 ? 2 : 0;                       /* D: bands of 2 frames */
        run_block5(j, ctx, &o);
        cw_context_destroy(ctx);
        return NULL;
    }
    vae_config cfg;
    ASSERT_EQ_I(vae_preset(&cfg, "tiny", err, sizeof err), 0);
    vae_weights *w;
    ASSERT_EQ_I(vae_weights_random(&w, j->seed, err, sizeof err), 0);
    vae_model *m;
    ASSERT_OK(vae_build(&m, ctx, &cfg, w, VAE_DECODER, 1, j->lat, j->lat, CW_F32, 0, err, sizeof err));
    if (j->budget == -2) { /* the smallest temp budget that compiles (the same on every rank) */
        o.temp_budget = -1;
        ASSERT_OK_CTX(ctx, cw_graph_min_budget(m->graph, &o.temp_budget, &o));
    }
    cw_plan *p = NULL;
    j->compile_st = cw_graph_compile(m->graph, &p, &o);
    if (j->compile_st != CW_OK) {
        snprintf(j->msg, sizeof j->msg, "%s", cw_context_get_last_error(ctx));
    } else {
        j->out_n = cw_tensor_desc_numel(&m->out_desc);
        j->out = malloc((size_t)j->out_n * sizeof *j->out);
        for (int64_t k = 0; k < j->out_n; k++) j->out[k] = -7.0f; /* rows nobody wrote stay so */
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        j->run_st = vae_run(m, p, j->in, j->out, err, sizeof err);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        j->run_s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        if (j->run_st != CW_OK) snprintf(j->msg, sizeof j->msg, "%s", err);
        ASSERT_OK(cw_plan_get_band(p, 0, &j->axis, &j->r0, &j->r1));
        if (j->run_st == CW_OK) j->hazards = hb_check(p);
        j->dropped = j->run_st == CW_OK && j->n_ranks > 1 ? drop_a_wait(p) : -1;
        cw_plan_stats s;
        ASSERT_OK(cw_plan_get_stats(p, &s));
        j->act_bytes = s.activations_peak;
        j->attn_tasks = 0;
        for (int k = 0; k < p->n_tasks; k++) j->attn_tasks += p->tasks[k].kind == CW__T_ATTN;
    }
    cw_plan_destroy(p);
    vae_model_destroy(m);
    vae_weights_close(w);
    cw_context_destroy(ctx);
    return NULL;
}

/* Runs n ranks (n == 0: one process, no communicator) with jobs made from proto. */
static void run_ranks(hub *h, int n, const rank_job *proto, rank_job *jobs) {
    hub_clear(h);
    pthread_t th[8];
    int k = n > 0 ? n : 1;
    for (int r = 0; r < k; r++) {
        jobs[r] = *proto;
        jobs[r].rank = r, jobs[r].n_ranks = n, jobs[r].h = h;
        pthread_create(&th[r], NULL, rank_main, &jobs[r]);
    }
    for (int r = 0; r < k; r++) pthread_join(th[r], NULL);
}

static void free_jobs(rank_job *jobs, int n) {
    for (int r = 0; r < n; r++) free(jobs[r].out), jobs[r].out = NULL;
}

/* ---- 1. same bits on any number of ranks ---------------------------------------------------- */

static void test_same_bits(hub *h, const float *in, int64_t lat, int64_t budget) {
    rank_job proto = {0};
    proto.gather_rank = 0, proto.patches = 4, proto.lat = lat, proto.seed = 1, proto.budget = budget;
    proto.fail_after = -1, proto.in = in;
    rank_job ref[1], jobs[8];
    run_ranks(h, 0, &proto, ref);
    ASSERT_OK(ref[0].compile_st);
    ASSERT_OK(ref[0].run_st);
    fprintf(stderr, "tiny decoder %lldx%lld latent, 4 patches, temp budget %lld: single process %.2f s, activations "
            "%.1f KiB, %d attention chunk(s)\n", (long long)lat, (long long)lat, (long long)budget, ref[0].run_s,
            (double)ref[0].act_bytes / 1024.0, ref[0].attn_tasks);
    for (int n = 1; n <= 4; n++) {
        for (int gather = 0; gather >= -1; gather--) {
            proto.gather_rank = gather;
            run_ranks(h, n, &proto, jobs);
            int64_t covered = 0, sent = 0;
            int caught = 0; /* ranks where removing a wait on a receive made a hazard */
            for (int r = 0; r < n; r++) {
                if (jobs[r].compile_st != CW_OK || jobs[r].run_st != CW_OK)
                    fprintf(stderr, "rank %d/%d: %s\n", r, n, jobs[r].msg);
                ASSERT_OK(jobs[r].compile_st);
                ASSERT_OK(jobs[r].run_st);
                if (jobs[r].hazards) fprintf(stderr, "rank %d/%d: %d hazard(s)\n", r, n, jobs[r].hazards);
                CHECK(jobs[r].hazards == 0);
                caught += jobs[r].dropped > 0;
                sent += h->sent_bytes[r];
                if (gather == 0) continue;
                /* bands: this rank's rows of the [1, 3, H, W] image */
                ASSERT_EQ_I(jobs[r].axis, 2);
                int64_t H = 8 * lat, W = 8 * lat;
                for (int c = 0; c < 3; c++)
                    for (int64_t y = jobs[r].r0; y < jobs[r].r1; y++)
                        CHECK(!memcmp(&jobs[r].out[(c * H + y) * W], &ref[0].out[(c * H + y) * W], (size_t)W * 4));
                covered += jobs[r].r1 - jobs[r].r0;
                if (r > 0) CHECK(jobs[r].r0 == jobs[r - 1].r1);
            }
            if (n > 1) CHECK(caught > 0);
            if (gather == 0) {
                CHECK(!memcmp(jobs[0].out, ref[0].out, (size_t)ref[0].out_n * 4));
            } else {
                CHECK(covered == 8 * lat);
            }
            fprintf(stderr, "  %d rank(s), %s: same bits; per-rank activations", n, gather == 0 ? "gathered on 0" : "bands");
            for (int r = 0; r < n; r++) fprintf(stderr, " %.1f", (double)jobs[r].act_bytes / 1024.0);
            fprintf(stderr, " KiB; attention chunks per rank");
            for (int r = 0; r < n; r++) fprintf(stderr, " %d", jobs[r].attn_tasks);
            fprintf(stderr, "; %.1f KiB exchanged\n", (double)sent / 1024.0);
            if (n > 1)
                for (int r = 0; r < n; r++) CHECK(jobs[r].act_bytes < ref[0].act_bytes);
            free_jobs(jobs, n);
        }
    }
    free_jobs(ref, 1);
}

/* The 5-D block banded along time (video 2) and rows (video 1) on 1-3 ranks. */
static void test_video(hub *h, const float *in) {
    const int64_t od[5] = {1, 16, 9, 12, 12};
    for (int video = 2; video >= 1; video--) {
        rank_job proto = {0};
        proto.patches = 4, proto.seed = 5, proto.budget = -1, proto.fail_after = -1, proto.in = in;
        proto.video = video;
        rank_job ref[1], jobs[8];
        run_ranks(h, 0, &proto, ref);
        ASSERT_OK(ref[0].compile_st);
        ASSERT_OK(ref[0].run_st);
        for (int n = 1; n <= 3; n++)
            for (int gather = 0; gather >= -1; gather--) {
                proto.gather_rank = gather;
                run_ranks(h, n, &proto, jobs);
                int64_t covered = 0;
                for (int r = 0; r < n; r++) {
                    if (jobs[r].compile_st != CW_OK || jobs[r].run_st != CW_OK)
                        fprintf(stderr, "5-D rank %d/%d: %s\n", r, n, jobs[r].msg);
                    ASSERT_OK(jobs[r].compile_st);
                    ASSERT_OK(jobs[r].run_st);
                    CHECK(jobs[r].hazards == 0);
                    if (gather == 0) continue;
                    ASSERT_EQ_I(jobs[r].axis, video == 2 ? 2 : 3);
                    int64_t inner = 1;
                    for (int d = jobs[r].axis + 1; d < 5; d++) inner *= od[d];
                    int bad = 0;
                    for (int64_t k = 0; k < ref[0].out_n; k++) {
                        int64_t i = k / inner % od[jobs[r].axis];
                        if (i >= jobs[r].r0 && i < jobs[r].r1) bad += memcmp(&jobs[r].out[k], &ref[0].out[k], 4) != 0;
                    }
                    CHECK(bad == 0);
                    covered += jobs[r].r1 - jobs[r].r0;
                }
                if (gather == 0) CHECK(!memcmp(jobs[0].out, ref[0].out, (size_t)ref[0].out_n * 4));
                else CHECK(covered == od[video == 2 ? 2 : 3]);
                if (gather == 0) {
                    fprintf(stderr, "  5-D block, bands along %s, %d rank(s): same bits; activations", video == 2 ? "D" : "H", n);
                    for (int r = 0; r < n; r++) fprintf(stderr, " %.1f", (double)jobs[r].act_bytes / 1024.0);
                    fprintf(stderr, " KiB (one process %.1f)\n", (double)ref[0].act_bytes / 1024.0);
                }
                free_jobs(jobs, n);
            }
        free_jobs(ref, 1);
    }
}

/* ---- 3. different configurations ------------------------------------------------------------ */

static void test_mismatch(hub *h, const float *in, int64_t lat) {
    rank_job proto = {0};
    proto.patches = 4, proto.lat = lat, proto.seed = 1, proto.budget = -1, proto.fail_after = -1, proto.in = in;
    const char *what[3] = {"shapes", "options", "weights"};
    for (int k = 0; k < 3; k++) {
        hub_clear(h);
        rank_job jobs[3];
        pthread_t th[3];
        for (int r = 0; r < 3; r++) {
            jobs[r] = proto;
            jobs[r].rank = r, jobs[r].n_ranks = 3, jobs[r].h = h;
            if (r == 2 && k == 0) jobs[r].lat = lat + 2;
            if (r == 2 && k == 1) jobs[r].budget = 64 << 20;
            if (r == 2 && k == 2) jobs[r].seed = 2;
            pthread_create(&th[r], NULL, rank_main, &jobs[r]);
        }
        for (int r = 0; r < 3; r++) pthread_join(th[r], NULL);
        for (int r = 0; r < 3; r++) {
            CHECK(jobs[r].compile_st == CW_ERR_INVALID_ARG);
            CHECK(strstr(jobs[r].msg, what[k]) != NULL);
            CHECK(strstr(jobs[r].msg, "rank 2") != NULL);
        }
        fprintf(stderr, "  rank 2 with other %s: every rank refuses: %s\n", what[k], jobs[0].msg);
        free_jobs(jobs, 3);
    }
}

/* ---- 4. a failing rank ---------------------------------------------------------------------- */

static void test_fault(hub *h, const float *in, int64_t lat) {
    rank_job proto = {0};
    proto.patches = 4, proto.lat = lat, proto.seed = 1, proto.budget = -1, proto.fail_after = -1, proto.in = in;
    hub_clear(h);
    rank_job jobs[3];
    pthread_t th[3];
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int r = 0; r < 3; r++) {
        jobs[r] = proto;
        jobs[r].rank = r, jobs[r].n_ranks = 3, jobs[r].h = h;
        if (r == 1) jobs[r].fail_after = 6; /* the compile check's 2 calls, then 4 messages of the run */
        pthread_create(&th[r], NULL, rank_main, &jobs[r]);
    }
    for (int r = 0; r < 3; r++) pthread_join(th[r], NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    for (int r = 0; r < 3; r++) {
        ASSERT_OK(jobs[r].compile_st);
        CHECK(jobs[r].run_st == CW_ERR_COMM);
        CHECK(strstr(jobs[r].msg, "failed") != NULL);
        fprintf(stderr, "  rank %d: %s\n", r, jobs[r].msg);
    }
    CHECK(s < 60.0);
    fprintf(stderr, "  rank 1 failing mid-run: every rank returned CW_ERR_COMM after %.1f s\n", s);
    free_jobs(jobs, 3);
}

int main(void) {
    const int64_t lat = 8;
    cw_rng r = {42};
    float *in = malloc((size_t)(4 * lat * lat) * sizeof *in);
    for (int64_t k = 0; k < 4 * lat * lat; k++) in[k] = 2.0f * cw_rng_float(&r);
    float *in32 = malloc(4 * 32 * 32 * sizeof *in32);
    for (int64_t k = 0; k < 4 * 32 * 32; k++) in32[k] = 2.0f * cw_rng_float(&r);
    hub h = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, {0}};
    hb_quiet = 1; /* the dropped waits' hazards are expected (and counted); set before the threads */
    test_same_bits(&h, in, lat, -1); /* one attention chunk: every rank runs it */
    if (!cw_test_quick()) test_same_bits(&h, in32, 32, -2); /* the least budget: query chunks, each rank its rows' */
    float *in5 = malloc(8 * 9 * 12 * 12 * sizeof *in5);
    for (int64_t k = 0; k < 8 * 9 * 12 * 12; k++) in5[k] = 2.0f * cw_rng_float(&r);
    test_video(&h, in5);
    free(in5);
    test_mismatch(&h, in, lat);
    test_fault(&h, in, lat);
    hub_clear(&h);
    free(in), free(in32);
    return cw_test_failures ? 1 : 0;
}
