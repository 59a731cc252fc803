/*
 * sumo_mem_alloc / sumo_mem_free: the communicator's side of memory every peer maps. The
 * transport allocates (a shared window on one node); here the calls are agreed like any
 * collective, so a rank calling something else gets a mismatch instead of a hang inside a
 * blocking window creation, and every rank ends with the same verdict. Each is a composite
 * call on the one submit path: it runs with the handle held, after the queued requests.
 */
#include "collectives/requests.h"

#include <stdlib.h>

/* Transports without shared memory: plain memory, 4096-byte aligned like a window's. */
static sumo_result alloc_plain(size_t bytes, void **ptr)
{
    *ptr = sumo__aligned_alloc(4096, bytes);
    return *ptr ? SUMO_SUCCESS : SUMO_ERR_SYSTEM;
}

static sumo_result release(sumo_comm *c, void *ptr)
{
    if (c->tp->ops->mem_free) return c->tp->ops->mem_free(c->tp, ptr);
    free(ptr);
    return SUMO_SUCCESS;
}

typedef struct alloc_args {
    size_t bytes;
    void **ptr;
} alloc_args;

static sumo_result alloc_run(sumo_comm *comm, void *p)
{
    const alloc_args *a = p;
    /* A composite agrees itself, out of sumo__execute's count: counted here, as it is on a
     * joined rank that answers it. */
    atomic_fetch_add_explicit(&comm->rounds, 1, memory_order_relaxed);
    sumo__mem_block *block = malloc(sizeof *block);
    sumo__call_desc d = {.kind = SUMO__CALL_MEM_ALLOC};
    if (a->bytes == 0)
        d.local_error = SUMO__COMM_FAIL(comm, SUMO_ERR_INVALID_ARGUMENT, "mem_alloc: zero bytes");
    else if (block == NULL)
        d.local_error = SUMO__FAIL_TOGETHER(comm->tp, SUMO_ERR_SYSTEM, "mem_alloc: out of memory");
    sumo_result r = sumo__agree(comm, &d, NULL);
    if (r != SUMO_SUCCESS) {
        free(block);
        return r;
    }
    sumo__transport *tp = comm->tp;
    void *ptr = NULL;
    r = tp->ops->mem_alloc ? tp->ops->mem_alloc(tp, a->bytes, &ptr) : alloc_plain(a->bytes, &ptr);
    if (r != SUMO_SUCCESS && !tp->ops->mem_alloc)
        SUMO__FAIL_TOGETHER(tp, r, "mem_alloc: out of memory for %zu bytes", a->bytes);
    /* Where the allocation was local, the ranks learn each other's outcome here. */
    sumo__call_desc outcome = {.kind = SUMO__CALL_MEM_ALLOC, .local_error = (uint32_t)r};
    r = sumo__agree(comm, &outcome, NULL);
    if (r != SUMO_SUCCESS) {
        if (ptr) release(comm, ptr);
        free(block);
        return r;
    }
    *block = (sumo__mem_block){.next = comm->mem_blocks, .ptr = ptr, .serial = comm->mem_serial++};
    comm->mem_blocks = block;
    *a->ptr = ptr;
    return SUMO_SUCCESS;
}

sumo_result sumo_mem_alloc(sumo_comm *comm, size_t bytes, void **ptr)
{
    if (comm == NULL || ptr == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *ptr = NULL;
    alloc_args args = {.bytes = bytes, .ptr = ptr};
    sumo__call call = sumo__composite(alloc_run, &args, sizeof args);
    return sumo__submit(comm, &call, NULL);
}

static sumo_result free_run(sumo_comm *comm, void *p)
{
    void *ptr = *(void **)p;
    atomic_fetch_add_explicit(&comm->rounds, 1, memory_order_relaxed);
    sumo__mem_block **at = &comm->mem_blocks;
    while (*at && (*at)->ptr != ptr) at = &(*at)->next;
    sumo__call_desc d = {.kind = SUMO__CALL_MEM_FREE};
    if (*at == NULL)
        d.local_error = SUMO__COMM_FAIL(comm, SUMO_ERR_INVALID_ARGUMENT,
                                        "mem_free: %p did not come from sumo_mem_alloc on this "
                                        "communicator",
                                        ptr);
    else d.aux = (*at)->serial;
    SUMO__CHECK(sumo__agree(comm, &d, NULL));
    sumo__mem_block *block = *at;
    *at = block->next;
    sumo_result r = release(comm, block->ptr);
    free(block);
    return r;
}

sumo_result sumo_mem_free(sumo_comm *comm, void *ptr)
{
    if (comm == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    sumo__call call = sumo__composite(free_run, &ptr, sizeof ptr);
    return sumo__submit(comm, &call, NULL);
}
