/*
 * The point-to-point algorithms, over sendrecv alone: any transport, the only choice across
 * machines. Each runs the agreement itself.
 *   ranked               an all-to-all of segments summed in rank order, then a ring
 *                        allgather: the ring's 2 N (P-1)/P bytes per rank, the bits of the
 *                        shared-memory algorithms;
 *   ring                 reduce-scatter then allgather: 2 N (P-1)/P bytes per rank;
 *   recursive doubling   for small messages: log2 P steps;
 *   binomial tree        broadcast.
 */
#ifndef SUMO_P2P_ALGOS_H
#define SUMO_P2P_ALGOS_H

#include "collectives/agree.h"

sumo_result sumo__ranked_allreduce(sumo_comm *c, sumo__call_desc *d, const void *sendbuf,
                                   void *recvbuf);
sumo_result sumo__ring_allreduce(sumo_comm *c, sumo__call_desc *d, const void *sendbuf,
                                 void *recvbuf);
sumo_result sumo__rd_allreduce(sumo_comm *c, sumo__call_desc *d, const void *sendbuf,
                               void *recvbuf);
sumo_result sumo__tree_broadcast(sumo_comm *c, sumo__call_desc *d, const void *sendbuf,
                                 void *recvbuf);
sumo_result sumo__ring_allgather(sumo_comm *c, sumo__call_desc *d, const void *sendbuf,
                                 void *recvbuf);
sumo_result sumo__ring_reduce_scatter(sumo_comm *c, sumo__call_desc *d, const void *sendbuf,
                                      void *recvbuf);

/* The ring's allgather: each rank starts with its finished segment `own` of buf (elements of
 * esz bytes; segment s is sumo__seg_off(n, P, s) ..) and passes segments on until every rank
 * holds all of them. */
sumo_result sumo__ring_pass_segments(sumo__transport *tp, unsigned char *buf, size_t esz,
                                     size_t n, int own);
/* The same from step first_step on (step 0 sends `own` to the next rank; a caller that made
 * that step itself continues from 1). */
sumo_result sumo__ring_pass_segments_from(sumo__transport *tp, unsigned char *buf, size_t esz,
                                          size_t n, int own, int first_step);

/*
 * A group of ranks that sums among itself: `members` ranks, this one being member `me`;
 * member m is rank rank_of(ctx, m). A NULL rank_of means member m is rank m.
 */
typedef struct sumo__rd_group {
    int members;
    int me;
    int (*rank_of)(const void *ctx, int member);
    const void *ctx;
} sumo__rd_group;

/*
 * Recursive doubling over the group: work (n elements of acc, a type that accumulates itself)
 * ends holding the sum over all members, with the same bits on every member; tmp holds n
 * elements. Members beyond the largest power of two first fold into a partner and get the
 * result back at the end; partners add the lower member's partial first. x: the kernels of
 * the memory work and tmp live in (the host's for the small sums of the Gram form and the
 * Adasum tree, the call's for a recursive-doubling allreduce).
 */
sumo_result sumo__rd_sum(sumo_comm *c, const sumo__rd_group *g, const sumo__exec *x,
                         sumo_dtype acc, void *work, void *tmp, size_t n);

#endif
