#include "collectives/comm.h"
#include "common/settings.h"
#include "transport/transport_shm.h"
#include "sumo_shm.h"

#include <stdio.h>
#include <string.h>

/* Refuses options this rank cannot use, with why in err. */
static sumo_result check_options(const sumo_shm_options *o, char *err, size_t errlen)
{
    if (o->struct_size != sizeof *o) {
        snprintf(err, errlen, "sumo_comm_create_shm: options.struct_size %zu is not one this "
                 "library knows (sizeof(sumo_shm_options) is %zu here)", o->struct_size, sizeof *o);
        return SUMO_ERR_INVALID_ARGUMENT;
    }
    const sumo_store *s = o->store;
    /* The option takes what SUMO_SHM_STAGE_BYTES takes, exactly (the variable is rounded down). */
    const sumo__setting *st = sumo__setting_info(SUMO__SETTING_SHM_STAGE_BYTES);
    char stage_bad[96];
    const char *bad = NULL;
    if (s == NULL) bad = "options.store is NULL";
    else if (s->struct_size != sizeof *s) bad = "options.store->struct_size is not sizeof(sumo_store)";
    else if (s->set == NULL || s->get == NULL) bad = "the store lacks set or get";
    else if (o->key_prefix == NULL) bad = "options.key_prefix is NULL";
    else if (o->size < 1 || o->size > SUMO_SHM_MAX_RANKS) bad = "options.size is not 1 .. SUMO_SHM_MAX_RANKS";
    else if (o->rank < 0 || o->rank >= o->size) bad = "options.rank is not 0 .. size - 1";
    else if (o->stage_bytes != 0 && ((double)o->stage_bytes < st->min ||
                                     (double)o->stage_bytes > st->max ||
                                     o->stage_bytes % (size_t)st->step != 0)) {
        snprintf(stage_bad, sizeof stage_bad, "options.stage_bytes is not 0 or a multiple of %lld "
                 "in %.0f .. %.0f", (long long)st->step, st->min, st->max);
        bad = stage_bad;
    }
    if (bad == NULL) return SUMO_SUCCESS;
    snprintf(err, errlen, "sumo_comm_create_shm: %s (rank %d, size %d)", bad, o->rank, o->size);
    return SUMO_ERR_INVALID_ARGUMENT;
}

sumo_result sumo_comm_create_shm(const sumo_shm_options *options, sumo_comm **out)
{
    if (out) *out = NULL;
    if (options == NULL || out == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    char err[256] = "";
    sumo__env env = {0};
    sumo_result r = sumo__env_read(&env, err, sizeof err);
    if (r == SUMO_SUCCESS) r = check_options(options, err, sizeof err);
    sumo__transport *tp = NULL;
    if (r == SUMO_SUCCESS) r = sumo__shm_transport_create(options, &env, &tp, err, sizeof err);
    if (r == SUMO_SUCCESS) {
        r = sumo__comm_wrap(tp, out);
        if (r != SUMO_SUCCESS) snprintf(err, sizeof err, "out of memory creating the communicator");
    }
    /* No handle carries the message: printed where asked for, and always for a malformed
     * environment (as every constructor does). */
    if (r != SUMO_SUCCESS && (env.log_level >= SUMO__LOG_WARN || strncmp(err, "SUMO_", 5) == 0))
        fprintf(stderr, "sumo: %s\n", err);
    /* error lies past the fields of an options struct of another size: only ours is written. */
    if (options->struct_size == sizeof *options && options->error && options->error_bytes > 0)
        snprintf(options->error, options->error_bytes, "%s", err);
    return r;
}
