/*
 * test_cuda: ranks in separate processes (forked, meeting through a store of files, the shm
 * transport) on emulated device buffers shared by the emulated IPC of cuda/ipc_cuda.c (memfd
 * allocations a peer opens through /proc), the path torchrun's processes take on a GPU:
 *   - sum, average, Adasum (Gram form and tree), broadcast, allgather and reduce-scatter at
 *     P = 2, 3, 4: every rank's output bit-identical; sum and average equal to a sequential
 *     reference bit for bit and to the threads transport on the same inputs; Adasum within the
 *     tree's bound of the float64 reference and bit-identical to the threads transport (same
 *     direct algorithm); the others exact;
 *   - the direct algorithms ran (each rank's debug log says so) and no staging did;
 *   - a table without share entries, and a rank whose buffer cannot be shared, are refused
 *     on every rank with the reason, the handle staying usable;
 *   - nothing named is left in /dev/shm.
 */
#include "cuda_test.h"

#include "sumo_shm.h"
#include "support/shm_names.h"
#include "support/temp_dir.h"

#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { K_SUM, K_AVG, K_ADASUM, K_BCAST, K_GATHER, K_RSCAT };
static const char *K_NAME[] = {"sum", "average", "Adasum", "broadcast", "allgather",
                               "reduce_scatter"};

typedef struct ipc_case {
    int kind;
    sumo_dtype dt;
    bool in_place;
    size_t n; /* count as the call names it */
} ipc_case;

static const ipc_case CASES[] = {
    {K_SUM, SUMO_FLOAT32, false, 30001},   {K_SUM, SUMO_BFLOAT16, true, 30001},
    {K_AVG, SUMO_FLOAT16, false, 30001},   {K_AVG, SUMO_FLOAT64, true, 20011},
    {K_ADASUM, SUMO_FLOAT32, false, 20011}, /* Gram form */
    {K_ADASUM, SUMO_BFLOAT16, true, 20011}, {K_ADASUM, SUMO_FLOAT64, false, 20011}, /* tree */
    {K_BCAST, SUMO_FLOAT32, false, 5003},  {K_GATHER, SUMO_FLOAT16, false, 4099},
    {K_RSCAT, SUMO_FLOAT32, false, 4099},
};
#define NCASES (sizeof CASES / sizeof CASES[0])
#define IPC_MAXP 4

static size_t in_elems(const ipc_case *c, int P)
{
    return c->kind == K_RSCAT ? c->n * (size_t)P : c->n;
}
static size_t out_elems(const ipc_case *c, int P)
{
    return c->kind == K_GATHER ? c->n * (size_t)P : c->n;
}

static double input_value(const ipc_case *c, int rank, size_t i)
{
    return c->kind == K_ADASUM ? harness_uniform_at(17, (uint64_t)rank, i)
                               : harness_collective_value(rank, i, false);
}

/* Memory for one run: the processes' shareable memfd blocks, or the threads' arena. */
typedef struct memory {
    sumo_cuda_kernels *k; /* NULL: the arena (m_alloc) */
} memory;

static void *mem_alloc(const memory *m, size_t bytes)
{
    if (m->k == NULL) return m_alloc(M_EMU, bytes);
    void *p = NULL;
    if (sumo_cuda__emu_shared_alloc(m->k, bytes, &p) != SUMO_SUCCESS) abort();
    return p;
}

static void mem_free(const memory *m, void *p)
{
    if (m->k == NULL) m_free(M_EMU, p);
    else sumo_cuda__emu_shared_free(m->k, p);
}

/* One case on one rank; the output (out_elems) into out. */
static sumo_result run_case(sumo_comm *comm, int rank, int P, const ipc_case *c,
                            const memory *m, unsigned char *out)
{
    size_t e = esz(c->dt), nin = in_elems(c, P), nout = out_elems(c, P);
    size_t in_bytes = nin * e, out_bytes = nout * e;
    unsigned char *send = mem_alloc(m, in_bytes + 64), *recv = mem_alloc(m, out_bytes + 64);
    for (size_t i = 0; i < nin; i++) harness_set(c->dt, send, i, input_value(c, rank, i));
    /* The receive buffer starts as garbage: a rank that skipped a write shows. */
    memset(recv, 0x5a, out_bytes);
    void *dst = c->in_place ? send : recv;
    sumo_collective call = {.struct_size = sizeof call, .sendbuf = send, .recvbuf = dst,
                            .count = c->n, .dtype = c->dt};
    switch (c->kind) {
    case K_SUM: call.kind = SUMO_COLLECTIVE_ALLREDUCE, call.op = SUMO_OP_SUM; break;
    case K_AVG: call.kind = SUMO_COLLECTIVE_ALLREDUCE, call.op = SUMO_OP_AVERAGE; break;
    case K_ADASUM: call.kind = SUMO_COLLECTIVE_ALLREDUCE, call.op = SUMO_OP_ADASUM; break;
    case K_BCAST: call.kind = SUMO_COLLECTIVE_BROADCAST, call.root = P - 1; break;
    case K_GATHER: call.kind = SUMO_COLLECTIVE_ALLGATHER; break;
    default: call.kind = SUMO_COLLECTIVE_REDUCE_SCATTER, call.op = SUMO_OP_SUM; break;
    }
    sumo_result r = sumo_collective_run(comm, &call);
    memcpy(out, dst, out_bytes);
    mem_free(m, send);
    mem_free(m, recv);
    return r;
}

/* ---- the processes -------------------------------------------------------------------------- */

/* What the ranks leave for the parent: a result code and an output per case and rank. */
typedef struct shared_results {
    size_t slot; /* bytes of one output */
    sumo_result res[NCASES][IPC_MAXP];
    char msg[IPC_MAXP][256];
    int failed[IPC_MAXP];
    unsigned char data[]; /* [case][rank] outputs */
} shared_results;

static unsigned char *slot_of(shared_results *s, size_t c, int r)
{
    return s->data + (c * IPC_MAXP + (size_t)r) * s->slot;
}

enum { SCENARIO_CASES, SCENARIO_NO_SHARE, SCENARIO_ONE_PRIVATE };

typedef struct ipc_group {
    int P;
    int scenario;
    char dir[160];
    shared_results *out;
} ipc_group;

/* A claims() that also takes one private block (the rank whose buffer cannot be shared). */
typedef struct claims_both {
    sumo_cuda_kernels *k;
    const unsigned char *priv;
    size_t priv_bytes;
} claims_both;

static bool claims_with_private(void *ctx, const void *ptr, size_t bytes)
{
    const claims_both *cb = ctx;
    const unsigned char *p = ptr;
    if (cb->priv && p >= cb->priv && p + bytes <= cb->priv + cb->priv_bytes) return true;
    return sumo_cuda__emu_shared_owns(cb->k, ptr, bytes);
}

static int child_fail(shared_results *s, int rank, const char *what, sumo_result r)
{
    snprintf(s->msg[rank], sizeof s->msg[rank], "%s: %s", what, sumo_result_name(r));
    return 1;
}

static int ipc_child(ipc_group *g, int rank)
{
    shared_results *s = g->out;
    char log[200];
    /* The debug log says which algorithm ran: into a file the parent reads. */
    snprintf(log, sizeof log, "%s/log.%d", g->dir, rank);
    FILE *f = freopen(log, "w", stderr);
    if (f == NULL) return 2;
    setenv("SUMO_DEBUG", "INFO", 1);
    sumo_store *store = NULL;
    sumo_result r = sumo_store_create_dir(g->dir, &store);
    if (r != SUMO_SUCCESS) return child_fail(s, rank, "store", r);
    char err[256] = "";
    sumo_shm_options o = {.struct_size = sizeof o, .rank = rank, .size = g->P, .store = store,
                          .key_prefix = "ipc/", .error = err, .error_bytes = sizeof err};
    sumo_comm *comm = NULL;
    r = sumo_comm_create_shm(&o, &comm);
    sumo_store_destroy_dir(store, 0);
    if (r != SUMO_SUCCESS) return child_fail(s, rank, err, r);
    sumo_cuda_kernels *k = NULL;
    claims_both cb = {0};
    r = sumo_cuda__kernels_create_emulated(claims_with_private, &cb, &k);
    cb.k = k;
    if (r == SUMO_SUCCESS && g->scenario != SCENARIO_NO_SHARE) r = sumo_cuda__kernels_emulate_ipc(k);
    if (r == SUMO_SUCCESS) r = sumo_comm_add_cuda(comm, k);
    if (r != SUMO_SUCCESS) return child_fail(s, rank, "kernels", r);
    memory m = {.k = k};
    if (g->scenario == SCENARIO_CASES) {
        for (size_t c = 0; c < NCASES; c++) {
            s->res[c][rank] = run_case(comm, rank, g->P, &CASES[c], &m, slot_of(s, c, rank));
            if (s->res[c][rank] != SUMO_SUCCESS) break;
        }
    } else if (g->scenario == SCENARIO_NO_SHARE) {
        /* Memory the plain emulated table claims but cannot share. */
        float *buf = aligned_alloc(64, 4096);
        memset(buf, 0, 4096);
        cb.priv = (const unsigned char *)buf;
        cb.priv_bytes = 4096;
        s->res[0][rank] = sumo_allreduce(buf, buf, 1024, SUMO_FLOAT32, SUMO_OP_SUM, comm);
        free(buf);
    } else {
        /* Rank 1's buffer is claimed but private: every rank refuses the call alike and the
         * handle stays usable for the next, shared, one. */
        size_t bytes = 4096;
        unsigned char *priv = aligned_alloc(64, bytes);
        cb.priv = priv;
        cb.priv_bytes = bytes;
        void *shared = mem_alloc(&m, bytes);
        void *buf = rank == 1 ? (void *)priv : shared;
        memset(buf, 0, bytes);
        s->res[0][rank] = sumo_allreduce(buf, buf, 1024, SUMO_FLOAT32, SUMO_OP_SUM, comm);
        const char *msg = "";
        sumo_comm_error_message(comm, &msg);
        snprintf(s->msg[rank], sizeof s->msg[rank], "%s", msg);
        for (size_t i = 0; i < 1024; i++) ((float *)shared)[i] = (float)(rank + 1);
        s->res[1][rank] = sumo_allreduce(shared, shared, 1024, SUMO_FLOAT32, SUMO_OP_SUM, comm);
        memcpy(slot_of(s, 1, rank), shared, 1024 * sizeof(float));
        mem_free(&m, shared);
        free(priv);
    }
    if (g->scenario != SCENARIO_ONE_PRIVATE) {
        const char *msg = "";
        sumo_comm_error_message(comm, &msg);
        snprintf(s->msg[rank], sizeof s->msg[rank], "%s", msg);
    }
    r = sumo_comm_destroy(comm);
    sumo_cuda_kernels_destroy(k);
    fflush(stderr);
    return r == SUMO_SUCCESS ? 0 : 3;
}

/* Lines of a rank's log that hold needle. */
static int log_count(const char *dir, int rank, const char *needle)
{
    char path[200], line[512];
    snprintf(path, sizeof path, "%s/log.%d", dir, rank);
    FILE *f = fopen(path, "r");
    if (f == NULL) return -1;
    int n = 0;
    while (fgets(line, sizeof line, f)) n += strstr(line, needle) != NULL;
    fclose(f);
    return n;
}

/* Forks the group and waits (killing it after 60 s: a hang); false when a child failed. The
 * logs stay in g->dir until remove_dir. */
static bool run_group(ipc_group *g, pid_t *pids, int *status)
{
    if (!make_temp_dir(g->dir, sizeof g->dir, "ipc")) return false;
    fflush(NULL);
    for (int r = 0; r < g->P; r++) {
        pids[r] = fork();
        if (pids[r] == 0) _exit(ipc_child(g, r));
    }
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    bool ok = true;
    for (int r = 0; r < g->P; r++) {
        int st = 0;
        for (;;) {
            pid_t w = pids[r] > 0 ? waitpid(pids[r], &st, WNOHANG) : -1;
            if (w != 0) break;
            clock_gettime(CLOCK_MONOTONIC, &t);
            if (t.tv_sec - t0.tv_sec > 60)
                for (int q = 0; q < g->P; q++)
                    if (pids[q] > 0) kill(pids[q], SIGKILL);
            nanosleep(&(struct timespec){0, 2000000}, NULL);
        }
        status[r] = pids[r] > 0 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        ok = ok && status[r] == 0;
    }
    return ok;
}

static shared_results *results_new(size_t slot)
{
    size_t bytes = sizeof(shared_results) + NCASES * IPC_MAXP * slot;
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) abort();
    shared_results *s = p;
    s->slot = slot;
    return s;
}

static void results_free(shared_results *s)
{
    munmap(s, sizeof(shared_results) + NCASES * IPC_MAXP * s->slot);
}

/* ---- the references ------------------------------------------------------------------------- */

typedef struct threads_job {
    const ipc_case *c;
    unsigned char *out[IPC_MAXP];
    sumo_result res[IPC_MAXP];
} threads_job;

static void threads_rank(sumo_comm *comm, int rank, int size, void *arg)
{
    threads_job *j = arg;
    memory m = {NULL};
    j->res[rank] = sumo_comm_add_kernels(comm, g_emu_table);
    if (j->res[rank] == SUMO_SUCCESS)
        j->res[rank] = run_case(comm, rank, size, j->c, &m, j->out[rank]);
}

/* Adasum's float64 reference through the tree: the relative error of got, tensor-wide. */
static double adasum_error(const ipc_case *c, int P, const unsigned char *got)
{
    double *u[IPC_MAXP];
    size_t off[2] = {0, c->n};
    double in_norm = 0, dd = 0;
    for (int r = 0; r < P; r++) {
        u[r] = malloc(c->n * sizeof(double));
        for (size_t i = 0; i < c->n; i++) {
            u[r][i] = ref_round_to(c->dt, input_value(c, r, i));
            in_norm += u[r][i] * u[r][i];
        }
    }
    ref_adasum_tree(u, P, off, 1);
    for (size_t i = 0; i < c->n; i++) {
        double d = harness_get(c->dt, got, i) - u[0][i];
        dd += d * d;
    }
    for (int r = 0; r < P; r++) free(u[r]);
    return sqrt(dd / in_norm);
}

/* Element i of the documented result on `rank`, from every rank's input. */
static double expected(const ipc_case *c, int P, int rank, size_t i)
{
    double v[IPC_MAXP];
    switch (c->kind) {
    case K_BCAST: return ref_round_to(c->dt, input_value(c, P - 1, i));
    case K_GATHER: return ref_round_to(c->dt, input_value(c, (int)(i / c->n), i % c->n));
    case K_RSCAT:
        for (int r = 0; r < P; r++)
            v[r] = ref_round_to(c->dt, input_value(c, r, (size_t)rank * c->n + i));
        return ref_round_to(c->dt, ref_sum_in_order(c->dt, v, P, 1));
    default:
        for (int r = 0; r < P; r++) v[r] = ref_round_to(c->dt, input_value(c, r, i));
        return ref_round_to(c->dt, ref_sum_in_order(c->dt, v, P, c->kind == K_AVG ? P : 1));
    }
}

static void check_group(int P)
{
    size_t slot = 0;
    for (size_t c = 0; c < NCASES; c++)
    {
        size_t b = out_elems(&CASES[c], IPC_MAXP) * esz(CASES[c].dt);
        if (b > slot) slot = b;
    }
    shared_results *s = results_new(slot);
    ipc_group g = {.P = P, .scenario = SCENARIO_CASES, .out = s};
    pid_t pids[IPC_MAXP];
    int status[IPC_MAXP];
    bool ran = run_group(&g, pids, status);
    int left = leftovers(pids, P);
    /* Every case but Adasum says it ran direct; Adasum says so in its own line; nothing was
     * staged into the outputs or through the areas. */
    int cases = 0, adasums = 0;
    for (size_t c = 0; c < NCASES; c++) {
        cases += CASES[c].kind != K_ADASUM;
        adasums += CASES[c].kind == K_ADASUM;
    }
    bool direct = true;
    for (int r = 0; r < P; r++)
        direct = direct && log_count(g.dir, r, "every rank's buffers are shared, direct") == cases &&
                 log_count(g.dir, r, "groups of 1, direct") == adasums &&
                 log_count(g.dir, r, "point to point") == 0 &&
                 log_count(g.dir, r, "reduced there") == 0 &&
                 log_count(g.dir, r, "combined there") == 0;
    remove_dir(g.dir);
    if (!ran) {
        for (int r = 0; r < P; r++)
            if (status[r] != 0) fprintf(stderr, "rank %d of %d: exit %d: %s\n", r, P, status[r], s->msg[r]);
    }
    CHECK(ran, "P %d: a rank failed", P);
    CHECK(left == 0, "P %d: %d names left in /dev/shm", P, left);
    CHECK(direct, "P %d: a rank's log does not show the direct algorithms (or shows staging)", P);
    for (size_t ci = 0; ci < NCASES; ci++) {
        const ipc_case *c = &CASES[ci];
        size_t nout = out_elems(c, P), bytes = nout * esz(c->dt);
        threads_job tj = {.c = c};
        for (int r = 0; r < P; r++) tj.out[r] = malloc(bytes + 64);
        int th = harness_run_threads(P, threads_rank, &tj);
        bool ok = true;
        for (int r = 0; r < P && ok; r++) {
            const unsigned char *got = slot_of(s, ci, r);
            if (s->res[ci][r] != SUMO_SUCCESS || th != 0 || tj.res[r] != SUMO_SUCCESS) {
                fprintf(stderr, "%s %s P %d rank %d: %s (%s); threads %s\n", K_NAME[c->kind],
                        sumo_dtype_name(c->dt),
                        P, r, sumo_result_name(s->res[ci][r]), s->msg[r], sumo_result_name(tj.res[r]));
                ok = false;
                break;
            }
            /* Reduce-scatter's outputs are each rank's own segment. */
            if (c->kind != K_RSCAT && memcmp(got, slot_of(s, ci, 0), bytes) != 0) {
                fprintf(stderr, "%s P %d: rank %d's output differs from rank 0's\n", K_NAME[c->kind], P, r);
                ok = false;
            }
            size_t at = first_diff(c->dt, got, tj.out[r], nout);
            if (at != SIZE_MAX) {
                fprintf(stderr, "%s P %d rank %d: differs from the threads transport at %zu\n",
                        K_NAME[c->kind], P, r, at);
                ok = false;
            }
            if (c->kind == K_ADASUM) {
                int levels = 0;
                while ((1 << levels) < P) levels++;
                double err = adasum_error(c, P, got), tol = 8.0 * (levels + 1) * harness_eps(c->dt);
                if (!(err <= tol)) {
                    fprintf(stderr, "Adasum P %d rank %d: error %.3g over %.3g\n", P, r, err, tol);
                    ok = false;
                }
                continue;
            }
            for (size_t i = 0; i < nout && ok; i++) {
                double want = expected(c, P, r, i), have = harness_get(c->dt, got, i);
                if (!(want == have || (isnan(want) && isnan(have)))) {
                    fprintf(stderr, "%s P %d rank %d element %zu: %.9g, expected %.9g\n",
                            K_NAME[c->kind], P, r, i, have, want);
                    ok = false;
                }
            }
        }
        for (int r = 0; r < P; r++) free(tj.out[r]);
        CHECK(ok, "case %zu (%s) at P %d", ci, K_NAME[c->kind], P);
    }
    results_free(s);
}

void t_ipc_emulated_collectives(void)
{
    for (int P = 2; P <= IPC_MAXP; P++) {
        int before = g_failed_checks;
        check_group(P);
        if (g_failed_checks != before) return;
    }
}

/* A table without share entries, and one rank whose buffer its table cannot share. */
void t_ipc_emulated_refusals(void)
{
    shared_results *s = results_new(4096);
    ipc_group g = {.P = 2, .scenario = SCENARIO_NO_SHARE, .out = s};
    pid_t pids[IPC_MAXP];
    int status[IPC_MAXP];
    bool ran = run_group(&g, pids, status);
    remove_dir(g.dir);
    CHECK(ran, "no-share group: %s / %s", s->msg[0], s->msg[1]);
    for (int r = 0; r < 2; r++) {
        CHECK(s->res[0][r] == SUMO_ERR_INVALID_USAGE, "rank %d: %s", r, sumo_result_name(s->res[0][r]));
        CHECK(strstr(s->msg[r], "cannot share that memory") != NULL, "rank %d: %s", r, s->msg[r]);
    }
    CHECK(leftovers(pids, 2) == 0, "names left in /dev/shm");
    results_free(s);

    s = results_new(4096);
    g = (ipc_group){.P = 3, .scenario = SCENARIO_ONE_PRIVATE, .out = s};
    ran = run_group(&g, pids, status);
    remove_dir(g.dir);
    CHECK(ran, "one-private group: %s / %s / %s", s->msg[0], s->msg[1], s->msg[2]);
    for (int r = 0; r < 3; r++) {
        CHECK(s->res[0][r] == SUMO_ERR_INVALID_USAGE, "rank %d: %s", r, sumo_result_name(s->res[0][r]));
        CHECK(strstr(s->msg[r], "rank 1 could not share its cuda buffers") != NULL, "rank %d: %s",
              r, s->msg[r]);
        CHECK(s->res[1][r] == SUMO_SUCCESS, "rank %d: the next call: %s", r,
              sumo_result_name(s->res[1][r]));
        const float *out = (const float *)(const void *)slot_of(s, 1, r);
        for (size_t i = 0; i < 1024; i++) CHECK(out[i] == 6.0f, "rank %d [%zu] = %g", r, i, out[i]);
    }
    CHECK(strstr(s->msg[1], "emulated device memory not from a shareable allocation") != NULL,
          "rank 1 says why: %s", s->msg[1]);
    CHECK(leftovers(pids, 3) == 0, "names left in /dev/shm");
    results_free(s);
}
