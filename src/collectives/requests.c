/*
 * Asynchronous requests: a queue per communicator that a progress thread runs in order, and
 * the end of a communicator's life (which must drain that queue first).
 *
 * A request points at the queue, never at the handle: the queue lives on while requests not
 * yet waited on point at it (its refs), so a wait on one thread and sumo_comm_destroy on
 * another never race on freed memory.
 */
#include "collectives/requests.h"

#include <stdatomic.h>
#include <stdlib.h>

struct sumo_request {
    sumo__spare link; /* first: the queue's list of spares threads through it */
    sumo__queue *q;
    sumo_request *next; /* in the queue */
    sumo__call call;
    _Atomic int done;
    sumo_result result;
};

static void stop_progress(sumo__queue *q)
{
    pthread_mutex_lock(&q->lock);
    bool started = q->progress_started;
    q->stopping = true;
    pthread_cond_broadcast(&q->work);
    pthread_mutex_unlock(&q->lock);
    if (started) pthread_join(q->progress, NULL);
}

sumo_result sumo_comm_destroy(sumo_comm *comm)
{
    if (comm == NULL) return SUMO_SUCCESS;
    /* Requests still queued run to completion (or fail on their peers) before we leave; those
     * not yet waited on stay waitable (complete, with their result). */
    stop_progress(comm->queue);
    sumo__levels *lv = comm->levels;
    sumo_result r = sumo__comm_free(comm);
    /* A two-level communicator's levels, after the composed transport that borrowed them. */
    if (lv) {
        sumo_result rc = sumo_comm_destroy(lv->node);
        for (int i = 0; i < lv->nacross; i++) {
            sumo_result ra = sumo_comm_destroy(lv->across[i]);
            if (rc == SUMO_SUCCESS) rc = ra;
        }
        if (lv->any) {
            sumo_result ra = sumo_comm_destroy(lv->any);
            if (rc == SUMO_SUCCESS) rc = ra;
        }
        if (r == SUMO_SUCCESS) r = rc;
        free(lv);
    }
    return r;
}

/* Runs queued requests in order. The queue lock is held only to take a request and to settle
 * it, never while it runs, so a start returns at once whatever is in flight. */
static void *progress_main(void *arg)
{
    sumo_comm *c = arg;
    sumo__queue *q = c->queue;
    pthread_mutex_lock(&q->lock);
    for (;;) {
        while (q->head == NULL && !q->stopping) pthread_cond_wait(&q->work, &q->lock);
        sumo_request *req = q->head;
        if (req == NULL) break;
        q->head = req->next;
        if (q->head == NULL) q->tail = NULL;
        pthread_mutex_lock(&c->exec);
        pthread_mutex_unlock(&q->lock);
        sumo_result result = sumo__execute(c, &req->call);
        pthread_mutex_unlock(&c->exec);
        pthread_mutex_lock(&q->lock);
        req->result = result;
        atomic_store_explicit(&req->done, 1, memory_order_release);
        q->pending--;
        pthread_cond_broadcast(&q->idle);
    }
    pthread_mutex_unlock(&q->lock);
    return NULL;
}

static sumo_result queue_request(sumo_comm *comm, const sumo__call *call, sumo_request **request)
{
    sumo__queue *q = comm->queue;
    pthread_mutex_lock(&q->lock);
    if (q->stopping) {
        pthread_mutex_unlock(&q->lock);
        return SUMO_ERR_INVALID_USAGE;
    }
    sumo_request *req = (sumo_request *)(void *)q->spare;
    if (req != NULL) q->spare = req->link.next;
    else if ((req = malloc(sizeof *req)) == NULL) {
        pthread_mutex_unlock(&q->lock);
        return SUMO_ERR_SYSTEM;
    }
    *req = (sumo_request){.q = q, .call = *call};
    if (comm->tp->caller_thread_only) {
        /* Run here, now: the request is complete when it is returned (sumo__transport). The
         * queue is empty (every earlier request ran the same way), so the order holds. */
        q->refs++;
        pthread_mutex_unlock(&q->lock);
        sumo__comm_enter(comm);
        req->result = sumo__execute(comm, &req->call);
        sumo__comm_leave(comm);
        atomic_store_explicit(&req->done, 1, memory_order_release);
        *request = req;
        return SUMO_SUCCESS;
    }
    if (!q->progress_started) {
        if (pthread_create(&q->progress, NULL, progress_main, comm) != 0) {
            req->link.next = q->spare;
            q->spare = &req->link;
            pthread_mutex_unlock(&q->lock);
            return SUMO_ERR_SYSTEM;
        }
        q->progress_started = true;
    }
    if (q->tail) q->tail->next = req;
    else q->head = req;
    q->tail = req;
    q->pending++;
    q->refs++;
    pthread_cond_signal(&q->work);
    pthread_mutex_unlock(&q->lock);
    *request = req;
    return SUMO_SUCCESS;
}

sumo_result sumo__submit(sumo_comm *c, const sumo__call *call, sumo_request **request)
{
    if (c == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    if (request) return queue_request(c, call, request);
    sumo__comm_enter(c);
    sumo_result r = sumo__execute(c, call);
    sumo__comm_leave(c);
    return r;
}

sumo_result sumo__comm_leave_process(sumo_comm *comm)
{
    if (comm == NULL) return SUMO_SUCCESS;
    comm->tp->leaving_process = true;
    return sumo_comm_destroy(comm);
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
    sumo__queue *q = request->q;
    pthread_mutex_lock(&q->lock);
    while (!atomic_load_explicit(&request->done, memory_order_acquire))
        pthread_cond_wait(&q->idle, &q->lock);
    sumo_result r = request->result;
    /* Kept for reuse while the handle lives; its own once the handle is gone. */
    bool keep = q->comm != NULL;
    if (keep) {
        request->link.next = q->spare;
        q->spare = &request->link;
    }
    bool last = --q->refs == 0;
    pthread_mutex_unlock(&q->lock);
    if (!keep) free(request);
    if (last) sumo__queue_free(q);
    return r;
}
