/*
 * Whether the shm transport's processes (transport_shm.c) are alive.
 *
 * Liveness. No launcher ends the job when a process dies, so the waits of shm.c ask at each
 * sleep slice whether a rank they depend on died: pidfds (Linux 5.3), readable once the
 * process has ended, reaped or not (a zombie counts), and where pidfds are missing, kill(pid,
 * 0) and the process's state in /proc. A rank's identity is its pid and its start time, so a
 * recycled pid is never mistaken for the rank. While the group meets (shm_meeting.c), the
 * peers watch rank 0 the same way between slices of their waits on the store.
 */
#ifndef SUMO_SHM_LIVENESS_H
#define SUMO_SHM_LIVENESS_H

#include "transport/shm.h"
#include "transport/shm_segment.h"

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

/* This process's start time (/proc/self/stat, ticks since boot; 0: unknown). */
uint64_t sumo__shm_own_start(void);
/* Whether pid is, as /proc shows it here, the live process that started at start. */
bool sumo__shm_still_running(pid_t pid, uint64_t start);

/* The peers a rank watches once the group has met. */
typedef struct sumo__shm_watch {
    int rank, size;
    const sumo__shm_rank_info *info; /* the segment's: each rank's pid and start time */
    int *pidfd;                      /* per rank: a pidfd, -1: none */
    pid_t *pid;                      /* per rank: the pid to ask instead, 0: not watched */
    /* A second rank the current wait depends on (a sendrecv blocked both ways), or -1. */
    int also;
} sumo__shm_watch;

/* Allocates the per-rank tables (nothing watched yet); false when out of memory. */
bool sumo__shm_watch_init(sumo__shm_watch *w, int rank, int size);
/* Starts watching every peer of info (after the creation's barrier: every rank is attached and
 * was alive a moment ago) and makes shm's waits ask w. */
void sumo__shm_watch_start(sumo__shm_watch *w, sumo__shm *shm, const sumo__shm_rank_info *info);
/* Closes the pidfds and frees the tables (w may be one sumo__shm_watch_init failed). */
void sumo__shm_watch_free(sumo__shm_watch *w);

#endif
