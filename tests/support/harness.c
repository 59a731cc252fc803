#include "support/harness.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct rank_arg {
    sumo_comm *comm;
    int rank, size;
    harness_rank_fn fn;
    void *arg;
} rank_arg;

static void *rank_main(void *p)
{
    rank_arg *a = p;
    a->fn(a->comm, a->rank, a->size, a->arg);
    return NULL;
}

int harness_run_threads(int size, harness_rank_fn fn, void *arg)
{
    sumo_comm **comms = calloc((size_t)size, sizeof *comms);
    pthread_t *threads = calloc((size_t)size, sizeof *threads);
    rank_arg *args = calloc((size_t)size, sizeof *args);
    int rc = -1;
    if (!comms || !threads || !args) goto out;
    if (sumo_comm_create_threads(size, comms) != SUMO_SUCCESS) goto out;
    int started = 0;
    for (int r = 0; r < size; r++) {
        args[r] = (rank_arg){.comm = comms[r], .rank = r, .size = size, .fn = fn, .arg = arg};
        if (pthread_create(&threads[r], NULL, rank_main, &args[r]) != 0) break;
        started++;
    }
    for (int r = 0; r < started; r++) pthread_join(threads[r], NULL);
    for (int r = 0; r < size; r++) sumo_comm_destroy(comms[r]);
    rc = started == size ? 0 : -1;
out:
    free(comms);
    free(threads);
    free(args);
    return rc;
}

uint64_t harness_next(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

double harness_uniform(uint64_t *state)
{
    return (double)(harness_next(state) >> 11) * 0x1.0p-53 * 2.0 - 1.0;
}

float harness_half_to_float(uint16_t h)
{
    int sign = h >> 15, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    double v;
    if (exp == 0) v = ldexp(man, -24);
    else if (exp == 31) v = man ? NAN : INFINITY;
    else v = ldexp(man + 1024, exp - 25);
    return (float)(sign ? -v : v);
}

/* Round-to-nearest-even by searching the two neighbouring representable values. */
uint16_t harness_float_to_half(float f)
{
    if (isnan(f)) return 0x7e00;
    uint16_t sign = signbit(f) ? 0x8000 : 0;
    double a = fabs((double)f);
    if (a >= 65520.0) return sign | 0x7c00; /* rounds to Inf at and above max + half ulp */
    /* Magnitudes are monotonic in the bit pattern: binary search the largest <= a. */
    uint16_t lo = 0, hi = 0x7bff;
    while (lo < hi) {
        uint16_t mid = (uint16_t)((lo + hi + 1) / 2);
        if ((double)harness_half_to_float(mid) <= a) lo = mid;
        else hi = (uint16_t)(mid - 1);
    }
    double below = harness_half_to_float(lo);
    if (below == a || lo == 0x7bff) return sign | lo;
    double above = harness_half_to_float((uint16_t)(lo + 1));
    if (a - below < above - a) return sign | lo;
    if (a - below > above - a) return sign | (uint16_t)(lo + 1);
    return sign | ((lo & 1) ? (uint16_t)(lo + 1) : lo);
}

float harness_bf16_to_float(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

uint16_t harness_float_to_bf16(float f)
{
    if (isnan(f)) return 0x7fc0;
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint16_t lo = (uint16_t)(u >> 16);
    uint32_t rest = u & 0xffff;
    if (rest > 0x8000 || (rest == 0x8000 && (lo & 1))) lo++;
    return lo;
}

size_t harness_dtype_size(sumo_dtype dtype)
{
    switch (dtype) {
    case SUMO_FLOAT32: return 4;
    case SUMO_FLOAT64: return 8;
    default: return 2;
    }
}

double harness_get(sumo_dtype dtype, const void *buf, size_t i)
{
    switch (dtype) {
    case SUMO_FLOAT32: return ((const float *)buf)[i];
    case SUMO_FLOAT64: return ((const double *)buf)[i];
    case SUMO_FLOAT16: return harness_half_to_float(((const uint16_t *)buf)[i]);
    default: return harness_bf16_to_float(((const uint16_t *)buf)[i]);
    }
}

void harness_set(sumo_dtype dtype, void *buf, size_t i, double v)
{
    switch (dtype) {
    case SUMO_FLOAT32: ((float *)buf)[i] = (float)v; break;
    case SUMO_FLOAT64: ((double *)buf)[i] = v; break;
    case SUMO_FLOAT16: ((uint16_t *)buf)[i] = harness_float_to_half((float)v); break;
    default: ((uint16_t *)buf)[i] = harness_float_to_bf16((float)v); break;
    }
}
