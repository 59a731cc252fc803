/*
 * The MPI transport: ranks are the processes of a duplicated MPI communicator.
 *
 * Every MPI operation is nonblocking and polled against the deadline, so a peer that dies or
 * never calls gives SUMO_ERR_TIMEOUT instead of a hang (blocking MPI calls cannot time out).
 * Polling spins briefly and then yields: runs are often oversubscribed (more ranks than
 * cores), where a spinning rank steals the core its peer needs.
 *
 * When every rank lives on one node, a shared window (MPI_Win_allocate_shared) holds the
 * shm control block and one staging area per rank (SUMO__REACH_STAGED); announce and barrier
 * then use the same futex-backed synchronisation as the threads transport, across processes.
 * MPI_Allreduce itself is offered as an offload, for the sums it supports.
 *
 * After a timeout the communicator is broken: destroy then skips the collective frees
 * (MPI_Win_free, MPI_Comm_free), which could hang on the missing peer, and leaks them; the
 * usual reaction to a dead peer is to end the job anyway.
 */
#include "transport/transport_mpi.h"
#include "common/settings.h"
#include "transport/shm.h"

#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* MPI counts are int: larger messages go in pieces of this many bytes. */
#define MAX_MESSAGE_BYTES ((size_t)1 << 30)
#define TAG 0x5d0

/*
 * Memory from mem_alloc. On one node it is a shared window of its own, so every peer maps
 * every rank's part; peer_buffer turns an address a peer announced into our mapping of it.
 * Across nodes it is plain memory (win == MPI_WIN_NULL) that nothing shares.
 */
typedef struct shared_region {
    sumo__shm_region r; /* first: the list holds these; r.user is base rounded up to a page */
    MPI_Win win;
    unsigned char *base; /* this rank's part */
} shared_region;

typedef struct mpi_transport {
    sumo__transport base;
    MPI_Comm comm;
    /* The receive side of announce off shared memory. A nonblocking collective cannot be cancelled, so
     * after a timeout MPI may still write here when a late peer arrives: the buffer belongs
     * to the transport and is deliberately leaked once the transport is broken. */
    unsigned char *gather_buf;
    MPI_Win win;
    bool have_win;
    sumo__shm shm; /* have_win only */
    unsigned char **stage;
    /* shared_regions, changed only by the collective mem_alloc / mem_free */
    sumo__shm_region *regions;
} mpi_transport;

/* note is appended to the message ("" for none). */
static sumo_result mpi_fail_note(sumo__transport *tp, sumo_result code, int mpi_rc,
                                 const char *what, const char *note)
{
    char msg[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(mpi_rc, msg, &len);
    return SUMO__FAIL(tp, code, "%s: MPI error: %s%s", what, msg, note);
}

static sumo_result mpi_fail(sumo__transport *tp, sumo_result code, int mpi_rc, const char *what)
{
    return mpi_fail_note(tp, code, mpi_rc, what, "");
}

/* Spins, then yields the core, then sleeps briefly: with more ranks than cores the peer we
 * wait for needs this core, and MPI progresses only inside our MPI_Test calls. */
static void poll_pause(uint64_t polls)
{
    if (polls < 2000) return;
    if (polls < 200000) sched_yield();
    else nanosleep(&(struct timespec){.tv_nsec = 20000}, NULL);
}

/*
 * Cancels the receives among reqs. A cancelled receive completes locally unless its message
 * is already arriving, in which case it completes when the transfer does; waiting for that
 * guarantees MPI writes nothing into the caller's buffer after we return. The wait is bounded
 * all the same (a transfer from a peer that died midway may never end): returns false when a
 * receive did not settle in time and its buffer may still be written.
 */
static bool settle_receives(sumo__transport *tp, MPI_Request *reqs, int receives)
{
    bool settled = true;
    for (int i = 0; i < receives; i++)
        if (reqs[i] != MPI_REQUEST_NULL) MPI_Cancel(&reqs[i]);
    int64_t grace = sumo__now_ns() + SUMO__MIN(tp->timeout_ns, (int64_t)1000000000);
    for (int i = 0; i < receives; i++) {
        int done = 0;
        for (uint64_t polls = 0; reqs[i] != MPI_REQUEST_NULL && !done; polls++) {
            if (MPI_Test(&reqs[i], &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) break;
            if (!done && sumo__now_ns() > grace) break;
            poll_pause(polls);
        }
        if (reqs[i] != MPI_REQUEST_NULL && !done) settled = false;
    }
    return settled;
}

static const char *unsettled_note(bool settled)
{
    return settled ? "" : "; a receive could not be cancelled, its buffer may still be written";
}

/* What poll_requests returns when the deadline passed first (MPI's error codes are >= 0). */
#define POLL_TIMED_OUT (-1)

/* Work to do between polls (sendrecv_working); NULL fn: none. */
typedef struct poll_work {
    sumo__work_fn fn;
    void *ctx;
} poll_work;

/* Polls until every request completes (MPI_SUCCESS), MPI reports an error (its code) or the
 * deadline passes (POLL_TIMED_OUT). Blocking MPI calls cannot time out, hence the polling.
 * While work is left, a slice of it runs between polls instead of the pause: MPI progresses
 * only inside MPI calls, so the exchange moves at every poll and the work fills the waits. */
static int poll_requests(MPI_Request *reqs, int n, MPI_Status *statuses, int64_t deadline,
                         poll_work *work)
{
    for (uint64_t polls = 0;; polls++) {
        int done = 0;
        int rc = MPI_Testall(n, reqs, &done, statuses);
        if (rc != MPI_SUCCESS) return rc;
        if (done) return MPI_SUCCESS;
        if ((polls & 63) == 0 && sumo__now_ns() > deadline) return POLL_TIMED_OUT;
        if (work && work->fn) {
            if (!work->fn(work->ctx)) work->fn = NULL;
            continue;
        }
        poll_pause(polls);
    }
}

/*
 * Waits for every request under the deadline. On failure the first
 * `receives` requests (point-to-point receives) are cancelled and settled; sends and
 * nonblocking collectives cannot be cancelled (MPI makes that an error) and are left to the
 * broken communicator. statuses may be MPI_STATUSES_IGNORE.
 */
static sumo_result wait_all_working(sumo__transport *tp, MPI_Request *reqs, int n, int receives,
                                    MPI_Status *statuses, int64_t deadline, const char *what,
                                    poll_work *work)
{
    int rc = poll_requests(reqs, n, statuses, deadline, work);
    if (rc == MPI_SUCCESS) return SUMO_SUCCESS;
    const char *note = unsettled_note(settle_receives(tp, reqs, receives));
    if (rc != POLL_TIMED_OUT) return mpi_fail_note(tp, SUMO_ERR_PEER_FAILURE, rc, what, note);
    return SUMO__FAIL(tp, SUMO_ERR_TIMEOUT,
                      "%s: rank %d waited %.3f s for its peers (deadline reached; raise it with "
                      "sumo_comm_set_timeout or SUMO_TIMEOUT)%s",
                      what, tp->rank, (double)tp->timeout_ns / 1e9, note);
}

static sumo_result wait_all(sumo__transport *tp, MPI_Request *reqs, int n, int receives,
                            MPI_Status *statuses, int64_t deadline, const char *what)
{
    return wait_all_working(tp, reqs, n, receives, statuses, deadline, what, NULL);
}

static sumo_result mpi_sendrecv_working(sumo__transport *tp, const void *sbuf, size_t sbytes,
                                        int dst, void *rbuf, size_t rbytes, int src,
                                        sumo__work_fn work_fn, void *ctx)
{
    poll_work work = {.fn = work_fn, .ctx = ctx};
    mpi_transport *t = (mpi_transport *)tp;
    int64_t deadline = sumo__now_ns() + tp->timeout_ns;
    /* Both sides cut a message at the same offsets, so pieces pair up in order. */
    size_t soff = 0, roff = 0;
    /* An empty message is one message: it goes (or is awaited) in the first round only. */
    bool first = true;
    do {
        MPI_Request reqs[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
        MPI_Status status[2];
        size_t rlen = SUMO__MIN(rbytes - roff, MAX_MESSAGE_BYTES);
        size_t slen = SUMO__MIN(sbytes - soff, MAX_MESSAGE_BYTES);
        bool receiving = src >= 0 && (roff < rbytes || (rbytes == 0 && first));
        int rc = MPI_SUCCESS;
        if (receiving)
            rc = MPI_Irecv((unsigned char *)rbuf + roff, (int)rlen, MPI_BYTE, src, TAG, t->comm, &reqs[0]);
        if (rc == MPI_SUCCESS && dst >= 0 && (soff < sbytes || (sbytes == 0 && first)))
            rc = MPI_Isend((const unsigned char *)sbuf + soff, (int)slen, MPI_BYTE, dst, TAG, t->comm,
                           &reqs[1]);
        if (rc != MPI_SUCCESS) {
            settle_receives(tp, reqs, 1);
            return mpi_fail(tp, SUMO_ERR_PEER_FAILURE, rc, "sendrecv");
        }
        SUMO__CHECK(wait_all_working(tp, reqs, 2, 1, status, deadline, "sendrecv", &work));
        /* A shorter message would complete the receive silently and shift every later one. */
        int got = 0;
        if (receiving && (MPI_Get_count(&status[0], MPI_BYTE, &got) != MPI_SUCCESS || (size_t)got != rlen))
            return SUMO__FAIL(tp, SUMO_ERR_INTERNAL,
                              "receive from rank %d: expected %zu bytes, peer sent %d", src, rlen, got);
        soff += slen;
        roff += rlen;
        first = false;
    } while ((dst >= 0 && soff < sbytes) || (src >= 0 && roff < rbytes));
    return SUMO_SUCCESS;
}

static sumo_result mpi_sendrecv(sumo__transport *tp, const void *sbuf, size_t sbytes, int dst,
                                void *rbuf, size_t rbytes, int src)
{
    return mpi_sendrecv_working(tp, sbuf, sbytes, dst, rbuf, rbytes, src, NULL, NULL);
}

static sumo_result mpi_announce(sumo__transport *tp, const void *record, void *all, size_t bytes)
{
    mpi_transport *t = (mpi_transport *)tp;
    if (t->have_win) return sumo__shm_announce(tp, &t->shm, record, all, bytes);
    if (bytes > SUMO__ANNOUNCE_BYTES)
        return SUMO__FAIL(tp, SUMO_ERR_INTERNAL, "announce of %zu bytes", bytes);
    MPI_Request req;
    int rc = MPI_Iallgather(record, (int)bytes, MPI_BYTE, t->gather_buf, (int)bytes, MPI_BYTE,
                            t->comm, &req);
    if (rc != MPI_SUCCESS) return mpi_fail(tp, SUMO_ERR_PEER_FAILURE, rc, "announce");
    SUMO__CHECK(wait_all(tp, &req, 1, 0, MPI_STATUSES_IGNORE, sumo__now_ns() + tp->timeout_ns,
                         "announce"));
    memcpy(all, t->gather_buf, bytes * (size_t)tp->size);
    return SUMO_SUCCESS;
}

static sumo_result mpi_barrier(sumo__transport *tp)
{
    mpi_transport *t = (mpi_transport *)tp;
    if (t->have_win) return sumo__shm_barrier(tp, &t->shm);
    MPI_Request req;
    int rc = MPI_Ibarrier(t->comm, &req);
    if (rc != MPI_SUCCESS) return mpi_fail(tp, SUMO_ERR_PEER_FAILURE, rc, "barrier");
    return wait_all(tp, &req, 1, 0, MPI_STATUSES_IGNORE, sumo__now_ns() + tp->timeout_ns, "barrier");
}

static unsigned char *mpi_stage(sumo__transport *tp, int rank)
{
    mpi_transport *t = (mpi_transport *)tp;
    return t->have_win ? t->stage[rank] : NULL;
}

static void mpi_abort(sumo__transport *tp)
{
    mpi_transport *t = (mpi_transport *)tp;
    /* Off shared memory the peers cannot be reached without MPI_Abort, which would end the
     * caller's job: they fail at their deadline instead. */
    if (t->have_win) sumo__shm_abort(&t->shm, tp->rank);
}

/* MPI_SUM on MPI's own float types; AVERAGE is a sum the collectives divide afterwards. */
static bool mpi_reduce_support(const sumo__transport *tp, sumo_dtype dtype, sumo_op op)
{
    (void)tp;
    return (dtype == SUMO_FLOAT32 || dtype == SUMO_FLOAT64) && op == SUMO_OP_SUM;
}

static sumo_result mpi_offload_allreduce(sumo__transport *tp, const void *sendbuf, void *recvbuf,
                                         size_t count, sumo_dtype dtype, sumo_op op)
{
    mpi_transport *t = (mpi_transport *)tp;
    if (!mpi_reduce_support(tp, dtype, op))
        return SUMO__FAIL(tp, SUMO_ERR_INVALID_USAGE, "MPI_Allreduce has no %s %s",
                          sumo_dtype_name(dtype), sumo__op_name(op));
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
        SUMO__CHECK(wait_all(tp, &req, 1, 0, MPI_STATUSES_IGNORE, deadline, "MPI_Allreduce"));
    }
    return SUMO_SUCCESS;
}

/* Frees what a region holds, not the region itself. */
static void region_drop(shared_region *g)
{
    if (g->win != MPI_WIN_NULL) {
        MPI_Win_unlock_all(g->win);
        MPI_Win_free(&g->win);
    } else {
        free(g->base);
    }
    sumo__shm_region_tables_free(&g->r);
}

static bool mpi_shares(sumo__transport *tp, const void *buf, size_t bytes)
{
    return sumo__shm_region_shares(((mpi_transport *)tp)->regions, tp->rank, buf, bytes);
}

static void *mpi_peer_buffer(sumo__transport *tp, int rank, uint64_t address)
{
    return sumo__shm_region_peer(((mpi_transport *)tp)->regions, rank, address);
}

/* Whether every rank says ok (a collective: everyone calls it, whatever its own outcome). */
static bool all_ranks_ok(mpi_transport *t, bool ok)
{
    int mine = ok, all = 0;
    return MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, t->comm) == MPI_SUCCESS && all;
}

/*
 * One window per allocation: MPI_Win_allocate_shared gives every rank a mapping of every
 * rank's part, and an allgather tells each rank where its peers' parts live in their own
 * processes (the addresses their collectives will announce). Every step runs on every rank,
 * whatever its own outcome (the communicator agreed before), and all fail together.
 */
static sumo_result alloc_shared(mpi_transport *t, shared_region *g, size_t bytes, bool able)
{
    sumo__transport *tp = &t->base;
    size_t size = (size_t)tp->size;
    bool tables = sumo__shm_region_tables(&g->r, tp->size);
    uint64_t *layout = calloc(2 * size, sizeof *layout);
    /* MPI_Aint is signed, and the page added below must not wrap the size. */
    able = able && tables && layout && bytes <= (size_t)PTRDIFF_MAX - 4096;
    MPI_Info info;
    MPI_Info_create(&info);
    /* Each rank's part on its own pages (and its own NUMA node when first touched there). */
    MPI_Info_set(info, "alloc_shared_noncontig", "true");
    void *base = NULL;
    /* MPI aligns a part to less than a page (Open MPI: 8 bytes past a page): one page more
     * lets the caller's buffer start on a page boundary. */
    size_t part = able ? bytes + 4096 : 0;
    int rc = MPI_Win_allocate_shared((MPI_Aint)part, 1, info, t->comm, &base, &g->win);
    MPI_Info_free(&info);
    if (rc != MPI_SUCCESS) g->win = MPI_WIN_NULL;
    bool ok = all_ranks_ok(t, able && rc == MPI_SUCCESS);
    if (ok) {
        g->base = base;
        g->r.user = (unsigned char *)(((uintptr_t)base + 4095) & ~(uintptr_t)4095);
        MPI_Win_lock_all(MPI_MODE_NOCHECK, g->win);
        uint64_t mine[2] = {(uintptr_t)base, part};
        ok = MPI_Allgather(mine, 2, MPI_UINT64_T, layout, 2, MPI_UINT64_T, t->comm) == MPI_SUCCESS;
        for (size_t r = 0; ok && r < size; r++) {
            MPI_Aint rbytes = 0;
            int disp = 0;
            void *ptr = NULL;
            /* MPI may round a part up to whole pages. */
            ok = MPI_Win_shared_query(g->win, (int)r, &rbytes, &disp, &ptr) == MPI_SUCCESS &&
                 (uint64_t)rbytes >= layout[2 * r + 1] && ptr != NULL;
            g->r.owner_address[r] = layout[2 * r];
            g->r.owner_bytes[r] = (size_t)layout[2 * r + 1];
            g->r.mapped[r] = ptr;
        }
        ok = all_ranks_ok(t, ok);
    }
    free(layout);
    if (ok) return SUMO_SUCCESS;
    /* (Where the creation failed on some ranks only, MPI leaves the others' windows in an
     * undefined state; freeing them is the best we can do.) */
    if (g->win != MPI_WIN_NULL && rc == MPI_SUCCESS) {
        if (g->base) MPI_Win_unlock_all(g->win);
        MPI_Win_free(&g->win);
    }
    g->win = MPI_WIN_NULL;
    g->base = NULL;
    return SUMO__FAIL_TOGETHER(tp, SUMO_ERR_SYSTEM,
                               "mem_alloc: %zu bytes in a shared window (MPI_Win_allocate_shared): "
                               "failed on %s", bytes, able && rc == MPI_SUCCESS ? "a peer" : "this rank");
}

static sumo_result mpi_mem_alloc(sumo__transport *tp, size_t bytes, void **ptr)
{
    mpi_transport *t = (mpi_transport *)tp;
    shared_region *g = calloc(1, sizeof *g);
    /* Without a record this rank still takes part in creating the window (collective), and
     * makes it fail everywhere. */
    shared_region spare = {0};
    shared_region *use = g ? g : &spare;
    use->win = MPI_WIN_NULL;
    sumo_result r;
    if (t->have_win) {
        r = alloc_shared(t, use, bytes, g != NULL);
    } else {
        /* Across nodes nothing is shared: plain memory, listed so that mem_free knows it. This
         * rank's outcome alone: the communicator then agrees on everyone's. */
        use->base = use->r.user = g ? sumo__aligned_alloc(4096, bytes) : NULL;
        r = use->base ? SUMO_SUCCESS
                      : SUMO__FAIL_TOGETHER(tp, SUMO_ERR_SYSTEM, "mem_alloc: out of memory for %zu bytes", bytes);
    }
    if (r != SUMO_SUCCESS) {
        region_drop(use);
        free(g);
        return r;
    }
    g->r.next = t->regions;
    t->regions = &g->r;
    *ptr = g->r.user;
    return SUMO_SUCCESS;
}

static sumo_result mpi_mem_free(sumo__transport *tp, void *ptr)
{
    mpi_transport *t = (mpi_transport *)tp;
    shared_region *g = (shared_region *)sumo__shm_region_take(&t->regions, ptr);
    if (g) {
        region_drop(g);
        free(g);
        return SUMO_SUCCESS;
    }
    return SUMO__FAIL(tp, SUMO_ERR_INVALID_ARGUMENT,
                      "mem_free: %p did not come from sumo_mem_alloc on this communicator", ptr);
}

static sumo_result mpi_destroy(sumo__transport *tp)
{
    mpi_transport *t = (mpi_transport *)tp;
    /* Peers on this node still waiting on this rank learn at once that it left, as on the
     * threads transport (a peer finishing a collective this rank finished is not affected). */
    if (t->have_win) sumo__shm_depart(&t->shm, tp->rank);
    /* At the end of the process the windows and the communicator are left to MPI_Finalize:
     * meeting the peers here, under the deadline, would fail (and end the job) when a peer is
     * still busy after its last collective, as rank 0 saving a checkpoint is. */
    if (tp->leaving_process) {
        free(t->stage);
        free(t);
        return SUMO_SUCCESS;
    }
    /* The frees below are collective and blocking: meet the peers first under the deadline,
     * so a peer that is gone makes destroy leak instead of hang. */
    sumo_result r = sumo__transport_broken(tp) ? SUMO_ERR_PEER_FAILURE : SUMO_SUCCESS;
    if (r == SUMO_SUCCESS) {
        MPI_Request req;
        int rc = MPI_Ibarrier(t->comm, &req);
        r = rc != MPI_SUCCESS ? mpi_fail(tp, SUMO_ERR_PEER_FAILURE, rc, "destroy")
                              : wait_all(tp, &req, 1, 0, MPI_STATUSES_IGNORE,
                                         sumo__now_ns() + tp->timeout_ns, "destroy");
    }
    if (r != SUMO_SUCCESS) {
        mpi_abort(tp);
        /* gather_buf stays allocated: MPI may still complete the abandoned collective. */
    } else {
        /* Collective frees, in the same order on every rank (the list is built alike). */
        while (t->regions) {
            shared_region *g = (shared_region *)t->regions;
            t->regions = g->r.next;
            region_drop(g);
            free(g);
        }
        free(t->gather_buf);
        if (t->have_win) {
            MPI_Win_unlock_all(t->win);
            MPI_Win_free(&t->win);
        }
        MPI_Comm_free(&t->comm);
    }
    free(t->stage);
    free(t);
    return r;
}

static const sumo__transport_ops mpi_ops = {
    .name = "mpi",
    .sendrecv = mpi_sendrecv,
    .sendrecv_working = mpi_sendrecv_working,
    .announce = mpi_announce,
    .barrier = mpi_barrier,
    .peer_buffer = mpi_peer_buffer,
    .shares = mpi_shares,
    .mem_alloc = mpi_mem_alloc,
    .mem_free = mpi_mem_free,
    .stage = mpi_stage,
    .abort = mpi_abort,
    .destroy = mpi_destroy,
};

static const sumo__offload_ops mpi_offload = {
    .name = "MPI_Allreduce",
    .reduce_support = mpi_reduce_support,
    .allreduce = mpi_offload_allreduce,
};

/* Ranks per node when nodes hold equal, consecutive blocks of ranks; else 0. layout holds
 * (node rank, node size) of every rank, a record of `stride` ints each. */
static int packed_node_size(int size, const int *layout, int stride)
{
    int node_size = layout[1];
    for (int r = 0; r < size; r++)
        if (layout[stride * r + 1] != node_size || layout[stride * r] != r % node_size) return 0;
    return node_size;
}

/*
 * Maps the shared window: rank 0's segment starts with the control block, then every rank's
 * staging area. Every rank calls this (it is collective) and every rank learns whether all
 * succeeded, so they keep or free the window together.
 */
static sumo_result map_window(mpi_transport *t, size_t stage, char *err, size_t errlen)
{
    int size = t->base.size, rank = t->base.rank;
    size_t ctl = (sumo__shm_ctl_bytes(size) + 4095) / 4096 * 4096;
    t->stage = calloc((size_t)size, sizeof *t->stage);
    void *base = NULL;
    MPI_Aint mine = (MPI_Aint)(stage + (rank == 0 ? ctl : 0));
    /* One node holds every rank here, so the communicator itself can share memory (and its
     * ranks are the window's ranks). */
    int rc = MPI_Win_allocate_shared(mine, 1, MPI_INFO_NULL, t->comm, &base, &t->win);
    if (rc != MPI_SUCCESS) {
        snprintf(err, errlen, "MPI_Win_allocate_shared of %zu bytes failed", (size_t)mine);
        free(t->stage);
        t->stage = NULL;
        return SUMO_ERR_SYSTEM;
    }
    int ok = t->stage != NULL;
    sumo__shm_ctl *ctlp = NULL;
    for (int r = 0; r < size && ok; r++) {
        MPI_Aint bytes;
        int disp;
        void *ptr = NULL;
        if (MPI_Win_shared_query(t->win, r, &bytes, &disp, &ptr) != MPI_SUCCESS || ptr == NULL) ok = 0;
        else t->stage[r] = (unsigned char *)ptr + (r == 0 ? ctl : 0);
        if (r == 0) ctlp = ptr;
    }
    /* Loads and stores into the window are ordered by our own atomics; the passive epoch
     * keeps that legal under MPI's memory model. */
    if (ok) MPI_Win_lock_all(MPI_MODE_NOCHECK, t->win);
    if (ok && rank == 0) {
        memset(ctlp, 0, ctl);
        sumo__shm_ctl_init(ctlp, size);
    }
    if (ok) MPI_Win_sync(t->win);
    /* Publishes the initialised control block and tells everyone whether all ranks mapped. */
    int all_ok = 0;
    if (MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, t->comm) != MPI_SUCCESS) all_ok = 0;
    if (ok) MPI_Win_sync(t->win);
    if (!all_ok) {
        snprintf(err, errlen, "mapping the shared window failed on %s", ok ? "a peer" : "this rank");
        if (ok) MPI_Win_unlock_all(t->win);
        MPI_Win_free(&t->win);
        free(t->stage);
        t->stage = NULL;
        return SUMO_ERR_SYSTEM;
    }
    t->have_win = true;
    t->shm = (sumo__shm){.ctl = ctlp,
                         .rank = rank,
                         .size = size,
                         .same_address_space = false,
                         .stage = t->stage,
                         .stage_bytes = stage,
                         .spin_limit = sumo__shm_default_spin_limit(size)};
    t->base.reach = SUMO__REACH_STAGED;
    t->base.stage_bytes = stage;
    return SUMO_SUCCESS;
}

/*
 * Everything after the duplication is collective and must take the same branch on every
 * rank; a launcher may hand ranks different environments, so the ranks agree on the settings
 * (rank 0's staging size, shared memory only if all want it) before acting on them.
 */
static sumo_result setup(mpi_transport *t, char *err, size_t errlen)
{
    int size = t->base.size;
    MPI_Comm node = MPI_COMM_NULL;
    if (MPI_Comm_split_type(t->comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) != MPI_SUCCESS) {
        snprintf(err, errlen, "MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) failed");
        return SUMO_ERR_SYSTEM;
    }
    int node_rank = 0, node_size = 0;
    MPI_Comm_rank(node, &node_rank);
    MPI_Comm_size(node, &node_size);
    MPI_Comm_free(&node);
    /* Every rank reads both (a rank that refuses one fails every rank, after the agreement
     * below); only rank 0's staging size counts. */
    sumo__setting_value want = {0}, staging = {0};
    char refused[256] = "";
    bool settings_ok =
        sumo__setting_read(SUMO__SETTING_MPI_SHM, &want, refused, sizeof refused) == SUMO_SUCCESS &&
        sumo__setting_read(SUMO__SETTING_SHM_STAGE_BYTES, &staging, refused, sizeof refused) ==
            SUMO_SUCCESS;
    /* Per rank: node rank, node size, wants shared memory, staging bytes / 4096. */
    int mine[4] = {node_rank, node_size, want.integer == 1, (int)(staging.integer / 4096)};
    int *all = malloc(sizeof(int) * 4 * (size_t)size);
    /* 0: fine, 1: out of memory, 2: a setting refused (the worst counts). */
    int trouble = !settings_ok ? 2 : all == NULL ? 1 : 0, worst = 1;
    if (MPI_Allreduce(&trouble, &worst, 1, MPI_INT, MPI_MAX, t->comm) != MPI_SUCCESS) worst = 1;
    if (worst != 0) {
        if (!settings_ok) snprintf(err, errlen, "%s", refused);
        else if (worst == 2) snprintf(err, errlen, "a peer refused SUMO_MPI_SHM or "
                                                   "SUMO_SHM_STAGE_BYTES (it printed why)");
        else snprintf(err, errlen, "cannot allocate the node layout on %s",
                      trouble ? "this rank" : "a peer");
        free(all);
        return worst == 2 ? SUMO_ERR_INVALID_ARGUMENT : SUMO_ERR_SYSTEM;
    }
    if (MPI_Allgather(mine, 4, MPI_INT, all, 4, MPI_INT, t->comm) != MPI_SUCCESS) {
        snprintf(err, errlen, "MPI_Allgather of the node layout failed");
        free(all);
        return SUMO_ERR_SYSTEM;
    }
    bool want_shm = size > 1 && node_size == size;
    for (int r = 0; r < size; r++) want_shm = want_shm && all[4 * r + 2];
    size_t stage = (size_t)all[3] * 4096;
    t->base.node_local_size = packed_node_size(size, all, 4);
    free(all);
    return want_shm ? map_window(t, stage, err, errlen) : SUMO_SUCCESS;
}

sumo_result sumo__mpi_transport_create(MPI_Comm comm, const sumo__env *env,
                                       sumo__transport **out, char *err, size_t errlen)
{
    mpi_transport *t = calloc(1, sizeof *t);
    unsigned char *gather_buf = NULL;
    int size = 0;
    if (MPI_Comm_size(comm, &size) != MPI_SUCCESS) {
        snprintf(err, errlen, "MPI_Comm_size failed: not a valid communicator");
        free(t);
        return SUMO_ERR_INVALID_ARGUMENT;
    }
    gather_buf = malloc(SUMO__ANNOUNCE_BYTES * (size_t)size);
    /* A local failure here cannot be told to the peers before the communicator exists; they
     * then time out in the duplication below instead of hanging. */
    if (t == NULL || gather_buf == NULL) {
        snprintf(err, errlen, "out of memory creating the MPI transport");
        free(t);
        free(gather_buf);
        return SUMO_ERR_SYSTEM;
    }
    t->gather_buf = gather_buf;
    t->base = (sumo__transport){.ops = &mpi_ops,
                                .offload = &mpi_offload,
                                .timeout_ns = (int64_t)(env->timeout_s * 1e9),
                                .log_level = env->log_level};
    /* The nonblocking duplication makes a rank that never calls create a timeout here. The
     * calls after it are blocking (MPI has no nonblocking split or window allocation), but
     * they only run once every rank has arrived. */
    MPI_Request req;
    int rc = MPI_Comm_idup(comm, &t->comm, &req);
    if (rc == MPI_SUCCESS)
        rc = poll_requests(&req, 1, MPI_STATUSES_IGNORE, sumo__now_ns() + t->base.timeout_ns, NULL);
    if (rc != MPI_SUCCESS) {
        if (rc == POLL_TIMED_OUT)
            snprintf(err, errlen, "MPI_Comm_idup: not every rank called sumo_comm_create_mpi "
                                  "within %.3f s (SUMO_TIMEOUT)", (double)t->base.timeout_ns / 1e9);
        else snprintf(err, errlen, "MPI_Comm_idup failed");
        /* A pending duplication may still write t->comm: t is left to it. */
        return rc == POLL_TIMED_OUT ? SUMO_ERR_TIMEOUT : SUMO_ERR_SYSTEM;
    }
    /* Our failures are statuses, not the default abort of the whole job. */
    MPI_Comm_set_errhandler(t->comm, MPI_ERRORS_RETURN);
    int level = MPI_THREAD_SINGLE;
    MPI_Query_thread(&level);
    t->base.caller_thread_only = level < MPI_THREAD_MULTIPLE;
    MPI_Comm_rank(t->comm, &t->base.rank);
    MPI_Comm_size(t->comm, &t->base.size);
    sumo_result r = setup(t, err, errlen);
    if (r != SUMO_SUCCESS) {
        MPI_Comm_free(&t->comm);
        free(t->gather_buf);
        free(t);
        return r;
    }
    *out = &t->base;
    return SUMO_SUCCESS;
}
