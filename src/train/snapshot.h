/*
 * A rank's whole state as one blob, and the checkpoints made of it: the parameters, the
 * optimizer's, the aggregator's and the distributed optimizer's state, and the run's counters.
 * Checkpoints write it to disk (checkpoint.h); an elastic run keeps it in memory after every
 * step (regroup.h) and hands it to joiners (join.h).
 */
#ifndef SUMO_TRAIN_SNAPSHOT_H
#define SUMO_TRAIN_SNAPSHOT_H

#include "train/rank.h"

/* The run's counters, carried over with the state so a resumed or regrouped run goes on
 * counting where it stood. */
typedef struct sumo__train_counters {
    int64_t step;
    double loss_sum;
    int64_t loss_count;
    double elapsed;
    sumo_comm_stats comm;      /* communication before the checkpoint, carried over */
    uint64_t peak_step_bytes;
    double best_accuracy;
    int64_t steps_to_target;
    double epochs_to_target;
} sumo__train_counters;

/* The blob: each section's length, then its bytes (malloc'd into *out). */
sumo_result sumo__rank_pack(sumo__rank_state *s, unsigned char **out, size_t *bytes);

/* Loads what sumo__rank_pack made into the rank's parts; SUMO_ERR_INVALID_ARGUMENT when a
 * section does not fit them. The counters are left to the caller (*tc). An aggregator whose
 * state is sized by the rank count (ACGA's per-rank history) starts afresh after a change of
 * membership (resized: the state came from a group of another size) instead of failing. */
sumo_result sumo__rank_unpack(sumo__rank_state *s, const unsigned char *blob, size_t bytes,
                              sumo__train_counters *tc, bool resized);

/* Takes up the counters that sumo__rank_unpack left (the step, the losses, the clock, the
 * communication counts and the accuracy figures of the summary). */
void sumo__rank_apply_counters(sumo__rank_state *s, const sumo__train_counters *tc);

/* Collective: every rank writes its file for s->step, then rank 0 the manifest naming it, then
 * each removes its files beyond cfg->keep. */
sumo_result sumo__rank_save_checkpoint(sumo__rank_state *s);

/* Loads the newest complete checkpoint of cfg->checkpoint_dir and puts the data where that
 * step left it; a checkpoint of another configuration or shape is refused, naming it. */
sumo_result sumo__rank_load_checkpoint(sumo__rank_state *s);

#endif
