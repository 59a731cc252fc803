/*
 * The transport layer: how the ranks of a group reach each other. It moves bytes and knows
 * nothing of reductions; the collectives (src/collectives/) are written once over this
 * interface and never look behind it.
 *
 * A transport is one file that fills a sumo__transport_ops table, plus a header declaring its
 * constructor (threads.h, transport_mpi.h). What it must provide:
 *   sendrecv   point to point, both directions at once (any transport, any distance);
 *   announce   every rank publishes a small record and reads everyone's (the collectives'
 *              agreement rides on it); a rank may announce again as soon as this returns;
 *   barrier    every rank has arrived;
 *   abort      tell the peers at once that this rank failed, so they stop waiting;
 *   destroy    leave the group (peers still waiting on this rank fail fast).
 * What it may provide, and the collectives use when present:
 *   reach      how far a rank can touch its peers' memory (below): peer_buffer maps a peer's
 *              published address into this process (same address space), stage gives the
 *              ranks' staging areas in memory every rank maps (processes on one node);
 *   offload    the peer library's own allreduce (MPI_Allreduce today, NCCL's tomorrow),
 *              asked per call whether it supports a dtype and op, the way NCCL keeps its
 *              collective offload (ncclCollNet) apart from its byte transport (ncclNet);
 *   board      a small area per rank every rank maps, for what the collectives publish beside
 *              an announcement (the handles of device buffers shared between processes);
 *   mem_alloc  memory every peer maps (MPI_Win_allocate_shared, ncclMemAlloc): a STAGED
 *              transport then reaches buffers in it directly, and `shares` tells the
 *              collectives which of a rank's buffers are such, so that a call whose buffers
 *              are shared on every rank skips the staging copies;
 *   sendrecv_working  sendrecv with the caller's work done while the bytes move (MPI: between
 *              the polls of the exchange), so a pipelined collective hides its arithmetic.
 *
 * Every wait inside a transport is bounded by the group's deadline (timeout_ns from the start
 * of the wait). A wait that expires aborts the group where the transport can (so waiting peers
 * leave with SUMO_ERR_PEER_FAILURE instead of waiting out their own deadline) and returns
 * SUMO_ERR_TIMEOUT. Failures are recorded in the status the communicator owns.
 */
#ifndef SUMO_TRANSPORT_H
#define SUMO_TRANSPORT_H

#include "common/common.h"

/* The largest record announce carries: one cache line per rank. */
#define SUMO__ANNOUNCE_BYTES 64
/* Bytes of a rank's board (the board op). */
#define SUMO__BOARD_BYTES 512

/* A rank's error state: set by the first failure, read by sumo_comm_error_message. Owned by
 * the communicator; the transport reports into it. */
typedef struct sumo__status {
    /* Set after a timeout, a peer failure or an internal error: every later call fails. */
    bool broken;
    char message[256];
} sumo__status;

/* How far a rank reaches into its peers' memory. */
typedef enum sumo__reach {
    SUMO__REACH_NONE = 0,   /* messages only (across machines) */
    SUMO__REACH_STAGED,     /* every rank maps every rank's staging area (processes, one node) */
    SUMO__REACH_DIRECT,     /* peers' buffers are addressable here (threads of one process) */
} sumo__reach;

typedef struct sumo__transport sumo__transport;

/* The survivors of a shrink (sumo_comm_shrink), as a set of the old group's ranks. */
#define SUMO__SHRINK_WORDS (1024 / 64)
typedef struct sumo__shrink_verdict {
    uint32_t round;
    uint64_t value; /* the smallest value a member entered with */
    uint64_t members[SUMO__SHRINK_WORDS];
    int size;       /* members in it */
    int rank;       /* the caller's place among them */
} sumo__shrink_verdict;

static inline bool sumo__shrink_member(const sumo__shrink_verdict *v, int r)
{
    return (v->members[r / 64] >> (r % 64)) & 1u;
}

/* What a shrink is asked for: the caller's value, and where a transport whose ranks meet
 * through a store (shm) makes the new group. */
struct sumo_store;
typedef struct sumo__shrink_args {
    uint64_t value;
    const struct sumo_store *store;
    const char *key_prefix;
    char *err; /* why it failed, when the transport's status cannot say (no group was made) */
    size_t errlen;
} sumo__shrink_args;

typedef struct sumo__transport_ops {
    const char *name;
    /*
     * Send sbytes from sbuf to rank dst and receive rbytes into rbuf from rank src, both at
     * once, so a ring or a pairwise exchange cannot deadlock. dst or src = -1 skips that
     * direction. Returns when rbuf is filled and sbuf may be reused.
     */
    sumo_result (*sendrecv)(sumo__transport *tp, const void *sbuf, size_t sbytes, int dst,
                            void *rbuf, size_t rbytes, int src);
    /* Optional (sumo__sendrecv_working, its only caller, runs sendrecv and then the work
     * without it). sendrecv, with work done while the bytes move: between polls of the
     * exchange, work(ctx) is called until it returns false (nothing left). It may return with
     * work left, which the caller finishes. The work must not touch rbuf or sbuf. */
    sumo_result (*sendrecv_working)(sumo__transport *tp, const void *sbuf, size_t sbytes,
                                    int dst, void *rbuf, size_t rbytes, int src,
                                    bool (*work)(void *ctx), void *ctx);
    /* all[r*bytes .. (r+1)*bytes) = rank r's record, for every r (bytes <= SUMO__ANNOUNCE_BYTES).
     * Synchronising: it returns only once every rank has announced. */
    sumo_result (*announce)(sumo__transport *tp, const void *record, void *all, size_t bytes);
    sumo_result (*barrier)(sumo__transport *tp);
    /* Rank's buffer at the address it announced, usable here: any address on
     * SUMO__REACH_DIRECT; on SUMO__REACH_STAGED only one that `shares` accepted on its owner. */
    void *(*peer_buffer)(sumo__transport *tp, int rank, uint64_t address);
    /* Optional (NULL: nothing is shared beyond the reach). Whether bytes at buf, on this rank,
     * lie in memory from mem_alloc, which every peer maps. */
    bool (*shares)(sumo__transport *tp, const void *buf, size_t bytes);
    /* Optional, both or neither. Collective: every rank calls them in the same order (the
     * communicator agrees first), each with its own size; mem_free takes what mem_alloc of the
     * same rank gave. A failure leaves nothing allocated on this rank and the communicator
     * usable (SUMO__FAIL_TOGETHER); the communicator agrees on every rank's outcome after. */
    sumo_result (*mem_alloc)(sumo__transport *tp, size_t bytes, void **ptr);
    sumo_result (*mem_free)(sumo__transport *tp, void *ptr);
    /* SUMO__REACH_STAGED only: rank's staging area (tp->stage_bytes), mapped here. */
    unsigned char *(*stage)(sumo__transport *tp, int rank);
    /* Optional, SUMO__REACH_STAGED only: rank's board, SUMO__BOARD_BYTES in memory every rank
     * maps, written by that rank alone, ordered for its peers by the next announce: where a
     * collective publishes what does not fit an announcement (the handles of buffers its
     * kernels share between processes, collectives/imports.h). The transport never reads it. */
    unsigned char *(*board)(sumo__transport *tp, int rank);
    /* Raises the group's abort so peers waiting on anything fail now (no-op where the
     * transport cannot reach them: they then fail at their deadline). */
    void (*abort)(sumo__transport *tp);
    /* Marks this rank as gone so peers waiting on it fail fast, then frees the rank's state.
     * Returns SUMO_SUCCESS, or why the peers could not be met to free what they share (which
     * is then left allocated: the caller should end the job). */
    sumo_result (*destroy)(sumo__transport *tp);
    /* Optional (NULL: the transport cannot shrink). Collective over the ranks still here after
     * a failure: they agree on who they are (shm.h's sumo__shm_shrink_agree) and make a new
     * group of themselves, ordered as before, in *out; *verdict says who. The old group is
     * left as it was, for the caller to destroy. */
    sumo_result (*shrink)(sumo__transport *tp, const sumo__shrink_args *args,
                          sumo__transport **out, sumo__shrink_verdict *verdict);
    /* Optional: whether sendrecv moves buffers of the named kernel memory besides the host's
     * (a transport over NCCL moves "cuda"). */
    bool (*carries)(sumo__transport *tp, const char *memory);
    /* Optional, both or neither (NULL: a failed collective's output cannot be restored, since
     * a peer may still be writing into it). busy publishes whether this rank is inside a
     * collective, where it may write its peers' buffers; settle, after a failure, waits until
     * no rank still alive is (each dead one stopped writing when it died), bounded by the
     * deadline. */
    void (*busy)(sumo__transport *tp, bool busy);
    sumo_result (*settle)(sumo__transport *tp);
} sumo__transport_ops;

/* A peer library's own reduction, for the sizes where it beats sumo's point-to-point ones. */
typedef struct sumo__offload_ops {
    const char *name;
    /* Whether allreduce below handles this dtype and op (SUMO_OP_SUM, SUMO_OP_AVERAGE, ...). */
    bool (*reduce_support)(const sumo__transport *tp, sumo_dtype dtype, sumo_op op);
    /* Bounded by the deadline like everything else; sendbuf == recvbuf is in place. */
    sumo_result (*allreduce)(sumo__transport *tp, const void *sendbuf, void *recvbuf,
                             size_t count, sumo_dtype dtype, sumo_op op);
} sumo__offload_ops;

struct sumo__transport {
    const sumo__transport_ops *ops;
    const sumo__offload_ops *offload; /* NULL when the transport has none */
    int rank;
    int size;
    int64_t timeout_ns;
    int log_level;
    /* Ranks per node when the ranks are packed by node in equal groups (MPI shared-memory
     * split), else 0; the threads transport is one node. */
    int node_local_size;
    sumo__reach reach;
    size_t stage_bytes; /* SUMO__REACH_STAGED: bytes of each rank's staging area */
    /* Where failures are recorded: the communicator's (NULL before one wraps the transport:
     * failures are then only logged). */
    sumo__status *status;
    /* Set before destroy at the end of the process: leave without meeting the peers (a peer
     * may still be busy, saving a checkpoint; what the ranks share is released when the
     * process ends, e.g. by MPI_Finalize, which waits for every rank however long it takes). */
    bool leaving_process;
    /* Which half of the staging areas holds a call's first chunk (sumo__staging.parity): 0
     * or 1, the same on every rank, as every rank makes the same calls. A small Adasum call
     * that ends without a barrier flips it (gram.c, run_small): peers may still be reading
     * the half it used when this rank copies its next call's input ahead of the agreement. */
    unsigned stage_parity;
    /* Every call must run on the thread that made it (MPI below MPI_THREAD_MULTIPLE, where
     * MPI from a second thread corrupts the library's matching while the caller's thread
     * makes MPI calls of its own): an asynchronous request then runs to completion when it
     * is started, instead of on the progress thread. */
    bool caller_thread_only;
};

/*
 * Records the detail of a failure in tp->status (and the debug log); a failure that leaves
 * this rank out of step with its peers (TIMEOUT, PEER_FAILURE, INTERNAL, SYSTEM) also marks
 * the status broken and aborts the group. Returns code.
 */
SUMO__PLUGIN_API sumo_result sumo__transport_fail(sumo__transport *tp, sumo_result code,
                                                  const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
#define SUMO__FAIL(tp, code, ...) sumo__transport_fail((tp), (code), __FILE__, __LINE__, __VA_ARGS__)
/* A failure every rank of the group reached together, in step (a collective allocation that
 * failed somewhere, as every rank learned): recorded, but the communicator stays usable. */
SUMO__PLUGIN_API sumo_result sumo__transport_fail_together(sumo__transport *tp,
                                                           sumo_result code, const char *file,
                                                           int line, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
#define SUMO__FAIL_TOGETHER(tp, code, ...) \
    sumo__transport_fail_together((tp), (code), __FILE__, __LINE__, __VA_ARGS__)

/* A piece of work sumo__sendrecv_working runs while the bytes move: one slice per call,
 * false once nothing is left. Slices of tens of microseconds keep the exchange polled. */
typedef bool (*sumo__work_fn)(void *ctx);

/* sendrecv with work overlapped where the transport can (sendrecv_working), else the
 * exchange and then the work. The work runs to its end either way, also when the exchange
 * fails (so its state is left complete), and the exchange's status is returned. */
sumo_result sumo__sendrecv_working(sumo__transport *tp, const void *sbuf, size_t sbytes, int dst,
                                   void *rbuf, size_t rbytes, int src, sumo__work_fn work,
                                   void *ctx);

static inline bool sumo__transport_broken(const sumo__transport *tp)
{
    return tp->status != NULL && tp->status->broken;
}

#endif
