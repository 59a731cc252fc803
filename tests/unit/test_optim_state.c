/*
 * Optimizer state: save and load (bit-identical resumption, every mismatch refused), reset,
 * the state buffers averaged across ranks, non-finite gradients refused before anything
 * changes, Horovod's delta mode, and snapshots taken while another thread steps.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "sumo_optim.h"
#include "support/optim_check.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------- */
/* State: save, load, reset, buffers                                                         */

static sumo_optimizer_options checkpoint_kinds(int which)
{
    sumo_optimizer_options o;
    switch (which) {
    case 0: o = opts_of(SUMO_OPTIM_SGD); o.momentum = 0.9; o.nesterov = 1; break;
    case 1: o = opts_of(SUMO_OPTIM_SGD); break;
    case 2: o = opts_of(SUMO_OPTIM_ADAM); o.weight_decay = 0.01; break;
    case 3: o = opts_of(SUMO_OPTIM_ADAMW); break;
    default: o = opts_of(SUMO_OPTIM_LAMB); break;
    }
    return o;
}

static void fill_grad(float *g, size_t n, int step)
{
    uint64_t rng = 1000 + (uint64_t)step;
    for (size_t i = 0; i < n; i++) g[i] = next_uniform(&rng);
}

/* 10 steps straight, against 5 steps, save, load into a new optimizer, 5 more: the params
 * and the state must be bit-identical. */
static void test_checkpoint_round_trip(void **state)
{
    (void)state;
    size_t sizes[] = {10, 3, 12};
    enum { N = 25 };
    for (int which = 0; which < 5; which++) {
        sumo_optimizer_options o = checkpoint_kinds(which);
        float pa[N], pb[N], g[N];
        for (int i = 0; i < N; i++) pa[i] = pb[i] = 0.1f * (float)(i - 12);
        sumo_optimizer *a = make(&o, sizes, 3), *b = make(&o, sizes, 3);
        for (int t = 0; t < 10; t++) {
            fill_grad(g, N, t);
            assert_int_equal(sumo_optimizer_step(a, pa, g, 0.01), SUMO_SUCCESS);
        }
        for (int t = 0; t < 5; t++) {
            fill_grad(g, N, t);
            assert_int_equal(sumo_optimizer_step(b, pb, g, 0.01), SUMO_SUCCESS);
        }
        size_t bytes;
        void *ck = saved_state(b, &bytes);
        sumo_optimizer_destroy(b);
        sumo_optimizer *c = make(&o, sizes, 3);
        assert_int_equal(sumo_optimizer_state_load(c, ck, bytes), SUMO_SUCCESS);
        uint64_t steps;
        sumo_optimizer_step_count(c, &steps);
        assert_int_equal(steps, 5);
        for (int t = 5; t < 10; t++) {
            fill_grad(g, N, t);
            assert_int_equal(sumo_optimizer_step(c, pb, g, 0.01), SUMO_SUCCESS);
        }
        assert_memory_equal(pa, pb, sizeof pa);
        size_t ba, bc;
        void *sa = saved_state(a, &ba), *sc = saved_state(c, &bc);
        assert_int_equal(ba, bc);
        assert_memory_equal(sa, sc, ba);
        free(sa);
        free(sc);
        free(ck);
        sumo_optimizer_destroy(a);
        sumo_optimizer_destroy(c);
    }
}

/* Every mismatch is refused, and a refused load changes nothing. */
static void test_checkpoint_rejects_mismatch(void **state)
{
    (void)state;
    size_t sizes[] = {4, 4};
    sumo_optimizer_options adam = opts_of(SUMO_OPTIM_ADAM);
    sumo_optimizer *src = make(&adam, sizes, 2);
    float p[8] = {1, 2, 3, 4, 5, 6, 7, 8}, g[8];
    fill_grad(g, 8, 0);
    sumo_optimizer_step(src, p, g, 0.1);
    size_t bytes;
    unsigned char *ck = saved_state(src, &bytes);
    assert_int_equal(bytes, 56 + 2 * 8 * sizeof(float));

    /* The target has taken its own steps: its state must survive every refused load. */
    sumo_optimizer *dst = make(&adam, sizes, 2);
    fill_grad(g, 8, 7);
    sumo_optimizer_step(dst, p, g, 0.1);
    sumo_optimizer_step(dst, p, g, 0.1);
    size_t before_bytes;
    void *before = saved_state(dst, &before_bytes);

    assert_int_equal(sumo_optimizer_state_load(dst, ck, bytes - 1), SUMO_ERR_INVALID_ARGUMENT);
    unsigned char *big = calloc(1, bytes + 4);
    memcpy(big, ck, bytes);
    assert_int_equal(sumo_optimizer_state_load(dst, big, bytes + 4), SUMO_ERR_INVALID_ARGUMENT);
    free(big);
    assert_int_equal(sumo_optimizer_state_load(dst, NULL, bytes), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_optimizer_state_load(NULL, ck, bytes), SUMO_ERR_INVALID_ARGUMENT);
    unsigned char *bad = malloc(bytes);
    /* magic, version, kind, n, layout hash, reserved: one byte flipped in each */
    const size_t fields[] = {0, 8, 12, 16, 24, 32, 48, 52};
    for (size_t f = 0; f < sizeof fields / sizeof fields[0]; f++) {
        memcpy(bad, ck, bytes);
        bad[fields[f]] ^= 0x40;
        assert_int_equal(sumo_optimizer_state_load(dst, bad, bytes), SUMO_ERR_INVALID_ARGUMENT);
    }
    free(bad);

    void *after = saved_state(dst, &before_bytes);
    assert_memory_equal(before, after, before_bytes);
    free(after);
    free(before);

    /* Another kind with the same buffers (AdamW), another layout with the same n, another n,
     * momentum SGD: all refused. */
    sumo_optimizer_options adamw = opts_of(SUMO_OPTIM_ADAMW);
    sumo_optimizer *other = make(&adamw, sizes, 2);
    assert_int_equal(sumo_optimizer_state_load(other, ck, bytes), SUMO_ERR_INVALID_ARGUMENT);
    sumo_optimizer_destroy(other);
    size_t sizes_other[] = {5, 3};
    other = make(&adam, sizes_other, 2);
    assert_int_equal(sumo_optimizer_state_load(other, ck, bytes), SUMO_ERR_INVALID_ARGUMENT);
    sumo_optimizer_destroy(other);
    size_t sizes_n[] = {4, 5};
    other = make(&adam, sizes_n, 2);
    size_t other_bytes;
    sumo_optimizer_state_size(other, &other_bytes);
    assert_int_equal(sumo_optimizer_state_load(other, ck, bytes), SUMO_ERR_INVALID_ARGUMENT);
    sumo_optimizer_destroy(other);

    /* SGD with and without momentum differ in their buffer count. */
    sumo_optimizer_options sgd = opts_of(SUMO_OPTIM_SGD);
    sumo_optimizer *plain = make(&sgd, sizes, 2);
    sgd.momentum = 0.5;
    sumo_optimizer *mom = make(&sgd, sizes, 2);
    size_t pb, mb;
    unsigned char *pck = saved_state(plain, &pb);
    assert_int_equal(pb, 56);
    assert_int_equal(sumo_optimizer_state_load(mom, pck, pb), SUMO_ERR_INVALID_ARGUMENT);
    unsigned char *mck = saved_state(mom, &mb);
    assert_int_equal(mb, 56 + 8 * sizeof(float));
    assert_int_equal(sumo_optimizer_state_load(plain, mck, mb), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_optimizer_state_load(plain, pck, pb), SUMO_SUCCESS);

    /* save: too small a buffer is refused; a larger one gets exactly the state. */
    unsigned char small[56];
    assert_int_equal(sumo_optimizer_state_save(src, small, sizeof small),
                     SUMO_ERR_INVALID_ARGUMENT);
    unsigned char *roomy = malloc(bytes + 16);
    memset(roomy, 0xab, bytes + 16);
    assert_int_equal(sumo_optimizer_state_save(src, roomy, bytes + 16), SUMO_SUCCESS);
    assert_memory_equal(roomy, ck, bytes);
    assert_int_equal(roomy[bytes], 0xab);
    free(roomy);

    free(pck);
    free(mck);
    free(ck);
    sumo_optimizer_destroy(plain);
    sumo_optimizer_destroy(mom);
    sumo_optimizer_destroy(src);
    sumo_optimizer_destroy(dst);
}

/* After reset an optimizer behaves exactly as a new one (SlowMo's "reset" policy). */
static void test_state_reset(void **state)
{
    (void)state;
    size_t sizes[] = {6, 2};
    for (int which = 0; which < 5; which++) {
        sumo_optimizer_options o = checkpoint_kinds(which);
        sumo_optimizer *used = make(&o, sizes, 2), *fresh = make(&o, sizes, 2);
        float pu[8], pf[8], g[8];
        for (int i = 0; i < 8; i++) pu[i] = 0.25f * (float)i;
        for (int t = 0; t < 3; t++) {
            fill_grad(g, 8, t);
            sumo_optimizer_step(used, pu, g, 0.05);
        }
        assert_int_equal(sumo_optimizer_state_reset(used), SUMO_SUCCESS);
        uint64_t steps = 99;
        sumo_optimizer_step_count(used, &steps);
        assert_int_equal(steps, 0);
        memcpy(pf, pu, sizeof pf);
        for (int t = 0; t < 3; t++) {
            fill_grad(g, 8, 10 + t);
            sumo_optimizer_step(used, pu, g, 0.05);
            sumo_optimizer_step(fresh, pf, g, 0.05);
        }
        assert_memory_equal(pu, pf, sizeof pu);
        sumo_optimizer_destroy(used);
        sumo_optimizer_destroy(fresh);
    }
}

/* SlowMo's "average" policy: two ranks average m and v through the buffers and go on. The
 * library's next step must use the averaged state, as a reference fed that state does. */
static void test_state_buffers_average(void **state)
{
    (void)state;
    size_t sizes[] = {4};
    sumo_optimizer_options o = opts_of(SUMO_OPTIM_ADAM);
    sumo_optimizer *r0 = make(&o, sizes, 1), *r1 = make(&o, sizes, 1);
    float p0[4] = {1, 1, 1, 1}, p1[4] = {1, 1, 1, 1};
    const float g0[4] = {1, 2, 3, 4}, g1[4] = {-1, 0, 1, 2};
    sumo_optimizer_step(r0, p0, g0, 0.1);
    sumo_optimizer_step(r1, p1, g1, 0.1);
    float *b0[SUMO_OPTIMIZER_MAX_STATE_BUFFERS], *b1[SUMO_OPTIMIZER_MAX_STATE_BUFFERS];
    size_t c0, c1;
    int n0, n1;
    sumo_optimizer_state_buffers(r0, b0, &c0, &n0);
    sumo_optimizer_state_buffers(r1, b1, &c1, &n1);
    assert_int_equal(n0 * (int)c0, 8);
    /* One pass over the contiguous block, as one allreduce(average) would do. */
    for (size_t i = 0; i < (size_t)n0 * c0; i++) {
        float avg = (b0[0][i] + b1[0][i]) / 2;
        b0[0][i] = b1[0][i] = avg;
    }
    /* m = 0.1 g and v = 0.001 g^2 after one step, so the averages are known by hand. */
    CHECK_CLOSE(b0[0][0], 0.1 * (1 + -1) / 2, HAND_TOL);
    CHECK_CLOSE(b0[0][3], 0.1 * (4 + 2) / 2, HAND_TOL);
    CHECK_CLOSE(b0[1][3], 0.001 * (16 + 4) / 2, 1e-9);
    /* Next step with g = 0 on rank 0: m2 = 0.9 m, v2 = 0.999 v, t = 2. */
    const float zero[4] = {0, 0, 0, 0};
    double m = 0.1 * 3, v = 0.001 * 10;
    double want = p0[3] - 0.1 * (0.9 * m / 0.19) / (sqrt(0.999 * v / (1 - 0.999 * 0.999)) + 1e-8);
    sumo_optimizer_step(r0, p0, zero, 0.1);
    CHECK_CLOSE(p0[3], want, HAND_TOL);
    sumo_optimizer_destroy(r0);
    sumo_optimizer_destroy(r1);
}

/* A NaN or Inf gradient is refused before anything changes; without the check it flows. */
static void test_nonfinite_gradient(void **state)
{
    (void)state;
    size_t sizes[] = {3};
    for (int which = 0; which < 5; which++) {
        sumo_optimizer_options o = checkpoint_kinds(which);
        sumo_optimizer *opt = make(&o, sizes, 1);
        float p[3] = {1, 2, 3};
        float g[3] = {0.5f, 0.5f, 0.5f};
        sumo_optimizer_step(opt, p, g, 0.1);
        float p_before[3];
        memcpy(p_before, p, sizeof p);
        size_t bytes;
        void *before = saved_state(opt, &bytes);
        const float bad_values[] = {NAN, INFINITY, -INFINITY};
        for (int b = 0; b < 3; b++) {
            g[1] = bad_values[b];
            assert_int_equal(sumo_optimizer_step(opt, p, g, 0.1), SUMO_ERR_INVALID_ARGUMENT);
            assert_memory_equal(p, p_before, sizeof p);
            void *after = saved_state(opt, &bytes);
            assert_memory_equal(before, after, bytes); /* state and step count */
            free(after);
        }
        free(before);
        sumo_optimizer_destroy(opt);

        o.check_finite = 0;
        opt = make(&o, sizes, 1);
        g[1] = NAN;
        assert_int_equal(sumo_optimizer_step(opt, p, g, 0.1), SUMO_SUCCESS);
        assert_true(isnan(p[1]));
        sumo_optimizer_destroy(opt);
    }
}

/* Horovod's delta mode, as documented: save, step, subtract. For plain SGD the delta is
 * -lr * g up to the rounding of the params. */
static void test_delta_mode(void **state)
{
    (void)state;
    size_t sizes[] = {3};
    sumo_optimizer_options o = opts_of(SUMO_OPTIM_SGD);
    sumo_optimizer *opt = make(&o, sizes, 1);
    float p[3] = {1.0f, 0.5f, -0.75f}, old[3];
    const float g[3] = {0.5f, -0.25f, 1.0f};
    memcpy(old, p, sizeof p);
    sumo_optimizer_step(opt, p, g, 0.125); /* powers of two: every operation exact */
    for (int i = 0; i < 3; i++) assert_true(p[i] - old[i] == -0.125f * g[i]);
    sumo_optimizer_destroy(opt);
}

/* The lock: one thread steps while another saves snapshots; every snapshot must pair a step
 * count with the momentum buffer of exactly that many steps (SGD, momentum 0.5, g = 1, lr 0,
 * so buf_t = 0.5 buf_{t-1} + 1 in float, the library's own operations). */
typedef struct stepper_arg {
    sumo_optimizer *opt;
    int steps;
} stepper_arg;

static void *stepper(void *argp)
{
    stepper_arg *a = argp;
    float p[64] = {0}, g[64];
    for (int i = 0; i < 64; i++) g[i] = 1.0f;
    for (int t = 0; t < a->steps; t++) {
        if (sumo_optimizer_step(a->opt, p, g, 0.0) != SUMO_SUCCESS) return argp;
    }
    return NULL;
}

static void test_threads_snapshot_consistent(void **state)
{
    (void)state;
    sumo_optimizer_options o = opts_of(SUMO_OPTIM_SGD);
    o.momentum = 0.5;
    size_t sizes[] = {64};
    sumo_optimizer *opt = make(&o, sizes, 1);
    enum { STEPS = 2000 };
    static float expected[STEPS + 1];
    expected[0] = 0.0f;
    expected[1] = 1.0f;
    for (int t = 2; t <= STEPS; t++) expected[t] = 0.5f * expected[t - 1] + 1.0f;

    stepper_arg arg = {opt, STEPS};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, stepper, &arg), 0);
    size_t bytes;
    sumo_optimizer_state_size(opt, &bytes);
    unsigned char *snap = malloc(bytes);
    uint64_t last = 0;
    for (int k = 0; k < 500; k++) {
        assert_int_equal(sumo_optimizer_state_save(opt, snap, bytes), SUMO_SUCCESS);
        uint64_t steps;
        memcpy(&steps, snap + 40, sizeof steps);
        assert_true(steps >= last && steps <= STEPS);
        last = steps;
        for (int i = 0; i < 64; i++) {
            float b;
            memcpy(&b, snap + 56 + 4 * (size_t)i, sizeof b);
            assert_true(b == expected[steps]);
        }
    }
    void *ret = &arg;
    pthread_join(th, &ret);
    assert_null(ret);
    uint64_t steps;
    sumo_optimizer_step_count(opt, &steps);
    assert_int_equal(steps, STEPS);
    free(snap);
    sumo_optimizer_destroy(opt);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_checkpoint_round_trip),
        cmocka_unit_test(test_checkpoint_rejects_mismatch),
        cmocka_unit_test(test_state_reset),
        cmocka_unit_test(test_state_buffers_average),
        cmocka_unit_test(test_nonfinite_gradient),
        cmocka_unit_test(test_delta_mode),
        cmocka_unit_test(test_threads_snapshot_consistent),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
