/*
 * The communicator: a transport plus what the collectives keep between calls (its error
 * state, scratch memory, the kernels for its buffers' memory, the per-handle locks and the
 * queue of asynchronous requests, which collectives/requests.c runs).
 */
#ifndef SUMO_COMM_H
#define SUMO_COMM_H

#include "kernels/kernels.h"
#include "transport/transport.h"

#include <pthread.h>

typedef struct sumo__request_queue {
    sumo_request *head, *tail;
    int pending;            /* queued or running */
    sumo_request *unwaited; /* every request not yet waited on, to detach at destroy */
    sumo_request *spare;    /* waited-on requests kept for reuse: start does not allocate */
} sumo__request_queue;

/* The announcement every collective starts with (collectives/agree.h); declared here so the
 * communicator can keep the last agreed set. */
typedef struct sumo__call_desc sumo__call_desc;

struct sumo_comm {
    sumo__transport *tp;
    sumo__status status;
    const sumo__kernel_table *kernels; /* for the memory the buffers live in (host today) */
    /* Two locks, so that queueing never waits for a collective: `lock` guards the queue and
     * the settings and is only held for a few instructions; `exec` is held while a collective
     * runs. Order: lock, then exec (never the reverse). */
    pthread_mutex_t lock;
    pthread_mutex_t exec;
    pthread_cond_t idle; /* signalled when an asynchronous request completes */
    sumo__request_queue queue;
    pthread_cond_t work;
    pthread_t progress;
    bool progress_started;
    bool stopping;
    sumo_algorithm algo;
    /* Every rank's announcement of the collective in progress (size entries). */
    sumo__call_desc *agreed;
    /* Scratch kept between calls so the hot path does not allocate. */
    void *scratch;
    size_t scratch_bytes;
    /* What sumo_mem_alloc gave, newest first; serials count allocations alike on every rank. */
    struct sumo__mem_block *mem_blocks;
    uint64_t mem_serial;
    /* Ops created on this handle (Adasum with a layout), owned by the layer that made them. */
    void *op_table;
    void (*op_table_free)(void *op_table);
};

/* Wraps a transport (taking ownership, and taking it back on failure) into a communicator. */
sumo_result sumo__comm_wrap(sumo__transport *tp, sumo_comm **out);
/* Frees what sumo__comm_wrap made, destroying the transport (the caller has stopped the
 * progress thread); returns the transport's verdict on leaving its peers. */
sumo_result sumo__comm_free(sumo_comm *comm);
/* Grows the handle's scratch to at least bytes. */
sumo_result sumo__comm_scratch(sumo_comm *comm, size_t bytes, void **out);

/* Records a failure in the communicator's status (see sumo__transport_fail). */
#define SUMO__COMM_FAIL(comm, code, ...) SUMO__FAIL((comm)->tp, (code), __VA_ARGS__)

/* Holds the handle for a blocking collective: waits for queued asynchronous requests. */
void sumo__comm_enter(sumo_comm *comm);
void sumo__comm_leave(sumo_comm *comm);

#endif
