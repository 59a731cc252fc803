/*
 * The TCP transport (sumo_tcp.h) over 127.0.0.1: ranks as threads of this process (each with
 * its own communicator and connections, as separate processes would have) or as a forked
 * process, meeting through a directory store (sumo_store_create_dir).
 *
 * What the tests prove:
 *   - sums and averages of random fp32/fp64 values at P = 2, 3, 4 equal the documented
 *     rank-order sum (support/reference.h, in double) bit for bit, on every rank, and equal
 *     the threads transport's ranked algorithm (what the process-group path runs) bit for
 *     bit; Adasum equals the sequential tree of sumo.h within Horovod's tolerance and the
 *     threads transport bit for bit, with the same bits on every rank;
 *   - a peer that exits (its communicator destroyed) or is killed (SIGKILL) makes the waiting
 *     rank fail with SUMO_ERR_PEER_FAILURE, naming it, in well under the deadline;
 *   - a rank that never comes gives SUMO_ERR_TIMEOUT at a short SUMO_TIMEOUT, naming it;
 *   - a stray connection with the wrong nonce is closed during the meeting, which still
 *     succeeds; once the group has met nothing listens on the port the meeting used;
 *   - a message of another length than the receiver expects fails with a message;
 *   - a process that read the job's nonce from the store and claims rank 0 before rank 0
 *     does is not taken for it: the second claim fails the meeting for both rank 1 and the
 *     real rank 0, each naming the two claims.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "collectives/comm.h"
#include "sumo_tcp.h"
#include "support/harness.h"
#include "support/reference.h"
#include "support/temp_dir.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAXP 4

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static char store_dir[160];

static sumo_store *fresh_store(void)
{
    assert_true(make_temp_dir(store_dir, sizeof store_dir, "tcp"));
    sumo_store *s = NULL;
    assert_int_equal(sumo_store_create_dir(store_dir, &s), SUMO_SUCCESS);
    return s;
}

static void drop_store(sumo_store *s)
{
    sumo_store_destroy_dir(s, 1);
    rmdir(store_dir);
}

/* ---- a group of ranks as threads ----------------------------------------------------------- */

typedef struct rank_ctx rank_ctx;
typedef void (*scenario)(rank_ctx *c);

struct rank_ctx {
    int rank, size;
    const sumo_store *store;
    const char *prefix;
    scenario fn;
    void *arg;
    sumo_comm *comm;  /* the scenario may destroy it (and set NULL) */
    sumo_result made; /* sumo_comm_create_tcp's result */
    char err[256];
    sumo_result result; /* the scenario's */
    char message[256];
    double seconds;
    pthread_t thread;
};

/* The address the ranks listen on (NULL: the transport picks one, SUMO_SOCKET_IFNAME's). */
static const char *listen_address = "127.0.0.1";

static sumo_result create(const sumo_store *store, const char *prefix, int rank, int size,
                          char *err, size_t errlen, sumo_comm **comm)
{
    sumo_tcp_options o;
    sumo_tcp_options_default(&o);
    o.rank = rank;
    o.size = size;
    o.store = store;
    o.key_prefix = prefix;
    o.address = listen_address;
    o.error = err;
    o.error_bytes = errlen;
    return sumo_comm_create_tcp(&o, comm);
}

/* The communicator's message after the scenario's call, for the test to read. */
static void keep_message(rank_ctx *c)
{
    const char *m = NULL;
    sumo_comm_error_message(c->comm, &m);
    snprintf(c->message, sizeof c->message, "%s", m ? m : "");
}

static void *rank_main(void *p)
{
    rank_ctx *c = p;
    c->made = create(c->store, c->prefix, c->rank, c->size, c->err, sizeof c->err, &c->comm);
    if (c->made == SUMO_SUCCESS && c->fn) c->fn(c);
    if (c->comm) sumo_comm_destroy(c->comm);
    c->comm = NULL;
    return NULL;
}

/* Runs ranks [0, size) but those in skip (a bit set) as threads; returns when all end. */
static void run_ranks(rank_ctx *cs, int size, const sumo_store *store, const char *prefix,
                      scenario fn, void *arg, unsigned skip)
{
    for (int r = 0; r < size; r++) {
        cs[r] = (rank_ctx){.rank = r, .size = size, .store = store, .prefix = prefix, .fn = fn,
                           .arg = arg};
        if (!(skip >> r & 1)) assert_int_equal(pthread_create(&cs[r].thread, NULL, rank_main, &cs[r]), 0);
    }
    for (int r = 0; r < size; r++)
        if (!(skip >> r & 1)) pthread_join(cs[r].thread, NULL);
}

/* ---- results against the references --------------------------------------------------------- */

enum { N_SMALL = 5, N_LARGE = 300007 };

typedef struct results {
    size_t n;
    sumo_dtype dtype;
    int op;
    void *out[MAXP];
    sumo_result r[MAXP];
} results;

static double input_at(int rank, size_t i) { return harness_uniform_at(1234, (uint64_t)rank, i); }

static void fill_input(sumo_dtype dt, void *buf, int rank, size_t n)
{
    for (size_t i = 0; i < n; i++) harness_set(dt, buf, i, input_at(rank, i));
}

static void reduce_one(sumo_comm *comm, int rank, results *res)
{
    size_t esz = harness_dtype_size(res->dtype);
    res->out[rank] = malloc(res->n * esz);
    fill_input(res->dtype, res->out[rank], rank, res->n);
    res->r[rank] = sumo_allreduce(res->out[rank], res->out[rank], res->n, res->dtype,
                                  (uint32_t)res->op, comm);
}

static void tcp_reduce(rank_ctx *c) { reduce_one(c->comm, c->rank, c->arg); }

static void threads_reduce(sumo_comm *comm, int rank, int size, void *arg)
{
    (void)size;
    /* The algorithm a transport of messages runs (the ranked one up to 16 ranks). */
    sumo_comm_set_param(comm, SUMO_PARAM_ALGORITHM, SUMO_ALGORITHM_RANKED);
    reduce_one(comm, rank, arg);
}

static void free_results(results *res, int size)
{
    for (int r = 0; r < size; r++) free(res->out[r]);
}

static void check_case(const sumo_store *store, int P, sumo_dtype dt, int op, size_t n)
{
    char prefix[64];
    static int serial;
    snprintf(prefix, sizeof prefix, "res%d/", serial++);
    results tcp = {.n = n, .dtype = dt, .op = op}, thr = tcp;
    rank_ctx cs[MAXP];
    run_ranks(cs, P, store, prefix, tcp_reduce, &tcp, 0);
    for (int r = 0; r < P; r++) {
        if (cs[r].made != SUMO_SUCCESS) fail_msg("rank %d: %s", r, cs[r].err);
        assert_int_equal(tcp.r[r], SUMO_SUCCESS);
        assert_string_equal(cs[r].err, "");
    }
    assert_int_equal(harness_run_threads(P, threads_reduce, &thr), 0);
    size_t esz = harness_dtype_size(dt);
    for (int r = 0; r < P; r++) {
        assert_int_equal(thr.r[r], SUMO_SUCCESS);
        /* Every rank the same bits, and the threads transport's. */
        assert_memory_equal(tcp.out[r], tcp.out[0], n * esz);
        assert_memory_equal(tcp.out[r], thr.out[r], n * esz);
    }
    if (op == SUMO_OP_ADASUM) {
        double *u[MAXP];
        for (int k = 0; k < P; k++) {
            u[k] = malloc(n * sizeof(double));
            for (size_t i = 0; i < n; i++) u[k][i] = ref_round_to(dt, input_at(k, i));
        }
        size_t off[2] = {0, n};
        ref_adasum_tree(u, P, off, 1);
        double dd = 0, ww = 0;
        for (size_t i = 0; i < n; i++) {
            double d = harness_get(dt, tcp.out[0], i) - u[0][i];
            dd += d * d;
            ww += u[0][i] * u[0][i];
        }
        for (int k = 0; k < P; k++) free(u[k]);
        if (!(sqrt(dd / ww) < 100 * harness_eps(dt)))
            fail_msg("P %d adasum: relative error %.3g", P, sqrt(dd / ww));
    } else {
        /* The documented sum, left to right in rank order in the accumulator, divided once. */
        double v[MAXP];
        for (size_t i = 0; i < n; i++) {
            for (int k = 0; k < P; k++) v[k] = ref_round_to(dt, input_at(k, i));
            double want = ref_round_to(dt, ref_sum_in_order(dt, v, P, op == SUMO_OP_AVERAGE ? P : 1));
            double got = harness_get(dt, tcp.out[0], i);
            if (got != want)
                fail_msg("P %d op %d dtype %d element %zu: %.17g, the reference %.17g", P, op,
                         (int)dt, i, got, want);
        }
    }
    free_results(&tcp, P);
    free_results(&thr, P);
}

static void test_results(void **state)
{
    (void)state;
    sumo_store *store = fresh_store();
    for (int P = 2; P <= MAXP; P++) {
        check_case(store, P, SUMO_FLOAT32, SUMO_OP_SUM, N_LARGE);
        check_case(store, P, SUMO_FLOAT64, SUMO_OP_AVERAGE, N_SMALL);
        check_case(store, P, SUMO_FLOAT32, SUMO_OP_AVERAGE, N_LARGE);
        check_case(store, P, SUMO_FLOAT32, SUMO_OP_ADASUM, N_LARGE);
    }
    check_case(store, 3, SUMO_FLOAT64, SUMO_OP_ADASUM, N_SMALL);
    drop_store(store);
}

/* ---- failures -------------------------------------------------------------------------------- */

/* Rank 0 reduces; the others leave (their handles destroyed) or wait: arg says. */
static void reduce_or_leave(rank_ctx *c)
{
    float x[1024] = {0};
    if (c->rank == c->size - 1) { /* the last rank leaves at once */
        sumo_comm_destroy(c->comm);
        c->comm = NULL;
        return;
    }
    sumo_comm_set_timeout(c->comm, 60);
    double t0 = now_s();
    c->result = sumo_allreduce(x, x, 1024, SUMO_FLOAT32, SUMO_OP_SUM, c->comm);
    c->seconds = now_s() - t0;
    keep_message(c);
}

static void test_peer_exits(void **state)
{
    (void)state;
    sumo_store *store = fresh_store();
    rank_ctx cs[3];
    run_ranks(cs, 3, store, "exit/", reduce_or_leave, NULL, 0);
    for (int r = 0; r < 2; r++) {
        assert_int_equal(cs[r].made, SUMO_SUCCESS);
        if (cs[r].result != SUMO_ERR_PEER_FAILURE || cs[r].seconds > 10)
            fail_msg("rank %d: %s after %.3f s: %s", r, sumo_result_name(cs[r].result),
                     cs[r].seconds, cs[r].message);
        assert_non_null(strstr(cs[r].message, "rank"));
    }
    drop_store(store);
}

/* A forked rank 1 that is killed once met: rank 0 (this process) fails at once. */
static void test_peer_killed(void **state)
{
    (void)state;
    sumo_store *store = fresh_store();
    int ready[2];
    assert_int_equal(pipe(ready), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(ready[0]);
        sumo_store *mine = NULL;
        char err[256];
        sumo_comm *comm = NULL;
        if (sumo_store_create_dir(store_dir, &mine) != SUMO_SUCCESS ||
            create(mine, "kill/", 1, 2, err, sizeof err, &comm) != SUMO_SUCCESS)
            _exit(1);
        char one = 1;
        if (write(ready[1], &one, 1) != 1) _exit(1);
        pause(); /* until killed */
        _exit(0);
    }
    close(ready[1]);
    char err[256];
    sumo_comm *comm = NULL;
    assert_int_equal(create(store, "kill/", 0, 2, err, sizeof err, &comm), SUMO_SUCCESS);
    char one;
    assert_int_equal(read(ready[0], &one, 1), 1);
    close(ready[0]);
    kill(pid, SIGKILL);
    int status;
    waitpid(pid, &status, 0);
    sumo_comm_set_timeout(comm, 60);
    float x[4096] = {0};
    double t0 = now_s();
    sumo_result r = sumo_allreduce(x, x, 4096, SUMO_FLOAT32, SUMO_OP_SUM, comm);
    double took = now_s() - t0;
    const char *m = NULL;
    sumo_comm_error_message(comm, &m);
    if (r != SUMO_ERR_PEER_FAILURE || took > 5 || m == NULL || strstr(m, "rank 1") == NULL)
        fail_msg("%s after %.3f s: %s", sumo_result_name(r), took, m ? m : "(none)");
    sumo_comm_destroy(comm);
    drop_store(store);
}

static void test_missing_peer(void **state)
{
    (void)state;
    sumo_store *store = fresh_store();
    setenv("SUMO_TIMEOUT", "0.5", 1);
    rank_ctx cs[3];
    /* Rank 2 never comes: rank 0 and 1 wait for its address. */
    double t0 = now_s();
    run_ranks(cs, 3, store, "missing/", NULL, NULL, 1u << 2);
    double took = now_s() - t0;
    for (int r = 0; r < 2; r++) {
        if (cs[r].made != SUMO_ERR_TIMEOUT || strstr(cs[r].err, "rank 2") == NULL)
            fail_msg("rank %d: %s: %s", r, sumo_result_name(cs[r].made), cs[r].err);
        assert_null(cs[r].comm);
    }
    /* Rank 0 never comes: rank 1 waits for the job's record. */
    run_ranks(cs, 2, store, "missing0/", NULL, NULL, 1u << 0);
    if (cs[1].made != SUMO_ERR_TIMEOUT || strstr(cs[1].err, "rank 0") == NULL)
        fail_msg("rank 1: %s: %s", sumo_result_name(cs[1].made), cs[1].err);
    unsetenv("SUMO_TIMEOUT");
    assert_true(took < 5);
    drop_store(store);
}

/* With heartbeats (an elastic job's meeting after its agreement): a member whose beat stands
 * still makes the others fail within about alive_s, not at SUMO_TIMEOUT, and a rank whose
 * meeting failed says so, which fails ranks that wait for it alive. */
static const int beat_keys[3] = {-1, -1, 7}; /* ranks 0, 1 unwatched; rank 2 under beat/7 */
static const int no_beats[3] = {-1, -1, -1};
static int beat_keys_unwatched; /* no rank watched: only the failure mark can end the wait */

static void *watched_rank(void *p)
{
    rank_ctx *c = p;
    sumo_tcp_options o;
    sumo_tcp_options_default(&o);
    o.rank = c->rank;
    o.size = c->size;
    o.store = c->store;
    o.key_prefix = c->prefix;
    o.address = "127.0.0.1";
    o.error = c->err;
    o.error_bytes = sizeof c->err;
    o.alive_prefix = "beat/";
    o.alive_ranks = beat_keys_unwatched ? no_beats : beat_keys;
    o.alive_s = 0.3;
    double t0 = now_s();
    c->made = sumo_comm_create_tcp(&o, &c->comm);
    c->seconds = now_s() - t0;
    if (c->comm) sumo_comm_destroy(c->comm);
    c->comm = NULL;
    return NULL;
}

static void run_watched(rank_ctx *cs, const sumo_store *store, const char *prefix)
{
    for (int r = 0; r < 2; r++) { /* rank 2 never comes */
        cs[r] = (rank_ctx){.rank = r, .size = 3, .store = store, .prefix = prefix};
        assert_int_equal(pthread_create(&cs[r].thread, NULL, watched_rank, &cs[r]), 0);
    }
    for (int r = 0; r < 2; r++) pthread_join(cs[r].thread, NULL);
}

static void test_dead_member_by_heartbeat(void **state)
{
    (void)state;
    sumo_store *store = fresh_store();
    setenv("SUMO_TIMEOUT", "30", 1);
    rank_ctx cs[3];
    run_watched(cs, store, "dead/");
    /* The first to see rank 2's beat stand still may fail the other through its mark. */
    int named = 0;
    for (int r = 0; r < 2; r++) {
        named += strstr(cs[r].err, "rank 2's heartbeat") != NULL;
        if (cs[r].made != SUMO_ERR_PEER_FAILURE || cs[r].seconds > 3 ||
            (strstr(cs[r].err, "rank 2's heartbeat") == NULL &&
             strstr(cs[r].err, "the meeting failed on rank") == NULL))
            fail_msg("rank %d after %.2f s: %s: %s", r, cs[r].seconds,
                     sumo_result_name(cs[r].made), cs[r].err);
    }
    assert_true(named >= 1);
    char mark[64];
    size_t bytes = sizeof mark;
    assert_int_equal(store->get(store->ctx, "dead/tcp/failed", mark, &bytes, 0), SUMO_SUCCESS);
    /* A rank that gave up (its mark, written here by hand): the others leave at once, although
     * the rank they wait for (2) is not watched. */
    beat_keys_unwatched = 1;
    const char given_up[] = "rank 2 (SUMO_ERR_TIMEOUT)";
    assert_int_equal(store->set(store->ctx, "gaveup/tcp/failed", given_up, sizeof given_up - 1),
                     SUMO_SUCCESS);
    run_watched(cs, store, "gaveup/");
    beat_keys_unwatched = 0;
    for (int r = 0; r < 2; r++) {
        if (cs[r].made != SUMO_ERR_PEER_FAILURE || strstr(cs[r].err, given_up) == NULL ||
            cs[r].seconds > 3)
            fail_msg("rank %d after %.2f s: %s: %s", r, cs[r].seconds,
                     sumo_result_name(cs[r].made), cs[r].err);
    }
    unsetenv("SUMO_TIMEOUT");
    drop_store(store);
}

/* ---- the meeting: a stray connection, and nothing left listening ----------------------------- */

typedef struct addr_seen {
    uint64_t magic, nonce;
    int32_t rank;
    uint32_t port;
    char host[64];
} addr_seen; /* the layout of the transport's address record, as a peer reads it */

static bool port_listens(unsigned port)
{
    FILE *f = fopen("/proc/net/tcp", "r");
    if (f == NULL) return false;
    char line[512];
    bool found = false;
    while (fgets(line, sizeof line, f)) {
        unsigned lport = 0, st = 0;
        if (sscanf(line, " %*d: %*x:%x %*x:%*x %x", &lport, &st) == 2 && lport == port && st == 0x0A)
            found = true;
    }
    fclose(f);
    return found;
}

static void say_hi(rank_ctx *c)
{
    float x = (float)(c->rank + 1), all[MAXP];
    c->result = sumo_allgather(&x, all, 1, SUMO_FLOAT32, c->comm) == SUMO_SUCCESS
                    ? SUMO_SUCCESS : SUMO_ERR_INTERNAL;
}

static void test_stray_and_listener(void **state)
{
    (void)state;
    sumo_store *store = fresh_store();
    rank_ctx cs[3];
    for (int r = 0; r < 3; r++)
        cs[r] = (rank_ctx){.rank = r, .size = 3, .store = store, .prefix = "stray/", .fn = say_hi};
    /* Ranks 0 and 1: rank 1 listens, and waits for rank 2 before it accepts anyone. */
    for (int r = 0; r < 2; r++)
        assert_int_equal(pthread_create(&cs[r].thread, NULL, rank_main, &cs[r]), 0);
    addr_seen a;
    size_t bytes = sizeof a;
    assert_int_equal(store->get(store->ctx, "stray/tcp/addr/1", &a, &bytes,
                                (int64_t)((now_s() + 30) * 1e9)), SUMO_SUCCESS);
    assert_int_equal(bytes, sizeof a);
    assert_true(port_listens(a.port));
    /* A stranger connects and introduces itself with another nonce. */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)a.port)};
    inet_pton(AF_INET, "127.0.0.1", &sin.sin_addr);
    assert_int_equal(connect(fd, (struct sockaddr *)&sin, sizeof sin), 0);
    struct { uint64_t magic, nonce; int32_t from, to, size; uint32_t version; } bogus =
        {a.magic, a.nonce ^ 2, 0, 1, 3, 1};
    assert_int_equal(send(fd, &bogus, sizeof bogus, MSG_NOSIGNAL), (ssize_t)sizeof bogus);
    /* Rank 2 comes: the group meets all the same, and the stranger is closed unanswered. */
    rank_main(&cs[2]);
    for (int r = 0; r < 2; r++) pthread_join(cs[r].thread, NULL);
    for (int r = 0; r < 3; r++) {
        if (cs[r].made != SUMO_SUCCESS) fail_msg("rank %d: %s", r, cs[r].err);
        assert_int_equal(cs[r].result, SUMO_SUCCESS);
    }
    struct pollfd p = {.fd = fd, .events = POLLIN};
    assert_int_equal(poll(&p, 1, 10000), 1);
    char buf[64];
    assert_true(recv(fd, buf, sizeof buf, 0) <= 0);
    close(fd);
    /* Nothing listens there now, and the served keys are gone. */
    assert_false(port_listens(a.port));
    fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_int_not_equal(connect(fd, (struct sockaddr *)&sin, sizeof sin), 0);
    close(fd);
    bytes = sizeof a;
    assert_int_equal(store->get(store->ctx, "stray/tcp/addr/1", &a, &bytes,
                                (int64_t)(now_s() * 1e9)), SUMO_ERR_TIMEOUT);
    drop_store(store);
}

/* ---- an impostor with the job's nonce ---------------------------------------------------- */

/* The real rank 0's view of the store: its read of rank 1's address waits until the impostor
 * has been answered, so the impostor's claim comes first, as it did when this was found. */
typedef struct held_store {
    sumo_store store;
    const sumo_store *inner;
    _Atomic int released;
} held_store;

static sumo_result held_set(void *ctx, const char *k, const void *v, size_t n)
{
    const held_store *h = ctx;
    return h->inner->set(h->inner->ctx, k, v, n);
}

static sumo_result held_get(void *ctx, const char *k, void *v, size_t *n, int64_t deadline)
{
    held_store *h = ctx;
    if (strstr(k, "addr/1") != NULL)
        while (!h->released) usleep(1000);
    return h->inner->get(h->inner->ctx, k, v, n, deadline);
}

static sumo_result held_remove(void *ctx, const char *k)
{
    const held_store *h = ctx;
    return h->inner->remove(h->inner->ctx, k);
}

static void test_impostor_with_the_nonce(void **state)
{
    (void)state;
    setenv("SUMO_TIMEOUT", "20", 1);
    sumo_store *store = fresh_store();
    held_store held = {.store = {.struct_size = sizeof held.store, .set = held_set,
                                 .get = held_get, .remove = held_remove},
                       .inner = store};
    held.store.ctx = &held;
    rank_ctx cs[2];
    cs[0] = (rank_ctx){.rank = 0, .size = 2, .store = &held.store, .prefix = "imp/", .fn = say_hi};
    cs[1] = (rank_ctx){.rank = 1, .size = 2, .store = store, .prefix = "imp/", .fn = say_hi};
    for (int r = 0; r < 2; r++)
        assert_int_equal(pthread_create(&cs[r].thread, NULL, rank_main, &cs[r]), 0);
    /* The impostor: the job's nonce and rank 1's address, both from the store. */
    struct { uint64_t magic, nonce; int32_t size; uint32_t version; } job;
    size_t bytes = sizeof job;
    assert_int_equal(store->get(store->ctx, "imp/tcp/nonce", &job, &bytes,
                                (int64_t)((now_s() + 30) * 1e9)), SUMO_SUCCESS);
    addr_seen a;
    bytes = sizeof a;
    assert_int_equal(store->get(store->ctx, "imp/tcp/addr/1", &a, &bytes,
                                (int64_t)((now_s() + 30) * 1e9)), SUMO_SUCCESS);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)a.port)};
    inet_pton(AF_INET, "127.0.0.1", &sin.sin_addr);
    assert_int_equal(connect(fd, (struct sockaddr *)&sin, sizeof sin), 0);
    struct { uint64_t magic, nonce; int32_t from, to, size; uint32_t version; } hello =
        {job.magic, job.nonce, 0, 1, 2, job.version}, back;
    assert_int_equal(send(fd, &hello, sizeof hello, MSG_NOSIGNAL), (ssize_t)sizeof hello);
    assert_int_equal(recv(fd, &back, sizeof back, MSG_WAITALL), (ssize_t)sizeof back);
    assert_int_equal(back.from, 1); /* answered as rank 0: the claim was taken */
    held.released = 1;              /* now the real rank 0 comes */
    for (int r = 0; r < 2; r++) pthread_join(cs[r].thread, NULL);
    close(fd);
    for (int r = 0; r < 2; r++) {
        print_message("rank %d: %s: %s\n", r, sumo_result_name(cs[r].made), cs[r].err);
        assert_int_equal(cs[r].made, SUMO_ERR_MISMATCH);
    }
    assert_non_null(strstr(cs[1].err, "rank 0 was claimed by two connections"));
    assert_non_null(strstr(cs[0].err, "another connection already claims rank 0"));
    unsetenv("SUMO_TIMEOUT");
    drop_store(store);
}

/* SUMO_SOCKET_IFNAME picks the address: the loopback interface by its name and by a prefix
 * of it, the address its peers read in the store being that interface's; a name no
 * interface has is refused, naming it and the interfaces here. */
static void test_socket_ifname(void **state)
{
    (void)state;
    sumo_store *store = fresh_store();
    listen_address = NULL;
    const char *names[] = {"lo", "l"};
    for (int k = 0; k < 2; k++) {
        setenv("SUMO_SOCKET_IFNAME", names[k], 1);
        char prefix[32];
        snprintf(prefix, sizeof prefix, "ifname%d/", k);
        rank_ctx cs[3];
        for (int r = 0; r < 3; r++)
            cs[r] = (rank_ctx){.rank = r, .size = 3, .store = store, .prefix = prefix, .fn = say_hi};
        /* Rank 1 publishes its address and waits for rank 2's, which comes once it is read. */
        for (int r = 0; r < 2; r++)
            assert_int_equal(pthread_create(&cs[r].thread, NULL, rank_main, &cs[r]), 0);
        addr_seen a;
        size_t bytes = sizeof a;
        char key[64];
        snprintf(key, sizeof key, "%stcp/addr/1", prefix);
        assert_int_equal(store->get(store->ctx, key, &a, &bytes, (int64_t)((now_s() + 30) * 1e9)),
                         SUMO_SUCCESS);
        rank_main(&cs[2]);
        for (int r = 0; r < 2; r++) pthread_join(cs[r].thread, NULL);
        if (strcmp(a.host, "127.0.0.1") != 0 && strcmp(a.host, "::1") != 0)
            fail_msg("SUMO_SOCKET_IFNAME=%s: rank 1 published %s", names[k], a.host);
        for (int r = 0; r < 3; r++) {
            if (cs[r].made != SUMO_SUCCESS) fail_msg("rank %d: %s", r, cs[r].err);
            assert_int_equal(cs[r].result, SUMO_SUCCESS);
        }
    }
    setenv("SUMO_SOCKET_IFNAME", "nosuchif9", 1);
    setenv("SUMO_TIMEOUT", "5", 1);
    rank_ctx cs[2];
    run_ranks(cs, 2, store, "ifname_bad/", NULL, NULL, 0);
    if (cs[1].made != SUMO_ERR_INVALID_ARGUMENT || !strstr(cs[1].err, "SUMO_SOCKET_IFNAME=nosuchif9") ||
        !strstr(cs[1].err, "lo"))
        fail_msg("rank 1: %s: %s", sumo_result_name(cs[1].made), cs[1].err);
    /* Rank 0 learns of it through the store, not at its deadline. */
    assert_int_not_equal(cs[0].made, SUMO_SUCCESS);
    unsetenv("SUMO_SOCKET_IFNAME");
    unsetenv("SUMO_TIMEOUT");
    listen_address = "127.0.0.1";
    drop_store(store);
}

/* A message of another length than the receiver expects. */
static void mismatched(rank_ctx *c)
{
    sumo__transport *tp = c->comm->tp;
    char buf[16] = {0};
    if (c->rank == 0) {
        c->result = tp->ops->sendrecv(tp, buf, 8, 1, NULL, 0, -1);
    } else {
        c->result = tp->ops->sendrecv(tp, NULL, 0, -1, buf, 16, 0);
        keep_message(c);
    }
}

static void test_length_mismatch(void **state)
{
    (void)state;
    sumo_store *store = fresh_store();
    rank_ctx cs[2];
    run_ranks(cs, 2, store, "len/", mismatched, NULL, 0);
    assert_int_equal(cs[0].made, SUMO_SUCCESS);
    assert_int_equal(cs[1].result, SUMO_ERR_INTERNAL);
    if (strstr(cs[1].message, "another length") == NULL) fail_msg("%s", cs[1].message);
    drop_store(store);
}

static void test_options(void **state)
{
    (void)state;
    sumo_comm *comm = (sumo_comm *)1;
    char err[256];
    sumo_tcp_options o;
    assert_int_equal(sumo_tcp_options_default(&o), SUMO_SUCCESS);
    o.error = err;
    o.error_bytes = sizeof err;
    o.size = 2;
    o.key_prefix = "x/";
    assert_int_equal(sumo_comm_create_tcp(&o, &comm), SUMO_ERR_INVALID_ARGUMENT);
    assert_null(comm);
    assert_non_null(strstr(err, "store"));
    o.struct_size = 8;
    assert_int_equal(sumo_comm_create_tcp(&o, &comm), SUMO_ERR_INVALID_ARGUMENT);
    /* One rank: nothing to meet, and it is a communicator all the same. */
    sumo_store *store = fresh_store();
    sumo_tcp_options_default(&o);
    o.size = 1;
    o.store = store;
    o.key_prefix = "one/";
    assert_int_equal(sumo_comm_create_tcp(&o, &comm), SUMO_SUCCESS);
    const char *name = NULL;
    assert_int_equal(sumo_comm_transport(comm, &name), SUMO_SUCCESS);
    assert_string_equal(name, "tcp");
    float x[3] = {1, 2, 3};
    assert_int_equal(sumo_allreduce(x, x, 3, SUMO_FLOAT32, SUMO_OP_AVERAGE, comm), SUMO_SUCCESS);
    assert_true(x[2] == 3.0f);
    sumo_comm_destroy(comm);
    drop_store(store);
}

int main(void)
{
    signal(SIGPIPE, SIG_DFL); /* a SIGPIPE would end the test: the transport must not raise it */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_options),
        cmocka_unit_test(test_results),
        cmocka_unit_test(test_peer_exits),
        cmocka_unit_test(test_peer_killed),
        cmocka_unit_test(test_missing_peer),
        cmocka_unit_test(test_dead_member_by_heartbeat),
        cmocka_unit_test(test_stray_and_listener),
        cmocka_unit_test(test_impostor_with_the_nonce),
        cmocka_unit_test(test_length_mismatch),
        cmocka_unit_test(test_socket_ifname),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
