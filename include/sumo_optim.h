/*
 * sumo optimizers: SGD (momentum, Nesterov), Adam, AdamW and LAMB over one flat fp32
 * parameter buffer, plus learning-rate schedules.
 *
 * The parameters of a model are one contiguous float buffer of n elements, cut into tensors
 * by a layout (per-tensor element counts summing to n). Only LAMB looks at the layout (its
 * trust ratio is per tensor); the others treat the buffer as one vector. Gradients use the
 * same layout. An optimizer owns its state (momentum, Adam moments, step counter), never the
 * parameters or gradients: the caller passes both on every step.
 *
 * The learning rate is an argument of every step, so schedules (sumo_lr_at below, or any the
 * caller likes) stay outside the optimizer, and SlowMo can read the rate it used.
 *
 * Arithmetic follows PyTorch (torch.optim.SGD, Adam, AdamW) formula for formula, in fp32 with
 * the per-step scalars (bias corrections, step sizes) computed in double and rounded once;
 * norms (LAMB) are accumulated in double. Results therefore agree with PyTorch to a few ulps,
 * not bit for bit.
 *
 * Threads: every function is safe to call from several threads on the same handle (calls on
 * one handle are serialised by a lock inside it); different handles share nothing. The
 * buffers returned by sumo_optimizer_state_buffers() are the exception: they are the
 * handle's own memory, and the caller must not touch them while a step on the handle runs.
 *
 * Memory: state of n floats for SGD with momentum, 2n floats for Adam, AdamW and LAMB, none
 * for SGD without momentum; no scratch space, no allocation after create.
 */
#ifndef SUMO_OPTIM_H
#define SUMO_OPTIM_H

#include "sumo.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum sumo_optimizer_kind {
    /* p -= lr * d, where g' = g + weight_decay * p, and with momentum mu > 0:
     *   buf = g' on the first step, else buf = mu * buf + (1 - dampening) * g'
     *   d = g' + mu * buf (Nesterov) or d = buf; without momentum d = g'. */
    SUMO_OPTIM_SGD = 0,
    /* g' = g + weight_decay * p (L2 in the gradient, as torch.optim.Adam), then
     *   m = b1 m + (1 - b1) g'; v = b2 v + (1 - b2) g'^2;
     *   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)   (eps outside the sqrt) */
    SUMO_OPTIM_ADAM = 1,
    /* As Adam, but the weight decay is decoupled (torch.optim.AdamW): p *= 1 - lr * weight_decay
     * before the Adam update, and the moments see the raw gradient. */
    SUMO_OPTIM_ADAMW = 2,
    /* LAMB (You et al. 2019, "Large Batch Optimization for Deep Learning"), per tensor x:
     *   m, v as Adam on the raw gradient; m^ = m / (1 - b1^t), v^ = v / (1 - b2^t);
     *   r = m^ / (sqrt(v^) + eps) + weight_decay * x;
     *   trust = |x| / |r|, or 1 when either norm is 0 (NVIDIA apex FusedLAMB's rule);
     *   x -= lr * trust * r.
     * Choices, stated: bias correction on (apex's default, the paper's v1 algorithm); the
     * paper's scaling function phi is the identity (no clamp of |x|); norms are taken over
     * each tensor of the layout and accumulated in double; the trust ratio applies to every
     * tensor (apex's use_nvlamb=True; apex's default skips it where weight decay is 0); no
     * global gradient-norm clipping (clip before the step if wanted). To exclude tensors
     * (biases, norms) from weight decay, give them their own optimizer with weight_decay 0
     * (a param group); their trust ratio still applies. */
    SUMO_OPTIM_LAMB = 3,
    SUMO_OPTIM_KIND_COUNT
} sumo_optimizer_kind;

/*
 * Hyperparameters. Fill with sumo_optimizer_options_default() and change what differs; a
 * field the kind does not use is ignored (not validated).
 */
typedef struct sumo_optimizer_options {
    size_t struct_size;  /* sizeof(sumo_optimizer_options); the default sets it */
    sumo_optimizer_kind kind;
    double weight_decay; /* >= 0; all kinds (L2 for SGD and Adam, decoupled for AdamW, LAMB) */
    /* SGD only */
    double momentum;     /* in [0, 1); 0 means plain SGD and no state */
    double dampening;    /* in [0, 1] */
    int nesterov;        /* 0 or 1; needs momentum > 0 and dampening == 0 */
    /* Adam, AdamW, LAMB */
    double beta1;        /* in [0, 1) */
    double beta2;        /* in [0, 1) */
    double eps;          /* > 0, added to sqrt(v^) */
    /* All kinds: scan the gradient for NaN and Inf before a step and refuse it (see step). */
    int check_finite;    /* 0 or 1 */
} sumo_optimizer_options;

/*
 * PyTorch's defaults for kind: SGD momentum 0, dampening 0, no Nesterov, weight decay 0;
 * Adam beta1 0.9, beta2 0.999, eps 1e-8, weight decay 0; AdamW the same with weight decay
 * 0.01; LAMB beta1 0.9, beta2 0.999, eps 1e-6, weight decay 0.01 (apex). check_finite 1.
 */
SUMO_API sumo_result sumo_optimizer_options_default(sumo_optimizer_kind kind,
                                           sumo_optimizer_options *options);

/*
 * SUMO_SUCCESS when create would accept options, else SUMO_ERR_INVALID_ARGUMENT with *why (if
 * why is not NULL) pointing at a static sentence naming the field and the rule it breaks.
 */
SUMO_API sumo_result sumo_optimizer_options_check(const sumo_optimizer_options *options,
                                         const char **why);

typedef struct sumo_optimizer sumo_optimizer;

/*
 * An optimizer for a buffer cut into ntensors tensors of tensor_sizes[i] elements (a size may
 * be 0; the total n must be > 0). State starts as for a fresh PyTorch optimizer: zero moments
 * and step count 0. Bad options or layout: SUMO_ERR_INVALID_ARGUMENT (the reason is printed
 * with SUMO_DEBUG=WARN, and given by sumo_optimizer_options_check) and *optimizer untouched.
 */
SUMO_API sumo_result sumo_optimizer_create(const sumo_optimizer_options *options,
                                  const size_t *tensor_sizes, size_t ntensors,
                                  sumo_optimizer **optimizer);
SUMO_API sumo_result sumo_optimizer_destroy(sumo_optimizer *optimizer);

/* The options the handle was created with. */
SUMO_API sumo_result sumo_optimizer_options_get(const sumo_optimizer *optimizer,
                                       sumo_optimizer_options *options);
/* Number of parameters n and of tensors in the layout. */
SUMO_API sumo_result sumo_optimizer_size(const sumo_optimizer *optimizer, size_t *n, size_t *ntensors);

/*
 * One step: params[0..n) updated in place from grads[0..n) with learning rate lr (finite,
 * >= 0; the schedule is the caller's). params and grads must not overlap each other or the
 * optimizer's state buffers.
 *
 * With check_finite, a gradient holding NaN or Inf makes the step return
 * SUMO_ERR_INVALID_ARGUMENT before anything is written (params, state and step count as
 * before), so the caller can skip the batch, as mixed-precision loss scalers do. Without it,
 * NaN and Inf propagate into params and state as IEEE arithmetic says. Params are never
 * scanned.
 *
 * The update without applying it (Horovod's "Adasum on optimizer deltas"): copy params, step,
 * and take delta = new - old; the optimizer's state has then advanced as it should, and the
 * caller applies old + combined delta. Note delta is the fp32 difference of the rounded
 * params, which is what the combined update will be added back onto.
 */
SUMO_API sumo_result sumo_optimizer_step(sumo_optimizer *optimizer, float *params, const float *grads,
                                double lr);

/*
 * Steps taken since create, reset or load (the t of Adam's bias correction; for SGD step 0
 * is the one that sets buf = g). Setting it is for importing state from elsewhere (e.g. a
 * PyTorch checkpoint copied through sumo_optimizer_state_buffers).
 */
SUMO_API sumo_result sumo_optimizer_step_count(const sumo_optimizer *optimizer, uint64_t *steps);
SUMO_API sumo_result sumo_optimizer_set_step_count(sumo_optimizer *optimizer, uint64_t steps);

/* Back to the state of a freshly created optimizer: buffers zero, step count 0 (SlowMo's
 * "reset" buffer policy). Hyperparameters and layout stay. */
SUMO_API sumo_result sumo_optimizer_state_reset(sumo_optimizer *optimizer);

#define SUMO_OPTIMIZER_MAX_STATE_BUFFERS 2

/*
 * The state tensors, for averaging across ranks (SlowMo's "average" buffer policy) or for
 * import and export: *nbufs buffers of *count floats each (count == n, parameter layout),
 * written to bufs[0..*nbufs) (room for SUMO_OPTIMIZER_MAX_STATE_BUFFERS). SGD with momentum:
 * {momentum buffer}; Adam, AdamW, LAMB: {m, v}; plain SGD: none (*nbufs = 0). The buffers are
 * contiguous (bufs[1] == bufs[0] + count), so one allreduce of *nbufs * *count floats covers
 * all of them. They belong to the handle and live until destroy; the caller may read and
 * write them between steps. The step count is not among them (sumo_optimizer_step_count).
 * Averaging v across ranks keeps it non-negative; writing negative v makes sqrt give NaN.
 */
SUMO_API sumo_result sumo_optimizer_state_buffers(sumo_optimizer *optimizer,
                                         float *bufs[SUMO_OPTIMIZER_MAX_STATE_BUFFERS],
                                         size_t *count, int *nbufs);

/*
 * Checkpoints. The serialised state is a small header (magic, format version, kind, n, the
 * layout's tensor count and hash, step count, number of buffers) followed by the buffers, in
 * this machine's byte order. Hyperparameters are not saved: they are configuration, and the
 * loading optimizer keeps its own.
 *
 * state_size gives the exact byte count; state_save needs bytes >= that size and writes
 * exactly that many; state_load needs bytes == that size and a header that matches this
 * optimizer (kind, n, layout, buffer count). Any mismatch or a corrupt header:
 * SUMO_ERR_INVALID_ARGUMENT with the optimizer unchanged.
 */
SUMO_API sumo_result sumo_optimizer_state_size(const sumo_optimizer *optimizer, size_t *bytes);
SUMO_API sumo_result sumo_optimizer_state_save(const sumo_optimizer *optimizer, void *buf, size_t bytes);
SUMO_API sumo_result sumo_optimizer_state_load(sumo_optimizer *optimizer, const void *buf, size_t bytes);

/* "sgd", "adam", "adamw", "lamb" (never NULL; "unknown" out of range). */
SUMO_API const char *sumo_optimizer_kind_name(sumo_optimizer_kind kind);

/* ---------------------------------------------------------------------------------------- */
/* Learning-rate schedules                                                                    */

typedef enum sumo_lr_kind {
    SUMO_LR_CONSTANT = 0, /* peak */
    SUMO_LR_STEP = 1,     /* peak * gamma^floor(step / step_size), step counted from 0 */
    SUMO_LR_COSINE = 2,   /* from peak at the end of warm-up to min_lr at total_steps:
                           * min_lr + (peak - min_lr) (1 + cos(pi (step - W) / (T - W))) / 2,
                           * then min_lr for step >= T */
    SUMO_LR_KIND_COUNT
} sumo_lr_kind;

/*
 * A schedule as plain data: lr = f(step), with peak = base_lr * scale.
 *
 * scale is the linear scaling rule (Goyal et al. 2017, "Accurate, Large Minibatch SGD"): with
 * N workers each on the single-worker batch, scale = N. Adasum wants no such scaling (scale 1,
 * or Horovod's suggested 2 to 2.5); the choice is the caller's, on purpose.
 *
 * Warm-up: for step < warmup_steps (W), lr goes linearly from base_lr * warmup_start_factor at
 * step 0 towards peak, reaching it at step W: lr = s0 + (peak - s0) * step / W. Goyal's
 * warm-up from base_lr to base_lr * N is scale = N, warmup_start_factor = 1; a warm-up from 0
 * is warmup_start_factor = 0. After warm-up the decay of kind applies; step decay counts in
 * absolute steps (Goyal's "divide by 10 at epochs 30, 60, 80" includes the warm-up epochs)
 * and needs step_size >= W.
 */
typedef struct sumo_lr_schedule {
    size_t struct_size;         /* sizeof(sumo_lr_schedule); the default sets it */
    sumo_lr_kind kind;
    double base_lr;             /* finite, >= 0 */
    double scale;               /* finite, > 0 */
    uint64_t warmup_steps;      /* 0: none */
    double warmup_start_factor; /* finite, >= 0 (used when warmup_steps > 0) */
    double gamma;               /* STEP: in (0, 1] */
    uint64_t step_size;         /* STEP: >= 1 and >= warmup_steps */
    uint64_t total_steps;       /* COSINE: T > warmup_steps */
    double min_lr;              /* COSINE: in [0, peak] */
} sumo_lr_schedule;

/* kind SUMO_LR_CONSTANT at base_lr: scale 1, no warm-up (start factor 0 once one is set),
 * gamma 0.1, step_size 0, total_steps 0 and min_lr 0 (set these for STEP and COSINE). */
SUMO_API sumo_result sumo_lr_schedule_default(double base_lr, sumo_lr_schedule *schedule);

/* As sumo_optimizer_options_check, for a schedule. */
SUMO_API sumo_result sumo_lr_schedule_check(const sumo_lr_schedule *schedule, const char **why);

/* The rate at step (0-based: the step about to be taken). */
SUMO_API sumo_result sumo_lr_at(const sumo_lr_schedule *schedule, uint64_t step, double *lr);

#ifdef __cplusplus
}
#endif

#endif /* SUMO_OPTIM_H */
