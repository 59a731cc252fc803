/*
 * The layers the models are built from, as plain functions over caller-owned buffers, so the
 * model code stays a list of calls and the tests can check each layer on its own.
 *
 * Shapes and layouts, everywhere:
 *   - a batch is the outermost dimension; samples are rows;
 *   - images are channels-last, [batch][height][width][channels] (NHWC), so the patch a
 *     convolution needs at one kernel row is one contiguous run of kernel * channels floats;
 *   - a dense layer's weight is [out][in] (PyTorch's nn.Linear), its bias [out];
 *   - a convolution's weight is [out channels][kernel rows][kernel cols][in channels] and its
 *     bias [out channels]; stride 1, no padding ("valid");
 *   - max-pooling is 2 x 2 with stride 2; odd trailing rows and columns are dropped (floor,
 *     as PyTorch's default), and a tie goes to the first element in row-major window order.
 *
 * Backward functions ACCUMULATE into the parameter gradients they are given (a batch can be
 * taken in blocks; the model zeroes its gradients once per step) and overwrite the input
 * gradients. Matrix products go through cblas_sgemm, so results are deterministic
 * when the BLAS is (OpenBLAS with one thread is).
 */
#ifndef SUMO_TRAIN_LAYERS_H
#define SUMO_TRAIN_LAYERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* y[b][o] = bias[o] + sum_i x[b][i] w[o][i], then max(y, 0) when relu. */
void sumo__dense_forward(const float *x, size_t batch, int in, int out, const float *w,
                         const float *bias, bool relu, float *y);
/* dw += dy^T x, dbias += column sums of dy, and dx = dy w when dx is not NULL. */
void sumo__dense_backward(const float *x, const float *dy, size_t batch, int in, int out,
                          const float *w, float *dw, float *dbias, float *dx);

/* out[j] += sum over rows r of a[r][j] (rows in order): a bias gradient. */
void sumo__add_column_sums(const float *a, size_t rows, int n, float *out);

/* x = max(x, 0), in place (NaN becomes 0). */
void sumo__relu_forward(float *x, size_t n);
/* dy[i] = 0 where the ReLU's output y[i] is not positive (y is the output, not the input). */
void sumo__relu_backward(const float *y, float *dy, size_t n);

typedef struct sumo__conv_shape {
    int h, w, c;    /* input */
    int k;          /* square kernel */
    int oc;         /* output channels */
} sumo__conv_shape;

/* Output height and width of a valid convolution: h - k + 1, w - k + 1. */
static inline int sumo__conv_out(int size, int k) { return size - k + 1; }

/*
 * Lowers a batch of NHWC images into the im2col matrix: one row per output position
 * (batch * oh * ow rows, in NHWC order), one column per weight of an output channel
 * (k * k * c, in the weight's order).
 */
void sumo__im2col(const float *x, size_t batch, const sumo__conv_shape *s, float *col);
/* The adjoint of im2col: dx (overwritten) gets the sum of each column entry at its pixel. */
void sumo__col2im(const float *col, size_t batch, const sumo__conv_shape *s, float *dx);

/*
 * y = conv(x) + bias, y [batch][oh][ow][oc]; bias may be NULL (none: the model adds it after
 * pooling, on 4x fewer values). col is scratch of batch*oh*ow*k*k*c floats; it holds x's
 * im2col matrix afterwards (conv_backward can reuse it).
 */
void sumo__conv_forward(const float *x, size_t batch, const sumo__conv_shape *s,
                        const float *w, const float *bias, float *y, float *col);
/*
 * Gradients of a convolution from dy [batch][oh][ow][oc]. col must hold the im2col matrix of
 * x (as conv_forward leaves it). dw and dbias (unless NULL) are accumulated into; dx, when
 * not NULL, is overwritten, using dcol (same size as col) as scratch.
 */
void sumo__conv_backward(const float *col, const float *dy, size_t batch,
                         const sumo__conv_shape *s, const float *w, float *dw, float *dbias,
                         float *dx, float *dcol);

/*
 * 2 x 2 max-pooling of x [batch][h][w][c] into y [batch][h/2][w/2][c], fused with what
 * follows a convolution: y = act(max(window) + bias[c]), where bias may be NULL (none) and act
 * is ReLU when relu, else the identity. This equals pooling act(x + bias), since adding a
 * constant and ReLU both commute with max. arg (same count as y) receives, per output, the
 * index of the chosen input inside its sample (for backward).
 */
void sumo__maxpool_forward(const float *x, size_t batch, int h, int w, int c,
                           const float *bias, bool relu, float *y, uint32_t *arg);
/*
 * dx (batch * h * w * c floats, overwritten) = dy routed back to the chosen inputs. With y
 * (the forward output) not NULL, dy is first zeroed where y is not positive (the ReLU's
 * gradient); dbias, when not NULL, accumulates the per-channel sum of what was routed.
 */
void sumo__maxpool_backward(const float *dy, const float *y, const uint32_t *arg, size_t batch,
                            int h, int w, int c, float *dx, float *dbias);

/*
 * Softmax cross-entropy of logits [batch][classes] (classes 1 .. 256) against labels (each
 * < classes): returns the SUM of the rows' losses, computed in double (max subtracted before
 * exp, so any finite logits are safe); *correct (when not NULL) gets how many rows have their
 * label as the first largest logit. When dlogits is not NULL it receives grad_scale *
 * (softmax - onehot): with grad_scale = 1 / B, the gradient of the mean loss over a batch of
 * B rows, of which these rows may be one block.
 */
double sumo__softmax_ce(const float *logits, const uint8_t *labels, size_t batch, int classes,
                        double grad_scale, float *dlogits, size_t *correct);

#endif
