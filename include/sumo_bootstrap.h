/*
 * Who started this process, read from the environment its launcher set: which launcher, the
 * process's rank and the job's size, its place on its host, and where rank 0 listens. The
 * `sumo` command and the Python binding both ask this one function, so a process is taken for
 * the same launch by either. It reads only the environment it is given (an envp array, as
 * main's third argument), keeps nothing, and is safe to call from any thread on its own arrays.
 *
 * The launchers, first match wins (a variable set to "" counts as unset):
 *   - Open MPI's mpirun: OMPI_COMM_WORLD_SIZE; rank, local rank and local size from
 *     OMPI_COMM_WORLD_RANK, _LOCAL_RANK and _LOCAL_SIZE;
 *   - PMI (MPICH's and Intel MPI's mpiexec, srun --mpi=pmi2): PMI_SIZE, with PMI_RANK;
 *     MPI_LOCALRANKID and MPI_LOCALNRANKS, which Hydra sets beside them, give the place on
 *     the host but alone do not make an MPI launch (an MPI library starts from PMI_* itself);
 *   - PMIx (srun --mpi=pmix, prterun): PMIX_RANK, with the size from SLURM_NTASKS in a step;
 *   - torchrun (torchelastic): TORCHELASTIC_RUN_ID or TORCHELASTIC_RESTART_COUNT, with RANK,
 *     WORLD_SIZE, MASTER_ADDR and MASTER_PORT (every one required), LOCAL_RANK and
 *     LOCAL_WORLD_SIZE;
 *   - a rendezvous by hand (torch's env://): RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT all
 *     set;
 *   - an srun step of more than one task: SLURM_STEP_ID or SLURM_STEP_NODELIST, with
 *     SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_STEP_NODELIST, SLURM_JOB_ID and
 *     SLURM_STEP_ID (every one required). Rank 0 listens on the first host of
 *     SLURM_STEP_NODELIST at port 12000 + (SLURM_JOB_ID * 64 + SLURM_STEP_ID) mod 20000, so
 *     every task of a step computes the same one, two steps of a job do not meet, and the
 *     port lies below Linux's ephemeral range (MASTER_ADDR and MASTER_PORT, when set, win).
 *     A step of one task is no launch: a world of one;
 *   - a store the caller was given (sumo_bootstrap_options.store): its address, with the rank
 *     and size given beside it, whatever the environment says.
 * Refused, with SUMO_ERR_INVALID_USAGE and a sentence saying what to do, rather than run as
 * independent worlds of one: a Slurm batch script or salloc's shell outside an srun step
 * (SLURM_NTASKS > 1), PBS (PBS_NP > 1), LSF (LSB_DJOB_NUMPROC > 1), and WORLD_SIZE > 1
 * without MASTER_ADDR and MASTER_PORT.
 *
 * Every number is bounded; a malformed or out-of-range value, or a required variable that is
 * missing, is SUMO_ERR_INVALID_ARGUMENT with a sentence naming the variable.
 */
#ifndef SUMO_BOOTSTRAP_H
#define SUMO_BOOTSTRAP_H

#include "sumo.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The most processes a launch may name (a rank or size beyond is refused). */
#define SUMO_BOOTSTRAP_MAX_SIZE (1 << 20)
/* Bytes of a host name with its terminating zero. */
#define SUMO_BOOTSTRAP_HOST_BYTES 256
/* Bytes of sumo_bootstrap.run_id and .store with their terminating zero. */
#define SUMO_BOOTSTRAP_ID_BYTES 128
#define SUMO_BOOTSTRAP_STORE_BYTES 512
/* The most hosts a Slurm hostlist may expand to, and the longest one read. */
#define SUMO_HOSTLIST_MAX_HOSTS (1 << 20)
#define SUMO_HOSTLIST_MAX_BYTES 65536

typedef enum sumo_launcher {
    SUMO_LAUNCHER_NONE = 0,        /* no launcher: a world of one */
    SUMO_LAUNCHER_OPEN_MPI = 1,    /* Open MPI's mpirun */
    SUMO_LAUNCHER_PMI = 2,         /* an MPI started through PMI (MPICH, Intel MPI) */
    SUMO_LAUNCHER_PMIX = 3,        /* an MPI started through PMIx */
    SUMO_LAUNCHER_SRUN = 4,        /* a task of an srun step, no MPI */
    SUMO_LAUNCHER_TORCHRUN = 5,    /* torchrun */
    SUMO_LAUNCHER_ENV = 6,         /* RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT by hand */
    SUMO_LAUNCHER_STORE = 7,       /* a store the caller named */
    SUMO_LAUNCHER_UNSUPPORTED = 8, /* one sumo does not join (the sentence says which) */
} sumo_launcher;

typedef struct sumo_bootstrap_options {
    size_t struct_size;      /* sizeof(sumo_bootstrap_options): lets the struct grow */
    const char *const *envp; /* "NAME=VALUE" strings ending with NULL; NULL: the process's
                                own (environ), which must then not change during the call */
    const char *store;       /* optional (NULL: none): a store's address, "tcp://HOST:PORT"
                                or a path; the launch is then SUMO_LAUNCHER_STORE */
    int rank, size;          /* with store: this process's rank of size */
    char *error;             /* optional (NULL: none): the sentence of a refusal ("" on
                                success) */
    size_t error_bytes;
} sumo_bootstrap_options;

typedef struct sumo_bootstrap {
    size_t struct_size;     /* set by sumo_bootstrap_detect */
    sumo_launcher launcher;
    int rank, size;         /* -1 where the launcher does not say (PMIx outside a step) */
    int local_rank;         /* the rank among the launch's processes on this host, or -1 */
    int local_size;         /* how many of them this host runs, or -1 */
    int nodes;              /* the hosts of the launch where the launcher says, else -1 */
    int slurm_step;         /* 1 for a task of an srun step (SRUN, or an MPI srun started) */
    char host[SUMO_BOOTSTRAP_HOST_BYTES]; /* where rank 0 listens, "" where the launcher
                                             does not say (MPI: the MPI library meets) */
    int port;               /* and its port, 0 where it does not say */
    char run_id[SUMO_BOOTSTRAP_ID_BYTES]; /* a name every process of this launch shares and
                                             an earlier one of the same ids does not: srun
                                             "JOB.STEP-PORT" (srun's own port, 0 where
                                             unset), torchrun "RUN.RESTART"; else "" */
    char store[SUMO_BOOTSTRAP_STORE_BYTES]; /* STORE: a path store's path, else "" */
} sumo_bootstrap;

/* struct_size set, store and error NULL, envp NULL (the process's environment). */
SUMO_API sumo_result sumo_bootstrap_options_default(sumo_bootstrap_options *options);

/*
 * Fills *out from the environment (and options->store). SUMO_SUCCESS for a launch sumo joins
 * or none; SUMO_ERR_INVALID_USAGE for a launcher sumo does not join (out->launcher
 * SUMO_LAUNCHER_UNSUPPORTED); SUMO_ERR_INVALID_ARGUMENT for a variable of the launcher found
 * that is missing or malformed (out->launcher says which launcher), or for options that cannot
 * be used. On either refusal the other fields are as on success where they were read, else -1,
 * 0 or ""; the sentence goes to options->error.
 */
SUMO_API sumo_result sumo_bootstrap_detect(const sumo_bootstrap_options *options, sumo_bootstrap *out);

/* The launcher's name for messages ("srun", "torchrun", ...; never NULL). */
SUMO_API const char *sumo_launcher_name(sumo_launcher launcher);

/*
 * Slurm's hostlist syntax: "node[01-03,07],gpu5" is node01, node02, node03, node07, gpu5, in
 * that order; a number keeps the width of the range's first bound (node[098-101]); several
 * bracket groups in one name multiply out, the first varying slowest (r[1-2]n[1-2]: r1n1, r1n2,
 * r2n1, r2n2). Writes host number index (from 0) into host (bytes long) and, when count is not
 * NULL, the number of hosts into *count. SUMO_ERR_INVALID_ARGUMENT for a malformed list, an
 * index past its end, or a host longer than bytes, with the sentence in error (NULL: none).
 */
SUMO_API sumo_result sumo_hostlist_get(const char *list, size_t index, char *host, size_t bytes,
                                       size_t *count, char *error, size_t error_bytes);

#ifdef __cplusplus
}
#endif

#endif
