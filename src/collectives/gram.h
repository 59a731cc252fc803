/*
 * Combines in Gram form (docs/design/adasum.md): a collective whose result, per tensor of a
 * layout, is sum_i w_i g_i with weights computed from that tensor's P x P Gram matrix
 * G_ij = <g_i, g_j>. Adasum's whole tree and ACGA's consensus weights are both of this shape,
 * so both cost two passes over the data and one small sum instead of a chain of exchanges.
 *
 * Shapes, picked by the caller (call->shape):
 *   direct (peers' buffers addressable): each rank reads its cache slice of every rank's input
 *     for the Gram partials, then writes its slice of the result into every rank's output;
 *   staged (processes of one node): the same through the staging areas every rank maps, in
 *     cache-sized chunks, twice (the inputs are staged once for the partials and once for the
 *     weighted sum, which is written back into every area and copied out);
 *   messages (any transport): an all-to-all of shards (the bytes of a reduce-scatter), the
 *     partials of this rank's shard, the weighted sum of the shard, a ring allgather: an
 *     allreduce's volume.
 * In both, the partials are summed by recursive doubling (the same bits on every rank), so
 * every rank computes the same weights; and inputs are only read until the weights are known,
 * so a weigh function that declines leaves every buffer as it was.
 */
#ifndef SUMO_GRAM_H
#define SUMO_GRAM_H

#include "collectives/agree.h"

/* The largest group the Gram form serves (the partials kernel's limit). */
#define SUMO__GRAM_MAX_RANKS 16

/*
 * From the summed Gram matrices of ntensors tensors (sumo__gram_len(P) doubles each, packed as
 * adasum_gram.h describes), the weights w[t * P + r] of rank r in tensor t. Returns false to
 * decline (the buffers stay untouched and the caller takes another path); it must decide from
 * the Gram bits alone, so every rank decides alike.
 */
typedef bool (*sumo__gram_weigh_fn)(void *ctx, const double *gram, size_t ntensors, double *w,
                                    void *work);

typedef enum sumo__gram_shape {
    SUMO__GRAM_MESSAGES = 0, /* any transport */
    SUMO__GRAM_DIRECT,       /* SUMO__REACH_DIRECT only */
    SUMO__GRAM_STAGED,       /* SUMO__REACH_STAGED only */
} sumo__gram_shape;

/* The shape for this handle: the transport's reach, unless the handle was told to use
 * point-to-point algorithms (sumo_comm_set_param). */
sumo__gram_shape sumo__gram_shape_for(const sumo_comm *c);

typedef struct sumo__gram_call {
    sumo_dtype dtype;
    size_t count;
    size_t ntensors;
    const size_t *offsets; /* ntensors + 1 */
    sumo__gram_weigh_fn weigh;
    void *ctx;
    size_t weigh_work_bytes; /* scratch the weigh function gets as work (64-byte aligned) */
    sumo__gram_shape shape;
    /* The caller ran sumo__gram_stage_ahead before its agreement (on every rank alike). */
    bool staged_ahead;
} sumo__gram_call;

/*
 * Small staged calls (one chunk, a few KiB): the caller may copy its input into its staging
 * area before the agreement (as the staged sum does), and then every rank computes every
 * rank's Gram partials itself from the areas, summed in the order of the recursive doubling
 * that sums them otherwise (the same bits), and its whole output from the areas: one barrier
 * after the agreement instead of four and the partials' exchange. Returns whether the copy
 * was made (flags: this rank's SUMO__DESC_ flags; a shared buffer is not copied, and a call
 * in which some rank did not copy takes the ordinary staged path).
 */
bool sumo__gram_small(const sumo_comm *c, const sumo__gram_call *call);
sumo_result sumo__gram_stage_ahead(sumo_comm *c, const sumo__gram_call *call, uint32_t flags,
                                   const void *sendbuf);

/* Scratch bytes sumo__gram_run needs: host metadata (at its scratch argument, 64-byte
 * aligned), and data in the memory of the call's buffers (its data argument). */
size_t sumo__gram_scratch_bytes(const sumo_comm *c, const sumo__gram_call *call);
size_t sumo__gram_data_bytes(const sumo_comm *c, const sumo__gram_call *call);

/*
 * Runs the combine after an agreement whose announcements (all) carry every rank's send and
 * receive buffers; *applied says whether the weights were applied (false: declined, and the
 * receive buffer holds nothing or a copy of the send buffer). P must be <=
 * SUMO__GRAM_MAX_RANKS. Data goes through the handle's current kernels (comm->x).
 */
sumo_result sumo__gram_run(sumo_comm *c, const sumo__call_desc *all, const void *sendbuf,
                           void *recvbuf, const sumo__gram_call *call, void *scratch, void *data,
                           bool *applied);

/* The combine as a collective of its own (SUMO__CALL_GRAM), after sumo__execute's validation:
 * scratch, the agreement (d carries the layout hash), the run. */
sumo_result sumo__gram_collective(sumo_comm *c, sumo__call_desc *d, const void *sendbuf,
                                  void *recvbuf, const sumo__gram_call *call, bool *applied);

#endif
