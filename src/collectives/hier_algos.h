/*
 * The two-level communicator's algorithms (sumo_comm_create_hier), over its levels. Each runs
 * the parent's agreement first (the composed announce), then collectives on the levels
 * (comm_hier.h's sumo__level_run) or messages between the nodes' leaders.
 *   chain       sum and average of host memory: every node's inputs gathered on its local
 *               rank 0, the partial sum passed from node to node in the accumulation type in
 *               chunks, rounded once on the last node, broadcast back: the bits of a flat
 *               communicator's SUMO_ALGORITHM_RANKED;
 *   two_level   reduce-scatter inside the node, allreduce of one L-th across, allgather inside
 *               (each level rounds);
 *   broadcast   the root's node, then every local rank's across communicator;
 *   allgather   inside the node into the node's block, then the nodes' blocks across;
 *   reduce-scatter  the allreduce (chain or two_level) of the whole input, then this rank's
 *               block.
 */
#ifndef SUMO_HIER_ALGOS_H
#define SUMO_HIER_ALGOS_H

#include "collectives/agree.h"

sumo_result sumo__hier_allreduce(sumo_comm *c, sumo__call_desc *d, const void *sendbuf,
                                 void *recvbuf);
sumo_result sumo__hier_broadcast(sumo_comm *c, sumo__call_desc *d, const void *sendbuf,
                                 void *recvbuf);
sumo_result sumo__hier_allgather(sumo_comm *c, sumo__call_desc *d, const void *sendbuf,
                                 void *recvbuf);
sumo_result sumo__hier_reduce_scatter(sumo_comm *c, sumo__call_desc *d, const void *sendbuf,
                                      void *recvbuf);

#endif
