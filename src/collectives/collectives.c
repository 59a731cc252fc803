/*
 * The public collectives: each fills the one descriptor and submits it (requests.c), which
 * runs it now or queues it; execute.c does the rest. Also the handle-wide failures: failing
 * together and giving up.
 */
#include "collectives/collectives.h"
#include "collectives/requests.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

/* ---- the descriptors of the public collectives --------------------------------------------- */

sumo_result sumo_allreduce(const void *sendbuf, void *recvbuf, size_t count, sumo_dtype dtype,
                           sumo_op op, sumo_comm *comm)
{
    sumo__call call = sumo__allreduce_call(sendbuf, recvbuf, count, dtype, op);
    return sumo__submit(comm, &call, NULL);
}

sumo_result sumo_allreduce_start(const void *sendbuf, void *recvbuf, size_t count,
                                 sumo_dtype dtype, sumo_op op, sumo_comm *comm,
                                 sumo_request **request)
{
    if (request == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    sumo__call call = sumo__allreduce_call(sendbuf, recvbuf, count, dtype, op);
    return sumo__submit(comm, &call, request);
}

sumo_result sumo_allgather(const void *sendbuf, void *recvbuf, size_t sendcount, sumo_dtype dtype,
                           sumo_comm *comm)
{
    sumo__call call = sumo__allgather_call(sendbuf, recvbuf, sendcount, dtype);
    return sumo__submit(comm, &call, NULL);
}

sumo_result sumo_allgather_start(const void *sendbuf, void *recvbuf, size_t sendcount,
                                 sumo_dtype dtype, sumo_comm *comm, sumo_request **request)
{
    if (request == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    sumo__call call = sumo__allgather_call(sendbuf, recvbuf, sendcount, dtype);
    return sumo__submit(comm, &call, request);
}

sumo_result sumo_broadcast(const void *sendbuf, void *recvbuf, size_t count, sumo_dtype dtype,
                           int root, sumo_comm *comm)
{
    sumo__call call = sumo__broadcast_call(sendbuf, recvbuf, count, dtype, root);
    return sumo__submit(comm, &call, NULL);
}

sumo_result sumo_broadcast_start(const void *sendbuf, void *recvbuf, size_t count,
                                 sumo_dtype dtype, int root, sumo_comm *comm,
                                 sumo_request **request)
{
    if (request == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    sumo__call call = sumo__broadcast_call(sendbuf, recvbuf, count, dtype, root);
    return sumo__submit(comm, &call, request);
}

sumo_result sumo_reduce_scatter(const void *sendbuf, void *recvbuf, size_t recvcount,
                                sumo_dtype dtype, sumo_op op, sumo_comm *comm)
{
    sumo__call call = sumo__reduce_scatter_call(sendbuf, recvbuf, recvcount, dtype, op);
    return sumo__submit(comm, &call, NULL);
}

sumo_result sumo_reduce_scatter_start(const void *sendbuf, void *recvbuf, size_t recvcount,
                                      sumo_dtype dtype, sumo_op op, sumo_comm *comm,
                                      sumo_request **request)
{
    if (request == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    sumo__call call = sumo__reduce_scatter_call(sendbuf, recvbuf, recvcount, dtype, op);
    return sumo__submit(comm, &call, request);
}

sumo_result sumo_allreduce_compressed(const float *sendbuf, float *recvbuf, size_t count,
                                      const sumo_compression *options, sumo_comm *comm)
{
    sumo__call call = sumo__allreduce_compressed_call(sendbuf, recvbuf, count, options);
    return sumo__submit(comm, &call, NULL);
}

sumo_result sumo_allreduce_compressed_start(const float *sendbuf, float *recvbuf, size_t count,
                                            const sumo_compression *options, sumo_comm *comm,
                                            sumo_request **request)
{
    if (request == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    sumo__call call = sumo__allreduce_compressed_call(sendbuf, recvbuf, count, options);
    return sumo__submit(comm, &call, request);
}

sumo_result sumo_barrier(sumo_comm *comm)
{
    sumo__call call = {.kind = SUMO__CALL_BARRIER};
    return sumo__submit(comm, &call, NULL);
}

/* The public descriptor, for callers that pass a stream (sumo_ext.h). */
static sumo_result from_public(sumo_comm *comm, const sumo_collective *pc, sumo__call *call)
{
    if (pc == NULL) return SUMO__COMM_FAIL(comm, SUMO_ERR_INVALID_ARGUMENT, "sumo_collective: NULL");
    char why[256];
    if (SUMO__STRUCT_SIZE_PROBLEM(pc, sumo_collective, why, sizeof why))
        return SUMO__COMM_FAIL(comm, SUMO_ERR_INVALID_ARGUMENT, "%s", why);
    static const uint32_t kinds[] = {
        [SUMO_COLLECTIVE_ALLREDUCE] = SUMO__CALL_ALLREDUCE,
        [SUMO_COLLECTIVE_BROADCAST] = SUMO__CALL_BROADCAST,
        [SUMO_COLLECTIVE_ALLGATHER] = SUMO__CALL_ALLGATHER,
        [SUMO_COLLECTIVE_REDUCE_SCATTER] = SUMO__CALL_REDUCE_SCATTER,
        [SUMO_COLLECTIVE_BARRIER] = SUMO__CALL_BARRIER,
    };
    if ((unsigned)pc->kind >= sizeof kinds / sizeof kinds[0] || kinds[pc->kind] == 0)
        return SUMO__COMM_FAIL(comm, SUMO_ERR_INVALID_ARGUMENT, "sumo_collective: unknown kind %d",
                               (int)pc->kind);
    *call = (sumo__call){.kind = kinds[pc->kind], .sendbuf = pc->sendbuf, .recvbuf = pc->recvbuf,
                         .count = pc->count, .dtype = pc->dtype, .op = pc->op, .root = pc->root,
                         .stream = pc->stream};
    return SUMO_SUCCESS;
}

sumo_result sumo_collective_run(sumo_comm *comm, const sumo_collective *collective)
{
    if (comm == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    sumo__call call;
    /* A malformed descriptor is this rank's failure: its peers learn it in the agreement. */
    sumo_result r = from_public(comm, collective, &call);
    if (r != SUMO_SUCCESS) call = (sumo__call){.kind = SUMO__CALL_FAIL, .fail = r};
    return sumo__submit(comm, &call, NULL);
}

sumo_result sumo_collective_start(sumo_comm *comm, const sumo_collective *collective,
                                  sumo_request **request)
{
    if (comm == NULL || request == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    sumo__call call;
    sumo_result r = from_public(comm, collective, &call);
    if (r != SUMO_SUCCESS) call = (sumo__call){.kind = SUMO__CALL_FAIL, .fail = r};
    return sumo__submit(comm, &call, request);
}

/* ---- failing together, giving up -------------------------------------------------------- */

sumo_result sumo_comm_fail(sumo_comm *comm, sumo_result code, const char *message)
{
    if (comm == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    if (code == SUMO_SUCCESS || code == SUMO_ERR_TIMEOUT || code == SUMO_ERR_PEER_FAILURE ||
        (unsigned)code >= SUMO_RESULT_COUNT || code == SUMO_IN_PROGRESS)
        return SUMO__COMM_FAIL(comm, SUMO_ERR_INVALID_ARGUMENT,
                               "sumo_comm_fail: code %d is not a failure the ranks can share",
                               (int)code);
    sumo__call call = {.kind = SUMO__CALL_FAIL, .fail = code};
    sumo_result r = sumo__submit(comm, &call, NULL);
    if (r == SUMO_ERR_TIMEOUT || r == SUMO_ERR_PEER_FAILURE) return r;
    /* The message is this rank's; the peers' messages name this rank and the code. */
    SUMO__FAIL_TOGETHER(comm->tp, code, "%s", message ? message : "sumo_comm_fail");
    return code;
}

sumo_result sumo_comm_abort(sumo_comm *comm, const char *message)
{
    if (comm == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    /* Not under the handle's lock: a collective in progress on another thread must see the
     * abort and fail, which is the point. The first caller writes the message, then publishes
     * it; the handle's next entry into a collective records it (sumo__usable). */
    int idle = 0;
    if (atomic_compare_exchange_strong(&comm->aborted, &idle, 1)) {
        snprintf(comm->abort_message, sizeof comm->abort_message, "%s",
                 message ? message : "aborted by the caller");
        atomic_store_explicit(&comm->aborted, 2, memory_order_release);
    }
    comm->tp->ops->abort(comm->tp);
    return SUMO_SUCCESS;
}

/* ---- the layers' own calls on the one path ------------------------------------------------ */

sumo_result sumo__agree_setup(sumo_comm *c, sumo_result local, uint64_t fingerprint,
                              const char *what)
{
    sumo__call call = {.kind = SUMO__CALL_SETUP, .fail = local, .hash = fingerprint,
                       .what = what};
    return sumo__submit(c, &call, NULL);
}

static sumo_result op_destroy_run(sumo_comm *comm, void *args)
{
    return sumo__op_remove(comm, *(sumo_op *)args);
}

sumo_result sumo_op_destroy(sumo_comm *comm, sumo_op op)
{
    if (comm == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    /* Queued requests may still use the op: they run first, as for a blocking collective.
     * Local: nothing is announced. */
    sumo__call call = sumo__composite(op_destroy_run, &op, sizeof op);
    return sumo__submit(comm, &call, NULL);
}
