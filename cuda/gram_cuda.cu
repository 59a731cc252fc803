/*
 * The Gram partials of a layout's range (the table's gram_partials and dot_norms) on the
 * device, and their emulator: kernels_cuda.cuh says what the kernels share and why the order
 * is fixed.
 */
#include "kernels_cuda.cuh"

namespace {

/* 16-byte vectors per thread per item: 8 (32 KiB of each fp32 input per item: long enough
 * that the per-item tree costs little, short enough that 1 MiB still makes 32 blocks). */
constexpr int GRAM_ITERS = 8;

template <int DC> __host__ __device__ constexpr size_t gram_chunk() { return (size_t)BLOCK * vec_of<DC>() * GRAM_ITERS; }

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
 * How the whole-triangle kernels keep memory busy. With few sums a thread (C = 2, 4) each
 * thread loads the next 16-byte vector of every input before the FMAs of this one. With 8
 * inputs the 36 sums take 72 registers, and a second set of 8 x 16 bytes held the kernel at
 * 182 registers, one block an SM (12.5% occupancy; DRAM at 41% of peak on an H200). There a
 * thread reads its vector in parts (fp32: 4 bytes, fp16/bf16 and fp64: 8 bytes), one part of
 * every input at a time, no prefetch: under 128 registers, so two blocks share an SM and one
 * block's loads and trees run under the other's FMAs. The first part of a vector brings its
 * whole 32-byte sectors into L1, so DRAM sees the same requests as before and the later parts
 * hit. Parts are the same elements added in the same order: the sums' bits do not depend on
 * this choice, and the emulator has no branch for it.
 */
__host__ __device__ constexpr bool gram_prefetch(int cap) { return cap <= 4; }
template <int DC> __host__ __device__ constexpr int gram_part_words() { return DC == SUMO_FLOAT32 ? 1 : 2; }
/* 0 leaves the choice to ptxas, as before (C = 2, 4 fit 3 to 5 blocks; C = 16 has its own
 * row split). */
__host__ __device__ constexpr int gram_min_blocks(int cap) { return cap == 8 ? 2 : 0; }

/*
 * Thread `tid`'s sums over its elements of an item: for each vector step `it`, the VEC
 * consecutive elements at it*BLOCK*VEC + tid*VEC, in index order, one fma per entry per
 * element. acc[r][b] holds entry (a0 + r, b) for a0 + r <= b < nin (the rest stays 0). On the
 * device a whole vector of every input (with 8 inputs, a part of one: gram_prefetch) is loaded
 * first where the item's addresses allow: the same values, added in the same order.
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

/* Every input's W words (4 or 8 bytes) at element e, in w[k]'s first words (word_elem's
 * layout). */
template <int C, int W>
__device__ __forceinline__ void gram_load_part(const sumo_cuda__gram_args &a, size_t e, uint32_t w[C][4], int esz_)
{
#pragma unroll
    for (int k = 0; k < C; k++)
        if (k < a.nin) {
            if (W == 2) {
                uint2 v = __ldg((const uint2 *)at(a.ins[k], e, esz_));
                w[k][0] = v.x, w[k][1] = v.y;
            } else {
                w[k][0] = __ldg((const uint32_t *)at(a.ins[k], e, esz_));
            }
        }
}

/* The FMAs of N elements held in w (element v of the load at word_elem's index v). */
template <int DC, int C, int RG, int N>
__device__ __forceinline__ void gram_add_words(const uint32_t w[C][4], int a0, int nin, bool bf,
                                               gram_acc<C, RG> &acc)
{
#pragma unroll
    for (int v = 0; v < N; v++) {
        double x[C];
#pragma unroll
        for (int k = 0; k < C; k++) x[k] = k < nin ? val_d<DC>(word_elem<DC>(w[k], v), bf) : 0.0;
        gram_add<C, RG>(acc, x, a0, nin);
    }
}

template <int DC, int C, int RG>
__global__ void __launch_bounds__(BLOCK, gram_min_blocks(C)) gram_items_kernel(const __grid_constant__ sumo_cuda__gram_args a)
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
    const sumo_cuda__piece *pieces = pieces_of(a);
    const sumo_cuda__piece pc = pieces[piece_of(pieces, a.npieces, item)];
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
    if (gram_prefetch(C) && RG == C && vec_ok) {
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
            gram_add_words<DC, C, RG, V>(w, a0, nin, bf, acc);
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
    } else if (!gram_prefetch(C) && RG == C && vec_ok) {
        /* Whole vectors in parts (gram_prefetch says why), then the partial vector. The parts'
         * loop stays rolled: unrolled, ptxas overlaps the parts' loads and spills. */
        constexpr int W = gram_part_words<DC>(), VP = V * W / 4;
        size_t e0 = (size_t)tid * V;
        int it = 0;
        for (; it < GRAM_ITERS && e0 + V <= clen; it++, e0 += (size_t)BLOCK * V)
#pragma unroll 1
            for (int h = 0; h < V; h += VP) {
                uint32_t w[C][4];
                gram_load_part<C, W>(a, cstart + e0 + h, w, esz);
                gram_add_words<DC, C, RG, VP>(w, a0, nin, bf, acc);
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
__global__ void __launch_bounds__(BLOCK) gram_totals_kernel(const __grid_constant__ sumo_cuda__gram_args a, size_t CH)
{
    __shared__ double warp_sums[WARPS];
    const int L = gram_len(a.nin);
    const size_t p = blockIdx.x;
    const sumo_cuda__piece pc = pieces_of(a)[p];
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
        const sumo_cuda__piece *pieces = pieces_of(*a);
        const sumo_cuda__piece pc = pieces[piece_of(pieces, a->npieces, item)];
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
        const sumo_cuda__piece pc = pieces_of(*a)[p];
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

} // namespace

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

} // extern "C"
