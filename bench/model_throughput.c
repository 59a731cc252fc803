/*
 * Training throughput of sumo's models on one thread: samples per second of forward +
 * backward + a plain SGD update, on Fashion-MNIST, for the MLP and the CNN at batch 64 and
 * 1024. bench/torch_throughput.py measures the same steps in PyTorch.
 *
 * Build (after `make BUILD=build`):
 *   gcc -O2 -std=c11 -D_GNU_SOURCE -Iinclude -Isrc bench/model_throughput.c \
 *       build/libsumo_train.a build/libsumo.a -lopenblas -lz -lm -pthread -o build/model_throughput
 * Run: OPENBLAS_NUM_THREADS=1 build/model_throughput [seconds per row] [data dir]
 */
#include "train/idx.h"
#include "train/model.h"

#include "bench_util.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Steps over consecutive slices of the data (wrapping), SGD with lr 0.01. */
static double run(sumo__model *m, const sumo__dataset *ds, size_t batch, long steps,
                  size_t *pos, double *loss_out)
{
    float *p = sumo__model_params(m);
    const float *g = sumo__model_grads(m);
    const size_t n = sumo__model_num_params(m), pix = (size_t)ds->rows * ds->cols;
    double t0 = bench_now(), loss = 0;
    for (long s = 0; s < steps; s++) {
        if (*pos + batch > ds->n) *pos = 0;
        if (sumo__model_forward_backward(m, ds->images + *pos * pix, ds->labels + *pos, batch,
                                         &loss) != SUMO_SUCCESS) {
            fprintf(stderr, "forward_backward failed\n");
            exit(1);
        }
        for (size_t i = 0; i < n; i++) p[i] -= 0.01f * g[i];
        *pos += batch;
    }
    *loss_out = loss;
    return bench_now() - t0;
}

int main(int argc, char **argv)
{
    double seconds = argc > 1 ? atof(argv[1]) : 2.0;
    const char *dir = argc > 2 ? argv[2] : NULL;
    openblas_set_num_threads(1);
    sumo__dataset ds;
    char err[512];
    if (sumo__dataset_load(dir, true, &ds, err, sizeof err) != SUMO_SUCCESS) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    printf("%-6s %6s %12s %10s\n", "model", "batch", "samples/s", "ms/step");
    const sumo__model_kind kinds[2] = {SUMO__MODEL_MLP, SUMO__MODEL_CNN};
    const size_t batches[2] = {64, 1024};
    for (int k = 0; k < 2; k++) {
        for (int b = 0; b < 2; b++) {
            sumo__model *m = NULL;
            if (sumo__model_create(kinds[k], 0, batches[b], 1, &m) != SUMO_SUCCESS) return 1;
            size_t pos = 0;
            double loss;
            /* Warm up, then size the run to about `seconds`; best of three. */
            double t = run(m, &ds, batches[b], 3, &pos, &loss) / 3;
            long steps = (long)(seconds / t) + 1;
            double best = 1e30;
            for (int rep = 0; rep < 3; rep++) {
                double dt = run(m, &ds, batches[b], steps, &pos, &loss);
                if (dt < best) best = dt;
            }
            printf("%-6s %6zu %12.0f %10.3f\n", kinds[k] == SUMO__MODEL_MLP ? "mlp" : "cnn",
                   batches[b], (double)steps * (double)batches[b] / best,
                   1e3 * best / (double)steps);
            fflush(stdout);
            sumo__model_destroy(m);
        }
    }
    sumo__dataset_free(&ds);
    return 0;
}
