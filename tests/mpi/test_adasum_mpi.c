/*
 * Adasum over the MPI transport (run under mpirun -np 2, 3, 4): the result equals an
 * independent sequential reference of the tree that src/collectives/adasum.c documents, every
 * rank holds the same bits, a repeated call gives the same bits, and failures (NaN, layouts
 * that differ) come back the same on every rank; with private buffers, buffers from
 * sumo_mem_alloc (the Gram form direct) and outputs alone from it (staged into the outputs).
 *
 * Every rank's input is a function of (seed, rank, index), so each rank can compute the whole
 * reference by itself. Rank 0 prints a final "N passed, M failed" line; the exit status is
 * non-zero when anything failed.
 */
#include "sumo.h"
#include "sumo_mpi.h"
#include "support/harness.h"
#include "support/reference.h"
#include "mpi/check.h"

#include <float.h>
#include <math.h>
#include <mpi.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


/* ---- the reference: support/reference.c, the one tests/unit/test_adasum_*.c use -------- */

/* Rank r's element i, the generator of the unit test (support/harness.c). */
static double input(uint64_t seed, int rank, size_t i)
{
    return harness_uniform_at(seed, (uint64_t)rank, i);
}

/* ---- one configuration ---------------------------------------------------------------- */

typedef struct config {
    const char *name;
    sumo_dtype dtype;
    const size_t *counts; /* NULL: SUMO_OP_ADASUM on `count` elements */
    size_t ntensors, count;
    int hierarchical, group_size;
    int buffers; /* one of the BUFFERS_* below */
} config;

enum {
    BUFFERS_PRIVATE, /* malloc: staged through the node's areas */
    BUFFERS_SHARED,  /* sumo_mem_alloc: the Gram form runs direct over MPI */
    BUFFERS_OUTPUTS, /* private inputs into sumo_mem_alloc outputs: staged into the outputs */
};
static const char *const buffers_name[] = {"", ", shared buffers", ", shared outputs"};

/* A buffer of `bytes` (+8) from malloc, or from sumo_mem_alloc (collective) when shared. */
static unsigned char *buffer(sumo_comm *comm, bool shared, size_t bytes)
{
    void *p = NULL;
    if (!shared) return malloc(bytes + 8);
    sumo_result r = sumo_mem_alloc(comm, bytes + 8, &p);
    check(r == SUMO_SUCCESS, "sumo_mem_alloc");
    return p;
}

static void release(sumo_comm *comm, bool shared, void *p)
{
    if (!shared) free(p);
    else check(sumo_mem_free(comm, p) == SUMO_SUCCESS, "sumo_mem_free");
}

static void run_config(sumo_comm *comm, const config *c, uint64_t seed)
{
    char what[256];
    snprintf(what, sizeof what, "%s dtype %d count %zu hierarchical %d/%d%s", c->name, c->dtype,
             c->count, c->hierarchical, c->group_size, buffers_name[c->buffers]);
    bool in_shared = c->buffers == BUFFERS_SHARED, out_shared = c->buffers != BUFFERS_PRIVATE;
    size_t esz = harness_dtype_size(c->dtype), n = c->count, T = c->counts ? c->ntensors : 1;
    size_t *off = malloc((T + 1) * sizeof *off);
    off[0] = 0;
    for (size_t t = 0; t < T; t++) off[t + 1] = off[t] + (c->counts ? c->counts[t] : n);
    unsigned char *in = buffer(comm, in_shared, n * esz), *out = buffer(comm, out_shared, n * esz);
    unsigned char *again = buffer(comm, in_shared, n * esz);
    for (size_t i = 0; i < n; i++) harness_set(c->dtype, in, i, input(seed, g_rank, i));
    sumo_op op = SUMO_OP_ADASUM;
    bool created = c->counts != NULL || c->hierarchical;
    if (created) {
        sumo_adasum_options o = {.struct_size = sizeof o, .tensor_counts = c->counts,
                                 .ntensors = c->counts ? c->ntensors : 0,
                                 .hierarchical = c->hierarchical, .group_size = c->group_size};
        sumo_result r = sumo_op_create_adasum(comm, &o, &op);
        check(r == SUMO_SUCCESS, what);
        if (r != SUMO_SUCCESS) op = (sumo_op)-1;
    }
    sumo_result r1 = sumo_allreduce(in, out, n, c->dtype, op, comm);
    if (n) memcpy(again, in, n * esz);
    sumo_result r2 = sumo_allreduce(again, again, n, c->dtype, op, comm);
    check(r1 == SUMO_SUCCESS && r2 == SUMO_SUCCESS, what);
    /* Bits: repeated and in place on this rank (with shared outputs, in place is the staged
     * shape, whose chunks the outputs' shape keeps), and rank 0's everywhere. */
    check(n == 0 || memcmp(out, again, n * esz) == 0, what);
    unsigned char *root = malloc(n * esz + 8);
    if (n) memcpy(root, out, n * esz);
    if (n) MPI_Bcast(root, (int)(n * esz), MPI_BYTE, 0, MPI_COMM_WORLD);
    check(n == 0 || memcmp(root, out, n * esz) == 0, what);
    /* The reference: Adasum tree over ranks, or over group averages. */
    int g = c->hierarchical ? c->group_size : 1;
    if (c->hierarchical && g == 0) {
        /* The node split: ranks per node when they are packed evenly, as the library derives
         * it; a single node here unless launched across machines. */
        MPI_Comm node;
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
        MPI_Comm_size(node, &g);
        MPI_Comm_free(&node);
        if (g_size % g != 0) g = g_size; /* not packed evenly: the library takes all ranks */
    }
    int G = g_size / g;
    double **u = malloc((size_t)G * sizeof *u);
    for (int i = 0; i < G; i++) {
        u[i] = calloc(n + 1, sizeof(double));
        for (int m = 0; m < g; m++)
            for (size_t k = 0; k < n; k++) {
                unsigned char tmp[8];
                harness_set(c->dtype, tmp, 0, input(seed, i * g + m, k));
                u[i][k] += harness_get(c->dtype, tmp, 0);
            }
        for (size_t k = 0; k < n; k++) u[i][k] /= g;
    }
    ref_adasum_tree(u, G, off, T);
    /* Per tensor, relative to the inputs' size: rounding at each of the log2 levels. */
    int levels = 1;
    while ((1 << levels) < g_size) levels++;
    double tol = 8.0 * (levels + 1) * harness_eps(c->dtype), worst = 0;
    for (size_t t = 0; t < T; t++) {
        double dd = 0, scale = 0;
        for (size_t k = off[t]; k < off[t + 1]; k++) {
            double diff = harness_get(c->dtype, out, k) - u[0][k];
            dd += diff * diff;
            for (int r = 0; r < g_size; r++) {
                unsigned char tmp[8];
                harness_set(c->dtype, tmp, 0, input(seed, r, k));
                double v = harness_get(c->dtype, tmp, 0);
                scale += v * v;
            }
        }
        double rel = scale > 0 ? sqrt(dd / scale) : (dd > 0 ? INFINITY : 0);
        if (!(rel <= worst)) worst = rel;
    }
    if (!(worst <= tol) && g_rank == 0)
        fprintf(stderr, "%s: worst tensor error %.3g, limit %.3g\n", what, worst, tol);
    check(worst <= tol, what);
    if (created) sumo_op_destroy(comm, op);
    for (int i = 0; i < G; i++) free(u[i]);
    free(u);
    free(root);
    release(comm, in_shared, in);
    release(comm, out_shared, out);
    release(comm, in_shared, again);
    free(off);
}

static const size_t awkward[] = {0, 1, 7, 0, 33, 1, 517, 3, 0, 2, 129};
static size_t many_tiny[300];
static const size_t big[] = {3, 70001, 0, 5};
/* Shards of several 1 MiB wire chunks at np 2 to 4 (fp32), tensors across their bounds. */
static const size_t chunked[] = {3, 524287, 1, 775712};

static void failures(sumo_comm *comm)
{
    size_t counts[3] = {4, 3, 5};
    float in[12], out[12];
    for (int i = 0; i < 12; i++) in[i] = (float)input(9, g_rank, (size_t)i);
    /* NaN in tensor 1 on the last rank: NONFINITE everywhere, tensor 1 NaN, the others not. */
    if (g_rank == g_size - 1) in[5] = NAN;
    sumo_adasum_options o = {.struct_size = sizeof o, .tensor_counts = counts, .ntensors = 3};
    sumo_op op;
    check(sumo_op_create_adasum(comm, &o, &op) == SUMO_SUCCESS, "create");
    sumo_result r = sumo_allreduce(in, out, 12, SUMO_FLOAT32, op, comm);
    const char *msg = "";
    sumo_comm_error_message(comm, &msg);
    bool ok = r == SUMO_ERR_NONFINITE && strstr(msg, "tensor 1 ") != NULL;
    for (int i = 0; i < 12; i++) ok = ok && (i >= 4 && i < 7 ? isnan(out[i]) : isfinite(out[i]));
    check(ok, "NaN in tensor 1: NONFINITE on every rank, only tensor 1 NaN");
    sumo_op_destroy(comm, op);
    /* Layouts that differ (same total): MISMATCH everywhere, and the handle stays usable. */
    if (g_rank == 1 % g_size && g_size > 1) {
        counts[0] = 5;
        counts[1] = 2;
    }
    check(sumo_op_create_adasum(comm, &o, &op) == SUMO_SUCCESS, "create");
    r = sumo_allreduce(in, out, 12, SUMO_FLOAT32, op, comm);
    check(r == (g_size > 1 ? SUMO_ERR_MISMATCH : SUMO_ERR_NONFINITE), "layouts that differ: MISMATCH");
    sumo_op_destroy(comm, op);
    /* A layout that does not add up to the count on one rank: INVALID_ARGUMENT everywhere. */
    counts[0] = 4;
    counts[1] = g_rank == 0 ? 4 : 3;
    check(sumo_op_create_adasum(comm, &o, &op) == SUMO_SUCCESS, "create");
    r = sumo_allreduce(in, out, 12, SUMO_FLOAT32, op, comm);
    check(r == SUMO_ERR_INVALID_ARGUMENT, "layout not adding up on rank 0: INVALID_ARGUMENT");
    sumo_op_destroy(comm, op);
    float one = 1, sum = 0;
    check(sumo_allreduce(&one, &sum, 1, SUMO_FLOAT32, SUMO_OP_SUM, comm) == SUMO_SUCCESS &&
              sum == (float)g_size,
          "usable after failures");
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    sumo_comm *comm = NULL;
    sumo_result r = sumo_comm_create_mpi(MPI_COMM_WORLD, &comm);
    check(r == SUMO_SUCCESS, "sumo_comm_create_mpi");
    if (r == SUMO_SUCCESS) {
        sumo_comm_set_timeout(comm, 60);
        for (size_t t = 0; t < 300; t++) many_tiny[t] = t % 4;
        const sumo_dtype dtypes[] = {SUMO_FLOAT32, SUMO_FLOAT64, SUMO_FLOAT16, SUMO_BFLOAT16};
        for (size_t d = 0; d < 4; d++) {
            config cs[] = {
                {"one tensor", dtypes[d], NULL, 0, 1001, 0, 0, BUFFERS_PRIVATE},
                {"one element", dtypes[d], NULL, 0, 1, 0, 0, BUFFERS_PRIVATE},
                {"empty", dtypes[d], NULL, 0, 0, 0, 0, BUFFERS_PRIVATE},
                {"awkward", dtypes[d], awkward, sizeof awkward / sizeof awkward[0], 0, 0, 0, BUFFERS_PRIVATE},
                {"many tiny", dtypes[d], many_tiny, 300, 0, 0, 0, BUFFERS_PRIVATE},
                {"big", dtypes[d], big, sizeof big / sizeof big[0], 0, 0, 0, BUFFERS_PRIVATE},
                {"chunked", dtypes[d], chunked, sizeof chunked / sizeof chunked[0], 0, 0, 0,
                 BUFFERS_PRIVATE},
                {"awkward, groups of 1", dtypes[d], awkward, 11, 0, 1, 1, BUFFERS_PRIVATE},
                {"awkward, one group", dtypes[d], awkward, 11, 0, 1, g_size, BUFFERS_PRIVATE},
                {"awkward, groups of 2", dtypes[d], awkward, 11, 0, 1, 2, BUFFERS_PRIVATE},
                {"awkward, node groups", dtypes[d], awkward, 11, 0, 1, 0, BUFFERS_PRIVATE},
            };
            for (size_t k = 0; k < sizeof cs / sizeof cs[0]; k++) {
                config c = cs[k];
                if (c.counts) {
                    c.count = 0;
                    for (size_t t = 0; t < c.ntensors; t++) c.count += c.counts[t];
                }
                if (c.hierarchical && c.group_size == 2 && g_size % 2 != 0) continue;
                run_config(comm, &c, 100 + d * 16 + k);
                /* The same with every rank's buffers shared, and with only the outputs
                 * shared, for the non-hierarchical cases. */
                if (c.hierarchical) continue;
                c.buffers = BUFFERS_SHARED;
                run_config(comm, &c, 100 + d * 16 + k);
                c.buffers = BUFFERS_OUTPUTS;
                run_config(comm, &c, 100 + d * 16 + k);
            }
        }
        /* The point-to-point shape, which ranks on several nodes take: its shards travel in
         * chunks while the Gram work of the chunk before runs, overlapped with the MPI
         * exchange (sendrecv_working). */
        sumo_comm_set_param(comm, SUMO_PARAM_ALGORITHM, SUMO_ALGORITHM_RING);
        for (size_t d = 0; d < 4; d++) {
            if (dtypes[d] == SUMO_FLOAT64) continue; /* the tree: no Gram form */
            config cs[] = {
                {"messages, one tensor", dtypes[d], NULL, 0, 1001, 0, 0, BUFFERS_PRIVATE},
                {"messages, awkward", dtypes[d], awkward, sizeof awkward / sizeof awkward[0], 0, 0, 0, BUFFERS_PRIVATE},
                {"messages, chunked", dtypes[d], chunked, sizeof chunked / sizeof chunked[0], 0, 0, 0, BUFFERS_PRIVATE},
            };
            for (size_t k = 0; k < sizeof cs / sizeof cs[0]; k++) {
                config c = cs[k];
                if (c.counts) {
                    c.count = 0;
                    for (size_t t = 0; t < c.ntensors; t++) c.count += c.counts[t];
                }
                run_config(comm, &c, 300 + d * 16 + k);
            }
        }
        sumo_comm_set_param(comm, SUMO_PARAM_ALGORITHM, SUMO_ALGORITHM_AUTO);
        failures(comm);
    }
    sumo_comm_destroy(comm);
    if (g_rank == 0) printf("test_adasum_mpi (np %d): %d passed, %d failed\n", g_size, g_passed, g_failed);
    MPI_Finalize();
    return g_failed ? 1 : 0;
}
