/* One convolution through the public graph API, as an application runs it: compiled under
 * a temp budget, then run R times; prints the plan's algorithms and patch count, the best
 * and median run time, GFLOP/s, temp peak and the process's peak RSS. Pair it with
 * bench/conv_torch.py (the same conv in PyTorch) under a whole-process timer.
 *
 *   bench_conv_api C,K,k,H [--budget MiB] [--threads T] [--reps R] [--streams S]
 * (N = 1, H = W, stride 1, "same" padding, bias; --budget -1: no patches, no cap) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "convweave/convweave.h"

#define CHECK(call)                                                                                     \
    do {                                                                                                \
        cw_status st_ = (call);                                                                         \
        if (st_ != CW_OK) {                                                                             \
            fprintf(stderr, "%s failed: %s (%s)\n", #call, cw_status_string(st_),                      \
                    ctx ? cw_context_get_last_error(ctx) : "");                                         \
            return 1;                                                                                   \
        }                                                                                               \
    } while (0)

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    long long c, k, ks, h;
    double budget_mib = 64;
    int threads = 0, reps = 3, streams = 0;
    if (argc < 2 || sscanf(argv[1], "%lld,%lld,%lld,%lld", &c, &k, &ks, &h) != 4) {
        fprintf(stderr, "usage: %s C,K,k,H [--budget MiB] [--threads T] [--reps R] [--streams S]\n", argv[0]);
        return 2;
    }
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--budget")) budget_mib = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--streams")) streams = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (reps < 1 || reps > 64) reps = 3;
    cw_context *ctx = NULL;
    cw_context_config cfg = CW_CONTEXT_CONFIG_INIT;
    cfg.backend = CW_BACKEND_CPU;
    cfg.threads = threads;
    CHECK(cw_context_create(&ctx, &cfg));
    cw_graph *g;
    CHECK(cw_graph_create(&g, ctx));
    int64_t xd[4] = {1, c, h, h}, wd[4] = {k, c, ks, ks}, bd[1] = {k};
    cw_tensor_desc dx, dw, db;
    CHECK(cw_tensor_desc_make(&dx, CW_F32, 4, xd));
    CHECK(cw_tensor_desc_make(&dw, CW_F32, 4, wd));
    CHECK(cw_tensor_desc_make(&db, CW_F32, 1, bd));
    cw_tensor *tx, *tw, *tb, *ty;
    CHECK(cw_tensor_create(&tx, ctx, &dx));
    CHECK(cw_tensor_create(&tw, ctx, &dw));
    CHECK(cw_tensor_create(&tb, ctx, &db));
    /* deterministic data, written in chunks so no second full-size host copy exists */
    {
        const int64_t nx = cw_tensor_desc_numel(&dx), nw = cw_tensor_desc_numel(&dw);
        float *hw = malloc((size_t)nw * 4), *hb = malloc((size_t)k * 4);
        float *hx = malloc((size_t)nx * 4);
        if (!hw || !hb || !hx) {
            fprintf(stderr, "out of host memory\n");
            return 1;
        }
        uint64_t s = 12345;
        for (int64_t i = 0; i < nx; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            hx[i] = (float)((s >> 40) & 0xffff) / 65536.0f - 0.5f;
        }
        for (int64_t i = 0; i < nw; i++) hw[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
        for (int64_t i = 0; i < k; i++) hb[i] = 0.01f * (float)i;
        CHECK(cw_tensor_upload(tx, hx, (size_t)nx * 4));
        CHECK(cw_tensor_upload(tw, hw, (size_t)nw * 4));
        CHECK(cw_tensor_upload(tb, hb, (size_t)k * 4));
        free(hx), free(hw), free(hb);
    }
    cw_node x, y, wn, bn;
    cw_conv_params p = CW_CONV_PARAMS_INIT;
    p.pad_pre[0] = p.pad_pre[1] = p.pad_post[0] = p.pad_post[1] = ks / 2;
    CHECK(cw_graph_input(g, &x, "x", &dx));
    CHECK(cw_graph_constant(g, &wn, "w", tw));
    CHECK(cw_graph_constant(g, &bn, "b", tb));
    CHECK(cw_graph_conv(g, &y, x, wn, bn, &p));
    CHECK(cw_graph_output(g, y, "y"));
    cw_compile_options o = CW_COMPILE_OPTIONS_INIT;
    o.streams = streams;
    if (budget_mib < 0) {
        o.policy = CW_PATCHES_NONE;
        o.temp_budget = -1;
    } else {
        o.temp_budget = (int64_t)(budget_mib * 1048576.0);
    }
    cw_plan *plan;
    CHECK(cw_graph_compile(g, &plan, &o));
    cw_tensor_desc dy;
    CHECK(cw_conv_output_desc(ctx, &dy, &dx, &dw, &p));
    CHECK(cw_tensor_create(&ty, ctx, &dy));
    double t[64];
    for (int r = 0; r < reps; r++) {
        CHECK(cw_plan_run(plan, &tx, 1, &ty, 1));
        cw_plan_stats st;
        CHECK(cw_plan_get_stats(plan, &st));
        t[r] = st.wall_ms * 1e-3;
    }
    cw_plan_stats st;
    CHECK(cw_plan_get_stats(plan, &st));
    char *desc = NULL;
    CHECK(cw_plan_describe(plan, &desc, 0));
    /* the algorithm names of the conv's patches, from the description */
    char algos[256] = "";
    for (const char *q = desc; (q = strstr(q, "cpu_")) != NULL;) {
        char name[48];
        int n = 0;
        while (q[n] && q[n] != ' ' && q[n] != ',' && q[n] != '\n' && q[n] != ')' && n < 47) n++;
        snprintf(name, sizeof name, "%.*s", n, q);
        if (!strstr(algos, name) && strlen(algos) + strlen(name) + 2 < sizeof algos) {
            if (algos[0]) strcat(algos, "+");
            strcat(algos, name);
        }
        q += n;
    }
    cw_free(desc);
    qsort(t, (size_t)reps, sizeof t[0], cmp_d);
    double flops = 2.0 * (double)k * (double)c * (double)(ks * ks) * (double)(h * h);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("convweave %lld->%lld k%lld %lld^2 budget %s%.0f MiB threads %d: patches %lld, %s, best %.3f s, median %.3f s, "
           "%.1f GFLOP/s, temp peak %.1f MiB, peak RSS %.1f MiB\n",
           c, k, ks, h, budget_mib < 0 ? "none " : "", budget_mib < 0 ? 0.0 : budget_mib, threads,
           (long long)st.n_patches, algos, t[0], t[reps / 2], flops / t[0] * 1e-9, (double)st.temp_peak / 1048576.0,
           (double)ru.ru_maxrss / 1024.0);
    cw_plan_destroy(plan);
    cw_graph_destroy(g);
    cw_tensor_destroy(tx), cw_tensor_destroy(tw), cw_tensor_destroy(tb), cw_tensor_destroy(ty);
    cw_context_destroy(ctx);
    return 0;
}
