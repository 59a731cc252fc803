/*
 * Worker threads joining an elastic run (--join): they ask to join as processes do, by a join
 * ticket in a store (tickets.h; here a directory store on a temporary folder of the run's
 * own), and wait for its place. At the step they join at, rank 0 of the members gives the next
 * tickets their places and makes a threads group of the members and the joiners in the room;
 * the members move to it (rank.h) and rank 0 hands every joiner its newest committed state
 * (regroup.h, snapshot.h).
 */
#ifndef SUMO_TRAIN_JOIN_H
#define SUMO_TRAIN_JOIN_H

#include "train/rank.h"
#include "train/regroup.h"

#include <pthread.h>

/* Where threads joining an elastic run meet its workers. At a step where workers join, rank 0
 * places the next tickets and makes a threads group of the workers and the joiners, and each
 * takes its handle here: the members by their rank, the joiners after them. A handle is a
 * pointer into this process, so it goes through memory; who joins, and as which --join, goes
 * through the tickets. */
struct sumo__train_room {
    sumo_store *store;    /* the tickets' */
    int placed;           /* tickets given a place so far */
    pthread_mutex_t lock;
    pthread_cond_t changed;
    int generation;       /* groups made so far */
    sumo_comm **handles;  /* the newest group's, until every one is taken */
    int nhandles, taken;
    bool closed;          /* the run ended: joiners still waiting go home */
    double timeout_s;     /* how long a wait lasts (SUMO_TIMEOUT) */
};

/* An open room whose waits last timeout_s (the caller reads it: SUMO_TIMEOUT), with its
 * tickets' store on a new temporary folder (SUMO_ERR_SYSTEM when it cannot be made). */
sumo_result sumo__room_init(struct sumo__train_room *room, double timeout_s);
/* The run ended: joiners still waiting go home (sumo__room_join, sumo__room_take:
 * SUMO_ERR_INVALID_USAGE); the tickets say so to their holders. */
void sumo__room_close(struct sumo__train_room *room);
/* Frees the room and removes its store's folder. */
void sumo__room_destroy(struct sumo__train_room *room);

/* A joiner: takes a ticket, waits for its place (up to the deadline) and takes its handle;
 * *join_index becomes the --join it is (what the place says). SUMO_ERR_INVALID_USAGE: the room
 * closed before its step came. Why a failure into err. */
sumo_result sumo__room_join(struct sumo__train_room *room, int *join_index, sumo_comm **out,
                            char *err, size_t errlen);

/* Takes handle `index` of group `generation` (waiting for it, up to the deadline), or makes that
 * group of `size` first (make: rank 0 of the members, once it placed the joiners' tickets:
 * sumo__take_joiners). A joiner's index is -(its place + 1): after the members, whatever
 * losses came before. SUMO_ERR_INVALID_USAGE: the room closed before the group came. */
sumo_result sumo__room_take(struct sumo__train_room *room, int generation, bool make, int size,
                            int index, int joiners, sumo_comm **out);

/* The joiners of this step and, for a joiner, its place among them and its group's number. */
typedef struct sumo__join_plan {
    int joiners;    /* joining at this step */
    int generation; /* the group they join: one per step that has joiners */
    int place;      /* a joiner's 0-based place among this step's joiners */
    int origin;     /* a joiner's worker number: cfg->workers + its order among all joins */
} sumo__join_plan;

/* The plan of the joins at step (join_index -1), or of the joiner join_index (step unused). */
sumo__join_plan sumo__plan_join(const sumo__train_config *c, long step, int join_index);

/* Rank 0's newest commit, and its counters, to every rank of the grown group; the joiners
 * (joining: this rank is one) load it, the members keep their own (the same state for the
 * methods that synchronise every step; an outer method's joiner starts from rank 0's). */
sumo_result sumo__share_state(sumo__rank_state *s, sumo__commits *ec, bool joining);

/* At a step where workers join: the members move to a group with the joiners, make the
 * exchange again on it and hand the joiners the state. */
sumo_result sumo__take_joiners(sumo__rank_state *s, sumo__commits *ec, sumo_comm **comm);

#endif
