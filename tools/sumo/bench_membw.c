#include "bench_membw.h"

#include "bench_reference.h"

#include <stdlib.h>
#include <string.h>

#define CACHELINE 64

/* ---- the STREAM loops --------------------------------------------------------------------- */

/*
 * The STREAM loops, on fp64, in plain C. They stand for what memory allows sumo's kernels
 * (bench/kernel_bw holds the kernels against the same loops), so they must pull bandwidth
 * through one core as well as the kernels do: x86-64 builds clone them for AVX2 (as the
 * kernels use it), picked at load time when the CPU has it, else they run with SSE2, which
 * every x86-64 has. Each step covers one cache line: parts start on cache lines,
 * and a block whose trip count the compiler knows is what GCC's -O2 vectoriser accepts (it
 * leaves loops of unknown count scalar).
 */
#if defined(__x86_64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
#define STREAM_AVX2_CLONES 1
#define STREAM_LOOP __attribute__((target_clones("avx2", "default")))
#else
#define STREAM_AVX2_CLONES 0
#define STREAM_LOOP
#endif

#define LINE_DOUBLES (CACHELINE / sizeof(double))

STREAM_LOOP static void triad(double *restrict a, const double *restrict b,
                              const double *restrict c, size_t n)
{
    size_t i = 0;
    for (; i + LINE_DOUBLES <= n; i += LINE_DOUBLES)
        for (size_t k = 0; k < LINE_DOUBLES; k++) a[i + k] = b[i + k] + 3.0 * c[i + k];
    for (; i < n; i++) a[i] = b[i] + 3.0 * c[i];
}

STREAM_LOOP static void add(double *restrict a, const double *restrict b, size_t n)
{
    size_t i = 0;
    for (; i + LINE_DOUBLES <= n; i += LINE_DOUBLES)
        for (size_t k = 0; k < LINE_DOUBLES; k++) a[i + k] += b[i + k];
    for (; i < n; i++) a[i] += b[i];
}

/* Eight partial sums, one per double of a cache line: without reassociation (no -ffast-math)
 * that is what lets the compiler keep them in vector registers. */
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

const char *bench_stream_isa(void)
{
#if STREAM_AVX2_CLONES
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2")) return "AVX2";
#endif
    return "SSE2";
}

/* ---- jobs: one part per worker ------------------------------------------------------------ */

static void part_range(const bench_job *j, int part, size_t *lo, size_t *hi)
{
    size_t unit = CACHELINE / j->esz;
    size_t lines = (j->n + unit - 1) / unit;
    size_t start = lines * (size_t)part / (size_t)j->active * unit;
    size_t end = lines * (size_t)(part + 1) / (size_t)j->active * unit;
    *lo = start < j->n ? start : j->n;
    *hi = end < j->n ? end : j->n;
}

static double *doubles(void *base, size_t i) { return (double *)base + i; }

static void job_copy(bench_job *j, int part)
{
    size_t lo, hi;
    part_range(j, part, &lo, &hi);
    /* memcpy is what compilers turn a copy loop into anyway. */
    memcpy(doubles(j->c, lo), doubles(j->a, lo), (hi - lo) * sizeof(double));
}

static void job_triad(bench_job *j, int part)
{
    size_t lo, hi;
    part_range(j, part, &lo, &hi);
    triad(doubles(j->a, lo), doubles(j->b, lo), doubles(j->c, lo), hi - lo);
}

static void job_add(bench_job *j, int part)
{
    size_t lo, hi;
    part_range(j, part, &lo, &hi);
    add(doubles(j->a, lo), doubles(j->b, lo), hi - lo);
}

static void job_dot(bench_job *j, int part)
{
    size_t lo, hi;
    part_range(j, part, &lo, &hi);
    j->partial[part] = dot(doubles(j->a, lo), doubles(j->b, lo), hi - lo);
}

int bench_job_run_part(bench_group *g, void *job)
{
    bench_job *j = job;
    j->fn(j, g->rank);
    return 0;
}

void bench_job_fill_part(bench_job *j, int part, int seed)
{
    size_t lo, hi;
    part_range(j, part, &lo, &hi);
    bench_fill(j->dtype, j->a, lo, hi, seed);
    bench_fill(j->dtype, j->b, lo, hi, seed + 1);
    if (j->c) bench_fill(j->dtype, j->c, lo, hi, seed + 2);
}

/* ---- the table of loops ------------------------------------------------------------------- */

static const char *const stream_names[BENCH_NSTREAM] = {"copy", "triad", "a+=b", "dot"};
static void (*const stream_fns[BENCH_NSTREAM])(bench_job *, int) = {job_copy, job_triad, job_add,
                                                                    job_dot};
static const int stream_passes[BENCH_NSTREAM] = {2, 3, 3, 2};

const char *bench_stream_name(int stream) { return stream_names[stream]; }
int bench_stream_passes(int stream) { return stream_passes[stream]; }

/* ---- arrays ------------------------------------------------------------------------------- */

void bench_mem_arrays_free(bench_mem_arrays *ma)
{
    free(ma->a);
    free(ma->b);
    free(ma->c);
    free(ma->partial);
    *ma = (bench_mem_arrays){0};
}

static size_t page_multiple(size_t bytes) { return (bytes + 4095) / 4096 * 4096; }

int bench_mem_arrays_alloc(bench_mem_arrays *ma, const bench_opts *o, int workers)
{
    *ma = (bench_mem_arrays){.bytes = o->mem_bytes / 64 * 64};
    size_t rb = page_multiple(ma->bytes);
    ma->a = aligned_alloc(4096, rb);
    ma->b = aligned_alloc(4096, rb);
    ma->c = aligned_alloc(4096, rb);
    ma->partial = calloc((size_t)workers, sizeof *ma->partial);
    if (ma->a && ma->b && ma->c && ma->partial) return 0;
    bench_mem_arrays_free(ma);
    return -1;
}

/* ---- measurements ------------------------------------------------------------------------- */

/* The STREAM loop k over operands of `bytes` each, split among active workers. */
static bench_job stream_job(const bench_mem_arrays *ma, int k, size_t bytes, int active)
{
    size_t n = bytes / sizeof(double);
    bool three_operands = k == BENCH_STREAM_COPY || k == BENCH_STREAM_TRIAD;
    return (bench_job){.fn = stream_fns[k], .active = active, .n = n, .esz = sizeof(double),
                       .bytes = (double)stream_passes[k] * (double)(n * sizeof(double)),
                       .a = ma->a, .b = ma->b, .c = three_operands ? ma->c : NULL,
                       .dtype = SUMO_FLOAT64, .partial = ma->partial};
}

bench_job bench_stream_add_job(const bench_mem_arrays *ma, int workers)
{
    return stream_job(ma, BENCH_STREAM_ADD, ma->bytes, workers);
}

static bench_timed timed_job(bench_job *j)
{
    return (bench_timed){.active = j->active, .from_last_start = false,
                         .fn = bench_job_run_part, .arg = j};
}

/* Median GB/s of job over reps runs, after one untimed run. */
static double measure_job(bench_group *g, int reps, bench_job *j)
{
    bench_timed run = timed_job(j);
    bench_time_runs(g, &run, 1, g->durations);
    bench_time_runs(g, &run, reps, g->durations);
    return j->bytes / bench_median(g->durations, reps, NULL); /* bytes per ns = GB/s */
}

typedef struct mem_ctx {
    const bench_opts *o;
    int active;
    const bench_mem_arrays *ma;
    double gbps[BENCH_NSTREAM];
} mem_ctx;

static int stream_body(bench_group *g, void *arg)
{
    mem_ctx *m = arg;
    for (int k = 0; k < BENCH_NSTREAM; k++) {
        bench_job j = stream_job(m->ma, k, m->ma->bytes, m->active);
        if (g->rank < m->active) bench_job_fill_part(&j, g->rank, 7 * g->rank);
        double gbps = measure_job(g, m->o->mem_reps, &j);
        if (g->rank == 0) m->gbps[k] = gbps;
    }
    return 0;
}

int bench_mem_worker_counts(const bench_opts *o, int ranks_on_node, int *workers)
{
    int cand[BENCH_MAX_RANK_LIST + 2] = {1, 2};
    int nc = 2, n = 0;
    if (o->transport == BENCH_TRANSPORT_THREADS)
        for (int i = 0; i < o->nranks; i++) cand[nc++] = o->ranks[i];
    else
        cand[1] = ranks_on_node;
    for (int i = 0; i < nc && n < BENCH_MAX_MEM_T; i++) {
        bool dup = false;
        for (int k = 0; k < n; k++) dup = dup || workers[k] == cand[i];
        if (!dup) workers[n++] = cand[i];
    }
    return n;
}

int bench_measure_stream(const bench_opts *o, const bench_mem_arrays *ma, const int *workers,
                         int nworkers, bench_mem_runner run, void *env, bench_mem_results *m)
{
    for (int i = 0; i < nworkers; i++) {
        mem_ctx mc = {.o = o, .active = workers[i], .ma = ma};
        if (run(env, workers[i], stream_body, &mc) != 0) return -1;
        m->threads[m->nt] = workers[i];
        memcpy(m->stream[m->nt++], mc.gbps, sizeof m->stream[0]);
    }
    return 0;
}
