#include "train/evaluation.h"
#include "train/checkpoint.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

sumo_result sumo__rank_evaluate(sumo__rank_state *s, double *test_loss, double *accuracy, double *train_loss)
{
    int synced = sumo__rank_synchronized(s);
    float *params = sumo__model_params(s->model);
    float *saved = NULL;
    sumo_result r;
    if (!synced) {
        memcpy(s->eval_params, params, s->nparams * sizeof *params);
        r = sumo_allreduce(s->eval_params, s->eval_params, s->nparams, SUMO_FLOAT32, SUMO_OP_AVERAGE, s->comm);
        if (r != SUMO_SUCCESS) return sumo__rank_fail(s, r, "evaluation average");
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
    if (r != SUMO_SUCCESS) return sumo__rank_fail(s, r, "evaluation sums");
    *test_loss = sums[0] / (double)n;
    *accuracy = sums[1] / (double)n;
    *train_loss = sums[3] > 0 ? sums[2] / sums[3] : NAN;
    s->loss_sum = 0;
    s->loss_count = 0;
    return SUMO_SUCCESS;
}

void sumo__rank_log_row(sumo__rank_state *s, double train_loss, double test_loss, double acc)
{
    if (s->rank != 0) return;
    sumo_comm_stats st = sumo__rank_stats_so_far(s);
    double epoch = (double)s->step / (double)s->steps_per_epoch;
    double wall = s->elapsed_before + sumo__seconds_now() - s->t0;
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

void sumo__rank_progress(sumo__rank_state *s, int epoch, double last_acc)
{
    const sumo__train_config *c = s->cfg;
    if (s->rank != 0 || !c->progress) return;
    const char *label = c->label ? c->label : sumo__method_name(c->method);
    double t = s->elapsed_before + sumo__seconds_now() - s->t0;
    if (c->progress_inline)
        fprintf(stderr, "\r%-12s epoch %d/%d step %ld/%ld  test acc %5.2f%%  %6.1fs ", label,
                epoch + 1, c->epochs, s->step, s->total_steps, 100 * last_acc, t);
    else if (s->step % s->steps_per_epoch == 0 || s->step == s->total_steps)
        /* Brackets keep these lines apart from the table's rows, which start with the label. */
        fprintf(stderr, "[%s] epoch %d/%d step %ld/%ld  test acc %5.2f%%  %.1fs\n", label, epoch + 1,
                c->epochs, s->step, s->total_steps, 100 * last_acc, t);
    fflush(stderr);
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

sumo_result sumo__rank_open_log(sumo__rank_state *s)
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

sumo_result sumo__rank_reopen_log(sumo__rank_state *s)
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
