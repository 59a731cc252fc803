/*
 * How a `sumo` command's process learns who its peers are: alone with worker threads, a rank of
 * mpirun (or of srun --mpi=pmix, where the MPI speaks PMIx), or a task of a plain srun step on
 * one node, which meets its peers through a store in a directory and then runs on shared
 * memory. srun's tasks that did not say so would otherwise each train alone. The launcher is
 * the library's reading of the environment (sumo_bootstrap_detect, as the Python binding's):
 * one it does not join (torchrun, a batch script outside a step) is refused unless --transport
 * names one.
 */
#ifndef SUMO_TOOL_LAUNCH_H
#define SUMO_TOOL_LAUNCH_H

#include "sumo_elastic.h"

#include "sumo_shm.h"

#include <stdbool.h>
#include <stddef.h>

enum launch_kind { LAUNCH_THREADS, LAUNCH_MPI, LAUNCH_SRUN };

typedef struct launch {
    enum launch_kind kind;
    const char *launcher; /* "mpirun", "srun": for messages */
    /* LAUNCH_SRUN: from the step's variables */
    int rank, size;
    char store_dir[512];
} launch;

/* transport: the --transport flag (NULL: decide from the environment). Returns 0, or 2 with
 * the reason in err (a step of several nodes, a malformed or incomplete set of variables, a
 * launcher the command does not join). */
int launch_detect(const char *transport, launch *l, char *err, size_t errlen);

/* Whether an MPI launcher started this process (mpirun, or srun --mpi=pmix), as
 * launch_detect reads it: the default transport of `sumo bench`. */
bool launch_under_mpi(void);

/* LAUNCH_SRUN: the shared-memory communicator of the step's tasks. The store's directory is
 * removed once every task has joined, unless keep (an elastic run's survivors meet there
 * again): *keep is then the store, for the caller to destroy. Returns 0, or 1 with the reason
 * in err. */
int launch_join_srun(const launch *l, sumo_comm **comm, sumo_store **keep, char *err, size_t errlen);

/* sumo train --store DIR: this process's membership in an elastic job of processes that meet
 * through the directory store in dir (a shared folder for hosts that share it), as worker
 * rank of size, or (joiner) one that joins the running job. *store: the store, which must
 * outlive *membership (the caller destroys both, the membership first). Returns 0, or 1 with
 * the reason in err. */
int launch_join_store(const char *dir, int rank, int size, bool joiner, sumo_store **store,
                      sumo_elastic **membership, char *err, size_t errlen);

#endif
