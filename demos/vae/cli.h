/* cw-vae's own declarations, shared by its files: the options (cli.c), one configuration and
 * its result (run.c), the staged outputs (outputs.c) and the tables (report.c). Not a
 * library interface: main.c, cli.c, run.c, outputs.c and report.c only. */
#ifndef CWVAE_CLI_H
#define CWVAE_CLI_H

#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "convweave/convweave.h"
#include "child.h"
#include "peer.h"
#include "vae.h"

#define MEMORY_AUTO (-1)       /* opts.memory: chosen from the memory ladder */

enum { EXIT_USAGE = 2, EXIT_RUN = 1 };

#define MAX_IMAGES 64

typedef struct opts {
    vae_config cfg;
    int part;                /* VAE_DECODER, or VAE_ENCODER with --encode */
    int64_t height, width;   /* output pixels; 0: from the latent or 512 */
    int64_t batch;           /* --batch: random latents per run */
    int64_t budget;          /* bytes; -1 unlimited */
    int budget_given;
    int64_t memory;          /* --memory: cap on activations + temporaries, bytes; 0 none;
                                MEMORY_AUTO: the least the memory ladder gives for at most
                                auto_pct % more conv time */
    double auto_pct;         /* --memory auto[:PCT] */
    int streams;
    int patches;             /* 0 auto, -1 none, N fixed */
    cw_backend_kind backend;
    cw_dtype dtype;
    int threads;
    int compare, tune, nvtx, quiet, describe, repeat;
    const char *trace, *weights, *latent, *output, *raw, *model, *latent_out;
    const char *images[MAX_IMAGES];
    int n_images;
    char model_config[PATH_MAX], model_weights[PATH_MAX];
    int random_weights, scaled_latent, allow_nonfinite, sample, no_mem_check;
    uint64_t seed;
    int ranks;               /* --ranks: processes of one decode (mpirun); 1: this process */
    int compare_ranks;       /* --compare-ranks: the one-process run first, then the ranks */
    double comm_timeout;     /* --comm-timeout: seconds a message may take (default 600) */
    const char *rank_area;   /* internal: set in the ranks mpirun starts (ranks.c) */
    int argc;                /* the command line, for the ranks' mpirun */
    char **argv;
} opts;

#define MAX_RANKS 32 /* the most cw_graph_compile takes (cw_comm.n_ranks 1..32) */

/* One configuration to run in a child. */
typedef struct run_cfg {
    char label[64];
    cw_patch_policy policy;
    int patches;
    int streams;
    int64_t budget;   /* -1 unlimited */
    int trace;        /* write opts.trace */
    int describe;
} run_cfg;

/* What a child reports back through the shared mapping (the output follows it). */
typedef struct run_result {
    int exit_code;          /* 0 ok, EXIT_USAGE bad input / budget, EXIT_RUN library failure */
    int status;             /* cw_status of the failure */
    int over_budget;        /* compile refused the budget */
    int64_t min_budget;     /* then: the smallest that works (-1 unknown) */
    int64_t min_memory;     /* with --memory: the smallest --memory that works at this budget
                               (-1 unknown, or the budget itself is too small) */
    char err[VAE_ERR_LEN];
    char backend[16];
    double ms;              /* best decode time over --repeat runs, ms */
    cw_plan_stats stats;
    int64_t peak_rss;       /* filled by the parent: ru_maxrss of the child, bytes */
    int64_t work_mem;       /* the child's decode working memory: its peak resident bytes during
                               the decodes minus its resident bytes just before (-1 unknown) */
    volatile int64_t tasks_done, tasks_total; /* the child's decode progress, for the bar */
    double max_diff;        /* filled by the parent: vs the reference */
    int nonfinite;          /* the output holds NaN/Inf (err says where) */
    int killed_by;          /* filled by the parent: the signal that ended the child, or 0 */
    int64_t temp_budget;    /* the temporary budget compiled with (--memory alone chooses it) */
} run_result;

/* The input of every run: [n, c, h, w] f32 on the host. */
typedef struct job {
    const float *in;
    int64_t n, h, w;        /* batch and the input's spatial size */
    int64_t out_numel;      /* the graph's output */
    const char *trace_tmp;  /* where the scheduled run writes --trace (staged) */
    const cw_comm *comm;    /* a rank of --ranks: its communicator (gather to rank 0); else NULL */
} job;

extern const char *prog;

/* ---- cli.c: options and usage */
/* Parses argv into *o (architecture from the preset or --model, then flags over it) and
 * checks the combination. Returns 0 or EXIT_USAGE after one line on stderr. */
int cli_parse_args(int argc, char **argv, opts *o);
/* "prog: MESSAGE" on stderr; returns EXIT_USAGE. */
#if defined(__GNUC__)
__attribute__((format(printf, 1, 2)))
#endif
int die_usage(const char *fmt, ...);
/* The same line without the exit code (control bytes escaped: one line whatever the paths). */
#if defined(__GNUC__)
__attribute__((format(printf, 1, 2)))
#endif
void say(const char *fmt, ...);

/* ---- run.c: one configuration in a forked child, and the signals that stop it */
extern volatile sig_atomic_t g_stop;   /* the signal that asked us to stop, or 0 */
extern volatile pid_t g_child;         /* the running child, or 0 */
#define N_STOP_SIGNALS 6
extern const int stop_signals[N_STOP_SIGNALS]; /* SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE, SIGXFSZ */
void install_stop_handlers(void);
/* A progress display only on a terminal, and not with --quiet. */
int spinner_on(const opts *o);
/* Forks, runs rc in the child, waits and fills *sr with the child's result (head) and
 * output (data). Returns the child's exit code, or -1 when a signal asked us to stop. */
int run_in_child(const opts *o, const run_cfg *rc, const job *jb, const char *progress, child_area *sr);
/* rc on jb in this process (a rank of --ranks: jb->comm set): context, weights, model,
 * compile, the decodes; the result in *res and, on the gather rank, the output in out.
 * Returns 0 or an exit code (res->err says why). */
int run_here(const opts *o, const run_cfg *rc, const job *jb, run_result *res, float *out);

/* ---- ranks.c: --ranks N, one decode over N processes (mpirun, MPI point-to-point) */
/* --ranks N > 1 in the process the user started: mpirun -n N runs cw-vae's ranks, which
 * share an area with this process (input in, output and each rank's result out); prints the
 * per-rank table (after the one-process run with --compare-ranks). Returns 0 with the output
 * in *final (unmapped by the caller), or an exit code. */
int run_ranks(const opts *o, const job *jb, child_area *final);
/* A rank that mpirun started (opts.rank_area set): never returns. */
void rank_main(opts *o);

/* ---- outputs.c: outputs checked, staged beside their targets, renamed together */
/* Registers -o (one per sample), --raw, --latent-out and --trace. Returns 0 or EXIT_USAGE. */
int outputs_add(const opts *o, int64_t batch);
/* Every output: not an input, not another output, a regular file if it exists. */
int outputs_check(const char *const *inputs, const char *const *in_flags, int n_in);
/* Creates every staged file beside its target. Returns 0 or EXIT_USAGE. */
int outputs_stage(void);
/* The staged path of --trace, or NULL. */
const char *outputs_trace_tmp(void);
/* 1 when any output is registered. */
int outputs_any(void);
/* Writes the results into the staged files and renames all into place. Returns 0 or an
 * exit code (nothing renamed then, every staged file removed). */
int outputs_finish(const opts *o, const float *out, const int64_t dims[4]);
/* Removes what was staged and forgets every output. */
void outputs_free(void);
/* Stopped by a signal: remove what was staged, then die of the same signal. */
void stop_now(void);

/* ---- report.c: lines and tables */
void fmt_bytes(char *buf, size_t len, int64_t b);
double max_abs_diff(const float *a, const float *b, int64_t n);
void label_for(run_cfg *rc);
void cfg_from_opts(run_cfg *rc, const opts *o);
void ref_cfg(run_cfg *rc);
void table_header(void);
void table_row(const run_cfg *rc, const run_result *r, int has_diff);
void peer_row(const peer_result *p, const float *ref, int64_t n);
void peer_summary(const peer_result *p, const run_result *b, const float *out, int64_t n);
/* --plan: the memory ladder at this --budget, the compiled plan marked. */
void print_ladder(vae_model *m, const cw_plan *plan, const cw_compile_options *co);
/* The error of a failed run (and the smallest budget or memory that works); its exit code. */
int report_failure(const run_result *r);
/* The one summary line of a single run. */
void report_single(const run_result *res, const run_cfg *r);

#endif
