/* Scheduler benchmark: a VAE-like stack (ResNet blocks at 128 channels around a nearest 2x
 * upsample, f32) run unscheduled (CW_PATCHES_NONE) and scheduled (CW_PATCHES_AUTO under a
 * temp budget) for several stream counts: time, the library's memory stats, peak RSS, and
 * every scheduled output checked against the reference. Uses the public API only.
 *
 *   bench_sched                         512^2 main resolution, 64 MiB, streams 1,2,3,4
 *   bench_sched --size 128 --repeat 1   a quick check (a few seconds)
 *
 * The stack (N = 1, C = 128, S = --size; the input is S/2 so most of the work is at S^2):
 *   x [1,128,S/2,S/2] -> 2 ResNet blocks -> upsample2x + conv3x3 -> 2 ResNet blocks at S^2
 *   -> GroupNorm + SiLU + conv3x3 to 3 channels [1,3,S,S].
 * A ResNet block is h = conv3x3(SiLU(GN(x))), h = conv3x3(SiLU(GN(h))), y = x + h, with
 * GroupNorm(32 groups, eps 1e-6). Weights and biases are uniform with std 1/sqrt(fan_in),
 * GroupNorm scale 1 +- 0.1, shift +- 0.1, the input uniform with std 1, all from --seed.
 * Why 512 (input 256^2): 10 convs, 466 GFLOP per run, about 5-15 s per run on a 2-core
 * machine (load-dependent), so the default run (5 configurations, best of 3) takes minutes;
 * the reference's peak total there is ~1.9 GiB. --size 1024 is 4x the time and memory.
 *
 * Each configuration runs in its own forked child, forked before anything big is allocated,
 * so its peak RSS (ru_maxrss from wait4) is its own. The child builds the graph, compiles,
 * runs --repeat times (time = best cw_plan_run wall time) and writes its stats and output
 * into a MAP_SHARED mapping. An output that differs from the reference's by more than 1e-5
 * of the reference's largest magnitude is a FAIL (exit 1). */
#include <convweave/convweave.h>

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "child.h"

#define MIB (1024.0 * 1024.0)
#define CHANNELS 128
#define GN_GROUPS 32
#define GN_EPS 1e-6f
#define OUT_CHANNELS 3
#define MAX_STREAM_COUNTS 8
#define MAX_CONSTS 64
#define ERR_LEN 512

/* Targets of the scheduler issue, as ratios to the unscheduled reference. */
#define TARGET_TOTAL_RATIO 0.60
#define TARGET_TIME_RATIO 1.10
#define TARGET_2V1_RATIO 1.00
#define MATCH_REL_TOL 1e-5

typedef struct bench_opts {
    int64_t size;      /* main (output) resolution; the input is size/2 */
    int64_t budget;    /* temp budget of the scheduled runs, bytes */
    int streams[MAX_STREAM_COUNTS];
    int n_streams;
    int repeat;
    int threads;       /* <= 0: all cores */
    uint64_t seed;
    cw_backend_kind backend;
} bench_opts;

typedef struct config {
    char label[64];
    cw_patch_policy policy;
    int streams;
    int64_t budget; /* compile budget: < 0 unlimited */
} config;

/* What a child reports back through the shared mapping (its output follows it there). */
typedef struct result {
    int done;            /* set by the child once everything below is filled in */
    cw_status status;
    char err[ERR_LEN];
    char backend[16];
    double ms;           /* best wall time of cw_plan_run, ms */
    cw_plan_stats stats; /* of the last run */
    int64_t peak_rss;    /* filled by the parent: the child's ru_maxrss, bytes */
} result;

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* splitmix64: a small seeded generator, identical in every child. */
static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [center - half, center + half). */
static void fill_uniform(float *v, int64_t n, uint64_t *rng, float center, float half) {
    for (int64_t i = 0; i < n; i++) {
        double u = (double)(rng_next(rng) >> 11) * (1.0 / 9007199254740992.0); /* [0, 1) */
        v[i] = center + half * (float)(2.0 * u - 1.0);
    }
}

/* ---- building the stack with the graph API ------------------------------------------------ */

/* Graph builder with a sticky status: after the first failure every call is a no-op
 * returning CW_NODE_NONE, and err names the call that failed. */
typedef struct stack {
    cw_context *ctx;
    cw_graph *g;
    cw_tensor *consts[MAX_CONSTS];
    int n_consts;
    uint64_t rng;
    cw_status st;
    char err[ERR_LEN];
} stack;

static int stack_failed(stack *s, cw_status st, const char *what, const char *name) {
    if (st == CW_OK) return 0;
    if (s->st == CW_OK) {
        s->st = st;
        snprintf(s->err, sizeof s->err, "%s (%s): %s: %s", what, name, cw_status_name(st),
                 cw_context_get_last_error(s->ctx));
    }
    return 1;
}

/* A constant of the given dims, uniform in [center - half, center + half). */
static cw_node stack_const(stack *s, const char *name, int rank, const int64_t *dims, float center, float half) {
    if (s->st != CW_OK) return CW_NODE_NONE;
    if (s->n_consts == MAX_CONSTS) {
        stack_failed(s, CW_ERR_INTERNAL, "more than MAX_CONSTS constants", name);
        return CW_NODE_NONE;
    }
    cw_tensor_desc d;
    cw_tensor *t = NULL;
    cw_node n = CW_NODE_NONE;
    if (stack_failed(s, cw_tensor_desc_make(&d, CW_F32, rank, dims), "cw_tensor_desc_make", name)) return n;
    if (stack_failed(s, cw_tensor_create(&t, s->ctx, &d), "cw_tensor_create", name)) return n;
    s->consts[s->n_consts++] = t;
    int64_t numel = cw_tensor_desc_numel(&d);
    float *host = malloc((size_t)numel * sizeof(float));
    if (!host) {
        stack_failed(s, CW_ERR_OUT_OF_MEMORY, "malloc", name);
        return n;
    }
    fill_uniform(host, numel, &s->rng, center, half);
    cw_status st = cw_tensor_upload(t, host, (size_t)numel * sizeof(float));
    free(host);
    if (stack_failed(s, st, "cw_tensor_upload", name)) return n;
    stack_failed(s, cw_graph_constant(s->g, &n, name, t), "cw_graph_constant", name);
    return n;
}

/* conv3x3 (padding 1) with bias; weights and bias uniform with std 1/sqrt(cin * 9). */
static cw_node conv3x3(stack *s, const char *name, cw_node x, int64_t cin, int64_t cout) {
    char nm[96];
    float half = (float)sqrt(3.0 / (double)(cin * 9));
    int64_t wd[4] = {cout, cin, 3, 3}, bd[1] = {cout};
    snprintf(nm, sizeof nm, "%s.weight", name);
    cw_node w = stack_const(s, nm, 4, wd, 0.0f, half);
    snprintf(nm, sizeof nm, "%s.bias", name);
    cw_node b = stack_const(s, nm, 1, bd, 0.0f, half);
    if (s->st != CW_OK) return CW_NODE_NONE;
    cw_conv_params p = CW_CONV_PARAMS_INIT;
    p.pad_pre[0] = p.pad_pre[1] = p.pad_post[0] = p.pad_post[1] = 1;
    cw_node y = CW_NODE_NONE;
    stack_failed(s, cw_graph_conv(s->g, &y, x, w, b, &p), "cw_graph_conv", name);
    return y;
}

/* SiLU(GroupNorm(x)). */
static cw_node norm_silu(stack *s, const char *name, cw_node x, int64_t c) {
    char nm[96];
    int64_t cd[1] = {c};
    snprintf(nm, sizeof nm, "%s.gamma", name);
    cw_node gamma = stack_const(s, nm, 1, cd, 1.0f, 0.1f);
    snprintf(nm, sizeof nm, "%s.beta", name);
    cw_node beta = stack_const(s, nm, 1, cd, 0.0f, 0.1f);
    if (s->st != CW_OK) return CW_NODE_NONE;
    cw_node n = CW_NODE_NONE, y = CW_NODE_NONE;
    if (stack_failed(s, cw_graph_group_norm(s->g, &n, x, gamma, beta, GN_GROUPS, GN_EPS), "cw_graph_group_norm", name))
        return y;
    stack_failed(s, cw_graph_silu(s->g, &y, n), "cw_graph_silu", name);
    return y;
}

static cw_node resnet_block(stack *s, const char *name, cw_node x, int64_t c) {
    char nm[96];
    snprintf(nm, sizeof nm, "%s.norm1", name);
    cw_node h = norm_silu(s, nm, x, c);
    snprintf(nm, sizeof nm, "%s.conv1", name);
    h = conv3x3(s, nm, h, c, c);
    snprintf(nm, sizeof nm, "%s.norm2", name);
    h = norm_silu(s, nm, h, c);
    snprintf(nm, sizeof nm, "%s.conv2", name);
    h = conv3x3(s, nm, h, c, c);
    if (s->st != CW_OK) return CW_NODE_NONE;
    cw_node y = CW_NODE_NONE;
    stack_failed(s, cw_graph_add(s->g, &y, x, h), "cw_graph_add", name);
    return y;
}

/* Builds the whole stack on a new graph; s->st / s->err say what failed. */
static cw_status stack_build(stack *s, cw_context *ctx, uint64_t seed, int64_t size) {
    memset(s, 0, sizeof *s);
    s->ctx = ctx;
    s->rng = seed;
    if (stack_failed(s, cw_graph_create(&s->g, ctx), "cw_graph_create", "graph")) return s->st;
    int64_t in_dims[4] = {1, CHANNELS, size / 2, size / 2};
    cw_tensor_desc d;
    cw_node x = CW_NODE_NONE, up = CW_NODE_NONE;
    if (stack_failed(s, cw_tensor_desc_make(&d, CW_F32, 4, in_dims), "cw_tensor_desc_make", "x") ||
        stack_failed(s, cw_graph_input(s->g, &x, "x", &d), "cw_graph_input", "x"))
        return s->st;
    x = resnet_block(s, "block0", x, CHANNELS);
    x = resnet_block(s, "block1", x, CHANNELS);
    if (s->st == CW_OK) stack_failed(s, cw_graph_upsample2x(s->g, &up, x), "cw_graph_upsample2x", "up");
    x = conv3x3(s, "up.conv", up, CHANNELS, CHANNELS);
    x = resnet_block(s, "block2", x, CHANNELS);
    x = resnet_block(s, "block3", x, CHANNELS);
    x = norm_silu(s, "out.norm", x, CHANNELS);
    x = conv3x3(s, "out.conv", x, CHANNELS, OUT_CHANNELS);
    if (s->st == CW_OK) stack_failed(s, cw_graph_output(s->g, x, "y"), "cw_graph_output", "y");
    return s->st;
}

static void stack_free(stack *s) {
    cw_graph_destroy(s->g);
    for (int i = 0; i < s->n_consts; i++) cw_tensor_destroy(s->consts[i]);
    s->g = NULL;
    s->n_consts = 0;
}

/* ---- one configuration, in a child process ------------------------------------------------ */

static void set_err(result *res, cw_status st, const char *what, cw_context *ctx) {
    res->status = st;
    if (ctx) snprintf(res->err, sizeof res->err, "%s: %s: %s", what, cw_status_name(st), cw_context_get_last_error(ctx));
    else snprintf(res->err, sizeof res->err, "%s: %s", what, cw_status_name(st));
}

/* Builds, compiles and runs one configuration; everything big is allocated here. */
static void child_run(const bench_opts *o, const config *cf, result *res, float *out) {
    cw_context *ctx = NULL;
    stack sk;
    memset(&sk, 0, sizeof sk);
    cw_plan *plan = NULL;
    cw_tensor *x = NULL, *y = NULL;
    float *host = NULL;
    cw_status st;

    cw_context_config cc = CW_CONTEXT_CONFIG_INIT;
    cc.backend = o->backend;
    cc.streams = cf->streams;
    cc.threads = o->threads;
    cc.temp_budget = cf->budget > 0 ? cf->budget : 0;
    if ((st = cw_context_create(&ctx, &cc)) != CW_OK) {
        set_err(res, st, "cw_context_create (details in the log above)", NULL);
        goto done;
    }
    snprintf(res->backend, sizeof res->backend, "%s", cw_context_get_backend_name(ctx));
    if (stack_build(&sk, ctx, o->seed, o->size) != CW_OK) {
        res->status = sk.st;
        snprintf(res->err, sizeof res->err, "%s", sk.err);
        goto done;
    }

    cw_compile_options co = CW_COMPILE_OPTIONS_INIT;
    co.temp_budget = cf->budget;
    co.streams = cf->streams;
    co.policy = cf->policy;
    if ((st = cw_graph_compile(sk.g, &plan, &co)) != CW_OK) {
        set_err(res, st, "cw_graph_compile", ctx); /* CW_ERR_BUDGET's message names the smallest budget */
        goto done;
    }

    int64_t in_dims[4] = {1, CHANNELS, o->size / 2, o->size / 2}, out_dims[4] = {1, OUT_CHANNELS, o->size, o->size};
    cw_tensor_desc xd, yd;
    cw_tensor_desc_make(&xd, CW_F32, 4, in_dims);
    cw_tensor_desc_make(&yd, CW_F32, 4, out_dims);
    int64_t nin = cw_tensor_desc_numel(&xd), nout = cw_tensor_desc_numel(&yd);
    if ((st = cw_tensor_create(&x, ctx, &xd)) != CW_OK || (st = cw_tensor_create(&y, ctx, &yd)) != CW_OK) {
        set_err(res, st, "cw_tensor_create (input/output)", ctx);
        goto done;
    }
    host = malloc((size_t)nin * sizeof(float));
    if (!host) {
        set_err(res, CW_ERR_OUT_OF_MEMORY, "malloc of the input", NULL);
        goto done;
    }
    uint64_t rng = o->seed ^ 0x5EEDull;
    fill_uniform(host, nin, &rng, 0.0f, (float)sqrt(3.0));
    st = cw_tensor_upload(x, host, (size_t)nin * sizeof(float));
    free(host); /* before the runs, so the staging copy is not part of their RSS */
    host = NULL;
    if (st != CW_OK) {
        set_err(res, st, "cw_tensor_upload (input)", ctx);
        goto done;
    }

    res->ms = INFINITY;
    for (int r = 0; r < o->repeat; r++) {
        double t0 = now_ms();
        st = cw_plan_run(plan, &x, 1, &y, 1);
        double t = now_ms() - t0;
        if (st != CW_OK) {
            set_err(res, st, "cw_plan_run", ctx);
            goto done;
        }
        if (t < res->ms) res->ms = t;
    }
    cw_plan_get_stats(plan, &res->stats);
    if ((st = cw_tensor_download(y, out, (size_t)nout * sizeof(float))) != CW_OK) {
        set_err(res, st, "cw_tensor_download (output)", ctx);
        goto done;
    }
    res->status = CW_OK;
done:
    free(host);
    cw_tensor_destroy(x);
    cw_tensor_destroy(y);
    cw_plan_destroy(plan);
    stack_free(&sk);
    cw_context_destroy(ctx);
    res->done = 1;
}

/* What the child runs: cf, reporting into the area's head (a result) and data (the output). */
typedef struct child_job {
    const bench_opts *o;
    const config *cf;
    const child_area *area;
} child_job;

static int child_main(void *arg) {
    const child_job *j = arg;
    result *res = j->area->head;
    child_run(j->o, j->cf, res, j->area->data);
    return res->status == CW_OK ? 0 : 1;
}

/* Runs cf in a forked child with its result and output in *area; 0 when the child produced an
 * output, else -1 (the reason is in the result's err when the mapping exists). */
static int run_in_child(const bench_opts *o, const config *cf, int64_t out_numel, child_area *area) {
    if (child_area_map(area, sizeof(result), (size_t)out_numel * sizeof(float)) != 0) {
        fprintf(stderr, "bench_sched: mmap of %zu bytes: %s\n", area->bytes, strerror(errno));
        return -1;
    }
    result *res = area->head;
    child_job job = {o, cf, area};
    child_opts co = {0};
    child_status st;
    child_call(&st, child_main, &job, &co);
    if (st.end == CHILD_FAILED) {
        snprintf(res->err, sizeof res->err, "%s", st.err);
        return -1;
    }
    res->peak_rss = st.peak_rss;
    if (st.end == CHILD_KILLED) {
        snprintf(res->err, sizeof res->err, "child killed by signal %d (%s)", st.code, strsignal(st.code));
        return -1;
    }
    if (!res->done) {
        snprintf(res->err, sizeof res->err, "child exited with status %d before reporting", st.code);
        return -1;
    }
    return res->status == CW_OK ? 0 : -1;
}

/* ---- options ---------------------------------------------------------------------------------- */

static int usage(const char *prog, const char *why) {
    if (why) fprintf(stderr, "%s: %s\n", prog, why);
    fprintf(stderr,
            "usage: %s [--size S] [--budget MIB] [--streams LIST] [--repeat N] [--threads T] [--seed N]\n"
            "          [--backend cpu|cuda|auto]\n"
            "  --size S        main resolution S x S (even, >= 8; the input is S/2 x S/2); default 512\n"
            "  --budget MIB    temp budget of the scheduled runs in MiB; default 64\n"
            "  --streams LIST  stream counts of the scheduled runs, e.g. 1,2,3,4 (the default)\n"
            "  --repeat N      time = best of N runs of cw_plan_run; default 3\n"
            "  --threads T     cpu: BLAS threads (default: all cores)\n"
            "  --seed N        seed of weights and input; default 1\n"
            "  --backend B     default cpu\n",
            prog);
    return 2;
}

static int parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

static int parse_opts(int argc, char **argv, bench_opts *o) {
    memset(o, 0, sizeof *o);
    o->size = 512;
    o->budget = (int64_t)(64 * MIB);
    o->n_streams = 4;
    for (int i = 0; i < 4; i++) o->streams[i] = i + 1;
    o->repeat = 3;
    o->seed = 1;
    o->backend = CW_BACKEND_CPU;
    char why[160];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t n;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) return usage(argv[0], NULL);
        if (!v) {
            snprintf(why, sizeof why, "%s needs a value", a);
            return usage(argv[0], !strncmp(a, "--", 2) ? why : "unexpected argument");
        }
        i++;
        if (!strcmp(a, "--size")) {
            if (parse_i64(v, 8, 1 << 16, &n) || n % 2) return usage(argv[0], "--size must be an even integer >= 8");
            o->size = n;
        } else if (!strcmp(a, "--budget")) {
            char *end;
            double mib = strtod(v, &end);
            if (end == v || *end || !(mib > 0) || mib > 1e9) return usage(argv[0], "--budget must be a positive MiB count");
            o->budget = (int64_t)(mib * MIB);
        } else if (!strcmp(a, "--streams")) {
            o->n_streams = 0;
            for (const char *p = v; *p;) {
                char tok[16];
                size_t len = strcspn(p, ",");
                if (len == 0 || len >= sizeof tok || o->n_streams == MAX_STREAM_COUNTS)
                    return usage(argv[0], "--streams must be a comma-separated list of up to 8 counts");
                memcpy(tok, p, len);
                tok[len] = '\0';
                if (parse_i64(tok, 1, 64, &n)) return usage(argv[0], "--streams: each count must be 1..64");
                o->streams[o->n_streams++] = (int)n;
                p += len;
                if (*p == ',') p++;
            }
            if (o->n_streams == 0) return usage(argv[0], "--streams is empty");
        } else if (!strcmp(a, "--repeat")) {
            if (parse_i64(v, 1, 1000, &n)) return usage(argv[0], "--repeat must be 1..1000");
            o->repeat = (int)n;
        } else if (!strcmp(a, "--threads")) {
            if (parse_i64(v, 0, 1024, &n)) return usage(argv[0], "--threads must be 0..1024 (0: all cores)");
            o->threads = (int)n;
        } else if (!strcmp(a, "--seed")) {
            if (parse_i64(v, 0, INT64_MAX, &n)) return usage(argv[0], "--seed must be a non-negative integer");
            o->seed = (uint64_t)n;
        } else if (!strcmp(a, "--backend")) {
            if (!strcmp(v, "cpu")) o->backend = CW_BACKEND_CPU;
            else if (!strcmp(v, "cuda")) o->backend = CW_BACKEND_CUDA;
            else if (!strcmp(v, "auto")) o->backend = CW_BACKEND_AUTO;
            else return usage(argv[0], "--backend must be cpu, cuda or auto");
        } else {
            snprintf(why, sizeof why, "unknown option %s", a);
            return usage(argv[0], why);
        }
    }
    return 0;
}

/* ---- report ------------------------------------------------------------------------------------ */

/* The command line, shell-quoted where needed, so the figures can be recorded with it. */
static void print_command(int argc, char **argv) {
    printf("# command:");
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        int plain = *a != '\0';
        for (const char *p = a; *p; p++)
            if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./,=:+", *p)) plain = 0;
        if (plain) {
            printf(" %s", a);
        } else {
            printf(" '");
            for (const char *p = a; *p; p++) {
            if (*p == '\'') printf("'\\''");
            else putchar(*p);
        }
            putchar('\'');
        }
    }
    putchar('\n');
}

static void print_machine(const bench_opts *o) {
    char model[128] = "unknown cpu", line[256], load[64] = "?";
    FILE *f = fopen("/proc/cpuinfo", "r");
    while (f && fgets(line, sizeof line, f)) {
        char *c = strchr(line, ':');
        if (!strncmp(line, "model name", 10) && c) {
            snprintf(model, sizeof model, "%s", c + 2);
            model[strcspn(model, "\n")] = '\0';
            break;
        }
    }
    if (f) fclose(f);
    f = fopen("/proc/loadavg", "r");
    if (f && fgets(load, sizeof load, f)) load[strcspn(load, " ")] = '\0';
    if (f) fclose(f);
    char threads[32] = "all cores";
    if (o->threads > 0) snprintf(threads, sizeof threads, "%d", o->threads);
    printf("# machine: %ld cores (%s), load average %s at start; convweave %s; BLAS threads: %s\n",
           sysconf(_SC_NPROCESSORS_ONLN), model, load, cw_version_string(), threads);
}

static void rel_diff(const float *a, const float *ref, int64_t n, double *max_diff, double *rel) {
    double md = 0, mr = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)ref[i]);
        if (!(d <= md)) md = d; /* NaN sticks */
        if (fabs((double)ref[i]) > mr) mr = fabs((double)ref[i]);
    }
    *max_diff = md;
    *rel = mr > 0 ? md / mr : md;
}

static const char *verdict(int met) { return met ? "met" : "missed"; }

static void table_header(void) {
    printf("%-28s %10s %6s %9s %9s %9s %6s %9s %6s %6s %7s %5s %10s %9s\n", "configuration", "time ms", "x ref",
           "temp MiB", "act MiB", "total MiB", "x ref", "RSS MiB", "x ref", "tasks", "patches", "syncs", "max|diff|",
           "rel");
}

/* One table row; diff < 0 marks the reference (nothing to compare with). */
static void table_row(const config *cf, const result *r, const result *ref, double diff, double rel) {
    const cw_plan_stats *s = &r->stats;
    printf("%-28s %10.1f %6.2f %9.1f %9.1f %9.1f %6.2f %9.1f %6.2f %6" PRId64 " %7" PRId64 " %5" PRId64,
           cf->label, r->ms, r->ms / ref->ms, (double)s->temp_peak / MIB, (double)s->activations_peak / MIB,
           (double)s->total_peak / MIB, (double)s->total_peak / (double)ref->stats.total_peak,
           (double)r->peak_rss / MIB, (double)r->peak_rss / (double)ref->peak_rss, s->n_tasks, s->n_patches,
           s->host_syncs);
    if (diff < 0) printf(" %10s %9s\n", "-", "-");
    else printf(" %10.3g %9.2g\n", diff, rel);
}

/* Prints one ratio target per scheduled configuration; a failed one misses it. */
static void print_target(const char *name, double limit, const config *cfgs, const result *res, const int *ok,
                         int n_cfgs, int time) {
    int n_met = 0;
    printf("  %-10s <= %.2fx:", name, limit);
    for (int i = 1; i < n_cfgs; i++) {
        double ratio = time ? res[i].ms / res[0].ms : (double)res[i].stats.total_peak / (double)res[0].stats.total_peak;
        int met = ok[i] && ratio <= limit;
        n_met += met;
        if (ok[i]) printf("  %d str %.3fx %s;", cfgs[i].streams, ratio, verdict(met));
        else printf("  %d str failed, missed;", cfgs[i].streams);
    }
    printf("  => %s (met at %d of %d stream counts)\n", verdict(n_met == n_cfgs - 1), n_met, n_cfgs - 1);
}

int main(int argc, char **argv) {
    bench_opts o;
    int rc = parse_opts(argc, argv, &o);
    if (rc) return rc;
    const int64_t out_numel = (int64_t)OUT_CHANNELS * o.size * o.size;

    print_command(argc, argv);
    print_machine(&o);
    printf("# stack: x [1,%d,%" PRId64 ",%" PRId64 "] -> 2 ResNet blocks -> upsample2x + conv3x3 -> 2 ResNet blocks "
           "at %" PRId64 "^2 -> GN+SiLU+conv3x3 -> [1,%d,%" PRId64 ",%" PRId64 "], f32, seed %" PRIu64 "\n",
           CHANNELS, o.size / 2, o.size / 2, o.size, OUT_CHANNELS, o.size, o.size, o.seed);
    printf("# reference: CW_PATCHES_NONE, 1 stream, no cap; scheduled: CW_PATCHES_AUTO under %.4g MiB\n",
           (double)o.budget / MIB);
    printf("# time = best of %d cw_plan_run wall times; temp/act/total = cw_plan_stats peaks of the last run;\n"
           "# RSS = ru_maxrss of the configuration's own forked process; rel = max|diff| / max|reference|\n\n",
           o.repeat);
    fflush(stdout);

    config cfgs[1 + MAX_STREAM_COUNTS];
    int n_cfgs = 0;
    config *c = &cfgs[n_cfgs++];
    snprintf(c->label, sizeof c->label, "reference (unscheduled)");
    c->policy = CW_PATCHES_NONE;
    c->streams = 1;
    c->budget = -1;
    for (int i = 0; i < o.n_streams; i++) {
        c = &cfgs[n_cfgs++];
        snprintf(c->label, sizeof c->label, "auto %.4g MiB, %d stream%s", (double)o.budget / MIB, o.streams[i],
                 o.streams[i] == 1 ? "" : "s");
        c->policy = CW_PATCHES_AUTO;
        c->streams = o.streams[i];
        c->budget = o.budget;
    }

    /* The reference's output stays mapped for the comparisons. */
    child_area ref;
    if (run_in_child(&o, &cfgs[0], out_numel, &ref) != 0) {
        printf("%s FAIL: %s\n\nFAIL\n", cfgs[0].label,
               ref.head ? ((const result *)ref.head)->err : "no shared mapping (see above)");
        child_area_unmap(&ref);
        return 1;
    }
    const float *ref_out = ref.data;
    result res[1 + MAX_STREAM_COUNTS];
    int ok[1 + MAX_STREAM_COUNTS] = {0};
    res[0] = *(const result *)ref.head;
    ok[0] = 1;
    double ref_max = 0, ref_mean = 0; /* shows the check compares a non-trivial output */
    for (int64_t i = 0; i < out_numel; i++) {
        double v = fabs((double)ref_out[i]);
        ref_mean += v / (double)out_numel;
        if (v > ref_max) ref_max = v;
    }
    printf("%s backend; %.1f conv GFLOP per run; reference output max|y| %.4g, mean|y| %.4g\n", res[0].backend,
           res[0].stats.conv_gflop, ref_max, ref_mean);
    table_header();
    table_row(&cfgs[0], &res[0], &res[0], -1, 0);
    fflush(stdout);

    for (int i = 1; i < n_cfgs; i++) {
        child_area sr;
        int code = run_in_child(&o, &cfgs[i], out_numel, &sr);
        if (!sr.head) {
            printf("%-28s FAIL: no shared mapping for its result (see above)\n", cfgs[i].label);
            continue;
        }
        res[i] = *(const result *)sr.head;
        if (code != 0) {
            printf("%-28s FAIL: %s\n", cfgs[i].label, res[i].err);
        } else {
            double diff, rel;
            rel_diff(sr.data, ref_out, out_numel, &diff, &rel);
            table_row(&cfgs[i], &res[i], &res[0], diff, rel);
            ok[i] = rel <= MATCH_REL_TOL; /* false for NaN too */
            if (!ok[i])
                printf("%-28s FAIL: output differs from the reference: max|diff| %.3g = %.3g of max|reference| "
                       "(tolerance %.0e)\n", cfgs[i].label, diff, rel, MATCH_REL_TOL);
        }
        child_area_unmap(&sr);
        fflush(stdout);
    }
    child_area_unmap(&ref);

    printf("\ntargets (scheduled / reference, budget %.4g MiB):\n", (double)o.budget / MIB);
    print_target("peak total", TARGET_TOTAL_RATIO, cfgs, res, ok, n_cfgs, 0);
    print_target("time", TARGET_TIME_RATIO, cfgs, res, ok, n_cfgs, 1);
    int i1 = -1, i2 = -1;
    for (int i = 1; i < n_cfgs; i++) {
        if (cfgs[i].streams == 1 && i1 < 0) i1 = i;
        if (cfgs[i].streams == 2 && i2 < 0) i2 = i;
    }
    if (i1 < 0 || i2 < 0) {
        printf("  2 streams vs 1: not measured (--streams lacks 1 or 2)\n");
    } else if (!ok[i1] || !ok[i2]) {
        printf("  2 streams no slower than 1: missed (a configuration failed)\n");
    } else {
        double ratio = res[i2].ms / res[i1].ms;
        printf("  2 streams no slower than 1: time %.1f / %.1f ms = %.3fx  => %s\n", res[i2].ms, res[i1].ms, ratio,
               verdict(ratio <= TARGET_2V1_RATIO));
    }
    printf("  (peak RSS ratios are in the table; no target)\n");

    for (int i = 1; i < n_cfgs; i++)
        if (!ok[i]) {
            printf("\nFAIL\n");
            return 1;
        }
    printf("\nall scheduled outputs match the reference (rel <= %.0e)\n", MATCH_REL_TOL);
    return 0;
}
