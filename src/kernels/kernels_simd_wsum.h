/*
 * kernels_simd.h's weighted sum: outputs = sum of w_p x_p over P inputs (what the Gram
 * partials' weights combine), per buffer and per tensor of a layout. It prefetches with
 * kernels_simd_dot.h's helpers, included before this part. A part of the vector kernels'
 * template, included by kernels_simd.h alone.
 */
#ifndef SUMO__SIMD_NAME
#error "kernels_simd_wsum.h is a part of kernels_simd.h, included by it"
#endif

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
