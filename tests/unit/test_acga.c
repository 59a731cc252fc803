/*
 * ACGA aggregation on the threads transport against an independent reference.
 *
 * The reference (support/reference.c, shared with tests/mpi/test_acga_mpi.c) is
 * docs/design/acga.md's step written out plainly in double: the sum of the ranks' gradients, dot
 * products and norms by straight loops, the stable sort as a count of smaller keys (ties by
 * rank), the EMA, both back-mappings, the negative guard, the documented fallback (uniform
 * weights when sum(a') <= 1e-6 sum|a'|), the weighted sum and the optional rescale. It shares
 * no code with src/aggregation/acga.c. The library works on an fp32 sum, so
 * results are compared within a bound scaled by sum_r |w_r g_r,i| / (|g_r| + eps); where the
 * notes promise bits (plain averaging, ranks, checkpoints) the comparison is bitwise.
 *
 * The design notes' five oracles: identical gradients, orthogonal gradients, the
 * non-involutive permutation, uniform weights == sumo's average bit for bit, and every rank's
 * bits equal (checked on every step of every test).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "sumo_aggregation.h"
#include "support/harness.h"
#include "support/reference.h"

#include <float.h>
#include <pthread.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAXN 8
#define MAXT 8
#define MAXSTEPS 8

static const int SIZES[] = {1, 2, 3, 4, 5, 8};
#define NSIZES ((int)(sizeof SIZES / sizeof SIZES[0]))

/* Bytes of the small exchange: K packed N x N Gram matrices. */
static size_t gram_bytes(int N, size_t K) { return K * (size_t)N * (size_t)(N + 1) / 2 * sizeof(double); }

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
static void assert_close_to_average(const acga_run *R, int s, int r, size_t lo, size_t hi)
{
    for (size_t i = lo; i < hi; i++) {
        double want = R->avg[s][r][i], scale = 0;
        for (int q = 0; q < R->N; q++) scale += fabs(R->avg_in[s][q][i]) / R->N;
        assert_true(fabs(R->out[s][r][i] - want) <= 4.0 * R->N * FLT_EPSILON * scale + 1e-30);
    }
}

static void run_init(acga_run *R, int N, size_t count, int steps)
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

static void run_layout(acga_run *R, const size_t *counts, size_t T)
{
    memcpy(R->counts, counts, T * sizeof *counts);
    R->opts.tensor_counts = R->counts;
    R->opts.ntensors = T;
}

static void run_free(acga_run *R)
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

static void rank_body(sumo_comm *comm, int rank, int size, void *arg)
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

static void run_go(acga_run *R)
{
    assert_int_equal(harness_run_threads(R->N, rank_body, R), 0);
    for (int r = 0; r < R->N; r++) assert_int_equal(R->create_res[r], SUMO_SUCCESS);
}

/* ---- inputs ------------------------------------------------------------------------------ */

/* A consensus direction per (seed, step) plus per-rank noise and a per-rank scale, so the
 * coefficients are positive and well apart: what a training step looks like
 * (support/harness.c, shared with the MPI test). */
static void fill_correlated(acga_run *R, uint64_t seed, double noise)
{
    for (int s = 0; s < R->steps; s++)
        for (int r = 0; r < R->N; r++)
            for (size_t i = 0; i < R->count; i++)
                R->in[s][r][i] = harness_correlated(seed, s, r, i, noise);
}

/* ---- the reference (support/reference.c, shared with tests/mpi/test_acga_mpi.c) ---------- */

static void ref_init(ref_acga *F, const acga_run *R)
{
    assert_int_equal(ref_acga_init(F, R->N, &R->opts, R->count), 0);
}

/* Step s of the run against the reference (advanced by one step); every rank's bits equal. */
static void check_step(const acga_run *R, ref_acga *F, int s, const char *what)
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

static void check_all_steps(const acga_run *R, const char *what)
{
    ref_acga F;
    ref_init(&F, R);
    for (int s = 0; s < R->steps; s++) check_step(R, &F, s, what);
    ref_acga_free(&F);
}

/* ---- oracle 1: identical gradients ------------------------------------------------------- */

static void test_identical_gradients(void **state)
{
    (void)state;
    for (int ni = 0; ni < NSIZES; ni++) {
        int N = SIZES[ni];
        acga_run R;
        run_init(&R, N, 257, 2);
        R.opts.acga.beta = 0.5;
        uint64_t st = 7;
        for (int s = 0; s < 2; s++)
            for (size_t i = 0; i < R.count; i++) {
                float v = (float)harness_uniform(&st);
                for (int r = 0; r < N; r++) R.in[s][r][i] = v;
            }
        run_go(&R);
        for (int s = 0; s < 2; s++) {
            double nn = 0;
            for (size_t i = 0; i < R.count; i++) nn += (double)R.in[s][0][i] * R.in[s][0][i];
            double den = sqrt(nn) + R.opts.acga.eps;
            for (size_t i = 0; i < R.count; i++) {
                double want = R.in[s][0][i] / den;
                assert_true(fabs(R.out[s][0][i] - want) <= 4.0 * N * FLT_EPSILON * fabs(want) + 1e-30);
            }
        }
        check_all_steps(&R, "identical");
        /* Two exchanges a step: the gradients once, and the N(N+1)/2 doubles of the Gram
         * matrix (the one-exchange form; docs/design/acga.md). */
        for (int r = 0; r < N; r++) {
            assert_int_equal(R.stats[r].rounds, 4);
            assert_int_equal(R.stats[r].bytes, 2 * (R.count * sizeof(float) + gram_bytes(N, 1)));
        }
        run_free(&R);
    }
}

/* ---- oracle 2: orthogonal gradients, beta = 0 -------------------------------------------- */

static void test_orthogonal(void **state)
{
    (void)state;
    const size_t block = 16;
    for (int ni = 0; ni < NSIZES; ni++) {
        int N = SIZES[ni];
        for (int refperm = 0; refperm <= 1; refperm++) {
            acga_run R;
            run_init(&R, N, block * (size_t)N, 1);
            R.opts.acga.reference_permutation = refperm;
            uint64_t st = 11;
            double sumnorm = 0;
            for (int r = 0; r < N; r++) {
                double nn = 0;
                for (size_t i = 0; i < block; i++) {
                    float v = (float)((1.0 + r) * harness_uniform(&st));
                    R.in[0][r][(size_t)r * block + i] = v;
                    nn += (double)v * v;
                }
                sumnorm += sqrt(nn);
            }
            run_go(&R);
            if (!refperm || N <= 2) {
                /* G = sum g_j / sum |g_j| (eps 1e-8 against norms near 1 and more). */
                for (int r = 0; r < N; r++)
                    for (size_t i = 0; i < R.count; i++) {
                        double want = R.in[0][r][i] / sumnorm;
                        if (R.in[0][r][i] == 0) continue;
                        assert_true(fabs(R.out[0][0][i] - want) <= 1e-6 * fabs(want) + 1e-12);
                    }
            }
            check_all_steps(&R, refperm ? "orthogonal, reference permutation" : "orthogonal");
            run_free(&R);
        }
    }
}

/* ---- oracle 3: the non-involutive permutation --------------------------------------------- */

/* g_r = norm_r e_r: orthogonal, so a_r = |g_r|^2 / (|g_r| + eps) / N ~ norm_r / N, and
 * G[r] = w_r |g_r| / (|g_r| + eps) ~ w_r exposes the weights. */
static void permutation_case(int N, const double *a, const double *ref_mapped)
{
    float *outs[2];
    acga_run R[2];
    for (int refperm = 0; refperm <= 1; refperm++) {
        acga_run *P = &R[refperm];
        run_init(P, N, (size_t)N, 1);
        P->opts.acga.reference_permutation = refperm;
        for (int r = 0; r < N; r++) P->in[0][r][r] = (float)(a[r] * N);
        run_go(P);
        check_all_steps(P, "permutation");
        outs[refperm] = P->out[0][0];
    }
    double asum = 0, msum = 0;
    for (int r = 0; r < N; r++) asum += a[r], msum += ref_mapped[r];
    double maxdiff = 0;
    for (int r = 0; r < N; r++) {
        /* Default: rank-preserving, w = a / sum(a). */
        assert_true(fabs(outs[0][r] - a[r] / asum) <= 1e-6);
        /* Compatibility: the sample code's m[idx]. */
        assert_true(fabs(outs[1][r] - ref_mapped[r] / msum) <= 1e-6);
        maxdiff = fmax(maxdiff, fabs(outs[0][r] - outs[1][r]));
    }
    assert_true(maxdiff > 0.05); /* the two modes really disagree */
    run_free(&R[0]);
    run_free(&R[1]);
}

static void test_permutation(void **state)
{
    (void)state;
    const double a5[] = {.3, .1, .2, .5, .4}, m5[] = {.2, .3, .1, .5, .4};
    permutation_case(5, a5, m5);
    const double a3[] = {.3, .1, .2}, m3[] = {.2, .3, .1};
    permutation_case(3, a3, m3);
}

/* Equal coefficients sort by rank: after a step with distinct coefficients the sorted EMA
 * slots differ, so which tied rank takes which slot shows in G. */
static void test_ties_by_rank(void **state)
{
    (void)state;
    const double norms[2][3] = {{1, 2, 3}, {2, 2, 1}}; /* step 1: ranks 0 and 1 tie exactly */
    for (int refperm = 0; refperm <= 1; refperm++) {
        acga_run R;
        run_init(&R, 3, 3, 2);
        R.opts.acga.beta = 0.5;
        R.opts.acga.reference_permutation = refperm;
        for (int s = 0; s < 2; s++)
            for (int r = 0; r < 3; r++) R.in[s][r][r] = (float)norms[s][r];
        run_go(&R);
        check_all_steps(&R, "ties");
        /* Sorted EMA after step 1: [1/3, 2/3, 5/6] (times ~1); the earlier rank takes the lower
         * slot (default mapping), so rank 0's weight is below rank 1's. */
        if (!refperm) assert_true(R.out[1][0][0] < R.out[1][0][1] - 0.05);
        run_free(&R);
    }
}

/* ---- oracle 4: uniform weights are sumo's average, bit for bit --------------------------- */

/* Gradients of small integers that sum to exactly zero: s = 0, every a = 0, so the weights
 * fall back to 1/N. Norms are square roots of exact integers, so the test's g/(|g| + eps) has
 * the library's bits, and sumo_allreduce(AVERAGE) of it must equal ACGA's result. */
static void fill_zero_sum(acga_run *R, int s, size_t lo, size_t hi, uint64_t seed)
{
    uint64_t st = seed;
    for (size_t i = lo; i < hi; i++) {
        float total = 0;
        for (int r = 0; r + 1 < R->N; r++) {
            float v = (float)((int)(harness_next(&st) % 7) - 3);
            R->in[s][r][i] = v;
            total += v;
        }
        R->in[s][R->N - 1][i] = R->N > 1 ? -total : 0.0f;
    }
}

static void set_unit_normalised(acga_run *R, int s, const size_t *off, size_t K)
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

static void test_uniform_is_average(void **state)
{
    (void)state;
    for (int ni = 0; ni < NSIZES; ni++) {
        int N = SIZES[ni];
        /* Whole model: the final collective is the average itself. */
        acga_run R;
        run_init(&R, N, 333, 1);
        fill_zero_sum(&R, 0, 0, R.count, 5 + (uint64_t)N);
        size_t off1[2] = {0, R.count};
        set_unit_normalised(&R, 0, off1, 1);
        run_go(&R);
        check_all_steps(&R, "uniform");
        for (int r = 0; r < N; r++) {
            assert_int_equal(R.res[0][r], SUMO_SUCCESS);
            assert_close_to_average(&R, 0, r, 0, R.count);
        }
        run_free(&R);

        /* Per tensor, one tensor uniform among weighted ones: summed, then divided by N. */
        const size_t counts[] = {40, 25, 60};
        run_init(&R, N, 125, 1);
        run_layout(&R, counts, 3);
        R.opts.acga.per_tensor = 1;
        fill_correlated(&R, 99, 0.3);
        fill_zero_sum(&R, 0, 40, 65, 17);
        size_t off3[4] = {0, 40, 65, 125};
        set_unit_normalised(&R, 0, off3, 3);
        run_go(&R);
        check_all_steps(&R, "uniform tensor");
        if (N > 1)
            for (int r = 0; r < N; r++)
                assert_close_to_average(&R, 0, r, 40, 65);
        run_free(&R);
    }
}

/* ---- momentum, per tensor, rescale -------------------------------------------------------- */

static void test_momentum(void **state)
{
    (void)state;
    const double betas[] = {0.5, 0.9};
    for (int ni = 0; ni < NSIZES; ni++)
        for (int b = 0; b < 2; b++)
            for (int refperm = 0; refperm <= 1; refperm++) {
                acga_run R;
                run_init(&R, SIZES[ni], 301, 6);
                R.opts.acga.beta = betas[b];
                R.opts.acga.reference_permutation = refperm;
                fill_correlated(&R, 1234 + (uint64_t)b, 0.6);
                run_go(&R);
                check_all_steps(&R, "momentum");
                run_free(&R);
            }
}

/* Out of place: the reference's results in the receive buffers over several steps with
 * momentum, whole and per tensor, and the send buffers untouched. */
static void test_out_of_place(void **state)
{
    (void)state;
    const size_t layout[] = {100, 1, 200};
    for (int ni = 0; ni < NSIZES; ni++)
        for (int per_tensor = 0; per_tensor <= 1; per_tensor++) {
            acga_run R;
            run_init(&R, SIZES[ni], 301, 4);
            R.out_of_place = true;
            R.opts.acga.beta = 0.9;
            if (per_tensor) {
                run_layout(&R, layout, 3);
                R.opts.acga.per_tensor = 1;
            }
            fill_correlated(&R, 4321 + (uint64_t)per_tensor, 0.6);
            run_go(&R);
            check_all_steps(&R, "out of place");
            for (int s = 0; s < R.steps; s++)
                for (int r = 0; r < R.N; r++) assert_false(R.in_changed[s][r]);
            run_free(&R);
        }
}

/* Send and receive buffers that overlap without being one pointer, or a NULL one: refused on
 * the rank that passed them and, told by it, on every other. */
typedef struct bad_into {
    int bad_rank;
    bool null_recv;
    sumo_result res[MAXN];
} bad_into;

static void bad_into_body(sumo_comm *comm, int rank, int size, void *arg)
{
    (void)size;
    bad_into *B = arg;
    sumo_comm_set_timeout(comm, 60);
    sumo_aggregator_options o;
    sumo_aggregator_options_default(SUMO_AGGREGATE_ACGA, &o);
    sumo_aggregator *agg = NULL;
    if (sumo_aggregator_create(comm, &o, &agg) != SUMO_SUCCESS) return;
    float buf[64] = {0};
    for (int i = 0; i < 64; i++) buf[i] = (float)(i + rank);
    float *send = buf, *recv = buf + 32;
    if (rank == B->bad_rank) recv = B->null_recv ? NULL : buf + 16; /* [16, 48) meets [0, 32) */
    B->res[rank] = sumo_aggregator_apply_into(agg, send, recv, 32, SUMO_FLOAT32);
    sumo_aggregator_destroy(agg);
}

static void test_out_of_place_refusals(void **state)
{
    (void)state;
    for (int null_recv = 0; null_recv <= 1; null_recv++) {
        bad_into B = {.bad_rank = 1, .null_recv = null_recv};
        assert_int_equal(harness_run_threads(3, bad_into_body, &B), 0);
        for (int r = 0; r < 3; r++) assert_int_not_equal(B.res[r], SUMO_SUCCESS);
        assert_int_equal(B.res[1], SUMO_ERR_INVALID_ARGUMENT);
    }
}

static void test_per_tensor(void **state)
{
    (void)state;
    const size_t counts[] = {5, 1, 64, 17, 200, 3};
    for (int ni = 0; ni < NSIZES; ni++)
        for (int per_tensor = 0; per_tensor <= 1; per_tensor++)
            for (int refperm = 0; refperm <= 1; refperm++) {
                int N = SIZES[ni];
                acga_run R;
                run_init(&R, N, 290, 4);
                run_layout(&R, counts, 6);
                R.opts.acga.per_tensor = per_tensor;
                R.opts.acga.reference_permutation = refperm;
                R.opts.acga.beta = 0.8;
                fill_correlated(&R, 77, 0.5);
                /* A tensor that is zero on one rank at one step. */
                if (N > 1) memset(R.in[2][N - 1] + 70, 0, 17 * sizeof(float));
                run_go(&R);
                check_all_steps(&R, per_tensor ? "per tensor" : "whole model with a layout");
                size_t K = per_tensor ? 6 : 1;
                for (int r = 0; r < N; r++) {
                    /* One small exchange of K Gram matrices a step, not one per tensor. */
                    assert_int_equal(R.stats[r].rounds, 2 * 4);
                    assert_int_equal(R.stats[r].bytes, 4 * (290 * sizeof(float) + gram_bytes(N, K)));
                    assert_int_equal(R.state_bytes[r], 24 + 8 * (size_t)N * K);
                }
                run_free(&R);
            }
}

static double norm_of(const float *p, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)p[i] * p[i];
    return sqrt(s);
}

static void test_rescale(void **state)
{
    (void)state;
    const size_t counts[] = {30, 70};
    for (int ni = 0; ni < NSIZES; ni++)
        for (int per_tensor = 0; per_tensor <= 1; per_tensor++) {
            int N = SIZES[ni];
            acga_run R;
            run_init(&R, N, 100, 3);
            run_layout(&R, counts, 2);
            R.opts.acga.per_tensor = per_tensor;
            R.opts.acga.rescale = 1;
            R.opts.acga.beta = 0.5;
            fill_correlated(&R, 4242, 0.8);
            run_go(&R);
            check_all_steps(&R, "rescale");
            /* |G| = |mean gradient|, per group. */
            size_t off[3] = {0, 30, 100};
            for (int s = 0; s < 3; s++) {
                size_t K = per_tensor ? 2 : 1;
                for (size_t k = 0; k < K; k++) {
                    size_t lo = per_tensor ? off[k] : 0, hi = per_tensor ? off[k + 1] : 100;
                    double mean2 = 0;
                    for (size_t i = lo; i < hi; i++) {
                        double m = 0;
                        for (int r = 0; r < N; r++) m += R.in[s][r][i];
                        mean2 += (m / N) * (m / N);
                    }
                    double gn = norm_of(R.out[s][0] + lo, hi - lo);
                    assert_true(fabs(gn - sqrt(mean2)) <= 1e-5 * sqrt(mean2));
                }
            }
            /* The rescale needs no exchange of its own: |G| is a function of the Gram matrix. */
            for (int r = 0; r < N; r++) assert_int_equal(R.stats[r].rounds, 2 * 3);
            run_free(&R);
        }
}

/* A buffer large enough for the vector kernels and the collectives' slicing. */
static void test_large(void **state)
{
    (void)state;
    acga_run R;
    run_init(&R, 4, (1u << 20) + 3, 2);
    R.opts.acga.beta = 0.9;
    fill_correlated(&R, 31337, 0.7);
    run_go(&R);
    check_all_steps(&R, "large");
    run_free(&R);
}

/* ---- degenerate steps --------------------------------------------------------------------- */

static void test_zero_gradients(void **state)
{
    (void)state;
    for (int ni = 0; ni < NSIZES; ni++) {
        int N = SIZES[ni];
        /* One rank's gradient is zero: an ordinary step. */
        acga_run R;
        run_init(&R, N, 64, 2);
        fill_correlated(&R, 3, 0.4);
        memset(R.in[0][N / 2], 0, R.count * sizeof(float));
        if (N > 1) {
            run_go(&R);
            check_all_steps(&R, "one zero gradient");
        }
        run_free(&R);

        /* Every gradient zero: G = 0, success, with eps 0 too (nothing divides by zero). */
        for (int eps0 = 0; eps0 <= 1; eps0++) {
            run_init(&R, N, 64, 1);
            if (eps0) R.opts.acga.eps = 0;
            run_go(&R);
            for (int r = 0; r < N; r++) {
                assert_int_equal(R.res[0][r], SUMO_SUCCESS);
                for (size_t i = 0; i < R.count; i++) assert_true(R.out[0][r][i] == 0.0f);
            }
            run_free(&R);
        }
    }
    /* No layout and zero elements. */
    acga_run R;
    run_init(&R, 3, 0, 1);
    run_go(&R);
    for (int r = 0; r < 3; r++) assert_int_equal(R.res[0][r], SUMO_SUCCESS);
    run_free(&R);
}

/* Guard off, sum(a) > 0 but below 1e-6 sum|a|: g0 = 10 e0, g1 = -9 e0, s = e0,
 * a ~ [1/2, -1/2] (their sum is of the order of eps): uniform weights, the plain average. */
static void test_cancelling_sum(void **state)
{
    (void)state;
    acga_run R;
    run_init(&R, 2, 2, 1);
    R.opts.acga.negative_guard = 0;
    R.in[0][0][0] = 10;
    R.in[0][1][0] = -9;
    size_t off[2] = {0, 2};
    set_unit_normalised(&R, 0, off, 1);
    run_go(&R);
    check_all_steps(&R, "cancelling sum");
    for (int r = 0; r < 2; r++) {
        assert_int_equal(R.res[0][r], SUMO_SUCCESS);
        assert_close_to_average(&R, 0, r, 0, 2);
    }
    assert_true(fabs(R.out[0][0][0]) <= 1e-7); /* (1 - 1) / 2 */
    run_free(&R);
}

/* g0 = 3 e0, g1 = g2 = -e0: s = e0, a = [1/3, -1/3, -1/3], sum(a) = -1/3. */
static void test_negative_sum(void **state)
{
    (void)state;
    for (int guard = 0; guard <= 1; guard++) {
        acga_run R;
        run_init(&R, 3, 4, 1);
        R.opts.acga.negative_guard = guard;
        R.in[0][0][0] = 3;
        R.in[0][1][0] = -1;
        R.in[0][2][0] = -1;
        size_t off[2] = {0, 4};
        set_unit_normalised(&R, 0, off, 1);
        run_go(&R);
        check_all_steps(&R, guard ? "negative sum, guard" : "negative sum, no guard");
        if (guard) {
            /* Shifted to [2/3, 0, 0]: all weight on rank 0. */
            assert_true(fabs(R.out[0][0][0] - 1.0) <= 1e-7);
        } else {
            /* Fallback: the plain average of the unit gradients. */
            for (int r = 0; r < 3; r++) assert_close_to_average(&R, 0, r, 0, 4);
            assert_true(fabs(R.out[0][0][0] + 1.0 / 3) <= 1e-7);
        }
        run_free(&R);
    }
}

static bool state_equal(const acga_run *R, int s1, int s2)
{
    for (int r = 0; r < R->N; r++)
        if (memcmp(R->state[s1][r], R->state[s2][r], R->state_bytes[r]) != 0) return false;
    return true;
}

static void test_nonfinite_whole(void **state)
{
    (void)state;
    const float bads[] = {NAN, INFINITY, -INFINITY};
    for (int b = 0; b < 3; b++)
        for (int ni = 0; ni < NSIZES; ni++) {
            int N = SIZES[ni];
            acga_run R;
            run_init(&R, N, 50, 3);
            R.opts.acga.beta = 0.7;
            fill_correlated(&R, 8, 0.5);
            R.in[1][N - 1][5] = bads[b];
            run_go(&R);
            check_all_steps(&R, "nonfinite"); /* the reference skips the EMA too */
            for (int r = 0; r < N; r++) {
                assert_int_equal(R.res[1][r], SUMO_ERR_NONFINITE);
                assert_non_null(strstr(R.msg[1][r], "acga"));
                for (size_t i = 0; i < R.count; i++) assert_true(isnan(R.out[1][r][i]));
            }
            assert_true(state_equal(&R, 0, 1)); /* the momentum was not advanced */
            run_free(&R);
        }
    /* Inputs whose fp32 sum overflows: the Gram form never forms that sum (its inner products
     * are in double), so the result is the unit gradient, finite. */
    acga_run R;
    run_init(&R, 2, 8, 1);
    for (int r = 0; r < 2; r++) R.in[0][r][0] = 3e38f, R.in[0][r][1] = 1;
    run_go(&R);
    for (int r = 0; r < 2; r++) {
        assert_int_equal(R.res[0][r], SUMO_SUCCESS);
        assert_true(fabs(R.out[0][r][0] - 1.0) <= 4 * FLT_EPSILON);
        for (size_t i = 1; i < R.count; i++) assert_true(fabs(R.out[0][r][i]) <= 1e-30);
    }
    run_free(&R);
}

static void test_nonfinite_per_tensor(void **state)
{
    (void)state;
    const size_t counts[] = {10, 20, 30};
    for (int ni = 0; ni < NSIZES; ni++) {
        int N = SIZES[ni];
        acga_run R;
        run_init(&R, N, 60, 3);
        run_layout(&R, counts, 3);
        R.opts.acga.per_tensor = 1;
        R.opts.acga.beta = 0.6;
        fill_correlated(&R, 21, 0.5);
        R.in[1][0][12] = NAN;
        run_go(&R);
        check_all_steps(&R, "nonfinite per tensor"); /* tensors 0 and 2 exact, 1 NaN */
        for (int r = 0; r < N; r++) {
            assert_int_equal(R.res[1][r], SUMO_ERR_NONFINITE);
            assert_non_null(strstr(R.msg[1][r], "tensor 1"));
        }
        assert_true(state_equal(&R, 0, 1));
        run_free(&R);
    }
}

static void test_bad_dtype_and_options(void **state)
{
    (void)state;
    const sumo_dtype dts[] = {SUMO_FLOAT64, SUMO_FLOAT16, SUMO_BFLOAT16};
    for (int d = 0; d < 3; d++) {
        acga_run R;
        run_init(&R, 3, 16, 1);
        R.dtype = dts[d];
        fill_correlated(&R, 1, 0.5);
        run_go(&R);
        for (int r = 0; r < 3; r++) {
            assert_int_equal(R.res[0][r], SUMO_ERR_INVALID_ARGUMENT);
            assert_int_equal(R.stats[r].rounds, 0);
        }
        run_free(&R);
    }
    /* Creation is collective: a one-rank handle lets the main thread create alone. */
    sumo_comm *comms[1];
    assert_int_equal(sumo_comm_create_threads(1, comms), SUMO_SUCCESS);
    sumo_aggregator_options o;
    assert_int_equal(sumo_aggregator_options_default(SUMO_AGGREGATE_ACGA, &o), SUMO_SUCCESS);
    assert_true(o.acga.beta == 0 && o.acga.negative_guard == 1 && o.acga.eps == 1e-8 &&
                o.acga.per_tensor == 0 && o.acga.reference_permutation == 0 && o.acga.rescale == 0);
    sumo_aggregator *agg = NULL;
    assert_int_equal(sumo_aggregator_create(comms[0], &o, &agg), SUMO_SUCCESS);
    sumo_aggregator_destroy(agg);
    for (int c = 0; c < 9; c++) {
        sumo_aggregator_options bad = o;
        switch (c) {
        case 0: bad.acga.beta = 1.0; break;
        case 1: bad.acga.beta = -0.1; break;
        case 2: bad.acga.beta = NAN; break;
        case 3: bad.acga.eps = -1e-8; break;
        case 4: bad.acga.eps = INFINITY; break;
        case 5: bad.acga.per_tensor = 2; break;
        case 6: bad.acga.reference_permutation = -1; break;
        case 7: bad.acga.negative_guard = 3; break;
        default: bad.acga.rescale = 2; break;
        }
        agg = NULL;
        assert_int_equal(sumo_aggregator_create(comms[0], &bad, &agg), SUMO_ERR_INVALID_ARGUMENT);
        assert_null(agg);
    }
    sumo_comm_destroy(comms[0]);
}

/* Creates an aggregator on every rank of comms at once (creation is collective). */
typedef struct create_job {
    sumo_comm *comm;
    const sumo_aggregator_options *opts;
    sumo_aggregator *agg;
    sumo_result r;
} create_job;

static void *create_main(void *p)
{
    create_job *j = p;
    j->r = sumo_aggregator_create(j->comm, j->opts, &j->agg);
    return NULL;
}

static void create_on_all(sumo_comm **comms, int n, const sumo_aggregator_options *o,
                          sumo_aggregator **aggs)
{
    create_job jobs[MAXN];
    pthread_t ids[MAXN];
    for (int r = 0; r < n; r++) {
        jobs[r] = (create_job){.comm = comms[r], .opts = o};
        assert_int_equal(pthread_create(&ids[r], NULL, create_main, &jobs[r]), 0);
    }
    for (int r = 0; r < n; r++) pthread_join(ids[r], NULL);
    for (int r = 0; r < n; r++) {
        assert_int_equal(jobs[r].r, SUMO_SUCCESS);
        aggs[r] = jobs[r].agg;
    }
}

/* ---- state -------------------------------------------------------------------------------- */

static void test_checkpoint_round_trip(void **state)
{
    (void)state;
    const size_t counts[] = {11, 50, 39};
    for (int ni = 0; ni < NSIZES; ni++)
        for (int per_tensor = 0; per_tensor <= 1; per_tensor++) {
            int N = SIZES[ni];
            acga_run A, B;
            run_init(&A, N, 100, 6);
            run_init(&B, N, 100, 6);
            for (acga_run *P = &A; P; P = P == &A ? &B : NULL) {
                run_layout(P, counts, 3);
                P->opts.acga.per_tensor = per_tensor;
                P->opts.acga.beta = 0.9;
                fill_correlated(P, 555, 0.6);
            }
            B.restore_after = 3;
            run_go(&A);
            run_go(&B);
            check_all_steps(&A, "checkpoint, uninterrupted");
            for (int r = 0; r < N; r++) {
                assert_int_equal(B.save_res[r], SUMO_SUCCESS);
                assert_int_equal(B.load_res[r], SUMO_SUCCESS);
                for (int s = 0; s < 6; s++)
                    assert_memory_equal(A.out[s][r], B.out[s][r], 100 * sizeof(float));
                assert_memory_equal(A.state[5][r], B.state[5][r], A.state_bytes[r]);
            }
            run_free(&A);
            run_free(&B);
        }
}

static void put_u32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static void put_f64(unsigned char *p, double d)
{
    uint64_t v;
    memcpy(&v, &d, 8);
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* The documented format, written by hand: header (magic, version, N, K, initialised, 0) and
 * the group-major EMA. */
static size_t make_state(unsigned char *p, uint32_t magic, uint32_t version, uint32_t n,
                         uint32_t k, uint32_t init, const double *m)
{
    put_u32(p, magic);
    put_u32(p + 4, version);
    put_u32(p + 8, n);
    put_u32(p + 12, k);
    put_u32(p + 16, init);
    put_u32(p + 20, 0);
    for (uint32_t i = 0; i < n * k; i++) put_f64(p + 24 + 8 * i, m[i]);
    return 24 + 8 * (size_t)n * k;
}

#define MAGIC 0x41474341u

static void test_state_format(void **state)
{
    (void)state;
    /* A hand-made initialised state drives the next step like the reference's momentum. */
    const double m[3] = {0.05, 0.2, 0.4};
    unsigned char buf[24 + 8 * 3];
    acga_run R;
    run_init(&R, 3, 40, 2);
    R.opts.acga.beta = 0.8;
    fill_correlated(&R, 9, 0.5);
    R.preload = buf;
    R.preload_bytes = make_state(buf, MAGIC, 1, 3, 1, 1, m);
    run_go(&R);
    ref_acga F;
    ref_init(&F, &R);
    F.init = 1;
    memcpy(F.m, m, sizeof m);
    for (int r = 0; r < 3; r++) assert_int_equal(R.preload_res[r], SUMO_SUCCESS);
    check_step(&R, &F, 0, "preloaded state");
    check_step(&R, &F, 1, "preloaded state");
    ref_acga_free(&F);
    run_free(&R);

    /* Rejections: 2 ranks x 3 tensors has the size of 3 ranks x 2 tensors. */
    sumo_comm *c2[2], *c3[3];
    assert_int_equal(sumo_comm_create_threads(2, c2), SUMO_SUCCESS);
    assert_int_equal(sumo_comm_create_threads(3, c3), SUMO_SUCCESS);
    const size_t l3[] = {4, 4, 4}, l2[] = {6, 6};
    sumo_aggregator_options o2, o3;
    sumo_aggregator_options_default(SUMO_AGGREGATE_ACGA, &o2);
    o3 = o2;
    o2.acga.per_tensor = o3.acga.per_tensor = 1;
    o2.tensor_counts = l3, o2.ntensors = 3; /* on 2 ranks */
    o3.tensor_counts = l2, o3.ntensors = 2; /* on 3 ranks */
    sumo_aggregator *all2[2], *all3[3];
    create_on_all(c2, 2, &o2, all2);
    create_on_all(c3, 3, &o3, all3);
    sumo_aggregator *a2 = all2[0], *a3 = all3[0];
    size_t b2 = 0, b3 = 0;
    assert_int_equal(sumo_aggregator_state_size(a2, &b2), SUMO_SUCCESS);
    assert_int_equal(sumo_aggregator_state_size(a3, &b3), SUMO_SUCCESS);
    assert_int_equal(b2, 24 + 8 * 6);
    assert_int_equal(b3, b2);
    unsigned char s2[72], s3[72];
    assert_int_equal(sumo_aggregator_state_save(a2, s2, b2), SUMO_SUCCESS);
    assert_int_equal(sumo_aggregator_state_load(a3, s2, b2), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_aggregator_state_save(a3, s3, b3), SUMO_SUCCESS);
    assert_int_equal(sumo_aggregator_state_load(a3, s3, b3), SUMO_SUCCESS);
    assert_int_equal(sumo_aggregator_state_load(a3, s3, b3 - 1), SUMO_ERR_INVALID_ARGUMENT);
    const double ok6[6] = {0, .1, .2, .3, .4, .5};
    double nan6[6] = {0, .1, .2, NAN, .4, .5};
    struct { uint32_t magic, version, n, k, init; const double *m; sumo_result want; } cases[] = {
        {MAGIC, 1, 3, 2, 1, ok6, SUMO_SUCCESS},
        {MAGIC, 1, 3, 2, 0, ok6, SUMO_SUCCESS},
        {MAGIC + 1, 1, 3, 2, 1, ok6, SUMO_ERR_INVALID_ARGUMENT},
        {MAGIC, 2, 3, 2, 1, ok6, SUMO_ERR_INVALID_ARGUMENT},
        {MAGIC, 1, 3, 2, 2, ok6, SUMO_ERR_INVALID_ARGUMENT},
        {MAGIC, 1, 2, 3, 1, ok6, SUMO_ERR_INVALID_ARGUMENT},
        {MAGIC, 1, 3, 2, 1, nan6, SUMO_ERR_INVALID_ARGUMENT},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        unsigned char b[72];
        size_t nb = make_state(b, cases[i].magic, cases[i].version, cases[i].n, cases[i].k,
                               cases[i].init, cases[i].m);
        assert_int_equal(nb, 72);
        assert_int_equal(sumo_aggregator_state_load(a3, b, nb), cases[i].want);
    }
    /* A rejected load leaves the state as it was (the last good load). */
    unsigned char after[72], want[72];
    make_state(want, MAGIC, 1, 3, 2, 0, ok6);
    assert_int_equal(sumo_aggregator_state_save(a3, after, 72), SUMO_SUCCESS);
    assert_memory_equal(after, want, 72);
    for (int r = 0; r < 2; r++) sumo_aggregator_destroy(all2[r]);
    for (int r = 0; r < 3; r++) sumo_aggregator_destroy(all3[r]);
    for (int r = 0; r < 2; r++) sumo_comm_destroy(c2[r]);
    for (int r = 0; r < 3; r++) sumo_comm_destroy(c3[r]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_identical_gradients),
        cmocka_unit_test(test_orthogonal),
        cmocka_unit_test(test_permutation),
        cmocka_unit_test(test_ties_by_rank),
        cmocka_unit_test(test_uniform_is_average),
        cmocka_unit_test(test_momentum),
        cmocka_unit_test(test_out_of_place),
        cmocka_unit_test(test_out_of_place_refusals),
        cmocka_unit_test(test_per_tensor),
        cmocka_unit_test(test_rescale),
        cmocka_unit_test(test_large),
        cmocka_unit_test(test_zero_gradients),
        cmocka_unit_test(test_cancelling_sum),
        cmocka_unit_test(test_negative_sum),
        cmocka_unit_test(test_nonfinite_whole),
        cmocka_unit_test(test_nonfinite_per_tensor),
        cmocka_unit_test(test_bad_dtype_and_options),
        cmocka_unit_test(test_checkpoint_round_trip),
        cmocka_unit_test(test_state_format),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
