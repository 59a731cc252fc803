/*
 * What a run's bits depend on besides the code and its flags: the same seed gives the same
 * parameters on machines that agree on both of these, and may not on others.
 *   - OpenBLAS picks its matrix kernels for the CPU at load time, and each kernel sums a
 *     product's terms in its own order (the training driver's forward and backward passes).
 *   - sumo's kernels pick AVX-512, AVX2 or portable code at run time, and the order of their
 *     dot products and Gram sums follows the vector width (Adasum, ACGA).
 * Header-only, so that every file of the tool (and a fuzzer that compiles some of them alone)
 * can name them without another object to link.
 */
#ifndef SUMO_TOOL_MACHINE_H
#define SUMO_TOOL_MACHINE_H

#include <sumo.h>

char *openblas_get_corename(void);

/* OpenBLAS's kernel family on this CPU ("Haswell", "SkylakeX", ...). */
static inline const char *sumo_tool_blas_core(void)
{
    const char *name = openblas_get_corename();
    return name && *name ? name : "unknown";
}

/* The instruction set sumo's kernels dispatch to here (sumo_kernel_isa). */
static inline const char *sumo_tool_kernel_isa(void)
{
    const char *name = "unknown";
    sumo_kernel_isa(&name);
    return name;
}

#endif
