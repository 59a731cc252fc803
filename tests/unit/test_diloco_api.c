/*
 * sumo_diloco's interface on the threads transport (the reference and the problem in
 * diloco_reference.h, described in test_diloco.c): checkpoints taken mid schedule, the
 * schedule as a caller sees it (due, fragments), refusals by name, ranks that disagree, NaN
 * reported on every rank alike, and an exchange that overlaps local steps.
 *
 * Rank threads only record; assertions run in the main thread.
 */
#include "support/diloco_reference.h"

/* ---- checkpoints ------------------------------------------------------------------------------ */

static void test_resume_mid_schedule(void **state)
{
    (void)state;
    const cfg shapes[] = {
        {.P = 3, .H = 12, .F = 3, .delay = 2, .merge = 0.5, .outer = SUMO_OUTER_NESTEROV, .lr = 0.7,
         .mu = 0.9, .comp = SUMO_COMPRESS_FP8_E4M3, .block = 8, .steps = 30},
        {.P = 4, .H = 8, .F = 2, .delay = 3, .merge = 0.0, .outer = SUMO_OUTER_HEAVY_BALL, .lr = 1.0,
         .mu = 0.5, .steps = 30, .strided = 1},
        {.P = 2, .H = 6, .F = 2, .delay = 1, .merge = 0.25, .outer = SUMO_OUTER_NESTEROV, .lr = 0.7,
         .mu = 0.9, .combine = SUMO_COMBINE_ACGA, .steps = 20},
        {.P = 5, .H = 6, .F = 1, .delay = 0, .outer = SUMO_OUTER_NESTEROV, .lr = 0.7, .mu = 0.9,
         .combine = SUMO_COMBINE_ADASUM, .steps = 20},
    };
    for (size_t q = 0; q < sizeof shapes / sizeof shapes[0]; q++) {
        const cfg *c = &shapes[q];
        run *whole = run_lib(c, 0);
        /* Every stopping point, those with an exchange in flight among them. */
        for (int at = 1; at < c->steps; at++) {
            run *parts = run_lib(c, at);
            for (int r = 0; r < c->P; r++)
                if (memcmp(whole->trace[r], parts->trace[r], sizeof whole->trace[r]) != 0)
                    fail_msg("shape %zu: resumed after step %d, rank %d differs from the run without a "
                             "stop", q, at, r);
            free(parts);
        }
        free(whole);
    }
}

/* ---- the schedule as the caller sees it --------------------------------------------------- */

static void test_due_and_ranks(void **state)
{
    (void)state;
    cfg c = {.P = 3, .H = 8, .F = 4, .delay = 2, .merge = 0.0, .outer = SUMO_OUTER_NESTEROV, .lr = 0.7,
             .mu = 0.9, .steps = 20};
    run *L = run_lib(&c, 0);
    ref R;
    ref_init(&R, &c, true);
    for (int k = 1; k <= c.steps; k++) {
        bool apply = R.pending >= 0 && R.apply_at == k;
        bool start = ref_starting(&R, k) >= 0;
        ref_local(&R, k);
        ref_end(&R, k);
        for (int r = 0; r < c.P; r++) {
            assert_int_equal(L->due[r][k], (apply ? SUMO_DILOCO_APPLY : 0) | (start ? SUMO_DILOCO_START : 0));
            assert_int_equal(L->communicated[r][k], apply || start);
        }
    }
    free(L);
    /* With merge 0 and one fragment every rank holds the same parameters after each apply. */
    cfg one = {.P = 4, .H = 5, .F = 1, .delay = 2, .outer = SUMO_OUTER_NESTEROV, .lr = 0.7, .mu = 0.9,
               .comp = SUMO_COMPRESS_E3M0, .block = 8, .steps = 19};
    L = run_lib(&one, 0);
    for (int k = 7; k <= one.steps; k += 5)
        for (int r = 1; r < one.P; r++) assert_memory_equal(L->trace[r][k], L->trace[0][k], sizeof L->trace[0][k]);
    free(L);
}

static void test_fragments(void **state)
{
    (void)state;
    sumo_comm *comm;
    assert_int_equal(sumo_comm_create_threads(1, &comm), SUMO_SUCCESS);
    for (int F = 1; F <= 4; F++)
        for (int strided = 0; strided <= 1; strided++) {
            cfg c = {.P = 1, .H = 8, .F = F, .lr = 0.7, .mu = 0.9, .strided = strided};
            int fo[NT], tf[NT];
            sumo_diloco_options o = options_of(&c, fo);
            sumo_diloco *d;
            assert_int_equal(sumo_diloco_create(comm, LAYOUT, NT, N, SUMO_FLOAT32, &o, &d), SUMO_SUCCESS);
            ref_split(&c, tf);
            size_t total = 0;
            for (int f = 0; f < F; f++) {
                size_t count, nruns, off[NT], len[NT];
                assert_int_equal(sumo_diloco_fragment(d, f, &count, &nruns), SUMO_SUCCESS);
                assert_int_equal(sumo_diloco_fragment_runs(d, f, off, len, nruns), SUMO_SUCCESS);
                /* The runs are the fragment's non-empty tensors, adjacent ones joined (an
                 * empty tensor of another fragment between them does not separate them). */
                size_t want = 0, pos = 0, wo[NT], wl[NT], wn = 0;
                for (size_t t = 0; t < NT; pos += LAYOUT[t], t++) {
                    if (tf[t] != f || LAYOUT[t] == 0) continue;
                    want += LAYOUT[t];
                    if (wn > 0 && wo[wn - 1] + wl[wn - 1] == pos) {
                        wl[wn - 1] += LAYOUT[t];
                    } else {
                        wo[wn] = pos;
                        wl[wn++] = LAYOUT[t];
                    }
                }
                assert_int_equal(nruns, wn);
                assert_memory_equal(off, wo, wn * sizeof *wo);
                assert_memory_equal(len, wl, wn * sizeof *wl);
                assert_int_equal(count, want);
                total += count;
            }
            assert_int_equal(total, N);
            sumo_diloco_destroy(d);
        }
    /* The cut is at ceil((f + 1) n / F): with {13, 1, 13} and F = 2, 13 < 14 and the first
     * fragment takes the second tensor too. */
    const size_t three[] = {13, 1, 13};
    sumo_diloco_options o;
    sumo_diloco_options_default(SUMO_DILOCO_PRESET_DILOCO, &o);
    o.sync_every = 4;
    o.fragments = 2;
    sumo_diloco *d;
    assert_int_equal(sumo_diloco_create(comm, three, 3, 27, SUMO_FLOAT32, &o, &d), SUMO_SUCCESS);
    size_t count = 0;
    assert_int_equal(sumo_diloco_fragment(d, 0, &count, NULL), SUMO_SUCCESS);
    assert_int_equal(count, 14);
    sumo_diloco_destroy(d);
    sumo_comm_destroy(comm);
}

/* ---- refusals ------------------------------------------------------------------------------ */

static sumo_result create_one(sumo_comm *comm, const sumo_diloco_options *o, sumo_dtype dt,
                              const char **msg)
{
    sumo_diloco *d = NULL;
    sumo_result r = sumo_diloco_create(comm, LAYOUT, NT, N, dt, o, &d);
    sumo_diloco_destroy(d);
    sumo_comm_error_message(comm, msg);
    return r;
}

static void test_refused(void **state)
{
    (void)state;
    sumo_comm *comm;
    assert_int_equal(sumo_comm_create_threads(1, &comm), SUMO_SUCCESS);
    /* Bindings that mirror the options structs by hand check their layout through this. */
    size_t sz = 0;
    assert_int_equal(sumo_struct_size("sumo_diloco_options", &sz), SUMO_SUCCESS);
    assert_int_equal(sz, sizeof(sumo_diloco_options));
    assert_int_equal(sumo_struct_size("sumo_compression", &sz), SUMO_SUCCESS);
    assert_int_equal(sz, sizeof(sumo_compression));
    sumo_diloco_options base;
    assert_int_equal(sumo_diloco_options_default((sumo_diloco_preset)9, &base), SUMO_ERR_INVALID_ARGUMENT);
    sumo_diloco_options_default(SUMO_DILOCO_PRESET_DILOCO, &base);
    base.sync_every = 8;
    const char *m = "";
    sumo_diloco_options o;
#define REFUSED(word, dt, ...)                                                              \
    do {                                                                                    \
        o = base;                                                                           \
        __VA_ARGS__;                                                                        \
        assert_int_equal(create_one(comm, &o, dt, &m), SUMO_ERR_INVALID_ARGUMENT);          \
        if (strstr(m, word) == NULL) fail_msg("message '%s' does not name '%s'", m, word);  \
    } while (0)
    REFUSED("sync_every", SUMO_FLOAT32, o.sync_every = 0);
    REFUSED("fragments", SUMO_FLOAT32, o.fragments = 9);
    REFUSED("fragments", SUMO_FLOAT32, o.fragments = 0);
    REFUSED("delay", SUMO_FLOAT32, o.fragments = 2, o.delay = 5);
    REFUSED("delay", SUMO_FLOAT32, o.delay = -1);
    REFUSED("merge_alpha", SUMO_FLOAT32, o.merge_alpha = 1.5);
    REFUSED("lr", SUMO_FLOAT32, o.lr = 0);
    REFUSED("momentum", SUMO_FLOAT32, o.momentum = 1);
    REFUSED("outer", SUMO_FLOAT32, o.outer = (sumo_outer_optimizer)7);
    REFUSED("combine", SUMO_FLOAT32, o.combine = (sumo_outer_combine)9);
    REFUSED("compression", SUMO_FLOAT32, o.compression = (sumo_compression_format)9);
    REFUSED("block_size", SUMO_FLOAT32, o.compression = SUMO_COMPRESS_E3M0, o.block_size = 12);
    REFUSED("average combine", SUMO_FLOAT32, o.compression = SUMO_COMPRESS_E3M0, o.combine = SUMO_COMBINE_ADASUM);
    REFUSED("fp32", SUMO_FLOAT64, o.compression = SUMO_COMPRESS_BF16);
    REFUSED("struct_size", SUMO_FLOAT32, o.struct_size = 8);
    int bad_split[NT] = {0, 1, 2, 0, 0, 0, 0};
    REFUSED("fragment_of", SUMO_FLOAT32, o.fragments = 2, o.fragment_of = bad_split);
    int empty_split[NT] = {0, 0, 1, 0, 0, 0, 0}; /* fragment 1: only the empty tensor */
    REFUSED("no elements", SUMO_FLOAT32, o.fragments = 2, o.fragment_of = empty_split);
    REFUSED("SUMO_SPLIT_TENSORS", SUMO_FLOAT32, o.split = SUMO_SPLIT_RANGES, o.fragments = 2, o.fragment_of = bad_split);
    REFUSED("split", SUMO_FLOAT32, o.split = (sumo_fragment_split)5);
    REFUSED("number of parameters", SUMO_FLOAT32, o.split = SUMO_SPLIT_RANGES, o.sync_every = 40, o.fragments = 28);
    REFUSED("inner_period", SUMO_FLOAT32, o.inner_period = -1);
    REFUSED("inner_period", SUMO_FLOAT32, o.inner_period = 3); /* H 8 is not a multiple */
    REFUSED("inner_period", SUMO_FLOAT32, o.inner_period = 2, o.fragments = 2);
    REFUSED("inner_period", SUMO_FLOAT32, o.inner_period = 2, o.compression = SUMO_COMPRESS_BF16);
    REFUSED("memory_efficient", SUMO_FLOAT32, o.memory_efficient = 2);
    REFUSED("memory_efficient", SUMO_FLOAT32, o.memory_efficient = 1, o.merge_alpha = 0.5);
    REFUSED("memory_efficient", SUMO_FLOAT32, o.memory_efficient = 1, o.delay = 1);
    REFUSED("memory_efficient", SUMO_FLOAT32, o.memory_efficient = 1, o.combine = SUMO_COMBINE_ADASUM);
    /* A wrong layout, and the calls' own checks. */
    size_t wrong[NT];
    memcpy(wrong, LAYOUT, sizeof wrong);
    wrong[0]++;
    sumo_diloco *d = NULL;
    assert_int_equal(sumo_diloco_create(comm, wrong, NT, N, SUMO_FLOAT32, &base, &d), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_diloco_create(comm, NULL, 0, N, SUMO_FLOAT32, &base, &d), SUMO_SUCCESS);
    float x[N] = {0};
    assert_int_equal(sumo_diloco_end(d, x, 0.1, NULL), SUMO_ERR_INVALID_USAGE); /* before begin */
    assert_int_equal(sumo_diloco_begin(d, x), SUMO_SUCCESS);
    assert_int_equal(sumo_diloco_end(d, x, NAN, NULL), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_diloco_end(d, x, -1, NULL), SUMO_ERR_INVALID_ARGUMENT);
    sumo_diloco_destroy(d);
    /* Heavy ball at lr 0 where an exchange starts: refused, nothing counted. */
    o = base;
    o.outer = SUMO_OUTER_HEAVY_BALL;
    o.sync_every = 2;
    assert_int_equal(sumo_diloco_create(comm, LAYOUT, NT, N, SUMO_FLOAT32, &o, &d), SUMO_SUCCESS);
    assert_int_equal(sumo_diloco_begin(d, x), SUMO_SUCCESS);
    assert_int_equal(sumo_diloco_end(d, x, 0.0, NULL), SUMO_SUCCESS); /* step 1: local */
    assert_int_equal(sumo_diloco_end(d, x, 0.0, NULL), SUMO_ERR_INVALID_ARGUMENT);
    int what;
    assert_int_equal(sumo_diloco_due(d, &what, NULL, NULL), SUMO_SUCCESS);
    assert_int_equal(what, SUMO_DILOCO_APPLY | SUMO_DILOCO_START); /* still due */
    /* A state of another shape is refused. */
    size_t bytes;
    assert_int_equal(sumo_diloco_state_size(d, &bytes), SUMO_SUCCESS);
    void *buf = malloc(bytes);
    assert_int_equal(sumo_diloco_state_save(d, buf, bytes), SUMO_SUCCESS);
    sumo_diloco_destroy(d);
    o.sync_every = 4;
    assert_int_equal(sumo_diloco_create(comm, LAYOUT, NT, N, SUMO_FLOAT32, &o, &d), SUMO_SUCCESS);
    assert_int_equal(sumo_diloco_state_load(d, buf, bytes), SUMO_ERR_INVALID_ARGUMENT);
    ((unsigned char *)buf)[0] ^= 1;
    assert_int_equal(sumo_diloco_state_load(d, buf, bytes), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_diloco_state_load(d, buf, bytes - 1), SUMO_ERR_INVALID_ARGUMENT);
    free(buf);
    sumo_diloco_destroy(d);
    sumo_comm_destroy(comm);
}

/* Ranks configured differently all fail at create, alike. */
typedef struct mismatch {
    sumo_result res[3];
} mismatch;

static void mismatch_rank(sumo_comm *comm, int rank, int size, void *arg)
{
    (void)size;
    mismatch *M = arg;
    sumo_diloco_options o;
    sumo_diloco_options_default(SUMO_DILOCO_PRESET_STREAMING, &o);
    o.sync_every = 8;
    if (rank == 2) o.delay = 2;
    sumo_diloco *d = NULL;
    M->res[rank] = sumo_diloco_create(comm, LAYOUT, NT, N, SUMO_FLOAT32, &o, &d);
    sumo_diloco_destroy(d);
}

static void test_mismatch(void **state)
{
    (void)state;
    mismatch M;
    assert_int_equal(harness_run_threads(3, mismatch_rank, &M), 0);
    for (int r = 0; r < 3; r++) assert_int_equal(M.res[r], SUMO_ERR_MISMATCH);
}

/* ---- NaN ---------------------------------------------------------------------------------- */

typedef struct nan_run {
    sumo_compression_format comp;
    sumo_result res[3];
} nan_run;

static void nan_rank(sumo_comm *comm, int rank, int size, void *arg)
{
    (void)size;
    nan_run *R = arg;
    sumo_diloco_options o;
    sumo_diloco_options_default(SUMO_DILOCO_PRESET_DILOCO, &o);
    o.sync_every = 3;
    o.compression = R->comp;
    sumo_diloco *d = NULL;
    sumo_result r = sumo_diloco_create(comm, LAYOUT, NT, N, SUMO_FLOAT32, &o, &d);
    float x[N];
    for (size_t j = 0; j < N; j++) x[j] = (float)x_init(j);
    for (int k = 1; r == SUMO_SUCCESS && k <= 6; k++) {
        r = sumo_diloco_begin(d, x);
        local_step_f(rank, x, lr_at(k));
        if (k == 5 && rank == 1) x[4] = NAN; /* a diverged local step before the second sync */
        if (r == SUMO_SUCCESS) r = sumo_diloco_end(d, x, lr_at(k), NULL);
    }
    R->res[rank] = r;
    sumo_diloco_destroy(d);
}

static void test_nonfinite(void **state)
{
    (void)state;
    const sumo_compression_format comps[] = {SUMO_COMPRESS_NONE, SUMO_COMPRESS_E3M0};
    for (int q = 0; q < 2; q++) {
        nan_run R = {.comp = comps[q]};
        assert_int_equal(harness_run_threads(3, nan_rank, &R), 0);
        for (int r = 0; r < 3; r++) assert_int_equal(R.res[r], SUMO_ERR_NONFINITE);
    }
}

/* ---- overlap ---------------------------------------------------------------------------------- */

typedef struct overlap {
    int delay;
    double start_end_s; /* rank 0: the end that starts the exchange */
    double apply_end_s; /* rank 0: the end that applies it */
    sumo_result res[2];
} overlap;

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void overlap_rank(sumo_comm *comm, int rank, int size, void *arg)
{
    (void)size;
    overlap *O = arg;
    sumo_diloco_options o;
    sumo_diloco_options_default(SUMO_DILOCO_PRESET_DILOCO, &o);
    o.sync_every = 4;
    o.delay = O->delay;
    sumo_diloco *d = NULL;
    sumo_result r = sumo_diloco_create(comm, LAYOUT, NT, N, SUMO_FLOAT32, &o, &d);
    float x[N];
    for (size_t j = 0; j < N; j++) x[j] = (float)x_init(j);
    for (int k = 1; r == SUMO_SUCCESS && k <= 4 + O->delay; k++) {
        r = sumo_diloco_begin(d, x);
        local_step_f(rank, x, lr_at(k));
        /* Rank 1 is late to the exchange by 300 ms. */
        if (rank == 1 && k == 4) {
            struct timespec ts = {0, 300 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
        double t0 = now_s();
        if (r == SUMO_SUCCESS) r = sumo_diloco_end(d, x, lr_at(k), NULL);
        if (rank == 0 && k == 4) O->start_end_s = now_s() - t0;
        if (rank == 0 && k == 4 + O->delay) O->apply_end_s = now_s() - t0;
    }
    O->res[rank] = r;
    sumo_diloco_destroy(d);
}

static void test_overlap(void **state)
{
    (void)state;
    /* delay 2: the end that starts the exchange returns at once, the late peer is waited for
     * only when the result is due; delay 0: the start blocks. */
    overlap O = {.delay = 2};
    assert_int_equal(harness_run_threads(2, overlap_rank, &O), 0);
    assert_int_equal(O.res[0], SUMO_SUCCESS);
    assert_int_equal(O.res[1], SUMO_SUCCESS);
    if (!(O.start_end_s < 0.1)) fail_msg("the starting end waited %.3f s for the late peer", O.start_end_s);
    assert_true(O.apply_end_s > 0.1);
    overlap B = {.delay = 0};
    assert_int_equal(harness_run_threads(2, overlap_rank, &B), 0);
    assert_true(B.start_end_s > 0.2);
}


int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resume_mid_schedule),
        cmocka_unit_test(test_due_and_ranks),
        cmocka_unit_test(test_fragments),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_mismatch),
        cmocka_unit_test(test_nonfinite),
        cmocka_unit_test(test_overlap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
