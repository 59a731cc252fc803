/*
 * Adasum of two ranks (fp64, P = 2) against the reference of support/reference.c and the
 * combine's properties: symmetric, homogeneous, parallel inputs give their average, orthogonal
 * ones their sum, exactly where the arithmetic is exact, and the documented cut-off for tiny
 * norms.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "support/adasum_run.h"
#include "support/harness.h"
#include "support/reference.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- pair properties (fp64, P = 2, exact where the arithmetic is exact) ------------------- */

typedef struct pair_case {
    size_t n;
    double a[8], b[8];
} pair_case;

/* The library's Adasum(a, b) with a on rank 0 and b on rank 1. */
static int library_pair(const double *a, const double *b, size_t n, double *out)
{
    job j = {.size = 2, .dtype = SUMO_FLOAT64, .count = n};
    job_alloc(&j);
    memcpy(j.in[0], a, n * sizeof(double));
    memcpy(j.in[1], b, n * sizeof(double));
    int ok = harness_run_threads(2, body, &j) == 0 && j.res[0] == SUMO_SUCCESS &&
             j.res[1] == SUMO_SUCCESS && memcmp(j.out[0], j.out[1], n * sizeof(double)) == 0;
    memcpy(out, j.out[0], n * sizeof(double));
    job_free(&j);
    return ok ? 0 : 1;
}

/* |x - y| within k eps of the operands' scale (cancellation makes ulps of the result
 * meaningless). */
static bool close_to(double x, double y, double scale, double k)
{
    return fabs(x - y) <= k * DBL_EPSILON * scale;
}

static void check_pair_properties(void (*pair)(const double *, const double *, size_t, double *))
{
    const size_t n = 8;
    double a[8], b[8], r1[8], r2[8], ca[8], cb[8], neg[8], zero[8] = {0};
    /* Random data: properties up to rounding. */
    uint64_t s = 42;
    double scale = 0;
    for (size_t i = 0; i < n; i++) {
        a[i] = harness_uniform(&s);
        b[i] = harness_uniform(&s);
        scale = fmax(scale, 2 * (fabs(a[i]) + fabs(b[i])));
    }
    /* Symmetric (the fused update may round the two orders differently). */
    pair(a, b, n, r1);
    pair(b, a, n, r2);
    for (size_t i = 0; i < n; i++) assert_true(close_to(r1[i], r2[i], scale, 8));
    /* Homogeneous. */
    for (size_t i = 0; i < n; i++) {
        ca[i] = -3.0 * a[i];
        cb[i] = -3.0 * b[i];
    }
    pair(ca, cb, n, r2);
    for (size_t i = 0; i < n; i++) assert_true(close_to(-3.0 * r1[i], r2[i], 3 * scale, 16));
    /* Parallel: the average, whatever the signs and sizes. */
    const double c[][2] = {{3.0, -0.5}, {-2.0, -6.0}, {1e-3, 1e3}, {5.0, -5.0}, {0.5, 0.5}};
    for (size_t k = 0; k < sizeof c / sizeof c[0]; k++) {
        for (size_t i = 0; i < n; i++) {
            ca[i] = c[k][0] * a[i];
            cb[i] = c[k][1] * a[i];
        }
        pair(ca, cb, n, r1);
        double want_scale = (c[k][0] + c[k][1]) / 2;
        for (size_t i = 0; i < n; i++)
            assert_true(close_to(r1[i], want_scale * a[i], fabs(c[k][0]) + fabs(c[k][1]), 16));
    }
    /* Short mantissas (k/8): every step below is exact, so these hold exactly. */
    for (size_t i = 0; i < n; i++) {
        a[i] = (double)((int)(i * 5 % 17) - 8) / 8;
        neg[i] = -a[i];
    }
    pair(a, a, n, r1); /* Adasum(a, a) = a */
    for (size_t i = 0; i < n; i++) assert_true(r1[i] == a[i]);
    pair(a, neg, n, r1); /* Adasum(a, -a) = 0 */
    for (size_t i = 0; i < n; i++) assert_true(r1[i] == 0.0);
    pair(a, zero, n, r1); /* Adasum(a, 0) = a, both ways, and Adasum(0, 0) = 0 */
    for (size_t i = 0; i < n; i++) assert_true(r1[i] == a[i]);
    pair(zero, a, n, r1);
    for (size_t i = 0; i < n; i++) assert_true(r1[i] == a[i]);
    pair(zero, zero, n, r1);
    for (size_t i = 0; i < n; i++) assert_true(r1[i] == 0.0);
    /* Orthogonal: the sum (the dot is exactly 0, so both coefficients are exactly 1). */
    double o1[8] = {1, -2, 0, 0, 0.5, 0, 0, 0}, o2[8] = {0, 0, 3, 4, 0, 0, -7, 0};
    pair(o1, o2, n, r1);
    for (size_t i = 0; i < n; i++) assert_true(r1[i] == o1[i] + o2[i]);
    double p1[8] = {1, 2, 3, 4, 0, 0, 0, 0}, p2[8] = {1, 1, -1, 0, 0, 0, 0, 0}; /* dot 0 */
    pair(p1, p2, n, r1);
    for (size_t i = 0; i < n; i++) assert_true(r1[i] == p1[i] + p2[i]);
}

static void library_pair_checked(const double *a, const double *b, size_t n, double *out)
{
    assert_int_equal(library_pair(a, b, n, out), 0);
}

/*
 * The library's combine of two ranks against the reference on random pairs of several lengths
 * and scales (dot products may be summed in another order: within a few eps of the inputs'
 * size), and against closed forms at the documented cut-off, where a coefficient is exactly 1
 * because its squared norm is below 2^-511:
 *   a = e0, b = t e0 with t = 2^-256 (|b|^2 = 2^-512): A(a, b) = (1 - t/2) + t = 1 + 2^-257,
 *     which is 1 in double; without the cut-off cb = 1 - 2^255 and the result is about 1/2;
 *   t = 2^-255 (|b|^2 = 2^-510, above it): parallel vectors, the average (1 + t) / 2;
 *   a = b = 2^-300 e0 (both below it): both coefficients 1, the sum 2^-299 exactly.
 */
static void test_pair_library_against_reference(void **state)
{
    (void)state;
    const size_t ns[] = {1, 3, 8, 33, 1000};
    const double scales[] = {1e-3, 1.0, 1e3};
    uint64_t s = 4242;
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++)
        for (size_t c = 0; c < sizeof scales / sizeof scales[0]; c++) {
            size_t n = ns[k];
            double *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
            double *got = malloc(n * sizeof *got), *want = malloc(n * sizeof *want);
            assert_true(a && b && got && want);
            double na = 0, nb = 0;
            for (size_t i = 0; i < n; i++) {
                a[i] = harness_uniform(&s) * scales[c];
                /* b leans on a, so that the dot product matters */
                b[i] = (0.5 * a[i] + harness_uniform(&s) * scales[c]) * (c + 1);
                na += a[i] * a[i];
                nb += b[i] * b[i];
            }
            library_pair_checked(a, b, n, got);
            memcpy(want, a, n * sizeof *want);
            ref_adasum_pair(want, b, n);
            double tol = 4.0 * (double)(n + 8) * DBL_EPSILON * (sqrt(na) + sqrt(nb));
            for (size_t i = 0; i < n; i++)
                if (!(fabs(got[i] - want[i]) <= tol))
                    fail_msg("n %zu scale %g element %zu: library %.17g, reference %.17g", n,
                             scales[c], i, got[i], want[i]);
            free(a);
            free(b);
            free(got);
            free(want);
        }
    double a[4] = {1, 0, 0, 0}, b[4] = {0x1p-256, 0, 0, 0}, out[4];
    library_pair_checked(a, b, 4, out);
    assert_true(out[0] == 1.0 && out[1] == 0 && out[2] == 0 && out[3] == 0);
    b[0] = 0x1p-255;
    library_pair_checked(a, b, 4, out);
    assert_true(fabs(out[0] - (1 + 0x1p-255) / 2) <= 4 * DBL_EPSILON);
    a[0] = b[0] = 0x1p-300;
    library_pair_checked(a, b, 4, out);
    assert_true(out[0] == 0x1p-299);
}

static void test_pair_properties_library(void **state)
{
    (void)state;
    check_pair_properties(library_pair_checked);
}
int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pair_library_against_reference),
        cmocka_unit_test(test_pair_properties_library),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
