/*
 * What every part of sumo's CUDA plugin stands on: the device guard an entry runs under and
 * the diagnostics of a CUDA failure (its sumo_result, and one line on stderr under
 * SUMO_DEBUG=WARN or INFO). Internal: sumo_cuda__ names, hidden in libsumo_cuda.so.
 */
#ifndef SUMO_CUDA_DEVICE_H
#define SUMO_CUDA_DEVICE_H

#include "sumo.h"
#include "sumo_cuda.h"

#include <cuda_runtime_api.h>

#include <stdbool.h>

/* Runs on the kernels' device: the calling thread's current device is switched for the call
 * and restored after it (a progress thread or a user thread may be on another device). */
typedef struct sumo_cuda__device_guard {
    int previous;
    bool switched;
} sumo_cuda__device_guard;

cudaError_t sumo_cuda__device_enter(const sumo_cuda_kernels *k, sumo_cuda__device_guard *g);
void sumo_cuda__device_leave(const sumo_cuda__device_guard *g);

/* A CUDA failure as a sumo_result (out of memory: SUMO_ERR_SYSTEM; a launch or argument the
 * runtime refused: SUMO_ERR_INTERNAL; no driver or device: SUMO_ERR_INVALID_USAGE), with one
 * line on stderr under SUMO_DEBUG=WARN or INFO naming the call, the error and where: sumo's
 * message names the memory and the entry, this gives the CUDA detail. Clears the runtime's
 * last (non-sticky) error. */
sumo_result sumo_cuda__fail(cudaError_t e, const char *what, const char *file, int line);
#define SUMO_CUDA__FAIL(e, what) sumo_cuda__fail((e), (what), __FILE__, __LINE__)

/* One line on stderr under SUMO_DEBUG=WARN or INFO ("sumo cuda: ..."). */
void sumo_cuda__warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
