/*
 * Adasum as a reduce-scatter (collectives/adasum_rs.c): sumo_reduce_scatter with an Adasum op,
 * in FSDP2's layout. The header comment of the .c file has the algorithm and its limits.
 */
#ifndef SUMO_ADASUM_RS_H
#define SUMO_ADASUM_RS_H

#include "collectives/agree.h"

/* The largest communicator the reduce-scatter form serves (see adasum_rs.c: the Gram entries'
 * sum grows as P^2 per tensor, and the partials kernel takes at most this many inputs). */
#define SUMO__ADASUM_RS_MAX_RANKS 16

/* After sumo__execute's validation: the layout's checks, scratch, the agreement, the
 * exchange, the Gram entries' sum, the weights and this rank's shard. d->count is recvcount. */
sumo_result sumo__reduce_scatter_adasum(sumo_comm *c, sumo__call_desc *d, const sumo__op_entry *op,
                                        const void *sendbuf, void *recvbuf);

#endif
