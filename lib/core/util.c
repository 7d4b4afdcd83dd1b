/* Status strings, version, logging, error recording and shape helpers: the pieces every
 * other file leans on (the host-allocation hook is host_alloc.c). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/core.h"

int cw_version(void) { return CW_VERSION_NUMBER; }

const char *cw_version_string(void) {
#define CW__STR2(x) #x
#define CW__STR(x) CW__STR2(x)
    return CW__STR(CW_VERSION_MAJOR) "." CW__STR(CW_VERSION_MINOR) "." CW__STR(CW_VERSION_PATCH);
}

const char *cw_status_string(cw_status s) {
    switch (s) {
#define CW__STATUS_STR(name, val, str) \
    case CW_##name: return str;
        CW_STATUS_MAP(CW__STATUS_STR)
#undef CW__STATUS_STR
    default: return "unknown status";
    }
}

const char *cw_status_name(cw_status s) {
    switch (s) {
#define CW__STATUS_NAME(name, val, str) \
    case CW_##name: return "CW_" #name;
        CW_STATUS_MAP(CW__STATUS_NAME)
#undef CW__STATUS_NAME
    default: return "CW_UNKNOWN";
    }
}

void cw_free(void *p) { cw__free(p); }

int64_t cw__now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* ---- logging and errors ------------------------------------------------------------- */
static const char *const cw__level_names[] = {"error", "warn", "info", "debug"};

static void cw__vlog(const cw_context *ctx, cw_log_level lvl, const char *fmt, va_list ap) {
    cw_log_level max = ctx ? ctx->cfg.log_level : CW_LOG_WARN;
    if (lvl > max) return;
    char buf[CW__ERR_LEN];
    vsnprintf(buf, sizeof buf, fmt, ap);
    if (ctx && ctx->cfg.log_fn) {
        ctx->cfg.log_fn(ctx->cfg.log_user, lvl, buf);
    } else {
        fprintf(stderr, "convweave %s: %s\n", cw__level_names[lvl], buf);
    }
}

void cw__log(const cw_context *ctx, cw_log_level lvl, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    cw__vlog(ctx, lvl, fmt, ap);
    va_end(ap);
}

const char *cw_context_get_last_error(const cw_context *ctx) {
    static _Thread_local char copy[CW__ERR_LEN]; /* this thread's copy: valid until its next call */
    if (!ctx) return "";
    pthread_mutex_t *mu = (pthread_mutex_t *)&ctx->err_mu; /* the lock is not part of the value */
    pthread_mutex_lock(mu);
    memcpy(copy, ctx->err, sizeof copy);
    pthread_mutex_unlock(mu);
    return copy;
}

void cw__error_clear(cw_context *ctx) {
    pthread_mutex_lock(&ctx->err_mu);
    ctx->err[0] = '\0';
    pthread_mutex_unlock(&ctx->err_mu);
}

void cw__error_save(cw_context *ctx, char *buf) {
    pthread_mutex_lock(&ctx->err_mu);
    memcpy(buf, ctx->err, CW__ERR_LEN);
    pthread_mutex_unlock(&ctx->err_mu);
}

void cw__error_restore(cw_context *ctx, const char *buf) {
    pthread_mutex_lock(&ctx->err_mu);
    memcpy(ctx->err, buf, CW__ERR_LEN);
    pthread_mutex_unlock(&ctx->err_mu);
}

cw_status cw__error(cw_context *ctx, cw_status st, const char *fmt, ...) {
    char buf[CW__ERR_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (ctx) {
        pthread_mutex_lock(&ctx->err_mu);
        snprintf(ctx->err, sizeof ctx->err, "%s", buf);
        pthread_mutex_unlock(&ctx->err_mu);
        cw__log(ctx, CW_LOG_DEBUG, "%s: %s", cw_status_name(st), buf);
    } else {
        cw__log(NULL, CW_LOG_WARN, "%s: %s", cw_status_name(st), buf);
    }
    return st;
}

/* ---- shapes ------------------------------------------------------------------------- */
int64_t cw__desc_numel(const cw_tensor_desc *d) {
    int64_t n = 1;
    for (int i = 0; i < d->rank; i++) n *= d->dims[i];
    return n;
}

int64_t cw_tensor_desc_numel(const cw_tensor_desc *d) { return d ? cw__desc_numel(d) : 0; }

void cw__desc_fill_strides(cw_tensor_desc *d) {
    int all_zero = 1;
    for (int i = 0; i < d->rank; i++) all_zero &= d->strides[i] == 0;
    if (!all_zero) return;
    int64_t s = 1;
    for (int i = d->rank - 1; i >= 0; i--) {
        d->strides[i] = s;
        s *= d->dims[i];
    }
}

int cw__desc_is_contiguous(const cw_tensor_desc *d) {
    int64_t s = 1;
    for (int i = d->rank - 1; i >= 0; i--) {
        if (d->dims[i] != 1 && d->strides[i] != s) return 0;
        s *= d->dims[i];
    }
    return 1;
}

int64_t cw__desc_bytes(const cw_tensor_desc *d) { return cw__desc_numel(d) * (int64_t)cw_dtype_size(d->dtype); }

int64_t cw__desc_span_bytes(const cw_tensor_desc *d) {
    if (d->rank < 1 || d->rank > CW_MAX_RANK) return 0;
    int any = 0;
    for (int i = 0; i < d->rank; i++) any |= d->strides[i] != 0;
    int64_t last = 0, s = 1;
    for (int i = d->rank - 1; i >= 0; i--) {
        if (d->dims[i] < 1) return 0;
        last += (d->dims[i] - 1) * (any ? d->strides[i] : s);
        s *= d->dims[i];
    }
    return (last + 1) * (int64_t)cw_dtype_size(d->dtype);
}

int cw__views_overlap(const cw_tensor_desc *a, const void *pa, const cw_tensor_desc *b, const void *pb) {
    if (!a || !b || !pa || !pb) return 0;
    const int64_t sa = cw__desc_span_bytes(a), sb = cw__desc_span_bytes(b);
    if (sa == 0 || sb == 0) return 0;
    const uintptr_t a0 = (uintptr_t)pa, b0 = (uintptr_t)pb;
    return a0 < b0 + (uintptr_t)sb && b0 < a0 + (uintptr_t)sa;
}

const char *cw__dims_str(const cw_tensor_desc *d, char *buf, size_t n) {
    const int r = d->rank < 0 ? 0 : d->rank > CW_MAX_RANK ? CW_MAX_RANK : d->rank; /* bad descs print safely */
    size_t off = 0;
    off += (size_t)snprintf(buf + off, n - off, "[");
    for (int i = 0; i < r && off < n; i++)
        off += (size_t)snprintf(buf + off, n - off, i ? ", %" PRId64 : "%" PRId64, d->dims[i]);
    if (off < n) snprintf(buf + off, n - off, "]");
    return buf;
}

const char *cw__dtype_name(cw_dtype dt) {
    switch (dt) {
    case CW_F32: return "f32";
    case CW_F16: return "f16";
    case CW_BF16: return "bf16";
    }
    return "unknown";
}

cw_status cw_tensor_desc_make(cw_tensor_desc *d, cw_dtype dt, int rank, const int64_t *dims) {
    if (!d || !dims) return CW_ERR_INVALID_ARG;
    if (rank < 1 || rank > CW_MAX_RANK) return CW_ERR_INVALID_ARG;
    if (cw_dtype_size(dt) == 0) return CW_ERR_INVALID_ARG;
    memset(d, 0, sizeof *d);
    d->dtype = dt;
    d->rank = rank;
    for (int i = 0; i < rank; i++) {
        if (dims[i] < 1) return CW_ERR_INVALID_ARG;
        d->dims[i] = dims[i];
    }
    cw__desc_fill_strides(d);
    return CW_OK;
}
