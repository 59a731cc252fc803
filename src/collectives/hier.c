/*
 * sumo_hier.h: the allreduce over a node's communicator and an across-nodes one, composed of
 * sumo's public collectives only, so each level runs the algorithms its transport chooses
 * (the shared-memory ones inside a node, which read the peers' device buffers over CUDA IPC;
 * point-to-point ones over NCCL between nodes) and nothing here touches the data itself.
 */
#include "common/common.h" /* sumo_ext.h's stream-taking sumo_collective_run */
#include "sumo_hier.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Adasum layouts kept per handle with their across op (a DDP model has a few bucket layouts;
 * past this many every op is dropped and made again as layouts come). */
#define HIER_MAX_LAYOUTS 32

typedef struct hier_layout {
    size_t ntensors;
    size_t *counts;
    /* L + 1 element offsets: local rank g combines elements [cut[g], cut[g + 1]) across the
     * nodes, whole tensors [tcut[g], tcut[g + 1]). */
    size_t *cut, *tcut;
    sumo_op op; /* on across, over this rank's share; unused when the share is empty */
    bool has_op;
} hier_layout;

struct sumo_hier {
    sumo_comm *node, *across;
    int L, l, H, h;
    pthread_mutex_t lock;
    hier_layout layouts[HIER_MAX_LAYOUTS];
    int nlayouts;
    char message[320];
};

static sumo_result fail(sumo_hier *x, sumo_result code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static sumo_result fail(sumo_hier *x, sumo_result code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(x->message, sizeof x->message, fmt, ap);
    va_end(ap);
    return code;
}

/* A failed collective of one level: its communicator's own message, named by level. */
static sumo_result level_failed(sumo_hier *x, sumo_comm *c, sumo_result code, const char *what)
{
    const char *m = "";
    sumo_comm_error_message(c, &m);
    return fail(x, code, "%s on the %s communicator (node %d, local rank %d): %s: %s", what,
                c == x->node ? "node" : "across", x->h, x->l, sumo_result_name(code), m);
}

static sumo_result run(sumo_hier *x, sumo_comm *c, const sumo_collective *call, const char *what)
{
    sumo_result r = sumo_collective_run(c, call);
    return r == SUMO_SUCCESS ? r : level_failed(x, c, r, what);
}

/* Every rank of c has the same (a, b) as this one: an allgather of small integers, exact in
 * double, over host memory (whatever memory the communicator's collectives take besides). */
static sumo_result same_on_all(sumo_hier *x, sumo_comm *c, int size, double a, double b,
                               const char *what)
{
    double mine[2] = {a, b};
    double *all = malloc(2 * (size_t)size * sizeof *all);
    if (all == NULL) return fail(x, SUMO_ERR_SYSTEM, "sumo_hier: out of memory");
    sumo_collective call = {.struct_size = sizeof call, .kind = SUMO_COLLECTIVE_ALLGATHER,
                            .sendbuf = mine, .recvbuf = all, .count = 2,
                            .dtype = SUMO_FLOAT64};
    sumo_result r = run(x, c, &call, what);
    int bad = -1;
    for (int i = 0; r == SUMO_SUCCESS && i < size && bad < 0; i++)
        if (all[2 * i] != a || all[2 * i + 1] != b) bad = i;
    if (bad >= 0)
        r = fail(x, SUMO_ERR_MISMATCH, "%s: rank %d of the %s communicator has (%.0f, %.0f), "
                 "this rank (%.0f, %.0f)", what, bad, c == x->node ? "node" : "across",
                 all[2 * bad], all[2 * bad + 1], a, b);
    free(all);
    return r;
}

sumo_result sumo_hier_create(sumo_comm *node, sumo_comm *across, sumo_hier **out)
{
    if (out == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *out = NULL;
    if (node == NULL || across == NULL || node == across) return SUMO_ERR_INVALID_ARGUMENT;
    sumo_hier *x = calloc(1, sizeof *x);
    if (x == NULL) return SUMO_ERR_SYSTEM;
    x->node = node, x->across = across;
    sumo_result r = sumo_comm_size(node, &x->L);
    if (r == SUMO_SUCCESS) r = sumo_comm_rank(node, &x->l);
    if (r == SUMO_SUCCESS) r = sumo_comm_size(across, &x->H);
    if (r == SUMO_SUCCESS) r = sumo_comm_rank(across, &x->h);
    /* A node's ranks are on one node (the same h, the same H), and an across communicator
     * holds one local rank of every node (the same l, the same L). */
    if (r == SUMO_SUCCESS)
        r = same_on_all(x, node, x->L, x->h, x->H, "sumo_hier_create: (node, nodes)");
    if (r == SUMO_SUCCESS)
        r = same_on_all(x, across, x->H, x->l, x->L, "sumo_hier_create: (local rank, local size)");
    if (r != SUMO_SUCCESS) {
        /* The caller has no handle to ask, so the reason goes where sumo's logs go. */
        fprintf(stderr, "sumo: %s\n", x->message);
        free(x);
        return r;
    }
    if (pthread_mutex_init(&x->lock, NULL) != 0) {
        free(x);
        return SUMO_ERR_SYSTEM;
    }
    *out = x;
    return SUMO_SUCCESS;
}

static void drop_layout(sumo_hier *x, hier_layout *lay)
{
    if (lay->has_op) (void)sumo_op_destroy(x->across, lay->op);
    free(lay->counts);
    free(lay->cut);
    free(lay->tcut);
    memset(lay, 0, sizeof *lay);
}

sumo_result sumo_hier_destroy(sumo_hier *x)
{
    if (x == NULL) return SUMO_SUCCESS;
    for (int i = 0; i < x->nlayouts; i++) drop_layout(x, &x->layouts[i]);
    pthread_mutex_destroy(&x->lock);
    free(x);
    return SUMO_SUCCESS;
}

sumo_result sumo_hier_error_message(const sumo_hier *x, const char **message)
{
    if (x == NULL || message == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *message = x->message;
    return SUMO_SUCCESS;
}

static bool layout_equal(const hier_layout *lay, const size_t *counts, size_t ntensors)
{
    return lay->ntensors == ntensors &&
           memcmp(lay->counts, counts, ntensors * sizeof *counts) == 0;
}

/* FNV-1a of the layout, folded to two 26-bit halves (exact in double) for the node's check
 * (its ranks share one machine, so one byte order). */
static void layout_digest(const size_t *counts, size_t ntensors, double out[2])
{
    uint64_t v = sumo__fnv1a(SUMO__FNV_OFFSET, counts, ntensors * sizeof *counts);
    out[0] = (double)(v & ((1u << 26) - 1));
    out[1] = (double)((v >> 26) & ((1u << 26) - 1)) + (double)ntensors * 67108864.0;
}

/* The layout's entry: found, or made (its cut, its op on across). A new layout is checked
 * to be every node peer's, since the cut decides which rank shares which elements. */
static sumo_result layout_for(sumo_hier *x, const size_t *counts, size_t ntensors, size_t count,
                              hier_layout **out)
{
    for (int i = 0; i < x->nlayouts; i++)
        if (layout_equal(&x->layouts[i], counts, ntensors)) {
            *out = &x->layouts[i];
            return SUMO_SUCCESS;
        }
    /* Every rank of the node meets the same layouts in the same order, so every one drops its
     * ops at the same call (across peers too: each is some node's local rank l). */
    if (x->nlayouts == HIER_MAX_LAYOUTS) {
        for (int i = 0; i < x->nlayouts; i++) drop_layout(x, &x->layouts[i]);
        x->nlayouts = 0;
    }
    double digest[2];
    layout_digest(counts, ntensors, digest);
    SUMO__CHECK(same_on_all(x, x->node, x->L, digest[0], digest[1],
                           "sumo_hier_allreduce: Adasum's layout (a digest of its counts)"));
    hier_layout *lay = &x->layouts[x->nlayouts];
    size_t L = (size_t)x->L;
    lay->counts = malloc((ntensors ? ntensors : 1) * sizeof *counts);
    lay->cut = malloc((L + 1) * sizeof *lay->cut);
    lay->tcut = malloc((L + 1) * sizeof *lay->tcut);
    if (lay->counts == NULL || lay->cut == NULL || lay->tcut == NULL) {
        drop_layout(x, lay);
        return fail(x, SUMO_ERR_SYSTEM, "sumo_hier_allreduce: out of memory");
    }
    memcpy(lay->counts, counts, ntensors * sizeof *counts);
    lay->ntensors = ntensors;
    /* Share g starts at the first tensor that starts at or past g/L of the elements. */
    size_t t = 0, at = 0;
    lay->cut[0] = lay->tcut[0] = 0;
    for (size_t g = 1; g < L; g++) {
        while (t < ntensors && (double)at * (double)L < (double)count * (double)g)
            at += counts[t++];
        lay->tcut[g] = t, lay->cut[g] = at;
    }
    lay->tcut[L] = ntensors, lay->cut[L] = count;
    size_t first = lay->tcut[x->l], n = lay->tcut[x->l + 1] - first;
    if (n > 0 && x->H > 1) {
        sumo_adasum_options o = {.struct_size = sizeof o, .tensor_counts = counts + first,
                                 .ntensors = n};
        sumo_result r = sumo_op_create_adasum(x->across, &o, &lay->op);
        if (r != SUMO_SUCCESS) {
            drop_layout(x, lay);
            return level_failed(x, x->across, r, "sumo_op_create_adasum");
        }
        lay->has_op = true;
    }
    x->nlayouts++;
    *out = lay;
    return SUMO_SUCCESS;
}

static sumo_result sum_or_average(sumo_hier *x, const unsigned char *s, unsigned char *r,
                                  size_t count, sumo_dtype dtype, sumo_op op, size_t esz,
                                  void *stream)
{
    size_t L = (size_t)x->L, m = count / L, body = m * L, mine = (size_t)x->l * m * esz;
    if (m > 0) {
        /* Slice l of the node's sum into its place in recvbuf (in place: NCCL's form). */
        sumo_collective rs = {.struct_size = sizeof rs, .kind = SUMO_COLLECTIVE_REDUCE_SCATTER,
                              .sendbuf = s, .recvbuf = r + mine, .count = m, .dtype = dtype,
                              .op = op, .stream = stream};
        SUMO__CHECK(run(x, x->node, &rs, "the reduce-scatter inside the node"));
        sumo_collective ar = {.struct_size = sizeof ar, .kind = SUMO_COLLECTIVE_ALLREDUCE,
                              .sendbuf = r + mine, .recvbuf = r + mine, .count = m,
                              .dtype = dtype, .op = op, .stream = stream};
        SUMO__CHECK(run(x, x->across, &ar, "the allreduce across the nodes"));
        sumo_collective ag = {.struct_size = sizeof ag, .kind = SUMO_COLLECTIVE_ALLGATHER,
                              .sendbuf = r + mine, .recvbuf = r, .count = m, .dtype = dtype,
                              .stream = stream};
        SUMO__CHECK(run(x, x->node, &ag, "the allgather inside the node"));
    }
    /* The tail (fewer than L elements, or a count of 0, whose calls still check that the
     * peers agree): whole on every rank, each local rank over its own across communicator
     * (they all compute the same bits from the same node result). */
    if (count - body > 0 || count == 0) {
        sumo_collective ar = {.struct_size = sizeof ar, .kind = SUMO_COLLECTIVE_ALLREDUCE,
                              .sendbuf = s + body * esz, .recvbuf = r + body * esz,
                              .count = count - body, .dtype = dtype, .op = op,
                              .stream = stream};
        SUMO__CHECK(run(x, x->node, &ar, "the allreduce of the tail inside the node"));
        ar.sendbuf = ar.recvbuf;
        SUMO__CHECK(run(x, x->across, &ar, "the allreduce of the tail across the nodes"));
    }
    return SUMO_SUCCESS;
}

static sumo_result adasum(sumo_hier *x, const unsigned char *s, unsigned char *r, size_t count,
                          sumo_dtype dtype, const size_t *counts, size_t ntensors, size_t esz,
                          void *stream)
{
    size_t one = count;
    if (counts == NULL) counts = &one, ntensors = 1;
    hier_layout *lay = NULL;
    SUMO__CHECK(layout_for(x, counts, ntensors, count, &lay));
    /* The node's average (the group average of sumo's hierarchical Adasum) on every rank. */
    sumo_collective avg = {.struct_size = sizeof avg, .kind = SUMO_COLLECTIVE_ALLREDUCE,
                           .sendbuf = s, .recvbuf = r, .count = count, .dtype = dtype,
                           .op = SUMO_OP_AVERAGE, .stream = stream};
    SUMO__CHECK(run(x, x->node, &avg, "the average inside the node"));
    if (x->H == 1) return SUMO_SUCCESS;
    size_t lo = lay->cut[x->l], n = lay->cut[x->l + 1] - lo;
    if (lay->has_op) {
        sumo_collective ar = {.struct_size = sizeof ar, .kind = SUMO_COLLECTIVE_ALLREDUCE,
                              .sendbuf = r + lo * esz, .recvbuf = r + lo * esz, .count = n,
                              .dtype = dtype, .op = lay->op, .stream = stream};
        SUMO__CHECK(run(x, x->across, &ar, "Adasum across the nodes"));
    }
    /* Each share from the rank that combined it. */
    for (int g = 0; g < x->L; g++) {
        size_t glo = lay->cut[g], gn = lay->cut[g + 1] - glo;
        if (gn == 0) continue;
        sumo_collective bc = {.struct_size = sizeof bc, .kind = SUMO_COLLECTIVE_BROADCAST,
                              .sendbuf = r + glo * esz, .recvbuf = r + glo * esz, .count = gn,
                              .dtype = dtype, .root = g, .stream = stream};
        SUMO__CHECK(run(x, x->node, &bc, "the broadcast of a share inside the node"));
    }
    return SUMO_SUCCESS;
}

sumo_result sumo_hier_allreduce(const void *sendbuf, void *recvbuf, size_t count,
                                sumo_dtype dtype, sumo_op op, const size_t *tensor_counts,
                                size_t ntensors, void *stream, sumo_hier *x)
{
    if (x == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    pthread_mutex_lock(&x->lock);
    x->message[0] = '\0';
    size_t esz = 0;
    sumo_result r = sumo_dtype_size(dtype, &esz);
    if (r != SUMO_SUCCESS) {
        r = fail(x, r, "sumo_hier_allreduce: unknown dtype %d", (int)dtype);
    } else if (op != SUMO_OP_SUM && op != SUMO_OP_AVERAGE && op != SUMO_OP_ADASUM) {
        r = fail(x, SUMO_ERR_INVALID_ARGUMENT,
                 "sumo_hier_allreduce: op %u; it takes SUMO_OP_SUM, SUMO_OP_AVERAGE or "
                 "SUMO_OP_ADASUM (with a layout)", (unsigned)op);
    } else if ((tensor_counts == NULL) != (ntensors == 0) ||
               (op != SUMO_OP_ADASUM && ntensors != 0)) {
        r = fail(x, SUMO_ERR_INVALID_ARGUMENT,
                 "sumo_hier_allreduce: a layout needs both tensor_counts and ntensors, and "
                 "only Adasum takes one");
    } else if (count > 0 && (sendbuf == NULL || recvbuf == NULL)) {
        r = fail(x, SUMO_ERR_INVALID_ARGUMENT, "sumo_hier_allreduce: a NULL buffer");
    } else {
        size_t total = 0;
        for (size_t i = 0; i < ntensors; i++) total += tensor_counts[i];
        if (ntensors > 0 && total != count)
            r = fail(x, SUMO_ERR_INVALID_ARGUMENT,
                     "sumo_hier_allreduce: the layout's %zu tensors hold %zu elements, count "
                     "is %zu", ntensors, total, count);
    }
    if (r == SUMO_SUCCESS) {
        const unsigned char *s = sendbuf;
        unsigned char *d = recvbuf;
        r = op == SUMO_OP_ADASUM
                ? adasum(x, s, d, count, dtype, tensor_counts, ntensors, esz, stream)
                : sum_or_average(x, s, d, count, dtype, op, esz, stream);
    }
    pthread_mutex_unlock(&x->lock);
    return r;
}
