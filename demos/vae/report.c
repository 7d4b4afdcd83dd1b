/* cw-vae's reports: byte sizes, the summary line of a run, the --compare / --tune table and
 * its diffusers row, --plan's memory ladder and the message of a failed run. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"

void fmt_bytes(char *buf, size_t len, int64_t b) {
    if (b < 0) snprintf(buf, len, "-");
    else if (b < 1024) snprintf(buf, len, "%" PRId64 " B", b);
    else if (b < (int64_t)1 << 20) snprintf(buf, len, "%.1f KiB", (double)b / 1024.0);
    else if (b < (int64_t)1 << 30) snprintf(buf, len, "%.1f MiB", (double)b / 1048576.0);
    else snprintf(buf, len, "%.2f GiB", (double)b / 1073741824.0);
}

/* --plan: the plans a --memory chooses between at this --budget (cw_graph_memory_ladder),
 * least memory first, the compiled one marked. */
void print_ladder(vae_model *m, const cw_plan *plan, const cw_compile_options *co) {
    cw_memory_point pts[129]; /* the most a ladder has */
    int n = 0;
    if (cw_graph_memory_ladder(m->graph, pts, &n, 129, co) != CW_OK) {
        printf("memory ladder: %s\n\n", cw_context_get_last_error(m->ctx));
        return;
    }
    cw_plan_stats ps;
    cw_plan_get_stats(plan, &ps);
    char w[32];
    fmt_bytes(w, sizeof(w), ps.weights_bytes);
    printf("memory ladder: the smallest --memory (activations + temporaries; weights %s apart) for each\n"
           "amount of recompute, at this --budget; a --memory from one row's total up to the next's runs that row\n"
           "(conv time: the backend's estimate against the last row's, which stores everything)\n",
           w);
    printf("  %-12s %11s %12s %12s %11s %12s %10s\n", "--memory", "total", "activations", "temporaries", "recomputed",
           "extra GFLOP", "conv time");
    const double ref = n > 0 ? pts[n - 1].conv_cost_ms : -1.0;
    for (int i = 0; i < n; i++) {
        char t[32], a[32], b[32];
        fmt_bytes(t, sizeof(t), pts[i].total_bytes);
        fmt_bytes(a, sizeof(a), pts[i].activations_bytes);
        fmt_bytes(b, sizeof(b), pts[i].temp_bytes);
        int self = pts[i].activations_bytes == ps.activations_peak && pts[i].temp_bytes == ps.temp_predicted &&
                   pts[i].n_recomputed == ps.n_recomputed;
        char ct[32] = "-";
        if (ref > 0) snprintf(ct, sizeof(ct), "%.2fx", pts[i].conv_cost_ms / ref);
        printf("  %-12" PRId64 " %11s %12s %12s %11d %12.4g %10s%s\n", pts[i].total_bytes, t, a, b, pts[i].n_recomputed,
               pts[i].recompute_gflop, ct, self ? "  <- this plan" : "");
    }
    printf("\n");
}

/* ---- tables ------------------------------------------------------------------------------------ */

double max_abs_diff(const float *a, const float *b, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= m)) m = d; /* NaN sticks */
    }
    return m;
}

void table_header(void) {
    printf("%-30s %10s %11s %11s %11s %11s %11s %10s\n", "configuration", "time ms", "peak temp", "peak act",
           "peak total", "peak RSS", "work mem", "max|diff|");
}

void table_row(const run_cfg *rc, const run_result *r, int has_diff) {
    char a[32], b[32], c[32], d[32];
    if (r->exit_code != 0) {
        if (r->over_budget && r->min_memory > 0) {
            fmt_bytes(a, sizeof(a), r->min_memory);
            printf("%-30s %10s   over memory (needs --memory %s)\n", rc->label, "-", a);
        } else if (r->over_budget) {
            fmt_bytes(a, sizeof(a), r->min_budget);
            printf("%-30s %10s   over budget (needs %s)\n", rc->label, "-", a);
        } else {
            printf("%-30s %10s   failed: %s\n", rc->label, "-", r->err);
        }
        return;
    }
    fmt_bytes(a, sizeof(a), r->stats.temp_peak);
    fmt_bytes(b, sizeof(b), r->stats.activations_peak);
    fmt_bytes(c, sizeof(c), r->stats.total_peak);
    fmt_bytes(d, sizeof(d), r->peak_rss);
    char e[32] = "-";
    if (r->work_mem >= 0) fmt_bytes(e, sizeof(e), r->work_mem);
    char diff[32] = "-";
    if (has_diff) snprintf(diff, sizeof(diff), "%.3g", r->max_diff);
    printf("%-30s %10.1f %11s %11s %11s %11s %11s %10s\n", rc->label, r->ms, a, b, c, d, e, diff);
}

/* diffusers' row: no library stats; max|diff| against the same unscheduled run. */
void peer_row(const peer_result *p, const float *ref, int64_t n) {
    char label[64], d[32], e[32] = "-";
    snprintf(label, sizeof(label), "%.40s", p->versions);
    char *comma = strchr(label, ',');
    if (comma) *comma = '\0'; /* "diffusers X" */
    fmt_bytes(d, sizeof(d), p->peak_rss);
    if (p->work_mem >= 0) fmt_bytes(e, sizeof(e), p->work_mem);
    printf("%-30s %10.1f %11s %11s %11s %11s %11s %10.3g\n", label, p->ms, "-", "-", "-", d, e, max_abs_diff(p->out, ref, n));
}

/* The scheduled run against diffusers: time and memory ratios, and how far apart the outputs are. */
void peer_summary(const peer_result *p, const run_result *b, const float *out, int64_t n) {
    double md = max_abs_diff(out, p->out, n), mx = 0;
    for (int64_t i = 0; i < n; i++)
        if (fabs((double)p->out[i]) > mx) mx = fabs((double)p->out[i]);
    printf("scheduled / diffusers: time %.2fx", b->ms / p->ms);
    if (b->work_mem >= 0 && p->work_mem > 0) printf(", work mem %.2fx", (double)b->work_mem / (double)p->work_mem);
    printf("; max|diff| %.3g (%.3g of max|diffusers|)\n", md, mx > 0 ? md / mx : md);
    printf("diffusers: AutoencoderKL.%s, %s, cpu, %d threads (%s)\n", p->encode ? "encode" : "decode", p->versions,
           p->threads, p->python);
}

void label_for(run_cfg *rc) {
    char bud[32];
    fmt_bytes(bud, sizeof(bud), rc->budget);
    if (rc->budget < 0) snprintf(bud, sizeof(bud), "unlimited");
    if (rc->policy == CW_PATCHES_NONE)
        snprintf(rc->label, sizeof(rc->label), "unscheduled (convweave)");
    else if (rc->policy == CW_PATCHES_AUTO)
        snprintf(rc->label, sizeof(rc->label), "%d stream%s, auto, %s", rc->streams, rc->streams > 1 ? "s" : "", bud);
    else
        snprintf(rc->label, sizeof(rc->label), "%d stream%s, %d patches, %s", rc->streams, rc->streams > 1 ? "s" : "",
                 rc->patches, bud);
}

void cfg_from_opts(run_cfg *rc, const opts *o) {
    memset(rc, 0, sizeof(*rc));
    rc->streams = o->streams;
    rc->budget = o->budget;
    rc->policy = o->patches == 0 ? CW_PATCHES_AUTO : o->patches < 0 ? CW_PATCHES_NONE : CW_PATCHES_FIXED;
    rc->patches = o->patches > 0 ? o->patches : 0;
    if (rc->policy == CW_PATCHES_NONE) {
        rc->streams = 1;
        rc->budget = -1;
    }
    rc->trace = o->trace != NULL;
    rc->describe = o->describe;
    label_for(rc);
}

void ref_cfg(run_cfg *rc) {
    memset(rc, 0, sizeof(*rc));
    rc->streams = 1;
    rc->budget = -1; /* the reference is the unscheduled run: no cap */
    rc->policy = CW_PATCHES_NONE;
    label_for(rc);
}

int report_failure(const run_result *r) {
    say("%s", r->err[0] ? r->err : "run failed");
    if (r->over_budget && r->min_memory > 0) {
        char b[32];
        fmt_bytes(b, sizeof(b), r->min_memory);
        fprintf(stderr, "%s: the smallest --memory that works at this --budget is %s (%" PRId64 " bytes): try --memory %" PRId64
                "\n", prog, b, r->min_memory, r->min_memory);
    } else if (r->over_budget && r->min_budget > 0) {
        char b[32];
        fmt_bytes(b, sizeof(b), r->min_budget);
        fprintf(stderr, "%s: the smallest budget that works is %s (%" PRId64 " bytes): try --budget %" PRId64 "\n",
                prog, b, r->min_budget, r->min_budget);
    }
    return r->exit_code > 0 ? r->exit_code : EXIT_RUN;
}

void report_single(const run_result *res, const run_cfg *r) {
    char a[32], b[32], c[32], e[32];
    fmt_bytes(a, sizeof(a), res->stats.temp_peak);
    fmt_bytes(b, sizeof(b), res->stats.activations_peak);
    fmt_bytes(c, sizeof(c), res->stats.total_peak);
    fmt_bytes(e, sizeof(e), res->peak_rss);
    char wm[32] = "unknown";
    if (res->work_mem >= 0) fmt_bytes(wm, sizeof(wm), res->work_mem);
    printf("%s backend, %s: %.1f ms; peak temp %s, peak activations %s, peak total %s, peak RSS %s, "
           "working memory %s; %" PRId64 " conv patches, %.1f GFLOP (+%.1f%% halo",
           res->backend, r->label, res->ms, a, b, c, e, wm, res->stats.n_patches, res->stats.conv_gflop,
           res->stats.halo_overhead_pct);
    if (res->stats.n_recomputed > 0)
        printf(", +%.1f GFLOP recomputing %d blocks", res->stats.recompute_gflop, res->stats.n_recomputed);
    printf(")\n");
}
