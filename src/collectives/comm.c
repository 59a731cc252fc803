#include "collectives/comm.h"
#include "transport/threads.h"
#include "sumo_shm.h" /* sumo_store */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *sumo__store_fields_problem(const struct sumo_store *s, const char *key_prefix,
                                       int rank, int size, int max, const char *max_name,
                                       char *why, size_t why_bytes)
{
    const char *bad;
    if (s == NULL) return "options.store is NULL";
    if ((bad = SUMO__STRUCT_SIZE_PROBLEM(s, sumo_store, why, why_bytes)) != NULL) return bad;
    if (s->set == NULL || s->get == NULL) return "the store lacks set or get";
    if (key_prefix == NULL) return "options.key_prefix is NULL";
    if (size < 1 || size > max) {
        snprintf(why, why_bytes, "options.size is not 1 .. %s", max_name);
        return why;
    }
    if (rank < 0 || rank >= size) return "options.rank is not 0 .. size - 1";
    return NULL;
}

sumo_result sumo__comm_create_met(const sumo__store_constructor *how, const void *options,
                                  const char *size_problem, int rank, int size, char *error,
                                  size_t error_bytes, sumo_comm **out)
{
    char err[256] = "";
    sumo__env env = {0};
    sumo_result r = sumo__env_read(&env, err, sizeof err);
    if (r == SUMO_SUCCESS && size_problem != NULL) {
        snprintf(err, sizeof err, "%s: %.200s", how->name, size_problem);
        r = SUMO_ERR_INVALID_ARGUMENT;
    }
    char why[256];
    const char *bad = r == SUMO_SUCCESS ? how->fields(options, why, sizeof why) : NULL;
    if (bad != NULL) {
        snprintf(err, sizeof err, "%s: %.200s (rank %d, size %d)", how->name, bad, rank, size);
        r = SUMO_ERR_INVALID_ARGUMENT;
    }
    sumo__transport *tp = NULL;
    if (r == SUMO_SUCCESS) r = how->make(options, &env, &tp, err, sizeof err);
    if (r == SUMO_SUCCESS) {
        r = sumo__comm_wrap(tp, out);
        if (r != SUMO_SUCCESS) snprintf(err, sizeof err, "out of memory creating the communicator");
    }
    /* No handle carries the message: printed where asked for, and always for a malformed
     * environment (as every constructor does). */
    if (r != SUMO_SUCCESS && (env.log_level >= SUMO__LOG_WARN || strncmp(err, "SUMO_", 5) == 0))
        fprintf(stderr, "sumo: %s\n", err);
    if (error && error_bytes > 0) snprintf(error, error_bytes, "%s", err);
    return r;
}

sumo_result sumo__comm_wrap(sumo__transport *tp, sumo_comm **out)
{
    sumo_comm *c = calloc(1, sizeof *c);
    sumo__queue *q = calloc(1, sizeof *q);
    if (c == NULL || q == NULL) goto fail_alloc;
    c->tp = tp;
    c->x = sumo__host_exec();
    c->queue = q;
    q->comm = c;
    q->refs = 1;
    c->agreed = calloc((size_t)tp->size, SUMO__ANNOUNCE_BYTES);
    if (c->agreed == NULL) goto fail_alloc;
    if (pthread_mutex_init(&q->lock, NULL) != 0) goto fail_lock;
    if (pthread_mutex_init(&c->exec, NULL) != 0) goto fail_exec;
    if (pthread_cond_init(&q->idle, NULL) != 0) goto fail_idle;
    if (pthread_cond_init(&q->work, NULL) != 0) goto fail_work;
    tp->status = &c->status;
    *out = c;
    return SUMO_SUCCESS;
fail_work:
    pthread_cond_destroy(&q->idle);
fail_idle:
    pthread_mutex_destroy(&c->exec);
fail_exec:
    pthread_mutex_destroy(&q->lock);
fail_lock:
fail_alloc:
    if (c) free(c->agreed);
    free(q);
    free(c);
    tp->ops->destroy(tp);
    return SUMO_ERR_SYSTEM;
}

void sumo__queue_free(sumo__queue *q)
{
    pthread_cond_destroy(&q->work);
    pthread_cond_destroy(&q->idle);
    pthread_mutex_destroy(&q->lock);
    free(q);
}

sumo_result sumo__comm_free(sumo_comm *comm)
{
    /* What sumo_mem_alloc gave and nobody freed: the transport's destroy releases its own
     * shared memory, plain memory is ours. */
    while (comm->mem_blocks) {
        sumo__mem_block *block = comm->mem_blocks;
        comm->mem_blocks = block->next;
        if (!comm->tp->ops->mem_free) free(block->ptr);
        free(block);
    }
    sumo_result r = comm->tp->ops->destroy(comm->tp);
    sumo__queue *q = comm->queue;
    /* Requests not yet waited on keep the queue; the last one out frees it. */
    pthread_mutex_lock(&q->lock);
    q->comm = NULL;
    while (q->spare) {
        sumo__spare *s = q->spare;
        q->spare = s->next;
        free(s);
    }
    bool last = --q->refs == 0;
    pthread_mutex_unlock(&q->lock);
    if (last) sumo__queue_free(q);
    pthread_mutex_destroy(&comm->exec);
    /* A two-level communicator's Adasum ops hold ops of its levels, which requests.c destroys
     * after this. */
    for (size_t i = 0; i < comm->nops; i++) {
        sumo__op_entry *e = comm->ops[i];
        if (e && e->release) e->release(e->impl);
        free(e);
    }
    free(comm->ops);
    if (comm->imports_release) comm->imports_release(comm->imports);
    for (int i = 0; i <= SUMO__MAX_KERNEL_TABLES; i++) {
        sumo__data_scratch *d = &comm->data_scratch[i];
        if (d->p) d->k->release(d->k->ctx, d->p);
    }
    free(comm->agreed);
    free(comm->scratch);
    free(comm->undo);
    free(comm);
    return r;
}

sumo_result sumo_comm_create_threads(int nranks, sumo_comm **comms)
{
    /* The mailboxes are nranks^2 cache lines: 1024 ranks is 128 MiB, a sane ceiling. */
    if (comms == NULL || nranks < 1 || nranks > SUMO_THREADS_MAX_RANKS) return SUMO_ERR_INVALID_ARGUMENT;
    sumo__env env;
    SUMO__CHECK(sumo__env_for_create(&env));
    sumo__transport **tps = calloc((size_t)nranks, sizeof *tps);
    if (tps == NULL) return SUMO_ERR_SYSTEM;
    sumo_result r = sumo__threads_transport_create(nranks, &env, tps);
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

sumo_result sumo_comm_get_stats(const sumo_comm *comm, sumo_comm_stats *stats)
{
    if (comm == NULL || stats == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    sumo_comm *c = (sumo_comm *)comm; /* the counters are atomic; nothing else is touched */
    *stats = (sumo_comm_stats){
        .rounds = atomic_load_explicit(&c->rounds, memory_order_relaxed),
        .bytes = atomic_load_explicit(&c->bytes, memory_order_relaxed)};
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
    /* A two-level communicator's waits are its children's. */
    sumo__levels *lv = comm->levels;
    sumo_result r = SUMO_SUCCESS;
    if (lv) {
        r = sumo_comm_set_timeout(lv->node, seconds);
        for (int i = 0; i < lv->nacross && r == SUMO_SUCCESS; i++)
            r = sumo_comm_set_timeout(lv->across[i], seconds);
        if (lv->any && r == SUMO_SUCCESS) r = sumo_comm_set_timeout(lv->any, seconds);
    }
    pthread_mutex_unlock(&comm->exec);
    return r;
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
    if (param == SUMO_PARAM_RESTORE_ON_FAILURE) {
        if (value != 0 && value != 1)
            return SUMO__COMM_FAIL(comm, SUMO_ERR_INVALID_ARGUMENT, "sumo_comm_set_param: restore on failure is 0 or 1, not %d", value);
        if (value && (comm->tp->ops->busy == NULL || comm->tp->ops->settle == NULL))
            return SUMO__COMM_FAIL(comm, SUMO_ERR_INVALID_USAGE, "sumo_comm_set_param: the %s transport cannot restore a failed collective's output", comm->tp->ops->name);
        pthread_mutex_lock(&comm->exec);
        comm->restore = value != 0;
        pthread_mutex_unlock(&comm->exec);
        return SUMO_SUCCESS;
    }
    if (param != SUMO_PARAM_ALGORITHM)
        return SUMO__COMM_FAIL(comm, SUMO_ERR_INVALID_ARGUMENT, "sumo_comm_set_param: unknown parameter %d", (int)param);
    if (value < 0 || value >= SUMO_ALGORITHM_COUNT)
        return SUMO__COMM_FAIL(comm, SUMO_ERR_INVALID_ARGUMENT, "sumo_comm_set_param: unknown algorithm %d", value);
    if ((value == SUMO_ALGORITHM_CHAIN || value == SUMO_ALGORITHM_TWO_LEVEL) && comm->levels == NULL)
        return SUMO__COMM_FAIL(comm, SUMO_ERR_INVALID_USAGE, "sumo_comm_set_param: algorithm %d runs on a two-level communicator only (sumo_comm_create_hier)", value);
    if (value != SUMO_ALGORITHM_AUTO && value != SUMO_ALGORITHM_CHAIN && value != SUMO_ALGORITHM_TWO_LEVEL && comm->levels != NULL)
        return SUMO__COMM_FAIL(comm, SUMO_ERR_INVALID_USAGE, "sumo_comm_set_param: a two-level communicator runs SUMO_ALGORITHM_AUTO, CHAIN or TWO_LEVEL, not %d (set the others on its levels before sumo_comm_create_hier)", value);
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
    if (comm == NULL || value == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    if (param == SUMO_PARAM_RESTORE_ON_FAILURE) {
        *value = comm->restore;
        return SUMO_SUCCESS;
    }
    if (param != SUMO_PARAM_ALGORITHM) return SUMO_ERR_INVALID_ARGUMENT;
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

sumo_result sumo__comm_data_scratch(sumo_comm *comm, const sumo__exec *x, size_t bytes, void **out)
{
    sumo__data_scratch *d = NULL;
    for (int i = 0; i <= SUMO__MAX_KERNEL_TABLES && d == NULL; i++)
        if (comm->data_scratch[i].k == x->k || comm->data_scratch[i].k == NULL)
            d = &comm->data_scratch[i];
    if (d == NULL) return SUMO__COMM_FAIL(comm, SUMO_ERR_INTERNAL, "data scratch: no slot");
    if (bytes > d->bytes || d->p == NULL) {
        if (bytes > SIZE_MAX - 4095)
            return SUMO__COMM_FAIL(comm, SUMO_ERR_SYSTEM, "data scratch of %zu bytes", bytes);
        size_t rounded = (SUMO__MAX(bytes, (size_t)1) + 4095) / 4096 * 4096;
        void *p = NULL;
        /* The old block goes first: the peak is one block, not two. */
        if (d->p) x->k->release(x->k->ctx, d->p);
        d->p = NULL;
        d->bytes = 0;
        sumo_result r = x->k->alloc(x->k->ctx, rounded, &p);
        if (r != SUMO_SUCCESS || p == NULL)
            return SUMO__COMM_FAIL(comm, r == SUMO_SUCCESS ? SUMO_ERR_SYSTEM : r,
                                   "cannot allocate %zu bytes of %s scratch", rounded,
                                   x->k->memory);
        d->k = x->k;
        d->p = p;
        d->bytes = rounded;
    }
    *out = d->p;
    return SUMO_SUCCESS;
}

const sumo_kernel_table *sumo__kernels_for(const sumo_comm *comm, const void *ptr, size_t bytes)
{
    if (ptr != NULL)
        for (int i = 0; i < comm->ntables; i++)
            if (comm->tables[i]->claims(comm->tables[i]->ctx, ptr, bytes)) return comm->tables[i];
    return sumo__host_kernels();
}

sumo_result sumo_comm_add_kernels(sumo_comm *comm, const sumo_kernel_table *table)
{
    if (comm == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    char why[256];
    if (table == NULL)
        return SUMO__COMM_FAIL(comm, SUMO_ERR_INVALID_ARGUMENT, "sumo_comm_add_kernels: NULL table");
    if (table->struct_size != SUMO__KERNEL_TABLE_SIZE_NO_SHARE &&
        SUMO__STRUCT_SIZE_PROBLEM(table, sumo_kernel_table, why, sizeof why))
        return SUMO__COMM_FAIL(comm, SUMO_ERR_INVALID_ARGUMENT, "sumo_comm_add_kernels: %s", why);
    const char *missing = sumo__kernel_table_missing(table);
    if (missing)
        return SUMO__COMM_FAIL(comm, SUMO_ERR_INVALID_ARGUMENT,
                               "sumo_comm_add_kernels: the %s table has no %s", 
                               table->memory ? table->memory : "unnamed", missing);
    pthread_mutex_lock(&comm->exec);
    sumo_result r = SUMO_SUCCESS;
    if (comm->ntables == SUMO__MAX_KERNEL_TABLES)
        r = SUMO__COMM_FAIL(comm, SUMO_ERR_INVALID_USAGE,
                            "sumo_comm_add_kernels: at most %d tables", SUMO__MAX_KERNEL_TABLES);
    else
        comm->tables[comm->ntables++] = table;
    /* A two-level communicator's levels move the data: they need the table too. */
    sumo__levels *lv = comm->levels;
    if (lv && r == SUMO_SUCCESS) {
        r = sumo_comm_add_kernels(lv->node, table);
        for (int i = 0; i < lv->nacross && r == SUMO_SUCCESS; i++)
            r = sumo_comm_add_kernels(lv->across[i], table);
        if (lv->any && r == SUMO_SUCCESS) r = sumo_comm_add_kernels(lv->any, table);
        if (r != SUMO_SUCCESS)
            r = SUMO__COMM_FAIL(comm, r, "sumo_comm_add_kernels: a level refused the %s table",
                                table->memory);
    }
    pthread_mutex_unlock(&comm->exec);
    return r;
}

sumo_result sumo__kernel_failed(sumo_comm *comm, sumo_result code, const char *what)
{
    /* Never a verdict the peers share: break the handle whatever the code says. */
    if (code == SUMO_ERR_INVALID_ARGUMENT || code == SUMO_ERR_MISMATCH ||
        code == SUMO_ERR_NONFINITE || code == SUMO_ERR_INVALID_USAGE)
        code = SUMO_ERR_INTERNAL;
    return SUMO__COMM_FAIL(comm, code, "the %s kernels failed in %s", comm->x.k->memory, what);
}

/* ---- ops ---------------------------------------------------------------------------------- */

static const sumo__op_entry predefined[SUMO_OP_PREDEFINED_COUNT] = {
    [SUMO_OP_SUM] = {.kind = SUMO__OP_SUM},
    [SUMO_OP_AVERAGE] = {.kind = SUMO__OP_AVERAGE},
    [SUMO_OP_ADASUM] = {.kind = SUMO__OP_ADASUM},
};

const sumo__op_entry *sumo__op_find(const sumo_comm *comm, sumo_op op)
{
    if (op < SUMO_OP_PREDEFINED_COUNT) return &predefined[op];
    size_t i = op - SUMO_OP_PREDEFINED_COUNT;
    return i < comm->nops ? comm->ops[i] : NULL;
}

sumo_result sumo__op_register(sumo_comm *comm, sumo__op_kind kind, void *impl,
                              void (*release)(void *impl), sumo_op *op)
{
    /* The op table is read inside collectives. */
    pthread_mutex_lock(&comm->exec);
    sumo_result r = SUMO_SUCCESS;
    sumo__op_entry *e = NULL;
    if (comm->nops >= (size_t)UINT32_MAX - SUMO_OP_PREDEFINED_COUNT) {
        r = SUMO__COMM_FAIL(comm, SUMO_ERR_INVALID_USAGE, "op create: out of op ids");
        goto out;
    }
    if (comm->nops == comm->ops_cap) {
        size_t cap = comm->ops_cap ? 2 * comm->ops_cap : 8;
        sumo__op_entry **ops = realloc(comm->ops, cap * sizeof *ops);
        if (ops == NULL) goto oom;
        comm->ops = ops;
        comm->ops_cap = cap;
    }
    e = malloc(sizeof *e);
    if (e == NULL) goto oom;
    *e = (sumo__op_entry){.kind = kind, .impl = impl, .release = release};
    comm->ops[comm->nops] = e;
    *op = (sumo_op)(SUMO_OP_PREDEFINED_COUNT + comm->nops);
    comm->nops++;
    goto out;
oom:
    r = SUMO__COMM_FAIL(comm, SUMO_ERR_SYSTEM, "op create: out of memory");
out:
    pthread_mutex_unlock(&comm->exec);
    if (r != SUMO_SUCCESS && release) release(impl);
    return r;
}

sumo_result sumo__op_remove(sumo_comm *comm, sumo_op op)
{
    if (op < SUMO_OP_PREDEFINED_COUNT || sumo__op_find(comm, op) == NULL)
        return SUMO__COMM_FAIL(comm, SUMO_ERR_INVALID_ARGUMENT,
                               "sumo_op_destroy: op %u was not created on this communicator (or "
                               "was destroyed already)",
                               op);
    sumo__op_entry *e = comm->ops[op - SUMO_OP_PREDEFINED_COUNT];
    comm->ops[op - SUMO_OP_PREDEFINED_COUNT] = NULL;
    if (e->release) e->release(e->impl);
    free(e);
    return SUMO_SUCCESS;
}

/* ---- holding the handle ------------------------------------------------------------------- */

void sumo__comm_enter(sumo_comm *comm)
{
    sumo__queue *q = comm->queue;
    pthread_mutex_lock(&q->lock);
    /* Collectives on a handle run in the order they were issued. */
    while (q->pending > 0) pthread_cond_wait(&q->idle, &q->lock);
    /* Taken before the queue lock is dropped: a request started after this call was issued
     * runs after it. Nothing holds exec while waiting for lock, so this cannot deadlock. */
    pthread_mutex_lock(&comm->exec);
    pthread_mutex_unlock(&q->lock);
}

void sumo__comm_leave(sumo_comm *comm) { pthread_mutex_unlock(&comm->exec); }
