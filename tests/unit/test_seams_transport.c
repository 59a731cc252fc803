/*
 * The transport seam of sumo_ext.h, used from outside as a process-group transport would use
 * it.
 *
 * Caller-supplied transport: an in-process transport written here (mailboxes with copies,
 * a generation barrier), run under sumo_comm_create_transport. The collectives over it are
 * the point-to-point algorithms, so their results are compared bit for bit with the threads
 * transport forced to the same algorithms; its failures must surface with its own detail.
 *
 * The seam for a caller's kernel table is tested in test_seams_memory.c.
 */
#define SUMO_EXPERIMENTAL_API 1
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "sumo_ext.h"
#include "support/harness.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAXP 8

/* ---- a transport from outside --------------------------------------------------------------- */

typedef struct message {
    struct message *next;
    size_t bytes;
    unsigned char data[];
} message;

typedef struct mbox_group {
    int size;
    pthread_mutex_t lock;
    pthread_cond_t changed;
    message *head[MAXP][MAXP], *tail[MAXP][MAXP]; /* [src][dst] */
    unsigned char records[2][MAXP][64];
    int arrived, generation;
    int fail_rank; /* this rank's sendrecv fails (for the error test), -1 none */
    bool aborted;
} mbox_group;

typedef struct mbox {
    mbox_group *g;
    struct xjob *owner;
    int rank;
    int gathers;
    char error[128];
} mbox;

static int wait_until(mbox_group *g, int64_t deadline_ns)
{
    struct timespec ts = {.tv_sec = deadline_ns / 1000000000, .tv_nsec = deadline_ns % 1000000000};
    return pthread_cond_timedwait(&g->changed, &g->lock, &ts);
}

static sumo_result mb_sendrecv(void *ctx, const void *sbuf, size_t sbytes, int dst, void *rbuf,
                               size_t rbytes, int src, int64_t deadline_ns)
{
    mbox *m = ctx;
    mbox_group *g = m->g;
    if (g->fail_rank == m->rank) {
        snprintf(m->error, sizeof m->error, "the link of rank %d is down", m->rank);
        return SUMO_ERR_PEER_FAILURE;
    }
    pthread_mutex_lock(&g->lock);
    if (dst >= 0) {
        message *msg = malloc(sizeof *msg + sbytes);
        msg->next = NULL;
        msg->bytes = sbytes;
        if (sbytes) memcpy(msg->data, sbuf, sbytes);
        if (g->tail[m->rank][dst]) g->tail[m->rank][dst]->next = msg;
        else g->head[m->rank][dst] = msg;
        g->tail[m->rank][dst] = msg;
        pthread_cond_broadcast(&g->changed);
    }
    sumo_result r = SUMO_SUCCESS;
    if (src >= 0) {
        while (g->head[src][m->rank] == NULL && !g->aborted && r == SUMO_SUCCESS)
            if (wait_until(g, deadline_ns) == ETIMEDOUT) r = SUMO_ERR_TIMEOUT;
        if (g->aborted) r = SUMO_ERR_PEER_FAILURE;
        if (r == SUMO_SUCCESS) {
            message *msg = g->head[src][m->rank];
            g->head[src][m->rank] = msg->next;
            if (msg->next == NULL) g->tail[src][m->rank] = NULL;
            if (msg->bytes != rbytes) r = SUMO_ERR_INTERNAL;
            else if (rbytes) memcpy(rbuf, msg->data, rbytes);
            free(msg);
        } else {
            snprintf(m->error, sizeof m->error, "no message from rank %d", src);
        }
    }
    pthread_mutex_unlock(&g->lock);
    return r;
}

static sumo_result mb_barrier(void *ctx, int64_t deadline_ns)
{
    mbox *m = ctx;
    mbox_group *g = m->g;
    pthread_mutex_lock(&g->lock);
    int gen = g->generation;
    sumo_result r = SUMO_SUCCESS;
    if (++g->arrived == g->size) {
        g->arrived = 0;
        g->generation++;
        pthread_cond_broadcast(&g->changed);
    } else {
        while (g->generation == gen && !g->aborted && r == SUMO_SUCCESS)
            if (wait_until(g, deadline_ns) == ETIMEDOUT) r = SUMO_ERR_TIMEOUT;
        if (g->aborted) r = SUMO_ERR_PEER_FAILURE;
    }
    pthread_mutex_unlock(&g->lock);
    return r;
}

static sumo_result mb_allgather(void *ctx, const void *record, void *all, size_t bytes,
                                int64_t deadline_ns)
{
    mbox *m = ctx;
    mbox_group *g = m->g;
    /* Two slots: a rank can only write gather k + 2 after everyone passed gather k + 1. */
    int slot = m->gathers++ & 1;
    pthread_mutex_lock(&g->lock);
    memcpy(g->records[slot][m->rank], record, bytes);
    pthread_mutex_unlock(&g->lock);
    sumo_result r = mb_barrier(ctx, deadline_ns);
    if (r != SUMO_SUCCESS) return r;
    pthread_mutex_lock(&g->lock);
    for (int k = 0; k < g->size; k++) memcpy((unsigned char *)all + (size_t)k * bytes, g->records[slot][k], bytes);
    pthread_mutex_unlock(&g->lock);
    return SUMO_SUCCESS;
}

static void mb_abort(void *ctx)
{
    mbox *m = ctx;
    pthread_mutex_lock(&m->g->lock);
    m->g->aborted = true;
    pthread_cond_broadcast(&m->g->changed);
    pthread_mutex_unlock(&m->g->lock);
}

static sumo_result mb_destroy(void *ctx)
{
    (void)ctx;
    return SUMO_SUCCESS;
}

static const char *mb_error(void *ctx) { return ((mbox *)ctx)->error; }

static const sumo_transport_ops MB_OPS = {
    .struct_size = sizeof(sumo_transport_ops), .name = "mailboxes", .sendrecv = mb_sendrecv,
    .allgather = mb_allgather, .barrier = mb_barrier, .abort = mb_abort, .destroy = mb_destroy,
    .error_message = mb_error};

/* The test's operations on a communicator; the same on both transports. */
typedef struct xjob xjob;
struct xjob {
    int P;
    int fail_rank;
    mbox_group g;
    mbox boxes[MAXP];
    float out[MAXP][2][1200];
    sumo_result res[MAXP];
    char msg[MAXP][256];
};

static const size_t XCOUNTS[] = {300, 1, 599, 0, 300};

static void ops_on(sumo_comm *comm, int rank, int size, xjob *x)
{
    float buf[1200], gath[MAXP * 16];
    /* The same point-to-point algorithms on both transports, so the same bits. */
    sumo_comm_set_param(comm, SUMO_PARAM_ALGORITHM, SUMO_ALGORITHM_RING);
    sumo_op op;
    sumo_adasum_options o = {.struct_size = sizeof o, .tensor_counts = XCOUNTS, .ntensors = 5};
    sumo_result r = sumo_op_create_adasum(comm, &o, &op);
    for (int i = 0; i < 1200; i++) buf[i] = (float)harness_uniform_at(3, (uint64_t)rank, (size_t)i);
    if (r == SUMO_SUCCESS) r = sumo_allreduce(buf, buf, 1200, SUMO_FLOAT32, op, comm);
    memcpy(x->out[rank][0], buf, sizeof buf);
    for (int i = 0; i < 1200; i++) buf[i] = (float)harness_collective_value(rank, (size_t)i, false);
    if (r == SUMO_SUCCESS) r = sumo_allreduce(buf, buf, 1200, SUMO_FLOAT32, SUMO_OP_AVERAGE, comm);
    if (r == SUMO_SUCCESS) r = sumo_broadcast(buf, buf, 1200, SUMO_FLOAT32, 0, comm);
    float mine[16];
    for (int i = 0; i < 16; i++) mine[i] = (float)(rank * 100 + i);
    if (r == SUMO_SUCCESS) r = sumo_allgather(mine, gath, 16, SUMO_FLOAT32, comm);
    if (r == SUMO_SUCCESS)
        r = sumo_reduce_scatter(buf, buf + (size_t)rank * (1200 / size), 1200 / size, SUMO_FLOAT32,
                                SUMO_OP_SUM, comm);
    memcpy(x->out[rank][1], buf, sizeof buf);
    if (r == SUMO_SUCCESS) memcpy(x->out[rank][1] + 1200 - 16 * size, gath, sizeof(float) * 16 * (size_t)size);
    x->res[rank] = r;
    const char *m = "";
    sumo_comm_error_message(comm, &m);
    snprintf(x->msg[rank], sizeof x->msg[rank], "%s", m);
}

static void on_threads(sumo_comm *comm, int rank, int size, void *arg)
{
    ops_on(comm, rank, size, arg);
}

static void *on_mailboxes(void *arg)
{
    mbox *m = arg;
    xjob *x = m->owner;
    sumo_transport_desc d = {.struct_size = sizeof d, .rank = m->rank, .size = x->P,
                             .ops = &MB_OPS, .ctx = m};
    sumo_comm *comm = NULL;
    sumo_result r = sumo_comm_create_transport(&d, &comm);
    if (r != SUMO_SUCCESS) {
        x->res[m->rank] = r;
        return NULL;
    }
    const char *name = NULL;
    sumo_comm_transport(comm, &name);
    if (strcmp(name, "mailboxes") != 0) x->res[m->rank] = SUMO_ERR_INTERNAL;
    else ops_on(comm, m->rank, x->P, x);
    sumo_comm_destroy(comm);
    return NULL;
}

static void run_mailboxes(xjob *x)
{
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    x->g = (mbox_group){.size = x->P, .fail_rank = x->fail_rank};
    pthread_mutex_init(&x->g.lock, NULL);
    pthread_cond_init(&x->g.changed, &attr);
    pthread_t ids[MAXP];
    for (int r = 0; r < x->P; r++) {
        x->boxes[r] = (mbox){.g = &x->g, .owner = x, .rank = r};
        assert_int_equal(pthread_create(&ids[r], NULL, on_mailboxes, &x->boxes[r]), 0);
    }
    for (int r = 0; r < x->P; r++) pthread_join(ids[r], NULL);
    for (int s = 0; s < MAXP; s++)
        for (int d = 0; d < MAXP; d++)
            while (x->g.head[s][d]) {
                message *m = x->g.head[s][d];
                x->g.head[s][d] = m->next;
                free(m);
            }
    pthread_cond_destroy(&x->g.changed);
    pthread_mutex_destroy(&x->g.lock);
    pthread_condattr_destroy(&attr);
}

static void test_caller_transport(void **state)
{
    (void)state;
    for (int P = 1; P <= 5; P++) {
        xjob *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
        a->P = b->P = P;
        a->fail_rank = b->fail_rank = -1;
        assert_int_equal(harness_run_threads(P, on_threads, a), 0);
        run_mailboxes(b);
        for (int r = 0; r < P; r++) {
            if (a->res[r] != SUMO_SUCCESS || b->res[r] != SUMO_SUCCESS)
                fail_msg("P %d rank %d: %s (%s) / %s (%s)", P, r, sumo_result_name(a->res[r]),
                         a->msg[r], sumo_result_name(b->res[r]), b->msg[r]);
            assert_memory_equal(a->out[r], b->out[r], sizeof a->out[r]);
        }
        free(a);
        free(b);
    }
}

/* A failing operation surfaces with the transport's own detail, and breaks the handle. */
static void test_caller_transport_failure(void **state)
{
    (void)state;
    setenv("SUMO_TIMEOUT", "20", 1);
    xjob *x = calloc(1, sizeof *x);
    x->P = 3;
    x->fail_rank = 1;
    run_mailboxes(x);
    assert_int_equal(x->res[1], SUMO_ERR_PEER_FAILURE);
    assert_non_null(strstr(x->msg[1], "the link of rank 1 is down"));
    assert_non_null(strstr(x->msg[1], "mailboxes"));
    for (int r = 0; r < 3; r++) assert_true(x->res[r] == SUMO_ERR_PEER_FAILURE || x->res[r] == SUMO_ERR_TIMEOUT);
    free(x);
    unsetenv("SUMO_TIMEOUT");

    sumo_comm *c = NULL;
    sumo_transport_desc d = {.struct_size = sizeof d, .rank = 2, .size = 2, .ops = &MB_OPS};
    assert_int_equal(sumo_comm_create_transport(&d, &c), SUMO_ERR_INVALID_ARGUMENT);
    sumo_transport_ops partial = MB_OPS;
    partial.allgather = NULL;
    d = (sumo_transport_desc){.struct_size = sizeof d, .rank = 0, .size = 1, .ops = &partial};
    assert_int_equal(sumo_comm_create_transport(&d, &c), SUMO_ERR_INVALID_ARGUMENT);
    assert_null(c);
}
int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_caller_transport),
        cmocka_unit_test(test_caller_transport_failure),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
