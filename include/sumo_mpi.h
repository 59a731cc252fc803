/*
 * sumo over MPI: ranks are the processes of an MPI communicator, on one machine or many.
 * Build with mpicc and link libsumo_mpi before libsumo (-lsumo_mpi -lsumo, which pkg-config's
 * sumo-mpi gives, or libsumo_mpi.a libsumo.a).
 *
 * On one node the collectives run through an MPI-3 shared-memory window (cache-sized chunks
 * staged through it: each user buffer is read once and written once), or straight between
 * the processes' buffers when every rank's come from sumo_mem_alloc (a shared window per
 * allocation: no staging copies, the cost of threads in one process), or, when only the
 * receive buffers do, with those as the staging areas (an allreduce); across nodes over
 * point-to-point messages (ring and recursive doubling), or MPI_Allreduce itself for small
 * fp32/fp64 messages. Every wait is bounded by the communicator's deadline
 * (sumo_comm_set_timeout), so a process that dies or never arrives gives SUMO_ERR_TIMEOUT
 * instead of a hang. Set SUMO_MPI_SHM=0 to force the point-to-point path on one node (for
 * benchmarking the network path), and SUMO_SHM_STAGE_BYTES to size the staging area.
 *
 * After SUMO_ERR_TIMEOUT or SUMO_ERR_PEER_FAILURE the group is broken: a missing process may
 * be stopped rather than dead, and MPI_Finalize would then wait for it for ever. End the job
 * with MPI_Abort(comm, non-zero) instead of finalizing, as `sumo train` does.
 */
#ifndef SUMO_MPI_H
#define SUMO_MPI_H

#include "sumo.h"

#include <mpi.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Collective over comm (every process calls it). The communicator is duplicated, with errors
 * returned rather than fatal, so sumo's messages never mix with the caller's; the caller may
 * free comm afterwards. MPI must be initialised (MPI_THREAD_SERIALIZED or more if several
 * threads use sumo handles). Asynchronous requests (and overlapped gossip rounds) run on a
 * progress thread of sumo's only under MPI_THREAD_MULTIPLE; with less, MPI may not be called
 * from that thread while the caller's makes MPI calls, so a request runs to completion in the
 * call that starts it (same results, no overlap). Destroy the handle before MPI_Finalize.
 */
SUMO_API sumo_result sumo_comm_create_mpi(MPI_Comm comm, sumo_comm **out);

/*
 * For bindings that cannot pass an MPI_Comm (Python's ctypes): the same over MPI_COMM_WORLD,
 * initialising MPI first with MPI_THREAD_MULTIPLE when nobody has. SUMO_ERR_INVALID_USAGE when
 * MPI is already finalized or gives less than MPI_THREAD_MULTIPLE. *initialized_mpi says
 * whether this call initialised MPI (pass it to sumo_mpi_world_finalize). Collective.
 */
SUMO_API sumo_result sumo_mpi_world_create(int *initialized_mpi, sumo_comm **out);
/* This process's rank and the process count on its node (MPI_COMM_TYPE_SHARED). Collective. */
SUMO_API sumo_result sumo_mpi_world_local(int *local_rank, int *local_size);
/* Destroys comm (NULL is fine), then finalizes MPI when finalize_mpi (what
 * sumo_mpi_world_create said it initialised). Only after a clean run: once a peer has failed,
 * end with sumo_mpi_world_abort. When the destruction finds the peers gone (sumo_comm_destroy
 * fails), it aborts the job instead of finalizing, which would wait for them. */
SUMO_API sumo_result sumo_mpi_world_finalize(sumo_comm *comm, int finalize_mpi);
/* Ends every process of the job (MPI_Abort on MPI_COMM_WORLD) with code (1 if 0). */
SUMO_API sumo_result sumo_mpi_world_abort(int code);

#ifdef __cplusplus
}
#endif

#endif
