/*
 * The training driver: data-parallel training of a small model on Fashion-MNIST (or any IDX
 * data set) with any aggregation method, on whatever communicator it is given.
 *
 * Every rank holds the whole model, starts from the same seeded initialisation, and trains on
 * its own shard of each epoch's shuffled data: the epoch's permutation comes from (seed,
 * epoch), and rank r takes batch-sized slices r, r + N, r + 2N, ... of it, so the total batch
 * is N * batch and the data seen does not depend on the transport. Every step goes through
 * sumo_distributed_step, so methods slot in without this loop knowing them.
 */
#ifndef SUMO_TRAIN_TRAINER_H
#define SUMO_TRAIN_TRAINER_H

#include "sumo.h"
#include "train/config.h"
#include "train/idx.h"
#include "train/summary.h"

/*
 * Trains on this rank of *comm. Every rank must call it with the same configuration and the
 * same data. Rank 0 writes the log and the summary; err gets a sentence on failure. In an
 * elastic run *comm is replaced by the shrunk communicator after a loss, and set to NULL when
 * this rank is the one lost (summary->lost); the caller destroys what is left in *comm. join:
 * -1, or (threads, *comm NULL; any value from 0) a joiner: it takes a join ticket in cfg->room,
 * whose place says which of the configuration's joiners it is, and summary->lost says it never
 * came in.
 */
sumo_result sumo__train_rank(sumo_comm **comm, int join, const sumo__train_config *cfg,
                             const sumo__dataset *train, const sumo__dataset *test,
                             sumo__train_summary *summary, char *err, size_t errlen);

/* Runs cfg->workers ranks of the threads transport in this process. */
sumo_result sumo__train_threads(const sumo__train_config *cfg, const sumo__dataset *train,
                                const sumo__dataset *test, sumo__train_summary *summary,
                                char *err, size_t errlen);

#endif
