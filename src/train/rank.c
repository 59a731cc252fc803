#include "train/rank.h"
#include "common/common.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

sumo_result sumo__rank_fail(sumo__rank_state *s, sumo_result r, const char *what)
{
    const char *detail = "";
    sumo_comm_error_message(s->comm, &detail);
    if (s->err && s->errlen && s->err[0] == '\0')
        snprintf(s->err, s->errlen, "rank %d: %s: %s%s%s", s->rank, what, sumo_strerror(r),
                 detail[0] ? ": " : "", detail);
    return r;
}

/* The parts that hold the communicator: the aggregator and the distributed optimizer. */
static sumo_result build_exchange(sumo__rank_state *s)
{
    const sumo__train_config *c = s->cfg;
    const size_t *layout;
    size_t ntensors;
    sumo__model_layout(s->model, &layout, &ntensors);
    sumo_aggregator_options aopt = s->aopt;
    sumo_distributed_options dopt = s->dopt;
    sumo_result r;
    if (s->needs_agg) {
        aopt.tensor_counts = layout;
        aopt.ntensors = ntensors;
        aopt.adasum_hierarchical = c->adasum_hierarchical;
        aopt.adasum_group_size = c->adasum_group_size;
        r = sumo_aggregator_create(s->comm, &aopt, &s->agg);
        if (r != SUMO_SUCCESS) return sumo__rank_fail(s, r, "aggregator");
    }
    int *strided = NULL;
    if (c->diloco_strided) {
        strided = malloc(ntensors * sizeof *strided);
        if (strided == NULL) return SUMO_ERR_SYSTEM;
        for (size_t t = 0; t < ntensors; t++) strided[t] = (int)(t % (size_t)SUMO__MAX(c->outer.fragments, 1));
        dopt.outer.fragment_of = strided;
    }
    r = sumo_distributed_create(s->comm, s->opt, s->agg, s->nparams, &dopt, &s->dist);
    free(strided);
    if (r != SUMO_SUCCESS)
        return sumo__rank_fail(s, r, sumo__method_is_diloco(c->method)
                                         ? "DiLoCo outer loop (check --sync-every/--fragments/--delay)"
                                         : "distributed optimizer (check --tau/--inner-period)");
    return SUMO_SUCCESS;
}

sumo_result sumo__rank_build(sumo__rank_state *s)
{
    const sumo__train_config *c = s->cfg;
    sumo_result r = sumo__model_create(c->model, c->hidden, (size_t)c->batch, c->seed, &s->model);
    if (r != SUMO_SUCCESS) return sumo__rank_fail(s, r, "model");
    s->nparams = sumo__model_num_params(s->model);
    const size_t *layout;
    size_t ntensors;
    sumo__model_layout(s->model, &layout, &ntensors);
    r = sumo_optimizer_create(&c->optim, layout, ntensors, &s->opt);
    if (r != SUMO_SUCCESS) return sumo__rank_fail(s, r, "optimizer options");

    sumo_distributed_options dopt = {.struct_size = sizeof dopt, .mode = SUMO_UPDATE_GRADIENT,
                                     .outer = c->outer, .buffers = c->buffers};
    sumo_aggregator_options aopt = {0};
    bool needs_agg = true;
    switch (c->method) {
    case SUMO__METHOD_SUM: sumo_aggregator_options_default(SUMO_AGGREGATE_SUM, &aopt); break;
    case SUMO__METHOD_AVG: sumo_aggregator_options_default(SUMO_AGGREGATE_AVERAGE, &aopt); break;
    case SUMO__METHOD_ADASUM_DELTA: dopt.mode = SUMO_UPDATE_DELTA; /* fall through */
    case SUMO__METHOD_ADASUM: sumo_aggregator_options_default(SUMO_AGGREGATE_ADASUM, &aopt); break;
    case SUMO__METHOD_ACGA:
        sumo_aggregator_options_default(SUMO_AGGREGATE_ACGA, &aopt);
        aopt.acga = c->acga;
        break;
    default:
        dopt.mode = SUMO_UPDATE_OUTER;
        needs_agg = false;
        break;
    }
    s->needs_agg = needs_agg;
    s->aopt = aopt;
    s->dopt = dopt;
    size_t usable = c->train_limit && c->train_limit < s->train->n ? c->train_limit : s->train->n;
    s->usable = usable;
    s->steps_per_epoch = (long)(usable / ((size_t)s->size * (size_t)c->batch));
    if (s->steps_per_epoch < 1) {
        snprintf(s->err, s->errlen, "%zu training items (--train-limit) cannot fill one step of %d workers "
                 "(--workers) x %d (--batch)", usable, s->size, c->batch);
        return SUMO_ERR_INVALID_ARGUMENT;
    }
    s->total_steps = s->steps_per_epoch * c->epochs;
    sumo_lr_schedule_default(c->lr, &s->sched);
    s->sched.kind = c->schedule;
    s->sched.scale = c->lr_scale;
    s->sched.warmup_steps = (uint64_t)llround(c->warmup_epochs * (double)s->steps_per_epoch);
    s->sched.warmup_start_factor = 1.0;
    if (c->schedule == SUMO_LR_STEP) {
        s->sched.gamma = 0.1;
        s->sched.step_size = (uint64_t)SUMO__MAX(s->total_steps / 2, 1);
        if (s->sched.step_size < s->sched.warmup_steps) s->sched.step_size = s->sched.warmup_steps;
    } else if (c->schedule == SUMO_LR_COSINE) {
        s->sched.total_steps = (uint64_t)s->total_steps;
    }
    const char *why = "";
    if (sumo_lr_schedule_check(&s->sched, &why) != SUMO_SUCCESS) {
        snprintf(s->err, s->errlen, "learning-rate schedule: %s", why);
        return SUMO_ERR_INVALID_ARGUMENT;
    }
    s->pixels = (size_t)s->train->rows * (size_t)s->train->cols;
    s->xbatch = malloc((size_t)c->batch * s->pixels * sizeof *s->xbatch);
    s->ybatch = malloc((size_t)c->batch);
    s->perm = malloc(s->train->n * sizeof *s->perm);
    s->eval_params = malloc(s->nparams * sizeof *s->eval_params);
    if (!s->xbatch || !s->ybatch || !s->perm || !s->eval_params) return SUMO_ERR_SYSTEM;
    s->perm_epoch = -1;
    /* Last: the exchange is the only part that meets the other ranks (an elastic run that
     * loses one here makes it again, on the survivors). */
    return build_exchange(s);
}

sumo_result sumo__rank_move_to(sumo__rank_state *s, sumo_comm **comm, sumo_comm *fresh)
{
    sumo_distributed_destroy(s->dist);
    sumo_aggregator_destroy(s->agg);
    s->dist = NULL;
    s->agg = NULL;
    sumo_comm_destroy(*comm);
    *comm = s->comm = fresh;
    sumo_comm_rank(fresh, &s->rank);
    sumo_comm_size(fresh, &s->size);
    return build_exchange(s);
}

void sumo__rank_drop_exchange(sumo__rank_state *s)
{
    sumo_distributed_destroy(s->dist);
    sumo_aggregator_destroy(s->agg);
    s->dist = NULL;
    s->agg = NULL;
}

sumo_result sumo__rank_build_on(sumo__rank_state *s, sumo_comm *comm)
{
    s->comm = comm;
    sumo_comm_rank(comm, &s->rank);
    sumo_comm_size(comm, &s->size);
    return build_exchange(s);
}

void sumo__rank_share_buffers(sumo__rank_state *s)
{
    const char *transport = "";
    sumo_comm_transport(s->comm, &transport);
    if (strcmp(transport, "mpi") != 0 || s->size < 2) return;
    size_t bytes = s->nparams * sizeof(float);
    void *params = NULL, *grads = NULL;
    if (sumo_mem_alloc(s->comm, bytes, &params) != SUMO_SUCCESS) return;
    if (sumo_mem_alloc(s->comm, bytes, &grads) != SUMO_SUCCESS) {
        sumo_mem_free(s->comm, params);
        return;
    }
    sumo__model_adopt_buffers(s->model, params, grads);
    s->shared_params = params;
    s->shared_grads = grads;
}

int sumo__rank_synchronized(const sumo__rank_state *s)
{
    int synced = 1;
    sumo_distributed_synchronized(s->dist, &synced);
    return synced;
}

sumo_comm_stats sumo__rank_stats(const sumo__rank_state *s)
{
    sumo_comm_stats st = {0};
    sumo_distributed_stats(s->dist, &st);
    return st;
}

sumo_comm_stats sumo__rank_stats_so_far(const sumo__rank_state *s)
{
    sumo_comm_stats st = sumo__rank_stats(s);
    st.bytes += s->comm_before.bytes;
    st.rounds += s->comm_before.rounds;
    return st;
}

void sumo__rank_teardown(sumo__rank_state *s)
{
    sumo_distributed_destroy(s->dist);
    sumo_aggregator_destroy(s->agg);
    sumo_optimizer_destroy(s->opt);
    sumo__model_destroy(s->model);
    /* Freeing is collective: only where every rank surely ends together (the last step);
     * otherwise sumo_comm_destroy releases the memory. */
    if (s->shared_params && s->ended_together) {
        sumo_mem_free(s->comm, s->shared_grads);
        sumo_mem_free(s->comm, s->shared_params);
    }
    free(s->xbatch);
    free(s->ybatch);
    free(s->perm);
    free(s->eval_params);
    if (s->log) fclose(s->log);
    s->log = NULL;
}
