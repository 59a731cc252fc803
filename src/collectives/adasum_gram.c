/*
 * Adasum's weights from the Gram matrix (adasum_gram.h). The tree is adasum.c's, read in
 * coefficient space:
 *   participants: G = P / g, participant k = the average of ranks [k g, (k+1) g), so its
 *     coefficient vector is 1/g on those ranks (g = 1: the unit vector of rank k);
 *   fold: G2 = the largest power of two <= G, R = G - G2; slot k < R holds A(u_2k, u_2k+1),
 *     slot k >= R holds u_(k+R);
 *   tree: level by level over the slots, (0,1) (2,3) .. then their results pairwise, the lower
 *     slot on the left.
 * Slot k's node covers the ranks of a contiguous range of participants, so w[] holds every live
 * node's coefficients side by side, and a combine scales two neighbouring ranges in place.
 */
#include "collectives/adasum_gram.h"

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>

/* sqrt(DBL_MIN), the tree's tiny-norm threshold (adasum.c's TINY_NORM_SQ). */
#define TINY_NORM_SQ 0x1p-511

/*
 * Rounding noise of a node's squared norm, in ulps of s^2 per tree level: each level's norm is
 * cl^2 nL + 2 cl cr dot + cr^2 nR, three products and two sums over terms bounded by s^2, on
 * top of its operands' own errors (scaled by cl^2 and cr^2, also bounded by s^2).
 */
#define NOISE_ULPS_PER_LEVEL 8.0

typedef struct node {
    double n2; /* squared norm */
    double s;  /* sum_i |w_i| sqrt(G_ii): the norm without cancellation */
} node;

typedef struct tensor_run {
    const sumo__adasum_gram_params *p;
    const double *G; /* this tensor's packed Gram */
    double *w;       /* this tensor's weights */
    int P, g, R;
    bool bad;
    unsigned char flags;
} tensor_run;

static double gram_at(const tensor_run *t, int i, int j) { return t->G[sumo__gram_index(t->P, i, j)]; }

/* First participant of slot k (slots past the last give G, so [first(k), first(k+1)) works). */
static int slot_first(const tensor_run *t, int k) { return k < t->R ? 2 * k : k + t->R; }

/* sum over i in [a,b), j in [c,d) of w_i w_j G_ij, rows then columns in increasing order. */
static double bilinear(const tensor_run *t, int a, int b, int c, int d)
{
    double acc = 0;
    for (int i = a; i < b; i++) {
        if (t->w[i] == 0) continue;
        double row = 0;
        for (int j = c; j < d; j++) row += t->w[j] * gram_at(t, i, j);
        acc += t->w[i] * row;
    }
    return acc;
}

static double abs_scale(const tensor_run *t, int a, int b)
{
    double s = 0;
    for (int i = a; i < b; i++) s += fabs(t->w[i]) * sqrt(gram_at(t, i, i));
    return s;
}

/*
 * Combines the node on ranks [a, m) (left) with the node on [m, b) (right) into *out, the tree's
 * pairwise rule with the guard and the trust check when the result is not the root.
 */
static void combine_dot(tensor_run *t, int a, int m, int b, double dot, const node *L,
                        const node *Rn, node *out, int depth, bool root)
{
    /* out may be L: read the operands first. */
    const double nl = L->n2, nr = Rn->n2, sl = L->s, sr = Rn->s;
    if (!isfinite(dot) || !isfinite(nl) || !isfinite(nr)) {
        t->bad = true;
        return;
    }
    double cl = nl < TINY_NORM_SQ ? 1.0 : 1.0 - dot / (2.0 * nl);
    double cr = nr < TINY_NORM_SQ ? 1.0 : 1.0 - dot / (2.0 * nr);
    for (int i = a; i < m; i++) t->w[i] *= cl;
    for (int i = m; i < b; i++) t->w[i] *= cr;
    if (root) return;
    out->n2 = cl * cl * nl + 2.0 * cl * cr * dot + cr * cr * nr;
    out->s = fabs(cl) * sl + fabs(cr) * sr;
    if (!isfinite(out->n2) || !isfinite(out->s)) {
        t->bad = true;
        return;
    }
    double noise = (NOISE_ULPS_PER_LEVEL * (depth + 1) * DBL_EPSILON + t->p->gram_err) * out->s * out->s;
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

static void combine(tensor_run *t, int a, int m, int b, const node *L, const node *Rn, node *out,
                    int depth, bool root)
{
    combine_dot(t, a, m, b, bilinear(t, a, m, m, b), L, Rn, out, depth, root);
}

/* Leaf: participant k, ranks [k g, (k+1) g) with weight 1/g each. */
static void leaf(tensor_run *t, int k, node *out)
{
    int a = k * t->g, b = a + t->g;
    for (int i = a; i < b; i++) t->w[i] = 1.0 / t->g;
    out->n2 = bilinear(t, a, b, a, b);
    out->s = abs_scale(t, a, b);
    if (!isfinite(out->n2)) t->bad = true;
}

static void one_tensor(tensor_run *t, node *slot)
{
    const int G = t->P / t->g;
    int G2 = 1;
    while (G2 * 2 <= G) G2 *= 2;
    t->R = G - G2;
    for (int k = 0; k < G2 && !t->bad; k++) {
        if (k < t->R) {
            node l, r;
            leaf(t, 2 * k, &l);
            leaf(t, 2 * k + 1, &r);
            if (!t->bad)
                combine(t, 2 * k * t->g, (2 * k + 1) * t->g, (2 * k + 2) * t->g, &l, &r, &slot[k],
                        0, false);
        } else {
            leaf(t, k + t->R, &slot[k]);
        }
    }
    int depth0 = t->R > 0 ? 1 : 0;
    for (int step = 1; step < G2 && !t->bad; step *= 2) {
        int depth = depth0;
        for (int s = step; s > 1; s >>= 1) depth++;
        for (int k = 0; k + step < G2 && !t->bad; k += 2 * step) {
            int a = slot_first(t, k) * t->g, m = slot_first(t, k + step) * t->g;
            int b = slot_first(t, k + 2 * step) * t->g; /* k + 2 step <= G2: powers of two */
            combine(t, a, m, b, &slot[k], &slot[k + step], &slot[k], depth, 2 * step >= G2);
        }
    }
}

/* Two flat ranks: the tree is one combine at the root, of leaves with weights 1, so its norms
 * and dot are the Gram entries themselves (0 + 1 * x is x, up to the sign of a zero, which the
 * coefficients below do not see), and the root's norm is never used: combine's arithmetic
 * without its bookkeeping, for the many small tensors of a bucket. The caller checked that
 * every entry is finite. */
static void pair_weights(tensor_run *t)
{
    const double n0 = t->G[0], dot = t->G[1], n1 = t->G[2];
    t->w[0] = n0 < TINY_NORM_SQ ? 1.0 : 1.0 - dot / (2.0 * n0);
    t->w[1] = n1 < TINY_NORM_SQ ? 1.0 : 1.0 - dot / (2.0 * n1);
}

/*
 * Four flat ranks: one_tensor's tree, A(A(u0,u1), A(u2,u3)), with its loops unrolled and its
 * quadratic forms written out for weights known to be 1 at the leaves, for the many small
 * tensors of a bucket. Every expression is bilinear's and abs_scale's, operation for
 * operation (0 + 1 * x is kept, not folded to x), so the bits are one_tensor's. The caller
 * checked that every entry is finite.
 */
static void quad_weights(tensor_run *t)
{
    const double *G = t->G; /* packed: 00 01 02 03 11 12 13 22 23 33 */
    double *w = t->w;
    const double d00 = G[0], d11 = G[4], d22 = G[7], d33 = G[9];
    node slot[4];
    const double diag[4] = {d00, d11, d22, d33};
    for (int k = 0; k < 4; k++) {
        w[k] = 1.0;
        slot[k].n2 = 0.0 + 1.0 * (0.0 + 1.0 * diag[k]);
        slot[k].s = 0.0 + fabs(1.0) * sqrt(diag[k]);
    }
    combine_dot(t, 0, 1, 2, 0.0 + 1.0 * (0.0 + 1.0 * G[1]), &slot[0], &slot[1], &slot[0], 0, false);
    if (t->bad) return;
    combine_dot(t, 2, 3, 4, 0.0 + 1.0 * (0.0 + 1.0 * G[8]), &slot[2], &slot[3], &slot[2], 0, false);
    if (t->bad) return;
    /* bilinear(0, 2, 2, 4): rows 0 and 1 (skipped when zeroed), columns 2 and 3. */
    double dot = 0;
    if (w[0] != 0) dot += w[0] * ((0.0 + w[2] * G[2]) + w[3] * G[3]);
    if (w[1] != 0) dot += w[1] * ((0.0 + w[2] * G[5]) + w[3] * G[6]);
    combine_dot(t, 0, 2, 4, dot, &slot[0], &slot[2], &slot[0], 1, true);
}

/*
 * pair_weights and quad_weights over LANES tensors at a time, lane l computing tensor l's
 * scalar expressions operation for operation: the tensors are independent, and one tensor's
 * weights are a chain of divisions, square roots and their uses that leaves the FP units idle
 * (four flat ranks: about 40 ns a tensor, the cost of the partials of a small bucket). Side
 * by side the chains overlap, and the compiler may run the lanes in vector registers: IEEE
 * division, square root, products and sums round alike in either. The branches become
 * selects, so a lane computes on after it went non-finite (without traps, no effect), and is
 * then given NaN weights and the flag as the scalar code gives them.
 */
#define LANES 4

static bool all_finite(const double *G, size_t len)
{
    bool ok = true;
    for (size_t e = 0; e < len; e++) ok &= isfinite(G[e]) != 0;
    return ok;
}

static void lanes_done(size_t t0, const bool *bad, int P, double *w, unsigned char *flags,
                       const unsigned char *fl, size_t *first_bad)
{
    for (int l = 0; l < LANES; l++) {
        if (bad[l]) {
            for (int i = 0; i < P; i++) w[(t0 + (size_t)l) * (size_t)P + (size_t)i] = NAN;
            if (*first_bad == SIZE_MAX) *first_bad = t0 + (size_t)l;
        }
        if (flags) flags[t0 + (size_t)l] = bad[l] ? SUMO__GRAM_NONFINITE : fl[l];
    }
}

/* Returns the tensors done: whole groups of LANES; the caller does the rest one by one. */
static size_t pair_lanes(const double *gram, size_t ntensors, double *w, unsigned char *flags,
                         size_t *first_bad)
{
    size_t t0 = 0;
    for (; t0 + LANES <= ntensors; t0 += LANES) {
        bool bad[LANES];
        const unsigned char fl[LANES] = {0};
        for (int l = 0; l < LANES; l++) {
            const double *G = gram + (t0 + (size_t)l) * 3;
            const double n0 = G[0], dot = G[1], n1 = G[2];
            double *wt = w + (t0 + (size_t)l) * 2;
            bad[l] = !all_finite(G, 3);
            wt[0] = n0 < TINY_NORM_SQ ? 1.0 : 1.0 - dot / (2.0 * n0);
            wt[1] = n1 < TINY_NORM_SQ ? 1.0 : 1.0 - dot / (2.0 * n1);
        }
        lanes_done(t0, bad, 2, w, flags, fl, first_bad);
    }
    return t0;
}

/*
 * combine_dot of the non-root levels for lane arrays: operands (nl, sl) and (nr, sr), the
 * result in place of the left one, the coefficients in cl, cr, bookkeeping in bad and fl.
 * wl and wr: the weights of the two sides (one rank each at the leaves' level).
 */
static void lanes_combine(const sumo__adasum_gram_params *p, const double *dot, double *nl,
                          double *sl, const double *nr, const double *sr, double *wl, double *wr,
                          int depth, bool *bad, unsigned char *fl)
{
    for (int l = 0; l < LANES; l++) {
        const double d = dot[l], a = nl[l], b = nr[l], sa = sl[l], sb = sr[l];
        bad[l] |= !isfinite(d) || !isfinite(a) || !isfinite(b);
        double cl = a < TINY_NORM_SQ ? 1.0 : 1.0 - d / (2.0 * a);
        double cr = b < TINY_NORM_SQ ? 1.0 : 1.0 - d / (2.0 * b);
        double wa = wl[l] * cl, wb = wr[l] * cr;
        double n2 = cl * cl * a + 2.0 * cl * cr * d + cr * cr * b;
        double s = fabs(cl) * sa + fabs(cr) * sb;
        bad[l] |= !isfinite(n2) || !isfinite(s);
        double noise = (NOISE_ULPS_PER_LEVEL * (depth + 1) * DBL_EPSILON + p->gram_err) * s * s;
        const bool exact_zero = d == -a && a == b;
        const bool zero = exact_zero || n2 <= noise;
        if (zero && !exact_zero) fl[l] |= SUMO__GRAM_CANCELLED;
        else if (!zero && p->need > 0 && noise > p->need * n2) fl[l] |= SUMO__GRAM_INEXACT;
        wl[l] = zero ? 0 : wa;
        wr[l] = zero ? 0 : wb;
        nl[l] = zero ? 0 : n2;
        sl[l] = zero ? 0 : s;
    }
}

static size_t quad_lanes(const sumo__adasum_gram_params *p, const double *gram, size_t ntensors,
                         double *w, unsigned char *flags, size_t *first_bad)
{
    size_t t0 = 0;
    for (; t0 + LANES <= ntensors; t0 += LANES) {
        bool bad[LANES];
        unsigned char fl[LANES] = {0};
        double n2[4][LANES], s[4][LANES], wk[4][LANES], d01[LANES], d23[LANES];
        for (int l = 0; l < LANES; l++) {
            const double *G = gram + (t0 + (size_t)l) * 10; /* 00 01 02 03 11 12 13 22 23 33 */
            const double diag[4] = {G[0], G[4], G[7], G[9]};
            bad[l] = !all_finite(G, 10);
            for (int k = 0; k < 4; k++) {
                wk[k][l] = 1.0;
                n2[k][l] = 0.0 + 1.0 * (0.0 + 1.0 * diag[k]);
                s[k][l] = 0.0 + fabs(1.0) * sqrt(diag[k]);
            }
            d01[l] = 0.0 + 1.0 * (0.0 + 1.0 * G[1]);
            d23[l] = 0.0 + 1.0 * (0.0 + 1.0 * G[8]);
        }
        lanes_combine(p, d01, n2[0], s[0], n2[1], s[1], wk[0], wk[1], 0, bad, fl);
        lanes_combine(p, d23, n2[2], s[2], n2[3], s[3], wk[2], wk[3], 0, bad, fl);
        for (int l = 0; l < LANES; l++) {
            const double *G = gram + (t0 + (size_t)l) * 10;
            const double w0 = wk[0][l], w1 = wk[1][l], w2 = wk[2][l], w3 = wk[3][l];
            /* bilinear(0, 2, 2, 4): rows 0 and 1 (skipped when zeroed), columns 2 and 3. */
            double dot = 0;
            const double r0 = w0 * ((0.0 + w2 * G[2]) + w3 * G[3]);
            const double r1 = w1 * ((0.0 + w2 * G[5]) + w3 * G[6]);
            if (w0 != 0) dot += r0;
            if (w1 != 0) dot += r1;
            /* The root: combine_dot's coefficients alone. */
            const double a = n2[0][l], b = n2[2][l];
            bad[l] |= !isfinite(dot) || !isfinite(a) || !isfinite(b);
            double cl = a < TINY_NORM_SQ ? 1.0 : 1.0 - dot / (2.0 * a);
            double cr = b < TINY_NORM_SQ ? 1.0 : 1.0 - dot / (2.0 * b);
            double *wt = w + (t0 + (size_t)l) * 4;
            wt[0] = w0 * cl;
            wt[1] = w1 * cl;
            wt[2] = w2 * cr;
            wt[3] = w3 * cr;
        }
        lanes_done(t0, bad, 4, w, flags, fl, first_bad);
    }
    return t0;
}

#undef LANES

size_t sumo__adasum_gram_weights(const sumo__adasum_gram_params *p, const double *gram,
                                 size_t ntensors, double *w, unsigned char *flags, double *work)
{
    const int P = p->nranks;
    const size_t len = sumo__gram_len(P);
    size_t first_bad = SIZE_MAX;
    node *slot = (node *)(void *)work; /* 2 doubles per slot, at most P slots */
    size_t t = 0;
    if (P == 2 && p->group_size <= 1) t = pair_lanes(gram, ntensors, w, flags, &first_bad);
    else if (P == 4 && p->group_size <= 1) t = quad_lanes(p, gram, ntensors, w, flags, &first_bad);
    for (; t < ntensors; t++) {
        tensor_run r = {.p = p, .G = gram + t * len, .w = w + t * (size_t)P, .P = P,
                        .g = p->group_size > 0 ? p->group_size : 1};
        for (size_t e = 0; e < len; e++)
            if (!isfinite(r.G[e])) r.bad = true;
        if (!r.bad && P == 2 && r.g == 1) pair_weights(&r);
        else if (!r.bad && P == 4 && r.g == 1) quad_weights(&r);
        else if (!r.bad) one_tensor(&r, slot);
        if (r.bad) {
            for (int i = 0; i < P; i++) r.w[i] = NAN;
            r.flags = SUMO__GRAM_NONFINITE;
            if (first_bad == SIZE_MAX) first_bad = t;
        }
        if (flags) flags[t] = r.flags;
    }
    return first_bad;
}
