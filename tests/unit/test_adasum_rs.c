/*
 * Adasum as a reduce-scatter (sumo_reduce_scatter with an Adasum op), in FSDP2's layout: each
 * tensor padded with zeros to a multiple of P, the send buffer viewed as (P, recvcount), row q
 * holding chunk q of every tensor in order; rank q's output is row q of the result.
 *
 * References, both per tensor on the unpadded tensors:
 *   - tree_ref: written here, sharing no code with the library or support/reference.c: the
 *     pairwise combine (1 - a.b/2|a|^2) a + (1 - a.b/2|b|^2) b in double, a coefficient of 1
 *     below the squared norm 2^-511, over the tree of docs/design/adasum.md (pairs (0,1) ..
 *     (2R-2, 2R-1) first when P is not a power of two, then the balanced tree in order);
 *   - the unsharded Adasum: sumo_allreduce of the same tensors, unpadded, with an op of their
 *     layout (the Gram form for fp32, fp16 and bf16; the tree for fp64).
 * Tolerance: relative L2 error of the whole result below 100 eps of the dtype (Horovod's), and
 * per tensor below 8 (levels + 1) eps of the dtype times the largest input norm of the tensor.
 * Padding must come out exactly 0. Both data paths (ranks reading each other's rows in place,
 * and the all-to-all over messages, forced with SUMO_ALGORITHM_RING, which MPI and shm take)
 * and an in-place call must give the same bits.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "support/harness.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAXP 17
#define MAXT 8

/* ---- the reference, in double -------------------------------------------------------------- */

static void pair_ref(double *a, const double *b, size_t n)
{
    double d = 0, A = 0, B = 0;
    for (size_t i = 0; i < n; i++) {
        d += a[i] * b[i];
        A += a[i] * a[i];
        B += b[i] * b[i];
    }
    double ca = A < 0x1p-511 ? 1.0 : 1.0 - d / (2 * A);
    double cb = B < 0x1p-511 ? 1.0 : 1.0 - d / (2 * B);
    for (size_t i = 0; i < n; i++) a[i] = ca * a[i] + cb * b[i];
}

/* v[0] = the tree over v[0..P), each of n elements; overwrites v. */
static void tree_ref(double **v, int P, size_t n)
{
    int P2 = 1;
    while (P2 * 2 <= P) P2 *= 2;
    int R = P - P2;
    double *w[MAXP];
    for (int i = 0; i < R; i++) {
        pair_ref(v[2 * i], v[2 * i + 1], n);
        w[i] = v[2 * i];
    }
    for (int i = R; i < P2; i++) w[i] = v[i + R];
    for (int span = 1; span < P2; span *= 2)
        for (int i = 0; i + span < P2; i += 2 * span) pair_ref(w[i], w[i + span], n);
    if (w[0] != v[0]) memcpy(v[0], w[0], n * sizeof(double));
}

/* ---- one case ------------------------------------------------------------------------------ */

typedef struct rs_case {
    int P;
    sumo_dtype dtype;
    size_t T;
    size_t counts[MAXT]; /* unpadded */
    bool predefined;     /* SUMO_OP_ADASUM: one tensor, counts[0] a multiple of P */
    bool p2p;
    /* derived */
    size_t padded[MAXT], recvcount, full;
    unsigned char *send[MAXP], *recv[MAXP], *inplace[MAXP], *flat[MAXP], *flat_out[MAXP];
    sumo_result res[MAXP], res_in[MAXP], res_flat[MAXP];
    char msg[MAXP][256];
} rs_case;

/* Element i of tensor t on rank r, stored in the dtype (its value read back through the
 * harness). Tensor 2 is zero on rank 1: a tiny norm inside the tree. */
static double value(const rs_case *k, int r, size_t t, size_t i)
{
    if (t == 2 && r == 1) return 0.0;
    /* Tensor 6 in fp32: parallel inputs, each odd rank nearly cancelling the rank before it,
     * so the first level's nodes are 2^-20 of their operands: as quadratic forms of the Gram
     * matrix their norms keep about 12 bits (the Gram form flags them and the tree takes
     * over), while the tree, on stored fp32 inputs, stays within its bound. */
    if (t == 6 && k->dtype == SUMO_FLOAT32) {
        double c = (1.0 + (double)(r / 2) / 8.0) * (r % 2 ? -(1.0 + 0x1p-20) : 1.0);
        return c * harness_uniform_at(0x5eed + t, 0, i);
    }
    return harness_uniform_at(0x5eed + t, (uint64_t)r, i) * (1.0 + (double)t);
}

static void rank_fn(sumo_comm *comm, int rank, int size, void *arg)
{
    (void)size;
    rs_case *k = arg;
    sumo_comm_set_timeout(comm, 30);
    if (k->p2p) sumo_comm_set_param(comm, SUMO_PARAM_ALGORITHM, SUMO_ALGORITHM_RING);
    sumo_op op = SUMO_OP_ADASUM, flat_op = SUMO_OP_ADASUM;
    if (!k->predefined) {
        sumo_adasum_options o = {.struct_size = sizeof o, .tensor_counts = k->padded,
                                 .ntensors = k->T};
        sumo_adasum_options f = {.struct_size = sizeof f, .tensor_counts = k->counts,
                                 .ntensors = k->T};
        if (sumo_op_create_adasum(comm, &o, &op) != SUMO_SUCCESS) op = (sumo_op)-1;
        if (sumo_op_create_adasum(comm, &f, &flat_op) != SUMO_SUCCESS) flat_op = (sumo_op)-1;
    }
    k->res[rank] = sumo_reduce_scatter(k->send[rank], k->recv[rank], k->recvcount, k->dtype, op,
                                       comm);
    const char *m;
    sumo_comm_error_message(comm, &m);
    snprintf(k->msg[rank], sizeof k->msg[rank], "%s", m);
    size_t esz = harness_dtype_size(k->dtype);
    k->res_in[rank] = sumo_reduce_scatter(k->inplace[rank],
                                          k->inplace[rank] + (size_t)rank * k->recvcount * esz,
                                          k->recvcount, k->dtype, op, comm);
    k->res_flat[rank] = sumo_allreduce(k->flat[rank], k->flat_out[rank], k->full, k->dtype,
                                       flat_op, comm);
    if (!k->predefined) {
        sumo_op_destroy(comm, op);
        sumo_op_destroy(comm, flat_op);
    }
}

static size_t chunk_of(const rs_case *k, size_t t) { return k->padded[t] / (size_t)k->P; }

/* Where element i of tensor t lies: the rank q whose row holds it, and its place in the row. */
static void place(const rs_case *k, size_t t, size_t i, int *q, size_t *at)
{
    size_t c = chunk_of(k, t), before = 0;
    for (size_t u = 0; u < t; u++) before += chunk_of(k, u);
    *q = (int)(i / c);
    *at = before + i % c;
}

static void setup(rs_case *k)
{
    int P = k->P;
    size_t esz = harness_dtype_size(k->dtype);
    k->recvcount = 0;
    k->full = 0;
    for (size_t t = 0; t < k->T; t++) {
        k->padded[t] = (k->counts[t] + (size_t)P - 1) / (size_t)P * (size_t)P;
        k->recvcount += k->padded[t] / (size_t)P;
        k->full += k->counts[t];
    }
    size_t send_bytes = (size_t)P * k->recvcount * esz + 8;
    for (int r = 0; r < P; r++) {
        k->send[r] = calloc(1, send_bytes);
        k->inplace[r] = calloc(1, send_bytes);
        k->recv[r] = malloc(k->recvcount * esz + 8);
        memset(k->recv[r], 0xAB, k->recvcount * esz + 8);
        k->flat[r] = malloc(k->full * esz + 8);
        k->flat_out[r] = malloc(k->full * esz + 8);
        size_t flat_at = 0;
        for (size_t t = 0; t < k->T; t++) {
            for (size_t i = 0; i < k->counts[t]; i++) {
                int q;
                size_t at;
                place(k, t, i, &q, &at);
                double v = value(k, r, t, i);
                harness_set(k->dtype, k->send[r], (size_t)q * k->recvcount + at, v);
                harness_set(k->dtype, k->flat[r], flat_at++, v);
            }
        }
        memcpy(k->inplace[r], k->send[r], send_bytes);
    }
}

static void teardown(rs_case *k)
{
    for (int r = 0; r < k->P; r++) {
        free(k->send[r]);
        free(k->inplace[r]);
        free(k->recv[r]);
        free(k->flat[r]);
        free(k->flat_out[r]);
    }
}

static int levels_of(int P)
{
    int l = 0;
    while ((1 << l) < P) l++;
    return l;
}

/* Checks the case's output against both references; returns the number of failures. */
static int check(rs_case *k)
{
    int P = k->P, bad = 0;
    double eps = harness_eps(k->dtype);
    size_t esz = harness_dtype_size(k->dtype);
    for (int r = 0; r < P; r++) {
        if (k->res[r] != SUMO_SUCCESS || k->res_in[r] != SUMO_SUCCESS || k->res_flat[r] != SUMO_SUCCESS) {
            fprintf(stderr, "P=%d %s rank %d: %d %d %d %s\n", P, sumo_dtype_name(k->dtype), r,
                    k->res[r], k->res_in[r], k->res_flat[r], k->msg[r]);
            return 1;
        }
        /* In place gives the same bits as out of place. */
        if (memcmp(k->recv[r], k->inplace[r] + (size_t)r * k->recvcount * esz, k->recvcount * esz)) {
            fprintf(stderr, "P=%d %s rank %d: in place differs\n", P, sumo_dtype_name(k->dtype), r);
            bad++;
        }
    }
    double err2 = 0, norm2 = 0, ferr2 = 0;
    size_t flat_at = 0;
    for (size_t t = 0; t < k->T; t++) {
        size_t n = k->counts[t];
        double *v[MAXP];
        double maxnorm = 0;
        for (int r = 0; r < P; r++) {
            v[r] = calloc(n + 1, sizeof(double));
            double s = 0;
            for (size_t i = 0; i < n; i++) {
                /* the stored input, as the dtype holds it */
                int q;
                size_t at;
                place(k, t, i, &q, &at);
                v[r][i] = harness_get(k->dtype, k->send[r], (size_t)q * k->recvcount + at);
                s += v[r][i] * v[r][i];
            }
            maxnorm = fmax(maxnorm, sqrt(s));
        }
        tree_ref(v, P, n);
        double terr = 0, tferr = 0;
        for (size_t i = 0; i < n; i++) {
            int q;
            size_t at;
            place(k, t, i, &q, &at);
            double got = harness_get(k->dtype, k->recv[q], at);
            double flat = harness_get(k->dtype, k->flat_out[0], flat_at + i);
            terr += (got - v[0][i]) * (got - v[0][i]);
            tferr += (got - flat) * (got - flat);
            norm2 += v[0][i] * v[0][i];
        }
        /* The padding comes out exactly 0. */
        for (size_t i = n; i < k->padded[t]; i++) {
            int q;
            size_t at;
            place(k, t, i, &q, &at);
            if (harness_get(k->dtype, k->recv[q], at) != 0.0) {
                fprintf(stderr, "P=%d %s tensor %zu: padding %zu is not 0\n", P,
                        sumo_dtype_name(k->dtype), t, i);
                bad++;
            }
        }
        double tol = 8.0 * (levels_of(P) + 1) * eps * maxnorm;
        if (sqrt(terr) > tol || sqrt(tferr) > 2 * tol) {
            fprintf(stderr, "P=%d %s tensor %zu (%zu elements): error %.3g against the tree, %.3g "
                    "against the allreduce, bound %.3g\n", P, sumo_dtype_name(k->dtype), t, n,
                    sqrt(terr), sqrt(tferr), tol);
            bad++;
        }
        err2 += terr;
        ferr2 += tferr;
        flat_at += n;
        for (int r = 0; r < P; r++) free(v[r]);
    }
    if (norm2 > 0 && (sqrt(err2 / norm2) > 100 * eps || sqrt(ferr2 / norm2) > 200 * eps)) {
        fprintf(stderr, "P=%d %s: relative error %.3g against the tree, %.3g against the "
                "allreduce\n", P, sumo_dtype_name(k->dtype), sqrt(err2 / norm2),
                sqrt(ferr2 / norm2));
        bad++;
    }
    return bad;
}

static const sumo_dtype dtypes[] = {SUMO_FLOAT32, SUMO_FLOAT64, SUMO_FLOAT16, SUMO_BFLOAT16};
#define NDT (sizeof dtypes / sizeof dtypes[0])

/* Runs the case on both data paths and compares their bits; returns failures. */
static int run_both(rs_case *base)
{
    rs_case a = *base, b = *base;
    a.p2p = false;
    b.p2p = true;
    setup(&a);
    setup(&b);
    int bad = 0;
    if (harness_run_threads(a.P, rank_fn, &a) != 0 || harness_run_threads(b.P, rank_fn, &b) != 0)
        bad++;
    bad += check(&a) + check(&b);
    size_t esz = harness_dtype_size(a.dtype);
    for (int r = 0; r < a.P && bad == 0; r++)
        if (memcmp(a.recv[r], b.recv[r], a.recvcount * esz)) {
            fprintf(stderr, "P=%d %s rank %d: direct and point-to-point bits differ\n", a.P,
                    sumo_dtype_name(a.dtype), r);
            bad++;
        }
    teardown(&a);
    teardown(&b);
    return bad;
}

/* P = 1..8, every dtype: tensors of 0 and 1 elements, smaller than P, odd, padded, and (fp32)
 * one whose inputs nearly cancel in pairs. */
static void test_layouts(void **state)
{
    (void)state;
    int bad = 0;
    for (int P = 1; P <= 8; P++)
        for (size_t d = 0; d < NDT; d++) {
            rs_case k = {.P = P, .dtype = dtypes[d], .T = 7,
                         .counts = {1, 3, 37, 0, 129, 5, 11}};
            bad += run_both(&k);
        }
    assert_int_equal(bad, 0);
}

/* One larger tensor per case, and the predefined op (the whole buffer as one tensor). */
static void test_large_and_predefined(void **state)
{
    (void)state;
    int bad = 0;
    for (int P = 2; P <= 7; P += 5)
        for (size_t d = 0; d < NDT; d++) {
            rs_case k = {.P = P, .dtype = dtypes[d], .T = 2, .counts = {20011, 4099}};
            bad += run_both(&k);
            rs_case one = {.P = P, .dtype = dtypes[d], .T = 1, .counts = {(size_t)P * 301},
                           .predefined = true};
            bad += run_both(&one);
        }
    assert_int_equal(bad, 0);
}

/* ---- refusals --------------------------------------------------------------------------------- */

typedef struct refusal {
    int P;
    int kind; /* 0: a count not a multiple of P; 1: counts that miss P * recvcount; 2: layouts
                 that differ between ranks; 3: a hierarchical op; 4: too many ranks */
    sumo_result res[MAXP];
    char msg[MAXP][256];
    bool untouched[MAXP];
} refusal;

static void refusal_fn(sumo_comm *comm, int rank, int size, void *arg)
{
    refusal *f = arg;
    sumo_comm_set_timeout(comm, 30);
    size_t P = (size_t)size;
    size_t counts[2] = {2 * P, P}, recvcount = 3;
    if (f->kind == 0) counts[1] = P + 1, recvcount = 0;
    if (f->kind == 1) recvcount = 4;
    if (f->kind == 2 && rank == 1) counts[0] = P, counts[1] = 2 * P;
    sumo_adasum_options o = {.struct_size = sizeof o, .tensor_counts = counts, .ntensors = 2,
                             .hierarchical = f->kind == 3};
    sumo_op op = SUMO_OP_ADASUM;
    if (f->kind != 4) sumo_op_create_adasum(comm, &o, &op);
    float send[64 * 4] = {0}, recv[8];
    for (size_t i = 0; i < sizeof send / sizeof send[0]; i++) send[i] = (float)(i % 7) - 3.0f;
    for (int i = 0; i < 8; i++) recv[i] = 42.0f;
    f->res[rank] = sumo_reduce_scatter(send, recv, f->kind == 0 ? 1 : recvcount, SUMO_FLOAT32, op,
                                       comm);
    const char *m;
    sumo_comm_error_message(comm, &m);
    snprintf(f->msg[rank], sizeof f->msg[rank], "%s", m);
    f->untouched[rank] = true;
    for (int i = 0; i < 8; i++) f->untouched[rank] &= recv[i] == 42.0f;
    if (f->kind != 4) sumo_op_destroy(comm, op);
}

static void expect_refusal(int P, int kind, sumo_result code, const char *needle)
{
    refusal f = {.P = P, .kind = kind};
    assert_int_equal(harness_run_threads(P, refusal_fn, &f), 0);
    for (int r = 0; r < P; r++) {
        if (f.res[r] != code || strstr(f.msg[r], needle) == NULL || !f.untouched[r])
            fprintf(stderr, "kind %d rank %d: %d \"%s\"\n", kind, r, f.res[r], f.msg[r]);
        assert_int_equal(f.res[r], code);
        assert_non_null(strstr(f.msg[r], needle));
        assert_true(f.untouched[r]);
    }
}

static void test_refusals(void **state)
{
    (void)state;
    expect_refusal(3, 0, SUMO_ERR_INVALID_ARGUMENT, "tensor 1 holds 4 elements, not a multiple");
    expect_refusal(4, 1, SUMO_ERR_INVALID_ARGUMENT, "tensors hold 12 elements");
    expect_refusal(3, 2, SUMO_ERR_MISMATCH, "");
    expect_refusal(4, 3, SUMO_ERR_INVALID_ARGUMENT, "hierarchical");
    expect_refusal(17, 4, SUMO_ERR_INVALID_USAGE, "at most 16");
}

/* ---- NaN -------------------------------------------------------------------------------------- */

static void test_nonfinite(void **state)
{
    (void)state;
    rs_case k = {.P = 3, .dtype = SUMO_FLOAT32, .T = 2, .counts = {6, 9}};
    setup(&k);
    /* rank 2's element 4 of tensor 1 (row 1, after tensor 0's 2-element chunk) */
    harness_set(k.dtype, k.send[2], 1 * k.recvcount + 2 + 1, NAN);
    memcpy(k.inplace[2], k.send[2], 3 * k.recvcount * 4);
    assert_int_equal(harness_run_threads(3, rank_fn, &k), 0);
    for (int r = 0; r < 3; r++) {
        assert_int_equal(k.res[r], SUMO_ERR_NONFINITE);
        assert_non_null(strstr(k.msg[r], "tensor 1"));
        assert_true(isfinite(harness_get(k.dtype, k.recv[r], 0)));
        assert_true(isnan(harness_get(k.dtype, k.recv[r], 2)));
    }
    teardown(&k);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layouts),
        cmocka_unit_test(test_large_and_predefined),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_nonfinite),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
