/*
 * The communicator: a transport plus what the collectives keep between calls (its error
 * state, scratch memory, the kernel tables for the memories its buffers live in, the ops
 * created on it, the per-handle locks and the queue of asynchronous requests, which
 * collectives/requests.c runs).
 */
#ifndef SUMO_COMM_H
#define SUMO_COMM_H

#include "kernels/kernel_table.h"
#include "transport/transport.h"

#include <pthread.h>
#include <stdatomic.h>

/* Tables a handle holds besides the host's. */
#define SUMO__MAX_KERNEL_TABLES 4

/*
 * The queue of asynchronous requests and the lock that guards it. It outlives the handle
 * while requests not yet waited on point at it (refs counts the handle and each of them), so
 * a wait racing with sumo_comm_destroy never touches freed memory.
 */
/* Every request starts with this link, which the queue's list of spares threads through. */
typedef struct sumo__spare {
    struct sumo__spare *next;
} sumo__spare;

typedef struct sumo__queue {
    pthread_mutex_t lock;
    pthread_cond_t idle; /* a request completed */
    pthread_cond_t work; /* a request was queued, or the handle is stopping */
    int refs;
    sumo_comm *comm;     /* NULL once the handle is destroyed */
    sumo_request *head, *tail;
    int pending;         /* queued or running */
    sumo__spare *spare;  /* waited-on requests kept for reuse: start does not allocate */
    pthread_t progress;
    bool progress_started;
    bool stopping;
} sumo__queue;

/* The announcement every collective starts with (collectives/agree.h); declared here so the
 * communicator can keep the last agreed set. */
typedef struct sumo__call_desc sumo__call_desc;

/* What an op is: ops are dispatched by kind, whatever their number. */
typedef enum sumo__op_kind { SUMO__OP_SUM = 0, SUMO__OP_AVERAGE, SUMO__OP_ADASUM } sumo__op_kind;

typedef struct sumo__op_entry {
    sumo__op_kind kind;
    void *impl; /* the layer's own description (Adasum's layout); NULL for the predefined ops */
    void (*release)(void *impl);
} sumo__op_entry;

/* A sumo_mem_alloc allocation: the communicator keeps them all (newest first) and gives back
 * what is left when it is destroyed. */
typedef struct sumo__mem_block {
    struct sumo__mem_block *next;
    void *ptr;
    uint64_t serial; /* counts allocations alike on every rank */
} sumo__mem_block;

/* Data scratch of one memory, kept between calls. */
typedef struct sumo__data_scratch {
    const sumo_kernel_table *k;
    void *p;
    size_t bytes;
} sumo__data_scratch;

/* A two-level communicator's children (collectives/comm_hier.c), which it owns: the node's,
 * the across ones (across[0] moves host memory; one added per further memory), and the one of
 * all ranks, or NULL. Rank h * L + l is local rank l of node h. */
#define SUMO__MAX_ACROSS 4
typedef struct sumo__levels {
    sumo_comm *node, *across[SUMO__MAX_ACROSS], *any;
    int nacross;
    int L, l, H, h;
    size_t chunk_bytes; /* the chain's (SUMO_HIER_CHUNK_BYTES) */
    /* Runs a collective on a level through the one path (execute.c sets it before it hands a
     * call to a two-level algorithm: the algorithms sit below the path that picks them). */
    sumo_result (*run)(sumo_comm *level, const sumo_collective *call);
} sumo__levels;

struct sumo_comm {
    sumo__transport *tp;
    /* NULL on a flat communicator. */
    sumo__levels *levels;
    sumo__status status;
    /* Tables added with sumo_comm_add_kernels; host memory is every buffer none claims. */
    const sumo_kernel_table *tables[SUMO__MAX_KERNEL_TABLES];
    int ntables;
    /* The table and stream of the collective running now, for its data (sumo__execute sets
     * it; host metadata always goes through the host table). */
    sumo__exec x;
    /* Held while a collective runs. Order: the queue's lock, then exec (never the reverse). */
    pthread_mutex_t exec;
    sumo__queue *queue;
    sumo_algorithm algo;
    /* SUMO_PARAM_RESTORE_ON_FAILURE: a collective that breaks the communicator puts back what
     * its output held (execute.c), from undo, a copy taken before the call. */
    bool restore;
    void *undo;
    size_t undo_bytes;
    /* sumo_comm_abort: 0, 1 while its message is written, 2 once it can be read. */
    _Atomic int aborted;
    char abort_message[160];
    /* Every rank's announcement of the collective in progress (size entries), and how many
     * agreements the handle has made: the same count on every rank, since each is collective
     * (a joined rank's round, collectives/join.c). */
    sumo__call_desc *agreed;
    uint64_t announces;
    /* sumo_comm_get_stats: the collectives run on the handle and their output bytes, read
     * from any thread. */
    _Atomic uint64_t rounds, bytes;
    /* Scratch kept between calls so the hot path does not allocate: host metadata (pointer
     * arrays, per-tensor sums, Gram matrices), and data in the memory of the call's buffers. */
    void *scratch;
    size_t scratch_bytes;
    sumo__data_scratch data_scratch[SUMO__MAX_KERNEL_TABLES + 1];
    /* What sumo_mem_alloc gave, newest first; serials count allocations alike on every rank. */
    sumo__mem_block *mem_blocks;
    uint64_t mem_serial;
    /* Ops created on this handle: ops[id - SUMO_OP_PREDEFINED_COUNT]; NULL once destroyed, ids
     * are never reused. */
    sumo__op_entry **ops;
    size_t nops, ops_cap;
    /* Peers' allocations this rank's kernels reach through their table's open_shared
     * (collectives/imports.c, which sets release so that freeing the handle closes them), and
     * why this rank's own buffers of the last call could not be shared. */
    struct sumo__imports *imports;
    void (*imports_release)(struct sumo__imports *imports);
    char share_why[200];
};

/* Wraps a transport (taking ownership, and taking it back on failure) into a communicator. */
SUMO__PLUGIN_API sumo_result sumo__comm_wrap(sumo__transport *tp, sumo_comm **out);
/*
 * The body of a constructor whose processes meet through a store (sumo_comm_create_shm,
 * sumo_comm_create_tcp): the environment read, the options checked, the transport made and
 * wrapped. size_problem: SUMO__STRUCT_SIZE_PROBLEM's verdict on the options (no field of
 * options is read when it is not NULL, rank and size included); fields: why the options'
 * fields make no communicator, or NULL; make: the transport. The reason of a failure goes to
 * error (the options' buffer: NULL when the options are of another size) and, where the
 * environment asks for it or is itself malformed, to stderr, since no handle carries it.
 */
typedef struct sumo__store_constructor {
    const char *name; /* "sumo_comm_create_shm": what messages start with */
    const char *(*fields)(const void *options, char *why, size_t why_bytes);
    sumo_result (*make)(const void *options, const sumo__env *env, sumo__transport **tp,
                        char *err, size_t errlen);
} sumo__store_constructor;
/* The fields every such constructor's options share: why they make no group of size ranks
 * (max at most), or NULL; why holds a sentence about the store's size. */
struct sumo_store;
const char *sumo__store_fields_problem(const struct sumo_store *store, const char *key_prefix,
                                       int rank, int size, int max, const char *max_name,
                                       char *why, size_t why_bytes);
sumo_result sumo__comm_create_met(const sumo__store_constructor *how, const void *options,
                                  const char *size_problem, int rank, int size, char *error,
                                  size_t error_bytes, sumo_comm **out);
/* Frees what sumo__comm_wrap made, destroying the transport (the caller has stopped the
 * progress thread); returns the transport's verdict on leaving its peers. */
sumo_result sumo__comm_free(sumo_comm *comm);
/* Frees a queue (the caller dropped its last reference). */
void sumo__queue_free(sumo__queue *q);

/* Grows the handle's metadata scratch (host memory) to at least bytes. */
sumo_result sumo__comm_scratch(sumo_comm *comm, size_t bytes, void **out);
/* Grows the handle's data scratch in the memory of x's table to at least bytes. Independent
 * of the metadata scratch: a call may hold both. */
sumo_result sumo__comm_data_scratch(sumo_comm *comm, const sumo__exec *x, size_t bytes,
                                    void **out);

/* The table for [ptr, ptr + bytes): the first added table that claims it, else the host's. */
const sumo_kernel_table *sumo__kernels_for(const sumo_comm *comm, const void *ptr, size_t bytes);

/* The entry of op on this handle, or NULL when the handle does not know it. */
const sumo__op_entry *sumo__op_find(const sumo_comm *comm, sumo_op op);
/* Registers an op of kind (taking impl, released with release when the op is destroyed). */
sumo_result sumo__op_register(sumo_comm *comm, sumo__op_kind kind, void *impl,
                              void (*release)(void *impl), sumo_op *op);
/* Destroys a created op; the caller holds the handle (queued calls may still use it). */
sumo_result sumo__op_remove(sumo_comm *comm, sumo_op op);

/* Whether the shared-memory algorithms run on this handle: its ranks reach each other's memory
 * (their buffers, or staging areas) and its algorithm setting (SUMO_ALGORITHM_AUTO or
 * SHARED_MEMORY) allows them. */
static inline bool sumo__comm_shared_memory(const sumo_comm *c)
{
    return c->tp->reach != SUMO__REACH_NONE &&
           (c->algo == SUMO_ALGORITHM_AUTO || c->algo == SUMO_ALGORITHM_SHARED_MEMORY);
}

/* Whether they run direct: every rank's kernels read and write the peers' buffers where they
 * lie (ranks that share an address space), so no byte of data crosses the transport. */
static inline bool sumo__comm_direct(const sumo_comm *c)
{
    return c->tp->reach == SUMO__REACH_DIRECT && sumo__comm_shared_memory(c);
}

/* Whether this call's buffers (of the memory sumo__execute chose, c->x) are shared between the
 * processes of a staged transport by their kernel table (sumo_ext.h's share entries): the
 * direct algorithms then run on them, each rank's kernels on its peers' allocations opened
 * here (collectives/imports.h), the only way such memory moves (the staging areas are host
 * memory, and the transport does not carry it). */
static inline bool sumo__call_imports(const sumo_comm *c)
{
    const sumo__transport *tp = c->tp;
    const sumo_kernel_table *k = c->x.k;
    return tp->reach == SUMO__REACH_STAGED && sumo__comm_shared_memory(c) &&
           k != sumo__host_kernels() && sumo__kernels_share(k) && tp->ops->board != NULL &&
           !(tp->ops->carries && tp->ops->carries((sumo__transport *)tp, k->memory));
}

/* Whether this call runs the direct algorithms: ranks that share an address space, or buffers
 * shared between processes (sumo__call_imports; the agreement refuses the call where a rank
 * could not share them). */
static inline bool sumo__call_direct(const sumo_comm *c)
{
    return sumo__comm_direct(c) || sumo__call_imports(c);
}

/* Records a failure in the communicator's status (see sumo__transport_fail). */
#define SUMO__COMM_FAIL(comm, code, ...) SUMO__FAIL((comm)->tp, (code), __VA_ARGS__)

/* A kernel failed mid-collective: the peers go on without this rank, so the communicator is
 * broken (a failed kernel is never a verdict every rank shares). Returns code. */
sumo_result sumo__kernel_failed(sumo_comm *comm, sumo_result code, const char *what);
#define SUMO__KCHECK(comm, call)                                                   \
    do {                                                                           \
        sumo_result sumo__k_ = (call);                                             \
        if (sumo__k_ != SUMO_SUCCESS) return sumo__kernel_failed((comm), sumo__k_, #call); \
    } while (0)

/* Holds the handle for a blocking collective: waits for queued asynchronous requests. */
void sumo__comm_enter(sumo_comm *comm);
void sumo__comm_leave(sumo_comm *comm);

#endif
