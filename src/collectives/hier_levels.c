/*
 * A two-level communicator's levels as its algorithms use them (hier_levels.h).
 */
#include "collectives/hier_levels.h"

static const char *level_name(const sumo_comm *c, const sumo_comm *level)
{
    const sumo__levels *lv = c->levels;
    return level == lv->node ? "node" : level == lv->any ? "all-ranks" : "across";
}

sumo_result sumo__level_run(sumo_comm *c, sumo_comm *level, const sumo_collective *call,
                            const char *what)
{
    sumo_result r = c->levels->run(level, call);
    if (r == SUMO_SUCCESS) return r;
    const char *m = "";
    sumo_comm_error_message(level, &m);
    const sumo__levels *lv = c->levels;
    r = SUMO__COMM_FAIL(c, r, "%s on the %s communicator (node %d, local rank %d): %s", what,
                        level_name(c, level), lv->h, lv->l, m);
    /* Whatever the code: the levels are out of step now. */
    c->status.broken = true;
    c->tp->ops->abort(c->tp);
    return r;
}

sumo_comm *sumo__level_across(const sumo_comm *c)
{
    const sumo__levels *lv = c->levels;
    const char *memory = c->x.k->memory;
    if (c->x.k != sumo__host_kernels())
        for (int i = lv->nacross - 1; i > 0; i--) {
            sumo__transport *tp = lv->across[i]->tp;
            if (tp->ops->carries && tp->ops->carries(tp, memory)) return lv->across[i];
        }
    return lv->across[0];
}

