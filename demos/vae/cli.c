/* cw-vae's command line: the options, their parsing and checking (every bad value is one
 * line naming the flag, exit status 2) and --help. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <float.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cli.h"

/* --memory auto's percentage where none is given: the library's (CW_COMPILE_OPTIONS_INIT) */
static double auto_pct_default(void) {
    const cw_compile_options d = CW_COMPILE_OPTIONS_INIT;
    return d.memory_auto_pct;
}
#include "sys.h"

const char *prog = "cw-vae";

static void usage_model(FILE *f) {
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
            "  --scaled-latent       store (z - shift) * scaling, as a pipeline feeds the denoiser\n",
            prog, vae_preset_names());
}

static void usage(FILE *f) {
    usage_model(f);
    fprintf(f,
            "scheduling\n"
            "  --budget SIZE         temporary-memory cap: e.g. 512MiB (default), 64MiB, 2GiB, 1GB,\n"
            "                        1048576 (bytes); units B KiB MiB GiB KB MB GB; 'unlimited'\n"
            "  --memory auto[:PCT]|none|SIZE  cap on activations + temporaries (weights apart):\n"
            "                        where storing every activation needs more, ResNet blocks' inner\n"
            "                        activations are recomputed band by band (exact; costs FLOPs, printed).\n"
            "                        auto (default): the least memory the ladder (--plan) gives for at\n"
            "                        most PCT %% (default 10) more conv time, as the backend estimates it\n"
            "                        (cuda: more conv FLOPs); none: store everything.\n"
            "                        SIZE without --budget: cw-vae chooses the temporaries' share of SIZE\n"
            "  --streams N           1 = in order; N = N-1 heavy streams + 1 light (default 2)\n"
            "  --patches auto|N|none row patches per conv: fewest that fit, fixed N, or unscheduled\n"
            "                        (none ignores any budget: giving both is an error)\n"
            "  --backend auto|cpu|cuda (default auto: cuda where a device is usable, else cpu)\n"
            "  --dtype f32|f16|bf16  compute dtype (default f32; others only where the backend has them)\n"
            "  --threads N           cpu: BLAS threads in total (default all cores)\n"
            "  --no-memory-check     skip the up-front check of the job's size against the machine's memory\n"
            "across processes (cpu backend; needs a cw-vae built with MPI)\n"
            "  --ranks N             one decode over N local processes: cw-vae starts mpirun -n N (Open MPI,\n"
            "                        or $CW_VAE_MPIRUN), each rank holds a band of rows of every tensor and\n"
            "                        exchanges halos, GroupNorm partials and attention's inputs with the\n"
            "                        others; rank 0 gathers the output. Bit-identical to one process with\n"
            "                        the same --patches P (P >= N: below N each conv gets N patches) and\n"
            "                        --memory none (a rank never writes a block's result over its input, so\n"
            "                        --memory may choose another plan than one process's);\n"
            "                        --patches auto cuts each conv in at least N patches. Prints each rank's\n"
            "                        time, working memory and peak RSS. --threads is then per rank (default:\n"
            "                        the cores / N). --ranks 1 (default) is one process, the baseline\n"
            "  --compare-ranks       with --ranks N: run the one-process decode first (same options, all\n"
            "                        cores) and print it in the ranks' table with max|diff| against it\n"
            "  --comm-timeout SEC    a message between ranks that takes longer fails the run (default 600)\n"
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
            "complete; a failure or a stop signal (INT, TERM, HUP, QUIT, PIPE, XFSZ) leaves the targets as\n"
            "they were and removes the staged files (SIGKILL cannot be caught: it may leave *.cw-* files).\n"
            "Peak RSS: each configuration runs in its own forked child process, forked before any\n"
            "weights or activations exist; the child loads the weights, builds, compiles, runs and\n"
            "writes its output into a shared mapping; its peak RSS is ru_maxrss from wait4(), i.e.\n"
            "everything resident in that process (libraries, weights, activations, temporaries,\n"
            "the output). Time is the run alone (upload, run, download), not loading or compiling.\n"
            "Exit status: 0 ok, 1 a run failed (or its output is not finite), 2 bad input (option,\n"
            "file, key, shape, budget, memory); 128+N when stopped by signal N.\n");
}


/* "prog: MESSAGE" as one line: a path with a newline (or another control byte) in it is
 * printed escaped (\n), so every message stays one line. */
static void vsay(const char *fmt, va_list ap) {
    char msg[2048], esc[4096];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    fprintf(stderr, "%s: %s\n", prog, sys_escape(esc, sizeof(esc), msg));
}

void say(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsay(fmt, ap);
    va_end(ap);
}

int die_usage(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsay(fmt, ap);
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


enum {
    OPT_PRESET = 256, OPT_CHANNELS, OPT_LAYERS, OPT_LATENT_CH, OPT_WEIGHTS, OPT_RANDOM, OPT_SEED,
    OPT_LATENT, OPT_SCALED, OPT_SIZE, OPT_HEIGHT, OPT_WIDTH, OPT_RAW, OPT_BUDGET, OPT_MEMORY, OPT_STREAMS,
    OPT_PATCHES, OPT_BACKEND, OPT_DTYPE, OPT_THREADS, OPT_COMPARE, OPT_TUNE, OPT_REPEAT, OPT_TRACE,
    OPT_NVTX, OPT_PLAN, OPT_MODEL, OPT_GROUPS, OPT_IN_CH, OPT_OUT_CH, OPT_QC, OPT_PQC, OPT_MIDATT,
    OPT_SCALING, OPT_SHIFT, OPT_NONFINITE, OPT_BATCH, OPT_ENCODE, OPT_LATENT_OUT, OPT_SAMPLE, OPT_NO_MEM,
    OPT_RANKS, OPT_COMPARE_RANKS, OPT_COMM_TIMEOUT, OPT_RANK_AREA
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
    {"ranks", required_argument, 0, OPT_RANKS},     {"compare-ranks", no_argument, 0, OPT_COMPARE_RANKS},
    {"comm-timeout", required_argument, 0, OPT_COMM_TIMEOUT}, {"rank-area", required_argument, 0, OPT_RANK_AREA},
    {"quiet", no_argument, 0, 'q'},                 {"help", no_argument, 0, 'h'},
    {0, 0, 0, 0}};

#define INT_OPT(flag, lo, hi, dst)                                                                                   \
    if (parse_int(optarg, lo, hi, &(dst)))                                                                           \
        return die_usage("%s '%s': expected an integer in [%lld, %lld]", flag, optarg, (long long)(lo), (long long)(hi)); \
    return 0

/* --scaling-factor: a latent (float32) times it must stay finite and non-zero, so the value
 * lies in [1 / FLT_MAX, FLT_MAX]; the message says which way it is out. */
static int parse_scaling(const char *arg, arch_flags *af) {
    char *end = NULL;
    errno = 0;
    double v = strtod(arg, &end);
    if (end == arg || *end || isnan(v) || (v <= 0 && errno != ERANGE))
        return die_usage("--scaling-factor '%s': expected a positive number", arg);
    if (v <= 0) return die_usage("--scaling-factor '%s': underflows to 0, too small: expected a positive number", arg);
    if (!vae_scaling_factor_ok(v))
        return die_usage("--scaling-factor '%s': %s: expected a number in [%g, %g], so that a float32 latent "
                         "scaled by it stays finite and non-zero", arg,
                         v < DBL_MIN ? "subnormal, too small" : v < 1 ? "too small" : isinf(v) ? "overflows" : "too large",
                         1.0 / FLT_MAX, (double)FLT_MAX);
    af->scaling = v;
    af->has_scaling = 1;
    return 0;
}

/* The architecture's flags (applied over the preset or config.json later). Returns 0,
 * EXIT_USAGE, or -1 when c is not one of them. */
static int parse_arch_opt(int c, arch_flags *af, const char **preset, opts *o) {
    switch (c) {
    case OPT_PRESET: *preset = optarg; return 0;
    case OPT_MODEL: o->model = optarg; return 0;
    case OPT_CHANNELS: af->channels = optarg; return 0;
    case OPT_LAYERS: INT_OPT("--layers", 0, 64, af->layers);
    case OPT_GROUPS: INT_OPT("--groups", 1, 1 << 20, af->groups);
    case OPT_LATENT_CH: INT_OPT("--latent-channels", 1, 4096, af->latent_ch);
    case OPT_IN_CH: INT_OPT("--in-channels", 1, 4096, af->in_ch);
    case OPT_OUT_CH: INT_OPT("--out-channels", 1, 4096, af->out_ch);
    case OPT_QC: INT_OPT("--quant-conv", 0, 1, af->qc);
    case OPT_PQC: INT_OPT("--post-quant-conv", 0, 1, af->pqc);
    case OPT_MIDATT: INT_OPT("--mid-attention", 0, 1, af->midatt);
    case OPT_SCALING: return parse_scaling(optarg, af);
    case OPT_SHIFT:
        if (parse_double(optarg, &af->shift) || fabs(af->shift) > FLT_MAX)
            return die_usage("--shift-factor '%s': expected a number within float32's range (|x| <= %g)", optarg,
                             (double)FLT_MAX);
        af->has_shift = 1;
        return 0;
    default: return -1;
    }
}

/* --memory auto[:PCT] | none | SIZE */
static int parse_memory(const char *arg, opts *o) {
    if (strncmp(arg, "auto", 4) == 0 && (arg[4] == 0 || arg[4] == ':')) {
        char *end = NULL;
        o->memory = MEMORY_AUTO;
        o->auto_pct = arg[4] ? strtod(arg + 5, &end) : auto_pct_default();
        if (arg[4] && (end == arg + 5 || *end || !(o->auto_pct >= 0) || o->auto_pct > 1000))
            return die_usage("--memory '%s': auto:PCT takes a percentage of extra conv FLOPs in 0..1000", arg);
    } else if (strcmp(arg, "none") == 0) {
        o->memory = 0;
    } else if (parse_size(arg, &o->memory) || o->memory <= 0) {
        return die_usage("--memory '%s': expected auto, none or a size like 1GiB (units B, KiB, MiB, GiB, TiB, KB, MB, GB, TB, in any case)",
                         arg);
    }
    return 0;
}

/* Inputs, outputs and what is decoded or encoded. Returns 0, EXIT_USAGE, or -1 when c is
 * not one of them. */
static int parse_io_opt(int c, opts *o) {
    int64_t v, size = 0;
    switch (c) {
    case OPT_WEIGHTS: o->weights = optarg; return 0;
    case OPT_RANDOM: o->random_weights = 1; return 0;
    case OPT_SEED:
        if (parse_int(optarg, 0, INT64_MAX, &v)) return die_usage("--seed '%s': expected a non-negative integer", optarg);
        o->seed = (uint64_t)v;
        return 0;
    case OPT_NONFINITE: o->allow_nonfinite = 1; return 0;
    case OPT_LATENT: o->latent = optarg; return 0;
    case OPT_BATCH: INT_OPT("--batch", 1, 4096, o->batch);
    case OPT_SCALED: o->scaled_latent = 1; return 0;
    case OPT_SIZE:
        if (parse_int(optarg, 1, 1 << 20, &size)) return die_usage("--size '%s': expected a positive integer", optarg);
        o->height = o->width = size;
        return 0;
    case OPT_HEIGHT:
        if (parse_int(optarg, 1, 1 << 20, &o->height)) return die_usage("--height '%s': expected a positive integer", optarg);
        return 0;
    case OPT_WIDTH:
        if (parse_int(optarg, 1, 1 << 20, &o->width)) return die_usage("--width '%s': expected a positive integer", optarg);
        return 0;
    case 'o': o->output = optarg; return 0;
    case OPT_RAW: o->raw = optarg; return 0;
    case OPT_ENCODE:
        if (o->n_images == MAX_IMAGES) return die_usage("--encode: more than %d images", MAX_IMAGES);
        o->images[o->n_images++] = optarg;
        o->part = VAE_ENCODER;
        return 0;
    case OPT_LATENT_OUT: o->latent_out = optarg; return 0;
    case OPT_SAMPLE: o->sample = 1; return 0;
    default: return -1;
    }
}

/* Scheduling and backend. Returns 0, EXIT_USAGE, or -1 when c is not one of them. */
static int parse_sched_opt(int c, opts *o) {
    int64_t v;
    switch (c) {
    case OPT_MEMORY: return parse_memory(optarg, o);
    case OPT_BUDGET:
        if (parse_size(optarg, &o->budget))
            return die_usage("--budget '%s': expected a size like 512MiB (units B, KiB, MiB, GiB, TiB, KB, MB, GB, TB, in any case) or 'unlimited'",
                             optarg);
        if (o->budget == 0) return die_usage("--budget '%s': must be more than 0 (or 'unlimited')", optarg);
        o->budget_given = 1;
        return 0;
    case OPT_STREAMS:
        if (parse_int(optarg, 1, 8, &v)) return die_usage("--streams '%s': expected an integer in [1, 8]", optarg);
        o->streams = (int)v;
        return 0;
    case OPT_PATCHES:
        if (!strcmp(optarg, "auto")) o->patches = 0;
        else if (!strcmp(optarg, "none")) o->patches = -1;
        else if (parse_int(optarg, 1, 1 << 20, &v)) return die_usage("--patches '%s': expected auto, none or a positive integer", optarg);
        else o->patches = (int)v;
        return 0;
    case OPT_BACKEND:
        if (!strcmp(optarg, "auto")) o->backend = CW_BACKEND_AUTO;
        else if (!strcmp(optarg, "cpu")) o->backend = CW_BACKEND_CPU;
        else if (!strcmp(optarg, "cuda")) o->backend = CW_BACKEND_CUDA;
        else return die_usage("--backend '%s': expected auto, cpu or cuda", optarg);
        return 0;
    case OPT_DTYPE:
        if (!strcmp(optarg, "f32")) o->dtype = CW_F32;
        else if (!strcmp(optarg, "f16")) o->dtype = CW_F16;
        else if (!strcmp(optarg, "bf16")) o->dtype = CW_BF16;
        else return die_usage("--dtype '%s': expected f32, f16 or bf16", optarg);
        return 0;
    case OPT_THREADS:
        if (parse_int(optarg, 1, 1024, &v)) return die_usage("--threads '%s': expected an integer in [1, 1024]", optarg);
        o->threads = (int)v;
        return 0;
    case OPT_NO_MEM: o->no_mem_check = 1; return 0;
    case OPT_RANKS:
        if (parse_int(optarg, 1, MAX_RANKS, &v)) return die_usage("--ranks '%s': expected an integer in [1, %d]", optarg, MAX_RANKS);
        o->ranks = (int)v;
        return 0;
    case OPT_COMPARE_RANKS: o->compare_ranks = 1; return 0;
    case OPT_COMM_TIMEOUT:
        if (parse_double(optarg, &o->comm_timeout) || o->comm_timeout <= 0 || o->comm_timeout > 1e7)
            return die_usage("--comm-timeout '%s': expected seconds, more than 0", optarg);
        return 0;
    case OPT_RANK_AREA: o->rank_area = optarg; return 0;
    default: return -1;
    }
}

/* Measurement and reporting. Returns 0, EXIT_USAGE, or -1 when c is not one of them. */
static int parse_measure_opt(int c, opts *o) {
    int64_t v;
    switch (c) {
    case OPT_COMPARE: o->compare = 1; return 0;
    case OPT_TUNE: o->tune = 1; return 0;
    case OPT_REPEAT:
        if (parse_int(optarg, 1, 1000, &v)) return die_usage("--repeat '%s': expected an integer in [1, 1000]", optarg);
        o->repeat = (int)v;
        return 0;
    case OPT_TRACE: o->trace = optarg; return 0;
    case OPT_NVTX: o->nvtx = 1; return 0;
    case OPT_PLAN: o->describe = 1; return 0;
    case 'q': o->quiet = 1; return 0;
    default: return -1;
    }
}
#undef INT_OPT

static void set_defaults(opts *o) {
    memset(o, 0, sizeof(*o));
    o->budget = 512ll << 20;
    o->memory = MEMORY_AUTO;
    o->auto_pct = auto_pct_default();
    o->streams = 2;
    o->repeat = 1;
    o->ranks = 1;
    o->comm_timeout = 600;
    o->batch = 1;
    o->dtype = CW_F32;
    o->backend = CW_BACKEND_AUTO;
    o->part = VAE_DECODER;
}

/* The model: the preset or --model's config.json, the architecture flags over it. */
static int resolve_model(opts *o, const char *preset, const arch_flags *af) {
    char err[VAE_ERR_LEN];
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
    if (af->channels && vae_parse_channels(cf, af->channels, err, sizeof(err))) return die_usage("%s", err);
    if (af->layers >= 0) cf->layers_per_block = (int)af->layers;
    if (af->groups > 0) cf->groups = (int)af->groups;
    if (af->latent_ch > 0) cf->latent_channels = (int)af->latent_ch;
    if (af->in_ch > 0) cf->in_channels = (int)af->in_ch;
    if (af->out_ch > 0) cf->out_channels = (int)af->out_ch;
    if (af->qc >= 0) cf->quant_conv = (int)af->qc;
    if (af->pqc >= 0) cf->post_quant_conv = (int)af->pqc;
    if (af->midatt >= 0) cf->mid_attention = (int)af->midatt;
    if (af->has_scaling) cf->scaling_factor = af->scaling;
    if (af->has_shift) cf->shift_factor = af->shift;
    if (vae_config_validate(cf, err, sizeof(err))) return die_usage("model: %s", err);
    return 0;
}

/* Flags that contradict each other or the direction (decode / encode). */
static int check_combination(const opts *o) {
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
    if (o->ranks > 1 || o->compare_ranks) {
#ifndef CW_VAE_MPI
        return die_usage("--ranks %d: this cw-vae was built without MPI (install libopenmpi-dev openmpi-bin and "
                         "rebuild)", o->ranks);
#endif
        if (o->compare_ranks && o->ranks < 2) return die_usage("--compare-ranks needs --ranks N with N > 1");
        if (o->compare || o->tune) return die_usage("--ranks: not with --compare or --tune (use --compare-ranks)");
        if (o->trace) return die_usage("--trace is for a run in one process, not --ranks");
        if (o->backend == CW_BACKEND_CUDA) return die_usage("--ranks runs on the cpu backend (the MPI messages are host memory)");
        if (!o->rank_area && (getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE")))
            return die_usage("--ranks %d: cw-vae starts mpirun itself: run it without mpirun", o->ranks);
    }
    if (o->scaled_latent && o->cfg.latents_stats)
        return die_usage("--scaled-latent: %s has latents_mean/latents_std, which cw-vae does not apply", o->model_config);
    return 0;
}

int cli_parse_args(int argc, char **argv, opts *o) {
    const char *preset = NULL;
    arch_flags af = {NULL, -1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0};
    set_defaults(o);
    opterr = 0;
    int c, rc;
    int li = -1;
    while ((c = getopt_long(argc, argv, ":o:qh", longopts, &li)) != -1) {
        if (c == 'h') {
            usage(stdout);
            exit(0);
        }
        if (c == ':') return die_usage("option '%s' needs an argument (see --help)", argv[optind - 1]);
        if (optarg && !*optarg) /* '' names no file, size or number: say which option got it */
            return die_usage("%s%s '': empty value (see --help)", c == 'o' ? "-" : "--",
                             c == 'o' ? "o" : li >= 0 ? longopts[li].name : "?");
        li = -1;
        if ((rc = parse_arch_opt(c, &af, &preset, o)) >= 0 || (rc = parse_io_opt(c, o)) >= 0 ||
            (rc = parse_sched_opt(c, o)) >= 0 || (rc = parse_measure_opt(c, o)) >= 0) {
            if (rc) return rc;
            continue;
        }
        return die_usage("unknown option '%s' (see --help)", argv[optind - 1]);
    }
    if (optind < argc) return die_usage("unexpected argument '%s' (see --help)", argv[optind]);
    if ((rc = resolve_model(o, preset, &af))) return rc;
    return check_combination(o);
}
