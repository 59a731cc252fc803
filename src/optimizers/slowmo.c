/*
 * SlowMo (Wang et al., ICLR 2020, Algorithm 1) over the public collectives of the
 * distributed optimizer's communicator. See docs/design/slowmo.md.
 *
 * Every call of sumo__slowmo_step is one local step of the base optimizer. Counting local
 * steps k = 1 .. tau within an outer iteration:
 *   - k == tau (outer step): parameters averaged exactly (allreduce, SUMO_OP_AVERAGE), then
 *       u  = beta u + (x0 - x) / gamma,   x = x0 - alpha gamma u,   x0 = x
 *     with gamma the rate passed on that step, then the buffer policy on the base optimizer;
 *   - else, when inner_period > 0 and k is a multiple of it: parameters averaged exactly
 *     (the Local SGD base);
 *   - else nothing is communicated.
 * The anchor x0 is copied from the parameters on the first call, before its local step
 * (fairscale takes it after the first step: one step of the first outer iteration is then
 * missing from x0 - x).
 *
 * Arithmetic: per element in double from the fp32 inputs, rounded once to fp32. x is formed
 * from the unrounded u, so that with alpha 1 and beta 0 (Local SGD) the new parameters are the
 * plain average up to one rounding of (x0 - x) / gamma * gamma in double, i.e. bit-exact in
 * practice, instead of carrying the fp32 rounding of u.
 *
 * Memory-efficient mode: with n parameters over N ranks, rank r owns the elements
 * [r s, (r + 1) s) with s = floor(n / N), and every rank also keeps the t = n mod N trailing
 * elements [N s, n). u and x0 hold s + t floats instead of n. The outer step averages the
 * whole parameter vector (the same allreduce as the plain mode, so both modes see identical
 * inputs), updates the owned slice and the tail with the same per-element code as the plain
 * mode, and rebuilds the vector with one in-place allgather of equal slices of s floats. The
 * tail, computed identically on every rank, needs no communication, so nothing is padded and
 * no scratch buffer exists: extra memory is exactly 2 (s + t) floats, against 2 n plain.
 * The result is bit-identical to the plain mode.
 *
 * Create exchanges the options of every rank (one allgather of a few doubles) so that ranks
 * configured differently fail at create with SUMO_ERR_MISMATCH instead of running collectives
 * out of step or silently diverging; an invalid option on any rank fails create on all of them
 * with SUMO_ERR_INVALID_ARGUMENT (the reason is logged at WARN on the rank that has it), and
 * a rank that cannot allocate its buffers fails it on all of them with SUMO_ERR_SYSTEM.
 *
 * Non-finite values: an outer step whose result holds NaN or Inf (diverged local steps, or a
 * slow buffer that overflows fp32 for a tiny gamma) completes, then returns SUMO_ERR_NONFINITE
 * on every rank (the check runs on the rebuilt parameters, identical everywhere), with a WARN.
 *
 * A local step the base optimizer refuses (check_finite on a NaN gradient) changes nothing and
 * does not count; if only some ranks refuse, the ranks are out of step and the next average
 * fails or times out, so such a batch must be skipped on every rank (agree first).
 */
#include "optimizers/slowmo.h"
#include "collectives/agree.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct sumo__slowmo {
    int rank, nranks;
    int log_level;
    size_t offset;   /* first parameter of the owned slice (0 in the plain mode) */
    size_t shard;    /* elements of the owned slice (n in the plain mode) */
    size_t tail;     /* trailing elements every rank keeps (0 in the plain mode) */
    size_t local;    /* shard + tail: floats in each of u and x0 */
    float *u;        /* slow momentum buffer, local elements */
    float *x0;       /* anchor x_{t,0}, local elements; follows u in the same allocation */
    uint64_t k;      /* local steps taken in the current outer iteration, < tau */
    bool anchored;   /* x0 holds the anchor (false until the first step) */
} sumo__slowmo;

/* ---- options --------------------------------------------------------------------------- */

static const char *check_options(const sumo_slowmo_options *o)
{
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

enum { FP_TAU, FP_INNER, FP_ALPHA, FP_BETA, FP_BUFFERS, FP_EFFICIENT, FP_N, FP_COUNT };

/* One agreement: every rank learns whether all ranks have valid and identical options and
 * their buffers, and the communicator's message names the first rank at fault. */
static sumo_result agree_options(sumo_distributed *dist, sumo_result local)
{
    const sumo_slowmo_options *o = &dist->options.slowmo;
    double mine[FP_COUNT] = {0};
    if (local == SUMO_SUCCESS) {
        mine[FP_TAU] = o->tau;
        mine[FP_INNER] = o->inner_period;
        mine[FP_ALPHA] = o->alpha;
        mine[FP_BETA] = o->beta;
        mine[FP_BUFFERS] = o->buffers;
        mine[FP_EFFICIENT] = o->memory_efficient;
        mine[FP_N] = (double)dist->nparams; /* exact below 2^53 elements */
    }
    /* Set-up, not training: not counted in the communication statistics. */
    return sumo__agree_setup(dist->comm, local, sumo__fnv1a(SUMO__FNV_OFFSET, mine, sizeof mine),
                             "slowmo create (SlowMo options and parameter count)");
}

sumo_result sumo__slowmo_init(sumo_distributed *dist)
{
    if (dist == NULL || dist->comm == NULL || dist->nparams == 0)
        return SUMO_ERR_INVALID_ARGUMENT;
    sumo__slowmo *s = calloc(1, sizeof *s);
    if (s == NULL) return SUMO_ERR_SYSTEM;
    s->log_level = sumo__log_level_from_env();
    sumo_result r = sumo_comm_rank(dist->comm, &s->rank);
    if (r == SUMO_SUCCESS) r = sumo_comm_size(dist->comm, &s->nranks);
    if (r != SUMO_SUCCESS) {
        free(s);
        return r;
    }
    const char *why = check_options(&dist->options.slowmo);
    /* This rank's outcome of the local part, agreed on so that every rank fails the same way. */
    sumo_result local = SUMO_ERR_INVALID_ARGUMENT;
    if (why != NULL) {
        SUMO__COMM_FAIL(dist->comm, SUMO_ERR_INVALID_ARGUMENT, "slowmo create: %s", why);
    } else {
        size_t n = dist->nparams;
        if (dist->options.slowmo.memory_efficient) {
            size_t N = (size_t)s->nranks;
            s->shard = n / N;
            s->tail = n % N;
            s->offset = (size_t)s->rank * s->shard;
        } else {
            s->shard = n;
            s->tail = 0;
            s->offset = 0;
        }
        s->local = s->shard + s->tail; /* >= 1 since n >= 1 */
        /* u starts at zero (u_0 = 0); x0 is written by the first step. */
        s->u = calloc(2 * s->local, sizeof(float));
        local = s->u != NULL ? SUMO_SUCCESS : SUMO_ERR_SYSTEM;
        if (s->u == NULL)
            SUMO__COMM_FAIL(dist->comm, SUMO_ERR_SYSTEM, "slowmo create: no memory for %zu floats",
                            2 * s->local);
    }
    r = agree_options(dist, local);
    if (r != SUMO_SUCCESS) {
        free(s->u);
        free(s);
        return r;
    }
    s->x0 = s->u + s->local;
    dist->slowmo = s;
    dist->synchronized = true;
    return SUMO_SUCCESS;
}

void sumo__slowmo_free(sumo_distributed *dist)
{
    if (dist == NULL || dist->slowmo == NULL) return;
    sumo__slowmo *s = dist->slowmo;
    free(s->u);
    free(s);
    dist->slowmo = NULL;
}

/* ---- the step -------------------------------------------------------------------------- */

/* The local elements in parameter order: the owned slice, then the tail. */
static void copy_local(const sumo__slowmo *s, float *dst, const float *params, size_t n)
{
    memcpy(dst, params + s->offset, s->shard * sizeof *dst);
    memcpy(dst + s->shard, params + (n - s->tail), s->tail * sizeof *dst);
}

/* The slow update on count elements. The same function serves the plain mode, the owned
 * slice and the tail, which is what makes the two modes bit-identical. */
static void slow_update(float *x, float *u, float *x0, size_t count, double alpha, double beta,
                        double gamma)
{
    double step = alpha * gamma;
    for (size_t i = 0; i < count; i++) {
        double x0d = x0[i];
        double ud = beta * (double)u[i] + (x0d - (double)x[i]) / gamma;
        float uf = (float)ud;
        double xd = x0d - step * ud;
        /* u overflowed fp32: poison the parameter so the overflow, which in the sharded mode
         * only this slice's owner holds, reaches every rank's finiteness check. */
        if (!isfinite(uf)) xd = NAN;
        u[i] = uf;
        x[i] = (float)xd;
        x0[i] = x[i];
    }
}

static sumo_result average_params(sumo_distributed *dist, float *params)
{
    sumo__distributed_count(dist, dist->nparams, SUMO_FLOAT32);
    return sumo_allreduce(params, params, dist->nparams, SUMO_FLOAT32, SUMO_OP_AVERAGE,
                          dist->comm);
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
        sumo__distributed_count(dist, total, SUMO_FLOAT32);
        return sumo_allreduce(bufs[0], bufs[0], total, SUMO_FLOAT32, SUMO_OP_AVERAGE,
                              dist->comm);
    }
    default: return SUMO_SUCCESS;
    }
}

static sumo_result outer_step(sumo_distributed *dist, sumo__slowmo *s, float *params,
                              double gamma)
{
    const sumo_slowmo_options *o = &dist->options.slowmo;
    size_t n = dist->nparams;
    SUMO__CHECK(average_params(dist, params));
    slow_update(params + s->offset, s->u, s->x0, s->shard, o->alpha, o->beta, gamma);
    slow_update(params + (n - s->tail), s->u + s->shard, s->x0 + s->shard, s->tail, o->alpha,
                o->beta, gamma);
    if (o->memory_efficient && s->shard > 0) {
        size_t total = (size_t)s->nranks * s->shard;
        sumo__distributed_count(dist, total, SUMO_FLOAT32);
        SUMO__CHECK(sumo_allgather(params + s->offset, params, s->shard, SUMO_FLOAT32,
                                   dist->comm));
    }
    SUMO__CHECK(apply_buffer_policy(dist));
    /* params are identical on every rank here, so every rank reaches the same verdict. */
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(params[i])) {
            SUMO__LOG(s->log_level, SUMO__LOG_WARN,
                      "slowmo outer step: parameter %zu is %g after the slow update (diverged "
                      "local steps, or a slow buffer beyond fp32 for lr %g)",
                      i, (double)params[i], gamma);
            return SUMO_ERR_NONFINITE;
        }
    }
    return SUMO_SUCCESS;
}

sumo_result sumo__slowmo_step(sumo_distributed *dist, float *params, float *grads, double lr,
                              int *communicated)
{
    if (communicated) *communicated = 0;
    if (dist == NULL || params == NULL || grads == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    sumo__slowmo *s = dist->slowmo;
    if (s == NULL) return SUMO_ERR_INVALID_USAGE;
    const sumo_slowmo_options *o = &dist->options.slowmo;
    if (!(lr >= 0) || !isfinite(lr)) {
        SUMO__LOG(s->log_level, SUMO__LOG_WARN, "slowmo step: lr %g must be finite and >= 0", lr);
        return SUMO_ERR_INVALID_ARGUMENT;
    }
    bool outer = s->k + 1 == (uint64_t)o->tau;
    if (outer && lr == 0) {
        SUMO__LOG(s->log_level, SUMO__LOG_WARN,
                  "slowmo step: lr 0 on an outer step (local step %d of %d): the slow buffer "
                  "is (x0 - x) / lr", o->tau, o->tau);
        return SUMO_ERR_INVALID_ARGUMENT;
    }

    bool took_anchor = false;
    if (!s->anchored) {
        copy_local(s, s->x0, params, dist->nparams);
        s->anchored = took_anchor = true;
    }
    sumo_result r = sumo_optimizer_step(dist->optimizer, params, grads, lr);
    if (r != SUMO_SUCCESS) {
        /* The step changed nothing (the optimizer's contract), so neither do we. */
        if (took_anchor) s->anchored = false;
        return r;
    }
    s->k++;
    bool inner = !outer && o->inner_period > 0 && s->k % (uint64_t)o->inner_period == 0;
    if (outer) {
        s->k = 0;
        r = outer_step(dist, s, params, lr);
    } else if (inner) {
        r = average_params(dist, params);
    }
    if (communicated) *communicated = outer || inner;
    /* One rank always agrees with itself. */
    dist->synchronized = outer || inner || s->nranks == 1;
    return r;
}

/* ---- checkpoints ----------------------------------------------------------------------- */

/* The header: fixed-width words in this machine's byte order, then u and x0 (local). */
#define SLOWMO_MAGIC 0x534c4f574d4f3031ull /* "SLOWMO01" */
#define SLOWMO_VERSION 1u
enum {
    H_MAGIC, H_VERSION, H_N, H_NRANKS, H_RANK, H_TAU, H_EFFICIENT, H_LOCAL, H_K, H_ANCHORED,
    H_COUNT
};

size_t sumo__slowmo_state_size(const sumo_distributed *dist)
{
    if (dist == NULL || dist->slowmo == NULL) return 0;
    const sumo__slowmo *s = dist->slowmo;
    return H_COUNT * sizeof(uint64_t) + 2 * s->local * sizeof(float);
}

sumo_result sumo__slowmo_state_save(const sumo_distributed *dist, void *buffer)
{
    if (dist == NULL || buffer == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    const sumo__slowmo *s = dist->slowmo;
    if (s == NULL) return SUMO_ERR_INVALID_USAGE;
    uint64_t h[H_COUNT] = {
        [H_MAGIC] = SLOWMO_MAGIC,
        [H_VERSION] = SLOWMO_VERSION,
        [H_N] = dist->nparams,
        [H_NRANKS] = (uint64_t)s->nranks,
        [H_RANK] = (uint64_t)s->rank,
        [H_TAU] = (uint64_t)dist->options.slowmo.tau,
        [H_EFFICIENT] = (uint64_t)dist->options.slowmo.memory_efficient,
        [H_LOCAL] = s->local,
        [H_K] = s->k,
        [H_ANCHORED] = s->anchored,
    };
    unsigned char *p = buffer;
    memcpy(p, h, sizeof h);
    p += sizeof h;
    memcpy(p, s->u, 2 * s->local * sizeof(float)); /* u then x0: one allocation */
    return SUMO_SUCCESS;
}

static const char *check_header(const sumo_distributed *dist, const sumo__slowmo *s,
                                const uint64_t *h)
{
    if (h[H_MAGIC] != SLOWMO_MAGIC) return "not a SlowMo state (bad magic)";
    if (h[H_VERSION] != SLOWMO_VERSION) return "unsupported SlowMo state version";
    if (h[H_N] != dist->nparams) return "parameter count differs";
    if (h[H_TAU] != (uint64_t)dist->options.slowmo.tau)
        return "tau differs (the step counter would mean something else)";
    if (h[H_EFFICIENT] != (uint64_t)dist->options.slowmo.memory_efficient)
        return "memory_efficient differs (a shard cannot stand for the whole buffer)";
    /* The plain state is identical on every rank, so it may be loaded with another number
     * of ranks; a shard belongs to one rank of one layout. */
    if (dist->options.slowmo.memory_efficient &&
        (h[H_NRANKS] != (uint64_t)s->nranks || h[H_RANK] != (uint64_t)s->rank))
        return "memory-efficient state of another rank or number of ranks";
    if (h[H_LOCAL] != s->local) return "buffer size differs";
    if (h[H_ANCHORED] > 1) return "corrupt anchor flag";
    if (h[H_K] >= (uint64_t)dist->options.slowmo.tau) return "step counter >= tau";
    if (h[H_ANCHORED] == 0 && h[H_K] != 0) return "steps counted before the anchor was taken";
    return NULL;
}

sumo_result sumo__slowmo_state_load(sumo_distributed *dist, const void *buffer)
{
    if (dist == NULL || buffer == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    sumo__slowmo *s = dist->slowmo;
    if (s == NULL) return SUMO_ERR_INVALID_USAGE;
    uint64_t h[H_COUNT];
    memcpy(h, buffer, sizeof h);
    const unsigned char *body = (const unsigned char *)buffer + sizeof h;
    const char *why = check_header(dist, s, h);
    if (why == NULL) {
        /* A NaN in a loaded buffer would surface only as NaN parameters an outer step later. */
        for (size_t i = 0; i < 2 * s->local && why == NULL; i++) {
            float v;
            memcpy(&v, body + i * sizeof v, sizeof v);
            if (!isfinite(v)) why = "non-finite value in the slow buffer or anchor";
        }
    }
    if (why != NULL) {
        SUMO__LOG(s->log_level, SUMO__LOG_WARN, "slowmo state load: %s", why);
        return SUMO_ERR_INVALID_ARGUMENT;
    }
    memcpy(s->u, body, 2 * s->local * sizeof(float));
    s->k = h[H_K];
    s->anchored = h[H_ANCHORED] != 0;
    /* The parameters saved with this state were common if the last step communicated. */
    int ip = dist->options.slowmo.inner_period;
    dist->synchronized = s->k == 0 || (ip > 0 && s->k % (uint64_t)ip == 0) || s->nranks == 1;
    return SUMO_SUCCESS;
}

/* u and x0 only: 2 (s + t) floats sharded, 2 n plain (the small struct is not counted, and
 * there is no scratch). */
size_t sumo__slowmo_extra_memory(const sumo_distributed *dist)
{
    if (dist == NULL || dist->slowmo == NULL) return 0;
    const sumo__slowmo *s = dist->slowmo;
    return 2 * s->local * sizeof(float);
}
