/*
 * The transport layer moves bytes between the ranks of a group and knows nothing of
 * reductions. Two transports implement it: threads (ranks are threads of one process) and mpi
 * (ranks are MPI processes). Collectives are written once over this interface.
 *
 * Every wait inside a transport is bounded by the group's deadline (timeout_ns from the start
 * of the wait). A wait that expires marks the transport broken, raises the group's abort flag
 * where the transport has one (so waiting peers leave with SUMO_ERR_PEER_FAILURE instead of
 * waiting out their own deadline) and returns SUMO_ERR_TIMEOUT.
 */
#ifndef SUMO_TRANSPORT_H
#define SUMO_TRANSPORT_H

#include "common/common.h"
#include "transport/shm.h"

typedef struct sumo__transport sumo__transport;

typedef struct sumo__transport_ops {
    const char *name;
    /*
     * Send sbytes from sbuf to rank dst and receive rbytes into rbuf from rank src, both at
     * once, so a ring or a pairwise exchange cannot deadlock. dst or src = -1 skips that
     * direction. Returns when rbuf is filled and sbuf may be reused.
     */
    sumo_result (*sendrecv)(sumo__transport *tp, const void *sbuf, size_t sbytes, int dst,
                            void *rbuf, size_t rbytes, int src);
    /* out[r*bytes .. (r+1)*bytes) = rank r's in, for every r. For small records (<= 64 B). */
    sumo_result (*allgather_small)(sumo__transport *tp, const void *in, void *out, size_t bytes);
    sumo_result (*barrier)(sumo__transport *tp);
    /* Optional (NULL when the transport has none): the library's own allreduce (MPI's), for
     * fp32/fp64 SUM and AVERAGE, bounded by the deadline like everything else. */
    sumo_result (*native_allreduce)(sumo__transport *tp, const void *sendbuf, void *recvbuf,
                                    size_t count, sumo_dtype dtype, sumo_op op);
    /* Marks this rank as gone so peers waiting on it fail fast, then frees the rank's state. */
    void (*destroy)(sumo__transport *tp);
} sumo__transport_ops;

struct sumo__transport {
    const sumo__transport_ops *ops;
    int rank;
    int size;
    int64_t timeout_ns;
    int log_level;
    /* Ranks per node when the ranks are packed by node in equal groups (MPI shared-memory
     * split), else 0; the threads transport is one node. */
    int node_local_size;
    /* Non-NULL when every rank of the group shares memory with this one (one node). */
    sumo__shm *shm;
    /* Set after a timeout or a peer failure: every later call fails. */
    bool broken;
    char errmsg[256];
};

/*
 * Records the detail of a failure in tp->errmsg (and the debug log), marks the transport
 * broken for TIMEOUT/PEER_FAILURE/INTERNAL, and returns code.
 */
sumo_result sumo__transport_fail(sumo__transport *tp, sumo_result code, const char *file,
                                 int line, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
#define SUMO__FAIL(tp, code, ...) sumo__transport_fail((tp), (code), __FILE__, __LINE__, __VA_ARGS__)

/* The threads transport: fills tps[0..nranks). */
sumo_result sumo__threads_transport_create(int nranks, sumo__transport **tps);

#endif
