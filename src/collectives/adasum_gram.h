/*
 * Adasum in Gram form (docs/design/adasum.md, the Gram form): the weights w such that sum_i w_i g_i is what
 * sumo's Adasum tree (collectives/adasum.c, docs/design/adasum.md) computes for P ranks, found
 * from the P x P Gram matrix G_ij = <g_i, g_j> of each tensor alone. No data, no transport: the
 * caller forms the Gram partials in one pass (sumo__kernel_gram_partials), sums them in one
 * small allreduce, calls this on every rank (same bits in, same bits out: plain double
 * arithmetic in a fixed order, nothing from libm but sqrt), and applies the weights in a second
 * pass (sumo__kernel_weighted_sum).
 *
 * Why it is exact: every combine of the tree is linear in its operands with scalar
 * coefficients, so every node of the tree is sum_i c_i g_i for a coefficient vector c, and the
 * dot products and squared norms a combine needs are quadratic forms of those vectors in G.
 * The tree's nodes cover contiguous ranges of ranks, so all live coefficient vectors fit in one
 * array of P doubles.
 *
 * Where it is not: a node's squared norm, as a quadratic form, cancels when the node is much
 * shorter than its operands (the tree's Adasum(a, -a) is exactly 0; a quadratic form of
 * slightly inconsistent inputs is rounding noise, and the next level divides by it). Two rules:
 *   - Guard (relative): a non-root node whose squared norm is at or below the rounding noise
 *     of its quadratic form, SUMO__GRAM_NOISE_ULPS(level) ulps of s^2 with s = sum_i |c_i|
 *     sqrt(G_ii) (the norm the node would have if nothing cancelled), is treated as the zero
 *     vector: its coefficients become 0, so the level above takes the other operand whole, as
 *     the tree's tiny-norm rule does with an exact zero. A norm of exactly 0 is an exact
 *     cancellation (consistent Gram entries of a and -a give it) and is not flagged; a
 *     positive one under the guard sets SUMO__GRAM_CANCELLED, because the tree would have
 *     used the short residual instead.
 *   - Trust: a non-root node whose squared norm carries a relative error above `need` (the
 *     estimate is noise / norm^2) sets SUMO__GRAM_INEXACT. The result's relative error is of
 *     that order (an error r in |x_L|^2 moves the level's result by up to r |x_R| / 2). A
 *     caller asks for about the dtype's epsilon and runs the VHDD tree for flagged tensors.
 * The root's own norm is never used, so it is neither guarded nor flagged.
 */
#ifndef SUMO_ADASUM_GRAM_H
#define SUMO_ADASUM_GRAM_H

/* The per-tensor math, shared with the CUDA plugin's device combine (it says why): the packed
 * Gram's layout, the flags, the parameters, the work a tensor needs. */
#include "kernels/adasum_weights.h"

#include <stddef.h>

/*
 * For each of ntensors tensors: gram + t * sumo__gram_len(P) in, w + t * P out (w_i is rank
 * i's weight), flags[t] out (flags may be NULL). A non-finite tensor gets NaN weights, as the
 * tree gives it a NaN result. Returns the first non-finite tensor, or SIZE_MAX.
 */
#ifdef __cplusplus
extern "C" { /* the CUDA benchmark weighs as a collective does */
#endif
size_t sumo__adasum_gram_weights(const sumo__adasum_gram_params *p, const double *gram,
                                 size_t ntensors, double *w, unsigned char *flags, double *work);
#ifdef __cplusplus
}
#endif

#endif
