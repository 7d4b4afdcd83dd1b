/* cw_comm over MPI: each call packs its strided view behind a header, moves it with
 * MPI_Isend/MPI_Irecv and polls the request until done or the timeout (a blocking MPI call
 * could wait forever on a peer that stopped calling). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "comm_mpi.h"

#include <inttypes.h>
#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* the header before every payload: the plan's tag and the payload's bytes, both checked */
typedef struct msg_head {
    int64_t tag;
    int64_t bytes;
} msg_head;

/* payload bytes per MPI message: a message is packed and moved piece by piece, so a rank's
 * transient copy stays this small whatever the view's size (the first piece follows the
 * header in the same MPI message) */
#define PIECE ((int64_t)4 << 20)

struct comm_mpi {
    MPI_Comm comm;
    int rank, n_ranks;
    int tag_ub;          /* MPI tags are 0 .. tag_ub */
    int serialize;       /* MPI_THREAD_SERIALIZED: one call at a time through mu */
    pthread_mutex_t mu;
    double timeout_s;
    FILE *trace;         /* $CW_COMM_MPI_TRACE=PREFIX: a line per message in PREFIX.RANK */
    char err[512];
    long long sent, recvd, bytes_sent, bytes_recvd;
};

static int g_thread_level = MPI_THREAD_SINGLE;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void mpi_reason(char *buf, size_t len, int rc) {
    char s[MPI_MAX_ERROR_STRING];
    int n = 0;
    if (MPI_Error_string(rc, s, &n) != MPI_SUCCESS) snprintf(s, sizeof(s), "MPI error %d", rc);
    snprintf(buf, len, "%s", s);
}

int comm_mpi_init(int *argc, char ***argv, char *err, size_t errlen) {
    int rc = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &g_thread_level);
    if (rc != MPI_SUCCESS) {
        char r[MPI_MAX_ERROR_STRING];
        mpi_reason(r, sizeof(r), rc);
        snprintf(err, errlen, "MPI_Init_thread: %s", r);
        return -1;
    }
    if (g_thread_level < MPI_THREAD_SERIALIZED) {
        snprintf(err, errlen, "MPI_Init_thread gave thread level %d: the plan calls MPI from its comm thread and "
                 "needs MPI_THREAD_SERIALIZED at least", g_thread_level);
        return -1;
    }
    return 0;
}

void comm_mpi_finalize(void) { MPI_Finalize(); }
void comm_mpi_abort(int code) { MPI_Abort(MPI_COMM_WORLD, code); }

/* ---- packing: a strided view to and from contiguous bytes ------------------------------------ */

/* The view's strides, the contiguous ones where all are zero (the library's convention). */
static void view_strides(const cw_tensor_desc *d, int64_t st[CW_MAX_RANK]) {
    int zero = 1;
    for (int i = 0; i < d->rank; i++) zero &= d->strides[i] == 0;
    int64_t s = 1;
    for (int i = d->rank - 1; i >= 0; i--) {
        st[i] = zero ? s : d->strides[i];
        s *= d->dims[i];
    }
}

static int64_t view_numel(const cw_tensor_desc *d) {
    int64_t n = 1;
    for (int i = 0; i < d->rank; i++) n *= d->dims[i];
    return n;
}

/* Copies elements [e0, e1) of the view, in its row-major order, between the view and the
 * contiguous flat (flat[0] is element e0): runs within a row of the innermost dim with one
 * memcpy where its stride is 1, else element by element. to_view: flat -> view. */
static void copy_range(char *view, const cw_tensor_desc *d, char *flat, int64_t e0, int64_t e1, int to_view) {
    size_t es = cw_dtype_size(d->dtype);
    if (e1 <= e0 || es == 0) return;
    if (d->rank == 0) {
        if (to_view) memcpy(view, flat, es);
        else memcpy(flat, view, es);
        return;
    }
    int64_t st[CW_MAX_RANK];
    view_strides(d, st);
    int last = d->rank - 1;
    int64_t inner = d->dims[last];
    for (int64_t e = e0; e < e1;) {
        int64_t row = e / inner, col = e % inner, n = inner - col < e1 - e ? inner - col : e1 - e, off = 0;
        for (int i = last - 1; i >= 0; i--) { /* the row's index in the outer dims */
            off += (row % d->dims[i]) * st[i];
            row /= d->dims[i];
        }
        char *v = view + (off + col * st[last]) * (int64_t)es, *f = flat + (e - e0) * (int64_t)es;
        if (st[last] == 1) {
            if (to_view) memcpy(v, f, (size_t)n * es);
            else memcpy(f, v, (size_t)n * es);
        } else {
            for (int64_t j = 0; j < n; j++) {
                char *x = v + j * st[last] * (int64_t)es;
                if (to_view) memcpy(x, f + j * (int64_t)es, es);
                else memcpy(f + j * (int64_t)es, x, es);
            }
        }
        e += n;
    }
}

static size_t copy_view(char *view, const cw_tensor_desc *d, char *flat, int to_view) {
    int64_t n = view_numel(d);
    if (n <= 0) return 0;
    copy_range(view, d, flat, 0, n, to_view);
    return (size_t)n * cw_dtype_size(d->dtype);
}

size_t comm_mpi_pack(void *dst, const cw_tensor_desc *d, const void *data) {
    return copy_view((char *)(uintptr_t)data, d, dst, 0);
}

size_t comm_mpi_unpack(void *data, const cw_tensor_desc *d, const void *src) {
    return copy_view(data, d, (char *)(uintptr_t)src, 1);
}

/* ---- one message ------------------------------------------------------------------------------ */

/* Waits for req until done or the deadline: MPI_Test, first between yields of the core (a
 * peer that is about to answer), then with sleeps of 10 us growing to 1 ms (a spinning wait
 * would take a core from the ranks that compute: they often outnumber the cores). */
static int wait_req(comm_mpi *c, MPI_Request *req, double deadline, MPI_Status *status, const char *what) {
    long sleep_ns = 10000;
    for (int tries = 0;; tries++) {
        int done = 0, rc = MPI_Test(req, &done, status);
        if (rc != MPI_SUCCESS) {
            char r[MPI_MAX_ERROR_STRING];
            mpi_reason(r, sizeof(r), rc);
            snprintf(c->err, sizeof(c->err), "%s: %s", what, r);
            return -1;
        }
        if (done) return 0;
        if (now_s() > deadline) {
            MPI_Cancel(req);
            MPI_Request_free(req);
            snprintf(c->err, sizeof(c->err), "%s: not done after %g s (a peer stopped, or the ranks' calls differ)", what,
                     c->timeout_s);
            return -1;
        }
        if (tries < 200) {
            sched_yield();
            continue;
        }
        struct timespec ts = {0, sleep_ns};
        nanosleep(&ts, NULL);
        if (sleep_ns < 1000000) sleep_ns *= 2;
    }
}

static int mpi_tag(const comm_mpi *c, int64_t tag) {
    /* the header carries the whole tag; MPI's own only has to separate neighbours' messages */
    uint64_t t = (uint64_t)tag;
    return (int)(t % ((uint64_t)c->tag_ub + 1));
}

/* Moves n bytes of buf to or from peer as one MPI message. */
static int move(comm_mpi *c, int sending, char *buf, int n, int peer, int64_t tag, double deadline) {
    char what[96];
    snprintf(what, sizeof(what), "%s rank %d, tag %" PRId64, sending ? "send to" : "recv from", peer, tag);
    MPI_Request req;
    MPI_Status status;
    int rc = sending ? MPI_Isend(buf, n, MPI_BYTE, peer, mpi_tag(c, tag), c->comm, &req)
                     : MPI_Irecv(buf, n, MPI_BYTE, peer, mpi_tag(c, tag), c->comm, &req);
    if (rc != MPI_SUCCESS) {
        char r[MPI_MAX_ERROR_STRING];
        mpi_reason(r, sizeof(r), rc);
        snprintf(c->err, sizeof(c->err), "%s: %s", what, r);
        return -1;
    }
    if (wait_req(c, &req, deadline, &status, what)) return -1;
    if (!sending) {
        int got = 0;
        MPI_Get_count(&status, MPI_BYTE, &got);
        if (got != n) {
            snprintf(c->err, sizeof(c->err), "%s: %d bytes arrived, %d expected (the ranks' calls differ)", what, got, n);
            return -1;
        }
    }
    return 0;
}

static int check_args(comm_mpi *c, const cw_tensor_desc *d, const void *data, int peer, void *stream,
                      const char *verb) {
    if (stream) {
        snprintf(c->err, sizeof(c->err), "%s: a device stream was given: MPI calls run on the host only (cpu backend)",
                 verb);
        return -1;
    }
    if (!d || d->rank < 0 || d->rank > CW_MAX_RANK || cw_dtype_size(d->dtype) == 0 || (!data && view_numel(d) > 0)) {
        snprintf(c->err, sizeof(c->err), "%s: a bad tensor view", verb);
        return -1;
    }
    if (peer < 0 || peer >= c->n_ranks || peer == c->rank) {
        snprintf(c->err, sizeof(c->err), "%s: peer %d of %d ranks (this is rank %d)", verb, peer, c->n_ranks, c->rank);
        return -1;
    }
    return 0;
}

/* One message of the view to or from peer: the header and the first piece in one MPI
 * message, then the other pieces, elements [e0, e1) of the view each, packed before a send
 * and unpacked after a receive (which first checks the header against its own call). */
static cw_status transfer(comm_mpi *c, int sending, const cw_tensor_desc *d, void *data, int peer, int64_t tag) {
    const char *what = sending ? "send to" : "recv from";
    size_t es = cw_dtype_size(d->dtype);
    int64_t n = view_numel(d), per = PIECE / (int64_t)es, bytes = n * (int64_t)es;
    int64_t first = n < per ? n : per;
    char *buf = malloc(sizeof(msg_head) + (size_t)first * es);
    if (!buf) {
        snprintf(c->err, sizeof(c->err), "%s rank %d, tag %" PRId64 ": out of memory", what, peer, tag);
        return CW_ERR_COMM;
    }
    double deadline = now_s() + c->timeout_s;
    msg_head h = {tag, bytes};
    if (sending) memcpy(buf, &h, sizeof(h));
    cw_status st = CW_ERR_COMM;
    for (int64_t e0 = 0, k = 0; e0 < n || k == 0; k++) {
        int64_t e1 = e0 + per < n ? e0 + per : n;
        size_t hb = k == 0 ? sizeof(h) : 0;
        int cnt = (int)(hb + (size_t)(e1 - e0) * es);
        if (sending) copy_range(data, d, buf + hb, e0, e1, 0);
        if (move(c, sending, buf, cnt, peer, tag, deadline)) goto out;
        if (!sending && k == 0) {
            memcpy(&h, buf, sizeof(h));
            if (h.tag != tag || h.bytes != bytes) {
                snprintf(c->err, sizeof(c->err),
                         "recv from rank %d: message tag %" PRId64 " of %" PRId64 " bytes arrived, tag %" PRId64
                         " of %" PRId64 " bytes expected (the ranks' calls differ)",
                         peer, h.tag, h.bytes, tag, bytes);
                goto out;
            }
        }
        if (!sending) copy_range(data, d, buf + hb, e0, e1, 1);
        e0 = e1;
    }
    if (c->trace)
        fprintf(c->trace, "comm_mpi: rank %d %s %d tag %" PRId64 " bytes %" PRId64 "\n", c->rank,
                sending ? "send to" : "recv from", peer, tag, bytes);
    if (sending) c->sent++, c->bytes_sent += bytes;
    else c->recvd++, c->bytes_recvd += bytes;
    st = CW_OK;
out:
    free(buf);
    return st;
}

static cw_status cb_send(void *user, const cw_tensor_desc *d, const void *data, int peer, int64_t tag, void *stream) {
    comm_mpi *c = user;
    if (check_args(c, d, data, peer, stream, "send")) return CW_ERR_COMM;
    if (c->serialize) pthread_mutex_lock(&c->mu);
    cw_status st = transfer(c, 1, d, (void *)(uintptr_t)data, peer, tag);
    if (c->serialize) pthread_mutex_unlock(&c->mu);
    return st;
}

static cw_status cb_recv(void *user, const cw_tensor_desc *d, void *data, int peer, int64_t tag, void *stream) {
    comm_mpi *c = user;
    if (check_args(c, d, data, peer, stream, "recv")) return CW_ERR_COMM;
    if (c->serialize) pthread_mutex_lock(&c->mu);
    cw_status st = transfer(c, 0, d, data, peer, tag);
    if (c->serialize) pthread_mutex_unlock(&c->mu);
    return st;
}

int comm_mpi_create(comm_mpi **out, cw_comm *comm, double timeout_s, char *err, size_t errlen) {
    *out = NULL;
    comm_mpi *c = calloc(1, sizeof(*c));
    if (!c) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    char r[MPI_MAX_ERROR_STRING];
    int rc = MPI_Comm_dup(MPI_COMM_WORLD, &c->comm);
    if (rc != MPI_SUCCESS) {
        mpi_reason(r, sizeof(r), rc);
        snprintf(err, errlen, "MPI_Comm_dup: %s", r);
        free(c);
        return -1;
    }
    MPI_Comm_set_errhandler(c->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(c->comm, &c->rank);
    MPI_Comm_size(c->comm, &c->n_ranks);
    int *ub = NULL, flag = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
    c->tag_ub = flag && ub && *ub > 0 ? *ub : 32767; /* 32767: the least the standard allows */
    c->serialize = g_thread_level < MPI_THREAD_MULTIPLE;
    pthread_mutex_init(&c->mu, NULL);
    c->timeout_s = timeout_s > 0 ? timeout_s : 1e9;
    const char *tr = getenv("CW_COMM_MPI_TRACE");
    if (tr && *tr) {
        char path[4096];
        snprintf(path, sizeof(path), "%s.%d", tr, c->rank);
        c->trace = fopen(path, "w");
    }
    cw_comm cc = {sizeof(cw_comm), CW_COMM_VERSION, c->rank, c->n_ranks, c, cb_send, cb_recv};
    *comm = cc;
    *out = c;
    return 0;
}

void comm_mpi_destroy(comm_mpi *c) {
    if (!c) return;
    if (c->trace) fclose(c->trace);
    MPI_Comm_free(&c->comm);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

const char *comm_mpi_last_error(const comm_mpi *c) { return c ? c->err : ""; }

void comm_mpi_counts(const comm_mpi *c, long long *sent, long long *recvd, long long *bytes_sent,
                     long long *bytes_recvd) {
    *sent = c->sent, *recvd = c->recvd, *bytes_sent = c->bytes_sent, *bytes_recvd = c->bytes_recvd;
}
