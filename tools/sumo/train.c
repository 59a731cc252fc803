/*
 * `sumo train`: data-parallel training on Fashion-MNIST with any aggregation method, on the
 * threads transport (default) or under mpirun. A comma-separated --reduce runs each method
 * in turn with otherwise identical settings and prints a comparison table.
 */
#include "commands.h"

#include "train/trainer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef SUMO_HAVE_MPI
#include "sumo_mpi.h"
#endif

void openblas_set_num_threads(int num_threads);

static void usage(FILE *out)
{
    fprintf(out,
        "usage: sumo train [options]\n"
        "  --workers N            data-parallel ranks (threads; under mpirun: the processes) [1]\n"
        "  --transport T          threads | mpi (default: mpi under mpirun, else threads)\n"
        "  --model M              mlp | cnn [mlp]\n"
        "  --hidden H             MLP hidden width / CNN dense width [model default]\n"
        "  --batch B              per-worker batch [64]\n"
        "  --epochs E             [1]\n"
        "  --seed S               [1]\n"
        "  --reduce LIST          sum, avg, adasum, adasum-delta, acga, slowmo, localsgd, bmuf;\n"
        "                         several, comma-separated, are compared [avg]; METHOD@S gives\n"
        "                         that entry its own --lr-scaling S (e.g. avg@linear,adasum@2.5)\n"
        "  --optimizer O          sgd | adam | adamw | lamb [sgd]\n"
        "  --lr X                 single-worker learning rate [0.05]\n"
        "  --lr-scaling S         none | linear (x workers) | a factor such as 2.5 [none]\n"
        "  --warmup-epochs W      linear warm-up from lr to the scaled lr [0]\n"
        "  --schedule K           constant | step (x0.1 at half) | cosine [constant]\n"
        "  --momentum M --nesterov --dampening D --weight-decay W --beta1 B --beta2 B --eps E\n"
        "  ACGA:    --acga-beta B --acga-per-tensor --acga-reference-permutation\n"
        "           --acga-no-guard --acga-rescale --acga-eps E\n"
        "  SlowMo:  --tau T --alpha A --slow-beta B --inner-period K --buffers keep|reset|average\n"
        "           --memory-efficient   (localsgd: beta 0; bmuf and slowmo: beta 0.5; tau 12)\n"
        "  Adasum:  --adasum-hierarchical --adasum-group-size G\n"
        "  --eval-every K         evaluate every K steps [0: every epoch]\n"
        "  --target A             report steps to this test accuracy (0..1) [0.85]\n"
        "  --data DIR             IDX files [/usr/share/datasets/fashion-mnist]\n"
        "  --train-limit N --test-limit N   use only the first N items\n"
        "  --log FILE             CSV log (one per method: FILE gets .METHOD before .csv)\n"
        "  --summary FILE         append one CSV row per method with the end-of-run figures\n"
        "  --checkpoint-dir D --checkpoint-every K --resume --stop-after K\n"
        "  --no-progress --verify-ranks (check all ranks agree after every step)\n");
}

typedef struct options {
    sumo__train_config cfg;
    char methods[256];
    const char *transport;
    const char *data_dir;
    const char *log_path;
    const char *summary_path;
    const char *lr_scaling;
    double momentum, tau_override, alpha_override, slow_beta_override, inner_override;
    int buffers_override, memory_efficient;
    int have_momentum;
} options;

static int bad(const char *flag, const char *value)
{
    fprintf(stderr, "sumo train: bad value '%s' for %s (see sumo train --help)\n", value ? value : "", flag);
    return 2;
}

static int parse_double(const char *s, double *out)
{
    char *end;
    *out = strtod(s, &end);
    return end != s && *end == '\0' && isfinite(*out);
}

static int parse_long(const char *s, long *out)
{
    char *end;
    *out = strtol(s, &end, 10);
    return end != s && *end == '\0';
}

static int parse(int argc, char **argv, options *o)
{
    sumo__train_config *c = &o->cfg;
    sumo__train_config_default(c);
    c->target_accuracy = 0.85;
    c->progress = isatty(2);
    snprintf(o->methods, sizeof o->methods, "avg");
    o->tau_override = o->alpha_override = o->slow_beta_override = o->inner_override = -1;
    o->buffers_override = -1;
    const char *optimizer = "sgd";
    double beta1 = -1, beta2 = -1, eps = -1, wd = -1, damp = -1;
    int nesterov = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        double d;
        long l;
#define FLAG(name) (strcmp(a, name) == 0)
#define NEED() do { if (v == NULL) return bad(a, v); i++; } while (0)
#define DBL(dst) do { NEED(); if (!parse_double(v, &d)) return bad(a, v); dst = d; } while (0)
#define LNG(dst, lo) do { NEED(); if (!parse_long(v, &l) || l < (lo)) return bad(a, v); dst = l; } while (0)
        if (FLAG("--help") || FLAG("-h")) { usage(stdout); return 1; }
        else if (FLAG("--workers")) LNG(c->workers, 1);
        else if (FLAG("--transport")) { NEED(); o->transport = v; }
        else if (FLAG("--model")) {
            NEED();
            if (strcmp(v, "mlp") == 0) c->model = SUMO__MODEL_MLP;
            else if (strcmp(v, "cnn") == 0) c->model = SUMO__MODEL_CNN;
            else return bad(a, v);
        }
        else if (FLAG("--hidden")) LNG(c->hidden, 0);
        else if (FLAG("--batch")) LNG(c->batch, 1);
        else if (FLAG("--epochs")) LNG(c->epochs, 1);
        else if (FLAG("--seed")) { NEED(); c->seed = strtoull(v, NULL, 10); }
        else if (FLAG("--reduce")) { NEED(); snprintf(o->methods, sizeof o->methods, "%s", v); }
        else if (FLAG("--optimizer")) { NEED(); optimizer = v; }
        else if (FLAG("--lr")) DBL(c->lr);
        else if (FLAG("--lr-scaling")) { NEED(); o->lr_scaling = v; }
        else if (FLAG("--warmup-epochs")) DBL(c->warmup_epochs);
        else if (FLAG("--schedule")) {
            NEED();
            if (strcmp(v, "constant") == 0) c->schedule = SUMO_LR_CONSTANT;
            else if (strcmp(v, "step") == 0) c->schedule = SUMO_LR_STEP;
            else if (strcmp(v, "cosine") == 0) c->schedule = SUMO_LR_COSINE;
            else return bad(a, v);
        }
        else if (FLAG("--momentum")) { DBL(o->momentum); o->have_momentum = 1; }
        else if (FLAG("--nesterov")) nesterov = 1;
        else if (FLAG("--dampening")) DBL(damp);
        else if (FLAG("--weight-decay")) DBL(wd);
        else if (FLAG("--beta1")) DBL(beta1);
        else if (FLAG("--beta2")) DBL(beta2);
        else if (FLAG("--eps")) DBL(eps);
        else if (FLAG("--acga-beta")) DBL(c->acga.beta);
        else if (FLAG("--acga-per-tensor")) c->acga.per_tensor = 1;
        else if (FLAG("--acga-reference-permutation")) c->acga.reference_permutation = 1;
        else if (FLAG("--acga-no-guard")) c->acga.negative_guard = 0;
        else if (FLAG("--acga-rescale")) c->acga.rescale = 1;
        else if (FLAG("--acga-eps")) DBL(c->acga.eps);
        else if (FLAG("--tau")) DBL(o->tau_override);
        else if (FLAG("--alpha")) DBL(o->alpha_override);
        else if (FLAG("--slow-beta")) DBL(o->slow_beta_override);
        else if (FLAG("--inner-period")) DBL(o->inner_override);
        else if (FLAG("--buffers")) {
            NEED();
            if (strcmp(v, "keep") == 0) o->buffers_override = SUMO_BUFFERS_KEEP;
            else if (strcmp(v, "reset") == 0) o->buffers_override = SUMO_BUFFERS_RESET;
            else if (strcmp(v, "average") == 0) o->buffers_override = SUMO_BUFFERS_AVERAGE;
            else return bad(a, v);
        }
        else if (FLAG("--memory-efficient")) o->memory_efficient = 1;
        else if (FLAG("--adasum-hierarchical")) c->adasum_hierarchical = 1;
        else if (FLAG("--adasum-group-size")) LNG(c->adasum_group_size, 0);
        else if (FLAG("--eval-every")) LNG(c->eval_every, 0);
        else if (FLAG("--target")) DBL(c->target_accuracy);
        else if (FLAG("--data")) { NEED(); o->data_dir = v; }
        else if (FLAG("--train-limit")) LNG(c->train_limit, 0);
        else if (FLAG("--test-limit")) LNG(c->test_limit, 0);
        else if (FLAG("--log")) { NEED(); o->log_path = v; }
        else if (FLAG("--summary")) { NEED(); o->summary_path = v; }
        else if (FLAG("--checkpoint-dir")) { NEED(); c->checkpoint_dir = v; }
        else if (FLAG("--checkpoint-every")) LNG(c->checkpoint_every, 0);
        else if (FLAG("--resume")) c->resume = true;
        else if (FLAG("--stop-after")) LNG(c->stop_after, 0);
        else if (FLAG("--no-progress")) c->progress = false;
        else if (FLAG("--verify-ranks")) c->verify_ranks = true;
        else {
            fprintf(stderr, "sumo train: unknown option '%s' (see sumo train --help)\n", a);
            return 2;
        }
#undef FLAG
#undef NEED
#undef DBL
#undef LNG
    }
    sumo_optimizer_kind kind;
    if (strcmp(optimizer, "sgd") == 0) kind = SUMO_OPTIM_SGD;
    else if (strcmp(optimizer, "adam") == 0) kind = SUMO_OPTIM_ADAM;
    else if (strcmp(optimizer, "adamw") == 0) kind = SUMO_OPTIM_ADAMW;
    else if (strcmp(optimizer, "lamb") == 0) kind = SUMO_OPTIM_LAMB;
    else return bad("--optimizer", optimizer);
    sumo_optimizer_options_default(kind, &c->optim);
    c->optim.check_finite = 0;
    if (kind == SUMO_OPTIM_SGD) c->optim.momentum = o->have_momentum ? o->momentum : 0.9;
    if (nesterov) c->optim.nesterov = 1;
    if (damp >= 0) c->optim.dampening = damp;
    if (wd >= 0) c->optim.weight_decay = wd;
    if (beta1 >= 0) c->optim.beta1 = beta1;
    if (beta2 >= 0) c->optim.beta2 = beta2;
    if (eps >= 0) c->optim.eps = eps;
    const char *why = NULL;
    if (sumo_optimizer_options_check(&c->optim, &why) != SUMO_SUCCESS) {
        fprintf(stderr, "sumo train: optimizer: %s\n", why ? why : "invalid options");
        return 2;
    }
    return 0;
}

/* Method-specific settings: SlowMo presets, then the user's overrides; the learning-rate
 * scaling rule. */
static int configure_method(options *o, sumo__method m, const char *scaling, sumo__train_config *c)
{
    *c = o->cfg;
    c->method = m;
    if (m == SUMO__METHOD_SLOWMO || m == SUMO__METHOD_LOCALSGD || m == SUMO__METHOD_BMUF) {
        sumo_slowmo_options_preset(m == SUMO__METHOD_LOCALSGD ? SUMO_SLOWMO_PRESET_LOCALSGD
                                   : m == SUMO__METHOD_BMUF   ? SUMO_SLOWMO_PRESET_BMUF
                                                              : SUMO_SLOWMO_PRESET_SLOWMO,
                                   &c->slowmo);
        if (o->tau_override >= 0) c->slowmo.tau = (int)o->tau_override;
        if (o->alpha_override >= 0) c->slowmo.alpha = o->alpha_override;
        if (o->slow_beta_override >= 0 && m != SUMO__METHOD_LOCALSGD) c->slowmo.beta = o->slow_beta_override;
        if (o->inner_override >= 0) c->slowmo.inner_period = (int)o->inner_override;
        if (o->buffers_override >= 0) c->slowmo.buffers = (sumo_buffer_policy)o->buffers_override;
        c->slowmo.memory_efficient = o->memory_efficient;
    }
    c->lr_scale = 1.0;
    if (scaling == NULL) scaling = o->lr_scaling;
    if (scaling && strcmp(scaling, "none") != 0) {
        double f;
        if (strcmp(scaling, "linear") == 0) c->lr_scale = c->workers;
        else if (parse_double(scaling, &f) && f > 0) c->lr_scale = f;
        else return bad("--lr-scaling", scaling);
    }
    return 0;
}

static void method_log_path(const char *base, const char *method, bool several, char *out, size_t len)
{
    if (!several) {
        snprintf(out, len, "%s", base);
        return;
    }
    const char *dot = strrchr(base, '.');
    if (dot && strcmp(dot, ".csv") == 0) snprintf(out, len, "%.*s.%s.csv", (int)(dot - base), base, method);
    else snprintf(out, len, "%s.%s", base, method);
}

static void write_summaries(const char *path, const char (*labels)[64],
                            const sumo__train_config *configs, const sumo__train_summary *sums, int n)
{
    bool fresh = access(path, F_OK) != 0;
    FILE *f = fopen(path, "a");
    if (f == NULL) {
        fprintf(stderr, "sumo train: %s: cannot open the summary file\n", path);
        return;
    }
    if (fresh)
        fprintf(f, "method,workers,batch,total_batch,optimizer,peak_lr,final_accuracy,best_accuracy,"
                   "steps_to_target,epochs_to_target,steps,rounds,bytes,diverged,wall_s,"
                   "aggregation_s,compute_s,extra_memory_bytes,params,fnv1a\n");
    for (int k = 0; k < n; k++) {
        const sumo__train_summary *s = &sums[k];
        const sumo__train_config *c = &configs[k];
        fprintf(f, "%s,%d,%d,%d,%s,%.6g,%.4f,%.4f,%ld,%.3f,%ld,%llu,%llu,%d,%.2f,%.3f,%.3f,%zu,%zu,%016llx\n",
                labels[k], c->workers, c->batch, c->workers * c->batch,
                sumo_optimizer_kind_name(c->optim.kind), c->lr * c->lr_scale, s->final_accuracy,
                s->best_accuracy, s->steps_to_target, s->steps_to_target >= 0 ? s->epochs_to_target : -1.0,
                s->steps, (unsigned long long)s->comm.rounds, (unsigned long long)s->comm.bytes,
                s->diverged, s->wall_seconds, s->aggregation_seconds, s->compute_seconds,
                s->extra_memory_bytes, s->nparams, (unsigned long long)s->param_checksum);
    }
    fclose(f);
}

int sumo_cmd_train(int argc, char **argv)
{
    options o = {0};
    int rc = parse(argc, argv, &o);
    if (rc == 1) return 0; /* --help */
    if (rc) return rc;
    openblas_set_num_threads(1); /* one BLAS thread per worker: the workers share the cores */
    int rank = 0;
    bool use_mpi = o.transport ? strcmp(o.transport, "mpi") == 0
                               : getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE");
    if (o.transport && !use_mpi && strcmp(o.transport, "threads") != 0) return bad("--transport", o.transport);
    sumo_comm *mpi_comm = NULL;
    if (use_mpi) {
#ifdef SUMO_HAVE_MPI
        MPI_Init(&argc, &argv);
        int size;
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        MPI_Comm_size(MPI_COMM_WORLD, &size);
        o.cfg.workers = size;
        if (sumo_comm_create_mpi(MPI_COMM_WORLD, &mpi_comm) != SUMO_SUCCESS) {
            fprintf(stderr, "sumo train: cannot create the MPI communicator\n");
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        if (rank != 0) o.cfg.progress = false;
#else
        fprintf(stderr, "sumo train: this build has no MPI (install libopenmpi-dev and rebuild)\n");
        return 2;
#endif
    }
    char err[1024] = "";
    sumo__dataset train = {0}, test = {0};
    sumo_result r = sumo__dataset_load(o.data_dir, true, &train, err, sizeof err);
    if (r == SUMO_SUCCESS) r = sumo__dataset_load(o.data_dir, false, &test, err, sizeof err);
    if (r != SUMO_SUCCESS) {
        fprintf(stderr, "sumo train: %s\n", err);
        rc = 1;
        goto out;
    }

    char list[256];
    snprintf(list, sizeof list, "%s", o.methods);
    int nmethods = 0;
    sumo__method methods[16];
    const char *scalings[16];
    char labels[16][64];
    for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (nmethods == 16) {
            rc = bad("--reduce", tok);
            goto out;
        }
        snprintf(labels[nmethods], sizeof labels[nmethods], "%s", tok);
        char *at = strchr(tok, '@');
        scalings[nmethods] = at ? at + 1 : NULL;
        if (at) *at = '\0';
        if (!sumo__method_parse(tok, &methods[nmethods])) {
            rc = bad("--reduce", tok);
            goto out;
        }
        nmethods++;
    }
    sumo__train_summary summaries[16];
    sumo__train_config configs[16];
    for (int k = 0; k < nmethods; k++) {
        sumo__train_config *c = &configs[k];
        if ((rc = configure_method(&o, methods[k], scalings[k], c)) != 0) goto out;
        char log_path[1024];
        if (o.log_path) {
            method_log_path(o.log_path, labels[k], nmethods > 1, log_path, sizeof log_path);
            c->log_path = log_path;
        }
        err[0] = '\0';
        r = mpi_comm ? sumo__train_rank(mpi_comm, c, &train, &test, &summaries[k], err, sizeof err)
                     : sumo__train_threads(c, &train, &test, &summaries[k], err, sizeof err);
        if (r != SUMO_SUCCESS) {
            fprintf(stderr, "sumo train: %s: %s (%s)\n", labels[k],
                    err[0] ? err : sumo_strerror(r), sumo_result_name(r));
            rc = 1;
            goto out;
        }
    }
    if (rank == 0) {
        const sumo__train_config *c0 = &configs[0];
        printf("\nFashion-MNIST, %s, %d workers x batch %d = total batch %d, %d epoch(s), %s, seed %llu\n",
               c0->model == SUMO__MODEL_CNN ? "cnn" : "mlp", c0->workers, c0->batch,
               c0->workers * c0->batch, c0->epochs, sumo_optimizer_kind_name(c0->optim.kind),
               (unsigned long long)c0->seed);
        printf("%-18s %8s %9s %9s %9s %7s %9s %8s %10s %8s\n", "method", "peak lr", "final acc",
               "best acc", "to target", "steps", "comm MiB", "rounds", "agg share", "wall s");
        for (int k = 0; k < nmethods; k++) {
            const sumo__train_summary *s = &summaries[k];
            char target[32];
            if (s->steps_to_target >= 0) snprintf(target, sizeof target, "%.2f ep", s->epochs_to_target);
            else snprintf(target, sizeof target, "-");
            double share = s->aggregation_seconds / (s->aggregation_seconds + s->compute_seconds + 1e-12);
            printf("%-18s %8.4f %8.2f%% %8.2f%% %9s %7ld %9.1f %8llu %9.1f%% %8.1f%s\n",
                   labels[k], configs[k].lr * configs[k].lr_scale,
                   100 * s->final_accuracy, 100 * s->best_accuracy, target, s->steps,
                   (double)s->comm.bytes / (1024.0 * 1024.0), (unsigned long long)s->comm.rounds,
                   100 * share, s->wall_seconds, s->diverged ? "  diverged" : "");
        }
        if (o.summary_path) write_summaries(o.summary_path, labels, configs, summaries, nmethods);
        for (int k = 0; k < nmethods; k++)
            printf("%s: %zu parameters, fnv1a %016llx, extra memory %zu bytes\n",
                   labels[k], summaries[k].nparams,
                   (unsigned long long)summaries[k].param_checksum, summaries[k].extra_memory_bytes);
    }
out:
    sumo__dataset_free(&train);
    sumo__dataset_free(&test);
#ifdef SUMO_HAVE_MPI
    if (mpi_comm) {
        sumo_comm_destroy(mpi_comm);
        MPI_Finalize();
    }
#endif
    return rc;
}
