/*
 * The outer loop's checkpoints and queries (sumo_diloco.h): what a run needs to resume with
 * the same bits, and what a caller asks of the object between steps.
 */
#include "optimizers/diloco_impl.h"

#include <stdlib.h>
#include <string.h>

sumo_result sumo_diloco_synchronized(const sumo_diloco *d, int *synchronized)
{
    if (d == NULL || synchronized == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *synchronized = d->synchronized;
    return SUMO_SUCCESS;
}

sumo_result sumo_diloco_fragment(const sumo_diloco *d, int f, size_t *count, size_t *nruns)
{
    if (d == NULL || f < 0 || f >= d->nfrag) return SUMO_ERR_INVALID_ARGUMENT;
    if (count) *count = d->frags[f].n;
    if (nruns) *nruns = d->frags[f].nruns;
    return SUMO_SUCCESS;
}

sumo_result sumo_diloco_fragment_runs(const sumo_diloco *d, int f, size_t *offsets,
                                      size_t *lengths, size_t nruns)
{
    if (d == NULL || f < 0 || f >= d->nfrag || nruns != d->frags[f].nruns ||
        (nruns && (offsets == NULL || lengths == NULL)))
        return SUMO_ERR_INVALID_ARGUMENT;
    memcpy(offsets, d->frags[f].run_off, nruns * sizeof *offsets);
    memcpy(lengths, d->frags[f].run_len, nruns * sizeof *lengths);
    return SUMO_SUCCESS;
}

/* ---- checkpoints ------------------------------------------------------------------------ */

/* Fixed-width words in this machine's byte order, then x0, v and E (elements of the dtype),
 * then each fragment's aggregator state. */
#define DILOCO_MAGIC 0x44494c4f434f3031ull /* "DILOCO01" */
#define DILOCO_VERSION 2u /* 2: split, inner period and the sharded mode */
enum {
    H_MAGIC, H_VERSION, H_N, H_DTYPE, H_FRAGS, H_SPLIT, H_SYNC, H_DELAY, H_INNER, H_COMBINE,
    H_COMPRESSION, H_LAYOUT, H_SHARDED, H_NRANKS, H_RANK, H_STEPS, H_ANCHORED, H_PENDING,
    H_APPLY_AT, H_GAMMA, H_RESULT, H_COUNT
};

static size_t agg_bytes(const sumo_diloco *d, int f)
{
    size_t b = 0;
    if (d->frags[f].agg) sumo_aggregator_state_size(d->frags[f].agg, &b);
    return b;
}

sumo_result sumo_diloco_state_size(const sumo_diloco *d, size_t *bytes)
{
    if (d == NULL || bytes == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    size_t b = H_COUNT * sizeof(uint64_t) + sumo__diloco_state_elems(d) * d->esz;
    for (int f = 0; f < d->nfrag; f++) b += agg_bytes(d, f);
    *bytes = b + sumo__diloco_gossip_state_size(&d->gb);
    return SUMO_SUCCESS;
}

sumo_result sumo_diloco_state_save(sumo_diloco *d, void *buffer, size_t bytes)
{
    size_t need;
    SUMO__CHECK(sumo_diloco_state_size(d, &need));
    if (buffer == NULL || bytes != need) return SUMO_ERR_INVALID_ARGUMENT;
    /* An exchange in flight completes first: its result is part of the state. One that
     * failed (a lost peer) is refused: its apply would fail again in every run resumed from
     * it, and an elastic job would roll back to this state forever. */
    sumo__diloco_settle(d);
    if (d->pending >= 0 && d->result != SUMO_SUCCESS) return d->result;
    uint64_t gamma;
    memcpy(&gamma, &d->gamma, sizeof gamma);
    uint64_t h[H_COUNT] = {
        [H_MAGIC] = DILOCO_MAGIC, [H_VERSION] = DILOCO_VERSION, [H_N] = d->n,
        [H_DTYPE] = (uint64_t)d->dtype, [H_FRAGS] = (uint64_t)d->nfrag,
        [H_SPLIT] = (uint64_t)d->o.split, [H_SYNC] = (uint64_t)d->o.sync_every,
        [H_DELAY] = (uint64_t)d->o.delay, [H_INNER] = (uint64_t)d->o.inner_period,
        [H_COMBINE] = (uint64_t)d->o.combine, [H_COMPRESSION] = (uint64_t)d->o.compression,
        [H_LAYOUT] = d->layout_hash, [H_SHARDED] = (uint64_t)d->o.memory_efficient,
        /* Only a shard is this rank's own: an unsharded state is the same bytes on every
         * rank, so any rank's checkpoint serves all of them. */
        [H_NRANKS] = d->o.memory_efficient ? (uint64_t)d->nranks : 0,
        [H_RANK] = d->o.memory_efficient ? (uint64_t)d->rank : 0, [H_STEPS] = d->steps,
        [H_ANCHORED] = d->anchored, [H_PENDING] = (uint64_t)(d->pending + 1),
        [H_APPLY_AT] = d->apply_at, [H_GAMMA] = gamma, [H_RESULT] = (uint64_t)d->result,
    };
    unsigned char *p = buffer;
    memcpy(p, h, sizeof h);
    p += sizeof h;
    size_t state = sumo__diloco_state_elems(d) * d->esz;
    const sumo__exec x = {.k = d->k};
    SUMO__CHECK(sumo__k_copy(&x, p, d->x0, state));
    p += state;
    for (int f = 0; f < d->nfrag; f++) {
        size_t b = agg_bytes(d, f);
        if (b) SUMO__CHECK(sumo_aggregator_state_save(d->frags[f].agg, p, b));
        p += b;
    }
    return sumo__diloco_gossip_save(&d->gb, p);
}

static const char *check_header(const sumo_diloco *d, const uint64_t *h)
{
    if (h[H_MAGIC] != DILOCO_MAGIC) return "not a DiLoCo state (bad magic)";
    if (h[H_VERSION] != DILOCO_VERSION) return "unsupported DiLoCo state version";
    if (h[H_N] != d->n || h[H_DTYPE] != (uint64_t)d->dtype) return "parameter count or dtype differs";
    if (h[H_FRAGS] != (uint64_t)d->nfrag || h[H_SPLIT] != (uint64_t)d->o.split ||
        h[H_LAYOUT] != d->layout_hash)
        return "layout, split or fragments differ";
    if (h[H_SYNC] != (uint64_t)d->o.sync_every || h[H_DELAY] != (uint64_t)d->o.delay ||
        h[H_INNER] != (uint64_t)d->o.inner_period)
        return "sync_every, delay or inner_period differs (the schedule would mean something else)";
    if (h[H_COMBINE] != (uint64_t)d->o.combine || h[H_COMPRESSION] != (uint64_t)d->o.compression)
        return "combine or compression differs (the exchange buffer would mean something else)";
    if (h[H_SHARDED] != (uint64_t)d->o.memory_efficient)
        return "memory_efficient differs (a shard cannot stand for the whole state)";
    /* The unsharded state is identical on every rank, so it may be loaded with another number
     * of ranks; a shard belongs to one rank of one layout. */
    if (d->o.memory_efficient &&
        (h[H_NRANKS] != (uint64_t)d->nranks || h[H_RANK] != (uint64_t)d->rank))
        return "memory-efficient state of another rank or number of ranks";
    if (h[H_ANCHORED] > 1) return "corrupt anchor flag";
    if (h[H_ANCHORED] == 0 && h[H_STEPS] != 0) return "steps counted before the anchors were taken";
    if (h[H_PENDING] > (uint64_t)d->nfrag) return "corrupt exchange in flight";
    if (h[H_PENDING] &&
        !(h[H_APPLY_AT] > h[H_STEPS] && h[H_APPLY_AT] <= h[H_STEPS] + (uint64_t)d->o.delay))
        return "an exchange in flight outside its delay";
    if (h[H_RESULT] >= SUMO_RESULT_COUNT) return "corrupt exchange result";
    return NULL;
}

sumo_result sumo_diloco_state_load(sumo_diloco *d, const void *buffer, size_t bytes)
{
    size_t need;
    SUMO__CHECK(sumo_diloco_state_size(d, &need));
    if (buffer == NULL || bytes != need) return SUMO_ERR_INVALID_ARGUMENT;
    uint64_t h[H_COUNT];
    memcpy(h, buffer, sizeof h);
    const unsigned char *body = (const unsigned char *)buffer + sizeof h;
    const char *why = check_header(d, h);
    if (why == NULL) {
        /* A NaN in a loaded anchor or momentum would surface only as NaN parameters later. */
        size_t bad;
        const sumo__exec host = sumo__host_exec();
        SUMO__CHECK(sumo__k_first_nonfinite(&host, d->dtype, body, 2 * d->local, &bad));
        if (bad != SIZE_MAX) why = "non-finite value in an anchor or outer momentum";
    }
    if (why != NULL) {
        SUMO__LOG(d->log_level, SUMO__LOG_WARN, "diloco state load: %s", why);
        return SUMO_ERR_INVALID_ARGUMENT;
    }
    sumo__diloco_settle(d); /* a request of this object's own past is waited on, its result dropped */
    size_t state = sumo__diloco_state_elems(d) * d->esz;
    const unsigned char *p = body + state;
    for (int f = 0; f < d->nfrag; f++) {
        size_t b = agg_bytes(d, f);
        if (b) SUMO__CHECK(sumo_aggregator_state_load(d->frags[f].agg, p, b));
        p += b;
    }
    SUMO__CHECK(sumo__diloco_gossip_load(&d->gb, p, d->k));
    const sumo__exec x = {.k = d->k};
    SUMO__CHECK(sumo__k_copy(&x, d->x0, body, state));
    d->steps = h[H_STEPS];
    d->anchored = h[H_ANCHORED] != 0;
    d->pending = (int)h[H_PENDING] - 1;
    d->apply_at = h[H_APPLY_AT];
    memcpy(&d->gamma, &h[H_GAMMA], sizeof d->gamma);
    d->result = (sumo_result)h[H_RESULT];
    /* The parameters saved with this state were common where the last end applied a
     * whole-model exchange or an inner average (or nothing was taken yet). */
    const sumo_diloco_options *o = &d->o;
    uint64_t k = d->steps;
    d->synchronized = d->nranks == 1 || k == 0 ||
                      (d->nfrag == 1 && o->delay == 0 && o->merge_alpha == 0 &&
                       o->sync_every > 0 && k % (uint64_t)o->sync_every == 0) ||
                      (o->inner_period > 0 && k % (uint64_t)o->inner_period == 0);
    return SUMO_SUCCESS;
}

sumo_result sumo_diloco_stats(const sumo_diloco *d, sumo_comm_stats *stats)
{
    if (d == NULL || stats == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *stats = d->stats;
    sumo__diloco_gossip_stats(&d->gb, stats);
    return SUMO_SUCCESS;
}

sumo_result sumo_diloco_extra_memory(const sumo_diloco *d, size_t *bytes)
{
    if (d == NULL || bytes == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *bytes = sumo__diloco_state_elems(d) * d->esz + sumo__diloco_gossip_extra(&d->gb);
    return SUMO_SUCCESS;
}
