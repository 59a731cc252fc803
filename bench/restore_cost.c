/*
 * What SUMO_PARAM_RESTORE_ON_FAILURE costs a collective that succeeds: the copy of the receive
 * buffer it takes before the call (sumo_elastic.h). Threads transport, fp32 sum allreduce, out
 * of place; for each size the off and on calls alternate in rounds, so a slow phase of a shared
 * machine hits both alike, and the medians of the per-call times are compared.
 *
 *   restore_cost [ranks (2)] [rounds (5)]
 *
 * Prints, per size: the median time a call takes without and with the copy, and their ratio.
 */
#include "sumo.h"

#include "bench_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CALLS 20
#define WARM 5
#define MAX_ROUNDS 32

typedef struct run {
    size_t n;
    int restore;
    double per_call[64]; /* rank 0's seconds per call, per round */
    int round;
} run;

static sumo_result one_rank(sumo_comm *comm, int rank, void *arg)
{
    run *r = arg;
    float *in = malloc(r->n * sizeof *in), *out = malloc(r->n * sizeof *out);
    if (!in || !out) {
        free(in);
        free(out);
        return SUMO_ERR_SYSTEM;
    }
    for (size_t i = 0; i < r->n; i++) in[i] = (float)(i % 97) + (float)rank;
    memset(out, 0, r->n * sizeof *out);
    sumo_result res = sumo_comm_set_param(comm, SUMO_PARAM_RESTORE_ON_FAILURE, r->restore);
    for (int k = 0; k < WARM && res == SUMO_SUCCESS; k++)
        res = sumo_allreduce(in, out, r->n, SUMO_FLOAT32, SUMO_OP_SUM, comm);
    if (res == SUMO_SUCCESS) res = sumo_barrier(comm);
    double t0 = bench_now();
    for (int k = 0; k < CALLS && res == SUMO_SUCCESS; k++)
        res = sumo_allreduce(in, out, r->n, SUMO_FLOAT32, SUMO_OP_SUM, comm);
    if (res == SUMO_SUCCESS) res = sumo_barrier(comm);
    if (rank == 0) r->per_call[r->round] = (bench_now() - t0) / CALLS;
    free(in);
    free(out);
    return res;
}

int main(int argc, char **argv)
{
    int ranks = argc > 1 ? atoi(argv[1]) : 2;
    int rounds = argc > 2 ? atoi(argv[2]) : 5;
    if (ranks < 1 || ranks > 64 || rounds < 1 || rounds > MAX_ROUNDS) {
        fprintf(stderr, "usage: restore_cost [ranks 1..64 (2)] [rounds 1..%d (5)]\n",
                MAX_ROUNDS);
        return 2;
    }
    static const size_t sizes[] = {16 * 1024, 1024 * 1024, 16 * 1024 * 1024};
    printf("threads transport, %d ranks, fp32 sum allreduce out of place, %d calls a round, "
           "medians of %d rounds\n", ranks, CALLS, rounds);
    printf("| bytes | off ms | on ms | on / off |\n|---|---|---|---|\n");
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        run r[2] = {{.n = sizes[s], .restore = 0}, {.n = sizes[s], .restore = 1}};
        for (int k = 0; k < rounds; k++)
            for (int m = 0; m < 2; m++) {
                sumo_result results[64];
                r[m].round = k;
                sumo_result res = sumo_threads_run(ranks, one_rank, &r[m], results);
                for (int q = 0; q < ranks && res == SUMO_SUCCESS; q++) res = results[q];
                if (res != SUMO_SUCCESS) {
                    fprintf(stderr, "restore_cost: %s\n", sumo_result_name(res));
                    return 1;
                }
            }
        double off = bench_median(r[0].per_call, rounds), on = bench_median(r[1].per_call, rounds);
        printf("| %zu | %.4f | %.4f | %.2f |\n", sizes[s] * sizeof(float), 1e3 * off, 1e3 * on,
               on / off);
    }
    return 0;
}
