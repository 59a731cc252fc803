/*
 * Adasum allreduce on the threads transport against an independent reference.
 *
 * The reference (support/reference.c, shared with tests/mpi/test_adasum_mpi.c) is the
 * definition of sumo.h written out plainly: per tensor, sequential dot products and norms in
 * double, the pairwise combine in double, and the documented tree (pairs (0,1) .. (2R-2,2R-1)
 * first when the number of participants G is not a power of two, then the balanced tree in
 * order), over rank inputs or, hierarchically, over group averages. It shares no code with the
 * library.
 *
 * Tolerances: Horovod's (relative L2 error of the whole buffer < 100 eps of the dtype), and a
 * per-tensor one scaled by the tensor's input norm, which is what catches a wrong tensor
 * boundary in a small tensor hidden inside a large buffer.
 *
 * Both data paths run: direct (the threads default: ranks read each other's buffers) and point
 * to point (forced with the ring algorithm: what MPI takes); they must give the same bits.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "support/harness.h"
#include "support/reference.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAXP 32

/* ---- running the library ----------------------------------------------------------------- */

typedef struct job {
    int size;
    sumo_dtype dtype;
    size_t count;
    size_t ntensors;      /* 0: SUMO_OP_ADASUM (one tensor) unless use_op */
    const size_t *counts;
    bool use_op;
    bool p2p; /* force the point-to-point path (the one MPI takes) instead of direct shm */
    int hierarchical, group_size;
    unsigned char *in[MAXP];
    unsigned char *out[MAXP];  /* out of place */
    unsigned char *out2[MAXP]; /* in place, second call on the same handle */
    sumo_result res[MAXP], res2[MAXP];
    char msg[MAXP][256];
} job;

static void body(sumo_comm *comm, int rank, int size, void *arg)
{
    (void)size;
    job *j = arg;
    sumo_comm_set_timeout(comm, 30);
    if (j->p2p) sumo_comm_set_param(comm, SUMO_PARAM_ALGORITHM, SUMO_ALGORITHM_RING);
    sumo_op op = SUMO_OP_ADASUM;
    if (j->use_op) {
        sumo_adasum_options o = {.struct_size = sizeof o, .tensor_counts = j->counts,
                                 .ntensors = j->ntensors, .hierarchical = j->hierarchical,
                                 .group_size = j->group_size};
        if (sumo_op_create_adasum(comm, &o, &op) != SUMO_SUCCESS) op = (sumo_op)-1;
    }
    size_t bytes = j->count * harness_dtype_size(j->dtype);
    j->res[rank] = sumo_allreduce(j->in[rank], j->out[rank], j->count, j->dtype, op, comm);
    const char *m;
    sumo_comm_error_message(comm, &m);
    snprintf(j->msg[rank], sizeof j->msg[rank], "%s", m);
    if (bytes) memcpy(j->out2[rank], j->in[rank], bytes);
    j->res2[rank] = sumo_allreduce(j->out2[rank], j->out2[rank], j->count, j->dtype, op, comm);
    if (j->use_op) sumo_op_destroy(comm, op);
}

static double uniform_at(uint64_t seed, int rank, size_t i)
{
    return harness_uniform_at(seed, (uint64_t)rank, i);
}

static void job_alloc(job *j)
{
    size_t bytes = j->count * harness_dtype_size(j->dtype) + 8;
    for (int r = 0; r < j->size; r++) {
        j->in[r] = malloc(bytes);
        j->out[r] = malloc(bytes);
        j->out2[r] = malloc(bytes);
        memset(j->out[r], 0xAB, bytes);
    }
}

static void job_free(job *j)
{
    for (int r = 0; r < j->size; r++) {
        free(j->in[r]);
        free(j->out[r]);
        free(j->out2[r]);
    }
}

/* Offsets of the job's layout (one tensor when it has none). */
static size_t *job_offsets(const job *j, size_t *T)
{
    size_t n = j->ntensors ? j->ntensors : 1;
    size_t *off = malloc((n + 1) * sizeof *off);
    off[0] = 0;
    for (size_t t = 0; t < n; t++) off[t + 1] = off[t] + (j->ntensors ? j->counts[t] : j->count);
    *T = n;
    return off;
}

/* Random inputs; some tensors are zero on some ranks, some on every rank. */
static void fill_random(job *j, uint64_t seed)
{
    size_t T, *off = job_offsets(j, &T);
    for (int r = 0; r < j->size; r++) {
        for (size_t t = 0; t < T; t++) {
            bool zero = (T > 1 && t % 13 == 5) || (T > 1 && (t * 7 + (size_t)r) % 11 == 0);
            for (size_t i = off[t]; i < off[t + 1]; i++)
                harness_set(j->dtype, j->in[r], i, zero ? 0.0 : uniform_at(seed, r, i));
        }
    }
    free(off);
}

/* The reference result for the job's inputs: the tree over ranks or over group averages. */
static double *reference(const job *j)
{
    size_t T, *off = job_offsets(j, &T), n = j->count;
    int g = 1;
    if (j->hierarchical) g = j->group_size ? j->group_size : j->size;
    int G = j->size / g;
    double *u[MAXP] = {0};
    for (int i = 0; i < G; i++) {
        u[i] = calloc(n + 1, sizeof(double));
        for (int m = 0; m < g; m++)
            for (size_t k = 0; k < n; k++) u[i][k] += harness_get(j->dtype, j->in[i * g + m], k);
        for (size_t k = 0; k < n; k++) u[i][k] /= g;
    }
    ref_adasum_tree(u, G, off, T);
    for (int i = 1; i < G; i++) free(u[i]);
    free(off);
    return u[0];
}

typedef struct errors {
    double total;      /* |got - want| / |want| over the whole buffer */
    double per_tensor; /* max over tensors of |got - want|_t / |inputs|_t */
} errors;

static errors measure(const job *j, const unsigned char *got, const double *want)
{
    size_t T, *off = job_offsets(j, &T);
    errors e = {0, 0};
    double dd = 0, ww = 0;
    for (size_t t = 0; t < T; t++) {
        double td = 0, scale = 0;
        for (size_t i = off[t]; i < off[t + 1]; i++) {
            double diff = harness_get(j->dtype, got, i) - want[i];
            td += diff * diff;
            ww += want[i] * want[i];
            for (int r = 0; r < j->size; r++) {
                double v = harness_get(j->dtype, j->in[r], i);
                scale += v * v;
            }
        }
        dd += td;
        double rel = scale > 0 ? sqrt(td / scale) : (td > 0 ? INFINITY : 0);
        if (!(rel <= e.per_tensor)) e.per_tensor = rel; /* NaN sticks */
    }
    e.total = ww > 0 ? sqrt(dd / ww) : (dd > 0 ? INFINITY : 0);
    if (isnan(dd)) e.total = NAN;
    free(off);
    return e;
}

/*
 * Per-tensor bound: each combine rounds once to the dtype (relative eps/2 of values no bigger
 * than a few times the inputs) and the reference differs from the library only in rounding, so
 * the error grows with the number of levels; 100 eps (Horovod) for the whole buffer.
 */
static double tensor_tolerance(const job *j)
{
    int levels = 1;
    while ((1 << levels) < j->size) levels++;
    return 8.0 * (levels + 1) * harness_eps(j->dtype);
}

/* Runs the job and checks success, the reference, and bits across ranks and calls. */
static int run_and_check(job *j, const char *what)
{
    int bad = 0;
    if (harness_run_threads(j->size, body, j) != 0) return 1;
    size_t bytes = j->count * harness_dtype_size(j->dtype);
    for (int r = 0; r < j->size; r++) {
        if (j->res[r] != SUMO_SUCCESS || j->res2[r] != SUMO_SUCCESS) {
            fprintf(stderr, "%s: P=%d dtype %d count %zu: rank %d returned %s / %s (%s)\n", what,
                    j->size, j->dtype, j->count, r, sumo_result_name(j->res[r]),
                    sumo_result_name(j->res2[r]), j->msg[r]);
            return 1;
        }
        if (memcmp(j->out[r], j->out[0], bytes) != 0 || memcmp(j->out2[r], j->out[0], bytes) != 0) {
            fprintf(stderr, "%s: P=%d dtype %d count %zu: rank %d's bits differ from rank 0's\n",
                    what, j->size, j->dtype, j->count, r);
            bad++;
        }
    }
    double *want = reference(j);
    errors e = measure(j, j->out[0], want);
    double tol = tensor_tolerance(j);
    /* A buffer of a few elements is one short tensor whose result can be a cancellation
     * (Adasum of parallel scalars is their average): relative to it, rounding of the inputs
     * looks large. The per-tensor check, relative to the inputs, covers those. */
    bool horovod = j->count >= 16;
    if ((horovod && !(e.total < 100 * harness_eps(j->dtype))) || !(e.per_tensor <= tol)) {
        fprintf(stderr,
                "%s: P=%d dtype %d count %zu tensors %zu hier %d/%d p2p %d: relative error %.3g "
                "(limit %.3g), worst tensor %.3g (limit %.3g)\n",
                what, j->size, j->dtype, j->count, j->ntensors, j->hierarchical, j->group_size,
                j->p2p, e.total, 100 * harness_eps(j->dtype), e.per_tensor, tol);
        bad++;
    }
    if (getenv("ADASUM_TEST_VERBOSE"))
        fprintf(stderr, "%s: P=%d dtype %d count %zu: error %.3g tensor %.3g (tol %.3g)\n", what,
                j->size, j->dtype, j->count, e.total, e.per_tensor, tol);
    free(want);
    return bad;
}

/* ---- pair properties (fp64, P = 2, exact where the arithmetic is exact) ------------------- */

typedef struct pair_case {
    size_t n;
    double a[8], b[8];
} pair_case;

/* The library's Adasum(a, b) with a on rank 0 and b on rank 1. */
static int library_pair(const double *a, const double *b, size_t n, double *out)
{
    job j = {.size = 2, .dtype = SUMO_FLOAT64, .count = n};
    job_alloc(&j);
    memcpy(j.in[0], a, n * sizeof(double));
    memcpy(j.in[1], b, n * sizeof(double));
    int ok = harness_run_threads(2, body, &j) == 0 && j.res[0] == SUMO_SUCCESS &&
             j.res[1] == SUMO_SUCCESS && memcmp(j.out[0], j.out[1], n * sizeof(double)) == 0;
    memcpy(out, j.out[0], n * sizeof(double));
    job_free(&j);
    return ok ? 0 : 1;
}

/* |x - y| within k eps of the operands' scale (cancellation makes ulps of the result
 * meaningless). */
static bool close_to(double x, double y, double scale, double k)
{
    return fabs(x - y) <= k * DBL_EPSILON * scale;
}

static void check_pair_properties(void (*pair)(const double *, const double *, size_t, double *))
{
    const size_t n = 8;
    double a[8], b[8], r1[8], r2[8], ca[8], cb[8], neg[8], zero[8] = {0};
    /* Random data: properties up to rounding. */
    uint64_t s = 42;
    double scale = 0;
    for (size_t i = 0; i < n; i++) {
        a[i] = harness_uniform(&s);
        b[i] = harness_uniform(&s);
        scale = fmax(scale, 2 * (fabs(a[i]) + fabs(b[i])));
    }
    /* Symmetric (the fused update may round the two orders differently). */
    pair(a, b, n, r1);
    pair(b, a, n, r2);
    for (size_t i = 0; i < n; i++) assert_true(close_to(r1[i], r2[i], scale, 8));
    /* Homogeneous. */
    for (size_t i = 0; i < n; i++) {
        ca[i] = -3.0 * a[i];
        cb[i] = -3.0 * b[i];
    }
    pair(ca, cb, n, r2);
    for (size_t i = 0; i < n; i++) assert_true(close_to(-3.0 * r1[i], r2[i], 3 * scale, 16));
    /* Parallel: the average, whatever the signs and sizes. */
    const double c[][2] = {{3.0, -0.5}, {-2.0, -6.0}, {1e-3, 1e3}, {5.0, -5.0}, {0.5, 0.5}};
    for (size_t k = 0; k < sizeof c / sizeof c[0]; k++) {
        for (size_t i = 0; i < n; i++) {
            ca[i] = c[k][0] * a[i];
            cb[i] = c[k][1] * a[i];
        }
        pair(ca, cb, n, r1);
        double want_scale = (c[k][0] + c[k][1]) / 2;
        for (size_t i = 0; i < n; i++)
            assert_true(close_to(r1[i], want_scale * a[i], fabs(c[k][0]) + fabs(c[k][1]), 16));
    }
    /* Short mantissas (k/8): every step below is exact, so these hold exactly. */
    for (size_t i = 0; i < n; i++) {
        a[i] = (double)((int)(i * 5 % 17) - 8) / 8;
        neg[i] = -a[i];
    }
    pair(a, a, n, r1); /* Adasum(a, a) = a */
    for (size_t i = 0; i < n; i++) assert_true(r1[i] == a[i]);
    pair(a, neg, n, r1); /* Adasum(a, -a) = 0 */
    for (size_t i = 0; i < n; i++) assert_true(r1[i] == 0.0);
    pair(a, zero, n, r1); /* Adasum(a, 0) = a, both ways, and Adasum(0, 0) = 0 */
    for (size_t i = 0; i < n; i++) assert_true(r1[i] == a[i]);
    pair(zero, a, n, r1);
    for (size_t i = 0; i < n; i++) assert_true(r1[i] == a[i]);
    pair(zero, zero, n, r1);
    for (size_t i = 0; i < n; i++) assert_true(r1[i] == 0.0);
    /* Orthogonal: the sum (the dot is exactly 0, so both coefficients are exactly 1). */
    double o1[8] = {1, -2, 0, 0, 0.5, 0, 0, 0}, o2[8] = {0, 0, 3, 4, 0, 0, -7, 0};
    pair(o1, o2, n, r1);
    for (size_t i = 0; i < n; i++) assert_true(r1[i] == o1[i] + o2[i]);
    double p1[8] = {1, 2, 3, 4, 0, 0, 0, 0}, p2[8] = {1, 1, -1, 0, 0, 0, 0, 0}; /* dot 0 */
    pair(p1, p2, n, r1);
    for (size_t i = 0; i < n; i++) assert_true(r1[i] == p1[i] + p2[i]);
}

static void library_pair_checked(const double *a, const double *b, size_t n, double *out)
{
    assert_int_equal(library_pair(a, b, n, out), 0);
}

/*
 * The library's combine of two ranks against the reference on random pairs of several lengths
 * and scales (dot products may be summed in another order: within a few eps of the inputs'
 * size), and against closed forms at the documented cut-off, where a coefficient is exactly 1
 * because its squared norm is below 2^-511:
 *   a = e0, b = t e0 with t = 2^-256 (|b|^2 = 2^-512): A(a, b) = (1 - t/2) + t = 1 + 2^-257,
 *     which is 1 in double; without the cut-off cb = 1 - 2^255 and the result is about 1/2;
 *   t = 2^-255 (|b|^2 = 2^-510, above it): parallel vectors, the average (1 + t) / 2;
 *   a = b = 2^-300 e0 (both below it): both coefficients 1, the sum 2^-299 exactly.
 */
static void test_pair_library_against_reference(void **state)
{
    (void)state;
    const size_t ns[] = {1, 3, 8, 33, 1000};
    const double scales[] = {1e-3, 1.0, 1e3};
    uint64_t s = 4242;
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++)
        for (size_t c = 0; c < sizeof scales / sizeof scales[0]; c++) {
            size_t n = ns[k];
            double *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
            double *got = malloc(n * sizeof *got), *want = malloc(n * sizeof *want);
            assert_true(a && b && got && want);
            double na = 0, nb = 0;
            for (size_t i = 0; i < n; i++) {
                a[i] = harness_uniform(&s) * scales[c];
                /* b leans on a, so that the dot product matters */
                b[i] = (0.5 * a[i] + harness_uniform(&s) * scales[c]) * (c + 1);
                na += a[i] * a[i];
                nb += b[i] * b[i];
            }
            library_pair_checked(a, b, n, got);
            memcpy(want, a, n * sizeof *want);
            ref_adasum_pair(want, b, n);
            double tol = 4.0 * (double)(n + 8) * DBL_EPSILON * (sqrt(na) + sqrt(nb));
            for (size_t i = 0; i < n; i++)
                if (!(fabs(got[i] - want[i]) <= tol))
                    fail_msg("n %zu scale %g element %zu: library %.17g, reference %.17g", n,
                             scales[c], i, got[i], want[i]);
            free(a);
            free(b);
            free(got);
            free(want);
        }
    double a[4] = {1, 0, 0, 0}, b[4] = {0x1p-256, 0, 0, 0}, out[4];
    library_pair_checked(a, b, 4, out);
    assert_true(out[0] == 1.0 && out[1] == 0 && out[2] == 0 && out[3] == 0);
    b[0] = 0x1p-255;
    library_pair_checked(a, b, 4, out);
    assert_true(fabs(out[0] - (1 + 0x1p-255) / 2) <= 4 * DBL_EPSILON);
    a[0] = b[0] = 0x1p-300;
    library_pair_checked(a, b, 4, out);
    assert_true(out[0] == 0x1p-299);
}

static void test_pair_properties_library(void **state)
{
    (void)state;
    check_pair_properties(library_pair_checked);
}

/* ---- tree equality ----------------------------------------------------------------------- */

static const int sizes[] = {1, 2, 3, 4, 5, 6, 8, 16, 32};
static const sumo_dtype dtypes[] = {SUMO_FLOAT32, SUMO_FLOAT64, SUMO_FLOAT16, SUMO_BFLOAT16};

static const size_t awkward[] = {0, 1, 7, 0, 33, 1, 517, 3, 0, 2, 129};
static size_t many_tiny[400];
static const size_t mixed[] = {1, 1000, 2, 0, 2049};

typedef struct layout {
    const char *name;
    const size_t *counts;
    size_t ntensors;
    size_t count; /* when one tensor */
} layout;

static layout layouts[6];
static size_t nlayouts;

static void setup_layouts(void)
{
    for (size_t t = 0; t < 400; t++) many_tiny[t] = t % 4;
    layout l[] = {
        {"one tensor of 1001", NULL, 0, 1001},
        {"one tensor of 1", NULL, 0, 1},
        {"one tensor of 0", NULL, 0, 0},
        {"awkward", awkward, sizeof awkward / sizeof awkward[0], 0},
        {"many tiny", many_tiny, 400, 0},
        {"mixed", mixed, sizeof mixed / sizeof mixed[0], 0},
    };
    nlayouts = sizeof l / sizeof l[0];
    for (size_t k = 0; k < nlayouts; k++) {
        layouts[k] = l[k];
        if (l[k].counts) {
            size_t s = 0;
            for (size_t t = 0; t < l[k].ntensors; t++) s += l[k].counts[t];
            layouts[k].count = s;
        }
    }
}

static int run_layout(int size, sumo_dtype dtype, const layout *l, int hierarchical, int group_size,
                      uint64_t seed, bool p2p)
{
    job j = {.size = size, .dtype = dtype, .count = l->count, .ntensors = l->ntensors,
             .counts = l->counts, .use_op = l->counts != NULL || hierarchical, .p2p = p2p,
             .hierarchical = hierarchical, .group_size = group_size};
    job_alloc(&j);
    fill_random(&j, seed);
    int bad = run_and_check(&j, l->name);
    job_free(&j);
    return bad;
}

static void test_tree_equality(void **state)
{
    (void)state;
    setup_layouts();
    int bad = 0;
    for (int p2p = 0; p2p < 2; p2p++)
        for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
            for (size_t di = 0; di < sizeof dtypes / sizeof dtypes[0]; di++)
                for (size_t li = 0; li < nlayouts; li++)
                    bad += run_layout(sizes[si], dtypes[di], &layouts[li], 0, 0,
                                      1000 + si * 10 + li, p2p);
    assert_int_equal(bad, 0);
}

/* The point-to-point shape (what ranks on several nodes run) moves its shards in 1 MiB
 * chunks, the Gram partials of one chunk and the weighted sum of another running while a
 * chunk moves: shards of two and three chunks, tensors across the chunk boundaries, and a
 * count that does not divide by P, so segments (and their last chunks) differ by one. */
static void test_p2p_wire_chunks(void **state)
{
    (void)state;
    static const size_t across[] = {3, 524287, 1, 775712}; /* 1,300,003 */
    const layout ls[] = {{"one tensor over chunks", NULL, 0, 1300003},
                         {"tensors across chunks", across, 4, 1300003}};
    int bad = 0;
    for (int size = 2; size <= 4; size++)
        for (size_t li = 0; li < 2; li++) {
            bad += run_layout(size, SUMO_FLOAT32, &ls[li], 0, 0, 77 + (uint64_t)size, true);
            if (size == 2) bad += run_layout(size, SUMO_BFLOAT16, &ls[li], 0, 0, 78, true);
        }
    assert_int_equal(bad, 0);
}

static void test_hierarchical(void **state)
{
    (void)state;
    setup_layouts();
    /* (P, group size): G a power of two, G odd (fold), groups of a non-power-of-two size,
     * one group (the average), groups of one (flat), and 0 = the node (all threads). */
    const int cases[][2] = {{4, 2}, {6, 2}, {6, 3}, {8, 4}, {12, 4}, {4, 4}, {5, 1}, {3, 0}, {8, 2}};
    int bad = 0;
    for (int p2p = 0; p2p < 2; p2p++)
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
            for (size_t di = 0; di < sizeof dtypes / sizeof dtypes[0]; di++)
                for (size_t li = 0; li < nlayouts; li++)
                    bad += run_layout(cases[c][0], dtypes[di], &layouts[li], 1, cases[c][1],
                                      7 + c, p2p);
    assert_int_equal(bad, 0);
}

/* ---- known answers: orthogonal gives the sum, parallel the average ------------------------ */

/* Rows of a random orthogonal-ish matrix: Gram-Schmidt on random vectors in double. */
static void orthonormal_rows(double *q, int rows, size_t n, uint64_t seed)
{
    for (int r = 0; r < rows; r++) {
        for (size_t i = 0; i < n; i++) q[r * n + i] = uniform_at(seed, r, i);
        for (int pass = 0; pass < 2; pass++) {
            for (int k = 0; k < r; k++) {
                double d = 0;
                for (size_t i = 0; i < n; i++) d += q[r * n + i] * q[k * n + i];
                for (size_t i = 0; i < n; i++) q[r * n + i] -= d * q[k * n + i];
            }
        }
        double nn = 0;
        for (size_t i = 0; i < n; i++) nn += q[r * n + i] * q[r * n + i];
        for (size_t i = 0; i < n; i++) q[r * n + i] /= sqrt(nn);
    }
}

/* Relative L2 distance of rank 0's result from want. */
static double distance(const job *j, const double *want)
{
    double dd = 0, ww = 0;
    for (size_t i = 0; i < j->count; i++) {
        double d = harness_get(j->dtype, j->out[0], i) - want[i];
        dd += d * d;
        ww += want[i] * want[i];
    }
    return sqrt(dd / ww);
}

static int known_answer(int size, sumo_dtype dtype, bool orthogonal)
{
    const size_t n = 96;
    job j = {.size = size, .dtype = dtype, .count = n, .p2p = size == 4};
    job_alloc(&j);
    double *q = malloc((size_t)size * n * sizeof *q), *want = calloc(n, sizeof *want);
    orthonormal_rows(q, orthogonal ? size : 1, n, 99);
    for (int r = 0; r < size; r++) {
        /* Parallel: q_r = c_r * a with c_r of both signs and sizes; no partial average of the
         * tree may vanish (Adasum(a, 0) = a, not a / 2, and a rounding residue instead of 0 is
         * not parallel to anything). */
        double c = orthogonal ? 1.0 + r : (r % 3 == 1 ? -(0.1 + 0.01 * r) : 1.0 + r);
        for (size_t i = 0; i < n; i++)
            harness_set(dtype, j.in[r], i, c * q[(orthogonal ? (size_t)r : 0) * n + i]);
    }
    for (int r = 0; r < size; r++)
        for (size_t i = 0; i < n; i++) {
            double v = harness_get(dtype, j.in[r], i);
            want[i] += orthogonal ? v : v / size;
        }
    int bad = run_and_check(&j, orthogonal ? "orthogonal" : "parallel");
    double dist = distance(&j, want);
    if (!(dist < 100 * harness_eps(dtype))) {
        fprintf(stderr, "%s P=%d dtype %d: %.3g from the %s\n", orthogonal ? "orthogonal" : "parallel",
                size, dtype, dist, orthogonal ? "sum" : "average");
        bad++;
    }
    free(q);
    free(want);
    job_free(&j);
    return bad;
}

static void test_orthogonal_sum_parallel_average(void **state)
{
    (void)state;
    int bad = 0;
    const int pow2[] = {2, 4, 8, 16};
    for (size_t s = 0; s < sizeof pow2 / sizeof pow2[0]; s++)
        for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++) {
            bad += known_answer(pow2[s], dtypes[d], true);
            bad += known_answer(pow2[s], dtypes[d], false);
        }
    assert_int_equal(bad, 0);
}

/* ---- stability: squares that underflow or overflow the dtype ---------------------------- */

static double gaussian(uint64_t *s)
{
    double u1 = (harness_uniform(s) + 1.0) / 2.0, u2 = (harness_uniform(s) + 1.0) / 2.0;
    if (u1 <= 0) u1 = 0x1p-60;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

static int stability(int size, sumo_dtype dtype, bool overflow)
{
    const size_t n = 1024;
    double tiny = dtype == SUMO_FLOAT16 ? 0x1p-14 : FLT_MIN;
    double sqrt_max = sqrt(dtype == SUMO_FLOAT16 ? 65504.0 : FLT_MAX);
    job j = {.size = size, .dtype = dtype, .count = n, .p2p = size == 4};
    job_alloc(&j);
    double *a = malloc(n * sizeof *a), *want = calloc(n, sizeof *want);
    uint64_t s = 5 + (uint64_t)size;
    for (size_t i = 0; i < n; i++) a[i] = gaussian(&s) * (overflow ? 1.0 : tiny);
    for (int r = 0; r < size; r++) {
        double c;
        if (overflow) {
            /* Geometric from tiny to sqrt(max): |a| c stays finite, its square does not. */
            double f = size > 1 ? (double)r / (size - 1) : 1.0;
            c = exp((1 - f) * log(tiny) + f * log(sqrt_max));
        } else {
            c = 0.5 + (harness_uniform(&s) + 1.0) * 0.75;
        }
        for (size_t i = 0; i < n; i++) harness_set(dtype, j.in[r], i, c * a[i]);
    }
    for (int r = 0; r < size; r++)
        for (size_t i = 0; i < n; i++) want[i] += harness_get(dtype, j.in[r], i) / size;
    int bad = run_and_check(&j, overflow ? "stability (overflow)" : "stability (underflow)");
    double dist = distance(&j, want);
    if (!(dist < 100 * harness_eps(dtype))) {
        fprintf(stderr, "stability %s P=%d dtype %d: %.3g from the average\n",
                overflow ? "overflow" : "underflow", size, dtype, dist);
        bad++;
    }
    free(a);
    free(want);
    job_free(&j);
    return bad;
}

static void test_stability(void **state)
{
    (void)state;
    int bad = 0;
    const int ps[] = {2, 4, 8};
    const sumo_dtype dts[] = {SUMO_FLOAT32, SUMO_FLOAT16};
    for (size_t p = 0; p < sizeof ps / sizeof ps[0]; p++)
        for (size_t d = 0; d < 2; d++) {
            bad += stability(ps[p], dts[d], false);
            bad += stability(ps[p], dts[d], true);
        }
    assert_int_equal(bad, 0);
}

/* ---- repeatability ------------------------------------------------------------------------- */

/* The same inputs give the same bits on every run, on each path. The direct and point-to-point
 * paths run the same tree, so the same bits, where the direct path does not take the Gram form
 * (fp64); with it (fp32) both pass the oracle above but round differently. (How much scratch
 * each path keeps, which sumo.h documents, is not observable through the public API, so it is
 * not checked here.) */
static void test_repeatable_and_paths_agree(void **state)
{
    (void)state;
    const int ps[] = {2, 3, 4, 8};
    const sumo_dtype dts[] = {SUMO_FLOAT32, SUMO_FLOAT64};
    for (size_t p = 0; p < sizeof ps / sizeof ps[0]; p++)
        for (size_t d = 0; d < 2; d++) {
            size_t esz = dts[d] == SUMO_FLOAT32 ? 4 : 8;
            job j1 = {.size = ps[p], .dtype = dts[d], .count = 100003, .p2p = true};
            job j2 = j1;
            job j3 = {.size = ps[p], .dtype = dts[d], .count = 100003};
            job j4 = j3;
            job *all[] = {&j1, &j2, &j3, &j4};
            for (int k = 0; k < 4; k++) {
                job_alloc(all[k]);
                fill_random(all[k], 77);
                assert_int_equal(run_and_check(all[k], k < 2 ? "point to point" : "direct"), 0);
            }
            assert_memory_equal(j1.out[0], j2.out[0], j1.count * esz);
            assert_memory_equal(j3.out[0], j4.out[0], j3.count * esz);
            if (dts[d] == SUMO_FLOAT64) assert_memory_equal(j3.out[0], j1.out[0], j1.count * esz);
            for (int k = 0; k < 4; k++) job_free(all[k]);
        }
}

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
        cmocka_unit_test(test_pair_library_against_reference),
        cmocka_unit_test(test_pair_properties_library),
        cmocka_unit_test(test_tree_equality),
        cmocka_unit_test(test_hierarchical),
        cmocka_unit_test(test_p2p_wire_chunks),
        cmocka_unit_test(test_orthogonal_sum_parallel_average),
        cmocka_unit_test(test_stability),
        cmocka_unit_test(test_repeatable_and_paths_agree),
        cmocka_unit_test(test_bad_layouts_and_mismatch),
        cmocka_unit_test(test_nonfinite),
        cmocka_unit_test(test_api_edges),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
