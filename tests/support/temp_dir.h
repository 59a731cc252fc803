/*
 * Test folders: a fresh one under TMPDIR (mkdtemp(3)'s convention), for a dir store or the
 * ranks' logs, and its removal with the files in it. Shared by the unit tests and test_cuda,
 * so it asserts nothing: the caller says what a failure means in its own framework.
 */
#ifndef SUMO_TEST_TEMP_DIR_H
#define SUMO_TEST_TEMP_DIR_H

#include <dirent.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* dir (len bytes) = TMPDIR/sumo-<what>-test.XXXXXX, made; false when it could not be. */
static inline bool make_temp_dir(char *dir, size_t len, const char *what)
{
    const char *base = getenv("TMPDIR");
    int n = snprintf(dir, len, "%s/sumo-%s-test.XXXXXX", base && *base ? base : "/tmp", what);
    return n > 0 && (size_t)n < len && mkdtemp(dir) != NULL;
}

/* Removes dir and the files in it (a test's folders hold no subfolders). */
static inline void remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (d == NULL) return;
    char path[512];
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(d);
    rmdir(dir);
}

#endif
