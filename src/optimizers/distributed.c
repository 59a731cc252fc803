/*
 * The distributed optimizer: one call per training step, whatever the mode. GRADIENT combines
 * the gradients and steps; DELTA steps locally and combines the deltas (Horovod's Adasum
 * mode); OUTER runs the outer loop (diloco.c) around the base optimizer's local steps and
 * applies the buffer policy after each outer step. Every touch of the parameters goes through
 * the kernel table of their memory.
 */
#include "optimizers/diloco.h"
#include "optimizers/optimizer.h"
#include "sumo_delta.h"
#include "sumo_distributed.h"
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
    sumo_diloco *outer;    /* OUTER */
};

sumo_result sumo_distributed_options_default(sumo_update_mode mode, sumo_distributed_options *options)
{
    if (options == NULL || (unsigned)mode >= SUMO_UPDATE_MODE_COUNT) return SUMO_ERR_INVALID_ARGUMENT;
    *options = (sumo_distributed_options){.struct_size = sizeof *options, .mode = mode,
                                          .buffers = SUMO_BUFFERS_KEEP};
    return sumo_diloco_options_default(SUMO_DILOCO_PRESET_SLOWMO, &options->outer);
}

sumo_result sumo_distributed_create(sumo_comm *comm, sumo_optimizer *optimizer,
                                    sumo_aggregator *aggregator, size_t nparams,
                                    const sumo_distributed_options *options,
                                    sumo_distributed **out)
{
    if (comm == NULL || optimizer == NULL || options == NULL || out == NULL || nparams == 0)
        return SUMO_ERR_INVALID_ARGUMENT;
    char why[256];
    if (SUMO__STRUCT_SIZE_PROBLEM(options, sumo_distributed_options, why, sizeof why))
        return SUMO__COMM_FAIL(comm, SUMO_ERR_INVALID_ARGUMENT, "distributed create: %s", why);
    if ((unsigned)options->mode >= SUMO_UPDATE_MODE_COUNT ||
        (unsigned)options->buffers > (unsigned)SUMO_BUFFERS_AVERAGE)
        return SUMO__COMM_FAIL(comm, SUMO_ERR_INVALID_ARGUMENT,
                               "distributed create: mode %d or buffers %d is not one of the enum's",
                               (int)options->mode, (int)options->buffers);
    if (options->mode != SUMO_UPDATE_OUTER && aggregator == NULL) return SUMO_ERR_INVALID_ARGUMENT;
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
    } else if (options->mode == SUMO_UPDATE_OUTER) {
        r = sumo_diloco_create(comm, sumo__optimizer_layout(optimizer), ntensors, nparams,
                               SUMO_FLOAT32, &options->outer, &d->outer);
    }
    d->options.outer.fragment_of = NULL; /* the outer loop keeps its own copy */
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
    sumo_diloco_destroy(dist->outer);
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
    switch (dist->options.buffers) {
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

/* One local step of the base optimizer inside the outer loop. A step the base optimizer
 * refuses (check_finite on a NaN gradient) changes nothing and does not count; if only some
 * ranks refuse, the ranks are out of step and the next exchange fails or times out, so such a
 * batch must be skipped on every rank (agree first). */
static sumo_result outer_step(sumo_distributed *d, float *params, float *grads, double lr,
                              int *communicated)
{
    int due;
    SUMO__CHECK(sumo_diloco_due(d->outer, &due, NULL, NULL));
    bool outer = (due & SUMO_DILOCO_APPLY) != 0;
    if ((due & SUMO_DILOCO_START) && d->options.outer.outer == SUMO_OUTER_HEAVY_BALL && !(lr > 0))
        return SUMO_ERR_INVALID_ARGUMENT; /* nothing may change before */
    bool anchored = sumo__diloco_anchored(d->outer);
    SUMO__CHECK(sumo_diloco_begin(d->outer, params));
    sumo_result r = sumo_optimizer_step(d->optimizer, params, grads, lr);
    if (r != SUMO_SUCCESS) {
        if (!anchored) sumo__diloco_unanchor(d->outer);
        return r;
    }
    r = sumo_diloco_end(d->outer, params, lr, communicated);
    if (r == SUMO_SUCCESS && outer) r = apply_buffer_policy(d);
    int sync = 0;
    sumo_diloco_synchronized(d->outer, &sync);
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
    default: r = outer_step(dist, params, grads, lr, &comm_flag); break;
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
    if (dist->outer) return sumo_diloco_state_size(dist->outer, bytes);
    *bytes = 0;
    return SUMO_SUCCESS;
}

sumo_result sumo_distributed_state_save(sumo_distributed *dist, void *buffer, size_t bytes)
{
    size_t need;
    SUMO__CHECK(sumo_distributed_state_size(dist, &need));
    if (bytes != need || (need && buffer == NULL)) return SUMO_ERR_INVALID_ARGUMENT;
    return need ? sumo_diloco_state_save(dist->outer, buffer, bytes) : SUMO_SUCCESS;
}

sumo_result sumo_distributed_state_load(sumo_distributed *dist, const void *buffer, size_t bytes)
{
    size_t need;
    SUMO__CHECK(sumo_distributed_state_size(dist, &need));
    if (bytes != need || (need && buffer == NULL)) return SUMO_ERR_INVALID_ARGUMENT;
    if (!need) return SUMO_SUCCESS;
    SUMO__CHECK(sumo_diloco_state_load(dist->outer, buffer, bytes));
    int sync = 0;
    sumo_diloco_synchronized(dist->outer, &sync);
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
    if (dist->outer) {
        SUMO__CHECK(sumo_diloco_stats(dist->outer, &more));
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
    case SUMO_UPDATE_OUTER: return sumo_diloco_extra_memory(dist->outer, bytes);
    default: *bytes = 0; break;
    }
    return SUMO_SUCCESS;
}
