/*
 * Layers (train/layers.h). Each layer's forward is compared with a plain double-precision
 * version written from the layout documented in layers.h (support/model_check.h), and its
 * backward with central finite differences of that double version (eps 1e-6, so float
 * rounding plays no part and ReLU or max kinks are practically never crossed); the softmax
 * cross-entropy against values worked out by hand.
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
/* Layer checks: L = sum(out * r) for a fixed random r, so dL/dout = r.                      */

static double dot(const double *a, const float *r, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++) s += a[i] * r[i];
    return s;
}

typedef struct dense_ctx {
    size_t batch;
    int in, out;
    double *x, *w, *b, *y; /* the variable (one of x, w, b) is passed as v */
    const float *r;
    int which; /* 0: x, 1: w, 2: b */
} dense_ctx;

static double dense_loss(const double *v, void *p)
{
    dense_ctx *c = p;
    ref_dense(c->which == 0 ? v : c->x, c->batch, c->in, c->out, c->which == 1 ? v : c->w,
              c->which == 2 ? v : c->b, c->y);
    return dot(c->y, c->r, c->batch * (size_t)c->out);
}

/* Widths that are and are not multiples of the 4-float vectors cover both code paths. */
static void check_dense(size_t B, int in, int out, uint64_t seed)
{
    uint64_t rng = seed;
    float *x = falloc(B * in), *w = falloc((size_t)out * in), *b = falloc(out);
    float *y = falloc(B * out), *r = falloc(B * out);
    float *dw = falloc((size_t)out * in), *db = falloc(out), *dx = falloc(B * in);
    fill(x, B * in, 1.0, &rng), fill(w, (size_t)out * in, 0.5, &rng), fill(b, out, 0.5, &rng);
    fill(r, B * out, 1.0, &rng);
    /* Parameter gradients accumulate: start from known values and subtract them after. */
    float *dw0 = falloc((size_t)out * in), *db0 = falloc(out);
    fill(db0, out, 1.0, &rng), fill(dw0, (size_t)out * in, 1.0, &rng);
    memcpy(dw, dw0, (size_t)out * in * sizeof(float)), memcpy(db, db0, out * sizeof(float));
    fill(dx, B * in, 9.0, &rng); /* garbage: the input gradient is overwritten */

    sumo__dense_forward(x, B, in, out, w, b, false, y);
    sumo__dense_backward(x, r, B, in, out, w, dw, db, dx);
    for (size_t i = 0; i < (size_t)out * in; i++) dw[i] -= dw0[i];
    for (int i = 0; i < out; i++) db[i] -= db0[i];

    dense_ctx c = {B, in, out, dalloc(B * in), dalloc((size_t)out * in), dalloc(out),
                   dalloc(B * out), r, 0};
    to_double(x, c.x, B * in), to_double(w, c.w, (size_t)out * in), to_double(b, c.b, out);
    ref_dense(c.x, B, in, out, c.w, c.b, c.y);
    for (size_t i = 0; i < B * out; i++) CHECK_CLOSE(y[i], c.y[i], 1e-5, 1e-6, i);
    struct { int which; double *v; const float *g; size_t n; } vars[] = {
        {0, c.x, dx, B * in}, {1, c.w, dw, (size_t)out * in}, {2, c.b, db, (size_t)out}};
    for (size_t k = 0; k < 3; k++) {
        c.which = vars[k].which;
        for (size_t i = 0; i < vars[k].n; i++)
            CHECK_CLOSE(vars[k].g[i], fd(dense_loss, vars[k].v, i, &c), 1e-4, 1e-5, i);
    }
    /* dx may be skipped (the first layer has no use for it). */
    sumo__dense_backward(x, r, B, in, out, w, dw, db, NULL);
    /* With ReLU, the forward output is the reference's, clamped. */
    sumo__dense_forward(x, B, in, out, w, b, true, y);
    for (size_t i = 0; i < B * out; i++) CHECK_CLOSE(y[i], fmax(c.y[i], 0.0), 1e-5, 1e-6, i);
    free(c.x), free(c.w), free(c.b), free(c.y), free(dw0), free(db0);
    free(x), free(w), free(b), free(y), free(r), free(dw), free(db), free(dx);
}

static void test_dense_layer(void **state)
{
    (void)state;
    check_dense(5, 7, 6, 11);
    check_dense(3, 9, 3, 12);
    check_dense(1, 4, 8, 13);
}

static void test_relu_layer(void **state)
{
    (void)state;
    float x[6] = {-2.0f, -0.5f, 0.0f, 0.25f, 1.0f, 3.0f};
    float dy[6] = {1, 2, 3, 4, 5, 6};
    sumo__relu_forward(x, 6);
    const float want[6] = {0, 0, 0, 0.25f, 1.0f, 3.0f};
    assert_memory_equal(x, want, sizeof want);
    sumo__relu_backward(x, dy, 6);
    const float wantd[6] = {0, 0, 0, 4, 5, 6}; /* zero output: no gradient (as PyTorch) */
    assert_memory_equal(dy, wantd, sizeof wantd);
}

typedef struct conv_ctx {
    size_t batch;
    sumo__conv_shape s;
    double *x, *w, *b, *y;
    const float *r;
    int which;
} conv_ctx;

static double conv_loss(const double *v, void *p)
{
    conv_ctx *c = p;
    ref_conv(c->which == 0 ? v : c->x, c->batch, &c->s, c->which == 1 ? v : c->w,
             c->which == 2 ? v : c->b, c->y);
    size_t ny = c->batch * (size_t)(c->s.h - c->s.k + 1) * (c->s.w - c->s.k + 1) * c->s.oc;
    return dot(c->y, c->r, ny);
}

static void check_conv(const sumo__conv_shape s, size_t B, uint64_t seed)
{
    uint64_t rng = seed;
    const int oh = sumo__conv_out(s.h, s.k), ow = sumo__conv_out(s.w, s.k);
    const size_t nx = B * s.h * s.w * s.c, kk = (size_t)s.k * s.k * s.c, nw = s.oc * kk;
    const size_t ny = B * oh * ow * s.oc, ncol = B * oh * ow * kk;
    float *x = falloc(nx), *w = falloc(nw), *b = falloc(s.oc), *y = falloc(ny), *r = falloc(ny);
    float *col = falloc(ncol), *dcol = falloc(ncol), *dx = falloc(nx);
    float *dw = falloc(nw), *db = falloc(s.oc), *dw0 = falloc(nw), *db0 = falloc(s.oc);
    fill(x, nx, 1.0, &rng), fill(w, nw, 0.5, &rng), fill(b, s.oc, 0.5, &rng);
    fill(r, ny, 1.0, &rng), fill(dx, nx, 9.0, &rng);
    /* Parameter gradients accumulate: start from known values and subtract them after. */
    fill(dw0, nw, 1.0, &rng), fill(db0, s.oc, 1.0, &rng);
    memcpy(dw, dw0, nw * sizeof(float)), memcpy(db, db0, s.oc * sizeof(float));

    sumo__conv_forward(x, B, &s, w, b, y, col);
    sumo__conv_backward(col, r, B, &s, w, dw, db, dx, dcol);
    for (size_t i = 0; i < nw; i++) dw[i] -= dw0[i];
    for (int i = 0; i < s.oc; i++) db[i] -= db0[i];

    conv_ctx c = {B, s, dalloc(nx), dalloc(nw), dalloc(s.oc), dalloc(ny), r, 0};
    to_double(x, c.x, nx), to_double(w, c.w, nw), to_double(b, c.b, s.oc);
    ref_conv(c.x, B, &s, c.w, c.b, c.y);
    for (size_t i = 0; i < ny; i++) CHECK_CLOSE(y[i], c.y[i], 1e-5, 1e-5, i);
    struct { int which; double *v; const float *g; size_t n; } vars[] = {
        {0, c.x, dx, nx}, {1, c.w, dw, nw}, {2, c.b, db, (size_t)s.oc}};
    for (size_t k = 0; k < 3; k++) {
        c.which = vars[k].which;
        /* dw after subtracting dw0 has lost a few bits: absolute floor 1e-5 covers it. */
        for (size_t i = 0; i < vars[k].n; i++)
            CHECK_CLOSE(vars[k].g[i], fd(conv_loss, vars[k].v, i, &c), 1e-4, 1e-5, i);
    }
    free(c.x), free(c.w), free(c.b), free(c.y);
    free(x), free(w), free(b), free(y), free(r), free(col), free(dcol), free(dx);
    free(dw), free(db), free(dw0), free(db0);
}

static void test_conv_layer(void **state)
{
    (void)state;
    check_conv((sumo__conv_shape){6, 5, 3, 3, 4}, 2, 21);  /* multi-channel, non-square */
    check_conv((sumo__conv_shape){7, 7, 1, 5, 2}, 3, 22);  /* one input channel, 5 x 5 */
    check_conv((sumo__conv_shape){4, 4, 2, 1, 3}, 1, 23);  /* 1 x 1 kernel */
    check_conv((sumo__conv_shape){3, 3, 2, 3, 2}, 2, 24);  /* kernel as large as the image */
    check_conv((sumo__conv_shape){6, 7, 5, 3, 6}, 2, 25);  /* 4-float vectors and tails */
    check_conv((sumo__conv_shape){8, 8, 8, 5, 16}, 2, 26); /* the default conv2's channels */
}

/* im2col and col2im are adjoint: <im2col(x), c> == <x, col2im(c)>. */
static void test_im2col_adjoint(void **state)
{
    (void)state;
    uint64_t rng = 31;
    const sumo__conv_shape s = {6, 7, 3, 3, 1};
    const size_t B = 2, nx = B * 6 * 7 * 3, ncol = B * 4 * 5 * 27;
    float *x = falloc(nx), *c = falloc(ncol), *col = falloc(ncol), *dx = falloc(nx);
    fill(x, nx, 1.0, &rng), fill(c, ncol, 1.0, &rng);
    sumo__im2col(x, B, &s, col);
    sumo__col2im(c, B, &s, dx);
    double a = 0, b = 0;
    for (size_t i = 0; i < ncol; i++) a += (double)col[i] * c[i];
    for (size_t i = 0; i < nx; i++) b += (double)x[i] * dx[i];
    CHECK_CLOSE(a, b, 1e-5, 1e-6, 0);
    free(x), free(c), free(col), free(dx);
}

typedef struct pool_ctx {
    size_t batch;
    int h, w, c;
    double *x, *b, *y;
    bool relu;
    const float *r;
    int which; /* 0: x, 1: bias */
} pool_ctx;

/* The unfused order: y = pool(act(x + bias)). */
static double pool_loss(const double *v, void *p)
{
    pool_ctx *c = p;
    const double *x = c->which == 0 ? v : c->x, *b = c->which == 1 ? v : c->b;
    size_t nx = c->batch * (size_t)c->h * c->w * c->c;
    double *t = dalloc(nx);
    for (size_t i = 0; i < nx; i++) {
        t[i] = x[i] + (b != NULL ? b[i % (size_t)c->c] : 0.0);
        if (c->relu) t[i] = fmax(t[i], 0.0);
    }
    ref_maxpool(t, c->batch, c->h, c->w, c->c, c->y);
    free(t);
    return dot(c->y, c->r, c->batch * (size_t)(c->h / 2) * (c->w / 2) * c->c);
}

static void check_maxpool(size_t B, int h, int w, int c, bool with_bias, bool relu,
                          uint64_t seed)
{
    uint64_t rng = seed;
    const size_t nx = B * h * w * c, ny = B * (h / 2) * (w / 2) * c;
    float *x = falloc(nx), *y = falloc(ny), *r = falloc(ny), *dx = falloc(nx);
    float *b = falloc(c), *db = falloc(c);
    uint32_t *arg = calloc(ny, sizeof *arg);
    assert_non_null(arg);
    /* Distinct values well apart, so no window has a near tie and no sum is near 0. */
    for (size_t i = 0; i < nx; i++) x[i] = (float)((double)((i * 37) % nx) * 0.01 - 0.5);
    for (int i = 0; i < c; i++) b[i] = (float)(0.005 + 0.01 * (int)(harness_next(&rng) % 41) - 0.2);
    fill(r, ny, 1.0, &rng), fill(dx, nx, 9.0, &rng);
    sumo__maxpool_forward(x, B, h, w, c, with_bias ? b : NULL, relu, y, arg);
    sumo__maxpool_backward(r, relu ? y : NULL, arg, B, h, w, c, dx, with_bias ? db : NULL);

    pool_ctx pc = {B, h, w, c, dalloc(nx), with_bias ? dalloc(c) : NULL, dalloc(ny), relu, r, 0};
    to_double(x, pc.x, nx);
    if (with_bias) to_double(b, pc.b, c);
    pool_loss(pc.x, &pc);
    for (size_t i = 0; i < ny; i++) CHECK_CLOSE(y[i], pc.y[i], 1e-6, 1e-7, i);
    for (size_t i = 0; i < nx; i++) CHECK_CLOSE(dx[i], fd(pool_loss, pc.x, i, &pc), 1e-6, 1e-7, i);
    if (with_bias) {
        pc.which = 1;
        for (int i = 0; i < c; i++)
            CHECK_CLOSE(db[i], fd(pool_loss, pc.b, (size_t)i, &pc), 1e-5, 1e-6, (size_t)i);
    }
    free(pc.x), free(pc.b), free(pc.y);
    free(x), free(y), free(r), free(dx), free(b), free(db), free(arg);
}

static void test_maxpool_layer(void **state)
{
    (void)state;
    check_maxpool(2, 5, 6, 3, false, false, 41); /* odd height: the last row is dropped */
    check_maxpool(2, 6, 7, 6, false, false, 42); /* vectors and a tail; odd width */
    check_maxpool(3, 4, 4, 8, true, true, 43);   /* fused bias and ReLU, as the CNN uses */
    check_maxpool(1, 6, 6, 5, true, false, 44);
    check_maxpool(2, 4, 6, 3, false, true, 45);

    /* Ties: the first element of the window in row-major order gets the gradient, in the
     * vector path (4 channels) as in the scalar one (1 channel). */
    for (int c = 1; c <= 4; c += 3) {
        float t[16], ty[4], g[4] = {2, 2, 2, 2}, dt[16];
        uint32_t ta[4];
        for (int i = 0; i < 16; i++) t[i] = 1.0f;
        sumo__maxpool_forward(t, 1, 2, 2, c, NULL, false, ty, ta);
        sumo__maxpool_backward(g, NULL, ta, 1, 2, 2, c, dt, NULL);
        for (int ch = 0; ch < c; ch++) {
            assert_int_equal(ta[ch], (uint32_t)ch);
            assert_true(dt[ch] == 2 && dt[c + ch] == 0 && dt[2 * c + ch] == 0 &&
                        dt[3 * c + ch] == 0);
        }
    }
}

static void test_softmax_ce_hand(void **state)
{
    (void)state;
    /* Row 0: logits (1, 2, 3), label 2. softmax = e^(z - 3) / (1 + e^-1 + e^-2):
     *   1 + 0.36787944117 + 0.13533528324 = 1.50321472441; log = 0.40760596444 = loss0;
     *   p = (0.09003057317, 0.24472847105, 0.66524095579).
     * Row 1: logits (0, 0, 0), label 0: loss1 = log 3 = 1.09861228867, p = 1/3 each.
     * Mean loss = (0.40760596444 + 1.09861228867) / 2 = 0.75310912656; gradient /2. */
    const float z[6] = {1, 2, 3, 0, 0, 0};
    const uint8_t y[2] = {2, 0};
    float d[6];
    size_t correct = 99;
    double loss = sumo__softmax_ce(z, y, 2, 3, 0.5, d, &correct) / 2; /* returns the sum */
    CHECK_CLOSE(loss, 0.75310912656, 1e-10, 0, 0);
    const double want[6] = {0.09003057317 / 2, 0.24472847105 / 2, (0.66524095579 - 1) / 2,
                            (1.0 / 3 - 1) / 2, 1.0 / 6, 1.0 / 6};
    for (int i = 0; i < 6; i++) CHECK_CLOSE(d[i], want[i], 1e-6, 1e-9, (size_t)i);
    assert_int_equal(correct, 2); /* row 1's arg max is its first entry, label 0 */
    double loss2 = sumo__softmax_ce(z, y, 2, 3, 0.5, NULL, NULL) / 2;
    assert_true(loss2 == loss);

    /* Huge logits stay finite (the max is subtracted before exp). */
    const float big[3] = {1000.0f, 0.0f, -1000.0f};
    const uint8_t yb[2] = {0, 1};
    loss = sumo__softmax_ce(big, yb, 1, 3, 1.0, d, NULL);
    assert_true(loss >= 0 && loss < 1e-300);
    assert_true(d[0] == 0.0f && d[1] == 0.0f && d[2] == 0.0f);
    loss = sumo__softmax_ce(big, yb + 1, 1, 3, 1.0, d, NULL);
    CHECK_CLOSE(loss, 1000.0, 1e-12, 0, 0);
    assert_true(d[0] == 1.0f && d[1] == -1.0f && d[2] == 0.0f);
}
int main(void)
{
    openblas_set_num_threads(1); /* the caller's job, as for any user of the model */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dense_layer),
        cmocka_unit_test(test_relu_layer),
        cmocka_unit_test(test_conv_layer),
        cmocka_unit_test(test_im2col_adjoint),
        cmocka_unit_test(test_maxpool_layer),
        cmocka_unit_test(test_softmax_ce_hand),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
