/*
 * `sumo train`'s command line: the options, their parse into a run's configuration, and each
 * --reduce method's own configuration from them (train.c runs and reports).
 */
#ifndef SUMO_TOOL_TRAIN_OPTIONS_H
#define SUMO_TOOL_TRAIN_OPTIONS_H

#include "train/config.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#define MAX_METHODS 16

/* Largest values that mean something here; beyond them a typo is likelier than intent. */
#define MAX_BATCH 65536
#define MAX_EPOCHS 1000000
#define MAX_HIDDEN 65536
#define MAX_LR 1000.0

#define MAX_METHODS 16

typedef struct train_options {
    sumo__train_config cfg;
    int nmethods;
    sumo__method methods[MAX_METHODS];
    const char *scalings[MAX_METHODS];
    char labels[MAX_METHODS][64];
    const char *reduce; /* --reduce as given (argv, or the default's literal) */
    const char *transport;
    const char *data_dir;
    const char *log_path;
    const char *summary_path;
    const char *lr_scaling;
    double momentum, alpha_override, slow_beta_override;
    int tau_override, inner_override;
    int buffers_override, memory_efficient;
    int gossip_peers, gossip_staleness; /* 0: the preset's */
    /* DiLoCo: -1 (or NaN for the doubles) where the preset's value stands */
    int sync_every, fragments, delay, outer, combine, quantize, strided, ranges;
    double merge_alpha, outer_lr, outer_momentum;
    int64_t quantize_block;
    int have_momentum;
    bool workers_given; /* under mpirun the ranks are the workers: a differing --workers is refused */
    /* The method-specific flags given (bit f: entry f of sumo__method_flags), whatever their
     * value: one given at its default is still refused for methods that do not read it. */
    uint64_t specific_given;
    bool overwrite, have_checkpoint_every, have_keep;
    /* --store DIR: an elastic run of processes that meet through a directory store, this one
     * --rank R of --workers N, or (--joiner) one that joins the running job */
    const char *store_dir;
    int store_rank;
    bool joiner, rank_given;
} train_options;

/* 0: run; 1: --help was printed; 2: a usage error, said on stderr. */
int train_parse_options(int argc, char **argv, train_options *o);

/* Method m's configuration from the options (its presets, then the flags given; the scaling:
 * the entry's METHOD@S, or NULL for --lr-scaling's). 0, or 2 after naming the culprit. */
int train_configure_method(const train_options *o, sumo__method m, const char *scaling, sumo__train_config *c);

#endif
