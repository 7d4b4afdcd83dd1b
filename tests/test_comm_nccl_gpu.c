/* The NCCL communicator moving strided views between two ranks of one process (one GPU
 * each, ncclCommInitAll, a thread per rank as NCCL wants): bands of NCHW and NCDHW tensors
 * into buffers of other strides, a contiguous side against a strided one, W-strided views,
 * many small pieces, both directions in one global order, blocking calls on host arrays
 * (stream NULL), and the errors a call reports. Every received byte is compared with what
 * was sent: random bits, so -0.0 and NaN payloads must survive. Exits 77 without NCCL or a
 * GPU; with one GPU checks init and the errors of a call on a one-rank communicator only
 * (NCCL refuses two ranks on one GPU) and says so. CW_COMM_NCCL_SELFTEST=1 runs the same
 * cases through a host mailbox communicator instead, to check the harness without a GPU. */
#include "testutil.h"
#include "view_walk.h"

#include <pthread.h>

#include "backend/comm_nccl.h"
#include "convweave/convweave_cuda.h"

#ifdef CW_HAVE_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>
#endif

static int g_self; /* 1: host memory and the mailbox communicator */

/* Vendor libraries keep process-lifetime allocations that LeakSanitizer reports in ASan
 * builds; suppress stacks through them only (as tests/test_cuda_ops_gpu.c does). */
const char *__lsan_default_suppressions(void);
__attribute__((visibility("default"))) const char *__lsan_default_suppressions(void) {
    return "leak:libcuda.so\nleak:libcudart.so\nleak:libnccl.so\n";
}

/* ---- memory: device memory of rank r, or host memory in the self-test ------------------ */
static void *mem_alloc(int r, int64_t bytes) {
    void *p = NULL;
#ifdef CW_HAVE_NCCL
    if (!g_self) {
        ASSERT_TRUE(cudaSetDevice(r) == cudaSuccess);
        ASSERT_TRUE(cudaMalloc(&p, (size_t)bytes) == cudaSuccess);
        return p;
    }
#endif
    (void)r;
    p = malloc((size_t)bytes);
    ASSERT_TRUE(p);
    return p;
}
static void mem_free(int r, void *p) {
#ifdef CW_HAVE_NCCL
    if (!g_self) {
        ASSERT_TRUE(cudaSetDevice(r) == cudaSuccess);
        ASSERT_TRUE(cudaFree(p) == cudaSuccess);
        return;
    }
#endif
    (void)r;
    free(p);
}
/* Copies bytes between host and rank r's memory (its GPU's, or the self-test's host). */
static void mem_copy(int r, void *dst, const void *src, int64_t bytes, int to_device) {
#ifdef CW_HAVE_NCCL
    if (!g_self) {
        ASSERT_TRUE(cudaSetDevice(r) == cudaSuccess);
        ASSERT_TRUE(cudaMemcpy(dst, src, (size_t)bytes, to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost) ==
                    cudaSuccess);
        return;
    }
#endif
    (void)r, (void)to_device;
    memcpy(dst, src, (size_t)bytes);
}

/* ---- the self-test's communicator: a mailbox per (from, to), blocking, host memory ------ */
#define BOX_MAX 16
typedef struct mailbox {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    unsigned char *msg[2][2][BOX_MAX]; /* [from][to] FIFO */
    int64_t len[2][2][BOX_MAX], tag[2][2][BOX_MAX];
    int head[2][2], tail[2][2];
} mailbox;
static mailbox g_box = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, {{{0}}}, {{{0}}}, {{{0}}}, {{0}}, {{0}}};
typedef struct self_user { int rank; } self_user;
static self_user g_self_user[2] = {{0}, {1}};

static cw_status self_send(void *user, const cw_tensor_desc *din, const void *data, int peer, int64_t tag,
                           void *stream) {
    (void)stream;
    int me = ((self_user *)user)->rank;
    if (!din || peer < 0 || peer > 1 || peer == me) return CW_ERR_COMM;
    cw_tensor_desc d = *din;
    if (d.strides[0] == 0 && cw_tensor_desc_numel(&d) > 0) { /* contiguous */
        int64_t s = 1;
        for (int q = d.rank - 1; q >= 0; q--) { d.strides[q] = s; s *= d.dims[q]; }
    }
    int64_t n = cw_tensor_desc_numel(&d), es = (int64_t)cw_dtype_size(d.dtype);
    int64_t *off = malloc(sizeof(int64_t) * (size_t)(n + 1));
    unsigned char *m = malloc((size_t)(n * es + 1));
    ASSERT_TRUE(off && m);
    view_offsets(&d, off);
    for (int64_t e = 0; e < n; e++) memcpy(m + e * es, (const unsigned char *)data + off[e] * es, (size_t)es);
    free(off);
    pthread_mutex_lock(&g_box.mu);
    int t = g_box.tail[me][peer]++ % BOX_MAX;
    g_box.msg[me][peer][t] = m;
    g_box.len[me][peer][t] = n * es;
    g_box.tag[me][peer][t] = tag;
    pthread_cond_broadcast(&g_box.cv);
    pthread_mutex_unlock(&g_box.mu);
    return CW_OK;
}

static cw_status self_recv(void *user, const cw_tensor_desc *din, void *data, int peer, int64_t tag, void *stream) {
    (void)stream;
    int me = ((self_user *)user)->rank;
    if (!din || peer < 0 || peer > 1 || peer == me) return CW_ERR_COMM;
    cw_tensor_desc d = *din;
    if (d.strides[0] == 0 && cw_tensor_desc_numel(&d) > 0) {
        int64_t s = 1;
        for (int q = d.rank - 1; q >= 0; q--) { d.strides[q] = s; s *= d.dims[q]; }
    }
    int64_t n = cw_tensor_desc_numel(&d), es = (int64_t)cw_dtype_size(d.dtype);
    pthread_mutex_lock(&g_box.mu);
    while (g_box.head[peer][me] == g_box.tail[peer][me]) pthread_cond_wait(&g_box.cv, &g_box.mu);
    int h = g_box.head[peer][me]++ % BOX_MAX;
    unsigned char *m = g_box.msg[peer][me][h];
    int64_t len = g_box.len[peer][me][h], mtag = g_box.tag[peer][me][h];
    pthread_mutex_unlock(&g_box.mu);
    if (len != n * es || mtag != tag) {
        free(m);
        return CW_ERR_COMM;
    }
    int64_t *off = malloc(sizeof(int64_t) * (size_t)(n + 1));
    ASSERT_TRUE(off);
    view_offsets(&d, off);
    for (int64_t e = 0; e < n; e++) memcpy((unsigned char *)data + off[e] * es, m + e * es, (size_t)es);
    free(off);
    free(m);
    return CW_OK;
}

/* ---- the harness: one buffer per rank and case, ops run by a thread per rank ------------- */
typedef struct buffer {
    int rank;
    int host;            /* host memory (blocking calls) */
    int64_t bytes;
    unsigned char *init; /* what it held before the case */
    void *mem;
} buffer;

static void buffer_make(buffer *b, int rank, int host, int64_t bytes, cw_rng *rng) {
    b->rank = rank;
    b->host = host;
    b->bytes = bytes;
    b->init = malloc((size_t)bytes);
    ASSERT_TRUE(b->init);
    for (int64_t i = 0; i < bytes; i++) b->init[i] = (unsigned char)cw_rng_next(rng);
    if (host) {
        b->mem = malloc((size_t)bytes);
        ASSERT_TRUE(b->mem);
        memcpy(b->mem, b->init, (size_t)bytes);
    } else {
        b->mem = mem_alloc(rank, bytes);
        mem_copy(rank, b->mem, b->init, bytes, 1);
    }
}

static void buffer_read(const buffer *b, unsigned char *out) {
    if (b->host) memcpy(out, b->mem, (size_t)b->bytes);
    else mem_copy(b->rank, out, b->mem, b->bytes, 0);
}

static void buffer_free(buffer *b) {
    if (b->host) free(b->mem);
    else mem_free(b->rank, b->mem);
    free(b->init);
}

typedef struct op {
    int send;
    cw_tensor_desc d;
    buffer *buf;
    int64_t elem_off; /* the view's first element in buf */
    int peer;
    int64_t tag;
    int blocking;     /* stream NULL */
    cw_status want;
} op;

#define MAX_OPS 4
typedef struct side {
    int rank;
    cw_comm *comm;
    void *stream; /* cudaStream_t of the rank's device; NULL in the self-test */
    int n;
    op ops[MAX_OPS];
    cw_status got[MAX_OPS];
} side;

static void *side_run(void *arg) {
    side *s = arg;
    for (int i = 0; i < s->n; i++) {
        op *o = &s->ops[i];
        unsigned char *p = (unsigned char *)o->buf->mem + o->elem_off * (int64_t)cw_dtype_size(o->d.dtype);
        void *stream = o->blocking ? NULL : s->stream;
        s->got[i] = o->send ? s->comm->send(s->comm->user, &o->d, p, o->peer, o->tag, stream)
                            : s->comm->recv(s->comm->user, &o->d, p, o->peer, o->tag, stream);
    }
#ifdef CW_HAVE_NCCL
    if (!g_self) {
        ASSERT_TRUE(cudaSetDevice(s->rank) == cudaSuccess);
        ASSERT_TRUE(cudaStreamSynchronize((cudaStream_t)s->stream) == cudaSuccess);
    }
#endif
    return NULL;
}

static void run_sides(side sd[2]) {
    pthread_t th[2];
    for (int r = 0; r < 2; r++) ASSERT_TRUE(pthread_create(&th[r], NULL, side_run, &sd[r]) == 0);
    for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < sd[r].n; i++) {
            if (sd[r].got[i] != sd[r].ops[i].want) {
                fprintf(stderr, "rank %d op %d (tag %" PRId64 "): %s, want %s: %s\n", r, i, sd[r].ops[i].tag,
                        cw_status_name(sd[r].got[i]), cw_status_name(sd[r].ops[i].want),
                        g_self ? "" : cw_comm_nccl_get_last_error(sd[r].comm));
                exit(1);
            }
        }
}

/* What dst must hold after receiving src's view: its old bytes, the view's elements
 * replaced in row-major order. Compares byte for byte. */
static void expect_moved(const char *name, const buffer *src, const cw_tensor_desc *sv, int64_t soff,
                         const buffer *dst, const cw_tensor_desc *dv, int64_t doff) {
    cw_tensor_desc a = *sv, b = *dv;
    int64_t es = (int64_t)cw_dtype_size(a.dtype);
    for (cw_tensor_desc *v = &a; v; v = v == &a ? &b : NULL)
        if (v->strides[0] == 0) {
            int64_t s = 1;
            for (int q = v->rank - 1; q >= 0; q--) { v->strides[q] = s; s *= v->dims[q]; }
        }
    int64_t n = cw_tensor_desc_numel(&a);
    ASSERT_EQ_I(n, cw_tensor_desc_numel(&b));
    int64_t *oa = malloc(sizeof(int64_t) * (size_t)(n + 1)), *ob = malloc(sizeof(int64_t) * (size_t)(n + 1));
    unsigned char *want = malloc((size_t)dst->bytes), *got = malloc((size_t)dst->bytes);
    ASSERT_TRUE(oa && ob && want && got);
    view_offsets(&a, oa);
    view_offsets(&b, ob);
    memcpy(want, dst->init, (size_t)dst->bytes);
    for (int64_t e = 0; e < n; e++)
        memcpy(want + (doff + ob[e]) * es, src->init + (soff + oa[e]) * es, (size_t)es);
    buffer_read(dst, got);
    for (int64_t i = 0; i < dst->bytes; i++) {
        if (got[i] != want[i]) {
            fprintf(stderr, "%s: byte %" PRId64 " of %" PRId64 " is 0x%02x, want 0x%02x\n", name, i, dst->bytes,
                    got[i], want[i]);
            exit(1);
        }
    }
    fprintf(stderr, "%s: %" PRId64 " elements moved, every byte as sent\n", name, n);
    free(oa);
    free(ob);
    free(want);
    free(got);
}

static cw_tensor_desc view(cw_dtype dt, int rank, const int64_t *dims, const int64_t *strides) {
    cw_tensor_desc d;
    memset(&d, 0, sizeof d);
    d.dtype = dt;
    d.rank = rank;
    for (int q = 0; q < rank; q++) {
        d.dims[q] = dims[q];
        d.strides[q] = strides ? strides[q] : 0;
    }
    return d;
}

static int64_t g_tag;

/* One message from `from` to the other rank: sv at soff of a buffer of sbytes there, dv at
 * doff of a buffer of dbytes on the receiver. */
static void one_message(const char *name, cw_comm comm[2], void *streams[2], int from, const cw_tensor_desc *sv,
                        int64_t soff, int64_t sbytes, const cw_tensor_desc *dv, int64_t doff, int64_t dbytes,
                        int blocking, cw_rng *rng) {
    int to = 1 - from;
    buffer bs, bd;
    buffer_make(&bs, from, blocking, sbytes, rng);
    buffer_make(&bd, to, blocking, dbytes, rng);
    side sd[2];
    memset(sd, 0, sizeof sd);
    for (int r = 0; r < 2; r++) {
        sd[r].rank = r;
        sd[r].comm = &comm[r];
        sd[r].stream = streams[r];
        sd[r].n = 1;
    }
    int64_t tag = g_tag++;
    sd[from].ops[0] = (op){1, *sv, &bs, soff, to, tag, blocking, CW_OK};
    sd[to].ops[0] = (op){0, *dv, &bd, doff, from, tag, blocking, CW_OK};
    run_sides(sd);
    expect_moved(name, &bs, sv, soff, &bd, dv, doff);
    buffer_free(&bs);
    buffer_free(&bd);
}

static void set_pieces(cw_comm comm[2], int64_t bytes) {
#ifdef CW_HAVE_NCCL
    if (!g_self)
        for (int r = 0; r < 2; r++) cw__comm_nccl_set_piece_bytes(&comm[r], bytes);
#else
    (void)comm;
    (void)bytes;
#endif
}

static void run_cases(cw_comm comm[2], void *streams[2]) {
    cw_rng rng = {cw_test_seed(27)};
    for (int pass = 0; pass < 2; pass++) {
        /* pass 1: 64-byte pieces, so every message is many pieces and partial runs */
        set_pieces(comm, pass ? 64 : CW_COMM_NCCL_PIECE_BYTES);
        char name[96];
        /* f32: rows [4, 7) of [2, 3, 10, 7] into rows [1, 4) of a band-plus-halo [2, 3, 5, 7] */
        {
            int64_t dims[4] = {2, 3, 3, 7}, s0[4] = {3 * 10 * 7, 10 * 7, 7, 1}, s1[4] = {3 * 5 * 7, 5 * 7, 7, 1};
            cw_tensor_desc a = view(CW_F32, 4, dims, s0), b = view(CW_F32, 4, dims, s1);
            snprintf(name, sizeof name, "pass %d: f32 NCHW band", pass);
            one_message(name, comm, streams, 0, &a, 4 * 7, 2 * 3 * 10 * 7 * 4, &b, 1 * 7, 2 * 3 * 5 * 7 * 4, 0, &rng);
            snprintf(name, sizeof name, "pass %d: f32 NCHW band, rank 1 to 0", pass);
            one_message(name, comm, streams, 1, &b, 1 * 7, 2 * 3 * 5 * 7 * 4, &a, 4 * 7, 2 * 3 * 10 * 7 * 4, 0, &rng);
        }
        /* f16 NCDHW: rows [0, 2) of [1, 4, 3, 9, 5] into a [1, 4, 3, 2, 5] halo buffer (contiguous) */
        {
            int64_t dims[5] = {1, 4, 3, 2, 5}, s0[5] = {4 * 3 * 9 * 5, 3 * 9 * 5, 9 * 5, 5, 1};
            cw_tensor_desc a = view(CW_F16, 5, dims, s0), b = view(CW_F16, 5, dims, NULL);
            snprintf(name, sizeof name, "pass %d: f16 NCDHW band into a contiguous buffer", pass);
            one_message(name, comm, streams, 0, &a, 0, 4 * 3 * 9 * 5 * 2, &b, 0, 4 * 3 * 2 * 5 * 2, 0, &rng);
            snprintf(name, sizeof name, "pass %d: bf16 contiguous into an NCDHW band", pass);
            a.dtype = b.dtype = CW_BF16;
            one_message(name, comm, streams, 1, &b, 0, 4 * 3 * 2 * 5 * 2, &a, 7 * 5, 4 * 3 * 9 * 5 * 2, 0, &rng);
        }
        /* W-strided (every other column) against a padded row pitch */
        {
            int64_t dims[4] = {1, 2, 3, 6}, s0[4] = {2 * 4 * 12, 4 * 12, 12, 2}, s1[4] = {2 * 3 * 8, 3 * 8, 8, 1};
            cw_tensor_desc a = view(CW_F32, 4, dims, s0), b = view(CW_F32, 4, dims, s1);
            snprintf(name, sizeof name, "pass %d: W-strided f32 into a padded pitch", pass);
            one_message(name, comm, streams, 0, &a, 1, 2 * 4 * 12 * 4, &b, 2, 2 * 3 * 8 * 4, 0, &rng);
        }
        /* blocking, host memory: the configuration check's small arrays (6 int64 as 12 f32),
         * and a strided host view */
        {
            int64_t d1[1] = {12};
            cw_tensor_desc a = view(CW_F32, 1, d1, NULL);
            snprintf(name, sizeof name, "pass %d: blocking host array", pass);
            one_message(name, comm, streams, 0, &a, 0, 48, &a, 0, 48, 1, &rng);
            int64_t d2[2] = {3, 4}, s2[2] = {6, 1};
            cw_tensor_desc b = view(CW_F16, 2, d2, s2), c = view(CW_F16, 2, d2, NULL);
            snprintf(name, sizeof name, "pass %d: blocking strided host view", pass);
            one_message(name, comm, streams, 1, &b, 1, 3 * 6 * 2, &c, 0, 3 * 4 * 2, 1, &rng);
        }
        /* both directions, in one global order: rank 0 sends then receives, rank 1 the reverse */
        {
            int64_t dims[4] = {1, 8, 2, 16}, s0[4] = {8 * 20 * 16, 20 * 16, 16, 1};
            cw_tensor_desc a = view(CW_F32, 4, dims, s0);
            int64_t bytes = 8 * 20 * 16 * 4;
            buffer b0s, b0r, b1s, b1r;
            buffer_make(&b0s, 0, 0, bytes, &rng);
            buffer_make(&b0r, 0, 0, bytes, &rng);
            buffer_make(&b1s, 1, 0, bytes, &rng);
            buffer_make(&b1r, 1, 0, bytes, &rng);
            side sd[2];
            memset(sd, 0, sizeof sd);
            for (int r = 0; r < 2; r++) {
                sd[r].rank = r;
                sd[r].comm = &comm[r];
                sd[r].stream = streams[r];
                sd[r].n = 2;
            }
            int64_t t0 = g_tag++, t1 = g_tag++;
            sd[0].ops[0] = (op){1, a, &b0s, 18 * 16, 1, t0, 0, CW_OK}; /* rows [18, 20): its last */
            sd[1].ops[0] = (op){0, a, &b1r, 0, 0, t0, 0, CW_OK};        /* into rows [0, 2) */
            sd[1].ops[1] = (op){1, a, &b1s, 2 * 16, 0, t1, 0, CW_OK};   /* rows [2, 4): its first */
            sd[0].ops[1] = (op){0, a, &b0r, 18 * 16, 1, t1, 0, CW_OK};  /* halo below */
            run_sides(sd);
            snprintf(name, sizeof name, "pass %d: halo exchange, 0 to 1", pass);
            expect_moved(name, &b0s, &a, 18 * 16, &b1r, &a, 0);
            snprintf(name, sizeof name, "pass %d: halo exchange, 1 to 0", pass);
            expect_moved(name, &b1s, &a, 2 * 16, &b0r, &a, 18 * 16);
            buffer_free(&b0s);
            buffer_free(&b0r);
            buffer_free(&b1s);
            buffer_free(&b1r);
        }
    }
    set_pieces(comm, CW_COMM_NCCL_PIECE_BYTES);
    /* bigger than a piece: 40 channels of 256 x 256 f32 (10 MiB) out of a 300-row tensor */
    if (!cw_test_quick()) {
        int64_t dims[4] = {1, 40, 256, 256}, s0[4] = {40 * 300 * 256, 300 * 256, 256, 1};
        cw_tensor_desc a = view(CW_F32, 4, dims, s0), b = view(CW_F32, 4, dims, NULL);
        one_message("f32 band of 10 MiB in two pieces", comm, streams, 0, &a, 30 * 256, 40 * 300 * 256 * 4, &b, 0,
                    40 * 256 * 256 * 4, 0, &rng);
    }
    /* an empty view moves nothing and needs no peer call */
    {
        int64_t dims[4] = {1, 3, 0, 8};
        cw_tensor_desc e = view(CW_F32, 4, dims, NULL);
        unsigned char dummy[4];
        for (int r = 0; r < 2; r++)
            ASSERT_STATUS(comm[r].send(comm[r].user, &e, dummy, 1 - r, g_tag, streams[r]), CW_OK);
    }
}

#ifdef CW_HAVE_NCCL
/* Errors a call reports without a peer: CW_ERR_COMM and a message naming the fault. */
static void check_errors(cw_comm *c) {
    int64_t dims[1] = {4};
    cw_tensor_desc d = view(CW_F32, 1, dims, NULL);
    float x[4] = {0};
    ASSERT_STATUS(c->send(c->user, &d, x, c->rank, 1, NULL), CW_ERR_COMM);
    ASSERT_TRUE(strstr(cw_comm_nccl_get_last_error(c), "peer") != NULL);
    ASSERT_STATUS(c->recv(c->user, &d, x, 5, 1, NULL), CW_ERR_COMM);
    ASSERT_STATUS(c->send(c->user, NULL, x, 1 - c->rank, 1, NULL), CW_ERR_COMM);
    ASSERT_TRUE(strstr(cw_comm_nccl_get_last_error(c), "d is NULL") != NULL);
    ASSERT_STATUS(c->send(c->user, &d, NULL, 1 - c->rank, 1, NULL), CW_ERR_COMM);
    d.rank = 6;
    ASSERT_STATUS(c->send(c->user, &d, x, 1 - c->rank, 1, NULL), CW_ERR_COMM);
    d.rank = 1;
    d.strides[0] = -1;
    ASSERT_STATUS(c->recv(c->user, &d, x, 1 - c->rank, 1, NULL), CW_ERR_COMM);
    fprintf(stderr, "rank %d's last error: %s\n", c->rank, cw_comm_nccl_get_last_error(c));
}
#endif

static int run_selftest(void) {
    cw_comm comm[2];
    void *streams[2] = {NULL, NULL};
    for (int r = 0; r < 2; r++)
        comm[r] = (cw_comm){sizeof(cw_comm), CW_COMM_VERSION, r, 2, &g_self_user[r], self_send, self_recv};
    run_cases(comm, streams);
    TEST_DONE();
}

int main(void) {
    g_self = getenv("CW_COMM_NCCL_SELFTEST") != NULL;
    if (g_self) return run_selftest();
#ifndef CW_HAVE_NCCL
    fprintf(stderr, "built without NCCL: skipping\n");
    return CW_TEST_SKIP;
#else
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev < 1) {
        (void)cudaGetLastError();
        fprintf(stderr, "no CUDA device: skipping\n");
        return CW_TEST_SKIP;
    }
    ncclComm_t nc[2];
    int devs[2] = {0, 1};
    ncclResult_t r0 = ncclCommInitAll(nc, n_dev >= 2 ? 2 : 1, devs);
    if (r0 != ncclSuccess) {
        fprintf(stderr, "ncclCommInitAll: %s\n", ncclGetErrorString(r0));
        return 1;
    }
    if (n_dev < 2) {
        /* NCCL refuses two ranks on one GPU: a one-rank communicator checks what needs no
         * peer (init against a real ncclComm_t, the errors of a call), and says the rest
         * was not run (scripts/gpu-check.sh counts a skip on a GPU machine as a failure) */
        cw_comm one, bad;
        ASSERT_STATUS(cw_comm_nccl_init(&bad, nc[0], 0, 2), CW_ERR_INVALID_ARG);
        ASSERT_OK(cw_comm_nccl_init(&one, nc[0], 0, 1));
        check_errors(&one);
        cw_comm_nccl_destroy(&one);
        ASSERT_TRUE(one.user == NULL);
        ASSERT_TRUE(ncclCommDestroy(nc[0]) == ncclSuccess);
        if (cw_test_failures) TEST_DONE();
        fprintf(stderr, "1 CUDA device: init and error checks passed; the transfers need 2 GPUs, not run\n");
        return 0;
    }
    /* init checks its rank and rank count against the NCCL communicator's */
    cw_comm bad;
    ASSERT_STATUS(cw_comm_nccl_init(&bad, nc[0], 1, 2), CW_ERR_INVALID_ARG);
    ASSERT_STATUS(cw_comm_nccl_init(&bad, nc[0], 0, 3), CW_ERR_INVALID_ARG);
    cw_comm comm[2];
    void *streams[2];
    for (int r = 0; r < 2; r++) {
        ASSERT_OK(cw_comm_nccl_init(&comm[r], nc[r], r, 2));
        ASSERT_EQ_I(comm[r].rank, r);
        ASSERT_EQ_I(comm[r].n_ranks, 2);
        ASSERT_EQ_I(comm[r].version, CW_COMM_VERSION);
        ASSERT_TRUE(strcmp(cw_comm_nccl_get_last_error(&comm[r]), "") == 0);
        cudaStream_t s;
        ASSERT_TRUE(cudaSetDevice(r) == cudaSuccess);
        ASSERT_TRUE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
        streams[r] = s;
    }
    ASSERT_TRUE(cudaSetDevice(0) == cudaSuccess);
    run_cases(comm, streams);
    for (int r = 0; r < 2; r++) check_errors(&comm[r]);
    for (int r = 0; r < 2; r++) {
        cw_comm_nccl_destroy(&comm[r]);
        ASSERT_TRUE(comm[r].user == NULL);
        ASSERT_TRUE(cudaSetDevice(r) == cudaSuccess);
        ASSERT_TRUE(cudaStreamDestroy((cudaStream_t)streams[r]) == cudaSuccess);
        ASSERT_TRUE(ncclCommDestroy(nc[r]) == ncclSuccess);
    }
    TEST_DONE();
#endif
}
