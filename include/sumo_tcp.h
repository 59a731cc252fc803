/*
 * sumo across machines without MPI: the processes meet once through a key-value store the
 * caller already has (torch's TCPStore: the sumo_store of sumo_shm.h) and from then on move
 * their messages over TCP connections of their own, one per pair of ranks, in sumo's C code.
 * Nothing calls back into the caller per message (what sumo_comm_create_transport over a
 * torch process group does); the collectives run their point-to-point algorithms (ring,
 * recursive doubling, Adasum's Gram form) over the connections.
 *
 * The meeting: every rank but 0 listens on an ephemeral port of the given address and
 * publishes host and port in the store; rank 0 publishes a random job nonce; each rank
 * connects to every higher rank and accepts every lower one, each connection opened with a
 * hello that carries the ranks, the size and the nonce, so a stray connection (another job,
 * a scanner) is refused and closed. The listening socket is closed as soon as every lower
 * rank has connected: nothing listens once the communicator exists. The connections are
 * non-blocking, with TCP_NODELAY, and every wait is a poll() bounded by SUMO_TIMEOUT.
 *
 * Failures: a peer whose connection closes or resets (it died, exited, or aborted: an abort
 * shuts every connection of the rank down) makes the ranks waiting on it fail at once with
 * SUMO_ERR_PEER_FAILURE, naming it; a peer that never arrives gives SUMO_ERR_TIMEOUT at the
 * deadline. A received message of another length or kind than expected fails the call
 * (SUMO_ERR_INTERNAL): every message carries a small header with its length, kind and
 * sequence number. sumo_comm_transport names it "tcp". A handle does not survive fork.
 */
#ifndef SUMO_TCP_H
#define SUMO_TCP_H

#include "sumo.h"
#include "sumo_shm.h" /* sumo_store */

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The most processes one communicator holds (each pair has a connection). */
#define SUMO_TCP_MAX_RANKS 1024

typedef struct sumo_tcp_options {
    size_t struct_size;      /* sizeof(sumo_tcp_options): lets the struct grow */
    int rank;                /* 0 .. size - 1, each once */
    int size;                /* the same on every rank, 1 .. SUMO_TCP_MAX_RANKS */
    const sumo_store *store; /* the same store (or views of it) on every rank */
    const char *key_prefix;  /* unique per communicator within the store, e.g. "sumo/tcp/0/":
                                keys are this prefix and a suffix of up to 16 bytes, 255 in
                                all; each rank removes its own keys once its peers have read
                                them (with the store's remove, when it has one) */
    const char *address;     /* the address (numeric, or a name) this rank listens on and
                                its peers connect to; NULL: the address through which this
                                host reaches route_host, else the first address of the
                                host's name that is not a loopback one, else 127.0.0.1 */
    const char *route_host;  /* optional: a host every rank reaches (the store's); used to
                                find the address when address is NULL */
    int node_local_size;     /* ranks per machine when machines hold equal blocks of
                                consecutive ranks, else 0 (as sumo_transport_desc's) */
    char *error;             /* optional (NULL: none): why the creation failed ("" on
                                success) */
    size_t error_bytes;
    /* Optional (NULL: none), for the memberships of an elastic job whose processes beat in
     * the store as sumo_agree_options's heartbeats do: rank r's beat is under alive_prefix
     * and the decimal alive_ranks[r] (r where alive_ranks is NULL; a negative entry: r has
     * none). A member may die between the agreement and this meeting, and nothing else
     * would tell the others before SUMO_TIMEOUT: with it, a peer the meeting waits for whose
     * beat has stood still for alive_s (0: SUMO_LIVENESS_TIMEOUT) is taken for dead, a
     * refused connection to a peer's published address means the peer is gone, and a rank
     * whose meeting fails says so under the key prefix, so that every rank fails within
     * about alive_s with SUMO_ERR_PEER_FAILURE (and the survivors agree again). */
    const char *alive_prefix;
    const int *alive_ranks;
    double alive_s;
} sumo_tcp_options;

/* struct_size set, everything else 0 or NULL: the caller fills rank, size, store and
 * key_prefix. */
SUMO_API sumo_result sumo_tcp_options_default(sumo_tcp_options *options);

/*
 * Collective over options->size processes: every rank calls it with its own rank, bounded by
 * SUMO_TIMEOUT (default 300 s). SUMO_ERR_INVALID_ARGUMENT for options this rank cannot use;
 * SUMO_ERR_MISMATCH when the ranks disagree on the size; SUMO_ERR_TIMEOUT when a rank or the
 * store does not answer in time; SUMO_ERR_SYSTEM when a socket cannot be made, bound or
 * reached. The detail goes to options->error, and to stderr with SUMO_DEBUG=WARN. Destroy
 * the handle with sumo_comm_destroy: it closes the connections and never waits for the peers.
 */
SUMO_API sumo_result sumo_comm_create_tcp(const sumo_tcp_options *options, sumo_comm **out);

#ifdef __cplusplus
}
#endif

#endif
