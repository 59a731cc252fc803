/*
 * Training that survives a lost rank. When a peer dies, every collective on the communicator
 * fails with SUMO_ERR_PEER_FAILURE and the handle stays broken; sumo_comm_shrink then lets the
 * ranks still here agree on who they are and go on as a smaller communicator, in the spirit of
 * ULFM's MPI_Comm_shrink and MPI_Comm_agree.
 *
 * Who can shrink: the threads transport (ranks that leave: a thread that aborts and destroys
 * its handle) and the shm transport (processes of one machine, a process killed outright
 * included). The MPI transport cannot: Debian's Open MPI 4.1 has no ULFM, and a process that
 * dies ends the job under mpirun. Across hosts, where no process sees another's end, the
 * survivors go on as a new communicator rather than shrink the old one (the TCP transport and
 * a transport of the caller's refuse sumo_comm_shrink): sumo_store_agree below is the agreement
 * through a store, with the members' heartbeats in it (a rank whose beat has stood still for
 * SUMO_LIVENESS_TIMEOUT is dead), and the survivors then make their next communicator from its
 * verdict under a new key prefix: sumo_comm_create_tcp (sumo_tcp.h), whose meeting watches the
 * same heartbeats so that a member that dies meanwhile fails it within that deadline too, or
 * their own transport over a new process group. sumo.torch's elastic jobs across hosts do so:
 * a new TCP communicator per membership, or with transport="group" a new gloo group made from
 * the same store. sumo_elastic, at the end of this header, holds all of it for one process
 * (heart, agreement, making, keeping, joining); `sumo train --elastic --store` runs on it.
 *
 * What a failure costs. A collective in flight when a peer died fails on every survivor. By
 * default its output is then undefined (in-place buffers included): the caller redoes the step
 * from state it kept. With sumo_comm_set_param(comm, SUMO_PARAM_RESTORE_ON_FAILURE, 1), on the
 * threads and shm transports, a host-memory allreduce (every op, Adasum included), broadcast,
 * allgather or reduce-scatter that returns SUMO_ERR_PEER_FAILURE or SUMO_ERR_TIMEOUT leaves
 * this rank's receive buffer bit for bit as it was before the call (in place: the input), once
 * every survivor still inside the call has left it (bounded by the timeout; should one not
 * leave in time, the output is left as it is and a warning logged). It costs a copy of the
 * receive buffer per call (about twice the time of a large threads allreduce), hence opt-in.
 * Send buffers are never written, with or without it. Not covered: sumo_allreduce_compressed,
 * device memory, the layers above's own exchanges.
 *
 * The value each rank brings to the shrink (say, the last step it committed) comes back as the
 * survivors' smallest, so ranks that got one step further than others (the collective
 * completed on some before the failure was seen) learn to go back to that step: keep the state
 * of the last two steps (at most one step separates the survivors).
 */
#ifndef SUMO_ELASTIC_H
#define SUMO_ELASTIC_H

#include "sumo.h"
#include "sumo_shm.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sumo_shrink_options {
    size_t struct_size;      /* sizeof(sumo_shrink_options) */
    uint64_t value;          /* this rank's part of the agreement: the survivors' smallest
                                comes back in sumo_shrink_info.value */
    const sumo_store *store; /* shm transport: where the survivors make their new group (the
                                store the group was made with will do); NULL elsewhere */
    const char *key_prefix;  /* shm: unique per shrink within the store, at most 230 bytes;
                                rounds add their own suffix */
    char *error;             /* optional: why it failed, where no handle can say */
    size_t error_bytes;
} sumo_shrink_options;

typedef struct sumo_shrink_info {
    size_t struct_size; /* sizeof(sumo_shrink_info) */
    int rank, size;     /* this rank's place in the new communicator, and its size */
    uint64_t value;     /* the smallest value the survivors brought */
    /* Optional (NULL: not wanted): the caller's array of the old communicator's size, filled
     * with each new rank's old rank (new ranks keep the old ranks' order) and -1 after. */
    int *old_ranks;
} sumo_shrink_info;

/* struct_size set, everything else 0 or NULL. */
SUMO_API sumo_result sumo_shrink_options_default(sumo_shrink_options *options);

/*
 * Collective over the ranks of comm still alive, usually after a collective failed with
 * SUMO_ERR_PEER_FAILURE or SUMO_ERR_TIMEOUT (a healthy communicator shrinks too, to itself).
 * Every survivor calls it once on the old handle; the lowest surviving rank decides who is in
 * once each rank has called it, is dead (its process ended, or it destroyed its handle) or has
 * not come within the communicator's timeout; a failure while they agree (the decider's
 * included) is survived. On success *out is the new communicator (same timeout and algorithm
 * setting; ops made with sumo_op_create_adasum must be made again) and info says who is who.
 * The old handle is left broken: destroy it. SUMO_ERR_PEER_FAILURE for a rank that came too
 * late and was left out; SUMO_ERR_TIMEOUT when no verdict came within twice the timeout;
 * SUMO_ERR_INVALID_USAGE for a transport that cannot shrink (MPI, TCP, a caller's); the detail in
 * sumo_comm_error_message(comm) or options->error.
 */
SUMO_API sumo_result sumo_comm_shrink(sumo_comm *comm, const sumo_shrink_options *options,
                                      sumo_comm **out, sumo_shrink_info *info);

typedef struct sumo_agree_options {
    size_t struct_size;      /* sizeof(sumo_agree_options) */
    int rank, size;          /* this process's rank in the membership that failed, and its size
                                (at most 1024) */
    uint64_t value;          /* as sumo_shrink_options.value */
    const sumo_store *store; /* the same store on every rank; it must offer set_once */
    const char *key_prefix;  /* unique per agreement within the store, at most 230 bytes */
    double timeout_s;        /* how long the others are waited for; 0: SUMO_TIMEOUT */
    /* Optional (NULL: no liveness): under alive_prefix + the decimal rank, each rank's process
     * keeps a value it rewrites with a new one more often than every alive_s (a heartbeat);
     * a rank whose value has stayed for alive_s (0: SUMO_LIVENESS_TIMEOUT) is taken for
     * dead, so a lost rank costs alive_s rather than the timeout. */
    const char *alive_prefix;
    double alive_s;
    char *error;             /* optional: why it failed */
    size_t error_bytes;
} sumo_agree_options;

/* struct_size set, everything else 0 or NULL. */
SUMO_API sumo_result sumo_agree_options_default(sumo_agree_options *options);

/*
 * The agreement of sumo_comm_shrink through a store alone, for ranks that share no memory and
 * cannot see each other's deaths (processes on several hosts): every rank still here calls it
 * once with the same key_prefix, and all that return SUMO_SUCCESS hold the same verdict in
 * info (who is in, numbered in the old order, and the smallest value they brought), from
 * which the caller makes the survivors' group. Each rank writes that it came; the lowest rank
 * not out decides once every rank has come or is out: dead by its heartbeat (alive_prefix),
 * or not come within timeout_s of the decider's coming. A decider that dies is taken over (by
 * its heartbeat; without heartbeats, by the next rank that came, a sixteenth of the timeout
 * past the deadline, and so on), and the verdict is written with set_once, so two deciders
 * that disagree cannot both stand. A member may die after it came: making the new group then
 * fails, and the survivors agree again under a new prefix. SUMO_ERR_PEER_FAILURE
 * for a rank the verdict left out (it came too late); SUMO_ERR_TIMEOUT when no verdict came
 * within twice the timeout; SUMO_ERR_INVALID_ARGUMENT for bad options, a store without
 * set_once, or a verdict in the store that is not one; SUMO_ERR_SYSTEM when the store fails.
 */
SUMO_API sumo_result sumo_store_agree(const sumo_agree_options *options, sumo_shrink_info *info);

/*
 * Keeping a new membership. Across hosts a meeting can end differently on two ranks (a member
 * that dies once some peers have met it fails the meeting on the others only); those that
 * kept the new communicator and those that agree again would never meet again. So every
 * member of the new membership calls sumo_store_commit once it has tried to make its
 * communicator (made 1: it holds one; made 0: its making failed), and one outcome, written
 * once in the store, stands for all: "ok" once every member has said it made its own; "fail"
 * from a member whose making failed, one that sees a member's heartbeat stand still for
 * alive_s, or the deadline. Keys under key_prefix: made/<rank> (each member removes its own
 * once the outcome stands, where the store has remove) and outcome (stays, for a member that
 * comes late).
 */
typedef struct sumo_commit_options {
    size_t struct_size;      /* sizeof(sumo_commit_options) */
    int rank, size;          /* this process's rank in the new membership, and its size (at
                                most 1024) */
    const sumo_store *store; /* the same store on every rank; it must offer set_once */
    const char *key_prefix;  /* unique per making within the store, at most 230 bytes */
    int made;                /* 1 (the default): this rank holds its new communicator; 0: its
                                making failed */
    double timeout_s;        /* how long the others are waited for; 0: SUMO_TIMEOUT */
    /* Optional (NULL: no liveness), as sumo_tcp_options's: member r's beat is under
     * alive_prefix and the decimal alive_ranks[r] (r where alive_ranks is NULL; a negative
     * entry: r has none, a joiner), stale after alive_s (0: SUMO_LIVENESS_TIMEOUT). */
    const char *alive_prefix;
    const int *alive_ranks;
    double alive_s;
    char *error;             /* optional: why it failed */
    size_t error_bytes;
} sumo_commit_options;

/* struct_size set, made 1, everything else 0 or NULL. */
SUMO_API sumo_result sumo_commit_options_default(sumo_commit_options *options);

/*
 * SUMO_SUCCESS when the outcome is "ok" (every member keeps its communicator);
 * SUMO_ERR_PEER_FAILURE when it is "fail" (every member drops what it made; the reason in
 * options->error); SUMO_ERR_INVALID_ARGUMENT for bad options, a store without set_once, or an
 * outcome key holding something else; SUMO_ERR_SYSTEM when the store fails.
 */
SUMO_API sumo_result sumo_store_commit(const sumo_commit_options *options);

/*
 * A process's heartbeat in a store, the one sumo_agree_options.alive_prefix and
 * sumo_tcp_options.alive_prefix read: a thread of its own writes a new value (a count, in
 * decimal) under key_prefix and the decimal rank once at start and then every period_s, so
 * that the others, on other hosts, can tell this process lost from one that is slow.
 * Thread-safe: every call may come from any thread (stop once, and last).
 */
typedef struct sumo_heart sumo_heart;

typedef struct sumo_heart_options {
    size_t struct_size;      /* sizeof(sumo_heart_options) */
    const sumo_store *store; /* set is called from the heart's thread and must replace a
                                value already there (the directory store's and torch's do):
                                the store must take calls from any thread, and outlive the
                                heart */
    const char *key_prefix;  /* at most 230 bytes; copied */
    int rank;                /* >= 0: the beat goes under key_prefix and this, in decimal */
    double period_s;         /* between beats; 0: a tenth of SUMO_LIVENESS_TIMEOUT */
    char *error;             /* optional: why sumo_heart_start failed */
    size_t error_bytes;
} sumo_heart_options;

/* struct_size set, everything else 0 or NULL. */
SUMO_API sumo_result sumo_heart_options_default(sumo_heart_options *options);

/*
 * Starts the heart: its first beat is on its thread, at once. SUMO_ERR_INVALID_ARGUMENT for
 * bad options (a store without set, a prefix too long, a rank below 0, a period that is not a
 * number of seconds), SUMO_ERR_SYSTEM when the thread cannot be made; why in options->error.
 * A store that fails later does not stop the process: the thread stops beating (the job is
 * ending, or this process is lost to the others, who will take it for dead), and
 * sumo_heart_error says why.
 */
SUMO_API sumo_result sumo_heart_start(const sumo_heart_options *options, sumo_heart **out);

/* One beat now, on the caller's thread (a new membership's first, without waiting a period).
 * SUMO_ERR_SYSTEM when the store fails (not remembered by sumo_heart_error: the caller has
 * it); the thread beats on regardless. */
SUMO_API sumo_result sumo_heart_beat(sumo_heart *heart);

/* From now on the beats go under key_prefix (copied, at most 230 bytes) and rank: a new
 * membership's. The count goes on, so the value under a key moves only ever forward. */
SUMO_API sumo_result sumo_heart_move(sumo_heart *heart, const char *key_prefix, int rank);

/* SUMO_SUCCESS while the thread beats; otherwise the store's failure that stopped it
 * (SUMO_ERR_SYSTEM), with why in error (optional, NULL: not wanted). */
SUMO_API sumo_result sumo_heart_error(sumo_heart *heart, char *error, size_t error_bytes);

/* Stops the thread (waits for a beat under way: for as long as the store's set takes) and
 * frees the heart (NULL: nothing). */
SUMO_API sumo_result sumo_heart_stop(sumo_heart *heart);

/*
 * Watching the others' heartbeats by the rule sumo_store_agree and the TCP meeting use: a
 * rank is dead once the value under key_prefix and its decimal number has stood still (or
 * been absent) for alive_s since this watch first read it so. For a caller's own protocol
 * through the store (sumo.torch's commit of a new membership).
 */
typedef struct sumo_heart_watch sumo_heart_watch;

/* Watches count ranks, ranks[i] for slot i (copied; a negative entry: not watched), under
 * key_prefix (copied, at most 230 bytes); alive_s 0: SUMO_LIVENESS_TIMEOUT. The store needs
 * get and must outlive the watch. SUMO_ERR_INVALID_ARGUMENT for bad arguments. */
SUMO_API sumo_result sumo_heart_watch_create(const sumo_store *store, const char *key_prefix,
                                             int count, const int *ranks, double alive_s,
                                             sumo_heart_watch **out);

/* Reads each watched rank's beat once, now, without waiting (a store that fails reads as no
 * beat); *dead becomes the first slot whose rank is dead by its heartbeat, -1 for none. */
SUMO_API sumo_result sumo_heart_watch_look(sumo_heart_watch *watch, int *dead);

/* NULL: nothing. */
SUMO_API sumo_result sumo_heart_watch_destroy(sumo_heart_watch *watch);

/*
 * Join tickets, the store protocol sumo_elastic's join and grow use, for a caller's own
 * elastic layer (sumo.torch): keys under key_prefix + "join/", with set, get and set_once
 * only. A joiner takes the lowest free ticket (set_once on ticket/<k>, k = 1, 2, ... upward,
 * a random value of its own); the tickets taken are always 1..n. The members count them at a
 * commit point from the last count on, write each new holder's place (the caller's text), and
 * the holder waits for it; close tells holders still waiting that the job ended. key_prefix at
 * most 160 bytes; why a call failed goes to error (optional, NULL: not wanted).
 */
SUMO_API sumo_result sumo_ticket_take(const sumo_store *store, const char *key_prefix,
                                      int *ticket, char *error, size_t error_bytes);
/* *count: the tickets taken so far, known to be at least from. */
SUMO_API sumo_result sumo_tickets_count(const sumo_store *store, const char *key_prefix,
                                        int from, int *count, char *error, size_t error_bytes);
/* text: at most 240 bytes. */
SUMO_API sumo_result sumo_ticket_place(const sumo_store *store, const char *key_prefix,
                                       int ticket, const char *text, char *error,
                                       size_t error_bytes);
/* Waits up to timeout_s for ticket's place and copies it into text (NUL-terminated; the key
 * is removed where the store has remove). SUMO_ERR_PEER_FAILURE once the job closed,
 * SUMO_ERR_TIMEOUT when timeout_s passed. */
SUMO_API sumo_result sumo_ticket_wait(const sumo_store *store, const char *key_prefix,
                                      int ticket, double timeout_s, char *text, size_t bytes,
                                      char *error, size_t error_bytes);
SUMO_API sumo_result sumo_tickets_close(const sumo_store *store, const char *key_prefix,
                                        char *error, size_t error_bytes);

/*
 * An elastic job's membership, one object per process: the process's heartbeat, the
 * communicator of the current membership, and the store protocols that replace it. Ranks
 * meet through a store shared by every process (the directory store on a shared folder will
 * do), under a key prefix of the job's (keys: a<n>/ per making n, join/ for the tickets).
 *
 * The cycle, for a training loop: make the object (sumo_elastic_create on the first members,
 * sumo_elastic_join on a process that comes later), run collectives on sumo_elastic_comm's
 * communicator, and at each commit point (a step, an outer round) call sumo_elastic_commit:
 * SUMO_ERR_PEER_FAILURE or SUMO_ERR_TIMEOUT (a collective failed, or a member's heartbeat stood
 * still) -> sumo_elastic_shrink; joiners waiting -> sumo_elastic_grow. After either, the
 * communicator is a new one (the old handle is destroyed: fetch it again), and the caller
 * brings its state back (the smallest value the survivors brought; the joiners from a
 * member). Each new membership is made by every member, kept only by sumo_store_commit's
 * single outcome, and otherwise dropped by all (a shrink then agrees again). A ticket whose
 * holder never comes fails the grow, and the members go on as they were.
 *
 * Between commit points a thread of the object's reads the members' beats (every quarter of
 * the liveness time) and aborts the communicator when one has stood still for the liveness
 * time, so a member that goes silent inside a collective fails it for the others then, not at
 * the collective's deadline; they shrink next.
 *
 * Not thread-safe: one thread of the process calls (the heart and the watcher have their
 * own).
 */
typedef struct sumo_elastic sumo_elastic;

typedef enum sumo_elastic_transport {
    SUMO_ELASTIC_TCP = 0, /* sumo_comm_create_tcp: processes on any hosts */
    SUMO_ELASTIC_SHM = 1  /* sumo_comm_create_shm: processes of one host */
} sumo_elastic_transport;

/* One membership's making, for a caller's own transport (sumo_elastic_options.make). */
typedef struct sumo_elastic_making {
    size_t struct_size;       /* sizeof(sumo_elastic_making) */
    const sumo_store *store;  /* the job's */
    const char *key_prefix;   /* unique to this making */
    int rank, size;           /* this process's place in the membership made */
    const char *alive_prefix; /* the members' heartbeats, as sumo_tcp_options's */
    const int *alive_ranks;
    double alive_s;
} sumo_elastic_making;

/* Makes the communicator of a membership (collective over its members; a failure must fail
 * on this process, not hang past SUMO_TIMEOUT); why into error. */
typedef sumo_result (*sumo_elastic_make_fn)(void *ctx, const sumo_elastic_making *making,
                                            sumo_comm **out, char *error, size_t error_bytes);

typedef struct sumo_elastic_options {
    size_t struct_size;      /* sizeof(sumo_elastic_options) */
    const sumo_store *store; /* set (replacing), get and set_once; remove optional; calls come
                                from the heart's thread too; must outlive the object */
    const char *key_prefix;  /* the job's, the same on every process, at most 160 bytes */
    int rank, size;          /* create: this process's place in the first membership (size at
                                most 1024); join: unused */
    sumo_elastic_transport transport; /* how memberships are made (default TCP) */
    const char *address;     /* TCP: as sumo_tcp_options.address (NULL: found) */
    const char *route_host;  /* TCP: as sumo_tcp_options.route_host */
    sumo_elastic_make_fn make; /* optional: the caller's making instead of transport's */
    void *make_ctx;
    double liveness_s;       /* a heartbeat stood still this long is dead; the heart beats ten
                                times as often; 0: SUMO_LIVENESS_TIMEOUT */
    double timeout_s;        /* the agreement's, the commit's and the makings'; 0:
                                SUMO_TIMEOUT */
    double join_wait_s;      /* join: how long to wait for a commit point to take this
                                process in; 0: until one does or the job closes (the members
                                may commit seldom) */
    char *error;             /* optional: why create or join failed */
    size_t error_bytes;
} sumo_elastic_options;

/* struct_size set, everything else 0 or NULL. */
SUMO_API sumo_result sumo_elastic_options_default(sumo_elastic_options *options);

/* Collective over the first members: starts this process's heart and makes and commits the
 * first membership's communicator. SUMO_ERR_INVALID_ARGUMENT for bad options, named in
 * options->error; SUMO_ERR_PEER_FAILURE when the membership was not made (this member's
 * making or another's failed: why in options->error). */
SUMO_API sumo_result sumo_elastic_create(const sumo_elastic_options *options,
                                         sumo_elastic **out);

/* A process joining a running job: takes a ticket, waits (options->join_wait_s) until the
 * members at a commit point give it its place, and makes the larger membership with them, at
 * a rank after theirs. SUMO_ERR_PEER_FAILURE when the job closed first or the making failed;
 * SUMO_ERR_TIMEOUT when no commit took it in within join_wait_s; SUMO_ERR_MISMATCH when the job makes its
 * memberships another way (transport, or a caller's make against the built-in ones), named.
 * options->rank and size are not read. */
SUMO_API sumo_result sumo_elastic_join(const sumo_elastic_options *options, sumo_elastic **out);

/* The current membership's communicator (owned by the object; replaced by shrink and grow). */
SUMO_API sumo_result sumo_elastic_comm(sumo_elastic *elastic, sumo_comm **comm);

/* The number of memberships made in the job so far (every member counts alike), for the
 * caller's own keys. */
SUMO_API sumo_result sumo_elastic_generation(const sumo_elastic *elastic, int *generation);

/*
 * Collective over the members: the commit point. SUMO_SUCCESS with *joiners the number of
 * tickets taken since the last grow (0: none; then sumo_elastic_grow); SUMO_ERR_PEER_FAILURE
 * when a member's heartbeat stood still for the liveness time (seen by any member: all get it)
 * or the collective failed as the communicator says (then sumo_elastic_shrink).
 */
SUMO_API sumo_result sumo_elastic_commit(sumo_elastic *elastic, int *joiners);

/*
 * Collective over the members still alive, after a failure: they agree (sumo_store_agree,
 * bringing value), make the survivors' communicator and commit it, again from the same
 * membership while a making fails. Over SUMO_ELASTIC_SHM (built in) the survivors shrink the
 * communicator itself instead (sumo_comm_shrink: the kernel tells a process's end, so a loss
 * costs milliseconds, not the liveness time). info (old_ranks optional, of the old size) as
 * sumo_comm_shrink's. SUMO_ERR_PEER_FAILURE for a process left out (it must end). The new
 * rank 0 takes the lost members' heartbeats and agreement entries out of the store (where it
 * has remove); each survivor takes its own.
 */
SUMO_API sumo_result sumo_elastic_shrink(sumo_elastic *elastic, uint64_t value,
                                         sumo_shrink_info *info);

/*
 * Collective over the members, after a commit that said joiners > 0: makes the membership of
 * the members (ranks kept) and the next `joiners` ticket holders (ranks after them, in ticket
 * order). *joined: joiners, or 0 when the making failed (a holder that never came, a member
 * lost): the members then keep their communicator, and those tickets are spent.
 */
SUMO_API sumo_result sumo_elastic_grow(sumo_elastic *elastic, int joiners, int *joined);

/* The job ends: processes still waiting to join stop waiting (any member may call it). */
SUMO_API sumo_result sumo_elastic_close(sumo_elastic *elastic);

/* Why the last call on the object failed, or why a grow took nobody in ("" after a
 * success). */
SUMO_API sumo_result sumo_elastic_error_message(const sumo_elastic *elastic,
                                                const char **message);

/* Stops the heart, destroys the communicator and removes this process's own keys (its
 * heartbeat); NULL: nothing. */
SUMO_API sumo_result sumo_elastic_destroy(sumo_elastic *elastic);

#ifdef __cplusplus
}
#endif

#endif
