/*
 * sumo's seams, for code that extends sumo from outside: a kernel table for buffers in another
 * memory (a GPU's), a transport whose operations the caller supplies (a torch.distributed
 * process group), and the one descriptor every collective is submitted as.
 *
 * EXPERIMENTAL: these declarations may change in any minor version (zstd's
 * ZSTD_STATIC_LINKING_ONLY in spirit). Define SUMO_EXPERIMENTAL_API before including this
 * header to say you accept that, and check sumo_version() at run time.
 *
 * docs/design/seams.md describes what a kernel table and a transport implement and in which
 * order sumo calls them.
 */
#ifndef SUMO_EXT_H
#define SUMO_EXT_H

#ifndef SUMO_EXPERIMENTAL_API
#error "sumo_ext.h is sumo's experimental API: #define SUMO_EXPERIMENTAL_API before including it"
#endif

#include "sumo.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- kernel tables --------------------------------------------------------------------- */

/*
 * Every touch of a collective's data goes through a kernel table: the one for the memory the
 * buffers live in. sumo always has the host table; a table added with sumo_comm_add_kernels
 * claims its own buffers (claims()), and a collective whose buffers it claims runs its kernels
 * on them, never a host loop.
 *
 * Conventions for every function below:
 *   - ctx is the table's ctx; exec is the execution context of the call that runs the kernel
 *     (the stream given with sumo_collective; NULL on the host);
 *   - each returns SUMO_SUCCESS or a failure, which breaks the communicator running it (the
 *     peers are told: they are mid-collective);
 *   - fp16 and bf16 are combined in fp32 and rounded once to nearest even; NaN and Inf pass
 *     through as IEEE arithmetic says;
 *   - results sumo reads on the host (dot products, Gram partials, a first non-finite index)
 *     are written to host memory and are complete when the function returns; everything else
 *     may complete later on exec, in order (synchronize waits for it);
 *   - "data" pointers are in this table's memory, except where a comment says host;
 *   - an output may be the same pointer as an input (each element read before written);
 *     partial overlaps are the caller's bug.
 * Layout-aware functions take a tensor layout (offsets: ntensors + 1 prefix sums of element
 * counts) and a range [lo, hi) of elements: the pointers they get point at element lo, and
 * per-tensor results are indexed by tensor. One call covers every tensor piece in the range,
 * so a device runs one launch for a whole layout.
 */
/* One outer step of DiLoCo (sumo_diloco.h) as its kernel sees it, per element, in double
 * from the stored values, each store rounded once:
 *   d  = from_average ? x0 - c : c          the averaged model change (the outer gradient);
 *   nesterov:   v' = mu v + d;        g = x0 - lr (d + mu v')     (torch's Nesterov SGD);
 *   heavy ball: v' = mu v + d / gamma; g = x0 - lr v'             (SlowMo: lr = alpha gamma);
 * g is formed from the unrounded v', and is NaN where the stored v' is not finite; then
 * v = v', x0 = g, and the local parameters x become g when merge is 0, else
 * merge x + (1 - merge) g (with the stored g). */
typedef struct sumo_outer_step {
    int nesterov;
    int from_average;
    double lr, mu, gamma, merge;
} sumo_outer_step;

typedef struct sumo_kernel_table {
    size_t struct_size; /* sizeof(sumo_kernel_table) */
    const char *memory; /* "host", "cuda", ...: named in messages and compared across ranks */
    void *ctx;
    /* Whether [ptr, ptr + bytes) lies in this memory. (The host table claims what no other
     * table does.) */
    bool (*claims)(void *ctx, const void *ptr, size_t bytes);
    /* Scratch for data in this memory, 64-byte aligned; release takes what alloc gave. */
    sumo_result (*alloc)(void *ctx, size_t bytes, void **ptr);
    void (*release)(void *ctx, void *ptr);
    /* Waits for everything queued on exec. */
    sumo_result (*synchronize)(void *ctx, void *exec);

    /* dst = src, bytes bytes; either side may be host memory (the staging areas of processes
     * on one node are), the other this table's. */
    sumo_result (*copy)(void *ctx, void *exec, void *dst, const void *src, size_t bytes);
    /* dst[i] = value (rounded once to dtype). */
    sumo_result (*fill)(void *ctx, void *exec, sumo_dtype dtype, void *dst, double value,
                        size_t n);
    /* *first (host) = the index of the first NaN or Inf in src[0, n), or SIZE_MAX. */
    sumo_result (*first_nonfinite)(void *ctx, void *exec, sumo_dtype dtype, const void *src,
                                   size_t n, size_t *first);
    /* outs[k][i] = (ins[0][i] + .. + ins[nin-1][i]) / divisor for every k < nout: summed left
     * to right (fp32 accumulator for fp16/bf16), divided once unless divisor is 1. */
    sumo_result (*reduce)(void *ctx, void *exec, sumo_dtype dtype, void *const *outs, int nout,
                          const void *const *ins, int nin, size_t n, int divisor);
    /* dst = src converted between dtypes (nearest even when narrowing). */
    sumo_result (*convert)(void *ctx, void *exec, sumo_dtype dst_dtype, void *dst,
                           sumo_dtype src_dtype, const void *src, size_t n);
    /* out (host, 3 doubles) = a.b, |a|^2, |b|^2, accumulated in double. */
    sumo_result (*dot_norms)(void *ctx, void *exec, sumo_dtype dtype, const void *a,
                             const void *b, size_t n, double *out);
    /* a = ca a + cb b: fp32/fp64 in double, rounded once; fp16/bf16 fmaf(ca, a, cb b). */
    sumo_result (*scaled_add)(void *ctx, void *exec, sumo_dtype dtype, void *a, double ca,
                              const void *b, double cb, size_t n);
    /* Layout-aware. gram (host) += each tensor's packed upper-triangular Gram matrix of the
     * nin inputs over its piece of [lo, hi): nin(nin+1)/2 doubles per tensor, row by row,
     * accumulated in double in an order that depends only on the piece's length and nin. */
    sumo_result (*gram_partials)(void *ctx, void *exec, sumo_dtype dtype, const void *const *ins,
                                 int nin, const size_t *offsets, size_t ntensors, size_t lo,
                                 size_t hi, double *gram);
    /* Layout-aware. outs[k][i] = w[t nin + 0] ins[0][i] + .. + w[t nin + nin-1] ins[nin-1][i]
     * for element i of tensor t, with fused multiply-adds in that order, rounded once; w is
     * host memory. */
    sumo_result (*weighted_sum)(void *ctx, void *exec, sumo_dtype dtype, void *const *outs,
                                int nout, const void *const *ins, int nin,
                                const size_t *offsets, size_t ntensors, size_t lo, size_t hi,
                                const double *w);
    /* The optimizers' own touches. delta = now - start (each rounded once to dtype). */
    sumo_result (*delta)(void *ctx, void *exec, sumo_dtype dtype, void *delta, const void *now,
                         const void *start, size_t n);
    /* params = start + delta, rounded once; *first (host) = first non-finite result or
     * SIZE_MAX. */
    sumo_result (*apply_delta)(void *ctx, void *exec, sumo_dtype dtype, void *params,
                               const void *start, const void *delta, size_t n, size_t *first);
    /* The compressed allreduce's codec (sumo.h's sumo_compression; docs/design/diloco.md
     * gives the rounding). quantize: fp32 src[0, n) as ceil(n / block) blocks of payload at
     * dst (sumo_compressed_bytes of n), each block its scale then its codes (a short last
     * block padded with zero codes); a block that holds NaN or Inf gets a NaN scale and zero
     * codes, and *first (host) is the index of the first such element, else SIZE_MAX.
     * dequantize: n elements of payload back to fp32 (a NaN scale gives NaN, a zero scale +0). */
    sumo_result (*quantize)(void *ctx, void *exec, sumo_compression_format format, size_t block,
                            void *dst, const float *src, size_t n, size_t *first);
    sumo_result (*dequantize)(void *ctx, void *exec, sumo_compression_format format,
                              size_t block, float *dst, const void *src, size_t n);
    /* DiLoCo's outer step (sumo_outer_step above; step is host memory), fp32 and fp64: x the
     * local parameters, c the combined buffer (may be x), v the outer momentum, x0 the anchor. */
    sumo_result (*outer_update)(void *ctx, void *exec, sumo_dtype dtype, void *x, const void *c,
                                void *v, void *x0, size_t n, const sumo_outer_step *step);

    /* Optional, all three or none (a table of an older sumo ends before them: struct_size
     * says so, and sumo reads none of them). Memory shared between processes, so that ranks
     * in separate processes of one node (the shm transport) run the direct algorithms on
     * buffers of this memory: each rank's kernels read and write its peers' buffers where they
     * lie, as ranks that share an address space do, instead of moving them through host
     * memory. Without them such buffers are refused on a transport that does not carry them.
     *
     * share: a handle for the allocation that holds [ptr, ptr + bytes), at most
     * SUMO_SHARE_HANDLE_BYTES in *handle_bytes, and ptr's *offset in it; equal handles name
     * one allocation, and a handle stays valid while the allocation lives. It is called
     * before every collective on such a handle, so it should be cheap once an allocation was
     * shared (cache what the export costs). A failure (memory that cannot be exported) is no
     * error of the communicator's: the call is refused on every rank, with the reason, which
     * the table gives through message (bytes long, may be 0), ending in what to do.
     * open_shared: a peer's allocation mapped here, in *base (another process's handle; the
     * same handle may come from several communicators at once, so a table whose memory
     * allows one mapping per handle keeps a count). close_shared takes what open_shared gave,
     * once per open; the peer's memory lives on while any process maps it. */
    sumo_result (*share)(void *ctx, const void *ptr, size_t bytes, void *handle,
                         size_t *handle_bytes, size_t *offset, char *message,
                         size_t message_bytes);
    sumo_result (*open_shared)(void *ctx, const void *handle, size_t handle_bytes, void **base);
    sumo_result (*close_shared)(void *ctx, void *base);
} sumo_kernel_table;

/* The largest handle a kernel table's share gives (CUDA's IPC handle is 64 bytes). */
#define SUMO_SHARE_HANDLE_BYTES 128

/* The host table (what sumo uses for host memory), e.g. to fall back on in a table's
 * functions or to compare against in tests. */
SUMO_API sumo_result sumo_host_kernels(const sumo_kernel_table **table);

/*
 * Adds a table to the handle: collectives whose buffers it claims use it from then on. The
 * table is borrowed and must outlive the handle. Every rank of a collective must pass buffers
 * of the same memory (compared by name: SUMO_ERR_MISMATCH otherwise); a call whose buffers
 * lie in two memories is SUMO_ERR_INVALID_ARGUMENT. Call between collectives.
 */
SUMO_API sumo_result sumo_comm_add_kernels(sumo_comm *comm, const sumo_kernel_table *table);

/* ---- the collective descriptor -------------------------------------------------------- */

typedef enum sumo_collective_kind {
    SUMO_COLLECTIVE_ALLREDUCE = 1,
    SUMO_COLLECTIVE_BROADCAST = 2,
    SUMO_COLLECTIVE_ALLGATHER = 3,
    SUMO_COLLECTIVE_REDUCE_SCATTER = 4,
    SUMO_COLLECTIVE_BARRIER = 5,
} sumo_collective_kind;

/* Every collective of sumo.h, as one struct: sumo_allreduce(s, r, n, t, op, comm) is
 * sumo_collective_run(comm, &(sumo_collective){.kind = ALLREDUCE, ...}). `stream` is the
 * execution context handed to the kernels (NULL on the host). count is what the sumo.h call
 * names count, sendcount (allgather) or recvcount (reduce-scatter). */
typedef struct sumo_collective {
    size_t struct_size; /* sizeof(sumo_collective) */
    sumo_collective_kind kind;
    const void *sendbuf;
    void *recvbuf;
    size_t count;
    sumo_dtype dtype;
    sumo_op op;   /* allreduce, reduce-scatter */
    int root;     /* broadcast */
    void *stream;
} sumo_collective;

SUMO_API sumo_result sumo_collective_run(sumo_comm *comm, const sumo_collective *collective);
SUMO_API sumo_result sumo_collective_start(sumo_comm *comm, const sumo_collective *collective,
                                           sumo_request **request);

/* ---- transports the caller supplies ----------------------------------------------------- */

/*
 * The operations of a transport implemented outside sumo (over a torch.distributed process
 * group, a fabric library, ...). sumo's collectives run over them unchanged: point-to-point
 * algorithms (ring, recursive doubling, Adasum's Gram form in one all-to-all and one ring
 * allgather). Every operation gets an absolute deadline (CLOCK_MONOTONIC nanoseconds, as
 * clock_gettime reports) and returns SUMO_ERR_TIMEOUT when it passes, SUMO_ERR_PEER_FAILURE
 * when a peer is known gone, or another error; error_message then gives the detail (it may
 * return NULL). Calls on one communicator never overlap in time.
 */
typedef struct sumo_transport_ops {
    size_t struct_size; /* sizeof(sumo_transport_ops) */
    const char *name;   /* sumo_comm_transport() reports it */
    /* Sends sbytes of sbuf to rank dst and receives rbytes into rbuf from rank src, both at
     * once (a ring must not deadlock); dst or src -1 skips that side. Messages between two
     * ranks arrive in the order sent; a received message of another length than rbytes is an
     * error. The buffers are host memory, or a memory `carries` accepts. */
    sumo_result (*sendrecv)(void *ctx, const void *sbuf, size_t sbytes, int dst, void *rbuf,
                            size_t rbytes, int src, int64_t deadline_ns);
    /* all[r * bytes, (r + 1) * bytes) = rank r's record, for every rank (bytes <= 64); returns
     * once every rank has contributed. */
    sumo_result (*allgather)(void *ctx, const void *record, void *all, size_t bytes,
                             int64_t deadline_ns);
    sumo_result (*barrier)(void *ctx, int64_t deadline_ns);
    /* Optional: tell the peers at once that this rank failed (they fail then, not at their
     * deadline). Called from any thread, also while another operation runs. */
    void (*abort)(void *ctx);
    /* Leave the group; must not wait for peers that are gone. */
    sumo_result (*destroy)(void *ctx);
    /* Optional: the detail of the last failure (valid until the next call). */
    const char *(*error_message)(void *ctx);
    /* Optional: whether sendrecv moves buffers of the named kernel memory ("cuda"); host
     * memory is always moved. */
    bool (*carries)(void *ctx, const char *memory);
} sumo_transport_ops;

typedef struct sumo_transport_desc {
    size_t struct_size; /* sizeof(sumo_transport_desc) */
    int rank;
    int size;
    /* Ranks per node when nodes hold equal blocks of consecutive ranks, else 0 (hierarchical
     * Adasum's default group). */
    int node_local_size;
    const sumo_transport_ops *ops; /* borrowed: must outlive the handle */
    void *ctx;
} sumo_transport_desc;

/* A communicator over the caller's transport. Not collective by itself (the caller's group
 * is already formed); the first collective meets the peers. */
SUMO_API sumo_result sumo_comm_create_transport(const sumo_transport_desc *desc,
                                                sumo_comm **out);

#ifdef __cplusplus
}
#endif

#endif /* SUMO_EXT_H */
