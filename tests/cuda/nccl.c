/*
 * test_cuda: the NCCL transport. On the host, over a fake NCCL (in-process mailboxes behind
 * the same call table the real NCCL fills): every collective bit for bit the threads
 * transport's (same algorithms), host buffers staged, deadlines, aborts, NCCL errors,
 * ownership. On the device, the real NCCL at one rank.
 */
#include "cuda_test.h"
#include "nccl_api.h"
#include "sumo_hier.h"

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

/* ---- a fake NCCL ------------------------------------------------------------------------- */

/* The fake: each rank's "stream" is a queue of operations run in order whenever it is queried
 * (copies, sends into mailboxes, receives from them, allgathers and one-byte allreduces that
 * complete once every rank has contributed). "Device" memory is the emulated arena. */
enum { FK_COPY, FK_SEND, FK_RECV, FK_GATHER, FK_REDUCE1 };

typedef struct fk_op {
    struct fk_op *next;
    int kind, peer;
    void *dst;
    const void *src;
    size_t bytes;
    bool contributed;
    long gen;
} fk_op;

typedef struct fk_msg {
    struct fk_msg *next;
    size_t bytes;
    unsigned char data[];
} fk_msg;

typedef struct fk_net fk_net;
typedef struct fk_rank {
    fk_net *net;
    int rank;
    fk_op *head, *tail;
    long collectives;
} fk_rank;

struct fk_net {
    int P;
    pthread_mutex_t lock;
    fk_msg *mhead[MAXP][MAXP], *mtail[MAXP][MAXP];
    unsigned char slots[2][MAXP][256];
    int arrived[2], consumed[2];
    fk_rank ranks[MAXP];
    int hang_rank, error_rank;
    bool bad_count;
    atomic_int aborts[MAXP], destroys[MAXP], staged_copies;
};

/* The group being built by this thread (NCCL's group state is per thread as well). */
static _Thread_local struct {
    int depth, nops;
    fk_op *ops[8];
    fk_rank *owner[8];
} fk_group;

static void fk_enqueue(fk_rank *r, fk_op *op)
{
    pthread_mutex_lock(&r->net->lock);
    op->next = NULL;
    if (r->tail) r->tail->next = op;
    else r->head = op;
    r->tail = op;
    pthread_mutex_unlock(&r->net->lock);
}

static fk_op *fk_new(int kind, void *dst, const void *src, size_t bytes, int peer)
{
    fk_op *op = calloc(1, sizeof *op);
    op->kind = kind, op->dst = dst, op->src = src, op->bytes = bytes, op->peer = peer;
    return op;
}

/* Runs the head of r's queue while it can; true when the queue is empty. Under net->lock. */
static bool fk_progress(fk_rank *r)
{
    fk_net *n = r->net;
    while (r->head) {
        fk_op *op = r->head;
        if (op->kind == FK_COPY) {
            memcpy(op->dst, op->src, op->bytes);
        } else if (op->kind == FK_SEND) {
            fk_msg *m = malloc(sizeof *m + op->bytes);
            m->next = NULL;
            m->bytes = op->bytes;
            memcpy(m->data, op->src, op->bytes);
            if (n->mtail[r->rank][op->peer]) n->mtail[r->rank][op->peer]->next = m;
            else n->mhead[r->rank][op->peer] = m;
            n->mtail[r->rank][op->peer] = m;
        } else if (op->kind == FK_RECV) {
            fk_msg *m = n->mhead[op->peer][r->rank];
            if (m == NULL) return false;
            n->mhead[op->peer][r->rank] = m->next;
            if (m->next == NULL) n->mtail[op->peer][r->rank] = NULL;
            memcpy(op->dst, m->data, m->bytes < op->bytes ? m->bytes : op->bytes);
            free(m);
        } else { /* a collective: contribute, wait for all, read, and let the slot go */
            int slot = (int)(op->gen & 1);
            if (!op->contributed) {
                if (op->kind == FK_GATHER) memcpy(n->slots[slot][r->rank], op->src, op->bytes);
                n->arrived[slot]++;
                op->contributed = true;
            }
            if (n->arrived[slot] < n->P) return false;
            if (op->kind == FK_GATHER)
                for (int k = 0; k < n->P; k++)
                    memcpy((unsigned char *)op->dst + (size_t)k * op->bytes, n->slots[slot][k], op->bytes);
            if (++n->consumed[slot] == n->P) n->arrived[slot] = n->consumed[slot] = 0;
        }
        r->head = op->next;
        if (r->head == NULL) r->tail = NULL;
        free(op);
    }
    return true;
}

static int fk_stream_query(void *s)
{
    fk_rank *r = s;
    if (r->rank == r->net->hang_rank) return SUMO_CUDA_NOT_READY;
    pthread_mutex_lock(&r->net->lock);
    bool done = fk_progress(r);
    pthread_mutex_unlock(&r->net->lock);
    return done ? SUMO_CUDA_SUCCESS : SUMO_CUDA_NOT_READY;
}

static int fk_group_start(void)
{
    fk_group.depth++;
    return SUMO_NCCL_SUCCESS;
}

static int fk_p2p(int kind, void *dst, const void *src, size_t bytes, int peer, void *comm)
{
    fk_rank *r = comm;
    fk_op *op = fk_new(kind, dst, src, bytes, peer);
    if (fk_group.depth == 0) {
        fk_enqueue(r, op);
        return SUMO_NCCL_SUCCESS;
    }
    if (fk_group.nops == 8) return SUMO_NCCL_INTERNAL_ERROR;
    fk_group.ops[fk_group.nops] = op;
    fk_group.owner[fk_group.nops++] = r;
    return SUMO_NCCL_SUCCESS;
}

static int fk_group_end(void)
{
    if (--fk_group.depth > 0) return SUMO_NCCL_SUCCESS;
    /* Sends first: NCCL runs a group's operations together, so neither side waits for its own
     * receive before sending. */
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < fk_group.nops; i++)
            if ((fk_group.ops[i]->kind == FK_SEND) == (pass == 0)) fk_enqueue(fk_group.owner[i], fk_group.ops[i]);
    fk_group.nops = 0;
    return SUMO_NCCL_SUCCESS;
}

static int fk_send(const void *buf, size_t count, int dt, int peer, void *comm, void *stream)
{
    (void)dt;
    (void)stream;
    return fk_p2p(FK_SEND, NULL, buf, count, peer, comm);
}

static int fk_recv(void *buf, size_t count, int dt, int peer, void *comm, void *stream)
{
    (void)dt;
    (void)stream;
    return fk_p2p(FK_RECV, buf, NULL, count, peer, comm);
}

static int fk_all_gather(const void *s, void *d, size_t count, int dt, void *comm, void *stream)
{
    (void)dt;
    (void)stream;
    fk_rank *r = comm;
    fk_op *op = fk_new(FK_GATHER, d, s, count, -1);
    op->gen = r->collectives++;
    fk_enqueue(r, op);
    return SUMO_NCCL_SUCCESS;
}

static int fk_all_reduce(const void *s, void *d, size_t count, int dt, int rop, void *comm, void *stream)
{
    (void)s;
    (void)d;
    (void)count;
    (void)dt;
    (void)rop;
    (void)stream;
    fk_rank *r = comm;
    fk_op *op = fk_new(FK_REDUCE1, NULL, NULL, 0, -1);
    op->gen = r->collectives++;
    fk_enqueue(r, op);
    return SUMO_NCCL_SUCCESS;
}

static int fk_copy_async(void *dst, const void *src, size_t bytes, void *stream)
{
    fk_rank *r = stream;
    atomic_fetch_add(&r->net->staged_copies, 1);
    fk_enqueue(r, fk_new(FK_COPY, dst, src, bytes, -1));
    return SUMO_CUDA_SUCCESS;
}

static int fk_count(void *comm, int *n)
{
    fk_rank *r = comm;
    *n = r->net->P;
    return r->net->bad_count ? SUMO_NCCL_INTERNAL_ERROR : SUMO_NCCL_SUCCESS;
}
static int fk_user_rank(void *comm, int *rank)
{
    *rank = ((fk_rank *)comm)->rank;
    return SUMO_NCCL_SUCCESS;
}
static int fk_cu_device(void *comm, int *d)
{
    (void)comm;
    *d = 0;
    return SUMO_NCCL_SUCCESS;
}
static int fk_async_error(void *comm, int *e)
{
    fk_rank *r = comm;
    *e = r->rank == r->net->error_rank ? SUMO_NCCL_REMOTE_ERROR : SUMO_NCCL_SUCCESS;
    return SUMO_NCCL_SUCCESS;
}
static int fk_abort(void *comm)
{
    fk_rank *r = comm;
    atomic_fetch_add(&r->net->aborts[r->rank], 1);
    return SUMO_NCCL_SUCCESS;
}
static int fk_destroy(void *comm)
{
    fk_rank *r = comm;
    atomic_fetch_add(&r->net->destroys[r->rank], 1);
    return SUMO_NCCL_SUCCESS;
}
static const char *fk_error_string(int r)
{
    (void)r;
    return "fake NCCL error";
}
static const char *fk_last_error(void *comm)
{
    (void)comm;
    return "fake: the remote peer went away";
}
static int fk_version(int *v)
{
    *v = 22800;
    return SUMO_NCCL_SUCCESS;
}
static int fk_alloc(void **p, size_t bytes)
{
    *p = malloc(bytes);
    return *p ? SUMO_CUDA_SUCCESS : 2;
}
static int fk_free(void *p)
{
    free(p);
    return SUMO_CUDA_SUCCESS;
}
static int fk_stream_create(void **s)
{
    (void)s;
    return 1;
}
static int fk_stream_destroy(void *s)
{
    (void)s;
    return SUMO_CUDA_SUCCESS;
}
static bool fk_is_device(const void *p) { return emu_claims(&g_emu, p, 1); }
static int fk_get_device(int *d)
{
    *d = 0;
    return SUMO_CUDA_SUCCESS;
}
static int fk_set_device(int d)
{
    (void)d;
    return SUMO_CUDA_SUCCESS;
}
static const char *fk_cuda_error(int e)
{
    (void)e;
    return "fake CUDA error";
}

static const sumo_cuda__nccl_api FAKE = {
    .get_version = fk_version, .get_error_string = fk_error_string, .get_last_error = fk_last_error,
    .comm_count = fk_count, .comm_user_rank = fk_user_rank, .comm_cu_device = fk_cu_device,
    .comm_get_async_error = fk_async_error, .comm_abort = fk_abort, .comm_destroy = fk_destroy,
    .group_start = fk_group_start, .group_end = fk_group_end, .send = fk_send, .recv = fk_recv,
    .all_gather = fk_all_gather, .all_reduce = fk_all_reduce, .stream_query = fk_stream_query,
    .stream_create = fk_stream_create, .stream_destroy = fk_stream_destroy,
    .device_alloc = fk_alloc, .device_free = fk_free, .host_alloc = fk_alloc, .host_free = fk_free,
    .copy_async = fk_copy_async, .is_device = fk_is_device, .get_device = fk_get_device,
    .set_device = fk_set_device, .cuda_error_string = fk_cuda_error};

static void fk_net_init(fk_net *n, int P)
{
    memset(n, 0, sizeof *n);
    n->P = P;
    n->hang_rank = n->error_rank = -1;
    pthread_mutex_init(&n->lock, NULL);
    for (int r = 0; r < P; r++) n->ranks[r] = (fk_rank){.net = n, .rank = r};
}

static void fk_net_free(fk_net *n)
{
    for (int s = 0; s < MAXP; s++)
        for (int d = 0; d < MAXP; d++)
            while (n->mhead[s][d]) {
                fk_msg *m = n->mhead[s][d];
                n->mhead[s][d] = m->next;
                free(m);
            }
    for (int r = 0; r < n->P; r++)
        while (n->ranks[r].head) {
            fk_op *op = n->ranks[r].head;
            n->ranks[r].head = op->next;
            free(op);
        }
    pthread_mutex_destroy(&n->lock);
}

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

/* ---- sumo_hier.h: CUDA IPC inside a node, NCCL between nodes -------------------------------- */

#define HL 2
#define HN (XN + 3)

/* What carries the nodes' traffic: threads communicators, the fake NCCL, or the real NCCL at
 * one rank per communicator (one node: NCCL refuses two ranks of one communicator on one
 * device). */
enum { ACROSS_THREADS, ACROSS_FAKE, ACROSS_NCCL };

/* H nodes of HL ranks, each node's ranks on a threads communicator (their kernels read each
 * other's buffers, as over CUDA IPC), on "device" buffers of kind mem: sum, average and
 * Adasum per tensor of the inputs harness_uniform_at(11 + op, rank, i). */
typedef struct hjob {
    int H, mem, across_kind;
    sumo_comm *node[MAXP][HL]; /* [node][local rank] */
    sumo_comm *across[HL][MAXP];
    fk_net nets[HL];
    float out[MAXP][3][HN];
    sumo_result res[MAXP];
    char msg[MAXP][320];
} hjob;

typedef struct hier_arg {
    hjob *x;
    int h, l;
} hier_arg;

static sumo_result hier_kernels(const hjob *x, sumo_comm *comm)
{
    return x->mem == M_DEV ? sumo_comm_add_cuda(comm, g_dev_kernels)
                           : sumo_comm_add_kernels(comm, g_emu_table);
}

static void *hier_rank(void *p)
{
    hier_arg *a = p;
    hjob *x = a->x;
    int rank = a->h * HL + a->l;
    sumo_comm *node = x->node[a->h][a->l], *across = x->across[a->l][a->h];
    sumo_result r = hier_kernels(x, node);
    if (x->across_kind == ACROSS_FAKE) {
        fk_rank *me = &x->nets[a->l].ranks[a->h];
        if (r == SUMO_SUCCESS) r = sumo_cuda__nccl_comm_create(&FAKE, me, me, &across);
    }
    if (r == SUMO_SUCCESS) r = hier_kernels(x, across);
    sumo_hier *hier = NULL;
    if (r == SUMO_SUCCESS) r = sumo_hier_create(node, across, &hier);
    size_t bytes = HN * sizeof(float);
    float *h = malloc(bytes), *buf = m_alloc(x->mem, bytes);
    static const size_t layout[] = {300, 1, 599, 0, 303};
    const sumo_op ops[3] = {SUMO_OP_SUM, SUMO_OP_AVERAGE, SUMO_OP_ADASUM};
    for (int k = 0; k < 3 && r == SUMO_SUCCESS; k++) {
        for (int i = 0; i < HN; i++) h[i] = (float)harness_uniform_at(11 + (uint64_t)k, (uint64_t)rank, (size_t)i);
        m_put(x->mem, buf, h, bytes);
        r = sumo_hier_allreduce(buf, buf, HN, SUMO_FLOAT32, ops[k], k == 2 ? layout : NULL,
                                k == 2 ? 5 : 0, NULL, hier);
        m_get(x->mem, x->out[rank][k], buf, bytes);
    }
    const char *m = "";
    if (hier) sumo_hier_error_message(hier, &m);
    snprintf(x->msg[rank], sizeof x->msg[rank], "%s", m);
    x->res[rank] = r;
    sumo_hier_destroy(hier);
    if (x->across_kind == ACROSS_FAKE && across) sumo_comm_destroy(across);
    m_free(x->mem, buf);
    free(h);
    return NULL;
}

static void hier_run(hjob *x)
{
    for (int h = 0; h < x->H; h++) CHECK_OK(sumo_comm_create_threads(HL, x->node[h]));
    for (int l = 0; l < HL; l++) {
        if (x->across_kind == ACROSS_FAKE) {
            fk_net_init(&x->nets[l], x->H);
        } else if (x->across_kind == ACROSS_THREADS) {
            CHECK_OK(sumo_comm_create_threads(x->H, x->across[l]));
        } else {
            unsigned char uid[128];
            CHECK_OK(sumo_nccl_unique_id(uid, sizeof uid));
            CHECK_OK(sumo_comm_create_nccl_rank(1, uid, sizeof uid, 0, 0, NULL, &x->across[l][0]));
        }
    }
    pthread_t ids[MAXP * HL];
    hier_arg args[MAXP * HL];
    for (int h = 0; h < x->H; h++)
        for (int l = 0; l < HL; l++) {
            args[h * HL + l] = (hier_arg){.x = x, .h = h, .l = l};
            pthread_create(&ids[h * HL + l], NULL, hier_rank, &args[h * HL + l]);
        }
    for (int i = 0; i < x->H * HL; i++) pthread_join(ids[i], NULL);
    for (int h = 0; h < x->H; h++)
        for (int l = 0; l < HL; l++) {
            sumo_comm_destroy(x->node[h][l]);
            if (x->across_kind != ACROSS_FAKE) sumo_comm_destroy(x->across[l][h]);
        }
    for (int l = 0; l < HL && x->across_kind == ACROSS_FAKE; l++) fk_net_free(&x->nets[l]);
}

/* On the host, over emulated device memory: the fake NCCL between the nodes against threads
 * communicators between them (which move device memory only by their shared-memory
 * algorithms): sum and average bit for bit, Adasum per tensor within rounding (its
 * point-to-point and shared-memory forms may round apart); every rank the same bits; the sum
 * against two levels of in-order sums. */
void t_nccl_fake_hier(void)
{
    for (int H = 1; H <= 3; H++) {
        hjob *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
        a->H = b->H = H;
        a->mem = b->mem = M_EMU;
        a->across_kind = ACROSS_THREADS;
        b->across_kind = ACROSS_FAKE;
        hier_run(a);
        hier_run(b);
        for (int r = 0; r < H * HL; r++) {
            CHECK(a->res[r] == SUMO_SUCCESS && b->res[r] == SUMO_SUCCESS,
                  "H %d rank %d: threads %s (%s), nccl %s (%s)", H, r, sumo_result_name(a->res[r]),
                  a->msg[r], sumo_result_name(b->res[r]), b->msg[r]);
            for (int k = 0; k < 3; k++) {
                CHECK(k == 2 || memcmp(a->out[r][k], b->out[r][k], sizeof a->out[r][k]) == 0,
                      "H %d rank %d op %d: NCCL between the nodes differs from threads", H, r, k);
                CHECK(memcmp(b->out[r][k], b->out[0][k], sizeof b->out[r][k]) == 0,
                      "H %d rank %d op %d: differs from rank 0", H, r, k);
            }
            for (int i = 0; i < HN; i++) {
                float g = b->out[r][2][i], w = a->out[r][2][i];
                if (!(fabsf(g - w) <= 1e-5f * (1 + fabsf(w)))) {
                    CHECK(false, "H %d rank %d Adasum element %d: %g vs %g", H, r, i, g, w);
                    break;
                }
            }
        }
        /* The sum is two levels of in-order sums (fp32 accumulates in fp32). */
        for (int i = 0; i < HN; i++) {
            float want = 0;
            for (int h = 0; h < H; h++) {
                float node = 0;
                for (int l = 0; l < HL; l++)
                    node += (float)harness_uniform_at(11, (uint64_t)(h * HL + l), (size_t)i);
                want += node;
            }
            if (b->out[0][0][i] != want) {
                CHECK(false, "H %d sum element %d: %.9g, want %.9g", H, i, b->out[0][0][i], want);
                break;
            }
        }
        free(a);
        free(b);
    }
}

/* On a device: one node of HL ranks and, per local rank, a real NCCL communicator of one rank
 * between the "nodes": sum and average against the closed form of two inputs, Adasum over one
 * node's average = that average, every rank the same bits. */
void d_hier_one_node(void)
{
    unsigned char uid[128];
    if (sumo_nccl_unique_id(uid, sizeof uid) != SUMO_SUCCESS) {
        printf("    (NCCL not loaded; set SUMO_NCCL_LIBRARY)\n");
        CHECK(getenv("SUMO_CUDA_TEST_REQUIRE_NCCL") == NULL, "NCCL required");
        return;
    }
    hjob *x = calloc(1, sizeof *x);
    x->H = 1, x->mem = M_DEV, x->across_kind = ACROSS_NCCL;
    hier_run(x);
    for (int l = 0; l < HL; l++) {
        CHECK(x->res[l] == SUMO_SUCCESS, "rank %d: %s (%s)", l, sumo_result_name(x->res[l]), x->msg[l]);
        CHECK(memcmp(x->out[l], x->out[0], sizeof x->out[l]) == 0, "rank %d differs from rank 0", l);
    }
    int bad = 0;
    for (int i = 0; i < HN && bad < 3; i++) {
        float want[3];
        for (int k = 0; k < 3; k++) {
            float u = (float)harness_uniform_at(11 + (uint64_t)k, 0, (size_t)i);
            float v = (float)harness_uniform_at(11 + (uint64_t)k, 1, (size_t)i);
            want[k] = k == 0 ? u + v : (u + v) / 2;
        }
        if (x->out[0][0][i] != want[0] || x->out[0][1][i] != want[1] || x->out[0][2][i] != want[2]) {
            CHECK(false, "element %d: sum %.9g average %.9g Adasum %.9g, want %.9g, %.9g, %.9g", i,
                  x->out[0][0][i], x->out[0][1][i], x->out[0][2][i], want[0], want[1], want[2]);
            bad++;
        }
    }
    free(x);
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
