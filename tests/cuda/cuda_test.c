/*
 * test_cuda's shared parts (cuda_test.h): the runner, the memories, data and comparisons, the
 * tables, the buffers of the checks.
 */
#include "cuda_test.h"

#include <cuda_runtime_api.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int g_failed_checks;
bool g_quick;

/* ---- the runner -------------------------------------------------------------------------- */

int run_tests(const char *group, const test_case *t, size_t n)
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

/* ---- memories ---------------------------------------------------------------------------- */

arena g_emu;

bool emu_claims(void *ctx, const void *ptr, size_t bytes)
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

void *m_alloc(int kind, size_t bytes)
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

void m_free(int kind, void *p)
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
void m_put(int kind, void *dst, const void *src, size_t bytes)
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
void m_get(int kind, void *dst, const void *src, size_t bytes)
{
    if (kind != M_DEV) {
        memcpy(dst, src, bytes);
        return;
    }
    cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) m_copy_failed("download", e);
}

/* ---- data -------------------------------------------------------------------------------- */

const sumo_dtype DTS[4] = {SUMO_FLOAT32, SUMO_FLOAT64, SUMO_FLOAT16, SUMO_BFLOAT16};
const char *const DT_NAME[4] = {"fp32", "fp64", "fp16", "bf16"};

size_t esz(sumo_dtype dt) { return harness_dtype_size(dt); }

void gen(sumo_dtype dt, void *buf, size_t n, uint64_t seed, bool specials)
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

size_t first_diff(sumo_dtype dt, const void *a, const void *b, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t x = bits_at(dt, a, i), y = bits_at(dt, b, i);
        if (x != y && !(bits_nan(dt, x) && bits_nan(dt, y))) return i;
    }
    return SIZE_MAX;
}

/* ---- tables ------------------------------------------------------------------------------ */

const sumo_kernel_table *g_host;
sumo_cuda_kernels *g_emu_kernels;
const sumo_kernel_table *g_emu_table;
sumo_cuda_kernels *g_dev_kernels;
const sumo_kernel_table *g_dev_table;

const sumo_kernel_table *table_of(int kind)
{
    return kind == M_HOST ? g_host : kind == M_EMU ? g_emu_table : g_dev_table;
}

/* ---- buffers of the checks --------------------------------------------------------------- */

tbuf t_alloc(int kind, sumo_dtype dt, size_t n, size_t off)
{
    tbuf b;
    b.base = m_alloc(kind, (n + off) * esz(dt) + 16);
    b.p = b.base + off * esz(dt);
    return b;
}

tbuf t_upload(int kind, sumo_dtype dt, const void *host, size_t n, size_t off)
{
    tbuf b = t_alloc(kind, dt, n, off);
    m_put(kind, b.p, host, n * esz(dt));
    return b;
}

void *fetch(int kind, sumo_dtype dt, const tbuf *b, size_t n)
{
    void *h = malloc(n * esz(dt) + 1);
    m_get(kind, h, b->p, n * esz(dt));
    return h;
}

const size_t LAYOUT[9] = {7, 0, 130, 1, 500, 33, 0, 70001, 4096};
size_t layout_offsets(size_t *off)
{
    off[0] = 0;
    for (size_t t = 0; t < NLAYOUT; t++) off[t + 1] = off[t] + LAYOUT[t];
    return off[NLAYOUT];
}
