#include "support/file_store.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Keys hold '/': each byte outside [A-Za-z0-9.-] becomes _XX, so names cannot collide. */
static int path_of(const file_store *fs, const char *key, char *path, size_t len)
{
    size_t n = (size_t)snprintf(path, len, "%s/k.", fs->dir);
    for (const unsigned char *k = (const unsigned char *)key; *k; k++) {
        if (n + 4 >= len) return -1;
        if ((*k >= 'a' && *k <= 'z') || (*k >= 'A' && *k <= 'Z') || (*k >= '0' && *k <= '9') ||
            *k == '.' || *k == '-')
            path[n++] = (char)*k;
        else n += (size_t)snprintf(path + n, len - n, "_%02X", *k);
    }
    path[n] = '\0';
    return 0;
}

static sumo_result store_set(void *ctx, const char *key, const void *value, size_t bytes)
{
    file_store *fs = ctx;
    char path[1024], tmp[1100];
    if (path_of(fs, key, path, sizeof path) != 0) return SUMO_ERR_INVALID_ARGUMENT;
    snprintf(tmp, sizeof tmp, "%s/tmp.%d", fs->dir, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return SUMO_ERR_SYSTEM;
    bool ok = write(fd, value, bytes) == (ssize_t)bytes;
    ok = close(fd) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        return SUMO_ERR_SYSTEM;
    }
    return SUMO_SUCCESS;
}

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static sumo_result store_get(void *ctx, const char *key, void *value, size_t *bytes,
                             int64_t deadline_ns)
{
    file_store *fs = ctx;
    char path[1024];
    if (path_of(fs, key, path, sizeof path) != 0) return SUMO_ERR_INVALID_ARGUMENT;
    for (;;) {
        int fd = fs->never ? -1 : open(path, O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            unsigned char buf[4096];
            ssize_t n = read(fd, buf, sizeof buf);
            close(fd);
            if (n < 0) return SUMO_ERR_SYSTEM;
            memcpy(value, buf, (size_t)n < *bytes ? (size_t)n : *bytes);
            *bytes = (size_t)n;
            return SUMO_SUCCESS;
        }
        int64_t left = deadline_ns - now_ns();
        if (left <= 0) return SUMO_ERR_TIMEOUT;
        struct timespec nap = {0, left < 1000000 ? left : 1000000};
        nanosleep(&nap, NULL);
    }
}

int file_store_init(file_store *fs, const char *dir)
{
    memset(fs, 0, sizeof *fs);
    if (strlen(dir) >= sizeof fs->dir) return -1;
    strcpy(fs->dir, dir);
    fs->store = (sumo_store){.struct_size = sizeof fs->store, .ctx = fs, .set = store_set,
                             .get = store_get};
    return 0;
}
