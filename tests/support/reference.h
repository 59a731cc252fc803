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

/* ---- the compressed allreduce's formats (sumo.h's sumo_compression) ---------------------- */

/*
 * Written from the definitions in sumo.h, by enumeration: the non-negative finite codes of a
 * format in increasing order (E3M0: 0 and 2^-2 .. 2^4; E4M3FN: 0x00 .. 0x7e; bf16: 0x0000 ..
 * 0x7f7f), each code's value by ldexp; rounding is a search for the nearest value (a tie to
 * the even code), not bit arithmetic.
 */
uint32_t ref_code_count(sumo_compression_format f); /* non-negative finite codes */
int ref_code_bits(sumo_compression_format f);
double ref_code_value(sumo_compression_format f, uint32_t code); /* code < ref_code_count */
/* The block scale exponent: the smallest s in [-149, 127] with amax <= largest * 2^s (0 for
 * bf16, which has no scale). */
int ref_scale_exponent(sumo_compression_format f, double amax);
/* x (finite) coded under 2^s: the nearest value, a tie to the even code, never beyond the
 * largest value nor beyond FLT_MAX once scaled; the sign bit above the magnitude's bits. */
uint32_t ref_encode(sumo_compression_format f, float x, int s);
float ref_decode(sumo_compression_format f, uint32_t code, int s);
/* n values through the codec in blocks of `block`: out (may be in) gets what decoding gives (an
 * all-zero block +0, a block with NaN or Inf NaN); returns the index of the first non-finite
 * input, or SIZE_MAX. */
size_t ref_roundtrip(sumo_compression_format f, size_t block, const float *in, float *out,
                     size_t n);

#endif
