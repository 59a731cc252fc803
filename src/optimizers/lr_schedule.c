/*
 * Learning-rate schedules as pure functions of the step, so every rank computes the same rate
 * without communicating and a resumed run needs only the step number.
 */
#include "sumo_optim.h"

#include "common/common.h"

#include <math.h>
#include <string.h>

/* M_PI is POSIX, not C11. */
#define SUMO__PI 3.14159265358979323846

sumo_result sumo_lr_schedule_default(double base_lr, sumo_lr_schedule *schedule)
{
    if (schedule == NULL || !(base_lr >= 0 && isfinite(base_lr)))
        return SUMO_ERR_INVALID_ARGUMENT;
    sumo_lr_schedule s;
    memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    s.kind = SUMO_LR_CONSTANT;
    s.base_lr = base_lr;
    s.scale = 1.0;
    s.gamma = 0.1;
    *schedule = s;
    return SUMO_SUCCESS;
}

/* Rules written as "in range" and negated so that NaN fails them. */
static const char *schedule_problem(const sumo_lr_schedule *s)
{
    const char *bad = SUMO__STRUCT_SIZE_PROBLEM(s, sumo_lr_schedule, NULL, 0);
    if (bad) return bad;
    if ((unsigned)s->kind >= SUMO_LR_KIND_COUNT) return "kind is not a sumo_lr_kind";
    if (!(s->base_lr >= 0 && isfinite(s->base_lr))) return "base_lr must be finite and >= 0";
    if (!(s->scale > 0 && isfinite(s->scale))) return "scale must be finite and > 0";
    if (!isfinite(s->base_lr * s->scale)) return "base_lr * scale overflows";
    if (s->warmup_steps > 0 && !(s->warmup_start_factor >= 0 && isfinite(s->warmup_start_factor)))
        return "warmup_start_factor must be finite and >= 0";
    if (s->kind == SUMO_LR_STEP) {
        if (!(s->gamma > 0 && s->gamma <= 1)) return "gamma must be in (0, 1]";
        if (s->step_size == 0) return "step_size must be >= 1";
        if (s->step_size < s->warmup_steps)
            return "step_size must be >= warmup_steps (no decay inside the warm-up)";
    }
    if (s->kind == SUMO_LR_COSINE) {
        if (s->total_steps <= s->warmup_steps) return "total_steps must be > warmup_steps";
        if (!(s->min_lr >= 0 && s->min_lr <= s->base_lr * s->scale))
            return "min_lr must be in [0, base_lr * scale]";
    }
    return NULL;
}

sumo_result sumo_lr_schedule_check(const sumo_lr_schedule *schedule, const char **why)
{
    const char *problem = schedule == NULL ? "schedule is NULL" : schedule_problem(schedule);
    if (why != NULL) *why = problem;
    return problem == NULL ? SUMO_SUCCESS : SUMO_ERR_INVALID_ARGUMENT;
}

sumo_result sumo_lr_at(const sumo_lr_schedule *schedule, uint64_t step, double *lr)
{
    if (schedule == NULL || lr == NULL || schedule_problem(schedule) != NULL)
        return SUMO_ERR_INVALID_ARGUMENT;
    const sumo_lr_schedule *s = schedule;
    double peak = s->base_lr * s->scale;
    if (step < s->warmup_steps) {
        double start = s->base_lr * s->warmup_start_factor;
        *lr = start + (peak - start) * ((double)step / (double)s->warmup_steps);
        return SUMO_SUCCESS;
    }
    switch (s->kind) {
    case SUMO_LR_STEP:
        *lr = peak * pow(s->gamma, (double)(step / s->step_size));
        break;
    case SUMO_LR_COSINE:
        if (step >= s->total_steps) {
            *lr = s->min_lr;
        } else {
            double progress = (double)(step - s->warmup_steps) /
                              (double)(s->total_steps - s->warmup_steps);
            *lr = s->min_lr + (peak - s->min_lr) * 0.5 * (1.0 + cos(SUMO__PI * progress));
        }
        break;
    default: *lr = peak; break;
    }
    return SUMO_SUCCESS;
}
