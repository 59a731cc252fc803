/*
 * The pinned host blocks an entry of the CUDA kernel table stages its small copies through
 * (pieces and weights up, Gram totals and flags down), kept by the kernels object under its
 * stage_lock. Internal: sumo_cuda__ names, hidden in libsumo_cuda.so.
 */
#ifndef SUMO_CUDA_STAGE_H
#define SUMO_CUDA_STAGE_H

#include "sumo.h"
#include "sumo_cuda.h"

#include <cuda_runtime_api.h>

#include <stddef.h>

/* Bytes of one staging block: the pieces and totals of a few hundred tensors; larger calls
 * copy through pageable memory, as before. */
#define SUMO_CUDA__STAGE_BYTES ((size_t)64 << 10)

struct sumo_cuda__stage {
    struct sumo_cuda__stage *next;
    void *mem; /* SUMO_CUDA__STAGE_BYTES */
};

/* A block for this entry, or NULL (bytes beyond a block, or no pinned memory to be had): then
 * the caller copies through pageable memory, which costs time, not correctness. */
struct sumo_cuda__stage *sumo_cuda__stage_take(sumo_cuda_kernels *k, size_t bytes);

/* Back to the object once the entry's copies are complete: at once after a success (the
 * entry has waited); after a failure its copies may still be queued on the block, so it goes
 * back once the stream has drained, and is leaked if the stream is broken. */
void sumo_cuda__stage_give_after(sumo_cuda_kernels *k, struct sumo_cuda__stage *st,
                                 sumo_result r, cudaStream_t s);

/* Frees the object's staging blocks (at destroy, after its streams are idle). */
void sumo_cuda__stage_free(sumo_cuda_kernels *k);

#endif
