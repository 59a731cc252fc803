/*
 * The weighted sum of a layout's range (the table's weighted_sum, the Gram form's second
 * pass) on the device, and its emulator: kernels_cuda.cuh says what the kernels share.
 */
#include "kernels_cuda.cuh"

namespace {

/* 16-byte vectors per thread per item, as the Gram partials'. */
constexpr int WSUM_ITERS = 8;

template <int DC> __host__ __device__ constexpr size_t wsum_chunk() { return (size_t)BLOCK * vec_of<DC>() * WSUM_ITERS; }

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

template <int DC> __global__ void __launch_bounds__(BLOCK) wsum_kernel(const __grid_constant__ sumo_cuda__wsum_args a)
{
    constexpr int V = vec_of<DC>();
    constexpr int esz = dt_traits<DC>::esz;
    constexpr size_t CH = wsum_chunk<DC>();
    __shared__ double wd[SUMO_CUDA__MAX_IN];
    __shared__ float wf[SUMO_CUDA__MAX_IN];
    /* Declined weights (the combine's flag): nothing is written, the inputs stay whole. Every
     * thread of the block reads the same word, so the return is uniform. */
    if (a.accept && *a.accept == 0) return;
    const size_t item = blockIdx.x;
    const sumo_cuda__piece *pieces = pieces_of(a);
    const size_t p = piece_of(pieces, a.npieces, item);
    const sumo_cuda__piece pc = pieces[p];
    const size_t c = item - pc.first_item, cstart = pc.start + c * CH;
    const size_t clen = pc.len - c * CH < CH ? pc.len - c * CH : CH;
    if (threadIdx.x < (unsigned)a.nin) {
        wd[threadIdx.x] = weights_of(a)[p * (size_t)a.nin + threadIdx.x];
        wf[threadIdx.x] = (float)wd[threadIdx.x];
    }
    __syncthreads();
    const bool wide = wide_of(a)[p] != 0, bf = a.dtype == SUMO_BFLOAT16;
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
    if (a->accept && *a->accept == 0) return;
    const sumo_cuda__piece *pieces = pieces_of(*a);
    const double *w = weights_of(*a);
    const unsigned char *wide = wide_of(*a);
    for (size_t p = 0; p < a->npieces; p++) {
        const sumo_cuda__piece pc = pieces[p];
        double wd[SUMO_CUDA__MAX_IN];
        float wf[SUMO_CUDA__MAX_IN];
        for (int k = 0; k < a->nin; k++) {
            wd[k] = w[p * (size_t)a->nin + k];
            wf[k] = (float)wd[k];
        }
        for (size_t c = 0; c * CH < pc.len; c++) {
            size_t cstart = pc.start + c * CH, clen = pc.len - c * CH < CH ? pc.len - c * CH : CH;
            wsum_scalar_range<DC>(*a, cstart, cstart + clen, wd, wf, wide[p] != 0, bf);
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

} // namespace

extern "C" {

size_t sumo_cuda__wsum_chunk(sumo_dtype dtype)
{
    switch (dtype) {
    case SUMO_FLOAT64: return wsum_chunk<SUMO_FLOAT64>();
    case SUMO_FLOAT16:
    case SUMO_BFLOAT16: return wsum_chunk<SUMO_FLOAT16>();
    default: return wsum_chunk<SUMO_FLOAT32>();
    }
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

} // extern "C"
