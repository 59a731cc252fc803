/*
 * The heartbeat reader (transport/heartbeat.h) against verdicts worked out by hand, on a
 * store of the test's and a clock the test moves: a rank is dead once the beat read has stood
 * still (or been absent) for alive_ns since it was first read so, not a nanosecond before;
 * a beat that moves restarts the count; a beat compares by its first 31 bytes; a store that
 * fails reads as no beat and is reported; slots and the ranks whose keys they read differ.
 * Then the writer (sumo_heart, sumo_elastic.h) on the same store: a count under prefix and
 * rank, its first beat at once, a beat on demand, a move to a new membership's key, a store
 * that fails stopping the thread and said, stop that does not wait out a period, refusals
 * by name; and the reader taking the writer's process for dead once it stops, not before.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include "transport/heartbeat.h"

#include "sumo_elastic.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define KEYS 8

typedef struct fake_store {
    pthread_mutex_t lock; /* the heart's thread sets while the test reads */
    char key[KEYS][SUMO__BEAT_KEY_BYTES];
    char value[KEYS][64];
    int keys;
    sumo_result fail; /* SUMO_SUCCESS: answers */
    int gets;
    char last_key[SUMO__BEAT_KEY_BYTES];
} fake_store;

static sumo_result fake_set(void *ctx, const char *key, const void *value, size_t bytes)
{
    fake_store *f = ctx;
    pthread_mutex_lock(&f->lock);
    sumo_result r = f->fail;
    int k = 0;
    while (k < f->keys && strcmp(f->key[k], key) != 0) k++;
    if (k == KEYS) r = SUMO_ERR_SYSTEM;
    if (r == SUMO_SUCCESS) {
        if (k == f->keys) f->keys++;
        snprintf(f->key[k], sizeof f->key[k], "%s", key);
        snprintf(f->value[k], sizeof f->value[k], "%.*s", (int)bytes, (const char *)value);
    }
    pthread_mutex_unlock(&f->lock);
    return r;
}

static sumo_result fake_get(void *ctx, const char *key, void *value, size_t *bytes,
                            int64_t deadline_ns)
{
    (void)deadline_ns;
    fake_store *f = ctx;
    pthread_mutex_lock(&f->lock);
    f->gets++;
    snprintf(f->last_key, sizeof f->last_key, "%s", key);
    sumo_result r = f->fail != SUMO_SUCCESS ? f->fail : SUMO_ERR_TIMEOUT; /* not there: a get
                                                                 that does not wait times out */
    for (int k = 0; k < f->keys && f->fail == SUMO_SUCCESS; k++)
        if (strcmp(f->key[k], key) == 0) {
            size_t n = strlen(f->value[k]);
            memcpy(value, f->value[k], n < *bytes ? n : *bytes);
            *bytes = n;
            r = SUMO_SUCCESS;
            break;
        }
    pthread_mutex_unlock(&f->lock);
    return r;
}

typedef struct fixture {
    fake_store f;
    sumo_store store;
    sumo__heartbeats h;
} fixture;

static fixture *make(const char *prefix, int64_t alive_ns, int count)
{
    static fixture x;
    memset(&x, 0, sizeof x);
    pthread_mutex_init(&x.f.lock, NULL);
    x.store = (sumo_store){.struct_size = sizeof x.store, .ctx = &x.f, .set = fake_set,
                           .get = fake_get};
    assert_int_equal(sumo__heartbeats_init(&x.h, &x.store, prefix, alive_ns, count),
                     SUMO_SUCCESS);
    return &x;
}

static void beat(fixture *x, const char *key, const char *value)
{
    assert_int_equal(fake_set(&x->f, key, value, strlen(value)), SUMO_SUCCESS);
}

/* The value under key as a number, -1 when absent. */
static long long value_of(fixture *x, const char *key)
{
    char text[64];
    size_t n = sizeof text - 1;
    sumo_result r = fake_get(&x->f, key, text, &n, 0);
    if (r != SUMO_SUCCESS) return -1;
    text[n] = '\0';
    return strtoll(text, NULL, 10);
}

static void nap(double seconds)
{
    nanosleep(&(struct timespec){(time_t)seconds, (long)((seconds - (time_t)seconds) * 1e9)},
              NULL);
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Waits (up to 10 s) until key holds at least `least`; its value then. */
static long long wait_for(fixture *x, const char *key, long long least)
{
    double until = now_s() + 10;
    long long v;
    while ((v = value_of(x, key)) < least && now_s() < until) nap(0.001);
    return v;
}

static sumo_heart *start(fixture *x, const char *prefix, int rank, double period_s)
{
    sumo_heart_options o;
    assert_int_equal(sumo_heart_options_default(&o), SUMO_SUCCESS);
    o.store = &x->store;
    o.key_prefix = prefix;
    o.rank = rank;
    o.period_s = period_s;
    sumo_heart *h = NULL;
    assert_int_equal(sumo_heart_start(&o, &h), SUMO_SUCCESS);
    assert_non_null(h);
    return h;
}

/* dead at `now`, per the reader, for slot/who. */
static bool dead_at(fixture *x, int slot, int who, int64_t now)
{
    bool dead = true;
    assert_int_equal(sumo__heartbeats_look(&x->h, slot, who, now, &dead), SUMO_SUCCESS);
    return dead;
}

static void test_absent_beat_dead_after_alive_ns(void **state)
{
    (void)state;
    fixture *x = make("alive/", 100, 2);
    /* First read at 1000: counted from there, not from 0. */
    assert_false(dead_at(x, 1, 1, 1000));
    assert_false(dead_at(x, 1, 1, 1099)); /* 99 ns still */
    assert_true(dead_at(x, 1, 1, 1100));  /* 100 ns still: dead, the rule is >= */
    assert_string_equal(x->f.last_key, "alive/1");
    sumo__heartbeats_free(&x->h);
}

static void test_moving_beat_restarts_the_count(void **state)
{
    (void)state;
    fixture *x = make("alive/", 100, 3);
    beat(x, "alive/2", "1");
    assert_false(dead_at(x, 2, 2, 10));
    assert_false(dead_at(x, 2, 2, 60));
    beat(x, "alive/2", "2"); /* moved: read at 90, counted from 90 */
    assert_false(dead_at(x, 2, 2, 90));
    assert_false(dead_at(x, 2, 2, 189)); /* 109 since 10, but 99 since the move */
    assert_true(dead_at(x, 2, 2, 190));
    /* Moving back to a value read before is a move too. */
    beat(x, "alive/2", "1");
    assert_false(dead_at(x, 2, 2, 200));
    assert_true(dead_at(x, 2, 2, 300));
    sumo__heartbeats_free(&x->h);
}

static void test_slots_are_apart(void **state)
{
    (void)state;
    /* Slot 0 reads rank 7's key, slot 1 rank 3's: each keeps its own since. */
    fixture *x = make("m4/alive/", 100, 2);
    beat(x, "m4/alive/7", "a");
    beat(x, "m4/alive/3", "a");
    assert_false(dead_at(x, 0, 7, 10));
    assert_string_equal(x->f.last_key, "m4/alive/7");
    assert_false(dead_at(x, 1, 3, 50));
    assert_string_equal(x->f.last_key, "m4/alive/3");
    assert_true(dead_at(x, 0, 7, 110));
    assert_false(dead_at(x, 1, 3, 110)); /* 60 since its first read */
    assert_true(dead_at(x, 1, 3, 150));
    char key[SUMO__BEAT_KEY_BYTES];
    assert_true(sumo__heartbeats_key(&x->h, 12, key, sizeof key));
    assert_string_equal(key, "m4/alive/12");
    assert_false(sumo__heartbeats_key(&x->h, 12, key, 11)); /* 11 bytes + NUL do not fit */
    sumo__heartbeats_free(&x->h);
}

static void test_long_beat_compares_by_its_head(void **state)
{
    (void)state;
    fixture *x = make("b/", 100, 1);
    /* 40 bytes: a change past byte 31 is not seen, one within it is. */
    char v[41];
    memset(v, 'x', 40);
    v[40] = '\0';
    beat(x, "b/0", v);
    assert_false(dead_at(x, 0, 0, 10));
    v[35] = 'y';
    beat(x, "b/0", v);
    assert_false(dead_at(x, 0, 0, 50));
    assert_true(dead_at(x, 0, 0, 110)); /* still since 10 */
    v[30] = 'y';
    beat(x, "b/0", v);
    assert_false(dead_at(x, 0, 0, 120));
    assert_true(dead_at(x, 0, 0, 220));
    sumo__heartbeats_free(&x->h);
}

static void test_store_failure_reads_as_no_beat(void **state)
{
    (void)state;
    fixture *x = make("alive/", 100, 1);
    beat(x, "alive/0", "5");
    assert_false(dead_at(x, 0, 0, 10));
    x->f.fail = SUMO_ERR_PEER_FAILURE;
    bool dead = true;
    /* "" differs from "5": a move, at 60; the failure is the caller's to weigh. */
    assert_int_equal(sumo__heartbeats_look(&x->h, 0, 0, 60, &dead), SUMO_ERR_PEER_FAILURE);
    assert_false(dead);
    assert_int_equal(sumo__heartbeats_look(&x->h, 0, 0, 159, &dead), SUMO_ERR_PEER_FAILURE);
    assert_false(dead);
    assert_int_equal(sumo__heartbeats_look(&x->h, 0, 0, 160, &dead), SUMO_ERR_PEER_FAILURE);
    assert_true(dead);
    sumo__heartbeats_free(&x->h);
}

static void test_key_that_does_not_fit(void **state)
{
    (void)state;
    char prefix[SUMO__BEAT_KEY_BYTES];
    memset(prefix, 'p', sizeof prefix - 2);
    prefix[sizeof prefix - 2] = '\0'; /* 298 bytes: with "12" and the NUL, 301 */
    fixture *x = make(prefix, 100, 1);
    bool dead = true;
    assert_int_equal(sumo__heartbeats_look(&x->h, 0, 12, 10, &dead), SUMO_ERR_INVALID_ARGUMENT);
    assert_false(dead);
    assert_int_equal(x->f.gets, 0);
    assert_int_equal(sumo__heartbeats_look(&x->h, 0, 12, 1000, &dead),
                     SUMO_ERR_INVALID_ARGUMENT);
    assert_false(dead);
    sumo__heartbeats_free(&x->h);
}

static void test_heart_counts_moves_and_beats_on_demand(void **state)
{
    (void)state;
    fixture *x = make("unused/", 1, 1);
    /* A period far longer than the test: the thread's one beat is its first, at once. */
    sumo_heart *h = start(x, "m0/alive/", 3, 1000);
    assert_int_equal(wait_for(x, "m0/alive/3", 1), 1);
    assert_int_equal(sumo_heart_beat(h), SUMO_SUCCESS);
    assert_int_equal(value_of(x, "m0/alive/3"), 2);
    assert_int_equal(sumo_heart_move(h, "m1/alive/", 1), SUMO_SUCCESS);
    assert_int_equal(value_of(x, "m1/alive/1"), -1); /* moving is not beating */
    assert_int_equal(sumo_heart_beat(h), SUMO_SUCCESS);
    assert_int_equal(value_of(x, "m1/alive/1"), 3); /* the count goes on */
    assert_int_equal(value_of(x, "m0/alive/3"), 2); /* the old key is left */
    assert_int_equal(sumo_heart_error(h, NULL, 0), SUMO_SUCCESS);
    double t0 = now_s();
    assert_int_equal(sumo_heart_stop(h), SUMO_SUCCESS);
    assert_true(now_s() - t0 < 5); /* not the period */
    assert_int_equal(sumo_heart_stop(NULL), SUMO_SUCCESS);
    sumo__heartbeats_free(&x->h);
}

static void test_heart_beats_every_period(void **state)
{
    (void)state;
    fixture *x = make("unused/", 1, 1);
    sumo_heart *h = start(x, "p/", 0, 0.005);
    assert_true(wait_for(x, "p/0", 5) >= 5);
    sumo_heart_stop(h);
    long long last = value_of(x, "p/0");
    nap(0.05);
    assert_int_equal(value_of(x, "p/0"), last); /* stopped: no beat after */
    sumo__heartbeats_free(&x->h);
}

static void test_heart_store_failing_stops_the_thread(void **state)
{
    (void)state;
    fixture *x = make("unused/", 1, 1);
    x->f.fail = SUMO_ERR_PEER_FAILURE;
    sumo_heart *h = start(x, "gone/", 2, 0.001);
    char why[256] = "";
    double until = now_s() + 10;
    while (sumo_heart_error(h, why, sizeof why) == SUMO_SUCCESS && now_s() < until) nap(0.001);
    assert_int_equal(sumo_heart_error(h, why, sizeof why), SUMO_ERR_SYSTEM);
    assert_non_null(strstr(why, "gone/2"));
    assert_non_null(strstr(why, "SUMO_ERR_PEER_FAILURE"));
    assert_int_equal(sumo_heart_beat(h), SUMO_ERR_SYSTEM);
    /* The thread stopped for good: a store that comes back gets no beat but the asked one. */
    pthread_mutex_lock(&x->f.lock);
    x->f.fail = SUMO_SUCCESS;
    pthread_mutex_unlock(&x->f.lock);
    nap(0.02);
    assert_int_equal(value_of(x, "gone/2"), -1);
    assert_int_equal(sumo_heart_beat(h), SUMO_SUCCESS);
    nap(0.02);
    long long v = value_of(x, "gone/2");
    assert_true(v > 0);
    nap(0.02);
    assert_int_equal(value_of(x, "gone/2"), v);
    assert_int_equal(sumo_heart_stop(h), SUMO_SUCCESS);
    sumo__heartbeats_free(&x->h);
}

static void test_heart_refusals(void **state)
{
    (void)state;
    fixture *x = make("unused/", 1, 1);
    char why[256], longer[300];
    memset(longer, 'k', sizeof longer - 1);
    longer[sizeof longer - 1] = '\0';
    sumo_store no_set = x->store;
    no_set.set = NULL;
    struct {
        const sumo_store *store;
        const char *prefix;
        int rank;
        double period_s;
        const char *named;
    } bad[] = {
        {NULL, "p/", 0, 1, "store"},
        {&no_set, "p/", 0, 1, "store"},
        {&x->store, NULL, 0, 1, "key_prefix"},
        {&x->store, longer, 0, 1, "key_prefix"},
        {&x->store, "p/", -1, 1, "rank"},
        {&x->store, "p/", 0, -1, "period_s"},
        {&x->store, "p/", 0, 1e300, "period_s"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        sumo_heart_options o;
        sumo_heart_options_default(&o);
        o.store = bad[i].store;
        o.key_prefix = bad[i].prefix;
        o.rank = bad[i].rank;
        o.period_s = bad[i].period_s;
        o.error = why;
        o.error_bytes = sizeof why;
        sumo_heart *h = (sumo_heart *)&o; /* set to NULL on failure */
        assert_int_equal(sumo_heart_start(&o, &h), SUMO_ERR_INVALID_ARGUMENT);
        assert_null(h);
        assert_non_null(strstr(why, bad[i].named));
    }
    assert_int_equal(sumo_heart_start(NULL, NULL), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_heart_beat(NULL), SUMO_ERR_INVALID_ARGUMENT);
    sumo_heart *h = start(x, "p/", 0, 1000);
    assert_int_equal(sumo_heart_move(h, longer, 0), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_heart_move(h, "q/", -2), SUMO_ERR_INVALID_ARGUMENT);
    sumo_heart_stop(h);
    sumo__heartbeats_free(&x->h);
}

/* The reader on the writer's beats, by the real clock: alive while it beats (a period of a
 * tenth of alive_s, as sumo.torch beats), dead within alive_s of its stop and not before
 * its last beat has stood alive_s. */
static void test_reader_on_the_writer(void **state)
{
    (void)state;
    const double alive_s = 0.5;
    fixture *x = make("w/", (int64_t)(alive_s * 1e9), 1);
    sumo_heart *h = start(x, "w/", 4, alive_s / 10);
    assert_true(wait_for(x, "w/4", 1) >= 1);
    double t0 = now_s();
    bool dead = true;
    while (now_s() - t0 < 3 * alive_s) {
        assert_int_equal(sumo__heartbeats_look(&x->h, 0, 4, sumo__now_ns(), &dead),
                         SUMO_SUCCESS);
        assert_false(dead);
        nap(alive_s / 20);
    }
    sumo_heart_stop(h);
    int64_t stopped = sumo__now_ns();
    assert_int_equal(sumo__heartbeats_look(&x->h, 0, 4, stopped, &dead), SUMO_SUCCESS);
    int64_t since = x->h.since[0]; /* the last beat's first reading */
    assert_true(since <= stopped);
    assert_int_equal(sumo__heartbeats_look(&x->h, 0, 4, since + (int64_t)(alive_s * 1e9) - 1,
                                           &dead), SUMO_SUCCESS);
    assert_false(dead);
    assert_int_equal(sumo__heartbeats_look(&x->h, 0, 4, since + (int64_t)(alive_s * 1e9),
                                           &dead), SUMO_SUCCESS);
    assert_true(dead);
    sumo__heartbeats_free(&x->h);
}

/* The callers' reader: the first dead slot, each slot keeping its own since, a negative rank
 * never read. */
static void test_watch(void **state)
{
    (void)state;
    fixture *x = make("unused/", 1, 1);
    beat(x, "w/5", "1");
    beat(x, "w/2", "1");
    const int ranks[] = {5, -1, 2};
    sumo_heart_watch *w = NULL;
    assert_int_equal(sumo_heart_watch_create(&x->store, "w/", 3, ranks, 0.2, &w), SUMO_SUCCESS);
    int dead = 7;
    assert_int_equal(sumo_heart_watch_look(w, &dead), SUMO_SUCCESS);
    assert_int_equal(dead, -1);
    nap(0.25);
    beat(x, "w/5", "2"); /* 5 moved: 2 is the one dead */
    assert_int_equal(sumo_heart_watch_look(w, &dead), SUMO_SUCCESS);
    assert_int_equal(dead, 2);
    nap(0.25);
    assert_int_equal(sumo_heart_watch_look(w, &dead), SUMO_SUCCESS);
    assert_int_equal(dead, 0); /* both now: the first slot */
    assert_int_equal(x->f.gets, 6); /* two slots, three looks: slot 1 never read */
    assert_int_equal(sumo_heart_watch_destroy(w), SUMO_SUCCESS);
    assert_int_equal(sumo_heart_watch_destroy(NULL), SUMO_SUCCESS);
    char longer[300];
    memset(longer, 'k', sizeof longer - 1);
    longer[sizeof longer - 1] = '\0';
    assert_int_equal(sumo_heart_watch_create(NULL, "w/", 3, ranks, 1, &w),
                     SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_heart_watch_create(&x->store, longer, 3, ranks, 1, &w),
                     SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_heart_watch_create(&x->store, "w/", 3, NULL, 1, &w),
                     SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_heart_watch_create(&x->store, "w/", 3, ranks, -1, &w),
                     SUMO_ERR_INVALID_ARGUMENT);
    assert_null(w);
    assert_int_equal(sumo_heart_watch_look(NULL, &dead), SUMO_ERR_INVALID_ARGUMENT);
    sumo__heartbeats_free(&x->h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_absent_beat_dead_after_alive_ns),
        cmocka_unit_test(test_moving_beat_restarts_the_count),
        cmocka_unit_test(test_slots_are_apart),
        cmocka_unit_test(test_long_beat_compares_by_its_head),
        cmocka_unit_test(test_store_failure_reads_as_no_beat),
        cmocka_unit_test(test_key_that_does_not_fit),
        cmocka_unit_test(test_heart_counts_moves_and_beats_on_demand),
        cmocka_unit_test(test_heart_beats_every_period),
        cmocka_unit_test(test_heart_store_failing_stops_the_thread),
        cmocka_unit_test(test_heart_refusals),
        cmocka_unit_test(test_reader_on_the_writer),
        cmocka_unit_test(test_watch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
