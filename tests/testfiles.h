/* Scratch files for tests (tests/support_files.c): a private temporary directory removed
 * at the end, paths inside it, whole-file reads. */
#ifndef CW_TESTFILES_H
#define CW_TESTFILES_H

#include <stddef.h>
#include <stdint.h>

/* Creates /tmp/<prefix>XXXXXX on the first call and returns its path (later calls return
 * the same directory whatever their prefix). */
const char *cw_test_tmpdir(const char *prefix);
/* "<tmpdir>/<name>" in one of 4 rotating buffers (so a few can be alive at once). */
const char *cw_test_path(const char *name);
/* The whole file (malloc'd, *len bytes), or NULL when it cannot be opened. */
uint8_t *cw_test_slurp(const char *path, size_t *len);
/* Removes a directory tree (the temporary directory at the end of a test). */
void cw_test_rm_tree(const char *dir);

#endif
