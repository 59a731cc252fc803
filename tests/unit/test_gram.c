/*
 * The Gram form of Adasum: its kernels, and Adasum's weights against the float64 reference
 * tree of support/reference.c. (ACGA, which runs in Gram form, is held against the test_acga_*
 * tests' own reference of the two-exchange algorithm.)
 *
 * References: the kernels are held against plain loops written here; Adasum against
 * ref_adasum_tree (the documented tree, sharing no code with the library).
 *
 * Tolerance (the Adasum tests' own): relative L2 error of the whole buffer below 100 eps of the
 * dtype, and per tensor below 8 (levels + 1) eps of the dtype relative to the tensor's input
 * norm. Where the exact result is 0 (a cancellation at the root) only the second applies.
 *
 * The Gram form cannot always meet it: near-cancellations at an inner level leave a quadratic
 * form with few correct digits. The module flags those tensors (SUMO__GRAM_INEXACT or
 * SUMO__GRAM_CANCELLED) for the caller to run the tree instead; the test asserts that no
 * UNFLAGGED tensor misses the tolerance, and prints the flagged cases with their errors
 * (GRAM_TEST_VERBOSE=1 prints every case).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "collectives/adasum_gram.h"
#include "kernels/kernels.h"
#include "kernels/kernels_isa.h"
#include "support/harness.h"
#include "support/reference.h"

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAXP 8

static const sumo_dtype dtypes[] = {SUMO_FLOAT32, SUMO_FLOAT64, SUMO_FLOAT16, SUMO_BFLOAT16};
#define NDT (sizeof dtypes / sizeof dtypes[0])
static const sumo__isa isas[] = {SUMO__ISA_PORTABLE, SUMO__ISA_AVX2, SUMO__ISA_AVX512};
#define NISA (sizeof isas / sizeof isas[0])

static bool isa_ok(sumo__isa isa) { return (unsigned)isa <= (unsigned)sumo__kernel_isa_best(); }

static bool verbose(void) { return getenv("GRAM_TEST_VERBOSE") != NULL; }

/* ---- kernels against plain loops ------------------------------------------------------------ */

static void test_gram_partials_kernel(void **state)
{
    (void)state;
    const size_t sizes[] = {0, 1, 7, 16, 17, 33, 255, 1000, 4099};
    const int nins[] = {1, 2, 3, 4, 5, 7, 8, 16};
    int bad = 0;
    for (size_t d = 0; d < NDT; d++) {
        sumo_dtype dt = dtypes[d];
        size_t esz = harness_dtype_size(dt);
        for (size_t z = 0; z < sizeof sizes / sizeof sizes[0]; z++) {
            size_t n = sizes[z];
            for (size_t q = 0; q < sizeof nins / sizeof nins[0]; q++) {
                int P = nins[q];
                unsigned char *in[16];
                const void *ins[16];
                for (int p = 0; p < P; p++) {
                    in[p] = (unsigned char *)malloc((n + 1) * esz) + esz; /* off the vector alignment */
                    for (size_t i = 0; i < n; i++)
                        harness_set(dt, in[p], i, 4 * harness_uniform_at(3 + d, (uint64_t)p, i));
                    ins[p] = in[p];
                }
                double got[136], ref[136], mag[136];
                int e = 0;
                for (int a = 0; a < P; a++)
                    for (int b = a; b < P; b++, e++) {
                        ref[e] = mag[e] = 0;
                        for (size_t i = 0; i < n; i++) {
                            double x = harness_get(dt, in[a], i), y = harness_get(dt, in[b], i);
                            ref[e] += x * y;
                            mag[e] += fabs(x * y);
                        }
                    }
                for (size_t k = 0; k < NISA; k++) {
                    if (!isa_ok(isas[k])) continue;
                    sumo__kernel_gram_partials_isa(isas[k], dt, ins, P, n, got);
                    double again[136];
                    sumo__kernel_gram_partials_isa(isas[k], dt, ins, P, n, again);
                    for (int m = 0; m < e; m++) {
                        double tol = (double)(n + 4) * DBL_EPSILON * mag[m];
                        if (!(fabs(got[m] - ref[m]) <= tol) || memcmp(&got[m], &again[m], 8)) {
                            if (bad++ < 10)
                                fprintf(stderr, "gram %s dtype %d n %zu P %d entry %d: %.17g, want %.17g\n",
                                        sumo__kernel_isa_name(isas[k]), dt, n, P, m, got[m], ref[m]);
                        }
                    }
                    /* The packed order is adasum_gram.h's. */
                    if (P >= 3 && n > 0 && got[sumo__gram_index(P, 2, 1)] != got[P + 1]) bad++;
                }
                for (int p = 0; p < P; p++) free(in[p] - esz);
            }
        }
    }
    assert_int_equal(bad, 0);
}

static void test_weighted_sum_kernel(void **state)
{
    (void)state;
    const size_t sizes[] = {1, 7, 16, 17, 33, 1000};
    int bad = 0;
    for (size_t d = 0; d < NDT; d++) {
        sumo_dtype dt = dtypes[d];
        size_t esz = harness_dtype_size(dt);
        for (size_t z = 0; z < sizeof sizes / sizeof sizes[0]; z++) {
            size_t n = sizes[z];
            for (int P = 1; P <= 8; P++) {
                for (int wide = 0; wide < 2; wide++) {
                    if (wide && (dt == SUMO_FLOAT16)) continue;
                    unsigned char *in[8], *out[NISA];
                    const void *ins[8];
                    double w[8];
                    for (int p = 0; p < P; p++) {
                        in[p] = malloc(n * esz);
                        /* wide: a huge weight on a tiny input (the bf16 defect's shape) */
                        double sc = wide && p == P - 1 ? 1e-38 : 1.0;
                        for (size_t i = 0; i < n; i++)
                            harness_set(dt, in[p], i, sc * harness_uniform_at(9, (uint64_t)p, i));
                        ins[p] = in[p];
                        w[p] = wide && p == P - 1 ? -1.5e38 * 3 : harness_uniform_at(10, 0, (size_t)p);
                    }
                    for (size_t k = 0; k < NISA; k++) out[k] = malloc(n * esz);
                    for (size_t k = 0; k < NISA; k++) {
                        if (!isa_ok(isas[k])) continue;
                        void *one[1] = {out[k]};
                        sumo__kernel_weighted_sum_isa(isas[k], dt, one, 1, ins, w, P, n);
                        for (size_t i = 0; i < n; i++) {
                            double v = 0, mag = 0;
                            for (int p = 0; p < P; p++) {
                                double t = w[p] * harness_get(dt, in[p], i);
                                v += t;
                                mag += fabs(t);
                            }
                            /* fp16/bf16 sum in fp32: P roundings of 2^-24 of the terms. */
                            double acc = dt == SUMO_FLOAT16 || dt == SUMO_BFLOAT16 ? 0x1p-24 : DBL_EPSILON;
                            double tol = harness_eps(dt) * fabs(v) + (P + 1) * acc * mag;
                            double got = harness_get(dt, out[k], i);
                            if (!(fabs(got - v) <= tol)) {
                                if (bad++ < 10)
                                    fprintf(stderr, "wsum %s dtype %d n %zu P %d wide %d [%zu]: %.9g want %.9g\n",
                                            sumo__kernel_isa_name(isas[k]), dt, n, P, wide, i, got, v);
                            }
                        }
                        /* Elementwise and specified operation by operation: the same bits on
                         * every path. */
                        if (k > 0 && memcmp(out[k], out[0], n * esz) != 0) {
                            fprintf(stderr, "wsum %s dtype %d n %zu P %d: bits differ from portable\n",
                                    sumo__kernel_isa_name(isas[k]), dt, n, P);
                            bad++;
                        }
                    }
                    /* In place over every input at once, as the direct shape calls it: each
                     * output the same bits as the out-of-place result, on every path. */
                    for (size_t k = 0; k < NISA; k++) {
                        if (!isa_ok(isas[k])) continue;
                        unsigned char *copy[8];
                        void *outs[8];
                        const void *cins[8];
                        for (int p = 0; p < P; p++) {
                            copy[p] = malloc(n * esz);
                            memcpy(copy[p], in[p], n * esz);
                            outs[p] = copy[p];
                            cins[p] = copy[p];
                        }
                        sumo__kernel_weighted_sum_isa(isas[k], dt, outs, P, cins, w, P, n);
                        for (int p = 0; p < P; p++) {
                            if (memcmp(copy[p], out[0], n * esz) != 0) {
                                if (bad++ < 10)
                                    fprintf(stderr, "wsum %s dtype %d n %zu P %d: in-place output %d differs\n",
                                            sumo__kernel_isa_name(isas[k]), dt, n, P, p);
                            }
                            free(copy[p]);
                        }
                    }
                    for (int p = 0; p < P; p++) free(in[p]);
                    for (size_t k = 0; k < NISA; k++) free(out[k]);
                }
            }
        }
    }
    assert_int_equal(bad, 0);
}

/* ---- Adasum's weights against the float64 tree ----------------------------------------------- */

typedef struct acase {
    const char *name;
    int P;
    sumo_dtype dt;
    size_t T;            /* tensors */
    size_t *off;         /* T + 1 */
    double *in[MAXP];    /* dtype-rounded values, as double */
    bool root_zero;      /* the exact result is 0 */
    bool expect_flagged; /* informational: a case built to defeat the quadratic forms */
} acase;

static void case_alloc(acase *c, const char *name, int P, sumo_dtype dt, const size_t *counts,
                       size_t T)
{
    memset(c, 0, sizeof *c);
    c->name = name;
    c->P = P;
    c->dt = dt;
    c->T = T;
    c->off = malloc((T + 1) * sizeof *c->off);
    c->off[0] = 0;
    for (size_t t = 0; t < T; t++) c->off[t + 1] = c->off[t] + counts[t];
    for (int r = 0; r < P; r++) c->in[r] = calloc(c->off[T] + 1, sizeof(double));
}

static void case_free(acase *c)
{
    for (int r = 0; r < c->P; r++) free(c->in[r]);
    free(c->off);
}

static void set(acase *c, int r, size_t i, double v) { c->in[r][i] = ref_round_to(c->dt, v); }

typedef struct verdict {
    double total, per_tensor, tol_total, tol_tensor;
    unsigned char flags; /* OR over tensors */
    bool pass, flagged_fail;
} verdict;

/*
 * Gram of every tensor by the library's kernel over the dtype's bits, weights by the module,
 * sum_i w_i g_i in double (here), and the same through the weighted-sum kernel in the dtype.
 */
static verdict check_case(const acase *c, double need_scale)
{
    const int P = c->P;
    const size_t n = c->off[c->T], esz = harness_dtype_size(c->dt), len = sumo__gram_len(P);
    unsigned char *buf[MAXP];
    const void *ins[MAXP];
    for (int r = 0; r < P; r++) {
        buf[r] = malloc(n * esz + 1);
        for (size_t i = 0; i < n; i++) harness_set(c->dt, buf[r], i, c->in[r][i]);
    }
    double *gram = malloc(c->T * len * sizeof *gram), *w = malloc(c->T * P * sizeof *w);
    double *w2 = malloc(c->T * P * sizeof *w2), work[2 * MAXP];
    unsigned char *flags = malloc(c->T), *flags2 = malloc(c->T);
    for (size_t t = 0; t < c->T; t++) {
        for (int r = 0; r < P; r++) ins[r] = buf[r] + c->off[t] * esz;
        sumo__kernel_gram_partials(c->dt, ins, P, c->off[t + 1] - c->off[t], gram + t * len);
    }
    sumo__adasum_gram_params prm = {.nranks = P, .group_size = 1,
                                    .need = need_scale * harness_eps(c->dt), .gram_err = 0};
    sumo__adasum_gram_weights(&prm, gram, c->T, w, flags, work);
    sumo__adasum_gram_weights(&prm, gram, c->T, w2, flags2, work);
    verdict v = {0};
    if (memcmp(w, w2, c->T * P * sizeof *w) != 0) v.flagged_fail = true; /* not deterministic */
    /* The reference tree. */
    double *u[MAXP];
    for (int r = 0; r < P; r++) {
        u[r] = malloc((n + 1) * sizeof(double));
        memcpy(u[r], c->in[r], n * sizeof(double));
    }
    ref_adasum_tree(u, P, c->off, c->T);
    int levels = 1;
    while ((1 << levels) < P) levels++;
    v.tol_total = 100 * harness_eps(c->dt);
    v.tol_tensor = 8.0 * (levels + 1) * harness_eps(c->dt);
    double dd = 0, ww = 0;
    bool unflagged_bad = false;
    unsigned char *outk = malloc(n * esz + 1);
    for (size_t t = 0; t < c->T; t++) {
        double td = 0, scale = 0, kd = 0;
        for (int r = 0; r < P; r++) ins[r] = buf[r] + c->off[t] * esz;
        size_t tn = c->off[t + 1] - c->off[t];
        void *out_t = outk + c->off[t] * esz;
        sumo__kernel_weighted_sum(c->dt, &out_t, 1, ins, w + t * P, P, tn);
        for (size_t i = c->off[t]; i < c->off[t + 1]; i++) {
            double g = 0;
            for (int r = 0; r < P; r++) {
                g += w[t * P + r] * c->in[r][i];
                scale += c->in[r][i] * c->in[r][i];
            }
            double diff = g - u[0][i];
            td += diff * diff;
            ww += u[0][i] * u[0][i];
            double kdiff = harness_get(c->dt, outk, i) - u[0][i];
            kd += kdiff * kdiff;
        }
        dd += td;
        double rel = scale > 0 ? sqrt(td / scale) : (td > 0 ? INFINITY : 0);
        /* The kernel's result in the dtype: one more rounding, eps/2 of each element. */
        double krel = scale > 0 ? sqrt(kd / scale) : (kd > 0 ? INFINITY : 0);
        bool tbad = !(rel <= v.tol_tensor) || !(krel <= v.tol_tensor + harness_eps(c->dt));
        if (!(rel <= v.per_tensor)) v.per_tensor = rel;
        v.flags |= flags[t];
        if (tbad && !(flags[t] & (SUMO__GRAM_INEXACT | SUMO__GRAM_CANCELLED))) unflagged_bad = true;
    }
    v.total = ww > 0 ? sqrt(dd / ww) : (dd > 0 ? INFINITY : 0);
    bool total_bad = !c->root_zero && n >= 16 && !(v.total < v.tol_total);
    bool any_flag = v.flags & (SUMO__GRAM_INEXACT | SUMO__GRAM_CANCELLED);
    if (total_bad && !any_flag) unflagged_bad = true;
    v.pass = !unflagged_bad && !v.flagged_fail && !(v.flags & SUMO__GRAM_NONFINITE);
    if (!v.pass || verbose() || (any_flag && (total_bad || v.per_tensor > v.tol_tensor)))
        fprintf(stderr,
                "%s %s: P=%d dtype %d tensors %zu: error %.3g (limit %.3g), worst tensor %.3g "
                "(limit %.3g), flags %s%s%s%s\n",
                v.pass ? (any_flag ? "flagged" : "ok") : "FAIL", c->name, P, c->dt, c->T, v.total,
                v.tol_total, v.per_tensor, v.tol_tensor,
                v.flags & SUMO__GRAM_INEXACT ? "inexact " : "",
                v.flags & SUMO__GRAM_CANCELLED ? "cancelled " : "",
                v.flags & SUMO__GRAM_NONFINITE ? "nonfinite " : "", v.flags ? "" : "none");
    for (int r = 0; r < P; r++) {
        free(u[r]);
        free(buf[r]);
    }
    free(outk);
    free(gram);
    free(w);
    free(w2);
    free(flags);
    free(flags2);
    return v;
}

/* Magnitude ranges each dtype holds with room for squares in double. */
static double lo_mag(sumo_dtype dt) { return dt == SUMO_FLOAT16 ? 1e-3 : 1e-30; }
static double hi_mag(sumo_dtype dt) { return dt == SUMO_FLOAT16 ? 1e3 : 1e30; }

/* The tree's subtree of level `lvl` that starts at rank 0: its ranks [0, end). Level -1 is the
 * fold's first pair (non-powers of two). */
static int subtree_end(int P, int lvl)
{
    int G2 = 1;
    while (G2 * 2 <= P) G2 *= 2;
    int R = P - G2, slots = 1 << lvl; /* slots [0, slots) form the left operand at level lvl */
    return slots <= R ? 2 * slots : slots + R;
}

static int adasum_cases(sumo_dtype dt, int P, double need_scale, int *nflagged)
{
    const size_t N = 67;
    int bad = 0;
    acase c;
    size_t cnt[1] = {N};
    verdict v;
#define RUN_CASE(expr)                                                                             \
    do {                                                                                           \
        v = check_case(&c, need_scale);                                                            \
        if (!v.pass) bad++;                                                                        \
        if (v.flags & (SUMO__GRAM_INEXACT | SUMO__GRAM_CANCELLED)) (*nflagged)++;                   \
        case_free(&c);                                                                             \
    } while (0)
    /* Random. */
    case_alloc(&c, "random", P, dt, cnt, 1);
    for (int r = 0; r < P; r++)
        for (size_t i = 0; i < N; i++) set(&c, r, i, harness_uniform_at(20, (uint64_t)r, i));
    RUN_CASE();
    /* Parallel, mixed signs and lengths. */
    case_alloc(&c, "parallel", P, dt, cnt, 1);
    for (int r = 0; r < P; r++)
        for (size_t i = 0; i < N; i++)
            set(&c, r, i, (r % 3 == 1 ? -0.5 : 1.0 + r) * harness_uniform_at(21, 0, i));
    RUN_CASE();
    /* One zero rank, each rank in turn. */
    for (int z = 0; z < P; z++) {
        case_alloc(&c, "zero rank", P, dt, cnt, 1);
        for (int r = 0; r < P; r++)
            for (size_t i = 0; i < N; i++)
                set(&c, r, i, r == z ? 0.0 : harness_uniform_at(22, (uint64_t)r, i));
        RUN_CASE();
    }
    /* Tiny and huge (all ranks), and magnitudes spread geometrically over the ranks. */
    for (int k = 0; k < 3; k++) {
        case_alloc(&c, k == 0 ? "tiny" : k == 1 ? "huge" : "spread magnitudes", P, dt, cnt, 1);
        for (int r = 0; r < P; r++) {
            double f = P > 1 ? (double)r / (P - 1) : 0.5;
            double s = k == 0 ? lo_mag(dt) : k == 1 ? hi_mag(dt)
                                           : exp((1 - f) * log(lo_mag(dt)) + f * log(hi_mag(dt)));
            for (size_t i = 0; i < N; i++) set(&c, r, i, s * harness_uniform_at(23, (uint64_t)r, i));
        }
        RUN_CASE();
    }
    /* Issue 14's bf16 case: parallel, norms 2.2e19 and 5.8e-38 alternating. */
    if (dt != SUMO_FLOAT16) {
        case_alloc(&c, "norms 2.2e19 / 5.8e-38", P, dt, cnt, 1);
        double nn = 0;
        for (size_t i = 0; i < N; i++) nn += pow(harness_uniform_at(14, 0, i), 2);
        for (int r = 0; r < P; r++)
            for (size_t i = 0; i < N; i++)
                set(&c, r, i, (r % 2 ? 5.8e-38 : 2.2e19) * harness_uniform_at(14, 0, i) / sqrt(nn));
        RUN_CASE();
    }
    /* One element. */
    size_t one[1] = {1};
    case_alloc(&c, "one element", P, dt, one, 1);
    for (int r = 0; r < P; r++) set(&c, r, 0, harness_uniform_at(24, (uint64_t)r, 0));
    RUN_CASE();
    /* Anti-parallel at every level: the left operand of level lvl (ranks [0, m)) cancels
     * exactly against its right partner; everything else random. */
    int G2 = 1, L = 0;
    while (G2 * 2 <= P) G2 *= 2, L++;
    for (int lvl = 0; lvl < L; lvl++) {
        int m = subtree_end(P, lvl), e = subtree_end(P, lvl + 1);
        /* left: ranks [0, m) hold c_r u; right: [m, e) hold -c u mirrored, so both operands'
         * Adasum (parallel: the mean) are m u and -m u when the two halves are mirror images */
        if (e - m != m) continue; /* a fold makes the halves unequal: covered below */
        case_alloc(&c, "anti-parallel at a level", P, dt, cnt, 1);
        for (int r = 0; r < P; r++)
            for (size_t i = 0; i < N; i++) {
                double uval = harness_uniform_at(25, 0, i);
                double val = r < m ? (1.0 + r) * uval : r < e ? -(1.0 + (r - m)) * uval
                                                                : harness_uniform_at(26, (uint64_t)r, i);
                set(&c, r, i, val);
            }
        c.root_zero = e == P;
        RUN_CASE();
    }
    if (P >= 3 && P != G2) { /* the fold's first pair cancels */
        case_alloc(&c, "anti-parallel fold pair", P, dt, cnt, 1);
        for (int r = 0; r < P; r++)
            for (size_t i = 0; i < N; i++) {
                double uval = harness_uniform_at(27, 0, i);
                set(&c, r, i, r == 0 ? uval : r == 1 ? -uval : harness_uniform_at(28, (uint64_t)r, i));
            }
        RUN_CASE();
    }
    if (P >= 2) { /* every rank's input the negation of its neighbour's: all pairs cancel */
        case_alloc(&c, "all pairs anti-parallel", P, dt, cnt, 1);
        for (int r = 0; r < P; r++)
            for (size_t i = 0; i < N; i++)
                set(&c, r, i, (r % 2 ? -1.0 : 1.0) * harness_uniform_at(29, (uint64_t)(r / 2), i));
        c.root_zero = P % 2 == 0 && P == G2;
        RUN_CASE();
    }
    /* Near-cancellation at the first level (P >= 3, so that a level above uses the norm): rank 1
     * = -(rank 0) + delta, the residual relative size delta; the rest random. */
    if (P >= 3) {
        const double deltas[] = {1e-2, 1e-4, 1e-6, 1e-8};
        for (size_t k = 0; k < sizeof deltas / sizeof deltas[0]; k++) {
            char *nm = malloc(64);
            snprintf(nm, 64, "near-anti-parallel pair, residual %.0e", deltas[k]);
            case_alloc(&c, nm, P, dt, cnt, 1);
            for (int r = 0; r < P; r++)
                for (size_t i = 0; i < N; i++) {
                    double a = harness_uniform_at(30, 0, i), d = harness_uniform_at(31, 0, i);
                    set(&c, r, i, r == 0 ? a : r == 1 ? -a + deltas[k] * d
                                                      : harness_uniform_at(32, (uint64_t)r, i));
                }
            c.expect_flagged = true;
            RUN_CASE();
            free(nm);
        }
    }
    /* 1,000 tensors of assorted sizes (ones, empties, odd), random with some zero per rank. */
    {
        size_t counts[1000];
        for (size_t t = 0; t < 1000; t++) counts[t] = t % 97 == 3 ? 0 : t % 7 == 0 ? 1 : 1 + (t * 37) % 61;
        case_alloc(&c, "1000 tensors", P, dt, counts, 1000);
        for (int r = 0; r < P; r++)
            for (size_t t = 0; t < 1000; t++)
                for (size_t i = c.off[t]; i < c.off[t + 1]; i++)
                    set(&c, r, i, (t * 7 + (size_t)r) % 11 == 0 ? 0.0 : harness_uniform_at(33, (uint64_t)r, i));
        RUN_CASE();
    }
#undef RUN_CASE
    return bad;
}

static void test_adasum_gram_weights(void **state)
{
    (void)state;
    int bad = 0, flagged = 0;
    for (size_t d = 0; d < NDT; d++)
        for (int P = 1; P <= MAXP; P++) bad += adasum_cases(dtypes[d], P, 8.0, &flagged);
    fprintf(stderr, "adasum gram: %d flagged cases (need = 8 eps of the dtype)\n", flagged);
    assert_int_equal(bad, 0);
}

/* Exact properties, fp64 weights: Adasum(a, -a) = 0, Adasum(a, 0) = a, parallel -> mean. */
static void test_adasum_gram_exact(void **state)
{
    (void)state;
    double work[2 * MAXP], w[MAXP];
    unsigned char fl;
    sumo__adasum_gram_params p2 = {.nranks = 2, .group_size = 1, .need = 0};
    const double anti[3] = {4.0, -4.0, 4.0}; /* G of a, -a with |a|^2 = 4 */
    sumo__adasum_gram_weights(&p2, anti, 1, w, &fl, work);
    assert_true(w[0] == w[1]); /* 1.5 a + 1.5 (-a) = 0 exactly */
    const double zero[3] = {4.0, 0.0, 0.0};
    sumo__adasum_gram_weights(&p2, zero, 1, w, &fl, work);
    assert_true(w[0] == 1.0 && w[1] == 1.0);
    const double par[3] = {1.0, 3.0, 9.0}; /* a = u, b = 3u: mean 2u = 0.5 + ... */
    sumo__adasum_gram_weights(&p2, par, 1, w, &fl, work);
    assert_true(fabs(w[0] * 1 + w[1] * 3 - 2.0) < 1e-15);
    /* P = 4, (a, -a, b, c): the left node is exactly zero, so the root is Adasum(b, c) whole. */
    sumo__adasum_gram_params p4 = {.nranks = 4, .group_size = 1, .need = 64 * DBL_EPSILON};
    double G4[10] = {0};
    /* a = e0, b = e1, c = e1 + e2 in an orthonormal basis. */
    G4[sumo__gram_index(4, 0, 0)] = 1;
    G4[sumo__gram_index(4, 0, 1)] = -1;
    G4[sumo__gram_index(4, 1, 1)] = 1;
    G4[sumo__gram_index(4, 2, 2)] = 1;
    G4[sumo__gram_index(4, 2, 3)] = 1;
    G4[sumo__gram_index(4, 3, 3)] = 2;
    sumo__adasum_gram_weights(&p4, G4, 1, w, &fl, work);
    assert_true(w[0] == w[1]);
    assert_int_equal(fl, 0);
    /* Adasum(b, c): dot 1, cb = 1 - 1/2, cc = 1 - 1/4. */
    assert_true(w[2] == 0.5 && w[3] == 0.75);
    /* Non-finite. */
    G4[0] = INFINITY;
    assert_int_equal(sumo__adasum_gram_weights(&p4, G4, 1, w, &fl, work), 0);
    assert_true(isnan(w[0]) && fl == SUMO__GRAM_NONFINITE);
}

/* xorshift: the same draws on every run and machine. */
static double draw(uint64_t *st)
{
    *st ^= *st << 13;
    *st ^= *st >> 7;
    *st ^= *st << 17;
    return (double)(*st >> 11) * 0x1p-53;
}

/* Two and four flat ranks weigh a bucket's tensors side by side (adasum_gram.c's lanes): a call
 * over T tensors must give each tensor the bits, flags and first non-finite tensor that T calls
 * of one tensor (the scalar code) give it, through cancelling, zero, tiny and non-finite Grams. */
static void test_adasum_gram_weights_batched(void **state)
{
    (void)state;
    enum { T = 13, V = 4 };
    uint64_t st = 0x9E3779B97F4A7C15ull;
    int bad = 0;
    for (int P = 2; P <= 4; P += 2)
        for (int it = 0; it < 3000; it++) {
            const size_t L = sumo__gram_len(P);
            double G[T * 10], w[T * 4], w1[4], work[2 * 4];
            unsigned char fl[T], f1;
            for (size_t t = 0; t < T; t++) {
                double v[4][V];
                const int mode = (int)(draw(&st) * 8);
                for (int i = 0; i < P; i++)
                    for (int d = 0; d < V; d++) v[i][d] = draw(&st) * 2 - 1;
                for (int d = 0; d < V; d++) {
                    if (mode == 1) v[1][d] = -v[0][d];
                    if (mode == 2) v[0][d] = 0;
                    if (mode == 3) v[P - 1][d] = -v[P - 2][d] * (1 + 1e-12 * draw(&st));
                    for (int i = 0; i < P && mode == 4; i++) v[i][d] *= 0x1p-300;
                }
                for (int i = 0; i < P; i++)
                    for (int j = i; j < P; j++) {
                        double x = 0;
                        for (int d = 0; d < V; d++) x += v[i][d] * v[j][d];
                        G[t * L + sumo__gram_index(P, i, j)] = x;
                    }
                const size_t e = t * L + (size_t)(draw(&st) * (double)L);
                if (mode == 5) G[e] = draw(&st) < 0.5 ? NAN : -INFINITY;
                if (mode == 6) G[e] = -0.0;
            }
            sumo__adasum_gram_params p = {.nranks = P, .group_size = 1,
                                          .need = draw(&st) < 0.5 ? 8 * 0x1p-23 : 0,
                                          .gram_err = draw(&st) < 0.3 ? 1e-7 : 0};
            size_t first = sumo__adasum_gram_weights(&p, G, T, w, fl, work), first1 = SIZE_MAX;
            for (size_t t = 0; t < T; t++) {
                if (sumo__adasum_gram_weights(&p, G + t * L, 1, w1, &f1, work) == 0 && first1 == SIZE_MAX)
                    first1 = t;
                bad += memcmp(w1, w + t * (size_t)P, (size_t)P * sizeof(double)) != 0 || f1 != fl[t];
            }
            bad += first != first1;
        }
    assert_int_equal(bad, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gram_partials_kernel),
        cmocka_unit_test(test_weighted_sum_kernel),
        cmocka_unit_test(test_adasum_gram_exact),
        cmocka_unit_test(test_adasum_gram_weights),
        cmocka_unit_test(test_adasum_gram_weights_batched),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
