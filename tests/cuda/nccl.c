/*
 * test_cuda: the NCCL transport. On the host, over a fake NCCL (in-process mailboxes behind
 * the same call table the real NCCL fills): every collective bit for bit the threads
 * transport's (same algorithms), host buffers staged, deadlines, aborts, NCCL errors,
 * ownership. On the device, the real NCCL at one rank. The fake is fake_nccl.c's; two levels
 * with NCCL between the nodes are hier.c's.
 */
#include "cuda_test.h"
#include "fake_nccl.h"
#include "nccl_api.h"

#include <cuda_runtime_api.h>

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__has_include)
#if __has_include(<nccl.h>)
#include <nccl.h>
/* The constants nccl_api.h writes out by value, checked where nccl.h is at hand. */
_Static_assert(SUMO_NCCL_SUCCESS == (int)ncclSuccess && SUMO_NCCL_SYSTEM_ERROR == (int)ncclSystemError &&
                   SUMO_NCCL_REMOTE_ERROR == (int)ncclRemoteError &&
                   SUMO_NCCL_IN_PROGRESS == (int)ncclInProgress &&
                   SUMO_NCCL_UNHANDLED_CUDA_ERROR == (int)ncclUnhandledCudaError &&
                   SUMO_NCCL_INTERNAL_ERROR == (int)ncclInternalError &&
                   SUMO_NCCL_INVALID_USAGE == (int)ncclInvalidUsage,
               "ncclResult_t values");
_Static_assert(SUMO_NCCL_UINT8 == (int)ncclUint8 && SUMO_NCCL_SUM == (int)ncclSum, "nccl enums");
_Static_assert(sizeof(ncclUniqueId) == sizeof(sumo_cuda__nccl_id), "ncclUniqueId");
#endif
#endif
_Static_assert(SUMO_CUDA_NOT_READY == (int)cudaErrorNotReady, "cudaErrorNotReady");

/* The same operations on any communicator: Adasum per tensor, average, broadcast, allgather,
 * reduce-scatter, on host or emulated-device buffers; results to host memory. */
#define XN 1200
static const size_t XCOUNTS[] = {300, 1, 599, 0, 300};

typedef struct xjob {
    int P, kind;
    bool ring; /* force the point-to-point algorithms (threads transport) */
    float out[MAXP][3][XN];
    sumo_result res[MAXP];
    char msg[MAXP][256];
    fk_net net;
    double timeout; /* > 0: set on the handle */
    int abort_rank; /* a thread calls sumo_comm_abort on this rank's handle, -1 none */
} xjob;

typedef struct abort_arg {
    sumo_comm *comm;
} abort_arg;

static void *abort_later(void *p)
{
    abort_arg *a = p;
    struct timespec ts = {0, 100 * 1000 * 1000};
    nanosleep(&ts, NULL);
    sumo_comm_abort(a->comm, "the test gives up");
    return NULL;
}

static void x_ops(sumo_comm *comm, int rank, int size, xjob *x)
{
    sumo_result r = SUMO_SUCCESS;
    if (x->ring) r = sumo_comm_set_param(comm, SUMO_PARAM_ALGORITHM, SUMO_ALGORITHM_RING);
    if (r == SUMO_SUCCESS && x->kind == M_EMU) r = sumo_comm_add_kernels(comm, g_emu_table);
    if (r == SUMO_SUCCESS && x->timeout > 0) r = sumo_comm_set_timeout(comm, x->timeout);
    pthread_t aborter;
    abort_arg aa = {.comm = comm};
    bool aborting = x->abort_rank == rank;
    if (aborting) pthread_create(&aborter, NULL, abort_later, &aa);
    size_t bytes = XN * sizeof(float);
    float *h = malloc(bytes), *g = malloc(16 * MAXP * sizeof(float));
    float *buf = m_alloc(x->kind, bytes), *gath = m_alloc(x->kind, 16 * MAXP * sizeof(float));
    float *mine = m_alloc(x->kind, 16 * sizeof(float));
    sumo_op op = SUMO_OP_SUM;
    sumo_adasum_options o = {.struct_size = sizeof o, .tensor_counts = XCOUNTS, .ntensors = 5};
    if (r == SUMO_SUCCESS) r = sumo_op_create_adasum(comm, &o, &op);
    for (int i = 0; i < XN; i++) h[i] = (float)harness_uniform_at(3, (uint64_t)rank, (size_t)i);
    m_put(x->kind, buf, h, bytes);
    if (r == SUMO_SUCCESS) r = sumo_allreduce(buf, buf, XN, SUMO_FLOAT32, op, comm);
    m_get(x->kind, x->out[rank][0], buf, bytes);
    for (int i = 0; i < XN; i++) h[i] = (float)harness_collective_value(rank, (size_t)i, false);
    m_put(x->kind, buf, h, bytes);
    if (r == SUMO_SUCCESS) r = sumo_allreduce(buf, buf, XN, SUMO_FLOAT32, SUMO_OP_AVERAGE, comm);
    if (r == SUMO_SUCCESS) r = sumo_broadcast(buf, buf, XN, SUMO_FLOAT32, size - 1, comm);
    for (int i = 0; i < 16; i++) g[i] = (float)(rank * 100 + i);
    m_put(x->kind, mine, g, 16 * sizeof(float));
    if (r == SUMO_SUCCESS) r = sumo_allgather(mine, gath, 16, SUMO_FLOAT32, comm);
    if (r == SUMO_SUCCESS)
        r = sumo_reduce_scatter(buf, buf + (size_t)rank * (XN / size), XN / size, SUMO_FLOAT32,
                                SUMO_OP_SUM, comm);
    m_get(x->kind, x->out[rank][1], buf, bytes);
    m_get(x->kind, x->out[rank][2], gath, 16 * (size_t)size * sizeof(float));
    x->res[rank] = r;
    const char *m = "";
    sumo_comm_error_message(comm, &m);
    snprintf(x->msg[rank], sizeof x->msg[rank], "%s", m);
    if (aborting) pthread_join(aborter, NULL);
    m_free(x->kind, buf);
    m_free(x->kind, gath);
    m_free(x->kind, mine);
    free(h);
    free(g);
}

static void x_on_threads(sumo_comm *comm, int rank, int size, void *arg) { x_ops(comm, rank, size, arg); }

typedef struct x_rank_arg {
    xjob *x;
    int rank;
} x_rank_arg;

static void *x_on_fake(void *p)
{
    x_rank_arg *a = p;
    xjob *x = a->x;
    sumo_comm *comm = NULL;
    fk_rank *me = &x->net.ranks[a->rank];
    sumo_result r = sumo_cuda__nccl_comm_create(&FAKE, me, me, &comm);
    if (r != SUMO_SUCCESS) {
        x->res[a->rank] = r;
        return NULL;
    }
    const char *name = "";
    sumo_comm_transport(comm, &name);
    if (strcmp(name, "nccl") != 0) x->res[a->rank] = SUMO_ERR_INTERNAL;
    else if (x->net.hang_rank == a->rank) x->res[a->rank] = SUMO_SUCCESS; /* stands aside */
    else x_ops(comm, a->rank, x->P, x);
    sumo_comm_destroy(comm);
    return NULL;
}

static void run_fake(xjob *x)
{
    pthread_t ids[MAXP];
    x_rank_arg args[MAXP];
    for (int r = 0; r < x->P; r++) {
        args[r] = (x_rank_arg){.x = x, .rank = r};
        pthread_create(&ids[r], NULL, x_on_fake, &args[r]);
    }
    for (int r = 0; r < x->P; r++) pthread_join(ids[r], NULL);
}

static xjob *xjob_new(int P, int kind)
{
    xjob *x = calloc(1, sizeof *x);
    x->P = P;
    x->kind = kind;
    x->abort_rank = -1;
    fk_net_init(&x->net, P);
    return x;
}

static void xjob_free(xjob *x)
{
    fk_net_free(&x->net);
    free(x);
}

/* Every collective over the fake NCCL equals the threads transport's point-to-point run bit
 * for bit (host buffers, staged), and on "device" buffers (no staging) sum, average,
 * broadcast, allgather and reduce-scatter again bit for bit, Adasum within rounding. */
void t_nccl_fake_collectives(void)
{
    for (int P = 1; P <= 4; P++) {
        xjob *a = xjob_new(P, M_HOST), *b = xjob_new(P, M_HOST), *c = xjob_new(P, M_EMU);
        a->ring = b->ring = c->ring = true; /* the same algorithms, so the same bits */
        CHECK(harness_run_threads(P, x_on_threads, a) == 0, "threads");
        run_fake(b);
        run_fake(c);
        for (int r = 0; r < P; r++) {
            CHECK(a->res[r] == SUMO_SUCCESS && b->res[r] == SUMO_SUCCESS && c->res[r] == SUMO_SUCCESS,
                  "P %d rank %d: threads %s, nccl %s (%s), nccl on device memory %s (%s)", P, r,
                  sumo_result_name(a->res[r]), sumo_result_name(b->res[r]), b->msg[r],
                  sumo_result_name(c->res[r]), c->msg[r]);
            CHECK(memcmp(a->out[r], b->out[r], sizeof a->out[r]) == 0, "P %d rank %d: nccl differs from threads", P, r);
            CHECK(memcmp(a->out[r][1], c->out[r][1], sizeof a->out[r][1]) == 0 &&
                      memcmp(a->out[r][2], c->out[r][2], sizeof a->out[r][2]) == 0,
                  "P %d rank %d: device buffers differ", P, r);
            CHECK(memcmp(c->out[r][0], c->out[0][0], sizeof c->out[r][0]) == 0, "Adasum differs across ranks");
            for (int i = 0; i < XN; i++)
                CHECK(fabsf(c->out[r][0][i] - a->out[r][0][i]) <= 1e-5f * (1 + fabsf(a->out[r][0][i])),
                      "P %d rank %d Adasum element %d: %g vs %g", P, r, i, c->out[r][0][i], a->out[r][0][i]);
        }
        CHECK(atomic_load(&b->net.staged_copies) > 0, "host buffers went through the staging area");
        for (int r = 0; r < P; r++) {
            CHECK(atomic_load(&b->net.destroys[r]) == 1 && atomic_load(&b->net.aborts[r]) == 0,
                  "healthy: destroyed once, never aborted (rank %d: %d, %d)", r,
                  atomic_load(&b->net.destroys[r]), atomic_load(&b->net.aborts[r]));
        }
        xjob_free(a);
        xjob_free(b);
        xjob_free(c);
    }
}

/* A peer that never completes: the deadline holds, the communicator is aborted (not
 * destroyed, which would wait for the peer), and the message says what happened. */
void t_nccl_fake_timeout(void)
{
    xjob *x = xjob_new(2, M_HOST);
    x->net.hang_rank = 1;
    x->timeout = 0.3;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    run_fake(x);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double s = (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec);
    CHECK(x->res[0] == SUMO_ERR_TIMEOUT, "rank 0: %s (%s)", sumo_result_name(x->res[0]), x->msg[0]);
    CHECK(strstr(x->msg[0], "nccl") && strstr(x->msg[0], "deadline"), "message: %s", x->msg[0]);
    CHECK(s < 5.0, "took %.2f s", s);
    CHECK(atomic_load(&x->net.aborts[0]) == 1 && atomic_load(&x->net.destroys[0]) == 0,
          "aborted once, not destroyed: %d, %d", atomic_load(&x->net.aborts[0]),
          atomic_load(&x->net.destroys[0]));
    xjob_free(x);
}

/* An NCCL error surfaces with NCCL's own text, as a peer failure. */
void t_nccl_fake_error(void)
{
    xjob *x = xjob_new(2, M_HOST);
    x->net.error_rank = 0;
    x->timeout = 2;
    run_fake(x);
    CHECK(x->res[0] == SUMO_ERR_PEER_FAILURE, "rank 0: %s (%s)", sumo_result_name(x->res[0]), x->msg[0]);
    CHECK(strstr(x->msg[0], "the remote peer went away") != NULL, "message: %s", x->msg[0]);
    CHECK(x->res[1] == SUMO_ERR_TIMEOUT || x->res[1] == SUMO_ERR_PEER_FAILURE, "rank 1: %s",
          sumo_result_name(x->res[1]));
    CHECK(atomic_load(&x->net.aborts[0]) == 1, "aborted");
    xjob_free(x);
}

/* sumo_comm_abort from another thread while an operation waits: it ends now, not at the
 * deadline. */
void t_nccl_fake_abort(void)
{
    xjob *x = xjob_new(2, M_HOST);
    x->net.hang_rank = 1;
    x->timeout = 30;
    x->abort_rank = 0;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    run_fake(x);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double s = (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec);
    CHECK(x->res[0] != SUMO_SUCCESS && s < 10.0, "rank 0: %s after %.2f s", sumo_result_name(x->res[0]), s);
    CHECK(atomic_load(&x->net.aborts[0]) == 1 && atomic_load(&x->net.destroys[0]) == 0, "aborted once");
    xjob_free(x);
}

/* A communicator that does not answer is refused, and stays the caller's. */
void t_nccl_fake_create(void)
{
    fk_net n;
    fk_net_init(&n, 1);
    n.bad_count = true;
    sumo_comm *c = (sumo_comm *)1;
    sumo_result r = sumo_cuda__nccl_comm_create(&FAKE, &n.ranks[0], &n.ranks[0], &c);
    CHECK(r == SUMO_ERR_INVALID_ARGUMENT && c == NULL, "%s", sumo_result_name(r));
    CHECK(atomic_load(&n.aborts[0]) == 0 && atomic_load(&n.destroys[0]) == 0, "left alone");
    CHECK(sumo_cuda__nccl_comm_create(&FAKE, NULL, NULL, &c) == SUMO_ERR_INVALID_ARGUMENT, "NULL comm");
    /* The operations directly: zero-byte sides skip, a send to itself arrives. */
    n.bad_count = false;
    void *ctx;
    int rank = -1, size = -1;
    CHECK_OK(sumo_cuda__nccl_open(&FAKE, &n.ranks[0], &n.ranks[0], &ctx, &rank, &size));
    CHECK(rank == 0 && size == 1, "rank %d size %d", rank, size);
    const sumo_transport_ops *ops = sumo_cuda__nccl_ops();
    CHECK(ops->carries(ctx, "cuda") && !ops->carries(ctx, "host"), "carries cuda memory");
    int64_t later = (int64_t)1e18;
    char sbuf[100] = "a message to itself", rbuf[100] = "";
    CHECK_OK(ops->sendrecv(ctx, sbuf, sizeof sbuf, 0, rbuf, sizeof rbuf, 0, later));
    CHECK(strcmp(rbuf, sbuf) == 0, "received %s", rbuf);
    CHECK_OK(ops->sendrecv(ctx, sbuf, 0, 0, rbuf, 0, 0, later));
    CHECK_OK(ops->sendrecv(ctx, NULL, 0, -1, NULL, 0, -1, later));
    uint64_t rec = 42, all = 0;
    CHECK_OK(ops->allgather(ctx, &rec, &all, sizeof rec, later));
    CHECK(all == 42, "allgather");
    CHECK_OK(ops->barrier(ctx, later));
    sumo_cuda__nccl_close_unowned(ctx);
    CHECK(atomic_load(&n.destroys[0]) == 0, "an unowned context leaves the communicator alone");
    fk_net_free(&n);
}

/* ---- the real NCCL, at one rank ---------------------------------------------------------- */

/* NCCL at one rank (NCCL refuses two ranks of one communicator on one device): the real
 * library behind the transport: ncclSend/ncclRecv to itself from device and host buffers,
 * allgather, barrier, then sumo's collectives on device buffers. */
void d_nccl_one_rank(void)
{
    sumo_cuda__nccl_api api;
    char why[256];
    if (sumo_cuda__nccl_load(&api, why, sizeof why) != SUMO_SUCCESS) {
        printf("    (NCCL not loaded: %s; set SUMO_NCCL_LIBRARY)\n", why);
        CHECK(getenv("SUMO_CUDA_TEST_REQUIRE_NCCL") == NULL, "NCCL required: %s", why);
        return;
    }
    sumo_cuda__nccl_id id;
    void *comm = NULL;
    CHECK(api.get_unique_id(&id) == SUMO_NCCL_SUCCESS, "ncclGetUniqueId");
    CHECK(api.comm_init_rank(&comm, 1, id, 0) == SUMO_NCCL_SUCCESS, "ncclCommInitRank");
    void *ctx;
    int rank, size;
    CHECK_OK(sumo_cuda__nccl_open(&api, comm, NULL, &ctx, &rank, &size));
    const sumo_transport_ops *ops = sumo_cuda__nccl_ops();
    int64_t later;
    {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        later = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec + (int64_t)60e9;
    }
    enum { B = 1 << 20 };
    unsigned char *hs = malloc(B), *hr = malloc(B);
    for (int i = 0; i < B; i++) hs[i] = (unsigned char)(i * 7 + 3);
    void *ds = m_alloc(M_DEV, B), *dr = m_alloc(M_DEV, B);
    m_put(M_DEV, ds, hs, B);
    CHECK_OK(ops->sendrecv(ctx, ds, B, 0, dr, B, 0, later));
    m_get(M_DEV, hr, dr, B);
    CHECK(memcmp(hs, hr, B) == 0, "device to device");
    memset(hr, 0, B);
    CHECK_OK(ops->sendrecv(ctx, hs, B, 0, hr, B, 0, later));
    CHECK(memcmp(hs, hr, B) == 0, "host to host through the staging area");
    uint64_t rec = 77, all = 0;
    CHECK_OK(ops->allgather(ctx, &rec, &all, sizeof rec, later));
    CHECK(all == 77, "allgather");
    CHECK_OK(ops->barrier(ctx, later));
    sumo_cuda__nccl_own(ctx);
    CHECK_OK(ops->destroy(ctx)); /* ends comm, and closes the library handle it was given */
    m_free(M_DEV, ds);
    m_free(M_DEV, dr);
    free(hs);
    free(hr);
    /* The public path: a communicator made through sumo, the kernels added, collectives on
     * device buffers (at one rank: the input comes back, Adasum included). */
    unsigned char uid[128];
    CHECK_OK(sumo_nccl_unique_id(uid, sizeof uid));
    sumo_comm *c = NULL;
    CHECK_OK(sumo_comm_create_nccl_rank(1, uid, sizeof uid, 0, 0, NULL, &c));
    CHECK_OK(sumo_comm_add_cuda(c, g_dev_kernels));
    const char *name = "";
    sumo_comm_transport(c, &name);
    CHECK(strcmp(name, "nccl") == 0, "transport %s", name);
    size_t n = 100000;
    float *h = malloc(n * 4), *back = malloc(n * 4);
    gen(SUMO_FLOAT32, h, n, 4, false);
    float *d = m_alloc(M_DEV, n * 4), *o = m_alloc(M_DEV, n * 4);
    m_put(M_DEV, d, h, n * 4);
    const sumo_op ops_[] = {SUMO_OP_SUM, SUMO_OP_AVERAGE, SUMO_OP_ADASUM};
    for (int i = 0; i < 3; i++) {
        CHECK_OK(sumo_cuda_allreduce(d, o, n, SUMO_FLOAT32, ops_[i], c, NULL));
        m_get(M_DEV, back, o, n * 4);
        CHECK(memcmp(back, h, n * 4) == 0, "op %u at one rank returns the input", ops_[i]);
    }
    CHECK_OK(sumo_broadcast(d, o, n, SUMO_FLOAT32, 0, c));
    CHECK_OK(sumo_allreduce(h, back, n, SUMO_FLOAT32, SUMO_OP_SUM, c)); /* host buffers too */
    CHECK(memcmp(back, h, n * 4) == 0, "host buffers");
    CHECK_OK(sumo_comm_destroy(c));
    m_free(M_DEV, d);
    m_free(M_DEV, o);
    free(h);
    free(back);
}
