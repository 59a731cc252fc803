/*
 * sumo's CUDA plugin (cuda/, include/sumo_cuda.h), tested in two parts.
 *
 * Host tests, everywhere (no GPU needed): the table is complete and sumo accepts it; without a
 * device every entry point says so clearly; the layout planning; and the device code itself,
 * run on the host through the emulators (kernels_cuda.h: the kernels' own per-element and
 * per-thread functions in the device's order) behind the very table glue the device uses:
 *   - every exactly defined entry (fill, scan, reduce, convert, scaled_add, weighted_sum,
 *     delta, apply_delta, slow_update) equals sumo's host table bit for bit (NaN payloads
 *     aside), all 16-bit patterns and the wide paths included;
 *   - the Gram partials and dot products are within a stated bound of a float64 reference
 *     (compensated sums) and of the host table, and do not depend on addresses;
 *   - sum, average and Adasum of "device" buffers on the threads transport at P = 2, 3, 4,
 *     as test_seams.c runs a third-party table: sum and average bit for bit the host path's,
 *     Adasum within the tree's bound of the float64 reference, identical on every rank and
 *     run;
 *   - the NCCL transport over a fake NCCL (in-process mailboxes behind the same call table the
 *     real NCCL fills): every collective bit for bit the threads transport's (same
 *     algorithms), host buffers staged, deadlines, aborts, NCCL errors, ownership.
 *
 * Device tests, where cudaGetDeviceCount finds a GPU (else one line: "skipped: no CUDA
 * device"): every entry on device memory against the host table (bit for bit where defined)
 * and the emulator (bit for bit, the Gram partials included: same order), float64 references,
 * determinism (two runs, two addresses); the threads transport with P = 2, 3, 4 ranks on one
 * GPU, a stream each, against the emulated run bit for bit; NCCL at one rank (ncclSend/Recv to
 * itself, allgather, barrier, collectives).
 *
 *   test_cuda [--quick] [--device-only]
 * --quick shrinks the device tests' sizes (for compute-sanitizer); --device-only skips the host
 * tests.
 */
#define SUMO_EXPERIMENTAL_API 1
#include "cuda_internal.h"
#include "kernels_cuda.h"
#include "nccl_api.h"
#include "sumo.h"
#include "sumo_cuda.h"
#include "sumo_ext.h"
#include "support/harness.h"
#include "support/reference.h"

#include <cuda_runtime_api.h>

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#if defined(__has_include)
#if __has_include(<nccl.h>)
#include <nccl.h>
/* The constants nccl_api.h writes out by value, checked where nccl.h is at hand. */
_Static_assert(SUMO_NCCL_SUCCESS == (int)ncclSuccess && SUMO_NCCL_SYSTEM_ERROR == (int)ncclSystemError &&
                   SUMO_NCCL_REMOTE_ERROR == (int)ncclRemoteError &&
                   SUMO_NCCL_IN_PROGRESS == (int)ncclInProgress &&
                   SUMO_NCCL_UNHANDLED_CUDA_ERROR == (int)ncclUnhandledCudaError &&
                   SUMO_NCCL_INTERNAL_ERROR == (int)ncclInternalError &&
                   SUMO_NCCL_INVALID_USAGE == (int)ncclInvalidUsage,
               "ncclResult_t values");
_Static_assert(SUMO_NCCL_UINT8 == (int)ncclUint8 && SUMO_NCCL_SUM == (int)ncclSum, "nccl enums");
_Static_assert(sizeof(ncclUniqueId) == sizeof(sumo_cuda__nccl_id), "ncclUniqueId");
#endif
#endif
_Static_assert(SUMO_CUDA_NOT_READY == (int)cudaErrorNotReady, "cudaErrorNotReady");

#define MAXP 8

/* ---- a small test runner (no framework: the device machine may lack cmocka) ------------- */

static int g_failed_checks;
static bool g_quick;

#define CHECK(cond, ...)                                                               \
    do {                                                                               \
        if (!(cond)) {                                                                 \
            fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond);   \
            fprintf(stderr, __VA_ARGS__);                                              \
            fputc('\n', stderr);                                                       \
            g_failed_checks++;                                                         \
            return;                                                                    \
        }                                                                              \
    } while (0)
#define CHECK_OK(call) CHECK((call) == SUMO_SUCCESS, "%s", #call)

typedef struct test_case {
    const char *name;
    void (*fn)(void);
} test_case;

static int run_tests(const char *group, const test_case *t, size_t n)
{
    int failed = 0;
    for (size_t i = 0; i < n; i++) {
        int before = g_failed_checks;
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        t[i].fn();
        clock_gettime(CLOCK_MONOTONIC, &b);
        double s = (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec);
        bool ok = g_failed_checks == before;
        printf("[%s] %-34s %s (%.2f s)\n", group, t[i].name, ok ? "ok" : "FAILED", s);
        fflush(stdout);
        failed += !ok;
    }
    return failed;
}

/* ---- memories: host, emulated device (an arena the emulated table claims), CUDA device --- */

enum { M_HOST, M_EMU, M_DEV };

/* Emulated device memory: ordinary allocations, registered so that the emulated table's
 * claims() (and the fake NCCL's "is device") know them, and nothing else. */
#define EMU_BLOCKS 4096
typedef struct arena {
    pthread_mutex_t lock;
    unsigned char *start[EMU_BLOCKS];
    size_t bytes[EMU_BLOCKS];
} arena;

static arena g_emu;

static bool emu_claims(void *ctx, const void *ptr, size_t bytes)
{
    arena *a = ctx;
    const unsigned char *p = ptr;
    bool found = false;
    pthread_mutex_lock(&a->lock);
    for (int i = 0; i < EMU_BLOCKS && !found; i++)
        found = a->start[i] && p >= a->start[i] && p < a->start[i] + a->bytes[i] &&
                bytes <= (size_t)(a->start[i] + a->bytes[i] - p);
    pthread_mutex_unlock(&a->lock);
    return found;
}

static void *m_alloc(int kind, size_t bytes)
{
    size_t b = bytes ? bytes : 1;
    void *p = NULL;
    switch (kind) {
    case M_HOST: p = calloc(1, b); break;
    case M_EMU:
        p = aligned_alloc(256, (b + 255) / 256 * 256);
        if (p) {
            memset(p, 0, b);
            pthread_mutex_lock(&g_emu.lock);
            int i = 0;
            while (i < EMU_BLOCKS && g_emu.start[i]) i++;
            if (i < EMU_BLOCKS) {
                g_emu.start[i] = p;
                g_emu.bytes[i] = b;
            } else {
                free(p);
                p = NULL;
            }
            pthread_mutex_unlock(&g_emu.lock);
        }
        break;
    default:
        /* cudaMemset is asynchronous (on the legacy stream): wait for it, as m_put does. */
        if (cudaMalloc(&p, b) != cudaSuccess) p = NULL;
        else if (cudaMemset(p, 0, b) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) p = NULL;
        break;
    }
    if (p == NULL) {
        fprintf(stderr, "test_cuda: out of memory (%zu bytes, memory %d)\n", bytes, kind);
        abort();
    }
    return p;
}

static void m_free(int kind, void *p)
{
    if (kind == M_HOST) {
        free(p);
    } else if (kind == M_EMU) {
        pthread_mutex_lock(&g_emu.lock);
        for (int i = 0; i < EMU_BLOCKS; i++)
            if (g_emu.start[i] == p) g_emu.start[i] = NULL;
        pthread_mutex_unlock(&g_emu.lock);
        free(p);
    } else {
        cudaFree(p);
    }
}

static void m_copy_failed(const char *what, cudaError_t e)
{
    fprintf(stderr, "test_cuda: %s: %s\n", what, cudaGetErrorString(e));
    abort();
}

/* cudaMemcpy from pageable memory returns once the data is staged, not once it has landed,
 * and it runs on the legacy default stream, which a stream made with cudaStreamNonBlocking
 * (the checks' streams) does not wait for: a kernel there could read the buffer before the
 * copy reaches it. So the upload is waited for here, device-wide. */
static void m_put(int kind, void *dst, const void *src, size_t bytes)
{
    if (kind != M_DEV) {
        memcpy(dst, src, bytes);
        return;
    }
    cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice);
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    if (e != cudaSuccess) m_copy_failed("upload", e);
}

/* The entries wait for their stream before they return, so their results are complete. */
static void m_get(int kind, void *dst, const void *src, size_t bytes)
{
    if (kind != M_DEV) {
        memcpy(dst, src, bytes);
        return;
    }
    cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) m_copy_failed("download", e);
}

/* ---- data ------------------------------------------------------------------------------- */

static const sumo_dtype DTS[] = {SUMO_FLOAT32, SUMO_FLOAT64, SUMO_FLOAT16, SUMO_BFLOAT16};
static const char *DT_NAME[] = {"fp32", "fp64", "fp16", "bf16"};

static size_t esz(sumo_dtype dt) { return harness_dtype_size(dt); }

/* Random values in [-4, 4) rounded to the dtype, with specials at fixed places when asked:
 * NaN, +-Inf, signed zeros, subnormals of the format, values near its overflow. */
static void gen(sumo_dtype dt, void *buf, size_t n, uint64_t seed, bool specials)
{
    for (size_t i = 0; i < n; i++) {
        double v = 4.0 * harness_uniform_at(seed, 7, i);
        if (specials) {
            switch (i % 101) {
            case 11: v = NAN; break;
            case 23: v = INFINITY; break;
            case 37: v = -INFINITY; break;
            case 41: v = -0.0; break;
            case 53: v = dt == SUMO_FLOAT16 ? 3e-6 : dt == SUMO_FLOAT64 ? 1e-310 : 3e-39; break;
            case 67: v = dt == SUMO_FLOAT16 ? 60000.0 : dt == SUMO_BFLOAT16 ? 3e38 : 3e38; break;
            default: break;
            }
        }
        harness_set(dt, buf, i, v);
    }
}

static uint64_t bits_at(sumo_dtype dt, const void *buf, size_t i)
{
    switch (esz(dt)) {
    case 2: return ((const uint16_t *)buf)[i];
    case 4: return ((const uint32_t *)buf)[i];
    default: return ((const uint64_t *)buf)[i];
    }
}

static bool bits_nan(sumo_dtype dt, uint64_t b)
{
    switch (dt) {
    case SUMO_FLOAT32: return (b & 0x7fffffffu) > 0x7f800000u;
    case SUMO_FLOAT64: return (b & 0x7fffffffffffffffull) > 0x7ff0000000000000ull;
    case SUMO_FLOAT16: return ref_is_nan_half((uint16_t)b);
    default: return ref_is_nan_bf16((uint16_t)b);
    }
}

/* The first element where a and b differ (both NaN counts as equal: a GPU makes its own NaN),
 * or SIZE_MAX. */
static size_t first_diff(sumo_dtype dt, const void *a, const void *b, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t x = bits_at(dt, a, i), y = bits_at(dt, b, i);
        if (x != y && !(bits_nan(dt, x) && bits_nan(dt, y))) return i;
    }
    return SIZE_MAX;
}

/* ---- tables ------------------------------------------------------------------------------ */

static const sumo_kernel_table *g_host;
static sumo_cuda_kernels *g_emu_kernels;
static const sumo_kernel_table *g_emu_table;
static sumo_cuda_kernels *g_dev_kernels;
static const sumo_kernel_table *g_dev_table;

static const sumo_kernel_table *table_of(int kind)
{
    return kind == M_HOST ? g_host : kind == M_EMU ? g_emu_table : g_dev_table;
}

/* =============================== host tests ============================================== */

static void t_table_complete(void)
{
    const sumo_kernel_table *t = g_emu_table;
    CHECK(t->struct_size == sizeof(sumo_kernel_table), "struct_size %zu", t->struct_size);
    CHECK(strcmp(t->memory, "cuda") == 0, "memory %s", t->memory);
    const void *entries[] = {t->claims, t->alloc, t->release, t->synchronize, t->copy, t->fill,
                             t->first_nonfinite, t->reduce, t->convert, t->dot_norms,
                             t->scaled_add, t->gram_partials, t->weighted_sum, t->delta,
                             t->apply_delta, t->slow_update, t->quantize, t->dequantize,
                             t->outer_update};
    for (size_t i = 0; i < sizeof entries / sizeof entries[0]; i++)
        CHECK(entries[i] != NULL, "entry %zu missing", i);
    /* sumo accepts it (its own completeness check), also through sumo_comm_add_cuda. */
    sumo_comm *c;
    CHECK_OK(sumo_comm_create_threads(1, &c));
    CHECK_OK(sumo_comm_add_kernels(c, t));
    CHECK_OK(sumo_comm_add_cuda(c, g_emu_kernels));
    CHECK(sumo_comm_add_cuda(c, NULL) == SUMO_ERR_INVALID_ARGUMENT, "NULL kernels");
    CHECK(sumo_comm_add_cuda(NULL, g_emu_kernels) == SUMO_ERR_INVALID_ARGUMENT, "NULL comm");
    const sumo_kernel_table *back = NULL;
    CHECK_OK(sumo_cuda_kernels_table(g_emu_kernels, &back));
    CHECK(back == t, "the table of the object");
    CHECK(sumo_cuda_kernels_table(NULL, &back) == SUMO_ERR_INVALID_ARGUMENT, "NULL");
    CHECK_OK(sumo_cuda_kernels_destroy(NULL));
    sumo_comm_destroy(c);
}

/* stderr into a temporary file while a call that reports there runs (the test checks the
 * line instead of showing it). */
typedef struct captured {
    int saved;
    FILE *file;
} captured;

static captured capture_begin(void)
{
    captured c = {.saved = -1, .file = tmpfile()};
    fflush(stderr);
    if (c.file) {
        c.saved = dup(2);
        dup2(fileno(c.file), 2);
    }
    return c;
}

static void capture_end(captured *c, char *text, size_t bytes)
{
    text[0] = '\0';
    fflush(stderr);
    if (c->file == NULL) return;
    dup2(c->saved, 2);
    close(c->saved);
    rewind(c->file);
    size_t got = fread(text, 1, bytes - 1, c->file);
    text[got] = '\0';
    fclose(c->file);
}

/* Without a device every entry point says so, and nothing crashes. */
static void t_no_device(void)
{
    int n = -1;
    char msg[256] = "";
    CHECK_OK(sumo_cuda_device_count(&n, msg, sizeof msg));
    CHECK(sumo_cuda_device_count(NULL, msg, sizeof msg) == SUMO_ERR_INVALID_ARGUMENT, "NULL");
    if (n > 0) {
        CHECK(strstr(msg, "CUDA device") != NULL, "message %s", msg);
        return; /* the device tests cover the rest */
    }
    CHECK(n == 0, "count %d", n);
    CHECK(strstr(msg, "no CUDA device") != NULL, "message: %s", msg);
    sumo_cuda_kernels *k = (sumo_cuda_kernels *)1;
    char said[512];
    captured cap = capture_begin();
    sumo_result r = sumo_cuda_kernels_create(0, &k);
    capture_end(&cap, said, sizeof said);
    CHECK(r == SUMO_ERR_INVALID_USAGE, "kernels_create without a device: %s", sumo_result_name(r));
    CHECK(k == NULL, "no object");
    CHECK(strstr(said, "sumo_cuda_kernels_create: no CUDA device") != NULL, "stderr: %s", said);
    cap = capture_begin();
    r = sumo_cuda_kernels_create(-1, &k);
    capture_end(&cap, said, sizeof said);
    CHECK(r == SUMO_ERR_INVALID_USAGE, "kernels_create(-1) without a device: %s", sumo_result_name(r));
    /* The real claims() of a host pointer is false without a driver (the object is the
     * emulated one with its emulation switched off: the device path's claims). */
    sumo_cuda_kernels *e;
    CHECK_OK(sumo_cuda__kernels_create_emulated(emu_claims, &g_emu, &e));
    e->emulated = false;
    float x[4];
    CHECK(!e->table.claims(e->table.ctx, x, sizeof x), "a host pointer is not claimed");
    e->emulated = true;
    sumo_cuda_kernels_destroy(e);
}

static void t_api_arguments(void)
{
    sumo_comm *c = (sumo_comm *)1;
    CHECK(sumo_comm_create_nccl(NULL, NULL, &c) == SUMO_ERR_INVALID_ARGUMENT, "NULL comm");
    CHECK(sumo_cuda_allreduce(NULL, NULL, 0, SUMO_FLOAT32, SUMO_OP_SUM, NULL, NULL) ==
              SUMO_ERR_INVALID_ARGUMENT,
          "NULL comm");
    unsigned char id[128];
    CHECK(sumo_nccl_unique_id(id, 64) == SUMO_ERR_INVALID_ARGUMENT, "short id");
    CHECK(sumo_comm_create_nccl_rank(2, id, sizeof id, 2, -1, NULL, &c) == SUMO_ERR_INVALID_ARGUMENT,
          "rank out of range");
    CHECK(sumo_cuda_kernels_create(0, NULL) == SUMO_ERR_INVALID_ARGUMENT, "NULL out");
}

/* The pieces and items of a layout range, against a plain walk. */
static void t_plan(void)
{
    for (uint64_t seed = 1; seed <= 300; seed++) {
        size_t T = 1 + (size_t)(harness_next(&seed) % 12), off[14] = {0};
        for (size_t t = 0; t < T; t++) {
            uint64_t r = harness_next(&seed) % 5;
            off[t + 1] = off[t] + (r == 0 ? 0 : r == 1 ? 1 : (size_t)(harness_next(&seed) % 40000));
        }
        size_t total = off[T], lo = total ? (size_t)(harness_next(&seed) % (total + 1)) : 0;
        size_t hi = lo + (total > lo ? (size_t)(harness_next(&seed) % (total - lo + 1)) : 0);
        size_t chunk = 1 + (size_t)(harness_next(&seed) % 9000), items = 0;
        sumo_cuda__piece p[16];
        size_t np = sumo_cuda__plan(off, T, lo, hi, chunk, p, 16, &items);
        size_t want_np = 0, want_items = 0;
        for (size_t t = 0; t < T; t++) {
            size_t s = off[t] > lo ? off[t] : lo, e = off[t + 1] < hi ? off[t + 1] : hi;
            if (e <= s) continue;
            CHECK(want_np < np, "seed %llu: too few pieces", (unsigned long long)seed);
            const sumo_cuda__piece *q = &p[want_np];
            CHECK(q->tensor == t && q->start == s - lo && q->len == e - s && q->first_item == want_items,
                  "seed %llu piece %zu", (unsigned long long)seed, want_np);
            want_items += (e - s + chunk - 1) / chunk;
            want_np++;
        }
        CHECK(np == want_np && items == want_items, "seed %llu: %zu pieces %zu items", (unsigned long long)seed, np, items);
    }
}

/* Every 16-bit pattern widened, and narrowing from float and double (round to nearest even,
 * through round-to-odd from double), as the host table converts them. */
static void check_convert_patterns(int kind)
{
    const sumo_kernel_table *k = table_of(kind);
    enum { N = 65536 };
    uint16_t *h16 = malloc(N * sizeof *h16);
    float *hf = malloc(N * sizeof *hf), *wf = malloc(N * sizeof *wf);
    double *hd = malloc(N * sizeof *hd), *wd = malloc(N * sizeof *wd);
    uint16_t *w16 = malloc(N * sizeof *w16);
    void *d16 = m_alloc(kind, N * 2), *d32 = m_alloc(kind, N * 4), *d64 = m_alloc(kind, N * 8);
    for (int fmt = 0; fmt < 2; fmt++) {
        sumo_dtype dt = fmt ? SUMO_BFLOAT16 : SUMO_FLOAT16;
        for (size_t i = 0; i < N; i++) h16[i] = (uint16_t)i;
        m_put(kind, d16, h16, N * 2);
        CHECK_OK(k->convert(k->ctx, NULL, SUMO_FLOAT32, d32, dt, d16, N));
        CHECK_OK(g_host->convert(g_host->ctx, NULL, SUMO_FLOAT32, wf, dt, h16, N));
        m_get(kind, hf, d32, N * 4);
        size_t at = first_diff(SUMO_FLOAT32, hf, wf, N);
        CHECK(at == SIZE_MAX, "%s -> fp32: pattern %zx", DT_NAME[dt], at);
        /* float -> 16 bits: every float near each 16-bit value and the halfway points. */
        uint64_t s = 99 + (uint64_t)fmt;
        for (size_t i = 0; i < N; i++) {
            uint32_t u;
            memcpy(&u, &wf[i], 4);
            u += (uint32_t)(harness_next(&s) % 0x4000u) - 0x2000u;
            if (i % 3 == 0) u = (uint32_t)harness_next(&s);
            memcpy(&hf[i], &u, 4);
        }
        m_put(kind, d32, hf, N * 4);
        CHECK_OK(k->convert(k->ctx, NULL, dt, d16, SUMO_FLOAT32, d32, N));
        CHECK_OK(g_host->convert(g_host->ctx, NULL, dt, w16, SUMO_FLOAT32, hf, N));
        m_get(kind, h16, d16, N * 2);
        at = first_diff(dt, h16, w16, N);
        CHECK(at == SIZE_MAX, "fp32 -> %s at %zu (%a)", DT_NAME[dt], at, (double)hf[at]);
        /* double -> 16 bits: values just off the halfway points (where double rounding errs). */
        for (size_t i = 0; i < N; i++) {
            double v = (double)wf[i];
            hd[i] = isfinite(v) ? v * (1 + ldexp(harness_uniform(&s), -20 - (int)(i % 30))) : v;
        }
        m_put(kind, d64, hd, N * 8);
        CHECK_OK(k->convert(k->ctx, NULL, dt, d16, SUMO_FLOAT64, d64, N));
        CHECK_OK(g_host->convert(g_host->ctx, NULL, dt, w16, SUMO_FLOAT64, hd, N));
        m_get(kind, h16, d16, N * 2);
        at = first_diff(dt, h16, w16, N);
        CHECK(at == SIZE_MAX, "fp64 -> %s at %zu (%a)", DT_NAME[dt], at, hd[at]);
        /* and back to double (exact) */
        CHECK_OK(k->convert(k->ctx, NULL, SUMO_FLOAT64, d64, dt, d16, N));
        CHECK_OK(g_host->convert(g_host->ctx, NULL, SUMO_FLOAT64, wd, dt, w16, N));
        m_get(kind, hd, d64, N * 8);
        at = first_diff(SUMO_FLOAT64, hd, wd, N);
        CHECK(at == SIZE_MAX, "%s -> fp64 at %zu", DT_NAME[dt], at);
    }
    m_free(kind, d16);
    m_free(kind, d32);
    m_free(kind, d64);
    free(h16);
    free(hf);
    free(wf);
    free(hd);
    free(wd);
    free(w16);
}

/* ---- the exactly defined entries, on `kind` memory, against the host table ---------------- */

/* A buffer of n elements at `off` elements past a 256-byte boundary (off 1: every 16-byte
 * vector path off, so the device's scalar path runs). */
typedef struct tbuf {
    unsigned char *base, *p;
} tbuf;

static tbuf t_alloc(int kind, sumo_dtype dt, size_t n, size_t off)
{
    tbuf b;
    b.base = m_alloc(kind, (n + off) * esz(dt) + 16);
    b.p = b.base + off * esz(dt);
    return b;
}

static tbuf t_upload(int kind, sumo_dtype dt, const void *host, size_t n, size_t off)
{
    tbuf b = t_alloc(kind, dt, n, off);
    m_put(kind, b.p, host, n * esz(dt));
    return b;
}

typedef struct entry_run {
    int kind;
    const sumo_kernel_table *k;
    void *stream;
} entry_run;

/* n elements of `kind` memory brought back for comparison. */
static void *fetch(int kind, sumo_dtype dt, const tbuf *b, size_t n)
{
    void *h = malloc(n * esz(dt) + 1);
    m_get(kind, h, b->p, n * esz(dt));
    return h;
}

static void check_fill_scan(const entry_run *er, sumo_dtype dt, size_t n, size_t off)
{
    const double values[] = {0.1, -0.0, 1e10, 65519.0, 65520.0, NAN, 1e-8, -3.5, 1e300};
    for (size_t v = 0; v < sizeof values / sizeof values[0]; v++) {
        tbuf b = t_alloc(er->kind, dt, n, off);
        void *want = malloc(n * esz(dt) + 1);
        CHECK_OK(er->k->fill(er->k->ctx, er->stream, dt, b.p, values[v], n));
        CHECK_OK(g_host->fill(g_host->ctx, NULL, dt, want, values[v], n));
        void *got = fetch(er->kind, dt, &b, n);
        size_t at = first_diff(dt, got, want, n);
        CHECK(at == SIZE_MAX, "fill %s %g n %zu at %zu", DT_NAME[dt], values[v], n, at);
        free(got);
        free(want);
        m_free(er->kind, b.base);
    }
    /* The first non-finite: none, one, two (the first wins), at the ends. */
    void *h = malloc(n * esz(dt) + 1);
    const size_t where[][2] = {{SIZE_MAX, SIZE_MAX}, {0, SIZE_MAX}, {n - 1, SIZE_MAX},
                               {n / 2, n / 3}, {n / 3, n - 1}};
    for (size_t w = 0; w < sizeof where / sizeof where[0]; w++) {
        gen(dt, h, n, 5, false);
        for (int j = 0; j < 2; j++)
            if (where[w][j] < n) harness_set(dt, h, where[w][j], j ? INFINITY : NAN);
        tbuf b = t_upload(er->kind, dt, h, n, off);
        size_t got = 7, want = 9;
        CHECK_OK(er->k->first_nonfinite(er->k->ctx, er->stream, dt, b.p, n, &got));
        CHECK_OK(g_host->first_nonfinite(g_host->ctx, NULL, dt, h, n, &want));
        CHECK(got == want, "scan %s n %zu case %zu: %zu, host %zu", DT_NAME[dt], n, w, got, want);
        m_free(er->kind, b.base);
    }
    free(h);
}

static void check_reduce(const entry_run *er, sumo_dtype dt, size_t n, size_t off, int nin,
                         int nout, int divisor, bool in_place)
{
    size_t bytes = n * esz(dt);
    void *hin[40] = {0}, *hout[4] = {0};
    tbuf din[40] = {0}, dout[4] = {0};
    for (int j = 0; j < nin; j++) {
        hin[j] = malloc(bytes + 1);
        gen(dt, hin[j], n, 100 + (uint64_t)j, j == 1);
        din[j] = t_upload(er->kind, dt, hin[j], n, off);
    }
    for (int o = 0; o < nout; o++) {
        hout[o] = malloc(bytes + 1);
        dout[o] = t_alloc(er->kind, dt, n, off);
    }
    if (in_place) { /* outs[0] is ins[0], as the shared-memory algorithms run in place */
        memcpy(hout[0], hin[0], bytes);
        m_free(er->kind, dout[0].base);
        dout[0] = din[0];
    }
    const void *ki[40], *hi_[40];
    void *ko[4], *ho[4];
    for (int j = 0; j < nin; j++) ki[j] = din[j].p, hi_[j] = hin[j];
    for (int o = 0; o < nout; o++) ko[o] = dout[o].p, ho[o] = hout[o];
    if (in_place) hi_[0] = hout[0];
    CHECK_OK(er->k->reduce(er->k->ctx, er->stream, dt, ko, nout, ki, nin, n, divisor));
    CHECK_OK(g_host->reduce(g_host->ctx, NULL, dt, ho, nout, hi_, nin, n, divisor));
    for (int o = 0; o < nout; o++) {
        void *got = fetch(er->kind, dt, &dout[o], n);
        size_t at = first_diff(dt, got, hout[o], n);
        free(got);
        CHECK(at == SIZE_MAX, "reduce %s n %zu off %zu nin %d nout %d div %d in place %d: out %d at %zu",
              DT_NAME[dt], n, off, nin, nout, divisor, in_place, o, at);
    }
    for (int j = 0; j < nin; j++) {
        free(hin[j]);
        m_free(er->kind, din[j].base);
    }
    for (int o = 0; o < nout; o++) {
        free(hout[o]);
        if (!(in_place && o == 0)) m_free(er->kind, dout[o].base);
    }
}

/* Two-buffer entries: convert, scaled_add, delta, apply_delta, slow_update. */
static void check_elementwise(const entry_run *er, sumo_dtype dt, size_t n, size_t off)
{
    size_t bytes = n * esz(dt);
    void *a = malloc(bytes + 1), *b = malloc(bytes + 1), *c = malloc(bytes + 1), *w = malloc(8 * n + 8);
    gen(dt, a, n, 1, true);
    gen(dt, b, n, 2, true);
    /* convert to and from every dtype */
    for (size_t d = 0; d < 4; d++) {
        sumo_dtype to = DTS[d];
        tbuf src = t_upload(er->kind, dt, a, n, off), dst = t_alloc(er->kind, to, n, off);
        CHECK_OK(er->k->convert(er->k->ctx, er->stream, to, dst.p, dt, src.p, n));
        CHECK_OK(g_host->convert(g_host->ctx, NULL, to, w, dt, a, n));
        void *got = fetch(er->kind, to, &dst, n);
        size_t at = first_diff(to, got, w, n);
        free(got);
        m_free(er->kind, src.base);
        m_free(er->kind, dst.base);
        CHECK(at == SIZE_MAX, "convert %s -> %s n %zu off %zu at %zu", DT_NAME[dt], DT_NAME[to], n, off, at);
    }
    /* scaled_add: ordinary coefficients, and ones outside float's range (the wide path) */
    const double co[][2] = {{0.75, -1.25}, {1e-40, 3.0}, {2.5, 1e39}, {-0.5, 0.0}};
    for (size_t q = 0; q < sizeof co / sizeof co[0]; q++) {
        tbuf x = t_upload(er->kind, dt, a, n, off), y = t_upload(er->kind, dt, b, n, off);
        memcpy(c, a, bytes);
        CHECK_OK(er->k->scaled_add(er->k->ctx, er->stream, dt, x.p, co[q][0], y.p, co[q][1], n));
        CHECK_OK(g_host->scaled_add(g_host->ctx, NULL, dt, c, co[q][0], b, co[q][1], n));
        void *got = fetch(er->kind, dt, &x, n);
        size_t at = first_diff(dt, got, c, n);
        free(got);
        m_free(er->kind, x.base);
        m_free(er->kind, y.base);
        CHECK(at == SIZE_MAX, "scaled_add %s (%g, %g) n %zu off %zu at %zu", DT_NAME[dt], co[q][0],
              co[q][1], n, off, at);
    }
    /* delta, and apply_delta with its first non-finite result */
    {
        tbuf x = t_upload(er->kind, dt, a, n, off), y = t_upload(er->kind, dt, b, n, off);
        tbuf z = t_alloc(er->kind, dt, n, off);
        CHECK_OK(er->k->delta(er->k->ctx, er->stream, dt, z.p, x.p, y.p, n));
        CHECK_OK(g_host->delta(g_host->ctx, NULL, dt, c, a, b, n));
        void *got = fetch(er->kind, dt, &z, n);
        size_t at = first_diff(dt, got, c, n);
        free(got);
        CHECK(at == SIZE_MAX, "delta %s n %zu at %zu", DT_NAME[dt], n, at);
        /* finite inputs whose sum overflows the 16-bit formats late in the buffer */
        gen(dt, a, n, 3, false);
        gen(dt, b, n, 4, false);
        if (n > 3) {
            harness_set(dt, a, n - 2, dt == SUMO_FLOAT16 ? 60000.0 : 3e38);
            harness_set(dt, b, n - 2, dt == SUMO_FLOAT16 ? 60000.0 : dt == SUMO_FLOAT64 ? 3e38 : 3e38);
        }
        m_put(er->kind, x.p, a, bytes);
        m_put(er->kind, y.p, b, bytes);
        size_t gf = 1, wf = 2;
        CHECK_OK(er->k->apply_delta(er->k->ctx, er->stream, dt, z.p, x.p, y.p, n, &gf));
        CHECK_OK(g_host->apply_delta(g_host->ctx, NULL, dt, c, a, b, n, &wf));
        got = fetch(er->kind, dt, &z, n);
        at = first_diff(dt, got, c, n);
        free(got);
        CHECK(at == SIZE_MAX && gf == wf, "apply_delta %s n %zu at %zu first %zu / %zu", DT_NAME[dt], n,
              at, gf, wf);
        m_free(er->kind, x.base);
        m_free(er->kind, y.base);
        m_free(er->kind, z.base);
    }
    /* slow_update (fp32, fp64; the 16-bit formats are refused by both) */
    {
        gen(dt, a, n, 6, false);
        gen(dt, b, n, 7, false);
        gen(dt, c, n, 8, false);
        if (n > 5 && dt == SUMO_FLOAT32) harness_set(dt, b, 5, 3e38); /* u overflows: x NaN */
        tbuf x = t_upload(er->kind, dt, a, n, off), u = t_upload(er->kind, dt, b, n, off);
        tbuf x0 = t_upload(er->kind, dt, c, n, off);
        sumo_result r1 = er->k->slow_update(er->k->ctx, er->stream, dt, x.p, u.p, x0.p, n, 0.7, 0.9, 1e-3);
        sumo_result r2 = g_host->slow_update(g_host->ctx, NULL, dt, a, b, c, n, 0.7, 0.9, 1e-3);
        CHECK(r1 == r2, "slow_update %s: %s / %s", DT_NAME[dt], sumo_result_name(r1), sumo_result_name(r2));
        if (r1 == SUMO_SUCCESS) {
            const tbuf *mine[3] = {&x, &u, &x0};
            void *want[3] = {a, b, c};
            for (int i = 0; i < 3; i++) {
                void *got = fetch(er->kind, dt, mine[i], n);
                size_t at = first_diff(dt, got, want[i], n);
                /* the NaN that a u overflow makes is the host's bit pattern too */
                bool same_bits = memcmp(got, want[i], bytes) == 0 || er->kind == M_DEV;
                free(got);
                CHECK(at == SIZE_MAX && same_bits, "slow_update %s buffer %d at %zu", DT_NAME[dt], i, at);
            }
        }
        m_free(er->kind, x.base);
        m_free(er->kind, u.base);
        m_free(er->kind, x0.base);
    }
    free(a);
    free(b);
    free(c);
    free(w);
}

/* outer_update (fp32, fp64) against the host table, every branch: Nesterov and heavy ball,
 * from the average or from the change, merge 0 and not, in place (c is x) and not, a momentum
 * that overflows (g NaN). */
static void check_outer(const entry_run *er, sumo_dtype dt, size_t n, size_t off)
{
    if (dt != SUMO_FLOAT32 && dt != SUMO_FLOAT64) return;
    size_t bytes = n * esz(dt);
    void *h[4], *w[4];
    for (int i = 0; i < 4; i++) {
        h[i] = malloc(bytes + 1);
        w[i] = malloc(bytes + 1);
        gen(dt, h[i], n, 20 + (uint64_t)i, false);
    }
    if (n > 5 && dt == SUMO_FLOAT32) harness_set(dt, h[2], 5, 3e38); /* v overflows */
    const sumo_outer_step steps[] = {{1, 0, 0.7, 0.9, 1.0, 0.0}, {1, 1, 0.7, 0.9, 1.0, 0.5},
                                     {0, 1, 0.1 * 1e-3, 0.5, 1e-3, 0.0}, {0, 0, 2.0, 0.0, 0.5, 0.25}};
    for (size_t q = 0; q < sizeof steps / sizeof steps[0]; q++)
        for (int in_place = 0; in_place <= 1; in_place++) {
            tbuf b[4];
            for (int i = 0; i < 4; i++) {
                b[i] = t_upload(er->kind, dt, h[i], n, off);
                memcpy(w[i], h[i], bytes);
            }
            /* x, c, v, x0 */
            const void *kc = in_place ? b[0].p : b[1].p, *hc = in_place ? w[0] : w[1];
            CHECK_OK(er->k->outer_update(er->k->ctx, er->stream, dt, b[0].p, kc, b[2].p, b[3].p, n, &steps[q]));
            CHECK_OK(g_host->outer_update(g_host->ctx, NULL, dt, w[0], hc, w[2], w[3], n, &steps[q]));
            for (int i = 0; i < 4; i++) {
                void *got = fetch(er->kind, dt, &b[i], n);
                size_t at = first_diff(dt, got, w[i], n);
                bool same_bits = memcmp(got, w[i], bytes) == 0 || er->kind == M_DEV;
                free(got);
                CHECK(at == SIZE_MAX && same_bits, "outer_update %s step %zu in place %d buffer %d at %zu",
                      DT_NAME[dt], q, in_place, i, at);
                m_free(er->kind, b[i].base);
            }
        }
    for (int i = 0; i < 4; i++) {
        free(h[i]);
        free(w[i]);
    }
}

/* quantize and dequantize against the host table: the payload byte for byte, the decoded
 * values bit for bit and the first non-finite element, for every format, short last blocks,
 * all-zero blocks, NaN and Inf, and the largest magnitudes. */
static void check_codec(const entry_run *er, size_t n, size_t off)
{
    const sumo_compression_format fmts[] = {SUMO_COMPRESS_BF16, SUMO_COMPRESS_FP8_E4M3,
                                            SUMO_COMPRESS_E3M0};
    const size_t blocks[] = {8, 32, 256, 4096};
    float *x = malloc(n * sizeof *x + 4), *gotf = malloc(n * sizeof *x + 4), *wantf = malloc(n * sizeof *x + 4);
    for (size_t fi = 0; fi < 3; fi++)
        for (size_t bi = 0; bi < 4; bi++)
            for (int special = 0; special <= 1; special++) {
                size_t block = blocks[bi];
                gen(SUMO_FLOAT32, x, n, 30 + fi, false);
                for (size_t i = 0; i < n; i++) x[i] *= (float)ldexp(1.0, (int)((i / block) % 40) * 6 - 120);
                if (special) {
                    for (size_t i = 0; i < n && i < block; i++) x[i] = 0.0f; /* a zero block */
                    /* A block of ties between consecutive codes (the largest value first: scale
                     * 1), where the rounding rule alone decides. */
                    uint32_t count = ref_code_count(fmts[fi]);
                    for (size_t i = block, c = 0; i < n && i < 2 * block; i++, c = (c + 1) % (count - 1))
                        x[i] = i == block ? (float)ref_code_value(fmts[fi], count - 1)
                                          : (float)((ref_code_value(fmts[fi], (uint32_t)c) +
                                                     ref_code_value(fmts[fi], (uint32_t)c + 1)) / 2);
                    if (n > 3) x[n - 2] = -FLT_MAX;
                    if (n > 20) x[n / 2] = NAN;
                    if (n > 40) x[n / 3] = INFINITY;
                }
                sumo_compression c = {.struct_size = sizeof c, .format = fmts[fi], .block_size = block,
                                      .op = SUMO_OP_SUM};
                size_t pb = 0;
                CHECK_OK(sumo_compressed_bytes(&c, n, &pb));
                unsigned char *hp = malloc(pb + 1), *kp = malloc(pb + 1);
                memset(hp, 0xa5, pb);
                tbuf src = t_upload(er->kind, SUMO_FLOAT32, x, n, off), dst = t_alloc(er->kind, SUMO_FLOAT32, n, off);
                unsigned char *payload = m_alloc(er->kind, pb + 16);
                size_t f1 = 1, f2 = 2;
                CHECK_OK(er->k->quantize(er->k->ctx, er->stream, fmts[fi], block, payload, (const float *)(const void *)src.p, n, &f1));
                CHECK_OK(g_host->quantize(g_host->ctx, NULL, fmts[fi], block, hp, x, n, &f2));
                m_get(er->kind, kp, payload, pb);
                CHECK(f1 == f2 && memcmp(hp, kp, pb) == 0, "quantize format %d block %zu n %zu special %d: first %zu / %zu, payload %s",
                      (int)fmts[fi], block, n, special, f1, f2, memcmp(hp, kp, pb) ? "differs" : "same");
                CHECK_OK(er->k->dequantize(er->k->ctx, er->stream, fmts[fi], block, (float *)(void *)dst.p, payload, n));
                CHECK_OK(g_host->dequantize(g_host->ctx, NULL, fmts[fi], block, wantf, hp, n));
                m_get(er->kind, gotf, dst.p, n * sizeof(float));
                size_t at = first_diff(SUMO_FLOAT32, gotf, wantf, n);
                CHECK(at == SIZE_MAX, "dequantize format %d block %zu n %zu at %zu", (int)fmts[fi], block, n, at);
                m_free(er->kind, src.base);
                m_free(er->kind, dst.base);
                m_free(er->kind, payload);
                free(hp);
                free(kp);
            }
    free(x);
    free(gotf);
    free(wantf);
}

/* A layout with empty tensors and one spanning several items. */
static const size_t LAYOUT[] = {7, 0, 130, 1, 500, 33, 0, 70001, 4096};
#define NLAYOUT (sizeof LAYOUT / sizeof LAYOUT[0])

static size_t layout_offsets(size_t *off)
{
    off[0] = 0;
    for (size_t t = 0; t < NLAYOUT; t++) off[t + 1] = off[t] + LAYOUT[t];
    return off[NLAYOUT];
}

static void check_weighted(const entry_run *er, sumo_dtype dt, int nin, int nout, bool in_place,
                           size_t lo_cut, size_t hi_cut, size_t off)
{
    size_t offs[NLAYOUT + 1], total = layout_offsets(offs);
    size_t lo = lo_cut, hi = total - hi_cut, n = hi - lo, bytes = n * esz(dt);
    double w[NLAYOUT * 16];
    uint64_t s = 77 + (uint64_t)nin;
    for (size_t i = 0; i < NLAYOUT * (size_t)nin; i++) w[i] = 2.0 * harness_uniform(&s);
    w[2 * nin + nin - 1] = 1e-40; /* tensor 2: a weight outside float's range (wide path) */
    w[4 * nin] = -3e39;           /* tensor 4: another */
    void *hin[16] = {0}, *hout[4] = {0};
    tbuf din[16] = {0}, dout[4] = {0};
    for (int j = 0; j < nin; j++) {
        hin[j] = malloc(bytes + 1);
        gen(dt, hin[j], n, 300 + (uint64_t)j, j == 0);
        din[j] = t_upload(er->kind, dt, hin[j], n, off);
    }
    for (int o = 0; o < nout; o++) {
        hout[o] = malloc(bytes + 1);
        dout[o] = t_alloc(er->kind, dt, n, off);
    }
    if (in_place) {
        memcpy(hout[0], hin[0], bytes);
        m_free(er->kind, dout[0].base);
        dout[0] = din[0];
    }
    const void *ki[16], *hi_[16];
    void *ko[4], *ho[4];
    for (int j = 0; j < nin; j++) ki[j] = din[j].p, hi_[j] = hin[j];
    for (int o = 0; o < nout; o++) ko[o] = dout[o].p, ho[o] = hout[o];
    if (in_place) hi_[0] = hout[0];
    CHECK_OK(er->k->weighted_sum(er->k->ctx, er->stream, dt, ko, nout, ki, nin, offs, NLAYOUT, lo, hi, w));
    CHECK_OK(g_host->weighted_sum(g_host->ctx, NULL, dt, ho, nout, hi_, nin, offs, NLAYOUT, lo, hi, w));
    for (int o = 0; o < nout; o++) {
        void *got = fetch(er->kind, dt, &dout[o], n);
        size_t at = first_diff(dt, got, hout[o], n);
        free(got);
        CHECK(at == SIZE_MAX, "weighted_sum %s nin %d nout %d in place %d [%zu, %zu) off %zu: out %d at %zu",
              DT_NAME[dt], nin, nout, in_place, lo, hi, off, o, at);
    }
    for (int j = 0; j < nin; j++) {
        free(hin[j]);
        m_free(er->kind, din[j].base);
    }
    for (int o = 0; o < nout; o++) {
        free(hout[o]);
        if (!(in_place && o == 0)) m_free(er->kind, dout[o].base);
    }
}

static void check_exact_entries(int kind)
{
    entry_run er = {.kind = kind, .k = table_of(kind)};
    cudaStream_t s = NULL;
    if (kind == M_DEV) {
        CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "stream");
        er.stream = s;
    }
    const size_t sizes_full[] = {1, 7, 1000, 100003}, sizes_quick[] = {1, 7, 1000};
    const size_t *sizes = g_quick ? sizes_quick : sizes_full;
    size_t nsizes = g_quick ? 3 : 4;
    int before = g_failed_checks;
    for (size_t d = 0; d < 4 && g_failed_checks == before; d++)
        for (size_t si = 0; si < nsizes && g_failed_checks == before; si++)
            for (size_t off = 0; off <= 1; off++) {
                size_t n = sizes[si];
                check_fill_scan(&er, DTS[d], n, off);
                check_elementwise(&er, DTS[d], n, off);
                check_outer(&er, DTS[d], n, off);
                if (DTS[d] == SUMO_FLOAT32) check_codec(&er, n, off);
                const int shapes[][3] = {{1, 1, 3}, {2, 1, 1}, {2, 2, 2}, {3, 4, 1}, {5, 1, 5}};
                for (size_t q = 0; q < sizeof shapes / sizeof shapes[0]; q++)
                    for (int ip = 0; ip <= 1; ip++)
                        check_reduce(&er, DTS[d], n, off, shapes[q][0], shapes[q][1], shapes[q][2], ip);
                if (n <= 1000) check_reduce(&er, DTS[d], n, off, 40, 3, 40, false); /* far pointers */
                if (g_failed_checks != before) break;
            }
    for (size_t d = 0; d < 4 && g_failed_checks == before; d++) {
        const int nins[] = {1, 2, 3, 5, 8, 9, 16};
        for (size_t q = 0; q < sizeof nins / sizeof nins[0]; q++) {
            check_weighted(&er, DTS[d], nins[q], 1, false, 0, 0, 0);
            check_weighted(&er, DTS[d], nins[q], nins[q] < 4 ? nins[q] : 3, true, 3, 5, 0);
            if (!g_quick) check_weighted(&er, DTS[d], nins[q], 2, false, 140, 4000, 1);
        }
    }
    if (s) cudaStreamDestroy(s);
}

static void t_conversions_emulated(void) { check_convert_patterns(M_EMU); }

static void t_entries_emulated(void)
{
    check_exact_entries(M_EMU);
}

/* ---- Gram partials and dot products: references ------------------------------------------ */

/* Compensated (Neumaier) sum of x_a x_b in double, with each product's rounding error from an
 * fma: far closer to the exact value than the bound below. */
static double exact_dot(sumo_dtype dt, const void *a, const void *b, size_t n, double *abs_sum)
{
    double s = 0, c = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        double x = harness_get(dt, a, i), y = harness_get(dt, b, i);
        double p = x * y, e = fma(x, y, -p);
        double terms[2] = {p, e};
        for (int k = 0; k < 2; k++) {
            double t = s + terms[k];
            c += fabs(s) >= fabs(terms[k]) ? (s - t) + terms[k] : (terms[k] - t) + s;
            s = t;
        }
        m += fabs(p);
    }
    *abs_sum = m;
    return s + c;
}

/* A sum of n products in double, in any order, is within n u sum|x_a x_b| of the exact value
 * (u = 2^-53; a fused multiply-add rounds once per term). */
static bool within_gram_bound(double got, double exact, double abs_sum, size_t n)
{
    return fabs(got - exact) <= (double)(n + 2) * 0x1p-53 * abs_sum + 1e-300;
}

typedef struct gram_case {
    sumo_dtype dt;
    int nin;
    size_t lo, hi; /* of the layout */
    size_t off;    /* elements past alignment */
} gram_case;

/* The partials on `kind` memory (added into a zeroed host array, as sumo calls it). */
static void gram_on(const entry_run *er, const gram_case *g, void *const *hin, double *out)
{
    size_t offs[NLAYOUT + 1];
    layout_offsets(offs);
    size_t n = g->hi - g->lo, L = sumo_cuda__gram_len(g->nin);
    tbuf din[16];
    const void *ki[16];
    /* Every input at the same distance from alignment: 0 lets the device load whole 16-byte
     * vectors where a piece starts aligned, anything else makes it load element by element. */
    for (int j = 0; j < g->nin; j++) {
        din[j] = t_upload(er->kind, g->dt, hin[j], n, g->off);
        ki[j] = din[j].p;
    }
    memset(out, 0, NLAYOUT * L * sizeof *out);
    sumo_result r = er->k->gram_partials(er->k->ctx, er->stream, g->dt, ki, g->nin, offs, NLAYOUT,
                                         g->lo, g->hi, out);
    if (r != SUMO_SUCCESS) out[0] = NAN;
    for (int j = 0; j < g->nin; j++) m_free(er->kind, din[j].base);
}

static void check_gram(const entry_run *er, const gram_case *g)
{
    size_t offs[NLAYOUT + 1];
    layout_offsets(offs);
    size_t n = g->hi - g->lo, L = sumo_cuda__gram_len(g->nin);
    void *hin[16];
    for (int j = 0; j < g->nin; j++) {
        hin[j] = malloc(n * esz(g->dt) + 1);
        gen(g->dt, hin[j], n, 500 + (uint64_t)j, false);
    }
    double *got = calloc(NLAYOUT * L, sizeof *got), *again = calloc(NLAYOUT * L, sizeof *again);
    double *host = calloc(NLAYOUT * L, sizeof *host);
    gram_on(er, g, hin, got);
    /* Another address (the other load path) and another run: the same bits. */
    gram_case g2 = *g;
    g2.off = g->off ? 0 : 3;
    gram_on(er, &g2, hin, again);
    bool same = memcmp(got, again, NLAYOUT * L * sizeof *got) == 0;
    CHECK_OK(g_host->gram_partials(g_host->ctx, NULL, g->dt, (const void *const *)hin, g->nin, offs,
                                   NLAYOUT, g->lo, g->hi, host));
    for (size_t t = 0; t < NLAYOUT; t++) {
        size_t s = offs[t] > g->lo ? offs[t] : g->lo, e = offs[t + 1] < g->hi ? offs[t + 1] : g->hi;
        size_t len = e > s ? e - s : 0;
        int q = 0;
        for (int a = 0; a < g->nin; a++)
            for (int b = a; b < g->nin; b++, q++) {
                double abs_sum = 0, exact = 0;
                if (len)
                    exact = exact_dot(g->dt, (unsigned char *)hin[a] + (s - g->lo) * esz(g->dt),
                                      (unsigned char *)hin[b] + (s - g->lo) * esz(g->dt), len, &abs_sum);
                double v = got[t * L + (size_t)q];
                CHECK(within_gram_bound(v, exact, abs_sum, len),
                      "gram %s nin %d tensor %zu (%d,%d): %.17g, exact %.17g (bound %.3g)",
                      DT_NAME[g->dt], g->nin, t, a, b, v, exact, (double)(len + 2) * 0x1p-53 * abs_sum);
                CHECK(within_gram_bound(host[t * L + (size_t)q], exact, abs_sum, len), "host gram");
            }
    }
    CHECK(same, "gram %s nin %d: other addresses gave other bits", DT_NAME[g->dt], g->nin);
    /* dot_norms: the two-input case over one piece, (a.b, |a|^2, |b|^2) */
    if (g->nin >= 2) {
        tbuf a = t_upload(er->kind, g->dt, hin[0], n, g->off), b = t_upload(er->kind, g->dt, hin[1], n, 0);
        double d[3], w[3], abs_sum;
        CHECK_OK(er->k->dot_norms(er->k->ctx, er->stream, g->dt, a.p, b.p, n, d));
        const void *pair[2] = {a.p, b.p};
        const size_t one[2] = {0, n};
        double g3[3] = {0, 0, 0};
        CHECK_OK(er->k->gram_partials(er->k->ctx, er->stream, g->dt, pair, 2, one, 1, 0, n, g3));
        CHECK(d[0] == g3[1] && d[1] == g3[0] && d[2] == g3[2], "dot_norms is the two-input Gram");
        w[0] = exact_dot(g->dt, hin[0], hin[1], n, &abs_sum);
        CHECK(within_gram_bound(d[0], w[0], abs_sum, n), "dot %.17g vs %.17g", d[0], w[0]);
        w[1] = exact_dot(g->dt, hin[0], hin[0], n, &abs_sum);
        CHECK(within_gram_bound(d[1], w[1], abs_sum, n), "|a|^2");
        m_free(er->kind, a.base);
        m_free(er->kind, b.base);
    }
    for (int j = 0; j < g->nin; j++) free(hin[j]);
    free(got);
    free(again);
    free(host);
}

static void check_gram_all(int kind)
{
    entry_run er = {.kind = kind, .k = table_of(kind)};
    size_t offs[NLAYOUT + 1], total = layout_offsets(offs);
    const int nins[] = {2, 3, 4, 5, 8, 9, 16};
    for (size_t d = 0; d < 4; d++)
        for (size_t q = 0; q < sizeof nins / sizeof nins[0]; q++) {
            if (g_quick && nins[q] > 4 && nins[q] != 16) continue;
            gram_case g = {.dt = DTS[d], .nin = nins[q], .lo = 0, .hi = total, .off = 0};
            check_gram(&er, &g);
            gram_case h = {.dt = DTS[d], .nin = nins[q], .lo = 135, .hi = total - 2000, .off = 1};
            check_gram(&er, &h);
        }
}

static void t_gram_emulated(void)
{
    check_gram_all(M_EMU);
}

/* ---- collectives on the threads transport, buffers in `kind` memory ----------------------- */

enum { OPK_SUM, OPK_AVG, OPK_ADASUM, OPK_ADASUM_LAYOUT };
static const char *OPK_NAME[] = {"sum", "average", "Adasum", "Adasum per tensor"};

typedef struct cjob {
    int kind;
    int P;
    sumo_dtype dt;
    int opk;
    bool in_place;
    size_t n;
    unsigned char *out[MAXP], *again[MAXP];
    sumo_result res[MAXP];
    char msg[MAXP][256];
} cjob;

static double input_value(const cjob *j, int rank, size_t i)
{
    return j->opk >= OPK_ADASUM ? harness_uniform_at(17, (uint64_t)rank, i)
                                : harness_collective_value(rank, i, false);
}

static sumo_result one_allreduce(const cjob *j, sumo_comm *comm, const void *send, void *recv,
                                 sumo_op op, void *stream)
{
    if (j->kind == M_DEV) return sumo_cuda_allreduce(send, recv, j->n, j->dt, op, comm, stream);
    sumo_collective c = {.struct_size = sizeof c, .kind = SUMO_COLLECTIVE_ALLREDUCE, .sendbuf = send,
                         .recvbuf = recv, .count = j->n, .dtype = j->dt, .op = op, .stream = stream};
    return sumo_collective_run(comm, &c);
}

static void cjob_rank(sumo_comm *comm, int rank, int size, void *arg)
{
    (void)size;
    cjob *j = arg;
    size_t bytes = j->n * esz(j->dt);
    sumo_result r = SUMO_SUCCESS;
    cudaStream_t stream = NULL;
    if (j->kind != M_HOST) r = sumo_comm_add_kernels(comm, table_of(j->kind));
    if (j->kind == M_DEV && cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess)
        r = SUMO_ERR_SYSTEM;
    unsigned char *h = malloc(bytes + 1);
    for (size_t i = 0; i < j->n; i++) harness_set(j->dt, h, i, input_value(j, rank, i));
    unsigned char *send = m_alloc(j->kind, bytes), *recv = m_alloc(j->kind, bytes);
    sumo_op op = j->opk == OPK_SUM ? SUMO_OP_SUM : j->opk == OPK_AVG ? SUMO_OP_AVERAGE : SUMO_OP_ADASUM;
    if (r == SUMO_SUCCESS && j->opk == OPK_ADASUM_LAYOUT) {
        sumo_adasum_options o = {.struct_size = sizeof o, .tensor_counts = LAYOUT, .ntensors = NLAYOUT};
        r = sumo_op_create_adasum(comm, &o, &op);
    }
    j->out[rank] = malloc(bytes + 1);
    j->again[rank] = malloc(bytes + 1);
    for (int rep = 0; rep < 2 && r == SUMO_SUCCESS; rep++) {
        /* The input goes in on this rank's stream: the call must wait for it. */
        if (j->kind == M_DEV) cudaMemcpyAsync(send, h, bytes, cudaMemcpyHostToDevice, stream);
        else m_put(j->kind, send, h, bytes);
        void *dst = j->in_place ? send : recv;
        r = one_allreduce(j, comm, send, dst, op, stream);
        m_get(j->kind, rep ? j->again[rank] : j->out[rank], dst, bytes);
    }
    j->res[rank] = r;
    const char *m = "";
    sumo_comm_error_message(comm, &m);
    snprintf(j->msg[rank], sizeof j->msg[rank], "%s", m);
    m_free(j->kind, send);
    m_free(j->kind, recv);
    if (stream) cudaStreamDestroy(stream);
    free(h);
}

static void cjob_free(cjob *j)
{
    for (int r = 0; r < j->P; r++) {
        free(j->out[r]);
        free(j->again[r]);
    }
}

/* Adasum's float64 reference: every rank's input, rounded to the dtype, through the tree. */
static double adasum_error(const cjob *j, const unsigned char *got)
{
    size_t offs[NLAYOUT + 1];
    size_t T = j->opk == OPK_ADASUM_LAYOUT ? NLAYOUT : 1;
    if (T == NLAYOUT) layout_offsets(offs);
    else offs[0] = 0, offs[1] = j->n;
    double *u[MAXP];
    for (int r = 0; r < j->P; r++) {
        u[r] = malloc(j->n * sizeof(double) + 8);
        for (size_t i = 0; i < j->n; i++) u[r][i] = ref_round_to(j->dt, input_value(j, r, i));
    }
    double *in_norm = calloc(T, sizeof(double));
    for (size_t t = 0; t < T; t++)
        for (int r = 0; r < j->P; r++)
            for (size_t i = offs[t]; i < offs[t + 1]; i++) in_norm[t] += u[r][i] * u[r][i];
    ref_adasum_tree(u, j->P, offs, T);
    double worst = 0;
    for (size_t t = 0; t < T; t++) {
        double dd = 0;
        for (size_t i = offs[t]; i < offs[t + 1]; i++) {
            double diff = harness_get(j->dt, got, i) - u[0][i];
            dd += diff * diff;
        }
        if (in_norm[t] > 0) worst = fmax(worst, sqrt(dd / in_norm[t]));
    }
    for (int r = 0; r < j->P; r++) free(u[r]);
    free(in_norm);
    return worst;
}

/* Runs the job on `kind` memory; compares with the host path (sum, average: bit for bit) and,
 * with `emu` given (the same job on emulated memory), with it bit for bit. */
static void check_collective(int kind, int P, sumo_dtype dt, int opk, bool in_place, size_t n,
                             bool compare_emulated)
{
    cjob got = {.kind = kind, .P = P, .dt = dt, .opk = opk, .in_place = in_place, .n = n};
    cjob host = got, emu = got;
    host.kind = M_HOST;
    emu.kind = M_EMU;
    CHECK(harness_run_threads(P, cjob_rank, &got) == 0, "threads");
    CHECK(harness_run_threads(P, cjob_rank, &host) == 0, "threads");
    if (compare_emulated) CHECK(harness_run_threads(P, cjob_rank, &emu) == 0, "threads");
    size_t bytes = n * esz(dt);
    const char *what = OPK_NAME[opk];
    for (int r = 0; r < P; r++) {
        CHECK(got.res[r] == SUMO_SUCCESS && host.res[r] == SUMO_SUCCESS,
              "%s %s P %d rank %d: %s (%s) / host %s", what, DT_NAME[dt], P, r,
              sumo_result_name(got.res[r]), got.msg[r], sumo_result_name(host.res[r]));
        CHECK(memcmp(got.out[r], got.out[0], bytes) == 0, "%s %s P %d: rank %d differs from rank 0",
              what, DT_NAME[dt], P, r);
        CHECK(memcmp(got.again[r], got.out[r], bytes) == 0, "%s %s P %d rank %d: a second run differs",
              what, DT_NAME[dt], P, r);
        if (opk <= OPK_AVG) {
            size_t at = first_diff(dt, got.out[r], host.out[r], n);
            CHECK(at == SIZE_MAX, "%s %s P %d in place %d rank %d differs from the host path at %zu",
                  what, DT_NAME[dt], P, in_place, r, at);
        }
        if (compare_emulated) {
            CHECK(emu.res[r] == SUMO_SUCCESS, "emulated run");
            size_t at = first_diff(dt, got.out[r], emu.out[r], n);
            CHECK(at == SIZE_MAX, "%s %s P %d in place %d rank %d: device and emulator differ at %zu",
                  what, DT_NAME[dt], P, in_place, r, at);
        }
    }
    if (opk >= OPK_ADASUM) {
        int levels = 0;
        while ((1 << levels) < P) levels++;
        double tol = 8.0 * (levels + 1) * harness_eps(dt);
        double e_got = adasum_error(&got, got.out[0]), e_host = adasum_error(&host, host.out[0]);
        CHECK(e_got <= tol, "%s %s P %d: error %.3g over %.3g (host path %.3g)", what, DT_NAME[dt], P,
              e_got, tol, e_host);
    }
    cjob_free(&got);
    cjob_free(&host);
    if (compare_emulated) cjob_free(&emu);
}

static void check_collectives(int kind)
{
    size_t offs[NLAYOUT + 1], total = layout_offsets(offs);
    for (int P = 2; P <= 4; P++)
        for (size_t d = 0; d < 4; d++)
            for (int opk = 0; opk < 4; opk++)
                for (int ip = 0; ip <= 1; ip++) {
                    if (g_quick && (ip || d == 1)) continue;
                    size_t n = opk == OPK_ADASUM_LAYOUT ? total : opk == OPK_ADASUM ? 20011 : 30001;
                    int before = g_failed_checks;
                    check_collective(kind, P, DTS[d], opk, ip, n, kind == M_DEV);
                    if (g_failed_checks != before) return;
                }
}

static void t_collectives_emulated(void) { check_collectives(M_EMU); }

/* =============================== the NCCL transport over a fake NCCL ======================== */

/* The fake: each rank's "stream" is a queue of operations run in order whenever it is queried
 * (copies, sends into mailboxes, receives from them, allgathers and one-byte allreduces that
 * complete once every rank has contributed). "Device" memory is the emulated arena. */
enum { FK_COPY, FK_SEND, FK_RECV, FK_GATHER, FK_REDUCE1 };

typedef struct fk_op {
    struct fk_op *next;
    int kind, peer;
    void *dst;
    const void *src;
    size_t bytes;
    bool contributed;
    long gen;
} fk_op;

typedef struct fk_msg {
    struct fk_msg *next;
    size_t bytes;
    unsigned char data[];
} fk_msg;

typedef struct fk_net fk_net;
typedef struct fk_rank {
    fk_net *net;
    int rank;
    fk_op *head, *tail;
    long collectives;
} fk_rank;

struct fk_net {
    int P;
    pthread_mutex_t lock;
    fk_msg *mhead[MAXP][MAXP], *mtail[MAXP][MAXP];
    unsigned char slots[2][MAXP][256];
    int arrived[2], consumed[2];
    fk_rank ranks[MAXP];
    int hang_rank, error_rank;
    bool bad_count;
    atomic_int aborts[MAXP], destroys[MAXP], staged_copies;
};

/* The group being built by this thread (NCCL's group state is per thread as well). */
static _Thread_local struct {
    int depth, nops;
    fk_op *ops[8];
    fk_rank *owner[8];
} fk_group;

static void fk_enqueue(fk_rank *r, fk_op *op)
{
    pthread_mutex_lock(&r->net->lock);
    op->next = NULL;
    if (r->tail) r->tail->next = op;
    else r->head = op;
    r->tail = op;
    pthread_mutex_unlock(&r->net->lock);
}

static fk_op *fk_new(int kind, void *dst, const void *src, size_t bytes, int peer)
{
    fk_op *op = calloc(1, sizeof *op);
    op->kind = kind, op->dst = dst, op->src = src, op->bytes = bytes, op->peer = peer;
    return op;
}

/* Runs the head of r's queue while it can; true when the queue is empty. Under net->lock. */
static bool fk_progress(fk_rank *r)
{
    fk_net *n = r->net;
    while (r->head) {
        fk_op *op = r->head;
        if (op->kind == FK_COPY) {
            memcpy(op->dst, op->src, op->bytes);
        } else if (op->kind == FK_SEND) {
            fk_msg *m = malloc(sizeof *m + op->bytes);
            m->next = NULL;
            m->bytes = op->bytes;
            memcpy(m->data, op->src, op->bytes);
            if (n->mtail[r->rank][op->peer]) n->mtail[r->rank][op->peer]->next = m;
            else n->mhead[r->rank][op->peer] = m;
            n->mtail[r->rank][op->peer] = m;
        } else if (op->kind == FK_RECV) {
            fk_msg *m = n->mhead[op->peer][r->rank];
            if (m == NULL) return false;
            n->mhead[op->peer][r->rank] = m->next;
            if (m->next == NULL) n->mtail[op->peer][r->rank] = NULL;
            memcpy(op->dst, m->data, m->bytes < op->bytes ? m->bytes : op->bytes);
            free(m);
        } else { /* a collective: contribute, wait for all, read, and let the slot go */
            int slot = (int)(op->gen & 1);
            if (!op->contributed) {
                if (op->kind == FK_GATHER) memcpy(n->slots[slot][r->rank], op->src, op->bytes);
                n->arrived[slot]++;
                op->contributed = true;
            }
            if (n->arrived[slot] < n->P) return false;
            if (op->kind == FK_GATHER)
                for (int k = 0; k < n->P; k++)
                    memcpy((unsigned char *)op->dst + (size_t)k * op->bytes, n->slots[slot][k], op->bytes);
            if (++n->consumed[slot] == n->P) n->arrived[slot] = n->consumed[slot] = 0;
        }
        r->head = op->next;
        if (r->head == NULL) r->tail = NULL;
        free(op);
    }
    return true;
}

static int fk_stream_query(void *s)
{
    fk_rank *r = s;
    if (r->rank == r->net->hang_rank) return SUMO_CUDA_NOT_READY;
    pthread_mutex_lock(&r->net->lock);
    bool done = fk_progress(r);
    pthread_mutex_unlock(&r->net->lock);
    return done ? SUMO_CUDA_SUCCESS : SUMO_CUDA_NOT_READY;
}

static int fk_group_start(void)
{
    fk_group.depth++;
    return SUMO_NCCL_SUCCESS;
}

static int fk_p2p(int kind, void *dst, const void *src, size_t bytes, int peer, void *comm)
{
    fk_rank *r = comm;
    fk_op *op = fk_new(kind, dst, src, bytes, peer);
    if (fk_group.depth == 0) {
        fk_enqueue(r, op);
        return SUMO_NCCL_SUCCESS;
    }
    if (fk_group.nops == 8) return SUMO_NCCL_INTERNAL_ERROR;
    fk_group.ops[fk_group.nops] = op;
    fk_group.owner[fk_group.nops++] = r;
    return SUMO_NCCL_SUCCESS;
}

static int fk_group_end(void)
{
    if (--fk_group.depth > 0) return SUMO_NCCL_SUCCESS;
    /* Sends first: NCCL runs a group's operations together, so neither side waits for its own
     * receive before sending. */
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < fk_group.nops; i++)
            if ((fk_group.ops[i]->kind == FK_SEND) == (pass == 0)) fk_enqueue(fk_group.owner[i], fk_group.ops[i]);
    fk_group.nops = 0;
    return SUMO_NCCL_SUCCESS;
}

static int fk_send(const void *buf, size_t count, int dt, int peer, void *comm, void *stream)
{
    (void)dt;
    (void)stream;
    return fk_p2p(FK_SEND, NULL, buf, count, peer, comm);
}

static int fk_recv(void *buf, size_t count, int dt, int peer, void *comm, void *stream)
{
    (void)dt;
    (void)stream;
    return fk_p2p(FK_RECV, buf, NULL, count, peer, comm);
}

static int fk_all_gather(const void *s, void *d, size_t count, int dt, void *comm, void *stream)
{
    (void)dt;
    (void)stream;
    fk_rank *r = comm;
    fk_op *op = fk_new(FK_GATHER, d, s, count, -1);
    op->gen = r->collectives++;
    fk_enqueue(r, op);
    return SUMO_NCCL_SUCCESS;
}

static int fk_all_reduce(const void *s, void *d, size_t count, int dt, int rop, void *comm, void *stream)
{
    (void)s;
    (void)d;
    (void)count;
    (void)dt;
    (void)rop;
    (void)stream;
    fk_rank *r = comm;
    fk_op *op = fk_new(FK_REDUCE1, NULL, NULL, 0, -1);
    op->gen = r->collectives++;
    fk_enqueue(r, op);
    return SUMO_NCCL_SUCCESS;
}

static int fk_copy_async(void *dst, const void *src, size_t bytes, void *stream)
{
    fk_rank *r = stream;
    atomic_fetch_add(&r->net->staged_copies, 1);
    fk_enqueue(r, fk_new(FK_COPY, dst, src, bytes, -1));
    return SUMO_CUDA_SUCCESS;
}

static int fk_count(void *comm, int *n)
{
    fk_rank *r = comm;
    *n = r->net->P;
    return r->net->bad_count ? SUMO_NCCL_INTERNAL_ERROR : SUMO_NCCL_SUCCESS;
}
static int fk_user_rank(void *comm, int *rank)
{
    *rank = ((fk_rank *)comm)->rank;
    return SUMO_NCCL_SUCCESS;
}
static int fk_cu_device(void *comm, int *d)
{
    (void)comm;
    *d = 0;
    return SUMO_NCCL_SUCCESS;
}
static int fk_async_error(void *comm, int *e)
{
    fk_rank *r = comm;
    *e = r->rank == r->net->error_rank ? SUMO_NCCL_REMOTE_ERROR : SUMO_NCCL_SUCCESS;
    return SUMO_NCCL_SUCCESS;
}
static int fk_abort(void *comm)
{
    fk_rank *r = comm;
    atomic_fetch_add(&r->net->aborts[r->rank], 1);
    return SUMO_NCCL_SUCCESS;
}
static int fk_destroy(void *comm)
{
    fk_rank *r = comm;
    atomic_fetch_add(&r->net->destroys[r->rank], 1);
    return SUMO_NCCL_SUCCESS;
}
static const char *fk_error_string(int r)
{
    (void)r;
    return "fake NCCL error";
}
static const char *fk_last_error(void *comm)
{
    (void)comm;
    return "fake: the remote peer went away";
}
static int fk_version(int *v)
{
    *v = 22800;
    return SUMO_NCCL_SUCCESS;
}
static int fk_alloc(void **p, size_t bytes)
{
    *p = malloc(bytes);
    return *p ? SUMO_CUDA_SUCCESS : 2;
}
static int fk_free(void *p)
{
    free(p);
    return SUMO_CUDA_SUCCESS;
}
static int fk_stream_create(void **s)
{
    (void)s;
    return 1;
}
static int fk_stream_destroy(void *s)
{
    (void)s;
    return SUMO_CUDA_SUCCESS;
}
static bool fk_is_device(const void *p) { return emu_claims(&g_emu, p, 1); }
static int fk_get_device(int *d)
{
    *d = 0;
    return SUMO_CUDA_SUCCESS;
}
static int fk_set_device(int d)
{
    (void)d;
    return SUMO_CUDA_SUCCESS;
}
static const char *fk_cuda_error(int e)
{
    (void)e;
    return "fake CUDA error";
}

static const sumo_cuda__nccl_api FAKE = {
    .get_version = fk_version, .get_error_string = fk_error_string, .get_last_error = fk_last_error,
    .comm_count = fk_count, .comm_user_rank = fk_user_rank, .comm_cu_device = fk_cu_device,
    .comm_get_async_error = fk_async_error, .comm_abort = fk_abort, .comm_destroy = fk_destroy,
    .group_start = fk_group_start, .group_end = fk_group_end, .send = fk_send, .recv = fk_recv,
    .all_gather = fk_all_gather, .all_reduce = fk_all_reduce, .stream_query = fk_stream_query,
    .stream_create = fk_stream_create, .stream_destroy = fk_stream_destroy,
    .device_alloc = fk_alloc, .device_free = fk_free, .host_alloc = fk_alloc, .host_free = fk_free,
    .copy_async = fk_copy_async, .is_device = fk_is_device, .get_device = fk_get_device,
    .set_device = fk_set_device, .cuda_error_string = fk_cuda_error};

static void fk_net_init(fk_net *n, int P)
{
    memset(n, 0, sizeof *n);
    n->P = P;
    n->hang_rank = n->error_rank = -1;
    pthread_mutex_init(&n->lock, NULL);
    for (int r = 0; r < P; r++) n->ranks[r] = (fk_rank){.net = n, .rank = r};
}

static void fk_net_free(fk_net *n)
{
    for (int s = 0; s < MAXP; s++)
        for (int d = 0; d < MAXP; d++)
            while (n->mhead[s][d]) {
                fk_msg *m = n->mhead[s][d];
                n->mhead[s][d] = m->next;
                free(m);
            }
    for (int r = 0; r < n->P; r++)
        while (n->ranks[r].head) {
            fk_op *op = n->ranks[r].head;
            n->ranks[r].head = op->next;
            free(op);
        }
    pthread_mutex_destroy(&n->lock);
}

/* The same operations on any communicator: Adasum per tensor, average, broadcast, allgather,
 * reduce-scatter, on host or emulated-device buffers; results to host memory. */
#define XN 1200
static const size_t XCOUNTS[] = {300, 1, 599, 0, 300};

typedef struct xjob {
    int P, kind;
    bool ring; /* force the point-to-point algorithms (threads transport) */
    float out[MAXP][3][XN];
    sumo_result res[MAXP];
    char msg[MAXP][256];
    fk_net net;
    double timeout; /* > 0: set on the handle */
    int abort_rank; /* a thread calls sumo_comm_abort on this rank's handle, -1 none */
} xjob;

typedef struct abort_arg {
    sumo_comm *comm;
} abort_arg;

static void *abort_later(void *p)
{
    abort_arg *a = p;
    struct timespec ts = {0, 100 * 1000 * 1000};
    nanosleep(&ts, NULL);
    sumo_comm_abort(a->comm, "the test gives up");
    return NULL;
}

static void x_ops(sumo_comm *comm, int rank, int size, xjob *x)
{
    sumo_result r = SUMO_SUCCESS;
    if (x->ring) r = sumo_comm_set_param(comm, SUMO_PARAM_ALGORITHM, SUMO_ALGORITHM_RING);
    if (r == SUMO_SUCCESS && x->kind == M_EMU) r = sumo_comm_add_kernels(comm, g_emu_table);
    if (r == SUMO_SUCCESS && x->timeout > 0) r = sumo_comm_set_timeout(comm, x->timeout);
    pthread_t aborter;
    abort_arg aa = {.comm = comm};
    bool aborting = x->abort_rank == rank;
    if (aborting) pthread_create(&aborter, NULL, abort_later, &aa);
    size_t bytes = XN * sizeof(float);
    float *h = malloc(bytes), *g = malloc(16 * MAXP * sizeof(float));
    float *buf = m_alloc(x->kind, bytes), *gath = m_alloc(x->kind, 16 * MAXP * sizeof(float));
    float *mine = m_alloc(x->kind, 16 * sizeof(float));
    sumo_op op = SUMO_OP_SUM;
    sumo_adasum_options o = {.struct_size = sizeof o, .tensor_counts = XCOUNTS, .ntensors = 5};
    if (r == SUMO_SUCCESS) r = sumo_op_create_adasum(comm, &o, &op);
    for (int i = 0; i < XN; i++) h[i] = (float)harness_uniform_at(3, (uint64_t)rank, (size_t)i);
    m_put(x->kind, buf, h, bytes);
    if (r == SUMO_SUCCESS) r = sumo_allreduce(buf, buf, XN, SUMO_FLOAT32, op, comm);
    m_get(x->kind, x->out[rank][0], buf, bytes);
    for (int i = 0; i < XN; i++) h[i] = (float)harness_collective_value(rank, (size_t)i, false);
    m_put(x->kind, buf, h, bytes);
    if (r == SUMO_SUCCESS) r = sumo_allreduce(buf, buf, XN, SUMO_FLOAT32, SUMO_OP_AVERAGE, comm);
    if (r == SUMO_SUCCESS) r = sumo_broadcast(buf, buf, XN, SUMO_FLOAT32, size - 1, comm);
    for (int i = 0; i < 16; i++) g[i] = (float)(rank * 100 + i);
    m_put(x->kind, mine, g, 16 * sizeof(float));
    if (r == SUMO_SUCCESS) r = sumo_allgather(mine, gath, 16, SUMO_FLOAT32, comm);
    if (r == SUMO_SUCCESS)
        r = sumo_reduce_scatter(buf, buf + (size_t)rank * (XN / size), XN / size, SUMO_FLOAT32,
                                SUMO_OP_SUM, comm);
    m_get(x->kind, x->out[rank][1], buf, bytes);
    m_get(x->kind, x->out[rank][2], gath, 16 * (size_t)size * sizeof(float));
    x->res[rank] = r;
    const char *m = "";
    sumo_comm_error_message(comm, &m);
    snprintf(x->msg[rank], sizeof x->msg[rank], "%s", m);
    if (aborting) pthread_join(aborter, NULL);
    m_free(x->kind, buf);
    m_free(x->kind, gath);
    m_free(x->kind, mine);
    free(h);
    free(g);
}

static void x_on_threads(sumo_comm *comm, int rank, int size, void *arg) { x_ops(comm, rank, size, arg); }

typedef struct x_rank_arg {
    xjob *x;
    int rank;
} x_rank_arg;

static void *x_on_fake(void *p)
{
    x_rank_arg *a = p;
    xjob *x = a->x;
    sumo_comm *comm = NULL;
    fk_rank *me = &x->net.ranks[a->rank];
    sumo_result r = sumo_cuda__nccl_comm_create(&FAKE, me, me, &comm);
    if (r != SUMO_SUCCESS) {
        x->res[a->rank] = r;
        return NULL;
    }
    const char *name = "";
    sumo_comm_transport(comm, &name);
    if (strcmp(name, "nccl") != 0) x->res[a->rank] = SUMO_ERR_INTERNAL;
    else if (x->net.hang_rank == a->rank) x->res[a->rank] = SUMO_SUCCESS; /* stands aside */
    else x_ops(comm, a->rank, x->P, x);
    sumo_comm_destroy(comm);
    return NULL;
}

static void run_fake(xjob *x)
{
    pthread_t ids[MAXP];
    x_rank_arg args[MAXP];
    for (int r = 0; r < x->P; r++) {
        args[r] = (x_rank_arg){.x = x, .rank = r};
        pthread_create(&ids[r], NULL, x_on_fake, &args[r]);
    }
    for (int r = 0; r < x->P; r++) pthread_join(ids[r], NULL);
}

static xjob *xjob_new(int P, int kind)
{
    xjob *x = calloc(1, sizeof *x);
    x->P = P;
    x->kind = kind;
    x->abort_rank = -1;
    fk_net_init(&x->net, P);
    return x;
}

static void xjob_free(xjob *x)
{
    fk_net_free(&x->net);
    free(x);
}

/* Every collective over the fake NCCL equals the threads transport's point-to-point run bit
 * for bit (host buffers, staged), and on "device" buffers (no staging) sum, average,
 * broadcast, allgather and reduce-scatter again bit for bit, Adasum within rounding. */
static void t_nccl_fake_collectives(void)
{
    for (int P = 1; P <= 4; P++) {
        xjob *a = xjob_new(P, M_HOST), *b = xjob_new(P, M_HOST), *c = xjob_new(P, M_EMU);
        a->ring = b->ring = c->ring = true; /* the same algorithms, so the same bits */
        CHECK(harness_run_threads(P, x_on_threads, a) == 0, "threads");
        run_fake(b);
        run_fake(c);
        for (int r = 0; r < P; r++) {
            CHECK(a->res[r] == SUMO_SUCCESS && b->res[r] == SUMO_SUCCESS && c->res[r] == SUMO_SUCCESS,
                  "P %d rank %d: threads %s, nccl %s (%s), nccl on device memory %s (%s)", P, r,
                  sumo_result_name(a->res[r]), sumo_result_name(b->res[r]), b->msg[r],
                  sumo_result_name(c->res[r]), c->msg[r]);
            CHECK(memcmp(a->out[r], b->out[r], sizeof a->out[r]) == 0, "P %d rank %d: nccl differs from threads", P, r);
            CHECK(memcmp(a->out[r][1], c->out[r][1], sizeof a->out[r][1]) == 0 &&
                      memcmp(a->out[r][2], c->out[r][2], sizeof a->out[r][2]) == 0,
                  "P %d rank %d: device buffers differ", P, r);
            CHECK(memcmp(c->out[r][0], c->out[0][0], sizeof c->out[r][0]) == 0, "Adasum differs across ranks");
            for (int i = 0; i < XN; i++)
                CHECK(fabsf(c->out[r][0][i] - a->out[r][0][i]) <= 1e-5f * (1 + fabsf(a->out[r][0][i])),
                      "P %d rank %d Adasum element %d: %g vs %g", P, r, i, c->out[r][0][i], a->out[r][0][i]);
        }
        CHECK(atomic_load(&b->net.staged_copies) > 0, "host buffers went through the staging area");
        for (int r = 0; r < P; r++) {
            CHECK(atomic_load(&b->net.destroys[r]) == 1 && atomic_load(&b->net.aborts[r]) == 0,
                  "healthy: destroyed once, never aborted (rank %d: %d, %d)", r,
                  atomic_load(&b->net.destroys[r]), atomic_load(&b->net.aborts[r]));
        }
        xjob_free(a);
        xjob_free(b);
        xjob_free(c);
    }
}

/* A peer that never completes: the deadline holds, the communicator is aborted (not
 * destroyed, which would wait for the peer), and the message says what happened. */
static void t_nccl_fake_timeout(void)
{
    xjob *x = xjob_new(2, M_HOST);
    x->net.hang_rank = 1;
    x->timeout = 0.3;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    run_fake(x);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double s = (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec);
    CHECK(x->res[0] == SUMO_ERR_TIMEOUT, "rank 0: %s (%s)", sumo_result_name(x->res[0]), x->msg[0]);
    CHECK(strstr(x->msg[0], "nccl") && strstr(x->msg[0], "deadline"), "message: %s", x->msg[0]);
    CHECK(s < 5.0, "took %.2f s", s);
    CHECK(atomic_load(&x->net.aborts[0]) == 1 && atomic_load(&x->net.destroys[0]) == 0,
          "aborted once, not destroyed: %d, %d", atomic_load(&x->net.aborts[0]),
          atomic_load(&x->net.destroys[0]));
    xjob_free(x);
}

/* An NCCL error surfaces with NCCL's own text, as a peer failure. */
static void t_nccl_fake_error(void)
{
    xjob *x = xjob_new(2, M_HOST);
    x->net.error_rank = 0;
    x->timeout = 2;
    run_fake(x);
    CHECK(x->res[0] == SUMO_ERR_PEER_FAILURE, "rank 0: %s (%s)", sumo_result_name(x->res[0]), x->msg[0]);
    CHECK(strstr(x->msg[0], "the remote peer went away") != NULL, "message: %s", x->msg[0]);
    CHECK(x->res[1] == SUMO_ERR_TIMEOUT || x->res[1] == SUMO_ERR_PEER_FAILURE, "rank 1: %s",
          sumo_result_name(x->res[1]));
    CHECK(atomic_load(&x->net.aborts[0]) == 1, "aborted");
    xjob_free(x);
}

/* sumo_comm_abort from another thread while an operation waits: it ends now, not at the
 * deadline. */
static void t_nccl_fake_abort(void)
{
    xjob *x = xjob_new(2, M_HOST);
    x->net.hang_rank = 1;
    x->timeout = 30;
    x->abort_rank = 0;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    run_fake(x);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double s = (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec);
    CHECK(x->res[0] != SUMO_SUCCESS && s < 10.0, "rank 0: %s after %.2f s", sumo_result_name(x->res[0]), s);
    CHECK(atomic_load(&x->net.aborts[0]) == 1 && atomic_load(&x->net.destroys[0]) == 0, "aborted once");
    xjob_free(x);
}

/* A communicator that does not answer is refused, and stays the caller's. */
static void t_nccl_fake_create(void)
{
    fk_net n;
    fk_net_init(&n, 1);
    n.bad_count = true;
    sumo_comm *c = (sumo_comm *)1;
    sumo_result r = sumo_cuda__nccl_comm_create(&FAKE, &n.ranks[0], &n.ranks[0], &c);
    CHECK(r == SUMO_ERR_INVALID_ARGUMENT && c == NULL, "%s", sumo_result_name(r));
    CHECK(atomic_load(&n.aborts[0]) == 0 && atomic_load(&n.destroys[0]) == 0, "left alone");
    CHECK(sumo_cuda__nccl_comm_create(&FAKE, NULL, NULL, &c) == SUMO_ERR_INVALID_ARGUMENT, "NULL comm");
    /* The operations directly: zero-byte sides skip, a send to itself arrives. */
    n.bad_count = false;
    void *ctx;
    int rank = -1, size = -1;
    CHECK_OK(sumo_cuda__nccl_open(&FAKE, &n.ranks[0], &n.ranks[0], &ctx, &rank, &size));
    CHECK(rank == 0 && size == 1, "rank %d size %d", rank, size);
    const sumo_transport_ops *ops = sumo_cuda__nccl_ops();
    CHECK(ops->carries(ctx, "cuda") && !ops->carries(ctx, "host"), "carries cuda memory");
    int64_t later = (int64_t)1e18;
    char sbuf[100] = "a message to itself", rbuf[100] = "";
    CHECK_OK(ops->sendrecv(ctx, sbuf, sizeof sbuf, 0, rbuf, sizeof rbuf, 0, later));
    CHECK(strcmp(rbuf, sbuf) == 0, "received %s", rbuf);
    CHECK_OK(ops->sendrecv(ctx, sbuf, 0, 0, rbuf, 0, 0, later));
    CHECK_OK(ops->sendrecv(ctx, NULL, 0, -1, NULL, 0, -1, later));
    uint64_t rec = 42, all = 0;
    CHECK_OK(ops->allgather(ctx, &rec, &all, sizeof rec, later));
    CHECK(all == 42, "allgather");
    CHECK_OK(ops->barrier(ctx, later));
    sumo_cuda__nccl_close_unowned(ctx);
    CHECK(atomic_load(&n.destroys[0]) == 0, "an unowned context leaves the communicator alone");
    fk_net_free(&n);
}

/* =============================== device tests ============================================= */

static void d_claims(void)
{
    float h[8];
    void *d = NULL;
    CHECK(cudaMalloc(&d, 4096) == cudaSuccess, "cudaMalloc");
    const sumo_kernel_table *t = g_dev_table;
    CHECK(!t->claims(t->ctx, h, sizeof h), "host memory is the host's");
    CHECK(t->claims(t->ctx, d, 4096), "device memory is claimed");
    void *pinned = NULL;
    CHECK(cudaMallocHost(&pinned, 4096) == cudaSuccess, "cudaMallocHost");
    CHECK(!t->claims(t->ctx, pinned, 4096), "pinned host memory stays the host's");
    cudaFreeHost(pinned);
    cudaFree(d);
}

static void d_conversions(void) { check_convert_patterns(M_DEV); }
static void d_entries(void) { check_exact_entries(M_DEV); }

/* Device Gram partials: the bound, address independence (check_gram), and the emulator's
 * bits exactly: the device sums in the order the emulator writes out. */
static void d_gram(void)
{
    check_gram_all(M_DEV);
    size_t offs[NLAYOUT + 1], total = layout_offsets(offs);
    entry_run dev = {.kind = M_DEV, .k = g_dev_table}, emu = {.kind = M_EMU, .k = g_emu_table};
    const int nins[] = {2, 3, 8, 16};
    for (size_t d = 0; d < 4; d++)
        for (size_t q = 0; q < 4; q++) {
            gram_case g = {.dt = DTS[d], .nin = nins[q], .lo = 11, .hi = total, .off = 0};
            size_t n = g.hi - g.lo, L = sumo_cuda__gram_len(g.nin);
            void *hin[16];
            for (int j = 0; j < g.nin; j++) {
                hin[j] = malloc(n * esz(g.dt) + 1);
                gen(g.dt, hin[j], n, 900 + (uint64_t)j, false);
            }
            double *a = calloc(NLAYOUT * L, 8), *b = calloc(NLAYOUT * L, 8);
            gram_on(&dev, &g, hin, a);
            gram_on(&emu, &g, hin, b);
            bool same = memcmp(a, b, NLAYOUT * L * 8) == 0;
            for (int j = 0; j < g.nin; j++) free(hin[j]);
            free(a);
            free(b);
            CHECK(same, "gram %s nin %d: device and emulator differ", DT_NAME[g.dt], g.nin);
        }
    /* One tensor starting aligned (the vector loads) and one element off (element loads):
     * device, device and emulator give the same bits. */
    for (size_t q = 0; q < 4; q++) {
        size_t n1 = g_quick ? 20000 : 300001, one[2] = {0, n1};
        int nin = nins[q];
        void *hin[16];
        const void *ka[16], *kb[16], *ke[16];
        tbuf da[16], db[16], de[16];
        for (int j = 0; j < nin; j++) {
            hin[j] = malloc(n1 * 4);
            gen(SUMO_FLOAT32, hin[j], n1, 40 + (uint64_t)j, false);
            da[j] = t_upload(M_DEV, SUMO_FLOAT32, hin[j], n1, 0);
            db[j] = t_upload(M_DEV, SUMO_FLOAT32, hin[j], n1, 1);
            de[j] = t_upload(M_EMU, SUMO_FLOAT32, hin[j], n1, 0);
            ka[j] = da[j].p, kb[j] = db[j].p, ke[j] = de[j].p;
        }
        double ga[136] = {0}, gb[136] = {0}, ge[136] = {0};
        CHECK_OK(g_dev_table->gram_partials(g_dev_table->ctx, NULL, SUMO_FLOAT32, ka, nin, one, 1, 0, n1, ga));
        CHECK_OK(g_dev_table->gram_partials(g_dev_table->ctx, NULL, SUMO_FLOAT32, kb, nin, one, 1, 0, n1, gb));
        CHECK_OK(g_emu_table->gram_partials(g_emu_table->ctx, NULL, SUMO_FLOAT32, ke, nin, one, 1, 0, n1, ge));
        size_t L = sumo_cuda__gram_len(nin);
        bool same = memcmp(ga, gb, L * 8) == 0 && memcmp(ga, ge, L * 8) == 0;
        for (int j = 0; j < nin; j++) {
            free(hin[j]);
            m_free(M_DEV, da[j].base);
            m_free(M_DEV, db[j].base);
            m_free(M_EMU, de[j].base);
        }
        CHECK(same, "one tensor, nin %d: aligned, misaligned and emulated differ", nin);
    }
    /* A large single tensor (many items, two levels of the reduction), twice. */
    size_t n = g_quick ? (size_t)1 << 18 : (size_t)3 << 22;
    float *x = malloc(n * 4), *y = malloc(n * 4);
    gen(SUMO_FLOAT32, x, n, 1, false);
    gen(SUMO_FLOAT32, y, n, 2, false);
    tbuf dx = t_upload(M_DEV, SUMO_FLOAT32, x, n, 0), dy = t_upload(M_DEV, SUMO_FLOAT32, y, n, 0);
    double r1[3], r2[3], abs_sum;
    CHECK_OK(g_dev_table->dot_norms(g_dev_table->ctx, NULL, SUMO_FLOAT32, dx.p, dy.p, n, r1));
    CHECK_OK(g_dev_table->dot_norms(g_dev_table->ctx, NULL, SUMO_FLOAT32, dx.p, dy.p, n, r2));
    CHECK(memcmp(r1, r2, sizeof r1) == 0, "two runs, two results");
    double ex = exact_dot(SUMO_FLOAT32, x, y, n, &abs_sum);
    CHECK(within_gram_bound(r1[0], ex, abs_sum, n), "large dot %.17g vs %.17g", r1[0], ex);
    m_free(M_DEV, dx.base);
    m_free(M_DEV, dy.base);
    free(x);
    free(y);
}

/* P ranks on one GPU, a stream each: every result bit-identical across ranks and runs, equal
 * to the emulated run bit for bit, sum and average to the host path's. */
static void d_collectives(void) { check_collectives(M_DEV); }

/* NCCL at one rank (NCCL refuses two ranks of one communicator on one device): the real
 * library behind the transport: ncclSend/ncclRecv to itself from device and host buffers,
 * allgather, barrier, then sumo's collectives on device buffers. */
static void d_nccl_one_rank(void)
{
    sumo_cuda__nccl_api api;
    char why[256];
    if (sumo_cuda__nccl_load(&api, why, sizeof why) != SUMO_SUCCESS) {
        printf("    (NCCL not loaded: %s; set SUMO_NCCL_LIBRARY)\n", why);
        CHECK(getenv("SUMO_CUDA_TEST_REQUIRE_NCCL") == NULL, "NCCL required: %s", why);
        return;
    }
    sumo_cuda__nccl_id id;
    void *comm = NULL;
    CHECK(api.get_unique_id(&id) == SUMO_NCCL_SUCCESS, "ncclGetUniqueId");
    CHECK(api.comm_init_rank(&comm, 1, id, 0) == SUMO_NCCL_SUCCESS, "ncclCommInitRank");
    void *ctx;
    int rank, size;
    CHECK_OK(sumo_cuda__nccl_open(&api, comm, NULL, &ctx, &rank, &size));
    const sumo_transport_ops *ops = sumo_cuda__nccl_ops();
    int64_t later;
    {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        later = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec + (int64_t)60e9;
    }
    enum { B = 1 << 20 };
    unsigned char *hs = malloc(B), *hr = malloc(B);
    for (int i = 0; i < B; i++) hs[i] = (unsigned char)(i * 7 + 3);
    void *ds = m_alloc(M_DEV, B), *dr = m_alloc(M_DEV, B);
    m_put(M_DEV, ds, hs, B);
    CHECK_OK(ops->sendrecv(ctx, ds, B, 0, dr, B, 0, later));
    m_get(M_DEV, hr, dr, B);
    CHECK(memcmp(hs, hr, B) == 0, "device to device");
    memset(hr, 0, B);
    CHECK_OK(ops->sendrecv(ctx, hs, B, 0, hr, B, 0, later));
    CHECK(memcmp(hs, hr, B) == 0, "host to host through the staging area");
    uint64_t rec = 77, all = 0;
    CHECK_OK(ops->allgather(ctx, &rec, &all, sizeof rec, later));
    CHECK(all == 77, "allgather");
    CHECK_OK(ops->barrier(ctx, later));
    sumo_cuda__nccl_own(ctx);
    CHECK_OK(ops->destroy(ctx)); /* ends comm, and closes the library handle it was given */
    m_free(M_DEV, ds);
    m_free(M_DEV, dr);
    free(hs);
    free(hr);
    /* The public path: a communicator made through sumo, the kernels added, collectives on
     * device buffers (at one rank: the input comes back, Adasum included). */
    unsigned char uid[128];
    CHECK_OK(sumo_nccl_unique_id(uid, sizeof uid));
    sumo_comm *c = NULL;
    CHECK_OK(sumo_comm_create_nccl_rank(1, uid, sizeof uid, 0, 0, NULL, &c));
    CHECK_OK(sumo_comm_add_cuda(c, g_dev_kernels));
    const char *name = "";
    sumo_comm_transport(c, &name);
    CHECK(strcmp(name, "nccl") == 0, "transport %s", name);
    size_t n = 100000;
    float *h = malloc(n * 4), *back = malloc(n * 4);
    gen(SUMO_FLOAT32, h, n, 4, false);
    float *d = m_alloc(M_DEV, n * 4), *o = m_alloc(M_DEV, n * 4);
    m_put(M_DEV, d, h, n * 4);
    const sumo_op ops_[] = {SUMO_OP_SUM, SUMO_OP_AVERAGE, SUMO_OP_ADASUM};
    for (int i = 0; i < 3; i++) {
        CHECK_OK(sumo_cuda_allreduce(d, o, n, SUMO_FLOAT32, ops_[i], c, NULL));
        m_get(M_DEV, back, o, n * 4);
        CHECK(memcmp(back, h, n * 4) == 0, "op %u at one rank returns the input", ops_[i]);
    }
    CHECK_OK(sumo_broadcast(d, o, n, SUMO_FLOAT32, 0, c));
    CHECK_OK(sumo_allreduce(h, back, n, SUMO_FLOAT32, SUMO_OP_SUM, c)); /* host buffers too */
    CHECK(memcmp(back, h, n * 4) == 0, "host buffers");
    CHECK_OK(sumo_comm_destroy(c));
    m_free(M_DEV, d);
    m_free(M_DEV, o);
    free(h);
    free(back);
}

/* =============================== main ====================================================== */

int main(int argc, char **argv)
{
    bool device_only = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) g_quick = true;
        else if (strcmp(argv[i], "--device-only") == 0) device_only = true;
        else {
            fprintf(stderr, "usage: %s [--quick] [--device-only]\n", argv[0]);
            return 2;
        }
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    pthread_mutex_init(&g_emu.lock, NULL);
    if (sumo_host_kernels(&g_host) != SUMO_SUCCESS ||
        sumo_cuda__kernels_create_emulated(emu_claims, &g_emu, &g_emu_kernels) != SUMO_SUCCESS ||
        sumo_cuda_kernels_table(g_emu_kernels, &g_emu_table) != SUMO_SUCCESS) {
        fprintf(stderr, "test_cuda: setup failed\n");
        return 1;
    }
    static const test_case host_tests[] = {
        {"table complete, accepted", t_table_complete},
        {"no device: clear answers", t_no_device},
        {"argument checks", t_api_arguments},
        {"layout plan", t_plan},
        {"16-bit conversions (emulated)", t_conversions_emulated},
        {"exact entries vs host (emulated)", t_entries_emulated},
        {"Gram partials (emulated)", t_gram_emulated},
        {"threads P=2..4 (emulated)", t_collectives_emulated},
        {"NCCL transport, fake: collectives", t_nccl_fake_collectives},
        {"NCCL transport, fake: deadline", t_nccl_fake_timeout},
        {"NCCL transport, fake: NCCL error", t_nccl_fake_error},
        {"NCCL transport, fake: abort", t_nccl_fake_abort},
        {"NCCL transport, fake: create/ops", t_nccl_fake_create},
    };
    static const test_case device_tests[] = {
        {"claims", d_claims},
        {"16-bit conversions", d_conversions},
        {"exact entries vs host", d_entries},
        {"Gram partials vs emulator, bound", d_gram},
        {"threads P=2..4 on one GPU", d_collectives},
        {"NCCL at one rank", d_nccl_one_rank},
    };
    int failed = 0;
    if (!device_only) failed += run_tests("host", host_tests, sizeof host_tests / sizeof host_tests[0]);
    int ndev = 0;
    char why[256] = "";
    sumo_cuda_device_count(&ndev, why, sizeof why);
    if (ndev == 0) {
        printf("test_cuda: %zu device tests skipped: %s\n",
               sizeof device_tests / sizeof device_tests[0], why);
    } else if (sumo_cuda_kernels_create(0, &g_dev_kernels) != SUMO_SUCCESS ||
               sumo_cuda_kernels_table(g_dev_kernels, &g_dev_table) != SUMO_SUCCESS) {
        printf("test_cuda: FAILED: %s, but the kernels could not be set up on device 0\n", why);
        failed++;
    } else {
        struct cudaDeviceProp prop;
        if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
            printf("test_cuda: device 0: %s (sm_%d%d)%s\n", prop.name, prop.major, prop.minor,
                   g_quick ? ", quick sizes" : "");
        failed += run_tests("device", device_tests, sizeof device_tests / sizeof device_tests[0]);
        sumo_cuda_kernels_destroy(g_dev_kernels);
    }
    sumo_cuda_kernels_destroy(g_emu_kernels);
    printf("test_cuda: %d failed\n", failed);
    return failed ? 1 : 0;
}
