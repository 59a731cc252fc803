#include "collectives/comm.h"
#include "transport/threads.h"

#include <stdlib.h>
#include <string.h>

sumo_result sumo__comm_wrap(sumo__transport *tp, sumo_comm **out)
{
    sumo_comm *c = calloc(1, sizeof *c);
    if (c == NULL) {
        tp->ops->destroy(tp);
        return SUMO_ERR_SYSTEM;
    }
    c->tp = tp;
    c->kernels = sumo__host_kernels();
    c->agreed = calloc((size_t)tp->size, SUMO__ANNOUNCE_BYTES);
    if (c->agreed == NULL) goto fail_agreed;
    if (pthread_mutex_init(&c->lock, NULL) != 0) goto fail_lock;
    if (pthread_mutex_init(&c->exec, NULL) != 0) goto fail_exec;
    if (pthread_cond_init(&c->idle, NULL) != 0) goto fail_idle;
    if (pthread_cond_init(&c->work, NULL) != 0) goto fail_work;
    tp->status = &c->status;
    *out = c;
    return SUMO_SUCCESS;
fail_work:
    pthread_cond_destroy(&c->idle);
fail_idle:
    pthread_mutex_destroy(&c->exec);
fail_exec:
    pthread_mutex_destroy(&c->lock);
fail_lock:
    free(c->agreed);
fail_agreed:
    free(c);
    tp->ops->destroy(tp);
    return SUMO_ERR_SYSTEM;
}

sumo_result sumo__comm_free(sumo_comm *comm)
{
    sumo_result r = comm->tp->ops->destroy(comm->tp);
    pthread_cond_destroy(&comm->work);
    pthread_cond_destroy(&comm->idle);
    pthread_mutex_destroy(&comm->exec);
    pthread_mutex_destroy(&comm->lock);
    if (comm->op_table_free) comm->op_table_free(comm->op_table);
    free(comm->agreed);
    free(comm->scratch);
    free(comm);
    return r;
}

sumo_result sumo_comm_create_threads(int nranks, sumo_comm **comms)
{
    /* The mailboxes are nranks^2 cache lines: 1024 ranks is 128 MiB, a sane ceiling. */
    if (comms == NULL || nranks < 1 || nranks > SUMO_THREADS_MAX_RANKS) return SUMO_ERR_INVALID_ARGUMENT;
    sumo__transport **tps = calloc((size_t)nranks, sizeof *tps);
    if (tps == NULL) return SUMO_ERR_SYSTEM;
    sumo_result r = sumo__threads_transport_create(nranks, tps);
    if (r != SUMO_SUCCESS) {
        free(tps);
        return r;
    }
    for (int i = 0; i < nranks; i++) {
        r = sumo__comm_wrap(tps[i], &comms[i]);
        if (r != SUMO_SUCCESS) {
            /* Ranks i + 1.. were never wrapped; rank i's transport went with the failure. */
            for (int k = 0; k < i; k++) sumo__comm_free(comms[k]);
            for (int k = i + 1; k < nranks; k++) tps[k]->ops->destroy(tps[k]);
            free(tps);
            return r;
        }
    }
    free(tps);
    return SUMO_SUCCESS;
}

sumo_result sumo_comm_rank(const sumo_comm *comm, int *rank)
{
    if (comm == NULL || rank == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *rank = comm->tp->rank;
    return SUMO_SUCCESS;
}

sumo_result sumo_comm_size(const sumo_comm *comm, int *size)
{
    if (comm == NULL || size == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *size = comm->tp->size;
    return SUMO_SUCCESS;
}

sumo_result sumo_comm_transport(const sumo_comm *comm, const char **name)
{
    if (comm == NULL || name == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *name = comm->tp->ops->name;
    return SUMO_SUCCESS;
}

sumo_result sumo_comm_set_timeout(sumo_comm *comm, double seconds)
{
    /* Also rejects NaN. The upper bound keeps the deadline arithmetic in int64 nanoseconds. */
    if (comm == NULL || !(seconds > 0) || seconds > 1e8) return SUMO_ERR_INVALID_ARGUMENT;
    /* The deadline is read inside collectives: change it between them. */
    pthread_mutex_lock(&comm->exec);
    comm->tp->timeout_ns = (int64_t)(seconds * 1e9);
    if (comm->tp->timeout_ns < 1) comm->tp->timeout_ns = 1;
    pthread_mutex_unlock(&comm->exec);
    return SUMO_SUCCESS;
}

sumo_result sumo_comm_get_timeout(const sumo_comm *comm, double *seconds)
{
    if (comm == NULL || seconds == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *seconds = (double)comm->tp->timeout_ns / 1e9;
    return SUMO_SUCCESS;
}

sumo_result sumo_comm_error_message(const sumo_comm *comm, const char **message)
{
    if (comm == NULL || message == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *message = comm->status.message;
    return SUMO_SUCCESS;
}

sumo_result sumo_comm_set_param(sumo_comm *comm, sumo_comm_param param, int value)
{
    if (comm == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    if (param != SUMO_PARAM_ALGORITHM)
        return SUMO__COMM_FAIL(comm, SUMO_ERR_INVALID_ARGUMENT, "sumo_comm_set_param: unknown parameter %d", (int)param);
    if (value < 0 || value >= SUMO_ALGORITHM_COUNT)
        return SUMO__COMM_FAIL(comm, SUMO_ERR_INVALID_ARGUMENT, "sumo_comm_set_param: unknown algorithm %d", value);
    if (value == SUMO_ALGORITHM_SHARED_MEMORY && comm->tp->reach == SUMO__REACH_NONE)
        return SUMO__COMM_FAIL(comm, SUMO_ERR_INVALID_USAGE, "sumo_comm_set_param: the ranks of this communicator do not share memory");
    if (value == SUMO_ALGORITHM_PEER && comm->tp->offload == NULL)
        return SUMO__COMM_FAIL(comm, SUMO_ERR_INVALID_USAGE, "sumo_comm_set_param: transport %s has no allreduce of its own", comm->tp->ops->name);
    pthread_mutex_lock(&comm->exec);
    comm->algo = (sumo_algorithm)value;
    pthread_mutex_unlock(&comm->exec);
    return SUMO_SUCCESS;
}

sumo_result sumo_comm_get_param(const sumo_comm *comm, sumo_comm_param param, int *value)
{
    if (comm == NULL || value == NULL || param != SUMO_PARAM_ALGORITHM) return SUMO_ERR_INVALID_ARGUMENT;
    *value = (int)comm->algo;
    return SUMO_SUCCESS;
}

sumo_result sumo__comm_scratch(sumo_comm *comm, size_t bytes, void **out)
{
    if (bytes > comm->scratch_bytes) {
        if (bytes > SIZE_MAX - 4095)
            return SUMO__COMM_FAIL(comm, SUMO_ERR_SYSTEM, "scratch of %zu bytes", bytes);
        size_t rounded = (bytes + 4095) / 4096 * 4096;
        void *p = aligned_alloc(4096, rounded);
        if (p == NULL)
            return SUMO__COMM_FAIL(comm, SUMO_ERR_SYSTEM, "cannot allocate %zu bytes of scratch",
                              rounded);
        free(comm->scratch);
        comm->scratch = p;
        comm->scratch_bytes = rounded;
    }
    *out = comm->scratch;
    return SUMO_SUCCESS;
}

void sumo__comm_enter(sumo_comm *comm)
{
    pthread_mutex_lock(&comm->lock);
    /* Collectives on a handle run in the order they were issued. */
    while (comm->queue.pending > 0) pthread_cond_wait(&comm->idle, &comm->lock);
    /* Taken before the queue lock is dropped: a request started after this call was issued
     * runs after it. Nothing holds exec while waiting for lock, so this cannot deadlock. */
    pthread_mutex_lock(&comm->exec);
    pthread_mutex_unlock(&comm->lock);
}

void sumo__comm_leave(sumo_comm *comm) { pthread_mutex_unlock(&comm->exec); }

