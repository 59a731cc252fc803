/*
 * Horovod's delta mode for a caller that takes the local step itself (sumo.torch's
 * DistributedOptimizer with Adasum): the two element-wise halves of the distributed
 * optimizer's DELTA mode (sumo_distributed.h), through the kernels of the buffers' memory.
 */
#ifndef SUMO_DELTA_H
#define SUMO_DELTA_H

#include "sumo.h"

#ifdef __cplusplus
extern "C" {
#endif

/* delta = params - start (each rounded once to dtype). */
SUMO_API sumo_result sumo_delta_compute(sumo_comm *comm, void *delta, const void *params,
                               const void *start, size_t count, sumo_dtype dtype);
/* params = start + delta; when a result is not finite, params are set back to start and
 * SUMO_ERR_NONFINITE says which element (in comm's error message). */
SUMO_API sumo_result sumo_delta_apply(sumo_comm *comm, void *params, const void *start,
                             const void *delta, size_t count, sumo_dtype dtype);

#ifdef __cplusplus
}
#endif

#endif
