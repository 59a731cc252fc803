/*
 * The element-wise entries of sumo's CUDA kernel table on the device (fill, scan, reduce,
 * convert, scaled_add, delta, apply_delta, outer_update), and their emulator:
 * one kernel per dtype, the op a run-time switch. kernels_cuda.cuh says what every kernel of
 * the plugin shares: the host table's meaning, entry by entry, and its rounding.
 */
#include "kernels_cuda.cuh"

namespace {

/* The element-wise kernels' grid: enough blocks to fill any current GPU, grid-stride beyond. */
constexpr unsigned EW_MAX_BLOCKS = 8192;

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

} // namespace

extern "C" {

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

} // extern "C"
