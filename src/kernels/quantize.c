/*
 * The compressed allreduce's codec (quantize.h says what it computes). Everything is integer
 * arithmetic on the fp32 bits, except the one rounding of a decoded value to fp32, so that a
 * device implementation written statement for statement gives the same bits.
 */
#include "kernels/quantize.h"

#include <string.h>

bool sumo__qformat_of(sumo_compression_format format, sumo__qformat *q)
{
    switch (format) {
    /* bfloat16: fp32's exponent range, 7 mantissa bits, largest 0x7f7f. */
    case SUMO_COMPRESS_BF16: *q = (sumo__qformat){16, 7, -126, 127, 255, false}; return true;
    /* OCP E4M3FN: bias 7, subnormals, largest 1.75 * 2^8 = 448 (S.1111.111 is NaN there,
     * never produced here). */
    case SUMO_COMPRESS_FP8_E4M3: *q = (sumo__qformat){8, 3, -6, 8, 14, true}; return true;
    /* E3M0: bias 3, field 0 is zero, fields 1..7 are 2^-2 .. 2^4 (no infinity, no NaN). */
    case SUMO_COMPRESS_E3M0: *q = (sumo__qformat){4, 0, -2, 4, 1, true}; return true;
    default: return false;
    }
}

/* |x| = M * 2^e with M < 2^24, from the bits a of a finite non-negative fp32. */
static void decompose(uint32_t a, uint32_t *M, int *e)
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

static int bit_length(uint32_t m) { return m ? 32 - __builtin_clz(m) : 0; }

int sumo__qscale_exponent(const sumo__qformat *q, uint32_t amax)
{
    if (!q->scaled) return 0;
    uint32_t M;
    int e;
    decompose(amax, &M, &e);
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

uint32_t sumo__qencode(const sumo__qformat *q, uint32_t x, int s)
{
    uint32_t signbit = (x >> 31) << (q->bits - 1), a = x & 0x7fffffffu;
    if (a == 0) return signbit;
    uint32_t M;
    int e;
    decompose(a, &M, &e);
    /* y = |x| / 2^s = M 2^(e - s); its binade L, the binade E it is coded in (subnormals at
     * emin), and y in units of the quantum 2^(E - mant) rounded to nearest, ties to even. */
    int L = e - s + bit_length(M) - 1;
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

/* 2^k as a double, exact for -1022 <= k <= 1023. */
static double pow2(int k)
{
    uint64_t b = (uint64_t)(k + 1023) << 52;
    double d;
    memcpy(&d, &b, sizeof d);
    return d;
}

static float f32_of(uint32_t b)
{
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

static uint32_t bits_of(float f)
{
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    return b;
}

float sumo__qdecode(const sumo__qformat *q, uint32_t code, int s)
{
    int ebits = q->bits - 1 - q->mant;
    uint32_t sign = (code >> (q->bits - 1)) & 1u;
    uint32_t field = (code >> q->mant) & ((1u << ebits) - 1);
    uint32_t m = code & ((1u << q->mant) - 1);
    /* bf16's all-ones field: the NaN of a block that held NaN or Inf (never a value). */
    if (!q->scaled && field == (1u << ebits) - 1) return f32_of(0x7fc00000u);
    uint32_t sig = field ? m | (1u << q->mant) : m;
    int E = field ? (int)field - 1 + q->emin : q->emin;
    float f = (float)((double)sig * pow2(E - q->mant + s));
    return sign ? -f : f;
}

/* The scale 2^s as fp32 bits (s in [-149, 127]). */
static uint32_t scale_bits(int s)
{
    return s >= -126 ? (uint32_t)(s + 127) << 23 : 1u << (s + 149);
}

static int scale_exponent(uint32_t b)
{
    return b >= 0x00800000u ? (int)(b >> 23) - 127 : __builtin_ctz(b) - 149;
}

static void put_code(const sumo__qformat *q, unsigned char *codes, size_t j, uint32_t c)
{
    switch (q->bits) {
    case 16: {
        uint16_t h = (uint16_t)c;
        memcpy(codes + 2 * j, &h, 2);
        break;
    }
    case 8: codes[j] = (unsigned char)c; break;
    default: /* two codes a byte, the even element in the low nibble */
        codes[j / 2] = (unsigned char)(j % 2 ? (codes[j / 2] & 0x0fu) | (c << 4)
                                             : (codes[j / 2] & 0xf0u) | (c & 0x0fu));
        break;
    }
}

static uint32_t get_code(const sumo__qformat *q, const unsigned char *codes, size_t j)
{
    switch (q->bits) {
    case 16: {
        uint16_t h;
        memcpy(&h, codes + 2 * j, 2);
        return h;
    }
    case 8: return codes[j];
    default: return j % 2 ? codes[j / 2] >> 4 : codes[j / 2] & 0x0fu;
    }
}

void sumo__quantize(const sumo__qformat *q, size_t block, void *dst, const float *src, size_t n,
                    size_t *first)
{
    size_t bb = sumo__qblock_bytes(q, block), nb = (n + block - 1) / block;
    *first = SIZE_MAX;
    for (size_t b = 0; b < nb; b++) {
        size_t lo = b * block, len = SUMO__MIN(block, n - lo);
        unsigned char *out = (unsigned char *)dst + b * bb, *codes = out + (q->scaled ? 4 : 0);
        uint32_t amax = 0;
        size_t bad = SIZE_MAX;
        for (size_t j = 0; j < len; j++) {
            uint32_t a = bits_of(src[lo + j]) & 0x7fffffffu;
            if (a >= 0x7f800000u && bad == SIZE_MAX) bad = j;
            amax = a > amax ? a : amax;
        }
        memset(codes, 0, bb - (size_t)(codes - out));
        if (bad != SIZE_MAX) {
            if (*first == SIZE_MAX) *first = lo + bad;
            /* The whole block decodes as NaN: a NaN scale, or bf16's NaN in every element. */
            if (q->scaled) {
                uint32_t nan = 0x7fc00000u;
                memcpy(out, &nan, 4);
            } else {
                for (size_t j = 0; j < len; j++) put_code(q, codes, j, 0x7fc0u);
            }
            continue;
        }
        int s = 0;
        if (q->scaled) {
            uint32_t sb = 0;
            if (amax != 0) {
                s = sumo__qscale_exponent(q, amax);
                sb = scale_bits(s);
            }
            memcpy(out, &sb, 4);
            if (amax == 0) continue; /* zero scale, zero codes: +0 */
        }
        for (size_t j = 0; j < len; j++) put_code(q, codes, j, sumo__qencode(q, bits_of(src[lo + j]), s));
    }
}

void sumo__dequantize(const sumo__qformat *q, size_t block, float *dst, const void *src, size_t n)
{
    size_t bb = sumo__qblock_bytes(q, block), nb = (n + block - 1) / block;
    for (size_t b = 0; b < nb; b++) {
        size_t lo = b * block, len = SUMO__MIN(block, n - lo);
        const unsigned char *in = (const unsigned char *)src + b * bb,
                            *codes = in + (q->scaled ? 4 : 0);
        int s = 0;
        if (q->scaled) {
            uint32_t sb;
            memcpy(&sb, in, 4);
            if ((sb & 0x7f800000u) == 0x7f800000u || sb == 0) {
                float v = sb ? f32_of(0x7fc00000u) : 0.0f;
                for (size_t j = 0; j < len; j++) dst[lo + j] = v;
                continue;
            }
            s = scale_exponent(sb);
        }
        for (size_t j = 0; j < len; j++) dst[lo + j] = sumo__qdecode(q, get_code(q, codes, j), s);
    }
}
