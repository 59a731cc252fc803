/*
 * The graphs of gossip rounds (sumo_gossip.h): who sends to whom in round k. The built-in
 * dynamic directed exponential graph is a set of offsets per round, the same for every rank
 * (so every round is p permutations: in- and out-degree equal); the caller's is a table.
 */
#ifndef SUMO_GOSSIP_GRAPH_H
#define SUMO_GOSSIP_GRAPH_H

#include "collectives/comm.h"
#include "sumo_gossip.h"

typedef struct sumo__gossip_graph {
    sumo_gossip_mode mode;
    int rank, size;
    int peers;      /* p, built in */
    int period;     /* rounds before the graph repeats */
    int *offsets;   /* built in: period rows of `stride` offsets in (0, n), ascending, then
                       -1 for the slots a duplicate left empty */
    int stride;     /* p, or 2 p for the symmetric mode's +- offsets */
    int rounds, max_out; /* the caller's */
    int *table;          /* the caller's, copied */
} sumo__gossip_graph;

/* Checks the options for n ranks and builds the graph; the message names what is wrong. */
sumo_result sumo__gossip_graph_init(sumo__gossip_graph *g, sumo_comm *comm,
                                    const sumo_gossip_options *o, int rank, int size);
void sumo__gossip_graph_free(sumo__gossip_graph *g);
/* A fingerprint of the graph every rank must share. */
uint64_t sumo__gossip_graph_hash(const sumo__gossip_graph *g);
/* Whether rank `from` sends to rank `to` (!= from) in round k. */
bool sumo__gossip_sends(const sumo__gossip_graph *g, uint64_t k, int from, int to);
/* Rank r's distinct out-peers in round k (symmetric: its neighbours). */
int sumo__gossip_out_degree(const sumo__gossip_graph *g, uint64_t k, int r);

#endif
