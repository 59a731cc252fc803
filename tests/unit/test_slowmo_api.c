/*
 * SlowMo through the distributed optimizer's OUTER mode (the problem and runner in
 * support/slowmo_run.h, described in test_slowmo.c): (f) bad options and lr 0 at an outer step
 * are refused before anything changes; (g) a checkpoint taken mid outer iteration resumes
 * bit-identically, and a shard is refused by another rank; (h) the extra memory figures.
 *
 * Rank threads only record; the assertions run in the main thread.
 */
#include "support/slowmo_run.h"

/* ---- (f) bad options, lr 0 at an outer step, non-finite slow buffer ---------------------- */

#define NBAD 16

typedef struct bad_run {
    sumo_diloco_options bad[NBAD];
    sumo_buffer_policy bad_buffers[NBAD];
    sumo_result got[MAXR][NBAD];
    int untouched[MAXR][NBAD];
    /* lr 0 / mismatch / non-finite */
    sumo_result lr0[MAXR][3];
    int lr0_unchanged[MAXR];
    float after_retry[MAXR][MAXN];
    float clean[MAXR][MAXN];
    sumo_result mismatch[MAXR];
    sumo_result one_bad[MAXR];
    sumo_result nonfinite[MAXR];
} bad_run;

static sumo_result try_create_with(sumo_comm *comm, sumo_optimizer *opt, size_t n,
                                   const sumo_diloco_options *s, sumo_buffer_policy buffers,
                                   sumo_distributed **out)
{
    sumo_distributed_options o = {.struct_size = sizeof o, .mode = SUMO_UPDATE_OUTER, .outer = *s,
                                  .buffers = buffers};
    return sumo_distributed_create(comm, opt, NULL, n, &o, out);
}

static sumo_result try_create(sumo_comm *comm, sumo_optimizer *opt, size_t n,
                              const sumo_diloco_options *s, sumo_distributed **out)
{
    return try_create_with(comm, opt, n, s, SUMO_BUFFERS_KEEP, out);
}

static void bad_rank(sumo_comm *comm, int rank, int size, void *arg)
{
    (void)size;
    bad_run *b = arg;
    const size_t n = 5;
    sumo_optimizer *opt = make_sgd(n, 0.0);
    if (opt == NULL) return;
    for (int i = 0; i < NBAD; i++) {
        sumo_distributed *sentinel = (sumo_distributed *)&b; /* must stay untouched */
        sumo_distributed *d = sentinel;
        b->got[rank][i] = try_create_with(comm, opt, n, &b->bad[i], b->bad_buffers[i], &d);
        b->untouched[rank][i] = d == sentinel;
        if (d != sentinel) sumo_distributed_destroy(d);
    }
    sumo_diloco_options good = slowmo_options(2, 0, 1.0, 0.5);
    /* Ranks that disagree on alpha: refused everywhere. */
    sumo_diloco_options mine = good;
    mine.lr = rank == 0 ? 1.0 : 0.9;
    sumo_distributed *d = NULL;
    b->mismatch[rank] = try_create(comm, opt, n, &mine, &d);
    if (d) sumo_distributed_destroy(d);
    d = NULL;
    /* One rank with an invalid option: refused everywhere, nobody left waiting. */
    mine = good;
    if (rank == size - 1) mine.momentum = 1.0;
    b->one_bad[rank] = try_create(comm, opt, n, &mine, &d);
    if (d) sumo_distributed_destroy(d);
    d = NULL;

    /* lr 0 on the outer step (the second): refused with nothing changed, then a retry with a
     * real rate gives what a clean run gives. */
    float x[MAXN], g[MAXN];
    for (int pass = 0; pass < 2; pass++) {
        sumo_optimizer *o2 = make_sgd(n, 0.5);
        d = NULL;
        if (o2 == NULL || try_create(comm, o2, n, &good, &d) != SUMO_SUCCESS) {
            sumo_optimizer_destroy(o2);
            b->lr0[rank][0] = SUMO_ERR_INTERNAL;
            break;
        }
        for (size_t j = 0; j < n; j++) x[j] = x_init(j);
        worker_grad(0, rank, x, g, n);
        sumo_result r = sumo_distributed_step(d, x, g, 0.0, NULL); /* inner step: lr 0 is fine */
        if (pass == 0) b->lr0[rank][0] = r;
        if (pass == 0) {
            float before[MAXN];
            memcpy(before, x, n * sizeof *x);
            worker_grad(0, rank, x, g, n);
            int flag = -1;
            b->lr0[rank][1] = sumo_distributed_step(d, x, g, 0.0, &flag);
            b->lr0_unchanged[rank] = memcmp(before, x, n * sizeof *x) == 0 && flag == 0;
        }
        worker_grad(0, rank, x, g, n);
        r = sumo_distributed_step(d, x, g, 0.25, NULL);
        if (pass == 0) b->lr0[rank][2] = r;
        memcpy(pass == 0 ? b->after_retry[rank] : b->clean[rank], x, n * sizeof *x);
        sumo_distributed_destroy(d);
        sumo_optimizer_destroy(o2);
    }

    /* A slow buffer beyond fp32: a real first step, then a tiny rate on the outer step makes
     * (x0 - x) / lr overflow; every rank must be told. */
    d = NULL;
    sumo_optimizer *o3 = make_sgd(n, 0.0);
    if (o3 != NULL && try_create(comm, o3, n, &good, &d) == SUMO_SUCCESS) {
        for (size_t j = 0; j < n; j++) x[j] = x_init(j);
        worker_grad(0, rank, x, g, n);
        sumo_result r = sumo_distributed_step(d, x, g, 1.0, NULL);
        worker_grad(0, rank, x, g, n);
        if (r == SUMO_SUCCESS) r = sumo_distributed_step(d, x, g, 1e-39, NULL);
        b->nonfinite[rank] = r;
    }
    sumo_distributed_destroy(d);
    sumo_optimizer_destroy(o3);
    sumo_optimizer_destroy(opt);
}

static void test_bad_options_and_lr0(void **state)
{
    (void)state;
    bad_run *b = calloc(1, sizeof *b);
    assert_non_null(b);
    const sumo_diloco_options good = slowmo_options(4, 2, 1.0, 0.5);
    for (int i = 0; i < NBAD; i++) b->bad[i] = good;
    b->bad[0].sync_every = 0;
    b->bad[1].sync_every = -3;
    b->bad[2].inner_period = -1;
    b->bad[3].inner_period = 3; /* 4 is not a multiple of 3 */
    b->bad[4].lr = 0.0;
    b->bad[5].lr = -1.0;
    b->bad[6].lr = INFINITY;
    b->bad[7].lr = NAN;
    b->bad[8].momentum = -0.1;
    b->bad[9].momentum = 1.0;
    b->bad[10].momentum = NAN;
    b->bad_buffers[11] = (sumo_buffer_policy)7;
    b->bad[12].memory_efficient = 2;
    b->bad[13].inner_period = 8; /* larger than tau */
    b->bad[14].inner_period = 2;
    b->bad[14].compression = SUMO_COMPRESS_BF16; /* inner averaging needs the plain average */
    b->bad[15].memory_efficient = 1;
    b->bad[15].merge_alpha = 0.5; /* a shard cannot merge what its owner never saw */
    for (int N = 1; N <= 2; N++) {
        memset(b->got, 0, sizeof b->got);
        assert_int_equal(harness_run_threads(N, bad_rank, b), 0);
        for (int r = 0; r < N; r++) {
            for (int i = 0; i < NBAD; i++) {
                if (b->got[r][i] != SUMO_ERR_INVALID_ARGUMENT)
                    fail_msg("N %d rank %d bad option %d: %s", N, r, i,
                             sumo_result_name(b->got[r][i]));
                assert_true(b->untouched[r][i]);
            }
            assert_int_equal(b->mismatch[r], N > 1 ? SUMO_ERR_MISMATCH : SUMO_SUCCESS);
            assert_int_equal(b->one_bad[r], SUMO_ERR_INVALID_ARGUMENT);
            assert_int_equal(b->lr0[r][0], SUMO_SUCCESS);
            assert_int_equal(b->lr0[r][1], SUMO_ERR_INVALID_ARGUMENT);
            assert_true(b->lr0_unchanged[r]);
            assert_int_equal(b->lr0[r][2], SUMO_SUCCESS);
            assert_memory_equal(b->after_retry[r], b->clean[r], 5 * sizeof(float));
            assert_int_equal(b->nonfinite[r], SUMO_ERR_NONFINITE);
        }
    }
    free(b);
    /* SlowMo's presets: the paper's tau 12 and alpha 1, beta 0.5 but for Local SGD, the
     * heavy-ball step, no inner averaging. */
    const sumo_diloco_preset presets[] = {SUMO_DILOCO_PRESET_SLOWMO, SUMO_DILOCO_PRESET_LOCALSGD,
                                          SUMO_DILOCO_PRESET_BMUF};
    for (int k = 0; k < 3; k++) {
        sumo_diloco_options p;
        assert_int_equal(sumo_diloco_options_default(presets[k], &p), SUMO_SUCCESS);
        assert_int_equal(p.outer, SUMO_OUTER_HEAVY_BALL);
        assert_int_equal(p.sync_every, 12);
        assert_true(p.lr == 1.0 && p.momentum == (k == 1 ? 0.0 : 0.5));
        assert_int_equal(p.inner_period, 0);
        assert_int_equal(p.fragments, 1);
    }
}

/* ---- (g) checkpoint mid outer iteration ------------------------------------------------- */

/* Words of the outer loop's checkpoint header (diloco_state.c): what the corruptions hit. */
#define HDR_RANK 14
#define HDR_PENDING 17

#define G_STEPS 14
#define G_SAVE 6 /* after 6 steps: 2 into the second outer iteration of tau 4 */

typedef struct ckpt_run {
    int efficient;
    size_t n;
    float straight[MAXR][G_STEPS][MAXN];
    float resumed[MAXR][G_STEPS][MAXN];
    sumo_result err[MAXR];
    sumo_result bad_loads[MAXR][5];
    int synchronized_after_load[MAXR];
} ckpt_run;

static sumo_result make_pair(sumo_comm *comm, const ckpt_run *c, sumo_optimizer **opt,
                             sumo_distributed **dist)
{
    sumo_diloco_options s = slowmo_options(4, 2, 0.9, 0.6);
    s.memory_efficient = c->efficient;
    *opt = make_sgd(c->n, 0.7);
    *dist = NULL;
    if (*opt == NULL) return SUMO_ERR_SYSTEM;
    return try_create(comm, *opt, c->n, &s, dist);
}

static double ckpt_lr(int t) { return 0.2 + 0.01 * t; }

static void ckpt_rank(sumo_comm *comm, int rank, int size, void *arg)
{
    (void)size;
    ckpt_run *c = arg;
    const size_t n = c->n;
    float x[MAXN], g[MAXN];
    sumo_optimizer *opt;
    sumo_distributed *dist;
    sumo_result r = make_pair(comm, c, &opt, &dist);
    for (size_t j = 0; j < n; j++) x[j] = x_init(j);
    for (int t = 0; r == SUMO_SUCCESS && t < G_STEPS; t++) {
        worker_grad(0, rank, x, g, n);
        r = sumo_distributed_step(dist, x, g, ckpt_lr(t), NULL);
        memcpy(c->straight[rank][t], x, n * sizeof *x);
    }
    sumo_distributed_destroy(dist);
    sumo_optimizer_destroy(opt);

    /* Again, saving after G_SAVE steps, destroying everything, and resuming in new handles. */
    void *dstate = NULL, *ostate = NULL;
    size_t dbytes = 0, obytes = 0;
    if (r == SUMO_SUCCESS) r = make_pair(comm, c, &opt, &dist);
    for (size_t j = 0; j < n; j++) x[j] = x_init(j);
    for (int t = 0; r == SUMO_SUCCESS && t < G_SAVE; t++) {
        worker_grad(0, rank, x, g, n);
        r = sumo_distributed_step(dist, x, g, ckpt_lr(t), NULL);
        memcpy(c->resumed[rank][t], x, n * sizeof *x);
    }
    if (r == SUMO_SUCCESS) r = sumo_distributed_state_size(dist, &dbytes);
    if (r == SUMO_SUCCESS) r = sumo_optimizer_state_size(opt, &obytes);
    if (r == SUMO_SUCCESS) {
        dstate = malloc(dbytes);
        ostate = malloc(obytes);
        if (!dstate || !ostate) r = SUMO_ERR_SYSTEM;
    }
    if (r == SUMO_SUCCESS) r = sumo_distributed_state_save(dist, dstate, dbytes);
    if (r == SUMO_SUCCESS) r = sumo_optimizer_state_save(opt, ostate, obytes);
    sumo_distributed_destroy(dist);
    sumo_optimizer_destroy(opt);
    dist = NULL;
    opt = NULL;
    for (size_t j = 0; j < n; j++) x[j] = 1e6f; /* the resumed run must not see old values */
    if (r == SUMO_SUCCESS) r = make_pair(comm, c, &opt, &dist);
    if (r == SUMO_SUCCESS) {
        /* Corrupt states are refused and change nothing (the good load below still works). */
        unsigned char *bad = malloc(dbytes);
        if (bad == NULL) r = SUMO_ERR_SYSTEM;
        for (int k = 0; bad && k < 5; k++) {
            memcpy(bad, dstate, dbytes);
            size_t len = dbytes;
            uint64_t w;
            switch (k) {
            case 0: bad[0] ^= 1; break;                                      /* magic */
            case 1: w = 5; memcpy(bad + HDR_PENDING * 8, &w, 8); break;      /* fragment */
            case 2: len = dbytes - 1; break;                                 /* size */
            case 3: { float nan = NAN; memcpy(bad + dbytes - 4, &nan, 4); break; }
            case 4: w = 1000; memcpy(bad + 2 * 8, &w, 8); break;             /* n */
            }
            c->bad_loads[rank][k] = sumo_distributed_state_load(dist, bad, len);
        }
        free(bad);
    }
    if (r == SUMO_SUCCESS) r = sumo_distributed_state_load(dist, dstate, dbytes);
    if (r == SUMO_SUCCESS) r = sumo_optimizer_state_load(opt, ostate, obytes);
    if (r == SUMO_SUCCESS) {
        int s = -1;
        sumo_distributed_synchronized(dist, &s);
        c->synchronized_after_load[rank] = s;
    }
    if (r == SUMO_SUCCESS) memcpy(x, c->resumed[rank][G_SAVE - 1], n * sizeof *x);
    for (int t = G_SAVE; r == SUMO_SUCCESS && t < G_STEPS; t++) {
        worker_grad(0, rank, x, g, n);
        r = sumo_distributed_step(dist, x, g, ckpt_lr(t), NULL);
        memcpy(c->resumed[rank][t], x, n * sizeof *x);
    }
    sumo_distributed_destroy(dist);
    sumo_optimizer_destroy(opt);
    free(dstate);
    free(ostate);
    c->err[rank] = r;
}

static void test_checkpoint_resume(void **state)
{
    (void)state;
    for (int eff = 0; eff <= 1; eff++) {
        for (int N = 1; N <= 3; N++) {
            ckpt_run *c = calloc(1, sizeof *c);
            assert_non_null(c);
            c->efficient = eff;
            c->n = 11;
            assert_int_equal(harness_run_threads(N, ckpt_rank, c), 0);
            for (int r = 0; r < N; r++) {
                if (c->err[r] != SUMO_SUCCESS)
                    fail_msg("eff %d N %d rank %d: %s", eff, N, r, sumo_result_name(c->err[r]));
                for (int k = 0; k < 5; k++)
                    assert_int_equal(c->bad_loads[r][k], SUMO_ERR_INVALID_ARGUMENT);
                /* Saved 2 steps into the iteration, right after an inner average. */
                assert_int_equal(c->synchronized_after_load[r], 1);
                assert_memory_equal(c->straight[r], c->resumed[r], sizeof c->straight[r]);
            }
            free(c);
        }
    }
}

/* A memory-efficient shard belongs to its rank: loading another rank's is refused. */
typedef struct swap_run {
    sumo_result load_other[MAXR];
} swap_run;

static void swap_rank(sumo_comm *comm, int rank, int size, void *arg)
{
    swap_run *s = arg;
    ckpt_run c = {.efficient = 1, .n = 10};
    sumo_optimizer *opt;
    sumo_distributed *dist;
    s->load_other[rank] = SUMO_ERR_INTERNAL;
    if (make_pair(comm, &c, &opt, &dist) != SUMO_SUCCESS) return;
    size_t bytes = 0;
    sumo_distributed_state_size(dist, &bytes);
    unsigned char *buf = malloc(bytes);
    if (buf && sumo_distributed_state_save(dist, buf, bytes) == SUMO_SUCCESS) {
        uint64_t other = (uint64_t)((rank + 1) % size);
        memcpy(buf + HDR_RANK * 8, &other, 8);
        s->load_other[rank] = sumo_distributed_state_load(dist, buf, bytes);
    }
    free(buf);
    sumo_distributed_destroy(dist);
    sumo_optimizer_destroy(opt);
}

static void test_checkpoint_wrong_rank(void **state)
{
    (void)state;
    swap_run s;
    assert_int_equal(harness_run_threads(2, swap_rank, &s), 0);
    assert_int_equal(s.load_other[0], SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(s.load_other[1], SUMO_ERR_INVALID_ARGUMENT);
}

/* ---- (h) extra memory -------------------------------------------------------------------- */

typedef struct mem_run {
    size_t n;
    int efficient;
    size_t extra[MAXR];
    size_t state[MAXR];
    sumo_result err[MAXR];
} mem_run;

static void mem_rank(sumo_comm *comm, int rank, int size, void *arg)
{
    (void)size;
    mem_run *m = arg;
    sumo_optimizer *opt = make_sgd(m->n, 0.9);
    sumo_distributed *dist = NULL;
    sumo_diloco_options s;
    sumo_diloco_options_default(SUMO_DILOCO_PRESET_SLOWMO, &s);
    s.memory_efficient = m->efficient;
    sumo_result r = opt ? try_create(comm, opt, m->n, &s, &dist) : SUMO_ERR_SYSTEM;
    if (r == SUMO_SUCCESS) r = sumo_distributed_extra_memory(dist, &m->extra[rank]);
    if (r == SUMO_SUCCESS) r = sumo_distributed_state_size(dist, &m->state[rank]);
    m->err[rank] = r;
    sumo_distributed_destroy(dist);
    sumo_optimizer_destroy(opt);
}

static void test_extra_memory(void **state)
{
    (void)state;
    const size_t ns[] = {100000, 100003};
    const int N = 8;
    for (size_t k = 0; k < 2; k++) {
        mem_run plain = {.n = ns[k]}, eff = {.n = ns[k], .efficient = 1};
        assert_int_equal(harness_run_threads(N, mem_rank, &plain), 0);
        assert_int_equal(harness_run_threads(N, mem_rank, &eff), 0);
        size_t n = ns[k], s = n / N, t = n % N;
        for (int r = 0; r < N; r++) {
            assert_int_equal(plain.err[r], SUMO_SUCCESS);
            assert_int_equal(eff.err[r], SUMO_SUCCESS);
            assert_int_equal(plain.extra[r], 2 * n * sizeof(float));
            assert_int_equal(eff.extra[r], 2 * (s + t) * sizeof(float));
        }
        printf("slowmo extra memory, n %zu (%zu bytes of fp32 parameters), N %d: plain %zu "
               "bytes (%.2fx the model), memory-efficient %zu bytes (%.3fx); checkpoint %zu / "
               "%zu bytes per rank\n",
               n, n * sizeof(float), N, plain.extra[0],
               (double)plain.extra[0] / (double)(n * sizeof(float)), eff.extra[0],
               (double)eff.extra[0] / (double)(n * sizeof(float)), plain.state[0],
               eff.state[0]);
    }
}


int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_options_and_lr0),
        cmocka_unit_test(test_checkpoint_resume),
        cmocka_unit_test(test_checkpoint_wrong_rank),
        cmocka_unit_test(test_extra_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
