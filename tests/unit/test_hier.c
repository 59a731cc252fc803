/*
 * sumo_hier.h over threads communicators (a node's ranks on one, each local rank's peers on
 * the other nodes on another), against independent references: sum and average as two
 * levels of in-order sums (support/reference.c), bit for bit, for every dtype, node shape and
 * tail length; Adasum against the documented tree over the nodes' averages (the reference of
 * sumo's hierarchical option, support/adasum_run.h), within its bound; every rank the same
 * bits, in place and out of place alike. Then what a caller gets wrong: arguments, layouts
 * that differ inside a node, nodes of different sizes, counts that differ between nodes.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "sumo_hier.h"
#include "support/adasum_run.h"

#include <pthread.h>

#define MAXL 8
#define MAXH 8

typedef struct hjob {
    int H, L[MAXH]; /* L per node: equal unless a test breaks it */
    job *j;         /* inputs, outputs and the Adasum layout; rank h * L + l */
    sumo_op op;
    double timeout;
    bool skew_layout;  /* local rank 1 of node 0 passes another layout */
    bool skew_count;   /* node 1 passes one element fewer */
    sumo_comm *node[MAXH][MAXL], *across[MAXL][MAXH];
    sumo_result create[MAXP], res[MAXP], res2[MAXP];
    char msg[MAXP][320];
} hjob;

typedef struct hrank {
    hjob *x;
    int h, l, rank;
} hrank;

static void *hier_rank(void *p)
{
    hrank *a = p;
    hjob *x = a->x;
    job *j = x->j;
    sumo_comm *node = x->node[a->h][a->l], *across = x->across[a->l][a->h];
    if (x->timeout > 0) {
        sumo_comm_set_timeout(node, x->timeout);
        sumo_comm_set_timeout(across, x->timeout);
    }
    sumo_hier *hier = NULL;
    x->create[a->rank] = sumo_hier_create(node, across, &hier);
    x->res[a->rank] = x->res2[a->rank] = x->create[a->rank];
    if (hier == NULL) return NULL;
    size_t count = j->count - (x->skew_count && a->h == 1);
    size_t other[2] = {1, 0};
    const size_t *counts = j->counts;
    size_t nt = j->ntensors;
    if (x->skew_layout && a->h == 0 && a->l == 1) {
        other[0] = j->count > 0 ? j->count - 1 : 0, other[1] = j->count - other[0];
        counts = other, nt = 2;
    }
    size_t bytes = j->count * harness_dtype_size(j->dtype);
    x->res[a->rank] = sumo_hier_allreduce(j->in[a->rank], j->out[a->rank], count, j->dtype,
                                          x->op, counts, nt, NULL, hier);
    const char *m = "";
    sumo_hier_error_message(hier, &m);
    snprintf(x->msg[a->rank], sizeof x->msg[a->rank], "%s", m);
    if (x->res[a->rank] == SUMO_SUCCESS) {
        if (bytes) memcpy(j->out2[a->rank], j->in[a->rank], bytes);
        x->res2[a->rank] = sumo_hier_allreduce(j->out2[a->rank], j->out2[a->rank], count,
                                               j->dtype, x->op, counts, nt, NULL, hier);
    }
    sumo_hier_destroy(hier);
    return NULL;
}

/* Runs the job: H nodes of L[h] ranks, one thread per rank. */
static void run_hier(hjob *x)
{
    int H = x->H, maxL = 0, rank = 0;
    for (int h = 0; h < H; h++) maxL = x->L[h] > maxL ? x->L[h] : maxL;
    for (int h = 0; h < H; h++)
        assert_int_equal(sumo_comm_create_threads(x->L[h], x->node[h]), SUMO_SUCCESS);
    for (int l = 0; l < maxL; l++) {
        sumo_comm *tmp[MAXH];
        int n = 0;
        for (int h = 0; h < H; h++)
            if (l < x->L[h]) n++;
        assert_int_equal(sumo_comm_create_threads(n, tmp), SUMO_SUCCESS);
        for (int h = 0, k = 0; h < H; h++)
            if (l < x->L[h]) x->across[l][h] = tmp[k++];
    }
    pthread_t ids[MAXP];
    hrank args[MAXP];
    for (int h = 0; h < H; h++)
        for (int l = 0; l < x->L[h]; l++, rank++) {
            args[rank] = (hrank){.x = x, .h = h, .l = l, .rank = rank};
            assert_int_equal(pthread_create(&ids[rank], NULL, hier_rank, &args[rank]), 0);
        }
    for (int r = 0; r < rank; r++) pthread_join(ids[r], NULL);
    for (int h = 0; h < H; h++)
        for (int l = 0; l < x->L[h]; l++) {
            sumo_comm_destroy(x->node[h][l]);
            sumo_comm_destroy(x->across[l][h]);
        }
}

static void shape(hjob *x, job *j, int H, int L)
{
    memset(x, 0, sizeof *x);
    x->H = H;
    for (int h = 0; h < H; h++) x->L[h] = L;
    x->j = j;
    j->size = H * L;
}

static const sumo_dtype dtypes[] = {SUMO_FLOAT32, SUMO_FLOAT64, SUMO_FLOAT16, SUMO_BFLOAT16};
static const int shapes[][2] = {{2, 2}, {3, 2}, {2, 3}, {1, 4}, {4, 1}, {2, 4}, {3, 3}};

/* Every rank's result equals rank 0's, in place and out of place; the count of failures. */
static int same_bits(const hjob *x, const char *what)
{
    const job *j = x->j;
    size_t bytes = j->count * harness_dtype_size(j->dtype);
    for (int r = 0; r < j->size; r++) {
        if (x->res[r] != SUMO_SUCCESS || x->res2[r] != SUMO_SUCCESS) {
            fprintf(stderr, "%s: rank %d: %s / %s (%s)\n", what, r, sumo_result_name(x->res[r]),
                    sumo_result_name(x->res2[r]), x->msg[r]);
            return 1;
        }
        if (memcmp(j->out[r], j->out[0], bytes) != 0 || memcmp(j->out2[r], j->out[0], bytes) != 0) {
            fprintf(stderr, "%s: rank %d's bits differ from rank 0's\n", what, r);
            return 1;
        }
    }
    return 0;
}

/* Sum and average: node h's value is its L inputs summed in order (divided by L for the
 * average) and stored in the dtype; the result is the H node values summed in node order
 * (divided by H) and stored. Element by element, exactly. */
static void test_sum_average_two_levels(void **state)
{
    (void)state;
    const size_t counts[] = {0, 1, 2, 5, 1001};
    int bad = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++)
            for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++)
                for (int avg = 0; avg < 2; avg++) {
                    int H = shapes[s][0], L = shapes[s][1];
                    job j = {.dtype = dtypes[d], .count = counts[c]};
                    hjob x;
                    shape(&x, &j, H, L);
                    x.op = avg ? SUMO_OP_AVERAGE : SUMO_OP_SUM;
                    job_alloc(&j);
                    for (int r = 0; r < j.size; r++)
                        for (size_t i = 0; i < j.count; i++)
                            harness_set(j.dtype, j.in[r], i, uniform_at(40 + s, r, i) * (1 + r));
                    run_hier(&x);
                    char what[96];
                    snprintf(what, sizeof what, "%s H %d L %d dtype %d count %zu", avg ? "average" : "sum", H,
                             L, (int)j.dtype, j.count);
                    int b = same_bits(&x, what);
                    for (size_t i = 0; !b && i < j.count; i++) {
                        double node[MAXH], v[MAXL];
                        for (int h = 0; h < H; h++) {
                            for (int l = 0; l < L; l++) v[l] = harness_get(j.dtype, j.in[h * L + l], i);
                            node[h] = ref_round_to(j.dtype, ref_sum_in_order(j.dtype, v, L, avg ? L : 1));
                        }
                        double want = ref_round_to(j.dtype, ref_sum_in_order(j.dtype, node, H, avg ? H : 1));
                        double got = harness_get(j.dtype, j.out[0], i);
                        if (got != want) {
                            fprintf(stderr, "%s: element %zu is %.17g, want %.17g\n", what, i, got, want);
                            b = 1;
                        }
                    }
                    bad += b;
                    job_free(&j);
                }
    assert_int_equal(bad, 0);
}

/* Adasum: the tree over the nodes' averages (sumo's hierarchical Adasum with a group per
 * node), per tensor, for layouts whose tensors fall to the local ranks unevenly. */
static void test_adasum_over_node_averages(void **state)
{
    (void)state;
    static size_t many_tiny[300];
    for (size_t t = 0; t < 300; t++) many_tiny[t] = t % 4;
    static const size_t awkward[] = {0, 1, 7, 0, 33, 1, 517, 3, 0, 2, 129};
    static const size_t one_big[] = {3, 2000, 5};
    struct {
        const size_t *counts;
        size_t ntensors, count;
    } layouts[] = {{NULL, 0, 1001}, {NULL, 0, 1}, {awkward, 11, 0}, {many_tiny, 300, 0},
                   {one_big, 3, 0}};
    int bad = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++)
            for (size_t k = 0; k < sizeof layouts / sizeof layouts[0]; k++) {
                int H = shapes[s][0], L = shapes[s][1];
                job j = {.dtype = dtypes[d], .counts = layouts[k].counts,
                         .ntensors = layouts[k].ntensors, .count = layouts[k].count,
                         .hierarchical = 1, .group_size = L};
                for (size_t t = 0; t < j.ntensors; t++) j.count += j.counts[t];
                hjob x;
                shape(&x, &j, H, L);
                x.op = SUMO_OP_ADASUM;
                job_alloc(&j);
                fill_random(&j, 60 + s);
                run_hier(&x);
                char what[96];
                snprintf(what, sizeof what, "Adasum H %d L %d dtype %d layout %zu", H, L,
                         (int)j.dtype, k);
                int b = same_bits(&x, what);
                if (!b) {
                    double *want = reference(&j);
                    errors e = measure(&j, j.out[0], want);
                    /* The node average rounds once more than the reference's (in double). */
                    double tol = tensor_tolerance(&j) + 2 * harness_eps(j.dtype);
                    if (!(e.per_tensor <= tol) ||
                        (j.count >= 16 && !(e.total < 100 * harness_eps(j.dtype)))) {
                        fprintf(stderr, "%s: error %.3g, worst tensor %.3g (limit %.3g)\n", what,
                                e.total, e.per_tensor, tol);
                        b = 1;
                    }
                    free(want);
                }
                bad += b;
                job_free(&j);
            }
    assert_int_equal(bad, 0);
}

static void test_arguments(void **state)
{
    (void)state;
    sumo_comm *a[2], *b[1];
    assert_int_equal(sumo_comm_create_threads(1, a), SUMO_SUCCESS);
    assert_int_equal(sumo_comm_create_threads(1, b), SUMO_SUCCESS);
    sumo_hier *x = NULL;
    assert_int_equal(sumo_hier_create(NULL, b[0], &x), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_hier_create(a[0], a[0], &x), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_hier_create(a[0], b[0], NULL), SUMO_ERR_INVALID_ARGUMENT);
    assert_null(x);
    assert_int_equal(sumo_hier_create(a[0], b[0], &x), SUMO_SUCCESS);
    float buf[4] = {1, 2, 3, 4};
    size_t lay[2] = {1, 2};
    const char *m = NULL;
    assert_int_equal(sumo_hier_allreduce(buf, buf, 4, SUMO_FLOAT32, 7, NULL, 0, NULL, x),
                     SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_hier_error_message(x, &m), SUMO_SUCCESS);
    assert_non_null(strstr(m, "op 7"));
    assert_int_equal(sumo_hier_allreduce(buf, buf, 4, SUMO_FLOAT32, SUMO_OP_ADASUM, lay, 2, NULL, x),
                     SUMO_ERR_INVALID_ARGUMENT);
    sumo_hier_error_message(x, &m);
    assert_non_null(strstr(m, "hold 3 elements, count is 4"));
    assert_int_equal(sumo_hier_allreduce(buf, buf, 3, SUMO_FLOAT32, SUMO_OP_SUM, lay, 2, NULL, x),
                     SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_hier_allreduce(NULL, buf, 4, SUMO_FLOAT32, SUMO_OP_SUM, NULL, 0, NULL, x),
                     SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_hier_allreduce(buf, buf, 4, (sumo_dtype)99, SUMO_OP_SUM, NULL, 0, NULL, x),
                     SUMO_ERR_INVALID_ARGUMENT);
    /* Overlapping buffers: the node level's own check, reported through the handle. */
    assert_int_equal(sumo_hier_allreduce(buf, buf + 1, 3, SUMO_FLOAT32, SUMO_OP_SUM, NULL, 0, NULL, x),
                     SUMO_ERR_INVALID_ARGUMENT);
    sumo_hier_error_message(x, &m);
    assert_non_null(strstr(m, "overlap"));
    /* The handle still works after refusals. */
    assert_int_equal(sumo_hier_allreduce(buf, buf, 4, SUMO_FLOAT32, SUMO_OP_AVERAGE, NULL, 0, NULL, x),
                     SUMO_SUCCESS);
    assert_true(buf[0] == 1 && buf[3] == 4);
    sumo_hier_error_message(x, &m);
    assert_string_equal(m, "");
    assert_int_equal(sumo_hier_allreduce(buf, buf, 4, SUMO_FLOAT32, SUMO_OP_SUM, NULL, 0, NULL, NULL),
                     SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_hier_destroy(x), SUMO_SUCCESS);
    assert_int_equal(sumo_hier_destroy(NULL), SUMO_SUCCESS);
    sumo_comm_destroy(a[0]);
    sumo_comm_destroy(b[0]);
}

/* Node 0 has two ranks, node 1 one: node 0's ranks see their across sizes differ and fail
 * with a message that says so; node 1's rank, whose peer never comes, at its deadline. */
static void test_nodes_of_different_sizes(void **state)
{
    (void)state;
    job j = {.dtype = SUMO_FLOAT32, .count = 8, .size = 3};
    hjob x;
    memset(&x, 0, sizeof x);
    x.H = 2, x.L[0] = 2, x.L[1] = 1, x.j = &j, x.op = SUMO_OP_SUM, x.timeout = 1;
    job_alloc(&j);
    run_hier(&x);
    assert_int_equal(x.create[0], SUMO_ERR_MISMATCH);
    assert_int_equal(x.create[1], SUMO_ERR_MISMATCH);
    assert_int_equal(x.create[2], SUMO_ERR_TIMEOUT);
    job_free(&j);
}

/* A layout that differs inside a node, and a count that differs between nodes: refused with
 * SUMO_ERR_MISMATCH on the ranks that see it, never a wrong result. */
static void test_disagreements(void **state)
{
    (void)state;
    for (int which = 0; which < 2; which++) {
        static const size_t lay[] = {10, 30};
        job j = {.dtype = SUMO_FLOAT32, .count = 40, .counts = lay, .ntensors = 2};
        hjob x;
        shape(&x, &j, 2, 2);
        x.op = which == 0 ? SUMO_OP_ADASUM : SUMO_OP_SUM;
        if (which == 1) j.counts = NULL, j.ntensors = 0;
        x.skew_layout = which == 0, x.skew_count = which == 1;
        x.timeout = 2;
        job_alloc(&j);
        fill_random(&j, 5);
        run_hier(&x);
        /* The layout: node 0 refuses it (its digest check); node 1 then waits on the across
         * peers of node 0 and fails at its deadline or when they give up. */
        for (int r = 0; r < 4; r++) {
            bool seen = which == 0 ? r < 2 : true;
            if (seen) assert_int_equal(x.res[r], SUMO_ERR_MISMATCH);
            else assert_int_not_equal(x.res[r], SUMO_SUCCESS);
        }
        assert_non_null(strstr(x.msg[0], which == 0 ? "layout" : "across"));
        job_free(&j);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sum_average_two_levels),
        cmocka_unit_test(test_adasum_over_node_averages),
        cmocka_unit_test(test_arguments),
        cmocka_unit_test(test_nodes_of_different_sizes),
        cmocka_unit_test(test_disagreements),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
