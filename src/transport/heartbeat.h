/*
 * Reading the heartbeats of processes on several hosts (the writer is sumo_heart,
 * sumo_elastic.h): each rank's process rewrites a value under a prefix and its decimal number
 * in the store, and a reader takes a rank for dead once the value it reads has stood still
 * (or been absent) for alive_ns since it first read it so. The one rule, used by the store
 * agreement (store_agree.c) and the TCP meeting (tcp_meeting.c). The reader keeps its own
 * clock readings, so two readers may disagree by their polling; correctness never rests on
 * them (a live rank taken for dead is only left out).
 */
#ifndef SUMO_TRANSPORT_HEARTBEAT_H
#define SUMO_TRANSPORT_HEARTBEAT_H

#include "common/common.h"

#include "sumo_shm.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A beat longer than this compares by its first SUMO__BEAT_BYTES - 1 bytes. */
#define SUMO__BEAT_BYTES 32
/* The longest key a heartbeat has: a prefix and a decimal int. */
#define SUMO__BEAT_KEY_BYTES 300

typedef struct sumo__heartbeats {
    const sumo_store *store;
    const char *prefix; /* the caller's: rank r beats under prefix and the decimal r */
    int64_t alive_ns;
    int count;                      /* slots */
    char (*beat)[SUMO__BEAT_BYTES]; /* each slot's beat as last read */
    int64_t *since;                 /* since when it has read so (0: never read) */
} sumo__heartbeats;

/* count slots, none read yet. SUMO_ERR_SYSTEM when out of memory. */
sumo_result sumo__heartbeats_init(sumo__heartbeats *h, const sumo_store *store,
                                  const char *prefix, int64_t alive_ns, int count);
void sumo__heartbeats_free(sumo__heartbeats *h);

/* The key rank `who` beats under; false when it does not fit in bytes. */
bool sumo__heartbeats_key(const sumo__heartbeats *h, int who, char *key, size_t bytes);

/* The rule alone: slot's beat read as `text` at now (sumo__now_ns's clock); whether it has
 * stood still for alive_ns. */
bool sumo__heartbeats_judge(sumo__heartbeats *h, int slot, const char *text, int64_t now);

/* Reads the beat of rank `who` into slot at now, without waiting, and says whether it is dead
 * by the rule. A beat not there yet is no beat (the empty one). When the store fails the
 * beat is judged as none and its result returned (the caller decides whether that fails it);
 * SUMO_ERR_INVALID_ARGUMENT, *dead false and nothing judged for a key that does not fit. */
sumo_result sumo__heartbeats_look(sumo__heartbeats *h, int slot, int who, int64_t now,
                                  bool *dead);

/* The waits of a protocol through the store (the agreement, the commit): timeout_s (0:
 * SUMO_TIMEOUT) and, with alive_prefix (at most max_prefix bytes), alive_s (0:
 * SUMO_LIVENESS_TIMEOUT), each in (0, 1e7) seconds, as nanoseconds. Why not into why. */
sumo_result sumo__store_waits(double timeout_s, const char *alive_prefix, double alive_s,
                              size_t max_prefix, int64_t *timeout_ns, int64_t *alive_ns,
                              char *why, size_t why_bytes);

#endif
