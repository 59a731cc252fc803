/*
 * sumo_distributed_step in the GRADIENT and DELTA modes (Adasum on gradients, and Horovod's
 * Adasum on the optimizer's update) on the threads transport, against trajectories written
 * here in double, independently of the library:
 *   - GRADIENT + Adasum, momentum SGD: one shared momentum buffer fed the Adasum of the
 *     workers' gradients;
 *   - DELTA + Adasum / average, momentum SGD and Adam: every worker steps its own optimizer
 *     on its own gradient, and the parameters move by the Adasum (or average) of the deltas;
 *   - a NaN in one worker's gradient: SUMO_ERR_NONFINITE on the other ranks (not a timeout),
 *     and every rank's parameters stay exactly as they were before that step.
 * Adasum over P ranks (powers of two here) is the balanced binary tree of pairwise combines over
 * rank order (docs/design/adasum.md), per tensor of the layout. The parameters must also be
 * bit-identical on every rank after every step.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "sumo_distributed.h"
#include "support/harness.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAXR 4
#define STEPS 6
#define NT 2
static const size_t layout[NT] = {5, 3};
#define N 8
#define LR 0.05
#define MU 0.9
#define TOL 2e-5

typedef enum { SGD_MOMENTUM, ADAM } base_kind;

typedef struct scenario {
    int nranks;
    sumo_update_mode mode;
    sumo_aggregation method;
    base_kind base;
    int nan_step;                 /* step at which rank 1 sends a NaN, or -1 */
    float trace[MAXR][STEPS][N];  /* params after each step */
    sumo_result res[MAXR][STEPS];
    sumo_result setup[MAXR];
} scenario;

/* ---- the problem: worker r minimises sum_j a_rj (x_j - c_rj)^2 / 2 ------------------------ */

static double coef(int rank, size_t j, uint64_t salt)
{
    uint64_t st = ((uint64_t)rank + 1) * 0x9e3779b97f4a7c15ull ^ (j << 24) ^ (salt << 48);
    return harness_uniform(&st);
}
static double coef_a(int rank, size_t j) { return 0.6 + 0.4 * coef(rank, j, 1); }
static double coef_c(int rank, size_t j) { return 2.0 * coef(rank, j, 2); }
static double x0(size_t j) { return 0.5 * coef(99, j, 3); }

/* ---- the library ------------------------------------------------------------------------ */

static void run_rank(sumo_comm *comm, int rank, int size, void *arg)
{
    (void)size;
    scenario *sc = arg;
    sumo_optimizer_options oo;
    sumo_optimizer *opt = NULL;
    sumo_aggregator *agg = NULL;
    sumo_distributed *dist = NULL;
    sumo_result r = sumo_optimizer_options_default(sc->base == ADAM ? SUMO_OPTIM_ADAM : SUMO_OPTIM_SGD, &oo);
    if (sc->base == SGD_MOMENTUM) oo.momentum = MU;
    size_t n = N;
    if (r == SUMO_SUCCESS) r = sumo_optimizer_create(&oo, &n, 1, &opt);
    sumo_aggregator_options ao;
    if (r == SUMO_SUCCESS) r = sumo_aggregator_options_default(sc->method, &ao);
    ao.tensor_counts = layout;
    ao.ntensors = NT;
    if (r == SUMO_SUCCESS) r = sumo_aggregator_create(comm, &ao, &agg);
    sumo_distributed_options dopt = {.struct_size = sizeof dopt, .mode = sc->mode};
    if (r == SUMO_SUCCESS) r = sumo_distributed_create(comm, opt, agg, N, &dopt, &dist);
    sc->setup[rank] = r;
    float x[N], g[N];
    for (size_t j = 0; j < N; j++) x[j] = (float)x0(j);
    for (int t = 0; r == SUMO_SUCCESS && t < STEPS; t++) {
        for (size_t j = 0; j < N; j++)
            g[j] = (float)(coef_a(rank, j) * ((double)x[j] - coef_c(rank, j)));
        if (t == sc->nan_step && rank == 1) g[6] = NAN; /* in the second tensor */
        sc->res[rank][t] = sumo_distributed_step(dist, x, g, LR, NULL);
        memcpy(sc->trace[rank][t], x, sizeof x);
        if (sc->res[rank][t] != SUMO_SUCCESS) break;
    }
    sumo_distributed_destroy(dist);
    sumo_aggregator_destroy(agg);
    sumo_optimizer_destroy(opt);
}

/* ---- the reference, in double ----------------------------------------------------------- */

/* (1 - a.b / 2|a|^2) a + (1 - a.b / 2|b|^2) b over [lo, hi), into a. */
static void combine(double *a, const double *b, size_t lo, size_t hi)
{
    double ab = 0, aa = 0, bb = 0;
    for (size_t j = lo; j < hi; j++) {
        ab += a[j] * b[j];
        aa += a[j] * a[j];
        bb += b[j] * b[j];
    }
    double ca = aa > 0 ? 1 - ab / (2 * aa) : 1, cb = bb > 0 ? 1 - ab / (2 * bb) : 1;
    for (size_t j = lo; j < hi; j++) a[j] = ca * a[j] + cb * b[j];
}

/* The balanced tree over ranks [lo, lo + count) of v (P a power of two here), into out. */
static void adasum_tree(double v[][N], int lo, int count, double *out)
{
    if (count == 1) {
        memcpy(out, v[lo], sizeof(double) * N);
        return;
    }
    double right[N];
    adasum_tree(v, lo, count / 2, out);
    adasum_tree(v, lo + count / 2, count / 2, right);
    for (size_t t = 0, off = 0; t < NT; off += layout[t++]) combine(out, right, off, off + layout[t]);
}

static void aggregate(const scenario *sc, double v[][N], double *out)
{
    if (sc->method == SUMO_AGGREGATE_ADASUM) {
        adasum_tree(v, 0, sc->nranks, out);
        return;
    }
    for (size_t j = 0; j < N; j++) {
        double s = 0;
        for (int r = 0; r < sc->nranks; r++) s += v[r][j];
        out[j] = s / sc->nranks;
    }
}

typedef struct base_state {
    double m[N], v[N];
    int t;
} base_state;

/* One local optimizer step on g: returns the change of the parameters. */
static void base_delta(base_kind kind, base_state *s, const double *g, double *delta)
{
    s->t++;
    for (size_t j = 0; j < N; j++) {
        if (kind == SGD_MOMENTUM) {
            s->m[j] = s->t == 1 ? g[j] : MU * s->m[j] + g[j];
            delta[j] = -LR * s->m[j];
        } else {
            const double b1 = 0.9, b2 = 0.999, eps = 1e-8;
            s->m[j] = b1 * s->m[j] + (1 - b1) * g[j];
            s->v[j] = b2 * s->v[j] + (1 - b2) * g[j] * g[j];
            delta[j] = -LR / (1 - pow(b1, s->t)) * s->m[j] /
                       (sqrt(s->v[j]) / sqrt(1 - pow(b2, s->t)) + eps);
        }
    }
}

static void reference(const scenario *sc, double want[STEPS][N])
{
    double x[N], g[MAXR][N], d[MAXR][N], agg[N];
    base_state st[MAXR] = {0};
    for (size_t j = 0; j < N; j++) x[j] = (float)x0(j);
    for (int t = 0; t < STEPS; t++) {
        for (int r = 0; r < sc->nranks; r++)
            for (size_t j = 0; j < N; j++) g[r][j] = coef_a(r, j) * (x[j] - coef_c(r, j));
        if (sc->mode == SUMO_UPDATE_GRADIENT) {
            aggregate(sc, g, agg);
            base_delta(sc->base, &st[0], agg, d[0]);
            for (size_t j = 0; j < N; j++) x[j] += d[0][j];
        } else {
            for (int r = 0; r < sc->nranks; r++) base_delta(sc->base, &st[r], g[r], d[r]);
            aggregate(sc, d, agg);
            for (size_t j = 0; j < N; j++) x[j] += agg[j];
        }
        memcpy(want[t], x, sizeof x);
    }
}

/* ---- the tests -------------------------------------------------------------------------- */

static scenario *run(int nranks, sumo_update_mode mode, sumo_aggregation method, base_kind base,
                     int nan_step)
{
    scenario *sc = calloc(1, sizeof *sc);
    assert_non_null(sc);
    *sc = (scenario){.nranks = nranks, .mode = mode, .method = method, .base = base,
                     .nan_step = nan_step};
    assert_int_equal(harness_run_threads(nranks, run_rank, sc), 0);
    for (int r = 0; r < nranks; r++) assert_int_equal(sc->setup[r], SUMO_SUCCESS);
    return sc;
}

static void check_against_reference(sumo_update_mode mode, sumo_aggregation method, base_kind base)
{
    for (int P = 2; P <= MAXR; P *= 2) {
        scenario *sc = run(P, mode, method, base, -1);
        double want[STEPS][N];
        reference(sc, want);
        double moved = 0;
        for (int t = 0; t < STEPS; t++) {
            for (int r = 0; r < P; r++) {
                assert_int_equal(sc->res[r][t], SUMO_SUCCESS);
                assert_memory_equal(sc->trace[r][t], sc->trace[0][t], sizeof sc->trace[0][t]);
            }
            for (size_t j = 0; j < N; j++) {
                double err = fabs(sc->trace[0][t][j] - want[t][j]);
                if (err > TOL)
                    fail_msg("mode %d method %d base %d P %d step %d param %zu: %.8f, want %.8f",
                             mode, method, base, P, t, j, sc->trace[0][t][j], want[t][j]);
            }
        }
        for (size_t j = 0; j < N; j++) moved += fabs(want[STEPS - 1][j] - (float)x0(j));
        assert_true(moved > 0.05); /* the trajectory went somewhere, so the check has teeth */
        free(sc);
    }
}

static void test_gradient_adasum_momentum(void **state)
{
    (void)state;
    check_against_reference(SUMO_UPDATE_GRADIENT, SUMO_AGGREGATE_ADASUM, SGD_MOMENTUM);
}

static void test_delta_adasum_momentum(void **state)
{
    (void)state;
    check_against_reference(SUMO_UPDATE_DELTA, SUMO_AGGREGATE_ADASUM, SGD_MOMENTUM);
}

static void test_delta_adasum_adam(void **state)
{
    (void)state;
    check_against_reference(SUMO_UPDATE_DELTA, SUMO_AGGREGATE_ADASUM, ADAM);
}

static void test_delta_average_momentum(void **state)
{
    (void)state;
    check_against_reference(SUMO_UPDATE_DELTA, SUMO_AGGREGATE_AVERAGE, SGD_MOMENTUM);
}

/* Adasum in delta mode is not the average of the deltas, nor the plain Adasum of gradients:
 * guards against a reference that happens to agree with a wrong mode. */
static void test_modes_differ(void **state)
{
    (void)state;
    scenario *a = run(2, SUMO_UPDATE_DELTA, SUMO_AGGREGATE_ADASUM, SGD_MOMENTUM, -1);
    scenario *b = run(2, SUMO_UPDATE_DELTA, SUMO_AGGREGATE_AVERAGE, SGD_MOMENTUM, -1);
    scenario *c = run(2, SUMO_UPDATE_GRADIENT, SUMO_AGGREGATE_ADASUM, SGD_MOMENTUM, -1);
    double dab = 0, dac = 0;
    for (size_t j = 0; j < N; j++) {
        dab += fabs(a->trace[0][STEPS - 1][j] - b->trace[0][STEPS - 1][j]);
        dac += fabs(a->trace[0][STEPS - 1][j] - c->trace[0][STEPS - 1][j]);
    }
    assert_true(dab > 100 * TOL);
    assert_true(dac > 100 * TOL);
    free(a);
    free(b);
    free(c);
}

/* A NaN from one worker: every rank is told at once, and nobody's parameters take a
 * non-finite value; they stay bit-identical to those after the previous step. */
static void test_nonfinite_keeps_params(void **state)
{
    (void)state;
    /* A sum or an average passes a NaN through without a status of its own: delta mode must
     * still catch it. */
    const sumo_update_mode modes[] = {SUMO_UPDATE_GRADIENT, SUMO_UPDATE_DELTA, SUMO_UPDATE_DELTA};
    const sumo_aggregation methods[] = {SUMO_AGGREGATE_ADASUM, SUMO_AGGREGATE_ADASUM,
                                        SUMO_AGGREGATE_AVERAGE};
    for (int m = 0; m < 3; m++) {
        for (int P = 2; P <= MAXR; P *= 2) {
            const int bad = 3;
            scenario *sc = run(P, modes[m], methods[m], SGD_MOMENTUM, bad);
            for (int r = 0; r < P; r++) {
                for (int t = 0; t < bad; t++) assert_int_equal(sc->res[r][t], SUMO_SUCCESS);
                /* In delta mode the NaN never reaches the wire: rank 1's optimizer refuses it
                 * and the rank sends a NaN delta so the others hear of it. */
                sumo_result want = modes[m] == SUMO_UPDATE_DELTA && r == 1
                                       ? SUMO_ERR_INVALID_ARGUMENT : SUMO_ERR_NONFINITE;
                if (sc->res[r][bad] != want)
                    fail_msg("mode %d method %d P %d rank %d: %s", modes[m], methods[m], P, r,
                             sumo_result_name(sc->res[r][bad]));
                assert_memory_equal(sc->trace[r][bad], sc->trace[r][bad - 1], sizeof sc->trace[r][bad]);
            }
            free(sc);
        }
    }
}

/* One rank's bad call (a count that does not match the layout, the wrong dtype for ACGA):
 * its peers, already inside the exchange, are told at once and fail with it instead of
 * waiting out the deadline (a timeout status would show they were not told); nothing is
 * broken, and the next call succeeds everywhere. */
typedef struct bad_call_run {
    sumo_aggregation method;
    int wrong_dtype;
    sumo_result first[MAXR], second[MAXR];
    float out[MAXR][N];
} bad_call_run;

static void bad_call_rank(sumo_comm *comm, int rank, int size, void *arg)
{
    (void)size;
    bad_call_run *b = arg;
    sumo_aggregator_options ao;
    sumo_aggregator *agg = NULL;
    b->first[rank] = b->second[rank] = SUMO_ERR_INTERNAL;
    if (sumo_comm_set_timeout(comm, 20.0) != SUMO_SUCCESS) return;
    if (sumo_aggregator_options_default(b->method, &ao) != SUMO_SUCCESS) return;
    ao.tensor_counts = layout;
    ao.ntensors = NT;
    if (sumo_aggregator_create(comm, &ao, &agg) != SUMO_SUCCESS) return;
    float g[N];
    for (size_t j = 0; j < N; j++) g[j] = (float)(rank + 1) * (j % 2 ? 1.0f : 2.0f);
    if (rank == 1)
        b->first[rank] = b->wrong_dtype ? sumo_aggregator_apply(agg, g, N, SUMO_FLOAT64)
                                        : sumo_aggregator_apply(agg, g, N - 1, SUMO_FLOAT32);
    else
        b->first[rank] = sumo_aggregator_apply(agg, g, N, SUMO_FLOAT32);
    for (size_t j = 0; j < N; j++) g[j] = (float)(rank + 1) * (j % 2 ? 1.0f : 2.0f);
    b->second[rank] = sumo_aggregator_apply(agg, g, N, SUMO_FLOAT32);
    memcpy(b->out[rank], g, sizeof g);
    sumo_aggregator_destroy(agg);
}

static void test_one_rank_bad_call(void **state)
{
    (void)state;
    const struct { sumo_aggregation method; int wrong_dtype; } cases[] = {
        {SUMO_AGGREGATE_SUM, 0}, {SUMO_AGGREGATE_ADASUM, 0}, {SUMO_AGGREGATE_ACGA, 0},
        {SUMO_AGGREGATE_ACGA, 1},
    };
    const int P = 3;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        bad_call_run b = {.method = cases[c].method, .wrong_dtype = cases[c].wrong_dtype};
        assert_int_equal(harness_run_threads(P, bad_call_rank, &b), 0);
        for (int r = 0; r < P; r++) {
            if (b.first[r] != SUMO_ERR_INVALID_ARGUMENT || b.second[r] != SUMO_SUCCESS)
                fail_msg("method %d wrong dtype %d rank %d: %s, then %s", cases[c].method,
                         cases[c].wrong_dtype, r, sumo_result_name(b.first[r]),
                         sumo_result_name(b.second[r]));
            assert_memory_equal(b.out[r], b.out[0], sizeof b.out[0]);
        }
        /* The sum of (r + 1) * {2, 1, 2, ...} over 3 ranks: the retry really combined. */
        if (cases[c].method == SUMO_AGGREGATE_SUM) {
            assert_true(b.out[0][0] == 12.0f);
            assert_true(b.out[0][1] == 6.0f);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gradient_adasum_momentum),
        cmocka_unit_test(test_delta_adasum_momentum),
        cmocka_unit_test(test_delta_adasum_adam),
        cmocka_unit_test(test_delta_average_momentum),
        cmocka_unit_test(test_modes_differ),
        cmocka_unit_test(test_nonfinite_keeps_params),
        cmocka_unit_test(test_one_rank_bad_call),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
