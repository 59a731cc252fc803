#include "launch.h"

#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The same test as the binding's (python/sumo/_slurm.py): a batch script or salloc's shell
 * has the job's variables but no step, and a step of one task has nobody to meet. */
static bool in_srun_step(void)
{
    if (!getenv("SLURM_STEP_ID") && !getenv("SLURM_STEP_NODELIST")) return false;
    const char *n = getenv("SLURM_NTASKS");
    return !n || !*n || strcmp(n, "1") != 0;
}

static int env_int(const char *name, long lo, long hi, long *v, char *err, size_t errlen)
{
    const char *s = getenv(name);
    if (!s || !*s) {
        snprintf(err, errlen, "started by srun, but %s is not set: cannot join the job step", name);
        return 2;
    }
    char *end;
    errno = 0;
    long x = strtol(s, &end, 10);
    if (errno || *end || x < lo || x > hi) {
        snprintf(err, errlen, "%s=%.40s is not a number from %ld to %ld", name, s, lo, hi);
        return 2;
    }
    *v = x;
    return 0;
}

int launch_detect(const char *transport, launch *l, char *err, size_t errlen)
{
    memset(l, 0, sizeof *l);
    bool under_mpi = getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
    if (transport ? strcmp(transport, "mpi") == 0 : under_mpi) {
        l->kind = LAUNCH_MPI;
        l->launcher = getenv("SLURM_STEP_ID") ? "srun" : "mpirun";
        return 0;
    }
    if (transport ? strcmp(transport, "threads") == 0 : !in_srun_step()) {
        l->kind = LAUNCH_THREADS;
        return 0;
    }
    /* transport "shm", or a plain srun step */
    if (!in_srun_step()) {
        snprintf(err, errlen, "--transport shm joins the tasks of an srun step of more than one "
                              "task, and this process is not one (start it with srun -n N)");
        return 2;
    }
    long rank, size, nodes, job, step;
    int rc = 0;
    if (!rc) rc = env_int("SLURM_PROCID", 0, INT_MAX, &rank, err, errlen);
    if (!rc) rc = env_int("SLURM_NTASKS", 1, SUMO_SHM_MAX_RANKS, &size, err, errlen);
    if (!rc) rc = env_int("SLURM_JOB_ID", 0, LONG_MAX, &job, err, errlen);
    if (!rc) rc = env_int("SLURM_STEP_ID", 0, LONG_MAX, &step, err, errlen);
    if (!rc) rc = env_int(getenv("SLURM_STEP_NUM_NODES") ? "SLURM_STEP_NUM_NODES" : "SLURM_NNODES", 1,
                          INT_MAX, &nodes, err, errlen);
    if (rc) return rc;
    if (rank >= size) {
        snprintf(err, errlen, "SLURM_PROCID=%ld is not a task of SLURM_NTASKS=%ld", rank, size);
        return 2;
    }
    if (nodes > 1) {
        snprintf(err, errlen,
                 "this srun step spans %ld nodes, and its tasks meet through shared memory, which "
                 "only reaches one: across nodes run the tasks as MPI ranks, "
                 "srun --mpi=pmix (an Open MPI built with PMIx, as Debian's is)", nodes);
        return 2;
    }
    l->kind = LAUNCH_SRUN;
    l->launcher = "srun";
    l->rank = (int)rank;
    l->size = (int)size;
    /* Tasks of one step share the node's TMPDIR; the step's ids keep two steps apart and
     * srun's port (a fresh one per srun) keeps a step apart from a crashed one of the same ids
     * (ids start over when slurmctld's state is wiped). */
    const char *base = getenv("TMPDIR"), *port = getenv("SLURM_SRUN_COMM_PORT");
    int n = snprintf(l->store_dir, sizeof l->store_dir, "%s/sumo-%ld-%ld.%ld-%s",
                     base && *base ? base : "/tmp", (long)geteuid(), job, step, port && *port ? port : "0");
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
