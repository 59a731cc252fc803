/*
 * What a rank of a training run records (rank.h): the test score of the common model, the
 * log's rows (rank 0 writes them) and the progress lines on stderr.
 */
#ifndef SUMO_TRAIN_EVALUATION_H
#define SUMO_TRAIN_EVALUATION_H

#include "train/rank.h"

/* Test loss and accuracy of the common model: each rank scores its share of the test set and
 * the sums are reduced in rank order, so every rank gets the same numbers. When the ranks hold
 * different parameters (inside a SlowMo outer iteration) the average model is scored. Collective;
 * the training loss is the mean of the local losses since the last call. */
sumo_result sumo__rank_evaluate(sumo__rank_state *s, double *test_loss, double *accuracy, double *train_loss);

/* Rank 0: one row of the log, and the summary's accuracy figures. */
void sumo__rank_log_row(sumo__rank_state *s, double train_loss, double test_loss, double acc);

/* Rank 0 with cfg->progress: where the run is, on stderr (in place on a terminal, else one
 * line per epoch). */
void sumo__rank_progress(sumo__rank_state *s, int epoch, double last_acc);

/* Rank 0: opens cfg->log_path, on a resume without the rows after s->step (they describe steps
 * that will be taken again, so the resumed log reads as if the run had never stopped). */
sumo_result sumo__rank_open_log(sumo__rank_state *s);

/* The log's rows after the step the survivors went back to will be written again: drops them
 * and opens the log to append. */
sumo_result sumo__rank_reopen_log(sumo__rank_state *s);

#endif
