/*
 * The two-level communicator (sumo.h, sumo_comm_create_hier): an ordinary handle over the
 * composed transport (transport/transport_hier.h), which owns its levels (requests.c destroys
 * them with it). Its algorithms are in hier_algos.c, adasum.c and adasum_hier.c; execute.c
 * picks them.
 */
#include "collectives/comm.h"
#include "common/settings.h"
#include "transport/transport_hier.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

sumo_result sumo_hier_options_default(sumo_hier_options *options)
{
    if (options == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *options = (sumo_hier_options){.struct_size = sizeof *options};
    return SUMO_SUCCESS;
}

/* Why creation failed: no handle carries it, so it goes where sumo's logs go. */
static sumo_result refuse(sumo_result code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static sumo_result refuse(sumo_result code, const char *fmt, ...)
{
    char m[320];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    fprintf(stderr, "sumo: %s\n", m);
    return code;
}

/* Every rank of level has the same v[0..3) as this one: an allgather of small integers
 * (exact in double) over host memory. */
static sumo_result same_on_all(sumo_comm *level, const char *level_is, const double v[3],
                               const char *what)
{
    int size = 0;
    sumo_comm_size(level, &size);
    double *all = malloc(3 * (size_t)size * sizeof *all);
    if (all == NULL) return refuse(SUMO_ERR_SYSTEM, "sumo_comm_create_hier: out of memory");
    sumo_result r = sumo_allgather(v, all, 3, SUMO_FLOAT64, level);
    if (r != SUMO_SUCCESS) {
        const char *m = "";
        sumo_comm_error_message(level, &m);
        free(all);
        return refuse(r, "sumo_comm_create_hier: the check of the %s communicator: %s", level_is, m);
    }
    for (int i = 0; i < size; i++) {
        if (all[3 * i] == v[0] && all[3 * i + 1] == v[1] && all[3 * i + 2] == v[2]) continue;
        r = refuse(SUMO_ERR_MISMATCH, "sumo_comm_create_hier: %s: rank %d of the %s communicator "
                   "has (%.0f, %.0f, any %s), this rank (%.0f, %.0f, any %s)", what, i, level_is,
                   all[3 * i], all[3 * i + 1], all[3 * i + 2] != 0 ? "given" : "none", v[0], v[1],
                   v[2] != 0 ? "given" : "none");
        break;
    }
    free(all);
    return r;
}

sumo_result sumo_comm_create_hier(sumo_comm *node, sumo_comm *across,
                                  const sumo_hier_options *options, sumo_comm **out)
{
    if (out == NULL) return refuse(SUMO_ERR_INVALID_ARGUMENT, "sumo_comm_create_hier: out is NULL");
    *out = NULL;
    if (node == NULL || across == NULL || node == across)
        return refuse(SUMO_ERR_INVALID_ARGUMENT, "sumo_comm_create_hier: node and across must "
                      "be two communicators");
    sumo_hier_options o;
    sumo_hier_options_default(&o);
    char why[256];
    if (options != NULL) {
        if (SUMO__STRUCT_SIZE_PROBLEM(options, sumo_hier_options, why, sizeof why))
            return refuse(SUMO_ERR_INVALID_ARGUMENT, "sumo_comm_create_hier: options: %s", why);
        o = *options;
    }
    if (o.any == node || o.any == across)
        return refuse(SUMO_ERR_INVALID_ARGUMENT, "sumo_comm_create_hier: options.any is one of "
                      "the levels");
    if (node->levels || across->levels || (o.any && o.any->levels))
        return refuse(SUMO_ERR_INVALID_USAGE, "sumo_comm_create_hier: a level is itself a "
                      "two-level communicator");
    /* The chain's chunk, read once (the table refuses a malformed value by name). */
    sumo__setting_value chunk;
    if (sumo__setting_read(SUMO__SETTING_HIER_CHUNK_BYTES, &chunk, why, sizeof why) != SUMO_SUCCESS)
        return refuse(SUMO_ERR_INVALID_ARGUMENT, "sumo_comm_create_hier: %s", why);
    int L = node->tp->size, l = node->tp->rank, H = across->tp->size, h = across->tp->rank;
    /* options.any must be every rank, this one at h * L + l; its absence must be alike. */
    double any = 0;
    if (o.any) {
        any = 1;
        if (o.any->tp->size != H * L || o.any->tp->rank != h * L + l) any = -1;
    }
    /* A node's ranks are on one node (the same h, the same H), and an across communicator
     * holds one local rank of every node (the same l, the same L). */
    double mine_node[3] = {h, H, any}, mine_across[3] = {l, L, any};
    SUMO__CHECK(same_on_all(node, "node", mine_node, "(node, nodes)"));
    SUMO__CHECK(same_on_all(across, "across", mine_across, "(local rank, local size)"));
    if (any < 0)
        return refuse(SUMO_ERR_INVALID_ARGUMENT, "sumo_comm_create_hier: options.any has rank "
                      "%d of %d; this rank is %d of %d (h * L + l)", o.any->tp->rank,
                      o.any->tp->size, h * L + l, H * L);
    sumo__levels *lv = calloc(1, sizeof *lv);
    if (lv == NULL) return refuse(SUMO_ERR_SYSTEM, "sumo_comm_create_hier: out of memory");
    *lv = (sumo__levels){.node = node, .across = {across}, .nacross = 1, .any = o.any,
                         .L = L, .l = l, .H = H, .h = h,
                         .chunk_bytes = (size_t)chunk.integer};
    sumo__hier_links links = {.node = node->tp, .across = across->tp,
                              .any = o.any ? o.any->tp : NULL, .L = L, .l = l, .H = H, .h = h};
    sumo__transport *tp = NULL;
    sumo_comm *c = NULL;
    sumo_result r = sumo__hier_tp_create(&links, &tp);
    if (r == SUMO_SUCCESS) r = sumo__comm_wrap(tp, &c); /* destroys tp on failure */
    if (r != SUMO_SUCCESS) {
        free(lv);
        return refuse(r, "sumo_comm_create_hier: out of memory");
    }
    c->levels = lv;
    *out = c;
    return SUMO_SUCCESS;
}

sumo_result sumo_comm_hier_add_across(sumo_comm *comm, sumo_comm *across)
{
    if (comm == NULL || across == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    sumo__levels *lv = comm->levels;
    if (lv == NULL)
        return SUMO__COMM_FAIL(comm, SUMO_ERR_INVALID_USAGE, "sumo_comm_hier_add_across: not "
                               "a two-level communicator (sumo_comm_create_hier)");
    if (lv->nacross == SUMO__MAX_ACROSS)
        return SUMO__COMM_FAIL(comm, SUMO_ERR_INVALID_USAGE, "sumo_comm_hier_add_across: at "
                               "most %d across communicators", SUMO__MAX_ACROSS);
    if (across->levels || across == comm || across == lv->node || across == lv->any)
        return SUMO__COMM_FAIL(comm, SUMO_ERR_INVALID_ARGUMENT, "sumo_comm_hier_add_across: "
                               "the across communicator is one the two-level one has or is");
    for (int i = 0; i < lv->nacross; i++)
        if (across == lv->across[i])
            return SUMO__COMM_FAIL(comm, SUMO_ERR_INVALID_ARGUMENT, "sumo_comm_hier_add_across: "
                                   "that across communicator was added already");
    /* Collective over the across ranks: the same shape as the first one, on every rank. */
    double v[3] = {lv->l, lv->L, across->tp->rank == lv->h && across->tp->size == lv->H};
    sumo_result r = same_on_all(across, "added across", v, "(local rank, local size, shape)");
    if (r == SUMO_SUCCESS && v[2] == 0)
        r = SUMO_ERR_INVALID_ARGUMENT;
    if (r != SUMO_SUCCESS)
        return SUMO__FAIL_TOGETHER(comm->tp, r, "sumo_comm_hier_add_across: the communicator "
                                   "is not rank h of H = %d at local rank %d on every rank (rank "
                                   "%d of %d here; its message says more)", lv->H, lv->l,
                                   across->tp->rank, across->tp->size);
    sumo__comm_enter(comm);
    r = sumo__hier_tp_add_across(comm->tp, across->tp);
    if (r == SUMO_SUCCESS) {
        lv->across[lv->nacross++] = across;
        /* The tables the two-level communicator has, and its deadline. */
        for (int i = 0; i < comm->ntables && r == SUMO_SUCCESS; i++) {
            bool has = false;
            for (int k = 0; k < across->ntables; k++) has = has || across->tables[k] == comm->tables[i];
            if (!has) r = sumo_comm_add_kernels(across, comm->tables[i]);
        }
        if (r == SUMO_SUCCESS)
            r = sumo_comm_set_timeout(across, (double)comm->tp->timeout_ns / 1e9);
        if (r != SUMO_SUCCESS) {
            /* Back to what it was: the caller keeps it. */
            lv->nacross--;
            sumo__hier_tp_drop_across(comm->tp);
        }
    }
    sumo__comm_leave(comm);
    return r;
}
