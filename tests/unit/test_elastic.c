/*
 * sumo_comm_shrink (sumo_elastic.h): after a rank is lost, the survivors agree on who is left and
 * go on as a smaller communicator. Checked against what must hold whatever the timing: the
 * survivors' numbering is the old ranks' order without the lost ones, every survivor gets the
 * same verdict and the smallest value any survivor brought, and the new communicator's sum is
 * the closed form over the survivors' inputs. Threads (a rank that leaves) and processes of one
 * machine (a rank killed outright, the decider among them), and the transports that cannot.
 */
#include "sumo_elastic.h"
#include "support/shm_group.h"

#include <pthread.h>

/* ---- threads ---------------------------------------------------------------------------------- */

#define TP 5

typedef struct thread_case {
    int size;
    int lost[TP];        /* ranks that leave instead of shrinking */
    bool fail_first;     /* the survivors first see the loss fail a collective */
    sumo_comm *comm[TP];
    sumo_result result[TP];
    sumo_shrink_info info[TP];
    int old_ranks[TP][TP];
    double sum[TP];      /* what the new communicator's sum of (old rank + 1) gave */
} thread_case;

typedef struct thread_arg {
    thread_case *c;
    int rank;
} thread_arg;

static void *thread_rank(void *p)
{
    thread_arg *a = p;
    thread_case *c = a->c;
    int r = a->rank;
    sumo_comm *comm = c->comm[r];
    if (c->lost[r]) {
        /* A rank that fails in a way its peers can see: it leaves the group. */
        sumo_comm_abort(comm, "test: this rank is lost");
        sumo_comm_destroy(comm);
        c->result[r] = SUMO_SUCCESS;
        return NULL;
    }
    if (c->fail_first) {
        double x = 1;
        sumo_result fr = sumo_allreduce(&x, &x, 1, SUMO_FLOAT64, SUMO_OP_SUM, comm);
        if (fr != SUMO_ERR_PEER_FAILURE) {
            c->result[r] = SUMO_ERR_INTERNAL;
            sumo_comm_destroy(comm);
            return NULL;
        }
    }
    sumo_shrink_options o;
    sumo_shrink_options_default(&o);
    o.value = 100 + (uint64_t)r * 7;
    c->info[r] = (sumo_shrink_info){.struct_size = sizeof c->info[r], .old_ranks = c->old_ranks[r]};
    sumo_comm *fresh = NULL;
    c->result[r] = sumo_comm_shrink(comm, &o, &fresh, &c->info[r]);
    sumo_comm_destroy(comm);
    if (c->result[r] == SUMO_SUCCESS) {
        double x = r + 1;
        c->result[r] = sumo_allreduce(&x, &c->sum[r], 1, SUMO_FLOAT64, SUMO_OP_SUM, fresh);
        int size = 0;
        sumo_comm_size(fresh, &size);
        if (size != c->info[r].size) c->result[r] = SUMO_ERR_INTERNAL;
        sumo_comm_destroy(fresh);
    }
    return NULL;
}

static void run_threads_case(thread_case *c)
{
    assert_int_equal(sumo_comm_create_threads(c->size, c->comm), SUMO_SUCCESS);
    pthread_t th[TP];
    thread_arg args[TP];
    for (int r = 0; r < c->size; r++) {
        args[r] = (thread_arg){c, r};
        assert_int_equal(pthread_create(&th[r], NULL, thread_rank, &args[r]), 0);
    }
    for (int r = 0; r < c->size; r++) pthread_join(th[r], NULL);
    /* The expected verdict, from the case alone. */
    int expect_old[TP], n = 0;
    double expect_sum = 0;
    uint64_t expect_value = UINT64_MAX;
    for (int r = 0; r < c->size; r++)
        if (!c->lost[r]) {
            expect_old[n++] = r;
            expect_sum += r + 1;
            if (100 + (uint64_t)r * 7 < expect_value) expect_value = 100 + (uint64_t)r * 7;
        }
    for (int k = 0; k < n; k++) {
        int r = expect_old[k];
        assert_int_equal(c->result[r], SUMO_SUCCESS);
        assert_int_equal(c->info[r].size, n);
        assert_int_equal(c->info[r].rank, k);
        assert_true(c->info[r].value == expect_value);
        for (int j = 0; j < c->size; j++)
            assert_int_equal(c->old_ranks[r][j], j < n ? expect_old[j] : -1);
        assert_true(c->sum[r] == expect_sum);
    }
}

static void test_threads_lost_middle(void **state)
{
    (void)state;
    thread_case c = {.size = 4, .lost = {0, 0, 1, 0}, .fail_first = true};
    run_threads_case(&c);
}

static void test_threads_lost_decider(void **state)
{
    (void)state;
    /* Rank 0 would decide; rank 1 must take over. Two lost at once, one of them the last. */
    thread_case c = {.size = 5, .lost = {1, 0, 0, 0, 1}, .fail_first = true};
    run_threads_case(&c);
}

static void test_threads_healthy_shrinks_to_itself(void **state)
{
    (void)state;
    thread_case c = {.size = 3};
    run_threads_case(&c);
}

static void test_refusals(void **state)
{
    (void)state;
    sumo_comm *comms[2];
    assert_int_equal(sumo_comm_create_threads(2, comms), SUMO_SUCCESS);
    sumo_shrink_options o;
    sumo_shrink_options_default(&o);
    sumo_shrink_info info = {.struct_size = sizeof info};
    sumo_comm *out = (sumo_comm *)&info;
    assert_int_equal(sumo_comm_shrink(NULL, &o, &out, &info), SUMO_ERR_INVALID_ARGUMENT);
    assert_null(out);
    assert_int_equal(sumo_comm_shrink(comms[0], NULL, &out, &info), SUMO_ERR_INVALID_ARGUMENT);
    char err[200] = "";
    o.error = err;
    o.error_bytes = sizeof err;
    sumo_shrink_info bad = {.struct_size = 3};
    assert_int_equal(sumo_comm_shrink(comms[0], &o, &out, &bad), SUMO_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "struct_size"));
    assert_int_equal(sumo_shrink_options_default(NULL), SUMO_ERR_INVALID_ARGUMENT);
    sumo_comm_destroy(comms[0]);
    sumo_comm_destroy(comms[1]);
}

/* ---- processes -------------------------------------------------------------------------------- */

/* Each survivor shrinks, then checks the verdict and a sum on the new communicator against the
 * lost set the case names; what it found goes out through its exit status. */
static int lost_mask; /* bit r: rank r is killed (set before the fork) */
static int kill_late_ms; /* > 0: the lost ranks die this long after the survivors start shrinking */

static int shm_survivor(sumo_comm **comm, int rank, int size, group *g)
{
    tally t = {.rank = rank};
    if (lost_mask >> rank & 1) {
        /* Take part in one collective, then die without a word: kill -9 on itself. */
        double x = 1;
        sumo_allreduce(&x, &x, 1, SUMO_FLOAT64, SUMO_OP_SUM, *comm);
        if (kill_late_ms)
            nanosleep(&(struct timespec){0, kill_late_ms * 1000000L}, NULL);
        raise(SIGKILL);
    }
    double x = 1;
    sumo_result r = sumo_allreduce(&x, &x, 1, SUMO_FLOAT64, SUMO_OP_SUM, *comm);
    check(&t, r == SUMO_SUCCESS, "first allreduce: %s", sumo_result_name(r));
    if (!kill_late_ms) {
        r = sumo_allreduce(&x, &x, 1, SUMO_FLOAT64, SUMO_OP_SUM, *comm);
        check(&t, r == SUMO_ERR_PEER_FAILURE, "allreduce after the loss: %s", sumo_result_name(r));
    }
    sumo_store *store = NULL;
    check(&t, sumo_store_create_dir(g->dir, &store) == SUMO_SUCCESS, "store");
    char err[256] = "";
    sumo_shrink_options o;
    sumo_shrink_options_default(&o);
    o.value = 50 + (uint64_t)rank;
    o.store = store;
    o.key_prefix = "shrink/";
    o.error = err;
    o.error_bytes = sizeof err;
    int old[MAXP];
    sumo_shrink_info info = {.struct_size = sizeof info, .old_ranks = old};
    sumo_comm *fresh = NULL;
    r = sumo_comm_shrink(*comm, &o, &fresh, &info);
    check(&t, r == SUMO_SUCCESS, "shrink: %s (%s)", sumo_result_name(r), err);
    if (r != SUMO_SUCCESS) return 1;
    sumo_comm_destroy(*comm);
    *comm = fresh;
    int n = 0, first = -1;
    double sum = 0;
    for (int k = 0; k < size; k++)
        if (!(lost_mask >> k & 1)) {
            check(&t, old[n] == k, "old_ranks[%d] = %d, expected %d", n, old[n], k);
            if (k == rank) check(&t, info.rank == n, "new rank %d, expected %d", info.rank, n);
            if (first < 0) first = k;
            sum += k + 1;
            n++;
        }
    check(&t, info.size == n, "new size %d, expected %d", info.size, n);
    check(&t, info.value == 50 + (uint64_t)first, "value %llu", (unsigned long long)info.value);
    double mine = rank + 1, got = 0;
    r = sumo_allreduce(&mine, &got, 1, SUMO_FLOAT64, SUMO_OP_SUM, fresh);
    check(&t, r == SUMO_SUCCESS && got == sum, "sum on the new communicator: %s, %g (expected %g)",
          sumo_result_name(r), got, sum);
    r = sumo_barrier(fresh);
    /* Every survivor is past the meeting: the store's files can go. */
    sumo_store_destroy_dir(store, 0);
    return t.failed ? 1 : 0;
}

static void run_shm_case(int size, int mask, int late_ms)
{
    lost_mask = mask;
    kill_late_ms = late_ms;
    group g = {.size = size, .fn = shm_survivor, .timeout = "20"};
    run_group(&g);
    for (int r = 0; r < size; r++) {
        int expect = (mask >> r & 1) ? -SIGKILL : 0;
        if (g.status[r] != expect)
            fprintf(stderr, "rank %d of %d ended with %d, expected %d\n", r, size, g.status[r], expect);
        assert_int_equal(g.status[r], expect);
    }
}

static void test_shm_killed_middle(void **state)
{
    (void)state;
    run_shm_case(4, 1 << 2, 0);
}

static void test_shm_killed_decider(void **state)
{
    (void)state;
    run_shm_case(3, 1 << 0, 0);
}

static void test_shm_killed_during_agreement(void **state)
{
    (void)state;
    /* Ranks 0 and 3 die while the others already wait in the agreement: rank 0 would decide. */
    run_shm_case(4, (1 << 0) | (1 << 3), 300);
}

/* The shm transport needs a store to shrink through; one made by the caller, none. */
static int shm_no_store(sumo_comm **comm, int rank, int size, group *g)
{
    (void)size;
    (void)g;
    tally t = {.rank = rank};
    char err[256] = "";
    sumo_shrink_options o;
    sumo_shrink_options_default(&o);
    o.error = err;
    o.error_bytes = sizeof err;
    sumo_shrink_info info = {.struct_size = sizeof info};
    sumo_comm *fresh = NULL;
    sumo_result r = sumo_comm_shrink(*comm, &o, &fresh, &info);
    check(&t, r == SUMO_ERR_INVALID_ARGUMENT && strstr(err, "store") != NULL,
          "shrink without a store: %s (%s)", sumo_result_name(r), err);
    return t.failed ? 1 : 0;
}

static void test_shm_needs_store(void **state)
{
    (void)state;
    group g = {.size = 2, .fn = shm_no_store, .timeout = "20"};
    run_group(&g);
    expect_all(&g, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_threads_lost_middle),
        cmocka_unit_test(test_threads_lost_decider),
        cmocka_unit_test(test_threads_healthy_shrinks_to_itself),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_shm_killed_middle),
        cmocka_unit_test(test_shm_killed_decider),
        cmocka_unit_test(test_shm_killed_during_agreement),
        cmocka_unit_test(test_shm_needs_store),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
