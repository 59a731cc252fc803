/*
 * The shm transport's memory (transport_shm.c): the control segment's layout, and the
 * operating system's objects that hold it and every part of memory from mem_alloc.
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
 * the name (shm_meeting.c); memory from mem_alloc uses whichever the control segment uses.
 * Each rank allocates its own parts up front (fallocate), so a full /dev/shm or a memory limit
 * is an error at creation instead of a SIGBUS in a collective, and pages land on the NUMA node
 * of the rank that uses them.
 */
#ifndef SUMO_SHM_SEGMENT_H
#define SUMO_SHM_SEGMENT_H

#include "common/common.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#define SUMO__SHM_PAGE ((size_t)4096)
/* Chunks in flight per direction: the sender fills some while the receiver empties others. */
#define SUMO__SHM_NSLOT 4u

/* How a segment is made (and so opened): an anonymous memfd, or a named POSIX object. */
enum { SUMO__SHM_MEMFD = 1, SUMO__SHM_NAMED = 2 };

/* ---- the control segment's layout (every rank computes it alike) ---------------------------- */

typedef struct sumo__shm_rank_info {
    /* Rung (incremented, then woken) by whoever lets this rank's sendrecv progress. */
    _Atomic uint32_t bell;
    /* Claimed once when the rank attaches: two processes claiming one rank are caught. */
    _Atomic int32_t pid;
    /* The process's start time (/proc/<pid>/stat, ticks since boot; 0: unknown). */
    uint64_t start;
} __attribute__((aligned(SUMO__CACHELINE))) sumo__shm_rank_info;

typedef struct sumo__shm_slot_hdr {
    uint64_t total;  /* the message's bytes */
    uint64_t offset; /* where this chunk starts in it */
} sumo__shm_slot_hdr;

/* src -> dst. head and hdr are written by the sender only, tail by the receiver only. */
typedef struct sumo__shm_mailbox {
    _Atomic uint32_t head;
    sumo__shm_slot_hdr hdr[SUMO__SHM_NSLOT];
    _Atomic uint32_t tail __attribute__((aligned(SUMO__CACHELINE)));
} __attribute__((aligned(SUMO__CACHELINE))) sumo__shm_mailbox;

/* Byte offsets in the segment: a header (the meeting's), the control block of shm.h (at a
 * page), rank infos, mailboxes, the ranks' boards, slots, then the staging areas, each starting
 * a page. */
typedef struct sumo__shm_layout {
    size_t ctl, info, boxes, board, slots, stage, total;
} sumo__shm_layout;

static inline size_t sumo__shm_round_up(size_t x, size_t to) { return (x + to - 1) / to * to; }

sumo__shm_layout sumo__shm_layout_of(int size, size_t stage_bytes, size_t slot_bytes);
/* A mailbox slot's bytes for size ranks: smaller as the size^2 mailboxes grow. */
size_t sumo__shm_slot_bytes_for(int size);

/* ---- segments ------------------------------------------------------------------------------- */

typedef struct sumo__shm_segment {
    int fd;
    unsigned char *base;
    size_t bytes;
    uint64_t ino, dev, nonce;
    char name[64]; /* SUMO__SHM_NAMED: the name while it exists, else "" */
} sumo__shm_segment;

/* The named object's name: its maker's pid and a random nonce, so no two collide and the
 * tests can tell whose a leftover is. */
void sumo__shm_segment_name(char name[64], pid_t pid, uint64_t nonce);

/*
 * Makes an owner-only segment of bytes and maps it; [fill_lo, fill_hi) is allocated now, by
 * this process. *mech may turn from memfd to named where memfds cannot serve. Returns 0, or an
 * errno with what failed in err.
 */
int sumo__shm_segment_make(int *mech, size_t bytes, size_t fill_lo, size_t fill_hi,
                           sumo__shm_segment *s, char *err, size_t errlen);

/*
 * Maps a segment another process made, through its descriptor (memfd) or its name, after
 * checking it is that very object (inode, device, size): a stale record cannot map something
 * else. The descriptor stays open in s->fd for the caller's fallocate. *by_proc is set when the
 * failure was opening the memfd through /proc (a named object may still serve).
 */
int sumo__shm_segment_open(int mech, pid_t pid, int fd, const char *name, uint64_t ino,
                           uint64_t dev, size_t bytes, sumo__shm_segment *s, bool *by_proc,
                           char *err, size_t errlen);

/* Removes s's name, if it has one (the mappings live on). */
void sumo__shm_segment_unlink(sumo__shm_segment *s);
/* Unmaps, closes and unlinks whatever s holds. */
void sumo__shm_segment_drop(sumo__shm_segment *s);

#endif
