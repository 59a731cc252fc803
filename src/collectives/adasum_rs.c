/*
 * Adasum as a reduce-scatter: sumo_reduce_scatter with an Adasum op, for sharded training
 * (FSDP2, ZeRO), where each rank holds its full local gradient before the call and only its
 * shard of the combined gradient after it.
 *
 * The layout is FSDP2's. The op's layout lists the tensors' padded counts n_t, each a multiple
 * of P (FSDP2 pads every tensor to one, with zeros), summing to P * recvcount. The send buffer
 * is viewed as (P, recvcount): row r is chunk r of every tensor in order, n_t / P elements of
 * tensor t, and the output (rank r's recvcount elements) is row r of the result. The tensor
 * each element belongs to is therefore known in every row, and every Gram entry of a tensor
 * is a sum over the rows: G_ij(t) = sum_r <row r of g_i, row r of g_j> restricted to t.
 *
 * The call, on each rank r:
 *   1. the exchange: rank r receives row r of every rank's input, an all-to-all (the bytes of
 *      a ring reduce-scatter: (P-1)/P of the input sent and received). Ranks that reach each
 *      other's buffers (threads, or buffers shared by a kernel table) read the rows in place
 *      instead, through the call's kernel table;
 *   2. the partial Gram entries of those rows, per tensor, accumulated in double (the kernel
 *      the Gram-form allreduce uses);
 *   3. one sum of T x P(P+1)/2 doubles by recursive doubling: the same bits on every rank;
 *   4. the weights of sumo's Adasum tree (docs/design/adasum.md) from each tensor's summed
 *      Gram matrix, in plain double arithmetic in a fixed order: the same bits on every rank;
 *   5. row r of sum_i w_i g_i, written into the output, in rank order i per element.
 * Bytes: a reduce-scatter's. Scratch: P rows (the received rows, and the tree's nodes).
 *
 * Accuracy, as the allreduce's. Where the Gram bits flag a tensor (its inputs cancel, so a
 * node's norm as a quadratic form has too few correct digits: adasum_gram.h), and always for
 * fp64, every rank alike runs the tree instead, sharded: level by level, each pair's partial
 * (dot, |L|^2, |R|^2) per tensor on this rank's row of the nodes, one sum of 3 doubles per
 * pair and tensor over all ranks, and the update of the row (the allreduce tree's kernels and
 * coefficients). So the result is within the Gram form's bound of the tree where it is
 * accepted, and the tree's own result, up to the order of its sums, elsewhere. Bits: every
 * rank computes the same weights (or coefficients), and an element's value depends only on
 * the P inputs at that element and those, so a shard is the same whichever data path (in place
 * or over messages) computes it.
 *
 * How the small sum grows with P: T x P(P+1)/2 doubles, P(P+1)/2 per tensor. At P = 16 that is
 * 136 doubles (1 KiB) per tensor; at P = 512 it is 131328 (1 MiB) per tensor, 100 MiB for a
 * model of 100 tensors: more than a small model's gradient, and the sum would cost more than
 * the exchange. So the form is refused beyond SUMO__ADASUM_RS_MAX_RANKS = 16 ranks (also the
 * partials kernel's limit), with SUMO_ERR_INVALID_USAGE naming the limit. The tree over the
 * rows (the fallback below) needs much less: each level's pairs need three values per tensor,
 * about 3T P values in all over log2 P dependent sums with a pass over the rows between them;
 * it is the shape for larger P (running it alone there, with the per-rank arrays sized by P,
 * is what lifting the limit takes).
 *
 * Refused by name, alike on every rank (the checks are local and the agreement spreads them):
 * a hierarchical op, a layout whose counts do not add up to P * recvcount or a tensor whose
 * count is not a multiple of P (SUMO_ERR_INVALID_ARGUMENT), a two-level communicator
 * (execute.c), more than 16 ranks; layouts that differ between ranks fail the agreement
 * (SUMO_ERR_MISMATCH). A tensor with NaN or Inf gets NaN weights (its shards are NaN on every
 * rank, the other tensors exact) and SUMO_ERR_NONFINITE naming it.
 */
#include "collectives/adasum_rs.h"
#include "collectives/adasum.h"
#include "collectives/adasum_gram.h"
#include "collectives/gram.h"
#include "collectives/p2p_algos.h"

#include <math.h>
#include <string.h>

_Static_assert(SUMO__ADASUM_RS_MAX_RANKS <= SUMO__GRAM_MAX_IN, "the partials kernel takes every rank");

static size_t align64(size_t v) { return (v + 63) / 64 * 64; }

/* Host scratch, in this order: the row's tensor offsets, the Gram partials and the incoming
 * half of the recursive doubling, the weights, the weights' work and per-tensor flags. */
typedef struct rs_space {
    size_t *rows;
    double *gram, *incoming, *w, *work;
    unsigned char *flags;
} rs_space;

static size_t rs_layout(int P, size_t T, unsigned char *base, rs_space *s)
{
    size_t L = sumo__gram_len(P);
    size_t rows = 0, gram = align64(rows + (T + 1) * sizeof(size_t));
    size_t incoming = align64(gram + T * L * sizeof(double));
    size_t w = align64(incoming + T * L * sizeof(double));
    size_t work = align64(w + T * (size_t)P * sizeof(double));
    size_t flags = align64(work + sumo__adasum_gram_work_len(P) * sizeof(double));
    size_t end = flags + T;
    if (s) {
        *s = (rs_space){.rows = (size_t *)(void *)(base + rows),
                        .gram = (double *)(void *)(base + gram),
                        .incoming = (double *)(void *)(base + incoming),
                        .w = (double *)(void *)(base + w),
                        .work = (double *)(void *)(base + work),
                        .flags = base + flags};
    }
    return end;
}

/* Local checks of the op and the counts; the row's tensor offsets into rows (T + 1). */
static sumo_result rs_check(sumo_comm *c, const size_t *off, size_t T, int g, size_t n)
{
    sumo__transport *tp = c->tp;
    int P = tp->size;
    if (g > 1)
        return SUMO__FAIL(tp, SUMO_ERR_INVALID_ARGUMENT,
                          "reduce_scatter: the Adasum op is hierarchical (groups of %d ranks); "
                          "the reduce-scatter form combines flat", g);
    if (P > SUMO__ADASUM_RS_MAX_RANKS)
        return SUMO__FAIL(tp, SUMO_ERR_INVALID_USAGE,
                          "reduce_scatter: Adasum over %d ranks, at most %d (its Gram entries "
                          "are P(P+1)/2 = %zu doubles per tensor)",
                          P, SUMO__ADASUM_RS_MAX_RANKS, sumo__gram_len(P));
    /* Bounded so that the Gram scratch's size arithmetic is far from overflow. */
    if (T > ((size_t)1 << 32))
        return SUMO__FAIL(tp, SUMO_ERR_INVALID_ARGUMENT, "reduce_scatter: %zu tensors is too many", T);
    if (T == 0) return SUMO_SUCCESS;
    for (size_t t = 0; t < T; t++) {
        size_t nt = off[t + 1] - off[t];
        if (nt % (size_t)P != 0)
            return SUMO__FAIL(tp, SUMO_ERR_INVALID_ARGUMENT,
                              "reduce_scatter: the Adasum op's tensor %zu holds %zu elements, not "
                              "a multiple of the %d ranks (pad each tensor to one, as FSDP2 does)",
                              t, nt, P);
    }
    size_t total;
    if (sumo__mul_overflows(n, (size_t)P, &total) || off[T] != total)
        return SUMO__FAIL(tp, SUMO_ERR_INVALID_ARGUMENT,
                          "reduce_scatter: the Adasum op's %zu tensors hold %zu elements, but the "
                          "send buffer holds %d ranks x recvcount %zu",
                          T, off[T], P, n);
    return SUMO_SUCCESS;
}

/* The tree's coefficients from a pair's summed (dot, |L|^2, |R|^2); NaN when not finite. */
static bool coefficients(const double s[3], double *cl, double *cr)
{
    if (!isfinite(s[0]) || !isfinite(s[1]) || !isfinite(s[2])) {
        *cl = *cr = NAN;
        return false;
    }
    *cl = s[1] < SUMO__ADASUM_TINY_NORM_SQ ? 1.0 : 1.0 - s[0] / (2.0 * s[1]);
    *cr = s[2] < SUMO__ADASUM_TINY_NORM_SQ ? 1.0 : 1.0 - s[0] / (2.0 * s[2]);
    return true;
}

/* The rows of every node of the tree on this rank (rank k's leaf at row k), and a level's
 * sums' host scratch (3 doubles per pair and tensor, twice). */
typedef struct rs_tree {
    sumo_comm *c;
    sumo_dtype dtype;
    unsigned char *nodes;
    size_t n, esz, nt;
    const size_t *rows;
    double *sums, *incoming;
    size_t bad;
} rs_tree;

/* One level: every pair's partial triples per tensor on this row, summed over all ranks (the
 * same bits everywhere), then left = cl left + cr right on the row. */
static sumo_result tree_level(rs_tree *tr, const int *left, const int *right, int npairs)
{
    sumo_comm *c = tr->c;
    size_t esz = tr->esz, nt = tr->nt;
    if (npairs == 0) return SUMO_SUCCESS;
    for (int p = 0; p < npairs; p++) {
        const unsigned char *L = tr->nodes + (size_t)left[p] * tr->n * esz;
        const unsigned char *R = tr->nodes + (size_t)right[p] * tr->n * esz;
        for (size_t t = 0; t < nt; t++) {
            double *s3 = tr->sums + ((size_t)p * nt + t) * 3;
            size_t lo = tr->rows[t], len = tr->rows[t + 1] - lo;
            s3[0] = s3[1] = s3[2] = 0;
            if (len)
                SUMO__KCHECK(c, sumo__k_dot_norms(&c->x, tr->dtype, L + lo * esz, R + lo * esz,
                                                  len, s3));
        }
    }
    sumo__rd_group everyone = {.members = c->tp->size, .me = c->tp->rank};
    const sumo__exec host = sumo__host_exec();
    SUMO__CHECK(sumo__rd_sum(c, &everyone, &host, SUMO_FLOAT64, tr->sums, tr->incoming,
                             (size_t)npairs * nt * 3));
    for (int p = 0; p < npairs; p++) {
        unsigned char *L = tr->nodes + (size_t)left[p] * tr->n * esz;
        const unsigned char *R = tr->nodes + (size_t)right[p] * tr->n * esz;
        for (size_t t = 0; t < nt; t++) {
            double cl, cr;
            size_t lo = tr->rows[t];
            if (!coefficients(tr->sums + ((size_t)p * nt + t) * 3, &cl, &cr) && tr->bad == SIZE_MAX)
                tr->bad = t;
            SUMO__KCHECK(c, sumo__k_scaled_add(&c->x, tr->dtype, L + lo * esz, cl, R + lo * esz,
                                               cr, tr->rows[t + 1] - lo));
        }
    }
    return SUMO_SUCCESS;
}

/* The tree of docs/design/adasum.md over the nodes' rows: the fold of the first 2R ranks into
 * pairs, then the balanced tree in order; the root (row 0) into out. */
static sumo_result tree_run(rs_tree *tr, void *out)
{
    int P = tr->c->tp->size, P2 = 1;
    while (P2 * 2 <= P) P2 *= 2;
    int R = P - P2, left[SUMO__ADASUM_RS_MAX_RANKS], right[SUMO__ADASUM_RS_MAX_RANKS];
    int w[SUMO__ADASUM_RS_MAX_RANKS];
    for (int i = 0; i < R; i++) left[i] = 2 * i, right[i] = 2 * i + 1;
    SUMO__CHECK(tree_level(tr, left, right, R));
    for (int i = 0; i < P2; i++) w[i] = i < R ? 2 * i : i + R;
    for (int span = 1; span < P2; span *= 2) {
        int np = 0;
        for (int i = 0; i + span < P2; i += 2 * span) left[np] = w[i], right[np++] = w[i + span];
        SUMO__CHECK(tree_level(tr, left, right, np));
    }
    SUMO__KCHECK(tr->c, sumo__k_copy(&tr->c->x, out, tr->nodes, tr->n * tr->esz));
    return SUMO_SUCCESS;
}

sumo_result sumo__reduce_scatter_adasum(sumo_comm *c, sumo__call_desc *d, const sumo__op_entry *op,
                                        const void *sendbuf, void *recvbuf)
{
    sumo__transport *tp = c->tp;
    int P = tp->size, me = tp->rank;
    size_t n = d->count, esz = sumo__dtype_bytes((sumo_dtype)d->dtype);
    sumo_dtype dtype = (sumo_dtype)d->dtype;
    const size_t *off;
    size_t T;
    int g;
    uint64_t hash;
    sumo__adasum_op_layout(op, &off, &T, &g, &hash);
    d->aux = hash;
    d->local_error = rs_check(c, off, T, g, n);
    size_t nt = T ? T : 1;
    bool direct = P > 1 && sumo__call_direct(c);
    void *scratch = NULL, *data = NULL;
    if (d->local_error == SUMO_SUCCESS)
        d->local_error = sumo__comm_scratch(c, rs_layout(P, nt, NULL, NULL), &scratch);
    if (d->local_error == SUMO_SUCCESS && P > 1)
        d->local_error = sumo__comm_data_scratch(c, &c->x, (size_t)P * n * esz, &data);
    if (d->local_error == SUMO_SUCCESS)
        d->flags = sumo__shared_flag(c, sendbuf, (size_t)P * n * esz, recvbuf, n * esz);
    SUMO__LOG(tp->log_level, SUMO__LOG_INFO,
              "rank %d reduce_scatter recvcount %zu %s adasum: %zu tensors, %s", me, n,
              sumo_dtype_name(dtype), nt, direct ? "direct" : "all-to-all");
    const sumo__call_desc *all;
    SUMO__CHECK(sumo__agree(c, d, &all));
    rs_space s;
    rs_layout(P, nt, scratch, &s);
    s.rows[0] = 0;
    for (size_t t = 0; t < nt; t++)
        s.rows[t + 1] = s.rows[t] + (T ? (off[t + 1] - off[t]) / (size_t)P : n);
    /* in[k]: row `me` of rank k's input. */
    const void *in[SUMO__ADASUM_RS_MAX_RANKS];
    const unsigned char *mine = (const unsigned char *)sendbuf + (size_t)me * n * esz;
    unsigned char *nodes = data;
    if (direct) {
        for (int k = 0; k < P; k++) {
            void *peer;
            SUMO__CHECK(sumo__peer_buffer(c, all, k, false, &peer));
            in[k] = (const unsigned char *)peer + (size_t)me * n * esz;
        }
    } else {
        /* Round k: row dst of ours to dst = me + k, row me of src = me - k's into node src. */
        for (int k = 1; k < P; k++) {
            int dst = (me + k) % P, src = (me - k + P) % P;
            SUMO__CHECK(tp->ops->sendrecv(tp, (const unsigned char *)sendbuf + (size_t)dst * n * esz,
                                          n * esz, dst, nodes + (size_t)src * n * esz, n * esz,
                                          src));
        }
        for (int k = 0; k < P; k++)
            in[k] = k == me ? (const void *)mine : nodes + (size_t)k * n * esz;
    }
    size_t L = sumo__gram_len(P), bad = SIZE_MAX;
    /* fp64 takes the tree, as the allreduce does: its tolerance is below what the quadratic
     * forms deliver on inputs that cancel even mildly. */
    bool gram = dtype != SUMO_FLOAT64 || P == 1, accept = false;
    if (gram) {
        memset(s.gram, 0, nt * L * sizeof *s.gram);
        SUMO__KCHECK(c, sumo__k_gram_partials(&c->x, dtype, in, P, s.rows, nt, 0, n, s.gram));
        sumo__rd_group everyone = {.members = P, .me = me};
        const sumo__exec host = sumo__host_exec();
        SUMO__CHECK(sumo__rd_sum(c, &everyone, &host, SUMO_FLOAT64, s.gram, s.incoming, nt * L));
        sumo__adasum_gram_params params = {.nranks = P, .group_size = 1,
                                           .need = sumo__adasum_need(dtype)};
        bad = sumo__adasum_gram_weights(&params, s.gram, nt, s.w, s.flags, s.work);
        accept = true;
        for (size_t t = 0; t < nt; t++) accept &= s.flags[t] == 0 || P == 1;
    }
    if (accept) {
        /* In place, the output is this rank's row of the input: the kernel reads each element
         * of every input before writing it. */
        void *outs[1] = {recvbuf};
        SUMO__KCHECK(c, sumo__k_weighted_sum(&c->x, dtype, outs, 1, in, P, s.rows, nt, 0, n, s.w));
    } else {
        /* The Gram bits flagged a tensor (alike on every rank), or fp64: the tree, level by
         * level on the rows, from the untouched inputs. The Gram scratch holds a level's sums
         * (3 per pair and tensor, at most P/2 pairs: no more than P(P+1)/2 for P >= 2). */
        SUMO__LOG(tp->log_level, SUMO__LOG_INFO, "rank %d reduce_scatter adasum: the tree", me);
        for (int k = 0; k < P; k++)
            if (nodes + (size_t)k * n * esz != in[k])
                SUMO__KCHECK(c, sumo__k_copy(&c->x, nodes + (size_t)k * n * esz, in[k], n * esz));
        rs_tree tr = {.c = c, .dtype = dtype, .nodes = nodes, .n = n, .esz = esz, .nt = nt,
                      .rows = s.rows, .sums = s.gram, .incoming = s.incoming, .bad = SIZE_MAX};
        SUMO__CHECK(tree_run(&tr, recvbuf));
        bad = tr.bad;
    }
    /* No rank returns while a peer still reads its input. */
    if (direct) SUMO__CHECK(tp->ops->barrier(tp));
    if (bad != SIZE_MAX)
        return SUMO__FAIL(tp, SUMO_ERR_NONFINITE,
                          "reduce_scatter: Adasum tensor %zu (of %zu) holds NaN or Inf, or its "
                          "squared norm overflows double: its shards are NaN",
                          bad, nt);
    return SUMO_SUCCESS;
}
