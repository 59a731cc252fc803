/* The graphs of gossip rounds (gossip_graph.h). */
#include "collectives/gossip_graph.h"

#include <stdlib.h>
#include <string.h>

/* Adds offset o (mod n) to row unless it is 0 or already there. */
static void add_offset(int *row, int *len, long long o, int n)
{
    int v = (int)(((o % n) + n) % n);
    if (v == 0) return;
    for (int i = 0; i < *len; i++)
        if (row[i] == v) return;
    row[(*len)++] = v;
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

static sumo_result build_exponential(sumo__gossip_graph *g, sumo_comm *comm)
{
    int n = g->size, p = g->peers;
    /* K: the largest i with (p + 1)^i <= n - 1. */
    int K = 0;
    for (long long b = p + 1; b <= n - 1; b *= p + 1) K++;
    g->period = K + 1;
    g->stride = g->mode == SUMO_GOSSIP_SYMMETRIC ? 2 * p : p;
    g->offsets = malloc((size_t)g->period * (size_t)g->stride * sizeof *g->offsets);
    if (g->offsets == NULL) return SUMO__COMM_FAIL(comm, SUMO_ERR_SYSTEM, "gossip: out of memory");
    long long scale = 1;
    for (int i = 0; i < g->period; i++, scale *= p + 1) {
        int *row = g->offsets + (size_t)i * (size_t)g->stride, len = 0;
        for (int j = 1; j <= p; j++) {
            add_offset(row, &len, (long long)j * scale, n);
            if (g->mode == SUMO_GOSSIP_SYMMETRIC) add_offset(row, &len, -(long long)j * scale, n);
        }
        qsort(row, (size_t)len, sizeof *row, cmp_int);
        for (int k = len; k < g->stride; k++) row[k] = -1;
    }
    return SUMO_SUCCESS;
}

static sumo_result copy_table(sumo__gossip_graph *g, sumo_comm *comm, const sumo_gossip_options *o)
{
    int n = g->size;
    if (o->mode != SUMO_GOSSIP_PUSH_SUM)
        return SUMO__COMM_FAIL(comm, SUMO_ERR_INVALID_ARGUMENT,
                               "gossip: a caller's graph (rounds %d) needs the push-sum mode",
                               o->rounds);
    if (o->max_out < 1 || o->max_out > n - 1 || o->out_peers == NULL)
        return SUMO__COMM_FAIL(comm, SUMO_ERR_INVALID_ARGUMENT,
                               "gossip: a caller's graph needs out_peers and max_out in [1, "
                               "n - 1 = %d] (max_out %d%s)",
                               n - 1, o->max_out, o->out_peers ? "" : ", out_peers NULL");
    size_t entries = (size_t)o->rounds * (size_t)n * (size_t)o->max_out;
    g->rounds = o->rounds;
    g->max_out = o->max_out;
    g->period = o->rounds;
    if ((g->table = malloc(entries * sizeof *g->table)) == NULL)
        return SUMO__COMM_FAIL(comm, SUMO_ERR_SYSTEM, "gossip: out of memory");
    memcpy(g->table, o->out_peers, entries * sizeof *g->table);
    for (int k = 0; k < o->rounds; k++)
        for (int r = 0; r < n; r++) {
            const int *row = g->table + ((size_t)k * (size_t)n + (size_t)r) * (size_t)o->max_out;
            for (int j = 0; j < o->max_out; j++) {
                if (row[j] == -1) continue;
                if (row[j] < -1 || row[j] >= n || row[j] == r)
                    return SUMO__COMM_FAIL(comm, SUMO_ERR_INVALID_ARGUMENT,
                                           "gossip: out_peers of rank %d in round %d names %d "
                                           "(a rank in [0, %d) other than itself, or -1)",
                                           r, k, row[j], n);
                for (int i = 0; i < j; i++)
                    if (row[i] == row[j])
                        return SUMO__COMM_FAIL(comm, SUMO_ERR_INVALID_ARGUMENT,
                                               "gossip: out_peers of rank %d in round %d names "
                                               "rank %d twice",
                                               r, k, row[j]);
            }
        }
    return SUMO_SUCCESS;
}

sumo_result sumo__gossip_graph_init(sumo__gossip_graph *g, sumo_comm *comm,
                                    const sumo_gossip_options *o, int rank, int size)
{
    *g = (sumo__gossip_graph){.mode = o->mode, .rank = rank, .size = size, .peers = o->peers};
    if (size < 2)
        return SUMO__COMM_FAIL(comm, SUMO_ERR_INVALID_ARGUMENT,
                               "gossip: a group of %d rank has no peer to gossip with (n >= 2)",
                               size);
    if (o->mode != SUMO_GOSSIP_PUSH_SUM && o->mode != SUMO_GOSSIP_SYMMETRIC)
        return SUMO__COMM_FAIL(comm, SUMO_ERR_INVALID_ARGUMENT, "gossip: unknown mode %d",
                               (int)o->mode);
    if (o->rounds < 0)
        return SUMO__COMM_FAIL(comm, SUMO_ERR_INVALID_ARGUMENT, "gossip: rounds %d < 0",
                               o->rounds);
    if (o->rounds > 0) return copy_table(g, comm, o);
    if (o->peers < 1 || o->peers > size - 1)
        return SUMO__COMM_FAIL(comm, SUMO_ERR_INVALID_ARGUMENT,
                               "gossip: peers %d out of range [1, n - 1 = %d]", o->peers,
                               size - 1);
    return build_exponential(g, comm);
}

void sumo__gossip_graph_free(sumo__gossip_graph *g)
{
    free(g->offsets);
    free(g->table);
    g->offsets = g->table = NULL;
}

uint64_t sumo__gossip_graph_hash(const sumo__gossip_graph *g)
{
    uint64_t h = SUMO__FNV_OFFSET;
    int head[5] = {(int)g->mode, g->peers, g->period, g->rounds, g->max_out};
    h = sumo__fnv1a(h, head, sizeof head);
    if (g->table)
        h = sumo__fnv1a(h, g->table,
                        (size_t)g->rounds * (size_t)g->size * (size_t)g->max_out * sizeof(int));
    return h;
}

bool sumo__gossip_sends(const sumo__gossip_graph *g, uint64_t k, int from, int to)
{
    int n = g->size;
    size_t row_k = (size_t)(k % (uint64_t)g->period);
    if (g->table) {
        const int *row = g->table + (row_k * (size_t)n + (size_t)from) * (size_t)g->max_out;
        for (int j = 0; j < g->max_out; j++)
            if (row[j] == to) return true;
        return false;
    }
    int o = ((to - from) % n + n) % n;
    const int *row = g->offsets + row_k * (size_t)g->stride;
    for (int j = 0; j < g->stride && row[j] >= 0; j++)
        if (row[j] == o) return true;
    return false;
}

int sumo__gossip_out_degree(const sumo__gossip_graph *g, uint64_t k, int r)
{
    int d = 0;
    for (int o = 1; o < g->size; o++) d += sumo__gossip_sends(g, k, r, (r + o) % g->size);
    return d;
}
