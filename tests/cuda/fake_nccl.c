/*
 * test_cuda: the fake NCCL (fake_nccl.h). Each rank's "stream" runs its queue whenever it is
 * queried; "device" memory is the emulated arena.
 */
#include "fake_nccl.h"

#include <stdlib.h>
#include <string.h>

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

const sumo_cuda__nccl_api FAKE = {
    .get_version = fk_version, .get_error_string = fk_error_string, .get_last_error = fk_last_error,
    .comm_count = fk_count, .comm_user_rank = fk_user_rank, .comm_cu_device = fk_cu_device,
    .comm_get_async_error = fk_async_error, .comm_abort = fk_abort, .comm_destroy = fk_destroy,
    .group_start = fk_group_start, .group_end = fk_group_end, .send = fk_send, .recv = fk_recv,
    .all_gather = fk_all_gather, .all_reduce = fk_all_reduce, .stream_query = fk_stream_query,
    .stream_create = fk_stream_create, .stream_destroy = fk_stream_destroy,
    .device_alloc = fk_alloc, .device_free = fk_free, .host_alloc = fk_alloc, .host_free = fk_free,
    .copy_async = fk_copy_async, .is_device = fk_is_device, .get_device = fk_get_device,
    .set_device = fk_set_device, .cuda_error_string = fk_cuda_error};

void fk_net_init(fk_net *n, int P)
{
    memset(n, 0, sizeof *n);
    n->P = P;
    n->hang_rank = n->error_rank = -1;
    pthread_mutex_init(&n->lock, NULL);
    for (int r = 0; r < P; r++) n->ranks[r] = (fk_rank){.net = n, .rank = r};
}

void fk_net_free(fk_net *n)
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
