/* NVTX3 is header-only: with no tool injected (NVTX_INJECTION64_PATH / Nsight), each call
 * costs a branch. The domain and category names are registered once. */
#include "prof/nvtx.h"

#include "convweave/convweave.h"

/* Index stage + 1: category 0 is the whole run. */
static const char *const cw__cat_names[CW_STAGE_COUNT + 1] = {"run",   "conv",      "prep", "epilogue",
                                                              "stats", "attention", "other"};

const char *cw__stage_name(int stage) {
    return stage >= -1 && stage < CW_STAGE_COUNT ? cw__cat_names[stage + 1] : "unknown";
}

#ifdef CW_HAVE_NVTX
#include <nvtx3/nvToolsExt.h>
#include <pthread.h>

static nvtxDomainHandle_t cw__domain;
static pthread_once_t cw__once = PTHREAD_ONCE_INIT;
static const uint32_t cw__colors[] = {0xff1f77b4u, 0xffff7f0eu, 0xff2ca02cu, 0xffd62728u,
                                      0xff9467bdu, 0xff8c564bu, 0xffe377c2u, 0xff7f7f7fu};

static void cw__nvtx_init(void) {
    cw__domain = nvtxDomainCreateA("convweave");
    for (uint32_t i = 0; i < sizeof cw__cat_names / sizeof *cw__cat_names; i++)
        nvtxDomainNameCategoryA(cw__domain, i + 1, cw__cat_names[i]);
}

void cw__nvtx_push(const char *name, int category, int stream) {
    pthread_once(&cw__once, cw__nvtx_init);
    nvtxEventAttributes_t a = {0};
    a.version = NVTX_VERSION;
    a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    a.category = (uint32_t)category + 1;
    a.colorType = NVTX_COLOR_ARGB;
    a.color = cw__colors[(unsigned)stream % 8u];
    a.messageType = NVTX_MESSAGE_TYPE_ASCII;
    a.message.ascii = name;
    nvtxDomainRangePushEx(cw__domain, &a);
}

void cw__nvtx_pop(void) {
    pthread_once(&cw__once, cw__nvtx_init);
    nvtxDomainRangePop(cw__domain);
}

int cw__nvtx_compiled(void) { return 1; }
#else
void cw__nvtx_push(const char *name, int category, int stream) {
    (void)name, (void)category, (void)stream;
}
void cw__nvtx_pop(void) {}
int cw__nvtx_compiled(void) { return 0; }
#endif
