/* NVTX injection library: load it with NVTX_INJECTION64_PATH=<this .so> and it writes
 * every completed push/pop range (and start/end range) to the file named by env
 * CW_NVTX_RECORD, so tests can check NVTX output without Nsight Systems.
 *
 * Record file: one tab-separated line per event, appended and flushed as it happens:
 *   D <domain>                                       domain created
 *   C <domain> <category id> <category name>         category named
 *   R <tid> <domain> <category id> <depth> <name>    range completed (depth at push, 0 =
 *                                                    outermost open range of that domain on
 *                                                    that thread; -1 for start/end ranges)
 * The default (NULL) domain and the domainless nvtxRangePush / nvtxRangePop calls are
 * recorded under domain "(default)". Without CW_NVTX_RECORD the library declines to
 * attach (NVTX then turns every call into a no-op). Tabs and newlines in names become
 * spaces so a line is always one record. */
/* A tool: NVTX types and callback ids, no NVTX implementation of our own. */
#define NVTX_NO_IMPL
#include <nvtx3/nvToolsExt.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <wchar.h>

#define REC_EXPORT __attribute__((visibility("default")))
#define REC_NAME_MAX 480 /* bytes of a name kept per range (longer names are cut) */

/* ---- domains and registered strings: never freed, so a range may name them to the end.
 * Both live on global lists, which keeps them reachable for leak checkers. */
typedef struct rec_domain {
    struct rec_domain *next;
    char name[];
} rec_domain;

typedef struct rec_string {
    struct rec_string *next;
    char text[];
} rec_string;

static pthread_mutex_t rec_lock = PTHREAD_MUTEX_INITIALIZER; /* guards everything below */
static int rec_fd = -1;
static rec_domain *rec_domains;
static rec_string *rec_strings;

/* start/end ranges: open ones by id (they may end on another thread) */
typedef struct rec_open {
    struct rec_open *next;
    uint64_t id;
    long tid;
    const rec_domain *domain;
    uint32_t category;
    char name[REC_NAME_MAX];
} rec_open;
static rec_open *rec_opens;
static uint64_t rec_next_id = 1;

/* ---- per-thread push/pop stack (heap; registered globally, freed at thread exit) */
typedef struct rec_frame {
    const rec_domain *domain; /* NULL: default domain */
    uint32_t category;
    char name[REC_NAME_MAX];
} rec_frame;

typedef struct rec_stack {
    struct rec_stack *next, *prev;
    long tid;
    int depth, cap;
    rec_frame *frames;
} rec_stack;

static rec_stack *rec_stacks; /* all live threads' stacks (under rec_lock) */
static pthread_key_t rec_key;
static __thread rec_stack *rec_tls;

static long rec_gettid(void) { return (long)syscall(SYS_gettid); }

/* Copies s into dst (at most n-1 bytes), turning tabs and newlines into spaces. */
static void rec_copy(char *dst, size_t n, const char *s) {
    size_t i = 0;
    if (s)
        for (; s[i] && i + 1 < n; i++) dst[i] = (s[i] == '\t' || s[i] == '\n' || s[i] == '\r') ? ' ' : s[i];
    dst[i] = '\0';
}

/* Wide strings: ASCII kept, anything else becomes '?' (records are for tests, not i18n). */
static void rec_copy_w(char *dst, size_t n, const wchar_t *s) {
    size_t i = 0;
    if (s)
        for (; s[i] && i + 1 < n; i++) {
            wchar_t c = s[i];
            dst[i] = (c == L'\t' || c == L'\n' || c == L'\r') ? ' ' : (c > 0 && c < 128) ? (char)c : '?';
        }
    dst[i] = '\0';
}

static const char *rec_domain_name(const rec_domain *d) { return d ? d->name : "(default)"; }

/* Writes one formatted line; one write() per line with O_APPEND keeps lines whole even
 * when several processes share the file. */
static void rec_line(const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    int len = vsnprintf(buf, sizeof buf - 1, fmt, ap);
    va_end(ap);
    if (len < 0) return;
    if ((size_t)len > sizeof buf - 2) len = (int)(sizeof buf - 2); /* cut, keep the newline */
    buf[len++] = '\n';
    pthread_mutex_lock(&rec_lock);
    for (int off = 0; rec_fd >= 0 && off < len;) {
        ssize_t w = write(rec_fd, buf + off, (size_t)(len - off));
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break; /* disk full etc.: drop the record, never crash the app */
        off += (int)w;
    }
    pthread_mutex_unlock(&rec_lock);
}

/* The message of an event as text. */
static void rec_message(char *dst, size_t n, const nvtxEventAttributes_t *a) {
    dst[0] = '\0';
    if (!a) return;
    switch (a->messageType) {
    case NVTX_MESSAGE_TYPE_ASCII: rec_copy(dst, n, a->message.ascii); break;
    case NVTX_MESSAGE_TYPE_UNICODE: rec_copy_w(dst, n, a->message.unicode); break;
    case NVTX_MESSAGE_TYPE_REGISTERED:
        /* our RegisterString handles point at a rec_string's text */
        rec_copy(dst, n, a->message.registered ? (const char *)a->message.registered : NULL);
        break;
    default: break;
    }
}

static void rec_thread_exit(void *arg) {
    rec_stack *s = arg;
    pthread_mutex_lock(&rec_lock);
    if (s->prev) s->prev->next = s->next;
    else rec_stacks = s->next;
    if (s->next) s->next->prev = s->prev;
    pthread_mutex_unlock(&rec_lock);
    free(s->frames);
    free(s);
}

static rec_stack *rec_stack_get(void) {
    if (rec_tls) return rec_tls;
    rec_stack *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->tid = rec_gettid();
    pthread_mutex_lock(&rec_lock);
    s->next = rec_stacks;
    if (rec_stacks) rec_stacks->prev = s;
    rec_stacks = s;
    pthread_mutex_unlock(&rec_lock);
    pthread_setspecific(rec_key, s);
    rec_tls = s;
    return s;
}

/* ---- handlers ------------------------------------------------------------------------ */
static int rec_push(const rec_domain *d, uint32_t category, const char *ascii, const nvtxEventAttributes_t *a) {
    rec_stack *s = rec_stack_get();
    if (!s) return -1;
    if (s->depth == s->cap) {
        int cap = s->cap ? s->cap * 2 : 16;
        rec_frame *f = realloc(s->frames, (size_t)cap * sizeof *f);
        if (!f) return -1;
        s->frames = f, s->cap = cap;
    }
    rec_frame *f = &s->frames[s->depth];
    f->domain = d;
    f->category = category;
    if (a) rec_message(f->name, sizeof f->name, a);
    else rec_copy(f->name, sizeof f->name, ascii);
    int level = 0; /* open ranges of the same domain below this one */
    for (int i = 0; i < s->depth; i++) level += s->frames[i].domain == d;
    s->depth++;
    return level;
}

/* Pops the innermost open range of domain d on this thread; returns its level or -1. */
static int rec_pop(const rec_domain *d) {
    rec_stack *s = rec_tls;
    if (!s) return -1;
    int i = s->depth - 1;
    while (i >= 0 && s->frames[i].domain != d) i--;
    if (i < 0) return -1; /* unbalanced pop: ignored, as NVTX tools do */
    int level = 0;
    for (int j = 0; j < i; j++) level += s->frames[j].domain == d;
    rec_frame f = s->frames[i];
    memmove(&s->frames[i], &s->frames[i + 1], (size_t)(s->depth - 1 - i) * sizeof *s->frames);
    s->depth--;
    rec_line("R\t%ld\t%s\t%u\t%d\t%s", s->tid, rec_domain_name(f.domain), f.category, level, f.name);
    return level;
}

static nvtxDomainHandle_t rec_domain_create(const char *name) {
    size_t len = strnlen(name ? name : "", REC_NAME_MAX - 1);
    rec_domain *d = malloc(sizeof *d + len + 1);
    if (!d) return NULL;
    rec_copy(d->name, len + 1, name ? name : "");
    pthread_mutex_lock(&rec_lock);
    d->next = rec_domains;
    rec_domains = d;
    pthread_mutex_unlock(&rec_lock);
    rec_line("D\t%s", d->name);
    return (nvtxDomainHandle_t)d; /* opaque to the app */
}

static nvtxDomainHandle_t NVTX_API rec_DomainCreateA(const char *name) { return rec_domain_create(name); }

static nvtxDomainHandle_t NVTX_API rec_DomainCreateW(const wchar_t *name) {
    char buf[REC_NAME_MAX];
    rec_copy_w(buf, sizeof buf, name);
    return rec_domain_create(buf);
}

/* Domains stay allocated: ranges of a destroyed domain may still be open. */
static void NVTX_API rec_DomainDestroy(nvtxDomainHandle_t domain) { (void)domain; }

static void rec_name_category(const rec_domain *d, uint32_t category, const char *name) {
    char buf[REC_NAME_MAX];
    rec_copy(buf, sizeof buf, name);
    rec_line("C\t%s\t%u\t%s", rec_domain_name(d), category, buf);
}

static void NVTX_API rec_DomainNameCategoryA(nvtxDomainHandle_t domain, uint32_t category, const char *name) {
    rec_name_category((const rec_domain *)domain, category, name);
}

static void NVTX_API rec_DomainNameCategoryW(nvtxDomainHandle_t domain, uint32_t category, const wchar_t *name) {
    char buf[REC_NAME_MAX];
    rec_copy_w(buf, sizeof buf, name);
    rec_name_category((const rec_domain *)domain, category, buf);
}

static nvtxStringHandle_t rec_register(const char *text) {
    size_t len = strnlen(text ? text : "", REC_NAME_MAX - 1);
    rec_string *s = malloc(sizeof *s + len + 1);
    if (!s) return NULL;
    rec_copy(s->text, len + 1, text ? text : "");
    pthread_mutex_lock(&rec_lock);
    s->next = rec_strings;
    rec_strings = s;
    pthread_mutex_unlock(&rec_lock);
    return (nvtxStringHandle_t)s->text;
}

static nvtxStringHandle_t NVTX_API rec_DomainRegisterStringA(nvtxDomainHandle_t domain, const char *text) {
    (void)domain;
    return rec_register(text);
}

static nvtxStringHandle_t NVTX_API rec_DomainRegisterStringW(nvtxDomainHandle_t domain, const wchar_t *text) {
    (void)domain;
    char buf[REC_NAME_MAX];
    rec_copy_w(buf, sizeof buf, text);
    return rec_register(buf);
}

static int NVTX_API rec_DomainRangePushEx(nvtxDomainHandle_t domain, const nvtxEventAttributes_t *a) {
    return rec_push((const rec_domain *)domain, a ? a->category : 0, NULL, a);
}

static int NVTX_API rec_DomainRangePop(nvtxDomainHandle_t domain) { return rec_pop((const rec_domain *)domain); }

static nvtxRangeId_t rec_start(const rec_domain *d, const nvtxEventAttributes_t *a, const char *ascii) {
    rec_open *o = malloc(sizeof *o);
    if (!o) return 0;
    o->tid = rec_gettid();
    o->domain = d;
    o->category = a ? a->category : 0;
    if (a) rec_message(o->name, sizeof o->name, a);
    else rec_copy(o->name, sizeof o->name, ascii);
    pthread_mutex_lock(&rec_lock);
    o->id = rec_next_id++;
    o->next = rec_opens;
    rec_opens = o;
    pthread_mutex_unlock(&rec_lock);
    return o->id;
}

static void rec_end(nvtxRangeId_t id) {
    pthread_mutex_lock(&rec_lock);
    rec_open **pp = &rec_opens;
    while (*pp && (*pp)->id != id) pp = &(*pp)->next;
    rec_open *o = *pp;
    if (o) *pp = o->next;
    pthread_mutex_unlock(&rec_lock);
    if (!o) return; /* unknown id: ignored */
    rec_line("R\t%ld\t%s\t%u\t-1\t%s", o->tid, rec_domain_name(o->domain), o->category, o->name);
    free(o);
}

static nvtxRangeId_t NVTX_API rec_DomainRangeStartEx(nvtxDomainHandle_t domain, const nvtxEventAttributes_t *a) {
    return rec_start((const rec_domain *)domain, a, NULL);
}

static void NVTX_API rec_DomainRangeEnd(nvtxDomainHandle_t domain, nvtxRangeId_t id) {
    (void)domain;
    rec_end(id);
}

/* domainless (CORE module) calls: the default domain */
static int NVTX_API rec_RangePushEx(const nvtxEventAttributes_t *a) {
    return rec_push(NULL, a ? a->category : 0, NULL, a);
}
static int NVTX_API rec_RangePushA(const char *name) { return rec_push(NULL, 0, name, NULL); }
static int NVTX_API rec_RangePushW(const wchar_t *name) {
    char buf[REC_NAME_MAX];
    rec_copy_w(buf, sizeof buf, name);
    return rec_push(NULL, 0, buf, NULL);
}
static int NVTX_API rec_RangePop(void) { return rec_pop(NULL); }
static nvtxRangeId_t NVTX_API rec_RangeStartEx(const nvtxEventAttributes_t *a) { return rec_start(NULL, a, NULL); }
static nvtxRangeId_t NVTX_API rec_RangeStartA(const char *name) { return rec_start(NULL, NULL, name); }
static void NVTX_API rec_RangeEnd(nvtxRangeId_t id) { rec_end(id); }
static void NVTX_API rec_NameCategoryA(uint32_t category, const char *name) { rec_name_category(NULL, category, name); }

/* ---- attaching ------------------------------------------------------------------------ */
typedef struct rec_slot {
    unsigned id;
    NvtxFunctionPointer fn;
} rec_slot;

/* Writes each handler into its slot of a module's table: slot i of the table points at
 * the NVTX instance's function pointer for callback id i. Returns 0 when the module is
 * missing or too small. */
static int rec_install(const NvtxExportTableCallbacks *cb, NvtxCallbackModule module, const rec_slot *slots,
                       size_t n) {
    NvtxFunctionTable table = NULL;
    unsigned size = 0;
    if (!cb->GetModuleFunctionTable(module, &table, &size) || !table) return 0;
    /* check every slot first: a half-installed table would call into us after we
     * declined and were unloaded */
    for (size_t i = 0; i < n; i++)
        if (slots[i].id >= size || !table[slots[i].id]) return 0; /* older NVTX without this id */
    for (size_t i = 0; i < n; i++) *table[slots[i].id] = slots[i].fn;
    return 1;
}

#define REC_FN(f) ((NvtxFunctionPointer)(f))

REC_EXPORT int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t getExportTable);

REC_EXPORT int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t getExportTable) {
    const char *path = getenv("CW_NVTX_RECORD");
    if (!path || !*path || !getExportTable) return 0; /* nothing to record: stay detached */
    const NvtxExportTableCallbacks *cb = getExportTable(NVTX_ETID_CALLBACKS);
    if (!cb || cb->struct_size < sizeof *cb || !cb->GetModuleFunctionTable) return 0;
    const NvtxExportTableVersionInfo *vi = getExportTable(NVTX_ETID_VERSIONINFO);
    if (vi && vi->struct_size >= sizeof *vi && vi->SetInjectionNvtxVersion) vi->SetInjectionNvtxVersion(NVTX_VERSION);

    if (pthread_key_create(&rec_key, rec_thread_exit) != 0) return 0;
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) {
        fprintf(stderr, "nvtx_recorder: cannot open CW_NVTX_RECORD='%s': %s\n", path, strerror(errno));
        pthread_key_delete(rec_key);
        return 0;
    }
    pthread_mutex_lock(&rec_lock);
    rec_fd = fd;
    pthread_mutex_unlock(&rec_lock);

    const rec_slot core2[] = {
        {NVTX_CBID_CORE2_DomainRangeStartEx, REC_FN(rec_DomainRangeStartEx)},
        {NVTX_CBID_CORE2_DomainRangeEnd, REC_FN(rec_DomainRangeEnd)},
        {NVTX_CBID_CORE2_DomainRangePushEx, REC_FN(rec_DomainRangePushEx)},
        {NVTX_CBID_CORE2_DomainRangePop, REC_FN(rec_DomainRangePop)},
        {NVTX_CBID_CORE2_DomainNameCategoryA, REC_FN(rec_DomainNameCategoryA)},
        {NVTX_CBID_CORE2_DomainNameCategoryW, REC_FN(rec_DomainNameCategoryW)},
        {NVTX_CBID_CORE2_DomainRegisterStringA, REC_FN(rec_DomainRegisterStringA)},
        {NVTX_CBID_CORE2_DomainRegisterStringW, REC_FN(rec_DomainRegisterStringW)},
        {NVTX_CBID_CORE2_DomainCreateA, REC_FN(rec_DomainCreateA)},
        {NVTX_CBID_CORE2_DomainCreateW, REC_FN(rec_DomainCreateW)},
        {NVTX_CBID_CORE2_DomainDestroy, REC_FN(rec_DomainDestroy)},
    };
    const rec_slot core[] = {
        {NVTX_CBID_CORE_RangeStartEx, REC_FN(rec_RangeStartEx)}, {NVTX_CBID_CORE_RangeStartA, REC_FN(rec_RangeStartA)},
        {NVTX_CBID_CORE_RangeEnd, REC_FN(rec_RangeEnd)},         {NVTX_CBID_CORE_RangePushEx, REC_FN(rec_RangePushEx)},
        {NVTX_CBID_CORE_RangePushA, REC_FN(rec_RangePushA)},     {NVTX_CBID_CORE_RangePushW, REC_FN(rec_RangePushW)},
        {NVTX_CBID_CORE_RangePop, REC_FN(rec_RangePop)},         {NVTX_CBID_CORE_NameCategoryA, REC_FN(rec_NameCategoryA)},
    };
    /* CORE2 (domains) is what convweave uses; without it there is nothing to record. The
     * domainless CORE module is a bonus. Everything not installed stays a no-op. */
    if (!rec_install(cb, NVTX_CB_MODULE_CORE2, core2, sizeof core2 / sizeof *core2)) {
        pthread_mutex_lock(&rec_lock);
        rec_fd = -1;
        pthread_mutex_unlock(&rec_lock);
        close(fd);
        pthread_key_delete(rec_key);
        return 0;
    }
    (void)rec_install(cb, NVTX_CB_MODULE_CORE, core, sizeof core / sizeof *core);
    return 1;
}
