/*
 * A sumo transport (sumo_ext.h's sumo_transport_ops) over an NCCL communicator.
 *
 *   sendrecv   ncclSend and ncclRecv of bytes in one group on the transport's stream (both
 *              directions at once, as a ring needs); host buffers go through a device staging
 *              area (NCCL moves device memory);
 *   allgather  the small host records through the staging area, one ncclAllGather;
 *   barrier    a one-byte ncclAllReduce;
 *   every wait polls the stream and ncclCommGetAsyncError against sumo's deadline; a failure
 *   or a passed deadline aborts the communicator (ncclCommAbort), NCCL's way out of a hang.
 *
 * NCCL does not carry a message's length: sumo's algorithms send what the peer expects, and
 * a mismatch would be their bug, not detected here.
 *
 * Operations on one communicator never overlap (sumo's contract), but abort() comes from any
 * thread: an operation holds `lock` for its duration; abort() raises a flag the running
 * operation's wait acts on, or, when none runs, aborts at once.
 */
#define _GNU_SOURCE 1
#include "cuda_internal.h"
#include "device_cuda.h"
#include "nccl_api.h"

#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- loading NCCL ------------------------------------------------------------------------- */

static int cu_stream_query(void *s) { return (int)cudaStreamQuery((cudaStream_t)s); }
static int cu_stream_create(void **s)
{
    return (int)cudaStreamCreateWithFlags((cudaStream_t *)s, cudaStreamNonBlocking);
}
static int cu_stream_destroy(void *s) { return (int)cudaStreamDestroy((cudaStream_t)s); }
static int cu_device_alloc(void **p, size_t bytes) { return (int)cudaMalloc(p, bytes); }
static int cu_device_free(void *p) { return (int)cudaFree(p); }
static int cu_host_alloc(void **p, size_t bytes) { return (int)cudaMallocHost(p, bytes); }
static int cu_host_free(void *p) { return (int)cudaFreeHost(p); }
static int cu_copy_async(void *dst, const void *src, size_t bytes, void *s)
{
    return (int)cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, (cudaStream_t)s);
}
static bool cu_is_device(const void *p)
{
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}
static int cu_get_device(int *d) { return (int)cudaGetDevice(d); }
static int cu_set_device(int d) { return (int)cudaSetDevice(d); }
static const char *cu_error_string(int e) { return cudaGetErrorString((cudaError_t)e); }

static void *sym(void *lib, const char *name)
{
    return lib ? dlsym(lib, name) : dlsym(RTLD_DEFAULT, name);
}

sumo_result sumo_cuda__nccl_load(sumo_cuda__nccl_api *api, char *why, size_t bytes)
{
    memset(api, 0, sizeof *api);
    void *lib = NULL;
    const char *path;
    sumo_setting("SUMO_NCCL_LIBRARY", &path); /* NULL when unset */
    /* An NCCL the process has loaded already comes first: a communicator must be driven by
     * the library that made it. */
    if (dlsym(RTLD_DEFAULT, "ncclCommUserRank") == NULL) {
        /* Never unmapped: ncclGetUniqueId leaves a thread of NCCL's running (the bootstrap
         * root), which must outlive our handle. */
        lib = dlopen(path && *path ? path : "libnccl.so.2", RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
        if (lib == NULL) {
            snprintf(why, bytes, "NCCL could not be loaded (%s): %s",
                     path && *path ? path : "libnccl.so.2; SUMO_NCCL_LIBRARY names another",
                     dlerror());
            return SUMO_ERR_INVALID_USAGE;
        }
    }
    /* Each pointer is converted from dlsym's void * through uintptr_t: POSIX guarantees the
     * round trip for function addresses. */
#define LOAD(field, name)                                                                     \
    do {                                                                                      \
        void *f_ = sym(lib, name);                                                            \
        if (f_ == NULL) {                                                                     \
            snprintf(why, bytes, "NCCL has no %s (version too old?)", name);                  \
            if (lib) dlclose(lib);                                                            \
            memset(api, 0, sizeof *api);                                                      \
            return SUMO_ERR_INVALID_USAGE;                                                    \
        }                                                                                     \
        memcpy(&api->field, &f_, sizeof f_);                                                  \
    } while (0)
    LOAD(get_version, "ncclGetVersion");
    LOAD(get_error_string, "ncclGetErrorString");
    LOAD(comm_count, "ncclCommCount");
    LOAD(comm_user_rank, "ncclCommUserRank");
    LOAD(comm_cu_device, "ncclCommCuDevice");
    LOAD(comm_get_async_error, "ncclCommGetAsyncError");
    LOAD(comm_abort, "ncclCommAbort");
    LOAD(comm_destroy, "ncclCommDestroy");
    LOAD(group_start, "ncclGroupStart");
    LOAD(group_end, "ncclGroupEnd");
    LOAD(send, "ncclSend");
    LOAD(recv, "ncclRecv");
    LOAD(all_gather, "ncclAllGather");
    LOAD(all_reduce, "ncclAllReduce");
    LOAD(get_unique_id, "ncclGetUniqueId");
    LOAD(comm_init_rank, "ncclCommInitRank");
#undef LOAD
    void *last = sym(lib, "ncclGetLastError");
    if (last) memcpy(&api->get_last_error, &last, sizeof last);
    api->stream_query = cu_stream_query;
    api->stream_create = cu_stream_create;
    api->stream_destroy = cu_stream_destroy;
    api->device_alloc = cu_device_alloc;
    api->device_free = cu_device_free;
    api->host_alloc = cu_host_alloc;
    api->host_free = cu_host_free;
    api->copy_async = cu_copy_async;
    api->is_device = cu_is_device;
    api->get_device = cu_get_device;
    api->set_device = cu_set_device;
    api->cuda_error_string = cu_error_string;
    api->library = lib;
    int version = 0;
    if (api->get_version(&version) != SUMO_NCCL_SUCCESS || version < 21900) {
        snprintf(why, bytes, "NCCL %d is older than 2.19, the oldest this transport was written for",
                 version);
        sumo_cuda__nccl_unload(api);
        return SUMO_ERR_INVALID_USAGE;
    }
    return SUMO_SUCCESS;
}

void sumo_cuda__nccl_unload(sumo_cuda__nccl_api *api)
{
    if (api->library) dlclose(api->library);
    memset(api, 0, sizeof *api);
}

/* ---- the transport -------------------------------------------------------------------------- */

typedef struct nccl_tp {
    sumo_cuda__nccl_api api;
    void *comm;
    void *stream;
    bool own_stream;
    int device, rank, size;
    /* false until sumo_comm_create_transport succeeded: destroy then leaves comm and this
     * struct to the creator, who still owns them */
    bool owned;
    pthread_mutex_t lock;
    atomic_bool abort_requested;
    bool aborted; /* ncclCommAbort ran: comm is gone */
    bool failed;  /* an operation failed: destroy aborts rather than waits */
    unsigned char *dev_stage, *host_stage; /* device and pinned host staging, stage_bytes each */
    size_t stage_bytes;
    char error[256];
} nccl_tp;

static void abort_now(nccl_tp *t)
{
    if (!t->aborted) {
        (void)t->api.comm_abort(t->comm);
        t->aborted = true;
    }
}

static const char *nccl_text(const nccl_tp *t, int r)
{
    const char *last = t->api.get_last_error && !t->aborted ? t->api.get_last_error(t->comm) : NULL;
    return last && *last ? last : t->api.get_error_string(r);
}

/* A failure: the detail recorded, the communicator aborted (its operations may be stuck on the
 * stream, and peers may wait for this rank). */
static sumo_result fail(nccl_tp *t, sumo_result code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static sumo_result fail(nccl_tp *t, sumo_result code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->error, sizeof t->error, fmt, ap);
    va_end(ap);
    t->failed = true;
    abort_now(t);
    return code;
}

static sumo_result nccl_code(int r)
{
    switch (r) {
    case SUMO_NCCL_REMOTE_ERROR:
    case SUMO_NCCL_SYSTEM_ERROR: return SUMO_ERR_PEER_FAILURE;
    case SUMO_NCCL_UNHANDLED_CUDA_ERROR: return SUMO_ERR_SYSTEM;
    default: return SUMO_ERR_INTERNAL;
    }
}

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Spins briefly (collectives of small messages finish in microseconds), then sleeps in short
 * steps so a long wait does not hold a core. */
static void backoff(int round)
{
    if (round < 200) {
        sched_yield();
        return;
    }
    struct timespec ts = {0, 20000};
    nanosleep(&ts, NULL);
}

/* Checks that apply on every round of a wait: an NCCL error, an abort asked for, the deadline. */
static sumo_result poll_checks(nccl_tp *t, int64_t deadline_ns, const char *what, bool *pending)
{
    int async = SUMO_NCCL_SUCCESS;
    int r = t->api.comm_get_async_error(t->comm, &async);
    if (r != SUMO_NCCL_SUCCESS) async = r;
    *pending = async == SUMO_NCCL_IN_PROGRESS;
    if (async != SUMO_NCCL_SUCCESS && async != SUMO_NCCL_IN_PROGRESS)
        return fail(t, nccl_code(async), "%s: NCCL reports %s", what, nccl_text(t, async));
    if (atomic_load(&t->abort_requested))
        return fail(t, SUMO_ERR_PEER_FAILURE, "%s: aborted (sumo_comm_abort, or another rank's "
                                              "failure)", what);
    if (now_ns() >= deadline_ns)
        return fail(t, SUMO_ERR_TIMEOUT, "%s: not complete at the deadline (a peer is missing, "
                                         "or NCCL is stuck); the NCCL communicator was aborted",
                    what);
    return SUMO_SUCCESS;
}

/* A non-blocking communicator's call returns ncclInProgress until NCCL has taken it in. */
static sumo_result settled(nccl_tp *t, int r, int64_t deadline_ns, const char *what)
{
    if (r == SUMO_NCCL_SUCCESS) return SUMO_SUCCESS;
    if (r != SUMO_NCCL_IN_PROGRESS)
        return fail(t, nccl_code(r), "%s: %s", what, nccl_text(t, r));
    for (int round = 0;; round++) {
        bool pending;
        SUMO_CUDA__CHECK_RESULT(poll_checks(t, deadline_ns, what, &pending));
        if (!pending) return SUMO_SUCCESS;
        backoff(round);
    }
}

/* Until the stream has run everything queued on it. */
static sumo_result drained(nccl_tp *t, int64_t deadline_ns, const char *what)
{
    for (int round = 0;; round++) {
        int e = t->api.stream_query(t->stream);
        if (e == SUMO_CUDA_SUCCESS) return SUMO_SUCCESS;
        if (e != SUMO_CUDA_NOT_READY)
            return fail(t, SUMO_ERR_SYSTEM, "%s: the stream failed: %s", what,
                        t->api.cuda_error_string(e));
        bool pending;
        SUMO_CUDA__CHECK_RESULT(poll_checks(t, deadline_ns, what, &pending));
        backoff(round);
    }
}

static sumo_result cuda_step(nccl_tp *t, int e, const char *what)
{
    if (e == SUMO_CUDA_SUCCESS) return SUMO_SUCCESS;
    return fail(t, e == 2 /* cudaErrorMemoryAllocation */ ? SUMO_ERR_SYSTEM : SUMO_ERR_INTERNAL,
                "%s: %s", what, t->api.cuda_error_string(e));
}

/* Staging of at least `bytes` on the device and in pinned host memory. */
static sumo_result stage_reserve(nccl_tp *t, size_t bytes)
{
    if (bytes <= t->stage_bytes) return SUMO_SUCCESS;
    size_t want = t->stage_bytes ? t->stage_bytes : 4096;
    while (want < bytes) want *= 2;
    if (t->dev_stage) (void)t->api.device_free(t->dev_stage);
    if (t->host_stage) (void)t->api.host_free(t->host_stage);
    t->dev_stage = t->host_stage = NULL;
    t->stage_bytes = 0;
    SUMO_CUDA__CHECK_RESULT(cuda_step(t, t->api.device_alloc((void **)&t->dev_stage, want), "cudaMalloc (staging)"));
    SUMO_CUDA__CHECK_RESULT(cuda_step(t, t->api.host_alloc((void **)&t->host_stage, want), "cudaMallocHost (staging)"));
    t->stage_bytes = want;
    return SUMO_SUCCESS;
}

/* Every operation: one at a time, on the communicator's device, refused once aborted. */
static sumo_result op_begin(nccl_tp *t, int *previous)
{
    pthread_mutex_lock(&t->lock);
    if (t->aborted) {
        pthread_mutex_unlock(&t->lock);
        return SUMO_ERR_PEER_FAILURE;
    }
    if (atomic_load(&t->abort_requested)) {
        sumo_result r = fail(t, SUMO_ERR_PEER_FAILURE, "aborted before the operation");
        pthread_mutex_unlock(&t->lock);
        return r;
    }
    *previous = t->device;
    if (t->api.get_device(previous) == SUMO_CUDA_SUCCESS && *previous != t->device)
        (void)t->api.set_device(t->device);
    return SUMO_SUCCESS;
}

static sumo_result op_end(nccl_tp *t, int previous, sumo_result r)
{
    if (previous != t->device) (void)t->api.set_device(previous);
    pthread_mutex_unlock(&t->lock);
    return r;
}

static sumo_result sendrecv_body(nccl_tp *t, const void *sbuf, size_t sbytes, int dst,
                                 void *rbuf, size_t rbytes, int src, int64_t deadline_ns)
{
    /* Zero bytes: the peer's matching side has zero bytes too (sumo's algorithms are
     * symmetric), so both skip. */
    bool sending = dst >= 0 && sbytes > 0, receiving = src >= 0 && rbytes > 0;
    if (!sending && !receiving) return SUMO_SUCCESS;
    bool stage_send = sending && !t->api.is_device(sbuf);
    bool stage_recv = receiving && !t->api.is_device(rbuf);
    size_t send_at = 0, recv_at = stage_send ? (sbytes + 255) / 256 * 256 : 0;
    if (stage_send || stage_recv)
        SUMO_CUDA__CHECK_RESULT(stage_reserve(t, recv_at + (stage_recv ? rbytes : 0)));
    const void *s = sbuf;
    void *r = rbuf;
    if (stage_send) {
        memcpy(t->host_stage + send_at, sbuf, sbytes);
        SUMO_CUDA__CHECK_RESULT(cuda_step(
            t, t->api.copy_async(t->dev_stage + send_at, t->host_stage + send_at, sbytes, t->stream),
            "staging copy in"));
        s = t->dev_stage + send_at;
    }
    if (stage_recv) r = t->dev_stage + recv_at;
    int e = t->api.group_start();
    if (e == SUMO_NCCL_SUCCESS && sending)
        e = t->api.send(s, sbytes, SUMO_NCCL_UINT8, dst, t->comm, t->stream);
    if (e == SUMO_NCCL_SUCCESS && receiving)
        e = t->api.recv(r, rbytes, SUMO_NCCL_UINT8, src, t->comm, t->stream);
    /* The group is ended even after a failed call, so NCCL's group state stays balanced. */
    int e_end = t->api.group_end();
    if (e == SUMO_NCCL_SUCCESS) e = e_end;
    SUMO_CUDA__CHECK_RESULT(settled(t, e, deadline_ns, "ncclSend/ncclRecv"));
    if (stage_recv)
        SUMO_CUDA__CHECK_RESULT(cuda_step(
            t, t->api.copy_async(t->host_stage + recv_at, r, rbytes, t->stream), "staging copy out"));
    SUMO_CUDA__CHECK_RESULT(drained(t, deadline_ns, "sendrecv"));
    if (stage_recv) memcpy(rbuf, t->host_stage + recv_at, rbytes);
    return SUMO_SUCCESS;
}

static sumo_result nt_sendrecv(void *ctx, const void *sbuf, size_t sbytes, int dst, void *rbuf,
                               size_t rbytes, int src, int64_t deadline_ns)
{
    nccl_tp *t = ctx;
    int previous;
    SUMO_CUDA__CHECK_RESULT(op_begin(t, &previous));
    return op_end(t, previous, sendrecv_body(t, sbuf, sbytes, dst, rbuf, rbytes, src, deadline_ns));
}

static sumo_result allgather_body(nccl_tp *t, const void *record, void *all, size_t bytes,
                                  int64_t deadline_ns)
{
    size_t out_at = 256, total = (size_t)t->size * bytes;
    SUMO_CUDA__CHECK_RESULT(stage_reserve(t, out_at + total));
    memcpy(t->host_stage, record, bytes);
    SUMO_CUDA__CHECK_RESULT(cuda_step(
        t, t->api.copy_async(t->dev_stage, t->host_stage, bytes, t->stream), "staging copy in"));
    int e = t->api.all_gather(t->dev_stage, t->dev_stage + out_at, bytes, SUMO_NCCL_UINT8, t->comm,
                              t->stream);
    SUMO_CUDA__CHECK_RESULT(settled(t, e, deadline_ns, "ncclAllGather"));
    SUMO_CUDA__CHECK_RESULT(cuda_step(
        t, t->api.copy_async(t->host_stage + out_at, t->dev_stage + out_at, total, t->stream),
        "staging copy out"));
    SUMO_CUDA__CHECK_RESULT(drained(t, deadline_ns, "allgather"));
    memcpy(all, t->host_stage + out_at, total);
    return SUMO_SUCCESS;
}

static sumo_result nt_allgather(void *ctx, const void *record, void *all, size_t bytes,
                                int64_t deadline_ns)
{
    nccl_tp *t = ctx;
    int previous;
    SUMO_CUDA__CHECK_RESULT(op_begin(t, &previous));
    return op_end(t, previous, allgather_body(t, record, all, bytes, deadline_ns));
}

static sumo_result barrier_body(nccl_tp *t, int64_t deadline_ns)
{
    SUMO_CUDA__CHECK_RESULT(stage_reserve(t, 1));
    int e = t->api.all_reduce(t->dev_stage, t->dev_stage, 1, SUMO_NCCL_UINT8, SUMO_NCCL_SUM,
                              t->comm, t->stream);
    SUMO_CUDA__CHECK_RESULT(settled(t, e, deadline_ns, "ncclAllReduce (barrier)"));
    return drained(t, deadline_ns, "barrier");
}

static sumo_result nt_barrier(void *ctx, int64_t deadline_ns)
{
    nccl_tp *t = ctx;
    int previous;
    SUMO_CUDA__CHECK_RESULT(op_begin(t, &previous));
    return op_end(t, previous, barrier_body(t, deadline_ns));
}

static void nt_abort(void *ctx)
{
    nccl_tp *t = ctx;
    atomic_store(&t->abort_requested, true);
    /* Free: abort now. Busy: the running operation's wait sees the flag and aborts; should it
     * end just before, the next operation (or destroy) does. */
    if (pthread_mutex_trylock(&t->lock) == 0) {
        t->failed = true;
        if (!t->aborted && !t->error[0])
            snprintf(t->error, sizeof t->error, "aborted (sumo_comm_abort, or a failure of this rank)");
        abort_now(t);
        pthread_mutex_unlock(&t->lock);
    }
}

static void release_resources(nccl_tp *t)
{
    if (t->dev_stage) (void)t->api.device_free(t->dev_stage);
    if (t->host_stage) (void)t->api.host_free(t->host_stage);
    if (t->own_stream && t->stream) (void)t->api.stream_destroy(t->stream);
    t->dev_stage = t->host_stage = NULL;
    t->stream = NULL;
}

static sumo_result nt_destroy(void *ctx)
{
    nccl_tp *t = ctx;
    if (!t->owned) return SUMO_SUCCESS; /* the creator cleans up (a failed create) */
    pthread_mutex_lock(&t->lock);
    sumo_result r = SUMO_SUCCESS;
    int previous = t->device;
    if (t->api.get_device(&previous) == SUMO_CUDA_SUCCESS && previous != t->device)
        (void)t->api.set_device(t->device);
    /* After a failure peers may be gone: abort never waits for them. Healthy, every
     * operation has completed, so destroying has nothing in flight to wait for. */
    if (t->failed || atomic_load(&t->abort_requested)) abort_now(t);
    if (!t->aborted && t->api.comm_destroy(t->comm) != SUMO_NCCL_SUCCESS) r = SUMO_ERR_INTERNAL;
    release_resources(t);
    if (previous != t->device) (void)t->api.set_device(previous);
    pthread_mutex_unlock(&t->lock);
    pthread_mutex_destroy(&t->lock);
    sumo_cuda__nccl_unload(&t->api);
    free(t);
    return r;
}

static const char *nt_error(void *ctx) { return ((nccl_tp *)ctx)->error; }

static bool nt_carries(void *ctx, const char *memory)
{
    (void)ctx;
    return memory && strcmp(memory, "cuda") == 0;
}

static const sumo_transport_ops NCCL_OPS = {
    .struct_size = sizeof(sumo_transport_ops),
    .name = "nccl",
    .sendrecv = nt_sendrecv,
    .allgather = nt_allgather,
    .barrier = nt_barrier,
    .abort = nt_abort,
    .destroy = nt_destroy,
    .error_message = nt_error,
    .carries = nt_carries,
};

const sumo_transport_ops *sumo_cuda__nccl_ops(void) { return &NCCL_OPS; }

sumo_result sumo_cuda__nccl_open(const sumo_cuda__nccl_api *api, void *comm, void *stream,
                                 void **ctx, int *rank, int *size)
{
    if (api == NULL || comm == NULL || ctx == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *ctx = NULL;
    nccl_tp *t = calloc(1, sizeof *t);
    if (t == NULL) return SUMO_ERR_SYSTEM;
    t->api = *api;
    t->comm = comm;
    atomic_init(&t->abort_requested, false);
    if (pthread_mutex_init(&t->lock, NULL) != 0) {
        free(t);
        return SUMO_ERR_SYSTEM;
    }
    sumo_result r = SUMO_SUCCESS;
    if (api->comm_count(comm, &t->size) != SUMO_NCCL_SUCCESS ||
        api->comm_user_rank(comm, &t->rank) != SUMO_NCCL_SUCCESS ||
        api->comm_cu_device(comm, &t->device) != SUMO_NCCL_SUCCESS) {
        sumo_cuda__warn("sumo_comm_create_nccl: the NCCL communicator does not answer "
                        "ncclCommCount / ncclCommUserRank / ncclCommCuDevice");
        r = SUMO_ERR_INVALID_ARGUMENT;
    }
    t->stream = stream;
    if (r == SUMO_SUCCESS && stream == NULL) {
        /* The stream belongs to the communicator's device. */
        int previous = t->device;
        bool switched = api->get_device(&previous) == SUMO_CUDA_SUCCESS &&
                        previous != t->device && api->set_device(t->device) == SUMO_CUDA_SUCCESS;
        int e = api->stream_create(&t->stream);
        if (switched) (void)api->set_device(previous);
        if (e != SUMO_CUDA_SUCCESS) {
            sumo_cuda__warn("sumo_comm_create_nccl: cudaStreamCreate: %s", api->cuda_error_string(e));
            t->stream = NULL;
            r = SUMO_ERR_SYSTEM;
        } else {
            t->own_stream = true;
        }
    }
    if (r != SUMO_SUCCESS) {
        pthread_mutex_destroy(&t->lock);
        free(t);
        return r;
    }
    if (rank) *rank = t->rank;
    if (size) *size = t->size;
    *ctx = t;
    return SUMO_SUCCESS;
}

void sumo_cuda__nccl_own(void *ctx) { ((nccl_tp *)ctx)->owned = true; }

void sumo_cuda__nccl_close_unowned(void *ctx)
{
    nccl_tp *t = ctx;
    if (t == NULL || t->owned) return;
    release_resources(t);
    pthread_mutex_destroy(&t->lock);
    free(t);
}

sumo_result sumo_cuda__nccl_comm_create(const sumo_cuda__nccl_api *api, void *comm, void *stream,
                                        sumo_comm **out)
{
    if (out == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *out = NULL;
    void *ctx;
    int rank, size;
    SUMO_CUDA__CHECK_RESULT(sumo_cuda__nccl_open(api, comm, stream, &ctx, &rank, &size));
    sumo_transport_desc d = {.struct_size = sizeof d, .rank = rank, .size = size,
                             .ops = &NCCL_OPS, .ctx = ctx};
    sumo_result r = sumo_comm_create_transport(&d, out);
    if (r == SUMO_SUCCESS) {
        sumo_cuda__nccl_own(ctx);
        return SUMO_SUCCESS;
    }
    /* Not created (its destroy, if sumo called it, left everything to us): the caller keeps
     * comm and its library handle; the rest is ours. */
    sumo_cuda__nccl_close_unowned(ctx);
    *out = NULL;
    return r;
}

/* ---- the public entry points ------------------------------------------------------------------ */

sumo_result sumo_comm_create_nccl(void *nccl_comm, void *stream, sumo_comm **out)
{
    if (nccl_comm == NULL || out == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *out = NULL;
    sumo_cuda__nccl_api api;
    char why[256];
    sumo_result r = sumo_cuda__nccl_load(&api, why, sizeof why);
    if (r != SUMO_SUCCESS) {
        fprintf(stderr, "sumo: sumo_comm_create_nccl: %s\n", why);
        return r;
    }
    r = sumo_cuda__nccl_comm_create(&api, nccl_comm, stream, out);
    if (r != SUMO_SUCCESS) sumo_cuda__nccl_unload(&api);
    return r;
}

sumo_result sumo_nccl_unique_id(void *id, size_t bytes)
{
    if (id == NULL || bytes < SUMO_NCCL_ID_BYTES) return SUMO_ERR_INVALID_ARGUMENT;
    sumo_cuda__nccl_api api;
    char why[256];
    sumo_result r = sumo_cuda__nccl_load(&api, why, sizeof why);
    if (r != SUMO_SUCCESS) {
        fprintf(stderr, "sumo: sumo_nccl_unique_id: %s\n", why);
        return r;
    }
    sumo_cuda__nccl_id u;
    int e = api.get_unique_id(&u);
    if (e == SUMO_NCCL_SUCCESS) memcpy(id, u.internal, SUMO_NCCL_ID_BYTES);
    else fprintf(stderr, "sumo: ncclGetUniqueId: %s\n", api.get_error_string(e));
    sumo_cuda__nccl_unload(&api);
    return e == SUMO_NCCL_SUCCESS ? SUMO_SUCCESS : nccl_code(e);
}

sumo_result sumo_comm_create_nccl_rank(int nranks, const void *id, size_t id_bytes, int rank,
                                       int device, void *stream, sumo_comm **out)
{
    if (out == NULL || id == NULL || id_bytes < SUMO_NCCL_ID_BYTES || nranks < 1 || rank < 0 ||
        rank >= nranks)
        return SUMO_ERR_INVALID_ARGUMENT;
    *out = NULL;
    sumo_cuda__nccl_api api;
    char why[256];
    sumo_result r = sumo_cuda__nccl_load(&api, why, sizeof why);
    if (r != SUMO_SUCCESS) {
        fprintf(stderr, "sumo: sumo_comm_create_nccl_rank: %s\n", why);
        return r;
    }
    int previous = -1;
    (void)api.get_device(&previous);
    if (device >= 0 && device != previous && api.set_device(device) != SUMO_CUDA_SUCCESS) {
        fprintf(stderr, "sumo: sumo_comm_create_nccl_rank: cudaSetDevice(%d) failed\n", device);
        sumo_cuda__nccl_unload(&api);
        return SUMO_ERR_INVALID_ARGUMENT;
    }
    sumo_cuda__nccl_id u;
    memcpy(u.internal, id, SUMO_NCCL_ID_BYTES);
    void *comm = NULL;
    int e = api.comm_init_rank(&comm, nranks, u, rank);
    if (device >= 0 && device != previous && previous >= 0) (void)api.set_device(previous);
    if (e != SUMO_NCCL_SUCCESS) {
        fprintf(stderr, "sumo: ncclCommInitRank: %s\n", api.get_error_string(e));
        sumo_cuda__nccl_unload(&api);
        return nccl_code(e);
    }
    r = sumo_cuda__nccl_comm_create(&api, comm, stream, out);
    if (r != SUMO_SUCCESS) {
        (void)api.comm_destroy(comm);
        sumo_cuda__nccl_unload(&api);
    }
    return r;
}
