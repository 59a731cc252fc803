/*
 * SUMO_KERNEL_ISA: which instruction sets this CPU runs (against the flags /proc/cpuinfo
 * lists), each of them forced in turn giving the bits of its documented summation order
 * (Adasum's dot_norms in fp64, summed here in plain C in that order), and a set the CPU lacks
 * refused by name where the environment is checked: sumo_env_check, sumo_kernel_isa and a
 * communicator's constructor, with the kernels still running a set the CPU has.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/settings.h"
#include "kernels/kernels.h"
#include "kernels/kernels_isa.h"

static const char *const lower[] = {"portable", "avx2", "avx512"};

/* The widest set the CPU's flags allow, read from /proc/cpuinfo (-1 where there is none to
 * read): AVX2 needs avx2, fma and f16c; AVX-512 also avx512f. */
static int level_from_cpuinfo(void)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f == NULL) return -1;
    char line[8192];
    int level = -1;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "flags", 5) != 0) continue;
        bool avx2 = false, fma3 = false, f16c = false, avx512f = false;
        for (char *w = strtok(strchr(line, ':') + 1, " \n"); w; w = strtok(NULL, " \n")) {
            avx2 |= strcmp(w, "avx2") == 0;
            fma3 |= strcmp(w, "fma") == 0;
            f16c |= strcmp(w, "f16c") == 0;
            avx512f |= strcmp(w, "avx512f") == 0;
        }
        level = avx2 && fma3 && f16c ? (avx512f ? 2 : 1) : 0;
        break;
    }
    fclose(f);
    return level;
}

/*
 * a.b in the order kernels_isa.h's paths document. Portable: four chains, element i (of the
 * first n - n % 4) into chain i % 4 by a multiply and an add, the rest into chain 0, then
 * (c0 + c1) + (c2 + c3). A vector path of w doubles: four vector accumulators take blocks of
 * 4w elements (block k into accumulator k) by fused multiply-adds, then whole vectors into
 * accumulator 0; the accumulators add as (a0 + a1) + (a2 + a3) lane by lane, the lanes by
 * halving (lane j plus lane j + w/2, ...), and the last n % w elements by fused
 * multiply-adds onto that.
 */
static double dot_in_order(int isa, const double *a, const double *b, size_t n)
{
    if (isa == 0) {
        double c[4] = {0, 0, 0, 0};
        size_t i = 0;
        for (; i + 4 <= n; i += 4)
            for (int l = 0; l < 4; l++) {
                double p = a[i + l] * b[i + l];
                c[l] = c[l] + p;
            }
        for (; i < n; i++) {
            double p = a[i] * b[i];
            c[0] = c[0] + p;
        }
        return (c[0] + c[1]) + (c[2] + c[3]);
    }
    const size_t w = isa == 1 ? 4 : 8;
    double acc[4][8] = {{0}};
    size_t i = 0;
    for (; i + 4 * w <= n; i += 4 * w)
        for (size_t k = 0; k < 4; k++)
            for (size_t l = 0; l < w; l++)
                acc[k][l] = fma(a[i + k * w + l], b[i + k * w + l], acc[k][l]);
    for (; i + w <= n; i += w)
        for (size_t l = 0; l < w; l++) acc[0][l] = fma(a[i + l], b[i + l], acc[0][l]);
    double v[8];
    for (size_t l = 0; l < w; l++) v[l] = (acc[0][l] + acc[1][l]) + (acc[2][l] + acc[3][l]);
    for (size_t h = w / 2; h >= 1; h /= 2)
        for (size_t l = 0; l < h; l++) v[l] = v[l] + v[l + h];
    double dot = v[0];
    for (; i < n; i++) dot = fma(a[i], b[i], dot);
    return dot;
}

enum { N = 1003 }; /* blocks of 4w, whole vectors after them, and a scalar tail, on each path */

static void fill(double *a, double *b)
{
    uint64_t s = 12345;
    for (size_t i = 0; i < N; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        a[i] = (double)(int64_t)(s >> 11) / 9007199254740992.0 - 0.25;
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        b[i] = (double)(int64_t)(s >> 11) / 3e15 * ((s >> 7) & 1 ? 1 : -1);
    }
}

static void expect_order(int isa, const double *a, const double *b, const char *why)
{
    double out[3];
    sumo__kernel_dot_norms(SUMO_FLOAT64, a, b, N, out);
    const double want[3] = {dot_in_order(isa, a, b, N), dot_in_order(isa, a, a, N),
                            dot_in_order(isa, b, b, N)};
    for (int q = 0; q < 3; q++)
        if (memcmp(&out[q], &want[q], sizeof(double)) != 0)
            fail_msg("%s: dot_norms[%d] = %a, the %s order gives %a", why, q, out[q], lower[isa],
                     want[q]);
}

static void test_cpu_sets_as_cpuinfo_lists(void **state)
{
    (void)state;
    int want = level_from_cpuinfo();
    if (want < 0) skip();
    assert_int_equal(sumo__cpu_isa_level(), want);
    assert_int_equal((int)sumo__kernel_isa_best(), want);
}

static void test_each_set_forced_gives_its_order(void **state)
{
    (void)state;
    static double a[N], b[N];
    fill(a, b);
    const int best = sumo__cpu_isa_level();
    /* The data must tell the orders apart, or forcing would prove nothing. */
    for (int i = 0; i < SUMO__ISA_COUNT; i++)
        for (int j = i + 1; j < SUMO__ISA_COUNT; j++)
            assert_true(dot_in_order(i, a, b, N) != dot_in_order(j, a, b, N));
    unsetenv("SUMO_KERNEL_ISA");
    expect_order(best, a, b, "unset");
    const char *name = NULL;
    assert_int_equal(sumo_kernel_isa(&name), SUMO_SUCCESS);
    assert_string_equal(name, lower[best]);
    for (int isa = 0; isa <= best; isa++) {
        for (int upper = 0; upper < 2; upper++) {
            char text[16];
            snprintf(text, sizeof text, "%s", lower[isa]);
            for (char *c = text; upper && *c; c++)
                if (*c >= 'a' && *c <= 'z') *c = (char)(*c - 'a' + 'A');
            setenv("SUMO_KERNEL_ISA", text, 1);
            char msg[256] = "x";
            assert_int_equal(sumo_env_check(msg, sizeof msg), SUMO_SUCCESS);
            name = NULL;
            assert_int_equal(sumo_kernel_isa(&name), SUMO_SUCCESS);
            assert_string_equal(name, lower[isa]);
            expect_order(isa, a, b, text);
        }
    }
    unsetenv("SUMO_KERNEL_ISA");
}

static void test_a_set_the_cpu_lacks_is_refused(void **state)
{
    (void)state;
    static double a[N], b[N];
    fill(a, b);
    const int best = sumo__cpu_isa_level();
    if (best == SUMO__ISA_COUNT - 1) {
        print_message("this CPU runs every set (%s): none to refuse\n", lower[best]);
        skip();
    }
    for (int isa = best + 1; isa < SUMO__ISA_COUNT; isa++) {
        setenv("SUMO_KERNEL_ISA", lower[isa], 1);
        char msg[256] = "", says[128];
        assert_int_equal(sumo_env_check(msg, sizeof msg), SUMO_ERR_INVALID_ARGUMENT);
        snprintf(says, sizeof says, "SUMO_KERNEL_ISA='%s' is an instruction set this CPU lacks",
                 lower[isa]);
        if (strstr(msg, says) == NULL) fail_msg("refused as: %s", msg);
        const char *name = NULL;
        assert_int_equal(sumo_kernel_isa(&name), SUMO_ERR_INVALID_ARGUMENT);
        assert_string_equal(name, lower[best]);
        sumo_comm *comms[2] = {NULL, NULL};
        assert_int_equal(sumo_comm_create_threads(2, comms), SUMO_ERR_INVALID_ARGUMENT);
        assert_null(comms[0]);
        /* The kernels never run what the CPU lacks: they keep to its widest set. */
        expect_order(best, a, b, lower[isa]);
    }
    unsetenv("SUMO_KERNEL_ISA");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_sets_as_cpuinfo_lists),
        cmocka_unit_test(test_each_set_forced_gives_its_order),
        cmocka_unit_test(test_a_set_the_cpu_lacks_is_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
