/*
 * Per-element math on buffers: the only code that touches every byte of a gradient, so it is
 * vectorised (AVX-512 and AVX2 with a portable baseline, picked at run time) and allocates
 * nothing. fp16 and bf16 are widened to fp32, combined, and rounded once to nearest even.
 *
 * Aliasing: an output may be the same pointer as an input (element i read before element i
 * written); partial overlaps are the caller's bug.
 */
#ifndef SUMO_KERNELS_H
#define SUMO_KERNELS_H

#include "common/common.h"
/* The scalar conversions (sumo__half_to_float, sumo__float_to_bf16, sumo__double_to_half, ..):
 * exact references for tests, the portable loops' rounding and the vector paths' tails. */
#include "kernels/codec.h"

/*
 * outs[k][i] = (ins[0][i] + ins[1][i] + ... + ins[nin-1][i]) / divisor, for every k < nout.
 * Summed left to right in that order (fp32 accumulator for fp16/bf16, native for fp32/fp64);
 * divisor 1 skips the division, otherwise the sum is divided once (correctly rounded in the
 * accumulator type). nin >= 1, nout >= 1. Any outs[k] may equal any ins[j].
 */
void sumo__reduce_multi(sumo_dtype dtype, void *const *outs, int nout, const void *const *ins,
                        int nin, size_t n, int divisor);

/* dst[i] = a[i] + b[i] (the two-input case above, for the ring). */
void sumo__kernel_add(sumo_dtype dtype, void *dst, const void *a, const void *b, size_t n);

/* dst[i] = src[i] / divisor, correctly rounded in the accumulator type. */
void sumo__kernel_divide(sumo_dtype dtype, void *dst, const void *src, size_t n, int divisor);

/* dst = src converted between dtypes (RNE when narrowing; NaN stays NaN, overflow gives Inf). */
void sumo__kernel_convert(sumo_dtype dst_dtype, void *dst, sumo_dtype src_dtype, const void *src,
                          size_t n);

/*
 * Adasum's fused pass: reads a and b once and returns, accumulated in double,
 * out[0] = a.b, out[1] = |a|^2, out[2] = |b|^2.
 */
void sumo__kernel_dot_norms(sumo_dtype dtype, const void *a, const void *b, size_t n,
                            double out[3]);

/*
 * a[i] = ca * a[i] + cb * b[i]. fp32/fp64: evaluated in double, rounded once. fp16/bf16:
 * widened to fp32, fmaf(ca, a, cb * b) in fp32, rounded to nearest even.
 */
void sumo__kernel_scaled_add(sumo_dtype dtype, void *a, double ca, const void *b, double cb,
                             size_t n);

/*
 * The Gram form's first pass: for nin inputs of n elements, the packed upper
 * triangle of their Gram matrix, out[(i,j)] = <ins[i], ins[j]> for i <= j, row by row
 * ((0,0) (0,1) .. (0,nin-1) (1,1) ..; collectives/adasum_gram.h's sumo__gram_index), accumulated
 * in double, reading every input once. Overwrites the nin(nin+1)/2 doubles of out; summation
 * order depends on n, nin and the ISA path, never on alignment. 1 <= nin <= SUMO__GRAM_MAX_IN.
 */
#define SUMO__GRAM_MAX_IN 16
void sumo__kernel_gram_partials(sumo_dtype dtype, const void *const *ins, int nin, size_t n,
                                double *out);

/*
 * The Gram form's second pass: v[i] = w[0] ins[0][i] + ... + w[nin-1] ins[nin-1][i], in that
 * order with fused multiply-adds, rounded once to the dtype, stored to every outs[k][i].
 * fp32/fp64: in double. fp16/bf16: in fp32 with the weights narrowed to float, unless a weight
 * is outside float's normal range, then in double (as sumo__kernel_scaled_add). Each element's
 * inputs are read before any output's element is written, so an output may be the same
 * pointer as any input. Storing to every output from registers, as reduce_multi does, costs
 * less than writing one and copying it: the copy reads the result back and, where the outputs
 * belong to other cores' ranks, takes its lines over a second time.
 * 1 <= nin, nout <= SUMO__GRAM_MAX_IN.
 */
void sumo__kernel_weighted_sum(sumo_dtype dtype, void *const *outs, int nout,
                               const void *const *ins, const double *w, int nin, size_t n);

/*
 * Both passes over the tensors of a layout (offsets: ntensors + 1 prefix sums) that meet
 * elements [lo, hi), ins[k] and outs[k] pointing at element lo: for each tensor piece, the
 * partials added to gram + t * nin(nin+1)/2, or the weighted sum with the weights
 * w + t * nin. The same per-piece calls as the kernels above, dispatched once.
 */
void sumo__kernel_gram_partials_layout(sumo_dtype dtype, const void *const *ins, int nin,
                                       const size_t *offsets, size_t ntensors, size_t lo,
                                       size_t hi, double *gram);
void sumo__kernel_weighted_sum_layout(sumo_dtype dtype, void *const *outs, int nout,
                                      const void *const *ins, int nin, const size_t *offsets,
                                      size_t ntensors, size_t lo, size_t hi, const double *w);

/* The instruction set the dispatched kernels use: "avx512", "avx2" or "portable", the one
 * SUMO_KERNEL_ISA names where it is set and this CPU runs it, else the widest it runs. */
const char *sumo__kernel_isa(void);

#endif
