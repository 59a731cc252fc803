/*
 * The NCCL and CUDA calls the NCCL transport makes, as a table of function pointers: the
 * real one loads NCCL at run time (dlopen), so libsumo_cuda builds without nccl.h and loads
 * without libnccl; the host tests substitute fakes, so the transport's waits, deadlines,
 * staging and aborts are tested without a GPU.
 *
 * NCCL's types by their ABI: ncclResult_t and ncclDataType_t are ints, ncclComm_t and
 * cudaStream_t pointers, ncclUniqueId 128 bytes passed by value. tests/cuda/test_cuda.c
 * checks the constants below against nccl.h where it is installed.
 */
#ifndef SUMO_CUDA_NCCL_API_H
#define SUMO_CUDA_NCCL_API_H

#include "sumo.h"

#include <stdbool.h>
#include <stddef.h>

enum {
    SUMO_NCCL_SUCCESS = 0,
    SUMO_NCCL_UNHANDLED_CUDA_ERROR = 1,
    SUMO_NCCL_SYSTEM_ERROR = 2,
    SUMO_NCCL_INTERNAL_ERROR = 3,
    SUMO_NCCL_INVALID_ARGUMENT = 4,
    SUMO_NCCL_INVALID_USAGE = 5,
    SUMO_NCCL_REMOTE_ERROR = 6,
    SUMO_NCCL_IN_PROGRESS = 7,
    SUMO_NCCL_UINT8 = 1, /* ncclUint8 */
    SUMO_NCCL_SUM = 0,   /* ncclSum */
    SUMO_NCCL_ID_BYTES = 128,
    /* cudaError_t values the transport tells apart */
    SUMO_CUDA_SUCCESS = 0,
    SUMO_CUDA_NOT_READY = 600, /* cudaErrorNotReady */
};

typedef struct sumo_cuda__nccl_id {
    char internal[SUMO_NCCL_ID_BYTES];
} sumo_cuda__nccl_id;

typedef struct sumo_cuda__nccl_api {
    /* NCCL (results: ncclResult_t) */
    int (*get_version)(int *version);
    const char *(*get_error_string)(int result);
    const char *(*get_last_error)(void *comm); /* may be NULL (NCCL before 2.13) */
    int (*comm_count)(void *comm, int *count);
    int (*comm_user_rank)(void *comm, int *rank);
    int (*comm_cu_device)(void *comm, int *device);
    int (*comm_get_async_error)(void *comm, int *async_error);
    int (*comm_abort)(void *comm);
    int (*comm_destroy)(void *comm);
    int (*group_start)(void);
    int (*group_end)(void);
    int (*send)(const void *buf, size_t count, int datatype, int peer, void *comm, void *stream);
    int (*recv)(void *buf, size_t count, int datatype, int peer, void *comm, void *stream);
    int (*all_gather)(const void *sendbuf, void *recvbuf, size_t count, int datatype, void *comm,
                      void *stream);
    int (*all_reduce)(const void *sendbuf, void *recvbuf, size_t count, int datatype, int op,
                      void *comm, void *stream);
    int (*get_unique_id)(sumo_cuda__nccl_id *id);
    int (*comm_init_rank)(void **comm, int nranks, sumo_cuda__nccl_id id, int rank);
    /* CUDA (results: cudaError_t) */
    int (*stream_query)(void *stream);
    int (*stream_create)(void **stream);
    int (*stream_destroy)(void *stream);
    int (*device_alloc)(void **p, size_t bytes);
    int (*device_free)(void *p);
    int (*host_alloc)(void **p, size_t bytes); /* pinned */
    int (*host_free)(void *p);
    int (*copy_async)(void *dst, const void *src, size_t bytes, void *stream);
    bool (*is_device)(const void *p); /* kernel-visible memory NCCL can send from */
    int (*get_device)(int *device);
    int (*set_device)(int device);
    const char *(*cuda_error_string)(int e);
    /* dlopen handle to close with the transport (NULL: none) */
    void *library;
} sumo_cuda__nccl_api;

/* Loads NCCL: the one already in the process if any (so a communicator made by another
 * library's NCCL is driven by that library), else SUMO_NCCL_LIBRARY, else libnccl.so.2.
 * SUMO_ERR_INVALID_USAGE with the reason in why (bytes long) when it cannot. */
sumo_result sumo_cuda__nccl_load(sumo_cuda__nccl_api *api, char *why, size_t bytes);
/* Closes what nccl_load opened. */
void sumo_cuda__nccl_unload(sumo_cuda__nccl_api *api);

/*
 * The transport over `comm` with these calls (the real ones, or a test's). On success sumo owns
 * comm (the handle's destroy ends it); on failure the caller still does. stream NULL: the
 * transport creates its own.
 */
sumo_result sumo_cuda__nccl_comm_create(const sumo_cuda__nccl_api *api, void *comm, void *stream,
                                        sumo_comm **out);

/* The pieces of the above, for tests that call the operations directly: the operations, a
 * context over comm (not owned: its destroy op leaves comm and the context alone), taking
 * ownership (destroy then ends comm and frees the context), and freeing an unowned context. */
const struct sumo_transport_ops *sumo_cuda__nccl_ops(void);
sumo_result sumo_cuda__nccl_open(const sumo_cuda__nccl_api *api, void *comm, void *stream,
                                 void **ctx, int *rank, int *size);
void sumo_cuda__nccl_own(void *ctx);
void sumo_cuda__nccl_close_unowned(void *ctx);

#endif
