/*
 * ACGA's state: a run saved, destroyed, recreated and loaded halfway gives the bits of one
 * uninterrupted, and the documented format, written by hand, drives the next step as the
 * reference's momentum does; every malformed or mismatched state is refused and changes
 * nothing.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "sumo_aggregation.h"
#include "support/acga_run.h"
#include "support/harness.h"
#include "support/reference.h"

#include <float.h>
#include <pthread.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Creates an aggregator on every rank of comms at once (creation is collective). */
typedef struct create_job {
    sumo_comm *comm;
    const sumo_aggregator_options *opts;
    sumo_aggregator *agg;
    sumo_result r;
} create_job;

static void *create_main(void *p)
{
    create_job *j = p;
    j->r = sumo_aggregator_create(j->comm, j->opts, &j->agg);
    return NULL;
}

static void create_on_all(sumo_comm **comms, int n, const sumo_aggregator_options *o,
                          sumo_aggregator **aggs)
{
    create_job jobs[MAXN];
    pthread_t ids[MAXN];
    for (int r = 0; r < n; r++) {
        jobs[r] = (create_job){.comm = comms[r], .opts = o};
        assert_int_equal(pthread_create(&ids[r], NULL, create_main, &jobs[r]), 0);
    }
    for (int r = 0; r < n; r++) pthread_join(ids[r], NULL);
    for (int r = 0; r < n; r++) {
        assert_int_equal(jobs[r].r, SUMO_SUCCESS);
        aggs[r] = jobs[r].agg;
    }
}

/* ---- state -------------------------------------------------------------------------------- */

static void test_checkpoint_round_trip(void **state)
{
    (void)state;
    const size_t counts[] = {11, 50, 39};
    for (int ni = 0; ni < NSIZES; ni++)
        for (int per_tensor = 0; per_tensor <= 1; per_tensor++) {
            int N = SIZES[ni];
            acga_run A, B;
            run_init(&A, N, 100, 6);
            run_init(&B, N, 100, 6);
            for (acga_run *P = &A; P; P = P == &A ? &B : NULL) {
                run_layout(P, counts, 3);
                P->opts.acga.per_tensor = per_tensor;
                P->opts.acga.beta = 0.9;
                fill_correlated(P, 555, 0.6);
            }
            B.restore_after = 3;
            run_go(&A);
            run_go(&B);
            check_all_steps(&A, "checkpoint, uninterrupted");
            for (int r = 0; r < N; r++) {
                assert_int_equal(B.save_res[r], SUMO_SUCCESS);
                assert_int_equal(B.load_res[r], SUMO_SUCCESS);
                for (int s = 0; s < 6; s++)
                    assert_memory_equal(A.out[s][r], B.out[s][r], 100 * sizeof(float));
                assert_memory_equal(A.state[5][r], B.state[5][r], A.state_bytes[r]);
            }
            run_free(&A);
            run_free(&B);
        }
}

static void put_u32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static void put_f64(unsigned char *p, double d)
{
    uint64_t v;
    memcpy(&v, &d, 8);
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* The documented format, written by hand: header (magic, version, N, K, initialised, 0) and
 * the group-major EMA. */
static size_t make_state(unsigned char *p, uint32_t magic, uint32_t version, uint32_t n,
                         uint32_t k, uint32_t init, const double *m)
{
    put_u32(p, magic);
    put_u32(p + 4, version);
    put_u32(p + 8, n);
    put_u32(p + 12, k);
    put_u32(p + 16, init);
    put_u32(p + 20, 0);
    for (uint32_t i = 0; i < n * k; i++) put_f64(p + 24 + 8 * i, m[i]);
    return 24 + 8 * (size_t)n * k;
}

#define MAGIC 0x41474341u

static void test_state_format(void **state)
{
    (void)state;
    /* A hand-made initialised state drives the next step like the reference's momentum. */
    const double m[3] = {0.05, 0.2, 0.4};
    unsigned char buf[24 + 8 * 3];
    acga_run R;
    run_init(&R, 3, 40, 2);
    R.opts.acga.beta = 0.8;
    fill_correlated(&R, 9, 0.5);
    R.preload = buf;
    R.preload_bytes = make_state(buf, MAGIC, 1, 3, 1, 1, m);
    run_go(&R);
    ref_acga F;
    ref_init(&F, &R);
    F.init = 1;
    memcpy(F.m, m, sizeof m);
    for (int r = 0; r < 3; r++) assert_int_equal(R.preload_res[r], SUMO_SUCCESS);
    check_step(&R, &F, 0, "preloaded state");
    check_step(&R, &F, 1, "preloaded state");
    ref_acga_free(&F);
    run_free(&R);

    /* Rejections: 2 ranks x 3 tensors has the size of 3 ranks x 2 tensors. */
    sumo_comm *c2[2], *c3[3];
    assert_int_equal(sumo_comm_create_threads(2, c2), SUMO_SUCCESS);
    assert_int_equal(sumo_comm_create_threads(3, c3), SUMO_SUCCESS);
    const size_t l3[] = {4, 4, 4}, l2[] = {6, 6};
    sumo_aggregator_options o2, o3;
    sumo_aggregator_options_default(SUMO_AGGREGATE_ACGA, &o2);
    o3 = o2;
    o2.acga.per_tensor = o3.acga.per_tensor = 1;
    o2.tensor_counts = l3, o2.ntensors = 3; /* on 2 ranks */
    o3.tensor_counts = l2, o3.ntensors = 2; /* on 3 ranks */
    sumo_aggregator *all2[2], *all3[3];
    create_on_all(c2, 2, &o2, all2);
    create_on_all(c3, 3, &o3, all3);
    sumo_aggregator *a2 = all2[0], *a3 = all3[0];
    size_t b2 = 0, b3 = 0;
    assert_int_equal(sumo_aggregator_state_size(a2, &b2), SUMO_SUCCESS);
    assert_int_equal(sumo_aggregator_state_size(a3, &b3), SUMO_SUCCESS);
    assert_int_equal(b2, 24 + 8 * 6);
    assert_int_equal(b3, b2);
    unsigned char s2[72], s3[72];
    assert_int_equal(sumo_aggregator_state_save(a2, s2, b2), SUMO_SUCCESS);
    assert_int_equal(sumo_aggregator_state_load(a3, s2, b2), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_aggregator_state_save(a3, s3, b3), SUMO_SUCCESS);
    assert_int_equal(sumo_aggregator_state_load(a3, s3, b3), SUMO_SUCCESS);
    assert_int_equal(sumo_aggregator_state_load(a3, s3, b3 - 1), SUMO_ERR_INVALID_ARGUMENT);
    const double ok6[6] = {0, .1, .2, .3, .4, .5};
    double nan6[6] = {0, .1, .2, NAN, .4, .5};
    struct { uint32_t magic, version, n, k, init; const double *m; sumo_result want; } cases[] = {
        {MAGIC, 1, 3, 2, 1, ok6, SUMO_SUCCESS},
        {MAGIC, 1, 3, 2, 0, ok6, SUMO_SUCCESS},
        {MAGIC + 1, 1, 3, 2, 1, ok6, SUMO_ERR_INVALID_ARGUMENT},
        {MAGIC, 2, 3, 2, 1, ok6, SUMO_ERR_INVALID_ARGUMENT},
        {MAGIC, 1, 3, 2, 2, ok6, SUMO_ERR_INVALID_ARGUMENT},
        {MAGIC, 1, 2, 3, 1, ok6, SUMO_ERR_INVALID_ARGUMENT},
        {MAGIC, 1, 3, 2, 1, nan6, SUMO_ERR_INVALID_ARGUMENT},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        unsigned char b[72];
        size_t nb = make_state(b, cases[i].magic, cases[i].version, cases[i].n, cases[i].k,
                               cases[i].init, cases[i].m);
        assert_int_equal(nb, 72);
        assert_int_equal(sumo_aggregator_state_load(a3, b, nb), cases[i].want);
    }
    /* A rejected load leaves the state as it was (the last good load). */
    unsigned char after[72], want[72];
    make_state(want, MAGIC, 1, 3, 2, 0, ok6);
    assert_int_equal(sumo_aggregator_state_save(a3, after, 72), SUMO_SUCCESS);
    assert_memory_equal(after, want, 72);
    for (int r = 0; r < 2; r++) sumo_aggregator_destroy(all2[r]);
    for (int r = 0; r < 3; r++) sumo_aggregator_destroy(all3[r]);
    for (int r = 0; r < 2; r++) sumo_comm_destroy(c2[r]);
    for (int r = 0; r < 3; r++) sumo_comm_destroy(c3[r]);
}
int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_checkpoint_round_trip),
        cmocka_unit_test(test_state_format),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
