/*
 * Running a call now or later (collectives/requests.c): the handle's queue of asynchronous
 * requests, its progress thread, and the end of a handle's life, which drains the queue.
 */
#ifndef SUMO_REQUESTS_H
#define SUMO_REQUESTS_H

#include "collectives/execute.h"

/* Runs call now, blocking (request NULL; the handle is taken after the queued requests), or
 * queues it and returns a request that the progress thread completes. */
sumo_result sumo__submit(sumo_comm *comm, const sumo__call *call, sumo_request **request);

/* sumo_comm_destroy at the end of the process: leaves without meeting the peers (see
 * sumo__transport.leaving_process). NULL is fine. */
SUMO__PLUGIN_API sumo_result sumo__comm_leave_process(sumo_comm *comm);

#endif
