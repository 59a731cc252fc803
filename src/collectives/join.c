/*
 * Joining (sumo_join, Horovod's hvd.join): a rank with no more data answers the collectives
 * its peers go on running, from their announcements (collectives/agree.h), until every rank
 * has joined. The peers pay nothing while no rank has joined: the joined rank's announcement
 * takes the place of the one it would have made, and only an allreduce that meets a joined
 * rank takes a second agreement, in which that rank announces the same allreduce over zeros
 * of its own. The zeros lie in the memory the peers announced (its kernel table allocates
 * and fills them), so the data phase is the ordinary one, on every transport.
 */
#include "collectives/agree.h"
#include "collectives/execute.h"
#include "collectives/requests.h"

#include <stdatomic.h>

/* This rank's zeros, kept between the collectives it answers. */
typedef struct zeros {
    const sumo_kernel_table *k;
    void *p;
    size_t bytes;
} zeros;

/* The kernel table of the memory the peers announced, or NULL where this rank has none. */
static const sumo_kernel_table *table_of(const sumo_comm *c, uint32_t memory)
{
    if (sumo__memory_id(sumo__host_kernels()) == memory) return sumo__host_kernels();
    for (int i = 0; i < c->ntables; i++)
        if (sumo__memory_id(c->tables[i]) == memory) return c->tables[i];
    return NULL;
}

static void release(zeros *z)
{
    if (z->p == NULL) return;
    /* The last allreduce may still read them on the table's stream. */
    z->k->synchronize(z->k->ctx, NULL);
    z->k->release(z->k->ctx, z->p);
    *z = (zeros){0};
}

/* count zeros of dtype in the memory of the announced allreduce, in *out (NULL for none);
 * the reason of a failure recorded. */
static sumo_result zeros_for(sumo_comm *c, const sumo__call_desc *call, zeros *z, void **out)
{
    *out = NULL;
    const sumo_kernel_table *k = table_of(c, call->memory);
    if (k == NULL)
        return SUMO__COMM_FAIL(c, SUMO_ERR_INVALID_USAGE,
                               "join: the other ranks' allreduce is in a memory this rank has "
                               "no kernel table for; add its table (sumo_comm_add_kernels) "
                               "before sumo_join");
    size_t bytes;
    if (!sumo__dtype_valid((int)call->dtype) || call->count > SIZE_MAX ||
        sumo__mul_overflows((size_t)call->count, sumo__dtype_bytes((sumo_dtype)call->dtype),
                            &bytes))
        return SUMO__COMM_FAIL(c, SUMO_ERR_INVALID_ARGUMENT,
                               "join: the other ranks' allreduce of %llu elements of dtype %u "
                               "does not fit this rank's memory",
                               (unsigned long long)call->count, call->dtype);
    if (bytes == 0) return SUMO_SUCCESS;
    if (z->k != k || z->bytes < bytes) {
        release(z);
        void *p = NULL;
        sumo_result r = k->alloc(k->ctx, bytes, &p);
        if (r != SUMO_SUCCESS || p == NULL)
            return SUMO__COMM_FAIL(c, r == SUMO_SUCCESS ? SUMO_ERR_SYSTEM : r,
                                   "join: cannot allocate %zu bytes of %s memory for this "
                                   "rank's zeros",
                                   bytes, k->memory);
        *z = (zeros){.k = k, .p = p, .bytes = bytes};
    }
    /* Refilled every time: the allreduce runs in place, so its output is what lies there. */
    sumo__exec x = {.k = k, .stream = NULL};
    sumo_result r = sumo__k_fill(&x, (sumo_dtype)call->dtype, z->p, 0.0, (size_t)call->count);
    if (r != SUMO_SUCCESS)
        return SUMO__COMM_FAIL(c, r, "join: the %s kernels could not write this rank's zeros",
                               k->memory);
    *out = z->p;
    return SUMO_SUCCESS;
}

/* The peers' allreduce (announced as call), with zeros as this rank's part: its second
 * agreement is the one the allreduce makes. A rank that cannot make its zeros fails there,
 * so every rank learns it before any data moves. */
static sumo_result answer_allreduce(sumo_comm *c, const sumo__call_desc *call, zeros *z)
{
    void *buf;
    sumo_result r = zeros_for(c, call, z, &buf);
    if (r != SUMO_SUCCESS) return sumo__fail_held(c, r);
    return sumo__allreduce_held(c, buf, buf, (size_t)call->count, (sumo_dtype)call->dtype,
                                (sumo_op)call->op);
}

/* The rank that joined last: the highest join round, of equal rounds the highest rank. */
static int last_joined(const sumo_comm *c, const sumo__call_desc *all)
{
    int last = 0;
    for (int r = 1; r < c->tp->size; r++)
        if (all[r].aux >= all[last].aux) last = r;
    return last;
}

static sumo_result join_run(sumo_comm *c, void *args)
{
    int *last = *(int **)args;
    uint64_t round = c->announces;
    zeros z = {0};
    sumo_result r;
    for (;;) {
        c->x = sumo__host_exec();
        sumo__call_desc d = {.kind = SUMO__CALL_JOIN, .aux = round};
        const sumo__call_desc *all;
        int active;
        r = sumo__agree_join(c, &d, &all, &active);
        /* The others' call, answered here when the agreement was all of it (a barrier, a
         * refusal), counts as it does on their side. */
        if (active >= 0 && (r != SUMO_SUCCESS || all[active].kind == SUMO__CALL_BARRIER))
            atomic_fetch_add_explicit(&c->rounds, 1, memory_order_relaxed);
        if (r != SUMO_SUCCESS) break;
        if (active < 0) {
            *last = last_joined(c, all);
            break;
        }
        /* Copied: the next agreement overwrites the announcements. */
        sumo__call_desc call = all[active];
        if (call.kind == SUMO__CALL_BARRIER) continue;
        r = answer_allreduce(c, &call, &z);
        if (r != SUMO_SUCCESS) break;
    }
    release(&z);
    return r;
}

sumo_result sumo_join(sumo_comm *comm, int *last_joined_rank)
{
    if (comm == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    if (last_joined_rank == NULL)
        return SUMO__COMM_FAIL(comm, SUMO_ERR_INVALID_ARGUMENT, "sumo_join: last_joined is NULL");
    *last_joined_rank = -1;
    /* Held, after the queued requests, as a blocking collective. */
    sumo__call call = sumo__composite(join_run, &last_joined_rank, sizeof last_joined_rank);
    return sumo__submit(comm, &call, NULL);
}
