/*
 * Agreement: how every collective begins and ends, in one place.
 *
 * Each rank announces what it is about to do (collective, count, dtype, op, root, a layout
 * hash) and whether its own arguments were valid; every rank compares all announcements and
 * all fail together, with the same verdict, before any data moves. The transport's announce is
 * double-buffered, so the announcements of one collective stay readable until every rank has
 * announced the next one: a collective needs no trailing barrier to protect them, only the
 * synchronisation its own data needs.
 */
#ifndef SUMO_AGREE_H
#define SUMO_AGREE_H

#include "collectives/comm.h"

enum sumo__call_kind {
    SUMO__CALL_ALLREDUCE = 1,
    SUMO__CALL_ALLGATHER,
    SUMO__CALL_BROADCAST,
    SUMO__CALL_BARRIER,
    SUMO__CALL_SETUP, /* a layer above checks that every rank set up alike (sumo__agree_setup) */
    SUMO__CALL_MEM_ALLOC,
    SUMO__CALL_MEM_FREE, /* aux: the allocation's serial number, equal on every rank */
    SUMO__CALL_REDUCE_SCATTER,
    SUMO__CALL_GRAM, /* a combine in Gram form for a layer above (ACGA); aux: its layout hash */
    SUMO__CALL_FAIL, /* sumo_comm_fail: only local_error matters */
    SUMO__CALL_COMPOSITE, /* never announced: a layer above's operation made of collectives */
    SUMO__CALL_COMPRESSED, /* sumo_allreduce_compressed; aux: its format and block size */
    SUMO__CALL_JOIN, /* a rank inside sumo_join (collectives/join.c); aux: its join round */
    SUMO__CALL_GOSSIP, /* a gossip round (collectives/gossip.c); its graph and round compared
                          there */
};

/* The kind's name as messages give it ("allreduce", "allreduce_compressed", ...). */
const char *sumo__call_kind_name(uint32_t kind);

/* What every rank announces; at most SUMO__ANNOUNCE_BYTES. */
struct sumo__call_desc {
    uint32_t kind;
    uint32_t dtype;
    uint32_t op;
    int32_t root;
    uint64_t count;
    uint32_t local_error; /* a sumo_result: this rank's own arguments were invalid */
    uint32_t flags;       /* SUMO__DESC_*: facts about this rank's buffers, not compared */
    uint64_t sendptr;
    uint64_t recvptr;
    uint64_t aux; /* collective-specific, must be equal on every rank: a layout hash */
    uint32_t memory; /* the buffers' kernel memory (a hash of its name), equal on every rank */
};

/* This rank's send and receive buffers are reachable by every peer: any buffer on a
 * SUMO__REACH_DIRECT transport, memory from sumo_mem_alloc on a staged one, or memory its
 * kernel table shared with the other processes (collectives/imports.h). */
#define SUMO__DESC_SHARED 1u
/* This rank's receive buffer is reachable by every peer, whatever its send buffer is: an
 * allreduce may then copy the inputs into the outputs and reduce there (no staging areas). */
#define SUMO__DESC_RECV_SHARED 2u

/* SUMO__DESC_SHARED when the peers reach the buffers this rank passes (sendbuf NULL: none to
 * send), with SUMO__DESC_RECV_SHARED when they reach its receive buffer. Buffers a kernel table
 * shares between processes (sumo__call_imports) are exported here, their handles published on
 * this rank's board (collectives/imports.h): call it before the agreement, once per call.
 * Such a call is refused by the agreement unless every rank shared its buffers. */
uint32_t sumo__shared_flag(sumo_comm *c, const void *sendbuf, size_t send_bytes,
                           const void *recvbuf, size_t recv_bytes);

/* Rank k's send (recv false) or receive buffer, as announced in all, as this rank's kernels
 * reach it, in *out: the transport's peer_buffer, or the peer's allocation opened here where
 * the call's kernel table shares its memory between processes (collectives/imports.h). Only
 * after an agreement where every rank announced shared buffers; a failure breaks the handle. */
sumo_result sumo__peer_buffer(sumo_comm *c, const sumo__call_desc *all, int k, bool recv,
                              void **out);

/* Whether every rank announced shared buffers: the call may then run direct. */
bool sumo__all_shared(const sumo_comm *c, const sumo__call_desc *all);

/* Whether every rank announced a shared receive buffer. */
bool sumo__all_recv_shared(const sumo_comm *c, const sumo__call_desc *all);

/*
 * Every rank announces d and compares all announcements: returns on every rank the first
 * rank's local_error when any rank had one, SUMO_ERR_MISMATCH when they differ, before any
 * data moves; the communicator's message says which rank and what. On success *all (when not
 * NULL) holds every rank's announcement until the next agreement.
 */
sumo_result sumo__agree(sumo_comm *c, sumo__call_desc *d, const sumo__call_desc **all);

/* sumo__agree with the messages naming `what` (a layer above's set-up) instead of the kind. */
sumo_result sumo__agree_named(sumo_comm *c, sumo__call_desc *d, const sumo__call_desc **all,
                              const char *what);

/*
 * Ranks that have joined (sumo_join) announce SUMO__CALL_JOIN in place of the collective their
 * peers run. Every rank then reaches one verdict from the announcements: the others' call
 * runs when it is an allreduce with sum or average (a second agreement follows, in which the
 * joined ranks announce that allreduce over zeros of their own) or a barrier (the first
 * agreement was all of it); any other call fails on every rank with SUMO_ERR_INVALID_USAGE,
 * the handle usable. sumo__agree does this for the ranks that run the call; a joined rank
 * announces d (SUMO__CALL_JOIN) through sumo__agree_join, which gives in *active the lowest
 * rank that runs a call (what it announced is the call: (*all)[*active]), or -1 once every
 * rank has joined.
 */
sumo_result sumo__agree_join(sumo_comm *c, sumo__call_desc *d, const sumo__call_desc **all,
                             int *active);

/* The memory's name as the ranks compare it (sumo__call_desc.memory). */
uint32_t sumo__memory_id(const sumo_kernel_table *k);

/* Whether the handle can still run collectives (not broken by an earlier failure). */
sumo_result sumo__usable(sumo_comm *c);

#endif
