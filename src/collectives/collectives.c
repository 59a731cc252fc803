/*
 * The public collectives: local checks, the choice of algorithm, and the handle's locking.
 * The algorithms live in shm_algos.c (ranks that reach each other's memory) and p2p_algos.c
 * (messages only); Adasum in adasum.c; every one starts with the agreement of agree.c.
 *
 * The one path of an allreduce: sumo_allreduce -> sumo__allreduce_locked (validate, pick) ->
 * an algorithm -> sumo__agree (transport announce, compare) -> the data phase over the
 * transport's sendrecv / peer buffers / staging areas / offload, kernels from the handle's
 * kernel table -> the status (the handle's message on failure).
 */
#include "collectives/collectives.h"
#include "collectives/adasum.h"
#include "collectives/p2p_algos.h"
#include "collectives/shm_algos.h"
#include "collectives/slices.h"

#include <string.h>

#define SMALL_MESSAGE_BYTES (64 * 1024)

/* Local checks, no communication. Returns the code and records why. */
static sumo_result validate(sumo_comm *c, const sumo__call_desc *d, const void *sendbuf, void *recvbuf,
                            size_t send_bytes, size_t recv_bytes)
{
    sumo__transport *tp = c->tp;
    const char *what = d->kind == SUMO__CALL_ALLREDUCE   ? "allreduce"
                       : d->kind == SUMO__CALL_BROADCAST ? "broadcast"
                                                         : "allgather";
    if (!sumo__dtype_valid((int)d->dtype))
        return SUMO__COMM_FAIL(c, SUMO_ERR_INVALID_ARGUMENT, "%s: unknown dtype %u", what, d->dtype);
    if (d->kind == SUMO__CALL_ALLREDUCE && d->op >= SUMO_OP_PREDEFINED_COUNT)
        return SUMO__COMM_FAIL(c, SUMO_ERR_INVALID_ARGUMENT, "%s: unknown op %u", what, d->op);
    if (d->kind == SUMO__CALL_BROADCAST && (d->root < 0 || d->root >= tp->size))
        return SUMO__COMM_FAIL(c, SUMO_ERR_INVALID_ARGUMENT, "%s: root %d out of range [0, %d)", what,
                          d->root, tp->size);
    if (send_bytes == SIZE_MAX || recv_bytes == SIZE_MAX)
        return SUMO__COMM_FAIL(c, SUMO_ERR_INVALID_ARGUMENT, "%s: count %llu overflows size_t", what,
                          (unsigned long long)d->count);
    bool needs_send = !(d->kind == SUMO__CALL_BROADCAST && d->root != tp->rank);
    if ((needs_send && send_bytes && sendbuf == NULL) || (recv_bytes && recvbuf == NULL))
        return SUMO__COMM_FAIL(c, SUMO_ERR_INVALID_ARGUMENT, "%s: NULL buffer with count %llu", what,
                          (unsigned long long)d->count);
    if (needs_send && sendbuf != recvbuf) {
        bool in_place_gather = d->kind == SUMO__CALL_ALLGATHER &&
                               (const unsigned char *)sendbuf ==
                                   (unsigned char *)recvbuf + (size_t)tp->rank * send_bytes;
        if (!in_place_gather && sumo__ranges_overlap(sendbuf, send_bytes, recvbuf, recv_bytes))
            return SUMO__COMM_FAIL(c, SUMO_ERR_INVALID_ARGUMENT,
                              "%s: send and receive buffers overlap without being the same "
                              "pointer",
                              what);
    }
    return SUMO_SUCCESS;
}

/* Messages through the peer library's own allreduce: a sum it supports, divided here. */
static sumo_result offload_allreduce(sumo_comm *c, sumo__call_desc *d, const void *sendbuf,
                                     void *recvbuf)
{
    sumo__transport *tp = c->tp;
    SUMO__CHECK(sumo__agree(c, d, NULL));
    SUMO__CHECK(tp->offload->allreduce(tp, sendbuf, recvbuf, d->count, d->dtype, SUMO_OP_SUM));
    /* Divide (not multiply by 1/P), as every other path does. */
    if (d->op == SUMO_OP_AVERAGE) c->kernels->divide(d->dtype, recvbuf, recvbuf, d->count, tp->size);
    return SUMO_SUCCESS;
}

static bool offload_supports(const sumo__transport *tp, const sumo__call_desc *d)
{
    return tp->offload != NULL && tp->offload->reduce_support(tp, d->dtype, SUMO_OP_SUM);
}

static sumo_algorithm pick_allreduce(sumo_comm *c, const sumo__call_desc *d)
{
    if (c->algo != SUMO_ALGORITHM_AUTO) return c->algo;
    if (c->tp->reach != SUMO__REACH_NONE) return SUMO_ALGORITHM_SHARED_MEMORY;
    size_t bytes = d->count * sumo__dtype_bytes(d->dtype);
    if (bytes <= SMALL_MESSAGE_BYTES)
        return offload_supports(c->tp, d) ? SUMO_ALGORITHM_PEER : SUMO_ALGORITHM_RECURSIVE_DOUBLING;
    return SUMO_ALGORITHM_RING;
}

static bool use_shared_memory(const sumo_comm *c)
{
    return c->tp->reach != SUMO__REACH_NONE &&
           (c->algo == SUMO_ALGORITHM_AUTO || c->algo == SUMO_ALGORITHM_SHARED_MEMORY);
}

static size_t bytes_of(size_t count, sumo_dtype dtype)
{
    size_t b;
    if (!sumo__dtype_valid(dtype) || sumo__mul_overflows(count, sumo__dtype_bytes(dtype), &b))
        return SIZE_MAX;
    return b;
}

sumo_result sumo__allreduce_locked(sumo_comm *c, const void *sendbuf, void *recvbuf, size_t count,
                                   sumo_dtype dtype, sumo_op op)
{
    SUMO__CHECK(sumo__usable(c));
    if (sumo__op_is_adasum(op)) return sumo__allreduce_adasum(c, sendbuf, recvbuf, count, dtype, op);
    sumo__call_desc d = {.kind = SUMO__CALL_ALLREDUCE, .dtype = (uint32_t)dtype, .op = (uint32_t)op,
                         .count = count, .sendptr = (uintptr_t)sendbuf, .recvptr = (uintptr_t)recvbuf};
    size_t bytes = bytes_of(count, dtype);
    d.local_error = validate(c, &d, sendbuf, recvbuf, bytes, bytes);
    if (d.local_error == SUMO_SUCCESS) d.flags = sumo__shared_flag(c, sendbuf, bytes, recvbuf, bytes);
    sumo_algorithm algo = pick_allreduce(c, &d);
    if (d.local_error == SUMO_SUCCESS && algo == SUMO_ALGORITHM_PEER && !offload_supports(c->tp, &d))
        d.local_error = SUMO__COMM_FAIL(c, SUMO_ERR_INVALID_USAGE, "allreduce: %s has no %s %s",
                                        c->tp->offload->name, sumo__dtype_name(dtype),
                                        sumo__op_name(op));
    SUMO__LOG(c->tp->log_level, SUMO__LOG_INFO, "rank %d allreduce count %zu %s %s algo %d",
              c->tp->rank, count, sumo__dtype_name(dtype), sumo__op_name(op), (int)algo);
    if (d.local_error != SUMO_SUCCESS) return sumo__agree(c, &d, NULL);
    switch (algo) {
    case SUMO_ALGORITHM_SHARED_MEMORY: return sumo__shm_allreduce(c, &d, sendbuf, recvbuf);
    case SUMO_ALGORITHM_RING: return sumo__ring_allreduce(c, &d, sendbuf, recvbuf);
    case SUMO_ALGORITHM_RECURSIVE_DOUBLING: return sumo__rd_allreduce(c, &d, sendbuf, recvbuf);
    case SUMO_ALGORITHM_PEER: return offload_allreduce(c, &d, sendbuf, recvbuf);
    default: return SUMO__COMM_FAIL(c, SUMO_ERR_INTERNAL, "allreduce: unknown algorithm %d", (int)algo);
    }
}

sumo_result sumo_allreduce(const void *sendbuf, void *recvbuf, size_t count, sumo_dtype dtype,
                           sumo_op op, sumo_comm *comm)
{
    if (comm == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    sumo__comm_enter(comm);
    sumo_result r = sumo__allreduce_locked(comm, sendbuf, recvbuf, count, dtype, op);
    sumo__comm_leave(comm);
    return r;
}

static sumo_result broadcast_locked(sumo_comm *c, const void *sendbuf, void *recvbuf, size_t count,
                                    sumo_dtype dtype, int root)
{
    SUMO__CHECK(sumo__usable(c));
    sumo__call_desc d = {.kind = SUMO__CALL_BROADCAST, .dtype = (uint32_t)dtype, .root = root,
                         .count = count, .sendptr = (uintptr_t)sendbuf, .recvptr = (uintptr_t)recvbuf};
    size_t bytes = bytes_of(count, dtype);
    d.local_error = validate(c, &d, sendbuf, recvbuf, bytes, bytes);
    if (d.local_error != SUMO_SUCCESS) return sumo__agree(c, &d, NULL);
    /* Only the root's send buffer is read. */
    d.flags = sumo__shared_flag(c, root == c->tp->rank ? sendbuf : NULL, bytes, recvbuf, bytes);
    if (use_shared_memory(c)) return sumo__shm_broadcast(c, &d, sendbuf, recvbuf);
    return sumo__tree_broadcast(c, &d, sendbuf, recvbuf);
}

sumo_result sumo_broadcast(const void *sendbuf, void *recvbuf, size_t count, sumo_dtype dtype,
                           int root, sumo_comm *comm)
{
    if (comm == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    sumo__comm_enter(comm);
    sumo_result r = broadcast_locked(comm, sendbuf, recvbuf, count, dtype, root);
    sumo__comm_leave(comm);
    return r;
}

static sumo_result allgather_locked(sumo_comm *c, const void *sendbuf, void *recvbuf, size_t count,
                                    sumo_dtype dtype)
{
    SUMO__CHECK(sumo__usable(c));
    sumo__call_desc d = {.kind = SUMO__CALL_ALLGATHER, .dtype = (uint32_t)dtype, .count = count,
                         .sendptr = (uintptr_t)sendbuf, .recvptr = (uintptr_t)recvbuf};
    size_t send_bytes = bytes_of(count, dtype);
    size_t recv_bytes = SIZE_MAX;
    if (send_bytes != SIZE_MAX && sumo__mul_overflows(send_bytes, (size_t)c->tp->size, &recv_bytes))
        recv_bytes = SIZE_MAX;
    d.local_error = validate(c, &d, sendbuf, recvbuf, send_bytes, recv_bytes);
    if (d.local_error != SUMO_SUCCESS) return sumo__agree(c, &d, NULL);
    d.flags = sumo__shared_flag(c, sendbuf, send_bytes, recvbuf, recv_bytes);
    if (use_shared_memory(c)) return sumo__shm_allgather(c, &d, sendbuf, recvbuf);
    return sumo__ring_allgather(c, &d, sendbuf, recvbuf);
}

sumo_result sumo_allgather(const void *sendbuf, void *recvbuf, size_t sendcount, sumo_dtype dtype,
                           sumo_comm *comm)
{
    if (comm == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    sumo__comm_enter(comm);
    sumo_result r = allgather_locked(comm, sendbuf, recvbuf, sendcount, dtype);
    sumo__comm_leave(comm);
    return r;
}

sumo_result sumo_barrier(sumo_comm *comm)
{
    if (comm == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    sumo__comm_enter(comm);
    /* The agreement synchronises: no rank returns before every rank has announced. */
    sumo_result r = sumo__usable(comm);
    sumo__call_desc d = {.kind = SUMO__CALL_BARRIER};
    if (r == SUMO_SUCCESS) r = sumo__agree(comm, &d, NULL);
    sumo__comm_leave(comm);
    return r;
}
