/*
 * What the files of sumo's CUDA plugin share: the kernels object behind sumo_cuda.h and the
 * emulated table the host tests use (the device guard and the diagnostics: device_cuda.h).
 * Internal: sumo_cuda__ names, hidden in libsumo_cuda.so.
 */
#ifndef SUMO_CUDA_INTERNAL_H
#define SUMO_CUDA_INTERNAL_H

#ifndef SUMO_EXPERIMENTAL_API
#define SUMO_EXPERIMENTAL_API 1
#endif
#include "sumo.h"
#include "sumo_cuda.h"
#include "sumo_ext.h"

#include <cuda_runtime_api.h>

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

struct sumo_cuda_kernels {
    sumo_kernel_table table; /* ctx: this object */
    int device;
    /* Emulated: "device" memory is host memory, kernels run through the *_emulate entry
     * points, and claims() is the caller's (tests). */
    bool emulated;
    bool (*claims_fn)(void *claims_ctx, const void *ptr, size_t bytes);
    void *claims_ctx;
    /* The scratch of each call, stream-ordered. A pool of our own with no release threshold:
     * the default pool hands its memory back to the driver at every synchronisation, and each
     * entry ends with one, so every call would map fresh memory. NULL where the device has no
     * pools (then cudaMalloc / cudaFree per call). */
    cudaMemPool_t pool;
    /* Sharing between processes (ipc_cuda.c), under ipc_lock: the allocations this process
     * exported and the peers' it opened (counted: CUDA maps a handle once per process). */
    pthread_mutex_t ipc_lock;
    struct sumo_cuda__export *exports;
    struct sumo_cuda__import *imports;
    void *get_attributes; /* the driver's cuPointerGetAttributes, fetched at the first share */
    /* Emulated with sharing (sumo_cuda__kernels_emulate_ipc): "device" memory is memfd
     * mappings, which a peer process opens through /proc, as CUDA IPC opens an allocation. */
    bool emulated_ipc;
    struct sumo_cuda__emu_block *emu_blocks;
    /* Pinned host blocks (stage_cuda.h) for the small copies of an entry (pieces
     * and weights up, Gram totals and flags down), under stage_lock: allocated on first need,
     * kept, one per entry in flight (ranks of the threads transport share the object). A
     * pageable copy waits on the host by itself; from pinned memory the copies queue and the
     * entry waits once. Emulated: malloc'd blocks through the same code. */
    pthread_mutex_t stage_lock;
    struct sumo_cuda__stage *stages;
};

/* Fills k->table: every entry of sumo_kernel_table over k's kernels (table_cuda.c). */
void sumo_cuda__fill_table(sumo_cuda_kernels *k);

/* A kernels object whose kernels run on the host through the emulators (kernels_cuda.h), on
 * host memory, with the test's claims(): the table's glue, planning and arithmetic without a
 * GPU. Destroy with sumo_cuda_kernels_destroy. */
sumo_result sumo_cuda__kernels_create_emulated(bool (*claims)(void *ctx, const void *ptr,
                                                              size_t bytes),
                                               void *claims_ctx, sumo_cuda_kernels **out);

/* Sharing between processes (ipc_cuda.c): fills the table's share, open_shared and
 * close_shared; frees what the object still holds of them (at destroy). */
void sumo_cuda__fill_ipc(sumo_cuda_kernels *k);
void sumo_cuda__ipc_free(sumo_cuda_kernels *k);

/* Turns an emulated object's sharing on (the host tests of processes): its scratch and the
 * buffers of sumo_cuda__emu_shared_alloc are memfd mappings that share() names for a peer
 * process (pid, descriptor, inode) and open_shared maps through /proc/<pid>/fd. Before the
 * object is used. */
sumo_result sumo_cuda__kernels_emulate_ipc(sumo_cuda_kernels *k);
/* Emulated "device" memory that can be shared (zeroed, 64-byte aligned); free with
 * sumo_cuda__emu_shared_free. Whether [ptr, ptr + bytes) lies in one such block. */
sumo_result sumo_cuda__emu_shared_alloc(sumo_cuda_kernels *k, size_t bytes, void **ptr);
void sumo_cuda__emu_shared_free(sumo_cuda_kernels *k, void *ptr);
bool sumo_cuda__emu_shared_owns(sumo_cuda_kernels *k, const void *ptr, size_t bytes);

/* The device combine's weights' parameters (sumo__adasum_gram_params less the rank count, which
 * is the input count). */
typedef struct sumo_cuda__combine_params {
    int group_size;
    double need, gram_err;
} sumo_cuda__combine_params;

/*
 * Adasum of nin inputs one caller holds whole on k's device, per tensor of the layout (offsets
 * from 0, ntensors + 1 of them): the Gram partials, each tensor's weights and the weighted sum
 * into the nout outputs, queued on exec without a wait between, then one wait (table_cuda.c).
 * *applied: whether every tensor's weights were accepted (its flags 0); if not, no output was
 * written (inputs that are outputs are whole). flags (host, ntensors, may be NULL): each
 * tensor's sumo__adasum_gram_weights flags.
 */
sumo_result sumo_cuda__combine(sumo_cuda_kernels *k, void *exec, sumo_dtype dtype,
                               void *const *outs, int nout, const void *const *ins, int nin,
                               const size_t *offsets, size_t ntensors,
                               const sumo_cuda__combine_params *prm, unsigned char *flags,
                               bool *applied);

#define SUMO_CUDA__CHECK_RESULT(call)         \
    do {                                      \
        sumo_result cr_ = (call);             \
        if (cr_ != SUMO_SUCCESS) return cr_;  \
    } while (0)

#endif
