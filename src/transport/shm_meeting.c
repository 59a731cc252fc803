#include "transport/shm_meeting.h"
#include "common/settings.h"
#include "transport/shm.h"
#include "transport/shm_liveness.h"

#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define SEG_MAGIC 0x31306d6873756d73ull
#define SEG_VERSION 4u /* 2: the ranks' boards; 3: rank 0's boot id; 4: and host name */
#define KEY_BYTES 256
#define NOTE_BYTES 200

/* The first bytes of the control segment: whose group it is. */
typedef struct seg_header {
    uint64_t magic;
    uint64_t nonce;
} seg_header;

/* ---- the store's records -------------------------------------------------------------------- */

/* Rank 0 -> every rank: where the control segment is. */
typedef struct seg_record {
    uint64_t magic;
    uint32_t version;
    int32_t code; /* not SUMO_SUCCESS: rank 0 could not make it, note says why */
    int32_t mech;
    int32_t size;
    int32_t pid;
    int32_t fd;
    uint32_t slot_bytes;
    uint32_t reserved; /* 0: no padding leaves the process unset */
    uint64_t start; /* rank 0's start time (/proc/<pid>/stat; 0: unknown) */
    uint64_t stage_bytes;
    uint64_t total_bytes;
    uint64_t ino, dev, nonce;
    char name[64];
    char note[NOTE_BYTES];
    /* Rank 0's machine: its host name and the kernel's boot id ("" where either cannot be
     * read). Last, so that a test can rewrite them in a record it copies. */
    char host[64];
    char boot[40];
} seg_record;

/* Rank r -> rank 0: whether it mapped the segment. */
typedef struct attach_record {
    int32_t code;  /* SUMO_SUCCESS or why not */
    int32_t retry; /* the memfd could not be opened: a named object may do */
    int32_t pid;
    char note[NOTE_BYTES];
} attach_record;

/* Rank 0 -> every rank: go, try again with a named object, or fail with this. */
typedef struct verdict_record {
    int32_t code;
    int32_t retry;
    int32_t pid;    /* rank 0's, and its start time: whether the group it made still lives */
    int32_t reserved;
    uint64_t start;
    char note[NOTE_BYTES];
} verdict_record;

/* A failure a peer's record reports, as this rank returns it: the store is anyone's to write
 * (docs/security.md), so a code outside the failures is a record this library did not write. */
static sumo_result peer_code(int32_t code)
{
    bool failure = code > SUMO_SUCCESS && code < SUMO_RESULT_COUNT && code != SUMO_IN_PROGRESS;
    return failure ? (sumo_result)code : SUMO_ERR_MISMATCH;
}

/* A peer's note for this rank's message: never empty, whatever the record held. */
static const char *peer_note(char *note, size_t bytes, const char *what)
{
    note[bytes - 1] = '\0';
    return note[0] != '\0' ? note : what;
}

/* ---- the store ------------------------------------------------------------------------------ */

static sumo_result make_key(const sumo__shm_meeting *m, char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static sumo_result make_key(const sumo__shm_meeting *m, char *key, const char *fmt, ...)
{
    char suffix[64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(suffix, sizeof suffix, fmt, ap);
    va_end(ap);
    if ((size_t)snprintf(key, KEY_BYTES, "%s%s", m->o->key_prefix, suffix) >= KEY_BYTES) {
        snprintf(m->err, m->errlen, "key prefix \"%.40s...\" is too long (keys at most %d bytes)",
                 m->o->key_prefix, KEY_BYTES - 1);
        return SUMO_ERR_INVALID_ARGUMENT;
    }
    return SUMO_SUCCESS;
}

static sumo_result meet_set(const sumo__shm_meeting *m, const char *key, const void *v,
                            size_t bytes)
{
    const sumo_store *s = m->o->store;
    sumo_result r = s->set(s->ctx, key, v, bytes);
    if (r != SUMO_SUCCESS)
        snprintf(m->err, m->errlen, "rank %d: the store's set of \"%s\" failed (%s)", m->o->rank,
                 key, sumo_result_name(r));
    return r;
}

/* Gets exactly bytes under key, waiting for it until the deadline; whose names what the key
 * waits for, for the message. With the pid (> 0) and start time of the process that sets the
 * key, the wait goes in slices and ends early when that process has ended. */
static sumo_result meet_get(const sumo__shm_meeting *m, const char *key, void *v, size_t bytes,
                            const char *whose, pid_t setter, uint64_t setter_start)
{
    const sumo_store *s = m->o->store;
    size_t got = bytes;
    sumo_result r;
    for (;;) {
        int64_t until = m->deadline;
        if (setter > 0) until = SUMO__MIN(until, sumo__now_ns() + (int64_t)100000000);
        got = bytes;
        r = s->get(s->ctx, key, v, &got, until);
        if (r != SUMO_ERR_TIMEOUT || until >= m->deadline) break;
        if (!sumo__shm_still_running(setter, setter_start)) {
            snprintf(m->err, m->errlen,
                     "rank %d waited for store key \"%s\" (%s), but process %d, which sets it, "
                     "has ended", m->o->rank, key, whose, (int)setter);
            return SUMO_ERR_PEER_FAILURE;
        }
    }
    if (r == SUMO_ERR_TIMEOUT) {
        snprintf(m->err, m->errlen,
                 "rank %d waited %.3f s for store key \"%s\" (%s): deadline reached (raise it "
                 "with SUMO_TIMEOUT)",
                 m->o->rank, m->seconds, key, whose);
        return r;
    }
    if (r != SUMO_SUCCESS) {
        snprintf(m->err, m->errlen, "rank %d: the store's get of \"%s\" failed (%s)", m->o->rank,
                 key, sumo_result_name(r));
        return r;
    }
    if (got != bytes) {
        snprintf(m->err, m->errlen,
                 "store key \"%s\" holds %zu bytes, not the %zu of this library's record (a "
                 "peer of another sumo version, or a key prefix used before)",
                 key, got, bytes);
        return SUMO_ERR_MISMATCH;
    }
    return SUMO_SUCCESS;
}

/* Claims this rank's slot in the segment: its pid, once, and its start time. */
static sumo_result claim(const sumo__shm_met *met, int rank, char *note, size_t notelen)
{
    sumo__shm_rank_info *mine = (sumo__shm_rank_info *)(void *)(met->seg + met->L.info) + rank;
    int32_t none = 0, pid = (int32_t)getpid();
    if (!atomic_compare_exchange_strong(&mine->pid, &none, pid)) {
        snprintf(note, notelen, "rank %d was claimed by two processes (pids %d and %d)", rank,
                 (int)none, (int)pid);
        return SUMO_ERR_INVALID_ARGUMENT;
    }
    mine->start = sumo__shm_own_start();
    return SUMO_SUCCESS;
}

/* Keeps the mapping of the segment in met. */
static void hold(sumo__shm_met *met, unsigned char *seg, const sumo__shm_layout *L,
                 size_t slot_bytes, size_t stage_bytes)
{
    /* A child this process forks (a data loader's worker) takes no part in the group: it must
     * not keep the group's memory alive. */
    madvise(seg, L->total, MADV_DONTFORK);
    *met = (sumo__shm_met){.seg = seg, .L = *L, .slot_bytes = slot_bytes,
                           .stage_bytes = stage_bytes, .mech = met->mech};
}

static void release(sumo__shm_met *met)
{
    if (met->seg) munmap(met->seg, met->L.total);
    met->seg = NULL;
}

/* What only rank 0 reads: the staging size (the options', else SUMO_SHM_STAGE_BYTES) and
 * whether to skip the memfd (SUMO_SHM_NAMED). */
/* Every peer has read where the segment is and written that it attached: those keys have served
 * (the verdict is still to be read, and stays). Best effort: a store that cannot remove keeps
 * them, and the meeting does not fail for that. */
static void forget(const sumo__shm_meeting *m, int attempt, int size)
{
    const sumo_store *s = m->o->store;
    if (s->struct_size < offsetof(sumo_store, remove) + sizeof s->remove || s->remove == NULL)
        return;
    char key[KEY_BYTES];
    if (make_key(m, key, "seg/%d", attempt) == SUMO_SUCCESS) s->remove(s->ctx, key);
    for (int k = 1; k < size; k++)
        if (make_key(m, key, "attach/%d/%d", attempt, k) == SUMO_SUCCESS) s->remove(s->ctx, key);
}

static sumo_result lead_settings(const sumo__shm_meeting *m, size_t *stage_bytes, int *mech)
{
    sumo__setting_value v;
    *stage_bytes = m->o->stage_bytes;
    if (*stage_bytes == 0) {
        SUMO__CHECK(sumo__setting_read(SUMO__SETTING_SHM_STAGE_BYTES, &v, m->err, m->errlen));
        *stage_bytes = (size_t)v.integer;
    }
    SUMO__CHECK(sumo__setting_read(SUMO__SETTING_SHM_NAMED, &v, m->err, m->errlen));
    *mech = v.integer ? SUMO__SHM_NAMED : SUMO__SHM_MEMFD;
    return SUMO_SUCCESS;
}

/*
 * Rank 0: makes the segment, publishes it, hears every peer's outcome and says go, try again
 * (a peer could not open the memfd: the named object next), or fail.
 */
/* This machine's kernel boot id: the same for every process of one machine, containers
 * included (they share the kernel), and another after every boot or on another machine. */
static void boot_id(char *out, size_t bytes)
{
    out[0] = '\0';
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f == NULL) return;
    if (fgets(out, (int)bytes, f) == NULL) out[0] = '\0';
    fclose(f);
    out[strcspn(out, "\n")] = '\0';
}

/* This machine's host name. The boot id alone takes hosts that share a kernel (containers,
 * network namespaces with host names of their own, as a cluster is tested on one machine)
 * for one; the host name tells them apart as sumo.torch.init() does, which finds the hosts
 * of a job by name and boot id. */
static void host_name(char *out, size_t bytes)
{
    if (gethostname(out, bytes) != 0) out[0] = '\0';
    out[bytes - 1] = '\0';
}

static sumo_result lead(const sumo__shm_meeting *m, sumo__shm_met *met)
{
    int size = m->o->size;
    size_t slot_bytes = sumo__shm_slot_bytes_for(size), stage_bytes = 0;
    int mech = SUMO__SHM_MEMFD;
    /* A refused setting fails the peers too, at once and with its sentence. */
    sumo_result refused = lead_settings(m, &stage_bytes, &mech);
    sumo__shm_layout L = sumo__shm_layout_of(size, stage_bytes, slot_bytes);
    for (int attempt = 0;; attempt++) {
        char key[KEY_BYTES];
        sumo__shm_segment s;
        seg_record rec = {.magic = SEG_MAGIC, .version = SEG_VERSION, .code = SUMO_SUCCESS,
                          .size = size, .pid = (int32_t)getpid(), .start = sumo__shm_own_start(),
                          .slot_bytes = (uint32_t)slot_bytes, .stage_bytes = stage_bytes,
                          .total_bytes = L.total};
        SUMO__CHECK(make_key(m, key, "seg/%d", attempt));
        /* Rank 0's own staging area is allocated with the rest; each peer allocates its own. */
        bool made = refused == SUMO_SUCCESS &&
                    sumo__shm_segment_make(&mech, L.total, 0, L.stage + stage_bytes, &s, m->err,
                                           m->errlen) == 0;
        if (!made) {
            rec.code = refused != SUMO_SUCCESS ? refused : SUMO_ERR_SYSTEM;
            snprintf(rec.note, sizeof rec.note, "rank 0: %s", m->err);
            if (refused == SUMO_SUCCESS) snprintf(m->err, m->errlen, "%s", rec.note);
            /* A refusal stays this rank's message as it is (it names the variable), and the
             * first cause stays the message whatever the store does. */
            char scratch[NOTE_BYTES];
            sumo__shm_meeting quiet = *m;
            quiet.err = scratch;
            quiet.errlen = sizeof scratch;
            meet_set(&quiet, key, &rec, sizeof rec);
            return (sumo_result)rec.code;
        }
        seg_header *h = (seg_header *)(void *)s.base;
        h->magic = SEG_MAGIC;
        h->nonce = s.nonce;
        hold(met, s.base, &L, slot_bytes, stage_bytes);
        sumo__shm_ctl_init((sumo__shm_ctl *)(void *)(s.base + L.ctl), size);
        claim(met, 0, m->err, m->errlen);
        rec.mech = mech;
        rec.fd = s.fd;
        rec.ino = s.ino;
        rec.dev = s.dev;
        rec.nonce = s.nonce;
        snprintf(rec.name, sizeof rec.name, "%s", s.name);
        boot_id(rec.boot, sizeof rec.boot);
        host_name(rec.host, sizeof rec.host);
        verdict_record v = {.code = meet_set(m, key, &rec, sizeof rec),
                            .pid = (int32_t)getpid(), .start = sumo__shm_own_start()};
        if (v.code != SUMO_SUCCESS) snprintf(v.note, sizeof v.note, "%s", m->err);
        bool retry = false;
        for (int k = 1; k < size && v.code == SUMO_SUCCESS; k++) {
            attach_record a;
            char whose[48];
            snprintf(whose, sizeof whose, "rank %d attaching", k);
            v.code = make_key(m, key, "attach/%d/%d", attempt, k);
            if (v.code == SUMO_SUCCESS) v.code = meet_get(m, key, &a, sizeof a, whose, 0, 0);
            if (v.code != SUMO_SUCCESS) {
                snprintf(v.note, sizeof v.note, "%s", m->err);
            } else if (a.code != SUMO_SUCCESS && a.retry && mech == SUMO__SHM_MEMFD) {
                retry = true;
            } else if (a.code != SUMO_SUCCESS) {
                v.code = peer_code(a.code);
                snprintf(v.note, sizeof v.note, "rank %d: %.180s", k,
                         peer_note(a.note, sizeof a.note, "could not attach (its record gives "
                                   "no reason)"));
            }
        }
        if (v.code == SUMO_SUCCESS) forget(m, attempt, size);
        /* Every peer has mapped it, or will not: the descriptor and the name have served. */
        close(s.fd);
        sumo__shm_segment_unlink(&s);
        v.retry = v.code == SUMO_SUCCESS && retry;
        sumo_result told = make_key(m, key, "verdict/%d", attempt);
        if (told == SUMO_SUCCESS) told = meet_set(m, key, &v, sizeof v);
        if (v.code == SUMO_SUCCESS && !v.retry && told == SUMO_SUCCESS) {
            met->mech = mech;
            return SUMO_SUCCESS;
        }
        release(met);
        if (v.code != SUMO_SUCCESS) {
            snprintf(m->err, m->errlen, "%s", v.note);
            return (sumo_result)v.code;
        }
        if (told != SUMO_SUCCESS) return told;
        mech = SUMO__SHM_NAMED;
        SUMO__LOG(m->log_level, SUMO__LOG_INFO,
                  "rank 0: a peer cannot open the memfd through /proc: a named object instead");
    }
}

/* Rank r > 0's part of one attempt: maps what rank 0 published, allocates its staging area
 * and claims its slot. */
static attach_record attach(const sumo__shm_meeting *m, sumo__shm_met *met,
                            const seg_record *rec)
{
    int size = m->o->size, me = m->o->rank;
    attach_record a = {.code = SUMO_SUCCESS, .pid = (int32_t)getpid()};
    sumo__shm_layout L = sumo__shm_layout_of(size, rec->stage_bytes, rec->slot_bytes);
    sumo__shm_segment s = {.fd = -1};
    bool by_proc = false;
    if (rec->magic != SEG_MAGIC || rec->version != SEG_VERSION) {
        a.code = SUMO_ERR_MISMATCH;
        snprintf(a.note, sizeof a.note, "rank 0 runs another sumo (segment version %u)",
                 rec->version);
    } else if (rec->size != size) {
        a.code = SUMO_ERR_MISMATCH;
        snprintf(a.note, sizeof a.note, "rank %d was given size %d, rank 0 size %d", me, size,
                 rec->size);
    } else if (L.total != rec->total_bytes || rec->slot_bytes == 0 ||
               rec->stage_bytes % SUMO__SHM_PAGE) {
        a.code = SUMO_ERR_MISMATCH;
        snprintf(a.note, sizeof a.note, "rank 0's segment layout is not this library's");
    } else if (sumo__shm_segment_open(rec->mech, rec->pid, rec->fd, rec->name, rec->ino,
                                      rec->dev, L.total, &s, &by_proc, a.note,
                                      sizeof a.note) != 0) {
        a.code = SUMO_ERR_SYSTEM;
        a.retry = by_proc;
    } else if (((seg_header *)(void *)s.base)->magic != SEG_MAGIC ||
               ((seg_header *)(void *)s.base)->nonce != rec->nonce) {
        a.code = SUMO_ERR_SYSTEM;
        snprintf(a.note, sizeof a.note, "the segment holds another group's header");
    } else {
        hold(met, s.base, &L, rec->slot_bytes, rec->stage_bytes);
        s.base = NULL; /* met holds the mapping now */
        size_t lo = L.stage + (size_t)me * rec->stage_bytes;
        int e = posix_fallocate(s.fd, (off_t)lo, (off_t)rec->stage_bytes);
        if (e != 0) {
            a.code = SUMO_ERR_SYSTEM;
            snprintf(a.note, sizeof a.note, "fallocate of its %" PRIu64 "-byte staging area "
                     "failed: %s", rec->stage_bytes, strerror(e));
        } else {
            a.code = claim(met, me, a.note, sizeof a.note);
        }
    }
    sumo__shm_segment_drop(&s);
    if (a.code != SUMO_SUCCESS) release(met);
    return a;
}

/* Rank 0's segment record, waited for in slices. A verdict that already stands for this
 * attempt, from a rank 0 that still runs (not this process: it may make a second group under
 * the same prefix), means the group met without this process: rank 0 removes the record once
 * every peer has attached, and keeps the verdict. Waiting out the deadline for the record
 * would only end in a timeout naming the wrong thing. */
static sumo_result wait_segment(const sumo__shm_meeting *m, int attempt, const char *key,
                                seg_record *rec)
{
    const sumo_store *s = m->o->store;
    char closed[KEY_BYTES];
    SUMO__CHECK(make_key(m, closed, "verdict/%d", attempt));
    for (;;) {
        int64_t now = sumo__now_ns(), until = SUMO__MIN(m->deadline, now + (int64_t)50000000);
        size_t got = sizeof *rec;
        sumo_result r = s->get(s->ctx, key, rec, &got, until);
        if (r == SUMO_SUCCESS && got == sizeof *rec) return SUMO_SUCCESS;
        if (r != SUMO_ERR_TIMEOUT || until >= m->deadline)
            return meet_get(m, key, rec, sizeof *rec, "rank 0 making the segment", 0, 0);
        verdict_record v;
        got = sizeof v;
        if (s->get(s->ctx, closed, &v, &got, sumo__now_ns()) == SUMO_SUCCESS && got == sizeof v &&
            v.code == SUMO_SUCCESS && !v.retry && v.pid > 0 && v.pid != (int32_t)getpid() &&
            v.start != 0 && sumo__shm_still_running((pid_t)v.pid, v.start)) {
            snprintf(m->err, m->errlen, "rank %d: the group under \"%s\" has already met without "
                     "this process (its verdict stands): rank %d was started twice, or came "
                     "after the others had met", m->o->rank, m->o->key_prefix, m->o->rank);
            return SUMO_ERR_INVALID_USAGE;
        }
    }
}

/* Rank r > 0: attaches to what rank 0 published and tells it how that went, until it says go. */
static sumo_result follow(const sumo__shm_meeting *m, sumo__shm_met *met)
{
    for (int attempt = 0;; attempt++) {
        char key[KEY_BYTES];
        seg_record rec;
        SUMO__CHECK(make_key(m, key, "seg/%d", attempt));
        SUMO__CHECK(wait_segment(m, attempt, key, &rec));
        rec.name[sizeof rec.name - 1] = '\0';
        rec.note[sizeof rec.note - 1] = '\0';
        rec.host[sizeof rec.host - 1] = '\0';
        rec.boot[sizeof rec.boot - 1] = '\0';
        if (rec.code != SUMO_SUCCESS) {
            snprintf(m->err, m->errlen, "%s", peer_note(rec.note, sizeof rec.note, "rank 0 "
                     "could not make the segment (its record gives no reason)"));
            return peer_code(rec.code);
        }
        /* Ranks on two machines (a launcher or a store across hosts): nothing here can be
         * mapped, and rank 0's process is not this machine's to watch; said as such, to rank 0
         * too, rather than as a rank 0 that has ended. */
        char boot[sizeof rec.boot], host[sizeof rec.host];
        boot_id(boot, sizeof boot);
        host_name(host, sizeof host);
        bool elsewhere = (rec.boot[0] != '\0' && boot[0] != '\0' && strcmp(rec.boot, boot) != 0) ||
                         (rec.host[0] != '\0' && host[0] != '\0' && strcmp(rec.host, host) != 0);
        /* Where this process sees rank 0 (its pid and start time, as it wrote them), rank 0's
         * end ends the meeting. Over a memfd it must see it (it opens rank 0's descriptor
         * through /proc); over a name, rank 0 may live in another PID namespace. */
        bool alive = !elsewhere && rec.start != 0 &&
                     sumo__shm_still_running((pid_t)rec.pid, rec.start);
        if (!elsewhere && !alive && rec.mech == SUMO__SHM_MEMFD && rec.start != 0) {
            snprintf(m->err, m->errlen, "rank 0 (process %d), which published \"%s\", has "
                     "ended (or the key prefix was used before)", (int)rec.pid, key);
            return SUMO_ERR_PEER_FAILURE;
        }
        attach_record a = {.code = SUMO_ERR_INVALID_USAGE, .pid = (int32_t)getpid()};
        if (elsewhere)
            snprintf(a.note, sizeof a.note, "runs on another machine than rank 0 (hosts "
                     "\"%.20s\" and \"%.20s\", boot ids %.8s, %.8s): shared memory needs one "
                     "host; across hosts, transport \"tcp\"", host, rec.host, boot, rec.boot);
        else
            a = attach(m, met, &rec);
        SUMO__CHECK(make_key(m, key, "attach/%d/%d", attempt, m->o->rank));
        sumo_result r = meet_set(m, key, &a, sizeof a);
        if (r == SUMO_SUCCESS && a.code != SUMO_SUCCESS && !a.retry) {
            snprintf(m->err, m->errlen, "rank %d: %s", m->o->rank, a.note);
            return (sumo_result)a.code;
        }
        verdict_record v;
        if (r == SUMO_SUCCESS) r = make_key(m, key, "verdict/%d", attempt);
        if (r == SUMO_SUCCESS)
            r = meet_get(m, key, &v, sizeof v, "rank 0 hearing every rank",
                         alive ? (pid_t)rec.pid : 0, rec.start);
        if (r == SUMO_SUCCESS && v.code == SUMO_SUCCESS && !v.retry && a.code == SUMO_SUCCESS) {
            met->mech = rec.mech;
            return SUMO_SUCCESS;
        }
        release(met);
        if (r != SUMO_SUCCESS) {
            /* Rank 0 may have died before removing the name: nobody else would. */
            if (rec.mech == SUMO__SHM_NAMED && rec.name[0] == '/') shm_unlink(rec.name);
            return r;
        }
        if (!v.retry || v.code != SUMO_SUCCESS) {
            snprintf(m->err, m->errlen, "%s", peer_note(v.note, sizeof v.note, "rank 0's "
                     "verdict on the meeting gives no reason"));
            return v.code != SUMO_SUCCESS ? peer_code(v.code) : SUMO_ERR_INTERNAL;
        }
    }
}

sumo_result sumo__shm_meet(const sumo__shm_meeting *m, sumo__shm_met *met)
{
    *met = (sumo__shm_met){0};
    return m->o->rank == 0 ? lead(m, met) : follow(m, met);
}
