/* What the distributed optimizer (distributed.c) needs of a base optimizer (optimizer.c,
 * sumo_optim.h) beyond the public calls. */
#ifndef SUMO_OPT_OPTIMIZER_H
#define SUMO_OPT_OPTIMIZER_H

#include "sumo_optim.h"

/* The tensor layout the optimizer was created with (ntensors entries, sumo_optimizer_size). */
const size_t *sumo__optimizer_layout(const sumo_optimizer *optimizer);

#endif
