/*
 * Whole models' gradients (train/model.h): the MLP's and the CNN's loss against a double
 * reference model built from the layer references of support/model_check.h, and their
 * gradients against central finite differences of it, at every coordinate of small models
 * and sampled at the real sizes.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "support/harness.h"
#include "support/model_check.h"
#include "train/layers.h"
#include "train/model.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------- */
/* Whole models against a double reference                                                   */

typedef struct model_ctx {
    sumo__model_config cfg;
    size_t batch;
    const size_t *sizes;
    size_t ntensors;
    double *x;
    const uint8_t *y;
    double *a, *b, *z; /* activation scratch */
} model_ctx;

static double ref_model_loss(const double *p, void *ctx)
{
    model_ctx *c = ctx;
    const sumo__model_config *g = &c->cfg;
    const double *t[8];
    size_t off = 0;
    for (size_t i = 0; i < c->ntensors; i++) t[i] = p + off, off += c->sizes[i];
    const size_t B = c->batch;
    if (g->kind == SUMO__MODEL_MLP) {
        int in = g->in_rows * g->in_cols;
        ref_dense(c->x, B, in, g->hidden, t[0], t[1], c->a);
        ref_relu(c->a, B * g->hidden);
        ref_dense(c->a, B, g->hidden, g->classes, t[2], t[3], c->z);
        return ref_softmax_ce(c->z, c->y, B, g->classes);
    }
    const int k = g->kernel;
    sumo__conv_shape s1 = {g->in_rows, g->in_cols, 1, k, g->conv1};
    int h1 = g->in_rows - k + 1, w1 = g->in_cols - k + 1;
    ref_conv(c->x, B, &s1, t[0], t[1], c->a);
    ref_relu(c->a, B * h1 * w1 * g->conv1);
    ref_maxpool(c->a, B, h1, w1, g->conv1, c->b);
    sumo__conv_shape s2 = {h1 / 2, w1 / 2, g->conv1, k, g->conv2};
    int h2 = h1 / 2 - k + 1, w2 = w1 / 2 - k + 1;
    ref_conv(c->b, B, &s2, t[2], t[3], c->a);
    ref_relu(c->a, B * h2 * w2 * g->conv2);
    ref_maxpool(c->a, B, h2, w2, g->conv2, c->b);
    int flat = (h2 / 2) * (w2 / 2) * g->conv2;
    ref_dense(c->b, B, flat, g->hidden, t[4], t[5], c->a);
    ref_relu(c->a, B * g->hidden);
    ref_dense(c->a, B, g->hidden, g->classes, t[6], t[7], c->z);
    return ref_softmax_ce(c->z, c->y, B, g->classes);
}

/*
 * Library gradients vs central differences of the double reference, at every coordinate
 * when stride is 1, else at every stride-th (offset by a per-tensor phase so each tensor is
 * sampled). Returns the largest relative error seen on coordinates with |g| > 1e-4.
 */
static double check_model(const sumo__model_config *cfg, size_t batch, uint64_t seed,
                          size_t stride)
{
    sumo__model *m = NULL;
    assert_int_equal(sumo__model_create_config(cfg, batch, seed, &m), SUMO_SUCCESS);
    const size_t np = sumo__model_num_params(m), pixels = (size_t)cfg->in_rows * cfg->in_cols;
    float *x;
    uint8_t *y;
    make_batch(batch, pixels, cfg->classes, seed + 1, &x, &y);
    /* Nonzero biases, so their gradients matter to the check too. */
    uint64_t rng = seed + 2;
    float *params = sumo__model_params(m);
    const size_t *sizes;
    size_t nt;
    sumo__model_layout(m, &sizes, &nt);
    for (size_t t = 0, off = 0; t < nt; off += sizes[t], t++)
        if (t % 2 == 1) fill(params + off, sizes[t], 0.1, &rng);

    double loss = 0;
    assert_int_equal(sumo__model_forward_backward(m, x, y, batch, &loss), SUMO_SUCCESS);
    const float *g = sumo__model_grads(m);

    size_t big = batch * 16384; /* the largest activation per sample is 24*24*8 */
    model_ctx c = {*cfg, batch, sizes, nt, dalloc(batch * pixels), y,
                   dalloc(big), dalloc(big), dalloc(batch * (size_t)cfg->classes)};
    to_double(x, c.x, batch * pixels);
    double *p = dalloc(np);
    to_double(params, p, np);
    CHECK_CLOSE(loss, ref_model_loss(p, &c), 1e-6, 1e-7, 0);

    double worst = 0;
    size_t checked = 0;
    for (size_t t = 0, off = 0; t < nt; off += sizes[t], t++) {
        for (size_t i = (t * 7) % (stride < sizes[t] ? stride : sizes[t]); i < sizes[t];
             i += stride) {
            double want = fd(ref_model_loss, p, off + i, &c);
            double got = g[off + i];
            double err = fabs(got - want) / fmax(fmax(fabs(got), fabs(want)), 1e-4);
            if (err > 1e-2)
                fail_msg("%s[%zu]: gradient %.8g, finite difference %.8g",
                         sumo__model_tensor_name(m, t), i, got, want);
            worst = fmax(worst, err);
            checked++;
        }
    }
    assert_true(checked >= nt);
    free(p), free(c.x), free(c.a), free(c.b), free(c.z), free(x), free(y);
    sumo__model_destroy(m);
    return worst;
}

static void test_mlp_gradients(void **state)
{
    (void)state;
    sumo__model_config cfg;
    assert_int_equal(sumo__model_config_default(SUMO__MODEL_MLP, &cfg), SUMO_SUCCESS);
    cfg.in_rows = 6, cfg.in_cols = 5, cfg.hidden = 7;
    double worst = check_model(&cfg, 6, 100, 1); /* all 297 coordinates */
    print_message("mlp small: worst relative gradient error %.2g\n", worst);
    assert_true(worst < 1e-3);
    assert_int_equal(sumo__model_config_default(SUMO__MODEL_MLP, &cfg), SUMO_SUCCESS);
    worst = check_model(&cfg, 3, 101, 331); /* the real size, sampled */
    print_message("mlp 784-128-10: worst relative gradient error %.2g\n", worst);
    assert_true(worst < 1e-3);
}

static void test_cnn_gradients(void **state)
{
    (void)state;
    sumo__model_config cfg;
    assert_int_equal(sumo__model_config_default(SUMO__MODEL_CNN, &cfg), SUMO_SUCCESS);
    cfg.in_rows = 14, cfg.in_cols = 13, cfg.kernel = 3, cfg.conv1 = 3, cfg.conv2 = 4,
    cfg.hidden = 6, cfg.classes = 5;
    /* 20 samples: more than one convolution chunk, so the chunked sums are covered. */
    double worst = check_model(&cfg, 20, 200, 1);
    print_message("cnn small: worst relative gradient error %.2g\n", worst);
    assert_true(worst < 1e-3);
    assert_int_equal(sumo__model_config_default(SUMO__MODEL_CNN, &cfg), SUMO_SUCCESS);
    worst = check_model(&cfg, 18, 201, 401); /* the real size, sampled */
    print_message("cnn default: worst relative gradient error %.2g\n", worst);
    assert_true(worst < 1e-3);
}
int main(void)
{
    openblas_set_num_threads(1); /* the caller's job, as for any user of the model */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mlp_gradients),
        cmocka_unit_test(test_cnn_gradients),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
