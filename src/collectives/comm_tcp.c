/* sumo_comm_create_tcp: a communicator over TCP connections met through a store (sumo_tcp.h). */
#include "collectives/comm.h"
#include "transport/transport_tcp.h"
#include "sumo_tcp.h"

#include <stdio.h>
#include <string.h>

/* Why the fields of o (of this library's size) do not make a communicator, or NULL. */
static const char *fields_problem(const sumo_tcp_options *o, char *why, size_t why_bytes)
{
    const sumo_store *s = o->store;
    const char *bad;
    if (s == NULL) return "options.store is NULL";
    if ((bad = SUMO__STRUCT_SIZE_PROBLEM(s, sumo_store, why, why_bytes)) != NULL) return bad;
    if (s->set == NULL || s->get == NULL) return "the store lacks set or get";
    if (o->key_prefix == NULL) return "options.key_prefix is NULL";
    if (o->size < 1 || o->size > SUMO_TCP_MAX_RANKS) return "options.size is not 1 .. SUMO_TCP_MAX_RANKS";
    if (o->rank < 0 || o->rank >= o->size) return "options.rank is not 0 .. size - 1";
    if (o->node_local_size < 0 || (o->node_local_size > 0 && o->size % o->node_local_size != 0))
        return "options.node_local_size must be 0 or divide size";
    if (o->address && strlen(o->address) >= 64) return "options.address is longer than 63 bytes";
    return NULL;
}

static sumo_result check_options(const sumo_tcp_options *o, char *err, size_t errlen)
{
    char why[256];
    const char *bad = SUMO__STRUCT_SIZE_PROBLEM(o, sumo_tcp_options, why, sizeof why);
    if (bad != NULL) {
        snprintf(err, errlen, "sumo_comm_create_tcp: %.200s", bad);
        return SUMO_ERR_INVALID_ARGUMENT;
    }
    bad = fields_problem(o, why, sizeof why);
    if (bad == NULL) return SUMO_SUCCESS;
    snprintf(err, errlen, "sumo_comm_create_tcp: %.200s (rank %d, size %d)", bad, o->rank, o->size);
    return SUMO_ERR_INVALID_ARGUMENT;
}

sumo_result sumo_tcp_options_default(sumo_tcp_options *options)
{
    if (options == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *options = (sumo_tcp_options){.struct_size = sizeof *options};
    return SUMO_SUCCESS;
}

sumo_result sumo_comm_create_tcp(const sumo_tcp_options *options, sumo_comm **out)
{
    if (out) *out = NULL;
    if (options == NULL || out == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    char err[256] = "";
    sumo__env env = {0};
    sumo_result r = sumo__env_read(&env, err, sizeof err);
    if (r == SUMO_SUCCESS) r = check_options(options, err, sizeof err);
    sumo__transport *tp = NULL;
    if (r == SUMO_SUCCESS) r = sumo__tcp_transport_create(options, &env, &tp, err, sizeof err);
    if (r == SUMO_SUCCESS) {
        r = sumo__comm_wrap(tp, out);
        if (r != SUMO_SUCCESS) snprintf(err, sizeof err, "out of memory creating the communicator");
    }
    if (r != SUMO_SUCCESS && (env.log_level >= SUMO__LOG_WARN || strncmp(err, "SUMO_", 5) == 0))
        fprintf(stderr, "sumo: %s\n", err);
    if (SUMO__STRUCT_SIZE_PROBLEM(options, sumo_tcp_options, NULL, 0) == NULL && options->error &&
        options->error_bytes > 0)
        snprintf(options->error, options->error_bytes, "%s", err);
    return r;
}
