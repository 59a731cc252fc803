/*
 * The DiLoCo family's outer loop (sumo_diloco.h; docs/design/diloco.md) over the public
 * collectives of its communicator.
 *
 * State, in the parameters' memory, in fragment order (each fragment's elements gathered in
 * model order): the anchors x0 (n), the outer momenta v (n), and the exchange buffer E (the
 * largest fragment), which holds the fragment's parameters or outer gradient while it is on
 * the wire. At most one exchange is in flight (delay <= H / F), so one E is enough.
 *
 * The end of local step k (counted from 1 over the whole run):
 *   1. the exchange that started at k - delay, if any, is waited for and applied: the kernel
 *      table's outer_update per run of the fragment (the outer step from the anchor, the new
 *      anchor, the merge into the local parameters), then the new anchor is scanned for NaN
 *      and Inf (the anchor is the same on every rank, so is the verdict);
 *   2. the fragment due at k (k = first_f mod H) starts: its parameters, or its outer gradient
 *      x0 - theta (the delta kernel, rounded once), are gathered into E and handed to the
 *      combine's asynchronous collective; with delay 0 it is applied at once (step 1).
 * The order matters where delay equals the spacing of two fragments: the one applied leaves
 * the wire before the next starts.
 *
 * Exchanging the parameters themselves (fp32 average) rather than their change keeps the bits
 * of sumo_slowmo, which averages parameters: the same allreduce, then the same arithmetic in
 * outer_update's heavy-ball branch as slow_update. The other combines (compression, Adasum,
 * ACGA) need the change: a quantised parameter would lose the small difference the outer step
 * lives on, and Adasum of parameters means nothing.
 */
#include "sumo_diloco.h"
#include "collectives/collectives.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct frag {
    size_t n;          /* elements */
    size_t base;       /* first element in the gathered state */
    size_t nruns;
    size_t *run_off;   /* runs of consecutive parameters, model order */
    size_t *run_len;
    size_t ntensors;
    size_t *tcounts;   /* its tensors' element counts (Adasum's and ACGA's layout) */
    uint64_t first;    /* its first sync step, floor((f + 1) H / F) */
    sumo_aggregator *agg; /* ADASUM, ACGA */
} frag;

struct sumo_diloco {
    sumo_comm *comm;
    sumo_diloco_options o;
    sumo_acga_options acga;
    sumo_dtype dtype;
    size_t esz, n, ntensors;
    size_t *tcounts;
    int *fragment_of;  /* per tensor */
    int nranks, rank, log_level;
    int nfrag;
    frag *frags;
    size_t maxfrag;
    uint64_t layout_hash;
    unsigned char *x0, *v, *e; /* one allocation in the memory of k */
    const sumo_kernel_table *k;
    uint64_t steps;
    bool anchored, synchronized;
    /* the exchange in flight or completed and not yet applied */
    int pending;       /* fragment, -1 for none */
    uint64_t apply_at;
    double gamma;      /* the rate of its start step (HEAVY_BALL) */
    sumo_request *req; /* NULL once completed: its result is then `result` */
    sumo_result result;
    sumo_comm_stats stats;
};

/* ---- options ---------------------------------------------------------------------------- */

sumo_result sumo_diloco_options_preset(sumo_diloco_preset preset, sumo_diloco_options *o)
{
    if (o == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *o = (sumo_diloco_options){.struct_size = sizeof *o, .sync_every = 500, .fragments = 1,
                               .outer = SUMO_OUTER_NESTEROV, .lr = 0.7, .momentum = 0.9,
                               .combine = SUMO_COMBINE_AVERAGE,
                               .compression = SUMO_COMPRESS_NONE, .block_size = 128};
    switch (preset) {
    case SUMO_DILOCO_PRESET_DILOCO: return SUMO_SUCCESS;
    case SUMO_DILOCO_PRESET_STREAMING:
        o->fragments = 4;
        o->delay = 1;
        o->merge_alpha = 0.5;
        o->compression = SUMO_COMPRESS_E3M0;
        return SUMO_SUCCESS;
    case SUMO_DILOCO_PRESET_LOCALSGD:
        o->sync_every = 12;
        o->lr = 1.0;
        o->momentum = 0.0;
        return SUMO_SUCCESS;
    case SUMO_DILOCO_PRESET_SLOWMO:
    case SUMO_DILOCO_PRESET_BMUF:
        /* sumo_slowmo_options_preset's: tau 12, alpha 1, beta 0.5. */
        o->sync_every = 12;
        o->outer = SUMO_OUTER_HEAVY_BALL;
        o->lr = 1.0;
        o->momentum = 0.5;
        return SUMO_SUCCESS;
    default: return SUMO_ERR_INVALID_ARGUMENT;
    }
}

static const char *check_options(const sumo_diloco_options *o, sumo_dtype dtype, size_t ntensors)
{
    if (o->struct_size != sizeof *o)
        return "struct_size is not sizeof(sumo_diloco_options) of this library (fill the options "
               "with sumo_diloco_options_preset)";
    if (o->acga && o->acga->struct_size != sizeof *o->acga)
        return "acga->struct_size is not sizeof(sumo_acga_options) of this library (take the ACGA "
               "options from sumo_aggregator_options_default)";
    if (dtype != SUMO_FLOAT32 && dtype != SUMO_FLOAT64) return "parameters must be fp32 or fp64";
    if (o->sync_every < 1) return "sync_every (H) must be >= 1";
    if (o->fragments < 1 || o->fragments > o->sync_every)
        return "fragments (F) must be in [1, sync_every]: one fragment syncs at a time";
    if ((size_t)o->fragments > ntensors)
        return "fragments (F) exceeds the number of tensors (a fragment is whole tensors)";
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
        sumo_compression c = {.struct_size = sizeof c, .format = o->compression,
                              .block_size = o->block_size, .op = SUMO_OP_AVERAGE};
        size_t b;
        if (sumo_compressed_bytes(&c, 1, &b) != SUMO_SUCCESS)
            return "compression must be a sumo_compression_format, with block_size a multiple "
                   "of 8 in [8, 65536]";
        if (o->combine != SUMO_COMBINE_AVERAGE) return "compression needs the average combine";
        if (dtype != SUMO_FLOAT32) return "compression needs fp32 parameters";
    }
    if (o->combine == SUMO_COMBINE_ACGA && dtype != SUMO_FLOAT32) return "ACGA needs fp32 parameters";
    return NULL;
}

/* The fragment of every tensor: the caller's, or contiguous runs of whole tensors cut where the
 * running element count first reaches f n / F, each fragment at least one tensor. */
static const char *assign(sumo_diloco *d)
{
    int F = d->o.fragments;
    size_t T = d->ntensors;
    if (d->o.fragment_of) {
        for (size_t t = 0; t < T; t++) {
            if (d->o.fragment_of[t] < 0 || d->o.fragment_of[t] >= F)
                return "fragment_of holds a value outside [0, fragments)";
            d->fragment_of[t] = d->o.fragment_of[t];
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

/* Fragments from the assignment: runs, layouts, gathered offsets, first sync steps. */
static const char *build_frags(sumo_diloco *d)
{
    int F = d->o.fragments;
    d->nfrag = F;
    d->frags = calloc((size_t)F, sizeof *d->frags);
    if (d->frags == NULL) return "out of memory";
    size_t base = 0;
    for (int f = 0; f < F; f++) {
        frag *fr = &d->frags[f];
        size_t cap = 0;
        for (size_t t = 0; t < d->ntensors; t++) cap += d->fragment_of[t] == f;
        if (cap == 0) return "a fragment has no tensor";
        fr->run_off = malloc(cap * sizeof *fr->run_off);
        fr->run_len = malloc(cap * sizeof *fr->run_len);
        fr->tcounts = malloc(cap * sizeof *fr->tcounts);
        if (!fr->run_off || !fr->run_len || !fr->tcounts) return "out of memory";
        size_t off = 0;
        for (size_t t = 0; t < d->ntensors; off += d->tcounts[t], t++) {
            if (d->fragment_of[t] != f) continue;
            fr->tcounts[fr->ntensors++] = d->tcounts[t];
            fr->n += d->tcounts[t];
            if (d->tcounts[t] == 0) continue;
            if (fr->nruns > 0 && fr->run_off[fr->nruns - 1] + fr->run_len[fr->nruns - 1] == off) {
                fr->run_len[fr->nruns - 1] += d->tcounts[t];
            } else {
                fr->run_off[fr->nruns] = off;
                fr->run_len[fr->nruns++] = d->tcounts[t];
            }
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
    size_t elems = 2 * d->n + d->maxfrag;
    SUMO__CHECK(k->alloc(k->ctx, elems * d->esz, &p));
    sumo_result r = sumo__k_fill(&x, d->dtype, p, 0.0, elems);
    if (r != SUMO_SUCCESS) {
        k->release(k->ctx, p);
        return r;
    }
    d->x0 = p;
    d->v = d->x0 + d->n * d->esz;
    d->e = d->v + d->n * d->esz;
    d->k = k;
    return SUMO_SUCCESS;
}

static uint64_t fingerprint(const sumo_diloco *d)
{
    const sumo_diloco_options *o = &d->o;
    double f[] = {o->sync_every, o->fragments, o->delay, o->merge_alpha, o->outer, o->lr,
                  o->momentum, o->combine, o->compression, (double)o->block_size,
                  (double)d->n, d->dtype, d->acga.beta, d->acga.per_tensor, d->acga.eps,
                  d->acga.negative_guard, d->acga.rescale, d->acga.reference_permutation};
    return sumo__fnv1a(d->layout_hash, f, sizeof f);
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
    else why = check_options(options, dtype, T);
    if (why == NULL) {
        d->comm = comm;
        d->o = *options;
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
        d->tcounts = malloc(T * sizeof *d->tcounts);
        d->fragment_of = malloc(T * sizeof *d->fragment_of);
        d->o.fragment_of = NULL; /* the copy below is the object's own */
        if (d->tcounts == NULL || d->fragment_of == NULL) why = "out of memory";
    }
    if (why == NULL) {
        size_t sum = 0;
        for (size_t t = 0; t < T; t++) {
            d->tcounts[t] = ntensors ? tensor_counts[t] : nparams;
            sum += d->tcounts[t];
        }
        if (sum != nparams) why = "the tensor counts do not add up to nparams";
    }
    if (why == NULL) {
        d->o.fragment_of = options->fragment_of;
        why = assign(d);
        d->o.fragment_of = NULL;
    }
    if (why == NULL) why = build_frags(d);
    if (why == NULL) {
        d->layout_hash = sumo__fnv1a(sumo__fnv1a(SUMO__FNV_OFFSET, d->tcounts, T * sizeof *d->tcounts),
                                     d->fragment_of, T * sizeof *d->fragment_of);
        local = alloc_state(d, sumo__host_kernels());
        if (local != SUMO_SUCCESS) why = "no memory for the anchors and momenta";
    }
    if (why != NULL) {
        if (d == NULL || strcmp(why, "out of memory") == 0) local = SUMO_ERR_SYSTEM;
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
    frags_free(d);
    free(d->tcounts);
    free(d->fragment_of);
    free(d);
    return SUMO_SUCCESS;
}

/* ---- the step ----------------------------------------------------------------------------- */

/* The exchange in flight completes now; its result is kept for the apply. */
static void settle(sumo_diloco *d)
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
    settle(d); /* E is about to move */
    unsigned char *old = d->x0;
    const sumo_kernel_table *oldk = d->k;
    SUMO__CHECK(alloc_state(d, x->k));
    sumo_result r = sumo__k_copy(x, d->x0, old, (2 * d->n + d->maxfrag) * d->esz);
    oldk->release(oldk->ctx, old);
    return r;
}

sumo_result sumo_diloco_begin(sumo_diloco *d, const void *params)
{
    if (d == NULL || params == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    if (d->anchored) return SUMO_SUCCESS;
    sumo__exec x;
    SUMO__CHECK(params_exec(d, params, &x));
    for (int f = 0; f < d->nfrag; f++) {
        const frag *fr = &d->frags[f];
        size_t at = fr->base;
        for (size_t r = 0; r < fr->nruns; at += fr->run_len[r], r++)
            SUMO__CHECK(sumo__k_copy(&x, d->x0 + at * d->esz,
                                     (const unsigned char *)params + fr->run_off[r] * d->esz,
                                     fr->run_len[r] * d->esz));
    }
    d->anchored = true;
    return SUMO_SUCCESS;
}

/* The fragment whose exchange starts at the end of step k (>= 1), or -1. */
static int starting(const sumo_diloco *d, uint64_t k)
{
    uint64_t r = (k - 1) % (uint64_t)d->o.sync_every + 1;
    for (int f = 0; f < d->nfrag; f++)
        if (d->frags[f].first == r) return f;
    return -1;
}

sumo_result sumo_diloco_due(const sumo_diloco *d, int *what, int *applied, int *started)
{
    if (d == NULL || what == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    uint64_t next = d->steps + 1;
    int a = d->pending >= 0 && d->apply_at == next ? d->pending : -1;
    int s = starting(d, next);
    if (a < 0 && s >= 0 && d->o.delay == 0) a = s;
    *what = (a >= 0 ? SUMO_DILOCO_APPLY : 0) | (s >= 0 ? SUMO_DILOCO_START : 0);
    if (applied) *applied = a;
    if (started) *started = s;
    return SUMO_SUCCESS;
}

static bool from_average(const sumo_diloco *d)
{
    return d->o.combine == SUMO_COMBINE_AVERAGE && d->o.compression == SUMO_COMPRESS_NONE;
}

static sumo_result start(sumo_diloco *d, const sumo__exec *x, const unsigned char *params, int f,
                         double lr)
{
    const frag *fr = &d->frags[f];
    size_t esz = d->esz, at = 0;
    for (size_t r = 0; r < fr->nruns; at += fr->run_len[r], r++) {
        const unsigned char *p = params + fr->run_off[r] * esz;
        unsigned char *e = d->e + at * esz;
        if (from_average(d))
            SUMO__CHECK(sumo__k_copy(x, e, p, fr->run_len[r] * esz));
        else /* Delta_r = x0 - theta, rounded once */
            SUMO__CHECK(sumo__k_delta(x, d->dtype, e, d->x0 + (fr->base + at) * esz, p, fr->run_len[r]));
    }
    d->stats.rounds++;
    sumo_result r;
    if (d->o.compression != SUMO_COMPRESS_NONE) {
        sumo_compression c = {.struct_size = sizeof c, .format = d->o.compression,
                              .block_size = d->o.block_size, .op = SUMO_OP_AVERAGE};
        size_t bytes = 0;
        sumo_compressed_bytes(&c, fr->n, &bytes);
        d->stats.bytes += bytes;
        r = sumo_allreduce_compressed_start((const float *)(const void *)d->e, (float *)(void *)d->e,
                                            fr->n, &c, d->comm, &d->req);
    } else {
        d->stats.bytes += (uint64_t)fr->n * esz;
        if (fr->agg)
            r = sumo_aggregator_apply_start(fr->agg, d->e, d->e, fr->n, d->dtype, &d->req);
        else
            r = sumo_allreduce_start(d->e, d->e, fr->n, d->dtype, SUMO_OP_AVERAGE, d->comm, &d->req);
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

static sumo_result apply(sumo_diloco *d, const sumo__exec *x, unsigned char *params)
{
    int f = d->pending;
    const frag *fr = &d->frags[f];
    settle(d);
    d->pending = -1;
    if (d->result != SUMO_SUCCESS) return d->result;
    const sumo_diloco_options *o = &d->o;
    bool hb = o->outer == SUMO_OUTER_HEAVY_BALL;
    /* SlowMo's step is alpha gamma, formed as slow_update forms it. */
    sumo_outer_step st = {.nesterov = !hb, .from_average = from_average(d),
                          .lr = hb ? o->lr * d->gamma : o->lr, .mu = o->momentum,
                          .gamma = hb ? d->gamma : 1.0, .merge = o->merge_alpha};
    size_t esz = d->esz, at = 0;
    for (size_t r = 0; r < fr->nruns; at += fr->run_len[r], r++) {
        size_t g = (fr->base + at) * esz;
        SUMO__CHECK(sumo__k_outer_update(x, d->dtype, params + fr->run_off[r] * esz, d->e + at * esz,
                                         d->v + g, d->x0 + g, fr->run_len[r], &st));
    }
    size_t bad;
    SUMO__CHECK(sumo__k_first_nonfinite(x, d->dtype, d->x0 + fr->base * esz, fr->n, &bad));
    if (bad != SIZE_MAX) {
        SUMO__LOG(d->log_level, SUMO__LOG_WARN,
                  "diloco outer step of fragment %d: element %zu of its anchor is not finite "
                  "(diverged local steps, or an outer momentum beyond its type)",
                  f, bad);
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
    bool applied = false, started = false;
    sumo_result r = SUMO_SUCCESS;
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
    }
    if (communicated) *communicated = applied || started;
    d->synchronized = d->nranks == 1 ||
                      (d->nfrag == 1 && applied && d->o.merge_alpha == 0 && r == SUMO_SUCCESS);
    return r;
}

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
#define DILOCO_VERSION 1u
enum {
    H_MAGIC, H_VERSION, H_N, H_DTYPE, H_FRAGS, H_SYNC, H_DELAY, H_COMBINE, H_COMPRESSION,
    H_LAYOUT, H_STEPS, H_ANCHORED, H_PENDING, H_APPLY_AT, H_GAMMA, H_RESULT, H_COUNT
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
    size_t b = H_COUNT * sizeof(uint64_t) + (2 * d->n + d->maxfrag) * d->esz;
    for (int f = 0; f < d->nfrag; f++) b += agg_bytes(d, f);
    *bytes = b;
    return SUMO_SUCCESS;
}

sumo_result sumo_diloco_state_save(sumo_diloco *d, void *buffer, size_t bytes)
{
    size_t need;
    SUMO__CHECK(sumo_diloco_state_size(d, &need));
    if (buffer == NULL || bytes != need) return SUMO_ERR_INVALID_ARGUMENT;
    /* An exchange in flight completes first: its result is part of the state. */
    settle(d);
    uint64_t gamma;
    memcpy(&gamma, &d->gamma, sizeof gamma);
    uint64_t h[H_COUNT] = {
        [H_MAGIC] = DILOCO_MAGIC, [H_VERSION] = DILOCO_VERSION, [H_N] = d->n,
        [H_DTYPE] = (uint64_t)d->dtype, [H_FRAGS] = (uint64_t)d->nfrag,
        [H_SYNC] = (uint64_t)d->o.sync_every, [H_DELAY] = (uint64_t)d->o.delay,
        [H_COMBINE] = (uint64_t)d->o.combine, [H_COMPRESSION] = (uint64_t)d->o.compression,
        [H_LAYOUT] = d->layout_hash, [H_STEPS] = d->steps, [H_ANCHORED] = d->anchored,
        [H_PENDING] = (uint64_t)(d->pending + 1), [H_APPLY_AT] = d->apply_at,
        [H_GAMMA] = gamma, [H_RESULT] = (uint64_t)d->result,
    };
    unsigned char *p = buffer;
    memcpy(p, h, sizeof h);
    p += sizeof h;
    size_t state = (2 * d->n + d->maxfrag) * d->esz;
    const sumo__exec x = {.k = d->k};
    SUMO__CHECK(sumo__k_copy(&x, p, d->x0, state));
    p += state;
    for (int f = 0; f < d->nfrag; f++) {
        size_t b = agg_bytes(d, f);
        if (b) SUMO__CHECK(sumo_aggregator_state_save(d->frags[f].agg, p, b));
        p += b;
    }
    return SUMO_SUCCESS;
}

static const char *check_header(const sumo_diloco *d, const uint64_t *h)
{
    if (h[H_MAGIC] != DILOCO_MAGIC) return "not a DiLoCo state (bad magic)";
    if (h[H_VERSION] != DILOCO_VERSION) return "unsupported DiLoCo state version";
    if (h[H_N] != d->n || h[H_DTYPE] != (uint64_t)d->dtype) return "parameter count or dtype differs";
    if (h[H_FRAGS] != (uint64_t)d->nfrag || h[H_LAYOUT] != d->layout_hash)
        return "layout or fragments differ";
    if (h[H_SYNC] != (uint64_t)d->o.sync_every || h[H_DELAY] != (uint64_t)d->o.delay)
        return "sync_every or delay differs (the schedule would mean something else)";
    if (h[H_COMBINE] != (uint64_t)d->o.combine || h[H_COMPRESSION] != (uint64_t)d->o.compression)
        return "combine or compression differs (the exchange buffer would mean something else)";
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
        SUMO__CHECK(sumo__k_first_nonfinite(&host, d->dtype, body, 2 * d->n, &bad));
        if (bad != SIZE_MAX) why = "non-finite value in an anchor or outer momentum";
    }
    if (why != NULL) {
        SUMO__LOG(d->log_level, SUMO__LOG_WARN, "diloco state load: %s", why);
        return SUMO_ERR_INVALID_ARGUMENT;
    }
    settle(d); /* a request of this object's own past is waited on, its result dropped */
    size_t state = (2 * d->n + d->maxfrag) * d->esz;
    const unsigned char *p = body + state;
    for (int f = 0; f < d->nfrag; f++) {
        size_t b = agg_bytes(d, f);
        if (b) SUMO__CHECK(sumo_aggregator_state_load(d->frags[f].agg, p, b));
        p += b;
    }
    const sumo__exec x = {.k = d->k};
    SUMO__CHECK(sumo__k_copy(&x, d->x0, body, state));
    d->steps = h[H_STEPS];
    d->anchored = h[H_ANCHORED] != 0;
    d->pending = (int)h[H_PENDING] - 1;
    d->apply_at = h[H_APPLY_AT];
    memcpy(&d->gamma, &h[H_GAMMA], sizeof d->gamma);
    d->result = (sumo_result)h[H_RESULT];
    /* Common parameters were saved if the last end applied a whole-model exchange. */
    d->synchronized = d->nranks == 1;
    return SUMO_SUCCESS;
}

sumo_result sumo_diloco_stats(const sumo_diloco *d, sumo_comm_stats *stats)
{
    if (d == NULL || stats == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *stats = d->stats;
    return SUMO_SUCCESS;
}

sumo_result sumo_diloco_extra_memory(const sumo_diloco *d, size_t *bytes)
{
    if (d == NULL || bytes == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *bytes = (2 * d->n + d->maxfrag) * d->esz;
    return SUMO_SUCCESS;
}
