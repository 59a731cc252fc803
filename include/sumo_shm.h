/*
 * sumo between the processes of one machine without MPI: what `torchrun --nproc_per_node N`
 * starts. The processes meet once through a key-value store the caller already has (torch's
 * TCPStore, a file system, anything with set and a blocking get) and from then on move bytes
 * through shared memory of their own: the same collectives, algorithms and speed as the MPI
 * transport on one node, and buffers from sumo_mem_alloc reached directly by every process.
 *
 * The shared memory cannot outlive the processes: it is anonymous (memfd) where the peers can
 * open rank 0's descriptor through /proc, else a POSIX shared-memory object readable by this
 * user alone, removed as soon as every rank has mapped it (and on any failure). A process that
 * dies (killed, crashed) makes the peers waiting on it fail with SUMO_ERR_PEER_FAILURE within
 * a fraction of a second instead of at the deadline. Every process must live in the same PID
 * namespace (torchrun's do); a handle does not survive fork (use it in the process that made
 * it). One machine is one host name and one kernel boot id: a rank whose host name or boot id
 * is not rank 0's (ranks of two machines met through one store) fails with
 * SUMO_ERR_INVALID_USAGE, naming both hosts, and so does the group. sumo_comm_transport names
 * it "shm".
 *
 * Environment: SUMO_TIMEOUT bounds the creation as it bounds every collective;
 * SUMO_SHM_STAGE_BYTES sizes the staging areas (rank 0's value counts) when the options leave
 * it 0; SUMO_SHM_NAMED=1 on rank 0 skips the memfd and uses the named object (for testing the
 * fallback, or where /proc is known not to serve).
 */
#ifndef SUMO_SHM_TRANSPORT_H
#define SUMO_SHM_TRANSPORT_H

#include "sumo.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * The rendezvous the caller provides (torch.distributed.Store's set and get). Called only
 * during sumo_comm_create_shm, sumo_comm_shrink and sumo_store_agree, from the calling thread.
 * Values are at most a few hundred bytes.
 */
typedef struct sumo_store {
    size_t struct_size; /* sizeof(sumo_store) */
    void *ctx;
    /* Stores value under key (overwriting is never needed: every key is set once). */
    sumo_result (*set)(void *ctx, const char *key, const void *value, size_t bytes);
    /* Waits until key exists or deadline_ns (CLOCK_MONOTONIC, nanoseconds) passes, then
     * returns SUMO_ERR_TIMEOUT; copies at most *bytes of the value into value and sets *bytes
     * to the value's length. */
    sumo_result (*get)(void *ctx, const char *key, void *value, size_t *bytes,
                       int64_t deadline_ns);
    /* Optional (NULL: not offered), for sumo_store_agree (sumo_elastic.h): stores value under
     * key unless the key holds a value already, in one atomic step (torch's compare_set with an
     * empty expected value); SUMO_SUCCESS either way, and a get then says which value stands.
     * Called from whichever thread agrees. */
    sumo_result (*set_once)(void *ctx, const char *key, const void *value, size_t bytes);
    /* Optional (NULL: keys stay): deletes key; a key that is not there is no failure. A
     * communicator's meeting removes the keys that have served once every rank has read them,
     * so a job's store does not fill with them, the lost processes' among them. */
    sumo_result (*remove)(void *ctx, const char *key);
} sumo_store;

/* The most processes one communicator holds (each pair has a mailbox). */
#define SUMO_SHM_MAX_RANKS 256

typedef struct sumo_shm_options {
    size_t struct_size;       /* sizeof(sumo_shm_options): lets the struct grow */
    int rank;                 /* 0 .. size - 1, each once */
    int size;                 /* the same on every rank, 1 .. SUMO_SHM_MAX_RANKS */
    const sumo_store *store;  /* the same store (or views of it) on every rank */
    const char *key_prefix;   /* unique per communicator within the store, e.g. "sumo/0/":
                                 keys are this prefix and a suffix of up to 16 bytes, 255 in
                                 all; a prefix used before may meet a stale group. Once
                                 every rank has met, rank 0 removes the keys that served
                                 (with the store's remove); the verdict's key stays */
    size_t stage_bytes;       /* bytes of each rank's staging area, 8 KiB .. 1 GiB, a multiple
                                 of 4096; 0: SUMO_SHM_STAGE_BYTES or 512 KiB. Rank 0's counts */
    char *error;              /* optional (NULL: none): why the creation failed, the detail a
                                 handle would otherwise carry ("" on success) */
    size_t error_bytes;
} sumo_shm_options;

/* struct_size set, everything else 0 or NULL: the caller fills rank, size, store and
 * key_prefix. */
SUMO_API sumo_result sumo_shm_options_default(sumo_shm_options *options);

/*
 * Collective over options->size processes: every rank calls it with its own rank, bounded by
 * SUMO_TIMEOUT (default 300 s). SUMO_ERR_INVALID_ARGUMENT for options this rank cannot use
 * (an unknown struct_size, a rank out of range, no store); SUMO_ERR_MISMATCH when the ranks
 * disagree on the size; SUMO_ERR_TIMEOUT when a rank or the store does not answer in time;
 * SUMO_ERR_SYSTEM when the shared memory cannot be made or mapped on some rank (every rank
 * that got that far fails alike). The detail goes to options->error, and to stderr with
 * SUMO_DEBUG=WARN. Destroy the handle with sumo_comm_destroy: that never waits for the peers,
 * so a process may leave before or long after the others.
 */
SUMO_API sumo_result sumo_comm_create_shm(const sumo_shm_options *options, sumo_comm **out);

/*
 * A store in a directory, for processes of one machine that have none of their own (a C
 * program started by srun or by a script; `sumo train` under srun uses it): each key is a
 * file, written whole and renamed into place, and a get polls for it. The directory is made
 * (mode 0700) when missing; one that exists must be a directory of this user's that no one
 * else may enter (SUMO_ERR_INVALID_ARGUMENT otherwise: whoever can write there could answer
 * the meeting). Every rank creates its own handle on the same directory; SUMO_ERR_SYSTEM when
 * it cannot be made or read. Thread-safe: the handle holds nothing that changes.
 */
SUMO_API sumo_result sumo_store_create_dir(const char *dir, sumo_store **store);
/* Frees a store from sumo_store_create_dir (NULL: nothing). With remove_files, also deletes
 * the keys' files and then the directory, unless something else is in it: do that on one rank
 * once every rank is past sumo_comm_create_shm (after a collective on the new communicator),
 * or the others may still be reading. SUMO_ERR_INVALID_ARGUMENT for a store made otherwise;
 * SUMO_ERR_SYSTEM when a file could not be removed (the handle is freed all the same). */
SUMO_API sumo_result sumo_store_destroy_dir(sumo_store *store, int remove_files);

#ifdef __cplusplus
}
#endif

#endif
