/*
 * The Adasum kernels against plain C written here: dot_norms (the dot product and both squared
 * norms in double, within the bound of any summation order, the same bits whatever the
 * alignment; squares that fp32 could not hold, NaN and Inf) and scaled_add (one rounding, as
 * written, a == b included, and the range a double holds mid-computation), on every
 * instruction-set path this CPU has, the portable one included.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/kernels_isa.h"
#include "support/kernel_check.h"
#include "support/reference.h"

/* ---- dot_norms ---------------------------------------------------------------------------- */

/* Within (n + 8) ulps of the sum of magnitudes: the bound for any order of double sums. */
static void expect_close(double got, double want, double mag, size_t n, const char *what,
                         sumo__isa isa, sumo_dtype dt)
{
    double tol = (double)(n + 8) * DBL_EPSILON * mag + DBL_MIN;
    if (!(fabs(got - want) <= tol))
        fail_msg("%s %s %s n=%zu: got %.17g want %.17g (tol %g)", what, sumo__kernel_isa_name(isa),
                 sumo_dtype_name(dt), n, got, want, tol);
}

static void test_dot_norms_random(void **state)
{
    (void)state;
    sumo__isa isas[SUMO__ISA_COUNT];
    int np = paths(isas);
    uint64_t s = 4;
    for (int d = 0; d < 4; d++)
        for (size_t z = 0; z < NSIZES; z++) {
            sumo_dtype dt = dtypes[d];
            size_t n = sizes[z], bytes = n * sumo__dtype_bytes(dt);
            ubuf a = ubuf_new(dt, n), b = ubuf_new(dt, n);
            fill_random(dt, a.p, n, &s);
            fill_random(dt, b.p, n, &s);
            /* reference: long double sums, magnitudes for the bound */
            long double dot = 0, aa = 0, bb = 0;
            double mdot = 0;
            for (size_t i = 0; i < n; i++) {
                double x = get(dt, a.p, i), y = get(dt, b.p, i);
                dot += (long double)x * y;
                aa += (long double)x * x;
                bb += (long double)y * y;
                mdot += fabs(x * y);
            }
            /* the same data one element further on, to check alignment changes nothing */
            char *shifted = malloc(bytes + 64);
            assert_non_null(shifted);
            void *a2 = shifted + 8 + sumo__dtype_bytes(dt);
            memcpy(a2, a.p, bytes);
            for (int p = 0; p < np; p++) {
                double out[3] = {-1, -1, -1}, out2[3];
                sumo__kernel_dot_norms_isa(isas[p], dt, a.p, b.p, n, out);
                expect_close(out[0], (double)dot, mdot, n, "dot", isas[p], dt);
                expect_close(out[1], (double)aa, (double)aa, n, "|a|^2", isas[p], dt);
                expect_close(out[2], (double)bb, (double)bb, n, "|b|^2", isas[p], dt);
                sumo__kernel_dot_norms_isa(isas[p], dt, a2, b.p, n, out2);
                assert_memory_equal(out, out2, sizeof out);
            }
            double pub[3];
            sumo__kernel_dot_norms(dt, a.p, b.p, n, pub);
            expect_close(pub[0], (double)dot, mdot, n, "dot", sumo__kernel_isa_best(), dt);
            free(shifted);
            free(a.base);
            free(b.base);
        }
}

/* Squares that would underflow or overflow in fp32 are fine in double; NaN and Inf show. */
static void test_dot_norms_specials(void **state)
{
    (void)state;
    sumo__isa isas[SUMO__ISA_COUNT];
    int np = paths(isas);
    enum { N = 1001 };
    for (int p = 0; p < np; p++)
        for (int d = 0; d < 4; d++) {
            sumo_dtype dt = dtypes[d];
            ubuf a = ubuf_new(dt, N), b = ubuf_new(dt, N);
            /* the smallest positive subnormal of each format, and a large value */
            double tiny = dt == SUMO_FLOAT16 ? 0x1p-24
                          : dt == SUMO_FLOAT64 ? 0x1p-1074 * 0x1p+600
                          : dt == SUMO_BFLOAT16 ? 0x1p-133
                                                : 0x1p-149;
            double huge = dt == SUMO_FLOAT16 ? 32768.0 : dt == SUMO_FLOAT64 ? 0x1p+400 : 0x1p+100;
            for (size_t i = 0; i < N; i++) {
                put(dt, a.p, i, tiny);
                put(dt, b.p, i, i % 2 ? huge : -huge);
            }
            double out[3];
            sumo__kernel_dot_norms_isa(isas[p], dt, a.p, b.p, N, out);
            assert_true(out[0] == -tiny * huge);        /* 501 negative, 500 positive terms */
            assert_true(out[1] == N * tiny * tiny);     /* exact: powers of two */
            assert_true(out[2] == N * huge * huge);
            put(dt, a.p, 777, INFINITY);
            sumo__kernel_dot_norms_isa(isas[p], dt, a.p, b.p, N, out);
            assert_true(isinf(out[0]) && out[1] == INFINITY);
            put(dt, b.p, 1000, NAN); /* the scalar tail */
            sumo__kernel_dot_norms_isa(isas[p], dt, a.p, b.p, N, out);
            assert_true(isnan(out[0]) && isnan(out[2]));
            out[0] = out[1] = out[2] = 42;
            sumo__kernel_dot_norms_isa(isas[p], dt, a.p, b.p, 0, out);
            assert_true(out[0] == 0 && out[1] == 0 && out[2] == 0);
            free(a.base);
            free(b.base);
        }
}

/* ---- scaled_add --------------------------------------------------------------------------- */

static double ref_scaled(sumo_dtype dt, double x, double ca, double y, double cb)
{
    switch (dt) {
    case SUMO_FLOAT64: return fma(ca, x, cb * y);
    case SUMO_FLOAT32: return (float)fma(ca, x, cb * y);
    default: return fmaf((float)ca, (float)x, (float)cb * (float)y);
    }
}

static void test_scaled_add(void **state)
{
    (void)state;
    static const double coef[][2] = {{0.7, -1.3}, {1.0, 1.0}, {0.1, 0.0}, {-2.5, 1e-3},
                                     {1.0 / 3, 2.0 / 3}};
    sumo__isa isas[SUMO__ISA_COUNT];
    int np = paths(isas);
    uint64_t s = 5;
    for (int p = 0; p < np; p++)
        for (int d = 0; d < 4; d++)
            for (size_t z = 0; z < NSIZES; z++)
                for (size_t c = 0; c < sizeof coef / sizeof coef[0]; c++) {
                    sumo_dtype dt = dtypes[d];
                    size_t n = sizes[z], bytes = n * sumo__dtype_bytes(dt);
                    double ca = coef[c][0], cb = coef[c][1];
                    ubuf a = ubuf_new(dt, n), b = ubuf_new(dt, n);
                    fill_random(dt, a.p, n, &s);
                    fill_random(dt, b.p, n, &s);
                    if (n > 20) {
                        put(dt, a.p, 19, NAN);
                        put(dt, b.p, n - 1, INFINITY);
                    }
                    void *ca0 = malloc(bytes + 1), *cbb = malloc(bytes + 1);
                    assert_true(ca0 && cbb);
                    memcpy(ca0, a.p, bytes);
                    memcpy(cbb, b.p, bytes);
                    sumo__kernel_scaled_add_isa(isas[p], dt, a.p, ca, b.p, cb, n);
                    for (size_t i = 0; i < n; i++)
                        expect_elem(dt, a.p, i,
                                    ref_scaled(dt, get(dt, ca0, i), ca, get(dt, cbb, i), cb),
                                    "scaled_add", isas[p]);
                    assert_memory_equal(b.p, cbb, bytes);
                    /* a == b: a = (ca + cb) a, evaluated as written */
                    sumo__kernel_scaled_add_isa(isas[p], dt, b.p, ca, b.p, cb, n);
                    for (size_t i = 0; i < n; i++)
                        expect_elem(dt, b.p, i,
                                    ref_scaled(dt, get(dt, cbb, i), ca, get(dt, cbb, i), cb),
                                    "scaled_add a==b", isas[p]);
                    free(ca0);
                    free(cbb);
                    free(a.base);
                    free(b.base);
                }
}

/* fp16 overflows to Inf in the rounding; fp32 keeps a value that only double can hold
 * mid-computation. */
static void test_scaled_add_range(void **state)
{
    (void)state;
    sumo__isa isas[SUMO__ISA_COUNT];
    int np = paths(isas);
    for (int p = 0; p < np; p++) {
        uint16_t h[19], g[19];
        float f[19], e[19];
        for (int i = 0; i < 19; i++) {
            h[i] = 0x7bff; /* 65504 */
            g[i] = 0x7bff;
            f[i] = FLT_MAX;
            e[i] = FLT_MAX;
        }
        sumo__kernel_scaled_add_isa(isas[p], SUMO_FLOAT16, h, 0.75, g, 0.75, 19);
        /* 0.75 * 65504 * 2 = 98256 > 65520: Inf */
        for (int i = 0; i < 19; i++) assert_int_equal(h[i], 0x7c00);
        /* FLT_MAX + FLT_MAX overflows fp32, but times 0.5 each it is FLT_MAX exactly */
        sumo__kernel_scaled_add_isa(isas[p], SUMO_FLOAT32, f, 0.5, e, 0.5, 19);
        for (int i = 0; i < 19; i++) assert_true(f[i] == FLT_MAX);
        sumo__kernel_scaled_add_isa(isas[p], SUMO_FLOAT32, f, 1.0, e, 1.0, 19);
        for (int i = 0; i < 19; i++) assert_true(f[i] == INFINITY);
    }
}
int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dot_norms_random),
        cmocka_unit_test(test_dot_norms_specials),
        cmocka_unit_test(test_scaled_add),
        cmocka_unit_test(test_scaled_add_range),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
