/* sumo_threads_run: the one-thread-per-rank runner of the threads transport. */
#include "sumo.h"

#include <stdbool.h>

#include <pthread.h>
#include <stdlib.h>

typedef struct rank_thread {
    sumo_comm *comm;
    int rank;
    sumo_rank_fn fn;
    void *arg;
    sumo_result result;
} rank_thread;

static void *rank_main(void *p)
{
    rank_thread *t = p;
    t->result = t->fn(t->comm, t->rank, t->arg);
    /* Leaving at once makes peers still waiting for this rank fail now, not at the deadline. */
    sumo_comm_destroy(t->comm);
    return NULL;
}

sumo_result sumo_threads_run(int nranks, sumo_rank_fn fn, void *arg, sumo_result *results)
{
    if (fn == NULL || nranks < 1 || nranks > SUMO_THREADS_MAX_RANKS) return SUMO_ERR_INVALID_ARGUMENT;
    sumo_comm **comms = calloc((size_t)nranks, sizeof *comms);
    rank_thread *threads = calloc((size_t)nranks, sizeof *threads);
    pthread_t *ids = calloc((size_t)nranks, sizeof *ids);
    bool *started = calloc((size_t)nranks, sizeof *started);
    sumo_result r = SUMO_ERR_SYSTEM;
    if (comms == NULL || threads == NULL || ids == NULL || started == NULL) goto out;
    r = sumo_comm_create_threads(nranks, comms);
    if (r != SUMO_SUCCESS) goto out;
    bool all_started = true;
    for (int i = 0; i < nranks; i++) {
        threads[i] = (rank_thread){.comm = comms[i], .rank = i, .fn = fn, .arg = arg};
        started[i] = pthread_create(&ids[i], NULL, rank_main, &threads[i]) == 0;
        if (!started[i]) {
            /* This rank leaves before it began: its peers see it gone at once. */
            sumo_comm_destroy(comms[i]);
            threads[i].result = SUMO_ERR_SYSTEM;
            all_started = false;
        }
    }
    r = SUMO_SUCCESS;
    for (int i = 0; i < nranks; i++) {
        if (started[i]) pthread_join(ids[i], NULL);
        if (results) results[i] = threads[i].result;
    }
    if (!all_started) r = SUMO_ERR_SYSTEM;
    else
        for (int i = 0; i < nranks && r == SUMO_SUCCESS; i++) r = threads[i].result;
out:
    free(started);
    free(ids);
    free(threads);
    free(comms);
    return r;
}
