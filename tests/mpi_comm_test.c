/* demos/comm_mpi.c, the cw_comm cw-vae --ranks hands the library, on 3 ranks (mpi_run.sh):
 * strided f32/f16/bf16 views packed and unpacked exactly (inner stride 1 and not, the
 * all-zero contiguous strides, empty views), messages of 6-8 MiB moved in 4 MiB pieces (cut
 * mid-row), and every failure a clean
 * CW_ERR_COMM with a reason: a tag the receiver did not expect, a peer that never sends
 * (the timeout), a bad peer, a device stream. */
#include <inttypes.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm_mpi.h"

static int g_rank, g_fail;

#define EXPECT_EQ(a, b)                                                                                 \
    do {                                                                                                \
        long long a_ = (long long)(a), b_ = (long long)(b);                                             \
        if (a_ != b_) {                                                                                 \
            fprintf(stderr, "rank %d: %s:%d: %s = %lld, %s = %lld\n", g_rank, __FILE__, __LINE__, #a, a_, \
                    #b, b_);                                                                            \
            g_fail++;                                                                                   \
        }                                                                                               \
    } while (0)
#define EXPECT_TRUE(c)                                                                                  \
    do {                                                                                                \
        if (!(c)) {                                                                                     \
            fprintf(stderr, "rank %d: %s:%d: %s\n", g_rank, __FILE__, __LINE__, #c);                    \
            g_fail++;                                                                                   \
        }                                                                                               \
    } while (0)

/* A view of rank 4 inside a buffer, its element (i, j, k, l) at off + sum(idx * stride). */
typedef struct view {
    cw_tensor_desc d;
    int64_t off; /* elements from the buffer's start */
} view;

static view make_view(cw_dtype dt, const int64_t dims[4], const int64_t strides[4], int64_t off) {
    view v;
    memset(&v, 0, sizeof(v));
    v.d.dtype = dt;
    v.d.rank = 4;
    for (int i = 0; i < 4; i++) v.d.dims[i] = dims[i], v.d.strides[i] = strides[i];
    v.off = off;
    return v;
}

static int64_t numel(const view *v) { return v->d.dims[0] * v->d.dims[1] * v->d.dims[2] * v->d.dims[3]; }

/* the element at the n-th position in row-major order of the view, as an offset in elements */
static int64_t at(const view *v, int64_t n) {
    int64_t st[4];
    int zero = !v->d.strides[0] && !v->d.strides[1] && !v->d.strides[2] && !v->d.strides[3];
    int64_t s = 1;
    for (int i = 3; i >= 0; i--) st[i] = zero ? s : v->d.strides[i], s *= v->d.dims[i];
    int64_t o = v->off;
    for (int i = 3; i >= 0; i--) {
        o += (n % v->d.dims[i]) * st[i];
        n /= v->d.dims[i];
    }
    return o;
}

/* the value a sender puts at logical position n of message tag: distinct bits per element */
static uint32_t value(int64_t tag, int64_t n) { return (uint32_t)(tag * 2654435761u) ^ (uint32_t)(n * 40503u + 7u); }

static void put(void *buf, const view *v, int64_t tag) {
    size_t es = cw_dtype_size(v->d.dtype);
    for (int64_t n = 0; n < numel(v); n++) {
        uint32_t x = value(tag, n);
        memcpy((char *)buf + at(v, n) * (int64_t)es, &x, es);
    }
}

static int64_t mismatches(const void *buf, const view *v, int64_t tag) {
    size_t es = cw_dtype_size(v->d.dtype);
    int64_t bad = 0;
    for (int64_t n = 0; n < numel(v); n++) {
        uint32_t x = value(tag, n), y = 0;
        memcpy(&y, (const char *)buf + at(v, n) * (int64_t)es, es);
        if (memcmp(&x, &y, es)) bad++;
    }
    return bad;
}

/* pack then unpack into another layout, on this rank alone */
static void test_pack(void) {
    static const int64_t dims[4] = {2, 3, 4, 5};
    view src = make_view(CW_F32, dims, (int64_t[4]){3 * 6 * 7, 6 * 7, 7, 1}, 11); /* rows inside wider rows */
    view col = make_view(CW_F16, dims, (int64_t[4]){120 * 2, 40 * 2, 10 * 2, 2}, 1); /* inner stride 2 */
    view flat = make_view(CW_BF16, dims, (int64_t[4]){0, 0, 0, 0}, 0);                /* contiguous */
    view *vs[3] = {&src, &col, &flat};
    for (int i = 0; i < 3; i++) {
        view *v = vs[i];
        size_t es = cw_dtype_size(v->d.dtype);
        char *a = calloc(4096, es), *p = calloc(4096, es), *b = calloc(4096, es);
        put(a, v, 100 + i);
        EXPECT_EQ(comm_mpi_pack(p, &v->d, a + v->off * (int64_t)es), numel(v) * (int64_t)es);
        view pv = make_view(v->d.dtype, dims, (int64_t[4]){0, 0, 0, 0}, 0);
        EXPECT_EQ(mismatches(p, &pv, 100 + i), 0); /* packed = row-major order */
        EXPECT_EQ(comm_mpi_unpack(b + v->off * (int64_t)es, &v->d, p), numel(v) * (int64_t)es);
        EXPECT_EQ(mismatches(b, v, 100 + i), 0);
        free(a), free(p), free(b);
    }
}

/* one message from `from` to `to`: sender's view s, receiver's view r (same dims) */
static void exchange(const cw_comm *c, int from, int to, const view *s, const view *r, int64_t tag, size_t bufelems) {
    if (c->rank != from && c->rank != to) return;
    size_t es = cw_dtype_size(s->d.dtype);
    char *buf = calloc(bufelems, es);
    if (c->rank == from) {
        put(buf, s, tag);
        EXPECT_EQ(c->send(c->user, &s->d, buf + s->off * (int64_t)es, to, tag, NULL), CW_OK);
    } else {
        cw_status st = c->recv(c->user, &r->d, buf + r->off * (int64_t)es, from, tag, NULL);
        EXPECT_EQ(st, CW_OK);
        EXPECT_EQ(mismatches(buf, r, tag), 0);
    }
    free(buf);
}

int main(int argc, char **argv) {
    char err[512];
    if (comm_mpi_init(&argc, &argv, err, sizeof(err))) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    comm_mpi *m = NULL, *quick = NULL;
    cw_comm c, cq;
    if (comm_mpi_create(&m, &c, 60, err, sizeof(err)) || comm_mpi_create(&quick, &cq, 1.0, err, sizeof(err))) {
        fprintf(stderr, "%s\n", err);
        comm_mpi_abort(1);
    }
    g_rank = c.rank;
    EXPECT_EQ(c.n_ranks, 3);
    EXPECT_EQ(c.version, CW_COMM_VERSION);
    EXPECT_EQ(c.size, sizeof(cw_comm));
    test_pack();

    /* every rank makes the same calls in one order, as the plan's comm stream does */
    static const int64_t dims[4] = {1, 3, 5, 7};
    view rows = make_view(CW_F32, dims, (int64_t[4]){3 * 9 * 8, 9 * 8, 8, 1}, 8 * 2 + 1);
    view cols = make_view(CW_F32, dims, (int64_t[4]){3 * 5 * 14, 5 * 14, 14, 2}, 3);
    view half_flat = make_view(CW_F16, dims, (int64_t[4]){0, 0, 0, 0}, 0);
    view half_cols = make_view(CW_F16, dims, (int64_t[4]){1000, 5 * 7 * 2, 7 * 2, 2}, 1);
    view bfv = make_view(CW_BF16, dims, (int64_t[4]){1000, 5 * 7 * 2, 7 * 2, 2}, 1);
    exchange(&c, 0, 1, &rows, &cols, 1, 4096);
    exchange(&c, 1, 2, &cols, &rows, 2, 4096);
    exchange(&c, 2, 0, &half_flat, &half_cols, 3, 4096);
    view bf_flat = make_view(CW_BF16, dims, (int64_t[4]){0, 0, 0, 0}, 0);
    exchange(&c, 0, 2, &bfv, &bf_flat, (int64_t)1 << 40, 4096); /* a tag past MPI's range */
    static const int64_t big[4] = {1, 8, 512, 512}; /* 8 MiB of f32: a rendezvous message */
    view bigv = make_view(CW_F32, big, (int64_t[4]){0, 0, 0, 0}, 0);
    exchange(&c, 1, 0, &bigv, &bigv, 5, (size_t)8 * 512 * 512);
    static const int64_t odd[4] = {1, 3, 1001, 1001}; /* f16, inner stride 2: 6 MiB, 2 pieces cut mid-row */
    view oddcols = make_view(CW_F16, odd, (int64_t[4]){0, 1001 * 2002, 2002, 2}, 1);
    view oddflat = make_view(CW_F16, odd, (int64_t[4]){0, 0, 0, 0}, 0);
    exchange(&c, 2, 1, &oddcols, &oddflat, 9, (size_t)3 * 1001 * 2002 + 2);
    exchange(&c, 0, 2, &oddflat, &oddcols, 10, (size_t)3 * 1001 * 2002 + 2);
    static const int64_t none[4] = {1, 3, 0, 7}; /* an empty view: a header alone */
    view nonev = make_view(CW_F32, none, (int64_t[4]){0, 0, 0, 0}, 0);
    exchange(&c, 2, 1, &nonev, &nonev, 6, 16);

    /* failures: a clean CW_ERR_COMM and a reason */
    int *ub = NULL, flag = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
    int64_t alias = 7 + (int64_t)*ub + 1; /* the same MPI tag as 7: the header tells them apart */
    float x[4] = {1, 2, 3, 4};
    cw_tensor_desc d4 = {CW_F32, 1, {4}, {0}};
    if (c.rank == 0) EXPECT_EQ(c.send(c.user, &d4, x, 1, alias, NULL), CW_OK);
    if (c.rank == 1) {
        EXPECT_EQ(c.recv(c.user, &d4, x, 0, 7, NULL), CW_ERR_COMM);
        EXPECT_TRUE(strstr(comm_mpi_last_error(m), "expected") != NULL);
        fprintf(stderr, "rank 1: tag mismatch: %s\n", comm_mpi_last_error(m));
    }
    if (c.rank == 2) { /* rank 0 never sends this: the timeout ends the wait */
        double t0 = MPI_Wtime();
        EXPECT_EQ(cq.recv(cq.user, &d4, x, 0, 99, NULL), CW_ERR_COMM);
        double t = MPI_Wtime() - t0;
        EXPECT_TRUE(t >= 0.9 && t < 10);
        EXPECT_TRUE(strstr(comm_mpi_last_error(quick), "not done after") != NULL);
        fprintf(stderr, "rank 2: timeout after %.2f s: %s\n", t, comm_mpi_last_error(quick));
    }
    EXPECT_EQ(c.send(c.user, &d4, x, c.rank, 8, NULL), CW_ERR_COMM); /* to itself */
    EXPECT_EQ(c.recv(c.user, &d4, x, 3, 8, NULL), CW_ERR_COMM);      /* no rank 3 */
    EXPECT_EQ(c.send(c.user, &d4, x, (c.rank + 1) % 3, 8, (void *)&c), CW_ERR_COMM); /* a device stream */
    EXPECT_TRUE(strstr(comm_mpi_last_error(m), "stream") != NULL);
    long long s, r, bs, br;
    comm_mpi_counts(m, &s, &r, &bs, &br);
    if (c.rank == 0) EXPECT_EQ(bs, (long long)(rows.d.dims[1] * 5 * 7 * 4 + 3 * 5 * 7 * 2 + 3 * 1001 * 1001 * 2 + 16));
    int all = 0;
    MPI_Allreduce(&g_fail, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    comm_mpi_destroy(quick);
    comm_mpi_destroy(m);
    comm_mpi_finalize();
    if (g_fail) fprintf(stderr, "rank %d: %d failures\n", g_rank, g_fail);
    if (g_rank == 0) printf("mpi_comm: %s\n", all ? "FAILED (see the ranks' lines)" : "all checks passed on 3 ranks");
    return g_fail ? 1 : 0;
}
