/*
 * The agreement step every collective starts with (collectives.c), shared with collectives
 * that live in their own file (adasum.c) so that they fail together on the same checks.
 */
#ifndef SUMO_AGREE_H
#define SUMO_AGREE_H

#include "collectives/comm.h"

enum sumo__call_kind {
    SUMO__CALL_ALLREDUCE = 1,
    SUMO__CALL_ALLGATHER,
    SUMO__CALL_BROADCAST,
    SUMO__CALL_BARRIER,
};

/* What every rank announces; also carried by allgather_small on transports without shm, so it
 * must stay within 64 bytes. */
typedef struct sumo__call_desc {
    uint32_t kind;
    uint32_t dtype;
    uint32_t op;
    int32_t root;
    uint64_t count;
    uint32_t local_error; /* a sumo_result: this rank's own arguments were invalid */
    uint32_t pad;
    uint64_t sendptr;
    uint64_t recvptr;
    uint64_t aux; /* collective-specific, must be equal on every rank: a layout hash */
} sumo__call_desc;

/*
 * Every rank announces d and compares all announcements: returns on every rank the first
 * rank's local_error when any rank had one, SUMO_ERR_MISMATCH when they differ, before any
 * data moves. On shared memory the caller must pass at least one more barrier (or depend on
 * data sent by every rank after this returned) before its next agreement.
 */
sumo_result sumo__agree(sumo_comm *c, sumo__call_desc *d);

/*
 * For the layers above: this rank failed (code, with the message already set on the
 * transport) where its peers are entering a collective. Announcing the failure in their
 * agreement step makes every rank return at once (with code, naming this rank) instead of
 * waiting out the deadline; no data moves. Returns code on this rank.
 */
sumo_result sumo__fail_together(sumo_comm *c, sumo_result code);

#endif
