/*
 * Gossip: push-sum rounds over a directed graph (Kempe et al. 2003; Stochastic Gradient Push,
 * Assran et al. 2019), and the symmetric mixing of D-PSGD (Lian et al. 2017), as a collective
 * object over a communicator. Every round goes through the communicator's one path (it is
 * agreed like any collective, queued behind asynchronous requests, and moves its bytes with
 * the transport's point-to-point exchange), so it runs on every transport.
 *
 * Push-sum: every rank keeps a numerator x (count elements of dtype, the caller's buffer) and
 * a weight w (double, kept here, 1 at create). In a round, a rank with d distinct out-peers
 * keeps x / (d + 1) and w / (d + 1) and sends the same share to each out-peer; what it
 * receives is added. The de-biased value z = x / w is the estimate of the mean; on a regular
 * graph (every rank's in-degree equal to its out-degree, as on the built-in graph) w stays 1.
 *
 * The graph, round k (counted from 0 over the object's life; every rank at the same k):
 *   built in: the dynamic directed exponential graph. With p peers a round and
 *     K = floor(log_{p+1}(n - 1)), round k uses i = k mod (K + 1) and rank r sends to
 *     (r + j (p + 1)^i) mod n, j = 1 .. p (duplicates and r itself dropped), and receives
 *     from the mirror ranks. p = 1: r + 2^i, a period of floor(log2(n - 1)) + 1 rounds.
 *   the caller's: `rounds` rounds, round k mod rounds; out_peers[(k n + r) max_out + j] is
 *     the j-th out-peer of rank r (-1 for none). Every rank passes the same table.
 * Symmetric (mode SUMO_GOSSIP_SYMMETRIC, the built-in graph only): rank r averages x with its
 * neighbours r +- j (p + 1)^i (distinct, not r), x = (x + sum x_neighbour) / (m + 1): a
 * doubly stochastic, symmetric mixing (D-PSGD); w is not used and stays 1.
 *
 * Overlapped rounds (OSGP): sumo_gossip_start keeps this rank's share in x and sends the
 * others' shares in the background; sumo_gossip_finish adds what arrived into x (and w).
 * Between them the caller may change x (local steps on the numerator). sumo_gossip_overlap is
 * one step of OSGP with the staleness bound s (options.staleness): a round started at one call
 * completes at the s-th call after it, which then starts the next one; every rank therefore
 * runs at most s calls on a round in flight, and every rank's result is the same whatever the
 * timing.
 *
 * Per node (per_node = 1, on a two-level communicator, sumo_comm_create_hier: H nodes of L
 * ranks; fairscale's nprocs_per_node): every round first averages x over the node's ranks (an
 * allreduce on the node level, the same bits on each of them), then the H nodes gossip as the
 * ranks above would: the graph is over the nodes, and local rank l of node h exchanges with
 * local rank l of node h's peers, over the across level. Every rank of a node so holds the same
 * x and w after each round. The caller's graph, if any, is over the H nodes. Needs H >= 2.
 * Without per_node a two-level communicator gossips over its options.any (refused without).
 *
 * Failures: a rank whose options, graph, count or dtype differ, or that is at another round,
 * gets SUMO_ERR_MISMATCH on every rank, the message naming the rank and what; a peer lost
 * mid-round ends the round with SUMO_ERR_PEER_FAILURE or SUMO_ERR_TIMEOUT and the
 * communicator's message (sumo_comm_error_message).
 */
#ifndef SUMO_GOSSIP_H
#define SUMO_GOSSIP_H

#include "sumo.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum sumo_gossip_mode {
    SUMO_GOSSIP_PUSH_SUM = 0,  /* SGP's and OSGP's mixing: column stochastic, numerator and w */
    SUMO_GOSSIP_SYMMETRIC = 1, /* D-PSGD's: symmetric, doubly stochastic; blocking rounds only */
} sumo_gossip_mode;

typedef struct sumo_gossip_options {
    size_t struct_size;   /* sizeof(sumo_gossip_options); sumo_gossip_options_default sets it */
    sumo_gossip_mode mode;
    int peers;            /* p in [1, n - 1]: out-peers a round on the built-in graph (1) */
    int rounds;           /* 0: the built-in graph; > 0: the caller's, of this period */
    int max_out;          /* the caller's graph: out-peer slots per rank and round, >= 1 */
    const int *out_peers; /* the caller's graph (above), copied at create */
    int staleness;        /* s >= 1: sumo_gossip_overlap's bound (1: OSGP's one step) */
    int per_node;         /* 1: the nodes gossip, not the ranks (below; 0) */
} sumo_gossip_options;

SUMO_API sumo_result sumo_gossip_options_default(sumo_gossip_options *options);

typedef struct sumo_gossip sumo_gossip;

/* Collective over comm (at least 2 ranks): options that are invalid on any rank fail on every
 * rank (the message names the option), options that differ give SUMO_ERR_MISMATCH. */
SUMO_API sumo_result sumo_gossip_create(sumo_comm *comm, size_t count, sumo_dtype dtype,
                                        const sumo_gossip_options *options, sumo_gossip **out);
/* Waits for a round in flight (its result is dropped), then frees. NULL is fine. */
SUMO_API sumo_result sumo_gossip_destroy(sumo_gossip *gossip);

/* One round on x, blocking. */
SUMO_API sumo_result sumo_gossip_round(sumo_gossip *gossip, void *x);
/* One round, overlapped: start keeps this rank's share in x and sends the rest; finish waits
 * and adds what arrived. x must be the same buffer for both. SUMO_ERR_INVALID_USAGE for a
 * second start before finish, a finish with nothing in flight, or the symmetric mode. */
SUMO_API sumo_result sumo_gossip_start(sumo_gossip *gossip, void *x);
SUMO_API sumo_result sumo_gossip_finish(sumo_gossip *gossip, void *x);
/* One OSGP step (above): *communicated is 1 when this call completed or started a round. */
SUMO_API sumo_result sumo_gossip_overlap(sumo_gossip *gossip, void *x, int *communicated);

/* w, and whether a round is in flight. */
SUMO_API sumo_result sumo_gossip_weight(const sumo_gossip *gossip, double *weight);
SUMO_API sumo_result sumo_gossip_in_flight(const sumo_gossip *gossip, int *in_flight);
/* Rounds started so far (the next round's k). */
SUMO_API sumo_result sumo_gossip_round_index(const sumo_gossip *gossip, uint64_t *round);
/* This rank's distinct out-peers in round k (at most max of them into peers, all counted). */
SUMO_API sumo_result sumo_gossip_out_peers(const sumo_gossip *gossip, uint64_t round,
                                           int *peers, int max, int *count);

/*
 * The state: w, the round counter, the overlap's position and a round in flight (save waits
 * for it and keeps what arrived, to be added at the step it is due: a run resumed from the
 * state equals the one that never stopped). Load refuses a state of another count, dtype,
 * graph or rank. The numerator is the caller's.
 */
SUMO_API sumo_result sumo_gossip_state_size(const sumo_gossip *gossip, size_t *bytes);
SUMO_API sumo_result sumo_gossip_state_save(sumo_gossip *gossip, void *buffer, size_t bytes);
SUMO_API sumo_result sumo_gossip_state_load(sumo_gossip *gossip, const void *buffer,
                                            size_t bytes);

/* Rounds and bytes this rank sent. */
SUMO_API sumo_result sumo_gossip_stats(const sumo_gossip *gossip, sumo_comm_stats *stats);

#ifdef __cplusplus
}
#endif

#endif
