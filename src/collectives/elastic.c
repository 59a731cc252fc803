/*
 * sumo_elastic (sumo_elastic.h): one process's membership in an elastic job through a store.
 * It holds the heart, a watch on the members' beats, and the communicator; memberships are
 * numbered by their making n (every member counts makings alike, a joiner learns the count
 * from its place), and each making's keys live under <root>a<n>/: agree/ (sumo_store_agree),
 * comm/ (the communicator's meeting), made/ and outcome (sumo_store_commit), alive/ (the
 * heartbeats of the membership kept). Tickets: tickets.h under <root>.
 */
#include "common/common.h"
#include "common/settings.h"
#include "transport/tickets.h"

#include "sumo_elastic.h"
#include "sumo_tcp.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_ROOT 160
#define MAX_RANKS 1024
#define KEY_BYTES 256
#define PLACE_TAG "sumo-place-2"

struct sumo_elastic {
    const sumo_store *store;
    char root[MAX_ROOT + 1];
    sumo_elastic_transport transport;
    char address[256], route_host[256];
    bool has_address, has_route;
    sumo_elastic_make_fn make;
    void *make_ctx;
    double liveness_s, timeout_s, join_wait_s;
    sumo_comm *comm;
    int rank, size;
    int kept;     /* the making whose membership this is (its heartbeats' n) */
    int makings;  /* makings tried so far: the next is number makings */
    int admitted; /* join tickets taken in so far */
    sumo_heart *heart;
    sumo_heart_watch *watch; /* under lock: the watcher thread reads it too */
    /* The watcher: a member whose beat stands still fails the collective the others are in
     * now (its communicator aborted), not only the next commit point, so a host that drops
     * off the network mid-collective costs the liveness time rather than the deadline. */
    char error[512];
    pthread_mutex_t lock;
    pthread_cond_t wake;
    pthread_t watcher;
    bool watching; /* the caller's thread's alone */
    int stopping, aborted; /* under lock */
};

static sumo_result fail(sumo_elastic *e, sumo_result code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->error, sizeof e->error, fmt, ap);
    va_end(ap);
    return code;
}

static void key_of(const sumo_elastic *e, char *key, int n, const char *what)
{
    snprintf(key, KEY_BYTES, "%sa%d/%s", e->root, n, what);
}

sumo_result sumo_elastic_options_default(sumo_elastic_options *options)
{
    if (options == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *options = (sumo_elastic_options){.struct_size = sizeof *options};
    return SUMO_SUCCESS;
}

/* Checks the options and copies them into a new object (no heart, no communicator yet). */
static sumo_result from_options(const sumo_elastic_options *o, bool joining, sumo_elastic *e)
{
    char why[300];
    const char *bad = SUMO__STRUCT_SIZE_PROBLEM(o, sumo_elastic_options, why, sizeof why);
    if (bad != NULL) return fail(e, SUMO_ERR_INVALID_ARGUMENT, "%s", bad);
    const sumo_store *st = o->store;
    if (st == NULL || st->struct_size != sizeof *st || st->get == NULL || st->set == NULL ||
        st->set_once == NULL)
        return fail(e, SUMO_ERR_INVALID_ARGUMENT,
                    "store must be a sumo_store of this library's size with set, get and "
                    "set_once");
    if (o->key_prefix == NULL || strlen(o->key_prefix) > MAX_ROOT)
        return fail(e, SUMO_ERR_INVALID_ARGUMENT, "key_prefix must be given, at most %d bytes",
                    MAX_ROOT);
    if (!joining && (o->size < 1 || o->size > MAX_RANKS || o->rank < 0 || o->rank >= o->size))
        return fail(e, SUMO_ERR_INVALID_ARGUMENT, "rank %d of size %d (1 to %d ranks)", o->rank,
                    o->size, MAX_RANKS);
    if (o->make == NULL && o->transport != SUMO_ELASTIC_TCP && o->transport != SUMO_ELASTIC_SHM)
        return fail(e, SUMO_ERR_INVALID_ARGUMENT,
                    "transport %d is neither SUMO_ELASTIC_TCP nor SUMO_ELASTIC_SHM",
                    (int)o->transport);
    if ((o->address != NULL && strlen(o->address) >= sizeof e->address) ||
        (o->route_host != NULL && strlen(o->route_host) >= sizeof e->route_host))
        return fail(e, SUMO_ERR_INVALID_ARGUMENT, "address or route_host longer than %zu bytes",
                    sizeof e->address - 1);
    double liveness = o->liveness_s, timeout = o->timeout_s;
    if (liveness == 0) {
        sumo__setting_value v;
        sumo_result r = sumo__setting_read(SUMO__SETTING_LIVENESS_TIMEOUT, &v, why, sizeof why);
        if (r != SUMO_SUCCESS) return fail(e, r, "%s", why);
        liveness = v.number;
    }
    if (timeout == 0) {
        sumo__env env;
        sumo_result r = sumo__env_read(&env, why, sizeof why);
        if (r != SUMO_SUCCESS) return fail(e, r, "%s", why);
        timeout = env.timeout_s;
    }
    if (!(liveness > 0 && liveness < 1e7) || !(timeout > 0 && timeout < 1e7) ||
        !(o->join_wait_s >= 0 && o->join_wait_s < 1e9))
        return fail(e, SUMO_ERR_INVALID_ARGUMENT,
                    "liveness_s %g, timeout_s %g and join_wait_s %g must be numbers of seconds",
                    liveness, timeout, o->join_wait_s);
    e->store = st;
    snprintf(e->root, sizeof e->root, "%s", o->key_prefix);
    e->transport = o->transport;
    e->has_address = o->address != NULL;
    if (o->address) snprintf(e->address, sizeof e->address, "%s", o->address);
    e->has_route = o->route_host != NULL;
    if (o->route_host) snprintf(e->route_host, sizeof e->route_host, "%s", o->route_host);
    e->make = o->make;
    e->make_ctx = o->make_ctx;
    e->liveness_s = liveness;
    e->timeout_s = timeout;
    e->join_wait_s = o->join_wait_s;
    return SUMO_SUCCESS;
}

/* How this process makes memberships, as a joiner's place carries it: a joiner made another
 * way would wait at a meeting the members never come to. */
static int making_kind(const sumo_elastic *e)
{
    return e->make != NULL ? 2 : (int)e->transport;
}

static const char *making_name(int kind)
{
    return kind == 0 ? "sumo's TCP transport" : kind == 1 ? "shared memory"
                                                          : "the caller's own making";
}

static sumo_result make_builtin(sumo_elastic *e, const sumo_elastic_making *m, sumo_comm **out,
                                char *why, size_t why_bytes)
{
    if (e->transport == SUMO_ELASTIC_SHM) {
        sumo_shm_options o;
        sumo_shm_options_default(&o);
        o.rank = m->rank;
        o.size = m->size;
        o.store = m->store;
        o.key_prefix = m->key_prefix;
        o.error = why;
        o.error_bytes = why_bytes;
        return sumo_comm_create_shm(&o, out);
    }
    sumo_tcp_options o;
    sumo_tcp_options_default(&o);
    o.rank = m->rank;
    o.size = m->size;
    o.store = m->store;
    o.key_prefix = m->key_prefix;
    o.address = e->has_address ? e->address : NULL;
    o.route_host = e->has_route ? e->route_host : NULL;
    o.alive_prefix = m->alive_prefix;
    o.alive_ranks = m->alive_ranks;
    o.alive_s = m->alive_s;
    o.error = why;
    o.error_bytes = why_bytes;
    return sumo_comm_create_tcp(&o, out);
}

/*
 * Making n of a membership (rank of size; the members before it beat under making `beats`,
 * alive[r] for member r, -1 for a joiner) and its commit: *out the kept communicator, or
 * NULL and SUMO_ERR_PEER_FAILURE when the outcome is fail (made here or not).
 */
static sumo_result make_and_commit(sumo_elastic *e, int n, int rank, int size, int beats,
                                   const int *alive, sumo_comm **out)
{
    char comm_key[KEY_BYTES], alive_key[KEY_BYTES], prefix[KEY_BYTES], why[400] = "";
    key_of(e, comm_key, n, "comm/");
    key_of(e, alive_key, beats, "alive/");
    key_of(e, prefix, n, "");
    sumo_elastic_making m = {.struct_size = sizeof m, .store = e->store, .key_prefix = comm_key,
                             .rank = rank, .size = size, .alive_prefix = alive_key,
                             .alive_ranks = alive, .alive_s = e->liveness_s};
    sumo_comm *comm = NULL;
    sumo_result made = e->make ? e->make(e->make_ctx, &m, &comm, why, sizeof why)
                               : make_builtin(e, &m, &comm, why, sizeof why);
    if (made == SUMO_SUCCESS && comm == NULL) {
        made = SUMO_ERR_INTERNAL;
        snprintf(why, sizeof why, "the making returned no communicator");
    }
    if (made == SUMO_SUCCESS) sumo_comm_set_timeout(comm, e->timeout_s);
    char commit_why[300] = "";
    sumo_commit_options c;
    sumo_commit_options_default(&c);
    c.rank = rank;
    c.size = size;
    c.store = e->store;
    c.key_prefix = prefix;
    c.made = made == SUMO_SUCCESS;
    c.timeout_s = e->timeout_s;
    c.alive_prefix = alive_key;
    c.alive_ranks = alive;
    c.alive_s = e->liveness_s;
    c.error = commit_why;
    c.error_bytes = sizeof commit_why;
    sumo_result kept = sumo_store_commit(&c);
    if (kept == SUMO_SUCCESS) {
        *out = comm;
        return SUMO_SUCCESS;
    }
    if (comm) sumo_comm_destroy(comm);
    if (made != SUMO_SUCCESS)
        return fail(e, kept, "making the membership of %d under %s failed (%s): %s", size,
                    comm_key, sumo_result_name(made), why);
    return fail(e, kept, "keeping the membership of %d under %s: %s", size, comm_key,
                commit_why);
}

/* The watch on membership `kept`'s other members. */
static sumo_result watch_members(sumo_elastic *e)
{
    sumo_heart_watch *watch = NULL;
    int *who = malloc((size_t)e->size * sizeof *who);
    if (who == NULL) return fail(e, SUMO_ERR_SYSTEM, "out of memory");
    for (int r = 0; r < e->size; r++) who[r] = r == e->rank ? -1 : r;
    char alive[KEY_BYTES];
    key_of(e, alive, e->kept, "alive/");
    sumo_result res = sumo_heart_watch_create(e->store, alive, e->size, who, e->liveness_s, &watch);
    free(who);
    if (res != SUMO_SUCCESS) return fail(e, res, "watching the heartbeats under %s", alive);
    pthread_mutex_lock(&e->lock);
    e->watch = watch;
    pthread_mutex_unlock(&e->lock);
    return SUMO_SUCCESS;
}

static void *watcher_run(void *arg)
{
    sumo_elastic *e = arg;
    /* A quarter of the liveness time between looks: each look reads every member's beat. */
    int64_t period_ns = (int64_t)(e->liveness_s / 4 * 1e9);
    pthread_mutex_lock(&e->lock);
    while (!e->stopping) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        int64_t ns = (int64_t)until.tv_nsec + period_ns;
        until.tv_sec += (time_t)(ns / 1000000000);
        until.tv_nsec = (long)(ns % 1000000000);
        pthread_cond_timedwait(&e->wake, &e->lock, &until);
        int dead = -1;
        if (e->stopping || e->aborted || e->watch == NULL || e->comm == NULL) continue;
        sumo_heart_watch_look(e->watch, &dead);
        if (dead < 0) continue;
        char why[160];
        snprintf(why, sizeof why, "sumo_elastic: member %d's heartbeat stood still for %g s",
                 dead, e->liveness_s);
        sumo_comm_abort(e->comm, why);
        e->aborted = 1; /* once per membership: the members shrink next */
    }
    pthread_mutex_unlock(&e->lock);
    return NULL;
}

static sumo_result start_watcher(sumo_elastic *e)
{
    if (pthread_create(&e->watcher, NULL, watcher_run, e) != 0)
        return fail(e, SUMO_ERR_SYSTEM, "no thread to watch the members' heartbeats");
    e->watching = true;
    return SUMO_SUCCESS;
}

static void remove_key(const sumo_elastic *e, const char *key)
{
    if (e->store->remove != NULL) e->store->remove(e->store->ctx, key);
}

/* Makes comm (kept by making n, where this process is rank of size) the object's. */
static sumo_result adopt(sumo_elastic *e, sumo_comm *comm, int n, int rank, int size)
{
    char old_beat[KEY_BYTES + 16], alive[KEY_BYTES];
    key_of(e, old_beat, e->kept, "alive/");
    snprintf(old_beat + strlen(old_beat), 16, "%d", e->rank);
    bool had_heart = e->comm != NULL;
    pthread_mutex_lock(&e->lock);
    if (e->comm) sumo_comm_destroy(e->comm);
    e->comm = comm;
    /* The old membership's watch goes with it: its dead member must not abort the new one. */
    sumo_heart_watch_destroy(e->watch);
    e->watch = NULL;
    e->aborted = 0;
    e->rank = rank;
    e->size = size;
    e->kept = n;
    pthread_mutex_unlock(&e->lock);
    key_of(e, alive, n, "alive/");
    if (had_heart) {
        /* The new key at once, so the members' next watch finds it; nobody reads the old one
         * once the outcome stands. */
        sumo_heart_move(e->heart, alive, rank);
        sumo_heart_beat(e->heart);
        remove_key(e, old_beat);
    }
    return watch_members(e);
}

static sumo_result start_heart(sumo_elastic *e, int n, int rank)
{
    char alive[KEY_BYTES], why[300] = "";
    key_of(e, alive, n, "alive/");
    sumo_heart_options h;
    sumo_heart_options_default(&h);
    h.store = e->store;
    h.key_prefix = alive;
    h.rank = rank;
    h.period_s = e->liveness_s / 10;
    h.error = why;
    h.error_bytes = sizeof why;
    sumo_result res = sumo_heart_start(&h, &e->heart);
    return res == SUMO_SUCCESS ? res : fail(e, res, "%s", why);
}

static void tell_caller(const sumo_elastic_options *o, const sumo_elastic *e)
{
    if (o && o->struct_size == sizeof *o && o->error && o->error_bytes > 0)
        snprintf(o->error, o->error_bytes, "sumo_elastic: %s", e->error);
}

/* Frees what create or join made so far after a failure, telling the caller why. */
static sumo_result abandon(const sumo_elastic_options *o, sumo_elastic *e, sumo_result res)
{
    tell_caller(o, e);
    sumo_elastic_destroy(e);
    return res;
}

static sumo_elastic *new_object(void)
{
    sumo_elastic *e = calloc(1, sizeof *e);
    if (e == NULL) return NULL;
    pthread_mutex_init(&e->lock, NULL);
    pthread_cond_init(&e->wake, NULL);
    return e;
}

sumo_result sumo_elastic_create(const sumo_elastic_options *o, sumo_elastic **out)
{
    if (out == NULL || o == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *out = NULL;
    sumo_elastic *e = new_object();
    if (e == NULL) return SUMO_ERR_SYSTEM;
    sumo_result res = from_options(o, false, e);
    if (res == SUMO_SUCCESS) res = start_heart(e, 0, o->rank);
    sumo_comm *comm = NULL;
    int *alive = res == SUMO_SUCCESS ? malloc((size_t)o->size * sizeof *alive) : NULL;
    if (res == SUMO_SUCCESS && alive == NULL) res = fail(e, SUMO_ERR_SYSTEM, "out of memory");
    if (res == SUMO_SUCCESS) {
        for (int r = 0; r < o->size; r++) alive[r] = r;
        e->rank = o->rank; /* the first beats' place */
        res = make_and_commit(e, 0, o->rank, o->size, 0, alive, &comm);
    }
    free(alive);
    if (res == SUMO_SUCCESS) {
        e->makings = 1;
        res = adopt(e, comm, 0, o->rank, o->size);
    }
    if (res == SUMO_SUCCESS) res = start_watcher(e);
    if (res != SUMO_SUCCESS) return abandon(o, e, res);
    e->error[0] = '\0';
    *out = e;
    return SUMO_SUCCESS;
}

sumo_result sumo_elastic_join(const sumo_elastic_options *o, sumo_elastic **out)
{
    if (out == NULL || o == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *out = NULL;
    sumo_elastic *e = new_object();
    if (e == NULL) return SUMO_ERR_SYSTEM;
    sumo_result res = from_options(o, true, e);
    if (res != SUMO_SUCCESS) return abandon(o, e, res);
    int ticket = 0;
    char place[256], why[300] = "";
    res = sumo__ticket_take(e->store, e->root, &ticket, why, sizeof why);
    if (res == SUMO_SUCCESS)
        res = sumo__ticket_wait(e->store, e->root, ticket,
                                e->join_wait_s > 0
                                    ? sumo__now_ns() + (int64_t)(e->join_wait_s * 1e9)
                                    : INT64_MAX,
                                place, sizeof place, why, sizeof why);
    if (res != SUMO_SUCCESS) return abandon(o, e, fail(e, res, "joining: %s", why));
    int rank, size, n, beats, members, admitted, kind, end = 0;
    if (sscanf(place, PLACE_TAG " %d %d %d %d %d %d %d%n", &rank, &size, &n, &beats, &members,
               &admitted, &kind, &end) != 7 ||
        place[end] != '\0' || members < 1 || size <= members || size > MAX_RANKS ||
        rank < members || rank >= size || n < 1 || beats < 0 || beats >= n ||
        admitted < ticket || kind < 0 || kind > 2)
        return abandon(o, e, fail(e, SUMO_ERR_INVALID_ARGUMENT,
                                  "join ticket %d's place \"%.80s\" is not one", ticket, place));
    if (kind != making_kind(e))
        return abandon(o, e, fail(e, SUMO_ERR_MISMATCH,
                                  "join ticket %d: the job makes its memberships over %s, this "
                                  "process over %s",
                                  ticket, making_name(kind), making_name(making_kind(e))));
    res = start_heart(e, n, rank);
    int *alive = res == SUMO_SUCCESS ? malloc((size_t)size * sizeof *alive) : NULL;
    if (res == SUMO_SUCCESS && alive == NULL) res = fail(e, SUMO_ERR_SYSTEM, "out of memory");
    sumo_comm *comm = NULL;
    if (res == SUMO_SUCCESS) {
        for (int r = 0; r < size; r++) alive[r] = r < members ? r : -1;
        e->rank = rank;
        res = make_and_commit(e, n, rank, size, beats, alive, &comm);
    }
    free(alive);
    if (res == SUMO_SUCCESS) {
        e->makings = n + 1;
        e->admitted = admitted;
        e->kept = n;
        res = adopt(e, comm, n, rank, size);
    }
    if (res == SUMO_SUCCESS) res = start_watcher(e);
    if (res != SUMO_SUCCESS) return abandon(o, e, res);
    e->error[0] = '\0';
    *out = e;
    return SUMO_SUCCESS;
}

sumo_result sumo_elastic_comm(sumo_elastic *e, sumo_comm **comm)
{
    if (e == NULL || comm == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *comm = e->comm;
    return SUMO_SUCCESS;
}

sumo_result sumo_elastic_generation(const sumo_elastic *e, int *generation)
{
    if (e == NULL || generation == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *generation = e->kept;
    return SUMO_SUCCESS;
}

sumo_result sumo_elastic_commit(sumo_elastic *e, int *joiners)
{
    if (e == NULL || joiners == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *joiners = 0;
    int dead = -1, tickets = e->admitted;
    char why[300] = "";
    pthread_mutex_lock(&e->lock);
    sumo_heart_watch_look(e->watch, &dead);
    pthread_mutex_unlock(&e->lock);
    sumo_result counted = SUMO_SUCCESS;
    if (e->rank == 0)
        counted = sumo__tickets_count(e->store, e->root, e->admitted, &tickets, why, sizeof why);
    /* What one member saw, every member acts on: a lost beat, the tickets, a store failure. */
    double seen[3] = {dead >= 0, e->rank == 0 ? tickets - e->admitted : 0,
                      counted != SUMO_SUCCESS};
    sumo_result res = sumo_allreduce(seen, seen, 3, SUMO_FLOAT64, SUMO_OP_SUM, e->comm);
    if (res != SUMO_SUCCESS) {
        const char *msg = "";
        sumo_comm_error_message(e->comm, &msg);
        return fail(e, res, "the commit's collective failed: %s", msg);
    }
    if (seen[0] > 0)
        return fail(e, SUMO_ERR_PEER_FAILURE,
                    dead >= 0 ? "member %d's heartbeat stood still for %g s"
                              : "another member saw a heartbeat stand still (%d, %g s)",
                    dead, e->liveness_s);
    if (seen[2] > 0)
        return fail(e, SUMO_ERR_SYSTEM, "counting the join tickets: %s",
                    counted != SUMO_SUCCESS ? why : "the store failed on rank 0");
    *joiners = (int)seen[1];
    e->error[0] = '\0';
    return SUMO_SUCCESS;
}

/* Over shared memory the survivors shrink the communicator itself: the kernel tells who
 * ended, and the making is the transport's own (it agrees again within the call). */
static sumo_result shrink_shm(sumo_elastic *e, int n, uint64_t value, sumo_shrink_info *v,
                              sumo_comm **out)
{
    char prefix[KEY_BYTES], why[400] = "";
    key_of(e, prefix, n, "comm/");
    sumo_shrink_options s;
    sumo_shrink_options_default(&s);
    s.value = value;
    s.store = e->store;
    s.key_prefix = prefix;
    s.error = why;
    s.error_bytes = sizeof why;
    sumo_result res = sumo_comm_shrink(e->comm, &s, out, v);
    return res == SUMO_SUCCESS ? res : fail(e, res, "shrinking under %s: %s", prefix, why);
}

/* Across hosts: the agreement through the store, then the survivors' making and its keeping
 * (making n). *again when the verdict stands but the making failed for all (a member died
 * meanwhile): the same membership agrees again under the next n. */
static sumo_result shrink_store(sumo_elastic *e, int n, uint64_t value, sumo_shrink_info *v,
                                sumo_comm **out, bool *again)
{
    char alive[KEY_BYTES], agree_key[KEY_BYTES], why[400] = "";
    key_of(e, alive, e->kept, "alive/");
    key_of(e, agree_key, n, "agree/");
    sumo_agree_options a;
    sumo_agree_options_default(&a);
    a.rank = e->rank;
    a.size = e->size;
    a.value = value;
    a.store = e->store;
    a.key_prefix = agree_key;
    a.timeout_s = e->timeout_s;
    a.alive_prefix = alive;
    a.alive_s = e->liveness_s;
    a.error = why;
    a.error_bytes = sizeof why;
    sumo_result res = sumo_store_agree(&a, v);
    if (res != SUMO_SUCCESS) return fail(e, res, "%s", why);
    res = make_and_commit(e, n, v->rank, v->size, e->kept, v->old_ranks, out);
    *again = res == SUMO_ERR_PEER_FAILURE;
    return res;
}

/* The new rank 0, once a shrink stands: the store forgets the lost members' beats and every
 * agreement entry of the tries from first to last (nobody reads them again; the verdicts stay,
 * for a process left out that comes late). */
static void forget_lost(const sumo_elastic *e, int beats, int old_size, const int *kept,
                        int kept_size, int first, int last)
{
    char key[KEY_BYTES + 16];
    for (int r = 0, k = 0; r < old_size; r++) {
        if (k < kept_size && kept[k] == r) {
            k++;
            continue;
        }
        key_of(e, key, beats, "alive/");
        snprintf(key + strlen(key), 16, "%d", r);
        remove_key(e, key);
    }
    for (int n = first; n <= last && e->transport != SUMO_ELASTIC_SHM; n++)
        for (int r = 0; r < old_size; r++) {
            key_of(e, key, n, "agree/in/");
            snprintf(key + strlen(key), 16, "%d", r);
            remove_key(e, key);
        }
}

sumo_result sumo_elastic_shrink(sumo_elastic *e, uint64_t value, sumo_shrink_info *info)
{
    if (e == NULL || info == NULL || info->struct_size != sizeof *info)
        return SUMO_ERR_INVALID_ARGUMENT;
    int *old = malloc((size_t)e->size * sizeof *old);
    if (old == NULL) return fail(e, SUMO_ERR_SYSTEM, "out of memory");
    bool own_shm = e->make == NULL && e->transport == SUMO_ELASTIC_SHM;
    /* Members still inside a collective on the old communicator fail at once and come to
     * the agreement, rather than wait for this one until their deadline. */
    sumo_comm_abort(e->comm, "sumo_elastic_shrink: this member left to agree on a new membership");
    sumo_result res = SUMO_ERR_PEER_FAILURE;
    int first = e->makings, beats = e->kept, old_size = e->size;
    /* Each failed making costs a member at most (one that died meanwhile), or the store's
     * verdict of fail for all: bounded by the membership's size. The shm shrink agrees again
     * by itself, so it is tried once. */
    for (int tries = 0; tries <= old_size; tries++) {
        int n = e->makings++;
        sumo_shrink_info v = {.struct_size = sizeof v, .old_ranks = old};
        sumo_comm *comm = NULL;
        bool again = false;
        res = own_shm ? shrink_shm(e, n, value, &v, &comm)
                      : shrink_store(e, n, value, &v, &comm, &again);
        if (res == SUMO_SUCCESS) {
            res = adopt(e, comm, n, v.rank, v.size);
            if (v.rank == 0) forget_lost(e, beats, old_size, old, v.size, first, n);
            info->rank = v.rank;
            info->size = v.size;
            info->value = v.value;
            if (info->old_ranks) memcpy(info->old_ranks, old, (size_t)old_size * sizeof *old);
        }
        if (!again) break;
    }
    free(old);
    if (res == SUMO_SUCCESS) e->error[0] = '\0';
    return res;
}

sumo_result sumo_elastic_grow(sumo_elastic *e, int joiners, int *joined)
{
    if (e == NULL || joined == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *joined = 0;
    if (joiners < 0 || e->size + joiners > MAX_RANKS)
        return fail(e, SUMO_ERR_INVALID_ARGUMENT, "%d joiners to %d members (at most %d ranks)",
                    joiners, e->size, MAX_RANKS);
    if (joiners == 0) return SUMO_SUCCESS;
    int n = e->makings++, size = e->size + joiners, first = e->admitted + 1;
    e->admitted += joiners; /* taken in once, whether their holders come or not */
    char why[300] = "";
    for (int k = 0; e->rank == 0 && k < joiners; k++) {
        char place[128];
        snprintf(place, sizeof place, PLACE_TAG " %d %d %d %d %d %d %d", e->size + k, size, n,
                 e->kept, e->size, e->admitted, making_kind(e));
        sumo_result res = sumo__ticket_place(e->store, e->root, first + k, place, why, sizeof why);
        if (res != SUMO_SUCCESS) return fail(e, res, "%s", why); /* the others' making fails */
    }
    int *alive = malloc((size_t)size * sizeof *alive);
    if (alive == NULL) return fail(e, SUMO_ERR_SYSTEM, "out of memory");
    for (int r = 0; r < size; r++) alive[r] = r < e->size ? r : -1;
    sumo_comm *comm = NULL;
    sumo_result res = make_and_commit(e, n, e->rank, size, e->kept, alive, &comm);
    free(alive);
    if (res != SUMO_SUCCESS) return SUMO_SUCCESS; /* the members go on as they were */
    res = adopt(e, comm, n, e->rank, size);
    if (res == SUMO_SUCCESS) {
        *joined = joiners;
        e->error[0] = '\0';
    }
    return res;
}

sumo_result sumo_elastic_close(sumo_elastic *e)
{
    if (e == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    char why[300] = "";
    sumo_result res = sumo__tickets_close(e->store, e->root, why, sizeof why);
    return res == SUMO_SUCCESS ? res : fail(e, res, "%s", why);
}

sumo_result sumo_elastic_error_message(const sumo_elastic *e, const char **message)
{
    if (e == NULL || message == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *message = e->error;
    return SUMO_SUCCESS;
}

sumo_result sumo_elastic_destroy(sumo_elastic *e)
{
    if (e == NULL) return SUMO_SUCCESS;
    if (e->watching) {
        pthread_mutex_lock(&e->lock);
        e->stopping = 1;
        pthread_cond_signal(&e->wake);
        pthread_mutex_unlock(&e->lock);
        pthread_join(e->watcher, NULL);
    }
    sumo_heart_stop(e->heart);
    sumo_heart_watch_destroy(e->watch);
    if (e->comm) {
        sumo_comm_destroy(e->comm);
        char beat[KEY_BYTES + 16];
        key_of(e, beat, e->kept, "alive/");
        snprintf(beat + strlen(beat), 16, "%d", e->rank);
        remove_key(e, beat);
    }
    pthread_cond_destroy(&e->wake);
    pthread_mutex_destroy(&e->lock);
    free(e);
    return SUMO_SUCCESS;
}
