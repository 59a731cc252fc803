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
 *
 * This file holds what every kernel shares (the naming macros, the dtype-generic loads and
 * stores) and includes the kernels, one part per concern, at its end: kernels_simd_reduce.h
 * (reduce, convert), kernels_simd_dot.h (dot_norms, scaled_add, prefetching),
 * kernels_simd_gram.h (Gram partials) and kernels_simd_wsum.h (weighted sum).
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

/* ---- the kernels, by concern (each part uses the parts before it) ------------------------ */

#include "kernels/kernels_simd_reduce.h" /* reduce, convert */
#include "kernels/kernels_simd_dot.h"    /* prefetching, dot_norms, scaled_add */
#include "kernels/kernels_simd_gram.h"   /* Gram partials */
#include "kernels/kernels_simd_wsum.h"   /* weighted sum */

#undef SIMD_INLINE
#undef WD
