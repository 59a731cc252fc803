/*
 * The data every rank reduces and what --check holds the results against: deterministic
 * inputs (each rank's element i is a function of the rank and i, so any process can rebuild
 * any rank's input), a sequential reference of sum, average and Adasum, and a hash that tells
 * whether all ranks ended with the same bits.
 */
#ifndef SUMO_TOOL_BENCH_REFERENCE_H
#define SUMO_TOOL_BENCH_REFERENCE_H

#include "sumo.h"

#include <stddef.h>

/* buf[lo..hi) = rank's elements, rounded to the dtype. */
void bench_fill(sumo_dtype dtype, void *buf, size_t lo, size_t hi, int rank);

enum bench_verdict { BENCH_CHECK_NONE, BENCH_CHECK_EXACT, BENCH_CHECK_OK, BENCH_CHECK_NA, BENCH_CHECK_FAIL };

const char *bench_verdict_name(int verdict);

/* buf (n elements) against the sum or average (op) of p ranks' inputs, elementwise: bit-exact
 * is what the shared-memory algorithms give; other orders (ring, recursive doubling) are
 * allowed p rounding errors of the accumulator plus the final rounding to the dtype. A
 * failure or n/a verdict says why in why[whylen]. */
int bench_check_sum(sumo_dtype dtype, int op, int p, const void *buf, size_t n, char *why,
                    size_t whylen);

/* buf against Adasum of p ranks' inputs (the tree sumo.h documents) tensor by tensor, the
 * ntensors tensors of bench_tensor_counts' layout, within Horovod's tolerance. */
int bench_check_adasum(sumo_dtype dtype, int p, const void *buf, size_t n, size_t ntensors,
                       char *why, size_t whylen);

/* Tensor t's count when n elements are cut into ntensors nearly equal parts (the first n %
 * ntensors one longer). */
size_t bench_tensor_count(size_t n, size_t ntensors, size_t t);

/* 32 bits of a hash of the buffer, exact in a double, to compare ranks' results. */
double bench_hash(const void *buf, size_t bytes);

#endif
