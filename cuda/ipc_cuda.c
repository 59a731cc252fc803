/*
 * Device memory shared between the processes of one node (sumo_ext.h's share, open_shared and
 * close_shared), so that ranks in separate processes (the shm transport: torchrun with one
 * process per rank) run sumo's direct algorithms on each other's device buffers.
 *
 * On the device it is CUDA IPC: share finds the allocation that holds the buffer (the driver's
 * cuPointerGetAttributes, fetched through the runtime so that no -lcuda is linked) and exports
 * it once (cudaIpcGetMemHandle, kept per allocation: its buffer id is unique for the life of the
 * process, so a freed allocation's export is never taken for a new one's); open_shared maps a
 * peer's allocation with cudaIpcOpenMemHandle, which allows one mapping per handle and process,
 * so the mappings are counted across the communicators that open them.
 *
 * Emulated (the host tests, no GPU): the "device" memory is one memfd mapping per allocation;
 * share names it by the owner's pid, descriptor and inode, and open_shared maps it through
 * /proc/<pid>/fd, counted the same way. Nothing has a name in /dev/shm, and the memory goes
 * with the last process that maps it.
 */
#include "cuda_internal.h"
#include "device_cuda.h"

#include <cuda.h> /* the driver's types: the one driver entry is fetched at run time */

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Exports kept per object: a training loop shares a few long-lived allocations (the caching
 * allocator's segments); past this many, the oldest export is dropped (and made again if its
 * allocation comes back). */
#define EXPORTS_KEPT 64

typedef struct sumo_cuda__export {
    struct sumo_cuda__export *next;
    unsigned long long buffer_id;
    uintptr_t base;
    cudaIpcMemHandle_t handle;
} sumo_cuda__export;

typedef struct sumo_cuda__import {
    struct sumo_cuda__import *next;
    unsigned char handle[SUMO_SHARE_HANDLE_BYTES];
    size_t handle_bytes;
    void *base;
    size_t bytes; /* emulated: the mapping's length */
    int refs;
} sumo_cuda__import;

typedef struct sumo_cuda__emu_block {
    struct sumo_cuda__emu_block *next;
    unsigned char *base;
    size_t bytes;
    int fd;
    uint64_t ino, dev;
} sumo_cuda__emu_block;

/* What names an emulated allocation for a peer process. */
typedef struct emu_handle {
    uint64_t magic;
    int32_t pid, fd;
    uint64_t bytes, ino, dev;
} emu_handle;
#define EMU_MAGIC 0x73756d6f656d7531ull /* "sumoemu1" */

static void say(char *message, size_t bytes, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void say(char *message, size_t bytes, const char *fmt, ...)
{
    if (message == NULL || bytes == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, bytes, fmt, ap);
    va_end(ap);
}

/* ---- emulated memory ---------------------------------------------------------------------- */

sumo_result sumo_cuda__kernels_emulate_ipc(sumo_cuda_kernels *k)
{
    if (k == NULL || !k->emulated) return SUMO_ERR_INVALID_ARGUMENT;
    k->emulated_ipc = true;
    sumo_cuda__fill_ipc(k);
    return SUMO_SUCCESS;
}

sumo_result sumo_cuda__emu_shared_alloc(sumo_cuda_kernels *k, size_t bytes, void **ptr)
{
    *ptr = NULL;
    size_t len = bytes ? (bytes + 4095) / 4096 * 4096 : 4096;
    sumo_cuda__emu_block *b = calloc(1, sizeof *b);
    if (b == NULL) return SUMO_ERR_SYSTEM;
    b->fd = memfd_create("sumo-emulated-device", MFD_CLOEXEC);
    struct stat st;
    if (b->fd < 0 || ftruncate(b->fd, (off_t)len) != 0 || fstat(b->fd, &st) != 0) goto fail;
    b->base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, b->fd, 0);
    if (b->base == MAP_FAILED) {
        b->base = NULL;
        goto fail;
    }
    b->bytes = len;
    b->ino = (uint64_t)st.st_ino;
    b->dev = (uint64_t)st.st_dev;
    pthread_mutex_lock(&k->ipc_lock);
    b->next = k->emu_blocks;
    k->emu_blocks = b;
    pthread_mutex_unlock(&k->ipc_lock);
    *ptr = b->base;
    return SUMO_SUCCESS;
fail:
    if (b->fd >= 0) close(b->fd);
    free(b);
    return SUMO_ERR_SYSTEM;
}

void sumo_cuda__emu_shared_free(sumo_cuda_kernels *k, void *ptr)
{
    if (ptr == NULL) return;
    pthread_mutex_lock(&k->ipc_lock);
    sumo_cuda__emu_block **at = &k->emu_blocks;
    while (*at && (*at)->base != ptr) at = &(*at)->next;
    sumo_cuda__emu_block *b = *at;
    if (b) *at = b->next;
    pthread_mutex_unlock(&k->ipc_lock);
    if (b == NULL) return;
    munmap(b->base, b->bytes);
    close(b->fd);
    free(b);
}

/* The block holding [ptr, ptr + bytes); the caller holds ipc_lock. */
static sumo_cuda__emu_block *emu_block_of(sumo_cuda_kernels *k, const void *ptr, size_t bytes)
{
    const unsigned char *p = ptr;
    for (sumo_cuda__emu_block *b = k->emu_blocks; b; b = b->next)
        if (p >= b->base && p < b->base + b->bytes && bytes <= (size_t)(b->base + b->bytes - p))
            return b;
    return NULL;
}

bool sumo_cuda__emu_shared_owns(sumo_cuda_kernels *k, const void *ptr, size_t bytes)
{
    pthread_mutex_lock(&k->ipc_lock);
    bool owns = emu_block_of(k, ptr, bytes) != NULL;
    pthread_mutex_unlock(&k->ipc_lock);
    return owns;
}

static sumo_result emu_share(sumo_cuda_kernels *k, const void *ptr, size_t bytes, void *handle,
                             size_t *handle_bytes, size_t *offset, char *message,
                             size_t message_bytes)
{
    pthread_mutex_lock(&k->ipc_lock);
    sumo_cuda__emu_block *b = emu_block_of(k, ptr, bytes);
    emu_handle h = {.magic = EMU_MAGIC};
    if (b) {
        h = (emu_handle){.magic = EMU_MAGIC, .pid = (int32_t)getpid(), .fd = b->fd,
                         .bytes = b->bytes, .ino = b->ino, .dev = b->dev};
        *offset = (size_t)((const unsigned char *)ptr - b->base);
    }
    pthread_mutex_unlock(&k->ipc_lock);
    if (b == NULL) {
        say(message, message_bytes, "emulated device memory not from a shareable allocation "
                                    "(allocate it with sumo_cuda__emu_shared_alloc)");
        return SUMO_ERR_INVALID_ARGUMENT;
    }
    memcpy(handle, &h, sizeof h);
    *handle_bytes = sizeof h;
    return SUMO_SUCCESS;
}

static sumo_result emu_open(const void *handle, size_t handle_bytes, void **base, size_t *bytes)
{
    emu_handle h;
    if (handle_bytes != sizeof h) return SUMO_ERR_INVALID_ARGUMENT;
    memcpy(&h, handle, sizeof h);
    if (h.magic != EMU_MAGIC) return SUMO_ERR_INVALID_ARGUMENT;
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)h.pid, (int)h.fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        sumo_cuda__warn("emulated open_shared: %s: %s", path, strerror(errno));
        return SUMO_ERR_SYSTEM;
    }
    struct stat st;
    sumo_result r = SUMO_SUCCESS;
    if (fstat(fd, &st) != 0 || (uint64_t)st.st_ino != h.ino || (uint64_t)st.st_dev != h.dev ||
        (uint64_t)st.st_size < h.bytes) {
        sumo_cuda__warn("emulated open_shared: %s is not the allocation the handle names", path);
        r = SUMO_ERR_INTERNAL;
    }
    void *p = r == SUMO_SUCCESS ? mmap(NULL, (size_t)h.bytes, PROT_READ | PROT_WRITE, MAP_SHARED,
                                       fd, 0)
                                : MAP_FAILED;
    close(fd);
    if (r == SUMO_SUCCESS && p == MAP_FAILED) r = SUMO_ERR_SYSTEM;
    if (r != SUMO_SUCCESS) return r;
    *base = p;
    *bytes = (size_t)h.bytes;
    return SUMO_SUCCESS;
}

/* ---- the device: CUDA IPC ------------------------------------------------------------------- */

typedef CUresult (*get_attributes_fn)(unsigned int n, CUpointer_attribute *attributes,
                                      void **data, CUdeviceptr ptr);

static get_attributes_fn get_attributes(sumo_cuda_kernels *k)
{
    if (k->get_attributes == NULL) {
        void *fn = NULL;
        enum cudaDriverEntryPointQueryResult found;
        cudaError_t e = cudaGetDriverEntryPointByVersion("cuPointerGetAttributes", &fn, 7000,
                                                         cudaEnableDefault, &found);
        if (e != cudaSuccess || found != cudaDriverEntryPointSuccess) {
            (void)cudaGetLastError();
            fn = NULL;
        }
        k->get_attributes = fn;
    }
    return (get_attributes_fn)k->get_attributes;
}

static sumo_result dev_share(sumo_cuda_kernels *k, const void *ptr, void *handle,
                             size_t *handle_bytes, size_t *offset, char *message,
                             size_t message_bytes)
{
    pthread_mutex_lock(&k->ipc_lock);
    get_attributes_fn attrs = get_attributes(k);
    pthread_mutex_unlock(&k->ipc_lock);
    if (attrs == NULL) {
        say(message, message_bytes, "the CUDA driver has no cuPointerGetAttributes: update the "
                                    "driver");
        return SUMO_ERR_INVALID_USAGE;
    }
    /* One driver call for everything: the allocation, its id, and whether IPC exports it. */
    CUdeviceptr start = 0;
    size_t size = 0;
    unsigned long long id = 0;
    unsigned int ipc = 0, managed = 0;
    CUmemoryPool pool = NULL;
    CUpointer_attribute which[] = {CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                   CU_POINTER_ATTRIBUTE_RANGE_SIZE, CU_POINTER_ATTRIBUTE_BUFFER_ID,
                                   CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
                                   CU_POINTER_ATTRIBUTE_IS_MANAGED,
                                   CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE};
    void *data[] = {&start, &size, &id, &ipc, &managed, &pool};
    CUresult cr = attrs(sizeof which / sizeof which[0], which, data, (CUdeviceptr)(uintptr_t)ptr);
    if (cr != CUDA_SUCCESS) {
        say(message, message_bytes, "cuPointerGetAttributes failed (CUresult %d)", (int)cr);
        return SUMO_ERR_INTERNAL;
    }
    if (!ipc) {
        say(message, message_bytes,
            "this %s memory cannot be exported with CUDA IPC; allocate the buffers with "
            "cudaMalloc (PyTorch: unset expandable_segments in PYTORCH_CUDA_ALLOC_CONF, and no "
            "cudaMallocAsync backend)",
            managed ? "managed" : pool ? "pool (cudaMallocAsync)" : "virtual (cuMemMap)");
        return SUMO_ERR_INVALID_USAGE;
    }
    *offset = (size_t)((uintptr_t)ptr - (uintptr_t)start);
    *handle_bytes = sizeof(cudaIpcMemHandle_t);
    pthread_mutex_lock(&k->ipc_lock);
    sumo_cuda__export *found = k->exports;
    while (found && found->buffer_id != id) found = found->next;
    if (found) {
        memcpy(handle, &found->handle, sizeof found->handle);
        pthread_mutex_unlock(&k->ipc_lock);
        return SUMO_SUCCESS;
    }
    pthread_mutex_unlock(&k->ipc_lock);
    cudaIpcMemHandle_t h;
    sumo_cuda__device_guard g;
    cudaError_t e = sumo_cuda__device_enter(k, &g);
    if (e == cudaSuccess) {
        e = cudaIpcGetMemHandle(&h, (void *)(uintptr_t)start);
        sumo_cuda__device_leave(&g);
    }
    if (e != cudaSuccess) {
        say(message, message_bytes, "cudaIpcGetMemHandle: %s: %s", cudaGetErrorName(e),
            cudaGetErrorString(e));
        return SUMO_CUDA__FAIL(e, "cudaIpcGetMemHandle");
    }
    sumo_cuda__export *x = calloc(1, sizeof *x);
    if (x) {
        *x = (sumo_cuda__export){.buffer_id = id, .base = (uintptr_t)start, .handle = h};
        pthread_mutex_lock(&k->ipc_lock);
        x->next = k->exports;
        k->exports = x;
        /* The oldest beyond what is kept goes (the list is newest first). */
        sumo_cuda__export **last = &k->exports;
        for (int n = 0; *last && n < EXPORTS_KEPT; n++) last = &(*last)->next;
        sumo_cuda__export *drop = *last;
        *last = NULL;
        pthread_mutex_unlock(&k->ipc_lock);
        while (drop) {
            sumo_cuda__export *next = drop->next;
            free(drop);
            drop = next;
        }
    }
    memcpy(handle, &h, sizeof h);
    return SUMO_SUCCESS;
}

static sumo_result dev_open(sumo_cuda_kernels *k, const void *handle, size_t handle_bytes,
                            void **base)
{
    cudaIpcMemHandle_t h;
    if (handle_bytes != sizeof h) return SUMO_ERR_INVALID_ARGUMENT;
    memcpy(&h, handle, sizeof h);
    sumo_cuda__device_guard g;
    cudaError_t e = sumo_cuda__device_enter(k, &g);
    if (e != cudaSuccess) return SUMO_CUDA__FAIL(e, "cudaSetDevice");
    /* Peer access is enabled only where the peer's memory is on another device. */
    e = cudaIpcOpenMemHandle(base, h, cudaIpcMemLazyEnablePeerAccess);
    sumo_cuda__device_leave(&g);
    if (e != cudaSuccess) return SUMO_CUDA__FAIL(e, "cudaIpcOpenMemHandle");
    return SUMO_SUCCESS;
}

/* ---- the entries -------------------------------------------------------------------------- */

static sumo_result k_share(void *ctx, const void *ptr, size_t bytes, void *handle,
                           size_t *handle_bytes, size_t *offset, char *message,
                           size_t message_bytes)
{
    sumo_cuda_kernels *k = ctx;
    *handle_bytes = 0;
    *offset = 0;
    if (ptr == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    if (k->emulated)
        return emu_share(k, ptr, bytes, handle, handle_bytes, offset, message, message_bytes);
    return dev_share(k, ptr, handle, handle_bytes, offset, message, message_bytes);
}

static sumo_result k_open_shared(void *ctx, const void *handle, size_t handle_bytes, void **base)
{
    sumo_cuda_kernels *k = ctx;
    *base = NULL;
    if (handle_bytes == 0 || handle_bytes > SUMO_SHARE_HANDLE_BYTES)
        return SUMO_ERR_INVALID_ARGUMENT;
    /* Held across the open: two communicators opening one handle at once must not both map it
     * (CUDA refuses the second). */
    pthread_mutex_lock(&k->ipc_lock);
    sumo_cuda__import *im = k->imports;
    while (im && !(im->handle_bytes == handle_bytes && memcmp(im->handle, handle, handle_bytes) == 0))
        im = im->next;
    sumo_result r = SUMO_SUCCESS;
    if (im == NULL) {
        im = calloc(1, sizeof *im);
        if (im == NULL) r = SUMO_ERR_SYSTEM;
        if (r == SUMO_SUCCESS)
            r = k->emulated ? emu_open(handle, handle_bytes, &im->base, &im->bytes)
                            : dev_open(k, handle, handle_bytes, &im->base);
        if (r == SUMO_SUCCESS) {
            memcpy(im->handle, handle, handle_bytes);
            im->handle_bytes = handle_bytes;
            im->next = k->imports;
            k->imports = im;
        } else {
            free(im);
            im = NULL;
        }
    }
    if (im) {
        im->refs++;
        *base = im->base;
    }
    pthread_mutex_unlock(&k->ipc_lock);
    return r;
}

static void unmap(sumo_cuda_kernels *k, sumo_cuda__import *im)
{
    if (k->emulated) {
        munmap(im->base, im->bytes);
        return;
    }
    sumo_cuda__device_guard g;
    if (sumo_cuda__device_enter(k, &g) == cudaSuccess) {
        cudaError_t e = cudaIpcCloseMemHandle(im->base);
        if (e != cudaSuccess) (void)SUMO_CUDA__FAIL(e, "cudaIpcCloseMemHandle");
        sumo_cuda__device_leave(&g);
    }
    (void)cudaGetLastError();
}

static sumo_result k_close_shared(void *ctx, void *base)
{
    sumo_cuda_kernels *k = ctx;
    pthread_mutex_lock(&k->ipc_lock);
    sumo_cuda__import **at = &k->imports;
    while (*at && (*at)->base != base) at = &(*at)->next;
    sumo_cuda__import *im = *at;
    bool last = im && --im->refs == 0;
    if (last) *at = im->next;
    pthread_mutex_unlock(&k->ipc_lock);
    if (im == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    if (last) {
        unmap(k, im);
        free(im);
    }
    return SUMO_SUCCESS;
}

void sumo_cuda__fill_ipc(sumo_cuda_kernels *k)
{
    /* A plain emulated object has no sharing: its memory is the test's malloc. */
    bool shares = !k->emulated || k->emulated_ipc;
    k->table.share = shares ? k_share : NULL;
    k->table.open_shared = shares ? k_open_shared : NULL;
    k->table.close_shared = shares ? k_close_shared : NULL;
}

void sumo_cuda__ipc_free(sumo_cuda_kernels *k)
{
    while (k->imports) {
        sumo_cuda__import *im = k->imports;
        k->imports = im->next;
        unmap(k, im);
        free(im);
    }
    while (k->exports) {
        sumo_cuda__export *x = k->exports;
        k->exports = x->next;
        free(x);
    }
    while (k->emu_blocks) {
        sumo_cuda__emu_block *b = k->emu_blocks;
        k->emu_blocks = b->next;
        munmap(b->base, b->bytes);
        close(b->fd);
        free(b);
    }
}
