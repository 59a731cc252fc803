#include "collectives/comm.h"
#include "common/settings.h"
#include "transport/transport_shm.h"
#include "sumo_shm.h"

#include <stdio.h>
#include <string.h>

/* Why the fields of o (of this library's size) do not make a communicator, or NULL; why holds
 * a sentence about the store's size. */
static const char *fields_problem(const sumo_shm_options *o, char *why, size_t why_bytes)
{
    const sumo_store *s = o->store;
    const char *bad;
    if (s == NULL) return "options.store is NULL";
    if ((bad = SUMO__STRUCT_SIZE_PROBLEM(s, sumo_store, why, why_bytes)) != NULL) return bad;
    if (s->set == NULL || s->get == NULL) return "the store lacks set or get";
    if (o->key_prefix == NULL) return "options.key_prefix is NULL";
    if (o->size < 1 || o->size > SUMO_SHM_MAX_RANKS) return "options.size is not 1 .. SUMO_SHM_MAX_RANKS";
    if (o->rank < 0 || o->rank >= o->size) return "options.rank is not 0 .. size - 1";
    /* The option takes what SUMO_SHM_STAGE_BYTES takes, exactly (the variable is rounded
     * down). */
    const sumo__setting *st = sumo__setting_info(SUMO__SETTING_SHM_STAGE_BYTES);
    if (o->stage_bytes != 0 && ((double)o->stage_bytes < st->min || (double)o->stage_bytes > st->max ||
                                o->stage_bytes % (size_t)st->step != 0)) {
        snprintf(why, why_bytes, "options.stage_bytes is not 0 or a multiple of %lld in %.0f .. %.0f",
                 (long long)st->step, st->min, st->max);
        return why;
    }
    return NULL;
}

/* Refuses options this rank cannot use, with why in err. */
static sumo_result check_options(const sumo_shm_options *o, char *err, size_t errlen)
{
    char why[256];
    /* Of another size, no field past struct_size is read, rank and size included. */
    const char *bad = SUMO__STRUCT_SIZE_PROBLEM(o, sumo_shm_options, why, sizeof why);
    if (bad != NULL) {
        snprintf(err, errlen, "sumo_comm_create_shm: %.200s", bad);
        return SUMO_ERR_INVALID_ARGUMENT;
    }
    bad = fields_problem(o, why, sizeof why);
    if (bad == NULL) return SUMO_SUCCESS;
    snprintf(err, errlen, "sumo_comm_create_shm: %.200s (rank %d, size %d)", bad, o->rank, o->size);
    return SUMO_ERR_INVALID_ARGUMENT;
}

sumo_result sumo_shm_options_default(sumo_shm_options *options)
{
    if (options == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *options = (sumo_shm_options){.struct_size = sizeof *options};
    return SUMO_SUCCESS;
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
    if (SUMO__STRUCT_SIZE_PROBLEM(options, sumo_shm_options, NULL, 0) == NULL && options->error &&
        options->error_bytes > 0)
        snprintf(options->error, options->error_bytes, "%s", err);
    return r;
}
