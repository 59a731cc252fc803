/*
 * SlowMo's tests' problem and runner (test_slowmo.c, test_slowmo_api.c): every worker's
 * quadratic, SlowMo's options in the outer loop's terms, and a scenario run through the
 * distributed optimizer on the threads transport, recorded step by step.
 */
#ifndef SUMO_TEST_SLOWMO_RUN_H
#define SUMO_TEST_SLOWMO_RUN_H

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

#define MAXR 8
#define MAXT 40
#define MAXN 40

/* ---- the problem ------------------------------------------------------------------------ */

static inline double hash_uniform(uint64_t a, uint64_t b, uint64_t salt)
{
    uint64_t st = a * 0x100000001b3ull ^ (b << 20) ^ (salt << 50) ^ 0x5eedull;
    return harness_uniform(&st);
}

/* Curvature in [0.2, 0.6]; with same_hessian every worker shares it (then averaged local SGD
 * on these linear gradients is exactly full-batch SGD, which oracle (b) relies on). */
static inline double coef_a(int same_hessian, int rank, size_t j)
{
    return 0.4 + 0.2 * hash_uniform(same_hessian ? 99 : (uint64_t)rank, j, 1);
}
static inline double coef_c(int rank, size_t j) { return 2.0 * hash_uniform((uint64_t)rank, j, 2); }
static inline float x_init(size_t j) { return (float)hash_uniform(7, j, 3); }

/* ---- running the library ---------------------------------------------------------------- */

/* SlowMo's options in the outer loop's terms: tau local steps, inner averaging, alpha, beta. */
static inline sumo_diloco_options slowmo_options(int tau, int inner, double alpha, double beta)
{
    sumo_diloco_options o;
    sumo_diloco_options_default(SUMO_DILOCO_PRESET_SLOWMO, &o);
    o.sync_every = tau;
    o.inner_period = inner;
    o.lr = alpha;
    o.momentum = beta;
    return o;
}

typedef struct scenario {
    int nranks;
    size_t n;
    int steps;
    sumo_diloco_options slow;
    sumo_buffer_policy buffers;
    double momentum;         /* base SGD's */
    double lr[MAXT];         /* per step */
    int same_hessian;
    /* recorded by the ranks */
    float trace[MAXR][MAXT][MAXN]; /* params after each step */
    int communicated[MAXR][MAXT];
    int synchronized[MAXR][MAXT];
    sumo_result err[MAXR];   /* first failure */
    int failed_step[MAXR];
    size_t extra[MAXR];
    sumo_comm_stats stats[MAXR];
} scenario;

static inline scenario *new_scenario(int nranks, size_t n, int steps, int tau, int inner, double alpha,
                              double beta)
{
    scenario *sc = calloc(1, sizeof *sc);
    assert_non_null(sc);
    assert_true(nranks <= MAXR && n <= MAXN && steps <= MAXT);
    sc->nranks = nranks;
    sc->n = n;
    sc->steps = steps;
    sc->slow = slowmo_options(tau, inner, alpha, beta);
    for (int t = 0; t < MAXT; t++) sc->lr[t] = 1.0;
    return sc;
}

static inline sumo_optimizer *make_sgd(size_t n, double momentum)
{
    sumo_optimizer_options o;
    if (sumo_optimizer_options_default(SUMO_OPTIM_SGD, &o) != SUMO_SUCCESS) return NULL;
    o.momentum = momentum;
    sumo_optimizer *opt = NULL;
    if (sumo_optimizer_create(&o, &n, 1, &opt) != SUMO_SUCCESS) return NULL;
    return opt;
}

static inline void worker_grad(int same_hessian, int rank, const float *x, float *g, size_t n)
{
    for (size_t j = 0; j < n; j++)
        g[j] = (float)(coef_a(same_hessian, rank, j) * ((double)x[j] - coef_c(rank, j)));
}

static inline void run_rank(sumo_comm *comm, int rank, int size, void *arg)
{
    (void)size;
    scenario *sc = arg;
    sc->failed_step[rank] = -1;
    sumo_optimizer *opt = make_sgd(sc->n, sc->momentum);
    sumo_distributed *dist = NULL;
    sumo_distributed_options o = {.struct_size = sizeof o, .mode = SUMO_UPDATE_OUTER,
                                  .outer = sc->slow, .buffers = sc->buffers};
    sumo_result r = opt ? sumo_distributed_create(comm, opt, NULL, sc->n, &o, &dist)
                        : SUMO_ERR_SYSTEM;
    float x[MAXN], g[MAXN];
    for (size_t j = 0; j < sc->n; j++) x[j] = x_init(j);
    for (int t = 0; r == SUMO_SUCCESS && t < sc->steps; t++) {
        worker_grad(sc->same_hessian, rank, x, g, sc->n);
        r = sumo_distributed_step(dist, x, g, sc->lr[t], &sc->communicated[rank][t]);
        if (r != SUMO_SUCCESS) {
            sc->failed_step[rank] = t;
            break;
        }
        int s = -1;
        sumo_distributed_synchronized(dist, &s);
        sc->synchronized[rank][t] = s;
        memcpy(sc->trace[rank][t], x, sc->n * sizeof *x);
    }
    if (r == SUMO_SUCCESS) r = sumo_distributed_extra_memory(dist, &sc->extra[rank]);
    if (r == SUMO_SUCCESS) r = sumo_distributed_stats(dist, &sc->stats[rank]);
    sc->err[rank] = r;
    sumo_distributed_destroy(dist);
    sumo_optimizer_destroy(opt);
}

static inline void run(scenario *sc)
{
    assert_int_equal(harness_run_threads(sc->nranks, run_rank, sc), 0);
    for (int r = 0; r < sc->nranks; r++) {
        if (sc->err[r] != SUMO_SUCCESS)
            fail_msg("rank %d: %s at step %d", r, sumo_result_name(sc->err[r]),
                     sc->failed_step[r]);
    }
}

/* |got - want| <= tol * max(1, |want|). */
static inline void check_close(float got, double want, double tol, const char *what, int rank, int t,
                        size_t j)
{
    double scale = fabs(want) > 1.0 ? fabs(want) : 1.0;
    if (!(fabs((double)got - want) <= tol * scale))
        fail_msg("%s: rank %d step %d element %zu: %.9g, want %.9g (diff %.3g)", what, rank, t,
                 j, (double)got, want, (double)got - want);
}

/* fp32 against a double oracle after a few dozen steps on O(1) values. */
#define TOL 2e-6


#endif
