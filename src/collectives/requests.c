/*
 * Asynchronous requests: a queue per communicator that a progress thread runs in order, and
 * the end of a communicator's life (which must drain that queue first).
 */
#include "collectives/collectives.h"
#include "collectives/memory.h"

#include <stdatomic.h>
#include <stdlib.h>

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
    sumo__mem_forget(comm);
    return sumo__comm_free(comm);
}

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
