/* cw-vae: decodes Stable Diffusion / SDXL / SD3 / FLUX latents with the AutoencoderKL
 * decoder (or encodes images with its encoder) under a temporary-memory budget. Every
 * configuration (scheduled, reference, each --tune setting) runs in its own forked child
 * so its peak RSS can be measured alone. Nothing the user gave is lost: outputs are
 * checked before the run, staged beside their targets and renamed together at the end. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <limits.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define MEMORY_AUTO (-1)       /* opts.memory: chosen from the memory ladder */
#define AUTO_RECOMPUTE_PCT 10  /* --memory auto pays at most this many % more conv FLOPs */

#include "convweave/convweave.h"
#include "child.h"
#include "image.h"
#include "npy.h"
#include "peer.h"
#include "safetensors.h"
#include "vae.h"

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
                                auto_pct % more conv FLOPs */
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
} opts;

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
} run_result;

static const char *prog = "cw-vae";

/* Runs on a library thread in the child: publish the decode's progress to the parent
 * through the shared result mapping. */
static void on_progress(void *user, int64_t done, int64_t total) {
    run_result *r = user;
    r->tasks_total = total;
    r->tasks_done = done;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: %s [options]\n"
            "Decodes latents with the AutoencoderKL decoder (diffusers' AutoencoderKL.decode), or with\n"
            "--encode encodes images (AutoencoderKL.encode), under a temporary-memory budget, scheduling\n"
            "every convolution in row patches across streams.\n"
            "\n"
            "model (a preset, or a diffusers folder; any flag below overrides either)\n"
            "  --preset NAME         %s (default sd)\n"
            "  --model DIR           diffusers AutoencoderKL folder (config.json + diffusion_pytorch_model\n"
            "                        .safetensors), or a pipeline folder with vae/ in it\n"
            "  --channels LIST       block_out_channels, e.g. 128,256,512,512\n"
            "  --layers N            layers_per_block (each up block has N+1 ResNets, each down block N)\n"
            "  --groups N            norm_num_groups (32 for sd..flux)\n"
            "  --latent-channels N   latent channels (4 for sd/sdxl, 16 for sd3/flux)\n"
            "  --in-channels N, --out-channels N  image channels (3)\n"
            "  --quant-conv 0|1, --post-quant-conv 0|1, --mid-attention 0|1\n"
            "  --scaling-factor X, --shift-factor X   the latent scaling of --scaled-latent\n"
            "  --weights FILE        diffusers .safetensors (encoder.*, quant_conv.*, decoder.*,\n"
            "                        post_quant_conv.*; F32/F16/BF16); every key must belong to the model\n"
            "  --random-weights      seeded random weights instead (std 1/sqrt(fan_in))\n"
            "  --seed N              seed of random weights, a random latent and --sample (default 0)\n"
            "  --allow-nonfinite     accept NaN/Inf in weights, latents, images and the output\n"
            "decode (default)\n"
            "  --latent FILE         latents [N,C,h,w] or [C,h,w] from .safetensors (one tensor) or .npy;\n"
            "                        without it seeded standard-normal latents are used\n"
            "  --batch N             random latents: N of them (default 1)\n"
            "  --scaled-latent       the latent is scaled as in a pipeline: z = z / scaling + shift first\n"
            "  --size N              output N x N pixels (latent N/8 for 4 blocks; default 512)\n"
            "  --height N, --width N output height / width in pixels\n"
            "  -o, --output FILE     PNG ([-1,1] -> [0,255] as diffusers); with N > 1 samples FILE-0.png, ...\n"
            "  --raw FILE            the f32 output tensor [N,3,H,W] as .npy\n"
            "encode\n"
            "  --encode IMAGE        an 8-bit PNG (or .npy [N,3,H,W] in [-1,1]); repeat for a batch of\n"
            "                        same-sized images; H and W must be multiples of 8\n"
            "  --latent-out FILE     latents [N,C,h,w] as .npy or .safetensors (tensor 'latent')\n"
            "  --sample              a seeded sample of the Gaussian (--seed) instead of its mean\n"
            "  --scaled-latent       store (z - shift) * scaling, as a pipeline feeds the denoiser\n"
            "scheduling\n"
            "  --budget SIZE         temporary-memory cap: e.g. 512MiB (default), 64MiB, 2GiB, 1GB,\n"
            "                        1048576 (bytes); units B KiB MiB GiB KB MB GB; 'unlimited'\n"
            "  --memory auto[:PCT]|none|SIZE  cap on activations + temporaries (weights apart):\n"
            "                        where storing every activation needs more, ResNet blocks' inner\n"
            "                        activations are recomputed band by band (exact; costs FLOPs, printed).\n"
            "                        auto (default): the least memory the ladder (--plan) gives for at\n"
            "                        most PCT %% (default 10) more conv FLOPs; none: store everything\n"
            "  --streams N           1 = in order; N = N-1 heavy streams + 1 light (default 2)\n"
            "  --patches auto|N|none row patches per conv: fewest that fit, fixed N, or unscheduled\n"
            "                        (none ignores any budget: giving both is an error)\n"
            "  --backend auto|cpu|cuda (default auto: cuda where a device is usable, else cpu)\n"
            "  --dtype f32|f16|bf16  compute dtype (default f32; others only where the backend has them)\n"
            "  --threads N           cpu: BLAS threads in total (default all cores)\n"
            "  --no-memory-check     skip the up-front check of the job's size against the machine's memory\n"
            "measurement\n"
            "  --compare             also run the unscheduled single-stream reference (patches none,\n"
            "                        no budget) and diffusers' AutoencoderKL on the same weights and\n"
            "                        input, and print one table with max|diff| against the reference.\n"
            "                        diffusers runs in CONVWEAVE_PYTHON, else the venv's python\n"
            "                        ($CONVWEAVE_VENV or ~/.cache/convweave/venv), else python3; without\n"
            "                        torch + diffusers there it is skipped with a note\n"
            "  --tune                run streams 1-4 x patches auto,2,4,8 within the budget, print the\n"
            "                        table and the recommended setting\n"
            "  --repeat N            run N times per configuration, report the fastest (default 1)\n"
            "  --trace FILE          Chrome/Perfetto trace of the scheduled run\n"
            "  --nvtx                emit NVTX ranges (cuda, for Nsight Systems)\n"
            "  --plan                print the compiled plan (patches, algorithms, workspaces) and the\n"
            "                        memory ladder: the smallest --memory for each amount of recompute\n"
            "  -q, --quiet           no progress or summary lines (tables and errors still print)\n"
            "  -h, --help            this text\n"
            "\n"
            "Outputs (-o, --raw, --latent-out, --trace) may not name an input or each other, and only\n"
            "regular files are replaced. Each is staged beside its target before the run (so an\n"
            "unwritable one fails first) and all are renamed into place together once every one is\n"
            "complete; a failure or SIGINT/SIGTERM leaves the targets as they were.\n"
            "Peak RSS: each configuration runs in its own forked child process, forked before any\n"
            "weights or activations exist; the child loads the weights, builds, compiles, runs and\n"
            "writes its output into a shared mapping; its peak RSS is ru_maxrss from wait4(), i.e.\n"
            "everything resident in that process (libraries, weights, activations, temporaries,\n"
            "the output). Time is the run alone (upload, run, download), not loading or compiling.\n"
            "Exit status: 0 ok, 1 a run failed (or its output is not finite), 2 bad input (option,\n"
            "file, key, shape, budget, memory); 128+N when stopped by signal N.\n",
            prog, vae_preset_names());
}

#if defined(__GNUC__)
__attribute__((format(printf, 1, 2)))
#endif
static int die_usage(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", prog);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return EXIT_USAGE;
}

/* ---- option parsing ------------------------------------------------------------------------- */

/* "512MiB", "1.5gib", "64MB", "1e9", "unlimited" -> bytes (-1 unlimited): cw_parse_size's
 * grammar, the Python package's too. */
static int parse_size(const char *s, int64_t *out) { return cw_parse_size(s, out) == CW_OK ? 0 : -1; }

static int parse_int(const char *s, int64_t lo, int64_t hi, int64_t *out) {
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end || errno || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

static void fmt_bytes(char *buf, size_t len, int64_t b) {
    if (b < 0) snprintf(buf, len, "-");
    else if (b < 1024) snprintf(buf, len, "%" PRId64 " B", b);
    else if (b < (int64_t)1 << 20) snprintf(buf, len, "%.1f KiB", (double)b / 1024.0);
    else if (b < (int64_t)1 << 30) snprintf(buf, len, "%.1f MiB", (double)b / 1048576.0);
    else snprintf(buf, len, "%.2f GiB", (double)b / 1073741824.0);
}

enum {
    OPT_PRESET = 256, OPT_CHANNELS, OPT_LAYERS, OPT_LATENT_CH, OPT_WEIGHTS, OPT_RANDOM, OPT_SEED,
    OPT_LATENT, OPT_SCALED, OPT_SIZE, OPT_HEIGHT, OPT_WIDTH, OPT_RAW, OPT_BUDGET, OPT_MEMORY, OPT_STREAMS,
    OPT_PATCHES, OPT_BACKEND, OPT_DTYPE, OPT_THREADS, OPT_COMPARE, OPT_TUNE, OPT_REPEAT, OPT_TRACE,
    OPT_NVTX, OPT_PLAN, OPT_MODEL, OPT_GROUPS, OPT_IN_CH, OPT_OUT_CH, OPT_QC, OPT_PQC, OPT_MIDATT,
    OPT_SCALING, OPT_SHIFT, OPT_NONFINITE, OPT_BATCH, OPT_ENCODE, OPT_LATENT_OUT, OPT_SAMPLE, OPT_NO_MEM
};

/* An architecture flag's value, applied over the preset or config.json once all are read. */
typedef struct arch_flags {
    const char *channels;
    int64_t layers, groups, latent_ch, in_ch, out_ch, qc, pqc, midatt;
    double scaling, shift;
    int has_scaling, has_shift;
} arch_flags;

static int parse_double(const char *s, double *out) {
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || errno || !isfinite(v)) return -1;
    *out = v;
    return 0;
}

static int parse_args(int argc, char **argv, opts *o) {
    static const struct option longopts[] = {
        {"preset", required_argument, 0, OPT_PRESET},   {"channels", required_argument, 0, OPT_CHANNELS},
        {"layers", required_argument, 0, OPT_LAYERS},   {"latent-channels", required_argument, 0, OPT_LATENT_CH},
        {"weights", required_argument, 0, OPT_WEIGHTS}, {"random-weights", no_argument, 0, OPT_RANDOM},
        {"seed", required_argument, 0, OPT_SEED},       {"latent", required_argument, 0, OPT_LATENT},
        {"scaled-latent", no_argument, 0, OPT_SCALED},  {"size", required_argument, 0, OPT_SIZE},
        {"height", required_argument, 0, OPT_HEIGHT},   {"width", required_argument, 0, OPT_WIDTH},
        {"output", required_argument, 0, 'o'},          {"raw", required_argument, 0, OPT_RAW},
        {"budget", required_argument, 0, OPT_BUDGET},   {"streams", required_argument, 0, OPT_STREAMS},
        {"memory", required_argument, 0, OPT_MEMORY},
        {"patches", required_argument, 0, OPT_PATCHES}, {"backend", required_argument, 0, OPT_BACKEND},
        {"dtype", required_argument, 0, OPT_DTYPE},     {"threads", required_argument, 0, OPT_THREADS},
        {"compare", no_argument, 0, OPT_COMPARE},       {"tune", no_argument, 0, OPT_TUNE},
        {"repeat", required_argument, 0, OPT_REPEAT},   {"trace", required_argument, 0, OPT_TRACE},
        {"nvtx", no_argument, 0, OPT_NVTX},             {"plan", no_argument, 0, OPT_PLAN},
        {"model", required_argument, 0, OPT_MODEL},     {"groups", required_argument, 0, OPT_GROUPS},
        {"in-channels", required_argument, 0, OPT_IN_CH}, {"out-channels", required_argument, 0, OPT_OUT_CH},
        {"quant-conv", required_argument, 0, OPT_QC},   {"post-quant-conv", required_argument, 0, OPT_PQC},
        {"mid-attention", required_argument, 0, OPT_MIDATT}, {"scaling-factor", required_argument, 0, OPT_SCALING},
        {"shift-factor", required_argument, 0, OPT_SHIFT}, {"allow-nonfinite", no_argument, 0, OPT_NONFINITE},
        {"batch", required_argument, 0, OPT_BATCH},     {"encode", required_argument, 0, OPT_ENCODE},
        {"latent-out", required_argument, 0, OPT_LATENT_OUT}, {"sample", no_argument, 0, OPT_SAMPLE},
        {"no-memory-check", no_argument, 0, OPT_NO_MEM},
        {"quiet", no_argument, 0, 'q'},                 {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    const char *preset = NULL;
    arch_flags af = {NULL, -1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0};
    int64_t size = 0, v;
    char err[VAE_ERR_LEN];
    memset(o, 0, sizeof(*o));
    o->budget = 512ll << 20;
    o->memory = MEMORY_AUTO;
    o->auto_pct = AUTO_RECOMPUTE_PCT;
    o->streams = 2;
    o->repeat = 1;
    o->batch = 1;
    o->dtype = CW_F32;
    o->backend = CW_BACKEND_AUTO;
    o->part = VAE_DECODER;
    opterr = 0;
    int c;
#define INT_OPT(flag, lo, hi, dst)                                                                                   \
    if (parse_int(optarg, lo, hi, &(dst)))                                                                           \
        return die_usage("%s '%s': expected an integer in [%lld, %lld]", flag, optarg, (long long)(lo), (long long)(hi)); \
    break
    while ((c = getopt_long(argc, argv, ":o:qh", longopts, NULL)) != -1) {
        switch (c) {
        case OPT_PRESET: preset = optarg; break;
        case OPT_MODEL: o->model = optarg; break;
        case OPT_CHANNELS: af.channels = optarg; break;
        case OPT_LAYERS: INT_OPT("--layers", 0, 64, af.layers);
        case OPT_GROUPS: INT_OPT("--groups", 1, 1 << 20, af.groups);
        case OPT_LATENT_CH: INT_OPT("--latent-channels", 1, 4096, af.latent_ch);
        case OPT_IN_CH: INT_OPT("--in-channels", 1, 4096, af.in_ch);
        case OPT_OUT_CH: INT_OPT("--out-channels", 1, 4096, af.out_ch);
        case OPT_QC: INT_OPT("--quant-conv", 0, 1, af.qc);
        case OPT_PQC: INT_OPT("--post-quant-conv", 0, 1, af.pqc);
        case OPT_MIDATT: INT_OPT("--mid-attention", 0, 1, af.midatt);
        case OPT_SCALING:
            if (parse_double(optarg, &af.scaling) || !(af.scaling > 0))
                return die_usage("--scaling-factor '%s': expected a positive number", optarg);
            af.has_scaling = 1;
            break;
        case OPT_SHIFT:
            if (parse_double(optarg, &af.shift)) return die_usage("--shift-factor '%s': expected a number", optarg);
            af.has_shift = 1;
            break;
        case OPT_WEIGHTS: o->weights = optarg; break;
        case OPT_RANDOM: o->random_weights = 1; break;
        case OPT_SEED:
            if (parse_int(optarg, 0, INT64_MAX, &v)) return die_usage("--seed '%s': expected a non-negative integer", optarg);
            o->seed = (uint64_t)v;
            break;
        case OPT_NONFINITE: o->allow_nonfinite = 1; break;
        case OPT_LATENT: o->latent = optarg; break;
        case OPT_BATCH: INT_OPT("--batch", 1, 4096, o->batch);
        case OPT_SCALED: o->scaled_latent = 1; break;
        case OPT_SIZE:
            if (parse_int(optarg, 1, 1 << 20, &size)) return die_usage("--size '%s': expected a positive integer", optarg);
            o->height = o->width = size;
            break;
        case OPT_HEIGHT:
            if (parse_int(optarg, 1, 1 << 20, &o->height)) return die_usage("--height '%s': expected a positive integer", optarg);
            break;
        case OPT_WIDTH:
            if (parse_int(optarg, 1, 1 << 20, &o->width)) return die_usage("--width '%s': expected a positive integer", optarg);
            break;
        case 'o': o->output = optarg; break;
        case OPT_RAW: o->raw = optarg; break;
        case OPT_ENCODE:
            if (o->n_images == MAX_IMAGES) return die_usage("--encode: more than %d images", MAX_IMAGES);
            o->images[o->n_images++] = optarg;
            o->part = VAE_ENCODER;
            break;
        case OPT_LATENT_OUT: o->latent_out = optarg; break;
        case OPT_SAMPLE: o->sample = 1; break;
        case OPT_MEMORY:
            if (strncmp(optarg, "auto", 4) == 0 && (optarg[4] == 0 || optarg[4] == ':')) {
                char *end = NULL;
                o->memory = MEMORY_AUTO;
                o->auto_pct = optarg[4] ? strtod(optarg + 5, &end) : AUTO_RECOMPUTE_PCT;
                if (optarg[4] && (end == optarg + 5 || *end || !(o->auto_pct >= 0) || o->auto_pct > 1000))
                    return die_usage("--memory '%s': auto:PCT takes a percentage of extra conv FLOPs in 0..1000",
                                     optarg);
            } else if (strcmp(optarg, "none") == 0)
                o->memory = 0;
            else if (parse_size(optarg, &o->memory) || o->memory <= 0)
                return die_usage("--memory '%s': expected auto, none or a size like 1GiB (units B, KiB, MiB, GiB, TiB, "
                                 "KB, MB, GB, TB, in any case)",
                                 optarg);
            break;
        case OPT_BUDGET:
            if (parse_size(optarg, &o->budget))
                return die_usage("--budget '%s': expected a size like 512MiB (units B, KiB, MiB, GiB, TiB, KB, MB, GB, TB, in any case) or 'unlimited'",
                                 optarg);
            if (o->budget == 0) return die_usage("--budget '%s': must be more than 0 (or 'unlimited')", optarg);
            o->budget_given = 1;
            break;
        case OPT_STREAMS:
            if (parse_int(optarg, 1, 8, &v)) return die_usage("--streams '%s': expected an integer in [1, 8]", optarg);
            o->streams = (int)v;
            break;
        case OPT_PATCHES:
            if (!strcmp(optarg, "auto")) o->patches = 0;
            else if (!strcmp(optarg, "none")) o->patches = -1;
            else if (parse_int(optarg, 1, 1 << 20, &v)) return die_usage("--patches '%s': expected auto, none or a positive integer", optarg);
            else o->patches = (int)v;
            break;
        case OPT_BACKEND:
            if (!strcmp(optarg, "auto")) o->backend = CW_BACKEND_AUTO;
            else if (!strcmp(optarg, "cpu")) o->backend = CW_BACKEND_CPU;
            else if (!strcmp(optarg, "cuda")) o->backend = CW_BACKEND_CUDA;
            else return die_usage("--backend '%s': expected auto, cpu or cuda", optarg);
            break;
        case OPT_DTYPE:
            if (!strcmp(optarg, "f32")) o->dtype = CW_F32;
            else if (!strcmp(optarg, "f16")) o->dtype = CW_F16;
            else if (!strcmp(optarg, "bf16")) o->dtype = CW_BF16;
            else return die_usage("--dtype '%s': expected f32, f16 or bf16", optarg);
            break;
        case OPT_THREADS:
            if (parse_int(optarg, 1, 1024, &v)) return die_usage("--threads '%s': expected an integer in [1, 1024]", optarg);
            o->threads = (int)v;
            break;
        case OPT_NO_MEM: o->no_mem_check = 1; break;
        case OPT_COMPARE: o->compare = 1; break;
        case OPT_TUNE: o->tune = 1; break;
        case OPT_REPEAT:
            if (parse_int(optarg, 1, 1000, &v)) return die_usage("--repeat '%s': expected an integer in [1, 1000]", optarg);
            o->repeat = (int)v;
            break;
        case OPT_TRACE: o->trace = optarg; break;
        case OPT_NVTX: o->nvtx = 1; break;
        case OPT_PLAN: o->describe = 1; break;
        case 'q': o->quiet = 1; break;
        case 'h': usage(stdout); exit(0);
        case ':': return die_usage("option '%s' needs an argument (see --help)", argv[optind - 1]);
        default:
            return die_usage("unknown option '%s' (see --help)", argv[optind - 1]);
        }
    }
#undef INT_OPT
    if (optind < argc) return die_usage("unexpected argument '%s' (see --help)", argv[optind]);
    if (o->model && preset) return die_usage("--preset and --model are exclusive (the folder's config.json is the model)");
    if (o->model && (o->weights || o->random_weights))
        return die_usage("--model reads the folder's weights: drop --weights/--random-weights");
    if (vae_preset(&o->cfg, preset ? preset : "sd", err, sizeof(err))) return die_usage("%s", err);
    if (o->model) {
        if (vae_model_dir(o->model, o->model_config, o->model_weights, sizeof(o->model_config), err, sizeof(err)))
            return die_usage("%s", err);
        if (vae_config_load(&o->cfg, o->model_config, err, sizeof(err))) return die_usage("--model: %s", err);
        o->weights = o->model_weights;
    }
    vae_config *cf = &o->cfg;
    if (af.channels && vae_parse_channels(cf, af.channels, err, sizeof(err))) return die_usage("%s", err);
    if (af.layers >= 0) cf->layers_per_block = (int)af.layers;
    if (af.groups > 0) cf->groups = (int)af.groups;
    if (af.latent_ch > 0) cf->latent_channels = (int)af.latent_ch;
    if (af.in_ch > 0) cf->in_channels = (int)af.in_ch;
    if (af.out_ch > 0) cf->out_channels = (int)af.out_ch;
    if (af.qc >= 0) cf->quant_conv = (int)af.qc;
    if (af.pqc >= 0) cf->post_quant_conv = (int)af.pqc;
    if (af.midatt >= 0) cf->mid_attention = (int)af.midatt;
    if (af.has_scaling) cf->scaling_factor = af.scaling;
    if (af.has_shift) cf->shift_factor = af.shift;
    if (vae_config_validate(cf, err, sizeof(err))) return die_usage("model: %s", err);
    if (!!o->weights == !!o->random_weights) return die_usage("give exactly one of --model DIR, --weights FILE and --random-weights");
    if (o->compare && o->tune) return die_usage("--compare and --tune are exclusive (--tune includes the reference)");
    if (o->trace && o->tune) return die_usage("--trace is for a single run, not --tune");
    if (o->patches < 0 && o->budget_given && o->budget >= 0)
        return die_usage("--patches none runs unscheduled and cannot keep --budget: drop one of them "
                         "(or give --budget unlimited)");
    if (o->part == VAE_ENCODER) {
        if (o->output || o->raw) return die_usage("-o/--raw are the decoder's outputs; with --encode use --latent-out");
        if (o->latent) return die_usage("--latent is the decoder's input; --encode reads images");
        if (o->height || o->width || o->batch != 1) return die_usage("--size/--height/--width/--batch: the images set the size with --encode");
    } else {
        if (o->latent_out) return die_usage("--latent-out is the encoder's output: give --encode IMAGE");
        if (o->sample) return die_usage("--sample is for --encode");
        if (o->latent && o->batch != 1) return die_usage("--batch is for random latents: --latent FILE sets N");
    }
    if (o->scaled_latent && cf->latents_stats)
        return die_usage("--scaled-latent: %s has latents_mean/latents_std, which cw-vae does not apply", o->model_config);
    return 0;
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
static int spinner_on(const opts *o) { return !o->quiet && isatty(STDERR_FILENO); }

/* The input of every run: [n, c, h, w] f32 on the host. */
typedef struct job {
    const float *in;
    int64_t n, h, w;        /* batch and the input's spatial size */
    int64_t out_numel;      /* the graph's output */
    const char *trace_tmp;  /* where the scheduled run writes --trace (staged) */
} job;

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

/* --plan: the plans a --memory chooses between at this --budget (cw_graph_memory_ladder),
 * least memory first, the compiled one marked. */
static void print_ladder(vae_model *m, const cw_plan *plan, const cw_compile_options *co) {
    cw_memory_point pts[65];
    int n = 0;
    if (cw_graph_memory_ladder(m->graph, pts, &n, 65, co) != CW_OK) {
        printf("memory ladder: %s\n\n", cw_context_get_last_error(m->ctx));
        return;
    }
    cw_plan_stats ps;
    cw_plan_get_stats(plan, &ps);
    char w[32];
    fmt_bytes(w, sizeof(w), ps.weights_bytes);
    printf("memory ladder: the smallest --memory (activations + temporaries; weights %s apart) for each\n"
           "amount of recompute, at this --budget; a --memory from one row's total up to the next's runs that row\n",
           w);
    printf("  %-12s %11s %12s %12s %11s %12s\n", "--memory", "total", "activations", "temporaries", "recomputed",
           "extra GFLOP");
    for (int i = 0; i < n; i++) {
        char t[32], a[32], b[32];
        fmt_bytes(t, sizeof(t), pts[i].total_bytes);
        fmt_bytes(a, sizeof(a), pts[i].activations_bytes);
        fmt_bytes(b, sizeof(b), pts[i].temp_bytes);
        int self = pts[i].activations_bytes == ps.activations_peak && pts[i].temp_bytes == ps.temp_predicted &&
                   pts[i].n_recomputed == ps.n_recomputed;
        printf("  %-12" PRId64 " %11s %12s %12s %11d %12.4g%s\n", pts[i].total_bytes, t, a, b, pts[i].n_recomputed,
               pts[i].recompute_gflop, self ? "  <- this plan" : "");
    }
    printf("\n");
}

/* --memory auto: the plan of the ladder's least total whose recompute costs at most
 * pct % of *plan's conv FLOPs (the plan that stores everything); *plan stays
 * where no such point holds less. Sets co->memory_budget to the total chosen. */
static cw_status memory_auto(vae_model *m, double pct, cw_compile_options *co, cw_plan **plan, char *err,
                             size_t errlen) {
    cw_memory_point pts[65];
    int n = 0;
    cw_plan_stats ps;
    cw_plan_get_stats(*plan, &ps);
    if (cw_graph_memory_ladder(m->graph, pts, &n, 65, co) != CW_OK || n < 2) return CW_OK; /* keep the plan */
    if (n > 65) n = 65;
    for (int i = 0; i < n - 1; i++) {
        if (pts[i].recompute_gflop > ps.conv_gflop * pct / 100.0) continue;
        cw_plan *p2 = NULL;
        co->memory_budget = pts[i].total_bytes;
        cw_status st = vae_compile(m, co, &p2, err, errlen);
        if (st != CW_OK) return st;
        cw_plan_destroy(*plan);
        *plan = p2;
        return CW_OK;
    }
    return CW_OK;
}

/* The child: everything big is created here, so ru_maxrss covers this configuration only. */
static int child_run(const opts *o, const run_cfg *rc, const job *jb, run_result *res, float *out) {
    cw_context *ctx = NULL;
    vae_weights *w = NULL;
    vae_model *m = NULL;
    cw_plan *plan = NULL;
    cw_status st = CW_OK;
    int code = 0;
    res->work_mem = -1;
    cw_context_config cc = CW_CONTEXT_CONFIG_INIT;
    cc.backend = o->backend;
    cc.temp_budget = rc->budget > 0 ? rc->budget : 0;
    cc.streams = rc->streams;
    cc.threads = o->threads;
    cc.flags = (rc->trace ? CW_FLAG_TIMING : 0u) | (o->nvtx ? CW_FLAG_NVTX : 0u);
    cc.log_level = o->quiet ? CW_LOG_ERROR : CW_LOG_WARN;
    st = cw_context_create(&ctx, &cc);
    if (st != CW_OK) {
        snprintf(res->err, sizeof(res->err), "context (backend %s): %s (details above)",
                 o->backend == CW_BACKEND_CUDA ? "cuda" : o->backend == CW_BACKEND_CPU ? "cpu" : "auto",
                 cw_status_string(st));
        code = exit_for(st);
        goto done;
    }
    snprintf(res->backend, sizeof(res->backend), "%s", cw_context_get_backend_name(ctx));
    int rcw = o->weights ? vae_weights_open_file(&w, o->weights, res->err, sizeof(res->err))
                         : vae_weights_random(&w, o->seed, res->err, sizeof(res->err));
    if (rcw) {
        code = EXIT_USAGE;
        goto done;
    }
    vae_weights_allow_nonfinite(w, o->allow_nonfinite);
    st = vae_build(&m, ctx, &o->cfg, w, o->part, jb->n, jb->h, jb->w, o->dtype, 0, res->err, sizeof(res->err));
    if (st != CW_OK) {
        if (st == CW_ERR_UNSUPPORTED) explain_dtype(o, res);
        code = exit_for(st);
        goto done;
    }
    vae_weights_close(w); /* the weights now live in the model's tensors */
    w = NULL;
    cw_compile_options co = CW_COMPILE_OPTIONS_INIT;
    co.temp_budget = rc->budget;
    co.memory_budget = (rc->budget < 0 && rc->policy == CW_PATCHES_NONE) || o->memory == MEMORY_AUTO ? 0 : o->memory;
    co.streams = rc->streams;
    co.policy = rc->policy;
    co.patches = rc->patches;
    st = vae_compile(m, &co, &plan, res->err, sizeof(res->err));
    if (st == CW_OK && o->memory == MEMORY_AUTO && rc->policy != CW_PATCHES_NONE && rc->budget > 0)
        st = memory_auto(m, o->auto_pct, &co, &plan, res->err, sizeof(res->err));
    if (st != CW_OK) {
        if (st == CW_ERR_BUDGET) {
            res->over_budget = 1;
            res->min_budget = res->min_memory = -1;
            cw_memory_point least;
            int n = 0;
            int64_t mb;
            /* over --memory: the ladder's least; over --budget (the ladder's CW_ERR_BUDGET too):
             * the smallest budget */
            cw_status lst = co.memory_budget > 0 ? cw_graph_memory_ladder(m->graph, &least, &n, 1, &co) : CW_ERR_BUDGET;
            if (lst == CW_OK) res->min_memory = least.total_bytes;
            else if (lst == CW_ERR_BUDGET && cw_graph_min_budget(m->graph, &mb, &co) == CW_OK) res->min_budget = mb;
        }
        if (st == CW_ERR_UNSUPPORTED) explain_dtype(o, res);
        code = exit_for(st);
        goto done;
    }
    if (rc->describe) {
        char *text = NULL;
        if (cw_plan_describe(plan, &text, 0) == CW_OK) printf("plan (%s):\n%s\n", rc->label, text);
        cw_free(text);
        print_ladder(m, plan, &co);
        fflush(stdout);
    }
    res->ms = INFINITY;
    if (spinner_on(o)) cw_plan_set_progress(plan, on_progress, res);
    int64_t rss0 = work_mem_begin();
    for (int i = 0; i < o->repeat; i++) {
        double t0 = now_ms();
        st = vae_run(m, plan, jb->in, out, res->err, sizeof(res->err));
        double t = now_ms() - t0;
        if (st != CW_OK) {
            if (st == CW_ERR_UNSUPPORTED) explain_dtype(o, res);
            code = exit_for(st);
            goto done;
        }
        if (t < res->ms) res->ms = t;
    }
    res->work_mem = work_mem_end(rss0);
    cw_plan_get_stats(plan, &res->stats);
    if (rc->trace && jb->trace_tmp) {
        st = cw_plan_write_trace(plan, jb->trace_tmp);
        if (st != CW_OK) {
            snprintf(res->err, sizeof(res->err), "--trace %s: %s", o->trace, cw_context_get_last_error(ctx));
            code = EXIT_RUN;
            goto done;
        }
    }
    int64_t bad = vae_find_nonfinite(out, jb->out_numel);
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

static volatile sig_atomic_t g_stop;     /* the signal that asked us to stop, or 0 */
static volatile pid_t g_child;           /* the running child, or 0 */

static void on_stop_signal(int sig) {
    g_stop = sig;
    pid_t c = g_child;
    if (c > 0) kill(c, SIGKILL);
}

static void install_stop_handlers(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0; /* no SA_RESTART: wait4 returns EINTR */
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
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
    return child_run(j->o, j->rc, j->jb, j->area->head, j->area->data);
}

/* Forks, runs rc in the child, waits (showing elapsed time on a terminal after 1 s) and
 * fills *sr with the child's result (head) and output (data) and its peak RSS. Returns the
 * child's exit code, or -1 when a signal asked the parent to stop (the child is then killed
 * and reaped). */
static int run_in_child(const opts *o, const run_cfg *rc, const job *jb, const char *progress, child_area *sr) {
    if (child_area_map(sr, sizeof(run_result), (size_t)jb->out_numel * sizeof(float)) != 0) {
        fprintf(stderr, "%s: mmap of %zu bytes for the output: %s\n", prog, sr->bytes, strerror(errno));
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
        if (st.end == CHILD_FAILED) fprintf(stderr, "%s: %s\n", prog, st.err);
        child_area_unmap(sr);
        return st.end == CHILD_STOPPED ? -1 : EXIT_RUN;
    }
    res->peak_rss = st.peak_rss;
    if (st.end == CHILD_KILLED) {
        snprintf(res->err, sizeof(res->err), "%s: child killed by signal %d (%s)", rc->label, st.code,
                 strsignal(st.code));
        res->exit_code = EXIT_RUN;
        return EXIT_RUN;
    }
    if (st.code != 0 && res->exit_code <= 0) {
        snprintf(res->err, sizeof(res->err), "%s: child exited with status %d", rc->label, st.code);
        res->exit_code = st.code;
    }
    return st.code;
}

/* ---- tables ------------------------------------------------------------------------------------ */

static double max_abs_diff(const float *a, const float *b, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= m)) m = d; /* NaN sticks */
    }
    return m;
}

static void table_header(void) {
    printf("%-30s %10s %11s %11s %11s %11s %11s %10s\n", "configuration", "time ms", "peak temp", "peak act",
           "peak total", "peak RSS", "work mem", "max|diff|");
}

static void table_row(const run_cfg *rc, const run_result *r, int has_diff) {
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
static void peer_row(const peer_result *p, const float *ref, int64_t n) {
    char label[64], d[32], e[32] = "-";
    snprintf(label, sizeof(label), "%.40s", p->versions);
    char *comma = strchr(label, ',');
    if (comma) *comma = '\0'; /* "diffusers X" */
    fmt_bytes(d, sizeof(d), p->peak_rss);
    if (p->work_mem >= 0) fmt_bytes(e, sizeof(e), p->work_mem);
    printf("%-30s %10.1f %11s %11s %11s %11s %11s %10.3g\n", label, p->ms, "-", "-", "-", d, e, max_abs_diff(p->out, ref, n));
}

/* The scheduled run against diffusers: time and memory ratios, and how far apart the outputs are. */
static void peer_summary(const peer_result *p, const run_result *b, const float *out, int64_t n) {
    double md = max_abs_diff(out, p->out, n), mx = 0;
    for (int64_t i = 0; i < n; i++)
        if (fabs((double)p->out[i]) > mx) mx = fabs((double)p->out[i]);
    printf("scheduled / diffusers: time %.2fx", b->ms / p->ms);
    if (b->work_mem >= 0 && p->work_mem > 0) printf(", work mem %.2fx", (double)b->work_mem / (double)p->work_mem);
    printf("; max|diff| %.3g (%.3g of max|diffusers|)\n", md, mx > 0 ? md / mx : md);
    printf("diffusers: AutoencoderKL.%s, %s, cpu, %d threads (%s)\n", p->encode ? "encode" : "decode", p->versions,
           p->threads, p->python);
}

static void label_for(run_cfg *rc, const opts *o) {
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
    (void)o;
}

static void cfg_from_opts(run_cfg *rc, const opts *o) {
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
    label_for(rc, o);
}

static void ref_cfg(run_cfg *rc, const opts *o) {
    memset(rc, 0, sizeof(*rc));
    rc->streams = 1;
    rc->budget = -1; /* the reference is the unscheduled run: no cap */
    rc->policy = CW_PATCHES_NONE;
    label_for(rc, o);
}

/* ---- outputs: checked, staged before the run, renamed together after it ----------------------- */

typedef struct out_file {
    const char *flag;   /* "-o", "--raw", "--latent-out", "--trace" */
    char *path;         /* the target */
    char *tmp;          /* the staged file beside it (NULL until staged, and after rename) */
    int sample;         /* -o of a batch: the sample it holds; else -1 */
} out_file;

static out_file *g_outs;
static int g_n_outs;

static void unstage_all(void) {
    for (int i = 0; i < g_n_outs; i++)
        if (g_outs[i].tmp) {
            unlink(g_outs[i].tmp);
            free(g_outs[i].tmp);
            g_outs[i].tmp = NULL;
        }
}

static void free_outs(void) {
    unstage_all();
    for (int i = 0; i < g_n_outs; i++) free(g_outs[i].path);
    free(g_outs);
    g_outs = NULL;
    g_n_outs = 0;
}

/* Stopped by a signal: remove what was staged, then die of the same signal. */
static void stop_now(void) {
    free_outs();
    int sig = g_stop;
    fflush(stdout);
    signal(sig, SIG_DFL);
    raise(sig);
    _exit(128 + sig);
}

static int add_out(const char *flag, const char *path, int sample) {
    out_file *p = realloc(g_outs, (size_t)(g_n_outs + 1) * sizeof(*p));
    if (!p) return -1;
    g_outs = p;
    out_file *f = &g_outs[g_n_outs];
    memset(f, 0, sizeof(*f));
    f->flag = flag;
    f->sample = sample;
    f->path = strdup(path);
    if (!f->path) return -1;
    g_n_outs++;
    return 0;
}

/* "out.png" -> "out-3.png" (the index before the extension, or at the end) */
static char *sample_path(const char *path, int i) {
    const char *slash = strrchr(path, '/'), *dot = strrchr(path, '.');
    if (!dot || (slash && dot < slash) || dot == (slash ? slash + 1 : path)) dot = path + strlen(path);
    size_t len = strlen(path) + 24;
    char *s = malloc(len);
    if (s) snprintf(s, len, "%.*s-%d%s", (int)(dot - path), path, i, dot);
    return s;
}

/* realpath of the folder + "/" + the last component: equal for two paths of one file. */
static int canon_path(const char *flag, const char *path, char *buf, size_t len) {
    const char *slash = strrchr(path, '/');
    char dir[PATH_MAX], real[PATH_MAX];
    const char *base = slash ? slash + 1 : path;
    if (!*base || !strcmp(base, ".") || !strcmp(base, ".."))
        return die_usage("%s %s: names a folder, not a file", flag, path);
    if (!slash) snprintf(dir, sizeof(dir), ".");
    else if (slash == path) snprintf(dir, sizeof(dir), "/");
    else snprintf(dir, sizeof(dir), "%.*s", (int)(slash - path), path);
    if (!realpath(dir, real)) return die_usage("%s %s: folder %s: %s", flag, path, dir, strerror(errno));
    if ((size_t)snprintf(buf, len, "%s/%s", real, base) >= len) return die_usage("%s %s: path too long", flag, path);
    return 0;
}

/* Every output: not an input (same inode), not another output, a regular file if it exists. */
static int check_outputs(const char *const *inputs, const char *const *in_flags, int n_in) {
    struct stat in_st[MAX_IMAGES + 4];
    for (int i = 0; i < n_in; i++)
        if (stat(inputs[i], &in_st[i]) != 0) return die_usage("%s %s: %s", in_flags[i], inputs[i], strerror(errno));
    char (*canon)[PATH_MAX] = malloc((size_t)g_n_outs * PATH_MAX);
    if (!canon) return die_usage("out of memory");
    int rc = 0;
    for (int i = 0; i < g_n_outs && !rc; i++) {
        const out_file *f = &g_outs[i];
        struct stat s;
        if (lstat(f->path, &s) == 0) {
            if (!S_ISREG(s.st_mode)) {
                rc = die_usage("%s %s: exists and is %s, not a regular file: refusing to replace it", f->flag, f->path,
                               S_ISLNK(s.st_mode) ? "a symbolic link" : S_ISDIR(s.st_mode) ? "a folder"
                               : S_ISCHR(s.st_mode) || S_ISBLK(s.st_mode) ? "a device" : "special");
                break;
            }
            for (int k = 0; k < n_in && !rc; k++)
                if (s.st_dev == in_st[k].st_dev && s.st_ino == in_st[k].st_ino)
                    rc = die_usage("%s %s: is the input %s %s (same file): refusing to overwrite an input", f->flag,
                                   f->path, in_flags[k], inputs[k]);
        } else if (errno != ENOENT) {
            rc = die_usage("%s %s: %s", f->flag, f->path, strerror(errno));
        }
        if (rc || (rc = canon_path(f->flag, f->path, canon[i], PATH_MAX))) break;
        for (int k = 0; k < i && !rc; k++)
            if (!strcmp(canon[i], canon[k]))
                rc = die_usage("%s %s and %s %s name the same file: give each output its own path", g_outs[k].flag,
                               g_outs[k].path, f->flag, f->path);
    }
    free(canon);
    return rc;
}

/* Creates every staged file beside its target: an output that cannot be written fails
 * here, before the run. */
static int stage_outputs(void) {
    for (int i = 0; i < g_n_outs; i++) {
        out_file *f = &g_outs[i];
        size_t len = strlen(f->path) + 16;
        f->tmp = malloc(len);
        if (!f->tmp) return die_usage("out of memory");
        snprintf(f->tmp, len, "%s.cw-XXXXXX", f->path);
        int fd = mkstemp(f->tmp);
        if (fd < 0) {
            int e = errno;
            free(f->tmp);
            f->tmp = NULL;
            unstage_all();
            return die_usage("%s %s: cannot write beside it: %s", f->flag, f->path, strerror(e));
        }
        (void)fchmod(fd, 0644);
        close(fd);
    }
    return 0;
}

static void write_out_error(const out_file *f, const char *err) {
    fprintf(stderr, "%s: %s %s: %s\n", prog, f->flag, f->path, err);
}

/* Writes the results into the staged files, then renames all of them into place. Returns 0
 * or an exit code (nothing renamed then, and every staged file removed). */
static int finish_outputs(const opts *o, const float *out, const int64_t dims[4]) {
    char err[VAE_ERR_LEN];
    int64_t n = dims[0], per = dims[1] * dims[2] * dims[3];
    float *z = NULL;
    int64_t zd[4] = {dims[0], dims[1] / 2, dims[2], dims[3]};
    for (int i = 0; i < g_n_outs; i++) {
        const out_file *f = &g_outs[i];
        int bad = 0;
        if (!strcmp(f->flag, "--trace")) continue; /* written by the child */
        if (!strcmp(f->flag, "-o")) {
            int64_t d1[4] = {1, dims[1], dims[2], dims[3]};
            bad = img_write_png(f->tmp, out + (f->sample < 0 ? 0 : f->sample) * per, d1, err, sizeof(err));
        } else if (!strcmp(f->flag, "--raw")) {
            bad = npy_write_f32(f->tmp, 4, dims, out, err, sizeof(err));
        } else { /* --latent-out: the Gaussian's mean or a sample, then the pipeline's scaling */
            if (!z) {
                z = malloc((size_t)(n * zd[1] * zd[2] * zd[3]) * sizeof(float));
                if (!z || vae_moments_to_latent(out, n, zd[1], zd[2] * zd[3], o->sample, o->seed, z)) {
                    free(z);
                    unstage_all();
                    fprintf(stderr, "%s: out of memory for the latents\n", prog);
                    return EXIT_RUN;
                }
                if (o->scaled_latent) vae_latent_scale(&o->cfg, z, (size_t)(n * zd[1] * zd[2] * zd[3]));
            }
            size_t L = strlen(f->path);
            if (L > 12 && !strcmp(f->path + L - 12, ".safetensors")) {
                const char *names[1] = {"latent"};
                const int64_t *shapes[1] = {zd};
                int ranks[1] = {4};
                const float *data[1] = {z};
                bad = st_write(f->tmp, 1, names, shapes, ranks, data, err, sizeof(err));
            } else {
                bad = npy_write_f32(f->tmp, 4, zd, z, err, sizeof(err));
            }
        }
        if (bad || g_stop) {
            free(z);
            if (g_stop) stop_now();
            write_out_error(f, err);
            unstage_all();
            return EXIT_RUN;
        }
    }
    free(z);
    if (g_stop) stop_now();
    /* every output is complete: rename them all (signals held so none is cut in half) */
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGHUP);
    sigprocmask(SIG_BLOCK, &block, &old);
    int ret = 0;
    for (int i = 0; i < g_n_outs; i++) {
        out_file *f = &g_outs[i];
        if (rename(f->tmp, f->path) != 0) {
            write_out_error(f, strerror(errno));
            ret = EXIT_RUN;
            break;
        }
        free(f->tmp);
        f->tmp = NULL;
        if (!o->quiet) printf("wrote %s\n", f->path);
    }
    unstage_all();
    sigprocmask(SIG_SETMASK, &old, NULL);
    return ret;
}

static int report_failure(const run_result *r) {
    fprintf(stderr, "%s: %s\n", prog, r->err[0] ? r->err : "run failed");
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

/* ---- the job's size against the machine's memory ------------------------------------------------- */

static int64_t machine_memory(void) {
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGE_SIZE);
    int64_t m = pages > 0 && psz > 0 ? (int64_t)pages * psz : INT64_MAX;
    FILE *f = fopen("/sys/fs/cgroup/memory.max", "r"); /* a container's limit */
    if (f) {
        long long v;
        if (fscanf(f, "%lld", &v) == 1 && v > 0 && v < m) m = v;
        fclose(f);
    }
    return m;
}

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
    int64_t have = machine_memory();
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

/* The input batch: latents (decode: a file or seeded random) or images (encode). */
static int load_input(opts *o, float **in, int64_t d[4], int64_t *out_numel) {
    char err[VAE_ERR_LEN];
    const vae_config *cfg = &o->cfg;
    int64_t up = vae_upscale(cfg);
    *in = NULL;
    if (o->part == VAE_ENCODER) {
        for (int i = 0; i < o->n_images; i++) {
            float *x = NULL;
            int64_t xd[4];
            size_t L = strlen(o->images[i]);
            int bad = L > 4 && !strcmp(o->images[i] + L - 4, ".npy")
                          ? vae_tensor_load("--encode", o->images[i], &x, xd, err, sizeof(err))
                          : img_read_png(o->images[i], &x, xd, err, sizeof(err));
            if (bad) {
                free(*in);
                return die_usage("%s", err);
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

int main(int argc, char **argv) {
    opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc) return rc;
    char err[VAE_ERR_LEN];
    const vae_config *cfg = &o.cfg;
    int64_t up = vae_upscale(cfg);
    install_stop_handlers();

    /* the input (small) is read here; the weights only in the children */
    float *in = NULL;
    int64_t d[4], out_numel = 0;
    if ((rc = load_input(&o, &in, d, &out_numel))) return rc;
    int64_t nin = d[0] * d[1] * d[2] * d[3];
    int64_t out_dims[4];
    if (o.part == VAE_DECODER) {
        out_dims[0] = d[0], out_dims[1] = cfg->out_channels, out_dims[2] = d[2] * up, out_dims[3] = d[3] * up;
    } else {
        out_dims[0] = d[0], out_dims[1] = 2 * cfg->latent_channels, out_dims[2] = d[2] / up, out_dims[3] = d[3] / up;
    }
    /* the job's size, before anything big exists (a random latent is not filled yet) */
    if ((rc = check_memory(&o, d[0], d[1], d[2], d[3], out_numel))) {
        free(in);
        return rc;
    }

    /* the inputs, and the outputs that may name none of them nor each other */
    const char *inputs[MAX_IMAGES + 4], *in_flags[MAX_IMAGES + 4];
    int n_in = 0;
    if (o.weights) inputs[n_in] = o.weights, in_flags[n_in++] = o.model ? "--model" : "--weights";
    if (o.model) inputs[n_in] = o.model_config, in_flags[n_in++] = "--model";
    if (o.latent) inputs[n_in] = o.latent, in_flags[n_in++] = "--latent";
    for (int i = 0; i < o.n_images; i++) inputs[n_in] = o.images[i], in_flags[n_in++] = "--encode";
    int oom = 0;
    if (o.output) {
        if (cfg->out_channels != 1 && cfg->out_channels != 3) {
            free(in);
            return die_usage("-o %s: a PNG holds 1 or 3 channels, the model writes %d (use --raw)", o.output,
                             cfg->out_channels);
        }
        if (d[0] == 1) oom |= add_out("-o", o.output, 0);
        for (int64_t i = 0; d[0] > 1 && i < d[0]; i++) {
            char *p = sample_path(o.output, (int)i);
            oom |= !p || add_out("-o", p, (int)i);
            free(p);
        }
    }
    if (o.raw) oom |= add_out("--raw", o.raw, -1);
    if (o.latent_out) {
        size_t L = strlen(o.latent_out);
        if (!(L > 4 && !strcmp(o.latent_out + L - 4, ".npy")) && !(L > 12 && !strcmp(o.latent_out + L - 12, ".safetensors"))) {
            free(in);
            return die_usage("--latent-out %s: expected a .npy or .safetensors name", o.latent_out);
        }
        oom |= add_out("--latent-out", o.latent_out, -1);
    }
    if (o.trace) oom |= add_out("--trace", o.trace, -1);
    if (oom) {
        free(in);
        free_outs();
        return die_usage("out of memory");
    }
    if ((rc = check_outputs(inputs, in_flags, n_in))) {
        free(in);
        free_outs();
        return rc;
    }

    /* the input's values: NaN/Inf give garbage silently downstream */
    if (!o.latent && o.part == VAE_DECODER) {
        in = malloc((size_t)nin * sizeof(float));
        if (!in) {
            free_outs();
            return die_usage("out of memory for %" PRId64 " latents of %" PRId64 "x%" PRId64, d[0], d[2], d[3]);
        }
        vae_latent_random(in, (size_t)nin, o.seed);
    }
    if (o.scaled_latent && o.part == VAE_DECODER) vae_latent_unscale(cfg, in, (size_t)nin);
    int64_t bad = o.allow_nonfinite ? -1 : vae_find_nonfinite(in, nin);
    if (bad >= 0) {
        char where[160];
        vae_index_str(where, sizeof(where), in, bad, 4, d);
        free(in);
        free_outs();
        if (o.part == VAE_ENCODER) return die_usage("--encode: the images have %s (--allow-nonfinite encodes it anyway)", where);
        return die_usage("--latent %s: %s%s (--allow-nonfinite decodes it anyway)", o.latent ? o.latent : "(random)", where,
                         o.scaled_latent ? " after --scaled-latent" : "");
    }

    /* bad weights fail once, here, before any child runs (header only: no data is read) */
    if (o.weights) {
        vae_weights *w = NULL;
        if (vae_weights_open_file(&w, o.weights, err, sizeof(err)) || vae_weights_check(w, cfg, o.part, err, sizeof(err))) {
            vae_weights_close(w);
            free(in);
            free_outs();
            return die_usage("%s", err);
        }
        vae_weights_close(w);
    }
    if ((rc = stage_outputs())) {
        free(in);
        free_outs();
        return rc;
    }
    if (g_stop) stop_now();

    const char *dt = o.dtype == CW_F32 ? "f32" : o.dtype == CW_F16 ? "f16" : "bf16";
    if (!o.quiet) {
        char bud[32];
        fmt_bytes(bud, sizeof(bud), o.budget);
        printf("cw-vae %s: %s, %s %s, %" PRId64 " x %" PRId64 "x%" PRId64 "x%" PRId64 " -> %" PRId64 "x%" PRId64
               "x%" PRId64 ", %s weights, %s, budget %s\n",
               cw_version_string(), o.part == VAE_DECODER ? "decode" : "encode", o.model ? "model" : "preset",
               o.model ? o.model : cfg->name, d[0], d[1], d[2], d[3], out_dims[1], out_dims[2], out_dims[3],
               o.weights ? o.weights : "random", dt, o.budget < 0 ? "unlimited" : bud);
        if (cfg->force_upcast && o.dtype != CW_F32 && o.model)
            printf("note: %s has force_upcast: diffusers runs this VAE in f32; --dtype %s may overflow\n",
                   o.model_config, dt);
        fflush(stdout);
    }
    job jb = {in, d[0], d[2], d[3], out_numel, NULL};
    for (int i = 0; i < g_n_outs; i++)
        if (!strcmp(g_outs[i].flag, "--trace")) jb.trace_tmp = g_outs[i].tmp;
    const char *verb = o.part == VAE_DECODER ? "decoding" : "encoding";

    int ret = 0;
    child_area final = {0}; /* the run whose output is written */
    if (!o.compare && !o.tune) {
        run_cfg r;
        cfg_from_opts(&r, &o);
        child_area sr;
        int code = run_in_child(&o, &r, &jb, verb, &sr);
        if (code < 0) stop_now();
        if (code != 0) {
            ret = sr.head ? report_failure(sr.head) : code;
            child_area_unmap(&sr);
            goto out;
        }
        const run_result *res = sr.head;
        if (!o.quiet) {
            char a[32], b[32], c[32], e[32];
            fmt_bytes(a, sizeof(a), res->stats.temp_peak);
            fmt_bytes(b, sizeof(b), res->stats.activations_peak);
            fmt_bytes(c, sizeof(c), res->stats.total_peak);
            fmt_bytes(e, sizeof(e), res->peak_rss);
            char wm[32] = "unknown";
            if (res->work_mem >= 0) fmt_bytes(wm, sizeof(wm), res->work_mem);
            printf("%s backend, %s: %.1f ms; peak temp %s, peak activations %s, peak total %s, peak RSS %s, "
                   "working memory %s; %" PRId64 " conv patches, %.1f GFLOP (+%.1f%% halo",
                   res->backend, r.label, res->ms, a, b, c, e, wm, res->stats.n_patches, res->stats.conv_gflop,
                   res->stats.halo_overhead_pct);
            if (res->stats.n_recomputed > 0)
                printf(", +%.1f GFLOP recomputing %d blocks", res->stats.recompute_gflop, res->stats.n_recomputed);
            printf(")\n");
        }
        final = sr;
    } else {
        /* --compare / --tune: the reference first, then the scheduled configuration(s) */
        run_cfg ref;
        ref_cfg(&ref, &o);
        child_area rs;
        int total = o.tune ? 17 : 3; /* --compare: the reference, the scheduled run, diffusers */
        char prog_label[96];
        snprintf(prog_label, sizeof(prog_label), "[1/%d] %s", total, ref.label);
        int code = run_in_child(&o, &ref, &jb, prog_label, &rs);
        if (code < 0) stop_now();
        if (code != 0) {
            ret = rs.head ? report_failure(rs.head) : code;
            child_area_unmap(&rs);
            goto out;
        }
        const run_result *ref_res = rs.head;
        const float *ref_out = rs.data;
        run_cfg cfgs[16];
        int n = 0;
        if (o.tune) {
            static const int pol[4] = {0, 2, 4, 8};
            for (int s = 1; s <= 4; s++)
                for (int p = 0; p < 4; p++) {
                    run_cfg *c = &cfgs[n++];
                    memset(c, 0, sizeof(*c));
                    c->streams = s;
                    c->budget = o.budget;
                    c->policy = pol[p] ? CW_PATCHES_FIXED : CW_PATCHES_AUTO;
                    c->patches = pol[p];
                    label_for(c, &o);
                }
        } else {
            cfg_from_opts(&cfgs[n++], &o);
        }
        run_result results[16];
        int out_cfg = -1;
        for (int i = 0; i < n; i++) {
            child_area sr;
            snprintf(prog_label, sizeof(prog_label), "[%d/%d] %s", i + 2, total, cfgs[i].label);
            code = run_in_child(&o, &cfgs[i], &jb, prog_label, &sr);
            if (code < 0) stop_now();
            run_result *res = sr.head;
            if (!res) {
                child_area_unmap(&rs);
                child_area_unmap(&final);
                ret = code;
                goto out;
            }
            if (code == 0) res->max_diff = max_abs_diff(sr.data, ref_out, out_numel);
            results[i] = *res;
            if (code != 0 && (!o.tune || res->nonfinite)) {
                ret = report_failure(res);
                child_area_unmap(&sr);
                child_area_unmap(&rs);
                child_area_unmap(&final);
                goto out;
            }
            /* outputs get the first scheduled configuration that ran (all agree with the
             * reference within the printed max|diff|) */
            if (code == 0 && !final.head) {
                final = sr;
                out_cfg = i;
            } else {
                child_area_unmap(&sr);
            }
        }
        /* recommended: the lowest peak RSS among the runs within 3% of the fastest, so timing
         * noise does not pick a configuration that only looks faster */
        int best = -1;
        double fastest = INFINITY;
        for (int i = 0; i < n; i++)
            if (results[i].exit_code == 0 && results[i].ms < fastest) fastest = results[i].ms;
        for (int i = 0; i < n; i++)
            if (results[i].exit_code == 0 && results[i].ms <= 1.03 * fastest &&
                (best < 0 || results[i].peak_rss < results[best].peak_rss))
                best = i;
        /* --compare: diffusers on the same config, weights and input, in a Python child */
        peer_result peer;
        memset(&peer, 0, sizeof(peer));
        if (o.compare && !strcmp(ref_res->backend, "cuda")) {
            peer.skipped = 1;
            snprintf(peer.note, sizeof(peer.note), "convweave ran on the cuda backend and the diffusers row runs on the cpu");
        } else if (o.compare) {
            snprintf(prog_label, sizeof(prog_label), "[3/3] diffusers");
            peer_job pj = {cfg, o.part, o.weights, o.seed, o.allow_nonfinite, jb.in, {d[0], d[1], d[2], d[3]},
                           out_numel, o.threads, o.repeat, o.dtype, spinner_on(&o), prog_label};
            if (peer_diffusers_run(&pj, &peer, &g_child, &g_stop) < 0) stop_now();
        }
        printf("\n%s backend; time = %s only (best of %d); peak temp/act/total from the library's stats;\n"
               "peak RSS = ru_maxrss of a separate process per configuration; work mem = its peak resident\n"
               "bytes during the run minus those just before it (model loaded); max|diff| vs convweave's own\n"
               "unscheduled run (no patches, no budget)%s\n",
               ref_res->backend, o.part == VAE_DECODER ? "decode" : "encode", o.repeat,
               peer.ran ? "; diffusers = AutoencoderKL on PyTorch, same weights and input" : "");
        table_header();
        table_row(&ref, ref_res, 0);
        for (int i = 0; i < n; i++) table_row(&cfgs[i], &results[i], 1);
        if (peer.ran) peer_row(&peer, ref_out, out_numel);
        if (best < 0) {
            fprintf(stderr, "%s: no configuration fits the budget\n", prog);
            peer_result_free(&peer);
            child_area_unmap(&rs);
            ret = EXIT_USAGE;
            goto out;
        }
        const run_result *b = &results[best];
        if (o.tune) {
            printf("\nrecommended: --streams %d --patches ", cfgs[best].streams);
            if (cfgs[best].policy == CW_PATCHES_AUTO) printf("auto");
            else printf("%d", cfgs[best].patches);
            printf("  (%.1f ms, %.2fx the unscheduled run's time, %.2fx its peak RSS)\n", b->ms, b->ms / ref_res->ms,
                   (double)b->peak_rss / (double)ref_res->peak_rss);
        } else {
            printf("\nscheduled / unscheduled: time %.2fx, peak RSS %.2fx, peak total %.2fx\n", b->ms / ref_res->ms,
                   (double)b->peak_rss / (double)ref_res->peak_rss,
                   ref_res->stats.total_peak > 0 ? (double)b->stats.total_peak / (double)ref_res->stats.total_peak : 0.0);
            if (peer.ran) peer_summary(&peer, b, final.data, out_numel);
            else printf("diffusers: %s%s\n", peer.skipped ? "skipped: " : "", peer.note);
        }
        peer_result_free(&peer);
        if (o.tune && g_n_outs && !o.quiet) printf("output from: %s\n", cfgs[out_cfg].label);
        child_area_unmap(&rs);
    }
    const run_result *fres = final.head;
    if (fres->nonfinite) /* only with --allow-nonfinite: the child fails otherwise */
        fprintf(stderr, "%s: warning: %s (written anyway: --allow-nonfinite)\n", prog, fres->err);
    fflush(stdout);
    ret = finish_outputs(&o, final.data, out_dims);
    child_area_unmap(&final);
out:
    free_outs();
    free(in);
    if (g_stop) stop_now();
    return ret;
}
