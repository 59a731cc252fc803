/* How the collectives cut a buffer among ranks, and the arithmetic every algorithm shares. */
#ifndef SUMO_SLICES_H
#define SUMO_SLICES_H

#include "common/common.h"

/* Rank r's part [lo, hi) of n elements, cut at cache-line multiples so that no two ranks write
 * the same line. */
static inline void sumo__cache_slice(size_t n, size_t esz, int parts, int r, size_t *lo, size_t *hi)
{
    size_t unit = SUMO__CACHELINE / esz;
    size_t lines = (n + unit - 1) / unit;
    size_t per = lines / (size_t)parts, extra = lines % (size_t)parts;
    size_t first = (size_t)r * per + SUMO__MIN((size_t)r, extra);
    size_t last = first + per + ((size_t)r < extra ? 1 : 0);
    *lo = SUMO__MIN(first * unit, n);
    *hi = SUMO__MIN(last * unit, n);
}

/* Segment s of n split into `parts` nearly equal parts (the ring's and the shards'). */
static inline size_t sumo__seg_off(size_t n, int parts, int s)
{
    return (n / (size_t)parts) * (size_t)s + SUMO__MIN((size_t)s, n % (size_t)parts);
}

/* The first of ntensors tensors (offsets: ntensors + 1 prefix sums) that ends after element pos;
 * zero-length tensors at pos are skipped. */
static inline size_t sumo__first_tensor(const size_t *offsets, size_t ntensors, size_t pos)
{
    size_t lo = 0, hi = ntensors;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (offsets[mid + 1] > pos) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

/* What a sum is divided by: the group size for AVERAGE, else 1 (no division). */
static inline int sumo__divisor_of(sumo_op op, int size) { return op == SUMO_OP_AVERAGE ? size : 1; }

/* The type partial sums travel in: fp16 and bf16 accumulate in fp32. */
static inline sumo_dtype sumo__accumulator_of(sumo_dtype dtype)
{
    return dtype == SUMO_FLOAT16 || dtype == SUMO_BFLOAT16 ? SUMO_FLOAT32 : dtype;
}

#endif
