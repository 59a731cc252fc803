/*
 * Collectives on the threads transport against a plain sequential reference.
 *
 * The shared-memory algorithm sums in rank order, so with random data it must match a
 * sequential rank-order sum bit for bit. The ring and recursive-doubling algorithms sum in
 * other orders: they are checked exactly on small-integer data (exact in any order, also in
 * fp16/bf16) and for bit-identity across ranks on random data.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "support/harness.h"
#include "support/reference.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum kind { ALLREDUCE, ALLGATHER, BROADCAST, BARRIER };

typedef struct config {
    enum kind kind;
    sumo_dtype dtype;
    sumo_op op;
    size_t count;
    bool in_place;
    bool integer_data;
    sumo_algorithm algo;
    int root;
} config;

typedef struct run {
    config cfg;
    int size;
    unsigned char **send; /* per rank */
    unsigned char **recv; /* per rank */
    sumo_result *result;  /* per rank */
} run;

static double input_value(const config *c, int rank, size_t i)
{
    return harness_collective_value(rank, i, c->integer_data);
}

static size_t recv_count(const run *r)
{
    return r->cfg.kind == ALLGATHER ? r->cfg.count * (size_t)r->size : r->cfg.count;
}

static void fill(run *r)
{
    size_t esz = harness_dtype_size(r->cfg.dtype);
    for (int k = 0; k < r->size; k++) {
        r->recv[k] = malloc(recv_count(r) * esz + 1);
        if (r->cfg.in_place) {
            size_t offset = r->cfg.kind == ALLGATHER ? (size_t)k * r->cfg.count : 0;
            r->send[k] = r->recv[k] + offset * esz;
            memset(r->recv[k], 0xAB, recv_count(r) * esz); /* what a gather must overwrite */
        } else {
            r->send[k] = malloc(r->cfg.count * esz + 1);
            memset(r->recv[k], 0xAB, recv_count(r) * esz);
        }
        for (size_t i = 0; i < r->cfg.count; i++)
            harness_set(r->cfg.dtype, r->send[k], i, input_value(&r->cfg, k, i));
    }
}

static void release(run *r)
{
    for (int k = 0; k < r->size; k++) {
        if (!r->cfg.in_place) free(r->send[k]);
        free(r->recv[k]);
    }
}

static void rank_body(sumo_comm *comm, int rank, int size, void *arg)
{
    (void)size;
    run *r = arg;
    const config *c = &r->cfg;
    sumo_result res = SUMO_SUCCESS;
    if (c->algo != SUMO_ALGORITHM_AUTO) res = sumo_comm_set_param(comm, SUMO_PARAM_ALGORITHM, c->algo);
    if (res == SUMO_SUCCESS) {
        switch (c->kind) {
        case ALLREDUCE:
            res = sumo_allreduce(r->send[rank], r->recv[rank], c->count, c->dtype, c->op, comm);
            break;
        case ALLGATHER:
            res = sumo_allgather(r->send[rank], r->recv[rank], c->count, c->dtype, comm);
            break;
        case BROADCAST:
            res = sumo_broadcast(r->send[rank], r->recv[rank], c->count, c->dtype, c->root, comm);
            break;
        case BARRIER: res = sumo_barrier(comm); break;
        }
    }
    r->result[rank] = res;
}

/* The documented semantics, one element at a time: sum in rank order in the accumulator type
 * (fp32 for fp16/bf16), divide once, round once to the dtype. */
static double reference_reduce(const run *r, size_t i)
{
    const config *c = &r->cfg;
    double v[64]; /* 64: the largest P below */
    for (int k = 0; k < r->size; k++) v[k] = harness_get(c->dtype, r->send[k], i);
    double acc = ref_sum_in_order(c->dtype, v, r->size, c->op == SUMO_OP_AVERAGE ? r->size : 1);
    unsigned char tmp[8];
    harness_set(c->dtype, tmp, 0, acc);
    return harness_get(c->dtype, tmp, 0);
}

static bool same_value(double a, double b) { return (isnan(a) && isnan(b)) || a == b; }

/* Runs one configuration; returns the number of mismatching elements (0 = pass) and prints
 * the first few. Inputs are kept aside because in-place runs overwrite them. */
static int check_config(config cfg, int size)
{
    run r = {.cfg = cfg, .size = size};
    r.send = calloc((size_t)size, sizeof *r.send);
    r.recv = calloc((size_t)size, sizeof *r.recv);
    r.result = calloc((size_t)size, sizeof *r.result);
    fill(&r);
    size_t esz = harness_dtype_size(cfg.dtype);
    /* Keep the inputs: in-place collectives overwrite them. */
    run ref = r;
    ref.send = calloc((size_t)size, sizeof *ref.send);
    for (int k = 0; k < size; k++) {
        ref.send[k] = malloc(cfg.count * esz + 1);
        memcpy(ref.send[k], r.send[k], cfg.count * esz);
    }
    int bad = 0;
    if (harness_run_threads(size, rank_body, &r) != 0) bad++;
    for (int k = 0; k < size && !bad; k++) {
        if (r.result[k] != SUMO_SUCCESS) {
            fprintf(stderr, "kind %d P=%d count=%zu dtype=%d rank %d: %s\n", cfg.kind, size,
                    cfg.count, cfg.dtype, k, sumo_result_name(r.result[k]));
            bad++;
        }
    }
    /* The expected output, computed once: every rank must hold exactly this. */
    size_t n = recv_count(&r);
    double *want = malloc((n + 1) * sizeof *want);
    for (size_t i = 0; i < n && !bad; i++) {
        switch (cfg.kind) {
        case ALLREDUCE: want[i] = reference_reduce(&ref, i); break;
        case ALLGATHER: want[i] = harness_get(cfg.dtype, ref.send[i / cfg.count], i % cfg.count); break;
        case BROADCAST: want[i] = harness_get(cfg.dtype, ref.send[cfg.root], i); break;
        default: n = 0; break;
        }
    }
    for (int k = 0; k < size && !bad; k++) {
        for (size_t i = 0; i < n && bad < 5; i++) {
            double got = harness_get(cfg.dtype, r.recv[k], i);
            if (!same_value(got, want[i])) {
                fprintf(stderr,
                        "kind %d algo %d P=%d count=%zu dtype=%d op=%d in_place=%d int=%d: rank %d "
                        "element %zu = %.9g, want %.9g\n",
                        cfg.kind, cfg.algo, size, cfg.count, cfg.dtype, cfg.op, cfg.in_place,
                        cfg.integer_data, k, i, got, want[i]);
                bad++;
            }
        }
        /* Every rank ends bit-identical. */
        if (k > 0 && memcmp(r.recv[k], r.recv[0], n * esz) != 0) {
            fprintf(stderr, "kind %d P=%d count=%zu: rank %d differs from rank 0 in its bits\n",
                    cfg.kind, size, cfg.count, k);
            bad++;
        }
    }
    free(want);
    for (int k = 0; k < size; k++) free(ref.send[k]);
    free(ref.send);
    release(&r);
    free(r.send);
    free(r.recv);
    free(r.result);
    return bad;
}

/* Under the sanitizers (what they look for, races and bad accesses, shows with a few ranks) the
 * groups of 16 and 64 threads on two cores cost minutes; the plain build runs them. */
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
static const int sizes[] = {1, 2, 3, 4, 5, 7, 8};
#else
static const int sizes[] = {1, 2, 3, 4, 5, 7, 8, 16, 64};
#endif
static const sumo_dtype dtypes[] = {SUMO_FLOAT32, SUMO_FLOAT64, SUMO_FLOAT16, SUMO_BFLOAT16};

/* 0, 1, a prime, not divisible by P, a few chunks' worth. */
static size_t counts_for(int size, int which)
{
    const size_t base[] = {0, 1, 13, (size_t)size * 16 + 5, 1000, 100003};
    return base[which];
}
#define NCOUNTS 6

static void test_allreduce_shm_matches_rank_order_sum(void **state)
{
    (void)state;
    int bad = 0;
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
        for (size_t d = 0; d < 4; d++)
            for (int w = 0; w < NCOUNTS; w++)
                for (int op = 0; op < 2; op++)
                    for (int in_place = 0; in_place < 2; in_place++) {
                        if (sizes[s] >= 16 && w == NCOUNTS - 1 && d > 0) continue; /* time */
                        config c = {.kind = ALLREDUCE, .dtype = dtypes[d], .op = (sumo_op)op,
                                    .count = counts_for(sizes[s], w), .in_place = in_place,
                                    .algo = SUMO_ALGORITHM_AUTO};
                        bad += check_config(c, sizes[s]);
                    }
    assert_int_equal(bad, 0);
}

static void test_allreduce_p2p_algorithms(void **state)
{
    (void)state;
    int bad = 0;
    const sumo_algorithm algos[] = {SUMO_ALGORITHM_RING, SUMO_ALGORITHM_RECURSIVE_DOUBLING,
                                    SUMO_ALGORITHM_RANKED};
    for (size_t a = 0; a < 3; a++)
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
            for (size_t d = 0; d < 4; d++)
                for (int w = 0; w < NCOUNTS - 1; w++)
                    for (int op = 0; op < 2; op++) {
                        config c = {.kind = ALLREDUCE, .dtype = dtypes[d], .op = (sumo_op)op,
                                    .count = counts_for(sizes[s], w), .in_place = (w & 1),
                                    .integer_data = true, .algo = algos[a]};
                        /* The average of integers is exact only when it is representable. */
                        if (op == SUMO_OP_AVERAGE && (sizes[s] & (sizes[s] - 1)) != 0) continue;
                        bad += check_config(c, sizes[s]);
                    }
    assert_int_equal(bad, 0);
}

/* fp16/bf16 through the ring and recursive doubling over several chunks (the widened ring
 * reduces 2^18 elements at a time, recursive doubling 2^16): exact integer sums, in place and
 * not, and averages. */
static void test_ring_narrow_types_many_chunks(void **state)
{
    (void)state;
    int bad = 0;
    const sumo_dtype narrow[] = {SUMO_FLOAT16, SUMO_BFLOAT16};
    const sumo_algorithm algos[] = {SUMO_ALGORITHM_RING, SUMO_ALGORITHM_RECURSIVE_DOUBLING};
    const int ranks[] = {2, 3};
    for (size_t a = 0; a < 2; a++)
        for (size_t d = 0; d < 2; d++)
            for (size_t p = 0; p < 2; p++)
                for (int in_place = 0; in_place < 2; in_place++) {
                    config c = {.kind = ALLREDUCE, .dtype = narrow[d],
                                .op = in_place ? SUMO_OP_AVERAGE : SUMO_OP_SUM,
                                .count = ((size_t)5 << 18) + 7, .in_place = in_place,
                                .integer_data = true, .algo = algos[a]};
                    bad += check_config(c, ranks[p]);
                }
    assert_int_equal(bad, 0);
}

/* Random data through the p2p algorithms: not rank-order sums, but identical on all ranks. */
static void rank_identity_body(sumo_comm *comm, int rank, int size, void *arg)
{
    (void)size;
    run *r = arg;
    r->result[rank] = sumo_comm_set_param(comm, SUMO_PARAM_ALGORITHM, r->cfg.algo);
    if (r->result[rank] == SUMO_SUCCESS)
        r->result[rank] = sumo_allreduce(r->send[rank], r->recv[rank], r->cfg.count, r->cfg.dtype,
                                         r->cfg.op, comm);
}

static void test_p2p_bit_identical_on_random_data(void **state)
{
    (void)state;
    const sumo_algorithm algos[] = {SUMO_ALGORITHM_RING, SUMO_ALGORITHM_RECURSIVE_DOUBLING,
                                    SUMO_ALGORITHM_RANKED};
    for (size_t a = 0; a < 3; a++)
        for (int size = 2; size <= 7; size++)
            for (size_t d = 0; d < 4; d++) {
                run r = {.cfg = {.kind = ALLREDUCE, .dtype = dtypes[d], .op = SUMO_OP_AVERAGE,
                                 .count = 4099, .algo = algos[a]},
                         .size = size};
                r.send = calloc((size_t)size, sizeof *r.send);
                r.recv = calloc((size_t)size, sizeof *r.recv);
                r.result = calloc((size_t)size, sizeof *r.result);
                fill(&r);
                assert_int_equal(harness_run_threads(size, rank_identity_body, &r), 0);
                size_t bytes = r.cfg.count * harness_dtype_size(r.cfg.dtype);
                for (int k = 0; k < size; k++) {
                    assert_int_equal(r.result[k], SUMO_SUCCESS);
                    assert_memory_equal(r.recv[k], r.recv[0], bytes);
                }
                /* And close to the exact sum: the order only moves the last bits. */
                for (size_t i = 0; i < r.cfg.count; i++) {
                    double exact = 0;
                    for (int k = 0; k < size; k++) exact += input_value(&r.cfg, k, i);
                    exact /= size;
                    double tol = d == 1 ? 1e-12 : d == 0 ? 1e-5 : d == 2 ? 1e-2 : 5e-2;
                    assert_true(fabs(harness_get(r.cfg.dtype, r.recv[0], i) - exact) <= tol * 4);
                }
                release(&r);
                free(r.send);
                free(r.recv);
                free(r.result);
            }
}

/* The ranked algorithm (what a transport of messages runs by default) sums in rank order with
 * the shared-memory algorithms' kernel: the same bits as they give, on random data of every
 * dtype, across its chunks (300,001 fp32 elements at P 2 is two chunks of a segment), in place
 * and out of place. */
static void test_ranked_equals_shared_memory(void **state)
{
    (void)state;
    const size_t counts[] = {1, 4099, 300001};
    for (int size = 1; size <= 5; size++)
        for (size_t d = 0; d < 4; d++)
            for (size_t c = 0; c < 3; c++)
                for (int in_place = 0; in_place < 2; in_place++)
                    for (int avg = 0; avg < 2; avg++) {
                        unsigned char *want[8], *got[8];
                        const sumo_algorithm algos[] = {SUMO_ALGORITHM_SHARED_MEMORY,
                                                        SUMO_ALGORITHM_RANKED};
                        for (int a = 0; a < 2; a++) {
                            run r = {.cfg = {.kind = ALLREDUCE, .dtype = dtypes[d],
                                             .op = avg ? SUMO_OP_AVERAGE : SUMO_OP_SUM,
                                             .count = counts[c], .in_place = in_place,
                                             .algo = algos[a]},
                                     .size = size};
                            r.send = calloc((size_t)size, sizeof *r.send);
                            r.recv = calloc((size_t)size, sizeof *r.recv);
                            r.result = calloc((size_t)size, sizeof *r.result);
                            fill(&r);
                            assert_int_equal(harness_run_threads(size, rank_identity_body, &r), 0);
                            size_t bytes = r.cfg.count * harness_dtype_size(r.cfg.dtype);
                            for (int k = 0; k < size; k++) {
                                assert_int_equal(r.result[k], SUMO_SUCCESS);
                                unsigned char *copy = malloc(bytes + 1);
                                memcpy(copy, r.recv[k], bytes);
                                (a == 0 ? want : got)[k] = copy;
                            }
                            release(&r);
                            free(r.send);
                            free(r.recv);
                            free(r.result);
                        }
                        size_t bytes = counts[c] * harness_dtype_size(dtypes[d]);
                        for (int k = 0; k < size; k++) {
                            if (memcmp(want[k], got[k], bytes) != 0)
                                fail_msg("ranked != shared memory: P %d dtype %zu count %zu "
                                         "in place %d average %d rank %d",
                                         size, d, counts[c], in_place, avg, k);
                            free(want[k]);
                            free(got[k]);
                        }
                    }
}

static void test_allgather_and_broadcast(void **state)
{
    (void)state;
    int bad = 0;
    const sumo_algorithm algos[] = {SUMO_ALGORITHM_AUTO, SUMO_ALGORITHM_RING};
    for (size_t a = 0; a < 2; a++)
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
            for (size_t d = 0; d < 4; d++)
                for (int w = 0; w < NCOUNTS - 1; w++)
                    for (int in_place = 0; in_place < 2; in_place++) {
                        config c = {.kind = ALLGATHER, .dtype = dtypes[d],
                                    .count = counts_for(sizes[s], w), .in_place = in_place,
                                    .algo = algos[a]};
                        bad += check_config(c, sizes[s]);
                        c.kind = BROADCAST;
                        c.root = (int)(w % (size_t)sizes[s]);
                        bad += check_config(c, sizes[s]);
                        c.root = sizes[s] - 1;
                        bad += check_config(c, sizes[s]);
                    }
    assert_int_equal(bad, 0);
}

static void test_barrier(void **state)
{
    (void)state;
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        config c = {.kind = BARRIER};
        assert_int_equal(check_config(c, sizes[s]), 0);
    }
}

/*
 * The barrier holds every rank until all have arrived, checked by ordering, not by time: each
 * rank counts its arrival (release) before calling sumo_barrier, and after the barrier of
 * round k every rank must see all P arrivals of that round (acquire), and none beyond what the
 * next barrier allows (a rank cannot arrive at round k+2 before this one left round k). In
 * round k rank k % P arrives late: the sleep does not make a correct barrier pass, it makes a
 * barrier that returns at once fail, since the others then read the count before the late
 * rank added to it.
 */
typedef struct barrier_run {
    _Atomic long arrived;
    int rounds;
    sumo_result result[64];
    int too_early[64]; /* rounds where this rank left before everyone had arrived */
    int too_late[64];  /* rounds where it saw arrivals the barrier should still hold back */
} barrier_run;

static void barrier_order_body(sumo_comm *comm, int rank, int size, void *arg)
{
    barrier_run *b = arg;
    b->result[rank] = SUMO_SUCCESS;
    for (int k = 0; k < b->rounds && b->result[rank] == SUMO_SUCCESS; k++) {
        if (rank == k % size) nanosleep(&(struct timespec){.tv_nsec = 5 * 1000 * 1000}, NULL);
        atomic_fetch_add_explicit(&b->arrived, 1, memory_order_release);
        b->result[rank] = sumo_barrier(comm);
        long seen = atomic_load_explicit(&b->arrived, memory_order_acquire);
        if (seen < (long)size * (k + 1)) b->too_early[rank]++;
        if (seen >= (long)size * (k + 2)) b->too_late[rank]++;
    }
}

static void test_barrier_orders_ranks(void **state)
{
    (void)state;
    const int ps[] = {2, 3, 5, 8};
    for (size_t s = 0; s < sizeof ps / sizeof ps[0]; s++) {
        barrier_run *b = calloc(1, sizeof *b);
        assert_non_null(b);
        b->rounds = 2 * ps[s]; /* every rank is the late one twice */
        assert_int_equal(harness_run_threads(ps[s], barrier_order_body, b), 0);
        for (int r = 0; r < ps[s]; r++) {
            if (b->result[r] != SUMO_SUCCESS || b->too_early[r] || b->too_late[r])
                fail_msg("P=%d rank %d: %s, left early in %d rounds, saw later arrivals in %d",
                         ps[s], r, sumo_result_name(b->result[r]), b->too_early[r],
                         b->too_late[r]);
        }
        free(b);
    }
}

/* NaN and Inf travel through sums as IEEE arithmetic says. */
static void test_nonfinite_pass_through(void **state)
{
    (void)state;
    for (size_t d = 0; d < 4; d++) {
        run r = {.cfg = {.kind = ALLREDUCE, .dtype = dtypes[d], .op = SUMO_OP_SUM, .count = 64,
                         .integer_data = true},
                 .size = 3};
        r.send = calloc(3, sizeof *r.send);
        r.recv = calloc(3, sizeof *r.recv);
        r.result = calloc(3, sizeof *r.result);
        fill(&r);
        harness_set(r.cfg.dtype, r.send[1], 5, NAN);
        harness_set(r.cfg.dtype, r.send[0], 9, INFINITY);
        harness_set(r.cfg.dtype, r.send[0], 20, INFINITY);
        harness_set(r.cfg.dtype, r.send[2], 20, -INFINITY);
        assert_int_equal(harness_run_threads(3, rank_body, &r), 0);
        for (int k = 0; k < 3; k++) {
            assert_int_equal(r.result[k], SUMO_SUCCESS);
            assert_true(isnan(harness_get(r.cfg.dtype, r.recv[k], 5)));
            assert_true(isinf(harness_get(r.cfg.dtype, r.recv[k], 9)) &&
                        harness_get(r.cfg.dtype, r.recv[k], 9) > 0);
            assert_true(isnan(harness_get(r.cfg.dtype, r.recv[k], 20)));
            assert_true(isfinite(harness_get(r.cfg.dtype, r.recv[k], 6)));
        }
        release(&r);
        free(r.send);
        free(r.recv);
        free(r.result);
    }
}

static void test_results_repeat_bit_for_bit(void **state)
{
    (void)state;
    for (int rep = 0; rep < 2; rep++) {
        config c = {.kind = ALLREDUCE, .dtype = SUMO_FLOAT32, .op = SUMO_OP_AVERAGE,
                    .count = 77777, .algo = rep ? SUMO_ALGORITHM_RING : SUMO_ALGORITHM_AUTO};
        run a = {.cfg = c, .size = 5}, b = {.cfg = c, .size = 5};
        run *runs[2] = {&a, &b};
        for (int j = 0; j < 2; j++) {
            runs[j]->send = calloc(5, sizeof(void *));
            runs[j]->recv = calloc(5, sizeof(void *));
            runs[j]->result = calloc(5, sizeof(sumo_result));
            fill(runs[j]);
            assert_int_equal(harness_run_threads(5, rank_identity_body, runs[j]), 0);
        }
        for (int k = 0; k < 5; k++) assert_memory_equal(a.recv[k], b.recv[k], c.count * 4);
        for (int j = 0; j < 2; j++) {
            release(runs[j]);
            free(runs[j]->send);
            free(runs[j]->recv);
            free(runs[j]->result);
        }
    }
}

static void test_result_strings(void **state)
{
    (void)state;
    for (int r = 0; r < SUMO_RESULT_COUNT; r++) {
        assert_non_null(sumo_strerror((sumo_result)r));
        assert_true(strlen(sumo_strerror((sumo_result)r)) > 5);
        assert_true(strncmp(sumo_result_name((sumo_result)r), "SUMO_", 5) == 0);
        for (int q = 0; q < r; q++)
            assert_string_not_equal(sumo_strerror((sumo_result)r), sumo_strerror((sumo_result)q));
    }
    assert_non_null(sumo_strerror((sumo_result)999));
    assert_string_equal(sumo_result_name((sumo_result)-1), "SUMO_RESULT_UNKNOWN");
    size_t sz = 0;
    assert_int_equal(sumo_dtype_size(SUMO_BFLOAT16, &sz), SUMO_SUCCESS);
    assert_int_equal(sz, 2);
    assert_int_equal(sumo_dtype_size((sumo_dtype)7, &sz), SUMO_ERR_INVALID_ARGUMENT);
}

static void test_comm_handles(void **state)
{
    (void)state;
    sumo_comm *comms[3];
    assert_int_equal(sumo_comm_create_threads(0, comms), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_comm_create_threads(2, NULL), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_comm_destroy(NULL), SUMO_SUCCESS);
    assert_int_equal(sumo_comm_create_threads(3, comms), SUMO_SUCCESS);
    int rank = -1, size = -1;
    const char *name = NULL;
    double t = 0;
    assert_int_equal(sumo_comm_rank(comms[2], &rank), SUMO_SUCCESS);
    assert_int_equal(sumo_comm_size(comms[2], &size), SUMO_SUCCESS);
    assert_int_equal(sumo_comm_transport(comms[2], &name), SUMO_SUCCESS);
    assert_int_equal(rank, 2);
    assert_int_equal(size, 3);
    assert_string_equal(name, "threads");
    assert_int_equal(sumo_comm_set_timeout(comms[0], 0), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_comm_set_timeout(comms[0], NAN), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_comm_set_timeout(comms[0], 2.5), SUMO_SUCCESS);
    assert_int_equal(sumo_comm_get_timeout(comms[0], &t), SUMO_SUCCESS);
    assert_true(fabs(t - 2.5) < 1e-9);
    assert_int_equal(sumo_comm_rank(NULL, &rank), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_allreduce(NULL, NULL, 0, SUMO_FLOAT32, SUMO_OP_SUM, NULL),
                     SUMO_ERR_INVALID_ARGUMENT);
    for (int k = 0; k < 3; k++) assert_int_equal(sumo_comm_destroy(comms[k]), SUMO_SUCCESS);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_result_strings),
        cmocka_unit_test(test_comm_handles),
        cmocka_unit_test(test_allreduce_shm_matches_rank_order_sum),
        cmocka_unit_test(test_allreduce_p2p_algorithms),
        cmocka_unit_test(test_ring_narrow_types_many_chunks),
        cmocka_unit_test(test_p2p_bit_identical_on_random_data),
        cmocka_unit_test(test_ranked_equals_shared_memory),
        cmocka_unit_test(test_allgather_and_broadcast),
        cmocka_unit_test(test_barrier),
        cmocka_unit_test(test_barrier_orders_ranks),
        cmocka_unit_test(test_nonfinite_pass_through),
        cmocka_unit_test(test_results_repeat_bit_for_bit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
