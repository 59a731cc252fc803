/*
 * Optimizer options and arguments: every bad option refused with a reason that names it,
 * every bad argument refused with nothing changed, and the step count set from outside (how
 * imported state resumes its bias correction).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "sumo_optim.h"
#include "support/optim_check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------- */
/* Bad arguments                                                                             */

static void expect_bad_options(sumo_optimizer_options o, const char *field)
{
    const char *why = NULL;
    assert_int_equal(sumo_optimizer_options_check(&o, &why), SUMO_ERR_INVALID_ARGUMENT);
    assert_non_null(why);
    if (strstr(why, field) == NULL) fail_msg("reason \"%s\" does not name %s", why, field);
    size_t sizes[] = {2};
    sumo_optimizer *opt = (sumo_optimizer *)(uintptr_t)0x1; /* must stay untouched */
    assert_int_equal(sumo_optimizer_create(&o, sizes, 1, &opt), SUMO_ERR_INVALID_ARGUMENT);
    assert_ptr_equal(opt, (sumo_optimizer *)(uintptr_t)0x1);
}

static void test_bad_options(void **state)
{
    (void)state;
    sumo_optimizer_options o = opts_of(SUMO_OPTIM_SGD);
    const char *why = "unset";
    assert_int_equal(sumo_optimizer_options_check(&o, &why), SUMO_SUCCESS);
    assert_null(why);
    assert_int_equal(sumo_optimizer_options_check(NULL, &why), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_optimizer_options_default(SUMO_OPTIM_KIND_COUNT, &o),
                     SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_optimizer_options_default(SUMO_OPTIM_SGD, NULL),
                     SUMO_ERR_INVALID_ARGUMENT);

    sumo_optimizer_options sgd = opts_of(SUMO_OPTIM_SGD), b;
    b = sgd; b.kind = (sumo_optimizer_kind)7; expect_bad_options(b, "kind");
    b = sgd; b.momentum = NAN; expect_bad_options(b, "momentum");
    b = sgd; b.momentum = -0.1; expect_bad_options(b, "momentum");
    b = sgd; b.momentum = 1.0; expect_bad_options(b, "momentum");
    b = sgd; b.dampening = 1.5; expect_bad_options(b, "dampening");
    b = sgd; b.dampening = NAN; expect_bad_options(b, "dampening");
    b = sgd; b.nesterov = 1; expect_bad_options(b, "nesterov"); /* without momentum */
    b = sgd; b.nesterov = 1; b.momentum = 0.9; b.dampening = 0.1;
    expect_bad_options(b, "nesterov");
    b = sgd; b.nesterov = 2; b.momentum = 0.9; expect_bad_options(b, "nesterov");
    b = sgd; b.weight_decay = -1e-4; expect_bad_options(b, "weight_decay");
    b = sgd; b.weight_decay = NAN; expect_bad_options(b, "weight_decay");
    b = sgd; b.weight_decay = INFINITY; expect_bad_options(b, "weight_decay");
    b = sgd; b.check_finite = 3; expect_bad_options(b, "check_finite");

    for (int k = SUMO_OPTIM_ADAM; k <= SUMO_OPTIM_LAMB; k++) {
        sumo_optimizer_options a = opts_of((sumo_optimizer_kind)k);
        b = a; b.beta1 = 1.0; expect_bad_options(b, "beta1");
        b = a; b.beta1 = -0.5; expect_bad_options(b, "beta1");
        b = a; b.beta1 = NAN; expect_bad_options(b, "beta1");
        b = a; b.beta2 = 1.0; expect_bad_options(b, "beta2");
        b = a; b.beta2 = NAN; expect_bad_options(b, "beta2");
        b = a; b.eps = 0.0; expect_bad_options(b, "eps");
        b = a; b.eps = -1e-8; expect_bad_options(b, "eps");
        b = a; b.eps = NAN; expect_bad_options(b, "eps");
        b = a; b.eps = INFINITY; expect_bad_options(b, "eps");
        b = a; b.weight_decay = -0.01; expect_bad_options(b, "weight_decay");
        /* SGD's fields do not apply and are ignored */
        b = a; b.momentum = 5; b.nesterov = 1;
        assert_int_equal(sumo_optimizer_options_check(&b, NULL), SUMO_SUCCESS);
    }
    /* and Adam's fields do not apply to SGD */
    b = sgd; b.eps = 0; b.beta1 = 2;
    assert_int_equal(sumo_optimizer_options_check(&b, NULL), SUMO_SUCCESS);
}

static void test_bad_arguments(void **state)
{
    (void)state;
    sumo_optimizer_options o = opts_of(SUMO_OPTIM_ADAM);
    size_t sizes[] = {2, 2}, zeros[] = {0, 0};
    size_t huge[] = {SIZE_MAX, 2};
    sumo_optimizer *opt = NULL;
    assert_int_equal(sumo_optimizer_create(NULL, sizes, 2, &opt), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_optimizer_create(&o, NULL, 2, &opt), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_optimizer_create(&o, sizes, 0, &opt), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_optimizer_create(&o, sizes, 2, NULL), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_optimizer_create(&o, zeros, 2, &opt), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_optimizer_create(&o, huge, 2, &opt), SUMO_ERR_INVALID_ARGUMENT);
    size_t big[] = {SIZE_MAX / 4};
    assert_int_equal(sumo_optimizer_create(&o, big, 1, &opt), SUMO_ERR_INVALID_ARGUMENT);
    assert_null(opt);
    assert_int_equal(sumo_optimizer_destroy(NULL), SUMO_SUCCESS);

    opt = make(&o, sizes, 2);
    float p[4] = {1, 2, 3, 4}, g[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    size_t bytes;
    void *before = saved_state(opt, &bytes);
    assert_int_equal(sumo_optimizer_step(NULL, p, g, 0.1), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_optimizer_step(opt, NULL, g, 0.1), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_optimizer_step(opt, p, NULL, 0.1), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_optimizer_step(opt, p, g, -0.1), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_optimizer_step(opt, p, g, NAN), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_optimizer_step(opt, p, g, INFINITY), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_optimizer_step(opt, p, p, 0.1), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_optimizer_step(opt, g + 2, g, 0.1), SUMO_ERR_INVALID_ARGUMENT);
    float *bufs[SUMO_OPTIMIZER_MAX_STATE_BUFFERS];
    size_t count;
    int nbufs;
    sumo_optimizer_state_buffers(opt, bufs, &count, &nbufs);
    assert_int_equal(sumo_optimizer_step(opt, bufs[1], g, 0.1), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_optimizer_step(opt, p, bufs[0] + 1, 0.1), SUMO_ERR_INVALID_ARGUMENT);
    assert_memory_equal(p, ((float[4]){1, 2, 3, 4}), sizeof p);
    void *after = saved_state(opt, &bytes);
    assert_memory_equal(before, after, bytes);
    free(before);
    free(after);
    /* lr 0 is a legal step (warm-up from 0): the moments move, the params do not. */
    assert_int_equal(sumo_optimizer_step(opt, p, g, 0.0), SUMO_SUCCESS);
    assert_memory_equal(p, ((float[4]){1, 2, 3, 4}), sizeof p);

    assert_int_equal(sumo_optimizer_state_buffers(NULL, bufs, &count, &nbufs),
                     SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_optimizer_state_buffers(opt, NULL, &count, &nbufs),
                     SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_optimizer_state_buffers(opt, bufs, NULL, &nbufs),
                     SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_optimizer_state_buffers(opt, bufs, &count, NULL),
                     SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_optimizer_state_size(opt, NULL), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_optimizer_state_size(NULL, &bytes), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_optimizer_state_save(opt, NULL, 1000), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_optimizer_state_save(NULL, p, sizeof p), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_optimizer_state_reset(NULL), SUMO_ERR_INVALID_ARGUMENT);
    uint64_t steps;
    assert_int_equal(sumo_optimizer_step_count(NULL, &steps), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_optimizer_step_count(opt, NULL), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_optimizer_set_step_count(NULL, 3), SUMO_ERR_INVALID_ARGUMENT);
    sumo_optimizer_options got;
    assert_int_equal(sumo_optimizer_options_get(NULL, &got), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_optimizer_options_get(opt, NULL), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_optimizer_options_get(opt, &got), SUMO_SUCCESS);
    assert_memory_equal(&got, &o, sizeof o);
    size_t n = 0, nt = 0;
    assert_int_equal(sumo_optimizer_size(opt, &n, &nt), SUMO_SUCCESS);
    assert_int_equal(n, 4);
    assert_int_equal(nt, 2);
    assert_int_equal(sumo_optimizer_size(opt, NULL, NULL), SUMO_ERR_INVALID_ARGUMENT);
    assert_string_equal(sumo_optimizer_kind_name(SUMO_OPTIM_LAMB), "lamb");
    assert_string_equal(sumo_optimizer_kind_name((sumo_optimizer_kind)42), "unknown");
    sumo_optimizer_destroy(opt);
}

/* Setting the step count is how imported state (e.g. from PyTorch) resumes bias correction. */
static void test_set_step_count(void **state)
{
    (void)state;
    size_t sizes[] = {1};
    sumo_optimizer_options o = opts_of(SUMO_OPTIM_ADAM);
    sumo_optimizer *opt = make(&o, sizes, 1);
    float *bufs[SUMO_OPTIMIZER_MAX_STATE_BUFFERS];
    size_t count;
    int nbufs;
    sumo_optimizer_state_buffers(opt, bufs, &count, &nbufs);
    bufs[0][0] = 0.5f;  /* m after some history */
    bufs[1][0] = 0.25f; /* v */
    assert_int_equal(sumo_optimizer_set_step_count(opt, 9), SUMO_SUCCESS);
    float p[1] = {0.0f};
    const float g[1] = {0.0f};
    sumo_optimizer_step(opt, p, g, 1.0); /* t = 10 */
    double m = 0.9 * 0.5, v = 0.999 * 0.25;
    double want = -(m / (1 - pow(0.9, 10))) / (sqrt(v / (1 - pow(0.999, 10))) + 1e-8);
    CHECK_CLOSE(p[0], want, HAND_TOL);
    sumo_optimizer_destroy(opt);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_options),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_set_step_count),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
