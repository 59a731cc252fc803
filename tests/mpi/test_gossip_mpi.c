/*
 * Gossip rounds (sumo_gossip.h) over MPI, with the node's shared memory and without it: every
 * rank computes every rank's push-sum in double from the graph's definition (the dynamic
 * directed exponential graph, one and two peers a round) and checks its own numerator and
 * weight after every round; an overlapped run (staleness 1) against the same reference with
 * the shares added one call later; and, for a power of two ranks, the exact mean after log2 P
 * rounds.
 *
 * The overlapped calls run with the caller's own MPI traffic between them (check's
 * MPI_Allreduce, while a round is in flight). Run as `test_gossip_mpi single`, MPI gives
 * MPI_THREAD_SINGLE, under which no thread but the caller's may call MPI: the MPI calls sumo
 * makes are counted by thread (the test defines MPI_Isend, MPI_Irecv and MPI_Testall over
 * their PMPI entries), and every one must come from the main thread; under
 * MPI_THREAD_MULTIPLE (the default) the overlapped rounds must move on sumo's progress thread.
 */
#include "check.h"

#include "sumo.h"
#include "sumo_gossip.h"
#include "sumo_mpi.h"
#include "support/harness.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define N 1000
#define ROUNDS 6
#define MAXP 64

#define OVERLAP_CALLS 24

/* MPI calls made on a thread other than main's. */
static pthread_t g_main;
static atomic_int g_foreign;

static void count_thread(void)
{
    if (!pthread_equal(pthread_self(), g_main)) atomic_fetch_add(&g_foreign, 1);
}

int MPI_Isend(const void *buf, int count, MPI_Datatype type, int dest, int tag, MPI_Comm comm,
              MPI_Request *request)
{
    count_thread();
    return PMPI_Isend(buf, count, type, dest, tag, comm, request);
}

int MPI_Irecv(void *buf, int count, MPI_Datatype type, int source, int tag, MPI_Comm comm,
              MPI_Request *request)
{
    count_thread();
    return PMPI_Irecv(buf, count, type, source, tag, comm, request);
}

int MPI_Testall(int count, MPI_Request requests[], int *flag, MPI_Status statuses[])
{
    count_thread();
    return PMPI_Testall(count, requests, flag, statuses);
}

static double input(int r, size_t i) { return harness_uniform_at(11, (uint64_t)r, i); }

/* Rank r's distinct out-peers in round k: r + j (p+1)^i, j = 1..p, i = k mod (K + 1). */
static int outs(int n, int p, int k, int r, int *out)
{
    int K = 0, m = 0;
    long long b = p + 1;
    while (b <= n - 1) K++, b *= p + 1;
    long long s = 1;
    for (int i = 0; i < k % (K + 1); i++) s *= p + 1;
    for (int j = 1; j <= p; j++) {
        int to = (int)((r + j * s) % n);
        bool dup = to == r;
        for (int q = 0; q < m; q++) dup |= out[q] == to;
        if (!dup) out[m++] = to;
    }
    return m;
}

static void ref_round(int n, int p, int k, double (*x)[N], double *w)
{
    static double nx[MAXP][N];
    double nw[MAXP] = {0};
    memset(nx, 0, sizeof nx);
    for (int r = 0; r < n; r++) {
        int out[MAXP], m = outs(n, p, k, r, out);
        for (int q = -1; q < m; q++) {
            int to = q < 0 ? r : out[q];
            for (int i = 0; i < N; i++) nx[to][i] += x[r][i] / (m + 1);
            nw[to] += w[r] / (m + 1);
        }
    }
    memcpy(x, nx, (size_t)n * sizeof nx[0]);
    memcpy(w, nw, (size_t)n * sizeof *w);
}

static void run_suite(sumo_comm *comm, const char *where)
{
    static double X[MAXP][N];
    char what[200];
    int n = g_size;
    for (int p = 1; p <= 2 && p < n; p++) {
        sumo_gossip_options o;
        sumo_gossip_options_default(&o);
        o.peers = p;
        sumo_gossip *g = NULL;
        check(sumo_gossip_create(comm, N, SUMO_FLOAT64, &o, &g) == SUMO_SUCCESS, "create");
        if (g == NULL) return;
        double x[N], W[MAXP];
        for (int r = 0; r < n; r++) {
            W[r] = 1;
            for (int i = 0; i < N; i++) X[r][i] = input(r, (size_t)i);
        }
        for (int i = 0; i < N; i++) x[i] = X[g_rank][i];
        for (int k = 0; k < ROUNDS; k++) {
            sumo_result res = sumo_gossip_round(g, x);
            ref_round(n, p, k, X, W);
            double w, err = 0;
            sumo_gossip_weight(g, &w);
            for (int i = 0; i < N; i++) err = fmax(err, fabs(x[i] - X[g_rank][i]));
            snprintf(what, sizeof what, "%s: p %d round %d against push-sum (err %g, w %.17g)",
                     where, p, k, err, w);
            check(res == SUMO_SUCCESS && err < 1e-13 && w == 1.0, what);
        }
        sumo_gossip_destroy(g);
    }
    /* Overlapped, staleness 1: after call t the shares of the round started at t - 1 are in. */
    sumo_gossip *g = NULL;
    check(sumo_gossip_create(comm, N, SUMO_FLOAT64, NULL, &g) == SUMO_SUCCESS, "create overlap");
    if (g == NULL) return;
    double x[N], W[MAXP], sent[MAXP][N], sw[MAXP];
    for (int r = 0; r < n; r++) {
        W[r] = 1;
        for (int i = 0; i < N; i++) X[r][i] = input(r, (size_t)i);
    }
    for (int i = 0; i < N; i++) x[i] = X[g_rank][i];
    for (int t = 0; t < OVERLAP_CALLS; t++) {
        int c = 0;
        sumo_result res = sumo_gossip_overlap(g, x, &c);
        if (t > 0) {
            int out[MAXP];
            for (int r = 0; r < n; r++) {
                outs(n, 1, t - 1, r, out);
                for (int i = 0; i < N; i++) X[out[0]][i] += sent[r][i];
                W[out[0]] += sw[r];
            }
        }
        for (int r = 0; r < n; r++) {
            for (int i = 0; i < N; i++) X[r][i] /= 2, sent[r][i] = X[r][i];
            W[r] /= 2, sw[r] = W[r];
        }
        double w, err = 0;
        sumo_gossip_weight(g, &w);
        for (int i = 0; i < N; i++) err = fmax(err, fabs(x[i] - X[g_rank][i]));
        snprintf(what, sizeof what, "%s: overlapped call %d (err %g, w %.17g)", where, t, err, w);
        check(res == SUMO_SUCCESS && c == 1 && err < 1e-13 && w == W[g_rank], what);
    }
    check(sumo_gossip_finish(g, x) == SUMO_SUCCESS, "finish");
    sumo_gossip_destroy(g);
    /* A power of two: the exact mean after log2 P rounds (dyadic shares, fp32). */
    if ((n & (n - 1)) == 0) {
        float f[N];
        for (int i = 0; i < N; i++) f[i] = (float)((g_rank * 5 + i) % 13 - 6);
        sumo_gossip *h = NULL;
        check(sumo_gossip_create(comm, N, SUMO_FLOAT32, NULL, &h) == SUMO_SUCCESS, "create fp32");
        for (int k = 1; k < n; k *= 2) check(sumo_gossip_round(h, f) == SUMO_SUCCESS, "round fp32");
        bool exact = true;
        for (int i = 0; i < N; i++) {
            double mean = 0;
            for (int r = 0; r < n; r++) mean += (r * 5 + i) % 13 - 6;
            exact &= (double)f[i] == mean / n;
        }
        snprintf(what, sizeof what, "%s: exact mean after log2 %d rounds", where, n);
        check(exact, what);
        sumo_gossip_destroy(h);
    }
}

int main(int argc, char **argv)
{
    g_main = pthread_self();
    bool single = argc > 1 && strcmp(argv[1], "single") == 0;
    int provided = MPI_THREAD_SINGLE;
    MPI_Init_thread(&argc, &argv, single ? MPI_THREAD_SINGLE : MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    check(single || provided == MPI_THREAD_MULTIPLE, "MPI gives MPI_THREAD_MULTIPLE");
    sumo_comm *shm = NULL, *p2p = NULL;
    check(sumo_comm_create_mpi(MPI_COMM_WORLD, &shm) == SUMO_SUCCESS, "create");
    setenv("SUMO_MPI_SHM", "0", 1);
    check(sumo_comm_create_mpi(MPI_COMM_WORLD, &p2p) == SUMO_SUCCESS, "create without shm");
    unsetenv("SUMO_MPI_SHM");
    if (g_size <= MAXP) {
        if (shm) run_suite(shm, "shared-memory node");
        if (p2p) run_suite(p2p, "point-to-point");
    }
    int foreign = atomic_load(&g_foreign);
    char what[160];
    snprintf(what, sizeof what, "%s: %d MPI calls of sumo's on a thread not main's",
             single ? "MPI_THREAD_SINGLE" : "MPI_THREAD_MULTIPLE", foreign);
    check(single ? foreign == 0 : foreign > 0, what);
    sumo_comm_destroy(shm);
    sumo_comm_destroy(p2p);
    if (g_rank == 0)
        printf("test_gossip_mpi (%d ranks, %s): %d passed, %d failed\n", g_size,
               single ? "MPI_THREAD_SINGLE" : "MPI_THREAD_MULTIPLE", g_passed, g_failed);
    MPI_Finalize();
    return g_failed ? 1 : 0;
}
