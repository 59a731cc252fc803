/*
 * Learning-rate schedules (sumo_optim.h): constant, warm-up and steps as Goyal et al., cosine,
 * each against values worked out by hand, and every bad schedule refused with a reason that
 * names the field.
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
/* Learning-rate schedules                                                                   */

static double lr_at(const sumo_lr_schedule *s, uint64_t step)
{
    double lr = -1;
    assert_int_equal(sumo_lr_at(s, step, &lr), SUMO_SUCCESS);
    return lr;
}

static void test_lr_constant(void **state)
{
    (void)state;
    sumo_lr_schedule s;
    assert_int_equal(sumo_lr_schedule_default(0.1, &s), SUMO_SUCCESS);
    CHECK_CLOSE(lr_at(&s, 0), 0.1, 1e-15);
    CHECK_CLOSE(lr_at(&s, 1000000), 0.1, 1e-15);
    s.scale = 4; /* linear scaling without warm-up */
    CHECK_CLOSE(lr_at(&s, 0), 0.4, 1e-15);
}

/* Goyal et al.: base 0.1, 8 workers, 5 warm-up steps from 0.1 to 0.8, then / 10 every 30
 * steps counted from 0. */
static void test_lr_goyal_warmup_step(void **state)
{
    (void)state;
    sumo_lr_schedule s;
    sumo_lr_schedule_default(0.1, &s);
    s.kind = SUMO_LR_STEP;
    s.scale = 8;
    s.warmup_steps = 5;
    s.warmup_start_factor = 1;
    s.gamma = 0.1;
    s.step_size = 30;
    CHECK_CLOSE(lr_at(&s, 0), 0.1, 1e-15);                  /* warm-up starts at base */
    CHECK_CLOSE(lr_at(&s, 1), 0.1 + 0.7 * 1 / 5, 1e-15);    /* 0.24 */
    CHECK_CLOSE(lr_at(&s, 2), 0.1 + 0.7 * 2 / 5, 1e-15);    /* 0.38 */
    CHECK_CLOSE(lr_at(&s, 4), 0.1 + 0.7 * 4 / 5, 1e-15);    /* 0.66 */
    CHECK_CLOSE(lr_at(&s, 5), 0.8, 1e-15);                  /* warm-up ends at base * N */
    CHECK_CLOSE(lr_at(&s, 29), 0.8, 1e-15);
    CHECK_CLOSE(lr_at(&s, 30), 0.08, 1e-15);
    CHECK_CLOSE(lr_at(&s, 59), 0.08, 1e-15);
    CHECK_CLOSE(lr_at(&s, 60), 0.008, 1e-15);
    CHECK_CLOSE(lr_at(&s, 95), 0.0008, 1e-15);

    s.warmup_start_factor = 0; /* warm-up from 0 */
    CHECK_CLOSE(lr_at(&s, 0), 0.0, 1e-15);
    CHECK_CLOSE(lr_at(&s, 1), 0.8 / 5, 1e-15);
    CHECK_CLOSE(lr_at(&s, 5), 0.8, 1e-15);
}

static void test_lr_cosine(void **state)
{
    (void)state;
    sumo_lr_schedule s;
    sumo_lr_schedule_default(1.0, &s);
    s.kind = SUMO_LR_COSINE;
    s.total_steps = 100;
    s.min_lr = 0.1;
    CHECK_CLOSE(lr_at(&s, 0), 1.0, 1e-15);                               /* cos 0 = 1 */
    CHECK_CLOSE(lr_at(&s, 25), 0.1 + 0.9 * 0.5 * (1 + sqrt(0.5)), 1e-15); /* 0.8681981 */
    CHECK_CLOSE(lr_at(&s, 50), 0.55, 1e-15);                             /* cos pi/2 = 0 */
    CHECK_CLOSE(lr_at(&s, 100), 0.1, 1e-15);                             /* cos pi = -1 */
    CHECK_CLOSE(lr_at(&s, 1000), 0.1, 1e-15);                            /* floor after T */

    /* With warm-up W = 10 and scale 2: cosine runs over [10, 110] from 2 to the floor. */
    s.scale = 2;
    s.warmup_steps = 10;
    s.total_steps = 110;
    CHECK_CLOSE(lr_at(&s, 0), 0.0, 1e-15);
    CHECK_CLOSE(lr_at(&s, 5), 1.0, 1e-15);
    CHECK_CLOSE(lr_at(&s, 10), 2.0, 1e-15);
    CHECK_CLOSE(lr_at(&s, 60), 0.1 + 1.9 * 0.5, 1e-15); /* 1.05 */
    CHECK_CLOSE(lr_at(&s, 110), 0.1, 1e-15);
}

static void expect_bad_schedule(sumo_lr_schedule s, const char *field)
{
    const char *why = NULL;
    double lr = 42;
    assert_int_equal(sumo_lr_schedule_check(&s, &why), SUMO_ERR_INVALID_ARGUMENT);
    assert_non_null(why);
    if (strstr(why, field) == NULL) fail_msg("reason \"%s\" does not name %s", why, field);
    assert_int_equal(sumo_lr_at(&s, 0, &lr), SUMO_ERR_INVALID_ARGUMENT);
    assert_true(lr == 42);
}

static void test_lr_bad(void **state)
{
    (void)state;
    sumo_lr_schedule s, b;
    double lr;
    assert_int_equal(sumo_lr_schedule_default(-1, &s), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_lr_schedule_default(NAN, &s), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_lr_schedule_default(0.1, NULL), SUMO_ERR_INVALID_ARGUMENT);
    sumo_lr_schedule_default(0.1, &s);
    assert_int_equal(sumo_lr_at(NULL, 0, &lr), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_lr_at(&s, 0, NULL), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_lr_schedule_check(NULL, NULL), SUMO_ERR_INVALID_ARGUMENT);

    b = s; b.kind = (sumo_lr_kind)9; expect_bad_schedule(b, "kind");
    b = s; b.base_lr = -0.1; expect_bad_schedule(b, "base_lr");
    b = s; b.base_lr = NAN; expect_bad_schedule(b, "base_lr");
    b = s; b.base_lr = INFINITY; expect_bad_schedule(b, "base_lr");
    b = s; b.scale = 0; expect_bad_schedule(b, "scale");
    b = s; b.scale = NAN; expect_bad_schedule(b, "scale");
    b = s; b.base_lr = 1e300; b.scale = 1e300; expect_bad_schedule(b, "scale");
    b = s; b.warmup_steps = 5; b.warmup_start_factor = -1;
    expect_bad_schedule(b, "warmup_start_factor");
    b = s; b.warmup_steps = 5; b.warmup_start_factor = NAN;
    expect_bad_schedule(b, "warmup_start_factor");

    sumo_lr_schedule st = s;
    st.kind = SUMO_LR_STEP;
    st.step_size = 10;
    assert_int_equal(sumo_lr_schedule_check(&st, NULL), SUMO_SUCCESS);
    b = st; b.gamma = 0; expect_bad_schedule(b, "gamma");
    b = st; b.gamma = 1.5; expect_bad_schedule(b, "gamma");
    b = st; b.gamma = NAN; expect_bad_schedule(b, "gamma");
    b = st; b.step_size = 0; expect_bad_schedule(b, "step_size");
    b = st; b.warmup_steps = 11; expect_bad_schedule(b, "step_size");

    sumo_lr_schedule co = s;
    co.kind = SUMO_LR_COSINE;
    co.total_steps = 10;
    assert_int_equal(sumo_lr_schedule_check(&co, NULL), SUMO_SUCCESS);
    b = co; b.total_steps = 0; expect_bad_schedule(b, "total_steps");
    b = co; b.warmup_steps = 10; expect_bad_schedule(b, "total_steps");
    b = co; b.min_lr = -0.01; expect_bad_schedule(b, "min_lr");
    b = co; b.min_lr = 0.2; expect_bad_schedule(b, "min_lr"); /* above the peak */
    b = co; b.min_lr = NAN; expect_bad_schedule(b, "min_lr");
}
int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lr_constant),
        cmocka_unit_test(test_lr_goyal_warmup_step),
        cmocka_unit_test(test_lr_cosine),
        cmocka_unit_test(test_lr_bad),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
