/* Scratch files for tests: see tests/testfiles.h. Linked into every test. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testfiles.h"

static char cw_tmpdir[256];

const char *cw_test_tmpdir(const char *prefix) {
    if (!cw_tmpdir[0]) {
        snprintf(cw_tmpdir, sizeof cw_tmpdir, "/tmp/%sXXXXXX", prefix);
        if (!mkdtemp(cw_tmpdir)) {
            perror("mkdtemp");
            exit(1);
        }
    }
    return cw_tmpdir;
}

const char *cw_test_path(const char *name) {
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", cw_tmpdir, name);
    return buf[k];
}

uint8_t *cw_test_slurp(const char *path, size_t *len) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    uint8_t *b = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (!b || fread(b, 1, (size_t)n, fp) != (size_t)n) {
        fclose(fp);
        free(b);
        return NULL;
    }
    fclose(fp);
    *len = (size_t)n;
    return b;
}

void cw_test_rm_tree(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char p[1024];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        struct stat sb;
        if (lstat(p, &sb) == 0 && S_ISDIR(sb.st_mode)) cw_test_rm_tree(p);
        else unlink(p);
    }
    closedir(d);
    rmdir(dir);
}
