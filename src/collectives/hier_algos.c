/*
 * The two-level communicator's algorithms (hier_algos.h; docs/design/two-level.md).
 *
 * Every rank makes the same level calls in the same order, so the levels' own agreements pair
 * up; a level's failure breaks the parent and aborts every level (sumo__level_run).
 */
#include "collectives/hier_algos.h"
#include "collectives/hier_levels.h"
#include "collectives/slices.h"

#include <string.h>

static sumo_collective level_call(const sumo_comm *c, sumo_collective_kind kind,
                                  const void *sendbuf, void *recvbuf, size_t count,
                                  sumo_dtype dtype, sumo_op op, int root)
{
    return (sumo_collective){.struct_size = sizeof(sumo_collective), .kind = kind,
                             .sendbuf = sendbuf, .recvbuf = recvbuf, .count = count,
                             .dtype = dtype, .op = op, .root = root, .stream = c->x.stream};
}

static sumo_result on_level(sumo_comm *c, sumo_comm *level, sumo_collective call, const char *what)
{
    return sumo__level_run(c, level, &call, what);
}

/* ---- two_level ------------------------------------------------------------------------------ */

/* hier.c's sum and average: each element crosses the nodes once per node. */
static sumo_result two_level(sumo_comm *c, const unsigned char *s, unsigned char *r, size_t count,
                             sumo_dtype dtype, sumo_op op)
{
    const sumo__levels *lv = c->levels;
    sumo_comm *across = sumo__level_across(c);
    size_t esz = sumo__dtype_bytes(dtype);
    size_t L = (size_t)lv->L, m = count / L, body = m * L, mine = (size_t)lv->l * m * esz;
    if (m > 0) {
        /* Slice l of the node's sum into its place in recvbuf (in place: NCCL's form). */
        SUMO__CHECK(on_level(c, lv->node, level_call(c, SUMO_COLLECTIVE_REDUCE_SCATTER, s, r + mine,
                                                     m, dtype, op, 0),
                             "the reduce-scatter inside the node"));
        SUMO__CHECK(on_level(c, across, level_call(c, SUMO_COLLECTIVE_ALLREDUCE, r + mine, r + mine,
                                                   m, dtype, op, 0),
                             "the allreduce across the nodes"));
        SUMO__CHECK(on_level(c, lv->node, level_call(c, SUMO_COLLECTIVE_ALLGATHER, r + mine, r, m,
                                                     dtype, op, 0),
                             "the allgather inside the node"));
    }
    /* The tail (fewer than L elements): whole on every rank, each local rank over its own
     * across communicator (they all compute the same bits from the same node result). */
    if (count - body > 0) {
        SUMO__CHECK(on_level(c, lv->node, level_call(c, SUMO_COLLECTIVE_ALLREDUCE, s + body * esz,
                                                     r + body * esz, count - body, dtype, op, 0),
                             "the allreduce of the tail inside the node"));
        SUMO__CHECK(on_level(c, across, level_call(c, SUMO_COLLECTIVE_ALLREDUCE, r + body * esz,
                                                   r + body * esz, count - body, dtype, op, 0),
                             "the allreduce of the tail across the nodes"));
    }
    return SUMO_SUCCESS;
}

/* ---- chain ---------------------------------------------------------------------------------- */

/* One leader's part of the chain: the node's inputs (ins, L of them) added, in rank order, to
 * the partial from the previous node (none on node 0), chunk by chunk. */
typedef struct chain {
    sumo_comm *c;
    sumo_dtype dt, acc;
    size_t esz, aesz, n, chunk;
    int L, P, divisor;
    bool first, last; /* node 0; node H - 1 */
    const unsigned char **ins;
    const void **in; /* L + 1 pointers: the reduce's inputs */
    unsigned char *slot[3], *conv, *out;
    /* The chunk being computed by the work function, and how far. */
    size_t j, at;
    sumo_result failed;
} chain;

#define CHAIN_SLICE_ELEMS ((size_t)16384)

/* Elements [lo, lo + len) of chunk j: slot = partial + ins[0] + ... + ins[L-1] in the
 * accumulation type, strictly left to right (the reduce kernel's order); on the last node
 * divided once and rounded once into out. Same arithmetic as sumo__ranked_allreduce's one
 * reduce over the P inputs of an element. */
static sumo_result chain_slice(chain *ch, unsigned char *slot, size_t lo, size_t len, size_t off)
{
    const sumo__exec *x = &ch->c->x;
    sumo_comm *c = ch->c;
    unsigned char *acc = slot + off * ch->aesz;
    size_t e = (lo + off) * ch->esz;
    if (ch->acc == ch->dt) {
        /* One reduce over (partial, the node's inputs). */
        const void **in = ch->in;
        int k = 0;
        if (!ch->first) in[k++] = acc;
        for (int i = 0; i < ch->L; i++) in[k++] = ch->ins[i] + e;
        void *dst = ch->last ? (void *)(ch->out + e) : (void *)acc;
        SUMO__KCHECK(c, sumo__k_reduce(x, ch->dt, &dst, 1, in, k, len,
                                       ch->last ? ch->divisor : 1));
        return SUMO_SUCCESS;
    }
    unsigned char *conv = ch->conv + off * ch->aesz;
    for (int i = 0; i < ch->L; i++) {
        if (i == 0 && ch->first) {
            SUMO__KCHECK(c, sumo__k_convert(x, ch->acc, acc, ch->dt, ch->ins[0] + e, len));
            continue;
        }
        SUMO__KCHECK(c, sumo__k_convert(x, ch->acc, conv, ch->dt, ch->ins[i] + e, len));
        SUMO__KCHECK(c, sumo__k_add(x, ch->acc, acc, acc, conv, len));
    }
    if (!ch->last) return SUMO_SUCCESS;
    if (ch->divisor != 1) SUMO__KCHECK(c, sumo__k_divide(x, ch->acc, acc, acc, len, ch->divisor));
    SUMO__KCHECK(c, sumo__k_convert(x, ch->dt, ch->out + e, ch->acc, acc, len));
    return SUMO_SUCCESS;
}

/* sumo__work_fn: the next slice of chunk ch->j (while the neighbours' chunks move). */
static bool chain_work(void *ctx)
{
    chain *ch = ctx;
    size_t lo = ch->j * ch->chunk, len = SUMO__MIN(ch->chunk, ch->n - lo);
    if (ch->at >= len || ch->failed != SUMO_SUCCESS) return false;
    size_t slice = SUMO__MIN(CHAIN_SLICE_ELEMS, len - ch->at);
    ch->failed = chain_slice(ch, ch->slot[ch->j % 3], lo, slice, ch->at);
    ch->at += slice;
    return ch->at < len && ch->failed == SUMO_SUCCESS;
}

/* Elements [*lo, *lo + return value) of chunk j. */
static size_t chunk_span(const chain *ch, size_t j, size_t *lo)
{
    *lo = j * ch->chunk;
    return SUMO__MIN(ch->chunk, ch->n - *lo);
}

/* The leaders' chain over the nodes: node h receives chunk j + 1 from node h - 1 and sends chunk
 * j - 1 to node h + 1 while it adds chunk j.
 *
 * Over two nodes the sum also comes back in the same pipeline (back is true): the last node
 * sends finished chunk j - 1 to node 0 while it adds chunk j, and node 0 receives finished chunk
 * j - 3 in its step j (the step that pairs with the last node's step j - 2), so both directions
 * of the link between them carry n elements at once instead of one after the other (the chain,
 * then a broadcast back). Over more nodes the broadcast follows the chain. */
static sumo_result chain_leaders(chain *ch, int h, int H, bool back)
{
    sumo_comm *c = ch->c;
    sumo__transport *tp = c->tp;
    int L = ch->L, prev = (h - 1) * L, next = (h + 1) * L;
    size_t n = ch->n, nch = (n + ch->chunk - 1) / ch->chunk;
    size_t cb = ch->chunk * ch->aesz, lo, len;
    if (h > 0)
        SUMO__CHECK(tp->ops->sendrecv(tp, NULL, 0, -1, ch->slot[0],
                                      SUMO__MIN(ch->chunk, n) * ch->aesz, prev));
    for (size_t j = 0; j < nch; j++) {
        ch->j = j, ch->at = 0;
        bool send = h < H - 1 && j > 0, recv = h > 0 && j + 1 < nch;
        const void *sbuf = send ? ch->slot[(j + 2) % 3] : NULL;
        size_t sb = send ? cb : 0; /* chunk j - 1 is whole */
        int dst = send ? next : -1, src = recv ? prev : -1;
        void *rbuf = recv ? ch->slot[(j + 1) % 3] : NULL;
        size_t rb = recv ? chunk_span(ch, j + 1, &lo) * ch->aesz : 0;
        if (back && h == H - 1 && j > 0) { /* the finished chunk j - 1 back to node 0 */
            len = chunk_span(ch, j - 1, &lo);
            sbuf = ch->out + lo * ch->esz, sb = len * ch->esz, dst = prev;
        }
        if (back && h == 0 && j >= 3) { /* finished chunk j - 3 from the last node */
            len = chunk_span(ch, j - 3, &lo);
            rbuf = ch->out + lo * ch->esz, rb = len * ch->esz, src = next;
        }
        SUMO__CHECK(sumo__sendrecv_working(tp, sbuf, sb, dst, rbuf, rb, src, chain_work, ch));
        SUMO__CHECK(ch->failed);
    }
    size_t last = nch - 1;
    len = chunk_span(ch, last, &lo);
    if (back && h == H - 1) /* the last finished chunk */
        return tp->ops->sendrecv(tp, ch->out + lo * ch->esz, len * ch->esz, prev, NULL, 0, -1);
    if (h == H - 1) return SUMO_SUCCESS;
    if (!back)
        return tp->ops->sendrecv(tp, ch->slot[last % 3], len * ch->aesz, next, NULL, 0, -1);
    /* Node 0: the last partial out, and the finished chunks not yet received in. */
    for (size_t k = nch >= 3 ? nch - 3 : 0; k < nch; k++) {
        size_t klo, klen = chunk_span(ch, k, &klo);
        bool first = k == (nch >= 3 ? nch - 3 : 0);
        SUMO__CHECK(tp->ops->sendrecv(tp, first ? ch->slot[last % 3] : NULL,
                                      first ? len * ch->aesz : 0, first ? next : -1,
                                      ch->out + klo * ch->esz, klen * ch->esz, next));
    }
    return SUMO_SUCCESS;
}

static sumo_result chain_run(sumo_comm *c, const unsigned char *s, unsigned char *r, size_t n,
                             sumo_dtype dt, sumo_op op)
{
    const sumo__levels *lv = c->levels;
    if (n == 0) return SUMO_SUCCESS;
    chain ch = {.c = c, .dt = dt, .acc = sumo__accumulator_of(dt), .n = n, .L = lv->L,
                .P = lv->L * lv->H, .first = lv->h == 0, .last = lv->h == lv->H - 1, .out = r};
    ch.esz = sumo__dtype_bytes(dt), ch.aesz = sumo__dtype_bytes(ch.acc);
    ch.divisor = sumo__divisor_of(op, ch.P);
    ch.chunk = SUMO__MAX(c->levels->chunk_bytes / ch.aesz, (size_t)1);
    bool leader = lv->l == 0;
    size_t L = (size_t)lv->L, bytes = n * ch.esz;
    /* Scratch: the leader's L - 1 gathered inputs and 4 chunks of the accumulation type (3
     * slots, one conversion); another rank's receive area when it works in place. */
    size_t cb = (ch.chunk * ch.aesz + 63) / 64 * 64, gathered = (bytes + 63) / 64 * 64;
    size_t need = leader ? (L - 1) * gathered + 4 * cb : (s == r ? gathered : 0);
    void *scratch = NULL, *meta = NULL;
    if (need) SUMO__CHECK(sumo__comm_data_scratch(c, &c->x, need, &scratch));
    SUMO__CHECK(sumo__comm_scratch(c, (2 * L + 1) * sizeof(void *), &meta));
    unsigned char *base = scratch;
    ch.ins = meta;
    ch.in = (const void **)meta + L;
    ch.ins[0] = s;
    /* The node's inputs to its local rank 0, one broadcast per other local rank. */
    for (int k = 1; k < lv->L; k++) {
        unsigned char *into = leader ? base + (size_t)(k - 1) * gathered : s == r ? base : r;
        if (leader) ch.ins[k] = into;
        SUMO__CHECK(on_level(c, lv->node, level_call(c, SUMO_COLLECTIVE_BROADCAST, s,
                                                     k == lv->l ? (void *)s : (void *)into, n, dt,
                                                     0, k),
                             "the gather of the inputs inside the node"));
    }
    if (leader) {
        unsigned char *chunks = base + (L - 1) * gathered;
        for (int i = 0; i < 3; i++) ch.slot[i] = chunks + (size_t)i * cb;
        ch.conv = chunks + 3 * cb;
        SUMO__CHECK(chain_leaders(&ch, lv->h, lv->H, lv->H == 2));
        if (lv->H > 2)
            SUMO__CHECK(on_level(c, lv->across[0], level_call(c, SUMO_COLLECTIVE_BROADCAST, r, r, n,
                                                              dt, 0, lv->H - 1),
                                 "the broadcast of the sum across the nodes"));
    }
    return on_level(c, lv->node, level_call(c, SUMO_COLLECTIVE_BROADCAST, r, r, n, dt, 0, 0),
                    "the broadcast of the sum inside the node");
}

/* ---- picking -------------------------------------------------------------------------------- */

static sumo_algorithm pick(const sumo_comm *c)
{
    if (c->algo != SUMO_ALGORITHM_AUTO) return c->algo;
    return c->x.k == sumo__host_kernels() ? SUMO_ALGORITHM_CHAIN : SUMO_ALGORITHM_TWO_LEVEL;
}

/* The allreduce after the agreement, into r (every rank the same bits). */
static sumo_result reduce_into(sumo_comm *c, sumo_algorithm algo, const void *s, void *r,
                               size_t n, sumo_dtype dt, sumo_op op)
{
    if (algo == SUMO_ALGORITHM_CHAIN) return chain_run(c, s, r, n, dt, op);
    return two_level(c, s, r, n, dt, op);
}

/* A forced chain of device memory is refused alike on every rank (the memory is agreed). */
static void check_algo(sumo_comm *c, sumo__call_desc *d, sumo_algorithm algo)
{
    if (algo == SUMO_ALGORITHM_CHAIN && c->x.k != sumo__host_kernels())
        d->local_error = SUMO__COMM_FAIL(c, SUMO_ERR_INVALID_USAGE,
                                         "%s: SUMO_ALGORITHM_CHAIN adds on the host; %s memory "
                                         "takes SUMO_ALGORITHM_TWO_LEVEL",
                                         sumo__call_kind_name(d->kind), c->x.k->memory);
}

sumo_result sumo__hier_allreduce(sumo_comm *c, sumo__call_desc *d, const void *sendbuf,
                                 void *recvbuf)
{
    sumo_algorithm algo = pick(c);
    check_algo(c, d, algo);
    SUMO__LOG(c->tp->log_level, SUMO__LOG_INFO, "rank %d allreduce count %llu two-level algo %d",
              c->tp->rank, (unsigned long long)d->count, (int)algo);
    SUMO__CHECK(sumo__agree(c, d, NULL));
    return reduce_into(c, algo, sendbuf, recvbuf, d->count, (sumo_dtype)d->dtype, (sumo_op)d->op);
}

sumo_result sumo__hier_reduce_scatter(sumo_comm *c, sumo__call_desc *d, const void *sendbuf,
                                      void *recvbuf)
{
    sumo_algorithm algo = pick(c);
    check_algo(c, d, algo);
    sumo_dtype dt = (sumo_dtype)d->dtype;
    size_t bytes = d->count * sumo__dtype_bytes(dt), all = bytes * (size_t)c->tp->size;
    void *whole = NULL;
    const sumo_kernel_table *k = c->x.k;
    if (d->local_error == SUMO_SUCCESS && all > 0) {
        sumo_result r = k->alloc(k->ctx, all, &whole);
        if (r != SUMO_SUCCESS || whole == NULL)
            d->local_error = SUMO__COMM_FAIL(c, SUMO_ERR_SYSTEM, "reduce_scatter: cannot "
                                             "allocate %zu bytes of %s memory", all, k->memory);
    }
    sumo_result r = sumo__agree(c, d, NULL);
    if (r == SUMO_SUCCESS)
        r = reduce_into(c, algo, sendbuf, whole, d->count * (size_t)c->tp->size, dt,
                        (sumo_op)d->op);
    if (r == SUMO_SUCCESS && bytes > 0) {
        r = sumo__k_copy(&c->x, recvbuf, (unsigned char *)whole + (size_t)c->tp->rank * bytes,
                         bytes);
        if (r != SUMO_SUCCESS) r = sumo__kernel_failed(c, r, "reduce_scatter's copy");
    }
    if (whole) {
        k->synchronize(k->ctx, c->x.stream);
        k->release(k->ctx, whole);
    }
    return r;
}

/* ---- broadcast, allgather ------------------------------------------------------------------- */

sumo_result sumo__hier_broadcast(sumo_comm *c, sumo__call_desc *d, const void *sendbuf,
                                 void *recvbuf)
{
    const sumo__levels *lv = c->levels;
    SUMO__CHECK(sumo__agree(c, d, NULL));
    sumo_dtype dt = (sumo_dtype)d->dtype;
    int hr = d->root / lv->L, lr = d->root % lv->L;
    if (lv->h == hr)
        SUMO__CHECK(on_level(c, lv->node, level_call(c, SUMO_COLLECTIVE_BROADCAST, sendbuf, recvbuf,
                                                     d->count, dt, 0, lr),
                             "the broadcast inside the root's node"));
    return on_level(c, sumo__level_across(c),
                    level_call(c, SUMO_COLLECTIVE_BROADCAST, recvbuf, recvbuf, d->count, dt, 0, hr),
                    "the broadcast across the nodes");
}

sumo_result sumo__hier_allgather(sumo_comm *c, sumo__call_desc *d, const void *sendbuf,
                                 void *recvbuf)
{
    const sumo__levels *lv = c->levels;
    SUMO__CHECK(sumo__agree(c, d, NULL));
    sumo_dtype dt = (sumo_dtype)d->dtype;
    size_t block = d->count * (size_t)lv->L;
    unsigned char *mine = (unsigned char *)recvbuf + (size_t)lv->h * block * sumo__dtype_bytes(dt);
    /* Rank order is h * L + l: the node's block is contiguous, and the nodes' blocks follow
     * in node order. */
    SUMO__CHECK(on_level(c, lv->node, level_call(c, SUMO_COLLECTIVE_ALLGATHER, sendbuf, mine,
                                                 d->count, dt, 0, 0),
                         "the allgather inside the node"));
    return on_level(c, sumo__level_across(c),
                    level_call(c, SUMO_COLLECTIVE_ALLGATHER, mine, recvbuf, block, dt, 0, 0),
                    "the allgather across the nodes");
}
