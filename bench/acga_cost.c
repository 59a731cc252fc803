/*
 * What ACGA costs next to plain averaging: one apply of each on the same buffer, alternated in
 * the same run, on the threads transport. ACGA's step is two full-size allreduces, one
 * allgather of N scalars and two local passes (dot/norms, scale), so about 2x an average.
 *
 * Built by `make` as build/bench/acga_cost.
 * Run: build/bench/acga_cost [ranks (4)] [MiB per rank (64)] [repeats (11)]
 * Prints the median seconds of each and their ratio, and of ACGA's first collective alone (a
 * sum into another buffer) to separate the collectives from ACGA's local passes. The buffer is
 * refilled from the gradient before every call, outside the timed region.
 */
#include "sumo.h"
#include "sumo_aggregation.h"

#include "bench_util.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct shared {
    int nranks, repeats;
    size_t count;
    double *acga_s, *avg_s, *sum_s; /* rank 0's timings */
    int failed;
} shared;

typedef struct rank_arg {
    shared *sh;
    sumo_comm *comm;
    int rank;
} rank_arg;

static void *rank_main(void *p)
{
    rank_arg *ra = p;
    shared *sh = ra->sh;
    size_t n = sh->count;
    float *grad = malloc(n * sizeof *grad), *work = malloc(n * sizeof *work),
          *out = malloc(n * sizeof *out);
    sumo_aggregator_options o;
    sumo_aggregator_options_default(SUMO_AGGREGATE_ACGA, &o);
    sumo_aggregator *acga = NULL;
    if (!grad || !work || !out || sumo_aggregator_create(ra->comm, &o, &acga) != SUMO_SUCCESS) {
        sh->failed = 1;
        goto out;
    }
    /* A shared direction plus rank-dependent noise, cheap to generate. */
    uint32_t x = 12345u + 777u * (uint32_t)ra->rank;
    for (size_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        grad[i] = (float)((i % 97) * 0.01 - 0.48) + (float)(x >> 8) * 0x1p-25f - 0.25f;
    }
    sumo_comm_set_timeout(ra->comm, 600);
    for (int rep = -1; rep < sh->repeats; rep++) { /* rep -1 warms up pages and caches */
        for (int which = 0; which < 3; which++) {
            memcpy(work, grad, n * sizeof *work);
            sumo_barrier(ra->comm);
            double t0 = bench_now();
            sumo_result r;
            if (which == 0)
                r = sumo_aggregator_apply(acga, work, n, SUMO_FLOAT32);
            else if (which == 1)
                r = sumo_allreduce(work, work, n, SUMO_FLOAT32, SUMO_OP_AVERAGE, ra->comm);
            else /* ACGA's first collective alone: a sum into another buffer */
                r = sumo_allreduce(work, out, n, SUMO_FLOAT32, SUMO_OP_SUM, ra->comm);
            sumo_barrier(ra->comm);
            double t = bench_now() - t0;
            if (r != SUMO_SUCCESS) sh->failed = 1;
            double *dst = which == 0 ? sh->acga_s : which == 1 ? sh->avg_s : sh->sum_s;
            if (ra->rank == 0 && rep >= 0) dst[rep] = t;
        }
    }
out:
    sumo_aggregator_destroy(acga);
    free(grad);
    free(work);
    free(out);
    return NULL;
}

int main(int argc, char **argv)
{
    int nranks = argc > 1 ? atoi(argv[1]) : 4;
    size_t mib = argc > 2 ? (size_t)atol(argv[2]) : 64;
    int repeats = argc > 3 ? atoi(argv[3]) : 11;
    if (nranks < 1 || mib < 1 || repeats < 1) {
        fprintf(stderr, "usage: %s [ranks] [MiB per rank] [repeats]\n", argv[0]);
        return 2;
    }
    shared sh = {.nranks = nranks, .repeats = repeats, .count = mib * 1024 * 1024 / sizeof(float)};
    sh.acga_s = calloc((size_t)repeats, sizeof(double));
    sh.avg_s = calloc((size_t)repeats, sizeof(double));
    sh.sum_s = calloc((size_t)repeats, sizeof(double));
    sumo_comm **comms = calloc((size_t)nranks, sizeof *comms);
    pthread_t *th = calloc((size_t)nranks, sizeof *th);
    rank_arg *ra = calloc((size_t)nranks, sizeof *ra);
    if (!sh.acga_s || !sh.avg_s || !sh.sum_s || !comms || !th || !ra ||
        sumo_comm_create_threads(nranks, comms) != SUMO_SUCCESS) {
        fprintf(stderr, "setup failed\n");
        return 1;
    }
    for (int r = 0; r < nranks; r++) {
        ra[r] = (rank_arg){.sh = &sh, .comm = comms[r], .rank = r};
        if (pthread_create(&th[r], NULL, rank_main, &ra[r]) != 0) {
            fprintf(stderr, "pthread_create failed\n");
            return 1;
        }
    }
    for (int r = 0; r < nranks; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < nranks; r++) sumo_comm_destroy(comms[r]);
    if (sh.failed) {
        fprintf(stderr, "a call failed\n");
        return 1;
    }
    double a = bench_median(sh.acga_s, repeats), v = bench_median(sh.avg_s, repeats),
           s = bench_median(sh.sum_s, repeats);
    printf("ranks %d, %zu MiB fp32 per rank, %d repeats (median): acga %.4f s, average %.4f s, "
           "ratio %.2f (sum out of place %.4f s: acga - 2 x that = %.4f s of local passes)\n",
           nranks, mib, repeats, a, v, a / v, s, a - 2 * s);
    free(sh.acga_s);
    free(sh.avg_s);
    free(sh.sum_s);
    free(comms);
    free(th);
    free(ra);
    return 0;
}
