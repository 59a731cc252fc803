/*
 * Allreduce time on the shm transport (sumo_shm.h): P forked processes that meet through a
 * small store in memory they inherit, the way torchrun's processes meet through a TCPStore.
 * Timed as `sumo bench` times: fp32, in place, one fill then warm-up and timed iterations,
 * each between two rounds of a barrier of the benchmark's own (not sumo's), from the last
 * rank's start to the last rank's end; the median and minimum are printed, so the rows can
 * sit next to `mpirun -np P build/sumo bench --ranks P --ops sum,adasum`.
 *
 *   build/bench/shm_allreduce [--ranks P] [--sizes 1M,64M] [--ops sum,adasum]
 *                             [--iters N] [--warmup W] [--shared-buffers] [--no-pin]
 */
#include "sumo_shm.h"

#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_RANKS 64
#define MAX_SIZES 16
#define MAX_ITERS 1000
#define ENTRIES 256

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* ---- what the processes share: a store and a barrier, in memory mapped before the fork ---- */

typedef struct entry {
    char key[128];
    size_t bytes;
    unsigned char value[1024];
} entry;

typedef struct shared {
    atomic_flag lock;
    int n;
    entry e[ENTRIES];
    _Atomic int arrived, generation;
    /* stamps[iteration][rank]: start and end, ns */
    int64_t start[MAX_ITERS][MAX_RANKS], end[MAX_ITERS][MAX_RANKS];
    int failed;
} shared;

static void lock(shared *s)
{
    while (atomic_flag_test_and_set(&s->lock)) sched_yield();
}

static sumo_result store_set(void *ctx, const char *key, const void *value, size_t bytes)
{
    shared *s = ctx;
    if (strlen(key) >= sizeof s->e[0].key || bytes > sizeof s->e[0].value) return SUMO_ERR_SYSTEM;
    lock(s);
    sumo_result r = SUMO_ERR_SYSTEM;
    if (s->n < ENTRIES) {
        entry *e = &s->e[s->n];
        strcpy(e->key, key);
        e->bytes = bytes;
        memcpy(e->value, value, bytes);
        /* Published by the unlock's release: a reader sees the entry whole. */
        s->n++;
        r = SUMO_SUCCESS;
    }
    atomic_flag_clear(&s->lock);
    return r;
}

static sumo_result store_get(void *ctx, const char *key, void *value, size_t *bytes,
                             int64_t deadline_ns)
{
    shared *s = ctx;
    for (;;) {
        lock(s);
        for (int i = 0; i < s->n; i++) {
            if (strcmp(s->e[i].key, key) != 0) continue;
            memcpy(value, s->e[i].value, s->e[i].bytes < *bytes ? s->e[i].bytes : *bytes);
            *bytes = s->e[i].bytes;
            atomic_flag_clear(&s->lock);
            return SUMO_SUCCESS;
        }
        atomic_flag_clear(&s->lock);
        if (now_ns() >= deadline_ns) return SUMO_ERR_TIMEOUT;
        nanosleep(&(struct timespec){0, 100000}, NULL);
    }
}

static void sync_ranks(shared *s, int size)
{
    int gen = atomic_load(&s->generation);
    if (atomic_fetch_add(&s->arrived, 1) + 1 == size) {
        atomic_store(&s->arrived, 0);
        atomic_store(&s->generation, gen + 1);
        return;
    }
    while (atomic_load(&s->generation) == gen) sched_yield();
}

/* ---- options -------------------------------------------------------------------------------- */

typedef struct opts {
    int ranks, iters, warmup, nsizes;
    size_t sizes[MAX_SIZES];
    bool sum, adasum, shared_buffers, pin;
} opts;

static size_t parse_size(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    size_t mult = *end == 'K' ? 1024 : *end == 'M' ? 1024 * 1024 : *end == 'G' ? 1024 * 1024 * 1024 : 1;
    return (size_t)(v * (double)mult);
}

static int parse(int argc, char **argv, opts *o)
{
    *o = (opts){.ranks = 2, .iters = 20, .warmup = 5, .nsizes = 2,
                .sizes = {1024 * 1024, 64 * 1024 * 1024}, .sum = true, .adasum = true,
                .pin = true};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--shared-buffers") == 0 || strcmp(a, "--no-pin") == 0) {
            if (a[2] == 's') o->shared_buffers = true;
            else o->pin = false;
            continue;
        }
        if (v == NULL) return -1;
        i++;
        if (strcmp(a, "--ranks") == 0) o->ranks = atoi(v);
        else if (strcmp(a, "--iters") == 0) o->iters = atoi(v);
        else if (strcmp(a, "--warmup") == 0) o->warmup = atoi(v);
        else if (strcmp(a, "--ops") == 0) {
            o->sum = strstr(v, "sum") != NULL;
            o->adasum = strstr(v, "adasum") != NULL;
        } else if (strcmp(a, "--sizes") == 0) {
            char buf[256];
            snprintf(buf, sizeof buf, "%s", v);
            o->nsizes = 0;
            for (char *t = strtok(buf, ","); t && o->nsizes < MAX_SIZES; t = strtok(NULL, ","))
                o->sizes[o->nsizes++] = parse_size(t);
        } else return -1;
    }
    bool ok = o->ranks >= 1 && o->ranks <= MAX_RANKS && o->iters >= 1 && o->iters <= MAX_ITERS &&
              o->warmup >= 0 && o->warmup <= MAX_ITERS && o->nsizes > 0;
    return ok ? 0 : -1;
}

/* ---- one rank ------------------------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int rank_main(shared *s, const opts *o, int rank)
{
    /* One process per CPU, round robin, as mpirun binds its ranks (and sumo bench its
     * threads): two ranks never share a core while another one idles. */
    if (o->pin) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(rank % (int)sysconf(_SC_NPROCESSORS_ONLN), &set);
        sched_setaffinity(0, sizeof set, &set);
    }
    sumo_store store = {.struct_size = sizeof store, .ctx = s, .set = store_set, .get = store_get};
    char err[256] = "";
    sumo_shm_options so = {.struct_size = sizeof so, .rank = rank, .size = o->ranks,
                           .store = &store, .key_prefix = "bench/", .error = err,
                           .error_bytes = sizeof err};
    sumo_comm *comm = NULL;
    sumo_result r = sumo_comm_create_shm(&so, &comm);
    if (r != SUMO_SUCCESS) {
        fprintf(stderr, "rank %d: sumo_comm_create_shm: %s (%s)\n", rank, sumo_result_name(r), err);
        return 1;
    }
    size_t most = 0;
    for (int i = 0; i < o->nsizes; i++) most = o->sizes[i] > most ? o->sizes[i] : most;
    float *buf = NULL;
    if (o->shared_buffers) r = sumo_mem_alloc(comm, most, (void **)&buf);
    else buf = aligned_alloc(4096, (most + 4095) / 4096 * 4096);
    if (buf == NULL || r != SUMO_SUCCESS) {
        fprintf(stderr, "rank %d: no buffer of %zu bytes\n", rank, most);
        return 1;
    }
    if (rank == 0)
        printf("# shm transport, P = %d, fp32, in place, %s buffers, %s; time = median of %d "
               "iterations after %d warm-up, from the last rank's start to the last rank's end\n"
               "#%11s %7s %11s %11s %12s\n",
               o->ranks, o->shared_buffers ? "sumo_mem_alloc" : "private",
               o->pin ? "one process per cpu" : "not pinned", o->iters, o->warmup,
               "size(B)", "redop", "time(us)", "min(us)", "busbw(GB/s)");
    for (int si = 0; si < o->nsizes; si++)
        for (int op_i = 0; op_i < 2; op_i++) {
            if ((op_i == 0 && !o->sum) || (op_i == 1 && !o->adasum)) continue;
            sumo_op op = op_i ? SUMO_OP_ADASUM : SUMO_OP_SUM;
            size_t count = o->sizes[si] / sizeof(float);
            uint64_t x = 0x9e3779b97f4a7c15ull * (uint64_t)(rank + 1);
            for (size_t i = 0; i < count; i++) {
                x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                buf[i] = (float)((double)(x >> 11) * 0x1p-52 - 1.0);
            }
            for (int it = -o->warmup; it < o->iters; it++) {
                sync_ranks(s, o->ranks);
                int64_t t0 = now_ns();
                r = sumo_allreduce(buf, buf, count, SUMO_FLOAT32, op, comm);
                int64_t t1 = now_ns();
                if (r != SUMO_SUCCESS) {
                    const char *m = "";
                    sumo_comm_error_message(comm, &m);
                    fprintf(stderr, "rank %d: allreduce: %s (%s)\n", rank, sumo_result_name(r), m);
                    s->failed = 1;
                }
                if (it >= 0) {
                    s->start[it][rank] = t0;
                    s->end[it][rank] = t1;
                }
            }
            sync_ranks(s, o->ranks);
            if (rank == 0) {
                double d[MAX_ITERS];
                for (int it = 0; it < o->iters; it++) {
                    int64_t a = s->start[it][0], b = s->end[it][0];
                    for (int k = 1; k < o->ranks; k++) {
                        a = s->start[it][k] > a ? s->start[it][k] : a;
                        b = s->end[it][k] > b ? s->end[it][k] : b;
                    }
                    d[it] = (double)(b - a) / 1e3;
                }
                qsort(d, (size_t)o->iters, sizeof d[0], cmp_double);
                double med = o->iters % 2 ? d[o->iters / 2] : 0.5 * (d[o->iters / 2 - 1] + d[o->iters / 2]);
                double busbw = (double)o->sizes[si] / (med * 1e3) * 2.0 * (o->ranks - 1) / o->ranks;
                printf("%12zu %7s %11.1f %11.1f %12.2f\n", o->sizes[si], op_i ? "adasum" : "sum",
                       med, d[0], busbw);
                fflush(stdout);
            }
            sync_ranks(s, o->ranks);
        }
    if (o->shared_buffers) sumo_mem_free(comm, buf);
    else free(buf);
    sumo_comm_destroy(comm);
    return s->failed;
}

int main(int argc, char **argv)
{
    opts o;
    if (parse(argc, argv, &o) != 0) {
        fprintf(stderr, "usage: %s [--ranks P] [--sizes 1M,64M] [--ops sum,adasum] [--iters N] "
                        "[--warmup W] [--shared-buffers] [--no-pin]\n", argv[0]);
        return 2;
    }
    shared *s = mmap(NULL, sizeof *s, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (s == MAP_FAILED) return 1;
    atomic_flag_clear(&s->lock);
    fflush(NULL);
    pid_t pids[MAX_RANKS];
    for (int r = 0; r < o.ranks; r++) {
        pids[r] = fork();
        if (pids[r] < 0) return 1;
        if (pids[r] == 0) {
            int rc = rank_main(s, &o, r);
            fflush(NULL);
            _exit(rc);
        }
    }
    int bad = 0;
    for (int r = 0; r < o.ranks; r++) {
        int st;
        if (waitpid(pids[r], &st, 0) != pids[r] || !WIFEXITED(st) || WEXITSTATUS(st) != 0) bad = 1;
    }
    munmap(s, sizeof *s);
    return bad;
}
