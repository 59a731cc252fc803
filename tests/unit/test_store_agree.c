/*
 * sumo_store_agree (sumo_elastic.h): the survivors' agreement through a store alone. Ranks are
 * threads over sumo's directory store, each with its own handle as processes would have; a
 * rank lost is one that never calls, a decider that dies is one whose entry the test writes by
 * hand. What must hold whatever the timing: every rank that succeeds holds the same verdict,
 * the members are those that came (in the old order, numbered from 0), the value is the
 * smallest they brought, a rank left out is told so, and a verdict already in the store
 * stands. The dir store's set_once is checked on its own.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include "sumo_elastic.h"

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NR 5
#define TIMEOUT_S 0.25

typedef struct agree_case {
    char dir[256];
    const char *prefix;
    int size;
    bool absent[NR];  /* never calls */
    int delay_ms[NR]; /* calls this late */
    bool spoil[NR];   /* its entry reads as garbage (written over by someone else) */
    double timeout_s;
    double alive_s;   /* > 0: ranks beat under "alive/" (the absent ones never do) */
    _Atomic bool done;
    sumo_result result[NR];
    sumo_shrink_info info[NR];
    int old_ranks[NR][NR];
    char error[NR][256];
} agree_case;

typedef struct agree_arg {
    agree_case *c;
    int rank;
} agree_arg;

static uint64_t value_of(int r) { return 1000 - 10 * (uint64_t)r; }

/* A store whose set of a rank's entry writes garbage in its place, as a writer that reached
 * the store after the rank would leave it. */
typedef struct spoiling_store {
    sumo_store store;
    const sumo_store *inner;
} spoiling_store;

static sumo_result spoil_set(void *ctx, const char *k, const void *v, size_t n)
{
    const spoiling_store *s = ctx;
    if (strstr(k, "/in/") != NULL) return s->inner->set(s->inner->ctx, k, "1x\xff", 3);
    return s->inner->set(s->inner->ctx, k, v, n);
}

static sumo_result spoil_get(void *ctx, const char *k, void *v, size_t *n, int64_t deadline)
{
    const spoiling_store *s = ctx;
    return s->inner->get(s->inner->ctx, k, v, n, deadline);
}

static sumo_result spoil_set_once(void *ctx, const char *k, const void *v, size_t n)
{
    const spoiling_store *s = ctx;
    return s->inner->set_once(s->inner->ctx, k, v, n);
}

static void *agree_rank(void *p)
{
    agree_arg *a = p;
    agree_case *c = a->c;
    int r = a->rank;
    sumo_store *store = NULL;
    c->result[r] = sumo_store_create_dir(c->dir, &store);
    if (c->result[r] != SUMO_SUCCESS) return NULL;
    if (c->delay_ms[r] > 0)
        nanosleep(&(struct timespec){c->delay_ms[r] / 1000, (c->delay_ms[r] % 1000) * 1000000L}, NULL);
    sumo_agree_options o;
    sumo_agree_options_default(&o);
    o.rank = r;
    o.size = c->size;
    o.value = value_of(r);
    o.store = store;
    spoiling_store spoiled = {.store = {.struct_size = sizeof spoiled.store, .set = spoil_set,
                                        .get = spoil_get, .set_once = spoil_set_once},
                              .inner = store};
    spoiled.store.ctx = &spoiled;
    if (c->spoil[r]) o.store = &spoiled.store;
    o.key_prefix = c->prefix;
    o.timeout_s = c->timeout_s;
    if (c->alive_s > 0) {
        o.alive_prefix = "alive/";
        o.alive_s = c->alive_s;
    }
    o.error = c->error[r];
    o.error_bytes = sizeof c->error[r];
    c->info[r] = (sumo_shrink_info){.struct_size = sizeof c->info[r], .old_ranks = c->old_ranks[r]};
    c->result[r] = sumo_store_agree(&o, &c->info[r]);
    sumo_store_destroy_dir(store, 0);
    return NULL;
}

static void fresh_case(agree_case *c, int size)
{
    memset(c, 0, sizeof *c);
    const char *base = getenv("TMPDIR");
    snprintf(c->dir, sizeof c->dir, "%s/sumo-agree.XXXXXX", base && *base ? base : "/tmp");
    assert_non_null(mkdtemp(c->dir));
    c->prefix = "job/shrink1/";
    c->size = size;
    c->timeout_s = TIMEOUT_S;
}

/* The processes' heartbeats: every rank that is not absent, every 10 ms, until the case ends
 * (a late rank beats while it is yet to come, as a process busy elsewhere does). */
static void *beater(void *p)
{
    agree_case *c = p;
    sumo_store *store = NULL;
    if (sumo_store_create_dir(c->dir, &store) != SUMO_SUCCESS) return NULL;
    for (unsigned n = 0; !atomic_load(&c->done); n++) {
        for (int r = 0; r < c->size; r++) {
            if (c->absent[r]) continue;
            char key[32], value[16];
            snprintf(key, sizeof key, "alive/%d", r);
            int len = snprintf(value, sizeof value, "%u", n);
            store->set(store->ctx, key, value, (size_t)len);
        }
        nanosleep(&(struct timespec){0, 10 * 1000000L}, NULL);
    }
    sumo_store_destroy_dir(store, 0);
    return NULL;
}

static void run_case(agree_case *c)
{
    pthread_t t[NR], beats;
    agree_arg args[NR];
    atomic_store(&c->done, false);
    if (c->alive_s > 0) assert_int_equal(pthread_create(&beats, NULL, beater, c), 0);
    for (int r = 0; r < c->size; r++) {
        args[r] = (agree_arg){c, r};
        if (!c->absent[r]) assert_int_equal(pthread_create(&t[r], NULL, agree_rank, &args[r]), 0);
    }
    for (int r = 0; r < c->size; r++)
        if (!c->absent[r]) pthread_join(t[r], NULL);
    atomic_store(&c->done, true);
    if (c->alive_s > 0) pthread_join(beats, NULL);
}

static double seconds_since(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) + (double)(t.tv_nsec - t0->tv_nsec) / 1e9;
}

static void remove_case(agree_case *c)
{
    sumo_store *store = NULL;
    assert_int_equal(sumo_store_create_dir(c->dir, &store), SUMO_SUCCESS);
    assert_int_equal(sumo_store_destroy_dir(store, 1), SUMO_SUCCESS);
}

/* Every rank that called got the verdict whose members are `in` (a mask of old ranks). */
static void expect_verdict(const agree_case *c, unsigned in)
{
    int size = 0;
    uint64_t smallest = UINT64_MAX;
    for (int r = 0; r < c->size; r++)
        if (in & (1u << r)) {
            size++;
            if (value_of(r) < smallest) smallest = value_of(r);
        }
    for (int r = 0; r < c->size; r++) {
        if (c->absent[r]) continue;
        if (!(in & (1u << r))) {
            assert_int_equal(c->result[r], SUMO_ERR_PEER_FAILURE);
            assert_non_null(strstr(c->error[r], "left out"));
            continue;
        }
        if (c->result[r] != SUMO_SUCCESS) fail_msg("rank %d: %s", r, c->error[r]);
        assert_int_equal(c->info[r].size, size);
        assert_int_equal(c->info[r].value, smallest);
        int n = 0, mine = -1;
        for (int k = 0; k < c->size; k++)
            if (in & (1u << k)) {
                if (k == r) mine = n;
                assert_int_equal(c->old_ranks[r][n++], k);
            }
        for (; n < c->size; n++) assert_int_equal(c->old_ranks[r][n], -1);
        assert_int_equal(c->info[r].rank, mine);
    }
}

static void put(const agree_case *c, const char *suffix, const char *value)
{
    sumo_store *store = NULL;
    char key[300];
    snprintf(key, sizeof key, "%s%s", c->prefix, suffix);
    assert_int_equal(sumo_store_create_dir(c->dir, &store), SUMO_SUCCESS);
    assert_int_equal(store->set(store->ctx, key, value, strlen(value)), SUMO_SUCCESS);
    sumo_store_destroy_dir(store, 0);
}

static void test_all_come(void **state)
{
    (void)state;
    agree_case c;
    fresh_case(&c, 4);
    run_case(&c);
    expect_verdict(&c, 0xF);
    remove_case(&c);
}

static void test_one_lost(void **state)
{
    (void)state;
    agree_case c;
    fresh_case(&c, 5);
    c.absent[2] = true;
    run_case(&c);
    expect_verdict(&c, 0x1B);
    remove_case(&c);
}

static void test_rank_zero_lost(void **state)
{
    (void)state;
    agree_case c;
    fresh_case(&c, 3);
    c.absent[0] = true;
    run_case(&c);
    expect_verdict(&c, 0x6);
    remove_case(&c);
}

/* Rank 0 came (its entry is there) and died before deciding, and rank 2 is lost: rank 1 takes
 * over. Rank 0 is a member (it came); the caller finds it dead making the next group. */
static void test_decider_dies_after_coming(void **state)
{
    (void)state;
    agree_case c;
    fresh_case(&c, 4);
    c.absent[0] = c.absent[2] = true;
    char v0[32];
    snprintf(v0, sizeof v0, "%llu", (unsigned long long)value_of(0));
    put(&c, "in/0", v0);
    run_case(&c);
    for (int r = 1; r < 4; r += 2) {
        if (c.result[r] != SUMO_SUCCESS) fail_msg("rank %d: %s", r, c.error[r]);
        assert_int_equal(c.info[r].size, 3);
        assert_int_equal(c.info[r].value, value_of(3));
        assert_int_equal(c.old_ranks[r][0], 0);
        assert_int_equal(c.old_ranks[r][1], 1);
        assert_int_equal(c.old_ranks[r][2], 3);
    }
    assert_int_equal(c.info[1].rank, 1);
    assert_int_equal(c.info[3].rank, 2);
    remove_case(&c);
}

/* With heartbeats, the lost ranks (the decider, which came and died, and one that never came)
 * are out once their beat has stood still for alive_s: the survivors agree long before the
 * timeout, which would otherwise be what a lost rank costs. */
static void test_dead_by_heartbeat(void **state)
{
    (void)state;
    agree_case c;
    fresh_case(&c, 5);
    c.timeout_s = 60;
    c.alive_s = 0.1;
    c.absent[0] = c.absent[3] = true;
    char v0[32];
    snprintf(v0, sizeof v0, "%llu", (unsigned long long)value_of(0));
    put(&c, "in/0", v0); /* the decider came, then died; rank 3 never came */
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    run_case(&c);
    double took = seconds_since(&t0);
    expect_verdict(&c, 0x16);
    if (took > c.timeout_s / 4) fail_msg("the lost ranks cost %.1f s: the timeout, not their beat", took);
    remove_case(&c);
}

/* A rank that is late but beating is waited for (it is not taken for dead) and is a member. */
static void test_late_but_beating_waited_for(void **state)
{
    (void)state;
    agree_case c;
    fresh_case(&c, 3);
    c.timeout_s = 60;
    c.alive_s = 0.1;
    c.delay_ms[1] = 400;
    run_case(&c);
    expect_verdict(&c, 0x7);
    remove_case(&c);
}

/* A rank that comes after the others agreed without it is told it was left out. */
static void test_late_rank_left_out(void **state)
{
    (void)state;
    agree_case c;
    fresh_case(&c, 3);
    c.absent[2] = true;
    run_case(&c);
    expect_verdict(&c, 0x3);
    agree_arg late = {&c, 2};
    agree_rank(&late);
    assert_int_equal(c.result[2], SUMO_ERR_PEER_FAILURE);
    assert_non_null(strstr(c.error[2], "left out"));
    remove_case(&c);
}

/* A verdict another decider wrote first stands for everyone, even one that leaves a caller out:
 * each rank adopts the verdict in the store, never its own view. */
static void test_verdict_in_store_stands(void **state)
{
    (void)state;
    agree_case c;
    fresh_case(&c, 3);
    put(&c, "verdict", "sumo-agree-1 7 3 3");
    run_case(&c);
    assert_int_equal(c.result[2], SUMO_ERR_PEER_FAILURE);
    for (int r = 0; r < 2; r++) {
        if (c.result[r] != SUMO_SUCCESS) fail_msg("rank %d: %s", r, c.error[r]);
        assert_int_equal(c.info[r].size, 2);
        assert_int_equal(c.info[r].rank, r);
        assert_int_equal(c.info[r].value, 7);
    }
    remove_case(&c);
}

/* Garbage where a rank's entry should be: that rank is out of the verdict for every rank, one
 * outcome for all (no rank fails on the garbage while another decides without it). */
static void test_garbage_entry_one_outcome(void **state)
{
    (void)state;
    agree_case c;
    fresh_case(&c, 3);
    c.spoil[1] = true;
    run_case(&c);
    for (int r = 0; r < 3; r++)
        print_message("rank %d: %s %s\n", r, sumo_result_name(c.result[r]), c.error[r]);
    expect_verdict(&c, 0x5);
    remove_case(&c);
}

static sumo_result agree_alone(agree_case *c, const sumo_store *store, int rank, int size,
                               char *err, size_t errlen)
{
    sumo_agree_options o;
    sumo_agree_options_default(&o);
    o.rank = rank;
    o.size = size;
    o.store = store;
    o.key_prefix = c->prefix;
    o.timeout_s = TIMEOUT_S;
    o.error = err;
    o.error_bytes = errlen;
    sumo_shrink_info info = {.struct_size = sizeof info};
    return sumo_store_agree(&o, &info);
}

static void test_refusals(void **state)
{
    (void)state;
    agree_case c;
    fresh_case(&c, 2);
    sumo_store *store = NULL;
    assert_int_equal(sumo_store_create_dir(c.dir, &store), SUMO_SUCCESS);
    char err[256];
    assert_int_equal(sumo_store_agree(NULL, NULL), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(agree_alone(&c, store, 2, 2, err, sizeof err), SUMO_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "rank 2 of 2"));
    sumo_store no_once = *store;
    no_once.set_once = NULL;
    assert_int_equal(agree_alone(&c, &no_once, 0, 1, err, sizeof err), SUMO_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "set_once"));

    put(&c, "verdict", "sumo-agree-1 7 3 3"); /* of 3 ranks; these have 2 */
    assert_int_equal(agree_alone(&c, store, 0, 2, err, sizeof err), SUMO_ERR_MISMATCH);
    c.prefix = "job/shrink2/";
    put(&c, "verdict", "not a verdict at all");
    assert_int_equal(agree_alone(&c, store, 0, 2, err, sizeof err), SUMO_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "not a verdict"));
    c.prefix = "job/shrink3/";
    /* Garbage for rank 1's entry leaves rank 1 out (test_garbage_entry_one_outcome): rank 0
     * decides without waiting out the deadline. */
    put(&c, "in/1", "12x");
    assert_int_equal(agree_alone(&c, store, 0, 2, err, sizeof err), SUMO_SUCCESS);
    sumo_store_destroy_dir(store, 0);
    remove_case(&c);
}

static void test_dir_store_set_once(void **state)
{
    (void)state;
    agree_case c;
    fresh_case(&c, 1);
    sumo_store *store = NULL;
    assert_int_equal(sumo_store_create_dir(c.dir, &store), SUMO_SUCCESS);
    assert_int_equal(store->set_once(store->ctx, "k/1", "first", 5), SUMO_SUCCESS);
    assert_int_equal(store->set_once(store->ctx, "k/1", "second!", 7), SUMO_SUCCESS);
    char value[16];
    size_t n = sizeof value;
    assert_int_equal(store->get(store->ctx, "k/1", value, &n, 0), SUMO_SUCCESS);
    assert_int_equal(n, 5);
    assert_memory_equal(value, "first", 5);
    sumo_store_destroy_dir(store, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_all_come),
        cmocka_unit_test(test_one_lost),
        cmocka_unit_test(test_rank_zero_lost),
        cmocka_unit_test(test_decider_dies_after_coming),
        cmocka_unit_test(test_dead_by_heartbeat),
        cmocka_unit_test(test_late_but_beating_waited_for),
        cmocka_unit_test(test_late_rank_left_out),
        cmocka_unit_test(test_verdict_in_store_stands),
        cmocka_unit_test(test_garbage_entry_one_outcome),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_dir_store_set_once),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
