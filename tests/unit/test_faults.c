/*
 * Bad input and faults on the threads transport: ranks that disagree, invalid buffers, a rank
 * that never arrives, a rank that leaves. Every case must end with the same verdict on every
 * rank, promptly, and leave no rank hanging.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "support/harness.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define P 3
#define N 1000

typedef struct scenario {
    int which;
    sumo_result first[P];  /* the call under test */
    sumo_result after[P];  /* a correct allreduce afterwards */
    char message[P][256];
    float after_value[P];
} scenario;

enum { COUNT, DTYPE, OP, ROOT, KIND, NULL_BUF, OVERLAP, BAD_DTYPE_ALL, ZERO_NULL };

static void disagree_body(sumo_comm *comm, int rank, int size, void *arg)
{
    (void)size;
    scenario *s = arg;
    float *buf = calloc(N + 8, sizeof *buf);
    float *out = calloc(N + 8, sizeof *out);
    sumo_result r;
    switch (s->which) {
    case COUNT: r = sumo_allreduce(buf, out, rank == 1 ? N + 1 : N, SUMO_FLOAT32, SUMO_OP_SUM, comm); break;
    case DTYPE: r = sumo_allreduce(buf, out, N, rank == 2 ? SUMO_BFLOAT16 : SUMO_FLOAT32, SUMO_OP_SUM, comm); break;
    case OP: r = sumo_allreduce(buf, out, N, SUMO_FLOAT32, rank == 0 ? SUMO_OP_AVERAGE : SUMO_OP_SUM, comm); break;
    case ROOT: r = sumo_broadcast(buf, out, N, SUMO_FLOAT32, rank == 1 ? 1 : 0, comm); break;
    case KIND:
        r = rank == 0 ? sumo_allgather(buf, out, 1, SUMO_FLOAT32, comm)
                      : sumo_allreduce(buf, out, 1, SUMO_FLOAT32, SUMO_OP_SUM, comm);
        break;
    case NULL_BUF: r = sumo_allreduce(rank == 2 ? NULL : buf, out, N, SUMO_FLOAT32, SUMO_OP_SUM, comm); break;
    case OVERLAP:
        r = sumo_allreduce(buf, rank == 0 ? buf + 1 : out, N, SUMO_FLOAT32, SUMO_OP_SUM, comm);
        break;
    case BAD_DTYPE_ALL: r = sumo_allreduce(buf, out, N, (sumo_dtype)42, SUMO_OP_SUM, comm); break;
    default: r = sumo_allreduce(NULL, NULL, 0, SUMO_FLOAT32, SUMO_OP_SUM, comm); break;
    }
    s->first[rank] = r;
    const char *msg = "";
    sumo_comm_error_message(comm, &msg);
    snprintf(s->message[rank], sizeof s->message[rank], "%s", msg);
    /* The communicator stays usable after a disagreement. */
    for (int i = 0; i < N; i++) buf[i] = (float)(rank + 1);
    s->after[rank] = sumo_allreduce(buf, buf, N, SUMO_FLOAT32, SUMO_OP_SUM, comm);
    s->after_value[rank] = buf[N - 1];
    free(buf);
    free(out);
}

/* offender >= 0: that rank's message names the fault, the others' name the offender. */
static void expect_everywhere_from(int which, sumo_result want, const char *needle, int offender)
{
    scenario s = {.which = which};
    assert_int_equal(harness_run_threads(P, disagree_body, &s), 0);
    for (int r = 0; r < P; r++) {
        if (s.first[r] != want)
            fail_msg("scenario %d rank %d: %s, want %s (%s)", which, r,
                     sumo_result_name(s.first[r]), sumo_result_name(want), s.message[r]);
        char named[64];
        snprintf(named, sizeof named, "rank %d failed before moving data", offender);
        const char *expect = offender >= 0 && r != offender ? named : needle;
        if (expect && want != SUMO_SUCCESS && strstr(s.message[r], expect) == NULL)
            fail_msg("scenario %d rank %d: message '%s' lacks '%s'", which, r, s.message[r], expect);
        assert_int_equal(s.after[r], SUMO_SUCCESS);
        assert_true(s.after_value[r] == 6.0f); /* 1 + 2 + 3 */
    }
}

static void expect_everywhere(int which, sumo_result want, const char *needle)
{
    expect_everywhere_from(which, want, needle, -1);
}

static void test_count_mismatch(void **state) { (void)state; expect_everywhere(COUNT, SUMO_ERR_MISMATCH, "count"); }
static void test_dtype_mismatch(void **state) { (void)state; expect_everywhere(DTYPE, SUMO_ERR_MISMATCH, "dtype"); }
static void test_op_mismatch(void **state) { (void)state; expect_everywhere(OP, SUMO_ERR_MISMATCH, "op"); }
static void test_root_mismatch(void **state) { (void)state; expect_everywhere(ROOT, SUMO_ERR_MISMATCH, "root"); }
static void test_collective_mismatch(void **state) { (void)state; expect_everywhere(KIND, SUMO_ERR_MISMATCH, "allgather"); }
static void test_null_buffer_on_one_rank(void **state) { (void)state; expect_everywhere_from(NULL_BUF, SUMO_ERR_INVALID_ARGUMENT, "NULL", 2); }
static void test_overlapping_buffers(void **state) { (void)state; expect_everywhere_from(OVERLAP, SUMO_ERR_INVALID_ARGUMENT, "overlap", 0); }
static void test_unknown_dtype(void **state) { (void)state; expect_everywhere(BAD_DTYPE_ALL, SUMO_ERR_INVALID_ARGUMENT, "dtype"); }
static void test_count_zero_with_null(void **state) { (void)state; expect_everywhere(ZERO_NULL, SUMO_SUCCESS, NULL); }

/* Rank P-1 arrives long after the deadline. */
static void late_body(sumo_comm *comm, int rank, int size, void *arg)
{
    scenario *s = arg;
    float buf[16] = {0};
    sumo_comm_set_timeout(comm, 0.3);
    if (rank == size - 1) nanosleep(&(struct timespec){.tv_sec = 1}, NULL);
    s->first[rank] = sumo_allreduce(buf, buf, 16, SUMO_FLOAT32, SUMO_OP_SUM, comm);
    const char *msg = "";
    sumo_comm_error_message(comm, &msg);
    snprintf(s->message[rank], sizeof s->message[rank], "%s", msg);
    /* A broken communicator refuses further work instead of hanging. */
    s->after[rank] = sumo_allreduce(buf, buf, 16, SUMO_FLOAT32, SUMO_OP_SUM, comm);
}

static void test_rank_that_never_arrives_times_out(void **state)
{
    (void)state;
    scenario s = {0};
    assert_int_equal(harness_run_threads(P, late_body, &s), 0);
    int timeouts = 0;
    for (int r = 0; r < P; r++) {
        assert_true(s.first[r] == SUMO_ERR_TIMEOUT || s.first[r] == SUMO_ERR_PEER_FAILURE);
        assert_true(strlen(s.message[r]) > 10);
        assert_true(s.after[r] == SUMO_ERR_PEER_FAILURE);
        if (s.first[r] == SUMO_ERR_TIMEOUT) {
            timeouts++;
            /* The status itself shows the deadline ended the wait: had the rank waited for
             * the late one, the allreduce would have succeeded. No timing assertion here (the
             * machines are shared). */
            assert_non_null(strstr(s.message[r], "deadline"));
        }
    }
    assert_true(timeouts >= 1);
    assert_int_equal(s.first[P - 1], SUMO_ERR_PEER_FAILURE);
}

/* A rank that leaves while its peers wait for it: sumo_threads_run destroys rank 1's handle as
 * soon as its function returns, without it ever entering the allreduce rank 0 waits in. */
typedef struct leaving {
    sumo_result result[2];
    char message[256];
} leaving;

static sumo_result leaver_or_stayer(sumo_comm *comm, int rank, void *arg)
{
    leaving *l = arg;
    if (rank == 1) {
        /* Usually lets rank 0 get into its wait first; if not, it finds rank 1 gone on entry,
         * which must give the same verdict. */
        nanosleep(&(struct timespec){.tv_nsec = 100 * 1000 * 1000}, NULL);
        return SUMO_SUCCESS;
    }
    float buf[8] = {0};
    sumo_comm_set_timeout(comm, 60);
    l->result[0] = sumo_allreduce(buf, buf, 8, SUMO_FLOAT32, SUMO_OP_SUM, comm);
    const char *msg = "";
    sumo_comm_error_message(comm, &msg);
    snprintf(l->message, sizeof l->message, "%s", msg);
    return l->result[0];
}

static void test_rank_that_leaves_fails_peers_fast(void **state)
{
    (void)state;
    leaving l = {0};
    sumo_result res[2];
    assert_int_equal(sumo_threads_run(2, leaver_or_stayer, &l, res), SUMO_ERR_PEER_FAILURE);
    assert_int_equal(res[1], SUMO_SUCCESS);
    /* Not TIMEOUT: the leaving rank's abort, not the 60 s deadline, ended the wait. */
    assert_int_equal(res[0], SUMO_ERR_PEER_FAILURE);
    assert_non_null(strstr(l.message, "rank 1"));
}

/*
 * Fails on a threads transport that aborts every wait in the group as soon as any rank
 * destroys its handle, also a wait on a peer that is still there (seen with Adasum over
 * point-to-point messages: rank 0, still sending the result to rank 1, failed with "rank 2
 * aborted the group" because rank 2 got its copy first and left).
 *
 * A rank that has returned from its last collective and leaves (sumo_threads_run destroys its
 * handle as soon as its function returns) must not fail that collective on the peers still
 * finishing it: they wait on each other, not on the rank that left (sumo.h: destroying a handle
 * fails the peers "still waiting on it"). Each rank makes two allreduces and returns; the
 * second is the one a leaving peer could break. Repeated, since whether a peer is still inside
 * the collective when another leaves is up to the scheduler; a correct library passes every
 * run.
 */
#define LEAVE_MAXP 5
#define LEAVE_N 64
#define LEAVE_RUNS 20

typedef struct leave_run {
    sumo_op op;
    sumo_algorithm algo;
    float in[LEAVE_N], out[LEAVE_MAXP][LEAVE_N];
} leave_run;

static sumo_result leave_body(sumo_comm *comm, int rank, void *arg)
{
    leave_run *l = arg;
    sumo_comm_set_timeout(comm, 20);
    sumo_result r = sumo_comm_set_param(comm, SUMO_PARAM_ALGORITHM, l->algo);
    if (r == SUMO_SUCCESS)
        r = sumo_allreduce(l->in, l->out[rank], LEAVE_N, SUMO_FLOAT32, l->op, comm);
    if (r != SUMO_SUCCESS) return r;
    memcpy(l->out[rank], l->in, sizeof l->in);
    return sumo_allreduce(l->out[rank], l->out[rank], LEAVE_N, SUMO_FLOAT32, l->op, comm);
}

static void test_rank_leaving_after_its_last_collective(void **state)
{
    (void)state;
    static const struct {
        sumo_op op;
        sumo_algorithm algo;
        int size;
        const char *name;
    } cases[] = {
        {SUMO_OP_ADASUM, SUMO_ALGORITHM_RING, 3, "adasum, point to point, P=3"},
        {SUMO_OP_ADASUM, SUMO_ALGORITHM_RING, 4, "adasum, point to point, P=4"},
        {SUMO_OP_ADASUM, SUMO_ALGORITHM_RING, 5, "adasum, point to point, P=5"},
        {SUMO_OP_ADASUM, SUMO_ALGORITHM_AUTO, 3, "adasum, direct, P=3"},
        {SUMO_OP_SUM, SUMO_ALGORITHM_RING, 3, "ring sum, P=3"},
    };
    leave_run l;
    /* Eighths on every rank: Adasum(a, a) = a and the sum P a, both exact. */
    for (int i = 0; i < LEAVE_N; i++) l.in[i] = (float)(i % 9 - 4) / 8.0f;
    int failed = 0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int bad_runs = 0;
        for (int run = 0; run < LEAVE_RUNS; run++) {
            l.op = cases[c].op;
            l.algo = cases[c].algo;
            sumo_result res[LEAVE_MAXP];
            sumo_threads_run(cases[c].size, leave_body, &l, res);
            float k = cases[c].op == SUMO_OP_SUM ? (float)cases[c].size : 1.0f;
            int bad = 0;
            for (int r = 0; r < cases[c].size; r++) {
                bad += res[r] != SUMO_SUCCESS;
                for (int i = 0; i < LEAVE_N && res[r] == SUMO_SUCCESS; i++)
                    bad += l.out[r][i] != k * l.in[i];
            }
            bad_runs += bad != 0;
        }
        if (bad_runs)
            print_error("%s: %d of %d runs failed\n", cases[c].name, bad_runs, LEAVE_RUNS);
        failed += bad_runs;
    }
    assert_int_equal(failed, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_count_mismatch),
        cmocka_unit_test(test_dtype_mismatch),
        cmocka_unit_test(test_op_mismatch),
        cmocka_unit_test(test_root_mismatch),
        cmocka_unit_test(test_collective_mismatch),
        cmocka_unit_test(test_null_buffer_on_one_rank),
        cmocka_unit_test(test_overlapping_buffers),
        cmocka_unit_test(test_unknown_dtype),
        cmocka_unit_test(test_count_zero_with_null),
        cmocka_unit_test(test_rank_that_never_arrives_times_out),
        cmocka_unit_test(test_rank_that_leaves_fails_peers_fast),
        cmocka_unit_test(test_rank_leaving_after_its_last_collective),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
