#include "train/checkpoint.h"
#include "common/common.h"
#include "common/settings.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#define CKPT_MAGIC "SUMOCKPT"
/* 2: the CRC covers the header too, so a file renamed to another step or rank is refused
 * however its header was edited to match. */
#define CKPT_VERSION 2u

typedef struct ckpt_header {
    char magic[8];
    uint32_t version;
    int32_t rank, size;
    uint32_t crc;      /* of the header (this field 0) and the payload */
    int64_t step;
    uint64_t config_hash;
    uint64_t bytes;    /* payload bytes after the header */
} ckpt_header;

static void rank_name(const sumo__ckpt_id *id, long step, char *out, size_t len)
{
    snprintf(out, len, "step-%ld.rank-%d.ckpt", step, id->rank);
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

/* The folder of path, opened without following a link at its last component. */
static int open_folder(const char *path, char *name, size_t name_bytes, char *err, size_t errlen)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    snprintf(name, name_bytes, "%s", slash ? slash + 1 : dir);
    if (slash == dir) dir[1] = '\0';
    else if (slash) *slash = '\0';
    else snprintf(dir, sizeof dir, ".");
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0) snprintf(err, errlen, "%s: cannot open the folder: %s", dir, strerror(errno));
    return dfd;
}

/*
 * Writes name in the folder dfd atomically. The temporary's name carries a random part and is
 * created O_EXCL | O_NOFOLLOW: in a folder others can write (the experiments' results may go
 * to one), a link planted at a predictable name would otherwise redirect this write into a
 * file of the planter's choosing.
 */
static sumo_result write_atomic_at(int dfd, const char *shown, const char *name, const void *a,
                                   size_t abytes, const void *b, size_t bbytes, long fault_step,
                                   char *err, size_t errlen)
{
    char tmp[4200];
    uint32_t salt = 0;
    int fd = -1;
    for (int attempt = 0; fd < 0 && attempt < 8; attempt++) {
        if (getrandom(&salt, sizeof salt, GRND_NONBLOCK) != (ssize_t)sizeof salt)
            salt = (uint32_t)(sumo__now_ns() * 2654435761u) + (uint32_t)attempt;
        snprintf(tmp, sizeof tmp, "%s.tmp.%ld.%08x", name, (long)getpid(), (unsigned)salt);
        fd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0) {
        snprintf(err, errlen, "%s: cannot create its temporary file: %s", shown, strerror(errno));
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
    if (r == SUMO_SUCCESS && renameat(dfd, tmp, dfd, name) != 0) r = SUMO_ERR_SYSTEM;
    if (r != SUMO_SUCCESS) {
        snprintf(err, errlen, "%s: cannot write: %s", shown, strerror(saved ? saved : errno));
        unlinkat(dfd, tmp, 0);
        return r;
    }
    /* The rename is durable only once the folder's entry is. */
    fsync(dfd);
    return SUMO_SUCCESS;
}

sumo_result sumo__write_file_atomic(const char *path, const void *data, size_t bytes, char *err,
                                    size_t errlen)
{
    char name[4096];
    int dfd = open_folder(path, name, sizeof name, err, errlen);
    if (dfd < 0) return SUMO_ERR_SYSTEM;
    sumo_result r = write_atomic_at(dfd, path, name, data, bytes, NULL, 0, -1, err, errlen);
    close(dfd);
    return r;
}

/*
 * The checkpoint folder, made if asked, opened without following links, and refused unless
 * this user owns it and nobody else may write it: resuming reads state from it, so whoever can
 * replace its files (or the folder, between a check by path and a use) decides the model.
 * Every later operation goes through the returned handle, never the path again.
 */
static int open_checkpoint_folder(const char *dir, bool create, char *err, size_t errlen)
{
    if (create && mkdir(dir, 0700) != 0 && errno != EEXIST) {
        snprintf(err, errlen, "%s: cannot create the checkpoint folder: %s", dir, strerror(errno));
        return -1;
    }
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0) {
        snprintf(err, errlen, "%s: cannot open the checkpoint folder%s: %s", dir,
                 errno == ELOOP || errno == ENOTDIR ? " (a link or not a folder)" : "",
                 strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(dfd, &st) != 0) {
        snprintf(err, errlen, "%s: cannot read the checkpoint folder: %s", dir, strerror(errno));
    } else if (st.st_uid != geteuid() || (st.st_mode & 022) != 0) {
        snprintf(err, errlen, "%s: the checkpoint folder belongs to uid %u with mode %03o; it "
                 "must be this user's (uid %u) and writable by nobody else, since whoever can "
                 "write it chooses what a resumed run loads", dir, (unsigned)st.st_uid,
                 (unsigned)(st.st_mode & 0777), (unsigned)geteuid());
    } else {
        return dfd;
    }
    close(dfd);
    return -1;
}

/* name in the folder dfd for reading, refused unless it is a regular file: a FIFO would block
 * the open (and no deadline bounds a blocked open), a device would read without end. */
static FILE *open_regular(int dfd, const char *dir, const char *name, char *err, size_t errlen)
{
    int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        snprintf(err, errlen, "%s/%s: cannot open: %s", dir, name,
                 errno == ELOOP ? "it is a symbolic link" : strerror(errno));
        return NULL;
    }
    struct stat st;
    FILE *f = NULL;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "%s/%s: not a regular file: refused", dir, name);
    } else if (fcntl(fd, F_SETFL, 0) != 0 || (f = fdopen(fd, "rb")) == NULL) {
        snprintf(err, errlen, "%s/%s: cannot open: %s", dir, name, strerror(errno));
    }
    if (f == NULL) close(fd);
    return f;
}

/* zlib's crc32 takes uInt lengths: feed large payloads in pieces. */
static uLong crc_more(uLong crc, const void *data, size_t bytes)
{
    for (size_t off = 0; off < bytes;) {
        size_t piece = bytes - off > (1u << 30) ? (1u << 30) : bytes - off;
        crc = crc32(crc, (const Bytef *)data + off, (uInt)piece);
        off += piece;
    }
    return crc;
}

static uint32_t file_crc(const ckpt_header *h, const void *payload, size_t bytes)
{
    ckpt_header zeroed = *h;
    zeroed.crc = 0;
    uLong crc = crc_more(crc32(0L, Z_NULL, 0), &zeroed, sizeof zeroed);
    return (uint32_t)crc_more(crc, payload, bytes);
}

sumo_result sumo__checkpoint_write_rank(const sumo__ckpt_id *id, const void *payload, size_t bytes,
                                        char *err, size_t errlen)
{
    int dfd = open_checkpoint_folder(id->dir, true, err, errlen);
    if (dfd < 0) return SUMO_ERR_SYSTEM;
    ckpt_header h = {.version = CKPT_VERSION, .rank = id->rank, .size = id->size,
                     .step = id->step, .config_hash = id->config_hash, .bytes = bytes};
    memcpy(h.magic, CKPT_MAGIC, 8);
    h.crc = file_crc(&h, payload, bytes);
    char name[128], shown[4096];
    rank_name(id, id->step, name, sizeof name);
    snprintf(shown, sizeof shown, "%s/%s", id->dir, name);
    sumo_result r = write_atomic_at(dfd, shown, name, &h, sizeof h, payload, bytes, id->step,
                                    err, errlen);
    close(dfd);
    return r;
}

sumo_result sumo__checkpoint_read_rank(const sumo__ckpt_id *id, void **payload, size_t *bytes,
                                       char *err, size_t errlen)
{
    char name[128], path[4096];
    rank_name(id, id->step, name, sizeof name);
    snprintf(path, sizeof path, "%s/%s", id->dir, name);
    int dfd = open_checkpoint_folder(id->dir, false, err, errlen);
    if (dfd < 0) return SUMO_ERR_SYSTEM;
    FILE *f = open_regular(dfd, id->dir, name, err, errlen);
    close(dfd);
    if (f == NULL) return SUMO_ERR_SYSTEM;
    ckpt_header h;
    sumo_result r = SUMO_ERR_INVALID_ARGUMENT;
    void *data = NULL;
    struct stat st;
    if (fread(&h, sizeof h, 1, f) != 1) {
        snprintf(err, errlen, "%s: truncated header", path);
    } else if (memcmp(h.magic, CKPT_MAGIC, 8) != 0) {
        snprintf(err, errlen, "%s: not a sumo checkpoint (bad magic)", path);
    } else if (h.version != CKPT_VERSION) {
        snprintf(err, errlen, "%s: checkpoint format %u, this sumo reads format %u (start afresh "
                 "with --overwrite)", path, h.version, CKPT_VERSION);
    } else if (fstat(fileno(f), &st) != 0 || (uint64_t)st.st_size != sizeof h + h.bytes) {
        snprintf(err, errlen, "%s: truncated or padded (%lld bytes, header says %llu)", path,
                 (long long)st.st_size, (unsigned long long)(sizeof h + h.bytes));
    } else if ((data = malloc(h.bytes ? h.bytes : 1)) == NULL) {
        snprintf(err, errlen, "%s: out of memory", path);
        r = SUMO_ERR_SYSTEM;
    } else if (h.bytes && fread(data, h.bytes, 1, f) != 1) {
        snprintf(err, errlen, "%s: truncated payload", path);
    } else if (file_crc(&h, data, h.bytes) != h.crc) {
        snprintf(err, errlen, "%s: corrupt (CRC mismatch over its header and payload)", path);
    } else if (h.rank != id->rank || h.size != id->size || h.step != id->step) {
        /* Checked after the CRC: a header that passes it is the writer's own, so the file was
         * renamed or copied from another rank or step, and the message can say which. */
        snprintf(err, errlen, "%s: written by rank %d of %d at step %lld, expected rank %d of %d at step %ld",
                 path, h.rank, h.size, (long long)h.step, id->rank, id->size, id->step);
    } else if (h.config_hash != id->config_hash) {
        snprintf(err, errlen, "%s: written with another configuration (flags differ from the run being resumed)", path);
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
    int dfd = open_checkpoint_folder(id->dir, true, err, errlen);
    if (dfd < 0) return SUMO_ERR_SYSTEM;
    int len = snprintf(text, sizeof text, "sumo-checkpoint 1 step %ld ranks %d config %016llx\n%s",
                       id->step, id->size, (unsigned long long)id->config_hash,
                       id->config_text ? id->config_text : "");
    if (len < 0 || (size_t)len >= sizeof text) {
        snprintf(err, errlen, "%s: the configuration does not fit the manifest", path);
        close(dfd);
        return SUMO_ERR_INTERNAL;
    }
    sumo_result r = write_atomic_at(dfd, path, "latest", text, (size_t)len, NULL, 0, -1, err,
                                    errlen);
    close(dfd);
    return r;
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
    int dfd = open_checkpoint_folder(id->dir, false, err, errlen);
    if (dfd < 0 && errno == ENOENT) {
        snprintf(err, errlen, "%s: no checkpoint to resume from (no such folder)", id->dir);
        return SUMO_ERR_INVALID_USAGE;
    }
    if (dfd < 0) return SUMO_ERR_SYSTEM;
    struct stat st;
    if (fstatat(dfd, "latest", &st, AT_SYMLINK_NOFOLLOW) != 0 && errno == ENOENT) {
        snprintf(err, errlen, "%s: no checkpoint to resume from (%s)", path, strerror(errno));
        close(dfd);
        return SUMO_ERR_INVALID_USAGE;
    }
    FILE *f = open_regular(dfd, id->dir, "latest", err, errlen);
    close(dfd);
    if (f == NULL) return SUMO_ERR_INVALID_ARGUMENT;
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
    char err[64];
    int dfd = open_checkpoint_folder(id->dir, false, err, sizeof err);
    if (dfd < 0) return;
    char name[128];
    rank_name(id, id->step, name, sizeof name);
    unlinkat(dfd, name, 0);
    close(dfd);
}

/* step-N.rank-R.ckpt: N and R; false for any other name. */
static bool parse_rank_file(const char *name, long *step, int *rank)
{
    int used = 0;
    if (sscanf(name, "step-%ld.rank-%d.ckpt%n", step, rank, &used) != 2) return false;
    return name[used] == '\0' && *step >= 0 && *rank >= 0;
}

/* name.tmp.PID.SALT (name.tmp.PID before format 2) of a writer that no longer runs: what a
 * kill during a save leaves behind. */
static bool stale_temporary(const char *name)
{
    const char *t = strstr(name, ".tmp.");
    if (t == NULL) return false;
    char *end;
    long pid = strtol(t + 5, &end, 10);
    if ((*end != '\0' && *end != '.') || pid <= 0 || pid == (long)getpid()) return false;
    return kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

sumo_result sumo__checkpoint_prepare(const char *dir, bool resume, bool overwrite, bool clean,
                                     char *err, size_t errlen)
{
    struct stat st;
    if (lstat(dir, &st) != 0 && errno == ENOENT) return SUMO_SUCCESS;
    int dfd = open_checkpoint_folder(dir, false, err, errlen);
    if (dfd < 0) return SUMO_ERR_INVALID_USAGE;
    bool has_checkpoint = fstatat(dfd, "latest", &st, AT_SYMLINK_NOFOLLOW) == 0;
    if (!resume && has_checkpoint && !overwrite) {
        snprintf(err, errlen, "%s holds a checkpoint: --resume continues it, --overwrite starts afresh "
                              "and discards it", dir);
        close(dfd);
        return SUMO_ERR_INVALID_USAGE;
    }
    if (!clean) {
        close(dfd);
        return SUMO_SUCCESS;
    }
    /* fdopendir takes the descriptor; the unlinks need one of their own. */
    int lfd = dup(dfd);
    DIR *d = lfd >= 0 ? fdopendir(lfd) : NULL;
    if (d == NULL) {
        snprintf(err, errlen, "%s: cannot read the checkpoint folder: %s", dir, strerror(errno));
        if (lfd >= 0) close(lfd);
        close(dfd);
        return SUMO_ERR_SYSTEM;
    }
    bool discard = !resume && overwrite;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        long step;
        int rank;
        bool old = discard && (parse_rank_file(e->d_name, &step, &rank) || strcmp(e->d_name, "latest") == 0);
        if (old || stale_temporary(e->d_name)) unlinkat(dfd, e->d_name, 0);
    }
    closedir(d);
    close(dfd);
    return SUMO_SUCCESS;
}

static int cmp_long_desc(const void *a, const void *b)
{
    long x = *(const long *)a, y = *(const long *)b;
    return (x < y) - (x > y);
}

void sumo__checkpoint_prune(const char *dir, int rank, long latest, int keep)
{
    char err[64];
    int dfd = open_checkpoint_folder(dir, false, err, sizeof err);
    DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
    if (d == NULL) {
        if (dfd >= 0) close(dfd);
        return;
    }
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
