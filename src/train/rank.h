/*
 * One rank of a training run (trainer.h drives it): what the rank holds during the run, and
 * the parts of it that set up, meet the other ranks and end. The files beside it work on this
 * state: evaluation.h scores and records, snapshot.h saves and loads it, regroup.h and join.h
 * change the membership of an elastic run.
 */
#ifndef SUMO_TRAIN_RANK_H
#define SUMO_TRAIN_RANK_H

#include "sumo.h"
#include "common/common.h"
#include "train/config.h"
#include "train/idx.h"
#include "train/model.h"
#include "train/summary.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Everything one rank needs during a run. */
typedef struct sumo__rank_state {
    sumo_comm *comm;
    const sumo__train_config *cfg;
    const sumo__dataset *train, *test;
    int rank, size;
    sumo__model *model;
    sumo_optimizer *opt;
    sumo_aggregator *agg;
    sumo_distributed *dist;
    sumo_lr_schedule sched;
    size_t nparams, pixels;
    long steps_per_epoch, total_steps;
    long step;              /* steps taken */
    /* Where the next step's data starts: the epoch and the items of its permutation used so
     * far. Each step uses size x batch items, so with a fixed size this is the step count
     * split in two; kept apart because an elastic run's size changes. */
    int epoch;
    size_t pos;
    size_t usable;          /* items of the training set in use */
    double loss_sum;        /* local losses since the last evaluation */
    long loss_count;
    float *xbatch;
    uint8_t *ybatch;
    uint32_t *perm;
    int perm_epoch;
    float *eval_params;     /* averaged parameters, when ranks hold different ones */
    FILE *log;
    char config[2048];      /* config_text of cfg */
    double t0, elapsed_before; /* wall clock; elapsed_before carries over a resume */
    sumo_comm_stats comm_before; /* communication counted before a resume */
    uint64_t peak_step_bytes;    /* the most bytes one step put on the wire (resumes keep it) */
    sumo__train_summary *summary;
    char *err;
    size_t errlen;
    void *shared_params, *shared_grads; /* from sumo_mem_alloc (sumo__rank_share_buffers), or NULL */
    bool ended_together;                /* the training loop ended in step on every rank */
    int origin;                         /* this rank's number when the run started */
    /* What sumo__rank_build() chose, kept to make the exchange again on a shrunk communicator. */
    bool needs_agg;
    sumo_aggregator_options aopt;
    sumo_distributed_options dopt;
} sumo__rank_state;
static inline double sumo__seconds_now(void) { return (double)sumo__now_ns() * 1e-9; }

/* Puts "rank R: what: the status: the communicator's message" in s->err, unless a sentence is
 * there already (the first failure is the one to report); returns r. */
sumo_result sumo__rank_fail(sumo__rank_state *s, sumo_result r, const char *what);

/* Makes the model, the optimizer, the learning-rate schedule, the batch buffers and, last, the
 * exchange (the aggregator and the distributed optimizer: the only part that meets the other
 * ranks, so an elastic run that loses one here makes it again on the survivors). s->comm,
 * cfg, train, test, rank, size, summary and err are set by the caller. */
sumo_result sumo__rank_build(sumo__rank_state *s);

/* Moves the rank to fresh, a communicator of a new membership: the exchange holds the old
 * handle, so it goes first (with *comm), and is made again on fresh. */
sumo_result sumo__rank_move_to(sumo__rank_state *s, sumo_comm **comm, sumo_comm *fresh);
/* sumo__rank_move_to in two halves, for communicators someone else owns (an elastic
 * membership's, which destroys the old one itself): drop the exchange while the old
 * communicator still exists, then build it on the new one. */
void sumo__rank_drop_exchange(sumo__rank_state *s);
sumo_result sumo__rank_build_on(sumo__rank_state *s, sumo_comm *comm);

/*
 * Over MPI, the parameters and gradients move into memory from sumo_mem_alloc, so that the
 * collectives of processes on one node read and write the peers' buffers directly instead of
 * copying through staging areas (the same arithmetic, in the same order: the same bits).
 * Collective: called once every rank agreed that its set-up worked. An allocation that fails
 * fails on every rank and training goes on in the model's own buffers.
 */
void sumo__rank_share_buffers(sumo__rank_state *s);

/* Whether the ranks hold the same parameters now (an outer method's may not between syncs). */
int sumo__rank_synchronized(const sumo__rank_state *s);

/* What the exchange has counted on its communicator, and that plus what came before a resume
 * or a change of membership (s->comm_before). */
sumo_comm_stats sumo__rank_stats(const sumo__rank_state *s);
sumo_comm_stats sumo__rank_stats_so_far(const sumo__rank_state *s);

/* Frees what sumo__rank_build made and closes the log; the communicator stays the caller's. */
void sumo__rank_teardown(sumo__rank_state *s);

#endif
