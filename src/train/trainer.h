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
#include "sumo_aggregation.h"
#include "sumo_diloco.h"
#include "sumo_distributed.h"
#include "sumo_optim.h"
#include "train/idx.h"
#include "train/model.h"

#include <stdbool.h>
#include <stdint.h>

typedef enum sumo__method {
    SUMO__METHOD_SUM,
    SUMO__METHOD_AVG,
    SUMO__METHOD_ADASUM,       /* Adasum on gradients */
    SUMO__METHOD_ADASUM_DELTA, /* Adasum on optimizer deltas (Horovod's mode) */
    SUMO__METHOD_ACGA,
    SUMO__METHOD_SLOWMO,
    SUMO__METHOD_LOCALSGD,
    SUMO__METHOD_BMUF,
    SUMO__METHOD_DILOCO,           /* sumo_diloco.h: DiLoCo's preset */
    SUMO__METHOD_STREAMING_DILOCO, /* sumo_diloco.h: Streaming DiLoCo's preset */
    SUMO__METHOD_COUNT
} sumo__method;

/* SlowMo and its presets: the outer loop with SlowMo's options and flags (--tau, ...). */
static inline bool sumo__method_is_slowmo(sumo__method m)
{
    return m == SUMO__METHOD_SLOWMO || m == SUMO__METHOD_LOCALSGD || m == SUMO__METHOD_BMUF;
}
/* The DiLoCo family: the outer loop with DiLoCo's options and flags (--sync-every, ...). */
static inline bool sumo__method_is_diloco(sumo__method m)
{
    return m == SUMO__METHOD_DILOCO || m == SUMO__METHOD_STREAMING_DILOCO;
}
/* The methods the distributed optimizer's OUTER mode runs. */
static inline bool sumo__method_is_outer(sumo__method m)
{
    return sumo__method_is_slowmo(m) || sumo__method_is_diloco(m);
}

const char *sumo__method_name(sumo__method m);
/* Parses a --reduce value; false when unknown. */
bool sumo__method_parse(const char *name, sumo__method *out);

typedef struct sumo__train_config {
    int workers;                 /* N: ranks of the communicator (checked) */
    sumo__model_kind model;
    int hidden;                  /* MLP hidden units */
    int batch;                   /* per worker */
    int epochs;
    uint64_t seed;
    sumo__method method;
    sumo_optimizer_options optim;
    /* Learning rate: base is the single-worker rate; scale multiplies it (linear scaling:
     * scale = N); warm-up over warmup_epochs from base to base * scale. */
    double lr;
    double lr_scale;
    double warmup_epochs;
    sumo_lr_kind schedule;       /* constant, step (x0.1 at 50% and 75%), cosine to 0 */
    sumo_acga_options acga;
    /* The outer methods' loop (fragment_of: NULL, or strided below) and what happens to the
     * base optimizer's buffers after each outer step. */
    sumo_diloco_options outer;
    sumo_buffer_policy buffers;
    bool diloco_strided;         /* fragment_of = tensor index mod fragments (the paper's) */
    int adasum_hierarchical;
    int adasum_group_size;
    /* Evaluation and output */
    int eval_every;              /* steps; 0: at the end of every epoch */
    double target_accuracy;      /* for "steps to target"; 0: none */
    size_t train_limit;          /* use only the first items of the training set; 0: all */
    size_t test_limit;
    const char *log_path;        /* CSV, written by rank 0; NULL: none */
    const char *label;           /* the run's name in progress lines; NULL: the method's */
    bool progress;               /* progress on stderr (rank 0) */
    bool progress_inline;        /* one line rewritten in place (a terminal); else a line per
                                    epoch, which a log file or a CI page can show */
    /* Checkpoints */
    const char *checkpoint_dir;  /* NULL: none */
    int checkpoint_every;        /* steps; 0: only at the end */
    int keep;                    /* checkpoints kept (the newest); < 1: 1 */
    bool resume;
    long stop_after;             /* stop after this many steps, saving a checkpoint there when
                                    checkpoint_dir is set; 0: never */
    bool verify_ranks;           /* after every synchronised step, check that all ranks hold
                                    bit-identical parameters (tests; costs an allgather) */
} sumo__train_config;

void sumo__train_config_default(sumo__train_config *cfg);

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
} sumo__train_summary;

/*
 * Trains on this rank of comm. Every rank must call it with the same configuration and the
 * same data. Rank 0 writes the log and the summary; err gets a sentence on failure.
 */
sumo_result sumo__train_rank(sumo_comm *comm, const sumo__train_config *cfg,
                             const sumo__dataset *train, const sumo__dataset *test,
                             sumo__train_summary *summary, char *err, size_t errlen);

/* Runs cfg->workers ranks of the threads transport in this process. */
sumo_result sumo__train_threads(const sumo__train_config *cfg, const sumo__dataset *train,
                                const sumo__dataset *test, sumo__train_summary *summary,
                                char *err, size_t errlen);

#endif
