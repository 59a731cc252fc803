/*
 * What test_adasum_pair.c, test_adasum_tree.c and test_adasum_errors.c (tests/unit) share: an
 * Adasum allreduce on the threads transport (out of place, then in place on the same handle)
 * and its check against an independent reference.
 *
 * The reference (support/reference.c, shared with tests/mpi/test_adasum_mpi.c) is the
 * definition of sumo.h written out plainly: per tensor, sequential dot products and norms in
 * double, the pairwise combine in double, and the documented tree (pairs (0,1) .. (2R-2,2R-1)
 * first when the number of participants G is not a power of two, then the balanced tree in
 * order), over rank inputs or, hierarchically, over group averages. It shares no code with the
 * library.
 *
 * Tolerances: Horovod's (relative L2 error of the whole buffer < 100 eps of the dtype), and a
 * per-tensor one scaled by the tensor's input norm, which is what catches a wrong tensor
 * boundary in a small tensor hidden inside a large buffer.
 *
 * Both data paths run: direct (the threads default: ranks read each other's buffers) and point
 * to point (forced with the ring algorithm: what MPI takes); they must give the same bits.
 */
#ifndef SUMO_TEST_ADASUM_RUN_H
#define SUMO_TEST_ADASUM_RUN_H

#include "support/harness.h"
#include "support/reference.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAXP 32

/* ---- running the library ----------------------------------------------------------------- */

typedef struct job {
    int size;
    sumo_dtype dtype;
    size_t count;
    size_t ntensors;      /* 0: SUMO_OP_ADASUM (one tensor) unless use_op */
    const size_t *counts;
    bool use_op;
    bool p2p; /* force the point-to-point path (the one MPI takes) instead of direct shm */
    int hierarchical, group_size;
    unsigned char *in[MAXP];
    unsigned char *out[MAXP];  /* out of place */
    unsigned char *out2[MAXP]; /* in place, second call on the same handle */
    sumo_result res[MAXP], res2[MAXP];
    char msg[MAXP][256];
} job;

static inline void body(sumo_comm *comm, int rank, int size, void *arg)
{
    (void)size;
    job *j = arg;
    sumo_comm_set_timeout(comm, 30);
    if (j->p2p) sumo_comm_set_param(comm, SUMO_PARAM_ALGORITHM, SUMO_ALGORITHM_RING);
    sumo_op op = SUMO_OP_ADASUM;
    if (j->use_op) {
        sumo_adasum_options o = {.struct_size = sizeof o, .tensor_counts = j->counts,
                                 .ntensors = j->ntensors, .hierarchical = j->hierarchical,
                                 .group_size = j->group_size};
        if (sumo_op_create_adasum(comm, &o, &op) != SUMO_SUCCESS) op = (sumo_op)-1;
    }
    size_t bytes = j->count * harness_dtype_size(j->dtype);
    j->res[rank] = sumo_allreduce(j->in[rank], j->out[rank], j->count, j->dtype, op, comm);
    const char *m;
    sumo_comm_error_message(comm, &m);
    snprintf(j->msg[rank], sizeof j->msg[rank], "%s", m);
    if (bytes) memcpy(j->out2[rank], j->in[rank], bytes);
    j->res2[rank] = sumo_allreduce(j->out2[rank], j->out2[rank], j->count, j->dtype, op, comm);
    if (j->use_op) sumo_op_destroy(comm, op);
}

static inline double uniform_at(uint64_t seed, int rank, size_t i)
{
    return harness_uniform_at(seed, (uint64_t)rank, i);
}

static inline void job_alloc(job *j)
{
    size_t bytes = j->count * harness_dtype_size(j->dtype) + 8;
    for (int r = 0; r < j->size; r++) {
        j->in[r] = malloc(bytes);
        j->out[r] = malloc(bytes);
        j->out2[r] = malloc(bytes);
        memset(j->out[r], 0xAB, bytes);
    }
}

static inline void job_free(job *j)
{
    for (int r = 0; r < j->size; r++) {
        free(j->in[r]);
        free(j->out[r]);
        free(j->out2[r]);
    }
}

/* Offsets of the job's layout (one tensor when it has none). */
static inline size_t *job_offsets(const job *j, size_t *T)
{
    size_t n = j->ntensors ? j->ntensors : 1;
    size_t *off = malloc((n + 1) * sizeof *off);
    off[0] = 0;
    for (size_t t = 0; t < n; t++) off[t + 1] = off[t] + (j->ntensors ? j->counts[t] : j->count);
    *T = n;
    return off;
}

/* Random inputs; some tensors are zero on some ranks, some on every rank. */
static inline void fill_random(job *j, uint64_t seed)
{
    size_t T, *off = job_offsets(j, &T);
    for (int r = 0; r < j->size; r++) {
        for (size_t t = 0; t < T; t++) {
            bool zero = (T > 1 && t % 13 == 5) || (T > 1 && (t * 7 + (size_t)r) % 11 == 0);
            for (size_t i = off[t]; i < off[t + 1]; i++)
                harness_set(j->dtype, j->in[r], i, zero ? 0.0 : uniform_at(seed, r, i));
        }
    }
    free(off);
}

/* The reference result for the job's inputs: the tree over ranks or over group averages. */
static inline double *reference(const job *j)
{
    size_t T, *off = job_offsets(j, &T), n = j->count;
    int g = 1;
    if (j->hierarchical) g = j->group_size ? j->group_size : j->size;
    int G = j->size / g;
    double *u[MAXP] = {0};
    for (int i = 0; i < G; i++) {
        u[i] = calloc(n + 1, sizeof(double));
        for (int m = 0; m < g; m++)
            for (size_t k = 0; k < n; k++) u[i][k] += harness_get(j->dtype, j->in[i * g + m], k);
        for (size_t k = 0; k < n; k++) u[i][k] /= g;
    }
    ref_adasum_tree(u, G, off, T);
    for (int i = 1; i < G; i++) free(u[i]);
    free(off);
    return u[0];
}

typedef struct errors {
    double total;      /* |got - want| / |want| over the whole buffer */
    double per_tensor; /* max over tensors of |got - want|_t / |inputs|_t */
} errors;

static inline errors measure(const job *j, const unsigned char *got, const double *want)
{
    size_t T, *off = job_offsets(j, &T);
    errors e = {0, 0};
    double dd = 0, ww = 0;
    for (size_t t = 0; t < T; t++) {
        double td = 0, scale = 0;
        for (size_t i = off[t]; i < off[t + 1]; i++) {
            double diff = harness_get(j->dtype, got, i) - want[i];
            td += diff * diff;
            ww += want[i] * want[i];
            for (int r = 0; r < j->size; r++) {
                double v = harness_get(j->dtype, j->in[r], i);
                scale += v * v;
            }
        }
        dd += td;
        double rel = scale > 0 ? sqrt(td / scale) : (td > 0 ? INFINITY : 0);
        if (!(rel <= e.per_tensor)) e.per_tensor = rel; /* NaN sticks */
    }
    e.total = ww > 0 ? sqrt(dd / ww) : (dd > 0 ? INFINITY : 0);
    if (isnan(dd)) e.total = NAN;
    free(off);
    return e;
}

/*
 * Per-tensor bound: each combine rounds once to the dtype (relative eps/2 of values no bigger
 * than a few times the inputs) and the reference differs from the library only in rounding, so
 * the error grows with the number of levels; 100 eps (Horovod) for the whole buffer.
 */
static inline double tensor_tolerance(const job *j)
{
    int levels = 1;
    while ((1 << levels) < j->size) levels++;
    return 8.0 * (levels + 1) * harness_eps(j->dtype);
}

/* Runs the job and checks success, the reference, and bits across ranks and calls. */
static inline int run_and_check(job *j, const char *what)
{
    int bad = 0;
    if (harness_run_threads(j->size, body, j) != 0) return 1;
    size_t bytes = j->count * harness_dtype_size(j->dtype);
    for (int r = 0; r < j->size; r++) {
        if (j->res[r] != SUMO_SUCCESS || j->res2[r] != SUMO_SUCCESS) {
            fprintf(stderr, "%s: P=%d dtype %d count %zu: rank %d returned %s / %s (%s)\n", what,
                    j->size, j->dtype, j->count, r, sumo_result_name(j->res[r]),
                    sumo_result_name(j->res2[r]), j->msg[r]);
            return 1;
        }
        if (memcmp(j->out[r], j->out[0], bytes) != 0 || memcmp(j->out2[r], j->out[0], bytes) != 0) {
            fprintf(stderr, "%s: P=%d dtype %d count %zu: rank %d's bits differ from rank 0's\n",
                    what, j->size, j->dtype, j->count, r);
            bad++;
        }
    }
    double *want = reference(j);
    errors e = measure(j, j->out[0], want);
    double tol = tensor_tolerance(j);
    /* A buffer of a few elements is one short tensor whose result can be a cancellation
     * (Adasum of parallel scalars is their average): relative to it, rounding of the inputs
     * looks large. The per-tensor check, relative to the inputs, covers those. */
    bool horovod = j->count >= 16;
    if ((horovod && !(e.total < 100 * harness_eps(j->dtype))) || !(e.per_tensor <= tol)) {
        fprintf(stderr,
                "%s: P=%d dtype %d count %zu tensors %zu hier %d/%d p2p %d: relative error %.3g "
                "(limit %.3g), worst tensor %.3g (limit %.3g)\n",
                what, j->size, j->dtype, j->count, j->ntensors, j->hierarchical, j->group_size,
                j->p2p, e.total, 100 * harness_eps(j->dtype), e.per_tensor, tol);
        bad++;
    }
    if (getenv("ADASUM_TEST_VERBOSE"))
        fprintf(stderr, "%s: P=%d dtype %d count %zu: error %.3g tensor %.3g (tol %.3g)\n", what,
                j->size, j->dtype, j->count, e.total, e.per_tensor, tol);
    free(want);
    return bad;
}

#endif
