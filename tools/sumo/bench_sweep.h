/*
 * The allreduce measurements: the sweep over sizes and ops on one group (each row timed,
 * and checked once with --check), and the floor, the goal-size sum against a+=b.
 *
 * In place. Allreduce runs in place (send == receive buffer), as gradient allreduces do: each
 * buffer is then read once and written once, which is the floor the derived figures use. With
 * SUM the values grow by P each iteration and reach Inf; x86 adds Inf at full speed, and every
 * op starts again from fresh data, so this changes no timing.
 */
#ifndef SUMO_TOOL_BENCH_SWEEP_H
#define SUMO_TOOL_BENCH_SWEEP_H

#include "bench_harness.h"
#include "bench_membw.h"
#include "bench_report.h"

/* A bench_body over a bench_report: every size and op of the report's options on g, the
 * rows printed and kept by the printing member. Returns 1 when the group could not go on
 * (no memory, or a broken communicator that could not be replaced). */
int bench_sweep_body(bench_group *g, void *report);

typedef struct bench_floor {
    const bench_opts *o;
    const bench_mem_arrays *ma;
    size_t bytes;
    double us, bw; /* set by rank 0 */
} bench_floor;

/* A bench_body over a bench_floor: the sum of `bytes` on every member and a+=b with as many
 * workers, in alternation. */
int bench_floor_body(bench_group *g, void *floor);

/* Keeps a floor measured with p ranks for the derived figures. */
void bench_record_floor(bench_mem_results *m, int p, const bench_floor *f);

#endif
