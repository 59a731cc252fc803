/*
 * The TCP transport's meeting (tcp_meeting.h): the store's records, the choice of the address
 * to listen on, the hellos and the heartbeat watch. Every wait is cut by the meeting's
 * deadline; the connections it leaves are the exchange engine's (transport_tcp.c).
 */
#include "transport/tcp_meeting.h"
#include "common/settings.h"
#include "transport/heartbeat.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define HELLO_MAGIC 0x7063745f6f6d7573ull /* "sumo_tcp" */
#define READY_MAGIC 0x7964725f6f6d7573ull /* "sumo_rdy" */
/* 2: a lower rank says it is ready after the hellos, and a refused hello says why. */
#define TCP_VERSION 2u
#define KEY_BYTES 256
#define HOST_BYTES 64
/* Connections accepted but not yet introduced, at most (a stray beyond it is dropped). */
#define MAX_PENDING 64
/* With heartbeats, waits are cut in slices of this, between which the store is read: a
 * meeting follows an agreement, so a tenth of a second does not count. */
#define LOOK_MS 100
#define LOOK_NS ((int64_t)LOOK_MS * 1000000)

/* Rank 0 -> every rank: the job's nonce and size. */
typedef struct nonce_record {
    uint64_t magic;
    uint64_t nonce;
    int32_t size;
    uint32_t version;
} nonce_record;

/* Rank r > 0 -> the lower ranks: where it listens. */
typedef struct addr_record {
    uint64_t magic;
    uint64_t nonce;
    int32_t rank;
    uint32_t port;
    char host[HOST_BYTES];
} addr_record;

/* The first bytes on a connection, each way: who opens it and whom it is for. */
typedef struct hello {
    uint64_t magic;
    uint64_t nonce;
    int32_t from, to, size;
    uint32_t version;
} hello;

/* The heartbeats an elastic job's meeting watches (sumo_tcp_options.alive_prefix). */
typedef struct watch {
    int64_t next_look;      /* the store is read at most once per LOOK_NS */
    sumo__heartbeats beats; /* slot r: rank r's, under alive_prefix and alive_ranks[r] */
} watch;

typedef struct meeting {
    const sumo_tcp_options *o;
    int64_t deadline;
    double seconds;
    int log_level;
    uint64_t nonce;
    char *err;
    size_t errlen;
    watch *w; /* NULL: no heartbeats, every wait runs to the deadline */
} meeting;

static sumo_result meet_fail(const meeting *m, sumo_result code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static sumo_result meet_fail(const meeting *m, sumo_result code, const char *fmt, ...)
{
    char msg[240];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(m->err, m->errlen, "rank %d of %d: %s", m->o->rank, m->o->size, msg);
    return code;
}

static sumo_result make_key(const meeting *m, char *key, const char *suffix, int rank)
{
    int w = rank < 0 ? snprintf(key, KEY_BYTES, "%stcp/%s", m->o->key_prefix, suffix)
                     : snprintf(key, KEY_BYTES, "%stcp/%s/%d", m->o->key_prefix, suffix, rank);
    if (w < 0 || w >= KEY_BYTES)
        return meet_fail(m, SUMO_ERR_INVALID_ARGUMENT, "key prefix \"%.40s...\" is too long "
                         "(keys at most %d bytes)", m->o->key_prefix, KEY_BYTES - 1);
    return SUMO_SUCCESS;
}

static sumo_result store_set(const meeting *m, const char *key, const void *v, size_t bytes)
{
    const sumo_store *s = m->o->store;
    sumo_result r = s->set(s->ctx, key, v, bytes);
    if (r != SUMO_SUCCESS)
        return meet_fail(m, r, "the store's set of \"%s\" failed (%s)", key, sumo_result_name(r));
    return SUMO_SUCCESS;
}

static sumo_result keep_waiting(const meeting *m, const int *conn, int lo, int hi);

static sumo_result store_get(const meeting *m, const char *key, void *v, size_t bytes,
                             const char *whose, int peer)
{
    const sumo_store *s = m->o->store;
    size_t got = bytes;
    sumo_result r;
    for (;;) {
        int64_t until = m->deadline;
        if (m->w && until - sumo__now_ns() > LOOK_NS) until = sumo__now_ns() + LOOK_NS;
        got = bytes;
        r = s->get(s->ctx, key, v, &got, until);
        if (r != SUMO_ERR_TIMEOUT || until == m->deadline) break;
        sumo_result k = keep_waiting(m, NULL, peer, peer + 1);
        if (k != SUMO_SUCCESS) return k;
    }
    if (r == SUMO_ERR_TIMEOUT)
        return meet_fail(m, r, "waited %.3f s for %s (store key \"%s\"): deadline reached "
                         "(the rank never came; raise the wait with SUMO_TIMEOUT)", m->seconds,
                         whose, key);
    if (r != SUMO_SUCCESS)
        return meet_fail(m, r, "the store's get of \"%s\" failed (%s)", key, sumo_result_name(r));
    if (got != bytes)
        return meet_fail(m, SUMO_ERR_MISMATCH, "store key \"%s\" holds %zu bytes, not the %zu "
                         "of this library's record (a peer of another sumo version, or a key "
                         "prefix used before)", key, got, bytes);
    return SUMO_SUCCESS;
}

static void store_remove(const meeting *m, const char *key)
{
    const sumo_store *s = m->o->store;
    if (s->struct_size >= offsetof(sumo_store, remove) + sizeof s->remove && s->remove != NULL)
        s->remove(s->ctx, key);
}

static void nap_ms(int ms)
{
    nanosleep(&(struct timespec){.tv_nsec = (long)ms * 1000000L}, NULL);
}

static int remaining_ms(const meeting *m)
{
    int64_t left = m->deadline - sumo__now_ns();
    if (left <= 0) return 0;
    return (int)SUMO__MIN(left / 1000000 + 1, (int64_t)1000000);
}

/* How long one poll may wait: the rest of the meeting, or with heartbeats one slice of it. */
static int slice_ms(const meeting *m)
{
    int ms = remaining_ms(m);
    return m->w && ms > LOOK_MS ? LOOK_MS : ms;
}

/* With heartbeats, between slices of a wait: SUMO_ERR_PEER_FAILURE, said, when a rank marked
 * the meeting failed (a live rank that gave up is otherwise waited for to the deadline), or
 * when a rank in lo .. hi - 1 not yet connected (conn NULL: each) has beaten no more for
 * alive_ns. SUMO_SUCCESS otherwise, and without heartbeats. */
static sumo_result keep_waiting(const meeting *m, const int *conn, int lo, int hi)
{
    watch *w = m->w;
    int64_t now = sumo__now_ns();
    if (w == NULL || now < w->next_look) return SUMO_SUCCESS;
    w->next_look = now + LOOK_NS;
    const sumo_store *s = m->o->store;
    char key[KEY_BYTES], text[128];
    size_t n = sizeof text - 1;
    if (make_key(m, key, "failed", -1) == SUMO_SUCCESS &&
        s->get(s->ctx, key, text, &n, now) == SUMO_SUCCESS) {
        text[SUMO__MIN(n, sizeof text - 1)] = '\0';
        return meet_fail(m, SUMO_ERR_PEER_FAILURE, "the meeting failed on %s", text);
    }
    for (int r = lo; r < hi; r++) {
        if (r == m->o->rank || (conn && conn[r] >= 0)) continue;
        int who = m->o->alive_ranks ? m->o->alive_ranks[r] : r;
        if (who < 0) continue;
        bool dead;
        sumo__heartbeats_look(&w->beats, r, who, now, &dead); /* a store failing: no beat */
        if (dead) {
            char beat_key[SUMO__BEAT_KEY_BYTES];
            sumo__heartbeats_key(&w->beats, who, beat_key, sizeof beat_key);
            return meet_fail(m, SUMO_ERR_PEER_FAILURE, "rank %d's heartbeat (%s) has not moved "
                             "for %.1f s while this rank waited for it: it died after the "
                             "membership was agreed", r, beat_key,
                             (double)w->beats.alive_ns * 1e-9);
        }
    }
    return SUMO_SUCCESS;
}

static void numeric_host(const struct sockaddr *sa, socklen_t len, char *host, size_t hostlen)
{
    if (getnameinfo(sa, len, host, (socklen_t)hostlen, NULL, 0, NI_NUMERICHOST) != 0)
        snprintf(host, hostlen, "?");
}

static bool is_loopback(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)(const void *)sa)->sin_addr.s_addr) >> 24) == 127;
    if (sa->sa_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr;
        return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
    }
    return false;
}

/* The rank of an interface address for SUMO_SOCKET_IFNAME: IPv4 first, then global IPv6,
 * then link-local IPv6 (which needs its scope to be reached); 0 for no usable address. */
static int if_address_rank(const struct sockaddr *sa)
{
    if (sa == NULL) return 0;
    if (sa->sa_family == AF_INET) return 3;
    if (sa->sa_family != AF_INET6) return 0;
    const struct in6_addr *a = &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr;
    return IN6_IS_ADDR_LINKLOCAL(a) ? 1 : 2;
}

/* The best address of the interface named `want` (the exact name first, else the first name
 * it is a prefix of, in getifaddrs' order), or a refusal that lists the interfaces here. */
static sumo_result interface_address(const meeting *m, const char *want, char *host,
                                     size_t hostlen)
{
    struct ifaddrs *all = NULL;
    if (getifaddrs(&all) != 0)
        return meet_fail(m, SUMO_ERR_SYSTEM, "SUMO_SOCKET_IFNAME=%s: getifaddrs: %s", want,
                         strerror(errno));
    const struct ifaddrs *best = NULL;
    int best_rank = 0;
    for (int exact = 1; exact >= 0 && best == NULL; exact--) {
        const char *prefix_of = NULL; /* the first interface the prefix names: only its addresses */
        for (const struct ifaddrs *i = all; i; i = i->ifa_next) {
            bool named = exact ? strcmp(i->ifa_name, want) == 0
                               : strncmp(i->ifa_name, want, strlen(want)) == 0 &&
                                     (prefix_of == NULL || strcmp(prefix_of, i->ifa_name) == 0);
            int rank = named ? if_address_rank(i->ifa_addr) : 0;
            if (rank == 0) continue;
            if (!exact) prefix_of = i->ifa_name;
            if (rank > best_rank) best = i, best_rank = rank;
        }
    }
    if (best != NULL) {
        socklen_t len = best->ifa_addr->sa_family == AF_INET ? sizeof(struct sockaddr_in)
                                                              : sizeof(struct sockaddr_in6);
        numeric_host(best->ifa_addr, len, host, hostlen);
        freeifaddrs(all);
        return SUMO_SUCCESS;
    }
    char names[256] = "";
    size_t at = 0;
    for (const struct ifaddrs *i = all; i && at + 1 < sizeof names; i = i->ifa_next) {
        bool listed = false; /* an interface has an entry per address: named once */
        for (const struct ifaddrs *j = all; j != i && !listed; j = j->ifa_next)
            listed = if_address_rank(j->ifa_addr) != 0 && strcmp(j->ifa_name, i->ifa_name) == 0;
        if (if_address_rank(i->ifa_addr) == 0 || listed) continue;
        int w = snprintf(names + at, sizeof names - at, "%s%s", at ? ", " : "", i->ifa_name);
        if (w > 0) at += (size_t)w;
    }
    freeifaddrs(all);
    return meet_fail(m, SUMO_ERR_INVALID_ARGUMENT,
                     "SUMO_SOCKET_IFNAME=%s: no interface of that name (or with it as a prefix) "
                     "has an address here; this host's with one: %s", want,
                     at ? names : "none");
}

/* The address this rank listens on: the options', else SUMO_SOCKET_IFNAME's, else the one
 * that routes to route_host, else the host name's first address that is not a loopback one,
 * else 127.0.0.1. */
static sumo_result own_address(const meeting *m, char *host, size_t hostlen)
{
    if (m->o->address) {
        snprintf(host, hostlen, "%s", m->o->address);
        return SUMO_SUCCESS;
    }
    sumo__setting_value ifname;
    char why[256];
    if (sumo__setting_read(SUMO__SETTING_SOCKET_IFNAME, &ifname, why, sizeof why) != SUMO_SUCCESS)
        return meet_fail(m, SUMO_ERR_INVALID_ARGUMENT, "%s", why);
    if (ifname.set) return interface_address(m, ifname.text, host, hostlen);
    struct addrinfo hints = {.ai_socktype = SOCK_DGRAM}, *res = NULL;
    if (m->o->route_host && getaddrinfo(m->o->route_host, "9", &hints, &res) == 0) {
        for (struct addrinfo *a = res; a; a = a->ai_next) {
            int fd = socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
            if (fd < 0) continue;
            struct sockaddr_storage ss;
            socklen_t len = sizeof ss;
            /* A UDP connect sends nothing: it only picks the route and the source address. */
            bool ok = connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
                      getsockname(fd, (struct sockaddr *)&ss, &len) == 0;
            close(fd);
            if (ok) {
                numeric_host((struct sockaddr *)&ss, len, host, hostlen);
                freeaddrinfo(res);
                return SUMO_SUCCESS;
            }
        }
        freeaddrinfo(res);
    }
    char name[256];
    res = NULL;
    hints = (struct addrinfo){.ai_socktype = SOCK_STREAM};
    if (gethostname(name, sizeof name) == 0 && getaddrinfo(name, NULL, &hints, &res) == 0) {
        for (struct addrinfo *a = res; a; a = a->ai_next) {
            if (is_loopback(a->ai_addr)) continue;
            numeric_host(a->ai_addr, a->ai_addrlen, host, hostlen);
            freeaddrinfo(res);
            return SUMO_SUCCESS;
        }
        freeaddrinfo(res);
    }
    snprintf(host, hostlen, "127.0.0.1");
    return SUMO_SUCCESS;
}

static sumo_result listen_on(const meeting *m, const char *host, int *fd_out, addr_record *rec)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *res = NULL;
    int rc = getaddrinfo(host, "0", &hints, &res);
    if (rc != 0)
        return meet_fail(m, SUMO_ERR_SYSTEM, "cannot resolve the address \"%s\" to listen on "
                         "(%s)", host, gai_strerror(rc));
    int err = 0;
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        int fd = socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) {
            err = errno;
            continue;
        }
        struct sockaddr_storage ss;
        socklen_t len = sizeof ss;
        if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, SUMO__MIN(m->o->size, 128)) == 0 &&
            getsockname(fd, (struct sockaddr *)&ss, &len) == 0) {
            numeric_host((struct sockaddr *)&ss, len, rec->host, sizeof rec->host);
            rec->port = ntohs(ss.ss_family == AF_INET
                                  ? ((struct sockaddr_in *)&ss)->sin_port
                                  : ((struct sockaddr_in6 *)&ss)->sin6_port);
            freeaddrinfo(res);
            *fd_out = fd;
            return SUMO_SUCCESS;
        }
        err = errno;
        close(fd);
    }
    freeaddrinfo(res);
    return meet_fail(m, SUMO_ERR_SYSTEM, "cannot listen on %s (%s)", host, strerror(err));
}

/* Writes or reads exactly bytes on a non-blocking socket before the deadline. */
static sumo_result io_all(const meeting *m, int fd, void *buf, size_t bytes, bool send_it,
                          int peer, const char *what)
{
    size_t done = 0;
    while (done < bytes) {
        ssize_t n = send_it ? send(fd, (char *)buf + done, bytes - done, MSG_NOSIGNAL)
                            : recv(fd, (char *)buf + done, bytes - done, 0);
        if (n > 0) {
            done += (size_t)n;
            continue;
        }
        if (n == 0)
            return meet_fail(m, SUMO_ERR_PEER_FAILURE, "rank %d closed the connection during "
                             "the %s (another job's listener, or the peer failed)", peer, what);
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return meet_fail(m, SUMO_ERR_PEER_FAILURE, "the %s with rank %d failed (%s)", what,
                             peer, strerror(errno));
        int ms = slice_ms(m);
        if (ms == 0)
            return meet_fail(m, SUMO_ERR_TIMEOUT, "waited %.3f s for the %s with rank %d: "
                             "deadline reached (raise it with SUMO_TIMEOUT)", m->seconds, what,
                             peer);
        struct pollfd p = {.fd = fd, .events = send_it ? POLLOUT : POLLIN};
        poll(&p, 1, ms);
        sumo_result k = keep_waiting(m, NULL, peer, peer + 1);
        if (k != SUMO_SUCCESS) return k;
    }
    return SUMO_SUCCESS;
}

static void no_delay(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* Reads where the higher rank `peer` listens. */
static sumo_result address_of(const meeting *m, int peer, addr_record *rec)
{
    char key[KEY_BYTES], whose[48];
    SUMO__CHECK(make_key(m, key, "addr", peer));
    snprintf(whose, sizeof whose, "rank %d's address", peer);
    /* A record of another job (a prefix used before) is waited past: the peer overwrites it. */
    for (;;) {
        SUMO__CHECK(store_get(m, key, rec, sizeof *rec, whose, peer));
        if (rec->magic == HELLO_MAGIC && rec->nonce == m->nonce && rec->rank == peer) break;
        if (remaining_ms(m) == 0)
            return meet_fail(m, SUMO_ERR_TIMEOUT, "store key \"%s\" still holds another job's "
                             "address of rank %d at the deadline (a key prefix used before)",
                             key, peer);
        nap_ms(10);
        SUMO__CHECK(keep_waiting(m, NULL, peer, peer + 1));
    }
    rec->host[sizeof rec->host - 1] = '\0';
    return SUMO_SUCCESS;
}

/* Opens the connection to the higher rank `peer` listening at rec and introduces this rank. */
static sumo_result connect_to(const meeting *m, int peer, const addr_record *rec_in, int *fd_out)
{
    addr_record rec = *rec_in;
    char port[16];
    snprintf(port, sizeof port, "%u", (unsigned)rec.port);
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICHOST | AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    int rc = getaddrinfo(rec.host, port, &hints, &res);
    if (rc != 0)
        return meet_fail(m, SUMO_ERR_SYSTEM, "rank %d's address %s:%s does not parse (%s)", peer,
                         rec.host, port, gai_strerror(rc));
    int fd = -1, err = 0;
    for (;;) {
        fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) {
            err = errno;
            break;
        }
        if (connect(fd, res->ai_addr, res->ai_addrlen) == 0) break;
        err = errno;
        if (err == EINPROGRESS) {
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            err = ETIMEDOUT;
            for (int ms; (ms = slice_ms(m)) > 0;) {
                if (poll(&p, 1, ms) == 1) {
                    socklen_t len = sizeof err;
                    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
                    break;
                }
                sumo_result k = keep_waiting(m, NULL, peer, peer + 1);
                if (k != SUMO_SUCCESS) {
                    close(fd);
                    freeaddrinfo(res);
                    return k;
                }
            }
            if (err == 0) break;
        }
        close(fd);
        fd = -1;
        /* The peer listens from before it publishes its address until every lower rank has
         * connected: a refusal means it is gone. Without heartbeats it is tried again, as a
         * job of its own may start its ranks as it likes. */
        if (m->w && err == ECONNREFUSED) {
            freeaddrinfo(res);
            return meet_fail(m, SUMO_ERR_PEER_FAILURE, "rank %d refused the connection at %s:%s: "
                             "it is gone (it died or gave up the meeting)", peer, rec.host, port);
        }
        /* Refused or unreachable for now: tried again until the deadline. */
        if (remaining_ms(m) == 0 || (err != ECONNREFUSED && err != EAGAIN && err != ENETUNREACH &&
                                     err != EHOSTUNREACH && err != ETIMEDOUT && err != EINTR))
            break;
        nap_ms(10);
    }
    freeaddrinfo(res);
    if (fd < 0)
        return meet_fail(m, err == ETIMEDOUT ? SUMO_ERR_TIMEOUT : SUMO_ERR_SYSTEM,
                         "cannot connect to rank %d at %s:%s (%s)", peer, rec.host, port,
                         strerror(err));
    no_delay(fd);
    hello mine = {.magic = HELLO_MAGIC, .nonce = m->nonce, .from = m->o->rank, .to = peer,
                  .size = m->o->size, .version = TCP_VERSION};
    hello back;
    sumo_result r = io_all(m, fd, &mine, sizeof mine, true, peer, "hello");
    if (r == SUMO_SUCCESS) r = io_all(m, fd, &back, sizeof back, false, peer, "hello's answer");
    if (r == SUMO_SUCCESS && back.magic == HELLO_MAGIC && back.nonce == m->nonce &&
        back.from == peer && back.size == -1)
        r = meet_fail(m, SUMO_ERR_MISMATCH, "rank %d refused this rank's hello: another "
                      "connection already claims rank %d (a process that read the job's nonce "
                      "from the store, or this rank started twice)", peer, m->o->rank);
    if (r == SUMO_SUCCESS && (back.magic != HELLO_MAGIC || back.nonce != m->nonce ||
                              back.from != peer || back.to != m->o->rank ||
                              back.size != m->o->size || back.version != TCP_VERSION))
        r = meet_fail(m, SUMO_ERR_MISMATCH, "%s:%s answered as another job's or rank's listener "
                      "(rank %d of %d expected)", rec.host, port, peer, m->o->size);
    if (r != SUMO_SUCCESS) {
        close(fd);
        return r;
    }
    *fd_out = fd;
    return SUMO_SUCCESS;
}

typedef struct pending {
    int fd;
    size_t got;
    hello h;
} pending;

/* A lower rank's word over its connection that it has met every rank it meets itself: until
 * then the listener stays open, so a second process claiming that rank is still seen. */
typedef struct ready {
    size_t got;
    hello h;
    bool in;
} ready;

/* What a hello for this rank says of its sender: one of this job's lower ranks, or a stranger. */
static bool ours(const meeting *m, const hello *h)
{
    int me = m->o->rank;
    return h->magic == HELLO_MAGIC && h->nonce == m->nonce && h->to == me &&
           h->size == m->o->size && h->version == TCP_VERSION && h->from >= 0 && h->from < me;
}

/* A hello whose rank is already connected: two processes claim one rank, so one of them is
 * not this job's rank (an impostor that read the job's nonce from the store) or the rank was
 * started twice. Either way no group can be made: the claimant is told (a refusal with size
 * -1) and the meeting fails here, which ends every connected peer's meeting too. */
static sumo_result two_claims(const meeting *m, int fd, int rank)
{
    hello no = {.magic = HELLO_MAGIC, .nonce = m->nonce, .from = m->o->rank, .to = rank,
                .size = -1, .version = TCP_VERSION};
    (void)!send(fd, &no, sizeof no, MSG_NOSIGNAL | MSG_DONTWAIT);
    return meet_fail(m, SUMO_ERR_MISMATCH, "rank %d was claimed by two connections: one of them "
                     "is not this job's rank %d (a process that read the job's nonce from the "
                     "store) or rank %d was started twice", rank, rank, rank);
}

/* Reads lower rank j's ready; false once its connection fails or says something else. */
static bool read_ready(const meeting *m, int fd, ready *rd, int j)
{
    ssize_t n = recv(fd, (char *)&rd->h + rd->got, sizeof rd->h - rd->got, 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return true;
    if (n <= 0) return false;
    rd->got += (size_t)n;
    if (rd->got < sizeof rd->h) return true;
    rd->in = rd->h.magic == READY_MAGIC && rd->h.nonce == m->nonce && rd->h.from == j &&
             rd->h.to == m->o->rank;
    return rd->in;
}

/* Accepts every lower rank on the listener, refusing (closing) any connection whose hello is
 * not one of this job's lower ranks for this rank, and failing on a second claim of a rank;
 * returns once every lower rank is connected and ready (it has met all its own ranks). */
static sumo_result accept_lower(const meeting *m, int lfd, int *conn)
{
    int me = m->o->rank, missing = me, waiting = me;
    pending pend[MAX_PENDING];
    int np = 0;
    ready *rd = calloc((size_t)me, sizeof *rd);
    int *at = malloc(((size_t)me + MAX_PENDING + 1) * sizeof *at);
    struct pollfd *fds = malloc(((size_t)me + MAX_PENDING + 1) * sizeof *fds);
    if (rd == NULL || at == NULL || fds == NULL) {
        free(rd), free(at), free(fds);
        return meet_fail(m, SUMO_ERR_SYSTEM, "out of memory");
    }
    sumo_result r = SUMO_SUCCESS;
    while (waiting > 0 && r == SUMO_SUCCESS) {
        nfds_t nf = 0;
        fds[nf++] = (struct pollfd){.fd = lfd, .events = POLLIN};
        for (int i = 0; i < np; i++) fds[nf++] = (struct pollfd){.fd = pend[i].fd, .events = POLLIN};
        for (int j = 0; j < me; j++)
            if (conn[j] >= 0 && !rd[j].in) {
                at[nf] = j;
                fds[nf++] = (struct pollfd){.fd = conn[j], .events = POLLIN};
            }
        int ms = slice_ms(m);
        if (ms == 0) {
            char list[120] = "";
            size_t used = 0;
            for (int j = 0; j < me && used + 8 < sizeof list; j++)
                if (conn[j] < 0) used += (size_t)snprintf(list + used, sizeof list - used, " %d", j);
            r = missing > 0 ? meet_fail(m, SUMO_ERR_TIMEOUT, "waited %.3f s for ranks%s to "
                                        "connect: deadline reached (raise it with SUMO_TIMEOUT)",
                                        m->seconds, list)
                            : meet_fail(m, SUMO_ERR_TIMEOUT, "waited %.3f s for the lower ranks "
                                        "to meet their peers: deadline reached (raise it with "
                                        "SUMO_TIMEOUT)", m->seconds);
            break;
        }
        if (poll(fds, nf, ms) < 0 && errno != EINTR) {
            r = meet_fail(m, SUMO_ERR_SYSTEM, "poll failed (%s)", strerror(errno));
            break;
        }
        for (nfds_t f = 1 + (nfds_t)np; f < nf && r == SUMO_SUCCESS; f++) {
            int j = at[f];
            if (!(fds[f].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            if (!read_ready(m, conn[j], &rd[j], j))
                r = meet_fail(m, SUMO_ERR_PEER_FAILURE, "rank %d's connection ended or sent "
                              "something else before it was ready", j);
            else if (rd[j].in)
                waiting--;
        }
        for (int i = np - 1; i >= 0 && r == SUMO_SUCCESS; i--) {
            if (!(fds[i + 1].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            pending *p = &pend[i];
            ssize_t n = recv(p->fd, (char *)&p->h + p->got, sizeof p->h - p->got, 0);
            if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
            bool drop = n <= 0;
            if (n > 0) p->got += (size_t)n;
            if (!drop && p->got == sizeof p->h) {
                const hello *h = &p->h;
                hello ack = {.magic = HELLO_MAGIC, .nonce = m->nonce, .from = me, .to = h->from,
                             .size = m->o->size, .version = TCP_VERSION};
                if (ours(m, h) && conn[h->from] >= 0) {
                    r = two_claims(m, p->fd, h->from);
                } else if (ours(m, h) && io_all(m, p->fd, &ack, sizeof ack, true, h->from,
                                                "hello's answer") == SUMO_SUCCESS) {
                    conn[h->from] = p->fd;
                    missing--;
                    p->fd = -1;
                } else {
                    m->err[0] = '\0';
                    sumo__log(m->log_level, SUMO__LOG_WARN, __FILE__, __LINE__,
                              "rank %d: refused a connection that is not one of this job's ranks",
                              me);
                }
                drop = true;
            }
            if (drop) {
                if (p->fd >= 0) close(p->fd);
                pend[i] = pend[--np];
            }
        }
        if (r == SUMO_SUCCESS && (fds[0].revents & POLLIN)) {
            int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
            if (fd >= 0) {
                if (np == MAX_PENDING) { /* the oldest stranger goes */
                    close(pend[0].fd);
                    pend[0] = pend[--np];
                }
                no_delay(fd);
                pend[np++] = (pending){.fd = fd};
            }
        }
        if (r == SUMO_SUCCESS && waiting > 0) r = keep_waiting(m, conn, 0, me);
    }
    for (int i = 0; i < np; i++) close(pend[i].fd);
    free(rd), free(at), free(fds);
    return r;
}

/* Tells every higher rank that this one has met all its peers (see struct ready). */
static sumo_result send_ready(const meeting *m, const int *conn)
{
    int me = m->o->rank;
    for (int j = me + 1; j < m->o->size; j++) {
        hello h = {.magic = READY_MAGIC, .nonce = m->nonce, .from = me, .to = j,
                   .size = m->o->size, .version = TCP_VERSION};
        SUMO__CHECK(io_all(m, conn[j], &h, sizeof h, true, j, "ready"));
    }
    return SUMO_SUCCESS;
}

static uint64_t fresh_nonce(void)
{
    uint64_t v = 0;
    if (getrandom(&v, sizeof v, GRND_NONBLOCK) != (ssize_t)sizeof v)
        v = (uint64_t)sumo__now_ns() ^ ((uint64_t)getpid() << 32);
    return v | 1; /* never 0 */
}

static sumo_result meet(const meeting *mc, int *conn)
{
    meeting mm = *mc;
    meeting *m = &mm;
    const sumo_tcp_options *o = m->o;
    int me = o->rank, P = o->size;
    char key[KEY_BYTES];
    int lfd = -1;
    sumo_result r = SUMO_SUCCESS;
    /* Rank 0 names the job; the others learn it first. */
    SUMO__CHECK(make_key(m, key, "nonce", -1));
    nonce_record nr;
    if (me == 0) {
        nr = (nonce_record){.magic = HELLO_MAGIC, .nonce = fresh_nonce(), .size = P,
                            .version = TCP_VERSION};
        SUMO__CHECK(store_set(m, key, &nr, sizeof nr));
    } else {
        SUMO__CHECK(store_get(m, key, &nr, sizeof nr, "rank 0's job record", 0));
        if (nr.magic != HELLO_MAGIC || nr.version != TCP_VERSION)
            return meet_fail(m, SUMO_ERR_MISMATCH, "store key \"%s\" holds no record of this "
                             "library's version", key);
        if (nr.size != P)
            return meet_fail(m, SUMO_ERR_MISMATCH, "rank 0 makes a group of %d, this rank one of "
                             "%d", (int)nr.size, P);
    }
    m->nonce = nr.nonce;
    if (me > 0) {
        char host[HOST_BYTES + 192];
        SUMO__CHECK(own_address(m, host, sizeof host));
        addr_record rec = {.magic = HELLO_MAGIC, .nonce = m->nonce, .rank = me};
        SUMO__CHECK(listen_on(m, host, &lfd, &rec));
        if ((r = make_key(m, key, "addr", me)) == SUMO_SUCCESS)
            r = store_set(m, key, &rec, sizeof rec);
        if (r != SUMO_SUCCESS) goto out;
    }
    /* Every higher rank's address first: a rank that never comes is then waited for (and
     * named) by every rank alike, not seen as a lower rank giving up. */
    addr_record *addrs = P - me > 1 ? calloc((size_t)(P - me - 1), sizeof *addrs) : NULL;
    if (P - me > 1 && addrs == NULL) {
        r = meet_fail(m, SUMO_ERR_SYSTEM, "out of memory");
        goto out;
    }
    for (int j = me + 1; j < P && r == SUMO_SUCCESS; j++) r = address_of(m, j, &addrs[j - me - 1]);
    for (int j = me + 1; j < P && r == SUMO_SUCCESS; j++)
        r = connect_to(m, j, &addrs[j - me - 1], &conn[j]);
    free(addrs);
    if (r != SUMO_SUCCESS) goto out;
    if (me > 0) {
        r = accept_lower(m, lfd, conn);
        if (r != SUMO_SUCCESS) goto out;
    }
    r = send_ready(m, conn);
    if (r != SUMO_SUCCESS) goto out;
    /* Every lower rank has read this rank's address (and every rank the nonce: rank 0 has
     * heard each one answer): the keys have served. */
    if (make_key(m, key, me == 0 ? "nonce" : "addr", me == 0 ? -1 : me) == SUMO_SUCCESS)
        store_remove(m, key);
out:
    if (lfd >= 0) close(lfd); /* nothing listens once the group is met */
    return r;
}

sumo_result sumo__tcp_meet(const sumo__tcp_meeting *in, int *conn)
{
    const sumo_tcp_options *o = in->o;
    char *err = in->err;
    size_t errlen = in->errlen;
    for (int r = 0; r < o->size; r++) conn[r] = -1;
    meeting m = {.o = o, .deadline = in->deadline, .seconds = in->seconds,
                 .log_level = in->log_level, .err = err, .errlen = errlen};
    watch w = {0};
    sumo_result r = SUMO_SUCCESS;
    if (o->alive_prefix != NULL) {
        double seconds = o->alive_s;
        if (seconds == 0) {
            sumo__setting_value v;
            r = sumo__setting_read(SUMO__SETTING_LIVENESS_TIMEOUT, &v, err, errlen);
            seconds = v.number;
        }
        if (r == SUMO_SUCCESS && !(seconds > 0 && seconds < 1e7)) {
            snprintf(err, errlen, "options.alive_s %g is not a number of seconds", seconds);
            r = SUMO_ERR_INVALID_ARGUMENT;
        }
        if (r == SUMO_SUCCESS &&
            sumo__heartbeats_init(&w.beats, o->store, o->alive_prefix, (int64_t)(seconds * 1e9),
                                  o->size) != SUMO_SUCCESS) {
            snprintf(err, errlen, "out of memory for a group of %d", o->size);
            r = SUMO_ERR_SYSTEM;
        }
        m.w = &w;
    }
    if (r == SUMO_SUCCESS) {
        r = meet(&m, conn);
        char key[KEY_BYTES], mark[64];
        /* The others may wait on this rank, alive, to the deadline: they read why it left.
         * The first reason stands (set_once; without it, a mark already there is kept): a
         * rank that leaves on reading the mark must not replace the cause with itself. */
        if (r != SUMO_SUCCESS && m.w && make_key(&m, key, "failed", -1) == SUMO_SUCCESS) {
            const sumo_store *st = o->store;
            int n = snprintf(mark, sizeof mark, "rank %d (%s)", o->rank, sumo_result_name(r));
            size_t len = (size_t)SUMO__MIN(n, (int)sizeof mark - 1), had = sizeof mark;
            char old[64];
            if (st->set_once != NULL) st->set_once(st->ctx, key, mark, len);
            else if (st->get(st->ctx, key, old, &had, sumo__now_ns()) != SUMO_SUCCESS)
                st->set(st->ctx, key, mark, len);
        }
    }
    sumo__heartbeats_free(&w.beats);
    if (r != SUMO_SUCCESS)
        for (int p = 0; p < o->size; p++)
            if (conn[p] >= 0) {
                close(conn[p]);
                conn[p] = -1;
            }
    return r;
}
