/*
 * The communicator: a transport plus what the collectives keep between calls (scratch
 * memory, the progress thread of asynchronous requests, the per-handle lock).
 */
#ifndef SUMO_COMM_H
#define SUMO_COMM_H

#include "transport/transport.h"

#include <pthread.h>

typedef struct sumo__request_queue {
    sumo_request *head, *tail;
    int pending;            /* queued or running */
    sumo_request *unwaited; /* every request not yet waited on, to detach at destroy */
    sumo_request *spare;    /* waited-on requests kept for reuse: start does not allocate */
} sumo__request_queue;

struct sumo_comm {
    sumo__transport *tp;
    /* Two locks, so that queueing never waits for a collective: `lock` guards the queue and
     * the settings and is only held for a few instructions; `exec` is held while a collective
     * runs. Order: lock, then exec (never the reverse). */
    pthread_mutex_t lock;
    pthread_mutex_t exec;
    pthread_cond_t idle;  /* signalled when an asynchronous request completes */
    sumo__request_queue queue;
    pthread_cond_t work;
    pthread_t progress;
    bool progress_started;
    bool stopping;
    sumo_algorithm algo;
    /* Scratch kept between calls so the hot path does not allocate. */
    void *scratch;
    size_t scratch_bytes;
    /* Ops created on this handle (Adasum with a layout); owned by collectives/adasum.c. */
    struct sumo__op_table *op_table;
};

/* Wraps a transport (taking ownership) into a communicator. */
sumo_result sumo__comm_wrap(sumo__transport *tp, sumo_comm **out);
/* Grows the handle's scratch to at least bytes. */
sumo_result sumo__comm_scratch(sumo_comm *comm, size_t bytes, void **out);

/* The collectives proper, without locking or queueing (the public functions add those). */
sumo_result sumo__allreduce_locked(sumo_comm *comm, const void *sendbuf, void *recvbuf,
                                   size_t count, sumo_dtype dtype, sumo_op op);

/* Adasum allreduce (collectives/adasum.c) for op == SUMO_OP_ADASUM or a created op. */
sumo_result sumo__allreduce_adasum(sumo_comm *comm, const void *sendbuf, void *recvbuf,
                                   size_t count, sumo_dtype dtype, sumo_op op);
/* Frees the op table (called by sumo_comm_destroy). */
void sumo__op_table_free(sumo_comm *comm);

/* Holds the handle for a blocking collective: waits for queued asynchronous requests. */
void sumo__comm_enter(sumo_comm *comm);
void sumo__comm_leave(sumo_comm *comm);

#endif
