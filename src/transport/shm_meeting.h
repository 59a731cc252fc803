/*
 * How the shm transport's processes (transport_shm.c) meet, once, through the caller's
 * key-value store: rank 0 makes the control segment (shm_segment.h) and publishes where it is;
 * every other rank maps it, allocates its own staging area, claims its slot and says how that
 * went; rank 0 then says go, try again with a named object (a peer could not open the memfd),
 * or fail, with the reason. The records are binary: every rank runs this library's layout.
 */
#ifndef SUMO_SHM_MEETING_H
#define SUMO_SHM_MEETING_H

#include "transport/shm_segment.h"

#include "sumo_shm.h"

/* What the meeting needs: the caller's options (validated) and its deadline. */
typedef struct sumo__shm_meeting {
    const sumo_shm_options *o;
    int64_t deadline; /* sumo__now_ns() clock */
    double seconds;   /* the deadline as a timeout, for messages */
    int log_level;
    char *err; /* why the meeting failed */
    size_t errlen;
} sumo__shm_meeting;

/* What it leaves on every rank: the control segment, mapped here. */
typedef struct sumo__shm_met {
    unsigned char *seg; /* L.total bytes; the caller unmaps it */
    sumo__shm_layout L;
    size_t slot_bytes, stage_bytes;
    int mech; /* how it was made: mem_alloc makes its parts the same way */
} sumo__shm_met;

/* Collective over the options' ranks. Rank 0 reads the staging size (the options', else
 * SUMO_SHM_STAGE_BYTES) and SUMO_SHM_NAMED, and a refusal of either fails its peers too. On
 * failure nothing is left mapped or named, and m->err says why. */
sumo_result sumo__shm_meet(const sumo__shm_meeting *m, sumo__shm_met *met);

#endif
