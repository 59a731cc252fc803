/*
 * The core's contracts that the layers above and the bindings stand on: reduce-scatter, the
 * asynchronous forms of every collective, failing together and giving up, the lifetime of a
 * request against its handle, the environment, versions and struct sizes, and agreement at
 * creation for any number of ranks. References are exact (small integers sum exactly in every
 * dtype and order) or hand-written; nothing is compared with the library's own output.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "sumo_aggregation.h"
#include "sumo_diloco.h"
#include "sumo_distributed.h"
#include "sumo_optim.h"
#include "sumo_shm.h"
#include "support/harness.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAXP 17

static const sumo_dtype DTYPES[] = {SUMO_FLOAT32, SUMO_FLOAT64, SUMO_FLOAT16, SUMO_BFLOAT16};

/* ---- reduce-scatter ------------------------------------------------------------------------- */

typedef struct rs_job {
    sumo_dtype dtype;
    size_t n; /* recvcount */
    sumo_op op;
    bool in_place, ring, async;
    int bad; /* 0 none, 1 rank 1 passes another count, 2 Adasum */
    sumo_result res[MAXP];
    size_t wrong[MAXP];
} rs_job;

static void rs_rank(sumo_comm *comm, int rank, int size, void *arg)
{
    rs_job *j = arg;
    if (j->ring) sumo_comm_set_param(comm, SUMO_PARAM_ALGORITHM, SUMO_ALGORITHM_RING);
    size_t esz = harness_dtype_size(j->dtype), total = j->n * (size_t)size;
    unsigned char *in = malloc(total * esz + 1), *out = malloc(j->n * esz + 1);
    for (size_t i = 0; i < total; i++)
        harness_set(j->dtype, in, i, harness_collective_value(rank, i, true));
    void *recv = j->in_place ? in + (size_t)rank * j->n * esz : out;
    size_t n = j->bad == 1 && rank == 1 ? j->n + 1 : j->n;
    sumo_op op = j->bad == 2 ? (sumo_op)77 : j->op;
    sumo_result r;
    if (j->async) {
        sumo_request *req = NULL;
        r = sumo_reduce_scatter_start(in, recv, n, j->dtype, op, comm, &req);
        if (r == SUMO_SUCCESS) r = sumo_request_wait(req);
    } else {
        r = sumo_reduce_scatter(in, recv, n, j->dtype, op, comm);
    }
    j->res[rank] = r;
    j->wrong[rank] = 0;
    for (size_t i = 0; i < j->n && r == SUMO_SUCCESS; i++) {
        /* Segment `rank` of every input, summed: exact integers in every dtype. */
        double want = 0;
        size_t at = (size_t)rank * j->n + i;
        for (int k = 0; k < size; k++) want += harness_collective_value(k, at, true);
        if (j->op == SUMO_OP_AVERAGE) want /= size;
        double got = harness_get(j->dtype, recv, i);
        double tol = j->op == SUMO_OP_AVERAGE ? fabs(want) * harness_eps(j->dtype) : 0;
        if (fabs(got - want) > tol) j->wrong[rank]++;
    }
    free(in);
    free(out);
}

static void test_reduce_scatter(void **state)
{
    (void)state;
    const size_t counts[] = {0, 1, 37, 5000};
    for (int P = 1; P <= 5; P++)
        for (int d = 0; d < 4; d++)
            for (int c = 0; c < 4; c++)
                for (int variant = 0; variant < 8; variant++) {
                    rs_job j = {.dtype = DTYPES[d], .n = counts[c],
                                .op = variant & 1 ? SUMO_OP_AVERAGE : SUMO_OP_SUM,
                                .in_place = variant & 2, .ring = variant & 4,
                                .async = c == 2 && d == 0};
                    assert_int_equal(harness_run_threads(P, rs_rank, &j), 0);
                    for (int r = 0; r < P; r++) {
                        if (j.res[r] != SUMO_SUCCESS || j.wrong[r])
                            fail_msg("reduce_scatter P %d dtype %d n %zu variant %d: rank %d "
                                     "%s, %zu wrong",
                                     P, (int)j.dtype, j.n, variant, r,
                                     sumo_result_name(j.res[r]), j.wrong[r]);
                    }
                }
    /* Counts that differ, and an op the communicator does not know: refused on every rank
     * (Adasum's reduce-scatter is test_adasum_rs.c's). */
    rs_job j = {.dtype = SUMO_FLOAT32, .n = 10, .op = SUMO_OP_SUM, .bad = 1};
    assert_int_equal(harness_run_threads(3, rs_rank, &j), 0);
    for (int r = 0; r < 3; r++) assert_int_equal(j.res[r], SUMO_ERR_MISMATCH);
    j = (rs_job){.dtype = SUMO_FLOAT32, .n = 10, .op = SUMO_OP_SUM, .bad = 2};
    assert_int_equal(harness_run_threads(3, rs_rank, &j), 0);
    for (int r = 0; r < 3; r++) assert_int_equal(j.res[r], SUMO_ERR_INVALID_ARGUMENT);
}

/* ---- asynchronous forms, in order ------------------------------------------------------------ */

typedef struct async_job {
    sumo_result res[MAXP];
    int wrong[MAXP];
} async_job;

/* A chain on one buffer where each request depends on the one before: allreduce (sum), then a
 * broadcast from the last rank, an allgather of each rank's first element, an ACGA apply
 * (uniform for identical inputs) and a reduce-scatter: only in-order completion gives the
 * reference. */
static void async_rank(sumo_comm *comm, int rank, int size, void *arg)
{
    async_job *j = arg;
    enum { N = 64 };
    float buf[N], gathered[MAXP], acga_out[N], rs_out[4];
    float rs_in[4 * MAXP];
    for (int i = 0; i < N; i++) buf[i] = (float)(rank + i);
    for (int i = 0; i < 4 * size; i++) rs_in[i] = (float)i;
    sumo_aggregator_options o;
    sumo_aggregator_options_default(SUMO_AGGREGATE_ACGA, &o);
    sumo_aggregator *agg = NULL;
    sumo_result r = sumo_aggregator_create(comm, &o, &agg);
    sumo_request *req[5] = {0};
    if (r == SUMO_SUCCESS) r = sumo_allreduce_start(buf, buf, N, SUMO_FLOAT32, SUMO_OP_SUM, comm, &req[0]);
    if (r == SUMO_SUCCESS) r = sumo_broadcast_start(buf, buf, N, SUMO_FLOAT32, size - 1, comm, &req[1]);
    if (r == SUMO_SUCCESS) r = sumo_allgather_start(buf, gathered, 1, SUMO_FLOAT32, comm, &req[2]);
    if (r == SUMO_SUCCESS) r = sumo_aggregator_apply_start(agg, buf, acga_out, N, SUMO_FLOAT32, &req[3]);
    if (r == SUMO_SUCCESS)
        r = sumo_reduce_scatter_start(rs_in, rs_out, 4, SUMO_FLOAT32, SUMO_OP_SUM, comm, &req[4]);
    for (int k = 0; k < 5; k++)
        if (req[k]) {
            sumo_result w = sumo_request_wait(req[k]);
            if (r == SUMO_SUCCESS) r = w;
        }
    j->res[rank] = r;
    int wrong = 0;
    /* sum over ranks of (rank + i) = P(P-1)/2 + P i, exact in fp32 here. */
    double norm = 0;
    for (int i = 0; i < N; i++) {
        double want = size * (size - 1) / 2.0 + (double)size * i;
        norm += want * want;
        if (buf[i] != (float)want) wrong++;
    }
    for (int k = 0; k < size; k++)
        if (gathered[k] != (float)(size * (size - 1) / 2.0)) wrong++;
    /* Identical inputs: G = g / (|g| + eps) (the design notes' first oracle). */
    for (int i = 0; i < N; i++) {
        double want = (double)buf[i] / (sqrt(norm) + 1e-8);
        if (fabs(acga_out[i] - want) > 1e-6 * fabs(want) + 1e-12) wrong++;
    }
    for (int i = 0; i < 4; i++)
        if (rs_out[i] != (float)(size * (4 * rank + i))) wrong++;
    j->wrong[rank] = wrong;
    sumo_aggregator_destroy(agg);
}

static void test_async_forms(void **state)
{
    (void)state;
    for (int P = 1; P <= 5; P++) {
        async_job j;
        memset(&j, 0, sizeof j);
        assert_int_equal(harness_run_threads(P, async_rank, &j), 0);
        for (int r = 0; r < P; r++) {
            assert_int_equal(j.res[r], SUMO_SUCCESS);
            assert_int_equal(j.wrong[r], 0);
        }
    }
}

/* ---- failing together, giving up --------------------------------------------------------- */

typedef struct fail_job {
    sumo_result res[MAXP], after[MAXP];
    char msg[MAXP][256];
} fail_job;

static void fail_rank(sumo_comm *comm, int rank, int size, void *arg)
{
    (void)size;
    fail_job *j = arg;
    float x[100] = {0};
    if (rank == 1) j->res[rank] = sumo_comm_fail(comm, SUMO_ERR_INVALID_ARGUMENT, "bucket 3 has the wrong size");
    else j->res[rank] = sumo_allreduce(x, x, 100, SUMO_FLOAT32, SUMO_OP_SUM, comm);
    const char *m = "";
    sumo_comm_error_message(comm, &m);
    snprintf(j->msg[rank], sizeof j->msg[rank], "%s", m);
    /* A shared verdict: the handle stays usable. */
    for (int i = 0; i < 100; i++) x[i] = 1;
    j->after[rank] = sumo_allreduce(x, x, 100, SUMO_FLOAT32, SUMO_OP_SUM, comm);
    if (x[0] != (float)size) j->after[rank] = SUMO_ERR_INTERNAL;
}

static void test_comm_fail(void **state)
{
    (void)state;
    /* A long deadline: a peer left waiting would show as a timeout, not as this failure. */
    setenv("SUMO_TIMEOUT", "120", 1);
    fail_job j;
    memset(&j, 0, sizeof j);
    assert_int_equal(harness_run_threads(3, fail_rank, &j), 0);
    for (int r = 0; r < 3; r++) {
        assert_int_equal(j.res[r], SUMO_ERR_INVALID_ARGUMENT);
        assert_int_equal(j.after[r], SUMO_SUCCESS);
    }
    assert_non_null(strstr(j.msg[1], "bucket 3 has the wrong size"));
    assert_non_null(strstr(j.msg[0], "rank 1"));
    assert_non_null(strstr(j.msg[2], "rank 1"));
    sumo_comm *c;
    assert_int_equal(sumo_comm_create_threads(1, &c), SUMO_SUCCESS);
    assert_int_equal(sumo_comm_fail(c, SUMO_ERR_TIMEOUT, "not shareable"), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_comm_fail(c, SUMO_SUCCESS, "no failure"), SUMO_ERR_INVALID_ARGUMENT);
    sumo_comm_destroy(c);
    unsetenv("SUMO_TIMEOUT");
}

typedef struct abort_job {
    sumo_comm *comms[2];
    sumo_result waiting, later;
    char msg[256];
} abort_job;

static void *abort_waiter(void *p)
{
    abort_job *j = p;
    float x[10] = {0};
    /* Rank 1 never joins: only the abort can end this wait before the deadline. */
    j->waiting = sumo_allreduce(x, x, 10, SUMO_FLOAT32, SUMO_OP_SUM, j->comms[0]);
    return NULL;
}

static void test_comm_abort(void **state)
{
    (void)state;
    setenv("SUMO_TIMEOUT", "300", 1);
    abort_job j = {0};
    assert_int_equal(sumo_comm_create_threads(2, j.comms), SUMO_SUCCESS);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, abort_waiter, &j), 0);
    usleep(100 * 1000);
    /* Rank 1 gives up from another thread while rank 0 waits for it. */
    assert_int_equal(sumo_comm_abort(j.comms[1], "the data loader died"), SUMO_SUCCESS);
    pthread_join(t, NULL);
    assert_int_equal(j.waiting, SUMO_ERR_PEER_FAILURE);
    float x[10] = {0};
    j.later = sumo_allreduce(x, x, 10, SUMO_FLOAT32, SUMO_OP_SUM, j.comms[1]);
    assert_int_equal(j.later, SUMO_ERR_PEER_FAILURE);
    const char *m;
    sumo_comm_error_message(j.comms[1], &m);
    assert_non_null(strstr(m, "the data loader died"));
    sumo_comm_destroy(j.comms[0]);
    sumo_comm_destroy(j.comms[1]);
    unsetenv("SUMO_TIMEOUT");
}

/* ---- a wait racing with destroy ------------------------------------------------------------ */

typedef struct race {
    sumo_comm *comm;
    sumo_request *req;
    sumo_result waited;
} race;

static void *race_wait(void *p)
{
    race *x = p;
    x->waited = sumo_request_wait(x->req);
    return NULL;
}

/* The request is waited on from one thread while another destroys its handle: the wait must
 * not read the handle being freed (ThreadSanitizer and AddressSanitizer see it when it does). */
static void test_wait_races_destroy(void **state)
{
    (void)state;
    for (int round = 0; round < 200; round++) {
        race x = {0};
        float buf[256] = {0};
        assert_int_equal(sumo_comm_create_threads(1, &x.comm), SUMO_SUCCESS);
        assert_int_equal(sumo_allreduce_start(buf, buf, 256, SUMO_FLOAT32, SUMO_OP_SUM, x.comm, &x.req),
                         SUMO_SUCCESS);
        pthread_t t;
        assert_int_equal(pthread_create(&t, NULL, race_wait, &x), 0);
        assert_int_equal(sumo_comm_destroy(x.comm), SUMO_SUCCESS);
        pthread_join(t, NULL);
        assert_int_equal(x.waited, SUMO_SUCCESS);
    }
}

/* ---- the environment, versions and struct sizes -------------------------------------------- */

static void test_environment_checked(void **state)
{
    (void)state;
    const struct {
        const char *var, *value;
        bool ok;
    } cases[] = {
        {"SUMO_TIMEOUT", "abc", false}, {"SUMO_TIMEOUT", "-5", false}, {"SUMO_TIMEOUT", "0", false},
        {"SUMO_TIMEOUT", "1e9", false}, {"SUMO_TIMEOUT", "5s", false},  {"SUMO_TIMEOUT", "2.5", true},
        {"SUMO_DEBUG", "LOUD", false},  {"SUMO_DEBUG", "warn", true},   {"SUMO_DEBUG", "INFO", true},
        {"SUMO_DEBUG", "NONE", true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        setenv(cases[i].var, cases[i].value, 1);
        char msg[256] = "";
        sumo_result r = sumo_env_check(msg, sizeof msg);
        sumo_comm *c[2] = {0};
        sumo_result made = sumo_comm_create_threads(2, c);
        unsetenv(cases[i].var);
        if (cases[i].ok) {
            assert_int_equal(r, SUMO_SUCCESS);
            assert_int_equal(made, SUMO_SUCCESS);
            sumo_comm_destroy(c[0]);
            sumo_comm_destroy(c[1]);
            continue;
        }
        assert_int_equal(r, SUMO_ERR_INVALID_ARGUMENT);
        assert_int_equal(made, SUMO_ERR_INVALID_ARGUMENT);
        /* The variable, its value and what is accepted. */
        assert_non_null(strstr(msg, cases[i].var));
        assert_non_null(strstr(msg, cases[i].value));
        assert_non_null(strstr(msg, strcmp(cases[i].var, "SUMO_DEBUG") == 0 ? "WARN" : "> 0"));
    }
    char msg[64] = "x";
    assert_int_equal(sumo_env_check(msg, sizeof msg), SUMO_SUCCESS);
    assert_string_equal(msg, "");
}

static void test_versions_and_sizes(void **state)
{
    (void)state;
    int major = -1, minor = -1, patch = -1;
    assert_int_equal(sumo_version(&major, &minor, &patch), SUMO_SUCCESS);
    assert_int_equal(major, SUMO_VERSION_MAJOR);
    assert_int_equal(minor, SUMO_VERSION_MINOR);
    assert_int_equal(patch, SUMO_VERSION_PATCH);
    size_t b = 0;
    assert_int_equal(sumo_struct_size("sumo_aggregator_options", &b), SUMO_SUCCESS);
    assert_int_equal(b, sizeof(sumo_aggregator_options));
    assert_int_equal(sumo_struct_size("sumo_diloco_options", &b), SUMO_SUCCESS);
    assert_int_equal(b, sizeof(sumo_diloco_options));
    assert_int_equal(sumo_struct_size("sumo_no_such_struct", &b), SUMO_ERR_INVALID_ARGUMENT);
    /* Constants, for the same bindings: each name gives this build's own value. */
    int64_t v = -1;
    for (int r = 0; r < SUMO_RESULT_COUNT; r++) { /* every result code, by the name it reports */
        assert_int_equal(sumo_enum_value(sumo_result_name((sumo_result)r), &v), SUMO_SUCCESS);
        assert_int_equal(v, r);
    }
    assert_int_equal(sumo_enum_value("SUMO_OP_AVERAGE", &v), SUMO_SUCCESS);
    assert_int_equal(v, SUMO_OP_AVERAGE);
    assert_int_equal(sumo_enum_value("SUMO_BUFFERS_AVERAGE", &v), SUMO_SUCCESS);
    assert_int_equal(v, SUMO_BUFFERS_AVERAGE);
    assert_int_equal(sumo_enum_value("SUMO_LR_COSINE", &v), SUMO_SUCCESS);
    assert_int_equal(v, SUMO_LR_COSINE);
    assert_int_equal(sumo_enum_value("SUMO_RESULT_COUNT", &v), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_enum_value("SUMO_NO_SUCH_VALUE", NULL), SUMO_ERR_INVALID_ARGUMENT);
    /* The dtype names the reports and messages print, and a name for a value no dtype has. */
    assert_string_equal(sumo_dtype_name(SUMO_FLOAT32), "fp32");
    assert_string_equal(sumo_dtype_name(SUMO_FLOAT64), "fp64");
    assert_string_equal(sumo_dtype_name(SUMO_FLOAT16), "fp16");
    assert_string_equal(sumo_dtype_name(SUMO_BFLOAT16), "bf16");
    assert_string_equal(sumo_dtype_name(SUMO_DTYPE_COUNT), "unknown-dtype");
    assert_string_equal(sumo_dtype_name((sumo_dtype)-1), "unknown-dtype");

    /* Options without their size (a caller built against another header, or that forgot the
     * default) are refused, not read. */
    sumo_optimizer_options oo;
    sumo_optimizer_options_default(SUMO_OPTIM_SGD, &oo);
    oo.struct_size = 0;
    const char *why = NULL;
    assert_int_equal(sumo_optimizer_options_check(&oo, &why), SUMO_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(why, "struct_size"));
    sumo_lr_schedule ls;
    sumo_lr_schedule_default(0.1, &ls);
    double lr;
    assert_int_equal(sumo_lr_at(&ls, 0, &lr), SUMO_SUCCESS);
    ls.struct_size = 4;
    assert_int_equal(sumo_lr_at(&ls, 0, &lr), SUMO_ERR_INVALID_ARGUMENT);
    sumo_comm *c;
    assert_int_equal(sumo_comm_create_threads(1, &c), SUMO_SUCCESS);
    sumo_aggregator_options ao;
    sumo_aggregator_options_default(SUMO_AGGREGATE_AVERAGE, &ao);
    ao.struct_size = sizeof ao + 8;
    sumo_aggregator *agg = NULL;
    assert_int_equal(sumo_aggregator_create(c, &ao, &agg), SUMO_ERR_INVALID_ARGUMENT);
    const char *m;
    sumo_comm_error_message(c, &m);
    assert_non_null(strstr(m, "struct_size"));
    sumo_diloco_options so;
    sumo_diloco_options_default(SUMO_DILOCO_PRESET_LOCALSGD, &so);
    so.struct_size = 0;
    sumo_diloco *s = NULL;
    assert_int_equal(sumo_diloco_create(c, NULL, 0, 10, SUMO_FLOAT32, &so, &s), SUMO_ERR_INVALID_ARGUMENT);
    sumo_comm_error_message(c, &m);
    assert_non_null(strstr(m, "struct_size"));
    /* ACGA's options carry their own (their default, and so the aggregator's, sets it),
     * checked where ACGA is made: by an aggregator, or by DiLoCo from its acga pointer. */
    sumo_acga_options acga_alone;
    assert_int_equal(sumo_acga_options_default(&acga_alone), SUMO_SUCCESS);
    sumo_aggregator_options_default(SUMO_AGGREGATE_ACGA, &ao);
    assert_int_equal(ao.acga.struct_size, sizeof(sumo_acga_options));
    assert_memory_equal(&acga_alone, &ao.acga, sizeof acga_alone);
    /* Every options struct has its default, which sets the size. */
    sumo_adasum_options ad;
    sumo_compression cd;
    sumo_shm_options sd;
    assert_int_equal(sumo_adasum_options_default(&ad), SUMO_SUCCESS);
    assert_int_equal(sumo_compression_default(SUMO_COMPRESS_E3M0, &cd), SUMO_SUCCESS);
    assert_int_equal(sumo_shm_options_default(&sd), SUMO_SUCCESS);
    assert_true(ad.struct_size == sizeof ad && cd.struct_size == sizeof cd && sd.struct_size == sizeof sd);
    assert_true(cd.format == SUMO_COMPRESS_E3M0 && cd.block_size == 128 && cd.op == SUMO_OP_AVERAGE);
    assert_int_equal(sumo_adasum_options_default(NULL), SUMO_ERR_INVALID_ARGUMENT);
    sumo_diloco_options dopt;
    sumo_diloco_options_default(SUMO_DILOCO_PRESET_DILOCO, &dopt);
    dopt.combine = SUMO_COMBINE_ACGA;
    dopt.acga = &ao.acga;
    const size_t layout[] = {3, 5};
    sumo_diloco *d = NULL;
    assert_int_equal(sumo_diloco_create(c, layout, 2, 8, SUMO_FLOAT32, &dopt, &d), SUMO_SUCCESS);
    sumo_diloco_destroy(d);
    ao.acga.struct_size = sizeof ao.acga - 8;
    assert_int_equal(sumo_aggregator_create(c, &ao, &agg), SUMO_ERR_INVALID_ARGUMENT);
    sumo_comm_error_message(c, &m);
    assert_non_null(strstr(m, "acga: sumo_acga_options.struct_size"));
    d = NULL;
    assert_int_equal(sumo_diloco_create(c, layout, 2, 8, SUMO_FLOAT32, &dopt, &d), SUMO_ERR_INVALID_ARGUMENT);
    assert_null(d);
    sumo_comm_error_message(c, &m);
    assert_non_null(strstr(m, "sumo_acga_options.struct_size"));
    sumo_comm_destroy(c);
}

/* ---- agreement at creation, for any number of ranks ------------------------------------------ */

typedef struct agree_job {
    int odd_rank;
    int what; /* 0 ACGA beta, 1 layout, 2 method */
    sumo_result res[MAXP];
} agree_job;

static void agree_rank(sumo_comm *comm, int rank, int size, void *arg)
{
    (void)size;
    agree_job *j = arg;
    const size_t counts[] = {10, 20}, other[] = {20, 10};
    sumo_aggregator_options o;
    sumo_aggregator_options_default(j->what == 2 && rank == j->odd_rank ? SUMO_AGGREGATE_AVERAGE
                                                                        : SUMO_AGGREGATE_ACGA,
                                    &o);
    o.tensor_counts = j->what == 1 && rank == j->odd_rank ? other : counts;
    o.ntensors = 2;
    o.acga.per_tensor = 1;
    if (j->what == 0 && rank == j->odd_rank) o.acga.beta = 0.1;
    sumo_aggregator *agg = NULL;
    j->res[rank] = sumo_aggregator_create(comm, &o, &agg);
    sumo_aggregator_destroy(agg);
}

static void test_aggregator_agreement(void **state)
{
    (void)state;
    /* 17 ranks: beyond the Gram form's 16, where options were never compared before. */
    for (int what = 0; what < 3; what++) {
        agree_job j = {.odd_rank = 5, .what = what};
        assert_int_equal(harness_run_threads(17, agree_rank, &j), 0);
        for (int r = 0; r < 17; r++) assert_int_equal(j.res[r], SUMO_ERR_MISMATCH);
    }
    agree_job ok = {.odd_rank = -1};
    assert_int_equal(harness_run_threads(17, agree_rank, &ok), 0);
    for (int r = 0; r < 17; r++) assert_int_equal(ok.res[r], SUMO_SUCCESS);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reduce_scatter),
        cmocka_unit_test(test_async_forms),
        cmocka_unit_test(test_comm_fail),
        cmocka_unit_test(test_comm_abort),
        cmocka_unit_test(test_wait_races_destroy),
        cmocka_unit_test(test_environment_checked),
        cmocka_unit_test(test_versions_and_sizes),
        cmocka_unit_test(test_aggregator_agreement),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
