/*
 * The heartbeat reader (transport/heartbeat.h) against verdicts worked out by hand, on a
 * store of the test's and a clock the test moves: a rank is dead once the beat read has stood
 * still (or been absent) for alive_ns since it was first read so, not a nanosecond before;
 * a beat that moves restarts the count; a beat compares by its first 31 bytes; a store that
 * fails reads as no beat and is reported; slots and the ranks whose keys they read differ.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include "transport/heartbeat.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_absent_beat_dead_after_alive_ns),
        cmocka_unit_test(test_moving_beat_restarts_the_count),
        cmocka_unit_test(test_slots_are_apart),
        cmocka_unit_test(test_long_beat_compares_by_its_head),
        cmocka_unit_test(test_store_failure_reads_as_no_beat),
        cmocka_unit_test(test_key_that_does_not_fit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
