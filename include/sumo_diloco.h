/*
 * sumo's outer loop: local steps, then an exchange and an outer optimizer step, as an object
 * driven around the caller's own local step. One loop serves the whole family:
 *   SlowMo (Wang et al., ICLR 2020): the heavy-ball outer step, optional inner averaging
 *     every inner_period steps, optionally sharded state (memory_efficient); Local SGD and
 *     BMUF are its presets;
 *   DiLoCo (Douillard et al., arXiv 2311.08105): the Nesterov outer step;
 *   Streaming DiLoCo (arXiv 2501.18512): fragments synced in turn, overlapped exchanges,
 *     merged results, compressed outer gradients.
 * The distributed optimizer (sumo_distributed.h) drives this object around sumo's own base
 * optimizers; a binding drives it around its own (sumo.torch's SlowMo and DiLoCo).
 *
 * Every rank takes local steps on its own data. The parameters are cut into F fragments
 * (whole tensors of the layout, or F equal ranges of the flat vector: `split`); fragment f is
 * synchronised every H local steps, at the ends of steps k = floor((f + 1) H / F) + j H,
 * j >= 0 (fragment F - 1 at H, 2H, ...: with F = 1 DiLoCo's schedule). A synchronisation of
 * fragment f:
 *   at its step k:     the exchange starts (asynchronously): the fragment's parameters, or its
 *                      outer gradient Delta_r = anchor_f - theta_f, combined over the ranks;
 *   at step k + delay: the result (Delta = anchor_f - average, or the combined Delta) makes
 *                      the outer step from the anchor, theta_global = OuterOpt(anchor_f, Delta),
 *                      which becomes the new anchor, and the local fragment becomes
 *                      merge_alpha * theta_local + (1 - merge_alpha) * theta_global.
 * delay 0 is blocking. With delay > 0 the local steps in between overlap the exchange: compute
 * waits only if the exchange is late. At most one exchange is in flight (delay <= H / F).
 *
 * Outer step (per element, in double from the stored values, each store rounded once; the
 * kernel table's outer_update, sumo_ext.h):
 *   NESTEROV    v = mu v + Delta;          theta = anchor - lr (Delta + mu v)   (torch's
 *               SGD(nesterov=True), DiLoCo's outer optimizer)
 *   HEAVY_BALL  u = beta u + Delta / gamma; theta = anchor - alpha gamma u      (SlowMo, gamma
 *               the rate passed to end on the synchronisation step; lr is alpha, momentum beta)
 *
 * Between synchronisations (F 1, delay 0 only), inner_period > 0 averages every parameter
 * exactly at the end of every inner_period-th step that is not a synchronisation (SlowMo's
 * Local SGD base). memory_efficient shards the anchors and momenta over the ranks: rank r keeps
 * the elements [r s, (r + 1) s), s = floor(n / N), and every rank the n mod N last ones; the
 * synchronisation averages the whole vector in place, each rank takes the outer step of its
 * own elements, and an allgather rebuilds the vector: the same bits, 2 (s + n mod N) elements
 * of state instead of 2 n + the exchange buffer.
 *
 * What travels, and the combine:
 *   AVERAGE, no compression: the fragment's parameters, averaged exactly (SlowMo's exchange,
 *     whose bits the outer step then reproduces);
 *   AVERAGE with compression: Delta_r through sumo_allreduce_compressed (fp32 accumulation);
 *   ADASUM: Delta_r combined by Adasum per tensor of the fragment (sumo_aggregation.h);
 *   ACGA:   Delta_r combined by ACGA over the fragment (its options: acga, or the defaults).
 *
 * Around each local step the caller takes itself:
 *   sumo_diloco_begin(d, params)        before it: takes the anchors on the first call;
 *   (the local step)
 *   sumo_diloco_end(d, params, lr, &c)  after it: applies the exchange due at this step, then
 *                                       starts the one due (collective then; *c says so).
 * Every call of end counts one local step. sumo_diloco_due tells a caller that keeps its
 * parameters elsewhere (a binding) whether the next end reads them and which fragment.
 * params hold the layout's elements of dtype (fp32, or fp64 without compression) in any
 * memory the communicator has kernels for; the object's state lives in that memory too.
 */
#ifndef SUMO_DILOCO_H
#define SUMO_DILOCO_H

#include "sumo.h"
#include "sumo_aggregation.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum sumo_outer_optimizer {
    SUMO_OUTER_NESTEROV = 0,
    SUMO_OUTER_HEAVY_BALL = 1,
} sumo_outer_optimizer;

typedef enum sumo_outer_combine {
    SUMO_COMBINE_AVERAGE = 0,
    SUMO_COMBINE_ADASUM = 1,
    SUMO_COMBINE_ACGA = 2,
} sumo_outer_combine;

/* How the parameters are cut into fragments. */
typedef enum sumo_fragment_split {
    /* Whole tensors: contiguous runs in model order, each as near n / F elements as the tensors
     * allow, or the caller's fragment_of. F is at most the number of tensors, and a tensor
     * larger than n / F makes its fragment (and the peak in flight) larger. */
    SUMO_SPLIT_TENSORS = 0,
    /* F ranges of the flat parameter vector, [floor(f n / F), floor((f + 1) n / F)), cutting
     * tensors where a boundary falls: every fragment n / F elements, whatever the layout.
     * Adasum and ACGA then see the pieces of tensors in a fragment as its tensors. */
    SUMO_SPLIT_RANGES = 1,
} sumo_fragment_split;

/* The base algorithm of the local steps (docs/design/gossip.md): plain local steps, or a
 * gossip round over the dynamic directed exponential graph after each local step
 * (sumo_gossip.h). With a gossip base the loop needs one fragment, delay 0, merge 0, the
 * uncompressed average, no inner averaging and no sharding; sync_every 0 then means no exact
 * average at all (SGP, OSGP or D-PSGD alone), and sync_every H > 0 the exact average and the
 * outer step every H steps (SlowMo over the base). */
typedef enum sumo_diloco_base {
    SUMO_BASE_LOCAL = 0, /* local steps alone (Local SGD, SlowMo, BMUF, DiLoCo) */
    SUMO_BASE_SGP = 1,   /* x <- mix(x - lr g): a push-sum round after the step */
    SUMO_BASE_OSGP = 2,  /* the round overlapped: started after one step, its shares added
                            gossip_staleness steps later; the parameters are z = x / w */
    SUMO_BASE_DPSGD = 3, /* x <- mix(x) - lr g: symmetric mixing of the pre-step parameters */
} sumo_diloco_base;

typedef struct sumo_diloco_options {
    size_t struct_size;          /* sizeof(sumo_diloco_options); the presets set it */
    int sync_every;              /* H >= 1: local steps between two syncs of one fragment */
    int fragments;               /* F in [1, H]; with SUMO_SPLIT_TENSORS at most the number of
                                    tensors, with SUMO_SPLIT_RANGES at most n */
    sumo_fragment_split split;
    /* SUMO_SPLIT_TENSORS only. NULL: the contiguous split above. Else tensor t belongs to
     * fragment_of[t] (ntensors entries, every fragment non-empty; e.g. t % F for the paper's
     * strided pattern). Copied at create. */
    const int *fragment_of;
    int delay;                   /* tau in [0, H / F]: local steps between start and use */
    double merge_alpha;          /* in [0, 1]: 0 takes the global value */
    sumo_outer_optimizer outer;
    double lr;                   /* NESTEROV: the outer rate, > 0; HEAVY_BALL: alpha, > 0 */
    double momentum;             /* NESTEROV: mu; HEAVY_BALL: beta; in [0, 1) */
    sumo_outer_combine combine;
    sumo_compression_format compression; /* SUMO_COMPRESS_NONE: fp32; else AVERAGE only */
    size_t block_size;           /* compression's elements per scale (sumo_compression) */
    const sumo_acga_options *acga; /* ACGA's options (start from sumo_acga_options_default,
                                      which sets struct_size), copied; NULL: sumo's defaults
                                      with rescale 1 (the outer step needs the change's size,
                                      not the unit norm of ACGA's plain result) */
    int inner_period;            /* >= 0: average every inner_period steps between syncs (0:
                                    never); > 0 needs F 1, delay 0, the uncompressed average,
                                    and H a multiple of it */
    int memory_efficient;        /* 0 or 1: shard the anchors and momenta (above); 1 needs F 1,
                                    delay 0, merge 0 and the uncompressed average */
    sumo_diloco_base base;       /* SUMO_BASE_LOCAL, or a gossip base (above) */
    int gossip_peers;            /* a gossip base's out-peers a round, in [1, n - 1] (1) */
    int gossip_staleness;        /* SUMO_BASE_OSGP: steps a round stays in flight, >= 1 (1) */
    int gossip_per_node;         /* 0 or 1: base SGP or OSGP on a two-level communicator: the
                                    nodes gossip, each round after the node's average
                                    (sumo_gossip.h's per_node; fairscale's nprocs_per_node
                                    > 1) (0) */
} sumo_diloco_options;

typedef enum sumo_diloco_preset {
    SUMO_DILOCO_PRESET_DILOCO = 0,    /* H 500, Nesterov lr 0.7 momentum 0.9 (the paper's) */
    SUMO_DILOCO_PRESET_STREAMING = 1, /* DiLoCo's, with F 4, delay 1, merge 0.5 and E3M0 in
                                         blocks of 128: a starting point, not the paper's tuned
                                         values (set F from the model's tensors) */
    SUMO_DILOCO_PRESET_LOCALSGD = 2,  /* H 12, heavy ball alpha 1 beta 0: model averaging */
    SUMO_DILOCO_PRESET_SLOWMO = 3,    /* H 12, heavy ball alpha 1 beta 0.5, no inner averaging
                                         (the paper's alpha, fairscale's beta) */
    SUMO_DILOCO_PRESET_BMUF = 4,      /* block momentum over plain local steps: SLOWMO's values
                                         (Chen and Huo's block learning rate 1, momentum 0.5) */
    SUMO_DILOCO_PRESET_SGP = 5,       /* SGP alone: base SGP, no exact average (sync_every 0),
                                         heavy ball alpha 1 beta 0 */
    SUMO_DILOCO_PRESET_OSGP = 6,      /* OSGP alone: base OSGP, staleness 1, no exact average */
    SUMO_DILOCO_PRESET_DPSGD = 7,     /* D-PSGD alone: base D-PSGD, no exact average */
    SUMO_DILOCO_PRESET_SLOWMO_SGP = 8, /* SlowMo over SGP: tau 48 (the paper's with gossip
                                         bases), alpha 1, beta 0.5; set base for OSGP or
                                         D-PSGD */
} sumo_diloco_preset;

SUMO_API sumo_result sumo_diloco_options_default(sumo_diloco_preset preset,
                                                sumo_diloco_options *options);

typedef struct sumo_diloco sumo_diloco;

/*
 * Collective over comm: ranks whose options, layout or dtype differ all get
 * SUMO_ERR_MISMATCH; invalid options on any rank give SUMO_ERR_INVALID_ARGUMENT on every rank
 * (the rank's message says why). tensor_counts (copied) is the layout, ntensors >= 1 (NULL
 * with ntensors 0: one tensor of nparams elements, F must then be 1); nparams its total.
 */
SUMO_API sumo_result sumo_diloco_create(sumo_comm *comm, const size_t *tensor_counts,
                                        size_t ntensors, size_t nparams, sumo_dtype dtype,
                                        const sumo_diloco_options *options, sumo_diloco **out);
/* Waits for an exchange in flight, then frees. NULL is fine. */
SUMO_API sumo_result sumo_diloco_destroy(sumo_diloco *diloco);

SUMO_API sumo_result sumo_diloco_begin(sumo_diloco *diloco, const void *params);
/*
 * After a local step at rate lr. SUMO_ERR_INVALID_ARGUMENT (nothing counted) for lr not
 * finite or negative, or lr 0 where a HEAVY_BALL exchange starts (its outer step divides by
 * it); SUMO_ERR_INVALID_USAGE before the first begin. An outer step whose result (the anchor,
 * the same on every rank) is not finite completes and returns SUMO_ERR_NONFINITE on every
 * rank alike, as does a combine that refuses NaN or Inf; other failures of the exchange are
 * returned as the collective gave them.
 */
SUMO_API sumo_result sumo_diloco_end(sumo_diloco *diloco, void *params, double lr,
                                     int *communicated);

/* What the next end does: a mask of SUMO_DILOCO_APPLY (it reads and writes the parameters of
 * fragment *applied), SUMO_DILOCO_START (it reads those of fragment *started; with delay 0
 * the same fragment, applied at once) and SUMO_DILOCO_AVERAGE (an inner average: it reads and
 * writes every parameter), or SUMO_DILOCO_LOCAL (params are not touched). A fragment not
 * concerned is -1; either pointer may be NULL. */
enum { SUMO_DILOCO_LOCAL = 0, SUMO_DILOCO_APPLY = 1, SUMO_DILOCO_START = 2,
       SUMO_DILOCO_AVERAGE = 4 };
SUMO_API sumo_result sumo_diloco_due(const sumo_diloco *diloco, int *what, int *applied,
                                     int *started);

/* The elements of fragment f: *count of them in *nruns runs of consecutive parameters
 * (offsets and lengths in elements, model order), for a caller that moves fragments itself. */
SUMO_API sumo_result sumo_diloco_fragment(const sumo_diloco *diloco, int f, size_t *count,
                                          size_t *nruns);
SUMO_API sumo_result sumo_diloco_fragment_runs(const sumo_diloco *diloco, int f, size_t *offsets,
                                               size_t *lengths, size_t nruns);

/* Whether every rank holds the same parameters after the last end (one rank; an inner
 * average; or F = 1, merge 0 and this end applied the exchange). */
SUMO_API sumo_result sumo_diloco_synchronized(const sumo_diloco *diloco, int *synchronized);

/*
 * Anchors, outer momenta, the schedule's position and an exchange in flight (save waits for
 * it to complete and keeps its result: the run resumed from the state applies it at the same
 * step with the same bits; save returns the error of one that failed, whose state no run
 * could resume from), plus ACGA's state. Load refuses a state of another layout, F,
 * split, H, delay, inner period, combine, compression or dtype, and a sharded state of
 * another rank or number of ranks (an unsharded one is the same on every rank and loads with
 * any number).
 */
SUMO_API sumo_result sumo_diloco_state_size(const sumo_diloco *diloco, size_t *bytes);
SUMO_API sumo_result sumo_diloco_state_save(sumo_diloco *diloco, void *buffer, size_t bytes);
SUMO_API sumo_result sumo_diloco_state_load(sumo_diloco *diloco, const void *buffer,
                                            size_t bytes);

/* Exchanges so far (the combine's rounds and payload bytes per rank, inner averages and the
 * sharded mode's allgathers included; compressed: the payload of this rank's input,
 * sumo_compressed_bytes). */
SUMO_API sumo_result sumo_diloco_stats(const sumo_diloco *diloco, sumo_comm_stats *stats);
/* Extra memory beyond the parameters: anchors and momenta (2 n elements), a gossip base's
 * buffers (SGP 3 n, OSGP 4 n, D-PSGD 5 n: the round's share, receive and sum buffers, OSGP's
 * numerator, D-PSGD's pre-step parameters and step) and the exchange buffer (the largest
 * fragment; none with one fragment, delay 0, merge 0 and the uncompressed average, which
 * averages the parameters in place); sharded: 2 (s + n mod N) elements. */
SUMO_API sumo_result sumo_diloco_extra_memory(const sumo_diloco *diloco, size_t *bytes);

#ifdef __cplusplus
}
#endif

#endif
