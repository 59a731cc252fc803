/*
 * The C side of the Python binding's parity test: combines P ranks' fp32 buffers read from
 * files with one sumo aggregator per rank on the threads transport, and writes rank 0's
 * result. The Python test runs the same inputs through sumo.torch under mpirun and compares
 * the two files bit for bit (every transport gives the same bits).
 *
 *   combine_driver METHOD OUT COUNTS IN0 IN1 ...    METHOD: avg | adasum | acga
 *   COUNTS: the layout, comma-separated element counts (their sum is the buffer size)
 */
#include <sumo.h>
#include <sumo_aggregation.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_TENSORS 256

typedef struct job {
    sumo_aggregator_options opts;
    float **bufs;
    size_t n;
} job;

static sumo_result rank_fn(sumo_comm *comm, int rank, void *arg)
{
    job *j = arg;
    sumo_aggregator *agg = NULL;
    sumo_result r = sumo_aggregator_create(comm, &j->opts, &agg);
    if (r == SUMO_SUCCESS) r = sumo_aggregator_apply(agg, j->bufs[rank], j->n, SUMO_FLOAT32);
    sumo_aggregator_destroy(agg);
    return r;
}

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: combine_driver avg|adasum|acga OUT COUNTS IN0 [IN1 ...]\n");
        return 2;
    }
    sumo_aggregation method = strcmp(argv[1], "avg") == 0      ? SUMO_AGGREGATE_AVERAGE
                              : strcmp(argv[1], "adasum") == 0 ? SUMO_AGGREGATE_ADASUM
                              : strcmp(argv[1], "acga") == 0   ? SUMO_AGGREGATE_ACGA
                                                               : SUMO_AGGREGATE_COUNT;
    if (method == SUMO_AGGREGATE_COUNT) {
        fprintf(stderr, "combine_driver: unknown method %s\n", argv[1]);
        return 2;
    }
    size_t counts[MAX_TENSORS], ntensors = 0, n = 0;
    for (char *p = argv[3]; *p && ntensors < MAX_TENSORS;) {
        char *end;
        counts[ntensors] = strtoull(p, &end, 10);
        n += counts[ntensors++];
        p = *end == ',' ? end + 1 : end;
        if (end == p && *p) break;
    }
    int nranks = argc - 4;
    job j = {.n = n, .bufs = calloc((size_t)nranks, sizeof(float *))};
    sumo_aggregator_options_default(method, &j.opts);
    j.opts.tensor_counts = counts;
    j.opts.ntensors = ntensors;
    for (int r = 0; r < nranks; r++) {
        FILE *f = fopen(argv[4 + r], "rb");
        j.bufs[r] = malloc(n * sizeof(float));
        if (f == NULL || fread(j.bufs[r], sizeof(float), n, f) != n) {
            fprintf(stderr, "combine_driver: cannot read %zu floats from %s\n", n, argv[4 + r]);
            return 1;
        }
        fclose(f);
    }
    sumo_result r = sumo_threads_run(nranks, rank_fn, &j, NULL);
    if (r != SUMO_SUCCESS) {
        fprintf(stderr, "combine_driver: %s\n", sumo_result_name(r));
        return 1;
    }
    FILE *out = fopen(argv[2], "wb");
    if (out == NULL || fwrite(j.bufs[0], sizeof(float), n, out) != n || fclose(out) != 0) {
        fprintf(stderr, "combine_driver: cannot write %s\n", argv[2]);
        return 1;
    }
    for (int k = 0; k < nranks; k++) free(j.bufs[k]);
    free(j.bufs);
    return 0;
}
