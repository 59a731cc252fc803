/*
 * The compressed allreduce (sumo.h's sumo_allreduce_compressed) on the MPI transport, over the
 * node's shared window and over point-to-point messages alone (SUMO_MPI_SHM=0), for any
 * number of processes: every format, sum and average, short last blocks, blocking and
 * asynchronous, against its definition computed by every process for itself from the
 * references of support/reference.c (every rank can generate every rank's input): each
 * rank's input through the codec, the fp32 sum in rank order, divided once, the codec again.
 * Equal to that bit for bit on every rank means the same bits everywhere. Also: NaN on the last
 * rank refused on every rank with nothing written, and ranks passing other formats refused
 * with SUMO_ERR_MISMATCH.
 */
#include "check.h"

#include "sumo.h"
#include "sumo_mpi.h"
#include "support/harness.h"
#include "support/reference.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const sumo_compression_format FORMATS[] = {SUMO_COMPRESS_BF16, SUMO_COMPRESS_FP8_E4M3,
                                                  SUMO_COMPRESS_E3M0};

/* Rank r's element i: blocks of magnitudes that differ by block and by rank (so the fp32 sum
 * rounds, and its order shows), some all-zero blocks. */
static float input(int r, size_t i, size_t block)
{
    size_t b = i / block;
    if (b % 7 == 3) return 0.0f;
    double mag = ldexp(1.0, (int)((b + 5 * (size_t)r) % 11) * 5 - 25);
    return (float)(harness_uniform_at(9, (uint64_t)r, i) * mag);
}

static void expected(sumo_compression_format f, size_t block, size_t n, sumo_op op, float *want)
{
    float *acc = calloc(n + 1, sizeof *acc), *in = malloc((n + 1) * sizeof *in),
          *t = malloc((n + 1) * sizeof *t);
    for (int r = 0; r < g_size; r++) {
        for (size_t i = 0; i < n; i++) in[i] = input(r, i, block);
        ref_roundtrip(f, block, in, t, n);
        for (size_t i = 0; i < n; i++) acc[i] = r ? acc[i] + t[i] : t[i];
    }
    if (op == SUMO_OP_AVERAGE)
        for (size_t i = 0; i < n; i++) acc[i] = acc[i] / (float)g_size;
    ref_roundtrip(f, block, acc, want, n);
    free(acc);
    free(in);
    free(t);
}

static void run_suite(sumo_comm *comm, const char *where)
{
    const size_t counts[] = {1, 100, 1001, 70001};
    char what[160];
    for (size_t fi = 0; fi < 3; fi++)
        for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++)
            for (int q = 0; q < 2; q++) {
                size_t n = counts[ci], block = ci % 2 ? 8 : 128;
                sumo_op op = q ? SUMO_OP_SUM : SUMO_OP_AVERAGE;
                float *x = malloc((n + 1) * sizeof *x), *y = malloc((n + 1) * sizeof *y),
                      *want = malloc((n + 1) * sizeof *want);
                for (size_t i = 0; i < n; i++) x[i] = input(g_rank, i, block);
                expected(FORMATS[fi], block, n, op, want);
                sumo_compression o = {.struct_size = sizeof o, .format = FORMATS[fi],
                                      .block_size = block, .op = op};
                sumo_result r;
                if (ci % 2) {
                    sumo_request *req = NULL;
                    r = sumo_allreduce_compressed_start(x, y, n, &o, comm, &req);
                    if (r == SUMO_SUCCESS) r = sumo_request_wait(req);
                } else {
                    memcpy(y, x, n * sizeof *x);
                    r = sumo_allreduce_compressed(y, y, n, &o, comm); /* in place */
                }
                snprintf(what, sizeof what, "%s: format %d count %zu block %zu %s: %s", where,
                         (int)FORMATS[fi], n, block, q ? "sum" : "average", sumo_result_name(r));
                check(r == SUMO_SUCCESS && memcmp(y, want, n * sizeof *y) == 0, what);
                free(x);
                free(y);
                free(want);
            }
    /* NaN on the last rank: refused everywhere before anything is written. */
    float z[64], out[64];
    for (int i = 0; i < 64; i++) z[i] = input(g_rank, (size_t)i, 8), out[i] = -7.0f;
    if (g_rank == g_size - 1) z[37] = NAN;
    sumo_compression o = {.struct_size = sizeof o, .format = SUMO_COMPRESS_E3M0, .block_size = 8,
                          .op = SUMO_OP_AVERAGE};
    sumo_result r = sumo_allreduce_compressed(z, out, 64, &o, comm);
    bool untouched = true;
    for (int i = 0; i < 64; i++) untouched = untouched && out[i] == -7.0f;
    snprintf(what, sizeof what, "%s: NaN on the last rank: %s", where, sumo_result_name(r));
    check(r == SUMO_ERR_NONFINITE && untouched, what);
    /* Another format on rank 0. */
    z[37] = 1.0f;
    o.format = g_rank == 0 ? SUMO_COMPRESS_FP8_E4M3 : SUMO_COMPRESS_E3M0;
    r = sumo_allreduce_compressed(z, out, 64, &o, comm);
    snprintf(what, sizeof what, "%s: formats differ: %s", where, sumo_result_name(r));
    check(g_size == 1 ? r == SUMO_SUCCESS : r == SUMO_ERR_MISMATCH, what);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    sumo_comm *shm = NULL, *p2p = NULL;
    check(sumo_comm_create_mpi(MPI_COMM_WORLD, &shm) == SUMO_SUCCESS, "create");
    setenv("SUMO_MPI_SHM", "0", 1);
    check(sumo_comm_create_mpi(MPI_COMM_WORLD, &p2p) == SUMO_SUCCESS, "create without shm");
    unsetenv("SUMO_MPI_SHM");
    if (shm) run_suite(shm, "shared-memory node");
    if (p2p) run_suite(p2p, "point-to-point");
    sumo_comm_destroy(shm);
    sumo_comm_destroy(p2p);
    if (g_rank == 0) printf("test_compress_mpi (%d ranks): %d passed, %d failed\n", g_size, g_passed, g_failed);
    MPI_Finalize();
    return g_failed ? 1 : 0;
}
