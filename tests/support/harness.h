/*
 * Test support: run one function per rank of a threads communicator, deterministic data
 * generators, and buffers of any dtype read and written through the references of
 * support/reference.h (not through the library's conversions).
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

/* Runs fn on one thread per rank of a new threads communicator of size ranks, through the
 * library's own runner (sumo_threads_run), and returns when every rank has ended. A rank's
 * handle is destroyed once every rank's fn has returned (not as soon as its own has: see
 * harness.c). Returns 0 on success, -1 when the group or a thread could not be made. */
int harness_run_threads(int size, harness_rank_fn fn, void *arg);

/* ---- data ------------------------------------------------------------------------------- */

/* Deterministic pseudo-random numbers from an explicit state (splitmix64). */
uint64_t harness_next(uint64_t *state);
/* Uniform in [-1, 1). */
double harness_uniform(uint64_t *state);
/* A hash of two words, for seeding streams by (seed, step), (seed, rank) and so on. */
uint64_t harness_mix(uint64_t a, uint64_t b);
/* Element i of stream `stream` under seed: uniform in [-1, 1), a pure function of the three,
 * so every rank (or process) can generate every rank's input by itself. */
double harness_uniform_at(uint64_t seed, uint64_t stream, size_t i);
/* Element i of rank r's input to a collective: small integers in [-5, 5] (sums exact in every
 * dtype and order) or random values in [-4, 4). */
double harness_collective_value(int rank, size_t i, bool integer);
/* Element i of rank r's gradient at step s: a consensus direction per (seed, step) plus per-rank
 * noise of the given weight, times a per-rank scale, so weights derived from agreement are
 * positive and well apart, as in a training step. */
float harness_correlated(uint64_t seed, int step, int rank, size_t i, double noise);

/* ---- buffers of any dtype ----------------------------------------------------------------- */

/* Element i of a buffer of dtype, as double / stored from double (rounded once, to nearest
 * even, for the 16-bit types). */
double harness_get(sumo_dtype dtype, const void *buf, size_t i);
void harness_set(sumo_dtype dtype, void *buf, size_t i, double v);
size_t harness_dtype_size(sumo_dtype dtype);
/* The dtype's machine epsilon (2^-23 for fp32, 2^-52 fp64, 2^-10 fp16, 2^-7 bf16). */
double harness_eps(sumo_dtype dtype);

#endif
