/*
 * Join tickets (src/transport/tickets.h) over sumo's directory store: threads that take
 * tickets at once each hold a different one and together hold 1..n with no gap (what the
 * members' count relies on); a ticket already held by another stays its own; the count
 * starts where told; a holder gets the place written for its ticket, and stops waiting when
 * the job closes or the deadline passes.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include "transport/tickets.h"
#include "sumo_elastic.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TAKERS 6

static char dir[256];

static sumo_store *open_store(void)
{
    sumo_store *st = NULL;
    assert_int_equal(sumo_store_create_dir(dir, &st), SUMO_SUCCESS);
    return st;
}

static int setup(void **state)
{
    (void)state;
    const char *base = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/sumo-tickets.XXXXXX", base && *base ? base : "/tmp");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    sumo_store *st = NULL;
    if (sumo_store_create_dir(dir, &st) != SUMO_SUCCESS) return -1;
    return sumo_store_destroy_dir(st, 1) == SUMO_SUCCESS ? 0 : -1;
}

typedef struct taker {
    int ticket;
    sumo_result result;
} taker;

static void *take(void *p)
{
    taker *t = p;
    sumo_store *st = NULL;
    t->result = sumo_store_create_dir(dir, &st);
    if (t->result == SUMO_SUCCESS)
        t->result = sumo__ticket_take(st, "job/", &t->ticket, NULL, 0);
    sumo_store_destroy_dir(st, 0);
    return NULL;
}

static void test_concurrent_takers_hold_one_each(void **state)
{
    (void)state;
    pthread_t th[TAKERS];
    taker t[TAKERS] = {0};
    for (int i = 0; i < TAKERS; i++) assert_int_equal(pthread_create(&th[i], NULL, take, &t[i]), 0);
    int held[TAKERS + 1] = {0};
    for (int i = 0; i < TAKERS; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(t[i].result, SUMO_SUCCESS);
        assert_in_range(t[i].ticket, 1, TAKERS);
        held[t[i].ticket]++;
    }
    for (int k = 1; k <= TAKERS; k++) assert_int_equal(held[k], 1);
    sumo_store *st = open_store();
    int count = -1;
    assert_int_equal(sumo__tickets_count(st, "job/", 0, &count, NULL, 0), SUMO_SUCCESS);
    assert_int_equal(count, TAKERS);
    assert_int_equal(sumo__tickets_count(st, "job/", 4, &count, NULL, 0), SUMO_SUCCESS);
    assert_int_equal(count, TAKERS);
    assert_int_equal(sumo__tickets_count(st, "other/", 0, &count, NULL, 0), SUMO_SUCCESS);
    assert_int_equal(count, 0);
    sumo_store_destroy_dir(st, 0);
}

static void test_held_ticket_stays_its_holders(void **state)
{
    (void)state;
    sumo_store *st = open_store();
    assert_int_equal(st->set(st->ctx, "held/join/ticket/1", "someone", 7), SUMO_SUCCESS);
    int k = 0;
    assert_int_equal(sumo__ticket_take(st, "held/", &k, NULL, 0), SUMO_SUCCESS);
    assert_int_equal(k, 2);
    char v[16];
    size_t n = sizeof v;
    assert_int_equal(st->get(st->ctx, "held/join/ticket/1", v, &n, 0), SUMO_SUCCESS);
    assert_int_equal(n, 7);
    assert_memory_equal(v, "someone", 7);
    sumo_store_destroy_dir(st, 0);
}

static void test_place_close_deadline(void **state)
{
    (void)state;
    sumo_store *st = open_store();
    char text[256], why[256];
    assert_int_equal(sumo__ticket_place(st, "w/", 3, "2 3 a4 c", NULL, 0), SUMO_SUCCESS);
    assert_int_equal(sumo__ticket_wait(st, "w/", 3, sumo__now_ns() + 1000000000, text,
                                       sizeof text, why, sizeof why),
                     SUMO_SUCCESS);
    assert_string_equal(text, "2 3 a4 c");
    int64_t t0 = sumo__now_ns();
    assert_int_equal(sumo__ticket_wait(st, "w/", 4, t0 + 100000000, text, sizeof text, why,
                                       sizeof why),
                     SUMO_ERR_TIMEOUT);
    assert_true(sumo__now_ns() - t0 >= 100000000);
    assert_non_null(strstr(why, "ticket 4"));
    assert_int_equal(sumo__tickets_close(st, "w/", NULL, 0), SUMO_SUCCESS);
    assert_int_equal(sumo__ticket_wait(st, "w/", 4, sumo__now_ns() + 5000000000, text,
                                       sizeof text, why, sizeof why),
                     SUMO_ERR_PEER_FAILURE);
    assert_non_null(strstr(why, "ended"));
    sumo_store_destroy_dir(st, 0);
}

/* The public face: the same keys (a ticket taken through it is counted by the internal
 * count), and bad arguments refused by name. */
static void test_public_calls(void **state)
{
    (void)state;
    sumo_store *st = open_store();
    char why[256], text[64];
    int k = 0, count = 0;
    assert_int_equal(sumo_ticket_take(st, "pub/", &k, why, sizeof why), SUMO_SUCCESS);
    assert_int_equal(k, 1);
    assert_int_equal(sumo__tickets_count(st, "pub/", 0, &count, NULL, 0), SUMO_SUCCESS);
    assert_int_equal(count, 1);
    assert_int_equal(sumo_tickets_count(st, "pub/", 0, &count, why, sizeof why), SUMO_SUCCESS);
    assert_int_equal(count, 1);
    assert_int_equal(sumo_ticket_place(st, "pub/", 1, "here", why, sizeof why), SUMO_SUCCESS);
    assert_int_equal(sumo_ticket_wait(st, "pub/", 1, 1.0, text, sizeof text, why, sizeof why),
                     SUMO_SUCCESS);
    assert_string_equal(text, "here");
    sumo_store no_once = *st;
    no_once.set_once = NULL;
    assert_int_equal(sumo_ticket_take(&no_once, "pub/", &k, why, sizeof why),
                     SUMO_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(why, "set_once"));
    assert_int_equal(sumo_ticket_place(st, "pub/", 0, "x", why, sizeof why),
                     SUMO_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(why, "ticket 0"));
    assert_int_equal(sumo_ticket_wait(st, NULL, 1, 1.0, text, sizeof text, why, sizeof why),
                     SUMO_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(why, "key_prefix"));
    assert_int_equal(sumo_tickets_close(st, "pub/", why, sizeof why), SUMO_SUCCESS);
    assert_int_equal(sumo_ticket_wait(st, "pub/", 2, 1.0, text, sizeof text, why, sizeof why),
                     SUMO_ERR_PEER_FAILURE);
    sumo_store_destroy_dir(st, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_concurrent_takers_hold_one_each),
        cmocka_unit_test(test_held_ticket_stays_its_holders),
        cmocka_unit_test(test_place_close_deadline),
        cmocka_unit_test(test_public_calls),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
