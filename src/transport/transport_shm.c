/*
 * The shm transport: ranks are processes of one machine that share no launcher, only a
 * key-value store (torchrun's TCPStore). They meet through the store once, then everything
 * runs in shared memory: the control block of shm.c (barrier, announce, abort, departures),
 * one staging area per rank (SUMO__REACH_STAGED, the MPI transport's window without MPI),
 * mailboxes for point-to-point messages, and memory from mem_alloc that every process maps.
 *
 * Which memory. Rank 0 makes the control segment with memfd_create and publishes its pid and
 * descriptor; the peers open /proc/<pid>/fd/<fd>. Such memory has no name anywhere, so
 * nothing can be left behind: it goes with the last process that maps it, however they end.
 * Opening another process's descriptor needs the right to inspect it (same user, and a
 * process that has not made itself undumpable); /proc may also be missing. Rank 0 then makes
 * a named POSIX object instead (O_EXCL, mode 0600, a fresh random name), and removes the
 * name as soon as every rank has mapped it, and on every failure path (a peer that sees its
 * maker die removes it too): only a maker killed before any peer learned the name, or every
 * process killed in the fraction of a second before the last mapping, could leave one.
 * Peers that cannot open the memfd say so through the store and every rank tries again with
 * the name; memory from mem_alloc uses whichever the control segment uses. Each rank
 * allocates its own parts up front (fallocate), so a full /dev/shm or a memory limit is an
 * error at creation instead of a SIGBUS in a collective, and pages land on the NUMA node of
 * the rank that uses them.
 *
 * Point to point. Each ordered pair of ranks has a mailbox: NSLOT chunk slots, a head the
 * sender advances and a tail the receiver advances. Messages are cut into slot-sized chunks,
 * each stamped with the message's size and its offset, so a size disagreement is caught on
 * the first chunk. A send is complete once its last chunk is in a slot (the sender's buffer is
 * free; the receiver drains the rest later), so a sendrecv only ever waits for a free slot
 * (the receiver is slow) or for data (the sender is). It waits for either on one futex word
 * per rank, its doorbell, which every sender and receiver it deals with rings after moving a
 * chunk.
 *
 * Liveness. No launcher ends the job when a process dies, so the waits of shm.c ask this
 * transport at each sleep slice whether a rank they depend on died: pidfds (Linux 5.3),
 * readable once the process has ended, reaped or not (a zombie counts), and where pidfds are
 * missing, kill(pid, 0) and the process's state in /proc. A rank's identity is its pid and its
 * start time, so a recycled pid is never mistaken for the rank. While the group meets, the
 * peers watch rank 0 the same way between slices of their waits on the store.
 *
 * Leaving needs nobody: destroy marks the rank gone (peers waiting on it fail at once) and
 * unmaps. The memory lives on in the peers' mappings, so a rank may leave before its peers
 * read what it staged or sent, and one that stays long after the others left loses nothing.
 */
#include "transport/transport_shm.h"
#include "common/settings.h"
#include "transport/shm.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <stdarg.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#define PAGE ((size_t)4096)
/* Chunks in flight per direction: the sender fills some while the receiver empties others. */
#define NSLOT 4u
#define SLOT_MAX ((size_t)64 * 1024)
#define SLOT_MIN ((size_t)1024)
/* What the size^2 mailboxes' slots may take together before the slots shrink; they are
 * touched lazily, so only the directions in use cost memory. */
#define SLOTS_BUDGET ((size_t)16 << 20)
#define SEG_MAGIC 0x31306d6873756d73ull
#define SEG_VERSION 1u
#define KEY_BYTES 256
#define NOTE_BYTES 200

enum { MECH_MEMFD = 1, MECH_NAMED = 2 };

/* ---- the control segment ----------------------------------------------------------------- */

typedef struct seg_header {
    uint64_t magic;
    uint64_t nonce;
} seg_header;

typedef struct rank_info {
    /* Rung (incremented, then woken) by whoever lets this rank's sendrecv progress. */
    _Atomic uint32_t bell;
    /* Claimed once when the rank attaches: two processes claiming one rank are caught. */
    _Atomic int32_t pid;
    /* The process's start time (/proc/<pid>/stat, ticks since boot; 0: unknown). */
    uint64_t start;
} __attribute__((aligned(SUMO__CACHELINE))) rank_info;

typedef struct slot_hdr {
    uint64_t total;  /* the message's bytes */
    uint64_t offset; /* where this chunk starts in it */
} slot_hdr;

/* src -> dst. head and hdr are written by the sender only, tail by the receiver only. */
typedef struct mailbox {
    _Atomic uint32_t head;
    slot_hdr hdr[NSLOT];
    _Atomic uint32_t tail __attribute__((aligned(SUMO__CACHELINE)));
} __attribute__((aligned(SUMO__CACHELINE))) mailbox;

/* Byte offsets in the segment: header, control block (at PAGE), rank infos, mailboxes, slots,
 * then the staging areas, each starting a page. */
typedef struct layout {
    size_t ctl, info, boxes, slots, stage, total;
} layout;

static size_t round_up(size_t x, size_t to) { return (x + to - 1) / to * to; }

static layout layout_of(int size, size_t stage_bytes, size_t slot_bytes)
{
    size_t p = (size_t)size;
    layout L;
    L.ctl = PAGE;
    L.info = round_up(L.ctl + sumo__shm_ctl_bytes(size), SUMO__CACHELINE);
    L.boxes = L.info + p * sizeof(rank_info);
    L.slots = round_up(L.boxes + p * p * sizeof(mailbox), PAGE);
    L.stage = round_up(L.slots + p * p * NSLOT * slot_bytes, PAGE);
    L.total = L.stage + p * stage_bytes;
    return L;
}

static size_t slot_bytes_for(int size)
{
    size_t slot = SLOT_MAX, dirs = (size_t)size * (size_t)size;
    while (slot > SLOT_MIN && dirs * NSLOT * slot > SLOTS_BUDGET) slot /= 2;
    return slot;
}

/* ---- the store's records (binary: every rank runs this library's layout) ------------------ */

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
    char note[NOTE_BYTES];
} verdict_record;

/* ---- the transport ------------------------------------------------------------------------ */

/* What each rank announces about its part of a new region (fits an announcement). */
typedef struct part_record {
    int32_t code; /* SUMO_SUCCESS, or this rank's failure */
    int32_t err;  /* its errno */
    int32_t pid;
    int32_t fd;
    int32_t mech;
    int32_t peer; /* the failure was mapping this rank's part (-1: making its own) */
    uint64_t bytes, address, ino, dev, nonce;
} part_record;
_Static_assert(sizeof(part_record) <= SUMO__ANNOUNCE_BYTES, "a part record is one announcement");

typedef struct shm_transport {
    sumo__transport base;
    sumo__shm shm;
    unsigned char *seg;
    layout L;
    size_t slot_bytes;
    int mech;
    rank_info *info;
    mailbox *boxes;
    unsigned char **stage;
    /* Per rank: a pidfd (-1: none) and the pid to ask instead (0: not watched). */
    int *pidfd;
    pid_t *pid;
    /* A second rank the current wait depends on (a sendrecv blocked both ways), or -1. */
    int also;
    /* Memory from mem_alloc, one segment per rank, each mapped by every rank; changed only by
     * the collective mem_alloc / mem_free. */
    sumo__shm_region *regions;
    part_record *parts; /* mem_alloc's announcements (size entries), made with the transport */
} shm_transport;

static mailbox *box(shm_transport *t, int src, int dst)
{
    return &t->boxes[(size_t)src * (size_t)t->base.size + (size_t)dst];
}

static unsigned char *slot_at(shm_transport *t, int src, int dst, uint32_t n)
{
    size_t dir = (size_t)src * (size_t)t->base.size + (size_t)dst;
    return t->seg + t->L.slots + (dir * NSLOT + n % NSLOT) * t->slot_bytes;
}

static void futex_wake_all(_Atomic uint32_t *word)
{
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static void ring(shm_transport *t, int rank)
{
    atomic_fetch_add_explicit(&t->info[rank].bell, 1, memory_order_release);
    sumo__shm_wake(&t->shm, &t->info[rank].bell);
}

/* Sleepers on doorbells wake within a slice anyway; this makes an abort or departure
 * immediate for them too. */
static void wake_every_bell(shm_transport *t)
{
    for (int r = 0; r < t->base.size; r++) futex_wake_all(&t->info[r].bell);
}

/* ---- processes ---------------------------------------------------------------------------- */

/* State letter and start time of a process from /proc/<pid>/stat; false when unreadable. */
static bool proc_stat(pid_t pid, char *state, uint64_t *start)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return false;
    buf[n] = '\0';
    /* The command name may hold spaces and parentheses: fields restart after the last ')'. */
    char *p = strrchr(buf, ')');
    if (p == NULL || p[1] != ' ') return false;
    *state = p[2];
    /* The start time is field 22; the state is field 3. */
    p += 2;
    for (int field = 3; field < 22; field++) {
        p = strchr(p, ' ');
        if (p == NULL) return false;
        p++;
    }
    char *end;
    *start = strtoull(p, &end, 10);
    return end != p;
}

static uint64_t own_start(void)
{
    char state;
    uint64_t start = 0;
    return proc_stat(getpid(), &state, &start) ? start : 0;
}

static int open_pidfd(pid_t pid)
{
#ifdef SYS_pidfd_open
    return (int)syscall(SYS_pidfd_open, pid, 0);
#else
    (void)pid;
    errno = ENOSYS;
    return -1;
#endif
}

/* Whether the process with this pid has ended (a zombie counts); false when unknown. */
static bool pid_ended(pid_t pid)
{
    char state;
    uint64_t start;
    if (kill(pid, 0) != 0 && errno == ESRCH) return true;
    return proc_stat(pid, &state, &start) && (state == 'Z' || state == 'X');
}

/* Whether pid is, as /proc shows it here, the live process that started at start. */
static bool still_running(pid_t pid, uint64_t start)
{
    char state;
    uint64_t now;
    return proc_stat(pid, &state, &now) && now == start && state != 'Z' && state != 'X';
}

/* Whether rank r's process has ended; why says how that was seen. */
static bool rank_dead(shm_transport *t, int r, char *why, size_t why_bytes)
{
    pid_t pid = t->pid[r];
    if (t->pidfd[r] >= 0) {
        struct pollfd p = {.fd = t->pidfd[r], .events = POLLIN};
        if (poll(&p, 1, 0) <= 0) return false;
    } else {
        char state;
        uint64_t start;
        /* A start time other than the rank's: the pid was recycled after the rank ended. */
        bool recycled = t->info[r].start != 0 && proc_stat(pid, &state, &start) &&
                        start != t->info[r].start;
        if (pid <= 0 || !(recycled || pid_ended(pid))) return false;
    }
    snprintf(why, why_bytes, "died (process %d ended: killed, crashed or exited without "
                             "destroying its handle)", (int)pid);
    return true;
}

/* shm.c's watch: the ranks a wait depends on (peer and `also`, or every rank). */
static int watch_peers(sumo__shm *shm, int peer, char *why, size_t why_bytes)
{
    shm_transport *t = shm->watch_ctx;
    if (peer < 0) {
        for (int r = 0; r < t->base.size; r++)
            if (r != t->base.rank && rank_dead(t, r, why, why_bytes)) return r;
        return -1;
    }
    if (rank_dead(t, peer, why, why_bytes)) return peer;
    int also = t->also;
    if (also < 0) return -1;
    if (atomic_load(&shm->ctl->desc[also].gone)) {
        snprintf(why, why_bytes, "left the group (its handle was destroyed)");
        return also;
    }
    return rank_dead(t, also, why, why_bytes) ? also : -1;
}

/* Starts watching every peer (after the creation's barrier: every rank is attached and was
 * alive a moment ago). A pid this process cannot see, or whose start time is not the one its
 * rank wrote, is another PID namespace's: that rank is then left to the deadline rather than
 * judged by a stranger. */
static void watch_start(shm_transport *t)
{
    for (int r = 0; r < t->base.size; r++) {
        t->pidfd[r] = -1;
        t->pid[r] = 0;
        if (r == t->base.rank) continue;
        pid_t pid = (pid_t)atomic_load(&t->info[r].pid);
        uint64_t start = t->info[r].start;
        if (pid <= 0) continue;
        int fd = open_pidfd(pid);
        char state;
        uint64_t now_start;
        /* Read after the pidfd holds the process, so both name the same one. */
        bool seen = proc_stat(pid, &state, &now_start);
        if ((fd < 0 && !seen && kill(pid, 0) != 0 && errno == ESRCH) ||
            (start != 0 && seen && now_start != start)) {
            if (fd >= 0) close(fd);
            continue;
        }
        t->pidfd[r] = fd;
        t->pid[r] = pid;
    }
    t->shm.watch = watch_peers;
    t->shm.watch_ctx = t;
}

/* ---- segments ----------------------------------------------------------------------------- */

typedef struct segment {
    int fd;
    unsigned char *base;
    size_t bytes;
    uint64_t ino, dev, nonce;
    char name[64]; /* MECH_NAMED: the name while it exists, else "" */
} segment;

static uint64_t fresh_nonce(void)
{
    uint64_t n = 0;
    if (getrandom(&n, sizeof n, GRND_NONBLOCK) != (ssize_t)sizeof n)
        n = (uint64_t)sumo__now_ns() * 0x9e3779b97f4a7c15ull ^ (uint64_t)getpid();
    return n;
}

/* The named object's name: its maker's pid and a random nonce, so no two collide and the
 * tests can tell whose a leftover is. */
static void name_of(char name[64], pid_t pid, uint64_t nonce)
{
    snprintf(name, 64, "/sumo.%d.%016" PRIx64, (int)pid, nonce);
}

static void segment_unlink(segment *s)
{
    if (s->name[0]) shm_unlink(s->name);
    s->name[0] = '\0';
}

/* Unmaps, closes and unlinks whatever s holds. */
static void segment_drop(segment *s)
{
    if (s->base) munmap(s->base, s->bytes);
    if (s->fd >= 0) close(s->fd);
    segment_unlink(s);
    s->base = NULL;
    s->fd = -1;
}

/* Whether this process can reopen its own descriptor through /proc (else peers surely cannot). */
static bool proc_reopens(int fd)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    int again = open(path, O_RDWR | O_CLOEXEC);
    if (again < 0) return false;
    close(again);
    return true;
}

/*
 * Makes an owner-only segment of bytes and maps it; [fill_lo, fill_hi) is allocated now, by
 * this process. *mech may turn from memfd to named where memfds cannot serve. Returns 0, or an
 * errno with what failed in err.
 */
static int segment_make(int *mech, size_t bytes, size_t fill_lo, size_t fill_hi, segment *s,
                        char *err, size_t errlen)
{
    *s = (segment){.fd = -1, .bytes = bytes, .nonce = fresh_nonce()};
    const char *step = "memfd_create";
    if (*mech == MECH_MEMFD) {
        s->fd = memfd_create("sumo-shm", MFD_CLOEXEC);
        /* The peers open it through /proc with the owner's rights: keep those the owner's. */
        if (s->fd >= 0 && (fchmod(s->fd, 0600) != 0 || !proc_reopens(s->fd))) {
            close(s->fd);
            s->fd = -1;
        }
        if (s->fd < 0) *mech = MECH_NAMED;
    }
    if (*mech == MECH_NAMED) {
        step = "shm_open";
        name_of(s->name, getpid(), s->nonce);
        s->fd = shm_open(s->name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (s->fd < 0) s->name[0] = '\0';
    }
    int e = s->fd < 0 ? errno : 0;
    struct stat st;
    if (e == 0 && ftruncate(s->fd, (off_t)bytes) != 0) {
        e = errno;
        step = "ftruncate";
    }
    if (e == 0 && fill_hi > fill_lo) {
        e = posix_fallocate(s->fd, (off_t)fill_lo, (off_t)(fill_hi - fill_lo));
        step = "fallocate";
    }
    if (e == 0 && fstat(s->fd, &st) != 0) {
        e = errno;
        step = "fstat";
    }
    if (e == 0) {
        s->base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd, 0);
        if (s->base == MAP_FAILED) {
            e = errno;
            s->base = NULL;
            step = "mmap";
        }
    }
    if (e != 0) {
        snprintf(err, errlen, "%s of %zu bytes failed: %s", step, bytes, strerror(e));
        segment_drop(s);
        return e;
    }
    s->ino = (uint64_t)st.st_ino;
    s->dev = (uint64_t)st.st_dev;
    return 0;
}

/*
 * Maps a segment another process made, through its descriptor (memfd) or its name, after
 * checking it is that very object (inode, device, size): a stale record cannot map something
 * else. The descriptor stays open in s->fd for the caller's fallocate. *by_proc is set when the
 * failure was opening the memfd through /proc (a named object may still serve).
 */
static int segment_open(int mech, pid_t pid, int fd, const char *name, uint64_t ino,
                        uint64_t dev, size_t bytes, segment *s, bool *by_proc, char *err,
                        size_t errlen)
{
    *s = (segment){.fd = -1, .bytes = bytes};
    *by_proc = false;
    char path[96];
    if (mech == MECH_MEMFD) snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)pid, fd);
    else snprintf(path, sizeof path, "%s", name);
    s->fd = mech == MECH_MEMFD ? open(path, O_RDWR | O_CLOEXEC) : shm_open(path, O_RDWR | O_CLOEXEC, 0);
    if (s->fd < 0) {
        int e = errno;
        *by_proc = mech == MECH_MEMFD;
        snprintf(err, errlen, "cannot open %s%s: %s", mech == MECH_MEMFD ? "" : "/dev/shm", path,
                 strerror(e));
        return e;
    }
    struct stat st;
    if (fstat(s->fd, &st) != 0 || (uint64_t)st.st_ino != ino || (uint64_t)st.st_dev != dev ||
        (uint64_t)st.st_size != bytes) {
        snprintf(err, errlen, "%s is not the segment its owner made (a stale key prefix?)", path);
        segment_drop(s);
        return EINVAL;
    }
    s->base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd, 0);
    if (s->base == MAP_FAILED) {
        int e = errno;
        s->base = NULL;
        snprintf(err, errlen, "mmap of %zu bytes of %s failed: %s", bytes, path, strerror(e));
        segment_drop(s);
        return e;
    }
    return 0;
}

/* ---- sendrecv ----------------------------------------------------------------------------- */

static size_t chunks_of(size_t bytes, size_t slot) { return bytes == 0 ? 1 : (bytes + slot - 1) / slot; }

static sumo_result shm_sendrecv_working(sumo__transport *tp, const void *sbuf, size_t sbytes,
                                        int dst, void *rbuf, size_t rbytes, int src,
                                        sumo__work_fn work, void *ctx)
{
    shm_transport *t = (shm_transport *)tp;
    int me = tp->rank;
    int64_t deadline = sumo__now_ns() + tp->timeout_ns;
    size_t slot = t->slot_bytes;
    mailbox *out = dst >= 0 ? box(t, me, dst) : NULL;
    mailbox *in = src >= 0 ? box(t, src, me) : NULL;
    size_t to_send = out ? chunks_of(sbytes, slot) : 0, sent = 0;
    size_t to_take = in ? chunks_of(rbytes, slot) : 0, taken = 0;
    _Atomic uint32_t *bell = &t->info[me].bell;
    for (;;) {
        /* Read before looking at the mailboxes: a chunk moved after this read rings it. */
        uint32_t rung = atomic_load_explicit(bell, memory_order_acquire);
        bool moved = false;
        while (sent < to_send) {
            uint32_t head = atomic_load_explicit(&out->head, memory_order_relaxed);
            if (head - atomic_load_explicit(&out->tail, memory_order_acquire) >= NSLOT) break;
            size_t off = sent * slot, len = SUMO__MIN(slot, sbytes - off);
            out->hdr[head % NSLOT] = (slot_hdr){.total = sbytes, .offset = off};
            if (len) memcpy(slot_at(t, me, dst, head), (const unsigned char *)sbuf + off, len);
            atomic_store_explicit(&out->head, head + 1, memory_order_release);
            ring(t, dst);
            sent++;
            moved = true;
        }
        while (taken < to_take) {
            uint32_t tail = atomic_load_explicit(&in->tail, memory_order_relaxed);
            if (atomic_load_explicit(&in->head, memory_order_acquire) == tail) break;
            slot_hdr h = in->hdr[tail % NSLOT];
            size_t off = taken * slot, len = SUMO__MIN(slot, rbytes - off);
            if (h.total != rbytes || h.offset != off)
                return SUMO__FAIL(tp, SUMO_ERR_INTERNAL,
                                  "receive from rank %d: expected %zu bytes, peer sent %" PRIu64
                                  " (chunk at %" PRIu64 ", expected at %zu)",
                                  src, rbytes, h.total, h.offset, off);
            if (len) memcpy((unsigned char *)rbuf + off, slot_at(t, src, me, tail), len);
            atomic_store_explicit(&in->tail, tail + 1, memory_order_release);
            ring(t, src);
            taken++;
            moved = true;
        }
        if (sent == to_send && taken == to_take) return SUMO_SUCCESS;
        if (moved) continue;
        /* Nothing can move: the caller's work fills the wait, a slice at a time. */
        if (work) {
            if (!work(ctx)) work = NULL;
            continue;
        }
        bool receiving = taken < to_take;
        t->also = receiving && sent < to_send && dst != src ? dst : -1;
        sumo_result r = sumo__shm_wait_change(tp, &t->shm, bell, rung, receiving ? src : dst,
                                              deadline, receiving ? "receive" : "send");
        t->also = -1;
        SUMO__CHECK(r);
    }
}

static sumo_result shm_sendrecv(sumo__transport *tp, const void *sbuf, size_t sbytes, int dst,
                                void *rbuf, size_t rbytes, int src)
{
    return shm_sendrecv_working(tp, sbuf, sbytes, dst, rbuf, rbytes, src, NULL, NULL);
}

/* ---- the rest of the interface ------------------------------------------------------------ */

static sumo_result shm_announce(sumo__transport *tp, const void *record, void *all, size_t bytes)
{
    return sumo__shm_announce(tp, &((shm_transport *)tp)->shm, record, all, bytes);
}

static sumo_result shm_barrier(sumo__transport *tp)
{
    return sumo__shm_barrier(tp, &((shm_transport *)tp)->shm);
}

static unsigned char *shm_stage(sumo__transport *tp, int rank)
{
    return ((shm_transport *)tp)->stage[rank];
}

static void shm_abort(sumo__transport *tp)
{
    shm_transport *t = (shm_transport *)tp;
    sumo__shm_abort(&t->shm, tp->rank);
    wake_every_bell(t);
}

static bool shm_shares(sumo__transport *tp, const void *buf, size_t bytes)
{
    return sumo__shm_region_shares(((shm_transport *)tp)->regions, tp->rank, buf, bytes);
}

static void *shm_peer_buffer(sumo__transport *tp, int rank, uint64_t address)
{
    return sumo__shm_region_peer(((shm_transport *)tp)->regions, rank, address);
}

static void region_free(shm_transport *t, sumo__shm_region *g)
{
    for (int r = 0; g->mapped && r < t->base.size; r++)
        if (g->mapped[r]) munmap(g->mapped[r], g->owner_bytes[r]);
    sumo__shm_region_tables_free(g);
    free(g);
}

static int first_failure(const part_record *all, int size)
{
    for (int r = 0; r < size; r++)
        if (all[r].code != SUMO_SUCCESS) return r;
    return -1;
}

static sumo__shm_region *region_new(int size)
{
    sumo__shm_region *g = calloc(1, sizeof *g);
    if (g && sumo__shm_region_tables(g, size)) return g;
    free(g);
    return NULL;
}

/* Maps every peer's part of g; returns this rank's outcome. */
static part_record map_parts(shm_transport *t, sumo__shm_region *g, const part_record *all,
                             char *note, size_t notelen)
{
    for (int k = 0; k < t->base.size; k++) {
        if (k == t->base.rank) continue;
        segment peer;
        bool by_proc;
        char name[64];
        name_of(name, (pid_t)all[k].pid, all[k].nonce);
        int e = segment_open(all[k].mech, all[k].pid, all[k].fd, name, all[k].ino, all[k].dev,
                             (size_t)all[k].bytes, &peer, &by_proc, note, notelen);
        if (e != 0) return (part_record){.code = SUMO_ERR_SYSTEM, .err = e, .peer = k};
        close(peer.fd);
        /* As the control segment (set_views); this rank's own part forks as any memory. */
        madvise(peer.base, peer.bytes, MADV_DONTFORK);
        g->mapped[k] = peer.base;
        g->owner_bytes[k] = (size_t)all[k].bytes;
        g->owner_address[k] = all[k].address;
    }
    return (part_record){.code = SUMO_SUCCESS, .peer = -1};
}

/*
 * One segment per rank and allocation: each rank makes its part (allocated now, by itself),
 * announces where it is, and maps every peer's; a second announcement tells everyone whether
 * every rank mapped everything. Every step runs on every rank whatever its own outcome (the
 * communicator agreed before), so all succeed or all fail together, leaving nothing.
 */
static sumo_result shm_mem_alloc(sumo__transport *tp, size_t bytes, void **ptr)
{
    shm_transport *t = (shm_transport *)tp;
    int size = tp->size, me = tp->rank;
    part_record *all = t->parts;
    sumo__shm_region *g = region_new(size);
    segment own = {.fd = -1};
    char note[160] = "";
    part_record mine = {.code = SUMO_ERR_SYSTEM, .err = ENOMEM, .pid = (int32_t)getpid(),
                        .fd = -1, .peer = -1};
    /* The page added by the rounding must not wrap a size no memory holds to a small one. */
    if (g && bytes <= SIZE_MAX - PAGE && bytes <= (size_t)INT64_MAX - PAGE) {
        int mech = t->mech;
        size_t rounded = round_up(bytes, PAGE);
        mine.err = segment_make(&mech, rounded, 0, rounded, &own, note, sizeof note);
        if (mine.err == 0) {
            mine = (part_record){.code = SUMO_SUCCESS, .pid = (int32_t)getpid(), .fd = own.fd,
                                 .mech = mech, .peer = -1, .bytes = rounded,
                                 .address = (uint64_t)(uintptr_t)own.base, .ino = own.ino,
                                 .dev = own.dev, .nonce = own.nonce};
            g->mapped[me] = own.base;
            g->owner_bytes[me] = rounded;
            g->owner_address[me] = mine.address;
        }
    }
    sumo_result r = shm_announce(tp, &mine, all, sizeof mine);
    bool announced = r == SUMO_SUCCESS;
    int failed = announced ? first_failure(all, size) : -1;
    part_record why = failed >= 0 ? all[failed] : mine;
    if (r == SUMO_SUCCESS) {
        part_record second = failed < 0 ? map_parts(t, g, all, note, sizeof note)
                                        : (part_record){.code = SUMO_SUCCESS, .peer = -1};
        r = shm_announce(tp, &second, all, sizeof second);
        if (r == SUMO_SUCCESS && failed < 0) {
            failed = first_failure(all, size);
            if (failed >= 0) why = all[failed];
        }
    }
    /* Every rank has tried every part: the descriptors and names have served. */
    if (own.fd >= 0) close(own.fd);
    own.fd = -1;
    segment_unlink(&own);
    if (r == SUMO_SUCCESS && failed < 0) {
        g->user = own.base;
        g->next = t->regions;
        t->regions = g;
        *ptr = g->user;
        return SUMO_SUCCESS;
    }
    if (g) region_free(t, g);
    else if (own.base) munmap(own.base, own.bytes);
    if (r != SUMO_SUCCESS) {
        /* A peer died between the two announcements: it cannot remove its name any more. The
         * table still holds the first one's records (a failed announcement leaves it). */
        for (int k = 0; announced && failed < 0 && k < size; k++) {
            char name[64];
            name_of(name, (pid_t)all[k].pid, all[k].nonce);
            if (all[k].mech == MECH_NAMED && k != me) shm_unlink(name);
        }
        return r;
    }
    char what[48] = "make its own part";
    if (why.peer >= 0) snprintf(what, sizeof what, "map rank %d's part", why.peer);
    return SUMO__FAIL_TOGETHER(tp, SUMO_ERR_SYSTEM,
                               "mem_alloc: %zu bytes in memory every process maps: rank %d could "
                               "not %s (%s)%s%s",
                               bytes, failed, what, strerror(why.err), note[0] ? "; here: " : "",
                               note);
}

static sumo_result shm_mem_free(sumo__transport *tp, void *ptr)
{
    shm_transport *t = (shm_transport *)tp;
    /* Local: each process's mappings keep the memory alive for the others. */
    sumo__shm_region *g = sumo__shm_region_take(&t->regions, ptr);
    if (g) {
        region_free(t, g);
        return SUMO_SUCCESS;
    }
    return SUMO__FAIL(tp, SUMO_ERR_INVALID_ARGUMENT,
                      "mem_free: %p did not come from sumo_mem_alloc on this communicator", ptr);
}

static void transport_free(shm_transport *t)
{
    while (t->regions) {
        sumo__shm_region *g = t->regions;
        t->regions = g->next;
        region_free(t, g);
    }
    if (t->seg) munmap(t->seg, t->L.total);
    for (int r = 0; t->pidfd && r < t->base.size; r++)
        if (t->pidfd[r] >= 0) close(t->pidfd[r]);
    free(t->pidfd);
    free(t->pid);
    free(t->stage);
    free(t->parts);
    free(t);
}

static sumo_result shm_destroy(sumo__transport *tp)
{
    shm_transport *t = (shm_transport *)tp;
    /* Peers still waiting on this rank fail now; peers finishing a collective this rank has
     * finished are not affected (what it sent and staged stays in their mappings). */
    if (tp->size > 1) {
        sumo__shm_depart(&t->shm, tp->rank);
        wake_every_bell(t);
    }
    transport_free(t);
    return SUMO_SUCCESS;
}

static const sumo__transport_ops shm_ops = {
    .name = "shm",
    .sendrecv = shm_sendrecv,
    .sendrecv_working = shm_sendrecv_working,
    .announce = shm_announce,
    .barrier = shm_barrier,
    .peer_buffer = shm_peer_buffer,
    .shares = shm_shares,
    .mem_alloc = shm_mem_alloc,
    .mem_free = shm_mem_free,
    .stage = shm_stage,
    .abort = shm_abort,
    .destroy = shm_destroy,
};

/* ---- creation ----------------------------------------------------------------------------- */

/* What the creation needs besides the transport: the caller's options and its deadline. */
typedef struct meeting {
    const sumo_shm_options *o;
    int64_t deadline;
    double seconds;
    char *err;
    size_t errlen;
} meeting;

static sumo_result make_key(const meeting *m, char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static sumo_result make_key(const meeting *m, char *key, const char *fmt, ...)
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

static sumo_result meet_set(const meeting *m, const char *key, const void *v, size_t bytes)
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
static sumo_result meet_get(const meeting *m, const char *key, void *v, size_t bytes,
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
        if (!still_running(setter, setter_start)) {
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

static void set_views(shm_transport *t, unsigned char *seg, const layout *L, size_t slot_bytes,
                      size_t stage_bytes)
{
    /* A child this process forks (a data loader's worker) takes no part in the group: it must
     * not keep the group's memory alive. */
    madvise(seg, L->total, MADV_DONTFORK);
    t->seg = seg;
    t->L = *L;
    t->slot_bytes = slot_bytes;
    t->info = (rank_info *)(void *)(seg + L->info);
    t->boxes = (mailbox *)(void *)(seg + L->boxes);
    for (int r = 0; r < t->base.size; r++) t->stage[r] = seg + L->stage + (size_t)r * stage_bytes;
    t->base.stage_bytes = stage_bytes;
    t->shm = (sumo__shm){.ctl = (sumo__shm_ctl *)(void *)(seg + L->ctl),
                         .rank = t->base.rank,
                         .size = t->base.size,
                         .same_address_space = false,
                         .stage = t->stage,
                         .stage_bytes = stage_bytes,
                         .spin_limit = sumo__shm_default_spin_limit(t->base.size)};
}

static void drop_views(shm_transport *t)
{
    if (t->seg) munmap(t->seg, t->L.total);
    t->seg = NULL;
}

/* Claims this rank's slot in the segment: its pid, once, and its start time. */
static sumo_result claim(shm_transport *t, char *note, size_t notelen)
{
    rank_info *mine = &t->info[t->base.rank];
    int32_t none = 0, pid = (int32_t)getpid();
    if (!atomic_compare_exchange_strong(&mine->pid, &none, pid)) {
        snprintf(note, notelen, "rank %d was claimed by two processes (pids %d and %d)",
                 t->base.rank, (int)none, (int)pid);
        return SUMO_ERR_INVALID_ARGUMENT;
    }
    mine->start = own_start();
    return SUMO_SUCCESS;
}

/* What only rank 0 reads: the staging size (the options', else SUMO_SHM_STAGE_BYTES) and
 * whether to skip the memfd (SUMO_SHM_NAMED). */
static sumo_result lead_settings(const meeting *m, size_t *stage_bytes, int *mech)
{
    sumo__setting_value v;
    *stage_bytes = m->o->stage_bytes;
    if (*stage_bytes == 0) {
        SUMO__CHECK(sumo__setting_read(SUMO__SETTING_SHM_STAGE_BYTES, &v, m->err, m->errlen));
        *stage_bytes = (size_t)v.integer;
    }
    SUMO__CHECK(sumo__setting_read(SUMO__SETTING_SHM_NAMED, &v, m->err, m->errlen));
    *mech = v.integer ? MECH_NAMED : MECH_MEMFD;
    return SUMO_SUCCESS;
}

/*
 * Rank 0: makes the segment, publishes it, hears every peer's outcome and says go, try again
 * (a peer could not open the memfd: the named object next), or fail.
 */
static sumo_result lead(shm_transport *t, const meeting *m)
{
    int size = t->base.size;
    size_t slot_bytes = slot_bytes_for(size), stage_bytes = 0;
    int mech = MECH_MEMFD;
    /* A refused setting fails the peers too, at once and with its sentence. */
    sumo_result refused = lead_settings(m, &stage_bytes, &mech);
    layout L = layout_of(size, stage_bytes, slot_bytes);
    for (int attempt = 0;; attempt++) {
        char key[KEY_BYTES];
        segment s;
        seg_record rec = {.magic = SEG_MAGIC, .version = SEG_VERSION, .code = SUMO_SUCCESS,
                          .size = size, .pid = (int32_t)getpid(), .start = own_start(),
                          .slot_bytes = (uint32_t)slot_bytes, .stage_bytes = stage_bytes,
                          .total_bytes = L.total};
        SUMO__CHECK(make_key(m, key, "seg/%d", attempt));
        /* Rank 0's own staging area is allocated with the rest; each peer allocates its own. */
        if (refused != SUMO_SUCCESS ||
            segment_make(&mech, L.total, 0, L.stage + stage_bytes, &s, m->err, m->errlen) != 0) {
            rec.code = refused != SUMO_SUCCESS ? refused : SUMO_ERR_SYSTEM;
            snprintf(rec.note, sizeof rec.note, "rank 0: %s", m->err);
            if (refused == SUMO_SUCCESS) snprintf(m->err, m->errlen, "%s", rec.note);
            /* A refusal stays this rank's message as it is (it names the variable), and the
             * first cause stays the message whatever the store does. */
            char scratch[NOTE_BYTES];
            meeting quiet = *m;
            quiet.err = scratch;
            quiet.errlen = sizeof scratch;
            meet_set(&quiet, key, &rec, sizeof rec);
            return (sumo_result)rec.code;
        }
        seg_header *h = (seg_header *)(void *)s.base;
        h->magic = SEG_MAGIC;
        h->nonce = s.nonce;
        set_views(t, s.base, &L, slot_bytes, stage_bytes);
        sumo__shm_ctl_init(t->shm.ctl, size);
        claim(t, m->err, m->errlen);
        rec.mech = mech;
        rec.fd = s.fd;
        rec.ino = s.ino;
        rec.dev = s.dev;
        rec.nonce = s.nonce;
        snprintf(rec.name, sizeof rec.name, "%s", s.name);
        verdict_record v = {.code = meet_set(m, key, &rec, sizeof rec)};
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
            } else if (a.code != SUMO_SUCCESS && a.retry && mech == MECH_MEMFD) {
                retry = true;
            } else if (a.code != SUMO_SUCCESS) {
                v.code = a.code;
                a.note[sizeof a.note - 1] = '\0';
                snprintf(v.note, sizeof v.note, "rank %d: %.180s", k, a.note);
            }
        }
        /* Every peer has mapped it, or will not: the descriptor and the name have served. */
        close(s.fd);
        segment_unlink(&s);
        v.retry = v.code == SUMO_SUCCESS && retry;
        sumo_result told = make_key(m, key, "verdict/%d", attempt);
        if (told == SUMO_SUCCESS) told = meet_set(m, key, &v, sizeof v);
        if (v.code == SUMO_SUCCESS && !v.retry && told == SUMO_SUCCESS) {
            t->mech = mech;
            return SUMO_SUCCESS;
        }
        drop_views(t);
        if (v.code != SUMO_SUCCESS) {
            snprintf(m->err, m->errlen, "%s", v.note);
            return (sumo_result)v.code;
        }
        if (told != SUMO_SUCCESS) return told;
        mech = MECH_NAMED;
        SUMO__LOG(t->base.log_level, SUMO__LOG_INFO,
                  "rank 0: a peer cannot open the memfd through /proc: a named object instead");
    }
}

/* Rank r > 0's part of one attempt: maps what rank 0 published, allocates its staging area
 * and claims its slot. */
static attach_record attach(shm_transport *t, const seg_record *rec)
{
    int size = t->base.size, me = t->base.rank;
    attach_record a = {.code = SUMO_SUCCESS, .pid = (int32_t)getpid()};
    layout L = layout_of(size, rec->stage_bytes, rec->slot_bytes);
    segment s = {.fd = -1};
    bool by_proc = false;
    if (rec->magic != SEG_MAGIC || rec->version != SEG_VERSION) {
        a.code = SUMO_ERR_MISMATCH;
        snprintf(a.note, sizeof a.note, "rank 0 runs another sumo (segment version %u)",
                 rec->version);
    } else if (rec->size != size) {
        a.code = SUMO_ERR_MISMATCH;
        snprintf(a.note, sizeof a.note, "rank %d was given size %d, rank 0 size %d", me, size,
                 rec->size);
    } else if (L.total != rec->total_bytes || rec->slot_bytes == 0 || rec->stage_bytes % PAGE) {
        a.code = SUMO_ERR_MISMATCH;
        snprintf(a.note, sizeof a.note, "rank 0's segment layout is not this library's");
    } else if (segment_open(rec->mech, rec->pid, rec->fd, rec->name, rec->ino, rec->dev, L.total,
                            &s, &by_proc, a.note, sizeof a.note) != 0) {
        a.code = SUMO_ERR_SYSTEM;
        a.retry = by_proc;
    } else if (((seg_header *)(void *)s.base)->magic != SEG_MAGIC ||
               ((seg_header *)(void *)s.base)->nonce != rec->nonce) {
        a.code = SUMO_ERR_SYSTEM;
        snprintf(a.note, sizeof a.note, "the segment holds another group's header");
    } else {
        set_views(t, s.base, &L, rec->slot_bytes, rec->stage_bytes);
        s.base = NULL; /* t holds the mapping now */
        size_t lo = L.stage + (size_t)me * rec->stage_bytes;
        int e = posix_fallocate(s.fd, (off_t)lo, (off_t)rec->stage_bytes);
        if (e != 0) {
            a.code = SUMO_ERR_SYSTEM;
            snprintf(a.note, sizeof a.note, "fallocate of its %" PRIu64 "-byte staging area "
                     "failed: %s", rec->stage_bytes, strerror(e));
        } else {
            a.code = claim(t, a.note, sizeof a.note);
        }
    }
    segment_drop(&s);
    if (a.code != SUMO_SUCCESS) drop_views(t);
    return a;
}

/* Rank r > 0: attaches to what rank 0 published and tells it how that went, until it says go. */
static sumo_result follow(shm_transport *t, const meeting *m)
{
    for (int attempt = 0;; attempt++) {
        char key[KEY_BYTES];
        seg_record rec;
        SUMO__CHECK(make_key(m, key, "seg/%d", attempt));
        SUMO__CHECK(meet_get(m, key, &rec, sizeof rec, "rank 0 making the segment", 0, 0));
        rec.name[sizeof rec.name - 1] = '\0';
        rec.note[sizeof rec.note - 1] = '\0';
        if (rec.code != SUMO_SUCCESS) {
            snprintf(m->err, m->errlen, "%s", rec.note);
            return (sumo_result)rec.code;
        }
        /* Where this process sees rank 0 (its pid and start time, as it wrote them), rank 0's
         * end ends the meeting. Over a memfd it must see it (it opens rank 0's descriptor
         * through /proc); over a name, rank 0 may live in another PID namespace. */
        bool alive = rec.start != 0 && still_running((pid_t)rec.pid, rec.start);
        if (!alive && rec.mech == MECH_MEMFD && rec.start != 0) {
            snprintf(m->err, m->errlen, "rank 0 (process %d), which published \"%s\", has "
                     "ended (or the key prefix was used before)", (int)rec.pid, key);
            return SUMO_ERR_PEER_FAILURE;
        }
        attach_record a = attach(t, &rec);
        SUMO__CHECK(make_key(m, key, "attach/%d/%d", attempt, t->base.rank));
        sumo_result r = meet_set(m, key, &a, sizeof a);
        if (r == SUMO_SUCCESS && a.code != SUMO_SUCCESS && !a.retry) {
            snprintf(m->err, m->errlen, "rank %d: %s", t->base.rank, a.note);
            return (sumo_result)a.code;
        }
        verdict_record v;
        if (r == SUMO_SUCCESS) r = make_key(m, key, "verdict/%d", attempt);
        if (r == SUMO_SUCCESS)
            r = meet_get(m, key, &v, sizeof v, "rank 0 hearing every rank",
                         alive ? (pid_t)rec.pid : 0, rec.start);
        if (r == SUMO_SUCCESS && v.code == SUMO_SUCCESS && !v.retry && a.code == SUMO_SUCCESS) {
            t->mech = rec.mech;
            return SUMO_SUCCESS;
        }
        drop_views(t);
        if (r != SUMO_SUCCESS) {
            /* Rank 0 may have died before removing the name: nobody else would. */
            if (rec.mech == MECH_NAMED && rec.name[0] == '/') shm_unlink(rec.name);
            return r;
        }
        if (!v.retry || v.code != SUMO_SUCCESS) {
            v.note[sizeof v.note - 1] = '\0';
            snprintf(m->err, m->errlen, "%s", v.note);
            return v.code != SUMO_SUCCESS ? (sumo_result)v.code : SUMO_ERR_INTERNAL;
        }
    }
}

sumo_result sumo__shm_transport_create(const sumo_shm_options *o, const sumo__env *env,
                                       sumo__transport **out,
                                       char *err, size_t errlen)
{
    int size = o->size;
    shm_transport *t = calloc(1, sizeof *t);
    if (t) {
        t->stage = calloc((size_t)size, sizeof *t->stage);
        t->pidfd = malloc(sizeof *t->pidfd * (size_t)size);
        t->pid = calloc((size_t)size, sizeof *t->pid);
        t->parts = calloc((size_t)size, sizeof *t->parts);
    }
    if (t == NULL || !t->stage || !t->pidfd || !t->pid || !t->parts) {
        snprintf(err, errlen, "out of memory creating the shm transport");
        if (t) transport_free(t);
        return SUMO_ERR_SYSTEM;
    }
    for (int r = 0; r < size; r++) t->pidfd[r] = -1;
    t->also = -1;
    double seconds = env->timeout_s;
    t->base = (sumo__transport){.ops = &shm_ops,
                                .rank = o->rank,
                                .size = size,
                                .timeout_ns = (int64_t)(seconds * 1e9),
                                .log_level = env->log_level,
                                .node_local_size = size,
                                .reach = SUMO__REACH_STAGED};
    meeting m = {.o = o, .deadline = sumo__now_ns() + t->base.timeout_ns, .seconds = seconds,
                 .err = err, .errlen = errlen};
    sumo_result r = o->rank == 0 ? lead(t, &m) : follow(t, &m);
    if (r == SUMO_SUCCESS && size > 1) {
        /* Every rank has mapped the segment and claimed its slot; the barrier publishes the
         * claims, within what is left of the creation's deadline. */
        int64_t left = m.deadline - sumo__now_ns();
        sumo__status quiet = {0};
        t->base.timeout_ns = left > 0 ? left : 1;
        t->base.status = &quiet;
        r = sumo__shm_barrier(&t->base, &t->shm);
        t->base.status = NULL;
        t->base.timeout_ns = (int64_t)(seconds * 1e9);
        if (r != SUMO_SUCCESS) snprintf(err, errlen, "%s", quiet.message);
    }
    if (r != SUMO_SUCCESS) {
        transport_free(t);
        return r;
    }
    if (size > 1) watch_start(t);
    *out = &t->base;
    return SUMO_SUCCESS;
}
