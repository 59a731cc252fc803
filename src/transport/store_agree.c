/*
 * sumo_store_agree (sumo_elastic.h): the survivors of a failure agree through a store alone.
 * The shm agreement (shm.c) has the same rule (the lowest rank not out decides once every rank
 * has come or is out) but reads liveness from the kernel; across hosts nothing can, so here a
 * rank's heartbeat in the store, or failing that the deadline, stands in for it. Correctness
 * does not rest on that timing: whoever decides writes the verdict with set_once and every
 * rank adopts the one verdict that stands, so a live rank taken for dead is only left out.
 * Keys under the prefix: in/<rank> (the value a rank brought, in decimal) and verdict
 * ("sumo-agree-1 <value> <size> <words>", the members as hexadecimal 64-bit words, rank r in
 * bit r % 64 of word r / 64).
 */
#include "common/common.h"
#include "transport/heartbeat.h"

#include "sumo_elastic.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_RANKS 1024
#define WORDS (MAX_RANKS / 64)
#define MAX_PREFIX 230
#define TAG "sumo-agree-1"
/* Ranks look at the others at this pace: an agreement follows a failure, so milliseconds do
 * not count, and a store has no way to wake a waiter on any of several keys. */
#define POLL_NS (5 * 1000 * 1000)
/* A decider that died is taken over by the next rank that came, this share of the timeout
 * after the one before it should have decided. */
#define TAKEOVER_SHARE 16

typedef struct agreement {
    const sumo_agree_options *o;
    const sumo_store *st;
    int64_t timeout_ns, alive_ns;
    bool came[MAX_RANKS];
    /* Its entry is not a value (bytes someone else wrote over it): the rank is out, for every
     * reader alike, rather than a failure of this reader alone while another rank decides. */
    bool spoiled[MAX_RANKS];
    uint64_t values[MAX_RANKS];
    sumo__heartbeats beats; /* with alive_prefix: each rank's, as last read */
} agreement;

typedef struct verdict {
    uint64_t value;
    int size;
    uint64_t members[WORDS];
} verdict;

/* Writes why into the caller's error buffer, where the options are of this library's size (an
 * older struct would put error elsewhere). */
static sumo_result say(const sumo_agree_options *o, sumo_result code, const char *fmt, ...)
{
    if (o && o->struct_size == sizeof *o && o->error && o->error_bytes > 0) {
        va_list ap;
        va_start(ap, fmt);
        int n = snprintf(o->error, o->error_bytes, "sumo_store_agree: ");
        if (n >= 0 && (size_t)n < o->error_bytes)
            vsnprintf(o->error + n, o->error_bytes - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return code;
}

static void entry_key(const agreement *a, char *key, size_t len, int r)
{
    snprintf(key, len, "%sin/%d", a->o->key_prefix, r);
}

static void verdict_key(const agreement *a, char *key, size_t len)
{
    snprintf(key, len, "%sverdict", a->o->key_prefix);
}

/* Reads rank r's entry once, without waiting: a->came[r] says whether it is there. */
static sumo_result look_for(agreement *a, int r)
{
    if (a->came[r] || a->spoiled[r]) return SUMO_SUCCESS;
    char key[300], text[32];
    size_t n = sizeof text - 1;
    entry_key(a, key, sizeof key, r);
    sumo_result res = a->st->get(a->st->ctx, key, text, &n, sumo__now_ns());
    if (res == SUMO_ERR_TIMEOUT) return SUMO_SUCCESS;
    if (res != SUMO_SUCCESS)
        return say(a->o, SUMO_ERR_SYSTEM, "the store failed reading %s (%s)", key,
                   sumo_result_name(res));
    text[n < sizeof text ? n : sizeof text - 1] = '\0';
    char *end = NULL;
    unsigned long long v = strtoull(text, &end, 10);
    if (n == 0 || n >= sizeof text || end != text + n || text[0] < '0' || text[0] > '9') {
        a->spoiled[r] = true;
        return SUMO_SUCCESS;
    }
    a->values[r] = (uint64_t)v;
    a->came[r] = true;
    return SUMO_SUCCESS;
}

/* Whether rank r is dead by its heartbeat (heartbeat.h's rule). Never without heartbeats,
 * and never this rank. */
static sumo_result watch(agreement *a, int r, int64_t now, bool *dead)
{
    *dead = false;
    if (a->o->alive_prefix == NULL || r == a->o->rank) return SUMO_SUCCESS;
    sumo_result res = sumo__heartbeats_look(&a->beats, r, r, now, dead);
    if (res != SUMO_SUCCESS) {
        char key[SUMO__BEAT_KEY_BYTES];
        sumo__heartbeats_key(&a->beats, r, key, sizeof key);
        return say(a->o, SUMO_ERR_SYSTEM, "the store failed reading %s (%s)", key,
                   sumo_result_name(res));
    }
    return SUMO_SUCCESS;
}

/* Whether rank r is out of the agreement: dead, or not come by the deadline. */
static sumo_result is_out(agreement *a, int r, int64_t now, bool late, bool *out)
{
    bool dead;
    SUMO__CHECK(look_for(a, r));
    SUMO__CHECK(watch(a, r, now, &dead));
    *out = dead || a->spoiled[r] || (late && !a->came[r]);
    return SUMO_SUCCESS;
}

static bool member(const verdict *v, int r) { return (v->members[r / 64] >> (r % 64)) & 1u; }

/* Waits for the verdict until deadline_ns: SUMO_ERR_TIMEOUT when none is there by then. */
static sumo_result read_verdict(agreement *a, int64_t deadline_ns, verdict *v)
{
    char key[300], text[512];
    size_t n = sizeof text - 1;
    verdict_key(a, key, sizeof key);
    sumo_result res = a->st->get(a->st->ctx, key, text, &n, deadline_ns);
    if (res == SUMO_ERR_TIMEOUT) return res;
    if (res != SUMO_SUCCESS)
        return say(a->o, SUMO_ERR_SYSTEM, "the store failed reading %s (%s)", key,
                   sumo_result_name(res));
    if (n >= sizeof text) n = sizeof text - 1; /* too long to be a verdict: fails below */
    text[n] = '\0';
    *v = (verdict){0};
    int words = (a->o->size + 63) / 64, used = 0;
    const char *p = text;
    if (sscanf(p, TAG " %" SCNu64 " %d%n", &v->value, &v->size, &used) != 2)
        return say(a->o, SUMO_ERR_INVALID_ARGUMENT, "%s holds \"%.80s\", not a verdict", key,
                   text);
    if (v->size != a->o->size)
        return say(a->o, SUMO_ERR_MISMATCH,
                   "the verdict under %s is of a membership of %d ranks; this rank's has %d", key,
                   v->size, a->o->size);
    p += used;
    for (int w = 0; w < words; w++) {
        if (sscanf(p, " %" SCNx64 "%n", &v->members[w], &used) != 1)
            return say(a->o, SUMO_ERR_INVALID_ARGUMENT, "%s holds \"%.80s\", not a verdict",
                       key, text);
        p += used;
    }
    if (*p != '\0')
        return say(a->o, SUMO_ERR_INVALID_ARGUMENT, "%s holds \"%.80s\", not a verdict", key,
                   text);
    return SUMO_SUCCESS;
}

/* Writes the verdict of the ranks that came and are not dead, unless one stands already. */
static sumo_result decide(agreement *a)
{
    verdict v = {.value = UINT64_MAX, .size = a->o->size};
    int64_t now = sumo__now_ns();
    for (int r = 0; r < a->o->size; r++) {
        bool out;
        SUMO__CHECK(is_out(a, r, now, true, &out));
        if (!out) {
            v.members[r / 64] |= (uint64_t)1 << (r % 64);
            v.value = SUMO__MIN(v.value, a->values[r]);
        }
    }
    char text[512], key[300];
    int n = snprintf(text, sizeof text, TAG " %" PRIu64 " %d", v.value, v.size);
    for (int w = 0; w < (a->o->size + 63) / 64; w++)
        n += snprintf(text + n, sizeof text - (size_t)n, " %" PRIx64, v.members[w]);
    verdict_key(a, key, sizeof key);
    sumo_result res = a->st->set_once(a->st->ctx, key, text, (size_t)n);
    if (res != SUMO_SUCCESS)
        return say(a->o, SUMO_ERR_SYSTEM, "the store failed writing %s (%s)", key,
                   sumo_result_name(res));
    return SUMO_SUCCESS;
}

static sumo_result adopt(agreement *a, const verdict *v, sumo_shrink_info *info)
{
    const sumo_agree_options *o = a->o;
    if (!member(v, o->rank))
        return say(o, SUMO_ERR_PEER_FAILURE,
                   "rank %d was left out of the survivors under %s (it came after the deadline "
                   "or the verdict, or its entry there was written over with what is not a "
                   "value)",
                   o->rank, o->key_prefix);
    int n = 0, mine = 0;
    for (int r = 0; r < o->size; r++) {
        if (!member(v, r)) continue;
        if (r < o->rank) mine++;
        if (info->old_ranks) info->old_ranks[n] = r;
        n++;
    }
    if (info->old_ranks)
        for (int k = n; k < o->size; k++) info->old_ranks[k] = -1;
    info->rank = mine;
    info->size = n;
    info->value = v->value;
    return SUMO_SUCCESS;
}

sumo_result sumo_agree_options_default(sumo_agree_options *options)
{
    if (options == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *options = (sumo_agree_options){.struct_size = sizeof *options};
    return SUMO_SUCCESS;
}

static sumo_result check(const sumo_agree_options *o, const sumo_shrink_info *info,
                         int64_t *timeout_ns, int64_t *alive_ns)
{
    char why[300];
    const char *bad = SUMO__STRUCT_SIZE_PROBLEM(o, sumo_agree_options, why, sizeof why);
    if (bad == NULL && info == NULL) bad = "info must not be NULL";
    if (bad == NULL) bad = SUMO__STRUCT_SIZE_PROBLEM(info, sumo_shrink_info, why, sizeof why);
    if (bad != NULL) return say(o, SUMO_ERR_INVALID_ARGUMENT, "%s", bad);
    if (o->size < 1 || o->size > MAX_RANKS || o->rank < 0 || o->rank >= o->size)
        return say(o, SUMO_ERR_INVALID_ARGUMENT, "rank %d of %d (1 to %d ranks)", o->rank,
                   o->size, MAX_RANKS);
    if (o->key_prefix == NULL || strlen(o->key_prefix) > MAX_PREFIX)
        return say(o, SUMO_ERR_INVALID_ARGUMENT, "key_prefix must be given, at most %d bytes",
                   MAX_PREFIX);
    const sumo_store *st = o->store;
    if (st == NULL || st->struct_size != sizeof *st || st->get == NULL || st->set == NULL ||
        st->set_once == NULL)
        return say(o, SUMO_ERR_INVALID_ARGUMENT,
                   "the store must be a sumo_store of this library's size with set, get and "
                   "set_once (the verdict is written once, atomically)");
    sumo_result r = sumo__store_waits(o->timeout_s, o->alive_prefix, o->alive_s, MAX_PREFIX,
                                      timeout_ns, alive_ns, why, sizeof why);
    return r == SUMO_SUCCESS ? r : say(o, r, "%s", why);
}

sumo_result sumo_store_agree(const sumo_agree_options *o, sumo_shrink_info *info)
{
    if (o == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    if (o->struct_size == sizeof *o && o->error && o->error_bytes > 0) o->error[0] = '\0';
    agreement *a = calloc(1, sizeof *a);
    if (a == NULL) return say(o, SUMO_ERR_SYSTEM, "out of memory");
    a->o = o;
    a->st = o->store;
    sumo_result res = check(o, info, &a->timeout_ns, &a->alive_ns);
    if (res != SUMO_SUCCESS) goto out;
    if (o->alive_prefix != NULL &&
        sumo__heartbeats_init(&a->beats, a->st, o->alive_prefix, a->alive_ns, o->size) !=
            SUMO_SUCCESS) {
        res = say(o, SUMO_ERR_SYSTEM, "out of memory");
        goto out;
    }

    char key[300], text[32];
    entry_key(a, key, sizeof key, o->rank);
    int n = snprintf(text, sizeof text, "%" PRIu64, o->value);
    res = a->st->set(a->st->ctx, key, text, (size_t)n);
    if (res != SUMO_SUCCESS) {
        res = say(o, SUMO_ERR_SYSTEM, "the store failed writing %s (%s)", key,
                  sumo_result_name(res));
        goto out;
    }
    a->came[o->rank] = true;
    a->values[o->rank] = o->value;

    const int64_t deadline = sumo__now_ns() + a->timeout_ns;
    int64_t takeover = INT64_MAX; /* when this rank decides regardless, once past the deadline */
    for (;;) {
        verdict v;
        res = read_verdict(a, sumo__now_ns() + POLL_NS, &v);
        if (res == SUMO_SUCCESS) {
            res = adopt(a, &v, info);
            goto out;
        }
        if (res != SUMO_ERR_TIMEOUT) goto out;
        int64_t now = sumo__now_ns();
        bool late = now >= deadline, lowest = true, all_in = true;
        /* A rank below that is not out decides before this one: while there is one, only it is
         * watched, so the store is read in full by the decider alone. */
        for (int r = 0; r < o->size && lowest; r++) {
            if (r == o->rank) continue;
            bool out;
            if ((res = is_out(a, r, now, late, &out)) != SUMO_SUCCESS) goto out;
            if (r < o->rank && !out) lowest = false;
            if (!out && !a->came[r]) all_in = false;
        }
        if (late && takeover == INT64_MAX) {
            /* Without heartbeats a decider that came and died is never out: rank k of those
             * that came decides anyway, k shares of the timeout past the deadline. */
            int below = 0;
            for (int r = 0; r < o->rank; r++) below += a->came[r];
            takeover = deadline + below * (a->timeout_ns / TAKEOVER_SHARE);
        }
        if (((lowest && all_in) || now >= takeover) && (res = decide(a)) != SUMO_SUCCESS)
            goto out;
        if (now >= deadline + a->timeout_ns) {
            res = say(o, SUMO_ERR_TIMEOUT,
                      "rank %d had no verdict under %s within twice the timeout (%.3f s)",
                      o->rank, o->key_prefix, 2 * (double)a->timeout_ns / 1e9);
            goto out;
        }
    }
out:
    sumo__heartbeats_free(&a->beats);
    free(a);
    return res;
}
