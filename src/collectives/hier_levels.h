/*
 * A two-level communicator's levels (comm_hier.c makes them) as its algorithms use them
 * (hier_algos.c, adasum_hier.c, adasum.c).
 */
#ifndef SUMO_HIER_LEVELS_H
#define SUMO_HIER_LEVELS_H

#include "collectives/comm.h"

/* A collective on a level (one of c->levels' children), with the parent's stream. A failure is
 * copied into the parent's status as "<what> on the <level> communicator (node h, local rank
 * l): <its message>", breaks the parent and aborts every level (so peers waiting on another
 * level leave at once). */
sumo_result sumo__level_run(sumo_comm *c, sumo_comm *level, const sumo_collective *call,
                            const char *what);
/* The across communicator that moves the memory of the call running now (c->x): the last
 * added whose transport carries it, else the first. */
sumo_comm *sumo__level_across(const sumo_comm *c);

#endif
