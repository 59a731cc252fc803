/*
 * SGD, Adam, AdamW and LAMB over a flat fp32 buffer. The per-element loops are kept free of
 * branches and aliasing (restrict) so the compiler can vectorise them; every decision that
 * depends on the step (first momentum step, Nesterov, bias corrections) is taken once per call
 * and turned into scalars or into the choice of loop.
 */
#include "optimizers/optimizer.h"
#include "sumo_optim.h"

#include "common/common.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct sumo_optimizer {
    sumo_optimizer_options opts;
    size_t n;
    size_t ntensors;
    size_t *tensor_sizes;
    uint64_t layout_hash;
    uint64_t steps;
    int nbufs;
    float *state; /* nbufs * n floats, one allocation so averaging is one allreduce */
    int log_level;
    /* Serialises calls on one handle; a const accessor still takes it, hence mutable use. */
    pthread_mutex_t lock;
};

const char *sumo_optimizer_kind_name(sumo_optimizer_kind kind)
{
    switch (kind) {
    case SUMO_OPTIM_SGD: return "sgd";
    case SUMO_OPTIM_ADAM: return "adam";
    case SUMO_OPTIM_ADAMW: return "adamw";
    case SUMO_OPTIM_LAMB: return "lamb";
    default: return "unknown";
    }
}

sumo_result sumo_optimizer_options_default(sumo_optimizer_kind kind,
                                           sumo_optimizer_options *options)
{
    if (options == NULL || (unsigned)kind >= SUMO_OPTIM_KIND_COUNT)
        return SUMO_ERR_INVALID_ARGUMENT;
    sumo_optimizer_options o;
    memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    o.kind = kind;
    o.check_finite = 1;
    switch (kind) {
    case SUMO_OPTIM_SGD: break;
    case SUMO_OPTIM_ADAM:
    case SUMO_OPTIM_ADAMW:
    case SUMO_OPTIM_LAMB:
        o.beta1 = 0.9;
        o.beta2 = 0.999;
        o.eps = kind == SUMO_OPTIM_LAMB ? 1e-6 : 1e-8;
        o.weight_decay = kind == SUMO_OPTIM_ADAM ? 0.0 : 0.01;
        break;
    default: return SUMO_ERR_INVALID_ARGUMENT;
    }
    *options = o;
    return SUMO_SUCCESS;
}

/* NaN fails every comparison, so each rule is written as "in range" and negated. */
static const char *options_problem(const sumo_optimizer_options *o)
{
    const char *bad = SUMO__STRUCT_SIZE_PROBLEM(o, sumo_optimizer_options, NULL, 0);
    if (bad) return bad;
    if ((unsigned)o->kind >= SUMO_OPTIM_KIND_COUNT) return "kind is not a sumo_optimizer_kind";
    if (!(o->weight_decay >= 0 && isfinite(o->weight_decay)))
        return "weight_decay must be finite and >= 0";
    if (o->check_finite != 0 && o->check_finite != 1) return "check_finite must be 0 or 1";
    if (o->kind == SUMO_OPTIM_SGD) {
        if (!(o->momentum >= 0 && o->momentum < 1)) return "momentum must be in [0, 1)";
        if (!(o->dampening >= 0 && o->dampening <= 1)) return "dampening must be in [0, 1]";
        if (o->nesterov != 0 && o->nesterov != 1) return "nesterov must be 0 or 1";
        if (o->nesterov && o->momentum == 0) return "nesterov needs momentum > 0";
        if (o->nesterov && o->dampening != 0) return "nesterov needs dampening == 0";
        return NULL;
    }
    if (!(o->beta1 >= 0 && o->beta1 < 1)) return "beta1 must be in [0, 1)";
    if (!(o->beta2 >= 0 && o->beta2 < 1)) return "beta2 must be in [0, 1)";
    if (!(o->eps > 0 && isfinite(o->eps))) return "eps must be finite and > 0";
    return NULL;
}

sumo_result sumo_optimizer_options_check(const sumo_optimizer_options *options,
                                         const char **why)
{
    const char *problem = options == NULL ? "options is NULL" : options_problem(options);
    if (why != NULL) *why = problem;
    return problem == NULL ? SUMO_SUCCESS : SUMO_ERR_INVALID_ARGUMENT;
}

static int state_buffer_count(const sumo_optimizer_options *o)
{
    if (o->kind == SUMO_OPTIM_SGD) return o->momentum > 0 ? 1 : 0;
    return 2;
}

/* FNV-1a over the sizes, so a checkpoint of another model with the same n is refused. */
static uint64_t layout_hash(const size_t *sizes, size_t ntensors)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t t = 0; t < ntensors; t++) {
        uint64_t s = (uint64_t)sizes[t];
        for (int b = 0; b < 8; b++) {
            h ^= (s >> (8 * b)) & 0xffu;
            h *= 1099511628211ull;
        }
    }
    return h;
}

sumo_result sumo_optimizer_create(const sumo_optimizer_options *options,
                                  const size_t *tensor_sizes, size_t ntensors,
                                  sumo_optimizer **optimizer)
{
    int log_level;
    SUMO__CHECK(sumo__log_level_for_create(&log_level));
    if (options == NULL || tensor_sizes == NULL || ntensors == 0 || optimizer == NULL) {
        SUMO__LOG(log_level, SUMO__LOG_WARN, "optimizer create: NULL argument or no tensors");
        return SUMO_ERR_INVALID_ARGUMENT;
    }
    const char *problem = options_problem(options);
    if (problem != NULL) {
        SUMO__LOG(log_level, SUMO__LOG_WARN, "optimizer create (%s): %s",
                  sumo_optimizer_kind_name(options->kind), problem);
        return SUMO_ERR_INVALID_ARGUMENT;
    }
    size_t n = 0;
    for (size_t t = 0; t < ntensors; t++) {
        if (__builtin_add_overflow(n, tensor_sizes[t], &n)) {
            SUMO__LOG(log_level, SUMO__LOG_WARN, "optimizer create: layout size overflows");
            return SUMO_ERR_INVALID_ARGUMENT;
        }
    }
    int nbufs = state_buffer_count(options);
    size_t state_bytes = 0, layout_bytes = 0;
    if (n == 0 || sumo__mul_overflows(n, (size_t)nbufs * sizeof(float), &state_bytes) ||
        sumo__mul_overflows(ntensors, sizeof(size_t), &layout_bytes) ||
        state_bytes > SIZE_MAX / 2) {
        SUMO__LOG(log_level, SUMO__LOG_WARN,
                  "optimizer create: %zu parameters in %zu tensors is not a usable size", n,
                  ntensors);
        return SUMO_ERR_INVALID_ARGUMENT;
    }

    sumo_optimizer *o = calloc(1, sizeof *o);
    if (o == NULL) return SUMO_ERR_SYSTEM;
    o->tensor_sizes = malloc(layout_bytes);
    if (nbufs > 0) {
        /* Cache-line aligned so the vector loops start on a boundary. */
        o->state = sumo__aligned_alloc(SUMO__CACHELINE, state_bytes);
    }
    if (o->tensor_sizes == NULL || (nbufs > 0 && o->state == NULL) ||
        pthread_mutex_init(&o->lock, NULL) != 0) {
        free(o->tensor_sizes);
        free(o->state);
        free(o);
        return SUMO_ERR_SYSTEM;
    }
    memcpy(o->tensor_sizes, tensor_sizes, layout_bytes);
    if (state_bytes > 0) memset(o->state, 0, state_bytes);
    o->opts = *options;
    o->n = n;
    o->ntensors = ntensors;
    o->layout_hash = layout_hash(tensor_sizes, ntensors);
    o->nbufs = nbufs;
    o->log_level = log_level;
    *optimizer = o;
    return SUMO_SUCCESS;
}

sumo_result sumo_optimizer_destroy(sumo_optimizer *optimizer)
{
    if (optimizer == NULL) return SUMO_SUCCESS;
    pthread_mutex_destroy(&optimizer->lock);
    free(optimizer->state);
    free(optimizer->tensor_sizes);
    free(optimizer);
    return SUMO_SUCCESS;
}

static void lock_handle(const sumo_optimizer *o)
{
    pthread_mutex_lock(&((sumo_optimizer *)o)->lock);
}

static void unlock_handle(const sumo_optimizer *o)
{
    pthread_mutex_unlock(&((sumo_optimizer *)o)->lock);
}

sumo_result sumo_optimizer_options_get(const sumo_optimizer *optimizer,
                                       sumo_optimizer_options *options)
{
    if (optimizer == NULL || options == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *options = optimizer->opts; /* immutable after create: no lock needed */
    return SUMO_SUCCESS;
}

const size_t *sumo__optimizer_layout(const sumo_optimizer *optimizer)
{
    return optimizer->tensor_sizes;
}

sumo_result sumo_optimizer_size(const sumo_optimizer *optimizer, size_t *n, size_t *ntensors)
{
    if (optimizer == NULL || (n == NULL && ntensors == NULL)) return SUMO_ERR_INVALID_ARGUMENT;
    if (n != NULL) *n = optimizer->n;
    if (ntensors != NULL) *ntensors = optimizer->ntensors;
    return SUMO_SUCCESS;
}

/* ---------------------------------------------------------------------------------------- */
/* The loops. Scalars arrive already rounded to float so the loop body is pure fp32.
 *
 * The build uses -O2, where GCC 12 vectorises only loops that need no scalar epilogue; the
 * attribute below asks for the full vectoriser on these loops alone. The sqrtf of Adam and
 * LAMB keeps an errno branch that blocks vectorisation unless the whole build passes
 * -fno-math-errno (GCC ignores that flag in a function attribute; Clang needs it too): their
 * loops stay simple so that flag alone is enough. Clang vectorises the rest at -O2 unaided. */
#if defined(__GNUC__) && !defined(__clang__)
#define SUMO__VECTORISE __attribute__((optimize("tree-vectorize")))
#else
#define SUMO__VECTORISE
#endif

/* Nonzero when some g[i] is NaN or Inf (x - x is NaN exactly for those). No early exit: the
 * branch-free OR reduction vectorises, and a bad gradient is the rare case. */
SUMO__VECTORISE
static int has_nonfinite(const float *restrict g, size_t n)
{
    int bad = 0;
    for (size_t i = 0; i < n; i++) bad |= (g[i] - g[i]) != 0.0f;
    return bad;
}

SUMO__VECTORISE
static void sgd_plain(float *restrict p, const float *restrict g, size_t n, float lr, float wd)
{
    for (size_t i = 0; i < n; i++) p[i] = p[i] - lr * (g[i] + wd * p[i]);
}

/* First momentum step: buf = g' (PyTorch clones the gradient into the new buffer). */
SUMO__VECTORISE
static void sgd_momentum_first(float *restrict p, const float *restrict g, float *restrict buf,
                               size_t n, float lr, float wd, float mu, int nesterov)
{
    if (nesterov) {
        for (size_t i = 0; i < n; i++) {
            float gi = g[i] + wd * p[i];
            buf[i] = gi;
            p[i] = p[i] - lr * (gi + mu * gi);
        }
    } else {
        for (size_t i = 0; i < n; i++) {
            float gi = g[i] + wd * p[i];
            buf[i] = gi;
            p[i] = p[i] - lr * gi;
        }
    }
}

SUMO__VECTORISE
static void sgd_momentum(float *restrict p, const float *restrict g, float *restrict buf,
                         size_t n, float lr, float wd, float mu, float damp1, int nesterov)
{
    if (nesterov) {
        for (size_t i = 0; i < n; i++) {
            float gi = g[i] + wd * p[i];
            float b = mu * buf[i] + damp1 * gi;
            buf[i] = b;
            p[i] = p[i] - lr * (gi + mu * b);
        }
    } else {
        for (size_t i = 0; i < n; i++) {
            float gi = g[i] + wd * p[i];
            float b = mu * buf[i] + damp1 * gi;
            buf[i] = b;
            p[i] = p[i] - lr * b;
        }
    }
}

/* Adam and AdamW in one loop: Adam passes l2 = weight_decay, shrink = 1; AdamW passes l2 = 0,
 * shrink = 1 - lr * weight_decay. Both are exact no-ops when unused. */
SUMO__VECTORISE
static void adam_loop(float *restrict p, const float *restrict g, float *restrict m,
                      float *restrict v, size_t n, float l2, float shrink, float b1, float omb1,
                      float b2, float omb2, float step_size, float bc2_sqrt, float eps)
{
    for (size_t i = 0; i < n; i++) {
        float x = p[i];
        float gi = g[i] + l2 * x;
        float mi = b1 * m[i] + omb1 * gi;
        float vi = b2 * v[i] + omb2 * (gi * gi);
        m[i] = mi;
        v[i] = vi;
        float denom = sqrtf(vi) / bc2_sqrt + eps;
        p[i] = x * shrink - step_size * (mi / denom);
    }
}

/* LAMB's first pass over one tensor: moments updated, and |x|^2, |r|^2 accumulated in double.
 * r is not stored; the second pass recomputes it from the same inputs with the same
 * operations (bit-identical), which saves an n-float scratch buffer.
 *
 * The sums run in SUMO__LAMB_LANES interleaved partial sums (element i goes to lane i % LANES,
 * lanes added in order at the end): one double chain would be latency-bound at a few cycles
 * per element, and the fixed lane order keeps the result a function of the data and n only. */
#define SUMO__LAMB_LANES 8

static inline float lamb_direction(float m, float v, float x, float bc1, float bc2, float eps,
                                   float wd)
{
    return (m / bc1) / (sqrtf(v / bc2) + eps) + wd * x;
}

SUMO__VECTORISE
static void lamb_moments(const float *restrict x, const float *restrict g, float *restrict m,
                         float *restrict v, size_t n, float b1, float omb1, float b2, float omb2,
                         float bc1, float bc2, float eps, float wd, double norms[2])
{
    double xx[SUMO__LAMB_LANES] = {0}, rr[SUMO__LAMB_LANES] = {0};
    size_t i = 0;
    for (; i + SUMO__LAMB_LANES <= n; i += SUMO__LAMB_LANES) {
        for (size_t j = 0; j < SUMO__LAMB_LANES; j++) {
            float gi = g[i + j];
            float mi = b1 * m[i + j] + omb1 * gi;
            float vi = b2 * v[i + j] + omb2 * (gi * gi);
            m[i + j] = mi;
            v[i + j] = vi;
            float r = lamb_direction(mi, vi, x[i + j], bc1, bc2, eps, wd);
            xx[j] += (double)x[i + j] * x[i + j];
            rr[j] += (double)r * r;
        }
    }
    for (size_t j = 0; i < n; i++, j++) {
        float gi = g[i];
        float mi = b1 * m[i] + omb1 * gi;
        float vi = b2 * v[i] + omb2 * (gi * gi);
        m[i] = mi;
        v[i] = vi;
        float r = lamb_direction(mi, vi, x[i], bc1, bc2, eps, wd);
        xx[j] += (double)x[i] * x[i];
        rr[j] += (double)r * r;
    }
    norms[0] = norms[1] = 0;
    for (size_t j = 0; j < SUMO__LAMB_LANES; j++) {
        norms[0] += xx[j];
        norms[1] += rr[j];
    }
}

SUMO__VECTORISE
static void lamb_apply(float *restrict x, const float *restrict m, const float *restrict v,
                       size_t n, float bc1, float bc2, float eps, float wd, float step)
{
    for (size_t i = 0; i < n; i++) {
        x[i] = x[i] - step * lamb_direction(m[i], v[i], x[i], bc1, bc2, eps, wd);
    }
}

/* ---------------------------------------------------------------------------------------- */

static void step_sgd(sumo_optimizer *o, float *p, const float *g, double lr)
{
    const sumo_optimizer_options *opt = &o->opts;
    float flr = (float)lr, wd = (float)opt->weight_decay, mu = (float)opt->momentum;
    if (o->nbufs == 0) {
        sgd_plain(p, g, o->n, flr, wd);
    } else if (o->steps == 0) {
        sgd_momentum_first(p, g, o->state, o->n, flr, wd, mu, opt->nesterov);
    } else {
        sgd_momentum(p, g, o->state, o->n, flr, wd, mu, (float)(1.0 - opt->dampening),
                     opt->nesterov);
    }
}

static void step_adam(sumo_optimizer *o, float *p, const float *g, double lr, uint64_t t)
{
    const sumo_optimizer_options *opt = &o->opts;
    /* As PyTorch: bias corrections and step size in double, then used by fp32 kernels. */
    double bc1 = 1.0 - pow(opt->beta1, (double)t);
    double bc2 = 1.0 - pow(opt->beta2, (double)t);
    int decoupled = opt->kind == SUMO_OPTIM_ADAMW;
    float l2 = decoupled ? 0.0f : (float)opt->weight_decay;
    float shrink = decoupled ? (float)(1.0 - lr * opt->weight_decay) : 1.0f;
    adam_loop(p, g, o->state, o->state + o->n, o->n, l2, shrink, (float)opt->beta1,
              (float)(1.0 - opt->beta1), (float)opt->beta2, (float)(1.0 - opt->beta2),
              (float)(lr / bc1), (float)sqrt(bc2), (float)opt->eps);
}

static void step_lamb(sumo_optimizer *o, float *p, const float *g, double lr, uint64_t t)
{
    const sumo_optimizer_options *opt = &o->opts;
    float b1 = (float)opt->beta1, omb1 = (float)(1.0 - opt->beta1);
    float b2 = (float)opt->beta2, omb2 = (float)(1.0 - opt->beta2);
    float bc1 = (float)(1.0 - pow(opt->beta1, (double)t));
    float bc2 = (float)(1.0 - pow(opt->beta2, (double)t));
    float eps = (float)opt->eps, wd = (float)opt->weight_decay;
    float *m = o->state, *v = o->state + o->n;
    size_t off = 0;
    for (size_t k = 0; k < o->ntensors; k++) {
        size_t len = o->tensor_sizes[k];
        double norms[2];
        lamb_moments(p + off, g + off, m + off, v + off, len, b1, omb1, b2, omb2, bc1, bc2, eps,
                     wd, norms);
        double xn = sqrt(norms[0]), rn = sqrt(norms[1]);
        /* Either norm 0 (a zero tensor, or a zero update): trust 1, as apex. NaN norms also
         * land here; the update then carries the NaN into x, which is the honest outcome. */
        double trust = (xn > 0 && rn > 0) ? xn / rn : 1.0;
        lamb_apply(p + off, m + off, v + off, len, bc1, bc2, eps, wd, (float)(lr * trust));
        off += len;
    }
}

sumo_result sumo_optimizer_step(sumo_optimizer *optimizer, float *params, const float *grads,
                                double lr)
{
    if (optimizer == NULL || params == NULL || grads == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    sumo_optimizer *o = optimizer;
    size_t bytes = o->n * sizeof(float);
    if (!(lr >= 0 && isfinite(lr))) {
        SUMO__LOG(o->log_level, SUMO__LOG_WARN, "optimizer step: lr %g must be finite and >= 0",
                  lr);
        return SUMO_ERR_INVALID_ARGUMENT;
    }
    if (sumo__ranges_overlap(params, bytes, grads, bytes) ||
        sumo__ranges_overlap(params, bytes, o->state, bytes * (size_t)o->nbufs) ||
        sumo__ranges_overlap(grads, bytes, o->state, bytes * (size_t)o->nbufs)) {
        SUMO__LOG(o->log_level, SUMO__LOG_WARN,
                  "optimizer step: params, grads and the optimizer state overlap");
        return SUMO_ERR_INVALID_ARGUMENT;
    }
    if (o->opts.check_finite && has_nonfinite(grads, o->n)) {
        SUMO__LOG(o->log_level, SUMO__LOG_WARN,
                  "optimizer step: gradient holds NaN or Inf; step refused, nothing changed");
        return SUMO_ERR_INVALID_ARGUMENT;
    }
    lock_handle(o);
    uint64_t t = o->steps + 1;
    switch (o->opts.kind) {
    case SUMO_OPTIM_SGD: step_sgd(o, params, grads, lr); break;
    case SUMO_OPTIM_ADAM:
    case SUMO_OPTIM_ADAMW: step_adam(o, params, grads, lr, t); break;
    case SUMO_OPTIM_LAMB: step_lamb(o, params, grads, lr, t); break;
    default: break; /* validated at create */
    }
    o->steps = t;
    unlock_handle(o);
    return SUMO_SUCCESS;
}

sumo_result sumo_optimizer_step_count(const sumo_optimizer *optimizer, uint64_t *steps)
{
    if (optimizer == NULL || steps == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    lock_handle(optimizer);
    *steps = optimizer->steps;
    unlock_handle(optimizer);
    return SUMO_SUCCESS;
}

sumo_result sumo_optimizer_set_step_count(sumo_optimizer *optimizer, uint64_t steps)
{
    if (optimizer == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    lock_handle(optimizer);
    optimizer->steps = steps;
    unlock_handle(optimizer);
    return SUMO_SUCCESS;
}

sumo_result sumo_optimizer_state_reset(sumo_optimizer *optimizer)
{
    if (optimizer == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    lock_handle(optimizer);
    if (optimizer->nbufs > 0)
        memset(optimizer->state, 0, optimizer->n * sizeof(float) * (size_t)optimizer->nbufs);
    optimizer->steps = 0;
    unlock_handle(optimizer);
    return SUMO_SUCCESS;
}

sumo_result sumo_optimizer_state_buffers(sumo_optimizer *optimizer,
                                         float *bufs[SUMO_OPTIMIZER_MAX_STATE_BUFFERS],
                                         size_t *count, int *nbufs)
{
    if (optimizer == NULL || bufs == NULL || count == NULL || nbufs == NULL)
        return SUMO_ERR_INVALID_ARGUMENT;
    for (int b = 0; b < optimizer->nbufs; b++)
        bufs[b] = optimizer->state + (size_t)b * optimizer->n;
    *count = optimizer->n;
    *nbufs = optimizer->nbufs;
    return SUMO_SUCCESS;
}

/* ---------------------------------------------------------------------------------------- */
/* Checkpoint format, version 1, native byte order:
 *   0  magic "SUMOOPT\0"   8  u32 version   12 u32 kind
 *   16 u64 n               24 u64 ntensors  32 u64 layout hash
 *   40 u64 step count      48 u32 nbufs     52 u32 reserved (0)
 *   56 nbufs * n floats                                                                    */

#define STATE_MAGIC "SUMOOPT"
#define STATE_VERSION 1u
#define STATE_HEADER_BYTES 56u

static void put_u32(unsigned char *b, size_t at, uint32_t x) { memcpy(b + at, &x, sizeof x); }
static void put_u64(unsigned char *b, size_t at, uint64_t x) { memcpy(b + at, &x, sizeof x); }
static uint32_t get_u32(const unsigned char *b, size_t at)
{
    uint32_t x;
    memcpy(&x, b + at, sizeof x);
    return x;
}
static uint64_t get_u64(const unsigned char *b, size_t at)
{
    uint64_t x;
    memcpy(&x, b + at, sizeof x);
    return x;
}

static size_t state_payload_bytes(const sumo_optimizer *o)
{
    return o->n * sizeof(float) * (size_t)o->nbufs; /* checked against overflow at create */
}

sumo_result sumo_optimizer_state_size(const sumo_optimizer *optimizer, size_t *bytes)
{
    if (optimizer == NULL || bytes == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *bytes = STATE_HEADER_BYTES + state_payload_bytes(optimizer);
    return SUMO_SUCCESS;
}

sumo_result sumo_optimizer_state_save(const sumo_optimizer *optimizer, void *buf, size_t bytes)
{
    if (optimizer == NULL || buf == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    const sumo_optimizer *o = optimizer;
    size_t payload = state_payload_bytes(o);
    if (bytes < STATE_HEADER_BYTES + payload ||
        sumo__ranges_overlap(buf, STATE_HEADER_BYTES + payload, o->state, payload))
        return SUMO_ERR_INVALID_ARGUMENT;
    unsigned char *b = buf;
    lock_handle(o);
    memset(b, 0, STATE_HEADER_BYTES);
    memcpy(b, STATE_MAGIC, sizeof STATE_MAGIC);
    put_u32(b, 8, STATE_VERSION);
    put_u32(b, 12, (uint32_t)o->opts.kind);
    put_u64(b, 16, (uint64_t)o->n);
    put_u64(b, 24, (uint64_t)o->ntensors);
    put_u64(b, 32, o->layout_hash);
    put_u64(b, 40, o->steps);
    put_u32(b, 48, (uint32_t)o->nbufs);
    if (payload > 0) memcpy(b + STATE_HEADER_BYTES, o->state, payload);
    unlock_handle(o);
    return SUMO_SUCCESS;
}

sumo_result sumo_optimizer_state_load(sumo_optimizer *optimizer, const void *buf, size_t bytes)
{
    if (optimizer == NULL || buf == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    sumo_optimizer *o = optimizer;
    size_t payload = state_payload_bytes(o);
    const unsigned char *b = buf;
    const char *problem = NULL;
    if (bytes != STATE_HEADER_BYTES + payload)
        problem = "size differs from sumo_optimizer_state_size";
    else if (memcmp(b, STATE_MAGIC, sizeof STATE_MAGIC) != 0)
        problem = "not a sumo optimizer state (bad magic)";
    else if (get_u32(b, 8) != STATE_VERSION)
        problem = "unsupported state format version";
    else if (get_u32(b, 12) != (uint32_t)o->opts.kind)
        problem = "saved by another kind of optimizer";
    else if (get_u64(b, 16) != (uint64_t)o->n || get_u64(b, 24) != (uint64_t)o->ntensors ||
             get_u64(b, 32) != o->layout_hash)
        problem = "saved for another parameter layout";
    else if (get_u32(b, 48) != (uint32_t)o->nbufs)
        problem = "saved with another number of state buffers (momentum on/off)";
    else if (get_u32(b, 52) != 0)
        problem = "corrupt header (reserved field set)";
    else if (sumo__ranges_overlap(buf, bytes, o->state, payload))
        problem = "buffer overlaps the optimizer's own state";
    if (problem != NULL) {
        SUMO__LOG(o->log_level, SUMO__LOG_WARN, "optimizer state load (%s): %s",
                  sumo_optimizer_kind_name(o->opts.kind), problem);
        return SUMO_ERR_INVALID_ARGUMENT;
    }
    lock_handle(o);
    o->steps = get_u64(b, 40);
    if (payload > 0) memcpy(o->state, b + STATE_HEADER_BYTES, payload);
    unlock_handle(o);
    return SUMO_SUCCESS;
}
