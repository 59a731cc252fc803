/*
 * The gossip bases of the outer loop (sumo_diloco.h's base: SGP, OSGP, D-PSGD, alone and
 * under SlowMo) against a float64 implementation, written here, of SlowMo's Algorithm 1
 * (Wang et al. 2020) with the gossip base of Assran et al. 2019 and D-PSGD of Lian et al. 2017:
 * every rank minimises 0.5 |x - c_r|^2 from a common start (gradient x - c_r, taken by the
 * test itself), and the loop is driven with begin / the step / end as a binding does.
 *   (a) n = 2: SGP equals averaging after every step;
 *   (b) SGP, OSGP (staleness 1 and 2) and D-PSGD alone, n = 3 to 5, against the recurrences;
 *   (c) SlowMo over each (tau 3, alpha 0.7, beta 0.5) against Algorithm 1;
 *   (d) a state saved at every step of SlowMo over OSGP resumes bit for bit;
 *   (e) options a gossip base cannot run are refused by name (gossip_per_node among them).
 * Rank threads only record; the assertions run in the main thread.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "sumo_diloco.h"
#include "support/harness.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAXP 8
#define N 5
#define STEPS 13
#define LR 0.1

static double start(size_t i) { return 0.5 * (double)i - 1.0; }
static double target(int r, size_t i) { return harness_uniform_at(7, (uint64_t)r, i) * (r + 1); }

typedef struct run {
    sumo_diloco_options o;
    int save_at; /* >= 0: save after that step, finish, then resume a second loop from it */
    double x[MAXP][STEPS][N];
    sumo_result r[MAXP];
    int same[MAXP];
    char msg[MAXP][256];
} run;

static sumo_result steps(sumo_diloco *d, double *x, int rank, int from, int to, run *R)
{
    for (int t = from; t < to; t++) {
        sumo_result r = sumo_diloco_begin(d, x);
        for (size_t i = 0; i < N && r == SUMO_SUCCESS; i++) x[i] -= LR * (x[i] - target(rank, i));
        if (r == SUMO_SUCCESS) r = sumo_diloco_end(d, x, LR, NULL);
        if (r != SUMO_SUCCESS) return r;
        memcpy(R->x[rank][t], x, sizeof R->x[rank][t]);
    }
    return SUMO_SUCCESS;
}

static void rank_fn(sumo_comm *comm, int rank, int size, void *arg)
{
    (void)size;
    run *R = arg;
    sumo_diloco *d = NULL, *d2 = NULL;
    R->r[rank] = sumo_diloco_create(comm, NULL, 0, N, SUMO_FLOAT64, &R->o, &d);
    const char *m = "";
    sumo_comm_error_message(comm, &m);
    snprintf(R->msg[rank], sizeof R->msg[rank], "%s", m ? m : "");
    if (R->r[rank] != SUMO_SUCCESS) return;
    double x[N];
    for (size_t i = 0; i < N; i++) x[i] = start(i);
    int stop = R->save_at >= 0 ? R->save_at : STEPS;
    R->r[rank] = steps(d, x, rank, 0, stop, R);
    R->same[rank] = 1;
    if (R->save_at >= 0 && R->r[rank] == SUMO_SUCCESS) {
        size_t bytes = 0;
        sumo_diloco_state_size(d, &bytes);
        unsigned char *buf = malloc(bytes);
        double xs[N], full[N];
        memcpy(xs, x, sizeof x);
        sumo_result r = sumo_diloco_state_save(d, buf, bytes);
        if (r == SUMO_SUCCESS) r = steps(d, x, rank, stop, STEPS, R);
        memcpy(full, x, sizeof x);
        if (r == SUMO_SUCCESS) r = sumo_diloco_create(comm, NULL, 0, N, SUMO_FLOAT64, &R->o, &d2);
        if (r == SUMO_SUCCESS) r = sumo_diloco_state_load(d2, buf, bytes);
        if (r == SUMO_SUCCESS) r = steps(d2, xs, rank, stop, STEPS, R);
        R->same[rank] = memcmp(xs, full, sizeof xs) == 0;
        R->r[rank] = r;
        free(buf);
    }
    sumo_diloco_destroy(d2);
    sumo_diloco_destroy(d);
}

/* ---- the reference: Algorithm 1 with the gossip bases, in double ---------------------------- */

static int offset_of(int n, int k)
{
    int K = 0;
    while ((1 << (K + 1)) <= n - 1) K++;
    return 1 << (k % (K + 1));
}

static void reference(const sumo_diloco_options *o, int n, double out[MAXP][STEPS][N])
{
    double X[MAXP][N], W[MAXP], sent[MAXP][N], sw[MAXP], x0[N], u[N] = {0};
    bool flight = false;
    int ticks = 0, k = 0, tau = o->sync_every;
    for (size_t i = 0; i < N; i++) x0[i] = start(i);
    for (int r = 0; r < n; r++) {
        W[r] = 1;
        for (size_t i = 0; i < N; i++) X[r][i] = start(i);
    }
    for (int t = 1; t <= STEPS; t++) {
        double pre[MAXP][N];
        memcpy(pre, X, sizeof X);
        /* the local step on z = X / W moves the numerator */
        for (int r = 0; r < n; r++)
            for (size_t i = 0; i < N; i++) X[r][i] -= LR * (X[r][i] / W[r] - target(r, i));
        bool sync = tau > 0 && t % tau == 0;
        if (o->base == SUMO_BASE_SGP) {
            int off = offset_of(n, k++);
            double nx[MAXP][N];
            for (int r = 0; r < n; r++)
                for (size_t i = 0; i < N; i++) nx[r][i] = X[r][i] / 2 + X[(r - off + n) % n][i] / 2;
            memcpy(X, nx, sizeof nx);
        } else if (o->base == SUMO_BASE_DPSGD) {
            int off = offset_of(n, k++);
            for (int r = 0; r < n; r++)
                for (size_t i = 0; i < N; i++) {
                    double mixed = (pre[r][i] + pre[(r + off) % n][i] + pre[(r - off + n) % n][i]) / 3;
                    if (2 * off % n == 0) mixed = (pre[r][i] + pre[(r + off) % n][i]) / 2;
                    X[r][i] = mixed + (X[r][i] - pre[r][i]);
                }
        } else { /* OSGP */
            bool finish = flight && (sync || ++ticks >= o->gossip_staleness);
            bool begin = !sync && (!flight || finish);
            if (finish) {
                int off = offset_of(n, k - 1);
                for (int r = 0; r < n; r++) {
                    for (size_t i = 0; i < N; i++) X[r][i] += sent[(r - off + n) % n][i];
                    W[r] += sw[(r - off + n) % n];
                }
                flight = false;
            }
            if (begin) {
                for (int r = 0; r < n; r++) {
                    for (size_t i = 0; i < N; i++) X[r][i] /= 2, sent[r][i] = X[r][i];
                    W[r] /= 2, sw[r] = W[r];
                }
                flight = true, ticks = 0, k++;
            }
        }
        if (sync) { /* the exact average and the slow momentum step */
            for (size_t i = 0; i < N; i++) {
                double avg = 0;
                for (int r = 0; r < n; r++) avg += X[r][i] / W[r] / n;
                u[i] = o->momentum * u[i] + (x0[i] - avg) / LR;
                x0[i] -= o->lr * LR * u[i];
                for (int r = 0; r < n; r++) X[r][i] = x0[i];
            }
        }
        for (int r = 0; r < n; r++)
            for (size_t i = 0; i < N; i++) out[r][t - 1][i] = X[r][i] / W[r];
    }
}

static void check(run *R, int n, const char *what)
{
    static double want[MAXP][STEPS][N];
    R->save_at = -1;
    assert_int_equal(harness_run_threads(n, rank_fn, R), 0);
    for (int r = 0; r < n; r++)
        if (R->r[r] != SUMO_SUCCESS) fail_msg("%s n %d rank %d: %s (%s)", what, n, r,
                                              sumo_result_name(R->r[r]), R->msg[r]);
    reference(&R->o, n, want);
    for (int t = 0; t < STEPS; t++)
        for (int r = 0; r < n; r++)
            for (size_t i = 0; i < N; i++)
                if (fabs(R->x[r][t][i] - want[r][t][i]) > 1e-12)
                    fail_msg("%s n %d step %d rank %d element %zu: %.17g, reference %.17g", what,
                             n, t + 1, r, i, R->x[r][t][i], want[r][t][i]);
}

/* (a) */
static void test_two_ranks_sgp_is_averaging(void **state)
{
    (void)state;
    static run R;
    sumo_diloco_options_default(SUMO_DILOCO_PRESET_SGP, &R.o);
    R.save_at = -1;
    assert_int_equal(harness_run_threads(2, rank_fn, &R), 0);
    double x[2][N];
    for (int r = 0; r < 2; r++)
        for (size_t i = 0; i < N; i++) x[r][i] = start(i);
    for (int t = 0; t < STEPS; t++)
        for (size_t i = 0; i < N; i++) {
            double avg = 0;
            for (int r = 0; r < 2; r++) avg += (x[r][i] - LR * (x[r][i] - target(r, i))) / 2;
            for (int r = 0; r < 2; r++) {
                x[r][i] = avg;
                assert_true(fabs(R.x[r][t][i] - avg) < 1e-14);
            }
        }
}

static const char *BASES[] = {"local", "sgp", "osgp", "dpsgd"};

/* (b) */
static void test_bases_alone(void **state)
{
    (void)state;
    static run R;
    sumo_diloco_preset presets[] = {SUMO_DILOCO_PRESET_SGP, SUMO_DILOCO_PRESET_OSGP,
                                    SUMO_DILOCO_PRESET_DPSGD};
    for (int p = 0; p < 3; p++)
        for (int n = 3; n <= 5; n++)
            for (int s = 1; s <= (presets[p] == SUMO_DILOCO_PRESET_OSGP ? 2 : 1); s++) {
                sumo_diloco_options_default(presets[p], &R.o);
                R.o.gossip_staleness = s;
                check(&R, n, BASES[R.o.base]);
            }
}

/* (c) */
static void test_slowmo_over_each(void **state)
{
    (void)state;
    static run R;
    for (int b = SUMO_BASE_SGP; b <= SUMO_BASE_DPSGD; b++)
        for (int n = 2; n <= 5; n++) {
            sumo_diloco_options_default(SUMO_DILOCO_PRESET_SLOWMO_SGP, &R.o);
            R.o.base = (sumo_diloco_base)b;
            R.o.sync_every = 3;
            R.o.lr = 0.7;
            R.o.momentum = 0.5;
            check(&R, n, BASES[b]);
        }
}

/* (d) */
static void test_resume(void **state)
{
    (void)state;
    static run R;
    for (int b = SUMO_BASE_SGP; b <= SUMO_BASE_DPSGD; b++)
        for (int at = 0; at < 8; at++) {
            sumo_diloco_options_default(SUMO_DILOCO_PRESET_SLOWMO_SGP, &R.o);
            R.o.base = (sumo_diloco_base)b;
            R.o.sync_every = 4;
            R.o.gossip_staleness = 2;
            R.save_at = at;
            assert_int_equal(harness_run_threads(3, rank_fn, &R), 0);
            for (int r = 0; r < 3; r++) {
                if (R.r[r] != SUMO_SUCCESS)
                    fail_msg("%s at %d rank %d: %s", BASES[b], at, r, sumo_result_name(R.r[r]));
                if (!R.same[r]) fail_msg("%s saved at step %d: rank %d resumed differently", BASES[b], at, r);
            }
        }
}

/* (e) */
static void test_refusals(void **state)
{
    (void)state;
    static run R;
    sumo_diloco_options bad[8];
    for (int c = 0; c < 8; c++) sumo_diloco_options_default(SUMO_DILOCO_PRESET_SLOWMO_SGP, &bad[c]);
    bad[0].fragments = 2;
    bad[1].gossip_peers = 0;
    bad[2].base = (sumo_diloco_base)9;
    bad[3].memory_efficient = 1;
    bad[4].gossip_per_node = 2;
    sumo_diloco_options_default(SUMO_DILOCO_PRESET_SLOWMO, &bad[5]);
    bad[5].gossip_per_node = 1;
    bad[6].gossip_per_node = 1; /* on a flat communicator: the gossip round's own refusal */
    bad[7].gossip_per_node = 1;
    bad[7].base = SUMO_BASE_DPSGD;
    const char *words[] = {"gossip base needs", "gossip_peers", "base must be", "gossip base needs",
                           "gossip_per_node must be 0 or 1", "gossip_per_node needs a gossip base",
                           "per_node needs a two-level communicator",
                           "gossip_per_node needs base SGP or OSGP"};
    for (int c = 0; c < 8; c++) {
        R.o = bad[c];
        R.save_at = -1;
        assert_int_equal(harness_run_threads(2, rank_fn, &R), 0);
        for (int r = 0; r < 2; r++) {
            assert_int_equal(R.r[r], SUMO_ERR_INVALID_ARGUMENT);
            if (strstr(R.msg[r], words[c]) == NULL) fail_msg("case %d: '%s'", c, R.msg[r]);
        }
    }
    /* More peers than n - 1: the gossip round's own refusal. */
    sumo_diloco_options_default(SUMO_DILOCO_PRESET_SGP, &R.o);
    R.o.gossip_peers = 2;
    assert_int_equal(harness_run_threads(2, rank_fn, &R), 0);
    for (int r = 0; r < 2; r++) {
        assert_int_equal(R.r[r], SUMO_ERR_INVALID_ARGUMENT);
        if (strstr(R.msg[r], "peers 2") == NULL) fail_msg("peers: '%s'", R.msg[r]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_ranks_sgp_is_averaging), cmocka_unit_test(test_bases_alone),
        cmocka_unit_test(test_slowmo_over_each),           cmocka_unit_test(test_resume),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
