/*
 * sumo_store_create_dir: the store of sumo_shm.h in a directory. Each key is one file; a value
 * is written to a temporary file and renamed into place, so a reader sees a whole value or
 * none, and a get polls for the file until its deadline (the meeting reads a few keys once, so
 * polling every millisecond costs nothing that matters).
 *
 * The folder is checked once (this user's, nobody else's to read or write) and opened then;
 * every file operation after goes through that handle, never the path again, so a folder
 * swapped for a link after the check (where its parent is writable by others) changes nothing.
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
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef struct dir_store {
    sumo_store store; /* first: the handle callers hold is &store */
    int dfd;          /* the folder as checked */
    char dir[];
} dir_store;

/* Keys hold '/': each byte outside [A-Za-z0-9.-] becomes _XX, so two keys never share a name,
 * and a "k." in front keeps them apart from the temporary files. */
static bool path_of(const char *key, char *path, size_t len)
{
    if (len < 3) return false;
    size_t n = (size_t)snprintf(path, len, "k.");
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

/* A temporary file of its own in the folder: a fresh random name, created, never followed. */
static int make_temporary(const dir_store *s, char name[32])
{
    for (int attempt = 0; attempt < 16; attempt++) {
        uint64_t salt = 0;
        if (getrandom(&salt, sizeof salt, GRND_NONBLOCK) != (ssize_t)sizeof salt)
            salt = (uint64_t)sumo__now_ns() * 0x9e3779b97f4a7c15ull + (uint64_t)attempt;
        snprintf(name, 32, ".tmp.%016llx", (unsigned long long)salt);
        int fd = openat(s->dfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd >= 0 || errno != EEXIST) return fd;
    }
    return -1;
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
    char path[4096], tmp[32];
    if (!key || (!value && bytes) || !path_of(key, path, sizeof path)) return SUMO_ERR_INVALID_ARGUMENT;
    int fd = make_temporary(s, tmp);
    if (fd < 0) return SUMO_ERR_SYSTEM;
    bool ok = write_all(fd, value, bytes);
    ok = close(fd) == 0 && ok;
    if (!ok || renameat(s->dfd, tmp, s->dfd, path) != 0) {
        unlinkat(s->dfd, tmp, 0);
        return SUMO_ERR_SYSTEM;
    }
    return SUMO_SUCCESS;
}

/* The value goes to a temporary file as in dir_set, then link() puts it in place only where no
 * file is: link never replaces, so of two writers exactly one succeeds. */
static sumo_result dir_set_once(void *ctx, const char *key, const void *value, size_t bytes)
{
    const dir_store *s = ctx;
    char path[4096], tmp[32];
    if (!key || (!value && bytes) || !path_of(key, path, sizeof path)) return SUMO_ERR_INVALID_ARGUMENT;
    int fd = make_temporary(s, tmp);
    if (fd < 0) return SUMO_ERR_SYSTEM;
    bool ok = write_all(fd, value, bytes);
    ok = close(fd) == 0 && ok;
    int linked = ok ? linkat(s->dfd, tmp, s->dfd, path, 0) : -1;
    bool there = linked == 0 || (ok && errno == EEXIST);
    unlinkat(s->dfd, tmp, 0);
    return there ? SUMO_SUCCESS : SUMO_ERR_SYSTEM;
}

static sumo_result dir_remove(void *ctx, const char *key)
{
    const dir_store *s = ctx;
    char path[4096];
    if (!key || !path_of(key, path, sizeof path)) return SUMO_ERR_INVALID_ARGUMENT;
    return unlinkat(s->dfd, path, 0) == 0 || errno == ENOENT ? SUMO_SUCCESS : SUMO_ERR_SYSTEM;
}

static sumo_result dir_get(void *ctx, const char *key, void *value, size_t *bytes, int64_t deadline_ns)
{
    const dir_store *s = ctx;
    char path[4096];
    if (!key || !bytes || (!value && *bytes) || !path_of(key, path, sizeof path))
        return SUMO_ERR_INVALID_ARGUMENT;
    for (;;) {
        /* Non-blocking and regular only: a FIFO planted at a key would block the read past
         * any deadline. */
        int fd = openat(s->dfd, path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        if (fd >= 0) {
            struct stat st;
            if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
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
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0) return errno == ELOOP || errno == ENOTDIR ? SUMO_ERR_INVALID_ARGUMENT : SUMO_ERR_SYSTEM;
    struct stat st;
    /* Whoever can write here can answer a meeting with a segment of theirs. */
    if (fstat(dfd, &st) != 0 || st.st_uid != geteuid() || (st.st_mode & 077) != 0) {
        close(dfd);
        return SUMO_ERR_INVALID_ARGUMENT;
    }
    size_t len = strlen(dir);
    dir_store *s = malloc(sizeof *s + len + 1);
    if (!s) {
        close(dfd);
        return SUMO_ERR_SYSTEM;
    }
    s->dfd = dfd;
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
        int lfd = dup(s->dfd);
        DIR *d = lfd >= 0 ? fdopendir(lfd) : NULL;
        if (d) {
            const struct dirent *e;
            while ((e = readdir(d)) != NULL) {
                /* Only what a store writes: anything else a user put there stays, and so
                 * does the directory. */
                if (strncmp(e->d_name, "k.", 2) != 0 && strncmp(e->d_name, ".tmp.", 5) != 0) continue;
                if (unlinkat(s->dfd, e->d_name, 0) != 0 && errno != ENOENT) r = SUMO_ERR_SYSTEM;
            }
            closedir(d);
            /* By path, the only way to remove a folder; rmdir removes nothing but an empty
             * folder, whatever stands at the path now. */
            if (rmdir(s->dir) != 0 && errno != ENOENT && errno != ENOTEMPTY && errno != EEXIST &&
                errno != ENOTDIR)
                r = SUMO_ERR_SYSTEM;
        } else {
            if (lfd >= 0) close(lfd);
            r = SUMO_ERR_SYSTEM;
        }
    }
    close(s->dfd);
    free(s);
    return r;
}
