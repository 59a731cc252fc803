/*
 * What the ACGA tests (tests/unit/test_acga_*.c) share: a run of the aggregator on the threads
 * transport (N ranks, several steps, each rank's results, messages, saved states and stats
 * kept for the test to check afterwards) and its check against an independent reference.
 *
 * The reference (support/reference.c, shared with tests/mpi/test_acga_mpi.c) is
 * docs/design/acga.md's step written out plainly in double: the sum of the ranks' gradients, dot
 * products and norms by straight loops, the stable sort as a count of smaller keys (ties by
 * rank), the EMA, both back-mappings, the negative guard, the documented fallback (uniform
 * weights when sum(a') <= 1e-6 sum|a'|), the weighted sum and the optional rescale. It shares
 * no code with src/aggregation/acga.c. The library works on an fp32 sum, so
 * results are compared within a bound scaled by sum_r |w_r g_r,i| / (|g_r| + eps); where the
 * notes promise bits (plain averaging, ranks, checkpoints) the comparison is bitwise. Every
 * rank's bits equal is checked on every step of every run.
 */
#ifndef SUMO_TEST_ACGA_RUN_H
#define SUMO_TEST_ACGA_RUN_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "sumo_aggregation.h"
#include "support/harness.h"
#include "support/reference.h"

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAXN 8
#define MAXT 8
#define MAXSTEPS 8

static const int SIZES[] = {1, 2, 3, 4, 5, 8};
#define NSIZES ((int)(sizeof SIZES / sizeof SIZES[0]))

/* Bytes of the small exchange: K packed N x N Gram matrices. */
static inline size_t gram_bytes(int N, size_t K)
{
    return K * (size_t)N * (size_t)(N + 1) / 2 * sizeof(double);
}

/* ---- running the library ----------------------------------------------------------------- */

typedef struct acga_run {
    int N;
    size_t count;
    sumo_dtype dtype;
    sumo_aggregator_options opts;
    size_t counts[MAXT];
    int steps;
    int restore_after;            /* > 0: before this step save, destroy, recreate, load */
    bool out_of_place;            /* sumo_aggregator_apply_into(in, out) */
    bool in_changed[MAXSTEPS][MAXN];
    const unsigned char *preload; /* loaded into the fresh aggregator before step 0 */
    size_t preload_bytes;
    float *in[MAXSTEPS][MAXN];
    float *out[MAXSTEPS][MAXN];
    float *avg_in[MAXSTEPS][MAXN]; /* when set: sumo_allreduce(AVERAGE) of these into avg */
    float *avg[MAXSTEPS][MAXN];
    sumo_result create_res[MAXN], save_res[MAXN], load_res[MAXN], preload_res[MAXN];
    sumo_result res[MAXSTEPS][MAXN];
    char msg[MAXSTEPS][MAXN][256];
    unsigned char *state[MAXSTEPS][MAXN]; /* saved after each step */
    size_t state_bytes[MAXN];
    sumo_comm_stats stats[MAXN];
} acga_run;

/* Step s of rank r equals the plain average of the unit gradients within fp32 rounding of its
 * terms (the one-exchange form weighs each gradient by 1/N instead of summing and dividing, so
 * where the terms cancel only their magnitude bounds the difference). */
static inline void assert_close_to_average(const acga_run *R, int s, int r, size_t lo, size_t hi)
{
    for (size_t i = lo; i < hi; i++) {
        double want = R->avg[s][r][i], scale = 0;
        for (int q = 0; q < R->N; q++) scale += fabs(R->avg_in[s][q][i]) / R->N;
        assert_true(fabs(R->out[s][r][i] - want) <= 4.0 * R->N * FLT_EPSILON * scale + 1e-30);
    }
}

static inline void run_init(acga_run *R, int N, size_t count, int steps)
{
    memset(R, 0, sizeof *R);
    R->N = N;
    R->count = count;
    R->steps = steps;
    R->dtype = SUMO_FLOAT32;
    sumo_aggregator_options_default(SUMO_AGGREGATE_ACGA, &R->opts);
    for (int s = 0; s < steps; s++)
        for (int r = 0; r < N; r++) {
            R->in[s][r] = calloc(count + 1, sizeof(double)); /* room for any dtype */
            R->out[s][r] = calloc(count + 1, sizeof(double));
        }
}

static inline void run_layout(acga_run *R, const size_t *counts, size_t T)
{
    memcpy(R->counts, counts, T * sizeof *counts);
    R->opts.tensor_counts = R->counts;
    R->opts.ntensors = T;
}

static inline void run_free(acga_run *R)
{
    for (int s = 0; s < MAXSTEPS; s++)
        for (int r = 0; r < MAXN; r++) {
            free(R->in[s][r]);
            free(R->out[s][r]);
            free(R->avg_in[s][r]);
            free(R->avg[s][r]);
            free(R->state[s][r]);
        }
}

static inline void rank_body(sumo_comm *comm, int rank, int size, void *arg)
{
    (void)size;
    acga_run *R = arg;
    sumo_comm_set_timeout(comm, 60);
    sumo_aggregator *agg = NULL;
    R->create_res[rank] = sumo_aggregator_create(comm, &R->opts, &agg);
    if (R->create_res[rank] != SUMO_SUCCESS) return;
    if (R->preload)
        R->preload_res[rank] = sumo_aggregator_state_load(agg, R->preload, R->preload_bytes);
    size_t bytes = R->count * harness_dtype_size(R->dtype);
    for (int s = 0; s < R->steps; s++) {
        if (R->restore_after > 0 && s == R->restore_after) {
            size_t b = 0;
            sumo_aggregator_state_size(agg, &b);
            unsigned char *buf = malloc(b + 1);
            R->save_res[rank] = sumo_aggregator_state_save(agg, buf, b);
            sumo_aggregator_destroy(agg);
            agg = NULL;
            if (sumo_aggregator_create(comm, &R->opts, &agg) != SUMO_SUCCESS) {
                R->load_res[rank] = SUMO_ERR_INTERNAL;
                free(buf);
                return;
            }
            R->load_res[rank] = sumo_aggregator_state_load(agg, buf, b);
            free(buf);
        }
        if (R->out_of_place) {
            unsigned char *before = malloc(bytes + 1);
            memcpy(before, R->in[s][rank], bytes);
            R->res[s][rank] = sumo_aggregator_apply_into(agg, R->in[s][rank], R->out[s][rank],
                                                         R->count, R->dtype);
            R->in_changed[s][rank] = memcmp(before, R->in[s][rank], bytes) != 0;
            free(before);
        } else {
            memcpy(R->out[s][rank], R->in[s][rank], bytes);
            R->res[s][rank] = sumo_aggregator_apply(agg, R->out[s][rank], R->count, R->dtype);
        }
        const char *m = "";
        sumo_comm_error_message(comm, &m);
        snprintf(R->msg[s][rank], sizeof R->msg[s][rank], "%s", m);
        sumo_aggregator_state_size(agg, &R->state_bytes[rank]);
        R->state[s][rank] = malloc(R->state_bytes[rank] + 1);
        sumo_aggregator_state_save(agg, R->state[s][rank], R->state_bytes[rank]);
        if (R->avg_in[s][rank])
            sumo_allreduce(R->avg_in[s][rank], R->avg[s][rank], R->count, SUMO_FLOAT32,
                           SUMO_OP_AVERAGE, comm);
    }
    sumo_aggregator_stats(agg, &R->stats[rank]);
    sumo_aggregator_destroy(agg);
}

static inline void run_go(acga_run *R)
{
    assert_int_equal(harness_run_threads(R->N, rank_body, R), 0);
    for (int r = 0; r < R->N; r++) assert_int_equal(R->create_res[r], SUMO_SUCCESS);
}

/* ---- inputs ------------------------------------------------------------------------------ */

/* A consensus direction per (seed, step) plus per-rank noise and a per-rank scale, so the
 * coefficients are positive and well apart: what a training step looks like
 * (support/harness.c, shared with the MPI test). */
static inline void fill_correlated(acga_run *R, uint64_t seed, double noise)
{
    for (int s = 0; s < R->steps; s++)
        for (int r = 0; r < R->N; r++)
            for (size_t i = 0; i < R->count; i++)
                R->in[s][r][i] = harness_correlated(seed, s, r, i, noise);
}

/* ---- the reference (support/reference.c, shared with tests/mpi/test_acga_mpi.c) ---------- */

static inline void ref_init(ref_acga *F, const acga_run *R)
{
    assert_int_equal(ref_acga_init(F, R->N, &R->opts, R->count), 0);
}

/* Step s of the run against the reference (advanced by one step); every rank's bits equal. */
static inline void check_step(const acga_run *R, ref_acga *F, int s, const char *what)
{
    size_t n = R->count;
    double *G = calloc(n + 1, sizeof *G), *bound = calloc(n + 1, sizeof *bound);
    int bad = ref_acga_step(F, (float *const *)R->in[s], G, bound);
    sumo_result want = bad ? SUMO_ERR_NONFINITE : SUMO_SUCCESS;
    int fails = 0;
    for (int r = 0; r < R->N; r++) {
        if (R->res[s][r] != want) {
            fprintf(stderr, "%s N=%d step %d rank %d: %s, want %s (%s)\n", what, R->N, s, r,
                    sumo_result_name(R->res[s][r]), sumo_result_name(want), R->msg[s][r]);
            fails++;
        }
        if (memcmp(R->out[s][r], R->out[s][0], n * sizeof(float)) != 0) {
            fprintf(stderr, "%s N=%d step %d: rank %d's bits differ from rank 0's\n", what, R->N,
                    s, r);
            fails++;
        }
    }
    for (size_t i = 0; i < n && fails < 10; i++) {
        double got = R->out[s][0][i];
        bool ok = isnan(G[i]) ? isnan(got) : fabs(got - G[i]) <= 2e-5 * bound[i] + 1e-30;
        if (!ok) {
            fprintf(stderr, "%s N=%d step %d: element %zu = %.9g, reference %.9g (bound %.3g)\n",
                    what, R->N, s, i, got, G[i], bound[i]);
            fails++;
        }
    }
    free(G);
    free(bound);
    assert_int_equal(fails, 0);
}

static inline void check_all_steps(const acga_run *R, const char *what)
{
    ref_acga F;
    ref_init(&F, R);
    for (int s = 0; s < R->steps; s++) check_step(R, &F, s, what);
    ref_acga_free(&F);
}

/* Step s's unit gradients, g / (|g| + eps) per group [off[k], off[k + 1]) of K, into avg_in,
 * which the run averages with sumo_allreduce(AVERAGE) into avg: what uniform weights give. */
static inline void set_unit_normalised(acga_run *R, int s, const size_t *off, size_t K)
{
    for (int r = 0; r < R->N; r++) {
        R->avg_in[s][r] = calloc(R->count + 1, sizeof(float));
        R->avg[s][r] = calloc(R->count + 1, sizeof(float));
        for (size_t k = 0; k < K; k++) {
            double nn = 0;
            for (size_t i = off[k]; i < off[k + 1]; i++) nn += (double)R->in[s][r][i] * R->in[s][r][i];
            double den = sqrt(nn) + R->opts.acga.eps;
            double c = den == 0 ? 0.0 : 1.0 / den;
            for (size_t i = off[k]; i < off[k + 1]; i++)
                R->avg_in[s][r][i] = (float)(c * (double)R->in[s][r][i]);
        }
    }
}

#endif
