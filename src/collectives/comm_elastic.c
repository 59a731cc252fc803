/*
 * sumo_comm_shrink (sumo_elastic.h): the communicator's side of a shrink. The transport agrees
 * and makes the new group (transport.h's shrink); here the old handle's settings move to the
 * new one and the verdict becomes the caller's numbering.
 */
#include "collectives/comm.h"
#include "sumo_elastic.h"

#include <stdio.h>
#include <string.h>

sumo_result sumo_shrink_options_default(sumo_shrink_options *options)
{
    if (options == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *options = (sumo_shrink_options){.struct_size = sizeof *options};
    return SUMO_SUCCESS;
}

/* Writes why into the caller's error buffer, when it has one of ours. */
static void tell(const sumo_shrink_options *o, const char *why)
{
    if (o && SUMO__STRUCT_SIZE_PROBLEM(o, sumo_shrink_options, NULL, 0) == NULL && o->error &&
        o->error_bytes > 0)
        snprintf(o->error, o->error_bytes, "%s", why);
}

sumo_result sumo_comm_shrink(sumo_comm *comm, const sumo_shrink_options *options,
                             sumo_comm **out, sumo_shrink_info *info)
{
    if (out) *out = NULL;
    char why[256] = "";
    if (comm == NULL || options == NULL || out == NULL || info == NULL) {
        tell(options, "sumo_comm_shrink: comm, options, out and info must not be NULL");
        return SUMO_ERR_INVALID_ARGUMENT;
    }
    const char *bad = SUMO__STRUCT_SIZE_PROBLEM(options, sumo_shrink_options, why, sizeof why);
    if (bad == NULL) bad = SUMO__STRUCT_SIZE_PROBLEM(info, sumo_shrink_info, why, sizeof why);
    if (bad != NULL) {
        char msg[300];
        snprintf(msg, sizeof msg, "sumo_comm_shrink: %s", bad);
        tell(options, msg);
        return SUMO_ERR_INVALID_ARGUMENT;
    }
    sumo__transport *tp = comm->tp;
    if (tp->ops->shrink == NULL) {
        snprintf(why, sizeof why,
                 "sumo_comm_shrink: the %s transport cannot shrink (it has no agreement that "
                 "survives a failure; MPI would need ULFM)", tp->ops->name);
        tell(options, why);
        return SUMO_ERR_INVALID_USAGE;
    }
    sumo__shrink_args args = {.value = options->value,
                              .store = options->store,
                              .key_prefix = options->key_prefix,
                              .err = why,
                              .errlen = sizeof why};
    sumo__transport *fresh = NULL;
    sumo__shrink_verdict v;
    sumo__comm_enter(comm);
    sumo_algorithm algo = comm->algo;
    sumo_result r = tp->ops->shrink(tp, &args, &fresh, &v);
    sumo__comm_leave(comm);
    if (r != SUMO_SUCCESS) {
        /* The transport's own failures are in the handle's status; the new group's making
         * (no handle yet) in why. */
        tell(options, why[0] ? why : comm->status.message);
        return r;
    }
    r = sumo__comm_wrap(fresh, out);
    if (r != SUMO_SUCCESS) {
        tell(options, "sumo_comm_shrink: out of memory wrapping the new group");
        return r;
    }
    (*out)->algo = algo;
    info->rank = v.rank;
    info->size = v.size;
    info->value = v.value;
    if (info->old_ranks) {
        int n = 0;
        for (int k = 0; k < tp->size; k++)
            if (sumo__shrink_member(&v, k)) info->old_ranks[n++] = k;
        for (; n < tp->size; n++) info->old_ranks[n] = -1;
    }
    return SUMO_SUCCESS;
}
