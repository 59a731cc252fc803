/*
 * What bounds an allreduce on this machine: memory bandwidth (STREAM-like loops over fp64
 * arrays, with 1, 2 and each rank count of workers). Plain C over the public API only: sumo's
 * per-element kernels against these loops are internals, measured by bench/kernel_bw.
 */
#ifndef SUMO_TOOL_BENCH_MEMBW_H
#define SUMO_TOOL_BENCH_MEMBW_H

#include "bench_harness.h"
#include "bench_options.h"

enum { BENCH_STREAM_COPY, BENCH_STREAM_TRIAD, BENCH_STREAM_ADD, BENCH_STREAM_DOT, BENCH_NSTREAM };

#define BENCH_MAX_MEM_T 8

const char *bench_stream_name(int stream);
/* Operand-sized transfers one run of the loop makes, counted as STREAM does. */
int bench_stream_passes(int stream);
/* The instruction set the STREAM loops run with here ("AVX2" or "SSE2"). */
const char *bench_stream_isa(void);

/* The arrays of the memory runs: a, b, c (mem_bytes each) for the STREAM loops. Threads share
 * one set and split it; MPI ranks each own one. */
typedef struct bench_mem_arrays {
    void *a, *b, *c;
    size_t bytes;
    double *partial; /* a slot per worker, so reductions cannot be optimised away */
} bench_mem_arrays;

int bench_mem_arrays_alloc(bench_mem_arrays *ma, const bench_opts *o, int workers);
void bench_mem_arrays_free(bench_mem_arrays *ma);

typedef struct bench_mem_results {
    int nt;
    int threads[BENCH_MAX_MEM_T];
    double stream[BENCH_MAX_MEM_T][BENCH_NSTREAM]; /* GB/s */
    /* The floor, per rank count: the goal-size allreduce and a+=b, measured in alternation. */
    int nf;
    int franks[BENCH_MAX_RANK_LIST];
    double f_us[BENCH_MAX_RANK_LIST], f_bw[BENCH_MAX_RANK_LIST];
    size_t f_bytes;
} bench_mem_results;

/* Worker counts of the memory runs: 1, 2 and each rank count (ranks share the machine). */
int bench_mem_worker_counts(const bench_opts *o, int ranks_on_node, int *workers);

/* Runs body with `active` workers: a team of that many threads (threads transport), or this
 * machine's ranks of which `active` work (MPI). Returns nonzero when it could not. */
typedef int (*bench_mem_runner)(void *env, int active, bench_body body, void *arg);

/* The STREAM table, one row per worker count, into m. Returns nonzero when a run failed. */
int bench_measure_stream(const bench_opts *o, const bench_mem_arrays *ma, const int *workers,
                         int nworkers, bench_mem_runner run, void *env, bench_mem_results *m);

/* One part per worker of a loop over the memory arrays. */
typedef struct bench_job bench_job;
struct bench_job {
    void (*fn)(bench_job *job, int part);
    int active;      /* workers: the operands are split in that many parts */
    size_t n;        /* elements per operand */
    size_t esz;      /* bytes per element; parts are cut at cache lines */
    double bytes;    /* bytes a run moves, counted as STREAM does (no write-allocate) */
    void *a, *b, *c; /* threads share one set of operands, processes have their own */
    sumo_dtype dtype;
    double *partial;
};

/* a+=b over the STREAM arrays, split among `workers`: the floor's bandwidth. */
bench_job bench_stream_add_job(const bench_mem_arrays *ma, int workers);
/* Fills member part's share of the job's operands (seeded per worker). */
void bench_job_fill_part(bench_job *job, int part, int seed);
/* A bench_body that runs member g->rank's part of the job arg. */
int bench_job_run_part(bench_group *g, void *job);

#endif
