/*
 * sumo_store_commit (sumo_elastic.h): the members of a new membership keep their communicators
 * only on one outcome in the store. Ranks are threads over sumo's directory store, each with a
 * handle of its own as processes would have. What must hold: every member gets the same
 * answer; "ok" only when every member said it made its own; a member that failed, one that
 * never comes (by its heartbeat, else the deadline) or an outcome already written makes every
 * member drop; each member's own count is gone once the outcome stands; bad options are
 * refused by name.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include "sumo_elastic.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NR 4

typedef struct commit_case {
    char dir[256];
    int size;
    bool absent[NR];   /* never calls */
    bool failed[NR];   /* calls with made 0 */
    double timeout_s;
    double alive_s;    /* > 0: ranks beat under "alive/" (the absent ones never do) */
    _Atomic bool done;
    sumo_result result[NR];
    char error[NR][256];
} commit_case;

typedef struct commit_arg {
    commit_case *c;
    int rank;
} commit_arg;

static void *commit_rank(void *p)
{
    commit_arg *a = p;
    commit_case *c = a->c;
    int r = a->rank;
    sumo_store *store = NULL;
    c->result[r] = sumo_store_create_dir(c->dir, &store);
    if (c->result[r] != SUMO_SUCCESS) return NULL;
    sumo_commit_options o;
    sumo_commit_options_default(&o);
    o.rank = r;
    o.size = c->size;
    o.store = store;
    o.key_prefix = "job/a1/";
    o.made = c->failed[r] ? 0 : 1;
    o.timeout_s = c->timeout_s;
    if (c->alive_s > 0) {
        o.alive_prefix = "alive/";
        o.alive_s = c->alive_s;
    }
    o.error = c->error[r];
    o.error_bytes = sizeof c->error[r];
    c->result[r] = sumo_store_commit(&o);
    sumo_store_destroy_dir(store, 0);
    return NULL;
}

static void *beater(void *p)
{
    commit_case *c = p;
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

static void fresh_case(commit_case *c, int size)
{
    memset(c, 0, sizeof *c);
    const char *base = getenv("TMPDIR");
    snprintf(c->dir, sizeof c->dir, "%s/sumo-commit.XXXXXX", base && *base ? base : "/tmp");
    assert_non_null(mkdtemp(c->dir));
    c->size = size;
    c->timeout_s = 5;
}

static double run_case(commit_case *c)
{
    pthread_t t[NR], beats;
    commit_arg args[NR];
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    atomic_store(&c->done, false);
    if (c->alive_s > 0) assert_int_equal(pthread_create(&beats, NULL, beater, c), 0);
    for (int r = 0; r < c->size; r++) {
        args[r] = (commit_arg){c, r};
        if (!c->absent[r]) assert_int_equal(pthread_create(&t[r], NULL, commit_rank, &args[r]), 0);
    }
    for (int r = 0; r < c->size; r++)
        if (!c->absent[r]) pthread_join(t[r], NULL);
    atomic_store(&c->done, true);
    if (c->alive_s > 0) pthread_join(beats, NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
}

/* What the store holds under key ("" when absent). */
static void stored(const commit_case *c, const char *key, char *value, size_t bytes)
{
    sumo_store *store = NULL;
    assert_int_equal(sumo_store_create_dir(c->dir, &store), SUMO_SUCCESS);
    size_t n = bytes - 1;
    if (store->get(store->ctx, key, value, &n, 0) != SUMO_SUCCESS) n = 0;
    value[n] = '\0';
    sumo_store_destroy_dir(store, 0);
}

static void remove_case(commit_case *c)
{
    sumo_store *store = NULL;
    assert_int_equal(sumo_store_create_dir(c->dir, &store), SUMO_SUCCESS);
    assert_int_equal(sumo_store_destroy_dir(store, 1), SUMO_SUCCESS);
}

/* Every member that called got `want`. */
static void expect_all(const commit_case *c, sumo_result want)
{
    for (int r = 0; r < c->size; r++)
        if (!c->absent[r] && c->result[r] != want)
            fail_msg("rank %d: %s, not %s (%s)", r, sumo_result_name(c->result[r]),
                     sumo_result_name(want), c->error[r]);
}

static void test_all_made_keep(void **state)
{
    (void)state;
    commit_case c;
    fresh_case(&c, 4);
    run_case(&c);
    expect_all(&c, SUMO_SUCCESS);
    char v[16];
    stored(&c, "job/a1/outcome", v, sizeof v);
    assert_string_equal(v, "ok");
    for (int r = 0; r < c.size; r++) { /* each removed its own count */
        char key[32];
        snprintf(key, sizeof key, "job/a1/made/%d", r);
        stored(&c, key, v, sizeof v);
        assert_string_equal(v, "");
    }
    remove_case(&c);
}

static void test_one_failed_all_drop(void **state)
{
    (void)state;
    commit_case c;
    fresh_case(&c, 4);
    c.failed[2] = true;
    double took = run_case(&c);
    expect_all(&c, SUMO_ERR_PEER_FAILURE);
    assert_true(took < c.timeout_s); /* the failure is told, not waited out */
    assert_non_null(strstr(c.error[2], "failed to make"));
    char v[16];
    stored(&c, "job/a1/outcome", v, sizeof v);
    assert_string_equal(v, "fail");
    remove_case(&c);
}

static void test_absent_dead_by_heartbeat(void **state)
{
    (void)state;
    commit_case c;
    fresh_case(&c, 3);
    c.absent[1] = true;
    c.alive_s = 0.2;
    double took = run_case(&c);
    expect_all(&c, SUMO_ERR_PEER_FAILURE);
    assert_true(took < 2); /* alive_s, not the 5 s deadline */
    /* Whoever decided first names the lost one (the others adopt its outcome). */
    assert_true(strstr(c.error[0], "member 1's heartbeat") || strstr(c.error[2], "member 1's heartbeat"));
    remove_case(&c);
}

static void test_absent_without_heartbeats_deadline(void **state)
{
    (void)state;
    commit_case c;
    fresh_case(&c, 3);
    c.absent[2] = true;
    c.timeout_s = 0.3;
    double took = run_case(&c);
    expect_all(&c, SUMO_ERR_PEER_FAILURE);
    assert_true(took >= 0.3);
    remove_case(&c);
}

static void test_outcome_in_store_stands(void **state)
{
    (void)state;
    commit_case c;
    fresh_case(&c, 2);
    sumo_store *store = NULL;
    assert_int_equal(sumo_store_create_dir(c.dir, &store), SUMO_SUCCESS);
    assert_int_equal(store->set(store->ctx, "job/a1/outcome", "fail", 4), SUMO_SUCCESS);
    sumo_store_destroy_dir(store, 0);
    run_case(&c); /* both made theirs, but a member came late: the fail stands */
    expect_all(&c, SUMO_ERR_PEER_FAILURE);
    remove_case(&c);
}

static void test_refusals(void **state)
{
    (void)state;
    commit_case c;
    fresh_case(&c, 1);
    sumo_store *store = NULL;
    assert_int_equal(sumo_store_create_dir(c.dir, &store), SUMO_SUCCESS);
    char err[256];
    sumo_commit_options o;
    sumo_commit_options_default(&o);
    o.store = store;
    o.key_prefix = "p/";
    o.size = 1;
    o.error = err;
    o.error_bytes = sizeof err;
    o.rank = 1;
    assert_int_equal(sumo_store_commit(&o), SUMO_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "rank 1 of 1"));
    o.rank = 0;
    o.made = 2;
    assert_int_equal(sumo_store_commit(&o), SUMO_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "made is 2"));
    o.made = 1;
    sumo_store no_once = *store;
    no_once.set_once = NULL;
    o.store = &no_once;
    assert_int_equal(sumo_store_commit(&o), SUMO_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "set_once"));
    o.store = store;
    assert_int_equal(store->set(store->ctx, "p/outcome", "maybe", 5), SUMO_SUCCESS);
    assert_int_equal(sumo_store_commit(&o), SUMO_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "not an outcome"));
    o.struct_size = 8;
    assert_int_equal(sumo_store_commit(&o), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_store_commit(NULL), SUMO_ERR_INVALID_ARGUMENT);
    sumo_store_destroy_dir(store, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_all_made_keep),
        cmocka_unit_test(test_one_failed_all_drop),
        cmocka_unit_test(test_absent_dead_by_heartbeat),
        cmocka_unit_test(test_absent_without_heartbeats_deadline),
        cmocka_unit_test(test_outcome_in_store_stands),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
