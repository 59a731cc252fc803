/*
 * Adasum over groups of a two-level communicator's device memory (adasum_hier.h).
 *
 * What it computes: sumo_adasum_options' hierarchical form with a group per node (sumo.h):
 * Adasum's tree over the H nodes' averages, per tensor of the layout. The node's average is
 * the node level's allreduce (in rank order, rounded once), so its bits are those of the node
 * level's algorithm, and each share's tree is the across level's Adasum.
 */
#include "collectives/adasum_hier.h"
#include "collectives/hier_levels.h"

#include <stdlib.h>
#include <string.h>

struct sumo__adasum_hier {
    size_t count;   /* the call's count the cut is for (a one-tensor layout takes any) */
    size_t ntensors;
    size_t *counts; /* ntensors (1 for a one-tensor layout) */
    /* L + 1 element offsets: local rank g combines elements [cut[g], cut[g + 1]) across the
     * nodes, whole tensors [tcut[g], tcut[g + 1]). */
    size_t *cut, *tcut;
};

void sumo__adasum_hier_free(sumo__adasum_hier *h)
{
    if (h == NULL) return;
    free(h->counts);
    free(h->cut);
    free(h->tcut);
    free(h);
}

/* The cut of the layout into L shares of whole tensors. */
static sumo__adasum_hier *make(const size_t *offsets, size_t ntensors, size_t count, int Li)
{
    sumo__adasum_hier *h = calloc(1, sizeof *h);
    size_t L = (size_t)Li, nt = ntensors ? ntensors : 1;
    if (h == NULL) return NULL;
    h->counts = malloc(nt * sizeof *h->counts);
    h->cut = malloc((L + 1) * sizeof *h->cut);
    h->tcut = malloc((L + 1) * sizeof *h->tcut);
    if (h->counts == NULL || h->cut == NULL || h->tcut == NULL) {
        sumo__adasum_hier_free(h);
        return NULL;
    }
    h->count = count;
    h->ntensors = nt;
    for (size_t t = 0; t < nt; t++) h->counts[t] = ntensors ? offsets[t + 1] - offsets[t] : count;
    /* Share g starts at the first tensor that starts at or past g/L of the elements. */
    size_t t = 0, at = 0;
    h->cut[0] = h->tcut[0] = 0;
    for (size_t g = 1; g < L; g++) {
        while (t < nt && (double)at * (double)L < (double)count * (double)g) at += h->counts[t++];
        h->tcut[g] = t, h->cut[g] = at;
    }
    h->tcut[L] = nt, h->cut[L] = count;
    return h;
}

void sumo__adasum_hier_check(sumo_comm *c, sumo__call_desc *d, int g, int ngroups, bool *gram)
{
    const sumo__levels *lv = c->levels;
    int L = lv->L;
    if (c->x.k != sumo__host_kernels()) {
        if (g == 1)
            d->local_error = SUMO__COMM_FAIL(c, SUMO_ERR_INVALID_USAGE,
                                             "allreduce: flat Adasum of %s memory on a two-level "
                                             "communicator; make the op with hierarchical = 1 "
                                             "(flat Adasum runs over options.any, host memory "
                                             "only)", c->x.k->memory);
        return;
    }
    /* One rank per node, or one node: every pair is on a level. */
    if (lv->any || L == 1 || lv->H == 1) return;
    *gram = false;
    if (g == 1)
        d->local_error = SUMO__COMM_FAIL(c, SUMO_ERR_INVALID_USAGE,
                                         "allreduce: flat Adasum on a two-level communicator "
                                         "needs options.any (or an op made with hierarchical "
                                         "= 1)");
    else if (ngroups > 1 && (L & (L - 1)) != 0)
        d->local_error = SUMO__COMM_FAIL(c, SUMO_ERR_INVALID_USAGE,
                                         "allreduce: Adasum over nodes of %d ranks on a "
                                         "two-level communicator needs options.any (its sums "
                                         "pair ranks of different nodes and local ranks when "
                                         "the node size is not a power of two)", L);
}

sumo_result sumo__adasum_hier_cut(sumo_comm *c, sumo__adasum_hier **cache, const size_t *offsets,
                                  size_t ntensors, size_t count, const size_t **counts,
                                  size_t *first, size_t *n)
{
    const sumo__levels *lv = c->levels;
    if (*cache == NULL || (ntensors == 0 && (*cache)->count != count)) {
        sumo__adasum_hier_free(*cache);
        *cache = make(offsets, ntensors, count, lv->L);
        if (*cache == NULL) return SUMO__COMM_FAIL(c, SUMO_ERR_SYSTEM, "Adasum: out of memory");
    }
    *counts = (*cache)->counts;
    *first = (*cache)->tcut[lv->l];
    *n = (*cache)->tcut[lv->l + 1] - *first;
    return SUMO_SUCCESS;
}

static sumo_result level(sumo_comm *c, sumo_comm *lvl, sumo_collective_kind kind, const void *s,
                         void *r, size_t n, sumo_dtype dt, sumo_op op, int root, const char *what)
{
    sumo_collective call = {.struct_size = sizeof call, .kind = kind, .sendbuf = s, .recvbuf = r,
                            .count = n, .dtype = dt, .op = op, .root = root,
                            .stream = c->x.stream};
    return sumo__level_run(c, lvl, &call, what);
}

sumo_result sumo__adasum_hier_allreduce(sumo_comm *c, sumo__call_desc *d,
                                        const sumo__adasum_hier *h, bool has_op, sumo_op op,
                                        const void *sendbuf, void *recvbuf)
{
    const sumo__levels *lv = c->levels;
    size_t count = d->count;
    sumo_dtype dt = (sumo_dtype)d->dtype;
    size_t esz = sumo__dtype_bytes(dt);
    SUMO__CHECK(sumo__agree(c, d, NULL));
    const unsigned char *s = sendbuf;
    unsigned char *r = recvbuf;
    SUMO__CHECK(level(c, lv->node, SUMO_COLLECTIVE_ALLREDUCE, s, r, count, dt, SUMO_OP_AVERAGE, 0,
                      "the average inside the node"));
    if (lv->H == 1) return SUMO_SUCCESS;
    size_t lo = h->cut[lv->l], n = h->cut[lv->l + 1] - lo;
    if (has_op)
        SUMO__CHECK(level(c, sumo__level_across(c), SUMO_COLLECTIVE_ALLREDUCE, r + lo * esz,
                          r + lo * esz, n, dt, op, 0, "Adasum across the nodes"));
    /* Each share from the rank that combined it. */
    for (int g = 0; g < lv->L; g++) {
        size_t glo = h->cut[g], gn = h->cut[g + 1] - glo;
        if (gn == 0) continue;
        SUMO__CHECK(level(c, lv->node, SUMO_COLLECTIVE_BROADCAST, r + glo * esz, r + glo * esz, gn,
                          dt, 0, g, "the broadcast of a share inside the node"));
    }
    return SUMO_SUCCESS;
}
