/* The outer loop (sumo_diloco.h), plus what the distributed optimizer needs of it. */
#ifndef SUMO_OPT_DILOCO_H
#define SUMO_OPT_DILOCO_H

#include "sumo_diloco.h"
#include "common/common.h"

/* Forgets the anchors that the last begin took: the caller's local step changed nothing (the
 * base optimizer refused it), so the next begin takes them again. */
void sumo__diloco_unanchor(sumo_diloco *diloco);
/* Whether the anchors are taken. */
bool sumo__diloco_anchored(const sumo_diloco *diloco);

#endif
