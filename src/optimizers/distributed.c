/*
 * The distributed optimizer: one call per training step, whatever the mode. GRADIENT combines
 * the gradients and steps; DELTA steps locally and combines the deltas (Horovod's Adasum
 * mode); SLOWMO runs the outer loop of slowmo.c around the base optimizer's local steps and
 * applies the buffer policy at each outer step. Every touch of the parameters goes through
 * the kernel table of their memory.
 */
#include "optimizers/slowmo.h"
#include "collectives/comm.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct sumo_distributed {
    sumo_comm *comm;
    sumo_optimizer *optimizer;
    sumo_aggregator *aggregator;
    size_t nparams;
    sumo_distributed_options options;
    sumo_comm_stats stats; /* this layer's own collectives (the others count their own) */
    float *saved;          /* DELTA: parameters before the local step */
    bool synchronized;
    sumo_slowmo *slowmo;   /* SLOWMO */
};

sumo_result sumo_slowmo_options_preset(sumo_slowmo_preset preset, sumo_slowmo_options *options)
{
    if (options == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    /* The paper's settings: tau 12 for a Local SGD base, alpha 1 everywhere, beta 0.5
     * (fairscale's default); BMUF is block momentum over plain local steps. */
    *options = (sumo_slowmo_options){.struct_size = sizeof *options, .tau = 12,
                                     .inner_period = 0, .alpha = 1.0,
                                     .buffers = SUMO_BUFFERS_KEEP};
    switch (preset) {
    case SUMO_SLOWMO_PRESET_SLOWMO: options->beta = 0.5; return SUMO_SUCCESS;
    case SUMO_SLOWMO_PRESET_LOCALSGD: options->beta = 0.0; return SUMO_SUCCESS;
    case SUMO_SLOWMO_PRESET_BMUF: options->beta = 0.5; return SUMO_SUCCESS;
    default: return SUMO_ERR_INVALID_ARGUMENT;
    }
}

sumo_result sumo_distributed_options_default(sumo_update_mode mode, sumo_distributed_options *options)
{
    if (options == NULL || (unsigned)mode >= SUMO_UPDATE_MODE_COUNT) return SUMO_ERR_INVALID_ARGUMENT;
    *options = (sumo_distributed_options){.struct_size = sizeof *options, .mode = mode};
    return sumo_slowmo_options_preset(SUMO_SLOWMO_PRESET_SLOWMO, &options->slowmo);
}

sumo_result sumo_distributed_create(sumo_comm *comm, sumo_optimizer *optimizer,
                                    sumo_aggregator *aggregator, size_t nparams,
                                    const sumo_distributed_options *options,
                                    sumo_distributed **out)
{
    if (comm == NULL || optimizer == NULL || options == NULL || out == NULL || nparams == 0 ||
        options->struct_size != sizeof *options || (unsigned)options->mode >= SUMO_UPDATE_MODE_COUNT)
        return SUMO_ERR_INVALID_ARGUMENT;
    if (options->mode != SUMO_UPDATE_SLOWMO && aggregator == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    size_t n = 0, ntensors = 0;
    SUMO__CHECK(sumo_optimizer_size(optimizer, &n, &ntensors));
    if (n != nparams) return SUMO_ERR_INVALID_ARGUMENT;
    sumo_distributed *d = calloc(1, sizeof *d);
    if (d == NULL) return SUMO_ERR_SYSTEM;
    *d = (sumo_distributed){.comm = comm, .optimizer = optimizer, .aggregator = aggregator,
                            .nparams = nparams, .options = *options, .synchronized = true};
    sumo_result r = SUMO_SUCCESS;
    if (options->mode == SUMO_UPDATE_DELTA) {
        d->saved = malloc(nparams * sizeof *d->saved);
        if (d->saved == NULL) r = SUMO_ERR_SYSTEM;
    } else if (options->mode == SUMO_UPDATE_SLOWMO) {
        r = sumo_slowmo_create(comm, nparams, SUMO_FLOAT32, &options->slowmo, &d->slowmo);
    }
    if (r != SUMO_SUCCESS) {
        free(d->saved);
        free(d);
        return r;
    }
    *out = d;
    return SUMO_SUCCESS;
}

sumo_result sumo_distributed_destroy(sumo_distributed *dist)
{
    if (dist == NULL) return SUMO_SUCCESS;
    sumo_slowmo_destroy(dist->slowmo);
    free(dist->saved);
    free(dist);
    return SUMO_SUCCESS;
}

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

/* Horovod's Adasum mode: a local step, the deltas combined, added to the saved parameters.
 * The optimizer's state has advanced on the local gradient, which is the point: its momentum
 * and moments stay local.
 *
 * A rank whose local step fails must still take part in the collective, or its peers wait
 * out the deadline: it sends a NaN delta instead. The combined delta is bit-identical on
 * every rank, so every rank sees the same non-finite values and gives up the step alike,
 * whatever the aggregator (a sum or an average would pass the NaN on silently). */
static sumo_result delta_step(sumo_distributed *d, float *params, float *grads, double lr)
{
    size_t n = d->nparams;
    const sumo__exec x = {.k = sumo__kernels_for(d->comm, params, n * sizeof *params)};
    SUMO__CHECK(sumo__k_copy(&x, d->saved, params, n * sizeof *params));
    sumo_result local = sumo_optimizer_step(d->optimizer, params, grads, lr);
    if (local == SUMO_SUCCESS) SUMO__CHECK(sumo_delta_compute(d->comm, grads, params, d->saved, n, SUMO_FLOAT32));
    else SUMO__CHECK(sumo__k_fill(&x, SUMO_FLOAT32, grads, NAN, n));
    sumo_result r = sumo_aggregator_apply(d->aggregator, grads, n, SUMO_FLOAT32);
    if (r == SUMO_SUCCESS && local == SUMO_SUCCESS)
        return sumo_delta_apply(d->comm, params, d->saved, grads, n, SUMO_FLOAT32);
    /* Nothing half-done survives: the parameters are those from before the step. */
    SUMO__CHECK(sumo__k_copy(&x, params, d->saved, n * sizeof *params));
    return local != SUMO_SUCCESS ? local : r;
}

static sumo_result apply_buffer_policy(sumo_distributed *dist)
{
    switch (dist->options.slowmo.buffers) {
    case SUMO_BUFFERS_RESET: return sumo_optimizer_state_reset(dist->optimizer);
    case SUMO_BUFFERS_AVERAGE: {
        float *bufs[SUMO_OPTIMIZER_MAX_STATE_BUFFERS] = {0};
        size_t count = 0;
        int nbufs = 0;
        SUMO__CHECK(sumo_optimizer_state_buffers(dist->optimizer, bufs, &count, &nbufs));
        if (nbufs == 0 || count == 0) return SUMO_SUCCESS; /* same on every rank: same kind */
        /* The buffers are contiguous: one allreduce covers them all. */
        size_t total = (size_t)nbufs * count;
        dist->stats.rounds++;
        dist->stats.bytes += (uint64_t)total * sizeof(float);
        return sumo_allreduce(bufs[0], bufs[0], total, SUMO_FLOAT32, SUMO_OP_AVERAGE, dist->comm);
    }
    default: return SUMO_SUCCESS;
    }
}

/* One local step of the base optimizer inside SlowMo's outer loop. A step the base optimizer
 * refuses (check_finite on a NaN gradient) changes nothing and does not count; if only some
 * ranks refuse, the ranks are out of step and the next average fails or times out, so such a
 * batch must be skipped on every rank (agree first). */
static sumo_result slowmo_step(sumo_distributed *d, float *params, float *grads, double lr,
                               int *communicated)
{
    int due;
    SUMO__CHECK(sumo_slowmo_due(d->slowmo, &due));
    bool outer = due == SUMO_SLOWMO_OUTER;
    if (outer && !(lr > 0)) return SUMO_ERR_INVALID_ARGUMENT; /* nothing may change before */
    bool anchored = sumo__slowmo_anchored(d->slowmo);
    SUMO__CHECK(sumo_slowmo_begin(d->slowmo, params));
    sumo_result r = sumo_optimizer_step(d->optimizer, params, grads, lr);
    if (r != SUMO_SUCCESS) {
        if (!anchored) sumo__slowmo_unanchor(d->slowmo);
        return r;
    }
    r = sumo_slowmo_end(d->slowmo, params, lr, communicated);
    if (r == SUMO_SUCCESS && outer) r = apply_buffer_policy(d);
    int sync = 0;
    sumo_slowmo_synchronized(d->slowmo, &sync);
    d->synchronized = sync;
    return r;
}

sumo_result sumo_distributed_step(sumo_distributed *dist, float *params, float *grads, double lr,
                                  int *communicated)
{
    if (dist == NULL || params == NULL || grads == NULL || !(lr >= 0) || lr > 1e30)
        return SUMO_ERR_INVALID_ARGUMENT;
    int comm_flag = 0;
    sumo_result r;
    switch (dist->options.mode) {
    case SUMO_UPDATE_GRADIENT:
        comm_flag = 1;
        r = sumo_aggregator_apply(dist->aggregator, grads, dist->nparams, SUMO_FLOAT32);
        if (r == SUMO_SUCCESS) r = sumo_optimizer_step(dist->optimizer, params, grads, lr);
        dist->synchronized = true;
        break;
    case SUMO_UPDATE_DELTA:
        comm_flag = 1;
        r = delta_step(dist, params, grads, lr);
        dist->synchronized = true;
        break;
    default: r = slowmo_step(dist, params, grads, lr, &comm_flag); break;
    }
    if (communicated) *communicated = comm_flag;
    return r;
}

sumo_result sumo_distributed_synchronized(const sumo_distributed *dist, int *synchronized)
{
    if (dist == NULL || synchronized == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *synchronized = dist->synchronized;
    return SUMO_SUCCESS;
}

sumo_result sumo_distributed_state_size(const sumo_distributed *dist, size_t *bytes)
{
    if (dist == NULL || bytes == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    if (dist->slowmo) return sumo_slowmo_state_size(dist->slowmo, bytes);
    *bytes = 0;
    return SUMO_SUCCESS;
}

sumo_result sumo_distributed_state_save(const sumo_distributed *dist, void *buffer, size_t bytes)
{
    size_t need;
    SUMO__CHECK(sumo_distributed_state_size(dist, &need));
    if (bytes != need || (need && buffer == NULL)) return SUMO_ERR_INVALID_ARGUMENT;
    return need ? sumo_slowmo_state_save(dist->slowmo, buffer, bytes) : SUMO_SUCCESS;
}

sumo_result sumo_distributed_state_load(sumo_distributed *dist, const void *buffer, size_t bytes)
{
    size_t need;
    SUMO__CHECK(sumo_distributed_state_size(dist, &need));
    if (bytes != need || (need && buffer == NULL)) return SUMO_ERR_INVALID_ARGUMENT;
    if (!need) return SUMO_SUCCESS;
    SUMO__CHECK(sumo_slowmo_state_load(dist->slowmo, buffer, bytes));
    int sync = 0;
    sumo_slowmo_synchronized(dist->slowmo, &sync);
    dist->synchronized = sync;
    return SUMO_SUCCESS;
}

sumo_result sumo_distributed_stats(const sumo_distributed *dist, sumo_comm_stats *stats)
{
    if (dist == NULL || stats == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *stats = dist->stats;
    sumo_comm_stats more;
    if (dist->aggregator) {
        SUMO__CHECK(sumo_aggregator_stats(dist->aggregator, &more));
        stats->rounds += more.rounds;
        stats->bytes += more.bytes;
    }
    if (dist->slowmo) {
        SUMO__CHECK(sumo_slowmo_stats(dist->slowmo, &more));
        stats->rounds += more.rounds;
        stats->bytes += more.bytes;
    }
    return SUMO_SUCCESS;
}

sumo_result sumo_distributed_extra_memory(const sumo_distributed *dist, size_t *bytes)
{
    if (dist == NULL || bytes == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    switch (dist->options.mode) {
    case SUMO_UPDATE_DELTA: *bytes = dist->nparams * sizeof(float); break;
    case SUMO_UPDATE_SLOWMO: return sumo_slowmo_extra_memory(dist->slowmo, bytes);
    default: *bytes = 0; break;
    }
    return SUMO_SUCCESS;
}
