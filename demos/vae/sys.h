/* What the system allows cw-vae's readers: input files opened only when they are regular
 * files (a FIFO's open would block, /dev/zero never ends), and the memory a job may use. */
#ifndef CWVAE_SYS_H
#define CWVAE_SYS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

/* Opens path read-only when it is a regular file: stat first (nothing is opened for a FIFO,
 * a device or a folder), then open with O_NONBLOCK and check again with fstat (the path
 * may have been replaced in between). Fills *sb. Returns the fd (O_NONBLOCK cleared), or -1
 * with "PATH: is a FIFO, not a regular file" (or the open's error) in err. */
int sys_open_regular(const char *path, struct stat *sb, char *err, size_t errlen);

/* Bytes of memory a new allocation may still get: the machine's physical memory, a
 * container's cgroup limit and the address space left under RLIMIT_AS (ulimit -v), the
 * least of them. */
int64_t sys_memory_available(void);

/* Bytes of address space left under RLIMIT_AS (ulimit -v), or INT64_MAX when unlimited. */
int64_t sys_address_space_left(void);

/* Writes s into buf (len bytes) with control bytes and backslashes escaped as \n, \t, \\
 * and \xHH (UTF-8 kept), so a path with a newline prints on one line. Returns buf. */
const char *sys_escape(char *buf, size_t len, const char *s);

#endif
