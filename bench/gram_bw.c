/*
 * The Gram form's kernels against a plain read of the same bytes (issue 14, goal: the fused
 * dot/norms kernel at >= 90% of the read bandwidth measured in the same run).
 *
 *   gram_bw [MiB per input (64)] [reps (9)] [dtype fp32|bf16|fp16|fp64]
 *
 * For P = 2, 4, 8 inputs and 1 and 2 threads (each thread takes its part of every input), the
 * two loops run in alternation, rep by rep, and the medians are compared:
 *   read:  every input read once with AVX2 integer loads (8 independent chains, prefetching
 *          1 KiB ahead as the kernels do), the STREAM-like bound of a kernel that only reads;
 *   gram:  sumo__kernel_gram_partials over the same bytes (P(P+1)/2 fp64 sums);
 *   wsum:  sumo__kernel_weighted_sum from the P inputs into one output, against the read of
 *          the P inputs plus a write of the output (memset), for reference.
 */
#include "kernels/kernels.h"
#include "kernels/kernels_isa.h"

#include "bench_util.h"

#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAXP 8
#define MAXT 2

typedef struct shared {
    int P, T, what; /* what: 0 read, 1 gram, 2 wsum, 3 read + write */
    sumo_dtype dt;
    size_t n, esz;
    unsigned char *in[MAXP], *out;
    double w[MAXP];
    pthread_barrier_t start, end;
    volatile int quit;
    uint64_t sink[MAXT];
} shared;

typedef struct targ {
    shared *s;
    int id;
} targ;

__attribute__((target("avx2"))) static uint64_t read_loop(const unsigned char *p, size_t bytes)
{
    __m256i a[8];
    for (int k = 0; k < 8; k++) a[k] = _mm256_setzero_si256();
    size_t i = 0;
    for (; i + 256 <= bytes; i += 256) {
        /* The kernels prefetch 1 KiB ahead per stream; a bound without it would flatter them. */
        for (int k = 0; k < 4; k++) __builtin_prefetch(p + i + 1024 + 64 * k);
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++)
            a[k] = _mm256_xor_si256(a[k], _mm256_loadu_si256((const __m256i *)(p + i + 32 * k)));
    }
    for (int k = 1; k < 8; k++) a[0] = _mm256_xor_si256(a[0], a[k]);
    uint64_t r = (uint64_t)_mm256_extract_epi64(a[0], 0);
    for (; i < bytes; i++) r ^= p[i];
    return r;
}

static void part(const shared *s, int id, size_t *lo, size_t *hi)
{
    /* Cut at 64-element boundaries so no two threads share a cache line. */
    size_t blocks = s->n / 64;
    *lo = blocks * (size_t)id / (size_t)s->T * 64;
    *hi = id == s->T - 1 ? s->n : blocks * (size_t)(id + 1) / (size_t)s->T * 64;
}

static void *worker(void *arg)
{
    targ *a = arg;
    shared *s = a->s;
    for (;;) {
        pthread_barrier_wait(&s->start);
        if (s->quit) return NULL;
        size_t lo, hi;
        part(s, a->id, &lo, &hi);
        const void *ins[MAXP];
        for (int p = 0; p < s->P; p++) ins[p] = s->in[p] + lo * s->esz;
        uint64_t x = 0;
        double g[MAXP * (MAXP + 1) / 2];
        switch (s->what) {
        case 0:
            for (int p = 0; p < s->P; p++) x ^= read_loop(ins[p], (hi - lo) * s->esz);
            break;
        case 1:
            sumo__kernel_gram_partials(s->dt, ins, s->P, hi - lo, g);
            memcpy(&x, &g[0], sizeof x);
            break;
        case 2: {
            void *out = s->out + lo * s->esz;
            sumo__kernel_weighted_sum(s->dt, &out, 1, ins, s->w, s->P, hi - lo);
            break;
        }
        default:
            for (int p = 0; p < s->P; p++) x ^= read_loop(ins[p], (hi - lo) * s->esz);
            memset(s->out + lo * s->esz, (int)(x & 1), (hi - lo) * s->esz);
            break;
        }
        s->sink[a->id] ^= x;
        pthread_barrier_wait(&s->end);
    }
}

int main(int argc, char **argv)
{
    size_t mib = argc > 1 ? (size_t)atol(argv[1]) : 64;
    int reps = argc > 2 ? atoi(argv[2]) : 9;
    sumo_dtype dt = SUMO_FLOAT32;
    if (argc > 3 && strcmp(argv[3], "bf16") == 0) dt = SUMO_BFLOAT16;
    if (argc > 3 && strcmp(argv[3], "fp16") == 0) dt = SUMO_FLOAT16;
    if (argc > 3 && strcmp(argv[3], "fp64") == 0) dt = SUMO_FLOAT64;
    if (reps < 1 || reps > 99 || mib < 1) return 2;
    shared s = {.dt = dt, .esz = sumo__dtype_bytes(dt)};
    s.n = mib * 1024 * 1024 / s.esz;
    for (int p = 0; p < MAXP; p++) {
        s.in[p] = aligned_alloc(64, s.n * s.esz);
        if (s.in[p] == NULL) return 1;
        for (size_t i = 0; i < s.n * s.esz; i++) s.in[p][i] = (unsigned char)((i * 7 + (size_t)p) % 61);
        if (dt == SUMO_FLOAT32) /* finite values, so no path takes a NaN shortcut */
            for (size_t i = 0; i < s.n; i++) ((float *)(void *)s.in[p])[i] = (float)(i % 1000) * 1e-3f;
        s.w[p] = 0.5 + 0.1 * p;
    }
    s.out = aligned_alloc(64, s.n * s.esz);
    memset(s.out, 0, s.n * s.esz);
    printf("# gram_bw: kernels %s, dtype %s, %zu MiB per input, median of %d alternating reps\n",
           sumo__kernel_isa(), sumo_dtype_name(dt), mib, reps);
    printf("# %2s %7s %12s %12s %7s %12s %12s %7s\n", "P", "threads", "read GB/s", "gram GB/s",
           "gram%", "rd+wr GB/s", "wsum GB/s", "wsum%");
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
        const int Ps[] = {2, 4, 8};
        for (int q = 0; q < 3; q++) {
            s.P = Ps[q];
            double t[4][99];
            for (int r = -1; r < reps; r++)
                for (int what = 0; what < 4; what++) {
                    s.what = what;
                    double t0 = bench_now();
                    pthread_barrier_wait(&s.start);
                    pthread_barrier_wait(&s.end);
                    if (r >= 0) t[what][r] = bench_now() - t0;
                }
            double rd = (double)s.P * (double)s.n * (double)s.esz / 1e9;
            double wr = (double)s.n * (double)s.esz / 1e9;
            double mr = bench_median(t[0], reps), mg = bench_median(t[1], reps),
                   mw = bench_median(t[2], reps), mrw = bench_median(t[3], reps);
            printf("  %2d %7d %12.2f %12.2f %6.0f%% %12.2f %12.2f %6.0f%%\n", s.P, T, rd / mr,
                   rd / mg, 100 * mr / mg, (rd + wr) / mrw, (rd + wr) / mw, 100 * mrw / mw);
            fflush(stdout);
        }
        s.quit = 1;
        pthread_barrier_wait(&s.start);
        for (int k = 0; k < T; k++) pthread_join(th[k], NULL);
        pthread_barrier_destroy(&s.start);
        pthread_barrier_destroy(&s.end);
    }
    uint64_t x = 0;
    for (int k = 0; k < MAXT; k++) x ^= s.sink[k];
    printf("# (checksum %llu)\n", (unsigned long long)x);
    for (int p = 0; p < MAXP; p++) free(s.in[p]);
    free(s.out);
    return 0;
}
