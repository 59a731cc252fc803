/*
 * The gossip bases of the outer loop (sumo_diloco.h's sumo_diloco_base; docs/design/gossip.md):
 * a round of sumo_gossip.h after every local step, on the built-in exponential graph, whose
 * in- and out-degrees are equal, so w is 1 after every completed round.
 *
 *   SGP     the round mixes the parameters after the step: x <- mix(x - lr g).
 *   OSGP    the numerator X is kept apart from the parameters z = X / w (the model computes
 *           on z, the optimizer's step moves the numerator): after the step,
 *           X <- X + (params - z) = (1 - 1/w) X + params, then one overlapped step
 *           (sumo_gossip_overlap), then params = X / w. So with staleness 1,
 *           x_i <- x_i / 2 - lr g_i + x_j(previous) / 2.
 *   D-PSGD  the pre-step parameters X are mixed and the step added: params <- mix(X) +
 *           (params - X), i.e. x <- mix(x) - lr g with g taken at x.
 * At an exact average (sync_every > 0) an overlapped round in flight completes and none
 * starts, so every rank's parameters are whole before the average; after the outer step the
 * base starts again from the new parameters.
 */
#include "optimizers/diloco_gossip.h"

#include "sumo_gossip.h"

#include <string.h>

const char *sumo__diloco_gossip_check(const sumo_diloco_options *o)
{
    if ((unsigned)o->base > (unsigned)SUMO_BASE_DPSGD)
        return "base must be SUMO_BASE_LOCAL, SUMO_BASE_SGP, SUMO_BASE_OSGP or SUMO_BASE_DPSGD";
    if (o->sync_every < 0) return "sync_every must be >= 0 with a gossip base (0: no exact average)";
    if (o->fragments != 1 || o->delay != 0 || o->merge_alpha != 0 || o->inner_period != 0 ||
        o->memory_efficient != 0 || o->combine != SUMO_COMBINE_AVERAGE ||
        o->compression != SUMO_COMPRESS_NONE || o->split != SUMO_SPLIT_TENSORS || o->fragment_of)
        return "a gossip base needs one fragment of whole tensors, delay 0, merge_alpha 0, no "
               "inner averaging, no sharding and the uncompressed average";
    if (o->outer != SUMO_OUTER_NESTEROV && o->outer != SUMO_OUTER_HEAVY_BALL)
        return "outer must be SUMO_OUTER_NESTEROV or SUMO_OUTER_HEAVY_BALL";
    if (!(o->lr > 0) || !(o->lr < 1e300)) return "lr (the outer rate, or alpha) must be finite and > 0";
    if (!(o->momentum >= 0 && o->momentum < 1)) return "momentum must be in [0, 1)";
    if (o->gossip_peers < 1) return "gossip_peers must be >= 1";
    if (o->gossip_staleness < 1) return "gossip_staleness must be >= 1";
    if (o->gossip_per_node != 0 && o->gossip_per_node != 1) return "gossip_per_node must be 0 or 1";
    /* D-PSGD adds each rank's own step after mixing the pre-step parameters: the node's
     * ranks would part by their steps, which no round averages. */
    if (o->gossip_per_node && o->base == SUMO_BASE_DPSGD)
        return "gossip_per_node needs base SGP or OSGP (D-PSGD adds each rank's own step after "
               "the mixing)";
    return NULL;
}

sumo_result sumo__diloco_gossip_create(sumo__gossip_base *b, sumo_comm *comm,
                                       const sumo_diloco_options *o, size_t n, sumo_dtype dtype)
{
    int size = 1;
    sumo_comm_size(comm, &size);
    *b = (sumo__gossip_base){.base = o->base, .n = n, .esz = sumo__dtype_bytes(dtype), .dtype = dtype};
    if (o->base == SUMO_BASE_LOCAL || size == 1) return SUMO_SUCCESS;
    sumo_gossip_options go;
    sumo_gossip_options_default(&go);
    go.mode = o->base == SUMO_BASE_DPSGD ? SUMO_GOSSIP_SYMMETRIC : SUMO_GOSSIP_PUSH_SUM;
    go.peers = o->gossip_peers;
    go.staleness = o->gossip_staleness;
    go.per_node = o->gossip_per_node;
    b->gx_elems = o->base == SUMO_BASE_OSGP ? n : o->base == SUMO_BASE_DPSGD ? 2 * n : 0;
    return sumo_gossip_create(comm, n, dtype, &go, &b->gossip);
}

void sumo__diloco_gossip_free(sumo__gossip_base *b)
{
    sumo_gossip_destroy(b->gossip);
    b->gossip = NULL;
    if (b->gx) b->gk->release(b->gk->ctx, b->gx);
    b->gx = NULL;
}

/* The numerator (OSGP) or pre-step parameters (D-PSGD) in the parameters' memory; a new one
 * starts from `from` (the parameters before this step's change is known). */
static sumo_result numerator(sumo__gossip_base *b, const sumo__exec *x, const void *from, bool *fresh)
{
    *fresh = false;
    if (b->gx && b->gk == x->k) return SUMO_SUCCESS;
    if (b->gx) return SUMO_ERR_INVALID_USAGE; /* the parameters moved memory mid-run */
    void *p;
    SUMO__CHECK(x->k->alloc(x->k->ctx, b->gx_elems * b->esz, &p));
    b->gx = p;
    b->gk = x->k;
    *fresh = true;
    return sumo__k_copy(x, b->gx, from, b->n * b->esz);
}

sumo_result sumo__diloco_gossip_step(sumo__gossip_base *b, const sumo__exec *x, void *params,
                                     const void *anchor, bool sync, bool *communicated)
{
    size_t n = b->n, bytes = n * b->esz;
    *communicated = false;
    if (b->base == SUMO_BASE_SGP) {
        *communicated = true;
        return sumo_gossip_round(b->gossip, params);
    }
    bool fresh;
    if (b->base == SUMO_BASE_DPSGD) {
        /* The first step's pre-step parameters are the anchor (one fragment, in model order). */
        SUMO__CHECK(numerator(b, x, anchor, &fresh));
        unsigned char *step = b->gx + bytes;
        SUMO__CHECK(sumo__k_copy(x, step, params, bytes));
        SUMO__CHECK(sumo__k_scaled_add(x, b->dtype, step, 1.0, b->gx, -1.0, n));
        SUMO__CHECK(sumo_gossip_round(b->gossip, b->gx));
        *communicated = true;
        SUMO__CHECK(sumo__k_add(x, b->dtype, params, b->gx, step, n));
        return sumo__k_copy(x, b->gx, params, bytes);
    }
    double w;
    sumo_gossip_weight(b->gossip, &w);
    SUMO__CHECK(numerator(b, x, params, &fresh));
    /* The step moved z by params - X / w; the numerator moves by the same. */
    if (!fresh) {
        if (w == 1.0) SUMO__CHECK(sumo__k_copy(x, b->gx, params, bytes));
        else SUMO__CHECK(sumo__k_scaled_add(x, b->dtype, b->gx, 1.0 - 1.0 / w, params, 1.0, n));
    }
    int in_flight = 0, c = 0;
    sumo_gossip_in_flight(b->gossip, &in_flight);
    if (sync) {
        if (in_flight) SUMO__CHECK(sumo_gossip_finish(b->gossip, b->gx));
        c = in_flight;
    } else {
        SUMO__CHECK(sumo_gossip_overlap(b->gossip, b->gx, &c));
    }
    *communicated = c != 0;
    sumo_gossip_weight(b->gossip, &w);
    SUMO__CHECK(sumo__k_copy(x, params, b->gx, bytes));
    if (w != 1.0) SUMO__CHECK(sumo__k_scaled_add(x, b->dtype, params, 1.0 / w, b->gx, 0.0, n));
    return SUMO_SUCCESS;
}

sumo_result sumo__diloco_gossip_synced(sumo__gossip_base *b, const sumo__exec *x, const void *params)
{
    if (b->gx == NULL) return SUMO_SUCCESS;
    double w;
    sumo_gossip_weight(b->gossip, &w);
    if (w != 1.0) return SUMO_ERR_INTERNAL; /* the regular graph keeps w at 1 */
    return sumo__k_copy(x, b->gx, params, b->n * b->esz);
}

/* ---- state: [base, has numerator] + the numerator (n elements) + the gossip state -------- */

enum { G_BASE, G_HAS, G_WORDS };

size_t sumo__diloco_gossip_state_size(const sumo__gossip_base *b)
{
    if (b->gossip == NULL) return 0;
    size_t gb = 0;
    sumo_gossip_state_size(b->gossip, &gb);
    return G_WORDS * sizeof(uint64_t) + b->n * b->esz + gb;
}

sumo_result sumo__diloco_gossip_save(sumo__gossip_base *b, unsigned char *p)
{
    if (b->gossip == NULL) return SUMO_SUCCESS;
    uint64_t h[G_WORDS] = {(uint64_t)b->base, b->gx != NULL};
    memcpy(p, h, sizeof h);
    p += sizeof h;
    size_t bytes = b->n * b->esz, gb = 0;
    if (b->gx) {
        const sumo__exec x = {.k = b->gk};
        SUMO__CHECK(sumo__k_copy(&x, p, b->gx, bytes));
    } else {
        memset(p, 0, bytes);
    }
    sumo_gossip_state_size(b->gossip, &gb);
    return sumo_gossip_state_save(b->gossip, p + bytes, gb);
}

sumo_result sumo__diloco_gossip_load(sumo__gossip_base *b, const unsigned char *p,
                                     const sumo_kernel_table *k)
{
    if (b->gossip == NULL) return SUMO_SUCCESS;
    uint64_t h[G_WORDS];
    memcpy(h, p, sizeof h);
    if (h[G_BASE] != (uint64_t)b->base || h[G_HAS] > 1) return SUMO_ERR_INVALID_ARGUMENT;
    p += sizeof h;
    size_t bytes = b->n * b->esz, gb = 0;
    sumo_gossip_state_size(b->gossip, &gb);
    SUMO__CHECK(sumo_gossip_state_load(b->gossip, p + bytes, gb));
    if (b->gx) b->gk->release(b->gk->ctx, b->gx);
    b->gx = NULL;
    if (!h[G_HAS]) return SUMO_SUCCESS;
    /* The numerator comes back in the memory the loop's state lives in. */
    const sumo__exec x = {.k = k};
    void *q;
    SUMO__CHECK(k->alloc(k->ctx, b->gx_elems * b->esz, &q));
    b->gx = q;
    b->gk = k;
    return sumo__k_copy(&x, b->gx, p, bytes);
}

size_t sumo__diloco_gossip_extra(const sumo__gossip_base *b)
{
    return b->gossip ? (b->gx_elems + 3 * b->n) * b->esz : 0;
}

void sumo__diloco_gossip_stats(const sumo__gossip_base *b, sumo_comm_stats *stats)
{
    if (b->gossip == NULL) return;
    sumo_comm_stats g;
    sumo_gossip_stats(b->gossip, &g);
    stats->rounds += g.rounds;
    stats->bytes += g.bytes;
}
