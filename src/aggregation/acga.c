/*
 * ACGA, adaptive consensus gradient aggregation (docs/design/acga.md).
 *
 * ONE STEP, rank r of N, fp32 buffers only (other dtypes: SUMO_ERR_INVALID_ARGUMENT before any
 * communication). A "group" is what one coefficient covers: the whole buffer (default), or one
 * tensor of the layout (per_tensor; with no layout the buffer is one tensor). K = number of
 * groups, N*K coefficients in all.
 *   1. s = allreduce_sum(g_r) into a scratch buffer owned here (one buffer, grown only when an
 *      aggregator without a layout sees a larger count).
 *   2. per group: (dot, |g|^2, |s|^2) in double by sumo__kernel_dot_norms;
 *      a_r = <g_r, s> / (|g_r| + eps) / N, and a_r = 0 when |g_r| + eps == 0 (eps 0 and a zero
 *      gradient: nothing divides by zero, and a zero gradient adds nothing anyway); a NaN or
 *      infinite norm is not that case and yields a non-finite a_r.
 *   3. ONE allgather of the K coefficients of every rank (N*K doubles), so every rank computes
 *      the weights below from the same bits and gets the same weights.
 *   4. per group (sumo__acga_group_weights, acga_gram.c, which the Gram form calls too): sort
 *      ascending, ties by rank (a total order: no NaN reaches it, and -0 and +0 tie); m = v on
 *      the first step, beta m + (1 - beta) v after (EMA on the SORTED values); map back:
 *      a'[idx[k]] = m[k] (default, rank preserving) or a'[k] = m[idx[k]]
 *      (reference_permutation, the sample code's m[idx], a different permutation for N >= 3);
 *      negative guard: a' -= min(a') when min(a') < 0; w = a' / sum(a').
 *   5. g_r *= w_r / (|g_r| + eps) (fp32, rounded once), then G = allreduce_sum in place.
 *   6. rescale (option, NOT from the paper): G *= (|s| / N) / |G| per group, so |G| equals the
 *      norm of the mean gradient. The factors are rank 0's, broadcast (one more collective of K
 *      doubles): dot_norms sums in an order that depends on the CPU's vector path, and ranks on
 *      different CPUs must still end with the same bits.
 * Collectives per step: allreduce, allgather, allreduce (+ broadcast with rescale), each
 * counted in the aggregator's stats (allgather: K doubles sent per rank).
 *
 * Every rank's G is bit-identical: the weights come from allgathered data by the same
 * arithmetic, the final allreduce gives every rank the same bits, and whatever runs after it
 * (division by N, NaN fill, rescale by a broadcast factor) is elementwise on identical inputs.
 *
 * DEGENERATE STEPS (decided here; each has a test in tests/unit/test_acga_degenerate.c):
 *   - One rank's gradient is zero: a_r = 0, an ordinary step, SUMO_SUCCESS.
 *   - Coefficient sum vanishes: when sum(a') <= 1e-6 * sum|a'| after the guard (which covers
 *     sum <= 0, and all a' == 0, e.g. every gradient zero or gradients that cancel to s = 0),
 *     the group takes the uniform weights 1/N for this step: G = average of g_r / (|g_r| + eps)
 *     over ranks. With the guard on (default) this happens only when all a' are equal, where
 *     1/N is the exact limit; with it off, a sum that cancels would blow the weights up by up to
 *     1e6 past that point, which is no longer an aggregation. Returns SUMO_SUCCESS: the result
 *     is finite and meaningful (all-zero gradients give G = 0, as averaging does), and an error
 *     would stop a training loop for a benign step; rank 0 logs it at SUMO_DEBUG=WARN. When
 *     every group is uniform the final collective is sumo_allreduce(SUMO_OP_AVERAGE) itself, so
 *     the result is plain averaging bit for bit; a uniform group among weighted ones is summed
 *     with the others and divided once by N, which is how every sumo algorithm averages.
 *     The EMA still takes the step's (finite) coefficients: they are observations, and only
 *     this step's use of them degenerates.
 *   - NaN or Inf in any rank's gradient (or a sum that overflows fp32): the coefficients of
 *     that group are non-finite on every rank after the allgather (an Inf or NaN in s reaches
 *     every rank's dot product), so every rank decides alike: the group's result is all NaN,
 *     the other groups are exact ACGA results (whole-model mode: the whole buffer is NaN and
 *     the final allreduce is skipped), SUMO_ERR_NONFINITE is returned on every rank, and
 *     sumo_comm_error_message() names the first bad tensor. The momentum is not advanced by
 *     such a step at all (no group's), so one bad batch does not poison later weights.
 *   - A failed collective is returned as is and leaves the momentum unchanged; the buffer is
 *     untouched if the failure came before step 5, and meaningless after it. With a layout, s
 *     is allocated at creation (host memory), so apply never allocates for host buffers;
 *     otherwise (no layout, or buffers in another memory) it is allocated by the kernel table
 *     of the buffers' memory at the first apply that needs it, and an allocation that fails
 *     on one rank is announced, so every rank fails at once.
 *
 * Every touch of the data (copies, dot products, scaling, the NaN fill) goes through the
 * kernel table of the memory the buffers live in.
 *
 * STATE (checkpoints): little-endian, 24-byte header then the EMA:
 *   u32 magic "ACGA", u32 version (1), u32 N, u32 K, u32 initialised (0/1), u32 0,
 *   then N*K doubles, group-major (group k's sorted EMA at [k*N, (k+1)*N)).
 * Loading checks all of it against this aggregator (N ranks, K groups) and that the values are
 * finite; anything else is SUMO_ERR_INVALID_ARGUMENT with the reason in the comm's message.
 */
#include "aggregation/acga.h"
#include "aggregation/acga_gram.h"
#include "collectives/adasum_gram.h"
#include "collectives/execute.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define ACGA_MAGIC 0x41474341u /* "ACGA" read as little-endian bytes */
#define ACGA_VERSION 1u
#define ACGA_HEADER_BYTES 24u

struct sumo__acga {
    sumo_comm *comm;
    sumo_acga_options o;
    int nranks, rank;
    size_t ngroups;       /* K */
    size_t *group_off;    /* K + 1 offsets when the groups are the layout's tensors, else NULL */
    size_t total;         /* the layout's element count (0: no layout) */
    int initialised;
    double *m;            /* N*K committed EMA, group-major */
    double *m_next;       /* this step's EMA, committed when the step completes */
    double *gathered;     /* N*K allgathered coefficients, rank-major: a[r*K + k] */
    double *a;            /* N: one group's coefficients, rank order */
    double *w;            /* N: one group's weights */
    double *norm;         /* K: |g_r| per group */
    double *sum_norm;     /* K: |s| per group */
    double *coef;         /* K: this rank's multiplier */
    double *factor;       /* K: rescale factors */
    unsigned char *kind;  /* K: SUMO__ACGA_* */
    void *work;           /* sumo__acga_group_weights' */
    float *sum;           /* s, in the memory of sum_k */
    size_t sum_cap;       /* elements */
    const sumo_kernel_table *sum_k;
};

/* [*off, *off + *len) of group k in a buffer of count elements. */
static void group_range(const sumo__acga *a, size_t k, size_t count, size_t *off, size_t *len)
{
    if (a->group_off == NULL) {
        *off = 0;
        *len = count;
    } else {
        *off = a->group_off[k];
        *len = a->group_off[k + 1] - a->group_off[k];
    }
}

/* s, count floats in the memory of x's table. */
static sumo_result ensure_sum(sumo__acga *a, const sumo__exec *x, size_t count)
{
    if (count <= a->sum_cap && a->sum_k == x->k) return SUMO_SUCCESS;
    size_t bytes;
    if (sumo__mul_overflows(count, sizeof(float), &bytes)) return SUMO_ERR_INVALID_ARGUMENT;
    if (a->sum) a->sum_k->release(a->sum_k->ctx, a->sum);
    a->sum = NULL;
    a->sum_cap = 0;
    void *p = NULL;
    sumo_result r = x->k->alloc(x->k->ctx, bytes ? bytes : 1, &p);
    if (r != SUMO_SUCCESS || p == NULL) return r == SUMO_SUCCESS ? SUMO_ERR_SYSTEM : r;
    a->sum = p;
    a->sum_cap = count;
    a->sum_k = x->k;
    return SUMO_SUCCESS;
}

static void count_exchange(sumo_comm_stats *stats, size_t count, sumo_dtype dtype)
{
    stats->rounds++;
    stats->bytes += (uint64_t)count * sumo__dtype_bytes(dtype);
}

/*
 * Step 4 for group k from the allgathered coefficients: fills m_next's group, kind[k] and
 * coef[k]. Every rank runs this on the same bits, so kind and the weights agree everywhere.
 */
static void group_weights(sumo__acga *a, size_t k)
{
    const int n = a->nranks;
    const size_t K = a->ngroups;
    for (int j = 0; j < n; j++) a->a[j] = a->gathered[(size_t)j * K + k];
    double sum, l1;
    int kind = sumo__acga_group_weights(&a->o, n, a->a, a->m + k * (size_t)n, a->initialised,
                                        a->m_next + k * (size_t)n, a->w, &sum, &l1, a->work);
    a->kind[k] = (unsigned char)kind;
    double den = a->norm[k] + a->o.eps;
    if (kind == SUMO__ACGA_NONFINITE) {
        a->coef[k] = 0.0;
    } else if (kind == SUMO__ACGA_UNIFORM) {
        a->coef[k] = den == 0 ? 0.0 : 1.0 / den;
        if (a->rank == 0)
            SUMO__LOG(a->comm->tp->log_level, SUMO__LOG_WARN,
                      "acga: coefficient sum %.3g (sum of |a'| %.3g) in group %zu: uniform "
                      "weights 1/%d this step",
                      sum, l1, k, n);
    } else {
        a->coef[k] = den == 0 ? 0.0 : a->w[a->rank] / den;
    }
}

/* ---- the one-exchange form ------------------------------------------------------------ */

/* ACGA's weights from the groups' Gram matrices (aggregation/acga_gram.h): coefficient of rank
 * r in group k is w[k N + r], which is acga_gram's own layout. A non-finite group declines, and
 * the two-exchange path below reports it as it always has. */
static size_t gram_work_bytes(const sumo__acga *a)
{
    return sumo__acga_gram_work_bytes(a->nranks) + a->ngroups;
}

static bool weigh_acga(void *ctx, const double *gram, size_t ngroups, double *w, void *work)
{
    sumo__acga *a = ctx;
    unsigned char *kind = (unsigned char *)work + sumo__acga_gram_work_bytes(a->nranks);
    size_t bad = sumo__acga_gram_weights(&a->o, a->nranks, ngroups, gram, a->m, a->initialised,
                                         a->m_next, w, kind, work);
    return bad == SIZE_MAX;
}

uint64_t sumo__acga_fingerprint(const sumo__acga *a)
{
    const sumo_acga_options *o = &a->o;
    const double f[] = {o->beta, o->eps, (double)o->per_tensor, (double)o->reference_permutation,
                        (double)o->negative_guard, (double)o->rescale, (double)a->total,
                        (double)a->ngroups};
    uint64_t h = sumo__fnv1a(SUMO__FNV_OFFSET, f, sizeof f);
    if (a->group_off) h = sumo__fnv1a(h, a->group_off, (a->ngroups + 1) * sizeof *a->group_off);
    return h;
}

/* The per-call hash of the Gram exchange: the options, the layout and this call's count. */
static uint64_t call_hash(const sumo__acga *a, size_t count)
{
    uint64_t h = sumo__acga_fingerprint(a);
    return sumo__fnv1a(h, &count, sizeof count);
}

/*
 * One Gram pass, one small sum, one weighted-sum pass (collectives/gram.h), from send into g,
 * where the group is small enough; *applied false leaves send untouched for the two-exchange
 * path (and g holding nothing or a copy of it). Results agree with that path within fp32
 * rounding (acga_gram.h says where the inner products differ).
 */
static sumo_result apply_gram(sumo__acga *a, const float *send, float *g, size_t count,
                              sumo_comm_stats *stats, bool *applied)
{
    *applied = false;
    if (a->nranks > SUMO__GRAM_MAX_RANKS) return SUMO_SUCCESS;
    size_t whole[2] = {0, count};
    sumo_comm *c = a->comm;
    sumo__gram_call call = {.dtype = SUMO_FLOAT32, .count = count, .ntensors = a->ngroups,
                            .offsets = a->group_off ? a->group_off : whole, .weigh = weigh_acga,
                            .ctx = a, .weigh_work_bytes = gram_work_bytes(a),
                            .shape = sumo__gram_shape_for(c)};
    SUMO__CHECK(sumo__gram_allreduce(c, send, g, &call, call_hash(a, count), applied));
    count_exchange(stats, count, SUMO_FLOAT32);
    count_exchange(stats, a->ngroups * sumo__gram_len(a->nranks), SUMO_FLOAT64);
    if (*applied) {
        memcpy(a->m, a->m_next, (size_t)a->nranks * a->ngroups * sizeof *a->m);
        a->initialised = 1;
    }
    return SUMO_SUCCESS;
}

sumo_result sumo__acga_apply_held(sumo__acga *a, const void *sendbuf, void *recvbuf,
                                  size_t count, sumo_dtype dtype, sumo_comm_stats *stats)
{
    sumo_comm *comm = a->comm;
    /* Local failures are announced to the peers, which are entering the first exchange. */
    if (dtype != SUMO_FLOAT32)
        return sumo__fail_held(comm, SUMO__COMM_FAIL(comm, SUMO_ERR_INVALID_ARGUMENT,
                                                     "acga: dtype %s: only float32 is supported",
                                                     sumo_dtype_name(dtype)));
    float *g = recvbuf;
    const size_t K = a->ngroups;
    const int n = a->nranks;
    bool applied;
    SUMO__CHECK(apply_gram(a, sendbuf, g, count, stats, &applied));
    if (applied) return SUMO_SUCCESS;
    /* The two-exchange path works in place, in the buffers' memory. */
    const sumo__exec x = {.k = sumo__kernels_for(comm, g, count * sizeof *g), .stream = NULL};
    if (sendbuf != recvbuf)
        SUMO__KCHECK(comm, sumo__k_copy(&x, g, sendbuf, count * sizeof *g));
    sumo_result grown = ensure_sum(a, &x, count);
    if (grown != SUMO_SUCCESS)
        return sumo__fail_held(comm, SUMO__COMM_FAIL(comm, grown,
                                                     "acga: no room for the sum of %zu floats",
                                                     count));

    /* 1. The consensus: the sum of every rank's gradient. */
    count_exchange(stats, count, SUMO_FLOAT32);
    SUMO__CHECK(sumo__allreduce_held(comm, g, a->sum, count, SUMO_FLOAT32, SUMO_OP_SUM));

    /* 2. This rank's coefficients. */
    double *mine = a->gathered + (size_t)a->rank * K;
    for (size_t k = 0; k < K; k++) {
        size_t off, len;
        group_range(a, k, count, &off, &len);
        double dn[3];
        SUMO__KCHECK(comm, sumo__k_dot_norms(&x, SUMO_FLOAT32, g + off, a->sum + off, len, dn));
        a->norm[k] = sqrt(dn[1]);
        a->sum_norm[k] = sqrt(dn[2]);
        double den = a->norm[k] + a->o.eps;
        /* Only eps 0 with a zero gradient gives 0 here; a NaN norm must stay NaN. */
        mine[k] = den == 0 ? 0.0 : dn[0] / den / n;
    }

    /* 3. Everybody's, in place. */
    count_exchange(stats, K, SUMO_FLOAT64);
    SUMO__CHECK(sumo__allgather_held(comm, mine, a->gathered, K, SUMO_FLOAT64));

    /* 4. Weights. */
    size_t nbad = 0, nuniform = 0, first_bad = 0;
    for (size_t k = 0; k < K; k++) {
        group_weights(a, k);
        if (a->kind[k] == SUMO__ACGA_NONFINITE && nbad++ == 0) first_bad = k;
        if (a->kind[k] == SUMO__ACGA_UNIFORM) nuniform++;
    }
    if (nbad == K) {
        /* Nothing to combine: every rank knows it, so all skip the final allreduce alike. */
        SUMO__KCHECK(comm, sumo__k_fill(&x, SUMO_FLOAT32, g, NAN, count));
        if (a->group_off == NULL)
            return SUMO__COMM_FAIL(comm, SUMO_ERR_NONFINITE,
                                   "acga: NaN or Inf in the gradients (one coefficient for the "
                                   "whole buffer): the result is NaN");
        return SUMO__COMM_FAIL(comm, SUMO_ERR_NONFINITE,
                               "acga: NaN or Inf in tensor %zu (every one of the %zu tensors): "
                               "the result is NaN",
                               first_bad, K);
    }

    /* 5. The weighted sum of unit-normalised gradients. */
    for (size_t k = 0; k < K; k++) {
        if (a->kind[k] == SUMO__ACGA_NONFINITE) continue; /* overwritten with NaN below */
        size_t off, len;
        group_range(a, k, count, &off, &len);
        SUMO__KCHECK(comm, sumo__k_scaled_add(&x, SUMO_FLOAT32, g + off, a->coef[k], g + off, 0.0, len));
    }
    const bool all_uniform = nuniform == K;
    count_exchange(stats, count, SUMO_FLOAT32);
    SUMO__CHECK(sumo__allreduce_held(comm, g, g, count, SUMO_FLOAT32,
                                     all_uniform ? SUMO_OP_AVERAGE : SUMO_OP_SUM));
    for (size_t k = 0; k < K; k++) {
        size_t off, len;
        group_range(a, k, count, &off, &len);
        if (a->kind[k] == SUMO__ACGA_NONFINITE)
            SUMO__KCHECK(comm, sumo__k_fill(&x, SUMO_FLOAT32, g + off, NAN, len));
        else if (a->kind[k] == SUMO__ACGA_UNIFORM && !all_uniform)
            SUMO__KCHECK(comm, sumo__k_divide(&x, SUMO_FLOAT32, g + off, g + off, len, n));
    }

    /* 6. Optional rescale to the mean gradient's norm, with rank 0's factors. */
    if (a->o.rescale) {
        for (size_t k = 0; k < K; k++) {
            a->factor[k] = 1.0;
            if (a->kind[k] == SUMO__ACGA_NONFINITE) continue;
            size_t off, len;
            group_range(a, k, count, &off, &len);
            double dn[3];
            SUMO__KCHECK(comm, sumo__k_dot_norms(&x, SUMO_FLOAT32, g + off, g + off, len, dn));
            double gn = sqrt(dn[1]);
            if (gn > 0) a->factor[k] = (a->sum_norm[k] / n) / gn;
        }
        count_exchange(stats, K, SUMO_FLOAT64);
        SUMO__CHECK(sumo__broadcast_held(comm, a->factor, a->factor, K, SUMO_FLOAT64, 0));
        for (size_t k = 0; k < K; k++) {
            if (a->kind[k] == SUMO__ACGA_NONFINITE || a->factor[k] == 1.0) continue;
            size_t off, len;
            group_range(a, k, count, &off, &len);
            SUMO__KCHECK(comm, sumo__k_scaled_add(&x, SUMO_FLOAT32, g + off, a->factor[k], g + off,
                                                  0.0, len));
        }
    }

    if (nbad > 0)
        return SUMO__COMM_FAIL(comm, SUMO_ERR_NONFINITE,
                               "acga: NaN or Inf in tensor %zu (%zu of %zu tensors): those "
                               "tensors are NaN, the others are exact; the momentum was not "
                               "advanced",
                               first_bad, nbad, K);
    memcpy(a->m, a->m_next, (size_t)n * K * sizeof *a->m);
    a->initialised = 1;
    return SUMO_SUCCESS;
}

/* ---- state ------------------------------------------------------------------------------- */

static void put_u32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get_u32(const unsigned char *p)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}

static void put_f64(unsigned char *p, double d)
{
    uint64_t v;
    memcpy(&v, &d, sizeof v);
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static double get_f64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    double d;
    memcpy(&d, &v, sizeof d);
    return d;
}

size_t sumo__acga_state_size(const sumo__acga *a)
{
    return ACGA_HEADER_BYTES + (size_t)a->nranks * a->ngroups * sizeof(double);
}

sumo_result sumo__acga_state_save(const sumo__acga *a, void *buffer)
{
    unsigned char *p = buffer;
    put_u32(p, ACGA_MAGIC);
    put_u32(p + 4, ACGA_VERSION);
    put_u32(p + 8, (uint32_t)a->nranks);
    put_u32(p + 12, (uint32_t)a->ngroups);
    put_u32(p + 16, (uint32_t)a->initialised);
    put_u32(p + 20, 0);
    size_t nm = (size_t)a->nranks * a->ngroups;
    for (size_t i = 0; i < nm; i++) put_f64(p + ACGA_HEADER_BYTES + 8 * i, a->m[i]);
    return SUMO_SUCCESS;
}

sumo_result sumo__acga_state_load(sumo__acga *a, const void *buffer)
{
    const unsigned char *p = buffer;
    uint32_t magic = get_u32(p), version = get_u32(p + 4), n = get_u32(p + 8),
             k = get_u32(p + 12), init = get_u32(p + 16), reserved = get_u32(p + 20);
    if (magic != ACGA_MAGIC || version != ACGA_VERSION || reserved != 0 || init > 1)
        return SUMO__COMM_FAIL(a->comm, SUMO_ERR_INVALID_ARGUMENT,
                               "acga state: not an ACGA state of version %u (magic %08x, version "
                               "%u)",
                               ACGA_VERSION, magic, version);
    if (n != (uint32_t)a->nranks || k != (uint32_t)a->ngroups)
        return SUMO__COMM_FAIL(a->comm, SUMO_ERR_INVALID_ARGUMENT,
                               "acga state: saved for %u ranks x %u coefficient groups, this "
                               "aggregator has %d x %zu",
                               n, k, a->nranks, a->ngroups);
    size_t nm = (size_t)a->nranks * a->ngroups;
    for (size_t i = 0; i < nm; i++)
        if (!isfinite(get_f64(p + ACGA_HEADER_BYTES + 8 * i)))
            return SUMO__COMM_FAIL(a->comm, SUMO_ERR_INVALID_ARGUMENT,
                                   "acga state: momentum value %zu is not finite", i);
    for (size_t i = 0; i < nm; i++) a->m[i] = get_f64(p + ACGA_HEADER_BYTES + 8 * i);
    a->initialised = (int)init;
    return SUMO_SUCCESS;
}

/* ---- lifetime ---------------------------------------------------------------------------- */

void sumo__acga_destroy(sumo__acga *a)
{
    if (a == NULL) return;
    free(a->group_off);
    free(a->m);
    free(a->m_next);
    free(a->gathered);
    free(a->a);
    free(a->w);
    free(a->norm);
    free(a->sum_norm);
    free(a->coef);
    free(a->factor);
    free(a->kind);
    free(a->work);
    if (a->sum) a->sum_k->release(a->sum_k->ctx, a->sum);
    free(a);
}

static bool is_flag(int v) { return v == 0 || v == 1; }

sumo_result sumo__acga_create(sumo_comm *comm, const sumo_acga_options *o,
                              const size_t *tensor_counts, size_t ntensors, sumo__acga **out)
{
    char why[256];
    if (SUMO__STRUCT_SIZE_PROBLEM(o, sumo_acga_options, why, sizeof why))
        return SUMO__COMM_FAIL(comm, SUMO_ERR_INVALID_ARGUMENT, "acga: %s", why);
    if (!(o->beta >= 0.0 && o->beta < 1.0))
        return SUMO__COMM_FAIL(comm, SUMO_ERR_INVALID_ARGUMENT, "acga: beta %g is not in [0, 1)",
                               o->beta);
    if (!(o->eps >= 0.0 && isfinite(o->eps)))
        return SUMO__COMM_FAIL(comm, SUMO_ERR_INVALID_ARGUMENT,
                               "acga: eps %g is not finite and >= 0", o->eps);
    if (!is_flag(o->per_tensor) || !is_flag(o->reference_permutation) ||
        !is_flag(o->negative_guard) || !is_flag(o->rescale))
        return SUMO__COMM_FAIL(comm, SUMO_ERR_INVALID_ARGUMENT,
                               "acga: per_tensor, reference_permutation, negative_guard and "
                               "rescale must each be 0 or 1");
    int n = 0, rank = 0;
    SUMO__CHECK(sumo_comm_size(comm, &n));
    SUMO__CHECK(sumo_comm_rank(comm, &rank));
    const size_t K = o->per_tensor && ntensors > 0 ? ntensors : 1;
    /* The state header stores N and K in 32 bits. */
    if (K > UINT32_MAX || (uint64_t)n * K > SIZE_MAX / sizeof(double) / 4)
        return SUMO__COMM_FAIL(comm, SUMO_ERR_INVALID_ARGUMENT, "acga: %zu tensors is too many", K);

    sumo__acga *a = calloc(1, sizeof *a);
    if (a == NULL) return SUMO_ERR_SYSTEM;
    a->comm = comm;
    a->o = *o;
    a->nranks = n;
    a->rank = rank;
    a->ngroups = K;
    for (size_t t = 0; t < ntensors; t++) a->total += tensor_counts[t];
    const size_t nm = (size_t)n * K;
    bool ok = (a->m = calloc(nm, sizeof *a->m)) && (a->m_next = calloc(nm, sizeof *a->m_next)) &&
              (a->gathered = calloc(nm, sizeof *a->gathered)) &&
              (a->a = calloc((size_t)n, sizeof *a->a)) && (a->w = calloc((size_t)n, sizeof *a->w)) &&
              (a->norm = calloc(K, sizeof *a->norm)) &&
              (a->sum_norm = calloc(K, sizeof *a->sum_norm)) &&
              (a->coef = calloc(K, sizeof *a->coef)) &&
              (a->factor = calloc(K, sizeof *a->factor)) &&
              (a->kind = calloc(K, sizeof *a->kind)) &&
              (a->work = calloc(1, sumo__acga_gram_work_bytes(n)));
    if (ok && o->per_tensor && ntensors > 0) {
        ok = (a->group_off = malloc((K + 1) * sizeof *a->group_off)) != NULL;
        if (ok) {
            a->group_off[0] = 0;
            for (size_t k = 0; k < K; k++) a->group_off[k + 1] = a->group_off[k] + tensor_counts[k];
        }
    }
    /* With a layout the size is known: allocate s now, so apply never allocates. */
    if (ok && ntensors > 0) {
        const sumo__exec host = sumo__host_exec();
        ok = ensure_sum(a, &host, a->total) == SUMO_SUCCESS;
    }
    if (!ok) {
        sumo__acga_destroy(a);
        return SUMO__COMM_FAIL(comm, SUMO_ERR_SYSTEM, "acga: out of memory");
    }
    *out = a;
    return SUMO_SUCCESS;
}
