/*
 * IDX files through zlib's gz* interface, which passes plain files through unchanged, so one
 * path serves the gzipped Debian files and gunzipped copies.
 */
#include "train/idx.h"

#include "common/common.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

/* Reads are issued in pieces gzread's unsigned length can hold. */
#define IDX_READ_CHUNK ((size_t)1 << 24)
/* First allocation for the data; it doubles as bytes arrive, up to what the header says. */
#define IDX_FIRST_ALLOC ((size_t)1 << 20)

__attribute__((format(printf, 3, 4))) static void set_err(char *err, size_t errlen,
                                                          const char *fmt, ...)
{
    if (err == NULL || errlen == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* strerror is not thread-safe; the GNU strerror_r may return a static string or buf. */
static const char *errno_text(int e, char *buf, size_t len)
{
#if defined(_GNU_SOURCE)
    return strerror_r(e, buf, len);
#else
    if (strerror_r(e, buf, len) != 0) snprintf(buf, len, "error %d", e);
    return buf;
#endif
}

typedef struct idx_file {
    const char *path;
    gzFile f;
    size_t pos; /* bytes delivered so far, for messages */
} idx_file;

/* zlib's gzerror text starts with the path it was opened with; ours is already there. */
static const char *zlib_message(const idx_file *fl, int *zerr)
{
    const char *msg = gzerror(fl->f, zerr);
    if (msg == NULL) return "unknown zlib error";
    size_t plen = strlen(fl->path);
    if (strncmp(msg, fl->path, plen) == 0 && strncmp(msg + plen, ": ", 2) == 0)
        msg += plen + 2;
    return msg;
}

/*
 * Reads up to len bytes; *got says how many arrived. A short read at a clean end of file is
 * not an error here (the caller knows how many it needed); a damaged stream or an I/O error
 * is, and is described in err.
 */
static sumo_result idx_read(idx_file *fl, void *buf, size_t len, size_t *got, char *err,
                            size_t errlen)
{
    size_t done = 0;
    while (done < len) {
        size_t want = SUMO__MIN(len - done, IDX_READ_CHUNK);
        int n = gzread(fl->f, (char *)buf + done, (unsigned)want);
        if (n < 0) {
            int zerr = 0;
            const char *msg = zlib_message(fl, &zerr);
            if (zerr == Z_ERRNO) {
                char eb[128];
                set_err(err, errlen, "%s: read failed: %s", fl->path,
                        errno_text(errno, eb, sizeof eb));
                return SUMO_ERR_SYSTEM;
            }
            if (zerr == Z_MEM_ERROR) {
                set_err(err, errlen, "%s: out of memory while decompressing", fl->path);
                return SUMO_ERR_SYSTEM;
            }
            set_err(err, errlen, "%s: corrupt gzip data near byte %zu: %s", fl->path,
                    fl->pos + done, msg);
            return SUMO_ERR_INVALID_ARGUMENT;
        }
        if (n == 0) {
            /* End of input; a gzip stream cut short also lands here, with zlib noting it. */
            int zerr = 0;
            const char *msg = zlib_message(fl, &zerr);
            if (zerr != Z_OK && zerr != Z_STREAM_END) {
                set_err(err, errlen, "%s: corrupt or truncated gzip data after %zu bytes: %s",
                        fl->path, fl->pos + done, msg);
                return SUMO_ERR_INVALID_ARGUMENT;
            }
            break;
        }
        done += (size_t)n;
    }
    fl->pos += done;
    *got = done;
    return SUMO_SUCCESS;
}

static uint32_t be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

/*
 * One IDX file of unsigned bytes with ndims dimensions: checks the header against the caps,
 * reads exactly the announced data and makes sure nothing follows it. On success *data holds
 * prod(dims) bytes (malloc'd, the caller frees).
 */
static sumo_result idx_load(const char *path, uint32_t magic, int ndims, uint32_t *dims,
                            uint8_t **data, char *err, size_t errlen)
{
    *data = NULL;
    idx_file fl = {path, NULL, 0};
    errno = 0;
    fl.f = gzopen(path, "rb");
    if (fl.f == NULL) {
        char eb[128];
        set_err(err, errlen, "cannot open %s: %s", path,
                errno != 0 ? errno_text(errno, eb, sizeof eb) : "out of memory");
        return SUMO_ERR_SYSTEM;
    }
    gzbuffer(fl.f, 1u << 17);

    sumo_result r;
    uint8_t *buf = NULL;
    unsigned char hdr[4 + 4 * 3];
    size_t hlen = 4 + 4 * (size_t)ndims, got = 0;
    r = idx_read(&fl, hdr, hlen, &got, err, errlen);
    if (r != SUMO_SUCCESS) goto out;
    if (got < 4) {
        set_err(err, errlen, "%s: truncated: %zu bytes, too short for an IDX header", path,
                got);
        r = SUMO_ERR_INVALID_ARGUMENT;
        goto out;
    }
    uint32_t m = be32(hdr);
    if (m != magic) {
        const char *hint = "";
        if (m == SUMO__IDX_MAGIC_IMAGES) hint = " (an image file where labels were expected)";
        if (m == SUMO__IDX_MAGIC_LABELS) hint = " (a label file where images were expected)";
        set_err(err, errlen,
                "%s: wrong magic number 0x%08x, expected 0x%08x (IDX, unsigned bytes, %d "
                "dimension%s)%s",
                path, (unsigned)m, (unsigned)magic, ndims, ndims == 1 ? "" : "s", hint);
        r = SUMO_ERR_INVALID_ARGUMENT;
        goto out;
    }
    if (got < hlen) {
        set_err(err, errlen, "%s: truncated: header needs %zu bytes, file holds %zu", path,
                hlen, got);
        r = SUMO_ERR_INVALID_ARGUMENT;
        goto out;
    }
    uint64_t total = 1;
    for (int d = 0; d < ndims; d++) {
        dims[d] = be32(hdr + 4 + 4 * d);
        uint32_t cap = d == 0 ? SUMO__IDX_MAX_ITEMS : SUMO__IDX_MAX_DIM;
        if (dims[d] > cap || (d > 0 && dims[d] == 0)) {
            set_err(err, errlen, "%s: dimension %d is %u, outside %u .. %u", path, d,
                    (unsigned)dims[d], d == 0 ? 0u : 1u, (unsigned)cap);
            r = SUMO_ERR_INVALID_ARGUMENT;
            goto out;
        }
        total *= dims[d]; /* the caps keep this far below 2^64 */
    }
    if (total > (uint64_t)SIZE_MAX / sizeof(float)) {
        set_err(err, errlen, "%s: %llu bytes of data do not fit in memory here", path,
                (unsigned long long)total);
        r = SUMO_ERR_INVALID_ARGUMENT;
        goto out;
    }

    /* Grow with the data actually read, so a lying header cannot reserve gigabytes. */
    size_t want = (size_t)total, have = 0, cap = 0;
    while (have < want || cap == 0) {
        size_t ncap = cap == 0 ? SUMO__MIN(want, IDX_FIRST_ALLOC) : SUMO__MIN(want, 2 * cap);
        if (ncap == 0) ncap = 1; /* zero items: still a valid (empty) buffer */
        uint8_t *nb = realloc(buf, ncap);
        if (nb == NULL) {
            set_err(err, errlen, "%s: out of memory for %zu bytes", path, ncap);
            r = SUMO_ERR_SYSTEM;
            goto out;
        }
        buf = nb;
        cap = ncap;
        if (have >= want) break;
        r = idx_read(&fl, buf + have, cap - have, &got, err, errlen);
        if (r != SUMO_SUCCESS) goto out;
        have += got;
        if (have < cap) {
            set_err(err, errlen,
                    "%s: truncated: header announces %llu bytes of data after the header, "
                    "file holds only %zu",
                    path, (unsigned long long)total, have);
            r = SUMO_ERR_INVALID_ARGUMENT;
            goto out;
        }
    }
    /* Also makes zlib reach the gzip trailer, so a CRC mismatch is caught here. */
    unsigned char extra[64];
    r = idx_read(&fl, extra, sizeof extra, &got, err, errlen);
    if (r != SUMO_SUCCESS) goto out;
    if (got > 0) {
        set_err(err, errlen,
                "%s: trailing data: %s%zu extra byte%s after the %llu announced by the header",
                path, got == sizeof extra ? "at least " : "", got, got == 1 ? "" : "s",
                (unsigned long long)total);
        r = SUMO_ERR_INVALID_ARGUMENT;
        goto out;
    }
    *data = buf;
    buf = NULL;
    r = SUMO_SUCCESS;
out:
    free(buf);
    if (fl.f != NULL) gzclose(fl.f);
    return r;
}

void sumo__dataset_free(sumo__dataset *ds)
{
    if (ds == NULL) return;
    free(ds->images);
    free(ds->labels);
    memset(ds, 0, sizeof *ds);
}

sumo_result sumo__dataset_load_files(const char *images_path, const char *labels_path,
                                     sumo__dataset *out, char *err, size_t errlen)
{
    if (err != NULL && errlen > 0) err[0] = '\0';
    if (out == NULL || images_path == NULL || labels_path == NULL) {
        set_err(err, errlen, "dataset load: NULL argument");
        return SUMO_ERR_INVALID_ARGUMENT;
    }
    memset(out, 0, sizeof *out);

    /* Labels first: the small file fails fast before megabytes of images are inflated. */
    uint32_t ldims[1], idims[3];
    uint8_t *labels = NULL, *pixels = NULL;
    sumo_result r = idx_load(labels_path, SUMO__IDX_MAGIC_LABELS, 1, ldims, &labels, err,
                             errlen);
    if (r != SUMO_SUCCESS) return r;
    for (uint32_t i = 0; i < ldims[0]; i++) {
        if (labels[i] >= SUMO__IDX_CLASSES) {
            set_err(err, errlen, "%s: label %u of item %u is outside 0 .. %d", labels_path,
                    (unsigned)labels[i], (unsigned)i, SUMO__IDX_CLASSES - 1);
            free(labels);
            return SUMO_ERR_INVALID_ARGUMENT;
        }
    }
    r = idx_load(images_path, SUMO__IDX_MAGIC_IMAGES, 3, idims, &pixels, err, errlen);
    if (r != SUMO_SUCCESS) {
        free(labels);
        return r;
    }
    if (idims[0] != ldims[0]) {
        set_err(err, errlen, "%s holds %u images but %s holds %u labels", images_path,
                (unsigned)idims[0], labels_path, (unsigned)ldims[0]);
        free(labels);
        free(pixels);
        return SUMO_ERR_INVALID_ARGUMENT;
    }
    size_t npix = (size_t)idims[0] * idims[1] * idims[2], bytes = 0;
    float *images = NULL;
    if (!sumo__mul_overflows(npix == 0 ? 1 : npix, sizeof(float), &bytes))
        images = malloc(bytes);
    if (images == NULL) {
        set_err(err, errlen, "%s: out of memory for %zu pixels as floats", images_path, npix);
        free(labels);
        free(pixels);
        return SUMO_ERR_SYSTEM;
    }
    /* Division, not a multiply by 1/255, to give torchvision's ToTensor values exactly. */
    for (size_t i = 0; i < npix; i++) images[i] = (float)pixels[i] / 255.0f;
    free(pixels);
    out->n = idims[0];
    out->rows = (int)idims[1];
    out->cols = (int)idims[2];
    out->images = images;
    out->labels = labels;
    return SUMO_SUCCESS;
}

/* dir/name.gz when it exists, else dir/name; *path is malloc'd. */
static sumo_result pick_path(const char *dir, const char *name, char **path, char *err,
                             size_t errlen)
{
    size_t len = strlen(dir) + 1 + strlen(name) + 4;
    char *p = malloc(len);
    if (p == NULL) {
        set_err(err, errlen, "out of memory");
        return SUMO_ERR_SYSTEM;
    }
    snprintf(p, len, "%s/%s.gz", dir, name);
    FILE *f = fopen(p, "rb");
    if (f != NULL) {
        fclose(f);
    } else if (errno == ENOENT) {
        snprintf(p, len, "%s/%s", dir, name);
        f = fopen(p, "rb");
        if (f != NULL) {
            fclose(f);
        } else if (errno == ENOENT) {
            set_err(err, errlen, "cannot open %s/%s.gz (nor %s/%s): no such file", dir, name,
                    dir, name);
            free(p);
            return SUMO_ERR_SYSTEM;
        }
    }
    /* Any other failure to open is reported by the load itself, with this path. */
    *path = p;
    return SUMO_SUCCESS;
}

sumo_result sumo__dataset_load(const char *dir, bool train, sumo__dataset *out, char *err,
                               size_t errlen)
{
    if (err != NULL && errlen > 0) err[0] = '\0';
    if (out == NULL) {
        set_err(err, errlen, "dataset load: NULL output");
        return SUMO_ERR_INVALID_ARGUMENT;
    }
    memset(out, 0, sizeof *out);
    if (dir == NULL) dir = SUMO__IDX_DEFAULT_DIR;
    const char *prefix = train ? "train" : "t10k";
    char iname[64], lname[64];
    snprintf(iname, sizeof iname, "%s-images-idx3-ubyte", prefix);
    snprintf(lname, sizeof lname, "%s-labels-idx1-ubyte", prefix);
    char *ipath = NULL, *lpath = NULL;
    sumo_result r = pick_path(dir, lname, &lpath, err, errlen);
    if (r == SUMO_SUCCESS) r = pick_path(dir, iname, &ipath, err, errlen);
    if (r == SUMO_SUCCESS) r = sumo__dataset_load_files(ipath, lpath, out, err, errlen);
    free(ipath);
    free(lpath);
    return r;
}
