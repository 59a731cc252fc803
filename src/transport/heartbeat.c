/*
 * Heartbeats in a store: the reader (heartbeat.h), one rule for whoever waits on ranks of
 * other hosts, and the writer (sumo_heart, sumo_elastic.h), a thread per process.
 */
#include "transport/heartbeat.h"
#include "common/settings.h"

#include "sumo_elastic.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

sumo_result sumo__heartbeats_init(sumo__heartbeats *h, const sumo_store *store,
                                  const char *prefix, int64_t alive_ns, int count)
{
    *h = (sumo__heartbeats){.store = store, .prefix = prefix, .alive_ns = alive_ns,
                            .count = count};
    h->beat = calloc((size_t)SUMO__MAX(count, 1), sizeof *h->beat);
    h->since = calloc((size_t)SUMO__MAX(count, 1), sizeof *h->since);
    if (h->beat == NULL || h->since == NULL) {
        sumo__heartbeats_free(h);
        return SUMO_ERR_SYSTEM;
    }
    return SUMO_SUCCESS;
}

void sumo__heartbeats_free(sumo__heartbeats *h)
{
    free(h->beat);
    free(h->since);
    h->beat = NULL;
    h->since = NULL;
}

/* The key of rank who's beat: the writer's and every reader's, so the two never part. */
static bool beat_key(const char *prefix, int who, char *key, size_t bytes)
{
    int n = snprintf(key, bytes, "%s%d", prefix, who);
    return n >= 0 && (size_t)n < bytes;
}

bool sumo__heartbeats_key(const sumo__heartbeats *h, int who, char *key, size_t bytes)
{
    return beat_key(h->prefix, who, key, bytes);
}

bool sumo__heartbeats_judge(sumo__heartbeats *h, int slot, const char *text, int64_t now)
{
    if (h->since[slot] == 0 || strncmp(text, h->beat[slot], SUMO__BEAT_BYTES - 1) != 0) {
        snprintf(h->beat[slot], SUMO__BEAT_BYTES, "%s", text); /* a longer beat: its head */
        h->since[slot] = now;
    }
    return now - h->since[slot] >= h->alive_ns;
}

sumo_result sumo__heartbeats_look(sumo__heartbeats *h, int slot, int who, int64_t now,
                                  bool *dead)
{
    *dead = false;
    char key[SUMO__BEAT_KEY_BYTES], text[SUMO__BEAT_BYTES];
    if (!sumo__heartbeats_key(h, who, key, sizeof key)) return SUMO_ERR_INVALID_ARGUMENT;
    size_t n = sizeof text - 1;
    sumo_result res = h->store->get(h->store->ctx, key, text, &n, now);
    if (res != SUMO_SUCCESS) n = 0; /* not there yet (SUMO_ERR_TIMEOUT), or the store failed */
    text[SUMO__MIN(n, sizeof text - 1)] = '\0';
    *dead = sumo__heartbeats_judge(h, slot, text, now);
    return res == SUMO_ERR_TIMEOUT ? SUMO_SUCCESS : res;
}

/* ---- the writer (sumo_heart, sumo_elastic.h) ------------------------------------------- */

#define MAX_PREFIX 230

struct sumo_heart {
    const sumo_store *store;
    int64_t period_ns;
    pthread_t thread;
    pthread_mutex_t lock; /* guards what follows */
    pthread_cond_t wake;  /* CLOCK_MONOTONIC: stop wakes the thread from its wait */
    bool stopping;
    uint64_t beats;
    char prefix[MAX_PREFIX + 1];
    int rank;
    sumo_result failed; /* why the thread stopped beating, and the detail */
    char why[SUMO__BEAT_KEY_BYTES + 80];
};

static sumo_result heart_say(const sumo_heart_options *o, sumo_result code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Writes why into the caller's error buffer, where the options are of this library's size. */
static sumo_result heart_say(const sumo_heart_options *o, sumo_result code, const char *fmt, ...)
{
    if (o && o->struct_size == sizeof *o && o->error && o->error_bytes > 0) {
        va_list ap;
        va_start(ap, fmt);
        int n = snprintf(o->error, o->error_bytes, "sumo_heart_start: ");
        if (n >= 0 && (size_t)n < o->error_bytes)
            vsnprintf(o->error + n, o->error_bytes - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return code;
}

/* One beat: the next count under the current key. The store is called without the lock, so
 * that a store that takes long (or a Python one, which takes the interpreter's lock) never
 * holds up move or stop's caller; two beats that cross only write two new values. */
static sumo_result beat_once(sumo_heart *h, char *why, size_t why_bytes)
{
    char key[SUMO__BEAT_KEY_BYTES], value[32];
    pthread_mutex_lock(&h->lock);
    uint64_t n = ++h->beats;
    beat_key(h->prefix, h->rank, key, sizeof key); /* fits: prefix <= 230 bytes */
    pthread_mutex_unlock(&h->lock);
    int len = snprintf(value, sizeof value, "%" PRIu64, n);
    sumo_result r = h->store->set(h->store->ctx, key, value, (size_t)len);
    if (r == SUMO_SUCCESS) return SUMO_SUCCESS;
    if (why) snprintf(why, why_bytes, "the store failed writing %s (%s)", key, sumo_result_name(r));
    return SUMO_ERR_SYSTEM;
}

static struct timespec monotonic_at(int64_t ns)
{
    return (struct timespec){.tv_sec = (time_t)(ns / 1000000000),
                             .tv_nsec = (long)(ns % 1000000000)};
}

static void *heart_run(void *arg)
{
    sumo_heart *h = arg;
    char why[sizeof h->why];
    pthread_mutex_lock(&h->lock);
    while (!h->stopping) {
        pthread_mutex_unlock(&h->lock);
        sumo_result r = beat_once(h, why, sizeof why);
        pthread_mutex_lock(&h->lock);
        if (r != SUMO_SUCCESS) {
            /* The store gone: the job is ending, or this process is lost to the others. The
             * others take it for dead either way; beating on would only fail again. */
            h->failed = r;
            memcpy(h->why, why, sizeof why);
            break;
        }
        struct timespec until = monotonic_at(sumo__now_ns() + h->period_ns);
        while (!h->stopping && pthread_cond_timedwait(&h->wake, &h->lock, &until) == 0) {
        }
    }
    pthread_mutex_unlock(&h->lock);
    return NULL;
}

sumo_result sumo_heart_options_default(sumo_heart_options *options)
{
    if (options == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *options = (sumo_heart_options){.struct_size = sizeof *options};
    return SUMO_SUCCESS;
}

sumo_result sumo_heart_start(const sumo_heart_options *o, sumo_heart **out)
{
    if (o == NULL || out == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *out = NULL;
    if (o->struct_size != sizeof *o) return SUMO_ERR_INVALID_ARGUMENT; /* error is elsewhere */
    if (o->error && o->error_bytes > 0) o->error[0] = '\0';
    const sumo_store *st = o->store;
    if (st == NULL || st->struct_size != sizeof *st || st->set == NULL)
        return heart_say(o, SUMO_ERR_INVALID_ARGUMENT,
                         "the store must be a sumo_store of this library's size with set");
    if (o->key_prefix == NULL || strlen(o->key_prefix) > MAX_PREFIX)
        return heart_say(o, SUMO_ERR_INVALID_ARGUMENT,
                         "key_prefix must be given, at most %d bytes (%zu)", MAX_PREFIX,
                         o->key_prefix ? strlen(o->key_prefix) : 0);
    if (o->rank < 0)
        return heart_say(o, SUMO_ERR_INVALID_ARGUMENT, "rank must be 0 or more, not %d", o->rank);
    double seconds = o->period_s;
    if (seconds == 0) {
        sumo__setting_value v;
        char why[256];
        if (sumo__setting_read(SUMO__SETTING_LIVENESS_TIMEOUT, &v, why, sizeof why) !=
            SUMO_SUCCESS)
            return heart_say(o, SUMO_ERR_INVALID_ARGUMENT, "%s", why);
        seconds = v.number / 10;
    }
    if (!(seconds > 0 && seconds < 1e7))
        return heart_say(o, SUMO_ERR_INVALID_ARGUMENT,
                         "period_s (0: a tenth of SUMO_LIVENESS_TIMEOUT) must be a number of "
                         "seconds, not %g", seconds);
    sumo_heart *h = calloc(1, sizeof *h);
    if (h == NULL) return heart_say(o, SUMO_ERR_SYSTEM, "out of memory");
    h->store = st;
    h->period_ns = (int64_t)(seconds * 1e9);
    h->rank = o->rank;
    snprintf(h->prefix, sizeof h->prefix, "%s", o->key_prefix);
    pthread_condattr_t attr;
    bool made = pthread_condattr_init(&attr) == 0;
    if (made) {
        /* The beats' pace must not follow the wall clock's jumps. */
        made = pthread_condattr_setclock(&attr, CLOCK_MONOTONIC) == 0 &&
               pthread_cond_init(&h->wake, &attr) == 0;
        pthread_condattr_destroy(&attr);
    }
    if (!made || pthread_mutex_init(&h->lock, NULL) != 0) {
        if (made) pthread_cond_destroy(&h->wake);
        free(h);
        return heart_say(o, SUMO_ERR_SYSTEM, "cannot make the heart's lock");
    }
    int err = pthread_create(&h->thread, NULL, heart_run, h);
    if (err != 0) {
        pthread_cond_destroy(&h->wake);
        pthread_mutex_destroy(&h->lock);
        free(h);
        return heart_say(o, SUMO_ERR_SYSTEM, "cannot make the heart's thread (%s)",
                         strerror(err));
    }
    *out = h;
    return SUMO_SUCCESS;
}

sumo_result sumo_heart_beat(sumo_heart *h)
{
    if (h == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    return beat_once(h, NULL, 0);
}

sumo_result sumo_heart_move(sumo_heart *h, const char *key_prefix, int rank)
{
    if (h == NULL || key_prefix == NULL || strlen(key_prefix) > MAX_PREFIX || rank < 0)
        return SUMO_ERR_INVALID_ARGUMENT;
    pthread_mutex_lock(&h->lock);
    snprintf(h->prefix, sizeof h->prefix, "%s", key_prefix);
    h->rank = rank;
    pthread_mutex_unlock(&h->lock);
    return SUMO_SUCCESS;
}

sumo_result sumo_heart_error(sumo_heart *h, char *error, size_t error_bytes)
{
    if (h == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    pthread_mutex_lock(&h->lock);
    sumo_result r = h->failed;
    if (error && error_bytes > 0) snprintf(error, error_bytes, "%s", h->why);
    pthread_mutex_unlock(&h->lock);
    return r;
}

sumo_result sumo_heart_stop(sumo_heart *h)
{
    if (h == NULL) return SUMO_SUCCESS;
    pthread_mutex_lock(&h->lock);
    h->stopping = true;
    pthread_cond_broadcast(&h->wake);
    pthread_mutex_unlock(&h->lock);
    pthread_join(h->thread, NULL);
    pthread_cond_destroy(&h->wake);
    pthread_mutex_destroy(&h->lock);
    free(h);
    return SUMO_SUCCESS;
}

/* ---- the reader for callers (sumo_heart_watch, sumo_elastic.h) ------------------------- */

struct sumo_heart_watch {
    sumo__heartbeats beats;
    char prefix[MAX_PREFIX + 1];
    int *who; /* slot i reads rank who[i]'s beat; < 0: not watched */
};

sumo_result sumo_heart_watch_create(const sumo_store *store, const char *key_prefix, int count,
                                    const int *ranks, double alive_s, sumo_heart_watch **out)
{
    if (out == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *out = NULL;
    if (store == NULL || store->struct_size != sizeof *store || store->get == NULL ||
        key_prefix == NULL || strlen(key_prefix) > MAX_PREFIX || count < 0 ||
        (count > 0 && ranks == NULL))
        return SUMO_ERR_INVALID_ARGUMENT;
    if (alive_s == 0) {
        sumo__setting_value v;
        char why[256];
        if (sumo__setting_read(SUMO__SETTING_LIVENESS_TIMEOUT, &v, why, sizeof why) !=
            SUMO_SUCCESS)
            return SUMO_ERR_INVALID_ARGUMENT;
        alive_s = v.number;
    }
    if (!(alive_s > 0 && alive_s < 1e7)) return SUMO_ERR_INVALID_ARGUMENT;
    sumo_heart_watch *w = calloc(1, sizeof *w);
    if (w == NULL) return SUMO_ERR_SYSTEM;
    w->who = malloc((size_t)SUMO__MAX(count, 1) * sizeof *w->who);
    snprintf(w->prefix, sizeof w->prefix, "%s", key_prefix);
    if (w->who == NULL ||
        sumo__heartbeats_init(&w->beats, store, w->prefix, (int64_t)(alive_s * 1e9), count) !=
            SUMO_SUCCESS) {
        free(w->who);
        free(w);
        return SUMO_ERR_SYSTEM;
    }
    if (count > 0) memcpy(w->who, ranks, (size_t)count * sizeof *w->who);
    *out = w;
    return SUMO_SUCCESS;
}

sumo_result sumo_heart_watch_look(sumo_heart_watch *w, int *dead)
{
    if (w == NULL || dead == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *dead = -1;
    int64_t now = sumo__now_ns();
    for (int i = 0; i < w->beats.count; i++) {
        if (w->who[i] < 0) continue;
        bool gone;
        sumo__heartbeats_look(&w->beats, i, w->who[i], now, &gone); /* failing: no beat */
        if (gone && *dead < 0) *dead = i; /* every slot read: each keeps its own since */
    }
    return SUMO_SUCCESS;
}

sumo_result sumo_heart_watch_destroy(sumo_heart_watch *w)
{
    if (w == NULL) return SUMO_SUCCESS;
    sumo__heartbeats_free(&w->beats);
    free(w->who);
    free(w);
    return SUMO_SUCCESS;
}

sumo_result sumo__store_waits(double timeout_s, const char *alive_prefix, double alive_s,
                              size_t max_prefix, int64_t *timeout_ns, int64_t *alive_ns,
                              char *why, size_t why_bytes)
{
    double seconds = timeout_s;
    if (seconds == 0) {
        sumo__env env;
        SUMO__CHECK(sumo__env_read(&env, why, why_bytes));
        seconds = env.timeout_s;
    }
    if (!(seconds > 0 && seconds < 1e7)) {
        snprintf(why, why_bytes, "timeout_s %g is not a number of seconds", seconds);
        return SUMO_ERR_INVALID_ARGUMENT;
    }
    *timeout_ns = (int64_t)(seconds * 1e9);
    seconds = alive_s;
    if (seconds == 0 && alive_prefix != NULL) {
        sumo__setting_value v;
        SUMO__CHECK(sumo__setting_read(SUMO__SETTING_LIVENESS_TIMEOUT, &v, why, why_bytes));
        seconds = v.number;
    }
    if (alive_prefix != NULL &&
        (strlen(alive_prefix) > max_prefix || !(seconds > 0 && seconds < 1e7))) {
        snprintf(why, why_bytes, "alive_prefix of at most %zu bytes, alive_s %g a number of "
                 "seconds", max_prefix, seconds);
        return SUMO_ERR_INVALID_ARGUMENT;
    }
    *alive_ns = (int64_t)(seconds * 1e9);
    return SUMO_SUCCESS;
}
