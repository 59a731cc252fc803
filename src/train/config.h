/*
 * What a training run is asked to do (trainer.h runs it): the method, the model, the
 * optimizer and the outer loop's options, evaluation, checkpoints; the method names the
 * command line gives; and the run's settings as text, stored with a checkpoint so that a
 * resumed run can be refused by the flags that differ.
 */
#ifndef SUMO_TRAIN_CONFIG_H
#define SUMO_TRAIN_CONFIG_H

#include "sumo.h"
#include "sumo_aggregation.h"
#include "sumo_diloco.h"
#include "sumo_distributed.h"
#include "sumo_elastic.h"
#include "sumo_optim.h"
#include "train/model.h"

#include <stdbool.h>
#include <stddef.h>
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
    SUMO__METHOD_SGP,              /* the gossip bases alone (sumo_diloco.h's base) */
    SUMO__METHOD_OSGP,
    SUMO__METHOD_DPSGD,
    SUMO__METHOD_SLOWMO_SGP,       /* SlowMo over each gossip base */
    SUMO__METHOD_SLOWMO_OSGP,
    SUMO__METHOD_SLOWMO_DPSGD,
    SUMO__METHOD_COUNT
} sumo__method;

/* SlowMo and its presets: the outer loop with SlowMo's options and flags (--tau, ...). */
static inline bool sumo__method_is_slowmo(sumo__method m)
{
    return m == SUMO__METHOD_SLOWMO || m == SUMO__METHOD_LOCALSGD || m == SUMO__METHOD_BMUF ||
           (m >= SUMO__METHOD_SGP && m <= SUMO__METHOD_SLOWMO_DPSGD);
}
/* The gossip base of a method (SUMO_BASE_LOCAL for the others). */
static inline sumo_diloco_base sumo__method_gossip_base(sumo__method m)
{
    switch (m) {
    case SUMO__METHOD_SGP: case SUMO__METHOD_SLOWMO_SGP: return SUMO_BASE_SGP;
    case SUMO__METHOD_OSGP: case SUMO__METHOD_SLOWMO_OSGP: return SUMO_BASE_OSGP;
    case SUMO__METHOD_DPSGD: case SUMO__METHOD_SLOWMO_DPSGD: return SUMO_BASE_DPSGD;
    default: return SUMO_BASE_LOCAL;
    }
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

/* The bit of a method in a set of methods (sumo__method_flag.methods). */
#define SUMO__METHOD_BIT(m) (1u << (unsigned)(m))

/*
 * A flag of `sumo train` that only some methods read (ACGA's, SlowMo's, DiLoCo's, Adasum's),
 * and which: given for methods none of which reads it, it would change nothing, so the
 * command line refuses it by name. The sets follow configure and build (what each method
 * takes from the configuration), not the flags' families alone.
 */
typedef struct sumo__method_flag {
    const char *name; /* "--tau" */
    unsigned methods; /* SUMO__METHOD_BIT of each method that reads it */
    const char *note; /* NULL, or why the methods of note_for, which one might expect to read
                         it, do not */
    unsigned note_for;
} sumo__method_flag;

/* The table of such flags (*count entries, in --help's order). */
const sumo__method_flag *sumo__method_flags(int *count);
/* A set of methods as "a, b and c" into out (cut at len). */
void sumo__method_set_text(unsigned methods, char *out, size_t len);

#define SUMO__MAX_TRAIN_EVENTS 8

typedef enum sumo__train_event { SUMO__EVENT_LEAVE, SUMO__EVENT_DIE, SUMO__EVENT_JOIN } sumo__train_event;

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
    /* Elastic training: a rank that is lost costs the step in flight. Every rank keeps the
     * state of its last two steps; the survivors shrink the communicator (sumo_elastic.h),
     * go back to the newest step they all completed, and carry on with the data of each step
     * dealt over the ranks left. */
    bool elastic;
    const sumo_store *store;     /* processes (shm): where survivors meet again; threads: NULL */
    /* Processes that meet through a store (sumo train --store): this process's membership,
     * which makes every communicator (shrink, grow by join tickets); NULL elsewhere. */
    sumo_elastic *membership;
    /* Changes staged for demonstration and tests, before step `step`: the worker that started
     * as `rank` leaves cleanly (destroys its handle) or dies (threads: aborts without a word;
     * processes: SIGKILL on itself) before its part of the step's exchange; or a new worker
     * joins (threads; `rank` unused): joiners are numbered from the first worker count on, in
     * the order given. */
    struct { int rank; long step; sumo__train_event kind; } events[SUMO__MAX_TRAIN_EVENTS];
    int nevents;
    /* Threads joining an elastic run meet the workers here (join.h; NULL: none). */
    struct sumo__train_room *room;
} sumo__train_config;

void sumo__train_config_default(sumo__train_config *cfg);

/* The settings that decide the trajectory, one "--flag value" per line (config.c says which). */
void sumo__train_config_text(const sumo__train_config *c, char *out, size_t len);

#endif
