/*
 * The composed transport of a two-level communicator (collectives/comm_hier.c): the node's
 * transport (ranks of one node), the across transports (this local rank's on every node) and,
 * optionally, a transport of all ranks (`any`). Rank h * L + l is local rank l of node h.
 *
 * sendrecv routes each pair by where the peer is: on this node over the node transport, at this
 * local rank of another node over the first across transport, anywhere else over `any` (a rank
 * pair none of them reaches is an internal error: the two-level algorithms never pair so).
 * In flat mode (sumo__hier_tp_flat) every message goes over `any`, so an algorithm written for
 * one flat group (ring, all-to-all) runs unchanged. announce: the node's announce, then an
 * allgather of the node's records across (log2 H exchanges), so every rank reads every rank's
 * exact record. barrier: the node's, then the across one. abort reaches every transport.
 *
 * The children are borrowed: destroy frees only the composition.
 */
#ifndef SUMO_TRANSPORT_HIER_H
#define SUMO_TRANSPORT_HIER_H

#include "transport/transport.h"

/* Across transports a composition holds at most (one per memory that crosses the nodes). */
#define SUMO__HIER_MAX_ACROSS 4

typedef struct sumo__hier_links {
    sumo__transport *node;
    sumo__transport *across; /* the first across transport (host memory) */
    sumo__transport *any;    /* NULL: none */
    int L, l, H, h;
} sumo__hier_links;

sumo_result sumo__hier_tp_create(const sumo__hier_links *links, sumo__transport **out);
/* A further across transport (one that carries another memory); the caller checked its shape. */
sumo_result sumo__hier_tp_add_across(sumo__transport *tp, sumo__transport *across);
/* Drops the last one added (an add_across that failed after). */
void sumo__hier_tp_drop_across(sumo__transport *tp);
/* Flat mode on or off: every sendrecv over `any` (without one, the levels route as ever). */
void sumo__hier_tp_flat(sumo__transport *tp, bool flat);
/* The transport that carries rank `peer`'s messages in level mode, with the peer's rank on it,
 * or NULL when no transport reaches it. */
sumo__transport *sumo__hier_tp_route(sumo__transport *tp, int peer, int *peer_rank);

#endif
