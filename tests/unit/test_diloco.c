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
#define SUMO_EXPERIMENTAL_API 1
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "sumo_diloco.h"
#include "sumo_distributed.h"
#include "support/harness.h"
#include "support/reference.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAXP 5
#define MAXT 40
#define N 27
#define TOL 2e-4

/* Seven tensors, one empty. */
static const size_t LAYOUT[] = {5, 3, 0, 7, 4, 6, 2};
#define NT (sizeof LAYOUT / sizeof LAYOUT[0])

/* ---- the problem ---------------------------------------------------------------------------- */

static double coef_a(int rank, size_t j)
{
    return 0.3 + 0.3 * (harness_uniform_at(11, (uint64_t)rank, j) + 1) / 2;
}
static double coef_c(int rank, size_t j) { return 2.0 * harness_uniform_at(12, (uint64_t)rank, j); }
static double x_init(size_t j) { return harness_uniform_at(13, 0, j); }
static double lr_at(int k) { return 0.1 + 0.002 * k; } /* the rate of local step k (1-based) */

/* One local step of rank r at rate lr on fp32 parameters: rounded once. */
static void local_step_f(int r, float *x, double lr)
{
    for (size_t j = 0; j < N; j++) x[j] = (float)((double)x[j] - lr * coef_a(r, j) * ((double)x[j] - coef_c(r, j)));
}

/* ---- configuration ---------------------------------------------------------------------- */

typedef struct cfg {
    int P, H, F, delay;
    double merge;
    sumo_outer_optimizer outer;
    double lr, mu;
    sumo_outer_combine combine;
    sumo_compression_format comp;
    size_t block;
    int strided; /* fragment_of = t % F */
    int ranges;  /* SUMO_SPLIT_RANGES: F ranges of the flat vector, cutting tensors */
    int sharded; /* memory_efficient */
    int steps;
} cfg;

static sumo_diloco_options options_of(const cfg *c, int *fragment_of)
{
    sumo_diloco_options o;
    sumo_diloco_options_preset(SUMO_DILOCO_PRESET_DILOCO, &o);
    o.sync_every = c->H;
    o.fragments = c->F;
    o.delay = c->delay;
    o.merge_alpha = c->merge;
    o.outer = c->outer;
    o.lr = c->lr;
    o.momentum = c->mu;
    o.combine = c->combine;
    o.compression = c->comp;
    o.block_size = c->block ? c->block : 8;
    if (c->strided) {
        for (size_t t = 0; t < NT; t++) fragment_of[t] = (int)(t % (size_t)c->F);
        o.fragment_of = fragment_of;
    }
    if (c->ranges) o.split = SUMO_SPLIT_RANGES;
    o.memory_efficient = c->sharded;
    return o;
}

/* ---- the reference ---------------------------------------------------------------------- */

typedef struct ref {
    const cfg *c;
    bool doc;                /* DOC precision (fp32 storage), else EXACT */
    int frag_of_elem[N];
    int tensor_frag[NT];
    size_t first[16];        /* s_f */
    double theta[MAXP][N], anchor[N], v[N], comb[N];
    int pending;
    int apply_at;
    double gamma;
    bool from_average;
    ref_acga acga[16];
} ref;

static double rnd(const ref *R, double x) { return R->doc ? (double)(float)x : x; }

/* The documented split: contiguous whole tensors, fragment f closed at the first tensor
 * boundary where the running count reaches ceil((f + 1) n / F), one tensor left for each
 * later fragment; or t % F. */
static void ref_split(const cfg *c, int *tensor_frag)
{
    if (c->strided) {
        for (size_t t = 0; t < NT; t++) tensor_frag[t] = (int)(t % (size_t)c->F);
        return;
    }
    size_t t = 0, sum = 0;
    for (int f = 0; f < c->F; f++) {
        double target = ceil((double)N * (f + 1) / c->F);
        do {
            tensor_frag[t] = f;
            sum += LAYOUT[t++];
        } while (t < NT - (size_t)(c->F - 1 - f) && (f == c->F - 1 || (double)sum < target));
    }
}

static void ref_init(ref *R, const cfg *c, bool doc)
{
    memset(R, 0, sizeof *R);
    R->c = c;
    R->doc = doc;
    int *tf = R->tensor_frag;
    ref_split(c, tf);
    size_t j = 0;
    for (size_t t = 0; t < NT; t++)
        for (size_t e = 0; e < LAYOUT[t]; e++) R->frag_of_elem[j++] = tf[t];
    /* Ranges: element j belongs to the f with floor(f N / F) <= j < floor((f + 1) N / F). */
    for (j = 0; c->ranges && j < N; j++)
        for (int f = 0; f < c->F; f++)
            if ((size_t)f * N / (size_t)c->F <= j && j < (size_t)(f + 1) * N / (size_t)c->F)
                R->frag_of_elem[j] = f;
    for (int f = 0; f < c->F; f++) R->first[f] = (size_t)((f + 1) * c->H / c->F);
    for (int r = 0; r < c->P; r++)
        for (j = 0; j < N; j++) R->theta[r][j] = rnd(R, x_init(j));
    for (j = 0; j < N; j++) R->anchor[j] = R->theta[0][j];
    R->pending = -1;
    if (c->combine == SUMO_COMBINE_ACGA)
        for (int f = 0; f < c->F; f++) {
            sumo_aggregator_options o;
            sumo_aggregator_options_default(SUMO_AGGREGATE_ACGA, &o);
            o.acga.rescale = 1; /* sumo_diloco's default */
            size_t cnt = 0;
            for (j = 0; j < N; j++) cnt += R->frag_of_elem[j] == f;
            assert_int_equal(ref_acga_init(&R->acga[f], c->P, &o, cnt), 0);
        }
}

static void ref_free(ref *R)
{
    if (R->c->combine == SUMO_COMBINE_ACGA)
        for (int f = 0; f < R->c->F; f++) ref_acga_free(&R->acga[f]);
}

static int ref_starting(const ref *R, int k)
{
    for (int f = 0; f < R->c->F; f++)
        if ((size_t)k >= R->first[f] && ((size_t)k - R->first[f]) % (size_t)R->c->H == 0) return f;
    return -1;
}

static void ref_apply(ref *R)
{
    const cfg *c = R->c;
    int f = R->pending;
    R->pending = -1;
    for (size_t j = 0; j < N; j++) {
        if (R->frag_of_elem[j] != f) continue;
        double x0 = R->anchor[j];
        double d = R->from_average ? x0 - R->comb[j] : R->comb[j];
        double vd, gd;
        if (c->outer == SUMO_OUTER_NESTEROV) {
            vd = c->mu * R->v[j] + d;
            gd = x0 - c->lr * (d + c->mu * vd);
        } else {
            vd = c->mu * R->v[j] + d / R->gamma;
            gd = x0 - c->lr * R->gamma * vd;
        }
        R->v[j] = rnd(R, vd);
        double g = isfinite(R->v[j]) ? rnd(R, gd) : NAN;
        R->anchor[j] = g;
        for (int r = 0; r < c->P; r++)
            R->theta[r][j] = c->merge == 0 ? g : rnd(R, c->merge * R->theta[r][j] + (1 - c->merge) * g);
    }
}

/* The combine of the fragment's outer gradients (or parameters) into comb. */
static void ref_start(ref *R, int f, double lr)
{
    const cfg *c = R->c;
    int P = c->P;
    size_t idx[N], nf = 0;
    for (size_t j = 0; j < N; j++)
        if (R->frag_of_elem[j] == f) idx[nf++] = j;
    R->from_average = c->combine == SUMO_COMBINE_AVERAGE && c->comp == SUMO_COMPRESS_NONE;
    if (R->from_average) {
        for (size_t q = 0; q < nf; q++) {
            size_t j = idx[q];
            double s = R->theta[0][j];
            for (int r = 1; r < P; r++) s = rnd(R, s + R->theta[r][j]);
            R->comb[j] = rnd(R, s / P);
        }
    } else if (c->comp != SUMO_COMPRESS_NONE) {
        /* sumo.h's definition over the gathered fragment: each rank's x0 - x (rounded once)
         * through the codec, the fp32 sum in rank order, divided once, the codec again. */
        float in[MAXP][N], acc[N], t[N], out[N];
        for (int r = 0; r < P; r++) {
            for (size_t q = 0; q < nf; q++) in[r][q] = (float)(R->anchor[idx[q]] - R->theta[r][idx[q]]);
            ref_roundtrip(c->comp, c->block, in[r], t, nf);
            for (size_t q = 0; q < nf; q++) acc[q] = r ? acc[q] + t[q] : t[q];
        }
        for (size_t q = 0; q < nf; q++) acc[q] = acc[q] / (float)P;
        ref_roundtrip(c->comp, c->block, acc, out, nf);
        for (size_t q = 0; q < nf; q++) R->comb[idx[q]] = out[q];
    } else if (c->combine == SUMO_COMBINE_ADASUM) {
        /* Adasum per tensor of the fragment, in double. */
        double *u[MAXP], buf[MAXP][N];
        size_t off[NT + 1], T = 0, start = 0;
        off[0] = 0;
        for (size_t t = 0; t < NT; start += LAYOUT[t], t++) {
            /* The fragment's elements of tensor t (with ranges, the piece inside the range;
             * an empty piece is no tensor of the fragment). */
            size_t in = 0;
            for (size_t e = start; e < start + LAYOUT[t]; e++) in += R->frag_of_elem[e] == f;
            if (c->ranges ? in > 0 : R->tensor_frag[t] == f) {
                off[T + 1] = off[T] + in;
                T++;
            }
        }
        for (int r = 0; r < P; r++) {
            for (size_t q = 0; q < nf; q++) buf[r][q] = R->anchor[idx[q]] - R->theta[r][idx[q]];
            u[r] = buf[r];
        }
        ref_adasum_tree(u, P, off, T);
        for (size_t q = 0; q < nf; q++) R->comb[idx[q]] = u[0][q];
    } else {
        float in[MAXP][N];
        float *pin[MAXP];
        double G[N], bound[N];
        for (int r = 0; r < P; r++) {
            for (size_t q = 0; q < nf; q++) in[r][q] = (float)(R->anchor[idx[q]] - R->theta[r][idx[q]]);
            pin[r] = in[r];
        }
        ref_acga_step(&R->acga[f], pin, G, bound);
        for (size_t q = 0; q < nf; q++) R->comb[idx[q]] = G[q];
    }
    R->pending = f;
    R->gamma = lr;
}

/* End of local step k (the local steps already taken). */
static void ref_end(ref *R, int k)
{
    if (R->pending >= 0 && R->apply_at == k) ref_apply(R);
    int f = ref_starting(R, k);
    if (f >= 0) {
        ref_start(R, f, lr_at(k));
        R->apply_at = k + R->c->delay;
        if (R->c->delay == 0) ref_apply(R);
    }
}

static void ref_local(ref *R, int k)
{
    for (int r = 0; r < R->c->P; r++)
        for (size_t j = 0; j < N; j++)
            R->theta[r][j] = rnd(R, R->theta[r][j] - lr_at(k) * coef_a(r, j) * (R->theta[r][j] - coef_c(r, j)));
}

/* ---- running the library ------------------------------------------------------------------ */

typedef struct run {
    const cfg *c;
    float trace[MAXP][MAXT + 1][N];
    int communicated[MAXP][MAXT + 1];
    int due[MAXP][MAXT + 1];
    sumo_result err[MAXP];
    int failed_step[MAXP];
    /* resume: stop after `save_at` steps, save, destroy, recreate, load, go on */
    int save_at;
} run;

static void run_rank(sumo_comm *comm, int rank, int size, void *arg)
{
    (void)size;
    run *R = arg;
    const cfg *c = R->c;
    int fo[NT];
    sumo_diloco_options o = options_of(c, fo);
    sumo_diloco *d = NULL;
    R->failed_step[rank] = -1;
    sumo_result r = sumo_diloco_create(comm, LAYOUT, NT, N, SUMO_FLOAT32, &o, &d);
    float x[N];
    for (size_t j = 0; j < N; j++) x[j] = (float)x_init(j);
    for (int k = 1; r == SUMO_SUCCESS && k <= c->steps; k++) {
        int what = -1;
        r = sumo_diloco_due(d, &what, NULL, NULL);
        R->due[rank][k] = what;
        if (r == SUMO_SUCCESS) r = sumo_diloco_begin(d, x);
        local_step_f(rank, x, lr_at(k));
        if (r == SUMO_SUCCESS) r = sumo_diloco_end(d, x, lr_at(k), &R->communicated[rank][k]);
        if (r != SUMO_SUCCESS) R->failed_step[rank] = k;
        memcpy(R->trace[rank][k], x, sizeof x);
        if (r == SUMO_SUCCESS && k == R->save_at) {
            size_t bytes = 0;
            r = sumo_diloco_state_size(d, &bytes);
            void *buf = malloc(bytes);
            if (r == SUMO_SUCCESS) r = sumo_diloco_state_save(d, buf, bytes);
            sumo_diloco_destroy(d);
            d = NULL;
            if (r == SUMO_SUCCESS) r = sumo_diloco_create(comm, LAYOUT, NT, N, SUMO_FLOAT32, &o, &d);
            if (r == SUMO_SUCCESS) r = sumo_diloco_state_load(d, buf, bytes);
            free(buf);
        }
    }
    R->err[rank] = r;
    sumo_diloco_destroy(d);
}

static run *run_lib(const cfg *c, int save_at)
{
    run *R = calloc(1, sizeof *R);
    assert_non_null(R);
    R->c = c;
    R->save_at = save_at;
    assert_int_equal(harness_run_threads(c->P, run_rank, R), 0);
    for (int r = 0; r < c->P; r++)
        if (R->err[r] != SUMO_SUCCESS)
            fail_msg("P %d H %d F %d delay %d: rank %d %s at step %d", c->P, c->H, c->F, c->delay,
                     r, sumo_result_name(R->err[r]), R->failed_step[r]);
    return R;
}

static uint32_t fbits(float f)
{
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    return b;
}

static void describe(const cfg *c, char *s, size_t len)
{
    snprintf(s, len, "P %d H %d F %d delay %d merge %g %s lr %g mu %g combine %d comp %d%s", c->P,
             c->H, c->F, c->delay, c->merge, c->outer == SUMO_OUTER_NESTEROV ? "nesterov" : "heavy-ball",
             c->lr, c->mu, (int)c->combine, (int)c->comp,
             c->strided ? " strided" : c->ranges ? " ranges" : "");
}

/* The library against the references, every rank, every step. */
static void check_against_references(const cfg *c, bool bitwise)
{
    char what[200];
    describe(c, what, sizeof what);
    run *L = run_lib(c, 0);
    ref *E = malloc(sizeof *E), *D = malloc(sizeof *D);
    assert_true(E && D);
    ref_init(E, c, false);
    ref_init(D, c, true);
    for (int k = 1; k <= c->steps; k++) {
        ref_local(E, k);
        ref_local(D, k);
        ref_end(E, k);
        ref_end(D, k);
        for (int r = 0; r < c->P; r++)
            for (size_t j = 0; j < N; j++) {
                float got = L->trace[r][k][j];
                double want = E->theta[r][j];
                if (!(fabs((double)got - want) <= TOL * fmax(1.0, fabs(want))))
                    fail_msg("%s: rank %d step %d element %zu: %.9g, float64 reference %.9g", what, r,
                             k, j, (double)got, want);
                if (bitwise && fbits(got) != fbits((float)D->theta[r][j]))
                    fail_msg("%s: rank %d step %d element %zu: %a, documented arithmetic %a", what,
                             r, k, j, (double)got, D->theta[r][j]);
            }
    }
    ref_free(E);
    ref_free(D);
    free(E);
    free(D);
    free(L);
}

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
    sumo_diloco_options_preset(SUMO_DILOCO_PRESET_DILOCO, &o);
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
    assert_int_equal(sumo_diloco_options_preset((sumo_diloco_preset)9, &base), SUMO_ERR_INVALID_ARGUMENT);
    sumo_diloco_options_preset(SUMO_DILOCO_PRESET_DILOCO, &base);
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
    sumo_diloco_options_preset(SUMO_DILOCO_PRESET_STREAMING, &o);
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
    sumo_diloco_options_preset(SUMO_DILOCO_PRESET_DILOCO, &o);
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
    sumo_diloco_options_preset(SUMO_DILOCO_PRESET_DILOCO, &o);
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
        cmocka_unit_test(test_reference_average),
        cmocka_unit_test(test_reference_compressed),
        cmocka_unit_test(test_reference_adasum_acga),
        cmocka_unit_test(test_sharded),
        cmocka_unit_test(test_ranges),
        cmocka_unit_test(test_oracle_localsgd),
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
