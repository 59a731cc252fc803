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
 * And a property: (d) the memory-efficient mode is bit-identical to the plain one. (f) to (h),
 * the interface's, are in test_slowmo_api.c.
 *
 * Rank threads only record; the assertions run in the main thread (cmocka must not longjmp
 * out of another thread).
 */
#include "support/slowmo_run.h"

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


int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tau1_is_momentum_sgd),
        cmocka_unit_test(test_tau2_manual_reference),
        cmocka_unit_test(test_local_sgd),
        cmocka_unit_test(test_memory_efficient_bitwise),
        cmocka_unit_test(test_buffer_policies),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
