/*
 * The compressed allreduce's codec (the table's quantize and dequantize) on the device. The
 * arithmetic is the library's own, codec.h's, compiled here for the device: the kernels only
 * spread its per-block steps over threads (a thread block per codec block; its largest
 * magnitude and first non-finite element found with shared-memory atomics, exact and
 * order-free; then a thread per unit of codes, or per element decoded). The emulators are the
 * host table's own loops over the same steps.
 */
#include "kernels_cuda.cuh"

namespace {

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

extern "C" {

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
