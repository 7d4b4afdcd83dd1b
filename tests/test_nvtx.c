/* NVTX ranges, checked through the recorder injection (tools/nvtx_recorder.c): a small
 * decoder-like graph run with CW_FLAG_NVTX must emit one "convweave" range per task on the
 * worker thread of its stream, named and categorised like the Chrome trace's events, plus
 * one "cw_plan_run" range; a plan run without the flag must emit none. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convweave/convweave.h"
#include "prof/nvtx.h"
#include "testutil.h"

#ifndef CW_NVTX_RECORDER
int main(void) {
    fprintf(stderr, "skip: the NVTX recorder was not built (no nvtx3 headers)\n");
    return CW_TEST_SKIP;
}
#else

#define MAX_RANGES 4096
#define MAX_LINE 1024

/* One recorded range ("R" line of the record file). */
typedef struct {
    long tid;
    char domain[64];
    int category, depth;
    char name[512];
} range;

typedef struct {
    range *r;
    int n_ranges;
    int n_domains;       /* "D convweave" lines */
    char cat_names[8][32]; /* "C convweave <id> <name>" */
    int n_other_domain;  /* records naming any other domain */
} record;

/* Splits a line at tabs in place; returns the number of fields. */
static int split_tabs(char *line, char **f, int max) {
    int n = 0;
    f[n++] = line;
    for (char *p = line; *p && n < max; p++)
        if (*p == '\t') *p = '\0', f[n++] = p + 1;
    return n;
}

static void read_record(const char *path, record *rec) {
    memset(rec, 0, sizeof *rec);
    rec->r = calloc(MAX_RANGES, sizeof *rec->r);
    ASSERT_TRUE(rec->r != NULL);
    FILE *f = fopen(path, "r");
    if (!f) return; /* nothing recorded yet */
    char line[MAX_LINE];
    while (fgets(line, sizeof line, f)) {
        size_t len = strlen(line);
        ASSERT_TRUE(len > 0 && line[len - 1] == '\n'); /* whole lines only */
        line[len - 1] = '\0';
        char *fl[8];
        int nf = split_tabs(line, fl, 8);
        if (!strcmp(fl[0], "D")) {
            ASSERT_EQ_I(nf, 2);
            if (!strcmp(fl[1], "convweave")) rec->n_domains++;
            else rec->n_other_domain++;
        } else if (!strcmp(fl[0], "C")) {
            ASSERT_EQ_I(nf, 4);
            int id = atoi(fl[2]);
            if (strcmp(fl[1], "convweave") != 0) rec->n_other_domain++;
            else if (id >= 0 && id < 8) snprintf(rec->cat_names[id], sizeof rec->cat_names[id], "%s", fl[3]);
        } else if (!strcmp(fl[0], "R")) {
            ASSERT_EQ_I(nf, 6);
            ASSERT_TRUE(rec->n_ranges < MAX_RANGES);
            range *r = &rec->r[rec->n_ranges++];
            r->tid = atol(fl[1]);
            snprintf(r->domain, sizeof r->domain, "%s", fl[2]);
            r->category = atoi(fl[3]);
            r->depth = atoi(fl[4]);
            snprintf(r->name, sizeof r->name, "%s", fl[5]);
            if (strcmp(r->domain, "convweave") != 0) rec->n_other_domain++;
        } else {
            fprintf(stderr, "unexpected record line '%s'\n", fl[0]);
            ASSERT_TRUE(0);
        }
    }
    fclose(f);
}

/* ---- the graph: x -> GN(4) -> SiLU -> conv3x3 8->8 -> + x -> upsample2x -> conv3x3 8->8 */
typedef struct {
    cw_context *ctx;
    cw_graph *g;
    cw_tensor *consts[8];
    int nconst;
    cw_tensor_desc in_d, out_d;
} net;

static cw_node constant(net *m, cw_rng *rng, int rank, const int64_t *dims, float scale, float offset) {
    cw_tensor_desc d;
    ASSERT_OK(cw_tensor_desc_make(&d, CW_F32, rank, dims));
    int64_t n = cw_tensor_desc_numel(&d);
    float *v = malloc((size_t)n * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = offset + scale * cw_rng_float(rng);
    cw_tensor *t;
    ASSERT_OK_CTX(m->ctx, cw_tensor_create(&t, m->ctx, &d));
    ASSERT_OK_CTX(m->ctx, cw_tensor_upload(t, v, (size_t)n * sizeof *v));
    free(v);
    m->consts[m->nconst++] = t;
    cw_node out;
    ASSERT_OK_CTX(m->ctx, cw_graph_constant(m->g, &out, "c", t));
    return out;
}

static void build(net *m, cw_context *ctx, uint64_t seed) {
    memset(m, 0, sizeof *m);
    m->ctx = ctx;
    cw_rng rng = {seed};
    ASSERT_OK_CTX(ctx, cw_graph_create(&m->g, ctx));
    int64_t xd[4] = {1, 8, 16, 16}, wd[4] = {8, 8, 3, 3}, c8 = 8;
    ASSERT_OK(cw_tensor_desc_make(&m->in_d, CW_F32, 4, xd));
    cw_node x, h, c1, r, u, c2;
    ASSERT_OK_CTX(ctx, cw_graph_input(m->g, &x, "x", &m->in_d));
    cw_node gamma = constant(m, &rng, 1, &c8, 0.2f, 1.0f), beta = constant(m, &rng, 1, &c8, 0.2f, 0.0f);
    ASSERT_OK_CTX(ctx, cw_graph_group_norm(m->g, &h, x, gamma, beta, 4, 1e-6f));
    ASSERT_OK_CTX(ctx, cw_graph_silu(m->g, &h, h));
    cw_conv_params p = CW_CONV_PARAMS_INIT;
    p.pad_pre[0] = p.pad_pre[1] = p.pad_post[0] = p.pad_post[1] = 1;
    cw_node w1 = constant(m, &rng, 4, wd, 0.1f, 0.0f), b1 = constant(m, &rng, 1, &c8, 0.1f, 0.0f);
    ASSERT_OK_CTX(ctx, cw_graph_conv(m->g, &c1, h, w1, b1, &p));
    ASSERT_OK_CTX(ctx, cw_graph_add(m->g, &r, c1, x));
    ASSERT_OK_CTX(ctx, cw_graph_upsample2x(m->g, &u, r));
    cw_node w2 = constant(m, &rng, 4, wd, 0.1f, 0.0f), b2 = constant(m, &rng, 1, &c8, 0.1f, 0.0f);
    ASSERT_OK_CTX(ctx, cw_graph_conv(m->g, &c2, u, w2, b2, &p));
    ASSERT_OK_CTX(ctx, cw_graph_output(m->g, c2, "y"));
    ASSERT_OK_CTX(ctx, cw_graph_get_node_desc(m->g, &m->out_d, c2));
}

static void free_net(net *m) {
    cw_graph_destroy(m->g);
    for (int i = 0; i < m->nconst; i++) cw_tensor_destroy(m->consts[i]);
}

static cw_context *make_ctx(uint32_t flags) {
    cw_context_config c = CW_CONTEXT_CONFIG_INIT;
    c.backend = CW_BACKEND_CPU;
    c.flags = flags;
    c.threads = 1;
    cw_context *ctx;
    ASSERT_OK(cw_context_create(&ctx, &c));
    return ctx;
}

static cw_plan *compile3(net *m) {
    cw_compile_options o = CW_COMPILE_OPTIONS_INIT;
    o.policy = CW_PATCHES_FIXED;
    o.patches = 3;
    o.streams = 3;
    o.temp_budget = -1;
    cw_plan *plan;
    ASSERT_OK_CTX(m->ctx, cw_graph_compile(m->g, &plan, &o));
    return plan;
}

static void run(net *m, cw_plan *plan, cw_rng *rng) {
    int64_t n = cw_tensor_desc_numel(&m->in_d);
    float *in = malloc((size_t)n * sizeof *in);
    for (int64_t i = 0; i < n; i++) in[i] = cw_rng_float(rng);
    cw_tensor *x, *y;
    ASSERT_OK_CTX(m->ctx, cw_tensor_create(&x, m->ctx, &m->in_d));
    ASSERT_OK_CTX(m->ctx, cw_tensor_create(&y, m->ctx, &m->out_d));
    ASSERT_OK_CTX(m->ctx, cw_tensor_upload(x, in, (size_t)n * sizeof *in));
    ASSERT_OK_CTX(m->ctx, cw_plan_run(plan, &x, 1, &y, 1));
    cw_tensor_destroy(x);
    cw_tensor_destroy(y);
    free(in);
}

/* Task events (ph "X") of the plan's Chrome trace: names and stream of each. */
typedef struct {
    char name[512];
    char cat[32];
    int stream;
    int matched;
} tevent;

static int read_trace(const char *path, tevent *ev, int max) {
    FILE *f = fopen(path, "rb");
    ASSERT_TRUE(f != NULL);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *txt = calloc((size_t)len + 1, 1);
    ASSERT_TRUE(txt && fread(txt, 1, (size_t)len, f) == (size_t)len);
    fclose(f);
    cJSON *root = cJSON_Parse(txt);
    ASSERT_TRUE(root != NULL);
    int n = 0;
    cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(root, "traceEvents")) {
        const char *ph = cJSON_GetStringValue(cJSON_GetObjectItem(e, "ph"));
        if (!ph || strcmp(ph, "X") != 0) continue;
        ASSERT_TRUE(n < max);
        const char *nm = cJSON_GetStringValue(cJSON_GetObjectItem(e, "name"));
        const char *cat = cJSON_GetStringValue(cJSON_GetObjectItem(e, "cat"));
        ASSERT_TRUE(nm && cat);
        snprintf(ev[n].name, sizeof ev[n].name, "%s", nm);
        snprintf(ev[n].cat, sizeof ev[n].cat, "%s", cat);
        ev[n].stream = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(e, "tid"));
        ev[n].matched = 0;
        n++;
    }
    cJSON_Delete(root);
    free(txt);
    return n;
}

int main(void) {
    if (!cw__nvtx_compiled()) {
        fprintf(stderr, "skip: convweave was built without NVTX\n");
        return CW_TEST_SKIP;
    }
    uint64_t seed = cw_test_seed(7001);
    cw_rng rng = {seed};
    char rec_path[512], trace_path[512];
    snprintf(rec_path, sizeof rec_path, "%s/nvtx_record.txt", CW_BINARY_DIR);
    snprintf(trace_path, sizeof trace_path, "%s/nvtx_trace.json", CW_BINARY_DIR);
    remove(rec_path);
    /* NVTX reads these at the process's first NVTX call, which is the first run below */
    ASSERT_TRUE(setenv("NVTX_INJECTION64_PATH", CW_NVTX_RECORDER, 1) == 0);
    ASSERT_TRUE(setenv("CW_NVTX_RECORD", rec_path, 1) == 0);

    /* 1. a plan run with NVTX (and timing, so the trace names every task) */
    cw_context *ctx = make_ctx(CW_FLAG_NVTX | CW_FLAG_TIMING);
    net m;
    build(&m, ctx, seed);
    cw_plan *plan = compile3(&m);
    run(&m, plan, &rng);
    cw_plan_stats st;
    ASSERT_OK(cw_plan_get_stats(plan, &st));
    ASSERT_OK_CTX(ctx, cw_plan_write_trace(plan, trace_path));
    ASSERT_EQ_I(st.n_streams, 3);
    ASSERT_EQ_I(st.n_patches, 6); /* two convs, 3 patches each */

    record rec;
    read_record(rec_path, &rec);
    if (rec.n_ranges == 0 && rec.n_domains == 0) {
        fprintf(stderr, "no NVTX records in %s: the injection did not attach\n", rec_path);
        return 1;
    }
    ASSERT_EQ_I(rec.n_domains, 1);
    ASSERT_EQ_I(rec.n_other_domain, 0);
    static const char *const cats[8] = {NULL, "run", "conv", "prep", "epilogue", "stats", "attention", "other"};
    for (int c = 1; c < 8; c++)
        if (strcmp(rec.cat_names[c], cats[c]) != 0) {
            fprintf(stderr, "category %d named '%s', expected '%s'\n", c, rec.cat_names[c], cats[c]);
            cw_test_failures++;
        }

    /* the run range: once, category 1, outermost, on the calling thread */
    int n_run = 0;
    long host_tid = -1;
    for (int i = 0; i < rec.n_ranges; i++)
        if (!strcmp(rec.r[i].name, "cw_plan_run")) {
            n_run++;
            host_tid = rec.r[i].tid;
            if (rec.r[i].category != 1 || rec.r[i].depth != 0) {
                fprintf(stderr, "cw_plan_run range: category %d (expected 1, \"run\"), depth %d (expected 0)\n",
                        rec.r[i].category, rec.r[i].depth);
                cw_test_failures++;
            }
        }
    ASSERT_EQ_I(n_run, 1);

    /* task ranges: exactly one per task, matched by name with the trace's events, category
     * = the trace event's stage, never nested, on one worker thread per stream */
    tevent *ev = calloc(MAX_RANGES, sizeof *ev);
    int n_ev = read_trace(trace_path, ev, MAX_RANGES);
    ASSERT_EQ_I(n_ev, st.n_tasks);
    int n_task = rec.n_ranges - n_run;
    ASSERT_EQ_I(n_task, st.n_tasks);
    long stream_tid[8] = {0};
    int patch_seen[3] = {0}, n_conv = 0, n_named = 0;
    for (int i = 0; i < rec.n_ranges; i++) {
        const range *r = &rec.r[i];
        if (!strcmp(r->name, "cw_plan_run")) continue;
        if (r->category < 2 || r->category > 7 || r->depth != 0 || r->tid == host_tid) {
            fprintf(stderr, "task range '%s': category %d depth %d tid %ld (host %ld)\n", r->name, r->category,
                    r->depth, r->tid, host_tid);
            cw_test_failures++;
        }
        int k = 0;
        while (k < n_ev && (ev[k].matched || strcmp(ev[k].name, r->name) != 0)) k++;
        if (k == n_ev) {
            fprintf(stderr, "task range '%s' matches no task of the trace (or one twice)\n", r->name);
            cw_test_failures++;
            continue;
        }
        ev[k].matched = 1;
        if (r->category >= 2 && r->category <= 7 && strcmp(cats[r->category], ev[k].cat) != 0) {
            fprintf(stderr, "task '%s': NVTX category %s, trace category %s\n", r->name, cats[r->category], ev[k].cat);
            cw_test_failures++;
        }
        ASSERT_TRUE(ev[k].stream >= 0 && ev[k].stream < 8);
        if (!stream_tid[ev[k].stream]) stream_tid[ev[k].stream] = r->tid;
        else if (stream_tid[ev[k].stream] != r->tid) {
            fprintf(stderr, "stream %d ran on threads %ld and %ld\n", ev[k].stream, stream_tid[ev[k].stream], r->tid);
            cw_test_failures++;
        }
        if (r->category == 2) {
            n_conv++;
            n_named += strstr(r->name, "conv3x3 8->8") != NULL;
            for (int j = 0; j < 3; j++) {
                char pat[32];
                snprintf(pat, sizeof pat, "patch %d/3", j + 1);
                patch_seen[j] += strstr(r->name, pat) != NULL;
            }
        }
    }
    for (int k = 0; k < n_ev; k++) CHECK(ev[k].matched);
    ASSERT_EQ_I(n_conv, st.n_patches);
    for (int j = 0; j < 3; j++) ASSERT_EQ_I(patch_seen[j], 2);
    /* the inner conv is named by its op (the output conv may carry the output's name) */
    ASSERT_TRUE(n_named >= 3);
    int n_threads = 0;
    for (int s = 0; s < 8; s++) {
        if (!stream_tid[s]) continue;
        n_threads++;
        for (int t = 0; t < s; t++) CHECK(stream_tid[t] != stream_tid[s]); /* a thread per stream */
    }
    ASSERT_TRUE(n_threads >= 2);
    int first_ranges = rec.n_ranges;
    printf("run 1: %d task ranges on %d threads (%" PRId64 " tasks, %d conv patches)\n", n_task, n_threads,
           st.n_tasks, n_conv);
    free(rec.r);

    /* 2. teeth: the same graph in a context without CW_FLAG_NVTX (timing still runs the
     * per-task host callbacks) adds no range at all */
    cw_context *ctx2 = make_ctx(CW_FLAG_TIMING);
    net m2;
    build(&m2, ctx2, seed);
    cw_plan *plan2 = compile3(&m2);
    run(&m2, plan2, &rng);
    read_record(rec_path, &rec);
    ASSERT_EQ_I(rec.n_ranges, first_ranges);
    free(rec.r);

    /* 3. a second run of the NVTX plan records one more set */
    run(&m, plan, &rng);
    read_record(rec_path, &rec);
    ASSERT_EQ_I(rec.n_ranges, 2 * first_ranges);
    ASSERT_EQ_I(rec.n_domains, 1); /* the domain is created once per process */
    free(rec.r);
    printf("run 2 without CW_FLAG_NVTX: 0 ranges; run 3: %d ranges\n", first_ranges);

    free(ev);
    cw_plan_destroy(plan2);
    free_net(&m2);
    cw_context_destroy(ctx2);
    cw_plan_destroy(plan);
    free_net(&m);
    cw_context_destroy(ctx);
    TEST_DONE();
}
#endif
