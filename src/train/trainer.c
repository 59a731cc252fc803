#include "train/trainer.h"
#include "train/checkpoint.h"
#include "collectives/collectives.h"
#include "common/common.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static uint64_t config_hash(const char *text)
{
    return sumo__fnv1a(SUMO__FNV_OFFSET, text, strlen(text));
}

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

static double now_s(void) { return (double)sumo__now_ns() * 1e-9; }

/* Everything one rank needs during a run. */
typedef struct rank_state {
    sumo_comm *comm;
    const sumo__train_config *cfg;
    const sumo__dataset *train, *test;
    int rank, size;
    sumo__model *model;
    sumo_optimizer *opt;
    sumo_aggregator *agg;
    sumo_distributed *dist;
    sumo_lr_schedule sched;
    size_t nparams, pixels;
    long steps_per_epoch, total_steps;
    long step;              /* steps taken */
    /* Where the next step's data starts: the epoch and the items of its permutation used so
     * far. Each step uses size x batch items, so with a fixed size this is the step count
     * split in two; kept apart because an elastic run's size changes. */
    int epoch;
    size_t pos;
    size_t usable;          /* items of the training set in use */
    double loss_sum;        /* local losses since the last evaluation */
    long loss_count;
    float *xbatch;
    uint8_t *ybatch;
    uint32_t *perm;
    int perm_epoch;
    float *eval_params;     /* averaged parameters, when ranks hold different ones */
    FILE *log;
    char config[2048];      /* config_text of cfg */
    double t0, elapsed_before; /* wall clock; elapsed_before carries over a resume */
    sumo_comm_stats comm_before; /* communication counted before a resume */
    uint64_t peak_step_bytes;    /* the most bytes one step put on the wire (resumes keep it) */
    sumo__train_summary *summary;
    char *err;
    size_t errlen;
    void *shared_params, *shared_grads; /* from sumo_mem_alloc (share_buffers), or NULL */
    bool ended_together;                /* the training loop ended in step on every rank */
    int origin;                         /* this rank's number when the run started */
    /* What build() chose, kept to make the exchange again on a shrunk communicator. */
    bool needs_agg;
    sumo_aggregator_options aopt;
    sumo_distributed_options dopt;
} rank_state;

static sumo_result fail(rank_state *s, sumo_result r, const char *what)
{
    const char *detail = "";
    sumo_comm_error_message(s->comm, &detail);
    if (s->err && s->errlen && s->err[0] == '\0')
        snprintf(s->err, s->errlen, "rank %d: %s: %s%s%s", s->rank, what, sumo_strerror(r),
                 detail[0] ? ": " : "", detail);
    return r;
}

/* The parts that hold the communicator: the aggregator and the distributed optimizer. */
static sumo_result build_exchange(rank_state *s)
{
    const sumo__train_config *c = s->cfg;
    const size_t *layout;
    size_t ntensors;
    sumo__model_layout(s->model, &layout, &ntensors);
    sumo_aggregator_options aopt = s->aopt;
    sumo_distributed_options dopt = s->dopt;
    sumo_result r;
    if (s->needs_agg) {
        aopt.tensor_counts = layout;
        aopt.ntensors = ntensors;
        aopt.adasum_hierarchical = c->adasum_hierarchical;
        aopt.adasum_group_size = c->adasum_group_size;
        r = sumo_aggregator_create(s->comm, &aopt, &s->agg);
        if (r != SUMO_SUCCESS) return fail(s, r, "aggregator");
    }
    int *strided = NULL;
    if (c->diloco_strided) {
        strided = malloc(ntensors * sizeof *strided);
        if (strided == NULL) return SUMO_ERR_SYSTEM;
        for (size_t t = 0; t < ntensors; t++) strided[t] = (int)(t % (size_t)SUMO__MAX(c->outer.fragments, 1));
        dopt.outer.fragment_of = strided;
    }
    r = sumo_distributed_create(s->comm, s->opt, s->agg, s->nparams, &dopt, &s->dist);
    free(strided);
    if (r != SUMO_SUCCESS)
        return fail(s, r, sumo__method_is_diloco(c->method)
                              ? "DiLoCo outer loop (check --sync-every/--fragments/--delay)"
                              : "distributed optimizer (check --tau/--inner-period)");
    return SUMO_SUCCESS;
}

static sumo_result build(rank_state *s)
{
    const sumo__train_config *c = s->cfg;
    sumo_result r = sumo__model_create(c->model, c->hidden, (size_t)c->batch, c->seed, &s->model);
    if (r != SUMO_SUCCESS) return fail(s, r, "model");
    s->nparams = sumo__model_num_params(s->model);
    const size_t *layout;
    size_t ntensors;
    sumo__model_layout(s->model, &layout, &ntensors);
    r = sumo_optimizer_create(&c->optim, layout, ntensors, &s->opt);
    if (r != SUMO_SUCCESS) return fail(s, r, "optimizer options");

    sumo_distributed_options dopt = {.struct_size = sizeof dopt, .mode = SUMO_UPDATE_GRADIENT,
                                     .outer = c->outer, .buffers = c->buffers};
    sumo_aggregator_options aopt = {0};
    bool needs_agg = true;
    switch (c->method) {
    case SUMO__METHOD_SUM: sumo_aggregator_options_default(SUMO_AGGREGATE_SUM, &aopt); break;
    case SUMO__METHOD_AVG: sumo_aggregator_options_default(SUMO_AGGREGATE_AVERAGE, &aopt); break;
    case SUMO__METHOD_ADASUM_DELTA: dopt.mode = SUMO_UPDATE_DELTA; /* fall through */
    case SUMO__METHOD_ADASUM: sumo_aggregator_options_default(SUMO_AGGREGATE_ADASUM, &aopt); break;
    case SUMO__METHOD_ACGA:
        sumo_aggregator_options_default(SUMO_AGGREGATE_ACGA, &aopt);
        aopt.acga = c->acga;
        break;
    default:
        dopt.mode = SUMO_UPDATE_OUTER;
        needs_agg = false;
        break;
    }
    s->needs_agg = needs_agg;
    s->aopt = aopt;
    s->dopt = dopt;
    size_t usable = c->train_limit && c->train_limit < s->train->n ? c->train_limit : s->train->n;
    s->usable = usable;
    s->steps_per_epoch = (long)(usable / ((size_t)s->size * (size_t)c->batch));
    if (s->steps_per_epoch < 1) {
        snprintf(s->err, s->errlen, "%zu training items (--train-limit) cannot fill one step of %d workers "
                 "(--workers) x %d (--batch)", usable, s->size, c->batch);
        return SUMO_ERR_INVALID_ARGUMENT;
    }
    s->total_steps = s->steps_per_epoch * c->epochs;
    sumo_lr_schedule_default(c->lr, &s->sched);
    s->sched.kind = c->schedule;
    s->sched.scale = c->lr_scale;
    s->sched.warmup_steps = (uint64_t)llround(c->warmup_epochs * (double)s->steps_per_epoch);
    s->sched.warmup_start_factor = 1.0;
    if (c->schedule == SUMO_LR_STEP) {
        s->sched.gamma = 0.1;
        s->sched.step_size = (uint64_t)SUMO__MAX(s->total_steps / 2, 1);
        if (s->sched.step_size < s->sched.warmup_steps) s->sched.step_size = s->sched.warmup_steps;
    } else if (c->schedule == SUMO_LR_COSINE) {
        s->sched.total_steps = (uint64_t)s->total_steps;
    }
    const char *why = "";
    if (sumo_lr_schedule_check(&s->sched, &why) != SUMO_SUCCESS) {
        snprintf(s->err, s->errlen, "learning-rate schedule: %s", why);
        return SUMO_ERR_INVALID_ARGUMENT;
    }
    s->pixels = (size_t)s->train->rows * (size_t)s->train->cols;
    s->xbatch = malloc((size_t)c->batch * s->pixels * sizeof *s->xbatch);
    s->ybatch = malloc((size_t)c->batch);
    s->perm = malloc(s->train->n * sizeof *s->perm);
    s->eval_params = malloc(s->nparams * sizeof *s->eval_params);
    if (!s->xbatch || !s->ybatch || !s->perm || !s->eval_params) return SUMO_ERR_SYSTEM;
    s->perm_epoch = -1;
    /* Last: the exchange is the only part that meets the other ranks (an elastic run that
     * loses one here makes it again, on the survivors). */
    return build_exchange(s);
}

/*
 * Over MPI, the parameters and gradients move into memory from sumo_mem_alloc, so that the
 * collectives of processes on one node read and write the peers' buffers directly instead of
 * copying through staging areas (the same arithmetic, in the same order: the same bits).
 * Collective: called once every rank agreed that its set-up worked. An allocation that fails
 * fails on every rank and training goes on in the model's own buffers.
 */
static void share_buffers(rank_state *s)
{
    const char *transport = "";
    sumo_comm_transport(s->comm, &transport);
    if (strcmp(transport, "mpi") != 0 || s->size < 2) return;
    size_t bytes = s->nparams * sizeof(float);
    void *params = NULL, *grads = NULL;
    if (sumo_mem_alloc(s->comm, bytes, &params) != SUMO_SUCCESS) return;
    if (sumo_mem_alloc(s->comm, bytes, &grads) != SUMO_SUCCESS) {
        sumo_mem_free(s->comm, params);
        return;
    }
    sumo__model_adopt_buffers(s->model, params, grads);
    s->shared_params = params;
    s->shared_grads = grads;
}

static int synchronized_now(const rank_state *s)
{
    int synced = 1;
    sumo_distributed_synchronized(s->dist, &synced);
    return synced;
}

static sumo_comm_stats comm_stats(const rank_state *s)
{
    sumo_comm_stats st = {0};
    sumo_distributed_stats(s->dist, &st);
    return st;
}

static void teardown(rank_state *s)
{
    sumo_distributed_destroy(s->dist);
    sumo_aggregator_destroy(s->agg);
    sumo_optimizer_destroy(s->opt);
    sumo__model_destroy(s->model);
    /* Freeing is collective: only where every rank surely ends together (the last step);
     * otherwise sumo_comm_destroy releases the memory. */
    if (s->shared_params && s->ended_together) {
        sumo_mem_free(s->comm, s->shared_grads);
        sumo_mem_free(s->comm, s->shared_params);
    }
    free(s->xbatch);
    free(s->ybatch);
    free(s->perm);
    free(s->eval_params);
    if (s->log) fclose(s->log);
    s->log = NULL;
}

/* Test loss and accuracy of the common model: each rank scores its share of the test set and
 * the sums are reduced in rank order, so every rank gets the same numbers. When the ranks hold
 * different parameters (inside a SlowMo outer iteration) the average model is scored. */
static sumo_result evaluate(rank_state *s, double *test_loss, double *accuracy, double *train_loss)
{
    int synced = synchronized_now(s);
    float *params = sumo__model_params(s->model);
    float *saved = NULL;
    sumo_result r;
    if (!synced) {
        memcpy(s->eval_params, params, s->nparams * sizeof *params);
        r = sumo_allreduce(s->eval_params, s->eval_params, s->nparams, SUMO_FLOAT32, SUMO_OP_AVERAGE, s->comm);
        if (r != SUMO_SUCCESS) return fail(s, r, "evaluation average");
        /* Score the average by swapping it in; the local parameters come back after. */
        saved = malloc(s->nparams * sizeof *saved);
        if (saved == NULL) return SUMO_ERR_SYSTEM;
        memcpy(saved, params, s->nparams * sizeof *params);
        memcpy(params, s->eval_params, s->nparams * sizeof *params);
    }
    size_t n = s->cfg->test_limit && s->cfg->test_limit < s->test->n ? s->cfg->test_limit : s->test->n;
    size_t lo = n * (size_t)s->rank / (size_t)s->size, hi = n * (size_t)(s->rank + 1) / (size_t)s->size;
    double loss = 0, acc = 0;
    if (hi > lo)
        sumo__model_evaluate(s->model, s->test->images + lo * s->pixels, s->test->labels + lo, hi - lo,
                             &loss, &acc);
    if (saved) {
        memcpy(params, saved, s->nparams * sizeof *params);
        free(saved);
    }
    double sums[4] = {loss * (double)(hi - lo), acc * (double)(hi - lo), s->loss_sum, (double)s->loss_count};
    r = sumo_allreduce(sums, sums, 4, SUMO_FLOAT64, SUMO_OP_SUM, s->comm);
    if (r != SUMO_SUCCESS) return fail(s, r, "evaluation sums");
    *test_loss = sums[0] / (double)n;
    *accuracy = sums[1] / (double)n;
    *train_loss = sums[3] > 0 ? sums[2] / sums[3] : NAN;
    s->loss_sum = 0;
    s->loss_count = 0;
    return SUMO_SUCCESS;
}

static sumo_comm_stats comm_so_far(const rank_state *s)
{
    sumo_comm_stats st = comm_stats(s);
    st.bytes += s->comm_before.bytes;
    st.rounds += s->comm_before.rounds;
    return st;
}

static void log_row(rank_state *s, double train_loss, double test_loss, double acc)
{
    if (s->rank != 0) return;
    sumo_comm_stats st = comm_so_far(s);
    double epoch = (double)s->step / (double)s->steps_per_epoch;
    double wall = s->elapsed_before + now_s() - s->t0;
    if (s->log) {
        fprintf(s->log, "%ld,%.4f,%ld,%.6f,%.6f,%.4f,%.3f,%llu,%llu\n", s->step, epoch,
                s->step * (long)s->size * s->cfg->batch, train_loss, test_loss, acc, wall,
                (unsigned long long)st.bytes, (unsigned long long)st.rounds);
        fflush(s->log);
    }
    sumo__train_summary *sum = s->summary;
    sum->final_accuracy = acc;
    sum->final_test_loss = test_loss;
    sum->final_train_loss = train_loss;
    if (acc > sum->best_accuracy) sum->best_accuracy = acc;
    if (sum->steps_to_target < 0 && s->cfg->target_accuracy > 0 && acc >= s->cfg->target_accuracy) {
        sum->steps_to_target = s->step;
        sum->epochs_to_target = epoch;
    }
}

static void progress(rank_state *s, int epoch, double last_acc)
{
    const sumo__train_config *c = s->cfg;
    if (s->rank != 0 || !c->progress) return;
    const char *label = c->label ? c->label : sumo__method_name(c->method);
    double t = s->elapsed_before + now_s() - s->t0;
    if (c->progress_inline)
        fprintf(stderr, "\r%-12s epoch %d/%d step %ld/%ld  test acc %5.2f%%  %6.1fs ", label,
                epoch + 1, c->epochs, s->step, s->total_steps, 100 * last_acc, t);
    else if (s->step % s->steps_per_epoch == 0 || s->step == s->total_steps)
        /* Brackets keep these lines apart from the table's rows, which start with the label. */
        fprintf(stderr, "[%s] epoch %d/%d step %ld/%ld  test acc %5.2f%%  %.1fs\n", label, epoch + 1,
                c->epochs, s->step, s->total_steps, 100 * last_acc, t);
    fflush(stderr);
}

/* ---- checkpoints -------------------------------------------------------------------------- */

typedef struct train_counters {
    int64_t step;
    double loss_sum;
    int64_t loss_count;
    double elapsed;
    sumo_comm_stats comm;      /* communication before the checkpoint, carried over */
    uint64_t peak_step_bytes;
    double best_accuracy;
    int64_t steps_to_target;
    double epochs_to_target;
} train_counters;

typedef struct section {
    void *ptr;
    size_t bytes;
} section;

static void state_sections(rank_state *s, section sec[5])
{
    size_t opt_bytes, agg_bytes, dist_bytes;
    sumo_optimizer_state_size(s->opt, &opt_bytes);
    agg_bytes = 0;
    if (s->agg) sumo_aggregator_state_size(s->agg, &agg_bytes);
    sumo_distributed_state_size(s->dist, &dist_bytes);
    sec[0] = (section){sumo__model_params(s->model), s->nparams * sizeof(float)};
    sec[1] = (section){NULL, opt_bytes};
    sec[2] = (section){NULL, agg_bytes};
    sec[3] = (section){NULL, dist_bytes};
    sec[4] = (section){NULL, sizeof(train_counters)};
}

/* The rank's whole state as one blob (checkpoints and elastic commits): each section's length,
 * then its bytes. */
static sumo_result pack_state(rank_state *s, unsigned char **out, size_t *bytes)
{
    section sec[5];
    state_sections(s, sec);
    size_t total = 0;
    for (int i = 0; i < 5; i++) total += sec[i].bytes + sizeof(uint64_t);
    unsigned char *blob = malloc(total), *p = blob;
    if (blob == NULL) return SUMO_ERR_SYSTEM;
    train_counters tc = {.step = s->step, .loss_sum = s->loss_sum, .loss_count = s->loss_count,
                         .elapsed = s->elapsed_before + now_s() - s->t0,
                         .comm = comm_so_far(s),
                         .peak_step_bytes = s->peak_step_bytes,
                         .best_accuracy = s->summary->best_accuracy,
                         .steps_to_target = s->summary->steps_to_target,
                         .epochs_to_target = s->summary->epochs_to_target};
    sumo_result r = SUMO_SUCCESS;
    for (int i = 0; i < 5 && r == SUMO_SUCCESS; i++) {
        uint64_t len = sec[i].bytes;
        memcpy(p, &len, sizeof len);
        p += sizeof len;
        switch (i) {
        case 0: memcpy(p, sec[0].ptr, len); break;
        case 1: r = sumo_optimizer_state_save(s->opt, p, len); break;
        case 2: if (s->agg) r = sumo_aggregator_state_save(s->agg, p, len); break;
        case 3: r = sumo_distributed_state_save(s->dist, p, len); break;
        default: memcpy(p, &tc, sizeof tc); break;
        }
        p += len;
    }
    if (r != SUMO_SUCCESS) {
        free(blob);
        return r;
    }
    *out = blob;
    *bytes = total;
    return SUMO_SUCCESS;
}

/* Loads what pack_state made into the rank's parts; SUMO_ERR_INVALID_ARGUMENT when a section
 * does not fit them. The counters are left to the caller. An aggregator whose state is sized by
 * the rank count (ACGA's per-rank history) starts afresh after a change of membership (resized:
 * the state came from a group of another size) instead of failing. */
static sumo_result unpack_state_as(rank_state *s, const unsigned char *blob, size_t bytes,
                                   train_counters *tc, bool resized)
{
    section sec[5];
    state_sections(s, sec);
    const unsigned char *p = blob, *end = p + bytes;
    sumo_result r = SUMO_SUCCESS;
    for (int i = 0; i < 5 && r == SUMO_SUCCESS; i++) {
        uint64_t len;
        if ((size_t)(end - p) < sizeof len) return SUMO_ERR_INVALID_ARGUMENT;
        memcpy(&len, p, sizeof len);
        p += sizeof len;
        if ((size_t)(end - p) < len) return SUMO_ERR_INVALID_ARGUMENT;
        if (len != sec[i].bytes) {
            if (!(resized && i == 2)) return SUMO_ERR_INVALID_ARGUMENT;
            p += len;
            continue;
        }
        switch (i) {
        case 0: memcpy(sec[0].ptr, p, len); break;
        case 1: r = sumo_optimizer_state_load(s->opt, p, len); break;
        case 2: if (s->agg) r = sumo_aggregator_state_load(s->agg, p, len); break;
        case 3: r = sumo_distributed_state_load(s->dist, p, len); break;
        default: memcpy(tc, p, sizeof *tc); break;
        }
        p += len;
    }
    return r == SUMO_SUCCESS && p != end ? SUMO_ERR_INVALID_ARGUMENT : r;
}

static sumo_result unpack_state(rank_state *s, const unsigned char *blob, size_t bytes,
                                train_counters *tc)
{
    return unpack_state_as(s, blob, bytes, tc, false);
}

static void apply_counters(rank_state *s, const train_counters *tc)
{
    s->step = tc->step;
    s->loss_sum = tc->loss_sum;
    s->loss_count = tc->loss_count;
    s->elapsed_before = tc->elapsed;
    s->comm_before = tc->comm;
    s->peak_step_bytes = tc->peak_step_bytes;
    s->summary->best_accuracy = tc->best_accuracy;
    s->summary->steps_to_target = tc->steps_to_target;
    s->summary->epochs_to_target = tc->epochs_to_target;
}

static sumo_result save_checkpoint(rank_state *s)
{
    const sumo__train_config *c = s->cfg;
    unsigned char *blob = NULL;
    size_t total = 0;
    sumo_result r = pack_state(s, &blob, &total);
    sumo__ckpt_id id = {.dir = c->checkpoint_dir, .step = s->step, .rank = s->rank, .size = s->size,
                        .config_hash = config_hash(s->config), .config_text = s->config};
    if (r == SUMO_SUCCESS) r = sumo__checkpoint_write_rank(&id, blob, total, s->err, s->errlen);
    free(blob);
    /* Every rank's file is in place before the manifest names the step. */
    sumo_result b = sumo_barrier(s->comm);
    if (r != SUMO_SUCCESS) return r;
    if (b != SUMO_SUCCESS) return fail(s, b, "checkpoint barrier");
    if (s->rank == 0) r = sumo__checkpoint_write_manifest(&id, s->err, s->errlen);
    b = sumo_barrier(s->comm);
    if (r != SUMO_SUCCESS) return r;
    if (b != SUMO_SUCCESS) return fail(s, b, "checkpoint barrier");
    /* The manifest names this step on every rank's disk now: older ones may go. */
    sumo__checkpoint_prune(c->checkpoint_dir, s->rank, s->step, c->keep > 0 ? c->keep : 1);
    return SUMO_SUCCESS;
}

static sumo_result load_checkpoint(rank_state *s)
{
    const sumo__train_config *c = s->cfg;
    sumo__ckpt_id id = {.dir = c->checkpoint_dir, .rank = s->rank, .size = s->size,
                        .config_hash = config_hash(s->config), .config_text = s->config};
    sumo_result r = sumo__checkpoint_read_manifest(&id, &id.step, s->err, s->errlen);
    if (r != SUMO_SUCCESS) return r;
    void *blob = NULL;
    size_t bytes = 0;
    r = sumo__checkpoint_read_rank(&id, &blob, &bytes, s->err, s->errlen);
    if (r != SUMO_SUCCESS) return r;
    train_counters tc;
    r = unpack_state(s, blob, bytes, &tc);
    free(blob);
    if (r != SUMO_SUCCESS) {
        snprintf(s->err, s->errlen, "%s: step %ld, rank %d: state does not fit this model/optimizer",
                 c->checkpoint_dir, id.step, s->rank);
        return SUMO_ERR_INVALID_ARGUMENT;
    }
    apply_counters(s, &tc);
    s->epoch = (int)(s->step / s->steps_per_epoch);
    s->pos = (size_t)(s->step % s->steps_per_epoch) * (size_t)s->size * (size_t)c->batch;
    return SUMO_SUCCESS;
}

/* Rows logged after the checkpoint being resumed from describe steps that will be taken
 * again: drop them, so the resumed log reads as if the run had never stopped. */
static void truncate_log(const char *path, long step)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) return;
    size_t cap = 1 << 16, len = 0;
    char *kept = malloc(cap), line[1024];
    while (kept && fgets(line, sizeof line, f)) {
        long row_step;
        bool header = sscanf(line, "%ld,", &row_step) != 1;
        if (!header && row_step > step) break;
        size_t n = strlen(line);
        if (len + n + 1 > cap) {
            char *grown = realloc(kept, cap *= 2);
            if (grown == NULL) break;
            kept = grown;
        }
        memcpy(kept + len, line, n);
        len += n;
    }
    fclose(f);
    char err[256];
    if (kept) sumo__write_file_atomic(path, kept, len, err, sizeof err);
    free(kept);
}

static sumo_result open_log(rank_state *s)
{
    const char *path = s->cfg->log_path;
    if (s->cfg->resume) truncate_log(path, s->step);
    /* An empty file (new, or made by the caller's check) gets the header even on a resume. */
    struct stat st;
    bool append = s->cfg->resume && stat(path, &st) == 0 && st.st_size > 0;
    s->log = fopen(path, append ? "a" : "w");
    if (s->log == NULL) {
        snprintf(s->err, s->errlen, "%s: cannot open the log: %s", path, strerror(errno));
        return SUMO_ERR_SYSTEM;
    }
    if (!append) fprintf(s->log, "step,epoch,samples,train_loss,test_loss,test_accuracy,wall_s,bytes,rounds\n");
    if (fflush(s->log) != 0) {
        snprintf(s->err, s->errlen, "%s: cannot write the log: %s", path, strerror(errno));
        return SUMO_ERR_SYSTEM;
    }
    return SUMO_SUCCESS;
}

/* ---- elastic runs -------------------------------------------------------------------------- */

/* The state after the last two completed steps: a peer lost in the middle of a step leaves
 * some survivors one step further than others, and the survivors go back to the newest step
 * they all hold. */
typedef struct commits {
    unsigned char *blob[2];
    size_t bytes[2];
    long step[2];
    int epoch[2];
    size_t pos[2];
    int latest;
    int shrinks;  /* counted alike by every survivor: names each regrouping in the store */
    int grows;    /* joins taken in so far (a joiner counts those before its own) */
    int *origins; /* origins[r]: the rank that rank r was when the run started */
    int norigins;
} commits;

static sumo_result commit(rank_state *s, commits *ec)
{
    int slot = 1 - ec->latest;
    free(ec->blob[slot]);
    ec->blob[slot] = NULL;
    sumo_result r = pack_state(s, &ec->blob[slot], &ec->bytes[slot]);
    if (r != SUMO_SUCCESS) return fail(s, r, "keeping the step's state");
    ec->step[slot] = s->step;
    ec->epoch[slot] = s->epoch;
    ec->pos[slot] = s->pos;
    ec->latest = slot;
    return SUMO_SUCCESS;
}

static void commits_free(commits *ec)
{
    free(ec->blob[0]);
    free(ec->blob[1]);
    free(ec->origins);
}

/* A failure the survivors can get past: a peer that is gone or never came. */
static bool recoverable(const rank_state *s, sumo_result r)
{
    return s->cfg->elastic && (r == SUMO_ERR_PEER_FAILURE || r == SUMO_ERR_TIMEOUT);
}

/* The log's rows after the step the survivors went back to will be written again. */
static sumo_result reopen_log(rank_state *s)
{
    if (s->log) fclose(s->log);
    s->log = NULL;
    truncate_log(s->cfg->log_path, s->step);
    s->log = fopen(s->cfg->log_path, "a");
    if (s->log == NULL) {
        snprintf(s->err, s->errlen, "%s: cannot open the log: %s", s->cfg->log_path, strerror(errno));
        return SUMO_ERR_SYSTEM;
    }
    return SUMO_SUCCESS;
}

/* Moves the rank to fresh, a communicator of a new membership: the exchange holds the old
 * handle, so it goes first, and is made again on fresh. */
static sumo_result move_to(rank_state *s, sumo_comm **comm, sumo_comm *fresh)
{
    sumo_distributed_destroy(s->dist);
    sumo_aggregator_destroy(s->agg);
    s->dist = NULL;
    s->agg = NULL;
    sumo_comm_destroy(*comm);
    *comm = s->comm = fresh;
    sumo_comm_rank(fresh, &s->rank);
    sumo_comm_size(fresh, &s->size);
    return build_exchange(s);
}

/* The survivors of a loss shrink the communicator (value: this rank's part of the agreement,
 * the smallest comes back in *agreed) and move to it; lost names the workers gone. */
static sumo_result regroup(rank_state *s, commits *ec, sumo_comm **comm, uint64_t value, const char *when,
                           uint64_t *agreed, char *lost, size_t lostlen)
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
    sumo_result r = sumo_comm_shrink(*comm, &o, &fresh, &info);
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
    return move_to(s, comm, fresh);
}

/* After a lost peer: the survivors regroup and go back to the newest state they all hold. */
static sumo_result recover(rank_state *s, commits *ec, sumo_comm **comm, sumo_result cause)
{
    double t0 = now_s();
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
    train_counters tc;
    r = unpack_state_as(s, ec->blob[slot], ec->bytes[slot], &tc, true);
    if (r != SUMO_SUCCESS) {
        snprintf(s->err, s->errlen, "rank %d: the state of step %ld does not fit the exchange of %d ranks",
                 s->rank, back, s->size);
        return r;
    }
    apply_counters(s, &tc);
    s->epoch = ec->epoch[slot];
    s->pos = ec->pos[slot];
    ec->latest = slot;
    s->err[0] = '\0'; /* what the failed step said is over */
    if (s->rank == 0) {
        fprintf(stderr, "sumo train: lost worker(s) %s (%s); going on with %d from step %ld (regrouped in %.1f ms)\n",
                lost, sumo_result_name(cause), s->size, s->step, 1e3 * (now_s() - t0));
        if (s->cfg->log_path) return reopen_log(s);
    }
    return SUMO_SUCCESS;
}

/* The staged loss of this rank at this step, if any: leaves or dies. Returns whether it did. */
static bool staged_loss(rank_state *s, sumo_comm **comm)
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
        sumo_comm_destroy(*comm);
        *comm = s->comm = NULL;
        s->summary->lost = true;
        return true;
    }
    return false;
}

/* ---- joining (threads) ---------------------------------------------------------------------- */

/* Where threads joining an elastic run meet its workers. At a step where workers join, rank 0
 * makes a threads group of the workers and the joiners, and each takes its handle here: the
 * members by their rank, the joiners after them. */
struct sumo__train_room {
    pthread_mutex_t lock;
    pthread_cond_t changed;
    int generation;       /* groups made so far */
    sumo_comm **handles;  /* the newest group's, until every one is taken */
    int nhandles, taken;
    bool closed;          /* the run ended: joiners still waiting go home */
};

/* Takes handle `index` of group `generation` (waiting for it, up to the deadline), or makes that
 * group of `size` first (make: rank 0 of the members). */
static sumo_result room_take(struct sumo__train_room *room, int generation, bool make, int size,
                             int index, int joiners, sumo_comm **out)
{
    sumo_result r = SUMO_SUCCESS;
    double timeout = 300;
    const char *t = getenv("SUMO_TIMEOUT");
    if (t && atof(t) > 0) timeout = atof(t);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += (time_t)timeout + 1;
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

/* The joiners of this step and, for a joiner, its place among them and its group's number. */
typedef struct join_plan {
    int joiners;    /* joining at this step */
    int generation; /* the group they join: one per step that has joiners */
    int place;      /* a joiner's 0-based place among this step's joiners */
    int origin;     /* a joiner's worker number: cfg->workers + its order among all joins */
} join_plan;

static join_plan plan_join(const sumo__train_config *c, long step, int join_index)
{
    join_plan p = {0};
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

/* Rank 0's newest commit, and its counters, to every rank of the grown group; the joiners
 * (joining: this rank is one) load it, the members keep their own (the same state for the
 * methods that synchronise every step; an outer method's joiner starts from rank 0's). */
static sumo_result share_state(rank_state *s, commits *ec, bool joining)
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
    if (r != SUMO_SUCCESS) return fail(s, r, "joining: the state's size");
    size_t words = (size_t)(head.h.bytes + 7) / 8;
    double *blob = calloc(words ? words : 1, 8);
    int64_t *origins = calloc((size_t)s->size, sizeof *origins);
    if (blob == NULL || origins == NULL) r = SUMO_ERR_SYSTEM;
    if (r == SUMO_SUCCESS && s->rank == 0) {
        memcpy(blob, ec->blob[ec->latest], head.h.bytes);
        int k = 0;
        for (; k < ec->norigins; k++) origins[k] = ec->origins[k];
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
        train_counters tc;
        r = unpack_state_as(s, (unsigned char *)blob, head.h.bytes, &tc, true);
        if (r != SUMO_SUCCESS) {
            snprintf(s->err, s->errlen, "rank %d: joining: worker 0's state does not fit this worker", s->rank);
        } else {
            apply_counters(s, &tc);
            s->epoch = (int)head.h.epoch;
            s->pos = head.h.pos;
            s->steps_per_epoch = head.h.steps_per_epoch;
            s->total_steps = head.h.total_steps;
            s->sched = head.h.sched;
            r = commit(s, ec);
        }
    }
    free(blob);
    free(origins);
    return r == SUMO_ERR_SYSTEM ? fail(s, r, "joining: memory") : r;
}

/* At a step where workers join: the members move to a group with the joiners, make the
 * exchange again on it and hand the joiners the state. */
static sumo_result take_joiners(rank_state *s, commits *ec, sumo_comm **comm)
{
    join_plan p = plan_join(s->cfg, s->step, -1);
    if (p.joiners == 0 || s->cfg->room == NULL) return SUMO_SUCCESS;
    sumo_comm *fresh = NULL;
    sumo_result r = room_take(s->cfg->room, p.generation, s->rank == 0, s->size + p.joiners, s->rank,
                              p.joiners, &fresh);
    if (r != SUMO_SUCCESS) {
        snprintf(s->err, s->errlen, "rank %d: workers joining at step %ld: no group (%s)", s->rank, s->step,
                 sumo_result_name(r));
        return r;
    }
    ec->grows = p.generation;
    s->comm_before = comm_so_far(s); /* the exchange's counts go with it */
    int was = s->size;
    r = move_to(s, comm, fresh);
    /* The new exchange starts empty: each member loads its own state back into it (the step
     * just committed is where it stands). */
    train_counters tc;
    if (r == SUMO_SUCCESS && unpack_state_as(s, ec->blob[ec->latest], ec->bytes[ec->latest], &tc, true) != SUMO_SUCCESS) {
        snprintf(s->err, s->errlen, "rank %d: workers joining at step %ld: this rank's state does not fit the "
                 "exchange of %d ranks", s->rank, s->step, s->size);
        r = SUMO_ERR_INVALID_ARGUMENT;
    }
    if (r == SUMO_SUCCESS) r = share_state(s, ec, false);
    if (r == SUMO_SUCCESS && s->rank == 0)
        fprintf(stderr, "sumo train: %d worker(s) joined at step %ld; going on with %d\n", s->size - was,
                s->step, s->size);
    return r;
}

/* A worker lost during set-up (no step taken, nothing to go back to): the survivors shrink and
 * make the exchange again. */
static sumo_result regroup_setup(rank_state *s, commits *ec, sumo_comm **comm)
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

/* ---- the loop ----------------------------------------------------------------------------- */

static void gather_batch(rank_state *s)
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
static bool advance_data(rank_state *s)
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
static sumo_result verify_ranks(rank_state *s, const float *params)
{
    if (!synchronized_now(s)) return SUMO_SUCCESS;
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
    if (commp == NULL || (*commp == NULL) != (join >= 0) || cfg == NULL || train == NULL || test == NULL ||
        summary == NULL || (join >= 0 && cfg->room == NULL))
        return SUMO_ERR_INVALID_ARGUMENT;
    if (err && errlen) err[0] = '\0';
    sumo__train_summary local = {.steps_to_target = -1};
    *summary = local;
    join_plan plan = {0};
    if (join >= 0) {
        /* A joiner waits for its group; one whose step never comes goes home. */
        plan = plan_join(cfg, 0, join);
        sumo_result jr = room_take(cfg->room, plan.generation, false, 0, -(plan.place + 1), plan.joiners, commp);
        if (jr == SUMO_ERR_INVALID_USAGE) {
            summary->lost = true;
            return SUMO_SUCCESS;
        }
        if (jr != SUMO_SUCCESS) {
            snprintf(err, errlen, "worker %d, joining: no group to join (%s)", plan.origin, sumo_result_name(jr));
            return jr;
        }
    }
    sumo_comm *comm = *commp;
    rank_state s = {.comm = comm, .cfg = cfg, .train = train, .test = test, .summary = summary,
                    .err = err, .errlen = errlen};
    sumo_comm_rank(comm, &s.rank);
    sumo_comm_size(comm, &s.size);
    s.origin = join >= 0 ? plan.origin : s.rank;
    if (join < 0 && cfg->workers != s.size) {
        snprintf(err, errlen, "--workers %d but the communicator has %d ranks", cfg->workers, s.size);
        return SUMO_ERR_INVALID_ARGUMENT;
    }
    sumo__train_config_text(cfg, s.config, sizeof s.config);
    sumo_result r = build(&s);
    if (r == SUMO_SUCCESS && cfg->resume) r = load_checkpoint(&s);
    /* The log is opened during set-up, so that one that cannot be written stops every rank
     * before training rather than losing the run's record. */
    if (r == SUMO_SUCCESS && s.rank == 0 && cfg->log_path) r = open_log(&s);
    /* Every rank must agree that the set-up worked, with the same configuration, before the
     * first collective of a step; the communicator's message names the first rank that did
     * not. A joiner comes after that, into a group whose members agreed already. */
    sumo_result ar = join >= 0 ? r
                               : sumo__agree_setup(comm, r, sumo__fnv1a(SUMO__FNV_OFFSET, s.config, strlen(s.config)),
                                                   "sumo train set-up (configuration)");
    commits ec = {.latest = 1, .step = {-1, -1}};
    if (cfg->elastic) {
        ec.origins = malloc((size_t)s.size * sizeof *ec.origins);
        for (int k = 0; ec.origins && k < s.size; k++) ec.origins[k] = k;
        ec.norigins = s.size;
        if (ec.origins == NULL && r == SUMO_SUCCESS) r = SUMO_ERR_SYSTEM;
    }
    /* A worker lost during set-up: the survivors regroup and set the exchange up again. */
    while (cfg->elastic && join < 0 && s.model && s.opt && s.eval_params && ec.origins &&
           (r == SUMO_SUCCESS || recoverable(&s, r)) && recoverable(&s, ar)) {
        r = regroup_setup(&s, &ec, commp);
        comm = *commp;
        if (r == SUMO_SUCCESS && s.rank == 0 && cfg->log_path && s.log == NULL) r = open_log(&s);
        if (r != SUMO_SUCCESS && !recoverable(&s, r)) break;
        ar = sumo__agree_setup(comm, r, sumo__fnv1a(SUMO__FNV_OFFSET, s.config, strlen(s.config)),
                               "sumo train set-up (configuration)");
    }
    if (r == SUMO_SUCCESS && ar != SUMO_SUCCESS) {
        fail(&s, ar, "set-up");
        /* Another rank's failure is that rank's to report; this one only followed it. */
        r = ar == SUMO_ERR_MISMATCH ? ar : SUMO_ERR_PEER_FAILURE;
    }
    if (r != SUMO_SUCCESS) {
        commits_free(&ec);
        teardown(&s);
        return r;
    }
    share_buffers(&s);
    s.t0 = now_s();
    double acc = 0;
    float *params = sumo__model_params(s.model);
    float *grads = sumo__model_grads(s.model);
    double compute = 0, aggregate = 0;
    if (cfg->elastic) {
        if (join >= 0) ec.grows = plan.generation;
        if (r == SUMO_SUCCESS) r = join >= 0 ? share_state(&s, &ec, true) : commit(&s, &ec);
    }
    /* An elastic run's step count follows its size: it ends with the epochs. */
    while (r == SUMO_SUCCESS && (cfg->elastic ? s.epoch < cfg->epochs : s.step < s.total_steps)) {
        if (cfg->room && plan_join(cfg, s.step, -1).generation > ec.grows &&
            plan_join(cfg, s.step, -1).joiners > 0) {
            r = take_joiners(&s, &ec, commp);
            comm = *commp;
            if (r != SUMO_SUCCESS) break;
        }
        if (cfg->nevents && staged_loss(&s, commp)) break;
        gather_batch(&s);
        double loss = 0, t1 = now_s();
        sumo__model_forward_backward(s.model, s.xbatch, s.ybatch, (size_t)cfg->batch, &loss);
        double lr = 0, t2 = now_s();
        sumo_lr_at(&s.sched, (uint64_t)s.step, &lr);
        uint64_t sent = comm_stats(&s).bytes;
        r = sumo_distributed_step(s.dist, params, grads, lr, NULL);
        double t3 = now_s();
        /* The stats count an exchange when it starts, so this step's share is the payload it
         * started. */
        sent = comm_stats(&s).bytes - sent;
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
        if (r == SUMO_SUCCESS && eval) r = evaluate(&s, &test_loss, &acc, &train_loss);
        if (r != SUMO_SUCCESS) {
            if (recoverable(&s, r)) {
                r = recover(&s, &ec, commp, r);
                comm = *commp;
                continue;
            }
            fail(&s, r, "step");
            break;
        }
        if (eval) {
            log_row(&s, train_loss, test_loss, acc);
            if (!isfinite(train_loss) || !isfinite(test_loss)) {
                summary->diverged = true;
                break;
            }
        }
        progress(&s, (int)((s.step - 1) / s.steps_per_epoch), acc);
        bool stop = cfg->stop_after > 0 && s.step >= cfg->stop_after;
        if (cfg->checkpoint_dir && ((cfg->checkpoint_every > 0 && s.step % cfg->checkpoint_every == 0) ||
                                    s.step == s.total_steps || stop))
            r = save_checkpoint(&s);
        if (stop) break;
        if (cfg->elastic && r == SUMO_SUCCESS) r = commit(&s, &ec);
    }
    commits_free(&ec);
    if (summary->lost) {
        teardown(&s);
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
    summary->wall_seconds = s.elapsed_before + now_s() - s.t0;
    summary->compute_seconds = compute;
    summary->aggregation_seconds = aggregate;
    summary->nparams = s.nparams;
    summary->comm = comm_so_far(&s);
    summary->peak_bytes_in_flight = s.peak_step_bytes;
    sumo_distributed_extra_memory(s.dist, &summary->extra_memory_bytes);
    summary->param_checksum = checksum(params, s.nparams);
    teardown(&s);
    return r;
}

/* ---- the threads launcher ------------------------------------------------------------------ */

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
    int join; /* -1: a worker from the start; else which joiner */
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

/* n workers from the start and `joiners` threads that wait in the room for their step. */
static sumo_result run_elastic_threads(int n, int joiners, thread_job *jobs, sumo_result *results)
{
    int all = n + joiners;
    struct sumo__train_room room = {0};
    sumo__train_config cfg = *jobs[0].cfg;
    cfg.room = &room;
    sumo_comm **comms = calloc((size_t)n, sizeof *comms);
    elastic_thread *ts = calloc((size_t)all, sizeof *ts);
    pthread_t *ids = calloc((size_t)all, sizeof *ids);
    sumo_result r = comms && ts && ids ? sumo_comm_create_threads(n, comms) : SUMO_ERR_SYSTEM;
    pthread_mutex_init(&room.lock, NULL);
    pthread_cond_init(&room.changed, NULL);
    int started = 0;
    for (int i = 0; r == SUMO_SUCCESS && i < all; i++) {
        jobs[i].cfg = &cfg;
        ts[i] = (elastic_thread){.job = &jobs[i], .comm = i < n ? comms[i] : NULL, .join = i < n ? -1 : i - n};
        if (pthread_create(&ids[i], NULL, elastic_main, &ts[i]) != 0) {
            /* The ranks not started leave at once; those running lose them as peers. */
            for (int k = i; k < n; k++) sumo_comm_destroy(comms[k]);
            r = SUMO_ERR_SYSTEM;
            break;
        }
        started++;
    }
    for (int i = 0; i < started; i++) {
        if (i == n) {
            /* The workers are done: joiners still waiting have no step left to join at. */
            pthread_mutex_lock(&room.lock);
            room.closed = true;
            pthread_cond_broadcast(&room.changed);
            pthread_mutex_unlock(&room.lock);
        }
        pthread_join(ids[i], NULL);
        results[i] = ts[i].result;
    }
    pthread_cond_destroy(&room.changed);
    pthread_mutex_destroy(&room.lock);
    free(room.handles);
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
    sumo_result r = cfg->elastic ? run_elastic_threads(n, joiners, jobs, results)
                                 : sumo_threads_run(n, train_thread, jobs, results);
    int missing = 0, first_missing = -1;
    for (int i = 0; i < all; i++)
        if (!jobs[i].ran) {
            if (first_missing < 0) first_missing = i;
            missing++;
        }
    if (missing == n) {
        snprintf(err, errlen, "cannot set up %d workers (--workers): %s", n, sumo_strerror(r));
    } else if (missing > 0) {
        snprintf(err, errlen, "%d of %d worker threads could not be started (the first: rank %d); "
                 "lower --workers or raise the memory or thread limit", missing, n, first_missing);
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
