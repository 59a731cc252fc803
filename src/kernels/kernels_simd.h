/*
 * The vector kernels, written once over a small set of primitives and included by each
 * vector path's file (kernels_avx2.c, kernels_avx512.c), which first defines:
 *
 *   SUMO__SIMD_SFX         suffix of the exported names (avx2, avx512)
 *   SUMO__SIMD_TARGET      the target attribute every function here carries
 *   vf, vd, vh             WF floats, WD = WF/2 doubles, WF 16-bit values (fp16/bf16 bits)
 *   WF                     floats per vf
 *   vf_*, vd_*, vh_*       loads/stores (unaligned), arithmetic, conversions: the list is
 *                          kernels_avx2.c's
 *
 * No pointer is ever aligned by peeling: summation order must depend only on n, so the same
 * data at another address gives the same bits. Tails (< one vector) run scalar code whose
 * every operation is the vector one's IEEE twin, and the scalar conversions in kernels.c
 * match the hardware's bit for bit, NaNs included.
 *
 * Each static function is always inlined and called with constant dtypes from a switch, so
 * the dtype tests fold away and every loop is compiled per dtype.
 */
#ifndef SUMO__SIMD_SFX
#error "kernels_simd.h is included by a vector path's file that defines the primitives"
#endif

#include <math.h>

#define SUMO__SIMD_CAT2(a, b) a##_##b
#define SUMO__SIMD_CAT(a, b) SUMO__SIMD_CAT2(a, b)
#define SUMO__SIMD_NAME(name) SUMO__SIMD_CAT(name, SUMO__SIMD_SFX)
#define SIMD_INLINE static inline __attribute__((always_inline)) SUMO__SIMD_TARGET

#define WD (WF / 2)

/* ---- dtype-generic loads and stores through fp32 ----------------------------------------- */

SIMD_INLINE vf ld(sumo_dtype dt, const void *p, size_t i)
{
    switch (dt) {
    case SUMO_FLOAT16: return vf_from_f16(vh_loadu((const uint16_t *)p + i));
    case SUMO_BFLOAT16: return vf_from_bf16(vh_loadu((const uint16_t *)p + i));
    default: return vf_loadu((const float *)p + i);
    }
}

/* One value to nout outputs: narrowed once, stored nout times. */
SIMD_INLINE void st(sumo_dtype dt, void *const *outs, int nout, size_t i, vf v)
{
    if (dt == SUMO_FLOAT32) {
        for (int k = 0; k < nout; k++) vf_storeu((float *)outs[k] + i, v);
        return;
    }
    vh h = dt == SUMO_FLOAT16 ? vh_from_f32_f16(v) : vh_from_f32_bf16(v);
    for (int k = 0; k < nout; k++) vh_storeu((uint16_t *)outs[k] + i, h);
}

SIMD_INLINE float lds(sumo_dtype dt, const void *p, size_t i)
{
    switch (dt) {
    case SUMO_FLOAT16: return sumo__half_to_float(((const uint16_t *)p)[i]);
    case SUMO_BFLOAT16: return sumo__bf16_to_float(((const uint16_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

SIMD_INLINE void sts(sumo_dtype dt, void *const *outs, int nout, size_t i, float v)
{
    if (dt == SUMO_FLOAT32) {
        for (int k = 0; k < nout; k++) ((float *)outs[k])[i] = v;
        return;
    }
    uint16_t h = dt == SUMO_FLOAT16 ? sumo__float_to_half(v) : sumo__float_to_bf16(v);
    for (int k = 0; k < nout; k++) ((uint16_t *)outs[k])[i] = h;
}

/* Copies of the input and output pointer arrays in locals, which the compiler can see no
 * store reach: stores through the outputs may alias anything under -fno-strict-aliasing, and
 * would otherwise force every pointer to be reloaded after each of them. */
SIMD_INLINE void local_pointers(const void *const *ins, int nin, const void **ip,
                                void *const *outs, int nout, void **op)
{
    for (int j = 0; j < nin; j++) ip[j] = ins[j];
    for (int k = 0; k < nout; k++) op[k] = outs[k];
}

/* ---- reduce ------------------------------------------------------------------------------- */

/*
 * Few inputs and outputs: each vector of every input is summed in registers and stored to
 * every output before the next is loaded, so aliasing is safe and traffic is the minimum.
 * Called with constant nin/nout for the common shapes, so the j and k loops unroll.
 */
SIMD_INLINE void reduce_f_direct(sumo_dtype dt, void *const *outs, int nout,
                                 const void *const *ins, int nin, size_t n, int divisor)
{
    const void *ip[4];
    void *op[4];
    local_pointers(ins, nin, ip, outs, nout, op);
    const int divide = divisor != 1;
    const float fdiv = (float)divisor;
    const vf vdiv = vf_set1(fdiv);
    size_t i = 0;
    for (; i + WF <= n; i += WF) {
        vf v = ld(dt, ip[0], i);
        for (int j = 1; j < nin; j++) v = vf_add(v, ld(dt, ip[j], i));
        if (divide) v = vf_div(v, vdiv);
        st(dt, op, nout, i, v);
    }
    for (; i < n; i++) {
        float v = lds(dt, ip[0], i);
        for (int j = 1; j < nin; j++) v = v + lds(dt, ip[j], i);
        if (divide) v = v / fdiv;
        sts(dt, op, nout, i, v);
    }
}

/*
 * Many inputs or outputs: per block, the sum of all inputs but the last builds up in an L1
 * accumulator, one input stream at a time (few streams keep the prefetchers effective); the
 * pass adding the last input writes the outputs. Every input element of a block is read
 * before any output element of it is written.
 */
SIMD_INLINE void reduce_f_blocked(sumo_dtype dt, void *const *outs, int nout,
                                  const void *const *ins, int nin, size_t n, int divisor)
{
    enum { B = SUMO__REDUCE_BLOCK_BYTES / sizeof(float) };
    _Alignas(64) float acc[B];
    const int divide = divisor != 1;
    const float fdiv = (float)divisor;
    const vf vdiv = vf_set1(fdiv);
    for (size_t base = 0; base < n; base += B) {
        const size_t m = SUMO__MIN((size_t)B, n - base), mv = m - m % WF;
        if (nin >= 2) {
            const void *p0 = ins[0];
            size_t i = 0;
            for (; i < mv; i += WF) vf_storeu(acc + i, ld(dt, p0, base + i));
            for (; i < m; i++) acc[i] = lds(dt, p0, base + i);
            for (int j = 1; j < nin - 1; j++) {
                const void *p = ins[j];
                for (i = 0; i < mv; i += WF)
                    vf_storeu(acc + i, vf_add(vf_loadu(acc + i), ld(dt, p, base + i)));
                for (; i < m; i++) acc[i] = acc[i] + lds(dt, p, base + i);
            }
        }
        const void *last = ins[nin - 1];
        size_t i = 0;
        for (; i < mv; i += WF) {
            vf v = ld(dt, last, base + i);
            if (nin >= 2) v = vf_add(vf_loadu(acc + i), v);
            if (divide) v = vf_div(v, vdiv);
            st(dt, outs, nout, base + i, v);
        }
        for (; i < m; i++) {
            float v = lds(dt, last, base + i);
            if (nin >= 2) v = acc[i] + v;
            if (divide) v = v / fdiv;
            sts(dt, outs, nout, base + i, v);
        }
    }
}

SIMD_INLINE void reduce_d_direct(void *const *outs, int nout, const void *const *ins, int nin,
                                 size_t n, int divisor)
{
    const double *ip[4];
    double *op[4];
    for (int j = 0; j < nin; j++) ip[j] = ins[j];
    for (int k = 0; k < nout; k++) op[k] = outs[k];
    const int divide = divisor != 1;
    const double ddiv = (double)divisor;
    const vd vdiv = vd_set1(ddiv);
    size_t i = 0;
    for (; i + WD <= n; i += WD) {
        vd v = vd_loadu(ip[0] + i);
        for (int j = 1; j < nin; j++) v = vd_add(v, vd_loadu(ip[j] + i));
        if (divide) v = vd_div(v, vdiv);
        for (int k = 0; k < nout; k++) vd_storeu(op[k] + i, v);
    }
    for (; i < n; i++) {
        double v = ip[0][i];
        for (int j = 1; j < nin; j++) v = v + ip[j][i];
        if (divide) v = v / ddiv;
        for (int k = 0; k < nout; k++) op[k][i] = v;
    }
}

SIMD_INLINE void reduce_d_blocked(void *const *outs, int nout, const void *const *ins, int nin,
                                  size_t n, int divisor)
{
    enum { B = SUMO__REDUCE_BLOCK_BYTES / sizeof(double) };
    _Alignas(64) double acc[B];
    const int divide = divisor != 1;
    const double ddiv = (double)divisor;
    const vd vdiv = vd_set1(ddiv);
    for (size_t base = 0; base < n; base += B) {
        const size_t m = SUMO__MIN((size_t)B, n - base), mv = m - m % WD;
        if (nin >= 2) {
            const double *p0 = (const double *)ins[0] + base;
            size_t i = 0;
            for (; i < mv; i += WD) vd_storeu(acc + i, vd_loadu(p0 + i));
            for (; i < m; i++) acc[i] = p0[i];
            for (int j = 1; j < nin - 1; j++) {
                const double *p = (const double *)ins[j] + base;
                for (i = 0; i < mv; i += WD)
                    vd_storeu(acc + i, vd_add(vd_loadu(acc + i), vd_loadu(p + i)));
                for (; i < m; i++) acc[i] = acc[i] + p[i];
            }
        }
        const double *last = (const double *)ins[nin - 1] + base;
        size_t i = 0;
        for (; i < mv; i += WD) {
            vd v = vd_loadu(last + i);
            if (nin >= 2) v = vd_add(vd_loadu(acc + i), v);
            if (divide) v = vd_div(v, vdiv);
            for (int k = 0; k < nout; k++) vd_storeu((double *)outs[k] + base + i, v);
        }
        for (; i < m; i++) {
            double v = last[i];
            if (nin >= 2) v = acc[i] + v;
            if (divide) v = v / ddiv;
            for (int k = 0; k < nout; k++) ((double *)outs[k])[base + i] = v;
        }
    }
}

SIMD_INLINE void reduce_f(sumo_dtype dt, void *const *outs, int nout, const void *const *ins,
                          int nin, size_t n, int divisor)
{
    if (nin == 2 && nout == 2) reduce_f_direct(dt, outs, 2, ins, 2, n, divisor);
    else if (nin == 2 && nout == 1) reduce_f_direct(dt, outs, 1, ins, 2, n, divisor);
    else if (nin == 1 && nout == 1) reduce_f_direct(dt, outs, 1, ins, 1, n, divisor);
    else if (nin <= 4 && nout <= 4) reduce_f_direct(dt, outs, nout, ins, nin, n, divisor);
    else reduce_f_blocked(dt, outs, nout, ins, nin, n, divisor);
}

SUMO__SIMD_TARGET void SUMO__SIMD_NAME(sumo__reduce_multi)(sumo_dtype dtype, void *const *outs,
                                                          int nout, const void *const *ins,
                                                          int nin, size_t n, int divisor)
{
    switch (dtype) {
    case SUMO_FLOAT32: reduce_f(SUMO_FLOAT32, outs, nout, ins, nin, n, divisor); break;
    case SUMO_FLOAT16: reduce_f(SUMO_FLOAT16, outs, nout, ins, nin, n, divisor); break;
    case SUMO_BFLOAT16: reduce_f(SUMO_BFLOAT16, outs, nout, ins, nin, n, divisor); break;
    case SUMO_FLOAT64:
        if (nin == 2 && nout == 2) reduce_d_direct(outs, 2, ins, 2, n, divisor);
        else if (nin == 2 && nout == 1) reduce_d_direct(outs, 1, ins, 2, n, divisor);
        else if (nin == 1 && nout == 1) reduce_d_direct(outs, 1, ins, 1, n, divisor);
        else if (nin <= 4 && nout <= 4) reduce_d_direct(outs, nout, ins, nin, n, divisor);
        else reduce_d_blocked(outs, nout, ins, nin, n, divisor);
        break;
    default: break;
    }
}

/* ---- convert ------------------------------------------------------------------------------ */

/* Between fp32, fp16 and bf16 (in place too when both are 16-bit: loads precede stores). */
SIMD_INLINE void convert_ff(sumo_dtype dd, void *dst, sumo_dtype sd, const void *src, size_t n)
{
    void *const outs[1] = {dst};
    size_t i = 0;
    for (; i + WF <= n; i += WF) st(dd, outs, 1, i, ld(sd, src, i));
    for (; i < n; i++) sts(dd, outs, 1, i, lds(sd, src, i));
}

SIMD_INLINE void convert_to_f64(double *dst, sumo_dtype sd, const void *src, size_t n)
{
    size_t i = 0;
    for (; i + WF <= n; i += WF) {
        vf v = ld(sd, src, i);
        vd_storeu(dst + i, vd_from_lo(v));
        vd_storeu(dst + i + WD, vd_from_hi(v));
    }
    for (; i < n; i++) dst[i] = (double)lds(sd, src, i);
}

SUMO__SIMD_TARGET void SUMO__SIMD_NAME(sumo__convert)(sumo_dtype dst_dtype, void *dst,
                                                     sumo_dtype src_dtype, const void *src,
                                                     size_t n)
{
    /* fp64 -> fp16/bf16 needs round-to-odd through fp32; rare enough to stay scalar. */
    if (src_dtype == SUMO_FLOAT64 && dst_dtype != SUMO_FLOAT32) {
        sumo__convert_portable(dst_dtype, dst, src_dtype, src, n);
        return;
    }
    if (src_dtype == SUMO_FLOAT64) {
        float *d = dst;
        const double *s = src;
        size_t i = 0;
        for (; i + WF <= n; i += WF)
            vf_storeu(d + i, vf_from_vd(vd_loadu(s + i), vd_loadu(s + i + WD)));
        for (; i < n; i++) d[i] = (float)s[i];
        return;
    }
#define SUMO__PAIR(d, s) ((int)(d) * SUMO_DTYPE_COUNT + (int)(s))
    switch (SUMO__PAIR(dst_dtype, src_dtype)) {
    case SUMO__PAIR(SUMO_FLOAT64, SUMO_FLOAT32): convert_to_f64(dst, SUMO_FLOAT32, src, n); break;
    case SUMO__PAIR(SUMO_FLOAT64, SUMO_FLOAT16): convert_to_f64(dst, SUMO_FLOAT16, src, n); break;
    case SUMO__PAIR(SUMO_FLOAT64, SUMO_BFLOAT16):
        convert_to_f64(dst, SUMO_BFLOAT16, src, n);
        break;
    case SUMO__PAIR(SUMO_FLOAT32, SUMO_FLOAT16):
        convert_ff(SUMO_FLOAT32, dst, SUMO_FLOAT16, src, n);
        break;
    case SUMO__PAIR(SUMO_FLOAT32, SUMO_BFLOAT16):
        convert_ff(SUMO_FLOAT32, dst, SUMO_BFLOAT16, src, n);
        break;
    case SUMO__PAIR(SUMO_FLOAT16, SUMO_FLOAT32):
        convert_ff(SUMO_FLOAT16, dst, SUMO_FLOAT32, src, n);
        break;
    case SUMO__PAIR(SUMO_BFLOAT16, SUMO_FLOAT32):
        convert_ff(SUMO_BFLOAT16, dst, SUMO_FLOAT32, src, n);
        break;
    case SUMO__PAIR(SUMO_FLOAT16, SUMO_BFLOAT16):
        convert_ff(SUMO_FLOAT16, dst, SUMO_BFLOAT16, src, n);
        break;
    case SUMO__PAIR(SUMO_BFLOAT16, SUMO_FLOAT16):
        convert_ff(SUMO_BFLOAT16, dst, SUMO_FLOAT16, src, n);
        break;
    default: sumo__convert_portable(dst_dtype, dst, src_dtype, src, n); break;
    }
#undef SUMO__PAIR
}

/* ---- dot_norms ---------------------------------------------------------------------------- */

/*
 * Four accumulators per sum, each a full vector of doubles: enough independent FMA chains to
 * hide their latency, so the loop runs at memory speed rather than at one FMA per 4 cycles.
 * The conversions and FMAs fill the out-of-order window enough that fewer loads are in
 * flight than in a plain read loop; prefetching 1 KiB ahead per stream recovers most of the
 * gap (measured on Zen 3: from ~75% to ~90% of a two-stream read's bandwidth). A prefetch
 * past the end does not fault; the address is formed as an integer so it is no C overflow.
 */
#define SUMO__DOT_PREFETCH_BYTES 1024

SIMD_INLINE void prefetch_at(const void *p, size_t byte_offset, size_t bytes, size_t distance)
{
    uintptr_t at = (uintptr_t)p + byte_offset + distance;
    for (size_t k = 0; k < bytes; k += SUMO__CACHELINE) __builtin_prefetch((const void *)(at + k));
}

SIMD_INLINE void prefetch_ahead(const void *p, size_t byte_offset, size_t bytes)
{
    prefetch_at(p, byte_offset, bytes, SUMO__DOT_PREFETCH_BYTES);
}
SIMD_INLINE void dot_f(sumo_dtype dt, const void *a, const void *b, size_t n, double out[3])
{
    vd d0 = vd_zero(), d1 = vd_zero(), d2 = vd_zero(), d3 = vd_zero();
    vd p0 = vd_zero(), p1 = vd_zero(), p2 = vd_zero(), p3 = vd_zero();
    vd q0 = vd_zero(), q1 = vd_zero(), q2 = vd_zero(), q3 = vd_zero();
    size_t i = 0;
    const size_t esz = sumo__dtype_bytes(dt);
    for (; i + 2 * WF <= n; i += 2 * WF) {
        prefetch_ahead(a, i * esz, 2 * WF * esz);
        prefetch_ahead(b, i * esz, 2 * WF * esz);
        vf x = ld(dt, a, i), y = ld(dt, b, i);
        vd xl = vd_from_lo(x), xh = vd_from_hi(x), yl = vd_from_lo(y), yh = vd_from_hi(y);
        d0 = vd_fmadd(xl, yl, d0);
        d1 = vd_fmadd(xh, yh, d1);
        p0 = vd_fmadd(xl, xl, p0);
        p1 = vd_fmadd(xh, xh, p1);
        q0 = vd_fmadd(yl, yl, q0);
        q1 = vd_fmadd(yh, yh, q1);
        x = ld(dt, a, i + WF);
        y = ld(dt, b, i + WF);
        xl = vd_from_lo(x), xh = vd_from_hi(x), yl = vd_from_lo(y), yh = vd_from_hi(y);
        d2 = vd_fmadd(xl, yl, d2);
        d3 = vd_fmadd(xh, yh, d3);
        p2 = vd_fmadd(xl, xl, p2);
        p3 = vd_fmadd(xh, xh, p3);
        q2 = vd_fmadd(yl, yl, q2);
        q3 = vd_fmadd(yh, yh, q3);
    }
    if (i + WF <= n) {
        vf x = ld(dt, a, i), y = ld(dt, b, i);
        vd xl = vd_from_lo(x), xh = vd_from_hi(x), yl = vd_from_lo(y), yh = vd_from_hi(y);
        d0 = vd_fmadd(xl, yl, d0);
        d1 = vd_fmadd(xh, yh, d1);
        p0 = vd_fmadd(xl, xl, p0);
        p1 = vd_fmadd(xh, xh, p1);
        q0 = vd_fmadd(yl, yl, q0);
        q1 = vd_fmadd(yh, yh, q1);
        i += WF;
    }
    double dot = vd_hsum(vd_add(vd_add(d0, d1), vd_add(d2, d3)));
    double aa = vd_hsum(vd_add(vd_add(p0, p1), vd_add(p2, p3)));
    double bb = vd_hsum(vd_add(vd_add(q0, q1), vd_add(q2, q3)));
    for (; i < n; i++) {
        double x = (double)lds(dt, a, i), y = (double)lds(dt, b, i);
        dot = fma(x, y, dot);
        aa = fma(x, x, aa);
        bb = fma(y, y, bb);
    }
    out[0] = dot;
    out[1] = aa;
    out[2] = bb;
}

SIMD_INLINE void dot_d(const double *a, const double *b, size_t n, double out[3])
{
    vd d0 = vd_zero(), d1 = vd_zero(), d2 = vd_zero(), d3 = vd_zero();
    vd p0 = vd_zero(), p1 = vd_zero(), p2 = vd_zero(), p3 = vd_zero();
    vd q0 = vd_zero(), q1 = vd_zero(), q2 = vd_zero(), q3 = vd_zero();
    size_t i = 0;
    for (; i + 4 * WD <= n; i += 4 * WD) {
        prefetch_ahead(a, i * sizeof(double), 4 * WD * sizeof(double));
        prefetch_ahead(b, i * sizeof(double), 4 * WD * sizeof(double));
        vd x0 = vd_loadu(a + i), x1 = vd_loadu(a + i + WD);
        vd y0 = vd_loadu(b + i), y1 = vd_loadu(b + i + WD);
        d0 = vd_fmadd(x0, y0, d0);
        d1 = vd_fmadd(x1, y1, d1);
        p0 = vd_fmadd(x0, x0, p0);
        p1 = vd_fmadd(x1, x1, p1);
        q0 = vd_fmadd(y0, y0, q0);
        q1 = vd_fmadd(y1, y1, q1);
        x0 = vd_loadu(a + i + 2 * WD), x1 = vd_loadu(a + i + 3 * WD);
        y0 = vd_loadu(b + i + 2 * WD), y1 = vd_loadu(b + i + 3 * WD);
        d2 = vd_fmadd(x0, y0, d2);
        d3 = vd_fmadd(x1, y1, d3);
        p2 = vd_fmadd(x0, x0, p2);
        p3 = vd_fmadd(x1, x1, p3);
        q2 = vd_fmadd(y0, y0, q2);
        q3 = vd_fmadd(y1, y1, q3);
    }
    for (; i + WD <= n; i += WD) {
        vd x = vd_loadu(a + i), y = vd_loadu(b + i);
        d0 = vd_fmadd(x, y, d0);
        p0 = vd_fmadd(x, x, p0);
        q0 = vd_fmadd(y, y, q0);
    }
    double dot = vd_hsum(vd_add(vd_add(d0, d1), vd_add(d2, d3)));
    double aa = vd_hsum(vd_add(vd_add(p0, p1), vd_add(p2, p3)));
    double bb = vd_hsum(vd_add(vd_add(q0, q1), vd_add(q2, q3)));
    for (; i < n; i++) {
        dot = fma(a[i], b[i], dot);
        aa = fma(a[i], a[i], aa);
        bb = fma(b[i], b[i], bb);
    }
    out[0] = dot;
    out[1] = aa;
    out[2] = bb;
}

SUMO__SIMD_TARGET void SUMO__SIMD_NAME(sumo__dot_norms)(sumo_dtype dtype, const void *a,
                                                       const void *b, size_t n, double out[3])
{
    switch (dtype) {
    case SUMO_FLOAT32: dot_f(SUMO_FLOAT32, a, b, n, out); break;
    case SUMO_FLOAT16: dot_f(SUMO_FLOAT16, a, b, n, out); break;
    case SUMO_BFLOAT16: dot_f(SUMO_BFLOAT16, a, b, n, out); break;
    case SUMO_FLOAT64: dot_d(a, b, n, out); break;
    default: break;
    }
}

/* ---- scaled_add --------------------------------------------------------------------------- */

SIMD_INLINE void scaled_add_f32(float *a, double ca, const float *b, double cb, size_t n)
{
    const vd vca = vd_set1(ca), vcb = vd_set1(cb);
    size_t i = 0;
    for (; i + WF <= n; i += WF) {
        vf x = vf_loadu(a + i), y = vf_loadu(b + i);
        vd lo = vd_fmadd(vca, vd_from_lo(x), vd_mul(vcb, vd_from_lo(y)));
        vd hi = vd_fmadd(vca, vd_from_hi(x), vd_mul(vcb, vd_from_hi(y)));
        vf_storeu(a + i, vf_from_vd(lo, hi));
    }
    for (; i < n; i++) a[i] = (float)fma(ca, (double)a[i], cb * (double)b[i]);
}

SIMD_INLINE void scaled_add_f64(double *a, double ca, const double *b, double cb, size_t n)
{
    const vd vca = vd_set1(ca), vcb = vd_set1(cb);
    size_t i = 0;
    for (; i + WD <= n; i += WD)
        vd_storeu(a + i, vd_fmadd(vca, vd_loadu(a + i), vd_mul(vcb, vd_loadu(b + i))));
    for (; i < n; i++) a[i] = fma(ca, a[i], cb * b[i]);
}

SIMD_INLINE void scaled_add_half(sumo_dtype dt, void *a, float ca, const void *b, float cb,
                                 size_t n)
{
    void *const outs[1] = {a};
    const vf vca = vf_set1(ca), vcb = vf_set1(cb);
    size_t i = 0;
    for (; i + WF <= n; i += WF)
        st(dt, outs, 1, i, vf_fmadd(vca, ld(dt, a, i), vf_mul(vcb, ld(dt, b, i))));
    for (; i < n; i++) sts(dt, outs, 1, i, fmaf(ca, lds(dt, a, i), cb * lds(dt, b, i)));
}

SUMO__SIMD_TARGET void SUMO__SIMD_NAME(sumo__scaled_add)(sumo_dtype dtype, void *a, double ca,
                                                        const void *b, double cb, size_t n)
{
    switch (dtype) {
    case SUMO_FLOAT32: scaled_add_f32(a, ca, b, cb, n); break;
    case SUMO_FLOAT64: scaled_add_f64(a, ca, b, cb, n); break;
    case SUMO_FLOAT16:
    case SUMO_BFLOAT16:
        if (!sumo__coef_fits_float(ca) || !sumo__coef_fits_float(cb))
            sumo__scaled_add_half_wide(dtype, a, ca, b, cb, n);
        else if (dtype == SUMO_FLOAT16)
            scaled_add_half(SUMO_FLOAT16, a, (float)ca, b, (float)cb, n);
        else
            scaled_add_half(SUMO_BFLOAT16, a, (float)ca, b, (float)cb, n);
        break;
    default: break;
    }
}

/* ---- Gram partials ------------------------------------------------------------------------- */

/*
 * Two inputs are dot_norms' case and take its loop. More: per block of B elements, each input
 * is read once from memory and widened to double into an L1 buffer (zero-padded to whole
 * vectors, and to 4 rows, so padding adds exact zeros); the pairs are then accumulated from
 * the buffer in register tiles of GRAM_ROWS x 4 entries, each a vector of per-lane partial
 * sums (the lower triangle of a diagonal tile is computed and dropped: simpler than masking,
 * and the loads it shares are the expensive part). The order depends on n and nin only.
 */
#define GRAM_COLS 4
/* 8 KiB of widened inputs per block. Measured with gram_bw 64 (AVX-512, one thread, share of
 * the read bandwidth at P = 4 / 8): 16 KiB 89% / 73-75%, 12 KiB 94% / 80%, 8 KiB 96-98% /
 * 83-85%, 4 KiB 87% / 75% (a block ahead is then too short a prefetch distance). The order of
 * the sums does not depend on it: lane i % WD takes element i whatever the block. */
#define GRAM_BUF_DOUBLES 1024

/* Each input is read in blocks, and no input is read while the tiles of a block are computed:
 * prefetching one whole block ahead keeps memory busy through that phase too. */
SIMD_INLINE void gram_widen(sumo_dtype dt, const void *p, size_t base, size_t m, size_t mpad,
                            size_t block, double *dst)
{
    size_t i = 0;
    if (dt == SUMO_FLOAT64) {
        const double *s = (const double *)p + base;
        for (; i + WD <= m; i += WD) {
            prefetch_at(s, i * sizeof(double), WD * sizeof(double), block * sizeof(double));
            vd_storeu(dst + i, vd_loadu(s + i));
        }
        for (; i < m; i++) dst[i] = s[i];
    } else {
        const size_t esz = sumo__dtype_bytes(dt);
        for (; i + WF <= m; i += WF) {
            prefetch_at(p, (base + i) * esz, WF * esz, block * esz);
            vf v = ld(dt, p, base + i);
            vd_storeu(dst + i, vd_from_lo(v));
            vd_storeu(dst + i + WD, vd_from_hi(v));
        }
        for (; i < m; i++) dst[i] = (double)lds(dt, p, base + i);
    }
    for (; i < mpad; i++) dst[i] = 0.0;
}

/* diag: a tile on the diagonal (i0 == j0, GRAM_ROWS == GRAM_COLS), whose entries below it are
 * dropped: a constant at each call, so the compiler leaves out their FMAs (4 x 4: 10 of 16)
 * and the loads the two sides share. The entries kept get the same FMAs in the same order. */
SIMD_INLINE void gram_tile(const double *buf, size_t ld_, int i0, int j0, size_t mpad, vd *acc,
                           int pp, const bool diag)
{
    /* Unrolled by pragma: -O2 keeps loops over small arrays rolled, and the tile's accumulators
     * then live on the stack, one store per FMA, at a third of the read bandwidth. */
    vd a[GRAM_ROWS][GRAM_COLS];
#pragma GCC unroll 4
    for (int r = 0; r < GRAM_ROWS; r++)
#pragma GCC unroll 4
        for (int c = 0; c < GRAM_COLS; c++) a[r][c] = acc[(i0 + r) * pp + j0 + c];
    const double *xr[GRAM_ROWS], *yc[GRAM_COLS];
#pragma GCC unroll 4
    for (int r = 0; r < GRAM_ROWS; r++) xr[r] = buf + (size_t)(i0 + r) * ld_;
#pragma GCC unroll 4
    for (int c = 0; c < GRAM_COLS; c++) yc[c] = buf + (size_t)(j0 + c) * ld_;
    for (size_t e = 0; e < mpad; e += WD) {
        vd x[GRAM_ROWS], y[GRAM_COLS];
#pragma GCC unroll 4
        for (int r = 0; r < GRAM_ROWS; r++) x[r] = vd_loadu(xr[r] + e);
#pragma GCC unroll 4
        for (int c = 0; c < GRAM_COLS; c++) y[c] = diag ? x[c] : vd_loadu(yc[c] + e);
#pragma GCC unroll 4
        for (int r = 0; r < GRAM_ROWS; r++)
#pragma GCC unroll 4
            for (int c = 0; c < GRAM_COLS; c++)
                if (!diag || c >= r) a[r][c] = vd_fmadd(x[r], y[c], a[r][c]);
    }
#pragma GCC unroll 4
    for (int r = 0; r < GRAM_ROWS; r++)
#pragma GCC unroll 4
        for (int c = 0; c < GRAM_COLS; c++) acc[(i0 + r) * pp + j0 + c] = a[r][c];
}

SIMD_INLINE void gram_f(sumo_dtype dt, const void *const *ins, int nin, size_t n, double *out)
{
    if (nin == 2) {
        double t[3];
        if (dt == SUMO_FLOAT64) dot_d(ins[0], ins[1], n, t);
        else dot_f(dt, ins[0], ins[1], n, t);
        out[0] = t[1];
        out[1] = t[0];
        out[2] = t[2];
        return;
    }
    const int pp = (nin + 3) / 4 * 4;
    /* Elements per input and block: a multiple of WF that fills the buffer. */
    const size_t B = GRAM_BUF_DOUBLES / (size_t)pp / WF * WF;
    _Alignas(64) double buf[GRAM_BUF_DOUBLES];
    vd acc[SUMO__GRAM_MAX_IN * SUMO__GRAM_MAX_IN];
    for (int k = 0; k < pp * pp; k++) acc[k] = vd_zero();
    for (size_t k = (size_t)nin * B; k < (size_t)pp * B; k++) buf[k] = 0.0; /* never written */
    for (size_t base = 0; base < n; base += B) {
        const size_t m = SUMO__MIN(B, n - base), mpad = (m + WD - 1) / WD * WD;
        for (int p = 0; p < nin; p++) gram_widen(dt, ins[p], base, m, mpad, B, buf + (size_t)p * B);
        for (int i0 = 0; i0 < pp; i0 += GRAM_ROWS)
            for (int j0 = i0 / GRAM_COLS * GRAM_COLS; j0 < pp; j0 += GRAM_COLS) {
                if (GRAM_ROWS == GRAM_COLS && i0 == j0) gram_tile(buf, B, i0, j0, mpad, acc, pp, true);
                else gram_tile(buf, B, i0, j0, mpad, acc, pp, false);
            }
    }
    int e = 0;
    for (int i = 0; i < nin; i++)
        for (int j = i; j < nin; j++) out[e++] = vd_hsum(acc[i * pp + j]);
}

/*
 * gram_f for 3 or 4 inputs (NIN, a constant) of at most one block: the same FMAs into the
 * same lanes in the same order (lane l of entry (i,j) takes elements l, l + WD, .. from the
 * first, the last vector zero-padded, then vd_hsum), straight from the inputs. The block's
 * buffer, its stores and reloads, and a 4 x 4 tile's 16 accumulators (10 used) cost more
 * than the arithmetic on the few elements of a small tensor's piece; all 10 accumulators and
 * 4 operands stay in registers.
 */
SIMD_INLINE void gram_direct(sumo_dtype dt, const void *const *ins, const int NIN, size_t n,
                             double *out)
{
    /* Named, not an array: an array of accumulators indexed in loops stays on the stack. */
    const vd z = vd_zero();
    vd a00 = z, a01 = z, a02 = z, a03 = z, a11 = z, a12 = z, a13 = z, a22 = z, a23 = z, a33 = z;
    const void *p0 = ins[0], *p1 = ins[1], *p2 = ins[2], *p3 = NIN == 4 ? ins[3] : ins[2];
    size_t i = 0;
#define GRAM_DIRECT_STEP(x0, x1, x2, x3)                                                           \
    do {                                                                                           \
        a00 = vd_fmadd(x0, x0, a00);                                                               \
        a01 = vd_fmadd(x0, x1, a01);                                                               \
        a02 = vd_fmadd(x0, x2, a02);                                                               \
        a11 = vd_fmadd(x1, x1, a11);                                                               \
        a12 = vd_fmadd(x1, x2, a12);                                                               \
        a22 = vd_fmadd(x2, x2, a22);                                                               \
        if (NIN == 4) {                                                                            \
            a03 = vd_fmadd(x0, x3, a03);                                                           \
            a13 = vd_fmadd(x1, x3, a13);                                                           \
            a23 = vd_fmadd(x2, x3, a23);                                                           \
            a33 = vd_fmadd(x3, x3, a33);                                                           \
        }                                                                                          \
    } while (0)
    if (dt == SUMO_FLOAT64) {
        const double *d0 = p0, *d1 = p1, *d2 = p2, *d3 = p3;
        for (; i + WD <= n; i += WD)
            GRAM_DIRECT_STEP(vd_loadu(d0 + i), vd_loadu(d1 + i), vd_loadu(d2 + i), vd_loadu(d3 + i));
    } else {
        for (; i + WF <= n; i += WF) {
            const vf v0 = ld(dt, p0, i), v1 = ld(dt, p1, i), v2 = ld(dt, p2, i), v3 = ld(dt, p3, i);
            GRAM_DIRECT_STEP(vd_from_lo(v0), vd_from_lo(v1), vd_from_lo(v2), vd_from_lo(v3));
            GRAM_DIRECT_STEP(vd_from_hi(v0), vd_from_hi(v1), vd_from_hi(v2), vd_from_hi(v3));
        }
    }
    if (i < n && dt == SUMO_FLOAT32) {
        /* The tail, widened and zero-padded as below, in registers: scalar stores reloaded as
         * a vector cannot be forwarded, and stalled every small piece (at P = 4 the most
         * expensive part of a 20-element piece). */
        const size_t m = n - i;
        const vf v0 = vf_loadu_head((const float *)p0 + i, m), v1 = vf_loadu_head((const float *)p1 + i, m);
        const vf v2 = vf_loadu_head((const float *)p2 + i, m), v3 = vf_loadu_head((const float *)p3 + i, m);
        GRAM_DIRECT_STEP(vd_from_lo(v0), vd_from_lo(v1), vd_from_lo(v2), vd_from_lo(v3));
        if (m > WD) GRAM_DIRECT_STEP(vd_from_hi(v0), vd_from_hi(v1), vd_from_hi(v2), vd_from_hi(v3));
    } else if (i < n) {
        /* The tail, widened as gram_widen widens it and zero-padded to whole vectors. */
        _Alignas(64) double tail[4][WF];
        const void *ip[4] = {p0, p1, p2, p3};
        const size_t m = n - i, mpad = (m + WD - 1) / WD * WD;
        for (int p = 0; p < NIN; p++) {
            size_t k = 0;
            if (dt == SUMO_FLOAT64)
                for (; k < m; k++) tail[p][k] = ((const double *)ip[p])[i + k];
            else
                for (; k < m; k++) tail[p][k] = (double)lds(dt, ip[p], i + k);
            for (; k < mpad; k++) tail[p][k] = 0.0;
        }
        for (size_t k = 0; k < mpad; k += WD)
            GRAM_DIRECT_STEP(vd_loadu(&tail[0][k]), vd_loadu(&tail[1][k]), vd_loadu(&tail[2][k]),
                             vd_loadu(&tail[NIN - 1][k]));
    }
#undef GRAM_DIRECT_STEP
    if (NIN == 4) {
        const vd acc[10] = {a00, a01, a02, a03, a11, a12, a13, a22, a23, a33};
        for (int e = 0; e < 10; e++) out[e] = vd_hsum(acc[e]);
    } else {
        const vd acc[6] = {a00, a01, a02, a11, a12, a22};
        for (int e = 0; e < 6; e++) out[e] = vd_hsum(acc[e]);
    }
}

/* One tensor piece's partials: gram_f's, by the direct loop where it gives the same bits for
 * less (3 or 4 inputs, one block). */
SIMD_INLINE void gram_piece(sumo_dtype dt, const void *const *ins, int nin, size_t n, double *out)
{
    const size_t B = GRAM_BUF_DOUBLES / 4 / WF * WF; /* gram_f's block for 3 or 4 inputs */
    if (nin == 4 && n <= B) gram_direct(dt, ins, 4, n, out);
    else if (nin == 3 && n <= B) gram_direct(dt, ins, 3, n, out);
    else gram_f(dt, ins, nin, n, out);
}

/* Two inputs (P = 2, the commonest): dot_f's three sums added straight into the tensor's
 * entries. Through gram_piece they went out to a stack array and a loop of unknown length
 * read them back, a store-to-load round trip that was the largest cost of a 16-element piece.
 * The same additions in the same order, so the same bits. A loop of its own: the same branch
 * inside gram_layout's (with its loop over nin pointers) made 50 pieces 764 -> 851-864 ns. */
SIMD_INLINE void gram_layout2(sumo_dtype dt, const void *const *ins, const size_t *offsets,
                              size_t ntensors, size_t lo, size_t hi, double *gram)
{
    const size_t esz = sumo__dtype_bytes(dt);
    const unsigned char *a = ins[0], *b = ins[1];
    for (size_t t = sumo__first_tensor(offsets, ntensors, lo); t < ntensors && offsets[t] < hi;
         t++) {
        size_t s = SUMO__MAX(lo, offsets[t]), e = SUMO__MIN(hi, offsets[t + 1]);
        if (e <= s) continue;
        double d[3];
        if (dt == SUMO_FLOAT64) dot_d((const double *)(const void *)(a + (s - lo) * esz),
                                      (const double *)(const void *)(b + (s - lo) * esz), e - s, d);
        else dot_f(dt, a + (s - lo) * esz, b + (s - lo) * esz, e - s, d);
        gram[t * 3 + 0] += d[1];
        gram[t * 3 + 1] += d[0];
        gram[t * 3 + 2] += d[2];
    }
}

/* sumo__kernel_gram_partials_layout's loop, with the body inlined: a bucket of many small
 * tensors makes one piece per tensor, and a call and a dispatch per piece cost as much as
 * the piece's arithmetic. */
SIMD_INLINE void gram_layout(sumo_dtype dt, const void *const *ins, int nin, const size_t *offsets,
                             size_t ntensors, size_t lo, size_t hi, double *gram)
{
    if (nin == 2) {
        gram_layout2(dt, ins, offsets, ntensors, lo, hi, gram);
        return;
    }
    const size_t esz = sumo__dtype_bytes(dt), L = (size_t)nin * (size_t)(nin + 1) / 2;
    const void *in_at[SUMO__GRAM_MAX_IN];
    double piece[SUMO__GRAM_MAX_IN * (SUMO__GRAM_MAX_IN + 1) / 2];
    for (size_t t = sumo__first_tensor(offsets, ntensors, lo); t < ntensors && offsets[t] < hi;
         t++) {
        size_t s = SUMO__MAX(lo, offsets[t]), e = SUMO__MIN(hi, offsets[t + 1]);
        if (e <= s) continue;
        for (int k = 0; k < nin; k++) in_at[k] = (const unsigned char *)ins[k] + (s - lo) * esz;
        gram_piece(dt, in_at, nin, e - s, piece);
        for (size_t q = 0; q < L; q++) gram[t * L + q] += piece[q];
    }
}

SUMO__SIMD_TARGET void SUMO__SIMD_NAME(sumo__gram_partials_layout)(
    sumo_dtype dtype, const void *const *ins, int nin, const size_t *offsets, size_t ntensors,
    size_t lo, size_t hi, double *gram)
{
    switch (dtype) {
    case SUMO_FLOAT32: gram_layout(SUMO_FLOAT32, ins, nin, offsets, ntensors, lo, hi, gram); break;
    case SUMO_FLOAT16: gram_layout(SUMO_FLOAT16, ins, nin, offsets, ntensors, lo, hi, gram); break;
    case SUMO_BFLOAT16: gram_layout(SUMO_BFLOAT16, ins, nin, offsets, ntensors, lo, hi, gram); break;
    case SUMO_FLOAT64: gram_layout(SUMO_FLOAT64, ins, nin, offsets, ntensors, lo, hi, gram); break;
    default: break;
    }
}

SUMO__SIMD_TARGET void SUMO__SIMD_NAME(sumo__gram_partials)(sumo_dtype dtype,
                                                           const void *const *ins, int nin,
                                                           size_t n, double *out)
{
    switch (dtype) {
    case SUMO_FLOAT32: gram_f(SUMO_FLOAT32, ins, nin, n, out); break;
    case SUMO_FLOAT16: gram_f(SUMO_FLOAT16, ins, nin, n, out); break;
    case SUMO_BFLOAT16: gram_f(SUMO_BFLOAT16, ins, nin, n, out); break;
    case SUMO_FLOAT64: gram_f(SUMO_FLOAT64, ins, nin, n, out); break;
    default: break;
    }
}

/* ---- weighted sum ------------------------------------------------------------------------- */

/* Whether any output's n bytes overlap any input's. */
SIMD_INLINE bool outputs_meet_inputs(void *const *op, int nout, const void *const *ip, int nin,
                                     size_t bytes)
{
    bool meet = false;
    for (int k = 0; k < nout; k++)
        for (int p = 0; p < nin; p++)
            meet = meet || sumo__ranges_overlap(op[k], bytes, ip[p], bytes);
    return meet;
}

/* The fp32 weighted sum of the WF elements from i, in double, rounded once. */
SIMD_INLINE vf wsum_f32_at(const void *const *ip, const vd *wv, int nin, size_t i)
{
    vf x = vf_loadu((const float *)ip[0] + i);
    vd lo = vd_mul(wv[0], vd_from_lo(x)), hi = vd_mul(wv[0], vd_from_hi(x));
    for (int p = 1; p < nin; p++) {
        x = vf_loadu((const float *)ip[p] + i);
        lo = vd_fmadd(wv[p], vd_from_lo(x), lo);
        hi = vd_fmadd(wv[p], vd_from_hi(x), hi);
    }
    return vf_from_vd(lo, hi);
}

/* fp32/fp64 in double: v = w0 x0, then v = fma(w_p, x_p, v), rounded once (portable's twin).
 * Every input is prefetched ahead, as dot_norms' are: with the conversions, FMAs and one store
 * per output in flight, too few loads are outstanding otherwise (threads, P = 2, 64 MiB: the
 * Adasum call from 8.4-9.0 to 7.0-7.2 ms, with the pointers in locals). */
SIMD_INLINE void wsum_wide(sumo_dtype dt, void *const *outs, int nout, const void *const *ins,
                           const double *w, int nin, size_t n)
{
    const void *ip[SUMO__GRAM_MAX_IN];
    void *op[SUMO__GRAM_MAX_IN];
    local_pointers(ins, nin, ip, outs, nout, op);
    /* Broadcast once: a double store to an output may alias w as far as the compiler knows,
     * so it would reload and broadcast every weight for every vector. */
    vd wv[SUMO__GRAM_MAX_IN];
    for (int p = 0; p < nin; p++) wv[p] = vd_set1(w[p]);
    const size_t esz = dt == SUMO_FLOAT64 ? sizeof(double) : sizeof(float);
    size_t i = 0;
    if (dt == SUMO_FLOAT64) {
        for (; i + WD <= n; i += WD) {
            for (int p = 0; p < nin; p++) prefetch_ahead(ip[p], i * esz, WD * esz);
            vd v = vd_mul(wv[0], vd_loadu((const double *)ip[0] + i));
            for (int p = 1; p < nin; p++)
                v = vd_fmadd(wv[p], vd_loadu((const double *)ip[p] + i), v);
            for (int k = 0; k < nout; k++) vd_storeu((double *)op[k] + i, v);
        }
        for (; i < n; i++) {
            double v = w[0] * ((const double *)ip[0])[i];
            for (int p = 1; p < nin; p++) v = fma(w[p], ((const double *)ip[p])[i], v);
            for (int k = 0; k < nout; k++) ((double *)op[k])[i] = v;
        }
        return;
    }
    for (; i + WF <= n; i += WF) {
        for (int p = 0; p < nin; p++) prefetch_ahead(ip[p], i * esz, WF * esz);
        const vf v = wsum_f32_at(ip, wv, nin, i);
        for (int k = 0; k < nout; k++) vf_storeu((float *)op[k] + i, v);
    }
    if (i < n && i >= WF && !outputs_meet_inputs(op, nout, ip, nin, n * esz)) {
        /* The tail as the piece's last whole vector, which overlaps elements already written
         * and writes them again with the same bits (each is computed from the inputs alone,
         * none of which is an output): a scalar loop of 1 to WF - 1 turns mispredicts its exit
         * in most pieces of a bucket of small tensors, and a masked store is slow on AMD. */
        const vf v = wsum_f32_at(ip, wv, nin, n - WF);
        for (int k = 0; k < nout; k++) vf_storeu((float *)op[k] + n - WF, v);
        return;
    }
    for (; i < n; i++) {
        double v = w[0] * (double)((const float *)ip[0])[i];
        for (int p = 1; p < nin; p++) v = fma(w[p], (double)((const float *)ip[p])[i], v);
        for (int k = 0; k < nout; k++) ((float *)op[k])[i] = (float)v;
    }
}

/* The one-node shapes' calls (P inputs into P outputs) and the point-to-point shape's (into
 * one) at P = 2 and 4 with constant counts, so the loops over inputs and outputs unroll, as
 * reduce_f_direct's do. */
SIMD_INLINE void wsum_wide_shapes(sumo_dtype dt, void *const *outs, int nout,
                                  const void *const *ins, const double *w, int nin, size_t n)
{
    if (nin == 2 && nout == 2) wsum_wide(dt, outs, 2, ins, w, 2, n);
    else if (nin == 2 && nout == 1) wsum_wide(dt, outs, 1, ins, w, 2, n);
    else if (nin == 4 && nout == 4) wsum_wide(dt, outs, 4, ins, w, 4, n);
    else if (nin == 4 && nout == 1) wsum_wide(dt, outs, 1, ins, w, 4, n);
    else wsum_wide(dt, outs, nout, ins, w, nin, n);
}

SIMD_INLINE void wsum_half(sumo_dtype dt, void *const *outs, int nout, const void *const *ins,
                           const double *w, int nin, size_t n)
{
    const void *ip[SUMO__GRAM_MAX_IN];
    void *op[SUMO__GRAM_MAX_IN];
    local_pointers(ins, nin, ip, outs, nout, op);
    size_t i = 0;
    for (; i + WF <= n; i += WF) {
        for (int p = 0; p < nin; p++) prefetch_ahead(ip[p], i * sizeof(uint16_t), WF * sizeof(uint16_t));
        vf v = vf_mul(vf_set1((float)w[0]), ld(dt, ip[0], i));
        for (int p = 1; p < nin; p++) v = vf_fmadd(vf_set1((float)w[p]), ld(dt, ip[p], i), v);
        st(dt, op, nout, i, v);
    }
    for (; i < n; i++) {
        float v = (float)w[0] * lds(dt, ip[0], i);
        for (int p = 1; p < nin; p++) v = fmaf((float)w[p], lds(dt, ip[p], i), v);
        sts(dt, op, nout, i, v);
    }
}

/* The weighted sum of one piece, inlined into the layout loop below as well. */
SIMD_INLINE void wsum_piece(sumo_dtype dtype, void *const *outs, int nout, const void *const *ins,
                            const double *w, int nin, size_t n)
{
    switch (dtype) {
    case SUMO_FLOAT32: wsum_wide_shapes(SUMO_FLOAT32, outs, nout, ins, w, nin, n); break;
    case SUMO_FLOAT64: wsum_wide_shapes(SUMO_FLOAT64, outs, nout, ins, w, nin, n); break;
    case SUMO_FLOAT16:
    case SUMO_BFLOAT16:
        if (!sumo__coefs_fit_float(w, nin))
            sumo__weighted_sum_half_wide(dtype, outs, nout, ins, w, nin, n);
        else if (dtype == SUMO_FLOAT16) wsum_half(SUMO_FLOAT16, outs, nout, ins, w, nin, n);
        else wsum_half(SUMO_BFLOAT16, outs, nout, ins, w, nin, n);
        break;
    default: break;
    }
}

SUMO__SIMD_TARGET void SUMO__SIMD_NAME(sumo__weighted_sum)(sumo_dtype dtype, void *const *outs,
                                                          int nout, const void *const *ins,
                                                          const double *w, int nin, size_t n)
{
    wsum_piece(dtype, outs, nout, ins, w, nin, n);
}

/* sumo__kernel_weighted_sum_layout's loop with the body inlined, as gram_layout. */
SUMO__SIMD_TARGET void SUMO__SIMD_NAME(sumo__weighted_sum_layout)(
    sumo_dtype dtype, void *const *outs, int nout, const void *const *ins, int nin,
    const size_t *offsets, size_t ntensors, size_t lo, size_t hi, const double *w)
{
    const size_t esz = sumo__dtype_bytes(dtype);
    const void *in_at[SUMO__GRAM_MAX_IN];
    void *out_at[SUMO__GRAM_MAX_IN];
    for (size_t t = sumo__first_tensor(offsets, ntensors, lo); t < ntensors && offsets[t] < hi;
         t++) {
        size_t s = SUMO__MAX(lo, offsets[t]), e = SUMO__MIN(hi, offsets[t + 1]);
        if (e <= s) continue;
        for (int k = 0; k < nin; k++) in_at[k] = (const unsigned char *)ins[k] + (s - lo) * esz;
        for (int k = 0; k < nout; k++) out_at[k] = (unsigned char *)outs[k] + (s - lo) * esz;
        wsum_piece(dtype, out_at, nout, in_at, w + t * (size_t)nin, nin, e - s);
    }
}

#undef GRAM_COLS
#undef GRAM_BUF_DOUBLES
#undef SIMD_INLINE
#undef WD
#undef SUMO__DOT_PREFETCH_BYTES
