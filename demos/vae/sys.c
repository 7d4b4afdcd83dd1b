/* What the system allows cw-vae's readers: regular input files opened without blocking,
 * the memory left (machine, cgroup, ulimit -v), and paths escaped for one-line messages. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "sys.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

static const char *kind_of(mode_t m) {
    return S_ISFIFO(m) ? "a FIFO" : S_ISDIR(m) ? "a folder" : S_ISCHR(m) ? "a character device"
         : S_ISBLK(m) ? "a block device" : S_ISSOCK(m) ? "a socket" : "not a file";
}

static int err_to(char *err, size_t errlen, const char *fmt, const char *a, const char *b) {
    if (err && errlen) snprintf(err, errlen, fmt, a, b);
    return -1;
}

int sys_open_regular(const char *path, struct stat *sb, char *err, size_t errlen) {
    const char *p = path; /* the CLI prints messages escaped (sys_escape) */
    if (stat(path, sb) != 0) return err_to(err, errlen, "%s: cannot open: %s", p, strerror(errno));
    if (!S_ISREG(sb->st_mode)) return err_to(err, errlen, "%s: is %s, not a regular file", p, kind_of(sb->st_mode));
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) return err_to(err, errlen, "%s: cannot open: %s", p, strerror(errno));
    if (fstat(fd, sb) != 0 || !S_ISREG(sb->st_mode)) {
        close(fd);
        return err_to(err, errlen, "%s: is %s, not a regular file", p, kind_of(sb->st_mode));
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    return fd;
}

/* VmSize of this process, bytes (-1 unknown). */
static int64_t vm_size(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    int64_t v = -1;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "VmSize:", 7)) {
            v = strtoll(line + 7, NULL, 10) * 1024;
            break;
        }
    fclose(f);
    return v;
}

int64_t sys_address_space_left(void) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_AS, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > (rlim_t)INT64_MAX)
        return INT64_MAX;
    int64_t used = vm_size();
    int64_t left = (int64_t)rl.rlim_cur - (used > 0 ? used : 0);
    return left > 0 ? left : 0;
}

int64_t sys_memory_available(void) {
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGE_SIZE);
    int64_t m = pages > 0 && psz > 0 ? (int64_t)pages * psz : INT64_MAX;
    FILE *f = fopen("/sys/fs/cgroup/memory.max", "r"); /* a container's limit */
    if (f) {
        long long v;
        if (fscanf(f, "%lld", &v) == 1 && v > 0 && v < m) m = v;
        fclose(f);
    }
    int64_t as = sys_address_space_left();
    return as < m ? as : m;
}

const char *sys_escape(char *buf, size_t len, const char *s) {
    size_t o = 0;
    if (!len) return buf;
    for (; s && *s && o + 5 < len; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '\n') o += (size_t)snprintf(buf + o, len - o, "\\n");
        else if (c == '\t') o += (size_t)snprintf(buf + o, len - o, "\\t");
        else if (c == '\\') o += (size_t)snprintf(buf + o, len - o, "\\\\");
        else if (c < 0x20 || c == 0x7f) o += (size_t)snprintf(buf + o, len - o, "\\x%02x", c);
        else buf[o++] = (char)c;
    }
    buf[o] = '\0';
    return buf;
}
