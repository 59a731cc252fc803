/*
 * What the layer and model tests (tests/unit/test_model_*.c) share: allocations and fills under
 * assertions, a closeness check, the double-precision references of the layers written here
 * from the layouts documented in train/layers.h, a central finite difference, and random
 * batches as the data set has them.
 */
#ifndef SUMO_TEST_MODEL_CHECK_H
#define SUMO_TEST_MODEL_CHECK_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "support/harness.h"
#include "train/layers.h"

#include <math.h>
#include <stdlib.h>

#define FD_EPS 1e-6

static inline float *falloc(size_t n)
{
    float *p = calloc(n ? n : 1, sizeof(float));
    assert_non_null(p);
    return p;
}

static inline double *dalloc(size_t n)
{
    double *p = calloc(n ? n : 1, sizeof(double));
    assert_non_null(p);
    return p;
}

static inline void fill(float *v, size_t n, double scale, uint64_t *rng)
{
    for (size_t i = 0; i < n; i++) v[i] = (float)(scale * harness_uniform(rng));
}

static inline void to_double(const float *src, double *dst, size_t n)
{
    for (size_t i = 0; i < n; i++) dst[i] = src[i];
}

/* |got - want| <= rel * max(|got|, |want|) + abs. */
static inline void check_close_at(double got, double want, double rel, double abs_tol,
                                  const char *what, size_t i, const char *file, int line)
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

static inline void ref_dense(const double *x, size_t batch, int in, int out, const double *w,
                             const double *b, double *y)
{
    for (size_t n = 0; n < batch; n++)
        for (int o = 0; o < out; o++) {
            double s = b[o];
            for (int i = 0; i < in; i++) s += x[n * in + i] * w[(size_t)o * in + i];
            y[n * out + o] = s;
        }
}

static inline void ref_relu(double *x, size_t n)
{
    for (size_t i = 0; i < n; i++) x[i] = x[i] > 0 ? x[i] : 0;
}

/* x [B][h][w][c], w [oc][k][k][c] -> y [B][h-k+1][w-k+1][oc] */
static inline void ref_conv(const double *x, size_t batch, const sumo__conv_shape *s,
                            const double *w, const double *b, double *y)
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

static inline void ref_maxpool(const double *x, size_t batch, int h, int w, int c, double *y)
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

static inline double ref_softmax_ce(const double *z, const uint8_t *y, size_t batch, int classes)
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

typedef double (*scalar_fn)(const double *v, void *ctx);

/* Central difference of f at coordinate i of v (restored afterwards). */
static inline double fd(scalar_fn f, double *v, size_t i, void *ctx)
{
    double keep = v[i];
    v[i] = keep + FD_EPS;
    double up = f(v, ctx);
    v[i] = keep - FD_EPS;
    double down = f(v, ctx);
    v[i] = keep;
    return (up - down) / (2 * FD_EPS);
}

/* Random inputs in [0, 1) and labels, as the data set has them. */
static inline void make_batch(size_t n, size_t pixels, int classes, uint64_t seed, float **x,
                              uint8_t **y)
{
    uint64_t rng = seed;
    *x = falloc(n * pixels);
    *y = malloc(n);
    assert_non_null(*y);
    for (size_t i = 0; i < n * pixels; i++) (*x)[i] = (float)(0.5 + 0.5 * harness_uniform(&rng));
    for (size_t i = 0; i < n; i++) (*y)[i] = (uint8_t)(harness_next(&rng) % (uint64_t)classes);
}

#endif
