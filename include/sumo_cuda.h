/*
 * sumo on CUDA device memory (libsumo_cuda): a kernel table that runs every touch of a
 * collective's data as CUDA kernels, a transport over an NCCL communicator, and an allreduce
 * of device buffers with a stream argument. Built on sumo.h and the experimental seams of
 * sumo_ext.h; libsumo_cuda.so links against libsumo.so.
 *
 * What runs where (docs/gpu.md has the details and what has been run on hardware):
 *   - ranks that share one process (the threads transport), for instance several ranks on
 *     one GPU, each with its own stream: sum, average and Adasum of device buffers, with the
 *     results of the host path (sum and average bit for bit; Adasum's dot products in its own
 *     fixed order: bit-identical on every rank and run, equal to the host's within rounding);
 *   - ranks in separate processes of one node (the shared-memory transport of sumo_shm.h:
 *     torchrun's processes, on one GPU or several): the same direct algorithms, each rank's
 *     kernels on its peers' device buffers through CUDA IPC (the table's share entries);
 *     buffers IPC cannot export (cudaMallocAsync pools, cuMemMap / expandable segments,
 *     managed memory) are refused on every rank before any data moves, saying what to change.
 *     Tested on the host with an emulated IPC only; not yet run on a device;
 *   - a transport over NCCL (one GPU per rank): every collective of sumo.h, over NCCL's
 *     point-to-point calls, on device or host buffers.
 *
 * Every function returns a sumo_result. A call returns when its result is in place: kernels
 * run on the stream given, and the host waits for them (sumo orders ranks with host-side
 * barriers, which do not order device streams).
 *
 * What a caller orders before a call: its kernels read the buffers on the stream given (a
 * table entry: on its `exec` stream), so whatever wrote them must be complete, or queued
 * earlier on that stream, or made to come first (cudaStreamWaitEvent). Work on other streams
 * is not waited for, and note the legacy default stream: cudaMemcpy from pageable memory
 * returns before the copy has landed and cudaMemset returns at once, both on the legacy
 * stream, which a stream created with cudaStreamNonBlocking does not wait for. After such an
 * upload, synchronise (cudaStreamSynchronize(0)) or record an event for the stream to wait on
 * before calling with a non-blocking stream; a blocking stream is ordered after the legacy
 * one, and NULL is the legacy stream itself.
 *
 * Only the CUDA and NCCL handles' types appear as void * here, so that including this header
 * needs neither cuda_runtime.h nor nccl.h: pass a cudaStream_t as `stream` (NULL: the legacy
 * default stream) and an ncclComm_t as `nccl_comm`.
 */
#ifndef SUMO_CUDA_H
#define SUMO_CUDA_H

#include "sumo.h"

#ifdef __cplusplus
extern "C" {
#endif

struct sumo_kernel_table; /* sumo_ext.h */

/*
 * The number of CUDA devices this process can use. Without a driver or a device this is not
 * an error: *count is 0 and message (bytes long, may be NULL) says why, e.g. "no CUDA device
 * (cudaGetDeviceCount: cudaErrorNoDevice: no CUDA-capable device is detected)".
 */
SUMO_API sumo_result sumo_cuda_device_count(int *count, char *message, size_t bytes);

/*
 * The kernels for one device's memory: an object that holds the device's table and a memory
 * pool for the scratch of each call (metadata, block partials), so that no call pays for a
 * fresh device allocation. device: an ordinal, or -1 for the calling thread's current device.
 * Fails with SUMO_ERR_INVALID_USAGE where there is no device at all (no driver, no GPU) and
 * SUMO_ERR_INVALID_ARGUMENT for an ordinal out of range, saying why in one line on stderr.
 */
typedef struct sumo_cuda_kernels sumo_cuda_kernels;
SUMO_API sumo_result sumo_cuda_kernels_create(int device, sumo_cuda_kernels **out);
/* NULL is fine. Destroy it after every handle that uses it. */
SUMO_API sumo_result sumo_cuda_kernels_destroy(sumo_cuda_kernels *kernels);
/* Its table (sumo_ext.h), for sumo_comm_add_kernels or to call the kernels directly. Memory
 * name "cuda"; claims() accepts device (and managed) memory of this device; share,
 * open_shared and close_shared are CUDA IPC. */
SUMO_API sumo_result sumo_cuda_kernels_table(const sumo_cuda_kernels *kernels,
                                             const struct sumo_kernel_table **table);
/* sumo_comm_add_kernels(comm, table of kernels): collectives on comm whose buffers are this
 * device's memory run on it from then on. kernels must outlive comm. */
SUMO_API sumo_result sumo_comm_add_cuda(sumo_comm *comm, const sumo_cuda_kernels *kernels);

/*
 * sumo_allreduce of device buffers, with a stream: waits for the work queued on `stream`
 * first (on the threads and shared-memory transports the peers read this rank's buffers from
 * their own streams, or processes), runs the kernels on `stream`, and returns once recvbuf holds the result on every
 * rank. A failure of that first wait fails the call on every rank (sumo_comm_fail), so no
 * rank waits for this one. comm needs sumo_comm_add_cuda first.
 */
SUMO_API sumo_result sumo_cuda_allreduce(const void *sendbuf, void *recvbuf, size_t count,
                                         sumo_dtype dtype, sumo_op op, sumo_comm *comm,
                                         void *stream);

/*
 * Adasum of nin inputs (1 to 16) that one caller holds whole on this object's device, per
 * tensor of a layout (offsets: ntensors + 1 prefix sums of element counts, from 0): sumo's
 * Gram form of the tree, flat (no groups), as sumo_allreduce with SUMO_OP_ADASUM computes it
 * for nin ranks (the same Gram partials, the same weights to the bit, the same weighted sum),
 * without a communicator: the Gram partials, each tensor's weights and the weighted sum into
 * each of the nout outputs (1 to 16; an output may be an input) run on `stream` with no host
 * round trip between them, and the call waits once, at the end.
 *
 * *applied (may be NULL) is 1 when the weights were applied, 0 when they were declined: a
 * tensor's inputs cancel so that the Gram form's weights cannot be trusted to the dtype's
 * accuracy (8 epsilon), or are not finite. Then no output was written, the inputs are whole,
 * and the caller takes another way (sumo_allreduce's tree, or its own). fp64 asks 8 x 2^-52 of
 * every non-root norm, which the quadratic forms rarely deliver beyond two inputs: expect it
 * to decline there (sumo's allreduce keeps the tree for fp64).
 */
SUMO_API sumo_result sumo_cuda_adasum_combine(sumo_cuda_kernels *kernels, sumo_dtype dtype,
                                              void *const *outs, int nout,
                                              const void *const *ins, int nin,
                                              const size_t *offsets, size_t ntensors,
                                              void *stream, int *applied);

/*
 * A communicator over an NCCL communicator (ncclComm_t), one rank per NCCL rank. sumo's
 * collectives run over it as over any transport of sumo_ext.h: point-to-point algorithms
 * whose messages are ncclSend/ncclRecv pairs in a group on `stream` (NULL: a stream of its
 * own), device buffers directly, host buffers through a device staging area. Each wait
 * polls the stream and ncclCommGetAsyncError against sumo's deadline.
 *
 * The NCCL communicator is handed over: from a successful call on, sumo owns it, and
 * sumo_comm_destroy ends it (ncclCommDestroy, or ncclCommAbort where an operation failed or
 * timed out: NCCL's way out of a hang, which frees it). To keep using a communicator of your
 * own, hand sumo a split of it (ncclCommSplit). For the deadline to hold while NCCL connects,
 * create it non-blocking (ncclConfig_t.blocking = 0): a blocking one may wait inside NCCL.
 *
 * NCCL is loaded at run time (libnccl.so.2, or the library SUMO_NCCL_LIBRARY names; one
 * already loaded in the process is used first), so libsumo_cuda needs no NCCL to load.
 * Device buffers need sumo_comm_add_cuda(comm, kernels) for the rank's device.
 */
SUMO_API sumo_result sumo_comm_create_nccl(void *nccl_comm, void *stream, sumo_comm **out);

/* NCCL's rendezvous for callers that have no NCCL of their own (ctypes): rank 0 makes the
 * id (bytes >= 128), every rank gets it (a store, a broadcast), and each creates its
 * communicator with it, on `device` (-1: the current device). sumo owns the NCCL
 * communicator it creates; ncclCommInitRank waits for every rank to arrive. */
SUMO_API sumo_result sumo_nccl_unique_id(void *id, size_t bytes);
SUMO_API sumo_result sumo_comm_create_nccl_rank(int nranks, const void *id, size_t id_bytes,
                                                int rank, int device, void *stream,
                                                sumo_comm **out);

#ifdef __cplusplus
}
#endif

#endif /* SUMO_CUDA_H */
