/*
 * What the kernel tests (tests/unit/test_kernels_*.c) share: the lengths and dtypes they run,
 * the bits of a float, a deterministic generator, buffers that are never aligned, elements of
 * any dtype read and written through the references of support/reference.h (values decoded
 * with ldexp and rounded with frexp/nearbyint, not bit tricks), an element checked bit for bit
 * against an accumulator value rounded by the reference, and the instruction-set paths this
 * CPU can run.
 */
#ifndef SUMO_TEST_KERNEL_CHECK_H
#define SUMO_TEST_KERNEL_CHECK_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/kernels_isa.h"
#include "support/reference.h"

static const size_t sizes[] = {0, 1, 2, 7, 15, 16, 17, 31, 33, 64, 1023, 2049, 4099, 10007};
#define NSIZES (sizeof sizes / sizeof sizes[0])

static const sumo_dtype dtypes[] = {SUMO_FLOAT32, SUMO_FLOAT64, SUMO_FLOAT16, SUMO_BFLOAT16};

/* ---- bits (the formats' references are in support/reference.h) ------------------------- */

static inline uint32_t fbits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float ffrom(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint64_t dbits(double d)
{
    uint64_t u;
    memcpy(&u, &d, 8);
    return u;
}

/* ---- buffers ------------------------------------------------------------------------------ */

static inline uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline double rng_unit(uint64_t *s) { return (double)(rng_next(s) >> 11) * 0x1p-53; }

/* An allocation plus one element, handed out one element in, so vectors are never aligned. */
typedef struct {
    void *base;
    void *p;
} ubuf;

static inline ubuf ubuf_new(sumo_dtype dt, size_t n)
{
    size_t esz = sumo__dtype_bytes(dt);
    ubuf b;
    b.base = malloc((n + 1) * esz + 64);
    assert_non_null(b.base);
    b.p = (char *)b.base + esz;
    return b;
}

static inline double get(sumo_dtype dt, const void *p, size_t i)
{
    switch (dt) {
    case SUMO_FLOAT32: return ((const float *)p)[i];
    case SUMO_FLOAT64: return ((const double *)p)[i];
    case SUMO_FLOAT16: return ref_half_value(((const uint16_t *)p)[i]);
    default: return ref_bf16_value(((const uint16_t *)p)[i]);
    }
}

/* Stores v, which must already be representable (or be rounded by the reference). */
static inline void put(sumo_dtype dt, void *p, size_t i, double v)
{
    switch (dt) {
    case SUMO_FLOAT32: ((float *)p)[i] = (float)v; break;
    case SUMO_FLOAT64: ((double *)p)[i] = v; break;
    case SUMO_FLOAT16: ((uint16_t *)p)[i] = ref_round_half(v); break;
    default: ((uint16_t *)p)[i] = ref_round_bf16(v); break;
    }
}

/* Mostly moderate values of random magnitude, sometimes a random finite bit pattern. */
static inline void fill_random(sumo_dtype dt, void *p, size_t n, uint64_t *s)
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
static inline void expect_elem(sumo_dtype dt, const void *out, size_t i, double acc,
                               const char *what, sumo__isa isa)
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
static inline int paths(sumo__isa out[SUMO__ISA_COUNT])
{
    int k = 0;
    for (int i = 0; i <= (int)sumo__kernel_isa_best(); i++) out[k++] = (sumo__isa)i;
    return k;
}

#endif
