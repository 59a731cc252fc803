#include "aggregation/acga.h"
#include "collectives/agree.h"

#include <stdlib.h>
#include <string.h>

sumo_result sumo_aggregator_options_default(sumo_aggregation method, sumo_aggregator_options *options)
{
    if (options == NULL || (unsigned)method >= SUMO_AGGREGATE_COUNT) return SUMO_ERR_INVALID_ARGUMENT;
    *options = (sumo_aggregator_options){
        .method = method,
        .acga = {.beta = 0.0, .negative_guard = 1, .eps = 1e-8},
    };
    return SUMO_SUCCESS;
}

sumo_result sumo_aggregator_create(sumo_comm *comm, const sumo_aggregator_options *options,
                                   sumo_aggregator **aggregator)
{
    if (comm == NULL || options == NULL || aggregator == NULL ||
        (unsigned)options->method >= SUMO_AGGREGATE_COUNT ||
        (options->ntensors > 0 && options->tensor_counts == NULL))
        return SUMO_ERR_INVALID_ARGUMENT;
    sumo_aggregator *agg = calloc(1, sizeof *agg);
    if (agg == NULL) return SUMO_ERR_SYSTEM;
    agg->comm = comm;
    agg->options = *options;
    agg->ntensors = options->ntensors;
    if (agg->ntensors > 0) {
        agg->tensor_counts = malloc(agg->ntensors * sizeof *agg->tensor_counts);
        if (agg->tensor_counts == NULL) {
            free(agg);
            return SUMO_ERR_SYSTEM;
        }
        memcpy(agg->tensor_counts, options->tensor_counts, agg->ntensors * sizeof *agg->tensor_counts);
        for (size_t t = 0; t < agg->ntensors; t++) agg->total += agg->tensor_counts[t];
    }
    agg->options.tensor_counts = agg->tensor_counts;
    sumo_result r = SUMO_SUCCESS;
    switch (options->method) {
    case SUMO_AGGREGATE_SUM: agg->op = SUMO_OP_SUM; break;
    case SUMO_AGGREGATE_AVERAGE: agg->op = SUMO_OP_AVERAGE; break;
    case SUMO_AGGREGATE_ADASUM:
        agg->op = SUMO_OP_ADASUM;
        if (agg->ntensors > 0 || options->adasum_hierarchical) {
            sumo_adasum_options ao = {.struct_size = sizeof ao,
                                      .tensor_counts = agg->tensor_counts,
                                      .ntensors = agg->ntensors,
                                      .hierarchical = options->adasum_hierarchical,
                                      .group_size = options->adasum_group_size};
            r = sumo_op_create_adasum(comm, &ao, &agg->op);
        }
        break;
    case SUMO_AGGREGATE_ACGA: r = sumo__acga_init(agg); break;
    default: r = SUMO_ERR_INVALID_ARGUMENT; break;
    }
    if (r != SUMO_SUCCESS) {
        free(agg->tensor_counts);
        free(agg);
        return r;
    }
    *aggregator = agg;
    return SUMO_SUCCESS;
}

sumo_result sumo_aggregator_destroy(sumo_aggregator *agg)
{
    if (agg == NULL) return SUMO_SUCCESS;
    if (agg->vtbl && agg->vtbl->destroy) agg->vtbl->destroy(agg);
    if (agg->op >= SUMO_OP_PREDEFINED_COUNT) sumo_op_destroy(agg->comm, agg->op);
    free(agg->tensor_counts);
    free(agg);
    return SUMO_SUCCESS;
}

sumo_result sumo_aggregator_apply_into(sumo_aggregator *agg, const void *sendbuf, void *recvbuf,
                                       size_t count, sumo_dtype dtype)
{
    if (agg == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    /* The peers are entering the exchange: tell them, rather than leave them to the deadline. */
    if (((sendbuf == NULL || recvbuf == NULL) && count > 0) || !sumo__dtype_valid(dtype))
        return sumo__fail_together(agg->comm, SUMO__COMM_FAIL(agg->comm, SUMO_ERR_INVALID_ARGUMENT,
                                                         "aggregator: NULL buffer or unknown dtype"));
    if (agg->ntensors > 0 && count != agg->total)
        return sumo__fail_together(agg->comm,
                                   SUMO__COMM_FAIL(agg->comm, SUMO_ERR_INVALID_ARGUMENT,
                                              "aggregator: count %zu does not match the layout's "
                                              "total %zu", count, agg->total));
    size_t esz = sumo__dtype_bytes(dtype);
    if (count > SIZE_MAX / esz)
        return sumo__fail_together(agg->comm,
                                   SUMO__COMM_FAIL(agg->comm, SUMO_ERR_INVALID_ARGUMENT,
                                              "aggregator: count %zu overflows size_t in bytes",
                                              count));
    if (sendbuf != recvbuf && sumo__ranges_overlap(sendbuf, count * esz, recvbuf, count * esz))
        return sumo__fail_together(agg->comm,
                                   SUMO__COMM_FAIL(agg->comm, SUMO_ERR_INVALID_ARGUMENT,
                                              "aggregator: send and receive buffers overlap "
                                              "without being the same pointer"));
    if (agg->vtbl) return agg->vtbl->apply(agg, sendbuf, recvbuf, count, dtype);
    sumo__aggregator_count(agg, count, dtype);
    return sumo_allreduce(sendbuf, recvbuf, count, dtype, agg->op, agg->comm);
}

sumo_result sumo_aggregator_apply(sumo_aggregator *agg, void *buffer, size_t count, sumo_dtype dtype)
{
    return sumo_aggregator_apply_into(agg, buffer, buffer, count, dtype);
}

sumo_result sumo_aggregator_state_size(const sumo_aggregator *agg, size_t *bytes)
{
    if (agg == NULL || bytes == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *bytes = agg->vtbl && agg->vtbl->state_size ? agg->vtbl->state_size(agg) : 0;
    return SUMO_SUCCESS;
}

sumo_result sumo_aggregator_state_save(const sumo_aggregator *agg, void *buffer, size_t bytes)
{
    size_t need;
    SUMO__CHECK(sumo_aggregator_state_size(agg, &need));
    if (bytes != need || (need > 0 && buffer == NULL)) return SUMO_ERR_INVALID_ARGUMENT;
    return need ? agg->vtbl->state_save(agg, buffer) : SUMO_SUCCESS;
}

sumo_result sumo_aggregator_state_load(sumo_aggregator *agg, const void *buffer, size_t bytes)
{
    size_t need;
    SUMO__CHECK(sumo_aggregator_state_size(agg, &need));
    if (bytes != need || (need > 0 && buffer == NULL)) return SUMO_ERR_INVALID_ARGUMENT;
    return need ? agg->vtbl->state_load(agg, buffer) : SUMO_SUCCESS;
}

sumo_result sumo_aggregator_stats(const sumo_aggregator *agg, sumo_comm_stats *stats)
{
    if (agg == NULL || stats == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *stats = agg->stats;
    return SUMO_SUCCESS;
}
