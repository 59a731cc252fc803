/*
 * ACGA's options against the reference of support/acga_run.h: momentum (with both mappings),
 * out of place (and its refusals), per tensor with one small exchange a step, the rescale to
 * the mean gradient's norm, and a buffer large enough for the vector kernels' and the
 * collectives' slicing.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "sumo_aggregation.h"
#include "support/acga_run.h"
#include "support/harness.h"
#include "support/reference.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_momentum),
        cmocka_unit_test(test_out_of_place),
        cmocka_unit_test(test_out_of_place_refusals),
        cmocka_unit_test(test_per_tensor),
        cmocka_unit_test(test_rescale),
        cmocka_unit_test(test_large),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
