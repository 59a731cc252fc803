/*
 * The shm transport (sumo_shm.h) between real processes, working: each test forks its ranks
 * (support/shm_group.h).
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
 *     with the same bits on every rank; so do small Adasum calls (one tensor and a bucket)
 *     back to back and between sums and allgathers, each on new inputs, which end without a
 *     barrier;
 *   - many sumo_mem_alloc buffers of mixed sizes, reduced in turn and started together, each
 *     reach their own memory on every peer (a region that ends where a buffer starts is not
 *     its region);
 *   - ranks passing different counts all get SUMO_ERR_MISMATCH and can go on; an allocation
 *     one rank cannot make fails on every rank and leaves the handle usable;
 *   - the named fallback (SUMO_SHM_NAMED=1) works and removes its names as soon as every rank
 *     mapped them; a rank 0 that forbids inspection (undumpable) still meets its peers;
 *   - after every test, no object named for any of its processes is left in /dev/shm.
 *
 * Its failures (ranks that die or leave, creation that cannot complete) are tested in
 * test_shm_procs_failures.c.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "collectives/comm.h"
#include "sumo_shm.h"
#include "support/harness.h"
#include "support/reference.h"
#include "support/shm_group.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

/* Adasum as a reduce-scatter in FSDP2's layout (each tensor padded with zeros to a multiple of
 * P, row q of the send buffer holding chunk q of every tensor): each rank's shard against the
 * tree, padding exactly 0, from private and from sumo_mem_alloc buffers, the same bits. */
static void adasum_rs(sumo_comm *comm, int rank, int size, const buffers *b, tally *t)
{
    const size_t counts[3] = {5, 1000, 3};
    size_t padded[3], chunk[3], before[3], off[4] = {0}, rc = 0, P = (size_t)size;
    for (int k = 0; k < 3; k++) {
        padded[k] = (counts[k] + P - 1) / P * P;
        chunk[k] = padded[k] / P;
        before[k] = rc;
        rc += chunk[k];
        off[k + 1] = off[k] + counts[k];
    }
    double *u[MAXP];
    for (int k = 0; k < size; k++) {
        u[k] = calloc(off[3], sizeof(double));
        for (size_t i = 0; i < off[3]; i++)
            u[k][i] = ref_round_to(SUMO_FLOAT32, harness_uniform_at(91, (uint64_t)k, i));
    }
    ref_adasum_tree(u, size, off, 3);
    sumo_adasum_options o = {.struct_size = sizeof o, .tensor_counts = padded, .ntensors = 3};
    sumo_op op;
    check(t, sumo_op_create_adasum(comm, &o, &op) == SUMO_SUCCESS, "adasum_rs: op");
    float first[4096];
    for (int kind = PRIVATE; kind <= SHARED; kind++) {
        float *in = (float *)(void *)b->in[kind], *out = (float *)(void *)b->out[kind];
        memset(in, 0, P * rc * sizeof *in);
        for (int k = 0; k < 3; k++)
            for (size_t i = 0; i < counts[k]; i++)
                in[(i / chunk[k]) * rc + before[k] + i % chunk[k]] =
                    (float)harness_uniform_at(91, (uint64_t)rank, off[k] + i);
        sumo_result r = sumo_reduce_scatter(in, out, rc, SUMO_FLOAT32, op, comm);
        double err = 0, norm = 0;
        bool pad = true;
        for (int k = 0; k < 3; k++)
            for (size_t j = 0; j < chunk[k]; j++) {
                size_t i = (size_t)rank * chunk[k] + j;
                double got = out[before[k] + j];
                if (i >= counts[k]) pad &= got == 0.0;
                else err += (got - u[0][off[k] + i]) * (got - u[0][off[k] + i]),
                     norm += u[0][off[k] + i] * u[0][off[k] + i];
            }
        bool same = kind == PRIVATE || memcmp(first, out, rc * sizeof *out) == 0;
        if (kind == PRIVATE) memcpy(first, out, rc * sizeof *out);
        check(t, r == SUMO_SUCCESS && pad && same && sqrt(err) <= 100 * 0x1p-23 * sqrt(norm),
              "adasum reduce_scatter %s: %s, error %.3g, padding 0 %d, same bits %d",
              kind_names[kind], sumo_result_name(r), sqrt(err), pad, same);
    }
    sumo_op_destroy(comm, op);
    for (int k = 0; k < size; k++) free(u[k]);
}

/*
 * A small Adasum call ends without a barrier (gram.c, run_small): a rank may copy its next
 * call's input into its area while its peers still read the last call's. Calls of every
 * staged kind in a row, small Adasum calls back to back among them (one tensor and a bucket
 * of 37), each on inputs of its own, so that a half rewritten too early shows as a wrong
 * result; with more ranks than cores, a rank is often descheduled in the middle of its reads.
 */
static void back_to_back(sumo_comm *comm, int rank, int size, tally *t)
{
    if (size < 2) return;
    enum { MAXN = 1500, TENSORS = 37, CALLS = 400 };
    float *x = malloc(MAXN * sizeof(float)), *gathered = malloc((size_t)size * MAXN * sizeof(float));
    double *u[MAXP];
    for (int k = 0; k < size; k++) u[k] = malloc(MAXN * sizeof(double));
    size_t counts[TENSORS], off[TENSORS + 1] = {0};
    for (size_t k = 0; k < TENSORS; k++) {
        counts[k] = 5 + (k * 7) % 31;
        off[k + 1] = off[k] + counts[k];
    }
    sumo_adasum_options o;
    sumo_adasum_options_default(&o);
    o.tensor_counts = counts;
    o.ntensors = TENSORS;
    sumo_op bucket;
    sumo_result made = sumo_op_create_adasum(comm, &o, &bucket);
    check(t, made == SUMO_SUCCESS, "sumo_op_create_adasum: %s", sumo_result_name(made));
    size_t wrong_calls = 0, first_wrong = SIZE_MAX;
    /* Every output's bits, compared across the ranks once at the end: a comparison after each
     * call would put an allgather between any two Adasum calls. */
    uint64_t outputs = 0;
    for (int call = 0; made == SUMO_SUCCESS && call < CALLS; call++) {
        /* Three Adasum calls in four, so most follow another; the fourth a sum or allgather. */
        int kind = call % 8 == 3 ? 2 : call % 8 == 7 ? 3 : call % 2;
        size_t n = kind == 1 ? off[TENSORS] : (size_t)(200 + (call * 131) % (MAXN - 200));
        for (size_t i = 0; i < n; i++)
            x[i] = (float)(kind >= 2 ? harness_collective_value(rank, i + (size_t)call, true)
                                     : harness_uniform_at((uint64_t)call, (uint64_t)rank, i));
        sumo_result r;
        bool right = true;
        if (kind <= 1) {
            r = sumo_allreduce(x, x, n, SUMO_FLOAT32, kind == 1 ? bucket : SUMO_OP_ADASUM, comm);
            for (int k = 0; k < size; k++)
                for (size_t i = 0; i < n; i++)
                    u[k][i] = ref_round_to(SUMO_FLOAT32, harness_uniform_at((uint64_t)call, (uint64_t)k, i));
            size_t one[2] = {0, n};
            ref_adasum_tree(u, size, kind == 1 ? off : one, kind == 1 ? TENSORS : 1);
            double dd = 0, ww = 0;
            for (size_t i = 0; i < n; i++) {
                dd += (x[i] - u[0][i]) * (x[i] - u[0][i]);
                ww += u[0][i] * u[0][i];
            }
            right = r == SUMO_SUCCESS && sqrt(dd / ww) < 100 * harness_eps(SUMO_FLOAT32);
            outputs = outputs * 31 + hash_bytes(x, n * sizeof(float));
        } else if (kind == 2) {
            r = sumo_allreduce(x, x, n, SUMO_FLOAT32, SUMO_OP_SUM, comm);
            for (size_t i = 0; r == SUMO_SUCCESS && i < n; i++)
                right = right && x[i] == expected_sum(SUMO_FLOAT32, SUMO_OP_SUM, size, i + (size_t)call);
            right = right && r == SUMO_SUCCESS;
        } else {
            r = sumo_allgather(x, gathered, n, SUMO_FLOAT32, comm);
            for (int k = 0; r == SUMO_SUCCESS && k < size; k++)
                for (size_t i = 0; i < n; i++)
                    right = right && gathered[(size_t)k * n + i] ==
                                         (float)harness_collective_value(k, i + (size_t)call, true);
            right = right && r == SUMO_SUCCESS;
        }
        if (!right && wrong_calls++ == 0) first_wrong = (size_t)call;
    }
    check(t, wrong_calls == 0, "back to back: %zu of %d calls wrong, the first call %zu",
          wrong_calls, CALLS, first_wrong);
    check(t, made != SUMO_SUCCESS || same_bits(comm, size, &outputs, sizeof outputs),
          "back to back: the Adasum outputs' bits differ between the ranks");
    if (made == SUMO_SUCCESS) sumo_op_destroy(comm, bucket);
    for (int k = 0; k < size; k++) free(u[k]);
    free(x);
    free(gathered);
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

/* Many sumo_mem_alloc buffers of mixed sizes, reduced one after the other, blocking and
 * started together: the kernel tends to map a small part right below a larger one, and a
 * buffer's address must then find its own region, not the one that ends where it starts (each
 * buffer's values say which buffer they came from). */
static void many_mapped(sumo_comm *comm, int rank, int size, tally *t)
{
    enum { NBUF = 24 };
    float *buf[NBUF];
    size_t n[NBUF];
    for (int i = 0; i < NBUF; i++) {
        n[i] = i % 2 ? 64 : 4096; /* 16 KiB, then a page: what placed them back to back here */
        sumo_result r = sumo_mem_alloc(comm, n[i] * sizeof(float), (void **)&buf[i]);
        check(t, r == SUMO_SUCCESS, "sumo_mem_alloc of buffer %d: %s", i, sumo_result_name(r));
        if (r != SUMO_SUCCESS) return;
    }
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < NBUF; i++)
            for (size_t j = 0; j < n[i]; j++) buf[i][j] = (float)(1000 * i + 10 * rank + (int)(j % 7));
        sumo_request *req[NBUF];
        for (int i = 0; i < NBUF; i++) {
            sumo_result r = pass == 0 ? sumo_allreduce(buf[i], buf[i], n[i], SUMO_FLOAT32, SUMO_OP_SUM, comm)
                                      : sumo_allreduce_start(buf[i], buf[i], n[i], SUMO_FLOAT32, SUMO_OP_SUM,
                                                             comm, &req[i]);
            check(t, r == SUMO_SUCCESS, "%s of buffer %d: %s", pass ? "start" : "allreduce", i,
                  sumo_result_name(r));
            if (r != SUMO_SUCCESS) return;
        }
        for (int i = 0; pass == 1 && i < NBUF; i++) {
            sumo_result r = sumo_request_wait(req[i]);
            check(t, r == SUMO_SUCCESS, "wait for buffer %d: %s", i, sumo_result_name(r));
        }
        for (int i = 0; i < NBUF; i++) {
            size_t wrong = 0, first = 0;
            for (size_t j = 0; j < n[i]; j++) {
                /* Sums of small integers: exact in fp32 whatever the order. */
                float want = (float)(size * (1000 * i + (int)(j % 7)) + 10 * size * (size - 1) / 2);
                if (buf[i][j] != want && wrong++ == 0) first = j;
            }
            check(t, wrong == 0, "%s: buffer %d of %zu elements: %zu wrong, the first at %zu (%g)",
                  pass ? "started together" : "blocking", i, n[i], wrong, first, (double)buf[i][first]);
        }
    }
    for (int i = 0; i < NBUF; i++) sumo_mem_free(comm, buf[i]);
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
    adasum_rs(comm, rank, size, &b, &t);
    back_to_back(comm, rank, size, &t);
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
        /* Every rank met: the meeting's keys have served, and went (the verdict stays). */
        assert_int_equal(g.served_keys, 0);
    }
}

static int many_mapped_group(sumo_comm **commp, int rank, int size, group *g)
{
    (void)g;
    tally t = {.rank = rank};
    many_mapped(*commp, rank, size, &t);
    return t.failed ? 1 : 0;
}

/* In fresh processes, whose mappings the kernel lays out from a clean address space. */
static void test_many_mapped_buffers(void **state)
{
    (void)state;
    for (int p = 2; p <= 3; p++) {
        group g = {.size = p, .fn = many_mapped_group};
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
int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_transport_messages),
        cmocka_unit_test(test_collectives_1_to_5_processes),
        cmocka_unit_test(test_many_mapped_buffers),
        cmocka_unit_test(test_named_fallback_small_staging),
        cmocka_unit_test(test_undumpable_rank_0),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
