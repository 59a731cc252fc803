/*
 * The C side of the outer loop's parity tests (DiLoCo's and SlowMo's): P ranks of the threads
 * transport run sumo_diloco around local steps read from files (params -= delta, the step a
 * plain SGD at a power-of-two rate takes on grad = delta / lr), and every rank's final
 * parameters are written out, rank after rank. The Python tests run sumo.torch.DiLoCo and
 * SlowMo with torch.optim.SGD on the same deltas and compare bit for bit.
 *
 *   diloco_driver OUT LAYOUT FRAGMENT_OF OPTIONS STEPS START DELTAS0 [DELTAS1 ...]
 *   LAYOUT: tensor sizes, comma-separated; FRAGMENT_OF: one fragment per tensor, comma-
 *   separated, or "-" for the library's contiguous split;
 *   OPTIONS: H,F,DELAY,MERGE,OUTER,LR,MOMENTUM,COMBINE,COMPRESSION,BLOCK,INNER_LR,INNER_PERIOD,
 *   MEMORY_EFFICIENT,SPLIT (the enums' numbers); START: N floats; DELTASr: STEPS x N floats,
 *   rank r's deltas step by step.
 */
#include "driver_io.h"
#include <sumo.h>
#include <sumo_diloco.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct job {
    sumo_diloco_options o;
    size_t *layout;
    size_t ntensors, n;
    int *fragment_of;
    double inner_lr;
    int steps;
    float *start;
    float **deltas;
    float *out; /* P x n */
} job;

static sumo_result rank_fn(sumo_comm *comm, int rank, void *arg)
{
    job *j = arg;
    float *p = malloc(j->n * sizeof *p);
    memcpy(p, j->start, j->n * sizeof *p);
    sumo_diloco *d = NULL;
    sumo_result r = sumo_diloco_create(comm, j->layout, j->ntensors, j->n, SUMO_FLOAT32, &j->o, &d);
    for (int step = 0; step < j->steps && r == SUMO_SUCCESS; step++) {
        r = sumo_diloco_begin(d, p);
        const float *dl = j->deltas[rank] + (size_t)step * j->n;
        for (size_t i = 0; i < j->n; i++) p[i] -= dl[i];
        if (r == SUMO_SUCCESS) r = sumo_diloco_end(d, p, j->inner_lr, NULL);
    }
    memcpy(j->out + (size_t)rank * j->n, p, j->n * sizeof *p);
    sumo_diloco_destroy(d);
    free(p);
    return r;
}

/* Comma-separated numbers into doubles; returns the count. */
static size_t parse_list(const char *s, double *out, size_t max)
{
    size_t k = 0;
    while (*s && k < max) {
        char *end;
        out[k++] = strtod(s, &end);
        s = *end == ',' ? end + 1 : end;
        if (*end != ',' && *end != '\0') break;
    }
    return k;
}

int main(int argc, char **argv)
{
    if (argc < 8) {
        fprintf(stderr, "usage: diloco_driver OUT LAYOUT FRAGMENT_OF OPTIONS STEPS START "
                        "DELTAS0 [DELTAS1 ...]\n");
        return 2;
    }
    enum { MAXT = 256 };
    double v[MAXT];
    job j = {.steps = atoi(argv[5])};
    j.ntensors = parse_list(argv[2], v, MAXT);
    j.layout = calloc(j.ntensors, sizeof *j.layout);
    for (size_t t = 0; t < j.ntensors; t++) {
        j.layout[t] = (size_t)v[t];
        j.n += j.layout[t];
    }
    sumo_diloco_options_default(SUMO_DILOCO_PRESET_DILOCO, &j.o);
    if (strcmp(argv[3], "-") != 0) {
        if (parse_list(argv[3], v, MAXT) != j.ntensors) {
            fprintf(stderr, "diloco_driver: FRAGMENT_OF needs one entry per tensor\n");
            return 2;
        }
        j.fragment_of = calloc(j.ntensors, sizeof *j.fragment_of);
        for (size_t t = 0; t < j.ntensors; t++) j.fragment_of[t] = (int)v[t];
        j.o.fragment_of = j.fragment_of;
    }
    if (parse_list(argv[4], v, MAXT) != 14) {
        fprintf(stderr, "diloco_driver: OPTIONS needs 14 numbers\n");
        return 2;
    }
    j.o.sync_every = (int)v[0];
    j.o.fragments = (int)v[1];
    j.o.delay = (int)v[2];
    j.o.merge_alpha = v[3];
    j.o.outer = (sumo_outer_optimizer)v[4];
    j.o.lr = v[5];
    j.o.momentum = v[6];
    j.o.combine = (sumo_outer_combine)v[7];
    j.o.compression = (sumo_compression_format)v[8];
    j.o.block_size = (size_t)v[9];
    j.inner_lr = v[10];
    j.o.inner_period = (int)v[11];
    j.o.memory_efficient = (int)v[12];
    j.o.split = (sumo_fragment_split)v[13];
    int nranks = argc - 7;
    j.start = driver_read_floats("diloco_driver", argv[6], j.n);
    j.deltas = calloc((size_t)nranks, sizeof *j.deltas);
    for (int r = 0; r < nranks; r++) j.deltas[r] = driver_read_floats("diloco_driver", argv[7 + r], j.n * (size_t)j.steps);
    j.out = malloc((size_t)nranks * j.n * sizeof *j.out);
    sumo_result r = sumo_threads_run(nranks, rank_fn, &j, NULL);
    if (r != SUMO_SUCCESS) {
        fprintf(stderr, "diloco_driver: %s\n", sumo_result_name(r));
        return 1;
    }
    FILE *out = fopen(argv[1], "wb");
    size_t total = (size_t)nranks * j.n;
    if (out == NULL || fwrite(j.out, sizeof(float), total, out) != total || fclose(out) != 0) {
        fprintf(stderr, "diloco_driver: cannot write %s\n", argv[1]);
        return 1;
    }
    return 0;
}
