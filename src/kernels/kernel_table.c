/*
 * The host memory's kernel table: the vectorised kernels of kernels.c behind sumo_ext.h's
 * calling convention, the layout-aware loops over tensor pieces, and the element-wise updates
 * of the layers above (copies, fills, the finiteness scan, the delta step, SlowMo's update),
 * which live here so that a table for another memory can replace every one of them.
 */
#include "kernels/kernel_table.h"
#include "kernels/kernels_isa.h"
#include "kernels/codec.h"

#include <math.h>
#include <string.h>

static sumo_result host_alloc(void *ctx, size_t bytes, void **ptr)
{
    (void)ctx;
    *ptr = sumo__aligned_alloc(64, bytes ? bytes : 1);
    return *ptr ? SUMO_SUCCESS : SUMO_ERR_SYSTEM;
}

static void host_release(void *ctx, void *ptr)
{
    (void)ctx;
    free(ptr);
}

static sumo_result host_synchronize(void *ctx, void *exec)
{
    (void)ctx;
    (void)exec;
    return SUMO_SUCCESS;
}

static sumo_result host_copy(void *ctx, void *exec, void *dst, const void *src, size_t bytes)
{
    (void)ctx;
    (void)exec;
    if (dst != src && bytes) memcpy(dst, src, bytes);
    return SUMO_SUCCESS;
}

/* Element access in the accumulator's terms, for the narrow dtypes' scalar loops. */
static float load_narrow(sumo_dtype dtype, const void *p, size_t i)
{
    uint16_t h = ((const uint16_t *)p)[i];
    return dtype == SUMO_FLOAT16 ? sumo__half_to_float(h) : sumo__bf16_to_float(h);
}

static void store_narrow(sumo_dtype dtype, void *p, size_t i, float v)
{
    ((uint16_t *)p)[i] = dtype == SUMO_FLOAT16 ? sumo__float_to_half(v) : sumo__float_to_bf16(v);
}

static sumo_result host_fill(void *ctx, void *exec, sumo_dtype dtype, void *dst, double value,
                             size_t n)
{
    (void)ctx;
    (void)exec;
    switch (dtype) {
    case SUMO_FLOAT32: {
        float v = (float)value, *d = dst;
        for (size_t i = 0; i < n; i++) d[i] = v;
        return SUMO_SUCCESS;
    }
    case SUMO_FLOAT64: {
        double *d = dst;
        for (size_t i = 0; i < n; i++) d[i] = value;
        return SUMO_SUCCESS;
    }
    case SUMO_FLOAT16:
    case SUMO_BFLOAT16: {
        uint16_t v = dtype == SUMO_FLOAT16 ? sumo__double_to_half(value) : sumo__double_to_bf16(value);
        uint16_t *d = dst;
        for (size_t i = 0; i < n; i++) d[i] = v;
        return SUMO_SUCCESS;
    }
    default: return SUMO_ERR_INVALID_ARGUMENT;
    }
}

/* Non-finite means an all-ones exponent; blocks are scanned with a branch-free OR (which the
 * compiler vectorises) and only a block that has one is searched element by element. */
#define SCAN_BLOCK 1024

#define FIRST_NONFINITE(T, bits_t, exp_mask)                                                   \
    do {                                                                                       \
        const bits_t *b = src;                                                                 \
        for (size_t s = 0; s < n; s += SCAN_BLOCK) {                                           \
            size_t e = SUMO__MIN(n, s + SCAN_BLOCK);                                           \
            bits_t any = 0;                                                                    \
            for (size_t i = s; i < e; i++) any |= (bits_t)((b[i] & (exp_mask)) == (exp_mask)); \
            if (!any) continue;                                                                \
            for (size_t i = s; i < e; i++)                                                     \
                if ((b[i] & (exp_mask)) == (exp_mask)) {                                       \
                    *first = i;                                                                \
                    return SUMO_SUCCESS;                                                       \
                }                                                                              \
        }                                                                                      \
    } while (0)

static sumo_result host_first_nonfinite(void *ctx, void *exec, sumo_dtype dtype, const void *src,
                                        size_t n, size_t *first)
{
    (void)ctx;
    (void)exec;
    *first = SIZE_MAX;
    switch (dtype) {
    case SUMO_FLOAT32: FIRST_NONFINITE(float, uint32_t, 0x7f800000u); break;
    case SUMO_FLOAT64: FIRST_NONFINITE(double, uint64_t, 0x7ff0000000000000ull); break;
    case SUMO_FLOAT16: FIRST_NONFINITE(uint16_t, uint16_t, 0x7c00u); break;
    case SUMO_BFLOAT16: FIRST_NONFINITE(uint16_t, uint16_t, 0x7f80u); break;
    default: return SUMO_ERR_INVALID_ARGUMENT;
    }
    return SUMO_SUCCESS;
}

static sumo_result host_reduce(void *ctx, void *exec, sumo_dtype dtype, void *const *outs,
                               int nout, const void *const *ins, int nin, size_t n, int divisor)
{
    (void)ctx;
    (void)exec;
    sumo__reduce_multi(dtype, outs, nout, ins, nin, n, divisor);
    return SUMO_SUCCESS;
}

static sumo_result host_convert(void *ctx, void *exec, sumo_dtype dst_dtype, void *dst,
                                sumo_dtype src_dtype, const void *src, size_t n)
{
    (void)ctx;
    (void)exec;
    sumo__kernel_convert(dst_dtype, dst, src_dtype, src, n);
    return SUMO_SUCCESS;
}

static sumo_result host_dot_norms(void *ctx, void *exec, sumo_dtype dtype, const void *a,
                                  const void *b, size_t n, double *out)
{
    (void)ctx;
    (void)exec;
    sumo__kernel_dot_norms(dtype, a, b, n, out);
    return SUMO_SUCCESS;
}

static sumo_result host_scaled_add(void *ctx, void *exec, sumo_dtype dtype, void *a, double ca,
                                   const void *b, double cb, size_t n)
{
    (void)ctx;
    (void)exec;
    sumo__kernel_scaled_add(dtype, a, ca, b, cb, n);
    return SUMO_SUCCESS;
}

static sumo_result host_gram_partials(void *ctx, void *exec, sumo_dtype dtype,
                                      const void *const *ins, int nin, const size_t *offsets,
                                      size_t ntensors, size_t lo, size_t hi, double *gram)
{
    (void)ctx;
    (void)exec;
    if (nin < 1 || nin > SUMO__GRAM_MAX_IN) return SUMO_ERR_INVALID_ARGUMENT;
    sumo__kernel_gram_partials_layout(dtype, ins, nin, offsets, ntensors, lo, hi, gram);
    return SUMO_SUCCESS;
}

static sumo_result host_weighted_sum(void *ctx, void *exec, sumo_dtype dtype, void *const *outs,
                                     int nout, const void *const *ins, int nin,
                                     const size_t *offsets, size_t ntensors, size_t lo,
                                     size_t hi, const double *w)
{
    (void)ctx;
    (void)exec;
    if (nin < 1 || nin > SUMO__GRAM_MAX_IN || nout < 1 || nout > SUMO__GRAM_MAX_IN)
        return SUMO_ERR_INVALID_ARGUMENT;
    sumo__kernel_weighted_sum_layout(dtype, outs, nout, ins, nin, offsets, ntensors, lo, hi, w);
    return SUMO_SUCCESS;
}

static sumo_result host_delta(void *ctx, void *exec, sumo_dtype dtype, void *delta,
                              const void *now, const void *start, size_t n)
{
    (void)ctx;
    (void)exec;
    switch (dtype) {
    case SUMO_FLOAT32: {
        float *d = delta;
        const float *a = now, *b = start;
        for (size_t i = 0; i < n; i++) d[i] = a[i] - b[i];
        return SUMO_SUCCESS;
    }
    case SUMO_FLOAT64: {
        double *d = delta;
        const double *a = now, *b = start;
        for (size_t i = 0; i < n; i++) d[i] = a[i] - b[i];
        return SUMO_SUCCESS;
    }
    case SUMO_FLOAT16:
    case SUMO_BFLOAT16:
        for (size_t i = 0; i < n; i++)
            store_narrow(dtype, delta, i, load_narrow(dtype, now, i) - load_narrow(dtype, start, i));
        return SUMO_SUCCESS;
    default: return SUMO_ERR_INVALID_ARGUMENT;
    }
}

/* params = start + delta; the finiteness of the results is tracked per block, branch-free, and
 * a block that has a non-finite result is searched for the first one. */
#define APPLY_DELTA(T)                                                                   \
    do {                                                                                 \
        T *p = params;                                                                   \
        const T *s0 = start, *d = delta;                                                 \
        for (size_t s = 0; s < n; s += SCAN_BLOCK) {                                     \
            size_t e = SUMO__MIN(n, s + SCAN_BLOCK);                                     \
            int bad = 0;                                                                 \
            for (size_t i = s; i < e; i++) {                                             \
                T v = s0[i] + d[i];                                                      \
                bad |= !(v - v == 0);                                                    \
                p[i] = v;                                                                \
            }                                                                            \
            if (bad && *first == SIZE_MAX)                                               \
                for (size_t i = s; i < e && *first == SIZE_MAX; i++)                     \
                    if (!isfinite(p[i])) *first = i;                                     \
        }                                                                                \
    } while (0)

static sumo_result host_apply_delta(void *ctx, void *exec, sumo_dtype dtype, void *params,
                                    const void *start, const void *delta, size_t n,
                                    size_t *first)
{
    (void)ctx;
    (void)exec;
    *first = SIZE_MAX;
    switch (dtype) {
    case SUMO_FLOAT32: APPLY_DELTA(float); return SUMO_SUCCESS;
    case SUMO_FLOAT64: APPLY_DELTA(double); return SUMO_SUCCESS;
    case SUMO_FLOAT16:
    case SUMO_BFLOAT16:
        for (size_t i = 0; i < n; i++) {
            store_narrow(dtype, params, i,
                         load_narrow(dtype, start, i) + load_narrow(dtype, delta, i));
            if (*first == SIZE_MAX && !isfinite(load_narrow(dtype, params, i))) *first = i;
        }
        return SUMO_SUCCESS;
    default: return SUMO_ERR_INVALID_ARGUMENT;
    }
}

static sumo_result host_quantize(void *ctx, void *exec, sumo_compression_format format,
                                 size_t block, void *dst, const float *src, size_t n,
                                 size_t *first)
{
    (void)ctx;
    (void)exec;
    sumo__qformat q;
    *first = SIZE_MAX;
    if (!sumo__qformat_of(format, &q) || !sumo__qblock_valid(block)) return SUMO_ERR_INVALID_ARGUMENT;
    sumo__quantize(&q, block, dst, src, n, first);
    return SUMO_SUCCESS;
}

static sumo_result host_dequantize(void *ctx, void *exec, sumo_compression_format format,
                                   size_t block, float *dst, const void *src, size_t n)
{
    (void)ctx;
    (void)exec;
    sumo__qformat q;
    if (!sumo__qformat_of(format, &q) || !sumo__qblock_valid(block)) return SUMO_ERR_INVALID_ARGUMENT;
    sumo__dequantize(&q, block, dst, src, n);
    return SUMO_SUCCESS;
}

/* The outer loop's step (sumo_ext.h's sumo_outer_step). g is formed from the unrounded v, so
 * that with SlowMo's alpha 1 and beta 0 (Local SGD) the new parameters are the plain average
 * up to one rounding of (x0 - x) / gamma * gamma in double, instead of carrying the rounding of
 * the stored v. A v that overflows the stored type poisons the parameter, so the overflow
 * reaches every rank's finiteness check. merge 0 stores g itself, whatever the local value was
 * (0 x would be NaN for x Inf). */
#define OUTER_UPDATE(T)                                                                  \
    do {                                                                                 \
        T *xs = x, *vs = v, *x0s = x0;                                                   \
        const T *cs = c;                                                                 \
        for (size_t i = 0; i < n; i++) {                                                 \
            double x0d = x0s[i];                                                         \
            double d = st->from_average ? x0d - (double)cs[i] : (double)cs[i];           \
            double vd, gd;                                                               \
            if (st->nesterov) {                                                          \
                vd = st->mu * (double)vs[i] + d;                                         \
                gd = x0d - st->lr * (d + st->mu * vd);                                   \
            } else {                                                                     \
                vd = st->mu * (double)vs[i] + d / st->gamma;                             \
                gd = x0d - st->lr * vd;                                                  \
            }                                                                            \
            T vf = (T)vd;                                                                \
            if (!isfinite(vf)) gd = NAN;                                                 \
            T gf = (T)gd;                                                                \
            vs[i] = vf;                                                                  \
            x0s[i] = gf;                                                                 \
            xs[i] = st->merge == 0 ? gf                                                  \
                                   : (T)(st->merge * (double)xs[i] + (1 - st->merge) * (double)gf); \
        }                                                                                \
    } while (0)

static sumo_result host_outer_update(void *ctx, void *exec, sumo_dtype dtype, void *x,
                                     const void *c, void *v, void *x0, size_t n,
                                     const sumo_outer_step *st)
{
    (void)ctx;
    (void)exec;
    switch (dtype) {
    case SUMO_FLOAT32: OUTER_UPDATE(float); return SUMO_SUCCESS;
    case SUMO_FLOAT64: OUTER_UPDATE(double); return SUMO_SUCCESS;
    default: return SUMO_ERR_INVALID_ARGUMENT;
    }
}

static const sumo_kernel_table host_table = {
    .struct_size = sizeof(sumo_kernel_table),
    .memory = "host",
    .claims = NULL,
    .alloc = host_alloc,
    .release = host_release,
    .synchronize = host_synchronize,
    .copy = host_copy,
    .fill = host_fill,
    .first_nonfinite = host_first_nonfinite,
    .reduce = host_reduce,
    .convert = host_convert,
    .dot_norms = host_dot_norms,
    .scaled_add = host_scaled_add,
    .gram_partials = host_gram_partials,
    .weighted_sum = host_weighted_sum,
    .delta = host_delta,
    .apply_delta = host_apply_delta,
    .quantize = host_quantize,
    .dequantize = host_dequantize,
    .outer_update = host_outer_update,
};

const sumo_kernel_table *sumo__host_kernels(void) { return &host_table; }

sumo_result sumo_host_kernels(const sumo_kernel_table **table)
{
    if (table == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    *table = &host_table;
    return SUMO_SUCCESS;
}

const char *sumo__kernel_table_missing(const sumo_kernel_table *t)
{
#define NEED(f) \
    if (t->f == NULL) return #f
    NEED(memory);
    NEED(claims);
    NEED(alloc);
    NEED(release);
    NEED(synchronize);
    NEED(copy);
    NEED(fill);
    NEED(first_nonfinite);
    NEED(reduce);
    NEED(convert);
    NEED(dot_norms);
    NEED(scaled_add);
    NEED(gram_partials);
    NEED(weighted_sum);
    NEED(delta);
    NEED(apply_delta);
    NEED(quantize);
    NEED(dequantize);
    NEED(outer_update);
#undef NEED
    if (t->struct_size < sizeof(sumo_kernel_table)) return NULL;
    int shares = (t->share != NULL) + (t->open_shared != NULL) + (t->close_shared != NULL);
    if (shares == 1 || shares == 2) return "share, open_shared or close_shared (all three or none)";
    return NULL;
}
