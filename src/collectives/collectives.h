/*
 * The public collectives' bodies, without the handle's locking and queueing (for the
 * asynchronous requests, which hold the handle themselves).
 */
#ifndef SUMO_COLLECTIVES_H
#define SUMO_COLLECTIVES_H

#include "collectives/comm.h"

sumo_result sumo__allreduce_locked(sumo_comm *comm, const void *sendbuf, void *recvbuf,
                                   size_t count, sumo_dtype dtype, sumo_op op);

#endif
