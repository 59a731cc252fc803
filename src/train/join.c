#include "train/join.h"
#include "train/snapshot.h"
#include "transport/tickets.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The tickets' keys in the room's store, which holds nothing else. */
#define ROOM_ROOT ""

sumo_result sumo__room_init(struct sumo__train_room *room, double timeout_s)
{
    *room = (struct sumo__train_room){.timeout_s = timeout_s};
    /* A folder of the run's own (mkdtemp makes it 0700, as the directory store asks). */
    const char *base = getenv("TMPDIR");
    char dir[512];
    if (base == NULL || base[0] == '\0') base = "/tmp";
    if (snprintf(dir, sizeof dir, "%s/sumo-join-XXXXXX", base) >= (int)sizeof dir || mkdtemp(dir) == NULL)
        return SUMO_ERR_SYSTEM;
    if (sumo_store_create_dir(dir, &room->store) != SUMO_SUCCESS) {
        rmdir(dir);
        return SUMO_ERR_SYSTEM;
    }
    if (pthread_mutex_init(&room->lock, NULL) != 0) {
        sumo_store_destroy_dir(room->store, 1);
        return SUMO_ERR_SYSTEM;
    }
    if (pthread_cond_init(&room->changed, NULL) != 0) {
        pthread_mutex_destroy(&room->lock);
        sumo_store_destroy_dir(room->store, 1);
        return SUMO_ERR_SYSTEM;
    }
    return SUMO_SUCCESS;
}

void sumo__room_close(struct sumo__train_room *room)
{
    pthread_mutex_lock(&room->lock);
    room->closed = true;
    pthread_cond_broadcast(&room->changed);
    pthread_mutex_unlock(&room->lock);
    /* A holder waiting for its place goes home as a process would; should the store fail, the
     * holder's wait ends at its deadline instead. */
    sumo__tickets_close(room->store, ROOM_ROOT, NULL, 0);
}

void sumo__room_destroy(struct sumo__train_room *room)
{
    pthread_cond_destroy(&room->changed);
    pthread_mutex_destroy(&room->lock);
    free(room->handles);
    room->handles = NULL;
    sumo_store_destroy_dir(room->store, 1);
    room->store = NULL;
}

/* Now plus the room's deadline, on the clock the store's waits use. */
static int64_t room_deadline(const struct sumo__train_room *room)
{
    return sumo__now_ns() + (int64_t)((room->timeout_s + 1) * 1e9);
}

sumo_result sumo__room_join(struct sumo__train_room *room, int *join_index, sumo_comm **out,
                            char *err, size_t errlen)
{
    int ticket = 0, generation = 0, place = 0, joiners = 0;
    char text[64];
    sumo_result r = sumo__ticket_take(room->store, ROOM_ROOT, &ticket, err, errlen);
    if (r == SUMO_SUCCESS)
        r = sumo__ticket_wait(room->store, ROOM_ROOT, ticket, room_deadline(room), text, sizeof text, err,
                              errlen);
    /* The run ended before this joiner's step: it never came in. */
    if (r == SUMO_ERR_PEER_FAILURE) return SUMO_ERR_INVALID_USAGE;
    if (r != SUMO_SUCCESS) return r;
    if (sscanf(text, "%d %d %d %d", &generation, &place, &joiners, join_index) != 4) {
        snprintf(err, errlen, "join ticket %d: its place is not one (\"%s\")", ticket, text);
        return SUMO_ERR_INTERNAL;
    }
    return sumo__room_take(room, generation, false, 0, -(place + 1), joiners, out);
}

/* Rank 0 of the members, at a step where `joiners` join as group `generation` (rank 0 alone
 * counts room->placed: whoever is rank 0 when workers join): waits (up to the deadline) until that many more tickets are taken and gives each its place, in ticket
 * order: the step's --join in the order given. */
static sumo_result place_joiners(const sumo__rank_state *s, struct sumo__train_room *room, int generation,
                                 int joiners)
{
    int count = room->placed;
    int64_t until = room_deadline(room);
    sumo_result r = SUMO_SUCCESS;
    while (r == SUMO_SUCCESS && count < room->placed + joiners) {
        r = sumo__tickets_count(room->store, ROOM_ROOT, count, &count, s->err, s->errlen);
        if (r == SUMO_SUCCESS && count < room->placed + joiners) {
            if (sumo__now_ns() > until) {
                snprintf(s->err, s->errlen, "rank %d: %d worker(s) to join at step %ld: only %d took a join ticket",
                         s->rank, joiners, s->step, count - room->placed);
                return SUMO_ERR_TIMEOUT;
            }
            nanosleep(&(struct timespec){.tv_nsec = 1000 * 1000}, NULL);
        }
    }
    for (int i = 0, order = 0, place = 0; r == SUMO_SUCCESS && i < s->cfg->nevents; i++) {
        if (s->cfg->events[i].kind != SUMO__EVENT_JOIN) continue;
        if (s->cfg->events[i].step == s->step) {
            char text[64];
            snprintf(text, sizeof text, "%d %d %d %d", generation, place, joiners, order);
            r = sumo__ticket_place(room->store, ROOM_ROOT, room->placed + 1 + place, text, s->err, s->errlen);
            place++;
        }
        order++;
    }
    if (r == SUMO_SUCCESS) room->placed += joiners;
    return r;
}

sumo_result sumo__room_take(struct sumo__train_room *room, int generation, bool make, int size,
                            int index, int joiners, sumo_comm **out)
{
    sumo_result r = SUMO_SUCCESS;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += (time_t)room->timeout_s + 1;
    pthread_mutex_lock(&room->lock);
    if (make) {
        room->handles = calloc((size_t)size, sizeof *room->handles);
        r = room->handles ? sumo_comm_create_threads(size, room->handles) : SUMO_ERR_SYSTEM;
        if (r != SUMO_SUCCESS) {
            free(room->handles);
            room->handles = NULL;
        }
        room->nhandles = size;
        room->taken = 0;
        room->generation = generation;
        pthread_cond_broadcast(&room->changed);
    }
    while (r == SUMO_SUCCESS && room->generation < generation && !room->closed)
        if (pthread_cond_timedwait(&room->changed, &room->lock, &until) != 0) r = SUMO_ERR_TIMEOUT;
    if (r == SUMO_SUCCESS && (room->generation != generation || room->handles == NULL))
        r = room->closed ? SUMO_ERR_INVALID_USAGE : SUMO_ERR_SYSTEM;
    if (r == SUMO_SUCCESS) {
        /* A joiner's place: after the members, whatever losses came before. */
        if (index < 0) index = room->nhandles - joiners + (-index - 1);
        *out = room->handles[index];
        if (++room->taken == room->nhandles) {
            free(room->handles);
            room->handles = NULL;
        }
    }
    pthread_mutex_unlock(&room->lock);
    return r;
}

sumo__join_plan sumo__plan_join(const sumo__train_config *c, long step, int join_index)
{
    sumo__join_plan p = {0};
    long steps[SUMO__MAX_TRAIN_EVENTS];
    int nsteps = 0, order = 0;
    for (int i = 0; i < c->nevents; i++) {
        if (c->events[i].kind != SUMO__EVENT_JOIN) continue;
        if (order == join_index) step = c->events[i].step, p.origin = c->workers + order;
        order++;
        bool seen = false;
        for (int k = 0; k < nsteps; k++) seen |= steps[k] == c->events[i].step;
        if (!seen) steps[nsteps++] = c->events[i].step;
    }
    order = 0;
    for (int i = 0; i < c->nevents; i++) {
        if (c->events[i].kind != SUMO__EVENT_JOIN) continue;
        if (c->events[i].step == step) {
            if (order < join_index) p.place++;
            p.joiners++;
        }
        order++;
    }
    for (int k = 0; k < nsteps; k++) p.generation += steps[k] <= step;
    return p;
}

/* What a joiner needs besides the state: where the run is, and how it counts. */
typedef struct join_header {
    int64_t step, steps_per_epoch, total_steps, epoch;
    uint64_t pos, bytes;
    sumo_lr_schedule sched;
} join_header;

sumo_result sumo__share_state(sumo__rank_state *s, sumo__commits *ec, bool joining)
{
    union {
        join_header h;
        double words[(sizeof(join_header) + 7) / 8];
    } head;
    memset(&head, 0, sizeof head);
    if (s->rank == 0)
        head.h = (join_header){.step = ec->step[ec->latest], .steps_per_epoch = s->steps_per_epoch,
                               .total_steps = s->total_steps, .epoch = ec->epoch[ec->latest],
                               .pos = ec->pos[ec->latest], .bytes = ec->bytes[ec->latest],
                               .sched = s->sched};
    /* A broadcast copies bytes: any bit pattern crosses as float64 words. */
    sumo_result r = sumo_broadcast(&head, &head, sizeof head.words / 8, SUMO_FLOAT64, 0, s->comm);
    if (r != SUMO_SUCCESS) return sumo__rank_fail(s, r, "joining: the state's size");
    size_t words = (size_t)(head.h.bytes + 7) / 8;
    double *blob = calloc(words ? words : 1, 8);
    int64_t *origins = calloc((size_t)s->size, sizeof *origins);
    if (blob == NULL || origins == NULL) r = SUMO_ERR_SYSTEM;
    if (r == SUMO_SUCCESS && s->rank == 0) {
        memcpy(blob, ec->blob[ec->latest], head.h.bytes);
        int k = 0;
        for (; k < ec->norigins; k++) origins[k] = ec->origins[k];
        /* Processes that joined through the store: numbered after every worker before them. */
        for (; s->cfg->membership != NULL && k < s->size; k++) origins[k] = s->cfg->workers + ec->grows++;
        for (int i = 0, order = 0; i < s->cfg->nevents; i++) {
            if (s->cfg->events[i].kind != SUMO__EVENT_JOIN) continue;
            if (s->cfg->events[i].step == head.h.step && k < s->size) origins[k++] = s->cfg->workers + order;
            order++;
        }
    }
    if (r == SUMO_SUCCESS) r = sumo_broadcast(blob, blob, words, SUMO_FLOAT64, 0, s->comm);
    if (r == SUMO_SUCCESS)
        r = sumo_broadcast(origins, origins, (size_t)s->size, SUMO_FLOAT64, 0, s->comm);
    if (r == SUMO_SUCCESS) {
        int *grown = realloc(ec->origins, (size_t)s->size * sizeof *grown);
        if (grown == NULL) r = SUMO_ERR_SYSTEM;
        else {
            ec->origins = grown;
            for (int k = 0; k < s->size; k++) grown[k] = (int)origins[k];
            ec->norigins = s->size;
        }
    }
    if (r == SUMO_SUCCESS && joining) {
        sumo__train_counters tc;
        r = sumo__rank_unpack(s, (unsigned char *)blob, head.h.bytes, &tc, true);
        if (r != SUMO_SUCCESS) {
            snprintf(s->err, s->errlen, "rank %d: joining: worker 0's state does not fit this worker", s->rank);
        } else {
            sumo__rank_apply_counters(s, &tc);
            s->epoch = (int)head.h.epoch;
            s->pos = head.h.pos;
            s->steps_per_epoch = head.h.steps_per_epoch;
            s->total_steps = head.h.total_steps;
            s->sched = head.h.sched;
            r = sumo__commit(s, ec);
        }
    }
    free(blob);
    free(origins);
    return r == SUMO_ERR_SYSTEM ? sumo__rank_fail(s, r, "joining: memory") : r;
}

sumo_result sumo__take_joiners(sumo__rank_state *s, sumo__commits *ec, sumo_comm **comm)
{
    sumo__join_plan p = sumo__plan_join(s->cfg, s->step, -1);
    if (p.joiners == 0 || s->cfg->room == NULL) return SUMO_SUCCESS;
    sumo_comm *fresh = NULL;
    sumo_result r = s->rank == 0 ? place_joiners(s, s->cfg->room, p.generation, p.joiners) : SUMO_SUCCESS;
    if (r != SUMO_SUCCESS) return r;
    r = sumo__room_take(s->cfg->room, p.generation, s->rank == 0, s->size + p.joiners, s->rank,
                                    p.joiners, &fresh);
    if (r != SUMO_SUCCESS) {
        snprintf(s->err, s->errlen, "rank %d: workers joining at step %ld: no group (%s)", s->rank, s->step,
                 sumo_result_name(r));
        return r;
    }
    ec->grows = p.generation;
    s->comm_before = sumo__rank_stats_so_far(s); /* the exchange's counts go with it */
    int was = s->size;
    r = sumo__rank_move_to(s, comm, fresh);
    /* The new exchange starts empty: each member loads its own state back into it (the step
     * just committed is where it stands). */
    sumo__train_counters tc;
    if (r == SUMO_SUCCESS &&
        sumo__rank_unpack(s, ec->blob[ec->latest], ec->bytes[ec->latest], &tc, true) != SUMO_SUCCESS) {
        snprintf(s->err, s->errlen, "rank %d: workers joining at step %ld: this rank's state does not fit the "
                 "exchange of %d ranks", s->rank, s->step, s->size);
        r = SUMO_ERR_INVALID_ARGUMENT;
    }
    if (r == SUMO_SUCCESS) r = sumo__share_state(s, ec, false);
    if (r == SUMO_SUCCESS && s->rank == 0)
        fprintf(stderr, "sumo train: %d worker(s) joined at step %ld; going on with %d\n", s->size - was,
                s->step, s->size);
    return r;
}
