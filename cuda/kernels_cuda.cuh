/*
 * What the kernel files of sumo's CUDA plugin share (kernels_cuda.cu: the element-wise
 * entries; gram_cuda.cu, wsum_cuda.cu: the layout-aware ones; codec_cuda.cu: the compressed
 * allreduce's codec): the launch shape, element access per dtype and the layout's pieces.
 *
 * Every kernel has the meaning of sumo's host table (src/kernels/kernel_table.c) entry by
 * entry:
 *   - fp16 and bf16 are combined in fp32 (or double, where the host kernels use double) and
 *     rounded once to nearest even, through the library's own conversions (codec.h, compiled
 *     here for the device), so bit for bit the host's;
 *   - every sum runs in the host's order (reduce: left to right; weighted sum: w0 x0, then one
 *     fused multiply-add per input), so those results equal the host's bit for bit, NaN
 *     payloads aside (a GPU's arithmetic makes its own NaN);
 *   - the Gram partials (and dot_norms, their two-input case) accumulate in double in a fixed
 *     order of their own: one chunk of a tensor piece per block, each thread's elements in
 *     index order, a shuffle tree per warp, the warps in order, then the chunks in order. The
 *     order depends on the piece's length and the input count only, so the same inputs give
 *     the same bits on every run, rank and address; it differs from the host's (which itself
 *     depends on the CPU's vector width), so those results match the host's within rounding.
 *
 * Built with -fmad=false: nothing is fused unless written as fma(), as on the host (C11 with
 * -ffp-contract=off), and no flag changes IEEE division, square roots or denormals.
 *
 * Each kernel's arithmetic lives in __host__ __device__ functions; the *_emulate entry points
 * run them on the host in the device's order, so that host tests check the index arithmetic
 * and rounding without a GPU, and device tests check the device against the emulator bit for
 * bit.
 */
#ifndef SUMO_CUDA_KERNELS_CUDA_CUH
#define SUMO_CUDA_KERNELS_CUDA_CUH

#include <cuda_runtime.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels_cuda.h"
/* The one header of the library's that the plugin includes: the bits, the fp16/bf16
 * conversions and the block codec, one source for the host's kernels and these (it says
 * why). */
#include "../src/kernels/codec.h"

#define HD __host__ __device__ __forceinline__

namespace {

constexpr int BLOCK = SUMO_CUDA__BLOCK;
constexpr int WARPS = BLOCK / 32;

/* ---- element access per dtype ------------------------------------------------------------ */

template <int DT> struct dt_traits;
template <> struct dt_traits<SUMO_FLOAT32> { static constexpr int esz = 4; };
template <> struct dt_traits<SUMO_FLOAT64> { static constexpr int esz = 8; };
template <> struct dt_traits<SUMO_FLOAT16> { static constexpr int esz = 2; };
template <> struct dt_traits<SUMO_BFLOAT16> { static constexpr int esz = 2; };
/* Elements per 16-byte vector. */
template <int DT> __host__ __device__ constexpr int vec_of() { return 16 / dt_traits<DT>::esz; }

/* fp32, fp16, bf16 as float (exact). */
template <int DT> HD float load_f(const void *p, size_t i)
{
    if (DT == SUMO_FLOAT16) return sumo__half_to_float(((const uint16_t *)p)[i]);
    if (DT == SUMO_BFLOAT16) return sumo__bf16_to_float(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}
/* Any dtype as double (exact). */
template <int DT> HD double load_d(const void *p, size_t i)
{
    if (DT == SUMO_FLOAT64) return ((const double *)p)[i];
    return (double)load_f<DT>(p, i);
}
/* A float rounded once to DT's storage bits (fp32: the float itself). */
template <int DT> HD uint32_t narrow_f(float v)
{
    if (DT == SUMO_FLOAT16) return sumo__float_to_half(v);
    if (DT == SUMO_BFLOAT16) return sumo__float_to_bf16(v);
    return sumo__f32_bits(v);
}
template <int DT> HD void store_bits(void *p, size_t i, uint64_t bits)
{
    if (dt_traits<DT>::esz == 2) ((uint16_t *)p)[i] = (uint16_t)bits;
    else if (dt_traits<DT>::esz == 4) ((uint32_t *)p)[i] = (uint32_t)bits;
    else ((uint64_t *)p)[i] = bits;
}
/* A double rounded once to DT's storage bits (fp16/bf16 through round-to-odd). */
template <int DT> HD uint64_t narrow_d(double v)
{
    if (DT == SUMO_FLOAT64) return sumo__f64_bits(v);
    if (DT == SUMO_FLOAT32) return sumo__f32_bits((float)v);
    if (DT == SUMO_FLOAT16) return sumo__double_to_half(v);
    return sumo__double_to_bf16(v);
}

/* Element k of a 16-byte vector held as four words (little-endian, as memory). */
template <int DT> HD uint64_t word_elem(const uint32_t w[4], int k)
{
    if (dt_traits<DT>::esz == 8) return (uint64_t)w[2 * k] | ((uint64_t)w[2 * k + 1] << 32);
    if (dt_traits<DT>::esz == 4) return w[k];
    return (w[k >> 1] >> (16 * (k & 1))) & 0xffffu;
}
template <int DT> HD void word_set(uint32_t w[4], int k, uint64_t bits)
{
    if (dt_traits<DT>::esz == 8) {
        w[2 * k] = (uint32_t)bits;
        w[2 * k + 1] = (uint32_t)(bits >> 32);
    } else if (dt_traits<DT>::esz == 4) {
        w[k] = (uint32_t)bits;
    } else {
        int s = 16 * (k & 1);
        w[k >> 1] = (w[k >> 1] & ~(0xffffu << s)) | ((uint32_t)bits << s);
    }
}
/* A storage element's value as float (fp32/fp16/bf16) or double. */
template <int DT> HD float bits_f(uint64_t b)
{
    if (DT == SUMO_FLOAT16) return sumo__half_to_float((uint16_t)b);
    if (DT == SUMO_BFLOAT16) return sumo__bf16_to_float((uint16_t)b);
    return sumo__f32_from_bits((uint32_t)b);
}
template <int DT> HD double bits_d(uint64_t b)
{
    if (DT == SUMO_FLOAT64) return sumo__f64_from_bits(b);
    return (double)bits_f<DT>(b);
}
template <int DT> HD uint64_t load_bits(const void *p, size_t i)
{
    if (dt_traits<DT>::esz == 2) return ((const uint16_t *)p)[i];
    if (dt_traits<DT>::esz == 4) return ((const uint32_t *)p)[i];
    return ((const uint64_t *)p)[i];
}

HD const void *at(const void *p, size_t elements, int esz)
{
    return (const unsigned char *)p + elements * (size_t)esz;
}

/* Plain loads: an output of the same launch may be the same memory (in place). */
__device__ __forceinline__ void load16(const void *p, uint32_t w[4])
{
    uint4 v = *(const uint4 *)p;
    w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
}
/* Through the read-only cache: for the Gram partials, which write nothing of the data. */
__device__ __forceinline__ void load16_ro(const void *p, uint32_t w[4])
{
    uint4 v = __ldg((const uint4 *)p);
    w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
}
__device__ __forceinline__ void store16(void *p, const uint32_t w[4])
{
    *(uint4 *)p = make_uint4(w[0], w[1], w[2], w[3]);
}
HD bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* ---- pieces, and the layout-aware kernels' storage classes ------------------------------- */

/* The piece holding item `item`: the last piece whose first_item <= item. */
HD size_t piece_of(const sumo_cuda__piece *pieces, size_t npieces, size_t item)
{
    size_t lo = 0, hi = npieces;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (pieces[mid].first_item <= item) lo = mid;
        else hi = mid;
    }
    return lo;
}

/* A launch's pieces, weights and wide flags: the kernel-visible arrays where the caller set
 * them (uploaded, or the device combine's weights), else the launch's arguments (the kernels
 * take their argument struct as __grid_constant__, so these addresses are the arguments' own,
 * not a per-thread copy). */
template <typename ARGS> HD const sumo_cuda__piece *pieces_of(const ARGS &a)
{
    return a.pieces ? a.pieces : a.inl;
}
HD const double *weights_of(const sumo_cuda__wsum_args &a) { return a.w ? a.w : a.inl_w; }
HD const unsigned char *wide_of(const sumo_cuda__wsum_args &a)
{
    return a.wide ? a.wide : a.inl_wide;
}

/*
 * The Gram partials and the weighted sum are compiled per storage class, not per dtype: fp16
 * and bf16 share one kernel (the format is a run-time flag: one uniform branch per
 * conversion), which halves what nvcc compiles. DC is SUMO_FLOAT32, SUMO_FLOAT64 or
 * SUMO_FLOAT16 (any 16-bit format).
 */
template <int DC> HD float val_f(uint64_t b, bool bf)
{
    if (DC == SUMO_FLOAT16) return bf ? sumo__bf16_to_float((uint16_t)b) : sumo__half_to_float((uint16_t)b);
    return sumo__f32_from_bits((uint32_t)b);
}
template <int DC> HD double val_d(uint64_t b, bool bf)
{
    if (DC == SUMO_FLOAT64) return sumo__f64_from_bits(b);
    return (double)val_f<DC>(b, bf);
}
template <int DC> HD uint64_t round_f(float v, bool bf)
{
    if (DC == SUMO_FLOAT16) return bf ? sumo__float_to_bf16(v) : sumo__float_to_half(v);
    return sumo__f32_bits(v);
}
template <int DC> HD uint64_t round_d(double v, bool bf)
{
    if (DC == SUMO_FLOAT64) return sumo__f64_bits(v);
    if (DC == SUMO_FLOAT32) return sumo__f32_bits((float)v);
    return bf ? sumo__double_to_bf16(v) : sumo__double_to_half(v);
}
HD int dclass(sumo_dtype dt) { return dt == SUMO_BFLOAT16 ? SUMO_FLOAT16 : (int)dt; }
/* Element i's storage bits. */
template <int DC> HD uint64_t elem_bits(const void *p, size_t i)
{
    if (DC == SUMO_FLOAT64) return ((const uint64_t *)p)[i];
    if (DC == SUMO_FLOAT32) return ((const uint32_t *)p)[i];
    return ((const uint16_t *)p)[i];
}

} // namespace

#endif
