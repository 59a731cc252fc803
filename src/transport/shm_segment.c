#include "transport/shm_segment.h"
#include "transport/shm.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#define SLOT_MAX ((size_t)64 * 1024)
#define SLOT_MIN ((size_t)1024)
/* What the size^2 mailboxes' slots may take together before the slots shrink; they are
 * touched lazily, so only the directions in use cost memory. */
#define SLOTS_BUDGET ((size_t)16 << 20)

/* ---- the control segment's layout ----------------------------------------------------------- */

sumo__shm_layout sumo__shm_layout_of(int size, size_t stage_bytes, size_t slot_bytes)
{
    size_t p = (size_t)size;
    sumo__shm_layout L;
    L.ctl = SUMO__SHM_PAGE;
    L.info = sumo__shm_round_up(L.ctl + sumo__shm_ctl_bytes(size), SUMO__CACHELINE);
    L.boxes = L.info + p * sizeof(sumo__shm_rank_info);
    L.board = sumo__shm_round_up(L.boxes + p * p * sizeof(sumo__shm_mailbox), SUMO__CACHELINE);
    L.slots = sumo__shm_round_up(L.board + p * SUMO__BOARD_BYTES, SUMO__SHM_PAGE);
    L.stage = sumo__shm_round_up(L.slots + p * p * SUMO__SHM_NSLOT * slot_bytes, SUMO__SHM_PAGE);
    L.total = L.stage + p * stage_bytes;
    return L;
}

size_t sumo__shm_slot_bytes_for(int size)
{
    size_t slot = SLOT_MAX, dirs = (size_t)size * (size_t)size;
    while (slot > SLOT_MIN && dirs * SUMO__SHM_NSLOT * slot > SLOTS_BUDGET) slot /= 2;
    return slot;
}

/* ---- segments ------------------------------------------------------------------------------- */

static uint64_t fresh_nonce(void)
{
    uint64_t n = 0;
    if (getrandom(&n, sizeof n, GRND_NONBLOCK) != (ssize_t)sizeof n)
        n = (uint64_t)sumo__now_ns() * 0x9e3779b97f4a7c15ull ^ (uint64_t)getpid();
    return n;
}

void sumo__shm_segment_name(char name[64], pid_t pid, uint64_t nonce)
{
    snprintf(name, 64, "/sumo.%d.%016" PRIx64, (int)pid, nonce);
}

void sumo__shm_segment_unlink(sumo__shm_segment *s)
{
    if (s->name[0]) shm_unlink(s->name);
    s->name[0] = '\0';
}

void sumo__shm_segment_drop(sumo__shm_segment *s)
{
    if (s->base) munmap(s->base, s->bytes);
    if (s->fd >= 0) close(s->fd);
    sumo__shm_segment_unlink(s);
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

int sumo__shm_segment_make(int *mech, size_t bytes, size_t fill_lo, size_t fill_hi,
                           sumo__shm_segment *s, char *err, size_t errlen)
{
    *s = (sumo__shm_segment){.fd = -1, .bytes = bytes, .nonce = fresh_nonce()};
    const char *step = "memfd_create";
    if (*mech == SUMO__SHM_MEMFD) {
        s->fd = memfd_create("sumo-shm", MFD_CLOEXEC);
        /* The peers open it through /proc with the owner's rights: keep those the owner's. */
        if (s->fd >= 0 && (fchmod(s->fd, 0600) != 0 || !proc_reopens(s->fd))) {
            close(s->fd);
            s->fd = -1;
        }
        if (s->fd < 0) *mech = SUMO__SHM_NAMED;
    }
    if (*mech == SUMO__SHM_NAMED) {
        step = "shm_open";
        sumo__shm_segment_name(s->name, getpid(), s->nonce);
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
        sumo__shm_segment_drop(s);
        return e;
    }
    s->ino = (uint64_t)st.st_ino;
    s->dev = (uint64_t)st.st_dev;
    return 0;
}

int sumo__shm_segment_open(int mech, pid_t pid, int fd, const char *name, uint64_t ino,
                           uint64_t dev, size_t bytes, sumo__shm_segment *s, bool *by_proc,
                           char *err, size_t errlen)
{
    *s = (sumo__shm_segment){.fd = -1, .bytes = bytes};
    *by_proc = false;
    char path[96];
    if (mech == SUMO__SHM_MEMFD) snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)pid, fd);
    else snprintf(path, sizeof path, "%s", name);
    s->fd = mech == SUMO__SHM_MEMFD ? open(path, O_RDWR | O_CLOEXEC)
                                    : shm_open(path, O_RDWR | O_CLOEXEC, 0);
    if (s->fd < 0) {
        int e = errno;
        *by_proc = mech == SUMO__SHM_MEMFD;
        snprintf(err, errlen, "cannot open %s%s: %s", mech == SUMO__SHM_MEMFD ? "" : "/dev/shm",
                 path, strerror(e));
        return e;
    }
    struct stat st;
    if (fstat(s->fd, &st) != 0 || (uint64_t)st.st_ino != ino || (uint64_t)st.st_dev != dev ||
        (uint64_t)st.st_size != bytes) {
        snprintf(err, errlen, "%s is not the segment its owner made (a stale key prefix?)", path);
        sumo__shm_segment_drop(s);
        return EINVAL;
    }
    /* Inode, size and nonce all come from the store record, which anyone who reaches the
     * store can write: only the kernel's word on the object's owner and mode tells a peer's
     * segment from one another user planted there for this rank to write into. */
    if (!S_ISREG(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077) != 0) {
        snprintf(err, errlen, "%s%s belongs to uid %u with mode %03o, not to this user (uid %u) "
                 "alone: refused, since a segment another user can reach is not a peer's",
                 mech == SUMO__SHM_MEMFD ? "" : "/dev/shm", path, (unsigned)st.st_uid,
                 (unsigned)(st.st_mode & 0777), (unsigned)geteuid());
        sumo__shm_segment_drop(s);
        return EACCES;
    }
    s->base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd, 0);
    if (s->base == MAP_FAILED) {
        int e = errno;
        s->base = NULL;
        snprintf(err, errlen, "mmap of %zu bytes of %s failed: %s", bytes, path, strerror(e));
        sumo__shm_segment_drop(s);
        return e;
    }
    return 0;
}
