#include "support/harness.h"
#include "support/reference.h"

#include <pthread.h>
#include <time.h>


typedef struct adapter {
    harness_rank_fn fn;
    void *arg;
    int size;
    pthread_mutex_t lock;
    pthread_cond_t changed;
    int returned; /* ranks whose fn has returned */
} adapter;

/* How long a rank waits for the others' fns to return before it lets its handle go anyway: only
 * reached when a rank's thread could not be started (it never returns), not a timing check. */
#define HOLD_LIMIT_S 600

static sumo_result adapt(sumo_comm *comm, int rank, void *p)
{
    adapter *a = p;
    a->fn(comm, rank, a->size, a->arg);
    /*
     * sumo_threads_run destroys a rank's handle as soon as its function returns. On the current
     * threads transport that makes a peer still finishing the same, last, collective fail with
     * SUMO_ERR_PEER_FAILURE (any rank's departure aborts every wait in the group; see
     * test_faults.c, test_rank_leaving_after_its_last_collective). The suites that run through
     * this harness test other things, so each rank keeps its handle until every rank's
     * function has returned, as a program whose ranks end together would.
     */
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += HOLD_LIMIT_S;
    pthread_mutex_lock(&a->lock);
    a->returned++;
    pthread_cond_broadcast(&a->changed);
    while (a->returned < a->size)
        if (pthread_cond_timedwait(&a->changed, &a->lock, &until) != 0) break;
    pthread_mutex_unlock(&a->lock);
    return SUMO_SUCCESS;
}

int harness_run_threads(int size, harness_rank_fn fn, void *arg)
{
    adapter a = {.fn = fn, .arg = arg, .size = size};
    if (pthread_mutex_init(&a.lock, NULL) != 0) return -1;
    if (pthread_cond_init(&a.changed, NULL) != 0) {
        pthread_mutex_destroy(&a.lock);
        return -1;
    }
    sumo_result r = sumo_threads_run(size, adapt, &a, NULL);
    pthread_cond_destroy(&a.changed);
    pthread_mutex_destroy(&a.lock);
    return r == SUMO_SUCCESS ? 0 : -1;
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

uint64_t harness_mix(uint64_t a, uint64_t b)
{
    uint64_t s = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull);
    return harness_next(&s);
}

double harness_uniform_at(uint64_t seed, uint64_t stream, size_t i)
{
    uint64_t s = harness_mix(harness_mix(seed, stream), i);
    return harness_uniform(&s);
}

double harness_collective_value(int rank, size_t i, bool integer)
{
    if (integer) return (double)((int)(((size_t)rank * 7 + i * 3) % 11) - 5);
    return harness_uniform_at(0x1234, (uint64_t)rank, i) * 4.0;
}

float harness_correlated(uint64_t seed, int step, int rank, size_t i, double noise)
{
    uint64_t base = harness_mix(seed, (uint64_t)step);
    double scale = 0.5 + 0.25 * rank + 0.1 * step;
    /* Stream 0 is the consensus, stream 1 + r rank r's noise. */
    return (float)(scale * (harness_uniform_at(base, 0, i) +
                            noise * harness_uniform_at(base, 1 + (uint64_t)rank, i)));
}

double harness_eps(sumo_dtype dtype)
{
    switch (dtype) {
    case SUMO_FLOAT32: return 0x1p-23;
    case SUMO_FLOAT64: return 0x1p-52;
    case SUMO_FLOAT16: return 0x1p-10;
    default: return 0x1p-7;
    }
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
    case SUMO_FLOAT16: return ref_half_value(((const uint16_t *)buf)[i]);
    default: return ref_bf16_value(((const uint16_t *)buf)[i]);
    }
}

void harness_set(sumo_dtype dtype, void *buf, size_t i, double v)
{
    switch (dtype) {
    case SUMO_FLOAT32: ((float *)buf)[i] = (float)v; break;
    case SUMO_FLOAT64: ((double *)buf)[i] = v; break;
    case SUMO_FLOAT16: ((uint16_t *)buf)[i] = ref_round_half(v); break;
    default: ((uint16_t *)buf)[i] = ref_round_bf16(v); break;
    }
}
