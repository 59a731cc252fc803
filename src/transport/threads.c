/*
 * The threads transport: P ranks are P threads of one process. The group's control block and
 * mailboxes live on the heap; because the ranks share an address space, collectives can read
 * and write each other's buffers directly (SUMO__REACH_DIRECT), and point-to-point
 * messages are a single memcpy from the sender's buffer into the receiver's.
 */
#include "transport/threads.h"
#include "transport/shm.h"

#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One direction between two ranks. The sender publishes a pointer and bumps `posted`; the
 * receiver copies and bumps `taken`; the sender returns only after that, so its buffer can be
 * reused at once. Each counter has one writer. `state` settles the one race left: a sender
 * that fails before its message was taken retracts it (POSTED -> IDLE), and a receiver claims
 * it before copying (POSTED -> COPYING), so no copy ever reads a buffer its owner has
 * already got back. */
enum { MAIL_IDLE = 0, MAIL_POSTED = 1, MAIL_COPYING = 2 };

typedef struct mailbox {
    _Atomic uint32_t posted;
    _Atomic uint32_t state;
    const void *ptr;
    size_t bytes;
    _Atomic uint32_t taken __attribute__((aligned(SUMO__CACHELINE)));
} __attribute__((aligned(SUMO__CACHELINE))) mailbox;

typedef struct threads_group {
    int size;
    _Atomic int live_handles;
    sumo__shm_ctl *ctl;
    mailbox *boxes; /* boxes[src * size + dst] */
} threads_group;

typedef struct threads_transport {
    sumo__transport base;
    sumo__shm shm;
    threads_group *group;
} threads_transport;

static mailbox *box(threads_group *g, int src, int dst) { return &g->boxes[(size_t)src * g->size + dst]; }

/* A sender leaving with an error takes its message back, or waits out the copy in flight. */
static void retract(mailbox *out, uint32_t my_post)
{
    uint32_t posted = MAIL_POSTED;
    if (atomic_compare_exchange_strong(&out->state, &posted, MAIL_IDLE)) return;
    while (atomic_load_explicit(&out->taken, memory_order_acquire) != my_post) sched_yield();
}

static sumo_result threads_sendrecv(sumo__transport *tp, const void *sbuf, size_t sbytes, int dst,
                                    void *rbuf, size_t rbytes, int src)
{
    threads_transport *t = (threads_transport *)tp;
    threads_group *g = t->group;
    int64_t deadline = sumo__now_ns() + tp->timeout_ns;
    uint32_t my_post = 0;
    mailbox *out = dst >= 0 ? box(g, tp->rank, dst) : NULL;
    if (out) {
        out->ptr = sbuf;
        out->bytes = sbytes;
        atomic_store_explicit(&out->state, MAIL_POSTED, memory_order_relaxed);
        my_post = atomic_load_explicit(&out->posted, memory_order_relaxed) + 1;
        atomic_store_explicit(&out->posted, my_post, memory_order_release);
        sumo__shm_wake(&t->shm, &out->posted);
    }
    sumo_result r = SUMO_SUCCESS;
    if (src >= 0) {
        mailbox *in = box(g, src, tp->rank);
        uint32_t taken = atomic_load_explicit(&in->taken, memory_order_relaxed);
        r = sumo__shm_wait_change(tp, &t->shm, &in->posted, taken, src, deadline, "receive");
        uint32_t posted = MAIL_POSTED;
        if (r == SUMO_SUCCESS && !atomic_compare_exchange_strong(&in->state, &posted, MAIL_COPYING))
            r = SUMO__FAIL(tp, SUMO_ERR_PEER_FAILURE, "receive from rank %d: it withdrew its message",
                           src);
        if (r == SUMO_SUCCESS) {
            if (in->bytes != rbytes)
                r = SUMO__FAIL(tp, SUMO_ERR_INTERNAL,
                               "receive from rank %d: expected %zu bytes, peer sent %zu", src,
                               rbytes, in->bytes);
            else if (rbytes)
                memcpy(rbuf, in->ptr, rbytes);
            atomic_store_explicit(&in->state, MAIL_IDLE, memory_order_relaxed);
            atomic_store_explicit(&in->taken, taken + 1, memory_order_release);
            sumo__shm_wake(&t->shm, &in->taken);
        }
    }
    if (out && r == SUMO_SUCCESS)
        r = sumo__shm_wait_change(tp, &t->shm, &out->taken, my_post - 1, dst, deadline, "send");
    if (out && r != SUMO_SUCCESS) retract(out, my_post);
    return r;
}

static sumo_result threads_announce(sumo__transport *tp, const void *record, void *all, size_t bytes)
{
    return sumo__shm_announce(tp, &((threads_transport *)tp)->shm, record, all, bytes);
}

static sumo_result threads_barrier(sumo__transport *tp)
{
    return sumo__shm_barrier(tp, &((threads_transport *)tp)->shm);
}

static void *threads_peer_buffer(sumo__transport *tp, int rank, uint64_t address)
{
    (void)tp;
    (void)rank;
    return (void *)(uintptr_t)address;
}

static void threads_abort(sumo__transport *tp)
{
    threads_transport *t = (threads_transport *)tp;
    sumo__shm_abort(&t->shm, tp->rank);
}

static void threads_busy(sumo__transport *tp, bool busy)
{
    sumo__shm_busy(&((threads_transport *)tp)->shm, busy);
}

static sumo_result threads_settle(sumo__transport *tp)
{
    return sumo__shm_settle(tp, &((threads_transport *)tp)->shm);
}

static void group_release(threads_group *g)
{
    if (atomic_fetch_sub(&g->live_handles, 1) != 1) return;
    free(g->ctl);
    free(g->boxes);
    free(g);
}

static sumo_result threads_destroy(sumo__transport *tp)
{
    threads_transport *t = (threads_transport *)tp;
    /* A rank that leaves can no longer take part in anything: peers still waiting for it
     * must fail now rather than at their deadline, but peers waiting on each other to finish
     * a collective this rank has already finished must not. */
    if (tp->size > 1) sumo__shm_depart(&t->shm, tp->rank);
    group_release(t->group);
    free(t);
    return SUMO_SUCCESS;
}

/* The new group's handles, from the rank that decided to each member; the last to take its
 * own frees the table. */
typedef struct threads_handoff {
    sumo__transport **tps;
    _Atomic int left;
} threads_handoff;

static sumo_result threads_decide(void *ctx, const sumo__shrink_verdict *v, void **handoff)
{
    const sumo__transport *old = ctx;
    sumo__env env = {.timeout_s = (double)old->timeout_ns / 1e9, .log_level = old->log_level};
    threads_handoff *h = calloc(1, sizeof *h);
    if (h) h->tps = calloc((size_t)v->size, sizeof *h->tps);
    if (h == NULL || h->tps == NULL || sumo__threads_transport_create(v->size, &env, h->tps) != SUMO_SUCCESS) {
        if (h) free(h->tps);
        free(h);
        return SUMO_ERR_SYSTEM;
    }
    atomic_store(&h->left, v->size);
    *handoff = h;
    return SUMO_SUCCESS;
}

static sumo_result threads_shrink(sumo__transport *tp, const sumo__shrink_args *args,
                                  sumo__transport **out, sumo__shrink_verdict *verdict)
{
    threads_transport *t = (threads_transport *)tp;
    void *given = NULL;
    /* Nothing can fail between the verdict and the new group (it is made whole by the decider),
     * so one round is all a threads group ever needs. */
    SUMO__CHECK(sumo__shm_shrink_agree(tp, &t->shm, ++t->shm.shrinks, args->value,
                                       sumo__now_ns() + tp->timeout_ns, threads_decide, tp,
                                       verdict, &given));
    threads_handoff *h = given;
    *out = h->tps[verdict->rank];
    if (atomic_fetch_sub(&h->left, 1) == 1) {
        free(h->tps);
        free(h);
    }
    return SUMO_SUCCESS;
}

static const sumo__transport_ops threads_ops = {
    .name = "threads",
    .sendrecv = threads_sendrecv,
    .announce = threads_announce,
    .barrier = threads_barrier,
    .peer_buffer = threads_peer_buffer,
    .abort = threads_abort,
    .destroy = threads_destroy,
    .shrink = threads_shrink,
    .busy = threads_busy,
    .settle = threads_settle,
};

static void *aligned_zalloc(size_t bytes)
{
    size_t rounded = (bytes + SUMO__CACHELINE - 1) / SUMO__CACHELINE * SUMO__CACHELINE;
    void *p = aligned_alloc(SUMO__CACHELINE, rounded);
    if (p) memset(p, 0, rounded);
    return p;
}

sumo_result sumo__threads_transport_create(int nranks, const sumo__env *env,
                                           sumo__transport **tps)
{
    threads_group *g = calloc(1, sizeof *g);
    if (g == NULL) return SUMO_ERR_SYSTEM;
    g->size = nranks;
    g->ctl = aligned_zalloc(sumo__shm_ctl_bytes(nranks));
    g->boxes = aligned_zalloc(sizeof(mailbox) * (size_t)nranks * (size_t)nranks);
    if (g->ctl == NULL || g->boxes == NULL) {
        free(g->ctl);
        free(g->boxes);
        free(g);
        return SUMO_ERR_SYSTEM;
    }
    sumo__shm_ctl_init(g->ctl, nranks);
    uint32_t spin_limit = sumo__shm_default_spin_limit(nranks);
    int log_level = env->log_level;
    int64_t timeout_ns = (int64_t)(env->timeout_s * 1e9);
    for (int r = 0; r < nranks; r++) {
        threads_transport *t = aligned_zalloc(sizeof *t);
        if (t == NULL) {
            /* Ranks made so far are released like any departing rank. */
            for (int k = 0; k < r; k++) threads_destroy(tps[k]);
            if (r == 0) {
                free(g->ctl);
                free(g->boxes);
                free(g);
            }
            return SUMO_ERR_SYSTEM;
        }
        atomic_fetch_add(&g->live_handles, 1);
        t->group = g;
        t->shm = (sumo__shm){.ctl = g->ctl,
                             .rank = r,
                             .size = nranks,
                             .same_address_space = true,
                             .spin_limit = spin_limit};
        t->base = (sumo__transport){.ops = &threads_ops,
                                    .rank = r,
                                    .size = nranks,
                                    .timeout_ns = timeout_ns,
                                    .log_level = log_level,
                                    .node_local_size = nranks,
                                    .reach = SUMO__REACH_DIRECT};
        tps[r] = &t->base;
    }
    return SUMO_SUCCESS;
}
