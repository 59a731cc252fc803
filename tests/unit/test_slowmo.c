/*
 * SlowMo (sumo_distributed_step in SUMO_UPDATE_OUTER mode, the outer loop with SlowMo's preset)
 * on the threads transport, with the real SGD of sumo_optim.h as the base optimizer.
 *
 * Every worker minimises its own separable quadratic f_i(x) = sum_j a_ij (x_j - c_ij)^2 / 2,
 * whose gradient a_ij (x_j - c_ij) the test computes itself; the full-batch gradient is the
 * average of the workers'. The oracles are written here in double, independently of the
 * library, from docs/design/slowmo.md:
 *   (a) tau = 1, base SGD(lr 1): full-batch SGD(lr alpha, momentum beta), at every step;
 *   (b) tau = 2, beta = 0.5: the fairscale-style manual reference (full-batch SGD(lr 1), and
 *       every 2 steps gradient := old - p, p := old, a momentum-SGD step, old := p);
 *   (c) beta = 0, alpha = 1, inner averaging every 2 steps: per-worker SGD plus a manual
 *       average every 2 steps (Local SGD);
 *   (e) the buffer policies with momentum SGD: Algorithm 1 written out per worker.
 * And properties: (d) the memory-efficient mode is bit-identical to the plain one; (f) bad
 * options and lr 0 at an outer step are refused before anything changes; (g) a checkpoint
 * taken mid outer iteration resumes bit-identically; (h) the extra memory figures.
 *
 * Rank threads only record; the assertions run in the main thread (cmocka must not longjmp
 * out of another thread).
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

#define MAXR 8
#define MAXT 40
#define MAXN 40

/* ---- the problem ------------------------------------------------------------------------ */

static double hash_uniform(uint64_t a, uint64_t b, uint64_t salt)
{
    uint64_t st = a * 0x100000001b3ull ^ (b << 20) ^ (salt << 50) ^ 0x5eedull;
    return harness_uniform(&st);
}

/* Curvature in [0.2, 0.6]; with same_hessian every worker shares it (then averaged local SGD
 * on these linear gradients is exactly full-batch SGD, which oracle (b) relies on). */
static double coef_a(int same_hessian, int rank, size_t j)
{
    return 0.4 + 0.2 * hash_uniform(same_hessian ? 99 : (uint64_t)rank, j, 1);
}
static double coef_c(int rank, size_t j) { return 2.0 * hash_uniform((uint64_t)rank, j, 2); }
static float x_init(size_t j) { return (float)hash_uniform(7, j, 3); }

/* ---- running the library ---------------------------------------------------------------- */

/* SlowMo's options in the outer loop's terms: tau local steps, inner averaging, alpha, beta. */
static sumo_diloco_options slowmo_options(int tau, int inner, double alpha, double beta)
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

static scenario *new_scenario(int nranks, size_t n, int steps, int tau, int inner, double alpha,
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

static sumo_optimizer *make_sgd(size_t n, double momentum)
{
    sumo_optimizer_options o;
    if (sumo_optimizer_options_default(SUMO_OPTIM_SGD, &o) != SUMO_SUCCESS) return NULL;
    o.momentum = momentum;
    sumo_optimizer *opt = NULL;
    if (sumo_optimizer_create(&o, &n, 1, &opt) != SUMO_SUCCESS) return NULL;
    return opt;
}

static void worker_grad(int same_hessian, int rank, const float *x, float *g, size_t n)
{
    for (size_t j = 0; j < n; j++)
        g[j] = (float)(coef_a(same_hessian, rank, j) * ((double)x[j] - coef_c(rank, j)));
}

static void run_rank(sumo_comm *comm, int rank, int size, void *arg)
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

static void run(scenario *sc)
{
    assert_int_equal(harness_run_threads(sc->nranks, run_rank, sc), 0);
    for (int r = 0; r < sc->nranks; r++) {
        if (sc->err[r] != SUMO_SUCCESS)
            fail_msg("rank %d: %s at step %d", r, sumo_result_name(sc->err[r]),
                     sc->failed_step[r]);
    }
}

/* |got - want| <= tol * max(1, |want|). */
static void check_close(float got, double want, double tol, const char *what, int rank, int t,
                        size_t j)
{
    double scale = fabs(want) > 1.0 ? fabs(want) : 1.0;
    if (!(fabs((double)got - want) <= tol * scale))
        fail_msg("%s: rank %d step %d element %zu: %.9g, want %.9g (diff %.3g)", what, rank, t,
                 j, (double)got, want, (double)got - want);
}

/* fp32 against a double oracle after a few dozen steps on O(1) values. */
#define TOL 2e-6

/* ---- (a) tau = 1: large-batch SGD with heavy-ball momentum ------------------------------- */

static void test_tau1_is_momentum_sgd(void **state)
{
    (void)state;
    const double alpha = 0.7, beta = 0.5;
    for (int N = 1; N <= 4; N++) {
        scenario *sc = new_scenario(N, 11, 30, 1, 0, alpha, beta);
        run(sc);
        /* One model on the full batch: SGD(lr alpha, momentum beta), PyTorch's form. */
        double x[MAXN], buf[MAXN];
        for (size_t j = 0; j < sc->n; j++) x[j] = x_init(j);
        for (int t = 0; t < sc->steps; t++) {
            for (size_t j = 0; j < sc->n; j++) {
                double g = 0;
                for (int r = 0; r < N; r++) g += coef_a(0, r, j) * (x[j] - coef_c(r, j));
                g /= N;
                buf[j] = t == 0 ? g : beta * buf[j] + g;
                x[j] -= alpha * buf[j];
            }
            for (int r = 0; r < N; r++) {
                assert_int_equal(sc->communicated[r][t], 1);
                assert_int_equal(sc->synchronized[r][t], 1);
                for (size_t j = 0; j < sc->n; j++)
                    check_close(sc->trace[r][t][j], x[j], TOL, "tau1", r, t, j);
            }
        }
        free(sc);
    }
}

/* ---- (b) tau = 2, beta = 0.5: the manual reference -------------------------------------- */

static void check_manual_tau2(double gamma, double alpha)
{
    const double beta = 0.5;
    const int N = 3;
    scenario *sc = new_scenario(N, 9, 24, 2, 0, alpha, beta);
    sc->same_hessian = 1;
    for (int t = 0; t < sc->steps; t++) sc->lr[t] = gamma;
    run(sc);
    /* Full-batch SGD(lr gamma); every 2 steps gradient := (old - p) / gamma, p := old, then a
     * momentum-SGD step of rate alpha gamma; old := p. (gamma 1, alpha 1: the form in
     * docs/design/slowmo.md.) */
    double p[MAXN], old[MAXN], buf[MAXN];
    for (size_t j = 0; j < sc->n; j++) p[j] = old[j] = x_init(j);
    int outer = 0;
    for (int t = 0; t < sc->steps; t++) {
        for (size_t j = 0; j < sc->n; j++) {
            double g = 0;
            for (int r = 0; r < N; r++) g += coef_a(1, r, j) * (p[j] - coef_c(r, j));
            p[j] -= gamma * (g / N);
        }
        if (t % 2 == 0) {
            for (int r = 0; r < N; r++) assert_int_equal(sc->communicated[r][t], 0);
            continue;
        }
        for (size_t j = 0; j < sc->n; j++) {
            double g = (old[j] - p[j]) / gamma;
            p[j] = old[j];
            buf[j] = outer == 0 ? g : beta * buf[j] + g;
            p[j] -= alpha * gamma * buf[j];
            old[j] = p[j];
        }
        outer++;
        for (int r = 0; r < N; r++) {
            assert_int_equal(sc->communicated[r][t], 1);
            for (size_t j = 0; j < sc->n; j++)
                check_close(sc->trace[r][t][j], p[j], 1e-6, "tau2 manual", r, t, j);
        }
    }
    free(sc);
}

static void test_tau2_manual_reference(void **state)
{
    (void)state;
    check_manual_tau2(1.0, 1.0);
    check_manual_tau2(0.5, 0.8);
}

/* ---- (c) beta = 0, alpha = 1, inner averaging: Local SGD -------------------------------- */

static void test_local_sgd(void **state)
{
    (void)state;
    const int N = 3, tau = 4, inner = 2;
    scenario *sc = new_scenario(N, 10, 24, tau, inner, 1.0, 0.0);
    for (int t = 0; t < sc->steps; t++) sc->lr[t] = 0.9 - 0.02 * t; /* a schedule */
    run(sc);
    double x[MAXR][MAXN];
    for (int r = 0; r < N; r++)
        for (size_t j = 0; j < sc->n; j++) x[r][j] = x_init(j);
    int averages = 0;
    for (int t = 0; t < sc->steps; t++) {
        for (int r = 0; r < N; r++)
            for (size_t j = 0; j < sc->n; j++)
                x[r][j] -= sc->lr[t] * coef_a(0, r, j) * (x[r][j] - coef_c(r, j));
        int avg = (t + 1) % inner == 0;
        if (avg) {
            averages++;
            for (size_t j = 0; j < sc->n; j++) {
                double m = 0;
                for (int r = 0; r < N; r++) m += x[r][j];
                for (int r = 0; r < N; r++) x[r][j] = m / N;
            }
        }
        for (int r = 0; r < N; r++) {
            assert_int_equal(sc->communicated[r][t], avg);
            assert_int_equal(sc->synchronized[r][t], avg);
            for (size_t j = 0; j < sc->n; j++)
                check_close(sc->trace[r][t][j], x[r][j], TOL, "local sgd", r, t, j);
        }
    }
    /* One exact average per inner_period steps, the outer ones included (the option check at
     * create is set-up and not counted); each moves the whole vector. */
    for (int r = 0; r < N; r++) {
        assert_int_equal(sc->stats[r].rounds, (uint64_t)averages);
        assert_int_equal(sc->stats[r].bytes, (uint64_t)averages * sc->n * sizeof(float));
    }
    free(sc);
}

/* ---- (d) memory-efficient equals plain, bit for bit ------------------------------------- */

static void test_memory_efficient_bitwise(void **state)
{
    (void)state;
    const size_t sizes[] = {13, 2, 1, 37};
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
        for (int N = 1; N <= 4; N++) {
            scenario *plain = new_scenario(N, sizes[si], 25, 3, 0, 0.9, 0.6);
            plain->momentum = 0.8;
            plain->buffers = SUMO_BUFFERS_AVERAGE;
            for (int t = 0; t < plain->steps; t++) plain->lr[t] = 0.3 / (1.0 + 0.1 * t);
            scenario *eff = malloc(sizeof *eff);
            assert_non_null(eff);
            memcpy(eff, plain, sizeof *eff);
            eff->slow.memory_efficient = 1;
            run(plain);
            run(eff);
            for (int r = 0; r < N; r++) {
                for (int t = 0; t < plain->steps; t++)
                    if (memcmp(plain->trace[r][t], eff->trace[r][t],
                               plain->n * sizeof(float)) != 0)
                        fail_msg("n %zu N %d: rank %d differs at step %d", plain->n, N, r, t);
                size_t n = plain->n, s = n / (size_t)N, tail = n % (size_t)N;
                assert_int_equal(plain->extra[r], 2 * n * sizeof(float));
                assert_int_equal(eff->extra[r], 2 * (s + tail) * sizeof(float));
            }
            free(plain);
            free(eff);
        }
    }
}

/* ---- (e) buffer policies with momentum SGD ---------------------------------------------- */

/* Algorithm 1 per worker in double, base SGD with momentum mu (PyTorch: buf = g on the first
 * step after create or reset, else mu buf + g). */
static void reference_policy(const scenario *sc, double mu, sumo_buffer_policy policy,
                             double out[MAXT][MAXR][MAXN])
{
    const int N = sc->nranks;
    const size_t n = sc->n;
    double x[MAXR][MAXN], buf[MAXR][MAXN], x0[MAXN], u[MAXN] = {0};
    int fresh = 1;
    for (int r = 0; r < N; r++)
        for (size_t j = 0; j < n; j++) x[r][j] = x_init(j);
    for (size_t j = 0; j < n; j++) x0[j] = x_init(j);
    for (int t = 0; t < sc->steps; t++) {
        double lr = sc->lr[t];
        for (int r = 0; r < N; r++)
            for (size_t j = 0; j < n; j++) {
                double g = coef_a(0, r, j) * (x[r][j] - coef_c(r, j));
                buf[r][j] = fresh ? g : mu * buf[r][j] + g;
                x[r][j] -= lr * buf[r][j];
            }
        fresh = 0;
        if ((t + 1) % sc->slow.sync_every == 0) {
            for (size_t j = 0; j < n; j++) {
                double m = 0;
                for (int r = 0; r < N; r++) m += x[r][j];
                m /= N;
                u[j] = sc->slow.momentum * u[j] + (x0[j] - m) / lr;
                x0[j] -= sc->slow.lr * lr * u[j];
                for (int r = 0; r < N; r++) x[r][j] = x0[j];
            }
            if (policy == SUMO_BUFFERS_RESET) fresh = 1;
            if (policy == SUMO_BUFFERS_AVERAGE)
                for (size_t j = 0; j < n; j++) {
                    double m = 0;
                    for (int r = 0; r < N; r++) m += buf[r][j];
                    for (int r = 0; r < N; r++) buf[r][j] = m / N;
                }
        }
        for (int r = 0; r < N; r++) memcpy(out[t][r], x[r], n * sizeof(double));
    }
}

static void test_buffer_policies(void **state)
{
    (void)state;
    const sumo_buffer_policy policies[] = {SUMO_BUFFERS_KEEP, SUMO_BUFFERS_RESET,
                                           SUMO_BUFFERS_AVERAGE};
    static double ref[MAXT][MAXR][MAXN];
    float last[3][MAXN];
    for (int pi = 0; pi < 3; pi++) {
        for (int eff = 0; eff <= 1; eff++) {
            scenario *sc = new_scenario(3, 8, 18, 3, 0, 0.9, 0.6);
            sc->momentum = 0.7;
            sc->buffers = policies[pi];
            sc->slow.memory_efficient = eff;
            for (int t = 0; t < sc->steps; t++) sc->lr[t] = 0.25 + 0.01 * (t % 4);
            run(sc);
            reference_policy(sc, sc->momentum, policies[pi], ref);
            for (int t = 0; t < sc->steps; t++)
                for (int r = 0; r < sc->nranks; r++)
                    for (size_t j = 0; j < sc->n; j++)
                        check_close(sc->trace[r][t][j], ref[t][r][j], TOL, "policy", r, t, j);
            memcpy(last[pi], sc->trace[0][sc->steps - 1], sc->n * sizeof(float));
            free(sc);
        }
    }
    /* The policies must matter here, or the test above proves nothing about them. */
    for (int a = 0; a < 3; a++)
        for (int b = a + 1; b < 3; b++) {
            double d = 0;
            for (size_t j = 0; j < 8; j++) d = fmax(d, fabs((double)last[a][j] - last[b][j]));
            assert_true(d > 1e-3);
        }
}

/* ---- (f) bad options, lr 0 at an outer step, non-finite slow buffer ---------------------- */

#define NBAD 16

typedef struct bad_run {
    sumo_diloco_options bad[NBAD];
    sumo_buffer_policy bad_buffers[NBAD];
    sumo_result got[MAXR][NBAD];
    int untouched[MAXR][NBAD];
    /* lr 0 / mismatch / non-finite */
    sumo_result lr0[MAXR][3];
    int lr0_unchanged[MAXR];
    float after_retry[MAXR][MAXN];
    float clean[MAXR][MAXN];
    sumo_result mismatch[MAXR];
    sumo_result one_bad[MAXR];
    sumo_result nonfinite[MAXR];
} bad_run;

static sumo_result try_create_with(sumo_comm *comm, sumo_optimizer *opt, size_t n,
                                   const sumo_diloco_options *s, sumo_buffer_policy buffers,
                                   sumo_distributed **out)
{
    sumo_distributed_options o = {.struct_size = sizeof o, .mode = SUMO_UPDATE_OUTER, .outer = *s,
                                  .buffers = buffers};
    return sumo_distributed_create(comm, opt, NULL, n, &o, out);
}

static sumo_result try_create(sumo_comm *comm, sumo_optimizer *opt, size_t n,
                              const sumo_diloco_options *s, sumo_distributed **out)
{
    return try_create_with(comm, opt, n, s, SUMO_BUFFERS_KEEP, out);
}

static void bad_rank(sumo_comm *comm, int rank, int size, void *arg)
{
    (void)size;
    bad_run *b = arg;
    const size_t n = 5;
    sumo_optimizer *opt = make_sgd(n, 0.0);
    if (opt == NULL) return;
    for (int i = 0; i < NBAD; i++) {
        sumo_distributed *sentinel = (sumo_distributed *)&b; /* must stay untouched */
        sumo_distributed *d = sentinel;
        b->got[rank][i] = try_create_with(comm, opt, n, &b->bad[i], b->bad_buffers[i], &d);
        b->untouched[rank][i] = d == sentinel;
        if (d != sentinel) sumo_distributed_destroy(d);
    }
    sumo_diloco_options good = slowmo_options(2, 0, 1.0, 0.5);
    /* Ranks that disagree on alpha: refused everywhere. */
    sumo_diloco_options mine = good;
    mine.lr = rank == 0 ? 1.0 : 0.9;
    sumo_distributed *d = NULL;
    b->mismatch[rank] = try_create(comm, opt, n, &mine, &d);
    if (d) sumo_distributed_destroy(d);
    d = NULL;
    /* One rank with an invalid option: refused everywhere, nobody left waiting. */
    mine = good;
    if (rank == size - 1) mine.momentum = 1.0;
    b->one_bad[rank] = try_create(comm, opt, n, &mine, &d);
    if (d) sumo_distributed_destroy(d);
    d = NULL;

    /* lr 0 on the outer step (the second): refused with nothing changed, then a retry with a
     * real rate gives what a clean run gives. */
    float x[MAXN], g[MAXN];
    for (int pass = 0; pass < 2; pass++) {
        sumo_optimizer *o2 = make_sgd(n, 0.5);
        d = NULL;
        if (o2 == NULL || try_create(comm, o2, n, &good, &d) != SUMO_SUCCESS) {
            sumo_optimizer_destroy(o2);
            b->lr0[rank][0] = SUMO_ERR_INTERNAL;
            break;
        }
        for (size_t j = 0; j < n; j++) x[j] = x_init(j);
        worker_grad(0, rank, x, g, n);
        sumo_result r = sumo_distributed_step(d, x, g, 0.0, NULL); /* inner step: lr 0 is fine */
        if (pass == 0) b->lr0[rank][0] = r;
        if (pass == 0) {
            float before[MAXN];
            memcpy(before, x, n * sizeof *x);
            worker_grad(0, rank, x, g, n);
            int flag = -1;
            b->lr0[rank][1] = sumo_distributed_step(d, x, g, 0.0, &flag);
            b->lr0_unchanged[rank] = memcmp(before, x, n * sizeof *x) == 0 && flag == 0;
        }
        worker_grad(0, rank, x, g, n);
        r = sumo_distributed_step(d, x, g, 0.25, NULL);
        if (pass == 0) b->lr0[rank][2] = r;
        memcpy(pass == 0 ? b->after_retry[rank] : b->clean[rank], x, n * sizeof *x);
        sumo_distributed_destroy(d);
        sumo_optimizer_destroy(o2);
    }

    /* A slow buffer beyond fp32: a real first step, then a tiny rate on the outer step makes
     * (x0 - x) / lr overflow; every rank must be told. */
    d = NULL;
    sumo_optimizer *o3 = make_sgd(n, 0.0);
    if (o3 != NULL && try_create(comm, o3, n, &good, &d) == SUMO_SUCCESS) {
        for (size_t j = 0; j < n; j++) x[j] = x_init(j);
        worker_grad(0, rank, x, g, n);
        sumo_result r = sumo_distributed_step(d, x, g, 1.0, NULL);
        worker_grad(0, rank, x, g, n);
        if (r == SUMO_SUCCESS) r = sumo_distributed_step(d, x, g, 1e-39, NULL);
        b->nonfinite[rank] = r;
    }
    sumo_distributed_destroy(d);
    sumo_optimizer_destroy(o3);
    sumo_optimizer_destroy(opt);
}

static void test_bad_options_and_lr0(void **state)
{
    (void)state;
    bad_run *b = calloc(1, sizeof *b);
    assert_non_null(b);
    const sumo_diloco_options good = slowmo_options(4, 2, 1.0, 0.5);
    for (int i = 0; i < NBAD; i++) b->bad[i] = good;
    b->bad[0].sync_every = 0;
    b->bad[1].sync_every = -3;
    b->bad[2].inner_period = -1;
    b->bad[3].inner_period = 3; /* 4 is not a multiple of 3 */
    b->bad[4].lr = 0.0;
    b->bad[5].lr = -1.0;
    b->bad[6].lr = INFINITY;
    b->bad[7].lr = NAN;
    b->bad[8].momentum = -0.1;
    b->bad[9].momentum = 1.0;
    b->bad[10].momentum = NAN;
    b->bad_buffers[11] = (sumo_buffer_policy)7;
    b->bad[12].memory_efficient = 2;
    b->bad[13].inner_period = 8; /* larger than tau */
    b->bad[14].inner_period = 2;
    b->bad[14].compression = SUMO_COMPRESS_BF16; /* inner averaging needs the plain average */
    b->bad[15].memory_efficient = 1;
    b->bad[15].merge_alpha = 0.5; /* a shard cannot merge what its owner never saw */
    for (int N = 1; N <= 2; N++) {
        memset(b->got, 0, sizeof b->got);
        assert_int_equal(harness_run_threads(N, bad_rank, b), 0);
        for (int r = 0; r < N; r++) {
            for (int i = 0; i < NBAD; i++) {
                if (b->got[r][i] != SUMO_ERR_INVALID_ARGUMENT)
                    fail_msg("N %d rank %d bad option %d: %s", N, r, i,
                             sumo_result_name(b->got[r][i]));
                assert_true(b->untouched[r][i]);
            }
            assert_int_equal(b->mismatch[r], N > 1 ? SUMO_ERR_MISMATCH : SUMO_SUCCESS);
            assert_int_equal(b->one_bad[r], SUMO_ERR_INVALID_ARGUMENT);
            assert_int_equal(b->lr0[r][0], SUMO_SUCCESS);
            assert_int_equal(b->lr0[r][1], SUMO_ERR_INVALID_ARGUMENT);
            assert_true(b->lr0_unchanged[r]);
            assert_int_equal(b->lr0[r][2], SUMO_SUCCESS);
            assert_memory_equal(b->after_retry[r], b->clean[r], 5 * sizeof(float));
            assert_int_equal(b->nonfinite[r], SUMO_ERR_NONFINITE);
        }
    }
    free(b);
    /* SlowMo's presets: the paper's tau 12 and alpha 1, beta 0.5 but for Local SGD, the
     * heavy-ball step, no inner averaging. */
    const sumo_diloco_preset presets[] = {SUMO_DILOCO_PRESET_SLOWMO, SUMO_DILOCO_PRESET_LOCALSGD,
                                          SUMO_DILOCO_PRESET_BMUF};
    for (int k = 0; k < 3; k++) {
        sumo_diloco_options p;
        assert_int_equal(sumo_diloco_options_default(presets[k], &p), SUMO_SUCCESS);
        assert_int_equal(p.outer, SUMO_OUTER_HEAVY_BALL);
        assert_int_equal(p.sync_every, 12);
        assert_true(p.lr == 1.0 && p.momentum == (k == 1 ? 0.0 : 0.5));
        assert_int_equal(p.inner_period, 0);
        assert_int_equal(p.fragments, 1);
    }
}

/* ---- (g) checkpoint mid outer iteration ------------------------------------------------- */

/* Words of the outer loop's checkpoint header (diloco_state.c): what the corruptions hit. */
#define HDR_RANK 14
#define HDR_PENDING 17

#define G_STEPS 14
#define G_SAVE 6 /* after 6 steps: 2 into the second outer iteration of tau 4 */

typedef struct ckpt_run {
    int efficient;
    size_t n;
    float straight[MAXR][G_STEPS][MAXN];
    float resumed[MAXR][G_STEPS][MAXN];
    sumo_result err[MAXR];
    sumo_result bad_loads[MAXR][5];
    int synchronized_after_load[MAXR];
} ckpt_run;

static sumo_result make_pair(sumo_comm *comm, const ckpt_run *c, sumo_optimizer **opt,
                             sumo_distributed **dist)
{
    sumo_diloco_options s = slowmo_options(4, 2, 0.9, 0.6);
    s.memory_efficient = c->efficient;
    *opt = make_sgd(c->n, 0.7);
    *dist = NULL;
    if (*opt == NULL) return SUMO_ERR_SYSTEM;
    return try_create(comm, *opt, c->n, &s, dist);
}

static double ckpt_lr(int t) { return 0.2 + 0.01 * t; }

static void ckpt_rank(sumo_comm *comm, int rank, int size, void *arg)
{
    (void)size;
    ckpt_run *c = arg;
    const size_t n = c->n;
    float x[MAXN], g[MAXN];
    sumo_optimizer *opt;
    sumo_distributed *dist;
    sumo_result r = make_pair(comm, c, &opt, &dist);
    for (size_t j = 0; j < n; j++) x[j] = x_init(j);
    for (int t = 0; r == SUMO_SUCCESS && t < G_STEPS; t++) {
        worker_grad(0, rank, x, g, n);
        r = sumo_distributed_step(dist, x, g, ckpt_lr(t), NULL);
        memcpy(c->straight[rank][t], x, n * sizeof *x);
    }
    sumo_distributed_destroy(dist);
    sumo_optimizer_destroy(opt);

    /* Again, saving after G_SAVE steps, destroying everything, and resuming in new handles. */
    void *dstate = NULL, *ostate = NULL;
    size_t dbytes = 0, obytes = 0;
    if (r == SUMO_SUCCESS) r = make_pair(comm, c, &opt, &dist);
    for (size_t j = 0; j < n; j++) x[j] = x_init(j);
    for (int t = 0; r == SUMO_SUCCESS && t < G_SAVE; t++) {
        worker_grad(0, rank, x, g, n);
        r = sumo_distributed_step(dist, x, g, ckpt_lr(t), NULL);
        memcpy(c->resumed[rank][t], x, n * sizeof *x);
    }
    if (r == SUMO_SUCCESS) r = sumo_distributed_state_size(dist, &dbytes);
    if (r == SUMO_SUCCESS) r = sumo_optimizer_state_size(opt, &obytes);
    if (r == SUMO_SUCCESS) {
        dstate = malloc(dbytes);
        ostate = malloc(obytes);
        if (!dstate || !ostate) r = SUMO_ERR_SYSTEM;
    }
    if (r == SUMO_SUCCESS) r = sumo_distributed_state_save(dist, dstate, dbytes);
    if (r == SUMO_SUCCESS) r = sumo_optimizer_state_save(opt, ostate, obytes);
    sumo_distributed_destroy(dist);
    sumo_optimizer_destroy(opt);
    dist = NULL;
    opt = NULL;
    for (size_t j = 0; j < n; j++) x[j] = 1e6f; /* the resumed run must not see old values */
    if (r == SUMO_SUCCESS) r = make_pair(comm, c, &opt, &dist);
    if (r == SUMO_SUCCESS) {
        /* Corrupt states are refused and change nothing (the good load below still works). */
        unsigned char *bad = malloc(dbytes);
        if (bad == NULL) r = SUMO_ERR_SYSTEM;
        for (int k = 0; bad && k < 5; k++) {
            memcpy(bad, dstate, dbytes);
            size_t len = dbytes;
            uint64_t w;
            switch (k) {
            case 0: bad[0] ^= 1; break;                                      /* magic */
            case 1: w = 5; memcpy(bad + HDR_PENDING * 8, &w, 8); break;      /* fragment */
            case 2: len = dbytes - 1; break;                                 /* size */
            case 3: { float nan = NAN; memcpy(bad + dbytes - 4, &nan, 4); break; }
            case 4: w = 1000; memcpy(bad + 2 * 8, &w, 8); break;             /* n */
            }
            c->bad_loads[rank][k] = sumo_distributed_state_load(dist, bad, len);
        }
        free(bad);
    }
    if (r == SUMO_SUCCESS) r = sumo_distributed_state_load(dist, dstate, dbytes);
    if (r == SUMO_SUCCESS) r = sumo_optimizer_state_load(opt, ostate, obytes);
    if (r == SUMO_SUCCESS) {
        int s = -1;
        sumo_distributed_synchronized(dist, &s);
        c->synchronized_after_load[rank] = s;
    }
    if (r == SUMO_SUCCESS) memcpy(x, c->resumed[rank][G_SAVE - 1], n * sizeof *x);
    for (int t = G_SAVE; r == SUMO_SUCCESS && t < G_STEPS; t++) {
        worker_grad(0, rank, x, g, n);
        r = sumo_distributed_step(dist, x, g, ckpt_lr(t), NULL);
        memcpy(c->resumed[rank][t], x, n * sizeof *x);
    }
    sumo_distributed_destroy(dist);
    sumo_optimizer_destroy(opt);
    free(dstate);
    free(ostate);
    c->err[rank] = r;
}

static void test_checkpoint_resume(void **state)
{
    (void)state;
    for (int eff = 0; eff <= 1; eff++) {
        for (int N = 1; N <= 3; N++) {
            ckpt_run *c = calloc(1, sizeof *c);
            assert_non_null(c);
            c->efficient = eff;
            c->n = 11;
            assert_int_equal(harness_run_threads(N, ckpt_rank, c), 0);
            for (int r = 0; r < N; r++) {
                if (c->err[r] != SUMO_SUCCESS)
                    fail_msg("eff %d N %d rank %d: %s", eff, N, r, sumo_result_name(c->err[r]));
                for (int k = 0; k < 5; k++)
                    assert_int_equal(c->bad_loads[r][k], SUMO_ERR_INVALID_ARGUMENT);
                /* Saved 2 steps into the iteration, right after an inner average. */
                assert_int_equal(c->synchronized_after_load[r], 1);
                assert_memory_equal(c->straight[r], c->resumed[r], sizeof c->straight[r]);
            }
            free(c);
        }
    }
}

/* A memory-efficient shard belongs to its rank: loading another rank's is refused. */
typedef struct swap_run {
    sumo_result load_other[MAXR];
} swap_run;

static void swap_rank(sumo_comm *comm, int rank, int size, void *arg)
{
    swap_run *s = arg;
    ckpt_run c = {.efficient = 1, .n = 10};
    sumo_optimizer *opt;
    sumo_distributed *dist;
    s->load_other[rank] = SUMO_ERR_INTERNAL;
    if (make_pair(comm, &c, &opt, &dist) != SUMO_SUCCESS) return;
    size_t bytes = 0;
    sumo_distributed_state_size(dist, &bytes);
    unsigned char *buf = malloc(bytes);
    if (buf && sumo_distributed_state_save(dist, buf, bytes) == SUMO_SUCCESS) {
        uint64_t other = (uint64_t)((rank + 1) % size);
        memcpy(buf + HDR_RANK * 8, &other, 8);
        s->load_other[rank] = sumo_distributed_state_load(dist, buf, bytes);
    }
    free(buf);
    sumo_distributed_destroy(dist);
    sumo_optimizer_destroy(opt);
}

static void test_checkpoint_wrong_rank(void **state)
{
    (void)state;
    swap_run s;
    assert_int_equal(harness_run_threads(2, swap_rank, &s), 0);
    assert_int_equal(s.load_other[0], SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(s.load_other[1], SUMO_ERR_INVALID_ARGUMENT);
}

/* ---- (h) extra memory -------------------------------------------------------------------- */

typedef struct mem_run {
    size_t n;
    int efficient;
    size_t extra[MAXR];
    size_t state[MAXR];
    sumo_result err[MAXR];
} mem_run;

static void mem_rank(sumo_comm *comm, int rank, int size, void *arg)
{
    (void)size;
    mem_run *m = arg;
    sumo_optimizer *opt = make_sgd(m->n, 0.9);
    sumo_distributed *dist = NULL;
    sumo_diloco_options s;
    sumo_diloco_options_default(SUMO_DILOCO_PRESET_SLOWMO, &s);
    s.memory_efficient = m->efficient;
    sumo_result r = opt ? try_create(comm, opt, m->n, &s, &dist) : SUMO_ERR_SYSTEM;
    if (r == SUMO_SUCCESS) r = sumo_distributed_extra_memory(dist, &m->extra[rank]);
    if (r == SUMO_SUCCESS) r = sumo_distributed_state_size(dist, &m->state[rank]);
    m->err[rank] = r;
    sumo_distributed_destroy(dist);
    sumo_optimizer_destroy(opt);
}

static void test_extra_memory(void **state)
{
    (void)state;
    const size_t ns[] = {100000, 100003};
    const int N = 8;
    for (size_t k = 0; k < 2; k++) {
        mem_run plain = {.n = ns[k]}, eff = {.n = ns[k], .efficient = 1};
        assert_int_equal(harness_run_threads(N, mem_rank, &plain), 0);
        assert_int_equal(harness_run_threads(N, mem_rank, &eff), 0);
        size_t n = ns[k], s = n / N, t = n % N;
        for (int r = 0; r < N; r++) {
            assert_int_equal(plain.err[r], SUMO_SUCCESS);
            assert_int_equal(eff.err[r], SUMO_SUCCESS);
            assert_int_equal(plain.extra[r], 2 * n * sizeof(float));
            assert_int_equal(eff.extra[r], 2 * (s + t) * sizeof(float));
        }
        printf("slowmo extra memory, n %zu (%zu bytes of fp32 parameters), N %d: plain %zu "
               "bytes (%.2fx the model), memory-efficient %zu bytes (%.3fx); checkpoint %zu / "
               "%zu bytes per rank\n",
               n, n * sizeof(float), N, plain.extra[0],
               (double)plain.extra[0] / (double)(n * sizeof(float)), eff.extra[0],
               (double)eff.extra[0] / (double)(n * sizeof(float)), plain.state[0],
               eff.state[0]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tau1_is_momentum_sgd),
        cmocka_unit_test(test_tau2_manual_reference),
        cmocka_unit_test(test_local_sgd),
        cmocka_unit_test(test_memory_efficient_bitwise),
        cmocka_unit_test(test_buffer_policies),
        cmocka_unit_test(test_bad_options_and_lr0),
        cmocka_unit_test(test_checkpoint_resume),
        cmocka_unit_test(test_checkpoint_wrong_rank),
        cmocka_unit_test(test_extra_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
