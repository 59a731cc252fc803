/* The outer loop's object (diloco.c), shared with its checkpoint code (diloco_state.c). */
#ifndef SUMO_DILOCO_IMPL_H
#define SUMO_DILOCO_IMPL_H

#include "optimizers/diloco.h"
#include "collectives/collectives.h"
#include "optimizers/diloco_gossip.h"

typedef struct sumo__frag {
    size_t n;          /* elements */
    size_t base;       /* first element in the gathered state */
    size_t nruns;
    size_t *run_off;   /* runs of consecutive parameters, model order */
    size_t *run_len;
    size_t ntensors;
    size_t *tcounts;   /* its tensors' (or pieces') element counts: Adasum's and ACGA's layout */
    uint64_t first;    /* its first sync step, floor((f + 1) H / F) */
    sumo_aggregator *agg; /* ADASUM, ACGA */
} sumo__frag;

struct sumo_diloco {
    sumo_comm *comm;
    sumo_diloco_options o;
    sumo_acga_options acga;
    sumo_dtype dtype;
    size_t esz, n, ntensors;
    size_t *tcounts;
    int *fragment_of;  /* per tensor (SUMO_SPLIT_TENSORS) */
    int nranks, rank, log_level;
    int nfrag;
    sumo__frag *frags;
    size_t maxfrag;
    uint64_t layout_hash;
    /* The sharded mode's slice: x0 and v hold [offset, offset + shard) then the tail
     * [n - tail, n); unsharded, offset 0, shard n, tail 0. */
    size_t offset, shard, tail;
    size_t local;      /* elements in each of x0 and v: shard + tail (n unsharded) */
    /* One fragment, delay 0, merge 0, the uncompressed average: the parameters are averaged
     * in place (the outer step overwrites them anyway), so there is no exchange buffer. */
    bool in_place;
    size_t ebuf;       /* elements of the exchange buffer: the largest fragment, 0 in place */
    unsigned char *x0, *v, *e; /* one allocation in the memory of k */
    const sumo_kernel_table *k;
    uint64_t steps;
    bool anchored, synchronized;
    /* the exchange in flight or completed and not yet applied */
    int pending;       /* fragment, -1 for none */
    uint64_t apply_at;
    double gamma;      /* the rate of its start step (HEAVY_BALL) */
    sumo_request *req; /* NULL once completed: its result is then `result` */
    sumo_result result;
    sumo_comm_stats stats;
    sumo__gossip_base gb; /* a gossip base (diloco_gossip.c) */
};

/* Elements of state: x0, v and the exchange buffer. */
static inline size_t sumo__diloco_state_elems(const sumo_diloco *d)
{
    return 2 * d->local + d->ebuf;
}

/* The exchange in flight completes now; its result is kept for the apply. */
void sumo__diloco_settle(sumo_diloco *d);

#endif
