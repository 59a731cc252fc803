#include "collectives/comm.h"
#include "transport/transport_mpi.h"
#include "sumo_mpi.h"

#include <stdio.h>
#include <string.h>

sumo_result sumo_comm_create_mpi(MPI_Comm comm, sumo_comm **out)
{
    if (out == NULL || comm == MPI_COMM_NULL) return SUMO_ERR_INVALID_ARGUMENT;
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) return SUMO_ERR_INVALID_USAGE;
    sumo__env env;
    SUMO__CHECK(sumo__env_for_create(&env));
    sumo__transport *tp = NULL;
    char err[256] = "";
    sumo_result r = sumo__mpi_transport_create(comm, &env, &tp, err, sizeof err);
    if (r != SUMO_SUCCESS) {
        /* No handle exists to carry the message: this is the one place that prints, where
         * asked for, and always for a setting this rank refused (as every constructor does). */
        if (env.log_level >= SUMO__LOG_WARN || strncmp(err, "SUMO_", 5) == 0)
            fprintf(stderr, "sumo: %s\n", err);
        return r;
    }
    return sumo__comm_wrap(tp, out);
}
