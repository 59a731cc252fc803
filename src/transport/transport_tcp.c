/*
 * The TCP transport: one connection per pair of ranks, opened once through the caller's store
 * (the meeting: tcp_meeting.c; sumo_tcp.h says how the ranks meet), then every message in
 * sumo's C code: nothing calls back into the caller per message.
 *
 * Every message is a frame: a 16-byte header (magic, kind, the sequence number of the pair's
 * direction, the payload's length) and the payload. The receiver checks each field against
 * what it expects, so a stream out of step (a length, a kind or an order that does not match)
 * fails the call instead of filling a buffer with another message's bytes.
 *
 * One exchange engine runs every operation: a set of sends and receives on the connections,
 * all progressed at once on non-blocking sockets (a ring or a pairwise exchange cannot
 * deadlock) and waited for with ppoll() until the group's deadline. An abort shuts every
 * connection of the rank down (its peers read the end of the stream at once and fail with
 * SUMO_ERR_PEER_FAILURE) and wakes this rank's own wait through an eventfd. Reach is NONE:
 * the collectives run their point-to-point algorithms.
 */
#include "transport/transport_tcp.h"
#include "transport/tcp_meeting.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define FRAME_MAGIC 0x5c7au

enum { KIND_DATA = 1, KIND_ANNOUNCE = 2, KIND_BARRIER = 3 };

static const char *const kind_names[] = {"?", "data", "announce", "barrier"};

typedef struct frame_header {
    uint16_t magic;
    uint16_t kind;
    uint32_t seq;
    uint64_t bytes;
} frame_header;

typedef struct tcp_peer {
    int fd; /* -1 for this rank */
    uint32_t send_seq, recv_seq;
} tcp_peer;

typedef struct tcp_transport {
    sumo__transport base;
    tcp_peer *peers;
    int wake; /* eventfd: abort wakes a wait of this rank */
    atomic_bool aborted;
} tcp_transport;

/* One send or receive of an exchange. */
typedef struct xfer {
    int peer;
    bool send;
    bool done;
    uint16_t kind;
    frame_header hdr; /* a send's, filled in; a receive's, as read */
    size_t hdr_done;
    unsigned char *buf;
    size_t bytes, done_bytes;
} xfer;

static sumo_result wake_fail(tcp_transport *t, sumo_result code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static sumo_result wake_fail(tcp_transport *t, sumo_result code, const char *fmt, ...)
{
    char msg[220];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return SUMO__FAIL(&t->base, code, "%s", msg);
}

/* ---- the exchange engine -------------------------------------------------------------------- */

/* Moves what the socket takes now. 1: finished; 0: would block; -1: failed (why set). */
static int progress(tcp_transport *t, xfer *x, const char *what, sumo_result *code, char *why,
                    size_t whylen)
{
    int fd = t->peers[x->peer].fd;
    for (;;) {
        struct iovec iov[2];
        int n = 0;
        size_t hdr_left = sizeof x->hdr - x->hdr_done;
        if (hdr_left) iov[n++] = (struct iovec){(unsigned char *)&x->hdr + x->hdr_done, hdr_left};
        if (x->bytes > x->done_bytes) iov[n++] = (struct iovec){x->buf + x->done_bytes, x->bytes - x->done_bytes};
        if (n == 0) {
            x->done = true;
            return 1;
        }
        struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)n};
        ssize_t got = x->send ? sendmsg(fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT)
                              : recvmsg(fd, &m, MSG_DONTWAIT);
        if (got < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
            *code = SUMO_ERR_PEER_FAILURE;
            snprintf(why, whylen, "%s: the connection with rank %d failed while %s %zu bytes "
                     "(%s): the peer ended or aborted", what, x->peer,
                     x->send ? "sending" : "receiving", x->bytes, strerror(errno));
            return -1;
        }
        if (got == 0 && !x->send) {
            *code = SUMO_ERR_PEER_FAILURE;
            snprintf(why, whylen, "%s: rank %d closed its connection while this rank waited for "
                     "%zu bytes from it (the peer ended, failed or aborted)", what, x->peer,
                     x->bytes);
            return -1;
        }
        size_t moved = (size_t)got;
        size_t into_hdr = SUMO__MIN(moved, hdr_left);
        x->hdr_done += into_hdr;
        x->done_bytes += moved - into_hdr;
        if (!x->send && into_hdr && x->hdr_done == sizeof x->hdr) {
            /* The header is whole: is it the message this receive expects? */
            uint32_t want_seq = t->peers[x->peer].recv_seq;
            const frame_header *h = &x->hdr;
            const char *bad = h->magic != FRAME_MAGIC ? "a header without sumo's mark"
                              : h->kind != x->kind   ? "a message of another kind"
                              : h->seq != want_seq   ? "a message out of sequence"
                              : h->bytes != x->bytes ? "a message of another length"
                                                     : NULL;
            if (bad) {
                *code = SUMO_ERR_INTERNAL;
                snprintf(why, whylen, "%s: rank %d sent %s: %s %" PRIu32 " of %" PRIu64
                         " bytes where %s %" PRIu32 " of %zu bytes was expected (the ranks "
                         "are out of step)", what, x->peer, bad,
                         h->kind < 4 ? kind_names[h->kind] : "?", h->seq, h->bytes,
                         kind_names[x->kind], want_seq, x->bytes);
                return -1;
            }
        }
    }
}

static const char *peer_list(const xfer *xs, int n, char *out, size_t len)
{
    size_t used = 0;
    out[0] = '\0';
    for (int i = 0; i < n && used + 16 < len; i++) {
        if (xs[i].done) continue;
        used += (size_t)snprintf(out + used, len - used, "%s%s rank %d", used ? "," : "",
                                 xs[i].send ? " send to" : " receive from", xs[i].peer);
    }
    return out;
}

/* Runs every xfer to its end, all at once, until the group's deadline; work (may be NULL),
 * one slice at a time, while the sockets are not ready, so the link is not idle while the
 * caller adds. */
static sumo_result exchange_working(tcp_transport *t, xfer *xs, int n, const char *what,
                                    sumo__work_fn work, void *ctx)
{
    if (atomic_load(&t->aborted))
        return wake_fail(t, SUMO_ERR_PEER_FAILURE, "%s: this rank's group was aborted", what);
    for (int i = 0; i < n; i++) {
        xfer *x = &xs[i];
        tcp_peer *p = &t->peers[x->peer];
        if (x->send) {
            x->hdr = (frame_header){.magic = FRAME_MAGIC, .kind = x->kind, .seq = p->send_seq++,
                                    .bytes = x->bytes};
        }
    }
    int64_t deadline = sumo__now_ns() + t->base.timeout_ns;
    struct pollfd stack[16];
    struct pollfd *fds = n + 1 <= 16 ? stack : malloc(sizeof *fds * (size_t)(n + 1));
    if (fds == NULL) return wake_fail(t, SUMO_ERR_SYSTEM, "%s: out of memory", what);
    sumo_result r = SUMO_SUCCESS;
    char why[220];
    for (;;) {
        int left = 0, nf = 0;
        for (int i = 0; i < n; i++) {
            xfer *x = &xs[i];
            if (x->done) continue;
            sumo_result code = SUMO_SUCCESS;
            int s = progress(t, x, what, &code, why, sizeof why);
            if (s < 0) {
                r = wake_fail(t, atomic_load(&t->aborted) ? SUMO_ERR_PEER_FAILURE : code, "%s",
                              why);
                goto out;
            }
            if (s == 1) {
                if (!x->send) t->peers[x->peer].recv_seq++;
                continue;
            }
            left++;
            fds[nf++] = (struct pollfd){.fd = t->peers[x->peer].fd,
                                        .events = x->send ? POLLOUT : POLLIN};
        }
        if (left == 0) break;
        if (atomic_load(&t->aborted)) {
            r = wake_fail(t, SUMO_ERR_PEER_FAILURE, "%s: this rank's group was aborted", what);
            goto out;
        }
        int64_t wait = deadline - sumo__now_ns();
        if (wait <= 0) {
            char peers[160];
            r = wake_fail(t, SUMO_ERR_TIMEOUT, "%s: rank %d waited %.3f s (%s): deadline "
                          "reached (raise it with SUMO_TIMEOUT)", what, t->base.rank,
                          (double)t->base.timeout_ns * 1e-9, peer_list(xs, n, peers, sizeof peers));
            goto out;
        }
        if (work != NULL) {
            /* A slice of work, then a look at the sockets without waiting. */
            if (!work(ctx)) work = NULL;
            wait = 0;
        }
        fds[nf++] = (struct pollfd){.fd = t->wake, .events = POLLIN};
        struct timespec ts = {.tv_sec = wait / 1000000000, .tv_nsec = wait % 1000000000};
        if (ppoll(fds, (nfds_t)nf, &ts, NULL) < 0 && errno != EINTR) {
            r = wake_fail(t, SUMO_ERR_SYSTEM, "%s: poll failed (%s)", what, strerror(errno));
            goto out;
        }
    }
out:
    if (fds != stack) free(fds);
    return r;
}

static sumo_result exchange(tcp_transport *t, xfer *xs, int n, const char *what)
{
    return exchange_working(t, xs, n, what, NULL, NULL);
}

/* ---- the operations ------------------------------------------------------------------------ */

static sumo_result tcp_sendrecv_working(sumo__transport *tp, const void *sbuf, size_t sbytes,
                                        int dst, void *rbuf, size_t rbytes, int src,
                                        sumo__work_fn work, void *ctx)
{
    tcp_transport *t = (tcp_transport *)tp;
    if (dst == tp->rank || src == tp->rank) {
        if (dst != src || sbytes != rbytes)
            return wake_fail(t, SUMO_ERR_INTERNAL, "sendrecv: rank %d sends to itself %zu bytes "
                             "but receives %zu (dst %d, src %d)", tp->rank, sbytes, rbytes, dst,
                             src);
        if (sbytes) memmove(rbuf, sbuf, sbytes);
        return SUMO_SUCCESS;
    }
    xfer xs[2];
    int n = 0;
    /* The receive first: its header is checked as soon as it lands. */
    if (src >= 0)
        xs[n++] = (xfer){.peer = src, .kind = KIND_DATA, .buf = rbuf, .bytes = rbytes};
    if (dst >= 0)
        xs[n++] = (xfer){.peer = dst, .send = true, .kind = KIND_DATA,
                         .buf = (unsigned char *)(uintptr_t)sbuf, .bytes = sbytes};
    return exchange_working(t, xs, n, "sendrecv", work, ctx);
}

static sumo_result tcp_sendrecv(sumo__transport *tp, const void *sbuf, size_t sbytes, int dst,
                                void *rbuf, size_t rbytes, int src)
{
    return tcp_sendrecv_working(tp, sbuf, sbytes, dst, rbuf, rbytes, src, NULL, NULL);
}

/* Every rank sends its record to every other and receives theirs, all at once. */
static sumo_result gather_all(tcp_transport *t, const void *record, void *all, size_t bytes,
                              uint16_t kind, const char *what)
{
    int P = t->base.size, me = t->base.rank;
    unsigned char own[SUMO__ANNOUNCE_BYTES];
    if (bytes > sizeof own)
        return wake_fail(t, SUMO_ERR_INTERNAL, "%s: a record of %zu bytes (at most %d)", what,
                         bytes, SUMO__ANNOUNCE_BYTES);
    if (bytes) memcpy(own, record, bytes);
    xfer stack[32];
    xfer *xs = 2 * (P - 1) <= 32 ? stack : malloc(sizeof *xs * (size_t)(2 * (P - 1)));
    if (xs == NULL) return wake_fail(t, SUMO_ERR_SYSTEM, "%s: out of memory", what);
    int n = 0;
    unsigned char *out = all;
    for (int k = 1; k < P; k++) {
        int to = (me + k) % P, from = (me - k + P) % P;
        xs[n++] = (xfer){.peer = from, .kind = kind, .buf = out ? out + (size_t)from * bytes : NULL,
                         .bytes = bytes};
        xs[n++] = (xfer){.peer = to, .send = true, .kind = kind, .buf = own, .bytes = bytes};
    }
    sumo_result r = exchange(t, xs, n, what);
    if (xs != stack) free(xs);
    if (r == SUMO_SUCCESS && bytes) memcpy(out + (size_t)me * bytes, own, bytes);
    return r;
}

static sumo_result tcp_announce(sumo__transport *tp, const void *record, void *all, size_t bytes)
{
    return gather_all((tcp_transport *)tp, record, all, bytes, KIND_ANNOUNCE, "announce");
}

static sumo_result tcp_barrier(sumo__transport *tp)
{
    return gather_all((tcp_transport *)tp, NULL, NULL, 0, KIND_BARRIER, "barrier");
}

static void tcp_abort(sumo__transport *tp)
{
    tcp_transport *t = (tcp_transport *)tp;
    if (atomic_exchange(&t->aborted, true)) return;
    /* The peers read the end of every stream of this rank at once. */
    for (int r = 0; r < tp->size; r++)
        if (t->peers[r].fd >= 0) shutdown(t->peers[r].fd, SHUT_RDWR);
    uint64_t one = 1;
    ssize_t w = write(t->wake, &one, sizeof one);
    (void)w;
}

static void close_all(tcp_transport *t)
{
    for (int r = 0; r < t->base.size; r++)
        if (t->peers[r].fd >= 0) close(t->peers[r].fd);
    if (t->wake >= 0) close(t->wake);
    free(t->peers);
    free(t);
}

static sumo_result tcp_destroy(sumo__transport *tp)
{
    /* Closing never waits for a peer (no SO_LINGER): one still waiting on this rank reads
     * the end of the stream and fails at once. */
    close_all((tcp_transport *)tp);
    return SUMO_SUCCESS;
}

static const sumo__transport_ops tcp_ops = {
    .name = "tcp",
    .sendrecv = tcp_sendrecv,
    .sendrecv_working = tcp_sendrecv_working,
    .announce = tcp_announce,
    .barrier = tcp_barrier,
    .abort = tcp_abort,
    .destroy = tcp_destroy,
};

sumo_result sumo__tcp_transport_create(const sumo_tcp_options *o, const sumo__env *env,
                                       sumo__transport **out, char *err, size_t errlen)
{
    *out = NULL;
    tcp_transport *t = calloc(1, sizeof *t);
    tcp_peer *peers = t ? calloc((size_t)o->size, sizeof *peers) : NULL;
    int *conn = peers ? calloc((size_t)o->size, sizeof *conn) : NULL;
    if (conn == NULL) {
        free(peers);
        free(t);
        snprintf(err, errlen, "out of memory for a group of %d", o->size);
        return SUMO_ERR_SYSTEM;
    }
    for (int r = 0; r < o->size; r++) peers[r].fd = -1;
    t->peers = peers;
    t->wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    atomic_init(&t->aborted, false);
    t->base = (sumo__transport){.ops = &tcp_ops,
                                .rank = o->rank,
                                .size = o->size,
                                .timeout_ns = (int64_t)(env->timeout_s * 1e9),
                                .log_level = env->log_level,
                                .node_local_size = o->node_local_size,
                                .reach = SUMO__REACH_NONE};
    if (t->wake < 0) {
        snprintf(err, errlen, "rank %d: eventfd failed (%s)", o->rank, strerror(errno));
        free(conn);
        close_all(t);
        return SUMO_ERR_SYSTEM;
    }
    sumo__tcp_meeting m = {.o = o, .deadline = sumo__now_ns() + t->base.timeout_ns,
                           .seconds = env->timeout_s, .log_level = env->log_level, .err = err,
                           .errlen = errlen};
    sumo_result r = sumo__tcp_meet(&m, conn);
    for (int p = 0; p < o->size; p++) peers[p].fd = conn[p];
    free(conn);
    if (r != SUMO_SUCCESS) {
        close_all(t);
        return r;
    }
    *out = &t->base;
    return SUMO_SUCCESS;
}
