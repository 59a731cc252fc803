/*
 * Adasum over inputs whose norms lie far apart, at every dtype, against the float64 tree of
 * support/reference.c (independent of the library).
 *
 * The case (issue 14, "a defect found by an outside check"): two parallel inputs with norms
 * 2.2e19 and 5.8e-38, one tensor. For parallel inputs c1 u and c2 u the pair's coefficient of
 * the short one is 1 - c1/(2 c2), about -1.9e56: past FLT_MAX, although every input and the
 * result (the mean, (c1 + c2)/2 u) are finite in bf16. A scaled add that narrows its
 * coefficients to float turns that into -Inf and returns Inf with SUMO_SUCCESS (P = 2, 3), or
 * feeds Inf to the next level's norms and reports SUMO_ERR_NONFINITE (P >= 4).
 *
 * Ranks alternate between the two lengths, the long one first or the short one first (so the
 * huge coefficient is once the left operand's, once the right's). fp16 cannot hold either
 * length; there the case is scaled to fp16's own extremes (its coefficients then fit in a
 * float, so it is a regression check of the same shape, not a reproduction).
 *
 * A second test runs the scaled add itself on every instruction-set path this CPU has, with
 * coefficients beyond float's range, against a plain double evaluation rounded once.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "kernels/kernels.h"
#include "kernels/kernels_isa.h"
#include "support/harness.h"
#include "support/reference.h"

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAXP 8
#define COUNT 69 /* > 4 AVX-512 vectors of floats, and a scalar tail on every path */

static const sumo_dtype dtypes[] = {SUMO_FLOAT32, SUMO_FLOAT64, SUMO_FLOAT16, SUMO_BFLOAT16};

typedef struct job {
    int size;
    sumo_dtype dtype;
    bool p2p;
    unsigned char *in[MAXP], *out[MAXP];
    sumo_result res[MAXP];
    char msg[MAXP][256];
} job;

static void body(sumo_comm *comm, int rank, int size, void *arg)
{
    (void)size;
    job *j = arg;
    sumo_comm_set_timeout(comm, 30);
    if (j->p2p) sumo_comm_set_param(comm, SUMO_PARAM_ALGORITHM, SUMO_ALGORITHM_RING);
    j->res[rank] = sumo_allreduce(j->in[rank], j->out[rank], COUNT, j->dtype, SUMO_OP_ADASUM, comm);
    const char *m;
    sumo_comm_error_message(comm, &m);
    snprintf(j->msg[rank], sizeof j->msg[rank], "%s", m);
}

/* One configuration; returns the number of failed checks (printed). */
static int run_case(int size, sumo_dtype dt, bool long_first, bool p2p)
{
    const double big = dt == SUMO_FLOAT16 ? 3.0e4 : 2.2e19;
    const double small = dt == SUMO_FLOAT16 ? 2.0e-3 : 5.8e-38;
    double u[COUNT], nn = 0;
    for (size_t i = 0; i < COUNT; i++) {
        u[i] = harness_uniform_at(14, 0, i);
        nn += u[i] * u[i];
    }
    for (size_t i = 0; i < COUNT; i++) u[i] /= sqrt(nn);
    job j = {.size = size, .dtype = dt, .p2p = p2p};
    size_t bytes = COUNT * harness_dtype_size(dt);
    double *ref[MAXP];
    for (int r = 0; r < size; r++) {
        j.in[r] = malloc(bytes);
        j.out[r] = malloc(bytes);
        ref[r] = malloc(COUNT * sizeof(double));
        double c = (r % 2 == 0) == long_first ? big : small;
        for (size_t i = 0; i < COUNT; i++) harness_set(dt, j.in[r], i, c * u[i]);
        for (size_t i = 0; i < COUNT; i++) ref[r][i] = harness_get(dt, j.in[r], i);
    }
    int bad = 0;
    char what[96];
    snprintf(what, sizeof what, "P=%d dtype %d %s first%s", size, dt, long_first ? "long" : "short",
             p2p ? " p2p" : "");
    if (harness_run_threads(size, body, &j) != 0) {
        fprintf(stderr, "%s: could not run the ranks\n", what);
        bad++;
        goto out;
    }
    size_t off[2] = {0, COUNT};
    ref_adasum_tree(ref, size, off, 1);
    for (int r = 0; r < size; r++) {
        if (j.res[r] != SUMO_SUCCESS) {
            fprintf(stderr, "%s: rank %d returned %s (%s)\n", what, r, sumo_result_name(j.res[r]),
                    j.msg[r]);
            bad++;
        }
        if (memcmp(j.out[r], j.out[0], bytes) != 0) {
            fprintf(stderr, "%s: rank %d's bits differ from rank 0's\n", what, r);
            bad++;
        }
    }
    double dd = 0, ww = 0;
    int nonfinite = 0;
    for (size_t i = 0; i < COUNT; i++) {
        double got = harness_get(dt, j.out[0], i), want = ref[0][i];
        nonfinite += !isfinite(got);
        dd += (got - want) * (got - want);
        ww += want * want;
    }
    double rel = sqrt(dd / ww);
    if (nonfinite || !(rel < 100 * harness_eps(dt))) {
        fprintf(stderr,
                "%s: %d non-finite elements, relative L2 error %.3g (limit %.3g); element 0 "
                "%.4g, float64 tree %.4g\n",
                what, nonfinite, rel, 100 * harness_eps(dt), harness_get(dt, j.out[0], 0), ref[0][0]);
        bad++;
    }
out:
    for (int r = 0; r < size; r++) {
        free(j.in[r]);
        free(j.out[r]);
        free(ref[r]);
    }
    return bad;
}

static void test_spread_norms(void **state)
{
    (void)state;
    int bad = 0;
    for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++)
        for (int p = 2; p <= MAXP; p++)
            for (int lf = 0; lf < 2; lf++)
                for (int p2p = 0; p2p < 2; p2p++) bad += run_case(p, dtypes[d], lf, p2p);
    assert_int_equal(bad, 0);
}

/* ---- the scaled add with coefficients beyond float's range, on every path -------------------- */

static double get(sumo_dtype dt, const void *p, size_t i) { return harness_get(dt, p, i); }

static void test_scaled_add_wide_coefficients(void **state)
{
    (void)state;
    /* (ca, cb, scale of a, scale of b): a huge coefficient on a tiny operand, either side; the
     * products and the result stay finite in every dtype the scales fit. */
    const struct {
        double ca, cb, sa, sb;
    } cases[] = {
        {1.0, -1.9e56, 1e19, 3e-39},
        {-1.9e56, 1.0, 3e-39, 1e19},
        {4e38, 0.5, 1e-30, 1.0},
        {1e300, 1e-300, 1e-290, 1e290}, /* fp64 only: the products overflow nothing there */
    };
    const sumo__isa isas[] = {SUMO__ISA_PORTABLE, SUMO__ISA_AVX2, SUMO__ISA_AVX512};
    const size_t n = 37;
    int bad = 0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++) {
            sumo_dtype dt = dtypes[d];
            if (dt == SUMO_FLOAT16) continue; /* its range cannot hold these operands */
            if (c == 3 && dt != SUMO_FLOAT64) continue;
            size_t esz = harness_dtype_size(dt);
            unsigned char *a0 = malloc(n * esz), *b = malloc(n * esz), *a = malloc(n * esz);
            for (size_t i = 0; i < n; i++) {
                harness_set(dt, a0, i, cases[c].sa * harness_uniform_at(7, 1, i));
                harness_set(dt, b, i, cases[c].sb * harness_uniform_at(7, 2, i));
            }
            for (size_t p = 0; p < sizeof isas / sizeof isas[0]; p++) {
                if ((unsigned)isas[p] > (unsigned)sumo__kernel_isa_best()) continue;
                memcpy(a, a0, n * esz);
                sumo__kernel_scaled_add_isa(isas[p], dt, a, cases[c].ca, b, cases[c].cb, n);
                for (size_t i = 0; i < n; i++) {
                    double x = get(dt, a0, i), y = get(dt, b, i);
                    double exact = cases[c].ca * x + cases[c].cb * y;
                    double got = get(dt, a, i);
                    /* The product is exact in double here, so one rounding of the sum remains;
                     * the fp16/bf16 path may also round through fp32 (a relative 2^-24). */
                    double want = ref_round_to(dt, exact);
                    double tol = 2 * harness_eps(dt) * fabs(exact);
                    if (!isfinite(got) || fabs(got - want) > tol) {
                        if (bad < 10)
                            fprintf(stderr,
                                    "scaled_add %s dtype %d case %zu element %zu: %.6g, want "
                                    "%.6g\n",
                                    sumo__kernel_isa_name(isas[p]), dt, c, i, got, want);
                        bad++;
                    }
                }
            }
            free(a0);
            free(b);
            free(a);
        }
    }
    assert_int_equal(bad, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spread_norms),
        cmocka_unit_test(test_scaled_add_wide_coefficients),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
