/*
 * Kernels against references written here, independently of the library: half and bf16
 * values decoded with ldexp and rounded with frexp/nearbyint (not bit tricks), sums and
 * products in plain C. Every kernel runs on every instruction-set path this CPU has, the
 * portable one included, on unaligned buffers of awkward lengths.
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
#include "support/reference.h"

static const size_t sizes[] = {0, 1, 2, 7, 15, 16, 17, 31, 33, 64, 1023, 2049, 4099, 10007};
#define NSIZES (sizeof sizes / sizeof sizes[0])

static const sumo_dtype dtypes[] = {SUMO_FLOAT32, SUMO_FLOAT64, SUMO_FLOAT16, SUMO_BFLOAT16};

/* ---- bits (the formats' references are in support/reference.h) ------------------------- */

static uint32_t fbits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float ffrom(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint64_t dbits(double d)
{
    uint64_t u;
    memcpy(&u, &d, 8);
    return u;
}

/* ---- buffers ------------------------------------------------------------------------------ */

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double rng_unit(uint64_t *s) { return (double)(rng_next(s) >> 11) * 0x1p-53; }

/* An allocation plus one element, handed out one element in, so vectors are never aligned. */
typedef struct {
    void *base;
    void *p;
} ubuf;

static ubuf ubuf_new(sumo_dtype dt, size_t n)
{
    size_t esz = sumo__dtype_bytes(dt);
    ubuf b;
    b.base = malloc((n + 1) * esz + 64);
    assert_non_null(b.base);
    b.p = (char *)b.base + esz;
    return b;
}

static double get(sumo_dtype dt, const void *p, size_t i)
{
    switch (dt) {
    case SUMO_FLOAT32: return ((const float *)p)[i];
    case SUMO_FLOAT64: return ((const double *)p)[i];
    case SUMO_FLOAT16: return ref_half_value(((const uint16_t *)p)[i]);
    default: return ref_bf16_value(((const uint16_t *)p)[i]);
    }
}

/* Stores v, which must already be representable (or be rounded by the reference). */
static void put(sumo_dtype dt, void *p, size_t i, double v)
{
    switch (dt) {
    case SUMO_FLOAT32: ((float *)p)[i] = (float)v; break;
    case SUMO_FLOAT64: ((double *)p)[i] = v; break;
    case SUMO_FLOAT16: ((uint16_t *)p)[i] = ref_round_half(v); break;
    default: ((uint16_t *)p)[i] = ref_round_bf16(v); break;
    }
}

/* Mostly moderate values of random magnitude, sometimes a random finite bit pattern. */
static void fill_random(sumo_dtype dt, void *p, size_t n, uint64_t *s)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t r = rng_next(s);
        if ((r & 15) == 0) {
            switch (dt) {
            case SUMO_FLOAT32: {
                uint32_t u = (uint32_t)(r >> 32);
                if (((u >> 23) & 0xff) == 0xff) u &= 0xbfffffffu;
                ((float *)p)[i] = ffrom(u);
                break;
            }
            case SUMO_FLOAT64:
                ((double *)p)[i] = ldexp(rng_unit(s) - 0.5, (int)((r >> 40) % 600) - 300);
                break;
            case SUMO_FLOAT16: {
                uint16_t h = (uint16_t)(r >> 40);
                if (((h >> 10) & 31) == 31) h &= 0xbfff;
                ((uint16_t *)p)[i] = h;
                break;
            }
            default: {
                uint16_t h = (uint16_t)(r >> 40);
                if (((h >> 7) & 255) == 255) h &= 0xbfff;
                ((uint16_t *)p)[i] = h;
                break;
            }
            }
        } else {
            put(dt, p, i, ldexp(rng_unit(s) * 8 - 4, (int)((r >> 8) % 17) - 8));
        }
    }
}

/*
 * Compares out[i] with the accumulator-type value acc (a float for fp32/fp16/bf16, held in a
 * double exactly), narrowed by the reference rounding. NaN only has to be NaN.
 */
static void expect_elem(sumo_dtype dt, const void *out, size_t i, double acc, const char *what,
                        sumo__isa isa)
{
    int ok;
    switch (dt) {
    case SUMO_FLOAT32: {
        float got = ((const float *)out)[i];
        ok = isnan(acc) ? isnan(got) : fbits(got) == fbits((float)acc);
        break;
    }
    case SUMO_FLOAT64: {
        double got = ((const double *)out)[i];
        ok = isnan(acc) ? isnan(got) : dbits(got) == dbits(acc);
        break;
    }
    case SUMO_FLOAT16: {
        uint16_t got = ((const uint16_t *)out)[i];
        ok = isnan(acc) ? ref_is_nan_half(got) : got == ref_round_half(acc);
        break;
    }
    default: {
        uint16_t got = ((const uint16_t *)out)[i];
        ok = isnan(acc) ? ref_is_nan_bf16(got) : got == ref_round_bf16(acc);
        break;
    }
    }
    if (!ok)
        fail_msg("%s: %s dtype %s element %zu: got %a, want %a", what, sumo__kernel_isa_name(isa),
                 sumo_dtype_name(dt), i, get(dt, out, i), acc);
}

/* The paths this CPU can run, portable first. */
static int paths(sumo__isa out[SUMO__ISA_COUNT])
{
    int k = 0;
    for (int i = 0; i <= (int)sumo__kernel_isa_best(); i++) out[k++] = (sumo__isa)i;
    return k;
}

/* ---- the path report ---------------------------------------------------------------------- */

static void test_isa_report(void **state)
{
    (void)state;
    const char *name = sumo__kernel_isa();
    assert_string_equal(name, sumo__kernel_isa_name(sumo__kernel_isa_best()));
    assert_true(!strcmp(name, "avx512") || !strcmp(name, "avx2") || !strcmp(name, "portable"));
    print_message("kernels dispatch to: %s\n", name);
#if SUMO__KERNELS_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) assert_string_equal(name, "avx512");
    else if (__builtin_cpu_supports("avx2")) assert_string_equal(name, "avx2");
#endif
    /* Asking for a path the CPU lacks runs the best one it has rather than faulting. */
    float a[3] = {1, 2, 3}, b[3] = {4, 5, 6};
    const void *ins[2] = {a, b};
    void *outs[1] = {a};
    sumo__reduce_multi_isa(SUMO__ISA_AVX512, SUMO_FLOAT32, outs, 1, ins, 2, 3, 1);
    assert_true(a[0] == 5 && a[1] == 7 && a[2] == 9);
}

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

/* ---- reduce_multi ------------------------------------------------------------------------- */

/* The reference for outs: the ins summed left to right in the accumulator type, divided once
 * (support/reference.c). */
static double ref_reduce_elem(sumo_dtype dt, void *const *copies, int nin, size_t i, int divisor)
{
    double v[16];
    for (int j = 0; j < nin; j++) v[j] = get(dt, copies[j], i);
    return ref_sum_in_order(dt, v, nin, divisor);
}

#define MAXP 8

/*
 * One reduce_multi call checked against the reference. alias: 0 separate outputs, 1 outs[k]
 * == ins[k] for k < min(nin, nout), 2 outs[0] == ins[nin-1] (a different index).
 */
static void run_reduce(sumo__isa isa, sumo_dtype dt, size_t n, int nin, int nout, int divisor,
                       int alias, uint64_t *s)
{
    ubuf in[MAXP], out[MAXP];
    void *copies[MAXP];
    const void *ins[MAXP];
    void *outs[MAXP];
    size_t bytes = n * sumo__dtype_bytes(dt);
    for (int j = 0; j < nin; j++) {
        in[j] = ubuf_new(dt, n);
        fill_random(dt, in[j].p, n, s);
        copies[j] = malloc(bytes + 1);
        assert_non_null(copies[j]);
        memcpy(copies[j], in[j].p, bytes);
        ins[j] = in[j].p;
    }
    for (int k = 0; k < nout; k++) {
        out[k] = ubuf_new(dt, n);
        outs[k] = out[k].p;
    }
    if (alias == 1)
        for (int k = 0; k < nout && k < nin; k++) outs[k] = in[k].p;
    if (alias == 2) outs[0] = in[nin - 1].p;
    sumo__reduce_multi_isa(isa, dt, outs, nout, ins, nin, n, divisor);
    for (int k = 0; k < nout; k++)
        for (size_t i = 0; i < n; i++)
            expect_elem(dt, outs[k], i, ref_reduce_elem(dt, copies, nin, i, divisor),
                        "reduce_multi", isa);
    /* inputs that are not outputs are untouched */
    for (int j = 0; j < nin; j++) {
        int is_out = 0;
        for (int k = 0; k < nout; k++) is_out |= outs[k] == ins[j];
        if (!is_out) assert_memory_equal(ins[j], copies[j], bytes);
    }
    for (int j = 0; j < nin; j++) {
        free(in[j].base);
        free(copies[j]);
    }
    for (int k = 0; k < nout; k++) free(out[k].base);
}

static void test_reduce_multi_random(void **state)
{
    (void)state;
    static const int shapes[][2] = {{1, 1}, {2, 1}, {2, 2}, {1, 3}, {3, 2}, {4, 4},
                                    {5, 1}, {5, 5}, {8, 2}, {2, 6}};
    static const int divisors[] = {1, 3, 7};
    sumo__isa isas[SUMO__ISA_COUNT];
    int np = paths(isas);
    uint64_t s = 1;
    for (int p = 0; p < np; p++)
        for (int d = 0; d < 4; d++)
            for (size_t z = 0; z < NSIZES; z++)
                for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++)
                    for (int v = 0; v < 3; v++)
                        run_reduce(isas[p], dtypes[d], sizes[z], shapes[sh][0], shapes[sh][1],
                                   divisors[v], 0, &s);
}

/* outs == ins (the P-way in-place allreduce), and an output aliasing another index's input. */
static void test_reduce_multi_aliasing(void **state)
{
    (void)state;
    static const size_t ns[] = {1, 17, 1023, 4099, 10007};
    sumo__isa isas[SUMO__ISA_COUNT];
    int np = paths(isas);
    uint64_t s = 2;
    for (int p = 0; p < np; p++)
        for (int d = 0; d < 4; d++)
            for (size_t z = 0; z < sizeof ns / sizeof ns[0]; z++)
                for (int P = 1; P <= MAXP; P++) {
                    run_reduce(isas[p], dtypes[d], ns[z], P, P, P, 1, &s);
                    run_reduce(isas[p], dtypes[d], ns[z], P, P, 1, 1, &s);
                    run_reduce(isas[p], dtypes[d], ns[z], P, 1, 1, 2, &s);
                    run_reduce(isas[p], dtypes[d], ns[z], P, 6, 1, 2, &s);
                }
}

/* NaN, Inf and overflow propagate per element, in every dtype and path. */
static void test_reduce_multi_specials(void **state)
{
    (void)state;
    sumo__isa isas[SUMO__ISA_COUNT];
    int np = paths(isas);
    enum { N = 37 };
    for (int p = 0; p < np; p++)
        for (int d = 0; d < 4; d++)
            for (int nin = 2; nin <= 6; nin += 4) {
                sumo_dtype dt = dtypes[d];
                double big = dt == SUMO_FLOAT16    ? 60000.0
                             : dt == SUMO_FLOAT64  ? DBL_MAX
                             : dt == SUMO_BFLOAT16 ? 0x1.fep127 /* the largest bf16 */
                                                   : (double)FLT_MAX;
                ubuf a = ubuf_new(dt, N), b = ubuf_new(dt, N);
                for (size_t i = 0; i < N; i++) {
                    put(dt, a.p, i, (double)i);
                    put(dt, b.p, i, 1.0);
                }
                /* spread over vector and tail positions */
                put(dt, a.p, 3, NAN);        /* NaN + x */
                put(dt, b.p, 20, NAN);       /* x + NaN */
                put(dt, a.p, 5, INFINITY);   /* Inf + x */
                put(dt, a.p, 6, INFINITY);   /* Inf + -Inf */
                put(dt, b.p, 6, -INFINITY);
                put(dt, a.p, 17, big);       /* overflow */
                put(dt, b.p, 17, big);
                put(dt, a.p, 36, -big);
                put(dt, b.p, 36, -big);
                const void *ins[6] = {a.p, b.p, b.p, b.p, b.p, b.p};
                ubuf o = ubuf_new(dt, N);
                void *outs[1] = {o.p};
                sumo__reduce_multi_isa(isas[p], dt, outs, 1, ins, nin, N, 1);
                assert_true(isnan(get(dt, o.p, 3)));
                assert_true(isnan(get(dt, o.p, 20)));
                assert_true(get(dt, o.p, 5) == INFINITY);
                assert_true(isnan(get(dt, o.p, 6)));
                assert_true(get(dt, o.p, 17) == INFINITY);
                assert_true(get(dt, o.p, 36) == -INFINITY);
                assert_true(get(dt, o.p, 7) == 7.0 + nin - 1);
                free(a.base);
                free(b.base);
                free(o.base);
            }
}

/*
 * The divisor divides, correctly rounded: (1 + 2^-22) / 3 is 0x3eaaaaad, while multiplying by
 * the rounded reciprocal 0x3eaaaaab gives 0x3eaaaaae. Worked by hand: in units of 2^-25,
 * (1 + 2^-22)/3 = 2^25/3 + 8/3 = 11184813.33, rounding to 0xaaaaad. fp64: (1 + 2^-52) / 3
 * is 0x1.5555555555557p-2, the reciprocal route 0x1.5555555555556p-2.
 */
static void test_reduce_multi_divisor_rounding(void **state)
{
    (void)state;
    sumo__isa isas[SUMO__ISA_COUNT];
    int np = paths(isas);
    for (int p = 0; p < np; p++)
        for (size_t n = 1; n <= 40; n += 13) {
            float f[40], z[40];
            double d[40], dz[40];
            for (size_t i = 0; i < n; i++) {
                f[i] = ffrom(0x3f800002u);
                z[i] = 0;
                d[i] = 1.0 + 0x1p-52;
                dz[i] = 0;
            }
            const void *fins[3] = {f, z, z}, *dins[3] = {d, dz, dz};
            void *fouts[1] = {f}, *douts[1] = {d};
            sumo__reduce_multi_isa(isas[p], SUMO_FLOAT32, fouts, 1, fins, 3, n, 3);
            sumo__reduce_multi_isa(isas[p], SUMO_FLOAT64, douts, 1, dins, 3, n, 3);
            for (size_t i = 0; i < n; i++) {
                assert_int_equal(fbits(f[i]), 0x3eaaaaadu);
                assert_true(d[i] == 0x1.5555555555557p-2);
            }
        }
    float x[5] = {1.0f + 0x1p-22f, 1, 2, 3, 4};
    sumo__kernel_divide(SUMO_FLOAT32, x, x, 5, 3);
    assert_int_equal(fbits(x[0]), 0x3eaaaaadu);
    assert_true(x[3] == 1.0f);
}

static void test_add_and_divide(void **state)
{
    (void)state;
    const sumo__isa best = sumo__kernel_isa_best();
    uint64_t s = 3;
    for (int d = 0; d < 4; d++)
        for (size_t z = 0; z < NSIZES; z++) {
            sumo_dtype dt = dtypes[d];
            size_t n = sizes[z], bytes = n * sumo__dtype_bytes(dt);
            ubuf a = ubuf_new(dt, n), b = ubuf_new(dt, n), c = ubuf_new(dt, n);
            fill_random(dt, a.p, n, &s);
            fill_random(dt, b.p, n, &s);
            void *ca = malloc(bytes + 1), *cb = malloc(bytes + 1);
            assert_true(ca && cb);
            memcpy(ca, a.p, bytes);
            memcpy(cb, b.p, bytes);
            void *pair[2] = {ca, cb};
            sumo__kernel_add(dt, c.p, a.p, b.p, n); /* separate */
            for (size_t i = 0; i < n; i++)
                expect_elem(dt, c.p, i, ref_reduce_elem(dt, pair, 2, i, 1), "add", best);
            sumo__kernel_add(dt, b.p, a.p, b.p, n); /* dst == b */
            assert_memory_equal(b.p, c.p, bytes);
            memcpy(b.p, cb, bytes);
            sumo__kernel_add(dt, a.p, a.p, b.p, n); /* dst == a */
            assert_memory_equal(a.p, c.p, bytes);
            /* divide in place and out of place; by 1 it copies */
            memcpy(a.p, ca, bytes);
            sumo__kernel_divide(dt, c.p, a.p, n, 5);
            sumo__kernel_divide(dt, a.p, a.p, n, 5);
            assert_memory_equal(a.p, c.p, bytes);
            for (size_t i = 0; i < n; i++)
                expect_elem(dt, a.p, i, ref_reduce_elem(dt, &ca, 1, i, 5), "divide", best);
            sumo__kernel_divide(dt, c.p, cb, n, 1);
            assert_memory_equal(c.p, cb, bytes);
            sumo__kernel_divide(dt, c.p, c.p, n, 1);
            assert_memory_equal(c.p, cb, bytes);
            free(a.base);
            free(b.base);
            free(c.base);
            free(ca);
            free(cb);
        }
}

/* ---- dot_norms ---------------------------------------------------------------------------- */

/* Within (n + 8) ulps of the sum of magnitudes: the bound for any order of double sums. */
static void expect_close(double got, double want, double mag, size_t n, const char *what,
                         sumo__isa isa, sumo_dtype dt)
{
    double tol = (double)(n + 8) * DBL_EPSILON * mag + DBL_MIN;
    if (!(fabs(got - want) <= tol))
        fail_msg("%s %s %s n=%zu: got %.17g want %.17g (tol %g)", what, sumo__kernel_isa_name(isa),
                 sumo_dtype_name(dt), n, got, want, tol);
}

static void test_dot_norms_random(void **state)
{
    (void)state;
    sumo__isa isas[SUMO__ISA_COUNT];
    int np = paths(isas);
    uint64_t s = 4;
    for (int d = 0; d < 4; d++)
        for (size_t z = 0; z < NSIZES; z++) {
            sumo_dtype dt = dtypes[d];
            size_t n = sizes[z], bytes = n * sumo__dtype_bytes(dt);
            ubuf a = ubuf_new(dt, n), b = ubuf_new(dt, n);
            fill_random(dt, a.p, n, &s);
            fill_random(dt, b.p, n, &s);
            /* reference: long double sums, magnitudes for the bound */
            long double dot = 0, aa = 0, bb = 0;
            double mdot = 0;
            for (size_t i = 0; i < n; i++) {
                double x = get(dt, a.p, i), y = get(dt, b.p, i);
                dot += (long double)x * y;
                aa += (long double)x * x;
                bb += (long double)y * y;
                mdot += fabs(x * y);
            }
            /* the same data one element further on, to check alignment changes nothing */
            char *shifted = malloc(bytes + 64);
            assert_non_null(shifted);
            void *a2 = shifted + 8 + sumo__dtype_bytes(dt);
            memcpy(a2, a.p, bytes);
            for (int p = 0; p < np; p++) {
                double out[3] = {-1, -1, -1}, out2[3];
                sumo__kernel_dot_norms_isa(isas[p], dt, a.p, b.p, n, out);
                expect_close(out[0], (double)dot, mdot, n, "dot", isas[p], dt);
                expect_close(out[1], (double)aa, (double)aa, n, "|a|^2", isas[p], dt);
                expect_close(out[2], (double)bb, (double)bb, n, "|b|^2", isas[p], dt);
                sumo__kernel_dot_norms_isa(isas[p], dt, a2, b.p, n, out2);
                assert_memory_equal(out, out2, sizeof out);
            }
            double pub[3];
            sumo__kernel_dot_norms(dt, a.p, b.p, n, pub);
            expect_close(pub[0], (double)dot, mdot, n, "dot", sumo__kernel_isa_best(), dt);
            free(shifted);
            free(a.base);
            free(b.base);
        }
}

/* Squares that would underflow or overflow in fp32 are fine in double; NaN and Inf show. */
static void test_dot_norms_specials(void **state)
{
    (void)state;
    sumo__isa isas[SUMO__ISA_COUNT];
    int np = paths(isas);
    enum { N = 1001 };
    for (int p = 0; p < np; p++)
        for (int d = 0; d < 4; d++) {
            sumo_dtype dt = dtypes[d];
            ubuf a = ubuf_new(dt, N), b = ubuf_new(dt, N);
            /* the smallest positive subnormal of each format, and a large value */
            double tiny = dt == SUMO_FLOAT16 ? 0x1p-24
                          : dt == SUMO_FLOAT64 ? 0x1p-1074 * 0x1p+600
                          : dt == SUMO_BFLOAT16 ? 0x1p-133
                                                : 0x1p-149;
            double huge = dt == SUMO_FLOAT16 ? 32768.0 : dt == SUMO_FLOAT64 ? 0x1p+400 : 0x1p+100;
            for (size_t i = 0; i < N; i++) {
                put(dt, a.p, i, tiny);
                put(dt, b.p, i, i % 2 ? huge : -huge);
            }
            double out[3];
            sumo__kernel_dot_norms_isa(isas[p], dt, a.p, b.p, N, out);
            assert_true(out[0] == -tiny * huge);        /* 501 negative, 500 positive terms */
            assert_true(out[1] == N * tiny * tiny);     /* exact: powers of two */
            assert_true(out[2] == N * huge * huge);
            put(dt, a.p, 777, INFINITY);
            sumo__kernel_dot_norms_isa(isas[p], dt, a.p, b.p, N, out);
            assert_true(isinf(out[0]) && out[1] == INFINITY);
            put(dt, b.p, 1000, NAN); /* the scalar tail */
            sumo__kernel_dot_norms_isa(isas[p], dt, a.p, b.p, N, out);
            assert_true(isnan(out[0]) && isnan(out[2]));
            out[0] = out[1] = out[2] = 42;
            sumo__kernel_dot_norms_isa(isas[p], dt, a.p, b.p, 0, out);
            assert_true(out[0] == 0 && out[1] == 0 && out[2] == 0);
            free(a.base);
            free(b.base);
        }
}

/* ---- scaled_add --------------------------------------------------------------------------- */

static double ref_scaled(sumo_dtype dt, double x, double ca, double y, double cb)
{
    switch (dt) {
    case SUMO_FLOAT64: return fma(ca, x, cb * y);
    case SUMO_FLOAT32: return (float)fma(ca, x, cb * y);
    default: return fmaf((float)ca, (float)x, (float)cb * (float)y);
    }
}

static void test_scaled_add(void **state)
{
    (void)state;
    static const double coef[][2] = {{0.7, -1.3}, {1.0, 1.0}, {0.1, 0.0}, {-2.5, 1e-3},
                                     {1.0 / 3, 2.0 / 3}};
    sumo__isa isas[SUMO__ISA_COUNT];
    int np = paths(isas);
    uint64_t s = 5;
    for (int p = 0; p < np; p++)
        for (int d = 0; d < 4; d++)
            for (size_t z = 0; z < NSIZES; z++)
                for (size_t c = 0; c < sizeof coef / sizeof coef[0]; c++) {
                    sumo_dtype dt = dtypes[d];
                    size_t n = sizes[z], bytes = n * sumo__dtype_bytes(dt);
                    double ca = coef[c][0], cb = coef[c][1];
                    ubuf a = ubuf_new(dt, n), b = ubuf_new(dt, n);
                    fill_random(dt, a.p, n, &s);
                    fill_random(dt, b.p, n, &s);
                    if (n > 20) {
                        put(dt, a.p, 19, NAN);
                        put(dt, b.p, n - 1, INFINITY);
                    }
                    void *ca0 = malloc(bytes + 1), *cbb = malloc(bytes + 1);
                    assert_true(ca0 && cbb);
                    memcpy(ca0, a.p, bytes);
                    memcpy(cbb, b.p, bytes);
                    sumo__kernel_scaled_add_isa(isas[p], dt, a.p, ca, b.p, cb, n);
                    for (size_t i = 0; i < n; i++)
                        expect_elem(dt, a.p, i,
                                    ref_scaled(dt, get(dt, ca0, i), ca, get(dt, cbb, i), cb),
                                    "scaled_add", isas[p]);
                    assert_memory_equal(b.p, cbb, bytes);
                    /* a == b: a = (ca + cb) a, evaluated as written */
                    sumo__kernel_scaled_add_isa(isas[p], dt, b.p, ca, b.p, cb, n);
                    for (size_t i = 0; i < n; i++)
                        expect_elem(dt, b.p, i,
                                    ref_scaled(dt, get(dt, cbb, i), ca, get(dt, cbb, i), cb),
                                    "scaled_add a==b", isas[p]);
                    free(ca0);
                    free(cbb);
                    free(a.base);
                    free(b.base);
                }
}

/* fp16 overflows to Inf in the rounding; fp32 keeps a value that only double can hold
 * mid-computation. */
static void test_scaled_add_range(void **state)
{
    (void)state;
    sumo__isa isas[SUMO__ISA_COUNT];
    int np = paths(isas);
    for (int p = 0; p < np; p++) {
        uint16_t h[19], g[19];
        float f[19], e[19];
        for (int i = 0; i < 19; i++) {
            h[i] = 0x7bff; /* 65504 */
            g[i] = 0x7bff;
            f[i] = FLT_MAX;
            e[i] = FLT_MAX;
        }
        sumo__kernel_scaled_add_isa(isas[p], SUMO_FLOAT16, h, 0.75, g, 0.75, 19);
        /* 0.75 * 65504 * 2 = 98256 > 65520: Inf */
        for (int i = 0; i < 19; i++) assert_int_equal(h[i], 0x7c00);
        /* FLT_MAX + FLT_MAX overflows fp32, but times 0.5 each it is FLT_MAX exactly */
        sumo__kernel_scaled_add_isa(isas[p], SUMO_FLOAT32, f, 0.5, e, 0.5, 19);
        for (int i = 0; i < 19; i++) assert_true(f[i] == FLT_MAX);
        sumo__kernel_scaled_add_isa(isas[p], SUMO_FLOAT32, f, 1.0, e, 1.0, 19);
        for (int i = 0; i < 19; i++) assert_true(f[i] == INFINITY);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_isa_report),
        cmocka_unit_test(test_half_to_float_exhaustive),
        cmocka_unit_test(test_bf16_to_float_exhaustive),
        cmocka_unit_test(test_float_to_half_rne),
        cmocka_unit_test(test_float_to_bf16_rne),
        cmocka_unit_test(test_rounding_hand_cases),
        cmocka_unit_test(test_double_narrowing_single_rounding),
        cmocka_unit_test(test_convert_paths_exhaustive),
        cmocka_unit_test(test_convert_all_pairs),
        cmocka_unit_test(test_reduce_multi_random),
        cmocka_unit_test(test_reduce_multi_aliasing),
        cmocka_unit_test(test_reduce_multi_specials),
        cmocka_unit_test(test_reduce_multi_divisor_rounding),
        cmocka_unit_test(test_add_and_divide),
        cmocka_unit_test(test_dot_norms_random),
        cmocka_unit_test(test_dot_norms_specials),
        cmocka_unit_test(test_scaled_add),
        cmocka_unit_test(test_scaled_add_range),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
