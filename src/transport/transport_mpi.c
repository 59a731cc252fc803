/*
 * The MPI transport: ranks are the processes of a duplicated MPI communicator.
 *
 * Every MPI operation is nonblocking and polled against the deadline, so a peer that dies or
 * never calls gives SUMO_ERR_TIMEOUT instead of a hang (blocking MPI calls cannot time out).
 * Polling spins briefly and then yields: runs are often oversubscribed (more ranks than
 * cores), where a spinning rank steals the core its peer needs.
 *
 * When every rank lives on one node, a shared window (MPI_Win_allocate_shared) holds the
 * shm control block and one staging area per rank; the collectives then use the same
 * futex-backed synchronisation as the threads transport, across processes.
 *
 * After a timeout the communicator is broken: destroy then skips the collective frees
 * (MPI_Win_free, MPI_Comm_free), which could hang on the missing peer, and leaks them; the
 * usual reaction to a dead peer is to end the job anyway.
 */
#include "transport/transport_mpi.h"

#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* MPI counts are int: larger messages go in pieces of this many bytes. */
#define MAX_MESSAGE_BYTES ((size_t)1 << 30)
#define DEFAULT_STAGE_BYTES ((size_t)512 * 1024)
#define TAG 0x5d0

typedef struct mpi_transport {
    sumo__transport base;
    MPI_Comm comm;
    /* The receive side of allgather_small. A nonblocking collective cannot be cancelled, so
     * after a timeout MPI may still write here when a late peer arrives: the buffer belongs
     * to the transport and is deliberately leaked once the transport is broken. */
    unsigned char *gather_buf;
    MPI_Win win;
    bool have_win;
    sumo__shm shm;
    unsigned char **stage;
} mpi_transport;

static sumo_result mpi_fail(sumo__transport *tp, sumo_result code, int mpi_rc, const char *what)
{
    char msg[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(mpi_rc, msg, &len);
    return SUMO__FAIL(tp, code, "%s: MPI error: %s", what, msg);
}

/*
 * Polls until every request completes or the deadline passes. On timeout the first
 * `receives` requests (point-to-point receives) are cancelled so their buffers are released;
 * sends and nonblocking collectives cannot be cancelled (MPI makes that an error) and are
 * left to the broken communicator.
 */
static sumo_result wait_all(sumo__transport *tp, MPI_Request *reqs, int n, int receives,
                            int64_t deadline, const char *what)
{
    for (uint64_t polls = 0;; polls++) {
        int done = 0;
        int rc = MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS) return mpi_fail(tp, SUMO_ERR_PEER_FAILURE, rc, what);
        if (done) return SUMO_SUCCESS;
        if ((polls & 63) == 0 && sumo__now_ns() > deadline) {
            /* A cancelled receive completes locally; waiting for it guarantees MPI writes
             * nothing into the caller's buffer after we return. */
            for (int i = 0; i < receives; i++) {
                if (reqs[i] == MPI_REQUEST_NULL) continue;
                MPI_Cancel(&reqs[i]);
                MPI_Wait(&reqs[i], MPI_STATUS_IGNORE);
            }
            return SUMO__FAIL(tp, SUMO_ERR_TIMEOUT,
                              "%s: rank %d waited %.3f s for its peers (deadline reached; raise "
                              "it with sumo_comm_set_timeout or SUMO_TIMEOUT)",
                              what, tp->rank, (double)tp->timeout_ns / 1e9);
        }
        if (polls > 2000) {
            if (polls > 200000) nanosleep(&(struct timespec){.tv_nsec = 20000}, NULL);
            else sched_yield();
        }
    }
}

static sumo_result mpi_sendrecv(sumo__transport *tp, const void *sbuf, size_t sbytes, int dst,
                                void *rbuf, size_t rbytes, int src)
{
    mpi_transport *t = (mpi_transport *)tp;
    int64_t deadline = sumo__now_ns() + tp->timeout_ns;
    /* Both sides cut a message at the same offsets, so pieces pair up in order. */
    size_t soff = 0, roff = 0;
    do {
        MPI_Request reqs[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
        size_t rlen = SUMO__MIN(rbytes - roff, MAX_MESSAGE_BYTES);
        size_t slen = SUMO__MIN(sbytes - soff, MAX_MESSAGE_BYTES);
        int rc = MPI_SUCCESS;
        if (src >= 0 && (roff < rbytes || rbytes == 0))
            rc = MPI_Irecv((unsigned char *)rbuf + roff, (int)rlen, MPI_BYTE, src, TAG, t->comm, &reqs[0]);
        if (rc == MPI_SUCCESS && dst >= 0 && (soff < sbytes || sbytes == 0))
            rc = MPI_Isend((const unsigned char *)sbuf + soff, (int)slen, MPI_BYTE, dst, TAG, t->comm,
                           &reqs[1]);
        if (rc != MPI_SUCCESS) return mpi_fail(tp, SUMO_ERR_PEER_FAILURE, rc, "sendrecv");
        SUMO__CHECK(wait_all(tp, reqs, 2, 1, deadline, "sendrecv"));
        soff += slen;
        roff += rlen;
    } while ((dst >= 0 && soff < sbytes) || (src >= 0 && roff < rbytes));
    return SUMO_SUCCESS;
}

static sumo_result mpi_allgather_small(sumo__transport *tp, const void *in, void *out, size_t bytes)
{
    mpi_transport *t = (mpi_transport *)tp;
    if (bytes > 64) return SUMO__FAIL(tp, SUMO_ERR_INTERNAL, "allgather_small of %zu bytes", bytes);
    MPI_Request req;
    int rc = MPI_Iallgather(in, (int)bytes, MPI_BYTE, t->gather_buf, (int)bytes, MPI_BYTE, t->comm, &req);
    if (rc != MPI_SUCCESS) return mpi_fail(tp, SUMO_ERR_PEER_FAILURE, rc, "allgather");
    SUMO__CHECK(wait_all(tp, &req, 1, 0, sumo__now_ns() + tp->timeout_ns, "allgather"));
    memcpy(out, t->gather_buf, bytes * (size_t)tp->size);
    return SUMO_SUCCESS;
}

static sumo_result mpi_barrier(sumo__transport *tp)
{
    if (tp->shm) return sumo__shm_barrier(tp);
    mpi_transport *t = (mpi_transport *)tp;
    MPI_Request req;
    int rc = MPI_Ibarrier(t->comm, &req);
    if (rc != MPI_SUCCESS) return mpi_fail(tp, SUMO_ERR_PEER_FAILURE, rc, "barrier");
    return wait_all(tp, &req, 1, 0, sumo__now_ns() + tp->timeout_ns, "barrier");
}

static sumo_result mpi_native_allreduce(sumo__transport *tp, const void *sendbuf, void *recvbuf,
                                        size_t count, sumo_dtype dtype, sumo_op op)
{
    mpi_transport *t = (mpi_transport *)tp;
    if ((dtype != SUMO_FLOAT32 && dtype != SUMO_FLOAT64) || op > SUMO_OP_AVERAGE)
        return SUMO__FAIL(tp, SUMO_ERR_INVALID_USAGE, "MPI_Allreduce has no %s %s",
                          sumo__dtype_name(dtype), sumo__op_name((int)op));
    MPI_Datatype type = dtype == SUMO_FLOAT32 ? MPI_FLOAT : MPI_DOUBLE;
    size_t esz = sumo__dtype_bytes(dtype), piece = MAX_MESSAGE_BYTES / esz;
    int64_t deadline = sumo__now_ns() + tp->timeout_ns;
    for (size_t off = 0; off < count; off += piece) {
        size_t n = SUMO__MIN(piece, count - off);
        const void *in = sendbuf == recvbuf ? MPI_IN_PLACE : (const unsigned char *)sendbuf + off * esz;
        MPI_Request req;
        int rc = MPI_Iallreduce(in, (unsigned char *)recvbuf + off * esz, (int)n, type, MPI_SUM,
                                t->comm, &req);
        if (rc != MPI_SUCCESS) return mpi_fail(tp, SUMO_ERR_PEER_FAILURE, rc, "MPI_Allreduce");
        SUMO__CHECK(wait_all(tp, &req, 1, 0, deadline, "MPI_Allreduce"));
    }
    if (op == SUMO_OP_AVERAGE) {
        /* Divide (not multiply by 1/P), as every other path does. */
        if (dtype == SUMO_FLOAT32)
            for (size_t i = 0; i < count; i++) ((float *)recvbuf)[i] /= (float)tp->size;
        else
            for (size_t i = 0; i < count; i++) ((double *)recvbuf)[i] /= (double)tp->size;
    }
    return SUMO_SUCCESS;
}

static void mpi_destroy(sumo__transport *tp)
{
    mpi_transport *t = (mpi_transport *)tp;
    if (tp->broken) {
        if (tp->shm) sumo__shm_abort(tp->shm, tp->rank);
        /* gather_buf stays allocated: MPI may still complete the abandoned collective. */
    } else {
        free(t->gather_buf);
        if (t->have_win) {
            MPI_Win_unlock_all(t->win);
            MPI_Win_free(&t->win);
        }
        MPI_Comm_free(&t->comm);
    }
    free(t->stage);
    free(t);
}

static const sumo__transport_ops mpi_ops = {
    .name = "mpi",
    .sendrecv = mpi_sendrecv,
    .allgather_small = mpi_allgather_small,
    .barrier = mpi_barrier,
    .native_allreduce = mpi_native_allreduce,
    .destroy = mpi_destroy,
};

static size_t stage_bytes_from_env(void)
{
    const char *v = getenv("SUMO_SHM_STAGE_BYTES");
    if (v == NULL || *v == '\0') return DEFAULT_STAGE_BYTES;
    char *end;
    unsigned long long b = strtoull(v, &end, 10);
    if (*end != '\0' || b < 4096 || b > ((size_t)1 << 30)) return DEFAULT_STAGE_BYTES;
    return (size_t)b / 4096 * 4096;
}

/* Ranks per node when nodes hold equal, consecutive blocks of ranks; else 0. */
static int packed_node_size(mpi_transport *t, MPI_Comm node, bool *one_node, char *err, size_t errlen)
{
    int node_rank, node_size;
    MPI_Comm_rank(node, &node_rank);
    MPI_Comm_size(node, &node_size);
    int mine[2] = {node_rank, node_size};
    int *all = malloc(sizeof(int) * 2 * (size_t)t->base.size);
    if (all == NULL) return -1;
    int rc = MPI_Allgather(mine, 2, MPI_INT, all, 2, MPI_INT, t->comm);
    if (rc != MPI_SUCCESS) {
        snprintf(err, errlen, "MPI_Allgather of the node layout failed");
        free(all);
        return -1;
    }
    bool packed = true;
    for (int r = 0; r < t->base.size; r++)
        if (all[2 * r + 1] != node_size || all[2 * r] != r % node_size) packed = false;
    free(all);
    *one_node = node_size == t->base.size;
    return packed ? node_size : 0;
}

static sumo_result map_window(mpi_transport *t, MPI_Comm node, char *err, size_t errlen)
{
    int size = t->base.size, rank = t->base.rank;
    size_t stage = stage_bytes_from_env();
    size_t ctl = (sumo__shm_ctl_bytes(size) + 4095) / 4096 * 4096;
    void *base = NULL;
    MPI_Aint mine = (MPI_Aint)(stage + (rank == 0 ? ctl : 0));
    int rc = MPI_Win_allocate_shared(mine, 1, MPI_INFO_NULL, node, &base, &t->win);
    if (rc != MPI_SUCCESS) {
        snprintf(err, errlen, "MPI_Win_allocate_shared of %zu bytes failed", (size_t)mine);
        return SUMO_ERR_SYSTEM;
    }
    t->have_win = true;
    t->stage = calloc((size_t)size, sizeof *t->stage);
    if (t->stage == NULL) return SUMO_ERR_SYSTEM;
    sumo__shm_ctl *ctlp = NULL;
    for (int r = 0; r < size; r++) {
        MPI_Aint bytes;
        int disp;
        void *ptr;
        MPI_Win_shared_query(t->win, r, &bytes, &disp, &ptr);
        t->stage[r] = (unsigned char *)ptr + (r == 0 ? ctl : 0);
        if (r == 0) ctlp = ptr;
    }
    /* Loads and stores into the window are synchronised by our own atomics; the passive
     * epoch keeps that legal under MPI's memory model. */
    MPI_Win_lock_all(MPI_MODE_NOCHECK, t->win);
    if (rank == 0) {
        memset(ctlp, 0, ctl);
        sumo__shm_ctl_init(ctlp, size);
    }
    MPI_Win_sync(t->win);
    MPI_Barrier(t->comm);
    MPI_Win_sync(t->win);
    t->shm = (sumo__shm){.ctl = ctlp,
                         .rank = rank,
                         .size = size,
                         .same_address_space = false,
                         .stage = t->stage,
                         .stage_bytes = stage,
                         .spin_limit = sumo__shm_default_spin_limit(size)};
    t->base.shm = &t->shm;
    return SUMO_SUCCESS;
}

sumo_result sumo__mpi_transport_create(MPI_Comm comm, sumo__transport **out, char *err,
                                       size_t errlen)
{
    mpi_transport *t = calloc(1, sizeof *t);
    if (t == NULL) return SUMO_ERR_SYSTEM;
    if (MPI_Comm_dup(comm, &t->comm) != MPI_SUCCESS) {
        snprintf(err, errlen, "MPI_Comm_dup failed");
        free(t);
        return SUMO_ERR_SYSTEM;
    }
    /* Our failures are statuses, not the default abort of the whole job. */
    MPI_Comm_set_errhandler(t->comm, MPI_ERRORS_RETURN);
    t->base = (sumo__transport){.ops = &mpi_ops,
                                .timeout_ns = (int64_t)(sumo__timeout_from_env(300.0) * 1e9),
                                .log_level = sumo__log_level_from_env()};
    MPI_Comm_rank(t->comm, &t->base.rank);
    MPI_Comm_size(t->comm, &t->base.size);
    MPI_Comm node = MPI_COMM_NULL;
    sumo_result r = SUMO_SUCCESS;
    t->gather_buf = malloc(64 * (size_t)t->base.size);
    if (t->gather_buf == NULL) r = SUMO_ERR_SYSTEM;
    if (MPI_Comm_split_type(t->comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) != MPI_SUCCESS) {
        snprintf(err, errlen, "MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) failed");
        r = SUMO_ERR_SYSTEM;
    }
    bool one_node = false;
    if (r == SUMO_SUCCESS) {
        int per_node = packed_node_size(t, node, &one_node, err, errlen);
        if (per_node < 0) r = SUMO_ERR_SYSTEM;
        else t->base.node_local_size = per_node;
    }
    /* Mapping the window is collective: every rank must take the same branch, and a launcher
     * may hand the ranks different environments, so the ranks agree on it first. */
    const char *shm_env = getenv("SUMO_MPI_SHM");
    int want_shm = !(shm_env && strcmp(shm_env, "0") == 0) && one_node, all_want = 0;
    if (r == SUMO_SUCCESS && MPI_Allreduce(&want_shm, &all_want, 1, MPI_INT, MPI_MIN, t->comm) != MPI_SUCCESS) {
        snprintf(err, errlen, "MPI_Allreduce of the shared-memory choice failed");
        r = SUMO_ERR_SYSTEM;
    }
    if (r == SUMO_SUCCESS && all_want && t->base.size > 1) r = map_window(t, node, err, errlen);
    if (node != MPI_COMM_NULL) MPI_Comm_free(&node);
    if (r != SUMO_SUCCESS) {
        if (t->have_win) MPI_Win_free(&t->win);
        MPI_Comm_free(&t->comm);
        free(t->gather_buf);
        free(t->stage);
        free(t);
        return r;
    }
    *out = &t->base;
    return SUMO_SUCCESS;
}
