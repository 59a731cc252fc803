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

/*
 * The staging areas of a SUMO__REACH_STAGED transport, for algorithms that stream through
 * them: chunk k of a buffer lives in half (k + parity) % 2 of each rank's area, parity being
 * the transport's when the staging was made (sumo__transport.stage_parity); chunk is a
 * multiple of P cache lines, so every rank's cache slice of a chunk is whole lines. Or, when
 * every rank's output is shared (sumo_mem_alloc), those outputs: chunk k at its own place in
 * each.
 */
typedef struct sumo__staging {
    sumo__transport *tp;
    const sumo__exec *x; /* copies between the caller's buffers and the areas */
    size_t chunk; /* elements per chunk */
    size_t esz;
    unsigned char *const *outputs; /* NULL: the areas; else every rank's output, as reached */
    unsigned parity;
} sumo__staging;

sumo__staging sumo__staging_of(sumo__transport *tp, const sumo__exec *x, size_t esz);
/* The same chunks, staged into the outputs (outputs[rank] is this rank's own receive buffer,
 * the others as it reaches them); nothing is copied out of them. */
sumo__staging sumo__staging_into_outputs(sumo__transport *tp, const sumo__exec *x, size_t esz,
                                         unsigned char *const *outputs);
unsigned char *sumo__stage_half(const sumo__staging *s, int rank, size_t k);
size_t sumo__stage_chunk_len(const sumo__staging *s, size_t count, size_t k);
size_t sumo__stage_chunk_count(const sumo__staging *s, size_t count);
/* Copies chunk k of src (count elements) into rank's area (nothing when src is that output). */
sumo_result sumo__stage_in(const sumo__staging *s, int rank, size_t k, const void *src,
                           size_t count);

sumo_result sumo__shm_allreduce(sumo_comm *c, sumo__call_desc *d, const void *sendbuf,
                                void *recvbuf);
sumo_result sumo__shm_broadcast(sumo_comm *c, sumo__call_desc *d, const void *sendbuf,
                                void *recvbuf);
sumo_result sumo__shm_allgather(sumo_comm *c, sumo__call_desc *d, const void *sendbuf,
                                void *recvbuf);
sumo_result sumo__shm_reduce_scatter(sumo_comm *c, sumo__call_desc *d, const void *sendbuf,
                                     void *recvbuf);

#endif
