/*
 * The one path of every collective: a public function (collectives.c) fills a sumo__call and
 * submits it (requests.c); sumo__execute validates it once (this file's validate: buffers, counts, dtype, root, the
 * op's kind, the memory the buffers live in), picks the algorithm, and the algorithm agrees
 * (agree.c) before any data moves. The algorithms live in shm_algos.c (ranks that reach each
 * other's memory), p2p_algos.c (messages only), adasum.c, adasum_rs.c (Adasum as a
 * reduce-scatter), gram.c and compressed.c.
 *
 * One allreduce, from the call down to the bytes: sumo_allreduce -> sumo__submit (the handle,
 * after the queued requests) -> sumo__execute (validate, the kernel table, pick) -> an
 * algorithm -> sumo__agree (transport announce, compare) -> the data phase over the
 * transport's sendrecv / peer buffers / staging areas / offload, data through the call's
 * kernel table -> the status (the handle's message on failure).
 */
#include "collectives/execute.h"
#include "collectives/adasum.h"
#include "collectives/adasum_rs.h"
#include "collectives/compressed.h"
#include "collectives/hier_algos.h"
#include "collectives/p2p_algos.h"
#include "collectives/shm_algos.h"
#include "collectives/slices.h"
#include "transport/transport_hier.h"

#include <string.h>

#define SMALL_MESSAGE_BYTES (64 * 1024)

static size_t bytes_of(size_t count, sumo_dtype dtype)
{
    size_t b;
    if (!sumo__dtype_valid(dtype) || sumo__mul_overflows(count, sumo__dtype_bytes(dtype), &b))
        return SIZE_MAX;
    return b;
}

/*
 * Local checks, no communication: the arguments, the op's kind, and the kernel table of the
 * buffers' memory (into *x). Returns the code and records why. send_bytes and recv_bytes are
 * what the call reads and writes on this rank.
 */
static sumo_result validate(sumo_comm *c, const sumo__call *call, sumo__call_desc *d,
                            const sumo__op_entry **op, sumo__exec *x)
{
    sumo__transport *tp = c->tp;
    const char *what = sumo__call_kind_name(call->kind);
    *op = NULL;
    *x = sumo__host_exec();
    if (call->kind == SUMO__CALL_BARRIER) return SUMO_SUCCESS;
    if (!sumo__dtype_valid((int)call->dtype))
        return SUMO__COMM_FAIL(c, SUMO_ERR_INVALID_ARGUMENT, "%s: unknown dtype %d", what,
                               (int)call->dtype);
    if (call->kind == SUMO__CALL_ALLREDUCE || call->kind == SUMO__CALL_REDUCE_SCATTER) {
        *op = sumo__op_find(c, call->op);
        if (*op == NULL)
            return SUMO__COMM_FAIL(c, SUMO_ERR_INVALID_ARGUMENT,
                                   "%s: op %u was not created on this communicator (or was "
                                   "destroyed)",
                                   what, call->op);
        if (call->kind == SUMO__CALL_REDUCE_SCATTER && (*op)->kind == SUMO__OP_ADASUM &&
            c->levels)
            return SUMO__COMM_FAIL(c, SUMO_ERR_INVALID_USAGE,
                                   "reduce_scatter with an Adasum op on a two-level "
                                   "communicator: it has no two-level form");
    }
    if (call->kind == SUMO__CALL_COMPRESSED)
        SUMO__CHECK(sumo__compressed_check(c, call->has_compression ? &call->compression : NULL,
                                           call->count));
    if (call->kind == SUMO__CALL_BROADCAST && (call->root < 0 || call->root >= tp->size))
        return SUMO__COMM_FAIL(c, SUMO_ERR_INVALID_ARGUMENT, "%s: root %d out of range [0, %d)",
                               what, call->root, tp->size);
    /* What has no two-level algorithm runs flat over options.any: a property of the
     * communicator, so every rank refuses alike, before the agreement. */
    if (c->levels && (call->kind == SUMO__CALL_GRAM || call->kind == SUMO__CALL_COMPRESSED) &&
        c->levels->any == NULL && c->levels->L > 1 && c->levels->H > 1)
        return SUMO__COMM_FAIL(c, SUMO_ERR_INVALID_USAGE,
                               "%s on a two-level communicator needs options.any (a "
                               "communicator of all ranks, sumo_comm_create_hier)", what);
    if (call->kind == SUMO__CALL_GRAM && tp->size > SUMO__GRAM_MAX_RANKS)
        return SUMO__COMM_FAIL(c, SUMO_ERR_INVALID_USAGE, "%s: %d ranks, at most %d", what,
                               tp->size, SUMO__GRAM_MAX_RANKS);
    /* What this rank reads and writes. */
    size_t bytes = bytes_of(call->count, call->dtype), send_bytes = bytes, recv_bytes = bytes;
    if (bytes != SIZE_MAX && call->kind == SUMO__CALL_ALLGATHER &&
        sumo__mul_overflows(bytes, (size_t)tp->size, &recv_bytes))
        recv_bytes = SIZE_MAX;
    if (bytes != SIZE_MAX && call->kind == SUMO__CALL_REDUCE_SCATTER &&
        sumo__mul_overflows(bytes, (size_t)tp->size, &send_bytes))
        send_bytes = SIZE_MAX;
    if (send_bytes == SIZE_MAX || recv_bytes == SIZE_MAX)
        return SUMO__COMM_FAIL(c, SUMO_ERR_INVALID_ARGUMENT, "%s: count %zu overflows size_t",
                               what, call->count);
    bool needs_send = !(call->kind == SUMO__CALL_BROADCAST && call->root != tp->rank);
    if ((needs_send && send_bytes && call->sendbuf == NULL) || (recv_bytes && call->recvbuf == NULL))
        return SUMO__COMM_FAIL(c, SUMO_ERR_INVALID_ARGUMENT, "%s: NULL buffer with count %zu",
                               what, call->count);
    if (needs_send && call->sendbuf != call->recvbuf) {
        /* NCCL's in-place forms: this rank's block of the larger buffer is the smaller one. */
        const unsigned char *s = call->sendbuf, *r = call->recvbuf;
        size_t mine = (size_t)tp->rank * bytes;
        bool blocks = call->kind == SUMO__CALL_ALLGATHER || call->kind == SUMO__CALL_REDUCE_SCATTER;
        bool in_place = (call->kind == SUMO__CALL_ALLGATHER && s == r + mine) ||
                        (call->kind == SUMO__CALL_REDUCE_SCATTER && r == s + mine);
        if (!in_place && sumo__ranges_overlap(s, send_bytes, r, recv_bytes))
            return SUMO__COMM_FAIL(c, SUMO_ERR_INVALID_ARGUMENT,
                                   "%s: send and receive buffers overlap without being the same "
                                   "pointer%s",
                                   what, blocks ? " (or this rank's block of the other)" : "");
    }
    /* The memory the buffers live in picks the kernels. */
    const sumo_kernel_table *ks = needs_send && send_bytes
                                      ? sumo__kernels_for(c, call->sendbuf, send_bytes)
                                      : NULL;
    const sumo_kernel_table *kr = recv_bytes ? sumo__kernels_for(c, call->recvbuf, recv_bytes) : NULL;
    if (ks && kr && ks != kr)
        return SUMO__COMM_FAIL(c, SUMO_ERR_INVALID_ARGUMENT,
                               "%s: the send buffer is %s memory and the receive buffer %s "
                               "memory; pass buffers of one memory",
                               what, ks->memory, kr->memory);
    x->k = kr ? kr : ks ? ks : sumo__host_kernels();
    if (c->levels && x->k != sumo__host_kernels() &&
        (call->kind == SUMO__CALL_GRAM || call->kind == SUMO__CALL_COMPRESSED))
        return SUMO__COMM_FAIL(c, SUMO_ERR_INVALID_USAGE,
                               "%s of %s memory on a two-level communicator: it runs over "
                               "options.any, which moves host memory only", what, x->k->memory);
    x->stream = call->stream;
    d->memory = sumo__memory_id(x->k);
    c->x = *x; /* the call's, for sumo__call_imports */
    /* Another memory runs where no byte of it crosses the transport (ranks that share an
     * address space, or processes whose kernel table shares the memory between them, with the
     * shared-memory algorithms: the kernels read the peers' buffers), or over a transport that
     * carries it. */
    if (x->k != sumo__host_kernels() && !sumo__comm_direct(c) &&
        !(tp->ops->carries && tp->ops->carries(tp, x->k->memory)) && !sumo__call_imports(c))
        return SUMO__COMM_FAIL(c, SUMO_ERR_INVALID_USAGE,
                               "%s: the %s transport cannot move %s memory (%s)", what,
                               tp->ops->name, x->k->memory,
                               !sumo__comm_shared_memory(c)
                                   ? "a point-to-point algorithm was forced with "
                                     "sumo_comm_set_param"
                               : tp->reach == SUMO__REACH_STAGED && tp->ops->board != NULL
                                   ? "its ranks are processes, and the kernel table cannot "
                                     "share that memory between them (no share entries)"
                                   : "its ranks do not share an address space, and it does "
                                     "not carry that memory");
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
    if (d->op == SUMO_OP_AVERAGE)
        SUMO__KCHECK(c, sumo__k_divide(&c->x, d->dtype, recvbuf, recvbuf, d->count, tp->size));
    return SUMO_SUCCESS;
}

static bool offload_supports(const sumo_comm *c, const sumo__call_desc *d)
{
    /* The peer library reads host memory only. */
    return c->tp->offload != NULL && c->x.k == sumo__host_kernels() &&
           c->tp->offload->reduce_support(c->tp, d->dtype, SUMO_OP_SUM);
}

/* Ranks beyond which a small message takes recursive doubling's log2 P rounds rather than the
 * ranked algorithm's P - 1 (and its rank-order bits). */
#define RANKED_MAX_SMALL_RANKS 16

static sumo_algorithm pick_allreduce(sumo_comm *c, const sumo__call_desc *d)
{
    if (c->algo != SUMO_ALGORITHM_AUTO) return c->algo;
    if (c->tp->reach != SUMO__REACH_NONE) return SUMO_ALGORITHM_SHARED_MEMORY;
    size_t bytes = d->count * sumo__dtype_bytes(d->dtype);
    if (bytes <= SMALL_MESSAGE_BYTES) {
        if (offload_supports(c, d)) return SUMO_ALGORITHM_PEER;
        if (c->tp->size > RANKED_MAX_SMALL_RANKS) return SUMO_ALGORITHM_RECURSIVE_DOUBLING;
    }
    return SUMO_ALGORITHM_RANKED;
}

static sumo_result allreduce(sumo_comm *c, sumo__call_desc *d, const sumo__op_entry *op,
                             const sumo__call *call)
{
    if (op->kind == SUMO__OP_ADASUM)
        return sumo__allreduce_adasum(c, d, op, call->sendbuf, call->recvbuf);
    /* The announced op is the kind: sum and average are the same whatever their number. */
    d->op = op->kind == SUMO__OP_AVERAGE ? SUMO_OP_AVERAGE : SUMO_OP_SUM;
    if (c->levels) return sumo__hier_allreduce(c, d, call->sendbuf, call->recvbuf);
    size_t bytes = call->count * sumo__dtype_bytes(call->dtype);
    d->flags = sumo__shared_flag(c, call->sendbuf, bytes, call->recvbuf, bytes);
    sumo_algorithm algo = pick_allreduce(c, d);
    if (algo == SUMO_ALGORITHM_PEER && !offload_supports(c, d)) {
        d->local_error = SUMO__COMM_FAIL(c, SUMO_ERR_INVALID_USAGE, "allreduce: %s has no %s %s",
                                         c->tp->offload->name, sumo_dtype_name(call->dtype),
                                         sumo__op_name(d->op));
        return sumo__agree(c, d, NULL);
    }
    SUMO__LOG(c->tp->log_level, SUMO__LOG_INFO, "rank %d allreduce count %zu %s %s algo %d",
              c->tp->rank, call->count, sumo_dtype_name(call->dtype), sumo__op_name(d->op),
              (int)algo);
    switch (algo) {
    case SUMO_ALGORITHM_SHARED_MEMORY: return sumo__shm_allreduce(c, d, call->sendbuf, call->recvbuf);
    case SUMO_ALGORITHM_RANKED: return sumo__ranked_allreduce(c, d, call->sendbuf, call->recvbuf);
    case SUMO_ALGORITHM_RING: return sumo__ring_allreduce(c, d, call->sendbuf, call->recvbuf);
    case SUMO_ALGORITHM_RECURSIVE_DOUBLING: return sumo__rd_allreduce(c, d, call->sendbuf, call->recvbuf);
    case SUMO_ALGORITHM_PEER: return offload_allreduce(c, d, call->sendbuf, call->recvbuf);
    default: return SUMO__COMM_FAIL(c, SUMO_ERR_INTERNAL, "allreduce: unknown algorithm %d", (int)algo);
    }
}

static sumo_result run_call(sumo_comm *c, const sumo__call *call, sumo__call_desc *d,
                       const sumo__op_entry *op);

/* ---- putting the output back after a failure (SUMO_PARAM_RESTORE_ON_FAILURE) ------------- */

/* Bytes of the receive buffer, which validate has bounded. */
static size_t recv_bytes_of(const sumo_comm *c, const sumo__call *call)
{
    size_t bytes = call->count * sumo__dtype_bytes(call->dtype);
    return call->kind == SUMO__CALL_ALLGATHER ? bytes * (size_t)c->tp->size : bytes;
}

/* Host memory only: the copy is the host's memcpy, and device work queued on a stream may
 * still be writing when the host sees the failure. */
static bool restorable(const sumo_comm *c, const sumo__call *call)
{
    bool kind = call->kind == SUMO__CALL_ALLREDUCE || call->kind == SUMO__CALL_BROADCAST ||
                call->kind == SUMO__CALL_ALLGATHER || call->kind == SUMO__CALL_REDUCE_SCATTER;
    return kind && c->x.k == sumo__host_kernels() && recv_bytes_of(c, call) > 0 &&
           c->tp->ops->busy != NULL && c->tp->ops->settle != NULL;
}

/*
 * The output is written in pieces long before every rank knows the exchange succeeded (the
 * staged pipeline copies a chunk out per barrier, the direct algorithms and Adasum write into
 * peers' outputs as they go, the point-to-point ones build up in it), and the result is larger
 * than any staging area, so no final commit can stand in for a copy: take one before the first
 * write. The agreement inside the algorithm orders it before any peer's write.
 */
static sumo_result run_restoring(sumo_comm *c, const sumo__call *call, sumo__call_desc *d,
                                 const sumo__op_entry *op)
{
    sumo__transport *tp = c->tp;
    size_t bytes = recv_bytes_of(c, call);
    if (bytes > c->undo_bytes) {
        void *p = malloc(bytes);
        if (p == NULL) {
            d->local_error = SUMO__COMM_FAIL(c, SUMO_ERR_SYSTEM, "%s: cannot allocate the %zu "
                                             "bytes that restore the output on failure",
                                             sumo__call_kind_name(call->kind), bytes);
            return sumo__agree(c, d, NULL);
        }
        free(c->undo);
        c->undo = p;
        c->undo_bytes = bytes;
    }
    memcpy(c->undo, call->recvbuf, bytes);
    tp->ops->busy(tp, true);
    sumo_result r = run_call(c, call, d, op);
    tp->ops->busy(tp, false);
    if (r == SUMO_SUCCESS || !c->status.broken) return r;
    /* Peers still inside the call may write into this output (direct algorithms): they must
     * leave it first. The abort makes those waiting on this rank leave now, not at their
     * deadline; the communicator is broken anyway. Should one not leave in time, restoring
     * would race with its writes: the output is left as it is. */
    tp->ops->abort(tp);
    if (tp->ops->settle(tp) != SUMO_SUCCESS) return r;
    memcpy(call->recvbuf, c->undo, bytes);
    return r;
}

/* A collective on a two-level communicator's level: held like a blocking call (the levels
 * never have queued requests; order: the parent's exec, then the level's). */
static sumo_result level_run(sumo_comm *level, const sumo_collective *k)
{
    sumo__call call = {.kind = 0, .sendbuf = k->sendbuf, .recvbuf = k->recvbuf, .count = k->count,
                       .dtype = k->dtype, .op = k->op, .root = k->root, .stream = k->stream};
    switch (k->kind) {
    case SUMO_COLLECTIVE_ALLREDUCE: call.kind = SUMO__CALL_ALLREDUCE; break;
    case SUMO_COLLECTIVE_ALLGATHER: call.kind = SUMO__CALL_ALLGATHER; break;
    case SUMO_COLLECTIVE_BROADCAST: call.kind = SUMO__CALL_BROADCAST; break;
    case SUMO_COLLECTIVE_REDUCE_SCATTER: call.kind = SUMO__CALL_REDUCE_SCATTER; break;
    default: return SUMO__COMM_FAIL(level, SUMO_ERR_INTERNAL, "a level call of kind %d", (int)k->kind);
    }
    sumo__comm_enter(level);
    sumo_result r = sumo__execute(level, &call);
    sumo__comm_leave(level);
    return r;
}

sumo_result sumo__execute(sumo_comm *c, const sumo__call *call)
{
    SUMO__CHECK(sumo__usable(c));
    /* Set before a composite call too: a gossip round runs the node's average on a level. */
    if (c->levels) c->levels->run = level_run;
    if (call->kind == SUMO__CALL_COMPOSITE) return call->run(c, (void *)call->args);
    atomic_fetch_add_explicit(&c->rounds, 1, memory_order_relaxed);
    sumo__call_desc d = {.kind = call->kind, .dtype = (uint32_t)call->dtype, .op = call->op,
                         .root = call->root, .count = call->count,
                         .sendptr = (uintptr_t)call->sendbuf, .recvptr = (uintptr_t)call->recvbuf,
                         .aux = call->hash};
    if (call->kind == SUMO__CALL_FAIL) {
        d.local_error = (uint32_t)call->fail;
        return sumo__agree(c, &d, NULL);
    }
    if (call->kind == SUMO__CALL_SETUP) {
        /* Every rank's outcome and fingerprint: all fail together, the message naming what
         * and the first rank at fault. */
        d.local_error = (uint32_t)call->fail;
        d.count = 0;
        return sumo__agree_named(c, &d, NULL, call->what);
    }
    const sumo__op_entry *op;
    sumo__exec x;
    d.local_error = validate(c, call, &d, &op, &x);
    c->x = x;
    if (d.local_error == SUMO_SUCCESS && call->kind != SUMO__CALL_BARRIER)
        atomic_fetch_add_explicit(&c->bytes, recv_bytes_of(c, call), memory_order_relaxed);
    if (call->kind != SUMO__CALL_ALLREDUCE && call->kind != SUMO__CALL_REDUCE_SCATTER) d.op = 0;
    if (call->kind != SUMO__CALL_BROADCAST) d.root = 0;
    if (d.local_error != SUMO_SUCCESS) return sumo__agree(c, &d, NULL);
    if (c->restore && restorable(c, call)) return run_restoring(c, call, &d, op);
    return run_call(c, call, &d, op);
}

static sumo_result run_flat(sumo_comm *c, const sumo__call *call, sumo__call_desc *dp,
                            const sumo__op_entry *op);

/* A two-level communicator's broadcast, allgather and reduce-scatter go level by level; the
 * Gram form and the compressed allreduce run their flat algorithm with every message over
 * options.any (validate refused them without it). */
static sumo_result run_call(sumo_comm *c, const sumo__call *call, sumo__call_desc *dp,
                            const sumo__op_entry *op)
{
    if (c->levels == NULL) return run_flat(c, call, dp, op);
    sumo__call_desc d = *dp;
    switch (call->kind) {
    case SUMO__CALL_BROADCAST: return sumo__hier_broadcast(c, &d, call->sendbuf, call->recvbuf);
    case SUMO__CALL_ALLGATHER: return sumo__hier_allgather(c, &d, call->sendbuf, call->recvbuf);
    case SUMO__CALL_REDUCE_SCATTER:
        d.op = op->kind == SUMO__OP_AVERAGE ? SUMO_OP_AVERAGE : SUMO_OP_SUM;
        return sumo__hier_reduce_scatter(c, &d, call->sendbuf, call->recvbuf);
    case SUMO__CALL_GRAM:
    case SUMO__CALL_COMPRESSED: {
        sumo__hier_tp_flat(c->tp, true);
        sumo_result r = run_flat(c, call, dp, op);
        sumo__hier_tp_flat(c->tp, false);
        return r;
    }
    default: return run_flat(c, call, dp, op);
    }
}

static sumo_result run_flat(sumo_comm *c, const sumo__call *call, sumo__call_desc *dp,
                            const sumo__op_entry *op)
{
    sumo__call_desc d = *dp;
    size_t bytes = call->count * sumo__dtype_bytes(call->dtype);
    switch (call->kind) {
    case SUMO__CALL_ALLREDUCE: return allreduce(c, &d, op, call);
    case SUMO__CALL_BROADCAST:
        /* Only the root's send buffer is read. */
        d.flags = sumo__shared_flag(c, call->root == c->tp->rank ? call->sendbuf : NULL, bytes,
                                    call->recvbuf, bytes);
        if (sumo__comm_shared_memory(c)) return sumo__shm_broadcast(c, &d, call->sendbuf, call->recvbuf);
        return sumo__tree_broadcast(c, &d, call->sendbuf, call->recvbuf);
    case SUMO__CALL_ALLGATHER:
        d.flags = sumo__shared_flag(c, call->sendbuf, bytes, call->recvbuf,
                                    bytes * (size_t)c->tp->size);
        if (sumo__comm_shared_memory(c)) return sumo__shm_allgather(c, &d, call->sendbuf, call->recvbuf);
        return sumo__ring_allgather(c, &d, call->sendbuf, call->recvbuf);
    case SUMO__CALL_REDUCE_SCATTER:
        if (op->kind == SUMO__OP_ADASUM)
            return sumo__reduce_scatter_adasum(c, &d, op, call->sendbuf, call->recvbuf);
        d.op = op->kind == SUMO__OP_AVERAGE ? SUMO_OP_AVERAGE : SUMO_OP_SUM;
        d.flags = sumo__shared_flag(c, call->sendbuf, bytes * (size_t)c->tp->size, call->recvbuf,
                                    bytes);
        if (sumo__comm_shared_memory(c))
            return sumo__shm_reduce_scatter(c, &d, call->sendbuf, call->recvbuf);
        return sumo__ring_reduce_scatter(c, &d, call->sendbuf, call->recvbuf);
    case SUMO__CALL_COMPRESSED:
        return sumo__allreduce_compressed(c, &d, &call->compression, call->sendbuf, call->recvbuf);
    case SUMO__CALL_GRAM:
        return sumo__gram_collective(c, &d, call->sendbuf, call->recvbuf, call->gram,
                                     call->applied);
    case SUMO__CALL_BARRIER:
        /* The agreement synchronises: no rank returns before every rank has announced. */
        return sumo__agree(c, &d, NULL);
    default:
        return SUMO__COMM_FAIL(c, SUMO_ERR_INTERNAL, "unknown collective kind %u", call->kind);
    }
}

sumo__call sumo__composite(sumo_result (*run)(sumo_comm *comm, void *args), const void *args,
                           size_t args_bytes)
{
    sumo__call call = {.kind = SUMO__CALL_COMPOSITE, .run = run};
    memcpy(call.args, args, SUMO__MIN(args_bytes, sizeof call.args));
    return call;
}

/* ---- for the layers above, holding the handle ---------------------------------------------- */

sumo_result sumo__allreduce_held(sumo_comm *comm, const void *sendbuf, void *recvbuf,
                                 size_t count, sumo_dtype dtype, sumo_op op)
{
    sumo__call call = sumo__allreduce_call(sendbuf, recvbuf, count, dtype, op);
    return sumo__execute(comm, &call);
}

sumo_result sumo__allgather_held(sumo_comm *comm, const void *sendbuf, void *recvbuf,
                                 size_t count, sumo_dtype dtype)
{
    sumo__call call = sumo__allgather_call(sendbuf, recvbuf, count, dtype);
    return sumo__execute(comm, &call);
}

sumo_result sumo__broadcast_held(sumo_comm *comm, const void *sendbuf, void *recvbuf,
                                 size_t count, sumo_dtype dtype, int root)
{
    sumo__call call = sumo__broadcast_call(sendbuf, recvbuf, count, dtype, root);
    return sumo__execute(comm, &call);
}

sumo_result sumo__fail_held(sumo_comm *comm, sumo_result code)
{
    sumo__call call = {.kind = SUMO__CALL_FAIL, .fail = code};
    sumo_result r = sumo__execute(comm, &call);
    /* This rank's own code, whatever the others had. */
    return r == SUMO_ERR_TIMEOUT || r == SUMO_ERR_PEER_FAILURE ? r : code;
}

sumo_result sumo__gram_allreduce(sumo_comm *comm, const void *sendbuf, void *recvbuf,
                                 const sumo__gram_call *gram, uint64_t layout_hash, bool *applied)
{
    *applied = false;
    sumo__call call = {.kind = SUMO__CALL_GRAM, .sendbuf = sendbuf, .recvbuf = recvbuf,
                       .count = gram->count, .dtype = gram->dtype, .gram = gram,
                       .hash = layout_hash, .applied = applied};
    return sumo__execute(comm, &call);
}

