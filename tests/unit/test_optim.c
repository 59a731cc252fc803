/*
 * Optimizers and learning-rate schedules. The first steps of each optimizer are checked
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

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* |got - want| <= tol * max(1, |want|): relative for large values, absolute near zero. */
static void check_close_at(double got, double want, double tol, const char *what, int i,
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

static sumo_optimizer *make(sumo_optimizer_options *o, const size_t *sizes, size_t ntensors)
{
    sumo_optimizer *opt = NULL;
    assert_int_equal(sumo_optimizer_create(o, sizes, ntensors, &opt), SUMO_SUCCESS);
    assert_non_null(opt);
    return opt;
}

static sumo_optimizer_options opts_of(sumo_optimizer_kind kind)
{
    sumo_optimizer_options o;
    assert_int_equal(sumo_optimizer_options_default(kind, &o), SUMO_SUCCESS);
    return o;
}

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

/* Deterministic pseudo-random floats in [-1, 1). */
static float next_uniform(uint64_t *x)
{
    *x = *x * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(*x >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
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

static void *saved_state(const sumo_optimizer *opt, size_t *bytes)
{
    assert_int_equal(sumo_optimizer_state_size(opt, bytes), SUMO_SUCCESS);
    void *buf = malloc(*bytes);
    assert_int_equal(sumo_optimizer_state_save(opt, buf, *bytes), SUMO_SUCCESS);
    return buf;
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
        cmocka_unit_test(test_checkpoint_round_trip),
        cmocka_unit_test(test_checkpoint_rejects_mismatch),
        cmocka_unit_test(test_state_reset),
        cmocka_unit_test(test_state_buffers_average),
        cmocka_unit_test(test_nonfinite_gradient),
        cmocka_unit_test(test_delta_mode),
        cmocka_unit_test(test_threads_snapshot_consistent),
        cmocka_unit_test(test_bad_options),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_set_step_count),
        cmocka_unit_test(test_lr_constant),
        cmocka_unit_test(test_lr_goyal_warmup_step),
        cmocka_unit_test(test_lr_cosine),
        cmocka_unit_test(test_lr_bad),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
