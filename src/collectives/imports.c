#include "collectives/imports.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One buffer on a board: its handle and where the buffer lies in the allocation it names. */
typedef struct board_entry {
    uint64_t address; /* the buffer as its owner passed it (what it announces) */
    uint64_t offset;  /* the buffer's offset in the allocation */
    uint32_t handle_bytes; /* 0: nothing published */
    uint32_t unused;
    unsigned char handle[SUMO_SHARE_HANDLE_BYTES];
} board_entry;

typedef struct board {
    board_entry send, recv;
} board;
_Static_assert(sizeof(board) <= SUMO__BOARD_BYTES, "a rank's buffers fit its board");

/* Imports kept per peer: a call uses two (send and receive buffers) at most, so the least
 * recently used one is never one the running call holds; the others keep a training loop's
 * few alternating buffers (gradient buckets) from being reopened at every call. */
#define PER_PEER 4

typedef struct import {
    const sumo_kernel_table *k; /* NULL: an empty entry */
    void *base;
    uint64_t used; /* the imports' clock when last resolved through */
    uint32_t handle_bytes;
    unsigned char handle[SUMO_SHARE_HANDLE_BYTES];
} import;

struct sumo__imports {
    int size;
    uint64_t clock;
    import entry[]; /* size * PER_PEER, peer k's from k * PER_PEER */
};

static void imports_release(struct sumo__imports *im)
{
    if (im == NULL) return;
    for (size_t i = 0; i < (size_t)im->size * PER_PEER; i++) {
        import *e = &im->entry[i];
        if (e->k) e->k->close_shared(e->k->ctx, e->base);
    }
    free(im);
}

static bool export_one(sumo_comm *c, const char *what, const void *buf, size_t bytes,
                       board_entry *e)
{
    const sumo_kernel_table *k = c->x.k;
    size_t handle_bytes = 0, offset = 0;
    char why[160] = "";
    sumo_result r = k->share(k->ctx, buf, bytes, e->handle, &handle_bytes, &offset, why,
                             sizeof why);
    if (r == SUMO_SUCCESS && (handle_bytes == 0 || handle_bytes > SUMO_SHARE_HANDLE_BYTES)) {
        r = SUMO_ERR_INTERNAL;
        snprintf(why, sizeof why, "share gave a %zu-byte handle (1 to %d)", handle_bytes,
                 SUMO_SHARE_HANDLE_BYTES);
    }
    if (r != SUMO_SUCCESS) {
        snprintf(c->share_why, sizeof c->share_why, "its %s buffer: %s (%s)", what,
                 why[0] ? why : "share failed", sumo_result_name(r));
        return false;
    }
    e->address = (uint64_t)(uintptr_t)buf;
    e->offset = offset;
    e->handle_bytes = (uint32_t)handle_bytes;
    return true;
}

bool sumo__imports_export(sumo_comm *c, const void *sendbuf, size_t send_bytes,
                          const void *recvbuf, size_t recv_bytes)
{
    sumo__transport *tp = c->tp;
    board b;
    memset(&b, 0, sizeof b);
    c->share_why[0] = '\0';
    bool ok = (sendbuf == NULL || export_one(c, "send", sendbuf, send_bytes, &b.send)) &&
              export_one(c, "receive", recvbuf, recv_bytes, &b.recv);
    /* A failed export publishes nothing: the flags tell the peers not to look. */
    if (ok) memcpy(tp->ops->board(tp, tp->rank), &b, sizeof b);
    return ok;
}

static import *find(struct sumo__imports *im, int peer, const sumo_kernel_table *k,
                    const board_entry *e)
{
    import *mine = &im->entry[(size_t)peer * PER_PEER], *lru = mine;
    for (int i = 0; i < PER_PEER; i++) {
        import *x = &mine[i];
        if (x->k == k && x->handle_bytes == e->handle_bytes &&
            memcmp(x->handle, e->handle, e->handle_bytes) == 0)
            return x;
        if (lru->k != NULL && (x->k == NULL || x->used < lru->used)) lru = x;
    }
    return lru; /* not open: the entry to (re)use */
}

sumo_result sumo__imports_peer(sumo_comm *c, int peer, bool recv, uint64_t address, void **out)
{
    sumo__transport *tp = c->tp;
    const sumo_kernel_table *k = c->x.k;
    const char *what = recv ? "receive" : "send";
    *out = NULL;
    if (peer == tp->rank) {
        *out = (void *)(uintptr_t)address;
        return SUMO_SUCCESS;
    }
    board_entry e;
    const board *b = (const board *)(const void *)tp->ops->board(tp, peer);
    memcpy(&e, recv ? &b->recv : &b->send, sizeof e);
    if (e.handle_bytes == 0 || e.handle_bytes > SUMO_SHARE_HANDLE_BYTES || e.address != address)
        return SUMO__COMM_FAIL(c, SUMO_ERR_INTERNAL,
                               "rank %d's board does not hold the %s buffer it announced (%#llx)",
                               peer, what, (unsigned long long)address);
    if (c->imports == NULL) {
        size_t n = (size_t)tp->size * PER_PEER;
        c->imports = calloc(1, sizeof *c->imports + n * sizeof(import));
        if (c->imports == NULL)
            return SUMO__COMM_FAIL(c, SUMO_ERR_SYSTEM, "out of memory for the imports of %d ranks",
                                   tp->size);
        c->imports->size = tp->size;
        c->imports_release = imports_release;
    }
    import *x = find(c->imports, peer, k, &e);
    if (x->k != k || x->handle_bytes != e.handle_bytes ||
        memcmp(x->handle, e.handle, e.handle_bytes) != 0) {
        if (x->k) x->k->close_shared(x->k->ctx, x->base);
        x->k = NULL;
        void *base = NULL;
        sumo_result r = k->open_shared(k->ctx, e.handle, e.handle_bytes, &base);
        if (r != SUMO_SUCCESS)
            return SUMO__COMM_FAIL(c, r == SUMO_ERR_SYSTEM ? r : SUMO_ERR_INTERNAL,
                                   "cannot open rank %d's %s buffer, shared by its %s kernels "
                                   "(open_shared: %s; SUMO_DEBUG=WARN may say more)",
                                   peer, what, k->memory, sumo_result_name(r));
        *x = (import){.k = k, .base = base, .handle_bytes = e.handle_bytes};
        memcpy(x->handle, e.handle, e.handle_bytes);
    }
    x->used = ++c->imports->clock;
    *out = (unsigned char *)x->base + e.offset;
    return SUMO_SUCCESS;
}
