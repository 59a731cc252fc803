/* The aggregator object and the table each method fills in: shared by the public entry
 * points (aggregator.c) and the methods (acga.c), which do not depend on each other. */
#ifndef SUMO_AGGREGATOR_IMPL_H
#define SUMO_AGGREGATOR_IMPL_H

#include "sumo_aggregation.h"
#include "common/common.h"

typedef struct sumo__aggregator_vtbl {
    /* sendbuf == recvbuf: in place; else they do not overlap (checked by the caller). */
    sumo_result (*apply)(sumo_aggregator *agg, const void *sendbuf, void *recvbuf, size_t count,
                         sumo_dtype dtype);
    size_t (*state_size)(const sumo_aggregator *agg);
    sumo_result (*state_save)(const sumo_aggregator *agg, void *buffer);
    sumo_result (*state_load)(sumo_aggregator *agg, const void *buffer);
    void (*destroy)(sumo_aggregator *agg);
} sumo__aggregator_vtbl;

struct sumo_aggregator {
    const sumo__aggregator_vtbl *vtbl;
    sumo_comm *comm;
    sumo_aggregator_options options; /* tensor_counts points at the copy below */
    size_t *tensor_counts;
    size_t ntensors;
    size_t total;                    /* sum of tensor_counts */
    sumo_comm_stats stats;
    sumo_op op;                      /* the collective op for the stateless methods */
    void *impl;                      /* method's own state */
};

/* Counts one collective of count elements of dtype in agg->stats. */
static inline void sumo__aggregator_count(sumo_aggregator *agg, size_t count, sumo_dtype dtype)
{
    agg->stats.rounds++;
    agg->stats.bytes += (uint64_t)count * sumo__dtype_bytes(dtype);
}

#endif
