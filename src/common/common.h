/*
 * Internal helpers shared by every layer: logging, clocks, dtype facts, result plumbing.
 * Internal symbols carry the prefix sumo__ so the public boundary is visible at each call.
 */
#ifndef SUMO_COMMON_H
#define SUMO_COMMON_H

/* Inside sumo the experimental seams are ordinary internal API. */
#ifndef SUMO_EXPERIMENTAL_API
#define SUMO_EXPERIMENTAL_API 1
#endif
#include "sumo.h"
#include "sumo_ext.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#define SUMO__CACHELINE 64

#include "common/plugin_api.h"

enum sumo__log_level { SUMO__LOG_NONE = 0, SUMO__LOG_WARN = 1, SUMO__LOG_INFO = 2 };

void sumo__log(int threshold, int level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* The level is tested here, so that a call that logs nothing evaluates none of the arguments
 * (names looked up) and makes no varargs call: 0.7% of a 4 KiB Adasum call's samples were
 * sumo__log returning at once (perf, np 2). */
#define SUMO__LOG(threshold, level, ...)                                              \
    do {                                                                              \
        if ((level) != SUMO__LOG_NONE && (level) <= (threshold))                      \
            sumo__log((threshold), (level), __FILE__, __LINE__, __VA_ARGS__);         \
    } while (0)

/* aligned_alloc of bytes rounded up to a multiple of align (C11 wants the size to be one);
 * NULL when that fails or the rounding would overflow. Freed with free(). */
static inline void *sumo__aligned_alloc(size_t align, size_t bytes)
{
    if (bytes > SIZE_MAX - (align - 1)) return NULL;
    return aligned_alloc(align, (bytes + align - 1) / align * align);
}

/* Monotonic clock in nanoseconds. */
SUMO__PLUGIN_API int64_t sumo__now_ns(void);

/* The settings every communicator takes from the environment when it is created (the table
 * of common/settings.h says what each accepts), kept in its handle so that no global changes
 * behind a running collective. */
typedef struct sumo__env {
    double timeout_s; /* SUMO_TIMEOUT */
    int log_level;    /* SUMO_DEBUG: a sumo__log_level */
} sumo__env;

/* Reads both, and checks SUMO_KERNEL_ISA (which the kernels read on each call); a malformed or
 * out-of-range value is SUMO_ERR_INVALID_ARGUMENT with a sentence in why naming the variable,
 * its value and what is accepted (why may be NULL). */
sumo_result sumo__env_read(sumo__env *env, char *why, size_t why_bytes);

/* sumo__env_read for constructors that have no handle to carry the message yet: prints the
 * sentence on stderr (one line) when the environment is malformed. */
SUMO__PLUGIN_API sumo_result sumo__env_for_create(sumo__env *env);

/* SUMO_DEBUG alone, for constructors of objects without a communicator (an optimizer), which
 * refuse a malformed value as sumo__env_for_create does; *level is NONE then. */
sumo_result sumo__log_level_for_create(int *level);

static inline size_t sumo__dtype_bytes(sumo_dtype dtype)
{
    switch (dtype) {
    case SUMO_FLOAT32: return 4;
    case SUMO_FLOAT64: return 8;
    case SUMO_FLOAT16: return 2;
    case SUMO_BFLOAT16: return 2;
    default: return 0;
    }
}

static inline bool sumo__dtype_valid(int dtype) { return dtype >= 0 && dtype < SUMO_DTYPE_COUNT; }

SUMO__PLUGIN_API const char *sumo__op_name(sumo_op op);

/* True when [a, a+abytes) and [b, b+bbytes) share a byte. */
static inline bool sumo__ranges_overlap(const void *a, size_t abytes, const void *b, size_t bbytes)
{
    uintptr_t pa = (uintptr_t)a, pb = (uintptr_t)b;
    if (abytes == 0 || bbytes == 0) return false;
    return pa < pb + bbytes && pb < pa + abytes;
}

/* splitmix64 from an explicit state: the same sequence on every platform and thread, for
 * seeded initialisation and data permutations. */
static inline uint64_t sumo__splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* FNV-1a over bytes, continuing from h (start from SUMO__FNV_OFFSET). */
#define SUMO__FNV_OFFSET 0xcbf29ce484222325ull
static inline uint64_t sumo__fnv1a(uint64_t h, const void *data, size_t bytes)
{
    const unsigned char *b = data;
    for (size_t i = 0; i < bytes; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/*
 * The one check of the struct_size that opens every public struct a caller fills: it must be
 * this library's sizeof, since a struct only grows with a new sumo version (a smaller one lacks
 * fields this library would read, a larger one has fields it would silently ignore). NULL when
 * p->struct_size is sizeof(type); else one sentence naming the struct, written into why (with
 * the size given and this library's) and returned when why is not NULL, or a static sentence
 * without the sizes when it is NULL (for callers that hand out static sentences). 256 bytes
 * hold it. p must not be NULL.
 *     char why[256];
 *     if (SUMO__STRUCT_SIZE_PROBLEM(o, sumo_diloco_options, why, sizeof why)) ... "%s", why
 *     const char *bad = SUMO__STRUCT_SIZE_PROBLEM(o, sumo_diloco_options, NULL, 0);
 */
#define SUMO__STRUCT_SIZE_PROBLEM(p, type, why, why_bytes)                                       \
    sumo__struct_size_problem((p)->struct_size, sizeof(type),                                    \
                              #type ".struct_size is not sizeof(" #type ") in this library: "    \
                              "fill it with that sizeof, as the _default functions do, from " \
                              "the headers of the sumo you link",                              \
                              (why), (why_bytes))
const char *sumo__struct_size_problem(size_t given, size_t expected, const char *sentence,
                                      char *why, size_t why_bytes);

/* Overflow-checked n * size. */
static inline bool sumo__mul_overflows(size_t n, size_t size, size_t *out)
{
    return __builtin_mul_overflow(n, size, out);
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

#define SUMO__MIN(a, b) ((a) < (b) ? (a) : (b))
#define SUMO__MAX(a, b) ((a) > (b) ? (a) : (b))

/* Propagate a failure: the caller already recorded its detail. */
#define SUMO__CHECK(call)                       \
    do {                                        \
        sumo_result sumo__r_ = (call);          \
        if (sumo__r_ != SUMO_SUCCESS) return sumo__r_; \
    } while (0)

#endif
