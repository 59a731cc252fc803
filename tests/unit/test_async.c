/* Asynchronous allreduce: requests complete in order, test() polls without blocking, a
 * blocking collective issued behind requests waits for them, and start() does not wait for a
 * running request. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "support/harness.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define P 4
#define N 5003
#define REQUESTS 3

typedef struct outcome {
    sumo_result start[P][REQUESTS], wait[P][REQUESTS], blocking[P];
    int polled_done[P];
    float *bufs[P][REQUESTS + 1];
} outcome;

static void async_body(sumo_comm *comm, int rank, int size, void *arg)
{
    (void)size;
    outcome *o = arg;
    sumo_request *req[REQUESTS];
    for (int q = 0; q <= REQUESTS; q++)
        for (int i = 0; i < N; i++) o->bufs[rank][q][i] = (float)(rank * 10 + q + i % 7);
    for (int q = 0; q < REQUESTS; q++)
        o->start[rank][q] = sumo_allreduce_start(o->bufs[rank][q], o->bufs[rank][q], N,
                                                 SUMO_FLOAT32, SUMO_OP_SUM, comm, &req[q]);
    /* Poll the first request to completion without blocking. */
    int done = 0;
    for (long spins = 0; !done && spins < 100000000L; spins++) {
        if (sumo_request_test(req[0], &done) != SUMO_SUCCESS) break;
        if (!done) sched_yield();
    }
    o->polled_done[rank] = done;
    /* Issued behind the requests: must run after them, in the same order on every rank. */
    o->blocking[rank] = sumo_allreduce(o->bufs[rank][REQUESTS], o->bufs[rank][REQUESTS], N,
                                       SUMO_FLOAT32, SUMO_OP_SUM, comm);
    for (int q = 0; q < REQUESTS; q++) o->wait[rank][q] = sumo_request_wait(req[q]);
}

static void test_requests_complete_with_correct_sums(void **state)
{
    (void)state;
    outcome *o = calloc(1, sizeof *o);
    for (int r = 0; r < P; r++)
        for (int q = 0; q <= REQUESTS; q++) o->bufs[r][q] = malloc(N * sizeof(float));
    assert_int_equal(harness_run_threads(P, async_body, o), 0);
    for (int r = 0; r < P; r++) {
        assert_int_equal(o->polled_done[r], 1);
        assert_int_equal(o->blocking[r], SUMO_SUCCESS);
        for (int q = 0; q < REQUESTS; q++) {
            assert_int_equal(o->start[r][q], SUMO_SUCCESS);
            assert_int_equal(o->wait[r][q], SUMO_SUCCESS);
        }
        for (int q = 0; q <= REQUESTS; q++)
            for (int i = 0; i < N; i++) {
                float want = 0;
                for (int k = 0; k < P; k++) want += (float)(k * 10 + q + i % 7);
                assert_true(o->bufs[r][q][i] == want);
            }
    }
    for (int r = 0; r < P; r++)
        for (int q = 0; q <= REQUESTS; q++) free(o->bufs[r][q]);
    free(o);
}

static void test_bad_request_arguments(void **state)
{
    (void)state;
    int done;
    assert_int_equal(sumo_request_wait(NULL), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_request_test(NULL, &done), SUMO_ERR_INVALID_ARGUMENT);
    float x = 1;
    assert_int_equal(sumo_allreduce_start(&x, &x, 1, SUMO_FLOAT32, SUMO_OP_SUM, NULL, NULL),
                     SUMO_ERR_INVALID_ARGUMENT);
}

/* A request's own failure comes back through wait. */
static void failing_body(sumo_comm *comm, int rank, int size, void *arg)
{
    (void)size;
    sumo_result *res = arg;
    float buf[4] = {0};
    sumo_request *req = NULL;
    sumo_result s = sumo_allreduce_start(buf, buf, rank == 0 ? 4 : 3, SUMO_FLOAT32, SUMO_OP_SUM,
                                         comm, &req);
    res[rank] = s == SUMO_SUCCESS ? sumo_request_wait(req) : s;
}

static void test_request_reports_mismatch(void **state)
{
    (void)state;
    sumo_result res[2];
    assert_int_equal(harness_run_threads(2, failing_body, res), 0);
    assert_int_equal(res[0], SUMO_ERR_MISMATCH);
    assert_int_equal(res[1], SUMO_ERR_MISMATCH);
}

/* Destroying the handle with a request not yet waited on: the request completes first and
 * stays waitable, with its result. (Before, wait locked the freed handle's mutex: undefined
 * behaviour that ASan does not see, as the access happens inside libc.) */
typedef struct destroy_run {
    sumo_comm *comms[2];
    float buf[2][N];
    sumo_result started[2], destroyed[2], waited[2];
} destroy_run;

typedef struct destroy_arg {
    destroy_run *run;
    int rank;
} destroy_arg;

static void *destroy_body(void *p)
{
    destroy_arg *a = p;
    destroy_run *d = a->run;
    sumo_request *req = NULL;
    d->started[a->rank] = sumo_allreduce_start(d->buf[a->rank], d->buf[a->rank], N, SUMO_FLOAT32,
                                               SUMO_OP_SUM, d->comms[a->rank], &req);
    d->destroyed[a->rank] = sumo_comm_destroy(d->comms[a->rank]);
    d->waited[a->rank] = d->started[a->rank] == SUMO_SUCCESS ? sumo_request_wait(req) : SUMO_ERR_INTERNAL;
    return NULL;
}

static void test_destroy_before_wait(void **state)
{
    (void)state;
    destroy_run *d = calloc(1, sizeof *d);
    assert_non_null(d);
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < N; i++) d->buf[r][i] = (float)(r + 1) * (float)(i % 5);
    assert_int_equal(sumo_comm_create_threads(2, d->comms), SUMO_SUCCESS);
    pthread_t th[2];
    destroy_arg args[2] = {{d, 0}, {d, 1}};
    for (int r = 0; r < 2; r++) assert_int_equal(pthread_create(&th[r], NULL, destroy_body, &args[r]), 0);
    for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < 2; r++) {
        assert_int_equal(d->started[r], SUMO_SUCCESS);
        assert_int_equal(d->destroyed[r], SUMO_SUCCESS);
        assert_int_equal(d->waited[r], SUMO_SUCCESS);
        for (int i = 0; i < N; i++) assert_true(d->buf[r][i] == 3.0f * (float)(i % 5));
    }
    free(d);
}

/*
 * A blocking collective issued behind a request runs after it. Ranks 0 and 2 start A and at
 * once make a blocking allreduce B; rank 1 starts A and waits for it before B (a valid way to
 * issue the same two calls in the same order). A and B have different counts, so a rank whose
 * B overtook its own queued A pairs its B with rank 1's A: a count mismatch (or wrong sums)
 * instead of two correct results, and A not yet done when B returned. Nothing here depends on
 * timing on a correct library; on one whose blocking call does not wait for the queue, the
 * caller usually takes the handle before the progress thread has picked A up, and the test
 * repeats the exchange so that one such overtaking is enough to fail it.
 */
#define ORDER_P 3
#define ORDER_ITERS 20
#define ORDER_NA 1001
#define ORDER_NB 777

typedef struct order_run {
    float a[ORDER_P][ORDER_NA], b[ORDER_P][ORDER_NB];
    sumo_result start[ORDER_P], blocking[ORDER_P], waited[ORDER_P];
    int a_done_after_b[ORDER_P];
} order_run;

static float order_a(int rank, int i) { return (float)(rank + 1) * (float)(i % 9); }
static float order_b(int rank, int i) { return (float)(10 * rank + i % 4); }

static void order_body(sumo_comm *comm, int rank, int size, void *arg)
{
    (void)size;
    order_run *o = arg;
    sumo_comm_set_timeout(comm, 20); /* a broken order must fail, not hang the suite */
    for (int i = 0; i < ORDER_NA; i++) o->a[rank][i] = order_a(rank, i);
    for (int i = 0; i < ORDER_NB; i++) o->b[rank][i] = order_b(rank, i);
    sumo_request *req = NULL;
    o->start[rank] = sumo_allreduce_start(o->a[rank], o->a[rank], ORDER_NA, SUMO_FLOAT32,
                                          SUMO_OP_SUM, comm, &req);
    if (o->start[rank] != SUMO_SUCCESS) return;
    if (rank == 1) {
        o->waited[rank] = sumo_request_wait(req);
        req = NULL;
        o->a_done_after_b[rank] = 1;
    }
    o->blocking[rank] = sumo_allreduce(o->b[rank], o->b[rank], ORDER_NB, SUMO_FLOAT32,
                                       SUMO_OP_SUM, comm);
    if (req != NULL) {
        /* Read before waiting: B returning means A completed first. */
        sumo_request_test(req, &o->a_done_after_b[rank]);
        o->waited[rank] = sumo_request_wait(req);
    }
}

/* The first thing wrong with one run, or "" (recorded, so the buffers are freed before the
 * test fails). */
static void order_verdict(const order_run *o, int it, char *why, size_t len)
{
    for (int r = 0; r < ORDER_P; r++) {
        if (o->start[r] != SUMO_SUCCESS || o->blocking[r] != SUMO_SUCCESS ||
            o->waited[r] != SUMO_SUCCESS || !o->a_done_after_b[r]) {
            snprintf(why, len, "iteration %d rank %d: start %s, blocking %s, wait %s, A done when "
                     "B returned: %d", it, r, sumo_result_name(o->start[r]),
                     sumo_result_name(o->blocking[r]), sumo_result_name(o->waited[r]),
                     o->a_done_after_b[r]);
            return;
        }
        for (int i = 0; i < ORDER_NA; i++) {
            float want = 0;
            for (int k = 0; k < ORDER_P; k++) want += order_a(k, i);
            if (o->a[r][i] != want) {
                snprintf(why, len, "iteration %d rank %d: A[%d] = %g, want %g", it, r, i,
                         o->a[r][i], want);
                return;
            }
        }
        for (int i = 0; i < ORDER_NB; i++) {
            float want = 0;
            for (int k = 0; k < ORDER_P; k++) want += order_b(k, i);
            if (o->b[r][i] != want) {
                snprintf(why, len, "iteration %d rank %d: B[%d] = %g, want %g", it, r, i,
                         o->b[r][i], want);
                return;
            }
        }
    }
}

static void test_blocking_collective_waits_for_queued_requests(void **state)
{
    (void)state;
    order_run *o = malloc(sizeof *o);
    assert_non_null(o);
    char why[256] = "";
    int ran = 0;
    for (int it = 0; it < ORDER_ITERS && !why[0]; it++) {
        memset(o, 0, sizeof *o);
        ran = harness_run_threads(ORDER_P, order_body, o) == 0;
        if (!ran) break;
        order_verdict(o, it, why, sizeof why);
    }
    free(o);
    assert_true(ran);
    if (why[0]) fail_msg("%s", why);
}

/*
 * Fails on a queue whose start takes the lock the progress thread holds for a whole running
 * collective (the second start then blocks until the first request has finished).
 *
 * sumo_allreduce_start returns at once while an earlier request is still in flight: rank 0
 * starts a large allreduce that rank 1 has not entered (rank 1 waits for a flag that rank 0
 * sets only after its second start has returned), then starts a second one. The second start
 * must succeed without waiting, and the first request must still be incomplete (it cannot
 * complete: rank 1 is not in it). Then rank 1 enters both and both results are checked. The
 * deadline is short so that a start that does block ends in a timeout status, not a hang.
 */
#define INFLIGHT_BIG ((size_t)4 << 20)
#define INFLIGHT_SMALL 1000

typedef struct inflight_run {
    _Atomic int go;
    float *big[2], *small[2];
    sumo_result start_big[2], start_small[2], wait_big[2], wait_small[2];
    int big_done_before_peer[2];
} inflight_run;

static void inflight_body(sumo_comm *comm, int rank, int size, void *arg)
{
    (void)size;
    inflight_run *f = arg;
    sumo_comm_set_timeout(comm, 20);
    sumo_request *big = NULL, *small = NULL;
    if (rank == 1)
        while (!atomic_load_explicit(&f->go, memory_order_acquire))
            nanosleep(&(struct timespec){.tv_nsec = 1000 * 1000}, NULL);
    f->start_big[rank] = sumo_allreduce_start(f->big[rank], f->big[rank], INFLIGHT_BIG,
                                              SUMO_FLOAT32, SUMO_OP_SUM, comm, &big);
    /* Let the progress thread take up the big request, so that it is running, not merely
     * queued, when the second start comes. A correct library passes without this pause; it
     * only makes a start that waits for the running request show. */
    if (rank == 0) nanosleep(&(struct timespec){.tv_nsec = 50 * 1000 * 1000}, NULL);
    f->start_small[rank] = sumo_allreduce_start(f->small[rank], f->small[rank], INFLIGHT_SMALL,
                                                SUMO_FLOAT32, SUMO_OP_SUM, comm, &small);
    if (rank == 0) {
        /* Rank 1 has entered nothing yet, so the big request cannot have completed. */
        if (f->start_big[0] == SUMO_SUCCESS) sumo_request_test(big, &f->big_done_before_peer[0]);
        atomic_store_explicit(&f->go, 1, memory_order_release);
    }
    f->wait_big[rank] =
        f->start_big[rank] == SUMO_SUCCESS ? sumo_request_wait(big) : f->start_big[rank];
    f->wait_small[rank] =
        f->start_small[rank] == SUMO_SUCCESS ? sumo_request_wait(small) : f->start_small[rank];
}

static void test_start_returns_while_request_in_flight(void **state)
{
    (void)state;
    inflight_run *f = calloc(1, sizeof *f);
    assert_non_null(f);
    for (int r = 0; r < 2; r++) {
        f->big[r] = malloc(INFLIGHT_BIG * sizeof(float));
        f->small[r] = malloc(INFLIGHT_SMALL * sizeof(float));
        assert_true(f->big[r] && f->small[r]);
        for (size_t i = 0; i < INFLIGHT_BIG; i++) f->big[r][i] = (float)((r + 1) * (int)(i % 13));
        for (size_t i = 0; i < INFLIGHT_SMALL; i++)
            f->small[r][i] = (float)(r * 100 + (int)(i % 7));
    }
    int ran = harness_run_threads(2, inflight_body, f) == 0;
    /* Recorded first, so the buffers are freed before the test fails. */
    char why[256] = "";
    for (int r = 0; r < 2 && ran && !why[0]; r++)
        if (f->start_big[r] != SUMO_SUCCESS || f->start_small[r] != SUMO_SUCCESS ||
            f->wait_big[r] != SUMO_SUCCESS || f->wait_small[r] != SUMO_SUCCESS)
            snprintf(why, sizeof why, "rank %d: start %s / %s, wait %s / %s", r,
                     sumo_result_name(f->start_big[r]), sumo_result_name(f->start_small[r]),
                     sumo_result_name(f->wait_big[r]), sumo_result_name(f->wait_small[r]));
    if (ran && !why[0] && f->big_done_before_peer[0])
        snprintf(why, sizeof why, "the big request completed before rank 1 entered it");
    for (int r = 0; r < 2 && ran && !why[0]; r++) {
        for (size_t i = 0; i < INFLIGHT_BIG && !why[0]; i++)
            if (f->big[r][i] != (float)(3 * (int)(i % 13)))
                snprintf(why, sizeof why, "rank %d: big[%zu] = %g", r, i, f->big[r][i]);
        for (size_t i = 0; i < INFLIGHT_SMALL && !why[0]; i++)
            if (f->small[r][i] != (float)(100 + 2 * (int)(i % 7)))
                snprintf(why, sizeof why, "rank %d: small[%zu] = %g", r, i, f->small[r][i]);
    }
    for (int r = 0; r < 2; r++) {
        free(f->big[r]);
        free(f->small[r]);
    }
    free(f);
    assert_true(ran);
    if (why[0]) fail_msg("%s", why);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_requests_complete_with_correct_sums),
        cmocka_unit_test(test_bad_request_arguments),
        cmocka_unit_test(test_request_reports_mismatch),
        cmocka_unit_test(test_destroy_before_wait),
        cmocka_unit_test(test_blocking_collective_waits_for_queued_requests),
        cmocka_unit_test(test_start_returns_while_request_in_flight),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
