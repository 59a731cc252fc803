/*
 * kernels_simd.h's kernels for Adasum of two vectors: dot_norms (a.b, |a|^2, |b|^2 in double)
 * and scaled_add (a = ca a + cb b), and the prefetch helpers that dot_norms' loop needs and
 * the Gram and weighted-sum parts share. A part of the vector kernels' template, included by
 * kernels_simd.h alone, after the loads and stores it uses.
 */
#ifndef SUMO__SIMD_NAME
#error "kernels_simd_dot.h is a part of kernels_simd.h, included by it"
#endif

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

#undef SUMO__DOT_PREFETCH_BYTES
