#include "collectives/gram.h"
#include "collectives/adasum_gram.h"
#include "collectives/p2p_algos.h"
#include "collectives/shm_algos.h"
#include "collectives/slices.h"

#include <string.h>

_Static_assert(SUMO__GRAM_MAX_RANKS <= SUMO__GRAM_MAX_IN, "the partials kernel takes every rank");

static size_t align64(size_t v) { return (v + 63) / 64 * 64; }

/* Where each part of the scratch starts: host metadata, and the received shards (data, in
 * the memory of the call's buffers). */
typedef struct gram_space {
    double *gram, *incoming, *w;
    double *local; /* small staged calls: the partial sums of the local recursive doubling */
    void *weigh_work;
    unsigned char *shards; /* messages: P - 1 received shards, shard_bytes apart */
    size_t shard_bytes;
} gram_space;

static size_t shard_bytes_of(const sumo_comm *c, const sumo__gram_call *call)
{
    size_t esz = sumo__dtype_bytes(call->dtype);
    return call->shape == SUMO__GRAM_MESSAGES ? align64((call->count / (size_t)c->tp->size + 1) * esz)
                                              : 0;
}

/* Bytes of input per rank up to which a staged call takes the small path: there the P-fold
 * partials and weighted sum cost less than the three barriers and the exchange they save. */
#define GRAM_SMALL_BYTES ((size_t)32 << 10)

bool sumo__gram_small(const sumo_comm *c, const sumo__gram_call *call)
{
    size_t esz = sumo__dtype_bytes(call->dtype);
    if (call->shape != SUMO__GRAM_STAGED || call->count == 0 || c->tp->size < 2) return false;
    /* The output is written from the host kernels, so the buffers must be host memory. */
    if (c->x.k != sumo__host_kernels() || call->count > GRAM_SMALL_BYTES / esz) return false;
    return call->count <= sumo__staging_of(c->tp, &c->x, esz).chunk;
}

/* Partial sums the small path keeps besides the result: one per level of the recursive
 * doubling's tree, and the fold's right operand. */
static size_t small_levels(int P)
{
    size_t n = 1;
    for (int m = 1; m * 2 <= P; m *= 2) n++;
    return n;
}

static size_t layout_space(const sumo_comm *c, const sumo__gram_call *call, unsigned char *base,
                           unsigned char *data, gram_space *gs)
{
    int P = c->tp->size;
    size_t L = sumo__gram_len(P), T = call->ntensors;
    size_t gram = 0, incoming = align64(gram + T * L * sizeof(double));
    size_t w = align64(incoming + T * L * sizeof(double));
    size_t work = align64(w + T * (size_t)P * sizeof(double));
    size_t local = align64(work + call->weigh_work_bytes);
    size_t end = local + (sumo__gram_small(c, call) ? small_levels(P) * T * L * sizeof(double) : 0);
    if (gs) {
        *gs = (gram_space){.gram = (double *)(void *)(base + gram),
                           .incoming = (double *)(void *)(base + incoming),
                           .w = (double *)(void *)(base + w),
                           .local = (double *)(void *)(base + local),
                           .weigh_work = base + work,
                           .shards = data,
                           .shard_bytes = shard_bytes_of(c, call)};
    }
    return end;
}

size_t sumo__gram_scratch_bytes(const sumo_comm *c, const sumo__gram_call *call)
{
    return layout_space(c, call, NULL, NULL, NULL);
}

size_t sumo__gram_data_bytes(const sumo_comm *c, const sumo__gram_call *call)
{
    return (size_t)(c->tp->size - 1) * shard_bytes_of(c, call);
}

/* in_at[k] for elements [s, e) of the buffer: rank k's input there. */
typedef void (*inputs_fn)(const void *ctx, size_t s, const void **in_at);

/* Adds the partials of every tensor piece in [lo, hi) to gram (which the caller zeroed), one
 * kernel call for the whole range. */
static sumo_result partials(sumo_comm *c, const sumo__exec *x, const sumo__gram_call *call,
                            size_t lo, size_t hi, inputs_fn inputs, const void *ctx, double *gram)
{
    const void *in_at[SUMO__GRAM_MAX_RANKS];
    if (hi <= lo) return SUMO_SUCCESS;
    inputs(ctx, lo, in_at);
    SUMO__KCHECK(c, sumo__k_gram_partials(x, call->dtype, in_at, c->tp->size, call->offsets,
                                          call->ntensors, lo, hi, gram));
    return SUMO_SUCCESS;
}

/* outs[k][s - lo] = sum_r w[t][r] in_r[s] for every element s of [lo, hi) (tensor t's), for
 * each of the nout outputs, which start at element lo; one kernel call. */
static sumo_result weighted(sumo_comm *c, const sumo__exec *x, const sumo__gram_call *call,
                            size_t lo, size_t hi, inputs_fn inputs, const void *ctx,
                            const double *w, unsigned char *const *outs, int nout)
{
    const void *in_at[SUMO__GRAM_MAX_RANKS];
    if (hi <= lo) return SUMO_SUCCESS;
    inputs(ctx, lo, in_at);
    SUMO__KCHECK(c, sumo__k_weighted_sum(x, call->dtype, (void *const *)outs, nout, in_at,
                                         c->tp->size, call->offsets, call->ntensors, lo, hi, w));
    return SUMO_SUCCESS;
}

/* Every rank's partials summed, the weights; false when the weigh function declined. */
static sumo_result weigh(sumo_comm *c, const sumo__gram_call *call, gram_space *g, bool *accept)
{
    size_t L = sumo__gram_len(c->tp->size);
    sumo__rd_group everyone = {.members = c->tp->size, .me = c->tp->rank};
    const sumo__exec host = sumo__host_exec();
    SUMO__CHECK(sumo__rd_sum(c, &everyone, &host, SUMO_FLOAT64, g->gram, g->incoming,
                             call->ntensors * L));
    *accept = call->weigh(call->ctx, g->gram, call->ntensors, g->w, g->weigh_work);
    return SUMO_SUCCESS;
}

/* ---- direct ------------------------------------------------------------------------------- */

typedef struct direct_inputs {
    const unsigned char *send_of[SUMO__GRAM_MAX_RANKS];
    size_t esz;
    int P;
} direct_inputs;

static void direct_at(const void *ctx, size_t s, const void **in_at)
{
    const direct_inputs *d = ctx;
    for (int k = 0; k < d->P; k++) in_at[k] = d->send_of[k] + s * d->esz;
}

static sumo_result run_direct(sumo_comm *c, const sumo__call_desc *all, const sumo__gram_call *call,
                              gram_space *g, bool *applied)
{
    sumo__transport *tp = c->tp;
    int P = tp->size;
    size_t esz = sumo__dtype_bytes(call->dtype), lo, hi;
    direct_inputs in = {.esz = esz, .P = P};
    unsigned char *recv_of[SUMO__GRAM_MAX_RANKS], *recv_at[SUMO__GRAM_MAX_RANKS];
    for (int k = 0; k < P; k++) {
        void *peer_send, *peer_recv;
        SUMO__CHECK(sumo__peer_buffer(c, all, k, false, &peer_send));
        SUMO__CHECK(sumo__peer_buffer(c, all, k, true, &peer_recv));
        in.send_of[k] = peer_send;
        recv_of[k] = peer_recv;
    }
    sumo__cache_slice(call->count, esz, P, tp->rank, &lo, &hi);
    for (int k = 0; k < P; k++) recv_at[k] = recv_of[k] + lo * esz;
    memset(g->gram, 0, call->ntensors * sumo__gram_len(P) * sizeof *g->gram);
    SUMO__CHECK(partials(c, &c->x, call, lo, hi, direct_at, &in, g->gram));
    bool accept;
    SUMO__CHECK(weigh(c, call, g, &accept));
    /* An output may be its rank's input (in place): this rank alone reads this slice, and the
     * kernel reads each element of every input before writing it to every output. */
    if (accept) SUMO__CHECK(weighted(c, &c->x, call, lo, hi, direct_at, &in, g->w, recv_at, P));
    *applied = accept;
    /* No rank returns while a peer still reads or writes its buffers. */
    return tp->ops->barrier(tp);
}

/* ---- staged ------------------------------------------------------------------------------- */

typedef struct staged_inputs {
    const sumo__staging *st;
    size_t k;     /* the chunk */
    size_t first; /* its first element in the buffer */
    int P;
} staged_inputs;

static void staged_at(const void *ctx, size_t s, const void **in_at)
{
    const staged_inputs *d = ctx;
    for (int r = 0; r < d->P; r++)
        in_at[r] = sumo__stage_half(d->st, r, d->k) + (s - d->first) * d->st->esz;
}

/* Points in at chunk k of an n-element buffer; [*lo, *hi) is this rank's slice of the chunk. */
static void staged_chunk(staged_inputs *in, size_t n, size_t k, int me, size_t *lo, size_t *hi)
{
    size_t len = sumo__stage_chunk_len(in->st, n, k);
    sumo__cache_slice(len, in->st->esz, in->P, me, lo, hi);
    in->k = k;
    in->first = k * in->st->chunk;
}

/* The Gram partials of this rank's cache slice of every chunk, streamed through st as
 * sumo__shm_allreduce's staged algorithm streams a sum: the next chunk staged while this one
 * is worked on, one barrier a chunk, so an area's half is rewritten only after everyone has
 * passed the barrier that ended its reads. */
static sumo_result stream_partials(sumo_comm *c, const sumo__gram_call *call, staged_inputs *in,
                                   const void *sendbuf, gram_space *g)
{
    sumo__transport *tp = c->tp;
    int me = tp->rank;
    size_t n = call->count, chunks = sumo__stage_chunk_count(in->st, n);
    /* The staged chunks are host memory. */
    const sumo__exec host = sumo__host_exec();
    memset(g->gram, 0, call->ntensors * sumo__gram_len(tp->size) * sizeof *g->gram);
    if (chunks > 0) SUMO__KCHECK(c, sumo__stage_in(in->st, me, 0, sendbuf, n));
    SUMO__CHECK(tp->ops->barrier(tp));
    for (size_t k = 0; k < chunks; k++) {
        size_t lo, hi;
        staged_chunk(in, n, k, me, &lo, &hi);
        SUMO__CHECK(partials(c, &host, call, in->first + lo, in->first + hi, staged_at, in, g->gram));
        if (k + 1 < chunks) SUMO__KCHECK(c, sumo__stage_in(in->st, me, k + 1, sendbuf, n));
        SUMO__CHECK(tp->ops->barrier(tp));
    }
    return SUMO_SUCCESS;
}

/*
 * Two streams through the staging areas: the partials (chunk k in half k % 2), then the
 * inputs staged again, the slice's weighted sum written into every rank's area, and each
 * rank's own chunk copied out.
 */
static sumo_result run_staged(sumo_comm *c, const void *sendbuf, void *recvbuf,
                              const sumo__gram_call *call, gram_space *g, bool *applied)
{
    sumo__transport *tp = c->tp;
    int P = tp->size, me = tp->rank;
    size_t n = call->count, esz = sumo__dtype_bytes(call->dtype);
    sumo__staging st = sumo__staging_of(tp, &c->x, esz);
    size_t chunks = sumo__stage_chunk_count(&st, n);
    staged_inputs in = {.st = &st, .P = P};
    const sumo__exec host = sumo__host_exec();
    SUMO__CHECK(stream_partials(c, call, &in, sendbuf, g));
    bool accept;
    SUMO__CHECK(weigh(c, call, g, &accept));
    *applied = accept;
    if (!accept || chunks == 0) return SUMO_SUCCESS;
    SUMO__KCHECK(c, sumo__stage_in(&st, me, 0, sendbuf, n));
    SUMO__CHECK(tp->ops->barrier(tp));
    for (size_t k = 0; k < chunks; k++) {
        size_t lo, hi;
        staged_chunk(&in, n, k, me, &lo, &hi);
        if (hi > lo) {
            /* Into every rank's area, where the inputs are (each read before written). */
            unsigned char *outs[SUMO__GRAM_MAX_RANKS];
            for (int r = 0; r < P; r++) outs[r] = sumo__stage_half(&st, r, k) + lo * esz;
            SUMO__CHECK(weighted(c, &host, call, in.first + lo, in.first + hi, staged_at, &in,
                                 g->w, outs, P));
        }
        if (k + 1 < chunks) SUMO__KCHECK(c, sumo__stage_in(&st, me, k + 1, sendbuf, n));
        SUMO__CHECK(tp->ops->barrier(tp));
        SUMO__KCHECK(c, sumo__k_copy(&c->x, (unsigned char *)recvbuf + in.first * esz,
                                     sumo__stage_half(&st, me, k),
                                     sumo__stage_chunk_len(&st, n, k) * esz));
    }
    return SUMO_SUCCESS;
}

/* ---- small, staged --------------------------------------------------------------------- */

static uint32_t stage_skips(void) { return SUMO__DESC_SHARED | SUMO__DESC_RECV_SHARED; }

sumo_result sumo__gram_stage_ahead(sumo_comm *c, const sumo__gram_call *call, uint32_t flags,
                                   const void *sendbuf)
{
    if (!sumo__gram_small(c, call) || (flags & stage_skips())) return SUMO_SUCCESS;
    sumo__staging st = sumo__staging_of(c->tp, &c->x, sumo__dtype_bytes(call->dtype));
    return sumo__stage_in(&st, c->tp->rank, 0, sendbuf, call->count);
}

/* Rank r's partials, as stream_partials computes them on rank r for a one-chunk call. */
static sumo_result slice_partials(sumo_comm *c, const sumo__gram_call *call, staged_inputs *in,
                                  int r, double *out)
{
    size_t lo, hi;
    const sumo__exec host = sumo__host_exec();
    memset(out, 0, call->ntensors * sumo__gram_len(in->P) * sizeof *out);
    staged_chunk(in, call->count, 0, r, &lo, &hi);
    return partials(c, &host, call, lo, hi, staged_at, in, out);
}

static void add_into(double *a, const double *b, size_t n)
{
    for (size_t i = 0; i < n; i++) a[i] = a[i] + b[i];
}

/*
 * Every rank's partials summed into g->gram as sumo__rd_sum sums them over the ranks: pairs
 * (2i, 2i+1) folded first for i < P - pof2, then the balanced tree over the pof2 survivors in
 * order, the lower one on the left (addition commutes, so both partners' sums are these bits).
 * The tree is built as a binary counter: a stack of partial sums, merged while its two top
 * entries cover as many survivors each.
 */
static sumo_result small_partials(sumo_comm *c, const sumo__gram_call *call, staged_inputs *in,
                                  gram_space *g)
{
    int P = in->P, pof2 = 1;
    while (pof2 * 2 <= P) pof2 *= 2;
    int rem = P - pof2, depth = 0, covers[8];
    size_t TL = call->ntensors * sumo__gram_len(P);
    double *stack[8];
    stack[0] = g->gram;
    for (size_t k = 1; k < 8; k++) stack[k] = g->local + (k - 1) * TL;
    if (P == 2) {
        /* The tree is one sum, slice 0's partial + slice 1's: the kernel adding slice 1's
         * straight onto slice 0's makes it (a tensor in one slice only has +0 from the other,
         * and x + 0 is x, as no partial is -0), without a second array to zero and add. */
        size_t lo, hi;
        const sumo__exec host = sumo__host_exec();
        SUMO__CHECK(slice_partials(c, call, in, 0, g->gram));
        staged_chunk(in, call->count, 0, 1, &lo, &hi);
        return partials(c, &host, call, lo, hi, staged_at, in, g->gram);
    }
    for (int v = 0; v < pof2; v++) {
        int r = v < rem ? 2 * v : v + rem;
        SUMO__CHECK(slice_partials(c, call, in, r, stack[depth]));
        if (v < rem) {
            SUMO__CHECK(slice_partials(c, call, in, r + 1, stack[depth + 1]));
            add_into(stack[depth], stack[depth + 1], TL);
        }
        covers[depth++] = 1;
        while (depth >= 2 && covers[depth - 1] == covers[depth - 2]) {
            add_into(stack[depth - 2], stack[depth - 1], TL);
            covers[depth - 2] *= 2;
            depth--;
        }
    }
    return SUMO_SUCCESS;
}

/*
 * The small staged path (gram.h): every input is in its area since the agreement. Each rank
 * reads every area for all partials and for its whole output, nobody writes an area, and a
 * rank returns as soon as its output is written, without a barrier: peers may still be
 * reading the half its input is in, so the transport's parity flips, and the next call's
 * early copy goes into the other half. That half was last read in the call before this one,
 * which every peer ended before it met this call's agreement. (A barrier here cost as much as
 * the weighted sum.) The parity flips first, so that it stays the same on every rank whatever
 * fails after. The weighted sum is elementwise, so the output has the bits the sliced path
 * gives it.
 */
static sumo_result run_small(sumo_comm *c, void *recvbuf, const sumo__gram_call *call,
                             gram_space *g, bool *applied)
{
    sumo__transport *tp = c->tp;
    sumo__staging st = sumo__staging_of(tp, &c->x, sumo__dtype_bytes(call->dtype));
    tp->stage_parity ^= 1u;
    staged_inputs in = {.st = &st, .P = tp->size};
    const sumo__exec host = sumo__host_exec();
    SUMO__LOG(tp->log_level, SUMO__LOG_INFO, "rank %d gram combine: small, every rank's partials here",
              tp->rank);
    SUMO__CHECK(small_partials(c, call, &in, g));
    bool accept = call->weigh(call->ctx, g->gram, call->ntensors, g->w, g->weigh_work);
    *applied = accept;
    /* Declined, the tree runs next and writes the areas: everyone must be done reading. */
    if (!accept) return tp->ops->barrier(tp);
    unsigned char *out = recvbuf;
    return weighted(c, &host, call, 0, call->count, staged_at, &in, g->w, &out, 1);
}

static bool small_everywhere(const sumo_comm *c, const sumo__call_desc *all,
                             const sumo__gram_call *call)
{
    if (!call->staged_ahead || !sumo__gram_small(c, call)) return false;
    for (int r = 0; r < c->tp->size; r++)
        if (all[r].flags & stage_skips()) return false;
    return true;
}

/* ---- into the outputs ----------------------------------------------------------------------- */

/*
 * Every rank's output is shared but some input is private (out of place, from private memory
 * into sumo_mem_alloc's): the outputs serve as whole-buffer staging areas. Each rank copies
 * its input into its own output a chunk ahead (the staged shape's chunks, so the partials
 * sum in the staged shape's order and give its bits), and accumulates its cache slice of
 * each chunk across all outputs once everyone's copy is in, while the chunk is in cache.
 * The weighted sum then runs as the direct shape's does, in place in the outputs: one copy
 * in, none out, and the inputs are not streamed twice.
 */
static sumo_result run_into_outputs(sumo_comm *c, const sumo__call_desc *all, const void *sendbuf,
                                    void *recvbuf, const sumo__gram_call *call, gram_space *g,
                                    bool *applied)
{
    sumo__transport *tp = c->tp;
    int P = tp->size, me = tp->rank;
    size_t n = call->count, esz = sumo__dtype_bytes(call->dtype), lo, hi;
    unsigned char *recv_of[SUMO__GRAM_MAX_RANKS];
    for (int k = 0; k < P; k++) {
        void *peer_recv = recvbuf;
        if (k != me) SUMO__CHECK(sumo__peer_buffer(c, all, k, true, &peer_recv));
        recv_of[k] = peer_recv;
    }
    sumo__staging st = sumo__staging_into_outputs(tp, &c->x, esz, recv_of);
    staged_inputs staged = {.st = &st, .P = P};
    SUMO__CHECK(stream_partials(c, call, &staged, sendbuf, g));
    bool accept;
    SUMO__CHECK(weigh(c, call, g, &accept));
    *applied = accept;
    if (!accept) return SUMO_SUCCESS;
    /* The copies in the outputs are the inputs now; each element of this rank's slice is read
     * from every output before it is written. */
    direct_inputs in = {.esz = esz, .P = P};
    unsigned char *slice_of[SUMO__GRAM_MAX_RANKS];
    sumo__cache_slice(n, esz, P, me, &lo, &hi);
    for (int k = 0; k < P; k++) {
        in.send_of[k] = recv_of[k];
        slice_of[k] = recv_of[k] + lo * esz;
    }
    const sumo__exec host = sumo__host_exec();
    SUMO__CHECK(weighted(c, &host, call, lo, hi, direct_at, &in, g->w, slice_of, P));
    /* No rank returns while a peer still writes its output. */
    return tp->ops->barrier(tp);
}

/* ---- messages ----------------------------------------------------------------------------- */

typedef struct shard_inputs {
    const unsigned char *own; /* this rank's input at its shard's start */
    const unsigned char *shards;
    size_t shard_bytes, lo, esz;
    int me, P;
} shard_inputs;

static void shard_at(const void *ctx, size_t s, const void **in_at)
{
    const shard_inputs *d = ctx;
    /* Rank k's shard of this rank's part sits at slot k (k < me) or k - 1 (k > me). */
    for (int k = 0; k < d->P; k++) {
        if (k == d->me) in_at[k] = d->own + (s - d->lo) * d->esz;
        else {
            int slot = k < d->me ? k : k - 1;
            in_at[k] = d->shards + (size_t)slot * d->shard_bytes + (s - d->lo) * d->esz;
        }
    }
}

/*
 * Shards travel in chunks this big, so that the Gram partials of one chunk run while the next
 * is on the wire, and the weighted sum of one chunk while the previous goes out. (10 Gbit/s
 * shaped links, np 2, 64 MiB: the partials and the weighted sum took 5 ms each between
 * transfers of 27 ms.)
 */
#define GRAM_WIRE_CHUNK_BYTES ((size_t)1 << 20)
/* Elements per slice of that work: short enough (tens of microseconds) that the transfer is
 * polled often. */
#define GRAM_WORK_SLICE ((size_t)1 << 14)

/* Chunk j of the segment [seg_lo, seg_hi) starts here (== seg_hi past its end). */
static size_t wire_chunk(size_t seg_lo, size_t seg_hi, size_t j, size_t chunk)
{
    return SUMO__MIN(seg_hi, seg_lo + j * chunk);
}

/* The Gram work on elements [pos, end) of this rank's shard, a slice per call: the partials,
 * or (weighted) the weighted sum into out. */
typedef struct shard_work {
    sumo_comm *c;
    sumo_result failed; /* a kernel's failure, returned after the exchange */
    const sumo__gram_call *call;
    const shard_inputs *sh;
    gram_space *g;
    unsigned char *out;
    size_t pos, end, esz;
    bool weighted;
} shard_work;

static bool shard_work_slice(void *ctx)
{
    shard_work *w = ctx;
    if (w->pos >= w->end || w->failed != SUMO_SUCCESS) return false;
    size_t e = SUMO__MIN(w->end, w->pos + GRAM_WORK_SLICE);
    if (w->weighted) {
        unsigned char *at = w->out + w->pos * w->esz;
        w->failed = weighted(w->c, &w->c->x, w->call, w->pos, e, shard_at, w->sh, w->g->w, &at, 1);
    } else {
        w->failed = partials(w->c, &w->c->x, w->call, w->pos, e, shard_at, w->sh, w->g->gram);
    }
    w->pos = e;
    return w->pos < w->end && w->failed == SUMO_SUCCESS;
}

static sumo_result run_messages(sumo_comm *c, const void *sendbuf, void *recvbuf,
                                const sumo__gram_call *call, gram_space *g, bool *applied)
{
    sumo__transport *tp = c->tp;
    int P = tp->size, me = tp->rank;
    size_t n = call->count, esz = sumo__dtype_bytes(call->dtype);
    size_t lo = sumo__seg_off(n, P, me), hi = sumo__seg_off(n, P, me + 1);
    /* Every rank cuts every segment into the same number of chunks (the longest segment's),
     * so the pieces of an exchange pair up; a short segment's last chunks are empty. */
    size_t chunk = SUMO__MAX((size_t)1, GRAM_WIRE_CHUNK_BYTES / esz);
    size_t chunks = n == 0 ? 0 : ((n + (size_t)P - 1) / (size_t)P + chunk - 1) / chunk;
    const unsigned char *in = sendbuf;
    unsigned char *out = recvbuf;
    shard_inputs sh = {.own = in ? in + lo * esz : NULL, .shards = g->shards,
                       .shard_bytes = g->shard_bytes, .lo = lo, .esz = esz, .me = me, .P = P};
    shard_work work = {.c = c, .call = call, .sh = &sh, .g = g, .out = out, .esz = esz};
    memset(g->gram, 0, call->ntensors * sumo__gram_len(P) * sizeof *g->gram);
    /* The all-to-all, chunk by chunk: in round k, send to me + k chunk j of the piece of our
     * input it owns, receive from me - k chunk j of the piece of its input we own, while the
     * partials of chunk j - 1 (all of whose pieces are here) run. */
    for (size_t j = 0; j <= chunks; j++) {
        work.pos = j == 0 ? lo : wire_chunk(lo, hi, j - 1, chunk);
        work.end = j == 0 ? lo : wire_chunk(lo, hi, j, chunk);
        for (int k = 1; k < P && j < chunks; k++) {
            int dst = (me + k) % P, src = (me - k + P) % P;
            size_t dlo = sumo__seg_off(n, P, dst), dhi = sumo__seg_off(n, P, dst + 1);
            size_t s0 = wire_chunk(dlo, dhi, j, chunk), s1 = wire_chunk(dlo, dhi, j + 1, chunk);
            size_t r0 = wire_chunk(lo, hi, j, chunk), r1 = wire_chunk(lo, hi, j + 1, chunk);
            int slot = src < me ? src : src - 1;
            SUMO__CHECK(sumo__sendrecv_working(
                tp, in + s0 * esz, (s1 - s0) * esz, dst,
                g->shards + (size_t)slot * g->shard_bytes + (r0 - lo) * esz, (r1 - r0) * esz, src,
                k == 1 ? shard_work_slice : NULL, &work));
        }
        while (shard_work_slice(&work)) {}
        SUMO__CHECK(work.failed);
    }
    bool accept;
    SUMO__CHECK(weigh(c, call, g, &accept));
    *applied = accept;
    if (!accept || n == 0) return SUMO_SUCCESS;
    /* In place, our shard of the output is our shard of the input: the kernel reads each
     * element before writing it. The ring's first step is made here, chunk by chunk: chunk
     * j - 1 of our shard goes to the next rank (and the previous rank's comes in) while chunk
     * j is weighted. */
    work.weighted = true;
    int next = (me + 1) % P, prev = (me - 1 + P) % P;
    size_t plo = sumo__seg_off(n, P, prev), phi = sumo__seg_off(n, P, prev + 1);
    for (size_t j = 0; j <= chunks; j++) {
        work.pos = wire_chunk(lo, hi, j, chunk);
        work.end = wire_chunk(lo, hi, j + 1, chunk);
        if (j == 0 || P == 1) {
            while (shard_work_slice(&work)) {}
            SUMO__CHECK(work.failed);
            continue;
        }
        size_t s0 = wire_chunk(lo, hi, j - 1, chunk), s1 = wire_chunk(lo, hi, j, chunk);
        size_t r0 = wire_chunk(plo, phi, j - 1, chunk), r1 = wire_chunk(plo, phi, j, chunk);
        SUMO__CHECK(sumo__sendrecv_working(tp, out + s0 * esz, (s1 - s0) * esz, next,
                                           out + r0 * esz, (r1 - r0) * esz, prev,
                                           shard_work_slice, &work));
        SUMO__CHECK(work.failed);
    }
    return sumo__ring_pass_segments_from(tp, recvbuf, esz, n, me, 1);
}

sumo__gram_shape sumo__gram_shape_for(const sumo_comm *c)
{
    if (sumo__call_direct(c)) return c->tp->size > 1 ? SUMO__GRAM_DIRECT : SUMO__GRAM_MESSAGES;
    return sumo__comm_shared_memory(c) ? SUMO__GRAM_STAGED : SUMO__GRAM_MESSAGES;
}

sumo_result sumo__gram_run(sumo_comm *c, const sumo__call_desc *all, const void *sendbuf,
                           void *recvbuf, const sumo__gram_call *call, void *scratch, void *data,
                           bool *applied)
{
    gram_space g;
    layout_space(c, call, scratch, data, &g);
    /* Staged processes whose buffers all come from sumo_mem_alloc reach them directly; whose
     * outputs alone do, stage into those. */
    if (call->shape == SUMO__GRAM_STAGED && sumo__all_shared(c, all)) {
        SUMO__LOG(c->tp->log_level, SUMO__LOG_INFO,
                  "rank %d gram combine: every rank's buffers are shared, direct", c->tp->rank);
        return run_direct(c, all, call, &g, applied);
    }
    if (call->shape == SUMO__GRAM_STAGED && sumo__all_recv_shared(c, all)) {
        SUMO__LOG(c->tp->log_level, SUMO__LOG_INFO,
                  "rank %d gram combine: every rank's output is shared, combined there",
                  c->tp->rank);
        return run_into_outputs(c, all, sendbuf, recvbuf, call, &g, applied);
    }
    if (call->shape == SUMO__GRAM_DIRECT) return run_direct(c, all, call, &g, applied);
    if (small_everywhere(c, all, call)) return run_small(c, recvbuf, call, &g, applied);
    if (call->shape == SUMO__GRAM_STAGED) return run_staged(c, sendbuf, recvbuf, call, &g, applied);
    return run_messages(c, sendbuf, recvbuf, call, &g, applied);
}

/* ---- as a collective of its own ----------------------------------------------------------- */

sumo_result sumo__gram_collective(sumo_comm *c, sumo__call_desc *d, const void *sendbuf,
                                  void *recvbuf, const sumo__gram_call *call, bool *applied)
{
    *applied = false;
    void *scratch = NULL, *data = NULL;
    d->local_error = sumo__comm_scratch(c, sumo__gram_scratch_bytes(c, call), &scratch);
    if (d->local_error == SUMO_SUCCESS)
        d->local_error = sumo__comm_data_scratch(c, &c->x, sumo__gram_data_bytes(c, call), &data);
    size_t bytes = call->count * sumo__dtype_bytes(call->dtype);
    if (d->local_error == SUMO_SUCCESS)
        d->flags = sumo__shared_flag(c, sendbuf, bytes, recvbuf, bytes);
    const sumo__call_desc *all;
    SUMO__CHECK(sumo__agree(c, d, &all));
    return sumo__gram_run(c, all, sendbuf, recvbuf, call, scratch, data, applied);
}
