/*
 * The shm transport: ranks are processes of one machine that share no launcher, only a
 * key-value store (torchrun's TCPStore). They meet through the store once (shm_meeting.c),
 * then everything runs in shared memory (shm_segment.c): the control block of shm.c (barrier,
 * announce, abort, departures), one staging area per rank (SUMO__REACH_STAGED, the MPI
 * transport's window without MPI), a board per rank (what a collective publishes beside its
 * announcement), mailboxes for point-to-point messages, and memory from
 * mem_alloc that every process maps. The waits ask shm_liveness.c whether a rank they depend on
 * died, since no launcher ends the job when a process dies.
 *
 * Point to point. Each ordered pair of ranks has a mailbox: SUMO__SHM_NSLOT chunk slots, a
 * head the sender advances and a tail the receiver advances. Messages are cut into slot-sized
 * chunks, each stamped with the message's size and its offset, so a size disagreement is
 * caught on the first chunk. A send is complete once its last chunk is in a slot (the sender's buffer is
 * free; the receiver drains the rest later), so a sendrecv only ever waits for a free slot
 * (the receiver is slow) or for data (the sender is). It waits for either on one futex word
 * per rank, its doorbell, which every sender and receiver it deals with rings after moving a
 * chunk.
 *
 * Leaving needs nobody: destroy marks the rank gone (peers waiting on it fail at once) and
 * unmaps. The memory lives on in the peers' mappings, so a rank may leave before its peers
 * read what it staged or sent, and one that stays long after the others left loses nothing.
 */
#include "transport/transport_shm.h"
#include "transport/shm.h"
#include "transport/shm_liveness.h"
#include "transport/shm_meeting.h"
#include "transport/shm_segment.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

/* ---- the transport ------------------------------------------------------------------------ */

/* What each rank announces about its part of a new region (fits an announcement). */
typedef struct part_record {
    int32_t code; /* SUMO_SUCCESS, or this rank's failure */
    int32_t err;  /* its errno */
    int32_t pid;
    int32_t fd;
    int32_t mech;
    int32_t peer; /* the failure was mapping this rank's part (-1: making its own) */
    uint64_t bytes, address, ino, dev, nonce;
} part_record;
_Static_assert(sizeof(part_record) <= SUMO__ANNOUNCE_BYTES, "a part record is one announcement");

typedef struct shm_transport {
    sumo__transport base;
    sumo__shm shm;
    unsigned char *seg;
    sumo__shm_layout L;
    size_t slot_bytes;
    int mech;
    sumo__shm_rank_info *info;
    sumo__shm_mailbox *boxes;
    unsigned char **stage;
    sumo__shm_watch watch;
    /* Memory from mem_alloc, one segment per rank, each mapped by every rank; changed only by
     * the collective mem_alloc / mem_free. */
    sumo__shm_region *regions;
    part_record *parts; /* mem_alloc's announcements (size entries), made with the transport */
} shm_transport;

static sumo__shm_mailbox *box(shm_transport *t, int src, int dst)
{
    return &t->boxes[(size_t)src * (size_t)t->base.size + (size_t)dst];
}

static unsigned char *slot_at(shm_transport *t, int src, int dst, uint32_t n)
{
    size_t dir = (size_t)src * (size_t)t->base.size + (size_t)dst;
    return t->seg + t->L.slots + (dir * SUMO__SHM_NSLOT + n % SUMO__SHM_NSLOT) * t->slot_bytes;
}

static void futex_wake_all(_Atomic uint32_t *word)
{
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static void ring(shm_transport *t, int rank)
{
    atomic_fetch_add_explicit(&t->info[rank].bell, 1, memory_order_release);
    sumo__shm_wake(&t->shm, &t->info[rank].bell);
}

/* Sleepers on doorbells wake within a slice anyway; this makes an abort or departure
 * immediate for them too. */
static void wake_every_bell(shm_transport *t)
{
    for (int r = 0; r < t->base.size; r++) futex_wake_all(&t->info[r].bell);
}

/* ---- sendrecv ----------------------------------------------------------------------------- */

static size_t chunks_of(size_t bytes, size_t slot) { return bytes == 0 ? 1 : (bytes + slot - 1) / slot; }

static sumo_result shm_sendrecv_working(sumo__transport *tp, const void *sbuf, size_t sbytes,
                                        int dst, void *rbuf, size_t rbytes, int src,
                                        sumo__work_fn work, void *ctx)
{
    shm_transport *t = (shm_transport *)tp;
    int me = tp->rank;
    int64_t deadline = sumo__now_ns() + tp->timeout_ns;
    size_t slot = t->slot_bytes;
    sumo__shm_mailbox *out = dst >= 0 ? box(t, me, dst) : NULL;
    sumo__shm_mailbox *in = src >= 0 ? box(t, src, me) : NULL;
    size_t to_send = out ? chunks_of(sbytes, slot) : 0, sent = 0;
    size_t to_take = in ? chunks_of(rbytes, slot) : 0, taken = 0;
    _Atomic uint32_t *bell = &t->info[me].bell;
    for (;;) {
        /* Read before looking at the mailboxes: a chunk moved after this read rings it. */
        uint32_t rung = atomic_load_explicit(bell, memory_order_acquire);
        bool moved = false;
        while (sent < to_send) {
            uint32_t head = atomic_load_explicit(&out->head, memory_order_relaxed);
            uint32_t tail = atomic_load_explicit(&out->tail, memory_order_acquire);
            if (head - tail >= SUMO__SHM_NSLOT) break;
            size_t off = sent * slot, len = SUMO__MIN(slot, sbytes - off);
            out->hdr[head % SUMO__SHM_NSLOT] = (sumo__shm_slot_hdr){.total = sbytes, .offset = off};
            if (len) memcpy(slot_at(t, me, dst, head), (const unsigned char *)sbuf + off, len);
            atomic_store_explicit(&out->head, head + 1, memory_order_release);
            ring(t, dst);
            sent++;
            moved = true;
        }
        while (taken < to_take) {
            uint32_t tail = atomic_load_explicit(&in->tail, memory_order_relaxed);
            if (atomic_load_explicit(&in->head, memory_order_acquire) == tail) break;
            sumo__shm_slot_hdr h = in->hdr[tail % SUMO__SHM_NSLOT];
            size_t off = taken * slot, len = SUMO__MIN(slot, rbytes - off);
            if (h.total != rbytes || h.offset != off)
                return SUMO__FAIL(tp, SUMO_ERR_INTERNAL,
                                  "receive from rank %d: expected %zu bytes, peer sent %" PRIu64
                                  " (chunk at %" PRIu64 ", expected at %zu)",
                                  src, rbytes, h.total, h.offset, off);
            if (len) memcpy((unsigned char *)rbuf + off, slot_at(t, src, me, tail), len);
            atomic_store_explicit(&in->tail, tail + 1, memory_order_release);
            ring(t, src);
            taken++;
            moved = true;
        }
        if (sent == to_send && taken == to_take) return SUMO_SUCCESS;
        if (moved) continue;
        /* Nothing can move: the caller's work fills the wait, a slice at a time. */
        if (work) {
            if (!work(ctx)) work = NULL;
            continue;
        }
        bool receiving = taken < to_take;
        t->watch.also = receiving && sent < to_send && dst != src ? dst : -1;
        sumo_result r = sumo__shm_wait_change(tp, &t->shm, bell, rung, receiving ? src : dst,
                                              deadline, receiving ? "receive" : "send");
        t->watch.also = -1;
        SUMO__CHECK(r);
    }
}

static sumo_result shm_sendrecv(sumo__transport *tp, const void *sbuf, size_t sbytes, int dst,
                                void *rbuf, size_t rbytes, int src)
{
    return shm_sendrecv_working(tp, sbuf, sbytes, dst, rbuf, rbytes, src, NULL, NULL);
}

/* ---- the rest of the interface ------------------------------------------------------------ */

static sumo_result shm_announce(sumo__transport *tp, const void *record, void *all, size_t bytes)
{
    return sumo__shm_announce(tp, &((shm_transport *)tp)->shm, record, all, bytes);
}

static sumo_result shm_barrier(sumo__transport *tp)
{
    return sumo__shm_barrier(tp, &((shm_transport *)tp)->shm);
}

static unsigned char *shm_stage(sumo__transport *tp, int rank)
{
    return ((shm_transport *)tp)->stage[rank];
}

static unsigned char *shm_board(sumo__transport *tp, int rank)
{
    shm_transport *t = (shm_transport *)tp;
    return t->seg + t->L.board + (size_t)rank * SUMO__BOARD_BYTES;
}

static void shm_abort(sumo__transport *tp)
{
    shm_transport *t = (shm_transport *)tp;
    sumo__shm_abort(&t->shm, tp->rank);
    wake_every_bell(t);
}

static void shm_busy(sumo__transport *tp, bool busy)
{
    sumo__shm_busy(&((shm_transport *)tp)->shm, busy);
}

static sumo_result shm_settle(sumo__transport *tp)
{
    return sumo__shm_settle(tp, &((shm_transport *)tp)->shm);
}

static bool shm_shares(sumo__transport *tp, const void *buf, size_t bytes)
{
    return sumo__shm_region_shares(((shm_transport *)tp)->regions, tp->rank, buf, bytes);
}

static void *shm_peer_buffer(sumo__transport *tp, int rank, uint64_t address)
{
    return sumo__shm_region_peer(((shm_transport *)tp)->regions, rank, address);
}

static void region_free(shm_transport *t, sumo__shm_region *g)
{
    for (int r = 0; g->mapped && r < t->base.size; r++)
        if (g->mapped[r]) munmap(g->mapped[r], g->owner_bytes[r]);
    sumo__shm_region_tables_free(g);
    free(g);
}

static int first_failure(const part_record *all, int size)
{
    for (int r = 0; r < size; r++)
        if (all[r].code != SUMO_SUCCESS) return r;
    return -1;
}

static sumo__shm_region *region_new(int size)
{
    sumo__shm_region *g = calloc(1, sizeof *g);
    if (g && sumo__shm_region_tables(g, size)) return g;
    free(g);
    return NULL;
}

/* Maps every peer's part of g; returns this rank's outcome. */
static part_record map_parts(shm_transport *t, sumo__shm_region *g, const part_record *all,
                             char *note, size_t notelen)
{
    for (int k = 0; k < t->base.size; k++) {
        if (k == t->base.rank) continue;
        sumo__shm_segment peer;
        bool by_proc;
        char name[64];
        sumo__shm_segment_name(name, (pid_t)all[k].pid, all[k].nonce);
        int e = sumo__shm_segment_open(all[k].mech, all[k].pid, all[k].fd, name, all[k].ino,
                                       all[k].dev, (size_t)all[k].bytes, &peer, &by_proc, note,
                                       notelen);
        if (e != 0) return (part_record){.code = SUMO_ERR_SYSTEM, .err = e, .peer = k};
        close(peer.fd);
        /* As the control segment (set_views); this rank's own part forks as any memory. */
        madvise(peer.base, peer.bytes, MADV_DONTFORK);
        g->mapped[k] = peer.base;
        g->owner_bytes[k] = (size_t)all[k].bytes;
        g->owner_address[k] = all[k].address;
    }
    return (part_record){.code = SUMO_SUCCESS, .peer = -1};
}

/*
 * One segment per rank and allocation: each rank makes its part (allocated now, by itself),
 * announces where it is, and maps every peer's; a second announcement tells everyone whether
 * every rank mapped everything. Every step runs on every rank whatever its own outcome (the
 * communicator agreed before), so all succeed or all fail together, leaving nothing.
 */
static sumo_result shm_mem_alloc(sumo__transport *tp, size_t bytes, void **ptr)
{
    shm_transport *t = (shm_transport *)tp;
    int size = tp->size, me = tp->rank;
    part_record *all = t->parts;
    sumo__shm_region *g = region_new(size);
    sumo__shm_segment own = {.fd = -1};
    char note[160] = "";
    part_record mine = {.code = SUMO_ERR_SYSTEM, .err = ENOMEM, .pid = (int32_t)getpid(),
                        .fd = -1, .peer = -1};
    /* The page added by the rounding must not wrap a size no memory holds to a small one. */
    if (g && bytes <= SIZE_MAX - SUMO__SHM_PAGE && bytes <= (size_t)INT64_MAX - SUMO__SHM_PAGE) {
        int mech = t->mech;
        size_t rounded = sumo__shm_round_up(bytes, SUMO__SHM_PAGE);
        mine.err = sumo__shm_segment_make(&mech, rounded, 0, rounded, &own, note, sizeof note);
        if (mine.err == 0) {
            mine = (part_record){.code = SUMO_SUCCESS, .pid = (int32_t)getpid(), .fd = own.fd,
                                 .mech = mech, .peer = -1, .bytes = rounded,
                                 .address = (uint64_t)(uintptr_t)own.base, .ino = own.ino,
                                 .dev = own.dev, .nonce = own.nonce};
            g->mapped[me] = own.base;
            g->owner_bytes[me] = rounded;
            g->owner_address[me] = mine.address;
        }
    }
    sumo_result r = shm_announce(tp, &mine, all, sizeof mine);
    bool announced = r == SUMO_SUCCESS;
    int failed = announced ? first_failure(all, size) : -1;
    part_record why = failed >= 0 ? all[failed] : mine;
    if (r == SUMO_SUCCESS) {
        part_record second = failed < 0 ? map_parts(t, g, all, note, sizeof note)
                                        : (part_record){.code = SUMO_SUCCESS, .peer = -1};
        r = shm_announce(tp, &second, all, sizeof second);
        if (r == SUMO_SUCCESS && failed < 0) {
            failed = first_failure(all, size);
            if (failed >= 0) why = all[failed];
        }
    }
    /* Every rank has tried every part: the descriptors and names have served. */
    if (own.fd >= 0) close(own.fd);
    own.fd = -1;
    sumo__shm_segment_unlink(&own);
    if (r == SUMO_SUCCESS && failed < 0) {
        g->user = own.base;
        g->next = t->regions;
        t->regions = g;
        *ptr = g->user;
        return SUMO_SUCCESS;
    }
    if (g) region_free(t, g);
    else if (own.base) munmap(own.base, own.bytes);
    if (r != SUMO_SUCCESS) {
        /* A peer died between the two announcements: it cannot remove its name any more. The
         * table still holds the first one's records (a failed announcement leaves it). */
        for (int k = 0; announced && failed < 0 && k < size; k++) {
            char name[64];
            sumo__shm_segment_name(name, (pid_t)all[k].pid, all[k].nonce);
            if (all[k].mech == SUMO__SHM_NAMED && k != me) shm_unlink(name);
        }
        return r;
    }
    char what[48] = "make its own part";
    if (why.peer >= 0) snprintf(what, sizeof what, "map rank %d's part", why.peer);
    return SUMO__FAIL_TOGETHER(tp, SUMO_ERR_SYSTEM,
                               "mem_alloc: %zu bytes in memory every process maps: rank %d could "
                               "not %s (%s)%s%s",
                               bytes, failed, what, strerror(why.err), note[0] ? "; here: " : "",
                               note);
}

static sumo_result shm_mem_free(sumo__transport *tp, void *ptr)
{
    shm_transport *t = (shm_transport *)tp;
    /* Local: each process's mappings keep the memory alive for the others. */
    sumo__shm_region *g = sumo__shm_region_take(&t->regions, ptr);
    if (g) {
        region_free(t, g);
        return SUMO_SUCCESS;
    }
    return SUMO__FAIL(tp, SUMO_ERR_INVALID_ARGUMENT,
                      "mem_free: %p did not come from sumo_mem_alloc on this communicator", ptr);
}

static void transport_free(shm_transport *t)
{
    while (t->regions) {
        sumo__shm_region *g = t->regions;
        t->regions = g->next;
        region_free(t, g);
    }
    if (t->seg) munmap(t->seg, t->L.total);
    sumo__shm_watch_free(&t->watch);
    free(t->stage);
    free(t->parts);
    free(t);
}

static sumo_result shm_destroy(sumo__transport *tp)
{
    shm_transport *t = (shm_transport *)tp;
    /* Peers still waiting on this rank fail now; peers finishing a collective this rank has
     * finished are not affected (what it sent and staged stays in their mappings). */
    if (tp->size > 1) {
        sumo__shm_depart(&t->shm, tp->rank);
        wake_every_bell(t);
    }
    transport_free(t);
    return SUMO_SUCCESS;
}

/* The survivors meet again through the caller's store, under a prefix of this round's: a
 * member that dies while the new group is made fails the making on the others, and they agree
 * again without it in the next round, as long as the deadline allows. */
static sumo_result shm_shrink(sumo__transport *tp, const sumo__shrink_args *args,
                              sumo__transport **out, sumo__shrink_verdict *verdict)
{
    shm_transport *t = (shm_transport *)tp;
    if (args->store == NULL || args->key_prefix == NULL) {
        snprintf(args->err, args->errlen, "the shm transport shrinks through a store: "
                                          "options.store and options.key_prefix are needed");
        return SUMO_ERR_INVALID_ARGUMENT;
    }
    int64_t deadline = sumo__now_ns() + tp->timeout_ns;
    for (;;) {
        uint32_t round = ++t->shm.shrinks;
        SUMO__CHECK(sumo__shm_shrink_agree(tp, &t->shm, round, args->value,
                                           sumo__now_ns() + tp->timeout_ns, NULL, NULL, verdict,
                                           NULL));
        char prefix[240];
        int n = snprintf(prefix, sizeof prefix, "%s%u/", args->key_prefix, round);
        if (n < 0 || (size_t)n >= sizeof prefix) {
            snprintf(args->err, args->errlen, "options.key_prefix is longer than 230 bytes");
            return SUMO_ERR_INVALID_ARGUMENT;
        }
        sumo_shm_options o = {.struct_size = sizeof o,
                              .rank = verdict->rank,
                              .size = verdict->size,
                              .store = (const sumo_store *)args->store,
                              .key_prefix = prefix,
                              .stage_bytes = tp->stage_bytes};
        sumo__env env = {.timeout_s = (double)tp->timeout_ns / 1e9, .log_level = tp->log_level};
        sumo_result r = sumo__shm_transport_create(&o, &env, out, args->err, args->errlen);
        if (r == SUMO_SUCCESS || (r != SUMO_ERR_PEER_FAILURE && r != SUMO_ERR_TIMEOUT) ||
            sumo__now_ns() >= deadline)
            return r;
        SUMO__LOG(tp->log_level, SUMO__LOG_WARN, "shrink round %u: making the new group failed (%s); "
                                      "agreeing again", round, args->err);
    }
}

static const sumo__transport_ops shm_ops = {
    .name = "shm",
    .sendrecv = shm_sendrecv,
    .sendrecv_working = shm_sendrecv_working,
    .announce = shm_announce,
    .barrier = shm_barrier,
    .peer_buffer = shm_peer_buffer,
    .shares = shm_shares,
    .mem_alloc = shm_mem_alloc,
    .mem_free = shm_mem_free,
    .stage = shm_stage,
    .board = shm_board,
    .abort = shm_abort,
    .destroy = shm_destroy,
    .shrink = shm_shrink,
    .busy = shm_busy,
    .settle = shm_settle,
};

/* ---- creation ----------------------------------------------------------------------------- */

/* The transport's views of the segment the meeting left. */
static void set_views(shm_transport *t, const sumo__shm_met *met)
{
    unsigned char *seg = met->seg;
    t->seg = seg;
    t->L = met->L;
    t->slot_bytes = met->slot_bytes;
    t->mech = met->mech;
    t->info = (sumo__shm_rank_info *)(void *)(seg + met->L.info);
    t->boxes = (sumo__shm_mailbox *)(void *)(seg + met->L.boxes);
    for (int r = 0; r < t->base.size; r++)
        t->stage[r] = seg + met->L.stage + (size_t)r * met->stage_bytes;
    t->base.stage_bytes = met->stage_bytes;
    t->shm = (sumo__shm){.ctl = (sumo__shm_ctl *)(void *)(seg + met->L.ctl),
                         .rank = t->base.rank,
                         .size = t->base.size,
                         .same_address_space = false,
                         .stage = t->stage,
                         .stage_bytes = met->stage_bytes,
                         .spin_limit = sumo__shm_default_spin_limit(t->base.size)};
}

sumo_result sumo__shm_transport_create(const sumo_shm_options *o, const sumo__env *env,
                                       sumo__transport **out,
                                       char *err, size_t errlen)
{
    int size = o->size;
    shm_transport *t = calloc(1, sizeof *t);
    bool watch = t && sumo__shm_watch_init(&t->watch, o->rank, size);
    if (t) {
        t->stage = calloc((size_t)size, sizeof *t->stage);
        t->parts = calloc((size_t)size, sizeof *t->parts);
    }
    if (t == NULL || !watch || !t->stage || !t->parts) {
        snprintf(err, errlen, "out of memory creating the shm transport");
        if (t) transport_free(t);
        return SUMO_ERR_SYSTEM;
    }
    double seconds = env->timeout_s;
    t->base = (sumo__transport){.ops = &shm_ops,
                                .rank = o->rank,
                                .size = size,
                                .timeout_ns = (int64_t)(seconds * 1e9),
                                .log_level = env->log_level,
                                .node_local_size = size,
                                .reach = SUMO__REACH_STAGED};
    sumo__shm_meeting m = {.o = o, .deadline = sumo__now_ns() + t->base.timeout_ns,
                           .seconds = seconds, .log_level = env->log_level, .err = err,
                           .errlen = errlen};
    sumo__shm_met met;
    sumo_result r = sumo__shm_meet(&m, &met);
    if (r == SUMO_SUCCESS) set_views(t, &met);
    if (r == SUMO_SUCCESS && size > 1) {
        /* Every rank has mapped the segment and claimed its slot; the barrier publishes the
         * claims, within what is left of the creation's deadline. */
        int64_t left = m.deadline - sumo__now_ns();
        sumo__status quiet = {0};
        t->base.timeout_ns = left > 0 ? left : 1;
        t->base.status = &quiet;
        r = sumo__shm_barrier(&t->base, &t->shm);
        t->base.status = NULL;
        t->base.timeout_ns = (int64_t)(seconds * 1e9);
        if (r != SUMO_SUCCESS) snprintf(err, errlen, "%s", quiet.message);
    }
    if (r != SUMO_SUCCESS) {
        transport_free(t);
        return r;
    }
    if (size > 1) sumo__shm_watch_start(&t->watch, &t->shm, t->info);
    *out = &t->base;
    return SUMO_SUCCESS;
}
