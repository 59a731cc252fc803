/*
 * Heartbeats in a store: the reader (heartbeat.h), one rule for whoever waits on ranks of
 * other hosts.
 */
#include "transport/heartbeat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

bool sumo__heartbeats_key(const sumo__heartbeats *h, int who, char *key, size_t bytes)
{
    int n = snprintf(key, bytes, "%s%d", h->prefix, who);
    return n >= 0 && (size_t)n < bytes;
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

