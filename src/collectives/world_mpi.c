/*
 * The MPI world for bindings that cannot hold an MPI_Comm (ctypes, other languages' FFIs):
 * initialise MPI if the caller has not, make a communicator over MPI_COMM_WORLD, find this
 * process's place on its node, and end the job either cleanly or by aborting it.
 */
#include "common/common.h"
#include "sumo_mpi.h"

#include <stdio.h>

sumo_result sumo_mpi_world_create(int *initialized_mpi, sumo_comm **out)
{
    if (out == NULL || initialized_mpi == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *initialized_mpi = 0;
    int initialized = 0, finalized = 0, provided = MPI_THREAD_SINGLE;
    MPI_Finalized(&finalized);
    if (finalized) return SUMO_ERR_INVALID_USAGE;
    MPI_Initialized(&initialized);
    if (!initialized) {
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
            return SUMO_ERR_SYSTEM;
        *initialized_mpi = 1;
    } else {
        MPI_Query_thread(&provided);
    }
    /* Asynchronous requests complete on sumo's progress thread while the caller's threads
     * go on: anything less than MPI_THREAD_MULTIPLE is unsafe for them. */
    if (provided < MPI_THREAD_MULTIPLE) {
        if (sumo__log_level_from_env() >= SUMO__LOG_WARN)
            fprintf(stderr, "sumo: MPI provides thread level %d, MPI_THREAD_MULTIPLE (%d) is needed\n",
                    provided, MPI_THREAD_MULTIPLE);
        return SUMO_ERR_INVALID_USAGE;
    }
    return sumo_comm_create_mpi(MPI_COMM_WORLD, out);
}

sumo_result sumo_mpi_world_local(int *local_rank, int *local_size)
{
    if (local_rank == NULL || local_size == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) return SUMO_ERR_INVALID_USAGE;
    MPI_Comm node = MPI_COMM_NULL;
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node) !=
        MPI_SUCCESS)
        return SUMO_ERR_SYSTEM;
    MPI_Comm_rank(node, local_rank);
    MPI_Comm_size(node, local_size);
    MPI_Comm_free(&node);
    return SUMO_SUCCESS;
}

sumo_result sumo_mpi_world_finalize(sumo_comm *comm, int finalize_mpi)
{
    sumo_result r = sumo_comm_destroy(comm);
    if (r != SUMO_SUCCESS) sumo_mpi_world_abort(1);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalize_mpi && !finalized && MPI_Finalize() != MPI_SUCCESS) r = SUMO_ERR_SYSTEM;
    return r;
}

sumo_result sumo_mpi_world_abort(int code)
{
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (!initialized || finalized) return SUMO_ERR_INVALID_USAGE;
    MPI_Abort(MPI_COMM_WORLD, code == 0 ? 1 : code);
    return SUMO_ERR_INTERNAL; /* MPI_Abort does not return */
}
