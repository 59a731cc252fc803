/* The shm transport (transport/transport_shm.c): the processes of one machine, met through a
 * caller's key-value store, over shared memory of their own. */
#ifndef SUMO_TRANSPORT_SHM_H
#define SUMO_TRANSPORT_SHM_H

#include "transport/transport.h"

#include "sumo_shm.h"

/* Collective over the options' ranks (validated by the caller). On failure nothing is left
 * mapped or named, and err says why. */
sumo_result sumo__shm_transport_create(const sumo_shm_options *options, const sumo__env *env,
                                       sumo__transport **out,
                                       char *err, size_t errlen);

#endif
