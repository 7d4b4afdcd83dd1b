/* Status strings for every code, version, and config validation (size/version/fields). */
#include <string.h>

#include "convweave/convweave.h"
#include "testutil.h"

static int g_logged;
static void capture(void *u, cw_log_level l, const char *m) {
    (void)u;
    (void)l;
    if (strstr(m, "streams")) g_logged++;
}

int main(void) {
    /* Every code from the X-macro has a distinct name and string. */
    const char *names[CW_STATUS_COUNT__];
    for (int s = 0; s < CW_STATUS_COUNT__; s++) {
        names[s] = cw_status_name((cw_status)s);
        const char *str = cw_status_string((cw_status)s);
        ASSERT_TRUE(strncmp(names[s], "CW_", 3) == 0);
        ASSERT_TRUE(strcmp(names[s], "CW_UNKNOWN") != 0);
        ASSERT_TRUE(strcmp(str, "unknown status") != 0 && str[0] != '\0');
        for (int t = 0; t < s; t++) ASSERT_TRUE(strcmp(names[s], names[t]) != 0);
    }
    ASSERT_TRUE(strcmp(cw_status_name(CW_OK), "CW_OK") == 0);
    ASSERT_TRUE(strcmp(cw_status_name(CW_ERR_BUDGET), "CW_ERR_BUDGET") == 0);
    ASSERT_EQ_I(CW_OK, 0);
    ASSERT_TRUE(strcmp(cw_status_string((cw_status)999), "unknown status") == 0);
    ASSERT_TRUE(strcmp(cw_status_name((cw_status)-1), "CW_UNKNOWN") == 0);
    ASSERT_EQ_I(cw_version(), CW_VERSION_NUMBER);
    ASSERT_TRUE(strlen(cw_version_string()) >= 5);

    /* Versioned config: wrong size or version is refused, nothing created. */
    cw_context *ctx = (cw_context *)&ctx; /* must be reset to NULL on failure */
    cw_context_config c = CW_CONTEXT_CONFIG_INIT;
    c.backend = CW_BACKEND_CPU;
    c.size = sizeof c - 8;
    ASSERT_STATUS(cw_context_create(&ctx, &c), CW_ERR_INVALID_ARG);
    ASSERT_TRUE(ctx == NULL);
    c.size = sizeof c;
    c.version = CW_CONTEXT_CONFIG_VERSION + 1;
    ASSERT_STATUS(cw_context_create(&ctx, &c), CW_ERR_INVALID_ARG);
    c.version = CW_CONTEXT_CONFIG_VERSION;
    c.streams = 0;
    c.log_fn = capture;
    ASSERT_STATUS(cw_context_create(&ctx, &c), CW_ERR_INVALID_ARG);
    ASSERT_EQ_I(g_logged, 1); /* the message named the field, through the callback */
    c.streams = 2;
    c.backend = (cw_backend_kind)7;
    ASSERT_STATUS(cw_context_create(&ctx, &c), CW_ERR_INVALID_ARG);
    c.backend = CW_BACKEND_CPU;
    ASSERT_OK(cw_context_create(&ctx, &c));
    ASSERT_TRUE(strcmp(cw_context_get_backend_name(ctx), "cpu") == 0);
    ASSERT_TRUE(strcmp(cw_context_get_last_error(ctx), "") == 0);

    /* Tensor argument errors name the field. */
    cw_tensor_desc d;
    int64_t dims[2] = {3, 0};
    ASSERT_STATUS(cw_tensor_desc_make(&d, CW_F32, 2, dims), CW_ERR_INVALID_ARG);
    dims[1] = 4;
    ASSERT_OK(cw_tensor_desc_make(&d, CW_F32, 2, dims));
    ASSERT_EQ_I(d.strides[0], 4);
    d.dims[1] = -1;
    cw_tensor *t = NULL;
    ASSERT_STATUS(cw_tensor_create(&t, ctx, &d), CW_ERR_INVALID_ARG);
    ASSERT_TRUE(strstr(cw_context_get_last_error(ctx), "dims[1]") != NULL);
    d.dims[1] = 4;
    ASSERT_OK_CTX(ctx, cw_tensor_create(&t, ctx, &d));
    float h[12], back[12];
    for (int i = 0; i < 12; i++) h[i] = (float)i * 0.5f;
    ASSERT_STATUS(cw_tensor_upload(t, h, 11 * sizeof(float)), CW_ERR_INVALID_ARG);
    ASSERT_TRUE(strstr(cw_context_get_last_error(ctx), "bytes") != NULL);
    ASSERT_OK_CTX(ctx, cw_tensor_upload(t, h, sizeof h));
    ASSERT_OK_CTX(ctx, cw_tensor_download(t, back, sizeof back));
    ASSERT_TRUE(memcmp(h, back, sizeof h) == 0);
    cw_tensor_destroy(t);
    cw_tensor_destroy(NULL);
    cw_context_destroy(ctx);
    cw_context_destroy(NULL);
    printf("status strings, config and tensor checks passed\n");
    TEST_DONE();
}
