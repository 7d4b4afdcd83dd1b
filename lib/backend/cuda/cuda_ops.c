/* The cuda backend's ops: convolution through the cudnn_*.c layer, the light stages through
 * kernels.cu's launchers, GEMM through cuBLAS. Each hook was checked by ops.c (cw__op_*). */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_internal.h"
#include "kernels/kernels.h"

/* ---- operations ---------------------------------------------------------------------------- */

static cw_status cuda_conv_algos(cw__backend *be, const cw__conv_problem *p, cw__conv_algo *out, int max, int *n) {
    cw__cuda *cb = cw__cb(be);
    CW__ENTER(cb);

    return CW__LEAVE(cb, cw__cudnn_conv_algos(cb->conv, p, out, max, n));
}

static cw_status cuda_conv_forward(cw__backend *be, cw__stream *s, const cw__conv_problem *p,
                                     const cw__conv_algo *algo, const void *x, const void *w, const void *b, void *y,
                                     void *ws, int64_t ws_bytes) {
    cw__cuda *cb = cw__cb(be);
    cw_status st = CW_OK;
    /* Checked by cw__op_conv_forward. A patch whose input rows all lie in the padding
     * (scheduler/planner.h) has no input view and cuDNN takes no empty tensor: its output
     * is the bias alone. */
    int empty = cw__cudnn_empty_input(p);
    cw__view yv = {p->y, y};
    const void *bias = p->has_bias ? b : NULL; /* a constant like w: w's dtype */
    int bias_done = 0;
    CW__ENTER(cb);
    if (empty) {
        CW__CUDA_GOTO(be->ctx, st, done, cw__cu_fill_bias(s->cs, &yv, bias, p->w.dtype));
        bias_done = 1;
    } else {
        /* a bias-fused plan or the packed copy back adds the bias; otherwise one pass here */
        st = cw__cudnn_conv_run(cb->conv, s->cs, p, algo ? algo->id : -1, x, w, bias, y, ws, ws_bytes, &bias_done);
        if (st != CW_OK) goto done;
    }
    if (bias && !bias_done) CW__CUDA_GOTO(be->ctx, st, done, cw__cu_bias_add(s->cs, &yv, bias, p->w.dtype));
done:
    return CW__LEAVE(cb, st);
}

static cw_status cuda_conv_prepare(cw__backend *be, const cw__conv_problem *p, const cw__conv_algo *algo,
                                   int64_t ws_cap, cw__conv_algo *used) {
    cw__cuda *cb = cw__cb(be);
    cw__cudnn_choice ch;
    *used = *algo;
    CW__ENTER(cb);
    cw_status st = cw__cudnn_conv_prepare(cb->conv, p, algo->id, ws_cap, &ch);
    if (st == CW_OK && ch.id != algo->id) {
        /* the substitute conv_forward will run: its name and workspace from the list */
        cw__conv_algo lst[CW__CUDNN_MAX_CFGS];
        int n = 0;
        used->id = ch.id;
        used->workspace = ch.total_ws;
        snprintf(used->name, sizeof used->name, "cudnn algorithm %d", ch.id);
        if (cw__cudnn_conv_algos(cb->conv, p, lst, CW__CUDNN_MAX_CFGS, &n) == CW_OK)
            for (int i = 0; i < n; i++)
                if (lst[i].id == ch.id) *used = lst[i];
        used->workspace = ch.total_ws;
    } else if (st == CW_OK && !cw__cudnn_empty_input(p)) {
        used->workspace = ch.total_ws; /* the plan's own figure */
    }
    return CW__LEAVE(cb, st);
}

static cw_status cuda_conv_autotune(cw__backend *be, const cw__conv_problem *p, const cw__conv_algo *cands, int n,
                                    int *best) {
    cw__cuda *cb = cw__cb(be);
    int ids[CW__CUDNN_MAX_CFGS];
    float ms[CW__CUDNN_MAX_CFGS];
    int64_t syncs = 0;
    if (n > CW__CUDNN_MAX_CFGS) n = CW__CUDNN_MAX_CFGS;
    *best = 0;
    if (!cb->autotune || n == 1) return CW_OK; /* not asked for (CW_FLAG_CUDA_AUTOTUNE): keep the order */
    for (int i = 0; i < n; i++) ids[i] = cands[i].id;
    CW__ENTER(cb);
    cw_status st = cw__cudnn_conv_autotune(cb->conv, cb->copy, p, ids, n, 3, ms, best, &syncs);
    cw__sync_count(cb, syncs);
    if (st == CW_OK)
        for (int i = 0; i < n; i++)
            cw__log(be->ctx, CW_LOG_DEBUG, "cuda autotune: %s: %.3f ms%s", cands[i].name, (double)ms[i],
                    i == *best ? " (fastest)" : "");
    return CW__LEAVE(cb, st);
}

static cw_status cuda_prep(cw__backend *be, cw__stream *s, const cw__prep_params *p) {
    cw__cuda *cb = cw__cb(be);
    cw_context *ctx = be->ctx;
    cw_status st = CW_OK;
    CW__ENTER(cb);
    CW__CUDA_GOTO(ctx, st, done, cw__cu_prep(s->cs, p));
done:
    return CW__LEAVE(cb, st);
}

static cw_status cuda_gn_stats(cw__backend *be, cw__stream *s, const cw__view *x, int64_t groups, double *out) {
    cw__cuda *cb = cw__cb(be);
    cw_status st = CW_OK;
    CW__ENTER(cb);
    CW__CUDA_GOTO(be->ctx, st, done,
                  cw__cu_gn_stats(s->cs, x, groups, out, s->gn_scratch, s->gn_scratch ? CW__CU_GN_SCRATCH_PARTS : 0));
done:
    return CW__LEAVE(cb, st);
}

static cw_status cuda_gn_finalize(cw__backend *be, cw__stream *s, const double *parts, int64_t n_parts, int64_t n,
                                    int64_t c, int64_t groups, const float *gamma, const float *beta, float eps,
                                    float *scale, float *shift) {
    cw__cuda *cb = cw__cb(be);
    cw_status st = CW_OK;
    CW__ENTER(cb);
    CW__CUDA_GOTO(be->ctx, st, done,
                  cw__cu_gn_finalize(s->cs, parts, n_parts, n, c, groups, gamma, beta, eps, scale, shift));
done:
    return CW__LEAVE(cb, st);
}

static cw_status cuda_add(cw__backend *be, cw__stream *s, const cw__view *dst, const cw__view *a, const cw__view *b) {
    cw__cuda *cb = cw__cb(be);
    cw_status st = CW_OK;
    CW__ENTER(cb);
    CW__CUDA_GOTO(be->ctx, st, done, cw__cu_add(s->cs, dst, a, b));
done:
    return CW__LEAVE(cb, st);
}

static cw_status cuda_op(cw__backend *be, cw__stream *s, const cw__op_args *a) {
    cw__cuda *cb = cw__cb(be);
    cw_status st = CW_OK;
    CW__ENTER(cb);
    CW__CUDA_GOTO(be->ctx, st, done, cw__cu_op(s->cs, a));
done:
    return CW__LEAVE(cb, st);
}

/* Row-major C = alpha op(A) op(B) + beta C is column-major C^T = op(B)^T op(A)^T: the same
 * buffers with A and B swapped and m and n swapped. */
static cw_status cuda_gemm(cw__backend *be, cw__stream *s, const cw__gemm_params *p) {
    cw__cuda *cb = cw__cb(be);
    cw_status st = CW_OK;
    CW__ENTER(cb);
    pthread_mutex_lock(&cb->blas_mu);
    CW__CUBLAS_GOTO(be->ctx, st, unlock, cublasSetStream(cb->blas, s->cs));
    /* No cuBLAS workspace: its default pool is outside the temp budget, and a fixed (empty)
     * workspace keeps the kernel choice, hence the bits, independent of the stream. Should
     * this cuBLAS refuse it, its default pool still gives correct results: log, go on. */
    cublasStatus_t ws_st = cublasSetWorkspace(cb->blas, NULL, 0);
    if (ws_st != CUBLAS_STATUS_SUCCESS)
        cw__log(be->ctx, CW_LOG_DEBUG, "cuda gemm: cublasSetWorkspace(NULL, 0): %s; using cuBLAS's default pool",
                cublasGetStatusString(ws_st));
    CW__CUBLAS_GOTO(be->ctx, st, unlock,
                    cublasSgemm_v2_64(cb->blas, p->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                      p->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, p->n, p->m, p->k, &p->alpha, p->b,
                                      p->ldb, p->a, p->lda, &p->beta, p->c, p->ldc));
unlock:
    pthread_mutex_unlock(&cb->blas_mu);
    return CW__LEAVE(cb, st);
}

static cw_status cuda_softmax_rows(cw__backend *be, cw__stream *s, float *x, int64_t rows, int64_t cols,
                                     int64_t ld) {
    cw__cuda *cb = cw__cb(be);
    cw_status st = CW_OK;
    CW__ENTER(cb);
    CW__CUDA_GOTO(be->ctx, st, done, cw__cu_softmax_rows(s->cs, x, rows, cols, ld));
done:
    return CW__LEAVE(cb, st);
}

const cw__ops_i cw__cuda_ops = {
    .conv_algos = cuda_conv_algos,
    .conv_forward = cuda_conv_forward,
    .prep = cuda_prep,
    .gn_stats = cuda_gn_stats,
    .gn_finalize = cuda_gn_finalize,
    .add = cuda_add,
    .op = cuda_op,
    .gemm = cuda_gemm,
    .softmax_rows = cuda_softmax_rows,
    .conv_prepare = cuda_conv_prepare,
    .conv_autotune = cuda_conv_autotune,
};
