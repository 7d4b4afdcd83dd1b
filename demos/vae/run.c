/* cw-vae's runs: one configuration in a forked child (context, weights, model, compile, the
 * decodes, its result in a shared mapping), and the signals that stop the child and end the
 * parent cleanly. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

/* Runs on library threads in the child, several at once (the header asks for thread-safe
 * callbacks): publish the decode's progress to the parent through the shared result mapping.
 * Relaxed atomic stores: the bar only needs some recent value. */
static void on_progress(void *user, int64_t done, int64_t total) {
    run_result *r = user;
    __atomic_store_n(&r->tasks_total, total, __ATOMIC_RELAXED);
    __atomic_store_n(&r->tasks_done, done, __ATOMIC_RELAXED);
}

/* ---- one configuration in a child process -------------------------------------------------- */

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static int exit_for(cw_status st) {
    switch (st) {
    case CW_ERR_INVALID_ARG:
    case CW_ERR_UNSUPPORTED:
    case CW_ERR_BUDGET:
    case CW_ERR_IO:
    case CW_ERR_FORMAT:
    case CW_ERR_NO_DEVICE: return EXIT_USAGE;
    default: return EXIT_RUN;
    }
}

/* A library refusal of --dtype gets the flag's name in front of the library's reason. */
static void explain_dtype(const opts *o, run_result *res) {
    if (o->dtype == CW_F32) return;
    char tmp[VAE_ERR_LEN + 64];
    snprintf(tmp, sizeof(tmp), "--dtype %s is unsupported on the %s backend: %s", o->dtype == CW_F16 ? "f16" : "bf16",
             res->backend, res->err);
    snprintf(res->err, sizeof(res->err), "%.*s", (int)sizeof(res->err) - 1, tmp);
}

/* Working memory, as users compare it with diffusers' decode: resident bytes just before the
 * decode (weights, latent, compiled plan in place) against the peak during it. The peak is
 * reset through /proc/self/clear_refs ("5" resets VmHWM), so the model's load does not count.
 * Returns -1 where /proc does not allow it. */
static int64_t proc_status_kib(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    int64_t v = -1;
    size_t kl = strlen(key);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, kl) && line[kl] == ':') {
            v = strtoll(line + kl + 1, NULL, 10);
            break;
        }
    fclose(f);
    return v;
}

static int64_t work_mem_begin(void) {
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f) return -1;
    int ok = fputs("5", f) >= 0;
    if (fclose(f) != 0 || !ok) return -1;
    return proc_status_kib("VmRSS");
}

static int64_t work_mem_end(int64_t rss0_kib) {
    int64_t hwm = proc_status_kib("VmHWM");
    return rss0_kib < 0 || hwm < 0 ? -1 : (hwm - rss0_kib) * 1024;
}

/* A progress display only on a terminal, and not with --quiet. */
int spinner_on(const opts *o) { return !o->quiet && isatty(STDERR_FILENO); }

/* Builds the model again with every block's output kept and names the first block whose
 * output is not finite (the run that found it kept only the final output). */
static void diagnose_nonfinite(const opts *o, cw_context *ctx, const job *jb, run_result *res) {
    char msg[VAE_ERR_LEN] = "";
    vae_weights *w = NULL;
    vae_model *m = NULL;
    int rcw = o->weights ? vae_weights_open_file(&w, o->weights, msg, sizeof(msg))
                         : vae_weights_random(&w, o->seed, msg, sizeof(msg));
    if (!rcw) vae_weights_allow_nonfinite(w, o->allow_nonfinite);
    if (!rcw && vae_build(&m, ctx, &o->cfg, w, o->part, jb->n, jb->h, jb->w, o->dtype, 1, msg, sizeof(msg)) == CW_OK) {
        vae_weights_close(w);
        w = NULL;
        int64_t bytes = 0;
        for (int i = 0; i < m->n_stages; i++) {
            cw_tensor_desc d;
            if (cw_graph_get_node_desc(m->graph, &d, m->stage[i]) == CW_OK) bytes += cw_tensor_desc_numel(&d) * 4;
        }
        if (bytes > ((int64_t)1 << 30)) snprintf(msg, sizeof(msg), "too large to keep every block's output to say where it began");
        else if (vae_first_nonfinite_stage(m, jb->in, msg, sizeof(msg)) == 1)
            snprintf(msg, sizeof(msg), "no block's output is non-finite in an unscheduled rerun");
    }
    vae_model_destroy(m);
    vae_weights_close(w);
    size_t len = strlen(res->err);
    snprintf(res->err + len, sizeof(res->err) - len, "; %s", msg);
}


/* The child: everything big is created here, so ru_maxrss covers this configuration only. */
/* The child's context for rc; fills res->backend. */
static cw_status open_context(const opts *o, const run_cfg *rc, cw_context **ctx, run_result *res) {
    cw_context_config cc = CW_CONTEXT_CONFIG_INIT;
    cc.backend = o->backend;
    cc.temp_budget = rc->budget > 0 ? rc->budget : 0;
    cc.streams = rc->streams;
    cc.threads = o->threads;
    cc.flags = (rc->trace ? CW_FLAG_TIMING : 0u) | (o->nvtx ? CW_FLAG_NVTX : 0u);
    cc.log_level = o->quiet ? CW_LOG_ERROR : CW_LOG_WARN;
    cw_status st = cw_context_create(ctx, &cc);
    if (st != CW_OK) {
        snprintf(res->err, sizeof(res->err), "context (backend %s): %s (details above)",
                 o->backend == CW_BACKEND_CUDA ? "cuda" : o->backend == CW_BACKEND_CPU ? "cpu" : "auto",
                 cw_status_string(st));
        return st;
    }
    snprintf(res->backend, sizeof(res->backend), "%s", cw_context_get_backend_name(*ctx));
    return CW_OK;
}

/* --memory SIZE without --budget: the temporaries' share of SIZE is cw-vae's to choose. The
 * default budget did not fit: halve the temporary budget from SIZE / 2 down to the least that
 * compiles, and take the first (largest: fewest patches) whose plan fits within SIZE. */
static cw_status fit_memory(const opts *o, vae_model *m, cw_compile_options *co, cw_plan **plan, run_result *res) {
    int64_t least = 0;
    cw_compile_options any = *co;
    any.memory_budget = 0;
    if (cw_graph_min_budget(m->graph, &least, &any) != CW_OK || least < 1) least = 1;
    cw_status st = CW_ERR_BUDGET;
    for (int64_t b = o->memory / 2; st == CW_ERR_BUDGET; b = b / 2 > least ? b / 2 : least) {
        co->temp_budget = b > least ? b : least;
        st = vae_compile(m, co, plan, res->err, sizeof(res->err));
        if (co->temp_budget == least) break;
    }
    return st;
}

/* Compiles m for rc (and --memory auto); over a budget, res says the smallest that works. */
static cw_status compile_for(const opts *o, const run_cfg *rc, const job *jb, vae_model *m, cw_compile_options *co,
                             cw_plan **plan, run_result *res) {
    co->comm = jb->comm; /* a rank: this rank's share of the plan, the output gathered on rank 0 */
    co->gather_rank = 0;
    co->temp_budget = rc->budget;
    /* --memory auto[:PCT]: the ladder's least total whose convs the backend estimates at most
     * PCT % slower than storing everything (cw_compile_options.memory_auto_pct) */
    co->memory_budget = o->memory == MEMORY_AUTO ? (rc->policy == CW_PATCHES_NONE ? 0 : CW_MEMORY_AUTO)
                        : rc->budget < 0 && rc->policy == CW_PATCHES_NONE ? 0
                                                                        : o->memory;
    co->memory_auto_pct = o->auto_pct;
    co->streams = rc->streams;
    co->policy = rc->policy;
    co->patches = rc->patches;
    cw_status st = vae_compile(m, co, plan, res->err, sizeof(res->err));
    if (st == CW_ERR_BUDGET && o->memory > 0 && !o->budget_given && rc->policy != CW_PATCHES_NONE)
        st = fit_memory(o, m, co, plan, res);
    res->temp_budget = co->temp_budget;
    if (st == CW_ERR_BUDGET) {
        res->over_budget = 1;
        res->min_budget = res->min_memory = -1;
        cw_memory_point least;
        int n = 0;
        int64_t mb;
        /* over --memory: the ladder's least; over --budget (the ladder's CW_ERR_BUDGET too):
         * the smallest budget */
        cw_status lst = co->memory_budget > 0 ? cw_graph_memory_ladder(m->graph, &least, &n, 1, co) : CW_ERR_BUDGET;
        if (lst == CW_OK) res->min_memory = least.total_bytes;
        else if (lst == CW_ERR_BUDGET && cw_graph_min_budget(m->graph, &mb, co) == CW_OK) res->min_budget = mb;
    }
    return st;
}

/* --repeat decodes, the best time in res->ms, the working memory and the stats. */
static cw_status run_repeats(const opts *o, vae_model *m, cw_plan *plan, const job *jb, run_result *res, float *out) {
    res->ms = INFINITY;
    if (spinner_on(o) || jb->comm) cw_plan_set_progress(plan, on_progress, res); /* a rank: the parent shows it */
    int64_t rss0 = work_mem_begin();
    for (int i = 0; i < o->repeat; i++) {
        double t0 = now_ms();
        cw_status st = vae_run(m, plan, jb->in, out, res->err, sizeof(res->err));
        double t = now_ms() - t0;
        if (st != CW_OK) return st;
        if (t < res->ms) res->ms = t;
    }
    res->work_mem = work_mem_end(rss0);
    cw_plan_get_stats(plan, &res->stats);
    return CW_OK;
}

/* The child (or a rank): everything big is created here, so ru_maxrss covers this
 * configuration only. */
int run_here(const opts *o, const run_cfg *rc, const job *jb, run_result *res, float *out) {
    cw_context *ctx = NULL;
    vae_weights *w = NULL;
    vae_model *m = NULL;
    cw_plan *plan = NULL;
    cw_compile_options co = CW_COMPILE_OPTIONS_INIT;
    int code = 0, gather = !jb->comm || jb->comm->rank == 0; /* this process holds the whole output */
    res->work_mem = -1;
    cw_status st = open_context(o, rc, &ctx, res);
    if (st != CW_OK) {
        code = exit_for(st);
        goto done;
    }
    int rcw = o->weights ? vae_weights_open_file(&w, o->weights, res->err, sizeof(res->err))
                         : vae_weights_random(&w, o->seed, res->err, sizeof(res->err));
    if (rcw) {
        code = EXIT_USAGE;
        goto done;
    }
    vae_weights_allow_nonfinite(w, o->allow_nonfinite);
    st = vae_build(&m, ctx, &o->cfg, w, o->part, jb->n, jb->h, jb->w, o->dtype, 0, res->err, sizeof(res->err));
    if (st != CW_OK) goto fail;
    vae_weights_close(w); /* the weights now live in the model's tensors */
    w = NULL;
    if ((st = compile_for(o, rc, jb, m, &co, &plan, res)) != CW_OK) goto fail;
    if (rc->describe && gather) {
        char *text = NULL;
        if (cw_plan_describe(plan, &text, 0) == CW_OK) printf("plan (%s):\n%s\n", rc->label, text);
        cw_free(text);
        print_ladder(m, plan, &co);
        if (fflush(stdout) != 0 || ferror(stdout)) { /* --plan is the output asked for: its loss is a failure */
            snprintf(res->err, sizeof(res->err), "--plan: writing to stdout: %s", strerror(errno));
            code = EXIT_RUN;
            goto done;
        }
    }
    if ((st = run_repeats(o, m, plan, jb, res, out)) != CW_OK) goto fail;
    if (rc->trace && jb->trace_tmp && (st = cw_plan_write_trace(plan, jb->trace_tmp)) != CW_OK) {
        snprintf(res->err, sizeof(res->err), "--trace %s: %s", o->trace, cw_context_get_last_error(ctx));
        code = EXIT_RUN;
        goto done;
    }
    int64_t bad = gather ? vae_find_nonfinite(out, jb->out_numel) : -1;
    if (bad >= 0) {
        char where[160];
        vae_index_str(where, sizeof(where), out, bad, m->out_desc.rank, m->out_desc.dims);
        snprintf(res->err, sizeof(res->err), "the %s output has %s", o->part == VAE_DECODER ? "decoded" : "encoded",
                 where);
        res->nonfinite = 1;
        if (!o->allow_nonfinite) {
            cw_plan_destroy(plan);
            plan = NULL;
            vae_model_destroy(m);
            m = NULL;
            diagnose_nonfinite(o, ctx, jb, res);
            code = EXIT_RUN;
        }
    }
    goto done;
fail:
    if (st == CW_ERR_UNSUPPORTED) explain_dtype(o, res);
    code = exit_for(st);
done:
    res->status = st;
    cw_plan_destroy(plan);
    vae_model_destroy(m);
    vae_weights_close(w);
    cw_context_destroy(ctx);
    res->exit_code = code;
    return code;
}

/* ---- signals: the parent stops its child and removes its staged files ------------------------- */

volatile sig_atomic_t g_stop;     /* the signal that asked us to stop, or 0 */
volatile pid_t g_child;           /* the running child, or 0 */

static void on_stop_signal(int sig) {
    g_stop = sig;
    pid_t c = g_child;
    if (c > 0) kill(c, SIGKILL);
}

/* Every signal whose default ends the process and that can be caught: each removes what was
 * staged before cw-vae dies of it. SIGKILL (and SIGSTOP) cannot be caught: after a SIGKILL
 * of the parent, staged files (*.cw-*) beside the targets are left (the targets are not
 * touched); the child dies with the parent (PR_SET_PDEATHSIG). */
const int stop_signals[N_STOP_SIGNALS] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE, SIGXFSZ};

void install_stop_handlers(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0; /* no SA_RESTART: wait4 returns EINTR */
    for (int i = 0; i < N_STOP_SIGNALS; i++) sigaction(stop_signals[i], &sa, NULL);
}

/* What the child runs: rc on jb, reporting into the area's head (a run_result) and data. */
typedef struct child_job {
    const opts *o;
    const run_cfg *rc;
    const job *jb;
    const child_area *area;
} child_job;

static int child_main(void *arg) {
    const child_job *j = arg;
    return run_here(j->o, j->rc, j->jb, j->area->head, j->area->data);
}

/* Forks, runs rc in the child, waits (showing elapsed time on a terminal after 1 s) and
 * fills *sr with the child's result (head) and output (data) and its peak RSS. Returns the
 * child's exit code, or -1 when a signal asked the parent to stop (the child is then killed
 * and reaped). */
int run_in_child(const opts *o, const run_cfg *rc, const job *jb, const char *progress, child_area *sr) {
    if (child_area_map(sr, sizeof(run_result), (size_t)jb->out_numel * sizeof(float)) != 0) {
        say("mmap of %zu bytes for the output: %s", sr->bytes, strerror(errno));
        return EXIT_RUN;
    }
    run_result *res = sr->head;
    res->exit_code = -1;
    child_job cj = {o, rc, jb, sr};
    child_opts co = {0};
    co.spinner = spinner_on(o);
    co.label = progress;
    co.done = &res->tasks_done;
    co.total = &res->tasks_total;
    co.pid = &g_child;
    co.stop = &g_stop;
    co.die_with_parent = 1;
    child_status st;
    child_call(&st, child_main, &cj, &co);
    if (st.end == CHILD_STOPPED || st.end == CHILD_FAILED) {
        if (st.end == CHILD_FAILED) say("%s", st.err);
        child_area_unmap(sr);
        return st.end == CHILD_STOPPED ? -1 : EXIT_RUN;
    }
    res->peak_rss = st.peak_rss;
    if (st.end == CHILD_KILLED) {
        snprintf(res->err, sizeof(res->err), "%s: child killed by signal %d (%s)", rc->label, st.code,
                 strsignal(st.code));
        res->exit_code = EXIT_RUN;
        res->killed_by = st.code;
        return EXIT_RUN;
    }
    if (st.code != 0 && res->exit_code <= 0) {
        snprintf(res->err, sizeof(res->err), "%s: child exited with status %d", rc->label, st.code);
        res->exit_code = st.code;
    }
    return st.code;
}