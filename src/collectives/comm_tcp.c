/* sumo_comm_create_tcp: a communicator over TCP connections met through a store (sumo_tcp.h). */
#include "collectives/comm.h"
#include "transport/transport_tcp.h"
#include "sumo_tcp.h"

#include <stdio.h>
#include <string.h>

/* Why the fields of o (of this library's size) do not make a communicator, or NULL. */
static const char *fields_problem(const void *options, char *why, size_t why_bytes)
{
    const sumo_tcp_options *o = options;
    const char *bad = sumo__store_fields_problem(o->store, o->key_prefix, o->rank, o->size,
                                                 SUMO_TCP_MAX_RANKS, "SUMO_TCP_MAX_RANKS", why, why_bytes);
    if (bad != NULL) return bad;
    if (o->node_local_size < 0 || (o->node_local_size > 0 && o->size % o->node_local_size != 0))
        return "options.node_local_size must be 0 or divide size";
    if (o->address && strlen(o->address) >= 64) return "options.address is longer than 63 bytes";
    return NULL;
}

sumo_result sumo_tcp_options_default(sumo_tcp_options *options)
{
    if (options == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *options = (sumo_tcp_options){.struct_size = sizeof *options};
    return SUMO_SUCCESS;
}

static sumo_result make(const void *options, const sumo__env *env, sumo__transport **tp,
                        char *err, size_t errlen)
{
    return sumo__tcp_transport_create(options, env, tp, err, errlen);
}

static const sumo__store_constructor constructor = {
    .name = "sumo_comm_create_tcp", .fields = fields_problem, .make = make};

sumo_result sumo_comm_create_tcp(const sumo_tcp_options *options, sumo_comm **out)
{
    if (out) *out = NULL;
    if (options == NULL || out == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    char why[256];
    /* Of another size, no field past struct_size is read: rank, size and error included. */
    const char *bad = SUMO__STRUCT_SIZE_PROBLEM(options, sumo_tcp_options, why, sizeof why);
    return sumo__comm_create_met(&constructor, options, bad, bad ? -1 : options->rank,
                                 bad ? -1 : options->size, bad ? NULL : options->error,
                                 bad ? 0 : options->error_bytes, out);
}
