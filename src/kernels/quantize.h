/*
 * The codec of the compressed allreduce (sumo.h's sumo_compression): fp32 to low-bit payload
 * and back, block by block, in integer arithmetic on the bits so that every implementation
 * (this one, the CUDA table's) gives the same bits. docs/design/diloco.md states the rules;
 * in short:
 *
 *   A format is (bits, mant, emin, emax, maxsig): normal values sig * 2^(E - mant) with
 *   sig in [2^mant, 2^(mant+1)) and E in [emin, emax], subnormals sig * 2^(emin - mant) with
 *   sig < 2^mant, the largest finite value maxsig * 2^(emax - mant). Codes are IEEE-like:
 *   sign, exponent field (E - emin + 1, 0 for subnormals and zero), mantissa.
 *   A block of a scaled format carries 2^s as an fp32 (4 bytes) before its codes, s the
 *   smallest integer with max|x| <= largest * 2^s, clamped to [-149, 127]; 0 for an all-zero
 *   block, NaN for a block with NaN or Inf. bf16 has no scale (s = 0).
 *   x is coded as |x| / 2^s rounded to the nearest value of the format, a tie to the even code
 *   (lowest code bit 0: the even significand, as IEEE; for E3M0, whose codes are sign and
 *   exponent alone, the even exponent field); a result beyond the format's largest value or
 *   beyond fp32 once scaled takes the largest value that is neither.
 *   Decoding is sig * 2^(E - mant + s) formed exactly in double and rounded once to fp32.
 */
#ifndef SUMO_QUANTIZE_H
#define SUMO_QUANTIZE_H

#include "common/common.h"

typedef struct sumo__qformat {
    int bits;        /* per element: 16, 8 or 4 */
    int mant;        /* mantissa bits */
    int emin, emax;  /* exponents of the smallest and the largest normal binade */
    uint32_t maxsig; /* significand of the largest finite value, in units of 2^(emax - mant) */
    bool scaled;     /* a per-block power-of-two scale precedes the codes */
} sumo__qformat;

/* The format's parameters; false for SUMO_COMPRESS_NONE or an unknown value. */
bool sumo__qformat_of(sumo_compression_format format, sumo__qformat *q);

/* Whether block is a block size the compressed allreduce accepts (a multiple of 8 in
 * [8, 65536], so that every block's scale is 4-byte aligned and 4-bit codes fill bytes). */
static inline bool sumo__qblock_valid(size_t block)
{
    return block >= 8 && block <= 65536 && block % 8 == 0;
}

/* Payload bytes of one block of block elements. */
static inline size_t sumo__qblock_bytes(const sumo__qformat *q, size_t block)
{
    return (q->scaled ? 4 : 0) + block * (size_t)q->bits / 8;
}

/* The per-block exponent s of a block whose largest magnitude has the fp32 bits amax
 * (0 < amax < 0x7f800000). */
int sumo__qscale_exponent(const sumo__qformat *q, uint32_t amax);

/* The code of the fp32 x (finite) under the scale 2^s. */
uint32_t sumo__qencode(const sumo__qformat *q, uint32_t x, int s);

/* The fp32 value of code under the scale 2^s. */
float sumo__qdecode(const sumo__qformat *q, uint32_t code, int s);

/* The host loops behind the kernel table's quantize and dequantize (sumo_ext.h). */
void sumo__quantize(const sumo__qformat *q, size_t block, void *dst, const float *src, size_t n,
                    size_t *first);
void sumo__dequantize(const sumo__qformat *q, size_t block, float *dst, const void *src,
                      size_t n);

#endif
