/*
 * sumo's per-element kernels against the STREAM loop that moves the same kind of traffic, with
 * 1 and 2 threads (the counts the goal of docs/design/experiments.md is stated for: each
 * kernel at >= 80% of its loop, measured in the same run). These are internals: the public
 * API reaches them only inside whole collectives, where communication would hide their
 * bandwidth, so they are measured here, beside gram_bw, and not by `sumo bench`.
 *
 *   kernel_bw [MiB per operand (64)] [reps (9)] [dtype fp32|fp64|fp16|bf16]
 *
 * Rows (operand-sized transfers counted as STREAM does, without write-allocate):
 *   reduce_multi 2 in/2 out, in place   4 transfers, against a+=b
 *   reduce_multi a+=b (2 in/1 out)      3, against a+=b
 *   dot_norms                           2, against the dot loop
 *   scaled_add a=ca*a+cb*b              3, against a+=b
 *   dot_norms, scaled_add on 1000 tensors (one call per tensor, as a model's layout has)
 * The kernel and its loop run in alternation, rep by rep, and the medians are compared.
 */
#include "kernels/kernels.h"

#include "bench_util.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAXT 2
#define MAXREPS 99
#define NTENSORS 1000
#define CACHELINE 64

/* ---- the STREAM loops (fp64, plain C) ----------------------------------------------------- */

/*
 * They are held up against the kernels, so they must pull bandwidth through one core as well
 * as the kernels do: x86-64 builds clone them for AVX2, picked at load time when the CPU has
 * it. Each step covers one cache line, a block whose trip count the compiler knows (GCC's -O2
 * vectoriser leaves loops of unknown count scalar).
 */
#if defined(__x86_64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
#define STREAM_LOOP __attribute__((target_clones("avx2", "default")))
#else
#define STREAM_LOOP
#endif

#define LINE_DOUBLES (CACHELINE / sizeof(double))

STREAM_LOOP static void add(double *restrict a, const double *restrict b, size_t n)
{
    size_t i = 0;
    for (; i + LINE_DOUBLES <= n; i += LINE_DOUBLES)
        for (size_t k = 0; k < LINE_DOUBLES; k++) a[i + k] += b[i + k];
    for (; i < n; i++) a[i] += b[i];
}

/* Eight partial sums, one per double of a cache line: without reassociation that is what lets
 * the compiler keep them in vector registers. */
STREAM_LOOP static double dot(const double *restrict a, const double *restrict b, size_t n)
{
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        s0 += a[i] * b[i];
        s1 += a[i + 1] * b[i + 1];
        s2 += a[i + 2] * b[i + 2];
        s3 += a[i + 3] * b[i + 3];
        s4 += a[i + 4] * b[i + 4];
        s5 += a[i + 5] * b[i + 5];
        s6 += a[i + 6] * b[i + 6];
        s7 += a[i + 7] * b[i + 7];
    }
    for (; i < n; i++) s0 += a[i] * b[i];
    return ((s0 + s4) + (s1 + s5)) + ((s2 + s6) + (s3 + s7));
}

/* ---- the rows ----------------------------------------------------------------------------- */

enum { BOUND_ADD, BOUND_DOT };
enum { K_REDUCE_2X2, K_REDUCE_2X1, K_DOT_NORMS, K_SCALED_ADD, K_DOT_NORMS_T, K_SCALED_ADD_T, NKERNELS };

typedef struct kernel_row {
    const char *name;
    int passes; /* operand-sized transfers of one run */
    int bound;
    bool tensors;
} kernel_row;

static const kernel_row rows[NKERNELS] = {
    [K_REDUCE_2X2] = {"reduce_multi 2 in/2 out, in place", 4, BOUND_ADD, false},
    [K_REDUCE_2X1] = {"reduce_multi a+=b (2 in/1 out)", 3, BOUND_ADD, false},
    [K_DOT_NORMS] = {"dot_norms", 2, BOUND_DOT, false},
    [K_SCALED_ADD] = {"scaled_add a=ca*a+cb*b", 3, BOUND_ADD, false},
    [K_DOT_NORMS_T] = {"dot_norms, 1000 tensors", 2, BOUND_DOT, true},
    [K_SCALED_ADD_T] = {"scaled_add, 1000 tensors", 3, BOUND_ADD, true},
};

static const int bound_passes[] = {[BOUND_ADD] = 3, [BOUND_DOT] = 2};
static const char *const bound_names[] = {[BOUND_ADD] = "a+=b", [BOUND_DOT] = "dot"};

typedef struct shared {
    int T, kernel;
    bool run_bound; /* this run: the kernel's STREAM loop instead of the kernel */
    sumo_dtype dt;
    size_t esz, bytes;          /* per operand */
    unsigned char *ka, *kb;     /* the kernel's operands */
    double *sa, *sb;            /* the loop's, as many bytes */
    pthread_barrier_t start, end;
    volatile int quit;
    double sink[MAXT];
} shared;

typedef struct targ {
    shared *s;
    int id;
} targ;

/* Part `id` of n units of `unit` elements: whole cache lines, so no two threads share one. */
static void part(size_t n, size_t unit, int T, int id, size_t *lo, size_t *hi)
{
    size_t lines = (n + unit - 1) / unit;
    size_t a = lines * (size_t)id / (size_t)T * unit, b = lines * (size_t)(id + 1) / (size_t)T * unit;
    *lo = a < n ? a : n;
    *hi = b < n ? b : n;
}

static double run_bound(shared *s, int id)
{
    size_t n = s->bytes / sizeof(double), lo, hi;
    part(n, LINE_DOUBLES, s->T, id, &lo, &hi);
    if (rows[s->kernel].bound == BOUND_DOT) return dot(s->sa + lo, s->sb + lo, hi - lo);
    add(s->sa + lo, s->sb + lo, hi - lo);
    return 0;
}

static double run_range(shared *s, size_t lo, size_t hi)
{
    unsigned char *a = s->ka + lo * s->esz, *b = s->kb + lo * s->esz;
    double out[3] = {0, 0, 0};
    switch (s->kernel) {
    case K_REDUCE_2X2: case K_REDUCE_2X1: {
        void *outs[2] = {a, b};
        const void *ins[2] = {a, b};
        sumo__reduce_multi(s->dt, outs, s->kernel == K_REDUCE_2X2 ? 2 : 1, ins, 2, hi - lo, 1);
        return 0;
    }
    case K_DOT_NORMS: case K_DOT_NORMS_T:
        sumo__kernel_dot_norms(s->dt, a, b, hi - lo, out);
        return out[0] + out[1] + out[2];
    default:
        /* Halves keep the values where they are, run after run. */
        sumo__kernel_scaled_add(s->dt, a, 0.5, b, 0.5, hi - lo);
        return 0;
    }
}

static double run_kernel(shared *s, int id)
{
    size_t n = s->bytes / s->esz;
    if (!rows[s->kernel].tensors) {
        size_t lo, hi;
        part(n, CACHELINE / s->esz, s->T, id, &lo, &hi);
        return run_range(s, lo, hi);
    }
    /* Each thread takes its share of the tensors, each one call. */
    size_t t0 = NTENSORS * (size_t)id / (size_t)s->T, t1 = NTENSORS * (size_t)(id + 1) / (size_t)s->T;
    double acc = 0;
    for (size_t t = t0; t < t1; t++) acc += run_range(s, n * t / NTENSORS, n * (t + 1) / NTENSORS);
    return acc;
}

static void *worker(void *arg)
{
    targ *a = arg;
    shared *s = a->s;
    for (;;) {
        pthread_barrier_wait(&s->start);
        if (s->quit) return NULL;
        s->sink[a->id] += s->run_bound ? run_bound(s, a->id) : run_kernel(s, a->id);
        pthread_barrier_wait(&s->end);
    }
}

/* Finite values of every dtype, so that no path takes a NaN or Inf shortcut. */
static void fill(shared *s)
{
    size_t n = s->bytes / s->esz;
    for (size_t i = 0; i < n; i++) {
        double v = 1.0 + (double)(i % 1000) * 1e-3;
        switch (s->dt) {
        case SUMO_FLOAT64:
            ((double *)(void *)s->ka)[i] = v;
            ((double *)(void *)s->kb)[i] = 2 * v;
            break;
        case SUMO_FLOAT32:
            ((float *)(void *)s->ka)[i] = (float)v;
            ((float *)(void *)s->kb)[i] = (float)(2 * v);
            break;
        default: /* fp16 1.0 is 0x3c00, bf16 1.0 is 0x3f80: low mantissa bits vary */
            ((uint16_t *)(void *)s->ka)[i] = (uint16_t)((s->dt == SUMO_FLOAT16 ? 0x3c00 : 0x3f80) | (i % 64));
            ((uint16_t *)(void *)s->kb)[i] = (uint16_t)((s->dt == SUMO_FLOAT16 ? 0x3c00 : 0x3f80) | ((i + 7) % 64));
            break;
        }
    }
    for (size_t i = 0; i < s->bytes / sizeof(double); i++) {
        s->sa[i] = 1.0 + (double)(i % 1000) * 1e-3;
        s->sb[i] = 1e-9;
    }
}

int main(int argc, char **argv)
{
    long mib = argc > 1 ? atol(argv[1]) : 64;
    int reps = argc > 2 ? atoi(argv[2]) : 9;
    sumo_dtype dt = SUMO_FLOAT32;
    if (argc > 3) {
        if (strcmp(argv[3], "fp32") == 0) dt = SUMO_FLOAT32;
        else if (strcmp(argv[3], "fp64") == 0) dt = SUMO_FLOAT64;
        else if (strcmp(argv[3], "fp16") == 0) dt = SUMO_FLOAT16;
        else if (strcmp(argv[3], "bf16") == 0) dt = SUMO_BFLOAT16;
        else {
            fprintf(stderr, "kernel_bw: dtype '%s': fp32, fp64, fp16 or bf16\n", argv[3]);
            return 2;
        }
    }
    if (mib < 1 || mib > 4096 || reps < 1 || reps > MAXREPS) {
        fprintf(stderr, "usage: kernel_bw [MiB per operand, 1 to 4096 (64)] [reps, 1 to %d (9)] "
                        "[dtype fp32|fp64|fp16|bf16]\n", MAXREPS);
        return 2;
    }
    shared s = {.dt = dt, .esz = sumo__dtype_bytes(dt), .bytes = (size_t)mib << 20};
    s.ka = aligned_alloc(4096, s.bytes);
    s.kb = aligned_alloc(4096, s.bytes);
    s.sa = aligned_alloc(4096, s.bytes);
    s.sb = aligned_alloc(4096, s.bytes);
    if (!s.ka || !s.kb || !s.sa || !s.sb) {
        fprintf(stderr, "kernel_bw: cannot allocate 4 x %ld MiB\n", mib);
        return 1;
    }
    printf("# kernel_bw: kernels %s, dtype %s, %ld MiB per operand, median of %d alternating reps\n",
           sumo__kernel_isa(), sumo_dtype_name(dt), mib, reps);
    printf("#%-36s %7s %10s %8s %10s %7s\n", " kernel", "threads", "GB/s", "bound", "GB/s", "ratio");
    for (int T = 1; T <= MAXT; T++) {
        pthread_t th[MAXT];
        targ ta[MAXT];
        s.T = T;
        s.quit = 0;
        pthread_barrier_init(&s.start, NULL, (unsigned)T + 1);
        pthread_barrier_init(&s.end, NULL, (unsigned)T + 1);
        for (int k = 0; k < T; k++) {
            ta[k] = (targ){&s, k};
            pthread_create(&th[k], NULL, worker, &ta[k]);
        }
        for (int k = 0; k < NKERNELS; k++) {
            s.kernel = k;
            fill(&s); /* every kernel starts from the same values */
            double t[2][MAXREPS];
            for (int r = -1; r < reps; r++)
                for (int b = 0; b < 2; b++) {
                    s.run_bound = b;
                    double t0 = bench_now();
                    pthread_barrier_wait(&s.start);
                    pthread_barrier_wait(&s.end);
                    if (r >= 0) t[b][r] = bench_now() - t0;
                }
            double kgbps = rows[k].passes * (double)s.bytes / bench_median(t[0], reps) / 1e9;
            double bgbps =
                bound_passes[rows[k].bound] * (double)s.bytes / bench_median(t[1], reps) / 1e9;
            printf("  %-35s %7d %10.2f %8s %10.2f %6.0f%%\n", rows[k].name, T, kgbps,
                   bound_names[rows[k].bound], bgbps, 100 * kgbps / bgbps);
            fflush(stdout);
        }
        s.quit = 1;
        pthread_barrier_wait(&s.start);
        for (int k = 0; k < T; k++) pthread_join(th[k], NULL);
        pthread_barrier_destroy(&s.start);
        pthread_barrier_destroy(&s.end);
    }
    double x = 0;
    for (int k = 0; k < MAXT; k++) x += s.sink[k];
    printf("# (checksum %g)\n", x);
    free(s.ka);
    free(s.kb);
    free(s.sa);
    free(s.sb);
    return 0;
}
