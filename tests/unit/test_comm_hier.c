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
            size_t counts[] = {0, 1, (size_t)L - 1, chunk - 1, chunk, chunk + 1, 3 * chunk + 5};
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


int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chain_equals_flat_ranked),
        cmocka_unit_test(test_two_level_closed_form),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
