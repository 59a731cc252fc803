/*
 * Adasum's failures, on the threads transport: a bad layout, ranks that disagree, a destroyed
 * op and non-finite inputs give every rank the same verdict and leave the handle usable (a
 * non-finite tensor becomes NaN and is named, the others stay exact); the API's edges.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "support/adasum_run.h"
#include "support/harness.h"
#include "support/reference.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- failures: every rank gets the same verdict ----------------------------------------- */

enum fault { SUM_WRONG_ONE_RANK, SUM_WRONG_ALL, LAYOUT_DIFFERS, HIER_DIFFERS, OP_DIFFERS,
             DESTROYED_OP, NAN_ONE_RANK, INF_TWO_TENSORS, NAN_SINGLE_RANK, NAN_HIER,
             NAN_HIER_ONE_GROUP };

typedef struct fault_run {
    enum fault which;
    int size;
    bool p2p;
    sumo_result res[MAXP], after[MAXP];
    char msg[MAXP][256];
    float out[MAXP][64];
    float after_value[MAXP];
} fault_run;

static const size_t fault_counts[] = {5, 0, 7, 3, 9, 1}; /* 25 elements */
#define FAULT_N 25

static void fault_body(sumo_comm *comm, int rank, int size, void *arg)
{
    fault_run *f = arg;
    sumo_comm_set_timeout(comm, 30);
    if (f->p2p) sumo_comm_set_param(comm, SUMO_PARAM_ALGORITHM, SUMO_ALGORITHM_RING);
    size_t counts[6];
    memcpy(counts, fault_counts, sizeof counts);
    sumo_adasum_options o = {.struct_size = sizeof o, .tensor_counts = counts, .ntensors = 6};
    float in[FAULT_N];
    for (size_t i = 0; i < FAULT_N; i++) in[i] = (float)uniform_at(3, rank, i);
    switch (f->which) {
    case SUM_WRONG_ONE_RANK: if (rank == size - 1) counts[2] = 8; break;
    case SUM_WRONG_ALL: counts[0] = 4; break;
    case LAYOUT_DIFFERS: if (rank == 1) { counts[2] = 6; counts[3] = 4; } break;
    case HIER_DIFFERS: o.hierarchical = rank == 0; o.group_size = size; break;
    case NAN_ONE_RANK: if (rank == 1) in[5 + 3] = NAN; break;             /* tensor 2 */
    case INF_TWO_TENSORS: if (rank == size - 1) { in[14] = -INFINITY; in[24] = NAN; } break;
    case NAN_SINGLE_RANK: in[13] = NAN; break;                                /* tensor 3 */
    case NAN_HIER:
    case NAN_HIER_ONE_GROUP:
        o.hierarchical = 1;
        o.group_size = f->which == NAN_HIER ? 2 : size;
        if (rank == size - 1) in[10] = INFINITY; /* tensor 2 */
        break;
    default: break;
    }
    sumo_op op = SUMO_OP_ADASUM;
    sumo_result cr = sumo_op_create_adasum(comm, &o, &op);
    if (f->which == OP_DIFFERS && rank == 0) op = SUMO_OP_ADASUM;
    if (f->which == DESTROYED_OP && rank == 1) sumo_op_destroy(comm, op);
    (void)cr;
    f->res[rank] = sumo_allreduce(in, f->out[rank], FAULT_N, SUMO_FLOAT32, op, comm);
    const char *m;
    sumo_comm_error_message(comm, &m);
    snprintf(f->msg[rank], sizeof f->msg[rank], "%s", m);
    /* The handle stays usable. */
    float one = 1.0f;
    f->after[rank] = sumo_allreduce(&one, &f->after_value[rank], 1, SUMO_FLOAT32, SUMO_OP_SUM, comm);
    sumo_op_destroy(comm, op);
}

static fault_run *run_fault_mode(enum fault which, int size, bool p2p)
{
    fault_run *f = calloc(1, sizeof *f);
    f->which = which;
    f->size = size;
    f->p2p = p2p;
    assert_int_equal(harness_run_threads(size, fault_body, f), 0);
    for (int r = 0; r < size; r++) {
        assert_int_equal(f->after[r], SUMO_SUCCESS);
        assert_true(f->after_value[r] == (float)size);
    }
    return f;
}

static fault_run *run_fault(enum fault which, int size) { return run_fault_mode(which, size, false); }

static void expect_all(fault_run *f, sumo_result want)
{
    for (int r = 0; r < f->size; r++) {
        if (f->res[r] != want)
            fprintf(stderr, "fault %d P=%d rank %d: %s (%s), want %s\n", f->which, f->size, r,
                    sumo_result_name(f->res[r]), f->msg[r], sumo_result_name(want));
        assert_int_equal(f->res[r], want);
    }
}

static void test_bad_layouts_and_mismatch(void **state)
{
    (void)state;
    const int ps[] = {2, 3, 4};
    for (size_t p = 0; p < 3; p++) {
        fault_run *f;
        f = run_fault(SUM_WRONG_ONE_RANK, ps[p]);
        expect_all(f, SUMO_ERR_INVALID_ARGUMENT);
        assert_non_null(strstr(f->msg[ps[p] - 1], "tensors hold"));
        free(f);
        f = run_fault(SUM_WRONG_ALL, ps[p]);
        expect_all(f, SUMO_ERR_INVALID_ARGUMENT);
        free(f);
        f = run_fault(LAYOUT_DIFFERS, ps[p]);
        expect_all(f, SUMO_ERR_MISMATCH);
        assert_non_null(strstr(f->msg[0], "layout"));
        free(f);
        f = run_fault(HIER_DIFFERS, ps[p]);
        expect_all(f, SUMO_ERR_MISMATCH);
        free(f);
        f = run_fault(OP_DIFFERS, ps[p]);
        expect_all(f, SUMO_ERR_MISMATCH);
        free(f);
        f = run_fault(DESTROYED_OP, ps[p]);
        expect_all(f, SUMO_ERR_INVALID_ARGUMENT);
        free(f);
    }
}

/* The reference for the fault layout with rank inputs regenerated as fault_body makes them. */
static void fault_reference(int size, double *want)
{
    double *u[MAXP] = {0};
    for (int r = 0; r < size; r++) {
        u[r] = malloc(FAULT_N * sizeof(double));
        for (size_t i = 0; i < FAULT_N; i++) u[r][i] = (float)uniform_at(3, r, i);
    }
    size_t off[7] = {0};
    for (size_t t = 0; t < 6; t++) off[t + 1] = off[t] + fault_counts[t];
    ref_adasum_tree(u, size, off, 6);
    memcpy(want, u[0], FAULT_N * sizeof(double));
    for (int r = 0; r < size; r++) free(u[r]);
}

static void expect_nonfinite(fault_run *f, size_t tensor, size_t also_nan_tensor, bool check_rest)
{
    expect_all(f, SUMO_ERR_NONFINITE);
    char name[32];
    snprintf(name, sizeof name, "tensor %zu ", tensor);
    double want[FAULT_N];
    fault_reference(f->size, want);
    size_t off[7] = {0};
    for (size_t t = 0; t < 6; t++) off[t + 1] = off[t] + fault_counts[t];
    for (int r = 0; r < f->size; r++) {
        assert_non_null(strstr(f->msg[r], name));
        assert_memory_equal(f->out[r], f->out[0], sizeof f->out[0][0] * FAULT_N);
        for (size_t t = 0; t < 6; t++) {
            for (size_t i = off[t]; i < off[t + 1]; i++) {
                if (t == tensor || t == also_nan_tensor) assert_true(isnan(f->out[r][i]));
                else if (check_rest)
                    assert_true(fabs(f->out[r][i] - want[i]) <= 1e-5 * (1 + fabs(want[i])));
                else
                    assert_true(isfinite(f->out[r][i]));
            }
        }
    }
}

static void test_nonfinite(void **state)
{
    (void)state;
    const int ps[] = {2, 3, 4, 5, 8};
    for (int p2p = 0; p2p < 2; p2p++) {
        for (size_t p = 0; p < sizeof ps / sizeof ps[0]; p++) {
            fault_run *f = run_fault_mode(NAN_ONE_RANK, ps[p], p2p);
            expect_nonfinite(f, 2, 2, true);
            free(f);
            f = run_fault_mode(INF_TWO_TENSORS, ps[p], p2p);
            expect_nonfinite(f, 3, 5, true);
            free(f);
        }
        /* One rank: nothing is combined, the tensor still becomes NaN and is named. */
        fault_run *f = run_fault_mode(NAN_SINGLE_RANK, 1, p2p);
        expect_nonfinite(f, 3, 3, true);
        free(f);
        /* Hierarchical: groups of 2 (G = 2, and G = 3 with the fold), and one group. */
        const int hs[] = {4, 6};
        for (size_t p = 0; p < 2; p++) {
            f = run_fault_mode(NAN_HIER, hs[p], p2p);
            expect_nonfinite(f, 2, 2, false);
            free(f);
        }
        f = run_fault_mode(NAN_HIER_ONE_GROUP, 3, p2p);
        expect_nonfinite(f, 2, 2, false);
        free(f);
    }
}

/* ---- API edges ---------------------------------------------------------------------------- */

static void api_body(sumo_comm *comm, int rank, int size, void *arg)
{
    (void)rank, (void)size;
    int *bad = arg;
    size_t counts[2] = {1, 2};
    sumo_op op;
    sumo_adasum_options o = {.struct_size = sizeof o, .tensor_counts = counts, .ntensors = 2};
    sumo_adasum_options small = o, large = o;
    small.struct_size = 8;
    large.struct_size = sizeof o + 8;
    sumo_adasum_options nullc = o;
    nullc.tensor_counts = NULL;
    sumo_adasum_options hier = o;
    hier.hierarchical = 1;
    hier.group_size = 3; /* does not divide 2 */
    if (sumo_op_create_adasum(comm, &small, &op) != SUMO_ERR_INVALID_ARGUMENT) bad[rank]++;
    if (sumo_op_create_adasum(comm, &large, &op) != SUMO_ERR_INVALID_ARGUMENT) bad[rank]++;
    if (sumo_op_create_adasum(comm, &nullc, &op) != SUMO_ERR_INVALID_ARGUMENT) bad[rank]++;
    if (sumo_op_create_adasum(comm, &hier, &op) != SUMO_ERR_INVALID_ARGUMENT) bad[rank]++;
    if (sumo_op_create_adasum(comm, NULL, &op) != SUMO_ERR_INVALID_ARGUMENT) bad[rank]++;
    if (sumo_op_destroy(comm, SUMO_OP_SUM) != SUMO_ERR_INVALID_ARGUMENT) bad[rank]++;
    if (sumo_op_create_adasum(comm, &o, &op) != SUMO_SUCCESS) bad[rank]++;
    if (op < SUMO_OP_PREDEFINED_COUNT) bad[rank]++;
    counts[0] = 99; /* the op copied the layout */
    float in[3] = {1, 2, 3}, out[3];
    if (sumo_allreduce(in, out, 3, SUMO_FLOAT32, op, comm) != SUMO_SUCCESS) bad[rank]++;
    /* Asynchronous requests take Adasum ops too. */
    sumo_request *req;
    if (sumo_allreduce_start(in, out, 3, SUMO_FLOAT32, op, comm, &req) != SUMO_SUCCESS ||
        sumo_request_wait(req) != SUMO_SUCCESS)
        bad[rank]++;
    if (out[0] != 1 || out[1] != 2 || out[2] != 3) bad[rank]++; /* identical inputs: Adasum(a,a)=a */
    if (sumo_op_destroy(comm, op) != SUMO_SUCCESS) bad[rank]++;
    if (sumo_op_destroy(comm, op) != SUMO_ERR_INVALID_ARGUMENT) bad[rank]++;
    /* Zero elements, NULL buffers. */
    if (sumo_allreduce(NULL, NULL, 0, SUMO_FLOAT16, SUMO_OP_ADASUM, comm) != SUMO_SUCCESS) bad[rank]++;
}

static void test_api_edges(void **state)
{
    (void)state;
    int bad[2] = {0, 0};
    assert_int_equal(harness_run_threads(2, api_body, bad), 0);
    assert_int_equal(bad[0], 0);
    assert_int_equal(bad[1], 0);
}
int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_layouts_and_mismatch),
        cmocka_unit_test(test_nonfinite),
        cmocka_unit_test(test_api_edges),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
