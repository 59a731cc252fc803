/*
 * sumo distributed optimizer: one step of data-parallel training, from each rank's local
 * gradient to parameters that are identical on every rank. It composes a base optimizer
 * (sumo_optim.h) with an aggregator (sumo_aggregation.h) or the outer loop (sumo_diloco.h) in
 * one of three ways:
 *
 *   GRADIENT  combine the gradients, then every rank takes the same optimizer step
 *             (sum, average, Adasum or ACGA on gradients);
 *   DELTA     every rank takes a local optimizer step on its own gradient, the parameter
 *             deltas are combined (Horovod's Adasum mode, sumo_delta.h), and the combined
 *             delta is added to the parameters saved before the step; optimizer state stays
 *             local;
 *   OUTER     every rank takes local steps, and the outer loop synchronises them: SlowMo,
 *             Local SGD and BMUF (Wang et al., ICLR 2020), DiLoCo and Streaming DiLoCo, as
 *             presets of sumo_diloco_options.
 *
 * The training loop calls sumo_distributed_step once per step whatever the mode, so a new
 * method slots in without touching the loop.
 */
#ifndef SUMO_DISTRIBUTED_H
#define SUMO_DISTRIBUTED_H

#include "sumo.h"
#include "sumo_aggregation.h"
#include "sumo_diloco.h"
#include "sumo_optim.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum sumo_update_mode {
    SUMO_UPDATE_GRADIENT = 0,
    SUMO_UPDATE_DELTA = 1,
    SUMO_UPDATE_OUTER = 2,
    SUMO_UPDATE_MODE_COUNT
} sumo_update_mode;

/* What OUTER does to the base optimizer's buffers (momentum, Adam moments) after each outer
 * step. SlowMo's paper resets Nesterov-SGD's and keeps Adam's; fairscale keeps. */
typedef enum sumo_buffer_policy {
    SUMO_BUFFERS_KEEP = 0,
    SUMO_BUFFERS_RESET = 1,
    SUMO_BUFFERS_AVERAGE = 2,
} sumo_buffer_policy;

typedef struct sumo_distributed_options {
    size_t struct_size;         /* sizeof(sumo_distributed_options); the default sets it */
    sumo_update_mode mode;
    /* OUTER only: the outer loop (the default: SlowMo's preset). Its fragments are cut from
     * the base optimizer's tensor layout; fragment_of, if any, is copied at create. */
    sumo_diloco_options outer;
    sumo_buffer_policy buffers; /* OUTER only */
} sumo_distributed_options;

/* mode with SlowMo's preset for outer and SUMO_BUFFERS_KEEP. */
SUMO_API sumo_result sumo_distributed_options_default(sumo_update_mode mode,
                                             sumo_distributed_options *options);

typedef struct sumo_distributed sumo_distributed;

/*
 * comm, optimizer and aggregator are borrowed and must outlive the handle. aggregator is used
 * by GRADIENT and DELTA and may be NULL for OUTER (whose combine the outer options name).
 * nparams is the parameter count (the optimizer's n). For OUTER this is collective over comm
 * (sumo_diloco_create): ranks whose options differ all get SUMO_ERR_MISMATCH, and invalid
 * options on any rank give SUMO_ERR_INVALID_ARGUMENT on every rank.
 */
SUMO_API sumo_result sumo_distributed_create(sumo_comm *comm, sumo_optimizer *optimizer,
                                    sumo_aggregator *aggregator, size_t nparams,
                                    const sumo_distributed_options *options,
                                    sumo_distributed **out);
SUMO_API sumo_result sumo_distributed_destroy(sumo_distributed *dist);

/*
 * One training step: params (identical on every rank before the first step) are updated from
 * this rank's grads (which may be overwritten) with learning rate lr. Afterwards params are
 * bit-identical on every rank, except between the outer loop's synchronisations, where each
 * rank holds its own local parameters. *communicated (may be NULL) is set to 1 when this step
 * communicated. SUMO_ERR_NONFINITE, on every rank alike, says the combined update held NaN or
 * Inf (Adasum and ACGA name the tensor in the communicator's error message; the outer step's
 * anchor went non-finite): training has diverged. In GRADIENT and
 * DELTA modes a failed step leaves params as they were on every rank (in DELTA mode the
 * local optimizer state of ranks whose own step succeeded has advanced); in DELTA mode a rank
 * whose local optimizer step fails (it refuses a NaN gradient) returns that error, and it
 * still takes part in the exchange so its peers get SUMO_ERR_NONFINITE instead of waiting
 * out the deadline. OUTER runs the base optimizer's step inside the outer loop; one the base
 * optimizer refuses changes nothing and is not counted. The heavy-ball outer step refuses a
 * synchronisation at lr 0 (it divides by the rate) with SUMO_ERR_INVALID_ARGUMENT.
 */
SUMO_API sumo_result sumo_distributed_step(sumo_distributed *dist, float *params, float *grads, double lr,
                                  int *communicated);

/* True (1) when every rank holds the same parameters after the last step. */
SUMO_API sumo_result sumo_distributed_synchronized(const sumo_distributed *dist, int *synchronized);

/* State across steps (the outer loop's, sumo_diloco_state_save; nothing else), for
 * checkpoints. The optimizer and aggregator save their own. */
SUMO_API sumo_result sumo_distributed_state_size(const sumo_distributed *dist, size_t *bytes);
SUMO_API sumo_result sumo_distributed_state_save(sumo_distributed *dist, void *buffer, size_t bytes);
SUMO_API sumo_result sumo_distributed_state_load(sumo_distributed *dist, const void *buffer, size_t bytes);

/* Communication so far (including the aggregator's and the outer loop's): collective calls
 * and bytes per rank. */
SUMO_API sumo_result sumo_distributed_stats(const sumo_distributed *dist, sumo_comm_stats *stats);

/* Extra memory this rank holds beyond the base optimizer, in bytes (DELTA's saved parameters,
 * the outer loop's state). */
SUMO_API sumo_result sumo_distributed_extra_memory(const sumo_distributed *dist, size_t *bytes);

#ifdef __cplusplus
}
#endif

#endif
