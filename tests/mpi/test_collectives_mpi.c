/*
 * Collectives on the MPI transport, run under mpirun with any number of processes: every
 * collective, dtype and algorithm against a sequential reference each process computes for
 * itself (every rank can generate every rank's input), bit-identity across ranks, ranks that
 * disagree, invalid buffers, and a rank that never arrives. Rank 0 prints the verdict.
 */
#include "collectives/comm.h"
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

static double value(int r, size_t i, bool integer)
{
    if (integer) return (double)((int)((r * 7 + i * 3) % 11) - 5);
    uint64_t s = ((uint64_t)r << 40) ^ (i * 0x9E3779B97F4A7C15ull) ^ 0x77;
    return harness_uniform(&s) * 4.0;
}

static const sumo_dtype dtypes[] = {SUMO_FLOAT32, SUMO_FLOAT64, SUMO_FLOAT16, SUMO_BFLOAT16};
static const char *const dtype_names[] = {"fp32", "fp64", "fp16", "bf16"};

/* True when every rank holds the same bytes (a hash of them is gathered). */
static bool same_everywhere(const void *buf, size_t bytes)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < bytes; i++) h = (h ^ ((const unsigned char *)buf)[i]) * 0x100000001b3ull;
    uint64_t *all = malloc(sizeof *all * (size_t)size);
    MPI_Allgather(&h, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, MPI_COMM_WORLD);
    bool same = true;
    for (int r = 0; r < size; r++) same = same && all[r] == h;
    free(all);
    return same;
}

static void test_allreduce(sumo_comm *comm, sumo__algo algo, const char *name)
{
    const size_t counts[] = {0, 1, 7, 13, 1000, ((size_t)1 << 18) + 3};
    for (int d = 0; d < 4; d++)
        for (int op = 0; op < 2; op++)
            for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++)
                for (int in_place = 0; in_place < 2; in_place++) {
                    if (algo == SUMO__ALGO_NATIVE && d >= 2) continue; /* MPI has no fp16/bf16 */
                    /* An average of integers is exact only for power-of-two rank counts. */
                    bool exact = op == SUMO_OP_SUM || (size & (size - 1)) == 0;
                    size_t n = counts[c], esz = harness_dtype_size(dtypes[d]);
                    unsigned char *in = malloc(n * esz + 1), *out = malloc(n * esz + 1);
                    for (size_t i = 0; i < n; i++) harness_set(dtypes[d], in, i, value(rank, i, exact));
                    unsigned char *dst = in_place ? in : out;
                    sumo_result r = sumo_allreduce(in, dst, n, dtypes[d], (sumo_op)op, comm);
                    CHECK(r == SUMO_SUCCESS, "%s allreduce %s op %d n %zu: %s", name, dtype_names[d], op, n,
                          sumo_result_name(r));
                    size_t bad = 0;
                    for (size_t i = 0; i < n && r == SUMO_SUCCESS; i++) {
                        double want = 0;
                        for (int k = 0; k < size; k++) want += value(k, i, exact);
                        if (op == SUMO_OP_AVERAGE) want /= size;
                        double got = harness_get(dtypes[d], dst, i);
                        double tol = exact ? 0 : (d == 1 ? 1e-12 : d == 0 ? 1e-5 : 0.05) * 4;
                        if (fabs(got - want) > tol) bad++;
                    }
                    CHECK(bad == 0, "%s allreduce %s op %d n %zu in_place %d: %zu wrong", name, dtype_names[d],
                          op, n, in_place, bad);
                    CHECK(same_everywhere(dst, n * esz), "%s allreduce %s n %zu: ranks differ", name,
                          dtype_names[d], n);
                    free(in);
                    free(out);
                }
}

static void test_gather_and_broadcast(sumo_comm *comm, const char *name)
{
    const size_t counts[] = {0, 1, 13, 100003};
    for (int d = 0; d < 4; d++)
        for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
            size_t n = counts[c], esz = harness_dtype_size(dtypes[d]);
            unsigned char *in = malloc(n * esz + 1), *out = malloc(n * esz * (size_t)size + 1);
            for (size_t i = 0; i < n; i++) harness_set(dtypes[d], in, i, value(rank, i, true));
            sumo_result r = sumo_allgather(in, out, n, dtypes[d], comm);
            size_t bad = 0;
            for (int k = 0; k < size && r == SUMO_SUCCESS; k++)
                for (size_t i = 0; i < n; i++)
                    if (harness_get(dtypes[d], out, (size_t)k * n + i) != value(k, i, true)) bad++;
            CHECK(r == SUMO_SUCCESS && bad == 0, "%s allgather %s n %zu: %s, %zu wrong", name,
                  dtype_names[d], n, sumo_result_name(r), bad);
            for (int root = 0; root < size; root++) {
                r = sumo_broadcast(in, out, n, dtypes[d], root, comm);
                bad = 0;
                for (size_t i = 0; i < n && r == SUMO_SUCCESS; i++)
                    if (harness_get(dtypes[d], out, i) != value(root, i, true)) bad++;
                CHECK(r == SUMO_SUCCESS && bad == 0, "%s broadcast %s n %zu root %d: %s, %zu wrong", name,
                      dtype_names[d], n, root, sumo_result_name(r), bad);
            }
            free(in);
            free(out);
        }
    CHECK(sumo_barrier(comm) == SUMO_SUCCESS, "%s barrier", name);
}

static void test_disagreement(sumo_comm *comm, const char *name)
{
    float buf[64] = {0}, out[64];
    sumo_result r = sumo_allreduce(buf, out, rank == size - 1 ? 63 : 64, SUMO_FLOAT32, SUMO_OP_SUM, comm);
    CHECK(r == SUMO_ERR_MISMATCH, "%s count mismatch: %s", name, sumo_result_name(r));
    r = sumo_allreduce(buf, out, 16, rank == 0 ? SUMO_FLOAT64 : SUMO_FLOAT32, SUMO_OP_SUM, comm);
    CHECK(r == SUMO_ERR_MISMATCH, "%s dtype mismatch: %s", name, sumo_result_name(r));
    r = sumo_allreduce(buf, out, 16, SUMO_FLOAT32, rank == 0 ? SUMO_OP_AVERAGE : SUMO_OP_SUM, comm);
    CHECK(r == SUMO_ERR_MISMATCH, "%s op mismatch: %s", name, sumo_result_name(r));
    r = sumo_broadcast(buf, out, 16, SUMO_FLOAT32, rank == 0 ? 1 : 0, comm);
    CHECK(r == SUMO_ERR_MISMATCH, "%s root mismatch: %s", name, sumo_result_name(r));
    r = sumo_allreduce(rank == 0 ? NULL : buf, out, 16, SUMO_FLOAT32, SUMO_OP_SUM, comm);
    CHECK(r == SUMO_ERR_INVALID_ARGUMENT, "%s NULL buffer on rank 0: %s", name, sumo_result_name(r));
    const char *msg = "";
    sumo_comm_error_message(comm, &msg);
    CHECK(rank == 0 || strstr(msg, "rank 0") != NULL, "%s message names rank 0: '%s'", name, msg);
    /* Still usable afterwards, and NaN passes through. */
    for (int i = 0; i < 64; i++) buf[i] = 1.0f;
    if (rank == 0) buf[3] = NAN;
    r = sumo_allreduce(buf, buf, 64, SUMO_FLOAT32, SUMO_OP_SUM, comm);
    CHECK(r == SUMO_SUCCESS && buf[0] == (float)size && isnan(buf[3]), "%s usable after mismatch", name);
}

static void test_rank_that_never_arrives(void)
{
    sumo_comm *comm = NULL;
    CHECK(sumo_comm_create_mpi(MPI_COMM_WORLD, &comm) == SUMO_SUCCESS, "create for the timeout test");
    sumo_comm_set_timeout(comm, 1.0);
    float buf[16] = {0};
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    sumo_result r;
    if (rank == size - 1) {
        sleep(2);
        /* Arrives after everyone gave up. With shared memory it sees their abort at once;
         * over messages only, MPI may match the collective its peers abandoned (a mismatch)
         * and the next call then times out. */
        r = sumo_barrier(comm);
        CHECK(r == SUMO_ERR_PEER_FAILURE || r == SUMO_ERR_TIMEOUT || r == SUMO_ERR_MISMATCH,
              "late rank: %s", sumo_result_name(r));
        if (r == SUMO_ERR_MISMATCH) {
            r = sumo_barrier(comm);
            CHECK(r == SUMO_ERR_TIMEOUT, "late rank, second call: %s", sumo_result_name(r));
        }
    } else {
        r = sumo_allreduce(buf, buf, 16, SUMO_FLOAT32, SUMO_OP_SUM, comm);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
        CHECK(r == SUMO_ERR_TIMEOUT || r == SUMO_ERR_PEER_FAILURE, "waiting rank: %s", sumo_result_name(r));
        CHECK(s < 1.9, "waiting rank gave up after %.2f s, before the late rank came", s);
        const char *msg = "";
        sumo_comm_error_message(comm, &msg);
        CHECK(strlen(msg) > 10, "timeout message: '%s'", msg);
    }
    r = sumo_allreduce(buf, buf, 16, SUMO_FLOAT32, SUMO_OP_SUM, comm);
    CHECK(r == SUMO_ERR_PEER_FAILURE, "broken communicator refuses work at once: %s", sumo_result_name(r));
    sumo_comm_destroy(comm);
    MPI_Barrier(MPI_COMM_WORLD);
}

static void run_suite(sumo_comm *comm, const char *name)
{
    const char *transport = "";
    sumo_comm_transport(comm, &transport);
    CHECK(strcmp(transport, "mpi") == 0, "transport name %s", transport);
    test_allreduce(comm, SUMO__ALGO_AUTO, name);
    const sumo__algo forced[] = {SUMO__ALGO_SHM, SUMO__ALGO_RING, SUMO__ALGO_RECURSIVE_DOUBLING, SUMO__ALGO_NATIVE};
    const char *const forced_names[] = {"shm", "ring", "recursive-doubling", "native"};
    for (int a = 0; a < 4; a++) {
        if (sumo__comm_set_algorithm(comm, forced[a]) != SUMO_SUCCESS) continue; /* not on this path */
        char label[64];
        snprintf(label, sizeof label, "%s/%s", name, forced_names[a]);
        test_allreduce(comm, forced[a], label);
        if (forced[a] != SUMO__ALGO_NATIVE) test_gather_and_broadcast(comm, label);
    }
    sumo__comm_set_algorithm(comm, SUMO__ALGO_AUTO);
    test_gather_and_broadcast(comm, name);
    test_disagreement(comm, name);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    sumo_comm *comm = NULL;
    CHECK(sumo_comm_create_mpi(MPI_COMM_WORLD, &comm) == SUMO_SUCCESS, "create");
    if (comm) run_suite(comm, "shared-memory node");
    sumo_comm_destroy(comm);
    /* The same suite over point-to-point messages only, as between machines. */
    setenv("SUMO_MPI_SHM", "0", 1);
    comm = NULL;
    CHECK(sumo_comm_create_mpi(MPI_COMM_WORLD, &comm) == SUMO_SUCCESS, "create without shm");
    if (comm) run_suite(comm, "point-to-point");
    sumo_comm_destroy(comm);
    test_rank_that_never_arrives();
    unsetenv("SUMO_MPI_SHM");
    test_rank_that_never_arrives();

    int totals[2] = {passed, failed}, sums[2];
    MPI_Reduce(totals, sums, 2, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) printf("mpi collectives, %d ranks: %d passed, %d failed\n", size, sums[0], sums[1]);
    MPI_Finalize();
    return failed ? 1 : 0;
}
