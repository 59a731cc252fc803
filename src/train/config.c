/* The training run's configuration (config.h): method names, defaults, the settings as text. */
#include "train/config.h"
#include "common/common.h"

#include <stdio.h>
#include <string.h>

static const char *const method_names[SUMO__METHOD_COUNT] = {
    [SUMO__METHOD_SUM] = "sum",           [SUMO__METHOD_AVG] = "avg",
    [SUMO__METHOD_ADASUM] = "adasum",     [SUMO__METHOD_ADASUM_DELTA] = "adasum-delta",
    [SUMO__METHOD_ACGA] = "acga",         [SUMO__METHOD_SLOWMO] = "slowmo",
    [SUMO__METHOD_LOCALSGD] = "localsgd", [SUMO__METHOD_BMUF] = "bmuf",
    [SUMO__METHOD_DILOCO] = "diloco",     [SUMO__METHOD_STREAMING_DILOCO] = "streaming-diloco",
    [SUMO__METHOD_SGP] = "sgp",           [SUMO__METHOD_OSGP] = "osgp",
    [SUMO__METHOD_DPSGD] = "dpsgd",       [SUMO__METHOD_SLOWMO_SGP] = "slowmo-sgp",
    [SUMO__METHOD_SLOWMO_OSGP] = "slowmo-osgp", [SUMO__METHOD_SLOWMO_DPSGD] = "slowmo-dpsgd",
};

const char *sumo__method_name(sumo__method m)
{
    return (unsigned)m < SUMO__METHOD_COUNT ? method_names[m] : "unknown";
}

bool sumo__method_parse(const char *name, sumo__method *out)
{
    for (int m = 0; m < SUMO__METHOD_COUNT; m++)
        if (strcmp(name, method_names[m]) == 0) {
            *out = (sumo__method)m;
            return true;
        }
    return false;
}

#define BIT SUMO__METHOD_BIT
#define PLAIN_SLOWMO (BIT(SUMO__METHOD_SLOWMO) | BIT(SUMO__METHOD_LOCALSGD) | BIT(SUMO__METHOD_BMUF))
#define GOSSIP_FAMILY (BIT(SUMO__METHOD_SGP) | BIT(SUMO__METHOD_OSGP) | BIT(SUMO__METHOD_DPSGD) | \
                       BIT(SUMO__METHOD_SLOWMO_SGP) | BIT(SUMO__METHOD_SLOWMO_OSGP) |    \
                       BIT(SUMO__METHOD_SLOWMO_DPSGD))
#define SLOWMO_FAMILY (PLAIN_SLOWMO | GOSSIP_FAMILY)
#define OSGPS (BIT(SUMO__METHOD_OSGP) | BIT(SUMO__METHOD_SLOWMO_OSGP))
#define GOSSIP_NOTE "a gossip base has neither inner averaging nor the sharded state"
#define DILOCO_FAMILY (BIT(SUMO__METHOD_DILOCO) | BIT(SUMO__METHOD_STREAMING_DILOCO))
#define ADASUMS (BIT(SUMO__METHOD_ADASUM) | BIT(SUMO__METHOD_ADASUM_DELTA))
/* The outer loop's own combines are made from their defaults (sumo_diloco_create), not from
 * the run's ACGA and Adasum settings: a reader of --outer-combine would expect otherwise. */
#define ACGA_NOTE "--outer-combine acga of diloco and streaming-diloco uses ACGA's defaults, rescaled"
#define ADASUM_NOTE "--outer-combine adasum of diloco and streaming-diloco is the flat Adasum"

static const sumo__method_flag method_flags[] = {
    {"--acga-beta", BIT(SUMO__METHOD_ACGA), ACGA_NOTE, DILOCO_FAMILY},
    {"--acga-per-tensor", BIT(SUMO__METHOD_ACGA), ACGA_NOTE, DILOCO_FAMILY},
    {"--acga-reference-permutation", BIT(SUMO__METHOD_ACGA), ACGA_NOTE, DILOCO_FAMILY},
    {"--acga-no-guard", BIT(SUMO__METHOD_ACGA), ACGA_NOTE, DILOCO_FAMILY},
    {"--acga-rescale", BIT(SUMO__METHOD_ACGA), ACGA_NOTE, DILOCO_FAMILY},
    {"--acga-eps", BIT(SUMO__METHOD_ACGA), ACGA_NOTE, DILOCO_FAMILY},
    {"--tau", SLOWMO_FAMILY, NULL, 0},
    {"--alpha", SLOWMO_FAMILY, NULL, 0},
    /* Local SGD is SlowMo without slow momentum: its beta stays 0. */
    {"--slow-beta", BIT(SUMO__METHOD_SLOWMO) | BIT(SUMO__METHOD_BMUF), "localsgd is SlowMo with beta 0",
     BIT(SUMO__METHOD_LOCALSGD)},
    {"--inner-period", PLAIN_SLOWMO, GOSSIP_NOTE, GOSSIP_FAMILY},
    {"--buffers", SLOWMO_FAMILY, NULL, 0},
    {"--memory-efficient", PLAIN_SLOWMO, GOSSIP_NOTE, GOSSIP_FAMILY},
    {"--gossip-peers", GOSSIP_FAMILY, NULL, 0},
    {"--gossip-staleness", OSGPS, "only OSGP overlaps its rounds", GOSSIP_FAMILY},
    {"--sync-every", DILOCO_FAMILY, NULL, 0},
    {"--fragments", DILOCO_FAMILY, NULL, 0},
    {"--strided-fragments", DILOCO_FAMILY, NULL, 0},
    {"--fragment-ranges", DILOCO_FAMILY, NULL, 0},
    {"--delay", DILOCO_FAMILY, NULL, 0},
    {"--merge-alpha", DILOCO_FAMILY, NULL, 0},
    {"--outer", DILOCO_FAMILY, NULL, 0},
    {"--outer-lr", DILOCO_FAMILY, NULL, 0},
    {"--outer-momentum", DILOCO_FAMILY, NULL, 0},
    {"--outer-combine", DILOCO_FAMILY, NULL, 0},
    {"--quantize", DILOCO_FAMILY, NULL, 0},
    {"--quantize-block", DILOCO_FAMILY, NULL, 0},
    {"--adasum-hierarchical", ADASUMS, ADASUM_NOTE, DILOCO_FAMILY},
    {"--adasum-group-size", ADASUMS, ADASUM_NOTE, DILOCO_FAMILY},
};
_Static_assert(sizeof method_flags / sizeof method_flags[0] <= 64, "a set of given flags is a 64-bit mask");
_Static_assert(SUMO__METHOD_COUNT <= 32, "a set of methods is an unsigned mask");

const sumo__method_flag *sumo__method_flags(int *count)
{
    *count = (int)(sizeof method_flags / sizeof method_flags[0]);
    return method_flags;
}

void sumo__method_set_text(unsigned methods, char *out, size_t len)
{
    int total = 0, seen = 0;
    for (int m = 0; m < SUMO__METHOD_COUNT; m++) total += (methods & BIT(m)) != 0;
    size_t used = 0;
    if (len) out[0] = '\0';
    for (int m = 0; m < SUMO__METHOD_COUNT && used < len; m++) {
        if (!(methods & BIT(m))) continue;
        const char *sep = seen == 0 ? "" : seen == total - 1 ? " and " : ", ";
        int n = snprintf(out + used, len - used, "%s%s", sep, method_names[m]);
        if (n < 0) break;
        used += (size_t)n;
        seen++;
    }
}
#undef BIT

void sumo__train_config_default(sumo__train_config *cfg)
{
    *cfg = (sumo__train_config){
        .workers = 1, .model = SUMO__MODEL_MLP, .hidden = 128, .batch = 64, .epochs = 1,
        .seed = 1, .method = SUMO__METHOD_AVG, .lr = 0.05, .lr_scale = 1.0,
        .schedule = SUMO_LR_CONSTANT,
    };
    sumo_optimizer_options_default(SUMO_OPTIM_SGD, &cfg->optim);
    cfg->optim.momentum = 0.9;
    cfg->optim.check_finite = 0; /* divergence is detected from the agreed loss instead */
    sumo_aggregator_options agg;
    sumo_aggregator_options_default(SUMO_AGGREGATE_ACGA, &agg);
    cfg->acga = agg.acga;
    sumo_diloco_options_default(SUMO_DILOCO_PRESET_SLOWMO, &cfg->outer);
    cfg->buffers = SUMO_BUFFERS_KEEP;
}

/*
 * The settings that decide the trajectory, one "--flag value" per line as the user would
 * give them: a resumed run must use the same ones. Only what the method uses is listed, and
 * --epochs only where the schedule depends on the run's length: with a constant rate more
 * epochs simply continue the same trajectory. The text is stored with the checkpoint, so a
 * refusal can name the flags that differ.
 */
/* A text longer than len is cut by design (PUT clamps at the end of the buffer, and the caller
 * compares texts made the same way), which GCC cannot see once len is a parameter. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-truncation"
void sumo__train_config_text(const sumo__train_config *c, char *out, size_t len)
{
    static const char *const schedules[] = {[SUMO_LR_CONSTANT] = "constant", [SUMO_LR_STEP] = "step",
                                            [SUMO_LR_COSINE] = "cosine"};
    static const char *const buffers[] = {[SUMO_BUFFERS_KEEP] = "keep", [SUMO_BUFFERS_RESET] = "reset",
                                          [SUMO_BUFFERS_AVERAGE] = "average"};
    size_t used = 0;
    out[0] = '\0';
#define PUT(...) do { \
        int w_ = snprintf(out + used, len - used, __VA_ARGS__); \
        if (w_ > 0) used = (size_t)w_ < len - used ? used + (size_t)w_ : len - 1; \
    } while (0)
    const sumo_optimizer_options *o = &c->optim;
    PUT("--workers %d\n--model %s\n--hidden %d\n--batch %d\n", c->workers,
        c->model == SUMO__MODEL_CNN ? "cnn" : "mlp", c->hidden, c->batch);
    if (c->schedule != SUMO_LR_CONSTANT) PUT("--epochs %d\n", c->epochs);
    PUT("--seed %llu\n--reduce %s\n--optimizer %s\n", (unsigned long long)c->seed,
        sumo__method_name(c->method), sumo_optimizer_kind_name(o->kind));
    PUT("--lr %.17g\n--lr-scaling %.17g\n--warmup-epochs %.17g\n--schedule %s\n", c->lr, c->lr_scale,
        c->warmup_epochs, (unsigned)c->schedule < 3 ? schedules[c->schedule] : "?");
    PUT("--momentum %.17g\n--dampening %.17g\n--nesterov %d\n--weight-decay %.17g\n", o->momentum,
        o->dampening, o->nesterov, o->weight_decay);
    PUT("--beta1 %.17g\n--beta2 %.17g\n--eps %.17g\n", o->beta1, o->beta2, o->eps);
    if (c->method == SUMO__METHOD_ACGA)
        PUT("--acga-beta %.17g\n--acga-per-tensor %d\n--acga-reference-permutation %d\n"
            "--acga-guard %d\n--acga-rescale %d\n--acga-eps %.17g\n", c->acga.beta, c->acga.per_tensor,
            c->acga.reference_permutation, c->acga.negative_guard, c->acga.rescale, c->acga.eps);
    if (sumo__method_is_slowmo(c->method))
        PUT("--tau %d\n--inner-period %d\n--alpha %.17g\n--slow-beta %.17g\n--buffers %s\n"
            "--memory-efficient %d\n", c->outer.sync_every, c->outer.inner_period, c->outer.lr,
            c->outer.momentum, (unsigned)c->buffers < 3 ? buffers[c->buffers] : "?",
            c->outer.memory_efficient);
    if (sumo__method_gossip_base(c->method) != SUMO_BASE_LOCAL)
        PUT("--gossip-peers %d\n--gossip-staleness %d\n", c->outer.gossip_peers,
            c->outer.gossip_staleness);
    if (sumo__method_is_diloco(c->method)) {
        static const char *const outers[] = {[SUMO_OUTER_NESTEROV] = "nesterov",
                                             [SUMO_OUTER_HEAVY_BALL] = "heavy-ball"};
        static const char *const combines[] = {[SUMO_COMBINE_AVERAGE] = "average",
                                               [SUMO_COMBINE_ADASUM] = "adasum",
                                               [SUMO_COMBINE_ACGA] = "acga"};
        static const char *const formats[] = {[SUMO_COMPRESS_NONE] = "none", [SUMO_COMPRESS_BF16] = "bf16",
                                              [SUMO_COMPRESS_FP8_E4M3] = "e4m3",
                                              [SUMO_COMPRESS_E3M0] = "e3m0"};
        const sumo_diloco_options *d = &c->outer;
        PUT("--sync-every %d\n--fragments %d\n--strided-fragments %d\n--fragment-ranges %d\n"
            "--delay %d\n--merge-alpha %.17g\n--outer %s\n--outer-lr %.17g\n--outer-momentum %.17g\n"
            "--outer-combine %s\n--quantize %s\n--quantize-block %zu\n", d->sync_every, d->fragments,
            c->diloco_strided, d->split == SUMO_SPLIT_RANGES,
            d->delay, d->merge_alpha, (unsigned)d->outer < 2 ? outers[d->outer] : "?", d->lr,
            d->momentum, (unsigned)d->combine < 3 ? combines[d->combine] : "?",
            (unsigned)d->compression < 4 ? formats[d->compression] : "?", d->block_size);
    }
    if (c->method == SUMO__METHOD_ADASUM || c->method == SUMO__METHOD_ADASUM_DELTA)
        PUT("--adasum-hierarchical %d\n--adasum-group-size %d\n", c->adasum_hierarchical,
            c->adasum_group_size);
    PUT("--eval-every %d\n--train-limit %zu\n--test-limit %zu\n", c->eval_every, c->train_limit,
        c->test_limit);
#undef PUT
}
#pragma GCC diagnostic pop

