/*
 * An elastic run's losses (rank.h): every rank keeps the state of its last two completed steps;
 * when a peer is lost, the survivors shrink the communicator (sumo_elastic.h), go back to the
 * newest step they all hold and carry on. Also the losses staged for tests (--leave, --kill).
 */
#ifndef SUMO_TRAIN_REGROUP_H
#define SUMO_TRAIN_REGROUP_H

#include "train/rank.h"

/* The state after the last two completed steps: a peer lost in the middle of a step leaves
 * some survivors one step further than others, and the survivors go back to the newest step
 * they all hold. */
typedef struct sumo__commits {
    unsigned char *blob[2];
    size_t bytes[2];
    long step[2];
    int epoch[2];
    size_t pos[2];
    int latest;
    int shrinks;  /* counted alike by every survivor: names each regrouping in the store */
    int grows;    /* joins taken in so far (a joiner counts those before its own) */
    int *origins; /* origins[r]: the rank that rank r was when the run started */
    int norigins;
} sumo__commits;

/* Keeps the rank's state after the step just taken, over the older of the two. */
sumo_result sumo__commit(sumo__rank_state *s, sumo__commits *ec);
void sumo__commits_free(sumo__commits *ec);

/* A failure the survivors can get past: a peer that is gone or never came (elastic runs). */
bool sumo__recoverable(const sumo__rank_state *s, sumo_result r);

/* After a lost peer (cause): the survivors regroup on a shrunk *comm and go back to the newest
 * state they all hold. */
sumo_result sumo__recover(sumo__rank_state *s, sumo__commits *ec, sumo_comm **comm, sumo_result cause);

/* A worker lost during set-up (no step taken, nothing to go back to): the survivors shrink and
 * make the exchange again. */
sumo_result sumo__regroup_setup(sumo__rank_state *s, sumo__commits *ec, sumo_comm **comm);

/* The staged loss of this rank at this step, if any: it leaves (destroys *comm, set to NULL) or
 * dies. Returns whether it did. */
bool sumo__staged_loss(sumo__rank_state *s, sumo_comm **comm);

#endif
