/*
 * libFuzzer harness for what sumo reads from a store, which anyone holding the store can write
 * (docs/security.md): the agreement's verdict and entries (store_agree.c), a heartbeat
 * (heartbeat.c), and the shared-memory meeting's records, rank 0's segment record as rank 1
 * reads it and rank 1's attach record as rank 0 reads it (shm_meeting.c), and the join
 * tickets (tickets.c). Each must be refused with a message or taken, never read out of
 * bounds, and never waited on past the deadline.
 *
 * Input: one selector byte, then the record's bytes. 0: the verdict, 1: rank 1's entry, read
 * by rank 0 of 2; 2: rank 1's heartbeat, read twice; 3: "seg/0", read by rank 1 of 2;
 * 4: "attach/0/1", read by rank 0 of 2; 5: another holder's ticket 1, then a ticket taken;
 * 6: ticket 1's place, waited for.
 */
#include "transport/heartbeat.h"

#include "sumo_elastic.h"
#include "sumo_shm.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A store of a few keys in memory: a get of a missing key answers SUMO_ERR_TIMEOUT at once,
 * as a store does at a deadline already past, so no input waits. */
#define KEYS 16
typedef struct mem_store {
    sumo_store store;
    int n;
    char key[KEYS][128];
    unsigned char *value[KEYS];
    size_t bytes[KEYS];
} mem_store;

static int find(const mem_store *m, const char *key)
{
    for (int i = 0; i < m->n; i++)
        if (strcmp(m->key[i], key) == 0) return i;
    return -1;
}

static sumo_result mem_set(void *ctx, const char *key, const void *value, size_t bytes)
{
    mem_store *m = ctx;
    int i = find(m, key);
    if (i < 0) {
        if (m->n == KEYS || strlen(key) >= sizeof m->key[0]) return SUMO_ERR_SYSTEM;
        i = m->n++;
        snprintf(m->key[i], sizeof m->key[i], "%s", key);
        m->value[i] = NULL;
    }
    free(m->value[i]);
    m->value[i] = malloc(bytes ? bytes : 1);
    if (m->value[i] == NULL) abort();
    if (bytes) memcpy(m->value[i], value, bytes);
    m->bytes[i] = bytes;
    return SUMO_SUCCESS;
}

static sumo_result mem_set_once(void *ctx, const char *key, const void *value, size_t bytes)
{
    return find(ctx, key) >= 0 ? SUMO_SUCCESS : mem_set(ctx, key, value, bytes);
}

static sumo_result mem_get(void *ctx, const char *key, void *value, size_t *bytes,
                           int64_t deadline_ns)
{
    (void)deadline_ns;
    const mem_store *m = ctx;
    int i = find(m, key);
    if (i < 0) return SUMO_ERR_TIMEOUT;
    memcpy(value, m->value[i], m->bytes[i] < *bytes ? m->bytes[i] : *bytes);
    *bytes = m->bytes[i];
    return SUMO_SUCCESS;
}

static sumo_result mem_remove(void *ctx, const char *key)
{
    mem_store *m = ctx;
    int i = find(m, key);
    if (i >= 0) {
        free(m->value[i]);
        m->n--;
        if (i != m->n) {
            memcpy(m->key[i], m->key[m->n], sizeof m->key[i]);
            m->value[i] = m->value[m->n];
            m->bytes[i] = m->bytes[m->n];
        }
    }
    return SUMO_SUCCESS;
}

static void mem_init(mem_store *m)
{
    memset(m, 0, sizeof *m);
    m->store = (sumo_store){.struct_size = sizeof m->store, .ctx = m, .set = mem_set,
                            .get = mem_get, .set_once = mem_set_once, .remove = mem_remove};
}

static void mem_free(mem_store *m)
{
    for (int i = 0; i < m->n; i++) free(m->value[i]);
}

static void agree(mem_store *m, char *err, size_t errlen)
{
    sumo_agree_options o;
    sumo_agree_options_default(&o);
    o.rank = 0;
    o.size = 2;
    o.value = 7;
    o.store = &m->store;
    o.key_prefix = "f/";
    o.timeout_s = 0.002;
    o.error = err;
    o.error_bytes = errlen;
    int old[2];
    sumo_shrink_info info = {.struct_size = sizeof info, .old_ranks = old};
    sumo_result r = sumo_store_agree(&o, &info);
    if (r == SUMO_SUCCESS && (info.size < 1 || info.size > 2 || info.rank != 0 || old[0] != 0))
        __builtin_trap();
    if (r != SUMO_SUCCESS && err[0] == '\0') __builtin_trap();
}

static void shm_meet(mem_store *m, int rank, char *err, size_t errlen)
{
    sumo_shm_options o;
    sumo_shm_options_default(&o);
    o.rank = rank;
    o.size = 2;
    o.store = &m->store;
    o.key_prefix = "f/";
    o.error = err;
    o.error_bytes = errlen;
    sumo_comm *comm = NULL;
    /* No peer ever comes: every input ends in a refusal or at the short deadline. */
    sumo_result r = sumo_comm_create_shm(&o, &comm);
    if (r == SUMO_SUCCESS || comm != NULL || err[0] == '\0') {
        fprintf(stderr, "rank %d: %s with no message\n", rank, sumo_result_name(r));
        __builtin_trap();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int once;
    if (!once) {
        once = 1;
        setenv("SUMO_TIMEOUT", "0.01", 1);
    }
    if (size < 1 || size > 4096) return 0;
    mem_store m;
    mem_init(&m);
    char err[512] = "";
    const uint8_t *rec = data + 1;
    size_t n = size - 1;
    switch (data[0] % 7) {
    case 0:
        mem_set(&m, "f/in/1", "9", 1);
        mem_set(&m, "f/verdict", rec, n);
        agree(&m, err, sizeof err);
        break;
    case 1:
        mem_set(&m, "f/in/1", rec, n);
        agree(&m, err, sizeof err);
        break;
    case 2: {
        sumo__heartbeats h;
        if (sumo__heartbeats_init(&h, &m.store, "alive/", 1000, 2) != SUMO_SUCCESS) abort();
        mem_set(&m, "alive/1", rec, n);
        bool dead = true;
        if (sumo__heartbeats_look(&h, 1, 1, 1, &dead) != SUMO_SUCCESS || dead) __builtin_trap();
        /* The same beat, past the liveness span: dead by the rule, whatever its bytes. */
        if (sumo__heartbeats_look(&h, 1, 1, 5000, &dead) != SUMO_SUCCESS || !dead)
            __builtin_trap();
        sumo__heartbeats_free(&h);
        break;
    }
    case 3:
        mem_set(&m, "f/seg/0", rec, n);
        shm_meet(&m, 1, err, sizeof err);
        break;
    case 4:
        mem_set(&m, "f/attach/0/1", rec, n);
        shm_meet(&m, 0, err, sizeof err);
        break;
    case 5: {
        mem_set(&m, "f/join/ticket/1", rec, n);
        int ticket = 0, count = -1;
        sumo_result r = sumo_ticket_take(&m.store, "f/", &ticket, err, sizeof err);
        /* Whatever the other holder wrote, this one holds the next ticket. */
        if (r != SUMO_SUCCESS || ticket != 2) __builtin_trap();
        if (sumo_tickets_count(&m.store, "f/", 0, &count, err, sizeof err) != SUMO_SUCCESS ||
            count != 2)
            __builtin_trap();
        break;
    }
    default: {
        mem_set(&m, "f/join/place/1", rec, n);
        char place[64];
        sumo_result r = sumo_ticket_wait(&m.store, "f/", 1, 0.001, place, sizeof place, err,
                                         sizeof err);
        if (r != SUMO_SUCCESS || strlen(place) >= sizeof place) __builtin_trap();
        break;
    }
    }
    mem_free(&m);
    return 0;
}
