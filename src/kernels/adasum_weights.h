/*
 * Adasum's weights from one tensor's Gram matrix (collectives/adasum_gram.h says what they are,
 * why they equal the tree's, and where they are not trusted), one source for the host and the
 * device.
 *
 * Why this lives in kernels/ and is shared with the CUDA plugin, as codec.h is: the combine of
 * inputs that sit on one device computes the weights there, between its Gram pass and its
 * weighted sum, so that the Gram matrix, the weights and the accept decision never travel to
 * the host and back. The weights the device applies must be the host's to the bit (a rank on
 * the host path and a device combine of the same inputs agree; the emulator checks it), and a
 * second copy of ~200 lines of double arithmetic would be a second place to drift. So every
 * function is header-only and compiles as C11 and as CUDA C++ for both sides (SUMO__HD, as in
 * codec.h): plain double arithmetic in a fixed order, nothing from libm but sqrt and fabs,
 * IEEE division and square root (nvcc's defaults, kept), nothing a compiler may fuse (the host
 * builds with -ffp-contract=off or for a target without FMA, the plugin with -fmad=false), no
 * compound literals or designated initializers (C++ has neither), no header of src/ but sumo's
 * own.
 *
 * The tree is adasum.c's, read in coefficient space:
 *   participants: G = P / g, participant k = the average of ranks [k g, (k+1) g), so its
 *     coefficient vector is 1/g on those ranks (g = 1: the unit vector of rank k);
 *   fold: G2 = the largest power of two <= G, R = G - G2; slot k < R holds A(u_2k, u_2k+1),
 *     slot k >= R holds u_(k+R);
 *   tree: level by level over the slots, (0,1) (2,3) .. then their results pairwise, the lower
 *     slot on the left.
 * Slot k's node covers the ranks of a contiguous range of participants, so w[] holds every live
 * node's coefficients side by side, and a combine scales two neighbouring ranges in place.
 */
#ifndef SUMO_KERNELS_ADASUM_WEIGHTS_H
#define SUMO_KERNELS_ADASUM_WEIGHTS_H

#include "sumo.h"

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stddef.h>

#ifndef SUMO__HD
#ifdef __CUDACC__
#define SUMO__HD static __host__ __device__ __forceinline__
#else
#define SUMO__HD static inline
#endif
#endif

/* Packed Gram: the upper triangle row by row, (0,0) (0,1) .. (0,P-1) (1,1) .. (P-1,P-1). */
SUMO__HD size_t sumo__gram_len(int P) { return (size_t)P * (size_t)(P + 1) / 2; }
SUMO__HD size_t sumo__gram_index(int P, int i, int j)
{
    if (i > j) {
        int t = i;
        i = j;
        j = t;
    }
    return (size_t)i * (size_t)P - (size_t)i * (size_t)(i - 1) / 2 + (size_t)(j - i);
}

/* The accuracy sumo's Adasum asks of the Gram form's norms (the weights' `need`): 8 units
 * in the last place of the dtype the result is stored in; a tensor whose norms are less
 * certain is flagged SUMO__GRAM_INEXACT and combined by the tree instead. */
SUMO__HD double sumo__adasum_need(sumo_dtype dtype)
{
    switch (dtype) {
    case SUMO_FLOAT16: return 8 * 0x1p-10;
    case SUMO_BFLOAT16: return 8 * 0x1p-7;
    case SUMO_FLOAT32: return 8 * 0x1p-23;
    default: return 8 * 0x1p-52;
    }
}

/* Per-tensor flags (a bit set). */
enum {
    SUMO__GRAM_NONFINITE = 1, /* a Gram entry, or a norm or dot made from them, is not finite */
    SUMO__GRAM_CANCELLED = 2, /* the guard zeroed a node whose norm was small but not 0 */
    SUMO__GRAM_INEXACT = 4,   /* a node's norm is less accurate than `need` asked */
};

typedef struct sumo__adasum_gram_params {
    int nranks;     /* P >= 1 */
    int group_size; /* 1: flat; g > 1 (dividing P): the tree over the averages of g ranks */
    double need;    /* relative accuracy asked of every non-root norm; 0 flags nothing */
    double gram_err; /* relative error of the Gram entries, as a multiple of |g_i||g_j|; 0
                      * counts the weights' own rounding only */
} sumo__adasum_gram_params;

/* sqrt(DBL_MIN) = sqrt(2^-1022), exactly: Horovod's tiny-norm threshold, below which a
 * combine takes its operand whole; the tree (collectives/adasum.c) and the Gram form use this
 * one definition, so their coefficients agree. */
#define SUMO__ADASUM_TINY_NORM_SQ 0x1p-511

/*
 * Rounding noise of a node's squared norm, in ulps of s^2 per tree level: each level's norm is
 * cl^2 nL + 2 cl cr dot + cr^2 nR, three products and two sums over terms bounded by s^2, on
 * top of its operands' own errors (scaled by cl^2 and cr^2, also bounded by s^2).
 */
#define SUMO__ADASUM_NOISE_ULPS_PER_LEVEL 8.0

/* A node of the tree: what its parent's combine needs. */
typedef struct sumo__adasum_node {
    double n2; /* squared norm */
    double s;  /* sum_i |w_i| sqrt(G_ii): the norm without cancellation */
} sumo__adasum_node;

/* Doubles of work one tensor needs: a node per slot, at most P slots. */
SUMO__HD size_t sumo__adasum_gram_work_len(int P) { return 2 * (size_t)P; }

typedef struct sumo__adasum_run {
    const sumo__adasum_gram_params *p;
    const double *G; /* this tensor's packed Gram */
    double *w;       /* this tensor's weights */
    int P, g, R;
    bool bad;
    unsigned char flags;
} sumo__adasum_run;

SUMO__HD double sumo__adasum_gram_at(const sumo__adasum_run *t, int i, int j)
{
    return t->G[sumo__gram_index(t->P, i, j)];
}

/* First participant of slot k (slots past the last give G, so [first(k), first(k+1)) works). */
SUMO__HD int sumo__adasum_slot_first(const sumo__adasum_run *t, int k)
{
    return k < t->R ? 2 * k : k + t->R;
}

/* sum over i in [a,b), j in [c,d) of w_i w_j G_ij, rows then columns in increasing order. */
SUMO__HD double sumo__adasum_bilinear(const sumo__adasum_run *t, int a, int b, int c, int d)
{
    double acc = 0;
    for (int i = a; i < b; i++) {
        if (t->w[i] == 0) continue;
        double row = 0;
        for (int j = c; j < d; j++) row += t->w[j] * sumo__adasum_gram_at(t, i, j);
        acc += t->w[i] * row;
    }
    return acc;
}

SUMO__HD double sumo__adasum_abs_scale(const sumo__adasum_run *t, int a, int b)
{
    double s = 0;
    for (int i = a; i < b; i++) s += fabs(t->w[i]) * sqrt(sumo__adasum_gram_at(t, i, i));
    return s;
}

/*
 * Combines the node on ranks [a, m) (left) with the node on [m, b) (right) into *out, the tree's
 * pairwise rule with the guard and the trust check when the result is not the root.
 */
SUMO__HD void sumo__adasum_combine_dot(sumo__adasum_run *t, int a, int m, int b, double dot,
                                       const sumo__adasum_node *L, const sumo__adasum_node *Rn,
                                       sumo__adasum_node *out, int depth, bool root)
{
    /* out may be L: read the operands first. */
    const double nl = L->n2, nr = Rn->n2, sl = L->s, sr = Rn->s;
    if (!isfinite(dot) || !isfinite(nl) || !isfinite(nr)) {
        t->bad = true;
        return;
    }
    double cl = nl < SUMO__ADASUM_TINY_NORM_SQ ? 1.0 : 1.0 - dot / (2.0 * nl);
    double cr = nr < SUMO__ADASUM_TINY_NORM_SQ ? 1.0 : 1.0 - dot / (2.0 * nr);
    for (int i = a; i < m; i++) t->w[i] *= cl;
    for (int i = m; i < b; i++) t->w[i] *= cr;
    if (root) return;
    out->n2 = cl * cl * nl + 2.0 * cl * cr * dot + cr * cr * nr;
    out->s = fabs(cl) * sl + fabs(cr) * sr;
    if (!isfinite(out->n2) || !isfinite(out->s)) {
        t->bad = true;
        return;
    }
    double noise = (SUMO__ADASUM_NOISE_ULPS_PER_LEVEL * (depth + 1) * DBL_EPSILON + t->p->gram_err) *
                   out->s * out->s;
    /* Adasum(a, b) is 0 only for b = -a (otherwise Cauchy-Schwarz keeps a coefficient off 0),
     * and Gram entries summed in one order show b = -a as exactly negated values. A norm that
     * is merely small says nothing about how small: an exactly 0 n2 can hide a real residual. */
    const bool exact_zero = dot == -nl && nl == nr;
    if (exact_zero || out->n2 <= noise) {
        /* The zero vector, as the tree's a + (-a) is. */
        if (!exact_zero) t->flags |= SUMO__GRAM_CANCELLED;
        for (int i = a; i < b; i++) t->w[i] = 0;
        out->n2 = 0;
        out->s = 0;
    } else if (t->p->need > 0 && noise > t->p->need * out->n2) {
        t->flags |= SUMO__GRAM_INEXACT;
    }
}

SUMO__HD void sumo__adasum_combine(sumo__adasum_run *t, int a, int m, int b,
                                   const sumo__adasum_node *L, const sumo__adasum_node *Rn,
                                   sumo__adasum_node *out, int depth, bool root)
{
    sumo__adasum_combine_dot(t, a, m, b, sumo__adasum_bilinear(t, a, m, m, b), L, Rn, out, depth,
                             root);
}

/* Leaf: participant k, ranks [k g, (k+1) g) with weight 1/g each. */
SUMO__HD void sumo__adasum_leaf(sumo__adasum_run *t, int k, sumo__adasum_node *out)
{
    int a = k * t->g, b = a + t->g;
    for (int i = a; i < b; i++) t->w[i] = 1.0 / t->g;
    out->n2 = sumo__adasum_bilinear(t, a, b, a, b);
    out->s = sumo__adasum_abs_scale(t, a, b);
    if (!isfinite(out->n2)) t->bad = true;
}

SUMO__HD void sumo__adasum_one_tensor(sumo__adasum_run *t, sumo__adasum_node *slot)
{
    const int G = t->P / t->g;
    int G2 = 1;
    while (G2 * 2 <= G) G2 *= 2;
    t->R = G - G2;
    for (int k = 0; k < G2 && !t->bad; k++) {
        if (k < t->R) {
            sumo__adasum_node l, r;
            sumo__adasum_leaf(t, 2 * k, &l);
            sumo__adasum_leaf(t, 2 * k + 1, &r);
            if (!t->bad)
                sumo__adasum_combine(t, 2 * k * t->g, (2 * k + 1) * t->g, (2 * k + 2) * t->g, &l,
                                     &r, &slot[k], 0, false);
        } else {
            sumo__adasum_leaf(t, k + t->R, &slot[k]);
        }
    }
    int depth0 = t->R > 0 ? 1 : 0;
    for (int step = 1; step < G2 && !t->bad; step *= 2) {
        int depth = depth0;
        for (int s = step; s > 1; s >>= 1) depth++;
        for (int k = 0; k + step < G2 && !t->bad; k += 2 * step) {
            int a = sumo__adasum_slot_first(t, k) * t->g, m = sumo__adasum_slot_first(t, k + step) * t->g;
            /* k + 2 step <= G2: powers of two */
            int b = sumo__adasum_slot_first(t, k + 2 * step) * t->g;
            sumo__adasum_combine(t, a, m, b, &slot[k], &slot[k + step], &slot[k], depth,
                                 2 * step >= G2);
        }
    }
}

/* Two flat ranks: the tree is one combine at the root, of leaves with weights 1, so its norms
 * and dot are the Gram entries themselves (0 + 1 * x is x, up to the sign of a zero, which the
 * coefficients below do not see), and the root's norm is never used: combine's arithmetic
 * without its bookkeeping, for the many small tensors of a bucket. The caller checked that
 * every entry is finite. */
SUMO__HD void sumo__adasum_pair_weights(sumo__adasum_run *t)
{
    const double n0 = t->G[0], dot = t->G[1], n1 = t->G[2];
    t->w[0] = n0 < SUMO__ADASUM_TINY_NORM_SQ ? 1.0 : 1.0 - dot / (2.0 * n0);
    t->w[1] = n1 < SUMO__ADASUM_TINY_NORM_SQ ? 1.0 : 1.0 - dot / (2.0 * n1);
}

/*
 * Four flat ranks: one_tensor's tree, A(A(u0,u1), A(u2,u3)), with its loops unrolled and its
 * quadratic forms written out for weights known to be 1 at the leaves, for the many small
 * tensors of a bucket. Every expression is bilinear's and abs_scale's, operation for
 * operation (0 + 1 * x is kept, not folded to x), so the bits are one_tensor's. The caller
 * checked that every entry is finite.
 */
SUMO__HD void sumo__adasum_quad_weights(sumo__adasum_run *t)
{
    const double *G = t->G; /* packed: 00 01 02 03 11 12 13 22 23 33 */
    double *w = t->w;
    const double d00 = G[0], d11 = G[4], d22 = G[7], d33 = G[9];
    sumo__adasum_node slot[4];
    const double diag[4] = {d00, d11, d22, d33};
    for (int k = 0; k < 4; k++) {
        w[k] = 1.0;
        slot[k].n2 = 0.0 + 1.0 * (0.0 + 1.0 * diag[k]);
        slot[k].s = 0.0 + fabs(1.0) * sqrt(diag[k]);
    }
    sumo__adasum_combine_dot(t, 0, 1, 2, 0.0 + 1.0 * (0.0 + 1.0 * G[1]), &slot[0], &slot[1],
                             &slot[0], 0, false);
    if (t->bad) return;
    sumo__adasum_combine_dot(t, 2, 3, 4, 0.0 + 1.0 * (0.0 + 1.0 * G[8]), &slot[2], &slot[3],
                             &slot[2], 0, false);
    if (t->bad) return;
    /* bilinear(0, 2, 2, 4): rows 0 and 1 (skipped when zeroed), columns 2 and 3. */
    double dot = 0;
    if (w[0] != 0) dot += w[0] * ((0.0 + w[2] * G[2]) + w[3] * G[3]);
    if (w[1] != 0) dot += w[1] * ((0.0 + w[2] * G[5]) + w[3] * G[6]);
    sumo__adasum_combine_dot(t, 0, 2, 4, dot, &slot[0], &slot[2], &slot[0], 1, true);
}

/*
 * One tensor: its packed Gram G (sumo__gram_len(P) doubles) in, its P weights w out (w_i is
 * rank i's weight), its flags returned. A non-finite tensor gets NaN weights and
 * SUMO__GRAM_NONFINITE, as the tree gives it a NaN result. slot: P nodes of work.
 */
SUMO__HD unsigned char sumo__adasum_gram_weights_one(const sumo__adasum_gram_params *p,
                                                     const double *G, double *w,
                                                     sumo__adasum_node *slot)
{
    const int P = p->nranks;
    const size_t len = sumo__gram_len(P);
    sumo__adasum_run r;
    r.p = p;
    r.G = G;
    r.w = w;
    r.P = P;
    r.g = p->group_size > 0 ? p->group_size : 1;
    r.R = 0;
    r.bad = false;
    r.flags = 0;
    for (size_t e = 0; e < len; e++)
        if (!isfinite(r.G[e])) r.bad = true;
    if (!r.bad && P == 2 && r.g == 1) sumo__adasum_pair_weights(&r);
    else if (!r.bad && P == 4 && r.g == 1) sumo__adasum_quad_weights(&r);
    else if (!r.bad) sumo__adasum_one_tensor(&r, slot);
    if (r.bad) {
        for (int i = 0; i < P; i++) r.w[i] = NAN;
        r.flags = SUMO__GRAM_NONFINITE;
    }
    return r.flags;
}

#endif
