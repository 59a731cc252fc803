/*
 * The two-level communicator (sumo.h, sumo_comm_create_hier).
 */
#include "collectives/comm.h"

sumo_result sumo_hier_options_default(sumo_hier_options *options)
{
    if (options == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *options = (sumo_hier_options){.struct_size = sizeof *options};
    return SUMO_SUCCESS;
}

sumo_result sumo_comm_create_hier(sumo_comm *node, sumo_comm *across,
                                  const sumo_hier_options *options, sumo_comm **out)
{
    (void)options;
    if (out) *out = NULL;
    if (node == NULL || across == NULL || out == NULL || node == across)
        return SUMO_ERR_INVALID_ARGUMENT;
    return SUMO_ERR_INVALID_USAGE;
}

sumo_result sumo_comm_hier_add_across(sumo_comm *comm, sumo_comm *across)
{
    if (comm == NULL || across == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    return SUMO_ERR_INVALID_USAGE;
}
