/*
 * What a run's bits depend on besides the code and its flags: the same seed gives the same
 * parameters on machines that agree on both of these, and may not on others.
 *   - OpenBLAS picks its matrix kernels for the CPU at load time, and each kernel sums a
 *     product's terms in its own order (the training driver's forward and backward passes).
 *   - sumo's kernels pick AVX-512, AVX2 or portable code at run time, and the order of their
 *     dot products and Gram sums follows the vector width (Adasum, ACGA).
 * Header-only, so that every file of the tool (and the fuzzer that compiles train.c alone)
 * can name them without another object to link.
 */
#ifndef SUMO_TOOL_MACHINE_H
#define SUMO_TOOL_MACHINE_H

char *openblas_get_corename(void);

/* OpenBLAS's kernel family on this CPU ("Haswell", "SkylakeX", ...). */
static inline const char *sumo_tool_blas_core(void)
{
    const char *name = openblas_get_corename();
    return name && *name ? name : "unknown";
}

/* The instruction set sumo's kernels dispatch to here. The public API does not say, so this
 * follows the library's rule (sumo__kernel_isa_best in src/kernels/kernels.c): AVX-512 needs
 * AVX2, FMA and F16C besides avx512f; AVX2 needs FMA and F16C. */
static inline const char *sumo_tool_kernel_isa(void)
{
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
    __builtin_cpu_init();
#ifdef __clang__
    const int f16c = 1; /* clang's builtin knows no "f16c"; every AVX2 CPU has it */
#else
    const int f16c = __builtin_cpu_supports("f16c");
#endif
    const int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
    if (avx2 && __builtin_cpu_supports("avx512f")) return "avx512";
    if (avx2) return "avx2";
#endif
    return "portable";
}

#endif
