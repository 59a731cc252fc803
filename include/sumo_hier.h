/*
 * The allreduce over two levels of communicators: each node's ranks (`node`: L ranks, the
 * same L on every node, where sumo's shared-memory algorithms read the peers' buffers, CUDA
 * IPC for device memory) and, for local rank l, the ranks of local rank l on every node
 * (`across`: H ranks, in node order, over whatever carries the memory between nodes: NCCL for
 * device buffers, TCP or MPI for the host's). Every local rank has its own across
 * communicator, so the L links of a node carry its traffic side by side, as Horovod's
 * hierarchical allreduce does. Rank h * L + l of the job is local rank l of node h.
 *
 * What it computes (every rank ends with the same bits):
 *   SUM:     each node sums its ranks in rank order (sumo.h: in the accumulation type,
 *            rounded once to the dtype), then the nodes' sums are summed in node order.
 *   AVERAGE: the same with each level divided by its size before it rounds (the node's
 *            average of its L ranks, then the average of the H nodes' averages): for fp16 and
 *            bf16 this rounds twice where one communicator of H * L ranks rounds once.
 *   Adasum:  sumo_adasum_options' hierarchical form with a group per node: Adasum's tree
 *            (sumo.h) over the H nodes' averages, per tensor of the layout. Each local rank
 *            combines across the nodes a contiguous share of the layout's whole tensors (the
 *            layout cut into L nearly equal runs of bytes), and the node then shares them.
 * Sum and average move each element across the nodes once per node (a reduce-scatter inside
 * the node, an allreduce of one L-th of the buffer per across communicator, an allgather
 * inside the node); the n mod L trailing elements are reduced whole by every local rank.
 *
 * Collective over all H * L ranks, each calling with its own node and across handles (which
 * it keeps, and destroys after this one). A rank whose node or across peers disagree with it
 * on L, H or which node and local rank they are fails with SUMO_ERR_MISMATCH at create; peers
 * beyond its node then fail at their deadline. A failure inside a call breaks the
 * communicator it happened on (sumo_hier_error_message says which, and why); the handle is
 * then unusable. Calls on one handle are serialised.
 *
 * Buffers: any memory both communicators take (sumo_comm_add_cuda for device buffers), with
 * sumo_cuda.h's ordering rule: what was queued on `stream` for sendbuf must be complete
 * before the call (its node peers read it from their own processes).
 */
#ifndef SUMO_HIER_H
#define SUMO_HIER_H

#include "sumo.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sumo_hier sumo_hier;

/* Checks that every rank of node and across agrees on L, H, its node and its local rank. */
SUMO_API sumo_result sumo_hier_create(sumo_comm *node, sumo_comm *across, sumo_hier **out);
/* NULL is fine. The communicators are left to their owner. */
SUMO_API sumo_result sumo_hier_destroy(sumo_hier *hier);

/*
 * count elements of dtype from sendbuf into recvbuf (the same pointer: in place) on every
 * rank. op: SUMO_OP_SUM, SUMO_OP_AVERAGE or SUMO_OP_ADASUM, which takes the layout
 * tensor_counts[0 .. ntensors) (elements per tensor, summing to count; NULL and 0: one
 * tensor). `stream`: the execution context of the kernels (a cudaStream_t; NULL on the host).
 */
SUMO_API sumo_result sumo_hier_allreduce(const void *sendbuf, void *recvbuf, size_t count,
                                         sumo_dtype dtype, sumo_op op,
                                         const size_t *tensor_counts, size_t ntensors,
                                         void *stream, sumo_hier *hier);

/* Why the last call failed (never NULL; "" after success), valid until the next call. */
SUMO_API sumo_result sumo_hier_error_message(const sumo_hier *hier, const char **message);

#ifdef __cplusplus
}
#endif

#endif
