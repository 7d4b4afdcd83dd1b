/* Backend selection. Without a usable GPU: CW_BACKEND_AUTO gives "cpu" and says why at info
 * level; CW_BACKEND_CUDA fails with CW_ERR_NO_DEVICE and a message naming the cause (logged
 * through log_fn, since no context exists). With a GPU (and a CUDA build) cuda is chosen,
 * and an out-of-range device index is refused or, for auto, falls back. */
#include <pthread.h>

#include "testutil.h"
#include "convweave/convweave.h"

#ifdef CW_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "convweave/convweave_cuda.h"
#endif

#define MAX_LINES 64
typedef struct log_cap {
    pthread_mutex_t mu;
    int n;
    cw_log_level lv[MAX_LINES];
    char line[MAX_LINES][1200];
} log_cap;

static void capture(void *user, cw_log_level lv, const char *msg) {
    log_cap *c = user;
    pthread_mutex_lock(&c->mu);
    if (c->n < MAX_LINES) {
        c->lv[c->n] = lv;
        snprintf(c->line[c->n], sizeof c->line[0], "%s", msg);
        c->n++;
    }
    pthread_mutex_unlock(&c->mu);
}

/* Index of the first line at exactly `lv` containing every needle (NULL-terminated), or -1. */
static int find_line(log_cap *c, cw_log_level lv, const char *const *needles) {
    for (int i = 0; i < c->n; i++) {
        if (c->lv[i] != lv) continue;
        int all = 1;
        for (int k = 0; needles[k] && all; k++) all = strstr(c->line[i], needles[k]) != NULL;
        if (all) return i;
    }
    return -1;
}

static void dump(log_cap *c) {
    for (int i = 0; i < c->n; i++) fprintf(stderr, "  log[%d] level %d: %s\n", i, (int)c->lv[i], c->line[i]);
}

static cw_status make(cw_backend_kind kind, int device, log_cap *cap, cw_context **out) {
    cw_context_config cfg = CW_CONTEXT_CONFIG_INIT;
    cfg.backend = kind;
    cfg.device = device;
    cfg.log_fn = capture;
    cfg.log_user = cap;
    cfg.log_level = CW_LOG_INFO;
    static char sentinel;
    cap->n = 0;
    *out = (cw_context *)(void *)&sentinel; /* cw_context_create must reset it to NULL on failure */
    return cw_context_create(out, &cfg);
}

int main(void) {
    static log_cap cap;
    pthread_mutex_init(&cap.mu, NULL);
    int devices = 0;
#ifdef CW_HAVE_CUDA
    const int compiled = 1;
    cudaError_t e = cudaGetDeviceCount(&devices);
    (void)cudaGetLastError();
    if (e != cudaSuccess) devices = 0;
    fprintf(stderr, "built with CUDA; cudaGetDeviceCount: %s, %d device(s)\n", cudaGetErrorName(e), devices);
#else
    const int compiled = 0;
    fprintf(stderr, "built without CUDA\n");
#endif
    cw_context *ctx = NULL;

    /* auto */
    ASSERT_OK(make(CW_BACKEND_AUTO, 0, &cap, &ctx));
    ASSERT_TRUE(ctx != NULL);
    if (devices > 0) {
        ASSERT_TRUE(strcmp(cw_context_get_backend_name(ctx), "cuda") == 0);
    } else {
        ASSERT_TRUE(strcmp(cw_context_get_backend_name(ctx), "cpu") == 0);
        /* The fallback is announced at info level, with the reason. */
        const char *why_cuda[] = {"cuda", "cpu", "cudaGetDeviceCount", NULL};
        const char *why_nocuda[] = {"without CUDA", "cpu", NULL};
        int i = find_line(&cap, CW_LOG_INFO, compiled ? why_cuda : why_nocuda);
        if (i < 0) dump(&cap);
        ASSERT_TRUE(i >= 0);
        fprintf(stderr, "auto fallback: %s\n", cap.line[i]);
        ASSERT_EQ_I(find_line(&cap, CW_LOG_ERROR, (const char *const[]){"", NULL}), -1);
    }
    cw_context_destroy(ctx);

    /* cuda */
    cw_status st = make(CW_BACKEND_CUDA, 0, &cap, &ctx);
    if (devices > 0) {
        ASSERT_EQ_I(st, CW_OK);
        ASSERT_TRUE(strcmp(cw_context_get_backend_name(ctx), "cuda") == 0);
        cw_context_destroy(ctx);
    } else {
        ASSERT_EQ_I(st, CW_ERR_NO_DEVICE);
        ASSERT_TRUE(ctx == NULL);
        const char *why_cuda[] = {"no usable CUDA device", "cudaGetDeviceCount", NULL};
        const char *why_nocuda[] = {"built without CUDA", NULL};
        int i = find_line(&cap, CW_LOG_ERROR, compiled ? why_cuda : why_nocuda);
        if (i < 0) dump(&cap);
        ASSERT_TRUE(i >= 0);
        fprintf(stderr, "cuda refused: %s\n", cap.line[i]);
    }

    /* A device index that does not exist: cuda refuses it by number, auto falls back. */
    if (devices > 0) {
        ASSERT_EQ_I(make(CW_BACKEND_CUDA, devices, &cap, &ctx), CW_ERR_NO_DEVICE);
        ASSERT_TRUE(ctx == NULL);
        char want[64];
        snprintf(want, sizeof want, "device %d requested", devices);
        const char *needles[] = {want, NULL};
        int i = find_line(&cap, CW_LOG_ERROR, needles);
        if (i < 0) dump(&cap);
        ASSERT_TRUE(i >= 0);
        ASSERT_OK(make(CW_BACKEND_AUTO, devices, &cap, &ctx));
        ASSERT_TRUE(strcmp(cw_context_get_backend_name(ctx), "cpu") == 0);
        cw_context_destroy(ctx);
    }

    /* cpu is always available and never mentions cuda. */
    ASSERT_OK(make(CW_BACKEND_CPU, 0, &cap, &ctx));
    ASSERT_TRUE(strcmp(cw_context_get_backend_name(ctx), "cpu") == 0);
    ASSERT_EQ_I(find_line(&cap, CW_LOG_INFO, (const char *const[]){"cuda", NULL}), -1);
#ifdef CW_HAVE_CUDA
    /* The CUDA interop calls refuse a cpu context, by name. */
    void *stream = (void *)&cap;
    int dev = -1;
    ASSERT_EQ_I(cw_context_set_cuda_stream(ctx, 0, NULL), CW_ERR_UNSUPPORTED);
    ASSERT_TRUE(strstr(cw_context_get_last_error(ctx), "backend cpu, not cuda") != NULL);
    ASSERT_EQ_I(cw_context_get_cuda_stream(ctx, 0, &stream), CW_ERR_UNSUPPORTED);
    ASSERT_TRUE(stream == NULL);
    ASSERT_EQ_I(cw_context_get_cuda_device(ctx, &dev), CW_ERR_UNSUPPORTED);
    ASSERT_EQ_I(cw_context_set_cuda_stream(NULL, 0, NULL), CW_ERR_INVALID_ARG);
#endif
    cw_context_destroy(ctx);
    pthread_mutex_destroy(&cap.mu);
    TEST_DONE();
}
