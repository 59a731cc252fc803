/* Adasum as an allreduce op (collectives/adasum.c): SUMO_OP_ADASUM, or an op made by
 * sumo_op_create_adasum with a tensor layout. */
#ifndef SUMO_ADASUM_H
#define SUMO_ADASUM_H

#include "collectives/comm.h"

/* Whether op is an Adasum op (predefined or created on some handle). */
static inline bool sumo__op_is_adasum(sumo_op op) { return op >= SUMO_OP_ADASUM; }

sumo_result sumo__allreduce_adasum(sumo_comm *comm, const void *sendbuf, void *recvbuf,
                                   size_t count, sumo_dtype dtype, sumo_op op);

#endif
