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

/* What a sum is divided by: the group size for AVERAGE, else 1 (no division). */
static inline int sumo__divisor_of(sumo_op op, int size) { return op == SUMO_OP_AVERAGE ? size : 1; }

/* The type partial sums travel in: fp16 and bf16 accumulate in fp32. */
static inline sumo_dtype sumo__accumulator_of(sumo_dtype dtype)
{
    return dtype == SUMO_FLOAT16 || dtype == SUMO_BFLOAT16 ? SUMO_FLOAT32 : dtype;
}

#endif
