/* The distributed optimizer object and the SlowMo mode's hooks (optimizers/slowmo.c). */
#ifndef SUMO_DISTRIBUTED_INTERNAL_H
#define SUMO_DISTRIBUTED_INTERNAL_H

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

/* SlowMo: validate options, allocate state (collective when memory_efficient needs it). */
sumo_result sumo__slowmo_init(sumo_distributed *dist);
void sumo__slowmo_free(sumo_distributed *dist);
sumo_result sumo__slowmo_step(sumo_distributed *dist, float *params, float *grads, double lr,
                              int *communicated);
size_t sumo__slowmo_state_size(const sumo_distributed *dist);
sumo_result sumo__slowmo_state_save(const sumo_distributed *dist, void *buffer);
sumo_result sumo__slowmo_state_load(sumo_distributed *dist, const void *buffer);
size_t sumo__slowmo_extra_memory(const sumo_distributed *dist);

/* Counts one collective of count elements of dtype in dist->stats. */
void sumo__distributed_count(sumo_distributed *dist, size_t count, sumo_dtype dtype);

#endif
