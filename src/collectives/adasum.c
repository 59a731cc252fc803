/*
 * Adasum allreduce (docs/design/adasum.md).
 *
 * The combine, per tensor of the op's layout:
 *     Adasum(a, b) = (1 - a.b / (2|a|^2)) a + (1 - a.b / (2|b|^2)) b,
 * a coefficient being 1 when its squared norm is below sqrt(DBL_MIN) = 2^-511 (so Adasum(a, 0)
 * = a and nothing divides by zero). Dot products and norms accumulate in double for every dtype;
 * the update is sumo__kernel_scaled_add (double for fp32/fp64, fp32 FMA for fp16/bf16), rounded
 * to the dtype after every combine.
 *
 * THE RESULT, for P ranks (every rank gets the same bits; the tree shape is part of it, because
 * Adasum is not associative):
 *   Participants. Flat: u_i = rank i's input, G = P. Hierarchical with group size g (P % g == 0):
 *   G = P / g and u_i = the average of ranks [i*g, (i+1)*g): summed in rank order in the
 *   accumulator type (fp32 for fp16/bf16, else the dtype), divided once by g, rounded once.
 *   Tree. G2 = the largest power of two <= G, R = G - G2. The 2R leading participants first
 *   combine in pairs: w_i = Adasum(u_{2i}, u_{2i+1}) for i < R; the others move up unchanged:
 *   w_i = u_{i+R} for R <= i < G2. Then the balanced binary tree over w_0 .. w_{G2-1} in order:
 *   level 0 combines (w0,w1), (w2,w3), ..., level 1 combines those results pairwise, and so on;
 *   the lower-numbered operand is always the left one. Examples:
 *     G=1: u0.   G=2: A(u0,u1).   G=3: A(A(u0,u1), u2).   G=4: A(A(u0,u1), A(u2,u3)).
 *     G=5: A(A(A(u0,u1), u2), A(u3,u4)).   G=6: A(A(A(u0,u1), A(u2,u3)), A(u4,u5)).
 *     G=7: A(A(A(u0,u1), A(u2,u3)), A(A(u4,u5), u6)).
 *
 * HOW (rank r = grp * g + mem; flat is g = 1, grp = r, mem = 0):
 *   1. Hierarchical: member m of each group gets slice m of its group's average (slice m = part
 *      m of [0, N) cut in g nearly equal parts).
 *   2. Fold, for i < R: member m of group 2i and member m of group 2i+1 run one combine level
 *      on slice m (2i is LEFT); 2i+1 hands its combined half to 2i and waits for the result.
 *   3. Vector-halving distance-doubling over the G2 remaining groups, on slice m: the notes'
 *      algorithm with "rank" read as "group".
 *   4. Every rank gets every finished element, and the status.
 *   A combine level: partners split [lo, hi) in halves; each keeps one half and computes, for
 *   every tensor on it, (dot, |LEFT|^2, |RIGHT|^2) of its data and its partner's. Those 3T
 *   doubles are summed over the block of ranks that together hold all of LEFT and RIGHT (2L
 *   groups x g members) by recursive doubling, folded to a power of two: IEEE addition is
 *   commutative, so both partners of every step hold the same bits and the whole block gets the
 *   same coefficients. Then x = c_own * x + c_other * partner's on the kept half. Every
 *   element's final value is computed by exactly one rank and copied to the others, so all
 *   ranks end bit-identical, whichever of the two data paths below moved the bytes (they
 *   compute the same operations on the same ranges: same bits).
 *
 * Data paths.
 *   Point to point (MPI, or any forced algorithm): partners swap halves with sendrecv, the
 *   allgather runs in exact reverse order, step 1 exchanges slices, step 4 sends them back.
 *   Scratch: the receive area (flat: half the buffer; hierarchical: the g-1 slices of the
 *   group's peers, under one buffer) plus 2 x 3T doubles.
 *   Direct (threads: one address space, the default there): no data goes through the
 *   transport. Partners read each other's buffers after a handshake, step 1 reads the group's
 *   send buffers, the fold's right half is written straight into its survivor's buffer, and
 *   the last level writes each finished chunk into every rank's receive buffer while it is in
 *   cache (no allgather). Scratch: 2 x 3T doubles and 2P pointers. Why it is safe: a rank
 *   writes into another's receive buffer only ranges nobody reads any more (after the last
 *   level's sums, which every survivor reaches only after all its earlier reads, and which
 *   the folded ranks' survivors reach only after the hand-off), and the call ends with a
 *   barrier, so no rank returns while its buffers are still read or written.
 *   Both take the scratch from the handle's kept scratch: nothing is allocated once it is big
 *   enough.
 *
 * NaN and Inf: a tensor whose summed (dot, norms) are not finite gets NaN coefficients, so its
 * result is NaN from that level on while the other tensors are untouched. The last level's sums
 * cover every tensor of every rank and are seen by every rank of step 3, so they all name the
 * same first bad tensor (folded ranks receive it with the result): SUMO_ERR_NONFINITE on every
 * rank. Squared norms that overflow double count as non-finite. With one participant (G = 1)
 * nothing is combined, and a separate pass over the sums checks the same condition.
 *
 * The direct path ends with a barrier, so no rank returns while a peer still reads or writes
 * its buffers; the point-to-point path needs none (its last receives carry the result).
 */
#include "collectives/adasum.h"
#include "collectives/adasum_hier.h"
#include "collectives/agree.h"
#include "collectives/adasum_gram.h"
#include "collectives/gram.h"
#include "collectives/hier_levels.h"
#include "collectives/p2p_algos.h"
#include "collectives/slices.h"
#include "transport/transport_hier.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Ranks and levels are ints; a power of two among them has at most 31 halvings. */
#define MAX_LEVELS 32

typedef struct adasum_op {
    size_t ntensors;  /* 0: the whole buffer is one tensor, whatever the count */
    size_t *offsets;  /* ntensors + 1 prefix sums (NULL when ntensors == 0) */
    int group_size;   /* 1 when flat */
    uint64_t hash;    /* of the layout and the options, compared across ranks */
    /* A two-level communicator's device path: the layout's cut, and this rank's share's op on
     * each across communicator, made at its first call there. */
    sumo__adasum_hier *hier;
    sumo_comm *across[SUMO__MAX_ACROSS];
    sumo_op across_op[SUMO__MAX_ACROSS];
    int nacross;
} adasum_op;

/* ---- ops ---------------------------------------------------------------------------------- */

/* v's bytes as they lie in memory: only ranks of one job compare the hash. */
static uint64_t hash_mix(uint64_t h, uint64_t v) { return sumo__fnv1a(h, &v, sizeof v); }

static uint64_t layout_hash(const size_t *counts, size_t ntensors, int group_size)
{
    uint64_t h = hash_mix(SUMO__FNV_OFFSET, 0x41646173756d31ull); /* "Adasum1" */
    h = hash_mix(h, (uint64_t)ntensors);
    for (size_t t = 0; t < ntensors; t++) h = hash_mix(h, (uint64_t)counts[t]);
    return hash_mix(h, (uint64_t)group_size);
}

static void op_free(void *p)
{
    adasum_op *op = p;
    if (op == NULL) return;
    sumo__adasum_hier_free(op->hier);
    /* The levels are idle: their owner holds its handle, or is being freed. */
    for (int i = 0; i < op->nacross; i++) {
        pthread_mutex_lock(&op->across[i]->exec);
        (void)sumo__op_remove(op->across[i], op->across_op[i]);
        pthread_mutex_unlock(&op->across[i]->exec);
    }
    free(op->offsets);
    free(op);
}

/* Local checks of the options; the group size resolved (1 when flat). */
static sumo_result options_check(sumo_comm *comm, const sumo_adasum_options *o, int *group_size,
                                 size_t *total)
{
    sumo__transport *tp = comm->tp;
    char why[256];
    if (SUMO__STRUCT_SIZE_PROBLEM(o, sumo_adasum_options, why, sizeof why))
        return SUMO__FAIL(tp, SUMO_ERR_INVALID_ARGUMENT, "adasum options: %s", why);
    if (o->ntensors > 0 && o->tensor_counts == NULL)
        return SUMO__FAIL(tp, SUMO_ERR_INVALID_ARGUMENT,
                          "adasum options: %zu tensors but tensor_counts is NULL", o->ntensors);
    /* Bounded so that 3 doubles per tensor (the per-level sums) stay addressable. */
    if (o->ntensors > SIZE_MAX / 64)
        return SUMO__FAIL(tp, SUMO_ERR_INVALID_ARGUMENT, "adasum options: %zu tensors is too many",
                          o->ntensors);
    size_t sum = 0;
    for (size_t t = 0; t < o->ntensors; t++) {
        if (__builtin_add_overflow(sum, o->tensor_counts[t], &sum))
            return SUMO__FAIL(tp, SUMO_ERR_INVALID_ARGUMENT,
                              "adasum options: tensor counts overflow size_t at tensor %zu", t);
    }
    *total = sum;
    *group_size = 1;
    if (!o->hierarchical) return SUMO_SUCCESS;
    int g = o->group_size;
    if (g < 0)
        return SUMO__FAIL(tp, SUMO_ERR_INVALID_ARGUMENT, "adasum options: group_size %d < 0", g);
    if (g == 0) g = tp->node_local_size > 0 ? tp->node_local_size : tp->size;
    /* A two-level communicator's groups are its nodes. */
    if (comm->levels && g != comm->levels->L)
        return SUMO__FAIL(tp, SUMO_ERR_INVALID_ARGUMENT,
                          "adasum options: group_size %d on a two-level communicator, whose "
                          "groups are its nodes of %d ranks (0 or %d)", g, comm->levels->L,
                          comm->levels->L);
    if (g > tp->size || tp->size % g != 0)
        return SUMO__FAIL(tp, SUMO_ERR_INVALID_ARGUMENT,
                          "adasum options: group_size %d does not divide the %d ranks", g,
                          tp->size);
    *group_size = g;
    return SUMO_SUCCESS;
}

sumo_result sumo_adasum_options_default(sumo_adasum_options *options)
{
    if (options == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *options = (sumo_adasum_options){.struct_size = sizeof *options};
    return SUMO_SUCCESS;
}

sumo_result sumo_op_create_adasum(sumo_comm *comm, const sumo_adasum_options *options,
                                  sumo_op *op)
{
    if (comm == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    if (options == NULL || op == NULL)
        return SUMO__COMM_FAIL(comm, SUMO_ERR_INVALID_ARGUMENT,
                               "sumo_op_create_adasum: NULL %s", options == NULL ? "options" : "op");
    int g = 1;
    size_t total = 0;
    SUMO__CHECK(options_check(comm, options, &g, &total));
    adasum_op *a = calloc(1, sizeof *a);
    if (a == NULL) return SUMO__COMM_FAIL(comm, SUMO_ERR_SYSTEM, "sumo_op_create_adasum: out of memory");
    a->ntensors = options->ntensors;
    a->group_size = g;
    a->hash = layout_hash(options->tensor_counts, options->ntensors, g);
    if (a->ntensors > 0) {
        a->offsets = malloc((a->ntensors + 1) * sizeof *a->offsets);
        if (a->offsets == NULL) {
            op_free(a);
            return SUMO__COMM_FAIL(comm, SUMO_ERR_SYSTEM, "sumo_op_create_adasum: out of memory");
        }
        a->offsets[0] = 0;
        for (size_t k = 0; k < a->ntensors; k++)
            a->offsets[k + 1] = a->offsets[k] + options->tensor_counts[k];
    }
    return sumo__op_register(comm, SUMO__OP_ADASUM, a, op_free, op);
}

void sumo__adasum_op_layout(const sumo__op_entry *op, const size_t **offsets, size_t *ntensors,
                            int *group_size, uint64_t *hash)
{
    const adasum_op *a = op->impl;
    *offsets = a ? a->offsets : NULL;
    *ntensors = a ? a->ntensors : 0;
    *group_size = a ? a->group_size : 1;
    *hash = a ? a->hash : layout_hash(NULL, 0, 1);
}

/* ---- one call ---------------------------------------------------------------------------- */

/* Elements per step of the update pass: the chunk just written is still in cache when it is
 * copied on to the other ranks. */
#define UPDATE_CHUNK_BYTES (32 * 1024)

/* Where the update pass also writes its result (direct mode). */
enum { FORWARD_NONE = -1, FORWARD_ALL = -2 };

typedef struct run {
    sumo_comm *c;
    sumo__transport *tp;
    sumo_dtype dtype;
    size_t esz;
    size_t ntensors;          /* >= 1 */
    const size_t *off;        /* ntensors + 1 */
    size_t single[2];         /* the offsets of a one-tensor layout */
    unsigned char *x;         /* the receive buffer: the working vector */
    const unsigned char *src; /* where this rank's data is: sendbuf until the first update */
    unsigned char *y;         /* receive area (point-to-point mode) */
    double *sums, *peer;      /* 3 * ntensors each */
    const void **ins;         /* g pointers (hierarchical average) */
    /* Direct mode (ranks share an address space): every rank's buffers, from the agreement. */
    bool direct;
    bool gram; /* the Gram form first (weigh_adasum) */
    sumo__gram_call gram_call;
    sumo__adasum_gram_params gram_params;
    const unsigned char **send_of;
    unsigned char **recv_of;
    int g, ngroups, grp, mem;
    int g2, rem; /* groups in the power-of-two stage; pairs folded before it */
    size_t bad;  /* first tensor whose result is NaN, or SIZE_MAX */
} run;

/* The groups taking part in one sum of the per-level triples: [first, first + ngroups) in
 * virtual numbering (step 3) or real numbering (the fold), with all g members of each. */
typedef struct block {
    int first, ngroups;
    bool virtual_groups;
} block;

static int real_group(const run *a, int v) { return v < a->rem ? 2 * v : v + a->rem; }

static int block_rank(const run *a, const block *b, int idx)
{
    int grp = b->first + idx / a->g;
    if (b->virtual_groups) grp = real_group(a, grp);
    return grp * a->g + idx % a->g;
}

static size_t slice_off(size_t n, int parts, int s)
{
    return (n / (size_t)parts) * (size_t)s + SUMO__MIN((size_t)s, n % (size_t)parts);
}

/* The first tensor that ends after pos (zero-length tensors at pos are skipped). */
static size_t first_tensor(const run *a, size_t pos)
{
    return sumo__first_tensor(a->off, a->ntensors, pos);
}

/* A pairwise synchronisation: both ranks have reached it (and everything each wrote before is
 * visible to the other). */
static sumo_result handshake(sumo__transport *tp, int peer)
{
    return tp->ops->sendrecv(tp, NULL, 0, peer, NULL, 0, peer);
}

typedef struct block_members {
    const run *a;
    const block *b;
} block_members;

static int block_member_rank(const void *ctx, int member)
{
    const block_members *m = ctx;
    return block_rank(m->a, m->b, member);
}

/* Sums the 3T doubles in a->sums over the block (the collectives' recursive doubling); every
 * rank of it ends with the same bits. */
static sumo_result block_sum(run *a, const block *b, int my_group)
{
    block_members m = {.a = a, .b = b};
    sumo__rd_group group = {.members = b->ngroups * a->g,
                            .me = (my_group - b->first) * a->g + a->mem,
                            .rank_of = block_member_rank,
                            .ctx = &m};
    /* The sums are host metadata, whatever memory the data is in. */
    const sumo__exec host = sumo__host_exec();
    return sumo__rd_sum(a->c, &group, &host, SUMO_FLOAT64, a->sums, a->peer, 3 * a->ntensors);
}

/* False, with NaN coefficients, when the tensor's sums are not finite. */
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

/* Copies x[s, e) into the same place of the receive buffer of `forward` (a rank, or all
 * others). */
static sumo_result forward_range(run *a, size_t s, size_t e, int forward)
{
    size_t esz = a->esz;
    if (forward == FORWARD_NONE || e <= s) return SUMO_SUCCESS;
    for (int q = 0; q < a->tp->size; q++) {
        if (q == a->tp->rank || (forward != FORWARD_ALL && q != forward)) continue;
        SUMO__KCHECK(a->c, sumo__k_copy(&a->c->x, a->recv_of[q] + s * esz, a->x + s * esz,
                                        (e - s) * esz));
    }
    return SUMO_SUCCESS;
}

/* x[s, e) = c_own * (this rank's data) + c_other * theirs, chunk by chunk so that the first
 * copy from the send buffer and the forwarding read what is still in cache. */
static sumo_result update(run *a, size_t s, size_t e, double c_own, const unsigned char *theirs,
                          double c_other, int forward)
{
    size_t esz = a->esz, chunk = UPDATE_CHUNK_BYTES / esz;
    const sumo__exec *x = &a->c->x;
    for (size_t c0 = s; c0 < e; c0 += chunk) {
        size_t len = SUMO__MIN(chunk, e - c0);
        unsigned char *xc = a->x + c0 * esz;
        if (a->src != a->x) SUMO__KCHECK(a->c, sumo__k_copy(x, xc, a->src + c0 * esz, len * esz));
        SUMO__KCHECK(a->c, sumo__k_scaled_add(x, a->dtype, xc, c_own, theirs + (c0 - s) * esz,
                                              c_other, len));
        SUMO__CHECK(forward_range(a, c0, c0 + len, forward));
    }
    return SUMO_SUCCESS;
}

/*
 * One combine level on [*lo, *hi) with the partner rank `peer`: this rank is LEFT when `left`.
 * Leaves the kept half in [*lo, *hi). peer_in_recv: the partner's data is in its receive
 * buffer already (direct mode reads it there, else in its send buffer). On the last level,
 * records the first non-finite tensor.
 */
static sumo_result combine_level(run *a, size_t *lo, size_t *hi, int peer, bool left,
                                 bool peer_in_recv, const block *b, int my_group, bool last,
                                 int forward)
{
    sumo__transport *tp = a->tp;
    size_t esz = a->esz, mid = *lo + (*hi - *lo) / 2;
    size_t klo = left ? *lo : mid, khi = left ? mid : *hi;
    size_t glo = left ? mid : *lo, ghi = left ? *hi : mid;
    const unsigned char *theirs; /* the partner's element klo */
    if (a->direct) {
        /* The partner finished writing what we read (its previous level) and reads ours. */
        SUMO__CHECK(handshake(tp, peer));
        theirs = (peer_in_recv ? a->recv_of[peer] : a->send_of[peer]) + klo * esz;
    } else {
        SUMO__CHECK(tp->ops->sendrecv(tp, a->src + glo * esz, (ghi - glo) * esz, peer, a->y,
                                      (khi - klo) * esz, peer));
        theirs = a->y;
    }
    memset(a->sums, 0, 3 * a->ntensors * sizeof(double));
    size_t t0 = first_tensor(a, klo);
    for (size_t t = t0; t < a->ntensors && a->off[t] < khi; t++) {
        size_t s = SUMO__MAX(a->off[t], klo), e = SUMO__MIN(a->off[t + 1], khi);
        if (e <= s) continue;
        const unsigned char *mine = a->src + s * esz, *other = theirs + (s - klo) * esz;
        SUMO__KCHECK(a->c, sumo__k_dot_norms(&a->c->x, a->dtype, left ? mine : other,
                                             left ? other : mine, e - s, &a->sums[3 * t]));
    }
    SUMO__CHECK(block_sum(a, b, my_group));
    if (last) {
        for (size_t t = 0; t < a->ntensors; t++) {
            double cl, cr;
            if (!coefficients(&a->sums[3 * t], &cl, &cr)) {
                a->bad = t;
                break;
            }
        }
    }
    for (size_t t = t0; t < a->ntensors && a->off[t] < khi; t++) {
        size_t s = SUMO__MAX(a->off[t], klo), e = SUMO__MIN(a->off[t + 1], khi);
        if (e <= s) continue;
        double cl, cr;
        coefficients(&a->sums[3 * t], &cl, &cr);
        SUMO__CHECK(update(a, s, e, left ? cl : cr, theirs + (s - klo) * esz, left ? cr : cl,
                           forward));
    }
    /* Elements of no tensor cannot exist (the layout covers [0, count)), so x[klo, khi) is
     * complete. */
    a->src = a->x;
    *lo = klo;
    *hi = khi;
    return SUMO_SUCCESS;
}

/* G == 1: nothing is combined, but a non-finite tensor must still become NaN and be named. */
static sumo_result check_single(run *a, size_t lo, size_t hi)
{
    size_t esz = a->esz;
    const sumo__exec *x = &a->c->x;
    if (a->src != a->x) {
        SUMO__KCHECK(a->c, sumo__k_copy(x, a->x + lo * esz, a->src + lo * esz, (hi - lo) * esz));
        a->src = a->x;
    }
    memset(a->sums, 0, 3 * a->ntensors * sizeof(double));
    size_t t0 = first_tensor(a, lo);
    for (size_t t = t0; t < a->ntensors && a->off[t] < hi; t++) {
        size_t s = SUMO__MAX(a->off[t], lo), e = SUMO__MIN(a->off[t + 1], hi);
        if (e > s)
            SUMO__KCHECK(a->c, sumo__k_dot_norms(x, a->dtype, a->x + s * esz, a->x + s * esz,
                                                 e - s, &a->sums[3 * t]));
    }
    block b = {.first = a->grp, .ngroups = 1, .virtual_groups = false};
    SUMO__CHECK(block_sum(a, &b, a->grp));
    for (size_t t = 0; t < a->ntensors; t++) {
        double cl, cr;
        if (coefficients(&a->sums[3 * t], &cl, &cr)) continue;
        if (a->bad == SIZE_MAX) a->bad = t;
        size_t s = SUMO__MAX(a->off[t], lo), e = SUMO__MIN(a->off[t + 1], hi);
        if (e > s) SUMO__KCHECK(a->c, sumo__k_fill(x, a->dtype, a->x + s * esz, NAN, e - s));
    }
    if (a->direct) SUMO__CHECK(forward_range(a, lo, hi, FORWARD_ALL)); /* one group: all ranks */
    return SUMO_SUCCESS;
}

/* Step 1: member `mem` ends with slice `mem` of its group's average, in rank order. */
static sumo_result group_average(run *a, size_t n)
{
    sumo__transport *tp = a->tp;
    int g = a->g, base = a->grp * g;
    size_t esz = a->esz;
    size_t lo = slice_off(n, g, a->mem), len = slice_off(n, g, a->mem + 1) - lo;
    if (a->direct) {
        /* Every input is complete since the agreement; each member reads its slice of all. */
        for (int k = 0; k < g; k++) a->ins[k] = a->send_of[base + k] + lo * esz;
    } else {
        for (int s = 1; s < g; s++) {
            int to = (a->mem + s) % g, from = (a->mem - s + g) % g;
            size_t tlo = slice_off(n, g, to), tlen = slice_off(n, g, to + 1) - tlo;
            int slot = from < a->mem ? from : from - 1;
            SUMO__CHECK(tp->ops->sendrecv(tp, a->src + tlo * esz, tlen * esz, base + to,
                                          a->y + (size_t)slot * len * esz, len * esz,
                                          base + from));
        }
        for (int k = 0; k < g; k++) {
            int slot = k < a->mem ? k : k - 1;
            a->ins[k] = k == a->mem ? (const void *)(a->src + lo * esz)
                                    : (const void *)(a->y + (size_t)slot * len * esz);
        }
    }
    if (len > 0) {
        void *out = a->x + lo * esz;
        SUMO__KCHECK(a->c, sumo__k_reduce(&a->c->x, a->dtype, &out, 1, a->ins, g, len, g));
    }
    a->src = a->x;
    return SUMO_SUCCESS;
}

/* Step 4, hierarchical, point to point: every member gets every slice of the result. */
static sumo_result group_allgather(run *a, size_t n)
{
    sumo__transport *tp = a->tp;
    int g = a->g, base = a->grp * g;
    size_t esz = a->esz;
    size_t lo = slice_off(n, g, a->mem), len = slice_off(n, g, a->mem + 1) - lo;
    for (int s = 1; s < g; s++) {
        int to = (a->mem + s) % g, from = (a->mem - s + g) % g;
        size_t flo = slice_off(n, g, from), flen = slice_off(n, g, from + 1) - flo;
        SUMO__CHECK(tp->ops->sendrecv(tp, a->x + lo * esz, len * esz, base + to,
                                      a->x + flo * esz, flen * esz, base + from));
    }
    return SUMO_SUCCESS;
}

/* Steps 2 to 4 on this rank's slice [s0, s1) (in direct mode, step 4 is the last level's
 * forwarding and the caller's barrier). */
static sumo_result adasum_slice(run *a, size_t s0, size_t s1)
{
    sumo__transport *tp = a->tp;
    size_t esz = a->esz;
    if (a->ngroups == 1) return check_single(a, s0, s1);
    bool folded_away = false; /* a group 2i+1 of the fold */
    if (a->grp < 2 * a->rem) {
        bool left = a->grp % 2 == 0;
        int partner_grp = left ? a->grp + 1 : a->grp - 1;
        int peer = partner_grp * a->g + a->mem;
        block b = {.first = a->grp & ~1, .ngroups = 2, .virtual_groups = false};
        size_t lo = s0, hi = s1;
        int forward = !left && a->direct ? peer : FORWARD_NONE;
        SUMO__CHECK(combine_level(a, &lo, &hi, peer, left, a->g > 1, &b, a->grp, false, forward));
        if (left) {
            if (a->direct) SUMO__CHECK(tp->ops->sendrecv(tp, NULL, 0, -1, NULL, 0, peer));
            else SUMO__CHECK(tp->ops->sendrecv(tp, NULL, 0, -1, a->x + hi * esz, (s1 - hi) * esz, peer));
        } else {
            if (a->direct) SUMO__CHECK(tp->ops->sendrecv(tp, NULL, 0, peer, NULL, 0, -1));
            else SUMO__CHECK(tp->ops->sendrecv(tp, a->x + lo * esz, (hi - lo) * esz, peer, NULL, 0, -1));
            folded_away = true;
        }
    }
    if (folded_away) {
        int peer = (a->grp - 1) * a->g + a->mem;
        uint64_t status;
        if (!a->direct)
            SUMO__CHECK(tp->ops->sendrecv(tp, NULL, 0, -1, a->x + s0 * esz, (s1 - s0) * esz, peer));
        SUMO__CHECK(tp->ops->sendrecv(tp, NULL, 0, -1, &status, sizeof status, peer));
        a->bad = status == UINT64_MAX ? SIZE_MAX : (size_t)status;
        return SUMO_SUCCESS;
    }
    int vgrp = a->grp < 2 * a->rem ? a->grp / 2 : a->grp - a->rem;
    size_t lo_at[MAX_LEVELS + 1], hi_at[MAX_LEVELS + 1];
    int levels = 0;
    lo_at[0] = s0;
    hi_at[0] = s1;
    for (int L = 1; L < a->g2; L <<= 1, levels++) {
        int vpeer = vgrp ^ L, peer_grp = real_group(a, vpeer);
        int peer = peer_grp * a->g + a->mem;
        bool last = 2 * L == a->g2;
        /* Partners share their history, except on the first level after a fold: a folded
         * survivor may face one that did not fold. */
        bool peer_in_recv = a->g > 1 || L > 1 || peer_grp < 2 * a->rem;
        block b = {.first = vgrp / (2 * L) * (2 * L), .ngroups = 2 * L, .virtual_groups = true};
        size_t lo = lo_at[levels], hi = hi_at[levels];
        SUMO__CHECK(combine_level(a, &lo, &hi, peer, (vgrp & L) == 0, peer_in_recv, &b, vgrp,
                                  last, last && a->direct ? FORWARD_ALL : FORWARD_NONE));
        lo_at[levels + 1] = lo;
        hi_at[levels + 1] = hi;
    }
    for (int k = levels - 1; k >= 0 && !a->direct; k--) {
        int peer = real_group(a, vgrp ^ (1 << k)) * a->g + a->mem;
        bool left = (vgrp & (1 << k)) == 0;
        size_t klo = lo_at[k + 1], khi = hi_at[k + 1];
        /* The partner holds the other part of [lo_at[k], hi_at[k]). */
        size_t olo = left ? khi : lo_at[k], ohi = left ? hi_at[k] : klo;
        SUMO__CHECK(tp->ops->sendrecv(tp, a->x + klo * esz, (khi - klo) * esz, peer,
                                      a->x + olo * esz, (ohi - olo) * esz, peer));
    }
    if (a->grp < 2 * a->rem) {
        int peer = (a->grp + 1) * a->g + a->mem;
        uint64_t status = a->bad == SIZE_MAX ? UINT64_MAX : (uint64_t)a->bad;
        if (!a->direct)
            SUMO__CHECK(tp->ops->sendrecv(tp, a->x + s0 * esz, (s1 - s0) * esz, peer, NULL, 0, -1));
        SUMO__CHECK(tp->ops->sendrecv(tp, &status, sizeof status, peer, NULL, 0, -1));
    }
    return SUMO_SUCCESS;
}

/*
 * Adasum in Gram form (collectives/gram.h): the tree's weights from each tensor's Gram matrix.
 * A tensor whose weights cannot be trusted to the dtype's accuracy (its inputs cancel; see
 * adasum_gram.h) or are not finite makes every rank decline alike, and the call takes the
 * tree, whose inputs are untouched. fp64 keeps the tree always: its tolerance is below what
 * the quadratic forms deliver on inputs that cancel.
 */
static size_t gram_work_bytes(int P, size_t ntensors)
{
    return sumo__adasum_gram_work_len(P) * sizeof(double) + ntensors;
}

static bool weigh_adasum(void *ctx, const double *gram, size_t ntensors, double *w, void *work)
{
    const sumo__adasum_gram_params *params = ctx;
    double *dwork = work;
    unsigned char *flags = (unsigned char *)(dwork + sumo__adasum_gram_work_len(params->nranks));
    sumo__adasum_gram_weights(params, gram, ntensors, w, flags, dwork);
    for (size_t t = 0; t < ntensors; t++)
        if (flags[t]) return false;
    return true;
}

/* Scratch offsets of one call: host metadata (sums, pointers, the Gram form's matrices) in
 * the handle's scratch, the receive area y in its data scratch. */
typedef struct scratch_plan {
    size_t sums, ins, ptrs, gram, total;
    size_t y_bytes, data_bytes;
} scratch_plan;

static size_t align64(size_t v) { return (v + 63) / 64 * 64; }

/* False on overflow. */
static bool plan_scratch(const run *a, size_t n, scratch_plan *sp)
{
    size_t slice = slice_off(n, a->g, a->mem + 1) - slice_off(n, a->g, a->mem);
    size_t y_elems = 0;
    if (!a->direct) {
        y_elems = a->ngroups > 1 ? slice - slice / 2 : 0;
        if (a->g > 1) {
            size_t peers;
            if (sumo__mul_overflows(slice, (size_t)(a->g - 1), &peers)) return false;
            y_elems = SUMO__MAX(y_elems, peers);
        }
    }
    if (sumo__mul_overflows(y_elems, a->esz, &sp->y_bytes) || sp->y_bytes > SIZE_MAX / 2)
        return false;
    size_t sums_bytes = 2 * 3 * a->ntensors * sizeof(double); /* ntensors bounded at creation */
    size_t ptr_bytes = (size_t)a->tp->size * sizeof(void *);
    sp->sums = 0;
    sp->ins = align64(sp->sums + sums_bytes);
    sp->ptrs = align64(sp->ins + (size_t)a->g * sizeof(void *));
    sp->gram = align64(sp->ptrs + (a->direct ? 2 * ptr_bytes : 0));
    sp->total = sp->gram;
    /* The Gram form runs first and the tree only when it declines: they share the data. */
    sp->data_bytes = sp->y_bytes;
    if (a->gram) {
        sp->total += sumo__gram_scratch_bytes(a->c, &a->gram_call);
        sp->data_bytes = SUMO__MAX(sp->data_bytes, sumo__gram_data_bytes(a->c, &a->gram_call));
    }
    return true;
}

/*
 * On a two-level communicator (comm_hier.c), host memory runs this file's algorithm over the
 * composed transport, point to point: the group average and the group allgather pair ranks of
 * one node, the combine levels ranks of one local rank, so with L a power of two every message
 * stays on a level; the Gram form (an all-to-all and a ring) and a flat op run over options.any
 * (the transport's flat mode), as do the block sums that pair other ranks when L is not a power
 * of two. Without options.any the Gram form is skipped (the tree alone), and what would need
 * it is refused, alike on every rank. Device memory takes adasum_hier.c: here, this rank's
 * share's op on the across level of the call's memory, made there at its first call.
 */
static sumo_result two_level_device(sumo_comm *c, sumo__call_desc *d, adasum_op *aop,
                                    const void *sendbuf, void *recvbuf)
{
    const size_t *counts;
    size_t first = 0, n = 0;
    sumo_op op = 0;
    bool has_op = false;
    sumo_comm *across = sumo__level_across(c);
    d->local_error = sumo__adasum_hier_cut(c, &aop->hier, aop->offsets, aop->ntensors, d->count,
                                           &counts, &first, &n);
    for (int i = 0; i < aop->nacross && d->local_error == SUMO_SUCCESS && !has_op; i++)
        if (aop->across[i] == across) op = aop->across_op[i], has_op = true;
    if (d->local_error == SUMO_SUCCESS && !has_op && n > 0 && c->levels->H > 1) {
        sumo_adasum_options o = {.struct_size = sizeof o, .tensor_counts = counts + first,
                                 .ntensors = n};
        const char *m = "";
        d->local_error = sumo_op_create_adasum(across, &o, &op);
        sumo_comm_error_message(across, &m);
        if (d->local_error != SUMO_SUCCESS)
            SUMO__COMM_FAIL(c, d->local_error, "Adasum: this rank's share's op on the across "
                            "communicator: %s", m);
        else {
            aop->across[aop->nacross] = across;
            aop->across_op[aop->nacross++] = op;
            has_op = true;
        }
    }
    return sumo__adasum_hier_allreduce(c, d, aop->hier, has_op, op, sendbuf, recvbuf);
}

static sumo_result allreduce_adasum(sumo_comm *c, sumo__call_desc *d, const sumo__op_entry *op,
                                    const void *sendbuf, void *recvbuf);

sumo_result sumo__allreduce_adasum(sumo_comm *c, sumo__call_desc *d, const sumo__op_entry *op,
                                   const void *sendbuf, void *recvbuf)
{
    sumo_result r = allreduce_adasum(c, d, op, sendbuf, recvbuf);
    if (c->levels) sumo__hier_tp_flat(c->tp, false);
    return r;
}

static sumo_result allreduce_adasum(sumo_comm *c, sumo__call_desc *d, const sumo__op_entry *op,
                                    const void *sendbuf, void *recvbuf)
{
    sumo__transport *tp = c->tp;
    const adasum_op *aop = op->impl;
    sumo_dtype dtype = (sumo_dtype)d->dtype;
    size_t count = d->count;
    run a = {.c = c, .tp = tp, .dtype = dtype, .x = recvbuf, .src = sendbuf, .bad = SIZE_MAX};
    scratch_plan sp = {0};
    void *s = NULL, *data = NULL;
    d->aux = aop ? aop->hash : layout_hash(NULL, 0, 1);
    if (aop && aop->ntensors > 0 && aop->offsets[aop->ntensors] != count)
        d->local_error = SUMO__FAIL(tp, SUMO_ERR_INVALID_ARGUMENT,
                                    "allreduce: the Adasum op's %zu tensors hold %zu elements, but "
                                    "count is %zu",
                                    aop->ntensors, aop->offsets[aop->ntensors], count);
    if (d->local_error == SUMO_SUCCESS) {
        a.esz = sumo__dtype_bytes(dtype);
        a.single[0] = 0;
        a.single[1] = count;
        a.ntensors = aop && aop->ntensors ? aop->ntensors : 1;
        a.off = aop && aop->ntensors ? aop->offsets : a.single;
        a.g = aop ? aop->group_size : 1;
        a.ngroups = tp->size / a.g;
        a.grp = tp->rank / a.g;
        a.mem = tp->rank % a.g;
        a.g2 = 1;
        while (a.g2 * 2 <= a.ngroups) a.g2 *= 2;
        a.rem = a.ngroups - a.g2;
        a.direct = tp->size > 1 && sumo__call_direct(c);
        /* The bound on tensors keeps the Gram scratch's size arithmetic far from overflow. */
        a.gram = a.ngroups > 1 && dtype != SUMO_FLOAT64 && tp->size <= SUMO__GRAM_MAX_RANKS &&
                 a.ntensors <= ((size_t)1 << 32);
        if (a.gram) {
            a.gram_params = (sumo__adasum_gram_params){
                .nranks = tp->size, .group_size = a.g, .need = sumo__adasum_need(dtype)};
            a.gram_call = (sumo__gram_call){.dtype = dtype, .count = count,
                                            .ntensors = a.ntensors, .offsets = a.off,
                                            .weigh = weigh_adasum, .ctx = &a.gram_params,
                                            .weigh_work_bytes = gram_work_bytes(tp->size, a.ntensors),
                                            .shape = sumo__gram_shape_for(c)};
        }
        if (c->levels) sumo__adasum_hier_check(c, d, a.g, a.ngroups, &a.gram);
        if (c->levels && c->x.k != sumo__host_kernels() && d->local_error == SUMO_SUCCESS)
            return two_level_device(c, d, op->impl, sendbuf, recvbuf);
        if (d->local_error == SUMO_SUCCESS && !plan_scratch(&a, count, &sp))
            d->local_error = SUMO__FAIL(tp, SUMO_ERR_INVALID_ARGUMENT,
                                        "allreduce: adasum scratch for count %zu overflows size_t",
                                        count);
        else if (d->local_error == SUMO_SUCCESS)
            d->local_error = sumo__comm_scratch(c, sp.total, &s);
        if (d->local_error == SUMO_SUCCESS && sp.data_bytes)
            d->local_error = sumo__comm_data_scratch(c, &c->x, sp.data_bytes, &data);
    }
    /* Buffers shared between processes run direct whatever the form (the agreement refuses
     * them unless every rank shared its own). */
    if (d->local_error == SUMO_SUCCESS && !a.gram && sumo__call_imports(c))
        d->flags = sumo__shared_flag(c, sendbuf, count * a.esz, recvbuf, count * a.esz);
    if (d->local_error == SUMO_SUCCESS && a.gram) {
        d->flags = sumo__shared_flag(c, sendbuf, count * a.esz, recvbuf, count * a.esz);
        /* A small call's input rides into the staging area ahead of the agreement. A failed
         * copy is announced, so no rank reads an area left stale. */
        a.gram_call.staged_ahead = true;
        d->local_error = sumo__gram_stage_ahead(c, &a.gram_call, d->flags, sendbuf);
    }
    SUMO__LOG(tp->log_level, SUMO__LOG_INFO,
              "rank %d allreduce count %zu %s adasum: %zu tensors, %d groups of %d, %s", tp->rank,
              count, sumo_dtype_name(dtype), a.ntensors, a.ngroups, a.g,
              a.direct ? "direct" : "point to point");
    const sumo__call_desc *all;
    SUMO__CHECK(sumo__agree(c, d, &all));
    unsigned char *base = s;
    a.y = data;
    a.sums = (double *)(void *)(base + sp.sums);
    a.peer = a.sums + 3 * a.ntensors;
    a.ins = (const void **)(void *)(base + sp.ins);
    if (a.direct) {
        /* Every rank's buffers, as announced in the agreement. */
        a.send_of = (const unsigned char **)(void *)(base + sp.ptrs);
        a.recv_of = (unsigned char **)(void *)(base + sp.ptrs) + tp->size;
        for (int k = 0; k < tp->size; k++) {
            void *peer_send, *peer_recv;
            SUMO__CHECK(sumo__peer_buffer(c, all, k, false, &peer_send));
            SUMO__CHECK(sumo__peer_buffer(c, all, k, true, &peer_recv));
            a.send_of[k] = peer_send;
            a.recv_of[k] = peer_recv;
        }
    }
    /* A flat op on a two-level communicator: every message over options.any. */
    if (c->levels && a.g == 1) sumo__hier_tp_flat(c->tp, true);
    if (a.gram) {
        bool applied;
        if (c->levels) sumo__hier_tp_flat(c->tp, true);
        SUMO__CHECK(sumo__gram_run(c, all, sendbuf, recvbuf, &a.gram_call, base + sp.gram, data,
                                   &applied));
        if (c->levels && a.g > 1) sumo__hier_tp_flat(c->tp, false);
        if (applied) return SUMO_SUCCESS;
        SUMO__LOG(tp->log_level, SUMO__LOG_INFO, "rank %d adasum: Gram form declined, tree",
                  tp->rank);
    }
    size_t s0 = 0, s1 = count;
    if (a.g > 1) {
        SUMO__CHECK(group_average(&a, count));
        s0 = slice_off(count, a.g, a.mem);
        s1 = slice_off(count, a.g, a.mem + 1);
    }
    SUMO__CHECK(adasum_slice(&a, s0, s1));
    if (a.direct) SUMO__CHECK(tp->ops->barrier(tp));
    else if (a.g > 1) SUMO__CHECK(group_allgather(&a, count));
    if (a.bad != SIZE_MAX)
        return SUMO__FAIL(tp, SUMO_ERR_NONFINITE,
                          "adasum: tensor %zu (of %zu; elements [%zu, %zu)) holds NaN or Inf, or "
                          "its squared norm overflows double: its result is NaN",
                          a.bad, a.ntensors, a.off[a.bad], a.off[a.bad + 1]);
    return SUMO_SUCCESS;
}
