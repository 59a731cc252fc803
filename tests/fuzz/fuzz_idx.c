/*
 * libFuzzer harness for the IDX reader (src/train/idx.c), plain and gzipped.
 *
 * Input: one mode byte, a 4-byte little-endian length L, then L bytes of the images file and
 * the rest as the labels file. Mode bit 0 gzips the images before the reader sees them, bit 1
 * the labels, so mutations of the plain bytes also go through zlib's inflate path; the gzip
 * seeds in the corpus cover damaged streams. The files live in memory (memfd), so no disk
 * traffic slows the fuzzer down.
 */
#include "train/idx.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <zlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Writes bytes (gzipped when asked) into a fresh memfd; its /proc path goes to path. */
static int memfile(const uint8_t *bytes, size_t n, int gzip, char *path, size_t len)
{
    int fd = memfd_create("idx", MFD_CLOEXEC);
    if (fd < 0) return -1;
    snprintf(path, len, "/proc/self/fd/%d", fd);
    if (gzip) {
        gzFile g = gzopen(path, "wb");
        if (g == NULL) {
            close(fd);
            return -1;
        }
        if (n) gzwrite(g, bytes, (unsigned)n);
        gzclose(g);
    } else if (n && write(fd, bytes, n) != (ssize_t)n) {
        close(fd);
        return -1;
    }
    return fd;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 5 || size > (1u << 20)) return 0;
    uint8_t mode = data[0];
    uint32_t l;
    memcpy(&l, data + 1, 4);
    data += 5;
    size -= 5;
    if (l > size) l = (uint32_t)size;
    char ipath[64], lpath[64];
    int ifd = memfile(data, l, mode & 1, ipath, sizeof ipath);
    int lfd = memfile(data + l, size - l, mode & 2, lpath, sizeof lpath);
    if (ifd >= 0 && lfd >= 0) {
        sumo__dataset ds;
        char err[512];
        if (sumo__dataset_load_files(ipath, lpath, &ds, err, sizeof err) == SUMO_SUCCESS) {
            /* Whatever was accepted must be what the header promised. Zero items is a valid
             * (empty) dataset; the trainer refuses it with a message of its own. */
            if (ds.rows < 1 || ds.cols < 1 || (ds.n > 0 && ds.images == NULL)) __builtin_trap();
            for (size_t i = 0; i < ds.n; i++)
                if (ds.labels[i] >= SUMO__IDX_CLASSES) __builtin_trap();
            sumo__dataset_free(&ds);
        } else if (strlen(err) == 0) {
            __builtin_trap(); /* every refusal says why */
        }
    }
    if (ifd >= 0) close(ifd);
    if (lfd >= 0) close(lfd);
    return 0;
}
