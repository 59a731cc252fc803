/*
 * The staging blocks of the CUDA kernel table (stage_cuda.h): pinned host memory, one block per
 * entry in flight. A pageable copy waits on the host by itself; from pinned memory the copies
 * queue and the entry waits once. Emulated: malloc'd blocks through the same code.
 */
#include "cuda_internal.h"
#include "stage_cuda.h"

#include <stdlib.h>

/* A block for this entry, or NULL (bytes beyond a block, or no pinned memory to be had): then
 * the caller copies through pageable memory, which costs time, not correctness. */
struct sumo_cuda__stage *sumo_cuda__stage_take(sumo_cuda_kernels *k, size_t bytes)
{
    if (bytes > SUMO_CUDA__STAGE_BYTES) return NULL;
    pthread_mutex_lock(&k->stage_lock);
    struct sumo_cuda__stage *st = k->stages;
    if (st) k->stages = st->next;
    pthread_mutex_unlock(&k->stage_lock);
    if (st) return st;
    st = malloc(sizeof *st);
    if (st == NULL) return NULL;
    if (k->emulated) {
        st->mem = aligned_alloc(64, SUMO_CUDA__STAGE_BYTES);
    } else if (cudaHostAlloc(&st->mem, SUMO_CUDA__STAGE_BYTES, cudaHostAllocPortable) != cudaSuccess) {
        (void)cudaGetLastError();
        st->mem = NULL;
    }
    if (st->mem == NULL) {
        free(st);
        return NULL;
    }
    return st;
}

/* Back to the object, once the entry's copies are complete. */
static void stage_give(sumo_cuda_kernels *k, struct sumo_cuda__stage *st)
{
    if (st == NULL) return;
    pthread_mutex_lock(&k->stage_lock);
    st->next = k->stages;
    k->stages = st;
    pthread_mutex_unlock(&k->stage_lock);
}

void sumo_cuda__stage_free(sumo_cuda_kernels *k)
{
    while (k->stages) {
        struct sumo_cuda__stage *st = k->stages;
        k->stages = st->next;
        if (k->emulated) free(st->mem);
        else (void)cudaFreeHost(st->mem);
        free(st);
    }
}

/* After a failure an entry's copies may still be queued on a staging block: it goes back
 * once the stream has drained. */
void sumo_cuda__stage_give_after(sumo_cuda_kernels *k, struct sumo_cuda__stage *st,
                                 sumo_result r, cudaStream_t s)
{
    if (st == NULL) return;
    if (r != SUMO_SUCCESS && !k->emulated && cudaStreamSynchronize(s) != cudaSuccess) {
        (void)cudaGetLastError();
        return; /* the stream is broken: the block may still be read; leak it */
    }
    stage_give(k, st);
}
