/* The SlowMo mode of the distributed optimizer (optimizers/slowmo.c; docs/design/slowmo.md). */
#ifndef SUMO_SLOWMO_H
#define SUMO_SLOWMO_H

#include "optimizers/distributed_impl.h"

/* SlowMo: validate options, allocate state (collective when memory_efficient needs it). */
sumo_result sumo__slowmo_init(sumo_distributed *dist);
void sumo__slowmo_free(sumo_distributed *dist);
sumo_result sumo__slowmo_step(sumo_distributed *dist, float *params, float *grads, double lr,
                              int *communicated);
size_t sumo__slowmo_state_size(const sumo_distributed *dist);
sumo_result sumo__slowmo_state_save(const sumo_distributed *dist, void *buffer);
sumo_result sumo__slowmo_state_load(sumo_distributed *dist, const void *buffer);
size_t sumo__slowmo_extra_memory(const sumo_distributed *dist);

#endif
