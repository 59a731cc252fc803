/*
 * The ranks of one measurement (a group: threads of this process, or MPI processes) and how
 * their runs are timed.
 *
 * Timing. Each timed call is preceded by a barrier of the benchmark's own (a pthread barrier or
 * MPI_Barrier, never sumo's, so that sumo and MPI_Allreduce are timed alike), and every rank
 * stamps a monotonic clock just before and just after its call. Ranks leave a barrier at
 * different moments (a futex wake-up is tens of microseconds), so neither one rank's stamps nor
 * the span from the first start are the collective's cost: no rank can finish before the last
 * one has entered. Where all ranks read the same clock (threads; MPI processes on one node,
 * CLOCK_MONOTONIC being system wide) an iteration therefore costs
 *     max over ranks of the end stamp - max over ranks of the start stamp,
 * from the last arrival to the last departure, which excludes the barrier's skew and includes
 * everything the slowest rank waited for. Across machines the clocks differ, and the cost is
 * the largest per-rank duration instead, which includes the skew (an upper bound). The
 * memory-bandwidth runs measure from the first start instead: a worker that starts early
 * already uses the bandwidth.
 */
#ifndef SUMO_TOOL_BENCH_HARNESS_H
#define SUMO_TOOL_BENCH_HARNESS_H

#include "sumo.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef SUMO_HAVE_MPI
#include "sumo_mpi.h"
#include <mpi.h>
#endif

typedef struct bench_group bench_group;
struct bench_group {
    int rank, size;
    /* Every member reads the same clock, so stamps compare across members. */
    bool common_clock;
    int64_t base_ns; /* common origin of the stamps, so doubles hold them exactly */
    sumo_comm *comm; /* NULL for groups that only measure memory */
    sumo_algorithm algo;
    /* Scratch of the timing functions, sized for max_reps runs, allocated before the group
     * starts so that no member can fail halfway through a measurement the others are in. */
    int max_reps;
    double *stamps;    /* 2 * max_reps + 1 */
    double *durations; /* 2 * max_reps: one series, or two measured in alternation */
    void (*sync)(bench_group *g);
    /* v[i] = max over members of v[i], on every member. */
    void (*max)(bench_group *g, double *v, size_t n);
    /* Replaces a communicator that a failure left unusable (NULL where there is none). */
    sumo_result (*renew)(bench_group *g);
    void *impl;
};

/* What a member runs; returns 0, or 1 when its part of the work failed. */
typedef int (*bench_body)(bench_group *g, void *arg);

int64_t bench_now_ns(void);

/* Median of v[0..n) (sorted in place); the minimum into *min_out unless NULL. */
double bench_median(double *v, int n, double *min_out);

/* Sets the sum/average algorithm unless algo is AUTO; verbose: says on stderr when the
 * transport has no such algorithm. */
sumo_result bench_configure_comm(sumo_comm *comm, sumo_algorithm algo, bool verbose);

/* One kind of run for the timing functions: fn(g, arg) on members [0, active) (the others only
 * take part in the barriers), its cost measured from the last member's start (a collective)
 * or from the first (memory bandwidth). */
typedef struct bench_timed {
    int active;
    bool from_last_start;
    bench_body fn;
    void *arg;
} bench_timed;

/* Runs x reps times and fills dur[] with each run's cost in nanoseconds, identical on every
 * member. Returns the largest status any member's fn returned. reps <= g->max_reps. */
int bench_time_runs(bench_group *g, const bench_timed *x, int reps, double *dur);

/* x and y in alternation, after one untimed run of each, so that both medians (ns) see the
 * same machine: a virtual machine's bandwidth drifts by tens of percent between one second
 * and the next. Statuses are not collected: both are runs that cannot fail. */
void bench_time_alternating(bench_group *g, int reps, const bench_timed *x, double *x_med,
                            const bench_timed *y, double *y_med);

/* A team of `size` threads in this process, member r pinned to the r-th allowed cpu when pin.
 * with_comm: each member's group holds its rank of a threads communicator set to algo, which
 * a failure can renew; else the group has no communicator. Returns the largest result of the
 * bodies, or 1 when the team could not be set up (said on stderr). */
typedef struct bench_team_spec {
    int size;
    bool with_comm;
    sumo_algorithm algo;
    bool pin;
    int max_reps;
} bench_team_spec;

int bench_run_team(const bench_team_spec *spec, bench_body body, void *arg);

#ifdef SUMO_HAVE_MPI
/* The processes of an MPI communicator as a group. comm must outlive the group. */
typedef struct bench_mpi_impl {
    MPI_Comm comm;
} bench_mpi_impl;

/* Collective over impl->comm. common_clock: all its processes share one machine's clock.
 * renewable: the group holds a sumo communicator (set by the caller) that failures renew.
 * Returns false when this process cannot allocate the scratch (the caller agrees on it). */
bool bench_mpi_group_init(bench_group *g, bench_mpi_impl *impl, bool common_clock,
                          sumo_algorithm algo, bool renewable, int max_reps);
#endif

/* Frees what bench_mpi_group_init allocated (the communicator stays the caller's). */
void bench_group_free_scratch(bench_group *g);

#endif
