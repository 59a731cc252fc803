/* sumo_comm_create_transport: a communicator over the caller's transport (sumo_ext.h). */
#include "collectives/comm.h"
#include "transport/transport_ext.h"

#include <stdio.h>

sumo_result sumo_comm_create_transport(const sumo_transport_desc *desc, sumo_comm **out)
{
    if (out == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    sumo__env env;
    SUMO__CHECK(sumo__env_for_create(&env));
    sumo__transport *tp = NULL;
    const char *why = NULL;
    sumo_result r = sumo__ext_transport_create(desc, &env, &tp, &why);
    if (r != SUMO_SUCCESS) {
        /* No handle exists to carry the message. */
        if (why) fprintf(stderr, "sumo: sumo_comm_create_transport: %s\n", why);
        return r;
    }
    return sumo__comm_wrap(tp, out);
}
