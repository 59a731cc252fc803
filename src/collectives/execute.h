/*
 * The one way into a collective. Every public collective, every asynchronous request and the
 * layers above's own exchanges fill one descriptor (sumo__call), which sumo__submit
 * (requests.h) runs now or queues, and sumo__execute runs on the held handle: one validation,
 * the choice of the kernel table from where the buffers live, the op's kind, one agreement
 * inside the algorithm, the data phase.
 */
#ifndef SUMO_EXECUTE_H
#define SUMO_EXECUTE_H

#include "collectives/agree.h"
#include "collectives/gram.h"

/* Bytes of arguments a composite call carries (a copy, so an asynchronous one outlives the
 * caller's frame). */
#define SUMO__CALL_ARGS_BYTES 64

typedef struct sumo__call {
    uint32_t kind; /* enum sumo__call_kind */
    const void *sendbuf;
    void *recvbuf;
    size_t count;
    sumo_dtype dtype;
    sumo_op op;
    int root;
    void *stream;
    /* SUMO__CALL_GRAM: the combine, and the hash every rank must announce alike. */
    const sumo__gram_call *gram;
    uint64_t hash;
    bool *applied;
    /* SUMO__CALL_FAIL: the failure to announce; SUMO__CALL_SETUP: this rank's outcome, with
     * the fingerprint in hash and what the messages name. */
    sumo_result fail;
    const char *what;
    /* SUMO__CALL_COMPRESSED: the caller's options, copied whole when their struct_size is this
     * library's, else that struct_size alone (nothing past it is read); none when it passed
     * NULL. The buffers are fp32 (dtype). */
    sumo_compression compression;
    bool has_compression;
    /* SUMO__CALL_COMPOSITE: a layer above's operation, run with the handle held; the
     * collectives it makes go through sumo__execute. */
    sumo_result (*run)(sumo_comm *comm, void *args);
    _Alignas(8) unsigned char args[SUMO__CALL_ARGS_BYTES];
} sumo__call;

/* The descriptors of the public collectives. */
static inline sumo__call sumo__allreduce_call(const void *sendbuf, void *recvbuf, size_t count,
                                 sumo_dtype dtype, sumo_op op)
{
    return (sumo__call){.kind = SUMO__CALL_ALLREDUCE, .sendbuf = sendbuf, .recvbuf = recvbuf,
                        .count = count, .dtype = dtype, .op = op};
}

static inline sumo__call sumo__allgather_call(const void *sendbuf, void *recvbuf, size_t count, sumo_dtype dtype)
{
    return (sumo__call){.kind = SUMO__CALL_ALLGATHER, .sendbuf = sendbuf, .recvbuf = recvbuf,
                        .count = count, .dtype = dtype};
}

static inline sumo__call sumo__broadcast_call(const void *sendbuf, void *recvbuf, size_t count,
                                 sumo_dtype dtype, int root)
{
    return (sumo__call){.kind = SUMO__CALL_BROADCAST, .sendbuf = sendbuf, .recvbuf = recvbuf,
                        .count = count, .dtype = dtype, .root = root};
}

static inline sumo__call sumo__reduce_scatter_call(const void *sendbuf, void *recvbuf, size_t count,
                                      sumo_dtype dtype, sumo_op op)
{
    return (sumo__call){.kind = SUMO__CALL_REDUCE_SCATTER, .sendbuf = sendbuf,
                        .recvbuf = recvbuf, .count = count, .dtype = dtype, .op = op};
}

static inline sumo__call sumo__allreduce_compressed_call(const float *sendbuf, float *recvbuf,
                                                         size_t count,
                                                         const sumo_compression *options)
{
    sumo__call call = {.kind = SUMO__CALL_COMPRESSED, .sendbuf = sendbuf, .recvbuf = recvbuf,
                       .count = count, .dtype = SUMO_FLOAT32, .has_compression = options != NULL};
    if (options != NULL)
        call.compression = SUMO__STRUCT_SIZE_PROBLEM(options, sumo_compression, NULL, 0)
                               ? (sumo_compression){.struct_size = options->struct_size}
                               : *options;
    return call;
}

/* Runs call on a handle the caller holds (sumo__comm_enter, or inside a composite). */
sumo_result sumo__execute(sumo_comm *comm, const sumo__call *call);

/* A composite call whose arguments are args (args_bytes <= SUMO__CALL_ARGS_BYTES). */
sumo__call sumo__composite(sumo_result (*run)(sumo_comm *comm, void *args), const void *args,
                           size_t args_bytes);

/* The public collectives, for a caller that holds the handle. */
sumo_result sumo__allreduce_held(sumo_comm *comm, const void *sendbuf, void *recvbuf,
                                 size_t count, sumo_dtype dtype, sumo_op op);
sumo_result sumo__allgather_held(sumo_comm *comm, const void *sendbuf, void *recvbuf,
                                 size_t count, sumo_dtype dtype);
sumo_result sumo__broadcast_held(sumo_comm *comm, const void *sendbuf, void *recvbuf,
                                 size_t count, sumo_dtype dtype, int root);
/* This rank failed where its peers are entering a collective (a held sumo_comm_fail). */
sumo_result sumo__fail_held(sumo_comm *comm, sumo_result code);

/* The Gram-form combine (collectives/gram.h) as a collective of its own, for a layer above
 * (ACGA) that holds the handle: agrees on the layout by its hash, then runs; in place when
 * sendbuf == recvbuf. Declined (*applied false), the receive buffer holds nothing or a copy of
 * the send buffer. */
sumo_result sumo__gram_allreduce(sumo_comm *comm, const void *sendbuf, void *recvbuf,
                                 const sumo__gram_call *call, uint64_t layout_hash,
                                 bool *applied);

#endif
