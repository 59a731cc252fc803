/*
 * Adasum as a reduce-scatter over the MPI transport (run under mpirun -np 2, 3, 4), in FSDP2's
 * layout (each tensor padded with zeros to a multiple of P; row q of the (P, recvcount) send
 * buffer holds chunk q of every tensor): each rank's shard equals its rows of the tree that
 * support/reference.c writes out (the unit tests' reference, sharing no code with the library)
 * within the unit test's bounds, the padding is exactly 0, the shard has the same bits as the
 * threads-free point-to-point path forced with SUMO_ALGORITHM_RING and as an in-place call, and
 * a tensor count that is not a multiple of P is refused on every rank.
 *
 * Every rank's input is a function of (seed, rank, index), so each rank computes the whole
 * reference by itself. Rank 0 prints a final "N passed, M failed" line.
 */
#include "sumo.h"
#include "sumo_mpi.h"
#include "support/harness.h"
#include "support/reference.h"
#include "mpi/check.h"

#include <math.h>
#include <mpi.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAXT 8

static double input(int rank, size_t t, size_t i)
{
    return harness_uniform_at(0xf5d2 + t, (uint64_t)rank, i) * (1.0 + (double)t);
}

static void run_case(sumo_comm *comm, sumo_dtype dtype, const size_t *counts, size_t T)
{
    int P = g_size, me = g_rank;
    size_t esz = harness_dtype_size(dtype), padded[MAXT], chunk[MAXT], before[MAXT];
    size_t recvcount = 0, full = 0, off[MAXT + 1];
    off[0] = 0;
    for (size_t t = 0; t < T; t++) {
        padded[t] = (counts[t] + (size_t)P - 1) / (size_t)P * (size_t)P;
        chunk[t] = padded[t] / (size_t)P;
        before[t] = recvcount;
        recvcount += chunk[t];
        full += counts[t];
        off[t + 1] = off[t] + counts[t];
    }
    unsigned char *send = calloc(1, (size_t)P * recvcount * esz + 8);
    unsigned char *work = calloc(1, (size_t)P * recvcount * esz + 8);
    unsigned char *out = malloc(recvcount * esz + 8), *out2 = malloc(recvcount * esz + 8);
    double *u[64];
    for (int r = 0; r < P; r++) u[r] = calloc(full + 1, sizeof(double));
    for (size_t t = 0; t < T; t++)
        for (size_t i = 0; i < counts[t]; i++) {
            size_t at = (i / chunk[t]) * recvcount + before[t] + i % chunk[t];
            for (int r = 0; r < P; r++) {
                /* every rank's input as the dtype stores it */
                harness_set(dtype, work, 0, input(r, t, i));
                u[r][off[t] + i] = harness_get(dtype, work, 0);
            }
            harness_set(dtype, send, at, u[me][off[t] + i]);
        }
    ref_adasum_tree(u, P, off, T);
    sumo_adasum_options o = {.struct_size = sizeof o, .tensor_counts = padded, .ntensors = T};
    sumo_op op;
    check(sumo_op_create_adasum(comm, &o, &op) == SUMO_SUCCESS, "op");
    sumo_result r1 = sumo_reduce_scatter(send, out, recvcount, dtype, op, comm);
    sumo_comm_set_param(comm, SUMO_PARAM_ALGORITHM, SUMO_ALGORITHM_RING);
    memcpy(work, send, (size_t)P * recvcount * esz);
    sumo_result r2 = sumo_reduce_scatter(work, work + (size_t)me * recvcount * esz, recvcount,
                                         dtype, op, comm);
    sumo_comm_set_param(comm, SUMO_PARAM_ALGORITHM, SUMO_ALGORITHM_AUTO);
    memcpy(out2, work + (size_t)me * recvcount * esz, recvcount * esz);
    char what[128];
    snprintf(what, sizeof what, "%s: reduce_scatter succeeds", sumo_dtype_name(dtype));
    check(r1 == SUMO_SUCCESS && r2 == SUMO_SUCCESS, what);
    snprintf(what, sizeof what, "%s: point to point and in place give the same bits",
             sumo_dtype_name(dtype));
    check(memcmp(out, out2, recvcount * esz) == 0, what);
    double eps = harness_eps(dtype);
    int levels = 0;
    while ((1 << levels) < P) levels++;
    bool ok = true;
    for (size_t t = 0; t < T; t++) {
        double maxnorm = 0, err = 0;
        for (int r = 0; r < P; r++) {
            double s = 0;
            for (size_t i = 0; i < counts[t]; i++) {
                double v = input(r, t, i);
                s += v * v;
            }
            maxnorm = fmax(maxnorm, sqrt(s));
        }
        for (size_t j = 0; j < chunk[t]; j++) {
            size_t i = (size_t)me * chunk[t] + j;
            double got = harness_get(dtype, out, before[t] + j);
            if (i >= counts[t]) ok &= got == 0.0;
            else err += (got - u[0][off[t] + i]) * (got - u[0][off[t] + i]);
        }
        ok &= sqrt(err) <= 8.0 * (levels + 1) * eps * maxnorm;
    }
    snprintf(what, sizeof what, "%s: the shard matches the reference tree, padding 0",
             sumo_dtype_name(dtype));
    check(ok, what);
    sumo_op_destroy(comm, op);
    for (int r = 0; r < P; r++) free(u[r]);
    free(send);
    free(work);
    free(out);
    free(out2);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    sumo_comm *comm = NULL;
    sumo_result r = sumo_comm_create_mpi(MPI_COMM_WORLD, &comm);
    check(r == SUMO_SUCCESS, "sumo_comm_create_mpi");
    if (r == SUMO_SUCCESS && g_size <= 16) {
        sumo_comm_set_timeout(comm, 60);
        const sumo_dtype dtypes[] = {SUMO_FLOAT32, SUMO_FLOAT64, SUMO_FLOAT16, SUMO_BFLOAT16};
        const size_t counts[] = {1, 3, 37, 0, 129, 5, 70001};
        for (size_t d = 0; d < 4; d++) run_case(comm, dtypes[d], counts, 7);
        /* A count not padded to a multiple of P: refused by name on every rank. */
        size_t bad[2] = {(size_t)g_size, (size_t)g_size + 1};
        sumo_adasum_options o = {.struct_size = sizeof o, .tensor_counts = bad, .ntensors = 2};
        sumo_op op;
        float in[64] = {0}, out[8];
        if (sumo_op_create_adasum(comm, &o, &op) == SUMO_SUCCESS) {
            r = sumo_reduce_scatter(in, out, 2, SUMO_FLOAT32, op, comm);
            const char *m = "";
            sumo_comm_error_message(comm, &m);
            check(r == SUMO_ERR_INVALID_ARGUMENT && strstr(m, "tensor 1") != NULL,
                  "a count not a multiple of P is refused, naming the tensor");
            sumo_op_destroy(comm, op);
        }
    }
    sumo_comm_destroy(comm);
    if (g_rank == 0)
        printf("test_adasum_rs_mpi (np %d): %d passed, %d failed\n", g_size, g_passed, g_failed);
    MPI_Finalize();
    return g_failed ? 1 : 0;
}
