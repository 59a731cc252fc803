/*
 * Independent references, one copy shared by the unit tests (threads) and the MPI tests.
 *
 * Each is the documented definition written out plainly, in double where the library may use
 * a narrower type, and shares no code with the library: number formats decoded with ldexp and
 * rounded with frexp/nearbyint (not bit tricks), sums as straight loops in the documented
 * order, Adasum's tree as sumo.h states it, ACGA's step as the aggregation header and its
 * design notes state it. A test compares the library with these, never with itself.
 */
#ifndef SUMO_TEST_REFERENCE_H
#define SUMO_TEST_REFERENCE_H

#include "sumo.h"
#include "sumo_aggregation.h"

#include <stddef.h>
#include <stdint.h>

/* ---- 16-bit formats: IEEE binary16 (5 exponent bits, 10 fraction bits) and bfloat16 (8/7) -- */

double ref_half_value(uint16_t h);
double ref_bf16_value(uint16_t h);
/* x rounded once to nearest even, as bits; NaN gives the canonical quiet NaN of the format. */
uint16_t ref_round_half(double x);
uint16_t ref_round_bf16(double x);
/* The value x takes once stored in dtype (rounded once, to nearest even). */
double ref_round_to(sumo_dtype dtype, double x);
/* True for a NaN pattern of the format (all-ones exponent, fraction not zero). */
int ref_is_nan_half(uint16_t h);
int ref_is_nan_bf16(uint16_t h);

/* ---- sums ----------------------------------------------------------------------------------- */

/*
 * The documented semantics of a sum or average of n values (ranks, or a kernel's inputs): added
 * left to right in the accumulator type (fp64 for fp64; fp32 for fp32, fp16 and bf16), divided
 * once by divisor when it is not 1. Returns the accumulator value (a float held exactly in the
 * double for the narrow types); storing it in the dtype is the one rounding left.
 */
double ref_sum_in_order(sumo_dtype dtype, const double *values, int n, int divisor);

/* ---- Adasum (sumo.h, SUMO_OP_ADASUM) ------------------------------------------------------- */

/* a = A(a, b) on n elements: dot products and norms in double, sums in index order, a
 * coefficient of exactly 1 where its squared norm is below sqrt(DBL_MIN). */
void ref_adasum_pair(double *a, const double *b, size_t n);
/* u[0] = the documented tree over u[0..G) (pairs (0,1) .. (2R-2, 2R-1) first when G is not a
 * power of two, then the balanced tree in order, the lower index on the left), applied per
 * tensor of the layout off[0..T] (tensor t is [off[t], off[t+1])). Overwrites u[]. */
void ref_adasum_tree(double **u, int G, const size_t *off, size_t T);

/* ---- ACGA (sumo_aggregation.h) ------------------------------------------------------------- */

typedef struct ref_acga {
    int N;          /* ranks */
    size_t K;       /* groups: tensors when per_tensor, else 1 */
    size_t *off;    /* K + 1 offsets */
    double beta, eps;
    int refperm, guard, rescale;
    int init;       /* the EMA has a value */
    double *m;      /* N * K, group-major, the sorted EMA */
} ref_acga;

/* For nranks ranks, the options o and count elements. Returns 0, or -1 when out of memory. */
int ref_acga_init(ref_acga *F, int nranks, const sumo_aggregator_options *o, size_t count);
void ref_acga_free(ref_acga *F);
/*
 * One step over every rank's input in[r][0..count): the aggregate G and, per element, the scale
 * of the rounding error an fp32 implementation may make (sum_r |c_r in_r,i|). Returns 1 when a
 * group had a non-finite coefficient: that group's G is NaN and the EMA does not advance.
 */
int ref_acga_step(ref_acga *F, float *const *in, double *G, double *bound);

#endif
