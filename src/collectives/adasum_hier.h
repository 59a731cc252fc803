/*
 * Adasum over groups of a two-level communicator's device memory (collectives/adasum.c calls
 * it for an op created with hierarchical = 1): the node's average on every rank (the node
 * level's algorithm), then each local rank combines, across the nodes, a contiguous share of
 * the layout's whole tensors (the layout cut into L nearly equal runs of elements) with an
 * Adasum op on its across communicator, and the node shares the results. The cut here and
 * the across ops (adasum.c) live in the op: the only layout cache.
 */
#ifndef SUMO_ADASUM_HIER_H
#define SUMO_ADASUM_HIER_H

#include "collectives/agree.h"

typedef struct sumo__adasum_hier sumo__adasum_hier;

/*
 * The two-level communicator's part of an Adasum call's checks, before the agreement (host
 * memory runs adasum.c's algorithm over the composed transport): refuses in d->local_error
 * what needs options.any where there is none (a flat op; groups of g ranks, not a power of
 * two, that combine across nodes) and clears *gram there (the Gram form runs over options.any).
 * g: the op's group size, ngroups the groups.
 */
void sumo__adasum_hier_check(sumo_comm *c, sumo__call_desc *d, int g, int ngroups, bool *gram);

/* Device memory: the layout's cut (made, or kept in *cache from an earlier call), and this
 * rank's share of it: tensors [*first, *first + *n) of *counts (ntensors 0: one tensor of
 * count). A failure is recorded (SUMO_ERR_SYSTEM). */
sumo_result sumo__adasum_hier_cut(sumo_comm *c, sumo__adasum_hier **cache, const size_t *offsets,
                                  size_t ntensors, size_t count, const size_t **counts,
                                  size_t *first, size_t *n);

/* Agrees on d (its aux the op's hash) over the parent, then combines; op: this rank's share's
 * Adasum op on the across communicator of the call's memory (has_op false: no share). */
sumo_result sumo__adasum_hier_allreduce(sumo_comm *c, sumo__call_desc *d,
                                        const sumo__adasum_hier *cut, bool has_op, sumo_op op,
                                        const void *sendbuf, void *recvbuf);
/* NULL is fine. */
void sumo__adasum_hier_free(sumo__adasum_hier *h);

#endif
