/*
 * sumo aggregation: how the workers' gradients (or optimizer deltas) are combined into one.
 *
 * An aggregator is an object because some methods keep state across steps (ACGA's coefficient
 * momentum); the stateless ones (sum, average, Adasum) are thin wrappers over the collectives.
 * Every rank creates its aggregator with the same options and calls apply with its own buffer;
 * afterwards every rank holds the same, bit-identical result.
 *
 * The buffer is cut into tensors by a layout (per-tensor element counts, as a model's
 * parameters are): Adasum combines each tensor with its own coefficients, and ACGA can work
 * per tensor or on the whole model.
 */
#ifndef SUMO_AGGREGATION_H
#define SUMO_AGGREGATION_H

#include "sumo.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum sumo_aggregation {
    SUMO_AGGREGATE_SUM = 0,
    SUMO_AGGREGATE_AVERAGE = 1,
    SUMO_AGGREGATE_ADASUM = 2,
    SUMO_AGGREGATE_ACGA = 3,
    SUMO_AGGREGATE_COUNT
} sumo_aggregation;

/*
 * ACGA (Choukroun et al., arXiv 2411.03742, read from the authors' sample code): weights
 * w_r = a'_r / sum(a') with a_r = <g_r, sum_j g_j> / (|g_r| + eps) / N, smoothed over steps on
 * the sorted coefficients, and G = sum_r w_r g_r / (|g_r| + eps). Defaults match the reference
 * except the permutation, whose reference form is a bug for N >= 3 (docs/design/acga.md).
 */
typedef struct sumo_acga_options {
    size_t struct_size;        /* sizeof(sumo_acga_options); sumo_acga_options_default (and so
                                  sumo_aggregator_options_default) sets it */
    double beta;               /* coefficient momentum in [0, 1); default 0 (the reference) */
    int per_tensor;            /* 1: one coefficient per worker and tensor; default 0 (whole model) */
    int reference_permutation; /* 1: map smoothed sorted values back as the sample code does
                                  (m[idx]); default 0: rank-preserving */
    int negative_guard;        /* 1 (default): shift coefficients by their minimum when it is
                                  negative, as the TensorFlow variant does */
    int rescale;               /* NOT from the paper. 1: scale G to the norm of the mean
                                  gradient, so learning rates tuned for averaging carry over;
                                  default 0 */
    double eps;                /* added to each gradient norm; default 1e-8 */
} sumo_acga_options;

/* The defaults documented above. */
SUMO_API sumo_result sumo_acga_options_default(sumo_acga_options *options);

typedef struct sumo_aggregator_options {
    size_t struct_size;          /* sizeof(sumo_aggregator_options); the default sets it */
    sumo_aggregation method;
    const size_t *tensor_counts; /* layout, copied; NULL with ntensors 0: one tensor */
    size_t ntensors;
    int adasum_hierarchical;     /* see sumo_adasum_options */
    int adasum_group_size;
    sumo_acga_options acga;
} sumo_aggregator_options;

/* Defaults for method (ACGA's as documented above). */
SUMO_API sumo_result sumo_aggregator_options_default(sumo_aggregation method, sumo_aggregator_options *options);

typedef struct sumo_aggregator sumo_aggregator;

/* Collective over comm: every rank creates its aggregator in the same order, and ranks whose
 * method, layout or options differ all get SUMO_ERR_MISMATCH (invalid options on any rank:
 * SUMO_ERR_INVALID_ARGUMENT on every rank), whatever the number of ranks. The comm is
 * borrowed and must outlive the aggregator. */
SUMO_API sumo_result sumo_aggregator_create(sumo_comm *comm, const sumo_aggregator_options *options,
                                   sumo_aggregator **aggregator);
SUMO_API sumo_result sumo_aggregator_destroy(sumo_aggregator *aggregator);

/*
 * Combines every rank's buffer in place; count must equal the layout's total. fp32 for every
 * method; the stateless methods also take fp64, fp16 and bf16. A failure of the collective is
 * returned as is. NaN/Inf: Adasum and ACGA return SUMO_ERR_NONFINITE on every rank, that
 * tensor's result is NaN and the others are exact (ACGA's momentum does not advance). A
 * degenerate ACGA step (all-zero gradients, a coefficient sum at or below 1e-6 of the sum of
 * their magnitudes) falls back to uniform weights, the average of the unit-normalised
 * gradients, and succeeds (see acga.c).
 */
SUMO_API sumo_result sumo_aggregator_apply(sumo_aggregator *aggregator, void *buffer, size_t count,
                                  sumo_dtype dtype);

/*
 * The same out of place: every rank's sendbuf combined into its recvbuf (sendbuf is only read;
 * sendbuf == recvbuf is in place, other overlaps are refused). Over MPI on one node, receive
 * buffers from sumo_mem_alloc on every rank serve as the staging areas (sumo.h).
 */
SUMO_API sumo_result sumo_aggregator_apply_into(sumo_aggregator *aggregator, const void *sendbuf,
                                       void *recvbuf, size_t count, sumo_dtype dtype);

/*
 * The same, asynchronous: queued on the communicator like sumo_allreduce_start (in order with
 * its other requests), completed by sumo_request_wait / sumo_request_test. The buffers stay
 * untouched until then; the aggregator is not used by anything else meanwhile.
 */
SUMO_API sumo_result sumo_aggregator_apply_start(sumo_aggregator *aggregator, const void *sendbuf,
                                        void *recvbuf, size_t count, sumo_dtype dtype,
                                        sumo_request **request);

/* State carried across steps, for checkpoints (0 bytes for the stateless methods). */
SUMO_API sumo_result sumo_aggregator_state_size(const sumo_aggregator *aggregator, size_t *bytes);
SUMO_API sumo_result sumo_aggregator_state_save(const sumo_aggregator *aggregator, void *buffer,
                                       size_t bytes);
SUMO_API sumo_result sumo_aggregator_state_load(sumo_aggregator *aggregator, const void *buffer,
                                       size_t bytes);

/* What apply has sent so far: collective calls and payload bytes per rank. */
SUMO_API sumo_result sumo_aggregator_stats(const sumo_aggregator *aggregator, sumo_comm_stats *stats);

#ifdef __cplusplus
}
#endif

#endif
