/*
 * sumo_store_create_dir: the store of sumo_shm.h in a directory. Each key is one file; a value
 * is written to a temporary file and renamed into place, so a reader sees a whole value or
 * none, and a get polls for the file until its deadline (the meeting reads a few keys once, so
 * polling every millisecond costs nothing that matters).
 */
#include "common/common.h"

#include "sumo_shm.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef struct dir_store {
    sumo_store store; /* first: the handle callers hold is &store */
    char dir[];
} dir_store;

/* Keys hold '/': each byte outside [A-Za-z0-9.-] becomes _XX, so two keys never share a name,
 * and a "k." in front keeps them apart from the temporary files. */
static bool path_of(const dir_store *s, const char *key, char *path, size_t len)
{
    int head = snprintf(path, len, "%s/k.", s->dir);
    if (head < 0 || (size_t)head >= len) return false;
    size_t n = (size_t)head;
    for (const unsigned char *k = (const unsigned char *)key; *k; k++) {
        if (n + 4 >= len) return false;
        if ((*k >= 'a' && *k <= 'z') || (*k >= 'A' && *k <= 'Z') || (*k >= '0' && *k <= '9') ||
            *k == '.' || *k == '-')
            path[n++] = (char)*k;
        else n += (size_t)snprintf(path + n, len - n, "_%02X", *k);
    }
    path[n] = '\0';
    return true;
}

static bool write_all(int fd, const void *value, size_t bytes)
{
    const unsigned char *p = value;
    size_t left = bytes;
    while (left > 0) {
        ssize_t w = write(fd, p, left);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break;
        p += w;
        left -= (size_t)w;
    }
    return left == 0;
}

static sumo_result dir_set(void *ctx, const char *key, const void *value, size_t bytes)
{
    const dir_store *s = ctx;
    char path[4096], tmp[4096];
    if (!key || (!value && bytes) || !path_of(s, key, path, sizeof path)) return SUMO_ERR_INVALID_ARGUMENT;
    if ((size_t)snprintf(tmp, sizeof tmp, "%s/.tmp.XXXXXX", s->dir) >= sizeof tmp) return SUMO_ERR_INVALID_ARGUMENT;
    int fd = mkstemp(tmp); /* 0600, and a name no other thread or process picks */
    if (fd < 0) return SUMO_ERR_SYSTEM;
    bool ok = write_all(fd, value, bytes);
    ok = close(fd) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        return SUMO_ERR_SYSTEM;
    }
    return SUMO_SUCCESS;
}

/* The value goes to a temporary file as in dir_set, then link() puts it in place only where no
 * file is: link never replaces, so of two writers exactly one succeeds. */
static sumo_result dir_set_once(void *ctx, const char *key, const void *value, size_t bytes)
{
    const dir_store *s = ctx;
    char path[4096], tmp[4096];
    if (!key || (!value && bytes) || !path_of(s, key, path, sizeof path)) return SUMO_ERR_INVALID_ARGUMENT;
    if ((size_t)snprintf(tmp, sizeof tmp, "%s/.tmp.XXXXXX", s->dir) >= sizeof tmp) return SUMO_ERR_INVALID_ARGUMENT;
    int fd = mkstemp(tmp);
    if (fd < 0) return SUMO_ERR_SYSTEM;
    bool ok = write_all(fd, value, bytes);
    ok = close(fd) == 0 && ok;
    int linked = ok ? link(tmp, path) : -1;
    bool there = linked == 0 || (ok && errno == EEXIST);
    unlink(tmp);
    return there ? SUMO_SUCCESS : SUMO_ERR_SYSTEM;
}

static sumo_result dir_remove(void *ctx, const char *key)
{
    const dir_store *s = ctx;
    char path[4096];
    if (!key || !path_of(s, key, path, sizeof path)) return SUMO_ERR_INVALID_ARGUMENT;
    return unlink(path) == 0 || errno == ENOENT ? SUMO_SUCCESS : SUMO_ERR_SYSTEM;
}

static sumo_result dir_get(void *ctx, const char *key, void *value, size_t *bytes, int64_t deadline_ns)
{
    const dir_store *s = ctx;
    char path[4096];
    if (!key || !bytes || (!value && *bytes) || !path_of(s, key, path, sizeof path))
        return SUMO_ERR_INVALID_ARGUMENT;
    for (;;) {
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            struct stat st;
            if (fstat(fd, &st) != 0) {
                close(fd);
                return SUMO_ERR_SYSTEM;
            }
            size_t want = (size_t)st.st_size < *bytes ? (size_t)st.st_size : *bytes, got = 0;
            while (got < want) {
                ssize_t r = read(fd, (unsigned char *)value + got, want - got);
                if (r < 0 && errno == EINTR) continue;
                if (r <= 0) break;
                got += (size_t)r;
            }
            close(fd);
            if (got < want) return SUMO_ERR_SYSTEM;
            *bytes = (size_t)st.st_size;
            return SUMO_SUCCESS;
        }
        if (errno != ENOENT) return SUMO_ERR_SYSTEM;
        int64_t left = deadline_ns - sumo__now_ns();
        if (left <= 0) return SUMO_ERR_TIMEOUT;
        struct timespec nap = {0, left < 1000000 ? (long)left : 1000000L};
        nanosleep(&nap, NULL);
    }
}

sumo_result sumo_store_create_dir(const char *dir, sumo_store **out)
{
    if (out) *out = NULL;
    if (!dir || !out || !dir[0] || strlen(dir) > 3000) return SUMO_ERR_INVALID_ARGUMENT;
    /* Every rank may be the first: mkdir is the one that creates, the others find it. */
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) return SUMO_ERR_SYSTEM;
    struct stat st;
    if (lstat(dir, &st) != 0) return SUMO_ERR_SYSTEM;
    /* Whoever can write here can answer a meeting with a segment of theirs. */
    if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077) != 0)
        return SUMO_ERR_INVALID_ARGUMENT;
    size_t len = strlen(dir);
    dir_store *s = malloc(sizeof *s + len + 1);
    if (!s) return SUMO_ERR_SYSTEM;
    memcpy(s->dir, dir, len + 1);
    s->store = (sumo_store){.struct_size = sizeof s->store, .ctx = s, .set = dir_set, .get = dir_get,
                            .set_once = dir_set_once, .remove = dir_remove};
    *out = &s->store;
    return SUMO_SUCCESS;
}

sumo_result sumo_store_destroy_dir(sumo_store *store, int remove_files)
{
    if (!store) return SUMO_SUCCESS;
    if (store->set != dir_set || store->ctx != (void *)store) return SUMO_ERR_INVALID_ARGUMENT;
    dir_store *s = (dir_store *)store;
    sumo_result r = SUMO_SUCCESS;
    if (remove_files) {
        DIR *d = opendir(s->dir);
        if (d) {
            const struct dirent *e;
            char path[4096];
            while ((e = readdir(d)) != NULL) {
                /* Only what a store writes: anything else a user put there stays, and so
                 * does the directory. */
                if (strncmp(e->d_name, "k.", 2) != 0 && strncmp(e->d_name, ".tmp.", 5) != 0) continue;
                if ((size_t)snprintf(path, sizeof path, "%s/%s", s->dir, e->d_name) >= sizeof path) continue;
                if (unlink(path) != 0 && errno != ENOENT) r = SUMO_ERR_SYSTEM;
            }
            closedir(d);
            if (rmdir(s->dir) != 0 && errno != ENOENT && errno != ENOTEMPTY && errno != EEXIST)
                r = SUMO_ERR_SYSTEM;
        } else if (errno != ENOENT) {
            r = SUMO_ERR_SYSTEM;
        }
    }
    free(s);
    return r;
}
