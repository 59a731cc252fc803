/*
 * ACGA in Gram form (docs/design/adasum.md, the Gram form): one step's weights from each group's P x P Gram
 * matrix G_ij = <g_i, g_j>, so a step needs one pass for the Gram partials, one small allreduce
 * and one weighted-sum pass, instead of acga.c's two full-size allreduces.
 *
 * Same math as acga.c (docs/design/acga.md), with every inner product read off G:
 *   <g_r, s> = sum_j G_rj (s = sum_j g_j),  |g_r| = sqrt(G_rr),  |s|^2 = sum_ij G_ij,
 *   |sum_r c_r g_r|^2 = c^T G c (the optional rescale).
 * a_r = <g_r, s> / (|g_r| + eps) / N (0 when |g_r| + eps == 0), the stable sort, the EMA of the
 * sorted values, the mapping back (rank preserving or the sample code's), the negative guard,
 * w = a' / sum(a'), or uniform 1/N when sum(a') <= 1e-6 sum|a'|; the coefficient of rank r is
 * then w_r / (|g_r| + eps), and the rescale multiplies a group's coefficients by
 * (|s| / N) / |G|. The only difference from acga.c is where the inner products come from:
 * acga.c dots g_r with the fp32-rounded sum and norms the fp32-rounded result; here both are
 * exact functions of G. Results agree within fp32 rounding.
 *
 * Deterministic: plain double arithmetic in a fixed order, sqrt the only libm call, so every
 * rank holding the same Gram bits computes the same coefficients. The rescale needs no
 * broadcast (acga.c broadcasts because its norm comes from a CPU-dependent vector sum).
 */
#ifndef SUMO_ACGA_GRAM_H
#define SUMO_ACGA_GRAM_H

#include "sumo_aggregation.h"

#include <stddef.h>

enum { SUMO__ACGA_WEIGHTED = 0, SUMO__ACGA_UNIFORM = 1, SUMO__ACGA_NONFINITE = 2 };

/* Bytes of work one call needs for N ranks. */
size_t sumo__acga_gram_work_bytes(int nranks);

/*
 * Step 4 of one group, the one place it is written (both forms call it): from the N
 * coefficients a_r of every rank, the sort (ascending, ties by rank), the EMA of the sorted
 * values (m_next from m, or the values themselves before the first step), the mapping back
 * (rank preserving, or the sample code's m[idx]), the negative guard and the normalisation.
 * Returns SUMO__ACGA_NONFINITE when an a_r is not finite (m_next untouched),
 * SUMO__ACGA_UNIFORM when the coefficient sum is at or below 1e-6 of the sum of magnitudes
 * (the caller then weighs every rank 1/N; *sum and *l1 say why), else SUMO__ACGA_WEIGHTED with
 * w[r] = a'_r / sum(a'). work: sumo__acga_gram_work_bytes(N).
 */
int sumo__acga_group_weights(const sumo_acga_options *o, int nranks, const double *a,
                             const double *m, int initialised, double *m_next, double *w,
                             double *sum, double *l1, void *work);

/*
 * One step for K groups of N ranks: gram holds K packed Gram matrices (adasum_gram.h's layout,
 * N(N+1)/2 doubles each); m is the committed EMA (N*K, group-major, as acga.c keeps it) and
 * initialised says whether it holds a value. Writes m_next (N*K), coef (N*K, group-major:
 * group k's result is sum_r coef[k N + r] g_r) and kind[k]. A non-finite group gets NaN
 * coefficients. Returns the first non-finite group, or SIZE_MAX; the caller commits m_next
 * only when no group was non-finite, as acga.c does.
 */
size_t sumo__acga_gram_weights(const sumo_acga_options *o, int nranks, size_t ngroups,
                               const double *gram, const double *m, int initialised,
                               double *m_next, double *coef, unsigned char *kind, void *work);

#endif
