/*
 * SlowMo (Wang et al., ICLR 2020, Algorithm 1) over the public collectives of its
 * communicator: the outer loop alone (sumo_slowmo_*), which the distributed optimizer's SLOWMO
 * mode (distributed.c) and sumo.torch's SlowMo both run. See docs/design/slowmo.md.
 *
 * Every end counts one local step. Counting local steps k = 1 .. tau within an outer
 * iteration:
 *   - k == tau (outer step): parameters averaged exactly (allreduce, SUMO_OP_AVERAGE), then
 *       u  = beta u + (x0 - x) / gamma,   x = x0 - alpha gamma u,   x0 = x
 *     with gamma the rate passed on that step (the kernel table's slow_update);
 *   - else, when inner_period > 0 and k is a multiple of it: parameters averaged exactly
 *     (the Local SGD base);
 *   - else nothing is communicated.
 * The anchor x0 is copied from the parameters on the first begin, before its local step
 * (fairscale takes it after the first step: one step of the first outer iteration is then
 * missing from x0 - x). What happens to the base optimizer's buffers at an outer step (keep,
 * reset, average) is the caller's: the distributed optimizer applies its policy.
 *
 * Arithmetic: per element in double from the stored values, rounded once (kernels_host.c's
 * slow_update, which says why x is formed from the unrounded u).
 *
 * Memory-efficient mode: with n parameters over N ranks, rank r owns the elements
 * [r s, (r + 1) s) with s = floor(n / N), and every rank also keeps the t = n mod N trailing
 * elements [N s, n). u and x0 hold s + t elements instead of n. The outer step averages the
 * whole parameter vector (the same allreduce as the plain mode, so both modes see identical
 * inputs), updates the owned slice and the tail with the same kernel as the plain mode, and
 * rebuilds the vector with one in-place allgather of equal slices of s elements. The tail,
 * computed identically on every rank, needs no communication, so nothing is padded and no
 * scratch buffer exists: extra memory is exactly 2 (s + t) elements, against 2 n plain. The
 * result is bit-identical to the plain mode.
 *
 * Create agrees on the options and the parameter count of every rank (one set-up agreement)
 * so that ranks configured differently fail at create with SUMO_ERR_MISMATCH instead of
 * running collectives out of step; an invalid option on any rank fails create on all of them
 * with SUMO_ERR_INVALID_ARGUMENT, and a rank that cannot allocate its buffers fails it on all
 * of them with SUMO_ERR_SYSTEM.
 *
 * Non-finite values: an outer step whose result holds NaN or Inf (diverged local steps, or a
 * slow buffer that overflows for a tiny gamma) completes, then returns SUMO_ERR_NONFINITE on
 * every rank (the scan runs on the rebuilt parameters, identical everywhere).
 */
#include "optimizers/slowmo.h"
#include "collectives/collectives.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct sumo_slowmo {
    sumo_comm *comm;
    sumo_slowmo_options o;
    sumo_dtype dtype;
    size_t esz;
    size_t n;
    int rank, nranks;
    int log_level;
    size_t offset;   /* first parameter of the owned slice (0 in the plain mode) */
    size_t shard;    /* elements of the owned slice (n in the plain mode) */
    size_t tail;     /* trailing elements every rank keeps (0 in the plain mode) */
    size_t local;    /* shard + tail: elements in each of u and x0 */
    unsigned char *u;  /* slow momentum buffer, local elements; x0 follows it */
    unsigned char *x0; /* anchor x_{t,0}, local elements */
    const sumo_kernel_table *k; /* the memory u and x0 live in */
    uint64_t steps;  /* local steps taken in the current outer iteration, < tau */
    bool anchored;   /* x0 holds the anchor (false until the first begin) */
    bool synchronized;
    sumo_comm_stats stats;
};

/* ---- options --------------------------------------------------------------------------- */

static const char *check_options(const sumo_slowmo_options *o)
{
    if (o->struct_size != sizeof *o)
        return "struct_size is not sizeof(sumo_slowmo_options) of this library (fill the "
               "options with sumo_slowmo_options_preset)";
    if (o->tau < 1) return "tau must be >= 1 (local steps per outer step)";
    if (o->inner_period < 0) return "inner_period must be >= 0 (0: no inner averaging)";
    if (o->inner_period > 0 && o->tau % o->inner_period != 0)
        return "tau must be a multiple of inner_period (the outer average must fall on an "
               "inner boundary)";
    if (!(o->alpha > 0) || !isfinite(o->alpha)) return "alpha must be finite and > 0";
    if (!(o->beta >= 0 && o->beta < 1)) return "beta must be in [0, 1)";
    if ((unsigned)o->buffers > (unsigned)SUMO_BUFFERS_AVERAGE)
        return "buffers must be SUMO_BUFFERS_KEEP, SUMO_BUFFERS_RESET or SUMO_BUFFERS_AVERAGE";
    if (o->memory_efficient != 0 && o->memory_efficient != 1)
        return "memory_efficient must be 0 or 1";
    return NULL;
}

enum { FP_TAU, FP_INNER, FP_ALPHA, FP_BETA, FP_BUFFERS, FP_EFFICIENT, FP_N, FP_DTYPE, FP_COUNT };

/* One agreement: every rank learns whether all ranks have valid and identical options and
 * their buffers, and the communicator's message names the first rank at fault. */
static sumo_result agree_options(sumo_comm *comm, const sumo_slowmo_options *o, size_t n,
                                 sumo_dtype dtype, sumo_result local)
{
    double mine[FP_COUNT] = {0};
    if (local == SUMO_SUCCESS) {
        mine[FP_TAU] = o->tau;
        mine[FP_INNER] = o->inner_period;
        mine[FP_ALPHA] = o->alpha;
        mine[FP_BETA] = o->beta;
        mine[FP_BUFFERS] = o->buffers;
        mine[FP_EFFICIENT] = o->memory_efficient;
        mine[FP_N] = (double)n; /* exact below 2^53 elements */
        mine[FP_DTYPE] = dtype;
    }
    /* Set-up, not training: not counted in the communication statistics. */
    return sumo__agree_setup(comm, local, sumo__fnv1a(SUMO__FNV_OFFSET, mine, sizeof mine),
                             "slowmo create (SlowMo options and parameter count)");
}

/* u and x0 (local elements each, u zeroed: u_0 = 0) in the memory of table k. */
static sumo_result alloc_state(sumo_slowmo *s, const sumo_kernel_table *k)
{
    const sumo__exec x = {.k = k};
    void *p = NULL;
    SUMO__CHECK(k->alloc(k->ctx, 2 * s->local * s->esz, &p));
    sumo_result r = sumo__k_fill(&x, s->dtype, p, 0.0, 2 * s->local);
    if (r != SUMO_SUCCESS) {
        k->release(k->ctx, p);
        return r;
    }
    s->u = p;
    s->x0 = s->u + s->local * s->esz;
    s->k = k;
    return SUMO_SUCCESS;
}

sumo_result sumo_slowmo_create(sumo_comm *comm, size_t nparams, sumo_dtype dtype,
                               const sumo_slowmo_options *options, sumo_slowmo **out)
{
    if (comm == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    sumo_slowmo *s = calloc(1, sizeof *s);
    sumo_result local = SUMO_ERR_INVALID_ARGUMENT;
    const char *why = NULL;
    if (s == NULL) why = "out of memory";
    else if (options == NULL || out == NULL) why = "NULL options or out";
    else if (nparams == 0) why = "no parameters";
    else if (dtype != SUMO_FLOAT32 && dtype != SUMO_FLOAT64) why = "parameters must be fp32 or fp64";
    else why = check_options(options);
    if (why != NULL) {
        if (s == NULL) local = SUMO_ERR_SYSTEM;
        SUMO__COMM_FAIL(comm, local, "slowmo create: %s", why);
    } else {
        s->comm = comm;
        s->o = *options;
        s->dtype = dtype;
        s->esz = sumo__dtype_bytes(dtype);
        s->n = nparams;
        s->log_level = comm->tp->log_level;
        s->rank = comm->tp->rank;
        s->nranks = comm->tp->size;
        if (options->memory_efficient) {
            size_t N = (size_t)s->nranks;
            s->shard = nparams / N;
            s->tail = nparams % N;
            s->offset = (size_t)s->rank * s->shard;
        } else {
            s->shard = nparams;
        }
        s->local = s->shard + s->tail; /* >= 1 since n >= 1 */
        s->synchronized = true;
        /* Host memory until the parameters say where they live (the first begin). */
        local = alloc_state(s, sumo__host_kernels());
        if (local != SUMO_SUCCESS)
            SUMO__COMM_FAIL(comm, local, "slowmo create: no memory for %zu elements", 2 * s->local);
    }
    sumo_result r = agree_options(comm, options, nparams, dtype, local);
    if (r != SUMO_SUCCESS) {
        sumo_slowmo_destroy(s);
        return r;
    }
    *out = s;
    return SUMO_SUCCESS;
}

sumo_result sumo_slowmo_destroy(sumo_slowmo *s)
{
    if (s == NULL) return SUMO_SUCCESS;
    if (s->u) s->k->release(s->k->ctx, s->u);
    free(s);
    return SUMO_SUCCESS;
}

/* ---- the step -------------------------------------------------------------------------- */

/* The local elements of params in parameter order (the owned slice, then the tail) into
 * state. */
static sumo_result copy_local(sumo_slowmo *s, const sumo__exec *x, unsigned char *state,
                              const unsigned char *params)
{
    SUMO__CHECK(sumo__k_copy(x, state, params + s->offset * s->esz, s->shard * s->esz));
    return sumo__k_copy(x, state + s->shard * s->esz, params + (s->n - s->tail) * s->esz,
                        s->tail * s->esz);
}

/* The kernels of the parameters' memory; the state moves there the first time. */
static sumo_result params_exec(sumo_slowmo *s, const void *params, sumo__exec *x)
{
    x->k = sumo__kernels_for(s->comm, params, s->n * s->esz);
    x->stream = NULL;
    if (x->k == s->k) return SUMO_SUCCESS;
    unsigned char *old = s->u;
    const sumo_kernel_table *oldk = s->k;
    SUMO__CHECK(alloc_state(s, x->k));
    /* The state so far (a loaded checkpoint) comes along: host to the new memory. */
    sumo_result r = sumo__k_copy(x, s->u, old, 2 * s->local * s->esz);
    oldk->release(oldk->ctx, old);
    return r;
}

sumo_result sumo_slowmo_begin(sumo_slowmo *s, const void *params)
{
    if (s == NULL || params == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    if (s->anchored) return SUMO_SUCCESS;
    sumo__exec x;
    SUMO__CHECK(params_exec(s, params, &x));
    SUMO__CHECK(copy_local(s, &x, s->x0, params));
    s->anchored = true;
    return SUMO_SUCCESS;
}

sumo_result sumo__slowmo_unanchor(sumo_slowmo *s)
{
    s->anchored = false;
    return SUMO_SUCCESS;
}

bool sumo__slowmo_anchored(const sumo_slowmo *s) { return s->anchored; }

static sumo_result average_params(sumo_slowmo *s, void *params)
{
    s->stats.rounds++;
    s->stats.bytes += (uint64_t)s->n * s->esz;
    return sumo_allreduce(params, params, s->n, s->dtype, SUMO_OP_AVERAGE, s->comm);
}

static sumo_result outer_step(sumo_slowmo *s, const sumo__exec *x, unsigned char *params,
                              double gamma)
{
    const sumo_slowmo_options *o = &s->o;
    size_t esz = s->esz;
    SUMO__CHECK(average_params(s, params));
    SUMO__CHECK(sumo__k_slow_update(x, s->dtype, params + s->offset * esz, s->u, s->x0, s->shard,
                                    o->alpha, o->beta, gamma));
    SUMO__CHECK(sumo__k_slow_update(x, s->dtype, params + (s->n - s->tail) * esz,
                                    s->u + s->shard * esz, s->x0 + s->shard * esz, s->tail,
                                    o->alpha, o->beta, gamma));
    if (o->memory_efficient && s->shard > 0) {
        s->stats.rounds++;
        s->stats.bytes += (uint64_t)s->nranks * s->shard * esz;
        SUMO__CHECK(sumo_allgather(params + s->offset * esz, params, s->shard, s->dtype, s->comm));
    }
    /* params are identical on every rank here, so every rank reaches the same verdict. */
    size_t bad;
    SUMO__CHECK(sumo__k_first_nonfinite(x, s->dtype, params, s->n, &bad));
    if (bad != SIZE_MAX) {
        SUMO__LOG(s->log_level, SUMO__LOG_WARN,
                  "slowmo outer step: parameter %zu is not finite after the slow update "
                  "(diverged local steps, or a slow buffer beyond its type for lr %g)",
                  bad, gamma);
        return SUMO_ERR_NONFINITE;
    }
    return SUMO_SUCCESS;
}

sumo_result sumo_slowmo_due(const sumo_slowmo *s, int *what)
{
    if (s == NULL || what == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    uint64_t next = s->steps + 1;
    if (next == (uint64_t)s->o.tau) *what = SUMO_SLOWMO_OUTER;
    else if (s->o.inner_period > 0 && next % (uint64_t)s->o.inner_period == 0) *what = SUMO_SLOWMO_INNER;
    else *what = SUMO_SLOWMO_LOCAL;
    return SUMO_SUCCESS;
}

sumo_result sumo_slowmo_end(sumo_slowmo *s, void *params, double lr, int *communicated)
{
    if (communicated) *communicated = 0;
    if (s == NULL || params == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    if (!(lr >= 0) || !isfinite(lr)) {
        SUMO__LOG(s->log_level, SUMO__LOG_WARN, "slowmo step: lr %g must be finite and >= 0", lr);
        return SUMO_ERR_INVALID_ARGUMENT;
    }
    bool outer = s->steps + 1 == (uint64_t)s->o.tau;
    if (outer && lr == 0) {
        SUMO__LOG(s->log_level, SUMO__LOG_WARN,
                  "slowmo step: lr 0 on an outer step (local step %d of %d): the slow buffer "
                  "is (x0 - x) / lr", s->o.tau, s->o.tau);
        return SUMO_ERR_INVALID_ARGUMENT;
    }
    if (!s->anchored) return SUMO_ERR_INVALID_USAGE; /* begin takes the anchor first */
    sumo__exec x;
    SUMO__CHECK(params_exec(s, params, &x));
    s->steps++;
    bool inner = !outer && s->o.inner_period > 0 && s->steps % (uint64_t)s->o.inner_period == 0;
    sumo_result r = SUMO_SUCCESS;
    if (outer) {
        s->steps = 0;
        r = outer_step(s, &x, params, lr);
    } else if (inner) {
        r = average_params(s, params);
    }
    if (communicated) *communicated = outer || inner;
    /* One rank always agrees with itself. */
    s->synchronized = outer || inner || s->nranks == 1;
    return r;
}

sumo_result sumo_slowmo_synchronized(const sumo_slowmo *s, int *synchronized)
{
    if (s == NULL || synchronized == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *synchronized = s->synchronized;
    return SUMO_SUCCESS;
}

/* ---- checkpoints ----------------------------------------------------------------------- */

/* The header: fixed-width words in this machine's byte order, then u and x0 (local elements
 * of the parameters' type, which the size tells apart). */
#define SLOWMO_MAGIC 0x534c4f574d4f3031ull /* "SLOWMO01" */
#define SLOWMO_VERSION 1u
enum {
    H_MAGIC, H_VERSION, H_N, H_NRANKS, H_RANK, H_TAU, H_EFFICIENT, H_LOCAL, H_K, H_ANCHORED,
    H_COUNT
};

sumo_result sumo_slowmo_state_size(const sumo_slowmo *s, size_t *bytes)
{
    if (s == NULL || bytes == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *bytes = H_COUNT * sizeof(uint64_t) + 2 * s->local * s->esz;
    return SUMO_SUCCESS;
}

/* The state through host memory (it may live in another). */
static sumo_result state_copy(const sumo_slowmo *s, void *dst, const void *src)
{
    const sumo__exec x = {.k = s->k};
    return sumo__k_copy(&x, dst, src, 2 * s->local * s->esz);
}

sumo_result sumo_slowmo_state_save(const sumo_slowmo *s, void *buffer, size_t bytes)
{
    size_t need;
    SUMO__CHECK(sumo_slowmo_state_size(s, &need));
    if (buffer == NULL || bytes != need) return SUMO_ERR_INVALID_ARGUMENT;
    uint64_t h[H_COUNT] = {
        [H_MAGIC] = SLOWMO_MAGIC,
        [H_VERSION] = SLOWMO_VERSION,
        [H_N] = s->n,
        [H_NRANKS] = (uint64_t)s->nranks,
        [H_RANK] = (uint64_t)s->rank,
        [H_TAU] = (uint64_t)s->o.tau,
        [H_EFFICIENT] = (uint64_t)s->o.memory_efficient,
        [H_LOCAL] = s->local,
        [H_K] = s->steps,
        [H_ANCHORED] = s->anchored,
    };
    unsigned char *p = buffer;
    memcpy(p, h, sizeof h);
    return state_copy(s, p + sizeof h, s->u); /* u then x0: one allocation */
}

static const char *check_header(const sumo_slowmo *s, const uint64_t *h)
{
    if (h[H_MAGIC] != SLOWMO_MAGIC) return "not a SlowMo state (bad magic)";
    if (h[H_VERSION] != SLOWMO_VERSION) return "unsupported SlowMo state version";
    if (h[H_N] != s->n) return "parameter count differs";
    if (h[H_TAU] != (uint64_t)s->o.tau) return "tau differs (the step counter would mean something else)";
    if (h[H_EFFICIENT] != (uint64_t)s->o.memory_efficient)
        return "memory_efficient differs (a shard cannot stand for the whole buffer)";
    /* The plain state is identical on every rank, so it may be loaded with another number
     * of ranks; a shard belongs to one rank of one layout. */
    if (s->o.memory_efficient &&
        (h[H_NRANKS] != (uint64_t)s->nranks || h[H_RANK] != (uint64_t)s->rank))
        return "memory-efficient state of another rank or number of ranks";
    if (h[H_LOCAL] != s->local) return "buffer size differs";
    if (h[H_ANCHORED] > 1) return "corrupt anchor flag";
    if (h[H_K] >= (uint64_t)s->o.tau) return "step counter >= tau";
    if (h[H_ANCHORED] == 0 && h[H_K] != 0) return "steps counted before the anchor was taken";
    return NULL;
}

sumo_result sumo_slowmo_state_load(sumo_slowmo *s, const void *buffer, size_t bytes)
{
    size_t need;
    SUMO__CHECK(sumo_slowmo_state_size(s, &need));
    if (buffer == NULL || bytes != need) return SUMO_ERR_INVALID_ARGUMENT;
    uint64_t h[H_COUNT];
    memcpy(h, buffer, sizeof h);
    const unsigned char *body = (const unsigned char *)buffer + sizeof h;
    const char *why = check_header(s, h);
    if (why == NULL) {
        /* A NaN in a loaded buffer would surface only as NaN parameters an outer step later. */
        size_t bad;
        const sumo__exec host = sumo__host_exec();
        SUMO__CHECK(sumo__k_first_nonfinite(&host, s->dtype, body, 2 * s->local, &bad));
        if (bad != SIZE_MAX) why = "non-finite value in the slow buffer or anchor";
    }
    if (why != NULL) {
        SUMO__LOG(s->log_level, SUMO__LOG_WARN, "slowmo state load: %s", why);
        return SUMO_ERR_INVALID_ARGUMENT;
    }
    SUMO__CHECK(state_copy(s, s->u, body));
    s->steps = h[H_K];
    s->anchored = h[H_ANCHORED] != 0;
    /* The parameters saved with this state were common if the last step communicated. */
    int ip = s->o.inner_period;
    s->synchronized = s->steps == 0 || (ip > 0 && s->steps % (uint64_t)ip == 0) || s->nranks == 1;
    return SUMO_SUCCESS;
}

sumo_result sumo_slowmo_stats(const sumo_slowmo *s, sumo_comm_stats *stats)
{
    if (s == NULL || stats == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *stats = s->stats;
    return SUMO_SUCCESS;
}

/* u and x0 only: 2 (s + t) elements sharded, 2 n plain (the small struct is not counted, and
 * there is no scratch). */
sumo_result sumo_slowmo_extra_memory(const sumo_slowmo *s, size_t *bytes)
{
    if (s == NULL || bytes == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *bytes = 2 * s->local * s->esz;
    return SUMO_SUCCESS;
}
