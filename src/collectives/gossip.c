/*
 * Gossip rounds (sumo_gossip.h): push-sum over the dynamic directed exponential graph or the
 * caller's, and D-PSGD's symmetric mixing. A round is a composite call on the one path
 * (execute.h): queued behind the handle's requests, agreed like every collective (count,
 * dtype, memory, then the graph and the round compared here, on every rank alike), its bytes
 * moved by the transport's sendrecv and its arithmetic done by the kernel table of the memory
 * the numerator lives in. The transport must carry that memory (sendrecv moves it).
 *
 * Schedule of a round without deadlock on any graph: every rank walks the offsets o = 1 ..
 * n - 1 in the same order; at offset o it sends to r + o when r + o is its out-peer and
 * receives from r - o when it is r - o's, in one sendrecv. The peer of either half is at the
 * same offset, so every exchange meets its partner, as in a pairwise exchange. Offsets no
 * rank uses are skipped (the built-in graph visits only its p offsets).
 *
 * Rank gossip on a two-level communicator runs flat, every message over its options.any.
 * Per node, the graph's ranks are the nodes of a two-level communicator: node h's local rank l
 * walks the node offsets with its peers' local rank l (the composed transport's sendrecv takes
 * those pairs over the across level), after the node's average on the node level.
 */
#include "sumo_gossip.h"

#include "collectives/collectives.h"
#include "collectives/requests.h"
#include "collectives/gossip_graph.h"
#include "collectives/hier_levels.h"
#include "transport/transport_hier.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

struct sumo_gossip {
    sumo_comm *comm;
    sumo__gossip_graph graph;
    size_t count;
    sumo_dtype dtype;
    size_t bytes; /* of the numerator */
    int staleness;
    uint64_t hash; /* options, graph, count, dtype: what every rank must share */
    bool per_node;
    int L, l; /* per node: the node's ranks and this one's place (else 1 and 0) */
    double w;
    uint64_t round; /* rounds started */
    /* The numerator's memory, bound at the first round; the buffers live there. */
    sumo__exec x;
    bool bound;
    void *sbuf, *rbuf, *acc;
    /* A round in flight: its request, or (arrived) already complete with its sum in acc. */
    sumo_request *req;
    bool in_flight, arrived;
    int ticks; /* overlap calls since the round in flight started */
    double wacc; /* the weights received */
    unsigned char *loaded; /* a loaded state's sum, before the memory is bound */
    sumo_comm_stats stats;
};

/* The communicator's rank of the graph's vertex v (a node per node, else a rank). */
static int rank_of(const sumo_gossip *g, int v) { return v * g->L + g->l; }

typedef struct round_args {
    sumo_gossip *g;
    uint64_t round;
} round_args;

sumo_result sumo_gossip_options_default(sumo_gossip_options *o)
{
    if (o == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *o = (sumo_gossip_options){.struct_size = sizeof *o, .mode = SUMO_GOSSIP_PUSH_SUM,
                               .peers = 1, .staleness = 1};
    return SUMO_SUCCESS;
}

/* ---- the round, holding the handle ---------------------------------------------------------- */

static sumo_result exchange(sumo_comm *c, sumo_gossip *g, uint64_t round)
{
    sumo__transport *tp = c->tp;
    const sumo__gossip_graph *gr = &g->graph;
    int n = gr->size, me = gr->rank;
    bool symmetric = gr->mode == SUMO_GOSSIP_SYMMETRIC;
    SUMO__KCHECK(c, sumo__k_fill(&g->x, g->dtype, g->acc, 0.0, g->count));
    double wacc = 0.0;
    for (int o = 1; o < n; o++) {
        int to = (me + o) % n, from = (me - o + n) % n;
        bool send = sumo__gossip_sends(gr, round, me, to);
        bool recv = sumo__gossip_sends(gr, round, from, me);
        if (!send && !recv) continue;
        int dst = send ? rank_of(g, to) : -1, src = recv ? rank_of(g, from) : -1;
        SUMO__CHECK(tp->ops->sendrecv(tp, g->sbuf, send ? g->bytes : 0, dst, g->rbuf,
                                      recv ? g->bytes : 0, src));
        if (!symmetric) {
            /* The weight travels apart from the numerator: the numerator may be device memory,
             * the weight is the host's. */
            double win = 0.0, wout = g->w;
            SUMO__CHECK(tp->ops->sendrecv(tp, &wout, send ? sizeof wout : 0, dst, &win,
                                          recv ? sizeof win : 0, src));
            wacc += win;
        }
        if (recv) SUMO__KCHECK(c, sumo__k_add(&g->x, g->dtype, g->acc, g->acc, g->rbuf, g->count));
    }
    g->wacc = wacc;
    return SUMO_SUCCESS;
}

static sumo_result round_run(sumo_comm *c, void *args)
{
    round_args a;
    memcpy(&a, args, sizeof a);
    sumo_gossip *g = a.g;
    sumo__transport *tp = c->tp;
    SUMO__CHECK(sumo__usable(c));
    c->x = g->x;
    sumo__call_desc d = {.kind = SUMO__CALL_GOSSIP, .dtype = (uint32_t)g->dtype,
                         .count = g->count, .memory = sumo__memory_id(g->x.k),
                         .sendptr = g->hash, .recvptr = a.round};
    if (g->x.k != sumo__host_kernels() &&
        !(tp->ops->carries && tp->ops->carries(tp, g->x.k->memory)))
        d.local_error = SUMO__COMM_FAIL(c, SUMO_ERR_INVALID_USAGE,
                                        "gossip round: the %s transport cannot move %s memory "
                                        "(its sendrecv does not carry it)",
                                        tp->ops->name, g->x.k->memory);
    const sumo__call_desc *all;
    SUMO__CHECK(sumo__agree_named(c, &d, &all, "gossip round"));
    for (int r = 0; r < tp->size; r++) {
        if (all[r].sendptr != d.sendptr)
            return SUMO__FAIL_TOGETHER(tp, SUMO_ERR_MISMATCH,
                                       "gossip round: rank %d's options or graph differ from "
                                       "rank %d's (hash %016llx vs %016llx)",
                                       r, tp->rank, (unsigned long long)all[r].sendptr,
                                       (unsigned long long)d.sendptr);
        if (all[r].recvptr != d.recvptr)
            return SUMO__FAIL_TOGETHER(tp, SUMO_ERR_MISMATCH,
                                       "gossip round: rank %d is at round %llu, rank %d at "
                                       "round %llu",
                                       r, (unsigned long long)all[r].recvptr, tp->rank,
                                       (unsigned long long)d.recvptr);
    }
    atomic_fetch_add_explicit(&c->rounds, 1, memory_order_relaxed);
    /* Rank gossip on a two-level communicator pairs ranks of any two places: every message
     * goes over options.any (create required it), as a flat algorithm's do. */
    bool flat = c->levels && !g->per_node;
    if (flat) sumo__hier_tp_flat(tp, true);
    sumo_result r = exchange(c, g, a.round);
    if (flat) sumo__hier_tp_flat(tp, false);
    return r;
}

typedef struct node_args {
    sumo_gossip *g;
    void *x;
} node_args;

/* Per node: x becomes the node's average, on the node level in order with the parent's calls. */
static sumo_result node_average_run(sumo_comm *c, void *args)
{
    node_args a;
    memcpy(&a, args, sizeof a);
    c->x = a.g->x;
    sumo_collective call = {.struct_size = sizeof call, .kind = SUMO_COLLECTIVE_ALLREDUCE,
                            .sendbuf = a.x, .recvbuf = a.x, .count = a.g->count,
                            .dtype = a.g->dtype, .op = SUMO_OP_AVERAGE, .stream = c->x.stream};
    return sumo__level_run(c, c->levels->node, &call, "gossip: the node's average");
}

static sumo_result node_average(sumo_gossip *g, void *x)
{
    if (!g->per_node) return SUMO_SUCCESS;
    node_args a = {.g = g, .x = x};
    sumo__call call = sumo__composite(node_average_run, &a, sizeof a);
    return sumo__submit(g->comm, &call, NULL);
}

/* ---- the caller's side ------------------------------------------------------------------ */

static sumo_result bind_memory(sumo_gossip *g, const void *x)
{
    sumo_comm *c = g->comm;
    if (x == NULL && g->count > 0)
        return SUMO__COMM_FAIL(c, SUMO_ERR_INVALID_ARGUMENT, "gossip: NULL numerator with "
                               "count %zu", g->count);
    const sumo_kernel_table *k = g->bytes ? sumo__kernels_for(c, x, g->bytes) : sumo__host_kernels();
    if (g->bound) {
        if (k != g->x.k)
            return SUMO__COMM_FAIL(c, SUMO_ERR_INVALID_ARGUMENT,
                                   "gossip: the numerator is %s memory, earlier rounds' was %s",
                                   k->memory, g->x.k->memory);
        return SUMO_SUCCESS;
    }
    g->x = (sumo__exec){.k = k, .stream = NULL};
    void **bufs[3] = {&g->sbuf, &g->rbuf, &g->acc};
    for (int i = 0; i < 3; i++) {
        sumo_result r = k->alloc(k->ctx, g->bytes ? g->bytes : 1, bufs[i]);
        if (r != SUMO_SUCCESS) {
            for (int j = 0; j < i; j++) k->release(k->ctx, *bufs[j]);
            return SUMO__COMM_FAIL(c, r, "gossip: cannot allocate %zu bytes of %s memory",
                                   g->bytes, k->memory);
        }
    }
    g->bound = true;
    if (g->loaded) {
        sumo_result r = sumo__k_copy(&g->x, g->acc, g->loaded, g->bytes);
        free(g->loaded);
        g->loaded = NULL;
        if (r != SUMO_SUCCESS) return r;
    }
    return SUMO_SUCCESS;
}

static sumo_result submit_round(sumo_gossip *g, sumo_request **req)
{
    round_args a = {.g = g, .round = g->round};
    sumo__call call = sumo__composite(round_run, &a, sizeof a);
    g->round++;
    return sumo__submit(g->comm, &call, req);
}

static void count_round(sumo_gossip *g, uint64_t round)
{
    int deg = sumo__gossip_out_degree(&g->graph, round, g->graph.rank);
    g->stats.rounds++;
    g->stats.bytes += (uint64_t)deg * g->bytes;
}

sumo_result sumo_gossip_start(sumo_gossip *g, void *x)
{
    if (g == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    if (g->graph.mode == SUMO_GOSSIP_SYMMETRIC)
        return SUMO__COMM_FAIL(g->comm, SUMO_ERR_INVALID_USAGE,
                               "gossip: the symmetric mode (D-PSGD) has blocking rounds only");
    if (g->in_flight)
        return SUMO__COMM_FAIL(g->comm, SUMO_ERR_INVALID_USAGE,
                               "gossip: round %llu is still in flight; finish it first",
                               (unsigned long long)(g->round - 1));
    SUMO__CHECK(bind_memory(g, x));
    SUMO__CHECK(node_average(g, x));
    int deg = sumo__gossip_out_degree(&g->graph, g->round, g->graph.rank);
    /* Keep this rank's share; the same share goes to each out-peer. */
    SUMO__CHECK(sumo__k_divide(&g->x, g->dtype, x, x, g->count, deg + 1));
    SUMO__CHECK(sumo__k_copy(&g->x, g->sbuf, x, g->bytes));
    g->w /= deg + 1;
    count_round(g, g->round);
    SUMO__CHECK(submit_round(g, &g->req));
    g->in_flight = true;
    g->arrived = false;
    g->ticks = 0;
    return SUMO_SUCCESS;
}

static sumo_result complete(sumo_gossip *g)
{
    if (g->arrived) return SUMO_SUCCESS;
    sumo_result r = sumo_request_wait(g->req);
    g->req = NULL;
    if (r != SUMO_SUCCESS) {
        g->in_flight = false;
        return r;
    }
    g->arrived = true;
    return SUMO_SUCCESS;
}

sumo_result sumo_gossip_finish(sumo_gossip *g, void *x)
{
    if (g == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    if (!g->in_flight)
        return SUMO__COMM_FAIL(g->comm, SUMO_ERR_INVALID_USAGE, "gossip: no round in flight");
    SUMO__CHECK(complete(g));
    SUMO__CHECK(bind_memory(g, x));
    g->in_flight = g->arrived = false;
    SUMO__CHECK(sumo__k_add(&g->x, g->dtype, x, x, g->acc, g->count));
    g->w += g->wacc;
    return SUMO_SUCCESS;
}

sumo_result sumo_gossip_round(sumo_gossip *g, void *x)
{
    if (g == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    if (g->graph.mode == SUMO_GOSSIP_PUSH_SUM) {
        SUMO__CHECK(sumo_gossip_start(g, x));
        return sumo_gossip_finish(g, x);
    }
    if (g->in_flight) return SUMO_ERR_INTERNAL;
    SUMO__CHECK(bind_memory(g, x));
    SUMO__CHECK(node_average(g, x));
    int deg = sumo__gossip_out_degree(&g->graph, g->round, g->graph.rank);
    SUMO__CHECK(sumo__k_copy(&g->x, g->sbuf, x, g->bytes));
    count_round(g, g->round);
    SUMO__CHECK(submit_round(g, NULL));
    /* x = (x + the neighbours' sum) / (m + 1). */
    SUMO__CHECK(sumo__k_add(&g->x, g->dtype, x, x, g->acc, g->count));
    return sumo__k_divide(&g->x, g->dtype, x, x, g->count, deg + 1);
}

sumo_result sumo_gossip_overlap(sumo_gossip *g, void *x, int *communicated)
{
    if (g == NULL || communicated == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *communicated = 0;
    if (g->in_flight) {
        if (++g->ticks < g->staleness) return SUMO_SUCCESS;
        SUMO__CHECK(sumo_gossip_finish(g, x));
    }
    *communicated = 1;
    return sumo_gossip_start(g, x);
}

/* ---- create, destroy, queries ------------------------------------------------------------- */

sumo_result sumo_gossip_create(sumo_comm *comm, size_t count, sumo_dtype dtype,
                               const sumo_gossip_options *options, sumo_gossip **out)
{
    if (comm == NULL || out == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *out = NULL;
    sumo__transport *tp = comm->tp;
    sumo_gossip *g = calloc(1, sizeof *g);
    sumo_gossip_options def;
    sumo_gossip_options_default(&def);
    const sumo_gossip_options *o = options ? options : &def;
    sumo_result local = SUMO_SUCCESS;
    char why[256];
    if (g == NULL) local = SUMO__COMM_FAIL(comm, SUMO_ERR_SYSTEM, "gossip: out of memory");
    else if (SUMO__STRUCT_SIZE_PROBLEM(o, sumo_gossip_options, why, sizeof why))
        local = SUMO__COMM_FAIL(comm, SUMO_ERR_INVALID_ARGUMENT, "gossip: %s", why);
    else if (!sumo__dtype_valid((int)dtype) ||
             sumo__mul_overflows(count, sumo__dtype_bytes(dtype), &g->bytes))
        local = SUMO__COMM_FAIL(comm, SUMO_ERR_INVALID_ARGUMENT,
                                "gossip: dtype %d or count %zu invalid", (int)dtype, count);
    else if (o->staleness < 1)
        local = SUMO__COMM_FAIL(comm, SUMO_ERR_INVALID_ARGUMENT,
                                "gossip: staleness %d, must be >= 1", o->staleness);
    else if (o->per_node != 0 && o->per_node != 1)
        local = SUMO__COMM_FAIL(comm, SUMO_ERR_INVALID_ARGUMENT,
                                "gossip: per_node %d, must be 0 or 1", o->per_node);
    else if (o->per_node && comm->levels == NULL)
        local = SUMO__COMM_FAIL(comm, SUMO_ERR_INVALID_ARGUMENT,
                                "gossip: per_node needs a two-level communicator "
                                "(sumo_comm_create_hier); this one is flat");
    else if (!o->per_node && comm->levels && comm->levels->any == NULL)
        local = SUMO__COMM_FAIL(comm, SUMO_ERR_INVALID_USAGE,
                                "gossip: a two-level communicator without options.any cannot "
                                "pair ranks of other nodes and other local ranks; give it one, "
                                "or gossip per node (per_node = 1)");
    else if (o->per_node && comm->levels->H < 2)
        local = SUMO__COMM_FAIL(comm, SUMO_ERR_INVALID_ARGUMENT,
                                "gossip: per_node needs at least 2 nodes (this communicator is "
                                "one node of %d ranks)", comm->levels->L);
    else if (o->per_node)
        local = sumo__gossip_graph_init(&g->graph, comm, o, comm->levels->h, comm->levels->H);
    else
        local = sumo__gossip_graph_init(&g->graph, comm, o, tp->rank, tp->size);
    uint64_t hash = SUMO__FNV_OFFSET;
    if (local == SUMO_SUCCESS) {
        hash = sumo__gossip_graph_hash(&g->graph);
        hash = sumo__fnv1a(hash, &count, sizeof count);
        hash = sumo__fnv1a(hash, &dtype, sizeof dtype);
        hash = sumo__fnv1a(hash, &o->staleness, sizeof o->staleness);
        hash = sumo__fnv1a(hash, &o->per_node, sizeof o->per_node);
    }
    sumo_result r = sumo__agree_setup(comm, local, hash, "gossip");
    if (r != SUMO_SUCCESS) {
        if (g) sumo__gossip_graph_free(&g->graph);
        free(g);
        return r;
    }
    g->comm = comm;
    g->count = count;
    g->dtype = dtype;
    g->staleness = o->staleness;
    g->hash = hash;
    g->per_node = o->per_node != 0;
    g->L = g->per_node ? comm->levels->L : 1;
    g->l = g->per_node ? comm->levels->l : 0;
    g->w = 1.0;
    *out = g;
    return SUMO_SUCCESS;
}

sumo_result sumo_gossip_destroy(sumo_gossip *g)
{
    if (g == NULL) return SUMO_SUCCESS;
    sumo_result r = SUMO_SUCCESS;
    if (g->in_flight && !g->arrived) r = sumo_request_wait(g->req);
    if (g->bound) {
        g->x.k->release(g->x.k->ctx, g->sbuf);
        g->x.k->release(g->x.k->ctx, g->rbuf);
        g->x.k->release(g->x.k->ctx, g->acc);
    }
    free(g->loaded);
    sumo__gossip_graph_free(&g->graph);
    free(g);
    return r;
}

sumo_result sumo_gossip_weight(const sumo_gossip *g, double *weight)
{
    if (g == NULL || weight == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *weight = g->w;
    return SUMO_SUCCESS;
}

sumo_result sumo_gossip_in_flight(const sumo_gossip *g, int *in_flight)
{
    if (g == NULL || in_flight == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *in_flight = g->in_flight;
    return SUMO_SUCCESS;
}

sumo_result sumo_gossip_round_index(const sumo_gossip *g, uint64_t *round)
{
    if (g == NULL || round == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *round = g->round;
    return SUMO_SUCCESS;
}

sumo_result sumo_gossip_out_peers(const sumo_gossip *g, uint64_t round, int *peers, int max,
                                  int *count)
{
    if (g == NULL || count == NULL || max < 0 || (max > 0 && peers == NULL))
        return SUMO_ERR_INVALID_ARGUMENT;
    int n = g->graph.size, me = g->graph.rank, k = 0;
    for (int o = 1; o < n; o++) {
        int to = (me + o) % n;
        if (!sumo__gossip_sends(&g->graph, round, me, to)) continue;
        if (k < max) peers[k] = rank_of(g, to);
        k++;
    }
    *count = k;
    return SUMO_SUCCESS;
}

sumo_result sumo_gossip_stats(const sumo_gossip *g, sumo_comm_stats *stats)
{
    if (g == NULL || stats == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *stats = g->stats;
    return SUMO_SUCCESS;
}

/* ---- state ------------------------------------------------------------------------------ */

enum { H_MAGIC, H_HASH, H_RANK, H_SIZE, H_ROUND, H_W, H_WACC, H_TICKS, H_FLIGHT, H_WORDS };
#define STATE_MAGIC 0x73756d6f67737031ull /* "sumogsp1" */

sumo_result sumo_gossip_state_size(const sumo_gossip *g, size_t *bytes)
{
    if (g == NULL || bytes == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *bytes = H_WORDS * sizeof(uint64_t) + g->bytes;
    return SUMO_SUCCESS;
}

sumo_result sumo_gossip_state_save(sumo_gossip *g, void *buffer, size_t bytes)
{
    size_t need;
    if (g == NULL || buffer == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    sumo_gossip_state_size(g, &need);
    if (bytes < need)
        return SUMO__COMM_FAIL(g->comm, SUMO_ERR_INVALID_ARGUMENT,
                               "gossip: state buffer of %zu bytes, %zu needed", bytes, need);
    if (g->in_flight) SUMO__CHECK(complete(g));
    uint64_t h[H_WORDS] = {STATE_MAGIC, g->hash, (uint64_t)g->graph.rank,
                           (uint64_t)g->graph.size, g->round, 0, 0, (uint64_t)g->ticks,
                           g->in_flight};
    memcpy(&h[H_W], &g->w, sizeof g->w);
    memcpy(&h[H_WACC], &g->wacc, sizeof g->wacc);
    unsigned char *p = buffer;
    memcpy(p, h, sizeof h);
    if (g->in_flight) SUMO__CHECK(sumo__k_copy(&g->x, p + sizeof h, g->acc, g->bytes));
    else memset(p + sizeof h, 0, g->bytes);
    return SUMO_SUCCESS;
}

sumo_result sumo_gossip_state_load(sumo_gossip *g, const void *buffer, size_t bytes)
{
    size_t need;
    if (g == NULL || buffer == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    sumo_gossip_state_size(g, &need);
    uint64_t h[H_WORDS];
    if (bytes < need)
        return SUMO__COMM_FAIL(g->comm, SUMO_ERR_INVALID_ARGUMENT,
                               "gossip: state of %zu bytes, %zu expected", bytes, need);
    memcpy(h, buffer, sizeof h);
    if (h[H_MAGIC] != STATE_MAGIC || h[H_HASH] != g->hash)
        return SUMO__COMM_FAIL(g->comm, SUMO_ERR_INVALID_ARGUMENT,
                               "gossip: the state is not of this graph, count and dtype");
    if (h[H_RANK] != (uint64_t)g->graph.rank || h[H_SIZE] != (uint64_t)g->graph.size)
        return SUMO__COMM_FAIL(g->comm, SUMO_ERR_INVALID_ARGUMENT,
                               "gossip: the state is rank %llu of %llu, this is rank %d of %d",
                               (unsigned long long)h[H_RANK], (unsigned long long)h[H_SIZE],
                               g->graph.rank, g->graph.size);
    if (g->in_flight && !g->arrived) SUMO__CHECK(complete(g));
    const unsigned char *body = (const unsigned char *)buffer + sizeof h;
    g->in_flight = g->arrived = h[H_FLIGHT] != 0;
    if (g->in_flight) {
        if (g->bound) SUMO__CHECK(sumo__k_copy(&g->x, g->acc, body, g->bytes));
        else {
            free(g->loaded);
            if ((g->loaded = malloc(g->bytes ? g->bytes : 1)) == NULL) return SUMO_ERR_SYSTEM;
            memcpy(g->loaded, body, g->bytes);
        }
    }
    g->round = h[H_ROUND];
    g->ticks = (int)h[H_TICKS];
    memcpy(&g->w, &h[H_W], sizeof g->w);
    memcpy(&g->wacc, &h[H_WACC], sizeof g->wacc);
    return SUMO_SUCCESS;
}
