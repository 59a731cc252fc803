/*
 * What a training run reports (trainer.h runs it): a header of its own, so that the parts of
 * the run (rank.h and the files built on it) fill it in without including the driver that
 * calls them.
 */
#ifndef SUMO_TRAIN_SUMMARY_H
#define SUMO_TRAIN_SUMMARY_H

#include "sumo.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct sumo__train_summary {
    double final_accuracy, best_accuracy, final_test_loss, final_train_loss;
    long steps;                  /* total steps taken */
    long steps_to_target;        /* -1 when never reached */
    double epochs_to_target;
    bool diverged;
    double wall_seconds;
    double aggregation_seconds;  /* time inside sumo_distributed_step (rank 0) */
    double compute_seconds;      /* time in forward/backward (rank 0) */
    sumo_comm_stats comm;
    /* The most payload bytes (as comm counts them) that one step started. Each method here
     * has at most one exchange on the wire at a time (DDP's allreduce completes inside its
     * step; a DiLoCo fragment's exchange is applied, delay <= H / F steps on, before the next
     * one starts), so this is the peak in flight; where one step runs several blocking
     * collectives in turn (SlowMo averaging its buffers after the model) it adds them: an
     * upper bound. */
    uint64_t peak_bytes_in_flight;
    size_t extra_memory_bytes;
    size_t nparams;
    uint64_t param_checksum;     /* FNV-1a of the final parameters' bits */
    int workers;                 /* ranks at the end (an elastic run's may be fewer) */
    bool lost;                   /* this rank left or died before the end (--leave, --kill) */
} sumo__train_summary;

#endif
