/*
 * The collectives, written once over the transport interface.
 *
 * Every call starts with an agreement step: each rank announces (collective, count, dtype, op,
 * root) and whether its own arguments were valid; all ranks compare the announcements and fail
 * together, before any data moves, when they differ. On shared memory that announcement rides
 * on the barrier the data phase needs anyway, so it costs nothing extra.
 *
 * Algorithms:
 *   shm, direct   (threads): each rank reduces a 1/P slice straight from every rank's input
 *                 into every rank's output: each byte read once and written once, the floor.
 *   shm, staged   (processes on one node): cache-sized chunks are copied into the shared
 *                 window, reduced there slice by slice, and copied out; one barrier a chunk.
 *   ring          reduce-scatter then allgather over sendrecv: 2 N (P-1)/P bytes per rank.
 *   recursive doubling, for small messages: log2 P steps.
 * Each output element is computed by exactly one rank, or by partners computing the same
 * commutative sum, so every rank ends bit-identical. The shm algorithms sum in rank order.
 */
#include "collectives/agree.h"
#include "kernels/kernels.h"

#include <stdio.h>
#include <string.h>

enum call_kind {
    KIND_ALLREDUCE = SUMO__CALL_ALLREDUCE,
    KIND_ALLGATHER = SUMO__CALL_ALLGATHER,
    KIND_BROADCAST = SUMO__CALL_BROADCAST,
    KIND_BARRIER = SUMO__CALL_BARRIER,
};

static const char *kind_name(uint32_t kind)
{
    switch (kind) {
    case KIND_ALLREDUCE: return "allreduce";
    case KIND_ALLGATHER: return "allgather";
    case KIND_BROADCAST: return "broadcast";
    case KIND_BARRIER: return "barrier";
    default: return "unknown collective";
    }
}

/* What every rank announces (collectives/agree.h). */
typedef sumo__call_desc call_desc;

#define SMALL_MESSAGE_BYTES (64 * 1024)

/* Local checks, no communication. Returns the code and records why. */
static sumo_result validate(sumo_comm *c, const call_desc *d, const void *sendbuf, void *recvbuf,
                            size_t send_bytes, size_t recv_bytes)
{
    sumo__transport *tp = c->tp;
    const char *what = kind_name(d->kind);
    if (d->kind == KIND_BARRIER) return SUMO_SUCCESS;
    if (!sumo__dtype_valid((int)d->dtype))
        return SUMO__FAIL(tp, SUMO_ERR_INVALID_ARGUMENT, "%s: unknown dtype %u", what, d->dtype);
    if (d->kind == KIND_ALLREDUCE && d->op >= SUMO_OP_PREDEFINED_COUNT)
        return SUMO__FAIL(tp, SUMO_ERR_INVALID_ARGUMENT, "%s: unknown op %u", what, d->op);
    if (d->kind == KIND_BROADCAST && (d->root < 0 || d->root >= tp->size))
        return SUMO__FAIL(tp, SUMO_ERR_INVALID_ARGUMENT, "%s: root %d out of range [0, %d)", what,
                          d->root, tp->size);
    if (send_bytes == SIZE_MAX || recv_bytes == SIZE_MAX)
        return SUMO__FAIL(tp, SUMO_ERR_INVALID_ARGUMENT, "%s: count %llu overflows size_t", what,
                          (unsigned long long)d->count);
    bool needs_send = !(d->kind == KIND_BROADCAST && d->root != tp->rank);
    if ((needs_send && send_bytes && sendbuf == NULL) || (recv_bytes && recvbuf == NULL))
        return SUMO__FAIL(tp, SUMO_ERR_INVALID_ARGUMENT, "%s: NULL buffer with count %llu", what,
                          (unsigned long long)d->count);
    if (needs_send && sendbuf != recvbuf) {
        bool in_place_gather = d->kind == KIND_ALLGATHER &&
                               (const unsigned char *)sendbuf ==
                                   (unsigned char *)recvbuf + (size_t)tp->rank * send_bytes;
        if (!in_place_gather && sumo__ranges_overlap(sendbuf, send_bytes, recvbuf, recv_bytes))
            return SUMO__FAIL(tp, SUMO_ERR_INVALID_ARGUMENT,
                              "%s: send and receive buffers overlap without being the same "
                              "pointer",
                              what);
    }
    return SUMO_SUCCESS;
}

static sumo_result compare_descs(sumo_comm *c, const call_desc *all, const call_desc *mine)
{
    sumo__transport *tp = c->tp;
    for (int r = 0; r < tp->size; r++) {
        if (all[r].local_error != SUMO_SUCCESS) {
            if (mine->local_error != SUMO_SUCCESS) return (sumo_result)mine->local_error;
            return SUMO__FAIL(tp, (sumo_result)all[r].local_error,
                              "%s: rank %d failed before moving data (%s: its arguments, or "
                              "a layer above); no rank moved data",
                              kind_name(mine->kind), r,
                              sumo_result_name((sumo_result)all[r].local_error));
        }
    }
    for (int r = 0; r < tp->size; r++) {
        const call_desc *o = &all[r];
        if (o->kind != mine->kind)
            return SUMO__FAIL(tp, SUMO_ERR_MISMATCH, "rank %d called %s while rank %d called %s", r,
                              kind_name(o->kind), tp->rank, kind_name(mine->kind));
        if (o->count != mine->count)
            return SUMO__FAIL(tp, SUMO_ERR_MISMATCH,
                              "%s: rank %d passed count %llu, rank %d passed %llu",
                              kind_name(mine->kind), r, (unsigned long long)o->count, tp->rank,
                              (unsigned long long)mine->count);
        if (o->dtype != mine->dtype)
            return SUMO__FAIL(tp, SUMO_ERR_MISMATCH, "%s: rank %d passed dtype %s, rank %d %s",
                              kind_name(mine->kind), r, sumo__dtype_name(o->dtype), tp->rank,
                              sumo__dtype_name(mine->dtype));
        if (o->op != mine->op)
            return SUMO__FAIL(tp, SUMO_ERR_MISMATCH, "%s: rank %d passed op %s, rank %d %s",
                              kind_name(mine->kind), r, sumo__op_name(o->op), tp->rank,
                              sumo__op_name(mine->op));
        if (o->root != mine->root)
            return SUMO__FAIL(tp, SUMO_ERR_MISMATCH, "%s: rank %d passed root %d, rank %d %d",
                              kind_name(mine->kind), r, o->root, tp->rank, mine->root);
        if (o->aux != mine->aux)
            return SUMO__FAIL(tp, SUMO_ERR_MISMATCH,
                              "%s: rank %d passed a different tensor layout or op options than "
                              "rank %d (layout hash %016llx vs %016llx)",
                              kind_name(mine->kind), r, tp->rank, (unsigned long long)o->aux,
                              (unsigned long long)mine->aux);
    }
    return SUMO_SUCCESS;
}

/*
 * The agreement step. On shared memory the descriptors stay readable in the control block
 * after a successful return (the direct algorithms use the published pointers); the caller
 * must pass at least one more barrier before returning, so no rank overwrites its descriptor
 * while a peer still reads it.
 */
static sumo_result agree(sumo_comm *c, call_desc *d)
{
    sumo__transport *tp = c->tp;
    call_desc all_stack[16];
    call_desc *all = all_stack;
    if (tp->size > (int)(sizeof all_stack / sizeof all_stack[0])) {
        void *s;
        SUMO__CHECK(sumo__comm_scratch(c, sizeof(call_desc) * (size_t)tp->size, &s));
        all = s;
    }
    if (tp->shm == NULL) {
        SUMO__CHECK(tp->ops->allgather_small(tp, d, all, sizeof *d));
        return compare_descs(c, all, d);
    }
    sumo__shm_desc *slots = tp->shm->ctl->desc;
    _Static_assert(sizeof(call_desc) <= sizeof slots[0].payload, "descriptor fits its slot");
    memcpy(slots[tp->rank].payload, d, sizeof *d);
    SUMO__CHECK(sumo__shm_barrier(tp));
    for (int k = 0; k < tp->size; k++) memcpy(&all[k], slots[k].payload, sizeof all[k]);
    sumo_result r = compare_descs(c, all, d);
    if (r != SUMO_SUCCESS) {
        /* Everyone saw the same descriptors, so everyone is failing: leave together. */
        sumo_result b = sumo__shm_barrier(tp);
        return b != SUMO_SUCCESS ? b : r;
    }
    return SUMO_SUCCESS;
}

sumo_result sumo__agree(sumo_comm *c, sumo__call_desc *d) { return agree(c, d); }

/* The buffer rank k published in the agreement step (shared address space only). */
static unsigned char *peer_ptr(sumo__transport *tp, int k, bool recv)
{
    call_desc o;
    memcpy(&o, tp->shm->ctl->desc[k].payload, sizeof o);
    return (unsigned char *)(uintptr_t)(recv ? o.recvptr : o.sendptr);
}

static size_t line_elems(size_t esz) { return SUMO__CACHELINE / esz; }

/* Rank r's part [lo, hi) of n elements, cut at cache-line multiples so that no two ranks write
 * the same line. */
static void cache_slice(size_t n, size_t esz, int parts, int r, size_t *lo, size_t *hi)
{
    size_t unit = line_elems(esz);
    size_t lines = (n + unit - 1) / unit;
    size_t per = lines / (size_t)parts, extra = lines % (size_t)parts;
    size_t first = (size_t)r * per + SUMO__MIN((size_t)r, extra);
    size_t last = first + per + ((size_t)r < extra ? 1 : 0);
    *lo = SUMO__MIN(first * unit, n);
    *hi = SUMO__MIN(last * unit, n);
}

/* Segment s of n split into parts nearly equal parts (for the ring). */
static size_t seg_off(size_t n, int parts, int s)
{
    return (n / (size_t)parts) * (size_t)s + SUMO__MIN((size_t)s, n % (size_t)parts);
}
static size_t seg_len(size_t n, int parts, int s) { return seg_off(n, parts, s + 1) - seg_off(n, parts, s); }

static int divisor_of(sumo_op op, int size) { return op == SUMO_OP_AVERAGE ? size : 1; }

/* The type partial sums travel in: fp16 and bf16 accumulate in fp32. */
static sumo_dtype accumulator_of(sumo_dtype dtype)
{
    return dtype == SUMO_FLOAT16 || dtype == SUMO_BFLOAT16 ? SUMO_FLOAT32 : dtype;
}

/* Two pointer arrays of size entries from the handle's scratch. */
static sumo_result pointer_arrays(sumo_comm *c, void ***outs, const void ***ins)
{
    void *s;
    SUMO__CHECK(sumo__comm_scratch(c, 2 * sizeof(void *) * (size_t)c->tp->size, &s));
    *outs = s;
    *ins = (const void **)((void **)s + c->tp->size);
    return SUMO_SUCCESS;
}

/* ---- shared memory, same address space (threads) ---------------------------------------- */

static sumo_result allreduce_direct(sumo_comm *c, call_desc *d)
{
    sumo__transport *tp = c->tp;
    SUMO__CHECK(agree(c, d));
    size_t esz = sumo__dtype_bytes(d->dtype), lo, hi;
    cache_slice(d->count, esz, tp->size, tp->rank, &lo, &hi);
    if (hi > lo) {
        void **outs;
        const void **ins;
        SUMO__CHECK(pointer_arrays(c, &outs, &ins));
        for (int k = 0; k < tp->size; k++) {
            ins[k] = peer_ptr(tp, k, false) + lo * esz;
            outs[k] = peer_ptr(tp, k, true) + lo * esz;
        }
        sumo__reduce_multi(d->dtype, outs, tp->size, ins, tp->size, hi - lo,
                           divisor_of(d->op, tp->size));
    }
    return sumo__shm_barrier(tp);
}

static sumo_result broadcast_direct(sumo_comm *c, call_desc *d)
{
    sumo__transport *tp = c->tp;
    SUMO__CHECK(agree(c, d));
    size_t esz = sumo__dtype_bytes(d->dtype), lo, hi;
    cache_slice(d->count, esz, tp->size, tp->rank, &lo, &hi);
    const unsigned char *src = peer_ptr(tp, d->root, false) + lo * esz;
    for (int k = 0; k < tp->size && hi > lo; k++) {
        unsigned char *dst = peer_ptr(tp, k, true) + lo * esz;
        if (dst != src) memcpy(dst, src, (hi - lo) * esz);
    }
    return sumo__shm_barrier(tp);
}

static sumo_result allgather_direct(sumo_comm *c, call_desc *d, const void *sendbuf)
{
    sumo__transport *tp = c->tp;
    SUMO__CHECK(agree(c, d));
    size_t bytes = d->count * sumo__dtype_bytes(d->dtype);
    for (int k = 0; k < tp->size && bytes; k++) {
        unsigned char *dst = peer_ptr(tp, k, true) + (size_t)tp->rank * bytes;
        if (dst != (const unsigned char *)sendbuf) memcpy(dst, sendbuf, bytes);
    }
    return sumo__shm_barrier(tp);
}

/* ---- shared memory, separate address spaces (processes on one node) --------------------- */

/*
 * Each rank's staging area holds two halves; chunk k uses half k % 2. Per chunk: every rank
 * reduces its cache slice of the chunk across all ranks' staging areas and writes the result
 * back into all of them, copies its next input chunk into the other half, passes one barrier,
 * and copies the finished chunk out of its own area. A half is rewritten only two barriers
 * after everyone last read it. Chunks are small enough to stay in cache, so user buffers are
 * read once and written once.
 */
typedef struct staging {
    sumo__shm *shm;
    size_t chunk; /* elements per chunk */
    size_t esz;
} staging;

static staging staging_of(sumo__transport *tp, size_t esz)
{
    staging s = {.shm = tp->shm, .esz = esz};
    size_t unit = line_elems(esz) * (size_t)tp->size;
    s.chunk = (tp->shm->stage_bytes / 2 / esz) / unit * unit;
    if (s.chunk == 0) s.chunk = line_elems(esz);
    return s;
}

static unsigned char *stage_half(const staging *s, int rank, size_t k)
{
    return s->shm->stage[rank] + (k & 1) * (s->shm->stage_bytes / 2);
}

static size_t chunk_len(const staging *s, size_t count, size_t k)
{
    return SUMO__MIN(s->chunk, count - k * s->chunk);
}

static size_t chunk_count(const staging *s, size_t count) { return (count + s->chunk - 1) / s->chunk; }

static void stage_in(const staging *s, int rank, size_t k, const void *src, size_t count)
{
    memcpy(stage_half(s, rank, k), (const unsigned char *)src + k * s->chunk * s->esz,
           chunk_len(s, count, k) * s->esz);
}

static sumo_result allreduce_staged(sumo_comm *c, call_desc *d, const void *sendbuf, void *recvbuf)
{
    sumo__transport *tp = c->tp;
    size_t esz = sumo__dtype_bytes(d->dtype);
    if (esz == 0) return agree(c, d); /* invalid dtype: only the agreement can report it */
    staging s = staging_of(tp, esz);
    size_t chunks = chunk_count(&s, d->count);
    int me = tp->rank, size = tp->size;
    /* The first copy rides ahead of the agreement barrier; it touches only our own area. */
    if (chunks > 0 && d->local_error == SUMO_SUCCESS) stage_in(&s, me, 0, sendbuf, d->count);
    SUMO__CHECK(agree(c, d));
    void **outs;
    const void **ins;
    SUMO__CHECK(pointer_arrays(c, &outs, &ins));
    for (size_t k = 0; k < chunks; k++) {
        size_t len = chunk_len(&s, d->count, k), lo, hi;
        cache_slice(len, esz, size, me, &lo, &hi);
        if (hi > lo) {
            for (int r = 0; r < size; r++) {
                ins[r] = stage_half(&s, r, k) + lo * esz;
                outs[r] = stage_half(&s, r, k) + lo * esz;
            }
            sumo__reduce_multi(d->dtype, outs, size, ins, size, hi - lo, divisor_of(d->op, size));
        }
        if (k + 1 < chunks) stage_in(&s, me, k + 1, sendbuf, d->count);
        SUMO__CHECK(sumo__shm_barrier(tp));
        memcpy((unsigned char *)recvbuf + k * s.chunk * esz, stage_half(&s, me, k), len * esz);
    }
    return chunks == 0 ? sumo__shm_barrier(tp) : SUMO_SUCCESS;
}

static sumo_result broadcast_staged(sumo_comm *c, call_desc *d, const void *sendbuf, void *recvbuf)
{
    sumo__transport *tp = c->tp;
    size_t esz = sumo__dtype_bytes(d->dtype);
    if (esz == 0) return agree(c, d);
    staging s = staging_of(tp, esz);
    size_t chunks = chunk_count(&s, d->count);
    bool root = tp->rank == d->root;
    if (root && chunks > 0 && d->local_error == SUMO_SUCCESS) stage_in(&s, tp->rank, 0, sendbuf, d->count);
    SUMO__CHECK(agree(c, d));
    for (size_t k = 0; k < chunks; k++) {
        size_t len = chunk_len(&s, d->count, k);
        unsigned char *dst = (unsigned char *)recvbuf + k * s.chunk * esz;
        if (!root) memcpy(dst, stage_half(&s, d->root, k), len * esz);
        else {
            if (sendbuf != recvbuf) memcpy(dst, (const unsigned char *)sendbuf + k * s.chunk * esz, len * esz);
            if (k + 1 < chunks) stage_in(&s, tp->rank, k + 1, sendbuf, d->count);
        }
        SUMO__CHECK(sumo__shm_barrier(tp));
    }
    return chunks == 0 ? sumo__shm_barrier(tp) : SUMO_SUCCESS;
}

static sumo_result allgather_staged(sumo_comm *c, call_desc *d, const void *sendbuf, void *recvbuf)
{
    sumo__transport *tp = c->tp;
    size_t esz = sumo__dtype_bytes(d->dtype);
    if (esz == 0) return agree(c, d);
    staging s = staging_of(tp, esz);
    size_t chunks = chunk_count(&s, d->count);
    if (chunks > 0 && d->local_error == SUMO_SUCCESS) stage_in(&s, tp->rank, 0, sendbuf, d->count);
    SUMO__CHECK(agree(c, d));
    for (size_t k = 0; k < chunks; k++) {
        size_t len = chunk_len(&s, d->count, k);
        for (int r = 0; r < tp->size; r++) {
            unsigned char *dst = (unsigned char *)recvbuf + ((size_t)r * d->count + k * s.chunk) * esz;
            memcpy(dst, stage_half(&s, r, k), len * esz);
        }
        if (k + 1 < chunks) stage_in(&s, tp->rank, k + 1, sendbuf, d->count);
        SUMO__CHECK(sumo__shm_barrier(tp));
    }
    return chunks == 0 ? sumo__shm_barrier(tp) : SUMO_SUCCESS;
}

/* ---- point to point (any transport; the only choice across machines) -------------------- */
/*
 * On a shared-memory transport these still agree through the control block, so they end with
 * a barrier there (p2p_done): a rank whose part finished early (the root of a broadcast, any
 * rank when count is 0) must not publish its next descriptor while a peer still reads this
 * one.
 */
static sumo_result p2p_done(sumo_comm *c)
{
    return c->tp->shm ? sumo__shm_barrier(c->tp) : SUMO_SUCCESS;
}


/* Copies (or widens) the input into the accumulator buffer the p2p algorithms work on. */
static sumo_result p2p_work_buffers(sumo_comm *c, const call_desc *d, const void *sendbuf,
                                    void *recvbuf, size_t tmp_elems, void **work, void **tmp)
{
    sumo_dtype acc = accumulator_of(d->dtype);
    size_t aesz = sumo__dtype_bytes(acc);
    bool widen = acc != (sumo_dtype)d->dtype;
    size_t work_bytes = widen ? d->count * aesz : 0;
    void *s;
    SUMO__CHECK(sumo__comm_scratch(c, work_bytes + tmp_elems * aesz + 64, &s));
    *tmp = (unsigned char *)s + (work_bytes + 63) / 64 * 64;
    if (widen) {
        *work = s;
        sumo__kernel_convert(acc, *work, d->dtype, sendbuf, d->count);
    } else {
        *work = recvbuf;
        if (sendbuf != recvbuf) memcpy(recvbuf, sendbuf, d->count * aesz);
    }
    return SUMO_SUCCESS;
}

static void p2p_finish(const call_desc *d, void *work, void *recvbuf)
{
    sumo_dtype acc = accumulator_of(d->dtype);
    if (acc != (sumo_dtype)d->dtype) sumo__kernel_convert(d->dtype, recvbuf, acc, work, d->count);
}

/* The ring's allgather: each rank starts with its finished segment `own` of buf (elements of
 * esz bytes) and passes segments on until every rank holds all of them. */
static sumo_result ring_allgather(sumo__transport *tp, unsigned char *buf, size_t esz, size_t n,
                                  int own)
{
    int size = tp->size, next = (tp->rank + 1) % size, prev = (tp->rank + size - 1) % size;
    for (int step = 0; step < size - 1; step++) {
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

static sumo_result allreduce_ring_widened(sumo_comm *c, call_desc *d, const void *sendbuf,
                                          void *recvbuf)
{
    sumo__transport *tp = c->tp;
    int size = tp->size, me = tp->rank;
    int next = (me + 1) % size, prev = (me + size - 1) % size;
    size_t n = d->count;
    sumo_dtype dt = (sumo_dtype)d->dtype, acc = accumulator_of(dt);
    size_t esz = sumo__dtype_bytes(dt), aesz = sumo__dtype_bytes(acc);
    const unsigned char *in = sendbuf;
    unsigned char *out = recvbuf;
    if (n == 0) return p2p_done(c); /* the buffers may be NULL */
    size_t seg_max = n / (size_t)size + 1, chunk = SUMO__MIN(seg_max, RING_WIDEN_CHUNK_ELEMS);
    size_t nchunks = (seg_max + chunk - 1) / chunk;
    void *s;
    SUMO__CHECK(sumo__comm_scratch(c, 2 * (chunk * aesz + 64), &s));
    unsigned char *partial = s, *incoming = partial + (chunk * aesz + 63) / 64 * 64;
    int own = (me + 1) % size;
    for (size_t k = 0; k < nchunks; k++) {
        size_t lo, len = ring_chunk(n, size, me, k, chunk, &lo);
        sumo__kernel_convert(acc, partial, dt, in + lo * esz, len);
        for (int step = 0; step < size - 1; step++) {
            int ss = (me - step + size) % size, rs = (me - step - 1 + 2 * size) % size;
            size_t slo, slen = ring_chunk(n, size, ss, k, chunk, &slo);
            len = ring_chunk(n, size, rs, k, chunk, &lo);
            SUMO__CHECK(tp->ops->sendrecv(tp, partial, slen * aesz, next, incoming, len * aesz, prev));
            sumo__kernel_convert(acc, partial, dt, in + lo * esz, len);
            sumo__kernel_add(acc, partial, incoming, partial, len);
        }
        /* Chunk k of every input segment has been read: its output may overwrite it. */
        len = ring_chunk(n, size, own, k, chunk, &lo);
        if (d->op == SUMO_OP_AVERAGE) sumo__kernel_divide(acc, partial, partial, len, size);
        sumo__kernel_convert(dt, out + lo * esz, acc, partial, len);
    }
    SUMO__CHECK(ring_allgather(tp, out, esz, n, own));
    return p2p_done(c);
}

/* fp32 and fp64: the type accumulates itself, so the ring works in the receive buffer. */
static sumo_result allreduce_ring(sumo_comm *c, call_desc *d, const void *sendbuf, void *recvbuf)
{
    sumo__transport *tp = c->tp;
    SUMO__CHECK(agree(c, d));
    sumo_dtype dt = (sumo_dtype)d->dtype;
    if (accumulator_of(dt) != dt) return allreduce_ring_widened(c, d, sendbuf, recvbuf);
    int size = tp->size, me = tp->rank;
    int next = (me + 1) % size, prev = (me + size - 1) % size;
    size_t n = d->count, esz = sumo__dtype_bytes(dt);
    void *workv, *tmp;
    SUMO__CHECK(p2p_work_buffers(c, d, sendbuf, recvbuf, n / (size_t)size + 1, &workv, &tmp));
    unsigned char *work = workv;
    for (int step = 0; step < size - 1; step++) {
        int ss = (me - step + size) % size, rs = (me - step - 1 + 2 * size) % size;
        SUMO__CHECK(tp->ops->sendrecv(tp, work + seg_off(n, size, ss) * esz,
                                      seg_len(n, size, ss) * esz, next, tmp,
                                      seg_len(n, size, rs) * esz, prev));
        unsigned char *mine = work + seg_off(n, size, rs) * esz;
        sumo__kernel_add(dt, mine, tmp, mine, seg_len(n, size, rs));
    }
    int own = (me + 1) % size;
    if (d->op == SUMO_OP_AVERAGE) {
        unsigned char *seg = work + seg_off(n, size, own) * esz;
        sumo__kernel_divide(dt, seg, seg, seg_len(n, size, own), size);
    }
    SUMO__CHECK(ring_allgather(tp, work, esz, n, own));
    return p2p_done(c);
}

/*
 * Recursive doubling; ranks beyond the largest power of two first fold into a partner and get
 * the result back at the end. Partners add the lower rank's partial first, so both hold the
 * same bits.
 */
static sumo_result allreduce_recursive_doubling(sumo_comm *c, call_desc *d, const void *sendbuf,
                                                void *recvbuf)
{
    sumo__transport *tp = c->tp;
    SUMO__CHECK(agree(c, d));
    int size = tp->size, me = tp->rank;
    size_t n = d->count;
    sumo_dtype acc = accumulator_of(d->dtype);
    size_t bytes = n * sumo__dtype_bytes(acc);
    void *work, *tmp;
    SUMO__CHECK(p2p_work_buffers(c, d, sendbuf, recvbuf, n, &work, &tmp));
    int pof2 = 1;
    while (pof2 * 2 <= size) pof2 *= 2;
    int rem = size - pof2, vrank;
    if (me < 2 * rem) {
        if (me % 2) {
            SUMO__CHECK(tp->ops->sendrecv(tp, work, bytes, me - 1, NULL, 0, -1));
            vrank = -1;
        } else {
            SUMO__CHECK(tp->ops->sendrecv(tp, NULL, 0, -1, tmp, bytes, me + 1));
            sumo__kernel_add(acc, work, work, tmp, n);
            vrank = me / 2;
        }
    } else {
        vrank = me - rem;
    }
    if (vrank >= 0) {
        for (int mask = 1; mask < pof2; mask <<= 1) {
            int vpeer = vrank ^ mask;
            int peer = vpeer < rem ? vpeer * 2 : vpeer + rem;
            SUMO__CHECK(tp->ops->sendrecv(tp, work, bytes, peer, tmp, bytes, peer));
            if (vrank < vpeer) sumo__kernel_add(acc, work, work, tmp, n);
            else sumo__kernel_add(acc, work, tmp, work, n);
        }
        if (d->op == SUMO_OP_AVERAGE) sumo__kernel_divide(acc, work, work, n, size);
    }
    if (me < 2 * rem) {
        if (me % 2) SUMO__CHECK(tp->ops->sendrecv(tp, NULL, 0, -1, work, bytes, me - 1));
        else SUMO__CHECK(tp->ops->sendrecv(tp, work, bytes, me + 1, NULL, 0, -1));
    }
    p2p_finish(d, work, recvbuf);
    return p2p_done(c);
}

static sumo_result broadcast_tree(sumo_comm *c, call_desc *d, const void *sendbuf, void *recvbuf)
{
    sumo__transport *tp = c->tp;
    SUMO__CHECK(agree(c, d));
    int size = tp->size, vrank = (tp->rank - d->root + size) % size;
    size_t bytes = d->count * sumo__dtype_bytes(d->dtype);
    if (vrank == 0 && sendbuf != recvbuf && bytes) memcpy(recvbuf, sendbuf, bytes);
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
    return p2p_done(c);
}

static sumo_result allgather_ring(sumo_comm *c, call_desc *d, const void *sendbuf, void *recvbuf)
{
    sumo__transport *tp = c->tp;
    SUMO__CHECK(agree(c, d));
    int size = tp->size, me = tp->rank;
    size_t bytes = d->count * sumo__dtype_bytes(d->dtype);
    unsigned char *out = recvbuf;
    if (out + (size_t)me * bytes != (const unsigned char *)sendbuf && bytes)
        memcpy(out + (size_t)me * bytes, sendbuf, bytes);
    for (int step = 0; step < size - 1; step++) {
        int ss = (me - step + size) % size, rs = (me - step - 1 + size) % size;
        SUMO__CHECK(tp->ops->sendrecv(tp, out + (size_t)ss * bytes, bytes, (me + 1) % size,
                                      out + (size_t)rs * bytes, bytes, (me + size - 1) % size));
    }
    return p2p_done(c);
}

/* ---- entry points ------------------------------------------------------------------------- */

static sumo_result usable(sumo_comm *c)
{
    if (c->tp->broken) return SUMO_ERR_PEER_FAILURE; /* errmsg still names the first failure */
    return SUMO_SUCCESS;
}

sumo_result sumo__fail_together(sumo_comm *c, sumo_result code)
{
    sumo__comm_enter(c);
    /* The peers' comparison looks at local_error before the kind, so any kind will do. */
    call_desc d = {.kind = KIND_BARRIER, .local_error = (uint32_t)code};
    if (usable(c) == SUMO_SUCCESS) agree(c, &d);
    sumo__comm_leave(c);
    return code;
}

static sumo_algorithm pick_allreduce(sumo_comm *c, const call_desc *d)
{
    if (c->algo != SUMO_ALGORITHM_AUTO) return c->algo;
    if (c->tp->shm) return SUMO_ALGORITHM_SHARED_MEMORY;
    size_t bytes = d->count * sumo__dtype_bytes(d->dtype);
    if (bytes <= SMALL_MESSAGE_BYTES) {
        if (c->tp->ops->native_allreduce && (d->dtype == SUMO_FLOAT32 || d->dtype == SUMO_FLOAT64))
            return SUMO_ALGORITHM_PEER;
        return SUMO_ALGORITHM_RECURSIVE_DOUBLING;
    }
    return SUMO_ALGORITHM_RING;
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
    SUMO__CHECK(usable(c));
    if (op >= SUMO_OP_ADASUM) return sumo__allreduce_adasum(c, sendbuf, recvbuf, count, dtype, op);
    call_desc d = {.kind = KIND_ALLREDUCE, .dtype = (uint32_t)dtype, .op = (uint32_t)op,
                   .count = count, .sendptr = (uintptr_t)sendbuf, .recvptr = (uintptr_t)recvbuf};
    size_t bytes = bytes_of(count, dtype);
    d.local_error = validate(c, &d, sendbuf, recvbuf, bytes, bytes);
    sumo_algorithm algo = pick_allreduce(c, &d);
    SUMO__LOG(c->tp->log_level, SUMO__LOG_INFO, "rank %d allreduce count %zu %s %s algo %d",
              c->tp->rank, count, sumo__dtype_name(dtype), sumo__op_name(op), (int)algo);
    if (d.local_error != SUMO_SUCCESS) return agree(c, &d);
    switch (algo) {
    case SUMO_ALGORITHM_SHARED_MEMORY:
        if (c->tp->shm->same_address_space) return allreduce_direct(c, &d);
        return allreduce_staged(c, &d, sendbuf, recvbuf);
    case SUMO_ALGORITHM_RING: return allreduce_ring(c, &d, sendbuf, recvbuf);
    case SUMO_ALGORITHM_RECURSIVE_DOUBLING: return allreduce_recursive_doubling(c, &d, sendbuf, recvbuf);
    case SUMO_ALGORITHM_PEER:
        SUMO__CHECK(agree(c, &d));
        SUMO__CHECK(c->tp->ops->native_allreduce(c->tp, sendbuf, recvbuf, count, dtype, op));
        return p2p_done(c);
    default: return SUMO__FAIL(c->tp, SUMO_ERR_INTERNAL, "allreduce: unknown algorithm %d", (int)algo);
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
    SUMO__CHECK(usable(c));
    call_desc d = {.kind = KIND_BROADCAST, .dtype = (uint32_t)dtype, .root = root, .count = count,
                   .sendptr = (uintptr_t)sendbuf, .recvptr = (uintptr_t)recvbuf};
    size_t bytes = bytes_of(count, dtype);
    d.local_error = validate(c, &d, sendbuf, recvbuf, bytes, bytes);
    if (d.local_error != SUMO_SUCCESS) return agree(c, &d);
    bool shm = c->tp->shm && (c->algo == SUMO_ALGORITHM_AUTO || c->algo == SUMO_ALGORITHM_SHARED_MEMORY);
    if (shm && c->tp->shm->same_address_space) return broadcast_direct(c, &d);
    if (shm) return broadcast_staged(c, &d, sendbuf, recvbuf);
    return broadcast_tree(c, &d, sendbuf, recvbuf);
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
    SUMO__CHECK(usable(c));
    call_desc d = {.kind = KIND_ALLGATHER, .dtype = (uint32_t)dtype, .count = count,
                   .sendptr = (uintptr_t)sendbuf, .recvptr = (uintptr_t)recvbuf};
    size_t send_bytes = bytes_of(count, dtype);
    size_t recv_bytes = SIZE_MAX;
    if (send_bytes != SIZE_MAX && sumo__mul_overflows(send_bytes, (size_t)c->tp->size, &recv_bytes))
        recv_bytes = SIZE_MAX;
    d.local_error = validate(c, &d, sendbuf, recvbuf, send_bytes, recv_bytes);
    if (d.local_error != SUMO_SUCCESS) return agree(c, &d);
    bool shm = c->tp->shm && (c->algo == SUMO_ALGORITHM_AUTO || c->algo == SUMO_ALGORITHM_SHARED_MEMORY);
    if (shm && c->tp->shm->same_address_space) return allgather_direct(c, &d, sendbuf);
    if (shm) return allgather_staged(c, &d, sendbuf, recvbuf);
    return allgather_ring(c, &d, sendbuf, recvbuf);
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
    sumo_result r = usable(comm);
    if (r == SUMO_SUCCESS) {
        call_desc d = {.kind = KIND_BARRIER};
        r = agree(comm, &d);
        /* On shared memory the descriptors must outlive everyone's comparison. */
        if (r == SUMO_SUCCESS && comm->tp->shm) r = sumo__shm_barrier(comm->tp);
    }
    sumo__comm_leave(comm);
    return r;
}
