/*
 * sumo_elastic (sumo_elastic.h): an elastic job's membership through a store. Ranks are
 * threads, each with its own handle on sumo's directory store and its own object, as
 * processes would have; their communicators are TCP over the loopback. A rank "killed" stops
 * everything (its heart, its connections) without a word to the others. What must hold: the
 * survivors of a kill shrink to one membership in the old order with the smallest value they
 * brought, and their next allreduce sums exactly their contributions; a joiner that takes a
 * ticket is taken in at the members' next commit, after them; a ticket whose holder never
 * comes fails that grow only, and the members go on as they were and count it no more; bad
 * options are refused by name.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include "sumo_elastic.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NR 4
#define LIVENESS_S 0.4
#define TIMEOUT_S 3.0

static char dir[256];

typedef struct job {
    int members;        /* the first membership's size */
    int killed;         /* a rank that stops after its first commit; -1 for none */
    int joiners;        /* threads that join at the members' commit point */
    bool ghost_ticket;  /* a ticket taken before anyone joins, by no one who comes */
    const char *absent[4]; /* keys the store must no longer hold once the job ends */
    const char *present[4]; /* and keys it must still hold */
    sumo_result result[NR];
    int final_size[NR], final_rank[NR];
    double sum[NR];     /* the last allreduce of each rank's 1 << (its first rank) */
    uint64_t agreed[NR];
    int old_ranks[NR][NR];
    int joined[NR];
    double shrink_s[NR];
    char error[NR][512];
} job;

typedef struct worker {
    job *j;
    int rank; /* first rank; >= members: a joiner */
} worker;

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void options_for(sumo_elastic_options *o, sumo_store *st, job *j, int r)
{
    sumo_elastic_options_default(o);
    o->store = st;
    o->key_prefix = "job/";
    o->rank = r;
    o->size = j->members;
    o->address = "127.0.0.1";
    o->liveness_s = LIVENESS_S;
    o->timeout_s = TIMEOUT_S;
    o->error = j->error[r];
    o->error_bytes = sizeof j->error[r];
}

/* Every rank's contribution is 1 << its first rank: a sum names who took part. */
static sumo_result sum_of(sumo_elastic *e, int first, double *sum)
{
    sumo_comm *comm = NULL;
    sumo_elastic_comm(e, &comm);
    double mine = (double)(1 << first);
    return sumo_allreduce(&mine, sum, 1, SUMO_FLOAT64, SUMO_OP_SUM, comm);
}

static void say_error(job *j, int r, sumo_elastic *e)
{
    const char *msg = "";
    if (e) sumo_elastic_error_message(e, &msg);
    snprintf(j->error[r], sizeof j->error[r], "%s", msg);
}

/* Steps (an allreduce and a commit) until every awaited joiner came and three steps passed
 * since the last change of membership, the same count on every rank; then the final sum. */
static void run_steps(job *j, int r, sumo_elastic *e, int waiting)
{
    int joiners = 0, calm = 0;
    double sum = 0;
    for (int step = 0; step < 200; step++) {
        sumo_result res = sum_of(e, r, &sum);
        if (res == SUMO_SUCCESS) res = sumo_elastic_commit(e, &joiners);
        if (r == j->killed) {
            /* Killed: no goodbye (no close, no keys removed by hand), the heart stops. */
            j->result[r] = SUMO_ERR_PEER_FAILURE;
            return;
        }
        if (res == SUMO_ERR_PEER_FAILURE || res == SUMO_ERR_TIMEOUT) {
            sumo_shrink_info info = {.struct_size = sizeof info, .old_ranks = j->old_ranks[r]};
            double t0 = now_s();
            j->result[r] = sumo_elastic_shrink(e, 100 - (uint64_t)r, &info);
            j->shrink_s[r] = now_s() - t0;
            j->agreed[r] = info.value;
            if (j->result[r] != SUMO_SUCCESS) return;
            calm = 0;
            continue;
        }
        if ((j->result[r] = res) != SUMO_SUCCESS) return;
        if (joiners > waiting) { /* a ticket counted twice, or one nobody took */
            j->result[r] = SUMO_ERR_INTERNAL;
            snprintf(j->error[r], sizeof j->error[r], "%d joiners, %d expected", joiners, waiting);
            return;
        }
        if (joiners > 0) {
            if ((j->result[r] = sumo_elastic_grow(e, joiners, &j->joined[r])) != SUMO_SUCCESS)
                return;
            if (j->joined[r] == 0) say_error(j, r, e);
            waiting -= joiners;
            calm = 0;
            continue;
        }
        if (waiting == 0 && ++calm >= 3) break;
        nanosleep(&(struct timespec){0, 20 * 1000000L}, NULL);
    }
    j->result[r] = sum_of(e, r, &sum);
    j->sum[r] = sum;
    sumo_comm *comm = NULL;
    sumo_elastic_comm(e, &comm);
    sumo_comm_rank(comm, &j->final_rank[r]);
    sumo_comm_size(comm, &j->final_size[r]);
}

/* A rank of the first membership (create) or one that comes later (join). */
static void *worker_run(void *p)
{
    worker *w = p;
    job *j = w->j;
    int r = w->rank;
    bool joins = r >= j->members;
    sumo_store *st = NULL;
    sumo_elastic *e = NULL;
    sumo_elastic_options o;
    if ((j->result[r] = sumo_store_create_dir(dir, &st)) != SUMO_SUCCESS) return NULL;
    options_for(&o, st, j, r);
    j->result[r] = joins ? sumo_elastic_join(&o, &e) : sumo_elastic_create(&o, &e);
    if (j->result[r] == SUMO_SUCCESS)
        run_steps(j, r, e, joins ? 0 : j->joiners + (j->ghost_ticket ? 1 : 0));
    if (j->result[r] != SUMO_SUCCESS && e && r != j->killed && j->error[r][0] == '\0')
        say_error(j, r, e);
    sumo_elastic_destroy(e);
    sumo_store_destroy_dir(st, 0);
    return NULL;
}

static void fresh_dir(void)
{
    const char *base = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/sumo-elastic.XXXXXX", base && *base ? base : "/tmp");
    assert_non_null(mkdtemp(dir));
}

static void run_job(job *j)
{
    fresh_dir();
    if (j->ghost_ticket) { /* a ticket's key as a joiner writes it, by a holder never seen */
        sumo_store *st = NULL;
        assert_int_equal(sumo_store_create_dir(dir, &st), SUMO_SUCCESS);
        assert_int_equal(st->set_once(st->ctx, "job/join/ticket/1", "ghost", 5), SUMO_SUCCESS);
        sumo_store_destroy_dir(st, 0);
    }
    pthread_t t[NR];
    worker w[NR];
    int all = j->members + j->joiners;
    for (int r = 0; r < all; r++) {
        w[r] = (worker){j, r};
        assert_int_equal(pthread_create(&t[r], NULL, worker_run, &w[r]), 0);
    }
    for (int r = 0; r < all; r++) pthread_join(t[r], NULL);
    sumo_store *st = NULL;
    assert_int_equal(sumo_store_create_dir(dir, &st), SUMO_SUCCESS);
    for (int k = 0; k < 4; k++) {
        char value[64];
        size_t bytes = sizeof value;
        if (j->absent[k] && st->get(st->ctx, j->absent[k], value, &bytes, 0) != SUMO_ERR_TIMEOUT)
            fail_msg("the store still holds %s", j->absent[k]);
        bytes = sizeof value;
        if (j->present[k] && st->get(st->ctx, j->present[k], value, &bytes, 0) != SUMO_SUCCESS)
            fail_msg("the store lost %s", j->present[k]);
    }
    sumo_store_destroy_dir(st, 1);
}

static void expect_ok(const job *j, int r)
{
    if (j->result[r] != SUMO_SUCCESS)
        fail_msg("rank %d: %s: %s", r, sumo_result_name(j->result[r]), j->error[r]);
}

static void test_kill_survivors_shrink_and_agree(void **state)
{
    (void)state;
    /* The lost member's beat and the agreement's entries leave the store with the shrink
     * (making 1); the verdict stays, for a process left out that comes late. */
    job j = {.members = 4, .killed = 2,
             .absent = {"job/a0/alive/2", "job/a1/agree/in/2", "job/a1/agree/in/0",
                        "job/a0/alive/0"},
             .present = {"job/a1/agree/verdict"}};
    run_job(&j);
    for (int r = 0; r < 4; r++) {
        if (r == 2) continue;
        expect_ok(&j, r);
        assert_int_equal(j.final_size[r], 3);
        assert_int_equal(j.final_rank[r], r < 2 ? r : r - 1);
        assert_true(j.sum[r] == 1 + 2 + 8); /* ranks 0, 1 and 3, nobody else */
        assert_int_equal(j.agreed[r], 100 - 3); /* the smallest brought: rank 3's */
        int want[NR] = {0, 1, 3, -1};
        assert_memory_equal(j.old_ranks[r], want, sizeof want);
        assert_true(j.shrink_s[r] < TIMEOUT_S); /* seen by the heart, not waited out */
    }
}

static void test_grow_by_ticket(void **state)
{
    (void)state;
    job j = {.members = 2, .killed = -1, .joiners = 1};
    run_job(&j);
    if (j.joined[0] != 1) fail_msg("joined %d: %s", j.joined[0], j.error[0]);
    for (int r = 0; r < 3; r++) {
        expect_ok(&j, r);
        if (j.final_size[r] != 3) fail_msg("rank %d: size %d", r, j.final_size[r]);
        assert_int_equal(j.final_rank[r], r); /* the joiner after the members */
        assert_true(j.sum[r] == 1 + 2 + 4);
    }
}

static void test_ticket_holder_never_comes(void **state)
{
    (void)state;
    job j = {.members = 2, .killed = -1, .ghost_ticket = true};
    double t0 = now_s();
    run_job(&j);
    for (int r = 0; r < 2; r++) {
        expect_ok(&j, r);
        assert_int_equal(j.joined[r], 0);
        assert_int_equal(j.final_size[r], 2);
        assert_true(j.sum[r] == 1 + 2);
    }
    assert_true(now_s() - t0 < 4 * TIMEOUT_S); /* one failed grow, not one per commit */
}

static void test_refusals(void **state)
{
    (void)state;
    fresh_dir();
    sumo_store *st = NULL;
    assert_int_equal(sumo_store_create_dir(dir, &st), SUMO_SUCCESS);
    job j = {.members = 2};
    sumo_elastic_options o;
    sumo_elastic *e = (sumo_elastic *)&j;
    options_for(&o, st, &j, 0);
    o.size = 0;
    assert_int_equal(sumo_elastic_create(&o, &e), SUMO_ERR_INVALID_ARGUMENT);
    assert_null(e);
    assert_non_null(strstr(j.error[0], "rank 0 of size 0"));
    o.size = 2;
    o.rank = 2;
    assert_int_equal(sumo_elastic_create(&o, &e), SUMO_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(j.error[0], "rank 2 of size 2"));
    o.rank = 0;
    o.transport = (sumo_elastic_transport)7;
    assert_int_equal(sumo_elastic_create(&o, &e), SUMO_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(j.error[0], "transport 7"));
    o.transport = SUMO_ELASTIC_TCP;
    sumo_store no_once = *st;
    no_once.set_once = NULL;
    o.store = &no_once;
    assert_int_equal(sumo_elastic_join(&o, &e), SUMO_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(j.error[0], "set_once"));
    o.store = st;
    o.liveness_s = -1;
    assert_int_equal(sumo_elastic_create(&o, &e), SUMO_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(j.error[0], "liveness_s -1"));
    o.liveness_s = LIVENESS_S;
    o.struct_size = 16;
    assert_int_equal(sumo_elastic_create(&o, &e), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_elastic_create(NULL, &e), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_elastic_commit(NULL, &j.joined[0]), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_elastic_destroy(NULL), SUMO_SUCCESS);
    o.struct_size = sizeof o;
    /* A joiner made another way than the members (its own making against their TCP) would
     * wait at a meeting they never come to: refused, naming both. */
    char place[128];
    snprintf(place, sizeof place, "sumo-place-2 2 3 1 0 2 1 0");
    assert_int_equal(st->set(st->ctx, "job/join/place/1", place, strlen(place)), SUMO_SUCCESS);
    o.transport = SUMO_ELASTIC_SHM;
    assert_int_equal(sumo_elastic_join(&o, &e), SUMO_ERR_MISMATCH);
    if (!strstr(j.error[0], "over sumo's TCP transport, this process over shared memory"))
        fail_msg("%s", j.error[0]);
    o.transport = SUMO_ELASTIC_TCP;
    /* A place of any other shape is refused before use: rank past the size, a size past the
     * most ranks, bytes after it, not a place at all (tickets 2, 3, 4 and 5). */
    const char *bad[] = {"sumo-place-2 5 3 1 0 2 5 0", "sumo-place-2 2 100000 1 0 2 5 0",
                         "sumo-place-2 2 3 1 0 2 5 0 extra", "garbage"};
    for (int k = 0; k < 4; k++) {
        char key[64];
        snprintf(key, sizeof key, "job/join/place/%d", k + 2);
        assert_int_equal(st->set(st->ctx, key, bad[k], strlen(bad[k])), SUMO_SUCCESS);
        assert_int_equal(sumo_elastic_join(&o, &e), SUMO_ERR_INVALID_ARGUMENT);
        if (!strstr(j.error[0], "is not one")) fail_msg("%s: %s", bad[k], j.error[0]);
    }
    /* join_wait_s bounds the wait for a place (0, the default: until the job closes). */
    o.join_wait_s = -1;
    assert_int_equal(sumo_elastic_join(&o, &e), SUMO_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(j.error[0], "join_wait_s -1"));
    o.join_wait_s = 0.3;
    double waited = now_s();
    assert_int_equal(sumo_elastic_join(&o, &e), SUMO_ERR_TIMEOUT);
    waited = now_s() - waited;
    if (waited < 0.3 || waited > TIMEOUT_S) fail_msg("waited %.2f s for 0.3", waited);
    o.join_wait_s = 0;
    /* A job that closed: a joiner stops waiting at once. */
    o.struct_size = sizeof o;
    assert_int_equal(st->set(st->ctx, "job/join/closed", "1", 1), SUMO_SUCCESS);
    double t0 = now_s();
    assert_int_equal(sumo_elastic_join(&o, &e), SUMO_ERR_PEER_FAILURE);
    assert_true(now_s() - t0 < TIMEOUT_S);
    assert_non_null(strstr(j.error[0], "ended"));
    sumo_store_destroy_dir(st, 1);
}

int main(void)
{
    /* The meetings' own deadline (the TCP transport reads SUMO_TIMEOUT), set before any
     * thread starts. */
    setenv("SUMO_TIMEOUT", "3", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kill_survivors_shrink_and_agree),
        cmocka_unit_test(test_grow_by_ticket),
        cmocka_unit_test(test_ticket_holder_never_comes),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
