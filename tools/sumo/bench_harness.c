#include "bench_harness.h"

#include "bench_options.h"

#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int64_t bench_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double bench_median(double *v, int n, double *min_out)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    if (min_out) *min_out = v[0];
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

sumo_result bench_configure_comm(sumo_comm *comm, sumo_algorithm algo, bool verbose)
{
    if (algo == SUMO_ALGORITHM_AUTO) return SUMO_SUCCESS;
    sumo_result r = sumo_comm_set_param(comm, SUMO_PARAM_ALGORITHM, (int)algo);
    if (r == SUMO_ERR_INVALID_USAGE && verbose) {
        const char *name = "?";
        sumo_comm_transport(comm, &name);
        fprintf(stderr, "sumo bench: the %s transport has no '%s' algorithm\n", name,
                bench_algo_name(algo));
    }
    return r;
}

/* ---- timing ------------------------------------------------------------------------------- */

/* The stamps of member-local runs: start and end per run, and the worst status last, laid out
 * so that one max over the group yields what the rule needs. */
static void stamp_runs(bench_group *g, const bench_timed *x, int reps, double *v)
{
    bool me = g->rank < x->active;
    int status = 0;
    for (int i = 0; i < reps; i++) {
        g->sync(g);
        int64_t t0 = bench_now_ns();
        int r = me ? x->fn(g, x->arg) : 0;
        int64_t t1 = bench_now_ns();
        if (r != 0 && status == 0) status = r;
        double s = (double)(t0 - g->base_ns), e = (double)(t1 - g->base_ns);
        if (!g->common_clock) {
            v[i] = me ? e - s : -INFINITY;
            v[reps + i] = -INFINITY;
        } else if (me) {
            /* The max of -s is minus the first start. */
            v[i] = x->from_last_start ? s : -s;
            v[reps + i] = e;
        } else {
            v[i] = v[reps + i] = -INFINITY;
        }
    }
    v[2 * reps] = status;
}

int bench_time_runs(bench_group *g, const bench_timed *x, int reps, double *dur)
{
    double *v = g->stamps;
    size_t nv = 2 * (size_t)reps + 1;
    stamp_runs(g, x, reps, v);
    g->max(g, v, nv);
    for (int i = 0; i < reps; i++) {
        if (!g->common_clock) dur[i] = v[i];
        else dur[i] = v[reps + i] - (x->from_last_start ? v[i] : -v[i]);
    }
    return (int)v[2 * reps];
}

void bench_time_alternating(bench_group *g, int reps, const bench_timed *x, double *x_med,
                            const bench_timed *y, double *y_med)
{
    double *dx = g->durations, *dy = g->durations + reps;
    bench_time_runs(g, x, 1, dx);
    bench_time_runs(g, y, 1, dy);
    for (int i = 0; i < reps; i++) {
        bench_time_runs(g, x, 1, &dx[i]);
        bench_time_runs(g, y, 1, &dy[i]);
    }
    *x_med = bench_median(dx, reps, NULL);
    *y_med = bench_median(dy, reps, NULL);
}

/* ---- scratch ------------------------------------------------------------------------------ */

static size_t scratch_doubles(int max_reps) { return 4 * (size_t)max_reps + 1; }

static void attach_scratch(bench_group *g, double *scratch, int max_reps)
{
    g->max_reps = max_reps;
    g->stamps = scratch;
    g->durations = scratch + 2 * (size_t)max_reps + 1;
}

void bench_group_free_scratch(bench_group *g)
{
    free(g->stamps);
    g->stamps = g->durations = NULL;
}

/* ---- threads ------------------------------------------------------------------------------ */

/* Values each member contributes to one round of team_max. */
#define TEAM_SLOT 256

/*
 * Threads run through sumo_threads_run, which creates the communicator and one thread per
 * rank. The team keeps a pthread barrier of its own besides: timing must not rely on sumo's
 * barrier (see bench_harness.h), and the memory runs have no collective to time at all.
 */
typedef struct team {
    const bench_team_spec *spec;
    int64_t base_ns;
    pthread_barrier_t barrier;
    double *slots;   /* size * TEAM_SLOT: team_max's exchange */
    double *scratch; /* size * scratch_doubles(max_reps): each member's timing scratch */
    /* Handles the runner gave, and those of the group the last renewal created: a renewal
     * must not destroy the runner's handle, which the runner destroys itself. */
    sumo_comm **given, **renewed;
    sumo_result renew_status;
    int *status;          /* each member's body result */
    sumo_result *started; /* each member's handshake */
    bench_body body;
    void *arg;
} team;

static void team_sync(bench_group *g)
{
    team *t = g->impl;
    pthread_barrier_wait(&t->barrier);
}

static void team_max(bench_group *g, double *v, size_t n)
{
    team *t = g->impl;
    int size = t->spec->size;
    for (size_t off = 0; off < n; off += TEAM_SLOT) {
        size_t m = n - off < TEAM_SLOT ? n - off : TEAM_SLOT;
        memcpy(t->slots + (size_t)g->rank * TEAM_SLOT, v + off, m * sizeof *v);
        pthread_barrier_wait(&t->barrier);
        for (size_t k = 0; k < m; k++) {
            double mx = -INFINITY;
            for (int r = 0; r < size; r++) mx = fmax(mx, t->slots[(size_t)r * TEAM_SLOT + k]);
            v[off + k] = mx;
        }
        /* Nobody overwrites a slot before everyone has read them all. */
        pthread_barrier_wait(&t->barrier);
    }
}

static void drop_renewed_comm(team *t, bench_group *g)
{
    if (g->comm != t->given[g->rank]) sumo_comm_destroy(g->comm);
    g->comm = NULL;
}

static sumo_result team_renew(bench_group *g)
{
    team *t = g->impl;
    drop_renewed_comm(t, g);
    pthread_barrier_wait(&t->barrier);
    if (g->rank == 0) {
        t->renew_status = sumo_comm_create_threads(t->spec->size, t->renewed);
        if (t->renew_status != SUMO_SUCCESS)
            for (int r = 0; r < t->spec->size; r++) t->renewed[r] = NULL;
    }
    pthread_barrier_wait(&t->barrier);
    if (t->renew_status != SUMO_SUCCESS) return t->renew_status;
    g->comm = t->renewed[g->rank];
    return bench_configure_comm(g->comm, g->algo, g->rank == 0);
}

/* Rank r runs on the r-th CPU this process may use (round robin), so that the OS does not
 * move two ranks onto one core halfway through a measurement. */
static void pin_to_cpu(int index)
{
    cpu_set_t allowed, one;
    if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return;
    int count = CPU_COUNT(&allowed);
    if (count <= 0) return;
    int want = index % count;
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) {
        if (!CPU_ISSET(cpu, &allowed)) continue;
        if (want-- == 0) {
            CPU_ZERO(&one);
            CPU_SET(cpu, &one);
            pthread_setaffinity_np(pthread_self(), sizeof one, &one);
            return;
        }
    }
}

/* The algorithm is set on every member before any works; all learn whether some failed. */
static bool team_configure(team *t, bench_group *g)
{
    sumo_result r = bench_configure_comm(g->comm, g->algo, g->rank == 0);
    double failed = r != SUMO_SUCCESS;
    team_max(g, &failed, 1);
    if (failed == 0) return true;
    if (g->rank == 0)
        fprintf(stderr, "sumo bench: threads communicator of %d ranks (algorithm %s): %s\n",
                t->spec->size, bench_algo_name(g->algo), sumo_strerror(r));
    return false;
}

/*
 * A pthread barrier cannot be left: members may wait at the team's only once all are running.
 * When the runner could not start a thread it drops that rank's handle, and sumo's barrier
 * then fails on every member instead of blocking. Its deadline is made generous for this one
 * call: SUMO_TIMEOUT is meant for the collectives measured, not for threads starting up.
 */
#define HANDSHAKE_TIMEOUT_S 600.0

static sumo_result handshake(sumo_comm *comm)
{
    double timeout = 0;
    sumo_comm_get_timeout(comm, &timeout);
    sumo_comm_set_timeout(comm, timeout > HANDSHAKE_TIMEOUT_S ? timeout : HANDSHAKE_TIMEOUT_S);
    sumo_result r = sumo_barrier(comm);
    if (r == SUMO_SUCCESS) sumo_comm_set_timeout(comm, timeout);
    return r;
}

static sumo_result member_main(sumo_comm *comm, int rank, void *arg)
{
    team *t = arg;
    const bench_team_spec *spec = t->spec;
    if (spec->pin) pin_to_cpu(rank);
    t->started[rank] = handshake(comm);
    if (t->started[rank] != SUMO_SUCCESS) {
        t->status[rank] = 1;
        return SUMO_SUCCESS;
    }
    t->given[rank] = comm;
    bench_group g = {.rank = rank, .size = spec->size, .common_clock = true,
                     .base_ns = t->base_ns, .comm = spec->with_comm ? comm : NULL,
                     .algo = spec->algo, .sync = team_sync, .max = team_max,
                     .renew = spec->with_comm ? team_renew : NULL, .impl = t};
    attach_scratch(&g, t->scratch + (size_t)rank * scratch_doubles(spec->max_reps), spec->max_reps);
    if (spec->with_comm && !team_configure(t, &g)) t->status[rank] = 1;
    else t->status[rank] = t->body(&g, t->arg);
    if (spec->with_comm) drop_renewed_comm(t, &g);
    return SUMO_SUCCESS;
}

static void team_free(team *t)
{
    free(t->slots);
    free(t->scratch);
    free(t->given);
    free(t->renewed);
    free(t->status);
    free(t->started);
}

static bool team_alloc(team *t, int size, int max_reps)
{
    t->slots = calloc((size_t)size * TEAM_SLOT, sizeof *t->slots);
    t->scratch = calloc((size_t)size * scratch_doubles(max_reps), sizeof *t->scratch);
    t->given = calloc((size_t)size, sizeof *t->given);
    t->renewed = calloc((size_t)size, sizeof *t->renewed);
    t->status = calloc((size_t)size, sizeof *t->status);
    t->started = calloc((size_t)size, sizeof *t->started);
    return t->slots && t->scratch && t->given && t->renewed && t->status && t->started;
}

/* The team's outcome: the worst body result, or 1 after saying why the team did not run. */
static int team_outcome(const team *t, sumo_result run)
{
    const bench_team_spec *spec = t->spec;
    if (run != SUMO_SUCCESS) {
        fprintf(stderr, "sumo bench: threads communicator of %d ranks (algorithm %s): %s\n",
                spec->size, bench_algo_name(spec->algo), sumo_strerror(run));
        return 1;
    }
    int worst = 0;
    for (int i = 0; i < spec->size; i++) {
        if (t->started[i] != SUMO_SUCCESS) {
            fprintf(stderr, "sumo bench: %d threads did not all start: %s\n", spec->size,
                    sumo_strerror(t->started[i]));
            return 1;
        }
        worst = t->status[i] > worst ? t->status[i] : worst;
    }
    return worst;
}

int bench_run_team(const bench_team_spec *spec, bench_body body, void *arg)
{
    team t = {.spec = spec, .body = body, .arg = arg};
    if (!team_alloc(&t, spec->size, spec->max_reps) ||
        pthread_barrier_init(&t.barrier, NULL, (unsigned)spec->size) != 0) {
        team_free(&t);
        fprintf(stderr, "sumo bench: cannot set up %d threads\n", spec->size);
        return 1;
    }
    t.base_ns = bench_now_ns();
    int outcome = team_outcome(&t, sumo_threads_run(spec->size, member_main, &t, NULL));
    pthread_barrier_destroy(&t.barrier);
    team_free(&t);
    return outcome;
}

/* ---- MPI ---------------------------------------------------------------------------------- */

#ifdef SUMO_HAVE_MPI
static void mpi_sync(bench_group *g) { MPI_Barrier(((bench_mpi_impl *)g->impl)->comm); }

static void mpi_max(bench_group *g, double *v, size_t n)
{
    MPI_Allreduce(MPI_IN_PLACE, v, (int)n, MPI_DOUBLE, MPI_MAX, ((bench_mpi_impl *)g->impl)->comm);
}

static sumo_result mpi_renew(bench_group *g)
{
    sumo_comm_destroy(g->comm);
    g->comm = NULL;
    sumo_result r = sumo_comm_create_mpi(((bench_mpi_impl *)g->impl)->comm, &g->comm);
    if (r != SUMO_SUCCESS) return r;
    return bench_configure_comm(g->comm, g->algo, true);
}

/* A common origin for the stamps: the earliest clock reading of the group. */
static int64_t mpi_common_base(MPI_Comm comm)
{
    long long now = (long long)bench_now_ns(), base = 0;
    MPI_Allreduce(&now, &base, 1, MPI_LONG_LONG, MPI_MIN, comm);
    return (int64_t)base;
}

bool bench_mpi_group_init(bench_group *g, bench_mpi_impl *impl, bool common_clock,
                          sumo_algorithm algo, bool renewable, int max_reps)
{
    int rank, size;
    MPI_Comm_rank(impl->comm, &rank);
    MPI_Comm_size(impl->comm, &size);
    *g = (bench_group){.rank = rank, .size = size, .common_clock = common_clock,
                       .base_ns = common_clock ? mpi_common_base(impl->comm) : bench_now_ns(),
                       .algo = algo, .sync = mpi_sync, .max = mpi_max,
                       .renew = renewable ? mpi_renew : NULL, .impl = impl};
    double *scratch = calloc(scratch_doubles(max_reps), sizeof *scratch);
    if (scratch == NULL) return false;
    attach_scratch(g, scratch, max_reps);
    return true;
}
#endif
