/*
 * sumo_store_commit (sumo_elastic.h): whether the members of a new membership keep the
 * communicator each has made, decided once in the store for all. A meeting across hosts can
 * end differently on two ranks (a member that dies once some peers have met it fails the
 * meeting on the others only), and members that kept a communicator while others agree again
 * would never meet again. Keys under the prefix: made/<rank> ("1", each member's own, set once
 * it holds its communicator) and outcome ("ok" or "fail", by set_once: the first written
 * stands). Only set, get and set_once are needed, so the directory store serves as well as
 * torch's.
 */
#include "common/common.h"
#include "transport/heartbeat.h"

#include "sumo_elastic.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_RANKS 1024
#define MAX_PREFIX 230
/* The members look at the store at this pace: a commit follows a making, which takes longer. */
#define POLL_NS (5 * 1000 * 1000)

static sumo_result say(const sumo_commit_options *o, sumo_result code, const char *fmt, ...)
{
    if (o && o->struct_size == sizeof *o && o->error && o->error_bytes > 0) {
        va_list ap;
        va_start(ap, fmt);
        int n = snprintf(o->error, o->error_bytes, "sumo_store_commit: ");
        if (n >= 0 && (size_t)n < o->error_bytes)
            vsnprintf(o->error + n, o->error_bytes - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return code;
}

sumo_result sumo_commit_options_default(sumo_commit_options *options)
{
    if (options == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *options = (sumo_commit_options){.struct_size = sizeof *options, .made = 1};
    return SUMO_SUCCESS;
}

static sumo_result check(const sumo_commit_options *o, int64_t *timeout_ns, int64_t *alive_ns)
{
    char why[300];
    if (o == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    const char *bad = SUMO__STRUCT_SIZE_PROBLEM(o, sumo_commit_options, why, sizeof why);
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
                   "set_once (the outcome is written once, atomically)");
    if (o->made != 0 && o->made != 1)
        return say(o, SUMO_ERR_INVALID_ARGUMENT, "made is %d, not 0 or 1", o->made);
    sumo_result r = sumo__store_waits(o->timeout_s, o->alive_prefix, o->alive_s, MAX_PREFIX,
                                      timeout_ns, alive_ns, why, sizeof why);
    return r == SUMO_SUCCESS ? r : say(o, r, "%s", why);
}

/* The outcome standing under the prefix, without waiting: *got false when none yet. */
static sumo_result read_outcome(const sumo_commit_options *o, bool *got, bool *ok)
{
    char key[300], text[8];
    size_t n = sizeof text - 1;
    snprintf(key, sizeof key, "%soutcome", o->key_prefix);
    sumo_result res = o->store->get(o->store->ctx, key, text, &n, sumo__now_ns());
    *got = false;
    if (res == SUMO_ERR_TIMEOUT) return SUMO_SUCCESS;
    if (res != SUMO_SUCCESS)
        return say(o, SUMO_ERR_SYSTEM, "the store failed reading %s (%s)", key,
                   sumo_result_name(res));
    if (n >= sizeof text) n = sizeof text - 1;
    text[n] = '\0';
    if (strcmp(text, "ok") != 0 && strcmp(text, "fail") != 0)
        return say(o, SUMO_ERR_INVALID_ARGUMENT, "%s holds \"%s\", not an outcome", key, text);
    *got = true;
    *ok = strcmp(text, "ok") == 0;
    return SUMO_SUCCESS;
}

/* Proposes an outcome; the one that stands (maybe another member's) comes back in *ok. */
static sumo_result decide(const sumo_commit_options *o, bool proposal, bool *ok)
{
    char key[300];
    const char *text = proposal ? "ok" : "fail";
    snprintf(key, sizeof key, "%soutcome", o->key_prefix);
    sumo_result res = o->store->set_once(o->store->ctx, key, text, strlen(text));
    if (res != SUMO_SUCCESS)
        return say(o, SUMO_ERR_SYSTEM, "the store failed writing %s (%s)", key,
                   sumo_result_name(res));
    bool got = false;
    SUMO__CHECK(read_outcome(o, &got, ok));
    if (!got) return say(o, SUMO_ERR_SYSTEM, "%s was written but reads as absent", key);
    return SUMO_SUCCESS;
}

static void made_key(const sumo_commit_options *o, int r, char *key, size_t bytes)
{
    snprintf(key, bytes, "%smade/%d", o->key_prefix, r);
}

/* Whether every member has counted itself; seen[] keeps those already found. */
static sumo_result all_made(const sumo_commit_options *o, bool *seen, bool *all)
{
    *all = true;
    for (int r = 0; r < o->size; r++) {
        if (seen[r]) continue;
        char key[300], text[8];
        size_t n = sizeof text;
        made_key(o, r, key, sizeof key);
        sumo_result res = o->store->get(o->store->ctx, key, text, &n, sumo__now_ns());
        if (res == SUMO_ERR_TIMEOUT) {
            *all = false;
            return SUMO_SUCCESS; /* the rest are read at the next look */
        }
        if (res != SUMO_SUCCESS)
            return say(o, SUMO_ERR_SYSTEM, "the store failed reading %s (%s)", key,
                       sumo_result_name(res));
        seen[r] = true;
    }
    return SUMO_SUCCESS;
}

/* The first member (slot) whose heartbeat has stood still, -1 for none; this rank is never. */
static int stalled(const sumo_commit_options *o, sumo__heartbeats *beats)
{
    if (o->alive_prefix == NULL) return -1;
    int64_t now = sumo__now_ns();
    for (int r = 0; r < o->size; r++) {
        int who = o->alive_ranks ? o->alive_ranks[r] : r;
        bool dead = false;
        if (r == o->rank || who < 0) continue;
        sumo__heartbeats_look(beats, r, who, now, &dead); /* a store failing reads as no beat */
        if (dead) return r;
    }
    return -1;
}

static sumo_result wait_outcome(const sumo_commit_options *o, int64_t timeout_ns,
                                sumo__heartbeats *beats, bool *seen, bool *ok, char *why,
                                size_t why_bytes)
{
    const int64_t deadline = sumo__now_ns() + timeout_ns;
    for (;;) {
        bool got = false, all = false;
        SUMO__CHECK(read_outcome(o, &got, ok));
        if (got) return SUMO_SUCCESS;
        SUMO__CHECK(all_made(o, seen, &all));
        if (all) return decide(o, true, ok);
        int dead = stalled(o, beats);
        if (dead >= 0) {
            snprintf(why, why_bytes, "member %d's heartbeat stood still", dead);
            return decide(o, false, ok);
        }
        if (sumo__now_ns() > deadline) {
            snprintf(why, why_bytes, "the members did not all make theirs within %.3g s",
                     (double)timeout_ns / 1e9);
            return decide(o, false, ok);
        }
        nanosleep(&(struct timespec){0, POLL_NS}, NULL);
    }
}

sumo_result sumo_store_commit(const sumo_commit_options *o)
{
    int64_t timeout_ns = 0, alive_ns = 0;
    SUMO__CHECK(check(o, &timeout_ns, &alive_ns));
    char key[300], why[160] = "another member failed to make its own, or saw one lost";
    bool ok = false;
    if (!o->made) {
        SUMO__CHECK(decide(o, false, &ok));
        return say(o, SUMO_ERR_PEER_FAILURE,
                   "rank %d failed to make its communicator: the outcome under %s is fail",
                   o->rank, o->key_prefix);
    }
    made_key(o, o->rank, key, sizeof key);
    sumo_result res = o->store->set(o->store->ctx, key, "1", 1);
    if (res != SUMO_SUCCESS)
        return say(o, SUMO_ERR_SYSTEM, "the store failed writing %s (%s)", key,
                   sumo_result_name(res));
    sumo__heartbeats beats = {0};
    bool *seen = calloc((size_t)o->size, sizeof *seen);
    if (seen == NULL ||
        (o->alive_prefix != NULL &&
         sumo__heartbeats_init(&beats, o->store, o->alive_prefix, alive_ns, o->size) !=
             SUMO_SUCCESS)) {
        free(seen);
        return say(o, SUMO_ERR_SYSTEM, "out of memory for %d members", o->size);
    }
    res = wait_outcome(o, timeout_ns, &beats, seen, &ok, why, sizeof why);
    free(seen);
    if (o->alive_prefix != NULL) sumo__heartbeats_free(&beats);
    /* Once an outcome stands nobody reads the counts again; the outcome stays for a member
     * that comes late. */
    if (res == SUMO_SUCCESS && o->store->remove != NULL) o->store->remove(o->store->ctx, key);
    if (res != SUMO_SUCCESS) return res;
    if (!ok)
        return say(o, SUMO_ERR_PEER_FAILURE,
                   "the members of %d under %s keep nothing (the outcome is fail: %s)", o->size,
                   o->key_prefix, why);
    return SUMO_SUCCESS;
}
