/*
 * Kernels: the portable path and the run-time choice of path. The scalar conversions they
 * round through are codec.h's (by way of kernels.h), the CUDA plugin's too.
 *
 * The vector paths (kernels_avx2.c, kernels_avx512.c) share one body, kernels_simd.h, so the
 * AVX-512 path runs the same logic the AVX2 path's tests exercise; only the primitives differ.
 * The path is asked on every call: SUMO_KERNEL_ISA where it is set (a getenv), else the widest
 * set libgcc's CPU model names (a few loads); no syscall, and no state of ours to initialise
 * or race on.
 */
#include "kernels/kernels.h"
#include "kernels/kernels_isa.h"
#include "common/settings.h"

#include <math.h>
#include <stdlib.h>

/* ---- portable path ------------------------------------------------------------------------ */

/* Called with a constant dtype from a switch, so each loop is compiled per dtype. */
static inline __attribute__((always_inline)) float load_f(sumo_dtype dt, const void *p, size_t i)
{
    switch (dt) {
    case SUMO_FLOAT16: return sumo__half_to_float(((const uint16_t *)p)[i]);
    case SUMO_BFLOAT16: return sumo__bf16_to_float(((const uint16_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

static inline __attribute__((always_inline)) void store_f(sumo_dtype dt, void *p, size_t i,
                                                          float v)
{
    switch (dt) {
    case SUMO_FLOAT16: ((uint16_t *)p)[i] = sumo__float_to_half(v); break;
    case SUMO_BFLOAT16: ((uint16_t *)p)[i] = sumo__float_to_bf16(v); break;
    default: ((float *)p)[i] = v; break;
    }
}

/*
 * Few inputs and outputs: element i of every input is read, then element i of every output
 * written, so exact aliasing is safe and each buffer is touched once. The pointers live in
 * locals that no store can reach, so they are not reloaded per element.
 */
static inline __attribute__((always_inline)) void
reduce_float_direct(sumo_dtype dt, void *const *outs, int nout, const void *const *ins, int nin,
                    size_t n, int divisor)
{
    const void *ip[4];
    void *op[4];
    for (int j = 0; j < nin; j++) ip[j] = ins[j];
    for (int k = 0; k < nout; k++) op[k] = outs[k];
    const float fdiv = (float)divisor;
    const int divide = divisor != 1;
    for (size_t i = 0; i < n; i++) {
        float v = load_f(dt, ip[0], i);
        for (int j = 1; j < nin; j++) v = v + load_f(dt, ip[j], i);
        if (divide) v = v / fdiv;
        for (int k = 0; k < nout; k++) store_f(dt, op[k], i, v);
    }
}

/*
 * Many inputs or outputs: the sum of all but the last input builds up in an L1 block, one
 * input stream at a time, and the pass adding the last input writes the outputs. Every input
 * element of a block is read before any output element of it is written, and each buffer is
 * still read or written once.
 */
static inline __attribute__((always_inline)) void
reduce_float_blocked(sumo_dtype dt, void *const *outs, int nout, const void *const *ins,
                     int nin, size_t n, int divisor)
{
    enum { B = SUMO__REDUCE_BLOCK_BYTES / sizeof(float) };
    float acc[B];
    const float fdiv = (float)divisor;
    const int divide = divisor != 1;
    for (size_t base = 0; base < n; base += B) {
        const size_t m = SUMO__MIN((size_t)B, n - base);
        if (nin >= 2) {
            for (size_t i = 0; i < m; i++) acc[i] = load_f(dt, ins[0], base + i);
            for (int j = 1; j < nin - 1; j++) {
                const void *p = ins[j];
                for (size_t i = 0; i < m; i++) acc[i] += load_f(dt, p, base + i);
            }
        }
        const void *last = ins[nin - 1];
        for (size_t i = 0; i < m; i++) {
            float v = load_f(dt, last, base + i);
            if (nin >= 2) v = acc[i] + v;
            if (divide) v = v / fdiv;
            for (int k = 0; k < nout; k++) store_f(dt, outs[k], base + i, v);
        }
    }
}

static inline __attribute__((always_inline)) void
reduce_float_portable(sumo_dtype dt, void *const *outs, int nout, const void *const *ins,
                      int nin, size_t n, int divisor)
{
    if (nin == 2 && nout == 2) reduce_float_direct(dt, outs, 2, ins, 2, n, divisor);
    else if (nin == 2 && nout == 1) reduce_float_direct(dt, outs, 1, ins, 2, n, divisor);
    else if (nin <= 4 && nout <= 4) reduce_float_direct(dt, outs, nout, ins, nin, n, divisor);
    else reduce_float_blocked(dt, outs, nout, ins, nin, n, divisor);
}

static void reduce_double_direct(void *const *outs, int nout, const void *const *ins, int nin,
                                 size_t n, int divisor)
{
    const double *ip[4];
    double *op[4];
    for (int j = 0; j < nin; j++) ip[j] = ins[j];
    for (int k = 0; k < nout; k++) op[k] = outs[k];
    const double ddiv = (double)divisor;
    const int divide = divisor != 1;
    for (size_t i = 0; i < n; i++) {
        double v = ip[0][i];
        for (int j = 1; j < nin; j++) v = v + ip[j][i];
        if (divide) v = v / ddiv;
        for (int k = 0; k < nout; k++) op[k][i] = v;
    }
}

static void reduce_double_blocked(void *const *outs, int nout, const void *const *ins, int nin,
                                  size_t n, int divisor)
{
    enum { B = SUMO__REDUCE_BLOCK_BYTES / sizeof(double) };
    double acc[B];
    const double ddiv = (double)divisor;
    const int divide = divisor != 1;
    for (size_t base = 0; base < n; base += B) {
        const size_t m = SUMO__MIN((size_t)B, n - base);
        if (nin >= 2) {
            const double *p0 = (const double *)ins[0] + base;
            for (size_t i = 0; i < m; i++) acc[i] = p0[i];
            for (int j = 1; j < nin - 1; j++) {
                const double *p = (const double *)ins[j] + base;
                for (size_t i = 0; i < m; i++) acc[i] += p[i];
            }
        }
        const double *last = (const double *)ins[nin - 1] + base;
        for (size_t i = 0; i < m; i++) {
            double v = last[i];
            if (nin >= 2) v = acc[i] + v;
            if (divide) v = v / ddiv;
            for (int k = 0; k < nout; k++) ((double *)outs[k])[base + i] = v;
        }
    }
}

void sumo__reduce_multi_portable(sumo_dtype dtype, void *const *outs, int nout,
                                 const void *const *ins, int nin, size_t n, int divisor)
{
    switch (dtype) {
    case SUMO_FLOAT32:
        reduce_float_portable(SUMO_FLOAT32, outs, nout, ins, nin, n, divisor);
        break;
    case SUMO_FLOAT16:
        reduce_float_portable(SUMO_FLOAT16, outs, nout, ins, nin, n, divisor);
        break;
    case SUMO_BFLOAT16:
        reduce_float_portable(SUMO_BFLOAT16, outs, nout, ins, nin, n, divisor);
        break;
    case SUMO_FLOAT64:
        if (nin <= 4 && nout <= 4) reduce_double_direct(outs, nout, ins, nin, n, divisor);
        else reduce_double_blocked(outs, nout, ins, nin, n, divisor);
        break;
    default: break;
    }
}

static inline __attribute__((always_inline)) double load_d(sumo_dtype dt, const void *p,
                                                           size_t i)
{
    return dt == SUMO_FLOAT64 ? ((const double *)p)[i] : (double)load_f(dt, p, i);
}

void sumo__convert_portable(sumo_dtype dst_dtype, void *dst, sumo_dtype src_dtype,
                            const void *src, size_t n)
{
    /* Element i is read before it is written, so fp16 <-> bf16 may run in place. */
    for (size_t i = 0; i < n; i++) {
        if (src_dtype == SUMO_FLOAT64 || dst_dtype == SUMO_FLOAT64) {
            double v = load_d(src_dtype, src, i);
            switch (dst_dtype) {
            case SUMO_FLOAT64: ((double *)dst)[i] = v; break;
            case SUMO_FLOAT32: ((float *)dst)[i] = (float)v; break;
            case SUMO_FLOAT16: ((uint16_t *)dst)[i] = sumo__double_to_half(v); break;
            case SUMO_BFLOAT16: ((uint16_t *)dst)[i] = sumo__double_to_bf16(v); break;
            default: break;
            }
        } else {
            store_f(dst_dtype, dst, i, load_f(src_dtype, src, i));
        }
    }
}

static inline __attribute__((always_inline)) void
dot_norms_portable(sumo_dtype dt, const void *a, const void *b, size_t n, double out[3])
{
    /* Four independent chains per sum: one chain is latency-bound at a fraction of bandwidth. */
    double s[3][4] = {{0}};
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        for (int l = 0; l < 4; l++) {
            double x = load_d(dt, a, i + l), y = load_d(dt, b, i + l);
            s[0][l] += x * y;
            s[1][l] += x * x;
            s[2][l] += y * y;
        }
    }
    for (; i < n; i++) {
        double x = load_d(dt, a, i), y = load_d(dt, b, i);
        s[0][0] += x * y;
        s[1][0] += x * x;
        s[2][0] += y * y;
    }
    for (int q = 0; q < 3; q++) out[q] = (s[q][0] + s[q][1]) + (s[q][2] + s[q][3]);
}

void sumo__dot_norms_portable(sumo_dtype dtype, const void *a, const void *b, size_t n,
                              double out[3])
{
    switch (dtype) {
    case SUMO_FLOAT32: dot_norms_portable(SUMO_FLOAT32, a, b, n, out); break;
    case SUMO_FLOAT64: dot_norms_portable(SUMO_FLOAT64, a, b, n, out); break;
    case SUMO_FLOAT16: dot_norms_portable(SUMO_FLOAT16, a, b, n, out); break;
    case SUMO_BFLOAT16: dot_norms_portable(SUMO_BFLOAT16, a, b, n, out); break;
    default: break;
    }
}

void sumo__scaled_add_portable(sumo_dtype dtype, void *a, double ca, const void *b, double cb,
                               size_t n)
{
    /* fma() keeps the rounding identical to the vector paths' fused multiply-add. */
    switch (dtype) {
    case SUMO_FLOAT64: {
        double *x = a;
        const double *y = b;
        for (size_t i = 0; i < n; i++) x[i] = fma(ca, x[i], cb * y[i]);
        break;
    }
    case SUMO_FLOAT32: {
        float *x = a;
        const float *y = b;
        for (size_t i = 0; i < n; i++) x[i] = (float)fma(ca, (double)x[i], cb * (double)y[i]);
        break;
    }
    case SUMO_FLOAT16:
    case SUMO_BFLOAT16: {
        if (!sumo__coef_fits_float(ca) || !sumo__coef_fits_float(cb)) {
            sumo__scaled_add_half_wide(dtype, a, ca, b, cb, n);
            break;
        }
        const float fa = (float)ca, fb = (float)cb;
        for (size_t i = 0; i < n; i++)
            store_f(dtype, a, i, fmaf(fa, load_f(dtype, a, i), fb * load_f(dtype, b, i)));
        break;
    }
    default: break;
    }
}

void sumo__scaled_add_half_wide(sumo_dtype dtype, void *a, double ca, const void *b, double cb,
                                size_t n)
{
    /* Widening is exact; the two roundings to double are 2^-45 below the dtype's half ulp, and
     * narrowing through fp32 by round-to-odd keeps the last rounding single. */
    uint16_t *x = a;
    for (size_t i = 0; i < n; i++) {
        double v = fma(ca, (double)load_f(dtype, a, i), cb * (double)load_f(dtype, b, i));
        x[i] = dtype == SUMO_FLOAT16 ? sumo__double_to_half(v) : sumo__double_to_bf16(v);
    }
}

void sumo__weighted_sum_half_wide(sumo_dtype dtype, void *const *outs, int nout,
                                  const void *const *ins, const double *w, int nin, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        double v = w[0] * (double)load_f(dtype, ins[0], i);
        for (int p = 1; p < nin; p++) v = fma(w[p], (double)load_f(dtype, ins[p], i), v);
        uint16_t h = dtype == SUMO_FLOAT16 ? sumo__double_to_half(v) : sumo__double_to_bf16(v);
        for (int k = 0; k < nout; k++) ((uint16_t *)outs[k])[i] = h;
    }
}

static inline __attribute__((always_inline)) void
gram_portable(sumo_dtype dt, const void *const *ins, int nin, size_t n, double *out)
{
    /* Four chains per entry, element i feeding chain i % 4, as dot_norms_portable. */
    enum { MAXE = SUMO__GRAM_MAX_IN * (SUMO__GRAM_MAX_IN + 1) / 2 };
    double s[MAXE][4];
    const int ne = nin * (nin + 1) / 2;
    for (int e = 0; e < ne; e++) s[e][0] = s[e][1] = s[e][2] = s[e][3] = 0;
    double x[SUMO__GRAM_MAX_IN];
    for (size_t i = 0; i < n; i++) {
        for (int p = 0; p < nin; p++) x[p] = load_d(dt, ins[p], i);
        const int l = (int)(i % 4);
        int e = 0;
        for (int a = 0; a < nin; a++)
            for (int b = a; b < nin; b++) s[e++][l] += x[a] * x[b];
    }
    for (int e = 0; e < ne; e++) out[e] = (s[e][0] + s[e][1]) + (s[e][2] + s[e][3]);
}

void sumo__gram_partials_portable(sumo_dtype dtype, const void *const *ins, int nin, size_t n,
                                  double *out)
{
    switch (dtype) {
    case SUMO_FLOAT32: gram_portable(SUMO_FLOAT32, ins, nin, n, out); break;
    case SUMO_FLOAT64: gram_portable(SUMO_FLOAT64, ins, nin, n, out); break;
    case SUMO_FLOAT16: gram_portable(SUMO_FLOAT16, ins, nin, n, out); break;
    case SUMO_BFLOAT16: gram_portable(SUMO_BFLOAT16, ins, nin, n, out); break;
    default: break;
    }
}

void sumo__weighted_sum_portable(sumo_dtype dtype, void *const *outs, int nout,
                                 const void *const *ins, const double *w, int nin, size_t n)
{
    switch (dtype) {
    case SUMO_FLOAT64:
    case SUMO_FLOAT32:
        for (size_t i = 0; i < n; i++) {
            double v = w[0] * load_d(dtype, ins[0], i);
            for (int p = 1; p < nin; p++) v = fma(w[p], load_d(dtype, ins[p], i), v);
            for (int k = 0; k < nout; k++) {
                if (dtype == SUMO_FLOAT64) ((double *)outs[k])[i] = v;
                else ((float *)outs[k])[i] = (float)v;
            }
        }
        break;
    case SUMO_FLOAT16:
    case SUMO_BFLOAT16: {
        if (!sumo__coefs_fit_float(w, nin)) {
            sumo__weighted_sum_half_wide(dtype, outs, nout, ins, w, nin, n);
            break;
        }
        float fw[SUMO__GRAM_MAX_IN];
        for (int p = 0; p < nin && p < SUMO__GRAM_MAX_IN; p++) fw[p] = (float)w[p];
        for (size_t i = 0; i < n; i++) {
            float v = fw[0] * load_f(dtype, ins[0], i);
            for (int p = 1; p < nin; p++) {
                float wp = p < SUMO__GRAM_MAX_IN ? fw[p] : (float)w[p];
                v = fmaf(wp, load_f(dtype, ins[p], i), v);
            }
            for (int k = 0; k < nout; k++) store_f(dtype, outs[k], i, v);
        }
        break;
    }
    default: break;
    }
}

/* ---- dispatch ---------------------------------------------------------------------------- */

sumo__isa sumo__kernel_isa_best(void) { return (sumo__isa)sumo__cpu_isa_level(); }

sumo__isa sumo__kernel_isa_chosen(void)
{
    /* A refused value (a set this CPU lacks) was reported where the communicator was made;
     * here it falls back to the widest set, so no instruction the CPU lacks ever runs. */
    const char *text = getenv("SUMO_KERNEL_ISA"); /* unset: no parse on the common path */
    sumo__setting_value v;
    if (text && *text &&
        sumo__setting_read(SUMO__SETTING_KERNEL_ISA, &v, NULL, 0) == SUMO_SUCCESS)
        return (sumo__isa)v.integer;
    return sumo__kernel_isa_best();
}

const char *sumo__kernel_isa_name(sumo__isa isa)
{
    switch (isa) {
    case SUMO__ISA_AVX512: return "avx512";
    case SUMO__ISA_AVX2: return "avx2";
    default: return "portable";
    }
}

const char *sumo__kernel_isa(void) { return sumo__kernel_isa_name(sumo__kernel_isa_chosen()); }

sumo_result sumo_kernel_isa(const char **name)
{
    if (!name) return SUMO_ERR_INVALID_ARGUMENT;
    *name = sumo__kernel_isa();
    sumo__setting_value v;
    return sumo__setting_read(SUMO__SETTING_KERNEL_ISA, &v, NULL, 0);
}

/* A path the CPU lacks (or an unknown value) becomes the best one it has. */
static sumo__isa usable(sumo__isa isa)
{
    sumo__isa best = sumo__kernel_isa_best();
    return (unsigned)isa <= (unsigned)best ? isa : best;
}

void sumo__reduce_multi_isa(sumo__isa isa, sumo_dtype dtype, void *const *outs, int nout,
                            const void *const *ins, int nin, size_t n, int divisor)
{
    if (n == 0 || nin < 1 || nout < 1 || !sumo__dtype_valid((int)dtype)) return;
    switch (usable(isa)) {
#if SUMO__KERNELS_X86
    case SUMO__ISA_AVX512:
        sumo__reduce_multi_avx512(dtype, outs, nout, ins, nin, n, divisor);
        return;
    case SUMO__ISA_AVX2: sumo__reduce_multi_avx2(dtype, outs, nout, ins, nin, n, divisor); return;
#endif
    default: sumo__reduce_multi_portable(dtype, outs, nout, ins, nin, n, divisor); return;
    }
}

void sumo__kernel_convert_isa(sumo__isa isa, sumo_dtype dst_dtype, void *dst,
                              sumo_dtype src_dtype, const void *src, size_t n)
{
    if (n == 0 || !sumo__dtype_valid((int)dst_dtype) || !sumo__dtype_valid((int)src_dtype))
        return;
    if (dst_dtype == src_dtype) {
        if (dst != src) memmove(dst, src, n * sumo__dtype_bytes(dst_dtype));
        return;
    }
    switch (usable(isa)) {
#if SUMO__KERNELS_X86
    case SUMO__ISA_AVX512: sumo__convert_avx512(dst_dtype, dst, src_dtype, src, n); return;
    case SUMO__ISA_AVX2: sumo__convert_avx2(dst_dtype, dst, src_dtype, src, n); return;
#endif
    default: sumo__convert_portable(dst_dtype, dst, src_dtype, src, n); return;
    }
}

void sumo__kernel_dot_norms_isa(sumo__isa isa, sumo_dtype dtype, const void *a, const void *b,
                                size_t n, double out[3])
{
    out[0] = out[1] = out[2] = 0.0;
    if (n == 0 || !sumo__dtype_valid((int)dtype)) return;
    switch (usable(isa)) {
#if SUMO__KERNELS_X86
    case SUMO__ISA_AVX512: sumo__dot_norms_avx512(dtype, a, b, n, out); return;
    case SUMO__ISA_AVX2: sumo__dot_norms_avx2(dtype, a, b, n, out); return;
#endif
    default: sumo__dot_norms_portable(dtype, a, b, n, out); return;
    }
}

void sumo__kernel_scaled_add_isa(sumo__isa isa, sumo_dtype dtype, void *a, double ca,
                                 const void *b, double cb, size_t n)
{
    if (n == 0 || !sumo__dtype_valid((int)dtype)) return;
    switch (usable(isa)) {
#if SUMO__KERNELS_X86
    case SUMO__ISA_AVX512: sumo__scaled_add_avx512(dtype, a, ca, b, cb, n); return;
    case SUMO__ISA_AVX2: sumo__scaled_add_avx2(dtype, a, ca, b, cb, n); return;
#endif
    default: sumo__scaled_add_portable(dtype, a, ca, b, cb, n); return;
    }
}

void sumo__kernel_gram_partials_isa(sumo__isa isa, sumo_dtype dtype, const void *const *ins,
                                    int nin, size_t n, double *out)
{
    if (nin < 1 || nin > SUMO__GRAM_MAX_IN) return;
    const int ne = nin * (nin + 1) / 2;
    for (int e = 0; e < ne; e++) out[e] = 0.0;
    if (n == 0 || !sumo__dtype_valid((int)dtype)) return;
    switch (usable(isa)) {
#if SUMO__KERNELS_X86
    case SUMO__ISA_AVX512: sumo__gram_partials_avx512(dtype, ins, nin, n, out); return;
    case SUMO__ISA_AVX2: sumo__gram_partials_avx2(dtype, ins, nin, n, out); return;
#endif
    default: sumo__gram_partials_portable(dtype, ins, nin, n, out); return;
    }
}

void sumo__kernel_weighted_sum_isa(sumo__isa isa, sumo_dtype dtype, void *const *outs, int nout,
                                   const void *const *ins, const double *w, int nin, size_t n)
{
    if (n == 0 || nin < 1 || nin > SUMO__GRAM_MAX_IN || nout < 1 || nout > SUMO__GRAM_MAX_IN ||
        !sumo__dtype_valid((int)dtype))
        return;
    switch (usable(isa)) {
#if SUMO__KERNELS_X86
    case SUMO__ISA_AVX512: sumo__weighted_sum_avx512(dtype, outs, nout, ins, w, nin, n); return;
    case SUMO__ISA_AVX2: sumo__weighted_sum_avx2(dtype, outs, nout, ins, w, nin, n); return;
#endif
    default: sumo__weighted_sum_portable(dtype, outs, nout, ins, w, nin, n); return;
    }
}

/* ---- over a tensor layout ----------------------------------------------------------------- */

/* A bucket of many small tensors makes one piece per tensor: the vector paths loop over the
 * pieces with the body inlined (kernels_simd.h), picked once per layout. The portable path
 * loops here over its body. */
static void gram_layout_portable(sumo_dtype dtype, const void *const *ins, int nin,
                                 const size_t *offsets, size_t ntensors, size_t lo, size_t hi,
                                 double *gram)
{
    const size_t esz = sumo__dtype_bytes(dtype), L = (size_t)nin * (size_t)(nin + 1) / 2;
    const void *in_at[SUMO__GRAM_MAX_IN];
    double piece[SUMO__GRAM_MAX_IN * (SUMO__GRAM_MAX_IN + 1) / 2];
    for (size_t t = sumo__first_tensor(offsets, ntensors, lo); t < ntensors && offsets[t] < hi;
         t++) {
        size_t s = SUMO__MAX(lo, offsets[t]), e = SUMO__MIN(hi, offsets[t + 1]);
        if (e <= s) continue;
        for (int k = 0; k < nin; k++) in_at[k] = (const unsigned char *)ins[k] + (s - lo) * esz;
        sumo__gram_partials_portable(dtype, in_at, nin, e - s, piece);
        for (size_t q = 0; q < L; q++) gram[t * L + q] += piece[q];
    }
}

static void wsum_layout_portable(sumo_dtype dtype, void *const *outs, int nout,
                                 const void *const *ins, int nin, const size_t *offsets,
                                 size_t ntensors, size_t lo, size_t hi, const double *w)
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
        sumo__weighted_sum_portable(dtype, out_at, nout, in_at, w + t * (size_t)nin, nin, e - s);
    }
}

void sumo__kernel_gram_partials_layout(sumo_dtype dtype, const void *const *ins, int nin,
                                       const size_t *offsets, size_t ntensors, size_t lo,
                                       size_t hi, double *gram)
{
    if (nin < 1 || nin > SUMO__GRAM_MAX_IN || hi <= lo || !sumo__dtype_valid((int)dtype)) return;
    switch (usable(sumo__kernel_isa_chosen())) {
#if SUMO__KERNELS_X86
    case SUMO__ISA_AVX512:
        sumo__gram_partials_layout_avx512(dtype, ins, nin, offsets, ntensors, lo, hi, gram);
        return;
    case SUMO__ISA_AVX2:
        sumo__gram_partials_layout_avx2(dtype, ins, nin, offsets, ntensors, lo, hi, gram);
        return;
#endif
    default: gram_layout_portable(dtype, ins, nin, offsets, ntensors, lo, hi, gram); return;
    }
}

void sumo__kernel_weighted_sum_layout(sumo_dtype dtype, void *const *outs, int nout,
                                      const void *const *ins, int nin, const size_t *offsets,
                                      size_t ntensors, size_t lo, size_t hi, const double *w)
{
    if (nin < 1 || nin > SUMO__GRAM_MAX_IN || nout < 1 || nout > SUMO__GRAM_MAX_IN || hi <= lo ||
        !sumo__dtype_valid((int)dtype))
        return;
    switch (usable(sumo__kernel_isa_chosen())) {
#if SUMO__KERNELS_X86
    case SUMO__ISA_AVX512:
        sumo__weighted_sum_layout_avx512(dtype, outs, nout, ins, nin, offsets, ntensors, lo, hi, w);
        return;
    case SUMO__ISA_AVX2:
        sumo__weighted_sum_layout_avx2(dtype, outs, nout, ins, nin, offsets, ntensors, lo, hi, w);
        return;
#endif
    default: wsum_layout_portable(dtype, outs, nout, ins, nin, offsets, ntensors, lo, hi, w); return;
    }
}

/* ---- the API of kernels.h ---------------------------------------------------------------- */

void sumo__reduce_multi(sumo_dtype dtype, void *const *outs, int nout, const void *const *ins,
                        int nin, size_t n, int divisor)
{
    sumo__reduce_multi_isa(sumo__kernel_isa_chosen(), dtype, outs, nout, ins, nin, n, divisor);
}

void sumo__kernel_add(sumo_dtype dtype, void *dst, const void *a, const void *b, size_t n)
{
    const void *ins[2] = {a, b};
    void *outs[1] = {dst};
    sumo__reduce_multi(dtype, outs, 1, ins, 2, n, 1);
}

void sumo__kernel_divide(sumo_dtype dtype, void *dst, const void *src, size_t n, int divisor)
{
    if (divisor == 1) { /* x / 1 == x: skip the pass (and keep signalling NaNs as they are) */
        if (dst != src && n > 0) memmove(dst, src, n * sumo__dtype_bytes(dtype));
        return;
    }
    const void *ins[1] = {src};
    void *outs[1] = {dst};
    sumo__reduce_multi(dtype, outs, 1, ins, 1, n, divisor);
}

void sumo__kernel_convert(sumo_dtype dst_dtype, void *dst, sumo_dtype src_dtype, const void *src,
                          size_t n)
{
    sumo__kernel_convert_isa(sumo__kernel_isa_chosen(), dst_dtype, dst, src_dtype, src, n);
}

void sumo__kernel_dot_norms(sumo_dtype dtype, const void *a, const void *b, size_t n,
                            double out[3])
{
    sumo__kernel_dot_norms_isa(sumo__kernel_isa_chosen(), dtype, a, b, n, out);
}

void sumo__kernel_scaled_add(sumo_dtype dtype, void *a, double ca, const void *b, double cb,
                             size_t n)
{
    sumo__kernel_scaled_add_isa(sumo__kernel_isa_chosen(), dtype, a, ca, b, cb, n);
}

void sumo__kernel_gram_partials(sumo_dtype dtype, const void *const *ins, int nin, size_t n,
                                double *out)
{
    sumo__kernel_gram_partials_isa(sumo__kernel_isa_chosen(), dtype, ins, nin, n, out);
}

void sumo__kernel_weighted_sum(sumo_dtype dtype, void *const *outs, int nout,
                               const void *const *ins, const double *w, int nin, size_t n)
{
    sumo__kernel_weighted_sum_isa(sumo__kernel_isa_chosen(), dtype, outs, nout, ins, w, nin, n);
}
