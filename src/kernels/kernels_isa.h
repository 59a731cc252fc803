/*
 * Private to the kernels layer and its tests: the instruction-set paths behind kernels.h.
 *
 * Every path computes the same function: elementwise results (reduce, convert, scaled_add)
 * are bit-identical across paths except for which NaN payload a NaN result carries; dot_norms
 * sums in a path-specific but fixed order (it depends on n and the path, never on pointer
 * alignment, so repeated calls on the same data agree bit for bit).
 *
 * The *_isa entry points exist so tests can run every path this CPU supports, the portable one
 * included; a path the CPU lacks is clamped to the best one it has, never executed.
 */
#ifndef SUMO_KERNELS_ISA_H
#define SUMO_KERNELS_ISA_H

#include "common/common.h"
#include "kernels/codec.h"

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define SUMO__KERNELS_X86 1
#else
#define SUMO__KERNELS_X86 0
#endif

typedef enum sumo__isa {
    SUMO__ISA_PORTABLE = 0,
    SUMO__ISA_AVX2 = 1, /* AVX2 + FMA + F16C */
    SUMO__ISA_AVX512 = 2, /* AVX-512F (+ the above) */
    SUMO__ISA_COUNT
} sumo__isa;

/* The best path this CPU (and OS) supports; cheap enough to ask on every call. */
sumo__isa sumo__kernel_isa_best(void);
/* The path the kernels of kernels.h run: SUMO_KERNEL_ISA's where it is set and this CPU runs
 * it, else the best one. */
sumo__isa sumo__kernel_isa_chosen(void);
const char *sumo__kernel_isa_name(sumo__isa isa);

void sumo__reduce_multi_isa(sumo__isa isa, sumo_dtype dtype, void *const *outs, int nout,
                            const void *const *ins, int nin, size_t n, int divisor);
void sumo__kernel_convert_isa(sumo__isa isa, sumo_dtype dst_dtype, void *dst,
                              sumo_dtype src_dtype, const void *src, size_t n);
void sumo__kernel_dot_norms_isa(sumo__isa isa, sumo_dtype dtype, const void *a, const void *b,
                                size_t n, double out[3]);
void sumo__kernel_scaled_add_isa(sumo__isa isa, sumo_dtype dtype, void *a, double ca,
                                 const void *b, double cb, size_t n);
void sumo__kernel_gram_partials_isa(sumo__isa isa, sumo_dtype dtype, const void *const *ins,
                                    int nin, size_t n, double *out);
void sumo__kernel_weighted_sum_isa(sumo__isa isa, sumo_dtype dtype, void *const *outs, int nout,
                                   const void *const *ins, const double *w, int nin, size_t n);

/*
 * The bodies, one set per path. They trust their caller: valid dtypes, n > 0, nin >= 1,
 * nout >= 1, and (for the vector ones) a CPU that has the instructions.
 */
#define SUMO__KERNEL_DECLARE_PATH(sfx)                                                           \
    void sumo__reduce_multi_##sfx(sumo_dtype dtype, void *const *outs, int nout,                 \
                                  const void *const *ins, int nin, size_t n, int divisor);       \
    void sumo__convert_##sfx(sumo_dtype dst_dtype, void *dst, sumo_dtype src_dtype,              \
                             const void *src, size_t n);                                         \
    void sumo__dot_norms_##sfx(sumo_dtype dtype, const void *a, const void *b, size_t n,         \
                               double out[3]);                                                   \
    void sumo__scaled_add_##sfx(sumo_dtype dtype, void *a, double ca, const void *b, double cb, \
                                size_t n);                                                       \
    void sumo__gram_partials_##sfx(sumo_dtype dtype, const void *const *ins, int nin, size_t n,   \
                                   double *out);                                                 \
    void sumo__weighted_sum_##sfx(sumo_dtype dtype, void *const *outs, int nout,                 \
                                  const void *const *ins, const double *w, int nin, size_t n);   \
    void sumo__gram_partials_layout_##sfx(sumo_dtype dtype, const void *const *ins, int nin,     \
                                          const size_t *offsets, size_t ntensors, size_t lo,     \
                                          size_t hi, double *gram);                              \
    void sumo__weighted_sum_layout_##sfx(sumo_dtype dtype, void *const *outs, int nout,          \
                                         const void *const *ins, int nin,                        \
                                         const size_t *offsets, size_t ntensors, size_t lo,      \
                                         size_t hi, const double *w)

SUMO__KERNEL_DECLARE_PATH(portable);
#if SUMO__KERNELS_X86
SUMO__KERNEL_DECLARE_PATH(avx2);
SUMO__KERNEL_DECLARE_PATH(avx512);
#endif

/* True when every weight narrows to float without becoming Inf or losing its digits
 * (codec.h's sumo__coef_fits_float, which says why the fp16/bf16 combines ask). */
static inline int sumo__coefs_fit_float(const double *w, int n)
{
    for (int i = 0; i < n; i++)
        if (!sumo__coef_fits_float(w[i])) return 0;
    return 1;
}
void sumo__weighted_sum_half_wide(sumo_dtype dtype, void *const *outs, int nout,
                                  const void *const *ins, const double *w, int nin, size_t n);
void sumo__scaled_add_half_wide(sumo_dtype dtype, void *a, double ca, const void *b, double cb,
                                size_t n);

/* Bytes of the L1-resident accumulator block used when many inputs are summed: 8 KiB leaves
 * room in a 32 KiB L1 for the input and output lines streaming through it. */
#define SUMO__REDUCE_BLOCK_BYTES 8192

#endif
