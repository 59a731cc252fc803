/*
 * The AVX2 path (with FMA and F16C, as every AVX2 CPU has): 8 floats or 4 doubles a vector.
 * Only the primitives are here; the kernels are kernels_simd.h's.
 */
#include "kernels/kernels.h"
#include "kernels/kernels_isa.h"

#if SUMO__KERNELS_X86

#include <immintrin.h>

#define SUMO__SIMD_SFX avx2
#define SUMO__SIMD_TARGET __attribute__((target("avx2,fma,f16c")))
#define PRIM static inline __attribute__((always_inline)) SUMO__SIMD_TARGET

typedef __m256 vf;
typedef __m256d vd;
typedef __m128i vh;
#define WF 8

PRIM vf vf_loadu(const float *p) { return _mm256_loadu_ps(p); }
PRIM void vf_storeu(float *p, vf v) { _mm256_storeu_ps(p, v); }
PRIM vf vf_set1(float x) { return _mm256_set1_ps(x); }
PRIM vf vf_add(vf a, vf b) { return _mm256_add_ps(a, b); }
PRIM vf vf_mul(vf a, vf b) { return _mm256_mul_ps(a, b); }
PRIM vf vf_div(vf a, vf b) { return _mm256_div_ps(a, b); }
PRIM vf vf_fmadd(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }

PRIM vd vd_loadu(const double *p) { return _mm256_loadu_pd(p); }
PRIM void vd_storeu(double *p, vd v) { _mm256_storeu_pd(p, v); }
PRIM vd vd_set1(double x) { return _mm256_set1_pd(x); }
PRIM vd vd_zero(void) { return _mm256_setzero_pd(); }
PRIM vd vd_add(vd a, vd b) { return _mm256_add_pd(a, b); }
PRIM vd vd_mul(vd a, vd b) { return _mm256_mul_pd(a, b); }
PRIM vd vd_div(vd a, vd b) { return _mm256_div_pd(a, b); }
PRIM vd vd_fmadd(vd a, vd b, vd c) { return _mm256_fmadd_pd(a, b, c); }
PRIM vd vd_from_lo(vf v) { return _mm256_cvtps_pd(_mm256_castps256_ps128(v)); }
PRIM vd vd_from_hi(vf v) { return _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)); }
PRIM vf vf_from_vd(vd lo, vd hi)
{
    return _mm256_set_m128(_mm256_cvtpd_ps(hi), _mm256_cvtpd_ps(lo));
}
/* The first m (< WF) floats at p, the other lanes +0; nothing past them is read. */
PRIM vf vf_loadu_head(const float *p, size_t m)
{
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)m), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    return _mm256_maskload_ps(p, mask);
}
PRIM double vd_hsum(vd v)
{
    __m128d s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
    return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}

PRIM vh vh_loadu(const uint16_t *p) { return _mm_loadu_si128((const __m128i *)p); }
PRIM void vh_storeu(uint16_t *p, vh h) { _mm_storeu_si128((__m128i *)p, h); }
PRIM vf vf_from_f16(vh h) { return _mm256_cvtph_ps(h); }
PRIM vh vh_from_f32_f16(vf v) { return _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT); }
PRIM vf vf_from_bf16(vh h)
{
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
/* sumo__float_to_bf16 eight at a time: round to nearest even on the bits, NaNs kept quiet. */
PRIM vh vh_from_f32_bf16(vf v)
{
    const __m256i u = _mm256_castps_si256(v), top = _mm256_srli_epi32(u, 16);
    const __m256i lsb = _mm256_and_si256(top, _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb);
    r = _mm256_srli_epi32(r, 16);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                           _mm256_set1_epi32(0x7f800000));
    r = _mm256_blendv_epi8(r, _mm256_or_si256(top, _mm256_set1_epi32(0x40)), nan);
    /* packus works per 128-bit lane (values fit, no saturation): gather qwords 0 and 2. */
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    return _mm256_castsi256_si128(packed);
}

/* Gram tile rows: with 4 columns, the tile's accumulators and operands fit the register file. */
#define GRAM_ROWS 2

#include "kernels/kernels_simd.h"

#endif
