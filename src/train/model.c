/*
 * MLP and CNN over the layer kernels. The MLP takes the whole batch as one block (one gemm
 * per layer). The CNN takes it a block of samples at a time, forward and straight back, so
 * its im2col matrices (25 and 200 floats per output pixel) are a bounded scratch whatever the
 * batch, still in cache when the backward pass needs them, and never rebuilt.
 */
#include "train/model.h"

#include "common/common.h"
#include "train/layers.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Samples per CNN block: the im2col matrices of a block (57.6 and 51.2 KB per sample for the
 * default layers) stay near the core between the forward and the backward pass. */
#define CNN_BLOCK 16
#define MAX_TENSORS 8
#define ALIGN 64

struct sumo__model {
    sumo__model_config cfg;
    size_t max_batch, block; /* samples per pass through the network */
    size_t nparams, ntensors;
    size_t sizes[MAX_TENSORS], offsets[MAX_TENSORS];
    const char *names[MAX_TENSORS];
    float *params, *grads;
    bool external; /* params and grads belong to the caller (sumo__model_adopt_buffers) */

    /* Derived shapes. in: pixels per sample; flat: features into fc1. */
    int in, flat;
    sumo__conv_shape s1, s2;
    int h1, w1, p1h, p1w, h2, w2, p2h, p2w;
    size_t p1n, p2n; /* pooled values per sample */

    /* Scratch for one block of samples, all inside arena. */
    float *h, *dh, *logits, *dlogits;       /* [block][hidden], [block][classes] */
    float *col1, *y1, *p1, *dp1;            /* CNN: im2col, conv output, pooled, its gradient */
    float *col2, *dcol2, *y2, *p2, *dp2;
    uint32_t *arg1, *arg2;                  /* pooling choices */
    void *arena;
};

/* Tensor indices, layout order. */
enum { MLP_W1, MLP_B1, MLP_W2, MLP_B2, MLP_N };
enum { CNN_C1W, CNN_C1B, CNN_C2W, CNN_C2B, CNN_F1W, CNN_F1B, CNN_F2W, CNN_F2B, CNN_N };

static const char *const mlp_names[MLP_N] = {"fc1.weight", "fc1.bias", "fc2.weight",
                                             "fc2.bias"};
static const char *const cnn_names[CNN_N] = {"conv1.weight", "conv1.bias", "conv2.weight",
                                             "conv2.bias",   "fc1.weight", "fc1.bias",
                                             "fc2.weight",   "fc2.bias"};

sumo_result sumo__model_config_default(sumo__model_kind kind, sumo__model_config *cfg)
{
    if (cfg == NULL || (unsigned)kind >= SUMO__MODEL_KIND_COUNT) return SUMO_ERR_INVALID_ARGUMENT;
    memset(cfg, 0, sizeof *cfg);
    cfg->kind = kind;
    cfg->in_rows = 28;
    cfg->in_cols = 28;
    cfg->classes = 10;
    cfg->hidden = kind == SUMO__MODEL_MLP ? 128 : 64;
    cfg->conv1 = 8;
    cfg->conv2 = 16;
    cfg->kernel = 5;
    return SUMO_SUCCESS;
}

/* ---------------------------------------------------------------------------------------- */
/* Initialisation                                                                            */

/* Uniform in [-bound, bound): 24 random bits, exact in float, scaled in double. */
static void fill_uniform(float *w, size_t n, double bound, uint64_t *state)
{
    for (size_t i = 0; i < n; i++) {
        double u = (double)(sumo__splitmix64(state) >> 40) * 0x1p-24;
        w[i] = (float)((2.0 * u - 1.0) * bound);
    }
}

void sumo__model_init(sumo__model *m, uint64_t seed)
{
    if (m == NULL) return;
    uint64_t state = seed;
    const sumo__model_config *c = &m->cfg;
    memset(m->params, 0, m->nparams * sizeof(float));
    memset(m->grads, 0, m->nparams * sizeof(float));
    /* Per weight tensor: fan_in, and gain^2 (2 when a ReLU follows); biases stay zero. */
    size_t wt[4], nw;
    double fan[4], gain2[4];
    if (c->kind == SUMO__MODEL_MLP) {
        nw = 2;
        wt[0] = MLP_W1, fan[0] = m->in, gain2[0] = 2.0;
        wt[1] = MLP_W2, fan[1] = c->hidden, gain2[1] = 1.0;
    } else {
        nw = 4;
        wt[0] = CNN_C1W, fan[0] = (double)c->kernel * c->kernel, gain2[0] = 2.0;
        wt[1] = CNN_C2W, fan[1] = (double)c->kernel * c->kernel * c->conv1, gain2[1] = 2.0;
        wt[2] = CNN_F1W, fan[2] = m->flat, gain2[2] = 2.0;
        wt[3] = CNN_F2W, fan[3] = c->hidden, gain2[3] = 1.0;
    }
    for (size_t i = 0; i < nw; i++)
        fill_uniform(m->params + m->offsets[wt[i]], m->sizes[wt[i]], sqrt(3.0 * gain2[i] / fan[i]),
                     &state);
}

/* ---------------------------------------------------------------------------------------- */
/* Creation                                                                                  */

/* A bump allocator over one arena: first pass sizes it, second pass hands out pointers. */
typedef struct bump {
    char *base;
    size_t used;
    bool overflow;
} bump;

static void *bump_take(bump *b, size_t count, size_t elem)
{
    size_t bytes;
    if (sumo__mul_overflows(count, elem, &bytes) || bytes > SIZE_MAX - ALIGN - b->used) {
        b->overflow = true;
        return NULL;
    }
    void *p = b->base != NULL ? b->base + b->used : NULL;
    b->used += (bytes + ALIGN - 1) / ALIGN * ALIGN;
    return p;
}

static void plan_scratch(sumo__model *m, bump *b)
{
    const size_t B = m->block;
    const sumo__model_config *c = &m->cfg;
    m->h = bump_take(b, B * (size_t)c->hidden, sizeof(float));
    m->dh = bump_take(b, B * (size_t)c->hidden, sizeof(float));
    m->logits = bump_take(b, B * (size_t)c->classes, sizeof(float));
    m->dlogits = bump_take(b, B * (size_t)c->classes, sizeof(float));
    if (c->kind != SUMO__MODEL_CNN) return;
    const size_t o1 = (size_t)m->h1 * m->w1, o2 = (size_t)m->h2 * m->w2;
    const size_t kk1 = (size_t)c->kernel * c->kernel, kk2 = kk1 * (size_t)c->conv1;
    /* The size_t products below cannot overflow: create caps every factor. */
    m->col1 = bump_take(b, B * o1 * kk1, sizeof(float));
    m->y1 = bump_take(b, B * o1 * (size_t)c->conv1, sizeof(float));
    m->p1 = bump_take(b, B * m->p1n, sizeof(float));
    m->dp1 = bump_take(b, B * m->p1n, sizeof(float));
    m->arg1 = bump_take(b, B * m->p1n, sizeof(uint32_t));
    m->col2 = bump_take(b, B * o2 * kk2, sizeof(float));
    m->dcol2 = bump_take(b, B * o2 * kk2, sizeof(float));
    m->y2 = bump_take(b, B * o2 * (size_t)c->conv2, sizeof(float));
    m->p2 = bump_take(b, B * m->p2n, sizeof(float));
    m->dp2 = bump_take(b, B * m->p2n, sizeof(float));
    m->arg2 = bump_take(b, B * m->p2n, sizeof(uint32_t));
}

static void *alloc_aligned(size_t bytes)
{
    if (bytes == 0) bytes = ALIGN;
    bytes = (bytes + ALIGN - 1) / ALIGN * ALIGN;
    return aligned_alloc(ALIGN, bytes);
}

/* Every gemm dimension is an int for CBLAS; these caps keep all of them (and the size_t
 * arithmetic of the scratch plan) far from overflow. */
#define MAX_IMAGE 1024
#define MAX_WIDTH 65536
#define MAX_BATCH ((size_t)1 << 20)

static bool in_range(int v, int lo, int hi) { return v >= lo && v <= hi; }

sumo_result sumo__model_create_config(const sumo__model_config *cfg, size_t max_batch,
                                      uint64_t seed, sumo__model **out)
{
    if (out == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *out = NULL;
    if (cfg == NULL || (unsigned)cfg->kind >= SUMO__MODEL_KIND_COUNT || max_batch == 0 ||
        max_batch > MAX_BATCH || !in_range(cfg->in_rows, 1, MAX_IMAGE) ||
        !in_range(cfg->in_cols, 1, MAX_IMAGE) || !in_range(cfg->classes, 2, 256) ||
        !in_range(cfg->hidden, 1, MAX_WIDTH))
        return SUMO_ERR_INVALID_ARGUMENT;

    sumo__model *m = calloc(1, sizeof *m);
    if (m == NULL) return SUMO_ERR_SYSTEM;
    m->cfg = *cfg;
    m->max_batch = max_batch;
    m->in = cfg->in_rows * cfg->in_cols;
    const size_t H = (size_t)cfg->hidden, K = (size_t)cfg->classes;

    if (cfg->kind == SUMO__MODEL_MLP) {
        m->ntensors = MLP_N;
        m->sizes[MLP_W1] = H * (size_t)m->in;
        m->sizes[MLP_B1] = H;
        m->sizes[MLP_W2] = K * H;
        m->sizes[MLP_B2] = K;
        for (int i = 0; i < MLP_N; i++) m->names[i] = mlp_names[i];
        m->block = max_batch; /* one gemm per layer for the whole batch */
    } else {
        if (!in_range(cfg->conv1, 1, 1024) || !in_range(cfg->conv2, 1, 1024) ||
            !in_range(cfg->kernel, 1, 64)) {
            free(m);
            return SUMO_ERR_INVALID_ARGUMENT;
        }
        const int k = cfg->kernel;
        m->h1 = sumo__conv_out(cfg->in_rows, k), m->w1 = sumo__conv_out(cfg->in_cols, k);
        m->p1h = m->h1 / 2, m->p1w = m->w1 / 2;
        m->h2 = sumo__conv_out(m->p1h, k), m->w2 = sumo__conv_out(m->p1w, k);
        m->p2h = m->h2 / 2, m->p2w = m->w2 / 2;
        if (m->p2h < 1 || m->p2w < 1) { /* image too small for conv-pool-conv-pool */
            free(m);
            return SUMO_ERR_INVALID_ARGUMENT;
        }
        m->s1 = (sumo__conv_shape){cfg->in_rows, cfg->in_cols, 1, k, cfg->conv1};
        m->s2 = (sumo__conv_shape){m->p1h, m->p1w, cfg->conv1, k, cfg->conv2};
        m->p1n = (size_t)m->p1h * m->p1w * cfg->conv1;
        m->p2n = (size_t)m->p2h * m->p2w * cfg->conv2;
        m->block = SUMO__MIN(max_batch, (size_t)CNN_BLOCK);
        /* The blocks' gemm row counts and fc1's width must fit CBLAS's int. */
        if (m->p2n > INT_MAX || (size_t)m->h1 * m->w1 * m->block > INT_MAX ||
            (size_t)k * k * cfg->conv1 > INT_MAX) {
            free(m);
            return SUMO_ERR_INVALID_ARGUMENT;
        }
        m->flat = (int)m->p2n;
        m->ntensors = CNN_N;
        m->sizes[CNN_C1W] = (size_t)cfg->conv1 * k * k;
        m->sizes[CNN_C1B] = (size_t)cfg->conv1;
        m->sizes[CNN_C2W] = (size_t)cfg->conv2 * k * k * cfg->conv1;
        m->sizes[CNN_C2B] = (size_t)cfg->conv2;
        m->sizes[CNN_F1W] = H * (size_t)m->flat;
        m->sizes[CNN_F1B] = H;
        m->sizes[CNN_F2W] = K * H;
        m->sizes[CNN_F2B] = K;
        for (int i = 0; i < CNN_N; i++) m->names[i] = cnn_names[i];
    }
    size_t total = 0;
    for (size_t i = 0; i < m->ntensors; i++) {
        m->offsets[i] = total;
        total += m->sizes[i]; /* each below 2^36 by the caps */
    }
    m->nparams = total;

    bump b = {NULL, 0, false};
    plan_scratch(m, &b);
    if (b.overflow) {
        free(m);
        return SUMO_ERR_INVALID_ARGUMENT;
    }
    m->arena = alloc_aligned(b.used);
    m->params = alloc_aligned(total * sizeof(float));
    m->grads = alloc_aligned(total * sizeof(float));
    if (m->arena == NULL || m->params == NULL || m->grads == NULL) {
        sumo__model_destroy(m);
        return SUMO_ERR_SYSTEM;
    }
    b = (bump){m->arena, 0, false};
    plan_scratch(m, &b);
    sumo__model_init(m, seed);
    *out = m;
    return SUMO_SUCCESS;
}

sumo_result sumo__model_create(sumo__model_kind kind, int hidden, size_t max_batch,
                               uint64_t seed, sumo__model **out)
{
    sumo__model_config cfg;
    if (out != NULL) *out = NULL;
    SUMO__CHECK(sumo__model_config_default(kind, &cfg));
    if (hidden < 0) return SUMO_ERR_INVALID_ARGUMENT;
    if (hidden > 0) cfg.hidden = hidden;
    return sumo__model_create_config(&cfg, max_batch, seed, out);
}

void sumo__model_destroy(sumo__model *m)
{
    if (m == NULL) return;
    free(m->arena);
    if (!m->external) {
        free(m->params);
        free(m->grads);
    }
    free(m);
}

float *sumo__model_params(sumo__model *m) { return m != NULL ? m->params : NULL; }
void sumo__model_adopt_buffers(sumo__model *m, float *params, float *grads)
{
    memcpy(params, m->params, m->nparams * sizeof *params);
    memcpy(grads, m->grads, m->nparams * sizeof *grads);
    if (!m->external) {
        free(m->params);
        free(m->grads);
    }
    m->params = params;
    m->grads = grads;
    m->external = true;
}

float *sumo__model_grads(sumo__model *m) { return m != NULL ? m->grads : NULL; }
size_t sumo__model_num_params(const sumo__model *m) { return m != NULL ? m->nparams : 0; }

void sumo__model_layout(const sumo__model *m, const size_t **sizes, size_t *ntensors)
{
    if (sizes != NULL) *sizes = m != NULL ? m->sizes : NULL;
    if (ntensors != NULL) *ntensors = m != NULL ? m->ntensors : 0;
}

const char *sumo__model_tensor_name(const sumo__model *m, size_t i)
{
    return m != NULL && i < m->ntensors ? m->names[i] : "?";
}

void sumo__model_describe(const sumo__model *m, char *buf, size_t len)
{
    if (buf == NULL || len == 0) return;
    if (m == NULL) {
        snprintf(buf, len, "(no model)");
        return;
    }
    const sumo__model_config *c = &m->cfg;
    if (c->kind == SUMO__MODEL_MLP)
        snprintf(buf, len, "mlp %d-%d-%d (%zu params)", m->in, c->hidden, c->classes,
                 m->nparams);
    else
        snprintf(buf, len,
                 "cnn %dx%d conv%d@%dx%d pool conv%d@%dx%d pool %d-%d-%d (%zu params)",
                 c->in_rows, c->in_cols, c->conv1, c->kernel, c->kernel, c->conv2, c->kernel,
                 c->kernel, m->flat, c->hidden, c->classes, m->nparams);
}

/* ---------------------------------------------------------------------------------------- */
/* Forward and backward                                                                      */

#define P(m, t) ((m)->params + (m)->offsets[t])
#define G(m, t) ((m)->grads + (m)->offsets[t])

/*
 * One block of n samples (n <= m->block) through the network. With labels, also the loss:
 * returns the sum of the block's losses, counts its correct predictions into *correct, and
 * when train accumulates the gradient of (sum of losses) * grad_scale into the gradient
 * buffer. A sample's loss gradient depends only on its own logits, so a batch can be cut
 * into blocks that each go forward and straight back while their activations (im2col
 * matrices included) are still in cache; only the parameter gradients span blocks.
 */
static double run_block(sumo__model *m, const float *x, const uint8_t *y, size_t n, bool train,
                        double grad_scale, size_t *correct)
{
    const sumo__model_config *c = &m->cfg;
    const bool cnn = c->kind == SUMO__MODEL_CNN;
    const float *feat = x; /* what feeds the first dense layer */
    int nfeat = m->in;
    size_t fc1w = MLP_W1, fc1b = MLP_B1, fc2w = MLP_W2, fc2b = MLP_B2;
    if (cnn) {
        /* conv -> pool(+bias, ReLU) -> conv -> pool(+bias, ReLU); biases and ReLUs are
         * applied by the pooling, on a quarter of the values. */
        sumo__conv_forward(x, n, &m->s1, P(m, CNN_C1W), NULL, m->y1, m->col1);
        sumo__maxpool_forward(m->y1, n, m->h1, m->w1, c->conv1, P(m, CNN_C1B), true, m->p1,
                              m->arg1);
        sumo__conv_forward(m->p1, n, &m->s2, P(m, CNN_C2W), NULL, m->y2, m->col2);
        sumo__maxpool_forward(m->y2, n, m->h2, m->w2, c->conv2, P(m, CNN_C2B), true, m->p2,
                              m->arg2);
        feat = m->p2, nfeat = m->flat;
        fc1w = CNN_F1W, fc1b = CNN_F1B, fc2w = CNN_F2W, fc2b = CNN_F2B;
    }
    sumo__dense_forward(feat, n, nfeat, c->hidden, P(m, fc1w), P(m, fc1b), true, m->h);
    sumo__dense_forward(m->h, n, c->hidden, c->classes, P(m, fc2w), P(m, fc2b), false,
                        m->logits);
    if (y == NULL) return 0.0;
    double loss = sumo__softmax_ce(m->logits, y, n, c->classes, grad_scale,
                                   train ? m->dlogits : NULL, correct);
    if (!train) return loss;

    sumo__dense_backward(m->h, m->dlogits, n, c->hidden, c->classes, P(m, fc2w), G(m, fc2w),
                         G(m, fc2b), m->dh);
    sumo__relu_backward(m->h, m->dh, n * (size_t)c->hidden);
    sumo__dense_backward(feat, m->dh, n, nfeat, c->hidden, P(m, fc1w), G(m, fc1w), G(m, fc1b),
                         cnn ? m->dp2 : NULL);
    if (!cnn) return loss;
    /* y2 and y1 now receive the gradients of the conv outputs; the pooling's backward also
     * applies the ReLU mask and sums the bias gradient. col1 and col2 are still this block's
     * im2col matrices from the forward pass. */
    sumo__maxpool_backward(m->dp2, m->p2, m->arg2, n, m->h2, m->w2, c->conv2, m->y2,
                           G(m, CNN_C2B));
    sumo__conv_backward(m->col2, m->y2, n, &m->s2, P(m, CNN_C2W), G(m, CNN_C2W), NULL, m->dp1,
                        m->dcol2);
    sumo__maxpool_backward(m->dp1, m->p1, m->arg1, n, m->h1, m->w1, c->conv1, m->y1,
                           G(m, CNN_C1B));
    sumo__conv_backward(m->col1, m->y1, n, &m->s1, P(m, CNN_C1W), G(m, CNN_C1W), NULL, NULL,
                        NULL);
    return loss;
}

static bool labels_valid(const uint8_t *y, size_t n, int classes)
{
    uint8_t worst = 0;
    for (size_t i = 0; i < n; i++) worst = y[i] > worst ? y[i] : worst;
    return worst < classes;
}

sumo_result sumo__model_forward_backward(sumo__model *m, const float *x, const uint8_t *y,
                                         size_t batch, double *loss_out)
{
    if (m == NULL || x == NULL || y == NULL || batch == 0 || batch > m->max_batch ||
        !labels_valid(y, batch, m->cfg.classes))
        return SUMO_ERR_INVALID_ARGUMENT;
    memset(m->grads, 0, m->nparams * sizeof(float));
    const double scale = 1.0 / (double)batch;
    double total = 0.0;
    for (size_t s = 0; s < batch; s += m->block) {
        const size_t n = SUMO__MIN(m->block, batch - s);
        total += run_block(m, x + s * (size_t)m->in, y + s, n, true, scale, NULL);
    }
    if (loss_out != NULL) *loss_out = total / (double)batch;
    return SUMO_SUCCESS;
}

sumo_result sumo__model_evaluate(sumo__model *m, const float *x, const uint8_t *y, size_t n,
                                 double *loss, double *accuracy)
{
    if (m == NULL || x == NULL || y == NULL || n == 0 || !labels_valid(y, n, m->cfg.classes))
        return SUMO_ERR_INVALID_ARGUMENT;
    double total = 0.0;
    size_t right = 0;
    for (size_t s = 0; s < n; s += m->block) {
        const size_t b = SUMO__MIN(m->block, n - s);
        size_t ok = 0;
        total += run_block(m, x + s * (size_t)m->in, y + s, b, false, 0.0, &ok);
        right += ok;
    }
    if (loss != NULL) *loss = total / (double)n;
    if (accuracy != NULL) *accuracy = (double)right / (double)n;
    return SUMO_SUCCESS;
}

sumo_result sumo__model_logits(sumo__model *m, const float *x, size_t batch, float *logits)
{
    if (m == NULL || x == NULL || logits == NULL || batch == 0 || batch > m->max_batch)
        return SUMO_ERR_INVALID_ARGUMENT;
    const size_t k = (size_t)m->cfg.classes;
    for (size_t s = 0; s < batch; s += m->block) {
        const size_t b = SUMO__MIN(m->block, batch - s);
        run_block(m, x + s * (size_t)m->in, NULL, b, false, 0.0, NULL);
        memcpy(logits + s * k, m->logits, b * k * sizeof(float));
    }
    return SUMO_SUCCESS;
}
