#include "collectives/p2p_algos.h"
#include "collectives/slices.h"

#include <string.h>

static size_t seg_off(size_t n, int parts, int s) { return sumo__seg_off(n, parts, s); }
static size_t seg_len(size_t n, int parts, int s) { return seg_off(n, parts, s + 1) - seg_off(n, parts, s); }

/* For types that accumulate in themselves (fp32, fp64): the result builds up in the receive
 * buffer, which starts as a copy of the input; tmp holds tmp_elems elements. */
static sumo_result work_buffers(sumo_comm *c, const sumo__call_desc *d, const void *sendbuf,
                                void *recvbuf, size_t tmp_elems, void **tmp)
{
    size_t esz = sumo__dtype_bytes(d->dtype);
    SUMO__CHECK(sumo__comm_data_scratch(c, &c->x, tmp_elems * esz + 64, tmp));
    SUMO__KCHECK(c, sumo__k_copy(&c->x, recvbuf, sendbuf, d->count * esz));
    return SUMO_SUCCESS;
}

/* ---- ring --------------------------------------------------------------------------------- */

sumo_result sumo__ring_pass_segments(sumo__transport *tp, unsigned char *buf, size_t esz,
                                     size_t n, int own)
{
    return sumo__ring_pass_segments_from(tp, buf, esz, n, own, 0);
}

sumo_result sumo__ring_pass_segments_from(sumo__transport *tp, unsigned char *buf, size_t esz,
                                          size_t n, int own, int first_step)
{
    int size = tp->size, next = (tp->rank + 1) % size, prev = (tp->rank + size - 1) % size;
    for (int step = first_step; step < size - 1; step++) {
        int ss = (own - step + size) % size, rs = (own - step - 1 + size) % size;
        SUMO__CHECK(tp->ops->sendrecv(tp, buf + seg_off(n, size, ss) * esz,
                                      seg_len(n, size, ss) * esz, next,
                                      buf + seg_off(n, size, rs) * esz,
                                      seg_len(n, size, rs) * esz, prev));
    }
    return SUMO_SUCCESS;
}

/*
 * The ring for fp16 and bf16: partial sums travel in fp32 (one rounding, at the end). The
 * reduce-scatter runs chunk by chunk (chunk k of every segment, then chunk k + 1), so only
 * two fp32 chunks are kept, not an fp32 copy of the buffer; the owner rounds each finished
 * chunk and the allgather moves the narrow type. Every element sees the same additions in the
 * same order as in the fp32 ring: same bits.
 */
#define RING_WIDEN_CHUNK_ELEMS ((size_t)1 << 18)

/* Chunk k of segment s: [*lo, *lo + return value). Segments differ in length by at most one
 * element, so a segment's last chunk may be short or empty. */
static size_t ring_chunk(size_t n, int size, int s, size_t k, size_t chunk, size_t *lo)
{
    size_t start = seg_off(n, size, s), end = seg_off(n, size, s + 1);
    *lo = SUMO__MIN(start + k * chunk, end);
    return SUMO__MIN(chunk, end - *lo);
}

static sumo_result ring_allreduce_widened(sumo_comm *c, sumo__call_desc *d, const void *sendbuf,
                                          void *recvbuf)
{
    sumo__transport *tp = c->tp;
    const sumo__exec *kt = &c->x;
    int size = tp->size, me = tp->rank;
    int next = (me + 1) % size, prev = (me + size - 1) % size;
    size_t n = d->count;
    sumo_dtype dt = (sumo_dtype)d->dtype, acc = sumo__accumulator_of(dt);
    size_t esz = sumo__dtype_bytes(dt), aesz = sumo__dtype_bytes(acc);
    const unsigned char *in = sendbuf;
    unsigned char *out = recvbuf;
    if (n == 0) return SUMO_SUCCESS; /* the buffers may be NULL */
    size_t seg_max = n / (size_t)size + 1, chunk = SUMO__MIN(seg_max, RING_WIDEN_CHUNK_ELEMS);
    size_t nchunks = (seg_max + chunk - 1) / chunk;
    void *s;
    SUMO__CHECK(sumo__comm_data_scratch(c, kt, 2 * (chunk * aesz + 64), &s));
    unsigned char *partial = s, *incoming = partial + (chunk * aesz + 63) / 64 * 64;
    int own = (me + 1) % size;
    for (size_t k = 0; k < nchunks; k++) {
        size_t lo, len = ring_chunk(n, size, me, k, chunk, &lo);
        SUMO__KCHECK(c, sumo__k_convert(kt, acc, partial, dt, in + lo * esz, len));
        for (int step = 0; step < size - 1; step++) {
            int ss = (me - step + size) % size, rs = (me - step - 1 + 2 * size) % size;
            size_t slo, slen = ring_chunk(n, size, ss, k, chunk, &slo);
            len = ring_chunk(n, size, rs, k, chunk, &lo);
            SUMO__CHECK(tp->ops->sendrecv(tp, partial, slen * aesz, next, incoming, len * aesz, prev));
            SUMO__KCHECK(c, sumo__k_convert(kt, acc, partial, dt, in + lo * esz, len));
            SUMO__KCHECK(c, sumo__k_add(kt, acc, partial, incoming, partial, len));
        }
        /* Chunk k of every input segment has been read: its output may overwrite it. */
        len = ring_chunk(n, size, own, k, chunk, &lo);
        if (d->op == SUMO_OP_AVERAGE)
            SUMO__KCHECK(c, sumo__k_divide(kt, acc, partial, partial, len, size));
        SUMO__KCHECK(c, sumo__k_convert(kt, dt, out + lo * esz, acc, partial, len));
    }
    return sumo__ring_pass_segments(tp, out, esz, n, own);
}

sumo_result sumo__ring_allreduce(sumo_comm *c, sumo__call_desc *d, const void *sendbuf,
                                 void *recvbuf)
{
    sumo__transport *tp = c->tp;
    SUMO__CHECK(sumo__agree(c, d, NULL));
    sumo_dtype dt = (sumo_dtype)d->dtype;
    if (sumo__accumulator_of(dt) != dt) return ring_allreduce_widened(c, d, sendbuf, recvbuf);
    /* fp32 and fp64 accumulate in themselves: the ring works in the receive buffer. */
    int size = tp->size, me = tp->rank;
    int next = (me + 1) % size, prev = (me + size - 1) % size;
    size_t n = d->count, esz = sumo__dtype_bytes(dt);
    void *tmp;
    SUMO__CHECK(work_buffers(c, d, sendbuf, recvbuf, n / (size_t)size + 1, &tmp));
    unsigned char *work = recvbuf;
    for (int step = 0; step < size - 1; step++) {
        int ss = (me - step + size) % size, rs = (me - step - 1 + 2 * size) % size;
        SUMO__CHECK(tp->ops->sendrecv(tp, work + seg_off(n, size, ss) * esz,
                                      seg_len(n, size, ss) * esz, next, tmp,
                                      seg_len(n, size, rs) * esz, prev));
        unsigned char *mine = work + seg_off(n, size, rs) * esz;
        SUMO__KCHECK(c, sumo__k_add(&c->x, dt, mine, tmp, mine, seg_len(n, size, rs)));
    }
    int own = (me + 1) % size;
    if (d->op == SUMO_OP_AVERAGE) {
        unsigned char *seg = work + seg_off(n, size, own) * esz;
        SUMO__KCHECK(c, sumo__k_divide(&c->x, dt, seg, seg, seg_len(n, size, own), size));
    }
    return sumo__ring_pass_segments(tp, work, esz, n, own);
}

/* ---- ranked -------------------------------------------------------------------------------- */

/*
 * Rank r owns segment r (sumo__seg_off). Chunk by chunk of the segments, every rank sends
 * chunk j of each other rank's segment of its input to that rank and receives chunk j of its
 * own segment from each (P - 1 exchanges, partner r + k and r - k in round k), then sums the
 * P pieces in rank order with one reduce (fp16/bf16 in fp32, divided once for an average,
 * rounded once): the same arithmetic, element by element, as the shared-memory algorithms,
 * so every transport gives the same bits. A ring allgather then passes the finished segments
 * on. In place, only this rank's own segment of the buffer is written before the allgather,
 * and it is read (into the sum) before it is written.
 */
#define RANKED_CHUNK_BYTES ((size_t)1 << 20)
/* The received pieces of one chunk round: at most this much scratch, whatever P. */
#define RANKED_SCRATCH_BYTES ((size_t)64 << 20)

sumo_result sumo__ranked_allreduce(sumo_comm *c, sumo__call_desc *d, const void *sendbuf,
                                   void *recvbuf)
{
    sumo__transport *tp = c->tp;
    SUMO__CHECK(sumo__agree(c, d, NULL));
    int P = tp->size, me = tp->rank;
    size_t n = d->count, esz = sumo__dtype_bytes(d->dtype);
    if (n == 0) return SUMO_SUCCESS;
    size_t line = SUMO__CACHELINE / esz;
    size_t chunk = SUMO__MIN(RANKED_CHUNK_BYTES, RANKED_SCRATCH_BYTES / (size_t)SUMO__MAX(P - 1, 1)) / esz;
    chunk = SUMO__MAX(line, chunk / line * line);
    /* Every rank cuts every segment into as many chunks as the longest has, so the pieces of
     * a round pair up; a short segment's last chunk may be empty. */
    size_t chunks = (n / (size_t)P + 1 + chunk - 1) / chunk;
    void *scratch, *meta;
    SUMO__CHECK(sumo__comm_data_scratch(c, &c->x, (size_t)(P - 1) * chunk * esz + 64, &scratch));
    SUMO__CHECK(sumo__comm_scratch(c, (size_t)P * sizeof(void *), &meta));
    const void **ins = meta;
    unsigned char *slots = scratch;
    const unsigned char *in = sendbuf;
    unsigned char *out = recvbuf;
    size_t lo = seg_off(n, P, me), hi = seg_off(n, P, me + 1);
    for (size_t j = 0; j < chunks; j++) {
        size_t r0 = SUMO__MIN(hi, lo + j * chunk), r1 = SUMO__MIN(hi, lo + (j + 1) * chunk);
        for (int k = 1; k < P; k++) {
            int dst = (me + k) % P, src = (me - k + P) % P;
            size_t dlo = seg_off(n, P, dst), dhi = seg_off(n, P, dst + 1);
            size_t s0 = SUMO__MIN(dhi, dlo + j * chunk), s1 = SUMO__MIN(dhi, dlo + (j + 1) * chunk);
            int slot = src < me ? src : src - 1;
            SUMO__CHECK(tp->ops->sendrecv(tp, in + s0 * esz, (s1 - s0) * esz, dst,
                                          slots + (size_t)slot * chunk * esz, (r1 - r0) * esz,
                                          src));
        }
        if (r1 == r0) continue;
        for (int k = 0; k < P; k++) {
            int slot = k < me ? k : k - 1;
            ins[k] = k == me ? (const void *)(in + r0 * esz)
                             : (const void *)(slots + (size_t)slot * chunk * esz);
        }
        void *dst = out + r0 * esz;
        SUMO__KCHECK(c, sumo__k_reduce(&c->x, d->dtype, &dst, 1, ins, P, r1 - r0,
                                       sumo__divisor_of(d->op, P)));
    }
    return sumo__ring_pass_segments(tp, out, esz, n, me);
}

/* ---- recursive doubling ------------------------------------------------------------------- */

static int member_rank(const sumo__rd_group *g, int member)
{
    return g->rank_of ? g->rank_of(g->ctx, member) : member;
}

sumo_result sumo__rd_sum(sumo_comm *c, const sumo__rd_group *g, const sumo__exec *x,
                         sumo_dtype acc, void *work, void *tmp, size_t n)
{
    sumo__transport *tp = c->tp;
    size_t bytes = n * sumo__dtype_bytes(acc);
    int me = g->me, pof2 = 1;
    while (pof2 * 2 <= g->members) pof2 *= 2;
    int rem = g->members - pof2, vme;
    if (me < 2 * rem) {
        if (me % 2) {
            SUMO__CHECK(tp->ops->sendrecv(tp, work, bytes, member_rank(g, me - 1), NULL, 0, -1));
            vme = -1;
        } else {
            SUMO__CHECK(tp->ops->sendrecv(tp, NULL, 0, -1, tmp, bytes, member_rank(g, me + 1)));
            SUMO__KCHECK(c, sumo__k_add(x, acc, work, work, tmp, n));
            vme = me / 2;
        }
    } else {
        vme = me - rem;
    }
    if (vme >= 0) {
        for (int mask = 1; mask < pof2; mask <<= 1) {
            int vpeer = vme ^ mask;
            int peer = member_rank(g, vpeer < rem ? vpeer * 2 : vpeer + rem);
            SUMO__CHECK(tp->ops->sendrecv(tp, work, bytes, peer, tmp, bytes, peer));
            if (vme < vpeer) SUMO__KCHECK(c, sumo__k_add(x, acc, work, work, tmp, n));
            else SUMO__KCHECK(c, sumo__k_add(x, acc, work, tmp, work, n));
        }
    }
    if (me < 2 * rem) {
        int partner = member_rank(g, me % 2 ? me - 1 : me + 1);
        if (me % 2) SUMO__CHECK(tp->ops->sendrecv(tp, NULL, 0, -1, work, bytes, partner));
        else SUMO__CHECK(tp->ops->sendrecv(tp, work, bytes, partner, NULL, 0, -1));
    }
    return SUMO_SUCCESS;
}

/*
 * fp16 and bf16 sum in fp32 chunk by chunk, so the scratch holds two fp32 chunks rather than
 * an fp32 copy of the buffer (recursive doubling is picked for small messages, but may be
 * forced on any). Each element sees the same additions in the same order as with one chunk:
 * the same bits.
 */
#define RD_WIDEN_CHUNK_ELEMS ((size_t)1 << 16)

static sumo_result rd_allreduce_widened(sumo_comm *c, sumo__call_desc *d, const void *sendbuf,
                                        void *recvbuf)
{
    sumo__transport *tp = c->tp;
    const sumo__exec *kt = &c->x;
    sumo_dtype dt = (sumo_dtype)d->dtype, acc = sumo__accumulator_of(dt);
    size_t n = d->count, esz = sumo__dtype_bytes(dt), aesz = sumo__dtype_bytes(acc);
    size_t chunk = SUMO__MIN(SUMO__MAX(n, (size_t)1), RD_WIDEN_CHUNK_ELEMS);
    size_t chunk_bytes = (chunk * aesz + 63) / 64 * 64;
    void *s;
    SUMO__CHECK(sumo__comm_data_scratch(c, kt, 2 * chunk_bytes, &s));
    unsigned char *work = s, *tmp = work + chunk_bytes;
    sumo__rd_group everyone = {.members = tp->size, .me = tp->rank};
    /* Every rank walks the same chunks, so the messages pair up; an empty buffer still takes
     * one (empty) round, as the peers expect. */
    size_t k = 0;
    do {
        size_t len = SUMO__MIN(chunk, n - k);
        /* In place, chunk k of the output overwrites chunk k of the input only after it was
         * read. */
        SUMO__KCHECK(c, sumo__k_convert(kt, acc, work, dt, (const unsigned char *)sendbuf + k * esz, len));
        SUMO__CHECK(sumo__rd_sum(c, &everyone, kt, acc, work, tmp, len));
        if (d->op == SUMO_OP_AVERAGE) SUMO__KCHECK(c, sumo__k_divide(kt, acc, work, work, len, tp->size));
        SUMO__KCHECK(c, sumo__k_convert(kt, dt, (unsigned char *)recvbuf + k * esz, acc, work, len));
        k += len;
    } while (k < n);
    return SUMO_SUCCESS;
}

sumo_result sumo__rd_allreduce(sumo_comm *c, sumo__call_desc *d, const void *sendbuf,
                               void *recvbuf)
{
    sumo__transport *tp = c->tp;
    SUMO__CHECK(sumo__agree(c, d, NULL));
    size_t n = d->count;
    sumo_dtype acc = sumo__accumulator_of(d->dtype);
    if (acc != (sumo_dtype)d->dtype) return rd_allreduce_widened(c, d, sendbuf, recvbuf);
    void *tmp;
    SUMO__CHECK(work_buffers(c, d, sendbuf, recvbuf, n, &tmp));
    sumo__rd_group everyone = {.members = tp->size, .me = tp->rank};
    SUMO__CHECK(sumo__rd_sum(c, &everyone, &c->x, acc, recvbuf, tmp, n));
    /* Every rank divides the same sum alike: the same bits everywhere. */
    if (d->op == SUMO_OP_AVERAGE)
        SUMO__KCHECK(c, sumo__k_divide(&c->x, acc, recvbuf, recvbuf, n, tp->size));
    return SUMO_SUCCESS;
}

/* ---- broadcast and allgather -------------------------------------------------------------- */

sumo_result sumo__tree_broadcast(sumo_comm *c, sumo__call_desc *d, const void *sendbuf,
                                 void *recvbuf)
{
    sumo__transport *tp = c->tp;
    SUMO__CHECK(sumo__agree(c, d, NULL));
    int size = tp->size, vrank = (tp->rank - d->root + size) % size;
    size_t bytes = d->count * sumo__dtype_bytes(d->dtype);
    if (vrank == 0) SUMO__KCHECK(c, sumo__k_copy(&c->x, recvbuf, sendbuf, bytes));
    /* Binomial tree: in round `mask`, ranks below mask send to rank + mask. */
    for (int mask = 1; mask < size; mask <<= 1) {
        if (vrank < mask && vrank + mask < size) {
            int dst = (vrank + mask + d->root) % size;
            SUMO__CHECK(tp->ops->sendrecv(tp, recvbuf, bytes, dst, NULL, 0, -1));
        } else if (vrank >= mask && vrank < 2 * mask) {
            int src = (vrank - mask + d->root) % size;
            SUMO__CHECK(tp->ops->sendrecv(tp, NULL, 0, -1, recvbuf, bytes, src));
        }
    }
    return SUMO_SUCCESS;
}

sumo_result sumo__ring_allgather(sumo_comm *c, sumo__call_desc *d, const void *sendbuf,
                                 void *recvbuf)
{
    sumo__transport *tp = c->tp;
    SUMO__CHECK(sumo__agree(c, d, NULL));
    int size = tp->size, me = tp->rank;
    size_t bytes = d->count * sumo__dtype_bytes(d->dtype);
    unsigned char *out = recvbuf;
    SUMO__KCHECK(c, sumo__k_copy(&c->x, out + (size_t)me * bytes, sendbuf, bytes));
    for (int step = 0; step < size - 1; step++) {
        int ss = (me - step + size) % size, rs = (me - step - 1 + size) % size;
        SUMO__CHECK(tp->ops->sendrecv(tp, out + (size_t)ss * bytes, bytes, (me + 1) % size,
                                      out + (size_t)rs * bytes, bytes, (me + size - 1) % size));
    }
    return SUMO_SUCCESS;
}

/*
 * Reduce-scatter around the ring: the allreduce's first half with the segments relabelled so
 * that rank r finishes segment r (segments are the recvcount-element blocks of the input).
 * Partial sums travel in the accumulator type, chunk by chunk, as in ring_allreduce_widened,
 * so any dtype takes the same path; the owner divides (average) and rounds once.
 */
sumo_result sumo__ring_reduce_scatter(sumo_comm *c, sumo__call_desc *d, const void *sendbuf,
                                      void *recvbuf)
{
    sumo__transport *tp = c->tp;
    SUMO__CHECK(sumo__agree(c, d, NULL));
    const sumo__exec *kt = &c->x;
    int size = tp->size, me = tp->rank;
    int next = (me + 1) % size, prev = (me + size - 1) % size;
    size_t n = d->count;
    sumo_dtype dt = (sumo_dtype)d->dtype, acc = sumo__accumulator_of(dt);
    size_t esz = sumo__dtype_bytes(dt), aesz = sumo__dtype_bytes(acc);
    const unsigned char *in = sendbuf;
    if (n == 0) return SUMO_SUCCESS;
    size_t chunk = SUMO__MIN(n, RING_WIDEN_CHUNK_ELEMS);
    void *s;
    SUMO__CHECK(sumo__comm_data_scratch(c, kt, 2 * (chunk * aesz + 64), &s));
    unsigned char *partial = s, *incoming = partial + (chunk * aesz + 63) / 64 * 64;
    for (size_t lo = 0; lo < n; lo += chunk) {
        size_t len = SUMO__MIN(chunk, n - lo);
        int first = (me - 1 + size) % size;
        SUMO__KCHECK(c, sumo__k_convert(kt, acc, partial, dt, in + ((size_t)first * n + lo) * esz, len));
        for (int step = 0; step < size - 1; step++) {
            int rs = (me - step - 2 + 2 * size) % size;
            SUMO__CHECK(tp->ops->sendrecv(tp, partial, len * aesz, next, incoming, len * aesz, prev));
            SUMO__KCHECK(c, sumo__k_convert(kt, acc, partial, dt, in + ((size_t)rs * n + lo) * esz, len));
            SUMO__KCHECK(c, sumo__k_add(kt, acc, partial, incoming, partial, len));
        }
        /* This chunk of every segment has been read: in place, the output may overwrite its
         * own segment's chunk now. */
        if (d->op == SUMO_OP_AVERAGE)
            SUMO__KCHECK(c, sumo__k_divide(kt, acc, partial, partial, len, size));
        SUMO__KCHECK(c, sumo__k_convert(kt, dt, (unsigned char *)recvbuf + lo * esz, acc, partial, len));
    }
    return SUMO_SUCCESS;
}
