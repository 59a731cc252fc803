/*
 * sumo_mem_alloc over the MPI transport (run under mpirun -np 2, 3, 4): collectives whose
 * buffers come from it on every rank (the direct path on one node), on some ranks only (the
 * staged path), for the outputs only (reduced in the outputs), and with SUMO_MPI_SHM=0 (messages; the memory is plain) all equal a sequential
 * reference; the calls are collective and agreed (zero bytes, a foreign pointer, ranks freeing
 * different allocations fail on every rank and leave the handle usable), and memory not freed
 * is released by sumo_comm_destroy.
 *
 * Inputs are small integers, so a sum is exact in fp32 in any order and an average is one
 * correctly rounded division of that exact sum: the reference is exact. Rank 0 prints a final
 * "mem mpi: N passed, M failed" line; the exit status is non-zero when anything failed.
 */
#include "sumo.h"
#include "sumo_mpi.h"
#include "mpi/check.h"

#include <mpi.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


static float input(int rank, size_t i)
{
    return (float)((int)((i * 7 + (size_t)rank * 13) % 61) - 30);
}

/* The exact sum (or correctly rounded average) over every rank of input(k, i). */
static float expected(sumo_op op, size_t i)
{
    float s = 0;
    for (int k = 0; k < g_size; k++) s += input(k, i);
    return op == SUMO_OP_AVERAGE ? s / (float)g_size : s;
}

/* Sizes that cross the staging chunks (512 KiB areas: 64 Ki floats per half) and not. */
static const size_t counts[] = {1, 1000, 65536 + 17, ((size_t)3 << 20) + 5};
#define MAX_COUNT (((size_t)3 << 20) + 5)

/* Allreduce (in place and not), broadcast from every root, allgather, with the buffers in
 * `in`/`out` (each MAX_COUNT floats, allgather's out MAX_COUNT * size). */
static void run_collectives(sumo_comm *comm, float *in, float *out, const char *how)
{
    char what[160];
    for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
        size_t n = counts[c];
        for (int op_i = 0; op_i < 2; op_i++) {
            sumo_op op = op_i ? SUMO_OP_AVERAGE : SUMO_OP_SUM;
            for (int in_place = 0; in_place < 2; in_place++) {
                for (size_t i = 0; i < n; i++) in[i] = input(g_rank, i);
                float *dst = in_place ? in : out;
                sumo_result r = sumo_allreduce(in, dst, n, SUMO_FLOAT32, op, comm);
                bool ok = r == SUMO_SUCCESS;
                for (size_t i = 0; ok && i < n; i++) ok = dst[i] == expected(op, i);
                snprintf(what, sizeof what, "%s: allreduce %s count %zu %s (%s)", how,
                         op_i ? "avg" : "sum", n, in_place ? "in place" : "out of place",
                         sumo_result_name(r));
                check(ok, what);
            }
        }
        for (int root = 0; root < g_size; root++) {
            for (size_t i = 0; i < n; i++) {
                in[i] = input(g_rank, i);
                out[i] = -1;
            }
            sumo_result r = sumo_broadcast(in, out, n, SUMO_FLOAT32, root, comm);
            bool ok = r == SUMO_SUCCESS;
            for (size_t i = 0; ok && i < n; i++) ok = out[i] == input(root, i);
            snprintf(what, sizeof what, "%s: broadcast from %d count %zu (%s)", how, root, n,
                     sumo_result_name(r));
            check(ok, what);
        }
        size_t m = n / (size_t)g_size;
        for (size_t i = 0; i < m; i++) in[i] = input(g_rank, i);
        sumo_result r = sumo_allgather(in, out, m, SUMO_FLOAT32, comm);
        bool ok = r == SUMO_SUCCESS;
        for (int k = 0; ok && k < g_size; k++)
            for (size_t i = 0; ok && i < m; i++) ok = out[(size_t)k * m + i] == input(k, i);
        snprintf(what, sizeof what, "%s: allgather %zu per rank (%s)", how, m, sumo_result_name(r));
        check(ok, what);
    }
}

static void test_transport(sumo_comm *comm, const char *name)
{
    char what[400];
    size_t in_bytes = MAX_COUNT * sizeof(float);
    size_t out_bytes = in_bytes * (size_t)g_size;
    /* Each rank its own size: the layout exchange must not assume equal parts. */
    float *in = NULL, *out = NULL;
    sumo_result r1 = sumo_mem_alloc(comm, in_bytes + (size_t)g_rank * 4096, (void **)&in);
    sumo_result r2 = sumo_mem_alloc(comm, out_bytes, (void **)&out);
    const char *detail = "";
    if (r1 != SUMO_SUCCESS || r2 != SUMO_SUCCESS) sumo_comm_error_message(comm, &detail);
    snprintf(what, sizeof what, "%s: sumo_mem_alloc (%s, %s), 4096-byte aligned %s", name,
             sumo_result_name(r1), sumo_result_name(r2), detail);
    check(r1 == SUMO_SUCCESS && r2 == SUMO_SUCCESS && ((uintptr_t)in & 4095) == 0 &&
              ((uintptr_t)out & 4095) == 0,
          what);
    if (in == NULL || out == NULL) return;
    snprintf(what, sizeof what, "%s, every rank's buffers shared", name);
    run_collectives(comm, in, out, what);

    /* One rank with private buffers: every rank must take the staged path together. */
    float *priv_in = malloc(in_bytes), *priv_out = malloc(out_bytes);
    bool mine_private = g_rank == g_size - 1;
    snprintf(what, sizeof what, "%s, rank %d's buffers private", name, g_size - 1);
    run_collectives(comm, mine_private ? priv_in : in, mine_private ? priv_out : out, what);

    /* Every rank's outputs shared, inputs private (an out-of-place allreduce copies into the
     * outputs and reduces there), then rank 0's input alone private. */
    snprintf(what, sizeof what, "%s, every rank's inputs private", name);
    run_collectives(comm, priv_in, out, what);
    snprintf(what, sizeof what, "%s, rank 0's input private", name);
    run_collectives(comm, g_rank == 0 ? priv_in : in, out, what);
    free(priv_in);
    free(priv_out);

    /* Zero bytes on one rank: refused on all, nothing allocated anywhere. */
    void *p = (void *)1;
    sumo_result r = sumo_mem_alloc(comm, g_rank == 0 ? 0 : 64, &p);
    snprintf(what, sizeof what, "%s: zero bytes on rank 0 fails everywhere (%s)", name,
             sumo_result_name(r));
    check(r == SUMO_ERR_INVALID_ARGUMENT && p == NULL, what);

    /* A size no memory holds, on rank 0 only: refused on all, nothing allocated anywhere
     * (the page the window adds, or the rounding to whole pages, must not wrap it to a
     * small allocation that reports success). */
    p = (void *)1;
    r = sumo_mem_alloc(comm, g_rank == 0 ? SIZE_MAX - 10 : 64, &p);
    snprintf(what, sizeof what, "%s: SIZE_MAX - 10 bytes on rank 0 fails everywhere (%s)", name,
             sumo_result_name(r));
    check(r == SUMO_ERR_SYSTEM && p == NULL, what);

    /* A pointer that is not sumo's. */
    int stack;
    r = sumo_mem_free(comm, g_rank == 0 ? (void *)&stack : in);
    snprintf(what, sizeof what, "%s: freeing a foreign pointer on rank 0 fails everywhere (%s)",
             name, sumo_result_name(r));
    check(r == SUMO_ERR_INVALID_ARGUMENT, what);

    /* Rank 0 frees the other allocation than its peers: a mismatch on all, nothing freed. */
    if (g_size > 1) {
        r = sumo_mem_free(comm, g_rank == 0 ? (void *)out : (void *)in);
        snprintf(what, sizeof what, "%s: ranks freeing different allocations (%s)", name,
                 sumo_result_name(r));
        check(r == SUMO_ERR_MISMATCH, what);
    }
    /* The handle is still usable, and the buffers still work. */
    for (size_t i = 0; i < 1000; i++) in[i] = input(g_rank, i);
    r = sumo_allreduce(in, in, 1000, SUMO_FLOAT32, SUMO_OP_SUM, comm);
    bool ok = r == SUMO_SUCCESS;
    for (size_t i = 0; ok && i < 1000; i++) ok = in[i] == expected(SUMO_OP_SUM, i);
    snprintf(what, sizeof what, "%s: usable after the refused calls (%s)", name, sumo_result_name(r));
    check(ok, what);

    r = sumo_mem_free(comm, in);
    snprintf(what, sizeof what, "%s: sumo_mem_free (%s)", name, sumo_result_name(r));
    check(r == SUMO_SUCCESS, what);
    /* `out` is left to sumo_comm_destroy. */
}

int main(int argc, char **argv)
{
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    for (int shm = 1; shm >= 0; shm--) {
        if (!shm) setenv("SUMO_MPI_SHM", "0", 1);
        sumo_comm *comm = NULL;
        sumo_result r = sumo_comm_create_mpi(MPI_COMM_WORLD, &comm);
        check(r == SUMO_SUCCESS, "sumo_comm_create_mpi");
        if (comm == NULL) break;
        test_transport(comm, shm ? "one node (shared window)" : "messages (SUMO_MPI_SHM=0)");
        r = sumo_comm_destroy(comm);
        check(r == SUMO_SUCCESS, "sumo_comm_destroy releases what was not freed");
    }
    if (g_rank == 0) printf("mem mpi: %d passed, %d failed\n", g_passed, g_failed);
    MPI_Finalize();
    return g_failed ? 1 : 0;
}
