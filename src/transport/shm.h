/*
 * Synchronisation for ranks that share memory, private to the transports that have it: the
 * threads transport (one heap), the MPI transport on one node (an MPI-3 shared window) and the
 * shm transport (processes of one machine, a segment of its own). The control block lives in
 * that shared memory; waits spin briefly, then sleep on a futex (shared, so it works across
 * processes), and every wait is bounded by the transport's deadline and the group's abort flag.
 */
#ifndef SUMO_SHM_H
#define SUMO_SHM_H

#include "transport/transport.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

/* One rank's slots for announcements (the collectives' agreement records), a cache line each.
 * Announcement g uses payload[g % 2]: a rank can only write announcement g + 2 after every
 * rank arrived at announcement g + 1, so nobody still reads the slot it overwrites, and no
 * collective needs a trailing barrier to protect the records. */
typedef struct sumo__shm_desc {
    unsigned char payload[2][SUMO__ANNOUNCE_BYTES];
    /* Set once when the rank has left the group (its handle was destroyed): a wait on this
     * rank, or a barrier it can no longer reach, fails at once. Waits on other ranks go on, so
     * a rank that leaves after its last collective does not fail peers still finishing it. */
    _Atomic uint32_t gone __attribute__((aligned(SUMO__CACHELINE)));
    /* 1 while the rank is inside a collective that may write its peers' buffers (threads,
     * buffers from sumo_mem_alloc): a survivor restoring its output after a failure waits
     * for it to leave (sumo__shm_settle). */
    _Atomic uint32_t busy;
    /* Set by a peer whose shm->watch saw this rank's process end: a peer that cannot see it
     * (another PID namespace) learns it here. */
    _Atomic uint32_t dead;
    /* The shrink round this rank has entered (0: none), published after its value. */
    _Atomic uint32_t shrink_round;
    uint64_t shrink_value;
} __attribute__((aligned(SUMO__CACHELINE))) sumo__shm_desc;

typedef struct sumo__shm_ctl {
    _Atomic uint32_t arrived __attribute__((aligned(SUMO__CACHELINE)));
    _Atomic uint32_t generation __attribute__((aligned(SUMO__CACHELINE)));
    _Atomic uint32_t sleepers;
    /* 0 while the group is healthy, else 1 + the rank that aborted it. */
    _Atomic uint32_t abort_flag __attribute__((aligned(SUMO__CACHELINE)));
    /* 0 while every rank is present, else 1 + the first rank that left (desc[r].gone). */
    _Atomic uint32_t departed;
    /* Shrinks (sumo__shm_shrink_agree): the round decided last, the claim of the rank deciding
     * the next ((round << 11) | (rank + 1)), and the verdict with what its decider hands over
     * (the threads transport: the new group's handles). */
    _Atomic uint32_t decided_round __attribute__((aligned(SUMO__CACHELINE)));
    _Atomic uint32_t claim;
    sumo__shrink_verdict verdict;
    void *handoff;
    int32_t size;
    sumo__shm_desc desc[]; /* size entries */
} sumo__shm_ctl;

typedef struct sumo__shm {
    sumo__shm_ctl *ctl;
    int rank;
    int size;
    /* Threads: a peer's buffer pointer can be dereferenced here (zero-copy collectives). */
    bool same_address_space;
    /* Processes: stage[r] is rank r's staging area (stage_bytes), mapped in this process. */
    unsigned char **stage;
    size_t stage_bytes;
    /* Spins before sleeping: short when the ranks outnumber the cores; 0 until the first wait
     * sets it from the waiting thread's binding (shm.c). */
    uint32_t spin_limit;
    /* Announcements this rank made: picks the payload slot (every rank counts alike). */
    uint32_t announces;
    /* Shrink rounds this rank entered on the group (sumo__shm_shrink_agree). */
    uint32_t shrinks;
    /* Optional (NULL for threads and MPI, where one process holds every rank or the launcher
     * ends the job): processes that nothing else watches (shm_liveness.c) look at each sleep
     * slice of a wait for a rank that died. Returns the rank whose death makes the wait on
     * peer (-1: on every rank) hopeless, with how it was seen in why, or -1. */
    int (*watch)(struct sumo__shm *shm, int peer, char *why, size_t why_bytes);
    void *watch_ctx;
} sumo__shm;

/* Whether [address, address + bytes) lies inside a region of len bytes at lo, written so that no
 * sum can overflow. */
static inline bool sumo__shm_range_inside(uint64_t lo, uint64_t len, uint64_t address,
                                          uint64_t bytes)
{
    return address >= lo && address - lo <= len && bytes <= len - (address - lo);
}

/*
 * Memory from mem_alloc that every rank maps (the MPI transport's shared windows, the shm
 * transport's segments), in a list each transport keeps: per rank, where its part lives in its
 * own process (the address its collectives announce), its length, and this process's mapping
 * of it. A transport that holds more per region (a window) puts this first in its own record.
 */
typedef struct sumo__shm_region {
    struct sumo__shm_region *next;
    unsigned char *user; /* this rank's part, as the caller got it */
    /* Per rank; NULL where nothing is shared (the MPI transport across nodes). */
    uint64_t *owner_address;
    size_t *owner_bytes;
    unsigned char **mapped;
} sumo__shm_region;

/* Allocates g's per-rank tables, zeroed; false (none left allocated) when out of memory. */
SUMO__PLUGIN_API bool sumo__shm_region_tables(sumo__shm_region *g, int size);
/* Frees g's per-rank tables (the mappings are the transport's to undo). */
SUMO__PLUGIN_API void sumo__shm_region_tables_free(sumo__shm_region *g);
/* A transport's shares: whether [buf, buf + bytes) of this rank lies in one of list's regions. */
SUMO__PLUGIN_API bool sumo__shm_region_shares(const sumo__shm_region *list, int rank, const void *buf, size_t bytes);
/* A transport's peer_buffer: this process's mapping of address in rank's process, or NULL. */
SUMO__PLUGIN_API void *sumo__shm_region_peer(const sumo__shm_region *list, int rank, uint64_t address);
/* Unlinks from *list the region the caller got as user and returns it; NULL when none. */
SUMO__PLUGIN_API sumo__shm_region *sumo__shm_region_take(sumo__shm_region **list, const void *user);

SUMO__PLUGIN_API size_t sumo__shm_ctl_bytes(int size);
/* Initialises a zeroed control block for size ranks (done by one rank before the others use it). */
SUMO__PLUGIN_API void sumo__shm_ctl_init(sumo__shm_ctl *ctl, int size);
SUMO__PLUGIN_API uint32_t sumo__shm_default_spin_limit(int ranks_sharing_cores);

/* Blocks until *word != value. Fails with TIMEOUT at the transport's deadline (raising the
 * group's abort flag), or PEER_FAILURE when the abort flag is raised by someone else or when
 * the rank the change must come from has left (peer; -1 when any rank's departure makes the
 * change impossible, as for a barrier) or, where shm->watch is set, died. */
sumo_result sumo__shm_wait_change(sumo__transport *tp, sumo__shm *shm, _Atomic uint32_t *word,
                                  uint32_t value, int peer, int64_t deadline_ns, const char *what);
/* Wakes every sleeper on word (only issues the system call when someone sleeps). */
void sumo__shm_wake(sumo__shm *shm, _Atomic uint32_t *word);

SUMO__PLUGIN_API sumo_result sumo__shm_barrier(sumo__transport *tp, sumo__shm *shm);
/* The transports' announce over the control block: one barrier. */
SUMO__PLUGIN_API sumo_result sumo__shm_announce(sumo__transport *tp, sumo__shm *shm,
                                                const void *record, void *all, size_t bytes);
/*
 * The agreement of a shrink: every rank still here calls it with the same round (1 for the
 * first shrink of this group, one more after each that failed to make the new group) and a
 * value. One of them, the lowest rank not dead, decides once every rank has entered the round
 * or is dead (left, or its process ended, as shm->watch sees it) or the deadline has passed:
 * the members are the ranks that entered and are alive, the value their smallest. A decider that
 * dies before publishing is replaced (its claim is taken over), so the agreement survives a
 * further failure while it runs; every rank that returns SUMO_SUCCESS holds the same verdict.
 * decide (may be NULL) runs on the decider before the verdict is published, and what it puts in
 * *handoff reaches every member in *handoff. SUMO_ERR_PEER_FAILURE when this rank was left out
 * (it came after the deadline), SUMO_ERR_TIMEOUT when no verdict came in time. The abort flag
 * and departures of the old group do not stop it: they are why it runs.
 */
sumo_result sumo__shm_shrink_agree(sumo__transport *tp, sumo__shm *shm, uint32_t round,
                                   uint64_t value, int64_t deadline_ns,
                                   sumo_result (*decide)(void *ctx, const sumo__shrink_verdict *v,
                                                         void **handoff),
                                   void *ctx, sumo__shrink_verdict *out, void **handoff);

/* The transports' busy and settle (transport.h) over the control block: a rank that left, or
 * that shm->watch sees dead, writes nothing more. */
void sumo__shm_busy(sumo__shm *shm, bool busy);
sumo_result sumo__shm_settle(sumo__transport *tp, sumo__shm *shm);

/* Raises the abort flag on behalf of rank and wakes everyone. */
SUMO__PLUGIN_API void sumo__shm_abort(sumo__shm *shm, int rank);
/* Marks rank as gone (it leaves between collectives) and wakes everyone. */
SUMO__PLUGIN_API void sumo__shm_depart(sumo__shm *shm, int rank);

#endif
