/*
 * sumo_mem_alloc / sumo_mem_free: the communicator's side of memory every peer maps. The
 * transport allocates (a shared window on one node); here the calls are agreed like any
 * collective, so a rank calling something else gets a mismatch instead of a hang inside a
 * blocking window creation, and every rank ends with the same verdict.
 */
#include "collectives/agree.h"
#include "collectives/memory.h"

#include <stdlib.h>

typedef struct sumo__mem_block {
    struct sumo__mem_block *next;
    void *ptr;
    uint64_t serial;
} sumo__mem_block;

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

sumo_result sumo_mem_alloc(sumo_comm *comm, size_t bytes, void **ptr)
{
    if (comm == NULL || ptr == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *ptr = NULL;
    sumo__comm_enter(comm);
    sumo_result r = sumo__usable(comm);
    sumo__mem_block *block = NULL;
    if (r != SUMO_SUCCESS) goto out;
    block = malloc(sizeof *block);
    sumo__call_desc d = {.kind = SUMO__CALL_MEM_ALLOC};
    if (bytes == 0)
        d.local_error = SUMO__COMM_FAIL(comm, SUMO_ERR_INVALID_ARGUMENT, "mem_alloc: zero bytes");
    else if (block == NULL)
        d.local_error = SUMO__FAIL_TOGETHER(comm->tp, SUMO_ERR_SYSTEM, "mem_alloc: out of memory");
    r = sumo__agree(comm, &d, NULL);
    if (r != SUMO_SUCCESS) goto out;
    sumo__transport *tp = comm->tp;
    void *p = NULL;
    r = tp->ops->mem_alloc ? tp->ops->mem_alloc(tp, bytes, &p) : alloc_plain(bytes, &p);
    if (r != SUMO_SUCCESS && !tp->ops->mem_alloc)
        SUMO__FAIL_TOGETHER(tp, r, "mem_alloc: out of memory for %zu bytes", bytes);
    /* Where the allocation was local, the ranks learn each other's outcome here. */
    sumo__call_desc outcome = {.kind = SUMO__CALL_MEM_ALLOC, .local_error = (uint32_t)r};
    r = sumo__agree(comm, &outcome, NULL);
    if (r != SUMO_SUCCESS) {
        if (p) release(comm, p);
        goto out;
    }
    *block = (sumo__mem_block){.next = comm->mem_blocks, .ptr = p, .serial = comm->mem_serial++};
    comm->mem_blocks = block;
    block = NULL;
    *ptr = p;
out:
    free(block);
    sumo__comm_leave(comm);
    return r;
}

sumo_result sumo_mem_free(sumo_comm *comm, void *ptr)
{
    if (comm == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    sumo__comm_enter(comm);
    sumo_result r = sumo__usable(comm);
    if (r != SUMO_SUCCESS) goto out;
    sumo__mem_block **at = &comm->mem_blocks;
    while (*at && (*at)->ptr != ptr) at = &(*at)->next;
    sumo__call_desc d = {.kind = SUMO__CALL_MEM_FREE};
    if (*at == NULL)
        d.local_error = SUMO__COMM_FAIL(comm, SUMO_ERR_INVALID_ARGUMENT,
                                        "mem_free: %p did not come from sumo_mem_alloc on this "
                                        "communicator",
                                        ptr);
    else d.aux = (*at)->serial;
    r = sumo__agree(comm, &d, NULL);
    if (r != SUMO_SUCCESS) goto out;
    sumo__mem_block *block = *at;
    *at = block->next;
    r = release(comm, block->ptr);
    free(block);
out:
    sumo__comm_leave(comm);
    return r;
}

void sumo__mem_forget(sumo_comm *comm)
{
    while (comm->mem_blocks) {
        sumo__mem_block *block = comm->mem_blocks;
        comm->mem_blocks = block->next;
        /* The transport's destroy releases its own; plain memory is ours. */
        if (!comm->tp->ops->mem_free) free(block->ptr);
        free(block);
    }
}
