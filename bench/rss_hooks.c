/* LD_PRELOAD hooks that print the process's resident set (VmRSS) and its peak (VmHWM) to
 * stderr around cw_graph_compile and cw_plan_run, and after cw_plan_destroy and
 * cw_context_destroy: where resident memory goes in a cw-vae child (bench/RESULTS.md).
 * Build: cc -shared -fPIC -O2 -o rss_hooks.so bench/rss_hooks.c -ldl
 * Use:   LD_PRELOAD=./rss_hooks.so ./build/cw-vae ... */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>

#include "convweave/convweave.h"

static void report(const char *tag) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return;
    char l[256];
    long rss = -1, hwm = -1;
    while (fgets(l, sizeof l, f)) {
        sscanf(l, "VmRSS: %ld", &rss);
        sscanf(l, "VmHWM: %ld", &hwm);
    }
    fclose(f);
    fprintf(stderr, "[rss] %-16s RSS %7.1f MiB  peak %7.1f MiB\n", tag, rss / 1024.0, hwm / 1024.0);
}

#define NEXT(name) ((name##_fn)dlsym(RTLD_NEXT, #name))

typedef cw_status (*cw_graph_compile_fn)(cw_graph *, cw_plan **, const cw_compile_options *);
cw_status cw_graph_compile(cw_graph *g, cw_plan **out, const cw_compile_options *o) {
    report("before compile");
    cw_status st = NEXT(cw_graph_compile)(g, out, o);
    report("after compile");
    return st;
}

typedef cw_status (*cw_plan_run_fn)(cw_plan *, cw_tensor *const *, int, cw_tensor *const *, int);
cw_status cw_plan_run(cw_plan *p, cw_tensor *const *in, int n_in, cw_tensor *const *out, int n_out) {
    cw_status st = NEXT(cw_plan_run)(p, in, n_in, out, n_out);
    report("after run");
    return st;
}

typedef void (*cw_plan_destroy_fn)(cw_plan *);
void cw_plan_destroy(cw_plan *p) {
    NEXT(cw_plan_destroy)(p);
    if (p) report("after plan free");
}

typedef void (*cw_context_destroy_fn)(cw_context *);
void cw_context_destroy(cw_context *c) {
    NEXT(cw_context_destroy)(c);
    if (c) report("after ctx free");
}
