#include "launch.h"

#include "sumo_bootstrap.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static bool is_mpi(sumo_launcher k)
{
    return k == SUMO_LAUNCHER_OPEN_MPI || k == SUMO_LAUNCHER_PMI || k == SUMO_LAUNCHER_PMIX;
}

bool launch_under_mpi(void)
{
    sumo_bootstrap_options o;
    sumo_bootstrap_options_default(&o);
    sumo_bootstrap b;
    /* The launcher is read before any of its values is checked: a malformed one is left to
     * MPI_Init, which reads its own. */
    sumo_bootstrap_detect(&o, &b);
    return is_mpi(b.launcher);
}

int launch_detect(const char *transport, launch *l, char *err, size_t errlen)
{
    memset(l, 0, sizeof *l);
    /* The launcher as the library reads it (include/sumo_bootstrap.h), the binding's too. */
    sumo_bootstrap_options o;
    sumo_bootstrap_options_default(&o);
    o.error = err;
    o.error_bytes = errlen;
    sumo_bootstrap b;
    sumo_result r = sumo_bootstrap_detect(&o, &b);
    bool mpi = is_mpi(b.launcher);
    l->launcher = b.slurm_step ? "srun" : "mpirun";
    /* A --transport asked for is taken as given: MPI_Init reads its own variables, and
     * threads need none. */
    if (transport ? strcmp(transport, "mpi") == 0 : mpi && r == SUMO_SUCCESS) {
        l->kind = LAUNCH_MPI;
        return 0;
    }
    if (transport && strcmp(transport, "threads") == 0) {
        l->kind = LAUNCH_THREADS;
        return 0;
    }
    if (r == SUMO_ERR_INVALID_USAGE && !transport) {
        size_t used = strlen(err);
        snprintf(err + used, errlen - used, " (or give --transport threads to train with threads in this one "
                                            "process)");
        return 2;
    }
    if (transport && b.launcher != SUMO_LAUNCHER_SRUN) {
        snprintf(err, errlen, "--transport shm joins the tasks of an srun step of more than one "
                              "task, and this process is not one (start it with srun -n N)");
        return 2;
    }
    if (r != SUMO_SUCCESS) return 2;
    if (b.launcher == SUMO_LAUNCHER_NONE) {
        l->kind = LAUNCH_THREADS;
        return 0;
    }
    if (b.launcher != SUMO_LAUNCHER_SRUN) {
        snprintf(err, errlen, "started by %s, whose processes `sumo train` does not join (it meets its peers "
                              "through srun or mpirun): start it with one of those, or give --transport threads "
                              "to train with threads in each process alone",
                 sumo_launcher_name(b.launcher));
        return 2;
    }
    if (b.size > SUMO_SHM_MAX_RANKS) {
        snprintf(err, errlen, "SLURM_NTASKS=%d: the tasks of a step meet over shared memory, which holds at most %d",
                 b.size, SUMO_SHM_MAX_RANKS);
        return 2;
    }
    if (b.nodes > 1) {
        snprintf(err, errlen,
                 "this srun step spans %d nodes, and its tasks meet through shared memory, which "
                 "only reaches one: across nodes run the tasks as MPI ranks, "
                 "srun --mpi=pmix (an Open MPI built with PMIx, as Debian's is)", b.nodes);
        return 2;
    }
    l->kind = LAUNCH_SRUN;
    l->rank = b.rank;
    l->size = b.size;
    /* Tasks of one step share the node's TMPDIR; the run id (the step's ids and srun's port,
     * a fresh one per srun) keeps two steps apart, and a step apart from a crashed one of the
     * same ids (ids start over when slurmctld's state is wiped). */
    const char *base = getenv("TMPDIR");
    int n = snprintf(l->store_dir, sizeof l->store_dir, "%s/sumo-%ld-%s", base && *base ? base : "/tmp",
                     (long)geteuid(), b.run_id);
    if (n < 0 || (size_t)n >= sizeof l->store_dir) {
        snprintf(err, errlen, "TMPDIR is too long for the meeting folder");
        return 2;
    }
    return 0;
}

int launch_join_srun(const launch *l, sumo_comm **comm, sumo_store **keep, char *err, size_t errlen)
{
    *comm = NULL;
    if (keep) *keep = NULL;
    sumo_store *store = NULL;
    sumo_result r = sumo_store_create_dir(l->store_dir, &store);
    if (r != SUMO_SUCCESS) {
        snprintf(err, errlen, "%s: cannot meet the other tasks there: %s%s", l->store_dir, sumo_strerror(r),
                 r == SUMO_ERR_INVALID_ARGUMENT ? " (it must be a folder of this user's, closed to others)" : "");
        return 1;
    }
    char why[256] = "";
    sumo_shm_options o;
    sumo_shm_options_default(&o);
    o.rank = l->rank;
    o.size = l->size;
    o.store = store;
    o.key_prefix = "sumo-train/";
    o.error = why;
    o.error_bytes = sizeof why;
    r = sumo_comm_create_shm(&o, comm);
    /* Once every task has mapped the memory nobody reads the store again. */
    if (r == SUMO_SUCCESS) r = sumo_barrier(*comm);
    if (r == SUMO_SUCCESS && keep) *keep = store;
    else sumo_store_destroy_dir(store, l->rank == 0);
    if (r != SUMO_SUCCESS) {
        snprintf(err, errlen, "task %d of %d cannot join the others over shared memory: %s", l->rank, l->size,
                 why[0] ? why : sumo_strerror(r));
        if (*comm) sumo_comm_destroy(*comm);
        *comm = NULL;
        return 1;
    }
    return 0;
}

int launch_join_store(const char *dir, int rank, int size, bool joiner, sumo_store **store,
                      sumo_elastic **membership, char *err, size_t errlen)
{
    *store = NULL;
    *membership = NULL;
    if (sumo_store_create_dir(dir, store) != SUMO_SUCCESS) {
        snprintf(err, errlen, "--store %s: not a folder this user alone can use (made 0700 when missing)", dir);
        return 1;
    }
    char why[512] = "";
    sumo_elastic_options o;
    sumo_elastic_options_default(&o);
    o.store = *store;
    o.key_prefix = "sumo-train/";
    o.rank = rank;
    o.size = size;
    o.error = why;
    o.error_bytes = sizeof why;
    sumo_result r = joiner ? sumo_elastic_join(&o, membership) : sumo_elastic_create(&o, membership);
    if (r != SUMO_SUCCESS) {
        snprintf(err, errlen, "--store %s: %s (%s)", dir, why[0] ? why : sumo_strerror(r), sumo_result_name(r));
        sumo_store_destroy_dir(*store, 0);
        *store = NULL;
        return 1;
    }
    return 0;
}
