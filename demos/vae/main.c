/* cw-vae's job: the input read and checked, its size against the machine, the runs in order
 * and the outputs written (cli.c parses, run.c runs a configuration in a child, outputs.c
 * stages and renames, report.c prints). Decodes/encodes with diffusers' AutoencoderKL. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "image.h"
#include "sys.h"

/* ---- the job's size against the machine's memory ------------------------------------------------- */

/* Largest activation of the graph, elements: every level's widest tensor. */
static int64_t largest_activation(const vae_config *c, int part, int64_t n, int64_t h, int64_t w) {
    int64_t best = 0;
    for (int i = 0; i < c->n_blocks; i++) {
        int64_t ch, hh, ww;
        if (part == VAE_DECODER) {
            ch = c->block_out[c->n_blocks - 1 - i];
            if (i > 0 && c->block_out[c->n_blocks - i] > ch) ch = c->block_out[c->n_blocks - i];
            hh = h << i, ww = w << i;
        } else {
            ch = c->block_out[i];
            if (i > 0 && c->block_out[i - 1] > ch) ch = c->block_out[i - 1];
            hh = h >> i, ww = w >> i;
        }
        double e = (double)n * (double)ch * (double)hh * (double)ww;
        if (e > 9e18) return INT64_MAX / 16;
        if ((int64_t)e > best) best = (int64_t)e;
    }
    return best;
}

/* OpenBLAS maps a 128 MiB buffer per thread and, when the address space (ulimit -v) refuses
 * it, retries forever: the run hangs instead of failing. So under a finite RLIMIT_AS the job
 * must leave room for them (128 MiB + 8 KiB each, one per thread and one for the caller). */
static int address_space_check(const opts *o, double need) {
    int64_t left = sys_address_space_left();
    if (left == INT64_MAX) return 0;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int threads = o->threads > 0 ? o->threads : cpus > 0 ? (int)cpus : 1;
    double blas = (double)(threads + 1) * (double)((128 << 20) + (8 << 10));
    if (need + blas <= (double)left) return 0;
    char a[32], b[32], c[32];
    fmt_bytes(a, sizeof(a), left);
    fmt_bytes(b, sizeof(b), (int64_t)fmin(need, 9e18));
    fmt_bytes(c, sizeof(c), (int64_t)blas);
    die_usage("the address-space limit (ulimit -v) leaves %s, and the job needs at least %s plus %s for the BLAS "
              "buffers of %d threads (OpenBLAS hangs without them): raise ulimit -v, or give fewer --threads",
              a, b, c, threads);
    return -1;
}

/* Refuses a job that cannot fit before anything big exists. Returns 0 or EXIT_USAGE. */
static int check_memory(const opts *o, int64_t n, int64_t cin, int64_t h, int64_t w, int64_t out_numel) {
    if (o->no_mem_check) return 0;
    double in_b = (double)n * (double)cin * (double)h * (double)w * 4.0;
    double out_b = (double)out_numel * 4.0 * ((o->compare || o->tune) ? 2 : 1);
    double wt_b = (double)vae_weights_bytes(&o->cfg, o->part) * 2.0; /* f32 staging + the model's copy */
    /* the cpu backend keeps activations in host memory: at least a conv's input and output */
    struct stat s;
    int host_act = o->backend == CW_BACKEND_CPU || (o->backend == CW_BACKEND_AUTO && stat("/dev/nvidiactl", &s) != 0);
    double act_b = host_act ? 2.0 * (double)largest_activation(&o->cfg, o->part, n, h, w) * (double)cw_dtype_size(o->dtype) : 0;
    double need = in_b + out_b + wt_b + act_b;
    if (address_space_check(o, need)) return EXIT_USAGE;
    int64_t have = sys_memory_available();
    if (need <= (double)have) return 0;
    char a[32], b[32], c1[32], d[32], e[32], f[32];
    fmt_bytes(a, sizeof(a), (int64_t)fmin(need, 9e18));
    fmt_bytes(b, sizeof(b), (int64_t)fmin(in_b, 9e18));
    fmt_bytes(c1, sizeof(c1), (int64_t)fmin(out_b, 9e18));
    fmt_bytes(d, sizeof(d), (int64_t)wt_b);
    fmt_bytes(e, sizeof(e), (int64_t)fmin(act_b, 9e18));
    fmt_bytes(f, sizeof(f), have);
    return die_usage("the job needs at least %s of memory (input %s, output %s, weights %s%s%s) and this machine has "
                     "%s: use a smaller --size/--batch/image (or --no-memory-check)",
                     a, b, c1, d, host_act ? ", activations on the cpu backend " : "", host_act ? e : "", f);
}

/* ---- main ---------------------------------------------------------------------------------------- */

/* --encode's images, one batch of one size: 0, or EXIT_USAGE after a message. */
static int load_images(const opts *o, float **in, int64_t d[4]) {
    char err[VAE_ERR_LEN];
    const vae_config *cfg = &o->cfg;
    int64_t up = vae_upscale(cfg);
    for (int i = 0; i < o->n_images; i++) {
        float *x = NULL;
        int64_t xd[4];
        size_t L = strlen(o->images[i]);
        int npy = L > 4 && !strcmp(o->images[i] + L - 4, ".npy");
        int bad = npy ? vae_tensor_load("--encode", o->images[i], &x, xd, err, sizeof(err))
                      : img_read_png(o->images[i], &x, xd, err, sizeof(err));
        if (bad) {
            free(*in);
            return die_usage("%s%s", npy ? "" : "--encode ", err); /* the PNG reader names the file only */
        }
        if (i > 0 && (xd[1] != d[1] || xd[2] != d[2] || xd[3] != d[3])) {
            free(x);
            free(*in);
            return die_usage("--encode %s: %" PRId64 "x%" PRId64 "x%" PRId64 ", the batch's first image is %" PRId64
                             "x%" PRId64 "x%" PRId64 ": images of a batch must have one size",
                             o->images[i], xd[1], xd[2], xd[3], d[1], d[2], d[3]);
        }
        if (xd[1] != cfg->in_channels) {
            free(x);
            free(*in);
            return die_usage("--encode %s: %" PRId64 " channels, the model reads %d (see --in-channels)", o->images[i],
                             xd[1], cfg->in_channels);
        }
        if (xd[2] % up || xd[3] % up) {
            free(x);
            free(*in);
            return die_usage("--encode %s: %" PRId64 "x%" PRId64 " pixels: width and height must be multiples of %" PRId64
                             " (diffusers resizes; cw-vae does not)", o->images[i], xd[3], xd[2], up);
        }
        int64_t per = xd[1] * xd[2] * xd[3], have = i ? d[0] : 0;
        float *p = realloc(*in, (size_t)((have + xd[0]) * per) * sizeof(float));
        if (!p) {
            free(x);
            free(*in);
            return die_usage("out of memory for the images");
        }
        memcpy(p + have * per, x, (size_t)(xd[0] * per) * sizeof(float));
        free(x);
        *in = p;
        memcpy(d, xd, sizeof(xd));
        d[0] = have + xd[0];
    }
    return 0;
}

/* The input batch: latents (decode: a file or seeded random) or images (encode). */
static int load_input(opts *o, float **in, int64_t d[4], int64_t *out_numel) {
    char err[VAE_ERR_LEN];
    const vae_config *cfg = &o->cfg;
    int64_t up = vae_upscale(cfg);
    *in = NULL;
    if (o->part == VAE_ENCODER) {
        if (load_images(o, in, d)) return EXIT_USAGE;
        *out_numel = d[0] * 2 * cfg->latent_channels * (d[2] / up) * (d[3] / up);
        return 0;
    }
    if (o->latent) {
        if (vae_latent_load(o->latent, in, d, err, sizeof(err))) return die_usage("%s", err);
        if (d[1] != cfg->latent_channels) {
            free(*in);
            return die_usage("--latent %s: %" PRId64 " channels, the %s model expects %d (see --latent-channels)", o->latent,
                             d[1], cfg->name, cfg->latent_channels);
        }
        if ((o->height && o->height != d[2] * up) || (o->width && o->width != d[3] * up)) {
            free(*in);
            return die_usage("--latent %s is %" PRId64 "x%" PRId64 " (output %" PRId64 "x%" PRId64
                             "), which disagrees with --size/--height/--width",
                             o->latent, d[2], d[3], d[2] * up, d[3] * up);
        }
    } else {
        if (!o->height) o->height = 512;
        if (!o->width) o->width = o->height;
        if (o->height % up) return die_usage("--size/--height %" PRId64 ": not divisible by %" PRId64, o->height, up);
        if (o->width % up) return die_usage("--size/--width %" PRId64 ": not divisible by %" PRId64, o->width, up);
        d[0] = o->batch;
        d[1] = cfg->latent_channels;
        d[2] = o->height / up;
        d[3] = o->width / up;
    }
    *out_numel = d[0] * cfg->out_channels * d[2] * up * d[3] * up;
    return 0;
}
/* The input's values: a random latent filled, --scaled-latent undone, and NaN/Inf refused
 * (they give garbage silently downstream). Returns 0 or EXIT_USAGE. */
static int check_input_values(const opts *o, float **in, const int64_t d[4], int64_t nin) {
    if (!o->latent && o->part == VAE_DECODER) {
        *in = malloc((size_t)nin * sizeof(float));
        if (!*in) return die_usage("out of memory for %" PRId64 " latents of %" PRId64 "x%" PRId64, d[0], d[2], d[3]);
        vae_latent_random(*in, (size_t)nin, o->seed);
    }
    if (o->scaled_latent && o->part == VAE_DECODER) vae_latent_unscale(&o->cfg, *in, (size_t)nin);
    int64_t bad = o->allow_nonfinite ? -1 : vae_find_nonfinite(*in, nin);
    if (bad < 0) return 0;
    char where[160];
    vae_index_str(where, sizeof(where), *in, bad, 4, d);
    if (o->part == VAE_ENCODER) return die_usage("--encode: the images have %s (--allow-nonfinite encodes it anyway)", where);
    return die_usage("--latent %s: %s%s (--allow-nonfinite decodes it anyway)", o->latent ? o->latent : "(random)", where,
                     o->scaled_latent ? " after --scaled-latent" : "");
}

/* The job's inputs (for messages) and the run's output shape. */
typedef struct plan_io {
    float *in;
    int64_t d[4], out_numel, out_dims[4];
} plan_io;

/* Everything before the first child: the input read and checked, the job's size, the
 * outputs checked and staged, the weights' keys checked. Returns 0 or an exit code (with
 * nothing staged and io->in freed). */
static int prepare(opts *o, plan_io *io) {
    const vae_config *cfg = &o->cfg;
    int64_t up = vae_upscale(cfg), *d = io->d;
    int rc;
    /* the input (small) is read here; the weights only in the children */
    if ((rc = load_input(o, &io->in, d, &io->out_numel))) return rc;
    int64_t nin = d[0] * d[1] * d[2] * d[3];
    int dec = o->part == VAE_DECODER;
    io->out_dims[0] = d[0];
    io->out_dims[1] = dec ? cfg->out_channels : 2 * cfg->latent_channels;
    io->out_dims[2] = dec ? d[2] * up : d[2] / up;
    io->out_dims[3] = dec ? d[3] * up : d[3] / up;
    /* the job's size, before anything big exists (a random latent is not filled yet) */
    if ((rc = check_memory(o, d[0], d[1], d[2], d[3], io->out_numel))) goto fail;
    /* the inputs, and the outputs that may name none of them nor each other */
    const char *inputs[MAX_IMAGES + 4], *in_flags[MAX_IMAGES + 4];
    int n_in = 0;
    if (o->weights) inputs[n_in] = o->weights, in_flags[n_in++] = o->model ? "--model" : "--weights";
    if (o->model) inputs[n_in] = o->model_config, in_flags[n_in++] = "--model";
    if (o->latent) inputs[n_in] = o->latent, in_flags[n_in++] = "--latent";
    for (int i = 0; i < o->n_images; i++) inputs[n_in] = o->images[i], in_flags[n_in++] = "--encode";
    if ((rc = outputs_add(o, d[0])) || (rc = outputs_check(inputs, in_flags, n_in))) goto fail;
    if ((rc = check_input_values(o, &io->in, d, nin))) goto fail;
    /* bad weights fail once, here, before any child runs (header only: no data is read) */
    if (o->weights) {
        char err[VAE_ERR_LEN];
        vae_weights *w = NULL;
        if (vae_weights_open_file(&w, o->weights, err, sizeof(err)) || vae_weights_check(w, cfg, o->part, err, sizeof(err))) {
            vae_weights_close(w);
            rc = die_usage("%s", err);
            goto fail;
        }
        vae_weights_close(w);
    }
    if ((rc = outputs_stage())) goto fail;
    return 0;
fail:
    free(io->in);
    io->in = NULL;
    outputs_free();
    return rc;
}

static void print_banner(const opts *o, const plan_io *io) {
    const vae_config *cfg = &o->cfg;
    const char *dt = o->dtype == CW_F32 ? "f32" : o->dtype == CW_F16 ? "f16" : "bf16";
    char bud[32];
    fmt_bytes(bud, sizeof(bud), o->budget);
    printf("cw-vae %s: %s, %s %s, %" PRId64 " x %" PRId64 "x%" PRId64 "x%" PRId64 " -> %" PRId64 "x%" PRId64
           "x%" PRId64 ", %s weights, %s, budget %s\n",
           cw_version_string(), o->part == VAE_DECODER ? "decode" : "encode", o->model ? "model" : "preset",
           o->model ? o->model : cfg->name, io->d[0], io->d[1], io->d[2], io->d[3], io->out_dims[1], io->out_dims[2],
           io->out_dims[3], o->weights ? o->weights : "random", dt,
           o->memory > 0 && !o->budget_given ? "chosen within --memory" : o->budget < 0 ? "unlimited" : bud);
    if (cfg->force_upcast && o->dtype != CW_F32 && o->model)
        printf("note: %s has force_upcast: diffusers runs this VAE in f32; --dtype %s may overflow\n", o->model_config,
               dt);
    fflush(stdout);
}

/* One configuration: its output in *final. Returns 0 or an exit code. */
static int run_single(const opts *o, const job *jb, const char *verb, child_area *final) {
    run_cfg r;
    cfg_from_opts(&r, o);
    child_area sr;
    int code = run_in_child(o, &r, jb, verb, &sr);
    if (code < 0) stop_now();
    if (code != 0) {
        int ret = sr.head ? report_failure(sr.head) : code;
        child_area_unmap(&sr);
        return ret;
    }
    const run_result *res = sr.head;
    if (res->temp_budget != r.budget) { /* --memory alone chose the temporaries' share */
        r.budget = res->temp_budget;
        label_for(&r);
    }
    if (!o->quiet) report_single(res, &r);
    *final = sr;
    return 0;
}

/* --tune: streams 1-4 x patches auto,2,4,8 at --budget; else the one from the flags. */
static int scheduled_cfgs(const opts *o, run_cfg cfgs[16]) {
    int n = 0;
    if (!o->tune) {
        cfg_from_opts(&cfgs[n++], o);
        return n;
    }
    static const int pol[4] = {0, 2, 4, 8};
    for (int s = 1; s <= 4; s++)
        for (int p = 0; p < 4; p++) {
            run_cfg *c = &cfgs[n++];
            memset(c, 0, sizeof(*c));
            c->streams = s;
            c->budget = o->budget;
            c->policy = pol[p] ? CW_PATCHES_FIXED : CW_PATCHES_AUTO;
            c->patches = pol[p];
            label_for(c);
        }
    return n;
}

/* Runs the scheduled configurations against the reference output; the first that ran gives
 * *final (and *out_cfg). Returns 0 or an exit code (every area but rs unmapped then). */
static int run_scheduled(const opts *o, const job *jb, const run_cfg *cfgs, int n, int total, const float *ref_out,
                         run_result *results, child_area *final, int *out_cfg) {
    char label[96];
    for (int i = 0; i < n; i++) {
        child_area sr;
        snprintf(label, sizeof(label), "[%d/%d] %.63s", i + 2, total, cfgs[i].label);
        int code = run_in_child(o, &cfgs[i], jb, label, &sr);
        if (code < 0) stop_now();
        run_result *res = sr.head;
        if (!res) {
            child_area_unmap(final);
            return code;
        }
        if (code == 0) res->max_diff = max_abs_diff(sr.data, ref_out, jb->out_numel);
        results[i] = *res;
        /* --tune keeps going past a configuration over budget, but not past a child killed by
         * a signal (the OOM killer, a crash): that is a failure of the run, as in a single run */
        if (code != 0 && (!o->tune || res->nonfinite || res->killed_by)) {
            int ret = report_failure(res);
            child_area_unmap(&sr);
            child_area_unmap(final);
            return ret;
        }
        /* outputs get the first scheduled configuration that ran (all agree with the
         * reference within the printed max|diff|) */
        if (code == 0 && !final->head) {
            *final = sr;
            *out_cfg = i;
        } else {
            child_area_unmap(&sr);
        }
    }
    return 0;
}

/* recommended: the lowest peak RSS among the runs within 3% of the fastest, so timing
 * noise does not pick a configuration that only looks faster */
static int pick_best(const run_result *results, int n) {
    int best = -1;
    double fastest = INFINITY;
    for (int i = 0; i < n; i++)
        if (results[i].exit_code == 0 && results[i].ms < fastest) fastest = results[i].ms;
    for (int i = 0; i < n; i++)
        if (results[i].exit_code == 0 && results[i].ms <= 1.03 * fastest &&
            (best < 0 || results[i].peak_rss < results[best].peak_rss))
            best = i;
    return best;
}

/* --compare: diffusers on the same config, weights and input, in a Python child. */
static void run_peer(const opts *o, const job *jb, const plan_io *io, const run_result *ref_res, peer_result *peer) {
    memset(peer, 0, sizeof(*peer));
    if (!o->compare) return;
    if (!strcmp(ref_res->backend, "cuda")) {
        peer->skipped = 1;
        snprintf(peer->note, sizeof(peer->note), "convweave ran on the cuda backend and the diffusers row runs on the cpu");
        return;
    }
    char label[96];
    snprintf(label, sizeof(label), "[3/3] diffusers");
    peer_job pj = {&o->cfg, o->part, o->weights, o->seed, o->allow_nonfinite, jb->in,
                   {io->d[0], io->d[1], io->d[2], io->d[3]}, jb->out_numel, o->threads, o->repeat, o->dtype,
                   spinner_on(o), label};
    if (peer_diffusers_run(&pj, peer, &g_child, &g_stop) < 0) stop_now();
}

/* The table, then the recommendation (--tune) or the ratios (--compare). */
static void print_comparison(const opts *o, const run_cfg *ref, const run_result *ref_res, const float *ref_out,
                             const run_cfg *cfgs, const run_result *results, int n, int best, const peer_result *peer,
                             const child_area *final, int64_t out_numel) {
    printf("\n%s backend; time = %s only (best of %d); peak temp/act/total from the library's stats;\n"
           "peak RSS = ru_maxrss of a separate process per configuration; work mem = its peak resident\n"
           "bytes during the run minus those just before it (model loaded); max|diff| vs convweave's own\n"
           "unscheduled run (no patches, no budget)%s\n",
           ref_res->backend, o->part == VAE_DECODER ? "decode" : "encode", o->repeat,
           peer->ran ? "; diffusers = AutoencoderKL on PyTorch, same weights and input" : "");
    table_header();
    table_row(ref, ref_res, 0);
    for (int i = 0; i < n; i++) table_row(&cfgs[i], &results[i], 1);
    if (peer->ran) peer_row(peer, ref_out, out_numel);
    if (best < 0) return;
    const run_result *b = &results[best];
    if (o->tune) {
        printf("\nrecommended: --streams %d --patches ", cfgs[best].streams);
        if (cfgs[best].policy == CW_PATCHES_AUTO) printf("auto");
        else printf("%d", cfgs[best].patches);
        printf("  (%.1f ms, %.2fx the unscheduled run's time, %.2fx its peak RSS)\n", b->ms, b->ms / ref_res->ms,
               (double)b->peak_rss / (double)ref_res->peak_rss);
    } else {
        printf("\nscheduled / unscheduled: time %.2fx, peak RSS %.2fx, peak total %.2fx\n", b->ms / ref_res->ms,
               (double)b->peak_rss / (double)ref_res->peak_rss,
               ref_res->stats.total_peak > 0 ? (double)b->stats.total_peak / (double)ref_res->stats.total_peak : 0.0);
        if (peer->ran) peer_summary(peer, b, final->data, out_numel);
        else printf("diffusers: %s%s\n", peer->skipped ? "skipped: " : "", peer->note);
    }
}

/* --compare / --tune: the reference first, then the scheduled configuration(s), then
 * diffusers. Returns 0 with the output in *final, or an exit code. */
static int run_many(const opts *o, const job *jb, const plan_io *io, child_area *final) {
    run_cfg ref, cfgs[16];
    ref_cfg(&ref);
    child_area rs;
    int total = o->tune ? 17 : 3; /* --compare: the reference, the scheduled run, diffusers */
    char label[96];
    snprintf(label, sizeof(label), "[1/%d] %s", total, ref.label);
    int code = run_in_child(o, &ref, jb, label, &rs);
    if (code < 0) stop_now();
    if (code != 0) {
        int ret = rs.head ? report_failure(rs.head) : code;
        child_area_unmap(&rs);
        return ret;
    }
    const run_result *ref_res = rs.head;
    int n = scheduled_cfgs(o, cfgs), out_cfg = -1;
    run_result results[16];
    int ret = run_scheduled(o, jb, cfgs, n, total, rs.data, results, final, &out_cfg);
    if (ret) {
        child_area_unmap(&rs);
        return ret;
    }
    int best = pick_best(results, n);
    peer_result peer;
    run_peer(o, jb, io, ref_res, &peer);
    print_comparison(o, &ref, ref_res, rs.data, cfgs, results, n, best, &peer, final, jb->out_numel);
    peer_result_free(&peer);
    if (best < 0) {
        say("no configuration fits the budget");
        child_area_unmap(&rs);
        child_area_unmap(final);
        return EXIT_USAGE;
    }
    if (o->tune && outputs_any() && !o->quiet) printf("output from: %s\n", cfgs[out_cfg].label);
    child_area_unmap(&rs);
    return 0;
}

/* Tables, --plan and summaries go to stdout: a write error there (a full disk, /dev/full,
 * a closed pipe) is a failure, not a silent loss. Returns 0, or -1 after a message. */
static int stdout_check(const char *then) {
    if (fflush(stdout) == 0 && !ferror(stdout)) return 0;
    int e = errno;
    if (then) say("writing to stdout: %s (%s)", strerror(e), then);
    return -1;
}

int main(int argc, char **argv) {
    opts o;
    int rc = cli_parse_args(argc, argv, &o);
    if (rc) return rc;
    o.argc = argc, o.argv = argv;
    if (o.rank_area) rank_main(&o); /* a rank of --ranks: never returns */
    install_stop_handlers();
    plan_io io = {0};
    if ((rc = prepare(&o, &io))) return rc;
    if (g_stop) stop_now();
    if (!o.quiet) print_banner(&o, &io);
    job jb = {io.in, io.d[0], io.d[2], io.d[3], io.out_numel, outputs_trace_tmp(), NULL};
    child_area final = {0}; /* the run whose output is written */
    int ret = o.ranks > 1                ? run_ranks(&o, &jb, &final)
              : !o.compare && !o.tune ? run_single(&o, &jb, o.part == VAE_DECODER ? "decoding" : "encoding", &final)
                                      : run_many(&o, &jb, &io, &final);
    if (ret < 0) stop_now();
    if (ret == 0) {
        const run_result *fres = final.head;
        if (fres->nonfinite) /* only with --allow-nonfinite: the child fails otherwise */
            say("warning: %s (written anyway: --allow-nonfinite)", fres->err);
        ret = stdout_check("nothing written") ? EXIT_RUN : outputs_finish(&o, final.data, io.out_dims);
        child_area_unmap(&final);
    }
    if (stdout_check(ret ? NULL : "outputs written") && !ret) ret = EXIT_RUN;
    outputs_free();
    free(io.in);
    if (g_stop) stop_now();
    return ret;
}
