/*
 * Checkpoint files, written atomically: a rank's state goes to a temporary file that is
 * fsynced and renamed into place, then rank 0 does the same for the manifest naming the
 * step, so a crash at any moment leaves the previous complete checkpoint in force. Every
 * file carries a header (magic, version, rank, ranks, step, configuration hash) and a CRC-32
 * of its payload; a truncated or corrupt file is refused with a message naming it.
 */
#ifndef SUMO_TRAIN_CHECKPOINT_H
#define SUMO_TRAIN_CHECKPOINT_H

#include "sumo.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The manifest holds its header line and the configuration text: bytes at most. */
#define SUMO__CKPT_MANIFEST_MAX 8192

typedef struct sumo__ckpt_id {
    const char *dir;
    long step;
    int rank, size;
    uint64_t config_hash;
    /* The settings behind config_hash, one "--flag value" per line; stored in the manifest so
     * that a refused resume can say which flags differ. NULL: none stored. */
    const char *config_text;
} sumo__ckpt_id;

/* Writes this rank's payload for step. */
sumo_result sumo__checkpoint_write_rank(const sumo__ckpt_id *id, const void *payload, size_t bytes,
                                        char *err, size_t errlen);
/* Reads this rank's payload for step into a malloc'd buffer (*payload, *bytes). */
sumo_result sumo__checkpoint_read_rank(const sumo__ckpt_id *id, void **payload, size_t *bytes,
                                       char *err, size_t errlen);
/* The manifest: which step is complete. write after every rank's file is in place. */
sumo_result sumo__checkpoint_write_manifest(const sumo__ckpt_id *id, char *err, size_t errlen);
/* *step of the latest complete checkpoint; SUMO_ERR_INVALID_USAGE when there is none. */
sumo_result sumo__checkpoint_read_manifest(const sumo__ckpt_id *id, long *step, char *err,
                                           size_t errlen);
/* Removes this rank's file for step (an older checkpoint), ignoring absence. */
void sumo__checkpoint_remove_rank(const sumo__ckpt_id *id);

/*
 * Before a run uses dir. A fresh run (!resume) into a folder that holds a checkpoint is
 * refused (SUMO_ERR_INVALID_USAGE, naming dir) unless overwrite. With clean (one process of
 * the run), removes what earlier runs left: the temporaries of writers that no longer run
 * (a kill during a save) and, for overwrite, the old checkpoint itself.
 */
sumo_result sumo__checkpoint_prepare(const char *dir, bool resume, bool overwrite, bool clean,
                                     char *err, size_t errlen);
/* Keeps rank's keep newest files of steps up to latest (the manifest's) and removes the rest. */
void sumo__checkpoint_prune(const char *dir, int rank, long latest, int keep);
/* "--flag A in the checkpoint, B now; ..." for every setting that differs between two
 * configuration texts (one "--flag value" per line); empty when none does. */
void sumo__config_diff(const char *stored, const char *current, char *out, size_t len);

/* Atomic replace of path with bytes (temporary file, fsync, rename, fsync of the folder).
 * Shared with the experiment results writer. */
sumo_result sumo__write_file_atomic(const char *path, const void *data, size_t bytes, char *err,
                                    size_t errlen);

#endif
