/*
 * The caller's transport behind the internal interface. Its operations get absolute deadlines
 * (the group's timeout from the start of each operation) and report failures as statuses;
 * this file records their detail in the communicator's status, and any failure other than a
 * shared verdict breaks the group as sumo__transport_fail says. Reach is NONE: the collectives
 * run their point-to-point algorithms over sendrecv alone.
 */
#include "transport/transport_ext.h"

#include <stdlib.h>

typedef struct ext_transport {
    sumo__transport base;
    sumo__transport_ops named; /* ext_ops under the caller's name */
    const sumo_transport_ops *ops;
    void *ctx;
} ext_transport;

static sumo_result failed(ext_transport *t, sumo_result r, const char *what)
{
    if (r == SUMO_SUCCESS) return r;
    const char *detail = t->ops->error_message ? t->ops->error_message(t->ctx) : NULL;
    /* A transport's own failure is never one every rank reached together. */
    sumo_result code = r == SUMO_ERR_TIMEOUT || r == SUMO_ERR_PEER_FAILURE || r == SUMO_ERR_SYSTEM
                           ? r
                           : SUMO_ERR_INTERNAL;
    return SUMO__FAIL(&t->base, code, "%s transport, %s on rank %d: %s (%s)", t->ops->name, what,
                      t->base.rank, detail && *detail ? detail : "no detail given",
                      sumo_result_name(r));
}

static int64_t deadline(const sumo__transport *tp) { return sumo__now_ns() + tp->timeout_ns; }

static sumo_result ext_sendrecv(sumo__transport *tp, const void *sbuf, size_t sbytes, int dst,
                                void *rbuf, size_t rbytes, int src)
{
    ext_transport *t = (ext_transport *)tp;
    return failed(t, t->ops->sendrecv(t->ctx, sbuf, sbytes, dst, rbuf, rbytes, src, deadline(tp)),
                  "sendrecv");
}

static sumo_result ext_announce(sumo__transport *tp, const void *record, void *all, size_t bytes)
{
    ext_transport *t = (ext_transport *)tp;
    return failed(t, t->ops->allgather(t->ctx, record, all, bytes, deadline(tp)), "allgather");
}

static sumo_result ext_barrier(sumo__transport *tp)
{
    ext_transport *t = (ext_transport *)tp;
    return failed(t, t->ops->barrier(t->ctx, deadline(tp)), "barrier");
}

static void ext_abort(sumo__transport *tp)
{
    ext_transport *t = (ext_transport *)tp;
    if (t->ops->abort) t->ops->abort(t->ctx);
}

static bool ext_carries(sumo__transport *tp, const char *memory)
{
    ext_transport *t = (ext_transport *)tp;
    return t->ops->carries != NULL && t->ops->carries(t->ctx, memory);
}

static sumo_result ext_destroy(sumo__transport *tp)
{
    ext_transport *t = (ext_transport *)tp;
    sumo_result r = t->ops->destroy(t->ctx);
    free(t);
    return r;
}

static const sumo__transport_ops ext_ops = {
    .name = "ext",
    .sendrecv = ext_sendrecv,
    .announce = ext_announce,
    .barrier = ext_barrier,
    .abort = ext_abort,
    .destroy = ext_destroy,
    .carries = ext_carries,
};

/* Why desc cannot make a transport, or NULL. */
static const char *desc_problem(const sumo_transport_desc *desc)
{
    const char *bad;
    if (desc == NULL) return "NULL description";
    if ((bad = SUMO__STRUCT_SIZE_PROBLEM(desc, sumo_transport_desc, NULL, 0)) != NULL) return bad;
    if (desc->ops == NULL) return "no operations";
    if ((bad = SUMO__STRUCT_SIZE_PROBLEM(desc->ops, sumo_transport_ops, NULL, 0)) != NULL)
        return bad;
    if (!desc->ops->sendrecv || !desc->ops->allgather || !desc->ops->barrier || !desc->ops->destroy)
        return "sendrecv, allgather, barrier and destroy are required";
    if (desc->size < 1 || desc->rank < 0 || desc->rank >= desc->size)
        return "rank out of range, or size < 1";
    if (desc->node_local_size < 0 ||
        (desc->node_local_size > 0 && desc->size % desc->node_local_size != 0))
        return "node_local_size must be 0 or divide size";
    return NULL;
}

sumo_result sumo__ext_transport_create(const sumo_transport_desc *desc, const sumo__env *env,
                                       sumo__transport **out, const char **why)
{
    const char *bad = desc_problem(desc);
    if (why) *why = bad;
    if (bad) return SUMO_ERR_INVALID_ARGUMENT;
    ext_transport *t = calloc(1, sizeof *t);
    if (t == NULL) return SUMO_ERR_SYSTEM;
    t->ops = desc->ops;
    t->ctx = desc->ctx;
    t->named = ext_ops;
    if (desc->ops->name) t->named.name = desc->ops->name;
    t->base = (sumo__transport){.ops = &t->named,
                                .rank = desc->rank,
                                .size = desc->size,
                                .timeout_ns = (int64_t)(env->timeout_s * 1e9),
                                .log_level = env->log_level,
                                .node_local_size = desc->node_local_size,
                                .reach = SUMO__REACH_NONE};
    *out = &t->base;
    return SUMO_SUCCESS;
}
