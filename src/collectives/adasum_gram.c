/*
 * Adasum's weights from the Gram matrix (adasum_gram.h): the tree's math is
 * kernels/adasum_weights.h's, one source with the CUDA plugin's device combine; two and four
 * flat ranks take it four tensors side by side here (the host's many small tensors).
 */
#include "collectives/adasum_gram.h"

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>

/*
 * adasum_weights.h's pair and quad weights over LANES tensors at a time, lane l computing
 * tensor l's scalar expressions operation for operation: the tensors are independent, and one tensor's
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
            wt[0] = n0 < SUMO__ADASUM_TINY_NORM_SQ ? 1.0 : 1.0 - dot / (2.0 * n0);
            wt[1] = n1 < SUMO__ADASUM_TINY_NORM_SQ ? 1.0 : 1.0 - dot / (2.0 * n1);
        }
        lanes_done(t0, bad, 2, w, flags, fl, first_bad);
    }
    return t0;
}

/*
 * sumo__adasum_combine_dot of the non-root levels for lane arrays: operands (nl, sl) and (nr, sr), the
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
        double cl = a < SUMO__ADASUM_TINY_NORM_SQ ? 1.0 : 1.0 - d / (2.0 * a);
        double cr = b < SUMO__ADASUM_TINY_NORM_SQ ? 1.0 : 1.0 - d / (2.0 * b);
        double wa = wl[l] * cl, wb = wr[l] * cr;
        double n2 = cl * cl * a + 2.0 * cl * cr * d + cr * cr * b;
        double s = fabs(cl) * sa + fabs(cr) * sb;
        bad[l] |= !isfinite(n2) || !isfinite(s);
        double noise = (SUMO__ADASUM_NOISE_ULPS_PER_LEVEL * (depth + 1) * DBL_EPSILON + p->gram_err) * s * s;
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
            /* The root: sumo__adasum_combine_dot's coefficients alone. */
            const double a = n2[0][l], b = n2[2][l];
            bad[l] |= !isfinite(dot) || !isfinite(a) || !isfinite(b);
            double cl = a < SUMO__ADASUM_TINY_NORM_SQ ? 1.0 : 1.0 - dot / (2.0 * a);
            double cr = b < SUMO__ADASUM_TINY_NORM_SQ ? 1.0 : 1.0 - dot / (2.0 * b);
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
    /* 2 doubles per slot, at most P slots */
    sumo__adasum_node *slot = (sumo__adasum_node *)(void *)work;
    size_t t = 0;
    if (P == 2 && p->group_size <= 1) t = pair_lanes(gram, ntensors, w, flags, &first_bad);
    else if (P == 4 && p->group_size <= 1) t = quad_lanes(p, gram, ntensors, w, flags, &first_bad);
    for (; t < ntensors; t++) {
        unsigned char f = sumo__adasum_gram_weights_one(p, gram + t * len, w + t * (size_t)P, slot);
        if ((f & SUMO__GRAM_NONFINITE) && first_bad == SIZE_MAX) first_bad = t;
        if (flags) flags[t] = f;
    }
    return first_bad;
}
