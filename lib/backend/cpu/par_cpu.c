/* The cpu backend's own parallelism: a parallel-for over index ranges, thread teams, and
 * the split GEMM (cw__cpu_sgemm) that im2col convs, attention and the gemm op call
 * (Winograd makes its own single-threaded cw__cpu_gemm1 calls per block, oneDNN convs run
 * their own kernels). convweave owns the split of a GEMM: C is cut into blocks whose
 * boundaries depend only on (m, n) and each block is one single-threaded GEMM call
 * (cw__cpu_gemm1: oneDNN's sgemm where built with it, else OpenBLAS's), so the bits of C
 * never depend on the thread count, on how many streams run, or on timing. OpenBLAS's own
 * threading is switched off (process-wide: 0.3.21 has no per-thread count) because the way
 * it splits a GEMM follows its thread count and, on some CPUs (AVX2 kernels), the bits
 * follow the split; oneDNN's runs with the calling thread's OpenMP count set to 1.
 * docs/determinism.md has the contract. */
#include <cblas.h>
#include <pthread.h>

#include "backend/cpu/cpu.h"

#define CW__PAR_MAX_THREADS 16

typedef struct par_part {
    cw__range_fn fn;
    void *arg;
    int64_t lo, hi;
} par_part;

static void *par_part_main(void *p) {
    par_part *q = p;
    q->fn(q->arg, q->lo, q->hi);
    return NULL;
}

void cw__cpu_parallel(int threads, int64_t n, cw__range_fn fn, void *arg) {
    if (threads > CW__PAR_MAX_THREADS) threads = CW__PAR_MAX_THREADS;
    if (threads > n) threads = (int)n;
    if (threads <= 1) {
        if (n > 0) fn(arg, 0, n);
        return;
    }
    par_part parts[CW__PAR_MAX_THREADS];
    pthread_t th[CW__PAR_MAX_THREADS];
    int started[CW__PAR_MAX_THREADS] = {0};
    for (int i = 0; i < threads; i++) parts[i] = (par_part){fn, arg, n * i / threads, n * (i + 1) / threads};
    for (int i = 1; i < threads; i++) started[i] = pthread_create(&th[i], NULL, par_part_main, &parts[i]) == 0;
    fn(arg, parts[0].lo, parts[0].hi);
    for (int i = 1; i < threads; i++) {
        if (started[i]) pthread_join(th[i], NULL);
        else fn(arg, parts[i].lo, parts[i].hi);
    }
}

/* ---- a team of threads with barriers (conv_winograd.c's phases) --------------------------
 * The helpers are started first and wait on `go`; once the caller knows how many started,
 * it publishes n (so the barrier counts only members that exist) and releases them. */
struct cw__cpu_team {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n, go, arrived;
    unsigned gen;
    cw__team_fn fn;
    void *arg;
};

typedef struct team_member {
    cw__cpu_team *t;
    int rank;
} team_member;

static void *team_main(void *p) {
    team_member *m = p;
    cw__cpu_team *t = m->t;
    pthread_mutex_lock(&t->mu);
    while (!t->go) pthread_cond_wait(&t->cv, &t->mu);
    const int n = t->n;
    pthread_mutex_unlock(&t->mu);
    t->fn(t->arg, t, m->rank, n);
    return NULL;
}

void cw__cpu_team_run(int threads, cw__team_fn fn, void *arg) {
    if (threads > CW__PAR_MAX_THREADS) threads = CW__PAR_MAX_THREADS;
    cw__cpu_team t = {.n = 1, .fn = fn, .arg = arg};
    if (threads <= 1) {
        fn(arg, &t, 0, 1);
        return;
    }
    pthread_mutex_init(&t.mu, NULL);
    pthread_cond_init(&t.cv, NULL);
    pthread_t th[CW__PAR_MAX_THREADS];
    team_member mem[CW__PAR_MAX_THREADS];
    int helpers = 0;
    while (helpers + 1 < threads) {
        mem[helpers] = (team_member){&t, helpers + 1};
        if (pthread_create(&th[helpers], NULL, team_main, &mem[helpers]) != 0) break;
        helpers++;
    }
    pthread_mutex_lock(&t.mu);
    t.n = helpers + 1;
    t.go = 1;
    pthread_cond_broadcast(&t.cv);
    pthread_mutex_unlock(&t.mu);
    fn(arg, &t, 0, helpers + 1);
    for (int i = 0; i < helpers; i++) pthread_join(th[i], NULL);
    pthread_cond_destroy(&t.cv);
    pthread_mutex_destroy(&t.mu);
}

void cw__cpu_team_barrier(cw__cpu_team *t) {
    if (t->n == 1) return;
    pthread_mutex_lock(&t->mu);
    const unsigned gen = t->gen;
    if (++t->arrived == t->n) {
        t->arrived = 0;
        t->gen++;
        pthread_cond_broadcast(&t->cv);
    } else {
        while (gen == t->gen) pthread_cond_wait(&t->cv, &t->mu);
    }
    pthread_mutex_unlock(&t->mu);
}

/* OpenBLAS runs single-threaded for every call convweave makes. Re-checked before each
 * GEMM (a cheap read) in case the application changed the process-wide count. */
static pthread_mutex_t blas_mu = PTHREAD_MUTEX_INITIALIZER;

void cw__cpu_blas_single(void) {
    if (openblas_get_num_threads() == 1) return;
    pthread_mutex_lock(&blas_mu);
    if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
    pthread_mutex_unlock(&blas_mu);
}

/* Column blocks of at least 512 columns (about 2 % of a block's time goes to OpenBLAS
 * re-packing A at k >= 64), at most 16 of them; a GEMM with fewer than 4 column blocks
 * and m >= 256 is also cut into row blocks of at least 128 rows, so attention's
 * [chunk x C] products still split. Multiples of 64 keep OpenBLAS's kernels on full
 * tiles. Only (m, n) enter: never the thread count. */
void cw__cpu_gemm_blocks(int64_t m, int64_t n, int64_t *mb, int64_t *nb) {
    int64_t cb = n / 512;
    if (cb < 1) cb = 1;
    if (cb > 16) cb = 16;
    int64_t w = (n + cb - 1) / cb;
    w = (w + 63) / 64 * 64;
    *nb = w < n ? w : n;
    int64_t cols = (n + *nb - 1) / *nb, rb = 1;
    if (cols < 4 && m >= 256) {
        rb = (4 + cols - 1) / cols;
        if (rb > m / 128) rb = m / 128;
        if (rb < 1) rb = 1;
    }
    int64_t h = (m + rb - 1) / rb;
    h = (h + 63) / 64 * 64;
    *mb = h < m ? h : m;
}

typedef struct gemm_grid {
    const cw__gemm_params *p;
    int64_t mb, nb, cols; /* block extents and column blocks per block row */
} gemm_grid;

static void gemm_block_range(void *arg, int64_t lo, int64_t hi) {
    const gemm_grid *g = arg;
    const cw__gemm_params *p = g->p;
    for (int64_t b = lo; b < hi; b++) {
        int64_t i0 = b / g->cols * g->mb, j0 = b % g->cols * g->nb;
        int64_t mi = p->m - i0 < g->mb ? p->m - i0 : g->mb, nj = p->n - j0 < g->nb ? p->n - j0 : g->nb;
        /* row-major: op(A) rows i0.. are A's rows (no trans) or columns (trans) */
        const float *a = p->a + (p->trans_a ? i0 : i0 * p->lda);
        const float *bm = p->b + (p->trans_b ? j0 * p->ldb : j0);
        cw__cpu_gemm1(p->trans_a, p->trans_b, mi, nj, p->k, p->alpha, a, p->lda, bm, p->ldb, p->beta,
                      p->c + i0 * p->ldc + j0, p->ldc);
    }
}

/* One single-threaded product: oneDNN's sgemm, or OpenBLAS's where convweave is built
 * without oneDNN or oneDNN refuses it. */
static void gemm_call(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                      int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
    if (cw__cpu_dnnl_sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)) return;
    cw__cpu_blas_single();
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, (blasint)m,
                (blasint)n, (blasint)k, alpha, a, (blasint)lda, b, (blasint)ldb, beta, c, (blasint)ldc);
}

/* One block (gemm_call). oneDNN copies a B whose leading dimension is a multiple of 1024 floats
 * (4 KiB) into a buffer it allocates per call, once A has enough rows (128 x 128 x 512 it
 * copies, 32 x 464 x 512 not; probed with ldb 512, 768, 1024, 3072, 4000, 4096): a 1x1 conv's
 * patch (ldb = rows x W) and attention's keys and scores (ldb = tokens). glibc's raised mmap
 * threshold then kept about 10 MiB of those buffers (SD decoder at its least total: 573 against
 * 562 MiB peak RSS, the same with MALLOC_MMAP_THRESHOLD_=131072). So from 64 rows such a B is
 * copied here instead, in column chunks of at most 1008 columns and BPACK floats, into a stack
 * buffer whose leading dimension (the chunk's width) is no multiple of 1024; the chunks depend
 * on the shape only. */
enum { BPACK = 1 << 16 }; /* floats: 256 KiB */

static void gemm_block(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                       int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
    if (ldb % 1024 != 0 || m < 64 || k > BPACK / 16) {
        gemm_call(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        return;
    }
    float bp[BPACK];
    const int64_t w = BPACK / k / 16 * 16 < 1008 ? BPACK / k / 16 * 16 : 1008;
    for (int64_t j0 = 0; j0 < n; j0 += w) {
        const int64_t wj = n - j0 < w ? n - j0 : w;
        for (int64_t l = 0; l < k; l++) /* op(B)[l][j0 + j] into bp[l][j] */
            for (int64_t j = 0; j < wj; j++) bp[l * wj + j] = trans_b ? b[(j0 + j) * ldb + l] : b[l * ldb + j0 + j];
        gemm_call(trans_a, 0, m, wj, k, alpha, a, lda, bp, wj, beta, c + j0, ldc);
    }
}

void cw__cpu_gemm1(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                   int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
    /* oneDNN packs a B of 2^18 floats (1 MiB) or more, and a transposed A of 4 MiB, into
     * buffers it allocates per call (SD decoder: attention's products at 4096 tokens), and
     * glibc keeps such freed buffers resident in each thread's arena (12.5 MiB more working
     * memory, measured). So a larger product is cut into calls whose A block (MC x KC) and
     * B block (KC x NC) stay under 2^18 floats, the k blocks of one C block accumulated in
     * order (beta, then 1): the cut depends on (m, n, k) only. A B block with a leading
     * dimension oneDNN would copy is copied by gemm_block instead, onto the stack. OpenBLAS
     * runs only where convweave is built without oneDNN (or oneDNN refuses a block): its
     * DYNAMIC_ARCH picks kernels by CPU model, and 0.3.21 falls back to its SSE3 (Prescott)
     * kernels on models it does not know (Emerald Rapids: 24 GFLOP/s single-threaded against
     * oneDNN's 110-140, bench/bench_gemm.c), where oneDNN dispatches on the instruction set. */
    const int64_t most = (int64_t)1 << 18; /* floats */
    if (!cw__cpu_dnnl_compiled() || m == 0 || n == 0 || k == 0) {
        gemm_call(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        return;
    }
    const int64_t kc = k * 64 <= most ? k : 512; /* one k block unless a 64-wide block passes 2^18 */
    const int64_t mc = m * kc <= most ? m : most / kc / 16 * 16, nc = n * kc < most ? n : (most - 1) / kc / 16 * 16;
    for (int64_t i0 = 0; i0 < m; i0 += mc) {
        const int64_t mi = m - i0 < mc ? m - i0 : mc;
        for (int64_t j0 = 0; j0 < n; j0 += nc) {
            const int64_t nj = n - j0 < nc ? n - j0 : nc;
            for (int64_t k0 = 0; k0 < k; k0 += kc) {
                /* row-major: a non-transposed operand's rows are its first index */
                const float *ab = trans_a ? a + k0 * lda + i0 : a + i0 * lda + k0;
                const float *bb = trans_b ? b + j0 * ldb + k0 : b + k0 * ldb + j0;
                const int64_t kk = k - k0 < kc ? k - k0 : kc;
                const float bt = k0 == 0 ? beta : 1.0f;
                gemm_block(trans_a, trans_b, mi, nj, kk, alpha, ab, lda, bb, ldb, bt, c + i0 * ldc + j0, ldc);
            }
        }
    }
}

void cw__cpu_sgemm(const cw__gemm_params *p, int threads) {
    if (p->m == 0 || p->n == 0) return;
    /* helper threads cost ~50 us to start: not for GEMMs under ~4 MFLOP (~0.1 ms) */
    if (2.0 * (double)p->m * (double)p->n * (double)p->k < 4e6) threads = 1;
    cw__cpu_blas_single();
    gemm_grid g = {p, 0, 0, 0};
    cw__cpu_gemm_blocks(p->m, p->n, &g.mb, &g.nb);
    g.cols = (p->n + g.nb - 1) / g.nb;
    int64_t blocks = (p->m + g.mb - 1) / g.mb * g.cols;
    cw__cpu_parallel(threads, blocks, gemm_block_range, &g);
}
