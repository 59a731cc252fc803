/*
 * sumo bench: what an allreduce costs, per message size, transport, rank count and op, printed
 * in nccl-tests' layout next to what bounds it on this machine, all measured in the same run:
 * memory bandwidth (STREAM-like loops), the per-element kernels against that bandwidth, and over
 * MPI the peer's own MPI_Allreduce on the same buffers.
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
 * already uses the bandwidth. Reported: the median over iterations, and the minimum.
 *
 * In place. Allreduce runs in place (send == receive buffer), as gradient allreduces do: each
 * buffer is then read once and written once, which is the floor the derived figures use. With
 * SUM the values grow by P each iteration and reach Inf; x86 adds Inf at full speed, and every
 * op starts again from fresh data, so this changes no timing.
 */
#include "commands.h"

#include "collectives/comm.h"
#include "common/common.h"
#include "kernels/kernels.h"
#include "sumo.h"
#include "sumo_aggregation.h"

#ifdef SUMO_HAVE_MPI
#include "sumo_mpi.h"
#include <mpi.h>
#endif

#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- options ------------------------------------------------------------------------------ */

enum { TRANSPORT_THREADS, TRANSPORT_MPI };

#define MAX_RANK_LIST 16
#define MAX_SIZES 256
#define MIB ((size_t)1 << 20)
/* The size the derived figures' goals are read at (docs/design/experiments.md, E3). */
#define GOAL_BYTES (64 * MIB)
#define NTENSORS 1000

/* ACGA is an aggregator, not an allreduce op: the bench gives it a number of its own. */
#define BENCH_OP_ACGA SUMO_OP_PREDEFINED_COUNT
#define BENCH_NOPS (SUMO_OP_PREDEFINED_COUNT + 1)

typedef struct bench_opts {
    int transport;
    bool transport_set;
    int ranks[MAX_RANK_LIST];
    int nranks;
    bool ranks_set;
    size_t min_bytes, max_bytes;
    double step;
    bool min_set, max_set, step_set;
    sumo_dtype dtype;
    int ops[BENCH_NOPS];
    int nops;
    int iters, warmup;
    bool iters_set, warmup_set;
    bool check, quick, skip_mem, pin;
    size_t mem_bytes;
    bool mem_set;
    int mem_reps;
    bool mem_reps_set;
    sumo_algorithm algo;
    const char *csv_path;
} bench_opts;

static void usage(FILE *out)
{
    fprintf(out,
        "usage: sumo bench [options]\n"
        "\n"
        "Times allreduce for each message size, rank count and op, and prints time, algorithm\n"
        "bandwidth and bus bandwidth (busbw = algbw * 2(P-1)/P) in nccl-tests' layout, with the\n"
        "machine's memory bandwidth and, over MPI, MPI_Allreduce measured in the same run.\n"
        "Lines starting with '#' are comments; the others are the table.\n"
        "\n"
        "  --transport threads|mpi  default: mpi when launched by mpirun (OMPI_COMM_WORLD_SIZE,\n"
        "                           PMI_SIZE or PMIX_RANK set), else threads\n"
        "  --ranks 2,4              rank counts for the threads transport (default 2,4)\n"
        "  --min SIZE --max SIZE    message sizes in bytes, K/M/G suffixes are binary\n"
        "                           (default 4K to 256M)\n"
        "  --step F                 size factor between rows (default 2)\n"
        "  --dtype fp32|fp64|fp16|bf16       (default fp32)\n"
        "  --ops sum,avg,adasum,acga  (default sum,avg,adasum; acga is the ACGA aggregator\n"
        "                           with its defaults, fp32 only; an op the library refuses\n"
        "                           prints n/a)\n"
        "  --iters N --warmup W     timed and untimed iterations per row (default 20, 5);\n"
        "                           time is the median over iterations, min also shown\n"
        "  --algo auto|shm|ring|rd|native   force sumo's sum/avg algorithm (default auto)\n"
        "  --check                  verify each size and op once against a sequential reference\n"
        "                           and that all ranks hold identical bits\n"
        "  --quick                  few sizes and iterations, smaller arrays: seconds, for CI\n"
        "  --mem-size SIZE          bytes per array of the memory-bandwidth runs (default 256M)\n"
        "  --mem-reps N             repeats of each memory-bandwidth run (default 10)\n"
        "  --skip-mem               no memory-bandwidth or kernel section\n"
        "  --no-pin                 do not pin rank threads to cores (threads transport)\n"
        "  --csv FILE               also write every measurement as a CSV row: section\n"
        "                           (allreduce, memory, kernel, floor), transport, ranks (or\n"
        "                           threads), dtype, op, bytes, count, time_us, min_us, gbps,\n"
        "                           busbw_gbps, ref_us, ratio, check, status. ref_us is\n"
        "                           MPI_Allreduce's time (allreduce) or the floor's (floor);\n"
        "                           ratio is time/ref_us, or kernel/bound GB/s (kernel)\n"
        "\n"
        "Environment: SUMO_MPI_SHM=0 disables the MPI transport's shared-memory path (see\n"
        "scripts/bench-net.sh); SUMO_DEBUG=INFO logs each algorithm choice.\n");
}

static int parse_bytes(const char *s, size_t *out)
{
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || end == s || *s == '-') return -1;
    unsigned shift = 0;
    switch (toupper((unsigned char)*end)) {
    case 'K': shift = 10; end++; break;
    case 'M': shift = 20; end++; break;
    case 'G': shift = 30; end++; break;
    default: break;
    }
    if (shift && (*end == 'i' || *end == 'I')) end++;
    if (*end == 'B' || *end == 'b') end++;
    if (*end != '\0') return -1;
    if (shift && v > (SIZE_MAX >> shift)) return -1;
    *out = (size_t)v << shift;
    return 0;
}

static int parse_int(const char *s, int lo, int hi, int *out)
{
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi) return -1;
    *out = (int)v;
    return 0;
}

static int parse_dtype(const char *s, sumo_dtype *out)
{
    static const struct { const char *name; sumo_dtype dtype; } names[] = {
        {"fp32", SUMO_FLOAT32}, {"float", SUMO_FLOAT32}, {"float32", SUMO_FLOAT32},
        {"fp64", SUMO_FLOAT64}, {"double", SUMO_FLOAT64}, {"float64", SUMO_FLOAT64},
        {"fp16", SUMO_FLOAT16}, {"half", SUMO_FLOAT16}, {"float16", SUMO_FLOAT16},
        {"bf16", SUMO_BFLOAT16}, {"bfloat16", SUMO_BFLOAT16},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(s, names[i].name) == 0) {
            *out = names[i].dtype;
            return 0;
        }
    return -1;
}

static int parse_op(const char *s, int *out)
{
    if (strcmp(s, "sum") == 0) *out = SUMO_OP_SUM;
    else if (strcmp(s, "avg") == 0 || strcmp(s, "average") == 0) *out = SUMO_OP_AVERAGE;
    else if (strcmp(s, "adasum") == 0) *out = SUMO_OP_ADASUM;
    else if (strcmp(s, "acga") == 0) *out = BENCH_OP_ACGA;
    else return -1;
    return 0;
}

static int parse_algo(const char *s, sumo_algorithm *out)
{
    if (strcmp(s, "auto") == 0) *out = SUMO_ALGORITHM_AUTO;
    else if (strcmp(s, "shm") == 0) *out = SUMO_ALGORITHM_SHARED_MEMORY;
    else if (strcmp(s, "ring") == 0) *out = SUMO_ALGORITHM_RING;
    else if (strcmp(s, "rd") == 0) *out = SUMO_ALGORITHM_RECURSIVE_DOUBLING;
    else if (strcmp(s, "native") == 0) *out = SUMO_ALGORITHM_PEER;
    else return -1;
    return 0;
}

static const char *algo_name(sumo_algorithm a)
{
    switch (a) {
    case SUMO_ALGORITHM_AUTO: return "auto";
    case SUMO_ALGORITHM_SHARED_MEMORY: return "shm";
    case SUMO_ALGORITHM_RING: return "ring";
    case SUMO_ALGORITHM_RECURSIVE_DOUBLING: return "rd";
    case SUMO_ALGORITHM_PEER: return "native";
    default: return "?";
    }
}

static const char *op_label(int op)
{
    return op == SUMO_OP_AVERAGE ? "avg" : op == BENCH_OP_ACGA ? "acga" : sumo__op_name(op);
}

/* Comma-separated list; each item goes through parse_item. Returns the count or -1. */
static int parse_list(const char *s, int max, int *items, int (*parse_item)(const char *, int *))
{
    char tmp[256];
    if (strlen(s) >= sizeof tmp) return -1;
    strcpy(tmp, s);
    int n = 0;
    for (char *save = NULL, *tok = strtok_r(tmp, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (n == max || parse_item(tok, &items[n]) != 0) return -1;
        n++;
    }
    return n > 0 ? n : -1;
}

static int parse_rank_item(const char *s, int *out) { return parse_int(s, 1, 4096, out); }

static bool launched_by_mpirun(void)
{
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
}

/* Returns 0, 1 for --help, or 2 after printing a usage error. */
static int parse_options(int argc, char **argv, bench_opts *o)
{
    *o = (bench_opts){.ranks = {2, 4}, .nranks = 2, .min_bytes = 4 << 10,
                      .max_bytes = 256 * MIB, .step = 2, .dtype = SUMO_FLOAT32,
                      .ops = {SUMO_OP_SUM, SUMO_OP_AVERAGE, SUMO_OP_ADASUM}, .nops = 3,
                      .iters = 20, .warmup = 5, .pin = true, .mem_bytes = 256 * MIB,
                      .mem_reps = 10, .algo = SUMO_ALGORITHM_AUTO};
    o->transport = launched_by_mpirun() ? TRANSPORT_MPI : TRANSPORT_THREADS;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i], *val = NULL;
        char name[32];
        const char *eq = strchr(arg, '=');
        if (strncmp(arg, "--", 2) == 0 && eq && (size_t)(eq - arg) < sizeof name) {
            memcpy(name, arg, (size_t)(eq - arg));
            name[eq - arg] = '\0';
            val = eq + 1;
            arg = name;
        }
#define FLAG(s) (strcmp(arg, (s)) == 0)
#define VALUE()                                                                       \
    do {                                                                              \
        if (val == NULL) {                                                            \
            if (i + 1 >= argc) {                                                      \
                fprintf(stderr, "sumo bench: %s needs a value\n", arg);               \
                return 2;                                                             \
            }                                                                         \
            val = argv[++i];                                                          \
        }                                                                             \
    } while (0)
        int bad = 0;
        if (FLAG("--help") || FLAG("-h")) {
            usage(stdout);
            return 1;
        } else if (FLAG("--transport")) {
            VALUE();
            if (strcmp(val, "threads") == 0) o->transport = TRANSPORT_THREADS;
            else if (strcmp(val, "mpi") == 0) o->transport = TRANSPORT_MPI;
            else bad = 1;
            o->transport_set = true;
        } else if (FLAG("--ranks")) {
            VALUE();
            o->nranks = parse_list(val, MAX_RANK_LIST, o->ranks, parse_rank_item);
            bad = o->nranks < 0;
            o->ranks_set = true;
        } else if (FLAG("--min")) {
            VALUE();
            bad = parse_bytes(val, &o->min_bytes) != 0;
            o->min_set = true;
        } else if (FLAG("--max")) {
            VALUE();
            bad = parse_bytes(val, &o->max_bytes) != 0;
            o->max_set = true;
        } else if (FLAG("--step")) {
            VALUE();
            char *end = NULL;
            o->step = strtod(val, &end);
            bad = end == val || *end != '\0' || !(o->step >= 1.01 && o->step <= 1024);
            o->step_set = true;
        } else if (FLAG("--dtype")) {
            VALUE();
            bad = parse_dtype(val, &o->dtype) != 0;
        } else if (FLAG("--ops")) {
            VALUE();
            o->nops = parse_list(val, BENCH_NOPS, o->ops, parse_op);
            bad = o->nops < 0;
        } else if (FLAG("--iters")) {
            VALUE();
            bad = parse_int(val, 1, 100000, &o->iters) != 0;
            o->iters_set = true;
        } else if (FLAG("--warmup")) {
            VALUE();
            bad = parse_int(val, 0, 100000, &o->warmup) != 0;
            o->warmup_set = true;
        } else if (FLAG("--algo")) {
            VALUE();
            bad = parse_algo(val, &o->algo) != 0;
        } else if (FLAG("--mem-size")) {
            VALUE();
            bad = parse_bytes(val, &o->mem_bytes) != 0 || o->mem_bytes < MIB;
            o->mem_set = true;
        } else if (FLAG("--mem-reps")) {
            VALUE();
            bad = parse_int(val, 1, 10000, &o->mem_reps) != 0;
            o->mem_reps_set = true;
        } else if (FLAG("--csv")) {
            VALUE();
            o->csv_path = val;
        } else if (FLAG("--check")) {
            o->check = true;
        } else if (FLAG("--quick")) {
            o->quick = true;
        } else if (FLAG("--skip-mem")) {
            o->skip_mem = true;
        } else if (FLAG("--no-pin")) {
            o->pin = false;
        } else {
            fprintf(stderr, "sumo bench: unknown option '%s' (see sumo bench --help)\n", argv[i]);
            return 2;
        }
        if (bad) {
            fprintf(stderr, "sumo bench: bad value '%s' for %s\n", val, arg);
            return 2;
        }
#undef FLAG
#undef VALUE
    }
    /* --quick only changes what was not given explicitly. */
    if (o->quick) {
        if (!o->ranks_set) o->ranks[0] = 2, o->nranks = 1;
        if (!o->max_set) o->max_bytes = GOAL_BYTES;
        if (!o->step_set) o->step = 4;
        if (!o->iters_set) o->iters = 5;
        if (!o->warmup_set) o->warmup = 2;
        if (!o->mem_set) o->mem_bytes = 64 * MIB;
        if (!o->mem_reps_set) o->mem_reps = 3;
    }
    if (o->min_bytes > o->max_bytes) {
        fprintf(stderr, "sumo bench: --min %zu is above --max %zu\n", o->min_bytes, o->max_bytes);
        return 2;
    }
    return 0;
}

/* Message sizes from min to max, each a multiple of the element size. */
static int make_sizes(const bench_opts *o, size_t *sizes)
{
    size_t esz = sumo__dtype_bytes(o->dtype);
    size_t s = SUMO__MAX(o->min_bytes / esz * esz, esz);
    int n = 0;
    while (s <= o->max_bytes && n < MAX_SIZES) {
        sizes[n++] = s;
        double next = (double)s * o->step;
        size_t ns = (size_t)next / esz * esz;
        if (next >= (double)SIZE_MAX / 2) break;
        s = SUMO__MAX(ns, s + esz);
    }
    return n;
}

/* ---- statistics --------------------------------------------------------------------------- */

/* For the benchmark's own bookkeeping: without it no figure can be produced anyway. */
static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (p == NULL) {
        fprintf(stderr, "sumo bench: out of memory (%zu bytes)\n", bytes);
        exit(1);
    }
    return p;
}


static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median_of(const double *v, int n, double *min_out)
{
    double *s = xmalloc((size_t)n * sizeof *s);
    memcpy(s, v, (size_t)n * sizeof *s);
    qsort(s, (size_t)n, sizeof *s, cmp_double);
    double m = n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
    if (min_out) *min_out = s[0];
    free(s);
    return m;
}

/* ---- groups: the ranks of one measurement, threads or MPI processes ---------------------- */

typedef struct group group;
struct group {
    int rank, size;
    /* Every member reads the same clock, so stamps compare across members. */
    bool common_clock;
    int64_t base_ns; /* common origin of the stamps, so doubles hold them exactly */
    sumo_comm *comm; /* NULL for groups that only measure memory */
    sumo_algorithm algo;
    void (*sync)(group *g);
    /* v[i] = max over members of v[i], on every member. */
    void (*max)(group *g, double *v, size_t n);
    /* Replaces a communicator that a failure left unusable. */
    sumo_result (*renew)(group *g);
    void *impl;
};

static sumo_result configure_comm(sumo_comm *comm, sumo_algorithm algo)
{
    if (algo == SUMO_ALGORITHM_AUTO) return SUMO_SUCCESS;
    sumo_result r = sumo_comm_set_param(comm, SUMO_PARAM_ALGORITHM, algo);
    if (r == SUMO_ERR_INVALID_USAGE) {
        const char *name = "?";
        sumo_comm_transport(comm, &name);
        fprintf(stderr, "sumo bench: the %s transport has no '%s' algorithm\n", name, algo_name(algo));
    }
    return r;
}

/* Threads: members of a team share one address space. */
#define TEAM_SLOT 256

typedef struct team {
    int size;
    pthread_barrier_t bar;
    double *slots; /* size * TEAM_SLOT */
    sumo_comm **comms;
    sumo_algorithm algo;
    sumo_result renew_status;
    int (*body)(group *g, void *arg);
    void *arg;
    bool pin;
} team;

typedef struct member {
    group g;
    team *t;
    pthread_t tid;
    int result;
} member;

static void team_sync(group *g)
{
    team *t = g->impl;
    pthread_barrier_wait(&t->bar);
}

static void team_max(group *g, double *v, size_t n)
{
    team *t = g->impl;
    for (size_t off = 0; off < n; off += TEAM_SLOT) {
        size_t m = SUMO__MIN((size_t)TEAM_SLOT, n - off);
        memcpy(t->slots + (size_t)g->rank * TEAM_SLOT, v + off, m * sizeof *v);
        pthread_barrier_wait(&t->bar);
        for (size_t k = 0; k < m; k++) {
            double mx = -INFINITY;
            for (int r = 0; r < t->size; r++) mx = fmax(mx, t->slots[(size_t)r * TEAM_SLOT + k]);
            v[off + k] = mx;
        }
        /* Nobody overwrites a slot before everyone has read them all. */
        pthread_barrier_wait(&t->bar);
    }
}

static sumo_result team_renew(group *g)
{
    team *t = g->impl;
    sumo_comm_destroy(g->comm);
    t->comms[g->rank] = g->comm = NULL;
    pthread_barrier_wait(&t->bar);
    if (g->rank == 0) {
        t->renew_status = sumo_comm_create_threads(t->size, t->comms);
        if (t->renew_status != SUMO_SUCCESS)
            for (int r = 0; r < t->size; r++) t->comms[r] = NULL;
    }
    pthread_barrier_wait(&t->bar);
    if (t->renew_status != SUMO_SUCCESS) return t->renew_status;
    g->comm = t->comms[g->rank];
    return configure_comm(g->comm, g->algo);
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

static void *member_main(void *p)
{
    member *m = p;
    if (m->t->pin) pin_to_cpu(m->g.rank);
    m->result = m->t->body(&m->g, m->t->arg);
    return NULL;
}

/* Runs body on size threads, member r with comms[r] (comms may be NULL). Returns the largest
 * result of the bodies, or -1 when the threads could not be started. */
static int run_team(int size, sumo_comm **comms, sumo_algorithm algo, bool pin,
                    int (*body)(group *g, void *arg), void *arg)
{
    team t = {.size = size, .comms = comms, .algo = algo, .body = body, .arg = arg, .pin = pin};
    member *m = calloc((size_t)size, sizeof *m);
    t.slots = calloc((size_t)size * TEAM_SLOT, sizeof *t.slots);
    if (m == NULL || t.slots == NULL || pthread_barrier_init(&t.bar, NULL, (unsigned)size) != 0) {
        free(m);
        free(t.slots);
        fprintf(stderr, "sumo bench: cannot set up %d threads\n", size);
        return -1;
    }
    int64_t base = sumo__now_ns();
    for (int r = 0; r < size; r++) {
        m[r] = (member){.t = &t};
        m[r].g = (group){.rank = r, .size = size, .common_clock = true, .base_ns = base,
                         .comm = comms ? comms[r] : NULL, .algo = algo, .sync = team_sync,
                         .max = team_max, .renew = comms ? team_renew : NULL, .impl = &t};
    }
    for (int r = 0; r < size; r++) {
        if (pthread_create(&m[r].tid, NULL, member_main, &m[r]) != 0) {
            /* The started members would wait forever at the first barrier. */
            fprintf(stderr, "sumo bench: cannot start thread %d of %d\n", r, size);
            exit(1);
        }
    }
    int worst = 0;
    for (int r = 0; r < size; r++) {
        pthread_join(m[r].tid, NULL);
        worst = SUMO__MAX(worst, m[r].result);
    }
    pthread_barrier_destroy(&t.bar);
    free(t.slots);
    free(m);
    return worst;
}

#ifdef SUMO_HAVE_MPI
typedef struct mpi_group {
    MPI_Comm comm;
} mpi_group;

static void mpi_sync(group *g) { MPI_Barrier(((mpi_group *)g->impl)->comm); }

static void mpi_max(group *g, double *v, size_t n)
{
    MPI_Allreduce(MPI_IN_PLACE, v, (int)n, MPI_DOUBLE, MPI_MAX, ((mpi_group *)g->impl)->comm);
}

static sumo_result mpi_renew(group *g)
{
    sumo_comm_destroy(g->comm);
    g->comm = NULL;
    sumo_result r = sumo_comm_create_mpi(((mpi_group *)g->impl)->comm, &g->comm);
    if (r != SUMO_SUCCESS) return r;
    return configure_comm(g->comm, g->algo);
}

/* A common origin for the stamps: the earliest clock reading of the group. */
static int64_t mpi_common_base(MPI_Comm comm)
{
    long long now = (long long)sumo__now_ns(), base = 0;
    MPI_Allreduce(&now, &base, 1, MPI_LONG_LONG, MPI_MIN, comm);
    return (int64_t)base;
}
#endif

/* ---- timing ------------------------------------------------------------------------------- */

/*
 * Runs fn reps times on members [0, active) (the others only take part in the barriers) and
 * fills dur[] with each run's cost in nanoseconds, identical on every member. from_last_start
 * picks the collective's rule (from the last member's start) over the bandwidth rule (from
 * the first). Returns the largest status any member's fn returned.
 */
static int time_runs(group *g, int active, int reps, bool from_last_start,
                     int (*fn)(group *g, void *arg), void *arg, double *dur)
{
    size_t nv = 2 * (size_t)reps + 1;
    double *v = xmalloc(nv * sizeof *v);
    bool me = g->rank < active;
    int status = 0;
    for (int i = 0; i < reps; i++) {
        g->sync(g);
        int64_t t0 = sumo__now_ns();
        int r = me ? fn(g, arg) : 0;
        int64_t t1 = sumo__now_ns();
        if (r != 0 && status == 0) status = r;
        double s = (double)(t0 - g->base_ns), e = (double)(t1 - g->base_ns);
        if (!g->common_clock) {
            v[i] = me ? e - s : -INFINITY;
            v[reps + i] = -INFINITY;
        } else if (me) {
            v[i] = from_last_start ? s : -s;
            v[reps + i] = e;
        } else {
            v[i] = v[reps + i] = -INFINITY;
        }
    }
    v[2 * reps] = status;
    g->max(g, v, nv);
    for (int i = 0; i < reps; i++) {
        if (!g->common_clock) dur[i] = v[i];
        else dur[i] = v[reps + i] - (from_last_start ? v[i] : -v[i]);
    }
    status = (int)v[2 * reps];
    free(v);
    return status;
}

/* ---- data: deterministic inputs, references --------------------------------------------- */

/* splitmix64's output for state x: a stateless hash of the element's coordinates. */
static uint64_t mix64(uint64_t x) { return sumo__splitmix64(&x); }

/* Rank r's element i, uniform in [-1, 1) before rounding to the dtype. */
static double gen_value(int rank, size_t i)
{
    uint64_t h = mix64(((uint64_t)(unsigned)rank << 48) ^ (uint64_t)i);
    return (double)(h >> 11) * 0x1p-52 - 1.0;
}

static void store(sumo_dtype dtype, void *buf, size_t i, double v)
{
    switch (dtype) {
    case SUMO_FLOAT32: ((float *)buf)[i] = (float)v; break;
    case SUMO_FLOAT64: ((double *)buf)[i] = v; break;
    case SUMO_FLOAT16: ((uint16_t *)buf)[i] = sumo__float_to_half((float)v); break;
    case SUMO_BFLOAT16: ((uint16_t *)buf)[i] = sumo__float_to_bf16((float)v); break;
    default: break;
    }
}

static double load(sumo_dtype dtype, const void *buf, size_t i)
{
    switch (dtype) {
    case SUMO_FLOAT32: return ((const float *)buf)[i];
    case SUMO_FLOAT64: return ((const double *)buf)[i];
    case SUMO_FLOAT16: return sumo__half_to_float(((const uint16_t *)buf)[i]);
    case SUMO_BFLOAT16: return sumo__bf16_to_float(((const uint16_t *)buf)[i]);
    default: return NAN;
    }
}

/* The value rank r holds at i, exactly as stored in the dtype. */
static double stored_value(sumo_dtype dtype, int rank, size_t i)
{
    double v = gen_value(rank, i);
    switch (dtype) {
    case SUMO_FLOAT32: return (float)v;
    case SUMO_FLOAT16: return sumo__half_to_float(sumo__float_to_half((float)v));
    case SUMO_BFLOAT16: return sumo__bf16_to_float(sumo__float_to_bf16((float)v));
    default: return v;
    }
}

static void fill(sumo_dtype dtype, void *buf, size_t lo, size_t hi, int rank)
{
    for (size_t i = lo; i < hi; i++) store(dtype, buf, i, gen_value(rank, i));
}

/* Machine epsilon of the dtype and of the type it accumulates in. */
static double eps_of(sumo_dtype dtype)
{
    switch (dtype) {
    case SUMO_FLOAT64: return DBL_EPSILON;
    case SUMO_FLOAT16: return 0x1p-10;
    case SUMO_BFLOAT16: return 0x1p-7;
    default: return FLT_EPSILON;
    }
}

static double acc_eps_of(sumo_dtype dtype) { return dtype == SUMO_FLOAT64 ? DBL_EPSILON : FLT_EPSILON; }

/* Rounds v to the dtype (through fp32 for the narrow types, as the kernels do). */
static double round_to(sumo_dtype dtype, double v)
{
    switch (dtype) {
    case SUMO_FLOAT32: return (float)v;
    case SUMO_FLOAT16: return sumo__half_to_float(sumo__float_to_half((float)v));
    case SUMO_BFLOAT16: return sumo__bf16_to_float(sumo__float_to_bf16((float)v));
    default: return v;
    }
}

/* The header's sum and average, summed in rank order in the accumulator type. */
static double reference_sum(sumo_dtype dtype, int op, int p, size_t i, double *abs_sum)
{
    double s64 = 0, a = 0;
    float s32 = 0;
    for (int r = 0; r < p; r++) {
        double x = stored_value(dtype, r, i);
        a += fabs(x);
        if (dtype == SUMO_FLOAT64) s64 += x;
        else s32 += (float)x;
    }
    *abs_sum = a;
    if (dtype == SUMO_FLOAT64) return op == SUMO_OP_AVERAGE ? s64 / p : s64;
    if (op == SUMO_OP_AVERAGE) s32 /= (float)p;
    return round_to(dtype, s32);
}

enum check_verdict { CHECK_NONE, CHECK_EXACT, CHECK_OK, CHECK_NA, CHECK_FAIL };

static const char *verdict_name(int v)
{
    switch (v) {
    case CHECK_EXACT: return "exact";
    case CHECK_OK: return "ok";
    case CHECK_NA: return "n/a";
    case CHECK_FAIL: return "FAIL";
    default: return "-";
    }
}

/* Elementwise against the rank-order sum: bit-exact is what the shared-memory algorithms give;
 * other orders (ring, recursive doubling) are allowed P rounding errors of the accumulator plus
 * the final rounding to the dtype. */
static int check_sum(sumo_dtype dtype, int op, int p, const void *buf, size_t n, char *why, size_t whylen)
{
    bool exact = true;
    size_t bad = 0, first_bad = 0;
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double abs_sum, ref = reference_sum(dtype, op, p, i, &abs_sum);
        double got = load(dtype, buf, i);
        if (got == ref) continue;
        exact = false;
        double scale = op == SUMO_OP_AVERAGE ? abs_sum / p : abs_sum;
        double tol = p * acc_eps_of(dtype) * scale + eps_of(dtype) * fabs(ref) + 1e-30;
        double err = fabs(got - ref);
        if (!(err <= tol)) {
            if (bad++ == 0) first_bad = i;
            worst = fmax(worst, err / tol);
        }
    }
    if (bad) {
        snprintf(why, whylen, "%zu of %zu elements off (first at %zu, worst %.3g x tolerance)", bad,
                 n, first_bad, worst);
        return CHECK_FAIL;
    }
    return exact ? CHECK_EXACT : CHECK_OK;
}

/* Adasum(a, b) into a, per adasum.md: dot and norms in double; the combine in double for
 * fp32/fp64, in fp32 with an FMA for fp16/bf16; the result rounded to the dtype. */
static void adasum_pair(sumo_dtype dtype, double *a, const double *b, size_t n)
{
    double d = 0, na = 0, nb = 0;
    for (size_t i = 0; i < n; i++) {
        d += a[i] * b[i];
        na += a[i] * a[i];
        nb += b[i] * b[i];
    }
    double tiny = sqrt(DBL_MIN);
    double ca = na < tiny ? 1.0 : 1.0 - d / (2 * na);
    double cb = nb < tiny ? 1.0 : 1.0 - d / (2 * nb);
    for (size_t i = 0; i < n; i++) {
        if (dtype == SUMO_FLOAT32 || dtype == SUMO_FLOAT64) a[i] = round_to(dtype, ca * a[i] + cb * b[i]);
        else a[i] = round_to(dtype, fmaf((float)ca, (float)a[i], (float)cb * (float)b[i]));
    }
}

/*
 * Against the tree collectives/adasum.c defines for any P, written here independently: with P2
 * the largest power of two <= P and R = P - P2, the 2R leading ranks first combine in pairs
 * (w_i = A(u_2i, u_2i+1) for i < R, w_i = u_(i+R) after), then the balanced binary tree over
 * w_0 .. w_(P2-1) in order (for powers of two: the rank-order tree of docs/design/adasum.md).
 * Tolerance is Horovod's: relative L2 error below 100 epsilon of the dtype.
 */
static int check_adasum(sumo_dtype dtype, int p, const void *buf, size_t n, char *why, size_t whylen)
{
    /* The reference holds every rank's vector in double. malloc succeeds beyond the memory
     * (overcommit) and the OOM killer would end the run while filling it: skip instead. */
    double need = (double)p * (double)n * sizeof(double);
    double free_bytes = (double)sysconf(_SC_AVPHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    if (need > free_bytes / 2) {
        snprintf(why, whylen, "the reference needs %.1f GiB, more than half the free memory",
                 need / (1 << 30));
        return CHECK_NA;
    }
    double **v = calloc((size_t)p, sizeof *v);
    double **w = calloc((size_t)p, sizeof *w);
    bool ok = v != NULL && w != NULL;
    for (int r = 0; ok && r < p; r++) {
        v[r] = malloc(n * sizeof **v + 1);
        ok = v[r] != NULL;
        for (size_t i = 0; ok && i < n; i++) v[r][i] = stored_value(dtype, r, i);
    }
    int verdict = CHECK_NA;
    if (!ok) {
        snprintf(why, whylen, "no memory for the reference");
    } else {
        int p2 = 1;
        while (p2 * 2 <= p) p2 *= 2;
        int rem = p - p2;
        for (int i = 0; i < p2; i++) {
            if (i < rem) adasum_pair(dtype, v[2 * i], v[2 * i + 1], n);
            w[i] = i < rem ? v[2 * i] : v[i + rem];
        }
        for (int step = 1; step < p2; step *= 2)
            for (int i = 0; i + step < p2; i += 2 * step) adasum_pair(dtype, w[i], w[i + step], n);
        double e2 = 0, r2 = 0;
        bool exact = true;
        for (size_t i = 0; i < n; i++) {
            double got = load(dtype, buf, i), diff = got - w[0][i];
            exact = exact && got == w[0][i];
            e2 += diff * diff;
            r2 += w[0][i] * w[0][i];
        }
        double rel = r2 > 0 ? sqrt(e2 / r2) : sqrt(e2);
        if (exact) verdict = CHECK_EXACT;
        else if (rel < 100 * eps_of(dtype)) verdict = CHECK_OK;
        else {
            verdict = CHECK_FAIL;
            snprintf(why, whylen, "relative L2 error %.3g against the reference tree (limit %.3g)",
                     rel, 100 * eps_of(dtype));
        }
    }
    for (int r = 0; v && r < p; r++) free(v[r]);
    free(v);
    free(w);
    return verdict;
}

/* 32 bits of a hash of the buffer, exact in a double, to compare ranks' results. */
static double hash_bytes(const void *buf, size_t bytes)
{
    const unsigned char *p = buf;
    uint64_t h = 0x84222325cbf29ce4ULL;
    size_t i = 0;
    for (; i + 8 <= bytes; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        h = (h ^ w) * 0x100000001b3ULL;
        h ^= h >> 29;
    }
    for (; i < bytes; i++) h = (h ^ p[i]) * 0x100000001b3ULL;
    h = mix64(h);
    return (double)(uint32_t)(h ^ (h >> 32));
}

/* ---- memory bandwidth and kernels --------------------------------------------------------- */

typedef struct par_job par_job;
struct par_job {
    void (*fn)(par_job *job, int part);
    const char *name;
    int active;          /* workers: the operands are split in that many parts */
    size_t n;            /* elements per operand */
    size_t esz;          /* bytes per element; parts are cut at cache lines */
    double bytes;        /* bytes a run moves, counted as STREAM does (no write-allocate) */
    void *a, *b, *c;     /* threads share one set of operands, processes have their own */
    sumo_dtype dtype;
    size_t ntensors;     /* > 0: the operands hold that many tensors, one kernel call each */
    double *partial;     /* a slot per part, so reductions cannot be optimised away */
};

static void part_range(const par_job *j, int part, size_t *lo, size_t *hi)
{
    size_t unit = SUMO__CACHELINE / j->esz;
    size_t lines = (j->n + unit - 1) / unit;
    *lo = SUMO__MIN(lines * (size_t)part / (size_t)j->active * unit, j->n);
    *hi = SUMO__MIN(lines * (size_t)(part + 1) / (size_t)j->active * unit, j->n);
}

static size_t tensor_start(const par_job *j, size_t t) { return j->n * t / j->ntensors; }

/*
 * The STREAM loops, on fp64. They are held up against the kernels, so they must be as good
 * as the kernels at pulling bandwidth through one core: AVX2 (as the kernels use it) when the
 * CPU has it, else 16-byte vectors, which every x86-64 compiler turns into SSE2 without spills.
 * Unrolled so that enough loads are in flight; parts start on cache lines, so vectors align.
 */
typedef double vd2 __attribute__((vector_size(16)));

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define STREAM_HAVE_AVX2 1
typedef double vd4 __attribute__((vector_size(32)));
#define AVX2_FN __attribute__((target("avx2")))

AVX2_FN static void triad_avx2(double *a, const double *b, const double *c, size_t n)
{
    vd4 *x = (vd4 *)a;
    const vd4 *y = (const vd4 *)b, *z = (const vd4 *)c;
    const vd4 s = {3.0, 3.0, 3.0, 3.0};
    size_t nv = n / 4, i = 0;
    for (; i + 2 <= nv; i += 2) {
        x[i] = y[i] + s * z[i];
        x[i + 1] = y[i + 1] + s * z[i + 1];
    }
    for (; i < nv; i++) x[i] = y[i] + s * z[i];
}

AVX2_FN static void add_avx2(double *a, const double *b, size_t n)
{
    vd4 *x = (vd4 *)a;
    const vd4 *y = (const vd4 *)b;
    size_t nv = n / 4, i = 0;
    for (; i + 2 <= nv; i += 2) {
        x[i] += y[i];
        x[i + 1] += y[i + 1];
    }
    for (; i < nv; i++) x[i] += y[i];
}

AVX2_FN static double dot_avx2(const double *a, const double *b, size_t n)
{
    const vd4 *x = (const vd4 *)a, *y = (const vd4 *)b;
    vd4 s0 = {0, 0, 0, 0}, s1 = {0, 0, 0, 0};
    size_t nv = n / 4, i = 0;
    for (; i + 2 <= nv; i += 2) {
        s0 += x[i] * y[i];
        s1 += x[i + 1] * y[i + 1];
    }
    for (; i < nv; i++) s0 += x[i] * y[i];
    s0 += s1;
    return s0[0] + s0[1] + s0[2] + s0[3];
}
#else
#define STREAM_HAVE_AVX2 0
#endif

/* Set once by the main thread before any worker starts. */
static bool stream_avx2;

static void stream_pick_isa(void)
{
#if STREAM_HAVE_AVX2
    __builtin_cpu_init();
    stream_avx2 = __builtin_cpu_supports("avx2");
#endif
}

static void job_copy(par_job *j, int part)
{
    size_t lo, hi;
    part_range(j, part, &lo, &hi);
    /* memcpy is what compilers turn a copy loop into anyway. */
    memcpy((double *)j->c + lo, (const double *)j->a + lo, (hi - lo) * sizeof(double));
}

static void job_triad(par_job *j, int part)
{
    size_t lo, hi;
    part_range(j, part, &lo, &hi);
#if STREAM_HAVE_AVX2
    if (stream_avx2) {
        triad_avx2((double *)j->a + lo, (const double *)j->b + lo, (const double *)j->c + lo, hi - lo);
        return;
    }
#endif
    vd2 *a = (vd2 *)((double *)j->a + lo);
    const vd2 *b = (const vd2 *)((const double *)j->b + lo), *c = (const vd2 *)((const double *)j->c + lo);
    const vd2 s = {3.0, 3.0};
    size_t nv = (hi - lo) / 2, i = 0;
    for (; i + 4 <= nv; i += 4) {
        a[i] = b[i] + s * c[i];
        a[i + 1] = b[i + 1] + s * c[i + 1];
        a[i + 2] = b[i + 2] + s * c[i + 2];
        a[i + 3] = b[i + 3] + s * c[i + 3];
    }
    for (; i < nv; i++) a[i] = b[i] + s * c[i];
}

static void job_add(par_job *j, int part)
{
    size_t lo, hi;
    part_range(j, part, &lo, &hi);
#if STREAM_HAVE_AVX2
    if (stream_avx2) {
        add_avx2((double *)j->a + lo, (const double *)j->b + lo, hi - lo);
        return;
    }
#endif
    vd2 *a = (vd2 *)((double *)j->a + lo);
    const vd2 *b = (const vd2 *)((const double *)j->b + lo);
    size_t nv = (hi - lo) / 2, i = 0;
    for (; i + 4 <= nv; i += 4) {
        a[i] += b[i];
        a[i + 1] += b[i + 1];
        a[i + 2] += b[i + 2];
        a[i + 3] += b[i + 3];
    }
    for (; i < nv; i++) a[i] += b[i];
}

static void job_dot(par_job *j, int part)
{
    size_t lo, hi;
    part_range(j, part, &lo, &hi);
#if STREAM_HAVE_AVX2
    if (stream_avx2) {
        j->partial[part] = dot_avx2((const double *)j->a + lo, (const double *)j->b + lo, hi - lo);
        return;
    }
#endif
    const vd2 *a = (const vd2 *)((const double *)j->a + lo), *b = (const vd2 *)((const double *)j->b + lo);
    vd2 s0 = {0, 0}, s1 = {0, 0}, s2 = {0, 0}, s3 = {0, 0};
    size_t nv = (hi - lo) / 2, i = 0;
    for (; i + 4 <= nv; i += 4) {
        s0 += a[i] * b[i];
        s1 += a[i + 1] * b[i + 1];
        s2 += a[i + 2] * b[i + 2];
        s3 += a[i + 3] * b[i + 3];
    }
    for (; i < nv; i++) s0 += a[i] * b[i];
    s0 += s1 + s2 + s3;
    j->partial[part] = s0[0] + s0[1];
}

static unsigned char *at(const par_job *j, void *base, size_t i) { return (unsigned char *)base + i * j->esz; }

static void job_reduce_2x2(par_job *j, int part)
{
    size_t lo, hi;
    part_range(j, part, &lo, &hi);
    void *outs[2] = {at(j, j->a, lo), at(j, j->b, lo)};
    const void *ins[2] = {outs[0], outs[1]};
    sumo__reduce_multi(j->dtype, outs, 2, ins, 2, hi - lo, 1);
}

static void job_reduce_2x1(par_job *j, int part)
{
    size_t lo, hi;
    part_range(j, part, &lo, &hi);
    void *outs[1] = {at(j, j->a, lo)};
    const void *ins[2] = {outs[0], at(j, j->b, lo)};
    sumo__reduce_multi(j->dtype, outs, 1, ins, 2, hi - lo, 1);
}

static void job_dot_norms(par_job *j, int part)
{
    size_t lo, hi;
    part_range(j, part, &lo, &hi);
    double out[3];
    sumo__kernel_dot_norms(j->dtype, at(j, j->a, lo), at(j, j->b, lo), hi - lo, out);
    j->partial[part] = out[0] + out[1] + out[2];
}

static void job_scaled_add(par_job *j, int part)
{
    size_t lo, hi;
    part_range(j, part, &lo, &hi);
    /* Halves keep the values where they are run after run. */
    sumo__kernel_scaled_add(j->dtype, at(j, j->a, lo), 0.5, at(j, j->b, lo), 0.5, hi - lo);
}

static void tensor_parts(const par_job *j, int part, size_t *t0, size_t *t1)
{
    *t0 = j->ntensors * (size_t)part / (size_t)j->active;
    *t1 = j->ntensors * (size_t)(part + 1) / (size_t)j->active;
}

static void job_dot_norms_tensors(par_job *j, int part)
{
    size_t t0, t1;
    tensor_parts(j, part, &t0, &t1);
    double acc = 0, out[3];
    for (size_t t = t0; t < t1; t++) {
        size_t lo = tensor_start(j, t), hi = tensor_start(j, t + 1);
        sumo__kernel_dot_norms(j->dtype, at(j, j->a, lo), at(j, j->b, lo), hi - lo, out);
        acc += out[0] + out[1] + out[2];
    }
    j->partial[part] = acc;
}

static void job_scaled_add_tensors(par_job *j, int part)
{
    size_t t0, t1;
    tensor_parts(j, part, &t0, &t1);
    for (size_t t = t0; t < t1; t++) {
        size_t lo = tensor_start(j, t), hi = tensor_start(j, t + 1);
        sumo__kernel_scaled_add(j->dtype, at(j, j->a, lo), 0.5, at(j, j->b, lo), 0.5, hi - lo);
    }
}

static int run_part(group *g, void *arg)
{
    par_job *j = arg;
    j->fn(j, g->rank);
    return 0;
}

enum { STREAM_COPY, STREAM_TRIAD, STREAM_ADD, STREAM_DOT, NSTREAM };
static const char *const stream_names[NSTREAM] = {"copy", "triad", "a+=b", "dot"};

enum { K_REDUCE_2X2, K_REDUCE_2X1, K_DOT_NORMS, K_SCALED_ADD, K_DOT_NORMS_T, K_SCALED_ADD_T, NKERNELS };

typedef struct kernel_desc {
    void (*fn)(par_job *j, int part);
    const char *name;
    const char *csv_name;
    int operand_passes; /* operand-sized transfers a run makes */
    int bound;          /* the STREAM figure it is held against */
    bool tensors;
} kernel_desc;

static const kernel_desc kernel_descs[NKERNELS] = {
    [K_REDUCE_2X2] = {job_reduce_2x2, "reduce_multi 2 in/2 out, in place", "reduce_multi_2x2", 4,
                      STREAM_ADD, false},
    [K_REDUCE_2X1] = {job_reduce_2x1, "reduce_multi a+=b (2 in/1 out)", "reduce_multi_2x1", 3,
                      STREAM_ADD, false},
    [K_DOT_NORMS] = {job_dot_norms, "dot_norms", "dot_norms", 2, STREAM_DOT, false},
    [K_SCALED_ADD] = {job_scaled_add, "scaled_add a=ca*a+cb*b", "scaled_add", 3, STREAM_ADD, false},
    [K_DOT_NORMS_T] = {job_dot_norms_tensors, "dot_norms, 1000 tensors", "dot_norms_1000_tensors",
                       2, STREAM_DOT, true},
    [K_SCALED_ADD_T] = {job_scaled_add_tensors, "scaled_add, 1000 tensors",
                        "scaled_add_1000_tensors", 3, STREAM_ADD, true},
};

#define MAX_MEM_T 8

/* Both memory-side arrays sets: a, b, c (mem_bytes each) for the STREAM loops, ka, kb (64 MiB
 * each) for the kernels. Threads share one set and split it; MPI ranks each own one. */
typedef struct mem_arrays {
    void *a, *b, *c, *ka, *kb;
    size_t bytes, kbytes;
    double *partial;
} mem_arrays;

typedef struct mem_results {
    int nt;
    int threads[MAX_MEM_T];
    double stream[MAX_MEM_T][NSTREAM]; /* GB/s */
    int nk;
    int kthreads[MAX_MEM_T];
    double kernel[MAX_MEM_T][NKERNELS]; /* GB/s */
    double kbound[MAX_MEM_T][NKERNELS]; /* GB/s of the bound, measured in alternation */
    /* The floor, per rank count: the goal-size allreduce and a+=b, measured in alternation. */
    int nf;
    int franks[MAX_RANK_LIST];
    double f_us[MAX_RANK_LIST], f_bw[MAX_RANK_LIST];
    size_t f_bytes;
} mem_results;

typedef struct mem_ctx {
    const bench_opts *o;
    int active;
    const mem_arrays *ma;
    bool kernels; /* the sumo kernels against their bounds instead of the STREAM table */
    double gbps[(int)NKERNELS > (int)NSTREAM ? (int)NKERNELS : (int)NSTREAM];
    double bound[NKERNELS];
} mem_ctx;

static void fill_part(par_job *j, int part, int rank_seed)
{
    size_t lo, hi;
    part_range(j, part, &lo, &hi);
    fill(j->dtype, j->a, lo, hi, rank_seed);
    fill(j->dtype, j->b, lo, hi, rank_seed + 1);
    if (j->c) fill(j->dtype, j->c, lo, hi, rank_seed + 2);
}

/* Median GB/s of job over reps runs, after one untimed run. */
static double measure_job(group *g, const bench_opts *o, par_job *j)
{
    double *dur = xmalloc((size_t)o->mem_reps * sizeof *dur);
    time_runs(g, j->active, 1, false, run_part, j, dur);
    time_runs(g, j->active, o->mem_reps, false, run_part, j, dur);
    double med = median_of(dur, o->mem_reps, NULL);
    free(dur);
    return j->bytes / med; /* bytes per ns = GB/s */
}

/* Runs x and y in alternation, so that both medians see the same machine: a virtual machine's
 * bandwidth drifts by tens of percent between one second and the next. */
static void measure_pair(group *g, int reps, int x_active, bool x_from_last,
                         int (*xfn)(group *g, void *arg), void *xarg, double *x_med,
                         par_job *y, double *y_med)
{
    double *dx = xmalloc((size_t)reps * sizeof *dx), *dy = xmalloc((size_t)reps * sizeof *dy);
    time_runs(g, x_active, 1, x_from_last, xfn, xarg, dx);
    time_runs(g, y->active, 1, false, run_part, y, dy);
    for (int i = 0; i < reps; i++) {
        time_runs(g, x_active, 1, x_from_last, xfn, xarg, &dx[i]);
        time_runs(g, y->active, 1, false, run_part, y, &dy[i]);
    }
    *x_med = median_of(dx, reps, NULL);
    *y_med = median_of(dy, reps, NULL);
    free(dx);
    free(dy);
}

static void (*const stream_fns[NSTREAM])(par_job *, int) = {job_copy, job_triad, job_add, job_dot};
static const int stream_passes[NSTREAM] = {2, 3, 3, 2};

/* The STREAM loop k over operands of `bytes` each, split among active workers. */
static par_job stream_job(const mem_arrays *ma, int k, size_t bytes, int active)
{
    size_t n = bytes / sizeof(double);
    return (par_job){.fn = stream_fns[k], .active = active, .n = n, .esz = sizeof(double),
                     .bytes = (double)stream_passes[k] * (double)(n * sizeof(double)), .a = ma->a,
                     .b = ma->b, .c = k == STREAM_COPY || k == STREAM_TRIAD ? ma->c : NULL,
                     .dtype = SUMO_FLOAT64, .partial = ma->partial};
}

static int mem_body(group *g, void *arg)
{
    mem_ctx *m = arg;
    const mem_arrays *ma = m->ma;
    if (!m->kernels) {
        for (int k = 0; k < NSTREAM; k++) {
            par_job j = stream_job(ma, k, ma->bytes, m->active);
            if (g->rank < m->active) fill_part(&j, g->rank, 7 * g->rank);
            double gbps = measure_job(g, m->o, &j);
            if (g->rank == 0) m->gbps[k] = gbps;
        }
        return 0;
    }
    size_t esz = sumo__dtype_bytes(m->o->dtype), n = ma->kbytes / esz;
    for (int k = 0; k < NKERNELS; k++) {
        const kernel_desc *d = &kernel_descs[k];
        par_job kj = {.fn = d->fn, .active = m->active, .n = n, .esz = esz,
                      .bytes = (double)d->operand_passes * (double)(n * esz), .a = ma->ka,
                      .b = ma->kb, .dtype = m->o->dtype, .ntensors = d->tensors ? NTENSORS : 0,
                      .partial = ma->partial};
        par_job bj = stream_job(ma, d->bound, ma->kbytes, m->active);
        /* Each worker refills its own part, so every kernel starts from the same values. */
        if (g->rank < m->active) {
            fill_part(&kj, g->rank, 7 * g->rank);
            fill_part(&bj, g->rank, 7 * g->rank);
        }
        double kt, bt;
        measure_pair(g, m->o->mem_reps, m->active, false, run_part, &kj, &kt, &bj, &bt);
        if (g->rank == 0) {
            m->gbps[k] = kj.bytes / kt;
            m->bound[k] = bj.bytes / bt;
        }
    }
    return 0;
}

/* ---- the allreduce sweep ------------------------------------------------------------------ */

typedef struct row {
    int ranks;
    size_t bytes;
    int op;
    int status; /* sumo_result of the op; 0 when it ran */
    double med_us, min_us;
    bool has_peer;
    double peer_med_us, peer_min_us;
    int check;
} row;

typedef struct bench_ctx {
    const bench_opts *o;
    const char *transport;
    size_t sizes[MAX_SIZES];
    int nsizes;
    bool printer; /* this process prints (rank 0 of the run) */
    bool peer;    /* MPI_Allreduce is measured beside sumo */
    FILE *csv;
    row *rows;
    size_t nrows, cap;
    int failures;
    mem_results mem;
    int nodes;         /* machines the ranks run on */
    int world_size;    /* ranks of the sweep being run */
    int ranks_on_node; /* ranks sharing this machine */
} bench_ctx;

/* Opened by the printing rank only, so that no other rank truncates its file. */
static int open_csv(bench_ctx *c)
{
    if (c->o->csv_path == NULL || !c->printer) return 0;
    c->csv = fopen(c->o->csv_path, "w");
    if (c->csv == NULL) {
        fprintf(stderr, "sumo bench: cannot write %s: %s\n", c->o->csv_path, strerror(errno));
        return -1;
    }
    fprintf(c->csv, "section,transport,ranks,dtype,op,bytes,count,time_us,min_us,gbps,busbw_gbps,"
                    "ref_us,ratio,check,status\n");
    return 0;
}

static void record_row(bench_ctx *c, const row *r)
{
    if (c->nrows == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 64;
        row *p = realloc(c->rows, cap * sizeof *p);
        if (p == NULL) return;
        c->rows = p;
        c->cap = cap;
    }
    c->rows[c->nrows++] = *r;
}

static const row *find_row(const bench_ctx *c, int ranks, size_t bytes, int op)
{
    for (size_t i = 0; i < c->nrows; i++)
        if (c->rows[i].ranks == ranks && c->rows[i].bytes == bytes && c->rows[i].op == op)
            return &c->rows[i];
    return NULL;
}

/* One CSV row; the columns are described in usage(). */
static void csv_row(bench_ctx *c, const char *section, int ranks, const char *dtype, const char *op,
                    double bytes, size_t count, double us, double min_us, double gbps, double busbw,
                    double ref_us, double ratio, const char *check, const char *status)
{
    if (c->csv == NULL) return;
    fprintf(c->csv, "%s,%s,%d,%s,%s,%.0f,%zu,%.3f,%.3f,%.4f,%.4f,%.3f,%.4f,%s,%s\n", section,
            c->transport, ranks, dtype, op, bytes, count, us, min_us, gbps, busbw, ref_us, ratio,
            check, status);
}

static void print_table_header(bench_ctx *c, int p)
{
    const bench_opts *o = c->o;
    printf("#\n# allreduce, transport %s, P = %d, dtype %s, in place, algorithm %s\n"
           "# time = median of %d iterations after %d warm-up, from the last rank's start to the "
           "last rank's end%s\n",
           c->transport, p, sumo__dtype_name(o->dtype), algo_name(o->algo), o->iters, o->warmup,
           c->nodes > 1 ? " (ranks on several machines: largest per-rank time instead)" : "");
    if (c->peer)
        printf("# peer = MPI_Allreduce(MPI_IN_PLACE, MPI_SUM) on the same buffers (also for avg, "
               "which MPI lacks, and adasum); ratio = sumo time / peer time\n");
    printf("#\n#%11s %12s %6s %7s %11s %11s %12s %12s %6s", "size(B)", "count", "type", "redop",
           "time(us)", "min(us)", "algbw(GB/s)", "busbw(GB/s)", "check");
    if (c->peer) printf(" %11s %7s", "peer(us)", "ratio");
    printf("\n");
    fflush(stdout);
}

static void print_row(bench_ctx *c, const row *r, const char *err_detail)
{
    const bench_opts *o = c->o;
    size_t count = r->bytes / sumo__dtype_bytes(o->dtype);
    char peer[32] = "-", ratio[32] = "-";
    if (r->has_peer) {
        snprintf(peer, sizeof peer, "%.2f", r->peer_med_us);
        if (r->status == 0) snprintf(ratio, sizeof ratio, "%.3f", r->med_us / r->peer_med_us);
    }
    double algbw = r->bytes / (r->med_us * 1e3);
    double busbw = algbw * 2.0 * (r->ranks - 1) / r->ranks;
    if (r->status == 0)
        printf("%12zu %12zu %6s %7s %11.2f %11.2f %12.3f %12.3f %6s", r->bytes, count,
               sumo__dtype_name(o->dtype), op_label(r->op), r->med_us, r->min_us, algbw, busbw,
               verdict_name(r->check));
    else
        printf("%12zu %12zu %6s %7s %11s %11s %12s %12s %6s", r->bytes, count,
               sumo__dtype_name(o->dtype), op_label(r->op), "n/a", "n/a", "n/a", "n/a",
               verdict_name(r->check));
    if (c->peer) printf(" %11s %7s", peer, ratio);
    if (r->status != 0) printf("  # %s%s%s", sumo_result_name((sumo_result)r->status),
                               err_detail && *err_detail ? ": " : "", err_detail ? err_detail : "");
    printf("\n");
    fflush(stdout);
    csv_row(c, "allreduce", r->ranks, sumo__dtype_name(o->dtype), op_label(r->op), (double)r->bytes, count,
            r->status ? NAN : r->med_us, r->status ? NAN : r->min_us, r->status ? NAN : algbw,
            r->status ? NAN : busbw, r->has_peer ? r->peer_med_us : NAN,
            r->has_peer && !r->status ? r->med_us / r->peer_med_us : NAN, verdict_name(r->check),
            sumo_result_name((sumo_result)r->status));
}

typedef struct coll_call {
    void *buf;
    size_t count;
    sumo_dtype dtype;
    int op;
    bool peer;
    sumo_aggregator *acga; /* op BENCH_OP_ACGA */
} coll_call;

static int call_collective(group *g, void *arg)
{
    coll_call *c = arg;
    if (c->op == BENCH_OP_ACGA) return (int)sumo_aggregator_apply(c->acga, c->buf, c->count, c->dtype);
    if (!c->peer) return (int)sumo_allreduce(c->buf, c->buf, c->count, c->dtype, (sumo_op)c->op, g->comm);
#ifdef SUMO_HAVE_MPI
    MPI_Datatype t = c->dtype == SUMO_FLOAT64 ? MPI_DOUBLE : MPI_FLOAT;
    int r = MPI_Allreduce(MPI_IN_PLACE, c->buf, (int)c->count, t, MPI_SUM, MPI_COMM_WORLD);
    return r == MPI_SUCCESS ? 0 : (int)SUMO_ERR_INTERNAL;
#else
    return (int)SUMO_ERR_INVALID_USAGE;
#endif
}

/* Warm-up, then the timed iterations; stats in microseconds. */
static int measure_collective(group *g, const bench_opts *o, coll_call *call, double *dur,
                              double *med_us, double *min_us)
{
    int st = 0;
    if (o->warmup > 0) st = time_runs(g, g->size, o->warmup, true, call_collective, call, dur);
    if (st == 0) st = time_runs(g, g->size, o->iters, true, call_collective, call, dur);
    double mn = NAN, med = st == 0 ? median_of(dur, o->iters, &mn) : NAN;
    *med_us = med / 1e3;
    *min_us = mn / 1e3;
    return st;
}

/* One allreduce on fresh data, then the reference on the printing rank and a hash on all. */
static int check_collective(group *g, bench_ctx *c, coll_call *call, char *why, size_t whylen)
{
    fill(call->dtype, call->buf, 0, call->count, g->rank);
    double v[3] = {(double)call_collective(g, call), 0, 0};
    double h = hash_bytes(call->buf, call->count * sumo__dtype_bytes(call->dtype));
    v[1] = h;
    v[2] = -h;
    g->max(g, v, 3);
    if (v[0] != 0) return CHECK_NONE; /* the timed run reports the failure */
    if (!c->printer || g->rank != 0) return CHECK_NONE;
    if (v[1] != -v[2]) {
        snprintf(why, whylen, "ranks ended with different bits");
        return CHECK_FAIL;
    }
    if (call->op == SUMO_OP_ADASUM)
        return check_adasum(call->dtype, g->size, call->buf, call->count, why, whylen);
    if (call->op == BENCH_OP_ACGA) {
        snprintf(why, whylen, "acga: ranks agree bit for bit; its values are checked by test_acga");
        return CHECK_NA;
    }
    return check_sum(call->dtype, call->op, g->size, call->buf, call->count, why, whylen);
}

static bool breaks_comm(int status)
{
    return status == SUMO_ERR_TIMEOUT || status == SUMO_ERR_PEER_FAILURE || status == SUMO_ERR_INTERNAL;
}

static int sweep_body(group *g, void *arg)
{
    bench_ctx *c = arg;
    const bench_opts *o = c->o;
    bool printer = c->printer && g->rank == 0;
    size_t esz = sumo__dtype_bytes(o->dtype);
    size_t max_bytes = c->sizes[c->nsizes - 1];
    void *buf = aligned_alloc(4096, (max_bytes + 4095) / 4096 * 4096);
    double *dur = malloc((size_t)SUMO__MAX(o->iters, o->warmup) * sizeof *dur);
    double ok = buf && dur ? 0 : 1;
    g->max(g, &ok, 1);
    if (ok != 0) {
        if (buf == NULL || dur == NULL) fprintf(stderr, "sumo bench: rank %d: cannot allocate %zu bytes\n", g->rank, max_bytes);
        free(buf);
        free(dur);
        return 1;
    }
    if (printer) print_table_header(c, g->size);
    bool told[BENCH_NOPS] = {false};
    for (int si = 0; si < c->nsizes; si++) {
        size_t bytes = c->sizes[si], count = bytes / esz;
        row base = {.ranks = g->size, .bytes = bytes};
        if (c->peer && count <= (size_t)INT32_MAX) {
            coll_call peer = {buf, count, o->dtype, SUMO_OP_SUM, true, NULL};
            fill(o->dtype, buf, 0, count, g->rank);
            int st = measure_collective(g, o, &peer, dur, &base.peer_med_us, &base.peer_min_us);
            base.has_peer = st == 0;
        }
        for (int oi = 0; oi < o->nops; oi++) {
            row r = base;
            r.op = o->ops[oi];
            coll_call call = {buf, count, o->dtype, r.op, false, NULL};
            char why[256] = "";
            sumo_aggregator_options acga_opts;
            if (r.op == BENCH_OP_ACGA) {
                sumo_aggregator_options_default(SUMO_AGGREGATE_ACGA, &acga_opts);
                r.status = sumo_aggregator_create(g->comm, &acga_opts, &call.acga);
            }
            if (r.status == 0 && o->check) r.check = check_collective(g, c, &call, why, sizeof why);
            fill(o->dtype, buf, 0, count, g->rank);
            if (r.status == 0) r.status = measure_collective(g, o, &call, dur, &r.med_us, &r.min_us);
            sumo_aggregator_destroy(call.acga);
            const char *detail = NULL;
            if (r.status != 0 && g->comm) sumo_comm_error_message(g->comm, &detail);
            if (printer) {
                bool first = r.status != 0 && !told[r.op];
                print_row(c, &r, first ? detail : NULL);
                if (r.check == CHECK_FAIL || r.check == CHECK_NA)
                    printf("#   check %s: %s\n", verdict_name(r.check), why);
                /* An op the library refuses is reported, not a failure of the run. */
                bool refused = r.status == SUMO_ERR_INVALID_ARGUMENT || r.status == SUMO_ERR_INVALID_USAGE;
                bool optional = r.op == SUMO_OP_ADASUM || r.op == BENCH_OP_ACGA;
                if (r.check == CHECK_FAIL || (r.status != 0 && !(refused && optional)))
                    c->failures++;
                if (r.status != 0) told[r.op] = true;
                record_row(c, &r);
            }
            if (breaks_comm(r.status) && g->renew) {
                sumo_result rr = g->renew(g);
                if (rr != SUMO_SUCCESS) {
                    if (printer) printf("# cannot replace the broken communicator: %s\n", sumo_result_name(rr));
                    free(buf);
                    free(dur);
                    return 1;
                }
            }
        }
    }
    free(buf);
    free(dur);
    return 0;
}

/*
 * The floor of an in-place allreduce on shared memory: each of the P buffers read once and
 * written once, 2 P S bytes, at the bandwidth of a+=b with P workers (a+=b reads two streams
 * and writes one, like the reduction). The goal-size sum and a+=b run in alternation.
 */
typedef struct floor_ctx {
    const bench_opts *o;
    const mem_arrays *ma;
    size_t bytes;
    double us, bw; /* set by rank 0 */
} floor_ctx;

static int floor_body(group *g, void *arg)
{
    floor_ctx *f = arg;
    const bench_opts *o = f->o;
    void *buf = aligned_alloc(4096, (f->bytes + 4095) / 4096 * 4096);
    double fail = buf == NULL;
    g->max(g, &fail, 1);
    if (fail != 0) {
        free(buf);
        return 1;
    }
    size_t count = f->bytes / sumo__dtype_bytes(o->dtype);
    fill(o->dtype, buf, 0, count, g->rank);
    coll_call call = {buf, count, o->dtype, SUMO_OP_SUM, false, NULL};
    par_job add = stream_job(f->ma, STREAM_ADD, f->ma->bytes, g->size);
    fill_part(&add, g->rank, 7 * g->rank);
    double t_us, t_add;
    measure_pair(g, o->iters, g->size, true, call_collective, &call, &t_us, &add, &t_add);
    if (g->rank == 0) {
        f->us = t_us / 1e3;
        f->bw = add.bytes / t_add;
    }
    free(buf);
    return 0;
}

/* ---- report sections ---------------------------------------------------------------------- */

static void print_machine(bench_ctx *c)
{
    char host[256] = "?", model[256] = "?";
    gethostname(host, sizeof host - 1);
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[512];
        while (fgets(line, sizeof line, f))
            if (strncmp(line, "model name", 10) == 0) {
                const char *p = strchr(line, ':');
                if (p) {
                    snprintf(model, sizeof model, "%s", p + 2);
                    model[strcspn(model, "\n")] = '\0';
                }
                break;
            }
        fclose(f);
    }
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    double mem_gib = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE) / (1 << 30);
    const bench_opts *o = c->o;
    printf("# sumo bench (sumo %d.%d.%d)\n", SUMO_VERSION_MAJOR, SUMO_VERSION_MINOR, SUMO_VERSION_PATCH);
    printf("# machine: %s, %s, %ld cpus, %.1f GiB\n", host, model, cores, mem_gib);
    printf("# kernels: %s (sumo__kernel_isa)\n", sumo__kernel_isa());
    printf("# transport: %s", c->transport);
    if (o->transport == TRANSPORT_THREADS) {
        printf(", P =");
        for (int i = 0; i < o->nranks; i++) printf("%s%d", i ? "," : " ", o->ranks[i]);
        printf(", threads %s\n", o->pin ? "pinned one per cpu (round robin)" : "not pinned");
    } else {
        const char *shm = getenv("SUMO_MPI_SHM");
        printf(", P = %d on %d machine(s), SUMO_MPI_SHM=%s\n", c->world_size, c->nodes,
               shm ? shm : "(unset)");
    }
    printf("# dtype: %s, ops:", sumo__dtype_name(o->dtype));
    for (int i = 0; i < o->nops; i++) printf("%s%s", i ? "," : " ", op_label(o->ops[i]));
    printf(", sizes %zu to %zu B (x%g)%s\n", c->sizes[0], c->sizes[c->nsizes - 1], o->step,
           o->check ? ", results checked" : "");
    fflush(stdout);
}

static void print_stream(bench_ctx *c)
{
    const mem_results *m = &c->mem;
    printf("#\n# memory bandwidth: STREAM-like %s loops over fp64 arrays of %zu MiB, median of %d "
           "(bytes counted as STREAM does: no write-allocate); each %s on its own part\n",
           stream_avx2 ? "AVX2" : "SSE2", c->o->mem_bytes / MIB, c->o->mem_reps,
           c->o->transport == TRANSPORT_THREADS ? "thread" : "rank of this machine");
    printf("#%9s", "threads");
    for (int k = 0; k < NSTREAM; k++) printf(" %9s(GB/s)", stream_names[k]);
    printf("\n");
    for (int i = 0; i < m->nt; i++) {
        printf("#%9d", m->threads[i]);
        for (int k = 0; k < NSTREAM; k++) {
            printf(" %15.2f", m->stream[i][k]);
            csv_row(c, "memory", m->threads[i], "fp64", stream_names[k],
                    (double)stream_passes[k] * (double)c->o->mem_bytes, 0, NAN, NAN,
                    m->stream[i][k], NAN, NAN, NAN, "-", "SUMO_SUCCESS");
        }
        printf("\n");
    }
    fflush(stdout);
}

static void print_kernels(bench_ctx *c, size_t kbytes)
{
    const mem_results *m = &c->mem;
    printf("#\n# kernels (%s, %s, %zu MiB per operand, median of %d) against the STREAM loop "
           "moving the same kind of traffic with as many threads, run in alternation with it; "
           "goal >= 80%%\n",
           sumo__kernel_isa(), sumo__dtype_name(c->o->dtype), kbytes / MIB, c->o->mem_reps);
    printf("#%-36s %7s %10s %8s %10s %7s\n", " kernel", "threads", "GB/s", "bound", "GB/s", "ratio");
    for (int i = 0; i < m->nk; i++) {
        for (int k = 0; k < NKERNELS; k++) {
            const kernel_desc *d = &kernel_descs[k];
            double bound = m->kbound[i][k], ratio = m->kernel[i][k] / bound;
            printf("# %-35s %7d %10.2f %8s %10.2f %6.0f%%%s\n", d->name, m->kthreads[i],
                   m->kernel[i][k], stream_names[d->bound], bound, 100 * ratio,
                   ratio >= 0.8 ? "" : "  below goal");
            csv_row(c, "kernel", m->kthreads[i], sumo__dtype_name(c->o->dtype), d->csv_name,
                    (double)kbytes * d->operand_passes, 0, NAN, NAN, m->kernel[i][k], NAN, NAN,
                    ratio, "-", "SUMO_SUCCESS");
        }
    }
    fflush(stdout);
}

/* Size at which the goals are read: 64 MiB when swept, else the largest size swept. */
static size_t goal_size(const bench_ctx *c)
{
    for (int i = 0; i < c->nsizes; i++)
        if (c->sizes[i] == GOAL_BYTES) return GOAL_BYTES;
    return c->sizes[c->nsizes - 1];
}

static void print_derived(bench_ctx *c)
{
    const bench_opts *o = c->o;
    const mem_results *m = &c->mem;
    size_t gs = goal_size(c);
    const char *dt = sumo__dtype_name(o->dtype);
    printf("#\n# derived figures%s\n", gs == GOAL_BYTES ? "" : " (64 MiB not swept: read at the largest size)");
    for (int i = 0; i < m->nf; i++) {
        int p = m->franks[i];
        double floor_us = 2.0 * p * (double)m->f_bytes / m->f_bw[i] / 1e3;
        double ratio = m->f_us[i] / floor_us;
        printf("#   floor, P=%d %zu B %s sum: %.1f us; its %d buffers read and written once at "
               "the %d-worker a+=b bandwidth (%.2f GB/s, measured in alternation) take %.1f us: "
               "%.2fx",
               p, m->f_bytes, dt, m->f_us[i], p, p, m->f_bw[i], floor_us, ratio);
        if (o->transport == TRANSPORT_THREADS && p == 2)
            printf(" (goal <= 1.5x: %s)", ratio <= 1.5 ? "met" : "NOT met");
        printf("\n");
        csv_row(c, "floor", p, dt, "sum", (double)m->f_bytes, m->f_bytes / sumo__dtype_bytes(o->dtype),
                m->f_us[i], NAN, m->f_bw[i], NAN, floor_us, ratio, "-", "SUMO_SUCCESS");
    }
    int nps = o->transport == TRANSPORT_THREADS ? o->nranks : 1;
    for (int pi = 0; pi < nps; pi++) {
        int p = o->transport == TRANSPORT_THREADS ? o->ranks[pi] : c->world_size;
        size_t probe[3] = {4 << 10, MIB, gs};
        for (int k = 0; k < 3; k++) {
            if (k > 0 && probe[k] == probe[k - 1]) continue;
            const row *s = find_row(c, p, probe[k], SUMO_OP_SUM);
            const row *a = find_row(c, p, probe[k], SUMO_OP_ADASUM);
            if (c->peer && s && s->status == 0 && s->has_peer) {
                double ratio = s->med_us / s->peer_med_us;
                printf("#   P=%d %9zu B sum: sumo %.2f us, MPI_Allreduce %.2f us, ratio %.3f", p,
                       probe[k], s->med_us, s->peer_med_us, ratio);
                if (probe[k] == GOAL_BYTES) printf(" (goal <= 0.4: %s)", ratio <= 0.4 ? "met" : "NOT met");
                printf("\n");
            }
            if (s && a && s->status == 0 && a->status == 0)
                printf("#   P=%d %9zu B adasum/sum time: %.2f (E3: \"almost as efficient as summing\")\n",
                       p, probe[k], a->med_us / s->med_us);
            const row *ac = find_row(c, p, probe[k], BENCH_OP_ACGA);
            const row *av = find_row(c, p, probe[k], SUMO_OP_AVERAGE);
            if (ac && av && ac->status == 0 && av->status == 0)
                printf("#   P=%d %9zu B acga/avg time: %.2f (ACGA: \"at almost the cost of an average\")\n",
                       p, probe[k], ac->med_us / av->med_us);
        }
    }
    if (m->nk > 0) {
        int worst_k = 0, worst_i = 0;
        double worst = INFINITY;
        for (int i = 0; i < m->nk; i++)
            for (int k = 0; k < NKERNELS; k++) {
                double r = m->kernel[i][k] / m->kbound[i][k];
                if (r < worst) worst = r, worst_k = k, worst_i = i;
            }
        printf("#   kernels: lowest is %s with %d thread(s) at %.0f%% of its bound (goal >= 80%%: %s)\n",
               kernel_descs[worst_k].name, m->kthreads[worst_i], 100 * worst,
               worst >= 0.8 ? "met" : "NOT met");
    }
    fflush(stdout);
}

/* Worker counts of the STREAM table: 1, 2 and each rank count (ranks share the machine). */
static int mem_thread_counts(const bench_ctx *c, int *t)
{
    int cand[MAX_RANK_LIST + 2] = {1, 2};
    int nc = 2, n = 0;
    if (c->o->transport == TRANSPORT_THREADS)
        for (int i = 0; i < c->o->nranks; i++) cand[nc++] = c->o->ranks[i];
    else
        cand[1] = c->ranks_on_node;
    for (int i = 0; i < nc && n < MAX_MEM_T; i++) {
        bool dup = false;
        for (int k = 0; k < n; k++) dup = dup || t[k] == cand[i];
        if (!dup) t[n++] = cand[i];
    }
    return n;
}

static void free_arrays(mem_arrays *ma)
{
    free(ma->a);
    free(ma->b);
    free(ma->c);
    free(ma->ka);
    free(ma->kb);
    free(ma->partial);
    *ma = (mem_arrays){0};
}

static int alloc_arrays(mem_arrays *ma, const bench_opts *o, int parts)
{
    size_t esz = sumo__dtype_bytes(o->dtype);
    *ma = (mem_arrays){.bytes = o->mem_bytes / 64 * 64,
                       .kbytes = SUMO__MIN(GOAL_BYTES, o->mem_bytes) / 64 * 64 / esz * esz};
    size_t rb = (ma->bytes + 4095) / 4096 * 4096, rk = (ma->kbytes + 4095) / 4096 * 4096;
    ma->a = aligned_alloc(4096, rb);
    ma->b = aligned_alloc(4096, rb);
    ma->c = aligned_alloc(4096, rb);
    ma->ka = aligned_alloc(4096, rk);
    ma->kb = aligned_alloc(4096, rk);
    ma->partial = calloc((size_t)parts, sizeof *ma->partial);
    if (ma->a && ma->b && ma->c && ma->ka && ma->kb && ma->partial) return 0;
    free_arrays(ma);
    return -1;
}

/* Runs a memory body with `active` workers: a team of that many threads (threads transport),
 * or this machine's ranks of which `active` work (MPI). */
typedef int (*mem_runner)(void *env, int active, int (*body)(group *g, void *arg), void *arg);

static int run_mem_sections(bench_ctx *c, mem_runner run, void *env, const mem_arrays *ma)
{
    int t[MAX_MEM_T];
    int nt = mem_thread_counts(c, t);
    mem_results *m = &c->mem;
    for (int i = 0; i < nt; i++) {
        mem_ctx mc = {.o = c->o, .active = t[i], .ma = ma};
        if (run(env, t[i], mem_body, &mc) != 0) return -1;
        m->threads[m->nt] = t[i];
        memcpy(m->stream[m->nt++], mc.gbps, sizeof m->stream[0]);
    }
    if (c->printer) print_stream(c);
    /* The goals are stated for one worker and for two. */
    for (int i = 0; i < nt; i++) {
        if (t[i] > 2) continue;
        mem_ctx mc = {.o = c->o, .active = t[i], .ma = ma, .kernels = true};
        if (run(env, t[i], mem_body, &mc) != 0) return -1;
        m->kthreads[m->nk] = t[i];
        memcpy(m->kernel[m->nk], mc.gbps, sizeof m->kernel[0]);
        memcpy(m->kbound[m->nk++], mc.bound, sizeof m->kbound[0]);
    }
    if (c->printer) print_kernels(c, ma->kbytes);
    return 0;
}

static void record_floor(bench_ctx *c, int p, const floor_ctx *f)
{
    mem_results *m = &c->mem;
    if (m->nf == MAX_RANK_LIST) return;
    m->f_bytes = f->bytes;
    m->franks[m->nf] = p;
    m->f_us[m->nf] = f->us;
    m->f_bw[m->nf++] = f->bw;
}

/* ---- transports --------------------------------------------------------------------------- */

typedef struct threads_env {
    const bench_opts *o;
} threads_env;

static int threads_mem_runner(void *env, int active, int (*body)(group *g, void *arg), void *arg)
{
    threads_env *e = env;
    return run_team(active, NULL, SUMO_ALGORITHM_AUTO, e->o->pin, body, arg);
}

static int bench_threads(bench_ctx *c)
{
    const bench_opts *o = c->o;
    c->printer = true;
    c->nodes = 1;
    print_machine(c);
    mem_arrays ma = {0};
    int maxp = 2;
    for (int i = 0; i < o->nranks; i++) maxp = SUMO__MAX(maxp, o->ranks[i]);
    if (!o->skip_mem) {
        threads_env env = {o};
        if (alloc_arrays(&ma, o, maxp) != 0) {
            fprintf(stderr, "sumo bench: cannot allocate the arrays of the memory runs (%zu bytes each)\n",
                    o->mem_bytes);
            return 1;
        }
        if (run_mem_sections(c, threads_mem_runner, &env, &ma) != 0) {
            free_arrays(&ma);
            return 1;
        }
    }
    int status = 0;
    for (int i = 0; i < o->nranks; i++) {
        int p = o->ranks[i];
        sumo_comm **comms = calloc((size_t)p, sizeof *comms);
        sumo_result r = comms ? sumo_comm_create_threads(p, comms) : SUMO_ERR_SYSTEM;
        for (int k = 0; r == SUMO_SUCCESS && k < p; k++) r = configure_comm(comms[k], o->algo);
        if (r != SUMO_SUCCESS) {
            fprintf(stderr, "sumo bench: threads communicator of %d ranks (algorithm %s): %s\n", p,
                    algo_name(o->algo), sumo_strerror(r));
            status = 1;
        } else {
            c->world_size = c->ranks_on_node = p;
            if (run_team(p, comms, o->algo, o->pin, sweep_body, c) != 0) status = 1;
            floor_ctx f = {.o = o, .ma = &ma, .bytes = goal_size(c)};
            if (!o->skip_mem && run_team(p, comms, o->algo, o->pin, floor_body, &f) == 0)
                record_floor(c, p, &f);
        }
        for (int k = 0; comms && k < p; k++) sumo_comm_destroy(comms[k]);
        free(comms);
    }
    print_derived(c);
    free_arrays(&ma);
    return status;
}

#ifdef SUMO_HAVE_MPI
typedef struct mpi_env {
    group node;
} mpi_env;

static int mpi_mem_runner(void *env, int active, int (*body)(group *g, void *arg), void *arg)
{
    (void)active; /* the body's context says which ranks of the machine work */
    mpi_env *e = env;
    return body(&e->node, arg);
}

static bool any_rank(bool mine)
{
    int v = mine, any = 0;
    MPI_Allreduce(&v, &any, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD);
    return any != 0;
}

static int bench_mpi(bench_ctx *c)
{
    const bench_opts *o = c->o;
    int provided = 0;
    /* sumo's asynchronous requests call MPI from a progress thread. */
    if (MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
        fprintf(stderr, "sumo bench: MPI_Init_thread failed\n");
        return 1;
    }
    int rank, size, node_rank, node_size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm node_comm;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node_comm);
    MPI_Comm_rank(node_comm, &node_rank);
    MPI_Comm_size(node_comm, &node_size);
    int leader = node_rank == 0, nodes = 0;
    MPI_Allreduce(&leader, &nodes, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    c->printer = rank == 0;
    c->nodes = nodes;
    c->world_size = size;
    c->ranks_on_node = node_size;
    c->peer = o->dtype == SUMO_FLOAT32 || o->dtype == SUMO_FLOAT64;
    int status = 0;
    mpi_group node_impl = {node_comm}, world_impl = {MPI_COMM_WORLD};
    mpi_env env = {.node = {.rank = node_rank, .size = node_size, .common_clock = true,
                            .base_ns = mpi_common_base(node_comm), .sync = mpi_sync,
                            .max = mpi_max, .impl = &node_impl}};
    group world = {.rank = rank, .size = size, .common_clock = nodes == 1,
                   .base_ns = nodes == 1 ? mpi_common_base(MPI_COMM_WORLD) : sumo__now_ns(),
                   .algo = o->algo, .sync = mpi_sync, .max = mpi_max, .renew = mpi_renew,
                   .impl = &world_impl};
    mem_arrays ma = {0};
    if (any_rank(open_csv(c) != 0)) {
        status = 1;
        goto out;
    }
    if (c->printer) {
        print_machine(c);
        char version[MPI_MAX_LIBRARY_VERSION_STRING];
        int len = 0;
        MPI_Get_library_version(version, &len);
        version[strcspn(version, "\n")] = '\0';
        printf("# mpi: %s; thread level %d of %d; %d rank(s) per machine\n", version, provided,
               MPI_THREAD_MULTIPLE, node_size);
        if (o->ranks_set) printf("# (--ranks is for the threads transport; P is mpirun's -np)\n");
        fflush(stdout);
    }
    if (!o->skip_mem) {
        if (any_rank(alloc_arrays(&ma, o, node_size + 1) != 0)) {
            fprintf(stderr, "sumo bench: rank %d: cannot allocate the memory-run arrays\n", rank);
            status = 1;
            goto out;
        }
        if (run_mem_sections(c, mpi_mem_runner, &env, &ma) != 0) {
            status = 1;
            goto out;
        }
    }
    sumo_result r = sumo_comm_create_mpi(MPI_COMM_WORLD, &world.comm);
    if (r == SUMO_SUCCESS) r = configure_comm(world.comm, o->algo);
    if (r != SUMO_SUCCESS)
        fprintf(stderr, "sumo bench: rank %d: MPI communicator (algorithm %s): %s\n", rank,
                algo_name(o->algo), sumo_strerror(r));
    if (any_rank(r != SUMO_SUCCESS)) {
        status = 1;
        goto out;
    }
    if (sweep_body(&world, c) != 0) status = 1;
    /* The floor needs every rank on this machine (a+=b with P workers) */
    floor_ctx f = {.o = o, .ma = &ma, .bytes = goal_size(c)};
    if (!o->skip_mem && nodes == 1 && floor_body(&world, &f) == 0 && c->printer) record_floor(c, size, &f);
    if (c->printer) print_derived(c);
out:
    sumo_comm_destroy(world.comm);
    free_arrays(&ma);
    MPI_Comm_free(&node_comm);
    MPI_Finalize();
    return status;
}
#endif

int sumo_cmd_bench(int argc, char **argv)
{
    bench_opts o;
    int pr = parse_options(argc, argv, &o);
    if (pr == 1) return 0;
    if (pr != 0) return pr;
    bench_ctx *c = calloc(1, sizeof *c);
    if (c == NULL) return 1;
    stream_pick_isa();
    c->o = &o;
    c->transport = o.transport == TRANSPORT_MPI ? "mpi" : "threads";
    c->nsizes = make_sizes(&o, c->sizes);
    if (c->nsizes == 0) {
        fprintf(stderr, "sumo bench: no message size between --min and --max\n");
        free(c);
        return 2;
    }
    int status;
    if (o.transport == TRANSPORT_MPI) {
#ifdef SUMO_HAVE_MPI
        status = bench_mpi(c);
#else
        fprintf(stderr, "sumo bench: this sumo was built without MPI (no mpicc at build time); "
                        "use --transport threads\n");
        status = 2;
#endif
    } else {
        c->printer = true;
        status = open_csv(c) != 0 ? 1 : bench_threads(c);
    }
    if (c->csv) fclose(c->csv);
    if (status == 0 && c->failures > 0) status = 1;
    free(c->rows);
    free(c);
    return status;
}
