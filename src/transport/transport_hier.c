/*
 * The composed transport of a two-level communicator (transport_hier.h). It moves bytes over
 * its children's transports and owns none of them.
 *
 * Why the announce synchronises every rank: a rank returns from it after its node's announce
 * (every node peer has announced) and after receiving, directly or through the exchange's
 * relays, the node block of every other node, which each across peer sends only once its own
 * node's announce returned. Every rank of every node has therefore announced.
 */
#include "transport/transport_hier.h"

#include <stdlib.h>
#include <string.h>

typedef struct hier_tp {
    sumo__transport base;
    sumo__transport *node, *across[SUMO__HIER_MAX_ACROSS], *any;
    int nacross;
    int L, l, H, h;
    bool flat;
    unsigned char *blocks; /* the announce's exchange: H node blocks of L records */
} hier_tp;

static hier_tp *as_hier(sumo__transport *tp) { return (hier_tp *)(void *)tp; }

static const char *level_name(const hier_tp *t, const sumo__transport *child)
{
    return child == t->node ? "node" : child == t->any ? "all-ranks" : "across";
}

/* A child's failure, in the composition's status with the child's own message (which breaks
 * the composition and aborts every child where the code says so, as any failure does). */
static sumo_result child_failed(hier_tp *t, sumo__transport *child, sumo_result r,
                                const char *what)
{
    if (r == SUMO_SUCCESS) return r;
    const char *m = child->status ? child->status->message : "";
    return SUMO__FAIL(&t->base, r, "%s on the %s communicator (node %d, local rank %d): %s", what,
                      level_name(t, child), t->h, t->l, m);
}

sumo__transport *sumo__hier_tp_route(sumo__transport *tp, int peer, int *peer_rank)
{
    hier_tp *t = as_hier(tp);
    if (peer / t->L == t->h) {
        *peer_rank = peer % t->L;
        return t->node;
    }
    if (peer % t->L == t->l) {
        *peer_rank = peer / t->L;
        return t->across[0];
    }
    *peer_rank = peer;
    return t->any;
}

static sumo_result route_pair(hier_tp *t, int dst, int src, sumo__transport **via, int *d, int *s)
{
    sumo__transport *a = NULL, *b = NULL;
    *d = *s = -1;
    if (t->flat) {
        *via = t->any;
        *d = dst, *s = src;
        return SUMO_SUCCESS;
    }
    if (dst >= 0) a = sumo__hier_tp_route(&t->base, dst, d);
    if (src >= 0) b = sumo__hier_tp_route(&t->base, src, s);
    if ((dst >= 0 && a == NULL) || (src >= 0 && b == NULL))
        return SUMO__FAIL(&t->base, SUMO_ERR_INTERNAL,
                          "rank pair (%d, %d) unreachable: neither on one node nor at one local "
                          "rank, and the two-level communicator has no options.any",
                          t->base.rank, dst >= 0 && a == NULL ? dst : src);
    if (a && b && a != b)
        return SUMO__FAIL(&t->base, SUMO_ERR_INTERNAL,
                          "sendrecv to rank %d and from rank %d: they are on different levels "
                          "(%s, %s)", dst, src, level_name(t, a), level_name(t, b));
    *via = a ? a : b;
    return SUMO_SUCCESS;
}

static sumo_result hier_sendrecv(sumo__transport *tp, const void *sbuf, size_t sbytes, int dst,
                                 void *rbuf, size_t rbytes, int src)
{
    hier_tp *t = as_hier(tp);
    sumo__transport *via;
    int d, s;
    SUMO__CHECK(route_pair(t, dst, src, &via, &d, &s));
    if (via == NULL) return SUMO_SUCCESS; /* neither direction */
    return child_failed(t, via, via->ops->sendrecv(via, sbuf, sbytes, d, rbuf, rbytes, s),
                        "sendrecv");
}

static sumo_result hier_sendrecv_working(sumo__transport *tp, const void *sbuf, size_t sbytes,
                                         int dst, void *rbuf, size_t rbytes, int src,
                                         bool (*work)(void *ctx), void *ctx)
{
    hier_tp *t = as_hier(tp);
    sumo__transport *via;
    int d, s;
    SUMO__CHECK(route_pair(t, dst, src, &via, &d, &s));
    if (via == NULL) return SUMO_SUCCESS;
    /* The caller (sumo__sendrecv_working) finishes what work is left. */
    sumo_result r = via->ops->sendrecv_working
                        ? via->ops->sendrecv_working(via, sbuf, sbytes, d, rbuf, rbytes, s, work, ctx)
                        : via->ops->sendrecv(via, sbuf, sbytes, d, rbuf, rbytes, s);
    return child_failed(t, via, r, "sendrecv");
}

static sumo_result hier_announce(sumo__transport *tp, const void *record, void *all, size_t bytes)
{
    hier_tp *t = as_hier(tp);
    size_t block = (size_t)t->L * bytes;
    SUMO__CHECK(child_failed(t, t->node, t->node->ops->announce(t->node, record, t->blocks, bytes),
                             "the announce"));
    /* Bruck's allgather of the node blocks across: after the step of distance k, blocks[i] is
     * node (h + i)'s block for every i < 2k. */
    sumo__transport *x = t->across[0];
    int H = t->H;
    for (int k = 1; k < H; k <<= 1) {
        int n = k < H - k ? k : H - k;
        SUMO__CHECK(child_failed(t, x,
                                 x->ops->sendrecv(x, t->blocks, (size_t)n * block, (t->h - k + H) % H,
                                                  t->blocks + (size_t)k * block, (size_t)n * block,
                                                  (t->h + k) % H),
                                 "the announce's exchange"));
    }
    unsigned char *out = all;
    for (int i = 0; i < H; i++)
        memcpy(out + (size_t)((t->h + i) % H) * block, t->blocks + (size_t)i * block, block);
    return SUMO_SUCCESS;
}

static sumo_result hier_barrier(sumo__transport *tp)
{
    hier_tp *t = as_hier(tp);
    SUMO__CHECK(child_failed(t, t->node, t->node->ops->barrier(t->node), "the barrier"));
    return child_failed(t, t->across[0], t->across[0]->ops->barrier(t->across[0]), "the barrier");
}

static void hier_abort(sumo__transport *tp)
{
    hier_tp *t = as_hier(tp);
    t->node->ops->abort(t->node);
    for (int i = 0; i < t->nacross; i++) t->across[i]->ops->abort(t->across[i]);
    if (t->any) t->any->ops->abort(t->any);
}

static sumo_result hier_destroy(sumo__transport *tp)
{
    hier_tp *t = as_hier(tp);
    free(t->blocks);
    free(t);
    return SUMO_SUCCESS;
}

/* Whether a level moves memory m: it carries it, or its ranks share an address space. */
static bool level_moves(sumo__transport *x, const char *memory)
{
    return x->reach == SUMO__REACH_DIRECT || (x->ops->carries && x->ops->carries(x, memory)) ||
           (x->reach == SUMO__REACH_STAGED && x->ops->board != NULL);
}

static bool hier_carries(sumo__transport *tp, const char *memory)
{
    hier_tp *t = as_hier(tp);
    if (!level_moves(t->node, memory)) return false;
    for (int i = 0; i < t->nacross; i++)
        if (level_moves(t->across[i], memory)) return true;
    return false;
}

/* Only node peers write into this rank's buffers (the across levels move messages). */
static void hier_busy(sumo__transport *tp, bool busy)
{
    hier_tp *t = as_hier(tp);
    if (t->node->ops->busy) t->node->ops->busy(t->node, busy);
}

static sumo_result hier_settle(sumo__transport *tp)
{
    hier_tp *t = as_hier(tp);
    if (t->node->ops->settle == NULL) return SUMO_SUCCESS;
    return child_failed(t, t->node, t->node->ops->settle(t->node), "settling");
}

static const sumo__transport_ops hier_ops = {
    .name = "hierarchical",
    .sendrecv = hier_sendrecv,
    .sendrecv_working = hier_sendrecv_working,
    .announce = hier_announce,
    .barrier = hier_barrier,
    .abort = hier_abort,
    .destroy = hier_destroy,
    .carries = hier_carries,
    .busy = hier_busy,
    .settle = hier_settle,
};

/* Without busy and settle on the node, a failed call's output cannot be restored. */
static const sumo__transport_ops hier_ops_unsettled = {
    .name = "hierarchical",
    .sendrecv = hier_sendrecv,
    .sendrecv_working = hier_sendrecv_working,
    .announce = hier_announce,
    .barrier = hier_barrier,
    .abort = hier_abort,
    .destroy = hier_destroy,
    .carries = hier_carries,
};

/* A call runs on the caller's thread when any level demands it (sumo__transport). */
static void bind_threads(hier_tp *t)
{
    bool only = t->node->caller_thread_only || (t->any && t->any->caller_thread_only);
    for (int i = 0; i < t->nacross; i++)
        only = only || (t->across[i] && t->across[i]->caller_thread_only);
    t->base.caller_thread_only = only;
}

sumo_result sumo__hier_tp_create(const sumo__hier_links *links, sumo__transport **out)
{
    hier_tp *t = calloc(1, sizeof *t);
    if (t == NULL) return SUMO_ERR_SYSTEM;
    size_t bytes = (size_t)links->H * (size_t)links->L * SUMO__ANNOUNCE_BYTES;
    t->blocks = malloc(bytes);
    if (t->blocks == NULL) {
        free(t);
        return SUMO_ERR_SYSTEM;
    }
    t->node = links->node;
    t->across[0] = links->across;
    t->nacross = 1;
    t->any = links->any;
    t->L = links->L, t->l = links->l, t->H = links->H, t->h = links->h;
    bool settles = t->node->ops->busy != NULL && t->node->ops->settle != NULL;
    t->base = (sumo__transport){
        .ops = settles ? &hier_ops : &hier_ops_unsettled,
        .rank = t->h * t->L + t->l,
        .size = t->H * t->L,
        .timeout_ns = t->node->timeout_ns,
        .log_level = t->node->log_level,
        .node_local_size = t->L,
        .reach = SUMO__REACH_NONE,
    };
    bind_threads(t);
    *out = &t->base;
    return SUMO_SUCCESS;
}

sumo_result sumo__hier_tp_add_across(sumo__transport *tp, sumo__transport *across)
{
    hier_tp *t = as_hier(tp);
    if (t->nacross == SUMO__HIER_MAX_ACROSS) return SUMO_ERR_INVALID_USAGE;
    t->across[t->nacross++] = across;
    bind_threads(t);
    return SUMO_SUCCESS;
}

void sumo__hier_tp_drop_across(sumo__transport *tp)
{
    hier_tp *t = as_hier(tp);
    if (t->nacross > 1) t->nacross--;
    bind_threads(t);
}

void sumo__hier_tp_flat(sumo__transport *tp, bool flat)
{
    /* Without options.any the levels route every pair they can (all of them with one rank per
     * node or one node); the callers refuse what they cannot. */
    hier_tp *t = as_hier(tp);
    t->flat = flat && t->any != NULL;
}
