/*
 * What the optimizer tests (tests/unit/test_optim_*.c) share: a closeness check for values
 * worked out by hand or by a reference, an optimizer and its default options made under
 * assertions, the deterministic floats the runs draw, and an optimizer's saved state.
 */
#ifndef SUMO_TEST_OPTIM_CHECK_H
#define SUMO_TEST_OPTIM_CHECK_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "sumo_optim.h"

#include <math.h>
#include <stdlib.h>

/* |got - want| <= tol * max(1, |want|): relative for large values, absolute near zero. */
static inline void check_close_at(double got, double want, double tol, const char *what, int i,
                                  const char *file, int line)
{
    double scale = fabs(want) > 1.0 ? fabs(want) : 1.0;
    if (!(fabs(got - want) <= tol * scale)) {
        fail_msg("%s:%d: %s[%d] = %.9g, want %.9g (diff %.3g, tol %.3g)", file, line, what, i,
                 got, want, got - want, tol * scale);
    }
}
#define CHECK_CLOSE(got, want, tol) \
    check_close_at((got), (want), (tol), #got, 0, __FILE__, __LINE__)
#define CHECK_CLOSE_I(got, want, tol, i) \
    check_close_at((got), (want), (tol), #got, (i), __FILE__, __LINE__)

/* fp32 holds about 7 digits; hand values are exact doubles, so a few ulps of 1. */
#define HAND_TOL 2e-6

static inline sumo_optimizer *make(sumo_optimizer_options *o, const size_t *sizes, size_t ntensors)
{
    sumo_optimizer *opt = NULL;
    assert_int_equal(sumo_optimizer_create(o, sizes, ntensors, &opt), SUMO_SUCCESS);
    assert_non_null(opt);
    return opt;
}

static inline sumo_optimizer_options opts_of(sumo_optimizer_kind kind)
{
    sumo_optimizer_options o;
    assert_int_equal(sumo_optimizer_options_default(kind, &o), SUMO_SUCCESS);
    return o;
}

/* Deterministic pseudo-random floats in [-1, 1). */
static inline float next_uniform(uint64_t *x)
{
    *x = *x * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(*x >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
}

static inline void *saved_state(const sumo_optimizer *opt, size_t *bytes)
{
    assert_int_equal(sumo_optimizer_state_size(opt, bytes), SUMO_SUCCESS);
    void *buf = malloc(*bytes);
    assert_int_equal(sumo_optimizer_state_save(opt, buf, *bytes), SUMO_SUCCESS);
    return buf;
}

#endif
