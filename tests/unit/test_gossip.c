/*
 * Gossip rounds (sumo_gossip.h) against references the test writes itself from the
 * algorithms' definitions, in double:
 *   (a) n = 2^k, one peer a round: after k rounds every rank holds the exact mean (dyadic
 *       inputs, so fp32 holds it exactly); n = 16 with 3 peers: after 2 rounds; n = 9 with 2
 *       peers after 2 rounds, within fp32's roundings of thirds;
 *   (b) n = 6, one peer, one period (3 rounds, offsets 1, 2, 4): rank i holds
 *       sum_{d=0..7} x_{(i-d) mod 6} / 8, i.e. weights [2,1,1,1,1,2]/8 on x_{i+e}, e = 0..5;
 *   (c) on the built-in graph (p = 1, 2, 3; n = 3 .. 7) w stays exactly 1 and the rounds
 *       equal the push-sum matrices built here from the graph's definition;
 *   (d) a graph that is not regular: x and w after every round equal the push-sum reference,
 *       w moves away from 1, and z = x / w converges to the mean;
 *   (e) the symmetric mode equals (x + sum of the neighbours r +- 2^i) / (m + 1);
 *   (f) overlapped rounds (OSGP, staleness 1 and 2) against the recurrence in double;
 *   (g) a state saved with a round in flight resumes bit for bit;
 *   (h) bad input refused by name: n = 1, peers > n - 1, graphs that differ, ranks at other
 *       rounds, a caller's graph naming the rank itself; a peer lost mid-round ends with a
 *       message;
 *   (i) over TCP (ranks as threads, meeting through a directory store) the rounds give the
 *       threads transport's bits: one data path, through sendrecv;
 *   (j) per node on a two-level communicator (H nodes of L ranks, threads levels): after
 *       every round each rank holds push-sum over the H nodes of the nodes' averages, the
 *       ranks of a node the same bits, in blocking and overlapped rounds; per_node on a flat
 *       communicator or one node is refused by name; rank gossip on a two-level communicator
 *       equals the flat push-sum (over options.any), and is refused without options.any.
 * Rank threads only record; the assertions run in the main thread.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "sumo_gossip.h"
#include "sumo_tcp.h"
#include "support/harness.h"
#include "support/temp_dir.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAXP 16
#define N 7 /* elements per rank */

static double input(int rank, size_t i) { return harness_uniform_at(47, (uint64_t)rank, i); }
/* Dyadic and small: every partial sum of shares is exact in fp32. */
static float dyadic(int rank, size_t i) { return (float)((rank * 7 + (int)i * 3) % 17 - 8); }

/* ---- one generic runner: each rank runs `rounds` blocking rounds in fp64 -------------------- */

typedef struct run {
    sumo_gossip_options o;
    sumo_dtype dtype;
    int rounds;
    double x[MAXP][64][N]; /* after each round */
    double w[MAXP][64];
    float xf[MAXP][N];
    sumo_result r[MAXP];
} run;

static void rounds_rank(sumo_comm *comm, int rank, int size, void *arg)
{
    (void)size;
    run *R = arg;
    sumo_gossip *g = NULL;
    if ((R->r[rank] = sumo_gossip_create(comm, N, R->dtype, &R->o, &g)) != SUMO_SUCCESS) return;
    double x[N];
    for (size_t i = 0; i < N; i++) x[i] = input(rank, i), R->xf[rank][i] = dyadic(rank, i);
    for (int t = 0; t < R->rounds && R->r[rank] == SUMO_SUCCESS; t++) {
        R->r[rank] = sumo_gossip_round(g, R->dtype == SUMO_FLOAT64 ? (void *)x : R->xf[rank]);
        memcpy(R->x[rank][t], x, sizeof x);
        sumo_gossip_weight(g, &R->w[rank][t]);
    }
    sumo_gossip_destroy(g);
}

static void run_rounds(run *R, int n)
{
    memset(R->r, 0, sizeof R->r);
    assert_int_equal(harness_run_threads(n, rounds_rank, R), 0);
    for (int r = 0; r < n; r++) assert_int_equal(R->r[r], SUMO_SUCCESS);
}

/* The out-peers of rank r in round k of the exponential graph, from its definition. */
static int exp_out(int n, int p, int k, int r, int *out)
{
    int K = 0;
    while (pow(p + 1, K + 1) <= n - 1) K++;
    int i = k % (K + 1), m = 0;
    for (int j = 1; j <= p; j++) {
        int to = (int)((r + (long long)j * (long long)pow(p + 1, i)) % n);
        bool dup = to == r;
        for (int q = 0; q < m; q++) dup |= out[q] == to;
        if (!dup) out[m++] = to;
    }
    return m;
}

/* One push-sum round in double: column-stochastic, uniform shares. */
static void ref_push_sum(int n, double x[][N], double *w, int (*outs)(int, int, int *, const void *),
                         int k, const void *ctx)
{
    double nx[MAXP][N] = {{0}}, nw[MAXP] = {0};
    for (int r = 0; r < n; r++) {
        int out[MAXP], m = outs(k, r, out, ctx);
        for (int q = -1; q < m; q++) {
            int to = q < 0 ? r : out[q];
            for (int i = 0; i < N; i++) nx[to][i] += x[r][i] / (m + 1);
            nw[to] += w[r] / (m + 1);
        }
    }
    memcpy(x, nx, (size_t)n * sizeof nx[0]);
    memcpy(w, nw, (size_t)n * sizeof *w);
}

typedef struct exp_ctx { int n, p; } exp_ctx;
static int exp_outs(int k, int r, int *out, const void *ctx)
{
    const exp_ctx *e = ctx;
    return exp_out(e->n, e->p, k, r, out);
}

/* (a) */
static void test_exact_mean(void **state)
{
    (void)state;
    static run R;
    int cases[][3] = {{2, 1, 1}, {4, 1, 2}, {8, 1, 3}, {16, 1, 4}, {16, 3, 2}, {9, 2, 2}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int n = cases[c][0];
        sumo_gossip_options_default(&R.o);
        R.o.peers = cases[c][1];
        R.rounds = cases[c][2];
        R.dtype = SUMO_FLOAT32;
        run_rounds(&R, n);
        for (size_t i = 0; i < N; i++) {
            double mean = 0;
            for (int r = 0; r < n; r++) mean += dyadic(r, i);
            mean /= n;
            /* Shares of 1/2 and 1/4 are exact in fp32; of 1/3, within a few roundings. */
            double tol = (cases[c][1] & (cases[c][1] + 1)) == 0 ? 0 : 8 * 0x1p-24 * 8;
            for (int r = 0; r < n; r++) {
                if (fabs((double)R.xf[r][i] - mean) > tol)
                    fail_msg("n %d p %d: rank %d element %zu holds %.9g, mean %.9g", n,
                             cases[c][1], r, i, (double)R.xf[r][i], mean);
            }
        }
    }
}

/* (b) */
static void test_six_ranks_one_period(void **state)
{
    (void)state;
    static run R;
    sumo_gossip_options_default(&R.o);
    R.rounds = 3;
    R.dtype = SUMO_FLOAT64;
    run_rounds(&R, 6);
    const double weight[6] = {2, 1, 1, 1, 1, 2}; /* on x_{(i + e) mod 6} */
    for (int i = 0; i < 6; i++)
        for (size_t el = 0; el < N; el++) {
            double want = 0, want2 = 0;
            for (int d = 0; d < 8; d++) want += input(((i - d) % 6 + 6) % 6, el) / 8;
            for (int e = 0; e < 6; e++) want2 += weight[e] * input((i + e) % 6, el) / 8;
            assert_true(fabs(want - want2) < 1e-15);
            assert_true(fabs(R.x[i][2][el] - want) < 1e-14);
        }
}

/* (c) */
static void test_regular_weight_one(void **state)
{
    (void)state;
    static run R;
    for (int n = 3; n <= 7; n++)
        for (int p = 1; p <= 3 && p < n; p++) {
            sumo_gossip_options_default(&R.o);
            R.o.peers = p;
            R.rounds = 9;
            R.dtype = SUMO_FLOAT64;
            run_rounds(&R, n);
            double x[MAXP][N], w[MAXP];
            for (int r = 0; r < n; r++) {
                w[r] = 1;
                for (int i = 0; i < N; i++) x[r][i] = input(r, (size_t)i);
            }
            exp_ctx e = {n, p};
            for (int t = 0; t < R.rounds; t++) {
                ref_push_sum(n, x, w, exp_outs, t, &e);
                for (int r = 0; r < n; r++) {
                    if (R.w[r][t] != 1.0) fail_msg("n %d p %d round %d: rank %d w %.17g", n, p, t, r, R.w[r][t]);
                    for (int i = 0; i < N; i++)
                        if (fabs(R.x[r][t][i] - x[r][i]) > 1e-14)
                            fail_msg("n %d p %d round %d rank %d: %.17g vs %.17g", n, p, t, r,
                                     R.x[r][t][i], x[r][i]);
                }
            }
        }
}

/* (d): period 2 on 5 ranks; rank 0 sends to three ranks in round 0, odd ranks are silent in
 * round 1. Strongly connected over a period, not regular. */
#define NR 5
static const int IRREG[2][NR][3] = {
    {{1, 2, 3}, {2, -1, -1}, {3, -1, -1}, {4, -1, -1}, {0, -1, -1}},
    {{2, -1, -1}, {-1, -1, -1}, {4, 0, -1}, {-1, -1, -1}, {1, -1, -1}},
};
static int irreg_outs(int k, int r, int *out, const void *ctx)
{
    (void)ctx;
    int m = 0;
    for (int j = 0; j < 3; j++)
        if (IRREG[k % 2][r][j] >= 0) out[m++] = IRREG[k % 2][r][j];
    return m;
}

static void test_irregular_converges(void **state)
{
    (void)state;
    static run R;
    sumo_gossip_options_default(&R.o);
    R.o.rounds = 2;
    R.o.max_out = 3;
    R.o.out_peers = &IRREG[0][0][0];
    R.rounds = 60;
    R.dtype = SUMO_FLOAT64;
    run_rounds(&R, NR);
    double x[MAXP][N], w[MAXP], mean[N] = {0};
    for (int r = 0; r < NR; r++) {
        w[r] = 1;
        for (int i = 0; i < N; i++) x[r][i] = input(r, (size_t)i), mean[i] += input(r, (size_t)i) / NR;
    }
    bool moved = false;
    for (int t = 0; t < R.rounds; t++) {
        ref_push_sum(NR, x, w, irreg_outs, t, NULL);
        for (int r = 0; r < NR; r++) {
            moved |= R.w[r][t] != 1.0;
            assert_true(fabs(R.w[r][t] - w[r]) < 1e-13);
            for (int i = 0; i < N; i++) assert_true(fabs(R.x[r][t][i] - x[r][i]) < 1e-13);
        }
    }
    assert_true(moved);
    for (int r = 0; r < NR; r++)
        for (int i = 0; i < N; i++) {
            double z = R.x[r][R.rounds - 1][i] / R.w[r][R.rounds - 1];
            if (fabs(z - mean[i]) > 1e-9) fail_msg("rank %d: z %.17g mean %.17g", r, z, mean[i]);
        }
}

/* (e) */
static void test_symmetric(void **state)
{
    (void)state;
    static run R;
    int n = 7;
    sumo_gossip_options_default(&R.o);
    R.o.mode = SUMO_GOSSIP_SYMMETRIC;
    R.rounds = 4;
    R.dtype = SUMO_FLOAT64;
    run_rounds(&R, n);
    double x[MAXP][N];
    for (int r = 0; r < n; r++)
        for (int i = 0; i < N; i++) x[r][i] = input(r, (size_t)i);
    for (int t = 0; t < R.rounds; t++) {
        int off = 1 << (t % 3); /* K = floor(log2 6) = 2 */
        double nx[MAXP][N];
        for (int r = 0; r < n; r++)
            for (int i = 0; i < N; i++)
                nx[r][i] = (x[r][i] + x[(r + off) % n][i] + x[(r - off + n) % n][i]) / 3;
        memcpy(x, nx, sizeof nx);
        for (int r = 0; r < n; r++)
            for (int i = 0; i < N; i++) assert_true(fabs(R.x[r][t][i] - x[r][i]) < 1e-14);
    }
}

/* ---- (f), (g): OSGP on per-rank quadratics -------------------------------------------------- */

#define STEPS 12
#define LR 0.1

static double target(int r, int i) { return (double)(r + 1) * (i % 3 - 1) + 0.25 * i; }

typedef struct osgp_run {
    int staleness, save_at; /* save_at >= 0: save after that step and resume a second object */
    double x[MAXP][STEPS][N];
    double w[MAXP][STEPS];
    double resumed[MAXP][N];
    int communicated[MAXP][STEPS];
    sumo_result r[MAXP];
} osgp_run;

static sumo_result osgp_steps(sumo_gossip *g, double *x, int rank, int from, int to, osgp_run *O)
{
    for (int t = from; t < to; t++) {
        double w;
        sumo_gossip_weight(g, &w);
        for (int i = 0; i < N; i++) x[i] -= LR * (x[i] / w - target(rank, i)); /* on z */
        sumo_result res = sumo_gossip_overlap(g, x, &O->communicated[rank][t]);
        if (res != SUMO_SUCCESS) return res;
        memcpy(O->x[rank][t], x, N * sizeof *x);
        sumo_gossip_weight(g, &O->w[rank][t]);
    }
    return SUMO_SUCCESS;
}

static void osgp_rank(sumo_comm *comm, int rank, int size, void *arg)
{
    (void)size;
    osgp_run *O = arg;
    sumo_gossip_options o;
    sumo_gossip_options_default(&o);
    o.staleness = O->staleness;
    sumo_gossip *g = NULL, *g2 = NULL;
    if ((O->r[rank] = sumo_gossip_create(comm, N, SUMO_FLOAT64, &o, &g)) != SUMO_SUCCESS) return;
    double x[N];
    for (int i = 0; i < N; i++) x[i] = input(rank, (size_t)i);
    int stop = O->save_at >= 0 ? O->save_at : STEPS;
    O->r[rank] = osgp_steps(g, x, rank, 0, stop, O);
    if (O->save_at >= 0 && O->r[rank] == SUMO_SUCCESS) {
        size_t bytes;
        sumo_gossip_state_size(g, &bytes);
        unsigned char *buf = malloc(bytes);
        double xs[N];
        memcpy(xs, x, sizeof x);
        O->r[rank] = sumo_gossip_state_save(g, buf, bytes);
        if (O->r[rank] == SUMO_SUCCESS) O->r[rank] = osgp_steps(g, x, rank, stop, STEPS, O);
        memcpy(O->resumed[rank], x, sizeof x); /* the run that never stopped */
        if (O->r[rank] == SUMO_SUCCESS) O->r[rank] = sumo_gossip_create(comm, N, SUMO_FLOAT64, &o, &g2);
        if (O->r[rank] == SUMO_SUCCESS) O->r[rank] = sumo_gossip_state_load(g2, buf, bytes);
        if (O->r[rank] == SUMO_SUCCESS) O->r[rank] = osgp_steps(g2, xs, rank, stop, STEPS, O);
        for (int i = 0; i < N; i++)
            if (memcmp(&xs[i], &O->resumed[rank][i], sizeof xs[i]) != 0) O->r[rank] = SUMO_ERR_INTERNAL;
        free(buf);
    }
    sumo_gossip_destroy(g2);
    sumo_gossip_destroy(g);
}

static void test_osgp_recurrence(void **state)
{
    (void)state;
    static osgp_run O;
    for (int n = 2; n <= 5; n++)
        for (int s = 1; s <= 2; s++) {
            memset(&O, 0, sizeof O);
            O.staleness = s;
            O.save_at = -1;
            assert_int_equal(harness_run_threads(n, osgp_rank, &O), 0);
            for (int r = 0; r < n; r++) assert_int_equal(O.r[r], SUMO_SUCCESS);
            /* The recurrence: a step on z = x / w moves the numerator; every s-th step (from
             * the first) the round in flight completes (the shares received added) and the
             * next starts (x and w halved: one out-peer, r + 2^i; the snapshot sent). */
            double x[MAXP][N], w[MAXP], sent[MAXP][N], sw[MAXP];
            bool flight = false;
            int ticks = 0, round = 0, K = 0;
            while ((1 << (K + 1)) <= n - 1) K++;
            for (int r = 0; r < n; r++) {
                w[r] = 1;
                for (int i = 0; i < N; i++) x[r][i] = input(r, (size_t)i);
            }
            for (int t = 0; t < STEPS; t++) {
                for (int r = 0; r < n; r++)
                    for (int i = 0; i < N; i++) x[r][i] -= LR * (x[r][i] / w[r] - target(r, i));
                bool go = !flight || ++ticks >= s;
                if (flight && go) {
                    int off = 1 << ((round - 1) % (K + 1));
                    for (int r = 0; r < n; r++) {
                        int from = (r - off + n) % n;
                        for (int i = 0; i < N; i++) x[r][i] += sent[from][i];
                        w[r] += sw[from];
                    }
                }
                if (go) {
                    for (int r = 0; r < n; r++) {
                        for (int i = 0; i < N; i++) x[r][i] /= 2, sent[r][i] = x[r][i];
                        w[r] /= 2, sw[r] = w[r];
                    }
                    flight = true, ticks = 0, round++;
                }
                for (int r = 0; r < n; r++) {
                    if (O.communicated[r][t] != go)
                        fail_msg("n %d s %d step %d rank %d: communicated %d, expected %d", n, s,
                                 t, r, O.communicated[r][t], go);
                    assert_true(fabs(O.w[r][t] - w[r]) < 1e-15);
                    for (int i = 0; i < N; i++)
                        if (fabs(O.x[r][t][i] - x[r][i]) > 1e-12)
                            fail_msg("n %d s %d step %d rank %d: %.17g vs %.17g", n, s, t, r,
                                     O.x[r][t][i], x[r][i]);
                }
            }
        }
}

/* (g) */
static void test_resume_in_flight(void **state)
{
    (void)state;
    static osgp_run O;
    for (int at = 1; at < 6; at++) {
        memset(&O, 0, sizeof O);
        O.staleness = 2;
        O.save_at = at;
        assert_int_equal(harness_run_threads(4, osgp_rank, &O), 0);
        for (int r = 0; r < 4; r++) assert_int_equal(O.r[r], SUMO_SUCCESS);
    }
}

/* ---- (h) refusals -------------------------------------------------------------------------- */

typedef struct bad_run {
    int which;
    sumo_result r[MAXP];
    char msg[MAXP][256];
} bad_run;

static void note(bad_run *B, sumo_comm *comm, int rank, sumo_result r)
{
    const char *m = "";
    B->r[rank] = r;
    sumo_comm_error_message(comm, &m);
    snprintf(B->msg[rank], sizeof B->msg[rank], "%s", m ? m : "");
}

static void bad_rank(sumo_comm *comm, int rank, int size, void *arg)
{
    bad_run *B = arg;
    sumo_gossip_options o;
    sumo_gossip_options_default(&o);
    sumo_gossip *g = NULL;
    double x[N] = {0};
    switch (B->which) {
    case 0: /* peers > n - 1 */
        o.peers = size;
        note(B, comm, rank, sumo_gossip_create(comm, N, SUMO_FLOAT64, &o, &g));
        break;
    case 1: /* graphs that differ */
        o.peers = rank == 1 ? 2 : 1;
        note(B, comm, rank, sumo_gossip_create(comm, N, SUMO_FLOAT64, &o, &g));
        break;
    case 2: { /* a rank at another round */
        sumo_result r = sumo_gossip_create(comm, N, SUMO_FLOAT64, &o, &g);
        size_t bytes = 0;
        sumo_gossip_state_size(g, &bytes);
        unsigned char *buf = malloc(bytes);
        if (r == SUMO_SUCCESS) r = sumo_gossip_state_save(g, buf, bytes);
        if (r == SUMO_SUCCESS) r = sumo_gossip_round(g, x);
        if (r == SUMO_SUCCESS && rank == 1) r = sumo_gossip_state_load(g, buf, bytes);
        if (r == SUMO_SUCCESS) r = sumo_gossip_round(g, x);
        free(buf);
        note(B, comm, rank, r);
        break;
    }
    case 3: { /* a caller's graph naming the rank itself */
        int table[4] = {1, 1, 2, 0}; /* one round, 4 ranks... rank 1 names itself */
        o.rounds = 1;
        o.max_out = 1;
        o.out_peers = table;
        note(B, comm, rank, sumo_gossip_create(comm, N, SUMO_FLOAT64, &o, &g));
        break;
    }
    case 4: /* n = 1 */
        note(B, comm, rank, sumo_gossip_create(comm, N, SUMO_FLOAT64, &o, &g));
        break;
    }
    sumo_gossip_destroy(g);
}

static void expect_refusal(int which, int n, sumo_result code, const char *word)
{
    static bad_run B;
    memset(&B, 0, sizeof B);
    B.which = which;
    assert_int_equal(harness_run_threads(n, bad_rank, &B), 0);
    for (int r = 0; r < n; r++) {
        if (B.r[r] != code)
            fail_msg("case %d rank %d: %s, expected %s (%s)", which, r, sumo_result_name(B.r[r]),
                     sumo_result_name(code), B.msg[r]);
        if (strstr(B.msg[r], word) == NULL && !(code == SUMO_ERR_INVALID_ARGUMENT && r != 0))
            fail_msg("case %d rank %d: message '%s' does not name '%s'", which, r, B.msg[r], word);
    }
}

static void test_refusals(void **state)
{
    (void)state;
    expect_refusal(0, 3, SUMO_ERR_INVALID_ARGUMENT, "peers 3");
    expect_refusal(1, 3, SUMO_ERR_MISMATCH, "rank 1");
    expect_refusal(2, 3, SUMO_ERR_MISMATCH, "round");
    expect_refusal(3, 4, SUMO_ERR_INVALID_ARGUMENT, "names 1");
    expect_refusal(4, 1, SUMO_ERR_INVALID_ARGUMENT, "no peer");
}

/* A peer that leaves after creating: the others' round ends with a failure and a message. */
typedef struct lost_run {
    sumo_result r[4];
    char msg[4][256];
} lost_run;

static sumo_result lost_rank(sumo_comm *comm, int rank, void *arg)
{
    lost_run *L = arg;
    sumo_gossip *g = NULL;
    double x[N] = {0};
    sumo_result r = sumo_gossip_create(comm, N, SUMO_FLOAT64, NULL, &g);
    if (r == SUMO_SUCCESS && rank != 2)
        for (int t = 0; t < 4 && r == SUMO_SUCCESS; t++) r = sumo_gossip_round(g, x);
    const char *m = "";
    sumo_comm_error_message(comm, &m);
    snprintf(L->msg[rank], sizeof L->msg[rank], "%s", m ? m : "");
    L->r[rank] = r;
    sumo_gossip_destroy(g);
    return SUMO_SUCCESS;
}

static void test_peer_lost(void **state)
{
    (void)state;
    static lost_run L;
    assert_int_equal(sumo_threads_run(4, lost_rank, &L, NULL), SUMO_SUCCESS);
    for (int r = 0; r < 4; r++) {
        if (r == 2) continue;
        if (L.r[r] != SUMO_ERR_PEER_FAILURE && L.r[r] != SUMO_ERR_TIMEOUT)
            fail_msg("rank %d: %s", r, sumo_result_name(L.r[r]));
        assert_true(strlen(L.msg[r]) > 0);
    }
}

/* ---- (i) TCP ------------------------------------------------------------------------------ */

typedef struct tcp_rank {
    int rank, size;
    const sumo_store *store;
    run *R;
    sumo_result made;
    pthread_t thread;
} tcp_rank;

static void *tcp_main(void *p)
{
    tcp_rank *t = p;
    sumo_tcp_options o;
    sumo_tcp_options_default(&o);
    o.rank = t->rank;
    o.size = t->size;
    o.store = t->store;
    o.key_prefix = "gossip/";
    o.address = "127.0.0.1";
    sumo_comm *comm = NULL;
    t->made = sumo_comm_create_tcp(&o, &comm);
    if (t->made == SUMO_SUCCESS) rounds_rank(comm, t->rank, t->size, t->R);
    sumo_comm_destroy(comm);
    return NULL;
}

static void test_tcp_same_bits(void **state)
{
    (void)state;
    static run T, R;
    char dir[256];
    assert_true(make_temp_dir(dir, sizeof dir, "gossip"));
    sumo_store *store = NULL;
    assert_int_equal(sumo_store_create_dir(dir, &store), SUMO_SUCCESS);
    const int n = 5;
    sumo_gossip_options_default(&T.o);
    T.o.peers = 2;
    T.rounds = 5;
    T.dtype = SUMO_FLOAT64;
    R = T;
    tcp_rank ts[MAXP];
    for (int r = 0; r < n; r++) {
        ts[r] = (tcp_rank){.rank = r, .size = n, .store = store, .R = &T};
        assert_int_equal(pthread_create(&ts[r].thread, NULL, tcp_main, &ts[r]), 0);
    }
    for (int r = 0; r < n; r++) pthread_join(ts[r].thread, NULL);
    sumo_store_destroy_dir(store, 1);
    remove_dir(dir);
    run_rounds(&R, n);
    for (int r = 0; r < n; r++) {
        assert_int_equal(ts[r].made, SUMO_SUCCESS);
        assert_int_equal(T.r[r], SUMO_SUCCESS);
        assert_memory_equal(T.x[r], R.x[r], sizeof T.x[r][0] * (size_t)T.rounds);
        assert_memory_equal(T.w[r], R.w[r], sizeof T.w[r][0] * (size_t)T.rounds);
    }
}

/* ---- (j) per node --------------------------------------------------------------------------- */

#define PN_ROUNDS 5

typedef struct pn_run {
    int H, L, overlap;
    int by_rank, any; /* rank gossip (per_node 0); give the communicator options.any */
    sumo_comm *node[MAXP][MAXP], *across[MAXP][MAXP], *anyc[MAXP];
    double x[MAXP][PN_ROUNDS][N], w[MAXP][PN_ROUNDS];
    int peers[MAXP];
    sumo_result r[MAXP];
    char msg[MAXP][256];
} pn_run;

typedef struct pn_arg {
    pn_run *P;
    int h, l;
} pn_arg;

static void *pn_rank(void *p)
{
    pn_arg *a = p;
    pn_run *P = a->P;
    int rank = a->h * P->L + a->l;
    sumo_comm *hier = NULL;
    sumo_hier_options ho;
    sumo_hier_options_default(&ho);
    ho.any = P->any ? P->anyc[rank] : NULL;
    P->r[rank] = sumo_comm_create_hier(P->node[a->h][a->l], P->across[a->l][a->h], &ho, &hier);
    if (P->r[rank] != SUMO_SUCCESS) return NULL;
    sumo_gossip_options o;
    sumo_gossip_options_default(&o);
    o.per_node = !P->by_rank;
    sumo_gossip *g = NULL;
    if ((P->r[rank] = sumo_gossip_create(hier, N, SUMO_FLOAT64, &o, &g)) == SUMO_SUCCESS) {
        int count = 0;
        sumo_gossip_out_peers(g, 0, &P->peers[rank], 1, &count);
        double x[N];
        for (int i = 0; i < N; i++) x[i] = input(rank, (size_t)i);
        for (int t = 0; t < PN_ROUNDS && P->r[rank] == SUMO_SUCCESS; t++) {
            int c = 0;
            P->r[rank] = P->overlap ? sumo_gossip_overlap(g, x, &c) : sumo_gossip_round(g, x);
            memcpy(P->x[rank][t], x, sizeof x);
            sumo_gossip_weight(g, &P->w[rank][t]);
        }
        if (P->overlap && P->r[rank] == SUMO_SUCCESS) P->r[rank] = sumo_gossip_finish(g, x);
    } else {
        const char *m = "";
        sumo_comm_error_message(hier, &m);
        snprintf(P->msg[rank], sizeof P->msg[rank], "%s", m);
    }
    sumo_gossip_destroy(g);
    sumo_comm_destroy(hier);
    return NULL;
}

static void pn_world(pn_run *P)
{
    int H = P->H, L = P->L;
    for (int h = 0; h < H; h++) assert_int_equal(sumo_comm_create_threads(L, P->node[h]), SUMO_SUCCESS);
    for (int l = 0; l < L; l++) {
        sumo_comm *tmp[MAXP];
        assert_int_equal(sumo_comm_create_threads(H, tmp), SUMO_SUCCESS);
        for (int h = 0; h < H; h++) P->across[l][h] = tmp[h];
    }
    if (P->any) assert_int_equal(sumo_comm_create_threads(H * L, P->anyc), SUMO_SUCCESS);
    pthread_t ids[MAXP];
    pn_arg args[MAXP];
    for (int r = 0; r < H * L; r++) {
        args[r] = (pn_arg){.P = P, .h = r / L, .l = r % L};
        assert_int_equal(pthread_create(&ids[r], NULL, pn_rank, &args[r]), 0);
    }
    for (int r = 0; r < H * L; r++) pthread_join(ids[r], NULL);
}

static void test_per_node(void **state)
{
    (void)state;
    static pn_run P;
    const int shapes[][2] = {{3, 2}, {2, 3}, {4, 2}, {5, 1}};
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++)
        for (int overlap = 0; overlap <= 1; overlap++) {
            memset(&P, 0, sizeof P);
            int H = shapes[c][0], L = shapes[c][1];
            P.H = H, P.L = L, P.overlap = overlap;
            pn_world(&P);
            for (int r = 0; r < H * L; r++) {
                if (P.r[r] != SUMO_SUCCESS) fail_msg("H %d L %d: rank %d: %s", H, L, r, P.msg[r]);
                /* Round 0's out-peer: local rank l of node h + 1. */
                assert_int_equal(P.peers[r], ((r / L + 1) % H) * L + r % L);
            }
            /* The reference: node h's value is the average of its ranks' inputs, then
             * push-sum over the H nodes; overlapped, a round's shares arrive one call later,
             * and every call first averages the node. */
            double x[MAXP][N], w[MAXP], sent[MAXP][N], sw[MAXP];
            for (int h = 0; h < H; h++) {
                w[h] = 1;
                for (int i = 0; i < N; i++) {
                    double sum = 0;
                    for (int l = 0; l < L; l++) sum += input(h * L + l, (size_t)i);
                    x[h][i] = sum / L;
                }
            }
            exp_ctx e = {H, 1};
            for (int t = 0; t < PN_ROUNDS; t++) {
                if (!overlap) {
                    ref_push_sum(H, x, w, exp_outs, t, &e);
                } else {
                    if (t > 0)
                        for (int h = 0; h < H; h++) {
                            int out[MAXP];
                            exp_outs(t - 1, h, out, &e);
                            for (int i = 0; i < N; i++) x[out[0]][i] += sent[h][i];
                            w[out[0]] += sw[h];
                        }
                    for (int h = 0; h < H; h++) {
                        for (int i = 0; i < N; i++) x[h][i] /= 2, sent[h][i] = x[h][i];
                        w[h] /= 2, sw[h] = w[h];
                    }
                }
                for (int r = 0; r < H * L; r++) {
                    int h = r / L;
                    if (P.w[r][t] != w[h])
                        fail_msg("H %d L %d overlap %d round %d rank %d: w %.17g, expected %.17g",
                                 H, L, overlap, t, r, P.w[r][t], w[h]);
                    for (int i = 0; i < N; i++)
                        if (fabs(P.x[r][t][i] - x[h][i]) > 1e-14)
                            fail_msg("H %d L %d overlap %d round %d rank %d: %.17g vs %.17g", H,
                                     L, overlap, t, r, P.x[r][t][i], x[h][i]);
                    if (memcmp(P.x[r][t], P.x[h * L][t], sizeof P.x[r][t]) != 0)
                        fail_msg("H %d L %d round %d: rank %d's bits differ from its node's "
                                 "first rank's", H, L, t, r);
                }
            }
        }
}

/* Rank gossip on a two-level communicator: flat push-sum over all H L ranks (over options.any),
 * refused without options.any. */
static void test_by_rank_on_two_levels(void **state)
{
    (void)state;
    static pn_run P;
    memset(&P, 0, sizeof P);
    P.H = 3, P.L = 2, P.by_rank = 1, P.any = 1;
    pn_world(&P);
    int n = 6;
    double x[MAXP][N], w[MAXP];
    for (int r = 0; r < n; r++) {
        assert_int_equal(P.r[r], SUMO_SUCCESS);
        w[r] = 1;
        for (int i = 0; i < N; i++) x[r][i] = input(r, (size_t)i);
    }
    exp_ctx e = {n, 1};
    for (int t = 0; t < PN_ROUNDS; t++) {
        ref_push_sum(n, x, w, exp_outs, t, &e);
        for (int r = 0; r < n; r++)
            for (int i = 0; i < N; i++)
                if (fabs(P.x[r][t][i] - x[r][i]) > 1e-14 || P.w[r][t] != 1.0)
                    fail_msg("by rank, round %d rank %d: %.17g vs %.17g", t, r, P.x[r][t][i],
                             x[r][i]);
    }
    memset(&P, 0, sizeof P);
    P.H = 2, P.L = 2, P.by_rank = 1;
    pn_world(&P);
    for (int r = 0; r < 4; r++) {
        assert_int_equal(P.r[r], SUMO_ERR_INVALID_USAGE);
        assert_non_null(strstr(P.msg[r], "without options.any"));
    }
}

static void refuse_rank(sumo_comm *comm, int rank, int size, void *arg)
{
    (void)size;
    bad_run *B = arg;
    sumo_gossip_options o;
    sumo_gossip_options_default(&o);
    o.per_node = 1;
    sumo_gossip *g = NULL;
    note(B, comm, rank, sumo_gossip_create(comm, N, SUMO_FLOAT64, &o, &g));
    sumo_gossip_destroy(g);
}

static void test_per_node_refused(void **state)
{
    (void)state;
    static bad_run B;
    memset(&B, 0, sizeof B);
    assert_int_equal(harness_run_threads(3, refuse_rank, &B), 0);
    for (int r = 0; r < 3; r++) {
        assert_int_equal(B.r[r], SUMO_ERR_INVALID_ARGUMENT);
        assert_non_null(strstr(B.msg[r], "per_node needs a two-level communicator"));
    }
    /* A two-level communicator of one node. */
    static pn_run P;
    memset(&P, 0, sizeof P);
    P.H = 1, P.L = 2;
    pn_world(&P);
    for (int r = 0; r < 2; r++) {
        assert_int_equal(P.r[r], SUMO_ERR_INVALID_ARGUMENT);
        assert_non_null(strstr(P.msg[r], "per_node needs at least 2 nodes"));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exact_mean),          cmocka_unit_test(test_six_ranks_one_period),
        cmocka_unit_test(test_regular_weight_one),  cmocka_unit_test(test_irregular_converges),
        cmocka_unit_test(test_symmetric),           cmocka_unit_test(test_osgp_recurrence),
        cmocka_unit_test(test_resume_in_flight),    cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_peer_lost),           cmocka_unit_test(test_tcp_same_bits),
        cmocka_unit_test(test_per_node),            cmocka_unit_test(test_per_node_refused),
        cmocka_unit_test(test_by_rank_on_two_levels),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
