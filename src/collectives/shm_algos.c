#include "collectives/shm_algos.h"
#include "collectives/slices.h"

#include <string.h>

/* Two pointer arrays of size entries from the handle's scratch. */
static sumo_result pointer_arrays(sumo_comm *c, void ***outs, const void ***ins,
                                  unsigned char ***staged)
{
    void *s;
    SUMO__CHECK(sumo__comm_scratch(c, 3 * sizeof(void *) * (size_t)c->tp->size, &s));
    *outs = s;
    *ins = (const void **)((void **)s + c->tp->size);
    if (staged) *staged = (unsigned char **)((void **)s + 2 * c->tp->size);
    return SUMO_SUCCESS;
}

/* ---- direct: peers' buffers are addressable (threads, memory from sumo_mem_alloc, or
 * memory a kernel table shares between processes) ------------------------------------------ */

/* The buffer rank k announced, as this rank reaches it (agree.h's sumo__peer_buffer). */
static sumo_result peer_buffer(sumo_comm *c, const sumo__call_desc *all, int k, bool recv,
                               unsigned char **out)
{
    void *p;
    SUMO__CHECK(sumo__peer_buffer(c, all, k, recv, &p));
    *out = p;
    return SUMO_SUCCESS;
}

/* Each rank reduces a 1/P slice straight from every rank's input into every rank's output:
 * each byte read once and written once, the floor. The final barrier keeps every rank from
 * returning while a peer still writes into its output. */
static sumo_result allreduce_direct(sumo_comm *c, const sumo__call_desc *d,
                                    const sumo__call_desc *all)
{
    sumo__transport *tp = c->tp;
    size_t esz = sumo__dtype_bytes(d->dtype), lo, hi;
    sumo__cache_slice(d->count, esz, tp->size, tp->rank, &lo, &hi);
    if (hi > lo) {
        void **outs;
        const void **ins;
        SUMO__CHECK(pointer_arrays(c, &outs, &ins, NULL));
        for (int k = 0; k < tp->size; k++) {
            unsigned char *in, *out;
            SUMO__CHECK(peer_buffer(c, all, k, false, &in));
            SUMO__CHECK(peer_buffer(c, all, k, true, &out));
            ins[k] = in + lo * esz;
            outs[k] = out + lo * esz;
        }
        SUMO__KCHECK(c, sumo__k_reduce(&c->x, d->dtype, outs, tp->size, ins, tp->size, hi - lo,
                                       sumo__divisor_of(d->op, tp->size)));
    }
    return tp->ops->barrier(tp);
}

static sumo_result broadcast_direct(sumo_comm *c, const sumo__call_desc *d,
                                    const sumo__call_desc *all)
{
    sumo__transport *tp = c->tp;
    size_t esz = sumo__dtype_bytes(d->dtype), lo, hi;
    sumo__cache_slice(d->count, esz, tp->size, tp->rank, &lo, &hi);
    unsigned char *src, *dst;
    SUMO__CHECK(peer_buffer(c, all, d->root, false, &src));
    for (int k = 0; k < tp->size && hi > lo; k++) {
        SUMO__CHECK(peer_buffer(c, all, k, true, &dst));
        SUMO__KCHECK(c, sumo__k_copy(&c->x, dst + lo * esz, src + lo * esz, (hi - lo) * esz));
    }
    return tp->ops->barrier(tp);
}

static sumo_result allgather_direct(sumo_comm *c, const sumo__call_desc *d,
                                    const sumo__call_desc *all, const void *sendbuf)
{
    sumo__transport *tp = c->tp;
    size_t bytes = d->count * sumo__dtype_bytes(d->dtype);
    for (int k = 0; k < tp->size && bytes; k++) {
        unsigned char *dst;
        SUMO__CHECK(peer_buffer(c, all, k, true, &dst));
        SUMO__KCHECK(c, sumo__k_copy(&c->x, dst + (size_t)tp->rank * bytes, sendbuf, bytes));
    }
    return tp->ops->barrier(tp);
}

/* ---- staged: every rank maps every rank's staging area (processes on one node) ----------- */

/* The entry points below (the caller has validated the arguments, d->local_error == 0) stage
 * their buffers unless every rank announced buffers its peers reach (SUMO__DESC_SHARED: any
 * buffer on a SUMO__REACH_DIRECT transport, sumo_mem_alloc's memory on a staged one), in
 * which case they run direct, or (an allreduce) receive buffers its peers reach, which then
 * serve as the staging areas. */

/* The ways a staged collective can run once every rank's announcement is in. */
typedef enum stage_shape {
    STAGE_THROUGH_AREAS, /* the staging areas */
    STAGE_DIRECT,        /* every rank's buffers are shared: nothing staged */
    STAGE_INTO_OUTPUTS,  /* every rank's output is shared: the outputs are the staging */
} stage_shape;

/*
 * How every staged collective starts. The first copy into this rank's own area rides ahead of
 * the agreement, unless this rank's buffers are shared (or, when the caller can run
 * STAGE_INTO_OUTPUTS, its output is), when the call may well run without the areas. When it
 * does not, a rank that skipped the copy makes it after the agreement, which its peers may
 * already have passed: everyone waits for those copies at one barrier. root >= 0: only that
 * rank sends (a broadcast).
 */
static sumo_result stage_start(sumo_comm *c, sumo__call_desc *d, int root, const void *sendbuf,
                               const sumo__staging *s, bool into_outputs_ok,
                               const sumo__call_desc **all, stage_shape *shape)
{
    sumo__transport *tp = c->tp;
    uint32_t skips = SUMO__DESC_SHARED | (into_outputs_ok ? SUMO__DESC_RECV_SHARED : 0);
    bool sends = d->count > 0 && (root < 0 || root == tp->rank);
    bool precopied = sends && !(d->flags & skips);
    /* A failed copy is announced: the peers must not reduce an area this rank left stale. */
    if (precopied && d->local_error == SUMO_SUCCESS) {
        sumo_result copied = sumo__stage_in(s, tp->rank, 0, sendbuf, d->count);
        if (copied != SUMO_SUCCESS)
            d->local_error = SUMO__FAIL_TOGETHER(tp, copied, "staging: the %s kernels' copy failed",
                                                 s->x->k->memory);
    }
    SUMO__CHECK(sumo__agree(c, d, all));
    *shape = sumo__all_shared(c, *all) ? STAGE_DIRECT
             : into_outputs_ok && sumo__all_recv_shared(c, *all) ? STAGE_INTO_OUTPUTS
                                                                  : STAGE_THROUGH_AREAS;
    if (*shape == STAGE_DIRECT)
        SUMO__LOG(tp->log_level, SUMO__LOG_INFO, "rank %d %s: every rank's buffers are shared, "
                  "direct", tp->rank, sumo__call_kind_name(d->kind));
    if (*shape != STAGE_THROUGH_AREAS || d->count == 0) return SUMO_SUCCESS;
    bool late = false;
    for (int r = 0; r < tp->size; r++)
        late = late || ((root < 0 || r == root) && ((*all)[r].flags & skips));
    if (!late) return SUMO_SUCCESS;
    if (sends && !precopied) SUMO__KCHECK(c, sumo__stage_in(s, tp->rank, 0, sendbuf, d->count));
    return tp->ops->barrier(tp);
}

/*
 * Each rank's staging area holds two halves; chunk k uses half (k + parity) % 2. Per chunk:
 * every rank reduces its cache slice of the chunk across all ranks' staging areas and writes
 * the result back into all of them, copies its next input chunk into the other half, passes
 * one barrier, and copies the finished chunk out of its own area. A half is rewritten only
 * two barriers after everyone last read it. Chunks are small enough to stay in cache, so user
 * buffers are read once and written once. After the last barrier a rank touches only its own
 * area, so the next collective's first copy may ride ahead of its agreement.
 */
sumo__staging sumo__staging_of(sumo__transport *tp, const sumo__exec *x, size_t esz)
{
    sumo__staging s = {.tp = tp, .x = x, .esz = esz, .parity = tp->stage_parity};
    size_t line = SUMO__CACHELINE / esz, unit = line * (size_t)tp->size;
    s.chunk = (tp->stage_bytes / 2 / esz) / unit * unit;
    if (s.chunk == 0) s.chunk = line;
    return s;
}

sumo__staging sumo__staging_into_outputs(sumo__transport *tp, const sumo__exec *x, size_t esz,
                                         unsigned char *const *outputs)
{
    sumo__staging s = sumo__staging_of(tp, x, esz);
    s.outputs = outputs;
    return s;
}

unsigned char *sumo__stage_half(const sumo__staging *s, int rank, size_t k)
{
    if (s->outputs) return s->outputs[rank] + k * s->chunk * s->esz;
    return s->tp->ops->stage(s->tp, rank) + ((k + s->parity) & 1) * (s->tp->stage_bytes / 2);
}

size_t sumo__stage_chunk_len(const sumo__staging *s, size_t count, size_t k)
{
    return SUMO__MIN(s->chunk, count - k * s->chunk);
}

size_t sumo__stage_chunk_count(const sumo__staging *s, size_t count)
{
    return (count + s->chunk - 1) / s->chunk;
}

sumo_result sumo__stage_in(const sumo__staging *s, int rank, size_t k, const void *src,
                           size_t count)
{
    const unsigned char *from = (const unsigned char *)src + k * s->chunk * s->esz;
    unsigned char *to = sumo__stage_half(s, rank, k);
    return sumo__k_copy(s->x, to, from, sumo__stage_chunk_len(s, count, k) * s->esz);
}

sumo_result sumo__shm_allreduce(sumo_comm *c, sumo__call_desc *d, const void *sendbuf,
                                void *recvbuf)
{
    sumo__transport *tp = c->tp;
    size_t esz = sumo__dtype_bytes(d->dtype);
    sumo__staging s = sumo__staging_of(tp, &c->x, esz);
    size_t chunks = sumo__stage_chunk_count(&s, d->count);
    int me = tp->rank, size = tp->size;
    /* The areas and the shared outputs are host memory: reductions there run on the host. */
    const sumo__exec host = sumo__host_exec();
    const sumo__call_desc *all;
    stage_shape shape;
    SUMO__CHECK(stage_start(c, d, -1, sendbuf, &s, true, &all, &shape));
    if (shape == STAGE_DIRECT) return allreduce_direct(c, d, all);
    void **outs;
    const void **ins;
    unsigned char **output_of;
    SUMO__CHECK(pointer_arrays(c, &outs, &ins, &output_of));
    if (shape == STAGE_INTO_OUTPUTS) {
        /* The outputs are the staging areas: nothing to copy out, and a chunk is written by
         * its owner's copy before a barrier and by the slices' owners after it. */
        SUMO__LOG(tp->log_level, SUMO__LOG_INFO, "rank %d allreduce: every rank's output is "
                  "shared, reduced there", me);
        for (int r = 0; r < size; r++) {
            output_of[r] = recvbuf;
            if (r != me) SUMO__CHECK(peer_buffer(c, all, r, true, &output_of[r]));
        }
        s = sumo__staging_into_outputs(tp, &c->x, esz, output_of);
        if (chunks > 0) SUMO__KCHECK(c, sumo__stage_in(&s, me, 0, sendbuf, d->count));
        SUMO__CHECK(tp->ops->barrier(tp));
    }
    for (size_t k = 0; k < chunks; k++) {
        size_t len = sumo__stage_chunk_len(&s, d->count, k), lo, hi;
        sumo__cache_slice(len, esz, size, me, &lo, &hi);
        if (hi > lo) {
            for (int r = 0; r < size; r++) {
                ins[r] = sumo__stage_half(&s, r, k) + lo * esz;
                outs[r] = sumo__stage_half(&s, r, k) + lo * esz;
            }
            SUMO__KCHECK(c, sumo__k_reduce(&host, d->dtype, outs, size, ins, size, hi - lo,
                                           sumo__divisor_of(d->op, size)));
        }
        if (k + 1 < chunks) SUMO__KCHECK(c, sumo__stage_in(&s, me, k + 1, sendbuf, d->count));
        SUMO__CHECK(tp->ops->barrier(tp));
        if (!s.outputs)
            SUMO__KCHECK(c, sumo__k_copy(&c->x, (unsigned char *)recvbuf + k * s.chunk * esz,
                                         sumo__stage_half(&s, me, k), len * esz));
    }
    return SUMO_SUCCESS;
}

sumo_result sumo__shm_broadcast(sumo_comm *c, sumo__call_desc *d, const void *sendbuf,
                                void *recvbuf)
{
    sumo__transport *tp = c->tp;
    size_t esz = sumo__dtype_bytes(d->dtype);
    sumo__staging s = sumo__staging_of(tp, &c->x, esz);
    size_t chunks = sumo__stage_chunk_count(&s, d->count);
    bool root = tp->rank == d->root;
    const sumo__call_desc *all;
    stage_shape shape;
    SUMO__CHECK(stage_start(c, d, d->root, sendbuf, &s, false, &all, &shape));
    if (shape == STAGE_DIRECT) return broadcast_direct(c, d, all);
    for (size_t k = 0; k < chunks; k++) {
        size_t len = sumo__stage_chunk_len(&s, d->count, k);
        unsigned char *dst = (unsigned char *)recvbuf + k * s.chunk * esz;
        if (!root) {
            SUMO__KCHECK(c, sumo__k_copy(&c->x, dst, sumo__stage_half(&s, d->root, k), len * esz));
        } else {
            SUMO__KCHECK(c, sumo__k_copy(&c->x, dst,
                                         (const unsigned char *)sendbuf + k * s.chunk * esz,
                                         len * esz));
            if (k + 1 < chunks) SUMO__KCHECK(c, sumo__stage_in(&s, tp->rank, k + 1, sendbuf, d->count));
        }
        SUMO__CHECK(tp->ops->barrier(tp));
    }
    return SUMO_SUCCESS;
}

sumo_result sumo__shm_allgather(sumo_comm *c, sumo__call_desc *d, const void *sendbuf,
                                void *recvbuf)
{
    sumo__transport *tp = c->tp;
    size_t esz = sumo__dtype_bytes(d->dtype);
    sumo__staging s = sumo__staging_of(tp, &c->x, esz);
    size_t chunks = sumo__stage_chunk_count(&s, d->count);
    const sumo__call_desc *all;
    stage_shape shape;
    SUMO__CHECK(stage_start(c, d, -1, sendbuf, &s, false, &all, &shape));
    if (shape == STAGE_DIRECT) return allgather_direct(c, d, all, sendbuf);
    for (size_t k = 0; k < chunks; k++) {
        size_t len = sumo__stage_chunk_len(&s, d->count, k);
        for (int r = 0; r < tp->size; r++) {
            unsigned char *dst = (unsigned char *)recvbuf + ((size_t)r * d->count + k * s.chunk) * esz;
            SUMO__KCHECK(c, sumo__k_copy(&c->x, dst, sumo__stage_half(&s, r, k), len * esz));
        }
        if (k + 1 < chunks) SUMO__KCHECK(c, sumo__stage_in(&s, tp->rank, k + 1, sendbuf, d->count));
        SUMO__CHECK(tp->ops->barrier(tp));
    }
    return SUMO_SUCCESS;
}

/*
 * Reduce-scatter. Direct: rank r reduces its own segment straight from every rank's input
 * into its output (every input byte read once, in rank order). Staged: the areas hold, per
 * round, a sub-chunk of every segment of each rank's input; rank r reduces sub-chunk r of
 * every area into its output, while the next round is staged into the other half (a half is
 * rewritten only two barriers after anyone last read it, as in the allreduce).
 */
static sumo_result reduce_scatter_direct(sumo_comm *c, const sumo__call_desc *d,
                                         const sumo__call_desc *all, void *recvbuf)
{
    sumo__transport *tp = c->tp;
    size_t esz = sumo__dtype_bytes(d->dtype);
    if (d->count > 0) {
        void **outs;
        const void **ins;
        SUMO__CHECK(pointer_arrays(c, &outs, &ins, NULL));
        for (int k = 0; k < tp->size; k++) {
            unsigned char *in;
            SUMO__CHECK(peer_buffer(c, all, k, false, &in));
            ins[k] = in + (size_t)tp->rank * d->count * esz;
        }
        outs[0] = recvbuf;
        SUMO__KCHECK(c, sumo__k_reduce(&c->x, d->dtype, outs, 1, ins, tp->size, d->count,
                                       sumo__divisor_of(d->op, tp->size)));
    }
    /* No rank returns while a peer still reads its input. */
    return tp->ops->barrier(tp);
}

sumo_result sumo__shm_reduce_scatter(sumo_comm *c, sumo__call_desc *d, const void *sendbuf,
                                     void *recvbuf)
{
    sumo__transport *tp = c->tp;
    const sumo__call_desc *all;
    SUMO__CHECK(sumo__agree(c, d, &all));
    if (sumo__all_shared(c, all)) {
        SUMO__LOG(tp->log_level, SUMO__LOG_INFO, "rank %d reduce_scatter: every rank's buffers "
                  "are shared, direct", tp->rank);
        return reduce_scatter_direct(c, d, all, recvbuf);
    }
    int size = tp->size, me = tp->rank;
    size_t esz = sumo__dtype_bytes(d->dtype), n = d->count;
    /* A round stages `sub` elements of each of the size segments into one half. */
    size_t line = SUMO__CACHELINE / esz;
    size_t sub = (tp->stage_bytes / 2 / esz / (size_t)size) / line * line;
    if (sub == 0) sub = line;
    size_t rounds = (n + sub - 1) / sub;
    const sumo__exec host = sumo__host_exec();
    void **outs;
    const void **ins;
    SUMO__CHECK(pointer_arrays(c, &outs, &ins, NULL));
    const unsigned char *in = sendbuf;
    /* Round j's half of each area, as the staged algorithms find chunk j's (its own chunks are
     * `sub` per segment, not the staging's). */
    const sumo__staging st = sumo__staging_of(tp, &c->x, esz);
    for (size_t j = 0; j <= rounds; j++) {
        if (j >= 1) {
            size_t prev = j - 1, off = prev * sub, len = SUMO__MIN(sub, n - off);
            for (int k = 0; k < size; k++)
                ins[k] = sumo__stage_half(&st, k, prev) + (size_t)me * sub * esz;
            /* The areas are host memory, so the sum runs on the host: straight into a host
             * output, else into this rank's own sub-chunk (which only this rank reads) and
             * copied out. In place, the output is this rank's own input segment, whose part
             * here was staged a round ago and whose later parts are staged after this. */
            unsigned char *out = (unsigned char *)recvbuf + off * esz;
            outs[0] = c->x.k == host.k ? (void *)out
                                       : sumo__stage_half(&st, me, prev) + (size_t)me * sub * esz;
            SUMO__KCHECK(c, sumo__k_reduce(&host, d->dtype, outs, 1, ins, size, len,
                                           sumo__divisor_of(d->op, size)));
            SUMO__KCHECK(c, sumo__k_copy(&c->x, out, outs[0], len * esz));
        }
        if (j < rounds) {
            size_t off = j * sub, len = SUMO__MIN(sub, n - off);
            for (int s = 0; s < size; s++)
                SUMO__KCHECK(c, sumo__k_copy(&c->x,
                                             sumo__stage_half(&st, me, j) + (size_t)s * sub * esz,
                                             in + ((size_t)s * n + off) * esz, len * esz));
        }
        SUMO__CHECK(tp->ops->barrier(tp));
    }
    return SUMO_SUCCESS;
}
