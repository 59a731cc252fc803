/*
 * sumo_bootstrap_detect over hand-written environments, one per launcher, and Slurm's hostlists:
 * the expected values are written out by hand (the hostlists as the binding's former Python
 * parser expanded them, the ports from 12000 + (job * 64 + step) mod 20000 worked out on paper),
 * never taken from the code. Malformed values are refused naming the variable.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include "sumo_bootstrap.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

typedef struct detected {
    sumo_result code;
    sumo_bootstrap b;
    char error[512];
} detected;

/* Detects from the NULL-terminated list of "NAME=VALUE" strings given. */
static detected detect_in(const char *const *envp)
{
    detected d;
    memset(&d, 0x5a, sizeof d); /* nothing left over may pass for a value */
    sumo_bootstrap_options o;
    assert_int_equal(sumo_bootstrap_options_default(&o), SUMO_SUCCESS);
    o.envp = envp;
    o.error = d.error;
    o.error_bytes = sizeof d.error;
    d.code = sumo_bootstrap_detect(&o, &d.b);
    return d;
}

#define DETECT(...) detect_in((const char *const[]){__VA_ARGS__, NULL})

static void assert_place(const sumo_bootstrap *b, int rank, int size, int local_rank, int local_size)
{
    assert_int_equal(b->rank, rank);
    assert_int_equal(b->size, size);
    assert_int_equal(b->local_rank, local_rank);
    assert_int_equal(b->local_size, local_size);
}

static void assert_refused(detected d, sumo_result code, const char *words)
{
    assert_int_equal(d.code, code);
    if (!strstr(d.error, words)) fail_msg("\"%s\" does not say \"%s\"", d.error, words);
}

static void test_no_launcher(void **state)
{
    (void)state;
    detected d = detect_in((const char *const[]){"PATH=/bin", "HOME=/root", NULL});
    assert_int_equal(d.code, SUMO_SUCCESS);
    assert_int_equal(d.b.launcher, SUMO_LAUNCHER_NONE);
    assert_int_equal(d.b.struct_size, sizeof(sumo_bootstrap));
    assert_place(&d.b, 0, 1, 0, 1);
    assert_string_equal(d.b.host, "");
    assert_int_equal(d.b.port, 0);
    assert_string_equal(d.error, "");
    /* An empty value is no value, and a step of one task is no launch. */
    d = DETECT("OMPI_COMM_WORLD_SIZE=", "SLURM_STEP_ID=0", "SLURM_NTASKS=1", "WORLD_SIZE=1");
    assert_int_equal(d.code, SUMO_SUCCESS);
    assert_int_equal(d.b.launcher, SUMO_LAUNCHER_NONE);
}

static void test_open_mpi(void **state)
{
    (void)state;
    detected d = DETECT("OMPI_COMM_WORLD_SIZE=4", "OMPI_COMM_WORLD_RANK=2", "OMPI_COMM_WORLD_LOCAL_RANK=0",
                        "OMPI_COMM_WORLD_LOCAL_SIZE=2", "PMIX_RANK=2", "RANK=7");
    assert_int_equal(d.code, SUMO_SUCCESS);
    assert_int_equal(d.b.launcher, SUMO_LAUNCHER_OPEN_MPI);
    assert_place(&d.b, 2, 4, 0, 2);
    assert_int_equal(d.b.slurm_step, 0);
    assert_string_equal(d.b.host, "");
    assert_string_equal(sumo_launcher_name(d.b.launcher), "mpirun");
}

/* MPICH's Hydra sets PMI_RANK and PMI_SIZE, and beside them MPI_LOCALRANKID and
 * MPI_LOCALNRANKS: those two give the place on the host, and alone are no MPI launch. */
static void test_pmi_and_the_local_variables(void **state)
{
    (void)state;
    detected d = DETECT("PMI_SIZE=3", "PMI_RANK=1", "MPI_LOCALRANKID=1", "MPI_LOCALNRANKS=3");
    assert_int_equal(d.code, SUMO_SUCCESS);
    assert_int_equal(d.b.launcher, SUMO_LAUNCHER_PMI);
    assert_place(&d.b, 1, 3, 1, 3);
    d = DETECT("MPI_LOCALNRANKS=2", "MPI_LOCALRANKID=0");
    assert_int_equal(d.code, SUMO_SUCCESS);
    assert_int_equal(d.b.launcher, SUMO_LAUNCHER_NONE);
    assert_place(&d.b, 0, 1, 0, 1);
    /* Under srun --mpi=pmi2 the step's variables do not make it a plain step. */
    d = DETECT("PMI_SIZE=2", "PMI_RANK=0", "SLURM_STEP_ID=1", "SLURM_NTASKS=2");
    assert_int_equal(d.b.launcher, SUMO_LAUNCHER_PMI);
    assert_int_equal(d.b.slurm_step, 1);
}

static void test_pmix(void **state)
{
    (void)state;
    detected d = DETECT("PMIX_RANK=1", "SLURM_STEP_ID=3", "SLURM_NTASKS=2", "SLURM_LOCALID=1", "SLURM_PROCID=1");
    assert_int_equal(d.code, SUMO_SUCCESS);
    assert_int_equal(d.b.launcher, SUMO_LAUNCHER_PMIX);
    assert_int_equal(d.b.slurm_step, 1);
    assert_place(&d.b, 1, 2, 1, -1);
    d = DETECT("PMIX_RANK=5");
    assert_int_equal(d.code, SUMO_SUCCESS);
    assert_place(&d.b, 5, -1, -1, -1);
    assert_int_equal(d.b.slurm_step, 0);
    assert_refused(DETECT("PMIX_RANK=2", "SLURM_STEP_ID=3", "SLURM_NTASKS=2"), SUMO_ERR_INVALID_ARGUMENT,
                   "PMIX_RANK=2 is not a rank of SLURM_NTASKS=2");
}

static void test_torchrun(void **state)
{
    (void)state;
    detected d = DETECT("TORCHELASTIC_RUN_ID=abc", "TORCHELASTIC_RESTART_COUNT=1", "RANK=3", "WORLD_SIZE=4",
                        "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=2", "GROUP_WORLD_SIZE=2", "MASTER_ADDR=10.0.0.1",
                        "MASTER_PORT=29500", "SLURM_STEP_ID=1", "SLURM_NTASKS=4");
    assert_int_equal(d.code, SUMO_SUCCESS);
    assert_int_equal(d.b.launcher, SUMO_LAUNCHER_TORCHRUN);
    assert_place(&d.b, 3, 4, 1, 2);
    assert_int_equal(d.b.nodes, 2);
    assert_string_equal(d.b.host, "10.0.0.1");
    assert_int_equal(d.b.port, 29500);
    assert_string_equal(d.b.run_id, "abc.1");
    assert_refused(DETECT("TORCHELASTIC_RUN_ID=abc", "RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=h"),
                   SUMO_ERR_INVALID_ARGUMENT, "MASTER_PORT is not set");
    assert_refused(DETECT("TORCHELASTIC_RESTART_COUNT=0", "RANK=2", "WORLD_SIZE=2", "MASTER_ADDR=h",
                          "MASTER_PORT=1"),
                   SUMO_ERR_INVALID_ARGUMENT, "RANK=2 is not a rank of WORLD_SIZE=2");
    assert_refused(DETECT("TORCHELASTIC_RUN_ID=abc", "RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=2", "LOCAL_WORLD_SIZE=2",
                          "MASTER_ADDR=h", "MASTER_PORT=1"),
                   SUMO_ERR_INVALID_ARGUMENT, "LOCAL_RANK=2 is not a rank of LOCAL_WORLD_SIZE=2");
}

static void test_env_rendezvous(void **state)
{
    (void)state;
    detected d = DETECT("RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=head", "MASTER_PORT=1234");
    assert_int_equal(d.code, SUMO_SUCCESS);
    assert_int_equal(d.b.launcher, SUMO_LAUNCHER_ENV);
    assert_place(&d.b, 0, 2, -1, -1);
    assert_string_equal(d.b.host, "head");
    assert_int_equal(d.b.port, 1234);
    assert_string_equal(d.b.run_id, "");
    /* Three of the four are no rendezvous: WORLD_SIZE > 1 alone is refused, saying so. */
    d = DETECT("RANK=0", "WORLD_SIZE=4", "MASTER_ADDR=head");
    assert_refused(d, SUMO_ERR_INVALID_USAGE, "WORLD_SIZE=4 without MASTER_ADDR and MASTER_PORT");
    assert_int_equal(d.b.launcher, SUMO_LAUNCHER_UNSUPPORTED);
}

static const char *step[] = {"SLURM_PROCID=1", "SLURM_NTASKS=4", "SLURM_LOCALID=1", "SLURM_STEP_NODELIST=node[03-04]",
                             "SLURM_JOB_ID=4242", "SLURM_STEP_ID=2", "SLURM_SRUN_COMM_PORT=41234"};
#define NSTEP (sizeof step / sizeof step[0])

/* The step above with one variable replaced ("NAME=VALUE"), added, or removed ("NAME"). */
static detected detect_step(const char *change)
{
    const char *envp[NSTEP + 2];
    size_t n = 0, len = strcspn(change, "=");
    bool replaced = false;
    for (size_t i = 0; i < NSTEP; i++) {
        if (strncmp(step[i], change, len) == 0 && step[i][len] == '=') {
            replaced = true;
            if (change[len] == '=') envp[n++] = change;
        } else {
            envp[n++] = step[i];
        }
    }
    if (!replaced) envp[n++] = change;
    envp[n] = NULL;
    return detect_in(envp);
}

static void test_srun_step(void **state)
{
    (void)state;
    detected d = detect_step("TMPDIR=/tmp");
    assert_int_equal(d.code, SUMO_SUCCESS);
    assert_int_equal(d.b.launcher, SUMO_LAUNCHER_SRUN);
    assert_int_equal(d.b.slurm_step, 1);
    assert_place(&d.b, 1, 4, 1, -1);
    assert_string_equal(d.b.host, "node03");
    assert_int_equal(d.b.nodes, 2);
    assert_int_equal(d.b.port, 23490); /* 12000 + (4242 * 64 + 2) mod 20000 = 12000 + 11490 */
    assert_string_equal(d.b.run_id, "4242.2-41234");
    /* Every task of the step meets at the same port; another step or job elsewhere. */
    assert_int_equal(detect_step("SLURM_PROCID=3").b.port, 23490);
    assert_int_equal(detect_step("SLURM_STEP_ID=3").b.port, 23491);
    assert_int_equal(detect_step("SLURM_JOB_ID=4243").b.port, 23554);
    assert_int_equal(detect_step("SLURM_JOB_ID=312").b.port, 31970); /* 19968 + 2 */
    /* 312 * 64 + 31 = 19999, the last port; + 32 wraps to the first. */
    assert_int_equal(detect_in((const char *const[]){"SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_LOCALID=0",
                                                     "SLURM_STEP_NODELIST=a", "SLURM_JOB_ID=312",
                                                     "SLURM_STEP_ID=31", NULL})
                         .b.port,
                     31999);
    assert_int_equal(detect_in((const char *const[]){"SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_LOCALID=0",
                                                     "SLURM_STEP_NODELIST=a", "SLURM_JOB_ID=312",
                                                     "SLURM_STEP_ID=32", NULL})
                         .b.port,
                     12000);
    /* The largest Slurm ids: (4294967295 * 64 + 7) mod 20000 = 6887. */
    d = detect_in((const char *const[]){"SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_LOCALID=0",
                                        "SLURM_STEP_NODELIST=a", "SLURM_JOB_ID=4294967295", "SLURM_STEP_ID=7",
                                        NULL});
    assert_int_equal(d.code, SUMO_SUCCESS);
    assert_int_equal(d.b.port, 18887);
    assert_string_equal(d.b.run_id, "4294967295.7-0");
    assert_int_equal(d.b.nodes, 1);
    /* SLURM_STEP_NUM_NODES, where srun sets it, says how many hosts. */
    assert_int_equal(detect_step("SLURM_STEP_NUM_NODES=1").b.nodes, 1);
    /* MASTER_ADDR and MASTER_PORT win. */
    const char *over[NSTEP + 3];
    memcpy(over, step, sizeof step);
    over[NSTEP] = "MASTER_ADDR=head";
    over[NSTEP + 1] = "MASTER_PORT=29400";
    over[NSTEP + 2] = NULL;
    d = detect_in(over);
    assert_int_equal(d.code, SUMO_SUCCESS);
    assert_string_equal(d.b.host, "head");
    assert_int_equal(d.b.port, 29400);
}

static void test_srun_step_incomplete(void **state)
{
    (void)state;
    static const char *const required[] = {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_STEP_NODELIST",
                                           "SLURM_JOB_ID", "SLURM_STEP_ID"};
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++) {
        char words[64];
        snprintf(words, sizeof words, "%s is not set", required[i]);
        detected d = detect_step(required[i]);
        assert_refused(d, SUMO_ERR_INVALID_ARGUMENT, words);
        assert_int_equal(d.b.launcher, SUMO_LAUNCHER_SRUN);
    }
    assert_refused(DETECT("SLURM_STEP_ID=0", "SLURM_NTASKS=2", "SLURM_PROCID=0", "SLURM_JOB_ID=7"),
                   SUMO_ERR_INVALID_ARGUMENT, "SLURM_LOCALID, SLURM_STEP_NODELIST are not set");
}

static void test_batch_script_and_other_launchers(void **state)
{
    (void)state;
    detected d = DETECT("SLURM_NTASKS=4", "SLURM_JOB_ID=9", "SLURM_NNODES=1");
    assert_refused(d, SUMO_ERR_INVALID_USAGE, "batch script");
    assert_int_equal(d.b.launcher, SUMO_LAUNCHER_UNSUPPORTED);
    assert_refused(DETECT("PBS_NP=8"), SUMO_ERR_INVALID_USAGE, "PBS (PBS_NP=8)");
    assert_refused(DETECT("LSB_DJOB_NUMPROC=2"), SUMO_ERR_INVALID_USAGE, "LSF (LSB_DJOB_NUMPROC=2)");
    d = DETECT("PBS_NP=1", "LSB_DJOB_NUMPROC=1", "SLURM_NTASKS=1");
    assert_int_equal(d.code, SUMO_SUCCESS);
    assert_int_equal(d.b.launcher, SUMO_LAUNCHER_NONE);
}

static void test_malformed_values_named(void **state)
{
    (void)state;
    static const struct {
        const char *change, *words;
    } steps[] = {
        {"SLURM_PROCID=x", "SLURM_PROCID=x is not a number"},
        {"SLURM_PROCID=4", "SLURM_PROCID=4 is not a rank of SLURM_NTASKS=4"},
        {"SLURM_PROCID=-1", "SLURM_PROCID=-1 is not a number"},
        {"SLURM_PROCID= 1", "SLURM_PROCID= 1 is not a number"},
        {"SLURM_NTASKS=abc", "SLURM_NTASKS=abc is not a number"},
        {"SLURM_NTASKS=99999999999999999999", "SLURM_NTASKS=99999999999999999999 is not a number"},
        {"SLURM_LOCALID=1x", "SLURM_LOCALID=1x is not a number"},
        {"SLURM_JOB_ID=4294967296", "SLURM_JOB_ID=4294967296 is not a number from 0 to 4294967295"},
        {"SLURM_STEP_ID=x", "SLURM_STEP_ID=x is not a number"},
        {"SLURM_SRUN_COMM_PORT=70000", "SLURM_SRUN_COMM_PORT=70000 is not a number from 1 to 65535"},
        {"SLURM_STEP_NODELIST=n[1-", "SLURM_STEP_NODELIST: hostlist 'n[1-': '[' without ']'"},
        {"SLURM_STEP_NUM_NODES=0", "SLURM_STEP_NUM_NODES=0 is not a number"},
        {"MASTER_PORT=0", "MASTER_PORT=0 is not a number from 1 to 65535"},
        {"MASTER_ADDR=a b", "MASTER_ADDR=a b is not a host name"},
    };
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        detected d = detect_step(steps[i].change);
        assert_refused(d, SUMO_ERR_INVALID_ARGUMENT, steps[i].words);
    }
    assert_refused(DETECT("OMPI_COMM_WORLD_SIZE=0"), SUMO_ERR_INVALID_ARGUMENT,
                   "OMPI_COMM_WORLD_SIZE=0 is not a number from 1");
    assert_refused(DETECT("OMPI_COMM_WORLD_SIZE=2", "OMPI_COMM_WORLD_RANK=2"), SUMO_ERR_INVALID_ARGUMENT,
                   "OMPI_COMM_WORLD_RANK=2 is not a rank of OMPI_COMM_WORLD_SIZE=2");
    assert_refused(DETECT("PMI_SIZE=+3"), SUMO_ERR_INVALID_ARGUMENT, "PMI_SIZE=+3 is not a number");
    assert_refused(DETECT("PMI_SIZE=2", "MPI_LOCALNRANKS=3"), SUMO_ERR_INVALID_ARGUMENT,
                   "MPI_LOCALNRANKS=3 is more than PMI_SIZE=2");
    assert_refused(DETECT("PMIX_RANK=r"), SUMO_ERR_INVALID_ARGUMENT, "PMIX_RANK=r is not a number");
    assert_refused(DETECT("WORLD_SIZE=two"), SUMO_ERR_INVALID_ARGUMENT, "WORLD_SIZE=two is not a number");
    assert_refused(DETECT("SLURM_NTASKS=4x"), SUMO_ERR_INVALID_ARGUMENT, "SLURM_NTASKS=4x is not a number");
    assert_refused(DETECT("RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=h", "MASTER_PORT=http"), SUMO_ERR_INVALID_ARGUMENT,
                   "MASTER_PORT=http is not a number");
    /* A long value is cut in the sentence, not copied whole. */
    char big[600] = "PMI_SIZE=";
    memset(big + 9, '7', sizeof big - 10);
    big[sizeof big - 1] = '\0';
    detected d = DETECT(big);
    assert_refused(d, SUMO_ERR_INVALID_ARGUMENT, "PMI_SIZE=7777");
    assert_true(strlen(d.error) < 200);
}

static void test_store(void **state)
{
    (void)state;
    sumo_bootstrap_options o;
    sumo_bootstrap b;
    char error[256];
    sumo_bootstrap_options_default(&o);
    const char *const envp[] = {"OMPI_COMM_WORLD_SIZE=8", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=2", NULL};
    o.envp = envp;
    o.error = error;
    o.error_bytes = sizeof error;
    o.store = "tcp://head:29400";
    o.rank = 1;
    o.size = 3;
    assert_int_equal(sumo_bootstrap_detect(&o, &b), SUMO_SUCCESS);
    assert_int_equal(b.launcher, SUMO_LAUNCHER_STORE);
    assert_place(&b, 1, 3, 1, 2);
    assert_string_equal(b.host, "head");
    assert_int_equal(b.port, 29400);
    assert_string_equal(b.store, "");
    o.store = "/shared/job.store";
    assert_int_equal(sumo_bootstrap_detect(&o, &b), SUMO_SUCCESS);
    assert_string_equal(b.store, "/shared/job.store");
    assert_string_equal(b.host, "");
    o.rank = 3;
    assert_int_equal(sumo_bootstrap_detect(&o, &b), SUMO_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(error, "rank 3 of size 3"));
    o.rank = 0;
    static const char *const bad[] = {"tcp://head", "tcp://head:0", "tcp://:80", "tcp://he ad:80", ""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        o.store = bad[i];
        assert_int_equal(sumo_bootstrap_detect(&o, &b), SUMO_ERR_INVALID_ARGUMENT);
        assert_non_null(strstr(error, "store"));
    }
    o.store = NULL;
    o.struct_size--;
    assert_int_equal(sumo_bootstrap_detect(&o, &b), SUMO_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(error, "struct_size"));
    assert_int_equal(sumo_bootstrap_detect(NULL, &b), SUMO_ERR_INVALID_ARGUMENT);
}

/* Every host of list, joined by spaces, or the refusal's sentence. */
static const char *expand(const char *list, char *out, size_t bytes)
{
    char host[64], error[256];
    size_t count = 0;
    out[0] = '\0';
    if (sumo_hostlist_get(list, 0, host, sizeof host, &count, error, sizeof error) != SUMO_SUCCESS) {
        snprintf(out, bytes, "%s", error);
        return out;
    }
    for (size_t i = 0; i < count; i++) {
        assert_int_equal(sumo_hostlist_get(list, i, host, sizeof host, NULL, error, sizeof error), SUMO_SUCCESS);
        size_t used = strlen(out);
        snprintf(out + used, bytes - used, "%s%s", i ? " " : "", host);
    }
    return out;
}

static void test_hostlists(void **state)
{
    (void)state;
    static const char *const cases[][2] = {
        {"node[01-03,07],gpu5", "node01 node02 node03 node07 gpu5"},
        {"node01", "node01"},
        {"node[01-04,07]", "node01 node02 node03 node04 node07"},
        {"node[8-11]", "node8 node9 node10 node11"},
        {"node[098-101]", "node098 node099 node100 node101"},
        {"a[1-2],login,b[3]", "a1 a2 login b3"},
        {"r[1-2]n[1-2]", "r1n1 r1n2 r2n1 r2n2"},
        {"gpu-[1,3]-ib", "gpu-1-ib gpu-3-ib"},
        {"host.example.org", "host.example.org"},
        {" n[1, 2] ", "n1 n2"},
        {"x[9-10]y[0-1]", "x9y0 x9y1 x10y0 x10y1"},
    };
    char out[512];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        assert_string_equal(expand(cases[i][0], out, sizeof out), cases[i][1]);
    size_t count;
    char host[64];
    assert_int_equal(sumo_hostlist_get("n[1-1000],m[1-1000]", 1500, host, sizeof host, &count, NULL, 0), SUMO_SUCCESS);
    assert_int_equal(count, 2000);
    assert_string_equal(host, "m501");
}

static void test_hostlists_refused(void **state)
{
    (void)state;
    static const char *const cases[][2] = {
        {"node[01-04", "'[' without ']'"}, {"node01]", "']' without '['"}, {"node[a-b]", "not a number or a range"},
        {"node[4-1]", "range 4-1 runs backwards"}, {"a,,b", "an empty name"}, {"a,", "an empty name"},
        {"n[[1]]", "nested brackets"}, {"node[]", "not a number or a range"},
        {"n[1-2000000]", "more than 1048576 hosts"},
        {"n[1-2]m[1-1000]p[1-1000]", "more than 1048576 hosts"}, {"a b", "a space"}, {"", "an empty name"},
    };
    char out[512];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (!strstr(expand(cases[i][0], out, sizeof out), cases[i][1]))
            fail_msg("'%s': \"%s\" does not say \"%s\"", cases[i][0], out, cases[i][1]);
    char host[8], error[256];
    assert_int_equal(sumo_hostlist_get("a,b", 2, host, sizeof host, NULL, error, sizeof error),
                     SUMO_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(error, "no host number 2: it has 2"));
    assert_int_equal(sumo_hostlist_get("abcdefgh", 0, host, sizeof host, NULL, error, sizeof error),
                     SUMO_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(error, "longer than 7 bytes"));
    assert_int_equal(sumo_hostlist_get(NULL, 0, host, sizeof host, NULL, NULL, 0), SUMO_ERR_INVALID_ARGUMENT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_launcher),
        cmocka_unit_test(test_open_mpi),
        cmocka_unit_test(test_pmi_and_the_local_variables),
        cmocka_unit_test(test_pmix),
        cmocka_unit_test(test_torchrun),
        cmocka_unit_test(test_env_rendezvous),
        cmocka_unit_test(test_srun_step),
        cmocka_unit_test(test_srun_step_incomplete),
        cmocka_unit_test(test_batch_script_and_other_launchers),
        cmocka_unit_test(test_malformed_values_named),
        cmocka_unit_test(test_store),
        cmocka_unit_test(test_hostlists),
        cmocka_unit_test(test_hostlists_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
