#include "train/checkpoint.h"
#include "common/settings.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
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

#ifdef SUMO_TEST_CRASH_DURING_SAVE
/* Only in the test build of this file (tests/cli's sumo-crashtest, never the library): die
 * with the temporary file half written, exactly what a power cut or a kill -9 would leave. */
static void fault_point(long step)
{
    char why[256];
    sumo__setting_value v;
    /* A hook that cannot tell its step must not let the test pass without the crash. */
    if (sumo__setting_read(SUMO__SETTING_TEST_EXIT_DURING_SAVE, &v, why, sizeof why) != SUMO_SUCCESS) {
        fprintf(stderr, "sumo: %s\n", why);
        _exit(2);
    }
    if (v.set && v.integer == step) _exit(86);
}
#else
static void fault_point(long step) { (void)step; }
#endif

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
    char path[4096], text[SUMO__CKPT_MANIFEST_MAX];
    snprintf(path, sizeof path, "%s/latest", id->dir);
    int len = snprintf(text, sizeof text, "sumo-checkpoint 1 step %ld ranks %d config %016llx\n%s",
                       id->step, id->size, (unsigned long long)id->config_hash,
                       id->config_text ? id->config_text : "");
    if (len < 0 || (size_t)len >= sizeof text) {
        snprintf(err, errlen, "%s: the configuration does not fit the manifest", path);
        return SUMO_ERR_INTERNAL;
    }
    return sumo__write_file_atomic(path, text, (size_t)len, err, errlen);
}

/* The next "flag value" line of a configuration text; false at its end. */
static bool next_setting(const char **p, char *flag, size_t flen, char *value, size_t vlen)
{
    const char *s = *p;
    while (*s == '\n') s++;
    if (*s == '\0') return false;
    const char *eol = strchr(s, '\n');
    size_t n = eol ? (size_t)(eol - s) : strlen(s);
    const char *sp = memchr(s, ' ', n);
    size_t fl = sp ? (size_t)(sp - s) : n;
    snprintf(flag, flen, "%.*s", (int)fl, s);
    snprintf(value, vlen, "%.*s", sp ? (int)(n - fl - 1) : 0, sp ? sp + 1 : "");
    *p = s + n;
    return true;
}

static bool find_setting(const char *text, const char *flag, char *value, size_t vlen)
{
    char f[64], v[128];
    while (next_setting(&text, f, sizeof f, v, sizeof v))
        if (strcmp(f, flag) == 0) {
            snprintf(value, vlen, "%s", v);
            return true;
        }
    return false;
}

void sumo__config_diff(const char *stored, const char *current, char *out, size_t len)
{
    size_t used = 0;
    out[0] = '\0';
    char f[64], v[128], other[128];
    /* Every flag of either side once: the current side's, then those only the stored has. */
    for (int side = 0; side < 2; side++) {
        const char *a = side == 0 ? current : stored, *b = side == 0 ? stored : current;
        for (const char *p = a; next_setting(&p, f, sizeof f, v, sizeof v);) {
            bool in_b = find_setting(b, f, other, sizeof other);
            if (side == 1 && in_b) continue;
            if (in_b && strcmp(v, other) == 0) continue;
            const char *was = side == 0 ? (in_b ? other : "(not set)") : v;
            const char *now = side == 0 ? v : "(not set)";
            int w = snprintf(out + used, len - used, "%s%s %s in the checkpoint, %s now",
                             used ? "; " : "", f, was, now);
            if (w < 0 || (size_t)w >= len - used) return;
            used += (size_t)w;
        }
    }
}

sumo_result sumo__checkpoint_read_manifest(const sumo__ckpt_id *id, long *step, char *err,
                                           size_t errlen)
{
    char path[4096], text[SUMO__CKPT_MANIFEST_MAX] = {0};
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
        const char *stored = strchr(text, '\n');
        char diff[1024] = "";
        if (stored && stored[1] && id->config_text) sumo__config_diff(stored + 1, id->config_text, diff, sizeof diff);
        if (diff[0])
            snprintf(err, errlen, "%s: the checkpoint was written with other flags: %s", path, diff);
        else
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

/* step-N.rank-R.ckpt: N and R; false for any other name. */
static bool parse_rank_file(const char *name, long *step, int *rank)
{
    int used = 0;
    if (sscanf(name, "step-%ld.rank-%d.ckpt%n", step, rank, &used) != 2) return false;
    return name[used] == '\0' && *step >= 0 && *rank >= 0;
}

/* name.tmp.PID of a writer that no longer runs: what a kill during a save leaves behind. */
static bool stale_temporary(const char *name)
{
    const char *t = strstr(name, ".tmp.");
    if (t == NULL) return false;
    char *end;
    long pid = strtol(t + 5, &end, 10);
    if (*end != '\0' || pid <= 0 || pid == (long)getpid()) return false;
    return kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

sumo_result sumo__checkpoint_prepare(const char *dir, bool resume, bool overwrite, bool clean,
                                     char *err, size_t errlen)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/latest", dir);
    bool has_checkpoint = access(path, F_OK) == 0;
    if (!resume && has_checkpoint && !overwrite) {
        snprintf(err, errlen, "%s holds a checkpoint: --resume continues it, --overwrite starts afresh "
                              "and discards it", dir);
        return SUMO_ERR_INVALID_USAGE;
    }
    if (!clean) return SUMO_SUCCESS;
    DIR *d = opendir(dir);
    if (d == NULL) {
        if (errno == ENOENT) return SUMO_SUCCESS;
        snprintf(err, errlen, "%s: cannot read the checkpoint folder: %s", dir, strerror(errno));
        return SUMO_ERR_SYSTEM;
    }
    bool discard = !resume && overwrite;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        long step;
        int rank;
        bool old = discard && (parse_rank_file(e->d_name, &step, &rank) || strcmp(e->d_name, "latest") == 0);
        if (old || stale_temporary(e->d_name)) {
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            unlink(path);
        }
    }
    closedir(d);
    return SUMO_SUCCESS;
}

static int cmp_long_desc(const void *a, const void *b)
{
    long x = *(const long *)a, y = *(const long *)b;
    return (x < y) - (x > y);
}

void sumo__checkpoint_prune(const char *dir, int rank, long latest, int keep)
{
    DIR *d = opendir(dir);
    if (d == NULL) return;
    size_t n = 0, cap = 16;
    long *steps = malloc(cap * sizeof *steps);
    for (struct dirent *e; steps && (e = readdir(d)) != NULL;) {
        long step;
        int r;
        if (!parse_rank_file(e->d_name, &step, &r) || r != rank) continue;
        if (n == cap) {
            long *grown = realloc(steps, (cap *= 2) * sizeof *steps);
            if (grown == NULL) break;
            steps = grown;
        }
        steps[n++] = step;
    }
    closedir(d);
    if (steps == NULL) return;
    qsort(steps, n, sizeof *steps, cmp_long_desc);
    int kept = 0;
    for (size_t i = 0; i < n; i++) {
        /* A step past the manifest's was never completed: nothing can resume from it. */
        if (steps[i] <= latest && kept < keep) {
            kept++;
            continue;
        }
        sumo__ckpt_id id = {.dir = dir, .step = steps[i], .rank = rank};
        sumo__checkpoint_remove_rank(&id);
    }
    free(steps);
}
