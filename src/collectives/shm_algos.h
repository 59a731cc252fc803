/*
 * The shared-memory algorithms: for transports whose ranks reach each other's memory
 * (SUMO__REACH_DIRECT: peers' buffers; SUMO__REACH_STAGED: staging areas every rank maps).
 * Each runs the agreement itself, so that a staged first copy can ride ahead of it.
 * Each output element is computed by exactly one rank, summing in rank order: every rank ends
 * bit-identical.
 */
#ifndef SUMO_SHM_ALGOS_H
#define SUMO_SHM_ALGOS_H

#include "collectives/agree.h"

sumo_result sumo__shm_allreduce(sumo_comm *c, sumo__call_desc *d, const void *sendbuf,
                                void *recvbuf);
sumo_result sumo__shm_broadcast(sumo_comm *c, sumo__call_desc *d, const void *sendbuf,
                                void *recvbuf);
sumo_result sumo__shm_allgather(sumo_comm *c, sumo__call_desc *d, const void *sendbuf,
                                void *recvbuf);

#endif
