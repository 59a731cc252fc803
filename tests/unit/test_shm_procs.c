/*
 * The shm transport (sumo_shm.h) between real processes: each test forks its ranks, which
 * meet through a store of files in a temporary directory (support/file_store.h) as torchrun's
 * processes meet through a TCPStore.
 *
 * What the tests prove:
 *   - the transport's sendrecv moves messages of any size (empty, about a chunk, many chunks),
 *     one way, both ways and to itself, and a size disagreement fails with both sizes;
 *   - sums and averages of exact integers in fp32/fp64/fp16/bf16 equal the documented
 *     rank-order reference (support/reference.h) for 1 to 5 processes, with private buffers,
 *     with sumo_mem_alloc buffers on every rank (the direct path) and out of place into
 *     sumo_mem_alloc outputs, and over forced point-to-point algorithms (the mailboxes);
 *     broadcast from every root and allgather deliver every rank's bytes;
 *   - Adasum equals the sequential tree of sumo.h (within Horovod's tolerance) in its Gram
 *     form (fp32, bf16) and its tree form over point-to-point messages (fp64, forced ring),
 *     with the same bits on every rank;
 *   - ranks passing different counts all get SUMO_ERR_MISMATCH and can go on; an allocation
 *     one rank cannot make fails on every rank and leaves the handle usable;
 *   - the named fallback (SUMO_SHM_NAMED=1) works and removes its names as soon as every rank
 *     mapped them; a rank 0 that forbids inspection (undumpable) still meets its peers;
 *   - a rank killed in the middle of a collective makes the others fail with
 *     SUMO_ERR_PEER_FAILURE long before their deadline; a rank that leaves early makes its
 *     waiting peers fail at once, and a rank that stays long after the others left still
 *     destroys its handle cleanly;
 *   - a rank 0 killed while the group meets makes the others fail at once, whether they had
 *     attached already or arrive after its death;
 *   - a store that never delivers gives SUMO_ERR_TIMEOUT at the SUMO_TIMEOUT deadline with a
 *     message; options this library does not know are refused with a message;
 *   - after every test, no object named for any of its processes is left in /dev/shm.
 *
 * cmocka's assertions run in the parent only: a child reports through its exit status and
 * prints what failed on stderr.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "collectives/comm.h"
#include "sumo_shm.h"
#include "support/file_store.h"
#include "support/harness.h"
#include "support/reference.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
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

static double now_s(void)
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
};

/* Gives up the right to inspect any process (root has it), as an ordinary user lacks it. */
static void drop_ptrace_capability(void)
{
    struct __user_cap_header_struct h = {.version = _LINUX_CAPABILITY_VERSION_3};
    struct __user_cap_data_struct d[2];
    if (syscall(SYS_capget, &h, d) != 0) return;
    d[0].effective &= ~(1u << CAP_SYS_PTRACE);
    d[0].permitted &= ~(1u << CAP_SYS_PTRACE);
    if (syscall(SYS_capset, &h, d) != 0) perror("capset");
}

static int child(group *g, int rank)
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
    file_store fs;
    file_store_init(&fs, g->dir);
    char err[256] = "unset";
    sumo_shm_options o = {.struct_size = sizeof o, .rank = rank, .size = g->size,
                          .store = &fs.store, .key_prefix = "test/", .stage_bytes = g->stage_bytes,
                          .error = err, .error_bytes = sizeof err};
    sumo_comm *comm = NULL;
    sumo_result r = sumo_comm_create_shm(&o, &comm);
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

/* Names in /dev/shm made by one of pids ("sumo.<pid>.<nonce>"), printed; returns how many. */
static int leftovers(const pid_t *pids, int n)
{
    DIR *d = opendir("/dev/shm");
    if (d == NULL) return 0;
    int found = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        int pid = 0;
        if (sscanf(e->d_name, "sumo.%d.", &pid) != 1) continue;
        for (int i = 0; i < n; i++)
            if (pids[i] == pid) {
                fprintf(stderr, "left behind: /dev/shm/%s\n", e->d_name);
                found++;
            }
    }
    closedir(d);
    return found;
}

/* A fresh directory for a store, under TMPDIR as mkdtemp(3) users expect. */
static void make_store_dir(char *dir, size_t len)
{
    const char *base = getenv("TMPDIR");
    snprintf(dir, len, "%s/sumo-shm-test.XXXXXX", base && *base ? base : "/tmp");
    assert_non_null(mkdtemp(dir));
}

static void remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (d == NULL) return;
    char path[512];
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(d);
    rmdir(dir);
}

/* Forks g->size ranks, runs the hook, waits for all (killing them past GROUP_LIMIT_S), and
 * checks that nothing named is left. */
static void run_group(group *g)
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
    remove_dir(g->dir);
    assert_int_equal(leftovers(g->pid, g->size), 0);
}

static void expect_all(const group *g, int status)
{
    for (int r = 0; r < g->size; r++) {
        if (g->status[r] != status)
            fprintf(stderr, "rank %d of %d ended with %d, expected %d\n", r, g->size,
                    g->status[r], status);
        assert_int_equal(g->status[r], status);
    }
}

static void signal_ready(group *g)
{
    char b = 1;
    if (write(g->ready[1], &b, 1) != 1) perror("ready pipe");
}

/* ---- checks inside a child ------------------------------------------------------------------- */

typedef struct tally {
    int rank;
    int failed;
} tally;

static void check(tally *t, bool ok, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void check(tally *t, bool ok, const char *fmt, ...)
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

/* Whether a name of this process is in /dev/shm now (the fallback's names must be gone as
 * soon as every rank has mapped them). */
static bool own_name_exists(void)
{
    pid_t me = getpid();
    DIR *d = opendir("/dev/shm");
    if (d == NULL) return false;
    bool found = false;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        int pid = 0;
        if (sscanf(e->d_name, "sumo.%d.", &pid) == 1 && pid == me) found = true;
    }
    closedir(d);
    return found;
}

/* Which object the communicator's memory is mapped from here: 'm' a memfd, 'n' a named
 * object, '?' neither seen. */
static char mapped_from(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    if (f == NULL) return '?';
    char line[512], kind = '?';
    while (fgets(line, sizeof line, f))
        if (strstr(line, "memfd:sumo-shm")) kind = 'm';
        else if (strstr(line, "/dev/shm/sumo.")) kind = 'n';
    fclose(f);
    return kind;
}

static const sumo_dtype dtypes[] = {SUMO_FLOAT32, SUMO_FLOAT64, SUMO_FLOAT16, SUMO_BFLOAT16};
static const char *const dtype_names[] = {"fp32", "fp64", "fp16", "bf16"};

/* The documented sum or average over every rank of the integer inputs, as stored in dtype. */
static double expected_sum(sumo_dtype dtype, sumo_op op, int size, size_t i)
{
    double v[MAXP];
    for (int k = 0; k < size; k++) v[k] = harness_collective_value(k, i, true);
    return ref_round_to(dtype, ref_sum_in_order(dtype, v, size, op == SUMO_OP_AVERAGE ? size : 1));
}

enum { PRIVATE, SHARED, OUT_SHARED, KINDS };
static const char *const kind_names[] = {"private buffers", "sumo_mem_alloc buffers",
                                         "private inputs into sumo_mem_alloc outputs"};

typedef struct buffers {
    unsigned char *in[KINDS], *out[KINDS];
} buffers;

static void sums(sumo_comm *comm, int rank, int size, const buffers *b, tally *t)
{
    static const size_t counts[] = {1, 1000, 300007};
    for (int kind = 0; kind < KINDS; kind++)
        for (int d = 0; d < 4; d++)
            for (size_t c = 0; c < 3; c++)
                for (int op_i = 0; op_i < 2; op_i++)
                    for (int in_place = 0; in_place < 2; in_place++) {
                        if (kind == OUT_SHARED && in_place) continue;
                        sumo_dtype dt = dtypes[d];
                        sumo_op op = op_i ? SUMO_OP_AVERAGE : SUMO_OP_SUM;
                        size_t n = counts[c];
                        unsigned char *in = b->in[kind], *out = in_place ? in : b->out[kind];
                        for (size_t i = 0; i < n; i++)
                            harness_set(dt, in, i, harness_collective_value(rank, i, true));
                        sumo_result r = sumo_allreduce(in, out, n, dt, op, comm);
                        size_t wrong = 0;
                        for (size_t i = 0; r == SUMO_SUCCESS && i < n; i++)
                            wrong += harness_get(dt, out, i) != expected_sum(dt, op, size, i);
                        check(t, r == SUMO_SUCCESS && wrong == 0,
                              "allreduce %s %s count %zu %s, %s: %s, %zu wrong", dtype_names[d],
                              op_i ? "avg" : "sum", n, in_place ? "in place" : "out of place",
                              kind_names[kind], sumo_result_name(r), wrong);
                    }
}

static void copies(sumo_comm *comm, int rank, int size, const buffers *b, tally *t)
{
    size_t n = 70001;
    for (int kind = 0; kind < KINDS; kind++) {
        float *in = (float *)(void *)b->in[kind], *out = (float *)(void *)b->out[kind];
        for (int root = 0; root < size; root++) {
            for (size_t i = 0; i < n; i++) {
                in[i] = (float)harness_collective_value(rank, i, false);
                out[i] = -1;
            }
            sumo_result r = sumo_broadcast(in, out, n, SUMO_FLOAT32, root, comm);
            size_t wrong = 0;
            for (size_t i = 0; r == SUMO_SUCCESS && i < n; i++)
                wrong += out[i] != (float)harness_collective_value(root, i, false);
            check(t, r == SUMO_SUCCESS && wrong == 0, "broadcast from %d, %s: %s, %zu wrong",
                  root, kind_names[kind], sumo_result_name(r), wrong);
        }
        size_t m = n / (size_t)size;
        for (size_t i = 0; i < m; i++) in[i] = (float)harness_collective_value(rank, i, false);
        sumo_result r = sumo_allgather(in, out, m, SUMO_FLOAT32, comm);
        size_t wrong = 0;
        for (int k = 0; r == SUMO_SUCCESS && k < size; k++)
            for (size_t i = 0; i < m; i++)
                wrong += out[(size_t)k * m + i] != (float)harness_collective_value(k, i, false);
        check(t, r == SUMO_SUCCESS && wrong == 0, "allgather %zu per rank, %s: %s, %zu wrong", m,
              kind_names[kind], sumo_result_name(r), wrong);
    }
}

/* Sums over the point-to-point algorithms: messages through the mailboxes, chunked. */
static void forced(sumo_comm *comm, int rank, int size, const buffers *b, tally *t)
{
    static const int algos[] = {SUMO_ALGORITHM_RING, SUMO_ALGORITHM_RECURSIVE_DOUBLING};
    static const size_t counts[] = {3, 200003};
    for (int a = 0; a < 2; a++) {
        sumo_result r = sumo_comm_set_param(comm, SUMO_PARAM_ALGORITHM, algos[a]);
        check(t, r == SUMO_SUCCESS, "set algorithm %d: %s", algos[a], sumo_result_name(r));
        for (int d = 0; d < 4; d += 2)
            for (size_t c = 0; c < 2; c++) {
                sumo_dtype dt = dtypes[d];
                size_t n = counts[c];
                for (size_t i = 0; i < n; i++)
                    harness_set(dt, b->in[PRIVATE], i, harness_collective_value(rank, i, true));
                r = sumo_allreduce(b->in[PRIVATE], b->out[PRIVATE], n, dt, SUMO_OP_SUM, comm);
                size_t wrong = 0;
                for (size_t i = 0; r == SUMO_SUCCESS && i < n; i++)
                    wrong += harness_get(dt, b->out[PRIVATE], i) != expected_sum(dt, SUMO_OP_SUM, size, i);
                check(t, r == SUMO_SUCCESS && wrong == 0, "%s sum %s count %zu: %s, %zu wrong",
                      a ? "recursive doubling" : "ring", dtype_names[d], n, sumo_result_name(r),
                      wrong);
            }
    }
    sumo_comm_set_param(comm, SUMO_PARAM_ALGORITHM, SUMO_ALGORITHM_AUTO);
}

static uint64_t hash_bytes(const void *p, size_t n)
{
    const unsigned char *b = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* Whether every rank holds the same bits (hashes gathered as exact 32-bit halves). */
static bool same_bits(sumo_comm *comm, int size, const void *p, size_t n)
{
    uint64_t h = hash_bytes(p, n);
    double mine[2] = {(double)(h >> 32), (double)(h & 0xffffffffu)}, all[2 * MAXP];
    if (sumo_allgather(mine, all, 2, SUMO_FLOAT64, comm) != SUMO_SUCCESS) return false;
    for (int k = 0; k < size; k++)
        if (all[2 * k] != mine[0] || all[2 * k + 1] != mine[1]) return false;
    return true;
}

static void adasum(sumo_comm *comm, int rank, int size, const buffers *b, tally *t)
{
    if (size < 2) return;
    const size_t n = 100003;
    const uint64_t seed = 77;
    static const sumo_dtype kinds_dt[] = {SUMO_FLOAT32, SUMO_FLOAT64, SUMO_BFLOAT16};
    double *u[MAXP];
    for (int k = 0; k < size; k++) u[k] = malloc(n * sizeof(double));
    for (int di = 0; di < 3; di++) {
        sumo_dtype dt = kinds_dt[di];
        /* The reference: every rank's input as stored in dtype, through the tree. */
        for (int k = 0; k < size; k++)
            for (size_t i = 0; i < n; i++)
                u[k][i] = ref_round_to(dt, harness_uniform_at(seed, (uint64_t)k, i));
        size_t off[2] = {0, n};
        ref_adasum_tree(u, size, off, 1);
        for (int variant = 0; variant < KINDS + 1; variant++) {
            /* Variant KINDS: private buffers over the ring (the tree over messages). */
            int kind = variant < KINDS ? variant : PRIVATE;
            if (variant == KINDS)
                sumo_comm_set_param(comm, SUMO_PARAM_ALGORITHM, SUMO_ALGORITHM_RING);
            bool in_place = kind == SHARED;
            unsigned char *in = b->in[kind], *out = in_place ? in : b->out[kind];
            for (size_t i = 0; i < n; i++)
                harness_set(dt, in, i, harness_uniform_at(seed, (uint64_t)rank, i));
            sumo_result r = sumo_allreduce(in, out, n, dt, SUMO_OP_ADASUM, comm);
            double dd = 0, ww = 0;
            for (size_t i = 0; i < n; i++) {
                double diff = harness_get(dt, out, i) - u[0][i];
                dd += diff * diff;
                ww += u[0][i] * u[0][i];
            }
            double rel = sqrt(dd / ww);
            bool same = r == SUMO_SUCCESS && same_bits(comm, size, out, n * harness_dtype_size(dt));
            check(t, r == SUMO_SUCCESS && rel < 100 * harness_eps(dt) && same,
                  "adasum %s %s%s: %s, relative error %.3g (limit %.3g), same bits %d",
                  dtype_names[dt], kind_names[kind], variant == KINDS ? " over the ring" : "",
                  sumo_result_name(r), rel, 100 * harness_eps(dt), same);
            if (variant == KINDS)
                sumo_comm_set_param(comm, SUMO_PARAM_ALGORITHM, SUMO_ALGORITHM_AUTO);
        }
    }
    for (int k = 0; k < size; k++) free(u[k]);
}

/* Calls that fail on every rank together and leave the handle usable. */
static void refusals(sumo_comm *comm, int rank, int size, const buffers *b, tally *t)
{
    float *x = (float *)(void *)b->in[PRIVATE];
    if (size > 1) {
        size_t n = rank == 0 ? 10 : 11;
        sumo_result r = sumo_allreduce(x, x, n, SUMO_FLOAT32, SUMO_OP_SUM, comm);
        const char *m = "";
        sumo_comm_error_message(comm, &m);
        check(t, r == SUMO_ERR_MISMATCH && m[0] != '\0', "mismatched counts: %s (%s)",
              sumo_result_name(r), m);
    }
    void *p = (void *)1;
    sumo_result r = sumo_mem_alloc(comm, rank == size - 1 ? SIZE_MAX - 10 : 4096, &p);
    check(t, r == SUMO_ERR_SYSTEM && p == NULL, "an allocation no memory holds, on rank %d: %s",
          size - 1, sumo_result_name(r));
    for (size_t i = 0; i < 1000; i++) x[i] = (float)harness_collective_value(rank, i, true);
    r = sumo_allreduce(x, x, 1000, SUMO_FLOAT32, SUMO_OP_SUM, comm);
    size_t wrong = 0;
    for (size_t i = 0; r == SUMO_SUCCESS && i < 1000; i++)
        wrong += x[i] != expected_sum(SUMO_FLOAT32, SUMO_OP_SUM, size, i);
    check(t, r == SUMO_SUCCESS && wrong == 0, "usable after the refusals: %s, %zu wrong",
          sumo_result_name(r), wrong);
}

/* Everything a working group must do. */
static int battery(sumo_comm **commp, int rank, int size, group *g)
{
    sumo_comm *comm = *commp;
    tally t = {.rank = rank};
    const char *name = "";
    int rk = -1, sz = -1;
    sumo_comm_transport(comm, &name);
    sumo_comm_rank(comm, &rk);
    sumo_comm_size(comm, &sz);
    check(&t, strcmp(name, "shm") == 0 && rk == rank && sz == size, "transport %s rank %d size %d",
          name, rk, sz);
    check(&t, !own_name_exists(), "a name of this process is in /dev/shm after the creation");
    char kind = mapped_from();
    check(&t, kind == (g->named ? 'n' : 'm'), "mapped from '%c', expected '%c'", kind,
          g->named ? 'n' : 'm');
    size_t bytes = 300007 * sizeof(double);
    buffers b;
    b.in[PRIVATE] = malloc(bytes);
    b.out[PRIVATE] = malloc(bytes);
    b.in[OUT_SHARED] = b.in[PRIVATE];
    /* Each rank its own size: the layout exchange must not assume equal parts. */
    sumo_result r1 = sumo_mem_alloc(comm, bytes + (size_t)rank * 4096, (void **)&b.in[SHARED]);
    sumo_result r2 = sumo_mem_alloc(comm, bytes, (void **)&b.out[SHARED]);
    check(&t, r1 == SUMO_SUCCESS && r2 == SUMO_SUCCESS, "sumo_mem_alloc: %s, %s",
          sumo_result_name(r1), sumo_result_name(r2));
    if (r1 != SUMO_SUCCESS || r2 != SUMO_SUCCESS) return 1;
    check(&t, ((uintptr_t)b.in[SHARED] & 4095) == 0 && ((uintptr_t)b.out[SHARED] & 4095) == 0,
          "sumo_mem_alloc: not page-aligned");
    check(&t, !own_name_exists(), "a name of this process is in /dev/shm after sumo_mem_alloc");
    b.out[OUT_SHARED] = b.out[SHARED];
    sums(comm, rank, size, &b, &t);
    copies(comm, rank, size, &b, &t);
    forced(comm, rank, size, &b, &t);
    adasum(comm, rank, size, &b, &t);
    refusals(comm, rank, size, &b, &t);
    sumo_result r = sumo_mem_free(comm, b.in[SHARED]);
    check(&t, r == SUMO_SUCCESS, "sumo_mem_free: %s", sumo_result_name(r));
    /* b.out[SHARED] goes with the handle. */
    free(b.in[PRIVATE]);
    free(b.out[PRIVATE]);
    return t.failed ? 1 : 0;
}

static void test_collectives_1_to_5_processes(void **state)
{
    (void)state;
    for (int p = 1; p <= MAXP; p++) {
        group g = {.size = p, .fn = battery};
        run_group(&g);
        expect_all(&g, 0);
    }
}

static void test_named_fallback_small_staging(void **state)
{
    (void)state;
    group g = {.size = 3, .fn = battery, .named = true, .stage_bytes = 8192};
    run_group(&g);
    expect_all(&g, 0);
}

/* Rank 0 undumpable and its peers without the right to inspect any process: they cannot open
 * its memfd through /proc, and every rank must then meet over the named object. */
static int small_sums(sumo_comm **commp, int rank, int size, group *g)
{
    tally t = {.rank = rank};
    char kind = mapped_from();
    check(&t, !g->undumpable_0 || kind == 'n', "mapped from '%c', expected the named object",
          kind);
    float x[5000];
    for (size_t i = 0; i < 5000; i++) x[i] = (float)harness_collective_value(rank, i, true);
    sumo_result r = sumo_allreduce(x, x, 5000, SUMO_FLOAT32, SUMO_OP_SUM, *commp);
    size_t wrong = 0;
    for (size_t i = 0; r == SUMO_SUCCESS && i < 5000; i++)
        wrong += x[i] != expected_sum(SUMO_FLOAT32, SUMO_OP_SUM, size, i);
    check(&t, r == SUMO_SUCCESS && wrong == 0, "sum: %s, %zu wrong", sumo_result_name(r), wrong);
    return t.failed ? 1 : 0;
}

static void test_undumpable_rank_0(void **state)
{
    (void)state;
    group g = {.size = 3, .fn = small_sums, .undumpable_0 = true};
    run_group(&g);
    expect_all(&g, 0);
}

/* ---- the transport's messages ---------------------------------------------------------------- */

static unsigned char pattern(int from, size_t bytes, size_t i)
{
    return (unsigned char)(from * 31 + bytes * 7 + i * 13 + (i >> 8));
}

/* sendrecv itself (what the collectives build on): around a ring at sizes about the 64 KiB
 * chunks, one direction only, to itself, then a size disagreement, which must fail with both
 * sizes and break the group. */
static int messages(sumo_comm **commp, int rank, int size, group *g)
{
    (void)g;
    tally t = {.rank = rank};
    sumo__transport *tp = (*commp)->tp;
    static const size_t sizes[] = {0, 1, 65535, 65536, 65537, 262151, (1 << 20) + 3};
    unsigned char *sb = malloc((1 << 20) + 3), *rb = malloc((1 << 20) + 3);
    int right = (rank + 1) % size, left = (rank + size - 1) % size;
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t n = sizes[k];
        for (size_t i = 0; i < n; i++) sb[i] = pattern(rank, n, i);
        memset(rb, 0xee, n);
        sumo_result r = tp->ops->sendrecv(tp, sb, n, right, rb, n, left);
        size_t wrong = 0;
        for (size_t i = 0; r == SUMO_SUCCESS && i < n; i++) wrong += rb[i] != pattern(left, n, i);
        check(&t, r == SUMO_SUCCESS && wrong == 0, "ring of %zu bytes: %s, %zu wrong", n,
              sumo_result_name(r), wrong);
    }
    /* Rank 0 sends to rank 1, which only receives; the others sit it out. */
    size_t n = 300001;
    for (size_t i = 0; i < n; i++) sb[i] = pattern(rank, n, i);
    sumo_result r = SUMO_SUCCESS;
    if (rank == 0) r = tp->ops->sendrecv(tp, sb, n, 1, NULL, 0, -1);
    if (rank == 1) r = tp->ops->sendrecv(tp, NULL, 0, -1, rb, n, 0);
    size_t wrong = 0;
    for (size_t i = 0; rank == 1 && r == SUMO_SUCCESS && i < n; i++) wrong += rb[i] != pattern(0, n, i);
    check(&t, r == SUMO_SUCCESS && wrong == 0, "one way: %s, %zu wrong", sumo_result_name(r), wrong);
    /* To itself, more than the mailbox holds at once. */
    r = tp->ops->sendrecv(tp, sb, n, rank, rb, n, rank);
    check(&t, r == SUMO_SUCCESS && memcmp(sb, rb, n) == 0, "to itself: %s", sumo_result_name(r));
    r = tp->ops->barrier(tp);
    check(&t, r == SUMO_SUCCESS, "barrier: %s", sumo_result_name(r));
    /* Rank 0 sends 100 bytes, rank 1 expects 200. */
    if (rank == 0) r = tp->ops->sendrecv(tp, sb, 100, 1, NULL, 0, -1);
    if (rank == 1) {
        r = tp->ops->sendrecv(tp, NULL, 0, -1, rb, 200, 0);
        const char *m = "";
        sumo_comm_error_message(*commp, &m);
        check(&t, r == SUMO_ERR_INTERNAL && strstr(m, "expected 200 bytes, peer sent 100"),
              "a size disagreement: %s (%s)", sumo_result_name(r), m);
    } else {
        /* Rank 1 broke the group: everyone else hears of it. */
        r = tp->ops->barrier(tp);
        check(&t, r == SUMO_ERR_PEER_FAILURE, "barrier after the disagreement: %s",
              sumo_result_name(r));
    }
    free(sb);
    free(rb);
    return t.failed ? 1 : 0;
}

static void test_transport_messages(void **state)
{
    (void)state;
    group g = {.size = 3, .fn = messages, .timeout = "60"};
    run_group(&g);
    expect_all(&g, 0);
}

/* ---- a rank dies --------------------------------------------------------------------------- */

/* Allreduces until one fails; rank 0 signals the parent after the first. Exits with
 * EXIT_RESULT + the failure (a rank never failing gives up after a minute). */
static int until_failure(sumo_comm **commp, int rank, int size, group *g)
{
    (void)size;
    size_t n = (size_t)1 << 20;
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = (float)harness_collective_value(rank, i, true);
    double start = now_s();
    sumo_result r = SUMO_SUCCESS;
    for (int k = 0; r == SUMO_SUCCESS && now_s() - start < 60; k++) {
        r = sumo_allreduce(x, x, n, SUMO_FLOAT32, SUMO_OP_AVERAGE, *commp);
        if (k == 0 && rank == 0) signal_ready(g);
    }
    const char *m = "";
    sumo_comm_error_message(*commp, &m);
    fprintf(stderr, "rank %d after %.2f s: %s (%s)\n", rank, now_s() - start, sumo_result_name(r), m);
    free(x);
    return EXIT_RESULT + (int)r;
}

static void kill_rank_1(group *g)
{
    struct pollfd p = {.fd = g->ready[0], .events = POLLIN};
    char b;
    if (poll(&p, 1, 120000) == 1 && read(g->ready[0], &b, 1) == 1) {
        nanosleep(&(struct timespec){0, 50000000}, NULL);
        kill(g->pid[1], SIGKILL);
    }
    g->killed_at = now_s();
}

static void check_killed(const group *g)
{
    for (int r = 0; r < g->size; r++) {
        int want = r == 1 ? -SIGKILL : EXIT_RESULT + SUMO_ERR_PEER_FAILURE;
        if (g->status[r] != want) fprintf(stderr, "rank %d ended with %d\n", r, g->status[r]);
        assert_int_equal(g->status[r], want);
    }
    /* The deadline is 120 s: ending well before it is the liveness check, not the deadline. */
    double after = g->ended_at - g->killed_at;
    fprintf(stderr, "the survivors ended %.2f s after the kill\n", after);
    assert_true(after < 60);
}

static void test_killed_rank_staged(void **state)
{
    (void)state;
    group g = {.size = 3, .fn = until_failure, .timeout = "120", .parent_hook = kill_rank_1};
    run_group(&g);
    check_killed(&g);
}

static int until_failure_ring(sumo_comm **commp, int rank, int size, group *g)
{
    sumo_comm_set_param(*commp, SUMO_PARAM_ALGORITHM, SUMO_ALGORITHM_RING);
    return until_failure(commp, rank, size, g);
}

static void test_killed_rank_messages_named(void **state)
{
    (void)state;
    group g = {.size = 4, .fn = until_failure_ring, .timeout = "120", .named = true,
               .parent_hook = kill_rank_1};
    run_group(&g);
    check_killed(&g);
}

/* Rank 0 is killed while it waits for rank 2 to attach: rank 1, attached and waiting for rank
 * 0's word, and rank 2, arriving after the death, both fail at once instead of at the
 * deadline. */
static int never_runs(sumo_comm **commp, int rank, int size, group *g)
{
    (void)commp;
    (void)size;
    (void)g;
    fprintf(stderr, "rank %d: created a communicator without rank 0\n", rank);
    return 1;
}

static void kill_rank_0_once_1_attached(group *g)
{
    char path[256];
    /* The file store's name for the key "test/attach/0/1". */
    snprintf(path, sizeof path, "%s/k.test_2Fattach_2F0_2F1", g->dir);
    for (double start = now_s(); access(path, F_OK) != 0 && now_s() - start < 120;)
        nanosleep(&(struct timespec){0, 5000000}, NULL);
    kill(g->pid[0], SIGKILL);
    g->killed_at = now_s();
}

static void test_rank_0_dies_while_meeting(void **state)
{
    (void)state;
    group g = {.size = 3, .fn = never_runs, .timeout = "120", .late_rank = 2, .late_ms = 1500,
               .parent_hook = kill_rank_0_once_1_attached};
    run_group(&g);
    assert_int_equal(g.status[0], -SIGKILL);
    assert_int_equal(g.status[1], EXIT_RESULT + SUMO_ERR_PEER_FAILURE);
    assert_int_equal(g.status[2], EXIT_RESULT + SUMO_ERR_PEER_FAILURE);
    double after = g.ended_at - g.killed_at;
    fprintf(stderr, "the others ended %.2f s after the kill\n", after);
    assert_true(after < 60);
}

/* ---- leaving ------------------------------------------------------------------------------- */

/* Rank 2 leaves after a collective; ranks 0 and 1 then wait on it in the next one and fail at
 * once; rank 1 leaves; rank 0 stays a while after every peer has gone, still reads its shared
 * buffer, and destroys its handle cleanly. */
static int leaving(sumo_comm **commp, int rank, int size, group *g)
{
    (void)g;
    tally t = {.rank = rank};
    float *x = NULL;
    sumo_result r = sumo_mem_alloc(*commp, 4096 * sizeof(float), (void **)&x);
    check(&t, r == SUMO_SUCCESS, "sumo_mem_alloc: %s", sumo_result_name(r));
    if (r != SUMO_SUCCESS) return 1;
    for (size_t i = 0; i < 4096; i++) x[i] = (float)harness_collective_value(rank, i, true);
    r = sumo_allreduce(x, x, 4096, SUMO_FLOAT32, SUMO_OP_SUM, *commp);
    check(&t, r == SUMO_SUCCESS, "first allreduce: %s", sumo_result_name(r));
    if (rank == 2) {
        r = sumo_comm_destroy(*commp);
        *commp = NULL;
        check(&t, r == SUMO_SUCCESS, "rank 2's destroy: %s", sumo_result_name(r));
        return t.failed ? 1 : 0;
    }
    double start = now_s();
    r = sumo_allreduce(x, x, 4096, SUMO_FLOAT32, SUMO_OP_SUM, *commp);
    double waited = now_s() - start;
    check(&t, r == SUMO_ERR_PEER_FAILURE && waited < 30, "waiting on a rank that left: %s after %.2f s",
          sumo_result_name(r), waited);
    if (rank == 0) {
        nanosleep(&(struct timespec){0, 500000000}, NULL);
        size_t wrong = 0;
        for (size_t i = 0; i < 4096; i++)
            wrong += x[i] != expected_sum(SUMO_FLOAT32, SUMO_OP_SUM, size, i);
        check(&t, wrong == 0, "the first sum in shared memory after the peers left: %zu wrong",
              wrong);
    }
    start = now_s();
    r = sumo_comm_destroy(*commp);
    *commp = NULL;
    check(&t, r == SUMO_SUCCESS && now_s() - start < 5, "rank %d's destroy: %s after %.2f s",
          rank, sumo_result_name(r), now_s() - start);
    return t.failed ? 1 : 0;
}

static void test_leave_early_and_linger(void **state)
{
    (void)state;
    group g = {.size = 3, .fn = leaving, .timeout = "120"};
    run_group(&g);
    expect_all(&g, 0);
}

/* ---- creation failures (in this process) ----------------------------------------------------- */

static sumo_result create_alone(file_store *fs, const char *prefix, int rank, int size,
                                char *err, size_t errlen, sumo_comm **comm)
{
    sumo_shm_options o = {.struct_size = sizeof o, .rank = rank, .size = size,
                          .store = &fs->store, .key_prefix = prefix, .error = err,
                          .error_bytes = errlen};
    return sumo_comm_create_shm(&o, comm);
}

static void test_store_never_delivers(void **state)
{
    (void)state;
    char dir[160];
    make_store_dir(dir, sizeof dir);
    setenv("SUMO_TIMEOUT", "1", 1);
    setenv("SUMO_SHM_NAMED", "1", 1);
    file_store fs;
    file_store_init(&fs, dir);
    pid_t me = getpid();
    for (int c = 0; c < 3; c++) {
        /* rank 0 whose peer never attaches; rank 1 whose rank 0 never publishes; a store whose
         * get never delivers anything. */
        fs.never = c == 2;
        char err[256] = "";
        sumo_comm *comm = (sumo_comm *)&fs;
        double start = now_s();
        char prefix[32];
        snprintf(prefix, sizeof prefix, "alone%d/", c);
        sumo_result r = create_alone(&fs, prefix, c == 1 ? 1 : 0, 2, err, sizeof err, &comm);
        double took = now_s() - start;
        fprintf(stderr, "case %d: %s after %.2f s: %s\n", c, sumo_result_name(r), took, err);
        assert_int_equal(r, SUMO_ERR_TIMEOUT);
        assert_null(comm);
        assert_non_null(strstr(err, "store key"));
        assert_non_null(strstr(err, "SUMO_TIMEOUT"));
        assert_true(took > 0.9 && took < 30);
        assert_int_equal(leftovers(&me, 1), 0);
    }
    unsetenv("SUMO_TIMEOUT");
    unsetenv("SUMO_SHM_NAMED");
    remove_dir(dir);
}

static void test_options_refused(void **state)
{
    (void)state;
    file_store fs;
    file_store_init(&fs, "/nonexistent");
    char err[256];
    sumo_comm *comm = (sumo_comm *)&fs;
    sumo_shm_options good = {.struct_size = sizeof good, .rank = 0, .size = 1,
                             .store = &fs.store, .key_prefix = "x/", .error = err,
                             .error_bytes = sizeof err};
    sumo_shm_options o = good;
    o.struct_size = sizeof o + 8;
    strcpy(err, "untouched");
    assert_int_equal(sumo_comm_create_shm(&o, &comm), SUMO_ERR_INVALID_ARGUMENT);
    assert_null(comm);
    /* An options struct of another size is not written into. */
    assert_string_equal(err, "untouched");
    sumo_shm_options bad[5];
    for (int i = 0; i < 5; i++) bad[i] = good;
    bad[0].store = NULL;
    bad[1].rank = 1;
    bad[2].size = 0;
    bad[3].stage_bytes = 5000;
    bad[4].key_prefix = NULL;
    for (int i = 0; i < 5; i++) {
        err[0] = '\0';
        assert_int_equal(sumo_comm_create_shm(&bad[i], &comm), SUMO_ERR_INVALID_ARGUMENT);
        assert_true(strlen(err) > 10);
    }
    sumo_store other = fs.store;
    other.struct_size = 8;
    o = good;
    o.store = &other;
    assert_int_equal(sumo_comm_create_shm(&o, &comm), SUMO_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "struct_size"));
    assert_int_equal(sumo_comm_create_shm(NULL, &comm), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_comm_create_shm(&good, NULL), SUMO_ERR_INVALID_ARGUMENT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_options_refused),
        cmocka_unit_test(test_store_never_delivers),
        cmocka_unit_test(test_transport_messages),
        cmocka_unit_test(test_collectives_1_to_5_processes),
        cmocka_unit_test(test_named_fallback_small_staging),
        cmocka_unit_test(test_undumpable_rank_0),
        cmocka_unit_test(test_killed_rank_staged),
        cmocka_unit_test(test_killed_rank_messages_named),
        cmocka_unit_test(test_leave_early_and_linger),
        cmocka_unit_test(test_rank_0_dies_while_meeting),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
