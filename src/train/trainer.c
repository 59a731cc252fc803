#include "train/trainer.h"
#include "train/evaluation.h"
#include "train/join.h"
#include "train/members.h"
#include "train/rank.h"
#include "train/regroup.h"
#include "train/snapshot.h"
#include "collectives/collectives.h"
#include "common/common.h"
#include "common/settings.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void epoch_permutation(uint32_t *perm, size_t n, uint64_t seed, int epoch)
{
    uint64_t s = seed * 0x2545F4914F6CDD1Dull + (uint64_t)epoch + 1;
    for (size_t i = 0; i < n; i++) perm[i] = (uint32_t)i;
    for (size_t i = n - 1; i > 0; i--) {
        size_t j = (size_t)(sumo__splitmix64(&s) % (i + 1));
        uint32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

static void gather_batch(sumo__rank_state *s)
{
    if (s->epoch != s->perm_epoch) {
        epoch_permutation(s->perm, s->usable, s->cfg->seed, s->epoch);
        s->perm_epoch = s->epoch;
    }
    size_t b = (size_t)s->cfg->batch;
    size_t first = s->pos + (size_t)s->rank * b;
    for (size_t i = 0; i < b; i++) {
        uint32_t item = s->perm[first + i];
        memcpy(s->xbatch + i * s->pixels, s->train->images + (size_t)item * s->pixels,
               s->pixels * sizeof(float));
        s->ybatch[i] = s->train->labels[item];
    }
}

/* Moves past the step's data; true when that ended the epoch (too few items left for another
 * step of this many ranks). */
static bool advance_data(sumo__rank_state *s)
{
    size_t step_items = (size_t)s->size * (size_t)s->cfg->batch;
    s->pos += step_items;
    if (s->pos + step_items <= s->usable) return false;
    s->epoch++;
    s->pos = 0;
    return true;
}

static uint64_t checksum(const float *p, size_t n)
{
    return sumo__fnv1a(SUMO__FNV_OFFSET, p, n * sizeof *p);
}

/* The checksums of every rank's parameters, gathered as raw 8-byte words: an allgather only
 * copies bytes, so any bit pattern survives. */
static sumo_result verify_ranks(sumo__rank_state *s, const float *params)
{
    if (!sumo__rank_synchronized(s)) return SUMO_SUCCESS;
    uint64_t mine = checksum(params, s->nparams);
    uint64_t *all = calloc((size_t)s->size, sizeof *all);
    if (all == NULL) return SUMO_ERR_SYSTEM;
    sumo_result r = sumo_allgather(&mine, all, 1, SUMO_FLOAT64, s->comm);
    for (int k = 0; r == SUMO_SUCCESS && k < s->size; k++)
        if (all[k] != all[0]) {
            snprintf(s->err, s->errlen, "after step %ld rank %d holds parameters different from rank 0",
                     s->step, k);
            r = SUMO_ERR_INTERNAL;
        }
    free(all);
    return r;
}

sumo_result sumo__train_rank(sumo_comm **commp, int join, const sumo__train_config *cfg,
                             const sumo__dataset *train, const sumo__dataset *test,
                             sumo__train_summary *summary, char *err, size_t errlen)
{
    /* A process that joined through the store comes with its communicator already. */
    bool process_join = cfg != NULL && cfg->membership != NULL && join >= 0;
    if (commp == NULL || (*commp == NULL) != (join >= 0 && !process_join) || cfg == NULL || train == NULL ||
        test == NULL || summary == NULL || (join >= 0 && !process_join && cfg->room == NULL))
        return SUMO_ERR_INVALID_ARGUMENT;
    if (err && errlen) err[0] = '\0';
    sumo__train_summary local = {.steps_to_target = -1};
    *summary = local;
    sumo__join_plan plan = {0};
    if (join >= 0 && !process_join) {
        /* A joiner holds a ticket until its group comes, and learns from the ticket's place
         * which --join it is; one whose step never comes goes home. */
        char why[256] = "";
        sumo_result jr = sumo__room_join(cfg->room, &join, commp, why, sizeof why);
        if (jr == SUMO_ERR_INVALID_USAGE) {
            summary->lost = true;
            return SUMO_SUCCESS;
        }
        if (jr != SUMO_SUCCESS) {
            snprintf(err, errlen, "a worker joining: no group to join (%s)%s%s", sumo_result_name(jr),
                     why[0] ? ": " : "", why);
            return jr;
        }
        plan = sumo__plan_join(cfg, 0, join);
    }
    sumo_comm *comm = *commp;
    sumo__rank_state s = {.comm = comm, .cfg = cfg, .train = train, .test = test, .summary = summary,
                          .err = err, .errlen = errlen};
    sumo_comm_rank(comm, &s.rank);
    sumo_comm_size(comm, &s.size);
    s.origin = join >= 0 && !process_join ? plan.origin : s.rank;
    if (join < 0 && cfg->workers != s.size) {
        snprintf(err, errlen, "--workers %d but the communicator has %d ranks", cfg->workers, s.size);
        return SUMO_ERR_INVALID_ARGUMENT;
    }
    sumo__train_config_text(cfg, s.config, sizeof s.config);
    sumo_result r = sumo__rank_build(&s);
    if (r == SUMO_SUCCESS && cfg->resume) r = sumo__rank_load_checkpoint(&s);
    /* The log is opened during set-up, so that one that cannot be written stops every rank
     * before training rather than losing the run's record. */
    if (r == SUMO_SUCCESS && s.rank == 0 && cfg->log_path) r = sumo__rank_open_log(&s);
    /* Every rank must agree that the set-up worked, with the same configuration, before the
     * first collective of a step; the communicator's message names the first rank that did
     * not. A joiner comes after that, into a group whose members agreed already. */
    sumo_result ar = join >= 0 ? r
                               : sumo__agree_setup(comm, r, sumo__fnv1a(SUMO__FNV_OFFSET, s.config, strlen(s.config)),
                                                   "sumo train set-up (configuration)");
    sumo__commits ec = {.latest = 1, .step = {-1, -1}};
    if (cfg->elastic) {
        ec.origins = malloc((size_t)s.size * sizeof *ec.origins);
        for (int k = 0; ec.origins && k < s.size; k++) ec.origins[k] = k;
        ec.norigins = s.size;
        if (ec.origins == NULL && r == SUMO_SUCCESS) r = SUMO_ERR_SYSTEM;
    }
    /* A worker lost during set-up: the survivors regroup and set the exchange up again. */
    while (cfg->elastic && join < 0 && s.model && s.opt && s.eval_params && ec.origins &&
           (r == SUMO_SUCCESS || sumo__recoverable(&s, r)) && sumo__recoverable(&s, ar)) {
        r = sumo__regroup_setup(&s, &ec, commp);
        comm = *commp;
        if (r == SUMO_SUCCESS && s.rank == 0 && cfg->log_path && s.log == NULL) r = sumo__rank_open_log(&s);
        if (r != SUMO_SUCCESS && !sumo__recoverable(&s, r)) break;
        ar = sumo__agree_setup(comm, r, sumo__fnv1a(SUMO__FNV_OFFSET, s.config, strlen(s.config)),
                               "sumo train set-up (configuration)");
    }
    if (r == SUMO_SUCCESS && ar != SUMO_SUCCESS) {
        sumo__rank_fail(&s, ar, "set-up");
        /* Another rank's failure is that rank's to report; this one only followed it. */
        r = ar == SUMO_ERR_MISMATCH ? ar : SUMO_ERR_PEER_FAILURE;
    }
    if (r != SUMO_SUCCESS) {
        sumo__commits_free(&ec);
        sumo__rank_teardown(&s);
        return r;
    }
    sumo__rank_share_buffers(&s);
    s.t0 = sumo__seconds_now();
    double acc = 0;
    float *params = sumo__model_params(s.model);
    float *grads = sumo__model_grads(s.model);
    double compute = 0, aggregate = 0;
    if (cfg->elastic) {
        if (join >= 0) ec.grows = plan.generation;
        if (r == SUMO_SUCCESS) r = join >= 0 ? sumo__share_state(&s, &ec, true) : sumo__commit(&s, &ec);
    }
    /* An elastic run's step count follows its size: it ends with the epochs. */
    while (r == SUMO_SUCCESS && (cfg->elastic ? s.epoch < cfg->epochs : s.step < s.total_steps)) {
        if (cfg->room && sumo__plan_join(cfg, s.step, -1).generation > ec.grows &&
            sumo__plan_join(cfg, s.step, -1).joiners > 0) {
            r = sumo__take_joiners(&s, &ec, commp);
            comm = *commp;
            if (r != SUMO_SUCCESS) break;
        }
        if (cfg->nevents && sumo__staged_loss(&s, commp)) break;
        gather_batch(&s);
        double loss = 0, t1 = sumo__seconds_now();
        sumo__model_forward_backward(s.model, s.xbatch, s.ybatch, (size_t)cfg->batch, &loss);
        double lr = 0, t2 = sumo__seconds_now();
        sumo_lr_at(&s.sched, (uint64_t)s.step, &lr);
        uint64_t sent = sumo__rank_stats(&s).bytes;
        r = sumo_distributed_step(s.dist, params, grads, lr, NULL);
        double t3 = sumo__seconds_now();
        /* The stats count an exchange when it starts, so this step's share is the payload it
         * started. */
        sent = sumo__rank_stats(&s).bytes - sent;
        if (sent > s.peak_step_bytes) s.peak_step_bytes = sent;
        compute += t2 - t1;
        aggregate += t3 - t2;
        s.loss_sum += loss;
        s.loss_count++;
        s.step++;
        bool epoch_end = advance_data(&s);
        if (r == SUMO_ERR_NONFINITE) {
            summary->diverged = true; /* every rank sees the same status */
            r = SUMO_SUCCESS;
            break;
        }
        if (r == SUMO_SUCCESS && cfg->verify_ranks) r = verify_ranks(&s, params);
        bool last = cfg->elastic ? s.epoch >= cfg->epochs : s.step == s.total_steps;
        bool eval = cfg->eval_every > 0 ? s.step % cfg->eval_every == 0 || last : epoch_end;
        double test_loss = NAN, train_loss = NAN;
        if (r == SUMO_SUCCESS && eval) r = sumo__rank_evaluate(&s, &test_loss, &acc, &train_loss);
        if (r != SUMO_SUCCESS) {
            if (sumo__recoverable(&s, r)) {
                r = sumo__recover(&s, &ec, commp, r);
                comm = *commp;
                continue;
            }
            sumo__rank_fail(&s, r, "step");
            break;
        }
        if (eval) {
            sumo__rank_log_row(&s, train_loss, test_loss, acc);
            if (!isfinite(train_loss) || !isfinite(test_loss)) {
                summary->diverged = true;
                break;
            }
        }
        sumo__rank_progress(&s, (int)((s.step - 1) / s.steps_per_epoch), acc);
        bool stop = cfg->stop_after > 0 && s.step >= cfg->stop_after;
        if (cfg->checkpoint_dir && ((cfg->checkpoint_every > 0 && s.step % cfg->checkpoint_every == 0) ||
                                    s.step == s.total_steps || stop))
            r = sumo__rank_save_checkpoint(&s);
        if (stop) break;
        if (cfg->elastic && r == SUMO_SUCCESS) r = sumo__commit(&s, &ec);
        if (cfg->membership && r == SUMO_SUCCESS) {
            r = sumo__members_commit(&s, &ec, commp);
            comm = *commp;
            if (sumo__recoverable(&s, r)) {
                r = sumo__recover(&s, &ec, commp, r);
                comm = *commp;
            }
        }
    }
    sumo__commits_free(&ec);
    if (summary->lost) {
        sumo__rank_teardown(&s);
        return SUMO_SUCCESS;
    }
    /* Every rank runs the same number of steps (the configuration hash says so), except
     * where --stop-after, which may differ between ranks, or a divergence ended the loop. */
    s.ended_together = r == SUMO_SUCCESS && (cfg->elastic ? s.epoch >= cfg->epochs : s.step == s.total_steps);
    if (s.rank == 0 && cfg->progress && cfg->progress_inline) fputc('\n', stderr);
    if (s.log) {
        /* Buffered rows reach the disk here: a full disk is found now or never. */
        bool bad = ferror(s.log) != 0;
        if (fclose(s.log) != 0) bad = true;
        s.log = NULL;
        if (bad && r == SUMO_SUCCESS) {
            snprintf(err, errlen, "%s: cannot write the log: %s", cfg->log_path, strerror(errno));
            r = SUMO_ERR_SYSTEM;
        }
    }
    summary->steps = s.step;
    summary->workers = s.size;
    summary->wall_seconds = s.elapsed_before + sumo__seconds_now() - s.t0;
    summary->compute_seconds = compute;
    summary->aggregation_seconds = aggregate;
    summary->nparams = s.nparams;
    summary->comm = sumo__rank_stats_so_far(&s);
    summary->peak_bytes_in_flight = s.peak_step_bytes;
    sumo_distributed_extra_memory(s.dist, &summary->extra_memory_bytes);
    summary->param_checksum = checksum(params, s.nparams);
    sumo__rank_teardown(&s);
    return r;
}

typedef struct thread_job {
    const sumo__train_config *cfg;
    const sumo__dataset *train, *test;
    sumo__train_summary summary;
    bool ran;
    char err[512];
} thread_job;

static sumo_result train_thread(sumo_comm *comm, int rank, void *arg)
{
    thread_job *j = (thread_job *)arg + rank;
    j->ran = true;
    return sumo__train_rank(&comm, -1, j->cfg, j->train, j->test, &j->summary, j->err, sizeof j->err);
}

/* An elastic run's threads own their handles: a shrink replaces them, so sumo_threads_run
 * (which destroys the handle it gave) cannot hold them. */
typedef struct elastic_thread {
    thread_job *job;
    sumo_comm *comm;
    int join; /* -1: a worker from the start; 0: a joiner (its ticket says which) */
    sumo_result result;
} elastic_thread;

static void *elastic_main(void *p)
{
    elastic_thread *t = p;
    t->job->ran = true;
    t->result = sumo__train_rank(&t->comm, t->join, t->job->cfg, t->job->train, t->job->test,
                                 &t->job->summary, t->job->err, sizeof t->job->err);
    if (t->comm) sumo_comm_destroy(t->comm);
    return NULL;
}

/* n workers from the start and `joiners` threads that hold join tickets in the room until
 * their step, up to timeout_s. */
static sumo_result run_elastic_threads(int n, int joiners, double timeout_s, thread_job *jobs,
                                       sumo_result *results, char *err, size_t errlen)
{
    int all = n + joiners;
    struct sumo__train_room room;
    sumo__train_config cfg = *jobs[0].cfg;
    /* The tickets' folder only where someone joins. */
    cfg.room = joiners > 0 ? &room : NULL;
    sumo_result r = joiners > 0 ? sumo__room_init(&room, timeout_s) : SUMO_SUCCESS;
    if (r != SUMO_SUCCESS) {
        snprintf(err, errlen, "--join: no folder for the join tickets under TMPDIR (%s)", sumo_result_name(r));
        return r;
    }
    sumo_comm **comms = calloc((size_t)n, sizeof *comms);
    elastic_thread *ts = calloc((size_t)all, sizeof *ts);
    pthread_t *ids = calloc((size_t)all, sizeof *ids);
    r = comms && ts && ids ? sumo_comm_create_threads(n, comms) : SUMO_ERR_SYSTEM;
    int started = 0;
    for (int i = 0; r == SUMO_SUCCESS && i < all; i++) {
        jobs[i].cfg = &cfg;
        ts[i] = (elastic_thread){.job = &jobs[i], .comm = i < n ? comms[i] : NULL, .join = i < n ? -1 : 0};
        if (pthread_create(&ids[i], NULL, elastic_main, &ts[i]) != 0) {
            /* The ranks not started leave at once; those running lose them as peers. */
            for (int k = i; k < n; k++) sumo_comm_destroy(comms[k]);
            r = SUMO_ERR_SYSTEM;
            break;
        }
        started++;
    }
    for (int i = 0; i < started; i++) {
        /* The workers are done: joiners still waiting have no step left to join at. */
        if (i == n && joiners > 0) sumo__room_close(&room);
        pthread_join(ids[i], NULL);
        results[i] = ts[i].result;
    }
    if (joiners > 0) sumo__room_destroy(&room);
    free(comms);
    free(ts);
    free(ids);
    return r;
}

sumo_result sumo__train_threads(const sumo__train_config *cfg, const sumo__dataset *train,
                                const sumo__dataset *test, sumo__train_summary *summary,
                                char *err, size_t errlen)
{
    int n = cfg->workers;
    if (n < 1 || n > SUMO_THREADS_MAX_RANKS) {
        snprintf(err, errlen, "--workers %d is out of range (1 to %d)", n, SUMO_THREADS_MAX_RANKS);
        return SUMO_ERR_INVALID_ARGUMENT;
    }
    /* The workers' communicators would refuse a malformed deadline each on its own; read here
     * once, before any thread starts, the refusal is the run's message. */
    sumo__setting_value timeout;
    char why[256];
    if (sumo__setting_read(SUMO__SETTING_TIMEOUT, &timeout, why, sizeof why) != SUMO_SUCCESS) {
        snprintf(err, errlen, "%s", why);
        return SUMO_ERR_INVALID_ARGUMENT;
    }
    int joiners = 0;
    for (int i = 0; cfg->elastic && i < cfg->nevents; i++) joiners += cfg->events[i].kind == SUMO__EVENT_JOIN;
    int all = n + joiners;
    thread_job *jobs = calloc((size_t)all, sizeof *jobs);
    sumo_result *results = calloc((size_t)all, sizeof *results);
    if (jobs == NULL || results == NULL) {
        free(jobs);
        free(results);
        snprintf(err, errlen, "out of memory for %d workers (--workers)", n);
        return SUMO_ERR_SYSTEM;
    }
    for (int i = 0; i < all; i++) jobs[i] = (thread_job){.cfg = cfg, .train = train, .test = test};
    /* The runner makes the ranks that did start fail at once when one could not, instead of
     * waiting for it until the deadline. */
    sumo_result r = cfg->elastic ? run_elastic_threads(n, joiners, timeout.number, jobs, results, err, errlen)
                                 : sumo_threads_run(n, train_thread, jobs, results);
    int missing = 0, first_missing = -1;
    for (int i = 0; i < all; i++)
        if (!jobs[i].ran) {
            if (first_missing < 0) first_missing = i;
            missing++;
        }
    if (missing == all) {
        if (err[0] == '\0') snprintf(err, errlen, "cannot set up %d workers (--workers): %s", n, sumo_strerror(r));
    } else if (missing > 0) {
        snprintf(err, errlen, "%d of %d worker threads could not be started (the first: rank %d); "
                 "lower --workers or raise the memory or thread limit", missing, all, first_missing);
        r = SUMO_ERR_SYSTEM;
    } else {
        /* The report comes from the first worker still there at the end. */
        int first = 0;
        while (first < all - 1 && jobs[first].summary.lost) first++;
        r = results[first];
        *summary = jobs[first].summary;
        /* Report the rank that failed first-hand, not the peers that failed because of it. */
        for (int pass = 0; pass < 2 && err[0] == '\0'; pass++)
            for (int i = 0; i < all && err[0] == '\0'; i++)
                if (results[i] != SUMO_SUCCESS && (pass || results[i] != SUMO_ERR_PEER_FAILURE)) {
                    snprintf(err, errlen, "%s", jobs[i].err);
                    r = results[i];
                }
        for (int i = 0; i < all; i++) {
            /* Every rank must end with the same parameters (SlowMo only after its last sync). */
            if (jobs[i].summary.lost) continue;
            if (jobs[i].summary.param_checksum != jobs[first].summary.param_checksum && r == SUMO_SUCCESS &&
                !sumo__method_is_outer(cfg->method)) {
                snprintf(err, errlen, "rank %d ended with parameters different from rank %d", i, first);
                r = SUMO_ERR_INTERNAL;
            }
        }
        if (err[0] == '\0' && jobs[first].err[0]) snprintf(err, errlen, "%s", jobs[first].err);
    }
    free(jobs);
    free(results);
    return r;
}
