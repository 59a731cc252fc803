#include "optimizers/slowmo.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

sumo_result sumo_slowmo_options_preset(sumo_slowmo_preset preset, sumo_slowmo_options *options)
{
    if (options == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    /* The paper's settings: tau 12 for a Local SGD base, alpha 1 everywhere, beta 0.5
     * (fairscale's default); BMUF is block momentum over plain local steps. */
    *options = (sumo_slowmo_options){.tau = 12, .inner_period = 0, .alpha = 1.0,
                                     .buffers = SUMO_BUFFERS_KEEP};
    switch (preset) {
    case SUMO_SLOWMO_PRESET_SLOWMO: options->beta = 0.5; return SUMO_SUCCESS;
    case SUMO_SLOWMO_PRESET_LOCALSGD: options->beta = 0.0; return SUMO_SUCCESS;
    case SUMO_SLOWMO_PRESET_BMUF: options->beta = 0.5; return SUMO_SUCCESS;
    default: return SUMO_ERR_INVALID_ARGUMENT;
    }
}

sumo_result sumo_distributed_create(sumo_comm *comm, sumo_optimizer *optimizer,
                                    sumo_aggregator *aggregator, size_t nparams,
                                    const sumo_distributed_options *options,
                                    sumo_distributed **out)
{
    if (comm == NULL || optimizer == NULL || options == NULL || out == NULL || nparams == 0 ||
        (unsigned)options->mode >= SUMO_UPDATE_MODE_COUNT)
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
        r = sumo__slowmo_init(d);
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
    if (dist->options.mode == SUMO_UPDATE_SLOWMO) sumo__slowmo_free(dist);
    free(dist->saved);
    free(dist);
    return SUMO_SUCCESS;
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
    memcpy(d->saved, params, n * sizeof *params);
    sumo_result local = sumo_optimizer_step(d->optimizer, params, grads, lr);
    if (local == SUMO_SUCCESS)
        for (size_t i = 0; i < n; i++) grads[i] = params[i] - d->saved[i];
    else
        for (size_t i = 0; i < n; i++) grads[i] = NAN;
    sumo_result r = sumo_aggregator_apply(d->aggregator, grads, n, SUMO_FLOAT32);
    int nonfinite = 0;
    if (r == SUMO_SUCCESS) {
        for (size_t i = 0; i < n; i++) {
            float v = d->saved[i] + grads[i];
            nonfinite |= !isfinite(v);
            params[i] = v;
        }
    }
    /* Nothing half-done survives: the parameters are those from before the step. */
    if (r != SUMO_SUCCESS || nonfinite || local != SUMO_SUCCESS)
        memcpy(params, d->saved, n * sizeof *params);
    if (local != SUMO_SUCCESS) return local;
    return r == SUMO_SUCCESS && nonfinite ? SUMO_ERR_NONFINITE : r;
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
    default: r = sumo__slowmo_step(dist, params, grads, lr, &comm_flag); break;
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
    *bytes = dist->options.mode == SUMO_UPDATE_SLOWMO ? sumo__slowmo_state_size(dist) : 0;
    return SUMO_SUCCESS;
}

sumo_result sumo_distributed_state_save(const sumo_distributed *dist, void *buffer, size_t bytes)
{
    size_t need;
    SUMO__CHECK(sumo_distributed_state_size(dist, &need));
    if (bytes != need || (need && buffer == NULL)) return SUMO_ERR_INVALID_ARGUMENT;
    return need ? sumo__slowmo_state_save(dist, buffer) : SUMO_SUCCESS;
}

sumo_result sumo_distributed_state_load(sumo_distributed *dist, const void *buffer, size_t bytes)
{
    size_t need;
    SUMO__CHECK(sumo_distributed_state_size(dist, &need));
    if (bytes != need || (need && buffer == NULL)) return SUMO_ERR_INVALID_ARGUMENT;
    return need ? sumo__slowmo_state_load(dist, buffer) : SUMO_SUCCESS;
}

sumo_result sumo_distributed_stats(const sumo_distributed *dist, sumo_comm_stats *stats)
{
    if (dist == NULL || stats == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *stats = dist->stats;
    if (dist->aggregator) {
        sumo_comm_stats a;
        SUMO__CHECK(sumo_aggregator_stats(dist->aggregator, &a));
        stats->rounds += a.rounds;
        stats->bytes += a.bytes;
    }
    return SUMO_SUCCESS;
}

sumo_result sumo_distributed_extra_memory(const sumo_distributed *dist, size_t *bytes)
{
    if (dist == NULL || bytes == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    switch (dist->options.mode) {
    case SUMO_UPDATE_DELTA: *bytes = dist->nparams * sizeof(float); break;
    case SUMO_UPDATE_SLOWMO: *bytes = sumo__slowmo_extra_memory(dist); break;
    default: *bytes = 0; break;
    }
    return SUMO_SUCCESS;
}
