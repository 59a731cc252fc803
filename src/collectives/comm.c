#include "collectives/comm.h"

#include <stdlib.h>
#include <string.h>

struct sumo_request {
    sumo_comm *comm;      /* NULL once the handle was destroyed (the request had completed) */
    sumo_request *next;   /* in the queue */
    sumo_request *prev_unwaited, *next_unwaited;
    const void *sendbuf;
    void *recvbuf;
    size_t count;
    sumo_dtype dtype;
    sumo_op op;
    _Atomic int done;
    sumo_result result;
};

sumo_result sumo__comm_wrap(sumo__transport *tp, sumo_comm **out)
{
    sumo_comm *c = calloc(1, sizeof *c);
    if (c == NULL) return SUMO_ERR_SYSTEM;
    c->tp = tp;
    if (pthread_mutex_init(&c->lock, NULL) != 0) goto fail_lock;
    if (pthread_mutex_init(&c->exec, NULL) != 0) goto fail_exec;
    if (pthread_cond_init(&c->idle, NULL) != 0) goto fail_idle;
    if (pthread_cond_init(&c->work, NULL) != 0) goto fail_work;
    *out = c;
    return SUMO_SUCCESS;
fail_work:
    pthread_cond_destroy(&c->idle);
fail_idle:
    pthread_mutex_destroy(&c->exec);
fail_exec:
    pthread_mutex_destroy(&c->lock);
fail_lock:
    free(c);
    return SUMO_ERR_SYSTEM;
}

sumo_result sumo_comm_create_threads(int nranks, sumo_comm **comms)
{
    /* The mailboxes are nranks^2 cache lines: 1024 ranks is 128 MiB, a sane ceiling. */
    if (comms == NULL || nranks < 1 || nranks > SUMO_THREADS_MAX_RANKS) return SUMO_ERR_INVALID_ARGUMENT;
    sumo__transport **tps = calloc((size_t)nranks, sizeof *tps);
    if (tps == NULL) return SUMO_ERR_SYSTEM;
    sumo_result r = sumo__threads_transport_create(nranks, tps);
    if (r != SUMO_SUCCESS) {
        free(tps);
        return r;
    }
    for (int i = 0; i < nranks; i++) {
        r = sumo__comm_wrap(tps[i], &comms[i]);
        if (r != SUMO_SUCCESS) {
            for (int k = 0; k < i; k++) sumo_comm_destroy(comms[k]);
            for (int k = i; k < nranks; k++) tps[k]->ops->destroy(tps[k]);
            free(tps);
            return r;
        }
    }
    free(tps);
    return SUMO_SUCCESS;
}

static void stop_progress(sumo_comm *c)
{
    pthread_mutex_lock(&c->lock);
    bool started = c->progress_started;
    c->stopping = true;
    pthread_cond_broadcast(&c->work);
    pthread_mutex_unlock(&c->lock);
    if (started) pthread_join(c->progress, NULL);
}

sumo_result sumo_comm_destroy(sumo_comm *comm)
{
    if (comm == NULL) return SUMO_SUCCESS;
    /* Requests still queued run to completion (or fail on their peers) before we leave. */
    stop_progress(comm);
    /* Requests not yet waited on stay waitable: they are complete and keep their result. */
    pthread_mutex_lock(&comm->lock);
    for (sumo_request *r = comm->queue.unwaited; r; r = r->next_unwaited) r->comm = NULL;
    while (comm->queue.spare) {
        sumo_request *r = comm->queue.spare;
        comm->queue.spare = r->next;
        free(r);
    }
    pthread_mutex_unlock(&comm->lock);
    comm->tp->ops->destroy(comm->tp);
    pthread_cond_destroy(&comm->work);
    pthread_cond_destroy(&comm->idle);
    pthread_mutex_destroy(&comm->exec);
    pthread_mutex_destroy(&comm->lock);
    sumo__op_table_free(comm);
    free(comm->scratch);
    free(comm);
    return SUMO_SUCCESS;
}

sumo_result sumo_comm_rank(const sumo_comm *comm, int *rank)
{
    if (comm == NULL || rank == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *rank = comm->tp->rank;
    return SUMO_SUCCESS;
}

sumo_result sumo_comm_size(const sumo_comm *comm, int *size)
{
    if (comm == NULL || size == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *size = comm->tp->size;
    return SUMO_SUCCESS;
}

sumo_result sumo_comm_transport(const sumo_comm *comm, const char **name)
{
    if (comm == NULL || name == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *name = comm->tp->ops->name;
    return SUMO_SUCCESS;
}

sumo_result sumo_comm_set_timeout(sumo_comm *comm, double seconds)
{
    /* Also rejects NaN. The upper bound keeps the deadline arithmetic in int64 nanoseconds. */
    if (comm == NULL || !(seconds > 0) || seconds > 1e8) return SUMO_ERR_INVALID_ARGUMENT;
    /* The deadline is read inside collectives: change it between them. */
    pthread_mutex_lock(&comm->exec);
    comm->tp->timeout_ns = (int64_t)(seconds * 1e9);
    if (comm->tp->timeout_ns < 1) comm->tp->timeout_ns = 1;
    pthread_mutex_unlock(&comm->exec);
    return SUMO_SUCCESS;
}

sumo_result sumo_comm_get_timeout(const sumo_comm *comm, double *seconds)
{
    if (comm == NULL || seconds == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *seconds = (double)comm->tp->timeout_ns / 1e9;
    return SUMO_SUCCESS;
}

sumo_result sumo_comm_error_message(const sumo_comm *comm, const char **message)
{
    if (comm == NULL || message == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *message = comm->tp->errmsg;
    return SUMO_SUCCESS;
}

sumo_result sumo_comm_set_param(sumo_comm *comm, sumo_comm_param param, int value)
{
    if (comm == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    if (param != SUMO_PARAM_ALGORITHM)
        return SUMO__FAIL(comm->tp, SUMO_ERR_INVALID_ARGUMENT, "sumo_comm_set_param: unknown parameter %d", (int)param);
    if (value < 0 || value >= SUMO_ALGORITHM_COUNT)
        return SUMO__FAIL(comm->tp, SUMO_ERR_INVALID_ARGUMENT, "sumo_comm_set_param: unknown algorithm %d", value);
    if (value == SUMO_ALGORITHM_SHARED_MEMORY && comm->tp->shm == NULL)
        return SUMO__FAIL(comm->tp, SUMO_ERR_INVALID_USAGE, "sumo_comm_set_param: the ranks of this communicator do not share memory");
    if (value == SUMO_ALGORITHM_PEER && comm->tp->ops->native_allreduce == NULL)
        return SUMO__FAIL(comm->tp, SUMO_ERR_INVALID_USAGE, "sumo_comm_set_param: transport %s has no allreduce of its own", comm->tp->ops->name);
    pthread_mutex_lock(&comm->exec);
    comm->algo = (sumo_algorithm)value;
    pthread_mutex_unlock(&comm->exec);
    return SUMO_SUCCESS;
}

sumo_result sumo_comm_get_param(const sumo_comm *comm, sumo_comm_param param, int *value)
{
    if (comm == NULL || value == NULL || param != SUMO_PARAM_ALGORITHM) return SUMO_ERR_INVALID_ARGUMENT;
    *value = (int)comm->algo;
    return SUMO_SUCCESS;
}

sumo_result sumo__comm_scratch(sumo_comm *comm, size_t bytes, void **out)
{
    if (bytes > comm->scratch_bytes) {
        if (bytes > SIZE_MAX - 4095)
            return SUMO__FAIL(comm->tp, SUMO_ERR_SYSTEM, "scratch of %zu bytes", bytes);
        size_t rounded = (bytes + 4095) / 4096 * 4096;
        void *p = aligned_alloc(4096, rounded);
        if (p == NULL)
            return SUMO__FAIL(comm->tp, SUMO_ERR_SYSTEM, "cannot allocate %zu bytes of scratch",
                              rounded);
        free(comm->scratch);
        comm->scratch = p;
        comm->scratch_bytes = rounded;
    }
    *out = comm->scratch;
    return SUMO_SUCCESS;
}

void sumo__comm_enter(sumo_comm *comm)
{
    pthread_mutex_lock(&comm->lock);
    /* Collectives on a handle run in the order they were issued. */
    while (comm->queue.pending > 0) pthread_cond_wait(&comm->idle, &comm->lock);
    /* Taken before the queue lock is dropped: a request started after this call was issued
     * runs after it. Nothing holds exec while waiting for lock, so this cannot deadlock. */
    pthread_mutex_lock(&comm->exec);
    pthread_mutex_unlock(&comm->lock);
}

void sumo__comm_leave(sumo_comm *comm) { pthread_mutex_unlock(&comm->exec); }

/* Runs queued requests in order. The queue lock is held only to take a request and to settle
 * it, never while it runs, so sumo_allreduce_start returns at once whatever is in flight. */
static void *progress_main(void *arg)
{
    sumo_comm *c = arg;
    pthread_mutex_lock(&c->lock);
    for (;;) {
        while (c->queue.head == NULL && !c->stopping) pthread_cond_wait(&c->work, &c->lock);
        sumo_request *req = c->queue.head;
        if (req == NULL) break;
        c->queue.head = req->next;
        if (c->queue.head == NULL) c->queue.tail = NULL;
        pthread_mutex_lock(&c->exec);
        pthread_mutex_unlock(&c->lock);
        sumo_result result = sumo__allreduce_locked(c, req->sendbuf, req->recvbuf, req->count,
                                                    req->dtype, req->op);
        pthread_mutex_unlock(&c->exec);
        pthread_mutex_lock(&c->lock);
        req->result = result;
        atomic_store_explicit(&req->done, 1, memory_order_release);
        c->queue.pending--;
        pthread_cond_broadcast(&c->idle);
    }
    pthread_mutex_unlock(&c->lock);
    return NULL;
}

sumo_result sumo_allreduce_start(const void *sendbuf, void *recvbuf, size_t count,
                                 sumo_dtype dtype, sumo_op op, sumo_comm *comm,
                                 sumo_request **request)
{
    if (comm == NULL || request == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    pthread_mutex_lock(&comm->lock);
    if (comm->stopping) {
        pthread_mutex_unlock(&comm->lock);
        return SUMO_ERR_INVALID_USAGE;
    }
    sumo_request *req = comm->queue.spare;
    if (req != NULL) comm->queue.spare = req->next;
    else if ((req = malloc(sizeof *req)) == NULL) {
        pthread_mutex_unlock(&comm->lock);
        return SUMO_ERR_SYSTEM;
    }
    *req = (sumo_request){.comm = comm, .sendbuf = sendbuf, .recvbuf = recvbuf, .count = count,
                          .dtype = dtype, .op = op};
    if (!comm->progress_started) {
        if (pthread_create(&comm->progress, NULL, progress_main, comm) != 0) {
            req->next = comm->queue.spare;
            comm->queue.spare = req;
            pthread_mutex_unlock(&comm->lock);
            return SUMO_ERR_SYSTEM;
        }
        comm->progress_started = true;
    }
    if (comm->queue.tail) comm->queue.tail->next = req;
    else comm->queue.head = req;
    comm->queue.tail = req;
    comm->queue.pending++;
    req->next_unwaited = comm->queue.unwaited;
    if (req->next_unwaited) req->next_unwaited->prev_unwaited = req;
    comm->queue.unwaited = req;
    pthread_cond_signal(&comm->work);
    pthread_mutex_unlock(&comm->lock);
    *request = req;
    return SUMO_SUCCESS;
}

sumo_result sumo_request_test(sumo_request *request, int *done)
{
    if (request == NULL || done == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *done = atomic_load_explicit(&request->done, memory_order_acquire);
    return SUMO_SUCCESS;
}

sumo_result sumo_request_wait(sumo_request *request)
{
    if (request == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    sumo_comm *c = request->comm;
    if (c == NULL) {
        /* Detached by sumo_comm_destroy: complete, and no longer the handle's to reuse. */
        sumo_result r = request->result;
        free(request);
        return r;
    }
    pthread_mutex_lock(&c->lock);
    while (!atomic_load_explicit(&request->done, memory_order_acquire))
        pthread_cond_wait(&c->idle, &c->lock);
    if (request->prev_unwaited) request->prev_unwaited->next_unwaited = request->next_unwaited;
    else c->queue.unwaited = request->next_unwaited;
    if (request->next_unwaited) request->next_unwaited->prev_unwaited = request->prev_unwaited;
    sumo_result r = request->result;
    request->next = c->queue.spare;
    c->queue.spare = request;
    pthread_mutex_unlock(&c->lock);
    return r;
}
