/*
 * sumo_mem_alloc / sumo_mem_free on the threads transport, where the memory is plain (the
 * peers already reach each other's buffers): allocation is agreed like a collective, the
 * buffers work in collectives, bad calls fail on every rank and leave the handle usable, and
 * what is not freed goes with the handle (ASan's leak check sees the rest). The shared-window
 * path is tests/mpi/test_mem_mpi.c.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "support/harness.h"

#include <string.h>

#define RANKS 3
#define COUNT 4099

typedef struct seen {
    sumo_result alloc, sum, zero, huge, foreign, mismatch, after, freed;
    bool aligned, exact, zero_null, huge_null;
} seen;

static void rank_main(sumo_comm *comm, int rank, int size, void *arg)
{
    seen *s = &((seen *)arg)[rank];
    float *a = NULL, *b = NULL;
    s->alloc = sumo_mem_alloc(comm, COUNT * sizeof(float) + (size_t)rank * 100, (void **)&a);
    if (s->alloc == SUMO_SUCCESS) s->alloc = sumo_mem_alloc(comm, 64, (void **)&b);
    if (s->alloc != SUMO_SUCCESS) return;
    s->aligned = ((uintptr_t)a & 4095) == 0 && ((uintptr_t)b & 4095) == 0;
    for (size_t i = 0; i < COUNT; i++) a[i] = (float)((int)(i % 11) - 5 + rank);
    s->sum = sumo_allreduce(a, a, COUNT, SUMO_FLOAT32, SUMO_OP_SUM, comm);
    s->exact = true;
    for (size_t i = 0; i < COUNT; i++) {
        /* sum over ranks of (i % 11 - 5 + r) */
        float want = (float)(size * ((int)(i % 11) - 5) + size * (size - 1) / 2);
        s->exact = s->exact && a[i] == want;
    }
    void *z = (void *)&s;
    s->zero = sumo_mem_alloc(comm, rank == 1 ? 0 : 8, &z);
    s->zero_null = z == NULL;
    /* A size whose rounding to whole pages would wrap to a small allocation. */
    void *h = (void *)&s;
    s->huge = sumo_mem_alloc(comm, rank == 0 ? SIZE_MAX - 10 : 8, &h);
    s->huge_null = h == NULL;
    int local;
    s->foreign = sumo_mem_free(comm, rank == 2 ? (void *)&local : (void *)b);
    s->mismatch = sumo_mem_free(comm, rank == 0 ? (void *)a : (void *)b);
    s->after = sumo_allreduce(a, a, 1, SUMO_FLOAT32, SUMO_OP_SUM, comm);
    s->freed = sumo_mem_free(comm, b);
    /* a goes with the handle. */
}

static void test_mem_on_threads(void **state)
{
    (void)state;
    seen s[RANKS];
    memset(s, 0, sizeof s);
    assert_int_equal(harness_run_threads(RANKS, rank_main, s), 0);
    for (int r = 0; r < RANKS; r++) {
        assert_int_equal(s[r].alloc, SUMO_SUCCESS);
        assert_true(s[r].aligned);
        assert_int_equal(s[r].sum, SUMO_SUCCESS);
        assert_true(s[r].exact);
        assert_int_equal(s[r].zero, SUMO_ERR_INVALID_ARGUMENT);
        assert_true(s[r].zero_null);
        assert_int_equal(s[r].huge, SUMO_ERR_SYSTEM);
        assert_true(s[r].huge_null);
        assert_int_equal(s[r].foreign, SUMO_ERR_INVALID_ARGUMENT);
        assert_int_equal(s[r].mismatch, SUMO_ERR_MISMATCH);
        assert_int_equal(s[r].after, SUMO_SUCCESS);
        assert_int_equal(s[r].freed, SUMO_SUCCESS);
    }
}

static void test_mem_bad_arguments(void **state)
{
    (void)state;
    void *p;
    assert_int_equal(sumo_mem_alloc(NULL, 8, &p), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_mem_free(NULL, p), SUMO_ERR_INVALID_ARGUMENT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mem_on_threads),
        cmocka_unit_test(test_mem_bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
