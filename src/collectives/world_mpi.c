/*
 * The MPI world for bindings that cannot hold an MPI_Comm (ctypes, other languages' FFIs):
 * initialise MPI if the caller has not, make a communicator over MPI_COMM_WORLD, find this
 * process's place on its node, and end the job either cleanly or by aborting it.
 */
#include "collectives/requests.h"
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
    sumo_result r = SUMO_SUCCESS;
    if (provided < MPI_THREAD_MULTIPLE) {
        fprintf(stderr, "sumo: MPI provides thread level %d, MPI_THREAD_MULTIPLE (%d) is needed\n",
                provided, MPI_THREAD_MULTIPLE);
        r = SUMO_ERR_INVALID_USAGE;
    } else {
        r = sumo_comm_create_mpi(MPI_COMM_WORLD, out);
    }
    /* What failed before the communicator existed leaves nothing initialised: MPI is
     * finalized again when this call started it, unless a peer may be missing (a timeout),
     * where MPI_Finalize could wait for it for ever. Every rank fails the same way for the
     * thread level and a malformed environment. */
    if (r != SUMO_SUCCESS && *initialized_mpi && r != SUMO_ERR_TIMEOUT) {
        MPI_Finalize();
        *initialized_mpi = 0;
    }
    return r;
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
    /* The process is ending: leave without meeting the peers (a peer still busy after its
     * last collective must not be taken for a dead one); MPI_Finalize releases what they
     * share once every rank is there. */
    sumo_result r = sumo__comm_leave_process(comm);
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
