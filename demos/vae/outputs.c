/* cw-vae's outputs, all or nothing: each is checked (not an input, not another output, a
 * regular file if it exists), staged beside its target before the run, written after it and
 * renamed into place together; a failure or a stop signal leaves the targets as they were. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "image.h"
#include "npy.h"
#include "safetensors.h"

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

void outputs_free(void) {
    unstage_all();
    for (int i = 0; i < g_n_outs; i++) free(g_outs[i].path);
    free(g_outs);
    g_outs = NULL;
    g_n_outs = 0;
}

/* Stopped by a signal: remove what was staged, then die of the same signal. */
void stop_now(void) {
    outputs_free();
    int sig = g_stop;
    fflush(stdout);
    struct rlimit none = {0, 0}; /* SIGQUIT/SIGXFSZ: the user stopped us, no core file beside the outputs */
    setrlimit(RLIMIT_CORE, &none);
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
    if (path[0] != '/' && !getcwd(real, sizeof(real)) && errno == ENOENT)
        return die_usage("%s %s: the working folder no longer exists (deleted): a relative path names nothing; "
                         "give an absolute one", flag, path);
    if (!slash) snprintf(dir, sizeof(dir), ".");
    else if (slash == path) snprintf(dir, sizeof(dir), "/");
    else snprintf(dir, sizeof(dir), "%.*s", (int)(slash - path), path);
    if (!realpath(dir, real)) return die_usage("%s %s: folder %s: %s", flag, path, dir, strerror(errno));
    if ((size_t)snprintf(buf, len, "%s/%s", real, base) >= len) return die_usage("%s %s: path too long", flag, path);
    return 0;
}

/* Every output: not an input (same inode), not another output, a regular file if it exists. */
int outputs_check(const char *const *inputs, const char *const *in_flags, int n_in) {
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
int outputs_stage(void) {
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

/* --scaled-latent on --latent-out: (z - shift) * scaling must stay finite in float32.
 * Returns 0, or -1 after a message naming the flag and where. */
static int latent_scale(const opts *o, float *z, const int64_t zd[4]) {
    int64_t n = zd[0] * zd[1] * zd[2] * zd[3];
    vae_latent_scale(&o->cfg, z, (size_t)n);
    int64_t bad = vae_find_nonfinite(z, n);
    if (bad < 0) return 0;
    char where[160];
    vae_index_str(where, sizeof(where), z, bad, 4, zd);
    say("--latent-out %s: --scaled-latent with scaling factor %g and shift %g gives %s: the latent does not fit "
        "float32 (nothing written)", o->latent_out, o->cfg.scaling_factor, o->cfg.shift_factor, where);
    return -1;
}

static void write_out_error(const out_file *f, const char *err) {
    say("%s %s: %s", f->flag, f->path, err);
}

/* Moves the renamed targets back (or removes the new ones that had no old file). */
static void roll_back(char **old, int done) {
    for (int j = 0; j < done; j++) {
        if (old[j]) rename(old[j], g_outs[j].path);
        else unlink(g_outs[j].path);
    }
}

/* Renames every staged file onto its target, all or nothing: each existing target first gets
 * a hard link beside it (its staged name + ".old"), so a target that cannot be replaced
 * (immutable, append-only) fails before anything moved; when a rename still fails, those
 * done are moved back. The stop signals are held meanwhile. Returns 0 or EXIT_RUN. */
static int commit_all(const opts *o) {
    sigset_t block, oldmask;
    sigemptyset(&block);
    for (int i = 0; i < N_STOP_SIGNALS; i++) sigaddset(&block, stop_signals[i]);
    sigprocmask(SIG_BLOCK, &block, &oldmask);
    char **old = calloc((size_t)g_n_outs + 1, sizeof(*old));
    int ret = old ? 0 : EXIT_RUN, done = 0;
    if (!old) say("out of memory");
    for (int i = 0; i < g_n_outs && !ret; i++) {
        out_file *f = &g_outs[i];
        struct stat s;
        if (lstat(f->path, &s) != 0 && errno == ENOENT) continue;
        size_t len = strlen(f->tmp) + 8;
        if (!(old[i] = malloc(len))) {
            ret = EXIT_RUN;
            break;
        }
        snprintf(old[i], len, "%s.old", f->tmp);
        if (link(f->path, old[i]) != 0) {
            char why[160];
            snprintf(why, sizeof(why), "cannot be replaced (keeping a link to it failed: %s): nothing written",
                     strerror(errno));
            write_out_error(f, why);
            free(old[i]);
            old[i] = NULL;
            ret = EXIT_RUN;
        }
    }
    for (; done < g_n_outs && !ret; done++)
        if (rename(g_outs[done].tmp, g_outs[done].path) != 0) {
            write_out_error(&g_outs[done], strerror(errno));
            roll_back(old, done);
            ret = EXIT_RUN;
        }
    for (int i = 0; i < g_n_outs; i++) {
        if (old && old[i]) unlink(old[i]);
        if (old) free(old[i]);
        if (!ret && !o->quiet) printf("wrote %s\n", g_outs[i].path);
        if (!ret) free(g_outs[i].tmp), g_outs[i].tmp = NULL;
    }
    free(old);
    unstage_all();
    sigprocmask(SIG_SETMASK, &oldmask, NULL);
    return ret;
}

/* Writes the results into the staged files, then renames all of them into place. Returns 0
 * or an exit code (nothing renamed then, and every staged file removed). */
int outputs_finish(const opts *o, const float *out, const int64_t dims[4]) {
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
                    say("out of memory for the latents");
                    return EXIT_RUN;
                }
                if (o->scaled_latent && latent_scale(o, z, zd)) {
                    free(z);
                    unstage_all();
                    return EXIT_USAGE;
                }
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
    return commit_all(o);
}

/* -o (one per sample of a batch), --raw, --latent-out and --trace. */
int outputs_add(const opts *o, int64_t batch) {
    int oom = 0;
    if (o->output) {
        if (o->cfg.out_channels != 1 && o->cfg.out_channels != 3)
            return die_usage("-o %s: a PNG holds 1 or 3 channels, the model writes %d (use --raw)", o->output,
                             o->cfg.out_channels);
        if (batch == 1) oom |= add_out("-o", o->output, 0);
        for (int64_t i = 0; batch > 1 && i < batch; i++) {
            char *p = sample_path(o->output, (int)i);
            oom |= !p || add_out("-o", p, (int)i);
            free(p);
        }
    }
    if (o->raw) oom |= add_out("--raw", o->raw, -1);
    if (o->latent_out) {
        size_t L = strlen(o->latent_out);
        if (!(L > 4 && !strcmp(o->latent_out + L - 4, ".npy")) && !(L > 12 && !strcmp(o->latent_out + L - 12, ".safetensors")))
            return die_usage("--latent-out %s: expected a .npy or .safetensors name", o->latent_out);
        oom |= add_out("--latent-out", o->latent_out, -1);
    }
    if (o->trace) oom |= add_out("--trace", o->trace, -1);
    return oom ? die_usage("out of memory") : 0;
}

const char *outputs_trace_tmp(void) {
    for (int i = 0; i < g_n_outs; i++)
        if (!strcmp(g_outs[i].flag, "--trace")) return g_outs[i].tmp;
    return NULL;
}

int outputs_any(void) { return g_n_outs > 0; }
