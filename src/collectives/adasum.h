/* Adasum as an allreduce op (collectives/adasum.c): SUMO_OP_ADASUM, or an op made by
 * sumo_op_create_adasum with a tensor layout (registered as an op of kind SUMO__OP_ADASUM). */
#ifndef SUMO_ADASUM_H
#define SUMO_ADASUM_H

#include "collectives/agree.h"

/* After sumo__execute's validation (d->local_error 0): the op's layout check, scratch, the
 * agreement and the combine. */
sumo_result sumo__allreduce_adasum(sumo_comm *comm, sumo__call_desc *d, const sumo__op_entry *op,
                                   const void *sendbuf, void *recvbuf);

#endif
