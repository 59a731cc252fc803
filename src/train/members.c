#include "train/members.h"
#include "train/join.h"
#include "train/snapshot.h"

#include <stdio.h>

sumo_result sumo__members_commit(sumo__rank_state *s, sumo__commits *ec, sumo_comm **comm)
{
    sumo_elastic *m = s->cfg->membership;
    int joiners = 0, joined = 0, was = s->size;
    const char *why = "";
    sumo_result r = sumo_elastic_commit(m, &joiners);
    if (r != SUMO_SUCCESS) {
        sumo_elastic_error_message(m, &why);
        snprintf(s->err, s->errlen, "rank %d: the commit point after step %ld: %s", s->rank, s->step, why);
        return r;
    }
    if (joiners == 0) return SUMO_SUCCESS;
    /* The exchange holds the communicator the grow replaces: it goes first. */
    sumo_comm_stats before = s->comm_before;
    s->comm_before = sumo__rank_stats_so_far(s);
    sumo__rank_drop_exchange(s);
    r = sumo_elastic_grow(m, joiners, &joined);
    sumo_comm *now = NULL;
    sumo_elastic_comm(m, &now);
    if (now == *comm) s->comm_before = before; /* nobody came: the counts go on */
    *comm = now;
    if (r == SUMO_SUCCESS) r = sumo__rank_build_on(s, now);
    /* The new exchange starts empty: each member loads its own state back into it (the step
     * just committed is where it stands). */
    sumo__train_counters tc;
    if (r == SUMO_SUCCESS &&
        sumo__rank_unpack(s, ec->blob[ec->latest], ec->bytes[ec->latest], &tc, true) != SUMO_SUCCESS) {
        snprintf(s->err, s->errlen, "rank %d: taking in joiners after step %ld: this rank's state does not fit "
                 "the exchange of %d ranks", s->rank, s->step, s->size);
        r = SUMO_ERR_INVALID_ARGUMENT;
    }
    if (r == SUMO_SUCCESS && joined > 0) r = sumo__share_state(s, ec, false);
    if (r != SUMO_SUCCESS) {
        if (s->err[0] == '\0') {
            sumo_elastic_error_message(m, &why);
            snprintf(s->err, s->errlen, "rank %d: taking in joiners after step %ld: %s", s->rank, s->step, why);
        }
        return r;
    }
    if (s->rank == 0) {
        if (joined > 0)
            fprintf(stderr, "sumo train: %d worker(s) joined after step %ld; going on with %d\n", joined,
                    s->step, s->size);
        else {
            sumo_elastic_error_message(m, &why);
            fprintf(stderr, "sumo train: %d worker(s) with join tickets did not come (%s); going on with %d\n",
                    joiners, why, was);
        }
    }
    return SUMO_SUCCESS;
}
