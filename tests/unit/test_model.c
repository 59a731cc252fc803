/*
 * Layers and models. Each layer's forward is compared with a plain double-precision version
 * written here from the layout documented in layers.h, and its backward with central finite
 * differences of that double version (eps 1e-6, so float rounding plays no part and ReLU or
 * max kinks are practically never crossed). Whole models get the same treatment through a
 * double reference model; then determinism, argument checks, and a small learning run.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "support/harness.h"
#include "train/layers.h"
#include "train/model.h"

#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FD_EPS 1e-6

static float *falloc(size_t n)
{
    float *p = calloc(n ? n : 1, sizeof(float));
    assert_non_null(p);
    return p;
}

static double *dalloc(size_t n)
{
    double *p = calloc(n ? n : 1, sizeof(double));
    assert_non_null(p);
    return p;
}

static void fill(float *v, size_t n, double scale, uint64_t *rng)
{
    for (size_t i = 0; i < n; i++) v[i] = (float)(scale * harness_uniform(rng));
}

static void to_double(const float *src, double *dst, size_t n)
{
    for (size_t i = 0; i < n; i++) dst[i] = src[i];
}

/* |got - want| <= rel * max(|got|, |want|) + abs. */
static void check_close_at(double got, double want, double rel, double abs_tol, const char *what,
                           size_t i, const char *file, int line)
{
    double scale = fmax(fabs(got), fabs(want));
    if (!(fabs(got - want) <= rel * scale + abs_tol))
        fail_msg("%s:%d: %s[%zu] = %.9g, want %.9g (diff %.3g)", file, line, what, i, got, want,
                 got - want);
}
#define CHECK_CLOSE(got, want, rel, abs_tol, i) \
    check_close_at((got), (want), (rel), (abs_tol), #got, (i), __FILE__, __LINE__)

/* ---------------------------------------------------------------------------------------- */
/* Double references, written from the documented layouts                                    */

static void ref_dense(const double *x, size_t batch, int in, int out, const double *w,
                      const double *b, double *y)
{
    for (size_t n = 0; n < batch; n++)
        for (int o = 0; o < out; o++) {
            double s = b[o];
            for (int i = 0; i < in; i++) s += x[n * in + i] * w[(size_t)o * in + i];
            y[n * out + o] = s;
        }
}

static void ref_relu(double *x, size_t n)
{
    for (size_t i = 0; i < n; i++) x[i] = x[i] > 0 ? x[i] : 0;
}

/* x [B][h][w][c], w [oc][k][k][c] -> y [B][h-k+1][w-k+1][oc] */
static void ref_conv(const double *x, size_t batch, const sumo__conv_shape *s, const double *w,
                     const double *b, double *y)
{
    int oh = s->h - s->k + 1, ow = s->w - s->k + 1;
    for (size_t n = 0; n < batch; n++)
        for (int oy = 0; oy < oh; oy++)
            for (int ox = 0; ox < ow; ox++)
                for (int o = 0; o < s->oc; o++) {
                    double acc = b[o];
                    for (int ky = 0; ky < s->k; ky++)
                        for (int kx = 0; kx < s->k; kx++)
                            for (int c = 0; c < s->c; c++)
                                acc += x[((n * s->h + oy + ky) * s->w + ox + kx) * s->c + c] *
                                       w[(((size_t)o * s->k + ky) * s->k + kx) * s->c + c];
                    y[((n * oh + oy) * ow + ox) * s->oc + o] = acc;
                }
}

static void ref_maxpool(const double *x, size_t batch, int h, int w, int c, double *y)
{
    int ph = h / 2, pw = w / 2;
    for (size_t n = 0; n < batch; n++)
        for (int py = 0; py < ph; py++)
            for (int px = 0; px < pw; px++)
                for (int ch = 0; ch < c; ch++) {
                    double m = -INFINITY;
                    for (int dy = 0; dy < 2; dy++)
                        for (int dx = 0; dx < 2; dx++)
                            m = fmax(m, x[((n * h + 2 * py + dy) * w + 2 * px + dx) * c + ch]);
                    y[((n * ph + py) * pw + px) * c + ch] = m;
                }
}

static double ref_softmax_ce(const double *z, const uint8_t *y, size_t batch, int classes)
{
    double total = 0;
    for (size_t n = 0; n < batch; n++) {
        double m = -INFINITY, s = 0;
        for (int j = 0; j < classes; j++) m = fmax(m, z[n * classes + j]);
        for (int j = 0; j < classes; j++) s += exp(z[n * classes + j] - m);
        total += m + log(s) - z[n * classes + y[n]];
    }
    return total / (double)batch;
}

/* ---------------------------------------------------------------------------------------- */
/* Layer checks: L = sum(out * r) for a fixed random r, so dL/dout = r.                      */

typedef double (*scalar_fn)(const double *v, void *ctx);

/* Central difference of f at coordinate i of v (restored afterwards). */
static double fd(scalar_fn f, double *v, size_t i, void *ctx)
{
    double keep = v[i];
    v[i] = keep + FD_EPS;
    double up = f(v, ctx);
    v[i] = keep - FD_EPS;
    double down = f(v, ctx);
    v[i] = keep;
    return (up - down) / (2 * FD_EPS);
}

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

/* Random inputs in [0, 1) and labels, as the data set has them. */
static void make_batch(size_t n, size_t pixels, int classes, uint64_t seed, float **x,
                       uint8_t **y)
{
    uint64_t rng = seed;
    *x = falloc(n * pixels);
    *y = malloc(n);
    assert_non_null(*y);
    for (size_t i = 0; i < n * pixels; i++) (*x)[i] = (float)(0.5 + 0.5 * harness_uniform(&rng));
    for (size_t i = 0; i < n; i++) (*y)[i] = (uint8_t)(harness_next(&rng) % (uint64_t)classes);
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

/* ---------------------------------------------------------------------------------------- */
/* Everything else                                                                           */

static uint64_t fnv1a(const void *p, size_t n)
{
    const unsigned char *b = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static void test_layout_and_init(void **state)
{
    (void)state;
    sumo__model *m = NULL;
    assert_int_equal(sumo__model_create(SUMO__MODEL_MLP, 0, 8, 42, &m), SUMO_SUCCESS);
    const size_t *sizes;
    size_t nt;
    sumo__model_layout(m, &sizes, &nt);
    assert_int_equal(nt, 4);
    assert_int_equal(sizes[0], 128 * 784);
    assert_int_equal(sizes[1], 128);
    assert_int_equal(sizes[2], 10 * 128);
    assert_int_equal(sizes[3], 10);
    assert_int_equal(sumo__model_num_params(m), 101770);
    assert_string_equal(sumo__model_tensor_name(m, 2), "fc2.weight");
    assert_string_equal(sumo__model_tensor_name(m, 4), "?");
    assert_int_equal((uintptr_t)sumo__model_params(m) % 64, 0);
    assert_int_equal((uintptr_t)sumo__model_grads(m) % 64, 0);
    const float *p = sumo__model_params(m);
    /* He uniform bound for fc1, gain-1 bound for fc2, zero biases. */
    double b1 = sqrt(6.0 / 784), b2 = sqrt(3.0 / 128), lo = 0, hi = 0;
    for (size_t i = 0; i < sizes[0]; i++) {
        assert_true(fabs(p[i]) <= b1);
        lo = fmin(lo, p[i]), hi = fmax(hi, p[i]);
    }
    assert_true(lo < -0.95 * b1 && hi > 0.95 * b1);
    for (size_t i = 0; i < sizes[1]; i++) assert_true(p[sizes[0] + i] == 0.0f);
    for (size_t i = 0; i < sizes[2]; i++) assert_true(fabs(p[sizes[0] + sizes[1] + i]) <= b2);
    /* The seed alone fixes the parameters, on any machine: a golden hash of their bits. */
    uint64_t h = fnv1a(p, 101770 * sizeof(float));
    if (h != 0x855d2ed32f708377ull)
        fail_msg("mlp seed 42 parameter hash %016llx changed: initialisation is not what it "
                 "was (update the hash only for an intended change)", (unsigned long long)h);
    char desc[128];
    sumo__model_describe(m, desc, sizeof desc);
    assert_string_equal(desc, "mlp 784-128-10 (101770 params)");
    sumo__model_destroy(m);

    assert_int_equal(sumo__model_create(SUMO__MODEL_CNN, 0, 8, 42, &m), SUMO_SUCCESS);
    sumo__model_layout(m, &sizes, &nt);
    assert_int_equal(nt, 8);
    const size_t want[8] = {8 * 25, 8, 16 * 25 * 8, 16, 64 * 256, 64, 10 * 64, 10};
    for (int i = 0; i < 8; i++) assert_int_equal(sizes[i], want[i]);
    assert_string_equal(sumo__model_tensor_name(m, 0), "conv1.weight");
    sumo__model_describe(m, desc, sizeof desc);
    print_message("%s\n", desc);
    sumo__model_destroy(m);
    sumo__model_destroy(NULL);
}

static void test_determinism(void **state)
{
    (void)state;
    for (int kind = 0; kind < SUMO__MODEL_KIND_COUNT; kind++) {
        sumo__model *a = NULL, *b = NULL, *c = NULL;
        assert_int_equal(sumo__model_create(kind, 0, 40, 7, &a), SUMO_SUCCESS);
        assert_int_equal(sumo__model_create(kind, 0, 40, 7, &b), SUMO_SUCCESS);
        assert_int_equal(sumo__model_create(kind, 0, 40, 8, &c), SUMO_SUCCESS);
        const size_t n = sumo__model_num_params(a);
        assert_memory_equal(sumo__model_params(a), sumo__model_params(b), n * sizeof(float));
        assert_memory_not_equal(sumo__model_params(a), sumo__model_params(c), n * sizeof(float));
        float *x;
        uint8_t *y;
        make_batch(40, 784, 10, 9, &x, &y);
        double la, lb;
        for (int step = 0; step < 2; step++) { /* the second step reuses dirty scratch */
            assert_int_equal(sumo__model_forward_backward(a, x, y, 40, &la), SUMO_SUCCESS);
            assert_int_equal(sumo__model_forward_backward(b, x, y, 40, &lb), SUMO_SUCCESS);
            assert_true(la == lb);
            assert_memory_equal(sumo__model_grads(a), sumo__model_grads(b), n * sizeof(float));
        }
        /* A smaller batch in between does not change what the full batch gives. */
        float *keep = falloc(n);
        memcpy(keep, sumo__model_grads(a), n * sizeof(float));
        assert_int_equal(sumo__model_forward_backward(a, x, y, 3, NULL), SUMO_SUCCESS);
        assert_int_equal(sumo__model_forward_backward(a, x, y, 40, &la), SUMO_SUCCESS);
        assert_memory_equal(sumo__model_grads(a), keep, n * sizeof(float));
        /* init redraws exactly what create drew. */
        sumo__model_init(c, 7);
        assert_memory_equal(sumo__model_params(a), sumo__model_params(c), n * sizeof(float));
        free(keep), free(x), free(y);
        sumo__model_destroy(a), sumo__model_destroy(b), sumo__model_destroy(c);
    }
}

typedef struct thread_job {
    sumo__model_kind kind;
    const float *x;
    const uint8_t *y;
    float *grads;
    size_t n;
    int ok;
} thread_job;

static void *thread_main(void *p)
{
    thread_job *j = p;
    sumo__model *m = NULL;
    j->ok = 0;
    if (sumo__model_create(j->kind, 0, 32, 5, &m) != SUMO_SUCCESS) return NULL;
    for (int i = 0; i < 3; i++)
        if (sumo__model_forward_backward(m, j->x, j->y, 32, NULL) != SUMO_SUCCESS) goto out;
    j->n = sumo__model_num_params(m);
    j->grads = malloc(j->n * sizeof(float));
    if (j->grads == NULL) goto out;
    memcpy(j->grads, sumo__model_grads(m), j->n * sizeof(float));
    j->ok = 1;
out:
    sumo__model_destroy(m);
    return NULL;
}

/* Models on different threads share nothing: each gives what it gives alone. */
static void test_threads(void **state)
{
    (void)state;
    float *x;
    uint8_t *y;
    make_batch(32, 784, 10, 77, &x, &y);
    thread_job jobs[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (thread_job){i % 2 ? SUMO__MODEL_CNN : SUMO__MODEL_MLP, x, y, NULL, 0, 0};
        assert_int_equal(pthread_create(&th[i], NULL, thread_main, &jobs[i]), 0);
    }
    for (int i = 0; i < 4; i++) assert_int_equal(pthread_join(th[i], NULL), 0);
    for (int i = 0; i < 4; i++) assert_true(jobs[i].ok);
    thread_job alone[2] = {{SUMO__MODEL_MLP, x, y, NULL, 0, 0}, {SUMO__MODEL_CNN, x, y, NULL, 0, 0}};
    for (int k = 0; k < 2; k++) {
        thread_main(&alone[k]);
        assert_true(alone[k].ok);
        for (int i = k; i < 4; i += 2)
            assert_memory_equal(jobs[i].grads, alone[k].grads, alone[k].n * sizeof(float));
        free(alone[k].grads);
    }
    for (int i = 0; i < 4; i++) free(jobs[i].grads);
    free(x), free(y);
}

static void test_evaluate(void **state)
{
    (void)state;
    sumo__model *m = NULL;
    assert_int_equal(sumo__model_create(SUMO__MODEL_CNN, 0, 16, 3, &m), SUMO_SUCCESS);
    float *x;
    uint8_t *y;
    make_batch(37, 784, 10, 12, &x, &y); /* 16 + 16 + 5 */
    const size_t n = sumo__model_num_params(m);
    float *g = falloc(n);
    memset(sumo__model_grads(m), 0x7f, n * sizeof(float));
    memcpy(g, sumo__model_grads(m), n * sizeof(float));
    double loss, acc;
    assert_int_equal(sumo__model_evaluate(m, x, y, 37, &loss, &acc), SUMO_SUCCESS);
    assert_memory_equal(sumo__model_grads(m), g, n * sizeof(float)); /* untouched */
    /* The same from the logits, by hand. */
    float logits[16 * 10];
    double total = 0;
    size_t right = 0;
    for (size_t s = 0; s < 37; s += 16) {
        size_t b = 37 - s < 16 ? 37 - s : 16;
        assert_int_equal(sumo__model_logits(m, x + s * 784, b, logits), SUMO_SUCCESS);
        for (size_t i = 0; i < b; i++) {
            const float *z = logits + i * 10;
            double mx = z[0], se = 0;
            int arg = 0;
            for (int j = 1; j < 10; j++)
                if (z[j] > z[arg]) arg = j;
            mx = z[arg];
            for (int j = 0; j < 10; j++) se += exp(z[j] - mx);
            total += mx + log(se) - z[y[s + i]];
            right += arg == y[s + i];
        }
    }
    CHECK_CLOSE(loss, total / 37, 1e-12, 0, 0);
    CHECK_CLOSE(acc, (double)right / 37, 1e-15, 0, 0);
    /* And the loss forward_backward reports for one batch equals evaluate's. */
    double l1, l2;
    assert_int_equal(sumo__model_forward_backward(m, x, y, 16, &l1), SUMO_SUCCESS);
    assert_int_equal(sumo__model_evaluate(m, x, y, 16, &l2, NULL), SUMO_SUCCESS);
    assert_true(l1 == l2);
    free(g), free(x), free(y);
    sumo__model_destroy(m);
}

static void test_invalid_arguments(void **state)
{
    (void)state;
    sumo__model *m = (sumo__model *)&m;
    sumo__model_config cfg;
    assert_int_equal(sumo__model_create(SUMO__MODEL_MLP, 0, 0, 1, &m), SUMO_ERR_INVALID_ARGUMENT);
    assert_null(m);
    assert_int_equal(sumo__model_create(SUMO__MODEL_KIND_COUNT, 0, 4, 1, &m),
                     SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo__model_create(SUMO__MODEL_MLP, -1, 4, 1, &m),
                     SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo__model_create(SUMO__MODEL_MLP, 0, 4, 1, NULL),
                     SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo__model_config_default(SUMO__MODEL_CNN, &cfg), SUMO_SUCCESS);
    cfg.in_rows = 12; /* 12 -> 8 -> 4 -> 0: no room for the second convolution */
    assert_int_equal(sumo__model_create_config(&cfg, 4, 1, &m), SUMO_ERR_INVALID_ARGUMENT);
    cfg.in_rows = 28, cfg.classes = 1;
    assert_int_equal(sumo__model_create_config(&cfg, 4, 1, &m), SUMO_ERR_INVALID_ARGUMENT);
    cfg.classes = 10, cfg.kernel = 0;
    assert_int_equal(sumo__model_create_config(&cfg, 4, 1, &m), SUMO_ERR_INVALID_ARGUMENT);
    assert_null(m);

    assert_int_equal(sumo__model_create(SUMO__MODEL_MLP, 16, 4, 1, &m), SUMO_SUCCESS);
    float x[5 * 784] = {0};
    uint8_t y[5] = {0, 1, 2, 3, 9};
    double loss;
    assert_int_equal(sumo__model_forward_backward(m, x, y, 4, &loss), SUMO_SUCCESS);
    assert_int_equal(sumo__model_forward_backward(m, x, y, 5, &loss), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo__model_forward_backward(m, x, y, 0, &loss), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo__model_forward_backward(m, NULL, y, 4, &loss),
                     SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo__model_forward_backward(m, x, NULL, 4, &loss),
                     SUMO_ERR_INVALID_ARGUMENT);
    y[2] = 10;
    assert_int_equal(sumo__model_forward_backward(m, x, y, 4, &loss), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo__model_evaluate(m, x, y, 5, &loss, NULL), SUMO_ERR_INVALID_ARGUMENT);
    y[2] = 2;
    assert_int_equal(sumo__model_evaluate(m, x, y, 5, &loss, NULL), SUMO_SUCCESS); /* any n */
    assert_int_equal(sumo__model_evaluate(m, x, y, 0, &loss, NULL), SUMO_ERR_INVALID_ARGUMENT);
    sumo__model_destroy(m);
}

/* A separable problem: each class is a fixed random pattern plus noise. Plain SGD must take
 * the loss from about log(10) to a small fraction of it in 200 steps. */
static void learn(sumo__model_kind kind)
{
    sumo__model_config cfg;
    assert_int_equal(sumo__model_config_default(kind, &cfg), SUMO_SUCCESS);
    if (kind == SUMO__MODEL_MLP) {
        cfg.in_rows = cfg.in_cols = 8, cfg.hidden = 32;
    } else {
        cfg.in_rows = cfg.in_cols = 16, cfg.kernel = 3, cfg.hidden = 32;
    }
    const size_t B = 32, pixels = (size_t)cfg.in_rows * cfg.in_cols;
    sumo__model *m = NULL;
    assert_int_equal(sumo__model_create_config(&cfg, B, 1234, &m), SUMO_SUCCESS);
    uint64_t rng = 99;
    float *proto = falloc(10 * pixels), *x = falloc(B * pixels);
    uint8_t y[32];
    for (size_t i = 0; i < 10 * pixels; i++) proto[i] = harness_uniform(&rng) > 0.5 ? 1.0f : 0.0f;
    float *p = sumo__model_params(m);
    const float *g = sumo__model_grads(m);
    const size_t n = sumo__model_num_params(m);
    double first = 0, last = 0;
    for (int step = 0; step < 200; step++) {
        for (size_t b = 0; b < B; b++) {
            y[b] = (uint8_t)(harness_next(&rng) % 10);
            for (size_t i = 0; i < pixels; i++)
                x[b * pixels + i] = proto[y[b] * pixels + i] + 0.3f * (float)harness_uniform(&rng);
        }
        double loss;
        assert_int_equal(sumo__model_forward_backward(m, x, y, B, &loss), SUMO_SUCCESS);
        for (size_t i = 0; i < n; i++) p[i] -= 0.05f * g[i];
        if (step == 0) first = loss;
        last = loss;
    }
    print_message("%s: loss %.4f -> %.4f after 200 SGD steps\n",
                  kind == SUMO__MODEL_MLP ? "mlp" : "cnn", first, last);
    assert_true(first > 1.5);
    assert_true(last < 0.1 * first);
    free(proto), free(x);
    sumo__model_destroy(m);
}

static void test_learns(void **state)
{
    (void)state;
    learn(SUMO__MODEL_MLP);
    learn(SUMO__MODEL_CNN);
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
        cmocka_unit_test(test_mlp_gradients),
        cmocka_unit_test(test_cnn_gradients),
        cmocka_unit_test(test_layout_and_init),
        cmocka_unit_test(test_determinism),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_evaluate),
        cmocka_unit_test(test_invalid_arguments),
        cmocka_unit_test(test_learns),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
