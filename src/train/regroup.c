#include "train/regroup.h"
#include "train/evaluation.h"
#include "train/snapshot.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

sumo_result sumo__commit(sumo__rank_state *s, sumo__commits *ec)
{
    int slot = 1 - ec->latest;
    free(ec->blob[slot]);
    ec->blob[slot] = NULL;
    sumo_result r = sumo__rank_pack(s, &ec->blob[slot], &ec->bytes[slot]);
    if (r != SUMO_SUCCESS) return sumo__rank_fail(s, r, "keeping the step's state");
    ec->step[slot] = s->step;
    ec->epoch[slot] = s->epoch;
    ec->pos[slot] = s->pos;
    ec->latest = slot;
    return SUMO_SUCCESS;
}

void sumo__commits_free(sumo__commits *ec)
{
    free(ec->blob[0]);
    free(ec->blob[1]);
    free(ec->origins);
}

bool sumo__recoverable(const sumo__rank_state *s, sumo_result r)
{
    return s->cfg->elastic && (r == SUMO_ERR_PEER_FAILURE || r == SUMO_ERR_TIMEOUT);
}

/* The survivors of a loss shrink the communicator (value: this rank's part of the agreement,
 * the smallest comes back in *agreed) and move to it; lost names the workers gone. */
static sumo_result regroup(sumo__rank_state *s, sumo__commits *ec, sumo_comm **comm, uint64_t value,
                           const char *when, uint64_t *agreed, char *lost, size_t lostlen)
{
    char prefix[64], why[256] = "";
    snprintf(prefix, sizeof prefix, "sumo-train/regroup-%d/", ec->shrinks++);
    sumo_shrink_options o;
    sumo_shrink_options_default(&o);
    o.value = value;
    o.store = s->cfg->store;
    o.key_prefix = prefix;
    o.error = why;
    o.error_bytes = sizeof why;
    int old_size = s->size;
    int *old = malloc((size_t)old_size * sizeof *old);
    if (old == NULL) return SUMO_ERR_SYSTEM;
    sumo_shrink_info info = {.struct_size = sizeof info, .old_ranks = old};
    sumo_comm *fresh = NULL;
    sumo_elastic *m = s->cfg->membership;
    sumo_result r;
    if (m != NULL) {
        /* The membership destroys the old communicator: the exchange on it goes first. */
        sumo__rank_drop_exchange(s);
        r = sumo_elastic_shrink(m, value, &info);
        const char *msg = "";
        sumo_elastic_error_message(m, &msg);
        snprintf(why, sizeof why, "%s", msg);
        sumo_elastic_comm(m, &fresh);
        *comm = fresh;
    } else {
        r = sumo_comm_shrink(*comm, &o, &fresh, &info);
    }
    if (r != SUMO_SUCCESS) {
        snprintf(s->err, s->errlen, "rank %d: a peer was lost %s and the survivors could not regroup: %s",
                 s->rank, when, why[0] ? why : sumo_strerror(r));
        free(old);
        return r;
    }
    lost[0] = '\0';
    size_t used = 0;
    for (int k = 0, n = 0; k < old_size; k++) {
        if (n < info.size && old[n] == k) {
            ec->origins[n++] = ec->origins[k];
            continue;
        }
        int w = snprintf(lost + used, lostlen - used, "%s%d", used ? ", " : "", ec->origins[k]);
        if (w > 0 && (size_t)w < lostlen - used) used += (size_t)w;
    }
    ec->norigins = info.size;
    free(old);
    *agreed = info.value;
    return m != NULL ? sumo__rank_build_on(s, fresh) : sumo__rank_move_to(s, comm, fresh);
}

sumo_result sumo__recover(sumo__rank_state *s, sumo__commits *ec, sumo_comm **comm, sumo_result cause)
{
    double t0 = sumo__seconds_now();
    char lost[128], when[64];
    snprintf(when, sizeof when, "(%s)", sumo_result_name(cause));
    uint64_t agreed = 0;
    sumo_result r = regroup(s, ec, comm, (uint64_t)ec->step[ec->latest], when, &agreed, lost, sizeof lost);
    if (r != SUMO_SUCCESS) return r;
    long back = (long)agreed;
    int slot = ec->step[ec->latest] == back ? ec->latest : ec->step[1 - ec->latest] == back ? 1 - ec->latest : -1;
    if (slot < 0) {
        snprintf(s->err, s->errlen, "rank %d: the survivors went back to step %ld, which this rank does not hold "
                 "(it holds %ld and %ld)", s->rank, back, ec->step[ec->latest], ec->step[1 - ec->latest]);
        return SUMO_ERR_INTERNAL;
    }
    sumo__train_counters tc;
    r = sumo__rank_unpack(s, ec->blob[slot], ec->bytes[slot], &tc, true);
    if (r != SUMO_SUCCESS) {
        snprintf(s->err, s->errlen, "rank %d: the state of step %ld does not fit the exchange of %d ranks",
                 s->rank, back, s->size);
        return r;
    }
    sumo__rank_apply_counters(s, &tc);
    s->epoch = ec->epoch[slot];
    s->pos = ec->pos[slot];
    ec->latest = slot;
    s->err[0] = '\0'; /* what the failed step said is over */
    if (s->rank == 0) {
        fprintf(stderr, "sumo train: lost worker(s) %s (%s); going on with %d from step %ld (regrouped in %.1f ms)\n",
                lost, sumo_result_name(cause), s->size, s->step, 1e3 * (sumo__seconds_now() - t0));
        if (s->cfg->log_path) return sumo__rank_reopen_log(s);
    }
    return SUMO_SUCCESS;
}

sumo_result sumo__regroup_setup(sumo__rank_state *s, sumo__commits *ec, sumo_comm **comm)
{
    int was = s->size;
    char lost[128];
    uint64_t agreed;
    sumo_result r = regroup(s, ec, comm, 0, "during set-up", &agreed, lost, sizeof lost);
    if (r != SUMO_SUCCESS) return r;
    s->err[0] = '\0';
    if (s->rank == 0)
        fprintf(stderr, "sumo train: lost %d worker(s) during set-up; going on with %d\n", was - s->size, s->size);
    return SUMO_SUCCESS;
}

bool sumo__staged_loss(sumo__rank_state *s, sumo_comm **comm)
{
    const sumo__train_config *c = s->cfg;
    for (int i = 0; i < c->nevents; i++) {
        if (c->events[i].kind == SUMO__EVENT_JOIN || c->events[i].rank != s->origin ||
            c->events[i].step != s->step)
            continue;
        const char *transport = "";
        sumo_comm_transport(*comm, &transport);
        if (c->events[i].kind == SUMO__EVENT_DIE) {
            /* A process dies outright; a thread cannot without taking the others along, so it
             * aborts the group without a word (its peers fail as they would on a death). */
            if (strcmp(transport, "threads") != 0) raise(SIGKILL);
            sumo_comm_abort(*comm, "sumo train: a staged death (--kill)");
        }
        /* The aggregator's op lives on the handle: it goes first (teardown would otherwise
         * destroy it on a freed handle). A membership's communicator is its own: the caller
         * destroys the membership. */
        sumo_aggregator_destroy(s->agg);
        s->agg = NULL;
        if (c->membership == NULL) sumo_comm_destroy(*comm);
        *comm = s->comm = NULL;
        s->summary->lost = true;
        return true;
    }
    return false;
}
