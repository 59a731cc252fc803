/*
 * The MPI transport's settings (docs/settings.md): every rank reads SUMO_MPI_SHM and
 * SUMO_SHM_STAGE_BYTES, a malformed value on one rank fails the creation on every rank at once
 * (SUMO_ERR_INVALID_ARGUMENT) and leaves MPI usable, and the shared window is mapped only where
 * every rank leaves SUMO_MPI_SHM at 1. Any number of ranks.
 */
#include "sumo_mpi.h"

#include "check.h"

#include <stdlib.h>
#include <string.h>

/* Sets name=value on rank `on` alone (-1: every rank), creates, and unsets it again. */
static sumo_result create_with(const char *name, const char *value, int on, sumo_comm **comm)
{
    if (on < 0 || on == g_rank) setenv(name, value, 1);
    *comm = NULL;
    sumo_result r = sumo_comm_create_mpi(MPI_COMM_WORLD, comm);
    unsetenv(name);
    return r;
}

/* Whether the shared window is mapped shows in whether the shared-memory algorithm can be
 * chosen (test_collectives_mpi does the same). */
static bool has_window(sumo_comm *comm)
{
    return sumo_comm_set_param(comm, SUMO_PARAM_ALGORITHM, SUMO_ALGORITHM_SHARED_MEMORY) ==
           SUMO_SUCCESS;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    const struct {
        const char *name, *value;
        int on;
    } refused[] = {
        {"SUMO_MPI_SHM", "yes", g_size - 1},
        {"SUMO_MPI_SHM", "2", -1},
        {"SUMO_SHM_STAGE_BYTES", "lots", 0},
        {"SUMO_SHM_STAGE_BYTES", "4096", g_size - 1},
    };
    char what[160];
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        sumo_comm *comm;
        sumo_result r = create_with(refused[i].name, refused[i].value, refused[i].on, &comm);
        snprintf(what, sizeof what, "%s=%s on rank %d refused on every rank (%s)", refused[i].name,
                 refused[i].value, refused[i].on, sumo_result_name(r));
        check(r == SUMO_ERR_INVALID_ARGUMENT && comm == NULL, what);
        sumo_comm_destroy(comm);
    }

    /* Still usable after the refusals. */
    sumo_comm *comm = NULL;
    sumo_result r = create_with("SUMO_SHM_STAGE_BYTES", "20000", -1, &comm);
    check(r == SUMO_SUCCESS, "SUMO_SHM_STAGE_BYTES=20000 accepted");
    if (comm) {
        float x[3] = {1.0f, 2.0f, (float)g_rank};
        r = sumo_allreduce(x, x, 3, SUMO_FLOAT32, SUMO_OP_SUM, comm);
        float want = (float)(g_size * (g_size - 1) / 2);
        check(r == SUMO_SUCCESS && x[0] == (float)g_size && x[1] == 2.0f * (float)g_size &&
                  x[2] == want,
              "allreduce after the refusals");
        check(g_size == 1 || has_window(comm), "one node maps the shared window by default");
        sumo_comm_destroy(comm);
    }

    /* One rank's 0 keeps every rank to messages. */
    r = create_with("SUMO_MPI_SHM", "0", g_size - 1, &comm);
    check(r == SUMO_SUCCESS, "SUMO_MPI_SHM=0 on one rank accepted");
    if (comm) {
        check(!has_window(comm), "SUMO_MPI_SHM=0 on one rank: no shared window on any rank");
        sumo_comm_destroy(comm);
    }

    if (g_rank == 0)
        printf("test_settings_mpi (%d ranks): %d passed, %d failed\n", g_size, g_passed, g_failed);
    MPI_Finalize();
    return g_failed ? 1 : 0;
}
