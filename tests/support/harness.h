/*
 * Test support: run one function per rank of a threads communicator, and independent scalar
 * references (conversions, sums) that do not use the library's kernels.
 *
 * cmocka's assertions must not run inside the rank threads (a failed assertion longjmps out
 * of the wrong thread): rank functions record what they saw, and the test asserts afterwards.
 */
#ifndef SUMO_TEST_HARNESS_H
#define SUMO_TEST_HARNESS_H

#include "sumo.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef void (*harness_rank_fn)(sumo_comm *comm, int rank, int size, void *arg);

/* Creates a threads communicator of size ranks, runs fn on one thread per rank, joins and
 * destroys. Returns 0 on success, -1 when the group or a thread could not be made. */
int harness_run_threads(int size, harness_rank_fn fn, void *arg);

/* Deterministic pseudo-random numbers from an explicit state (splitmix64). */
uint64_t harness_next(uint64_t *state);
/* Uniform in [-1, 1). */
double harness_uniform(uint64_t *state);

/* Reference conversions written from the IEEE formats, not from the library. */
float harness_half_to_float(uint16_t h);
uint16_t harness_float_to_half(float f);
float harness_bf16_to_float(uint16_t b);
uint16_t harness_float_to_bf16(float f);

/* Element i of a buffer of dtype, as double / stored from double (via the dtype's rounding). */
double harness_get(sumo_dtype dtype, const void *buf, size_t i);
void harness_set(sumo_dtype dtype, void *buf, size_t i, double v);
size_t harness_dtype_size(sumo_dtype dtype);

#endif
