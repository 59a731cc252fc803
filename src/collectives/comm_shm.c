#include "collectives/comm.h"
#include "common/settings.h"
#include "transport/transport_shm.h"
#include "sumo_shm.h"

#include <stdio.h>
#include <string.h>

/* Why the fields of o (of this library's size) do not make a communicator, or NULL; why holds
 * a sentence about the store's size. */
static const char *fields_problem(const void *options, char *why, size_t why_bytes)
{
    const sumo_shm_options *o = options;
    const char *bad = sumo__store_fields_problem(o->store, o->key_prefix, o->rank, o->size,
                                                 SUMO_SHM_MAX_RANKS, "SUMO_SHM_MAX_RANKS", why, why_bytes);
    if (bad != NULL) return bad;
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

sumo_result sumo_shm_options_default(sumo_shm_options *options)
{
    if (options == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *options = (sumo_shm_options){.struct_size = sizeof *options};
    return SUMO_SUCCESS;
}

static sumo_result make(const void *options, const sumo__env *env, sumo__transport **tp,
                        char *err, size_t errlen)
{
    return sumo__shm_transport_create(options, env, tp, err, errlen);
}

static const sumo__store_constructor constructor = {
    .name = "sumo_comm_create_shm", .fields = fields_problem, .make = make};

sumo_result sumo_comm_create_shm(const sumo_shm_options *options, sumo_comm **out)
{
    if (out) *out = NULL;
    if (options == NULL || out == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    char why[256];
    /* Of another size, no field past struct_size is read: rank, size and error included. */
    const char *bad = SUMO__STRUCT_SIZE_PROBLEM(options, sumo_shm_options, why, sizeof why);
    return sumo__comm_create_met(&constructor, options, bad, bad ? -1 : options->rank,
                                 bad ? -1 : options->size, bad ? NULL : options->error,
                                 bad ? 0 : options->error_bytes, out);
}
