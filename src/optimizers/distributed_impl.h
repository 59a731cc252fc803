/* The distributed optimizer object: shared by the public entry points (distributed.c) and
 * the SlowMo mode (slowmo.c), which do not depend on each other. */
#ifndef SUMO_DISTRIBUTED_IMPL_H
#define SUMO_DISTRIBUTED_IMPL_H

#include "sumo_distributed.h"
#include "common/common.h"

struct sumo_distributed {
    sumo_comm *comm;
    sumo_optimizer *optimizer;
    sumo_aggregator *aggregator;
    size_t nparams;
    sumo_distributed_options options;
    sumo_comm_stats stats;   /* this layer's own collectives (the aggregator counts its own) */
    float *saved;            /* DELTA: parameters before the local step */
    bool synchronized;
    void *slowmo;            /* SLOWMO: the mode's state */
};

/* Counts one collective of count elements of dtype in dist->stats. */
static inline void sumo__distributed_count(sumo_distributed *dist, size_t count, sumo_dtype dtype)
{
    dist->stats.rounds++;
    dist->stats.bytes += (uint64_t)count * sumo__dtype_bytes(dtype);
}

#endif
