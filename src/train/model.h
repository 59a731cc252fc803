/*
 * The models the experiments train: an MLP and a small CNN for 28 x 28 grey images (any size
 * works), with softmax cross-entropy loss, forward and backward written by hand over BLAS.
 *
 * Parameters live in one contiguous float buffer, cut into tensors by a layout (element
 * counts in order, as sumo_optimizer and the Adasum per-tensor op take it); the gradients in
 * a second buffer with the same layout. Aggregation and optimizers work on these two flat
 * buffers; the model reads the parameters in place at every step, so an update written into
 * sumo__model_params() is what the next step uses.
 *
 * Architectures (layers.h gives the memory layout of every tensor):
 *   MLP: dense(in -> hidden) -> ReLU -> dense(hidden -> classes)
 *        tensors fc1.weight [hidden][in], fc1.bias, fc2.weight [classes][hidden], fc2.bias
 *   CNN: conv(1 -> conv1, k x k) -> ReLU -> maxpool 2 -> conv(conv1 -> conv2, k x k) -> ReLU
 *        -> maxpool 2 -> dense(flat -> hidden) -> ReLU -> dense(hidden -> classes)
 *        tensors conv1.weight [conv1][k][k][1], conv1.bias, conv2.weight [conv2][k][k][conv1],
 *        conv2.bias, fc1.weight [hidden][flat], fc1.bias, fc2.weight, fc2.bias, where the
 *        flattened features are in (row, column, channel) order. The convolutions' biases and
 *        ReLUs are applied after the pooling (adding a per-channel constant and ReLU both
 *        commute with max, and the pooled tensor is 4x smaller): the function and its
 *        gradient are those of the order written above.
 *   Defaults (sumo__model_config_default): MLP 784-128-10 (101,770 parameters); CNN 28x28 ->
 *   conv 8@5x5 -> 24x24 -> pool 12x12 -> conv 16@5x5 -> 8x8 -> pool 4x4 -> 256 -> 64 -> 10
 *   (20,522 parameters).
 *
 * Initialisation, from the seed alone (bit-identical on every machine): weights uniform in
 * [-b, b] with b = sqrt(6 / fan_in) (He/Kaiming uniform, gain sqrt(2)) for layers followed by
 * a ReLU and b = sqrt(3 / fan_in) (gain 1) for the output layer; biases zero. Numbers come
 * from a splitmix64 stream drawn tensor after tensor in layout order.
 *
 * Reproducibility: for the same seed, inputs and batch size, parameters, gradients and loss
 * are bit-identical from run to run, provided the BLAS is deterministic (OpenBLAS with one
 * thread is; the caller chooses the BLAS thread count, the model never changes it).
 *
 * Threads: a model is used by one thread at a time (each worker owns its own instance);
 * instances share nothing. Memory: parameters, gradients and all scratch are allocated by
 * create; forward_backward and evaluate allocate nothing. Scratch: the MLP keeps one batch's
 * activations, (2 hidden + 2 classes) floats per sample of max_batch; the CNN works through a
 * batch 16 samples at a time, forward and back, so its scratch is fixed (about 3.2 MB for the
 * default sizes) whatever max_batch is.
 */
#ifndef SUMO_TRAIN_MODEL_H
#define SUMO_TRAIN_MODEL_H

#include "sumo.h"

#include <stddef.h>
#include <stdint.h>

typedef enum sumo__model_kind {
    SUMO__MODEL_MLP = 0,
    SUMO__MODEL_CNN = 1,
    SUMO__MODEL_KIND_COUNT
} sumo__model_kind;

typedef struct sumo__model_config {
    sumo__model_kind kind;
    int in_rows, in_cols; /* input image, one channel (28 x 28) */
    int classes;          /* outputs, 2 .. 256 (10) */
    int hidden;           /* MLP: hidden width (128); CNN: width of the first dense layer (64) */
    int conv1, conv2;     /* CNN: output channels of the two convolutions (8, 16) */
    int kernel;           /* CNN: square kernel size, stride 1, no padding (5) */
} sumo__model_config;

typedef struct sumo__model sumo__model;

/* The defaults above for kind. */
sumo_result sumo__model_config_default(sumo__model_kind kind, sumo__model_config *cfg);

/*
 * A model for batches of up to max_batch samples, initialised from seed. Fails with
 * SUMO_ERR_INVALID_ARGUMENT for a configuration that does not fit (sizes out of range, images
 * too small for the two convolutions), SUMO_ERR_SYSTEM when memory runs out.
 */
sumo_result sumo__model_create_config(const sumo__model_config *cfg, size_t max_batch,
                                      uint64_t seed, sumo__model **out);
/* The default configuration of kind for 28 x 28 images, with the given hidden width
 * (0: the default). */
sumo_result sumo__model_create(sumo__model_kind kind, int hidden, size_t max_batch,
                               uint64_t seed, sumo__model **out);
void sumo__model_destroy(sumo__model *m);

/* Draws the parameters again from seed, as create did. */
void sumo__model_init(sumo__model *m, uint64_t seed);

/* The parameter and gradient buffers (sumo__model_num_params floats each, 64-byte aligned),
 * owned by the model and valid until destroy. */
float *sumo__model_params(sumo__model *m);
float *sumo__model_grads(sumo__model *m);
/* Moves the parameters and gradients into the caller's buffers (nparams floats each, which
 * must outlive the model): the trainer gives it memory from sumo_mem_alloc, so that the
 * collectives reach every rank's gradients directly. */
void sumo__model_adopt_buffers(sumo__model *m, float *params, float *grads);
size_t sumo__model_num_params(const sumo__model *m);
/* The layout: *ntensors element counts summing to num_params, valid until destroy. */
void sumo__model_layout(const sumo__model *m, const size_t **sizes, size_t *ntensors);
/* PyTorch-style name of tensor i ("conv1.weight"), or "?" out of range. */
const char *sumo__model_tensor_name(const sumo__model *m, size_t i);
/* One line describing the architecture, e.g. "mlp 784-128-10 (101770 params)". */
void sumo__model_describe(const sumo__model *m, char *buf, size_t len);

/*
 * One training step's arithmetic on batch samples x [batch][in_rows * in_cols] with labels
 * y: *loss_out (may be NULL) gets the mean cross-entropy over the batch, and the gradient
 * buffer is overwritten with the gradient of that mean loss (not accumulated). Fails with
 * SUMO_ERR_INVALID_ARGUMENT for batch 0 or above max_batch, NULL buffers or a label >=
 * classes (gradients then unspecified, parameters untouched).
 */
sumo_result sumo__model_forward_backward(sumo__model *m, const float *x, const uint8_t *y,
                                         size_t batch, double *loss_out);

/*
 * Forward only over n samples (any n >= 1, taken a block at a time): mean cross-entropy in
 * *loss and the fraction classified correctly (arg max of the logits, first on ties) in
 * *accuracy; either may be NULL. Leaves the gradient buffer alone.
 */
sumo_result sumo__model_evaluate(sumo__model *m, const float *x, const uint8_t *y, size_t n,
                                 double *loss, double *accuracy);

/* Forward only: logits [batch][classes] for batch <= max_batch samples. */
sumo_result sumo__model_logits(sumo__model *m, const float *x, size_t batch, float *logits);

#endif
