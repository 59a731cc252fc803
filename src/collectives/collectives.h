/*
 * What the public entry points (collectives.c) offer the layers above besides sumo.h: a
 * collective check that every rank set something up alike.
 */
#ifndef SUMO_COLLECTIVES_H
#define SUMO_COLLECTIVES_H

#include "collectives/comm.h"

/*
 * For the layers above, when they set something up collectively: every rank reports its
 * local outcome and a fingerprint of what must be equal everywhere (options, sizes); all
 * ranks return the same verdict and the message names `what` and the first rank at fault.
 */
sumo_result sumo__agree_setup(sumo_comm *c, sumo_result local, uint64_t fingerprint,
                              const char *what);

#endif
