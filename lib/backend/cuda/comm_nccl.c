/* cw_comm over NCCL point-to-point (convweave_cuda.h, "NCCL communicator"): each message is
 * cut into pieces from its dims alone (comm.c), a piece contiguous in memory goes straight
 * to ncclSend / ncclRecv, any other through a stream-ordered staging buffer filled or
 * emptied by cudaMemcpy2DAsync. Every NCCL and CUDA call goes through the check macros
 * below, which record the failure in the communicator and return CW_ERR_COMM. libnccl is
 * opened at the first cw_comm_nccl_init, not linked: it maps about 200 MiB (its device code),
 * which every user of the library would pay in address space otherwise. */
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <nccl.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "backend/comm_nccl.h"
#include "backend/cuda/cuda_check.h"
#include "convweave/convweave_cuda.h"

typedef struct cw__nccl {
    ncclComm_t comm;          /* borrowed */
    int device;               /* the communicator's CUDA device */
    int rank, n_ranks;
    cudaStream_t host_stream; /* stream-NULL calls stage and wait here */
    int64_t piece_bytes;      /* CW_COMM_NCCL_PIECE_BYTES; tests may lower it */
    pthread_mutex_t mu;       /* serialises calls: an ncclComm_t is not thread-safe */
    pthread_mutex_t err_mu;   /* guards err only, so it can be read during a blocking call */
    char err[CW__ERR_LEN];
} cw__nccl;

/* ---- libnccl, opened once by soname: the copy already in the process (torch's, whose
 * ncclComm_t the caller may hand us) is the one used; else the one found at build time ---- */
static struct {
    ncclResult_t (*CommCount)(const ncclComm_t, int *);
    ncclResult_t (*CommUserRank)(const ncclComm_t, int *);
    ncclResult_t (*CommCuDevice)(const ncclComm_t, int *);
    ncclResult_t (*CommGetAsyncError)(ncclComm_t, ncclResult_t *);
    ncclResult_t (*Send)(const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*Recv)(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    const char *(*GetErrorString)(ncclResult_t);
    const char *(*GetLastError)(ncclComm_t); /* NCCL >= 2.13; may be NULL */
} nccl;
static pthread_once_t nccl_once = PTHREAD_ONCE_INIT;
static char nccl_why[512]; /* empty: loaded */

static void nccl_load(void) {
    const char *names[] = {"libnccl.so.2",
#ifdef CW_NCCL_LIBRARY
                           CW_NCCL_LIBRARY,
#endif
                           NULL};
    void *h = NULL;
    for (int i = 0; names[i] && !h; i++) {
        h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL); /* never closed: process lifetime */
        if (!h) snprintf(nccl_why, sizeof nccl_why, "dlopen(%s): %s", names[i], dlerror());
    }
    if (!h) return;
#define CW__NCCL_SYM(field, name)                                                              \
    do {                                                                                       \
        void *cw_p_ = dlsym(h, name);                                                          \
        if (!cw_p_) {                                                                          \
            snprintf(nccl_why, sizeof nccl_why, "libnccl lacks %s (NCCL too old?)", name);     \
            return;                                                                            \
        }                                                                                      \
        memcpy(&nccl.field, &cw_p_, sizeof cw_p_);                                             \
    } while (0)
    CW__NCCL_SYM(CommCount, "ncclCommCount");
    CW__NCCL_SYM(CommUserRank, "ncclCommUserRank");
    CW__NCCL_SYM(CommCuDevice, "ncclCommCuDevice");
    CW__NCCL_SYM(CommGetAsyncError, "ncclCommGetAsyncError");
    CW__NCCL_SYM(Send, "ncclSend");
    CW__NCCL_SYM(Recv, "ncclRecv");
    CW__NCCL_SYM(GetErrorString, "ncclGetErrorString");
#undef CW__NCCL_SYM
    void *p = dlsym(h, "ncclGetLastError");
    if (p) memcpy(&nccl.GetLastError, &p, sizeof p);
    nccl_why[0] = '\0';
}

const char *cw__comm_nccl_load(void) {
    pthread_once(&nccl_once, nccl_load);
    return nccl_why;
}

static cw_status nccl_send_cb(void *user, const cw_tensor_desc *d, const void *data, int peer, int64_t tag,
                              void *stream);
static cw_status nccl_recv_cb(void *user, const cw_tensor_desc *d, void *data, int peer, int64_t tag, void *stream);

/* ---- errors: kept in the communicator and logged (a callback has no context) ---------- */
static cw_status nccl_fail(cw__nccl *c, const char *fmt, ...) CW__PRINTF(2, 3);
static cw_status nccl_fail(cw__nccl *c, const char *fmt, ...) {
    char buf[CW__ERR_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&c->err_mu);
    snprintf(c->err, sizeof c->err, "%s", buf);
    pthread_mutex_unlock(&c->err_mu);
    cw__log(NULL, CW_LOG_WARN, "CW_ERR_COMM: %s", buf);
    return CW_ERR_COMM;
}

static const char *nccl_detail(ncclComm_t comm) {
    const char *s = comm && nccl.GetLastError ? nccl.GetLastError(comm) : NULL;
    return s && s[0] ? s : "no detail";
}

static cw_status nccl_fail_nccl(cw__nccl *c, ncclResult_t r, const char *what, const char *call, const char *file,
                                int line) {
    return nccl_fail(c, "%s: %s failed: %s (%s) at %s:%d", what, call, nccl.GetErrorString(r), nccl_detail(c->comm),
                     file, line);
}

static cw_status nccl_fail_cuda(cw__nccl *c, cudaError_t e, const char *what, const char *call, const char *file,
                                int line) {
    (void)cudaGetLastError(); /* clear a non-sticky error so later calls do not report it */
    return nccl_fail(c, "%s: %s failed: %s (%s) at %s:%d", what, call, cudaGetErrorName(e), cudaGetErrorString(e),
                     file, line);
}

static double now_s(void) { return (double)cw__now_ns() * 1e-9; }

static void nap(int64_t ns) {
    struct timespec ts = {0, (long)ns};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

/* A communicator made non-blocking (ncclConfig_t.blocking = 0) answers ncclInProgress:
 * wait until its operation is enqueued or failed, within the timeout. */
static ncclResult_t nccl_settle(cw__nccl *c) {
    double deadline = now_s() + CW_COMM_NCCL_TIMEOUT_S;
    ncclResult_t r = ncclInProgress;
    for (int64_t ns = 1000; r == ncclInProgress; ns = ns < 1000000 ? ns * 2 : ns) {
        ncclResult_t q = nccl.CommGetAsyncError(c->comm, &r);
        if (q != ncclSuccess) return q;
        if (r == ncclInProgress) {
            if (now_s() > deadline) return ncclInProgress;
            nap(ns);
        }
    }
    return r;
}

#define CW__NCCL_GOTO(c, st, label, what, call)                                   \
    do {                                                                          \
        ncclResult_t cw_r_ = (call);                                              \
        if (cw_r_ == ncclInProgress) cw_r_ = nccl_settle(c);                      \
        if (cw_r_ != ncclSuccess) {                                               \
            (st) = nccl_fail_nccl((c), cw_r_, (what), #call, __FILE__, __LINE__); \
            goto label;                                                           \
        }                                                                         \
    } while (0)

#define CW__NCUDA_GOTO(c, st, label, what, call)                                  \
    do {                                                                          \
        cudaError_t cw_e_ = (call);                                               \
        if (cw_e_ != cudaSuccess) {                                               \
            (st) = nccl_fail_cuda((c), cw_e_, (what), #call, __FILE__, __LINE__); \
            goto label;                                                           \
        }                                                                         \
    } while (0)

/* ---- creation ------------------------------------------------------------------------- */
int cw__comm_nccl_owns(const cw_comm *comm) { return comm->send == nccl_send_cb && comm->user; }

cw_status cw__comm_nccl_init(cw_comm *out, void *nccl_comm, int rank, int n_ranks) {
    ncclComm_t nc = (ncclComm_t)nccl_comm;
    int count = 0, urank = -1, dev = -1, prev = -1;
    ncclResult_t r;
    if (cw__comm_nccl_load()[0])
        return cw__error(NULL, CW_ERR_UNSUPPORTED, "cw_comm_nccl_init: cannot load NCCL: %s", nccl_why);
    if ((r = nccl.CommCount(nc, &count)) != ncclSuccess || (r = nccl.CommUserRank(nc, &urank)) != ncclSuccess ||
        (r = nccl.CommCuDevice(nc, &dev)) != ncclSuccess)
        return cw__error(NULL, CW_ERR_COMM, "cw_comm_nccl_init: querying nccl_comm failed: %s (%s)",
                         nccl.GetErrorString(r), nccl_detail(nc));
    if (count != n_ranks || urank != rank)
        return cw__error(NULL, CW_ERR_INVALID_ARG,
                         "cw_comm_nccl_init: rank %d of %d given, nccl_comm is rank %d of %d", rank, n_ranks, urank,
                         count);
    cw__nccl *c = cw__calloc(1, sizeof *c);
    if (!c) return cw__error(NULL, CW_ERR_OUT_OF_MEMORY, "cw_comm_nccl_init: out of host memory");
    c->comm = nc;
    c->device = dev;
    c->rank = rank;
    c->n_ranks = n_ranks;
    c->piece_bytes = CW_COMM_NCCL_PIECE_BYTES;
    cw_status st = CW_OK;
    cudaError_t e;
    if (pthread_mutex_init(&c->mu, NULL) != 0) {
        st = cw__error(NULL, CW_ERR_OUT_OF_MEMORY, "cw_comm_nccl_init: pthread_mutex_init failed");
        goto fail_mu;
    }
    if (pthread_mutex_init(&c->err_mu, NULL) != 0) {
        st = cw__error(NULL, CW_ERR_OUT_OF_MEMORY, "cw_comm_nccl_init: pthread_mutex_init failed");
        goto fail_err_mu;
    }
    if ((e = cudaGetDevice(&prev)) != cudaSuccess || (prev != dev && (e = cudaSetDevice(dev)) != cudaSuccess)) {
        (void)cudaGetLastError();
        st = cw__error(NULL, CW_ERR_COMM, "cw_comm_nccl_init: selecting device %d failed: %s", dev, cudaGetErrorString(e));
        goto fail_stream;
    }
    e = cudaStreamCreateWithFlags(&c->host_stream, cudaStreamNonBlocking);
    if (prev != dev) (void)cudaSetDevice(prev);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        st = cw__error(NULL, CW_ERR_COMM, "cw_comm_nccl_init: cudaStreamCreateWithFlags on device %d failed: %s", dev,
                       cudaGetErrorString(e));
        goto fail_stream;
    }
    out->size = sizeof *out;
    out->version = CW_COMM_VERSION;
    out->rank = rank;
    out->n_ranks = n_ranks;
    out->user = c;
    out->send = nccl_send_cb;
    out->recv = nccl_recv_cb;
    return CW_OK;

fail_stream:
    pthread_mutex_destroy(&c->err_mu);
fail_err_mu:
    pthread_mutex_destroy(&c->mu);
fail_mu:
    cw__free(c);
    return st;
}

void cw__comm_nccl_destroy(cw_comm *comm) {
    cw__nccl *c = comm->user;
    int prev = -1;
    if (cudaGetDevice(&prev) == cudaSuccess && prev != c->device) (void)cudaSetDevice(c->device);
    /* work still queued on it finishes first; the stream's resources go after */
    cudaError_t e = cudaStreamDestroy(c->host_stream);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        cw__log(NULL, CW_LOG_WARN, "cw_comm_nccl_destroy: cudaStreamDestroy failed: %s (%s)", cudaGetErrorName(e),
                cudaGetErrorString(e));
    }
    if (prev >= 0 && prev != c->device) (void)cudaSetDevice(prev);
    pthread_mutex_destroy(&c->err_mu);
    pthread_mutex_destroy(&c->mu);
    cw__free(c);
    memset(comm, 0, sizeof *comm);
}

const char *cw__comm_nccl_last_error(const cw_comm *comm) {
    static _Thread_local char copy[CW__ERR_LEN]; /* this thread's copy: valid until its next call */
    cw__nccl *c = comm->user;
    pthread_mutex_lock(&c->err_mu);
    memcpy(copy, c->err, sizeof copy);
    pthread_mutex_unlock(&c->err_mu);
    return copy;
}

void cw__comm_nccl_set_piece_bytes(cw_comm *comm, int64_t bytes) {
    cw__nccl *c = comm->user;
    pthread_mutex_lock(&c->mu);
    c->piece_bytes = bytes < 16 ? 16 : bytes;
    pthread_mutex_unlock(&c->mu);
}

/* ---- transfers ------------------------------------------------------------------------ */
/* Copies every block of view v (plan cp, first byte at base) to or from the dense buffer
 * buf, in the view's row-major order, on stream s. */
static cw_status copy_blocks(cw__nccl *c, const cw__comm_copy2d *cp, char *base, char *buf, int to_buf,
                             cudaStream_t s, const char *what) {
    cw_status st = CW_OK;
    int64_t n = cw__comm_copy2d_blocks(cp), block = cp->width * cp->height;
    for (int64_t b = 0; b < n; b++) {
        char *v = base + cw__comm_copy2d_block(cp, b), *d = buf + b * block;
        if (to_buf)
            CW__NCUDA_GOTO(c, st, done, what,
                           cudaMemcpy2DAsync(d, (size_t)cp->width, v, (size_t)cp->pitch, (size_t)cp->width,
                                             (size_t)cp->height, cudaMemcpyDefault, s));
        else
            CW__NCUDA_GOTO(c, st, done, what,
                           cudaMemcpy2DAsync(v, (size_t)cp->pitch, d, (size_t)cp->width, (size_t)cp->width,
                                             (size_t)cp->height, cudaMemcpyDefault, s));
    }
done:
    return st;
}

/* Waits for s within the timeout, watching NCCL's asynchronous error (a failed peer). */
static cw_status wait_stream(cw__nccl *c, cudaStream_t s, const char *what) {
    double t0 = now_s();
    for (int64_t ns = 1000;; ns = ns < 1000000 ? ns * 2 : ns) {
        cudaError_t e = cudaStreamQuery(s);
        if (e == cudaSuccess) return CW_OK;
        if (e != cudaErrorNotReady) return nccl_fail_cuda(c, e, what, "cudaStreamQuery(stream)", __FILE__, __LINE__);
        ncclResult_t ar = ncclSuccess, q = nccl.CommGetAsyncError(c->comm, &ar);
        if (q != ncclSuccess) return nccl_fail_nccl(c, q, what, "ncclCommGetAsyncError(comm)", __FILE__, __LINE__);
        if (ar != ncclSuccess && ar != ncclInProgress)
            return nccl_fail_nccl(c, ar, what, "the transfer (ncclCommGetAsyncError)", __FILE__, __LINE__);
        if (now_s() - t0 > CW_COMM_NCCL_TIMEOUT_S)
            return nccl_fail(c, "%s: timed out after %d s waiting for the peer (abort the ncclComm_t: ncclCommAbort)",
                             what, CW_COMM_NCCL_TIMEOUT_S);
        nap(ns);
    }
}

static cw_status check_args(cw__nccl *c, const cw_tensor_desc *d, const void *data, int peer, int n_ranks, int self,
                            const char *what) {
    if (!d) return nccl_fail(c, "%s: d is NULL", what);
    if (d->rank < 1 || d->rank > CW_MAX_RANK) return nccl_fail(c, "%s: rank %d outside 1..%d", what, d->rank, CW_MAX_RANK);
    if (cw_dtype_size(d->dtype) == 0) return nccl_fail(c, "%s: unknown dtype %d", what, (int)d->dtype);
    int64_t numel = 1;
    for (int i = 0; i < d->rank; i++) {
        if (d->dims[i] < 0 || d->strides[i] < 0)
            return nccl_fail(c, "%s: dim %d is %" PRId64 " with stride %" PRId64 "; both must be >= 0", what, i,
                             d->dims[i], d->strides[i]);
        numel *= d->dims[i];
    }
    if (numel > 0 && !data) return nccl_fail(c, "%s: data is NULL", what);
    if (peer < 0 || peer >= n_ranks || peer == self)
        return nccl_fail(c, "%s: peer %d is not another rank of 0..%d", what, peer, n_ranks - 1);
    return CW_OK;
}

static cw_status transfer(cw__nccl *c, int send, const cw_tensor_desc *din, char *data, int peer, int64_t tag,
                          void *stream) {
    char what[192], dims[96];
    snprintf(what, sizeof what, "%s rank %d (tag %" PRId64 ", %s %s, %s)", send ? "send to" : "recv from", peer, tag,
             cw__dtype_name(din ? din->dtype : CW_F32), din ? cw__dims_str(din, dims, sizeof dims) : "[]",
             stream ? "enqueued" : "blocking");
    CW_TRY(check_args(c, din, data, peer, c->n_ranks, c->rank, what));
    cw_tensor_desc d = *din;
    cw__desc_fill_strides(&d);
    const size_t es = cw_dtype_size(d.dtype);
    cw__comm_pieces p;
    cw__comm_pieces_plan(&d, c->piece_bytes, &p);
    if (p.count == 0) return CW_OK; /* an empty view: both sides see the same dims */

    pthread_mutex_lock(&c->mu);
    cw_status st = CW_OK;
    int prev = -1;
    char *stage = NULL;
    cudaStream_t s = stream ? (cudaStream_t)stream : c->host_stream;
    CW__NCUDA_GOTO(c, st, unlock, what, cudaGetDevice(&prev));
    if (prev != c->device) CW__NCUDA_GOTO(c, st, unlock, what, cudaSetDevice(c->device));
    ncclResult_t ar = ncclSuccess;
    CW__NCCL_GOTO(c, st, restore, what, nccl.CommGetAsyncError(c->comm, &ar));
    if (ar != ncclSuccess && ar != ncclInProgress) {
        st = nccl_fail_nccl(c, ar, what, "an earlier operation (ncclCommGetAsyncError)", __FILE__, __LINE__);
        goto restore;
    }
    int staged = stream == NULL; /* host memory, or waited for on our stream: always staged */
    for (int64_t i = 0; i < p.count && !staged; i++) {
        cw_tensor_desc sub;
        int64_t off;
        cw__comm_copy2d cp;
        cw__comm_piece(&d, &p, i, &sub, &off);
        cw__comm_copy2d_plan(&sub, es, &cp);
        staged = !cp.contiguous;
    }
    if (staged) CW__NCUDA_GOTO(c, st, restore, what, cudaMallocAsync((void **)&stage, (size_t)p.max_bytes, s));
    for (int64_t i = 0; i < p.count; i++) {
        cw_tensor_desc sub;
        int64_t off;
        cw__comm_copy2d cp;
        cw__comm_piece(&d, &p, i, &sub, &off);
        cw__comm_copy2d_plan(&sub, es, &cp);
        char *v = data + off * (int64_t)es;
        size_t bytes = (size_t)(cw__desc_numel(&sub) * (int64_t)es);
        int direct = stream && cp.contiguous;
        char *buf = direct ? v : stage;
        /* blocking: a copy from or to pageable host memory waits for the stream inside
         * CUDA, with no timeout; wait here first, with one */
        if (send) {
            if (!stream && (st = wait_stream(c, s, what)) != CW_OK) goto release;
            if (!direct && (st = copy_blocks(c, &cp, v, stage, 1, s, what)) != CW_OK) goto release;
            CW__NCCL_GOTO(c, st, release, what, nccl.Send(buf, bytes, ncclUint8, peer, c->comm, s));
        } else {
            CW__NCCL_GOTO(c, st, release, what, nccl.Recv(buf, bytes, ncclUint8, peer, c->comm, s));
            if (!stream && (st = wait_stream(c, s, what)) != CW_OK) goto release;
            if (!direct && (st = copy_blocks(c, &cp, v, stage, 0, s, what)) != CW_OK) goto release;
        }
    }
release:
    /* stream-ordered: after whatever of this call was enqueued, even after a failure */
    if (stage) {
        cudaError_t e = cudaFreeAsync(stage, s);
        if (e != cudaSuccess && st == CW_OK) st = nccl_fail_cuda(c, e, what, "cudaFreeAsync(stage)", __FILE__, __LINE__);
        else if (e != cudaSuccess) (void)cudaGetLastError();
    }
    if (!stream && st == CW_OK) st = wait_stream(c, s, what);
restore:
    if (prev >= 0 && prev != c->device) (void)cudaSetDevice(prev);
unlock:
    pthread_mutex_unlock(&c->mu);
    return st;
}

static cw_status nccl_send_cb(void *user, const cw_tensor_desc *d, const void *data, int peer, int64_t tag,
                              void *stream) {
    return transfer(user, 1, d, (char *)(uintptr_t)data, peer, tag, stream); /* only read */
}

static cw_status nccl_recv_cb(void *user, const cw_tensor_desc *d, void *data, int peer, int64_t tag, void *stream) {
    return transfer(user, 0, d, data, peer, tag, stream);
}
