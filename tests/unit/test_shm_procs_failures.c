/*
 * The shm transport (sumo_shm.h) between real processes, failing: each test forks its ranks
 * (support/shm_group.h), or creates one alone in this process.
 *
 * What the tests prove:
 *   - a rank killed in the middle of a collective makes the others fail with
 *     SUMO_ERR_PEER_FAILURE long before their deadline; a rank that leaves early makes its
 *     waiting peers fail at once, and a rank that stays long after the others left still
 *     destroys its handle cleanly;
 *   - a rank 0 killed while the group meets makes the others fail at once, whether they had
 *     attached already or arrive after its death;
 *   - a store that never delivers gives SUMO_ERR_TIMEOUT at the SUMO_TIMEOUT deadline with a
 *     message; options this library does not know are refused with a message;
 *   - after every test, no object named for any of its processes is left in /dev/shm.
 *
 * What a working group computes is tested in test_shm_procs_results.c.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "sumo_shm.h"
#include "support/harness.h"
#include "support/reference.h"
#include "support/shm_group.h"

#include <pthread.h>

#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- a rank dies --------------------------------------------------------------------------- */

/* Allreduces until one fails; rank 0 signals the parent after the first. Exits with
 * EXIT_RESULT + the failure (a rank never failing gives up after a minute). */
static int until_failure(sumo_comm **commp, int rank, int size, group *g)
{
    (void)size;
    size_t n = (size_t)1 << 20;
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = (float)harness_collective_value(rank, i, true);
    double start = now_s();
    sumo_result r = SUMO_SUCCESS;
    for (int k = 0; r == SUMO_SUCCESS && now_s() - start < 60; k++) {
        r = sumo_allreduce(x, x, n, SUMO_FLOAT32, SUMO_OP_AVERAGE, *commp);
        if (k == 0 && rank == 0) signal_ready(g);
    }
    const char *m = "";
    sumo_comm_error_message(*commp, &m);
    fprintf(stderr, "rank %d after %.2f s: %s (%s)\n", rank, now_s() - start, sumo_result_name(r), m);
    free(x);
    return EXIT_RESULT + (int)r;
}

static void kill_rank_1(group *g)
{
    struct pollfd p = {.fd = g->ready[0], .events = POLLIN};
    char b;
    if (poll(&p, 1, 120000) == 1 && read(g->ready[0], &b, 1) == 1) {
        nanosleep(&(struct timespec){0, 50000000}, NULL);
        kill(g->pid[1], SIGKILL);
    }
    g->killed_at = now_s();
}

static void check_killed(const group *g)
{
    for (int r = 0; r < g->size; r++) {
        int want = r == 1 ? -SIGKILL : EXIT_RESULT + SUMO_ERR_PEER_FAILURE;
        if (g->status[r] != want) fprintf(stderr, "rank %d ended with %d\n", r, g->status[r]);
        assert_int_equal(g->status[r], want);
    }
    /* The deadline is 120 s: ending well before it is the liveness check, not the deadline. */
    double after = g->ended_at - g->killed_at;
    fprintf(stderr, "the survivors ended %.2f s after the kill\n", after);
    assert_true(after < 60);
}

static void test_killed_rank_staged(void **state)
{
    (void)state;
    group g = {.size = 3, .fn = until_failure, .timeout = "120", .parent_hook = kill_rank_1};
    run_group(&g);
    check_killed(&g);
}

static int until_failure_ring(sumo_comm **commp, int rank, int size, group *g)
{
    sumo_comm_set_param(*commp, SUMO_PARAM_ALGORITHM, SUMO_ALGORITHM_RING);
    return until_failure(commp, rank, size, g);
}

static void test_killed_rank_messages_named(void **state)
{
    (void)state;
    group g = {.size = 4, .fn = until_failure_ring, .timeout = "120", .named = true,
               .parent_hook = kill_rank_1};
    run_group(&g);
    check_killed(&g);
}

/* Rank 0 is killed while it waits for rank 2 to attach: rank 1, attached and waiting for rank
 * 0's word, and rank 2, arriving after the death, both fail at once instead of at the
 * deadline. */
static int never_runs(sumo_comm **commp, int rank, int size, group *g)
{
    (void)commp;
    (void)size;
    (void)g;
    fprintf(stderr, "rank %d: created a communicator without rank 0\n", rank);
    return 1;
}

static void kill_rank_0_once_1_attached(group *g)
{
    char path[256];
    /* The file store's name for the key "test/attach/0/1". */
    snprintf(path, sizeof path, "%s/k.test_2Fattach_2F0_2F1", g->dir);
    for (double start = now_s(); access(path, F_OK) != 0 && now_s() - start < 120;)
        nanosleep(&(struct timespec){0, 5000000}, NULL);
    kill(g->pid[0], SIGKILL);
    g->killed_at = now_s();
}

static void test_rank_0_dies_while_meeting(void **state)
{
    (void)state;
    group g = {.size = 3, .fn = never_runs, .timeout = "120", .late_rank = 2, .late_ms = 1500,
               .parent_hook = kill_rank_0_once_1_attached};
    run_group(&g);
    assert_int_equal(g.status[0], -SIGKILL);
    assert_int_equal(g.status[1], EXIT_RESULT + SUMO_ERR_PEER_FAILURE);
    assert_int_equal(g.status[2], EXIT_RESULT + SUMO_ERR_PEER_FAILURE);
    double after = g.ended_at - g.killed_at;
    fprintf(stderr, "the others ended %.2f s after the kill\n", after);
    assert_true(after < 60);
}

/* ---- leaving ------------------------------------------------------------------------------- */

/* Rank 2 leaves after a collective; ranks 0 and 1 then wait on it in the next one and fail at
 * once; rank 1 leaves; rank 0 stays a while after every peer has gone, still reads its shared
 * buffer, and destroys its handle cleanly. */
static int leaving(sumo_comm **commp, int rank, int size, group *g)
{
    (void)g;
    tally t = {.rank = rank};
    float *x = NULL;
    sumo_result r = sumo_mem_alloc(*commp, 4096 * sizeof(float), (void **)&x);
    check(&t, r == SUMO_SUCCESS, "sumo_mem_alloc: %s", sumo_result_name(r));
    if (r != SUMO_SUCCESS) return 1;
    for (size_t i = 0; i < 4096; i++) x[i] = (float)harness_collective_value(rank, i, true);
    r = sumo_allreduce(x, x, 4096, SUMO_FLOAT32, SUMO_OP_SUM, *commp);
    check(&t, r == SUMO_SUCCESS, "first allreduce: %s", sumo_result_name(r));
    if (rank == 2) {
        r = sumo_comm_destroy(*commp);
        *commp = NULL;
        check(&t, r == SUMO_SUCCESS, "rank 2's destroy: %s", sumo_result_name(r));
        return t.failed ? 1 : 0;
    }
    double start = now_s();
    r = sumo_allreduce(x, x, 4096, SUMO_FLOAT32, SUMO_OP_SUM, *commp);
    double waited = now_s() - start;
    check(&t, r == SUMO_ERR_PEER_FAILURE && waited < 30, "waiting on a rank that left: %s after %.2f s",
          sumo_result_name(r), waited);
    if (rank == 0) {
        nanosleep(&(struct timespec){0, 500000000}, NULL);
        size_t wrong = 0;
        for (size_t i = 0; i < 4096; i++)
            wrong += x[i] != expected_sum(SUMO_FLOAT32, SUMO_OP_SUM, size, i);
        check(&t, wrong == 0, "the first sum in shared memory after the peers left: %zu wrong",
              wrong);
    }
    start = now_s();
    r = sumo_comm_destroy(*commp);
    *commp = NULL;
    check(&t, r == SUMO_SUCCESS && now_s() - start < 5, "rank %d's destroy: %s after %.2f s",
          rank, sumo_result_name(r), now_s() - start);
    return t.failed ? 1 : 0;
}

static void test_leave_early_and_linger(void **state)
{
    (void)state;
    group g = {.size = 3, .fn = leaving, .timeout = "120"};
    run_group(&g);
    expect_all(&g, 0);
}

/* ---- creation failures (in this process) ----------------------------------------------------- */

static sumo_result never_get(void *ctx, const char *key, void *value, size_t *bytes, int64_t deadline_ns)
{
    (void)ctx, (void)key, (void)value, (void)bytes;
    while (now_s() * 1e9 < (double)deadline_ns) nanosleep(&(struct timespec){0, 1000000}, NULL);
    return SUMO_ERR_TIMEOUT;
}

static sumo_result create_alone(const sumo_store *store, const char *prefix, int rank, int size,
                                char *err, size_t errlen, sumo_comm **comm)
{
    sumo_shm_options o = {.struct_size = sizeof o, .rank = rank, .size = size,
                          .store = store, .key_prefix = prefix, .error = err,
                          .error_bytes = errlen};
    return sumo_comm_create_shm(&o, comm);
}

static void test_store_never_delivers(void **state)
{
    (void)state;
    char dir[160];
    make_store_dir(dir, sizeof dir);
    setenv("SUMO_TIMEOUT", "1", 1);
    setenv("SUMO_SHM_NAMED", "1", 1);
    sumo_store *store = NULL;
    assert_int_equal(sumo_store_create_dir(dir, &store), SUMO_SUCCESS);
    sumo_store never = *store;
    never.get = never_get;
    pid_t me = getpid();
    for (int c = 0; c < 3; c++) {
        /* rank 0 whose peer never attaches; rank 1 whose rank 0 never publishes; a store whose
         * get never delivers anything. */
        char err[256] = "";
        sumo_comm *comm = (sumo_comm *)store;
        double start = now_s();
        char prefix[32];
        snprintf(prefix, sizeof prefix, "alone%d/", c);
        sumo_result r = create_alone(c == 2 ? &never : store, prefix, c == 1 ? 1 : 0, 2, err, sizeof err, &comm);
        double took = now_s() - start;
        fprintf(stderr, "case %d: %s after %.2f s: %s\n", c, sumo_result_name(r), took, err);
        assert_int_equal(r, SUMO_ERR_TIMEOUT);
        assert_null(comm);
        assert_non_null(strstr(err, "store key"));
        assert_non_null(strstr(err, "SUMO_TIMEOUT"));
        assert_true(took > 0.9 && took < 30);
        assert_int_equal(leftovers(&me, 1), 0);
    }
    unsetenv("SUMO_TIMEOUT");
    unsetenv("SUMO_SHM_NAMED");
    assert_int_equal(sumo_store_destroy_dir(store, 1), SUMO_SUCCESS);
    remove_dir(dir);
}

typedef struct lead_arg {
    const sumo_store *store;
    sumo_result r;
    char err[256];
} lead_arg;

static void *lead_alone(void *p)
{
    lead_arg *a = p;
    sumo_comm *comm = NULL;
    a->r = create_alone(a->store, "here/", 0, 2, a->err, sizeof a->err, &comm);
    if (comm) sumo_comm_destroy(comm);
    return NULL;
}

/* Rank 0's record as a rank on another machine reads it: the follower says the ranks are on
 * two machines, and tells rank 0 so, instead of taking rank 0 for ended. The record ends with
 * rank 0's host name (64 bytes) and boot id (40): another boot id (a machine of its own), or
 * another host name with this boot id (a host that shares the kernel: a container, a network
 * namespace standing for a machine). */
static void rank_on_another_machine(bool other_boot)
{
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f == NULL && other_boot) {
        print_message("no /proc/sys/kernel/random/boot_id: the machine check is off here\n");
        skip();
    }
    if (f) fclose(f);
    char dir[160];
    make_store_dir(dir, sizeof dir);
    setenv("SUMO_TIMEOUT", "3", 1);
    sumo_store *store = NULL;
    assert_int_equal(sumo_store_create_dir(dir, &store), SUMO_SUCCESS);
    lead_arg lead = {.store = store};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, lead_alone, &lead), 0);
    unsigned char rec[4096];
    size_t bytes = sizeof rec;
    assert_int_equal(store->get(store->ctx, "here/seg/0", rec, &bytes, (int64_t)((now_s() + 20) * 1e9)),
                     SUMO_SUCCESS);
    assert_true(bytes > 104);
    if (other_boot)
        memcpy(rec + bytes - 40, "00000000-1111-2222-3333-444444444444", 37);
    else
        memcpy(rec + bytes - 104, "sumo-test-elsewhere", 20);
    assert_int_equal(store->set(store->ctx, "there/seg/0", rec, bytes), SUMO_SUCCESS);
    char err[256] = "";
    sumo_comm *comm = NULL;
    sumo_result r = create_alone(store, "there/", 1, 2, err, sizeof err, &comm);
    fprintf(stderr, "follower: %s: %s\n", sumo_result_name(r), err);
    assert_int_equal(r, SUMO_ERR_INVALID_USAGE);
    assert_null(comm);
    assert_non_null(strstr(err, "another machine than rank 0"));
    assert_non_null(strstr(err, "\"tcp\""));
    if (!other_boot) assert_non_null(strstr(err, "\"sumo-test-elsewhere\""));
    /* What rank 0 of that group would read: the attach record's code. */
    int32_t told[128] = {0};
    bytes = sizeof told;
    assert_int_equal(store->get(store->ctx, "there/attach/0/1", told, &bytes, (int64_t)(now_s() * 1e9)),
                     SUMO_SUCCESS);
    assert_int_equal(told[0], SUMO_ERR_INVALID_USAGE);
    pthread_join(t, NULL);
    assert_int_equal(lead.r, SUMO_ERR_TIMEOUT); /* its own follower never came */
    pid_t me = getpid();
    assert_int_equal(leftovers(&me, 1), 0);
    unsetenv("SUMO_TIMEOUT");
    assert_int_equal(sumo_store_destroy_dir(store, 1), SUMO_SUCCESS);
    remove_dir(dir);
}

static void test_rank_on_another_machine(void **state)
{
    (void)state;
    rank_on_another_machine(true);
}

static void test_rank_on_another_host_name(void **state)
{
    (void)state;
    rank_on_another_machine(false);
}

/* A second process for rank 1 after the group has met, while its rank 0 still runs: named as a
 * duplicate at once, not a timeout on the segment record that rank 0 has long removed. */
static void test_late_duplicate_named(void **state)
{
    (void)state;
    char dir[160];
    make_store_dir(dir, sizeof dir);
    setenv("SUMO_TIMEOUT", "20", 1);
    sumo_store *store = NULL;
    assert_int_equal(sumo_store_create_dir(dir, &store), SUMO_SUCCESS);
    int done[2];
    assert_int_equal(pipe(done), 0);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) { /* rank 0, in a process of its own */
        char err[256];
        sumo_comm *comm = NULL;
        if (create_alone(store, "dup/", 0, 2, err, sizeof err, &comm) != SUMO_SUCCESS) _exit(3);
        close(done[1]); /* the parent's end alone: its exit, however it ends, ends the read */
        char c;
        (void)!read(done[0], &c, 1);
        sumo_comm_destroy(comm);
        _exit(0);
    }
    char err[256] = "";
    sumo_comm *comm = NULL;
    assert_int_equal(create_alone(store, "dup/", 1, 2, err, sizeof err, &comm), SUMO_SUCCESS);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    sumo_comm *again = NULL;
    sumo_result r = create_alone(store, "dup/", 1, 2, err, sizeof err, &again);
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double took = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    print_message("after %.2f s: %s: %s\n", took, sumo_result_name(r), err);
    assert_int_equal(r, SUMO_ERR_INVALID_USAGE);
    assert_null(again);
    assert_non_null(strstr(err, "started twice"));
    assert_true(took < 5);
    assert_int_equal(write(done[1], "x", 1), 1);
    sumo_comm_destroy(comm);
    int status = 0;
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    unsetenv("SUMO_TIMEOUT");
    assert_int_equal(sumo_store_destroy_dir(store, 1), SUMO_SUCCESS);
    remove_dir(dir);
}

static void test_options_refused(void **state)
{
    (void)state;
    char dir[160];
    make_store_dir(dir, sizeof dir);
    sumo_store *store = NULL;
    assert_int_equal(sumo_store_create_dir(dir, &store), SUMO_SUCCESS);
    char err[256];
    sumo_comm *comm = (sumo_comm *)store;
    sumo_shm_options good = {.struct_size = sizeof good, .rank = 0, .size = 1,
                             .store = store, .key_prefix = "x/", .error = err,
                             .error_bytes = sizeof err};
    sumo_shm_options o = good;
    o.struct_size = sizeof o + 8;
    strcpy(err, "untouched");
    assert_int_equal(sumo_comm_create_shm(&o, &comm), SUMO_ERR_INVALID_ARGUMENT);
    assert_null(comm);
    /* An options struct of another size is not written into. */
    assert_string_equal(err, "untouched");
    sumo_shm_options bad[5];
    for (int i = 0; i < 5; i++) bad[i] = good;
    bad[0].store = NULL;
    bad[1].rank = 1;
    bad[2].size = 0;
    bad[3].stage_bytes = 5000;
    bad[4].key_prefix = NULL;
    for (int i = 0; i < 5; i++) {
        err[0] = '\0';
        assert_int_equal(sumo_comm_create_shm(&bad[i], &comm), SUMO_ERR_INVALID_ARGUMENT);
        assert_true(strlen(err) > 10);
    }
    sumo_store other = *store;
    other.struct_size = 8;
    o = good;
    o.store = &other;
    assert_int_equal(sumo_comm_create_shm(&o, &comm), SUMO_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "struct_size"));
    assert_int_equal(sumo_comm_create_shm(NULL, &comm), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_comm_create_shm(&good, NULL), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_store_destroy_dir(store, 1), SUMO_SUCCESS);
    remove_dir(dir);
}
int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_options_refused),
        cmocka_unit_test(test_late_duplicate_named),
        cmocka_unit_test(test_store_never_delivers),
        cmocka_unit_test(test_rank_on_another_machine),
        cmocka_unit_test(test_rank_on_another_host_name),
        cmocka_unit_test(test_killed_rank_staged),
        cmocka_unit_test(test_killed_rank_messages_named),
        cmocka_unit_test(test_leave_early_and_linger),
        cmocka_unit_test(test_rank_0_dies_while_meeting),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
