/*
 * Collectives on the MPI transport, run under mpirun with any number of processes: every
 * collective, dtype and algorithm against a sequential reference each process computes for
 * itself (every rank can generate every rank's input), bit-identity across ranks, ranks that
 * disagree, invalid buffers, and a rank that never arrives. Rank 0 prints the verdict (checks
 * counted over all ranks); the exit status is non-zero on the rank that saw a failure.
 *
 * Environment:
 *   SUMO_TEST_BIG=1    also allreduce and broadcast 2^29+3 fp32 (2 GiB + 12 bytes: messages
 *                      above INT_MAX bytes); about 6 GiB of memory per rank, so run it by hand
 *                      with -np 2.
 *   SUMO_TEST_BENCH=1  only time sumo_allreduce (shared-memory path) against MPI_Allreduce,
 *                      fp32 SUM of 4 KiB, 1 MiB and 64 MiB, and print the medians.
 */
#include "sumo.h"
#include "sumo_mpi.h"
#include "support/harness.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int rank, size, passed, failed;

/* A check that every rank makes; failures are printed by the rank that saw them. */
#define CHECK(cond, ...)                                                            \
    do {                                                                            \
        if (cond) passed++;                                                         \
        else {                                                                      \
            failed++;                                                               \
            fprintf(stderr, "rank %d FAIL %s:%d: ", rank, __FILE__, __LINE__);      \
            fprintf(stderr, __VA_ARGS__);                                           \
            fputc('\n', stderr);                                                    \
        }                                                                           \
    } while (0)

static const sumo_dtype dtypes[] = {SUMO_FLOAT32, SUMO_FLOAT64, SUMO_FLOAT16, SUMO_BFLOAT16};
static const char *const dtype_names[] = {"fp32", "fp64", "fp16", "bf16"};
/* Unit roundoff of each dtype above. */
static const double dtype_eps[] = {0x1p-24, 0x1p-53, 0x1p-11, 0x1p-8};

/* Rank r's element i: small integers (sums exact in every dtype and order) or random floats;
 * the generator of the unit test (support/harness.c). */
static double value(int r, size_t i, bool integer)
{
    return harness_collective_value(r, i, integer);
}

static const char *op_name(sumo_op op)
{
    return op == SUMO_OP_SUM ? "sum" : op == SUMO_OP_AVERAGE ? "average" : "other op";
}

/* v as stored in dtype d. */
static double rounded(int d, double v)
{
    unsigned char b[8];
    harness_set(dtypes[d], b, 0, v);
    return harness_get(dtypes[d], b, 0);
}

static double seconds_since(const struct timespec *t0)
{
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0->tv_sec) + (double)(t1.tv_nsec - t0->tv_nsec) * 1e-9;
}

/* True when every rank holds the same bytes (a hash of them is gathered). */
static bool same_everywhere(const void *buf, size_t bytes)
{
    uint64_t h = 0xcbf29ce484222325ull;
    const uint64_t *w = buf;
    for (size_t i = 0; i < bytes / 8; i++) h = (h ^ w[i]) * 0x100000001b3ull;
    for (size_t i = bytes / 8 * 8; i < bytes; i++) h = (h ^ ((const unsigned char *)buf)[i]) * 0x100000001b3ull;
    uint64_t *all = malloc(sizeof *all * (size_t)size);
    MPI_Allgather(&h, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, MPI_COMM_WORLD);
    bool same = true;
    for (int r = 0; r < size; r++) same = same && all[r] == h;
    free(all);
    return same;
}

/* One way to run a collective: a handle and the algorithm forced on it. */
typedef struct target {
    sumo_comm *comm;
    sumo_algorithm algo;
    const char *name;
} target;

/*
 * The sequential reference of an allreduce, with the tolerance of each element: integer sums
 * are exact (so is their average when dividing by a power of two); otherwise any summation
 * order, one rounding per partial sum plus the final rounding (fp16's subnormal spacing is
 * the floor). Computed once and compared against every target.
 */
static void allreduce_reference(int d, sumo_op op, bool integer, size_t n, double *want, double *tol)
{
    bool exact = integer && (op == SUMO_OP_SUM || (size & (size - 1)) == 0);
    for (size_t i = 0; i < n; i++) {
        double w = 0, mag = 0;
        for (int k = 0; k < size; k++) {
            double v = rounded(d, value(k, i, integer));
            w += v;
            mag += fabs(v);
        }
        if (op == SUMO_OP_AVERAGE) {
            w /= size;
            mag /= size;
        }
        want[i] = w;
        tol[i] = exact ? 0 : 4 * dtype_eps[d] * (mag + fabs(w)) + (d == 2 ? 0x1p-24 : 0);
    }
}

static void test_allreduce(const target *targets, int ntargets)
{
    const size_t counts[] = {0, 1, 7, 13, 1000, ((size_t)1 << 20) + 3};
    /* Cases: integer SUM, integer AVERAGE, random-float SUM. */
    const struct { sumo_op op; bool integer; } cases[] = {
        {SUMO_OP_SUM, true}, {SUMO_OP_AVERAGE, true}, {SUMO_OP_SUM, false}};
    for (int d = 0; d < 4; d++)
        for (size_t cs = 0; cs < sizeof cases / sizeof cases[0]; cs++)
            for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
                sumo_op op = cases[cs].op;
                bool integer = cases[cs].integer;
                size_t n = counts[c], esz = harness_dtype_size(dtypes[d]);
                double *want = malloc(n * sizeof *want + 1), *tol = malloc(n * sizeof *tol + 1);
                allreduce_reference(d, op, integer, n, want, tol);
                unsigned char *in = malloc(n * esz + 1), *out = malloc(n * esz + 1);
                for (int t = 0; t < ntargets; t++)
                    for (int in_place = 0; in_place < 2; in_place++) {
                        const target *tg = &targets[t];
                        for (size_t i = 0; i < n; i++) harness_set(dtypes[d], in, i, value(rank, i, integer));
                        unsigned char *dst = in_place ? in : out;
                        sumo_comm_set_param(tg->comm, SUMO_PARAM_ALGORITHM, tg->algo);
                        sumo_result r = sumo_allreduce(in, dst, n, dtypes[d], op, tg->comm);
                        if (tg->algo == SUMO_ALGORITHM_PEER && d >= 2) {
                            /* MPI has no fp16/bf16: refused alike on every rank. */
                            CHECK(r == SUMO_ERR_INVALID_USAGE, "%s allreduce %s n %zu: %s", tg->name,
                                  dtype_names[d], n, sumo_result_name(r));
                            continue;
                        }
                        size_t bad = 0;
                        for (size_t i = 0; i < n; i++)
                            if (!(fabs(harness_get(dtypes[d], dst, i) - want[i]) <= tol[i])) bad++;
                        CHECK(r == SUMO_SUCCESS && bad == 0,
                              "%s allreduce %s %s%s n %zu in_place %d: %s, %zu wrong", tg->name,
                              dtype_names[d], op_name(op), integer ? "" : " random", n,
                              in_place, sumo_result_name(r), bad);
                        CHECK(same_everywhere(dst, n * esz), "%s allreduce %s n %zu: ranks differ",
                              tg->name, dtype_names[d], n);
                    }
                free(in);
                free(out);
                free(want);
                free(tol);
            }
    for (int t = 0; t < ntargets; t++) sumo_comm_set_param(targets[t].comm, SUMO_PARAM_ALGORITHM, SUMO_ALGORITHM_AUTO);
}

static void test_gather_and_broadcast(sumo_comm *comm, const char *name)
{
    const size_t counts[] = {0, 1, 7, 13, 1000, 100003};
    for (int d = 0; d < 4; d++)
        for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++)
            for (int in_place = 0; in_place < 2; in_place++) {
                size_t n = counts[c], esz = harness_dtype_size(dtypes[d]);
                unsigned char *in = malloc(n * esz + 1), *out = malloc(n * esz * (size_t)size + 1);
                unsigned char *send = in_place ? out + (size_t)rank * n * esz : in;
                for (size_t i = 0; i < n; i++) harness_set(dtypes[d], send, i, value(rank, i, true));
                sumo_result r = sumo_allgather(send, out, n, dtypes[d], comm);
                size_t bad = 0;
                for (int k = 0; k < size && r == SUMO_SUCCESS; k++)
                    for (size_t i = 0; i < n; i++)
                        if (harness_get(dtypes[d], out, (size_t)k * n + i) != rounded(d, value(k, i, true))) bad++;
                CHECK(r == SUMO_SUCCESS && bad == 0, "%s allgather %s n %zu in_place %d: %s, %zu wrong",
                      name, dtype_names[d], n, in_place, sumo_result_name(r), bad);
                for (int root = 0; root < size; root++) {
                    unsigned char *buf = in_place ? in : out;
                    for (size_t i = 0; i < n; i++) harness_set(dtypes[d], in, i, value(rank, i, false));
                    r = sumo_broadcast(in, buf, n, dtypes[d], root, comm);
                    bad = 0;
                    for (size_t i = 0; i < n && r == SUMO_SUCCESS; i++)
                        if (harness_get(dtypes[d], buf, i) != rounded(d, value(root, i, false))) bad++;
                    CHECK(r == SUMO_SUCCESS && bad == 0, "%s broadcast %s n %zu root %d in_place %d: %s, %zu wrong",
                          name, dtype_names[d], n, root, in_place, sumo_result_name(r), bad);
                }
                free(in);
                free(out);
            }
    for (int i = 0; i < 3; i++) CHECK(sumo_barrier(comm) == SUMO_SUCCESS, "%s barrier", name);
}

static void test_disagreement(sumo_comm *comm, const char *name)
{
    float buf[64] = {0}, out[64 * 8];
    sumo_result r = sumo_allreduce(buf, out, rank == size - 1 ? 63 : 64, SUMO_FLOAT32, SUMO_OP_SUM, comm);
    CHECK(r == SUMO_ERR_MISMATCH, "%s count mismatch: %s", name, sumo_result_name(r));
    r = sumo_allreduce(buf, out, 16, rank == 0 ? SUMO_FLOAT64 : SUMO_FLOAT32, SUMO_OP_SUM, comm);
    CHECK(r == SUMO_ERR_MISMATCH, "%s dtype mismatch: %s", name, sumo_result_name(r));
    r = sumo_allreduce(buf, out, 16, SUMO_FLOAT32, rank == 0 ? SUMO_OP_AVERAGE : SUMO_OP_SUM, comm);
    CHECK(r == SUMO_ERR_MISMATCH, "%s op mismatch: %s", name, sumo_result_name(r));
    r = sumo_broadcast(buf, out, 16, SUMO_FLOAT32, rank == 0 ? 1 : 0, comm);
    CHECK(r == SUMO_ERR_MISMATCH, "%s root mismatch: %s", name, sumo_result_name(r));
    r = rank == 0 ? sumo_barrier(comm) : sumo_allgather(buf, out, 8, SUMO_FLOAT32, comm);
    CHECK(r == SUMO_ERR_MISMATCH, "%s barrier against allgather: %s", name, sumo_result_name(r));
    const char *msg = "";
    sumo_comm_error_message(comm, &msg);
    CHECK(strstr(msg, "rank") != NULL, "%s mismatch message names a rank: '%s'", name, msg);
    r = sumo_allreduce(rank == 0 ? NULL : buf, out, 16, SUMO_FLOAT32, SUMO_OP_SUM, comm);
    CHECK(r == SUMO_ERR_INVALID_ARGUMENT, "%s NULL buffer on rank 0: %s", name, sumo_result_name(r));
    sumo_comm_error_message(comm, &msg);
    CHECK(rank == 0 || strstr(msg, "rank 0") != NULL, "%s message names rank 0: '%s'", name, msg);
    r = sumo_broadcast(buf, out, 16, SUMO_FLOAT32, size, comm);
    CHECK(r == SUMO_ERR_INVALID_ARGUMENT, "%s root out of range: %s", name, sumo_result_name(r));
    /* Still usable afterwards, and NaN passes through. */
    for (int i = 0; i < 64; i++) buf[i] = 1.0f;
    if (rank == 0) buf[3] = NAN;
    r = sumo_allreduce(buf, buf, 64, SUMO_FLOAT32, SUMO_OP_SUM, comm);
    CHECK(r == SUMO_SUCCESS && buf[0] == (float)size && isnan(buf[3]), "%s usable after mismatch: %s",
          name, sumo_result_name(r));
}

/*
 * Rank size-1 skips an allreduce. Done last, on its own handle: the handle is broken
 * afterwards, and its destroy then frees only local memory, so every rank still reaches
 * MPI_Finalize.
 */
static void test_rank_that_never_arrives(const char *name)
{
    sumo_comm *comm = NULL;
    sumo_result r = sumo_comm_create_mpi(MPI_COMM_WORLD, &comm);
    CHECK(r == SUMO_SUCCESS, "%s: create for the timeout test: %s", name, sumo_result_name(r));
    if (comm == NULL) return;
    sumo_comm_set_timeout(comm, 1.0);
    float buf[16] = {0};
    if (rank == size - 1) {
        sleep(2);
        /* Arrives after everyone gave up. With shared memory it sees their abort at once;
         * over messages only, MPI may match the collective its peers abandoned (a mismatch)
         * and the next call then times out. */
        r = sumo_barrier(comm);
        CHECK(r == SUMO_ERR_PEER_FAILURE || r == SUMO_ERR_TIMEOUT || r == SUMO_ERR_MISMATCH,
              "%s: late rank: %s", name, sumo_result_name(r));
        if (r == SUMO_ERR_MISMATCH) {
            r = sumo_barrier(comm);
            CHECK(r == SUMO_ERR_TIMEOUT, "%s: late rank, second call: %s", name, sumo_result_name(r));
        }
    } else {
        /* Had it waited for the late rank, it would have met that rank's barrier and
         * reported a mismatch: these statuses show the deadline ended the wait. */
        r = sumo_allreduce(buf, buf, 16, SUMO_FLOAT32, SUMO_OP_SUM, comm);
        CHECK(r == SUMO_ERR_TIMEOUT || r == SUMO_ERR_PEER_FAILURE, "%s: waiting rank: %s", name,
              sumo_result_name(r));
        const char *msg = "";
        sumo_comm_error_message(comm, &msg);
        CHECK(strlen(msg) > 10, "%s: timeout message: '%s'", name, msg);
    }
    r = sumo_allreduce(buf, buf, 16, SUMO_FLOAT32, SUMO_OP_SUM, comm);
    CHECK(r == SUMO_ERR_PEER_FAILURE, "%s: broken communicator refuses work at once: %s", name,
          sumo_result_name(r));
    sumo_comm_destroy(comm);
    MPI_Barrier(MPI_COMM_WORLD);
}

/* The non-allreduce tests on one handle, with each algorithm forced that it accepts. */
static void run_suite(sumo_comm *comm, const char *name)
{
    const char *transport = "";
    sumo_comm_transport(comm, &transport);
    CHECK(strcmp(transport, "mpi") == 0, "transport name %s", transport);
    const sumo_algorithm forced[] = {SUMO_ALGORITHM_AUTO, SUMO_ALGORITHM_SHARED_MEMORY, SUMO_ALGORITHM_RING,
                                 SUMO_ALGORITHM_RECURSIVE_DOUBLING, SUMO_ALGORITHM_PEER};
    const char *const forced_names[] = {"auto", "shm", "ring", "recursive-doubling", "native"};
    for (int a = 0; a < 5; a++) {
        if (sumo_comm_set_param(comm, SUMO_PARAM_ALGORITHM, forced[a]) != SUMO_SUCCESS) continue; /* not on this path */
        char label[64];
        snprintf(label, sizeof label, "%s/%s", name, forced_names[a]);
        /* Forcing SHM or not decides the path of broadcast and allgather too. */
        if (forced[a] <= SUMO_ALGORITHM_RING) test_gather_and_broadcast(comm, label);
        test_disagreement(comm, label);
    }
    sumo_comm_set_param(comm, SUMO_PARAM_ALGORITHM, SUMO_ALGORITHM_AUTO);
}

/* Every allreduce algorithm on both paths: shared memory, and point-to-point messages only
 * (SUMO_MPI_SHM=0), as between machines. */
static void test_all_targets(sumo_comm *shm, sumo_comm *p2p)
{
    static const struct { sumo_algorithm algo; const char *name; } algos[] = {
        {SUMO_ALGORITHM_AUTO, "auto"}, {SUMO_ALGORITHM_SHARED_MEMORY, "shm"}, {SUMO_ALGORITHM_RING, "ring"},
        {SUMO_ALGORITHM_RECURSIVE_DOUBLING, "recursive-doubling"}, {SUMO_ALGORITHM_PEER, "native"}};
    char names[10][64];
    target targets[10];
    int n = 0;
    for (int path = 0; path < 2; path++)
        for (int a = 0; a < 5; a++) {
            sumo_comm *comm = path == 0 ? shm : p2p;
            if (comm == NULL || sumo_comm_set_param(comm, SUMO_PARAM_ALGORITHM, algos[a].algo) != SUMO_SUCCESS) continue;
            snprintf(names[n], sizeof names[n], "%s/%s", path == 0 ? "shared-memory node" : "point-to-point",
                     algos[a].name);
            targets[n] = (target){.comm = comm, .algo = algos[a].algo, .name = names[n]};
            n++;
        }
    test_allreduce(targets, n);
}

/* 2^29+3 fp32: every message of recursive doubling and the broadcast is above INT_MAX bytes. */
static void test_big(void)
{
    size_t n = ((size_t)1 << 29) + 3;
    float *in = malloc(n * sizeof *in), *out = malloc(n * sizeof *out);
    if (in == NULL || out == NULL) {
        CHECK(0, "big: cannot allocate 2 x %zu bytes", n * sizeof *in);
        free(in);
        free(out);
        return;
    }
    for (int shm = 1; shm >= 0; shm--) {
        setenv("SUMO_MPI_SHM", shm ? "1" : "0", 1);
        sumo_comm *comm = NULL;
        CHECK(sumo_comm_create_mpi(MPI_COMM_WORLD, &comm) == SUMO_SUCCESS, "big: create");
        if (comm == NULL) continue;
        const sumo_algorithm algos[] = {SUMO_ALGORITHM_SHARED_MEMORY, SUMO_ALGORITHM_RING, SUMO_ALGORITHM_RECURSIVE_DOUBLING, SUMO_ALGORITHM_PEER};
        const char *const names[] = {"shm", "ring", "recursive-doubling", "native"};
        for (int a = 0; a < 4; a++) {
            if (sumo_comm_set_param(comm, SUMO_PARAM_ALGORITHM, algos[a]) != SUMO_SUCCESS) continue;
            for (size_t i = 0; i < n; i++) in[i] = (float)value(rank, i, true);
            struct timespec t0;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            sumo_result r = sumo_allreduce(in, out, n, SUMO_FLOAT32, SUMO_OP_SUM, comm);
            double s = seconds_since(&t0);
            size_t bad = 0;
            for (size_t i = 0; i < n && r == SUMO_SUCCESS; i++) {
                double want = 0;
                for (int k = 0; k < size; k++) want += value(k, i, true);
                if (out[i] != (float)want) bad++;
            }
            CHECK(r == SUMO_SUCCESS && bad == 0, "big allreduce %s/%s: %s, %zu wrong",
                  shm ? "shared-memory node" : "point-to-point", names[a], sumo_result_name(r), bad);
            if (rank == 0)
                printf("big: allreduce of %zu fp32, %s/%s: %.2f s (first touch included)\n", n,
                       shm ? "shared-memory node" : "point-to-point", names[a], s);
        }
        sumo_comm_set_param(comm, SUMO_PARAM_ALGORITHM, SUMO_ALGORITHM_AUTO);
        for (size_t i = 0; i < n; i++) in[i] = (float)value(rank, i, true);
        sumo_result r = sumo_broadcast(in, out, n, SUMO_FLOAT32, size - 1, comm);
        size_t bad = 0;
        for (size_t i = 0; i < n && r == SUMO_SUCCESS; i++) bad += out[i] != (float)value(size - 1, i, true);
        CHECK(r == SUMO_SUCCESS && bad == 0, "big broadcast shm %d: %s, %zu wrong", shm, sumo_result_name(r), bad);
        sumo_comm_destroy(comm);
    }
    unsetenv("SUMO_MPI_SHM");
    free(in);
    free(out);
}

static int compare_doubles(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/*
 * Median over repeats of the slowest rank's mean time per call in a batch. The two
 * implementations alternate batch by batch so that drift on a shared machine hits both.
 */
static void bench(void)
{
    sumo_comm *comm = NULL;
    if (sumo_comm_create_mpi(MPI_COMM_WORLD, &comm) != SUMO_SUCCESS) {
        CHECK(0, "bench: create");
        return;
    }
    MPI_Comm mpi;
    MPI_Comm_dup(MPI_COMM_WORLD, &mpi);
    const size_t sizes[] = {4096, (size_t)1 << 20, (size_t)64 << 20};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t n = sizes[s] / sizeof(float);
        int batch = sizes[s] <= 4096 ? 200 : sizes[s] <= (1 << 20) ? 20 : 2, repeats = 31;
        float *in = malloc(sizes[s]), *out = malloc(sizes[s]);
        for (size_t i = 0; i < n; i++) in[i] = (float)value(rank, i, true);
        double t[2][64];
        for (int rep = -1; rep < repeats; rep++) /* rep -1 warms up */
            for (int impl = 0; impl < 2; impl++) {
                MPI_Barrier(MPI_COMM_WORLD);
                struct timespec t0;
                clock_gettime(CLOCK_MONOTONIC, &t0);
                for (int b = 0; b < batch; b++) {
                    if (impl == 0) sumo_allreduce(in, out, n, SUMO_FLOAT32, SUMO_OP_SUM, comm);
                    else MPI_Allreduce(in, out, (int)n, MPI_FLOAT, MPI_SUM, mpi);
                }
                double mine = seconds_since(&t0) / batch, slowest;
                MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
                if (rep >= 0) t[impl][rep] = slowest;
            }
        qsort(t[0], (size_t)repeats, sizeof(double), compare_doubles);
        qsort(t[1], (size_t)repeats, sizeof(double), compare_doubles);
        double a = t[0][repeats / 2], b = t[1][repeats / 2];
        if (rank == 0)
            printf("bench np %d fp32 SUM %8zu B: sumo %10.1f us  MPI_Allreduce %10.1f us  ratio %.2f\n",
                   size, sizes[s], a * 1e6, b * 1e6, a / b);
        free(in);
        free(out);
    }
    MPI_Comm_free(&mpi);
    sumo_comm_destroy(comm);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const char *bench_env = getenv("SUMO_TEST_BENCH"), *big_env = getenv("SUMO_TEST_BIG");
    if (bench_env && strcmp(bench_env, "1") == 0) {
        bench();
    } else {
        sumo_comm *shm = NULL, *p2p = NULL;
        CHECK(sumo_comm_create_mpi(MPI_COMM_WORLD, &shm) == SUMO_SUCCESS, "create");
        /* Over point-to-point messages only, as between machines. */
        setenv("SUMO_MPI_SHM", "0", 1);
        CHECK(sumo_comm_create_mpi(MPI_COMM_WORLD, &p2p) == SUMO_SUCCESS, "create without shm");
        unsetenv("SUMO_MPI_SHM");
        /* Whether the shared window is mapped shows in whether the shared-memory algorithm
         * can be chosen (sumo_comm_set_param refuses it otherwise). How many ranks the node
         * holds is not observable here; test_adasum_mpi's node groups depend on it. */
        const sumo_algorithm window = SUMO_ALGORITHM_SHARED_MEMORY;
        sumo_result shm_algo = shm ? sumo_comm_set_param(shm, SUMO_PARAM_ALGORITHM, window)
                                   : SUMO_SUCCESS;
        CHECK(size == 1 || shm_algo == SUMO_SUCCESS, "one node maps the shared window: %s",
              sumo_result_name(shm_algo));
        sumo_result p2p_algo = p2p ? sumo_comm_set_param(p2p, SUMO_PARAM_ALGORITHM, window)
                                   : SUMO_ERR_INVALID_USAGE;
        CHECK(p2p_algo == SUMO_ERR_INVALID_USAGE, "SUMO_MPI_SHM=0 keeps to messages: %s",
              sumo_result_name(p2p_algo));
        if (shm) sumo_comm_set_param(shm, SUMO_PARAM_ALGORITHM, SUMO_ALGORITHM_AUTO);
        if (p2p) sumo_comm_set_param(p2p, SUMO_PARAM_ALGORITHM, SUMO_ALGORITHM_AUTO);
        test_all_targets(shm, p2p);
        if (shm) run_suite(shm, "shared-memory node");
        if (p2p) run_suite(p2p, "point-to-point");
        sumo_comm_destroy(shm);
        sumo_comm_destroy(p2p);
        if (big_env && strcmp(big_env, "1") == 0) test_big();
        /* Last: these leave a broken handle (and, over MPI, an abandoned message) behind. */
        setenv("SUMO_MPI_SHM", "0", 1);
        test_rank_that_never_arrives("point-to-point");
        unsetenv("SUMO_MPI_SHM");
        test_rank_that_never_arrives("shared-memory node");
    }
    int totals[2] = {passed, failed}, sums[2];
    MPI_Reduce(totals, sums, 2, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) printf("mpi collectives rank 0: %d passed, %d failed\n", sums[0], sums[1]);
    MPI_Finalize();
    return failed ? 1 : 0;
}
