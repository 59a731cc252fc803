/*
 * sumo distributed optimizer: one step of data-parallel training, from each rank's local
 * gradient to parameters that are identical on every rank. It composes a base optimizer
 * (sumo_optim.h) with an aggregator (sumo_aggregation.h) in one of three ways:
 *
 *   GRADIENT  combine the gradients, then every rank takes the same optimizer step
 *             (sum, average, Adasum or ACGA on gradients);
 *   DELTA     every rank takes a local optimizer step on its own gradient, the parameter
 *             deltas are combined (Horovod's Adasum mode), and the combined delta is added to
 *             the parameters saved before the step; optimizer state stays local;
 *   SLOWMO    every rank takes tau local steps (optionally averaging parameters every
 *             inner_period steps), then parameters are averaged exactly and a slow momentum
 *             step is applied (Wang et al., ICLR 2020); Local SGD and BMUF are presets.
 *
 * The training loop calls sumo_distributed_step once per step whatever the mode, so a new
 * method slots in without touching the loop.
 */
#ifndef SUMO_DISTRIBUTED_H
#define SUMO_DISTRIBUTED_H

#include "sumo.h"
#include "sumo_aggregation.h"
#include "sumo_optim.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum sumo_update_mode {
    SUMO_UPDATE_GRADIENT = 0,
    SUMO_UPDATE_DELTA = 1,
    SUMO_UPDATE_SLOWMO = 2,
    SUMO_UPDATE_MODE_COUNT
} sumo_update_mode;

/* What SlowMo does to the base optimizer's buffers (momentum, Adam moments) at each outer
 * step. The paper resets Nesterov-SGD's and keeps Adam's; fairscale keeps. */
typedef enum sumo_buffer_policy {
    SUMO_BUFFERS_KEEP = 0,
    SUMO_BUFFERS_RESET = 1,
    SUMO_BUFFERS_AVERAGE = 2,
} sumo_buffer_policy;

typedef struct sumo_slowmo_options {
    size_t struct_size;     /* sizeof(sumo_slowmo_options); the presets set it */
    int tau;                /* local steps per outer step, >= 1 (1: AR-SGD with slow momentum) */
    int inner_period;       /* average parameters every inner_period local steps; 0: never.
                               tau must be a multiple of it */
    double alpha;           /* slow learning rate, > 0 (1.0 in every experiment of the paper) */
    double beta;            /* slow momentum in [0, 1) */
    sumo_buffer_policy buffers;
    int memory_efficient;   /* 1: shard the slow buffer and anchor over ranks (1/N memory) */
} sumo_slowmo_options;

typedef enum sumo_slowmo_preset {
    SUMO_SLOWMO_PRESET_SLOWMO = 0,   /* tau 12, alpha 1, beta 0.5 */
    SUMO_SLOWMO_PRESET_LOCALSGD = 1, /* tau 12, alpha 1, beta 0 */
    SUMO_SLOWMO_PRESET_BMUF = 2,     /* tau 12, alpha 1, beta 0.5, no inner averaging */
} sumo_slowmo_preset;

SUMO_API sumo_result sumo_slowmo_options_preset(sumo_slowmo_preset preset, sumo_slowmo_options *options);

typedef struct sumo_distributed_options {
    size_t struct_size;         /* sizeof(sumo_distributed_options); the default sets it */
    sumo_update_mode mode;
    sumo_slowmo_options slowmo; /* SLOWMO only (the default: SlowMo's preset) */
} sumo_distributed_options;

/* mode with SlowMo's preset for slowmo. */
SUMO_API sumo_result sumo_distributed_options_default(sumo_update_mode mode,
                                             sumo_distributed_options *options);

typedef struct sumo_distributed sumo_distributed;

/*
 * comm, optimizer and aggregator are borrowed and must outlive the handle. aggregator is used
 * by GRADIENT and DELTA and may be NULL for SLOWMO (which averages exactly). nparams is the
 * parameter count (the optimizer's n). For SLOWMO this is collective over comm: ranks whose
 * SlowMo options differ all get SUMO_ERR_MISMATCH, and invalid options on any rank give
 * SUMO_ERR_INVALID_ARGUMENT on every rank.
 */
SUMO_API sumo_result sumo_distributed_create(sumo_comm *comm, sumo_optimizer *optimizer,
                                    sumo_aggregator *aggregator, size_t nparams,
                                    const sumo_distributed_options *options,
                                    sumo_distributed **out);
SUMO_API sumo_result sumo_distributed_destroy(sumo_distributed *dist);

/*
 * One training step: params (identical on every rank before the first step) are updated from
 * this rank's grads (which may be overwritten) with learning rate lr. Afterwards params are
 * bit-identical on every rank, except inside a SlowMo outer iteration, where each rank holds
 * its own local parameters until the next exact average. *communicated (may be NULL) is set
 * to 1 when this step communicated. SUMO_ERR_NONFINITE, on every rank alike, says the
 * combined update held NaN or Inf (Adasum and ACGA name the tensor in the communicator's
 * error message; SlowMo's average went non-finite): training has diverged. In GRADIENT and
 * DELTA modes a failed step leaves params as they were on every rank (in DELTA mode the
 * local optimizer state of ranks whose own step succeeded has advanced); in DELTA mode a rank
 * whose local optimizer step fails (it refuses a NaN gradient) returns that error, and it
 * still takes part in the exchange so its peers get SUMO_ERR_NONFINITE instead of waiting
 * out the deadline. SlowMo refuses an outer step at lr 0 (its update divides by the rate)
 * with SUMO_ERR_INVALID_ARGUMENT.
 */
SUMO_API sumo_result sumo_distributed_step(sumo_distributed *dist, float *params, float *grads, double lr,
                                  int *communicated);

/* True (1) when every rank holds the same parameters after the last step. */
SUMO_API sumo_result sumo_distributed_synchronized(const sumo_distributed *dist, int *synchronized);

/* State across steps (SlowMo's slow buffer, anchor, step counter; nothing else), for
 * checkpoints. The optimizer and aggregator save their own. */
SUMO_API sumo_result sumo_distributed_state_size(const sumo_distributed *dist, size_t *bytes);
SUMO_API sumo_result sumo_distributed_state_save(const sumo_distributed *dist, void *buffer, size_t bytes);
SUMO_API sumo_result sumo_distributed_state_load(sumo_distributed *dist, const void *buffer, size_t bytes);

/* Communication so far (including the aggregator's): collective calls and bytes per rank. */
SUMO_API sumo_result sumo_distributed_stats(const sumo_distributed *dist, sumo_comm_stats *stats);

/* Extra memory this rank holds beyond the base optimizer, in bytes (SlowMo's buffers). */
SUMO_API sumo_result sumo_distributed_extra_memory(const sumo_distributed *dist, size_t *bytes);

/*
 * SlowMo's outer loop alone, for a base optimizer that is not sumo's (PyTorch's): the same
 * object the SLOWMO mode above runs, so both give the same bits. Around each local step the
 * caller takes itself:
 *   sumo_slowmo_begin(s, params)       before it: takes the anchor on the first call;
 *   (the local step with rate lr)
 *   sumo_slowmo_end(s, params, lr, &c) after it: inner averaging or the outer step when due
 *                                      (collective then; *communicated says so), else nothing.
 * Every call of end counts one local step, whatever the step did (a rank that skipped its step
 * for a non-finite gradient still counts it, so every rank stays on the schedule). params hold
 * nparams elements of dtype (fp32 or fp64) in any memory the communicator has kernels for.
 * Create is collective: ranks with different options or counts get SUMO_ERR_MISMATCH.
 * An outer step at lr 0 is refused (SUMO_ERR_INVALID_ARGUMENT, nothing counted: the slow
 * buffer divides by the rate). An outer step whose result is not finite completes and returns
 * SUMO_ERR_NONFINITE on every rank alike.
 */
typedef struct sumo_slowmo sumo_slowmo;
SUMO_API sumo_result sumo_slowmo_create(sumo_comm *comm, size_t nparams, sumo_dtype dtype,
                               const sumo_slowmo_options *options, sumo_slowmo **out);
SUMO_API sumo_result sumo_slowmo_destroy(sumo_slowmo *slowmo);
SUMO_API sumo_result sumo_slowmo_begin(sumo_slowmo *slowmo, const void *params);
SUMO_API sumo_result sumo_slowmo_end(sumo_slowmo *slowmo, void *params, double lr, int *communicated);
/* What the next end does: SUMO_SLOWMO_LOCAL (nothing: params are not read),
 * SUMO_SLOWMO_INNER (an exact average) or SUMO_SLOWMO_OUTER (the outer step). A caller that
 * keeps its parameters elsewhere (a binding) gathers them into params only when they are read. */
enum { SUMO_SLOWMO_LOCAL = 0, SUMO_SLOWMO_INNER = 1, SUMO_SLOWMO_OUTER = 2 };
SUMO_API sumo_result sumo_slowmo_due(const sumo_slowmo *slowmo, int *what);
/* Whether every rank holds the same parameters after the last end. */
SUMO_API sumo_result sumo_slowmo_synchronized(const sumo_slowmo *slowmo, int *synchronized);
/* The slow buffer, anchor and step counter, for checkpoints. */
SUMO_API sumo_result sumo_slowmo_state_size(const sumo_slowmo *slowmo, size_t *bytes);
SUMO_API sumo_result sumo_slowmo_state_save(const sumo_slowmo *slowmo, void *buffer, size_t bytes);
SUMO_API sumo_result sumo_slowmo_state_load(sumo_slowmo *slowmo, const void *buffer, size_t bytes);
SUMO_API sumo_result sumo_slowmo_stats(const sumo_slowmo *slowmo, sumo_comm_stats *stats);
SUMO_API sumo_result sumo_slowmo_extra_memory(const sumo_slowmo *slowmo, size_t *bytes);

/*
 * Horovod's delta mode for a caller that takes the local step itself: the two element-wise
 * halves of the DELTA mode above, through the kernels of the buffers' memory.
 * sumo_delta_compute: delta = params - start (each rounded once to dtype).
 * sumo_delta_apply: params = start + delta; when a result is not finite, params are set back
 * to start and SUMO_ERR_NONFINITE says which element (in comm's error message).
 */
SUMO_API sumo_result sumo_delta_compute(sumo_comm *comm, void *delta, const void *params,
                               const void *start, size_t count, sumo_dtype dtype);
SUMO_API sumo_result sumo_delta_apply(sumo_comm *comm, void *params, const void *start,
                             const void *delta, size_t count, sumo_dtype dtype);

#ifdef __cplusplus
}
#endif

#endif
