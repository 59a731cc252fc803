/* Horovod's delta mode's two element-wise halves (sumo_delta.h), through the kernel table of
 * the buffers' memory. */
#include "sumo_delta.h"
#include "collectives/comm.h"

sumo_result sumo_delta_compute(sumo_comm *comm, void *delta, const void *params,
                               const void *start, size_t count, sumo_dtype dtype)
{
    if (comm == NULL || !sumo__dtype_valid(dtype) ||
        (count > 0 && (delta == NULL || params == NULL || start == NULL)))
        return SUMO_ERR_INVALID_ARGUMENT;
    const sumo__exec x = {.k = sumo__kernels_for(comm, params, count * sumo__dtype_bytes(dtype))};
    return sumo__k_delta(&x, dtype, delta, params, start, count);
}

sumo_result sumo_delta_apply(sumo_comm *comm, void *params, const void *start, const void *delta,
                             size_t count, sumo_dtype dtype)
{
    if (comm == NULL || !sumo__dtype_valid(dtype) ||
        (count > 0 && (delta == NULL || params == NULL || start == NULL)))
        return SUMO_ERR_INVALID_ARGUMENT;
    size_t bytes = count * sumo__dtype_bytes(dtype), bad;
    const sumo__exec x = {.k = sumo__kernels_for(comm, params, bytes)};
    SUMO__CHECK(sumo__k_apply_delta(&x, dtype, params, start, delta, count, &bad));
    if (bad == SIZE_MAX) return SUMO_SUCCESS;
    /* Nothing half-done survives: the parameters are those from before the step. */
    SUMO__CHECK(sumo__k_copy(&x, params, start, bytes));
    return SUMO__FAIL_TOGETHER(comm->tp, SUMO_ERR_NONFINITE,
                               "delta step: element %zu of start + combined delta is not finite; "
                               "the parameters are back at the start of the step",
                               bad);
}
