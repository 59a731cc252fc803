/*
 * The kernel-table seam of sumo_ext.h, used from outside as a GPU table would use it.
 *
 * Remote memory: a kernel table for "device" buffers the host cannot touch. Their addresses
 * lie in a range reserved with PROT_NONE, so any host load or store on them (a memcpy or a
 * loop that bypassed the table) kills the test with SIGSEGV; the table's kernels translate
 * each address into a backing store and run the host's kernels there. Every collective, the
 * aggregators and the optimizers' element-wise steps are run on such buffers and compared bit
 * for bit with the same calls on host buffers: the same kernels in the same order give the
 * same bits, and a data touch outside the table cannot pass.
 *
 * The seam for a caller's transport is tested in test_seams_transport.c.
 */
#define SUMO_EXPERIMENTAL_API 1
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "sumo_aggregation.h"
#include "sumo_diloco.h"
#include "sumo_delta.h"
#include "sumo_distributed.h"
#include "sumo_ext.h"
#include "support/harness.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define MAXP 8
#define MAXPTR 64

/* ---- remote memory ------------------------------------------------------------------------- */

enum { K_COPY, K_FILL, K_SCAN, K_REDUCE, K_CONVERT, K_DOT, K_SCALED, K_GRAM, K_WEIGHTED,
       K_DELTA, K_APPLY, K_QUANT, K_DEQUANT, K_OUTER, K_ALLOC, K_COUNT };

typedef struct remote {
    unsigned char *fake; /* PROT_NONE: what sumo sees */
    unsigned char *real; /* the same offsets, readable */
    size_t size, used;
    pthread_mutex_t lock;
    _Atomic long calls[K_COUNT];
    const sumo_kernel_table *host;
    sumo_kernel_table table;
} remote;

static remote R; /* one per test binary: tables are borrowed for the handle's life */

static bool in_remote(const void *p, size_t bytes)
{
    const unsigned char *c = p;
    return c >= R.fake && c < R.fake + R.size && bytes <= (size_t)(R.fake + R.size - c);
}

/* Where the kernels really read and write: remote addresses moved into the backing store,
 * host addresses (staging areas, metadata) left alone. */
static void *real_of(const void *p)
{
    if (p && in_remote(p, 0)) return R.real + ((const unsigned char *)p - R.fake);
    return (void *)(uintptr_t)p;
}

static void count(int k) { atomic_fetch_add(&R.calls[k], 1); }

static bool r_claims(void *ctx, const void *ptr, size_t bytes)
{
    (void)ctx;
    return in_remote(ptr, bytes);
}

static sumo_result r_alloc(void *ctx, size_t bytes, void **ptr)
{
    (void)ctx;
    count(K_ALLOC);
    pthread_mutex_lock(&R.lock);
    size_t at = (R.used + 63) / 64 * 64;
    sumo_result r = SUMO_ERR_SYSTEM;
    if (at + bytes <= R.size) {
        *ptr = R.fake + at;
        R.used = at + bytes;
        r = SUMO_SUCCESS;
    }
    pthread_mutex_unlock(&R.lock);
    return r;
}

static void r_release(void *ctx, void *ptr)
{
    (void)ctx;
    (void)ptr; /* a bump allocator: the test's memory is reset between tests */
}

static sumo_result r_sync(void *ctx, void *exec)
{
    (void)ctx;
    return R.host->synchronize(R.host->ctx, exec);
}

static sumo_result r_copy(void *ctx, void *exec, void *dst, const void *src, size_t bytes)
{
    (void)ctx;
    count(K_COPY);
    return R.host->copy(R.host->ctx, exec, real_of(dst), real_of(src), bytes);
}

static sumo_result r_fill(void *ctx, void *exec, sumo_dtype t, void *dst, double v, size_t n)
{
    (void)ctx;
    count(K_FILL);
    return R.host->fill(R.host->ctx, exec, t, real_of(dst), v, n);
}

static sumo_result r_scan(void *ctx, void *exec, sumo_dtype t, const void *src, size_t n,
                          size_t *first)
{
    (void)ctx;
    count(K_SCAN);
    return R.host->first_nonfinite(R.host->ctx, exec, t, real_of(src), n, first);
}

static sumo_result real_ptrs(const void *const *in, int n, const void **out)
{
    if (n > MAXPTR) return SUMO_ERR_INVALID_ARGUMENT;
    for (int i = 0; i < n; i++) out[i] = real_of(in[i]);
    return SUMO_SUCCESS;
}

static sumo_result r_reduce(void *ctx, void *exec, sumo_dtype t, void *const *outs, int nout,
                            const void *const *ins, int nin, size_t n, int divisor)
{
    (void)ctx;
    count(K_REDUCE);
    const void *ri[MAXPTR], *ro[MAXPTR];
    if (real_ptrs(ins, nin, ri) || real_ptrs((const void *const *)outs, nout, ro))
        return SUMO_ERR_INVALID_ARGUMENT;
    return R.host->reduce(R.host->ctx, exec, t, (void *const *)ro, nout, ri, nin, n, divisor);
}

static sumo_result r_convert(void *ctx, void *exec, sumo_dtype dt, void *dst, sumo_dtype st,
                             const void *src, size_t n)
{
    (void)ctx;
    count(K_CONVERT);
    return R.host->convert(R.host->ctx, exec, dt, real_of(dst), st, real_of(src), n);
}

static sumo_result r_dot(void *ctx, void *exec, sumo_dtype t, const void *a, const void *b,
                         size_t n, double *out)
{
    (void)ctx;
    count(K_DOT);
    return R.host->dot_norms(R.host->ctx, exec, t, real_of(a), real_of(b), n, out);
}

static sumo_result r_scaled(void *ctx, void *exec, sumo_dtype t, void *a, double ca,
                            const void *b, double cb, size_t n)
{
    (void)ctx;
    count(K_SCALED);
    return R.host->scaled_add(R.host->ctx, exec, t, real_of(a), ca, real_of(b), cb, n);
}

static sumo_result r_gram(void *ctx, void *exec, sumo_dtype t, const void *const *ins, int nin,
                          const size_t *off, size_t nt, size_t lo, size_t hi, double *gram)
{
    (void)ctx;
    count(K_GRAM);
    const void *ri[MAXPTR];
    if (real_ptrs(ins, nin, ri)) return SUMO_ERR_INVALID_ARGUMENT;
    return R.host->gram_partials(R.host->ctx, exec, t, ri, nin, off, nt, lo, hi, gram);
}

static sumo_result r_weighted(void *ctx, void *exec, sumo_dtype t, void *const *outs, int nout,
                              const void *const *ins, int nin, const size_t *off, size_t nt,
                              size_t lo, size_t hi, const double *w)
{
    (void)ctx;
    count(K_WEIGHTED);
    const void *ri[MAXPTR], *ro[MAXPTR];
    if (real_ptrs(ins, nin, ri) || real_ptrs((const void *const *)outs, nout, ro))
        return SUMO_ERR_INVALID_ARGUMENT;
    return R.host->weighted_sum(R.host->ctx, exec, t, (void *const *)ro, nout, ri, nin, off, nt,
                                lo, hi, w);
}

static sumo_result r_delta(void *ctx, void *exec, sumo_dtype t, void *d, const void *now,
                           const void *start, size_t n)
{
    (void)ctx;
    count(K_DELTA);
    return R.host->delta(R.host->ctx, exec, t, real_of(d), real_of(now), real_of(start), n);
}

static sumo_result r_apply(void *ctx, void *exec, sumo_dtype t, void *p, const void *start,
                           const void *d, size_t n, size_t *first)
{
    (void)ctx;
    count(K_APPLY);
    return R.host->apply_delta(R.host->ctx, exec, t, real_of(p), real_of(start), real_of(d), n,
                               first);
}

static sumo_result r_quantize(void *ctx, void *exec, sumo_compression_format f, size_t block,
                              void *dst, const float *src, size_t n, size_t *first)
{
    (void)ctx;
    count(K_QUANT);
    return R.host->quantize(R.host->ctx, exec, f, block, real_of(dst), real_of(src), n, first);
}

static sumo_result r_dequantize(void *ctx, void *exec, sumo_compression_format f, size_t block,
                                float *dst, const void *src, size_t n)
{
    (void)ctx;
    count(K_DEQUANT);
    return R.host->dequantize(R.host->ctx, exec, f, block, real_of(dst), real_of(src), n);
}

static sumo_result r_outer(void *ctx, void *exec, sumo_dtype t, void *x, const void *c, void *v,
                           void *x0, size_t n, const sumo_outer_step *step)
{
    (void)ctx;
    count(K_OUTER);
    return R.host->outer_update(R.host->ctx, exec, t, real_of(x), real_of(c), real_of(v),
                                real_of(x0), n, step);
}

static void remote_reset(void)
{
    R.used = 0;
    for (int k = 0; k < K_COUNT; k++) atomic_store(&R.calls[k], 0);
}

static int remote_setup(void **state)
{
    (void)state;
    R.size = (size_t)64 << 20;
    R.fake = mmap(NULL, R.size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    R.real = mmap(NULL, R.size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (R.fake == MAP_FAILED || R.real == MAP_FAILED) return -1;
    pthread_mutex_init(&R.lock, NULL);
    if (sumo_host_kernels(&R.host) != SUMO_SUCCESS) return -1;
    R.table = (sumo_kernel_table){
        .struct_size = sizeof R.table, .memory = "remote", .claims = r_claims,
        .alloc = r_alloc, .release = r_release, .synchronize = r_sync, .copy = r_copy,
        .fill = r_fill, .first_nonfinite = r_scan, .reduce = r_reduce, .convert = r_convert,
        .dot_norms = r_dot, .scaled_add = r_scaled, .gram_partials = r_gram,
        .weighted_sum = r_weighted, .delta = r_delta, .apply_delta = r_apply,
        .quantize = r_quantize, .dequantize = r_dequantize,
        .outer_update = r_outer};
    return 0;
}

static int remote_teardown(void **state)
{
    (void)state;
    munmap(R.fake, R.size);
    munmap(R.real, R.size);
    pthread_mutex_destroy(&R.lock);
    return 0;
}

/* ---- one job, on host buffers and on remote ones ------------------------------------------- */

typedef enum job_kind { J_ALLREDUCE, J_BROADCAST, J_ALLGATHER, J_REDUCE_SCATTER, J_ACGA,
                        J_DELTA, J_SLOWMO, J_COMPRESSED, J_DILOCO } job_kind;

typedef struct job {
    job_kind kind;
    int P;
    sumo_dtype dtype;
    sumo_op op;           /* allreduce, reduce-scatter; SUMO_OP_PREDEFINED_COUNT: a layout op */
    size_t count;         /* per rank (the recvcount of a reduce-scatter) */
    bool remote;
    bool in_place;
    sumo_compression_format format; /* J_COMPRESSED, J_DILOCO */
    sumo_outer_combine combine;     /* J_DILOCO */
    /* per rank: what it produced, copied to host memory, and the calls' results */
    unsigned char *out[MAXP];
    size_t out_bytes[MAXP];
    sumo_result res[MAXP];
} job;

static const size_t LAYOUT[] = {7, 0, 130, 1, 500, 33};
#define NLAYOUT (sizeof LAYOUT / sizeof LAYOUT[0])

static size_t layout_total(void)
{
    size_t t = 0;
    for (size_t i = 0; i < NLAYOUT; i++) t += LAYOUT[i];
    return t;
}

static void *buffer(const job *j, size_t bytes)
{
    void *p = NULL;
    if (j->remote) assert_int_equal(r_alloc(NULL, bytes, &p), SUMO_SUCCESS);
    else p = calloc(1, bytes ? bytes : 1);
    return p;
}

/* Host view of a buffer for the test's own reads and writes. */
static unsigned char *view(void *p) { return real_of(p); }

static void fill_input(const job *j, int rank, void *buf, size_t n)
{
    for (size_t i = 0; i < n; i++)
        harness_set(j->dtype, view(buf), i,
                    j->kind == J_ALLREDUCE && j->op != SUMO_OP_SUM && j->op != SUMO_OP_AVERAGE
                        ? harness_uniform_at(17, (uint64_t)rank, i)
                        : harness_collective_value(rank, i, false));
}

static void run_job(sumo_comm *comm, int rank, int size, void *arg)
{
    job *j = arg;
    size_t esz = harness_dtype_size(j->dtype);
    sumo_result r = SUMO_SUCCESS;
    if (j->remote) r = sumo_comm_add_kernels(comm, &R.table);
    size_t n = j->count, in_n = n, out_n = n;
    if (j->kind == J_ALLGATHER) out_n = n * (size_t)size;
    if (j->kind == J_REDUCE_SCATTER) in_n = n * (size_t)size;
    unsigned char *in = buffer(j, in_n * esz), *out = buffer(j, out_n * esz);
    fill_input(j, rank, in, in_n);
    const void *send = in;
    void *recv = out;
    if (j->in_place) {
        if (j->kind == J_ALLGATHER) {
            memcpy(view(out) + (size_t)rank * n * esz, view(in), n * esz);
            send = out + (size_t)rank * n * esz;
        } else if (j->kind == J_REDUCE_SCATTER) {
            recv = in + (size_t)rank * n * esz;
        } else {
            recv = in;
        }
    }
    sumo_op op = j->op;
    if (r == SUMO_SUCCESS && op == SUMO_OP_PREDEFINED_COUNT) {
        sumo_adasum_options o = {.struct_size = sizeof o, .tensor_counts = LAYOUT, .ntensors = NLAYOUT};
        r = sumo_op_create_adasum(comm, &o, &op);
    }
    if (r == SUMO_SUCCESS) {
        switch (j->kind) {
        case J_ALLREDUCE: r = sumo_allreduce(send, recv, n, j->dtype, op, comm); break;
        case J_BROADCAST: r = sumo_broadcast(send, recv, n, j->dtype, size - 1, comm); break;
        case J_ALLGATHER: r = sumo_allgather(send, recv, n, j->dtype, comm); break;
        case J_REDUCE_SCATTER: r = sumo_reduce_scatter(send, recv, n, j->dtype, op, comm); break;
        case J_ACGA: {
            sumo_aggregator_options o;
            sumo_aggregator_options_default(SUMO_AGGREGATE_ACGA, &o);
            o.tensor_counts = LAYOUT;
            o.ntensors = NLAYOUT;
            o.acga.per_tensor = 1;
            o.acga.rescale = 1;
            sumo_aggregator *agg = NULL;
            r = sumo_aggregator_create(comm, &o, &agg);
            for (int step = 0; step < 2 && r == SUMO_SUCCESS; step++)
                r = sumo_aggregator_apply_into(agg, send, recv, n, j->dtype);
            sumo_aggregator_destroy(agg);
            break;
        }
        case J_DELTA: {
            /* start = in, the "stepped" parameters = in + rank-dependent change. */
            unsigned char *now = buffer(j, n * esz), *delta = buffer(j, n * esz);
            for (size_t i = 0; i < n; i++)
                harness_set(j->dtype, view(now), i,
                            harness_get(j->dtype, view(in), i) + 0.25 * (rank + 1));
            r = sumo_delta_compute(comm, delta, now, in, n, j->dtype);
            if (r == SUMO_SUCCESS) r = sumo_allreduce(delta, delta, n, j->dtype, SUMO_OP_AVERAGE, comm);
            if (r == SUMO_SUCCESS) r = sumo_delta_apply(comm, out, in, delta, n, j->dtype);
            if (!j->remote) {
                free(now);
                free(delta);
            }
            break;
        }
        case J_SLOWMO: {
            sumo_diloco_options o;
            sumo_diloco_options_default(SUMO_DILOCO_PRESET_SLOWMO, &o);
            o.sync_every = 2;
            o.memory_efficient = 1;
            sumo_diloco *s = NULL;
            r = sumo_diloco_create(comm, NULL, 0, n, j->dtype, &o, &s);
            memcpy(view(out), view(in), n * esz);
            for (int step = 0; step < 4 && r == SUMO_SUCCESS; step++) {
                r = sumo_diloco_begin(s, out);
                /* The local step: a rank-dependent move, made by the test as a user's
                 * optimizer would (through its own view). */
                for (size_t i = 0; i < n && r == SUMO_SUCCESS; i++)
                    harness_set(j->dtype, view(out), i,
                                harness_get(j->dtype, view(out), i) - 0.01 * (rank + 1 + step));
                if (r == SUMO_SUCCESS) r = sumo_diloco_end(s, out, 0.1, NULL);
            }
            sumo_diloco_destroy(s);
            break;
        }
        case J_COMPRESSED: {
            sumo_compression o = {.struct_size = sizeof o, .format = j->format, .block_size = 16,
                                  .op = SUMO_OP_AVERAGE};
            r = sumo_allreduce_compressed((const float *)send, (float *)recv, n, &o, comm);
            break;
        }
        case J_DILOCO: {
            /* Two fragments of the layout, an exchange in flight for one step, each combine. */
            sumo_diloco_options o;
            sumo_diloco_options_default(SUMO_DILOCO_PRESET_DILOCO, &o);
            o.sync_every = 4;
            o.fragments = 2;
            o.delay = 1;
            o.merge_alpha = 0.25;
            o.compression = j->format;
            o.block_size = 16;
            o.combine = j->combine;
            sumo_diloco *d = NULL;
            r = sumo_diloco_create(comm, LAYOUT, NLAYOUT, n, j->dtype, &o, &d);
            memcpy(view(out), view(in), n * esz);
            for (int step = 0; step < 10 && r == SUMO_SUCCESS; step++) {
                r = sumo_diloco_begin(d, out);
                for (size_t i = 0; i < n && r == SUMO_SUCCESS; i++)
                    harness_set(j->dtype, view(out), i,
                                harness_get(j->dtype, view(out), i) - 0.01 * (rank + 1 + step) * (double)(i % 5));
                if (r == SUMO_SUCCESS) r = sumo_diloco_end(d, out, 0.1, NULL);
            }
            sumo_diloco_destroy(d);
            break;
        }
        }
    }
    j->res[rank] = r;
    const unsigned char *result = j->kind == J_DELTA || j->kind == J_SLOWMO || j->kind == J_DILOCO ? out : recv;
    j->out[rank] = malloc(out_n * esz + 1);
    memcpy(j->out[rank], view((void *)result), out_n * esz);
    j->out_bytes[rank] = out_n * esz;
    if (!j->remote) {
        free(in);
        free(out);
    }
}

static void job_free(job *j)
{
    for (int r = 0; r < j->P; r++) free(j->out[r]);
}

/* The same job on host and remote buffers gives the same bits on every rank. */
static void check_same_with(job_kind kind, int P, sumo_dtype dtype, sumo_op op, size_t count,
                            bool in_place, sumo_compression_format format,
                            sumo_outer_combine combine)
{
    job host = {.kind = kind, .P = P, .dtype = dtype, .op = op, .count = count, .in_place = in_place,
                .format = format, .combine = combine};
    job rem = host;
    rem.remote = true;
    remote_reset();
    assert_int_equal(harness_run_threads(P, run_job, &host), 0);
    assert_int_equal(harness_run_threads(P, run_job, &rem), 0);
    for (int r = 0; r < P; r++) {
        if (host.res[r] != SUMO_SUCCESS || rem.res[r] != SUMO_SUCCESS)
            fail_msg("job %d P %d dtype %d op %u: rank %d %s / %s", kind, P, dtype, op, r,
                     sumo_result_name(host.res[r]), sumo_result_name(rem.res[r]));
        if (host.out_bytes[r] != rem.out_bytes[r] ||
            memcmp(host.out[r], rem.out[r], host.out_bytes[r]) != 0)
            fail_msg("job %d P %d dtype %d op %u in place %d: rank %d differs between host and "
                     "remote memory",
                     kind, P, dtype, op, in_place, r);
    }
    job_free(&host);
    job_free(&rem);
}

static void check_same(job_kind kind, int P, sumo_dtype dtype, sumo_op op, size_t count,
                       bool in_place)
{
    check_same_with(kind, P, dtype, op, count, in_place, SUMO_COMPRESS_NONE, SUMO_COMBINE_AVERAGE);
}

static void test_remote_collectives(void **state)
{
    (void)state;
    const sumo_dtype dts[] = {SUMO_FLOAT32, SUMO_FLOAT64, SUMO_FLOAT16, SUMO_BFLOAT16};
    for (int P = 1; P <= 5; P++)
        for (int d = 0; d < 4; d++)
            for (int ip = 0; ip <= 1; ip++) {
                check_same(J_ALLREDUCE, P, dts[d], SUMO_OP_SUM, 1000, ip);
                check_same(J_ALLREDUCE, P, dts[d], SUMO_OP_AVERAGE, 333, ip);
                check_same(J_ALLREDUCE, P, dts[d], SUMO_OP_ADASUM, 777, ip);
                check_same(J_ALLREDUCE, P, dts[d], SUMO_OP_PREDEFINED_COUNT, layout_total(), ip);
                check_same(J_BROADCAST, P, dts[d], 0, 517, ip);
                check_same(J_ALLGATHER, P, dts[d], 0, 129, ip);
                check_same(J_REDUCE_SCATTER, P, dts[d], SUMO_OP_SUM, 257, ip);
                check_same(J_REDUCE_SCATTER, P, dts[d], SUMO_OP_AVERAGE, 31, ip);
            }
    /* Every kind of kernel the collectives use ran on the remote table. */
    remote_reset();
    check_same(J_ALLREDUCE, 4, SUMO_FLOAT32, SUMO_OP_ADASUM, 4096, false);
    assert_true(atomic_load(&R.calls[K_GRAM]) > 0 && atomic_load(&R.calls[K_WEIGHTED]) > 0);
    remote_reset();
    check_same(J_ALLREDUCE, 3, SUMO_FLOAT64, SUMO_OP_ADASUM, 4096, false); /* fp64: the tree */
    assert_true(atomic_load(&R.calls[K_DOT]) > 0 && atomic_load(&R.calls[K_SCALED]) > 0 &&
                atomic_load(&R.calls[K_COPY]) > 0);
}

static void test_remote_layers(void **state)
{
    (void)state;
    for (int P = 1; P <= 4; P++) {
        check_same(J_ACGA, P, SUMO_FLOAT32, 0, layout_total(), false);
        check_same(J_ACGA, P, SUMO_FLOAT32, 0, layout_total(), true);
        check_same(J_DELTA, P, SUMO_FLOAT32, 0, 1000, false);
        check_same(J_DELTA, P, SUMO_FLOAT64, 0, 1000, false);
        check_same(J_SLOWMO, P, SUMO_FLOAT32, 0, 1001, false);
        check_same(J_SLOWMO, P, SUMO_FLOAT64, 0, 1001, false);
    }
    remote_reset();
    check_same(J_SLOWMO, 2, SUMO_FLOAT32, 0, 1001, false);
    assert_true(atomic_load(&R.calls[K_OUTER]) > 0 && atomic_load(&R.calls[K_SCAN]) > 0);
    remote_reset();
    check_same(J_DELTA, 2, SUMO_FLOAT32, 0, 100, false);
    assert_true(atomic_load(&R.calls[K_DELTA]) > 0 && atomic_load(&R.calls[K_APPLY]) > 0);
    /* The compressed allreduce and DiLoCo's outer loop (every combine, compressed or not). */
    const sumo_compression_format fmts[] = {SUMO_COMPRESS_BF16, SUMO_COMPRESS_FP8_E4M3,
                                            SUMO_COMPRESS_E3M0};
    for (int P = 1; P <= 4; P++)
        for (int f = 0; f < 3; f++)
            for (int ip = 0; ip <= 1; ip++)
                check_same_with(J_COMPRESSED, P, SUMO_FLOAT32, 0, 1001, ip, fmts[f], SUMO_COMBINE_AVERAGE);
    for (int P = 1; P <= 3; P++) {
        check_same_with(J_DILOCO, P, SUMO_FLOAT32, 0, layout_total(), false, SUMO_COMPRESS_NONE,
                        SUMO_COMBINE_AVERAGE);
        check_same_with(J_DILOCO, P, SUMO_FLOAT64, 0, layout_total(), false, SUMO_COMPRESS_NONE,
                        SUMO_COMBINE_ADASUM);
        check_same_with(J_DILOCO, P, SUMO_FLOAT32, 0, layout_total(), false, SUMO_COMPRESS_E3M0,
                        SUMO_COMBINE_AVERAGE);
        check_same_with(J_DILOCO, P, SUMO_FLOAT32, 0, layout_total(), false, SUMO_COMPRESS_NONE,
                        SUMO_COMBINE_ACGA);
    }
    remote_reset();
    check_same_with(J_DILOCO, 2, SUMO_FLOAT32, 0, layout_total(), false, SUMO_COMPRESS_FP8_E4M3,
                    SUMO_COMBINE_AVERAGE);
    assert_true(atomic_load(&R.calls[K_QUANT]) > 0 && atomic_load(&R.calls[K_DEQUANT]) > 0 &&
                atomic_load(&R.calls[K_OUTER]) > 0);
}

/* Where remote bytes would have to cross the transport, or one call mixes memories, or the
 * ranks pass different memories: refused on every rank, no hang; the compressed allreduce
 * alike. */
typedef struct refusal {
    int which;
    bool compressed;
    sumo_result res[MAXP];
    char msg[MAXP][256];
} refusal;

static sumo_result refused_allreduce(const refusal *f, void *send, void *recv, sumo_comm *comm)
{
    sumo_compression o = {.struct_size = sizeof o, .format = SUMO_COMPRESS_FP8_E4M3,
                          .block_size = 16, .op = SUMO_OP_SUM};
    if (f->compressed) return sumo_allreduce_compressed(send, recv, 64, &o, comm);
    return sumo_allreduce(send, recv, 64, SUMO_FLOAT32, SUMO_OP_SUM, comm);
}

static void refuse_rank(sumo_comm *comm, int rank, int size, void *arg)
{
    (void)size;
    refusal *f = arg;
    sumo_comm_add_kernels(comm, &R.table);
    float host[64] = {0};
    void *rem = NULL;
    r_alloc(NULL, sizeof host, &rem);
    sumo_result r;
    switch (f->which) {
    case 0: /* a point-to-point algorithm forced: bytes would cross the transport */
        sumo_comm_set_param(comm, SUMO_PARAM_ALGORITHM, SUMO_ALGORITHM_RING);
        r = refused_allreduce(f, rem, rem, comm);
        break;
    case 1: /* one call, two memories */
        r = refused_allreduce(f, rem, host, comm);
        break;
    default: /* rank 0 passes host memory, the others remote */
        r = refused_allreduce(f, rank == 0 ? (void *)host : rem, rank == 0 ? (void *)host : rem,
                              comm);
        break;
    }
    f->res[rank] = r;
    const char *m = "";
    sumo_comm_error_message(comm, &m);
    snprintf(f->msg[rank], sizeof f->msg[rank], "%s", m);
}

static void test_remote_refused(void **state)
{
    (void)state;
    const sumo_result want[] = {SUMO_ERR_INVALID_USAGE, SUMO_ERR_INVALID_ARGUMENT,
                                SUMO_ERR_MISMATCH};
    for (int which = 0; which < 6; which++) {
        remote_reset();
        refusal f = {.which = which % 3, .compressed = which >= 3};
        assert_int_equal(harness_run_threads(3, refuse_rank, &f), 0);
        for (int r = 0; r < 3; r++) {
            /* The rank at fault reports its own reason; the others name it. */
            assert_int_equal(f.res[r], want[f.which]);
            assert_true(strlen(f.msg[r]) > 0);
        }
        assert_non_null(strstr(f.msg[0], f.which == 1   ? "remote memory"
                                         : f.which == 0 ? "cannot move remote"
                                                        : "memory"));
    }
}

/* sumo_join: the joined rank's zeros are the announced memory's, made and filled by its table
 * (a host write would fault on these addresses; host zeros would be another memory, which the
 * agreement refuses); a joined rank without that table fails the call on every rank. */
typedef struct join_case {
    bool joined_has_table;
    void *buf[3];
    sumo_result res[3], join[3];
    char msg[3][256];
} join_case;

#define JOIN_N 777

static void join_rank(sumo_comm *comm, int rank, int size, void *arg)
{
    (void)size;
    join_case *j = arg;
    if (rank != 2 || j->joined_has_table) sumo_comm_add_kernels(comm, &R.table);
    int last;
    if (rank == 2) {
        j->res[rank] = sumo_join(comm, &last);
    } else {
        r_alloc(NULL, JOIN_N * sizeof(float), &j->buf[rank]);
        for (size_t i = 0; i < JOIN_N; i++)
            harness_set(SUMO_FLOAT32, view(j->buf[rank]), i,
                        harness_collective_value(rank, i, true));
        j->res[rank] = sumo_allreduce(j->buf[rank], j->buf[rank], JOIN_N, SUMO_FLOAT32,
                                      SUMO_OP_AVERAGE, comm);
    }
    const char *m = "";
    sumo_comm_error_message(comm, &m);
    snprintf(j->msg[rank], sizeof j->msg[rank], "%s", m);
    /* The joined rank's sumo_join returned with the others' unless the allreduce failed. */
    j->join[rank] = rank == 2 && j->res[rank] == SUMO_SUCCESS ? SUMO_SUCCESS
                                                               : sumo_join(comm, &last);
}

static void test_remote_join(void **state)
{
    (void)state;
    for (int has = 1; has >= 0; has--) {
        remote_reset();
        join_case j = {.joined_has_table = has};
        long allocs = atomic_load(&R.calls[K_ALLOC]), fills = atomic_load(&R.calls[K_FILL]);
        assert_int_equal(harness_run_threads(3, join_rank, &j), 0);
        for (int r = 0; r < 3; r++) {
            assert_int_equal(j.res[r], has ? SUMO_SUCCESS : SUMO_ERR_INVALID_USAGE);
            assert_int_equal(j.join[r], SUMO_SUCCESS);
        }
        if (!has) {
            assert_non_null(strstr(j.msg[2], "no kernel table"));
            assert_non_null(strstr(j.msg[0], "rank 2"));
            continue;
        }
        /* The test's two buffers, then the joined rank's zeros, through the table. */
        assert_int_equal(atomic_load(&R.calls[K_ALLOC]) - allocs, 3);
        assert_true(atomic_load(&R.calls[K_FILL]) > fills);
        for (int r = 0; r < 2; r++)
            for (size_t i = 0; i < JOIN_N; i++) {
                float want = (float)((harness_collective_value(0, i, true) +
                                      harness_collective_value(1, i, true)) / 3.0);
                assert_true(harness_get(SUMO_FLOAT32, view(j.buf[r]), i) == (double)want);
            }
    }
}

/* A table that lacks an entry, or comes from another version, is refused with its name. */
static void test_table_checked(void **state)
{
    (void)state;
    sumo_comm *c;
    assert_int_equal(sumo_comm_create_threads(1, &c), SUMO_SUCCESS);
    sumo_kernel_table t = R.table;
    t.weighted_sum = NULL;
    assert_int_equal(sumo_comm_add_kernels(c, &t), SUMO_ERR_INVALID_ARGUMENT);
    const char *m;
    sumo_comm_error_message(c, &m);
    assert_non_null(strstr(m, "weighted_sum"));
    t = R.table;
    t.struct_size = 8;
    assert_int_equal(sumo_comm_add_kernels(c, &t), SUMO_ERR_INVALID_ARGUMENT);
    sumo_comm_error_message(c, &m);
    assert_non_null(strstr(m, "struct_size"));
    sumo_comm_destroy(c);
}
int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_remote_collectives),
        cmocka_unit_test(test_remote_layers),
        cmocka_unit_test(test_remote_refused),
        cmocka_unit_test(test_remote_join),
        cmocka_unit_test(test_table_checked),
    };
    return cmocka_run_group_tests(tests, remote_setup, remote_teardown);
}
