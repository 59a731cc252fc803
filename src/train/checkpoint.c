#include "train/checkpoint.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#define CKPT_MAGIC "SUMOCKPT"
#define CKPT_VERSION 1u

typedef struct ckpt_header {
    char magic[8];
    uint32_t version;
    int32_t rank, size;
    uint32_t crc;      /* of the payload */
    int64_t step;
    uint64_t config_hash;
    uint64_t bytes;    /* payload bytes after the header */
} ckpt_header;

static void rank_path(const sumo__ckpt_id *id, long step, char *out, size_t len)
{
    snprintf(out, len, "%s/step-%ld.rank-%d.ckpt", id->dir, step, id->rank);
}

static void fault_point(long step)
{
    /* Fault injection for the crash-during-save test: die with the temporary file half
     * written, exactly what a power cut or a kill -9 would leave. */
    const char *v = getenv("SUMO_FAULT_EXIT_DURING_SAVE");
    if (v && atol(v) == step) _exit(86);
}

static sumo_result write_all(int fd, const void *data, size_t bytes)
{
    const unsigned char *p = data;
    while (bytes > 0) {
        ssize_t w = write(fd, p, bytes);
        if (w < 0) {
            if (errno == EINTR) continue;
            return SUMO_ERR_SYSTEM;
        }
        p += w;
        bytes -= (size_t)w;
    }
    return SUMO_SUCCESS;
}

static sumo_result write_atomic_parts(const char *path, const void *a, size_t abytes, const void *b,
                                      size_t bbytes, long fault_step, char *err, size_t errlen)
{
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        snprintf(err, errlen, "%s: cannot create: %s", tmp, strerror(errno));
        return SUMO_ERR_SYSTEM;
    }
    sumo_result r = write_all(fd, a, abytes);
    if (r == SUMO_SUCCESS && bbytes > 0) {
        size_t half = bbytes / 2;
        r = write_all(fd, b, half);
        if (fault_step >= 0) fault_point(fault_step);
        if (r == SUMO_SUCCESS) r = write_all(fd, (const unsigned char *)b + half, bbytes - half);
    }
    if (r == SUMO_SUCCESS && fsync(fd) != 0) r = SUMO_ERR_SYSTEM;
    int saved = errno;
    if (close(fd) != 0 && r == SUMO_SUCCESS) r = SUMO_ERR_SYSTEM;
    if (r == SUMO_SUCCESS && rename(tmp, path) != 0) r = SUMO_ERR_SYSTEM;
    if (r != SUMO_SUCCESS) {
        snprintf(err, errlen, "%s: cannot write: %s", path, strerror(saved ? saved : errno));
        unlink(tmp);
        return r;
    }
    /* The rename is durable only once the folder's entry is. */
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    int dfd = open(dirname(dir), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    return SUMO_SUCCESS;
}

sumo_result sumo__write_file_atomic(const char *path, const void *data, size_t bytes, char *err,
                                    size_t errlen)
{
    return write_atomic_parts(path, data, bytes, NULL, 0, -1, err, errlen);
}

static uint32_t payload_crc(const void *payload, size_t bytes)
{
    /* zlib's crc32 takes uInt lengths: feed large payloads in pieces. */
    uLong crc = crc32(0L, Z_NULL, 0);
    for (size_t off = 0; off < bytes;) {
        size_t piece = bytes - off > (1u << 30) ? (1u << 30) : bytes - off;
        crc = crc32(crc, (const Bytef *)payload + off, (uInt)piece);
        off += piece;
    }
    return (uint32_t)crc;
}

sumo_result sumo__checkpoint_write_rank(const sumo__ckpt_id *id, const void *payload, size_t bytes,
                                        char *err, size_t errlen)
{
    if (mkdir(id->dir, 0755) != 0 && errno != EEXIST) {
        snprintf(err, errlen, "%s: cannot create the checkpoint folder: %s", id->dir, strerror(errno));
        return SUMO_ERR_SYSTEM;
    }
    ckpt_header h = {.version = CKPT_VERSION, .rank = id->rank, .size = id->size,
                     .crc = payload_crc(payload, bytes), .step = id->step,
                     .config_hash = id->config_hash, .bytes = bytes};
    memcpy(h.magic, CKPT_MAGIC, 8);
    char path[4096];
    rank_path(id, id->step, path, sizeof path);
    return write_atomic_parts(path, &h, sizeof h, payload, bytes, id->step, err, errlen);
}

sumo_result sumo__checkpoint_read_rank(const sumo__ckpt_id *id, void **payload, size_t *bytes,
                                       char *err, size_t errlen)
{
    char path[4096];
    rank_path(id, id->step, path, sizeof path);
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return SUMO_ERR_SYSTEM;
    }
    ckpt_header h;
    sumo_result r = SUMO_ERR_INVALID_ARGUMENT;
    void *data = NULL;
    struct stat st;
    if (fread(&h, sizeof h, 1, f) != 1) {
        snprintf(err, errlen, "%s: truncated header", path);
    } else if (memcmp(h.magic, CKPT_MAGIC, 8) != 0 || h.version != CKPT_VERSION) {
        snprintf(err, errlen, "%s: not a sumo checkpoint (bad magic or version)", path);
    } else if (h.rank != id->rank || h.size != id->size || h.step != id->step) {
        snprintf(err, errlen, "%s: written by rank %d of %d at step %lld, expected rank %d of %d at step %ld",
                 path, h.rank, h.size, (long long)h.step, id->rank, id->size, id->step);
    } else if (h.config_hash != id->config_hash) {
        snprintf(err, errlen, "%s: written with another configuration (flags differ from the run being resumed)", path);
    } else if (fstat(fileno(f), &st) != 0 || (uint64_t)st.st_size != sizeof h + h.bytes) {
        snprintf(err, errlen, "%s: truncated or padded (%lld bytes, header says %llu)", path,
                 (long long)st.st_size, (unsigned long long)(sizeof h + h.bytes));
    } else if ((data = malloc(h.bytes ? h.bytes : 1)) == NULL) {
        snprintf(err, errlen, "%s: out of memory", path);
        r = SUMO_ERR_SYSTEM;
    } else if (h.bytes && fread(data, h.bytes, 1, f) != 1) {
        snprintf(err, errlen, "%s: truncated payload", path);
    } else if (payload_crc(data, h.bytes) != h.crc) {
        snprintf(err, errlen, "%s: corrupt (CRC mismatch)", path);
    } else {
        r = SUMO_SUCCESS;
    }
    fclose(f);
    if (r != SUMO_SUCCESS) {
        free(data);
        return r;
    }
    *payload = data;
    *bytes = h.bytes;
    return SUMO_SUCCESS;
}

sumo_result sumo__checkpoint_write_manifest(const sumo__ckpt_id *id, char *err, size_t errlen)
{
    char path[4096], text[256];
    snprintf(path, sizeof path, "%s/latest", id->dir);
    int len = snprintf(text, sizeof text, "sumo-checkpoint 1 step %ld ranks %d config %016llx\n",
                       id->step, id->size, (unsigned long long)id->config_hash);
    return sumo__write_file_atomic(path, text, (size_t)len, err, errlen);
}

sumo_result sumo__checkpoint_read_manifest(const sumo__ckpt_id *id, long *step, char *err,
                                           size_t errlen)
{
    char path[4096], text[256] = {0};
    snprintf(path, sizeof path, "%s/latest", id->dir);
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        snprintf(err, errlen, "%s: no checkpoint to resume from (%s)", path, strerror(errno));
        return SUMO_ERR_INVALID_USAGE;
    }
    size_t got = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[got] = '\0';
    long s;
    int ranks;
    unsigned long long hash;
    if (sscanf(text, "sumo-checkpoint 1 step %ld ranks %d config %llx", &s, &ranks, &hash) != 3 || s < 0) {
        snprintf(err, errlen, "%s: corrupt manifest", path);
        return SUMO_ERR_INVALID_ARGUMENT;
    }
    if (ranks != id->size || hash != id->config_hash) {
        snprintf(err, errlen, "%s: checkpoint of %d ranks with configuration %016llx; this run has %d ranks and %016llx",
                 path, ranks, hash, id->size, (unsigned long long)id->config_hash);
        return SUMO_ERR_INVALID_ARGUMENT;
    }
    *step = s;
    return SUMO_SUCCESS;
}

void sumo__checkpoint_remove_rank(const sumo__ckpt_id *id)
{
    char path[4096];
    rank_path(id, id->step, path, sizeof path);
    unlink(path);
}
