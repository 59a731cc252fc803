/*
 * sumo bench: what an allreduce costs, per message size, transport, rank count and op, printed
 * in nccl-tests' layout next to what bounds it on this machine, all measured in the same run:
 * memory bandwidth (STREAM-like loops) and over MPI the peer's own MPI_Allreduce on the same
 * buffers. (The per-element kernels against that bandwidth are internals: bench/kernel_bw.)
 *
 * This file only orders the work; each concern has its own file:
 *   bench_options    the command line
 *   bench_harness    groups of ranks (threads, MPI processes) and how runs are timed
 *   bench_membw      memory bandwidth
 *   bench_sweep      the allreduce rows and the floor
 *   bench_reference  inputs and the sequential reference of --check
 *   bench_report     the table, the sections, the derived figures and the CSV
 */
#include "commands.h"

#include "bench_harness.h"
#include "bench_membw.h"
#include "bench_options.h"
#include "bench_report.h"
#include "bench_sweep.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct bench_ctx {
    bench_opts o;
    bench_report rep;
    bench_mem_results mem;
    int ranks_on_node; /* ranks sharing this machine */
} bench_ctx;

/* The memory section: the STREAM table, printed once measured. */
static int run_mem_sections(bench_ctx *c, bench_mem_runner run, void *env,
                            const bench_mem_arrays *ma)
{
    int workers[BENCH_MAX_MEM_T];
    int n = bench_mem_worker_counts(&c->o, c->ranks_on_node, workers);
    if (bench_measure_stream(&c->o, ma, workers, n, run, env, &c->mem) != 0) return -1;
    if (c->rep.printer) bench_print_stream(&c->rep, &c->mem);
    return 0;
}

/* ---- threads ------------------------------------------------------------------------------ */

static int threads_mem_runner(void *env, int active, bench_body body, void *arg)
{
    const bench_opts *o = env;
    bench_team_spec spec = {.size = active, .algo = SUMO_ALGORITHM_AUTO, .pin = o->pin,
                            .max_reps = bench_max_reps(o)};
    return bench_run_team(&spec, body, arg);
}

/* One rank count: the sweep, then (with the memory runs) the floor on the same communicator. */
typedef struct threads_round {
    bench_report *rep;
    bool with_floor;
    bench_floor floor;
    bool floor_measured; /* set by rank 0 */
} threads_round;

static int threads_round_body(bench_group *g, void *arg)
{
    threads_round *t = arg;
    int status = bench_sweep_body(g, t->rep);
    if (status != 0 || !t->with_floor) return status;
    if (bench_floor_body(g, &t->floor) == 0 && g->rank == 0) t->floor_measured = true;
    return 0;
}

static int threads_rank_count(bench_ctx *c, int p, const bench_mem_arrays *ma)
{
    c->rep.world_size = c->ranks_on_node = p;
    threads_round round = {.rep = &c->rep, .with_floor = !c->o.skip_mem,
                           .floor = {.o = &c->o, .ma = ma,
                                     .bytes = bench_goal_size(c->rep.sizes, c->rep.nsizes)}};
    bench_team_spec spec = {.size = p, .with_comm = true, .algo = c->o.algo, .pin = c->o.pin,
                            .max_reps = bench_max_reps(&c->o)};
    int status = bench_run_team(&spec, threads_round_body, &round);
    if (round.floor_measured) bench_record_floor(&c->mem, p, &round.floor);
    return status;
}

static int bench_threads(bench_ctx *c)
{
    const bench_opts *o = &c->o;
    c->rep.nodes = 1;
    bench_print_machine(&c->rep);
    bench_mem_arrays ma = {0};
    int maxp = 2;
    for (int i = 0; i < o->nranks; i++) maxp = o->ranks[i] > maxp ? o->ranks[i] : maxp;
    if (!o->skip_mem) {
        if (bench_mem_arrays_alloc(&ma, o, maxp) != 0) {
            fprintf(stderr, "sumo bench: cannot allocate the arrays of the memory runs (%zu bytes each)\n",
                    o->mem_bytes);
            return 1;
        }
        if (run_mem_sections(c, threads_mem_runner, &c->o, &ma) != 0) {
            bench_mem_arrays_free(&ma);
            return 1;
        }
    }
    int status = 0;
    for (int i = 0; i < o->nranks; i++)
        if (threads_rank_count(c, o->ranks[i], &ma) != 0) status = 1;
    bench_print_derived(&c->rep, &c->mem);
    bench_mem_arrays_free(&ma);
    return status;
}

/* ---- MPI ---------------------------------------------------------------------------------- */

#ifdef SUMO_HAVE_MPI
static int mpi_mem_runner(void *env, int active, bench_body body, void *arg)
{
    (void)active; /* the body's context says which ranks of the machine work */
    return body(env, arg);
}

static bool any_rank(bool mine)
{
    int v = mine, any = 0;
    MPI_Allreduce(&v, &any, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD);
    return any != 0;
}

/* Where this process sits: its machine's communicator, and how many machines there are. */
typedef struct mpi_layout {
    int rank, size, provided;
    MPI_Comm node_comm;
    int node_rank, node_size, nodes;
} mpi_layout;

static void mpi_find_layout(mpi_layout *l)
{
    MPI_Comm_rank(MPI_COMM_WORLD, &l->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &l->size);
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, l->rank, MPI_INFO_NULL, &l->node_comm);
    MPI_Comm_rank(l->node_comm, &l->node_rank);
    MPI_Comm_size(l->node_comm, &l->node_size);
    int leader = l->node_rank == 0;
    MPI_Allreduce(&leader, &l->nodes, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
}

static void mpi_print_header(const bench_ctx *c, const mpi_layout *l)
{
    bench_print_machine(&c->rep);
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(version, &len);
    version[strcspn(version, "\n")] = '\0';
    bench_print_mpi(&c->rep, version, l->provided, MPI_THREAD_MULTIPLE, l->node_size);
}

/* The world's sumo communicator with the chosen algorithm, on every rank or on none. */
static bool mpi_world_comm(const bench_ctx *c, const mpi_layout *l, bench_group *world)
{
    sumo_result r = sumo_comm_create_mpi(MPI_COMM_WORLD, &world->comm);
    if (r == SUMO_SUCCESS) r = bench_configure_comm(world->comm, c->o.algo, true);
    if (r != SUMO_SUCCESS)
        fprintf(stderr, "sumo bench: rank %d: MPI communicator (algorithm %s): %s\n", l->rank,
                bench_algo_name(c->o.algo), sumo_strerror(r));
    return !any_rank(r != SUMO_SUCCESS);
}

/* Everything after the header: memory sections, sweep, floor, derived figures. */
static int mpi_measure(bench_ctx *c, const mpi_layout *l, bench_group *node, bench_group *world)
{
    const bench_opts *o = &c->o;
    bench_mem_arrays ma = {0};
    int status = 0;
    if (!o->skip_mem) {
        if (any_rank(bench_mem_arrays_alloc(&ma, o, l->node_size + 1) != 0)) {
            fprintf(stderr, "sumo bench: rank %d: cannot allocate the memory-run arrays\n", l->rank);
            return 1;
        }
        if (run_mem_sections(c, mpi_mem_runner, node, &ma) != 0) status = 1;
    }
    if (status == 0 && mpi_world_comm(c, l, world)) {
        if (bench_sweep_body(world, &c->rep) != 0) status = 1;
        /* The floor needs every rank on this machine (a+=b with P workers). */
        bench_floor f = {.o = o, .ma = &ma, .bytes = bench_goal_size(c->rep.sizes, c->rep.nsizes)};
        if (!o->skip_mem && l->nodes == 1 && bench_floor_body(world, &f) == 0 && c->rep.printer)
            bench_record_floor(&c->mem, l->size, &f);
        if (c->rep.printer) bench_print_derived(&c->rep, &c->mem);
    } else {
        status = 1;
    }
    sumo_comm_destroy(world->comm);
    world->comm = NULL;
    bench_mem_arrays_free(&ma);
    return status;
}

static int mpi_run(bench_ctx *c, const mpi_layout *l)
{
    const bench_opts *o = &c->o;
    c->rep.printer = l->rank == 0;
    c->rep.nodes = l->nodes;
    c->rep.world_size = l->size;
    c->ranks_on_node = l->node_size;
    c->rep.peer = o->dtype == SUMO_FLOAT32 || o->dtype == SUMO_FLOAT64;
    int max_reps = bench_max_reps(o);
    bench_mpi_impl node_impl = {l->node_comm}, world_impl = {MPI_COMM_WORLD};
    bench_group node = {0}, world = {0};
    bool ready = bench_mpi_group_init(&node, &node_impl, true, SUMO_ALGORITHM_AUTO, false, max_reps);
    ready = bench_mpi_group_init(&world, &world_impl, l->nodes == 1, o->algo, true, max_reps) && ready;
    int status = 1;
    if (any_rank(!ready)) fprintf(stderr, "sumo bench: rank %d: out of memory\n", l->rank);
    else if (!any_rank(bench_report_open_csv(&c->rep) != 0)) {
        if (c->rep.printer) mpi_print_header(c, l);
        status = mpi_measure(c, l, &node, &world);
    }
    bench_group_free_scratch(&node);
    bench_group_free_scratch(&world);
    return status;
}

static int bench_mpi(bench_ctx *c)
{
    mpi_layout l = {0};
    /* sumo's asynchronous requests call MPI from a progress thread. */
    if (MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &l.provided) != MPI_SUCCESS) {
        fprintf(stderr, "sumo bench: MPI_Init_thread failed\n");
        return 1;
    }
    mpi_find_layout(&l);
    int status = mpi_run(c, &l);
    MPI_Comm_free(&l.node_comm);
    MPI_Finalize();
    return status;
}
#endif

/* ---- entry point -------------------------------------------------------------------------- */

static int run_transport(bench_ctx *c)
{
    if (c->o.transport == BENCH_TRANSPORT_MPI) {
#ifdef SUMO_HAVE_MPI
        return bench_mpi(c);
#else
        fprintf(stderr, "sumo bench: this sumo was built without MPI (no mpicc at build time); "
                        "use --transport threads\n");
        return 2;
#endif
    }
    c->rep.printer = true;
    return bench_report_open_csv(&c->rep) != 0 ? 1 : bench_threads(c);
}

int sumo_cmd_bench(int argc, char **argv)
{
    bench_ctx *c = calloc(1, sizeof *c);
    if (c == NULL) {
        fprintf(stderr, "sumo bench: out of memory\n");
        return 1;
    }
    int status;
    bench_parse_result parsed = bench_parse_options(argc, argv, &c->o);
    if (parsed != BENCH_PARSE_RUN) {
        status = parsed == BENCH_PARSE_HELP ? 0 : 2;
    } else {
        c->rep.o = &c->o;
        c->rep.transport = bench_transport_name(&c->o);
        c->rep.nsizes = bench_make_sizes(&c->o, c->rep.sizes);
        if (c->rep.nsizes == 0) {
            fprintf(stderr, "sumo bench: no message size between --min and --max\n");
            status = 2;
        } else {
            status = run_transport(c);
            if (status == 0 && c->rep.failures > 0) status = 1;
        }
    }
    bench_report_close(&c->rep);
    free(c);
    return status;
}
