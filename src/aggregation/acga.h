/*
 * ACGA as an object of its own (aggregation/acga.c; docs/design/acga.md): its options, its
 * momentum and its exchanges. It knows nothing of the aggregator that holds it
 * (aggregation/aggregator.c), so the dependency runs one way.
 */
#ifndef SUMO_ACGA_H
#define SUMO_ACGA_H

#include "sumo_aggregation.h"
#include "common/common.h"

typedef struct sumo__acga sumo__acga;

/* Validates the options (the message goes to comm's status) and allocates; local, no
 * communication (the aggregator agrees on the options afterwards). */
sumo_result sumo__acga_create(sumo_comm *comm, const sumo_acga_options *options,
                              const size_t *tensor_counts, size_t ntensors, sumo__acga **out);
void sumo__acga_destroy(sumo__acga *acga);

/* One step, with the communicator held (inside a composite call): every rank's sendbuf into
 * its recvbuf (sendbuf == recvbuf is in place; the caller checked everything else). stats
 * counts the exchanges. */
sumo_result sumo__acga_apply_held(sumo__acga *acga, const void *sendbuf, void *recvbuf,
                                  size_t count, sumo_dtype dtype, sumo_comm_stats *stats);

size_t sumo__acga_state_size(const sumo__acga *acga);
sumo_result sumo__acga_state_save(const sumo__acga *acga, void *buffer);
sumo_result sumo__acga_state_load(sumo__acga *acga, const void *buffer);

/* A fingerprint of the options and layout, equal on ranks configured alike. */
uint64_t sumo__acga_fingerprint(const sumo__acga *acga);

#endif
