/*
 * A bare allreduce loop for the fault suite (tests/faults/run.sh), run under mpirun: one rank
 * misbehaves part-way and every other rank must report it within the communicator's deadline,
 * then end the job the way sumo_mpi.h tells a library user to.
 *
 *   allreduce_fault none|stop|kill|exit
 *
 * none: 200 allreduces, "allreduce_fault: ok" from rank 0. stop / kill / exit: the last rank
 * stops itself (SIGSTOP), kills itself (SIGKILL) or leaves early (destroys its handle and
 * finalizes) after 20 allreduces; the others loop until their call fails, print the result
 * and call MPI_Abort.
 */
#include "sumo.h"
#include "sumo_mpi.h"

#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#define COUNT 4096
#define FAULT_AT 20

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const char *mode = argc > 1 ? argv[1] : "none";
    bool faulty = strcmp(mode, "none") != 0 && rank == size - 1;
    sumo_comm *comm;
    if (sumo_comm_create_mpi(MPI_COMM_WORLD, &comm) != SUMO_SUCCESS) {
        fprintf(stderr, "rank %d: cannot create the communicator\n", rank);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    static float buf[COUNT];
    long iters = strcmp(mode, "none") == 0 ? 200 : 1L << 40;
    for (long i = 0; i < iters; i++) {
        if (faulty && i == FAULT_AT) {
            if (strcmp(mode, "stop") == 0) raise(SIGSTOP);
            if (strcmp(mode, "kill") == 0) raise(SIGKILL);
            sumo_comm_destroy(comm);
            MPI_Finalize();
            return 0;
        }
        for (int k = 0; k < COUNT; k++) buf[k] = (float)(rank + k);
        sumo_result r = sumo_allreduce(buf, buf, COUNT, SUMO_FLOAT32, SUMO_OP_SUM, comm);
        if (r != SUMO_SUCCESS) {
            const char *detail = "";
            sumo_comm_error_message(comm, &detail);
            fprintf(stderr, "rank %d: allreduce %ld: %s: %s (%s)\n", rank, i, sumo_strerror(r), detail,
                    sumo_result_name(r));
            fflush(stderr);
            /* The group is broken: finalizing would wait for the missing rank. */
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }
    sumo_comm_destroy(comm);
    if (rank == 0) printf("allreduce_fault: ok\n");
    MPI_Finalize();
    return 0;
}
