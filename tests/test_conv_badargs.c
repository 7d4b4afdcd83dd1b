/* Convolution argument validation: a table of invalid convolutions, each must return
 * CW_ERR_INVALID_ARG with a message naming the offending field; valid ones pass and give
 * the right output shape; the view-overlap helper on touching/overlapping spans. */
#include "scheduler/planner.h"
#include "testutil.h"

typedef struct conv_args {
    cw_tensor_desc x, w, b, y;
    cw_conv_params p;
    int use_b, use_y;
} conv_args;

static void desc(cw_tensor_desc *d, cw_dtype dt, int rank, const int64_t *dims) {
    memset(d, 0, sizeof *d);
    d->dtype = dt;
    d->rank = rank;
    for (int i = 0; i < rank && i < CW_MAX_RANK; i++) d->dims[i] = dims[i];
}

/* x [1, 32, 64, 64], w [32, 32, 3, 3], b [32], y [1, 32, 64, 64], pad 1: valid. */
static conv_args base(void) {
    conv_args a;
    memset(&a, 0, sizeof a);
    desc(&a.x, CW_F32, 4, (int64_t[]){1, 32, 64, 64});
    desc(&a.w, CW_F32, 4, (int64_t[]){32, 32, 3, 3});
    desc(&a.b, CW_F32, 1, (int64_t[]){32});
    desc(&a.y, CW_F32, 4, (int64_t[]){1, 32, 64, 64});
    cw_conv_params p = CW_CONV_PARAMS_INIT;
    p.pad_pre[0] = p.pad_pre[1] = p.pad_post[0] = p.pad_post[1] = 1;
    a.p = p;
    a.use_b = a.use_y = 1;
    return a;
}

typedef struct bad_case {
    const char *what;
    void (*mutate)(conv_args *);
    const char *field; /* substring the message must contain */
    const char *also;  /* a second one (value/shape), or NULL */
} bad_case;

#define MUT(name, body) static void name(conv_args *a) { body; }
MUT(m_size, a->p.size = 8)
MUT(m_version, a->p.version = 99)
MUT(m_spatial, a->p.spatial = 4)
MUT(m_spatial_rank, a->p.spatial = 3)
MUT(m_rank6, a->x.rank = 6)
MUT(m_rank0, a->x.rank = 0)
MUT(m_wrank, desc(&a->w, CW_F32, 5, (int64_t[]){32, 32, 3, 3, 3}))
MUT(m_groups3, a->p.groups = 3)
MUT(m_groups0, a->p.groups = 0)
MUT(m_groups_neg, a->p.groups = -2)
MUT(m_kgroups, { a->p.groups = 2; desc(&a->w, CW_F32, 4, (int64_t[]){33, 16, 3, 3}); })
MUT(m_wc, desc(&a->w, CW_F32, 4, (int64_t[]){32, 16, 3, 3}))
MUT(m_wc_groups, { a->p.groups = 4; desc(&a->w, CW_F32, 4, (int64_t[]){32, 16, 3, 3}); })
MUT(m_kernel_big, { desc(&a->x, CW_F32, 4, (int64_t[]){1, 32, 2, 2}); desc(&a->w, CW_F32, 4, (int64_t[]){32, 32, 5, 5}); })
MUT(m_kernel_dil, { desc(&a->x, CW_F32, 4, (int64_t[]){1, 32, 4, 4}); a->p.dilation[1] = 3;
                    a->p.pad_pre[1] = a->p.pad_post[1] = 0; })
MUT(m_stride0, a->p.stride[0] = 0)
MUT(m_stride_neg, a->p.stride[1] = -1)
MUT(m_dil0, a->p.dilation[0] = 0)
MUT(m_pad_pre, a->p.pad_pre[1] = -1)
MUT(m_pad_post, a->p.pad_post[0] = -2)
MUT(m_wdtype, a->w.dtype = CW_F16)
MUT(m_xdtype_bad, a->x.dtype = (cw_dtype)9)
MUT(m_bshape, desc(&a->b, CW_F32, 1, (int64_t[]){16}))
MUT(m_brank, desc(&a->b, CW_F32, 2, (int64_t[]){1, 32}))
MUT(m_bdtype, a->b.dtype = CW_BF16)
MUT(m_ydims, desc(&a->y, CW_F32, 4, (int64_t[]){1, 32, 62, 62}))
MUT(m_ych, desc(&a->y, CW_F32, 4, (int64_t[]){1, 16, 64, 64}))
MUT(m_yrank, desc(&a->y, CW_F32, 5, (int64_t[]){1, 32, 1, 64, 64}))
MUT(m_ydtype, a->y.dtype = CW_F16)
MUT(m_xdim0, a->x.dims[2] = 0)
MUT(m_wdim_neg, a->w.dims[3] = -3)
MUT(m_ystride0, { a->y.strides[0] = 32 * 64 * 64; a->y.strides[1] = 0; a->y.strides[2] = 64; a->y.strides[3] = 1; })
MUT(m_xstride_neg, { a->x.strides[0] = 1; a->x.strides[1] = -4096; a->x.strides[2] = 64; a->x.strides[3] = 1; })
MUT(m_huge_dims, a->x.dims[3] = INT64_C(1) << 50)
MUT(m_huge_numel, { a->x.dims[0] = INT64_C(1) << 30; a->x.dims[2] = INT64_C(1) << 30; a->use_y = 0; })
MUT(m_dil_overflow, { a->p.dilation[0] = INT64_C(1) << 39; a->w.dims[2] = INT64_C(1) << 39;
                      a->w.dims[0] = a->w.dims[1] = a->w.dims[3] = 1; a->x.dims[1] = 1; })
MUT(m_3d_rank, { a->p.spatial = 3; desc(&a->x, CW_F32, 5, (int64_t[]){1, 32, 8, 8, 8});
                 desc(&a->y, CW_F32, 5, (int64_t[]){1, 32, 8, 8, 8}); })
MUT(m_3d_pad, { a->p.spatial = 3; desc(&a->x, CW_F32, 5, (int64_t[]){1, 32, 8, 8, 8});
                desc(&a->w, CW_F32, 5, (int64_t[]){32, 32, 3, 3, 3}); desc(&a->y, CW_F32, 5, (int64_t[]){1, 32, 8, 8, 8});
                a->p.pad_pre[2] = -1; })
MUT(m_3d_ydepth, { a->p.spatial = 3; desc(&a->x, CW_F32, 5, (int64_t[]){1, 32, 8, 8, 8});
                   desc(&a->w, CW_F32, 5, (int64_t[]){32, 32, 3, 3, 3});
                   desc(&a->y, CW_F32, 5, (int64_t[]){1, 32, 6, 8, 8}); a->p.pad_pre[2] = a->p.pad_post[2] = 1; })

static const bad_case cases[] = {
    {"params.size wrong", m_size, "params.size", "8"},
    {"params.version wrong", m_version, "params.version", "99"},
    {"spatial 4", m_spatial, "params.spatial", "4"},
    {"spatial 3 with rank-4 x", m_spatial_rank, "x.rank", "spatial=3"},
    {"rank 6", m_rank6, "x.rank", "6"},
    {"rank 0", m_rank0, "x.rank", "0"},
    {"w rank 5 for 2-D", m_wrank, "w.rank", "5"},
    {"groups does not divide C", m_groups3, "groups=3", "C=32"},
    {"groups 0", m_groups0, "groups", "0"},
    {"groups negative", m_groups_neg, "groups", "-2"},
    {"groups does not divide K", m_kgroups, "output channels K=33", "groups=2"},
    {"w.dims[1] != C", m_wc, "w.dims[1]=16", "C=32"},
    {"w.dims[1]*groups != C", m_wc_groups, "w.dims[1]=16", "groups=4"},
    {"kernel larger than padded input", m_kernel_big, "effective kernel 5", "x.dims[2]=2"},
    {"dilated kernel larger than input", m_kernel_dil, "dilation[1]=3", "effective kernel 7"},
    {"stride 0", m_stride0, "stride[0]", "0"},
    {"stride negative", m_stride_neg, "stride[1]", "-1"},
    {"dilation 0", m_dil0, "dilation[0]", "0"},
    {"pad_pre negative", m_pad_pre, "pad_pre[1]", "-1"},
    {"pad_post negative", m_pad_post, "pad_post[0]", "-2"},
    {"w dtype differs", m_wdtype, "w.dtype", "f16"},
    {"x dtype unknown", m_xdtype_bad, "x.dtype", "9"},
    {"bias [16] for K=32", m_bshape, "b.dims", "[16]"},
    {"bias rank 2", m_brank, "b.dims", "[1, 32]"},
    {"bias dtype", m_bdtype, "b.dtype", "bf16"},
    {"y dims wrong", m_ydims, "y.dims[2]=62", "expected 64"},
    {"y channels wrong", m_ych, "y.dims[1]=16", "expected 32"},
    {"y rank wrong", m_yrank, "y.rank", "5"},
    {"y dtype", m_ydtype, "y.dtype", "f16"},
    {"x dim 0", m_xdim0, "x.dims[2]", "0"},
    {"w dim negative", m_wdim_neg, "w.dims[3]", "-3"},
    {"y broadcast stride", m_ystride0, "y.strides[1]=0", NULL},
    {"x negative stride", m_xstride_neg, "x.strides[1]", "-4096"},
    {"x dim 2^50", m_huge_dims, "x.dims[3]", NULL},
    {"x numel overflow", m_huge_numel, "x", "too many elements"},
    {"dilation * kernel overflow", m_dil_overflow, "dilation", NULL},
    {"3-D with 2-D w", m_3d_rank, "w.rank", "3"},
    {"3-D negative pad", m_3d_pad, "pad_pre[2]", "-1"},
    {"3-D y depth", m_3d_ydepth, "y.dims[2]=6", "expected 8"},
};

static cw_status validate(cw_context *ctx, const conv_args *a, cw_tensor_desc *yo) {
    return cw__conv_validate(ctx, &a->x, &a->w, a->use_b ? &a->b : NULL, a->use_y ? &a->y : NULL, &a->p, yo);
}

int main(void) {
    cw_context_config cfg = CW_CONTEXT_CONFIG_INIT;
    cfg.backend = CW_BACKEND_CPU;
    cw_context *ctx = NULL;
    ASSERT_OK(cw_context_create(&ctx, &cfg));

    /* valid ones */
    conv_args a = base();
    cw_tensor_desc yo;
    ASSERT_OK_CTX(ctx, validate(ctx, &a, &yo));
    CHECK(yo.rank == 4 && yo.dims[0] == 1 && yo.dims[1] == 32 && yo.dims[2] == 64 && yo.dims[3] == 64);
    {   /* depthwise 3-D, stride 2, asymmetric pad, dilation: [1, 6, 5, 9, 7] -> [1, 12, 3, 4, 3] */
        conv_args d = base();
        d.p.spatial = 3;
        d.p.groups = 6;
        d.p.stride[0] = d.p.stride[1] = d.p.stride[2] = 2;
        d.p.dilation[2] = 2;
        d.p.pad_pre[0] = 1, d.p.pad_post[0] = 0, d.p.pad_pre[1] = 0, d.p.pad_post[1] = 1, d.p.pad_pre[2] = 2,
        d.p.pad_post[2] = 0;
        desc(&d.x, CW_F32, 5, (int64_t[]){1, 6, 5, 9, 7});
        desc(&d.w, CW_F32, 5, (int64_t[]){12, 1, 3, 3, 3});
        desc(&d.b, CW_F32, 1, (int64_t[]){12});
        d.use_y = 0;
        ASSERT_OK_CTX(ctx, validate(ctx, &d, &yo));
        /* D: (5+1-3)/2+1 = 2, H: (9+1-3)/2+1 = 4, W: (7+2-5)/2+1 = 3 */
        CHECK(yo.rank == 5 && yo.dims[1] == 12 && yo.dims[2] == 2 && yo.dims[3] == 4 && yo.dims[4] == 3);
        d.y = yo;
        d.use_y = 1;
        ASSERT_OK_CTX(ctx, validate(ctx, &d, NULL));
        cw_tensor_desc y2;
        ASSERT_OK_CTX(ctx, cw_conv_output_desc(ctx, &y2, &d.x, &d.w, &d.p));
        CHECK(memcmp(&y2, &yo, sizeof yo) == 0);
    }
    {   /* a strided y (channel slice of a [1, 48, 64, 64] tensor) is fine */
        conv_args s = base();
        s.y.strides[0] = 48 * 64 * 64, s.y.strides[1] = 64 * 64, s.y.strides[2] = 64, s.y.strides[3] = 1;
        ASSERT_OK_CTX(ctx, validate(ctx, &s, NULL));
    }
    ASSERT_STATUS(cw_conv_output_desc(ctx, NULL, &a.x, &a.w, &a.p), CW_ERR_INVALID_ARG);
    CHECK(strstr(cw_context_get_last_error(ctx), "cw_conv_output_desc: y (output) is NULL") != NULL);
    ASSERT_STATUS(cw__conv_validate(ctx, &a.x, &a.w, NULL, NULL, NULL, NULL), CW_ERR_INVALID_ARG);
    CHECK(strstr(cw_context_get_last_error(ctx), "params is NULL") != NULL);
    ASSERT_STATUS(cw__conv_validate(ctx, NULL, &a.w, NULL, NULL, &a.p, NULL), CW_ERR_INVALID_ARG);
    CHECK(strstr(cw_context_get_last_error(ctx), "x descriptor is NULL") != NULL);

    int n = (int)(sizeof cases / sizeof cases[0]);
    for (int i = 0; i < n; i++) {
        conv_args c = base();
        cases[i].mutate(&c);
        cw_status st = validate(ctx, &c, &yo);
        const char *msg = cw_context_get_last_error(ctx);
        int ok = st == CW_ERR_INVALID_ARG && strstr(msg, cases[i].field) &&
                 (!cases[i].also || strstr(msg, cases[i].also));
        if (!ok) {
            fprintf(stderr, "case '%s': got %s \"%s\", expected CW_ERR_INVALID_ARG naming \"%s\"%s%s\n", cases[i].what,
                    cw_status_name(st), msg, cases[i].field, cases[i].also ? " and " : "",
                    cases[i].also ? cases[i].also : "");
            cw_test_failures++;
        }
        /* the public output-shape call rejects the same parameter errors (it has no y/b) */
        if (c.use_y && strncmp(cases[i].field, "y", 1) != 0 && strncmp(cases[i].field, "b", 1) != 0) {
            cw_tensor_desc y2;
            CHECK(cw_conv_output_desc(ctx, &y2, &c.x, &c.w, &c.p) == CW_ERR_INVALID_ARG);
        }
    }
    /* the example message from the spec */
    {
        conv_args c = base();
        c.p.groups = 3;
        ASSERT_STATUS(validate(ctx, &c, NULL), CW_ERR_INVALID_ARG);
        CHECK(strcmp(cw_context_get_last_error(ctx),
                     "conv: groups=3 does not divide input channels C=32 (x: [1, 32, 64, 64])") == 0);
    }
    fprintf(stderr, "%d invalid convolutions rejected with a message naming the field\n", n);

    /* overlap of byte spans */
    {
        float buf[1000];
        cw_tensor_desc d10, d20;
        desc(&d10, CW_F32, 1, (int64_t[]){10});
        desc(&d20, CW_F32, 2, (int64_t[]){2, 10});
        CHECK(cw__views_overlap(&d10, buf, &d10, buf));
        CHECK(cw__views_overlap(&d10, buf, &d10, buf + 9));
        CHECK(!cw__views_overlap(&d10, buf, &d10, buf + 10)); /* touching spans do not overlap */
        CHECK(!cw__views_overlap(&d10, buf + 10, &d10, buf));
        CHECK(cw__views_overlap(&d20, buf, &d10, buf + 19));
        CHECK(!cw__views_overlap(&d20, buf, &d10, buf + 20));
        /* a strided view spans to its last element: [2, 10] with row stride 100 covers 110 floats */
        cw_tensor_desc ds = d20;
        ds.strides[0] = 100, ds.strides[1] = 1;
        CHECK(cw__views_overlap(&ds, buf, &d10, buf + 109));
        CHECK(!cw__views_overlap(&ds, buf, &d10, buf + 110));
        CHECK(!cw__views_overlap(&d10, NULL, &d10, buf));
    }
    cw_context_destroy(ctx);
    TEST_DONE();
}
