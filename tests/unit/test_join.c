/*
 * sumo_join (Horovod's join): a joined rank adds zeros to its peers' sum and average
 * allreduces (blocking and asynchronous, over the shared-memory and the point-to-point
 * algorithms) and takes its part in their barriers; any other collective fails on every
 * rank and leaves the handle usable; sumo_join returns once every rank has joined, with the
 * rank that joined last. References are computed here from the inputs, in double.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "support/harness.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAXP 4
#define N 3001
#define CALLS 3 /* allreduces per active rank */

/* Rank r's input to call q: small integers, so every sum is exact in every dtype. */
static double input(int rank, int q, size_t i)
{
    return harness_collective_value(rank + 7 * q, i, true);
}

/* ---- allreduce with a joined rank ------------------------------------------------------------ */

typedef struct ar_case {
    int size;
    int joined;          /* the rank that joins at once */
    sumo_algorithm algo; /* set on every rank */
    sumo_op op;
    sumo_dtype dtype;
    bool async;
    /* What each rank saw. */
    sumo_result result[MAXP][CALLS], join[MAXP];
    int last[MAXP];
    void *buf[MAXP][CALLS];
} ar_case;

static size_t count_of(int q)
{
    return N + (size_t)q * 1000; /* growing: the joined rank's zeros grow with it */
}

static void ar_body(sumo_comm *comm, int rank, int size, void *arg)
{
    (void)size;
    ar_case *t = arg;
    sumo_comm_set_param(comm, SUMO_PARAM_ALGORITHM, (int)t->algo);
    if (rank != t->joined) {
        sumo_request *req[CALLS];
        for (int q = 0; q < CALLS; q++) {
            for (size_t i = 0; i < count_of(q); i++)
                harness_set(t->dtype, t->buf[rank][q], i, input(rank, q, i));
            if (t->async)
                t->result[rank][q] = sumo_allreduce_start(t->buf[rank][q], t->buf[rank][q],
                                                          count_of(q), t->dtype, t->op, comm,
                                                          &req[q]);
            else
                t->result[rank][q] = sumo_allreduce(t->buf[rank][q], t->buf[rank][q],
                                                    count_of(q), t->dtype, t->op, comm);
        }
        for (int q = 0; q < CALLS && t->async; q++)
            if (t->result[rank][q] == SUMO_SUCCESS) t->result[rank][q] = sumo_request_wait(req[q]);
    }
    t->join[rank] = sumo_join(comm, &t->last[rank]);
}

static void run_allreduce_case(ar_case *t)
{
    for (int r = 0; r < t->size; r++)
        for (int q = 0; q < CALLS; q++)
            t->buf[r][q] = calloc(count_of(q), harness_dtype_size(t->dtype));
    assert_int_equal(harness_run_threads(t->size, ar_body, t), 0);
    /* The active ranks joined together, after the same calls: the highest of them is last. */
    int last = t->joined == t->size - 1 ? t->size - 2 : t->size - 1;
    for (int r = 0; r < t->size; r++) {
        assert_int_equal(t->join[r], SUMO_SUCCESS);
        assert_int_equal(t->last[r], last);
        if (r == t->joined) continue;
        for (int q = 0; q < CALLS; q++) {
            assert_int_equal(t->result[r][q], SUMO_SUCCESS);
            for (size_t i = 0; i < count_of(q); i++) {
                double sum = 0;
                for (int k = 0; k < t->size; k++)
                    if (k != t->joined) sum += input(k, q, i);
                /* Average divides by every rank, the joined one too (as Horovod's). */
                double want = t->op == SUMO_OP_AVERAGE ? sum / t->size : sum;
                double got = harness_get(t->dtype, t->buf[r][q], i);
                /* One rounding of the exact quotient to the dtype. */
                if (got != want) assert_true(fabs(got - want) <= fabs(want) * harness_eps(t->dtype));
            }
        }
    }
    for (int r = 0; r < t->size; r++)
        for (int q = 0; q < CALLS; q++) free(t->buf[r][q]);
}

static void test_joined_rank_adds_zeros_to_sum_and_average(void **state)
{
    (void)state;
    static const sumo_algorithm algos[] = {SUMO_ALGORITHM_AUTO, SUMO_ALGORITHM_RANKED,
                                           SUMO_ALGORITHM_RING,
                                           SUMO_ALGORITHM_RECURSIVE_DOUBLING};
    static const sumo_dtype dtypes[] = {SUMO_FLOAT32, SUMO_FLOAT64, SUMO_BFLOAT16};
    for (size_t a = 0; a < sizeof algos / sizeof algos[0]; a++)
        for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++)
            for (int op = SUMO_OP_SUM; op <= (int)SUMO_OP_AVERAGE; op++) {
                ar_case *t = calloc(1, sizeof *t);
                *t = (ar_case){.size = 3, .joined = (int)(a + d) % 3, .algo = algos[a],
                               .op = (sumo_op)op, .dtype = dtypes[d]};
                run_allreduce_case(t);
                free(t);
            }
}

/* 3 ranks, rank 2 joined: 3 and 6 averaged are 3, not 4.5. */
typedef struct hand {
    double v[3];
    sumo_result r[3];
    int last[3];
} hand;

static void hand_body(sumo_comm *comm, int rank, int size, void *arg)
{
    (void)size;
    hand *h = arg;
    if (rank != 2) h->r[rank] = sumo_allreduce(&h->v[rank], &h->v[rank], 1, SUMO_FLOAT64,
                                               SUMO_OP_AVERAGE, comm);
    sumo_result j = sumo_join(comm, &h->last[rank]);
    if (rank == 2) h->r[rank] = j;
}

static void test_average_divides_by_every_rank(void **state)
{
    (void)state;
    hand h = {.v = {3, 6, 0}};
    assert_int_equal(harness_run_threads(3, hand_body, &h), 0);
    for (int r = 0; r < 3; r++) {
        assert_int_equal(h.r[r], SUMO_SUCCESS);
        assert_int_equal(h.last[r], 1);
    }
    assert_true(h.v[0] == 3.0 && h.v[1] == 3.0);
}

static void test_asynchronous_allreduces_meet_a_joined_rank(void **state)
{
    (void)state;
    for (int algo = 0; algo < 2; algo++) {
        ar_case *t = calloc(1, sizeof *t);
        *t = (ar_case){.size = 4, .joined = 1, .async = true, .op = SUMO_OP_AVERAGE,
                       .dtype = SUMO_FLOAT32,
                       .algo = algo ? SUMO_ALGORITHM_RING : SUMO_ALGORITHM_AUTO};
        run_allreduce_case(t);
        free(t);
    }
}

/* ---- barriers, refusals, the last rank --------------------------------------------------------- */

typedef struct seq_case {
    int size;
    int joined;
    sumo_result barrier[MAXP][2], after[MAXP], join[MAXP];
    int last[MAXP];
    double sum[MAXP];
} seq_case;

/* Rank `joined` joins at once; the others run two barriers and an allreduce, then join. */
static void barrier_body(sumo_comm *comm, int rank, int size, void *arg)
{
    (void)size;
    seq_case *t = arg;
    if (rank != t->joined) {
        t->barrier[rank][0] = sumo_barrier(comm);
        t->barrier[rank][1] = sumo_barrier(comm);
        t->sum[rank] = rank + 1;
        t->after[rank] = sumo_allreduce(&t->sum[rank], &t->sum[rank], 1, SUMO_FLOAT64,
                                        SUMO_OP_SUM, comm);
    }
    t->join[rank] = sumo_join(comm, &t->last[rank]);
}

static void test_barrier_with_a_joined_rank(void **state)
{
    (void)state;
    seq_case t = {.size = 3, .joined = 0};
    assert_int_equal(harness_run_threads(t.size, barrier_body, &t), 0);
    for (int r = 0; r < t.size; r++) {
        assert_int_equal(t.join[r], SUMO_SUCCESS);
        assert_int_equal(t.last[r], 2);
        if (r == t.joined) continue;
        assert_int_equal(t.barrier[r][0], SUMO_SUCCESS);
        assert_int_equal(t.barrier[r][1], SUMO_SUCCESS);
        assert_int_equal(t.after[r], SUMO_SUCCESS);
        assert_true(t.sum[r] == 2.0 + 3.0);
    }
}

enum refused_kind { BROADCAST, ALLGATHER, REDUCE_SCATTER, ADASUM, COMPRESSED, KINDS };

typedef struct refuse_case {
    int size, joined;
    sumo_result got[MAXP][KINDS], after[MAXP], join[MAXP];
    char message[MAXP][KINDS][512];
    int last[MAXP];
    float out[MAXP];
} refuse_case;

static sumo_result refused_call(sumo_comm *comm, enum refused_kind k)
{
    float in[MAXP * 8] = {1, 2, 3, 4}, out[MAXP * 8];
    sumo_compression c;
    switch (k) {
    case BROADCAST: return sumo_broadcast(in, out, 8, SUMO_FLOAT32, 0, comm);
    case ALLGATHER: return sumo_allgather(in, out, 8, SUMO_FLOAT32, comm);
    case REDUCE_SCATTER: return sumo_reduce_scatter(in, out, 2,
                                                    SUMO_FLOAT32, SUMO_OP_SUM, comm);
    case ADASUM: return sumo_allreduce(in, out, 8, SUMO_FLOAT32, SUMO_OP_ADASUM, comm);
    case COMPRESSED:
        sumo_compression_default(SUMO_COMPRESS_BF16, &c);
        return sumo_allreduce_compressed(in, out, 8, &c, comm);
    default: return SUMO_ERR_INTERNAL;
    }
}

/* For each refused kind: rank `joined` joins, the others make the call; every rank fails.
 * Then an allreduce shows the handle still works, and all join. */
static void refuse_body(sumo_comm *comm, int rank, int size, void *arg)
{
    (void)size;
    refuse_case *t = arg;
    for (int k = 0; k < KINDS; k++) {
        int last = -2;
        if (rank == t->joined)
            t->got[rank][k] = sumo_join(comm, &last);
        else
            t->got[rank][k] = refused_call(comm, (enum refused_kind)k);
        const char *m = "";
        sumo_comm_error_message(comm, &m);
        snprintf(t->message[rank][k], sizeof t->message[rank][k], "%s", m);
    }
    t->out[rank] = (float)rank;
    t->after[rank] = sumo_allreduce(&t->out[rank], &t->out[rank], 1, SUMO_FLOAT32, SUMO_OP_SUM,
                                    comm);
    t->join[rank] = sumo_join(comm, &t->last[rank]);
}

static void test_other_collectives_fail_on_every_rank(void **state)
{
    (void)state;
    refuse_case *t = calloc(1, sizeof *t);
    t->size = 3;
    t->joined = 1;
    assert_int_equal(harness_run_threads(t->size, refuse_body, t), 0);
    for (int r = 0; r < t->size; r++) {
        for (int k = 0; k < KINDS; k++) {
            assert_int_equal(t->got[r][k], SUMO_ERR_INVALID_USAGE);
            /* Names the joined rank and what it did. */
            assert_non_null(strstr(t->message[r][k], "rank 1 called sumo_join"));
        }
        assert_int_equal(t->after[r], SUMO_SUCCESS);
        assert_true(t->out[r] == 0.0f + 1.0f + 2.0f);
        assert_int_equal(t->join[r], SUMO_SUCCESS);
        assert_int_equal(t->last[r], 2);
    }
    assert_non_null(strstr(t->message[0][BROADCAST], "broadcast"));
    assert_non_null(strstr(t->message[1][ADASUM], "Adasum"));
    free(t);
}

/* Active ranks that disagree among themselves fail as ever, and the joined rank with them. */
typedef struct mismatch_case {
    sumo_result got[3];
    int last[3];
} mismatch_case;

static void mismatch_body(sumo_comm *comm, int rank, int size, void *arg)
{
    (void)size;
    mismatch_case *t = arg;
    float buf[4] = {0};
    if (rank == 2)
        t->got[rank] = sumo_join(comm, &t->last[rank]);
    else
        t->got[rank] = sumo_allreduce(buf, buf, rank == 0 ? 4 : 3, SUMO_FLOAT32, SUMO_OP_SUM,
                                      comm);
}

static void test_mismatch_among_active_ranks_fails_everywhere(void **state)
{
    (void)state;
    mismatch_case t;
    assert_int_equal(harness_run_threads(3, mismatch_body, &t), 0);
    for (int r = 0; r < 3; r++) assert_int_equal(t.got[r], SUMO_ERR_MISMATCH);
}

/* Rank r makes calls[r] allreduces, then joins: the rank with the most joined last; of
 * ranks with as many, the highest. */
typedef struct last_case {
    int size, calls[MAXP];
    sumo_result join[MAXP];
    int last[MAXP];
} last_case;

static void last_body(sumo_comm *comm, int rank, int size, void *arg)
{
    (void)size;
    last_case *t = arg;
    /* Every allreduce runs on every rank: a rank that is done joins it with zeros. */
    for (int q = 0; q < t->calls[rank]; q++) {
        double x = 1;
        sumo_allreduce(&x, &x, 1, SUMO_FLOAT64, SUMO_OP_SUM, comm);
    }
    t->join[rank] = sumo_join(comm, &t->last[rank]);
}

static void test_last_joined_rank(void **state)
{
    (void)state;
    static const struct {
        int size, calls[MAXP], last;
    } cases[] = {
        {4, {1, 3, 2, 0}, 1},
        {4, {2, 2, 1, 0}, 1},
        {4, {0, 0, 0, 0}, 3}, /* all at once: returns at once */
        {3, {5, 0, 5}, 2},
        {2, {0, 4}, 1},
        {2, {4, 0}, 0},
        {1, {0}, 0},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        last_case t = {.size = cases[c].size};
        memcpy(t.calls, cases[c].calls, sizeof t.calls);
        assert_int_equal(harness_run_threads(t.size, last_body, &t), 0);
        for (int r = 0; r < t.size; r++) {
            assert_int_equal(t.join[r], SUMO_SUCCESS);
            assert_int_equal(t.last[r], cases[c].last);
        }
    }
}

/* ---- what a call costs -------------------------------------------------------------------- */

typedef struct stats_case {
    sumo_comm_stats before[3], after_allreduce[3], after_join[3];
    sumo_result join[3];
    int last[3];
} stats_case;

static void stats_body(sumo_comm *comm, int rank, int size, void *arg)
{
    (void)size;
    stats_case *t = arg;
    float x[16] = {0};
    sumo_comm_get_stats(comm, &t->before[rank]);
    sumo_allreduce(x, x, 16, SUMO_FLOAT32, SUMO_OP_SUM, comm);
    sumo_comm_get_stats(comm, &t->after_allreduce[rank]);
    /* Rank 0 joins; 1 and 2 run an allreduce and a barrier, which rank 0 answers, and a
     * broadcast, refused on every rank (rank 0's sumo_join returns); then all join. */
    if (rank != 0) {
        sumo_allreduce(x, x, 16, SUMO_FLOAT32, SUMO_OP_SUM, comm);
        sumo_barrier(comm);
        sumo_broadcast(x, x, 16, SUMO_FLOAT32, 1, comm);
    } else {
        sumo_join(comm, &t->last[rank]);
    }
    t->join[rank] = sumo_join(comm, &t->last[rank]);
    sumo_comm_get_stats(comm, &t->after_join[rank]);
}

static void test_stats_count_each_collective_once(void **state)
{
    (void)state;
    stats_case t;
    memset(&t, 0, sizeof t);
    assert_int_equal(harness_run_threads(3, stats_body, &t), 0);
    for (int r = 0; r < 3; r++) {
        assert_int_equal(t.join[r], SUMO_SUCCESS);
        assert_int_equal(t.after_allreduce[r].rounds - t.before[r].rounds, 1);
        assert_int_equal(t.after_allreduce[r].bytes - t.before[r].bytes, 16 * sizeof(float));
        /* The allreduce, the barrier and the refused broadcast, made or answered. */
        assert_int_equal(t.after_join[r].rounds - t.after_allreduce[r].rounds, 3);
    }
}

/* sumo_mem_alloc and sumo_mem_free agree outside the collectives' own path: each is still one
 * round on every rank. */
static void mem_stats_body(sumo_comm *comm, int rank, int size, void *arg)
{
    (void)size;
    uint64_t *rounds = arg;
    sumo_comm_stats a, b;
    void *p = NULL;
    sumo_comm_get_stats(comm, &a);
    if (sumo_mem_alloc(comm, 64, &p) != SUMO_SUCCESS || sumo_mem_free(comm, p) != SUMO_SUCCESS) return;
    sumo_comm_get_stats(comm, &b);
    rounds[rank] = b.rounds - a.rounds;
}

static void test_stats_count_memory_calls(void **state)
{
    (void)state;
    uint64_t rounds[3] = {0};
    assert_int_equal(harness_run_threads(3, mem_stats_body, rounds), 0);
    for (int r = 0; r < 3; r++) assert_int_equal(rounds[r], 2);
}

static void test_bad_arguments(void **state)
{
    (void)state;
    int last;
    sumo_comm_stats s;
    assert_int_equal(sumo_join(NULL, &last), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_comm_get_stats(NULL, &s), SUMO_ERR_INVALID_ARGUMENT);
    sumo_comm *comm;
    assert_int_equal(sumo_comm_create_threads(1, &comm), SUMO_SUCCESS);
    assert_int_equal(sumo_join(comm, NULL), SUMO_ERR_INVALID_ARGUMENT);
    const char *m;
    sumo_comm_error_message(comm, &m);
    assert_non_null(strstr(m, "last_joined"));
    assert_int_equal(sumo_comm_get_stats(comm, NULL), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_join(comm, &last), SUMO_SUCCESS);
    assert_int_equal(last, 0);
    assert_int_equal(sumo_comm_destroy(comm), SUMO_SUCCESS);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_joined_rank_adds_zeros_to_sum_and_average),
        cmocka_unit_test(test_average_divides_by_every_rank),
        cmocka_unit_test(test_asynchronous_allreduces_meet_a_joined_rank),
        cmocka_unit_test(test_barrier_with_a_joined_rank),
        cmocka_unit_test(test_other_collectives_fail_on_every_rank),
        cmocka_unit_test(test_mismatch_among_active_ranks_fails_everywhere),
        cmocka_unit_test(test_last_joined_rank),
        cmocka_unit_test(test_stats_count_each_collective_once),
        cmocka_unit_test(test_stats_count_memory_calls),
        cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
