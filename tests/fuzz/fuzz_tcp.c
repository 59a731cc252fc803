/*
 * libFuzzer harness for what a TCP rank reads from a connection (tcp_meeting.c, then
 * transport_tcp.c): the hello and the ready of a lower rank, then the frames of a collective.
 * The harness plays rank 0 of 2 against a real rank 1 (a thread: sumo_comm_create_tcp, then
 * one allreduce) over 127.0.0.1, through a store in memory. Whatever arrives must end in
 * success or a failure with a message, before the short deadline, and never out of bounds.
 *
 * Input: the hello (32 bytes) and the ready (32 bytes) as differences from valid ones (so
 * zeros are this job's rank 0, and the fuzzer starts from a meeting that succeeds), then the
 * bytes sent as frames. A short input sends only what it holds.
 */
#include "sumo_tcp.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The meeting's records and messages as a peer sees them (tcp_meeting.c's layouts). */
#define HELLO_MAGIC 0x7063745f6f6d7573ull
#define READY_MAGIC 0x7964725f6f6d7573ull
#define VERSION 2u
typedef struct { uint64_t magic, nonce; int32_t size; uint32_t version; } job_record;
typedef struct { uint64_t magic, nonce; int32_t rank; uint32_t port; char host[64]; } addr_record;
typedef struct { uint64_t magic, nonce; int32_t from, to, size; uint32_t version; } hello;

#define KEYS 8
typedef struct mem_store {
    sumo_store store;
    pthread_mutex_t lock;
    int n;
    char key[KEYS][128];
    unsigned char value[KEYS][256];
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
    pthread_mutex_lock(&m->lock);
    int i = find(m, key);
    if (i < 0 && m->n < KEYS && strlen(key) < sizeof m->key[0]) {
        i = m->n++;
        snprintf(m->key[i], sizeof m->key[i], "%s", key);
    }
    if (i >= 0 && bytes <= sizeof m->value[i]) {
        memcpy(m->value[i], value, bytes);
        m->bytes[i] = bytes;
    }
    pthread_mutex_unlock(&m->lock);
    return i >= 0 && bytes <= sizeof m->value[0] ? SUMO_SUCCESS : SUMO_ERR_SYSTEM;
}

static int64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static sumo_result mem_get(void *ctx, const char *key, void *value, size_t *bytes,
                           int64_t deadline_ns)
{
    mem_store *m = ctx;
    for (;;) {
        pthread_mutex_lock(&m->lock);
        int i = find(m, key);
        if (i >= 0) {
            memcpy(value, m->value[i], m->bytes[i] < *bytes ? m->bytes[i] : *bytes);
            *bytes = m->bytes[i];
        }
        pthread_mutex_unlock(&m->lock);
        if (i >= 0) return SUMO_SUCCESS;
        if (now_ns() >= deadline_ns) return SUMO_ERR_TIMEOUT;
        usleep(200);
    }
}

static sumo_result mem_remove(void *ctx, const char *key)
{
    (void)ctx, (void)key;
    return SUMO_SUCCESS;
}

typedef struct rank1 {
    mem_store *store;
    sumo_result made, reduced;
    char err[512];
} rank1;

static void *run_rank1(void *p)
{
    rank1 *r = p;
    sumo_tcp_options o;
    sumo_tcp_options_default(&o);
    o.rank = 1;
    o.size = 2;
    o.store = &r->store->store;
    o.key_prefix = "f/";
    o.address = "127.0.0.1";
    o.error = r->err;
    o.error_bytes = sizeof r->err;
    sumo_comm *comm = NULL;
    r->made = sumo_comm_create_tcp(&o, &comm);
    if (r->made == SUMO_SUCCESS) {
        float x[4] = {1, 2, 3, 4};
        r->reduced = sumo_allreduce(x, x, 4, SUMO_FLOAT32, SUMO_OP_SUM, comm);
        const char *msg = NULL;
        sumo_comm_error_message(comm, &msg);
        if (r->reduced != SUMO_SUCCESS && (msg == NULL || msg[0] == '\0')) __builtin_trap();
        sumo_comm_destroy(comm);
    } else if (r->err[0] == '\0') {
        __builtin_trap();
    }
    return NULL;
}

static void xor_into(void *dst, const uint8_t *mask, size_t n)
{
    for (size_t i = 0; i < n; i++) ((uint8_t *)dst)[i] ^= mask[i];
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int once;
    if (!once) {
        once = 1;
        setenv("SUMO_TIMEOUT", "0.05", 1);
    }
    if (size > 4096) return 0;
    mem_store m = {.store = {.struct_size = sizeof m.store, .set = mem_set, .get = mem_get,
                             .remove = mem_remove}};
    m.store.ctx = &m;
    pthread_mutex_init(&m.lock, NULL);
    const uint64_t nonce = 0x1234567890abcdefull;
    job_record job = {.magic = HELLO_MAGIC, .nonce = nonce, .size = 2, .version = VERSION};
    mem_set(&m, "f/tcp/nonce", &job, sizeof job);
    rank1 r = {.store = &m};
    pthread_t t;
    if (pthread_create(&t, NULL, run_rank1, &r) != 0) abort();
    addr_record a;
    size_t got = sizeof a;
    int fd = -1;
    if (mem_get(&m, "f/tcp/addr/1", &a, &got, now_ns() + 2000000000LL) == SUMO_SUCCESS &&
        got == sizeof a) {
        fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)a.port)};
        inet_pton(AF_INET, "127.0.0.1", &sin.sin_addr);
        if (connect(fd, (struct sockaddr *)&sin, sizeof sin) == 0) {
            hello h = {HELLO_MAGIC, nonce, 0, 1, 2, VERSION}, rd = {READY_MAGIC, nonce, 0, 1, 2, VERSION};
            size_t hn = size < sizeof h ? size : sizeof h;
            xor_into(&h, data, hn);
            (void)!send(fd, &h, hn, MSG_NOSIGNAL);
            if (size > sizeof h) {
                hello back;
                (void)!recv(fd, &back, sizeof back, MSG_WAITALL);
                size_t rn = size - sizeof h < sizeof rd ? size - sizeof h : sizeof rd;
                xor_into(&rd, data + sizeof h, rn);
                (void)!send(fd, &rd, rn, MSG_NOSIGNAL);
            }
            if (size > 2 * sizeof h)
                (void)!send(fd, data + 2 * sizeof h, size - 2 * sizeof h, MSG_NOSIGNAL);
        }
    }
    /* Nothing more comes: rank 1 reads the end of the stream instead of waiting it out. */
    if (fd >= 0) close(fd);
    pthread_join(t, NULL);
    pthread_mutex_destroy(&m.lock);
    return 0;
}
