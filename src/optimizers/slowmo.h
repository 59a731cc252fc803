/* SlowMo's outer loop (optimizers/slowmo.c; docs/design/slowmo.md): the public sumo_slowmo
 * object of sumo_distributed.h, plus what the distributed optimizer needs of it. */
#ifndef SUMO_SLOWMO_H
#define SUMO_SLOWMO_H

#include "sumo_distributed.h"
#include "common/common.h"

/* Forgets the anchor that the last begin took: the caller's local step changed nothing (the
 * base optimizer refused it), so the next begin takes it again. */
sumo_result sumo__slowmo_unanchor(sumo_slowmo *slowmo);
/* Whether the anchor is taken (begin was called in this outer iteration's first step). */
bool sumo__slowmo_anchored(const sumo_slowmo *slowmo);

#endif
