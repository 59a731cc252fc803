/* `sumo train`'s command line (train_options.h): --help, the parse, each method's settings. */
#include "train_options.h"
#include "args.h"

#include "train/idx.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
        "                         diloco, streaming-diloco, sgp, osgp, dpsgd, slowmo-sgp,\n"
        "                         slowmo-osgp, slowmo-dpsgd;\n"
        "                         several, comma-separated, are compared [avg]; METHOD@S gives\n"
        "                         that entry its own --lr-scaling S (e.g. avg@linear,adasum@2.5)\n"
        "  --optimizer O          sgd | adam | adamw | lamb [sgd]\n"
        "  --lr X                 single-worker learning rate [0.05]\n"
        "  --lr-scaling S         none | linear (x workers) | a factor such as 2.5 [none]\n"
        "  --warmup-epochs W      linear warm-up from lr to the scaled lr [0]\n"
        "  --schedule K           constant | step (x0.1 at half) | cosine [constant]\n"
        "  --momentum M --nesterov --dampening D --weight-decay W --beta1 B --beta2 B --eps E\n"
        "  The methods' own flags below are refused when no --reduce method reads them; with\n"
        "  several methods compared, each goes to those that read it, the others run without it.\n"
        "  ACGA (acga):\n"
        "           --acga-beta B --acga-per-tensor --acga-reference-permutation\n"
        "           --acga-no-guard --acga-rescale --acga-eps E\n"
        "  SlowMo (slowmo, localsgd, bmuf; --slow-beta: not localsgd):\n"
        "           --tau T --alpha A --slow-beta B --inner-period K --buffers keep|reset|average\n"
        "           --memory-efficient   (localsgd: beta 0; bmuf and slowmo: beta 0.5; tau 12)\n"
        "  Gossip bases (sgp, osgp, dpsgd alone: no exact average; slowmo-sgp, slowmo-osgp,\n"
        "  slowmo-dpsgd: SlowMo over them, tau 48, beta 0.5; SlowMo's flags but --inner-period\n"
        "  and --memory-efficient):\n"
        "           --gossip-peers P   out-peers a round on the exponential graph [1]\n"
        "           --gossip-staleness S   (osgp) steps a round stays in flight [1]\n"
        "  DiLoCo (diloco, streaming-diloco):\n"
        "           --sync-every H --fragments F --strided-fragments --fragment-ranges\n"
        "           --delay T --merge-alpha A\n"
        "           --outer nesterov|heavy-ball --outer-lr X --outer-momentum M\n"
        "           --outer-combine average|adasum|acga --quantize none|bf16|e4m3|e3m0\n"
        "           --quantize-block B   (diloco: H 500, Nesterov 0.7/0.9; streaming-diloco:\n"
        "           F 4, delay 1, merge 0.5, e3m0 in blocks of 128)\n"
        "  Adasum (adasum, adasum-delta):\n"
        "           --adasum-hierarchical --adasum-group-size G\n"
        "  An outer method (SlowMo's, DiLoCo's) whose run is shorter than its first synchronisation\n"
        "  of the whole model (--tau; --sync-every + --delay) is refused.\n"
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
        "  --store DIR            (with --elastic) this process is a worker of a job whose\n"
        "                         processes, on any hosts that share DIR, meet through it\n"
        "  --rank R               (with --store) this process's worker number of --workers N\n"
        "  --joiner               (with --store) join the running job at its next step\n"
        "The results table ends with a line per column saying what it shows; \"to target\"\n"
        "counts epochs until the test accuracy first reached --target.\n");
}

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
static int parse_methods(const char *value, train_options *o)
{
    char methods[256];
    method_list(methods, sizeof methods);
    char list[1024];
    if (strlen(value) >= sizeof list) return bad("--reduce", value);
    snprintf(list, sizeof list, "%s", value);
    o->nmethods = 0;
    o->reduce = value;
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

/* Notes a method-specific flag (config.h's table) as given; its value is parsed as any other. */
static void mark_specific(const char *flag, train_options *o)
{
    int n;
    const sumo__method_flag *t = sumo__method_flags(&n);
    for (int f = 0; f < n; f++)
        if (strcmp(flag, t[f].name) == 0) o->specific_given |= (uint64_t)1 << f;
}

/* A method-specific flag must be read by at least one --reduce method: otherwise it changes
 * nothing and the run would look like one that used it. 0, or 2 after naming the first such
 * flag, the methods chosen and those that read it. */
static int check_specific(const train_options *o)
{
    int n;
    const sumo__method_flag *t = sumo__method_flags(&n);
    unsigned chosen = 0;
    for (int k = 0; k < o->nmethods; k++) chosen |= SUMO__METHOD_BIT(o->methods[k]);
    for (int f = 0; f < n; f++) {
        if (!(o->specific_given >> f & 1) || (t[f].methods & chosen)) continue;
        char takers[256];
        sumo__method_set_text(t[f].methods, takers, sizeof takers);
        bool noted = t[f].note && (t[f].note_for & chosen);
        fprintf(stderr, "sumo train: %s applies to %s, not to %s--reduce %s%s%s%s\n", t[f].name, takers,
                o->nmethods > 1 ? "any of " : "", o->reduce, noted ? " (" : "", noted ? t[f].note : "",
                noted ? ")" : "");
        return 2;
    }
    return 0;
}

int train_parse_options(int argc, char **argv, train_options *o)
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
        mark_specific(a, o);
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
        else if (FLAG("--gossip-peers")) INT(o->gossip_peers, 1, 1023);
        else if (FLAG("--gossip-staleness")) INT(o->gossip_staleness, 1, 1000000);
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
        else if (FLAG("--store")) { NEED(); o->store_dir = v; }
        else if (FLAG("--rank")) { INT(o->store_rank, 0, 1023); o->rank_given = true; }
        else if (FLAG("--joiner")) o->joiner = true;
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
    if ((rc = check_specific(o)) != 0) return rc;
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
    if ((o->joiner || o->rank_given) && o->store_dir == NULL) {
        fprintf(stderr, "sumo train: --rank and --joiner place a process in a job that meets through "
                        "--store DIR\n");
        return 2;
    }
    if (o->store_dir && !c->elastic) {
        fprintf(stderr, "sumo train: --store DIR runs the processes of an --elastic job\n");
        return 2;
    }
    for (int i = 0; o->store_dir && i < c->nevents; i++)
        if (c->events[i].kind == SUMO__EVENT_JOIN) {
            fprintf(stderr, "sumo train: --join S adds worker threads; a process joins a --store job "
                            "with --joiner\n");
            return 2;
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
int train_configure_method(const train_options *o, sumo__method m, const char *scaling, sumo__train_config *c)
{
    *c = o->cfg;
    c->method = m;
    if (sumo__method_is_slowmo(m)) {
        sumo_diloco_options *so = &c->outer;
        bool over_gossip = m == SUMO__METHOD_SLOWMO_SGP || m == SUMO__METHOD_SLOWMO_OSGP ||
                           m == SUMO__METHOD_SLOWMO_DPSGD;
        sumo_diloco_options_default(m == SUMO__METHOD_LOCALSGD ? SUMO_DILOCO_PRESET_LOCALSGD
                                   : m == SUMO__METHOD_BMUF   ? SUMO_DILOCO_PRESET_BMUF
                                   : m == SUMO__METHOD_SGP    ? SUMO_DILOCO_PRESET_SGP
                                   : m == SUMO__METHOD_OSGP   ? SUMO_DILOCO_PRESET_OSGP
                                   : m == SUMO__METHOD_DPSGD  ? SUMO_DILOCO_PRESET_DPSGD
                                   : over_gossip              ? SUMO_DILOCO_PRESET_SLOWMO_SGP
                                                              : SUMO_DILOCO_PRESET_SLOWMO,
                                   so);
        so->base = sumo__method_gossip_base(m);
        if (o->gossip_peers > 0) so->gossip_peers = o->gossip_peers;
        if (o->gossip_staleness > 0) so->gossip_staleness = o->gossip_staleness;
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
