/*
 * Processes of an elastic run that meet through a store (sumo train --store): the commit point
 * of each step on the process's membership (sumo_elastic.h), where a lost member becomes a
 * failure every member sees and processes waiting to join are taken in.
 */
#ifndef SUMO_TRAIN_MEMBERS_H
#define SUMO_TRAIN_MEMBERS_H

#include "train/rank.h"
#include "train/regroup.h"

/* After the step's commit (regroup.h): the membership's commit point. A failure the survivors
 * get past (sumo__recoverable) when a member is lost; with joiners, the members move to the
 * grown membership's communicator (*comm) and hand the joiners the state, or go on as they
 * were when a joiner did not come. */
sumo_result sumo__members_commit(sumo__rank_state *s, sumo__commits *ec, sumo_comm **comm);

#endif
