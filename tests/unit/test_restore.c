/*
 * SUMO_PARAM_RESTORE_ON_FAILURE (sumo.h, sumo_elastic.h): a collective that a lost rank breaks
 * leaves every survivor's receive buffer bit for bit as it was before the call, and its send
 * buffer untouched. The rank is lost at a chosen point inside the call: a page of its input
 * is made inaccessible, so the first read of it, after the agreement and, for the large sizes,
 * after the survivors have already written part of their outputs, traps. Threads: the trap
 * holds the reading thread while the lost rank is aborted (it then leaves the group).
 * Processes: the trap kills the lost rank outright (SIGKILL), as a crash would.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "sumo_elastic.h"
#include "support/harness.h"
#include "support/shm_group.h"

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define P 3
#define LOST 2
/* Large: several staging chunks (STAGE_BYTES) and a direct reduce long enough that the
 * survivors write before the trap is reached. */
#define SMALL 1000
/* Under the sanitizers an eighth of that still spans several staging chunks, in a fifth of
 * the time. */
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define LARGE ((size_t)1 << 17)
#else
#define LARGE ((size_t)1 << 20)
#endif
#define STAGE_BYTES ((size_t)64 * 1024)

enum kind { ALLREDUCE, BROADCAST, ALLGATHER, REDUCE_SCATTER };

typedef struct scenario {
    enum kind kind;
    sumo_op op; /* SUMO_OP_ADASUM: one made with sumo_op_create_adasum */
    size_t n;   /* elements per rank's block */
    bool in_place;
} scenario;

/* ---- the trap ------------------------------------------------------------------------------ */

static unsigned char *trap_page;
static size_t page_bytes;
static bool trap_kills; /* processes: the lost rank dies; threads: the reader waits */
static atomic_int trapped, released;

static void on_segv(int sig, siginfo_t *info, void *uctx)
{
    (void)uctx;
    unsigned char *at = info->si_addr;
    if (trap_page == NULL || at < trap_page || at >= trap_page + page_bytes) {
        signal(sig, SIG_DFL);
        return;
    }
    if (trap_kills) kill(getpid(), SIGKILL);
    mprotect(trap_page, page_bytes, PROT_READ | PROT_WRITE);
    atomic_store(&trapped, 1);
    while (!atomic_load(&released)) sched_yield();
}

static void trap_install(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, NULL);
}

/* Bytes of a rank's send and receive buffers. */
static size_t send_bytes(const scenario *s)
{
    return s->n * sizeof(float) * (s->kind == REDUCE_SCATTER ? P : 1);
}

static size_t recv_bytes(const scenario *s)
{
    return s->n * sizeof(float) * (s->kind == ALLGATHER ? P : 1);
}

/* Whole pages, so that one of them can be the trap. */
static float *pages(size_t bytes)
{
    size_t len = (bytes + page_bytes - 1) / page_bytes * page_bytes;
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(p != MAP_FAILED);
    return p;
}

static void unpages(void *p, size_t bytes)
{
    munmap(p, (bytes + page_bytes - 1) / page_bytes * page_bytes);
}

/* A rank's buffers: the send buffer with the inputs, the receive buffer with values no
 * collective would produce. In place: one buffer, holding the inputs. */
typedef struct buffers {
    float *send, *recv;
    unsigned char *send_before, *recv_before;
} buffers;

static void buffers_make(const scenario *s, int rank, buffers *b)
{
    b->send = pages(send_bytes(s));
    for (size_t i = 0; i < send_bytes(s) / sizeof(float); i++)
        b->send[i] = (float)harness_collective_value(rank, i, false);
    if (s->in_place) {
        /* NCCL's in-place forms: this rank's block of the larger buffer. */
        b->recv = s->kind == REDUCE_SCATTER ? b->send + (size_t)rank * s->n : b->send;
        if (s->kind == ALLGATHER) {
            b->recv = pages(recv_bytes(s));
            for (size_t i = 0; i < recv_bytes(s) / sizeof(float); i++) b->recv[i] = -1.5f - (float)(i % 613);
            memcpy(b->recv + (size_t)rank * s->n, b->send, send_bytes(s));
            unpages(b->send, send_bytes(s));
            b->send = b->recv + (size_t)rank * s->n;
        }
    } else {
        b->recv = pages(recv_bytes(s));
        for (size_t i = 0; i < recv_bytes(s) / sizeof(float); i++)
            b->recv[i] = -1.5f - (float)(i % 613) - (float)rank * 1000;
    }
    b->send_before = malloc(send_bytes(s));
    b->recv_before = malloc(recv_bytes(s));
    memcpy(b->send_before, b->send, send_bytes(s));
    memcpy(b->recv_before, b->recv, recv_bytes(s));
}

static void buffers_free(const scenario *s, buffers *b)
{
    if (s->in_place && s->kind == ALLGATHER) unpages(b->recv, recv_bytes(s));
    else if (s->in_place) unpages(b->send, send_bytes(s));
    else {
        unpages(b->send, send_bytes(s));
        unpages(b->recv, recv_bytes(s));
    }
    free(b->send_before);
    free(b->recv_before);
}

/* The lost rank's trap: a page of what it reads first late in the call. */
static void arm_trap(const scenario *s, buffers *b)
{
    unsigned char *base = (unsigned char *)(s->kind == ALLGATHER && s->in_place ? b->recv : b->send);
    size_t len = s->kind == ALLGATHER && s->in_place ? recv_bytes(s) : send_bytes(s);
    size_t npages = len / page_bytes;
    trap_page = base + (npages * 3 / 5) * page_bytes;
    if (trap_page + page_bytes > base + len) trap_page = base; /* small: its first page */
    mprotect(trap_page, page_bytes, PROT_NONE);
}

static sumo_result run_call(const scenario *s, sumo_comm *comm, int rank, const buffers *b)
{
    sumo_op op = s->op;
    if (op == SUMO_OP_ADASUM) {
        sumo_adasum_options o;
        sumo_adasum_options_default(&o);
        sumo_result r = sumo_op_create_adasum(comm, &o, &op);
        if (r != SUMO_SUCCESS) return r;
    }
    (void)rank;
    switch (s->kind) {
    case ALLREDUCE: return sumo_allreduce(b->send, b->recv, s->n, SUMO_FLOAT32, op, comm);
    case BROADCAST: return sumo_broadcast(b->send, b->recv, s->n, SUMO_FLOAT32, LOST, comm);
    case ALLGATHER: return sumo_allgather(b->send, b->recv, s->n, SUMO_FLOAT32, comm);
    default: return sumo_reduce_scatter(b->send, b->recv, s->n, SUMO_FLOAT32, op, comm);
    }
}

/* What a survivor checks: the failure, the output as it was, the input untouched. Returns how
 * many checks failed (printed). */
static int survivor_checks(const scenario *s, int rank, sumo_result r, const buffers *b)
{
    int bad = 0;
    if (r != SUMO_ERR_PEER_FAILURE && r != SUMO_ERR_TIMEOUT) {
        fprintf(stderr, "rank %d: the call gave %s, not a peer failure\n", rank, sumo_result_name(r));
        bad++;
    }
    if (memcmp(b->recv, b->recv_before, recv_bytes(s)) != 0) {
        size_t i = 0;
        while (((unsigned char *)b->recv)[i] == b->recv_before[i]) i++;
        fprintf(stderr, "rank %d: kind %d op %d n %zu%s: the output differs from before the call "
                "from byte %zu\n", rank, (int)s->kind, (int)s->op, s->n,
                s->in_place ? " in place" : "", i);
        bad++;
    }
    if (!s->in_place && memcmp(b->send, b->send_before, send_bytes(s)) != 0) {
        fprintf(stderr, "rank %d: the send buffer changed\n", rank);
        bad++;
    }
    return bad;
}

/* ---- threads: the lost rank is aborted while a reader is held in the trap --------------- */

typedef struct thread_arg {
    const scenario *s;
    sumo_comm *comm;
    int rank;
    buffers *b;
    sumo_result result;
    atomic_int *finished;
} thread_arg;

static void *thread_rank(void *p)
{
    thread_arg *a = p;
    a->result = run_call(a->s, a->comm, a->rank, a->b);
    atomic_fetch_add(a->finished, 1);
    if (a->rank == LOST) {
        sumo_comm_destroy(a->comm);
        a->comm = NULL;
    }
    return NULL;
}

static void run_threads(const scenario *s)
{
    sumo_comm *comms[P];
    assert_int_equal(sumo_comm_create_threads(P, comms), SUMO_SUCCESS);
    buffers b[P];
    thread_arg args[P];
    pthread_t th[P];
    atomic_int finished = 0;
    atomic_store(&trapped, 0);
    atomic_store(&released, 0);
    trap_kills = false;
    /* cmocka puts its own handler in place around each test. */
    trap_install();
    for (int r = 0; r < P; r++) {
        assert_int_equal(sumo_comm_set_param(comms[r], SUMO_PARAM_RESTORE_ON_FAILURE, 1), SUMO_SUCCESS);
        buffers_make(s, r, &b[r]);
    }
    arm_trap(s, &b[LOST]);
    for (int r = 0; r < P; r++) {
        args[r] = (thread_arg){s, comms[r], r, &b[r], SUMO_SUCCESS, &finished};
        assert_int_equal(pthread_create(&th[r], NULL, thread_rank, &args[r]), 0);
    }
    while (!atomic_load(&trapped) && atomic_load(&finished) < P) sched_yield();
    bool was_trapped = atomic_load(&trapped);
    sumo_comm_abort(comms[LOST], "test: the lost rank");
    atomic_store(&released, 1);
    for (int r = 0; r < P; r++) pthread_join(th[r], NULL);
    trap_page = NULL;
    assert_true(was_trapped);
    int bad = 0;
    for (int r = 0; r < P; r++)
        if (r != LOST) bad += survivor_checks(s, r, args[r].result, &b[r]);
    for (int r = 0; r < P; r++) {
        if (args[r].comm) sumo_comm_destroy(args[r].comm);
        buffers_free(s, &b[r]);
    }
    assert_int_equal(bad, 0);
}

static const sumo_op OPS[] = {SUMO_OP_SUM, SUMO_OP_AVERAGE, SUMO_OP_ADASUM};

static void test_threads_allreduce(void **state)
{
    (void)state;
    for (size_t o = 0; o < 3; o++)
        for (int in_place = 0; in_place < 2; in_place++) {
            run_threads(&(scenario){ALLREDUCE, OPS[o], SMALL, in_place});
            run_threads(&(scenario){ALLREDUCE, OPS[o], LARGE, in_place});
        }
}

static void test_threads_others(void **state)
{
    (void)state;
    for (int in_place = 0; in_place < 2; in_place++) {
        run_threads(&(scenario){BROADCAST, SUMO_OP_SUM, LARGE, in_place});
        run_threads(&(scenario){ALLGATHER, SUMO_OP_SUM, LARGE / P, in_place});
        run_threads(&(scenario){REDUCE_SCATTER, SUMO_OP_SUM, LARGE / P, in_place});
    }
}

/* ---- processes: the lost rank dies in the trap ------------------------------------------- */

static scenario proc_case;

static int proc_rank(sumo_comm **commp, int rank, int size, group *g)
{
    (void)size;
    (void)g;
    const scenario *s = &proc_case;
    if (sumo_comm_set_param(*commp, SUMO_PARAM_RESTORE_ON_FAILURE, 1) != SUMO_SUCCESS) return 1;
    buffers b;
    buffers_make(s, rank, &b);
    if (rank == LOST) {
        trap_kills = true;
        trap_install();
        arm_trap(s, &b);
    }
    sumo_result r = run_call(s, *commp, rank, &b);
    if (rank == LOST) {
        fprintf(stderr, "rank %d: the trap was never reached (%s)\n", rank, sumo_result_name(r));
        return 1;
    }
    int bad = survivor_checks(s, rank, r, &b);
    buffers_free(s, &b);
    return bad ? 1 : 0;
}

static void run_procs(const scenario *s)
{
    proc_case = *s;
    group g = {.size = P, .fn = proc_rank, .timeout = "60", .stage_bytes = STAGE_BYTES};
    run_group(&g);
    for (int r = 0; r < P; r++) {
        if (g.status[r] != (r == LOST ? -SIGKILL : 0))
            fprintf(stderr, "rank %d ended with %d\n", r, g.status[r]);
        assert_int_equal(g.status[r], r == LOST ? -SIGKILL : 0);
    }
}

static void test_procs_allreduce(void **state)
{
    (void)state;
    for (size_t o = 0; o < 3; o++) {
        run_procs(&(scenario){ALLREDUCE, OPS[o], SMALL, false});
        run_procs(&(scenario){ALLREDUCE, OPS[o], LARGE, true});
        run_procs(&(scenario){ALLREDUCE, OPS[o], LARGE, false});
    }
}

static void test_procs_others(void **state)
{
    (void)state;
    run_procs(&(scenario){BROADCAST, SUMO_OP_SUM, LARGE, false});
    run_procs(&(scenario){ALLGATHER, SUMO_OP_SUM, LARGE / P, true});
    run_procs(&(scenario){REDUCE_SCATTER, SUMO_OP_AVERAGE, LARGE / P, false});
}

static void test_param(void **state)
{
    (void)state;
    sumo_comm *comms[1];
    assert_int_equal(sumo_comm_create_threads(1, comms), SUMO_SUCCESS);
    int v = -1;
    assert_int_equal(sumo_comm_get_param(comms[0], SUMO_PARAM_RESTORE_ON_FAILURE, &v), SUMO_SUCCESS);
    assert_int_equal(v, 0);
    assert_int_equal(sumo_comm_set_param(comms[0], SUMO_PARAM_RESTORE_ON_FAILURE, 2),
                     SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_comm_set_param(comms[0], SUMO_PARAM_RESTORE_ON_FAILURE, 1), SUMO_SUCCESS);
    assert_int_equal(sumo_comm_get_param(comms[0], SUMO_PARAM_RESTORE_ON_FAILURE, &v), SUMO_SUCCESS);
    assert_int_equal(v, 1);
    sumo_comm_destroy(comms[0]);
}

int main(void)
{
    page_bytes = (size_t)sysconf(_SC_PAGESIZE);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_param),
        cmocka_unit_test(test_threads_allreduce),
        cmocka_unit_test(test_threads_others),
        cmocka_unit_test(test_procs_allreduce),
        cmocka_unit_test(test_procs_others),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
