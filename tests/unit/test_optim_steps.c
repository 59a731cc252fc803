/*
 * Optimizer steps (SGD, Adam, AdamW, LAMB). The first steps of each optimizer are checked
 * against values worked out by hand (the arithmetic is written out next to each expectation,
 * in double); longer runs against a plain double-precision reference written here from the
 * papers' and PyTorch's formulas, independent of the library's loops.
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
/* SGD by hand                                                                               */

static void test_sgd_plain_hand(void **state)
{
    (void)state;
    sumo_optimizer_options o = opts_of(SUMO_OPTIM_SGD);
    size_t sizes[] = {2};
    sumo_optimizer *opt = make(&o, sizes, 1);
    float p[2] = {1.0f, -2.0f};
    const float g[2] = {0.5f, 0.25f};
    assert_int_equal(sumo_optimizer_step(opt, p, g, 0.1), SUMO_SUCCESS);
    CHECK_CLOSE(p[0], 1.0 - 0.1 * 0.5, HAND_TOL);   /* 0.95 */
    CHECK_CLOSE(p[1], -2.0 - 0.1 * 0.25, HAND_TOL); /* -2.025 */
    assert_int_equal(sumo_optimizer_step(opt, p, g, 0.1), SUMO_SUCCESS);
    CHECK_CLOSE(p[0], 0.9, HAND_TOL);
    CHECK_CLOSE(p[1], -2.05, HAND_TOL);
    float *bufs[SUMO_OPTIMIZER_MAX_STATE_BUFFERS];
    size_t count = 99;
    int nbufs = 99;
    assert_int_equal(sumo_optimizer_state_buffers(opt, bufs, &count, &nbufs), SUMO_SUCCESS);
    assert_int_equal(nbufs, 0); /* plain SGD keeps no state */
    assert_int_equal(count, 2);
    sumo_optimizer_destroy(opt);
}

/* Constant gradient 1, p0 = 1, lr 0.1, momentum 0.9. */
static void test_sgd_momentum_hand(void **state)
{
    (void)state;
    sumo_optimizer_options o = opts_of(SUMO_OPTIM_SGD);
    o.momentum = 0.9;
    size_t sizes[] = {1};
    sumo_optimizer *opt = make(&o, sizes, 1);
    float p[1] = {1.0f};
    const float g[1] = {1.0f};
    float *bufs[SUMO_OPTIMIZER_MAX_STATE_BUFFERS];
    size_t count;
    int nbufs;
    assert_int_equal(sumo_optimizer_state_buffers(opt, bufs, &count, &nbufs), SUMO_SUCCESS);
    assert_int_equal(nbufs, 1);
    assert_int_equal(count, 1);

    sumo_optimizer_step(opt, p, g, 0.1);
    CHECK_CLOSE(bufs[0][0], 1.0, HAND_TOL); /* first step: buf = g */
    CHECK_CLOSE(p[0], 1.0 - 0.1 * 1.0, HAND_TOL);
    sumo_optimizer_step(opt, p, g, 0.1);
    CHECK_CLOSE(bufs[0][0], 0.9 * 1.0 + 1.0, HAND_TOL); /* 1.9 */
    CHECK_CLOSE(p[0], 0.9 - 0.1 * 1.9, HAND_TOL);       /* 0.71 */
    sumo_optimizer_step(opt, p, g, 0.1);
    CHECK_CLOSE(bufs[0][0], 0.9 * 1.9 + 1.0, HAND_TOL); /* 2.71 */
    CHECK_CLOSE(p[0], 0.71 - 0.1 * 2.71, HAND_TOL);     /* 0.439 */
    sumo_optimizer_destroy(opt);
}

static void test_sgd_nesterov_hand(void **state)
{
    (void)state;
    sumo_optimizer_options o = opts_of(SUMO_OPTIM_SGD);
    o.momentum = 0.9;
    o.nesterov = 1;
    size_t sizes[] = {1};
    sumo_optimizer *opt = make(&o, sizes, 1);
    float p[1] = {1.0f};
    const float g[1] = {1.0f};
    /* step 1: buf = 1, d = g + 0.9 buf = 1.9 */
    sumo_optimizer_step(opt, p, g, 0.1);
    CHECK_CLOSE(p[0], 1.0 - 0.1 * 1.9, HAND_TOL); /* 0.81 */
    /* step 2: buf = 0.9 + 1 = 1.9, d = 1 + 0.9 * 1.9 = 2.71 */
    sumo_optimizer_step(opt, p, g, 0.1);
    CHECK_CLOSE(p[0], 0.81 - 0.1 * 2.71, HAND_TOL); /* 0.539 */
    /* step 3: buf = 0.9 * 1.9 + 1 = 2.71, d = 1 + 0.9 * 2.71 = 3.439 */
    sumo_optimizer_step(opt, p, g, 0.1);
    CHECK_CLOSE(p[0], 0.539 - 0.1 * 3.439, HAND_TOL); /* 0.1951 */
    sumo_optimizer_destroy(opt);
}

static void test_sgd_dampening_hand(void **state)
{
    (void)state;
    sumo_optimizer_options o = opts_of(SUMO_OPTIM_SGD);
    o.momentum = 0.9;
    o.dampening = 0.5;
    size_t sizes[] = {1};
    sumo_optimizer *opt = make(&o, sizes, 1);
    float p[1] = {1.0f};
    const float g[1] = {1.0f};
    /* step 1: PyTorch does not dampen the first step: buf = g = 1 */
    sumo_optimizer_step(opt, p, g, 0.1);
    CHECK_CLOSE(p[0], 0.9, HAND_TOL);
    /* step 2: buf = 0.9 * 1 + (1 - 0.5) * 1 = 1.4 */
    sumo_optimizer_step(opt, p, g, 0.1);
    CHECK_CLOSE(p[0], 0.9 - 0.1 * 1.4, HAND_TOL); /* 0.76 */
    /* step 3: buf = 0.9 * 1.4 + 0.5 = 1.76 */
    sumo_optimizer_step(opt, p, g, 0.1);
    CHECK_CLOSE(p[0], 0.76 - 0.1 * 1.76, HAND_TOL); /* 0.584 */
    sumo_optimizer_destroy(opt);
}

/* L2 weight decay enters the gradient, and so the momentum buffer. */
static void test_sgd_weight_decay_hand(void **state)
{
    (void)state;
    sumo_optimizer_options o = opts_of(SUMO_OPTIM_SGD);
    o.weight_decay = 0.1;
    size_t sizes[] = {1};
    sumo_optimizer *opt = make(&o, sizes, 1);
    float p[1] = {2.0f};
    const float g[1] = {1.0f};
    sumo_optimizer_step(opt, p, g, 0.5);
    CHECK_CLOSE(p[0], 2.0 - 0.5 * (1.0 + 0.1 * 2.0), HAND_TOL); /* 1.4 */
    sumo_optimizer_step(opt, p, g, 0.5);
    CHECK_CLOSE(p[0], 1.4 - 0.5 * (1.0 + 0.1 * 1.4), HAND_TOL); /* 0.83 */
    sumo_optimizer_destroy(opt);

    o.momentum = 0.5;
    opt = make(&o, sizes, 1);
    p[0] = 2.0f;
    sumo_optimizer_step(opt, p, g, 0.5); /* buf = 1.2 */
    CHECK_CLOSE(p[0], 1.4, HAND_TOL);
    sumo_optimizer_step(opt, p, g, 0.5); /* buf = 0.5 * 1.2 + (1 + 0.14) = 1.74 */
    CHECK_CLOSE(p[0], 1.4 - 0.5 * 1.74, HAND_TOL); /* 0.53 */
    sumo_optimizer_destroy(opt);
}

/* ---------------------------------------------------------------------------------------- */
/* Adam, AdamW by hand                                                                       */

/* A constant gradient makes m^ = g and v^ = g^2 exactly (in real arithmetic) at every step,
 * so each step moves p by lr * g / (|g| + eps). */
static void test_adam_constant_gradient_hand(void **state)
{
    (void)state;
    sumo_optimizer_options o = opts_of(SUMO_OPTIM_ADAM);
    size_t sizes[] = {3};
    sumo_optimizer *opt = make(&o, sizes, 1);
    float p[3] = {1.0f, 1.0f, 1.0f};
    const float g[3] = {0.5f, -2.0f, 0.0f};
    for (int t = 1; t <= 3; t++) {
        assert_int_equal(sumo_optimizer_step(opt, p, g, 0.1), SUMO_SUCCESS);
        CHECK_CLOSE(p[0], 1.0 - t * 0.1 * 0.5 / (0.5 + 1e-8), HAND_TOL);
        CHECK_CLOSE(p[1], 1.0 + t * 0.1 * 2.0 / (2.0 + 1e-8), HAND_TOL);
        CHECK_CLOSE(p[2], 1.0, 0); /* m = 0: 0 / (0 + eps) = 0, exactly */
    }
    uint64_t steps = 0;
    assert_int_equal(sumo_optimizer_step_count(opt, &steps), SUMO_SUCCESS);
    assert_int_equal(steps, 3);
    sumo_optimizer_destroy(opt);
}

/* Gradients 1 then 3: the bias corrections differ between steps. */
static void test_adam_two_steps_hand(void **state)
{
    (void)state;
    sumo_optimizer_options o = opts_of(SUMO_OPTIM_ADAM);
    size_t sizes[] = {1};
    sumo_optimizer *opt = make(&o, sizes, 1);
    float p[1] = {1.0f};
    float g[1] = {1.0f};
    float *bufs[SUMO_OPTIMIZER_MAX_STATE_BUFFERS];
    size_t count;
    int nbufs;
    assert_int_equal(sumo_optimizer_state_buffers(opt, bufs, &count, &nbufs), SUMO_SUCCESS);
    assert_int_equal(nbufs, 2);
    assert_ptr_equal(bufs[1], bufs[0] + 1); /* contiguous: one allreduce covers both */

    sumo_optimizer_step(opt, p, g, 0.01);
    double m1 = 0.1 * 1.0, v1 = 0.001 * 1.0;
    CHECK_CLOSE(bufs[0][0], m1, HAND_TOL);
    CHECK_CLOSE(bufs[1][0], v1, 1e-9);
    /* m^ = 0.1 / 0.1 = 1, v^ = 0.001 / 0.001 = 1: p = 1 - 0.01 * 1 / (1 + 1e-8) */
    double p1 = 1.0 - 0.01 * 1.0 / (1.0 + 1e-8);
    CHECK_CLOSE(p[0], p1, HAND_TOL);

    g[0] = 3.0f;
    sumo_optimizer_step(opt, p, g, 0.01);
    double m2 = 0.9 * m1 + 0.1 * 3.0;             /* 0.39 */
    double v2 = 0.999 * v1 + 0.001 * 9.0;         /* 0.009999 */
    double mh = m2 / (1.0 - 0.9 * 0.9);           /* 0.39 / 0.19 = 2.05263158 */
    double vh = v2 / (1.0 - 0.999 * 0.999);       /* 0.009999 / 0.001999 = 5.00200100 */
    double p2 = p1 - 0.01 * mh / (sqrt(vh) + 1e-8); /* 0.99 - 0.01 * 0.91777... */
    CHECK_CLOSE(bufs[0][0], m2, HAND_TOL);
    CHECK_CLOSE(bufs[1][0], v2, 1e-8);
    CHECK_CLOSE(p[0], p2, HAND_TOL);
    CHECK_CLOSE(p[0], 0.9808222, 1e-6); /* the same number, as a decimal */
    sumo_optimizer_destroy(opt);
}

/* Zero gradient, p = 2, weight decay 0.1, lr 0.1: Adam puts 0.1 * 2 = 0.2 into the gradient
 * (so the step is ~ lr * sign); AdamW shrinks p by 1 - lr * wd = 0.99 and Adam sees g = 0. */
static void test_adam_vs_adamw_weight_decay_hand(void **state)
{
    (void)state;
    size_t sizes[] = {1};
    const float g[1] = {0.0f};

    sumo_optimizer_options o = opts_of(SUMO_OPTIM_ADAM);
    o.weight_decay = 0.1;
    sumo_optimizer *opt = make(&o, sizes, 1);
    float p[1] = {2.0f};
    sumo_optimizer_step(opt, p, g, 0.1);
    double g1 = 0.1 * 2.0; /* m^ = g1, v^ = g1^2 */
    double p1 = 2.0 - 0.1 * g1 / (g1 + 1e-8);
    CHECK_CLOSE(p[0], p1, HAND_TOL); /* 1.9 */
    sumo_optimizer_step(opt, p, g, 0.1);
    double g2 = 0.1 * p1;
    double m2 = 0.9 * 0.1 * g1 + 0.1 * g2, v2 = 0.999 * 0.001 * g1 * g1 + 0.001 * g2 * g2;
    double p2 = p1 - 0.1 * (m2 / 0.19) / (sqrt(v2 / (1 - 0.999 * 0.999)) + 1e-8);
    CHECK_CLOSE(p[0], p2, HAND_TOL);
    sumo_optimizer_destroy(opt);

    o = opts_of(SUMO_OPTIM_ADAMW);
    o.weight_decay = 0.1;
    opt = make(&o, sizes, 1);
    p[0] = 2.0f;
    sumo_optimizer_step(opt, p, g, 0.1);
    CHECK_CLOSE(p[0], 2.0 * 0.99, HAND_TOL); /* 1.98 */
    sumo_optimizer_step(opt, p, g, 0.1);
    CHECK_CLOSE(p[0], 2.0 * 0.99 * 0.99, HAND_TOL); /* 1.9602 */
    float *bufs[SUMO_OPTIMIZER_MAX_STATE_BUFFERS];
    size_t count;
    int nbufs;
    sumo_optimizer_state_buffers(opt, bufs, &count, &nbufs);
    assert_true(bufs[0][0] == 0.0f && bufs[1][0] == 0.0f); /* decay never reaches the moments */
    sumo_optimizer_destroy(opt);
}

/* ---------------------------------------------------------------------------------------- */
/* LAMB by hand                                                                              */

/* Layout {2, 0, 2, 2}: A = (3, 4) with g = (1, -1); an empty tensor; B = (0, 0), a zero-norm
 * weight, with g = (2, 2); C = (1, 1) with g = 0, a zero-norm update. wd 0, lr 0.1.
 * Step 1: m^ = g, v^ = g^2, r = g / (|g| + eps).
 *   A: trust = |x| / |r|, so trust * r = |x| * r / |r| = 5 (1, -1) / sqrt(2) whatever eps is.
 *   B: |x| = 0: trust 1, x = -0.1 * 2 / (2 + 1e-6) in both entries.
 *   C: r = 0, |r| = 0: trust 1 and the update is 0, x stays (1, 1). */
static void test_lamb_trust_ratio_hand(void **state)
{
    (void)state;
    sumo_optimizer_options o = opts_of(SUMO_OPTIM_LAMB);
    o.weight_decay = 0.0;
    size_t sizes[] = {2, 0, 2, 2};
    sumo_optimizer *opt = make(&o, sizes, 4);
    float p[6] = {3.0f, 4.0f, 0.0f, 0.0f, 1.0f, 1.0f};
    const float g[6] = {1.0f, -1.0f, 2.0f, 2.0f, 0.0f, 0.0f};
    assert_int_equal(sumo_optimizer_step(opt, p, g, 0.1), SUMO_SUCCESS);
    double s = 0.1 * 5.0 / sqrt(2.0); /* 0.35355339 */
    CHECK_CLOSE(p[0], 3.0 - s, HAND_TOL);
    CHECK_CLOSE(p[1], 4.0 + s, HAND_TOL);
    CHECK_CLOSE(p[2], -0.1 * 2.0 / (2.0 + 1e-6), HAND_TOL);
    CHECK_CLOSE(p[3], -0.1 * 2.0 / (2.0 + 1e-6), HAND_TOL);
    assert_true(p[4] == 1.0f && p[5] == 1.0f);

    /* Step 2, the same gradient: m^ = g, v^ = g^2 again, so A moves by lr * |x1| along
     * (1, -1) / sqrt(2) and B, now nonzero, by lr * |x1| along its unit r. */
    double a0 = 3.0 - s, a1 = 4.0 + s, na = sqrt(a0 * a0 + a1 * a1);
    double b0 = -0.1 * 2.0 / (2.0 + 1e-6), nb = sqrt(2.0) * fabs(b0);
    assert_int_equal(sumo_optimizer_step(opt, p, g, 0.1), SUMO_SUCCESS);
    CHECK_CLOSE(p[0], a0 - 0.1 * na / sqrt(2.0), HAND_TOL);
    CHECK_CLOSE(p[1], a1 + 0.1 * na / sqrt(2.0), HAND_TOL);
    CHECK_CLOSE(p[2], b0 - 0.1 * nb / sqrt(2.0), HAND_TOL); /* b0 * (1 + 0.1) */
    CHECK_CLOSE(p[3], b0 * 1.1, HAND_TOL);
    assert_true(p[4] == 1.0f && p[5] == 1.0f);
    sumo_optimizer_destroy(opt);
}

/* With weight decay 0.5 on A = (3, 4), g = (1, -1), lr 0.1, eps 1e-6:
 *   r = (1 / (1 + 1e-6) + 1.5, -1 / (1 + 1e-6) + 2) ~ (2.5, 1.0)
 *   trust = 5 / |r| ~ 5 / 2.6925824 = 1.8569534 */
static void test_lamb_weight_decay_hand(void **state)
{
    (void)state;
    sumo_optimizer_options o = opts_of(SUMO_OPTIM_LAMB);
    o.weight_decay = 0.5;
    size_t sizes[] = {2};
    sumo_optimizer *opt = make(&o, sizes, 1);
    float p[2] = {3.0f, 4.0f};
    const float g[2] = {1.0f, -1.0f};
    sumo_optimizer_step(opt, p, g, 0.1);
    double u = 1.0 / (1.0 + 1e-6);
    double r0 = u + 0.5 * 3.0, r1 = -u + 0.5 * 4.0;
    double trust = 5.0 / sqrt(r0 * r0 + r1 * r1);
    CHECK_CLOSE(trust, 1.8569534, 1e-6);
    CHECK_CLOSE(p[0], 3.0 - 0.1 * trust * r0, HAND_TOL); /* 2.5357617 */
    CHECK_CLOSE(p[1], 4.0 - 0.1 * trust * r1, HAND_TOL); /* 3.8143047 */
    sumo_optimizer_destroy(opt);
}

/* ---------------------------------------------------------------------------------------- */
/* Independent double-precision references for longer runs                                    */

typedef struct ref_state {
    double *p, *m, *v;
    uint64_t t;
} ref_state;

static void ref_sgd(const sumo_optimizer_options *o, ref_state *s, const float *g, size_t n,
                    double lr)
{
    for (size_t i = 0; i < n; i++) {
        double d = g[i] + o->weight_decay * s->p[i];
        if (o->momentum > 0) {
            s->m[i] = s->t == 0 ? d : o->momentum * s->m[i] + (1 - o->dampening) * d;
            d = o->nesterov ? d + o->momentum * s->m[i] : s->m[i];
        }
        s->p[i] -= lr * d;
    }
    s->t++;
}

static void ref_adam(const sumo_optimizer_options *o, ref_state *s, const float *g, size_t n,
                     double lr)
{
    s->t++;
    for (size_t i = 0; i < n; i++) {
        double gi = g[i];
        if (o->kind == SUMO_OPTIM_ADAMW) s->p[i] *= 1 - lr * o->weight_decay;
        else gi += o->weight_decay * s->p[i];
        s->m[i] = o->beta1 * s->m[i] + (1 - o->beta1) * gi;
        s->v[i] = o->beta2 * s->v[i] + (1 - o->beta2) * gi * gi;
        double mh = s->m[i] / (1 - pow(o->beta1, (double)s->t));
        double vh = s->v[i] / (1 - pow(o->beta2, (double)s->t));
        s->p[i] -= lr * mh / (sqrt(vh) + o->eps);
    }
}

static void ref_lamb(const sumo_optimizer_options *o, ref_state *s, const float *g,
                     const size_t *sizes, size_t ntensors, double lr)
{
    s->t++;
    size_t off = 0;
    for (size_t k = 0; k < ntensors; k++) {
        double *r = calloc(sizes[k] + 1, sizeof *r);
        double xn = 0, rn = 0;
        for (size_t j = 0; j < sizes[k]; j++) {
            size_t i = off + j;
            s->m[i] = o->beta1 * s->m[i] + (1 - o->beta1) * g[i];
            s->v[i] = o->beta2 * s->v[i] + (1 - o->beta2) * (double)g[i] * g[i];
            double mh = s->m[i] / (1 - pow(o->beta1, (double)s->t));
            double vh = s->v[i] / (1 - pow(o->beta2, (double)s->t));
            r[j] = mh / (sqrt(vh) + o->eps) + o->weight_decay * s->p[i];
            xn += s->p[i] * s->p[i];
            rn += r[j] * r[j];
        }
        double trust = (xn > 0 && rn > 0) ? sqrt(xn) / sqrt(rn) : 1.0;
        for (size_t j = 0; j < sizes[k]; j++) s->p[off + j] -= lr * trust * r[j];
        free(r);
        off += sizes[k];
    }
}

/* 20 steps with a varying rate and gradients that depend on the parameters (a quadratic pull
 * towards 0.3 plus noise), library against reference, within 1e-6 relative. */
static void run_against_reference(const sumo_optimizer_options *o, const size_t *sizes,
                                  size_t ntensors, double lr0)
{
    size_t n = 0;
    for (size_t k = 0; k < ntensors; k++) n += sizes[k];
    float *p = malloc(n * sizeof *p), *g = malloc(n * sizeof *g);
    ref_state s = {calloc(n, sizeof(double)), calloc(n, sizeof(double)),
                   calloc(n, sizeof(double)), 0};
    uint64_t rng = 12345;
    for (size_t i = 0; i < n; i++) {
        p[i] = next_uniform(&rng);
        s.p[i] = p[i];
    }
    sumo_optimizer_options copy = *o;
    sumo_optimizer *opt = make(&copy, sizes, ntensors);
    for (int step = 0; step < 20; step++) {
        double lr = lr0 * (1.0 + 0.5 * cos(step)); /* any schedule will do */
        /* The gradient is taken at the library's params and fed to both, so the comparison
         * measures one step's rounding at a time and not the drift of two trajectories. */
        for (size_t i = 0; i < n; i++) g[i] = (p[i] - 0.3f) + 0.1f * next_uniform(&rng);
        for (size_t i = 0; i < n; i++) s.p[i] = p[i];
        switch (o->kind) {
        case SUMO_OPTIM_SGD: ref_sgd(o, &s, g, n, lr); break;
        case SUMO_OPTIM_LAMB: ref_lamb(o, &s, g, sizes, ntensors, lr); break;
        default: ref_adam(o, &s, g, n, lr); break;
        }
        assert_int_equal(sumo_optimizer_step(opt, p, g, lr), SUMO_SUCCESS);
        for (size_t i = 0; i < n; i++) CHECK_CLOSE_I(p[i], s.p[i], 1e-6, (int)i);
        /* The state must track the reference too (it is kept in float). */
        float *bufs[SUMO_OPTIMIZER_MAX_STATE_BUFFERS];
        size_t count;
        int nbufs;
        sumo_optimizer_state_buffers(opt, bufs, &count, &nbufs);
        for (int b = 0; b < nbufs; b++) {
            const double *want = b == 0 ? s.m : s.v;
            for (size_t i = 0; i < n; i++) CHECK_CLOSE_I(bufs[b][i], want[i], 1e-6, (int)i);
        }
    }
    sumo_optimizer_destroy(opt);
    free(s.p);
    free(s.m);
    free(s.v);
    free(p);
    free(g);
}

static void test_reference_sgd(void **state)
{
    (void)state;
    size_t sizes[] = {7, 33, 1};
    sumo_optimizer_options o = opts_of(SUMO_OPTIM_SGD);
    run_against_reference(&o, sizes, 3, 0.05);
    o.momentum = 0.9;
    run_against_reference(&o, sizes, 3, 0.05);
    o.dampening = 0.3;
    o.weight_decay = 1e-2;
    run_against_reference(&o, sizes, 3, 0.05);
    o.dampening = 0;
    o.nesterov = 1;
    run_against_reference(&o, sizes, 3, 0.05);
}

static void test_reference_adam(void **state)
{
    (void)state;
    size_t sizes[] = {64, 3};
    sumo_optimizer_options o = opts_of(SUMO_OPTIM_ADAM);
    run_against_reference(&o, sizes, 2, 1e-2);
    o.weight_decay = 0.05;
    o.beta1 = 0.5;
    o.beta2 = 0.9;
    o.eps = 1e-3;
    run_against_reference(&o, sizes, 2, 1e-2);
    o = opts_of(SUMO_OPTIM_ADAMW);
    o.weight_decay = 0.1;
    run_against_reference(&o, sizes, 2, 1e-2);
}

static void test_reference_lamb(void **state)
{
    (void)state;
    size_t sizes[] = {16, 5, 0, 40, 1};
    sumo_optimizer_options o = opts_of(SUMO_OPTIM_LAMB);
    run_against_reference(&o, sizes, 5, 1e-2);
    o.weight_decay = 0.0;
    o.beta1 = 0.0;
    run_against_reference(&o, sizes, 5, 1e-2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sgd_plain_hand),
        cmocka_unit_test(test_sgd_momentum_hand),
        cmocka_unit_test(test_sgd_nesterov_hand),
        cmocka_unit_test(test_sgd_dampening_hand),
        cmocka_unit_test(test_sgd_weight_decay_hand),
        cmocka_unit_test(test_adam_constant_gradient_hand),
        cmocka_unit_test(test_adam_two_steps_hand),
        cmocka_unit_test(test_adam_vs_adamw_weight_decay_hand),
        cmocka_unit_test(test_lamb_trust_ratio_hand),
        cmocka_unit_test(test_lamb_weight_decay_hand),
        cmocka_unit_test(test_reference_sgd),
        cmocka_unit_test(test_reference_adam),
        cmocka_unit_test(test_reference_lamb),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
