/* The gossip bases of the outer loop (diloco_gossip.c): SGP, OSGP and D-PSGD under it. */
#ifndef SUMO_DILOCO_GOSSIP_H
#define SUMO_DILOCO_GOSSIP_H

#include "collectives/collectives.h"
#include "sumo_diloco.h"

/* The base's state, kept in the loop's object: its rounds (NULL with one rank or
 * SUMO_BASE_LOCAL), and in the parameters' memory OSGP's numerator or D-PSGD's pre-step
 * parameters and step (gx_elems elements). */
typedef struct sumo__gossip_base {
    sumo_diloco_base base;
    struct sumo_gossip *gossip;
    size_t n, esz;
    sumo_dtype dtype;
    unsigned char *gx;
    size_t gx_elems;
    const sumo_kernel_table *gk;
} sumo__gossip_base;

/* Why options with a gossip base cannot run, or NULL. */
const char *sumo__diloco_gossip_check(const sumo_diloco_options *o);
/* Collective, after the loop's own agreement: the gossip object (none with one rank). */
sumo_result sumo__diloco_gossip_create(sumo__gossip_base *b, sumo_comm *comm,
                                       const sumo_diloco_options *o, size_t n, sumo_dtype dtype);
void sumo__diloco_gossip_free(sumo__gossip_base *b);
/* After the local step: the base's round on params; sync says the exact average follows (an
 * overlapped round then completes and none starts); anchor holds the parameters before the
 * first step. *communicated when a round ran. */
sumo_result sumo__diloco_gossip_step(sumo__gossip_base *b, const sumo__exec *x, void *params,
                                     const void *anchor, bool sync, bool *communicated);
/* After the outer step rewrote params: the base starts again from them. */
sumo_result sumo__diloco_gossip_synced(sumo__gossip_base *b, const sumo__exec *x,
                                       const void *params);
/* Its part of the loop's state: the numerator and the gossip state; a loaded numerator lives
 * in the memory of k. */
size_t sumo__diloco_gossip_state_size(const sumo__gossip_base *b);
sumo_result sumo__diloco_gossip_save(sumo__gossip_base *b, unsigned char *p);
sumo_result sumo__diloco_gossip_load(sumo__gossip_base *b, const unsigned char *p,
                                     const sumo_kernel_table *k);
/* Its memory beyond the parameters, in bytes: the numerator or pre-step parameters and step,
 * and the gossip object's share, receive and sum buffers (3 n). */
size_t sumo__diloco_gossip_extra(const sumo__gossip_base *b);
/* Its rounds and bytes, added to stats. */
void sumo__diloco_gossip_stats(const sumo__gossip_base *b, sumo_comm_stats *stats);

#endif
