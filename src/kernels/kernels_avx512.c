/*
 * The AVX-512 path (AVX-512F only, so every AVX-512 CPU qualifies): 16 floats or 8 doubles a
 * vector, in zmm registers by construction since every primitive is a 512-bit intrinsic.
 * Only the primitives are here; the kernels are kernels_simd.h's.
 *
 * Not used: AVX512-BF16's vcvtneps2bf16 flushes subnormals to zero, and AVX512-FP16 would
 * compute in fp16; both differ from the specified widen-to-fp32-and-round-once.
 */
#include "kernels/kernels.h"
#include "kernels/kernels_isa.h"

#if SUMO__KERNELS_X86

#include <immintrin.h>

#define SUMO__SIMD_SFX avx512
#ifdef __clang__ /* intrinsics fix the width; clang has no prefer-vector-width attribute */
#define SUMO__SIMD_TARGET __attribute__((target("avx512f,avx2,fma,f16c")))
#else
#define SUMO__SIMD_TARGET \
    __attribute__((target("avx512f,avx2,fma,f16c,prefer-vector-width=512")))
#endif
#define PRIM static inline __attribute__((always_inline)) SUMO__SIMD_TARGET

typedef __m512 vf;
typedef __m512d vd;
typedef __m256i vh;
#define WF 16

PRIM vf vf_loadu(const float *p) { return _mm512_loadu_ps(p); }
PRIM void vf_storeu(float *p, vf v) { _mm512_storeu_ps(p, v); }
PRIM vf vf_set1(float x) { return _mm512_set1_ps(x); }
PRIM vf vf_add(vf a, vf b) { return _mm512_add_ps(a, b); }
PRIM vf vf_mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
PRIM vf vf_div(vf a, vf b) { return _mm512_div_ps(a, b); }
PRIM vf vf_fmadd(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }

PRIM vd vd_loadu(const double *p) { return _mm512_loadu_pd(p); }
PRIM void vd_storeu(double *p, vd v) { _mm512_storeu_pd(p, v); }
PRIM vd vd_set1(double x) { return _mm512_set1_pd(x); }
PRIM vd vd_zero(void) { return _mm512_setzero_pd(); }
PRIM vd vd_add(vd a, vd b) { return _mm512_add_pd(a, b); }
PRIM vd vd_mul(vd a, vd b) { return _mm512_mul_pd(a, b); }
PRIM vd vd_div(vd a, vd b) { return _mm512_div_pd(a, b); }
PRIM vd vd_fmadd(vd a, vd b, vd c) { return _mm512_fmadd_pd(a, b, c); }
PRIM vd vd_from_lo(vf v) { return _mm512_cvtps_pd(_mm512_castps512_ps256(v)); }
PRIM vd vd_from_hi(vf v)
{
    return _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}
PRIM vf vf_from_vd(vd lo, vd hi)
{
    __m512d l = _mm512_castps_pd(_mm512_castps256_ps512(_mm512_cvtpd_ps(lo)));
    return _mm512_castpd_ps(_mm512_insertf64x4(l, _mm256_castps_pd(_mm512_cvtpd_ps(hi)), 1));
}
/* The first m (< WF) floats at p, the other lanes +0; nothing past them is read. */
PRIM vf vf_loadu_head(const float *p, size_t m) { return _mm512_maskz_loadu_ps((__mmask16)((1u << m) - 1), p); }
/* A fixed tree (halves, then quarters...), so the order depends on nothing but the data. */
PRIM double vd_hsum(vd v)
{
    __m256d s4 = _mm256_add_pd(_mm512_castpd512_pd256(v), _mm512_extractf64x4_pd(v, 1));
    __m128d s2 = _mm_add_pd(_mm256_castpd256_pd128(s4), _mm256_extractf128_pd(s4, 1));
    return _mm_cvtsd_f64(_mm_add_sd(s2, _mm_unpackhi_pd(s2, s2)));
}

PRIM vh vh_loadu(const uint16_t *p) { return _mm256_loadu_si256((const __m256i *)p); }
PRIM void vh_storeu(uint16_t *p, vh h) { _mm256_storeu_si256((__m256i *)p, h); }
PRIM vf vf_from_f16(vh h) { return _mm512_cvtph_ps(h); }
PRIM vh vh_from_f32_f16(vf v) { return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT); }
PRIM vf vf_from_bf16(vh h)
{
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
/* sumo__float_to_bf16 sixteen at a time: round to nearest even on the bits, NaNs kept quiet. */
PRIM vh vh_from_f32_bf16(vf v)
{
    const __m512i u = _mm512_castps_si512(v), top = _mm512_srli_epi32(u, 16);
    const __m512i lsb = _mm512_and_si512(top, _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb);
    r = _mm512_srli_epi32(r, 16);
    const __mmask16 nan = _mm512_cmpgt_epi32_mask(
        _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
    r = _mm512_mask_blend_epi32(nan, r, _mm512_or_si512(top, _mm512_set1_epi32(0x40)));
    return _mm512_cvtepi32_epi16(r);
}

/* Gram tile rows: with 4 columns, the tile's accumulators and operands fit the register file. */
#define GRAM_ROWS 4

#include "kernels/kernels_simd.h"

#endif
