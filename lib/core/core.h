/* Internal core: the context, error recording, logging and the host-allocation hook.
 * Every library file includes this; nothing here is public API. */
#ifndef CW_CORE_H
#define CW_CORE_H

#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>

#include "convweave/convweave.h"

#if defined(__GNUC__)
#define CW__PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define CW__PRINTF(a, b)
#endif

#define CW__MAX_STREAMS CW_MAX_STREAMS
#define CW__ERR_LEN 1024

typedef struct cw__backend cw__backend;
typedef struct cw__stream cw__stream;
typedef struct cw__event cw__event;
typedef struct cw__allocator cw__allocator;

struct cw_context {
    cw_context_config cfg;
    cw__backend *be;
    cw__allocator *temp;  /* budgeted: workspaces, patch buffers, attention chunks */
    cw__allocator *act;   /* unbudgeted: activations between stages, user tensors */
    cw__stream *streams[CW__MAX_STREAMS]; /* created lazily by cw__context_stream */
    pthread_mutex_t mu;   /* guards streams[], ualloc and the segment counts */
    pthread_mutex_t err_mu; /* guards err only, so a hook called under mu may record errors */
    char err[CW__ERR_LEN]; /* the last error (err_mu); read it with cw_context_get_last_error */
    cw_allocator ualloc;  /* cw_context_set_allocator's; alloc NULL: the backend's own */
    int64_t segs_held;    /* segments held by pools on this context's backend, any source */
    int64_t seg_bytes_held;
};

/* Returns from the calling function with the status of a call that fails: the one way
 * library code propagates a status. */
#define CW_TRY(call)                       \
    do {                                   \
        cw_status cw_try_st_ = (call);     \
        if (cw_try_st_ != CW_OK) return cw_try_st_; \
    } while (0)

/* Records a message as the context's last error, logs it at debug, returns st.
 * ctx may be NULL (then the message is only logged to stderr at warn). */
cw_status cw__error(cw_context *ctx, cw_status st, const char *fmt, ...) CW__PRINTF(3, 4);
/* Forgets the context's last error (a context whose backend probe failed and fell back). */
void cw__error_clear(cw_context *ctx);
/* The last error is the last failed *call*'s: a call that recovers from failures inside it
 * (refused candidate plans) saves the message at its start (buf: CW__ERR_LEN bytes) and
 * restores it where it succeeds. */
void cw__error_save(cw_context *ctx, char *buf);
void cw__error_restore(cw_context *ctx, const char *buf);
void cw__log(const cw_context *ctx, cw_log_level lvl, const char *fmt, ...) CW__PRINTF(3, 4);
/* The i-th stream of the context (0 <= i < CW__MAX_STREAMS), created on first use. */
cw_status cw__context_stream(cw_context *ctx, int i, cw__stream **out);

/* Host allocation (host_alloc.c): every library allocation goes through these so tests
 * can inject failures. Test library only (convweave_test, built with CW_FAULT_INJECTION;
 * the libraries users link have neither function): cw__test_fail_after(n): the n-th
 * allocation from now fails (n >= 1), and every later one succeeds; 0 switches injection
 * off. */
void *cw__malloc(size_t n);
void *cw__calloc(size_t count, size_t n);
void *cw__realloc(void *p, size_t n);
void cw__free(void *p);
/* Pages of their own (anonymous, zeroed, page-aligned), through the same failure hook:
 * given back to the OS by cw__unmap(p, n) with the same n. NULL when out of memory. */
void *cw__map(size_t n);
void cw__unmap(void *p, size_t n);
char *cw__strdup(const char *s);
/* Gives the heap's free pages back to the OS (glibc: malloc_trim; elsewhere nothing): after
 * work whose transient allocations the process would otherwise keep resident. */
void cw__host_trim(void);
void cw__test_fail_after(int64_t n);
/* Number of host allocations made so far (for sweeps). */
int64_t cw__test_alloc_count(void);

/* Monotonic clock in nanoseconds. */
int64_t cw__now_ns(void);

/* Shape helpers. */
int64_t cw__desc_numel(const cw_tensor_desc *d);
/* Bytes of d's elements stored contiguously: numel * cw_dtype_size(d->dtype). */
int64_t cw__desc_bytes(const cw_tensor_desc *d);
/* Fills d's strides as contiguous when they are all zero; leaves other strides alone. */
void cw__desc_fill_strides(cw_tensor_desc *d);
int cw__desc_is_contiguous(const cw_tensor_desc *d);
/* Byte extent covered by a strided view: (max offset + 1) * elem size (all-zero strides:
 * contiguous); 0 for a rank outside 1..CW_MAX_RANK or a dim < 1. */
int64_t cw__desc_span_bytes(const cw_tensor_desc *d);
/* 1 when the byte spans [data, data + span) of the two views intersect. A conservative
 * test: interleaved views may report overlap. 0 when a pointer is NULL. */
int cw__views_overlap(const cw_tensor_desc *a, const void *pa, const cw_tensor_desc *b, const void *pb);
/* Prints "[1, 32, 64, 64]" into buf and returns buf; a rank outside 0..CW_MAX_RANK is
 * clamped, so unvalidated descriptors print safely. */
const char *cw__dims_str(const cw_tensor_desc *d, char *buf, size_t n);
/* "f32", "f16", "bf16"; "unknown" for anything else. */
const char *cw__dtype_name(cw_dtype dt);

struct cw_tensor {
    cw_context *ctx;
    cw_tensor_desc desc;
    void *data;
    int owned;
};

#endif
