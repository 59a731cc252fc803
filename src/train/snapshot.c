#include "train/snapshot.h"
#include "train/checkpoint.h"
#include "common/common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t config_hash(const char *text)
{
    return sumo__fnv1a(SUMO__FNV_OFFSET, text, strlen(text));
}

typedef struct section {
    void *ptr;
    size_t bytes;
} section;

static void state_sections(sumo__rank_state *s, section sec[5])
{
    size_t opt_bytes, agg_bytes, dist_bytes;
    sumo_optimizer_state_size(s->opt, &opt_bytes);
    agg_bytes = 0;
    if (s->agg) sumo_aggregator_state_size(s->agg, &agg_bytes);
    sumo_distributed_state_size(s->dist, &dist_bytes);
    sec[0] = (section){sumo__model_params(s->model), s->nparams * sizeof(float)};
    sec[1] = (section){NULL, opt_bytes};
    sec[2] = (section){NULL, agg_bytes};
    sec[3] = (section){NULL, dist_bytes};
    sec[4] = (section){NULL, sizeof(sumo__train_counters)};
}

sumo_result sumo__rank_pack(sumo__rank_state *s, unsigned char **out, size_t *bytes)
{
    section sec[5];
    state_sections(s, sec);
    size_t total = 0;
    for (int i = 0; i < 5; i++) total += sec[i].bytes + sizeof(uint64_t);
    unsigned char *blob = malloc(total), *p = blob;
    if (blob == NULL) return SUMO_ERR_SYSTEM;
    sumo__train_counters tc = {.step = s->step, .loss_sum = s->loss_sum, .loss_count = s->loss_count,
                               .elapsed = s->elapsed_before + sumo__seconds_now() - s->t0,
                               .comm = sumo__rank_stats_so_far(s),
                               .peak_step_bytes = s->peak_step_bytes,
                               .best_accuracy = s->summary->best_accuracy,
                               .steps_to_target = s->summary->steps_to_target,
                               .epochs_to_target = s->summary->epochs_to_target};
    sumo_result r = SUMO_SUCCESS;
    for (int i = 0; i < 5 && r == SUMO_SUCCESS; i++) {
        uint64_t len = sec[i].bytes;
        memcpy(p, &len, sizeof len);
        p += sizeof len;
        switch (i) {
        case 0: memcpy(p, sec[0].ptr, len); break;
        case 1: r = sumo_optimizer_state_save(s->opt, p, len); break;
        case 2: if (s->agg) r = sumo_aggregator_state_save(s->agg, p, len); break;
        case 3: r = sumo_distributed_state_save(s->dist, p, len); break;
        default: memcpy(p, &tc, sizeof tc); break;
        }
        p += len;
    }
    if (r != SUMO_SUCCESS) {
        free(blob);
        return r;
    }
    *out = blob;
    *bytes = total;
    return SUMO_SUCCESS;
}

sumo_result sumo__rank_unpack(sumo__rank_state *s, const unsigned char *blob, size_t bytes,
                              sumo__train_counters *tc, bool resized)
{
    section sec[5];
    state_sections(s, sec);
    const unsigned char *p = blob, *end = p + bytes;
    sumo_result r = SUMO_SUCCESS;
    for (int i = 0; i < 5 && r == SUMO_SUCCESS; i++) {
        uint64_t len;
        if ((size_t)(end - p) < sizeof len) return SUMO_ERR_INVALID_ARGUMENT;
        memcpy(&len, p, sizeof len);
        p += sizeof len;
        if ((size_t)(end - p) < len) return SUMO_ERR_INVALID_ARGUMENT;
        if (len != sec[i].bytes) {
            if (!(resized && i == 2)) return SUMO_ERR_INVALID_ARGUMENT;
            p += len;
            continue;
        }
        switch (i) {
        case 0: memcpy(sec[0].ptr, p, len); break;
        case 1: r = sumo_optimizer_state_load(s->opt, p, len); break;
        case 2: if (s->agg) r = sumo_aggregator_state_load(s->agg, p, len); break;
        case 3: r = sumo_distributed_state_load(s->dist, p, len); break;
        default: memcpy(tc, p, sizeof *tc); break;
        }
        p += len;
    }
    return r == SUMO_SUCCESS && p != end ? SUMO_ERR_INVALID_ARGUMENT : r;
}

void sumo__rank_apply_counters(sumo__rank_state *s, const sumo__train_counters *tc)
{
    s->step = tc->step;
    s->loss_sum = tc->loss_sum;
    s->loss_count = tc->loss_count;
    s->elapsed_before = tc->elapsed;
    s->comm_before = tc->comm;
    s->peak_step_bytes = tc->peak_step_bytes;
    s->summary->best_accuracy = tc->best_accuracy;
    s->summary->steps_to_target = tc->steps_to_target;
    s->summary->epochs_to_target = tc->epochs_to_target;
}

sumo_result sumo__rank_save_checkpoint(sumo__rank_state *s)
{
    const sumo__train_config *c = s->cfg;
    unsigned char *blob = NULL;
    size_t total = 0;
    sumo_result r = sumo__rank_pack(s, &blob, &total);
    sumo__ckpt_id id = {.dir = c->checkpoint_dir, .step = s->step, .rank = s->rank, .size = s->size,
                        .config_hash = config_hash(s->config), .config_text = s->config};
    if (r == SUMO_SUCCESS) r = sumo__checkpoint_write_rank(&id, blob, total, s->err, s->errlen);
    free(blob);
    /* Every rank's file is in place before the manifest names the step. */
    sumo_result b = sumo_barrier(s->comm);
    if (r != SUMO_SUCCESS) return r;
    if (b != SUMO_SUCCESS) return sumo__rank_fail(s, b, "checkpoint barrier");
    if (s->rank == 0) r = sumo__checkpoint_write_manifest(&id, s->err, s->errlen);
    b = sumo_barrier(s->comm);
    if (r != SUMO_SUCCESS) return r;
    if (b != SUMO_SUCCESS) return sumo__rank_fail(s, b, "checkpoint barrier");
    /* The manifest names this step on every rank's disk now: older ones may go. */
    sumo__checkpoint_prune(c->checkpoint_dir, s->rank, s->step, c->keep > 0 ? c->keep : 1);
    return SUMO_SUCCESS;
}

sumo_result sumo__rank_load_checkpoint(sumo__rank_state *s)
{
    const sumo__train_config *c = s->cfg;
    sumo__ckpt_id id = {.dir = c->checkpoint_dir, .rank = s->rank, .size = s->size,
                        .config_hash = config_hash(s->config), .config_text = s->config};
    sumo_result r = sumo__checkpoint_read_manifest(&id, &id.step, s->err, s->errlen);
    if (r != SUMO_SUCCESS) return r;
    void *blob = NULL;
    size_t bytes = 0;
    r = sumo__checkpoint_read_rank(&id, &blob, &bytes, s->err, s->errlen);
    if (r != SUMO_SUCCESS) return r;
    sumo__train_counters tc;
    r = sumo__rank_unpack(s, blob, bytes, &tc, false);
    free(blob);
    if (r != SUMO_SUCCESS) {
        snprintf(s->err, s->errlen, "%s: step %ld, rank %d: state does not fit this model/optimizer",
                 c->checkpoint_dir, id.step, s->rank);
        return SUMO_ERR_INVALID_ARGUMENT;
    }
    sumo__rank_apply_counters(s, &tc);
    s->epoch = (int)(s->step / s->steps_per_epoch);
    s->pos = (size_t)(s->step % s->steps_per_epoch) * (size_t)s->size * (size_t)c->batch;
    return SUMO_SUCCESS;
}
