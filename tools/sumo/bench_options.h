/*
 * sumo bench's command line: what to measure (transport, rank counts, sizes, dtype, ops,
 * iterations, memory runs, CSV), and the names the report prints for each choice.
 */
#ifndef SUMO_TOOL_BENCH_OPTIONS_H
#define SUMO_TOOL_BENCH_OPTIONS_H

#include "sumo.h"

#include <stdbool.h>
#include <stddef.h>

enum { BENCH_TRANSPORT_THREADS, BENCH_TRANSPORT_MPI };

#define BENCH_MAX_RANK_LIST 16
#define BENCH_MAX_SIZES 256
#define BENCH_MIB ((size_t)1 << 20)
/* The size the goals of docs/design/experiments.md (E3) are stated at. */
#define BENCH_GOAL_BYTES (64 * BENCH_MIB)

/* ACGA is an aggregator, not an allreduce op: the bench gives it a number of its own. */
#define BENCH_OP_ACGA ((int)SUMO_OP_PREDEFINED_COUNT)
#define BENCH_NOPS (BENCH_OP_ACGA + 1)

typedef struct bench_opts {
    int transport;
    bool transport_set;
    int ranks[BENCH_MAX_RANK_LIST];
    int nranks;
    bool ranks_set;
    size_t min_bytes, max_bytes;
    double step;
    bool min_set, max_set, step_set;
    sumo_dtype dtype;
    int ops[BENCH_NOPS];
    int nops;
    int iters, warmup;
    size_t tensors; /* adasum's layout: tensors of nearly equal counts (1: one tensor) */
    bool iters_set, warmup_set;
    bool check, quick, skip_mem, pin;
    bool shared_buffers; /* buffers from sumo_mem_alloc */
    bool shared_outputs; /* out of place, from private memory into sumo_mem_alloc's */
    size_t mem_bytes;
    bool mem_set;
    int mem_reps;
    bool mem_reps_set;
    sumo_algorithm algo;
    const char *csv_path;
} bench_opts;

/* What parsing found: go on, --help was printed, or a usage error was printed on stderr. */
typedef enum bench_parse_result { BENCH_PARSE_RUN, BENCH_PARSE_HELP, BENCH_PARSE_USAGE } bench_parse_result;

bench_parse_result bench_parse_options(int argc, char **argv, bench_opts *o);

/* Message sizes from min to max, each a multiple of the element size; returns the count
 * (at most BENCH_MAX_SIZES). */
int bench_make_sizes(const bench_opts *o, size_t *sizes);

/* Size at which the goals are read: 64 MiB when swept, else the largest size swept. */
size_t bench_goal_size(const size_t *sizes, int nsizes);

/* The most timed runs any measurement makes in a row: what the timing scratch must hold. */
int bench_max_reps(const bench_opts *o);

size_t bench_dtype_bytes(sumo_dtype dtype);
const char *bench_op_label(int op);
const char *bench_algo_name(sumo_algorithm algo);
const char *bench_transport_name(const bench_opts *o);

#endif
