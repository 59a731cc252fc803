/*
 * `sumo train`: data-parallel training on Fashion-MNIST with any aggregation method, on the
 * threads transport (default), under mpirun, or as the tasks of an srun step. A
 * comma-separated --reduce runs each method in turn with otherwise identical settings and
 * prints a comparison table.
 */
#include "args.h"
#include "commands.h"
#include "machine.h"

#include "train/checkpoint.h"
#include "train/trainer.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef SUMO_HAVE_MPI
#include "sumo_mpi.h"
#endif
#include "launch.h"

void openblas_set_num_threads(int num_threads);

static void usage(FILE *out)
{
    fprintf(out,
        "usage: sumo train [options]\n"
        "  --workers N            data-parallel ranks (threads; under mpirun or srun: the processes) [1]\n"
        "  --transport T          threads | mpi | shm (default: mpi under mpirun or srun --mpi=pmix,\n"
        "                         shm for the tasks of a plain srun step on one node, threads with no\n"
        "                         launcher; another launcher is refused unless T is given)\n"
        "  --model M              mlp | cnn [mlp]\n"
        "  --hidden H             MLP hidden width / CNN dense width [model default]\n"
        "  --batch B              per-worker batch [64]\n"
        "  --epochs E             [1]\n"
        "  --seed S               [1]\n"
        "  --reduce LIST          sum, avg, adasum, adasum-delta, acga, slowmo, localsgd, bmuf,\n"
        "                         diloco, streaming-diloco;\n"
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
        "  DiLoCo:  --sync-every H --fragments F --strided-fragments --fragment-ranges\n"
        "           --delay T --merge-alpha A\n"
        "           --outer nesterov|heavy-ball --outer-lr X --outer-momentum M\n"
        "           --outer-combine average|adasum|acga --quantize none|bf16|e4m3|e3m0\n"
        "           --quantize-block B   (diloco: H 500, Nesterov 0.7/0.9; streaming-diloco:\n"
        "           F 4, delay 1, merge 0.5, e3m0 in blocks of 128)\n"
        "  Adasum:  --adasum-hierarchical --adasum-group-size G\n"
        "  --eval-every K         evaluate every K steps [0: every epoch]\n"
        "  --target A             report steps to this test accuracy (0..1) [0.85]\n"
        "  --data DIR             IDX files [/usr/share/datasets/fashion-mnist]\n"
        "  --train-limit N --test-limit N   use only the first N items\n"
        "  --log FILE             CSV log (one per method: FILE gets .METHOD before .csv)\n"
        "  --summary FILE         append one CSV row per method with the end-of-run figures\n"
        "  --checkpoint-dir D     atomic checkpoints in D (several methods: D/METHOD each)\n"
        "  --checkpoint-every K   also every K steps [only at the end]\n"
        "  --keep K               keep the K latest checkpoints [2]\n"
        "  --resume               continue D's latest checkpoint (more --epochs may be given\n"
        "                         with the constant schedule; other changed flags are named)\n"
        "  --overwrite            start afresh in a D that holds a checkpoint, discarding it\n"
        "  --stop-after K         stop after step K (with D: after saving a checkpoint there)\n"
        "  --no-progress          no progress on stderr (a line per epoch when not a terminal)\n"
        "  --verify-ranks         check all ranks agree after every step\n"
        "  --elastic              survive lost workers (threads, or tasks of srun on one node):\n"
        "                         the survivors regroup and redo the step in flight\n"
        "  --leave R@S, --kill R@S   (with --elastic) worker R leaves cleanly, or dies (a task:\n"
        "                         SIGKILL on itself), at step S; may be repeated\n"
        "  --join S               (with --elastic, threads) a new worker joins at step S and gets\n"
        "                         the state from worker 0; may be repeated\n"
        "The results table ends with a line per column saying what it shows; \"to target\"\n"
        "counts epochs until the test accuracy first reached --target.\n");
}

#define MAX_METHODS 16

typedef struct options {
    sumo__train_config cfg;
    int nmethods;
    sumo__method methods[MAX_METHODS];
    const char *scalings[MAX_METHODS];
    char labels[MAX_METHODS][64];
    const char *transport;
    const char *data_dir;
    const char *log_path;
    const char *summary_path;
    const char *lr_scaling;
    double momentum, alpha_override, slow_beta_override;
    int tau_override, inner_override;
    int buffers_override, memory_efficient;
    /* DiLoCo: -1 (or NaN for the doubles) where the preset's value stands */
    int sync_every, fragments, delay, outer, combine, quantize, strided, ranges;
    double merge_alpha, outer_lr, outer_momentum;
    int64_t quantize_block;
    int have_momentum;
    bool workers_given; /* under mpirun the ranks are the workers: a differing --workers is refused */
    bool overwrite, have_checkpoint_every, have_keep;
} options;

static int bad(const char *flag, const char *value)
{
    fprintf(stderr, "sumo train: bad value '%s' for %s (see sumo train --help)\n", value ? value : "", flag);
    return 2;
}

static int bad_args(const sumo_args_error *e)
{
    fprintf(stderr, "sumo train: %s\n", e->message);
    return 2;
}

/* none | linear | a factor; NULL *factor for linear (it depends on the worker count). */
static bool parse_scaling(const char *flag, const char *v, double *factor, bool *linear, sumo_args_error *e)
{
    *linear = false;
    *factor = 1.0;
    if (strcmp(v, "none") == 0) return true;
    if (strcmp(v, "linear") == 0) return *linear = true;
    if (sumo_args_double(flag, v, 0, true, 1e6, false, factor, e)) return true;
    snprintf(e->message, sizeof e->message, "%s: '%s' is not none, linear or a factor in (0, 1e6]", flag, v);
    return false;
}

/* The --reduce methods, from the trainer's own table, so that a message cannot fall behind. */
static void method_list(char *out, size_t len)
{
    size_t used = 0;
    out[0] = '\0';
    for (int m = 0; m < SUMO__METHOD_COUNT && used < len; m++) {
        int n = snprintf(out + used, len - used, "%s%s", m ? ", " : "", sumo__method_name((sumo__method)m));
        if (n < 0) break;
        used += (size_t)n;
    }
}

/* --reduce: METHOD[@SCALING], comma-separated; every entry must name a method, once. */
static int parse_methods(const char *value, options *o)
{
    char methods[256];
    method_list(methods, sizeof methods);
    char list[1024];
    if (strlen(value) >= sizeof list) return bad("--reduce", value);
    snprintf(list, sizeof list, "%s", value);
    o->nmethods = 0;
    for (char *p = list, *next; p; p = next) {
        next = strchr(p, ',');
        if (next) *next++ = '\0';
        if (*p == '\0') {
            fprintf(stderr, "sumo train: --reduce '%s': an empty entry (methods: %s)\n", value, methods);
            return 2;
        }
        if (o->nmethods == MAX_METHODS) {
            fprintf(stderr, "sumo train: --reduce: at most %d methods in one run\n", MAX_METHODS);
            return 2;
        }
        int k = o->nmethods;
        size_t n = strlen(p);
        if (n >= sizeof o->labels[k]) return bad("--reduce", p);
        memcpy(o->labels[k], p, n + 1);
        for (int j = 0; j < k; j++)
            if (strcmp(o->labels[j], p) == 0) {
                fprintf(stderr, "sumo train: --reduce: '%s' is given twice\n", p);
                return 2;
            }
        char *at = strchr(p, '@');
        if (at) *at = '\0';
        if (!sumo__method_parse(p, &o->methods[k])) {
            fprintf(stderr, "sumo train: --reduce: unknown method '%s' (methods: %s; METHOD@S gives "
                            "an entry its own --lr-scaling S)\n", p, methods);
            return 2;
        }
        /* The scaling points into the label, which lives as long as the options. */
        o->scalings[k] = at ? strchr(o->labels[k], '@') + 1 : NULL;
        if (o->scalings[k]) {
            sumo_args_error e;
            double f;
            bool linear;
            if (!parse_scaling("--reduce METHOD@S", o->scalings[k], &f, &linear, &e)) return bad_args(&e);
        }
        o->nmethods++;
    }
    return 0;
}

/* Largest values that mean something here; beyond them a typo is likelier than intent. */
#define MAX_BATCH 65536
#define MAX_EPOCHS 1000000
#define MAX_HIDDEN 65536
#define MAX_LR 1000.0

static int parse(int argc, char **argv, options *o)
{
    sumo__train_config *c = &o->cfg;
    sumo__train_config_default(c);
    c->target_accuracy = 0.85;
    c->progress = true;
    c->progress_inline = isatty(2);
    c->keep = 2;
    int rc = parse_methods("avg", o);
    if (rc) return rc;
    o->alpha_override = o->slow_beta_override = -1;
    o->tau_override = o->inner_override = -1;
    o->buffers_override = -1;
    o->sync_every = o->fragments = o->delay = o->outer = o->combine = o->quantize = -1;
    o->merge_alpha = o->outer_lr = o->outer_momentum = NAN;
    o->quantize_block = -1;
    const char *optimizer = "sgd";
    double beta1 = -1, beta2 = -1, eps = -1, wd = -1, damp = -1;
    int nesterov = 0;
    sumo_args_error e;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t l;
#define FLAG(name) (strcmp(a, name) == 0)
#define NEED() do { if (v == NULL) { fprintf(stderr, "sumo train: %s needs a value\n", a); return 2; } i++; } while (0)
#define DBL(dst, lo, lo_open, hi, hi_open) \
    do { NEED(); if (!sumo_args_double(a, v, lo, lo_open, hi, hi_open, &(dst), &e)) return bad_args(&e); } while (0)
#define INT(dst, lo, hi) do { NEED(); if (!sumo_args_int(a, v, lo, hi, &(dst), &e)) return bad_args(&e); } while (0)
#define I64(dst, lo, hi) \
    do { NEED(); if (!sumo_args_int64(a, v, lo, hi, &l, &e)) return bad_args(&e); dst = l; } while (0)
        if (FLAG("--help") || FLAG("-h")) { usage(stdout); return 1; }
        else if (FLAG("--workers")) { INT(c->workers, 1, SUMO_THREADS_MAX_RANKS); o->workers_given = true; }
        else if (FLAG("--transport")) {
            NEED();
            if (strcmp(v, "mpi") != 0 && strcmp(v, "threads") != 0 && strcmp(v, "shm") != 0) return bad(a, v);
            o->transport = v;
        }
        else if (FLAG("--model")) {
            NEED();
            if (strcmp(v, "mlp") == 0) c->model = SUMO__MODEL_MLP;
            else if (strcmp(v, "cnn") == 0) c->model = SUMO__MODEL_CNN;
            else return bad(a, v);
        }
        else if (FLAG("--hidden")) INT(c->hidden, 0, MAX_HIDDEN);
        else if (FLAG("--batch")) INT(c->batch, 1, MAX_BATCH);
        else if (FLAG("--epochs")) INT(c->epochs, 1, MAX_EPOCHS);
        else if (FLAG("--seed")) { NEED(); if (!sumo_args_uint64(a, v, &c->seed, &e)) return bad_args(&e); }
        else if (FLAG("--reduce")) { NEED(); if ((rc = parse_methods(v, o)) != 0) return rc; }
        else if (FLAG("--optimizer")) { NEED(); optimizer = v; }
        else if (FLAG("--lr")) DBL(c->lr, 0, true, MAX_LR, false);
        else if (FLAG("--lr-scaling")) {
            NEED();
            double f;
            bool linear;
            if (!parse_scaling(a, v, &f, &linear, &e)) return bad_args(&e);
            o->lr_scaling = v;
        }
        else if (FLAG("--warmup-epochs")) DBL(c->warmup_epochs, 0, false, MAX_EPOCHS, false);
        else if (FLAG("--schedule")) {
            NEED();
            if (strcmp(v, "constant") == 0) c->schedule = SUMO_LR_CONSTANT;
            else if (strcmp(v, "step") == 0) c->schedule = SUMO_LR_STEP;
            else if (strcmp(v, "cosine") == 0) c->schedule = SUMO_LR_COSINE;
            else return bad(a, v);
        }
        else if (FLAG("--momentum")) { DBL(o->momentum, 0, false, 1, true); o->have_momentum = 1; }
        else if (FLAG("--nesterov")) nesterov = 1;
        else if (FLAG("--dampening")) DBL(damp, 0, false, 1, false);
        else if (FLAG("--weight-decay")) DBL(wd, 0, false, 1e3, false);
        else if (FLAG("--beta1")) DBL(beta1, 0, false, 1, true);
        else if (FLAG("--beta2")) DBL(beta2, 0, false, 1, true);
        else if (FLAG("--eps")) DBL(eps, 0, true, 1, false);
        else if (FLAG("--acga-beta")) DBL(c->acga.beta, 0, false, 1, true);
        else if (FLAG("--acga-per-tensor")) c->acga.per_tensor = 1;
        else if (FLAG("--acga-reference-permutation")) c->acga.reference_permutation = 1;
        else if (FLAG("--acga-no-guard")) c->acga.negative_guard = 0;
        else if (FLAG("--acga-rescale")) c->acga.rescale = 1;
        else if (FLAG("--acga-eps")) DBL(c->acga.eps, 0, true, 1, false);
        else if (FLAG("--tau")) INT(o->tau_override, 1, 1000000);
        else if (FLAG("--alpha")) DBL(o->alpha_override, 0, true, 1e3, false);
        else if (FLAG("--slow-beta")) DBL(o->slow_beta_override, 0, false, 1, true);
        else if (FLAG("--inner-period")) INT(o->inner_override, 0, 1000000);
        else if (FLAG("--buffers")) {
            NEED();
            if (strcmp(v, "keep") == 0) o->buffers_override = SUMO_BUFFERS_KEEP;
            else if (strcmp(v, "reset") == 0) o->buffers_override = SUMO_BUFFERS_RESET;
            else if (strcmp(v, "average") == 0) o->buffers_override = SUMO_BUFFERS_AVERAGE;
            else return bad(a, v);
        }
        else if (FLAG("--memory-efficient")) o->memory_efficient = 1;
        else if (FLAG("--sync-every")) INT(o->sync_every, 1, 1000000);
        else if (FLAG("--fragments")) INT(o->fragments, 1, 1000000);
        else if (FLAG("--strided-fragments")) o->strided = 1;
        else if (FLAG("--fragment-ranges")) o->ranges = 1;
        else if (FLAG("--delay")) INT(o->delay, 0, 1000000);
        else if (FLAG("--merge-alpha")) DBL(o->merge_alpha, 0, false, 1, false);
        else if (FLAG("--outer-lr")) DBL(o->outer_lr, 0, true, 1e3, false);
        else if (FLAG("--outer-momentum")) DBL(o->outer_momentum, 0, false, 1, true);
        else if (FLAG("--outer")) {
            NEED();
            if (strcmp(v, "nesterov") == 0) o->outer = SUMO_OUTER_NESTEROV;
            else if (strcmp(v, "heavy-ball") == 0) o->outer = SUMO_OUTER_HEAVY_BALL;
            else return bad(a, v);
        }
        else if (FLAG("--outer-combine")) {
            NEED();
            if (strcmp(v, "average") == 0) o->combine = SUMO_COMBINE_AVERAGE;
            else if (strcmp(v, "adasum") == 0) o->combine = SUMO_COMBINE_ADASUM;
            else if (strcmp(v, "acga") == 0) o->combine = SUMO_COMBINE_ACGA;
            else return bad(a, v);
        }
        else if (FLAG("--quantize")) {
            NEED();
            if (strcmp(v, "none") == 0) o->quantize = SUMO_COMPRESS_NONE;
            else if (strcmp(v, "bf16") == 0) o->quantize = SUMO_COMPRESS_BF16;
            else if (strcmp(v, "e4m3") == 0) o->quantize = SUMO_COMPRESS_FP8_E4M3;
            else if (strcmp(v, "e3m0") == 0) o->quantize = SUMO_COMPRESS_E3M0;
            else return bad(a, v);
        }
        else if (FLAG("--quantize-block")) {
            I64(o->quantize_block, 8, 65536);
            if (o->quantize_block % 8 != 0) {
                fprintf(stderr, "sumo train: --quantize-block %lld: must be a multiple of 8 in [8, 65536]\n",
                        (long long)o->quantize_block);
                return 2;
            }
        }
        else if (FLAG("--adasum-hierarchical")) c->adasum_hierarchical = 1;
        else if (FLAG("--adasum-group-size")) INT(c->adasum_group_size, 0, SUMO_THREADS_MAX_RANKS);
        else if (FLAG("--eval-every")) INT(c->eval_every, 0, INT_MAX);
        else if (FLAG("--target")) DBL(c->target_accuracy, 0, false, 1, false);
        else if (FLAG("--data")) { NEED(); o->data_dir = v; }
        else if (FLAG("--train-limit")) I64(c->train_limit, 0, SUMO__IDX_MAX_ITEMS);
        else if (FLAG("--test-limit")) I64(c->test_limit, 0, SUMO__IDX_MAX_ITEMS);
        else if (FLAG("--log")) { NEED(); o->log_path = v; }
        else if (FLAG("--summary")) { NEED(); o->summary_path = v; }
        else if (FLAG("--checkpoint-dir")) { NEED(); c->checkpoint_dir = v; }
        else if (FLAG("--checkpoint-every")) { INT(c->checkpoint_every, 1, INT_MAX); o->have_checkpoint_every = true; }
        else if (FLAG("--keep")) { INT(c->keep, 1, 1000000); o->have_keep = true; }
        else if (FLAG("--overwrite")) o->overwrite = true;
        else if (FLAG("--resume")) c->resume = true;
        else if (FLAG("--stop-after")) I64(c->stop_after, 1, LONG_MAX);
        else if (FLAG("--no-progress")) c->progress = false;
        else if (FLAG("--verify-ranks")) c->verify_ranks = true;
        else if (FLAG("--elastic")) c->elastic = true;
        else if (FLAG("--join")) {
            long st;
            I64(st, 0, LONG_MAX);
            if (c->nevents == SUMO__MAX_TRAIN_EVENTS) {
                fprintf(stderr, "sumo train: at most %d --leave/--kill/--join\n", SUMO__MAX_TRAIN_EVENTS);
                return 2;
            }
            c->events[c->nevents].rank = -1;
            c->events[c->nevents].step = st;
            c->events[c->nevents].kind = SUMO__EVENT_JOIN;
            c->nevents++;
        }
        else if (FLAG("--leave") || FLAG("--kill")) {
            NEED();
            int rk, used = 0;
            long st;
            if (sscanf(v, "%d@%ld%n", &rk, &st, &used) != 2 || v[used] != '\0' || rk < 0 || st < 0)
                return bad(a, v);
            if (c->nevents == SUMO__MAX_TRAIN_EVENTS) {
                fprintf(stderr, "sumo train: at most %d --leave/--kill/--join\n", SUMO__MAX_TRAIN_EVENTS);
                return 2;
            }
            c->events[c->nevents].rank = rk;
            c->events[c->nevents].step = st;
            c->events[c->nevents].kind = FLAG("--kill") ? SUMO__EVENT_DIE : SUMO__EVENT_LEAVE;
            c->nevents++;
        }
        else {
            fprintf(stderr, "sumo train: unknown option '%s' (see sumo train --help)\n", a);
            return 2;
        }
#undef FLAG
#undef NEED
#undef DBL
#undef INT
#undef I64
    }
    if (c->checkpoint_dir == NULL) {
        const char *needs = c->resume ? "--resume" : o->have_checkpoint_every ? "--checkpoint-every"
                          : o->have_keep ? "--keep" : o->overwrite ? "--overwrite" : NULL;
        if (needs) {
            fprintf(stderr, "sumo train: %s needs --checkpoint-dir DIR (the folder the checkpoints live in)\n", needs);
            return 2;
        }
    } else if (c->checkpoint_dir[0] == '\0') {
        return bad("--checkpoint-dir", c->checkpoint_dir);
    }
    if (c->nevents && !c->elastic) {
        fprintf(stderr, "sumo train: --leave, --kill and --join stage changes for an --elastic run\n");
        return 2;
    }
    if (c->elastic && c->checkpoint_dir) {
        /* Checkpoints are per rank and name the size; an elastic run's size changes. */
        fprintf(stderr, "sumo train: --elastic keeps its state in memory and does not take --checkpoint-dir yet\n");
        return 2;
    }
    if (c->resume && o->overwrite) {
        fprintf(stderr, "sumo train: --resume continues the checkpoint that --overwrite would discard: give one\n");
        return 2;
    }
    if ((o->log_path && o->log_path[0] == '\0') || (o->summary_path && o->summary_path[0] == '\0'))
        return bad(o->log_path && o->log_path[0] == '\0' ? "--log" : "--summary", "");
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
    if (sumo__method_is_slowmo(m)) {
        sumo_diloco_options *so = &c->outer;
        sumo_diloco_options_default(m == SUMO__METHOD_LOCALSGD ? SUMO_DILOCO_PRESET_LOCALSGD
                                   : m == SUMO__METHOD_BMUF   ? SUMO_DILOCO_PRESET_BMUF
                                                              : SUMO_DILOCO_PRESET_SLOWMO,
                                   so);
        if (o->tau_override >= 0) so->sync_every = (int)o->tau_override;
        if (o->alpha_override >= 0) so->lr = o->alpha_override;
        if (o->slow_beta_override >= 0 && m != SUMO__METHOD_LOCALSGD) so->momentum = o->slow_beta_override;
        if (o->inner_override >= 0) so->inner_period = (int)o->inner_override;
        if (o->buffers_override >= 0) c->buffers = (sumo_buffer_policy)o->buffers_override;
        so->memory_efficient = o->memory_efficient;
    }
    if (sumo__method_is_diloco(m)) {
        sumo_diloco_options *d = &c->outer;
        sumo_diloco_options_default(m == SUMO__METHOD_STREAMING_DILOCO ? SUMO_DILOCO_PRESET_STREAMING
                                                                      : SUMO_DILOCO_PRESET_DILOCO,
                                   d);
        if (o->sync_every >= 0) d->sync_every = o->sync_every;
        if (o->fragments >= 0) d->fragments = o->fragments;
        if (o->delay >= 0) d->delay = o->delay;
        if (!isnan(o->merge_alpha)) d->merge_alpha = o->merge_alpha;
        if (o->outer >= 0) d->outer = (sumo_outer_optimizer)o->outer;
        if (!isnan(o->outer_lr)) d->lr = o->outer_lr;
        if (!isnan(o->outer_momentum)) d->momentum = o->outer_momentum;
        if (o->combine >= 0) d->combine = (sumo_outer_combine)o->combine;
        if (o->quantize >= 0) d->compression = (sumo_compression_format)o->quantize;
        if (o->quantize_block >= 0) d->block_size = (size_t)o->quantize_block;
        c->diloco_strided = o->strided;
        if (o->ranges) d->split = SUMO_SPLIT_RANGES;
        if (o->ranges && o->strided) {
            fprintf(stderr, "sumo train: %s: --strided-fragments assigns whole tensors; "
                            "--fragment-ranges cuts the flat vector: give one\n", sumo__method_name(m));
            return 2;
        }
        /* What the outer loop would refuse at create, refused here by the flags' names. */
        if (d->fragments > d->sync_every) {
            fprintf(stderr, "sumo train: %s: --fragments %d exceeds --sync-every %d (one fragment "
                            "syncs at a time)\n", sumo__method_name(m), d->fragments, d->sync_every);
            return 2;
        }
        if (d->delay > d->sync_every / d->fragments) {
            fprintf(stderr, "sumo train: %s: --delay %d exceeds --sync-every / --fragments = %d (at "
                            "most one exchange in flight)\n", sumo__method_name(m), d->delay,
                    d->sync_every / d->fragments);
            return 2;
        }
        if (d->compression != SUMO_COMPRESS_NONE && d->combine != SUMO_COMBINE_AVERAGE) {
            fprintf(stderr, "sumo train: %s: --quantize needs --outer-combine average\n",
                    sumo__method_name(m));
            return 2;
        }
    }
    c->lr_scale = 1.0;
    if (scaling == NULL) scaling = o->lr_scaling;
    if (scaling) {
        double f;
        bool linear;
        sumo_args_error e;
        if (!parse_scaling("--lr-scaling", scaling, &f, &linear, &e)) return bad_args(&e);
        c->lr_scale = linear ? c->workers : f;
    }
    return 0;
}

/* False when the path does not fit out. */
static bool method_log_path(const char *base, const char *method, bool several, char *out, size_t len)
{
    int n;
    const char *dot = strrchr(base, '.');
    if (!several) n = snprintf(out, len, "%s", base);
    else if (dot && strcmp(dot, ".csv") == 0) n = snprintf(out, len, "%.*s.%s.csv", (int)(dot - base), base, method);
    else n = snprintf(out, len, "%s.%s", base, method);
    return n >= 0 && (size_t)n < len;
}

/* A log that cannot be created would otherwise only show up as a missing file after the run:
 * find out before any training. An existing log is opened for appending, so a resume keeps
 * it; a new one is created (the trainer rewrites it from the start). */
static int check_writable(const char *path, const char *what)
{
    FILE *f = fopen(path, "a");
    if (f == NULL) {
        fprintf(stderr, "sumo train: %s: cannot open the %s: %s\n", path, what, strerror(errno));
        return 1;
    }
    if (fclose(f) != 0) {
        fprintf(stderr, "sumo train: %s: cannot write the %s: %s\n", path, what, strerror(errno));
        return 1;
    }
    return 0;
}

static FILE *open_summary(const char *path)
{
    bool fresh = access(path, F_OK) != 0;
    FILE *f = fopen(path, "a");
    if (f == NULL) {
        fprintf(stderr, "sumo train: %s: cannot open the summary file: %s\n", path, strerror(errno));
        return NULL;
    }
    if (fresh)
        fprintf(f, "method,workers,batch,total_batch,optimizer,peak_lr,final_accuracy,best_accuracy,"
                   "steps_to_target,epochs_to_target,steps,rounds,bytes,bytes_per_step,"
                   "peak_bytes_in_flight,diverged,wall_s,"
                   "aggregation_s,compute_s,extra_memory_bytes,params,fnv1a,blas_core,kernel_isa\n");
    if (fflush(f) != 0) {
        fprintf(stderr, "sumo train: %s: cannot write the summary file: %s\n", path, strerror(errno));
        fclose(f);
        return NULL;
    }
    return f;
}

/* Rows go out together at the end; a full disk shows up at the latest when the file is closed. */
static int write_summaries(FILE *f, const char *path, const char (*labels)[64],
                           const sumo__train_config *configs, const sumo__train_summary *sums, int n)
{
    for (int k = 0; k < n; k++) {
        const sumo__train_summary *s = &sums[k];
        const sumo__train_config *c = &configs[k];
        /* One worker exchanges nothing (its calls are counted all the same). */
        bool alone = c->workers == 1;
        fprintf(f, "%s,%d,%d,%d,%s,%.6g,%.4f,%.4f,%ld,%.3f,%ld,%llu,%llu,%.1f,%llu,%d,%.2f,%.3f,%.3f,%zu,%zu,"
                   "%016llx,%s,%s\n",
                labels[k], c->workers, c->batch, c->workers * c->batch,
                sumo_optimizer_kind_name(c->optim.kind), c->lr * c->lr_scale, s->final_accuracy,
                s->best_accuracy, s->steps_to_target, s->steps_to_target >= 0 ? s->epochs_to_target : -1.0,
                s->steps, alone ? 0ull : (unsigned long long)s->comm.rounds,
                alone ? 0ull : (unsigned long long)s->comm.bytes,
                alone || s->steps < 1 ? 0.0 : (double)s->comm.bytes / (double)s->steps,
                alone ? 0ull : (unsigned long long)s->peak_bytes_in_flight, s->diverged, s->wall_seconds, s->aggregation_seconds, s->compute_seconds,
                s->extra_memory_bytes, s->nparams, (unsigned long long)s->param_checksum,
                sumo_tool_blas_core(), sumo_tool_kernel_isa());
    }
    bool failed = ferror(f) != 0;
    int saved = errno;
    if (fclose(f) != 0 && !failed) {
        failed = true;
        saved = errno;
    }
    if (failed) {
        fprintf(stderr, "sumo train: %s: cannot write the summary file: %s\n", path, strerror(saved));
        return 1;
    }
    return 0;
}


/* The trainer's own count: whole total batches per epoch, times the epochs. */
static long planned_steps(const sumo__train_config *c, const sumo__dataset *train)
{
    size_t usable = c->train_limit && c->train_limit < train->n ? c->train_limit : train->n;
    return (long)(usable / ((size_t)c->workers * (size_t)c->batch)) * c->epochs;
}

/* SlowMo's outer step (the exact average and the slow momentum) comes every tau steps: a run
 * shorter than tau would never take it, and its workers would end where their local steps
 * left them, without a word. Refused, naming the ways out. 0 or the exit status 2. */
static int check_outer_steps(const sumo__train_config *c, const char *label, const sumo__dataset *train,
                             bool say)
{
    long steps = planned_steps(c, train);
    if (!sumo__method_is_slowmo(c->method) || steps < 1 || steps >= c->outer.sync_every) return 0;
    if (say)
        fprintf(stderr, "sumo train: --reduce %s: the run has %ld step(s) (%d epoch(s) of %ld), fewer than "
                        "--tau %d: its outer step (the exact average and the slow momentum) would never "
                        "run%s. Give --tau %ld or less, more --epochs or a smaller --batch\n",
                label, steps, c->epochs, steps / c->epochs, c->outer.sync_every,
                c->workers > 1 ? " and the workers would end unsynchronised" : "", steps);
    return 2;
}

/* A SlowMo run whose last steps came after its last exchange ends with different parameters
 * on each worker: the table's accuracy is then their average's (the trainer scores that), the
 * hash rank 0's own. Said after the table, so that no reader takes them for one model. */
static void note_unsynchronised_end(const char *label, const sumo__train_config *c, long steps)
{
    const sumo_diloco_options *so = &c->outer;
    if (!sumo__method_is_slowmo(c->method) || c->workers < 2 || steps < so->sync_every) return;
    long after = steps % so->sync_every;
    if (after == 0 || (so->inner_period > 0 && after % so->inner_period == 0)) return;
    printf("%s: the last %ld of %ld steps came after the last exchange (every %d steps): the workers "
           "end with different parameters; the accuracy is their average's, the parameter hash rank 0's\n",
           label, after, steps, so->inner_period > 0 ? so->inner_period : so->sync_every);
}

static void print_table(const options *o, const sumo__train_config *configs, const sumo__train_summary *sums)
{
    const sumo__train_config *c0 = &configs[0];
    printf("\nFashion-MNIST, %s, %d workers x batch %d = total batch %d, %d epoch(s), %s, seed %llu\n",
           c0->model == SUMO__MODEL_CNN ? "cnn" : "mlp", c0->workers, c0->batch,
           c0->workers * c0->batch, c0->epochs, sumo_optimizer_kind_name(c0->optim.kind),
           (unsigned long long)c0->seed);
    if (c0->target_accuracy > 0)
        printf("target: %.2f%% test accuracy (--target)\n", 100 * c0->target_accuracy);
    else
        printf("target: none (--target 0)\n");
    printf("%-18s %8s %9s %9s %9s %7s %9s %8s %10s %8s\n", "method", "peak lr", "final acc",
           "best acc", "to target", "steps", "comm MiB", "rounds", "agg share", "wall s");
    /* One worker exchanges nothing, though its calls still pass through the collectives and
     * are counted there: figures of communication would mean nothing. */
    bool alone = c0->workers == 1;
    for (int k = 0; k < o->nmethods; k++) {
        const sumo__train_summary *s = &sums[k];
        char target[32], mib[32] = "-", rounds[32] = "-";
        if (s->steps_to_target >= 0) snprintf(target, sizeof target, "%.2f ep", s->epochs_to_target);
        else snprintf(target, sizeof target, "%s", s->diverged ? "diverged" : "-");
        if (!alone) {
            snprintf(mib, sizeof mib, "%.1f", (double)s->comm.bytes / (1024.0 * 1024.0));
            snprintf(rounds, sizeof rounds, "%llu", (unsigned long long)s->comm.rounds);
        }
        double share = s->aggregation_seconds / (s->aggregation_seconds + s->compute_seconds + 1e-12);
        printf("%-18s %8.4f %8.2f%% %8.2f%% %9s %7ld %9s %8s %9.1f%% %8.1f%s\n",
               o->labels[k], configs[k].lr * configs[k].lr_scale,
               100 * s->final_accuracy, 100 * s->best_accuracy, target, s->steps, mib, rounds,
               100 * share, s->wall_seconds, s->diverged ? "  DIVERGED (loss not finite)" : "");
    }
    /* A newcomer cannot guess these; one line each, once. */
    char target[64];
    if (c0->target_accuracy > 0) snprintf(target, sizeof target, "%.2f%%", 100 * c0->target_accuracy);
    else snprintf(target, sizeof target, "none set");
    printf("columns:\n"
           "  method     the --reduce entry (METHOD@S: with its own --lr-scaling S)\n"
           "  peak lr    --lr times the scaling, reached after --warmup-epochs\n"
           "  final acc  test accuracy at the last evaluation\n"
           "  best acc   best test accuracy at any evaluation\n"
           "  to target  epochs until an evaluation first reached the target (%s); -: never\n"
           "  steps      optimizer steps, each on workers x batch items\n"
           "  comm MiB   bytes rank 0 exchanged in collectives, in MiB (-: one worker exchanges nothing)\n"
           "  rounds     collective calls of rank 0 (-: one worker)\n"
           "  agg share  time in the distributed step (waiting for peers included) / step time\n"
           "  wall s     wall-clock seconds\n", target);
}

/* Every rank must leave together when one finds a problem before training: a rank that
 * returned alone would leave the others waiting for it until their deadline. The worst code
 * wins; a rank that cannot even ask has lost its peers. */
static int agree(sumo_comm *comm, int size, int rc)
{
    if (!comm || size < 2) return rc;
    double mine = rc, *all = malloc((size_t)size * sizeof *all);
    int worst = rc ? rc : 1;
    if (all && sumo_allgather(&mine, all, 1, SUMO_FLOAT64, comm) == SUMO_SUCCESS) {
        worst = rc;
        for (int r = 0; r < size; r++)
            if ((int)all[r] > worst) worst = (int)all[r];
    }
    free(all);
    return worst;
}

int sumo_cmd_train(int argc, char **argv)
{
    options o = {0};
    int rc = parse(argc, argv, &o);
    if (rc == 1) return 0; /* --help */
    if (rc) return rc;
    openblas_set_num_threads(1); /* one BLAS thread per worker: the workers share the cores */
    int rank = 0, size = 1, asked = o.cfg.workers;
    char err[1024] = "";
    launch how;
    if ((rc = launch_detect(o.transport, &how, err, sizeof err)) != 0) {
        fprintf(stderr, "sumo train: %s\n", err);
        return rc;
    }
    sumo_comm *comm = NULL; /* NULL: worker threads */
    sumo_store *store = NULL; /* an elastic srun step's: survivors regroup through it */
    if (o.cfg.elastic && (how.kind == LAUNCH_MPI || o.nmethods > 1)) {
        fprintf(stderr, "sumo train: --elastic %s\n",
                how.kind == LAUNCH_MPI ? "needs a communicator that can shrink: worker threads or the tasks of "
                                         "a plain srun step (Open MPI 4.1 has no ULFM, and mpirun ends the "
                                         "job when a rank dies)"
                                       : "trains one method at a time");
        return 2;
    }
    for (int i = 0; i < o.cfg.nevents; i++)
        if (o.cfg.events[i].kind == SUMO__EVENT_JOIN && how.kind != LAUNCH_THREADS) {
            /* A task joins a job through its launcher; srun's steps are fixed at their start. */
            fprintf(stderr, "sumo train: --join adds worker threads; srun starts a step's tasks at once "
                            "(processes that join a running job: sumo.torch's python -m sumo.launch --join)\n");
            return 2;
        }
    if (how.kind == LAUNCH_MPI) {
#ifdef SUMO_HAVE_MPI
        MPI_Init(&argc, &argv);
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        MPI_Comm_size(MPI_COMM_WORLD, &size);
        if (sumo_comm_create_mpi(MPI_COMM_WORLD, &comm) != SUMO_SUCCESS) {
            fprintf(stderr, "sumo train: cannot create the MPI communicator\n");
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
#else
        fprintf(stderr, "sumo train: this build has no MPI (install libopenmpi-dev and rebuild)\n");
        return 2;
#endif
    } else if (how.kind == LAUNCH_SRUN) {
        rank = how.rank;
        size = how.size;
        if (launch_join_srun(&how, &comm, o.cfg.elastic ? &store : NULL, err, sizeof err) != 0) {
            fprintf(stderr, "sumo train: %s\n", err);
            return 1;
        }
    }
    if (comm) {
        o.cfg.workers = size;
        if (rank != 0) o.cfg.progress = false;
    }
    bool several = o.nmethods > 1, broken = false;
    char log_paths[MAX_METHODS][1024], ckpt_dirs[MAX_METHODS][1024];
    FILE *summary = NULL;
    sumo__dataset train = {0}, test = {0};
    sumo__train_summary summaries[MAX_METHODS];
    sumo__train_config configs[MAX_METHODS];
    if (comm && o.workers_given && asked != size) {
        /* Every rank sees the same flags and size, so all leave here together. */
        if (rank == 0)
            fprintf(stderr, "sumo train: --workers %d, but under %s the processes are the workers "
                            "(this job has %d): start %d with %s %s %d, or leave --workers out\n",
                    asked, how.launcher, size, asked, how.launcher,
                    strcmp(how.launcher, "srun") == 0 ? "-n" : "-np", asked);
        rc = 2;
    }
    for (int k = 0; k < o.nmethods && rc == 0; k++) {
        sumo__train_config *c = &configs[k];
        if ((rc = configure_method(&o, o.methods[k], o.scalings[k], c)) != 0) break;
        c->label = o.labels[k];
        if (o.log_path) {
            if (!method_log_path(o.log_path, o.labels[k], several, log_paths[k], sizeof log_paths[k])) {
                fprintf(stderr, "sumo train: --log %s: the path is too long\n", o.log_path);
                rc = 2;
                break;
            }
            c->log_path = log_paths[k];
            if (rank == 0) rc = check_writable(c->log_path, "log");
        }
        if (c->checkpoint_dir) {
            /* Methods of one run would otherwise write the same step-N files over each other. */
            int n = several ? snprintf(ckpt_dirs[k], sizeof ckpt_dirs[k], "%s/%s", o.cfg.checkpoint_dir, o.labels[k])
                            : snprintf(ckpt_dirs[k], sizeof ckpt_dirs[k], "%s", o.cfg.checkpoint_dir);
            if (n < 0 || (size_t)n >= sizeof ckpt_dirs[k]) {
                fprintf(stderr, "sumo train: --checkpoint-dir %s: the path is too long\n", o.cfg.checkpoint_dir);
                rc = 2;
                break;
            }
            if (several && mkdir(o.cfg.checkpoint_dir, 0755) != 0 && errno != EEXIST) {
                fprintf(stderr, "sumo train: %s: cannot create the checkpoint folder: %s\n",
                        o.cfg.checkpoint_dir, strerror(errno));
                rc = 1;
            }
            c->checkpoint_dir = ckpt_dirs[k];
            if (rc == 0 && sumo__checkpoint_prepare(c->checkpoint_dir, c->resume, o.overwrite, rank == 0,
                                                    err, sizeof err) != SUMO_SUCCESS) {
                fprintf(stderr, "sumo train: %s\n", err);
                rc = 1;
            }
        }
    }
    if (rc == 0 && rank == 0 && o.summary_path && (summary = open_summary(o.summary_path)) == NULL) rc = 1;
    if ((rc = agree(comm, size, rc)) != 0) goto out;

    sumo_result r = sumo__dataset_load(o.data_dir, true, &train, err, sizeof err);
    if (r == SUMO_SUCCESS) r = sumo__dataset_load(o.data_dir, false, &test, err, sizeof err);
    if (r != SUMO_SUCCESS) {
        fprintf(stderr, "sumo train: %s\n", err);
        rc = 1;
        goto out;
    }
    for (int k = 0; k < o.nmethods && rc == 0; k++) rc = check_outer_steps(&configs[k], o.labels[k], &train, rank == 0);
    if (rc) goto out;
    for (int k = 0; k < o.nmethods; k++) {
        sumo__train_config *c = &configs[k];
        c->store = store;
        err[0] = '\0';
        r = comm ? sumo__train_rank(&comm, -1, c, &train, &test, &summaries[k], err, sizeof err)
                     : sumo__train_threads(c, &train, &test, &summaries[k], err, sizeof err);
        if (r == SUMO_SUCCESS && summaries[k].lost) {
            /* This task left or died on purpose (--leave, --kill): the others go on. */
            fprintf(stderr, "sumo train: worker %d left at step %ld\n", rank, summaries[k].steps);
            goto out;
        }
        if (comm) sumo_comm_rank(comm, &rank);
        if (r != SUMO_SUCCESS) {
            fprintf(stderr, "sumo train: %s: %s (%s)\n", o.labels[k],
                    err[0] ? err : sumo_strerror(r), sumo_result_name(r));
            rc = 1;
            broken = true;
            goto out;
        }
    }
    if (rank == 0) {
        print_table(&o, configs, summaries);
        for (int k = 0; k < o.nmethods; k++)
            note_unsynchronised_end(o.labels[k], &configs[k], summaries[k].steps);
        for (int k = 0; k < o.nmethods; k++) {
            printf("%s: %zu parameters, fnv1a %016llx, extra memory %zu bytes", o.labels[k],
                   summaries[k].nparams, (unsigned long long)summaries[k].param_checksum,
                   summaries[k].extra_memory_bytes);
            const sumo__train_summary *s = &summaries[k];
            if (configs[k].workers > 1 && s->steps > 0)
                printf(", %.1f bytes sent per step, at most %llu in flight", (double)s->comm.bytes / (double)s->steps,
                       (unsigned long long)s->peak_bytes_in_flight);
            printf("\n");
        }
        for (int k = 0; k < o.nmethods; k++)
            if (configs[k].elastic)
                printf("%s: elastic, ended with %d workers (started with %d)\n", o.labels[k],
                       summaries[k].workers, configs[k].workers);
        /* The hashes hold for machines that agree on these (machine.h says why). */
        printf("bits depend on the code, the flags and: OpenBLAS core %s, sumo kernels %s\n",
               sumo_tool_blas_core(), sumo_tool_kernel_isa());
        if (summary) {
            FILE *f = summary;
            summary = NULL;
            if (write_summaries(f, o.summary_path, o.labels, configs, summaries, o.nmethods) != 0) rc = 1;
        }
    }
out:
    if (summary) fclose(summary);
    sumo__dataset_free(&train);
    sumo__dataset_free(&test);
#ifdef SUMO_HAVE_MPI
    if (how.kind == LAUNCH_MPI) {
        /* After a failure in training the group may be broken (a peer stopped, died or left):
         * MPI_Finalize would then wait for it forever. Only ending the job frees the others. */
        if (broken && size > 1) {
            fflush(stdout);
            fflush(stderr);
            MPI_Abort(MPI_COMM_WORLD, rc);
        }
        /* A rank that finished (--stop-after) while its peers did not cannot meet them to
         * free the communicator either: the same applies. */
        if (sumo_comm_destroy(comm) != SUMO_SUCCESS && size > 1) {
            fflush(stdout);
            fflush(stderr);
            MPI_Abort(MPI_COMM_WORLD, rc ? rc : 1);
        }
        MPI_Finalize();
        comm = NULL;
    }
#endif
    /* The store's files go once every survivor is past its last regrouping: after a
     * barrier on the final communicator (a failed one leaves them for the folder's owner). */
    if (store) {
        bool all_done = comm && rc == 0 && sumo_barrier(comm) == SUMO_SUCCESS;
        sumo_store_destroy_dir(store, all_done && rank == 0);
    }
    /* Over shared memory leaving needs nobody: the peers of a rank that failed see it gone. */
    if (comm) sumo_comm_destroy(comm);
    (void)size;
    (void)broken;
    return rc;
}
