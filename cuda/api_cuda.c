/*
 * The functions of sumo_cuda.h for the kernels object: how many devices there are, an
 * object for one device (its table, table_cuda.c's, and a memory pool for the scratch of each
 * call) or an emulated one for the host tests, its table, adding it to a communicator, and
 * an allreduce of device buffers on a stream.
 */
#include "cuda_internal.h"
#include "device_cuda.h"
#include "stage_cuda.h"
#include "../src/kernels/adasum_weights.h" /* sumo__adasum_need: the collectives' own accuracy */

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

sumo_result sumo_cuda_device_count(int *count, char *message, size_t bytes)
{
    if (count == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        n = 0;
    }
    *count = n;
    if (message && bytes) {
        /* The runtime's own words for a missing driver ("CUDA driver version is insufficient")
         * mislead where there is no driver at all. */
        const char *text = e == cudaErrorInsufficientDriver
                               ? "no driver (libcuda.so), or one older than this runtime"
                               : cudaGetErrorString(e);
        if (e != cudaSuccess)
            snprintf(message, bytes, "no CUDA device (cudaGetDeviceCount: %s: %s)",
                     cudaGetErrorName(e), text);
        else if (n == 0)
            snprintf(message, bytes, "no CUDA device (cudaGetDeviceCount reports 0)");
        else
            snprintf(message, bytes, "%d CUDA device%s", n, n == 1 ? "" : "s");
    }
    return SUMO_SUCCESS;
}

sumo_result sumo_cuda_kernels_create(int device, sumo_cuda_kernels **out)
{
    if (out == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *out = NULL;
    /* No handle exists to carry a message yet: the reason goes to stderr, one line, as sumo's
     * own constructors do. */
    int n = 0;
    char why[256];
    sumo_cuda_device_count(&n, why, sizeof why);
    if (n == 0) {
        fprintf(stderr, "sumo: sumo_cuda_kernels_create: %s\n", why);
        return SUMO_ERR_INVALID_USAGE;
    }
    cudaError_t e;
    if (device == -1 && (e = cudaGetDevice(&device)) != cudaSuccess)
        return SUMO_CUDA__FAIL(e, "cudaGetDevice");
    if (device < 0 || device >= n) {
        fprintf(stderr, "sumo: sumo_cuda_kernels_create: no device %d (%d CUDA device%s)\n", device,
                n, n == 1 ? "" : "s");
        return SUMO_ERR_INVALID_ARGUMENT;
    }
    sumo_cuda_kernels *k = calloc(1, sizeof *k);
    if (k == NULL) return SUMO_ERR_SYSTEM;
    pthread_mutex_init(&k->ipc_lock, NULL);
    pthread_mutex_init(&k->stage_lock, NULL);
    k->device = device;
    int pools = 0;
    e = cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, device);
    if (e == cudaSuccess && pools) {
        struct cudaMemPoolProps props;
        memset(&props, 0, sizeof props);
        props.allocType = cudaMemAllocationTypePinned;
        props.location.type = cudaMemLocationTypeDevice;
        props.location.id = device;
        e = cudaMemPoolCreate(&k->pool, &props);
        if (e == cudaSuccess) {
            uint64_t keep = UINT64_MAX;
            e = cudaMemPoolSetAttribute(k->pool, cudaMemPoolAttrReleaseThreshold, &keep);
        }
    }
    if (e != cudaSuccess) {
        sumo_result r = SUMO_CUDA__FAIL(e, "sumo_cuda_kernels_create: memory pool");
        if (k->pool) (void)cudaMemPoolDestroy(k->pool);
        pthread_mutex_destroy(&k->ipc_lock);
        pthread_mutex_destroy(&k->stage_lock);
        free(k);
        return r;
    }
    sumo_cuda__fill_table(k);
    *out = k;
    return SUMO_SUCCESS;
}

sumo_result sumo_cuda__kernels_create_emulated(bool (*claims)(void *ctx, const void *ptr,
                                                              size_t bytes),
                                               void *claims_ctx, sumo_cuda_kernels **out)
{
    if (out == NULL || claims == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    sumo_cuda_kernels *k = calloc(1, sizeof *k);
    if (k == NULL) return SUMO_ERR_SYSTEM;
    pthread_mutex_init(&k->ipc_lock, NULL);
    pthread_mutex_init(&k->stage_lock, NULL);
    k->emulated = true;
    k->claims_fn = claims;
    k->claims_ctx = claims_ctx;
    sumo_cuda__fill_table(k);
    *out = k;
    return SUMO_SUCCESS;
}

sumo_result sumo_cuda_kernels_destroy(sumo_cuda_kernels *kernels)
{
    if (kernels == NULL) return SUMO_SUCCESS;
    if (kernels->pool) {
        sumo_cuda__device_guard g;
        if (sumo_cuda__device_enter(kernels, &g) == cudaSuccess) {
            /* Scratch is freed on its streams: wait for them before the pool goes. */
            (void)cudaDeviceSynchronize();
            (void)cudaMemPoolDestroy(kernels->pool);
            sumo_cuda__device_leave(&g);
        }
        (void)cudaGetLastError();
    }
    sumo_cuda__ipc_free(kernels);
    sumo_cuda__stage_free(kernels);
    pthread_mutex_destroy(&kernels->ipc_lock);
    pthread_mutex_destroy(&kernels->stage_lock);
    free(kernels);
    return SUMO_SUCCESS;
}

sumo_result sumo_cuda_kernels_table(const sumo_cuda_kernels *kernels,
                                    const struct sumo_kernel_table **table)
{
    if (kernels == NULL || table == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *table = &kernels->table;
    return SUMO_SUCCESS;
}

sumo_result sumo_comm_add_cuda(sumo_comm *comm, const sumo_cuda_kernels *kernels)
{
    if (comm == NULL || kernels == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    return sumo_comm_add_kernels(comm, &kernels->table);
}

sumo_result sumo_cuda_allreduce(const void *sendbuf, void *recvbuf, size_t count,
                                sumo_dtype dtype, sumo_op op, sumo_comm *comm, void *stream)
{
    if (comm == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    /* The inputs must be complete before any peer reads them from its own stream. A rank that
     * cannot tell fails the call on every rank, at once. */
    cudaError_t e = cudaStreamSynchronize((cudaStream_t)stream);
    if (e != cudaSuccess) {
        char why[256];
        snprintf(why, sizeof why, "cudaStreamSynchronize before the allreduce: %s: %s",
                 cudaGetErrorName(e), cudaGetErrorString(e));
        (void)cudaGetLastError();
        return sumo_comm_fail(comm, e == cudaErrorMemoryAllocation ? SUMO_ERR_SYSTEM
                                                                   : SUMO_ERR_INVALID_USAGE,
                              why);
    }
    sumo_collective c = {.struct_size = sizeof c, .kind = SUMO_COLLECTIVE_ALLREDUCE,
                         .sendbuf = sendbuf, .recvbuf = recvbuf, .count = count,
                         .dtype = dtype, .op = op, .stream = stream};
    return sumo_collective_run(comm, &c);
}

sumo_result sumo_cuda_adasum_combine(sumo_cuda_kernels *kernels, sumo_dtype dtype,
                                     void *const *outs, int nout, const void *const *ins, int nin,
                                     const size_t *offsets, size_t ntensors, void *stream,
                                     int *applied)
{
    if (applied) *applied = 0;
    if (kernels == NULL || outs == NULL || ins == NULL || offsets == NULL)
        return SUMO_ERR_INVALID_ARGUMENT;
    const sumo_cuda__combine_params prm = {.group_size = 1, .need = sumo__adasum_need(dtype)};
    bool ok = false;
    sumo_result r = sumo_cuda__combine(kernels, stream, dtype, outs, nout, ins, nin, offsets,
                                       ntensors, &prm, NULL, &ok);
    if (r == SUMO_SUCCESS && applied) *applied = ok;
    return r;
}
