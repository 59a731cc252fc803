/*
 * The compressed allreduce (sumo.h's sumo_allreduce_compressed): fp32 in and out, a low-bit
 * payload on the wire (kernels/codec.h, through the kernel table of the buffers' memory).
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
 *   direct (ranks that share an address space, the shared-memory choice, or processes whose
 *     kernel table shares its memory between them): the payloads stay in each rank's scratch
 *     and the owners read them where they lie (the table's kernels on the peers' buffers);
 *     two barriers;
 *   messages (every other transport): an exchange of segments in P - 1 pairwise rounds
 *     (round k: to rank me + k, from rank me - k), then a ring allgather of the owners'
 *     payloads. The payload must be memory the transport carries (host, or one it names).
 *
 * A call kind of its own (SUMO__CALL_COMPRESSED): it queues like any collective
 * (sumo_allreduce_compressed_start), execute.c validates its buffers, their memory and the
 * transport as every collective's, and it announces the format and block size in aux, so that
 * ranks calling it differently fail with SUMO_ERR_MISMATCH.
 */
#include "collectives/compressed.h"
#include "collectives/p2p_algos.h"
#include "collectives/slices.h"
#include "kernels/codec.h"

/* Why these options cannot run, or NULL; why (why_bytes) may receive the sentence. */
static const char *options_problem(const sumo_compression *o, char *why, size_t why_bytes)
{
    if (o == NULL) return "NULL options";
    const char *bad = SUMO__STRUCT_SIZE_PROBLEM(o, sumo_compression, why, why_bytes);
    if (bad != NULL) return bad;
    sumo__qformat q;
    if (o->format == SUMO_COMPRESS_NONE || !sumo__qformat_of(o->format, &q))
        return "format must be SUMO_COMPRESS_BF16, SUMO_COMPRESS_FP8_E4M3 or SUMO_COMPRESS_E3M0";
    if (!sumo__qblock_valid(o->block_size)) return "block_size must be a multiple of 8 in [8, 65536]";
    if (o->op != SUMO_OP_SUM && o->op != SUMO_OP_AVERAGE) return "op must be SUMO_OP_SUM or SUMO_OP_AVERAGE";
    return NULL;
}

sumo_result sumo_compression_default(sumo_compression_format format, sumo_compression *options)
{
    if (options == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *options = (sumo_compression){.struct_size = sizeof *options, .format = format,
                                  .block_size = 128, .op = SUMO_OP_AVERAGE};
    return SUMO_SUCCESS;
}

sumo_result sumo_compressed_bytes(const sumo_compression *options, size_t count, size_t *bytes)
{
    if (bytes == NULL || options_problem(options, NULL, 0) != NULL) return SUMO_ERR_INVALID_ARGUMENT;
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
        void *peer_in, *peer_out;
        SUMO__CHECK(sumo__peer_buffer(c, all, r, false, &peer_in));
        SUMO__CHECK(sumo__peer_buffer(c, all, r, true, &peer_out));
        share[r] = (const unsigned char *)peer_in + b0;
        owner[r] = peer_out;
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

sumo_result sumo__compressed_check(sumo_comm *c, const sumo_compression *options, size_t count)
{
    char why[256];
    const char *bad = options_problem(options, why, sizeof why);
    if (bad) return SUMO__COMM_FAIL(c, SUMO_ERR_INVALID_ARGUMENT, "allreduce_compressed: %s", bad);
    size_t bytes;
    if (sumo_compressed_bytes(options, count, &bytes) != SUMO_SUCCESS)
        return SUMO__COMM_FAIL(c, SUMO_ERR_INVALID_ARGUMENT,
                               "allreduce_compressed: count %zu overflows", count);
    return SUMO_SUCCESS;
}

sumo_result sumo__allreduce_compressed(sumo_comm *c, sumo__call_desc *d,
                                       const sumo_compression *options, const float *sendbuf,
                                       float *recvbuf)
{
    const sumo__exec *x = &c->x;
    plan p = {.format = options->format, .block = options->block_size, .n = d->count,
              .P = c->tp->size, .me = c->tp->rank, .direct = sumo__call_direct(c)};
    sumo__qformat_of(p.format, &p.q);
    p.bb = sumo__qblock_bytes(&p.q, p.block);
    p.nb = p.n / p.block + (p.n % p.block != 0);
    d->op = options->op;
    d->aux = sumo__fnv1a(sumo__fnv1a(SUMO__FNV_OFFSET, &options->format, sizeof options->format),
                         &options->block_size, sizeof options->block_size);
    sumo_result local = carve(c, x, &p);
    if (local == SUMO_SUCCESS) {
        /* Before the agreement: a non-finite input is announced, and nothing moves. */
        size_t first;
        sumo_result q = sumo__k_quantize(x, p.format, p.block, p.qin, sendbuf, p.n, &first);
        if (q != SUMO_SUCCESS)
            local = SUMO__FAIL_TOGETHER(c->tp, q, "allreduce_compressed: the %s kernels' quantize failed",
                                        x->k->memory);
        else if (first != SIZE_MAX)
            local = SUMO__FAIL_TOGETHER(c->tp, SUMO_ERR_NONFINITE,
                                        "allreduce_compressed: input element %zu of rank %d is NaN "
                                        "or Inf (refused before any data moved)",
                                        first, c->tp->rank);
    }
    d->local_error = (uint32_t)local;
    d->sendptr = (uintptr_t)p.qin;
    d->recvptr = (uintptr_t)p.qout;
    /* The payloads the peers read are this rank's scratch: shared between processes where the
     * table shares its memory (the agreement refuses the call unless every rank's is). */
    if (local == SUMO_SUCCESS && sumo__call_imports(c))
        d->flags = sumo__shared_flag(c, p.qin, p.nb * p.bb, p.qout, p.nb * p.bb);
    const sumo__call_desc *all;
    SUMO__CHECK(sumo__agree(c, d, &all));
    SUMO__LOG(c->tp->log_level, SUMO__LOG_INFO, "rank %d allreduce_compressed count %zu format %d "
              "block %zu %s", p.me, p.n, (int)p.format, p.block, p.direct ? "direct" : "messages");
    SUMO__CHECK(p.direct ? run_direct(c, x, &p, options->op, all, recvbuf)
                         : run_messages(c, x, &p, options->op, recvbuf));
    /* Every rank decoded the same bytes, so every rank reaches the same verdict. */
    size_t bad;
    SUMO__KCHECK(c, sumo__k_first_nonfinite(x, SUMO_FLOAT32, recvbuf, p.n, &bad));
    if (bad != SIZE_MAX)
        return SUMO__FAIL_TOGETHER(c->tp, SUMO_ERR_NONFINITE,
                                   "allreduce_compressed: element %zu of the result is NaN (the "
                                   "fp32 sum of its block overflowed)",
                                   bad);
    return SUMO_SUCCESS;
}
