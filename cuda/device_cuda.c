/*
 * The device guard and the diagnostics of sumo's CUDA plugin (device_cuda.h): the kernel
 * table, the sharing between processes and the NCCL transport all run their CUDA calls under
 * the guard and report a failure through sumo_cuda__fail, so these stand apart from each of
 * them.
 */
#include "cuda_internal.h"
#include "device_cuda.h"

#include <stdarg.h>
#include <stdio.h>
#include <strings.h>

static bool debug_on(void)
{
    const char *v;
    sumo_setting("SUMO_DEBUG", &v); /* NULL when malformed (constructors refuse it) */
    return v && (strcasecmp(v, "WARN") == 0 || strcasecmp(v, "INFO") == 0);
}

void sumo_cuda__warn(const char *fmt, ...)
{
    if (!debug_on()) return;
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "sumo cuda: %s\n", line);
}

sumo_result sumo_cuda__fail(cudaError_t e, const char *what, const char *file, int line)
{
    (void)cudaGetLastError();
    sumo_cuda__warn("%s: %s: %s (%s:%d)", what, cudaGetErrorName(e), cudaGetErrorString(e), file,
                    line);
    switch (e) {
    case cudaErrorMemoryAllocation: return SUMO_ERR_SYSTEM;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice: return SUMO_ERR_INVALID_USAGE;
    default: return SUMO_ERR_INTERNAL;
    }
}

cudaError_t sumo_cuda__device_enter(const sumo_cuda_kernels *k, sumo_cuda__device_guard *g)
{
    g->switched = false;
    g->previous = k->device;
    if (k->emulated) return cudaSuccess;
    cudaError_t e = cudaGetDevice(&g->previous);
    if (e != cudaSuccess) return e;
    if (g->previous == k->device) return cudaSuccess;
    e = cudaSetDevice(k->device);
    g->switched = e == cudaSuccess;
    return e;
}

void sumo_cuda__device_leave(const sumo_cuda__device_guard *g)
{
    if (g->switched) (void)cudaSetDevice(g->previous);
}
