/*
 * ACGA's degenerate steps, as src/aggregation/acga.c decides them, against the reference of
 * support/acga_run.h: zero gradients, a coefficient sum that cancels or is negative (with and
 * without the guard), a non-finite gradient (whole model and per tensor: NONFINITE on every
 * rank, the momentum not advanced), and the dtypes and options it refuses.
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_zero_gradients),
        cmocka_unit_test(test_cancelling_sum),
        cmocka_unit_test(test_negative_sum),
        cmocka_unit_test(test_nonfinite_whole),
        cmocka_unit_test(test_nonfinite_per_tensor),
        cmocka_unit_test(test_bad_dtype_and_options),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
