/*
 * Conversions between the dtypes against references written independently of the library
 * (support/reference.h): the scalar conversions exhaustively over the 16-bit patterns and the
 * floats at and beside every rounding boundary, hand-worked rounding cases, fp64 narrowed in
 * one rounding, and the convert kernel on every instruction-set path this CPU has, the
 * portable one included, for every pair of dtypes on unaligned buffers of awkward lengths.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/kernels_isa.h"
#include "support/kernel_check.h"
#include "support/reference.h"

/* ---- scalar conversions ------------------------------------------------------------------- */

static void test_half_to_float_exhaustive(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = sumo__half_to_float((uint16_t)h);
        double want = ref_half_value((uint16_t)h);
        if (isnan(want)) {
            uint32_t u = fbits(f);
            assert_true(isnan(f));
            assert_int_equal(u >> 31, h >> 15);                    /* sign kept */
            assert_true(u & 0x00400000u);                           /* quiet */
            assert_int_equal((u >> 13) & 0x1ff, h & 0x1ff);         /* payload kept */
        } else {
            assert_true((double)f == want);
            assert_int_equal(signbit(f) != 0, (h >> 15) != 0);
            /* and back: every half round-trips */
            assert_int_equal(sumo__float_to_half(f), h);
        }
    }
}

static void test_bf16_to_float_exhaustive(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = sumo__bf16_to_float((uint16_t)h);
        double want = ref_bf16_value((uint16_t)h);
        if (isnan(want)) {
            assert_true(isnan(f));
            assert_int_equal(fbits(f) >> 31, h >> 15);
            assert_true(ref_is_nan_bf16(sumo__float_to_bf16(f)));
        } else {
            assert_true((double)f == want);
            assert_int_equal(signbit(f) != 0, (h >> 15) != 0);
            assert_int_equal(sumo__float_to_bf16(f), h);
        }
    }
}

/*
 * Floats worth converting: for every 16-bit pattern with its value v and the next one's w,
 * v, the midpoint (a tie), and the floats either side of v and of the midpoint; then random
 * bit patterns of the whole float range. n is returned; buf holds up to 65536 * 6 + extra.
 */
static size_t boundary_floats(float *buf, size_t extra, int bf16)
{
    size_t n = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        double v = bf16 ? ref_bf16_value((uint16_t)h) : ref_half_value((uint16_t)h);
        if (isnan(v) || isinf(v)) continue;
        uint16_t nh = (uint16_t)(h + 1); /* next magnitude with the same sign */
        double w = bf16 ? ref_bf16_value(nh) : ref_half_value(nh);
        if (isnan(w)) continue;
        if (isinf(w)) { /* past the largest finite value: one more step of the same size */
            uint16_t ph = (uint16_t)(h - 1);
            w = v + (v - (bf16 ? ref_bf16_value(ph) : ref_half_value(ph)));
        }
        float fv = (float)v, mid = (float)((v + w) / 2);
        assert_true((double)mid == (v + w) / 2); /* ties are exact in fp32 */
        buf[n++] = fv;
        buf[n++] = nextafterf(fv, INFINITY);
        buf[n++] = nextafterf(fv, -INFINITY);
        buf[n++] = mid;
        buf[n++] = nextafterf(mid, INFINITY);
        buf[n++] = nextafterf(mid, -INFINITY);
    }
    uint64_t s = 12345;
    for (size_t i = 0; i < extra; i++) buf[n++] = ffrom((uint32_t)rng_next(&s));
    return n;
}

static void check_narrowing(const float *xs, size_t n, int bf16)
{
    for (size_t i = 0; i < n; i++) {
        float x = xs[i];
        uint16_t got = bf16 ? sumo__float_to_bf16(x) : sumo__float_to_half(x);
        if (isnan(x)) {
            if (!(bf16 ? ref_is_nan_bf16(got) : ref_is_nan_half(got)))
                fail_msg("NaN %08x became %04x", fbits(x), got);
            assert_int_equal(got >> 15, fbits(x) >> 31);
            continue;
        }
        uint16_t want = bf16 ? ref_round_bf16(x) : ref_round_half(x);
        if (got != want) fail_msg("%a (%08x): got %04x want %04x", x, fbits(x), got, want);
    }
}

static void test_float_to_half_rne(void **state)
{
    (void)state;
    float *xs = malloc(sizeof(float) * (65536 * 6 + 1000000));
    assert_non_null(xs);
    size_t n = boundary_floats(xs, 1000000, 0);
    check_narrowing(xs, n, 0);
    free(xs);
}

static void test_float_to_bf16_rne(void **state)
{
    (void)state;
    float *xs = malloc(sizeof(float) * (65536 * 6 + 1000000));
    assert_non_null(xs);
    size_t n = boundary_floats(xs, 1000000, 1);
    check_narrowing(xs, n, 1);
    free(xs);
}

/* Worked by hand from the bit layouts; the comments give the reasoning. */
static void test_rounding_hand_cases(void **state)
{
    (void)state;
    /* fp16 has 10 fraction bits: 1 + 2^-11 is halfway between 1 (0x3c00, even) and
     * 1 + 2^-10 (0x3c01): down; 1 + 3*2^-11 is halfway between 0x3c01 and 0x3c02: up. */
    assert_int_equal(sumo__float_to_half(1.0f + 0x1p-11f), 0x3c00);
    assert_int_equal(sumo__float_to_half(1.0f + 3 * 0x1p-11f), 0x3c02);
    assert_int_equal(sumo__float_to_half(nextafterf(1.0f + 0x1p-11f, 2)), 0x3c01);
    /* 65504 = 0x7bff is the largest half; 65520 is halfway to 65536 and ties to even: Inf. */
    assert_int_equal(sumo__float_to_half(65504.0f), 0x7bff);
    assert_int_equal(sumo__float_to_half(65519.996f), 0x7bff);
    assert_int_equal(sumo__float_to_half(65520.0f), 0x7c00);
    assert_int_equal(sumo__float_to_half(-65520.0f), 0xfc00);
    assert_int_equal(sumo__float_to_half(1e10f), 0x7c00);
    assert_int_equal(sumo__float_to_half(INFINITY), 0x7c00);
    /* Subnormals step by 2^-24: 2^-25 ties to 0, 3*2^-25 ties to 2, just above 2^-25 is 1. */
    assert_int_equal(sumo__float_to_half(0x1p-25f), 0x0000);
    assert_int_equal(sumo__float_to_half(-0x1p-25f), 0x8000);
    assert_int_equal(sumo__float_to_half(3 * 0x1p-25f), 0x0002);
    assert_int_equal(sumo__float_to_half(nextafterf(0x1p-25f, 1)), 0x0001);
    assert_int_equal(sumo__float_to_half(0x1p-24f), 0x0001);
    /* 1023.5 * 2^-24 ties between 0x03ff and the smallest normal 0x0400 (even): up. */
    assert_int_equal(sumo__float_to_half(1023.5f * 0x1p-24f), 0x0400);
    assert_true(sumo__half_to_float(0x0001) == 0x1p-24f);
    assert_true(sumo__half_to_float(0x03ff) == 1023 * 0x1p-24f);
    assert_true(sumo__half_to_float(0x3555) == 0x1.554p-2f);
    /* NaNs stay NaN and quiet: 0x7f800001 keeps none of its payload in the top bits. */
    assert_int_equal(sumo__float_to_half(ffrom(0x7f800001u)), 0x7e00);
    assert_int_equal(sumo__float_to_half(ffrom(0xffc00000u)), 0xfe00);

    /* bf16 has 7 fraction bits: 0x3f808000 = 1 + 2^-8 is halfway between 0x3f80 (even) and
     * 0x3f81: down; 0x3f818000 halfway between 0x3f81 and 0x3f82: up. */
    assert_int_equal(sumo__float_to_bf16(ffrom(0x3f808000u)), 0x3f80);
    assert_int_equal(sumo__float_to_bf16(ffrom(0x3f818000u)), 0x3f82);
    assert_int_equal(sumo__float_to_bf16(ffrom(0x3f808001u)), 0x3f81);
    assert_int_equal(sumo__float_to_bf16(ffrom(0xbf818000u)), 0xbf82);
    /* The largest bf16 0x7f7f plus half an ulp ties up (0x7f7f is odd) to Inf. */
    assert_int_equal(sumo__float_to_bf16(ffrom(0x7f7f8000u)), 0x7f80);
    assert_int_equal(sumo__float_to_bf16(ffrom(0x7f7f7fffu)), 0x7f7f);
    assert_int_equal(sumo__float_to_bf16(FLT_MAX), 0x7f80);
    /* A NaN whose payload is all in the dropped half must not carry into Inf. */
    assert_int_equal(sumo__float_to_bf16(ffrom(0x7f800001u)), 0x7fc0);
    assert_int_equal(sumo__float_to_bf16(ffrom(0xff80ffffu)), 0xffc0);
    assert_int_equal(sumo__float_to_bf16(ffrom(0xffffffffu)), 0xffff);
    /* bf16 subnormals are fp32 subnormals cut short: 0x00008000 ties to 0, 0x00018000 to 2. */
    assert_int_equal(sumo__float_to_bf16(ffrom(0x00008000u)), 0x0000);
    assert_int_equal(sumo__float_to_bf16(ffrom(0x00018000u)), 0x0002);
    assert_int_equal(sumo__float_to_bf16(ffrom(0x007fffffu)), 0x0080);
}

/* fp64 -> fp16/bf16 rounds once: through fp32 with two RNE steps these would tie down. */
static void test_double_narrowing_single_rounding(void **state)
{
    (void)state;
    double x = 1.0 + 0x1p-11 + 0x1p-40; /* (float)x == 1 + 2^-11, a tie, but x is above it */
    assert_int_equal(sumo__double_to_half(x), 0x3c01);
    assert_int_equal(sumo__double_to_half(-x), 0xbc01);
    assert_int_equal(sumo__double_to_half(1.0 + 0x1p-11), 0x3c00);
    double y = 1.0 + 0x1p-8 + 0x1p-40;
    assert_int_equal(sumo__double_to_bf16(y), 0x3f81);
    assert_int_equal(sumo__double_to_half(65519.99999), 0x7bff);
    assert_int_equal(sumo__double_to_half(1e300), 0x7c00);
    assert_int_equal(sumo__double_to_bf16(1e300), 0x7f80);
    assert_int_equal(sumo__double_to_bf16(-1e-300), 0x8000);
    assert_int_equal(sumo__double_to_half(0x1p-25 + 0x1p-60), 0x0001);
    assert_true(ref_is_nan_half(sumo__double_to_half(NAN)));
    assert_true(ref_is_nan_bf16(sumo__double_to_bf16(NAN)));
    /* and against the reference on random doubles near the fp16/bf16 grids */
    uint64_t s = 99;
    for (int i = 0; i < 200000; i++) {
        double d = ldexp(1.0 + rng_unit(&s), (int)(rng_next(&s) % 60) - 30);
        if (rng_next(&s) & 1) d = -d;
        assert_int_equal(sumo__double_to_half(d), ref_round_half(d));
        assert_int_equal(sumo__double_to_bf16(d), ref_round_bf16(d));
    }
}

/* ---- convert ------------------------------------------------------------------------------ */

/*
 * The NaN conventions every path follows, as F16C's vcvtph2ps / vcvtps2ph define them with
 * round-to-nearest-even (and bf16 as the upper half of an fp32): widening fp16 keeps the sign
 * and the 10 payload bits at the top of the fraction and sets the quiet bit; widening bf16
 * appends 16 zero bits; narrowing keeps the sign and the top of the fraction and sets the
 * quiet bit. Written from those definitions, not from the kernels.
 */
static uint32_t nan_half_to_f32(uint16_t h)
{
    return ((uint32_t)(h & 0x8000u) << 16) | 0x7fc00000u | ((uint32_t)(h & 0x3ffu) << 13);
}

static uint16_t nan_f32_to_half(uint32_t u)
{
    return (uint16_t)(((u >> 16) & 0x8000u) | 0x7e00u | ((u >> 13) & 0x3ffu));
}

static uint16_t nan_f32_to_bf16(uint32_t u)
{
    return (uint16_t)(((u >> 16) & 0x8000u) | 0x7fc0u | ((u >> 16) & 0x7fu));
}

/* Every path converts every 16-bit pattern and every boundary float as the references say,
 * bit for bit: the value (support/reference.c) for numbers, the conventions above for NaN
 * (so the paths also agree on NaN payloads). */
static void test_convert_paths_exhaustive(void **state)
{
    (void)state;
    sumo__isa isas[SUMO__ISA_COUNT];
    int np = paths(isas);
    const size_t nx = 65536 * 6 + 100000;
    uint16_t *h = malloc(65536 * 2 + 64);
    float *f = malloc(65536 * 4 + 64), *xs = malloc(nx * 4);
    uint16_t *hx = malloc(nx * 2);
    assert_true(h && f && xs && hx);
    for (uint32_t i = 0; i < 65536; i++) h[i] = (uint16_t)i;
    for (int p = 0; p < np; p++) {
        for (int bf = 0; bf < 2; bf++) {
            sumo_dtype dt = bf ? SUMO_BFLOAT16 : SUMO_FLOAT16;
            sumo__kernel_convert_isa(isas[p], SUMO_FLOAT32, f, dt, h, 65536);
            for (uint32_t i = 0; i < 65536; i++) {
                uint16_t hi = (uint16_t)i;
                double v = bf ? ref_bf16_value(hi) : ref_half_value(hi);
                uint32_t want;
                if (isnan(v)) want = bf ? (uint32_t)hi << 16 : nan_half_to_f32(hi);
                else want = fbits((float)v); /* exact: both formats fit in fp32; keeps -0 */
                if (fbits(f[i]) != want)
                    fail_msg("%s %s->f32 %04x: %08x want %08x", sumo__kernel_isa_name(isas[p]),
                             sumo_dtype_name(dt), i, fbits(f[i]), want);
            }
            size_t n = boundary_floats(xs, 100000, bf);
            /* plus every NaN shape and the specials */
            xs[n - 1] = ffrom(0x7f800001u);
            xs[n - 2] = ffrom(0xffbfffffu);
            xs[n - 3] = ffrom(0x7fc00000u);
            xs[n - 4] = INFINITY;
            xs[n - 5] = -INFINITY;
            sumo__kernel_convert_isa(isas[p], dt, hx, SUMO_FLOAT32, xs, n);
            for (size_t i = 0; i < n; i++) {
                uint16_t want;
                uint32_t u = fbits(xs[i]);
                if (isnan(xs[i])) want = bf ? nan_f32_to_bf16(u) : nan_f32_to_half(u);
                else want = bf ? ref_round_bf16(xs[i]) : ref_round_half(xs[i]);
                if (hx[i] != want)
                    fail_msg("%s f32->%s %08x: %04x want %04x", sumo__kernel_isa_name(isas[p]),
                             sumo_dtype_name(dt), fbits(xs[i]), hx[i], want);
            }
        }
    }
    free(h);
    free(f);
    free(xs);
    free(hx);
}

/* All 16 dtype pairs, every path, odd lengths, unaligned; fp16 <-> bf16 also in place. */
static void test_convert_all_pairs(void **state)
{
    (void)state;
    sumo__isa isas[SUMO__ISA_COUNT];
    int np = paths(isas);
    uint64_t s = 7;
    for (int p = 0; p < np; p++)
        for (int di = 0; di < 4; di++)
            for (int si = 0; si < 4; si++)
                for (size_t z = 0; z < NSIZES; z++) {
                    sumo_dtype dd = dtypes[di], sd = dtypes[si];
                    size_t n = sizes[z];
                    ubuf src = ubuf_new(sd, n), dst = ubuf_new(dd, n);
                    fill_random(sd, src.p, n, &s);
                    if (n > 3) { /* specials */
                        put(sd, src.p, 0, NAN);
                        put(sd, src.p, 1, -INFINITY);
                        put(sd, src.p, 2, -0.0);
                    }
                    sumo__kernel_convert_isa(isas[p], dd, dst.p, sd, src.p, n);
                    for (size_t i = 0; i < n; i++) {
                        double v = get(sd, src.p, i);
                        /* fp64 -> fp32 is C's cast; the 16-bit targets round v once */
                        if (dd == SUMO_FLOAT32) v = (double)(float)v;
                        expect_elem(dd, dst.p, i, v, "convert", isas[p]);
                    }
                    if (n > 3 && dd == SUMO_FLOAT32 && sd != SUMO_FLOAT64)
                        assert_true(signbit(((float *)dst.p)[2]));
                    if (sumo__dtype_bytes(dd) == 2 && sumo__dtype_bytes(sd) == 2 && dd != sd) {
                        /* in place: the result must equal the out-of-place one */
                        sumo__kernel_convert_isa(isas[p], dd, src.p, sd, src.p, n);
                        assert_memory_equal(src.p, dst.p, n * 2);
                    }
                    free(src.base);
                    free(dst.base);
                }
}
int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_half_to_float_exhaustive),
        cmocka_unit_test(test_bf16_to_float_exhaustive),
        cmocka_unit_test(test_float_to_half_rne),
        cmocka_unit_test(test_float_to_bf16_rne),
        cmocka_unit_test(test_rounding_hand_cases),
        cmocka_unit_test(test_double_narrowing_single_rounding),
        cmocka_unit_test(test_convert_paths_exhaustive),
        cmocka_unit_test(test_convert_all_pairs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
