/*
 * DiLoCo and Streaming DiLoCo (sumo_diloco.h) on the threads transport, with the local steps
 * taken by the test (as a binding's optimizer would): every worker minimises its own separable
 * quadratic f_r(x) = sum_j a_rj (x_j - c_rj)^2 / 2 by plain gradient steps.
 *
 * The reference is written here from the papers' description (docs/design/diloco.md), not
 * from the library: fragments of whole tensors (contiguous, or the caller's split), fragment f
 * exchanged at the ends of steps floor((f+1) H / F) + j H, its result used `delay` steps
 * later, the outer step from the anchor (Nesterov: v = mu v + D, g = x0 - lr (D + mu v); heavy
 * ball: u = beta u + D / gamma, g = x0 - alpha gamma u), the new anchor g and the local
 * fragment merge x + (1 - merge) g. It runs in two precisions:
 *   EXACT  everything in double, the combine exact (the mean, or Adasum's tree and ACGA's step
 *          from support/reference.c): the paper's algorithm; the library must stay within
 *          TOL of it (below);
 *   DOC    the precision sumo documents: parameters, anchors and momenta stored in the dtype,
 *          the average summed in rank order in it and divided once, the outer step per element
 *          in double from the stored values and rounded once (sumo_ext.h), outer gradients
 *          x0 - x rounded once and, compressed, through the codec as sumo.h defines it
 *          (support/reference.c's enumeration, fp32 sums in rank order): the library must
 *          equal it bit for bit. Every double operation on two stored fp32 values rounded
 *          to fp32 is fp32's own operation (53 >= 2 * 24 + 2 bits: no double rounding).
 *
 * TOL (EXACT against fp32): 2e-4 max(1, |x|). An allowance, derived loosely: about 10
 * roundings of 2^-24 per element and step over at most 40 steps, amplified at most about 20
 * times by the outer momentum (lr (1 + mu) / (1 - mu) with lr 0.7, mu 0.9 is 13). The DOC
 * comparison is the exact one; EXACT checks that the documented arithmetic is the paper's.
 *
 * Oracles of diloco.md: outer lr 1, momentum 0 == Local SGD (the rank-order fp32 average every
 * H steps) bit for bit; the sharded state and the split into ranges of the flat vector keep
 * the reference's bits (SlowMo's own oracles are in test_slowmo.c).
 * Properties: every rank identical where the method makes them so; a checkpoint taken in the
 * middle of a fragment schedule, with an exchange in flight, resumes bit for bit; bad options
 * refused by name; NaN reported on every rank alike; an exchange overlaps local steps (a rank
 * that starts one does not wait for a late peer until the result is due).
 *
 * Rank threads only record; assertions run in the main thread.
 */
#include "support/diloco_reference.h"

/* ---- the reference, every shape ------------------------------------------------------------- */

static void test_reference_average(void **state)
{
    (void)state;
    for (int P = 1; P <= MAXP; P++)
        for (int F = 1; F <= 4; F++)
            for (int delay = 0; delay <= 3; delay++) {
                int H = F <= 2 ? 8 : 12; /* delay <= H / F */
                if (delay > H / F) continue;
                cfg c = {.P = P, .H = H, .F = F, .delay = delay, .merge = (P + F + delay) % 3 == 0 ? 0.0 : 0.3,
                         .outer = (P + delay) % 2 ? SUMO_OUTER_NESTEROV : SUMO_OUTER_HEAVY_BALL,
                         .lr = 0.7, .mu = 0.9, .strided = F > 1 && delay == 1,
                         .ranges = F > 1 && delay != 1 && (P + F) % 2 == 0,
                         .steps = 2 * H + H / 2 + delay + 1};
                if (c.outer == SUMO_OUTER_HEAVY_BALL) c.lr = 1.0, c.mu = 0.5;
                check_against_references(&c, true);
            }
}

static void test_reference_compressed(void **state)
{
    (void)state;
    const sumo_compression_format fmts[] = {SUMO_COMPRESS_BF16, SUMO_COMPRESS_FP8_E4M3,
                                            SUMO_COMPRESS_E3M0};
    for (int P = 1; P <= MAXP; P++)
        for (int F = 1; F <= 4; F++)
            for (int delay = 0; delay <= 3; delay++)
                for (int fi = 0; fi < 3; fi++) {
                    int H = 12;
                    if (delay > H / F || (fi + delay + P) % 2) continue; /* half the grid: CI time */
                    cfg c = {.P = P, .H = H, .F = F, .delay = delay, .merge = delay ? 0.3 : 0.0,
                             .outer = SUMO_OUTER_NESTEROV, .lr = 0.7, .mu = 0.9,
                             .comp = fmts[fi], .block = 8, .strided = F == 3, .ranges = F == 2,
                             .steps = 2 * H + delay + 1};
                    /* Bit for bit against the documented arithmetic (the quantisation itself is
                     * bounded in test_compress.c); the float64 reference without quantisation
                     * is no oracle for 4-bit exchanges. */
                    char what[200];
                    describe(&c, what, sizeof what);
                    run *L = run_lib(&c, 0);
                    ref *D = malloc(sizeof *D);
                    ref_init(D, &c, true);
                    for (int k = 1; k <= c.steps; k++) {
                        ref_local(D, k);
                        ref_end(D, k);
                        for (int r = 0; r < P; r++)
                            for (size_t j = 0; j < N; j++)
                                if (fbits(L->trace[r][k][j]) != fbits((float)D->theta[r][j]))
                                    fail_msg("%s: rank %d step %d element %zu: %a, documented %a", what, r,
                                             k, j, (double)L->trace[r][k][j], D->theta[r][j]);
                    }
                    ref_free(D);
                    free(D);
                    free(L);
                }
}

static void test_reference_adasum_acga(void **state)
{
    (void)state;
    for (int P = 1; P <= MAXP; P++)
        for (int F = 1; F <= 3; F++)
            for (int combine = SUMO_COMBINE_ADASUM; combine <= SUMO_COMBINE_ACGA; combine++) {
                cfg c = {.P = P, .H = 6, .F = F, .delay = F == 1 ? 2 : 1, .merge = 0.25,
                         .outer = SUMO_OUTER_NESTEROV, .lr = 0.7, .mu = 0.9,
                         .combine = (sumo_outer_combine)combine, .ranges = F == 3, .steps = 20};
                check_against_references(&c, false);
            }
}

/* ---- the oracles ------------------------------------------------------------------------------ */

/* The sharded state (memory_efficient) keeps the bits of the documented arithmetic, with the
 * heavy ball (SlowMo's) and the Nesterov step, for any number of ranks (n mod P != 0 too). */
static void test_sharded(void **state)
{
    (void)state;
    for (int P = 1; P <= MAXP; P++)
        for (int nesterov = 0; nesterov <= 1; nesterov++) {
            cfg c = {.P = P, .H = 4 + P % 3, .F = 1, .outer = nesterov ? SUMO_OUTER_NESTEROV : SUMO_OUTER_HEAVY_BALL,
                     .lr = nesterov ? 0.7 : (P % 2 ? 1.0 : 0.8), .mu = nesterov ? 0.9 : 0.5,
                     .sharded = 1, .steps = 20};
            check_against_references(&c, true);
        }
}

/* Ranges: F equal pieces of the flat vector whatever the tensors (more fragments than
 * tensors, tensors cut), against the reference. */
static void test_ranges(void **state)
{
    (void)state;
    for (int P = 1; P <= 3; P++)
        for (int F = 5; F <= 9; F += 4) {
            cfg c = {.P = P, .H = 9, .F = F, .delay = 1, .merge = 0.5, .outer = SUMO_OUTER_NESTEROV,
                     .lr = 0.7, .mu = 0.9, .ranges = 1, .steps = 2 * 9 + 2};
            check_against_references(&c, true);
            c.combine = SUMO_COMBINE_ADASUM;
            check_against_references(&c, false);
        }
}

/* Outer lr 1, momentum 0: every H steps the parameters become the rank-order fp32 average. */
static void test_oracle_localsgd(void **state)
{
    (void)state;
    for (int P = 1; P <= MAXP; P++) {
        cfg c = {.P = P, .H = 3 + P % 2, .F = 1, .lr = 1.0, .mu = 0.0, .outer = SUMO_OUTER_NESTEROV,
                 .steps = 20};
        run *L = run_lib(&c, 0);
        float x[MAXP][N];
        for (int r = 0; r < P; r++)
            for (size_t j = 0; j < N; j++) x[r][j] = (float)x_init(j);
        for (int k = 1; k <= c.steps; k++) {
            for (int r = 0; r < P; r++) local_step_f(r, x[r], lr_at(k));
            if (k % c.H == 0)
                for (size_t j = 0; j < N; j++) {
                    float s = x[0][j];
                    for (int r = 1; r < P; r++) s += x[r][j];
                    s /= (float)P;
                    for (int r = 0; r < P; r++) x[r][j] = s;
                }
            for (int r = 0; r < P; r++) {
                if (memcmp(L->trace[r][k], x[r], sizeof x[r]) != 0)
                    fail_msg("P %d rank %d step %d: not Local SGD's average", P, r, k);
                assert_int_equal(L->communicated[r][k], k % c.H == 0);
            }
        }
        free(L);
    }
}


int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference_average),
        cmocka_unit_test(test_reference_compressed),
        cmocka_unit_test(test_reference_adasum_acga),
        cmocka_unit_test(test_sharded),
        cmocka_unit_test(test_ranges),
        cmocka_unit_test(test_oracle_localsgd),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
