/* Adasum as an allreduce op (collectives/adasum.c): SUMO_OP_ADASUM, or an op made by
 * sumo_op_create_adasum with a tensor layout (registered as an op of kind SUMO__OP_ADASUM). */
#ifndef SUMO_ADASUM_H
#define SUMO_ADASUM_H

#include "collectives/agree.h"

/* After sumo__execute's validation (d->local_error 0): the op's layout check, scratch, the
 * agreement and the combine. */
sumo_result sumo__allreduce_adasum(sumo_comm *comm, sumo__call_desc *d, const sumo__op_entry *op,
                                   const void *sendbuf, void *recvbuf);

/* The op's layout (offsets NULL and ntensors 0: one tensor), its group size (1: flat) and the
 * hash the agreement compares; for SUMO_OP_ADASUM (impl NULL) too. */
void sumo__adasum_op_layout(const sumo__op_entry *op, const size_t **offsets, size_t *ntensors,
                            int *group_size, uint64_t *hash);

#endif
