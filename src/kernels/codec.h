/*
 * sumo's number formats at the bit level, one source for the host and the device: fp16 and
 * bf16 to and from fp32 (and from fp64 with a single rounding), and the compressed
 * allreduce's block codec (sumo.h's sumo_compression).
 *
 * Why a header of the library's is shared with the CUDA plugin (cuda/), which otherwise
 * builds on the public headers alone: these functions are the facts both must get to the same
 * bit, and a second copy in the plugin was a second place for them to drift apart. So every
 * function here is header-only and compiles as C11 for the host and as CUDA C++ for both
 * sides: SUMO__HD is `__host__ __device__` (force-inlined, as the kernels' own helpers) under
 * nvcc and `static inline` in C (NCCL's bitops.h pattern). What that asks of this file: it
 * includes only sumo.h and the C library (never another header of src/), uses no compound
 * literals (C++ has none), and is integer arithmetic on the bits but for a few conversions
 * that are exact or round once, with no product left for a compiler to fuse (the plugin
 * builds with -fmad=false, the host with -ffp-contract=off), so that neither the FP
 * environment nor the compiler changes a result. Where the device has its own instruction for
 * a bit count (__CUDA_ARCH__), it gives the same integer.
 *
 * The block codec's rules (docs/design/diloco.md states them in full):
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
#ifndef SUMO_KERNELS_CODEC_H
#define SUMO_KERNELS_CODEC_H

#include "sumo.h"

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define SUMO__HD static __host__ __device__ __forceinline__
#else
#define SUMO__HD static inline
#endif

/* ---- bits -------------------------------------------------------------------------------- */

SUMO__HD uint32_t sumo__f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

SUMO__HD float sumo__f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

SUMO__HD uint64_t sumo__f64_bits(double d)
{
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    return u;
}

SUMO__HD double sumo__f64_from_bits(uint64_t u)
{
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}

/* ---- fp16 and bf16 ----------------------------------------------------------------------- */

SUMO__HD float sumo__half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (exp == 0x1f) /* NaNs come out quiet, as F16C's vcvtph2ps makes them: paths agree */
        return sumo__f32_from_bits(sign | 0x7f800000u | (mant << 13) | (mant ? 0x00400000u : 0));
    if (exp == 0) /* zero or subnormal: mant * 2^-24 is exact in fp32 */
        return sumo__f32_from_bits(sign | sumo__f32_bits((float)mant * 0x1p-24f));
    return sumo__f32_from_bits(sign | ((exp + 112) << 23) | (mant << 13));
}

/* Integer rounding, so the result does not depend on the FP environment (FTZ, rounding mode)
 * and matches vcvtps2ph with round-to-nearest-even bit for bit, NaN payloads included. */
SUMO__HD uint16_t sumo__float_to_half(float f)
{
    uint32_t u = sumo__f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 ties up to Inf */
    if (a >= 0x38800000u) {                                 /* a normal half */
        uint32_t r = a - 0x38000000u;                       /* exponent bias 127 -> 15 */
        r += 0x0fffu + ((r >> 13) & 1u);                    /* a carry may bump the exponent */
        return (uint16_t)(sign | (r >> 13));
    }
    uint32_t e = a >> 23;
    if (e < 102) return sign; /* below 2^-25: rounds to zero */
    /* Half subnormal: the value in units of 2^-24 is m * 2^(e-126), here m >> s. A result
     * of 1024 is the smallest normal's encoding, so rounding up across the boundary works. */
    uint32_t m = (a & 0x7fffffu) | 0x800000u, s = 126 - e;
    uint32_t q = m >> s, rem = m & ((1u << s) - 1), halfway = 1u << (s - 1);
    if (rem > halfway || (rem == halfway && (q & 1u))) q++;
    return (uint16_t)(sign | q);
}

SUMO__HD float sumo__bf16_to_float(uint16_t h) { return sumo__f32_from_bits((uint32_t)h << 16); }

SUMO__HD uint16_t sumo__float_to_bf16(float f)
{
    uint32_t u = sumo__f32_bits(f);
    /* The rounding add below would carry a NaN whose payload sits in the low half into Inf. */
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/*
 * fp64 -> fp32 rounded to odd: truncate, and set the last bit when anything was dropped. A
 * second rounding to a format at least two bits narrower (fp16, bf16) is then the correctly
 * rounded one, which double -> float -> half with two RNE steps is not.
 */
SUMO__HD float sumo__double_to_float_odd(double d)
{
    float f = (float)d;
    if ((double)f == d || d != d) return f;
    uint32_t u = sumo__f32_bits(f);
    if (fabs((double)f) > fabs(d)) u -= 1; /* rounded away from zero (maybe to Inf): step back */
    return sumo__f32_from_bits(u | 1u);
}

/* Narrowing from double with a single rounding (fp64 -> fp16/bf16 must not round twice
 * through fp32). */
SUMO__HD uint16_t sumo__double_to_half(double d)
{
    return sumo__float_to_half(sumo__double_to_float_odd(d));
}

SUMO__HD uint16_t sumo__double_to_bf16(double d)
{
    return sumo__float_to_bf16(sumo__double_to_float_odd(d));
}

/*
 * Whether c narrows to float without becoming Inf or losing its digits. The fp16/bf16 scaled
 * add and weighted sum evaluate in fp32 with their coefficients narrowed to float; a
 * coefficient outside float's normal range would become Inf (or lose its digits) although the
 * products it forms can be ordinary numbers: Adasum's coefficient of the shorter of two
 * parallel inputs is about minus half the ratio of their norms, past FLT_MAX for bf16 inputs
 * whose norms are 1e57 apart. Such calls take the wide path instead, on every ISA and on the
 * device: double arithmetic rounded once to the dtype. Zero, Inf and NaN narrow exactly, so
 * they stay on the fast path.
 */
SUMO__HD bool sumo__coef_fits_float(double c)
{
    double m = c < 0 ? -c : c;
    return !(m > 0x1.fffffep127) && !(m > 0 && m < 0x1p-126);
}

/* ---- the block codec: formats ------------------------------------------------------------ */

typedef struct sumo__qformat {
    int bits;        /* per element: 16, 8 or 4 */
    int mant;        /* mantissa bits */
    int emin, emax;  /* exponents of the smallest and the largest normal binade */
    uint32_t maxsig; /* significand of the largest finite value, in units of 2^(emax - mant) */
    bool scaled;     /* a per-block power-of-two scale precedes the codes */
} sumo__qformat;

/* The format's parameters; false (and *q all zero) for SUMO_COMPRESS_NONE or an unknown
 * value. */
SUMO__HD bool sumo__qformat_of(sumo_compression_format format, sumo__qformat *q)
{
    switch (format) {
    case SUMO_COMPRESS_BF16: { /* fp32's exponent range, 7 mantissa bits, largest 0x7f7f */
        sumo__qformat f = {16, 7, -126, 127, 255, false};
        *q = f;
        return true;
    }
    case SUMO_COMPRESS_FP8_E4M3: { /* OCP E4M3FN: bias 7, subnormals, largest 1.75 * 2^8 = 448
                                    * (S.1111.111 is NaN there, never produced here) */
        sumo__qformat f = {8, 3, -6, 8, 14, true};
        *q = f;
        return true;
    }
    case SUMO_COMPRESS_E3M0: { /* bias 3, field 0 is zero, fields 1..7 are 2^-2 .. 2^4 (no
                                * infinity, no NaN) */
        sumo__qformat f = {4, 0, -2, 4, 1, true};
        *q = f;
        return true;
    }
    default: {
        sumo__qformat f = {0, 0, 0, 0, 0, false};
        *q = f;
        return false;
    }
    }
}

/* Whether block is a block size the compressed allreduce accepts (a multiple of 8 in
 * [8, 65536], so that every block's scale is 4-byte aligned and 4-bit codes fill bytes). */
SUMO__HD bool sumo__qblock_valid(size_t block)
{
    return block >= 8 && block <= 65536 && block % 8 == 0;
}

/* Payload bytes of one block of block elements. */
SUMO__HD size_t sumo__qblock_bytes(const sumo__qformat *q, size_t block)
{
    return (q->scaled ? 4 : 0) + block * (size_t)q->bits / 8;
}

/* ---- the block codec: one value ---------------------------------------------------------- */

/* |x| = M * 2^e with M < 2^24, from the bits a of a finite non-negative fp32. */
SUMO__HD void sumo__qdecompose(uint32_t a, uint32_t *M, int *e)
{
    uint32_t fe = a >> 23, fm = a & 0x7fffffu;
    if (fe == 0) {
        *M = fm;
        *e = -149;
    } else {
        *M = fm | 0x800000u;
        *e = (int)fe - 150;
    }
}

SUMO__HD int sumo__qbit_length(uint32_t m)
{
#ifdef __CUDA_ARCH__
    return 32 - __clz((int)m);
#else
    return m ? 32 - __builtin_clz(m) : 0;
#endif
}

/* The per-block exponent s of a block whose largest magnitude has the fp32 bits amax
 * (0 < amax < 0x7f800000). */
SUMO__HD int sumo__qscale_exponent(const sumo__qformat *q, uint32_t amax)
{
    if (!q->scaled) return 0;
    uint32_t M;
    int e;
    sumo__qdecompose(amax, &M, &e);
    /* The smallest s with M 2^e <= maxsig 2^(emax - mant + s), i.e. the smallest t with
     * maxsig 2^t >= M, where s = t + e - (emax - mant). */
    int t = 0;
    if (M > q->maxsig) {
        while (((uint64_t)q->maxsig << t) < M) t++;
    } else {
        while (((uint64_t)M << (1 - t)) <= q->maxsig) t--;
    }
    int s = t + e - (q->emax - q->mant);
    /* 2^s must be an fp32: a smaller block maximum leaves the low codes unused, which only
     * costs precision far below fp32's own. */
    return s < -149 ? -149 : s > 127 ? 127 : s;
}

/* The code of the fp32 x (finite) under the scale 2^s. */
SUMO__HD uint32_t sumo__qencode(const sumo__qformat *q, uint32_t x, int s)
{
    uint32_t signbit = (x >> 31) << (q->bits - 1), a = x & 0x7fffffffu;
    if (a == 0) return signbit;
    uint32_t M;
    int e;
    sumo__qdecompose(a, &M, &e);
    /* y = |x| / 2^s = M 2^(e - s); its binade L, the binade E it is coded in (subnormals at
     * emin), and y in units of the quantum 2^(E - mant) rounded to nearest, ties to even. */
    int L = e - s + sumo__qbit_length(M) - 1;
    int E = L > q->emin ? L : q->emin;
    int sh = (E - q->mant) - (e - s);
    uint64_t v;
    if (sh <= 0) {
        v = (uint64_t)M << -sh;
    } else if (sh > 40) {
        v = 0; /* below half the quantum */
    } else {
        v = (uint64_t)M >> sh;
        uint64_t rem = (uint64_t)M & ((1ull << sh) - 1), half = 1ull << (sh - 1);
        /* A tie goes to the even code: the even significand, or for a format without a
         * mantissa (E3M0, v 0 or 1 here) the even exponent field. */
        bool odd = q->mant > 0 ? (v & 1) != 0 : v != 0 && ((E - q->emin + 1) & 1) != 0;
        if (rem > half || (rem == half && odd)) v++;
    }
    if (v >> (q->mant + 1)) { /* rounded up into the next binade: v was 2^(mant + 1) */
        v >>= 1;
        E++;
    }
    /* Scaled back, only a carry can reach 2^128: the largest value below it instead. */
    if (E + s >= 128) {
        E = 127 - s;
        v = (2ull << q->mant) - 1;
    }
    if (E > q->emax || (E == q->emax && v > q->maxsig)) {
        E = q->emax;
        v = q->maxsig;
    }
    if (v == 0) return signbit;
    if (v < (1ull << q->mant)) return signbit | (uint32_t)v; /* subnormal: E == emin */
    return signbit | ((uint32_t)(E - q->emin + 1) << q->mant) | (uint32_t)(v - (1ull << q->mant));
}

/* The fp32 value of code under the scale 2^s. */
SUMO__HD float sumo__qdecode(const sumo__qformat *q, uint32_t code, int s)
{
    int ebits = q->bits - 1 - q->mant;
    uint32_t sign = (code >> (q->bits - 1)) & 1u;
    uint32_t field = (code >> q->mant) & ((1u << ebits) - 1);
    uint32_t m = code & ((1u << q->mant) - 1);
    /* bf16's all-ones field: the NaN of a block that held NaN or Inf (never a value). */
    if (!q->scaled && field == (1u << ebits) - 1) return sumo__f32_from_bits(0x7fc00000u);
    uint32_t sig = field ? m | (1u << q->mant) : m;
    int E = field ? (int)field - 1 + q->emin : q->emin;
    /* sig 2^(E - mant + s), exact in double (2^k from its bits: -1022 <= k <= 1023 here). */
    double p = sumo__f64_from_bits((uint64_t)(E - q->mant + s + 1023) << 52);
    float f = (float)((double)sig * p);
    return sign ? -f : f;
}

/* The scale 2^s as fp32 bits (s in [-149, 127]), and back. */
SUMO__HD uint32_t sumo__qscale_bits(int s)
{
    return s >= -126 ? (uint32_t)(s + 127) << 23 : 1u << (s + 149);
}

SUMO__HD int sumo__qscale_of_bits(uint32_t b)
{
    if (b >= 0x00800000u) return (int)(b >> 23) - 127;
#ifdef __CUDA_ARCH__
    return __ffs((int)b) - 1 - 149;
#else
    return __builtin_ctz(b) - 149;
#endif
}

/* ---- the block codec: one block ---------------------------------------------------------- */

/* What a block is, once its largest magnitude and first non-finite element are known, and
 * what its scale word says. */
enum { SUMO__QVALUES = 0, SUMO__QZERO, SUMO__QBAD };
/* No non-finite element (a block has at most 65536). */
#define SUMO__QNONE 0xffffffffu

/* Element j of a block into the scan: *amax the largest magnitude's bits, *bad the first
 * non-finite index (SUMO__QNONE before). A max and a min: the order of the elements, or of a
 * device's threads, cannot change them. */
SUMO__HD void sumo__qscan(float x, uint32_t j, uint32_t *amax, uint32_t *bad)
{
    uint32_t a = sumo__f32_bits(x) & 0x7fffffffu;
    if (a >= 0x7f800000u && j < *bad) *bad = j;
    *amax = a > *amax ? a : *amax;
}

SUMO__HD int sumo__qblock_kind(const sumo__qformat *q, uint32_t amax, uint32_t bad)
{
    if (bad != SUMO__QNONE) return SUMO__QBAD;
    return q->scaled && amax == 0 ? SUMO__QZERO : SUMO__QVALUES;
}

/* The scale word of a block: a NaN scale for a block with NaN or Inf, zero for all zeros. */
SUMO__HD uint32_t sumo__qscale_word(int kind, int s)
{
    return kind == SUMO__QBAD ? 0x7fc00000u : kind == SUMO__QZERO ? 0u : sumo__qscale_bits(s);
}

/* Code j of a block of len elements at src (j may run to the block size: padding is 0). A
 * block with NaN or Inf decodes as NaN: a NaN scale and zero codes, or bf16's NaN in every
 * element. */
SUMO__HD uint32_t sumo__qcode_at(const sumo__qformat *q, const float *src, size_t len, size_t j,
                                 int kind, int s)
{
    if (j >= len) return 0;
    if (kind == SUMO__QBAD) return q->scaled ? 0u : 0x7fc0u;
    if (kind == SUMO__QZERO) return 0;
    return sumo__qencode(q, sumo__f32_bits(src[j]), s);
}

/* Unit u of a block's codes: element u (16 and 8 bits) or byte u (two 4-bit codes, the even
 * element in the low nibble), so that each unit is written whole by one writer. */
SUMO__HD size_t sumo__qunits(const sumo__qformat *q, size_t block)
{
    return q->bits == 4 ? block / 2 : block;
}

SUMO__HD void sumo__qstore_unit(const sumo__qformat *q, unsigned char *codes, size_t u,
                                const float *src, size_t len, int kind, int s)
{
    if (q->bits == 16) {
        uint16_t h = (uint16_t)sumo__qcode_at(q, src, len, u, kind, s);
        memcpy(codes + 2 * u, &h, 2);
    } else if (q->bits == 8) {
        codes[u] = (unsigned char)sumo__qcode_at(q, src, len, u, kind, s);
    } else {
        uint32_t lo = sumo__qcode_at(q, src, len, 2 * u, kind, s);
        uint32_t hi = sumo__qcode_at(q, src, len, 2 * u + 1, kind, s);
        codes[u] = (unsigned char)((lo & 0x0fu) | (hi << 4));
    }
}

SUMO__HD uint32_t sumo__qget_code(const sumo__qformat *q, const unsigned char *codes, size_t j)
{
    if (q->bits == 16) {
        uint16_t h;
        memcpy(&h, codes + 2 * j, 2);
        return h;
    }
    if (q->bits == 8) return codes[j];
    return j % 2 ? codes[j / 2] >> 4 : codes[j / 2] & 0x0fu;
}

/* The kind of a coded block from its scale word, and *s (bf16: always values, s = 0). */
SUMO__HD int sumo__qblock_scale(const sumo__qformat *q, const unsigned char *blk, int *s)
{
    *s = 0;
    if (!q->scaled) return SUMO__QVALUES;
    uint32_t sb;
    memcpy(&sb, blk, 4);
    if ((sb & 0x7f800000u) == 0x7f800000u) return SUMO__QBAD;
    if (sb == 0) return SUMO__QZERO;
    *s = sumo__qscale_of_bits(sb);
    return SUMO__QVALUES;
}

/* Element j of a coded block of that kind and scale, decoded. */
SUMO__HD float sumo__qvalue_at(const sumo__qformat *q, const unsigned char *blk, int kind, int s,
                               size_t j)
{
    if (kind == SUMO__QBAD) return sumo__f32_from_bits(0x7fc00000u);
    if (kind == SUMO__QZERO) return 0.0f;
    return sumo__qdecode(q, sumo__qget_code(q, blk + (q->scaled ? 4 : 0), j), s);
}

/* ---- the block codec: a buffer, one block after another ---------------------------------- */

/* fp32 src[0, n) as ceil(n / block) blocks of payload at dst; *first = the first NaN or Inf
 * of src, SIZE_MAX if none. The host table's quantize, and the CUDA kernels' emulator: the
 * kernel runs the same per-block steps with a thread per unit. */
SUMO__HD void sumo__quantize(const sumo__qformat *q, size_t block, void *dst, const float *src,
                             size_t n, size_t *first)
{
    size_t bb = sumo__qblock_bytes(q, block), nb = (n + block - 1) / block;
    *first = SIZE_MAX;
    for (size_t b = 0; b < nb; b++) {
        size_t lo = b * block, len = n - lo < block ? n - lo : block;
        unsigned char *blk = (unsigned char *)dst + b * bb;
        uint32_t amax = 0, bad = SUMO__QNONE;
        for (size_t j = 0; j < len; j++) sumo__qscan(src[lo + j], (uint32_t)j, &amax, &bad);
        int kind = sumo__qblock_kind(q, amax, bad);
        int s = kind == SUMO__QVALUES ? sumo__qscale_exponent(q, amax) : 0;
        if (q->scaled) {
            uint32_t w = sumo__qscale_word(kind, s);
            memcpy(blk, &w, 4);
        }
        if (kind == SUMO__QBAD && *first == SIZE_MAX) *first = lo + bad;
        for (size_t u = 0; u < sumo__qunits(q, block); u++)
            sumo__qstore_unit(q, blk + (q->scaled ? 4 : 0), u, src + lo, len, kind, s);
    }
}

/* n elements of payload back to fp32 (a NaN scale gives NaN, a zero scale +0). */
SUMO__HD void sumo__dequantize(const sumo__qformat *q, size_t block, float *dst, const void *src,
                               size_t n)
{
    size_t bb = sumo__qblock_bytes(q, block), nb = (n + block - 1) / block;
    for (size_t b = 0; b < nb; b++) {
        size_t lo = b * block, len = n - lo < block ? n - lo : block;
        const unsigned char *blk = (const unsigned char *)src + b * bb;
        int s;
        int kind = sumo__qblock_scale(q, blk, &s);
        for (size_t j = 0; j < len; j++) dst[lo + j] = sumo__qvalue_at(q, blk, kind, s, j);
    }
}

#endif
