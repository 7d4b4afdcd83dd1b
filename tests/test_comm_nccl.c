/* The NCCL communicator without a device: libnccl opens (it is not linked); cw_comm_nccl_init's
 * argument checks (and CW_ERR_UNSUPPORTED in builds without NCCL); destroy and get_last_error
 * on what init did not fill; and the host arithmetic every transfer rests on: cutting a
 * strided view into pieces from its dims alone, and each piece into 2-D copies, checked
 * against the view's row-major element order over random band views. The transfers
 * themselves are tests/test_comm_nccl_gpu.c (two GPUs). */
#include "testutil.h"
#include "view_walk.h"

#include "backend/comm_nccl.h"
#include "convweave/convweave_cuda.h"

static void check_init_args(void) {
    int fake = 0; /* never dereferenced: every call below fails its argument checks first */
    cw_comm c;
    ASSERT_STATUS(cw_comm_nccl_init(NULL, &fake, 0, 2), CW_ERR_INVALID_ARG);
    memset(&c, 0xab, sizeof c);
    ASSERT_STATUS(cw_comm_nccl_init(&c, NULL, 0, 2), CW_ERR_INVALID_ARG);
    ASSERT_TRUE(c.user == NULL && c.send == NULL && c.size == 0); /* zeroed on failure */
    ASSERT_STATUS(cw_comm_nccl_init(&c, &fake, 0, 0), CW_ERR_INVALID_ARG);
    ASSERT_STATUS(cw_comm_nccl_init(&c, &fake, 0, -3), CW_ERR_INVALID_ARG);
    ASSERT_STATUS(cw_comm_nccl_init(&c, &fake, -1, 2), CW_ERR_INVALID_ARG);
    ASSERT_STATUS(cw_comm_nccl_init(&c, &fake, 2, 2), CW_ERR_INVALID_ARG);
    ASSERT_STATUS(cw_comm_nccl_init(&c, &fake, 7, 1), CW_ERR_INVALID_ARG);
#ifndef CW_HAVE_NCCL
    /* good arguments: the build says what is missing */
    ASSERT_STATUS(cw_comm_nccl_init(&c, &fake, 0, 2), CW_ERR_UNSUPPORTED);
    ASSERT_TRUE(c.user == NULL && c.send == NULL);
#endif
    /* destroy and get_last_error leave alone what init did not fill */
    cw_comm_nccl_destroy(NULL);
    memset(&c, 0, sizeof c);
    cw_comm_nccl_destroy(&c);
    ASSERT_TRUE(strcmp(cw_comm_nccl_get_last_error(NULL), "") == 0);
    ASSERT_TRUE(strcmp(cw_comm_nccl_get_last_error(&c), "") == 0);
    cw_comm other = {sizeof(cw_comm), CW_COMM_VERSION, 0, 1, &fake, NULL, NULL};
    cw_comm_nccl_destroy(&other);
    ASSERT_TRUE(other.user == &fake && other.size == sizeof(cw_comm));
    ASSERT_TRUE(strcmp(cw_comm_nccl_get_last_error(&other), "") == 0);
}

/* A band of rows of a random NCHW(D) tensor, a channel slice at times, sometimes with a
 * padded row pitch or a W-strided view; dtype random. */
static void random_view(cw_rng *r, cw_tensor_desc *v) {
    memset(v, 0, sizeof *v);
    v->dtype = (cw_dtype)cw_rng_range(r, 0, 2);
    v->rank = (int)cw_rng_range(r, 1, 5);
    int64_t full[CW_MAX_RANK];
    for (int q = 0; q < v->rank; q++) {
        full[q] = cw_rng_range(r, 1, q == v->rank - 1 ? 9 : 5);
        v->dims[q] = full[q];
    }
    if (v->rank >= 2) { /* a band of rows along dim rank-2, and maybe of channels */
        int h = v->rank - 2;
        full[h] += cw_rng_range(r, 0, 4);
        if (v->rank >= 3 && cw_rng_range(r, 0, 3) == 0) full[1] += cw_rng_range(r, 1, 3);
    }
    int64_t wstep = cw_rng_range(r, 0, 4) == 0 ? 2 : 1, pad = cw_rng_range(r, 0, 3) == 0 ? 3 : 0;
    int64_t s = wstep;
    for (int q = v->rank - 1; q >= 0; q--) {
        v->strides[q] = s;
        s *= full[q] + (q == v->rank - 1 ? pad : 0);
    }
}

static void check_pieces(uint64_t seed) {
    cw_rng r = {seed};
    int64_t *want = malloc(sizeof(int64_t) * 20000), *got = malloc(sizeof(int64_t) * 20000),
            *sub_offs = malloc(sizeof(int64_t) * 20000);
    ASSERT_TRUE(want && got && sub_offs);
    int n_multi_piece = 0, n_multi_block = 0;
    for (int it = 0; it < 4000; it++) {
        cw_tensor_desc v;
        random_view(&r, &v);
        int64_t es = (int64_t)cw_dtype_size(v.dtype), n = view_offsets(&v, want);
        int64_t cap = es * cw_rng_range(&r, 1, 300);
        cw__comm_pieces p;
        cw__comm_pieces_plan(&v, cap, &p);
        /* the cut depends on dims and dtype only: the peer, with other strides, agrees */
        cw_tensor_desc dense = v;
        memset(dense.strides, 0, sizeof dense.strides);
        cw__comm_pieces pd;
        cw__comm_pieces_plan(&dense, cap, &pd);
        ASSERT_TRUE(memcmp(&p, &pd, sizeof p) == 0);
        ASSERT_LE_I(p.max_bytes, cap);
        int64_t k = 0, blocks_max = 0;
        n_multi_piece += p.count > 1;
        for (int64_t i = 0; i < p.count; i++) {
            cw_tensor_desc sub, sd;
            int64_t off, doff;
            cw__comm_piece(&v, &p, i, &sub, &off);
            cw__comm_piece(&dense, &pd, i, &sd, &doff);
            ASSERT_TRUE(memcmp(sub.dims, sd.dims, sizeof sub.dims) == 0);
            int64_t m = cw_tensor_desc_numel(&sub);
            ASSERT_LE_I(m * es, p.max_bytes);
            /* the 2-D copies visit the piece's elements in row-major order */
            cw__comm_copy2d c;
            cw__comm_copy2d_plan(&sub, (size_t)es, &c);
            int64_t nb = cw__comm_copy2d_blocks(&c), e = 0;
            ASSERT_EQ_I(c.width % es, 0);
            for (int64_t b = 0; b < nb; b++) {
                int64_t base = cw__comm_copy2d_block(&c, b);
                for (int64_t row = 0; row < c.height; row++)
                    for (int64_t x = 0; x < c.width; x += es) {
                        int64_t byte = base + row * c.pitch + x;
                        ASSERT_EQ_I(byte % es, 0);
                        ASSERT_TRUE(e < m);
                        sub_offs[e++] = off + byte / es;
                    }
            }
            ASSERT_EQ_I(e, m);
            ASSERT_EQ_I(c.contiguous, m == 1 || (nb == 1 && c.height == 1));
            if (c.contiguous) { /* contiguous means the piece's elements follow each other */
                for (int64_t j = 1; j < m; j++) ASSERT_EQ_I(sub_offs[j], sub_offs[0] + j);
            }
            if (nb > blocks_max) blocks_max = nb;
            for (int64_t j = 0; j < m; j++) got[k + j] = sub_offs[j];
            k += m;
        }
        n_multi_block += blocks_max > 1;
        /* the pieces, in order, are the message in row-major order */
        ASSERT_EQ_I(k, n);
        for (int64_t j = 0; j < n; j++) {
            if (got[j] != want[j]) {
                fprintf(stderr, "iteration %d: element %" PRId64 ": offset %" PRId64 ", want %" PRId64 "\n", it, j,
                        got[j], want[j]);
                exit(1);
            }
        }
    }
    /* the random views reached the paths that matter */
    fprintf(stderr, "%d views cut into several pieces, %d with a piece of several 2-D blocks\n", n_multi_piece,
            n_multi_block);
    ASSERT_TRUE(n_multi_piece > 400 && n_multi_block > 100);
    free(want);
    free(got);
    free(sub_offs);
}

/* The case the design is for: a band of rows of an NCHW tensor is one 2-D copy per piece,
 * and a whole contiguous tensor needs no copy. */
static void check_band_shapes(void) {
    cw_tensor_desc v = {CW_F16, 4, {2, 64, 3, 128}, {64 * 40 * 128, 40 * 128, 128, 1}};
    cw__comm_pieces p;
    cw__comm_pieces_plan(&v, CW_COMM_NCCL_PIECE_BYTES, &p);
    ASSERT_EQ_I(p.count, 1);
    ASSERT_EQ_I(p.max_bytes, 2 * 64 * 3 * 128 * 2);
    cw__comm_copy2d c;
    cw__comm_copy2d_plan(&v, 2, &c);
    ASSERT_EQ_I(cw__comm_copy2d_blocks(&c), 1);
    ASSERT_EQ_I(c.height, 2 * 64);
    ASSERT_EQ_I(c.width, 3 * 128 * 2);
    ASSERT_EQ_I(c.pitch, 40 * 128 * 2);
    ASSERT_EQ_I(c.contiguous, 0);
    /* 5-D: [N, C, D, rows, W] folds too */
    cw_tensor_desc v5 = {CW_F32, 5, {1, 8, 4, 2, 16}, {8 * 4 * 30 * 16, 4 * 30 * 16, 30 * 16, 16, 1}};
    cw__comm_copy2d_plan(&v5, 4, &c);
    ASSERT_EQ_I(cw__comm_copy2d_blocks(&c), 1);
    ASSERT_EQ_I(c.height, 32);
    /* a contiguous message */
    cw_tensor_desc d = {CW_F32, 4, {1, 3, 16, 16}, {0}};
    cw__comm_copy2d_plan(&(cw_tensor_desc){CW_F32, 4, {1, 3, 16, 16}, {768, 256, 16, 1}}, 4, &c);
    ASSERT_EQ_I(c.contiguous, 1);
    ASSERT_EQ_I(c.width, 768 * 4);
    /* big: 40 channels of 256 rows of 256 f32 = 10 MiB, cut per 32 channels at 8 MiB */
    d = (cw_tensor_desc){CW_F32, 4, {1, 40, 256, 256}, {40 * 300 * 256, 300 * 256, 256, 1}};
    cw__comm_pieces_plan(&d, CW_COMM_NCCL_PIECE_BYTES, &p);
    ASSERT_EQ_I(p.axis, 1);
    ASSERT_EQ_I(p.step, 32);
    ASSERT_EQ_I(p.count, 2);
    ASSERT_EQ_I(p.max_bytes, CW_COMM_NCCL_PIECE_BYTES);
    /* empty */
    d.dims[2] = 0;
    cw__comm_pieces_plan(&d, CW_COMM_NCCL_PIECE_BYTES, &p);
    ASSERT_EQ_I(p.count, 0);
}

int main(void) {
#ifdef CW_HAVE_NCCL
    /* libnccl is opened on first use (not linked): it loads and has every symbol used */
    const char *why = cw__comm_nccl_load();
    if (why[0]) fprintf(stderr, "libnccl: %s\n", why);
    ASSERT_TRUE(why[0] == '\0');
#endif
    check_init_args();
    check_band_shapes();
    check_pieces(cw_test_seed(27));
    TEST_DONE();
}
