/*
 * ACGA against the design notes' oracles (docs/design/acga.md), on the threads transport and
 * against the reference of support/acga_run.h: identical gradients, orthogonal gradients, the
 * non-involutive permutation (and ties sorted by rank), and uniform weights == sumo's average
 * bit for bit; the fifth, every rank's bits equal, is checked on every step of every test.
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
int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_identical_gradients),
        cmocka_unit_test(test_orthogonal),
        cmocka_unit_test(test_permutation),
        cmocka_unit_test(test_ties_by_rank),
        cmocka_unit_test(test_uniform_is_average),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
