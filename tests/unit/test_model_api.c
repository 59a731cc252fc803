/*
 * Models (train/model.h) apart from their gradients: layout and initialisation (a golden hash
 * of the seed's parameters), determinism, models on different threads sharing nothing,
 * evaluation against the logits, argument checks, and a small learning run.
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
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
        cmocka_unit_test(test_layout_and_init),
        cmocka_unit_test(test_determinism),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_evaluate),
        cmocka_unit_test(test_invalid_arguments),
        cmocka_unit_test(test_learns),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
