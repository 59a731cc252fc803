/*
 * Layer kernels. The heavy work is cblas_sgemm; the loops here are the glue around it (bias,
 * ReLU, im2col, pooling), and with the small channel counts of these models the glue costs as
 * much as the products unless it is kept to one pass and vectorised. At -O2 the compiler only
 * vectorises loops whose trip count it knows, so the channel loops use 4-float vectors (GCC
 * and Clang vector extensions: SSE on x86-64, NEON on arm64, no run-time dispatch) with a
 * scalar tail. Every result is the same as the plain scalar loop's, bit for bit: the vector
 * lanes are independent elements, and each element's sum keeps its order.
 */
#include "train/layers.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

typedef float v4f __attribute__((vector_size(16)));
typedef int32_t v4i __attribute__((vector_size(16)));

/* Unaligned vector access; memcpy of a fixed 16 bytes compiles to one move. */
static inline v4f load4(const float *p)
{
    v4f v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline void store4(float *p, v4f v) { memcpy(p, &v, sizeof v); }
#define LOAD4(p) load4(p)
#define STORE4(p, v) store4((p), (v))

/* Copy loops of a few floats must stay inline: GCC and Clang otherwise turn them into memcpy
 * calls, which cost more than the copy itself for the 5-float runs of a 5x5 kernel. */
#if defined(__clang__)
#define NO_MEMCPY_IDIOM __attribute__((no_builtin("memcpy")))
#elif defined(__GNUC__)
#define NO_MEMCPY_IDIOM __attribute__((optimize("no-tree-loop-distribute-patterns")))
#else
#define NO_MEMCPY_IDIOM
#endif

/*
 * C = A B with a contiguous row-major C (ldc == n). OpenBLAS implements beta = 0 as a separate
 * pass that is slow for the narrow outputs here (8 or 16 channels); zeroing C ourselves and
 * accumulating with beta = 1 gives the same numbers (0 + x == x) faster.
 */
static void gemm_set(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, const float *a,
                     int lda, const float *b, int ldb, float *c)
{
    memset(c, 0, (size_t)m * (size_t)n * sizeof(float));
    cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 1.0f, c, n);
}

static inline v4f splat4(float x) { return (v4f){x, x, x, x}; }

static inline v4f relu4(v4f v)
{
    v4i keep = v > splat4(0.0f);
    return (v4f)((v4i)v & keep);
}

/* y[r][j] = act(y[r][j] + b[j]): the bias and ReLU of a dense layer in one pass. */
static void add_bias_act(float *restrict y, size_t rows, int n, const float *restrict b,
                         bool relu)
{
    for (size_t r = 0; r < rows; r++) {
        float *row = y + r * (size_t)n;
        int j = 0;
        for (; j + 4 <= n; j += 4) {
            v4f v = LOAD4(row + j) + LOAD4(b + j);
            STORE4(row + j, relu ? relu4(v) : v);
        }
        for (; j < n; j++) {
            float v = row[j] + b[j];
            row[j] = relu && !(v > 0.0f) ? 0.0f : v;
        }
    }
}

void sumo__add_column_sums(const float *restrict a, size_t rows, int n, float *restrict out)
{
    int j = 0;
    for (; j + 4 <= n; j += 4) {
        v4f s = LOAD4(out + j);
        for (size_t r = 0; r < rows; r++) s += LOAD4(a + r * (size_t)n + j);
        STORE4(out + j, s);
    }
    for (; j < n; j++) {
        float s = out[j];
        for (size_t r = 0; r < rows; r++) s += a[r * (size_t)n + j];
        out[j] = s;
    }
}

void sumo__dense_forward(const float *x, size_t batch, int in, int out, const float *w,
                         const float *bias, bool relu, float *y)
{
    gemm_set(CblasNoTrans, CblasTrans, (int)batch, out, in, x, in, w, in, y);
    add_bias_act(y, batch, out, bias, relu);
}

void sumo__dense_backward(const float *x, const float *dy, size_t batch, int in, int out,
                          const float *w, float *dw, float *dbias, float *dx)
{
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, in, (int)batch, 1.0f, dy, out, x,
                in, 1.0f, dw, in);
    sumo__add_column_sums(dy, batch, out, dbias);
    if (dx != NULL) gemm_set(CblasNoTrans, CblasNoTrans, (int)batch, in, out, dy, out, w, in, dx);
}

void sumo__relu_forward(float *restrict x, size_t n)
{
    size_t i = 0;
    for (; i + 4 <= n; i += 4) STORE4(x + i, relu4(LOAD4(x + i)));
    for (; i < n; i++) x[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

void sumo__relu_backward(const float *restrict y, float *restrict dy, size_t n)
{
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        v4i keep = LOAD4(y + i) > splat4(0.0f);
        STORE4(dy + i, (v4f)((v4i)LOAD4(dy + i) & keep));
    }
    for (; i < n; i++) dy[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

NO_MEMCPY_IDIOM void sumo__im2col(const float *restrict x, size_t batch,
                                  const sumo__conv_shape *s, float *restrict col)
{
    const int oh = sumo__conv_out(s->h, s->k), ow = sumo__conv_out(s->w, s->k);
    const size_t run = (size_t)s->k * s->c; /* one kernel row: contiguous in NHWC */
    const size_t in_row = (size_t)s->w * s->c, in_img = (size_t)s->h * in_row;
    for (size_t b = 0; b < batch; b++) {
        const float *img = x + b * in_img;
        for (int oy = 0; oy < oh; oy++) {
            for (int ox = 0; ox < ow; ox++) {
                const float *src = img + (size_t)oy * in_row + (size_t)ox * s->c;
                for (int ky = 0; ky < s->k; ky++) {
                    const float *restrict p = src + (size_t)ky * in_row;
                    size_t j = 0;
                    for (; j + 4 <= run; j += 4) STORE4(col + j, LOAD4(p + j));
                    for (; j < run; j++) col[j] = p[j];
                    col += run;
                }
            }
        }
    }
}

/*
 * Gathers rather than scatters: each input pixel sums the entries of the output positions
 * that saw it, in (ky, kx) order. Scattering (+= into overlapping windows) is shorter to
 * write but makes every store wait for the one before it.
 */
void sumo__col2im(const float *restrict col, size_t batch, const sumo__conv_shape *s,
                  float *restrict dx)
{
    const int k = s->k, c = s->c, oh = sumo__conv_out(s->h, k), ow = sumo__conv_out(s->w, k);
    const size_t kk = (size_t)k * k * c, in_img = (size_t)s->h * s->w * c;
    for (size_t b = 0; b < batch; b++) {
        const float *cimg = col + b * (size_t)oh * ow * kk;
        float *img = dx + b * in_img;
        for (int iy = 0; iy < s->h; iy++) {
            /* Output rows oy = iy - ky in range: ky from iy - oh + 1 to iy. */
            const int ky0 = iy - oh + 1 > 0 ? iy - oh + 1 : 0, ky1 = iy < k - 1 ? iy : k - 1;
            for (int ix = 0; ix < s->w; ix++) {
                const int kx0 = ix - ow + 1 > 0 ? ix - ow + 1 : 0, kx1 = ix < k - 1 ? ix : k - 1;
                float *out = img + ((size_t)iy * s->w + ix) * c;
                int ch = 0;
                for (; ch + 4 <= c; ch += 4) {
                    v4f acc = splat4(0.0f);
                    for (int ky = ky0; ky <= ky1; ky++)
                        for (int kx = kx0; kx <= kx1; kx++)
                            acc += LOAD4(cimg + ((size_t)(iy - ky) * ow + (ix - kx)) * kk +
                                         ((size_t)ky * k + kx) * c + ch);
                    STORE4(out + ch, acc);
                }
                for (; ch < c; ch++) {
                    float acc = 0.0f;
                    for (int ky = ky0; ky <= ky1; ky++)
                        for (int kx = kx0; kx <= kx1; kx++)
                            acc += cimg[((size_t)(iy - ky) * ow + (ix - kx)) * kk +
                                        ((size_t)ky * k + kx) * c + ch];
                    out[ch] = acc;
                }
            }
        }
    }
}

void sumo__conv_forward(const float *x, size_t batch, const sumo__conv_shape *s,
                        const float *w, const float *bias, float *y, float *col)
{
    const size_t rows = batch * (size_t)sumo__conv_out(s->h, s->k) * sumo__conv_out(s->w, s->k);
    const int kk = s->k * s->k * s->c;
    sumo__im2col(x, batch, s, col);
    gemm_set(CblasNoTrans, CblasTrans, (int)rows, s->oc, kk, col, kk, w, kk, y);
    if (bias != NULL) add_bias_act(y, rows, s->oc, bias, false);
}

void sumo__conv_backward(const float *col, const float *dy, size_t batch,
                         const sumo__conv_shape *s, const float *w, float *dw, float *dbias,
                         float *dx, float *dcol)
{
    const size_t rows = batch * (size_t)sumo__conv_out(s->h, s->k) * sumo__conv_out(s->w, s->k);
    const int kk = s->k * s->k * s->c;
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, s->oc, kk, (int)rows, 1.0f, dy, s->oc,
                col, kk, 1.0f, dw, kk);
    if (dbias != NULL) sumo__add_column_sums(dy, rows, s->oc, dbias);
    if (dx != NULL) {
        gemm_set(CblasNoTrans, CblasNoTrans, (int)rows, kk, s->oc, dy, s->oc, w, kk, dcol);
        sumo__col2im(dcol, batch, s, dx);
    }
}

/* Keeps the first of equal values: a later element wins only when strictly greater. */
static inline void pool_step4(v4f *m, v4i *a, v4f v, v4i idx)
{
    v4i gt = v > *m;
    *m = (v4f)(((v4i)v & gt) | ((v4i)*m & ~gt));
    *a = (idx & gt) | (*a & ~gt);
}

void sumo__maxpool_forward(const float *restrict x, size_t batch, int h, int w, int c,
                           const float *restrict bias, bool relu, float *restrict y,
                           uint32_t *restrict arg)
{
    const int ph = h / 2, pw = w / 2;
    const size_t in_row = (size_t)w * c, in_img = (size_t)h * in_row;
    for (size_t b = 0; b < batch; b++) {
        const float *img = x + b * in_img;
        for (int py = 0; py < ph; py++) {
            for (int px = 0; px < pw; px++) {
                const size_t o00 = (size_t)(2 * py) * in_row + (size_t)(2 * px) * c;
                const size_t o01 = o00 + (size_t)c, o10 = o00 + in_row, o11 = o10 + (size_t)c;
                int ch = 0;
                for (; ch + 4 <= c; ch += 4) {
                    const v4i lane = {0, 1, 2, 3};
                    v4f m = LOAD4(img + o00 + ch);
                    v4i a = lane + (int32_t)(o00 + ch);
                    pool_step4(&m, &a, LOAD4(img + o01 + ch), lane + (int32_t)(o01 + ch));
                    pool_step4(&m, &a, LOAD4(img + o10 + ch), lane + (int32_t)(o10 + ch));
                    pool_step4(&m, &a, LOAD4(img + o11 + ch), lane + (int32_t)(o11 + ch));
                    /* max(v + b) = max(v) + b, and ReLU commutes with max. */
                    if (bias != NULL) m += LOAD4(bias + ch);
                    STORE4(y + ch, relu ? relu4(m) : m);
                    memcpy(arg + ch, &a, sizeof a);
                }
                for (; ch < c; ch++) {
                    size_t best = o00 + (size_t)ch;
                    float m = img[best];
                    if (img[o01 + ch] > m) best = o01 + ch, m = img[best];
                    if (img[o10 + ch] > m) best = o10 + ch, m = img[best];
                    if (img[o11 + ch] > m) best = o11 + ch, m = img[best];
                    if (bias != NULL) m += bias[ch];
                    y[ch] = relu && !(m > 0.0f) ? 0.0f : m;
                    arg[ch] = (uint32_t)best;
                }
                y += c;
                arg += c;
            }
        }
    }
}

void sumo__maxpool_backward(const float *restrict dy, const float *restrict y,
                            const uint32_t *restrict arg, size_t batch, int h, int w, int c,
                            float *restrict dx, float *restrict dbias)
{
    const size_t in_img = (size_t)h * w * c, out_pix = (size_t)(h / 2) * (w / 2);
    memset(dx, 0, batch * in_img * sizeof(float));
    for (size_t b = 0; b < batch; b++) {
        float *img = dx + b * in_img;
        /* Windows do not overlap, so each input gets at most one value: no sum order issue. */
        for (size_t p = 0; p < out_pix; p++) {
            for (int ch = 0; ch < c; ch++) {
                float g = y == NULL || y[ch] > 0.0f ? dy[ch] : 0.0f;
                img[arg[ch]] = g;
                if (dbias != NULL) dbias[ch] += g;
            }
            dy += c;
            arg += c;
            if (y != NULL) y += c;
        }
    }
}

double sumo__softmax_ce(const float *logits, const uint8_t *labels, size_t batch, int classes,
                        double grad_scale, float *dlogits, size_t *correct)
{
    double total = 0.0, e[256]; /* classes <= 256: the labels are bytes */
    size_t right = 0;
    for (size_t b = 0; b < batch; b++) {
        const float *z = logits + b * (size_t)classes;
        int arg = 0;
        for (int j = 1; j < classes; j++)
            if (z[j] > z[arg]) arg = j;
        const double m = z[arg];
        double sum = 0.0;
        for (int j = 0; j < classes; j++) sum += e[j] = exp((double)z[j] - m);
        total += log(sum) - ((double)z[labels[b]] - m);
        right += arg == labels[b];
        if (dlogits != NULL) {
            float *d = dlogits + b * (size_t)classes;
            for (int j = 0; j < classes; j++)
                d[j] = (float)((e[j] / sum - (j == labels[b] ? 1.0 : 0.0)) * grad_scale);
        }
    }
    if (correct != NULL) *correct = right;
    return total;
}
