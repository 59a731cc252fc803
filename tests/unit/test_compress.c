/*
 * The compressed allreduce (sumo.h's sumo_allreduce_compressed) and its codec, against the
 * independent references of support/reference.c (the formats enumerated from their
 * definitions, rounding by search, not by bit arithmetic):
 *   (a) the host table's quantize/dequantize equal the reference on random blocks, on every
 *       tie between two codes and on the boundaries (zero, subnormals, the largest value,
 *       FLT_MAX), for every format;
 *   (b) representable values come back exact; all-zero blocks give +0; nothing saturates to
 *       Inf; a block holding NaN or Inf decodes as NaN and is reported;
 *   (c) the allreduce equals its definition bit for bit (each rank's input through the
 *       codec, the fp32 sum in rank order, divided once, through the codec again) for P = 1
 *       to 5, every format, sum and average, short last blocks and segments with no block, on
 *       both algorithms (direct and messages) and asynchronously; every rank the same bits;
 *       and it stays within the bound derived below of the exact float64 result;
 *   (d) NaN or Inf on one rank: SUMO_ERR_NONFINITE on every rank before anything is written,
 *       naming the rank and element; a sum that overflows fp32: NaN in its block on every
 *       rank, SUMO_ERR_NONFINITE; mismatched or invalid options refused on every rank.
 *
 * The bound of (c), per element i of block b, for a format with m mantissa bits, smallest
 * normal binade emin and largest value L, u = 2^-24, and Q the codec:
 *   |Q(x) - x| <= e(x, A) = 2^-(m+1) |x| + 2^(emin-m-1) max(2A/L, 2^-149)
 * where A is the block's largest magnitude (2^s <= 2A/L by the scale's choice; below the
 * smallest normal the quantum is 2^(emin-m+s)); bf16 (no scale) has e = 2^-8 |x| + 2^-134.
 * With x~_r = Q(x_r), z = fl(fl(sum x~_r) / P) (P = 1 for a sum):
 *   |out - mean| <= (1/P) sum_r e(x_r, A_r) + 1.01 (P u / P) sum_r |x~_r| + e(z, A_z)
 * bounding |x~_r| <= |x_r| + e(x_r, A_r) and |z| (and A_z) by (1/P) sum_r |x~_r| (1 + P u).
 */
#define SUMO_EXPERIMENTAL_API 1
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "sumo_ext.h"
#include "support/harness.h"
#include "support/reference.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAXP 5

static const sumo_compression_format FORMATS[] = {SUMO_COMPRESS_BF16, SUMO_COMPRESS_FP8_E4M3,
                                                  SUMO_COMPRESS_E3M0};
static const char *FNAME[] = {"none", "bf16", "e4m3", "e3m0"};

static const sumo_kernel_table *host(void)
{
    const sumo_kernel_table *t = NULL;
    assert_int_equal(sumo_host_kernels(&t), SUMO_SUCCESS);
    return t;
}

static uint32_t fbits(float f)
{
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    return b;
}

/* The library's codec round trip of n values (blocks of `block`) into out; returns *first. */
static size_t lib_roundtrip(sumo_compression_format f, size_t block, const float *in, float *out,
                            size_t n)
{
    const sumo_kernel_table *t = host();
    sumo_compression c = {.struct_size = sizeof c, .format = f, .block_size = block,
                          .op = SUMO_OP_SUM};
    size_t bytes = 0, first = 0;
    assert_int_equal(sumo_compressed_bytes(&c, n, &bytes), SUMO_SUCCESS);
    void *payload = malloc(bytes + 1);
    assert_non_null(payload);
    assert_int_equal(t->quantize(t->ctx, NULL, f, block, payload, in, n, &first), SUMO_SUCCESS);
    assert_int_equal(t->dequantize(t->ctx, NULL, f, block, out, payload, n), SUMO_SUCCESS);
    free(payload);
    return first;
}

/* Bits equal, NaN equal to NaN. */
static bool same(float a, float b)
{
    return fbits(a) == fbits(b) || (isnan(a) && isnan(b));
}

static void check_block_vs_ref(sumo_compression_format f, size_t block, const float *in, size_t n,
                               const char *what)
{
    float *got = malloc(n * sizeof *got), *want = malloc(n * sizeof *want);
    assert_true(got && want);
    size_t g = lib_roundtrip(f, block, in, got, n), w = ref_roundtrip(f, block, in, want, n);
    if (g != w) fail_msg("%s %s: first non-finite %zu, reference %zu", FNAME[f], what, g, w);
    for (size_t i = 0; i < n; i++)
        if (!same(got[i], want[i]))
            fail_msg("%s %s: element %zu (%a, block max %a): %a, reference %a", FNAME[f], what, i,
                     (double)in[i], (double)in[i / block * block], (double)got[i], (double)want[i]);
    free(got);
    free(want);
}

/* ---- (a) the codec against the definition ------------------------------------------------- */

static void test_codec_matches_reference(void **state)
{
    (void)state;
    enum { B = 16, NB = 4000 };
    float *in = malloc((size_t)B * NB * sizeof *in);
    assert_non_null(in);
    for (size_t fi = 0; fi < 3; fi++) {
        sumo_compression_format f = FORMATS[fi];
        uint32_t count = ref_code_count(f);
        uint64_t st = 0x1234 + fi;
        /* Block k: its first element sets the scale (a random fp32 magnitude anywhere in the
         * range), the others are random values below it, exact ties between two codes at that
         * scale, codes' own values, or zero and tiny values. */
        for (size_t b = 0; b < NB; b++) {
            float *blk = in + b * B;
            int ex = (int)(harness_next(&st) % 270) - 145;
            float amax = (float)ldexp(1.0 + 0.999 * fabs(harness_uniform(&st)), ex);
            if (!isfinite(amax) || amax == 0) amax = 1.0f;
            if (b % 97 == 0) amax = FLT_MAX;
            blk[0] = harness_next(&st) & 1 ? -amax : amax;
            int s = ref_scale_exponent(f, amax);
            for (int j = 1; j < B; j++) {
                uint32_t c = (uint32_t)(harness_next(&st) % (count - 1));
                double v;
                switch (harness_next(&st) % 4) {
                case 0: v = amax * harness_uniform(&st); break;
                case 1: v = ldexp((ref_code_value(f, c) + ref_code_value(f, c + 1)) / 2, s); break;
                case 2: v = ldexp(ref_code_value(f, c), s); break;
                default: v = ldexp(harness_uniform(&st), ex - 30 - (int)(harness_next(&st) % 20)); break;
                }
                /* A tie must stay a tie in fp32 and stay below the block's maximum. */
                float fv = (float)v;
                if (!(fabsf(fv) <= amax)) fv = amax * 0.5f;
                blk[j] = harness_next(&st) & 1 ? -fv : fv;
            }
        }
        check_block_vs_ref(f, B, in, (size_t)B * NB, "random blocks");
        /* Every tie of consecutive codes at scale 1 (amax = the largest value): bf16 too, where
         * these are exactly fp32's halfway cases. */
        size_t n = 0;
        for (uint32_t c = 0; c + 1 < count && n + 2 <= (size_t)B * NB; c++) {
            if (n % B == 0) in[n++] = (float)ref_code_value(f, count - 1);
            in[n++] = (float)((ref_code_value(f, c) + ref_code_value(f, c + 1)) / 2);
        }
        check_block_vs_ref(f, B, in, n, "ties at scale 1");
    }
    free(in);
}

/* ---- (b) exact values, zero, saturation, non-finite --------------------------------------- */

static void test_codec_edges(void **state)
{
    (void)state;
    for (size_t fi = 0; fi < 3; fi++) {
        sumo_compression_format f = FORMATS[fi];
        uint32_t count = ref_code_count(f);
        /* Every representable value at several scales comes back exact (blocks of 8: the
         * largest code first, so the scale is exactly 2^s). */
        int scales[] = {0, -149 + 12, -20, 7, 100};
        for (size_t k = 0; k < sizeof scales / sizeof scales[0]; k++) {
            if (f == SUMO_COMPRESS_BF16 && scales[k] != 0) continue;
            size_t n = 0, cap = 8 * (size_t)count;
            float *in = malloc(cap * sizeof *in), *out = malloc(cap * sizeof *out);
            assert_true(in && out);
            for (uint32_t c = 0; c < count; c++) {
                if (n % 8 == 0) in[n++] = (float)ldexp(ref_code_value(f, count - 1), scales[k]);
                float v = (float)ldexp(ref_code_value(f, c), scales[k]);
                if (ldexp(ref_code_value(f, c), scales[k]) != (double)v) continue; /* not fp32 */
                in[n++] = c & 1 ? -v : v;
            }
            assert_int_equal(lib_roundtrip(f, 8, in, out, n), SIZE_MAX);
            for (size_t i = 0; i < n; i++)
                if (fbits(in[i]) != fbits(out[i]))
                    fail_msg("%s scale 2^%d: %a came back %a", FNAME[f], scales[k], (double)in[i],
                             (double)out[i]);
            free(in);
            free(out);
        }
        /* An all-zero block (signed zeros too) gives +0 in the scaled formats. */
        float z[16] = {0}, out[16];
        z[3] = -0.0f;
        z[8] = 1.5f;
        assert_int_equal(lib_roundtrip(f, 8, z, out, 16), SIZE_MAX);
        for (int i = 0; i < 8; i++)
            if (f != SUMO_COMPRESS_BF16) assert_int_equal(fbits(out[i]), 0u);
        assert_true(out[8] == 1.5f || f == SUMO_COMPRESS_E3M0);
        /* Saturation: the largest fp32 magnitudes never become Inf, and equal the reference. */
        float big[8] = {FLT_MAX, -FLT_MAX, 0x1.fffffep127f * 0.99f, 3.4e38f, 3.3895e38f,
                        -3.39e38f, 1.0f, 0x1.ffp127f};
        float sat[8];
        assert_int_equal(lib_roundtrip(f, 8, big, sat, 8), SIZE_MAX);
        for (int i = 0; i < 8; i++) assert_true(isfinite(sat[i]));
        check_block_vs_ref(f, 8, big, 8, "largest magnitudes");
        if (f == SUMO_COMPRESS_BF16) assert_int_equal(fbits(sat[0]), 0x7f7f0000u); /* bf16 max */
        /* NaN and Inf: the first reported, their blocks NaN, the other blocks exact. */
        float bad[24], got[24];
        for (int i = 0; i < 24; i++) bad[i] = (float)ref_code_value(f, (uint32_t)(i % 3) + 1);
        bad[13] = INFINITY;
        bad[20] = NAN;
        assert_int_equal(lib_roundtrip(f, 8, bad, got, 24), 13);
        for (int i = 0; i < 24; i++) {
            if (i >= 8 && i < 24) assert_true(isnan(got[i]));
            else assert_int_equal(fbits(got[i]), fbits(bad[i]));
        }
    }
}

/* ---- (c), (d) the allreduce ----------------------------------------------------------------- */

typedef struct job {
    int P;
    sumo_compression_format format;
    size_t block, n;
    sumo_op op;
    int mode;           /* 0 blocking, 1 start/wait, 2 messages (a point-to-point algorithm) */
    int nan_rank;       /* -1: none; else that rank's element nan_at is NaN (or Inf if odd) */
    size_t nan_at;
    int bad_options_rank; /* -1: none; that rank passes another format (or NULL options) */
    bool huge;          /* every input FLT_MAX in the second block */
    bool exact;         /* every rank the same representable values (the largest first in
                           each block) */
    float *in[MAXP], *out[MAXP];
    sumo_result res[MAXP];
    char msg[MAXP][256];
} job;

static float input_value(const job *j, int rank, size_t i)
{
    if (j->huge && i / j->block == 1) return FLT_MAX;
    if (j->exact) {
        uint32_t count = ref_code_count(j->format);
        /* Small enough that P of them add up without overflow: the scaled formats' values
         * times 2^-20 (still representable), bf16's lower half of codes (below 2). */
        int sc = j->format == SUMO_COMPRESS_BF16 ? 0 : -20;
        if (j->format == SUMO_COMPRESS_BF16) count /= 2;
        if (i % j->block == 0) return (float)ldexp(ref_code_value(j->format, count - 1), sc);
        float v = (float)ldexp(ref_code_value(j->format, (uint32_t)(i * 7919 % count)), sc);
        return i % 3 ? v : -v;
    }
    /* Blocks of very different magnitudes, a few all-zero blocks, some tiny values; the
     * ranks' magnitudes differ too, so that the fp32 sum rounds and its order shows. */
    size_t b = i / j->block;
    if (b % 7 == 3) return 0.0f;
    double mag = ldexp(1.0, (int)((b + 5 * (size_t)rank) % 11) * 5 - 25);
    double v = harness_uniform_at(5, (uint64_t)rank, i) * mag;
    if (i % 13 == 5) v *= 1e-6;
    return (float)v;
}

static void run_rank(sumo_comm *comm, int rank, int size, void *arg)
{
    job *j = arg;
    (void)size;
    float *in = j->in[rank], *out = j->out[rank];
    for (size_t i = 0; i < j->n; i++) in[i] = input_value(j, rank, i);
    if (rank == j->nan_rank) in[j->nan_at] = j->nan_at % 2 ? INFINITY : NAN;
    for (size_t i = 0; i < j->n; i++) out[i] = -7.0f; /* untouched unless written */
    sumo_compression c = {.struct_size = sizeof c, .format = j->format, .block_size = j->block,
                          .op = j->op};
    const sumo_compression *opt = &c;
    if (rank == j->bad_options_rank) {
        if (j->format == SUMO_COMPRESS_E3M0) opt = NULL;
        else c.format = j->format == SUMO_COMPRESS_BF16 ? SUMO_COMPRESS_E3M0 : SUMO_COMPRESS_BF16;
    }
    sumo_result r = SUMO_SUCCESS;
    if (j->mode == 2) r = sumo_comm_set_param(comm, SUMO_PARAM_ALGORITHM, SUMO_ALGORITHM_RING);
    if (r == SUMO_SUCCESS) {
        if (j->mode == 1) {
            sumo_request *req = NULL;
            r = sumo_allreduce_compressed_start(in, out, j->n, opt, comm, &req);
            if (r == SUMO_SUCCESS) r = sumo_request_wait(req);
        } else {
            r = sumo_allreduce_compressed(in, out, j->n, opt, comm);
        }
    }
    j->res[rank] = r;
    const char *m = "";
    sumo_comm_error_message(comm, &m);
    snprintf(j->msg[rank], sizeof j->msg[rank], "%s", m);
}

static void job_run(job *j)
{
    for (int r = 0; r < j->P; r++) {
        j->in[r] = malloc((j->n + 1) * sizeof(float));
        j->out[r] = malloc((j->n + 1) * sizeof(float));
        assert_true(j->in[r] && j->out[r]);
    }
    assert_int_equal(harness_run_threads(j->P, run_rank, j), 0);
}

static void job_free(job *j)
{
    for (int r = 0; r < j->P; r++) {
        free(j->in[r]);
        free(j->out[r]);
    }
}

static void format_params(sumo_compression_format f, int *m, int *emin, double *largest)
{
    *m = f == SUMO_COMPRESS_E3M0 ? 0 : f == SUMO_COMPRESS_FP8_E4M3 ? 3 : 7;
    *emin = f == SUMO_COMPRESS_E3M0 ? -2 : f == SUMO_COMPRESS_FP8_E4M3 ? -6 : -126;
    *largest = ref_code_value(f, ref_code_count(f) - 1);
}

/* e(x, A) of the header comment. */
static double codec_error(sumo_compression_format f, double x, double A)
{
    int m, emin;
    double L;
    format_params(f, &m, &emin, &L);
    if (f == SUMO_COMPRESS_BF16) return ldexp(fabs(x), -8) + ldexp(1.0, -134);
    return ldexp(fabs(x), -(m + 1)) + ldexp(fmax(2 * A / L, ldexp(1.0, -149)), emin - m - 1);
}

/* The allreduce's definition, from the references: every rank's input through the codec, the
 * fp32 sum in rank order, divided once, the codec again. */
static void expected(const job *j, float *want)
{
    size_t n = j->n;
    float *acc = calloc(n, sizeof *acc), *t = malloc(n * sizeof *t);
    assert_true(acc && t);
    for (int r = 0; r < j->P; r++) {
        ref_roundtrip(j->format, j->block, j->in[r], t, n);
        for (size_t i = 0; i < n; i++) acc[i] = r ? acc[i] + t[i] : t[i];
    }
    if (j->op == SUMO_OP_AVERAGE)
        for (size_t i = 0; i < n; i++) acc[i] = acc[i] / (float)j->P;
    ref_roundtrip(j->format, j->block, acc, want, n);
    free(acc);
    free(t);
}

/* The derived bound against the exact float64 result. */
static void check_bound(const job *j, const float *got)
{
    size_t n = j->n, B = j->block;
    double P = j->op == SUMO_OP_AVERAGE ? j->P : 1, u = ldexp(1.0, -24);
    double *z = calloc(n, sizeof *z), *e1 = calloc(n, sizeof *e1), *exact = calloc(n, sizeof *exact);
    assert_true(z && e1 && exact);
    for (int r = 0; r < j->P; r++)
        for (size_t b = 0; b * B < n; b++) {
            double A = 0;
            for (size_t i = b * B; i < n && i < (b + 1) * B; i++) A = fmax(A, fabs((double)j->in[r][i]));
            for (size_t i = b * B; i < n && i < (b + 1) * B; i++) {
                double x = j->in[r][i], e = codec_error(j->format, x, A);
                exact[i] += x / P;
                e1[i] += e / P;
                z[i] += (fabs(x) + e) / P; /* (1/P) sum |x~_r| */
            }
        }
    for (size_t b = 0; b * B < n; b++) {
        double Az = 0;
        for (size_t i = b * B; i < n && i < (b + 1) * B; i++) Az = fmax(Az, z[i] * (1 + j->P * u));
        for (size_t i = b * B; i < n && i < (b + 1) * B; i++) {
            double bound = e1[i] + 1.01 * j->P * u * z[i] + codec_error(j->format, z[i] * (1 + j->P * u), Az);
            if (!(fabs((double)got[i] - exact[i]) <= bound))
                fail_msg("%s P %d: element %zu is %.9g, exact %.9g, beyond the bound %.3g",
                         FNAME[j->format], j->P, i, (double)got[i], exact[i], bound);
        }
    }
    free(z);
    free(e1);
    free(exact);
}

static void check_allreduce(int P, sumo_compression_format f, size_t block, size_t n, sumo_op op,
                            int mode)
{
    job j = {.P = P, .format = f, .block = block, .n = n, .op = op, .mode = mode, .nan_rank = -1,
             .bad_options_rank = -1};
    job_run(&j);
    float *want = malloc((n + 1) * sizeof *want);
    assert_non_null(want);
    expected(&j, want);
    for (int r = 0; r < P; r++) {
        if (j.res[r] != SUMO_SUCCESS)
            fail_msg("%s P %d n %zu mode %d: rank %d %s (%s)", FNAME[f], P, n, mode, r,
                     sumo_result_name(j.res[r]), j.msg[r]);
        if (memcmp(j.out[r], j.out[0], n * sizeof(float)) != 0)
            fail_msg("%s P %d n %zu mode %d: rank %d differs from rank 0", FNAME[f], P, n, mode, r);
    }
    for (size_t i = 0; i < n; i++)
        if (fbits(j.out[0][i]) != fbits(want[i]))
            fail_msg("%s P %d n %zu block %zu op %u mode %d: element %zu is %a, the definition "
                     "gives %a", FNAME[f], P, n, block, op, mode, i, (double)j.out[0][i], (double)want[i]);
    check_bound(&j, j.out[0]);
    free(want);
    job_free(&j);
}

static void test_allreduce_definition(void **state)
{
    (void)state;
    const size_t counts[] = {1, 9, 100, 1000, 2051};
    for (int P = 1; P <= MAXP; P++)
        for (size_t fi = 0; fi < 3; fi++)
            for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++) {
                size_t block = ci % 2 ? 8 : 32;
                check_allreduce(P, FORMATS[fi], block, counts[ci], SUMO_OP_AVERAGE, 0);
                check_allreduce(P, FORMATS[fi], block, counts[ci], SUMO_OP_SUM, (int)(ci % 3));
            }
    /* Both algorithms and the asynchronous form on a larger buffer. */
    for (int mode = 0; mode < 3; mode++) check_allreduce(3, SUMO_COMPRESS_E3M0, 128, 40000, SUMO_OP_AVERAGE, mode);
}

/* Representable inputs, the same on every rank, averaged: exactly themselves. */
static void test_allreduce_exact(void **state)
{
    (void)state;
    for (int P = 1; P <= MAXP; P++)
        for (size_t fi = 0; fi < 3; fi++) {
            job j = {.P = P, .format = FORMATS[fi], .block = 8, .n = 203, .op = SUMO_OP_AVERAGE,
                     .mode = P % 3, .nan_rank = -1, .bad_options_rank = -1, .exact = true};
            job_run(&j);
            for (int r = 0; r < P; r++) {
                assert_int_equal(j.res[r], SUMO_SUCCESS);
                for (size_t i = 0; i < j.n; i++)
                    if (fbits(j.out[r][i]) != fbits(j.in[0][i]))
                        fail_msg("%s P %d: representable %a came back %a", FNAME[FORMATS[fi]], P,
                                 (double)j.in[0][i], (double)j.out[r][i]);
            }
            job_free(&j);
        }
}

static void test_allreduce_nonfinite(void **state)
{
    (void)state;
    for (int P = 1; P <= 4; P++)
        for (size_t fi = 0; fi < 3; fi++)
            for (int mode = 0; mode < 3; mode += 2) {
                job j = {.P = P, .format = FORMATS[fi], .block = 8, .n = 77, .op = SUMO_OP_AVERAGE,
                         .mode = mode, .nan_rank = P - 1, .nan_at = 40 + fi,
                         .bad_options_rank = -1};
                job_run(&j);
                for (int r = 0; r < P; r++) {
                    assert_int_equal(j.res[r], SUMO_ERR_NONFINITE);
                    for (size_t i = 0; i < j.n; i++) assert_true(j.out[r][i] == -7.0f);
                }
                char where[64];
                snprintf(where, sizeof where, "element %zu of rank %d", j.nan_at, P - 1);
                if (!strstr(j.msg[P - 1], where)) fail_msg("message '%s' lacks '%s'", j.msg[P - 1], where);
                if (P > 1 && !strstr(j.msg[0], "rank")) fail_msg("peer message '%s'", j.msg[0]);
                job_free(&j);
            }
    /* A sum that overflows fp32: NaN in that block, everywhere, and the verdict on every rank. */
    for (int P = 2; P <= 4; P++)
        for (int mode = 0; mode < 3; mode += 2) {
            job j = {.P = P, .format = SUMO_COMPRESS_FP8_E4M3, .block = 8, .n = 40,
                     .op = SUMO_OP_SUM, .mode = mode, .nan_rank = -1, .bad_options_rank = -1,
                     .huge = true};
            job_run(&j);
            for (int r = 0; r < P; r++) {
                assert_int_equal(j.res[r], SUMO_ERR_NONFINITE);
                assert_memory_equal(j.out[r], j.out[0], j.n * sizeof(float));
                for (size_t i = 0; i < j.n; i++) assert_true(isnan(j.out[r][i]) == (i / 8 == 1));
                assert_non_null(strstr(j.msg[r], "element 8"));
            }
            job_free(&j);
        }
}

static void test_allreduce_refused(void **state)
{
    (void)state;
    for (size_t fi = 0; fi < 3; fi++) {
        job j = {.P = 3, .format = FORMATS[fi], .block = 8, .n = 50, .op = SUMO_OP_AVERAGE,
                 .nan_rank = -1, .bad_options_rank = 1};
        job_run(&j);
        sumo_result want = FORMATS[fi] == SUMO_COMPRESS_E3M0 ? SUMO_ERR_INVALID_ARGUMENT
                                                             : SUMO_ERR_MISMATCH;
        for (int r = 0; r < 3; r++) {
            assert_int_equal(j.res[r], want);
            for (size_t i = 0; i < j.n; i++) assert_true(j.out[r][i] == -7.0f);
        }
        job_free(&j);
    }
    /* Options no rank could run: every rank refuses alike. */
    sumo_comm *c;
    assert_int_equal(sumo_comm_create_threads(1, &c), SUMO_SUCCESS);
    float x[16] = {0};
    sumo_compression o = {.struct_size = sizeof o, .format = SUMO_COMPRESS_E3M0, .block_size = 12,
                          .op = SUMO_OP_AVERAGE};
    assert_int_equal(sumo_allreduce_compressed(x, x, 16, &o, c), SUMO_ERR_INVALID_ARGUMENT);
    o.block_size = 8;
    o.op = SUMO_OP_ADASUM;
    assert_int_equal(sumo_allreduce_compressed(x, x, 16, &o, c), SUMO_ERR_INVALID_ARGUMENT);
    o.op = SUMO_OP_SUM;
    o.format = SUMO_COMPRESS_NONE;
    assert_int_equal(sumo_allreduce_compressed(x, x, 16, &o, c), SUMO_ERR_INVALID_ARGUMENT);
    o.format = SUMO_COMPRESS_E3M0;
    assert_int_equal(sumo_allreduce_compressed(x, x + 1, 8, &o, c), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_allreduce_compressed(x, x, 16, &o, c), SUMO_SUCCESS);
    size_t bytes;
    assert_int_equal(sumo_compressed_bytes(&o, 17, &bytes), SUMO_SUCCESS);
    assert_int_equal(bytes, 3 * (4 + 4)); /* three blocks of 8: a scale and 4 bytes of codes */
    o.format = SUMO_COMPRESS_FP8_E4M3;
    assert_int_equal(sumo_compressed_bytes(&o, 16, &bytes), SUMO_SUCCESS);
    assert_int_equal(bytes, 2 * (4 + 8));
    o.format = SUMO_COMPRESS_BF16;
    assert_int_equal(sumo_compressed_bytes(&o, 16, &bytes), SUMO_SUCCESS);
    assert_int_equal(bytes, 32);
    sumo_comm_destroy(c);
}

/* The arguments every collective's path checks, refused with the call's name and the reason:
 * options of another size, none at all, a NULL buffer, a count whose bytes overflow; blocking
 * and asynchronous alike. The handle stays usable. */
static void test_allreduce_refused_arguments(void **state)
{
    (void)state;
    sumo_comm *c;
    assert_int_equal(sumo_comm_create_threads(1, &c), SUMO_SUCCESS);
    float x[16] = {0};
    const char *m;
    sumo_compression o = {.struct_size = sizeof o, .format = SUMO_COMPRESS_FP8_E4M3,
                          .block_size = 8, .op = SUMO_OP_SUM};
    sumo_compression other = o;
    size_t bytes;
    for (int grow = 0; grow < 2; grow++) {
        other.struct_size = grow ? sizeof o + 8 : 8;
        assert_int_equal(sumo_allreduce_compressed(x, x, 16, &other, c), SUMO_ERR_INVALID_ARGUMENT);
        sumo_comm_error_message(c, &m);
        assert_non_null(strstr(m, "allreduce_compressed"));
        assert_non_null(strstr(m, "sumo_compression.struct_size"));
        assert_int_equal(sumo_compressed_bytes(&other, 16, &bytes), SUMO_ERR_INVALID_ARGUMENT);
    }
    sumo_request *req = NULL;
    assert_int_equal(sumo_allreduce_compressed_start(x, x, 16, &other, c, &req), SUMO_SUCCESS);
    assert_int_equal(sumo_request_wait(req), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_allreduce_compressed_start(x, x, 16, &o, c, NULL),
                     SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_allreduce_compressed(x, x, 16, NULL, c), SUMO_ERR_INVALID_ARGUMENT);
    sumo_comm_error_message(c, &m);
    assert_non_null(strstr(m, "NULL options"));
    assert_int_equal(sumo_allreduce_compressed(NULL, x, 16, &o, c), SUMO_ERR_INVALID_ARGUMENT);
    sumo_comm_error_message(c, &m);
    assert_non_null(strstr(m, "allreduce_compressed: NULL buffer"));
    assert_int_equal(sumo_allreduce_compressed(x, x, SIZE_MAX / 2, &o, c),
                     SUMO_ERR_INVALID_ARGUMENT);
    sumo_comm_error_message(c, &m);
    assert_non_null(strstr(m, "overflows"));
    assert_int_equal(sumo_allreduce_compressed(NULL, NULL, 0, &o, c), SUMO_SUCCESS);
    assert_int_equal(sumo_allreduce_compressed(x, x, 16, &o, c), SUMO_SUCCESS);
    assert_int_equal(sumo_allreduce_compressed(x, x, 16, &o, NULL), SUMO_ERR_INVALID_ARGUMENT);
    sumo_comm_destroy(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_codec_matches_reference),
        cmocka_unit_test(test_codec_edges),
        cmocka_unit_test(test_allreduce_definition),
        cmocka_unit_test(test_allreduce_exact),
        cmocka_unit_test(test_allreduce_nonfinite),
        cmocka_unit_test(test_allreduce_refused),
        cmocka_unit_test(test_allreduce_refused_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
