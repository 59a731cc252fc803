/*
 * The compressed allreduce (sumo.h's sumo_allreduce_compressed): fp32 in and out, a low-bit
 * payload on the wire (kernels/quantize.h, through the kernel table of the buffers' memory).
 *
 * The input is cut into blocks of block_size elements and the blocks into P segments
 * (slices.h's split of the block count); rank s owns segment s. Every rank quantises its whole
 * input before the agreement, so a NaN or Inf in it is this rank's announced failure and no
 * data moves. Then the owner of each segment dequantises every rank's share of it, adds them
 * in fp32 in rank order (left to right, the reduce kernel's order), divides once by P for an
 * average and quantises the result again; every rank dequantises all the owners' payloads
 * into its output. Every rank therefore decodes the same bytes: the same bits everywhere.
 *
 * Two algorithms, one result:
 *   direct (ranks that share an address space, the shared-memory choice): the payloads stay
 *     in each rank's scratch and the owners read them where they lie (the table's kernels on
 *     the peers' buffers); two barriers;
 *   messages (every other transport): an exchange of segments in P - 1 pairwise rounds
 *     (round k: to rank me + k, from rank me - k), then a ring allgather of the owners'
 *     payloads. The payload must be memory the transport carries (host, or one it names).
 *
 * A composite call, so that it queues like any collective (sumo_allreduce_compressed_start)
 * and runs with the handle held; it announces itself (SUMO__CALL_COMPRESSED, the format and
 * block size in aux) so that ranks calling it differently fail with SUMO_ERR_MISMATCH.
 */
#include "collectives/requests.h"
#include "collectives/p2p_algos.h"
#include "collectives/slices.h"
#include "kernels/quantize.h"

#include <string.h>

typedef struct compressed_args {
    const float *sendbuf;
    float *recvbuf;
    size_t count;
    sumo_compression o;
    bool options_ok; /* the caller's options had this library's struct_size */
} compressed_args;

_Static_assert(sizeof(compressed_args) <= SUMO__CALL_ARGS_BYTES, "compressed_args fits a call");

static const char *options_problem(const sumo_compression *o)
{
    sumo__qformat q;
    if (o->format == SUMO_COMPRESS_NONE || !sumo__qformat_of(o->format, &q))
        return "format must be SUMO_COMPRESS_BF16, SUMO_COMPRESS_FP8_E4M3 or SUMO_COMPRESS_E3M0";
    if (!sumo__qblock_valid(o->block_size)) return "block_size must be a multiple of 8 in [8, 65536]";
    if (o->op != SUMO_OP_SUM && o->op != SUMO_OP_AVERAGE) return "op must be SUMO_OP_SUM or SUMO_OP_AVERAGE";
    return NULL;
}

sumo_result sumo_compressed_bytes(const sumo_compression *options, size_t count, size_t *bytes)
{
    if (options == NULL || bytes == NULL ||
        SUMO__STRUCT_SIZE_PROBLEM(options, sumo_compression, NULL, 0) != NULL ||
        options_problem(options) != NULL)
        return SUMO_ERR_INVALID_ARGUMENT;
    sumo__qformat q;
    sumo__qformat_of(options->format, &q);
    size_t nb = count / options->block_size + (count % options->block_size != 0);
    if (sumo__mul_overflows(nb, sumo__qblock_bytes(&q, options->block_size), bytes))
        return SUMO_ERR_INVALID_ARGUMENT;
    return SUMO_SUCCESS;
}

/* Everything one call needs once validated. */
typedef struct plan {
    sumo__qformat q;
    sumo_compression_format format;
    size_t block, bb;   /* elements and payload bytes of a block */
    size_t n, nb;       /* elements, blocks */
    int P, me;
    bool direct;
    unsigned char *qin;   /* this rank's quantised input (nb blocks) */
    unsigned char *qout;  /* direct: the owners' results, in place of every segment (nb blocks);
                             messages: the gathered results */
    unsigned char *slots; /* messages: P received shares of this rank's segment */
    float *acc, *tmp;     /* the owner's fp32 sum and the share being added */
    size_t slot_bytes;
} plan;

static size_t seg_block(const plan *p, int s) { return sumo__seg_off(p->nb, p->P, s); }
static size_t seg_blocks(const plan *p, int s) { return seg_block(p, s + 1) - seg_block(p, s); }
/* Elements of segment s (the last block of the buffer may be short). */
static size_t seg_elems(const plan *p, int s)
{
    size_t lo = seg_block(p, s) * p->block, hi = SUMO__MIN(seg_block(p, s + 1) * p->block, p->n);
    return hi > lo ? hi - lo : 0;
}

static size_t round64(size_t b) { return (b + 63) / 64 * 64; }

/* Scratch for the plan in the table's memory; false (and why) when it overflows. */
static sumo_result carve(sumo_comm *c, const sumo__exec *x, plan *p)
{
    size_t payload = p->nb * p->bb, seg_max = (p->nb + (size_t)p->P - 1) / (size_t)p->P;
    size_t acc_bytes = round64(seg_max * p->block * sizeof(float));
    p->slot_bytes = round64(seg_max * p->bb);
    size_t bytes = 2 * round64(payload) + 2 * acc_bytes + (p->direct ? 0 : (size_t)p->P * p->slot_bytes);
    void *s;
    SUMO__CHECK(sumo__comm_data_scratch(c, x, bytes, &s));
    unsigned char *at = s;
    p->qin = at;
    at += round64(payload);
    p->qout = at;
    at += round64(payload);
    p->acc = (float *)(void *)at;
    at += acc_bytes;
    p->tmp = (float *)(void *)at;
    at += acc_bytes;
    p->slots = p->direct ? NULL : at;
    return SUMO_SUCCESS;
}

/* The owner's part: rank r's share of segment `me` is at share(r); their fp32 sum in rank
 * order, divided once for an average, quantised into out. */
static sumo_result owner_sum(sumo_comm *c, const sumo__exec *x, const plan *p, sumo_op op,
                             const unsigned char *const *share, unsigned char *out)
{
    size_t ne = seg_elems(p, p->me), first;
    if (ne == 0) return SUMO_SUCCESS;
    for (int r = 0; r < p->P; r++) {
        SUMO__KCHECK(c, sumo__k_dequantize(x, p->format, p->block, r ? p->tmp : p->acc, share[r], ne));
        if (r) SUMO__KCHECK(c, sumo__k_add(x, SUMO_FLOAT32, p->acc, p->acc, p->tmp, ne));
    }
    if (op == SUMO_OP_AVERAGE) SUMO__KCHECK(c, sumo__k_divide(x, SUMO_FLOAT32, p->acc, p->acc, ne, p->P));
    /* A sum that overflowed is coded as a NaN block: every rank finds it in its output. */
    SUMO__KCHECK(c, sumo__k_quantize(x, p->format, p->block, out, p->acc, ne, &first));
    return SUMO_SUCCESS;
}

static sumo_result run_direct(sumo_comm *c, const sumo__exec *x, const plan *p, sumo_op op,
                              const sumo__call_desc *all, float *recvbuf)
{
    sumo__transport *tp = c->tp;
    const unsigned char **share;
    void *meta;
    SUMO__CHECK(sumo__comm_scratch(c, 2 * sizeof(void *) * (size_t)p->P, &meta));
    share = meta;
    const unsigned char **owner = share + p->P;
    size_t b0 = seg_block(p, p->me) * p->bb;
    for (int r = 0; r < p->P; r++) {
        share[r] = (const unsigned char *)tp->ops->peer_buffer(tp, r, all[r].sendptr) + b0;
        owner[r] = tp->ops->peer_buffer(tp, r, all[r].recvptr);
    }
    SUMO__CHECK(owner_sum(c, x, p, op, share, p->qout + b0));
    SUMO__CHECK(tp->ops->barrier(tp));
    for (int s = 0; s < p->P; s++) {
        size_t bs = seg_block(p, s);
        SUMO__KCHECK(c, sumo__k_dequantize(x, p->format, p->block, recvbuf + bs * p->block,
                                           owner[s] + bs * p->bb, seg_elems(p, s)));
    }
    /* No rank leaves (and may reuse its scratch) while a peer still reads its payloads. */
    return tp->ops->barrier(tp);
}

static sumo_result run_messages(sumo_comm *c, const sumo__exec *x, const plan *p, sumo_op op,
                                float *recvbuf)
{
    sumo__transport *tp = c->tp;
    const unsigned char **share;
    void *meta;
    SUMO__CHECK(sumo__comm_scratch(c, sizeof(void *) * (size_t)p->P, &meta));
    share = meta;
    int P = p->P, me = p->me;
    for (int k = 1; k < P; k++) {
        int dst = (me + k) % P, src = (me - k + P) % P;
        SUMO__CHECK(tp->ops->sendrecv(tp, p->qin + seg_block(p, dst) * p->bb,
                                      seg_blocks(p, dst) * p->bb, dst,
                                      p->slots + (size_t)src * p->slot_bytes,
                                      seg_blocks(p, me) * p->bb, src));
    }
    for (int r = 0; r < P; r++)
        share[r] = r == me ? p->qin + seg_block(p, me) * p->bb : p->slots + (size_t)r * p->slot_bytes;
    SUMO__CHECK(owner_sum(c, x, p, op, share, p->qout + seg_block(p, me) * p->bb));
    SUMO__CHECK(sumo__ring_pass_segments(tp, p->qout, p->bb, p->nb, me));
    SUMO__KCHECK(c, sumo__k_dequantize(x, p->format, p->block, recvbuf, p->qout, p->n));
    return SUMO_SUCCESS;
}

/* This rank's checks; records why and returns the code to announce. */
static sumo_result validate(sumo_comm *c, const compressed_args *a, sumo__exec *x, plan *p)
{
    sumo__transport *tp = c->tp;
    const sumo_compression *o = &a->o;
    const char *why = a->options_ok ? options_problem(o) : NULL;
    if (!a->options_ok)
        return SUMO__COMM_FAIL(c, SUMO_ERR_INVALID_ARGUMENT,
                               "allreduce_compressed: NULL options, or a struct_size other than "
                               "this library's sizeof(sumo_compression)");
    if (why) return SUMO__COMM_FAIL(c, SUMO_ERR_INVALID_ARGUMENT, "allreduce_compressed: %s", why);
    size_t bytes;
    if (sumo__mul_overflows(a->count, sizeof(float), &bytes) ||
        sumo_compressed_bytes(o, a->count, &bytes) != SUMO_SUCCESS)
        return SUMO__COMM_FAIL(c, SUMO_ERR_INVALID_ARGUMENT, "allreduce_compressed: count %zu overflows",
                               a->count);
    bytes = a->count * sizeof(float);
    if (bytes && (a->sendbuf == NULL || a->recvbuf == NULL))
        return SUMO__COMM_FAIL(c, SUMO_ERR_INVALID_ARGUMENT,
                               "allreduce_compressed: NULL buffer with count %zu", a->count);
    if ((const void *)a->sendbuf != (const void *)a->recvbuf &&
        sumo__ranges_overlap(a->sendbuf, bytes, a->recvbuf, bytes))
        return SUMO__COMM_FAIL(c, SUMO_ERR_INVALID_ARGUMENT,
                               "allreduce_compressed: send and receive buffers overlap without "
                               "being the same pointer");
    const sumo_kernel_table *ks = bytes ? sumo__kernels_for(c, a->sendbuf, bytes) : NULL;
    const sumo_kernel_table *kr = bytes ? sumo__kernels_for(c, a->recvbuf, bytes) : NULL;
    if (ks != kr)
        return SUMO__COMM_FAIL(c, SUMO_ERR_INVALID_ARGUMENT,
                               "allreduce_compressed: the send buffer is %s memory and the receive "
                               "buffer %s memory; pass buffers of one memory",
                               ks->memory, kr->memory);
    x->k = kr ? kr : sumo__host_kernels();
    x->stream = NULL;
    sumo__qformat_of(o->format, &p->q);
    p->format = o->format;
    p->block = o->block_size;
    p->bb = sumo__qblock_bytes(&p->q, p->block);
    p->n = a->count;
    p->nb = a->count / p->block + (a->count % p->block != 0);
    p->P = tp->size;
    p->me = tp->rank;
    p->direct = sumo__comm_direct(c);
    if (!p->direct && x->k != sumo__host_kernels() &&
        !(tp->ops->carries && tp->ops->carries(tp, x->k->memory)))
        return SUMO__COMM_FAIL(c, SUMO_ERR_INVALID_USAGE,
                               "allreduce_compressed: the %s transport cannot move %s memory",
                               tp->ops->name, x->k->memory);
    return SUMO_SUCCESS;
}

static sumo_result run(sumo_comm *c, void *args)
{
    const compressed_args *a = args;
    sumo__exec x = sumo__host_exec();
    plan p = {0};
    sumo_result local = validate(c, a, &x, &p);
    c->x = x;
    uint64_t aux = a->options_ok
                       ? sumo__fnv1a(sumo__fnv1a(SUMO__FNV_OFFSET, &a->o.format, sizeof a->o.format),
                                     &a->o.block_size, sizeof a->o.block_size)
                       : 0;
    sumo__call_desc d = {.kind = SUMO__CALL_COMPRESSED, .dtype = SUMO_FLOAT32,
                         .op = a->options_ok ? a->o.op : 0, .count = a->count, .aux = aux,
                         .memory = (uint32_t)sumo__fnv1a(SUMO__FNV_OFFSET, x.k->memory,
                                                         strlen(x.k->memory))};
    if (local == SUMO_SUCCESS) local = carve(c, &x, &p);
    if (local == SUMO_SUCCESS) {
        /* Before the agreement: a non-finite input is announced, and nothing moves. */
        size_t first;
        sumo_result q = sumo__k_quantize(&x, p.format, p.block, p.qin, a->sendbuf, p.n, &first);
        if (q != SUMO_SUCCESS)
            local = SUMO__FAIL_TOGETHER(c->tp, q, "allreduce_compressed: the %s kernels' quantize failed",
                                        x.k->memory);
        else if (first != SIZE_MAX)
            local = SUMO__FAIL_TOGETHER(c->tp, SUMO_ERR_NONFINITE,
                                        "allreduce_compressed: input element %zu of rank %d is NaN "
                                        "or Inf (refused before any data moved)",
                                        first, c->tp->rank);
    }
    d.local_error = (uint32_t)local;
    d.sendptr = (uintptr_t)p.qin;
    d.recvptr = (uintptr_t)p.qout;
    const sumo__call_desc *all;
    SUMO__CHECK(sumo__agree(c, &d, &all));
    SUMO__LOG(c->tp->log_level, SUMO__LOG_INFO, "rank %d allreduce_compressed count %zu format %d "
              "block %zu %s", p.me, p.n, (int)p.format, p.block, p.direct ? "direct" : "messages");
    sumo_op op = a->o.op;
    SUMO__CHECK(p.direct ? run_direct(c, &x, &p, op, all, a->recvbuf)
                         : run_messages(c, &x, &p, op, a->recvbuf));
    /* Every rank decoded the same bytes, so every rank reaches the same verdict. */
    size_t bad;
    SUMO__KCHECK(c, sumo__k_first_nonfinite(&x, SUMO_FLOAT32, a->recvbuf, p.n, &bad));
    if (bad != SIZE_MAX)
        return SUMO__FAIL_TOGETHER(c->tp, SUMO_ERR_NONFINITE,
                                   "allreduce_compressed: element %zu of the result is NaN (the "
                                   "fp32 sum of its block overflowed)",
                                   bad);
    return SUMO_SUCCESS;
}

static sumo__call make_call(const float *sendbuf, float *recvbuf, size_t count,
                            const sumo_compression *options)
{
    compressed_args a = {.sendbuf = sendbuf, .recvbuf = recvbuf, .count = count};
    a.options_ok = options != NULL && SUMO__STRUCT_SIZE_PROBLEM(options, sumo_compression, NULL, 0) == NULL;
    if (a.options_ok) a.o = *options;
    return sumo__composite(run, &a, sizeof a);
}

sumo_result sumo_allreduce_compressed(const float *sendbuf, float *recvbuf, size_t count,
                                      const sumo_compression *options, sumo_comm *comm)
{
    if (comm == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    sumo__call call = make_call(sendbuf, recvbuf, count, options);
    return sumo__submit(comm, &call, NULL);
}

sumo_result sumo_allreduce_compressed_start(const float *sendbuf, float *recvbuf, size_t count,
                                            const sumo_compression *options, sumo_comm *comm,
                                            sumo_request **request)
{
    if (comm == NULL || request == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    sumo__call call = make_call(sendbuf, recvbuf, count, options);
    return sumo__submit(comm, &call, request);
}
