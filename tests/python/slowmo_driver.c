/*
 * The C side of the SlowMo parity test: P ranks of the threads transport run sumo_slowmo
 * around local steps read from files (params -= delta, the step a plain SGD at lr 1 on that
 * gradient takes), and rank 0's final parameters are written out. The Python test runs
 * sumo.torch.SlowMo with torch.optim.SGD on the same deltas and compares bit for bit.
 *
 *   slowmo_driver OUT N TAU INNER ALPHA BETA EFFICIENT LR STEPS START DELTAS0 [DELTAS1 ...]
 *   START: N floats; DELTASr: STEPS x N floats, rank r's deltas step by step
 */
#include "driver_io.h"
#include <sumo.h>
#include <sumo_distributed.h>

#include <stdio.h>
#include <stdlib.h>

typedef struct job {
    sumo_slowmo_options o;
    size_t n;
    int steps;
    double lr;
    float *start;
    float **deltas;
    float *out;
} job;

static sumo_result rank_fn(sumo_comm *comm, int rank, void *arg)
{
    job *j = arg;
    float *p = malloc(j->n * sizeof *p);
    for (size_t i = 0; i < j->n; i++) p[i] = j->start[i];
    sumo_slowmo *s = NULL;
    sumo_result r = sumo_slowmo_create(comm, j->n, SUMO_FLOAT32, &j->o, &s);
    for (int step = 0; step < j->steps && r == SUMO_SUCCESS; step++) {
        r = sumo_slowmo_begin(s, p);
        const float *d = j->deltas[rank] + (size_t)step * j->n;
        for (size_t i = 0; i < j->n; i++) p[i] -= d[i];
        if (r == SUMO_SUCCESS) r = sumo_slowmo_end(s, p, j->lr, NULL);
    }
    if (rank == 0)
        for (size_t i = 0; i < j->n; i++) j->out[i] = p[i];
    sumo_slowmo_destroy(s);
    free(p);
    return r;
}

int main(int argc, char **argv)
{
    if (argc < 12) {
        fprintf(stderr, "usage: slowmo_driver OUT N TAU INNER ALPHA BETA EFFICIENT LR STEPS "
                        "START DELTAS0 [DELTAS1 ...]\n");
        return 2;
    }
    job j = {.n = strtoull(argv[2], NULL, 10), .lr = atof(argv[8]), .steps = atoi(argv[9])};
    sumo_slowmo_options_preset(SUMO_SLOWMO_PRESET_SLOWMO, &j.o);
    j.o.tau = atoi(argv[3]);
    j.o.inner_period = atoi(argv[4]);
    j.o.alpha = atof(argv[5]);
    j.o.beta = atof(argv[6]);
    j.o.memory_efficient = atoi(argv[7]);
    int nranks = argc - 11;
    j.start = driver_read_floats("slowmo_driver", argv[10], j.n);
    j.deltas = calloc((size_t)nranks, sizeof *j.deltas);
    for (int r = 0; r < nranks; r++) j.deltas[r] = driver_read_floats("slowmo_driver", argv[11 + r], j.n * (size_t)j.steps);
    j.out = malloc(j.n * sizeof *j.out);
    sumo_result r = sumo_threads_run(nranks, rank_fn, &j, NULL);
    if (r != SUMO_SUCCESS) {
        fprintf(stderr, "slowmo_driver: %s\n", sumo_result_name(r));
        return 1;
    }
    FILE *out = fopen(argv[1], "wb");
    if (out == NULL || fwrite(j.out, sizeof(float), j.n, out) != j.n || fclose(out) != 0) {
        fprintf(stderr, "slowmo_driver: cannot write %s\n", argv[1]);
        return 1;
    }
    return 0;
}
