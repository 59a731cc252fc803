#include "collectives/agree.h"
#include "collectives/imports.h"

#include <stdio.h>
#include <string.h>

_Static_assert(sizeof(sumo__call_desc) <= SUMO__ANNOUNCE_BYTES, "an announcement fits its slot");

const char *sumo__call_kind_name(uint32_t kind)
{
    switch (kind) {
    case SUMO__CALL_ALLREDUCE: return "allreduce";
    case SUMO__CALL_ALLGATHER: return "allgather";
    case SUMO__CALL_BROADCAST: return "broadcast";
    case SUMO__CALL_BARRIER: return "barrier";
    case SUMO__CALL_SETUP: return "set-up";
    case SUMO__CALL_MEM_ALLOC: return "mem_alloc";
    case SUMO__CALL_MEM_FREE: return "mem_free";
    case SUMO__CALL_REDUCE_SCATTER: return "reduce_scatter";
    case SUMO__CALL_GRAM: return "gram combine";
    case SUMO__CALL_FAIL: return "a failure announcement";
    case SUMO__CALL_COMPRESSED: return "allreduce_compressed";
    case SUMO__CALL_JOIN: return "join";
    case SUMO__CALL_GOSSIP: return "gossip round";
    default: return "unknown collective";
    }
}

uint32_t sumo__memory_id(const sumo_kernel_table *k)
{
    return (uint32_t)sumo__fnv1a(SUMO__FNV_OFFSET, k->memory, strlen(k->memory));
}

static bool joined(const sumo__call_desc *d)
{
    return d->kind == SUMO__CALL_JOIN;
}

/* Every announcement against mine, which rank me made (this rank, or for a joined rank the
 * lowest rank that runs the call); ranks that have joined are left out. */
static sumo_result compare(sumo_comm *c, const sumo__call_desc *all, const sumo__call_desc *mine,
                           int me, const char *what)
{
    sumo__transport *tp = c->tp;
    for (int r = 0; r < tp->size; r++) {
        if (joined(&all[r])) continue;
        if (all[r].local_error != SUMO_SUCCESS) {
            if (mine->local_error != SUMO_SUCCESS && me == tp->rank)
                return (sumo_result)mine->local_error;
            /* An allocation that failed somewhere leaves every rank in step, nothing held. */
            if (mine->kind == SUMO__CALL_MEM_ALLOC)
                return SUMO__FAIL_TOGETHER(tp, (sumo_result)all[r].local_error,
                                           "mem_alloc: failed on rank %d (%s); nothing was "
                                           "allocated on any rank",
                                           r, sumo_result_name((sumo_result)all[r].local_error));
            return SUMO__COMM_FAIL(c, (sumo_result)all[r].local_error,
                                   "%s: rank %d failed before moving data (%s: its arguments, or "
                                   "a layer above); no rank moved data",
                                   what, r, sumo_result_name((sumo_result)all[r].local_error));
        }
    }
    for (int r = 0; r < tp->size; r++) {
        const sumo__call_desc *o = &all[r];
        if (joined(o)) continue;
        if (o->kind != mine->kind)
            return SUMO__COMM_FAIL(c, SUMO_ERR_MISMATCH, "rank %d called %s while rank %d called %s",
                                   r, sumo__call_kind_name(o->kind), me,
                                   sumo__call_kind_name(mine->kind));
        if (o->count != mine->count)
            return SUMO__COMM_FAIL(c, SUMO_ERR_MISMATCH,
                                   "%s: rank %d passed count %llu, rank %d passed %llu", what, r,
                                   (unsigned long long)o->count, me,
                                   (unsigned long long)mine->count);
        if (o->dtype != mine->dtype)
            return SUMO__COMM_FAIL(c, SUMO_ERR_MISMATCH, "%s: rank %d passed dtype %s, rank %d %s",
                                   what, r, sumo_dtype_name(o->dtype), me,
                                   sumo_dtype_name(mine->dtype));
        if (o->op != mine->op)
            return SUMO__COMM_FAIL(c, SUMO_ERR_MISMATCH, "%s: rank %d passed op %s, rank %d %s",
                                   what, r, sumo__op_name(o->op), me,
                                   sumo__op_name(mine->op));
        if (o->root != mine->root)
            return SUMO__COMM_FAIL(c, SUMO_ERR_MISMATCH, "%s: rank %d passed root %d, rank %d %d",
                                   what, r, o->root, me, mine->root);
        if (o->aux != mine->aux)
            return SUMO__COMM_FAIL(c, SUMO_ERR_MISMATCH,
                                   "%s: rank %d passed a different %s than rank %d (hash %016llx "
                                   "vs %016llx)",
                                   what, r,
                                   mine->kind == SUMO__CALL_SETUP      ? "configuration"
                                   : mine->kind == SUMO__CALL_MEM_FREE ? "allocation (serial)"
                                   : mine->kind == SUMO__CALL_COMPRESSED ? "compression format or block size"
                                                                       : "tensor layout or op options",
                                   me, (unsigned long long)o->aux,
                                   (unsigned long long)mine->aux);
        if (o->memory != mine->memory)
            return SUMO__COMM_FAIL(c, SUMO_ERR_MISMATCH,
                                   "%s: rank %d passed buffers in another memory than rank %d "
                                   "(%s here)",
                                   what, r, me, c->x.k->memory);
    }
    return SUMO_SUCCESS;
}

static bool moves_data(uint32_t kind)
{
    return kind == SUMO__CALL_ALLREDUCE || kind == SUMO__CALL_ALLGATHER ||
           kind == SUMO__CALL_BROADCAST || kind == SUMO__CALL_REDUCE_SCATTER ||
           kind == SUMO__CALL_GRAM || kind == SUMO__CALL_COMPRESSED;
}

/* Buffers that only the direct algorithms move (sumo__call_imports) run only where every rank
 * shared its own: a verdict every rank reaches alike, from the announcements, so the handle
 * stays usable. */
static sumo_result check_imports(sumo_comm *c, const sumo__call_desc *d, const char *what)
{
    sumo__transport *tp = c->tp;
    if (!moves_data(d->kind) || d->count == 0 || !sumo__call_imports(c)) return SUMO_SUCCESS;
    for (int r = 0; r < tp->size; r++) {
        if (c->agreed[r].flags & SUMO__DESC_SHARED) continue;
        bool here = r == tp->rank;
        return SUMO__FAIL_TOGETHER(tp, SUMO_ERR_INVALID_USAGE,
                                   "%s: rank %d could not share its %s buffers with the other "
                                   "processes (%s), and the %s transport moves %s memory only "
                                   "so; no rank moved data",
                                   what, r, c->x.k->memory,
                                   here && c->share_why[0] ? c->share_why
                                                           : "its own message says why",
                                   tp->ops->name, c->x.k->memory);
    }
    return SUMO_SUCCESS;
}

/* The transport's announce: every agreement, counted alike on every rank (a joined rank's
 * round, collectives/join.c). */
static sumo_result announce(sumo_comm *c, sumo__call_desc *d)
{
    c->announces++;
    return c->tp->ops->announce(c->tp, d, c->agreed, sizeof *d);
}

/* "ranks 1, 3" or "rank 2": the ranks of all that have joined. */
static void joined_ranks(const sumo_comm *c, const sumo__call_desc *all, char *out, size_t bytes)
{
    int n = 0, shown = 0;
    for (int r = 0; r < c->tp->size; r++) n += joined(&all[r]);
    size_t at = (size_t)snprintf(out, bytes, "rank%s", n > 1 ? "s" : "");
    for (int r = 0; r < c->tp->size && at < bytes; r++) {
        if (!joined(&all[r])) continue;
        if (shown++ == 8) {
            snprintf(out + at, bytes - at, " and %d more", n - 8);
            return;
        }
        at += (size_t)snprintf(out + at, bytes - at, "%s %d", shown > 1 ? "," : "", r);
    }
}

/*
 * The verdict on a round in which some ranks announced SUMO__CALL_JOIN, every rank alike:
 * the others' announcements compared against mine (rank me's), then whether their call is one
 * a joined rank takes part in. An allreduce's op is announced as its kind (execute.c): sum or
 * average; Adasum announces its op's number, which no joined rank could answer alike.
 */
static sumo_result join_verdict(sumo_comm *c, const sumo__call_desc *all,
                                const sumo__call_desc *mine, int me, const char *what)
{
    SUMO__CHECK(compare(c, all, mine, me, what));
    if (mine->kind == SUMO__CALL_BARRIER) return SUMO_SUCCESS;
    if (mine->kind == SUMO__CALL_ALLREDUCE &&
        (mine->op == SUMO_OP_SUM || mine->op == SUMO_OP_AVERAGE))
        return SUMO_SUCCESS;
    char who[128];
    joined_ranks(c, all, who, sizeof who);
    bool adasum = mine->kind == SUMO__CALL_ALLREDUCE;
    return SUMO__COMM_FAIL(c, SUMO_ERR_INVALID_USAGE,
                           "%s%s: %s called sumo_join (no more data); while ranks have joined "
                           "only allreduce with sum or average and barrier run, as in "
                           "Horovod; no rank moved data",
                           what, adasum ? " with an Adasum op" : "", who);
}

sumo_result sumo__agree_named(sumo_comm *c, sumo__call_desc *d, const sumo__call_desc **all,
                              const char *what)
{
    sumo__transport *tp = c->tp;
    const char *name = what ? what : sumo__call_kind_name(d->kind);
    SUMO__CHECK(announce(c, d));
    bool any_joined = false;
    for (int r = 0; r < tp->size && !any_joined; r++) any_joined = joined(&c->agreed[r]);
    if (any_joined) {
        SUMO__CHECK(join_verdict(c, c->agreed, d, tp->rank, name));
        if (d->kind == SUMO__CALL_BARRIER) return SUMO_SUCCESS;
        /* The joined ranks now announce this allreduce over their zeros. */
        SUMO__CHECK(announce(c, d));
    }
    SUMO__CHECK(compare(c, c->agreed, d, tp->rank, name));
    SUMO__CHECK(check_imports(c, d, name));
    if (all) *all = c->agreed;
    return SUMO_SUCCESS;
}

sumo_result sumo__agree_join(sumo_comm *c, sumo__call_desc *d, const sumo__call_desc **all,
                             int *active)
{
    sumo__transport *tp = c->tp;
    *active = -1;
    SUMO__CHECK(announce(c, d));
    *all = c->agreed;
    for (int r = 0; r < tp->size && *active < 0; r++)
        if (!joined(&c->agreed[r])) *active = r;
    if (*active < 0) return SUMO_SUCCESS;
    const sumo__call_desc *call = &c->agreed[*active];
    return join_verdict(c, c->agreed, call, *active, sumo__call_kind_name(call->kind));
}

sumo_result sumo__agree(sumo_comm *c, sumo__call_desc *d, const sumo__call_desc **all)
{
    return sumo__agree_named(c, d, all, NULL);
}

uint32_t sumo__shared_flag(sumo_comm *c, const void *sendbuf, size_t send_bytes,
                           const void *recvbuf, size_t recv_bytes)
{
    sumo__transport *tp = c->tp;
    if (tp->reach == SUMO__REACH_DIRECT) return SUMO__DESC_SHARED | SUMO__DESC_RECV_SHARED;
    /* Both or neither: a shared output alone would be staged into (STAGE_INTO_OUTPUTS), by
     * host loops that cannot touch this memory. */
    if (sumo__call_imports(c))
        return sumo__imports_export(c, sendbuf, send_bytes, recvbuf, recv_bytes)
                   ? SUMO__DESC_SHARED | SUMO__DESC_RECV_SHARED
                   : 0;
    if (tp->reach != SUMO__REACH_STAGED || tp->ops->shares == NULL) return 0;
    if (!tp->ops->shares(tp, recvbuf, recv_bytes)) return 0;
    bool send_shared = sendbuf == NULL || tp->ops->shares(tp, sendbuf, send_bytes);
    return SUMO__DESC_RECV_SHARED | (send_shared ? SUMO__DESC_SHARED : 0);
}

sumo_result sumo__peer_buffer(sumo_comm *c, const sumo__call_desc *all, int k, bool recv,
                              void **out)
{
    uint64_t address = recv ? all[k].recvptr : all[k].sendptr;
    if (sumo__call_imports(c)) return sumo__imports_peer(c, k, recv, address, out);
    *out = c->tp->ops->peer_buffer(c->tp, k, address);
    return SUMO_SUCCESS;
}

static bool all_flagged(const sumo_comm *c, const sumo__call_desc *all, uint32_t flag)
{
    for (int r = 0; r < c->tp->size; r++)
        if (!(all[r].flags & flag)) return false;
    return true;
}

bool sumo__all_shared(const sumo_comm *c, const sumo__call_desc *all)
{
    return all_flagged(c, all, SUMO__DESC_SHARED);
}

bool sumo__all_recv_shared(const sumo_comm *c, const sumo__call_desc *all)
{
    return all_flagged(c, all, SUMO__DESC_RECV_SHARED);
}

sumo_result sumo__usable(sumo_comm *c)
{
    if (atomic_load_explicit(&c->aborted, memory_order_acquire) == 2 && !c->status.broken)
        return SUMO__COMM_FAIL(c, SUMO_ERR_PEER_FAILURE, "sumo_comm_abort on rank %d: %s",
                               c->tp->rank, c->abort_message);
    /* The message still names the first failure. */
    return c->status.broken ? SUMO_ERR_PEER_FAILURE : SUMO_SUCCESS;
}
