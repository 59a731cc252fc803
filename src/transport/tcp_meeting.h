/*
 * How the TCP transport's processes (transport_tcp.c) meet, once, through the caller's
 * key-value store (sumo_tcp.h tells the protocol): rank 0 publishes the job's nonce; every
 * other rank listens and publishes where; each rank connects to every higher rank and accepts
 * every lower one, a hello each way naming the job, the two ranks, the size and the version,
 * so a connection that is not one of the job's is refused and closed. Nothing listens once
 * the group has met. With heartbeats (sumo_tcp_options.alive_prefix) a wait also ends when a
 * rank it waits for stops beating or another rank says its meeting failed.
 */
#ifndef SUMO_TCP_MEETING_H
#define SUMO_TCP_MEETING_H

#include "common/common.h"

#include "sumo_tcp.h"

/* What the meeting needs: the caller's options (validated) and its deadline. */
typedef struct sumo__tcp_meeting {
    const sumo_tcp_options *o;
    int64_t deadline; /* sumo__now_ns() clock */
    double seconds;   /* the deadline as a timeout, for messages */
    int log_level;
    char *err; /* why the meeting failed */
    size_t errlen;
} sumo__tcp_meeting;

/* Collective over the options' ranks. conn[r] becomes the connection with rank r
 * (non-blocking, TCP_NODELAY; conn[o->rank] stays -1). On failure no socket is left open,
 * every conn[r] is -1, m->err says why, and with heartbeats the store says which rank
 * failed (the first to), for the ranks still waiting on it. */
sumo_result sumo__tcp_meet(const sumo__tcp_meeting *m, int *conn);

#endif
