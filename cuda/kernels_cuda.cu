/*
 * sumo's kernels for CUDA device memory: the device side of every entry of sumo_ext.h's
 * sumo_kernel_table, with the meaning of sumo's host table (src/kernels/kernel_table.c) entry
 * by entry:
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
/* 16-byte vectors per thread per item: 8 for the Gram partials (32 KiB of each fp32 input per
 * item: long enough that the per-item tree costs little, short enough that 1 MiB still makes
 * 32 blocks) and for the weighted sum. */
constexpr int GRAM_ITERS = 8;
constexpr int WSUM_ITERS = 8;
/* The element-wise kernels' grid: enough blocks to fill any current GPU, grid-stride beyond. */
constexpr unsigned EW_MAX_BLOCKS = 8192;

/* ---- element access per dtype -------------------------------------------------------------- */

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

/* ---- pieces and items ---------------------------------------------------------------------- */

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

template <int DC> __host__ __device__ constexpr size_t gram_chunk() { return (size_t)BLOCK * vec_of<DC>() * GRAM_ITERS; }
template <int DC> __host__ __device__ constexpr size_t wsum_chunk() { return (size_t)BLOCK * vec_of<DC>() * WSUM_ITERS; }

/* The packed index of entry (a, b), a <= b < nin: rows a' < a hold nin - a' entries each. */
HD int gram_index(int nin, int a, int b) { return a * nin - a * (a - 1) / 2 + (b - a); }
HD int gram_len(int nin) { return nin * (nin + 1) / 2; }

/*
 * One kernel per capacity C (2, 4, 8, 16 inputs) serves every input count up to it: inputs
 * from nin up are never loaded and their entries never stored. An entry's sums do not depend
 * on the other entries, so nin = 3 gives the same bits under C = 4 or C = 8: the order
 * depends on the piece's length and nin alone. Up to 8 inputs one block computes the whole
 * triangle (at most 36 accumulators a thread); 16 splits the rows over blocks, RG = 2 rows
 * each (32 accumulators), and those re-read their inputs from memory.
 */
HD constexpr int gram_capacity(int nin) { return nin <= 2 ? 2 : nin <= 4 ? 4 : nin <= 8 ? 8 : 16; }
HD constexpr int gram_rows_of(int cap) { return cap <= 8 ? cap : 2; }

/*
 * Thread `tid`'s sums over its elements of an item: for each vector step `it`, the VEC
 * consecutive elements at it*BLOCK*VEC + tid*VEC, in index order, one fma per entry per
 * element. acc[r][b] holds entry (a0 + r, b) for a0 + r <= b < nin (the rest stays 0). On the
 * device a whole vector of every input is loaded first where the item's addresses allow: the
 * same values, added in the same order.
 */
template <int C, int RG> struct gram_acc {
    double v[RG][C];
};

template <int C, int RG> HD void gram_add(gram_acc<C, RG> &acc, const double *x, int a0, int nin)
{
#pragma unroll
    for (int r = 0; r < RG; r++) {
        /* x[a0 + r] without a run-time register index (which would move x to local memory). */
        double xa = 0.0;
#pragma unroll
        for (int k = 0; k < C; k++)
            if (k == a0 + r) xa = x[k];
#pragma unroll
        for (int b = 0; b < C; b++)
            if (a0 + r < nin && b >= a0 + r && b < nin) acc.v[r][b] = fma(xa, x[b], acc.v[r][b]);
    }
}

template <int DC> HD uint64_t elem_bits(const void *p, size_t i)
{
    if (DC == SUMO_FLOAT64) return ((const uint64_t *)p)[i];
    if (DC == SUMO_FLOAT32) return ((const uint32_t *)p)[i];
    return ((const uint16_t *)p)[i];
}

template <int DC, int C, int RG>
HD void gram_elems_scalar(const sumo_cuda__gram_args &a, size_t cstart, size_t e0, size_t e1,
                          int a0, bool bf, gram_acc<C, RG> &acc)
{
    for (size_t e = e0; e < e1; e++) {
        double x[C];
#pragma unroll
        for (int k = 0; k < C; k++)
            x[k] = k >= a0 && k < a.nin ? val_d<DC>(elem_bits<DC>(a.ins[k], cstart + e), bf) : 0.0;
        gram_add<C, RG>(acc, x, a0, a.nin);
    }
}

template <int DC, int C, int RG>
HD void gram_thread_scalar(const sumo_cuda__gram_args &a, size_t cstart, size_t clen, int tid,
                           int a0, gram_acc<C, RG> &acc)
{
    constexpr int V = vec_of<DC>();
    const bool bf = a.dtype == SUMO_BFLOAT16;
    for (int it = 0; it < GRAM_ITERS; it++) {
        size_t e0 = (size_t)it * BLOCK * V + (size_t)tid * V;
        if (e0 >= clen) break;
        gram_elems_scalar<DC, C, RG>(a, cstart, e0, e0 + V < clen ? e0 + V : clen, a0, bf, acc);
    }
}

/* The fixed-order tree of one block: each warp's 32 values by halving distances (lane l adds
 * lane l + o, o = 16 .. 1), then the warps' results in warp order. The emulator's copy of
 * warp_tree and the loops that follow it in the kernels. */
HD double tree_of_block(const double *vals /* BLOCK */)
{
    double w[WARPS];
    for (int wi = 0; wi < WARPS; wi++) {
        double lane[32];
        for (int l = 0; l < 32; l++) lane[l] = vals[wi * 32 + l];
        for (int o = 16; o > 0; o >>= 1)
            for (int l = 0; l < o; l++) lane[l] = lane[l] + lane[l + o];
        w[wi] = lane[0];
    }
    double s = w[0];
    for (int wi = 1; wi < WARPS; wi++) s = s + w[wi];
    return s;
}

__device__ __forceinline__ double warp_tree(double v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = v + __shfl_down_sync(0xffffffffu, v, o);
    return v;
}

/* Every input's 16 bytes at element e of the item (inputs from nin up are not read). */
template <int C>
__device__ __forceinline__ void gram_load(const sumo_cuda__gram_args &a, size_t e, uint32_t w[C][4], int esz_)
{
#pragma unroll
    for (int k = 0; k < C; k++)
        if (k < a.nin) load16_ro(at(a.ins[k], e, esz_), w[k]);
}

template <int DC, int C, int RG>
__global__ void __launch_bounds__(BLOCK) gram_items_kernel(const sumo_cuda__gram_args a)
{
    constexpr int V = vec_of<DC>();
    constexpr int esz = dt_traits<DC>::esz;
    constexpr size_t CH = gram_chunk<DC>();
    __shared__ double warp_sums[WARPS][RG * C];
    const size_t item = blockIdx.x;
    /* A compile-time 0 with one row group, so the lower triangle's FMAs fold away. */
    const int a0 = RG == C ? 0 : (int)blockIdx.y * RG;
    const int nin = a.nin;
    const bool bf = a.dtype == SUMO_BFLOAT16;
    const sumo_cuda__piece pc = a.pieces[piece_of(a.pieces, a.npieces, item)];
    const size_t c = item - pc.first_item, cstart = pc.start + c * CH;
    const size_t clen = pc.len - c * CH < CH ? pc.len - c * CH : CH;
    const int tid = threadIdx.x;
    gram_acc<C, RG> acc;
#pragma unroll
    for (int r = 0; r < RG; r++)
#pragma unroll
        for (int b = 0; b < C; b++) acc.v[r][b] = 0.0;
    /* 16-byte loads where every input of the item is aligned (all items of a piece alike);
     * the split triangle (C = 16) loads element by element, keeping its registers for sums. */
    bool vec_ok = RG == C;
#pragma unroll
    for (int k = 0; k < C; k++)
        if (k < nin) vec_ok = vec_ok && aligned16(at(a.ins[k], cstart, esz));
    if (RG == C && vec_ok) {
        /* Whole vectors, the next one's loads issued before this one's FMAs so that memory
         * stays busy while they run; then the one partial vector a thread can have, last. */
        size_t e0 = (size_t)tid * V;
        int it = 0;
        uint32_t w[C][4];
        bool have = e0 + V <= clen;
        if (have) gram_load<C>(a, cstart + e0, w, esz);
        while (have) {
            const size_t e1 = e0 + (size_t)BLOCK * V;
            const bool next = it + 1 < GRAM_ITERS && e1 + V <= clen;
            uint32_t wn[C][4];
            if (next) gram_load<C>(a, cstart + e1, wn, esz);
#pragma unroll
            for (int v = 0; v < V; v++) {
                double x[C];
#pragma unroll
                for (int k = 0; k < C; k++) x[k] = k < nin ? val_d<DC>(word_elem<DC>(w[k], v), bf) : 0.0;
                gram_add<C, RG>(acc, x, a0, nin);
            }
#pragma unroll
            for (int k = 0; k < C; k++)
#pragma unroll
                for (int j = 0; j < 4; j++) w[k][j] = wn[k][j];
            e0 = e1;
            it++;
            have = next;
        }
        if (it < GRAM_ITERS && e0 < clen)
            gram_elems_scalar<DC, C, RG>(a, cstart, e0, e0 + V < clen ? e0 + V : clen, a0, bf, acc);
    } else {
        for (int it = 0; it < GRAM_ITERS; it++) {
            size_t e0 = (size_t)it * BLOCK * V + (size_t)tid * V;
            if (e0 >= clen) break;
            gram_elems_scalar<DC, C, RG>(a, cstart, e0, e0 + V < clen ? e0 + V : clen, a0, bf, acc);
        }
    }
    const int lane = tid & 31, warp = tid >> 5;
#pragma unroll
    for (int r = 0; r < RG; r++)
#pragma unroll
        for (int b = 0; b < C; b++)
            /* Entries of the triangle only (uniform over the block: every lane shuffles). */
            if (a0 + r < nin && b >= a0 + r && b < nin) {
                double s = warp_tree(acc.v[r][b]);
                if (lane == 0) warp_sums[warp][r * C + b] = s;
            }
    __syncthreads();
    double *out = a.partials + item * (size_t)gram_len(nin);
    for (int q = tid; q < RG * C; q += BLOCK) {
        int r = q / C, b = q % C, row = a0 + r;
        if (row >= nin || b < row || b >= nin) continue;
        double s = warp_sums[0][q];
        for (int wi = 1; wi < WARPS; wi++) s = s + warp_sums[wi][q];
        out[gram_index(nin, row, b)] = s;
    }
}

/* Each piece's items summed in item order per thread (thread j: items j, j + BLOCK, ..), then
 * the block's tree: one block per piece, one entry after the other. */
__global__ void __launch_bounds__(BLOCK) gram_totals_kernel(const sumo_cuda__gram_args a, size_t CH)
{
    __shared__ double warp_sums[WARPS];
    const int L = gram_len(a.nin);
    const size_t p = blockIdx.x;
    const sumo_cuda__piece pc = a.pieces[p];
    const size_t nitems = (pc.len + CH - 1) / CH;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    for (int q = 0; q < L; q++) {
        double s = 0.0;
        for (size_t j = (size_t)tid; j < nitems; j += BLOCK) s = s + a.partials[(pc.first_item + j) * L + q];
        s = warp_tree(s);
        if (lane == 0) warp_sums[warp] = s;
        __syncthreads();
        if (tid == 0) {
            double t = warp_sums[0];
            for (int wi = 1; wi < WARPS; wi++) t = t + warp_sums[wi];
            a.totals[p * L + q] = t;
        }
        __syncthreads();
    }
}

template <int DC, int C> int gram_launch_t(const sumo_cuda__gram_args *a, cudaStream_t s)
{
    constexpr int RG = gram_rows_of(C);
    dim3 grid((unsigned)a->nitems, (unsigned)((a->nin + RG - 1) / RG));
    gram_items_kernel<DC, C, RG><<<grid, BLOCK, 0, s>>>(*a);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return (int)e;
    gram_totals_kernel<<<(unsigned)a->npieces, BLOCK, 0, s>>>(*a, gram_chunk<DC>());
    return (int)cudaGetLastError();
}

template <int DC, int C> void gram_emulate_t(const sumo_cuda__gram_args *a)
{
    constexpr int RG = gram_rows_of(C);
    constexpr size_t CH = gram_chunk<DC>();
    const int nin = a->nin, L = gram_len(nin);
    /* malloc, not new: the library then needs no C++ runtime. */
    double *vals = (double *)malloc(sizeof(double) * BLOCK);
    gram_acc<C, RG> *accs = (gram_acc<C, RG> *)malloc(sizeof(gram_acc<C, RG>) * BLOCK);
    if (vals == NULL || accs == NULL) {
        free(vals);
        free(accs);
        return;
    }
    for (size_t item = 0; item < a->nitems; item++) {
        const sumo_cuda__piece pc = a->pieces[piece_of(a->pieces, a->npieces, item)];
        const size_t c = item - pc.first_item, cstart = pc.start + c * CH;
        const size_t clen = pc.len - c * CH < CH ? pc.len - c * CH : CH;
        for (int a0 = 0; a0 < nin; a0 += RG) {
            for (int t = 0; t < BLOCK; t++) {
                accs[t] = gram_acc<C, RG>{};
                gram_thread_scalar<DC, C, RG>(*a, cstart, clen, t, a0, accs[t]);
            }
            for (int r = 0; r < RG && a0 + r < nin; r++)
                for (int b = a0 + r; b < nin; b++) {
                    for (int t = 0; t < BLOCK; t++) vals[t] = accs[t].v[r][b];
                    a->partials[item * L + gram_index(nin, a0 + r, b)] = tree_of_block(vals);
                }
        }
    }
    for (size_t p = 0; p < a->npieces; p++) {
        const sumo_cuda__piece pc = a->pieces[p];
        const size_t nitems = (pc.len + CH - 1) / CH;
        for (int q = 0; q < L; q++) {
            for (int t = 0; t < BLOCK; t++) {
                double s = 0.0;
                for (size_t j = (size_t)t; j < nitems; j += BLOCK) s = s + a->partials[(pc.first_item + j) * L + q];
                vals[t] = s;
            }
            a->totals[p * L + q] = tree_of_block(vals);
        }
    }
    free(accs);
    free(vals);
}

template <int DC> int gram_dispatch(const sumo_cuda__gram_args *a, cudaStream_t s, bool emulate)
{
    switch (gram_capacity(a->nin)) {
    case 2: return emulate ? (gram_emulate_t<DC, 2>(a), 0) : gram_launch_t<DC, 2>(a, s);
    case 4: return emulate ? (gram_emulate_t<DC, 4>(a), 0) : gram_launch_t<DC, 4>(a, s);
    case 8: return emulate ? (gram_emulate_t<DC, 8>(a), 0) : gram_launch_t<DC, 8>(a, s);
    default: return emulate ? (gram_emulate_t<DC, 16>(a), 0) : gram_launch_t<DC, 16>(a, s);
    }
}

int gram_run(const sumo_cuda__gram_args *a, cudaStream_t s, bool emulate)
{
    if (a->nin < 1 || a->nin > SUMO_CUDA__MAX_IN) return (int)cudaErrorInvalidValue;
    switch (dclass(a->dtype)) {
    case SUMO_FLOAT32: return gram_dispatch<SUMO_FLOAT32>(a, s, emulate);
    case SUMO_FLOAT64: return gram_dispatch<SUMO_FLOAT64>(a, s, emulate);
    case SUMO_FLOAT16: return gram_dispatch<SUMO_FLOAT16>(a, s, emulate);
    default: return (int)cudaErrorInvalidValue;
    }
}

/* ---- the weighted sum -------------------------------------------------------------------- */

/*
 * One element, in the host kernels' order: fp32 and fp64 in double (w0 x0, then fma per
 * input, rounded once); fp16 and bf16 in fp32 with the weights narrowed to float, or in double
 * where a weight does not narrow (`wide`), rounded once through round-to-odd.
 */
template <int DC>
HD uint64_t wsum_elem(const sumo_cuda__wsum_args &a, size_t i, const double *wd, const float *wf,
                      bool wide, bool bf)
{
    if (DC != SUMO_FLOAT16 || wide) {
        double v = wd[0] * val_d<DC>(elem_bits<DC>(a.ins[0], i), bf);
        for (int k = 1; k < a.nin; k++) v = fma(wd[k], val_d<DC>(elem_bits<DC>(a.ins[k], i), bf), v);
        return round_d<DC>(v, bf);
    }
    float v = wf[0] * val_f<DC>(elem_bits<DC>(a.ins[0], i), bf);
    for (int k = 1; k < a.nin; k++) v = fmaf(wf[k], val_f<DC>(elem_bits<DC>(a.ins[k], i), bf), v);
    return round_f<DC>(v, bf);
}

template <int DC>
HD void wsum_scalar_range(const sumo_cuda__wsum_args &a, size_t e0, size_t e1, const double *wd,
                          const float *wf, bool wide, bool bf)
{
    for (size_t e = e0; e < e1; e++) {
        uint64_t y = wsum_elem<DC>(a, e, wd, wf, wide, bf);
        for (int o = 0; o < a.nout; o++) store_bits<DC>(a.outs[o], e, y);
    }
}

HD double fma_acc(double a, double b, double c) { return fma(a, b, c); }
HD float fma_acc(float a, float b, float c) { return fmaf(a, b, c); }
template <int DC, typename ACC> HD ACC val_as(uint64_t b, bool bf)
{
    if (sizeof(ACC) == 8) return (ACC)val_d<DC>(b, bf);
    return (ACC)val_f<DC>(b, bf);
}

/* V elements from 16-byte vectors: the same arithmetic as wsum_elem, input by input. */
template <int DC, typename ACC>
__device__ __forceinline__ void wsum_vec(const sumo_cuda__wsum_args &a, size_t e0, const ACC *w,
                                         bool bf, uint32_t y[4])
{
    constexpr int V = vec_of<DC>();
    constexpr int esz = dt_traits<DC>::esz;
    ACC acc[V];
    uint32_t x[4];
    load16(at(a.ins[0], e0, esz), x);
#pragma unroll
    for (int v = 0; v < V; v++) acc[v] = w[0] * val_as<DC, ACC>(word_elem<DC>(x, v), bf);
    for (int k = 1; k < a.nin; k++) {
        load16(at(a.ins[k], e0, esz), x);
#pragma unroll
        for (int v = 0; v < V; v++) acc[v] = fma_acc(w[k], val_as<DC, ACC>(word_elem<DC>(x, v), bf), acc[v]);
    }
#pragma unroll
    for (int v = 0; v < V; v++) {
        uint64_t r = sizeof(ACC) == 8 ? round_d<DC>((double)acc[v], bf) : round_f<DC>((float)acc[v], bf);
        word_set<DC>(y, v, r);
    }
}

template <int DC> __global__ void __launch_bounds__(BLOCK) wsum_kernel(const sumo_cuda__wsum_args a)
{
    constexpr int V = vec_of<DC>();
    constexpr int esz = dt_traits<DC>::esz;
    constexpr size_t CH = wsum_chunk<DC>();
    __shared__ double wd[SUMO_CUDA__MAX_IN];
    __shared__ float wf[SUMO_CUDA__MAX_IN];
    const size_t item = blockIdx.x;
    const size_t p = piece_of(a.pieces, a.npieces, item);
    const sumo_cuda__piece pc = a.pieces[p];
    const size_t c = item - pc.first_item, cstart = pc.start + c * CH;
    const size_t clen = pc.len - c * CH < CH ? pc.len - c * CH : CH;
    if (threadIdx.x < (unsigned)a.nin) {
        wd[threadIdx.x] = a.w[p * (size_t)a.nin + threadIdx.x];
        wf[threadIdx.x] = (float)wd[threadIdx.x];
    }
    __syncthreads();
    const bool wide = a.wide[p] != 0, bf = a.dtype == SUMO_BFLOAT16;
    bool vec_ok = true;
    for (int k = 0; k < a.nin; k++) vec_ok = vec_ok && aligned16(at(a.ins[k], cstart, esz));
    for (int o = 0; o < a.nout; o++) vec_ok = vec_ok && aligned16(at(a.outs[o], cstart, esz));
    for (int it = 0; it < WSUM_ITERS; it++) {
        size_t e0 = (size_t)it * BLOCK * V + (size_t)threadIdx.x * V;
        if (e0 >= clen) break;
        if (vec_ok && e0 + V <= clen) {
            uint32_t y[4];
            if (DC != SUMO_FLOAT16 || wide) wsum_vec<DC, double>(a, cstart + e0, wd, bf, y);
            else wsum_vec<DC, float>(a, cstart + e0, wf, bf, y);
            /* Every input of these elements was read before any output is written: an output
             * may be an input (in place). */
            for (int o = 0; o < a.nout; o++) store16((void *)at(a.outs[o], cstart + e0, esz), y);
        } else {
            size_t e1 = e0 + V < clen ? e0 + V : clen;
            wsum_scalar_range<DC>(a, cstart + e0, cstart + e1, wd, wf, wide, bf);
        }
    }
}

template <int DC> int wsum_launch_t(const sumo_cuda__wsum_args *a, cudaStream_t s)
{
    wsum_kernel<DC><<<(unsigned)a->nitems, BLOCK, 0, s>>>(*a);
    return (int)cudaGetLastError();
}

template <int DC> void wsum_emulate_t(const sumo_cuda__wsum_args *a)
{
    constexpr size_t CH = wsum_chunk<DC>();
    const bool bf = a->dtype == SUMO_BFLOAT16;
    for (size_t p = 0; p < a->npieces; p++) {
        const sumo_cuda__piece pc = a->pieces[p];
        double wd[SUMO_CUDA__MAX_IN];
        float wf[SUMO_CUDA__MAX_IN];
        for (int k = 0; k < a->nin; k++) {
            wd[k] = a->w[p * (size_t)a->nin + k];
            wf[k] = (float)wd[k];
        }
        for (size_t c = 0; c * CH < pc.len; c++) {
            size_t cstart = pc.start + c * CH, clen = pc.len - c * CH < CH ? pc.len - c * CH : CH;
            wsum_scalar_range<DC>(*a, cstart, cstart + clen, wd, wf, a->wide[p] != 0, bf);
        }
    }
}

int wsum_run(const sumo_cuda__wsum_args *a, cudaStream_t s, bool emulate)
{
    if (a->nin < 1 || a->nin > SUMO_CUDA__MAX_IN || a->nout < 1 || a->nout > SUMO_CUDA__MAX_IN)
        return (int)cudaErrorInvalidValue;
    switch (dclass(a->dtype)) {
    case SUMO_FLOAT32: return emulate ? (wsum_emulate_t<SUMO_FLOAT32>(a), 0) : wsum_launch_t<SUMO_FLOAT32>(a, s);
    case SUMO_FLOAT64: return emulate ? (wsum_emulate_t<SUMO_FLOAT64>(a), 0) : wsum_launch_t<SUMO_FLOAT64>(a, s);
    case SUMO_FLOAT16: return emulate ? (wsum_emulate_t<SUMO_FLOAT16>(a), 0) : wsum_launch_t<SUMO_FLOAT16>(a, s);
    default: return (int)cudaErrorInvalidValue;
    }
}

/* ---- element-wise kernels ------------------------------------------------------------------ */

HD const void *in_ptr(const sumo_cuda__ew_args &a, int j)
{
    return a.ins_far ? a.ins_far[j] : a.ins[j];
}
HD void *out_ptr(const sumo_cuda__ew_args &a, int k)
{
    return a.outs_far ? a.outs_far[k] : a.outs[k];
}

/* Element i of each entry, in the host table's arithmetic (kernel_table.c, kernels.c). */
template <int DT> HD void reduce_elem(const sumo_cuda__ew_args &a, size_t i)
{
    uint64_t bits;
    if (DT == SUMO_FLOAT64) {
        double v = load_d<DT>(in_ptr(a, 0), i);
        for (int j = 1; j < a.nin; j++) v = v + load_d<DT>(in_ptr(a, j), i);
        if (a.divisor != 1) v = v / (double)a.divisor;
        bits = sumo__f64_bits(v);
    } else {
        float v = load_f<DT>(in_ptr(a, 0), i);
        for (int j = 1; j < a.nin; j++) v = v + load_f<DT>(in_ptr(a, j), i);
        if (a.divisor != 1) v = v / (float)a.divisor;
        bits = narrow_f<DT>(v);
    }
    for (int k = 0; k < a.nout; k++) store_bits<DT>(out_ptr(a, k), i, bits);
}

template <int DT> HD void scaled_add_elem(const sumo_cuda__ew_args &a, size_t i)
{
    if (DT == SUMO_FLOAT64) {
        double x = load_d<DT>(a.dst, i), y = load_d<DT>(a.a, i);
        store_bits<DT>(a.dst, i, sumo__f64_bits(fma(a.ca, x, a.cb * y)));
    } else if (DT == SUMO_FLOAT32) {
        double x = load_d<DT>(a.dst, i), y = load_d<DT>(a.a, i);
        store_bits<DT>(a.dst, i, sumo__f32_bits((float)fma(a.ca, x, a.cb * y)));
    } else if (a.wide) {
        double v = fma(a.ca, (double)load_f<DT>(a.dst, i), a.cb * (double)load_f<DT>(a.a, i));
        store_bits<DT>(a.dst, i, narrow_d<DT>(v));
    } else {
        float fa = (float)a.ca, fb = (float)a.cb;
        float v = fmaf(fa, load_f<DT>(a.dst, i), fb * load_f<DT>(a.a, i));
        store_bits<DT>(a.dst, i, narrow_f<DT>(v));
    }
}

template <int DT> HD void delta_elem(const sumo_cuda__ew_args &a, size_t i)
{
    if (DT == SUMO_FLOAT64)
        store_bits<DT>(a.dst, i, sumo__f64_bits(load_d<DT>(a.a, i) - load_d<DT>(a.b, i)));
    else
        store_bits<DT>(a.dst, i, narrow_f<DT>(load_f<DT>(a.a, i) - load_f<DT>(a.b, i)));
}

/* Whether a stored element is NaN or Inf: its exponent is all ones. */
template <int DT> HD bool nonfinite_bits(uint64_t b)
{
    if (DT == SUMO_FLOAT64) return (b & 0x7ff0000000000000ull) == 0x7ff0000000000000ull;
    if (DT == SUMO_FLOAT32) return (b & 0x7f800000u) == 0x7f800000u;
    if (DT == SUMO_FLOAT16) return (b & 0x7c00u) == 0x7c00u;
    return (b & 0x7f80u) == 0x7f80u;
}

/* params = start + delta; true when the stored result is not finite. */
template <int DT> HD bool apply_elem(const sumo_cuda__ew_args &a, size_t i)
{
    uint64_t bits;
    if (DT == SUMO_FLOAT64) bits = sumo__f64_bits(load_d<DT>(a.a, i) + load_d<DT>(a.b, i));
    else bits = narrow_f<DT>(load_f<DT>(a.a, i) + load_f<DT>(a.b, i));
    store_bits<DT>(a.dst, i, bits);
    return nonfinite_bits<DT>(bits);
}

/* SlowMo's outer update (kernel_table.c's SLOW_UPDATE): u from the stored values in double,
 * x from the unrounded u, NaN where the stored u is not finite. The NaN is the host's
 * (quiet, positive) bit pattern, not a conversion's, so the results match bit for bit. */
template <int DT> HD void slow_elem(const sumo_cuda__ew_args &a, size_t i)
{
    void *xs = a.dst, *us = a.c, *x0s = a.d;
    double x0d = load_d<DT>(x0s, i);
    double ud = a.beta * load_d<DT>(us, i) + (x0d - load_d<DT>(xs, i)) / a.gamma;
    uint64_t ub = narrow_d<DT>(ud);
    double xd = x0d - a.step * ud;
    uint64_t xb = nonfinite_bits<DT>(ub) ? (DT == SUMO_FLOAT64 ? 0x7ff8000000000000ull : 0x7fc00000u)
                                         : narrow_d<DT>(xd);
    store_bits<DT>(us, i, ub);
    store_bits<DT>(xs, i, xb);
    store_bits<DT>(x0s, i, xb);
}

/* DiLoCo's outer step (kernel_table.c's OUTER_UPDATE): the momentum and g from the stored
 * values in double, g from the unrounded momentum, NaN where the stored momentum is not
 * finite; merge 0 stores g itself. */
template <int DT> HD void outer_elem(const sumo_cuda__ew_args &a, size_t i)
{
    void *xs = a.dst, *vs = a.c, *x0s = a.d;
    double x0d = load_d<DT>(x0s, i);
    double d = a.from_average ? x0d - load_d<DT>(a.a, i) : load_d<DT>(a.a, i);
    double vd, gd;
    if (a.nesterov) {
        vd = a.mu * load_d<DT>(vs, i) + d;
        gd = x0d - a.lr * (d + a.mu * vd);
    } else {
        vd = a.mu * load_d<DT>(vs, i) + d / a.gamma;
        gd = x0d - a.lr * vd;
    }
    uint64_t vb = narrow_d<DT>(vd);
    uint64_t gb = nonfinite_bits<DT>(vb) ? (DT == SUMO_FLOAT64 ? 0x7ff8000000000000ull : 0x7fc00000u)
                                         : narrow_d<DT>(gd);
    uint64_t xb = a.merge == 0 ? gb
                               : narrow_d<DT>(a.merge * load_d<DT>(xs, i) + (1 - a.merge) * bits_d<DT>(gb));
    store_bits<DT>(vs, i, vb);
    store_bits<DT>(x0s, i, gb);
    store_bits<DT>(xs, i, xb);
}

HD void convert_elem(const sumo_cuda__ew_args &a, size_t i)
{
    /* kernels.c's sumo__convert_portable: through double when either side is fp64. */
    sumo_dtype sd = a.src_dtype, dd = a.dtype;
    if (sd == SUMO_FLOAT64 || dd == SUMO_FLOAT64) {
        double v;
        switch (sd) {
        case SUMO_FLOAT64: v = load_d<SUMO_FLOAT64>(a.a, i); break;
        case SUMO_FLOAT32: v = load_d<SUMO_FLOAT32>(a.a, i); break;
        case SUMO_FLOAT16: v = load_d<SUMO_FLOAT16>(a.a, i); break;
        default: v = load_d<SUMO_BFLOAT16>(a.a, i); break;
        }
        switch (dd) {
        case SUMO_FLOAT64: store_bits<SUMO_FLOAT64>(a.dst, i, narrow_d<SUMO_FLOAT64>(v)); break;
        case SUMO_FLOAT32: store_bits<SUMO_FLOAT32>(a.dst, i, narrow_d<SUMO_FLOAT32>(v)); break;
        case SUMO_FLOAT16: store_bits<SUMO_FLOAT16>(a.dst, i, narrow_d<SUMO_FLOAT16>(v)); break;
        default: store_bits<SUMO_BFLOAT16>(a.dst, i, narrow_d<SUMO_BFLOAT16>(v)); break;
        }
        return;
    }
    float v;
    switch (sd) {
    case SUMO_FLOAT32: v = load_f<SUMO_FLOAT32>(a.a, i); break;
    case SUMO_FLOAT16: v = load_f<SUMO_FLOAT16>(a.a, i); break;
    default: v = load_f<SUMO_BFLOAT16>(a.a, i); break;
    }
    switch (dd) {
    case SUMO_FLOAT32: store_bits<SUMO_FLOAT32>(a.dst, i, narrow_f<SUMO_FLOAT32>(v)); break;
    case SUMO_FLOAT16: store_bits<SUMO_FLOAT16>(a.dst, i, narrow_f<SUMO_FLOAT16>(v)); break;
    default: store_bits<SUMO_BFLOAT16>(a.dst, i, narrow_f<SUMO_BFLOAT16>(v)); break;
    }
}

/* Element i of the op; true where a scan or apply found a non-finite value. */
template <int DT> HD bool ew_elem(const sumo_cuda__ew_args &a, size_t i)
{
    switch (a.op) {
    case SUMO_CUDA__EW_FILL: store_bits<DT>(a.dst, i, a.pattern); return false;
    case SUMO_CUDA__EW_SCAN: return nonfinite_bits<DT>(load_bits<DT>(a.a, i));
    case SUMO_CUDA__EW_REDUCE: reduce_elem<DT>(a, i); return false;
    case SUMO_CUDA__EW_CONVERT: convert_elem(a, i); return false;
    case SUMO_CUDA__EW_SCALED_ADD: scaled_add_elem<DT>(a, i); return false;
    case SUMO_CUDA__EW_DELTA: delta_elem<DT>(a, i); return false;
    case SUMO_CUDA__EW_APPLY: return apply_elem<DT>(a, i);
    case SUMO_CUDA__EW_SLOW:
        if (DT == SUMO_FLOAT32 || DT == SUMO_FLOAT64) slow_elem<DT>(a, i);
        return false;
    case SUMO_CUDA__EW_OUTER:
        if (DT == SUMO_FLOAT32 || DT == SUMO_FLOAT64) outer_elem<DT>(a, i);
        return false;
    }
    return false;
}

/*
 * The vector forms of the hot entries (fill, reduce, scaled_add, delta): 16 bytes per access
 * where every pointer of the call is 16-byte aligned (the host decides, `vec`); the same
 * per-element arithmetic as ew_elem, so the bits do not depend on the path.
 */
template <int DT> __device__ __forceinline__ void reduce_vec(const sumo_cuda__ew_args &a, size_t i0)
{
    constexpr int V = vec_of<DT>();
    constexpr int esz = dt_traits<DT>::esz;
    uint32_t w[4], y[4];
    if (DT == SUMO_FLOAT64) {
        double v[V];
        load16(at(in_ptr(a, 0), i0, esz), w);
#pragma unroll
        for (int e = 0; e < V; e++) v[e] = bits_d<DT>(word_elem<DT>(w, e));
        for (int j = 1; j < a.nin; j++) {
            load16(at(in_ptr(a, j), i0, esz), w);
#pragma unroll
            for (int e = 0; e < V; e++) v[e] = v[e] + bits_d<DT>(word_elem<DT>(w, e));
        }
#pragma unroll
        for (int e = 0; e < V; e++) {
            if (a.divisor != 1) v[e] = v[e] / (double)a.divisor;
            word_set<DT>(y, e, sumo__f64_bits(v[e]));
        }
    } else {
        float v[V];
        load16(at(in_ptr(a, 0), i0, esz), w);
#pragma unroll
        for (int e = 0; e < V; e++) v[e] = bits_f<DT>(word_elem<DT>(w, e));
        for (int j = 1; j < a.nin; j++) {
            load16(at(in_ptr(a, j), i0, esz), w);
#pragma unroll
            for (int e = 0; e < V; e++) v[e] = v[e] + bits_f<DT>(word_elem<DT>(w, e));
        }
#pragma unroll
        for (int e = 0; e < V; e++) {
            if (a.divisor != 1) v[e] = v[e] / (float)a.divisor;
            word_set<DT>(y, e, narrow_f<DT>(v[e]));
        }
    }
    for (int k = 0; k < a.nout; k++) store16((void *)at(out_ptr(a, k), i0, esz), y);
}

template <int DT> __device__ __forceinline__ void two_vec(const sumo_cuda__ew_args &a, size_t i0)
{
    constexpr int V = vec_of<DT>();
    constexpr int esz = dt_traits<DT>::esz;
    uint32_t wa[4], wb[4], y[4];
    if (a.op == SUMO_CUDA__EW_FILL) {
#pragma unroll
        for (int e = 0; e < V; e++) word_set<DT>(y, e, a.pattern);
        store16((void *)at(a.dst, i0, esz), y);
        return;
    }
    if (a.op == SUMO_CUDA__EW_SCALED_ADD) {
        load16(at(a.dst, i0, esz), wa);
        load16(at(a.a, i0, esz), wb);
    } else { /* delta */
        load16(at(a.a, i0, esz), wa);
        load16(at(a.b, i0, esz), wb);
    }
#pragma unroll
    for (int e = 0; e < V; e++) {
        uint64_t r;
        if (a.op == SUMO_CUDA__EW_SCALED_ADD) {
            if (DT == SUMO_FLOAT64)
                r = sumo__f64_bits(fma(a.ca, bits_d<DT>(word_elem<DT>(wa, e)), a.cb * bits_d<DT>(word_elem<DT>(wb, e))));
            else if (DT == SUMO_FLOAT32)
                r = sumo__f32_bits((float)fma(a.ca, bits_d<DT>(word_elem<DT>(wa, e)), a.cb * bits_d<DT>(word_elem<DT>(wb, e))));
            else if (a.wide)
                r = narrow_d<DT>(fma(a.ca, (double)bits_f<DT>(word_elem<DT>(wa, e)),
                                     a.cb * (double)bits_f<DT>(word_elem<DT>(wb, e))));
            else
                r = narrow_f<DT>(fmaf((float)a.ca, bits_f<DT>(word_elem<DT>(wa, e)),
                                      (float)a.cb * bits_f<DT>(word_elem<DT>(wb, e))));
        } else {
            if (DT == SUMO_FLOAT64)
                r = sumo__f64_bits(bits_d<DT>(word_elem<DT>(wa, e)) - bits_d<DT>(word_elem<DT>(wb, e)));
            else
                r = narrow_f<DT>(bits_f<DT>(word_elem<DT>(wa, e)) - bits_f<DT>(word_elem<DT>(wb, e)));
        }
        word_set<DT>(y, e, r);
    }
    store16((void *)at(a.dst, i0, esz), y);
}

template <int DT> __global__ void __launch_bounds__(BLOCK) ew_kernel(sumo_cuda__ew_args a, bool vec)
{
    constexpr int V = vec_of<DT>();
    const size_t stride = (size_t)gridDim.x * BLOCK;
    unsigned long long first = ~0ull;
    if (vec) {
        const size_t ngroups = a.n / V;
        for (size_t g = (size_t)blockIdx.x * BLOCK + threadIdx.x; g < ngroups; g += stride) {
            size_t i0 = g * V;
            if (a.op == SUMO_CUDA__EW_REDUCE) reduce_vec<DT>(a, i0);
            else two_vec<DT>(a, i0);
        }
        /* The tail (fewer than V elements) one by one. */
        for (size_t i = ngroups * V + (size_t)blockIdx.x * BLOCK + threadIdx.x; i < a.n; i += stride)
            if (ew_elem<DT>(a, i) && i < first) first = i;
    } else {
        for (size_t i = (size_t)blockIdx.x * BLOCK + threadIdx.x; i < a.n; i += stride)
            if (ew_elem<DT>(a, i) && i < first) first = i;
    }
    /* The lowest index wins whatever the order the threads get here (min is exact). */
    if (first != ~0ull) atomicMin(a.first, first);
}

/* Whether the op has a vector form and every pointer it touches is 16-byte aligned. */
bool vector_form(const sumo_cuda__ew_args &a)
{
    switch (a.op) {
    case SUMO_CUDA__EW_FILL: return aligned16(a.dst);
    case SUMO_CUDA__EW_SCALED_ADD: return aligned16(a.dst) && aligned16(a.a);
    case SUMO_CUDA__EW_DELTA: return aligned16(a.dst) && aligned16(a.a) && aligned16(a.b);
    case SUMO_CUDA__EW_REDUCE:
        for (int j = 0; j < a.nin; j++)
            if (!aligned16(in_ptr(a, j))) return false;
        for (int k = 0; k < a.nout; k++)
            if (!aligned16(out_ptr(a, k))) return false;
        return true;
    default: return false;
    }
}

template <int DT> int ew_launch_t(const sumo_cuda__ew_args *a, cudaStream_t s)
{
    const bool vec = !a->ins_far && !a->outs_far && vector_form(*a);
    size_t per_block = (size_t)BLOCK * (vec ? vec_of<DT>() : 1);
    size_t blocks = (a->n + per_block - 1) / per_block;
    if (blocks > EW_MAX_BLOCKS) blocks = EW_MAX_BLOCKS;
    if (blocks == 0) return 0;
    ew_kernel<DT><<<(unsigned)blocks, BLOCK, 0, s>>>(*a, vec);
    return (int)cudaGetLastError();
}

template <int DT> void ew_emulate_t(const sumo_cuda__ew_args *a)
{
    for (size_t i = 0; i < a->n; i++)
        if (ew_elem<DT>(*a, i) && i < *a->first) *a->first = i;
}

/* ---- the compressed allreduce's codec (codec.h's, its per-block steps over threads) ------ */

constexpr unsigned Q_MAX_GRID = 65535;

__global__ void __launch_bounds__(BLOCK) quantize_kernel(sumo_cuda__q_args a, sumo__qformat q)
{
    __shared__ unsigned int s_amax, s_bad;
    const size_t nb = (a.n + a.block - 1) / a.block, bb = sumo__qblock_bytes(&q, a.block);
    for (size_t b = blockIdx.x; b < nb; b += gridDim.x) {
        if (threadIdx.x == 0) {
            s_amax = 0;
            s_bad = SUMO__QNONE;
        }
        __syncthreads();
        size_t lo = b * a.block, len = a.n - lo < a.block ? a.n - lo : a.block;
        const float *src = a.src + lo;
        uint32_t mx = 0, bad = SUMO__QNONE;
        for (size_t j = threadIdx.x; j < len; j += BLOCK) sumo__qscan(src[j], (uint32_t)j, &mx, &bad);
        atomicMax(&s_amax, mx);
        atomicMin(&s_bad, bad);
        __syncthreads();
        int kind = sumo__qblock_kind(&q, s_amax, s_bad);
        int s = kind == SUMO__QVALUES ? sumo__qscale_exponent(&q, s_amax) : 0;
        unsigned char *blk = (unsigned char *)a.payload + b * bb;
        if (threadIdx.x == 0) {
            if (q.scaled) {
                uint32_t w = sumo__qscale_word(kind, s);
                memcpy(blk, &w, 4);
            }
            if (kind == SUMO__QBAD) atomicMin(a.first, (unsigned long long)(lo + s_bad));
        }
        unsigned char *codes = blk + (q.scaled ? 4 : 0);
        for (size_t u = threadIdx.x; u < sumo__qunits(&q, a.block); u += BLOCK)
            sumo__qstore_unit(&q, codes, u, src, len, kind, s);
        __syncthreads(); /* s_amax and s_bad are reset for the next block */
    }
}

__global__ void __launch_bounds__(BLOCK) dequantize_kernel(sumo_cuda__q_args a, sumo__qformat q)
{
    const size_t nb = (a.n + a.block - 1) / a.block, bb = sumo__qblock_bytes(&q, a.block);
    for (size_t b = blockIdx.x; b < nb; b += gridDim.x) {
        size_t lo = b * a.block, len = a.n - lo < a.block ? a.n - lo : a.block;
        const unsigned char *blk = (const unsigned char *)a.payload + b * bb;
        for (size_t j = threadIdx.x; j < len; j += BLOCK) {
            int s;
            int kind = sumo__qblock_scale(&q, blk, &s);
            a.dst[lo + j] = sumo__qvalue_at(&q, blk, kind, s, j);
        }
    }
}

/* The format of a launch, or false (the table checked it: a value from elsewhere). */
bool q_format(const sumo_cuda__q_args *a, sumo__qformat *q)
{
    return sumo__qformat_of((sumo_compression_format)a->format, q);
}

int q_launch(const sumo_cuda__q_args *a, cudaStream_t stream, bool decode)
{
    sumo__qformat q;
    if (!q_format(a, &q)) return (int)cudaErrorInvalidValue;
    size_t nb = (a->n + a->block - 1) / a->block;
    if (nb == 0) return 0;
    unsigned grid = nb < Q_MAX_GRID ? (unsigned)nb : Q_MAX_GRID;
    if (decode) dequantize_kernel<<<grid, BLOCK, 0, stream>>>(*a, q);
    else quantize_kernel<<<grid, BLOCK, 0, stream>>>(*a, q);
    return (int)cudaGetLastError();
}

} // namespace

/* ---- the C entry points ----------------------------------------------------------------- */

extern "C" {

size_t sumo_cuda__gram_chunk(sumo_dtype dtype)
{
    switch (dtype) {
    case SUMO_FLOAT64: return gram_chunk<SUMO_FLOAT64>();
    case SUMO_FLOAT16:
    case SUMO_BFLOAT16: return gram_chunk<SUMO_FLOAT16>();
    default: return gram_chunk<SUMO_FLOAT32>();
    }
}

size_t sumo_cuda__wsum_chunk(sumo_dtype dtype)
{
    switch (dtype) {
    case SUMO_FLOAT64: return wsum_chunk<SUMO_FLOAT64>();
    case SUMO_FLOAT16:
    case SUMO_BFLOAT16: return wsum_chunk<SUMO_FLOAT16>();
    default: return wsum_chunk<SUMO_FLOAT32>();
    }
}

int sumo_cuda__gram_groups(int nin)
{
    int rg = gram_rows_of(gram_capacity(nin));
    return (nin + rg - 1) / rg;
}

int sumo_cuda__gram_launch(const sumo_cuda__gram_args *a, void *stream)
{
    if (a->nitems == 0) return 0;
    return gram_run(a, (cudaStream_t)stream, false);
}

void sumo_cuda__gram_emulate(const sumo_cuda__gram_args *a)
{
    gram_run(a, NULL, true);
}

int sumo_cuda__wsum_launch(const sumo_cuda__wsum_args *a, void *stream)
{
    if (a->nitems == 0) return 0;
    return wsum_run(a, (cudaStream_t)stream, false);
}

void sumo_cuda__wsum_emulate(const sumo_cuda__wsum_args *a)
{
    wsum_run(a, NULL, true);
}

int sumo_cuda__ew_launch(const sumo_cuda__ew_args *a, void *stream)
{
    cudaStream_t s = (cudaStream_t)stream;
    /* convert runs per element with run-time dtypes; its template is the destination's. */
    switch (a->dtype) {
    case SUMO_FLOAT32: return ew_launch_t<SUMO_FLOAT32>(a, s);
    case SUMO_FLOAT64: return ew_launch_t<SUMO_FLOAT64>(a, s);
    case SUMO_FLOAT16: return ew_launch_t<SUMO_FLOAT16>(a, s);
    case SUMO_BFLOAT16: return ew_launch_t<SUMO_BFLOAT16>(a, s);
    default: return (int)cudaErrorInvalidValue;
    }
}

void sumo_cuda__ew_emulate(const sumo_cuda__ew_args *a)
{
    switch (a->dtype) {
    case SUMO_FLOAT32: ew_emulate_t<SUMO_FLOAT32>(a); break;
    case SUMO_FLOAT64: ew_emulate_t<SUMO_FLOAT64>(a); break;
    case SUMO_FLOAT16: ew_emulate_t<SUMO_FLOAT16>(a); break;
    case SUMO_BFLOAT16: ew_emulate_t<SUMO_BFLOAT16>(a); break;
    default: break;
    }
}

int sumo_cuda__quantize_launch(const sumo_cuda__q_args *a, void *stream)
{
    return q_launch(a, (cudaStream_t)stream, false);
}

void sumo_cuda__quantize_emulate(const sumo_cuda__q_args *a)
{
    sumo__qformat q;
    if (!q_format(a, &q)) return;
    size_t first;
    sumo__quantize(&q, a->block, a->payload, a->src, a->n, &first);
    if (first != SIZE_MAX && first < *a->first) *a->first = first;
}

int sumo_cuda__dequantize_launch(const sumo_cuda__q_args *a, void *stream)
{
    return q_launch(a, (cudaStream_t)stream, true);
}

void sumo_cuda__dequantize_emulate(const sumo_cuda__q_args *a)
{
    sumo__qformat q;
    if (q_format(a, &q)) sumo__dequantize(&q, a->block, a->dst, a->payload, a->n);
}

} // extern "C"
