/*
 * kernels_simd.h's elementwise kernels over fp32 lanes: reduce (the sum or average of inputs
 * into outputs) and convert (between the dtypes). A part of the vector kernels' template,
 * included by kernels_simd.h alone, after the loads and stores it uses.
 */
#ifndef SUMO__SIMD_NAME
#error "kernels_simd_reduce.h is a part of kernels_simd.h, included by it"
#endif

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
