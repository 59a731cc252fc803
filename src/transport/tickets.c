/*
 * Join tickets in a store (tickets.h): set_once scanning upward instead of an atomic add,
 * which sumo's directory store does not have.
 */
#include "transport/tickets.h"

#include "sumo_elastic.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

/* A holder looks for its place at this pace: the members take joiners in at a commit, which
 * comes once per step or outer round. */
#define WAIT_SLICE_NS (20 * 1000 * 1000)

static sumo_result tell(sumo_result code, char *why, size_t why_bytes, const char *what,
                        const char *key, sumo_result res)
{
    if (why != NULL && why_bytes > 0)
        snprintf(why, why_bytes, "the store failed %s %s (%s)", what, key, sumo_result_name(res));
    return code;
}

static void ticket_key(const char *root, const char *kind, int k, char *key, size_t bytes)
{
    snprintf(key, bytes, "%sjoin/%s/%d", root, kind, k);
}

/* Whether key is there, without waiting. */
static sumo_result there(const sumo_store *st, const char *key, bool *is, char *value,
                         size_t *bytes)
{
    char scratch[8];
    size_t n = sizeof scratch;
    sumo_result res = st->get(st->ctx, key, value ? value : scratch, value ? bytes : &n,
                              sumo__now_ns());
    *is = res == SUMO_SUCCESS;
    return res == SUMO_ERR_TIMEOUT ? SUMO_SUCCESS : res;
}

sumo_result sumo__ticket_take(const sumo_store *st, const char *root, int *ticket, char *why,
                              size_t why_bytes)
{
    /* The nonce tells this holder's value from another's that took the same key first. */
    uint64_t draw[2] = {0, 0};
    if (getrandom(draw, sizeof draw, 0) != (ssize_t)sizeof draw) {
        if (why) snprintf(why, why_bytes, "no random nonce for a join ticket");
        return SUMO_ERR_SYSTEM;
    }
    char mine[64], key[300];
    int len = snprintf(mine, sizeof mine, "%016" PRIx64 "%016" PRIx64 "-%ld", draw[0], draw[1],
                       (long)getpid());
    for (int k = 1; k <= SUMO__MAX_TICKETS; k++) {
        ticket_key(root, "ticket", k, key, sizeof key);
        sumo_result res = st->set_once(st->ctx, key, mine, (size_t)len);
        if (res != SUMO_SUCCESS) return tell(SUMO_ERR_SYSTEM, why, why_bytes, "writing", key, res);
        char held[64];
        size_t n = sizeof held;
        res = st->get(st->ctx, key, held, &n, sumo__now_ns());
        if (res != SUMO_SUCCESS) return tell(SUMO_ERR_SYSTEM, why, why_bytes, "reading", key, res);
        if (n == (size_t)len && memcmp(held, mine, n) == 0) {
            *ticket = k;
            return SUMO_SUCCESS;
        }
    }
    if (why) snprintf(why, why_bytes, "the job's %d join tickets are all taken", SUMO__MAX_TICKETS);
    return SUMO_ERR_INVALID_USAGE;
}

sumo_result sumo__tickets_count(const sumo_store *st, const char *root, int from, int *count,
                                char *why, size_t why_bytes)
{
    int k = from < 0 ? 0 : from;
    for (; k < SUMO__MAX_TICKETS; k++) {
        char key[300];
        bool is = false;
        ticket_key(root, "ticket", k + 1, key, sizeof key);
        sumo_result res = there(st, key, &is, NULL, NULL);
        if (res != SUMO_SUCCESS) return tell(SUMO_ERR_SYSTEM, why, why_bytes, "reading", key, res);
        if (!is) break;
    }
    *count = k;
    return SUMO_SUCCESS;
}

sumo_result sumo__ticket_place(const sumo_store *st, const char *root, int ticket,
                               const char *text, char *why, size_t why_bytes)
{
    char key[300];
    ticket_key(root, "place", ticket, key, sizeof key);
    sumo_result res = st->set(st->ctx, key, text, strlen(text));
    return res == SUMO_SUCCESS ? res : tell(SUMO_ERR_SYSTEM, why, why_bytes, "writing", key, res);
}

sumo_result sumo__ticket_wait(const sumo_store *st, const char *root, int ticket,
                              int64_t deadline_ns, char *text, size_t bytes, char *why,
                              size_t why_bytes)
{
    char key[300], closed[300];
    ticket_key(root, "place", ticket, key, sizeof key);
    snprintf(closed, sizeof closed, "%sjoin/closed", root);
    for (;;) {
        size_t n = bytes - 1;
        int64_t slice = SUMO__MIN(deadline_ns, sumo__now_ns() + WAIT_SLICE_NS);
        sumo_result res = st->get(st->ctx, key, text, &n, slice);
        if (res == SUMO_SUCCESS) {
            text[SUMO__MIN(n, bytes - 1)] = '\0';
            if (st->remove != NULL) st->remove(st->ctx, key);
            return SUMO_SUCCESS;
        }
        if (res != SUMO_ERR_TIMEOUT)
            return tell(SUMO_ERR_SYSTEM, why, why_bytes, "reading", key, res);
        bool is = false;
        res = there(st, closed, &is, NULL, NULL);
        if (res != SUMO_SUCCESS)
            return tell(SUMO_ERR_SYSTEM, why, why_bytes, "reading", closed, res);
        if (is) {
            if (why)
                snprintf(why, why_bytes, "the job ended before taking in join ticket %d", ticket);
            return SUMO_ERR_PEER_FAILURE;
        }
        if (sumo__now_ns() >= deadline_ns) {
            if (why)
                snprintf(why, why_bytes, "join ticket %d was not taken in before the deadline",
                         ticket);
            return SUMO_ERR_TIMEOUT;
        }
    }
}

sumo_result sumo__tickets_close(const sumo_store *st, const char *root, char *why,
                                size_t why_bytes)
{
    char key[300];
    snprintf(key, sizeof key, "%sjoin/closed", root);
    sumo_result res = st->set(st->ctx, key, "1", 1);
    return res == SUMO_SUCCESS ? res : tell(SUMO_ERR_SYSTEM, why, why_bytes, "writing", key, res);
}

/* ---- the public face (sumo_elastic.h): the same protocol, with its arguments checked ----- */

static sumo_result refused(const sumo_store *st, const char *root, char *why, size_t why_bytes,
                           bool once)
{
    if (st == NULL || st->struct_size != sizeof *st || st->get == NULL || st->set == NULL ||
        (once && st->set_once == NULL)) {
        if (why && why_bytes)
            snprintf(why, why_bytes, "the store must be a sumo_store of this library's size "
                                     "with set, get%s", once ? " and set_once" : "");
        return SUMO_ERR_INVALID_ARGUMENT;
    }
    if (root == NULL || strlen(root) > 160) {
        if (why && why_bytes) snprintf(why, why_bytes, "key_prefix must be given, at most 160 bytes");
        return SUMO_ERR_INVALID_ARGUMENT;
    }
    return SUMO_SUCCESS;
}

sumo_result sumo_ticket_take(const sumo_store *store, const char *key_prefix, int *ticket,
                             char *error, size_t error_bytes)
{
    if (ticket == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    SUMO__CHECK(refused(store, key_prefix, error, error_bytes, true));
    return sumo__ticket_take(store, key_prefix, ticket, error, error_bytes);
}

sumo_result sumo_tickets_count(const sumo_store *store, const char *key_prefix, int from,
                               int *count, char *error, size_t error_bytes)
{
    if (count == NULL || from < 0) return SUMO_ERR_INVALID_ARGUMENT;
    SUMO__CHECK(refused(store, key_prefix, error, error_bytes, false));
    return sumo__tickets_count(store, key_prefix, from, count, error, error_bytes);
}

sumo_result sumo_ticket_place(const sumo_store *store, const char *key_prefix, int ticket,
                              const char *text, char *error, size_t error_bytes)
{
    if (ticket < 1 || text == NULL || strlen(text) > 240) {
        if (error && error_bytes)
            snprintf(error, error_bytes, "ticket %d (from 1) and a place of at most 240 bytes",
                     ticket);
        return SUMO_ERR_INVALID_ARGUMENT;
    }
    SUMO__CHECK(refused(store, key_prefix, error, error_bytes, false));
    return sumo__ticket_place(store, key_prefix, ticket, text, error, error_bytes);
}

sumo_result sumo_ticket_wait(const sumo_store *store, const char *key_prefix, int ticket,
                             double timeout_s, char *text, size_t bytes, char *error,
                             size_t error_bytes)
{
    if (ticket < 1 || text == NULL || bytes == 0 || !(timeout_s >= 0 && timeout_s < 1e7)) {
        if (error && error_bytes)
            snprintf(error, error_bytes, "ticket %d (from 1), a text buffer and a timeout_s of "
                                         "seconds (%g)", ticket, timeout_s);
        return SUMO_ERR_INVALID_ARGUMENT;
    }
    SUMO__CHECK(refused(store, key_prefix, error, error_bytes, false));
    return sumo__ticket_wait(store, key_prefix, ticket, sumo__now_ns() + (int64_t)(timeout_s * 1e9),
                             text, bytes, error, error_bytes);
}

sumo_result sumo_tickets_close(const sumo_store *store, const char *key_prefix, char *error,
                               size_t error_bytes)
{
    SUMO__CHECK(refused(store, key_prefix, error, error_bytes, false));
    return sumo__tickets_close(store, key_prefix, error, error_bytes);
}
