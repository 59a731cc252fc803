/*
 * sumo: collectives for data-parallel training.
 *
 * This header is the whole public surface of the core library: results, dtypes, reduction
 * operations, communicators and the collectives. Transports that need a third-party header
 * (MPI) have their own header (sumo_mpi.h) that builds on this one.
 *
 * Conventions, everywhere:
 *   - every function returns a sumo_result; 0 (SUMO_SUCCESS) is success, and
 *     sumo_strerror() turns any value into a sentence. sumo_comm_error_message() gives the
 *     detail of the last failure on a communicator (which rank disagreed, which deadline).
 *   - handles are opaque; destroy functions accept NULL.
 *   - collectives take NCCL's argument order (send buffer, receive buffer, count, dtype, op,
 *     communicator) and run in place when the two buffers are the same pointer.
 *   - every rank ends a collective with bit-identical output, and the same inputs give the
 *     same output on every run.
 *   - setting SUMO_DEBUG=WARN (or INFO) in the environment prints a file:line trail of each
 *     failure (INFO also each algorithm choice) on stderr.
 */
#ifndef SUMO_H
#define SUMO_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What the shared library exports: the public functions (it is built with
 * -fvisibility=hidden; of sumo__, only what its MPI plugin calls leaves it, under a private
 * version node). */
#if defined(__GNUC__) && !defined(SUMO_STATIC)
#define SUMO_API __attribute__((visibility("default")))
#else
#define SUMO_API
#endif

/* The version these headers describe. A library with another major.minor may lay out its
 * structs or enums differently: bindings compare sumo_version() with what they were made for. */
#define SUMO_VERSION_MAJOR 0
#define SUMO_VERSION_MINOR 3
#define SUMO_VERSION_PATCH 0
#define SUMO_VERSION_NUMBER (SUMO_VERSION_MAJOR * 10000 + SUMO_VERSION_MINOR * 100 + SUMO_VERSION_PATCH)

typedef enum sumo_result {
    SUMO_SUCCESS = 0,
    SUMO_ERR_INVALID_ARGUMENT = 1, /* NULL/overlapping buffers, unknown dtype or op, bad rank */
    SUMO_ERR_INVALID_USAGE = 2,    /* a call that is valid alone but not now (comm broken...) */
    SUMO_ERR_MISMATCH = 3,         /* ranks passed different counts, dtypes, ops or roots */
    SUMO_ERR_TIMEOUT = 4,          /* a peer did not arrive before the communicator's deadline */
    SUMO_ERR_PEER_FAILURE = 5,     /* a peer failed, left, or timed out: the comm is unusable */
    SUMO_ERR_SYSTEM = 6,           /* out of memory, a thread or mapping could not be created */
    SUMO_ERR_INTERNAL = 7,         /* a bug in sumo or in the transport library below it */
    SUMO_IN_PROGRESS = 8,          /* an asynchronous request has not completed yet */
    SUMO_ERR_NONFINITE = 9,        /* NaN or Inf in a tensor that an adaptive method combines:
                                      that tensor's result is NaN, the others are exact, and
                                      sumo_comm_error_message() names the tensor */
    SUMO_RESULT_COUNT
} sumo_result;

/* A sentence describing r (never NULL, also for values out of range). */
SUMO_API const char *sumo_strerror(sumo_result r);
/* The enumerator's name, e.g. "SUMO_ERR_TIMEOUT" (never NULL). */
SUMO_API const char *sumo_result_name(sumo_result r);

typedef enum sumo_dtype {
    SUMO_FLOAT32 = 0,
    SUMO_FLOAT64 = 1,
    SUMO_FLOAT16 = 2,  /* IEEE binary16; reductions accumulate in fp32 */
    SUMO_BFLOAT16 = 3, /* bfloat16; reductions accumulate in fp32, round to nearest even */
    SUMO_DTYPE_COUNT
} sumo_dtype;

/* The library's version (a library loaded at run time may not be the one these headers
 * describe: compare with SUMO_VERSION_MAJOR and SUMO_VERSION_MINOR). Any pointer may be NULL. */
SUMO_API sumo_result sumo_version(int *major, int *minor, int *patch);

/* The instruction set sumo's host kernels dispatch to: "avx512", "avx2" or "portable", picked
 * at run time, the widest this CPU runs unless SUMO_KERNEL_ISA names another (Adasum's and
 * ACGA's sums follow the vector width, so runs are bit-identical between machines that agree
 * on it). SUMO_ERR_INVALID_ARGUMENT when SUMO_KERNEL_ISA is refused (a set this CPU lacks, or
 * no set: sumo_env_check gives the sentence); *name is then the set the kernels run. For
 * build reports (`python -m sumo`, `sumo train --summary`). */
SUMO_API sumo_result sumo_kernel_isa(const char **name);

/*
 * sizeof the public struct named `name` ("sumo_adasum_options", "sumo_aggregator_options",
 * ...) in this library, for bindings that mirror the structs by hand (ctypes) and must not
 * pass a layout the library reads differently. SUMO_ERR_INVALID_ARGUMENT for an unknown name.
 */
SUMO_API sumo_result sumo_struct_size(const char *name, size_t *bytes);

/*
 * The value of the public constant `name` ("SUMO_ERR_TIMEOUT", "SUMO_FLOAT16",
 * "SUMO_OP_AVERAGE", "SUMO_DILOCO_APPLY", ...) in this library, for the same bindings, which
 * restate the constants too: every enumerator of these headers but the *_COUNT bounds (and
 * sumo_cuda.h's), and the predefined ops. SUMO_ERR_INVALID_ARGUMENT for an unknown name.
 */
SUMO_API sumo_result sumo_enum_value(const char *name, int64_t *value);

/* Bytes per element of dtype, or SUMO_ERR_INVALID_ARGUMENT for an unknown dtype. */
SUMO_API sumo_result sumo_dtype_size(sumo_dtype dtype, size_t *size);
/* The dtype's short name as sumo's messages and reports write it: "fp32", "fp64", "fp16",
 * "bf16"; "unknown-dtype" for any other value (never NULL). */
SUMO_API const char *sumo_dtype_name(sumo_dtype dtype);

/*
 * A reduction. An integer handle, not an enum: the three predefined ops below, or an op created
 * on one communicator by sumo_op_create_adasum (values from SUMO_OP_PREDEFINED_COUNT up, valid
 * only on that communicator until sumo_op_destroy).
 *
 * SUMO_OP_ADASUM combines the whole buffer as ONE tensor: its dot products and norms span
 * every element. A buffer that packs several tensors (a model's layers) gives a different
 * result that way than Adasum per tensor, which is what Horovod and the papers compute. For
 * per-tensor Adasum create an op with the buffer's layout (sumo_op_create_adasum).
 *
 * What Adasum computes, for P ranks (the tree is part of the result: Adasum is not
 * associative). The combine of two vectors is
 *     A(a, b) = (1 - a.b / (2|a|^2)) a + (1 - a.b / (2|b|^2)) b,
 * with a coefficient of exactly 1 where its squared norm is below 2^-511 (sqrt of DBL_MIN), so
 * A(a, 0) = a and nothing divides by zero; dot products and norms accumulate in double. With
 * P2 the largest power of two <= P and R = P - P2, the first 2R ranks first combine in pairs
 * (A(g0, g1), A(g2, g3), ...), and then a balanced binary tree runs over the P2 results in
 * rank order, the lower rank always the left operand:
 *     P=3: A(A(g0,g1), g2)    P=4: A(A(g0,g1), A(g2,g3))    P=5: A(A(A(g0,g1), g2), A(g3,g4))
 *     P=6: A(A(A(g0,g1), A(g2,g3)), A(g4,g5))
 * Hierarchical ops apply the same tree to the averages of groups of consecutive ranks.
 */
typedef uint32_t sumo_op;
#define SUMO_OP_SUM ((sumo_op)0)
#define SUMO_OP_AVERAGE ((sumo_op)1) /* the sum in rank order, divided by the number of ranks */
#define SUMO_OP_ADASUM ((sumo_op)2)  /* adaptive summation, the whole buffer as one tensor */
#define SUMO_OP_PREDEFINED_COUNT 3u

typedef struct sumo_comm sumo_comm;
typedef struct sumo_request sumo_request;

/*
 * Adasum with options, as an op created on (and valid only for) one communicator, NCCL style.
 * Every rank must create the same ops in the same order with the same layout; an allreduce
 * with layouts that differ across ranks fails with SUMO_ERR_MISMATCH.
 */
typedef struct sumo_adasum_options {
    size_t struct_size;          /* sizeof(sumo_adasum_options): lets the struct grow */
    const size_t *tensor_counts; /* elements of each tensor packed in the buffer, in order;
                                    NULL with ntensors 0 means one tensor. Copied. */
    size_t ntensors;
    int hierarchical;            /* sum inside groups of ranks, Adasum across the groups'
                                    results, divide by the group size */
    int group_size;              /* ranks per group (consecutive ranks); 0 derives it: the MPI
                                    shared-memory node split, or all ranks for threads */
} sumo_adasum_options;

/* One tensor, flat: struct_size set, everything else 0. */
SUMO_API sumo_result sumo_adasum_options_default(sumo_adasum_options *options);

SUMO_API sumo_result sumo_op_create_adasum(sumo_comm *comm, const sumo_adasum_options *options,
                                  sumo_op *op);
SUMO_API sumo_result sumo_op_destroy(sumo_comm *comm, sumo_op op);

/*
 * The threads transport: nranks ranks inside this process, each to be driven by its own
 * thread (rank r by the thread that uses comms[r]), exchanging through shared memory. No
 * server, no launcher. nranks is 1 to SUMO_THREADS_MAX_RANKS (SUMO_ERR_INVALID_ARGUMENT
 * otherwise). Each of the nranks handles must be destroyed; the group is freed with the last
 * one. Destroying one rank's handle while others are still in a collective makes theirs fail
 * with SUMO_ERR_PEER_FAILURE.
 */
#define SUMO_THREADS_MAX_RANKS 1024
SUMO_API sumo_result sumo_comm_create_threads(int nranks, sumo_comm **comms);
/*
 * Frees the handle (always). Queued requests run first. Over MPI the ranks meet under the
 * deadline to free what they share; SUMO_ERR_TIMEOUT or SUMO_ERR_PEER_FAILURE says they could
 * not (a peer stopped, died or left): end the job with MPI_Abort then, not MPI_Finalize, which
 * would wait for that peer.
 */
SUMO_API sumo_result sumo_comm_destroy(sumo_comm *comm);

/*
 * The runner every threads user would otherwise write: creates a threads communicator of
 * nranks ranks, calls fn(comm_r, r, arg) on one new thread per rank, destroys each rank's
 * handle as soon as its fn returns (so peers still waiting on it fail at once instead of at
 * their deadline) and returns when every thread has ended. results (NULL, or nranks entries)
 * receives each rank's return. Returns SUMO_SUCCESS when every fn did, else the result of the
 * lowest failing rank; SUMO_ERR_SYSTEM when a thread could not be started (the ranks already
 * running then see that rank leave and fail with SUMO_ERR_PEER_FAILURE).
 */
typedef sumo_result (*sumo_rank_fn)(sumo_comm *comm, int rank, void *arg);
SUMO_API sumo_result sumo_threads_run(int nranks, sumo_rank_fn fn, void *arg, sumo_result *results);

/*
 * A two-level communicator: an ordinary sumo_comm over the ranks of `node` (the L ranks of
 * one node: threads, shm, MPI on one node) and `across` (the H ranks of this local rank on
 * every node: TCP, MPI, a caller's transport). Rank h * L + l of the new communicator is local
 * rank l (its rank in node) of node h (its rank in across). Every rank of the job calls it with
 * its own two communicators; every node has the same L (a rank whose node or across peers
 * disagree on L, H, their node or their local rank fails with SUMO_ERR_MISMATCH; peers beyond
 * its node then fail at their deadline).
 *
 * Its collectives run the two-level algorithms (docs/design/two-level.md): sum and average of
 * host memory take SUMO_ALGORITHM_CHAIN (the bits of a flat communicator's
 * SUMO_ALGORITHM_RANKED), of device memory SUMO_ALGORITHM_TWO_LEVEL (a reduce-scatter inside
 * the node, an allreduce across, an allgather inside: each level rounds); Adasum ops created
 * with hierarchical = 1 combine the nodes' averages (groups of L ranks); broadcast, allgather,
 * reduce-scatter and barrier go level by level. What has no two-level algorithm (ACGA's Gram
 * form, compressed allreduce, flat Adasum, sumo_mem_alloc) runs its flat algorithm over
 * options.any, a communicator of all H * L ranks in the same order (the flat TCP one), and is
 * refused with SUMO_ERR_INVALID_USAGE, on every rank alike, where there is none.
 * Requests, agreement, join, restore-on-failure (where the node's transport can restore),
 * stats and sumo_comm_abort are those of any communicator.
 *
 * Ownership: on SUCCESS the new communicator owns node, across and options.any (and every
 * communicator added with sumo_comm_hier_add_across): the caller must not call or destroy them;
 * sumo_comm_destroy of the new one destroys them. On failure they stay the caller's, untouched
 * but for the collectives the checks ran on them. sumo_comm_add_kernels on it adds the table to
 * every communicator it owns; sumo_comm_set_timeout passes down; SUMO_PARAM_ALGORITHM is its
 * own (the children keep theirs). sumo_comm_shrink refuses it: make the levels again.
 */
typedef struct sumo_hier_options {
    size_t struct_size; /* sizeof(sumo_hier_options) */
    /* Optional: a communicator of all H * L ranks, rank h * L + l on every rank, over which
     * what has no two-level algorithm runs. NULL: such calls are refused. */
    sumo_comm *any;
} sumo_hier_options;

/* struct_size set, any NULL. */
SUMO_API sumo_result sumo_hier_options_default(sumo_hier_options *options);
/* options may be NULL (the defaults). */
SUMO_API sumo_result sumo_comm_create_hier(sumo_comm *node, sumo_comm *across,
                                           const sumo_hier_options *options, sumo_comm **out);
/*
 * Collective over the two-level communicator's ranks: adds a further across communicator (H
 * ranks, this local rank's, in node order, like the first) whose transport carries a memory the
 * first does not (NCCL for "cuda"); a call whose buffers are in that memory crosses the nodes
 * over it. On SUCCESS comm owns it; on failure the caller keeps it and comm is unchanged. At
 * most 3 are added.
 */
SUMO_API sumo_result sumo_comm_hier_add_across(sumo_comm *comm, sumo_comm *across);

SUMO_API sumo_result sumo_comm_rank(const sumo_comm *comm, int *rank);
SUMO_API sumo_result sumo_comm_size(const sumo_comm *comm, int *size);
/* The transport's name: "threads", "mpi", "shm", or what a caller-supplied transport calls itself. */
SUMO_API sumo_result sumo_comm_transport(const sumo_comm *comm, const char **name);

/* Communication a component has made so far (an aggregator's, the outer loop's, the
 * distributed optimizer's): collective calls and payload bytes per rank. */
typedef struct sumo_comm_stats {
    uint64_t rounds;
    uint64_t bytes;
} sumo_comm_stats;

/*
 * The environment: every variable sumo reads is in one table (docs/settings.md, or `sumo
 * environment`), with what it accepts and its default. Every communicator reads SUMO_TIMEOUT
 * (the deadline in seconds, a number > 0 and <= 1e8; 300 when unset) and SUMO_DEBUG (NONE,
 * WARN or INFO, any case; NONE when unset) when it is created; the MPI and shm transports read
 * theirs as they start. A malformed or out-of-range value makes the call that reads it fail
 * with SUMO_ERR_INVALID_ARGUMENT, naming the variable: a constructor prints the sentence on
 * stderr (there is no handle yet to hold it). sumo_env_check checks every variable of the
 * table, with the first refusal's sentence in message (bytes long, may be NULL), for callers
 * that report errors their own way.
 */
SUMO_API sumo_result sumo_env_check(char *message, size_t bytes);

/*
 * One setting of that table by name ("SUMO_DEBUG"): in *value, the text that applies: the
 * environment's own (valid until the environment changes, as getenv's), a level as the table
 * spells it ("WARN"), or the default when unset or empty (NULL where there is none). A
 * malformed value, or a name not in the table, is SUMO_ERR_INVALID_ARGUMENT with *value NULL
 * (sumo_env_check gives the sentence). For plugins and bindings built on this header alone.
 */
SUMO_API sumo_result sumo_setting(const char *name, const char **value);

/*
 * The table itself, for listing it (`sumo environment`, docs/settings.md): entry index (0, 1,
 * ...; SUMO_ERR_INVALID_ARGUMENT past the last) as its name, what it accepts (a phrase written
 * into accepts, bytes long), its default (NULL where there is none) and what it does. Any
 * pointer may be NULL.
 */
SUMO_API sumo_result sumo_setting_describe(int index, const char **name, char *accepts,
                                           size_t bytes, const char **fallback, const char **doc);

/*
 * The deadline of every wait inside a collective on this handle, in seconds (> 0). A peer that
 * has not arrived by then makes the call return SUMO_ERR_TIMEOUT here and
 * SUMO_ERR_PEER_FAILURE on the peers that did arrive; the communicator is then broken and
 * every later call fails until it is destroyed. Default: the environment variable
 * SUMO_TIMEOUT (seconds) when set, else 300.
 */
SUMO_API sumo_result sumo_comm_set_timeout(sumo_comm *comm, double seconds);
SUMO_API sumo_result sumo_comm_get_timeout(const sumo_comm *comm, double *seconds);

/*
 * Settings of a communicator, zstd style: one setter for every parameter, each checked against
 * what this communicator's transport offers. Set them on every rank alike, between
 * collectives (ranks that use different algorithms still agree on each call; mixing them is
 * wasted work).
 */
typedef enum sumo_comm_param {
    /* Which sum/average allreduce algorithm to run (a sumo_algorithm). Default AUTO: shared
     * memory where every rank shares this node's memory, else RANKED, except up to 64 KiB the
     * peer library's allreduce for fp32/fp64 (MPI across nodes) and recursive doubling beyond
     * 16 ranks. The shared-memory and ranked algorithms sum in rank order, so under AUTO the
     * threads, shared-memory, MPI-on-one-node and caller-supplied transports give the same bits;
     * the ring, recursive doubling and the peer library sum in orders of their own. Setting one
     * this transport cannot run is SUMO_ERR_INVALID_USAGE. Adasum runs in shared memory under
     * AUTO and SHARED_MEMORY, and over point-to-point messages under every other choice. */
    SUMO_PARAM_ALGORITHM = 1,
    /* 1: a host-memory allreduce (every op), broadcast, allgather or reduce-scatter that fails
     * in a way that breaks the communicator (SUMO_ERR_PEER_FAILURE, SUMO_ERR_TIMEOUT) leaves
     * its receive buffer as it was before the call (sumo_elastic.h). The price: a copy of the
     * receive buffer per call. The threads and shm transports only (elsewhere
     * SUMO_ERR_INVALID_USAGE). Default 0. Local: ranks may differ. */
    SUMO_PARAM_RESTORE_ON_FAILURE = 2,
} sumo_comm_param;

typedef enum sumo_algorithm {
    SUMO_ALGORITHM_AUTO = 0,
    SUMO_ALGORITHM_SHARED_MEMORY = 1,      /* ranks read each other's slices (threads) or stage
                                              cache-sized chunks through a shared window (MPI) */
    SUMO_ALGORITHM_RING = 2,               /* reduce-scatter + allgather around a ring */
    SUMO_ALGORITHM_RECURSIVE_DOUBLING = 3, /* log2 P exchanges of the whole buffer */
    SUMO_ALGORITHM_PEER = 4,               /* the peer library's own allreduce (MPI_Allreduce),
                                              fp32 and fp64 only */
    SUMO_ALGORITHM_RANKED = 5,             /* each rank receives its segment of every rank's
                                              input (an all-to-all), sums it in rank order,
                                              then a ring allgather: a ring's bytes, the
                                              shared-memory algorithms' bits */
    SUMO_ALGORITHM_CHAIN = 6,              /* two-level communicators: the nodes' sums passed
                                              from node to node in the accumulation type,
                                              rounded once: SUMO_ALGORITHM_RANKED's bits */
    SUMO_ALGORITHM_TWO_LEVEL = 7,          /* two-level communicators: reduce-scatter inside
                                              the node, allreduce across, allgather inside */
    SUMO_ALGORITHM_COUNT
} sumo_algorithm;

SUMO_API sumo_result sumo_comm_set_param(sumo_comm *comm, sumo_comm_param param, int value);
SUMO_API sumo_result sumo_comm_get_param(const sumo_comm *comm, sumo_comm_param param, int *value);

/*
 * The detail of the last failure on this handle ("" when none). The string belongs to the
 * handle and stays valid until the next call on it from any thread.
 */
SUMO_API sumo_result sumo_comm_error_message(const sumo_comm *comm, const char **message);

/*
 * Collectives. Every rank of the communicator must make the same calls in the same order
 * with the same count, dtype, op (and root): sumo checks this on every call and returns
 * SUMO_ERR_MISMATCH on every rank when they differ, without touching any buffer. Buffers
 * may be NULL only when count is 0. Send and receive buffers must be the same pointer (in
 * place) or not overlap. NaN and Inf propagate as IEEE arithmetic says.
 *
 * Memory: scratch is kept in the handle between calls (the hot path does not allocate) and
 * freed by sumo_comm_destroy. Sum and average on ranks that share memory (threads; MPI
 * ranks of one node) need none beyond the MPI transport's fixed staging area. Their
 * point-to-point algorithms (MPI across nodes, or SUMO_MPI_SHM=0) keep, for large messages
 * (the ring), count/P elements of the accumulation type, two of them for fp16 and bf16
 * (partial sums travel in fp32); for small messages (recursive doubling, or when forced)
 * count elements of it, or two chunks of 64 Ki fp32 elements for fp16 and bf16. Adasum keeps
 * nothing of size count on threads; over MPI, in Gram form (fp32, fp16, bf16 up to 16 ranks,
 * see docs/design/adasum.md) the (P-1)/P of the buffer the other ranks send this one, else
 * (its tree) at most half the buffer flat and (g-1)/g of it hierarchical with groups of g
 * ranks. Either form also keeps P(P+1)/2 + P doubles per tensor of the op's layout.
 * Reduce-scatter keeps nothing on shared memory and two chunks of at most 256 Ki elements of
 * the accumulation type over point-to-point transports; with an Adasum op, size rows of
 * recvcount elements and the Adasum layout's doubles above. Scratch for data lives in the memory
 * of the call's buffers (its kernel table allocates it, once per memory); metadata in host
 * memory.
 */
SUMO_API sumo_result sumo_allreduce(const void *sendbuf, void *recvbuf, size_t count, sumo_dtype dtype,
                           sumo_op op, sumo_comm *comm);

/* recvbuf holds size * sendcount elements: rank r's contribution at r * sendcount. In place
 * when sendbuf == recvbuf + rank * sendcount * element size. */
SUMO_API sumo_result sumo_allgather(const void *sendbuf, void *recvbuf, size_t sendcount,
                           sumo_dtype dtype, sumo_comm *comm);

/* The root's sendbuf ends in every rank's recvbuf. sendbuf is read on the root only. */
SUMO_API sumo_result sumo_broadcast(const void *sendbuf, void *recvbuf, size_t count, sumo_dtype dtype,
                           int root, sumo_comm *comm);

/*
 * sendbuf holds size * recvcount elements; every rank ends with its own segment of the
 * reduction, rank r's the elements [r * recvcount, (r + 1) * recvcount) reduced over ranks.
 * In place when recvbuf == sendbuf + rank * recvcount elements (NCCL's rule).
 *
 * With an Adasum op (sharded training: FSDP2, ZeRO) the layout is FSDP2's: the op's tensor
 * counts are the tensors' padded sizes, each a multiple of size (pad with zeros), summing to
 * size * recvcount, and sendbuf viewed as (size, recvcount) holds in row r chunk r of every
 * tensor in order; rank r's output is row r of the per-tensor Adasum of the ranks' full
 * inputs (SUMO_OP_ADASUM: the whole buffer as one tensor). It is computed in Gram form
 * (docs/design/adasum.md): an all-to-all of rows (a ring reduce-scatter's bytes), each tensor's
 * Gram entries summed in one small exchange of size(size+1)/2 doubles per tensor, and the
 * same weights on every rank; fp64, and inputs that cancel, take the tree over the rows, as the
 * allreduce does. A shard's bits do not depend on the data path. That exchange grows as size^2
 * per tensor, so at most 16 ranks (SUMO_ERR_INVALID_USAGE beyond); flat ops
 * only, not on two-level communicators. A tensor count that is not a multiple of size, or
 * counts that miss size * recvcount: SUMO_ERR_INVALID_ARGUMENT naming them; layouts that
 * differ between ranks: SUMO_ERR_MISMATCH; NaN or Inf: SUMO_ERR_NONFINITE, as the allreduce.
 */
SUMO_API sumo_result sumo_reduce_scatter(const void *sendbuf, void *recvbuf, size_t recvcount,
                                         sumo_dtype dtype, sumo_op op, sumo_comm *comm);

SUMO_API sumo_result sumo_barrier(sumo_comm *comm);

/*
 * Joining, for ranks with uneven amounts of data (Horovod's hvd.join). A rank that has no more
 * data calls sumo_join, and takes part in the collectives its peers go on making until every
 * rank has called it: in each allreduce with SUMO_OP_SUM or SUMO_OP_AVERAGE (blocking or
 * asynchronous) it contributes zeros, so an average still divides by the communicator's size,
 * as with Horovod's joined ranks; in each barrier it takes its part. Any other collective a
 * peer makes while ranks have joined (broadcast, allgather, reduce-scatter, Adasum, a
 * compressed allreduce, sumo_mem_alloc, a layer's own) fails on every rank, the joined ones
 * included, with SUMO_ERR_INVALID_USAGE naming the joined ranks; no data moves and the
 * communicator stays usable. The zeros lie in the memory of the peers' buffers, made by its
 * kernel table (sumo_ext.h): a rank joins after adding the tables its peers use.
 *
 * Returns once every rank has called sumo_join, with *last_joined the rank that called it last
 * (of ranks that called it between the same two collectives, the highest), the same on every
 * rank. The ranks that have not joined pay nothing for it until one has: no collective takes
 * an extra message, and an allreduce that meets a joined rank one extra agreement. A joined
 * rank waits under the communicator's deadline like any collective (SUMO_TIMEOUT).
 */
SUMO_API sumo_result sumo_join(sumo_comm *comm, int *last_joined);

/*
 * The collectives this handle has run so far: rounds counts every call that reached the
 * collectives (sumo.h's and sumo_ext.h's, blocking or asynchronous, refused ones too, those
 * the layers above make through the handle, and each one sumo_join answered), bytes the size
 * of their receive buffers on this rank. Readable from any thread at any time.
 */
SUMO_API sumo_result sumo_comm_get_stats(const sumo_comm *comm, sumo_comm_stats *stats);

/*
 * Failing together. A rank that finds it cannot go on (a check of its own failed) while its
 * peers are heading into a collective calls sumo_comm_fail: its peers' next collective (or
 * the one they are entering) returns `code` at once, naming this rank and `message`, instead
 * of waiting out the deadline, and no data moves. The call itself takes part in that
 * agreement, so it returns once every rank has arrived (code on this rank). code is an error
 * other than SUMO_ERR_TIMEOUT and SUMO_ERR_PEER_FAILURE; the communicator stays usable.
 */
SUMO_API sumo_result sumo_comm_fail(sumo_comm *comm, sumo_result code, const char *message);

/*
 * Gives up: breaks the communicator and tells the peers now where the transport reaches them
 * (they fail with SUMO_ERR_PEER_FAILURE naming this rank; elsewhere at their deadline).
 * Every later call on the handle fails; destroy it. Returns at once; safe from any thread.
 */
SUMO_API sumo_result sumo_comm_abort(sumo_comm *comm, const char *message);

/*
 * Memory for the buffers of collectives that every rank of comm maps, like MPI_Alloc_mem /
 * MPI_Win_allocate_shared and ncclMemAlloc. Where the ranks are processes of one node (MPI),
 * a collective whose buffers all come from here, on every rank, reads and writes the peers'
 * buffers directly instead of copying through the staging areas: a sum then costs what it
 * costs between threads. An allreduce whose receive buffers alone come from here (on every
 * rank; out of place from private memory) uses them as its staging areas: each input is
 * copied in once and nothing is copied out, and Adasum streams its input once instead of
 * twice. Elsewhere it is plain memory and changes nothing.
 *
 * Both calls are collective: every rank calls them in the same order relative to the other
 * collectives on comm, each with its own size (> 0). sumo_mem_free takes what sumo_mem_alloc
 * gave on this rank, and every rank frees the allocation they made together; a rank freeing
 * another one than its peers gets SUMO_ERR_MISMATCH on all. A failed allocation fails on every
 * rank (SUMO_ERR_SYSTEM), leaves nothing allocated and the handle usable. Memory not freed is
 * released by sumo_comm_destroy. The memory is 4096-byte aligned and not zeroed.
 */
SUMO_API sumo_result sumo_mem_alloc(sumo_comm *comm, size_t bytes, void **ptr);
SUMO_API sumo_result sumo_mem_free(sumo_comm *comm, void *ptr);

/*
 * Asynchronous collectives: each returns at once with a request; the buffers must stay
 * untouched until sumo_request_wait() returns or sumo_request_test() reports completion.
 * Requests on one handle complete in the order they were started, and a blocking collective
 * on the handle waits for them first. Every request must be waited on (wait frees it), also
 * after test reported completion. Destroying the handle first completes its requests; they can
 * still be waited on afterwards (wait returns their result and frees them), from any thread.
 */
SUMO_API sumo_result sumo_allreduce_start(const void *sendbuf, void *recvbuf, size_t count,
                                          sumo_dtype dtype, sumo_op op, sumo_comm *comm,
                                          sumo_request **request);
SUMO_API sumo_result sumo_allgather_start(const void *sendbuf, void *recvbuf, size_t sendcount,
                                          sumo_dtype dtype, sumo_comm *comm,
                                          sumo_request **request);
SUMO_API sumo_result sumo_broadcast_start(const void *sendbuf, void *recvbuf, size_t count,
                                          sumo_dtype dtype, int root, sumo_comm *comm,
                                          sumo_request **request);
SUMO_API sumo_result sumo_reduce_scatter_start(const void *sendbuf, void *recvbuf,
                                               size_t recvcount, sumo_dtype dtype, sumo_op op,
                                               sumo_comm *comm, sumo_request **request);
/*
 * Compressed allreduce: fp32 in and out, low-bit on the wire (Streaming DiLoCo's outer
 * gradients). Each rank quantises its input; the owner of each 1/P of the blocks dequantises
 * every rank's share, adds them in fp32 in rank order (average: divided once by P) and
 * quantises the result again; an allgather of those payloads, dequantised, is the output:
 * the same bits on every rank, and the same inputs give the same bits on every run.
 *
 * Formats (docs/design/diloco.md gives every rounding rule):
 *   BF16      bfloat16, no scale; values beyond its largest finite one saturate to it;
 *   FP8_E4M3  OCP E4M3FN (bias 7, largest 448, no infinity), a scale per block;
 *   E3M0      4 bits: sign, 3 exponent bits (bias 3, field 0 is zero), no mantissa: the
 *             values 0, +-2^-2 .. +-2^4, a scale per block.
 * A block's scale is the smallest power of two 2^s with max|x| <= largest * 2^s (so nothing
 * saturates but what would overflow fp32); each element is x / 2^s rounded to the nearest
 * value of the format, a tie to the even code (E3M0: the even exponent field). An all-zero
 * block of a scaled format gives +0.
 *
 * NaN or Inf in any rank's input: SUMO_ERR_NONFINITE on every rank before any data moves
 * (recvbuf untouched); the message names the rank and element. A sum that overflows fp32
 * completes with NaN in that block on every rank and returns SUMO_ERR_NONFINITE, naming the
 * first element. Bytes on the wire per element: 2 (bf16), 1 + 4 / block (e4m3), 0.5 + 4 /
 * block (e3m0). The scratch (in the buffers' memory) holds two payloads (three over
 * point-to-point messages) and two fp32 slices of count / P.
 */
typedef enum sumo_compression_format {
    SUMO_COMPRESS_NONE = 0, /* no compression (where a caller may choose; refused here) */
    SUMO_COMPRESS_BF16 = 1,
    SUMO_COMPRESS_FP8_E4M3 = 2,
    SUMO_COMPRESS_E3M0 = 3,
    SUMO_COMPRESS_FORMAT_COUNT
} sumo_compression_format;

typedef struct sumo_compression {
    size_t struct_size;             /* sizeof(sumo_compression) */
    sumo_compression_format format;
    size_t block_size;              /* elements per scale: a multiple of 8 in [8, 65536] (also
                                       for bf16, where it only sets the unit of the split) */
    sumo_op op;                     /* SUMO_OP_SUM or SUMO_OP_AVERAGE */
} sumo_compression;

/* format with blocks of 128 elements (the Streaming DiLoCo preset's) and SUMO_OP_AVERAGE. */
SUMO_API sumo_result sumo_compression_default(sumo_compression_format format,
                                              sumo_compression *options);

SUMO_API sumo_result sumo_allreduce_compressed(const float *sendbuf, float *recvbuf, size_t count,
                                               const sumo_compression *options, sumo_comm *comm);
SUMO_API sumo_result sumo_allreduce_compressed_start(const float *sendbuf, float *recvbuf,
                                                     size_t count, const sumo_compression *options,
                                                     sumo_comm *comm, sumo_request **request);
/* Payload bytes of count elements in this compression (what one rank's input is on the wire). */
SUMO_API sumo_result sumo_compressed_bytes(const sumo_compression *options, size_t count,
                                           size_t *bytes);

/* *done = 1 once the request has completed (its result is then returned by wait). */
SUMO_API sumo_result sumo_request_test(sumo_request *request, int *done);
/* Waits for completion, returns the collective's result and frees the request. */
SUMO_API sumo_result sumo_request_wait(sumo_request *request);

#ifdef __cplusplus
}
#endif

#endif /* SUMO_H */
