/* Asynchronous allreduce: requests complete in order, test() polls without blocking, and a
 * blocking collective issued behind requests waits for them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "support/harness.h"

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_requests_complete_with_correct_sums),
        cmocka_unit_test(test_bad_request_arguments),
        cmocka_unit_test(test_request_reports_mismatch),
        cmocka_unit_test(test_destroy_before_wait),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
