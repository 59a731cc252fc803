/*
 * ACGA over the MPI transport (run under mpirun -np 2, 3, 4): every step equals an independent
 * double-precision reference of docs/design/acga.md (support/reference.c, the one
 * tests/unit/test_acga_*.c use), every rank holds the same bits, a NaN step is NONFINITE on every
 * rank and leaves the momentum alone, and a checkpointed aggregator continues bit for bit; in
 * place, and out of place from private buffers into sumo_mem_alloc's (staged into the outputs
 * on one node) with the send buffers left as they were.
 *
 * Every rank's gradient is a function of (seed, step, rank, index), so each rank computes the
 * whole reference by itself. Rank 0 prints a final "acga mpi: N passed, M failed" line; the exit
 * status is non-zero when anything failed.
 */
#include "sumo.h"
#include "sumo_aggregation.h"
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


/* A consensus direction per step, per-rank noise and scale: positive, well-separated
 * coefficients (support/harness.c, the generator the unit test uses). */
static float input(uint64_t seed, int step, int rank, size_t i)
{
    return harness_correlated(seed, step, rank, i, 0.6);
}

/* The reference is support/reference.c's, the one tests/unit/test_acga_*.c use. */

/* ---- one configuration -------------------------------------------------------------------- */

typedef struct config {
    const char *name;
    const size_t *counts; /* NULL: no layout */
    size_t ntensors, count;
    int per_tensor, refperm, rescale;
    double beta;
    int steps;
    int nan_step;      /* >= 0: the last rank puts a NaN into this step */
    int restore_after; /* > 0: checkpoint and continue in a fresh aggregator at this step */
} config;

static bool same_on_every_rank(const float *p, size_t n)
{
    float *root = malloc(n * sizeof *root + 4);
    if (n) memcpy(root, p, n * sizeof *p);
    if (n) MPI_Bcast(root, (int)(n * sizeof *p), MPI_BYTE, 0, MPI_COMM_WORLD);
    bool same = n == 0 || memcmp(root, p, n * sizeof *p) == 0;
    free(root);
    return same;
}

static void run_config(sumo_comm *comm, const config *c, uint64_t seed, bool into_shared)
{
    char what[300];
    sumo_aggregator_options o;
    sumo_aggregator_options_default(SUMO_AGGREGATE_ACGA, &o);
    o.tensor_counts = c->counts;
    o.ntensors = c->counts ? c->ntensors : 0;
    o.acga.per_tensor = c->per_tensor;
    o.acga.reference_permutation = c->refperm;
    o.acga.rescale = c->rescale;
    o.acga.beta = c->beta;
    sumo_aggregator *agg = NULL;
    snprintf(what, sizeof what, "%s: create", c->name);
    sumo_result r = sumo_aggregator_create(comm, &o, &agg);
    check(r == SUMO_SUCCESS, what);
    if (r != SUMO_SUCCESS) return;
    size_t n = c->count;
    ref_acga F;
    if (ref_acga_init(&F, g_size, &o, n) != 0) abort();
    float **all = malloc((size_t)g_size * sizeof *all);
    for (int q = 0; q < g_size; q++) all[q] = malloc((n + 1) * sizeof(float));
    float *buf = malloc((n + 1) * sizeof(float)), *out = buf, *sent = NULL;
    if (into_shared) {
        void *p = NULL;
        snprintf(what, sizeof what, "%s: sumo_mem_alloc", c->name);
        check(sumo_mem_alloc(comm, (n + 1) * sizeof(float), &p) == SUMO_SUCCESS, what);
        out = p ? p : buf;
        sent = malloc((n + 1) * sizeof(float));
    }
    double *G = malloc((n + 1) * sizeof *G), *bound = malloc((n + 1) * sizeof *bound);
    for (int s = 0; s < c->steps; s++) {
        if (c->restore_after > 0 && s == c->restore_after) {
            size_t bytes = 0;
            sumo_aggregator_state_size(agg, &bytes);
            unsigned char *st = malloc(bytes + 1);
            sumo_result rs = sumo_aggregator_state_save(agg, st, bytes);
            sumo_aggregator_destroy(agg);
            agg = NULL;
            sumo_result rc = sumo_aggregator_create(comm, &o, &agg);
            sumo_result rl = rc == SUMO_SUCCESS ? sumo_aggregator_state_load(agg, st, bytes) : rc;
            free(st);
            snprintf(what, sizeof what, "%s: save, recreate, load before step %d", c->name, s);
            check(rs == SUMO_SUCCESS && rc == SUMO_SUCCESS && rl == SUMO_SUCCESS, what);
            if (rc != SUMO_SUCCESS) break;
        }
        for (int q = 0; q < g_size; q++)
            for (size_t i = 0; i < n; i++) all[q][i] = input(seed, s, q, i);
        if (s == c->nan_step && n > 0) all[g_size - 1][n / 2] = NAN;
        memcpy(buf, all[g_rank], n * sizeof(float));
        if (into_shared) {
            memcpy(sent, buf, n * sizeof(float));
            r = sumo_aggregator_apply_into(agg, buf, out, n, SUMO_FLOAT32);
            snprintf(what, sizeof what, "%s: step %d leaves the send buffer alone", c->name, s);
            check(n == 0 || memcmp(sent, buf, n * sizeof(float)) == 0, what);
        } else {
            r = sumo_aggregator_apply(agg, buf, n, SUMO_FLOAT32);
        }
        int bad = ref_acga_step(&F, all, G, bound);
        snprintf(what, sizeof what, "%s: step %d status %s", c->name, s, sumo_result_name(r));
        check(r == (bad ? SUMO_ERR_NONFINITE : SUMO_SUCCESS), what);
        snprintf(what, sizeof what, "%s: step %d bit-identical on every rank", c->name, s);
        check(same_on_every_rank(out, n), what);
        size_t wrong = 0;
        for (size_t i = 0; i < n; i++) {
            bool ok = isnan(G[i]) ? isnan(out[i]) : fabs(out[i] - G[i]) <= 2e-5 * bound[i] + 1e-30;
            if (!ok && wrong++ == 0)
                fprintf(stderr, "rank %d: %s step %d element %zu = %.9g, reference %.9g\n", g_rank,
                        c->name, s, i, out[i], G[i]);
        }
        snprintf(what, sizeof what, "%s: step %d equals the reference", c->name, s);
        check(wrong == 0, what);
    }
    sumo_comm_stats st;
    sumo_aggregator_stats(agg, &st);
    /* Two exchanges a step in Gram form (the gradients once, the Gram matrices). A NaN makes
     * every rank decline it and run the two-exchange form, which reports the NaN: its sum and
     * allgather, then the final allreduce (and the rescale's broadcast) unless every group is
     * NaN, as in whole-model mode. */
    uint64_t since = c->restore_after > 0 ? (uint64_t)(c->steps - c->restore_after) : (uint64_t)c->steps;
    bool nan_counted = c->nan_step >= 0 && !(c->restore_after > 0 && c->nan_step < c->restore_after);
    uint64_t fallback = F.K == 1 ? 2 : 3 + (uint64_t)c->rescale;
    uint64_t want = 2 * since + (nan_counted ? fallback : 0);
    snprintf(what, sizeof what, "%s: %llu collectives, %llu expected", c->name,
             (unsigned long long)st.rounds, (unsigned long long)want);
    check(st.rounds == want, what);
    sumo_aggregator_destroy(agg);
    ref_acga_free(&F);
    for (int q = 0; q < g_size; q++) free(all[q]);
    free(all);
    if (out != buf) check(sumo_mem_free(comm, out) == SUMO_SUCCESS, "sumo_mem_free");
    free(sent);
    free(buf);
    free(G);
    free(bound);
}

/* The uninterrupted run and a checkpointed one give the same bits. */
static void checkpoint_bits(sumo_comm *comm)
{
    const size_t counts[] = {100, 3, 257};
    sumo_aggregator_options o;
    sumo_aggregator_options_default(SUMO_AGGREGATE_ACGA, &o);
    o.tensor_counts = counts;
    o.ntensors = 3;
    o.acga.per_tensor = 1;
    o.acga.beta = 0.9;
    const size_t n = 360;
    float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    sumo_aggregator *x = NULL, *y = NULL;
    bool ok = sumo_aggregator_create(comm, &o, &x) == SUMO_SUCCESS &&
              sumo_aggregator_create(comm, &o, &y) == SUMO_SUCCESS;
    for (int s = 0; s < 6 && ok; s++) {
        if (s == 3) {
            size_t bytes = 0;
            sumo_aggregator_state_size(y, &bytes);
            unsigned char *st = malloc(bytes);
            ok = sumo_aggregator_state_save(y, st, bytes) == SUMO_SUCCESS;
            sumo_aggregator_destroy(y);
            y = NULL;
            ok = ok && sumo_aggregator_create(comm, &o, &y) == SUMO_SUCCESS &&
                 sumo_aggregator_state_load(y, st, bytes) == SUMO_SUCCESS;
            free(st);
        }
        for (size_t i = 0; i < n; i++) a[i] = b[i] = input(77, s, g_rank, i);
        ok = ok && sumo_aggregator_apply(x, a, n, SUMO_FLOAT32) == SUMO_SUCCESS &&
             sumo_aggregator_apply(y, b, n, SUMO_FLOAT32) == SUMO_SUCCESS &&
             memcmp(a, b, n * sizeof *a) == 0;
    }
    check(ok, "checkpoint round trip continues bit for bit");
    sumo_aggregator_destroy(x);
    sumo_aggregator_destroy(y);
    free(a);
    free(b);
}

static const size_t awkward[] = {0, 1, 7, 0, 33, 1, 517, 3, 0, 2, 129};
static const size_t big[] = {3, 70001, 0, 5};

static size_t total(const size_t *c, size_t k)
{
    size_t t = 0;
    for (size_t i = 0; i < k; i++) t += c[i];
    return t;
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
        const size_t na = sizeof awkward / sizeof awkward[0], nb = sizeof big / sizeof big[0];
        const config cs[] = {
            {"whole, beta 0", NULL, 0, 1001, 0, 0, 0, 0.0, 3, -1, 0},
            {"whole, beta 0.9", NULL, 0, 1001, 0, 0, 0, 0.9, 5, -1, 0},
            {"whole, beta 0.9, reference permutation", NULL, 0, 1001, 0, 1, 0, 0.9, 5, -1, 0},
            {"whole, rescale", NULL, 0, 513, 0, 0, 1, 0.5, 3, -1, 0},
            {"one element", NULL, 0, 1, 0, 0, 0, 0.5, 3, -1, 0},
            {"empty", NULL, 0, 0, 0, 0, 0, 0.5, 2, -1, 0},
            {"awkward layout, whole model", awkward, na, 0, 0, 0, 0, 0.8, 4, -1, 0},
            {"awkward layout, per tensor", awkward, na, 0, 1, 0, 0, 0.8, 4, -1, 0},
            {"awkward, per tensor, reference permutation, rescale", awkward, na, 0, 1, 1, 1, 0.8, 4, -1, 0},
            {"big, per tensor", big, nb, 0, 1, 0, 0, 0.9, 3, -1, 0},
            {"whole, NaN at step 1", NULL, 0, 300, 0, 0, 0, 0.7, 3, 1, 0},
            {"per tensor, NaN at step 2", awkward, na, 0, 1, 0, 0, 0.7, 4, 2, 0},
            {"whole, checkpoint at step 2", NULL, 0, 400, 0, 0, 0, 0.9, 5, -1, 2},
            {"per tensor, checkpoint at step 3", big, nb, 0, 1, 0, 1, 0.9, 5, -1, 3},
        };
        for (size_t k = 0; k < sizeof cs / sizeof cs[0]; k++) {
            config c = cs[k];
            if (c.counts) c.count = total(c.counts, c.ntensors);
            run_config(comm, &c, 1000 + k, false);
            run_config(comm, &c, 1000 + k, true);
        }
        checkpoint_bits(comm);
    }
    sumo_comm_destroy(comm);
    if (g_rank == 0) printf("acga mpi (np %d): %d passed, %d failed\n", g_size, g_passed, g_failed);
    MPI_Finalize();
    return g_failed ? 1 : 0;
}
