/*
 * The aggregator: a method's options, its state (ACGA's momentum), and the one call per step
 * that combines every rank's buffer. An apply is a composite call on the communicator (its
 * checks and exchanges run with the handle held, in order with the handle's other calls), so
 * it has an asynchronous form like every collective.
 */
#include "aggregation/acga.h"
#include "collectives/collectives.h"
#include "collectives/requests.h"

#include <stdlib.h>
#include <string.h>

struct sumo_aggregator {
    sumo_comm *comm;
    sumo_aggregator_options options; /* tensor_counts points at the copy below */
    size_t *tensor_counts;
    size_t ntensors;
    size_t total;         /* sum of tensor_counts */
    sumo_comm_stats stats;
    sumo_op op;           /* the collective op of the stateless methods */
    sumo__acga *acga;     /* ACGA's state */
};

sumo_result sumo_acga_options_default(sumo_acga_options *options)
{
    if (options == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *options = (sumo_acga_options){.struct_size = sizeof *options, .beta = 0.0,
                                   .negative_guard = 1, .eps = 1e-8};
    return SUMO_SUCCESS;
}

sumo_result sumo_aggregator_options_default(sumo_aggregation method, sumo_aggregator_options *options)
{
    if (options == NULL || (unsigned)method >= SUMO_AGGREGATE_COUNT) return SUMO_ERR_INVALID_ARGUMENT;
    *options = (sumo_aggregator_options){.struct_size = sizeof *options, .method = method};
    return sumo_acga_options_default(&options->acga);
}

/* What every rank must have alike: method, layout and the method's options. */
static uint64_t fingerprint(const sumo_aggregator *agg)
{
    const sumo_aggregator_options *o = &agg->options;
    int64_t f[] = {(int64_t)o->method, (int64_t)agg->ntensors, o->adasum_hierarchical,
                   o->adasum_group_size};
    uint64_t h = sumo__fnv1a(SUMO__FNV_OFFSET, f, sizeof f);
    if (agg->ntensors) h = sumo__fnv1a(h, agg->tensor_counts, agg->ntensors * sizeof(size_t));
    if (agg->acga) h = sumo__fnv1a(h, &(uint64_t){sumo__acga_fingerprint(agg->acga)}, 8);
    return h;
}

static void release(sumo_aggregator *agg)
{
    sumo__acga_destroy(agg->acga);
    if (agg->op >= SUMO_OP_PREDEFINED_COUNT) sumo_op_destroy(agg->comm, agg->op);
    free(agg->tensor_counts);
    free(agg);
}

/* This rank's part of create; the ranks agree on the outcome afterwards. */
static sumo_result create_local(sumo_comm *comm, const sumo_aggregator_options *options,
                                sumo_aggregator *agg)
{
    char why[256];
    if (SUMO__STRUCT_SIZE_PROBLEM(options, sumo_aggregator_options, why, sizeof why))
        return SUMO__COMM_FAIL(comm, SUMO_ERR_INVALID_ARGUMENT, "aggregator create: %s", why);
    if ((unsigned)options->method >= SUMO_AGGREGATE_COUNT)
        return SUMO__COMM_FAIL(comm, SUMO_ERR_INVALID_ARGUMENT, "aggregator create: unknown method %d",
                               (int)options->method);
    if (options->ntensors > 0 && options->tensor_counts == NULL)
        return SUMO__COMM_FAIL(comm, SUMO_ERR_INVALID_ARGUMENT,
                               "aggregator create: %zu tensors but tensor_counts is NULL",
                               options->ntensors);
    agg->options = *options;
    agg->ntensors = options->ntensors;
    if (agg->ntensors > 0) {
        agg->tensor_counts = malloc(agg->ntensors * sizeof *agg->tensor_counts);
        if (agg->tensor_counts == NULL)
            return SUMO__COMM_FAIL(comm, SUMO_ERR_SYSTEM, "aggregator create: out of memory");
        memcpy(agg->tensor_counts, options->tensor_counts, agg->ntensors * sizeof *agg->tensor_counts);
        for (size_t t = 0; t < agg->ntensors; t++) {
            if (__builtin_add_overflow(agg->total, agg->tensor_counts[t], &agg->total))
                return SUMO__COMM_FAIL(comm, SUMO_ERR_INVALID_ARGUMENT,
                                       "aggregator create: tensor counts overflow size_t");
        }
    }
    agg->options.tensor_counts = agg->tensor_counts;
    switch (options->method) {
    case SUMO_AGGREGATE_SUM: agg->op = SUMO_OP_SUM; return SUMO_SUCCESS;
    case SUMO_AGGREGATE_AVERAGE: agg->op = SUMO_OP_AVERAGE; return SUMO_SUCCESS;
    case SUMO_AGGREGATE_ADASUM: {
        agg->op = SUMO_OP_ADASUM;
        if (agg->ntensors == 0 && !options->adasum_hierarchical) return SUMO_SUCCESS;
        sumo_adasum_options ao = {.struct_size = sizeof ao,
                                  .tensor_counts = agg->tensor_counts,
                                  .ntensors = agg->ntensors,
                                  .hierarchical = options->adasum_hierarchical,
                                  .group_size = options->adasum_group_size};
        return sumo_op_create_adasum(comm, &ao, &agg->op);
    }
    default:
        return sumo__acga_create(comm, &options->acga, agg->tensor_counts, agg->ntensors, &agg->acga);
    }
}

sumo_result sumo_aggregator_create(sumo_comm *comm, const sumo_aggregator_options *options,
                                   sumo_aggregator **aggregator)
{
    if (comm == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    sumo_aggregator *agg = calloc(1, sizeof *agg);
    sumo_result local;
    if (agg == NULL) local = SUMO__COMM_FAIL(comm, SUMO_ERR_SYSTEM, "aggregator create: out of memory");
    else if (options == NULL || aggregator == NULL)
        local = SUMO__COMM_FAIL(comm, SUMO_ERR_INVALID_ARGUMENT, "aggregator create: NULL %s",
                                options == NULL ? "options" : "aggregator");
    else {
        agg->comm = comm;
        local = create_local(comm, options, agg);
    }
    /* Every rank learns every rank's outcome, and ranks set up differently fail together
     * rather than run collectives out of step later. */
    sumo_result r = sumo__agree_setup(comm, local, local == SUMO_SUCCESS ? fingerprint(agg) : 0,
                                      "aggregator create (method, layout and options)");
    if (r != SUMO_SUCCESS) {
        if (agg) release(agg);
        return r;
    }
    *aggregator = agg;
    return SUMO_SUCCESS;
}

sumo_result sumo_aggregator_destroy(sumo_aggregator *agg)
{
    if (agg == NULL) return SUMO_SUCCESS;
    release(agg);
    return SUMO_SUCCESS;
}

typedef struct apply_args {
    sumo_aggregator *agg;
    const void *sendbuf;
    void *recvbuf;
    size_t count;
    sumo_dtype dtype;
} apply_args;

/* The apply, with the handle held. A bad argument is this rank's failure where its peers are
 * entering the exchange: announcing it makes every rank return at once. */
static sumo_result apply_run(sumo_comm *comm, void *p)
{
    const apply_args *a = p;
    sumo_aggregator *agg = a->agg;
    if (((a->sendbuf == NULL || a->recvbuf == NULL) && a->count > 0) || !sumo__dtype_valid(a->dtype))
        return sumo__fail_held(comm, SUMO__COMM_FAIL(comm, SUMO_ERR_INVALID_ARGUMENT,
                                                     "aggregator: NULL buffer or unknown dtype"));
    if (agg->ntensors > 0 && a->count != agg->total)
        return sumo__fail_held(comm, SUMO__COMM_FAIL(comm, SUMO_ERR_INVALID_ARGUMENT,
                                                     "aggregator: count %zu does not match the "
                                                     "layout's total %zu",
                                                     a->count, agg->total));
    size_t esz = sumo__dtype_bytes(a->dtype);
    if (a->count > SIZE_MAX / esz)
        return sumo__fail_held(comm, SUMO__COMM_FAIL(comm, SUMO_ERR_INVALID_ARGUMENT,
                                                     "aggregator: count %zu overflows size_t in "
                                                     "bytes",
                                                     a->count));
    if (a->sendbuf != a->recvbuf &&
        sumo__ranges_overlap(a->sendbuf, a->count * esz, a->recvbuf, a->count * esz))
        return sumo__fail_held(comm, SUMO__COMM_FAIL(comm, SUMO_ERR_INVALID_ARGUMENT,
                                                     "aggregator: send and receive buffers "
                                                     "overlap without being the same pointer"));
    if (agg->acga)
        return sumo__acga_apply_held(agg->acga, a->sendbuf, a->recvbuf, a->count, a->dtype,
                                     &agg->stats);
    agg->stats.rounds++;
    agg->stats.bytes += (uint64_t)a->count * esz;
    return sumo__allreduce_held(comm, a->sendbuf, a->recvbuf, a->count, a->dtype, agg->op);
}

static sumo_result submit_apply(sumo_aggregator *agg, const void *sendbuf, void *recvbuf,
                                size_t count, sumo_dtype dtype, sumo_request **request)
{
    if (agg == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    apply_args args = {.agg = agg, .sendbuf = sendbuf, .recvbuf = recvbuf, .count = count,
                       .dtype = dtype};
    _Static_assert(sizeof args <= SUMO__CALL_ARGS_BYTES, "an apply's arguments fit a call");
    sumo__call call = sumo__composite(apply_run, &args, sizeof args);
    return sumo__submit(agg->comm, &call, request);
}

sumo_result sumo_aggregator_apply_into(sumo_aggregator *agg, const void *sendbuf, void *recvbuf,
                                       size_t count, sumo_dtype dtype)
{
    return submit_apply(agg, sendbuf, recvbuf, count, dtype, NULL);
}

sumo_result sumo_aggregator_apply_start(sumo_aggregator *agg, const void *sendbuf, void *recvbuf,
                                        size_t count, sumo_dtype dtype, sumo_request **request)
{
    if (request == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    return submit_apply(agg, sendbuf, recvbuf, count, dtype, request);
}

sumo_result sumo_aggregator_apply(sumo_aggregator *agg, void *buffer, size_t count, sumo_dtype dtype)
{
    return sumo_aggregator_apply_into(agg, buffer, buffer, count, dtype);
}

sumo_result sumo_aggregator_state_size(const sumo_aggregator *agg, size_t *bytes)
{
    if (agg == NULL || bytes == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *bytes = agg->acga ? sumo__acga_state_size(agg->acga) : 0;
    return SUMO_SUCCESS;
}

sumo_result sumo_aggregator_state_save(const sumo_aggregator *agg, void *buffer, size_t bytes)
{
    size_t need;
    SUMO__CHECK(sumo_aggregator_state_size(agg, &need));
    if (bytes != need || (need > 0 && buffer == NULL)) return SUMO_ERR_INVALID_ARGUMENT;
    return need ? sumo__acga_state_save(agg->acga, buffer) : SUMO_SUCCESS;
}

sumo_result sumo_aggregator_state_load(sumo_aggregator *agg, const void *buffer, size_t bytes)
{
    size_t need;
    SUMO__CHECK(sumo_aggregator_state_size(agg, &need));
    if (bytes != need || (need > 0 && buffer == NULL)) return SUMO_ERR_INVALID_ARGUMENT;
    return need ? sumo__acga_state_load(agg->acga, buffer) : SUMO_SUCCESS;
}

sumo_result sumo_aggregator_stats(const sumo_aggregator *agg, sumo_comm_stats *stats)
{
    if (agg == NULL || stats == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *stats = agg->stats;
    return SUMO_SUCCESS;
}
