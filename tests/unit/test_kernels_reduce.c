/*
 * The reducing kernels against the plain sums of support/reference.h: which instruction-set
 * path dispatch picks, then reduce_multi on every path this CPU has, the portable one included
 * (random inputs, outputs aliasing inputs, NaN, Inf and overflow, a correctly rounded
 * divisor), and add and divide, on unaligned buffers of awkward lengths.
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

/* ---- the path report ---------------------------------------------------------------------- */

static void test_isa_report(void **state)
{
    (void)state;
    const char *name = sumo__kernel_isa();
    assert_string_equal(name, sumo__kernel_isa_name(sumo__kernel_isa_best()));
    assert_true(!strcmp(name, "avx512") || !strcmp(name, "avx2") || !strcmp(name, "portable"));
    print_message("kernels dispatch to: %s\n", name);
#if SUMO__KERNELS_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) assert_string_equal(name, "avx512");
    else if (__builtin_cpu_supports("avx2")) assert_string_equal(name, "avx2");
#endif
    /* Asking for a path the CPU lacks runs the best one it has rather than faulting. */
    float a[3] = {1, 2, 3}, b[3] = {4, 5, 6};
    const void *ins[2] = {a, b};
    void *outs[1] = {a};
    sumo__reduce_multi_isa(SUMO__ISA_AVX512, SUMO_FLOAT32, outs, 1, ins, 2, 3, 1);
    assert_true(a[0] == 5 && a[1] == 7 && a[2] == 9);
}

/* ---- reduce_multi ------------------------------------------------------------------------- */

/* The reference for outs: the ins summed left to right in the accumulator type, divided once
 * (support/reference.c). */
static double ref_reduce_elem(sumo_dtype dt, void *const *copies, int nin, size_t i, int divisor)
{
    double v[16];
    for (int j = 0; j < nin; j++) v[j] = get(dt, copies[j], i);
    return ref_sum_in_order(dt, v, nin, divisor);
}

#define MAXP 8

/*
 * One reduce_multi call checked against the reference. alias: 0 separate outputs, 1 outs[k]
 * == ins[k] for k < min(nin, nout), 2 outs[0] == ins[nin-1] (a different index).
 */
static void run_reduce(sumo__isa isa, sumo_dtype dt, size_t n, int nin, int nout, int divisor,
                       int alias, uint64_t *s)
{
    ubuf in[MAXP], out[MAXP];
    void *copies[MAXP];
    const void *ins[MAXP];
    void *outs[MAXP];
    size_t bytes = n * sumo__dtype_bytes(dt);
    for (int j = 0; j < nin; j++) {
        in[j] = ubuf_new(dt, n);
        fill_random(dt, in[j].p, n, s);
        copies[j] = malloc(bytes + 1);
        assert_non_null(copies[j]);
        memcpy(copies[j], in[j].p, bytes);
        ins[j] = in[j].p;
    }
    for (int k = 0; k < nout; k++) {
        out[k] = ubuf_new(dt, n);
        outs[k] = out[k].p;
    }
    if (alias == 1)
        for (int k = 0; k < nout && k < nin; k++) outs[k] = in[k].p;
    if (alias == 2) outs[0] = in[nin - 1].p;
    sumo__reduce_multi_isa(isa, dt, outs, nout, ins, nin, n, divisor);
    for (int k = 0; k < nout; k++)
        for (size_t i = 0; i < n; i++)
            expect_elem(dt, outs[k], i, ref_reduce_elem(dt, copies, nin, i, divisor),
                        "reduce_multi", isa);
    /* inputs that are not outputs are untouched */
    for (int j = 0; j < nin; j++) {
        int is_out = 0;
        for (int k = 0; k < nout; k++) is_out |= outs[k] == ins[j];
        if (!is_out) assert_memory_equal(ins[j], copies[j], bytes);
    }
    for (int j = 0; j < nin; j++) {
        free(in[j].base);
        free(copies[j]);
    }
    for (int k = 0; k < nout; k++) free(out[k].base);
}

static void test_reduce_multi_random(void **state)
{
    (void)state;
    static const int shapes[][2] = {{1, 1}, {2, 1}, {2, 2}, {1, 3}, {3, 2}, {4, 4},
                                    {5, 1}, {5, 5}, {8, 2}, {2, 6}};
    static const int divisors[] = {1, 3, 7};
    sumo__isa isas[SUMO__ISA_COUNT];
    int np = paths(isas);
    uint64_t s = 1;
    for (int p = 0; p < np; p++)
        for (int d = 0; d < 4; d++)
            for (size_t z = 0; z < NSIZES; z++)
                for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++)
                    for (int v = 0; v < 3; v++)
                        run_reduce(isas[p], dtypes[d], sizes[z], shapes[sh][0], shapes[sh][1],
                                   divisors[v], 0, &s);
}

/* outs == ins (the P-way in-place allreduce), and an output aliasing another index's input. */
static void test_reduce_multi_aliasing(void **state)
{
    (void)state;
    static const size_t ns[] = {1, 17, 1023, 4099, 10007};
    sumo__isa isas[SUMO__ISA_COUNT];
    int np = paths(isas);
    uint64_t s = 2;
    for (int p = 0; p < np; p++)
        for (int d = 0; d < 4; d++)
            for (size_t z = 0; z < sizeof ns / sizeof ns[0]; z++)
                for (int P = 1; P <= MAXP; P++) {
                    run_reduce(isas[p], dtypes[d], ns[z], P, P, P, 1, &s);
                    run_reduce(isas[p], dtypes[d], ns[z], P, P, 1, 1, &s);
                    run_reduce(isas[p], dtypes[d], ns[z], P, 1, 1, 2, &s);
                    run_reduce(isas[p], dtypes[d], ns[z], P, 6, 1, 2, &s);
                }
}

/* NaN, Inf and overflow propagate per element, in every dtype and path. */
static void test_reduce_multi_specials(void **state)
{
    (void)state;
    sumo__isa isas[SUMO__ISA_COUNT];
    int np = paths(isas);
    enum { N = 37 };
    for (int p = 0; p < np; p++)
        for (int d = 0; d < 4; d++)
            for (int nin = 2; nin <= 6; nin += 4) {
                sumo_dtype dt = dtypes[d];
                double big = dt == SUMO_FLOAT16    ? 60000.0
                             : dt == SUMO_FLOAT64  ? DBL_MAX
                             : dt == SUMO_BFLOAT16 ? 0x1.fep127 /* the largest bf16 */
                                                   : (double)FLT_MAX;
                ubuf a = ubuf_new(dt, N), b = ubuf_new(dt, N);
                for (size_t i = 0; i < N; i++) {
                    put(dt, a.p, i, (double)i);
                    put(dt, b.p, i, 1.0);
                }
                /* spread over vector and tail positions */
                put(dt, a.p, 3, NAN);        /* NaN + x */
                put(dt, b.p, 20, NAN);       /* x + NaN */
                put(dt, a.p, 5, INFINITY);   /* Inf + x */
                put(dt, a.p, 6, INFINITY);   /* Inf + -Inf */
                put(dt, b.p, 6, -INFINITY);
                put(dt, a.p, 17, big);       /* overflow */
                put(dt, b.p, 17, big);
                put(dt, a.p, 36, -big);
                put(dt, b.p, 36, -big);
                const void *ins[6] = {a.p, b.p, b.p, b.p, b.p, b.p};
                ubuf o = ubuf_new(dt, N);
                void *outs[1] = {o.p};
                sumo__reduce_multi_isa(isas[p], dt, outs, 1, ins, nin, N, 1);
                assert_true(isnan(get(dt, o.p, 3)));
                assert_true(isnan(get(dt, o.p, 20)));
                assert_true(get(dt, o.p, 5) == INFINITY);
                assert_true(isnan(get(dt, o.p, 6)));
                assert_true(get(dt, o.p, 17) == INFINITY);
                assert_true(get(dt, o.p, 36) == -INFINITY);
                assert_true(get(dt, o.p, 7) == 7.0 + nin - 1);
                free(a.base);
                free(b.base);
                free(o.base);
            }
}

/*
 * The divisor divides, correctly rounded: (1 + 2^-22) / 3 is 0x3eaaaaad, while multiplying by
 * the rounded reciprocal 0x3eaaaaab gives 0x3eaaaaae. Worked by hand: in units of 2^-25,
 * (1 + 2^-22)/3 = 2^25/3 + 8/3 = 11184813.33, rounding to 0xaaaaad. fp64: (1 + 2^-52) / 3
 * is 0x1.5555555555557p-2, the reciprocal route 0x1.5555555555556p-2.
 */
static void test_reduce_multi_divisor_rounding(void **state)
{
    (void)state;
    sumo__isa isas[SUMO__ISA_COUNT];
    int np = paths(isas);
    for (int p = 0; p < np; p++)
        for (size_t n = 1; n <= 40; n += 13) {
            float f[40], z[40];
            double d[40], dz[40];
            for (size_t i = 0; i < n; i++) {
                f[i] = ffrom(0x3f800002u);
                z[i] = 0;
                d[i] = 1.0 + 0x1p-52;
                dz[i] = 0;
            }
            const void *fins[3] = {f, z, z}, *dins[3] = {d, dz, dz};
            void *fouts[1] = {f}, *douts[1] = {d};
            sumo__reduce_multi_isa(isas[p], SUMO_FLOAT32, fouts, 1, fins, 3, n, 3);
            sumo__reduce_multi_isa(isas[p], SUMO_FLOAT64, douts, 1, dins, 3, n, 3);
            for (size_t i = 0; i < n; i++) {
                assert_int_equal(fbits(f[i]), 0x3eaaaaadu);
                assert_true(d[i] == 0x1.5555555555557p-2);
            }
        }
    float x[5] = {1.0f + 0x1p-22f, 1, 2, 3, 4};
    sumo__kernel_divide(SUMO_FLOAT32, x, x, 5, 3);
    assert_int_equal(fbits(x[0]), 0x3eaaaaadu);
    assert_true(x[3] == 1.0f);
}

static void test_add_and_divide(void **state)
{
    (void)state;
    const sumo__isa best = sumo__kernel_isa_best();
    uint64_t s = 3;
    for (int d = 0; d < 4; d++)
        for (size_t z = 0; z < NSIZES; z++) {
            sumo_dtype dt = dtypes[d];
            size_t n = sizes[z], bytes = n * sumo__dtype_bytes(dt);
            ubuf a = ubuf_new(dt, n), b = ubuf_new(dt, n), c = ubuf_new(dt, n);
            fill_random(dt, a.p, n, &s);
            fill_random(dt, b.p, n, &s);
            void *ca = malloc(bytes + 1), *cb = malloc(bytes + 1);
            assert_true(ca && cb);
            memcpy(ca, a.p, bytes);
            memcpy(cb, b.p, bytes);
            void *pair[2] = {ca, cb};
            sumo__kernel_add(dt, c.p, a.p, b.p, n); /* separate */
            for (size_t i = 0; i < n; i++)
                expect_elem(dt, c.p, i, ref_reduce_elem(dt, pair, 2, i, 1), "add", best);
            sumo__kernel_add(dt, b.p, a.p, b.p, n); /* dst == b */
            assert_memory_equal(b.p, c.p, bytes);
            memcpy(b.p, cb, bytes);
            sumo__kernel_add(dt, a.p, a.p, b.p, n); /* dst == a */
            assert_memory_equal(a.p, c.p, bytes);
            /* divide in place and out of place; by 1 it copies */
            memcpy(a.p, ca, bytes);
            sumo__kernel_divide(dt, c.p, a.p, n, 5);
            sumo__kernel_divide(dt, a.p, a.p, n, 5);
            assert_memory_equal(a.p, c.p, bytes);
            for (size_t i = 0; i < n; i++)
                expect_elem(dt, a.p, i, ref_reduce_elem(dt, &ca, 1, i, 5), "divide", best);
            sumo__kernel_divide(dt, c.p, cb, n, 1);
            assert_memory_equal(c.p, cb, bytes);
            sumo__kernel_divide(dt, c.p, c.p, n, 1);
            assert_memory_equal(c.p, cb, bytes);
            free(a.base);
            free(b.base);
            free(c.base);
            free(ca);
            free(cb);
        }
}
int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_isa_report),
        cmocka_unit_test(test_reduce_multi_random),
        cmocka_unit_test(test_reduce_multi_aliasing),
        cmocka_unit_test(test_reduce_multi_specials),
        cmocka_unit_test(test_reduce_multi_divisor_rounding),
        cmocka_unit_test(test_add_and_divide),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
