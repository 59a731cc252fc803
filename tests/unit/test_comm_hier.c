/*
 * The two-level communicator (sumo_comm_create_hier) over threads communicators as its levels
 * (a node's ranks on one, each local rank's peers on the other nodes on another, optionally a
 * flat one of all ranks as options.any), against independent references: a flat threads
 * communicator of the same H * L ranks running the flat algorithm whose bits the two-level one
 * promises (SUMO_ALGORITHM_RANKED for the chain, the point-to-point hierarchical Adasum for
 * host Adasum, the flat broadcast and allgather), and closed forms (two rounded levels of
 * in-order sums for SUMO_ALGORITHM_TWO_LEVEL; Adasum's tree over the nodes' averages). Then the
 * one path's features on it (requests, join, restore-on-failure, a rank aborted mid-call), what
 * a caller gets wrong, and the composed transport's refusal of a pair no level reaches.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "support/adasum_run.h"
#include "transport/transport_hier.h"
#include "collectives/comm.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define MAXL 8
#define MAXH 8

typedef struct world world;
typedef void (*world_fn)(world *w, int rank, sumo_comm *hier, sumo_comm *flat);

struct world {
    int H, L;
    bool any, flat;      /* make options.any; make a flat reference communicator */
    int bad_L_rank;      /* -1, or a rank whose node communicator has one rank fewer */
    double timeout;
    world_fn fn;
    void *ctx;
    sumo_comm *node[MAXH][MAXL], *across[MAXL][MAXH], *anyc[MAXP], *flatc[MAXP];
    sumo_result create[MAXP];
    char msg[MAXP][320];
};

typedef struct wrank {
    world *w;
    int h, l;
} wrank;

static void *world_rank(void *p)
{
    wrank *a = p;
    world *w = a->w;
    int rank = a->h * w->L + a->l;
    sumo_comm *node = w->node[a->h][a->l], *across = w->across[a->l][a->h];
    sumo_comm *anyc = w->any ? w->anyc[rank] : NULL, *flat = w->flat ? w->flatc[rank] : NULL;
    if (w->timeout > 0) {
        sumo_comm_set_timeout(node, w->timeout);
        sumo_comm_set_timeout(across, w->timeout);
        if (anyc) sumo_comm_set_timeout(anyc, w->timeout);
    }
    sumo_hier_options o;
    sumo_hier_options_default(&o);
    o.any = anyc;
    sumo_comm *hier = NULL;
    w->create[rank] = sumo_comm_create_hier(node, across, &o, &hier);
    if (hier) {
        if (w->timeout > 0) sumo_comm_set_timeout(hier, w->timeout);
        w->fn(w, rank, hier, flat);
        sumo_comm_destroy(hier);
    } else {
        sumo_comm_destroy(node);
        sumo_comm_destroy(across);
        sumo_comm_destroy(anyc);
    }
    sumo_comm_destroy(flat);
    return NULL;
}

static void world_run(world *w)
{
    int H = w->H, L = w->L, P = H * L;
    for (int h = 0; h < H; h++) assert_int_equal(sumo_comm_create_threads(L, w->node[h]), SUMO_SUCCESS);
    for (int l = 0; l < L; l++) {
        sumo_comm *tmp[MAXH];
        assert_int_equal(sumo_comm_create_threads(H, tmp), SUMO_SUCCESS);
        for (int h = 0; h < H; h++) w->across[l][h] = tmp[h];
    }
    if (w->any) assert_int_equal(sumo_comm_create_threads(P, w->anyc), SUMO_SUCCESS);
    if (w->flat) assert_int_equal(sumo_comm_create_threads(P, w->flatc), SUMO_SUCCESS);
    pthread_t ids[MAXP];
    wrank args[MAXP];
    for (int r = 0; r < P; r++) {
        args[r] = (wrank){.w = w, .h = r / L, .l = r % L};
        assert_int_equal(pthread_create(&ids[r], NULL, world_rank, &args[r]), 0);
    }
    for (int r = 0; r < P; r++) pthread_join(ids[r], NULL);
}

static world make_world(int H, int L, bool any, bool flat, world_fn fn, void *ctx)
{
    return (world){.H = H, .L = L, .any = any, .flat = flat, .bad_L_rank = -1, .fn = fn, .ctx = ctx};
}

static const sumo_dtype dtypes[] = {SUMO_FLOAT32, SUMO_FLOAT64, SUMO_FLOAT16, SUMO_BFLOAT16};
static const int shapes[][2] = {{2, 2}, {3, 2}, {2, 3}, {1, 4}, {4, 1}, {2, 4}, {3, 3}};
#define NSHAPES (sizeof shapes / sizeof shapes[0])

/* ---- buffers of one scenario ----------------------------------------------------------------- */

typedef struct bufs {
    int P;
    sumo_dtype dtype;
    size_t count, in_elems, out_elems;
    unsigned char *in[MAXP], *out[MAXP], *ref[MAXP], *inplace[MAXP];
    sumo_result res[MAXP], res_ref[MAXP], res_inplace[MAXP];
    char msg[MAXP][256];
} bufs;

static void bufs_alloc(bufs *b, int P, sumo_dtype dtype, size_t count, size_t in_mul, size_t out_mul)
{
    memset(b, 0, sizeof *b);
    b->P = P, b->dtype = dtype, b->count = count;
    b->in_elems = count * in_mul, b->out_elems = count * out_mul;
    size_t esz = harness_dtype_size(dtype);
    size_t ib = b->in_elems * esz + 8, ob = (b->out_elems > b->in_elems ? b->out_elems : b->in_elems) * esz + 8;
    for (int r = 0; r < P; r++) {
        b->in[r] = malloc(ib);
        b->out[r] = malloc(ob);
        b->ref[r] = malloc(ob);
        b->inplace[r] = malloc(ob);
        memset(b->out[r], 0xAB, ob);
        memset(b->ref[r], 0xCD, ob);
        for (size_t i = 0; i < b->in_elems; i++)
            harness_set(dtype, b->in[r], i, harness_uniform_at(77, (uint64_t)r, i) * (1 + r % 5) - 0.3);
        memcpy(b->inplace[r], b->in[r], ib);
    }
}

static void bufs_free(bufs *b)
{
    for (int r = 0; r < b->P; r++) {
        free(b->in[r]);
        free(b->out[r]);
        free(b->ref[r]);
        free(b->inplace[r]);
    }
}

static void note(bufs *b, int rank, sumo_comm *c)
{
    const char *m = "";
    sumo_comm_error_message(c, &m);
    snprintf(b->msg[rank], sizeof b->msg[rank], "%s", m);
}

/* Every rank succeeded, and its out (and in-place) bytes equal its ref bytes. */
static int same_as_ref(const bufs *b, size_t elems, const char *what)
{
    size_t bytes = elems * harness_dtype_size(b->dtype);
    for (int r = 0; r < b->P; r++) {
        if (b->res[r] != SUMO_SUCCESS || b->res_ref[r] != SUMO_SUCCESS || b->res_inplace[r] != SUMO_SUCCESS) {
            fprintf(stderr, "%s: rank %d: %s / ref %s / in place %s (%s)\n", what, r,
                    sumo_result_name(b->res[r]), sumo_result_name(b->res_ref[r]),
                    sumo_result_name(b->res_inplace[r]), b->msg[r]);
            return 1;
        }
        if (memcmp(b->out[r], b->ref[r], bytes) != 0 || memcmp(b->inplace[r], b->ref[r], bytes) != 0) {
            for (size_t i = 0; i < elems; i++)
                if (harness_get(b->dtype, b->out[r], i) != harness_get(b->dtype, b->ref[r], i) ||
                    harness_get(b->dtype, b->inplace[r], i) != harness_get(b->dtype, b->ref[r], i)) {
                    fprintf(stderr, "%s: rank %d element %zu: %.17g (in place %.17g), reference %.17g\n",
                            what, r, i, harness_get(b->dtype, b->out[r], i),
                            harness_get(b->dtype, b->inplace[r], i), harness_get(b->dtype, b->ref[r], i));
                    break;
                }
            return 1;
        }
    }
    return 0;
}

/* ---- the chain: the bits of a flat communicator's ranked allreduce --------------------------- */

typedef struct allreduce_ctx {
    bufs *b;
    sumo_op op;
    int algo;      /* forced on the two-level communicator, or AUTO */
} allreduce_ctx;

static void allreduce_body(world *w, int rank, sumo_comm *hier, sumo_comm *flat)
{
    allreduce_ctx *x = w->ctx;
    bufs *b = x->b;
    if (x->algo != SUMO_ALGORITHM_AUTO) sumo_comm_set_param(hier, SUMO_PARAM_ALGORITHM, x->algo);
    b->res[rank] = sumo_allreduce(b->in[rank], b->out[rank], b->count, b->dtype, x->op, hier);
    if (b->res[rank] != SUMO_SUCCESS) note(b, rank, hier);
    b->res_inplace[rank] = sumo_allreduce(b->inplace[rank], b->inplace[rank], b->count, b->dtype, x->op, hier);
    if (flat) {
        sumo_comm_set_param(flat, SUMO_PARAM_ALGORITHM, SUMO_ALGORITHM_RANKED);
        b->res_ref[rank] = sumo_allreduce(b->in[rank], b->ref[rank], b->count, b->dtype, x->op, flat);
    }
}

static void test_chain_equals_flat_ranked(void **state)
{
    (void)state;
    setenv("SUMO_HIER_CHUNK_BYTES", "16384", 1);
    int bad = 0;
    for (size_t s = 0; s < NSHAPES; s++)
        for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++) {
            int H = shapes[s][0], L = shapes[s][1];
            size_t acc = dtypes[d] == SUMO_FLOAT64 ? 8 : 4, chunk = 16384 / acc;
            size_t counts[] = {0, 1, (size_t)L - 1, chunk - 1, chunk, chunk + 1, 2 * chunk + 1,
                               3 * chunk + 5, 6 * chunk};
            for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++)
                for (int avg = 0; avg < 2; avg++) {
                    bufs b;
                    bufs_alloc(&b, H * L, dtypes[d], counts[c], 1, 1);
                    allreduce_ctx x = {.b = &b, .op = avg ? SUMO_OP_AVERAGE : SUMO_OP_SUM};
                    world w = make_world(H, L, false, true, allreduce_body, &x);
                    world_run(&w);
                    char what[128];
                    snprintf(what, sizeof what, "chain %s H %d L %d dtype %s count %zu",
                             avg ? "average" : "sum", H, L, sumo_dtype_name(dtypes[d]), counts[c]);
                    bad += same_as_ref(&b, b.count, what);
                    bufs_free(&b);
                }
        }
    unsetenv("SUMO_HIER_CHUNK_BYTES");
    assert_int_equal(bad, 0);
}

/* ---- two_level: two rounded levels of in-order sums (hier.c's bits) -------------------------- */

static void test_two_level_closed_form(void **state)
{
    (void)state;
    const size_t counts[] = {0, 1, 2, 5, 1001};
    int bad = 0;
    for (size_t s = 0; s < NSHAPES; s++)
        for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++)
            for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++)
                for (int avg = 0; avg < 2; avg++) {
                    int H = shapes[s][0], L = shapes[s][1];
                    bufs b;
                    bufs_alloc(&b, H * L, dtypes[d], counts[c], 1, 1);
                    allreduce_ctx x = {.b = &b, .op = avg ? SUMO_OP_AVERAGE : SUMO_OP_SUM,
                                       .algo = SUMO_ALGORITHM_TWO_LEVEL};
                    world w = make_world(H, L, false, false, allreduce_body, &x);
                    world_run(&w);
                    for (int r = 0; r < b.P; r++)
                        for (size_t i = 0; i < b.count; i++) {
                            double node[MAXH], v[MAXL];
                            for (int h = 0; h < H; h++) {
                                for (int l = 0; l < L; l++) v[l] = harness_get(b.dtype, b.in[h * L + l], i);
                                node[h] = ref_round_to(b.dtype, ref_sum_in_order(b.dtype, v, L, avg ? L : 1));
                            }
                            harness_set(b.dtype, b.ref[r], i,
                                        ref_round_to(b.dtype, ref_sum_in_order(b.dtype, node, H, avg ? H : 1)));
                            b.res_ref[r] = SUMO_SUCCESS;
                        }
                    for (int r = 0; r < b.P && b.count == 0; r++) b.res_ref[r] = SUMO_SUCCESS;
                    char what[128];
                    snprintf(what, sizeof what, "two_level %s H %d L %d dtype %s count %zu",
                             avg ? "average" : "sum", H, L, sumo_dtype_name(dtypes[d]), counts[c]);
                    bad += same_as_ref(&b, b.count, what);
                    bufs_free(&b);
                }
    assert_int_equal(bad, 0);
}


/* ---- Adasum: adasum.c's hierarchical form, point to point over the levels -------------------- */

typedef struct adasum_ctx {
    bufs *b;
    const size_t *counts;
    size_t ntensors;
    int hierarchical;
    sumo_result create[MAXP];
} adasum_ctx;

static sumo_op adasum_op(sumo_comm *c, const adasum_ctx *x, int group_size, sumo_result *res)
{
    sumo_adasum_options o = {.struct_size = sizeof o, .tensor_counts = x->counts,
                             .ntensors = x->ntensors, .hierarchical = x->hierarchical,
                             .group_size = group_size};
    sumo_op op = SUMO_OP_ADASUM;
    *res = sumo_op_create_adasum(c, &o, &op);
    return op;
}

static void adasum_body(world *w, int rank, sumo_comm *hier, sumo_comm *flat)
{
    adasum_ctx *x = w->ctx;
    bufs *b = x->b;
    sumo_op op = adasum_op(hier, x, 0, &x->create[rank]);
    b->res[rank] = sumo_allreduce(b->in[rank], b->out[rank], b->count, b->dtype, op, hier);
    if (b->res[rank] != SUMO_SUCCESS) note(b, rank, hier);
    b->res_inplace[rank] = sumo_allreduce(b->inplace[rank], b->inplace[rank], b->count, b->dtype, op, hier);
    if (flat) {
        sumo_comm_set_param(flat, SUMO_PARAM_ALGORITHM, SUMO_ALGORITHM_RANKED);
        sumo_result r;
        sumo_op fop = adasum_op(flat, x, x->hierarchical ? w->L : 0, &r);
        b->res_ref[rank] = r != SUMO_SUCCESS ? r : sumo_allreduce(b->in[rank], b->ref[rank], b->count, b->dtype, fop, flat);
    }
}

/* With options.any: the bits of a flat threads communicator's hierarchical op (groups of L)
 * with the point-to-point path forced, Gram form included, every dtype; flat ops likewise. */
static void test_adasum_host_equals_flat_point_to_point(void **state)
{
    (void)state;
    static const size_t layout[] = {3, 0, 517, 1, 33, 129, 2};
    int bad = 0;
    for (size_t s = 0; s < NSHAPES; s++)
        for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++)
            for (int k = 0; k < 3; k++) {
                int H = shapes[s][0], L = shapes[s][1];
                size_t count = k == 0 ? 685 : k == 1 ? 1001 : 1;
                bufs b;
                bufs_alloc(&b, H * L, dtypes[d], count, 1, 1);
                adasum_ctx x = {.b = &b, .counts = k == 0 ? layout : NULL, .ntensors = k == 0 ? 7 : 0,
                                .hierarchical = k != 1 || H * L == 1 ? 1 : 0};
                world w = make_world(H, L, true, true, adasum_body, &x);
                world_run(&w);
                char what[128];
                snprintf(what, sizeof what, "Adasum %s H %d L %d dtype %s count %zu",
                         x.hierarchical ? "hierarchical" : "flat", H, L, sumo_dtype_name(dtypes[d]), count);
                bad += same_as_ref(&b, b.count, what);
                bufs_free(&b);
            }
    assert_int_equal(bad, 0);
}

/* Without options.any: the tree alone (no Gram form) where every pair is on a level (L a power
 * of two): fp64 (whose flat form is the tree too) bit for bit, the others against the tree over
 * the nodes' averages; flat ops and nodes of 3 refused on every rank, naming options.any. */
static void test_adasum_without_any(void **state)
{
    (void)state;
    int bad = 0;
    const int pow2[][2] = {{2, 2}, {4, 1}, {2, 4}, {3, 2}, {1, 4}};
    for (size_t s = 0; s < 5; s++)
        for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++) {
            int H = pow2[s][0], L = pow2[s][1];
            bufs b;
            bufs_alloc(&b, H * L, dtypes[d], 1001, 1, 1);
            adasum_ctx x = {.b = &b, .hierarchical = 1};
            world w = make_world(H, L, false, dtypes[d] == SUMO_FLOAT64, adasum_body, &x);
            world_run(&w);
            char what[128];
            snprintf(what, sizeof what, "Adasum without any H %d L %d dtype %s", H, L, sumo_dtype_name(dtypes[d]));
            if (dtypes[d] == SUMO_FLOAT64) {
                bad += same_as_ref(&b, b.count, what);
            } else {
                job j = {.size = H * L, .dtype = dtypes[d], .count = b.count, .hierarchical = 1, .group_size = L};
                for (int r = 0; r < j.size; r++) j.in[r] = b.in[r];
                double *want = reference(&j);
                for (int r = 0; r < j.size; r++) {
                    errors e = measure(&j, b.out[r], want);
                    double tol = tensor_tolerance(&j) + 2 * harness_eps(j.dtype);
                    if (b.res[r] != SUMO_SUCCESS || !(e.per_tensor <= tol) ||
                        memcmp(b.out[r], b.out[0], b.count * harness_dtype_size(b.dtype)) != 0) {
                        fprintf(stderr, "%s: rank %d %s, error %.3g (limit %.3g)\n", what, r,
                                sumo_result_name(b.res[r]), e.per_tensor, tol);
                        bad++;
                        break;
                    }
                }
                free(want);
            }
            bufs_free(&b);
        }
    for (int flat = 0; flat < 2; flat++) {
        bufs b;
        int H = 2, L = flat ? 2 : 3;
        bufs_alloc(&b, H * L, SUMO_FLOAT32, 64, 1, 1);
        adasum_ctx x = {.b = &b, .hierarchical = !flat};
        world w = make_world(H, L, false, false, adasum_body, &x);
        world_run(&w);
        for (int r = 0; r < b.P; r++) {
            assert_int_equal(b.res[r], SUMO_ERR_INVALID_USAGE);
            assert_non_null(strstr(b.msg[r], "options.any"));
        }
        bufs_free(&b);
    }
    assert_int_equal(bad, 0);
}

/* ---- broadcast, allgather, reduce-scatter, barrier against a flat communicator -------------- */

typedef struct kinds_ctx {
    bufs *b;
    int kind, root;
} kinds_ctx;

static sumo_result one_kind(const kinds_ctx *x, sumo_comm *c, int rank, const void *in, void *out)
{
    bufs *b = x->b;
    switch (x->kind) {
    case 0: return sumo_broadcast(rank == x->root ? in : NULL, out, b->count, b->dtype, x->root, c);
    case 1: return sumo_allgather(in, out, b->count, b->dtype, c);
    case 2: return sumo_reduce_scatter(in, out, b->count, b->dtype, SUMO_OP_SUM, c);
    case 3: return sumo_reduce_scatter(in, out, b->count, b->dtype, SUMO_OP_AVERAGE, c);
    default: return sumo_barrier(c);
    }
}

static void kinds_body(world *w, int rank, sumo_comm *hier, sumo_comm *flat)
{
    (void)w;
    kinds_ctx *x = w->ctx;
    bufs *b = x->b;
    size_t esz = harness_dtype_size(b->dtype);
    b->res[rank] = one_kind(x, hier, rank, b->in[rank], b->out[rank]);
    if (b->res[rank] != SUMO_SUCCESS) note(b, rank, hier);
    /* In place: NCCL's forms (this rank's block of the larger buffer). */
    unsigned char *ip = b->inplace[rank];
    if (x->kind == 0) b->res_inplace[rank] = one_kind(x, hier, rank, ip, ip);
    else if (x->kind == 1) {
        memcpy(ip + (size_t)rank * b->count * esz, b->in[rank], b->count * esz);
        b->res_inplace[rank] = one_kind(x, hier, rank, ip + (size_t)rank * b->count * esz, ip);
    } else if (x->kind <= 3) {
        b->res_inplace[rank] = one_kind(x, hier, rank, ip, ip + (size_t)rank * b->count * esz);
        memmove(ip, ip + (size_t)rank * b->count * esz, b->count * esz);
    } else b->res_inplace[rank] = one_kind(x, hier, rank, ip, ip);
    /* A flat reduce-scatter in rank order is the shared-memory one (threads: AUTO); the
     * point-to-point one is a ring. */
    if (x->kind < 2 || x->kind > 3) sumo_comm_set_param(flat, SUMO_PARAM_ALGORITHM, SUMO_ALGORITHM_RANKED);
    b->res_ref[rank] = one_kind(x, flat, rank, b->in[rank], b->ref[rank]);
}

static void test_other_kinds_equal_flat(void **state)
{
    (void)state;
    int bad = 0;
    const size_t counts[] = {0, 1, 7, 3001};
    for (size_t s = 0; s < NSHAPES; s++)
        for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++)
            for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++)
                for (int kind = 0; kind < 5; kind++) {
                    int H = shapes[s][0], L = shapes[s][1], P = H * L;
                    bufs b;
                    size_t in_mul = kind == 2 || kind == 3 ? (size_t)P : 1;
                    size_t out_mul = kind == 1 ? (size_t)P : 1;
                    bufs_alloc(&b, P, dtypes[d], counts[c], in_mul, out_mul);
                    for (int r = 0; r < P && kind == 1; r++) {
                        free(b.inplace[r]);
                        b.inplace[r] = calloc(b.out_elems + 8, 8);
                    }
                    kinds_ctx x = {.b = &b, .kind = kind, .root = (int)(s + c) % P};
                    world w = make_world(H, L, false, true, kinds_body, &x);
                    world_run(&w);
                    char what[128];
                    snprintf(what, sizeof what, "kind %d H %d L %d dtype %s count %zu", kind, H, L,
                             sumo_dtype_name(dtypes[d]), counts[c]);
                    bad += same_as_ref(&b, kind == 4 ? 0 : kind == 1 ? b.out_elems : b.count, what);
                    bufs_free(&b);
                }
    assert_int_equal(bad, 0);
}

/* ---- the compressed allreduce runs flat over options.any ------------------------------------- */

static void compressed_body(world *w, int rank, sumo_comm *hier, sumo_comm *flat)
{
    bufs *b = w->ctx;
    sumo_compression o;
    sumo_compression_default(SUMO_COMPRESS_BF16, &o);
    b->res[rank] = sumo_allreduce_compressed((const float *)b->in[rank], (float *)b->out[rank],
                                             b->count, &o, hier);
    if (b->res[rank] != SUMO_SUCCESS) note(b, rank, hier);
    b->res_inplace[rank] = sumo_allreduce_compressed((const float *)b->inplace[rank],
                                                     (float *)b->inplace[rank], b->count, &o, hier);
    if (flat) {
        sumo_comm_set_param(flat, SUMO_PARAM_ALGORITHM, SUMO_ALGORITHM_RANKED);
        b->res_ref[rank] = sumo_allreduce_compressed((const float *)b->in[rank],
                                                     (float *)b->ref[rank], b->count, &o, flat);
    }
}

static void test_compressed_over_any(void **state)
{
    (void)state;
    int bad = 0;
    for (int with_any = 0; with_any < 2; with_any++) {
        bufs b;
        bufs_alloc(&b, 6, SUMO_FLOAT32, 1000, 1, 1);
        world w = make_world(2, 3, with_any, with_any, compressed_body, &b);
        world_run(&w);
        if (with_any) bad += same_as_ref(&b, b.count, "compressed over any");
        for (int r = 0; r < 6 && !with_any; r++) {
            assert_int_equal(b.res[r], SUMO_ERR_INVALID_USAGE);
            assert_non_null(strstr(b.msg[r], "needs options.any"));
        }
        bufs_free(&b);
    }
    assert_int_equal(bad, 0);
}

/* ---- what a caller gets wrong ------------------------------------------------------------------ */

static void noop_body(world *w, int rank, sumo_comm *hier, sumo_comm *flat)
{
    (void)w, (void)rank, (void)hier, (void)flat;
}

static void test_create_refusals(void **state)
{
    (void)state;
    sumo_comm *a[1], *b[1], *out = (sumo_comm *)1;
    assert_int_equal(sumo_comm_create_threads(1, a), SUMO_SUCCESS);
    assert_int_equal(sumo_comm_create_threads(1, b), SUMO_SUCCESS);
    assert_int_equal(sumo_comm_create_hier(NULL, b[0], NULL, &out), SUMO_ERR_INVALID_ARGUMENT);
    assert_null(out);
    assert_int_equal(sumo_comm_create_hier(a[0], a[0], NULL, &out), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_comm_create_hier(a[0], b[0], NULL, NULL), SUMO_ERR_INVALID_ARGUMENT);
    sumo_hier_options o = {.struct_size = 3};
    assert_int_equal(sumo_comm_create_hier(a[0], b[0], &o, &out), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_hier_options_default(NULL), SUMO_ERR_INVALID_ARGUMENT);
    setenv("SUMO_HIER_CHUNK_BYTES", "12", 1);
    assert_int_equal(sumo_comm_create_hier(a[0], b[0], NULL, &out), SUMO_ERR_INVALID_ARGUMENT);
    unsetenv("SUMO_HIER_CHUNK_BYTES");
    /* Refused: still the caller's, and usable. */
    float x = 2;
    assert_int_equal(sumo_allreduce(&x, &x, 1, SUMO_FLOAT32, SUMO_OP_SUM, a[0]), SUMO_SUCCESS);
    /* One rank, one node: a two-level communicator of one, which owns both. */
    assert_int_equal(sumo_comm_create_hier(a[0], b[0], NULL, &out), SUMO_SUCCESS);
    const char *name = NULL;
    assert_int_equal(sumo_comm_transport(out, &name), SUMO_SUCCESS);
    assert_string_equal(name, "hierarchical");
    assert_int_equal(sumo_allreduce(&x, &x, 1, SUMO_FLOAT32, SUMO_OP_SUM, out), SUMO_SUCCESS);
    assert_true(x == 2);
    /* Its own algorithms only; and the flat communicators refuse the two-level ones. */
    assert_int_equal(sumo_comm_set_param(out, SUMO_PARAM_ALGORITHM, SUMO_ALGORITHM_RING),
                     SUMO_ERR_INVALID_USAGE);
    assert_int_equal(sumo_comm_set_param(out, SUMO_PARAM_ALGORITHM, SUMO_ALGORITHM_CHAIN), SUMO_SUCCESS);
    assert_int_equal(sumo_comm_hier_add_across(out, NULL), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_comm_destroy(out), SUMO_SUCCESS);
    assert_int_equal(sumo_comm_create_threads(1, a), SUMO_SUCCESS);
    assert_int_equal(sumo_comm_set_param(a[0], SUMO_PARAM_ALGORITHM, SUMO_ALGORITHM_TWO_LEVEL),
                     SUMO_ERR_INVALID_USAGE);
    assert_int_equal(sumo_comm_hier_add_across(a[0], a[0]), SUMO_ERR_INVALID_USAGE);
    sumo_comm_destroy(a[0]);
}

/* Node 0 has two ranks, node 1 one: node 0's ranks see their across sizes differ and fail
 * with SUMO_ERR_MISMATCH; node 1's rank, whose across peer never comes, at its deadline. */
static void *lopsided_rank(void *p)
{
    void **a = p;
    sumo_comm *node = a[0], *across = a[1];
    sumo_comm_set_timeout(node, 1);
    sumo_comm_set_timeout(across, 1);
    sumo_comm *out = NULL;
    *(sumo_result *)a[2] = sumo_comm_create_hier(node, across, NULL, &out);
    sumo_comm_destroy(node);
    sumo_comm_destroy(across);
    return NULL;
}

static void test_nodes_of_different_sizes(void **state)
{
    (void)state;
    sumo_comm *n0[2], *n1[1], *x0[2], *x1[1];
    assert_int_equal(sumo_comm_create_threads(2, n0), SUMO_SUCCESS);
    assert_int_equal(sumo_comm_create_threads(1, n1), SUMO_SUCCESS);
    assert_int_equal(sumo_comm_create_threads(2, x0), SUMO_SUCCESS);
    assert_int_equal(sumo_comm_create_threads(1, x1), SUMO_SUCCESS);
    sumo_result res[3];
    void *args[3][3] = {{n0[0], x0[0], &res[0]}, {n0[1], x1[0], &res[1]}, {n1[0], x0[1], &res[2]}};
    pthread_t ids[3];
    for (int i = 0; i < 3; i++) pthread_create(&ids[i], NULL, lopsided_rank, args[i]);
    for (int i = 0; i < 3; i++) pthread_join(ids[i], NULL);
    assert_int_equal(res[0], SUMO_ERR_MISMATCH);
    assert_int_equal(res[1], SUMO_ERR_MISMATCH);
    assert_true(res[2] == SUMO_ERR_TIMEOUT || res[2] == SUMO_ERR_PEER_FAILURE);
}

/* options.any whose ranks are not h * L + l: refused on every rank. */
static void test_any_out_of_order(void **state)
{
    (void)state;
    world w = make_world(2, 2, true, false, noop_body, NULL);
    /* The any communicator's ranks reversed. */
    int H = 2, L = 2, P = 4;
    for (int h = 0; h < H; h++) assert_int_equal(sumo_comm_create_threads(L, w.node[h]), SUMO_SUCCESS);
    for (int l = 0; l < L; l++) {
        sumo_comm *tmp[MAXH];
        assert_int_equal(sumo_comm_create_threads(H, tmp), SUMO_SUCCESS);
        for (int h = 0; h < H; h++) w.across[l][h] = tmp[h];
    }
    sumo_comm *any[MAXP];
    assert_int_equal(sumo_comm_create_threads(P, any), SUMO_SUCCESS);
    for (int r = 0; r < P; r++) w.anyc[r] = any[P - 1 - r];
    w.any = true;
    pthread_t ids[MAXP];
    wrank args[MAXP];
    for (int r = 0; r < P; r++) {
        args[r] = (wrank){.w = &w, .h = r / L, .l = r % L};
        pthread_create(&ids[r], NULL, world_rank, &args[r]);
    }
    for (int r = 0; r < P; r++) pthread_join(ids[r], NULL);
    for (int r = 0; r < P; r++) assert_int_equal(w.create[r], SUMO_ERR_INVALID_ARGUMENT);
}

/* Counts that differ between nodes: every rank refuses before data moves (the parent's
 * agreement), the communicator usable after. */
static void mismatch_body(world *w, int rank, sumo_comm *hier, sumo_comm *flat)
{
    (void)flat;
    bufs *b = w->ctx;
    b->res[rank] = sumo_allreduce(b->in[rank], b->out[rank], b->count - (rank / w->L == 1),
                                  b->dtype, SUMO_OP_SUM, hier);
    note(b, rank, hier);
    b->res_ref[rank] = sumo_allreduce(b->in[rank], b->out[rank], b->count, b->dtype, SUMO_OP_SUM, hier);
}

static void test_disagreement(void **state)
{
    (void)state;
    bufs b;
    bufs_alloc(&b, 4, SUMO_FLOAT32, 40, 1, 1);
    world w = make_world(2, 2, false, false, mismatch_body, &b);
    world_run(&w);
    for (int r = 0; r < 4; r++) {
        assert_int_equal(b.res[r], SUMO_ERR_MISMATCH);
        assert_non_null(strstr(b.msg[r], "count"));
        assert_int_equal(b.res_ref[r], SUMO_SUCCESS);
    }
    bufs_free(&b);
}

/* ---- the one path's features ------------------------------------------------------------------ */

/* Three requests in flight at once: each its flat ranked bits. */
static void requests_body(world *w, int rank, sumo_comm *hier, sumo_comm *flat)
{
    bufs *b = w->ctx;
    size_t third = b->count / 3, esz = harness_dtype_size(b->dtype);
    sumo_request *req[3] = {0};
    sumo_result started[3];
    for (int k = 0; k < 3; k++)
        started[k] = sumo_allreduce_start(b->in[rank] + k * third * esz, b->out[rank] + k * third * esz,
                                          third, b->dtype, SUMO_OP_AVERAGE, hier, &req[k]);
    b->res[rank] = SUMO_SUCCESS;
    for (int k = 0; k < 3; k++) {
        sumo_result r = started[k] == SUMO_SUCCESS ? sumo_request_wait(req[k]) : started[k];
        if (r != SUMO_SUCCESS) b->res[rank] = r;
    }
    memcpy(b->inplace[rank], b->out[rank], 3 * third * esz);
    b->res_inplace[rank] = SUMO_SUCCESS;
    sumo_comm_set_param(flat, SUMO_PARAM_ALGORITHM, SUMO_ALGORITHM_RANKED);
    b->res_ref[rank] = SUMO_SUCCESS;
    for (int k = 0; k < 3; k++) {
        sumo_result r = sumo_allreduce(b->in[rank] + k * third * esz, b->ref[rank] + k * third * esz,
                                       third, b->dtype, SUMO_OP_AVERAGE, flat);
        if (r != SUMO_SUCCESS) b->res_ref[rank] = r;
    }
    sumo_comm_stats st;
    sumo_comm_get_stats(hier, &st);
    if (st.rounds != 3) b->res[rank] = SUMO_ERR_INTERNAL;
}

static void test_requests(void **state)
{
    (void)state;
    bufs b;
    bufs_alloc(&b, 6, SUMO_BFLOAT16, 3 * 20001, 1, 1);
    world w = make_world(3, 2, false, true, requests_body, &b);
    world_run(&w);
    assert_int_equal(same_as_ref(&b, b.count, "three requests in flight"), 0);
    bufs_free(&b);
}

/* The highest rank joins at once; the others sum twice, then join: their sums are the flat
 * ones over zeros from the joined rank. */
typedef struct join_ctx {
    bufs *b;
    int last[MAXP];
} join_ctx;

static void join_body(world *w, int rank, sumo_comm *hier, sumo_comm *flat)
{
    join_ctx *x = w->ctx;
    bufs *b = x->b;
    int P = w->H * w->L;
    size_t bytes = b->count * harness_dtype_size(b->dtype);
    if (rank == P - 1) {
        b->res[rank] = sumo_join(hier, &x->last[rank]);
        memset(b->in[rank], 0, bytes);
        memset(b->out[rank], 0, bytes), memset(b->inplace[rank], 0, bytes), memset(b->ref[rank], 0, bytes);
        b->res_inplace[rank] = SUMO_SUCCESS;
        sumo_comm_set_param(flat, SUMO_PARAM_ALGORITHM, SUMO_ALGORITHM_RANKED);
        b->res_ref[rank] = sumo_allreduce(b->in[rank], b->in[rank], b->count, b->dtype, SUMO_OP_SUM, flat);
        return;
    }
    b->res[rank] = sumo_allreduce(b->in[rank], b->out[rank], b->count, b->dtype, SUMO_OP_SUM, hier);
    if (b->res[rank] != SUMO_SUCCESS) note(b, rank, hier);
    b->res_inplace[rank] = sumo_allreduce(b->inplace[rank], b->inplace[rank], b->count, b->dtype, SUMO_OP_SUM, hier);
    sumo_result j = sumo_join(hier, &x->last[rank]);
    if (j != SUMO_SUCCESS) b->res[rank] = j;
    sumo_comm_set_param(flat, SUMO_PARAM_ALGORITHM, SUMO_ALGORITHM_RANKED);
    b->res_ref[rank] = sumo_allreduce(b->in[rank], b->ref[rank], b->count, b->dtype, SUMO_OP_SUM, flat);
}

static void test_join(void **state)
{
    (void)state;
    for (int avx = 0; avx < 2; avx++) {
        bufs b;
        bufs_alloc(&b, 6, avx ? SUMO_FLOAT16 : SUMO_FLOAT32, 5000, 1, 1);
        join_ctx x = {.b = &b};
        world w = make_world(avx ? 3 : 2, avx ? 2 : 3, false, true, join_body, &x);
        world_run(&w);
        assert_int_equal(same_as_ref(&b, b.count, "join"), 0);
        for (int r = 0; r < 6; r++) assert_int_equal(x.last[r], x.last[0]);
        bufs_free(&b);
    }
}

/* A rank that aborts and leaves while its peers are inside a call: every survivor ends with
 * SUMO_ERR_PEER_FAILURE (or TIMEOUT) within the victim's grace (it aborts, then stays 3 s before
 * it leaves), far before the deadline. */
typedef struct abort_ctx {
    bufs *b;
    int victim;
    double seconds[MAXP];
} abort_ctx;

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void abort_body(world *w, int rank, sumo_comm *hier, sumo_comm *flat)
{
    (void)flat;
    abort_ctx *x = w->ctx;
    bufs *b = x->b;
    if (rank == x->victim) {
        usleep(100000);
        sumo_comm_abort(hier, "the test's victim");
        b->res[rank] = SUMO_ERR_PEER_FAILURE;
        /* Kept a while before it leaves: the abort alone must reach every peer, whichever level
         * it waits on. */
        usleep(3000000);
        return;
    }
    double t0 = now_s();
    b->res[rank] = sumo_allreduce(b->in[rank], b->out[rank], b->count, b->dtype, SUMO_OP_SUM, hier);
    x->seconds[rank] = now_s() - t0;
    note(b, rank, hier);
}

static void test_abort_mid_call(void **state)
{
    (void)state;
    for (int victim = 0; victim < 3; victim++) {
        bufs b;
        bufs_alloc(&b, 6, SUMO_FLOAT32, 200000, 1, 1);
        int who = victim == 0 ? 5 : victim == 1 ? 0 : 3;
        abort_ctx x = {.b = &b, .victim = who};
        world w = make_world(3, 2, victim == 2, false, abort_body, &x);
        w.timeout = 20;
        world_run(&w);
        for (int r = 0; r < 6; r++) {
            if (r == who) continue;
            if (b.res[r] != SUMO_ERR_PEER_FAILURE && b.res[r] != SUMO_ERR_TIMEOUT)
                fprintf(stderr, "rank %d: %s (%s)\n", r, sumo_result_name(b.res[r]), b.msg[r]);
            assert_true(b.res[r] == SUMO_ERR_PEER_FAILURE || b.res[r] == SUMO_ERR_TIMEOUT);
            if (!(x.seconds[r] < 2.5)) fprintf(stderr, "rank %d took %.2f s\n", r, x.seconds[r]);
            assert_true(x.seconds[r] < 2.5);
        }
        bufs_free(&b);
    }
}

/* Restore-on-failure: the victim's input traps in the middle of the node's reduce-scatter on
 * node 2 (its last page unreadable: the reading thread is held), after nodes 0 and 1 wrote
 * their slices of the output and went on to wait across; the victim is then aborted. Every
 * survivor fails, its receive buffer bit for bit as before the call, its send buffer intact. */
static unsigned char *trap_page;
static size_t page_bytes;
static atomic_int trapped, released;

static void on_segv(int sig, siginfo_t *info, void *uctx)
{
    (void)uctx;
    unsigned char *at = info->si_addr;
    if (trap_page == NULL || at < trap_page || at >= trap_page + page_bytes) {
        signal(sig, SIG_DFL);
        return;
    }
    mprotect(trap_page, page_bytes, PROT_READ | PROT_WRITE);
    atomic_store(&trapped, 1);
    while (!atomic_load(&released)) sched_yield();
}

typedef struct restore_ctx {
    bufs *b;
    unsigned char *victim_in, *before[MAXP], *sent[MAXP];
    sumo_comm *victim_hier;
    _Atomic int ready;
} restore_ctx;

static void restore_body(world *w, int rank, sumo_comm *hier, sumo_comm *flat)
{
    (void)flat;
    restore_ctx *x = w->ctx;
    bufs *b = x->b;
    int victim = w->H * w->L - 1;
    b->res_ref[rank] = sumo_comm_set_param(hier, SUMO_PARAM_RESTORE_ON_FAILURE, 1);
    sumo_comm_set_param(hier, SUMO_PARAM_ALGORITHM, SUMO_ALGORITHM_TWO_LEVEL);
    const unsigned char *in = b->in[rank];
    if (rank == victim) {
        in = x->victim_in;
        x->victim_hier = hier;
        atomic_store(&x->ready, 1);
    }
    b->res[rank] = sumo_allreduce(in, b->out[rank], b->count, b->dtype, SUMO_OP_SUM, hier);
    note(b, rank, hier);
}

static void *release_trap(void *p)
{
    restore_ctx *x = p;
    while (!atomic_load(&trapped)) sched_yield();
    while (!atomic_load(&x->ready)) sched_yield();
    usleep(300000); /* nodes 0 and 1 write their slices and wait across */
    sumo_comm_abort(x->victim_hier, "the test's victim");
    atomic_store(&released, 1);
    return NULL;
}

static void test_restore_on_failure(void **state)
{
    (void)state;
    page_bytes = (size_t)sysconf(_SC_PAGESIZE);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, NULL);
    bufs b;
    size_t count = 16 * page_bytes; /* fp32: 64 pages per rank */
    bufs_alloc(&b, 6, SUMO_FLOAT32, count, 1, 1);
    restore_ctx x = {.b = &b};
    size_t bytes = count * 4;
    x.victim_in = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(x.victim_in != MAP_FAILED);
    memcpy(x.victim_in, b.in[5], bytes);
    for (int r = 0; r < 6; r++) {
        for (size_t i = 0; i < count; i++) harness_set(SUMO_FLOAT32, b.out[r], i, -1.5 - (double)(i % 613) - r);
        x.before[r] = malloc(bytes);
        memcpy(x.before[r], b.out[r], bytes);
    }
    trap_page = x.victim_in + bytes - page_bytes;
    atomic_store(&trapped, 0);
    atomic_store(&released, 0);
    mprotect(trap_page, page_bytes, PROT_NONE);
    pthread_t rel;
    pthread_create(&rel, NULL, release_trap, &x);
    world w = make_world(3, 2, false, false, restore_body, &x);
    w.timeout = 20;
    world_run(&w);
    pthread_join(rel, NULL);
    trap_page = NULL;
    for (int r = 0; r < 5; r++) {
        assert_int_equal(b.res_ref[r], SUMO_SUCCESS);
        if (b.res[r] != SUMO_ERR_PEER_FAILURE && b.res[r] != SUMO_ERR_TIMEOUT)
            fprintf(stderr, "rank %d: %s (%s)\n", r, sumo_result_name(b.res[r]), b.msg[r]);
        assert_true(b.res[r] == SUMO_ERR_PEER_FAILURE || b.res[r] == SUMO_ERR_TIMEOUT);
        assert_memory_equal(b.out[r], x.before[r], bytes);
        free(x.before[r]);
    }
    free(x.before[5]);
    munmap(x.victim_in, bytes);
    bufs_free(&b);
}

/* ---- the composed transport's routing ------------------------------------------------------- */

/* A pair neither on one node nor at one local rank, without options.any: an internal error
 * that names the pair, before any byte moves (the two-level algorithms never ask for one: the
 * tests above run them all without options.any). */
static void unreachable_body(world *w, int rank, sumo_comm *hier, sumo_comm *flat)
{
    (void)flat;
    bufs *b = w->ctx;
    int H = w->H, L = w->L, h = rank / L, l = rank % L;
    int peer = ((h + 1) % H) * L + (l + 1) % L, on;
    sumo__transport *tp = hier->tp;
    b->res_ref[rank] = sumo__hier_tp_route(tp, peer, &on) == NULL ? SUMO_SUCCESS : SUMO_ERR_INTERNAL;
    float v = 1;
    b->res[rank] = tp->ops->sendrecv(tp, &v, sizeof v, peer, NULL, 0, -1);
    note(b, rank, hier);
}

static void test_unreachable_pair(void **state)
{
    (void)state;
    bufs b;
    bufs_alloc(&b, 4, SUMO_FLOAT32, 1, 1, 1);
    world w = make_world(2, 2, false, false, unreachable_body, &b);
    world_run(&w);
    for (int r = 0; r < 4; r++) {
        assert_int_equal(b.res_ref[r], SUMO_SUCCESS);
        assert_int_equal(b.res[r], SUMO_ERR_INTERNAL);
        assert_non_null(strstr(b.msg[r], "unreachable"));
    }
    bufs_free(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chain_equals_flat_ranked),
        cmocka_unit_test(test_two_level_closed_form),
        cmocka_unit_test(test_adasum_host_equals_flat_point_to_point),
        cmocka_unit_test(test_adasum_without_any),
        cmocka_unit_test(test_other_kinds_equal_flat),
        cmocka_unit_test(test_compressed_over_any),
        cmocka_unit_test(test_create_refusals),
        cmocka_unit_test(test_nodes_of_different_sizes),
        cmocka_unit_test(test_any_out_of_order),
        cmocka_unit_test(test_disagreement),
        cmocka_unit_test(test_requests),
        cmocka_unit_test(test_join),
        cmocka_unit_test(test_abort_mid_call),
        cmocka_unit_test(test_restore_on_failure),
        cmocka_unit_test(test_unreachable_pair),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
