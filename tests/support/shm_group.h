/*
 * What the shm transport's process tests (tests/unit/test_shm_procs_*.c) share: a group of
 * forked ranks that meet through a store of files in a temporary directory
 * (sumo_store_create_dir), as torchrun's processes meet through a TCPStore, each running one
 * scenario on its communicator; the parent waits for them all (killing a group that hangs),
 * and after every group no object named for any of its processes may be left in /dev/shm.
 *
 * cmocka's assertions run in the parent only: a child reports through its exit status and
 * prints what failed on stderr (check() tallies its failures).
 */
#ifndef SUMO_TEST_SHM_GROUP_H
#define SUMO_TEST_SHM_GROUP_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "sumo_shm.h"
#include "support/harness.h"
#include "support/reference.h"
#include "support/shm_names.h"
#include "support/temp_dir.h"

#include <dirent.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/capability.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAXP 5
/* What a child exits with when a scenario ends on a sumo_result: this plus the result. */
#define EXIT_RESULT 100
/* How long a group may run before the parent kills it: a hang, never a timing check. */
#define GROUP_LIMIT_S 300.0

static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- running a group of processes ----------------------------------------------------------- */

typedef struct group group;
/* A rank's part; owns *comm (destroying it sets NULL). Returns the child's exit status. */
typedef int (*scenario_fn)(sumo_comm **comm, int rank, int size, group *g);

struct group {
    int size;
    scenario_fn fn;
    bool named;         /* SUMO_SHM_NAMED=1 */
    bool undumpable_0;  /* rank 0 forbids inspection (no /proc/<pid>/fd for its peers) */
    size_t stage_bytes; /* options.stage_bytes */
    const char *timeout; /* SUMO_TIMEOUT for the children, NULL: unset */
    int late_rank, late_ms; /* this rank sleeps this long before sumo_comm_create_shm */
    /* Called by the parent once the children run (NULL: none). */
    void (*parent_hook)(group *g);
    int ready[2]; /* a pipe: a child writes a byte when the parent_hook may act */
    char dir[160];
    pid_t pid[MAXP];
    int status[MAXP];
    double killed_at, ended_at;
    int served_keys; /* store keys the meeting is done with (seg, attach) that were left */
};

/* Gives up the right to inspect any process (root has it), as an ordinary user lacks it. */
static inline void drop_ptrace_capability(void)
{
    struct __user_cap_header_struct h = {.version = _LINUX_CAPABILITY_VERSION_3};
    struct __user_cap_data_struct d[2];
    if (syscall(SYS_capget, &h, d) != 0) return;
    d[0].effective &= ~(1u << CAP_SYS_PTRACE);
    d[0].permitted &= ~(1u << CAP_SYS_PTRACE);
    if (syscall(SYS_capset, &h, d) != 0) perror("capset");
}

static inline int child(group *g, int rank)
{
    close(g->ready[0]);
    if (g->named) setenv("SUMO_SHM_NAMED", "1", 1);
    if (g->timeout) setenv("SUMO_TIMEOUT", g->timeout, 1);
    if (g->undumpable_0) {
        if (rank == 0) prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
        else drop_ptrace_capability();
    }
    if (g->late_ms && rank == g->late_rank)
        nanosleep(&(struct timespec){g->late_ms / 1000, (g->late_ms % 1000) * 1000000L}, NULL);
    sumo_store *store = NULL;
    if (sumo_store_create_dir(g->dir, &store) != SUMO_SUCCESS) {
        fprintf(stderr, "rank %d: cannot open the store in %s\n", rank, g->dir);
        return EXIT_RESULT + (int)SUMO_ERR_SYSTEM;
    }
    char err[256] = "unset";
    sumo_shm_options o = {.struct_size = sizeof o, .rank = rank, .size = g->size,
                          .store = store, .key_prefix = "test/", .stage_bytes = g->stage_bytes,
                          .error = err, .error_bytes = sizeof err};
    sumo_comm *comm = NULL;
    sumo_result r = sumo_comm_create_shm(&o, &comm);
    sumo_store_destroy_dir(store, 0); /* the meeting is the store's only use */
    if (r != SUMO_SUCCESS) {
        fprintf(stderr, "rank %d/%d: sumo_comm_create_shm: %s (%s)\n", rank, g->size,
                sumo_result_name(r), err);
        return EXIT_RESULT + (int)r;
    }
    if (err[0] != '\0') {
        fprintf(stderr, "rank %d: error message \"%s\" after a success\n", rank, err);
        return 1;
    }
    int status = g->fn(&comm, rank, g->size, g);
    if (comm) {
        r = sumo_comm_destroy(comm);
        if (r != SUMO_SUCCESS && status == 0) {
            fprintf(stderr, "rank %d: sumo_comm_destroy: %s\n", rank, sumo_result_name(r));
            status = 1;
        }
    }
    return status;
}

/* A fresh directory for a store, under TMPDIR as mkdtemp(3) users expect. */
static inline void make_store_dir(char *dir, size_t len)
{
    assert_true(make_temp_dir(dir, len, "shm"));
}

/* The dir store's files of keys the meeting has done with once every rank met ("seg/" and
 * "attach/"; '/' is written _2F in a file's name): they should be gone. */
static inline int served_keys(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        n += strncmp(e->d_name, "k.", 2) == 0 &&
             (strstr(e->d_name, "_2Fseg_2F") != NULL || strstr(e->d_name, "_2Fattach_2F") != NULL);
    closedir(d);
    return n;
}

/* Forks g->size ranks, runs the hook, waits for all (killing them past GROUP_LIMIT_S), and
 * checks that nothing named is left. */
static inline void run_group(group *g)
{
    make_store_dir(g->dir, sizeof g->dir);
    assert_int_equal(pipe(g->ready), 0);
    fflush(NULL);
    for (int r = 0; r < g->size; r++) {
        g->pid[r] = fork();
        assert_true(g->pid[r] >= 0);
        if (g->pid[r] == 0) exit(child(g, r));
    }
    close(g->ready[1]);
    double start = now_s();
    if (g->parent_hook) g->parent_hook(g);
    int running = g->size;
    bool ended[MAXP] = {false};
    while (running > 0) {
        for (int r = 0; r < g->size; r++) {
            int st;
            if (ended[r] || waitpid(g->pid[r], &st, WNOHANG) != g->pid[r]) continue;
            ended[r] = true;
            running--;
            g->status[r] = WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
        }
        if (running > 0 && now_s() - start > GROUP_LIMIT_S) {
            fprintf(stderr, "group of %d still running after %.0f s: killed\n", g->size,
                    GROUP_LIMIT_S);
            for (int r = 0; r < g->size; r++)
                if (!ended[r]) kill(g->pid[r], SIGKILL);
            start = now_s() + 1e9;
        }
        if (running > 0) nanosleep(&(struct timespec){0, 2000000}, NULL);
    }
    g->ended_at = now_s();
    close(g->ready[0]);
    g->served_keys = served_keys(g->dir);
    remove_dir(g->dir);
    assert_int_equal(leftovers(g->pid, g->size), 0);
}

static inline void expect_all(const group *g, int status)
{
    for (int r = 0; r < g->size; r++) {
        if (g->status[r] != status)
            fprintf(stderr, "rank %d of %d ended with %d, expected %d\n", r, g->size,
                    g->status[r], status);
        assert_int_equal(g->status[r], status);
    }
}

static inline void signal_ready(group *g)
{
    char b = 1;
    if (write(g->ready[1], &b, 1) != 1) perror("ready pipe");
}

/* ---- checks inside a child ------------------------------------------------------------------- */

typedef struct tally {
    int rank;
    int failed;
} tally;

static inline void check(tally *t, bool ok, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static inline void check(tally *t, bool ok, const char *fmt, ...)
{
    if (ok) return;
    t->failed++;
    if (t->failed > 20) return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "rank %d FAIL: ", t->rank);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

/* The documented sum or average over every rank of the integer inputs, as stored in dtype. */
static inline double expected_sum(sumo_dtype dtype, sumo_op op, int size, size_t i)
{
    double v[MAXP];
    for (int k = 0; k < size; k++) v[k] = harness_collective_value(k, i, true);
    return ref_round_to(dtype, ref_sum_in_order(dtype, v, size, op == SUMO_OP_AVERAGE ? size : 1));
}

#endif
