/*
 * sumo's one outer loop (sumo_diloco.h; docs/design/diloco.md and slowmo.md) over the public
 * collectives of its communicator: SlowMo, Local SGD, BMUF, DiLoCo and Streaming DiLoCo are
 * its presets. Checkpoints and the queries live in diloco_state.c.
 *
 * State, in the parameters' memory, in fragment order (each fragment's elements gathered in
 * model order): the anchors x0 (n), the outer momenta v (n), and the exchange buffer E (the
 * largest fragment), which holds the fragment's parameters or outer gradient while it is on
 * the wire. At most one exchange is in flight (delay <= H / F), so one E is enough. With one
 * fragment, delay 0, merge 0 and the uncompressed average (SlowMo's and DiLoCo's settings)
 * there is no E: the parameters are averaged in place, since the outer step overwrites them.
 * Sharded (memory_efficient, which needs those settings), x0 and v hold this rank's slice and
 * the tail.
 *
 * The end of local step k (counted from 1 over the whole run):
 *   1. the exchange that started at k - delay, if any, is waited for and applied: the kernel
 *      table's outer_update per run of the fragment (the outer step from the anchor, the new
 *      anchor, the merge into the local parameters), then the new anchor is scanned for NaN
 *      and Inf (the anchor is the same on every rank, so is the verdict);
 *   2. the fragment due at k (k = first_f mod H) starts: its parameters, or its outer gradient
 *      x0 - theta (the delta kernel, rounded once), are gathered into E and handed to the
 *      combine's asynchronous collective; with delay 0 it is applied at once (step 1);
 *   3. otherwise, with inner_period > 0 and k a multiple of it, every parameter is averaged.
 * The order matters where delay equals the spacing of two fragments: the one applied leaves
 * the wire before the next starts.
 *
 * Exchanging the parameters themselves (fp32 average) rather than their change is SlowMo's
 * exchange, whose bits the heavy-ball outer step then keeps. The other combines (compression,
 * Adasum, ACGA) need the change: a quantised parameter would lose the small difference the
 * outer step lives on, and Adasum of parameters means nothing.
 */
#include "optimizers/diloco_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- options ---------------------------------------------------------------------------- */

sumo_result sumo_diloco_options_default(sumo_diloco_preset preset, sumo_diloco_options *o)
{
    if (o == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *o = (sumo_diloco_options){.struct_size = sizeof *o, .sync_every = 500, .fragments = 1,
                               .outer = SUMO_OUTER_NESTEROV, .lr = 0.7, .momentum = 0.9,
                               .combine = SUMO_COMBINE_AVERAGE,
                               .compression = SUMO_COMPRESS_NONE, .block_size = 128,
                               .gossip_peers = 1, .gossip_staleness = 1};
    switch (preset) {
    case SUMO_DILOCO_PRESET_DILOCO: return SUMO_SUCCESS;
    case SUMO_DILOCO_PRESET_STREAMING:
        o->fragments = 4;
        o->delay = 1;
        o->merge_alpha = 0.5;
        o->compression = SUMO_COMPRESS_E3M0;
        return SUMO_SUCCESS;
    case SUMO_DILOCO_PRESET_LOCALSGD:
    case SUMO_DILOCO_PRESET_SLOWMO:
    case SUMO_DILOCO_PRESET_BMUF:
    case SUMO_DILOCO_PRESET_SGP:
    case SUMO_DILOCO_PRESET_OSGP:
    case SUMO_DILOCO_PRESET_DPSGD:
    case SUMO_DILOCO_PRESET_SLOWMO_SGP:
        /* SlowMo's paper: tau 12 for a Local SGD base, alpha 1 everywhere; beta 0.5 is
         * fairscale's default, and BMUF's block momentum; Local SGD has none. */
        o->sync_every = 12;
        o->outer = SUMO_OUTER_HEAVY_BALL;
        o->lr = 1.0;
        o->momentum = preset == SUMO_DILOCO_PRESET_LOCALSGD ? 0.0 : 0.5;
        /* The gossip bases alone: no exact average, so no outer step; SlowMo over them: tau
         * 48, the paper's with gossip bases. */
        if (preset >= SUMO_DILOCO_PRESET_SGP) {
            o->base = preset == SUMO_DILOCO_PRESET_OSGP    ? SUMO_BASE_OSGP
                      : preset == SUMO_DILOCO_PRESET_DPSGD ? SUMO_BASE_DPSGD
                                                           : SUMO_BASE_SGP;
            o->sync_every = preset == SUMO_DILOCO_PRESET_SLOWMO_SGP ? 48 : 0;
            if (preset != SUMO_DILOCO_PRESET_SLOWMO_SGP) o->momentum = 0.0;
        }
        return SUMO_SUCCESS;
    default: return SUMO_ERR_INVALID_ARGUMENT;
    }
}

static bool from_average(const sumo_diloco_options *o)
{
    return o->combine == SUMO_COMBINE_AVERAGE && o->compression == SUMO_COMPRESS_NONE;
}

static const char *check_options(const sumo_diloco_options *o, sumo_dtype dtype, size_t ntensors,
                                 size_t n)
{
    const char *bad = SUMO__STRUCT_SIZE_PROBLEM(o, sumo_diloco_options, NULL, 0);
    if (bad == NULL && o->acga) bad = SUMO__STRUCT_SIZE_PROBLEM(o->acga, sumo_acga_options, NULL, 0);
    if (bad) return bad;
    if (dtype != SUMO_FLOAT32 && dtype != SUMO_FLOAT64) return "parameters must be fp32 or fp64";
    if (o->base != SUMO_BASE_LOCAL) return sumo__diloco_gossip_check(o);
    if (o->gossip_per_node != 0) return "gossip_per_node needs a gossip base (base SGP, OSGP or DPSGD)";
    if (o->sync_every < 1) return "sync_every (H) must be >= 1";
    if (o->fragments < 1 || o->fragments > o->sync_every)
        return "fragments (F) must be in [1, sync_every]: one fragment syncs at a time";
    if (o->split != SUMO_SPLIT_TENSORS && o->split != SUMO_SPLIT_RANGES)
        return "split must be SUMO_SPLIT_TENSORS or SUMO_SPLIT_RANGES";
    if (o->split == SUMO_SPLIT_TENSORS && (size_t)o->fragments > ntensors)
        return "fragments (F) exceeds the number of tensors (a fragment is whole tensors; "
               "SUMO_SPLIT_RANGES cuts them)";
    if (o->split == SUMO_SPLIT_RANGES && (size_t)o->fragments > n)
        return "fragments (F) exceeds the number of parameters";
    if (o->split == SUMO_SPLIT_RANGES && o->fragment_of)
        return "fragment_of assigns whole tensors: it needs SUMO_SPLIT_TENSORS";
    if (o->delay < 0 || o->delay > o->sync_every / o->fragments)
        return "delay must be in [0, sync_every / fragments]: at most one exchange in flight";
    if (!(o->merge_alpha >= 0 && o->merge_alpha <= 1)) return "merge_alpha must be in [0, 1]";
    if (o->outer != SUMO_OUTER_NESTEROV && o->outer != SUMO_OUTER_HEAVY_BALL)
        return "outer must be SUMO_OUTER_NESTEROV or SUMO_OUTER_HEAVY_BALL";
    if (!(o->lr > 0) || !isfinite(o->lr)) return "lr (the outer rate, or alpha) must be finite and > 0";
    if (!(o->momentum >= 0 && o->momentum < 1)) return "momentum must be in [0, 1)";
    if ((unsigned)o->combine > (unsigned)SUMO_COMBINE_ACGA)
        return "combine must be SUMO_COMBINE_AVERAGE, SUMO_COMBINE_ADASUM or SUMO_COMBINE_ACGA";
    if (o->compression != SUMO_COMPRESS_NONE) {
        sumo_compression c;
        sumo_compression_default(o->compression, &c);
        c.block_size = o->block_size;
        size_t b;
        if (sumo_compressed_bytes(&c, 1, &b) != SUMO_SUCCESS)
            return "compression must be a sumo_compression_format, with block_size a multiple "
                   "of 8 in [8, 65536]";
        if (o->combine != SUMO_COMBINE_AVERAGE) return "compression needs the average combine";
        if (dtype != SUMO_FLOAT32) return "compression needs fp32 parameters";
    }
    if (o->combine == SUMO_COMBINE_ACGA && dtype != SUMO_FLOAT32) return "ACGA needs fp32 parameters";
    if (o->inner_period < 0) return "inner_period must be >= 0 (0: no inner averaging)";
    if (o->inner_period > 0 &&
        (o->fragments != 1 || o->delay != 0 || !from_average(o) || o->sync_every % o->inner_period))
        return "inner_period > 0 needs one fragment, delay 0, the uncompressed average and "
               "sync_every a multiple of it (the sync must fall on an inner boundary)";
    if (o->memory_efficient != 0 && o->memory_efficient != 1) return "memory_efficient must be 0 or 1";
    if (o->memory_efficient && (o->fragments != 1 || o->delay != 0 || o->merge_alpha != 0 ||
                                !from_average(o)))
        return "memory_efficient needs one fragment, delay 0, merge_alpha 0 and the uncompressed "
               "average (each rank updates its slice of the averaged parameters)";
    return NULL;
}

/* The fragment of every tensor: the caller's, or contiguous runs of whole tensors cut where the
 * running element count first reaches f n / F, each fragment at least one tensor. */
static const char *assign(sumo_diloco *d, const int *fragment_of)
{
    int F = d->o.fragments;
    size_t T = d->ntensors;
    if (fragment_of) {
        for (size_t t = 0; t < T; t++) {
            if (fragment_of[t] < 0 || fragment_of[t] >= F)
                return "fragment_of holds a value outside [0, fragments)";
            d->fragment_of[t] = fragment_of[t];
        }
        return NULL;
    }
    size_t t = 0, sum = 0, n = d->n, uF = (size_t)F;
    for (int f = 0; f < F; f++) {
        /* Fragment f ends at the first tensor boundary where the count reaches
         * ceil((f + 1) n / F) (in integers), leaving one tensor for each fragment after it. */
        size_t k = (size_t)f + 1, target = n / uF * k + (n % uF * k + uF - 1) / uF;
        do {
            d->fragment_of[t] = f;
            sum += d->tcounts[t];
            t++;
        } while (t < T - (uF - k) && (sum < target || f == F - 1));
    }
    return NULL;
}

static void frags_free(sumo_diloco *d)
{
    for (int f = 0; d->frags && f < d->nfrag; f++) {
        free(d->frags[f].run_off);
        free(d->frags[f].run_len);
        free(d->frags[f].tcounts);
        sumo_aggregator_destroy(d->frags[f].agg);
    }
    free(d->frags);
    d->frags = NULL;
}

/* Appends [off, off + len) of tensor piece to fragment fr (runs merge when adjacent). */
static void frag_add(sumo__frag *fr, size_t off, size_t len)
{
    fr->tcounts[fr->ntensors++] = len;
    fr->n += len;
    if (len == 0) return;
    if (fr->nruns > 0 && fr->run_off[fr->nruns - 1] + fr->run_len[fr->nruns - 1] == off) {
        fr->run_len[fr->nruns - 1] += len;
    } else {
        fr->run_off[fr->nruns] = off;
        fr->run_len[fr->nruns++] = len;
    }
}

/* [lo, hi) of fragment f under SUMO_SPLIT_RANGES: floor(f n / F) without overflow. */
static size_t range_edge(size_t n, size_t F, size_t f)
{
    return n / F * f + n % F * f / F;
}

/* Fragments from the split: runs, layouts, gathered offsets, first sync steps. */
static const char *build_frags(sumo_diloco *d)
{
    int F = d->o.fragments;
    bool ranges = d->o.split == SUMO_SPLIT_RANGES;
    d->nfrag = F;
    d->frags = calloc((size_t)F, sizeof *d->frags);
    if (d->frags == NULL) return "out of memory";
    size_t base = 0;
    for (int f = 0; f < F; f++) {
        sumo__frag *fr = &d->frags[f];
        size_t lo = ranges ? range_edge(d->n, (size_t)F, (size_t)f) : 0;
        size_t hi = ranges ? range_edge(d->n, (size_t)F, (size_t)f + 1) : d->n;
        size_t cap = 0, off = 0;
        for (size_t t = 0; t < d->ntensors; off += d->tcounts[t], t++)
            cap += ranges ? off < hi && off + d->tcounts[t] > lo : d->fragment_of[t] == f;
        if (cap == 0) return "a fragment has no tensor";
        fr->run_off = malloc(cap * sizeof *fr->run_off);
        fr->run_len = malloc(cap * sizeof *fr->run_len);
        fr->tcounts = malloc(cap * sizeof *fr->tcounts);
        if (!fr->run_off || !fr->run_len || !fr->tcounts) return "out of memory";
        off = 0;
        for (size_t t = 0; t < d->ntensors; off += d->tcounts[t], t++) {
            size_t end = off + d->tcounts[t];
            if (!ranges && d->fragment_of[t] == f) frag_add(fr, off, d->tcounts[t]);
            if (ranges && off < hi && end > lo)
                frag_add(fr, SUMO__MAX(off, lo), (end < hi ? end : hi) - SUMO__MAX(off, lo));
        }
        if (fr->n == 0) return "a fragment has no elements (only empty tensors)";
        fr->base = base;
        base += fr->n;
        fr->first = (uint64_t)(((uint64_t)(f + 1) * (uint64_t)d->o.sync_every) / (uint64_t)F);
        d->maxfrag = SUMO__MAX(d->maxfrag, fr->n);
    }
    return NULL;
}

/* x0, v (zeroed: v_0 = 0) and E in the memory of table k. */
static sumo_result alloc_state(sumo_diloco *d, const sumo_kernel_table *k)
{
    const sumo__exec x = {.k = k};
    void *p = NULL;
    size_t elems = sumo__diloco_state_elems(d);
    SUMO__CHECK(k->alloc(k->ctx, elems * d->esz, &p));
    sumo_result r = sumo__k_fill(&x, d->dtype, p, 0.0, elems);
    if (r != SUMO_SUCCESS) {
        k->release(k->ctx, p);
        return r;
    }
    d->x0 = p;
    d->v = d->x0 + d->local * d->esz;
    d->e = d->v + d->local * d->esz;
    d->k = k;
    return SUMO_SUCCESS;
}

static uint64_t fingerprint(const sumo_diloco *d)
{
    const sumo_diloco_options *o = &d->o;
    double f[] = {o->sync_every, o->fragments, o->split, o->delay, o->merge_alpha, o->outer,
                  o->lr, o->momentum, o->combine, o->compression, (double)o->block_size,
                  o->inner_period, o->memory_efficient, (double)d->n, d->dtype, d->acga.beta,
                  d->acga.per_tensor, d->acga.eps, d->acga.negative_guard, d->acga.rescale,
                  d->acga.reference_permutation, o->base, o->gossip_peers, o->gossip_staleness};
    uint64_t h = sumo__fnv1a(d->layout_hash, f, sizeof f);
    /* Mixed in only when set: every other run keeps the fingerprint it had. */
    if (o->gossip_per_node) h = sumo__fnv1a(h, &o->gossip_per_node, sizeof o->gossip_per_node);
    return h;
}

/* The layout, the split, the shard and the state; NULL or why not. */
static const char *setup(sumo_diloco *d, const size_t *tensor_counts, size_t ntensors,
                         const sumo_diloco_options *options)
{
    size_t T = d->ntensors;
    d->tcounts = malloc(T * sizeof *d->tcounts);
    d->fragment_of = malloc(T * sizeof *d->fragment_of);
    if (d->tcounts == NULL || d->fragment_of == NULL) return "out of memory";
    size_t sum = 0;
    for (size_t t = 0; t < T; t++) {
        d->tcounts[t] = ntensors ? tensor_counts[t] : d->n;
        sum += d->tcounts[t];
    }
    if (sum != d->n) return "the tensor counts do not add up to nparams";
    const char *why = d->o.split == SUMO_SPLIT_TENSORS ? assign(d, options->fragment_of) : NULL;
    if (why == NULL) why = build_frags(d);
    if (why != NULL) return why;
    d->layout_hash = sumo__fnv1a(sumo__fnv1a(SUMO__FNV_OFFSET, d->tcounts, T * sizeof *d->tcounts),
                                 d->fragment_of, d->o.split == SUMO_SPLIT_TENSORS ? T * sizeof *d->fragment_of : 0);
    const sumo_diloco_options *o = &d->o;
    d->in_place = o->fragments == 1 && o->delay == 0 && o->merge_alpha == 0 && from_average(o);
    d->ebuf = d->in_place ? 0 : d->maxfrag;
    if (o->memory_efficient) {
        size_t N = (size_t)d->nranks;
        d->shard = d->n / N;
        d->tail = d->n % N;
        d->offset = (size_t)d->rank * d->shard;
    } else {
        d->shard = d->n;
    }
    d->local = d->shard + d->tail; /* >= 1 since n >= 1 */
    /* Host memory until the parameters say where they live (the first begin). */
    if (alloc_state(d, sumo__host_kernels()) != SUMO_SUCCESS) return "no memory for the anchors and momenta";
    return NULL;
}

sumo_result sumo_diloco_create(sumo_comm *comm, const size_t *tensor_counts, size_t ntensors,
                               size_t nparams, sumo_dtype dtype, const sumo_diloco_options *options,
                               sumo_diloco **out)
{
    if (comm == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    sumo_diloco *d = calloc(1, sizeof *d);
    sumo_result local = SUMO_ERR_INVALID_ARGUMENT;
    const char *why = NULL;
    size_t T = ntensors ? ntensors : 1;
    if (d == NULL) why = "out of memory";
    else if (options == NULL || out == NULL) why = "NULL options or out";
    else if (nparams == 0) why = "no parameters";
    else if (ntensors > 0 && tensor_counts == NULL) why = "NULL tensor_counts with ntensors > 0";
    else why = check_options(options, dtype, T, nparams);
    if (why == NULL) {
        d->comm = comm;
        d->o = *options;
        d->o.fragment_of = NULL; /* the copy in setup is the object's own */
        d->dtype = dtype;
        d->esz = sumo__dtype_bytes(dtype);
        d->n = nparams;
        d->ntensors = T;
        d->pending = -1;
        d->synchronized = true;
        d->rank = comm->tp->rank;
        d->nranks = comm->tp->size;
        d->log_level = comm->tp->log_level;
        sumo_aggregator_options ao;
        sumo_aggregator_options_default(SUMO_AGGREGATE_ACGA, &ao);
        d->acga = ao.acga;
        /* ACGA's plain result has the norm of a unit vector; an outer step needs the size of
         * the model change, so by default it is rescaled to the mean change's norm. */
        d->acga.rescale = 1;
        if (options->acga) d->acga = *options->acga;
        d->o.acga = &d->acga;
        why = setup(d, tensor_counts, ntensors, options);
    }
    if (why != NULL) {
        if (d == NULL || strncmp(why, "out of memory", 13) == 0 || strncmp(why, "no memory", 9) == 0)
            local = SUMO_ERR_SYSTEM;
        SUMO__COMM_FAIL(comm, local, "diloco create: %s", why);
    }
    sumo_result r = sumo__agree_setup(comm, why ? local : SUMO_SUCCESS, why ? 0 : fingerprint(d),
                                      "diloco create (options, layout, fragments, dtype)");
    /* The combines that keep a layout or state: one aggregator per fragment, created alike on
     * every rank (collective, in fragment order). */
    if (r == SUMO_SUCCESS && d->o.combine != SUMO_COMBINE_AVERAGE) {
        for (int f = 0; f < d->nfrag && r == SUMO_SUCCESS; f++) {
            sumo_aggregator_options ao;
            sumo_aggregator_options_default(d->o.combine == SUMO_COMBINE_ADASUM ? SUMO_AGGREGATE_ADASUM
                                                                                : SUMO_AGGREGATE_ACGA,
                                            &ao);
            ao.tensor_counts = d->frags[f].tcounts;
            ao.ntensors = d->frags[f].ntensors;
            if (d->o.combine == SUMO_COMBINE_ACGA) ao.acga = d->acga;
            r = sumo_aggregator_create(comm, &ao, &d->frags[f].agg);
        }
    }
    if (r == SUMO_SUCCESS) r = sumo__diloco_gossip_create(&d->gb, comm, &d->o, d->n, d->dtype);
    if (r != SUMO_SUCCESS) {
        sumo_diloco_destroy(d);
        return r;
    }
    *out = d;
    return SUMO_SUCCESS;
}

sumo_result sumo_diloco_destroy(sumo_diloco *d)
{
    if (d == NULL) return SUMO_SUCCESS;
    if (d->req) sumo_request_wait(d->req); /* every request is waited on */
    if (d->x0) d->k->release(d->k->ctx, d->x0);
    sumo__diloco_gossip_free(&d->gb);
    frags_free(d);
    free(d->tcounts);
    free(d->fragment_of);
    free(d);
    return SUMO_SUCCESS;
}

/* ---- the step ----------------------------------------------------------------------------- */

void sumo__diloco_settle(sumo_diloco *d)
{
    if (d->req == NULL) return;
    d->result = sumo_request_wait(d->req);
    d->req = NULL;
}

/* The kernels of the parameters' memory; the state moves there the first time. */
static sumo_result params_exec(sumo_diloco *d, const void *params, sumo__exec *x)
{
    x->k = sumo__kernels_for(d->comm, params, d->n * d->esz);
    x->stream = NULL;
    if (x->k == d->k) return SUMO_SUCCESS;
    sumo__diloco_settle(d); /* E is about to move */
    unsigned char *old = d->x0;
    const sumo_kernel_table *oldk = d->k;
    SUMO__CHECK(alloc_state(d, x->k));
    sumo_result r = sumo__k_copy(x, d->x0, old, sumo__diloco_state_elems(d) * d->esz);
    oldk->release(oldk->ctx, old);
    return r;
}

sumo_result sumo_diloco_begin(sumo_diloco *d, const void *params)
{
    if (d == NULL || params == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    if (d->anchored) return SUMO_SUCCESS;
    sumo__exec x;
    SUMO__CHECK(params_exec(d, params, &x));
    const unsigned char *p = params;
    size_t esz = d->esz;
    if (d->o.memory_efficient) { /* the slice, then the tail */
        SUMO__CHECK(sumo__k_copy(&x, d->x0, p + d->offset * esz, d->shard * esz));
        SUMO__CHECK(sumo__k_copy(&x, d->x0 + d->shard * esz, p + (d->n - d->tail) * esz, d->tail * esz));
    }
    for (int f = 0; f < d->nfrag && !d->o.memory_efficient; f++) {
        const sumo__frag *fr = &d->frags[f];
        size_t at = fr->base;
        for (size_t r = 0; r < fr->nruns; at += fr->run_len[r], r++)
            SUMO__CHECK(sumo__k_copy(&x, d->x0 + at * esz, p + fr->run_off[r] * esz, fr->run_len[r] * esz));
    }
    d->anchored = true;
    return SUMO_SUCCESS;
}

void sumo__diloco_unanchor(sumo_diloco *d) { d->anchored = false; }

bool sumo__diloco_anchored(const sumo_diloco *d) { return d->anchored; }

/* The fragment whose exchange starts at the end of step k (>= 1), or -1. */
static int starting(const sumo_diloco *d, uint64_t k)
{
    if (d->o.sync_every == 0) return -1; /* a gossip base alone: never */
    uint64_t r = (k - 1) % (uint64_t)d->o.sync_every + 1;
    for (int f = 0; f < d->nfrag; f++)
        if (d->frags[f].first == r) return f;
    return -1;
}

/* Whether step k (>= 1) ends with an inner average (no exchange starts there). */
static bool inner_due(const sumo_diloco *d, uint64_t k)
{
    return d->o.inner_period > 0 && k % (uint64_t)d->o.inner_period == 0 && starting(d, k) < 0;
}

sumo_result sumo_diloco_due(const sumo_diloco *d, int *what, int *applied, int *started)
{
    if (d == NULL || what == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    uint64_t next = d->steps + 1;
    int a = d->pending >= 0 && d->apply_at == next ? d->pending : -1;
    int s = starting(d, next);
    if (a < 0 && s >= 0 && d->o.delay == 0) a = s;
    *what = (a >= 0 ? SUMO_DILOCO_APPLY : 0) | (s >= 0 ? SUMO_DILOCO_START : 0) |
            (inner_due(d, next) || d->gb.gossip ? SUMO_DILOCO_AVERAGE : 0);
    if (applied) *applied = a;
    if (started) *started = s;
    return SUMO_SUCCESS;
}

static sumo_result average_all(sumo_diloco *d, void *params)
{
    d->stats.rounds++;
    d->stats.bytes += (uint64_t)d->n * d->esz;
    return sumo_allreduce(params, params, d->n, d->dtype, SUMO_OP_AVERAGE, d->comm);
}

static sumo_result start(sumo_diloco *d, const sumo__exec *x, unsigned char *params, int f,
                         double lr)
{
    const sumo__frag *fr = &d->frags[f];
    size_t esz = d->esz, at = 0;
    sumo_result r;
    if (d->in_place) { /* delay 0: the average is applied at once */
        r = average_all(d, params);
    } else {
        for (size_t i = 0; i < fr->nruns; at += fr->run_len[i], i++) {
            const unsigned char *p = params + fr->run_off[i] * esz;
            unsigned char *e = d->e + at * esz;
            if (from_average(&d->o))
                SUMO__CHECK(sumo__k_copy(x, e, p, fr->run_len[i] * esz));
            else /* Delta_r = x0 - theta, rounded once */
                SUMO__CHECK(sumo__k_delta(x, d->dtype, e, d->x0 + (fr->base + at) * esz, p, fr->run_len[i]));
        }
        d->stats.rounds++;
        if (d->o.compression != SUMO_COMPRESS_NONE) {
            sumo_compression c;
            sumo_compression_default(d->o.compression, &c);
            c.block_size = d->o.block_size;
            size_t bytes = 0;
            sumo_compressed_bytes(&c, fr->n, &bytes);
            d->stats.bytes += bytes;
            r = sumo_allreduce_compressed_start((const float *)(const void *)d->e,
                                                (float *)(void *)d->e, fr->n, &c, d->comm, &d->req);
        } else {
            d->stats.bytes += (uint64_t)fr->n * esz;
            if (fr->agg)
                r = sumo_aggregator_apply_start(fr->agg, d->e, d->e, fr->n, d->dtype, &d->req);
            else
                r = sumo_allreduce_start(d->e, d->e, fr->n, d->dtype, SUMO_OP_AVERAGE, d->comm, &d->req);
        }
    }
    if (r != SUMO_SUCCESS) {
        d->req = NULL;
        return r;
    }
    d->pending = f;
    d->apply_at = d->steps + (uint64_t)d->o.delay;
    d->gamma = lr;
    d->result = SUMO_SUCCESS;
    return SUMO_SUCCESS;
}

/* The sharded outer step: this rank's slice and the tail of the parameters, averaged in place,
 * then the slices gathered from their owners. The scan runs on the rebuilt parameters,
 * identical everywhere, so every rank reaches the same verdict. */
static sumo_result apply_sharded(sumo_diloco *d, const sumo__exec *x, unsigned char *params,
                                 const sumo_outer_step *st, size_t *bad)
{
    size_t esz = d->esz;
    unsigned char *own = params + d->offset * esz, *tail = params + (d->n - d->tail) * esz;
    SUMO__CHECK(sumo__k_outer_update(x, d->dtype, own, own, d->v, d->x0, d->shard, st));
    SUMO__CHECK(sumo__k_outer_update(x, d->dtype, tail, tail, d->v + d->shard * esz,
                                     d->x0 + d->shard * esz, d->tail, st));
    if (d->shard > 0) {
        d->stats.rounds++;
        d->stats.bytes += (uint64_t)d->nranks * d->shard * esz;
        SUMO__CHECK(sumo_allgather(own, params, d->shard, d->dtype, d->comm));
    }
    return sumo__k_first_nonfinite(x, d->dtype, params, d->n, bad);
}

static sumo_result apply(sumo_diloco *d, const sumo__exec *x, unsigned char *params)
{
    int f = d->pending;
    const sumo__frag *fr = &d->frags[f];
    sumo__diloco_settle(d);
    d->pending = -1;
    if (d->result != SUMO_SUCCESS) return d->result;
    const sumo_diloco_options *o = &d->o;
    bool hb = o->outer == SUMO_OUTER_HEAVY_BALL;
    /* SlowMo's step is alpha gamma. */
    sumo_outer_step st = {.nesterov = !hb, .from_average = from_average(o),
                          .lr = hb ? o->lr * d->gamma : o->lr, .mu = o->momentum,
                          .gamma = hb ? d->gamma : 1.0, .merge = o->merge_alpha};
    size_t esz = d->esz, at = 0, bad;
    if (o->memory_efficient) {
        SUMO__CHECK(apply_sharded(d, x, params, &st, &bad));
    } else if (d->in_place) { /* one fragment: [0, n), the average in params */
        SUMO__CHECK(sumo__k_outer_update(x, d->dtype, params, params, d->v, d->x0, d->n, &st));
        SUMO__CHECK(sumo__k_first_nonfinite(x, d->dtype, d->x0, d->n, &bad));
    } else {
        for (size_t r = 0; r < fr->nruns; at += fr->run_len[r], r++) {
            size_t g = (fr->base + at) * esz;
            SUMO__CHECK(sumo__k_outer_update(x, d->dtype, params + fr->run_off[r] * esz,
                                             d->e + at * esz, d->v + g, d->x0 + g, fr->run_len[r], &st));
        }
        SUMO__CHECK(sumo__k_first_nonfinite(x, d->dtype, d->x0 + fr->base * esz, fr->n, &bad));
    }
    if (bad != SIZE_MAX) {
        SUMO__LOG(d->log_level, SUMO__LOG_WARN,
                  "outer step of fragment %d: element %zu of its %s is not finite (diverged "
                  "local steps, or an outer momentum beyond its type for lr %g)",
                  f, bad, o->memory_efficient ? "parameters" : "anchor", d->gamma);
        return SUMO_ERR_NONFINITE;
    }
    return SUMO_SUCCESS;
}

sumo_result sumo_diloco_end(sumo_diloco *d, void *params, double lr, int *communicated)
{
    if (communicated) *communicated = 0;
    if (d == NULL || params == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    if (!(lr >= 0) || !isfinite(lr)) {
        SUMO__LOG(d->log_level, SUMO__LOG_WARN, "diloco step: lr %g must be finite and >= 0", lr);
        return SUMO_ERR_INVALID_ARGUMENT;
    }
    int s = starting(d, d->steps + 1);
    if (s >= 0 && lr == 0 && d->o.outer == SUMO_OUTER_HEAVY_BALL) {
        SUMO__LOG(d->log_level, SUMO__LOG_WARN,
                  "diloco step: lr 0 where fragment %d starts its exchange: the heavy-ball outer "
                  "step divides by the rate", s);
        return SUMO_ERR_INVALID_ARGUMENT;
    }
    if (!d->anchored) return SUMO_ERR_INVALID_USAGE; /* begin takes the anchors first */
    sumo__exec x;
    SUMO__CHECK(params_exec(d, params, &x));
    d->steps++;
    bool applied = false, started = false, averaged = false;
    sumo_result r = SUMO_SUCCESS;
    /* A gossip base's round belongs to the local step: before the exact average. */
    if (d->gb.gossip) r = sumo__diloco_gossip_step(&d->gb, &x, params, d->x0, s >= 0, &averaged);
    if (d->pending >= 0 && d->apply_at == d->steps) {
        applied = true;
        r = apply(d, &x, params);
    }
    if (r == SUMO_SUCCESS && s >= 0) {
        started = true;
        r = start(d, &x, params, s, lr);
        if (r == SUMO_SUCCESS && d->o.delay == 0) {
            applied = true;
            r = apply(d, &x, params);
        }
    } else if (r == SUMO_SUCCESS && inner_due(d, d->steps)) {
        averaged = true;
        r = average_all(d, params);
    }
    if (d->gb.gossip && applied && r == SUMO_SUCCESS) r = sumo__diloco_gossip_synced(&d->gb, &x, params);
    if (communicated) *communicated = applied || started || averaged;
    if (d->gb.gossip) averaged = false; /* a round is no exact average */
    d->synchronized = d->nranks == 1 || (averaged && r == SUMO_SUCCESS) ||
                      (d->nfrag == 1 && applied && d->o.merge_alpha == 0 && r == SUMO_SUCCESS);
    return r;
}
